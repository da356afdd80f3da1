"""Where users enter values: config fields in TRL's style (`option`, checked by `validate`), and the
argparse options built from a config dataclass (a notebook's parameters are checked in the lab:
`lab.parameters`).

Kept free of torch so that modules above it that never train (a task layer's data tools) import fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import numbers
import os
import re
import sys
import textwrap
import types
import typing
from typing import Any


# -- config fields: option(), validate() ----------------------------------------------------

def option(default: Any = dataclasses.MISSING, help: str = "", *, factory=None, **checks) -> Any:
    """A config field in TRL's style, `field(default=..., metadata={"help": ...})`, on one line; checks
    are what `validate` adds to the annotation: min / max (min_open / max_open) for numbers, choices,
    path=True for a file or folder (a str, or a tuple of them): an empty one, or one that is not UTF-8 text, is refused."""
    assert set(checks) <= {"min", "max", "min_open", "max_open", "choices", "path"}, checks
    kw = {"default_factory": factory} if factory is not None else {"default": default}
    return dataclasses.field(metadata={"help": help, **checks}, **kw)


@typing.dataclass_transform(field_specifiers=(dataclasses.field, option))
def config_class(*, frozen: bool = False):
    """@dataclass(frozen=frozen) for a config, its fields' help texts appended to its docstring (as
    TRL's configs list their parameters), so that help(Config) shows what every field does."""
    return lambda cls: _documented(dataclasses.dataclass(frozen=frozen)(cls))


def _documented(cls):
    lines = [textwrap.fill(f"{f.name} ({f.type if isinstance(f.type, str) else getattr(f.type, '__name__', f.type)}"
                           f" = {_shown_default(f)}): {f.metadata.get('help', '')}", 100, initial_indent="    ",
                           subsequent_indent="        ") for f in dataclasses.fields(cls)]
    cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n\n    Fields:\n" + "\n".join(lines) + "\n"
    return cls


def _shown_default(f) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default)
    return f"{f.default_factory.__name__}()" if f.default_factory is not dataclasses.MISSING else "required"


def field_docs(cls) -> dict[str, str]:
    """Each field's help text (metadata["help"], as `option` and TRL's configs write it)."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}


def _optional_of(hint) -> tuple[Any, bool]:
    """(T, True) for `T | None`, (hint, False) otherwise."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return hint, False


@functools.cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def validate(cfg) -> None:
    """Check every field of a config against its annotation and its `option` checks; the first bad
    one raises ValueError `Cls.field must ..., got value` (None passes where the type allows it).
    A numpy integer or float in an int or float field is kept as Python's int or float."""
    hints = _hints(type(cfg))
    for f in dataclasses.fields(cfg):
        hint, optional = _optional_of(hints[f.name])
        value, meta = getattr(cfg, f.name), f.metadata
        if optional and value is None:
            continue
        if hint in (int, float) and type(value) not in (int, float) and not isinstance(value, bool) \
                and isinstance(value, numbers.Integral if hint is int else numbers.Real):
            value = hint(value)  # numpy's numbers (a sweep's np.arange) kept as Python's, as JSON writes them
            object.__setattr__(cfg, f.name, value)
        if "choices" in meta:
            if value not in meta["choices"]:
                bad_field(type(cfg).__name__, f.name, value, f"must be one of {tuple(meta['choices'])}")
        elif hint is bool:
            if not isinstance(value, bool):
                bad_field(type(cfg).__name__, f.name, value, "must be True or False")
        elif hint is int:
            check_int(cfg, f.name, min=meta.get("min"), max=meta.get("max"))
        elif hint is float:
            check_number(cfg, f.name, min=meta.get("min"), max=meta.get("max"),
                         min_open=meta.get("min_open", False), max_open=meta.get("max_open", False))
        elif hint is str and not isinstance(value, (str, os.PathLike)):  # a path field may be a Path
            bad_field(type(cfg).__name__, f.name, value, "must be a string")
        if meta.get("path"):
            for p in value if isinstance(value, tuple) else (value,):
                if not str(p).strip():  # Path("") is the current folder: an empty string would read or write there unasked
                    bad_field(type(cfg).__name__, f.name, value, "must name a file or folder, not an empty path")
                if not utf8_name(p):
                    bad_field(type(cfg).__name__, f.name, value, NOT_UTF8)


SEED_MAX = 2**32 - 1  # every seed option's upper bound (numpy's legacy seeds; seeds derived from it stay in int64)


def bad_field(cls_name: str, name: str, value: Any, why: str, *, got: bool = True):
    """The one error format for config validation: `Cls.field must ..., got value` (got=False: `why`
    already names the offending part of the value)."""
    raise ValueError(f"{cls_name}.{name} {why}" + (f", got {value!r}" if got else ""))


def check_applies(cfg, name: str, applies: bool, why: str) -> None:
    """cfg.name set away from its default where another setting makes it void is refused: a run that
    ignored it would not be the run its settings describe (`why`: when it is void and what to do,
    "unless dynamic_sampling=True: set that too")."""
    f = next(f for f in dataclasses.fields(cfg) if f.name == name)
    if not applies and getattr(cfg, name) != f.default:
        bad_field(type(cfg).__name__, name, getattr(cfg, name), f"has no effect {why}, or leave {name} at its "
                  f"default ({f.default!r})")


def check_weights(cfg, name: str) -> dict[str, float] | None:
    """cfg.name, unless None, must map task names to finite weights >= 0, at least one of them above 0;
    returns it with float weights (1 and 1.0 are one setting), for the config to keep."""
    value, cls = getattr(cfg, name), type(cfg).__name__
    if value is None:
        return None
    if not isinstance(value, dict) or not value:
        bad_field(cls, name, value, "must be a non-empty dict {task: weight}, or None")
    for task, w in value.items():
        if not isinstance(task, str) or not task.strip() or task.endswith(":"):
            bad_field(cls, name, value, f"must name each task by its tag without the colon ('S' for samples "
                      f"'S: ...'), not {task!r}")
        if isinstance(w, bool) or not isinstance(w, numbers.Real) or not math.isfinite(w) or w < 0:
            bad_field(cls, f"{name}[{task!r}]", w, "must be a finite number >= 0")
    if not any(value.values()):
        bad_field(cls, name, value, "must give some task a weight above 0")
    return {task: float(w) for task, w in value.items()}


def is_int(value, min: int | None = None, max: int | None = None) -> bool:
    """value is an int (not a bool: True is no count) within [min, max]."""
    return isinstance(value, int) and not isinstance(value, bool) and (min is None or value >= min) and (
        max is None or value <= max)


def check_int(cfg, name: str, *, min: int | None = None, max: int | None = None) -> None:
    """cfg.name must be an int (not a bool) within [min, max]."""
    value = getattr(cfg, name)
    if not is_int(value, min, max):
        want = {(False, False): "", (True, False): f" >= {min}", (False, True): f" <= {max}",
                (True, True): f" in {min}..{max}"}[(min is not None, max is not None)]
        bad_field(type(cfg).__name__, name, value, "must be an integer" + want)


def check_number(cfg, name: str, *, min: float | None = None, max: float | None = None,
                 min_open: bool = False, max_open: bool = False) -> None:
    """cfg.name must be a finite number within the bounds (open where min_open / max_open)."""
    value = getattr(cfg, name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if ok and min is not None:
        ok = value > min if min_open else value >= min
    if ok and max is not None:
        ok = value < max if max_open else value <= max
    if not ok:
        lo = "(-inf" if min is None else ("(" if min_open else "[") + f"{min}"
        hi = "inf)" if max is None else f"{max}" + (")" if max_open else "]")
        rng = "" if min is None and max is None else f" in {lo}, {hi}"
        bad_field(type(cfg).__name__, name, value, f"must be a finite number{rng}")


# -- config dataclasses <-> argparse --------------------------------------------------------

def json_or_text(raw: str) -> Any:
    """A command-line value as JSON where it parses, else the text itself (a bare string such as math)."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _parse_override(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), json_or_text(raw)


def _optional(kind):
    def parse(text: str):
        return None if text.lower() in ("none", "null") else kind(text)
    parse.__name__ = kind.__name__
    return parse


# Fields whose option is not their name: one word for an output folder in every `rookworld` command
RENAMED = {"out_dir": "--out"}


def flag_name(field: str) -> str:
    """The command-line option of a config field (`lr` -> --lr, `out_dir` -> --out)."""
    return RENAMED.get(field, "--" + field.replace("_", "-"))


class _Renamed(argparse.Action):
    """An old option name, not shown in --help: stores the value and says the new name on stderr."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{parser.prog}: {option_string} is deprecated, use {flag_name(self.dest)}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _flags_in_help(text: str, flags: dict[str, str]) -> str:
    """A field's help as a command-line user reads it: the Python names of other fields become their
    option (`val_fraction` -> --val-fraction, `stream=True` -> --stream), their value's name in a
    formula (`batch_size*grad_accum` -> BATCH_SIZE*GRAD_ACCUM, as the usage line names it) and a
    folder in a path (`<out_dir>/final`, `out_dir/checkpoints` -> <out>/...); another tool's names
    (TRL's `epsilon_high`) and another object's (the model's `block_size`) stay."""
    def option(m: re.Match) -> str:
        flag = flags[m["name"]]
        if m["open"] or (m["path"] and m["path"][1:] not in flags):
            return f"<{flag[2:]}>{m['path'] or ''}"
        before, after = text[max(0, m.start() - 2):m.start()], text[m.end():m.end() + 3]
        if re.search(r"[*/]\s?$|[-+x] $", before) or re.match(r"\s?[*/]|\s[*x] ", after):
            return m["name"].upper()
        return (("--no-" + flag[2:]) if m["value"] == "=False" else flag) + ("/" + flags[m["path"][1:]] if m["path"] else "")

    names = "|".join(sorted((re.escape(n) for n in flags if "_" in n), key=len, reverse=True))
    if not names:
        return text
    return re.sub(rf"(?<!'s )(?<![\w.`])(?P<open><)?(?P<name>{names})(?(open)>)(?P<value>=True|=False)?"
                  rf"(?P<path>/\w+)?(?![\w`(])", option, text)


NOT_UTF8 = ("must be UTF-8 text (run records, reports and TensorBoard's event writer store paths as UTF-8); "
            "rename the file or folder, or choose another")


def utf8_name(path: str | os.PathLike) -> bool:
    """Whether a path is UTF-8 text: a name that is not (bytes Python keeps as surrogates, b'out\\xff')
    would stop a run where it is first written into a JSON record or an event file, not where it was given."""
    try:
        str(path).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def path_arg(text: str) -> str:
    """argparse's `type` for a file or folder option: an empty string names none (Path("") is the current
    folder, where it would read or write unasked), so it is refused as `option(path=True)` refuses it;
    so is a name that is not UTF-8 text (`utf8_name`)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path names no file or folder")
    if not utf8_name(text):
        raise argparse.ArgumentTypeError(f"{ascii(text)} {NOT_UTF8}")
    return text


def add_config_arguments(parser: argparse.ArgumentParser, cls, *, skip=(), help_overrides=None,
                         metavars=None) -> None:
    """One option per dataclass field (`lr` -> --lr), typed from the annotation, documented by its
    metadata["help"], defaulting to its default: bool -> --x/--no-x; tuple[float, float] -> --x A B;
    tuple[str, ...] -> --x A B C; dict -> --x KEY=VALUE [KEY=VALUE ...] (repeatable, VALUE as JSON where it parses);
    T | None -> also "none"."""
    hints = typing.get_type_hints(cls)
    docs = {**field_docs(cls), **(help_overrides or {})}
    flags = {f.name: flag_name(f.name) for f in dataclasses.fields(cls) if f.name not in skip}
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        kw: dict[str, Any] = {"default": default, "dest": f.name}
        hint, optional = _optional_of(hints[f.name])
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if hint is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif origin is tuple and args[-1] is Ellipsis:  # tuple[T, ...]: one or more values, repeatable (adds up)
            kw.update(type=path_arg if f.metadata.get("path") else args[0], action="extend", nargs="+", metavar=args[0].__name__.upper(), default=None)
        elif origin is tuple:  # tuple[T, T]: exactly two
            kw.update(type=args[0], nargs=len(args), metavar=args[0].__name__.upper())
        elif origin is dict or hint is dict:
            kw.update(type=_parse_override, action="extend", nargs="+", metavar="KEY=VALUE", default=None)
        elif hint in (int, float, str):
            kind = path_arg if f.metadata.get("path") else hint
            kw["type"] = _optional(kind) if optional else kind
            if "choices" in f.metadata and not optional:
                kw["choices"] = list(f.metadata["choices"])
        else:
            continue
        if metavars and f.name in metavars:
            kw["metavar"] = metavars[f.name]
        text = _flags_in_help(docs.get(f.name, ""), flags).replace("%", "%%")
        if kw.get("action") == "extend":
            text += " (one or more; repeatable)"
        elif default not in ((), {}) and "(default" not in text.lower() and "(required)" not in text:  # one default
            text += f" (default: {default!r})".replace("%", "%%")
        parser.add_argument(flag_name(f.name), help=text, **kw)
        if f.name in RENAMED:  # the old spelling still works, unlisted, with a line saying the new one
            parser.add_argument("--" + f.name.replace("_", "-"), **{**kw, "action": _Renamed, "help": argparse.SUPPRESS})


def config_kwargs_from_args(cls, args: argparse.Namespace, *, skip=()) -> dict:
    """The dataclass keyword arguments from parsed `add_config_arguments` options."""
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in skip or not hasattr(args, f.name):
            continue
        value = getattr(args, f.name)
        if isinstance(value, list) and value and isinstance(value[0], tuple) and len(value[0]) == 2:
            value = dict(value)  # KEY=VALUE pairs
        elif value is None and f.default is dataclasses.MISSING and f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        elif value is None and isinstance(f.default, tuple):  # a repeatable tuple[T, ...] option not given
            value = f.default
        elif isinstance(value, list):
            value = tuple(value)
        out[f.name] = value
    return out

