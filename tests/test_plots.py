import json

import plotly.graph_objects as go
import plotly.io as pio
import pytest

from rookworld_lib import plots


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
