"""Issue 28, finding 2: two `rookworld run`s at once.

Each run has a directory of its own, even when both start in the same second (`<stamp>`, then
`<stamp>-2`), and each kernel has its own connection file and IPC sockets, in a private temporary
directory: they used to be `kernel-ipc-N` in the notebooks folder, shared by every run, where two
runs' kernels took each other's sockets ("Invalid Signature", "Kernel didn't respond"). A relative
`--out` is the user's working directory's, not the notebooks folder's (where the kernels run).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
from forked_child import ForkedChild

from rookworld_lib.lab import pipeline
from test_faults import descendants
from test_pipeline import write_notebook

pytestmark = pytest.mark.fault
STAMP = "20260101-000000"

# Each notebook records its kernel's connection (file and socket path) in the run directory, then
# waits until the other run's kernel of the same notebook is up too: both kernels live at once.
WAIT_FOR_THE_OTHER_RUN = '''
import json, os, time
from pathlib import Path
from ipykernel.connect import get_connection_file

connection = {"file": get_connection_file(), "ip": json.loads(Path(get_connection_file()).read_text())["ip"]}
Path(run_dir, f"kernel-{name}.json").write_text(json.dumps(connection))
here = Path(barrier, name)
here.mkdir(parents=True, exist_ok=True)
(here / str(os.getpid())).touch()
deadline = time.monotonic() + 60
while len(list(here.iterdir())) < 2:
    assert time.monotonic() < deadline, "the other run's kernel never started"
    time.sleep(0.1)
'''

# `rookworld run` as a user starts it, with the stand-in notebooks and a clock stopped at STAMP:
# both runs start "in the same second"
RUN = '''
import datetime, functools, sys, types
from pathlib import Path
from rookworld_lib.lab import cli, pipeline

pipeline.dt = types.SimpleNamespace(datetime=types.SimpleNamespace(now=lambda: datetime.datetime(2026, 1, 1)))
pipeline.run_pipeline = functools.partial(pipeline.run_pipeline, notebooks_dir=Path(sys.argv[1]))
sys.exit(cli.main(["run", "--profile", "cpu", "--out", sys.argv[2], "-p", "barrier", sys.argv[3]]))
'''


def _run_main(argv: list[str]) -> None:
    sys.argv = ["-c", *argv]
    exec(RUN, {"__name__": "__main__"})


def stand_in_notebooks(directory: Path) -> list[str]:
    directory.mkdir()
    names = ["00_first.ipynb", "01_second.ipynb"]
    for name in names:
        write_notebook(directory / name, f"run_dir = None\nbarrier = None\nname = {name[:2]!r}",
                       WAIT_FOR_THE_OTHER_RUN, "print('done')")
    return names


def test_two_runs_at_once_in_the_same_second_each_finish_with_their_own_report(tmp_path):
    nbs, out = tmp_path / "notebooks", tmp_path / "runs"
    names = stand_in_notebooks(nbs)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = []
    for cwd in (tmp_path / "a", tmp_path / "b"):  # two users' working directories, one --out: ../runs
        cwd.mkdir()
        # `python -c RUN ...` in a process of its own, forked with the library imported (forked_child.py)
        procs.append(ForkedChild(_run_main, [str(nbs), "../runs", str(tmp_path / "barrier")], env=env, cwd=cwd,
                                 stderr_to_stdout=True))
    outputs = [p.communicate(timeout=240)[0] for p in procs]

    assert [p.returncode for p in procs] == [0, 0], outputs
    run_dirs = sorted(out.iterdir())
    assert [d.name for d in run_dirs] == [STAMP, f"{STAMP}-2"]
    assert sorted(text.splitlines()[-1].split()[3] for text in outputs) == [str(d) for d in run_dirs]
    sockets = set()
    for run_dir in run_dirs:
        record = json.loads((run_dir / "run.json").read_text())
        assert [(n["notebook"], n["status"]) for n in record["notebooks"]] == [(name, "ok") for name in names]
        report = (run_dir / "report.md").read_text()
        assert "FAILED" not in report and all(f"| {name} | ok |" in report for name in names), report
        for name in names:
            kernel = json.loads((run_dir / f"kernel-{name[:2]}.json").read_text())
            ip = Path(kernel["ip"])
            # an absolute path in the kernel's own directory (with its connection file), gone after the run
            assert ip.is_absolute() and ip.parent == Path(kernel["file"]).parent, kernel
            assert nbs not in ip.parents and not ip.parent.exists(), kernel
            sockets.add(ip.parent)
    assert len(sockets) == 4  # one directory per kernel: none shared between runs or notebooks
    assert sorted(p.name for p in nbs.iterdir()) == names  # nothing left in the notebooks folder


def test_a_taken_run_directory_is_never_reused(tmp_path):
    (tmp_path / STAMP).mkdir()
    (tmp_path / STAMP / "report.md").write_text("an earlier run's report\n")
    (tmp_path / f"{STAMP}-2").write_text("a file in the way\n")
    assert pipeline.new_run_dir(tmp_path, STAMP) == tmp_path / f"{STAMP}-3"
    assert (tmp_path / STAMP / "report.md").read_text() == "an earlier run's report\n"
    assert pipeline.new_run_dir(tmp_path / "new", STAMP) == tmp_path / "new" / STAMP


def test_runs_created_at_once_get_distinct_directories(tmp_path):
    made, start = [], threading.Barrier(8)

    def make():
        start.wait()
        made.append(pipeline.new_run_dir(tmp_path, STAMP))

    threads = [threading.Thread(target=make) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(made) == sorted([tmp_path / STAMP] + [tmp_path / f"{STAMP}-{n}" for n in range(2, 9)])


# --- a failed notebook; a distributed worker whose peer failed --------------------------------

def test_a_failed_notebook_ends_rookworld_run_in_one_line_naming_it_and_its_executed_copy(tmp_path, capsys,
                                                                                           monkeypatch):
    """`rookworld run` whose second notebook raises: exit 1 and one error line that names the notebook,
    the cell's error and the run directory, where the executed copy (with the traceback in its
    outputs) and the report are; the run stopped there."""
    import functools

    import nbformat

    from rookworld_lib.lab.cli import main

    nbs, out = tmp_path / "notebooks", tmp_path / "runs"
    nbs.mkdir()
    write_notebook(nbs / "00_fine.ipynb", "x = 1", "pass")
    write_notebook(nbs / "01_broken.ipynb", "x = 1", "raise ValueError('planted failure')")
    write_notebook(nbs / "02_after.ipynb", "x = 1", "pass")
    monkeypatch.setattr(pipeline, "run_pipeline", functools.partial(pipeline.run_pipeline, notebooks_dir=nbs))
    assert main(["run", "--profile", "cpu", "--out", str(out)]) == 1
    (run_dir,) = out.iterdir()
    captured = capsys.readouterr()
    lines = [x for x in captured.err.splitlines() if x.startswith("rookworld run:")]
    assert lines == [f"rookworld run: error: notebook pipeline failed: 01_broken.ipynb: ValueError: planted failure "
                     f"(cell [2]) (kernel log: {run_dir / 'logs' / '01_broken.kernel.log'}) (executed notebooks and "
                     f"report in {run_dir}; after a fix, rookworld run --resume {run_dir} continues it)"], captured.err
    assert "Traceback" not in captured.err and "run written to" not in captured.out
    executed = nbformat.read(str(run_dir / "01_broken.ipynb"), as_version=4)
    assert [o["evalue"] for c in executed.cells for o in c.get("outputs", []) if o.get("output_type") == "error"] == [
        "planted failure"]
    assert sorted(p.name for p in run_dir.glob("*.ipynb")) == ["00_fine.ipynb", "01_broken.ipynb"]  # 02 never ran


def test_a_worker_whose_peer_failed_hands_the_launcher_a_line_that_yields_to_the_peers(tmp_path, monkeypatch):
    """Under `--nproc N` a worker whose peer died sees its own collective fail ("Connection closed by
    peer"): it exits 1 with a secondary line, "stopped because another worker failed (<first line>)",
    which the launcher shows only when no worker said what went wrong. Outside torchrun the same
    RuntimeError is a bug and keeps its traceback."""
    from rookworld_lib.chess import training
    from rookworld_lib.core import errors
    from rookworld_lib.lab.cli import main

    gloo = "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500"

    def grpo_cli(argv):
        raise RuntimeError(f"{gloo}\nException raised from recvBytes at ../torch/csrc/distributed/c10d/Utils.hpp:672")

    monkeypatch.setattr(training, "grpo_cli", grpo_cli)
    monkeypatch.setenv(errors.ERRORS_DIR_ENV, str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    assert main(["grpo", "--steps", "5"]) == 1
    line = f"rookworld grpo: error: stopped because another worker failed ({gloo})"
    assert json.loads((tmp_path / "rank00001.json").read_text()) == {"line": line, "code": 1, "secondary": True}
    assert errors.worker_errors(tmp_path) == ([line], [1])  # alone, it is what the launcher prints
    peer = "rookworld grpo: error: out of memory: lower --prompts-per-step"
    (tmp_path / "rank00000.json").write_text(json.dumps({"line": peer, "code": 1, "secondary": False}))
    assert errors.worker_errors(tmp_path) == ([peer], [1, 1])  # the peer's own error is the one to read
    monkeypatch.delenv("RANK")
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        main(["grpo", "--steps", "5"])


# A notebook that works until a flag file appears beside its parameters (the test sends its signal
# then), unless a second run finds the flag there: it ends at once.
STOPPED_HERE = '''
import time
from pathlib import Path
flag = Path(barrier, "started")
if not flag.exists():
    flag.touch()
    try:
        time.sleep(120)
    except KeyboardInterrupt:  # a training loop ends its step and saves: 7 s here, past jupyter's 5-s SIGKILL
        time.sleep(7)
        Path(barrier, "saved").touch()
        raise
'''

RESUMABLE_RUN = '''
import functools, sys
from pathlib import Path
from rookworld_lib.lab import cli, pipeline
pipeline.run_pipeline = functools.partial(pipeline.run_pipeline, notebooks_dir=Path(sys.argv[1]))
pipeline.resume_run = functools.partial(pipeline.resume_run, notebooks_dir=Path(sys.argv[1]))
sys.exit(cli.main(["run", *sys.argv[2:]]))
'''


def _resumable_main(argv: list[str]) -> None:
    sys.argv = ["-c", *argv]
    exec(RESUMABLE_RUN, {"__name__": "__main__"})


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:  # gone meanwhile
        return []


def test_sigterm_stops_a_run_as_ctrl_c_does_and_resume_continues_it_in_its_folder(tmp_path):
    """SIGTERM (`timeout`, a scheduler) ended `rookworld run` at once: no report.md, no run.json, the
    kernel's temporary folder left behind, and nothing said. It now stops as Ctrl-C does (report,
    run.json, one line naming the signal and how to continue), and `--resume RUN_DIR` continues the
    run in its folder with its own settings: the finished notebook is not run again."""
    nbs, out, barrier = tmp_path / "notebooks", tmp_path / "runs", tmp_path / "barrier"
    nbs.mkdir()
    barrier.mkdir()
    write_notebook(nbs / "00_done.ipynb", "barrier = None", "from pathlib import Path\n"
                   "Path(barrier, 'ran_00').write_text(Path(barrier, 'ran_00').read_text() + 'x' "
                   "if Path(barrier, 'ran_00').exists() else 'x')")
    write_notebook(nbs / "01_stopped.ipynb", "barrier = None", STOPPED_HERE)
    write_notebook(nbs / "02_after.ipynb", "barrier = None", "pass")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    run = ForkedChild(_resumable_main, [str(nbs), "--profile", "cpu", "--out", str(out), "-p", "barrier", str(barrier)],
                      env=env)
    deadline = time.monotonic() + 120
    while not (barrier / "started").exists():
        assert time.monotonic() < deadline and run.poll() is None, "the second notebook never started"
        time.sleep(0.1)
    # this run's kernel folder, from its kernel's command line (another worker's runs make folders of their own)
    kernel_dirs = {Path(arg).parent for pid in descendants(run.pid) for arg in _cmdline(pid)
                   if Path(arg).parent.name.startswith("rookworld-kernel-")}
    assert kernel_dirs
    run.send_signal(signal.SIGTERM)
    _, err = run.communicate(timeout=60)
    (run_dir,) = out.iterdir()
    assert run.returncode == 130, err
    assert (barrier / "saved").exists()  # the kernel had the time to end its step and save
    assert f"rookworld run: interrupted in 01_stopped.ipynb; what ran: {run_dir / 'report.md'}; continue it: " \
           f"rookworld run --resume {run_dir}" in err and "Traceback" not in err, err
    assert err.strip().endswith("rookworld run: interrupted (SIGTERM)"), err
    record = json.loads((run_dir / "run.json").read_text())
    assert [(n["notebook"], n["status"]) for n in record["notebooks"]] == [("00_done.ipynb", "ok"),
                                                                         ("01_stopped.ipynb", "interrupted")]
    assert "**INTERRUPTED**: 01_stopped.ipynb: interrupted (SIGTERM)" in (run_dir / "report.md").read_text()
    assert not any(d.exists() for d in kernel_dirs), kernel_dirs  # its kernel's folder removed

    resumed = ForkedChild(_resumable_main, [str(nbs), "--resume", str(run_dir)], env=env)
    output, err = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, err
    assert f"rookworld run (cpu): 2 notebook(s) into {run_dir} (resumed: 1 finished before)" in output
    record = json.loads((run_dir / "run.json").read_text())
    assert [(n["notebook"], n["status"]) for n in record["notebooks"]] == [
        ("00_done.ipynb", "ok"), ("01_stopped.ipynb", "ok"), ("02_after.ipynb", "ok")]
    assert (barrier / "ran_00").read_text() == "x"  # the finished notebook ran once
    assert len(record["meta"]["resumed"]) == 1 and sorted(p.name for p in out.iterdir()) == [run_dir.name]
    report = (run_dir / "report.md").read_text()
    assert "INTERRUPTED" not in report and "resumed at " in report and "| 02_after.ipynb | ok |" in report


def test_notebook_05_run_again_into_its_folder_resumes_and_its_curves_hold_every_step(tmp_path, monkeypatch):
    """Notebook 05 run again on its run folder (a stopped cell run again, `rookworld run --resume`): its
    training resumes, it says so, and the static curves hold every step of the metrics files; they held
    the steps of the last call only, so a finished run run again saved empty curves over the good ones."""
    import papermill as pm

    from rookworld_lib.lab.places import NOTEBOOKS_DIR
    from rookworld_lib.lab.plots import PNG_ENV

    monkeypatch.setenv(PNG_ENV, "0")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    params = {"run_dir": str(tmp_path / "run"), "figures_dir": str(tmp_path / "figures"), "live_plot": False,
              "sft_steps": 3, "grpo_steps": 2}
    for n in (1, 2):
        pm.execute_notebook(str(NOTEBOOKS_DIR / "05_full_training.ipynb"), str(tmp_path / f"05-{n}.ipynb"),
                            parameters=params, kernel_name="rookworld", progress_bar=False, cwd=str(NOTEBOOKS_DIR))
    def said(n):  # what the notebook printed
        cells = json.loads((tmp_path / f"05-{n}.ipynb").read_text())["cells"]
        return "".join("".join(o.get("text", "")) for c in cells for o in c.get("outputs", []))
    assert f"this run: {tmp_path / 'run'}\n" in said(1)
    assert f"this run: {tmp_path / 'run'} (an earlier run's folder: its training resumes from its checkpoints)" in said(2)
    for figure, key, steps in (("05_sft_loss", "loss", [1, 2, 3]), ("05_grpo_reward", "reward", [1, 2])):
        traces = json.loads((tmp_path / "figures" / f"{figure}.json").read_text())["data"]
        assert next(t["x"] for t in traces if t["name"] == key) == steps, figure
