"""torchrun with gloo on CPU: 2 processes give the parameters of 1 process on the same global batch."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rookworld_lib import distributed
from rookworld_lib.model import GPT, GPTConfig

WORKER = Path(__file__).with_name("dist_grpo_worker.py")


def run(nproc: int, out: Path, loss_type: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if nproc == 1:
        cmd = [sys.executable, str(WORKER), str(out), loss_type]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               str(WORKER), str(out), loss_type]
    # A run takes about 10 s; the limit turns a hang at exit (GRPOTrainer.close) into a quick failure.
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{nproc}-process GRPO run did not finish in 180 s:\n{exc.stderr}") from exc
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_grpo_two_processes_match_one(tmp_path, loss_type):
    run(1, tmp_path / "one.pt", loss_type)
    run(2, tmp_path / "two.pt", loss_type)
    one, two = torch.load(tmp_path / "one.pt"), torch.load(tmp_path / "two.pt")
    assert one.keys() == two.keys()
    worst = max((one[k] - two[k]).abs().max().item() for k in one)
    assert worst <= 1e-5, worst
    torch.manual_seed(0)
    init = GPT(GPTConfig.preset("tiny", block_size=64)).state_dict()
    assert max((one[k] - init[k]).abs().max().item() for k in one) > 1e-4  # training did move the weights


def test_strip_nproc():
    assert distributed.strip_nproc(["--nproc", "2", "--steps", "3"]) == (2, ["--steps", "3"])
    assert distributed.strip_nproc(["--nproc=4"]) == (4, [])
    assert distributed.strip_nproc(["--steps", "3"]) == (0, ["--steps", "3"])


def test_single_process_is_not_distributed(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    info = distributed.init_from_env("cpu")
    assert not info.enabled and info.is_main
    assert distributed.all_gather_objects({"a": 1}) == [{"a": 1}]
    assert distributed.all_reduce_sum(2.5) == 2.5
