"""The checks on a notebook's parameters.

papermill injects parameters as plain Python values: each notebook checks every one in the cell after
`parameters`, so a bad value stops the run there with the parameter's name, not deep in a loop;
`rookworld run` runs those cells before any notebook starts (`pipeline.check_parameter_values`).
Kept free of torch (a device is checked with it only when asked) so that the check cell is quick.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any


class ParameterError(ValueError):
    """A notebook parameter of the wrong type or outside its allowed range."""


def check(name: str, value: Any, kind: type | tuple[type, ...], *, min: float | None = None,
          max: float | None = None, choices: Iterable[Any] | None = None, folder: bool = False,
          device: bool = False, void: str | None = None) -> None:
    """Raise ParameterError unless value is of `kind` and within [min, max] / `choices`, and, with
    folder=True, a str value names an existing folder, with device=True one that
    train_utils.resolve_device takes ("auto", or a cpu/cuda/mps device that is here); `void`: why another
    parameter leaves this one without effect (then any value but None is refused, saying so). Returns nothing,
    so that a notebook's check cell shows no output."""
    if void is not None and value is not None:
        raise ParameterError(f"notebook parameter {name!r} has no effect {void}; leave it out, got {value!r}")
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int subclass; a True where a count is expected is almost always a mistake.
    if isinstance(value, bool):
        ok = bool in kinds
    else:
        ok = isinstance(value, kinds) or (float in kinds and isinstance(value, int))
    if not ok:
        names = " or ".join(k.__name__ for k in kinds)
        raise ParameterError(f"notebook parameter {name!r} must be {names}, got {type(value).__name__} {value!r}")
    if choices is not None and value not in (choices := list(choices)):
        raise ParameterError(f"notebook parameter {name!r} must be one of {choices}, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):  # NaN passes every comparison below
        raise ParameterError(f"notebook parameter {name!r} must be a finite number, got {value!r}")
    if min is not None and value < min:
        raise ParameterError(f"notebook parameter {name!r} must be >= {min}, got {value!r}")
    if max is not None and value > max:
        raise ParameterError(f"notebook parameter {name!r} must be <= {max}, got {value!r}")
    if folder and isinstance(value, str) and not os.path.isdir(value):
        raise ParameterError(f"notebook parameter {name!r} must name an existing folder, got {value!r} ("
                             + ("a file" if os.path.exists(value) else "no such folder") + ")")
    if device and isinstance(value, str):
        from ..core.train_utils import resolve_device  # torch, for this check alone
        try:
            resolve_device(value, source=f"notebook parameter {name!r}")
        except ValueError as exc:
            raise ParameterError(str(exc)) from None
