"""Progress that suits where a run is watched: `from .progress import tqdm` for the library's loops.

JupyterLab (a frontend that renders widgets) gets tqdm's widget, a terminal its text bar. In a kernel
nobody watches (papermill, nbval) a widget would be saved at its first state ("0%") and a text bar
would add an output per refresh, so the bar there is silent and prints one line when it closes.
Under `rookworld run`, `report()` appends lines to the file named by $ROOKWORLD_PROGRESS, which the
run prints: the stages of notebook 05, and each headless bar's closing line and one every
REPORT_EVERY_S while it runs.
"""

from __future__ import annotations

import os
import sys
import time
from types import SimpleNamespace

from tqdm import std

PROGRESS_ENV = "ROOKWORLD_PROGRESS"  # the progress file of a `rookworld run` (set for its kernels only)
REPORT_EVERY_S = 30.0
FRONTEND_ENV = ("JPY_SESSION_NAME", "VSCODE_PID")  # set by JupyterLab / VS Code for their kernels


def _in_kernel() -> bool:
    ipython = sys.modules.get("IPython")  # not imported: certainly not inside a kernel
    return ipython is not None and type(ipython.get_ipython()).__name__ == "ZMQInteractiveShell"


def widget_frontend() -> bool:
    """Whether this code runs in a Jupyter kernel that a widget-rendering frontend watches (a kernel
    cannot see its frontend, but its environment tells: papermill and nbval set no FRONTEND_ENV,
    and `rookworld run` removes them from its kernels)."""
    return _in_kernel() and any(os.environ.get(k) for k in FRONTEND_ENV)


def headless_kernel() -> bool:
    """A Jupyter kernel that nobody watches (papermill, nbval)."""
    return _in_kernel() and not any(os.environ.get(k) for k in FRONTEND_ENV)


def report(line: str) -> None:
    """Append one line to the run's progress file; nothing outside `rookworld run`."""
    if path := os.environ.get(PROGRESS_ENV):
        with open(path, "a") as f:
            f.write(line.rstrip("\n") + "\n")


class HeadlessTqdm(std.tqdm):
    """A bar for a kernel nobody watches: silent, a report() every REPORT_EVERY_S, and at close one
    line on stderr (one output in the saved notebook) and in the report."""

    def __init__(self, *args, **kwargs):
        self._reported = time.monotonic()
        # a file with no encoding reads as ASCII-only; no terminal width to fit
        silent = SimpleNamespace(write=lambda s: None, flush=lambda: None)
        super().__init__(*args, **{"ascii": False, **kwargs, "file": silent, "dynamic_ncols": False, "ncols": None})

    echo = False  # also print the REPORT_EVERY_S lines on stderr (a log file, a pipe)

    def update(self, n=1):
        displayed = super().update(n)
        if not self.disable and time.monotonic() - self._reported >= REPORT_EVERY_S:
            self._reported = time.monotonic()
            report(line := str(self))  # formatted once: the file and stderr get the same rate and ETA
            if self.echo:
                print(line, file=sys.stderr, flush=True)
        return displayed

    def close(self):
        if not getattr(self, "disable", True):
            report(line := str(self))
            print(line, file=sys.stderr)
        super().close()


class LineTqdm(HeadlessTqdm):
    """A bar whose stderr is no terminal (a log file, a pipe, CI): a line every REPORT_EVERY_S and one
    at the end, instead of carriage-return redraws that garble the file."""

    echo = True


def tqdm(*args, **kwargs):
    """tqdm.auto's bar (a widget in JupyterLab, text in a terminal), HeadlessTqdm in a kernel nobody
    watches, LineTqdm where stderr is not a terminal."""
    from tqdm.auto import tqdm as auto  # (imports the widgets only in a kernel, and only for a bar)

    if headless_kernel():
        return HeadlessTqdm(*args, **kwargs)
    return (auto if _in_kernel() or sys.stderr.isatty() else LineTqdm)(*args, **kwargs)
