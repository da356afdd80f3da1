"""Plot output that survives headless runs.

A plotly figure shown in JupyterLab lives in the browser; under papermill or nbval nothing of it
remains but a JSON blob. Every notebook plot therefore also goes through `save_figure`, which
writes a self-contained static copy into the figures directory: an HTML file that opens offline
(plotly.js is written once beside it), the figure's JSON spec for later re-rendering, and a PNG
that a Markdown report can embed (`report_figure_lines`). The PNG needs kaleido and a Chromium
(`CHROMIUM_PATH`, else `chromium` on PATH, else /usr/bin/chromium), which kaleido's own sync server
keeps open for the whole process (a cold start costs seconds, a warm image much less) and stops at
exit; without them a figure stays HTML + JSON and one warning per process says why. Where
$ROOKWORLD_PNG is "0", `save_figure` writes no PNG and whoever set it renders them from the JSON
specs (`render_pngs`): `rookworld run` does, once for all its notebooks, on one browser.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import statistics
import threading
import time
from concurrent.futures import Future
from pathlib import Path

import plotly.graph_objects as go
import plotly.io as pio
from IPython.display import display
from pandas.io.formats.style import Styler
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from ..chess.evaluate import STRICT_METRICS
from ..core.config import is_int
from ..core.progress import widget_frontend
from .places import FIGURES_DIR

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
PNG_WIDTH = 1000  # px of a saved PNG whose figure sets no width (it fills the notebook's cell)
PNG_ENV = "ROOKWORLD_PNG"  # "0": save_figure leaves the PNG to render_pngs (each process's first costs ~5 s)
PNG_TIMEOUT_S = 60.0  # a browser that hangs (or died at start) costs the run this much once, then PNGs are off
_png_off: str | None = None  # why this process writes no PNGs, once one failed


def _chromium() -> str:
    path = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium") or "/usr/bin/chromium"
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        where = "CHROMIUM_PATH" if os.environ.get("CHROMIUM_PATH") else "chromium on PATH or /usr/bin/chromium"
        raise RuntimeError(f"no executable Chromium at {path!r} ({where})")
    return path


def _write_png(fig: go.Figure, path: Path) -> bool:
    """Write `fig` as a PNG at `path`; False (with the process's one warning) when PNGs are off."""
    global _png_off
    if _png_off is not None:
        return False
    done: Future = Future()

    def write() -> None:  # on a thread of its own: kaleido's server waits forever on a browser that died at start
        try:
            import kaleido  # optional heavy dependency

            try:  # the browser is given (nothing searched or downloaded); mathjax off: its default is a CDN
                kaleido.start_sync_server(path=_chromium(), n=1, mathjax=False, timeout=PNG_TIMEOUT_S,
                                          silence_warnings=True)  # already running: a no-op
                # rendered on the running server: png, the layout's size; a figure that fits its notebook
                # cell (no width) gets PNG_WIDTH, wide enough for its panels
                size = {"width": fig.layout.width or PNG_WIDTH, "height": fig.layout.height or 500}
                done.set_result(path.write_bytes(kaleido.calc_fig_sync(fig, opts=size)))
            except BaseException:
                kaleido.stop_sync_server(silence_warnings=True)  # PNGs are off from here: free the browser
                raise
        except BaseException as exc:  # noqa: BLE001  (no kaleido, no browser, a failed render)
            done.set_exception(exc)

    threading.Thread(target=write, name="png", daemon=True).start()
    try:
        done.result(PNG_TIMEOUT_S)
        return True
    except Exception as exc:  # noqa: BLE001
        _png_off = f"{type(exc).__name__}: {str(exc) or f'no answer within {PNG_TIMEOUT_S:.0f} s'}".splitlines()[0]
        log.warning("figures are saved as HTML + JSON only, without PNG copies: %s", _png_off)
        return False


def save_figure(fig: go.Figure, name: str, figures_dir: str | Path | None = None) -> Path:
    """Write `<name>.html` (offline, plotly.js beside it), `<name>.json` and, where a Chromium
    renders it, `<name>.png`; return the HTML path."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):  # `$` let a trailing newline through
        raise ValueError(f"figure name {name!r} must be letters, digits, '_', '-' or '.'")
    out = Path(figures_dir) if figures_dir is not None else FIGURES_DIR
    out.mkdir(parents=True, exist_ok=True)
    html = out / f"{name}.html"
    # "directory" writes plotly.min.js once into `out` and references it: offline and small.
    fig.write_html(html, include_plotlyjs="directory", full_html=True)
    (out / f"{name}.json").write_text(pio.to_json(fig))
    png = out / f"{name}.png"
    if os.environ.get(PNG_ENV) == "0" or not _write_png(fig, png):
        png.unlink(missing_ok=True)  # a stale image of an earlier run would contradict the HTML
    return html


def render_pngs(figures_dir: str | Path) -> int:
    """Write the PNG of every figure `save_figure` left without one in figures_dir (from its JSON
    spec: the same image), on this process's browser; returns how many were written."""
    written = 0
    for spec in sorted(Path(figures_dir).glob("*.json")):
        png = spec.with_suffix(".png")
        if spec.with_suffix(".html").is_file() and not png.exists():
            written += _write_png(pio.from_json(spec.read_text()), png)
    return written


def report_figure_lines(run_dir: str | Path) -> list[str]:
    """Markdown for the figures in `<run_dir>/figures`: a "## Figures" section with each PNG inline
    (and its interactive HTML linked), or the HTML link alone where no PNG was made; [] if none."""
    figures = Path(run_dir) / "figures"
    lines = []
    for html in sorted(figures.glob("*.html")):
        name = html.stem
        if (figures / f"{name}.png").is_file():
            lines += [f"![{name}](figures/{name}.png)", "", f"[{name}, interactive](figures/{html.name})", ""]
        else:
            lines += [f"- [{name}](figures/{html.name})", ""]
    return ["", "## Figures", "", *lines[:-1]] if lines else []


class _Table(Styler):
    def __repr__(self) -> str:  # Styler's own: "<pandas.io.formats.style.Styler object at 0x...>"
        return self.data.to_string()


def legible(frame, digits: int = 3, cell_px: int = 220):
    """A DataFrame as a table people read in a notebook: floats to `digits` decimals (thousands
    separated), missing values blank, and cells that wrap (at most `cell_px` wide, long names break
    anywhere) so that a wide table fits its cell instead of running off the right edge. A pandas
    Styler: it renders as HTML, and as the frame's text where only text is shown (a saved notebook's
    text/plain, a terminal); the frame itself is unchanged."""
    return _Table(frame).format(precision=digits, thousands=",", na_rep="").set_table_styles(
        [{"selector": "th, td", "props": [("white-space", "normal"), ("overflow-wrap", "anywhere"),
                                          ("max-width", f"{cell_px}px")]}])


def series_colour(i: int) -> str:
    """The colour of a figure's i-th series, fixed (plotly's default palette, in its order), so that a
    series drawn in several panels, or with a trend beside it, keeps one colour and its legend entry
    matches every trace of it."""
    return qualitative.Plotly[i % len(qualitative.Plotly)]


# The reward keys every GRPO figure draws keep one colour across figures (the live curves and the trend)
KEY_COLOUR = {"reward": 0, "rewards/P/mean": 1, "rewards/A/mean": 2}


def _check_keys(keys, where: str) -> None:
    """Metric keys must be a list of names: a str would be read letter by letter."""
    if isinstance(keys, (str, bytes)) or not all(isinstance(k, str) for k in keys):
        raise ValueError(f"{where}: give a list of metric keys (['loss', 'eval/loss']), got {keys!r}")


def curves_figure(history: list[dict], keys: list[str], title: str, x: str = "step", trend: bool = False,
                  smooth: int = 1, names: dict[str, str] | None = None) -> go.Figure:
    """One line per metric key over the training history (records of JSON-lines metrics); with
    `trend`, each key's least-squares line (fitted to the raw points) beside it, dashed, same colour;
    with `smooth` > 1 the lines are trailing means over that many points. The title's second line
    says both. names: a legend name for a key (its weight, say); the key by default."""
    names = names or {}
    _check_keys(keys, "curves_figure")
    if not is_int(smooth, 1):
        raise ValueError(f"curves_figure: smooth must be a number of points >= 1 (1: none), got {smooth!r}")
    how = ([f"lines: trailing means of {smooth} {x}s"] if smooth > 1 else []) + \
        (["dashed: least-squares line fitted to every point"] if trend else [])
    title = f"{title}<br><sup>{'; '.join(how)}</sup>" if how else title
    fig = go.Figure()
    for i, key in enumerate(keys):
        # NaN is a gap, as null is (one would turn the trend and `smooth` points after it into NaN); records
        # without a step are numbered, as LiveCurves numbers them
        pts = [(r.get(x, n + 1) if x == "step" else r[x], r[key]) for n, r in enumerate(history)
               if r.get(key) is not None and r[key] == r[key] and (x == "step" or x in r)]
        if not pts:
            continue
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        colour = series_colour(KEY_COLOUR.get(key, i))
        shown = [statistics.fmean(ys[max(0, j - smooth + 1): j + 1]) for j in range(len(ys))]
        fig.add_scatter(x=xs, y=shown, mode="lines+markers" if smooth == 1 else "lines", name=names.get(key, key),
                        line=dict(color=colour), marker=dict(size=4))
        if trend and len(pts) > 1:
            # statistics.linear_regression refuses a constant x: a flat line at the mean there
            slope, icept = statistics.linear_regression(xs, ys) if len(set(xs)) > 1 else (0.0, statistics.fmean(ys))
            fig.add_scatter(x=[xs[0], xs[-1]], y=[icept + slope * xs[0], icept + slope * xs[-1]], mode="lines",
                            name=f"{names.get(key, key)} trend", line=dict(color=colour, dash="dash"), showlegend=False)
    fig.update_layout(title=title, xaxis_title=x)
    return fig.update_yaxes(exponentformat="e")  # 4e-10, not plotly's SI "400p"


CURVE_X = {"tokens": "training tokens", "train_wall_s": "training wall time (s)"}


def learning_curve_figure(curves: dict[str, list[dict]], x: str = "tokens", title: str = "Learning curve",
                          highlight: str | None = None) -> go.Figure:
    """Val loss and every strict chess rate (with its 95% interval) against training tokens or wall
    time, one line per run: curves maps a run's name to its `evaluate.checkpoint_curve` rows. The
    `highlight` run (one of curves, e.g. this run among the reference runs) is drawn last, in black
    with large star markers, so that a single point is found among the others' lines."""
    if highlight is not None and highlight not in curves:
        raise ValueError(f"highlight={highlight!r} is not one of the curves: {sorted(curves)}")
    if x not in CURVE_X:
        raise ValueError(f"x={x!r}: choose one of {sorted(CURVE_X)}")
    panels = ["val_loss", *STRICT_METRICS]
    fig = make_subplots(rows=2, cols=3, subplot_titles=["val loss (each run's own val texts)", *(f"{m} (%)" for m in STRICT_METRICS)],
                        horizontal_spacing=0.07, vertical_spacing=0.14)
    order = [n for n in curves if n != highlight] + ([highlight] if highlight is not None else [])
    for i, name in enumerate(order):
        rows, color = curves[name], "black" if name == highlight else series_colour(i)
        marker = dict(symbol="star", size=13) if name == highlight else None
        for j, key in enumerate(panels):
            pts = [r for r in rows if r.get(x) is not None and r.get(key) is not None  # measured, and defined
                   and (key == "val_loss" or r[key]["value"] is not None)]
            if key == "val_loss":
                ys, err = [r[key] for r in pts], None
            else:
                ys = [100 * r[key]["value"] for r in pts]
                err = dict(type="data", symmetric=False, array=[100 * r[key]["high"] - y for r, y in zip(pts, ys)],
                           arrayminus=[y - 100 * r[key]["low"] for r, y in zip(pts, ys)], thickness=1)
            fig.add_scatter(x=[r[x] for r in pts], y=ys, error_y=err, mode="lines+markers", name=name,
                            legendgroup=name, showlegend=j == 0, line=dict(color=color), marker=marker,
                            row=j // 3 + 1, col=j % 3 + 1)
    fig.update_xaxes(type="log")  # a learning curve's budgets span orders of magnitude
    fig.update_xaxes(title_text=f"{CURVE_X[x]}, log scale", row=2)
    return fig.update_layout(title=title, height=700, legend=dict(orientation="h", y=-0.14))


MARKERS_UP_TO = 300  # a curve of more points is drawn as a line alone
# A live plot's update resends every point of each trace it extends (plotly's restyle message has no
# "extend"), and the browser redraws: once a step, 3,000 SFT steps cost the training kernel 41 s and
# 6,000 cost 148 s (docs/perf.md). So points are sent in batches: at most every LIVE_REDRAW_S, and
# never more than LIVE_COST_SHARE of the time since the last update.
LIVE_REDRAW_S = 0.25
LIVE_COST_SHARE = 0.05


class LiveCurves:
    """Training curves that grow with each step. In JupyterLab a plotly FigureWidget, extended by the
    training loop's `on_step` callback while the cell runs: each update is a widget message the
    kernel sends on its iopub channel at once, so the browser redraws during the long cell (the
    first record at once, then batches LIVE_REDRAW_S or more apart). Where no
    widget frontend watches (papermill, nbval, plain Python) it only records; `figure()` is the
    static copy every run keeps. `finish()` saves that copy and puts it in the widget's place, so the
    notebook shows each curve once, and a saved notebook reopened shows the figure, not a widget
    whose model is gone.

    panels: metric keys for one plot, or {panel title: keys} for plots stacked on one step axis
    (metrics of different scales: reward, KL, clip fraction). A record without a key (or with None,
    as SFT's steps between val-loss points) adds no point to that key's line."""

    def __init__(self, panels: list[str] | dict[str, list[str]], title: str, live: bool = True):
        for keys in (panels.values() if isinstance(panels, dict) else (panels,)):
            _check_keys(keys, "LiveCurves")
        if isinstance(panels, dict) and not panels:
            raise ValueError("LiveCurves: give a list of metric keys or a dict {panel title: keys}, got {}")
        self.panels = dict(panels) if isinstance(panels, dict) else {"": list(panels)}
        self.title, self.history, self.widget, self._handle = title, [], None, None
        self._shown = 0  # the records of history already in the live plot
        self._next_update = 0.0  # time.monotonic() from which the live plot takes the next batch
        if live and widget_frontend():
            self.widget = go.FigureWidget(self._figure([]))
            self._handle = display(self.widget, display_id=True)

    def _figure(self, history: list[dict]) -> go.Figure:
        titles = list(self.panels)
        fig = make_subplots(rows=len(titles), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                            subplot_titles=titles if len(titles) > 1 else None)
        n = 0  # the trace's place over all panels: its colour unless KEY_COLOUR fixes one
        for row, keys in enumerate(self.panels.values(), start=1):
            for key in keys:  # every key gets its trace, points or not: the widget extends them by name
                pts = [(r.get("step", i + 1), r[key]) for i, r in enumerate(history) if r.get(key) is not None]
                # markers while they can be told apart: 3,000 SFT steps of them draw a thick band
                fig.add_scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], name=key,
                                mode="lines+markers" if len(pts) <= MARKERS_UP_TO else "lines",
                                line=dict(color=series_colour(KEY_COLOUR.get(key, n))), row=row, col=1)
                n += 1
            if all(y >= 0 for r in history for k in keys if isinstance(y := r.get(k), (int, float))):
                fig.update_yaxes(rangemode="nonnegative", row=row, col=1)  # a share that stayed 0: 0..1, not -1..1
        fig.update_xaxes(title_text="step", row=len(titles), col=1)
        fig.update_yaxes(exponentformat="e")  # 4e-10, not plotly's SI "400p"
        return fig.update_layout(title=self.title, height=200 + 220 * len(titles))

    def __call__(self, record: dict) -> None:
        """Record one metrics record; extend the live plot, if there is one (the first record at
        once, later ones in batches: LIVE_REDRAW_S)."""
        self.history.append(record)
        if self.widget is None:
            return
        if time.monotonic() >= self._next_update:
            start, unsent = time.monotonic(), list(enumerate(self.history[self._shown:], start=self._shown + 1))
            with self.widget.batch_update():
                for trace in self.widget.data:
                    if pts := [(r.get("step", i), r[trace.name]) for i, r in unsent if r.get(trace.name) is not None]:
                        trace.x, trace.y = (*trace.x, *(p[0] for p in pts)), (*trace.y, *(p[1] for p in pts))
            self._shown = len(self.history)
            now = time.monotonic()
            self._next_update = now + max(LIVE_REDRAW_S, (now - start) / LIVE_COST_SHARE)

    def figure(self) -> go.Figure:
        """The static figure of everything recorded."""
        return self._figure(self.history)

    def finish(self, name: str, figures_dir: str | Path | None = None) -> go.Figure:
        """Save the static figure (`save_figure(fig, name, figures_dir)`) and show it once: in the live
        widget's place where there is one, else below the cell. Returns it."""
        fig = self.figure()
        save_figure(fig, name, figures_dir)
        if self._handle is not None:  # the figure's own bundle: a Figure displays itself anew, never in place
            self._handle.update({**pio.renderers["plotly_mimetype"].to_mimebundle(fig.to_dict()),
                                 "text/plain": f"<figure {self.title!r}>"}, raw=True)
            self.widget = self._handle = None
        else:
            display(fig)
        return fig
