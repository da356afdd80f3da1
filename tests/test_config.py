import argparse
import math
from dataclasses import dataclass, field

import pytest

from rookworld_lib.core import config
from rookworld_lib.core.paths import DATA_DIR

VAL = str(DATA_DIR / "policy_val.jsonl")  # a file that is there


# ---- config helpers ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Demo:
    steps: int = config.option(3, "how many steps", min=1)
    rate: float | None = config.option(0.5, "a rate, or none", min=0.0, max=1.0, max_open=True)
    flag: bool = config.option(False, "a switch")
    pair: tuple[float, float] = field(default=(0.9, 0.95), metadata={"help": "two numbers"})  # TRL's spelling
    files: tuple[str, ...] = config.option((), "some files", path=True)
    out: str | None = config.option(None, "a folder", path=True)
    extra: dict = config.option(factory=dict, help="KEY=VALUE settings")
    mode: str = config.option("a", "a choice", choices=("a", "b"))

    def __post_init__(self):
        config.validate(self)


def test_validate_checks_each_field_by_its_annotation_and_option_checks():
    assert Demo(rate=None).rate is None  # `float | None` accepts None
    for bad, message in (({"steps": 0}, "Demo.steps must be an integer >= 1, got 0"),
                         ({"steps": True}, "Demo.steps must be an integer >= 1, got True"),
                         ({"steps": None}, "Demo.steps must be an integer >= 1, got None"),  # None only where `| None`
                         ({"rate": 1.0}, "Demo.rate must be a finite number in [0.0, 1.0), got 1.0"),
                         ({"rate": float("nan")}, "Demo.rate must be a finite number in [0.0, 1.0), got nan"),
                         ({"flag": 1}, "Demo.flag must be True or False, got 1"),
                         ({"mode": "c"}, "Demo.mode must be one of ('a', 'b'), got 'c'")):
        with pytest.raises(ValueError) as info:
            Demo(**bad)
        assert str(info.value) == message


def test_numpy_numbers_are_taken_as_pythons_and_checked_as_they():
    """A sweep's values come from numpy (np.arange, np.linspace): an np.int64 is an integer (it was
    refused as 'must be an integer'), an np.float32 a number; the config keeps Python's int and float,
    which JSON writes; a float is still not an integer, and the bounds still hold."""
    import json

    import numpy as np
    d = Demo(steps=np.int64(7), rate=np.float32(0.25))
    assert (d.steps, d.rate) == (7, 0.25) and (type(d.steps), type(d.rate)) == (int, float)
    assert json.loads(json.dumps({"steps": d.steps})) == {"steps": 7}
    for bad, message in (({"steps": np.float64(7.0)}, "Demo.steps must be an integer >= 1, got np.float64(7.0)"),
                         ({"steps": np.int64(0)}, "Demo.steps must be an integer >= 1, got 0"),
                         ({"rate": np.float32("nan")}, "Demo.rate must be a finite number in [0.0, 1.0), got nan"),
                         ({"flag": np.bool_(True)}, "Demo.flag must be True or False, got np.True_")):
        with pytest.raises(ValueError) as info:
            Demo(**bad)
        assert str(info.value) == message
    assert config.check_weights(type("W", (), {"w": {"P": np.float32(0.5)}})(), "w") == {"P": 0.5}


def test_config_arguments_round_trip():
    assert config.field_docs(Demo) == {"steps": "how many steps", "rate": "a rate, or none", "flag": "a switch",
                                   "pair": "two numbers", "files": "some files", "out": "a folder",
                                   "extra": "KEY=VALUE settings", "mode": "a choice"}
    ap = argparse.ArgumentParser()
    config.add_config_arguments(ap, Demo)
    assert config.config_kwargs_from_args(Demo, ap.parse_args([])) == {
        "steps": 3, "rate": 0.5, "flag": False, "pair": (0.9, 0.95), "files": (), "out": None, "extra": {}, "mode": "a"}
    args = ap.parse_args(["--steps", "7", "--rate", "none", "--flag", "--pair", "0.8", "0.99",
                          "--files", "a.jsonl", "b.jsonl", "--extra", "dropout=0.1", "--extra", "attn_impl=math",
                          "--mode", "b"])
    assert config.config_kwargs_from_args(Demo, args) == {
        "steps": 7, "rate": None, "flag": True, "pair": (0.8, 0.99), "files": ("a.jsonl", "b.jsonl"), "out": None,
        "extra": {"dropout": 0.1, "attn_impl": "math"}, "mode": "b"}
    # several KEY=VALUE after one flag, as one writes `--model-overrides n_layer=6 n_embd=192`, and repeated
    args = ap.parse_args(["--extra", "n_layer=6", "n_embd=192", "--extra", "n_head=6", "--steps", "2"])
    assert config.config_kwargs_from_args(Demo, args)["extra"] == {"n_layer": 6, "n_embd": 192, "n_head": 6}
    assert "how many steps" in ap.format_help() and "{a,b}" in ap.format_help()  # choices shown
    assert ap.parse_args(["--rate", "null"]).rate is None  # JSON's spelling of None, as `--rate none`
    with pytest.raises(SystemExit) as stop:  # a pair takes exactly two values: argparse says so, with the usage
        ap.parse_args(["--pair", "0.8"])
    assert stop.value.code == 2
    # a list option given twice adds up (the later one replaced the earlier files without a word); none is a
    # usage error (it trained on the default data); "none" is a folder's name for an optional path
    assert ap.parse_args(["--files", "a", "--files", "b", "c"]).files == ["a", "b", "c"]
    assert ap.parse_args(["--out", "none"]).out is None and ap.parse_args(["--out", "runs/x"]).out == "runs/x"


@pytest.mark.parametrize("argv", [["--files"], ["--files", ""], ["--files", "a", " "], ["--out", ""]])
def test_an_empty_path_or_list_is_refused_on_the_command_line_and_in_the_config(argv, capsys):
    """An empty path is the current folder to Path(""): a command read and wrote there, or fell back to its
    default data, without a word."""
    ap = argparse.ArgumentParser(prog="demo")
    config.add_config_arguments(ap, Demo)
    with pytest.raises(SystemExit) as stop:
        ap.parse_args(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err == (f"demo: error: argument {argv[0]}: " + ("expected at least one argument" if len(argv) == 1
                                                           else "an empty path names no file or folder"))
    if len(argv) > 1:  # the config refuses the empty path too (an empty tuple is "none given")
        with pytest.raises(ValueError, match=r"^Demo\.(files|out) must name a file or folder, not an empty path, got "):
            Demo(**{argv[0][2:]: "" if argv[0] == "--out" else tuple(argv[1:])})


@pytest.mark.parametrize("argv", [["--files", "a", "b\udcff"], ["--out", "out\udcff"]])
def test_a_path_that_is_not_utf8_text_is_refused_on_the_command_line_and_in_the_config(argv, capsys):
    """A folder named in bytes that are not UTF-8 (b"out\\xff", which Python keeps as "out\\udcff") trained,
    then stopped where TensorBoard's event writer first encoded it, naming no path."""
    with pytest.raises(UnicodeEncodeError):  # the failure the check stands in for
        argv[-1].encode("utf-8")
    ap = argparse.ArgumentParser(prog="demo")
    config.add_config_arguments(ap, Demo)
    with pytest.raises(SystemExit) as stop:
        ap.parse_args(argv)
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"demo: error: argument {argv[0]}: {ascii(argv[-1])} must be UTF-8 text (run records, reports and "
        "TensorBoard's event writer store paths as UTF-8); rename the file or folder, or choose another")
    with pytest.raises(ValueError, match=r"^Demo\.(files|out) must be UTF-8 text .*, got "):
        Demo(**{argv[0][2:]: argv[-1] if argv[0] == "--out" else tuple(argv[1:])})
    assert Demo(out="runs/é").out == "runs/é"  # UTF-8 text beyond ASCII is a name like any other


def test_check_helpers_name_the_field():
    @dataclass
    class C:
        n: int = 0
        x: float = 0.0

    with pytest.raises(ValueError, match=r"C\.n must be an integer >= 1, got 0"):
        config.check_int(C(), "n", min=1)
    with pytest.raises(ValueError, match=r"C\.x must be a finite number in \(0"):
        config.check_number(C(x=math.nan), "x", min=0.0, min_open=True)
    config.check_number(C(x=0.0), "x", min=0.0)  # a closed bound takes its own value, an open one does not
    with pytest.raises(ValueError) as info:
        config.check_number(C(x=0.0), "x", min=0.0, min_open=True)  # e.g. lr: 0 would train nothing
    assert str(info.value) == "C.x must be a finite number in (0.0, inf), got 0.0"


def test_seeds_end_at_numpys_bound_and_a_task_of_weight_zero_is_left_out_not_refused():
    import json

    import numpy as np

    from rookworld_lib.core.train_grpo import GRPOTrainConfig

    np.random.seed(2**32 - 1)  # numpy's legacy seeds: [0, 2**32 - 1]
    with pytest.raises(ValueError):
        np.random.seed(2**32)
    assert GRPOTrainConfig(seed=2**32 - 1).seed == 2**32 - 1
    with pytest.raises(ValueError, match=r"seed"):
        GRPOTrainConfig(seed=2**32)
    assert GRPOTrainConfig(task_weights={"P": 1, "A": 0}).task_weights == {"P": 1.0, "A": 0.0}
    # kept as Python floats: 1 and 1.0 are one setting in the run's JSON, and numpy's numbers can be written
    assert json.dumps(GRPOTrainConfig(task_weights={"P": np.int64(1), "A": 0}).task_weights) == '{"P": 1.0, "A": 0.0}'


def test_a_malformed_override_is_refused_naming_it(capsys):
    """`--model-overrides foo` (no KEY=VALUE) stops argparse with its usage error (exit 2) naming what it got."""
    from rookworld_lib.lab.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["sft", "--model-overrides", "foo"])
    assert stop.value.code == 2 and "expected KEY=VALUE, got 'foo'" in capsys.readouterr().err


@pytest.mark.parametrize("make, message", [
    (lambda: _grpo_train(max_refill_rounds=5),
     "GRPOTrainConfig.max_refill_rounds has no effect unless dynamic_sampling=True: set that too, or leave "
     "max_refill_rounds at its default (3), got 5"),
    (lambda: _grpo_train(scale_rewards="batch", multi_objective_aggregation="normalize_then_sum"),
     "GRPOTrainConfig.scale_rewards has no effect unless multi_objective_aggregation='sum_then_normalize'"),
    (lambda: _grpo_loss(vespo_k_neg=1.0), "GRPOConfig.vespo_k_neg has no effect unless loss_type='vespo'"),
    (lambda: _grpo_loss(loss_type="vespo", delta=1.5), "GRPOConfig.delta has no effect with loss_type='vespo' (it "
     "caps the clipped objective, which vespo does not use): choose another loss_type, or leave delta at its default (None)"),
    *((lambda kw=kw: _grpo_train(loss=_grpo_loss(beta=0.0, **kw)), f"GRPOConfig.{next(iter(kw))} has no effect at beta=0 "
       "(no KL term, no reference model): set beta > 0") for kw in ({"kl_estimator": "k2"}, {"use_bias_correction_kl": True})),
    (lambda: _sft(shuffle_buffer=50), "SFTConfig.shuffle_buffer has no effect unless stream=True"),
    (lambda: _sft(val_data=(VAL,), val_fraction=0.1),
     "SFTConfig.val_fraction has no effect when val_data is given or stream=True"),
    (lambda: _sft(val_data=(VAL,), stream=True, val_fraction=0.2),
     "SFTConfig.val_fraction has no effect when val_data is given or stream=True")])
def test_a_setting_another_setting_makes_void_is_refused_naming_both(make, message):
    """`--max-refill-rounds 5` without `--dynamic-sampling`, `--shuffle-buffer` without `--stream`, a
    `--val-fraction` beside `--val-data`, a VESPO weight under another loss, a reward scaling under GDPO's
    aggregation (which scales by itself) were dropped without a word: the run was not the one asked for."""
    with pytest.raises(ValueError) as err:
        make()
    assert str(err.value).startswith(message), str(err.value)


def test_a_void_setting_left_at_its_default_or_made_live_is_accepted():
    assert _grpo_train(dynamic_sampling=True, max_refill_rounds=5).max_refill_rounds == 5
    assert _grpo_train(max_refill_rounds=3).max_refill_rounds == 3  # the default, given: nothing is lost
    assert _grpo_train(scale_rewards="batch").scale_rewards == "batch"
    assert _grpo_loss(loss_type="vespo", vespo_k_neg=1.0).vespo_k_neg == 1.0
    assert _grpo_train(loss=_grpo_loss(beta=0.1, kl_estimator="k2")).loss.kl_estimator == "k2"
    assert _grpo_loss(beta=0.0, kl_estimator="k2").kl_estimator == "k2"  # the loss alone: a reference given computes the kl metric
    assert _grpo_loss(delta=1.5).delta == 1.5
    assert _sft(stream=True, val_data=(VAL,), shuffle_buffer=50).shuffle_buffer == 50
    assert _sft(val_fraction=0.1).val_fraction == 0.1
    assert _sft(val_data=(VAL,), val_fraction=0.0).val_fraction == 0.0  # "hold nothing back" agrees with val data


def _grpo_train(**kw):
    from rookworld_lib.core.train_grpo import GRPOTrainConfig
    return GRPOTrainConfig(**kw)


def _grpo_loss(**kw):
    from rookworld_lib.core.grpo import GRPOConfig
    return GRPOConfig(**kw)


def _sft(**kw):
    from rookworld_lib.core.train_sft import SFTConfig
    return SFTConfig(**kw)
