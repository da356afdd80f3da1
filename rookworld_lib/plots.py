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


def curves_figure(history: list[dict], keys: list[str], title: str, x: str = "step") -> go.Figure:
    """One line per metric key over the training history (records of JSON-lines metrics)."""
    fig = go.Figure()
    for key in keys:
        pts = [(r[x], r[key]) for r in history if key in r and r[key] is not None]
        if pts:
            fig.add_scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="lines+markers", name=key)
    fig.update_layout(title=title, xaxis_title=x)
    return fig


class LiveCurves:
    """A plot that grows with each training step in JupyterLab (a plotly FigureWidget). Without widgets
    (papermill, nbval, plain Python) it only records; `figure()` is the static copy a headless run keeps."""

    def __init__(self, keys: list[str], title: str, live: bool = True):
        self.keys, self.title, self.history = keys, title, []
        self.widget = None
        if live:
            try:
                import ipywidgets  # noqa: F401  (FigureWidget needs it)
                from IPython import get_ipython
                from IPython.display import display

                if type(get_ipython()).__name__ == "ZMQInteractiveShell":  # None outside IPython
                    self.widget = go.FigureWidget(curves_figure([], keys, title))
                    for key in keys:
                        self.widget.add_scatter(x=[], y=[], mode="lines+markers", name=key)
                    display(self.widget)
            except Exception:  # no widget support: record only
                self.widget = None

    def __call__(self, record: dict) -> None:
        """Record one metrics record; extend the live plot, if there is one."""
        self.history.append(record)
        if self.widget is not None:
            with self.widget.batch_update():
                for trace, key in zip(self.widget.data, self.keys):
                    if key in record:
                        trace.x = (*trace.x, record.get("step", len(self.history)))
                        trace.y = (*trace.y, record[key])

    def figure(self) -> go.Figure:
        """The static figure of everything recorded."""
        return curves_figure(self.history, self.keys, self.title)
