import json
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import torch

from rookworld_lib.lab import pipeline
from rookworld_lib.lab.places import NOTEBOOKS_DIR


def write_notebook(path, parameters: str, *bodies: str):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(parameters)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, *map(nbformat.v4.new_code_cell, bodies)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


def test_declared_parameters_of_the_shipped_notebooks():
    declared = {nb.name[:2]: pipeline.declared_parameters(nb) for nb in pipeline.numbered_notebooks()}
    assert set(declared) == {"00", "01", "02", "03", "04", "05", "06"}
    # every notebook can be pointed at the run's figures folder
    assert all("figures_dir" in names for names in declared.values())
    # comments with quotes and parentheses must not hide a parameter (papermill's inspector drops these)
    assert {"profile", "device", "run_dir", "sft_steps", "grpo_steps"} <= declared["05"]
    assert {"profile", "preset", "device"} <= declared["02"]


def test_papermill_reads_every_declared_parameter():
    # papermill parses the parameters cell itself when it injects values; a line it cannot parse
    # prints "Unable to parse line" and "Passed unknown parameter" on every headless run.
    from papermill.translators import PythonTranslator

    for path in pipeline.numbered_notebooks():
        nb = nbformat.read(str(path), as_version=4)
        cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        seen = {p.name for p in PythonTranslator.inspect(cell)}
        assert pipeline.declared_parameters(path) <= seen, (path.name, pipeline.declared_parameters(path) - seen)


def test_declared_parameters_are_the_names_papermill_reads_and_only_nn_notebooks_run(tmp_path):
    """A parameters cell's names, read with Python's parser, are the ones papermill's own inspector reads
    (a leading underscore, an annotation, a comment with quotes); the run takes NN_name.ipynb files only."""
    from papermill.translators import PythonTranslator

    cell = 'steps = 3  # "quoted" (and parenthesised)\n_seed = 0\nlr: float = 1e-3\nprofile = "ci"\n'
    write_notebook(tmp_path / "00_first.ipynb", cell)
    nb = nbformat.read(str(tmp_path / "00_first.ipynb"), as_version=4)
    seen = {p.name for p in PythonTranslator.inspect(nb.cells[0])}
    assert pipeline.declared_parameters(tmp_path / "00_first.ipynb") == seen == {"steps", "_seed", "lr", "profile"}
    for name in ("05_x.ipynb", "1_short.ipynb", "2024-notes.ipynb", "Untitled.ipynb", "10_later.ipynb"):
        (tmp_path / name).write_text("{}")
    assert [p.name for p in pipeline.numbered_notebooks(tmp_path)] == ["00_first.ipynb", "05_x.ipynb", "10_later.ipynb"]


def test_run_passes_declared_parameters_and_collects_the_report(tmp_path):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    write_notebook(nbs / "00_first.ipynb",
                   'profile = "ci"  # "ci" or "cpu" (see the docs)\nrun_dir = None  # where it goes (None = nowhere)\n'
                   'figures_dir = "x"',
                   'from pathlib import Path\nassert profile == "cpu", profile\n'
                   'Path(run_dir, "report_first.md").write_text("## first fragment\\n")')
    write_notebook(nbs / "01_second.ipynb", "steps = 1  # (int)", "assert steps == 3, steps")
    run_dir = pipeline.run_pipeline("cpu", tmp_path / "runs", extra_parameters={"steps": 3}, notebooks_dir=nbs)
    record = json.loads((run_dir / "run.json").read_text())
    assert [n["status"] for n in record["notebooks"]] == ["ok", "ok"]
    assert record["notebooks"][0]["parameters"] == {"profile": "cpu", "run_dir": str(run_dir),
                                                    "figures_dir": str(run_dir / "figures")}
    assert record["notebooks"][1]["parameters"] == {"steps": 3}
    report = (run_dir / "report.md").read_text()
    assert "## first fragment" in report and "| 01_second.ipynb | ok |" in report


def test_failed_notebook_stops_the_run_and_says_so_in_the_report(tmp_path):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    write_notebook(nbs / "00_bad.ipynb", "x = 1", "raise ValueError('planted failure')")
    write_notebook(nbs / "01_never.ipynb", "x = 1", "pass")
    with pytest.raises(RuntimeError, match="00_bad.ipynb: .*planted failure") as info:
        pipeline.run_pipeline("cpu", tmp_path / "runs", notebooks_dir=nbs)
    run_dir = next((tmp_path / "runs").iterdir())
    assert str(run_dir) in str(info.value)
    report = (run_dir / "report.md").read_text()
    assert "**FAILED**" in report and "01_never" not in report
    assert [(r["notebook"], r["status"]) for r in json.loads((run_dir / "run.json").read_text())["notebooks"]] == [
        ("00_bad.ipynb", "failed")]


def test_an_interrupted_run_writes_its_report_of_what_ran_and_stops(tmp_path, monkeypatch, capsys):
    """Ctrl-C while a notebook runs: run.json and report.md say which notebooks ran and which was
    interrupted, then the KeyboardInterrupt goes on (the command's exit 130)."""
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    for name in ("00_done", "01_stopped", "02_never"):
        write_notebook(nbs / f"{name}.ipynb", "x = 1", "pass")
    real = pipeline.execute

    def execute(nb, out, params, run_dir):
        if nb.name == "01_stopped.ipynb":
            raise KeyboardInterrupt
        real(nb, out, params, run_dir)
    monkeypatch.setattr(pipeline, "execute", execute)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_pipeline("cpu", tmp_path / "runs", notebooks_dir=nbs)
    run_dir = next((tmp_path / "runs").iterdir())
    statuses = [n["status"] for n in json.loads((run_dir / "run.json").read_text())["notebooks"]]
    assert statuses == ["ok", "interrupted"]
    assert "**INTERRUPTED**: 01_stopped.ipynb: interrupted (Ctrl-C)" in (run_dir / "report.md").read_text()
    assert f"interrupted in 01_stopped.ipynb; what ran: {run_dir / 'report.md'}" in capsys.readouterr().err


def test_a_parameter_value_is_json_none_as_the_cells_spell_it_and_a_relative_path_the_users(tmp_path, monkeypatch):
    """`-p device None` is None (the parameter cells' spelling; it used to pass as the text 'None' and fail
    in the kernel, or name a file 'None'), and a relative path of a path parameter is taken from the
    working directory, as --out is (the kernels run in the notebooks folder)."""
    monkeypatch.chdir(tmp_path)
    assert pipeline.parameter_value("device", "None") is None and pipeline.parameter_value("device", "null") is None
    assert pipeline.parameter_value("profile", "cpu") == "cpu" and pipeline.parameter_value("sft_steps", "5") == 5
    assert pipeline.parameter_value("init_from", "runs/x/final") == str(tmp_path / "runs/x/final")
    assert pipeline.parameter_value("model_dir", "/abs/m") == "/abs/m"
    assert pipeline.parameter_value("data_dir", "") == ""  # empty: the shipped data set
    assert pipeline.parameter_value("seed", "3") == 3 and pipeline.parameter_value("profile", "runs") == "runs"


def test_unknown_parameter_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"\['no_such_parameter'\] are declared by none"):
        pipeline.run_pipeline("cpu", tmp_path / "runs", extra_parameters={"no_such_parameter": 1},
                              notebooks_dir=NOTEBOOKS_DIR)


def test_the_allowed_names_leave_out_what_the_run_sets_itself(tmp_path):
    """The list named figures_dir (always refused) and run_dir (refused where notebook 05 trains)."""
    with pytest.raises(ValueError, match=r"\['stepz'\] .*; allowed: (?!.*figures_dir)(?!.*run_dir).*sft_steps"):
        pipeline.run_pipeline("cpu", tmp_path / "runs", only=["05"], extra_parameters={"stepz": 1})
    with pytest.raises(ValueError, match=r"allowed: (?!.*figures_dir).*run_dir"):  # 06 alone may explore another run
        pipeline.run_pipeline("cpu", tmp_path / "runs", only=["06"], extra_parameters={"stepz": 1})


def test_notebook_06_alone_explores_the_newest_run_under_out_not_the_new_empty_folder(tmp_path):
    """`rookworld run --only 06` passed the run's own new folder as run_dir, where no model is: 06
    explored a random-init model and said ok."""
    nbs, out = tmp_path / "nbs", tmp_path / "runs"
    nbs.mkdir()
    write_notebook(nbs / "06_explore.ipynb", "run_dir = None\nfigures_dir = 'x'",
                   "from pathlib import Path\nPath(figures_dir, 'explored.txt').write_text(str(run_dir))")
    for stamp in ("20260101-000000", "20260102-000000"):
        (out / stamp / "training" / "final").mkdir(parents=True)
        (out / stamp / "training" / "final" / "config.json").write_text("{}")
        time.sleep(0.02)  # newest by time
    run_dir = pipeline.run_pipeline("cpu", out, notebooks_dir=nbs)
    assert (run_dir / "figures" / "explored.txt").read_text() == str(out / "20260102-000000")
    assert json.loads((run_dir / "run.json").read_text())["notebooks"][0]["parameters"]["run_dir"] == str(
        out / "20260102-000000")


def test_notebook_06_alone_with_no_model_under_out_looks_no_further_than_out(tmp_path, monkeypatch):
    """Where no run under --out has exported a model, 06 was passed run_dir None and took the newest run
    under runs/ (ROOKWORLD_RUNS_DIR), a folder outside --out; it is now told where to look (runs_root),
    and its own fallback finds no model there."""
    from rookworld_lib.lab import explore

    elsewhere, out = tmp_path / "elsewhere", tmp_path / "out"
    (elsewhere / "20260101-000000" / "training" / "final").mkdir(parents=True)
    (elsewhere / "20260101-000000" / "training" / "final" / "config.json").write_text("{}")
    monkeypatch.setattr(explore, "RUNS_DIR", elsewhere)
    seen = {}
    monkeypatch.setattr(pipeline, "execute", lambda nb, o, params, run_dir: seen.update(params))
    pipeline.run_pipeline("cpu", out, only=["06"])
    assert seen["run_dir"] is None and seen["runs_root"] == str(out.resolve())
    explored = {**seen, "explore": explore}
    exec("root = runs_root or explore.RUNS_DIR\nrun = run_dir or explore.latest_run(root)", explored)  # 06's cell
    assert explored["run"] is None and explore.latest_run(explore.RUNS_DIR) == elsewhere / "20260101-000000"


def test_a_failed_notebook_is_named_by_its_exception_and_the_first_line_of_its_message(tmp_path):
    """An assert whose message is a printed table was reported by the table's last line
    (`Name: prompt_tokens, dtype: float64`)."""
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    write_notebook(nbs / "01_tokens.ipynb", "x = 1", "assert x == 2, 'median off\\ncount 5\\nName: p, dtype: float64'")
    with pytest.raises(RuntimeError, match=r"01_tokens.ipynb: AssertionError: median off \(cell \[2\]\) \(kernel log"):
        pipeline.run_pipeline("cpu", tmp_path / "runs", notebooks_dir=nbs)


def test_a_kernel_that_dies_is_said_once_by_the_runs_line(tmp_path):
    """nbclient logged "Kernel died while waiting for execute reply." beside the run's own line (after a
    Ctrl-C too, where the kernel was stopped, not dead)."""
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    write_notebook(nbs / "00_dies.ipynb", "x = 1", "import os\nos._exit(1)")
    with pytest.raises(RuntimeError, match=r"00_dies.ipynb: DeadKernelError: Kernel died"):
        pipeline.run_pipeline("cpu", tmp_path / "runs", notebooks_dir=nbs)
    # the line nbclient logs when the kernel goes mid-reply (as after a Ctrl-C, when jupyter stops it) is dropped
    import logging
    died = logging.LogRecord("papermill", logging.ERROR, __file__, 1, "Kernel died while waiting for execute reply.",
                             None, None)
    other = logging.LogRecord("papermill", logging.ERROR, __file__, 1, "Executing notebook", None, None)
    assert not logging.getLogger("papermill").filter(died) and logging.getLogger("papermill").filter(other)


def test_ctrl_c_while_the_figures_render_keeps_the_report_of_the_finished_notebooks(tmp_path, monkeypatch, capsys):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    write_notebook(nbs / "00_done.ipynb", "x = 1", "pass")

    def interrupted(figures_dir):
        raise KeyboardInterrupt
    monkeypatch.setattr(pipeline, "render_pngs", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_pipeline("cpu", tmp_path / "runs", notebooks_dir=nbs)
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert [n["status"] for n in json.loads((run_dir / "run.json").read_text())["notebooks"]] == ["ok"]
    assert "**INTERRUPTED**: PNG copies of the figures: interrupted (Ctrl-C)" in (run_dir / "report.md").read_text()
    assert "what ran: " in capsys.readouterr().err
    # --resume makes the PNG copies (it said "nothing to resume", after the line told the user to run it)
    rendered = []
    monkeypatch.setattr(pipeline, "render_pngs", lambda figures_dir: rendered.append(figures_dir) or 0)
    assert pipeline.resume_run(run_dir, notebooks_dir=nbs) == run_dir and rendered == [str(run_dir / "figures")]
    assert json.loads((run_dir / "run.json").read_text())["failure"] is None
    assert "INTERRUPTED" not in (run_dir / "report.md").read_text()
    with pytest.raises(ValueError, match="every notebook of that run finished .*; nothing to resume"):
        pipeline.resume_run(run_dir, notebooks_dir=nbs)


def test_resume_keeps_the_finished_notebooks_of_the_plan_in_order_and_one_writer_at_a_time(tmp_path, monkeypatch,
                                                                                            capsys):
    from rookworld_lib.core.paths import RunDirBusyError, run_lock
    from rookworld_lib.lab.cli import main

    nbs = tmp_path / "nbs"
    nbs.mkdir()
    for name in ("00_a", "01_b", "02_c"):
        write_notebook(nbs / f"{name}.ipynb", "x = 1", "pass")
    ran, stops = [], [KeyboardInterrupt]

    def execute(nb, out, params, run_dir):
        ran.append(nb.name[:4])
        if nb.name == "02_c.ipynb" and stops:
            raise stops.pop()
    monkeypatch.setattr(pipeline, "execute", execute)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_pipeline("cpu", tmp_path / "runs", notebooks_dir=nbs)
    (run_dir,) = (tmp_path / "runs").iterdir()
    write_notebook(nbs / "01_a.ipynb", "x = 1", "pass")  # a notebook added between the finished ones
    with run_lock(run_dir), pytest.raises(RunDirBusyError):  # a resume of a run still going: refused
        pipeline.resume_run(run_dir, notebooks_dir=nbs)
    ran.clear()
    monkeypatch.setattr(pipeline, "git_commit", lambda: "later")  # the resume's commit: recorded beside, not over
    pipeline.resume_run(run_dir, notebooks_dir=nbs)
    assert ran == ["01_a", "01_b", "02_c"]  # 00_a stays; 01_b finished, but after a notebook that had not run
    record = json.loads((run_dir / "run.json").read_text())
    assert [n["notebook"] for n in record["notebooks"]] == ["00_a.ipynb", "01_a.ipynb", "01_b.ipynb", "02_c.ipynb"]
    assert record["meta"]["git_commit"] != "later" and record["meta"]["resumed"][0].endswith("(commit later)")
    # --resume takes the run's settings: other options are refused in one line (exit 1); an abbreviated one is no
    # option at all (argparse's usage error, exit 2)
    capsys.readouterr()
    for extra, flag in ((["-p", "seed", "1"], "-p"), (["--profile", "ci"], "--profile"), (["--only", "00"], "--only")):
        assert main(["run", "--resume", str(run_dir), *extra]) == 1
        assert capsys.readouterr().err == f"rookworld run: error: --resume takes the run's own settings (its run.json); drop {flag}\n"
    with pytest.raises(SystemExit) as stop:
        main(["run", "--resume", str(run_dir), "--prof", "ci"])
    assert stop.value.code == 2 and "unrecognized arguments: --prof ci" in capsys.readouterr().err


def test_the_sigterm_handler_is_put_back_and_a_run_from_another_thread_works(tmp_path, monkeypatch):
    import signal
    import threading

    nbs = tmp_path / "nbs"
    nbs.mkdir()
    write_notebook(nbs / "00_a.ipynb", "x = 1", "pass")
    monkeypatch.setattr(pipeline, "execute", lambda *a: None)
    monkeypatch.setattr(pipeline, "NOTEBOOKS_DIR", nbs)
    monkeypatch.setattr(pipeline, "run_pipeline",
                        lambda *a, **k: pipeline._execute(pipeline.plan_run(*a, notebooks_dir=nbs),
                                                          pipeline.new_run_dir(tmp_path / "r"), {}))
    before = signal.getsignal(signal.SIGTERM)
    assert pipeline.cli(["--profile", "cpu"]) == 0 and signal.getsignal(signal.SIGTERM) is before
    codes = []
    thread = threading.Thread(target=lambda: codes.append(pipeline.cli(["--profile", "cpu"])))
    thread.start()
    thread.join()
    assert codes == [0]  # "signal only works in main thread" before


def test_a_refused_run_leaves_no_run_directory(tmp_path):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    write_notebook(nbs / "00_first.ipynb", "steps = 1\nseed = 0", "pass")
    from rookworld_lib.lab.parameters import ParameterError

    with pytest.raises(ParameterError, match=r"\['stepz'\] are declared by none .*; allowed: seed, steps"):
        pipeline.run_pipeline("cpu", tmp_path / "runs", extra_parameters={"stepz": 5}, notebooks_dir=nbs)
    with pytest.raises(ValueError, match=r"no notebooks selected .* by --only 99 \(available: 00_first.ipynb\)"):
        pipeline.run_pipeline("cpu", tmp_path / "runs", only=["99"], notebooks_dir=nbs)
    assert not (tmp_path / "runs").exists()


def test_the_terminal_shows_a_line_per_notebook_and_the_progress_lines_nothing_else(tmp_path, capfd):
    # a loop with the library's bar, a stage line, and what C code writes to the kernel process's
    # stderr (the line PyTorch's profiler prints at every profile in notebook 04)
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    write_notebook(nbs / "00_loop.ipynb", "steps = 8",
                   "import os\nos.write(2, b'USDT:2026-11-25 10:13:27 1:1 SyncActivityProfilerHandler.cpp:52] profiler_start\\n')",
                   "from rookworld_lib.core import progress\nprogress.report('stage: SFT')\n"
                   "with progress.tqdm(total=steps, desc='SFT') as bar:\n    for _ in range(steps):\n        bar.update(1)")
    write_notebook(nbs / "01_next.ipynb", "steps = 1", "from rookworld_lib.core import progress\nprogress.report('stage: GRPO')")
    run_dir = pipeline.run_pipeline("cpu", tmp_path / "runs", notebooks_dir=nbs)
    out, err = capfd.readouterr()
    lines = out.splitlines()
    assert lines[0] == f"rookworld run (cpu): 2 notebook(s) into {run_dir}"
    assert lines[1] == "  00_loop | stage: SFT"
    assert lines[2].startswith("  00_loop | SFT: 100%") and "8/8" in lines[2]  # a quick loop: its closing line only
    assert lines[3].split()[:2] == ["00_loop.ipynb", "ok"] and lines[3].endswith(" s")
    # the next notebook's own progress lines only (the progress file holds the earlier notebook's too)
    assert lines[4] == "  01_next | stage: GRPO" and lines[5].split()[:2] == ["01_next.ipynb", "ok"] and len(lines) == 6
    assert err == ""  # no kernel log lines (the TCP warning), no profiler lines: they are in the kernel log
    assert "profiler_start" in (run_dir / "logs" / "00_loop.kernel.log").read_text()
    # the executed notebook keeps one line for the loop, not one output per refresh, and no widget
    loop = nbformat.read(str(run_dir / "00_loop.ipynb"), as_version=4).cells[2]
    assert [(o.output_type, o.get("name")) for o in loop.outputs] == [("stream", "stderr")]
    assert loop.outputs[0].text.count("\n") == 1 and "8/8" in loop.outputs[0].text


def test_the_run_renders_its_figures_pngs_once_on_one_browser_after_the_notebooks(tmp_path, monkeypatch, capfd):
    """The kernels save figures without PNGs ($ROOKWORLD_PNG=0, even where the caller's environment
    has none); the run renders them from their JSON afterwards, says so in one line, and the report
    embeds them."""
    from test_plots import chromium_or_skip

    chromium_or_skip()
    monkeypatch.delenv("ROOKWORLD_PNG", raising=False)
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    for i in range(2):
        write_notebook(nbs / f"0{i}_fig.ipynb", 'figures_dir = "x"',
                       "import os\nfrom pathlib import Path\nimport plotly.graph_objects as go\n"
                       "from rookworld_lib.lab.plots import save_figure\n"
                       "assert os.environ['ROOKWORLD_PNG'] == '0'\n"
                       f"save_figure(go.Figure(go.Bar(y=[1, 2])).update_layout(width=300, height=200), 'f{i}', figures_dir)\n"
                       f"assert not Path(figures_dir, 'f{i}.png').exists()")
    run_dir = pipeline.run_pipeline("cpu", tmp_path / "runs", notebooks_dir=nbs)
    lines = capfd.readouterr().out.splitlines()
    assert lines[3].startswith("PNG copies of 2 figures ") and lines[3].endswith(" s") and len(lines) == 4
    for i in range(2):
        head = (run_dir / "figures" / f"f{i}.png").read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(head[16:20], "big") == 300
        assert f"![f{i}](figures/f{i}.png)" in (run_dir / "report.md").read_text()


def test_headless_bar_reports_every_30_s_and_one_closing_line(tmp_path, monkeypatch, capsys):
    """A headless bar reports when 30 s have passed since its last report (not at 29.5 s) and once at close;
    the bar itself writes nowhere, even given a file, and stderr gets the closing line only. LineTqdm also
    prints its lines on stderr; a disabled bar says nothing."""
    import io

    from rookworld_lib.core import progress

    clock = [0.0]  # each step "takes" 10 s: a report after the 3rd, 6th and 9th, then the closing line
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    log = tmp_path / "progress.log"
    monkeypatch.setenv(progress.PROGRESS_ENV, str(log))
    given = io.StringIO()
    with progress.HeadlessTqdm(total=10, desc="GRPO", file=given) as bar:
        for _ in range(10):
            clock[0] += 10.0
            bar.update(1)
    reported = log.read_text().splitlines()
    assert [line.split("|")[-1].split()[0] for line in reported] == ["3/10", "6/10", "9/10", "10/10"]
    assert capsys.readouterr().err == reported[-1] + "\n"  # stderr (the saved notebook): the closing line only
    assert given.getvalue() == ""
    with progress.HeadlessTqdm(total=10, desc="quick") as bar:
        bar.update(10)
    assert [line.split("|")[-1].split()[0] for line in log.read_text().splitlines()[4:]] == ["10/10"]
    assert not progress.widget_frontend() and not progress.headless_kernel()  # plain Python: no kernel
    log.unlink()
    capsys.readouterr()
    with progress.HeadlessTqdm(total=10, desc="steps") as bar:
        for step in (0.0, 29.5, 0.5, 29.5, 0.5):  # reports after the 3rd update (30 s) and the 5th (30 s later)
            clock[0] += step
            bar.update(1)
    lines = log.read_text().splitlines()
    assert [line.split("|")[0].split()[-1] for line in lines] == ["30%", "50%", "50%"], lines
    assert capsys.readouterr().err.splitlines() == [lines[-1]]
    log.unlink()
    line_bar = progress.LineTqdm(total=4, desc="piped")
    clock[0] += 30.0
    line_bar.update(2)
    # one line, formatted once: the same rate and ETA in the file and on stderr
    formatted, format_meter = [], progress.LineTqdm.format_meter
    monkeypatch.setattr(progress.LineTqdm, "format_meter",
                        staticmethod(lambda *a, **k: formatted.append(1) or format_meter(*a, **k)))
    clock[0] += 30.0
    line_bar.update(1)
    piped = capsys.readouterr().err.splitlines()
    assert [line.split(" [")[0] for line in piped] == ["piped:  50%|█████     | 2/4", "piped:  75%|███████▌  | 3/4"]
    assert log.read_text().splitlines() == piped and len(formatted) == 1
    line_bar.close()
    log.unlink()
    capsys.readouterr()
    progress.HeadlessTqdm(total=3, disable=True).close()
    assert not log.exists() and capsys.readouterr().err == ""


def test_report_appends_one_line_per_call_and_nothing_outside_a_run(tmp_path, monkeypatch):
    """report() appends each line once with one newline (a trailing one is not doubled); without
    $ROOKWORLD_PROGRESS it writes nothing."""
    from rookworld_lib.core import progress

    log = tmp_path / "progress.log"
    monkeypatch.setenv(progress.PROGRESS_ENV, str(log))
    progress.report("a\n")
    progress.report("b")
    assert log.read_text() == "a\nb\n"
    monkeypatch.delenv(progress.PROGRESS_ENV)
    progress.report("c")
    assert log.read_text() == "a\nb\n"


def test_which_bar_a_kernel_a_frontend_and_a_pipe_get(monkeypatch):
    """A Jupyter kernel (ZMQInteractiveShell) with JPY_SESSION_NAME or VSCODE_PID set is watched by a widget
    frontend, one with neither is headless; a terminal IPython is no kernel. Outside a kernel, stderr that is
    not a terminal gets a LineTqdm and a terminal tqdm's own bar."""
    import sys
    import types

    from rookworld_lib.core import progress

    class ZMQInteractiveShell:
        pass

    class TerminalInteractiveShell:
        pass

    class FakeStderr:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

        def write(self, s):
            return len(s)

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stderr", FakeStderr(False))
    assert type(progress.tqdm(total=1, disable=True)) is progress.LineTqdm
    monkeypatch.setattr(sys, "stderr", FakeStderr(True))
    assert not isinstance(progress.tqdm(total=1, disable=True), progress.HeadlessTqdm)
    monkeypatch.undo()
    for k in progress.FRONTEND_ENV:
        monkeypatch.delenv(k, raising=False)
    shell = [ZMQInteractiveShell()]
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: shell[0]))
    assert progress.headless_kernel() and not progress.widget_frontend()
    monkeypatch.setenv("JPY_SESSION_NAME", "05.ipynb")
    assert progress.widget_frontend() and not progress.headless_kernel()
    monkeypatch.delenv("JPY_SESSION_NAME")
    monkeypatch.setenv("VSCODE_PID", "1")
    assert progress.widget_frontend()
    shell[0] = TerminalInteractiveShell()
    assert not progress.widget_frontend() and not progress.headless_kernel()


def test_the_progress_module_imports_no_widgets_and_nothing_of_the_lab():
    code = ("import sys, rookworld_lib.core.progress; "
            "print([m for m in ('IPython', 'ipywidgets', 'tqdm.notebook', 'rookworld_lib.lab') if m in sys.modules])")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


@pytest.mark.parametrize("profile, extra", [("ci", {}), ("cpu", {"profile": "ci"})])
def test_every_profile_of_notebook_05_runs_and_the_report_names_it_throughout(tmp_path, profile, extra):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    write_notebook(nbs / "05_train.ipynb", 'profile = "cpu"  # which\nrun_dir = None  # where',
                   'from pathlib import Path\nassert profile == "ci", profile\n'
                   'Path(run_dir, "report_05.md").write_text(f"profile {profile}\\n")')
    run_dir = pipeline.run_pipeline(profile, tmp_path / "runs", extra_parameters=extra, notebooks_dir=nbs)
    report, meta = (run_dir / "report.md").read_text(), json.loads((run_dir / "run.json").read_text())["meta"]
    assert "profile `ci`" in report and "profile ci" in report and "profile `cpu`" not in report
    assert meta["profile"] == "ci"


def test_a_kernel_that_lingers_after_its_last_cell_costs_the_run_seconds_not_half_a_minute(tmp_path):
    """ipykernel 7 can hang on its way out after a shutdown request (its control thread flushes on an
    IOPub thread already stopped: 10 s a flush). A kernel whose cells all ran has nothing to save, so
    it gets jupyter's 5 s (SIGTERM at 2.5 s), not the 60 s a kernel stopped inside a cell gets to end
    its training step (test_faults_run's SIGTERM test). A thread that keeps the kernel process alive
    stands in for the hang here; before, each such notebook cost the run 30 s."""
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    write_notebook(nbs / "00_linger.ipynb", "x = 1", "import threading, time\n"
                   "threading.Thread(target=time.sleep, args=(120,), daemon=False).start()")
    write_notebook(nbs / "01_next.ipynb", "x = 1", "pass")
    start = time.monotonic()
    run_dir = pipeline.run_pipeline("cpu", tmp_path / "runs", notebooks_dir=nbs)
    took = time.monotonic() - start
    record = json.loads((run_dir / "run.json").read_text())
    assert [(n["notebook"], n["status"]) for n in record["notebooks"]] == [("00_linger.ipynb", "ok"), ("01_next.ipynb", "ok")]
    assert took < 20, f"the run took {took:.1f} s: a lingering kernel was waited for {pipeline.KERNEL_STOP_WAIT_S / 2:.0f} s"
    assert pipeline.NotebookKernelManager.shutdown_wait_time.default_value < 10 < pipeline.KERNEL_STOP_WAIT_S


def test_the_command_accepts_every_profile_notebook_05_knows(capsys):
    from rookworld_lib.lab import workflow
    from rookworld_lib.lab.cli import main

    assert set(pipeline.PROFILES) == set(workflow.PROFILES)
    assert main(["run", "--profile", "ci", "--only", "99"]) == 1  # parsed; refused only for selecting nothing
    assert "no notebooks selected" in capsys.readouterr().err
    # --help lists each profile's sizes and the -p names of each notebook (a user found them by mistyping one)
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    cpu = workflow.PROFILES["cpu"]
    assert f"  cpu: data shipped set\n    SFT cpu-small on cpu, {cpu.sft.max_steps} steps" in text
    for nb in pipeline.numbered_notebooks():
        line = next(x for x in text.splitlines() if x.startswith(f"  {nb.stem}: "))
        named = set(line.split(": ", 1)[1].split(", "))
        assert named == pipeline.declared_parameters(nb) - {"figures_dir"} - ({"run_dir"} if nb.name.startswith("05") else set())


def test_a_bar_off_a_terminal_is_lines_not_carriage_returns():
    """stderr to a pipe or a log file (CI, `> log 2>&1`): no redraws garbling the file, one line at the
    end (and one every REPORT_EVERY_S); in a terminal tqdm's own bar."""
    code = "from rookworld_lib.core.progress import tqdm\nfor _ in tqdm(range(5), desc='convert'): pass"
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert "\r" not in err and err.count("\n") == 1 and err.startswith("convert: 100%") and "5/5" in err


def test_a_long_bar_off_a_terminal_adds_a_line_every_report_interval_to_stderr_and_the_run(monkeypatch, capsys, tmp_path):
    """Every REPORT_EVERY_S a bar off a terminal prints its state as one line, and under `rookworld run`
    (ROOKWORLD_PROGRESS names the run's progress file) appends it there too; with the interval at 0,
    every update does: 1/3, 2/3, 3/3, then the closing line."""
    from rookworld_lib.core import progress

    monkeypatch.setattr(progress, "REPORT_EVERY_S", 0.0)
    monkeypatch.setenv(progress.PROGRESS_ENV, str(tmp_path / "progress.txt"))
    for _ in progress.tqdm(range(3), desc="datagen", mininterval=0, miniters=1):  # tqdm updates from its loop then
        pass
    err = capsys.readouterr().err.splitlines()
    assert [line.split("|")[2].split()[0] for line in err] == ["1/3", "2/3", "3/3", "3/3"], err
    assert all(line.startswith("datagen: ") for line in err)
    assert (tmp_path / "progress.txt").read_text().splitlines() == err


@pytest.mark.parametrize("notebook", pipeline.numbered_notebooks(), ids=lambda p: p.name)
def test_a_run_checks_every_parameter_of_every_notebook_before_it_starts(notebook):
    """`rookworld run` runs each notebook's own checks (the cell after `parameters`) before any notebook
    starts: they accept what every profile of the command passes, and refuse a value of the wrong type
    for every parameter the notebook declares, and NaN for every float one."""
    from rookworld_lib.lab.parameters import ParameterError

    declared = pipeline.declared_parameters(notebook)
    for offered in pipeline.PROFILES.values():
        values = {k: v for k, v in offered.items() if k in declared}
        if str(values.get("device")).startswith("cuda") and not torch.cuda.is_available():
            del values["device"]  # refused on this machine (below; plan_run says so first, naming --profile gpu)
        pipeline.check_parameter_values(notebook, values)
    for name in sorted(declared):
        with pytest.raises(ParameterError, match=f"notebook parameter '{name}' must be"):
            pipeline.check_parameter_values(notebook, {name: object()})
    defaults: dict = {}
    exec(pipeline.parameter_cells(notebook)[0], defaults)
    for name in sorted(k for k in declared if isinstance(defaults[k], float)):  # NaN passes every range test
        with pytest.raises(ParameterError, match=f"notebook parameter '{name}' must be a finite number, got nan"):
            pipeline.check_parameter_values(notebook, {name: float("nan")})
    if "device" in declared:  # a device torch does not know, or that is not here: refused now, not 10 s into a notebook
        with pytest.raises(ParameterError) as info:
            pipeline.check_parameter_values(notebook, {"device": "tpu"})
        assert str(info.value) in ("notebook parameter 'device' must be one of ['cpu', 'cuda'], got 'tpu'",
                                   "device 'tpu' (notebook parameter 'device'): must be 'auto' or a torch device such as "
                                   "'cpu', 'cuda', 'cuda:1', 'mps'")
        if not torch.cuda.is_available():
            with pytest.raises(ParameterError, match=r"\(notebook parameter 'device'\) requested but CUDA is not available"):
                pipeline.check_parameter_values(notebook, {"device": "cuda"})


def test_notebook_04_refuses_a_sequence_longer_than_its_models_context_before_the_run():
    """`-p seq_len 512` on the CPU matrix's models (context 256) was taken, every row but the baseline ran,
    and the notebook stopped on a bare assert; the check cell now refuses it, naming the parameter."""
    from rookworld_lib.lab.parameters import ParameterError

    nb = next(p for p in pipeline.numbered_notebooks() if p.name.startswith("04_"))
    for model in ("tiny", "cpu-small", "cpu-medium"):
        pipeline.check_parameter_values(nb, {"model": model, "seq_len": 256})
        with pytest.raises(ParameterError, match="notebook parameter 'seq_len' must be <= 256, got 512"):
            pipeline.check_parameter_values(nb, {"model": model, "seq_len": 512})
    pipeline.check_parameter_values(nb, {"model": "gpt2", "seq_len": 1024})


def test_the_report_folds_in_every_notebooks_fragment(tmp_path):
    (tmp_path / "report_a.md").write_text("## from notebook A\n")
    (tmp_path / "report_b.md").write_text("## from notebook B\n")
    meta = {"started": "20261129-000000", "profile": "cpu", "git_commit": "x", "torch": "t", "python": "3", "device": "cpu"}
    pipeline.write_report(tmp_path, meta, [{"notebook": "01_a.ipynb", "status": "ok", "seconds": 1.0}], None)
    text = (tmp_path / "report.md").read_text()
    assert "## from notebook A" in text and "## from notebook B" in text


def test_p_run_dir_is_refused_where_notebook_05_trains_and_allowed_for_06_alone():
    from pathlib import Path

    from rookworld_lib.lab.parameters import ParameterError

    pipeline.check_run_folders({"run_dir": "elsewhere"}, [Path("06_lab.ipynb")])  # 06 alone explores another run
    for notebooks in ([Path("05_full_training.ipynb")], [Path("04_mfu_tuning.ipynb"), Path("05_full_training.ipynb")]):
        with pytest.raises(ParameterError, match=r"-p run_dir: notebook 05 trains into the run folder"):
            pipeline.check_run_folders({"run_dir": "elsewhere"}, notebooks)
    pipeline.check_run_folders({}, [Path("05_full_training.ipynb")])


def _nb(prefix: str):
    return next(p for p in pipeline.numbered_notebooks() if p.name.startswith(prefix))


@pytest.mark.parametrize("prefix, values, message", [
    # the largest the shipped val split holds: 265 black-to-move P: positions, 545 A: records (random.sample failed)
    ("00", {"n_audit": 531}, "notebook parameter 'n_audit' must be <= 530, got 531"),
    ("00", {"n_reward_positions": 546}, "notebook parameter 'n_reward_positions' must be <= 545, got 546"),
    ("00", {"data_dir": "/no/such/data"}, "notebook parameter 'data_dir' must name an existing folder"),
    # section 3's ratios 0.5 and 1.5 fell inside the clip range (a bare AssertionError)
    ("03", {"clip_eps": 0.5}, "notebook parameter 'clip_eps' must be <= 0.45, got 0.5"),
    # section 9's first-order claim failed for larger steps and groups (a bare AssertionError)
    ("03", {"sgd_lr": 2.0}, "notebook parameter 'sgd_lr' must be <= 0.5, got 2.0"),
    ("03", {"group_size": 48}, "notebook parameter 'group_size' must be <= 16, got 48"),
    ("02", {"seq_len": 300}, "notebook parameter 'seq_len' must be <= 256, got 300"),  # cpu-small's context
    ("04", {"tolerance": 0.0}, "notebook parameter 'tolerance' must be >= 0.0001, got 0.0"),
    ("04", {"tolerance": 100.0}, "notebook parameter 'tolerance' must be <= 1.0, got 100.0"),
    ("05", {"sft_steps": 1}, "notebook parameter 'sft_steps' must be >= 2, got 1"),
    ("05", {"sft_steps": 500, "init_from": "/"}, "notebook parameter 'sft_steps' has no effect with init_from: GRPO "
                                                 "starts from that model, no SFT runs; leave it out, got 500"),
    ("06", {"model_dir": "/no/such/model"}, "notebook parameter 'model_dir' must name an existing folder")])
def test_a_run_refuses_before_it_starts_values_a_notebook_could_not_keep(prefix, values, message):
    """Values inside the old ranges that failed deep in a notebook (found running each with non-default values)."""
    from rookworld_lib.lab.parameters import ParameterError

    with pytest.raises(ParameterError, match=re.escape(message)):
        pipeline.check_parameter_values(_nb(prefix), values)


def test_the_largest_allowed_values_pass_the_checks():
    pipeline.check_parameter_values(_nb("00"), {"n_audit": 530, "n_reward_positions": 545})
    pipeline.check_parameter_values(_nb("03"), {"clip_eps": 0.45, "sgd_lr": 0.5, "group_size": 16})
    pipeline.check_parameter_values(_nb("05"), {"sft_steps": 2})
    pipeline.check_parameter_values(_nb("05"), {"init_from": "/"})


def test_notebook_06_explores_the_newest_run_under_runs_root_and_none_for_a_model_alone(tmp_path, monkeypatch):
    """`-p runs_root DIR` was overridden by the newest run under --out, and a relative one failed in the
    kernel (it runs in notebooks/); `-p model_dir` alone took another run's GRPO settings and completions."""
    assert "runs_root" in pipeline.PATH_PARAMETERS
    monkeypatch.chdir(tmp_path)
    assert pipeline.parameter_value("runs_root", "mine") == str(tmp_path / "mine")
    monkeypatch.setattr(pipeline.explore, "latest_run", lambda root: Path(root) / "newest")

    def plan(trains=False, notebooks=("06",), **given):
        return {"notebooks": [_nb(n) for n in notebooks], "trains": trains, "out_root": tmp_path / "out",
                "args": {"parameters": given}}

    assert pipeline.run_to_explore(plan()) == {"run_dir": str(tmp_path / "out" / "newest")}
    assert pipeline.run_to_explore(plan(runs_root=str(tmp_path / "mine"))) == {"run_dir": str(tmp_path / "mine" / "newest")}
    assert pipeline.run_to_explore(plan(model_dir=str(tmp_path / "m"))) == {"run_dir": None}
    assert pipeline.run_to_explore(plan(run_dir=str(tmp_path / "r"))) == {}  # -p run_dir is passed as given
    assert pipeline.run_to_explore(plan(trains=True, notebooks=("05", "06"))) == {}  # this run's own
