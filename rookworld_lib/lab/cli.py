"""The `rookworld` command: one subcommand per stage of the workflow.

Each subcommand is a function `(argv) -> int` (`cli`, or the one SUBCOMMANDS names after `:`) in the
module that does the work, imported only when it runs (so `rookworld --help` stays fast). `main` turns
an error a user can cause (`user_error_message`) into one line, `rookworld <command>: error: <what is
wrong, and where>`, and exit status 1 (130 for Ctrl-C); any other error is a bug and keeps its
traceback, as every error does with ROOKWORLD_TRACEBACK=1. Under `--nproc N` a worker hands its line
to the launcher (`distributed.torchrun`), which prints each distinct line once.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import importlib
import io
import os
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

from .. import __version__
from ..chess.datagen import WorkDirMismatch
from ..chess.engine import EngineFailedError, StockfishNotFoundError
from ..core.config import flag_name
from ..core.errors import CheckpointError, NonFiniteError, is_worker, report, report_interrupted
from ..core.tokenizer import TokenizerFileError

SUBCOMMANDS = {
    "datagen": ("rookworld_lib.chess.datagen", "generate Stockfish-labelled P:/A: data and eval sets"),
    "convert": ("rookworld_lib.chess.convert", "convert original RookWorld data (text, JSON lines, Parquet, Arrow) into records"),
    "sft": ("rookworld_lib.chess.training:sft_cli", "supervised pretraining on P:/A: task text"),
    "grpo": ("rookworld_lib.chess.training:grpo_cli", "GRPO with verifiable chess rewards"),
    "eval": ("rookworld_lib.chess.evaluate", "evaluate a checkpoint on held-out chess tasks"),
    "bench": ("rookworld_lib.lab.bench", "side-by-side speed benchmarks against transformers/TRL"),
    "run": ("rookworld_lib.lab.pipeline", "execute the numbered notebooks headless into runs/<timestamp>/"),
}
TRACEBACK_ENV = "ROOKWORLD_TRACEBACK"  # =1: let every error through with its traceback (debugging)


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = ["usage: rookworld <command> [options]   (rookworld --version: the version)", "", "commands:"]
    lines += [f"  {name:<{width}}  {doc}" for name, (_, doc) in SUBCOMMANDS.items()]
    lines += ["", "`rookworld <command> --help` describes each command's options.",
              f"Errors a user can cause end in one line and exit status 1; {TRACEBACK_ENV}=1 shows their tracebacks."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`rookworld argv...`; with argv None, the process's own arguments: the `rookworld` process (its
    console script, `python -m`, a torchrun worker), which ends when this returns."""
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except BrokenPipeError:  # the reader went away (`rookworld --help | head -1`): stop quietly, as `ls | head` does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes at exit
        return 1
    finally:
        if argv is None:
            # The interpreter's teardown runs the cycle collector over every object torch made, more than
            # once: about 1.2 s of every command on 2 cores (docs/perf.md). One collection now (what is
            # garbage is finalized as before), then the rest is frozen: freed one by one as the modules go.
            gc.collect()
            gc.freeze()


def _main(argv: list[str]) -> int:
    if argv[:1] == ["help"] and len(argv) > 1:  # rookworld help sft = rookworld sft --help
        argv = [argv[1], "--help"]
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        print(f"rookworld {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"rookworld: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    debug = os.environ.get(TRACEBACK_ENV) == "1"
    try:
        module, _, func = SUBCOMMANDS[name][0].partition(":")
        return int(getattr(importlib.import_module(module), func or "cli")(rest) or 0)
    except KeyboardInterrupt as exc:
        if debug:
            raise
        return report_interrupted(name, str(exc))  # a training loop names the signal (SIGTERM)
    except BrokenPipeError:
        raise
    except Exception as exc:
        if debug or (message := user_error_message(exc, name)) is None:
            if not debug and _peer_failed(exc):
                # a torchrun worker whose peer died first: the peer's error is the one to read
                return report(name, f"stopped because another worker failed ({_first_line(exc)})", 1, secondary=True)
            raise  # a bug: its traceback is what a report needs
        message = with_flag(message, rest, lambda: _help_text(name))
        if diff := getattr(exc, "resume_diff", None):
            message += resume_options(diff, _help_text(name))
        return report(name, message, 1)


def with_flag(message: str, argv: list[str], help_text: Callable[[], str] = str) -> str:
    """A config check's message (`Cls.field must ...`) with the option for that field: the one the user
    typed (`GRPOTrainConfig.steps (--steps) must be an integer >= 1, got -5`), or, where the default
    is what the check refused, the command's option for it (`(--warmup-steps, not given)`)."""
    if m := re.match(r"(\w+Config)\.(\w+) ", message):
        flag = flag_name(m[2])
        if any(a == flag or a.startswith(flag + "=") for a in argv):
            return f"{m[0][:-1]} ({flag}) {message[m.end():]}"
        if _has_option(flag, help_text()):
            return f"{m[0][:-1]} ({flag}, not given) {message[m.end():]}"
    return message


def resume_options(diff: dict[str, tuple], help_text: str) -> str:
    """For a resume refused over changed settings (field -> (saved, now)): the command's options that
    give the saved values back, where a plain value does (`; as before: --lr 0.003 --beta 0.04`)."""
    given = [f"{flag} {shlex.quote(str(old))}" for field, (old, _) in diff.items()
             if isinstance(old, (int, float, str)) and not isinstance(old, bool) and old != ""
             and _has_option(flag := flag_name(field.rsplit('.', 1)[-1]), help_text)]
    return f"; as before: {' '.join(given)}" if given else ""


def _has_option(flag: str, help_text: str) -> bool:
    return re.search(rf"(^|\s){re.escape(flag)}\b", help_text) is not None


def _help_text(command: str) -> str:
    """`rookworld <command> --help`'s text (the options the command has); empty where it cannot be had."""
    module, _, func = SUBCOMMANDS[command][0].partition(":")
    out = io.StringIO()
    with contextlib.suppress(SystemExit, Exception), contextlib.redirect_stdout(out):
        getattr(importlib.import_module(module), func or "cli")(["--help"])
    return out.getvalue()


# What shrinks a command's memory, for an out-of-memory error
MEMORY_ADVICE = {
    "grpo": "lower --prompts-per-step, --group-size or --minibatch-size, or raise --rollout-chunks (prompts sampled "
            "at a time), or use a smaller model",
    "sft": "lower --batch-size (or raise --grad-accum, which keeps the tokens per step), or use a smaller model",
}


def user_error_message(exc: BaseException, command: str = "sft") -> str | None:
    """The one-line message for an error a user can cause, or None for a bug (see the module doc);
    `command` picks the advice for running out of memory."""
    # messages that name the problem and where: bad input and settings (ValueError, which every config
    # check and our data, checkpoint-format and parameter errors derive from), missing files or engine
    if isinstance(exc, (ValueError, TokenizerFileError, StockfishNotFoundError, EngineFailedError, WorkDirMismatch,
                        CheckpointError, NonFiniteError)):
        return str(exc) or type(exc).__name__
    if isinstance(exc, OSError) and exc.errno is not None:
        return os_error_message(exc)
    # torch reports a failed allocation as torch.OutOfMemoryError (CUDA) or a RuntimeError (CPU)
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError" or (
            isinstance(exc, RuntimeError) and any(s in str(exc) for s in ("can't allocate memory", "out of memory"))):
        first = _first_line(exc) if str(exc).strip() else ""
        advice = MEMORY_ADVICE.get(command, "use a smaller model, batch or --device")
        return f"out of memory{f' ({first})' if first else ''}: {advice}"
    return None


def os_error_message(exc: OSError) -> str:
    """`<what>: <path>` for an OSError: "No space left on device: /runs/x/final/model.safetensors"."""
    what = ("No space left on device" if exc.errno == errno.ENOSPC
            else exc.strerror or os.strerror(exc.errno or 0) or type(exc).__name__)
    paths = [str(p) for p in (exc.filename, exc.filename2) if p is not None]
    if exc.errno in (errno.EEXIST, errno.ENOTDIR):  # a directory wanted where a file is (mkdir, open below it)
        if file := next((q for p in paths for q in (Path(p), *Path(p).parents) if q.exists() and not q.is_dir()), None):
            return f"{file} is a file, not a directory" if file.is_file() else f"{file} is not a directory"
        if link := next((q for p in paths for q in (Path(p), *Path(p).parents) if q.is_symlink() and not q.exists()), None):
            return f"{link} is a symbolic link to nothing (to {os.readlink(link)}, missing or a link loop), not a directory"
    hint = ""
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        hint = "; choose a directory you can write to"
    elif exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        hint = "; free some space (or choose another --out) and run the same command again"
    return f"{what}: {' -> '.join(paths)}{hint}" if paths else f"{what}{hint}"


# What gloo and NCCL say in the surviving workers when one worker of the group has exited.
PEER_FAILURE_MARKS = ("Connection closed by peer", "remote worker crashing", "Connection reset by peer",
                      "NCCL communicator was aborted", "Broken pipe")


def _peer_failed(exc: BaseException) -> bool:
    return is_worker() and isinstance(exc, RuntimeError) and any(m in str(exc) for m in PEER_FAILURE_MARKS)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


if __name__ == "__main__":
    raise SystemExit(main())
