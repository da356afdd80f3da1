"""Errors a user can cause, and how the `rookworld` command reports them: one line, an exit status; the
signals that stop a command (SIGTERM as Ctrl-C, a worker's parent dying).

Torch-free, so that `rookworld --help` and the commands that train nothing (datagen, convert) start
without importing torch. core.checkpoint (CheckpointError and its save/load kinds) and core.trainer
(NonFiniteError) raise them; `lab.cli` turns them into one line through `report`.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
from pathlib import Path


class CheckpointError(RuntimeError):
    """A checkpoint could not be saved or loaded; the message names the file."""


class NonFiniteError(FloatingPointError):
    """Too many non-finite losses or gradient norms in a row; the run stopped."""


# A worker's one-line error (`rookworld <command>: error: ...`) goes to a file in ERRORS_DIR_ENV, which
# distributed.torchrun prints once per distinct line (worker_errors); the lab's `rookworld` command reports through `report`.
ERRORS_DIR_ENV = "ROOKWORLD_ERRORS_DIR"  # set by torchrun for its workers
INTERRUPTED = 130  # the shell's status for a process ended by SIGINT
RESUMABLE = ("sft", "grpo")  # commands that continue from their latest checkpoint when run again


PEER_STOPPED = "another rank"  # a torchrun worker stopped because another worker got the signal


def report_interrupted(command: str, signal_name: str = "") -> int:
    """`rookworld <command>: interrupted (Ctrl-C)...` (or the signal that stopped it, SIGTERM), one line;
    returns 130. A worker stopped with its peers (PEER_STOPPED) says so only where no worker named a signal."""
    resume = "; the same command resumes from the latest checkpoint" if command in RESUMABLE else ""
    how = signal_name if signal_name.startswith("SIG") and signal_name != "SIGINT" else (
        "with another process" if signal_name == PEER_STOPPED else "Ctrl-C")
    return report(command, f"interrupted ({how}){resume}", INTERRUPTED, kind="", secondary=signal_name == PEER_STOPPED)


class Terminated(KeyboardInterrupt):
    """SIGTERM (`timeout`, a scheduler, docker stop), raised where Ctrl-C would be: see :func:`sigterm_as_interrupt`."""


def _terminated(signum, frame):
    raise Terminated("SIGTERM")


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Inside the block SIGTERM stops the command as Ctrl-C does (raising :class:`Terminated`), so its clean-up
    runs (temporary files removed, locks released) and `rookworld` reports it in one line; before, SIGTERM
    killed it where it stood. Only the main thread can set a handler; elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        yield
    finally:
        if previous is not None:  # None: a handler set outside Python, which cannot be put back
            signal.signal(signal.SIGTERM, previous)


def end_with_parent(signum: int = signal.SIGTERM) -> None:
    """In a child process: ask Linux to send it `signum` when its parent dies, even by SIGKILL, so that no
    worker outlives its command (elsewhere: nothing)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signum, 0, 0, 0)  # PR_SET_PDEATHSIG


def report(command: str, message: str, code: int, kind: str = "error: ", secondary: bool = False) -> int:
    """Print `rookworld <command>: error: <message>` (one line) and return `code`; a torchrun
    worker hands the line to its launcher instead (see the module doc). A secondary error (this
    worker stopped because a peer died) is shown only when no worker reported a primary one."""
    line = f"rookworld {command}: {kind}{' '.join(message.split())}"
    if is_worker():
        with contextlib.suppress(OSError, ValueError):  # the launcher is gone or the directory with it: say it here
            with open(os.path.join(os.environ[ERRORS_DIR_ENV], f"rank{int(os.environ['RANK']):05d}.json"), "w") as f:
                json.dump({"line": line, "code": code, "secondary": secondary}, f)
            return code
    with contextlib.suppress(OSError, ValueError):  # stderr closed (a pipe whose reader is gone): nothing left to tell
        print(line, file=sys.stderr, flush=True)
    return code


def is_worker() -> bool:
    """A process that distributed.torchrun started (it collects the error lines)."""
    return bool(os.environ.get(ERRORS_DIR_ENV)) and os.environ.get("RANK") is not None


def worker_errors(errors_dir: Path) -> tuple[list[str], list[int]]:
    """The distinct error lines the workers wrote (rank order) and their exit statuses. Lines of
    workers that stopped only because a peer died count when no worker said more."""
    primary, secondary, codes = [], [], []
    for f in sorted(errors_dir.glob("rank*.json")):
        try:
            rec = json.loads(f.read_text())
            line, code = str(rec["line"]), int(rec["code"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        lines = secondary if rec.get("secondary") else primary
        if line not in lines:
            lines.append(line)
        codes.append(code)
    return primary or secondary, codes
