"""The fault and bad-input suite, end to end (`make test-fault`, or `pytest -m fault`).

What each test breaks, and what must survive it:
- SIGKILL of an SFT process 5 times, at random points, in a checkpoint write and before the
  `latest` pointer names a new checkpoint too: each resume continues from the latest whole
  checkpoint and the final parameters equal an uninterrupted run's bit for bit;
- a Stockfish process killed in the middle of a GRPO step: the step completes with every reward,
  each equal to the reward a healthy engine gives;
- a broken Stockfish (exits at once, prints garbage, never answers `go`; fake engines written by
  the tests): a reward that needs it raises EngineFailedError within seconds, never a score;
  datagen ends in one line; Ctrl-C ends datagen and a parallel search at once, engines included;
- malformed data lines: `file:line: reason` from the loader and the CLIs, or skipped and counted;
- a missing Stockfish, a missing or corrupt tokenizer rank file: one message naming the fix, no
  traceback, from each CLI (and a clear exception from the library);
- notebook parameters of the wrong type or range: papermill stops in the check cell, naming the field;
- a NaN in the loss or in the gradients (SFT and GRPO): the update is skipped and counted, the
  run goes on;
- a full disk while checkpointing (ENOSPC, simulated): the previous checkpoint stays whole and
  the latest, the CLI says so in one line, and the run resumes from it bit for bit;
- the rewards fuzzed with 10,000 random and mutated completions (a million when heavy): never an exception, always a
  finite value in the documented ranges (a garbled prompt whose position no longer matches the
  truth passed with it gives the documented TruthError, counted).

Heavier variants (more kills, a killed torchrun job, a million fuzzed completions) are marked
`heavy` and run only with ROOKWORLD_HEAVY=1. Every process here uses one intra-op thread.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from forked_child import ForkedChild, cli_main
from helpers_chess import engine_pids, needs_stockfish, wait_gone
from sft_helpers import (TEXTS, TINY_MODEL, assert_same_parameters, item_reward, last_step, math_fields,  # noqa: F401
                         one_thread, sigkill, start_sft_child, tiny_cfg, wait_for)

from rookworld_lib.core import checkpoint as ck
from rookworld_lib.core.errors import ERRORS_DIR_ENV
from rookworld_lib.lab.cli import main
from rookworld_lib.chess import data, datagen, engine, reward_examples, rewards
from rookworld_lib.core import grpo
from rookworld_lib.chess import training
from rookworld_lib.core import train_grpo as tg
from rookworld_lib.core import train_step
from rookworld_lib.core.model import GPT, GPTConfig
from rookworld_lib.core.train_sft import SFTTrainer, train_sft
from rookworld_lib.core.train_utils import read_metrics

pytestmark = pytest.mark.fault
ROOT = Path(__file__).resolve().parent.parent
HEAVY = os.environ.get("ROOKWORLD_HEAVY") == "1"


def child_env(**extra) -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path), **extra}


# =====================================================================================
# SIGKILL during training and during checkpoint writes
# =====================================================================================

KILL_KW = dict(max_steps=14, grad_accum=2, model_overrides={**TINY_MODEL, "dropout": 0.1}, checkpoint_interval=2,
               eval_interval=4, eval_steps=1)


def kill_and_resume(tmp_path: Path, kills: int, seed: int, **kw) -> None:
    """Kill an SFT child `kills` times at random points (some inside a checkpoint write, some
    between the new file and its `latest` pointer), resume each time, and compare with a run
    that was never killed."""
    rng = random.Random(seed)
    cfg = tiny_cfg(tmp_path / "run", **kw)
    ckpt_dir, metrics = Path(cfg.out_dir) / "checkpoints", Path(cfg.out_dir) / "metrics.jsonl"
    texts_file = tmp_path / "texts.json"
    texts_file.write_text(json.dumps(TEXTS))
    modes = ["save", "pointer"] + [rng.choice(["step", "step", "save"]) for _ in range(kills - 2)]
    rng.shuffle(modes)
    hold = cfg.max_steps - 1  # the child never finishes before it is killed
    log = []
    for i, mode in enumerate(modes):
        before = ck.latest_checkpoint(ckpt_dir)
        marker = tmp_path / f"paused-{i}"
        if mode == "step":  # anywhere: forward, backward, eval, metrics, a checkpoint write
            target = min(last_step(metrics) + rng.randint(1, 3), hold)
            proc = start_sft_child(cfg, texts_file, pace=rng.uniform(0.0, 0.04), hold_at=hold)
            wait_for(proc, lambda: last_step(metrics) >= target)
            time.sleep(rng.uniform(0.0, 0.06))
        elif mode == "save":  # in the middle of writing the checkpoint file
            fraction = rng.uniform(0.02, 0.98)
            proc = start_sft_child(cfg, texts_file, pace=0.0, hold_at=hold,
                                   pause_in_save=(rng.randint(1, 2), fraction, marker))  # the next save, or the one after
            wait_for(proc, marker.exists)
        else:  # the new checkpoint file is whole, the `latest` pointer does not name it yet
            proc = start_sft_child(cfg, texts_file, pace=0.0, hold_at=hold, pause_at_pointer=(rng.randint(1, 2), marker))
            wait_for(proc, marker.exists)
        sigkill(proc)
        latest = ck.latest_checkpoint(ckpt_dir)
        latest_step = None if latest is None else ck.load_checkpoint(ckpt_dir)["step"]
        if mode == "save":
            paused = json.loads(marker.read_text())["step"]  # the step whose save was killed
            assert [p for p in os.listdir(ckpt_dir) if p.startswith(".tmp-")], "no torn temporary file"
            assert latest_step is None or latest_step < paused  # a resume never reads the torn save
        if mode == "pointer":
            paused = json.loads(marker.read_text())["step"]
            assert ck.load_checkpoint(ck.checkpoint_path(ckpt_dir, paused))["step"] == paused  # whole, not yet named
            if (ckpt_dir / ck.POINTER).exists():
                assert latest_step < paused  # `latest` still names the previous checkpoint
            else:  # the first save ever: with no pointer, the highest whole file is the latest
                assert before is None and latest_step == paused
        log.append((mode, last_step(metrics), latest_step))  # (the latest checkpoint always loads: it is whole)
    assert log[-1][2] is not None and log[-1][2] >= 2, log  # the run did get somewhere between kills

    resumed = SFTTrainer(cfg, train_texts=TEXTS)
    assert resumed.step == log[-1][2]
    resumed.train()
    assert not [p for p in os.listdir(ckpt_dir) if p.startswith(".tmp-")]  # the next save cleaned up
    reference = train_sft(tiny_cfg(tmp_path / "ref", **kw), train_texts=TEXTS)
    assert_same_parameters(reference.model, resumed.model)
    records = read_metrics(metrics)
    assert [r["step"] for r in records] == list(range(cfg.max_steps + 1))  # nothing lost, nothing doubled
    assert math_fields(records) == math_fields(read_metrics(tmp_path / "ref" / "metrics.jsonl"))
    print("kills (mode, last step logged, checkpoint resumed from):", log)


def test_sigkill_five_times_incl_during_checkpoint_writes_then_bit_identical(tmp_path):
    kill_and_resume(tmp_path, kills=5, seed=20261122, **KILL_KW)


@pytest.mark.heavy
@pytest.mark.skipif(not HEAVY, reason="heavy: set ROOKWORLD_HEAVY=1")
def test_heavy_sigkill_twenty_times(tmp_path):
    kill_and_resume(tmp_path, kills=20, seed=7, **{**KILL_KW, "max_steps": 60})


def descendants(pid: int) -> list[int]:
    """Every live descendant of a process (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def test_a_sigkilled_nproc_launcher_takes_torchrun_and_its_workers_with_it(tmp_path):
    """`kill -9` of `rookworld sft --nproc 2` used to orphan torchrun and both workers, which kept
    writing into the out_dir; now they are gone within seconds, and so is the launcher's folder in /tmp."""
    data_file = tmp_path / "train.jsonl"
    data_file.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    args = ["--train-data", str(data_file), "--model", "tiny", "--block-size", "32", "--batch-size", "2",
            "--max-steps", "100000", "--warmup-steps", "1", "--checkpoint-interval", "1", "--eval-interval", "0",
            "--val-fraction", "0", "--device", "cpu", "--no-progress", "--out", str(tmp_path / "run")]
    proc = ForkedChild(cli_main, ["sft", "--nproc", "2", *args], env=child_env())  # the launcher: `rookworld sft ...`
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and last_step(metrics) < 2 and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    workers = descendants(proc.pid)
    assert len(workers) >= 3, workers  # torchrun and its two workers
    env = dict(v.split("=", 1) for v in Path(f"/proc/{workers[-1]}/environ").read_text().split("\0") if "=" in v)
    errors_dir = Path(env[ERRORS_DIR_ENV])  # the launcher's temporary directory, which a SIGKILL used to leave behind
    proc.kill()  # the launcher only, as `kill -9 <pid>` does
    proc.wait(60)
    assert wait_gone(workers, timeout=60) == [], "torchrun or a worker outlived its launcher"
    step = last_step(metrics)
    time.sleep(1.0)
    assert last_step(metrics) == step  # nothing writes into the out_dir any more
    # no worker failed: each one that torchrun's SIGTERM reached ended its step and saved it
    assert ck.latest_checkpoint(tmp_path / "run" / "checkpoints").name == f"step_{step:08d}.pt"
    assert not errors_dir.exists(), "torchrun left the dead launcher's folder in /tmp"


@pytest.mark.parametrize("victim", ["torchrun", pytest.param("worker", marks=[  # 16 s more: heavy
    pytest.mark.heavy, pytest.mark.skipif(not HEAVY, reason="heavy: set ROOKWORLD_HEAVY=1")])])
def test_a_sigkilled_torchrun_or_worker_is_named_in_one_line_and_leaves_no_worker_running(tmp_path, victim):
    """`kill -9` of torchrun (the elastic agent) left both workers training to the end, writing the
    out_dir after the command had returned; `kill -9` of a worker (the OOM killer) was never named:
    "torchrun exited with status 137; the workers' output above says why" with nothing above, or a
    peer's gloo message cut mid-word. Now the workers die with torchrun, and the line names what died."""
    data_file = tmp_path / "train.jsonl"
    data_file.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    args = ["--train-data", str(data_file), "--model", "tiny", "--block-size", "32", "--batch-size", "2",
            "--max-steps", "100000", "--warmup-steps", "1", "--checkpoint-interval", "1", "--eval-interval", "0",
            "--val-fraction", "0", "--device", "cpu", "--no-progress", "--out", str(tmp_path / "run")]
    proc = subprocess.Popen([sys.executable, "-m", "rookworld_lib.lab.cli", "sft", "--nproc", "2", *args],
                            env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "run" / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and last_step(metrics) < 2 and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    torchrun, *workers = descendants(proc.pid)
    os.kill(torchrun if victim == "torchrun" else workers[-1], signal.SIGKILL)
    err = proc.communicate(timeout=120)[1]
    assert wait_gone(workers, timeout=60) == [], "a worker outlived torchrun"
    step = last_step(metrics)
    time.sleep(1.0)
    assert last_step(metrics) == step and not (tmp_path / "run" / "final").exists()  # nothing writes any more
    lines = [line for line in err.splitlines() if line.startswith("rookworld sft: error")]
    want = (r"torchrun was killed by SIGKILL; its workers stop with it" if victim == "torchrun" else
            r"worker rank [01] was killed by SIGKILL \(out of memory\? the kernel's OOM killer sends it\); the same "
            r"command resumes from the latest checkpoint$")
    assert proc.returncode == 1 and len(lines) == 1 and re.search(want, lines[0]), err[-3000:]


def test_a_really_full_disk_under_nproc_2_is_said_once_in_one_line(tmp_path):
    """Not simulated: `rookworld sft --nproc 2` into a 400 kB tmpfs, which the first checkpoint fills.
    Both workers fail to write it; the launcher says so once, in one line naming the file, exit 1."""
    data_file = tmp_path / "train.jsonl"
    data_file.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    full = tmp_path / "full"
    full.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(full)], capture_output=True).returncode:
        pytest.skip("mounting a small tmpfs needs root (CAP_SYS_ADMIN)")
    try:
        args = ["--train-data", str(data_file), "--model", "tiny", "--block-size", "32", "--batch-size", "2",
                "--max-steps", "3", "--warmup-steps", "0", "--eval-interval", "0", "--val-fraction", "0",
                "--device", "cpu", "--no-progress", "--out", str(full / "run")]
        done = subprocess.run([sys.executable, "-m", "rookworld_lib.lab.cli", "sft", "--nproc", "2", *args],
                              env=child_env(), capture_output=True, text=True, timeout=300)
    finally:
        subprocess.run(["umount", "-l", str(full)], check=True)
    lines = [line for line in done.stderr.splitlines() if line.startswith("rookworld sft: ")]
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert len(lines) == 1 and "No space left on device" in lines[0], done.stderr[-3000:]
    assert f"could not save checkpoint {full / 'run' / 'checkpoints'}" in lines[0], lines


@pytest.mark.heavy
@pytest.mark.skipif(not HEAVY, reason="heavy: set ROOKWORLD_HEAVY=1")
def test_heavy_sigkill_a_torchrun_job_then_resume_at_world_size_1_and_2(tmp_path):
    """SIGKILL a 2-process `rookworld sft --nproc 2` job (launcher and workers), then resume the
    same out_dir with 2 processes, and a copy of it with 1: both end within 1e-5 of a 1-process run."""
    data_file = tmp_path / "train.jsonl"
    data_file.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    args = ["--train-data", str(data_file), "--model", "tiny", "--block-size", "32", "--batch-size", "4",
            "--max-steps", "30", "--warmup-steps", "1", "--lr", "5e-4", "--min-lr", "5e-5", "--checkpoint-interval", "2",
            "--eval-interval", "0", "--val-fraction", "0", "--deterministic", "--device", "cpu", "--no-progress"]
    run = tmp_path / "two"
    cmd = [sys.executable, "-m", "rookworld_lib.lab.cli", "sft", "--nproc", "2", *args, "--out", str(run)]
    proc = subprocess.Popen(cmd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and last_step(metrics) < 6 and proc.poll() is None:
        time.sleep(0.005)
    assert proc.poll() is None, proc.communicate()[1][-3000:]
    victims = [proc.pid, *descendants(proc.pid)]  # torchrun starts its workers in sessions of their own
    assert len(victims) >= 3, victims
    for pid in victims:  # the launcher and both workers, at once
        os.kill(pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    assert last_step(metrics) < 30
    shutil.copytree(run, tmp_path / "one")
    for out, nproc in ((run, ["--nproc", "2"]), (tmp_path / "one", [])):
        done = subprocess.run([sys.executable, "-m", "rookworld_lib.lab.cli", "sft", *nproc, *args, "--out", str(out)],
                              env=child_env(), capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
    ref = tmp_path / "ref"
    assert training.sft_cli([*args, "--out", str(ref)]) == 0
    want = ck.load_checkpoint(ref / "checkpoints")["model"]
    for out in (run, tmp_path / "one"):
        got = ck.load_checkpoint(out / "checkpoints")["model"]
        worst = max((want[k] - got[k]).abs().max().item() for k in want)
        print(f"{out.name}: max |difference| to 1 process = {worst:.2e}")
        assert worst <= 1e-5, worst


# =====================================================================================
# A Stockfish process killed in the middle of a GRPO step
# =====================================================================================

def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


class EngineKiller(threading.Thread):
    """Kills engines of `pool` while they search (state R in /proc), up to `limit` times; on
    request (`kill_now`) it kills whichever engine is alive, so a kill lands in every step."""

    def __init__(self, pool, limit: int):
        super().__init__(daemon=True)
        self.pool, self.limit = pool, limit
        self.killed: list[tuple[int, str]] = []  # (pid, "searching" | "idle")
        self.armed, self.stop, self.now, self.done_now = threading.Event(), threading.Event(), threading.Event(), \
            threading.Event()

    def _kill(self, pid: int, how: str) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
            self.killed.append((pid, how))
        except ProcessLookupError:
            pass

    def run(self):
        self.armed.wait()
        while not self.stop.is_set() and len(self.killed) < self.limit:
            if self.now.is_set():
                for pid in engine_pids(self.pool)[:1]:
                    self._kill(pid, "idle")
                self.now.clear()
                self.done_now.set()
            for pid in engine_pids(self.pool):
                if _state(pid) == "R" and len(self.killed) < self.limit:
                    self._kill(pid, "searching")
            time.sleep(0.0005)
        self.done_now.set()


@needs_stockfish
def test_engine_killed_mid_grpo_step_every_reward_arrives():
    """GRPO with the default chess reward and live Stockfish (no ground truth with the prompts).

    The random tiny model writes garbage, which the reward would score -1 right after the truth
    lookup; so that the rewards exercise more of the engine (best-move checks, searches restricted
    to a move outside the candidates), each completion is swapped for a perturbed real answer
    before it reaches the chess reward (training.chess_reward).
    """
    val = [r for r in data.load_split("P", "val") if r["n_legal"] > 5][:4]
    by_prompt = {r["prompt"]: r for r in val}
    items = [tg.PromptItem("P", r["prompt"], None) for r in val]  # truth=None: Stockfish is the truth
    answers = {}

    def answer(item, completion) -> str:
        key = (item.prompt, completion, len(answers))
        rng = random.Random(hash(key) & 0xFFFF)
        r = by_prompt[item.prompt]
        kind = len(answers) % 4
        if kind == 0:
            text = r["completion"]
        elif kind == 1:
            import chess
            board = chess.Board(r["fen"])
            other = sorted(m.uci() for m in board.legal_moves if m.uci() not in r["moves"])[0]
            text = r["completion"].rsplit("B:", 1)[0] + f"B: {other}"  # a legal move outside the candidates
        elif kind == 2:
            text = reward_examples.mutate_text(r["completion"], rng, edits=2)
        else:
            text = completion
        answers[len(answers)] = (item.prompt, text)
        return text

    pool = engine.get_pool()
    rewards.clear_truth()
    rewards.clear_cache(analyses=True)  # every truth comes from a search in this step
    killer = EngineKiller(pool, limit=3)
    killer.start()
    calls = {"n": 0}

    def reward_fn(item, completion):
        calls["n"] += 1
        killer.armed.set()
        if calls["n"] == 5 and not killer.killed:  # none caught searching yet: kill one between searches
            killer.now.set()
            killer.done_now.wait(10)
        return training.chess_reward([item.prompt], [answer(item, completion)], truth=[item.truth])[0]

    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", n_layer=1, n_embd=32, n_head=2, block_size=128))
    cfg = tg.GRPOTrainConfig(steps=1, prompts_per_step=4, group_size=2, max_new_tokens=4,
                             minibatch_size=8, lr=1e-3, progress=False, seed=0)
    trainer = tg.GRPOTrainer(model, items, cfg, reward_funcs=item_reward(reward_fn))
    restarts = pool.restarts
    try:
        record = trainer.train_step()
    finally:
        killer.stop.set()
        killer.join(10)
    assert killer.killed, "no engine was killed during the step"
    assert pool.restarts > restarts  # a search met a dead engine and was retried on a fresh one
    batch = trainer.last_batch
    assert len(batch.rewards) == 8 and torch.isfinite(batch.rewards).all()
    assert record["step"] == 1 and math.isfinite(record["reward"])
    # every reward is the one a healthy engine gives
    with engine.EnginePool(engine.EngineSettings(), size=1, cache=False) as fresh:
        for i, (prompt, text) in enumerate(answers.values()):
            want = rewards.score_policy_detailed(prompt, text, engine=fresh, cache=False)
            assert batch.rewards[i].item() == pytest.approx(want.total, abs=1e-6), (i, text)
            assert want.truth_source == "engine"
    assert len({round(x, 4) for x in batch.rewards.tolist()}) > 2  # rewards that mean something
    print("engines killed:", killer.killed, "restarts:", pool.restarts - restarts)


# =====================================================================================
# A broken Stockfish: exits at once, speaks garbage, never answers `go`
# =====================================================================================

FAKE_ENGINES = {
    "exits at once": "sys.exit(3)",
    "prints garbage": "for line in sys.stdin:\n    print('?? no comprendo ??', flush=True)",
    "never answers go": """
OPTIONS = ("Threads", "Hash", "MultiPV")
for line in sys.stdin:
    cmd = line.split()[0] if line.split() else ""
    if cmd == "uci":
        print("id name FakeHang", *(f"option name {o} type spin default 1 min 1 max 1024" for o in OPTIONS),
              "uciok", sep="\\n", flush=True)
    elif cmd == "isready":
        print("readyok", flush=True)
    elif cmd == "go" and os.environ.get("FAKE_ENGINE_MARKER"):
        open(os.path.join(os.environ["FAKE_ENGINE_MARKER"], str(os.getpid())), "w").close()
    elif cmd == "quit":
        break""",
}
# engines that answer in form but not in substance (a UCI shell around them: uci, isready, quit as above)
_UCI_SHELL = """
for line in sys.stdin:
    cmd = line.split()[0] if line.split() else ""
    if cmd == "uci":
        print("id name FakeAnswer", *(f"option name {o} type spin default 1 min 1 max 1024" for o in ("Threads", "Hash", "MultiPV")),
              "uciok", sep="\\n", flush=True)
    elif cmd == "isready":
        print("readyok", flush=True)
    elif cmd == "go":
        print(ANSWER, flush=True)
    elif cmd == "quit":
        break"""
FAKE_ENGINES.update({
    # e2e4 whatever the position: an illegal move once it is not white's, or the pawn has moved
    "plays illegal moves": "ANSWER = 'info depth 1 multipv 1 score cp 13 nodes 1 pv e2e4\\nbestmove e2e4'" + _UCI_SHELL,
    "answers without lines": "ANSWER = 'bestmove 0000'" + _UCI_SHELL,  # no info line, a null move
    "answers without a score": "ANSWER = 'info depth 1 multipv 1 nodes 1 pv e2e4\\nbestmove e2e4'" + _UCI_SHELL,
})


def fake_engine(tmp_path: Path, kind: str) -> str:
    """An executable that stands in for Stockfish and fails the way `kind` says."""
    path = tmp_path / ("fake-stockfish-" + kind.replace(" ", "-"))
    # -S: no site-packages to scan, so it starts in milliseconds, well inside the tests' 0.5-s limits
    path.write_text(f"#!{sys.executable} -S\nimport os, sys\n{FAKE_ENGINES[kind]}\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def unlisted_move_answer():
    """A P: record and an answer whose B: is a legal move outside the candidates: its reward needs
    the engine even with the record as truth (the real engine scores it about 0.86)."""
    import chess

    rec = next(r for r in data.load_split("P", "val") if r["n_legal"] > 5)
    other = sorted(m.uci() for m in chess.Board(rec["fen"]).legal_moves if m.uci() not in rec["moves"])[0]
    return rec, rec["completion"].rsplit("B:", 1)[0] + f"B: {other}"


def test_a_stockfish_that_is_found_but_cannot_run_fails_the_reward_of_a_row_with_truth(tmp_path, monkeypatch,
                                                                                        unlisted_move_answer):
    """A binary that is there but cannot start (here a script whose interpreter is missing): a B: outside the
    candidates needs it, so the reward raises EngineFailedError; TRL's wrapper scored such rows None, as
    if no engine were to be had, and so left exactly the off-label answers out of the advantages."""
    engine.close_all_engines()
    broken = tmp_path / "stockfish"
    broken.write_text("#!/nonexistent/interpreter\n")
    broken.chmod(0o755)
    monkeypatch.setenv("STOCKFISH_PATH", str(broken))
    rewards.clear_cache(analyses=True)
    rec, answer = unlisted_move_answer
    columns = {c: [rec[c]] for c in ("fen", "moves", "evals", "limit")}
    try:
        with pytest.raises(engine.EngineFailedError, match=f"outside the candidates: cannot start Stockfish at '{broken}'"):
            rewards.score_policy(rec["prompt"], answer, truth=rec)
        with pytest.raises(engine.EngineFailedError, match="cannot start Stockfish"):
            rewards.trl_reward_function("P", engine="auto")([rec["prompt"]], [answer], **columns)
        assert rewards.trl_reward_function("P", engine="auto")([rec["prompt"]], [rec["completion"]], **columns) == [1.0]
    finally:
        engine.close_all_engines()
        rewards.clear_cache(analyses=True)


@pytest.mark.parametrize("kind", list(FAKE_ENGINES))
def test_a_broken_engine_raises_engine_failed_in_the_reward_never_a_score(tmp_path, monkeypatch, kind,
                                                                          unlisted_move_answer):
    engine.close_all_engines()  # the shared pool of an earlier test runs the real engine: start anew
    monkeypatch.setenv("STOCKFISH_PATH", fake_engine(tmp_path, kind))
    monkeypatch.setattr(engine, "TIMEOUT_FLOOR_S", 0.5)  # engine start and search limits: 0.5 s + the budget,
    monkeypatch.setattr(engine, "SLOW_NODES_PER_S", 1e8)  # and the budget of a depth-8 search next to nothing
    rewards.clear_cache(analyses=True)  # nothing may come from an earlier, healthy engine
    rec, answer = unlisted_move_answer
    pool = engine.get_pool()  # what engine="auto" uses: the default settings, 3 retries
    try:
        t0 = time.monotonic()
        with pytest.raises(engine.EngineFailedError, match="Stockfish failed") as failed:
            rewards.score_policy(rec["prompt"], answer, truth=rec)
        assert time.monotonic() - t0 < 30
        if kind == "never answers go":  # killed by the search's watchdog, and said so: not "the engine died"
            assert "TimeoutError: no answer within" in str(failed.value), failed.value
        if kind == "never answers go":
            assert pool.restarts >= 1  # retried on fresh engines first
            with pytest.raises(engine.EngineFailedError):  # the batch path too (engines in parallel)
                rewards.score_batch([rec["prompt"]], [answer], [rec])
        # the policy reward with the record as truth and an answer among the candidates needs no engine
        assert rewards.score_policy(rec["prompt"], rec["completion"], truth=rec) == 1.0
    finally:
        pool.close()
        rewards.clear_cache(analyses=True)
    assert engine_pids(pool) == []


DATAGEN_ARGS = ["--games", "2", "--mate-games", "0", "--random-share", "0", "--workers", "2", "--no-progress"]


def test_datagen_with_a_broken_engine_ends_in_one_line_within_seconds(tmp_path):
    jobs = [f"from rookworld_lib.chess import engine\nengine.TIMEOUT_FLOOR_S = 0.5\nengine.SLOW_NODES_PER_S = 1e8\n"
            f"from rookworld_lib.lab.cli import main\n"
            f"raise SystemExit(main({['datagen', '--out', str(tmp_path / k.split()[0]), '--stockfish', fake_engine(tmp_path, k), *DATAGEN_ARGS]!r}))"
            for k in FAKE_ENGINES]
    results = run_driver(jobs, child_env(), timeout=120)  # before: "never answers go" hung datagen forever
    for result in results:
        assert result["rc"] == 1, result
        assert_one_clear_message(result, "rookworld datagen", "Stockfish failed", "EngineFailedError")


def test_ctrl_c_ends_datagen_at_once_even_with_a_hung_engine(tmp_path):
    """SIGINT while both engines hang in a search: the process exits within seconds (130), with
    no second Ctrl-C, and takes the engines with it (it used to restart them, then hang at exit)."""
    from helpers_chess import wait_gone

    marker = tmp_path / "searching"
    marker.mkdir()
    argv = ["datagen", "--out", str(tmp_path / "d"), "--stockfish", fake_engine(tmp_path, "never answers go"),
            *DATAGEN_ARGS]
    proc = ForkedChild(cli_main, argv, env=child_env(FAKE_ENGINE_MARKER=str(marker)))  # Ctrl-C raises there
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and len(os.listdir(marker)) < 2 and proc.poll() is None:
        time.sleep(0.05)
    engines = [int(p) for p in os.listdir(marker)]
    assert len(engines) == 2 and proc.poll() is None, proc.communicate()[1][-2000:]
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=engine.TIMEOUT_FLOOR_S - 2)  # well before any search timeout
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"datagen still running {engine.TIMEOUT_FLOOR_S - 2:.0f} s after Ctrl-C: {proc.communicate()[1][-2000:]}")
    print(f"exited {time.monotonic() - t0:.1f} s after SIGINT with {proc.returncode}")
    assert proc.returncode in (130, 1), err[-2000:]
    assert "interrupted" in err and "Traceback" not in err, err[-2000:]
    assert wait_gone(engines, timeout=5) == []


def test_ctrl_c_during_a_parallel_search_kills_the_engines_at_once(tmp_path, monkeypatch):
    """KeyboardInterrupt in EnginePool.map (here analyse_many) while both engines hang: it reaches
    the caller at once and the engines are gone, without waiting for the searches' time limits."""
    import chess
    from helpers_chess import wait_gone

    marker = tmp_path / "searching"
    marker.mkdir()
    monkeypatch.setenv("FAKE_ENGINE_MARKER", str(marker))
    pool = engine.EnginePool(engine.EngineSettings(path=fake_engine(tmp_path, "never answers go")), size=2, cache=False)

    def press_ctrl_c():
        deadline = time.monotonic() + 30
        while len(os.listdir(marker)) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    # Python's own Ctrl-C handler, also when the test run ignores SIGINT (started in the background)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=press_ctrl_c, daemon=True).start()
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            pool.analyse_many([chess.STARTING_FEN, "4k3/8/8/8/8/8/3PP3/4K3 w - - 0 1"])
        assert time.monotonic() - t0 < engine.TIMEOUT_FLOOR_S  # no search ran into its time limit
        assert len(os.listdir(marker)) == 2 and engine_pids(pool) == []
        assert wait_gone([int(p) for p in os.listdir(marker)], timeout=5) == []
    finally:
        signal.signal(signal.SIGINT, previous)
        pool.close()


# =====================================================================================
# Malformed data
# =====================================================================================

def _malformed_file(tmp_path: Path) -> tuple[Path, dict[int, str]]:
    p = [{**r, "split": "train"} for r in data.load_split("P", "val")[:3]]  # a training file's records
    a = [{**r, "split": "train"} for r in data.load_split("A", "val")[:2]]
    lines = {
        1: json.dumps(p[0]),
        2: json.dumps(p[1])[:-20],  # truncated
        3: json.dumps({**p[1], "best": p[1]["moves"][-1]}) if len(p[1]["moves"]) > 1 else "{}",  # a wrong best
        4: json.dumps(a[0]),
        5: json.dumps({**a[1], "reward": "1.0"}),  # wrong type
        6: json.dumps(p[2]),
        7: json.dumps({k: v for k, v in a[1].items() if k != "new_fen"}),  # missing field
        8: "\x00\x01 binary junk",
    }
    path = tmp_path / "policy_train.jsonl"
    path.write_text("\n".join(lines[i] for i in sorted(lines)) + "\n")
    return path, {2: "JSON", 3: "best", 5: "reward", 7: "new_fen", 8: "JSON"}


def test_malformed_lines_stop_with_file_and_line_or_are_skipped_and_counted(tmp_path, capsys):
    path, bad = _malformed_file(tmp_path)
    with pytest.raises(data.DataFormatError) as err:
        data.load_jsonl(path)
    assert str(err.value).startswith(f"{path}:2: ")
    loaded = data.load_jsonl(path, on_error="skip")
    assert len(loaded) == 3 and loaded.n_skipped == len(bad)
    assert [e.line for e in loaded.skipped] == sorted(bad)
    for e in loaded.skipped:
        assert bad[e.line].lower() in e.reason.lower(), (e.line, e.reason)
        assert str(e).startswith(f"{path}:{e.line}: ")

    # the CLIs that read data: one line naming file:line, exit status 1, no traceback
    assert main(["sft", "--train-data", str(path), "--model", "tiny", "--max-steps", "1", "--warmup-steps", "0",
                 "--out", str(tmp_path / "sft"), "--no-progress", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert f"rookworld sft: error: {path}:2: " in err
    hf = tmp_path / "hf"
    GPT(GPTConfig.preset("tiny", n_layer=1, n_embd=32, n_head=2, block_size=128)).save_pretrained(hf)
    (tmp_path / "env_train.jsonl").write_text(json.dumps(data.load_split("A", "train")[0]) + "\n")
    assert main(["grpo", "--init-from", str(hf), "--data-dir", str(tmp_path), "--out", str(tmp_path / "grpo"),
                 "--steps", "1", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert f"rookworld grpo: error: {path}:2: " in err and "Traceback" not in err
    assert datagen.cli(["--validate", str(path)]) == 1
    assert f"{path}:2: " in capsys.readouterr().err


# =====================================================================================
# Missing Stockfish, missing or corrupt tokenizer rank file: one message naming the fix
# =====================================================================================

DRIVER = r"""
import contextlib, io, json, sys, traceback
from rookworld_lib.chess import engine
if sys.argv[2] != "-":
    engine.DEBIAN_PATH = sys.argv[2]  # hide the Debian binary too
from rookworld_lib.lab.cli import main
results = []
for job in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if isinstance(job, list):  # a CLI command line: what the `rookworld` console script runs
                rc = main(job)
            else:  # a library call
                exec(job, {})
                rc = 0
        except SystemExit as exc:
            rc = exc.code
        except BaseException as exc:
            traceback.print_exc()  # what Python would print for an uncaught exception
            rc = f"uncaught {type(exc).__name__}"
            err.write(f"\nEXCEPTION {type(exc).__name__}: {exc}\nCHAINED {exc.__cause__ is not None or (exc.__context__ is not None and not exc.__suppress_context__)}\n")
    results.append({"job": job, "rc": rc, "out": out.getvalue(), "err": err.getvalue()})
print("RESULTS " + json.dumps(results))
"""


def _driver_main(argv: list[str]) -> None:
    """`python -c DRIVER ARGV...`, in a process forked with the library imported (forked_child.py)."""
    sys.argv = ["-c", *argv]
    exec(DRIVER, {"__name__": "__main__"})


def run_driver(jobs: list, env: dict, hide_debian: bool = False, timeout: float = 600) -> list[dict]:
    proc = ForkedChild(_driver_main, [json.dumps(jobs), "/nonexistent/stockfish" if hide_debian else "-"], env=env,
                       cwd=ROOT)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 0, err[-3000:]
    line = next(x for x in out.splitlines() if x.startswith("RESULTS "))
    return json.loads(line[len("RESULTS "):])


def assert_one_clear_message(result: dict, prog: str, *needles: str) -> None:
    err = result["err"]
    assert result["rc"] not in (0, None) and not str(result["rc"]).startswith("uncaught"), (result["rc"], err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    lines = [x for x in err.splitlines() if x.startswith(f"{prog}:")]
    assert len(lines) == 1, err[-2000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


SCORE_WITHOUT_TRUTH = ("from rookworld_lib.chess import rewards, tasks\n"
                       "rewards.score_policy(tasks.policy_prompt('4k3/8/8/8/8/8/3PP3/4K3 w - - 0 1'), "
                       "' M: e1f1 E: 0.1 B: e1f1')")


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    GPT(GPTConfig.preset("tiny", n_layer=1, n_embd=32, n_head=2, block_size=128)).save_pretrained(path)
    return path


@pytest.mark.parametrize("how", ["STOCKFISH_PATH points nowhere", "PATH empty, no Debian binary"])
def test_missing_stockfish_says_how_to_install_it(tmp_path, how):
    if how.startswith("STOCKFISH_PATH"):
        env, hide = child_env(STOCKFISH_PATH=str(tmp_path / "no-stockfish")), False
    else:
        env, hide = {k: v for k, v in child_env(PATH=str(tmp_path)).items() if k != "STOCKFISH_PATH"}, True
    datagen, library = run_driver([["datagen", "--out", str(tmp_path / "d"), "--games", "1", "--no-progress"],
                                   SCORE_WITHOUT_TRUTH], env, hide_debian=hide)
    assert_one_clear_message(datagen, "rookworld datagen", "Stockfish not found", "apt-get install -y stockfish",
                             "conda install -c conda-forge stockfish", "STOCKFISH_PATH")
    # the library raises one exception type whose message is the fix, with no chained internals
    assert "EXCEPTION StockfishNotFoundError: " in library["err"] and "CHAINED False" in library["err"]
    assert "apt-get install -y stockfish" in library["err"]
    if how.startswith("STOCKFISH_PATH"):
        assert str(tmp_path / "no-stockfish") in datagen["err"]


@pytest.fixture(scope="module")
def tokenizer_results(tmp_path_factory, tiny_hf):
    tmp = tmp_path_factory.mktemp("tok")
    corrupt = tmp / "gpt2.tiktoken"
    good = (ROOT / "data" / "gpt2.tiktoken").read_bytes()
    corrupt.write_bytes(good[: len(good) // 2])  # a truncated download
    small = tmp / "data"  # a few records of each file: the commands reach the tokenizer sooner
    small.mkdir()
    for name in ("policy_train", "env_train", "policy_test", "env_test", "mate_in_one"):
        lines = (ROOT / "data" / f"{name}.jsonl").read_text().splitlines(keepends=True)
        (small / f"{name}.jsonl").write_text("".join(lines[:4]))
    jobs = [["sft", "--model", "tiny", "--max-steps", "1", "--warmup-steps", "0", "--out", str(tmp / "sft"),
             "--no-progress", "--device", "cpu", "--train-data", str(small / "policy_train.jsonl"),
             str(small / "env_train.jsonl"), "--val-fraction", "0", "--eval-interval", "0", "--batch-size", "1",
             "--block-size", "32"],
            ["grpo", "--init-from", str(tiny_hf), "--out", str(tmp / "grpo"), "--steps", "1", "--no-progress",
             "--data-dir", str(small)],
            ["eval", str(tiny_hf), "--max-policy", "1", "--max-env", "1", "--selfplay-games", "0", "--data-dir",
             str(small)],
            "from rookworld_lib.core.tokenizer import get_tokenizer\nget_tokenizer()"]
    states = (("missing", tmp / "nowhere" / "gpt2.tiktoken"), ("corrupt", corrupt))
    # one child for both states: each job points ROOKWORLD_TOKENIZER_FILE (read at every load) first
    driven = []
    for _, path in states:
        point = f"import os\nos.environ['ROOKWORLD_TOKENIZER_FILE'] = {str(path)!r}\n"
        driven += [point + (f"from rookworld_lib.lab.cli import main\nraise SystemExit(main({job!r}))"
                            if isinstance(job, list) else job) for job in jobs]
    results = iter(run_driver(driven, child_env()))
    return {(state, name): (path, next(results)) for state, path in states
            for name in ("sft", "grpo", "eval", "library")}


@pytest.mark.parametrize("state", ["missing", "corrupt"])
@pytest.mark.parametrize("name", ["sft", "grpo", "eval", "library"])
def test_missing_or_corrupt_rank_file_names_the_fix(tokenizer_results, state, name):
    path, result = tokenizer_results[(state, name)]
    why = "cannot be read" if state == "missing" else "is corrupt: sha256"
    fix = "git checkout -- data/gpt2.tiktoken"
    if name == "library":
        assert f"EXCEPTION TokenizerFileError: GPT-2 rank file {path} {why}" in result["err"]
        assert fix in result["err"] and "CHAINED False" in result["err"]
    else:
        assert_one_clear_message(result, f"rookworld {name}", f"GPT-2 rank file {path} {why}", fix,
                                 "ROOKWORLD_TOKENIZER_FILE")


# =====================================================================================
# Notebook parameters of the wrong type or range
# =====================================================================================

@pytest.mark.parametrize("value, says", [("8", "must be int, got str '8'"), (-1, "must be >= 1, got -1")])
def test_bad_notebook_parameter_stops_in_the_check_cell_naming_it(tmp_path, value, says):
    import papermill as pm

    nb = ROOT / "notebooks" / "02_forward_pass_health.ipynb"
    with pytest.raises(pm.PapermillExecutionError) as info:
        pm.execute_notebook(str(nb), str(tmp_path / nb.name), parameters={"batch_size": value}, kernel_name="python3",
                            cwd=str(nb.parent), progress_bar=False)
    exc = info.value
    assert exc.ename == "ParameterError"
    assert f"notebook parameter 'batch_size' {says}" in exc.evalue
    assert "batch_size" in str(exc)
    # it stopped in the check cell right after the parameters (and papermill's injected cell)
    assert exc.cell_index <= 3, exc.cell_index


# =====================================================================================
# NaN in the loss or the gradients
# =====================================================================================

class NaNAt:
    """Counts calls; on the chosen ones returns its argument times NaN."""

    def __init__(self, bad: set[int]):
        self.bad, self.n = bad, 0

    def __call__(self, x):
        self.n += 1
        return x * float("nan") if self.n in self.bad else x


def snapshot(model, optimizer):
    p = next(model.parameters())
    return {k: v.clone() for k, v in model.state_dict().items()}, int(optimizer.state[p]["step"].item())


@pytest.mark.parametrize("where", ["loss", "gradients"])
def test_sft_nan_update_is_skipped_counted_and_the_run_goes_on(tmp_path, monkeypatch, where):
    nan = NaNAt({3})  # step 3 (no eval, no accumulation: one forward and one backward per step)
    if where == "loss":
        real = train_step.batch_loss  # what the training step (train_step.TrainStep) calls
        monkeypatch.setattr(train_step, "batch_loss", lambda model, x, y, **kw: nan(real(model, x, y, **kw)))
    snaps = {}
    trainer = SFTTrainer(tiny_cfg(tmp_path, max_steps=5), train_texts=TEXTS,
                         on_step=lambda rec: snaps.__setitem__(rec["step"], snapshot(trainer.model, trainer.optimizer)))
    if where == "gradients":
        trainer.model.transformer.h[0].mlp.c_fc.weight.register_hook(nan)
    trainer.train()
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["nonfinite/skipped"] for r in records] == [False, False, True, False, False]
    assert [r["nonfinite/total"] for r in records] == [0, 0, 1, 1, 1]
    assert (records[2]["loss"] is None) == (where == "loss") and records[2]["grad_norm"] is None
    (p2, o2), (p3, o3), (p4, o4) = snaps[2], snaps[3], snaps[4]
    assert all(torch.equal(p2[k], p3[k]) for k in p2) and o2 == o3 == 2  # nothing moved at step 3
    assert not all(torch.equal(p3[k], p4[k]) for k in p3) and o4 == 3  # the run went on
    assert trainer.step == 5 and all(torch.isfinite(v).all() for v in trainer.model.state_dict().values())


def tiny_grpo(**kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", n_layer=1, n_embd=32, n_head=2, block_size=64))
    items = [tg.PromptItem("P", f"P: prompt {i}") for i in range(4)] + [tg.PromptItem("A", f"A: env {i}+")
                                                                         for i in range(4)]
    cfg = tg.GRPOTrainConfig(**{**dict(steps=4, prompts_per_step=2, group_size=4, max_new_tokens=6, minibatch_size=8,
                                       mu=1, lr=1e-3, seed=0, progress=False, task_weights={"P": 0.5, "A": 0.5}), **kw})
    return model, items, cfg


def length_reward(item, text):
    return float(len(text) % 3) / 2.0


@pytest.mark.parametrize("where", ["loss", "gradients"])
def test_grpo_nan_update_is_skipped_counted_and_the_run_goes_on(monkeypatch, where):
    nan = NaNAt({2})  # the one minibatch of step 2
    if where == "loss":
        real = grpo.grpo_loss

        def flaky(*args, **kwargs):
            loss, metrics = real(*args, **kwargs)
            return nan(loss), metrics

        monkeypatch.setattr(grpo, "grpo_loss", flaky)
    model, items, cfg = tiny_grpo()
    snaps = {}
    trainer = tg.GRPOTrainer(model, items, cfg, reward_funcs=item_reward(length_reward),
                             on_step=lambda rec: snaps.__setitem__(rec["step"], snapshot(trainer.model,
                                                                                         trainer.optimizer)))
    if where == "gradients":
        trainer.model.transformer.h[0].mlp.c_fc.weight.register_hook(nan)
    history = trainer.train()
    assert [r["nonfinite/total"] for r in history] == [0, 1, 1, 1]
    # history holds what grpo_metrics.jsonl holds: no applied update, no loss (null, not NaN)
    assert history[1]["loss"] is None and math.isfinite(history[2]["loss"])
    (p1, o1), (p2, o2), (p3, o3) = snaps[1], snaps[2], snaps[3]
    assert all(torch.equal(p1[k], p2[k]) for k in p1) and o1 == o2 == 1
    assert not all(torch.equal(p2[k], p3[k]) for k in p2) and o3 == 2
    assert trainer.step == 4 and all(torch.isfinite(v).all() for v in trainer.model.state_dict().values())


# =====================================================================================
# A full disk while checkpointing
# =====================================================================================

def disk_full_on(monkeypatch, call: int) -> None:
    """torch.save (as checkpoint.py calls it) writes part of the file, then fails with ENOSPC, on the given call."""
    real, calls = ck.torch.save, {"n": 0}

    def save(obj, f, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] != call:
            return real(obj, f, *args, **kwargs)
        f.write(b"PK\x03\x04" + b"\x00" * 4096)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ck.torch, "save", save)


def test_full_disk_while_checkpointing_keeps_the_previous_checkpoint(tmp_path, monkeypatch, capsys):
    data_file = tmp_path / "train.jsonl"
    data_file.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    args = ["--train-data", str(data_file), "--model", "tiny", "--model-overrides", "n_layer=1",
            "--model-overrides", "n_embd=32", "--model-overrides", "n_head=2", "--block-size", "32", "--batch-size",
            "2", "--max-steps", "6", "--warmup-steps", "1", "--checkpoint-interval", "2", "--eval-interval", "0",
            "--val-fraction", "0", "--deterministic", "--device", "cpu", "--no-progress", "--no-export-hf"]
    run = tmp_path / "run"
    disk_full_on(monkeypatch, call=2)  # the checkpoint at step 4
    assert main(["sft", *args, "--out", str(run)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rookworld sft: error: could not save checkpoint")
    assert "step_00000004.pt: No space left on device" in err[0]
    assert "step_00000002.pt is intact and still the latest" in err[0]
    monkeypatch.undo()
    ckpt_dir = run / "checkpoints"
    assert ck.latest_checkpoint(ckpt_dir).name == "step_00000002.pt" and ck.load_checkpoint(ckpt_dir)["step"] == 2
    assert not (ckpt_dir / "step_00000004.pt").exists()
    assert not [p for p in os.listdir(ckpt_dir) if p.startswith(".tmp-")]

    # space again: the same command resumes from step 2 and ends where an undisturbed run ends
    assert training.sft_cli([*args, "--out", str(run)]) == 0
    assert training.sft_cli([*args, "--out", str(tmp_path / "ref")]) == 0
    got, want = ck.load_checkpoint(ckpt_dir), ck.load_checkpoint(tmp_path / "ref" / "checkpoints")
    assert got["step"] == want["step"] == 6
    assert all(torch.equal(got["model"][k], want["model"][k]) for k in want["model"])
    assert math_fields(read_metrics(run / "metrics.jsonl")) == math_fields(read_metrics(tmp_path / "ref" /
                                                                                        "metrics.jsonl"))


def test_full_disk_while_checkpointing_grpo(tmp_path, monkeypatch):
    model, items, cfg = tiny_grpo(steps=3, checkpoint_interval=1, out_dir=str(tmp_path))
    disk_full_on(monkeypatch, call=2)
    trainer = tg.GRPOTrainer(model, items, cfg, reward_funcs=item_reward(length_reward))
    with pytest.raises(ck.CheckpointSaveError, match="step_00000001.pt is intact"):
        trainer.train()
    monkeypatch.undo()
    assert ck.load_checkpoint(tmp_path / "checkpoints")["step"] == 1
    model, items, cfg = tiny_grpo(steps=3, checkpoint_interval=1, out_dir=str(tmp_path))
    resumed = tg.GRPOTrainer(model, items, cfg, reward_funcs=item_reward(length_reward))
    assert resumed.step == 1
    resumed.train()
    assert ck.load_checkpoint(tmp_path / "checkpoints")["step"] == 3


# =====================================================================================
# One writer per run directory, checksummed checkpoints, GRPO resume and settings checks
# (issue 18, items 1, 3, 6, 7), each as a user meets it: through the `rookworld` command
# =====================================================================================

def sft_args(tmp_path: Path, *extra: str) -> list[str]:
    data_file = tmp_path / "train.jsonl"
    data_file.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    return ["sft", "--train-data", str(data_file), "--model", "tiny", "--model-overrides", "n_layer=1",
            "--model-overrides", "n_embd=32", "--model-overrides", "n_head=2", "--block-size", "32", "--batch-size",
            "2", "--warmup-steps", "1", "--eval-interval", "0", "--val-fraction", "0", "--device", "cpu",
            "--no-progress", "--no-export-hf", *extra]


def test_a_second_run_into_a_busy_out_dir_is_refused_and_mixes_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    argv = sft_args(tmp_path, "--max-steps", "80", "--checkpoint-interval", "20", "--out", str(run))
    first = ForkedChild(cli_main, argv, env=child_env())  # `rookworld sft ...` in a process of its own
    try:
        wait_for(first, lambda: f"pid {first.pid}" in ((run / ".lock").read_text() if (run / ".lock").exists() else ""))
        os.kill(first.pid, signal.SIGSTOP)  # the first run holds the lock, mid-run
        assert main(argv) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"is being written by another run (pid {first.pid} since" in err[0], err
        os.kill(first.pid, signal.SIGCONT)
        assert first.wait(timeout=120) == 0, first.communicate()[1][-2000:]
    finally:
        if first.poll() is None:
            first.kill()
    # one run's records, each step once, and its checkpoints only
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == list(range(1, 81))
    assert ck.load_checkpoint(run / "checkpoints")["step"] == 80


def test_a_checkpoint_with_flipped_bytes_is_refused_naming_the_newest_intact_one(tmp_path, capsys):
    run = tmp_path / "run"
    argv = sft_args(tmp_path, "--checkpoint-interval", "2", "--keep-checkpoints", "2", "--out", str(run))
    assert main([*argv, "--max-steps", "4"]) == 0
    latest = run / "checkpoints" / "step_00000004.pt"
    raw = bytearray(latest.read_bytes())
    for k in (len(raw) // 2, len(raw) // 2 + 7, len(raw) // 2 + 99):  # three bytes inside the tensor data
        raw[k] ^= 0x5A
    latest.write_bytes(bytes(raw))  # same size: only the checksum can tell
    capsys.readouterr()
    assert main([*argv, "--max-steps", "6"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "step_00000004.pt: its bytes changed since it was saved" in err[0], err
    assert "the newest intact checkpoint there is step_00000002.pt (step 2)" in err[0]
    # what the message says to do works: the run resumes from step 2 and finishes
    latest.unlink()
    (run / "checkpoints" / "latest").unlink()
    assert main([*argv, "--max-steps", "6"]) == 0
    assert ck.load_checkpoint(run / "checkpoints")["step"] == 6


def test_grpo_resume_checks_what_sft_checks_and_refuses_non_finite_settings(tmp_path, capsys, caplog):
    caplog.set_level(logging.INFO, logger="rookworld_lib.core.trainer")
    hf, hf2 = tmp_path / "hf", tmp_path / "hf2"
    for seed, d in ((0, hf), (1, hf2)):
        torch.manual_seed(seed)
        GPT(GPTConfig.preset("tiny", n_layer=1, n_embd=32, n_head=2, block_size=128)).save_pretrained(d)
    data_dirs = []
    for k in (8, 6):  # two prompt sets
        d = tmp_path / f"data{k}"
        d.mkdir()
        for task, name in (("P", "policy"), ("A", "env")):
            recs = data.load_split(task, "train").records[:k]
            (d / f"{name}_train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
        data_dirs.append(d)
    run = tmp_path / "run"

    def grpo_argv(*extra, init=hf, data_dir=data_dirs[0], out=run):
        return ["grpo", "--init-from", str(init), "--data-dir", str(data_dir), "--out", str(out), "--layout",
                "compact", "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "6",
                "--minibatch-size", "4", "--no-progress", *extra]

    def one_line_error() -> str:
        err = capsys.readouterr().err.strip().splitlines()
        err = [line for line in err if not line.startswith(("layout: ", "sampling over "))]
        assert len(err) == 1 and err[0].startswith("rookworld grpo: error: ") and "Traceback" not in err[0], err
        return err[0]

    assert main(grpo_argv("--steps", "1")) == 0
    capsys.readouterr()
    for flag in ("--lr", "--weight-decay", "--grad-clip"):  # item 7: as SFT, no non-finite number trains
        assert main(grpo_argv("--steps", "2", flag, "nan")) == 1
        assert "must be a finite number" in one_line_error()
    for extra, what in ((("--lr", "1e-4"), "lr"), (("--group-size", "4"), "group_size"), (("--beta", "0.1"), "loss.beta"),
                        (("--loss-type", "dr_grpo"), "loss.loss_type")):  # item 6: another run's settings
        assert main(grpo_argv("--steps", "2", *extra)) == 1
        assert f"other settings ({what}: " in one_line_error()
    assert main(grpo_argv("--steps", "2", init=hf2)) == 1
    assert "other settings (init_from: " in one_line_error()
    assert main(grpo_argv("--steps", "2", data_dir=data_dirs[1])) == 1
    assert "other settings (prompts: " in one_line_error()
    sft_run = tmp_path / "sft"
    assert main(sft_args(tmp_path, "--max-steps", "1", "--out", str(sft_run))) == 0
    capsys.readouterr()
    assert main(grpo_argv("--steps", "2", out=sft_run)) == 1
    assert "is a 'sft' checkpoint, not a GRPO one; use another out_dir (--out)" in one_line_error()
    # the refusal names the options that continue or start over (it named the fields alone)
    assert main(sft_args(tmp_path, "--max-steps", "1", "--out", str(sft_run), "--no-resume")) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"rookworld sft: error: {sft_run / 'checkpoints'} already holds checkpoints of an earlier run (latest "
        "step_00000001.pt); resume=True (--resume) continues it; to start over, delete that directory or choose another "
        "out_dir (--out)")
    assert [r["step"] for r in read_metrics(run / "grpo_metrics.jsonl")] == [1]  # nothing refused wrote anything
    caplog.clear()
    assert main(grpo_argv("--steps", "2")) == 0  # the same settings, a longer run: resumes, and says so
    assert f"GRPO resumed from {run / 'checkpoints' / 'step_00000001.pt'} at step 1" in caplog.text
    assert [r["step"] for r in read_metrics(run / "grpo_metrics.jsonl")] == [1, 2]


# =====================================================================================
# Rewards fuzzed with random and mutated completions
# =====================================================================================

_ALPHABET = "abcdefgh12345678qrbnkpPNBRQK/ -+.M:E:B:0#=x\n\t" + "é€\u200b\U0001F600\x00"


def _mutate(text: str, rng: random.Random, task: str) -> str:
    """A real completion, garbled: char flips, truncations, insertions, deletions, field swaps."""
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(8)
        i = rng.randrange(len(text) + 1)
        if op == 0 and text:  # flip a character
            i = min(i, len(text) - 1)
            text = text[:i] + rng.choice(_ALPHABET) + text[i + 1:]
        elif op == 1:  # truncate
            text = text[:i]
        elif op == 2:  # insert a run of characters
            text = text[:i] + "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(1, 6))) + text[i:]
        elif op == 3 and text:  # delete a run
            text = text[:i] + text[i + rng.randint(1, 8):]
        elif op == 4:  # swap two fields
            sep = "+" if task == "A" else " "
            parts = text.split(sep)
            if len(parts) > 1:
                a, b = rng.sample(range(len(parts)), 2)
                parts[a], parts[b] = parts[b], parts[a]
            text = sep.join(parts)
        elif op == 5 and task == "P":  # move a whole section (M:/E:/B:) elsewhere or drop it
            parts = [p for p in text.replace("E:", "|E:").replace("B:", "|B:").split("|")]
            if rng.random() < 0.5:
                parts.pop(rng.randrange(len(parts)))
            else:
                rng.shuffle(parts)
            text = "".join(parts)
        elif op == 6:  # duplicate a span
            j = rng.randrange(len(text) + 1)
            text = text[:i] + text[min(i, j):max(i, j)] + text[i:]
        else:  # case and whitespace noise
            text = text.upper() if rng.random() < 0.3 else text.replace(" ", rng.choice(["", "  ", "\t", " \n"]))
    return text


def _random_text(rng: random.Random) -> str:
    kind = rng.randrange(3)
    if kind == 0:
        return "".join(rng.choice(_ALPHABET) for _ in range(rng.randint(0, 80)))
    if kind == 1:
        return "".join(chr(rng.randint(0, 0x2FFF)) for _ in range(rng.randint(0, 40)))
    words = ["M:", "E:", "B:", "e2e4", "e7e5", "g1f3", "0.31", "-1.2", "M3", "#-2", "+", "0.001", "1", "0", "-1"]
    return " ".join(rng.choice(words) for _ in range(rng.randint(0, 16)))


def fuzz_rewards(n: int, seed: int) -> dict:
    """Score n fuzzed completions (half P:, half A:) against the real truth; return counts and speed.

    3% of the prompts are garbled too: a reward may then raise only its documented set-up error,
    TruthError, when the garbled prompt names another position (or, for A:, another move's outcome)
    than the truth passed with it.
    """
    P = data.load_split("P", "train").records + data.load_split("P", "val").records
    A = data.load_split("A", "train").records + data.load_split("A", "val").records
    p_truths = [rewards.policy_truth(r) for r in P]  # converted once, as GRPO's registry would
    rng = random.Random(seed)
    lo, hi = rewards.MALFORMED_RANGE  # the documented ranges: garbage, malformed (gated), valid-illegal, valid
    policy_ok = lambda x: x == -1.0 or lo <= x <= hi or x == -0.25 or 0.0 <= x <= 1.0  # noqa: E731
    env_ok = lambda x: x == -1.0 or 0.0 <= x <= 1.0  # noqa: E731
    counts = {"P": 0, "A": 0, "garbage": 0, "top": 0, "truth_error": 0}
    t0 = time.perf_counter()
    for k in range(n):
        task = "P" if k % 2 == 0 else "A"
        i = rng.randrange(len(P) if task == "P" else len(A))
        rec = P[i] if task == "P" else A[i]
        u = rng.random()
        completion = rec["completion"] if u < 0.05 else _random_text(rng) if u < 0.35 else \
            _mutate(rec["completion"], rng, task)
        prompt = rec["prompt"] if rng.random() < 0.97 else _mutate(rec["prompt"], rng, task)
        try:
            x = (rewards.score_policy(prompt, completion, truth=p_truths[i], engine=None, cache=False) if task == "P"
                 else rewards.score_environment(prompt, completion, truth=rec, cache=False))
        except rewards.TruthError:  # documented: a truth for another position is a set-up error
            assert prompt != rec["prompt"], (task, prompt)
            counts["truth_error"] += 1
            continue
        ok = (policy_ok if task == "P" else env_ok)(x)
        assert isinstance(x, float) and math.isfinite(x) and ok, (task, prompt, completion, x)
        counts[task] += 1
        counts["garbage"] += x == -1.0
        counts["top"] += x == 1.0
    counts["seconds"] = time.perf_counter() - t0
    counts["per_s"] = n / counts["seconds"]
    return counts


def test_rewards_fuzzed_with_10k_random_and_mutated_completions():
    # 10,000 per run keeps the fault suite within its 3 minutes; the heavy variant below fuzzes a million
    counts = fuzz_rewards(10_000, seed=20261122)
    print(f"fuzzed 10,000 completions in {counts['seconds']:.1f}s ({counts['per_s']:.0f}/s): {counts}")
    assert counts["P"] + counts["A"] + counts["truth_error"] == 10_000 and counts["truth_error"] < 300  # 3% garbled
    assert 0 < counts["garbage"] < 10_000 and counts["top"] > 0  # the whole range was exercised


@pytest.mark.heavy
@pytest.mark.skipif(not HEAVY, reason="heavy: set ROOKWORLD_HEAVY=1")
def test_heavy_rewards_fuzzed_with_a_million_completions():
    counts = fuzz_rewards(1_000_000, seed=1)
    print(f"fuzzed 1,000,000 completions in {counts['seconds']:.1f}s ({counts['per_s']:.0f}/s)")
