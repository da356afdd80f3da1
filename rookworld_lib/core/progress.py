"""Progress that suits where a run is watched.

- JupyterLab (or any frontend that renders widgets): tqdm's notebook widget.
- A terminal or plain Python: tqdm's text bar.
- A notebook executed headless (papermill, nbval): nothing renders a widget there (a saved widget
  output shows its first state, "0%"), and every refresh of a text bar would be one more stream
  output in the saved notebook. The bar stays silent while it runs and prints one line when it
  closes; under `rookworld run` it also writes a few lines (the closing one and, for a loop that
  runs past `QUIET_FOR_S`, each quarter or every `REPORT_EVERY_S`) to the progress file named by $ROOKWORLD_PROGRESS, which the pipeline echoes
  to the terminal. `report()` writes any other line there (the stages of notebook 05).

The library's loops take their bar from here: `from .progress import tqdm`.
"""

from __future__ import annotations

import os
import sys
import time

from tqdm import std
from tqdm.auto import tqdm as _auto_tqdm

PROGRESS_ENV = "ROOKWORLD_PROGRESS"  # the progress file of a `rookworld run` (set for its kernels only)
REPORT_EVERY_S = 30.0
QUIET_FOR_S = 5.0  # a loop shorter than this reports only its closing line


FRONTEND_ENV = ("JPY_SESSION_NAME", "VSCODE_PID")


def _in_kernel() -> bool:
    ipython = sys.modules.get("IPython")  # not imported: certainly not inside a kernel
    return ipython is not None and type(ipython.get_ipython()).__name__ == "ZMQInteractiveShell"


def widget_frontend() -> bool:
    """Whether this code runs in a Jupyter kernel that a widget-rendering frontend watches.

    A kernel cannot see its frontend, but its environment tells: jupyter_server (JupyterLab,
    Notebook 7) starts a notebook's kernel with JPY_SESSION_NAME, VS Code with VSCODE_PID, while
    papermill and nbval set neither (and `rookworld run` removes both from its kernels)."""
    return _in_kernel() and any(os.environ.get(k) for k in FRONTEND_ENV)


def headless_kernel() -> bool:
    """A Jupyter kernel that nobody watches (papermill, nbval)."""
    return _in_kernel() and not any(os.environ.get(k) for k in FRONTEND_ENV)


def report(line: str) -> None:
    """Append one line to the run's progress file; nothing outside `rookworld run`."""
    if path := os.environ.get(PROGRESS_ENV):
        with open(path, "a") as f:
            f.write(line.rstrip("\n") + "\n")


class _Silent:
    """Where the headless bar's per-refresh output goes."""

    def write(self, s):
        pass

    def flush(self):
        pass


class HeadlessTqdm(std.tqdm):
    """A tqdm bar for a kernel nobody watches: quiet while running, one line at close (stderr, so
    one stream output in the saved notebook); in the progress file the closing line and, once the
    loop has run QUIET_FOR_S, a line per quarter (at least every REPORT_EVERY_S)."""

    def __init__(self, *args, **kwargs):
        self._quarter = 0
        self._started = self._reported = time.monotonic()
        # no terminal width to fit (the default bar is 10 wide, the postfix whole); the silent file
        # has no encoding, which tqdm would read as ASCII-only
        kwargs.update(file=_Silent(), dynamic_ncols=False, ncols=None)
        kwargs.setdefault("ascii", False)
        super().__init__(*args, **kwargs)

    def update(self, n=1):
        displayed = super().update(n)
        if not self.disable:
            quarter = int(4 * self.n / self.total) if self.total else 0
            now = time.monotonic()
            if (quarter > self._quarter and now - self._started >= QUIET_FOR_S) or now - self._reported >= REPORT_EVERY_S:
                self._quarter, self._reported = quarter, now
                if quarter < 4:  # the last line comes from close(), with the final postfix
                    report(str(self))
        return displayed

    def close(self):
        if not self.disable and not getattr(self, "_closed_line", False):
            self._closed_line = True
            line = str(self)
            report(line)
            print(line, file=sys.stderr)
        super().close()


def tqdm(*args, **kwargs):
    """tqdm.auto's bar (a widget in JupyterLab, text in a terminal), or HeadlessTqdm in a kernel
    nobody watches."""
    return (HeadlessTqdm if headless_kernel() else _auto_tqdm)(*args, **kwargs)
