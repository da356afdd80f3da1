"""Where the workbench keeps its files, and how it writes them safely.

Directories come from this package's location (an editable install) and can each be moved with an
environment variable, so notebooks run from any working directory. Every file written whole goes
through :func:`atomic_file`, so readers see the old content or the complete new one, never a torn
file. JSON lines, the library's one line format: :func:`write_jsonl`, :class:`JsonlAppender`
(append-only logs that survive a kill) and :func:`read_jsonl`.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
_UMASK = os.umask(0o022)  # read once (os.umask can only be read by setting it) and put back at once
os.umask(_UMASK)


def env_dir(env_var: str, default: Path) -> Path:
    """A directory that an environment variable can move (resolved), else `default`."""
    value = os.environ.get(env_var)
    return Path(value).expanduser().resolve() if value else default


DATA_DIR = env_dir("ROOKWORLD_DATA_DIR", REPO_ROOT / "data")
RUNS_DIR = env_dir("ROOKWORLD_RUNS_DIR", REPO_ROOT / "runs")  # the trainers' default out_dir is in it
TMP_PREFIX = ".tmp-"  # temporary files of atomic writes; a torn one is left only by a kill


_FULL = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}  # errors only a write can cause


def cache_dir() -> Path:
    """Where the library keeps what it can rebuild (the tokenizer for exports, the digests of data files
    found valid): $XDG_CACHE_HOME/rookworld, by default ~/.cache/rookworld."""
    if base := os.environ.get("XDG_CACHE_HOME"):
        return Path(base) / "rookworld"
    try:
        return Path.home() / ".cache" / "rookworld"
    except (RuntimeError, KeyError):  # no HOME and no passwd entry (a container's arbitrary uid)
        return Path(tempfile.gettempdir()) / f"rookworld-cache-{os.getuid()}"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary file name that replaces `path` when the ``with`` block ends without an error, for
    writers that take a file name (safetensors' `save_file`).

    The file is in the same directory (so the rename is atomic); it is fsynced and renamed over
    `path`, then the directory is fsynced. On an error it is removed and `path` is untouched.
    """
    path = Path(path)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f"{TMP_PREFIX}{path.name}.")
    os.close(fd)
    tmp = Path(name)
    try:
        with naming(path, _FULL):  # a full disk (a write, the fsync) is named; a read error in the body stays its own
            yield tmp
            # mkstemp makes the file 0600 (and safetensors' save_file writes its own file 0600): the result
            # gets the mode a plain open() would give it
            os.chmod(tmp, path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_UMASK)
            _fsync(tmp, os.O_RDWR)  # (Windows fsyncs only a writable descriptor)
            os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # skipped where a directory cannot be opened (Windows)
        _fsync(path.parent, os.O_RDONLY)


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary file that replaces `path` when the ``with`` block ends without an error (`atomic_path`)."""
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        yield f


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Fill `path` atomically: `write(f)` writes into the binary file of :func:`atomic_file`."""
    with atomic_file(path) as f:
        write(f)


# --- JSON lines ---

def json_line(obj: Any) -> bytes:
    """One compact ASCII JSON line; NaN and infinity are refused (strict JSON, as jq and pandas read it)."""
    return (json.dumps(obj, separators=(",", ":"), allow_nan=False) + "\n").encode()


def write_jsonl(path: str | os.PathLike, records: Iterable[Any]) -> int:
    """Write `records` to `path` as JSON lines, atomically; return how many."""
    n = 0
    with atomic_file(path) as f:
        for rec in records:
            f.write(json_line(rec))
            n += 1
    return n


def decoded_lines(path: str | os.PathLike, *, torn_tail: bool = False) -> Iterator[tuple[int, str | None, str | None]]:
    """Stream a text file's lines: ``(line number, text, None)``, or ``(line number, None, reason)`` for one
    that is not UTF-8. A ``.gz`` file is read through gzip; a UTF-8 byte-order mark at its start is skipped.
    torn_tail=True leaves out an unterminated last line. OSError propagates (gzip.BadGzipFile is one)."""
    with (gzip.open if str(path).lower().endswith(".gz") else open)(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if torn_tail and not raw.endswith(b"\n"):
                break
            try:
                yield lineno, raw.decode("utf-8-sig" if lineno == 1 else "utf-8"), None  # a BOM (Windows editors) is no data
            except UnicodeDecodeError as exc:
                yield lineno, None, f"not UTF-8 ({exc.reason} at byte {exc.start})"


def read_jsonl(path: str | os.PathLike, *, torn_tail: bool = False) -> Iterator[tuple[int, Any, str | None]]:
    """Stream a JSON-lines file: ``(line number, value, None)`` per non-blank line, or ``(line number,
    None, reason)`` for one that is not UTF-8 or not JSON, for the caller to stop at or skip.

    torn_tail=True leaves out an unterminated last line: only a kill mid-append leaves one
    (:class:`JsonlAppender` writes lines whole), and it is not data. As :func:`decoded_lines` reads it.
    """
    for lineno, line, why in decoded_lines(path, torn_tail=torn_tail):
        if why is not None:
            yield lineno, None, why
        elif line.strip():
            try:
                value = json.loads(line)
            except ValueError as exc:
                yield lineno, None, f"invalid JSON ({exc})"
            except RecursionError:  # json's decoder recurses per nesting level
                yield lineno, None, "invalid JSON (nested too deeply to read)"
            else:
                yield lineno, value, None


def keep_aside(path: Path) -> Path:
    """Rename `path` to ``<stem>-<its mtime, %Y%m%d-%H%M%S>[-n]<suffix>`` beside it, a name not taken yet
    (an earlier result that a new one would replace is kept), and return the new path."""
    kept = stamped_name(path, path.stat().st_mtime)
    path.replace(kept)
    return kept


def stamped_name(path: Path, when: float) -> Path:
    """``<stem>-<when, %Y%m%d-%H%M%S>[-n]<suffix>`` beside `path`: the first such name not taken yet."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(when))
    return next(k for n in range(1, 10**6)
                if not (k := path.with_name(f"{path.stem}-{stamp}{f'-{n}' if n > 1 else ''}{path.suffix}")).exists())


def _cut_torn_tail(path: Path) -> None:
    """Truncate an unterminated last line (left by a kill mid-write) so the next line starts clean."""
    with open(path, "a+b") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(size - 1, 0))
        if size == 0 or fh.read(1) == b"\n":
            return
        fh.seek(0)
        log.warning("%s: dropping a torn last line left by an interrupted run", path)
        fh.truncate(fh.read().rfind(b"\n") + 1)


@contextlib.contextmanager
def naming(path: str | os.PathLike, errnos: set[int] | None = None) -> Iterator[None]:
    """Re-raise an OSError that names no file with `path` in it (only those of `errnos`, when given): a
    failed write or fsync (ENOSPC, EIO) says only "No space left on device", not which file it was writing."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or exc.errno is None or (errnos is not None and exc.errno not in errnos):
            raise
        raise OSError(exc.errno, exc.strerror, str(path)) from exc


class JsonlAppender(contextlib.AbstractContextManager):
    """Append JSON lines to `path` from any thread, each written whole and flushed, so a kill loses at
    most the line being written (cut off by the next appender, ignored by ``read_jsonl(torn_tail=True)``).
    An fsync every `sync_every` lines, at `sync()` and at close bounds what a power cut loses. A failed
    write names the file (``No space left on device: <path>``)."""

    def __init__(self, path: str | os.PathLike, *, sync_every: int = 64):
        self.path = Path(path)
        _cut_torn_tail(self.path)
        self._fh = open(self.path, "ab")
        self._lock = threading.Lock()
        self._sync_every = sync_every
        self._n = 0

    def write(self, obj: Any) -> None:
        line = json_line(obj)
        with self._lock, naming(self.path):
            self._fh.write(line)
            self._fh.flush()
            self._n += 1
            if self._n % self._sync_every == 0:
                os.fsync(self._fh.fileno())

    def sync(self) -> None:
        """Put every line written so far on disk (fsync): they survive a power cut from now on."""
        with self._lock, naming(self.path):
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        with self._lock, naming(self.path):
            if not self._fh.closed:
                try:
                    self._fh.flush()
                    os.fsync(self._fh.fileno())
                finally:
                    self._fh.close()  # the descriptor goes even when the flush failed

    def __exit__(self, *exc) -> None:
        self.close()


class DataFormatError(ValueError):
    """A malformed data line; the message is ``file:line: reason``."""


def json_lines(path: str | os.PathLike, *, torn_tail: bool = False) -> Iterator[tuple[int, object]]:
    """(line number, value) of each non-blank line of any JSON-lines file, e.g. ``{"text": ...}``
    training files; a line that is not UTF-8 or not JSON, or a file that cannot be read, raises
    DataFormatError naming the file (and line). torn_tail: see :func:`read_jsonl`."""
    try:
        for lineno, value, reason in read_jsonl(path, torn_tail=torn_tail):
            if reason is not None:
                raise DataFormatError(f"{path}:{lineno}: {reason}")
            yield lineno, value
    except (OSError, EOFError) as exc:  # EOFError: a truncated .gz
        raise DataFormatError(unreadable(path, exc)) from None


def unreadable(path, exc: OSError | EOFError) -> str:
    return f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})"


# --- one writer per directory: training out_dirs, datagen's and convert's --out

LOCK_FILE = ".lock"


class RunDirBusyError(ValueError):
    """Another run is writing into the same out_dir."""


def busy_message(out_dir: str | os.PathLike) -> str | None:
    """RunDirBusyError's message when another run holds out_dir's lock now, else None (nothing kept)."""
    if not (Path(out_dir) / LOCK_FILE).exists():
        return None
    try:
        with run_lock(out_dir):
            return None
    except RunDirBusyError as exc:
        return str(exc)


_HELD_LOCKS: set[int] = set()  # descriptors of the run locks this process holds


def _drop_inherited_locks() -> None:
    """In a forked child: let go of the run locks' open files it inherited. A flock belongs to the open file, which a
    fork shares, so a pool worker that outlived its SIGKILLed parent kept the lock and refused every later run. Each
    descriptor is pointed at /dev/null rather than closed: the number stays the stale file object's, so a child that
    leaves the `with` block closes /dev/null, not a file it opened since under the same number."""
    for fd in _HELD_LOCKS:
        with contextlib.suppress(OSError):
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, fd)
            os.close(null)
    _HELD_LOCKS.clear()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_drop_inherited_locks)


@contextlib.contextmanager
def run_lock(out_dir: str | os.PathLike, busy: str = "wait for it to finish, or choose another out_dir (--out)"):
    """Hold `<out_dir>/.lock` while a run writes there: a second writer stops at once with one clear
    error instead of mixing its checkpoints and metrics with ours. The lock is flock(2)'s, so the
    kernel drops it when its holder dies (a SIGKILLed run leaves no stale lock); a forked child does not
    hold it (multiprocessing's workers end with os._exit, never in this block). `busy`: what the refusal advises."""
    import fcntl  # POSIX; where it is missing (Windows) runs are not locked

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fh = open(out / LOCK_FILE, "a+", encoding="utf-8")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read().strip() or "another process"
        fh.close()
        raise RunDirBusyError(f"{out} is being written by another run ({holder}); {busy}") from None
    _HELD_LOCKS.add(fd := fh.fileno())
    try:
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        fh.flush()
        yield
    finally:
        _HELD_LOCKS.discard(fd)
        fh.close()
