import json

import plotly.graph_objects as go
import plotly.io as pio
import pytest

from rookworld_lib.lab import plots


@pytest.fixture(autouse=True)
def png_now(monkeypatch):
    """PNGs rendered by save_figure itself, as in JupyterLab (the root conftest defers them)."""
    monkeypatch.delenv(plots.PNG_ENV, raising=False)


def test_save_figure_writes_offline_html_and_json(tmp_path):
    fig = go.Figure(go.Scatter(x=[1, 2, 3], y=[3, 1, 2], name="a"))
    fig.update_layout(title="t")
    html = plots.save_figure(fig, "demo", tmp_path)
    text = html.read_text()
    assert "plotly.min.js" in text and "cdn.plot.ly" not in text  # offline: script beside the file
    assert (tmp_path / "plotly.min.js").exists()
    back = pio.from_json(html.with_suffix(".json").read_text())  # the spec re-renders the figure
    assert list(back.data[0].y) == [3, 1, 2]
    assert json.loads((tmp_path / "demo.json").read_text())["layout"]["title"]["text"] == "t"


def test_save_figure_rejects_bad_names(tmp_path):
    with pytest.raises(ValueError, match="figure name"):
        plots.save_figure(go.Figure(), "../escape", tmp_path)


def test_live_curves_records_without_widgets():
    live = plots.LiveCurves(["reward", "kl"], "GRPO")
    live({"step": 0, "reward": 0.1, "kl": 0.0})
    live({"step": 1, "reward": 0.3})
    fig = live.figure()
    assert [t.name for t in fig.data] == ["reward", "kl"]
    assert list(fig.data[0].y) == [0.1, 0.3] and list(fig.data[1].y) == [0.0]


def test_a_long_curve_is_a_line_and_a_short_one_keeps_its_markers():
    """3,000 SFT steps drawn with markers made a thick band; the few val-loss points keep theirs."""
    from rookworld_lib.lab.plots import MARKERS_UP_TO, LiveCurves

    live = LiveCurves(["loss", "eval/loss"], "t", live=False)
    for s in range(1, 3001):
        live({"step": s, "loss": 1.0 / s, "eval/loss": 2.0 / s if s % 500 == 0 else None})
    modes = {t.name: t.mode for t in live.figure().data}
    assert modes == {"loss": "lines", "eval/loss": "lines+markers"} and 6 <= MARKERS_UP_TO < 3000


def test_live_curves_panels_and_the_widget_extend_by_name():
    # outside a kernel there is no widget; a FigureWidget built as in JupyterLab shows what the browser gets
    live = plots.LiveCurves({"reward": ["reward", "rewards/P/mean"], "KL": ["kl"]}, "GRPO")
    assert live.widget is None
    live.widget = go.FigureWidget(live._figure([]))
    live({"step": 1, "reward": -1.0, "rewards/P/mean": -0.5, "kl": None})  # None: SFT's steps without a val loss
    live({"step": 2, "reward": -0.5, "kl": 0.01})
    assert [(t.name, t.x, t.y, t.yaxis) for t in live.widget.data] == [
        ("reward", (1, 2), (-1.0, -0.5), "y"), ("rewards/P/mean", (1,), (-0.5,), "y"), ("kl", (2,), (0.01,), "y2")]
    static = live.figure()
    assert [(t.name, t.x, t.y) for t in static.data] == [(t.name, t.x, t.y) for t in live.widget.data]
    assert [a.text for a in static.layout.annotations] == ["reward", "KL"]  # the panel titles


def chromium_or_skip():
    try:
        import kaleido  # noqa: F401

        return plots._chromium()
    except (ImportError, RuntimeError) as exc:
        pytest.skip(f"no PNG copies here: {exc}")


def test_save_figure_writes_a_png_of_the_layout_size(tmp_path):
    chromium_or_skip()
    fig = go.Figure(go.Scatter(x=[1, 2, 3], y=[3, 1, 2]))
    fig.update_layout(width=640, height=360)
    plots.save_figure(fig, "demo", tmp_path)
    head = (tmp_path / "demo.png").read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR"
    assert (int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")) == (640, 360)


def test_deferred_pngs_start_no_browser_and_render_pngs_writes_each_once(tmp_path, monkeypatch):
    fig = go.Figure(go.Scatter(x=[1, 2, 3], y=[3, 1, 2]))
    fig.update_layout(width=640, height=360)
    (tmp_path / "b.png").write_bytes(b"stale")  # an earlier run's image must not outlive its figure
    monkeypatch.setenv(plots.PNG_ENV, "0")
    with monkeypatch.context() as m:
        m.setattr(plots, "_write_png", lambda fig, path: pytest.fail("a deferred PNG was rendered"))
        for name in ("a", "b"):
            plots.save_figure(fig, name, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.html", "a.json", "b.html", "b.json", "plotly.min.js"]
    (tmp_path / "notes.json").write_text("{}")  # JSON that save_figure did not write is no figure
    chromium_or_skip()
    assert plots.render_pngs(tmp_path) == 2
    head = (tmp_path / "a.png").read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert (int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")) == (640, 360)
    assert plots.render_pngs(tmp_path) == 0 and not (tmp_path / "notes.png").exists()


def test_without_chromium_figures_stay_html_and_json_with_one_warning(tmp_path, monkeypatch, caplog):
    not_executable = tmp_path / "chromium"
    not_executable.write_text("")
    monkeypatch.setenv("CHROMIUM_PATH", str(not_executable))
    monkeypatch.setattr(plots, "_png_off", None)  # PNGs not yet off in this process
    (tmp_path / "figs").mkdir()
    (tmp_path / "figs" / "b.png").write_bytes(b"stale")  # an earlier run's image must not outlive its figure
    with caplog.at_level("WARNING", logger="rookworld_lib.lab.plots"):
        for name in ("a", "b"):
            plots.save_figure(go.Figure(go.Scatter(y=[1, 2])), name, tmp_path / "figs")
    # only this module's records: a browser an earlier test started in this worker (kaleido's server
    # runs on a thread of its own) may log into the same capture at any time
    ours = [r for r in caplog.records if r.name == plots.log.name]
    assert [r.getMessage().count("\n") for r in ours] == [0]  # one warning, one line
    assert "CHROMIUM_PATH" in ours[0].getMessage()
    assert sorted(p.name for p in (tmp_path / "figs").iterdir()) == ["a.html", "a.json", "b.html", "b.json",
                                                                    "plotly.min.js"]


def test_report_figure_lines_embed_pngs_and_link_the_rest(tmp_path):
    assert plots.report_figure_lines(tmp_path) == []
    figs = tmp_path / "figures"
    figs.mkdir()
    for name in ("curves.html", "curves.png", "table.html", "plotly.min.js"):
        (figs / name).write_text("")
    assert plots.report_figure_lines(tmp_path) == [
        "", "## Figures", "", "![curves](figures/curves.png)", "", "[curves, interactive](figures/curves.html)", "",
        "- [table](figures/table.html)"]


def test_curves_figure_trend_lines_are_least_squares_fits():
    import numpy as np

    from rookworld_lib.lab.plots import curves_figure

    history = [{"step": s, "r": 0.1 * s + (0.05 if s % 2 else -0.05)} for s in range(1, 11)]
    fig = curves_figure(history, ["r", "absent"], "t", trend=True)
    data, trend = fig.data  # one series and its trend line; a key nobody logged draws nothing
    slope, icept = np.polyfit(list(data.x), list(data.y), 1)
    assert list(trend.x) == [1, 10] and trend.line.dash == "dash" and trend.line.color == data.line.color
    assert np.allclose(trend.y, [icept + slope * 1, icept + slope * 10])
    # a NaN is a gap as null is (it made the whole trend line NaN); records without a step are numbered
    history[4]["r"] = float("nan")
    data, trend = curves_figure(history, ["r"], "t", trend=True).data
    assert 5 not in list(data.x) and np.isfinite(trend.y).all()
    data = curves_figure([{"r": 1.0}, {"r": 2.0}], ["r"], "t").data[0]
    assert list(data.x) == [1, 2]
    # the title says what the lines are; a legend name may carry the key's weight
    fig = curves_figure(history, ["r"], "t", trend=True, smooth=3, names={"r": "r (x0.5)"})
    assert fig.layout.title.text == "t<br><sup>lines: trailing means of 3 steps; dashed: least-squares line fitted to every point</sup>"
    assert [t.name for t in fig.data] == ["r (x0.5)", "r (x0.5) trend"]
    assert curves_figure(history, ["r"], "t").layout.title.text == "t"


def test_finish_puts_the_static_figure_in_the_live_widgets_place(tmp_path, monkeypatch):
    """In JupyterLab the curves are shown once: the saved static figure replaces the widget's output
    (update_display_data with the figure's own mime bundle: a Figure object would display itself anew)."""
    updates, shown = [], []

    class Handle:
        def update(self, obj, **kw):
            updates.append((obj, kw))

    monkeypatch.setattr(plots, "_write_png", lambda fig, path: False)
    monkeypatch.setattr(plots, "display", lambda *a, **k: shown.append(a))
    live = plots.LiveCurves(["reward"], "GRPO")
    live.widget, live._handle = plots.go.FigureWidget(live._figure([])), Handle()
    live({"step": 1, "reward": 0.5})
    fig = live.finish("curves", tmp_path)
    (bundle, kw), = updates
    assert kw == {"raw": True} and bundle["application/vnd.plotly.v1+json"]["data"][0]["y"] == [0.5]
    assert shown == [] and live.widget is None and (tmp_path / "curves.html").exists() and list(fig.data[0].y) == [0.5]
    headless = plots.LiveCurves(["reward"], "GRPO")  # no widget: the static figure is displayed below the cell
    headless.finish("curves2", tmp_path)
    assert len(shown) == 1


def test_a_reward_key_keeps_its_colour_in_the_live_curves_and_the_trend_figure():
    from rookworld_lib.lab.plots import LiveCurves, curves_figure

    history = [{"step": s, "reward": 0.1 * s, "rewards/P/mean": 0.2 * s, "rewards/A/mean": 0.3 * s, "kl": 0.01}
               for s in (1, 2, 3)]
    live = LiveCurves({"reward": ["reward", "rewards/P/mean", "rewards/A/mean"], "KL": ["kl"]}, "GRPO", live=False)
    live.history = history
    colours = {t.name: t.line.color for t in live.figure().data}
    assert len(set(colours.values())) == 4  # one colour per trace across the panels
    trend = curves_figure(history, ["rewards/P/mean", "rewards/A/mean"], "per task", trend=True)
    assert all(t.line.color == colours[t.name.removesuffix(" trend")] for t in trend.data)


def test_legible_tables_wrap_in_html_and_read_as_text_where_only_text_is_shown():
    """What a saved notebook keeps of a table: HTML whose cells wrap, and, for a viewer that shows
    text/plain only, the table's text (pandas' Styler gives "<... Styler object at 0x...>")."""
    import pandas as pd
    from IPython.core.formatters import DisplayFormatter

    frame = pd.DataFrame({"metric": ["policy/valid", "env/valid"], "value (%)": [12.345, 67.0]})
    table = plots.legible(frame).set_caption("before and after")  # Styler's chained methods keep the kind
    bundle, _ = DisplayFormatter().format(table)
    assert bundle["text/plain"] == frame.to_string()
    assert "overflow-wrap: anywhere" in bundle["text/html"] and "12.345" in bundle["text/html"]
    assert "before and after" in bundle["text/html"]


def test_learning_curve_panels_sit_under_their_titles_on_log_token_axes():
    from rookworld_lib.chess.evaluate import STRICT_METRICS

    value = {m: 0.1 * (k + 1) for k, m in enumerate(STRICT_METRICS)}  # each metric its own level
    fig = plots.learning_curve_figure({"run": [{"tokens": t, "val_loss": 2.0, **{m: {"value": v, "low": v - 0.01, "high": v + 0.01,
                                                                                  "n": 100} for m, v in value.items()}}
                                               for t in (1e5, 1e7)]})
    want = {"val loss": 2.0, **{f"{m} (%)": 100 * v for m, v in value.items()}}
    for title in fig.layout.annotations:  # the trace whose axes hold the title's spot: the title's metric
        (trace,) = [t for t in fig.data if fig.layout[t.xaxis.replace("x", "xaxis")].domain[0] <= title.x
                    <= fig.layout[t.xaxis.replace("x", "xaxis")].domain[1]
                    and fig.layout[t.yaxis.replace("y", "yaxis")].domain[1] == pytest.approx(title.y)]
        name = next(k for k in want if title.text.startswith(k))
        assert list(trace.y) == pytest.approx([want[name]] * 2), title.text
        assert fig.layout[trace.xaxis.replace("x", "xaxis")].type == "log"  # tokens on a log scale, as titled
    assert len(fig.layout.annotations) == len(want) == len(fig.data)


def test_live_curves_plot_the_records_own_steps():
    curves = plots.LiveCurves(["reward"], "t", live=False)
    for step, reward in ((10, 0.1), (20, 0.2), (30, 0.3)):
        curves({"step": step, "reward": reward})
    assert list(curves.figure().data[0].x) == [10, 20, 30]


def test_curves_figure_smoothed_lines_are_trailing_means_and_the_trend_fits_the_raw_points():
    """smooth=k: point j is the mean of points j-k+1..j (fewer at the start), drawn as a line without
    markers; smooth=1 draws the raw points with markers; the trend is fitted to the raw points."""
    history = [{"step": s, "r": v} for s, v in zip(range(1, 6), [1.0, 3.0, 2.0, 6.0, 4.0])]
    raw = plots.curves_figure(history, ["r"], "t").data[0]
    assert list(raw.y) == [1.0, 3.0, 2.0, 6.0, 4.0] and raw.mode == "lines+markers"
    line, trend = plots.curves_figure(history, ["r"], "t", smooth=2, trend=True).data
    assert list(line.x) == [1, 2, 3, 4, 5] and line.mode == "lines"
    assert list(line.y) == pytest.approx([1.0, 2.0, 2.5, 4.0, 5.0])
    assert list(plots.curves_figure(history, ["r"], "t", smooth=3).data[0].y) == pytest.approx(
        [1.0, 2.0, 2.0, 11 / 3, 4.0])
    # least squares of the raw points (x 1..5, y 1,3,2,6,4): slope 0.9, intercept 0.5
    assert list(trend.y) == pytest.approx([0.5 + 0.9 * 1, 0.5 + 0.9 * 5])


def test_a_trend_over_one_x_is_flat_at_the_mean():
    """statistics.linear_regression refuses a constant x: the trend there is the mean of the points."""
    history = [{"step": 3, "r": 1.0}, {"step": 3, "r": 2.0}, {"step": 3, "r": 6.0}]
    _, trend = plots.curves_figure(history, ["r"], "t", trend=True).data
    assert list(trend.x) == [3, 3] and list(trend.y) == pytest.approx([3.0, 3.0])


def test_live_curves_keep_markers_up_to_markers_up_to_points():
    for n, mode in ((plots.MARKERS_UP_TO, "lines+markers"), (plots.MARKERS_UP_TO + 1, "lines")):
        live = plots.LiveCurves(["loss"], "t", live=False)
        for s in range(1, n + 1):
            live({"step": s, "loss": 1.0})
        assert live.figure().data[0].mode == mode, n


def test_the_live_widget_numbers_records_without_a_step_as_the_static_figure_does():
    live = plots.LiveCurves(["reward"], "t", live=False)
    live.widget = go.FigureWidget(live._figure([]))
    live({"reward": 0.1})
    live({"reward": 0.2})
    assert list(live.widget.data[0].x) == list(live.figure().data[0].x) == [1, 2]


def test_legible_rounds_floats_to_the_digits_asked_for():
    import pandas as pd

    table = plots.legible(pd.DataFrame({"v": [12.34567]}), digits=1).to_html()
    assert ">12.3<" in table and "12.346" not in table
    assert ">12.346<" in plots.legible(pd.DataFrame({"v": [12.34567]})).to_html()
