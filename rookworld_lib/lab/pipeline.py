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

Ctrl-C or SIGTERM stops the notebook under way (a training loop saves a checkpoint), writes the report
and says how to continue: `rookworld run --resume <run>` runs the first unfinished notebook and the
rest in the same folder with the run's own settings (its run.json), training resuming from its
checkpoints.

Runs may overlap: each has its own directory (`<stamp>`, else `<stamp>-2`, ...), and each kernel
its own temporary directory for its connection file and IPC sockets, removed when it ends.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import json
import logging
import os
import platform
import shlex
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

from ..core.config import json_or_text, path_arg
from ..core.errors import Terminated, sigterm_as_interrupt
from ..core.paths import RUNS_DIR, atomic_write, run_lock
from ..core.progress import PROGRESS_ENV
from . import explore, workflow
from .parameters import ParameterError
from .places import NOTEBOOKS_DIR, git_commit
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


def check_parameters(extra: dict, declared: dict[Path, set[str]], refused: set[str] = frozenset()) -> None:
    """Refuse -p names that no selected notebook declares (a typo would silently run the defaults),
    naming the parameters that are allowed (not those the run sets itself: `refused`)."""
    allowed = sorted(set().union(*declared.values()) - set(refused))
    if unknown := sorted(set(extra) - set().union(*declared.values())):
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
PATH_PARAMETERS = frozenset({"data_dir", "init_from", "model_dir", "run_dir", "runs_root", "results_path", "trace_dir"})


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
    cell_running: threading.Event | None = None  # set while a cell runs (`execute` gives each notebook a subclass)

    async def shutdown_kernel(self, now: bool = False, restart: bool = False):
        # A kernel stopped inside a cell (Ctrl-C, SIGTERM) gets KERNEL_STOP_WAIT_S to end its step and save;
        # one whose cells all ran has nothing to finish and keeps jupyter's 5 s. ipykernel 7 can hang on the
        # way out (its control thread flushes stdout on an IOPub thread already stopped: 10 s a flush, three
        # flushes); the short wait ends that hang in 2.5 s instead of 30 s (SIGTERM at half the wait).
        if self.cell_running is None or self.cell_running.is_set():
            self.shutdown_wait_time = KERNEL_STOP_WAIT_S
        await super().shutdown_kernel(now=now, restart=restart)

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
            cell_running = threading.Event()  # a Config value would be deep-copied: the class holds it
            manager = type(NotebookKernelManager.__name__, (NotebookKernelManager,), {"cell_running": cell_running})
            config = Config({"NotebookKernelManager": {"log_path": str(logs / f"{nb.stem}.kernel.log"),
                                                       "progress_path": str(progress),
                                                       "connection_file": str(Path(runtime, "kernel.json")),
                                                       "transport": "ipc" if os.name == "posix" else "tcp"}})
            pm.execute_notebook(str(nb), str(out), parameters=params, kernel_name="python3", cwd=str(nb.parent),
                                progress_bar=False, kernel_manager_class=manager, config=config,
                                on_cell_execute=lambda **_: cell_running.set(),
                                on_cell_executed=lambda **_: cell_running.clear())
    finally:
        done.set()
        thread.join()


# nbclient logs a kernel that died mid-cell through papermill's logger; the run's own line says it (the
# notebook's error, or "interrupted" when Ctrl-C or SIGTERM stopped the kernel, which is no death to report)
logging.getLogger("papermill").addFilter(lambda r: "Kernel died while waiting for execute reply" not in r.getMessage())

# How long a kernel stopped inside a cell (Ctrl-C, SIGTERM) gets to end the step under way and save: SIGINT
# at once, SIGTERM after half, SIGKILL after all of it (jupyter's default, which an idle kernel keeps: 5 s)
KERNEL_STOP_WAIT_S = 60.0
RECORD = "run.json"  # in the run folder: the run's plan (for --resume), settings and each notebook's status


def plan_run(profile: str = "cpu", out_root: Path = RUNS_DIR, only: list[str] | None = None,
             extra_parameters: dict | None = None, notebooks_dir: Path = NOTEBOOKS_DIR) -> dict:
    """Check everything a run is asked (before its folder exists: a refused run leaves nothing behind)
    and return its plan: the notebooks, what each declares, the parameters offered, the profile."""
    extra = extra_parameters or {}
    if profile == "auto":
        profile = "gpu" if torch.cuda.is_available() else "cpu"
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {sorted(PROFILES)}")
    everything = numbered_notebooks(notebooks_dir)
    notebooks = [p for p in everything if not only or any(p.name.startswith(o) for o in only)]
    if not notebooks:
        raise ValueError(f"no notebooks selected from {notebooks_dir} by --only {' '.join(only or [])} "
                         f"(available: {', '.join(p.name for p in everything) or 'none'})")
    declared = {nb: declared_parameters(nb) for nb in notebooks}
    trains = any(nb.name.startswith("05") for nb in notebooks)
    check_parameters(extra, declared, refused=set().union(*map(set_by_run, notebooks)))
    check_run_folders(extra, notebooks)
    given = {**PROFILES[profile], **extra}
    # CUDA that is not here, before the notebooks' own checks (which refuse it too): say which setting asked for it
    named = given["profile"] if given.get("profile") in workflow.PROFILES else profile
    device = str(given.get("device") or workflow.PROFILES[named].sft.device)
    if device.startswith("cuda") and not torch.cuda.is_available():
        if extra.get("device"):
            raise ValueError(f"-p device {device!r}: torch sees no CUDA device here; pass -p device cpu, or leave it out")
        if "device" in PROFILES[profile]:  # --profile gpu passes device cuda, whatever -p profile names
            raise ValueError(f"--profile {profile} trains on {device}, and torch sees no CUDA device here; choose "
                             "--profile cpu (or auto)")
        raise ValueError(f"-p profile {named} trains on {device}, and torch sees no CUDA device here; leave -p "
                         "profile out (or pass -p profile cpu)")
    for nb in notebooks:  # a name several notebooks declare may be held to each one's range: say whose
        try:
            check_parameter_values(nb, {k: v for k, v in given.items() if k in declared[nb]})
        except ParameterError as exc:
            raise ParameterError(f"{nb.name}: {exc}") from None
    return {"notebooks": notebooks, "declared": declared, "offered": {**PROFILES[profile], **extra}, "trains": trains,
            "out_root": Path(out_root).resolve(), "args": {"profile": profile, "only": only, "parameters": extra}}


def set_by_run(nb: Path) -> set[str]:
    """The parameters `rookworld run` sets for notebook `nb` itself, refused as -p where `nb` is selected
    (check_run_folders): figures_dir, and notebook 05's run_dir (it trains into the run's folder)."""
    return {"figures_dir", *(("run_dir",) if nb.name.startswith("05") else ())}


def run_pipeline(profile: str = "cpu", out_root: Path = RUNS_DIR, only: list[str] | None = None,
                 extra_parameters: dict | None = None, notebooks_dir: Path = NOTEBOOKS_DIR) -> Path:
    """Execute the notebooks; return the run directory. Raises RuntimeError if one fails."""
    plan = plan_run(profile, out_root, only, extra_parameters, notebooks_dir)
    return _execute(plan, new_run_dir(plan["out_root"]), {})  # a notebook runs in its own folder


def resume_run(run_dir: Path, notebooks_dir: Path = NOTEBOOKS_DIR) -> Path:
    """Continue an interrupted or failed run in its own folder, with its own settings (its run.json):
    the notebooks that finished, in the order planned, stay as they are; the first that did not and
    those after it run again, notebook 05's training resuming from its checkpoints (and a run stopped
    while its figures' PNG copies were made makes them)."""
    run_dir = Path(run_dir).expanduser().resolve()
    try:
        record = json.loads((run_dir / RECORD).read_text())
        args, meta = record["plan"], record["meta"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ValueError(f"--resume {run_dir}: no readable {RECORD} with a run's plan there; give a run folder that "
                         "rookworld run made (one from before 2026-11-29 cannot be resumed)") from None
    plan = plan_run(args["profile"], run_dir.parent, args["only"], args["parameters"], notebooks_dir)
    names, done = [nb.name for nb in plan["notebooks"]], []
    for r in record.get("notebooks", []):  # the leading run of finished notebooks, in the plan's order
        if r.get("status") != "ok" or len(done) == len(names) or r.get("notebook") != names[len(done)]:
            break
        done.append(r)
    if len(done) == len(names) and not record.get("failure"):
        raise ValueError(f"--resume {run_dir}: every notebook of that run finished ({run_dir / 'report.md'}); "
                         "nothing to resume")
    resumed = f"{dt.datetime.now().strftime('%Y%m%d-%H%M%S')} (commit {git_commit() or 'unknown'})"
    return _execute(plan, run_dir, {**meta, "resumed": [*meta.get("resumed", []), resumed]}, done)


def _stopped(exc: KeyboardInterrupt) -> str:
    return f"interrupted ({'SIGTERM' if isinstance(exc, Terminated) else 'Ctrl-C'})"


def _execute(plan: dict, run_dir: Path, meta: dict, done: list[dict] = ()) -> Path:
    """Run the plan's notebooks after the `done` ones into run_dir (one writer: the folder is locked);
    write run.json (at the start too: a run killed at once can be resumed), report.md and the PNG copies
    of the figures; see run_pipeline. meta: a resumed run's (started, commit, ...), else {}."""
    with run_lock(run_dir):
        return _run_notebooks(plan, run_dir, meta, list(done))


def run_to_explore(plan: dict) -> dict:
    """Notebook 06's run_dir where this run trains none: the newest run under -p runs_root (else --out), not
    this empty one; none where -p model_dir gives a model alone (another run's GRPO settings and completions
    are not that model's). {} where notebook 05 trains here, or -p run_dir chose."""
    given = plan["args"]["parameters"]
    if plan["trains"] or "run_dir" in given or not any(nb.name.startswith("06") for nb in plan["notebooks"]):
        return {}
    if "model_dir" in given:
        return {"run_dir": None}
    run = explore.latest_run(given.get("runs_root") or plan["out_root"])
    return {"run_dir": None if run is None else str(run)}


def _run_notebooks(plan: dict, run_dir: Path, meta: dict, results: list[dict]) -> Path:
    notebooks, declared = plan["notebooks"], plan["declared"]
    figures = run_dir / "figures"
    figures.mkdir(exist_ok=True)
    # runs_root: where 06, alone, looks for the newest run (--out's, not runs/, unless -p runs_root says)
    offered = {"figures_dir": str(figures), "run_dir": str(run_dir), "runs_root": str(plan["out_root"]), **plan["offered"]}
    offered.update(run_to_explore(plan))
    profile = offered["profile"]  # `-p profile NAME` is the profile the notebooks run: the report says that one
    meta = meta or {"profile": profile, "started": run_dir.name, "git_commit": git_commit() or "unknown",
                    "python": platform.python_version(), "torch": torch.__version__,
                    "device": torch.cuda.get_device_name() if torch.cuda.is_available() else
                    f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"}
    failure, interrupted, done = None, None, len(results)

    def record():
        text = json.dumps({"meta": meta, "plan": plan["args"], "notebooks": results, "failure": failure}, indent=2)
        atomic_write(run_dir / RECORD, lambda f: f.write(text.encode() + b"\n"))

    record()
    todo = notebooks[done:]
    print(f"rookworld run ({profile}): {len(todo)} notebook(s) into {run_dir}"
          + (f" (resumed: {done} finished before)" if meta.get("resumed") else ""), flush=True)
    width = max(len(nb.name) for nb in notebooks)
    for nb in todo:
        params = {k: v for k, v in offered.items() if k in declared[nb]}
        start = time.perf_counter()
        try:
            execute(nb, run_dir / nb.name, params, run_dir)
        except Exception as exc:  # papermill wraps the cell's error; keep going to the report
            failure = f"{nb.name}: {error_line(exc)} (kernel log: {run_dir / 'logs' / (nb.stem + '.kernel.log')})"
        except KeyboardInterrupt as exc:  # Ctrl-C: the report still says what ran, then the interrupt goes on
            failure, interrupted = f"{nb.name}: {_stopped(exc)}", exc
        results.append({"notebook": nb.name, "status": "interrupted" if interrupted else "failed" if failure else "ok",
                        "seconds": round(time.perf_counter() - start, 1), "parameters": params})
        record()
        print(f"{nb.name:<{width}}  {results[-1]['status']:<6}  {results[-1]['seconds']:8.1f} s", flush=True)
        if failure:
            break  # later notebooks may depend on this one's outputs
    start = time.perf_counter()
    try:
        if not interrupted and (pngs := render_pngs(offered["figures_dir"])):  # a failed run: the figures it made
            print(f"{f'PNG copies of {pngs} figures':<{width + 8}}  {time.perf_counter() - start:8.1f} s", flush=True)
    except KeyboardInterrupt as exc:  # the notebooks' results stand; the figures keep their HTML copies
        failure, interrupted = f"PNG copies of the figures: {_stopped(exc)}", exc
    record()
    write_report(run_dir, meta, results, failure)
    if interrupted:
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # not "Task exception was never retrieved" of the dead kernel
        print(f"rookworld run: interrupted in {failure.split(':')[0]}; what ran: {run_dir / 'report.md'}; "
              f"continue it: rookworld run --resume {shlex.quote(str(run_dir))}", file=sys.stderr, flush=True)
        raise interrupted
    if failure:
        raise RuntimeError(f"notebook pipeline failed: {failure} (executed notebooks and report in {run_dir}; "
                           f"after a fix, rookworld run --resume {shlex.quote(str(run_dir))} continues it)")
    return run_dir


def error_line(exc: Exception) -> str:
    """A failed notebook's error in one line: the cell's exception and the first line of its message
    (an assert's message may be a printed table, whose last line says nothing)."""
    if hasattr(exc, "ename"):  # papermill's PapermillExecutionError: the cell's own exception
        first = next((line.strip() for line in str(exc.evalue).splitlines() if line.strip()), "")
        return f"{exc.ename}{': ' + first if first else ''} (cell [{exc.exec_count}])"
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}"


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
        lines += [f"**{'INTERRUPTED' if failure.endswith(('(Ctrl-C)', '(SIGTERM)')) else 'FAILED'}**: {failure}", ""]
    if meta.get("resumed"):
        lines += [f"resumed at {', '.join(meta['resumed'])}; a notebook's wall time is that of its last run", ""]
    lines += ["| notebook | status | wall time (s) |", "| --- | --- | ---: |"]
    lines += [f"| {r['notebook']} | {r['status']} | {r['seconds']} |" for r in results]
    for fragment in sorted(run_dir.glob("report_*.md")):
        lines += ["", fragment.read_text().rstrip()]
    lines += report_figure_lines(run_dir)
    atomic_write(run_dir / "report.md", lambda f: f.write(("\n".join(lines) + "\n").encode()))


def _help_epilog() -> str:
    """What --help adds: each profile's SFT and GRPO sizes, and the -p names each notebook declares."""
    lines = ["profiles (notebook 05's sizes; the other notebooks size themselves for 2 cores):"]
    for name, profile in workflow.PROFILES.items():
        rows = profile.summary().iloc[:, 0]
        lines += [f"  {name}: data {rows['data']}", f"    SFT {rows['SFT']}", f"    GRPO {rows['GRPO']}"]
    lines += ["", "-p names, by notebook (each notebook's parameters cell says what they mean):"]
    lines += [f"  {nb.stem}: {', '.join(sorted(declared_parameters(nb) - set_by_run(nb)))}" for nb in numbered_notebooks()]
    return "\n".join(lines)


def _path(text: str) -> Path:
    return Path(path_arg(text))


def _prefix(text: str) -> str:
    if not text.strip():  # every name starts with "": the whole pipeline, training included
        raise argparse.ArgumentTypeError("an empty prefix selects every notebook; give a number such as 01 or 05")
    return text


def cli(argv: list[str] | None = None) -> int:
    """`rookworld run`; a failed notebook ends in one line naming it and the run directory."""
    ap = argparse.ArgumentParser(prog="rookworld run", description=__doc__.splitlines()[0], epilog=_help_epilog(),
                                 formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    ap.add_argument("--profile", default="auto", choices=["auto", *sorted(PROFILES)],
                    help="parameter profile; auto (the default) = gpu when CUDA is available, else cpu")
    ap.add_argument("--out", type=_path, default=RUNS_DIR, help="parent directory of the run folder (default: "
                    "$ROOKWORLD_RUNS_DIR, else runs/ in the repository)")
    ap.add_argument("--only", nargs="+", metavar="PREFIX", type=_prefix, help="run only notebooks whose names start with these prefixes")
    ap.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "JSON"), default=[],
                    help="extra notebook parameter, value as JSON (e.g. -p sft_steps 200)")
    ap.add_argument("--resume", type=_path, metavar="RUN_DIR", help="continue an interrupted or failed run in its "
                    "folder with its own settings: finished notebooks stay, training resumes from its checkpoints")
    args = ap.parse_args(argv)
    if args.resume is not None and (also := [flag for flag, given in (
            ("--profile", args.profile != "auto"), ("--out", args.out != RUNS_DIR), ("--only", args.only),
            ("-p", args.parameter)) if given]):
        raise ValueError(f"--resume takes the run's own settings (its {RECORD}); drop {', '.join(also)}")
    if twice := sorted({name for i, (name, _) in enumerate(args.parameter) if name in dict(args.parameter[:i])}):
        raise ValueError(f"-p {twice[0]} is given twice; give each parameter once")  # the last one won without a word
    extra = {name: parameter_value(name, value) for name, value in args.parameter}  # -p profile cpu: a bare string
    try:
        with sigterm_as_interrupt():  # SIGTERM stops a run as Ctrl-C does
            run_dir = (resume_run(args.resume) if args.resume is not None else
                       run_pipeline(args.profile, args.out.expanduser(), args.only, extra))
    except RuntimeError as exc:  # a notebook failed: the message names it and the run directory
        print(f"rookworld run: error: {exc}", file=sys.stderr)
        return 1
    print(f"run written to {run_dir} (report: {run_dir / 'report.md'})")
    return 0
