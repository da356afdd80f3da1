"""What notebook 05's live training curves cost the training kernel, batched (the library's
LiveCurves) against an update on every step (LIVE_REDRAW_S 0), in a real kernel whose FigureWidget
sends each update as a comm message, as in JupyterLab (no browser: its redraws come on top).

    python benchmarks/bench_live_curves.py [--steps 6000] [--pace 0.01]

--pace: seconds each simulated training step sleeps (SFT on the cpu profile: about 0.11). Prints, per
variant, the seconds spent inside LiveCurves after 1,000, 3,000 and 6,000 steps and the points the
live plot holds at the end (the rest arrive with finish()).
"""

from __future__ import annotations

import argparse
import json

import nbformat
from nbclient import NotebookClient

CELL = """import json, time
from rookworld_lib.lab import plots
plots.widget_frontend = lambda: True  # a FigureWidget whose updates go out as comm messages, as in JupyterLab
if {every_step}:
    plots.LIVE_REDRAW_S, plots.LIVE_COST_SHARE = 0.0, float("inf")
live = plots.LiveCurves(["loss", "eval/loss"], "SFT")
assert live.widget is not None
inside, marks = 0.0, {{}}
for s in range(1, {steps} + 1):
    time.sleep({pace})  # a training step
    t = time.perf_counter()
    live({{"step": s, "loss": 1.0 / s, "eval/loss": 2.0 / s if s % 300 == 0 else None}})
    inside += time.perf_counter() - t
    if s in (1000, 3000, 6000, {steps}):
        marks[s] = round(inside, 2)
print(json.dumps({{"seconds_inside_after_steps": marks, "points_shown": len(live.widget.data[0].x)}}))
"""


def run(steps: int, pace: float, every_step: bool) -> dict:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CELL.format(steps=steps, pace=pace,
                                                                               every_step=every_step))])
    NotebookClient(nb, timeout=3600, kernel_name="rookworld").execute()
    return json.loads(next(o["text"] for o in nb.cells[0].outputs if o.get("name") == "stdout"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--pace", type=float, default=0.01)
    args = ap.parse_args()
    for name, every_step in (("batched (LiveCurves)", False), ("every step", True)):
        print(f"{name}: {run(args.steps, args.pace, every_step)}", flush=True)


if __name__ == "__main__":
    main()
