"""Issue 29, item 2: every figure's legend tells the truth about its traces.

Each figure the library draws is resolved by plotly.js itself (kaleido's `calc_fig_sync`, JSON format:
the full figure with every default filled in, the colours the browser paints), and every legend
entry (a legendgroup, else a trace name) must have one colour across all of its traces: a series
drawn in two panels, or with its trend line, in the colour its legend swatch shows. Axes of counts
(batch size, sequence length) carry integer ticks.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from rookworld_lib.lab.places import DOCS_DIR
from rookworld_lib.lab import explore, plots, tuning
from rookworld_lib.lab.tuning import MatrixResult, TuneConfig


@pytest.fixture(scope="module")
def resolve():
    kaleido = pytest.importorskip("kaleido")
    try:
        chromium = plots._chromium()
    except RuntimeError as exc:
        pytest.skip(f"no browser to resolve figures: {exc}")
    kaleido.start_sync_server(path=chromium, n=1, mathjax=False, silence_warnings=True)  # a no-op when running
    return lambda fig: json.loads(kaleido.calc_fig_sync(fig, opts={"format": "json"}))


def colour_of(trace: dict) -> str:
    return (trace.get("line") or {}).get("color") or (trace.get("marker") or {}).get("color")


def legend_colours(full: dict) -> dict[str, set]:
    """{legend entry: the colours of its traces}, for traces whose entry the legend shows."""
    groups = defaultdict(set)
    for t in full["data"]:
        groups[t.get("legendgroup") or t.get("name")].add(json.dumps(colour_of(t)))
    shown = {t.get("legendgroup") or t.get("name") for t in full["data"] if t.get("showlegend", True)}
    return {k: v for k, v in groups.items() if k in shown}


def history(n=12):
    return [{"step": i, "reward": 0.1 * i, "rewards/P/mean": 0.05 * i, "kl": 0.01} for i in range(1, n + 1)]


def matrix() -> MatrixResult:
    base = TuneConfig(model="tiny", batch_size=2, seq_len=16)

    def row(name, variable, value, t):
        tokens = (value if variable == "batch_size" else 2) * (value if variable == "seq_len" else 16)
        return {"name": name, "variable": variable, "value": value, "status": "ok", "step_time_s": t,
                "step_time_p10_s": 0.9 * t, "step_time_p90_s": 1.2 * t, "tokens_per_step": tokens,
                "tokens_per_s": tokens / t, "speedup": 1.0, "expect_parity": variable not in ("batch_size", "seq_len"),
                "changes_result": False, "within_noise": True}

    rows = [row("baseline", "baseline", None, 0.01), row("batch_size=1", "batch_size", 1, 0.006),
            row("batch_size=4", "batch_size", 4, 0.018), row("seq_len=8", "seq_len", 8, 0.006),
            row("seq_len=32", "seq_len", 32, 0.02), row("attn_impl=math", "attn_impl", "math", 0.011)]
    return MatrixResult(base, rows, 0.05, {"device": "cpu"}, {}, {})


FIGURES = {
    "03 length bias": lambda: explore.length_bias_figure(5, 40, 4, "dapo"),
    "03 clip regions": lambda: explore.clip_region_figure(0.2, 0.28),
    "05 curves with trends": lambda: plots.curves_figure(history(), ["reward", "rewards/P/mean"], "t", trend=True, smooth=3),
    "05 live curves, panels": lambda: plots.LiveCurves({"reward": ["reward", "rewards/P/mean"], "KL": ["kl"]}, "t",
                                                       live=False)._figure(history()),
    "05 learning curve": lambda: plots.learning_curve_figure(
        {k: v["rows"] for k, v in json.loads((DOCS_DIR / "learning_curve.json").read_text()).items()}),
    "04 scaling": lambda: tuning.scaling_figure(matrix()),
    "04 speed-up": lambda: tuning.speedup_figure(matrix()),
}


@pytest.mark.parametrize("name", FIGURES)
def test_each_legend_entry_has_one_colour_across_its_traces(resolve, name):
    full = resolve(FIGURES[name]())
    mixed = {k: v for k, v in legend_colours(full).items() if len(v) > 1}
    assert not mixed, f"{name}: legend entries whose traces are painted in several colours: {mixed}"


def test_count_axes_have_integer_ticks_and_titles_do_not_share_a_side(resolve):
    layout = resolve(tuning.scaling_figure(matrix()))["layout"]
    xaxes = [layout[k] for k in layout if k.startswith("xaxis")]
    assert all(float(v).is_integer() for a in xaxes for v in a.get("tickvals", ())), "fractional batch or sequence ticks"
    yaxes = [layout[k] for k in layout if k.startswith("yaxis")]
    assert all(a.get("side", "left") == "left" for a in yaxes), "a right-hand y axis: its title overlaps the next panel"
    assert all(a.get("title", {}).get("text") for a in yaxes), "an unlabelled y axis"


def test_axes_fit_what_an_idle_run_draws(resolve):
    """A share that stayed 0 (the clip fraction of the ci profile's steps) spans 0..1, not -1..1; a
    short bar's speed-up is written in its row's label, not in a bar with no room for it."""
    idle = [{"step": i, "kl": 0.0, "clip_ratio/region_mean": 0.0, "reward": -0.1 * i} for i in (1, 2)]
    layout = resolve(plots.LiveCurves({"clip": ["clip_ratio/region_mean"], "reward": ["reward"]}, "t", live=False)
                     ._figure(idle))["layout"]
    assert layout["yaxis"]["range"][0] == 0 and layout["yaxis"]["range"][1] > 0  # the share's panel
    assert layout["yaxis2"]["range"][0] < -0.1  # the negative reward keeps its own range
    bars = tuning.speedup_figure(matrix()).data[0]
    assert list(bars.x) == ["baseline (1.00x)", "attn_impl=math (~1.00x)"] and bars.text is None  # ~: within noise
    key = tuning.speedup_figure(matrix()).layout.title.text
    assert all(f"{c} = " in key for c in ("blue", "grey", "red"))  # every colour the bars use is explained


def test_scaling_figure_draws_the_baseline_run_again_and_says_when_the_host_drifted(resolve):
    """The scaling lines mix rows run minutes apart: the baseline's repeat (run once after all the other rows) is
    drawn at the baseline's x in each panel, and the title says so when the two disagree (drift)."""
    m = matrix()
    base = m.row("baseline")
    steady = MatrixResult(m.baseline, [*m.rows, {**base, "name": "baseline (repeat)", "variable": "baseline-repeat",
                                                 "step_time_s": 0.0101, "tokens_per_s": base["tokens_per_step"] / 0.0101}],
                          0.05, {"device": "cpu"}, {}, {})
    fig = tuning.scaling_figure(steady)
    again = [t for t in fig.data if t.legendgroup == "repeat"]
    assert [(list(t.x), list(t.y)) for t in again] == [([2], [0.0101 * 1e3]), ([2], [base["tokens_per_step"] / 0.0101]),
                                                       ([16], [0.0101 * 1e3]), ([16], [base["tokens_per_step"] / 0.0101])]
    assert steady.drift() is None and "drifted" not in fig.layout.title.text
    slow = {**base, "name": "baseline (repeat)", "variable": "baseline-repeat", "step_time_s": 0.014, "tokens_per_s": 32 / 0.014,
            "step_time_p10_s": 0.0126, "step_time_p90_s": 0.0168, "speedup": 0.71}
    drifted = MatrixResult(m.baseline, [*m.rows, slow], 0.05, {"device": "cpu"}, {}, {})
    assert drifted.drift() and "drifted" in tuning.scaling_figure(drifted).layout.title.text
    assert len(tuning.scaling_figure(m).data) == 4  # no repeat, no marker
    full = resolve(tuning.scaling_figure(drifted))
    assert not {k: v for k, v in legend_colours(full).items() if len(v) > 1}
