"""Shared pieces of the SFT tests: tiny chess texts and configs, and a killable SFT child process.

Imported by test_train_sft.py, test_train_sft_distributed.py and test_faults.py. `_child_main` is the
child that those tests SIGKILL (started by start_sft_child, forked: see forked_child.py); run as a
script, it is the same child:

    python tests/sft_helpers.py CONFIG.json TEXTS.json THREADS [--pace S] [--hold-at STEP]
                                [--pause-in-save K FRACTION MARKER] [--pause-at-pointer K MARKER]

--pace sleeps S seconds after every step (so a kill can land anywhere in a step, its eval or its
checkpoint); --hold-at sleeps for good once STEP is done (the run cannot finish before the
kill); --pause-in-save stops inside the K-th checkpoint write of this process, after FRACTION of
the file's bytes are on disk, writes MARKER ({"pid", "step"}: the step being saved) and waits to be
killed; --pause-at-pointer does the same after the K-th checkpoint file is complete but before the
`latest` pointer names it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import chess
import pytest
import torch

from rookworld_lib.core.tokenizer import get_tokenizer

TINY_MODEL = {"n_layer": 1, "n_embd": 32, "n_head": 2, "block_size": 64}
CHILD = Path(__file__).resolve()
get_tokenizer()  # built once: ForkedChild's server imports this module, so every child it forks has it


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
                export_hf=False, deterministic=True, seed=0, device="cpu", task_weights={"P": 0.5, "A": 0.5})
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
                    pause_at_pointer: tuple[int, Path] | None = None):
    """Start `train_sft(cfg)` in a child process (same thread count as this one): _child_main, forked
    from a server that has torch and the library imported (forked_child.ForkedChild, a Popen look-alike)."""
    from forked_child import ForkedChild

    args = [json.dumps(dataclasses.asdict(cfg)), str(texts_file), str(torch.get_num_threads()), "--pace", str(pace)]
    if hold_at is not None:
        args += ["--hold-at", str(hold_at)]
    if pause_in_save is not None:
        k, fraction, marker = pause_in_save
        args += ["--pause-in-save", str(k), str(fraction), str(marker)]
    if pause_at_pointer is not None:
        k, marker = pause_at_pointer
        args += ["--pause-at-pointer", str(k), str(marker)]
    return ForkedChild(_child_main, args)


def wait_for(proc: subprocess.Popen, condition, timeout: float = 180.0, poll: float = 0.005) -> None:
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


def sigkill(proc: subprocess.Popen) -> None:
    """SIGKILL the child and reap it; assert that the kill (not anything else) ended it."""
    try:
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, err[-3000:]


def last_step(metrics: Path) -> int:
    from rookworld_lib.core.train_utils import read_metrics

    return max((r["step"] for r in read_metrics(metrics)), default=-1) if metrics.exists() else -1


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
    _child_main(sys.argv[1:])
