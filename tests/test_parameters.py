"""The checks on a notebook's parameters (`lab.parameters.check`), which the cell after `parameters` runs."""

import math

import pytest

from rookworld_lib.lab.parameters import ParameterError, check


def test_notebook_parameter_check_names_the_parameter():
    check("lr", 3, float, min=0)  # an int where a float is wanted is fine (no error)
    for args, message in ((("steps", "8", int), "'steps' must be int, got str '8'"),
                          (("steps", True, int), "'steps' must be int, got bool True"),
                          (("steps", 0, int), "'steps' must be >= 1, got 0"),
                          (("profile", "tpu", str), "'profile' must be one of ['ci', 'cpu'], got 'tpu'")):
        with pytest.raises(ParameterError) as info:
            check(*args, min=1 if args[0] == "steps" else None,
                  choices=("ci", "cpu") if args[0] == "profile" else None)
        assert str(info.value) == "notebook parameter " + message


def test_a_device_parameter_is_one_torch_names_and_that_is_here():
    """check(..., device=True): `-p device tpu` stopped notebook 05 ten seconds in; it is refused by the
    check cell, which `rookworld run` runs before any notebook."""
    import torch

    assert check("device", "cpu", str, device=True) is None and check("device", "auto", str, device=True) is None
    assert check("device", None, (str, type(None)), device=True) is None  # None: the profile's device
    for bad in ("tpu", "meta", "cpu:x"):
        with pytest.raises(ParameterError) as info:
            check("device", bad, str, device=True)
        assert str(info.value) == (f"device {bad!r} (notebook parameter 'device'): must be 'auto' or a torch device such "
                                   "as 'cpu', 'cuda', 'cuda:1', 'mps'")
    if not torch.cuda.is_available():
        with pytest.raises(ParameterError, match="requested but CUDA is not available"):
            check("device", "cuda:0", str, device=True)


def test_a_folder_parameter_names_a_folder_that_exists(tmp_path):
    """`init_from` / `run_dir` (folder=True): a file where a folder is wanted is refused in the check cell,
    saying it is a file, not later by the code that reads the folder."""
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert check("init_from", str(tmp_path), str, folder=True) is None
    for given, what in ((tmp_path / "model.safetensors", "a file"), (tmp_path / "nope", "no such folder")):
        with pytest.raises(ParameterError) as info:
            check("init_from", str(given), str, folder=True)
        assert str(info.value) == f"notebook parameter 'init_from' must name an existing folder, got {str(given)!r} ({what})"


def test_a_notebook_parameter_at_its_bound_is_accepted_and_just_below_it_refused():
    assert check("steps", 1, int, min=1) is None and check("lr", 0.0, float, min=0) is None
    with pytest.raises(ParameterError, match=r"^notebook parameter 'steps' must be >= 1, got 0$"):
        check("steps", 0, int, min=1)
    with pytest.raises(ParameterError, match=r"^notebook parameter 'lr' must be >= 0, got -1e-09$"):
        check("lr", -1e-9, float, min=0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_a_notebook_parameter_that_is_not_finite_is_refused_by_name(bad):
    with pytest.raises(ParameterError, match="'lr' must be a finite number"):
        check("lr", bad, float, min=0.0, max=1.0)
    assert not math.isfinite(bad)


def test_a_notebook_parameter_above_its_maximum_is_refused_naming_it():
    """The upper bound as the lower one: `-p workers 65` where 64 is the most."""
    with pytest.raises(ParameterError) as info:
        check("workers", 65, int, min=1, max=64)
    assert str(info.value) == "notebook parameter 'workers' must be <= 64, got 65"
