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
    """A figure name is letters, digits, '_', '-', '.', and starts with a letter or digit: no path, no
    hidden file, no empty name."""
    for name in ("../escape", "", ".hidden", "_x", "-x", "a b", "ok\n", None):  # "ok\n" wrote ok\n.html
        with pytest.raises(ValueError, match="figure name"):
            plots.save_figure(go.Figure(), name, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_metric_keys_that_are_no_list_of_names_and_a_smoothing_below_one_are_refused():
    """LiveCurves("loss", ...) drew the traces l, o, s, s; curves_figure(h, "loss", ...) drew nothing;
    smooth=0 ended in "fmean requires at least one data point"; LiveCurves({}) in plotly's own words."""
    history = [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}]
    for keys in ("loss", [1]):
        with pytest.raises(ValueError, match=r"^LiveCurves: give a list of metric keys"):
            plots.LiveCurves(keys, "t")
        with pytest.raises(ValueError, match=r"^curves_figure: give a list of metric keys"):
            plots.curves_figure(history, keys, "t")
    assert plots.curves_figure(history, [], "t").data == ()  # no key yet (a run of one step): an empty figure
    with pytest.raises(ValueError, match=r"^LiveCurves: give a list of metric keys"):
        plots.LiveCurves({"loss": "loss"}, "t")
    with pytest.raises(ValueError, match=r"^LiveCurves: give a list of metric keys or a dict"):
        plots.LiveCurves({}, "t")
    for smooth in (0, -2, 1.5):
        with pytest.raises(ValueError, match=rf"^curves_figure: smooth must be a number of points >= 1 \(1: none\), got {smooth}$"):
            plots.curves_figure(history, ["loss"], "t", smooth=smooth)
    assert len(plots.curves_figure(history, ["loss"], "t", smooth=2).data) == 1


def test_live_curves_records_without_widgets():
    live = plots.LiveCurves(["reward", "kl"], "GRPO")
    live({"step": 0, "reward": 0.1, "kl": 0.0})
    live({"step": 1, "reward": 0.3})
    fig = live.figure()
    assert [t.name for t in fig.data] == ["reward", "kl"]
    assert list(fig.data[0].y) == [0.1, 0.3] and list(fig.data[1].y) == [0.0]


def test_a_live_plot_takes_points_in_batches_whose_cost_stays_a_small_share_of_the_run(monkeypatch):
    """Each step's update resent every point of the trace (plotly's restyle has no "extend") and the
    browser redrew: 3,000 live SFT steps cost the training kernel 37 s, 6,000 cost 134 s. Now the first
    record shows at once and later ones in batches, each LIVE_REDRAW_S or more apart, and an update that
    takes time waits LIVE_COST_SHARE's multiple of it; no point is lost or reordered."""
    import contextlib

    class Clock:  # the time plots reads; an update (batch_update) costs `cost` seconds of it
        now, cost = 0.0, 0.0

        def monotonic(self):
            return self.now

    clock, updates = Clock(), []
    monkeypatch.setattr(plots, "time", clock)
    monkeypatch.setattr(plots, "widget_frontend", lambda: True)
    monkeypatch.setattr(plots, "display", lambda *a, **k: None)
    live = plots.LiveCurves(["loss", "eval/loss"], "SFT")
    batch_update = live.widget.batch_update

    @contextlib.contextmanager
    def counted():
        with batch_update():
            yield
        updates.append(clock.now)
        clock.now += clock.cost
    live.widget.batch_update = counted

    def shown(name):
        trace = next(t for t in live.widget.data if t.name == name)
        return list(zip(trace.x, trace.y))

    live({"step": 1, "loss": 3.0, "eval/loss": 3.5})
    assert shown("loss") == [(1, 3.0)] and shown("eval/loss") == [(1, 3.5)]  # the first record at once
    for step in (2, 3):  # within LIVE_REDRAW_S: held
        clock.now += 0.1
        live({"step": step, "loss": 3.0 - step / 10})
    assert shown("loss") == [(1, 3.0)] and len(updates) == 1
    clock.now = plots.LIVE_REDRAW_S
    live({"step": 4, "loss": 2.5, "eval/loss": 2.9})  # the next batch brings every held point, in order
    assert shown("loss") == [(1, 3.0), (2, 2.8), (3, 2.7), (4, 2.5)] and shown("eval/loss") == [(1, 3.5), (4, 2.9)]

    # 3,000 steps of 10 ms: about one update per LIVE_REDRAW_S, not one per step
    start, n = clock.now, len(updates)
    for step in range(5, 3005):
        clock.now += 0.01
        live({"step": step, "loss": 1.0 / step})
    assert len(updates) - n <= (clock.now - start) / plots.LIVE_REDRAW_S + 1
    # an update that takes 0.1 s is followed by none for 0.1 / LIVE_COST_SHARE seconds
    clock.cost, n = 0.1, len(updates)
    for step in range(3005, 4005):
        clock.now += 0.01
        live({"step": step, "loss": 1.0 / step})
    gaps = [b - a for a, b in zip(updates[n:], updates[n + 1:])]
    assert gaps and min(gaps) >= 0.1 / plots.LIVE_COST_SHARE
    steps_shown = [x for x, _ in shown("loss")]
    # nothing lost or doubled; held back at most the steps of one wait
    assert steps_shown == list(range(1, len(steps_shown) + 1))
    assert steps_shown[-1] >= 4004 - (0.1 / plots.LIVE_COST_SHARE + 0.1) / 0.01 - 1
    assert [r["step"] for r in live.history] == list(range(1, 4005))  # the static copy (finish) holds every step


def test_a_long_curve_is_a_line_and_a_short_one_keeps_its_markers():
    """3,000 SFT steps drawn with markers made a thick band; the few val-loss points keep theirs."""
    from rookworld_lib.lab.plots import MARKERS_UP_TO, LiveCurves

    live = LiveCurves(["loss", "eval/loss"], "t", live=False)
    for s in range(1, 3001):
        live({"step": s, "loss": 1.0 / s, "eval/loss": 2.0 / s if s % 500 == 0 else None})
    modes = {t.name: t.mode for t in live.figure().data}
    assert modes == {"loss": "lines", "eval/loss": "lines+markers"} and 6 <= MARKERS_UP_TO < 3000


def test_live_curves_panels_and_the_widget_extend_by_name(monkeypatch):
    # outside a kernel there is no widget; a FigureWidget built as in JupyterLab shows what the browser gets
    monkeypatch.setattr(plots, "LIVE_REDRAW_S", 0.0)  # every record at once (batches: the test above)
    monkeypatch.setattr(plots, "LIVE_COST_SHARE", float("inf"))
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


def test_a_figure_without_a_size_is_rendered_png_width_by_500(tmp_path, monkeypatch):
    """A figure that sets no width or height is rendered PNG_WIDTH (1000) px wide and 500 high, a sized
    one at its own size (what kaleido is asked for)."""
    import kaleido

    sizes = []
    monkeypatch.setattr(plots, "_png_off", None)
    monkeypatch.setattr(kaleido, "start_sync_server", lambda **kw: None)
    monkeypatch.setattr(kaleido, "calc_fig_sync", lambda fig, opts: sizes.append(opts) or b"png")
    plots.save_figure(go.Figure(), "free", tmp_path)
    plots.save_figure(go.Figure(layout=dict(width=300, height=200)), "sized", tmp_path)
    assert sizes == [{"width": 1000, "height": 500}, {"width": 300, "height": 200}]


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
    assert trend.showlegend is False and data.showlegend is not False  # the series' legend entry stands for both
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


def test_a_trend_over_two_points_passes_through_both():
    """Two points fit a line exactly (hand-worked): the trend runs from the first to the second."""
    _, trend = plots.curves_figure([{"step": 1, "r": 1.0}, {"step": 3, "r": 2.0}], ["r"], "t", trend=True).data
    assert list(trend.x) == [1, 3] and list(trend.y) == pytest.approx([1.0, 2.0])


def test_series_colours_follow_plotlys_palette_and_wrap_after_it():
    """The i-th series takes plotly's default palette's i-th colour (ten of them), the 11th the first again."""
    from plotly.colors import qualitative

    assert [plots.series_colour(i) for i in range(11)] == [*qualitative.Plotly, qualitative.Plotly[0]]
    assert plots.series_colour(9) == "#FECB52"


def _curve_rows(level):
    """checkpoint_curve rows at two token counts: val loss 2, every strict rate `level` with interval [level - 0.02, level + 0.05]."""
    from rookworld_lib.chess.evaluate import STRICT_METRICS

    return [{"tokens": t, "val_loss": 2.0, **{m: {"value": level, "low": level - 0.02, "high": level + 0.05, "n": 100}
                                             for m in STRICT_METRICS}} for t in (1e5, 1e7)]


def test_learning_curve_error_bars_span_the_interval_in_percent():
    """Each strict rate's error bar runs from its 95% interval's low to its high, in percent: value 0.3,
    low 0.28, high 0.35 give 2 below and 5 above."""
    from rookworld_lib.chess.evaluate import STRICT_METRICS

    bars = [t.error_y for t in plots.learning_curve_figure({"run": _curve_rows(0.3)}).data if t.error_y.array is not None]
    assert len(bars) == len(STRICT_METRICS)
    for e in bars:
        assert list(e.array) == pytest.approx([5.0, 5.0]) and list(e.arrayminus) == pytest.approx([2.0, 2.0])


def test_learning_curve_shows_each_run_once_in_the_legend_and_draws_the_highlight_last():
    """One legend entry per run; the highlighted run is drawn after the others, in black stars; a highlight
    that is not one of the runs, or an unknown x, is refused."""
    from rookworld_lib.chess.evaluate import STRICT_METRICS

    fig = plots.learning_curve_figure({"a": _curve_rows(0.1), "me": _curve_rows(0.2), "b": _curve_rows(0.3)}, highlight="me")
    assert [t.name for t in fig.data if t.showlegend] == ["a", "b", "me"]
    last = fig.data[-(1 + len(STRICT_METRICS)):]
    assert all(t.name == "me" and t.line.color == "black" and t.marker.symbol == "star" for t in last)
    with pytest.raises(ValueError, match="highlight="):
        plots.learning_curve_figure({"a": _curve_rows(0.1)}, highlight="nobody")
    with pytest.raises(ValueError, match="x="):
        plots.learning_curve_figure({"a": _curve_rows(0.1)}, x="steps")


def test_live_curves_start_at_zero_only_for_a_panel_that_never_went_below_it():
    """A panel whose values stayed >= 0 (a clip share stuck at 0) starts at 0; one with a negative value
    does not; the stacked panels share one step axis."""
    live = plots.LiveCurves({"clip": ["clip"], "reward": ["reward"]}, "t", live=False)
    live({"step": 1, "clip": 0.0, "reward": -0.5})
    live({"step": 2, "clip": 0.0, "reward": 0.5})
    fig = live.figure()
    assert fig.layout.yaxis.rangemode == "nonnegative" and fig.layout.yaxis2.rangemode is None
    assert fig.layout.xaxis.matches == "x2"


def test_live_curves_keep_markers_up_to_markers_up_to_points():
    for n, mode in ((plots.MARKERS_UP_TO, "lines+markers"), (plots.MARKERS_UP_TO + 1, "lines")):
        live = plots.LiveCurves(["loss"], "t", live=False)
        for s in range(1, n + 1):
            live({"step": s, "loss": 1.0})
        assert live.figure().data[0].mode == mode, n


def test_the_live_widget_numbers_records_without_a_step_as_the_static_figure_does(monkeypatch):
    monkeypatch.setattr(plots, "LIVE_REDRAW_S", 0.0)  # every record at once
    monkeypatch.setattr(plots, "LIVE_COST_SHARE", float("inf"))
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
    # the docstring's thousands separated and missing values blank
    html = plots.legible(pd.DataFrame({"v": [1234567.891, float("nan")]})).to_html()
    assert ">1,234,567.891<" in html and "nan" not in html.lower()
