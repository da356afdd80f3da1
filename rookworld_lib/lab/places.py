"""Where the lab keeps its files (the repository's notebooks, figures and docs), and the commit of
the checkout, which runs and benchmarks record. Figures can be moved with an environment variable;
the data, runs and cache directories, which the core uses too, are in `core.paths`."""

from __future__ import annotations

import contextlib
import subprocess

from ..core.paths import REPO_ROOT, env_dir

FIGURES_DIR = env_dir("ROOKWORLD_FIGURES_DIR", REPO_ROOT / "figures")
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
DOCS_DIR = REPO_ROOT / "docs"


def git_commit() -> str | None:
    """The short commit of the checkout holding this package, "-dirty" after it where tracked files
    differ from it (as `git describe --dirty` writes it: the numbers came from code no commit holds);
    None outside git."""
    def git(*args, check=True):
        return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=5, check=check)

    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = git("rev-parse", "--short", "HEAD").stdout.strip()
        return commit + "-dirty" * (git("diff", "--no-ext-diff", "--quiet", "HEAD", check=False).returncode == 1) or None
    return None
