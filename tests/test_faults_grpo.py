"""GRPO's faults, end to end through `rookworld grpo` (issue 28, items 5, 7 and 9).

- `--deterministic` reruns are bit-identical even where two processes would time the decode threads
  differently (the source of the CPU nondeterminism: a float sum splits differently over 1 and 2 threads);
- a GRPO run SIGKILLed at random points and resumed each time ends bit-identical to an uninterrupted one;
- every checkpoint is written only after the metrics it covers are fsynced; a power cut that tears the
  metrics file is reported on resume (file:line, and whether a record the checkpoint covers is lost);
- a full disk while appending metrics names the metrics file.

`_child_main` is the child that the kill test SIGKILLs (forked: see forked_child.py); run as a script,
this file is the same child:

    python tests/test_faults_grpo.py PACE HOLD_AT ROOKWORLD_ARGV...

it runs `rookworld ROOKWORLD_ARGV` on one intra-op thread, sleeping PACE seconds after each step's record
(so a kill can land anywhere in a step or its checkpoint) and for good once step HOLD_AT is logged.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from sft_helpers import last_step, one_thread, sigkill, wait_for  # noqa: F401

from rookworld_lib.chess import data
from rookworld_lib.core import checkpoint as ck
from rookworld_lib.core import paths, sampling
from rookworld_lib.core.model import GPT, GPTConfig
from rookworld_lib.core.train_utils import read_metrics
from rookworld_lib.lab.cli import main

pytestmark = pytest.mark.fault
HEAVY = os.environ.get("ROOKWORLD_HEAVY") == "1"
METRICS = "grpo_metrics.jsonl"


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    """A tiny GPT-2 export and a data directory of 4 P: and 4 A: records."""
    root = tmp_path_factory.mktemp("grpo")
    torch.manual_seed(0)
    GPT(GPTConfig.preset("tiny", n_layer=1, n_embd=32, n_head=2, block_size=128)).save_pretrained(root / "hf")
    (root / "data").mkdir()
    for task, name in (("P", "policy"), ("A", "env")):
        recs = data.load_split(task, "train").records[:4]
        (root / "data" / f"{name}_train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return {"hf": root / "hf", "data": root / "data"}


def grpo_argv(world: dict, out: Path, steps: int, *extra: str) -> list[str]:
    """A deterministic GRPO run of the tiny model that checkpoints every step; the entropy bonus gives
    every step a gradient even when all rewards of a group tie (an untrained model's answers do)."""
    return ["grpo", "--init-from", str(world["hf"]), "--data-dir", str(world["data"]), "--out", str(out),
            "--layout", "compact", "--steps", str(steps), "--prompts-per-step", "2", "--group-size", "2",
            "--max-new-tokens", "8", "--minibatch-size", "2", "--lr", "1e-2", "--entropy-coef", "0.05",
            "--checkpoint-interval", "1", "--deterministic", "--report-to", "none", "--device", "cpu",
            "--no-progress", *extra]


def assert_same_export(a: Path, b: Path) -> None:
    wa, wb = load_file(a / "final" / "model.safetensors"), load_file(b / "final" / "model.safetensors")
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), f"{k} differs"


def math_fields(path: Path) -> list[dict]:
    keep = ("step", "loss", "grad_norm", "learning_rate", "reward", "entropy", "nonfinite/total")
    return [{k: r.get(k) for k in keep} for r in read_metrics(path)]


# =====================================================================================
# Item 5: reproducible GRPO on CPU
# =====================================================================================

def test_deterministic_reruns_agree_where_processes_would_time_decode_threads_differently(world, tmp_path,
                                                                                         monkeypatch):
    """Without --deterministic each process times 1 against torch's threads for small decode steps and
    keeps the faster: a float sum splits differently over 1 and 2 threads, so runs of one command on one
    machine sampled log-probs ~1e-6 apart and ended apart (a GPT-2 124M or cpu-small). Here the timing
    would answer 1 in the first run and 2 in the second: --deterministic must not ask it."""
    torch.set_num_threads(2)  # as on a 2-core machine (one_thread sets 1 back)
    timed = []
    for out, fastest in ((tmp_path / "a", 1), (tmp_path / "b", 2)):
        monkeypatch.setattr(sampling, "_DECODE_THREADS", {})  # a fresh process
        monkeypatch.setattr(sampling, "_faster_threads", lambda *a, fastest=fastest: timed.append(fastest) or fastest)
        assert main(grpo_argv(world, out, 2)) == 0
    assert timed == []
    assert_same_export(tmp_path / "a", tmp_path / "b")
    assert math_fields(tmp_path / "a" / METRICS) == math_fields(tmp_path / "b" / METRICS)


def kill_and_resume(world: dict, tmp_path: Path, kills: int, steps: int, seed: int) -> None:
    """SIGKILL a `rookworld grpo` child `kills` times at random points (in sampling, the update, the
    metrics or a checkpoint write: every step checkpoints), run the same command again each time, and
    compare the end with an uninterrupted run's, bit for bit."""
    rng, run = random.Random(seed), tmp_path / "run"
    argv, metrics = grpo_argv(world, run, steps), run / METRICS
    log = []
    for _ in range(kills):
        target = min(last_step(metrics) + rng.randint(1, 2), steps - 1)
        proc = subprocess_child(argv, pace=rng.uniform(0.0, 0.05), hold_at=steps - 1)
        wait_for(proc, lambda: last_step(metrics) >= target)
        time.sleep(rng.uniform(0.0, 0.05))
        sigkill(proc)
        latest = ck.latest_checkpoint(run / "checkpoints")
        log.append((last_step(metrics), None if latest is None else ck.load_checkpoint(latest)["step"]))
    assert log[-1][1] is not None, log  # the run got somewhere between kills
    assert main(argv) == 0  # the last resume finishes
    assert main(grpo_argv(world, tmp_path / "ref", steps)) == 0
    assert_same_export(run, tmp_path / "ref")
    assert [r["step"] for r in read_metrics(metrics)] == list(range(1, steps + 1))  # nothing lost, nothing doubled
    assert math_fields(metrics) == math_fields(tmp_path / "ref" / METRICS)
    print("kills (last step logged, checkpoint step):", log)


def subprocess_child(argv: list[str], pace: float, hold_at: int):
    """_child_main in a child process, forked from a server that has torch and the library imported
    (forked_child.ForkedChild, a Popen look-alike: a fresh interpreter spent ~4 s on imports per kill)."""
    from forked_child import ForkedChild

    return ForkedChild(_child_main, [str(pace), str(hold_at), *argv])


def test_sigkill_grpo_three_times_then_bit_identical(world, tmp_path):
    kill_and_resume(world, tmp_path, kills=3, steps=5, seed=20261126)


@pytest.mark.heavy
@pytest.mark.skipif(not HEAVY, reason="heavy: set ROOKWORLD_HEAVY=1")
def test_heavy_sigkill_grpo_twelve_times(world, tmp_path):
    kill_and_resume(world, tmp_path, kills=12, steps=14, seed=7)


# =====================================================================================
# Item 7: what a checkpoint covers is on disk; a torn metrics file is reported
# =====================================================================================

def test_each_checkpoint_is_written_after_its_metrics_are_fsynced(world, tmp_path, monkeypatch):
    run = tmp_path / "run"
    synced: dict[str, int] = {}  # file -> its size at its latest fsync
    real_fsync, real_save = os.fsync, ck.save_checkpoint

    def fsync(fd):
        real_fsync(fd)
        synced[os.readlink(f"/proc/self/fd/{fd}")] = os.fstat(fd).st_size

    def save_checkpoint(directory, state, **kw):
        on_disk = (run / METRICS).stat().st_size
        assert synced.get(str(run / METRICS)) == on_disk, f"step {state['step']}: metrics not fsynced"
        assert last_step(run / METRICS) == state["step"]
        return real_save(directory, state, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(ck, "save_checkpoint", save_checkpoint)
    assert main(grpo_argv(world, run, 3)) == 0
    assert ck.load_checkpoint(run / "checkpoints")["step"] == 3


def test_a_power_cut_that_tears_the_metrics_is_reported_on_resume(world, tmp_path, caplog):
    """A power cut that took the metrics back to the middle of step 2's line while the checkpoint of
    step 3 survived (what an fsync every 64 lines allowed): the resume says which records are lost."""
    run = tmp_path / "run"
    assert main(grpo_argv(world, run, 3)) == 0
    lines = (run / METRICS).read_bytes().split(b"\n")
    (run / METRICS).write_bytes(lines[0] + b"\n" + lines[1][:40])
    caplog.set_level(logging.WARNING)
    assert main(grpo_argv(world, run, 4)) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (f"{run / METRICS}:2: a torn line (cut off by a kill or a power cut) dropped; the record of step 2 is "
            "lost (the checkpoint at step 3 covers it; the run resumes after it)") in warnings, warnings
    assert (f"{run / METRICS}: the record of step 3 is missing: lost, though the checkpoint at step 3 "
            "covers it") in warnings, warnings
    assert [r["step"] for r in read_metrics(run / METRICS)] == [1, 4]


def test_a_metrics_record_deleted_in_the_middle_is_reported_on_resume(world, tmp_path, caplog):
    """Not only a lost tail: a line gone from the middle (steps 1 and 3 kept, the checkpoint at 3) is named."""
    run = tmp_path / "run"
    assert main(grpo_argv(world, run, 3)) == 0
    lines = (run / METRICS).read_text().splitlines(keepends=True)
    (run / METRICS).write_text(lines[0] + lines[2])
    caplog.set_level(logging.WARNING)
    assert main(grpo_argv(world, run, 4)) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (f"{run / METRICS}: the record of step 2 is missing: lost, though the checkpoint at step 3 "
            "covers it") in warnings, warnings
    assert [r["step"] for r in read_metrics(run / METRICS)] == [1, 3, 4]


def test_a_torn_metrics_line_after_the_checkpoint_is_reported_and_redone(world, tmp_path, caplog):
    run = tmp_path / "run"
    assert main(grpo_argv(world, run, 3)) == 0
    (run / "checkpoints" / "step_00000003.pt").unlink()  # a kill before step 3's checkpoint named it
    (run / "checkpoints" / ck.POINTER).unlink()
    text = (run / METRICS).read_bytes()
    (run / METRICS).write_bytes(text[:len(text) - 30])
    caplog.set_level(logging.WARNING)
    assert main(grpo_argv(world, run, 3)) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert (f"{run / METRICS}:3: a torn line (cut off by a kill or a power cut) dropped; step 3, after the "
            "checkpoint at step 2, is redone") in warnings, warnings
    assert not [w for w in warnings if "lost" in w], warnings
    assert [r["step"] for r in read_metrics(run / METRICS)] == [1, 2, 3]


# =====================================================================================
# Item 9: a full disk while appending metrics names the file
# =====================================================================================

def test_a_full_disk_while_appending_metrics_names_the_metrics_file(world, tmp_path, monkeypatch, capsys):
    """The disk fills during step 2's metrics line: the kernel's ENOSPC names no file; the message must."""
    run = tmp_path / "run"
    real_init = paths.JsonlAppender.__init__

    class Full:
        def __init__(self, f):
            self.f, self.lines = f, 0

        def write(self, data):
            self.lines += 1
            if self.lines > 1:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

    def init(self, path, **kw):
        real_init(self, path, **kw)
        if Path(path).name == METRICS:
            self._fh = Full(self._fh)

    monkeypatch.setattr(paths.JsonlAppender, "__init__", init)
    assert main(grpo_argv(world, run, 3)) == 1
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith(("layout: ", "sampling over "))]
    assert err == [f"rookworld grpo: error: No space left on device: {run / METRICS}; free some space (or choose "
                   "another --out) and run the same command again"], err
    assert ck.load_checkpoint(run / "checkpoints")["step"] == 1  # what was written survives
    assert [r["step"] for r in read_metrics(run / METRICS)] == [1]


def _child_main(argv: list[str]) -> None:
    from rookworld_lib.core.trainer import Trainer

    pace, hold_at = float(argv[0]), int(argv[1])
    torch.set_num_threads(1)
    real_record = Trainer.record

    def record(self, metrics, rec):
        rec = real_record(self, metrics, rec)
        time.sleep(3600 if rec["step"] >= hold_at else pace)  # the run never finishes before the kill
        return rec

    Trainer.record = record
    sys.exit(main(argv[2:]))


if __name__ == "__main__":
    _child_main(sys.argv[1:])
