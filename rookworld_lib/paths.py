"""Where the workbench keeps its files.

The repository root is found from this package's location (an editable install), and every
directory can be moved with an environment variable, so notebooks run from any working directory.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def _dir(env_var: str, default: Path) -> Path:
    value = os.environ.get(env_var)
    return Path(value).expanduser().resolve() if value else default


DATA_DIR = _dir("ROOKWORLD_DATA_DIR", REPO_ROOT / "data")
FIGURES_DIR = _dir("ROOKWORLD_FIGURES_DIR", REPO_ROOT / "figures")
RUNS_DIR = _dir("ROOKWORLD_RUNS_DIR", REPO_ROOT / "runs")
NOTEBOOKS_DIR = REPO_ROOT / "notebooks"
