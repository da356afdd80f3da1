"""Plot output that survives headless runs.

A plotly figure shown in JupyterLab lives in the browser; under papermill or nbval nothing of it
remains but a JSON blob. Every notebook plot therefore also goes through `save_figure`, which
writes a self-contained static copy into the figures directory: an HTML file that opens offline
(plotly.js is written once beside it) and the figure's JSON spec for later re-rendering.
"""

from __future__ import annotations

import re
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio

from .paths import FIGURES_DIR

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def save_figure(fig: go.Figure, name: str, figures_dir: str | Path | None = None) -> Path:
    """Write `<name>.html` (offline, plotly.js beside it) and `<name>.json`; return the HTML path."""
    if not _NAME.match(name):
        raise ValueError(f"figure name {name!r} must be letters, digits, '_', '-' or '.'")
    out = Path(figures_dir) if figures_dir is not None else FIGURES_DIR
    out.mkdir(parents=True, exist_ok=True)
    html = out / f"{name}.html"
    # "directory" writes plotly.min.js once into `out` and references it: offline and small.
    fig.write_html(html, include_plotlyjs="directory", full_html=True)
    (out / f"{name}.json").write_text(pio.to_json(fig))
    return html


def load_figure(path: str | Path) -> go.Figure:
    """Re-open a figure saved by save_figure (from its .json spec)."""
    path = Path(path)
    return pio.from_json(path.with_suffix(".json").read_text())


def figure_summary(fig: go.Figure) -> dict:
    """Trace names and point counts: a small, comparable record of what a figure shows."""
    return {"title": fig.layout.title.text, "traces": [(t.name, len(t.x) if t.x is not None else 0) for t in fig.data]}


__all__ = ["save_figure", "load_figure", "figure_summary"]
