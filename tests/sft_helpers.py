"""Shared pieces of the SFT tests: tiny chess texts and configs, a killable SFT child process, and
`warm_popen`, which starts such processes without paying for Python and the library's imports again.

Imported by test_train_sft.py, test_train_sft_distributed.py, test_faults.py and the data and
fault-message tests. Run as a script, it is the child that those tests SIGKILL:

    python tests/sft_helpers.py CONFIG.json TEXTS.json THREADS [--pace S] [--hold-at STEP]
                                [--pause-in-save K FRACTION MARKER] [--pause-at-pointer K MARKER]

--pace sleeps S seconds after every step (so a kill can land anywhere in a step, its eval or its
checkpoint); --hold-at sleeps for good once STEP is done (the run cannot finish before the
kill); --pause-in-save stops inside the K-th checkpoint write of this process, after FRACTION of
the file's bytes are on disk, writes MARKER ({"pid", "step"}: the step being saved) and waits to be
killed; --pause-at-pointer does the same after the K-th checkpoint file is complete but before the
`latest` pointer names it.

    python tests/sft_helpers.py --serve MODULE...

is the server behind `warm_popen` (see there).
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import chess
import pytest
import torch

TINY_MODEL = {"n_layer": 1, "n_embd": 32, "n_head": 2, "block_size": 64}
CHILD = Path(__file__).resolve()


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: on 2 cores shared with other work, 2 threads spin-wait for each other
    and run several times slower. Every run in a test (and its subprocesses) uses the same count,
    which bit-identical comparisons need."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def chess_texts(n: int = 12, seed: int = 0) -> list[str]:
    """n P: and n A: samples in the task formats, from a seeded random game."""
    rng, board, out = random.Random(seed), chess.Board(), []
    for _ in range(n):
        if board.is_game_over():
            board = chess.Board()
        fen, moves = board.fen(), sorted(m.uci() for m in board.legal_moves)[:5]
        evals = " ".join(f"0.{k}" for k in range(len(moves)))
        out.append(f"P: {fen} M: {' '.join(moves)} E: {evals} B: {moves[0]}")
        move = rng.choice(list(board.legal_moves))
        board.push(move)
        out.append(f"A: {fen}+{move.uci()}+{move.uci()}+{board.fen()}+0.001+0+0")
    return out


TEXTS = chess_texts()


def tiny_cfg(out_dir, **kw):
    from rookworld_lib.core.train_sft import SFTConfig

    base = dict(model="tiny", model_overrides=TINY_MODEL, block_size=32, batch_size=2, max_steps=6, warmup_steps=2,
                lr=3e-3, min_lr=3e-4, eval_interval=0, checkpoint_interval=2, out_dir=str(out_dir), progress=False,
                export_hf=False, deterministic=True, seed=0, device="cpu")
    return SFTConfig(**{**base, **kw})


def assert_same_parameters(a: torch.nn.Module, b: torch.nn.Module):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), f"{k} differs"


def item_reward(fn):
    """A GRPO reward function (TRL's signature, GRPOTrainer's reward_funcs) from `fn(item, completion)`:
    each row's PromptItem(task, prompt, truth) is rebuilt from the trainer's columns."""
    from rookworld_lib.core.train_grpo import PromptItem

    def reward(prompts, completions, task, truth, **_):
        return [fn(PromptItem(t, p, tr), c) for p, c, t, tr in zip(prompts, completions, task, truth)]

    reward.__name__ = getattr(fn, "__name__", "reward")
    return reward


def math_fields(records):
    keep = ("step", "loss", "eval/loss", "learning_rate", "grad_norm", "nonfinite/skipped", "nonfinite/total")
    return [{k: r.get(k) for k in keep} for r in records]


# ---- the killable child -------------------------------------------------------------------------

def start_sft_child(cfg, texts_file: Path, *, pace: float = 0.05, hold_at: int | None = None,
                    pause_in_save: tuple[int, float, Path] | None = None,
                    pause_at_pointer: tuple[int, Path] | None = None) -> WarmProcess:
    """Start `train_sft(cfg)` in a child process (same thread count as this one), warm (warm_popen)."""
    args = [sys.executable, str(CHILD), json.dumps(dataclasses.asdict(cfg)), str(texts_file),
            str(torch.get_num_threads()), "--pace", str(pace)]
    if hold_at is not None:
        args += ["--hold-at", str(hold_at)]
    if pause_in_save is not None:
        k, fraction, marker = pause_in_save
        args += ["--pause-in-save", str(k), str(fraction), str(marker)]
    if pause_at_pointer is not None:
        k, marker = pause_at_pointer
        args += ["--pause-at-pointer", str(k), str(marker)]
    return warm_popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(proc: subprocess.Popen | WarmProcess, condition, timeout: float = 180.0, poll: float = 0.005) -> None:
    """Poll until condition() holds; fail with the child's stderr if it exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if proc.poll() is not None:
            raise AssertionError(f"the child exited ({proc.returncode}) before it could be killed: "
                                 f"{proc.communicate()[1][-3000:]}")
        time.sleep(poll)
    proc.kill()
    raise AssertionError(f"timed out waiting for the child: {proc.communicate()[1][-3000:]}")


def sigkill(proc: subprocess.Popen | WarmProcess) -> None:
    """SIGKILL the child and reap it; assert that the kill (not anything else) ended it."""
    try:
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err[-3000:]


def last_step(metrics: Path) -> int:
    from rookworld_lib.core.train_utils import read_metrics

    return max((r["step"] for r in read_metrics(metrics)), default=-1) if metrics.exists() else -1


# ---- processes started warm ---------------------------------------------------------------------
#
# A fresh interpreter spends 4-6 s of a shared test machine's CPU importing the library (torch and
# torch._dynamo) before a `rookworld` command or an SFT child does anything: most of the time of
# every test that needs a real process to SIGKILL, interrupt or lock a run directory. warm_popen
# starts the same process, a process of its own with its own pid, environment, working directory,
# session, standard streams, signal handlers, atexit hooks and exit status, but forks it from a
# server that imported the library once per pytest process; the child then runs its command line as
# `python` runs it (`-m module`, `-c code` or a script), and ends as Python ends (threads joined,
# atexit functions run, streams flushed, the same exit status, an uncaught Ctrl-C re-raised as
# SIGINT). Paid once instead of per process: the imports, and the teardown of the imported modules.
# (The server imports modules and nothing more: no tokenizer is built, no engine path looked up, no
# thread started, so a child sees its own environment as a fresh interpreter would.)

WARM_MODULES = ("rookworld_lib.lab.cli", "rookworld_lib.chess.training", "rookworld_lib.chess.evaluate",
                "rookworld_lib.lab.pipeline")


class WarmProcess:
    """What subprocess.Popen returns, for a process that warm_popen started: pid, returncode
    (negative: killed by that signal), poll, wait, communicate, send_signal, terminate, kill."""

    def __init__(self, server: _WarmServer, args: list[str], pid: int, out: Path | None, err: Path | None, text: bool):
        self.args, self.pid, self.returncode = args, pid, None
        self._server, self._files, self._text = server, (out, err), text

    def poll(self) -> int | None:
        return self._exit(0.0)

    def wait(self, timeout: float | None = None) -> int:
        if self._exit(timeout) is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, timeout: float | None = None):
        self.wait(timeout)
        return tuple(None if f is None else (f.read_text(errors="replace") if self._text else f.read_bytes())
                     for f in self._files)

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def _exit(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            status = self._server.exit_status(self.pid, timeout)
            if status is not None:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


class _WarmServer:
    """`sft_helpers.py --serve WARM_MODULES`, one per pytest process: it forks a child per request and
    reports the child's pid, then its wait status, as JSON lines."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="rookworld-warm-"))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
        with open(self.dir / "server.log", "wb") as log:
            self.proc = subprocess.Popen([sys.executable, str(CHILD), "--serve", *WARM_MODULES], env=env,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        self.lock, self.changed = threading.Lock(), threading.Condition()
        self.exits: dict[int, int] = {}
        self.replies: queue.Queue = queue.Queue()
        self.n = 0
        threading.Thread(target=self._read, daemon=True).start()
        atexit.register(self.close)

    def _read(self) -> None:
        for line in self.proc.stdout:
            msg = json.loads(line)
            if "exit" in msg:
                with self.changed:
                    self.exits[msg["exit"]] = msg["status"]
                    self.changed.notify_all()
            else:
                self.replies.put(msg)
        self.replies.put({"error": "the server exited"})
        with self.changed:
            self.proc.wait()
            self.changed.notify_all()

    def spawn(self, job: dict) -> int:
        with self.lock:
            self.proc.stdin.write((json.dumps(job) + "\n").encode())
            self.proc.stdin.flush()
            reply = self.replies.get(timeout=300)  # the first one waits for the imports
        if "pid" not in reply:
            raise RuntimeError(f"warm_popen: {reply['error']}: {(self.dir / 'server.log').read_text()[-3000:]}")
        return reply["pid"]

    def exit_status(self, pid: int, timeout: float | None) -> int | None:
        with self.changed:
            self.changed.wait_for(lambda: pid in self.exits or self.proc.returncode is not None, timeout)
            if pid not in self.exits and self.proc.returncode is not None:
                raise RuntimeError(f"warm_popen: the server exited: {(self.dir / 'server.log').read_text()[-3000:]}")
            return self.exits.get(pid)

    def new_file(self, suffix: str) -> Path:
        self.n += 1
        return self.dir / f"{self.n}.{suffix}"

    def close(self) -> None:  # end of the pytest process: the server kills what is left and exits
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


_SERVER: list[_WarmServer] = []


def warm_popen(args: list[str], *, env: dict | None = None, cwd=None, stdout=None, stderr=None, text: bool = False,
               start_new_session: bool = False, sigint_default: bool = False) -> WarmProcess:
    """subprocess.Popen(args, ...) for `args` = [sys.executable, "-m", module | "-c", code | script, *argv],
    started warm (see above). stdout and stderr: subprocess.PIPE (read by communicate), DEVNULL, or None
    (the server's log). sigint_default: Ctrl-C raises KeyboardInterrupt in the child even when this
    process ignores SIGINT (a shell that started the test run in the background does), as a preexec_fn
    that restores SIG_DFL before `python` starts would."""
    if not args or args[0] != sys.executable or len(args) < 2 or (args[1] in ("-m", "-c") and len(args) < 3):
        raise ValueError(f"warm_popen runs `{sys.executable} -m MODULE|-c CODE|SCRIPT ...`, not {args!r}")
    if not _SERVER:
        _SERVER.append(_WarmServer())
    server = _SERVER[0]
    files = [server.new_file(name) if how == subprocess.PIPE else None for name, how in (("out", stdout), ("err", stderr))]
    targets = [str(f) if f is not None else os.devnull if how == subprocess.DEVNULL else None
               for f, how in zip(files, (stdout, stderr))]
    pid = server.spawn({"args": [str(a) for a in args[1:]], "env": dict(os.environ if env is None else env),
                        "cwd": str(cwd or os.getcwd()), "stdout": targets[0], "stderr": targets[1],
                        "new_session": start_new_session, "sigint_default": sigint_default})
    return WarmProcess(server, list(args), pid, files[0], files[1], text)


def _serve(modules: list[str]) -> dict | None:
    """The server's loop: import `modules`, then fork a child for each request line on stdin. Returns
    the request in a forked child (which then runs it, `_run_warm`), None in the server at EOF."""
    import importlib
    import select

    for name in modules:
        importlib.import_module(name)
    sys.stdout.flush()
    sys.stderr.flush()
    wake_r, wake_w = os.pipe()  # SIGCHLD wakes the select below
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children, pending = set(), b""

    def say(msg: dict) -> None:
        os.write(1, (json.dumps(msg) + "\n").encode())

    while True:
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            children.discard(pid)
            say({"exit": pid, "status": status})
        ready, _, _ = select.select([0, wake_r], [], [])
        if wake_r in ready:
            while True:
                try:
                    if not os.read(wake_r, 512):
                        break
                except BlockingIOError:
                    break
        if 0 not in ready:
            continue
        chunk = os.read(0, 1 << 16)
        if not chunk:  # the pytest process closed us (or died): its children go too
            for pid in children:
                os.kill(pid, signal.SIGKILL)
            return None
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            job = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                os.close(wake_r)
                os.close(wake_w)
                return job
            children.add(pid)
            say({"pid": pid})


def _run_warm(job: dict) -> None:
    """In a forked child: become the process `python *job["args"]` would be, run it, and exit. What
    it raises (SystemExit, KeyboardInterrupt, a bug) ends this process as it would end `python`."""
    import runpy
    import types

    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)  # not the server's request pipe
    for fd, target in ((1, job["stdout"]), (2, job["stderr"])):
        if target is None:  # stdout: not the server's reply pipe; stderr: the server's log
            if fd == 1:
                os.dup2(null, 1)
            continue
        f = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    os.close(null)
    if job["new_session"]:
        os.setsid()
    if job["sigint_default"]:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # what python installs where SIGINT is not ignored
    os.environ.clear()
    os.environ.update(job["env"])
    os.chdir(job["cwd"])
    args, status, interrupted = job["args"], 0, False
    try:
        if args[0] == "-m":
            sys.argv, sys.path[0] = ["-m", *args[2:]], os.getcwd()
            sys.modules.pop(args[1], None)  # as `python -m`, which has not imported it before it runs
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        elif args[0] == "-c":
            sys.argv, sys.path[0] = ["-c", *args[2:]], ""
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(args[1], "<string>", "exec"), main.__dict__)
        else:
            sys.argv, sys.path[0] = list(args), os.path.dirname(os.path.abspath(args[0]))
            runpy.run_path(args[0], run_name="__main__")
    except SystemExit as exc:  # as the interpreter reads it
        if exc.code is None or isinstance(exc.code, int):
            status = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    except BaseException as exc:  # a traceback, status 1; an uncaught Ctrl-C ends by SIGINT
        sys.excepthook(type(exc), exc, exc.__traceback__)
        status, interrupted = 1, isinstance(exc, KeyboardInterrupt)
    # What Python does at exit, but the teardown of every imported module (1.2 s with torch loaded):
    # join the threads (and run their exit hooks), run the atexit functions, flush the streams.
    import atexit
    import threading

    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status & 0xFF)


def _child_main(argv: list[str]) -> None:
    import argparse
    import io

    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("texts")
    ap.add_argument("threads", type=int)
    ap.add_argument("--pace", type=float, default=0.0)
    ap.add_argument("--hold-at", type=int, default=None)
    ap.add_argument("--pause-in-save", nargs=3, default=None)
    ap.add_argument("--pause-at-pointer", nargs=2, default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    from rookworld_lib.core import checkpoint as ck
    from rookworld_lib.core.train_sft import SFTConfig, train_sft

    def wait_to_be_killed(marker: str, step: int) -> None:
        # whole or absent: the test kills this process as soon as the marker exists
        Path(marker + ".tmp").write_text(json.dumps({"pid": os.getpid(), "step": step}))
        os.replace(marker + ".tmp", marker)
        time.sleep(3600)

    if a.pause_in_save:
        k, fraction, marker = int(a.pause_in_save[0]), float(a.pause_in_save[1]), a.pause_in_save[2]
        real_save, calls = torch.save, [0]

        def torn_save(obj, f, *args, **kwargs):
            calls[0] += 1
            if calls[0] < k:
                return real_save(obj, f, *args, **kwargs)
            buf = io.BytesIO()
            real_save(obj, buf, *args, **kwargs)
            data = buf.getvalue()
            f.write(data[: int(len(data) * fraction)])  # part of the checkpoint is on disk...
            f.flush()
            os.fsync(f.fileno())
            wait_to_be_killed(marker, int(obj["step"]))  # ...when the SIGKILL comes

        ck.torch.save = torn_save
    if a.pause_at_pointer:
        k, marker = int(a.pause_at_pointer[0]), a.pause_at_pointer[1]
        real_write, calls = ck.atomic_write, [0]

        def slow_pointer(path, write):
            if os.path.basename(path) == ck.POINTER:
                calls[0] += 1
                if calls[0] >= k:
                    buf = io.BytesIO()
                    write(buf)
                    # the new file is whole; `latest` still names the old one
                    wait_to_be_killed(marker, json.loads(buf.getvalue())["step"])
            return real_write(path, write)

        ck.atomic_write = slow_pointer

    def pace(rec):
        if a.hold_at is not None and rec["step"] >= a.hold_at:
            time.sleep(3600)
        time.sleep(a.pace)

    texts = json.loads(Path(a.texts).read_text())
    train_sft(SFTConfig(**json.loads(a.config)), train_texts=texts, on_step=pace)


if __name__ == "__main__":
    sys.path.insert(0, str(CHILD.parent.parent))
    if sys.argv[1:2] == ["--serve"]:
        job = _serve(sys.argv[2:])
        if job is not None:  # a forked child
            _run_warm(job)
    else:
        _child_main(sys.argv[1:])
