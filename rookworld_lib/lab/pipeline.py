"""The notebook pipeline behind `make run` / `rookworld run`.

Executes the numbered notebooks in order with papermill into `runs/<timestamp>/`, passing each
the parameters of the chosen profile that it declares, and writes a short Markdown report. A
notebook may add to the report by writing `report_<anything>.md` into its `run_dir`.

The terminal shows one line per notebook (name, status, seconds) and, while it runs, the lines its
kernel appends to `<run>/progress.log` (`progress.report`: notebook 05's stages, the library's bars),
which a thread prints (papermill's `log_output` / `stderr_file` would relay every cell's stream
output, warnings included, and store the 30-s lines in the notebook). The kernel process's own
output (what C libraries write to its file descriptors, its log) goes to
`<run>/logs/<notebook>.kernel.log`, named when a notebook fails. The kernels save figures without
their PNG copies ($ROOKWORLD_PNG=0); the run renders them all at the end on one browser, instead of
one browser start per notebook.

Runs may overlap: each has its own directory (`<stamp>`, else `<stamp>-2`, ...), and each kernel
its own temporary directory for its connection file and IPC sockets, removed when it ends.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat
import papermill as pm
import torch
from jupyter_client import AsyncKernelManager
from traitlets import Unicode
from traitlets.config import Config

from ..core.config import ParameterError, json_or_text
from ..core.paths import NOTEBOOKS_DIR, RUNS_DIR, git_commit
from ..core.progress import PROGRESS_ENV
from . import workflow
from .plots import PNG_ENV, render_pngs, report_figure_lines

# Parameter overrides per profile; a notebook receives only those its `parameters` cell declares.
# The cpu profile is each notebook's own defaults (sized for 2 cores) plus the profile name.
# every profile notebook 05 knows (workflow.PROFILES: ci, cpu, cpu-long, gpu), as notebook parameters
PROFILES: dict[str, dict] = {name: {"profile": name, **({"device": "cuda"} if name == "gpu" else {})}
                             for name in workflow.PROFILES}


def numbered_notebooks(directory: Path = NOTEBOOKS_DIR) -> list[Path]:
    """The notebooks to run, in order: NN_name.ipynb."""
    return sorted(directory.glob("[0-9][0-9]_*.ipynb"))


def parameter_cells(notebook: Path) -> tuple[str, str]:
    """The source of the notebook's `parameters` cell and of the code cell after it, which checks them."""
    cells = [c for c in nbformat.read(str(notebook), as_version=4).cells if c.cell_type == "code"]
    i = next((i for i, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", [])), None)
    return ("", "") if i is None else (cells[i].source, cells[i + 1].source if i + 1 < len(cells) else "")


def declared_parameters(notebook: Path) -> set[str]:
    """Names assigned at top level in the notebook's `parameters` cell.

    Read with Python's own parser: papermill's inspector gives up on lines whose comments hold
    quotes or parentheses, and a parameter it cannot read would silently not be passed.
    """
    names = set()
    for node in ast.parse(parameter_cells(notebook)[0]).body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def check_parameters(extra: dict, declared: dict[Path, set[str]]) -> None:
    """Refuse -p names that no selected notebook declares (a typo would silently run the defaults),
    naming the parameters that are allowed."""
    allowed = sorted(set().union(*declared.values()))
    if unknown := sorted(set(extra) - set(allowed)):
        raise ParameterError(f"parameter(s) {unknown} are declared by none of the selected notebooks "
                             f"({', '.join(nb.name for nb in declared)}); allowed: {', '.join(allowed)}")


def check_run_folders(extra: dict, notebooks: list[Path]) -> None:
    """Refuse -p values that would take a run's files out of its folder, whose report.md gathers them:
    figures_dir, and run_dir where notebook 05 trains (notebook 06 alone may explore another run)."""
    if "figures_dir" in extra:
        raise ParameterError("-p figures_dir: rookworld run writes the figures into the run folder's figures/, "
                             "which its report.md shows (--out chooses where the run folder goes)")
    if "run_dir" in extra and any(nb.name.startswith("05") for nb in notebooks):
        raise ParameterError("-p run_dir: notebook 05 trains into the run folder, which its report.md gathers "
                             "(--out chooses where it goes); -p run_dir is for notebook 06 alone (--only 06), to "
                             "explore another run")


# parameters naming a file or folder: a relative one is the user's, as --out is, not the notebooks folder's
PATH_PARAMETERS = frozenset({"data_dir", "init_from", "model_dir", "run_dir", "results_path", "trace_dir"})


def parameter_value(name: str, text: str):
    """A -p value: JSON where it parses (`None` too, as the parameter cells spell it), else the text; a
    relative path of a PATH_PARAMETERS name made absolute against the working directory."""
    value = None if text == "None" else json_or_text(text)
    if name in PATH_PARAMETERS and isinstance(value, str) and value and not Path(value).is_absolute():
        value = str(Path(value).resolve())
    return value


def check_parameter_values(notebook: Path, values: dict) -> None:
    """Run the notebook's own checks of its parameters (the `check(...)` statements of the cell after
    `parameters`, with the imports they use) on its defaults overridden by `values`, in this process:
    a value of the wrong type or range is refused with the kernel's own ParameterError, before any
    notebook runs."""
    params, checks = parameter_cells(notebook)
    namespace: dict = {}
    exec(compile(params, f"{notebook.name} (parameters)", "exec"), namespace)  # literal assignments only
    namespace.update(values)
    body = ast.parse(checks).body
    calls_check = [node for node in body if not isinstance(node, (ast.Import, ast.ImportFrom)) and any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "check" for n in ast.walk(node))]
    used = {n.id for node in calls_check for n in ast.walk(node) if isinstance(n, ast.Name)}
    imports = [node for node in body if isinstance(node, (ast.Import, ast.ImportFrom))
               and {(a.asname or a.name).split(".")[0] for a in node.names} & used]
    exec(compile(ast.Module(imports + calls_check, type_ignores=[]), f"{notebook.name} (checks)", "exec"), namespace)


class NotebookKernelManager(AsyncKernelManager):
    """The kernel of one notebook in a run: its process's stdout and stderr go to `log_path` (ipykernel
    echoes there what is written to its file descriptors), over IPC where the OS has it (over TCP
    ipykernel warns at every start), with $ROOKWORLD_PROGRESS set and without the variables that
    tell `progress` a frontend watches (a run started from a notebook cell inherits them), and with
    $ROOKWORLD_PNG=0 (the run renders the PNG copies of its figures)."""

    log_path = Unicode(config=True, help="file for the kernel process's stdout and stderr")
    progress_path = Unicode(config=True, help="the run's progress file ($ROOKWORLD_PROGRESS in the kernel)")

    async def start_kernel(self, **kw):
        env = {k: v for k, v in os.environ.items() if k != "JPY_SESSION_NAME" and not k.startswith("VSCODE_")}
        env[PROGRESS_ENV] = self.progress_path
        env[PNG_ENV] = "0"
        with open(self.log_path, "a") as log:  # the child holds its own copy of the descriptor
            await super().start_kernel(stdout=log, stderr=log, env=env, **kw)


def execute(nb: Path, out: Path, params: dict, run_dir: Path) -> None:
    """Run one notebook with papermill while a thread prints the lines its kernel appends to the
    progress file, as `  <notebook> | <line>` (see the module doc)."""
    logs, progress = run_dir / "logs", run_dir / "progress.log"
    logs.mkdir(exist_ok=True)
    progress.touch()
    printed = progress.stat().st_size  # the lines of earlier notebooks
    done = threading.Event()

    def echo():
        with open(progress) as f:
            f.seek(printed)
            while True:
                stopping = done.wait(0.5)  # read once more after the notebook ends: its last lines
                for line in f.readlines():
                    print(f"  {nb.stem} | {line.rstrip()}", flush=True)
                if stopping:
                    return

    thread = threading.Thread(target=echo, daemon=True)
    thread.start()
    # The kernel's connection file, and so its IPC sockets (`<file>-ipc-N`), in a directory of its own:
    # without one, jupyter_client names the sockets `kernel-ipc-N` relative to papermill's cwd (the
    # notebooks folder, shared by every run) and picks N by a check-then-bind race, so two runs'
    # kernels took each other's sockets. A short path: a Unix socket's holds at most 107 bytes.
    try:
        with tempfile.TemporaryDirectory(prefix="rookworld-kernel-") as runtime:
            config = Config({"NotebookKernelManager": {"log_path": str(logs / f"{nb.stem}.kernel.log"),
                                                       "progress_path": str(progress),
                                                       "connection_file": str(Path(runtime, "kernel.json")),
                                                       "transport": "ipc" if os.name == "posix" else "tcp"}})
            pm.execute_notebook(str(nb), str(out), parameters=params, kernel_name="python3", cwd=str(nb.parent),
                                progress_bar=False, kernel_manager_class=NotebookKernelManager, config=config)
    finally:
        done.set()
        thread.join()


def run_pipeline(profile: str = "cpu", out_root: Path = RUNS_DIR, only: list[str] | None = None,
                 extra_parameters: dict | None = None, notebooks_dir: Path = NOTEBOOKS_DIR) -> Path:
    """Execute the notebooks; return the run directory. Raises RuntimeError if one fails."""
    if profile == "auto":
        profile = "gpu" if torch.cuda.is_available() else "cpu"
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {sorted(PROFILES)}")
    # everything is checked before the run directory exists: a refused run leaves nothing behind
    everything = numbered_notebooks(notebooks_dir)
    notebooks = [p for p in everything if not only or any(p.name.startswith(o) for o in only)]
    if not notebooks:
        raise ValueError(f"no notebooks selected from {notebooks_dir} by --only {' '.join(only or [])} "
                         f"(available: {', '.join(p.name for p in everything) or 'none'})")
    declared = {nb: declared_parameters(nb) for nb in notebooks}
    check_parameters(extra_parameters or {}, declared)
    check_run_folders(extra_parameters or {}, notebooks)
    given = {**PROFILES[profile], **(extra_parameters or {})}
    for nb in notebooks:
        check_parameter_values(nb, {k: v for k, v in given.items() if k in declared[nb]})
    named = given["profile"] if given.get("profile") in workflow.PROFILES else profile
    device = str(given.get("device") or workflow.PROFILES[named].sft.device)
    if device.startswith("cuda") and not torch.cuda.is_available():
        if "device" in (extra_parameters or {}):
            raise ValueError(f"-p device {device!r}: torch sees no CUDA device here; pass -p device cpu, or leave it out")
        if (extra_parameters or {}).get("profile") == named:  # the notebooks' profile, given apart from --profile
            raise ValueError(f"-p profile {named} trains on {device}, and torch sees no CUDA device here; leave -p "
                             "profile out (or pass -p profile cpu)")
        raise ValueError(f"--profile {named} trains on {device}, and torch sees no CUDA device here; choose "
                         "--profile cpu (or auto)")
    run_dir = new_run_dir(Path(out_root).resolve())  # a notebook runs in its own folder: no relative paths
    stamp = run_dir.name
    figures = run_dir / "figures"
    figures.mkdir()
    offered = {**PROFILES[profile], "figures_dir": str(figures), "run_dir": str(run_dir), **(extra_parameters or {})}
    profile = offered["profile"]  # `-p profile NAME` is the profile the notebooks run: the report says that one

    print(f"rookworld run ({profile}): {len(notebooks)} notebook(s) into {run_dir}", flush=True)
    width = max(len(nb.name) for nb in notebooks)
    results, failure, interrupted = [], None, False
    for nb in notebooks:
        params = {k: v for k, v in offered.items() if k in declared[nb]}
        start = time.perf_counter()
        try:
            execute(nb, run_dir / nb.name, params, run_dir)
        except Exception as exc:  # papermill wraps the cell's error; keep going to the report
            failure = (f"{nb.name}: {type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[-1]} "
                       f"(kernel log: {run_dir / 'logs' / (nb.stem + '.kernel.log')})")
        except KeyboardInterrupt:  # Ctrl-C: the report still says what ran, then the interrupt goes on
            failure, interrupted = f"{nb.name}: interrupted (Ctrl-C)", True
        results.append({"notebook": nb.name, "status": "interrupted" if interrupted else "failed" if failure else "ok",
                        "seconds": round(time.perf_counter() - start, 1), "parameters": params})
        print(f"{nb.name:<{width}}  {results[-1]['status']:<6}  {results[-1]['seconds']:8.1f} s", flush=True)
        if failure:
            break  # later notebooks may depend on this one's outputs

    start = time.perf_counter()
    if not interrupted and (pngs := render_pngs(offered["figures_dir"])):
        print(f"{f'PNG copies of {pngs} figures':<{width + 8}}  {time.perf_counter() - start:8.1f} s", flush=True)
    meta = {"profile": profile, "started": stamp, "git_commit": git_commit() or "unknown", "python": platform.python_version(),
            "torch": torch.__version__, "device": torch.cuda.get_device_name() if torch.cuda.is_available() else
            f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"}
    (run_dir / "run.json").write_text(json.dumps({"meta": meta, "notebooks": results}, indent=2) + "\n")
    write_report(run_dir, meta, results, failure)
    if interrupted:
        print(f"rookworld run: interrupted in {failure.split(':')[0]}; what ran: {run_dir / 'report.md'}", file=sys.stderr, flush=True)
        raise KeyboardInterrupt
    if failure:
        raise RuntimeError(f"notebook pipeline failed: {failure} (executed notebooks and report in {run_dir})")
    return run_dir


def new_run_dir(out_root: Path = RUNS_DIR, stamp: str | None = None) -> Path:
    """`out_root/<stamp>` (default: now, `%Y%m%d-%H%M%S`), or `<stamp>-2`, `<stamp>-3`, ... when that
    exists: runs started in the same second never share a directory (`mkdir` creates it or fails,
    atomically, even across processes). Notebook 05 run on its own makes its run directory here too."""
    stamp = stamp or dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out_root = Path(out_root)
    out_root.mkdir(parents=True, exist_ok=True)
    run_dir, n = out_root / stamp, 1
    while True:
        try:
            run_dir.mkdir()
            return run_dir
        except FileExistsError:
            n += 1
            run_dir = out_root / f"{stamp}-{n}"


def write_report(run_dir: Path, meta: dict, results: list[dict], failure: str | None) -> None:
    """report.md: the run's settings, each notebook's status and time, the notebooks' fragments, figures."""
    lines = [f"# RookWorld run {meta['started']}", "",
             f"profile `{meta['profile']}` · commit `{meta['git_commit']}` · torch {meta['torch']} · "
             f"Python {meta['python']} · {meta['device']}", ""]
    if failure:
        lines += [f"**{'INTERRUPTED' if failure.endswith('interrupted (Ctrl-C)') else 'FAILED'}**: {failure}", ""]
    lines += ["| notebook | status | wall time (s) |", "| --- | --- | ---: |"]
    lines += [f"| {r['notebook']} | {r['status']} | {r['seconds']} |" for r in results]
    for fragment in sorted(run_dir.glob("report_*.md")):
        lines += ["", fragment.read_text().rstrip()]
    lines += report_figure_lines(run_dir)
    (run_dir / "report.md").write_text("\n".join(lines) + "\n")


def cli(argv: list[str] | None = None) -> int:
    """`rookworld run`; a failed notebook ends in one line naming it and the run directory."""
    ap = argparse.ArgumentParser(prog="rookworld run", description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="auto", choices=["auto", *sorted(PROFILES)],
                    help="parameter profile; auto (the default) = gpu when CUDA is available, else cpu")
    ap.add_argument("--out", type=Path, default=RUNS_DIR, help="parent directory of the run folder (default: "
                    "$ROOKWORLD_RUNS_DIR, else runs/ in the repository)")
    ap.add_argument("--only", nargs="+", metavar="PREFIX", help="run only notebooks whose names start with these prefixes")
    ap.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "JSON"), default=[],
                    help="extra notebook parameter, value as JSON (e.g. -p sft_steps 200)")
    args = ap.parse_args(argv)
    extra = {name: parameter_value(name, value) for name, value in args.parameter}  # -p profile cpu: a bare string
    try:
        run_dir = run_pipeline(args.profile, args.out, args.only, extra)
    except RuntimeError as exc:  # a notebook failed: the message names it and the run directory
        print(f"rookworld run: error: {exc}", file=sys.stderr)
        return 1
    print(f"run written to {run_dir} (report: {run_dir / 'report.md'})")
    return 0
