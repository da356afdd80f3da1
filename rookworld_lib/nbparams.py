"""Validation of notebook parameters.

papermill injects parameters as plain Python values, so a typo'd type or an out-of-range value
would otherwise surface deep inside a training loop. Notebooks call `check` on each parameter in
the cell after `parameters`, and a bad value stops the run there with the field's name.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


class ParameterError(ValueError):
    """A notebook parameter of the wrong type or outside its allowed range."""


def check(name: str, value: Any, kind: type | tuple[type, ...], *, min: float | None = None,
          max: float | None = None, choices: Iterable[Any] | None = None) -> Any:
    """Return value if it is of `kind` and within [min, max] / `choices`, else raise ParameterError."""
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
    if min is not None and value < min:
        raise ParameterError(f"notebook parameter {name!r} must be >= {min}, got {value!r}")
    if max is not None and value > max:
        raise ParameterError(f"notebook parameter {name!r} must be <= {max}, got {value!r}")
    return value
