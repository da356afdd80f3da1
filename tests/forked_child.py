"""Killable child processes that start in a fraction of a second (the kill-and-resume tests start many).

A fresh `python child.py` spends ~4 s here (more on a busy machine) importing torch and the library
before it trains a step, and the kill tests start 3-5 of them each. A ForkedChild is forked instead
from a server process that imported them once (multiprocessing's forkserver, preloaded; one server
per pytest process, started on first use): still a process of its own, with its own pid, stdout and
stderr, exit status, files and engines, that a SIGKILL ends as it ends any process. The server starts
from a fresh interpreter, not from this process, so nothing this process did (threads, monkeypatches,
torch settings) reaches the children; a child's OMP_NUM_THREADS sets its torch threads, as in a fresh process.

ForkedChild has the part of subprocess.Popen's interface the tests use: pid, poll(), returncode,
wait(timeout), communicate(timeout) -> (stdout, stderr) as text, send_signal(sig), kill().
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import weakref

# imported once by the server: every child finds them in memory
# torch._dynamo: torch.optim imports it on an optimizer's first construction (~1.7 s); the tensorboard writer: the
# trainers' metrics (~0.2 s). sft_helpers builds the shipped tokenizer at import (~0.3 s a child otherwise).
PRELOAD = ["torch", "torch._dynamo", "torch.utils.tensorboard", "rookworld_lib.core.train_sft", "rookworld_lib.lab.cli", "sft_helpers"]
_CONTEXT = None


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(PRELOAD)
    return _CONTEXT


def cli_main(argv: list[str]) -> None:
    """`rookworld ARGV...`, as the console script runs it."""
    from rookworld_lib.lab.cli import main

    sys.exit(main(argv))


def _bootstrap(target, argv: list[str], out: str, err: str | None, env: dict | None, cwd: str | None) -> None:
    """In the child: the environment and working directory asked for, Ctrl-C raising KeyboardInterrupt
    (as in a Python started where SIGINT is not ignored), stdout and stderr to files (what Popen's pipes
    held), then target(argv)."""
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        # torch read OMP_NUM_THREADS when the server imported it; a fresh process reads this environment's
        import torch

        torch.set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))
    if cwd is not None:
        os.chdir(cwd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for fd, path in ((1, out), (2, err or out)):  # err None: stderr into stdout's file (Popen's stderr=STDOUT)
        f = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if fd == 1 else os.O_APPEND), 0o600)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    target(argv)


class ForkedChild:
    """Run target(argv) (a module-level function: it is pickled by name) in a forked child, with env as
    its whole environment (None: the server's, which is this process's when the server started; the
    library reads the variables the tests set at run time, not at import) and cwd as its directory."""

    def __init__(self, target, argv: list[str], env: dict | None = None, cwd=None, stderr_to_stdout: bool = False):
        self._dir = tempfile.mkdtemp(prefix="rookworld-child-")
        # the files go when communicate() has read them, else with this object or at exit (a killed child's)
        self._remove_files = weakref.finalize(self, shutil.rmtree, self._dir, True)
        self._out, self._err = os.path.join(self._dir, "stdout"), os.path.join(self._dir, "stderr")
        # daemon: a child a failed test left sleeping never holds this process's exit
        self._proc = _context().Process(target=_bootstrap, args=(target, list(argv), self._out, None if stderr_to_stdout else self._err, env, None if cwd is None else str(cwd)),
                                        daemon=True)
        self._proc.start()
        self.pid = self._proc.pid
        self.args = [getattr(target, "__module__", "?") + "." + getattr(target, "__name__", "?"), *argv]

    @property
    def returncode(self):
        return self._proc.exitcode  # -N after signal N, as Popen's

    def poll(self):
        return self._proc.exitcode

    def kill(self) -> None:
        self._proc.kill()

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self._proc.exitcode

    def send_signal(self, sig: int) -> None:
        if self._proc.exitcode is None:
            os.kill(self.pid, sig)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        texts = []
        for path in (self._out, self._err):
            try:
                with open(path, errors="replace") as fh:
                    texts.append(fh.read())
            except OSError:
                texts.append("")
        self._remove_files()
        return texts[0], texts[1]
