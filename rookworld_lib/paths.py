"""Where the workbench keeps its files, and how it writes them safely.

The repository root is found from this package's location (an editable install), and every
directory can be moved with an environment variable, so notebooks run from any working directory.
Every file the library writes whole (checkpoints, data files, rewritten metrics) goes through
:func:`atomic_write`: readers see the old content or the complete new one, never a torn file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

REPO_ROOT = Path(__file__).resolve().parents[1]


def _dir(env_var: str, default: Path) -> Path:
    value = os.environ.get(env_var)
    return Path(value).expanduser().resolve() if value else default


DATA_DIR = _dir("ROOKWORLD_DATA_DIR", REPO_ROOT / "data")
FIGURES_DIR = _dir("ROOKWORLD_FIGURES_DIR", REPO_ROOT / "figures")
RUNS_DIR = _dir("ROOKWORLD_RUNS_DIR", REPO_ROOT / "runs")
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"


TMP_PREFIX = ".tmp-"  # temporary files of atomic writes; a torn one is left only by a kill


def _fsync_dir(directory: Path) -> None:
    """Make a rename durable. Not every platform can open a directory (Windows): skip there."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Write a file so that readers see either its old content or the complete new one.

    `write(f)` fills a temporary file in the same directory (same filesystem, so the rename is
    atomic); it is flushed, fsynced and renamed over `path`, then the directory is fsynced. On
    any error the temporary file is removed and the error propagates; `path` is untouched.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f"{TMP_PREFIX}{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)
