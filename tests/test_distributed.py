"""torchrun with gloo on CPU: 2 processes give the parameters of 1 process on the same global batch."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import dist_grpo_worker
import pytest
import torch

from rookworld_lib.core import distributed, errors

WORKER = Path(__file__).with_name("dist_grpo_worker.py")
LOSS_TYPES = ["grpo", "dapo"]


@pytest.fixture(scope="module")
def two_process_params(tmp_path_factory) -> dict[str, dict]:
    """The job of dist_grpo_worker.py for every loss type, trained by 2 processes under torchrun.

    One launch trains all the loss types in turn (in one process group): a launch costs about
    three process starts (torchrun, 2 workers importing torch and the library), the training of
    one loss type well under a second. Both parametrised tests share it (`make test` runs a file on
    one xdist worker)."""
    out = tmp_path_factory.mktemp("grpo-2-processes")
    # the workers run a script: the library they import is this process's (a checkout's own, not whichever
    # an editable install points at)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    logs = tmp_path_factory.mktemp("torchrun-logs")  # not torchrun's default, a torchelastic_* left in /tmp
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", f"--log-dir={logs}",
           str(WORKER), str(out), *LOSS_TYPES, "grpo-one-chunk"]
    # A launch takes about 15 s; the limit turns a hang at exit (GRPOTrainer.close) into a quick failure.
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"2-process GRPO run did not finish in 180 s:\n{exc.stderr}") from exc
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {job: torch.load(out / f"{job}.pt") for job in (*LOSS_TYPES, "grpo-one-chunk")}


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_grpo_two_processes_match_one(two_process_params, loss_type, monkeypatch):
    # the reference: the same job as 1 process, in this process (world size 1, no process group)
    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    job, is_main = dist_grpo_worker.train(loss_type)
    one, two = job["params"], two_process_params[loss_type]["params"]
    assert is_main
    assert one.keys() == two.keys()
    worst = max((one[k] - two[k]).abs().max().item() for k in one)
    assert worst <= 1e-5, worst
    init = dist_grpo_worker.initial_model().state_dict()
    assert max((one[k] - init[k]).abs().max().item() for k in one) > 1e-4  # training did move the weights
    # the logged loss metrics are the whole minibatch's, whatever the process count (the policy term and
    # the completion count were each rank's share, the token means a mean of the ranks' means)
    for a, b in zip(job["history"], two_process_params[loss_type]["history"], strict=True):
        for key in ("loss", "loss/policy", "num_completions", "num_tokens", "advantages/mean", "advantages/std",
                    "kl", "approx_kl", "ratio/mean", "ratio/min", "ratio/max", "clip_ratio/region_mean", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), (key, a[key], b[key])


@pytest.mark.parametrize("job", ["grpo", "grpo-one-chunk"])
def test_the_sampling_rate_is_every_ranks_tokens_over_the_slowest_ranks_time(two_process_params, job):
    """With one rollout chunk rank 0 samples and rank 1 waits: the rate divided the tokens by the ranks'
    mean sampling time (half of rank 0's), so it read 2x (N x) too high. A phase's time is now its slowest
    rank's, and the rate the step's sampled tokens (no dynamic sampling: its completions' lengths) over it."""
    history = two_process_params[job]["history"]
    assert [r["step"] for r in history] == [1, 2]  # the worker's two steps: the loop below checks each
    for r in history:
        assert r["time/sampling"] > 0
        tokens = r["completions/mean_length"] * r["num_completions"]
        assert r["throughput/generated_tokens_per_s"] * r["time/sampling"] == pytest.approx(tokens, rel=1e-6), r


def test_strip_nproc():
    assert distributed.strip_nproc(["--nproc", "2", "--steps", "3"]) == (2, ["--steps", "3"])
    assert distributed.strip_nproc(["--nproc=4"]) == (4, [])
    assert distributed.strip_nproc(["--steps", "3"]) == (0, ["--steps", "3"])
    assert distributed.strip_nproc(["--nproc", "0", "--steps", "3"]) == (0, ["--steps", "3"])  # 0: this process
    # `--` ends the options (argparse's convention): a --nproc after it belongs to the rest and is not taken
    assert distributed.strip_nproc(["--nproc", "2", "--", "--nproc", "3"]) == (2, ["--", "--nproc", "3"])


def test_single_process_is_not_distributed(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    info = distributed.init_from_env("cpu")
    assert info.world_size == 1 and info.is_main
    assert distributed.all_gather_objects({"a": 1}) == [{"a": 1}]
    assert distributed.all_reduce_sum(2.5) == 2.5


def test_init_from_env_reads_rank_and_local_rank_apart(monkeypatch):
    """On a second machine torchrun's RANK (global) and LOCAL_RANK (this machine's) differ: rank 3 with
    local rank 1 is not the main process; rank 0 is."""
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)  # no process group is joined
    info = distributed.init_from_env("cpu")
    assert (info.rank, info.world_size, info.local_rank, info.is_main) == (3, 4, 1, False)
    assert distributed.main_process() is False
    monkeypatch.setenv("RANK", "0")
    assert distributed.main_process() is True


def test_more_processes_than_gpus_is_refused_in_one_line_before_cuda_is_touched(monkeypatch):
    """CUDA runs one process per GPU (cuda:LOCAL_RANK): rank 2 of --nproc 3 on a 2-GPU machine is told
    so, not CUDA's "invalid device ordinal" from set_device."""
    monkeypatch.setenv("WORLD_SIZE", "3")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    touched = []
    monkeypatch.setattr(torch.cuda, "set_device", touched.append)
    with pytest.raises(distributed.NprocError, match=r"--nproc 3 runs one process per GPU, and this machine has 2: "
                                                     r"give --nproc 2 or fewer") as info:
        distributed.init_from_env("cuda")
    assert isinstance(info.value, ValueError) and not touched  # the CLI's one-line error; no CUDA call
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda backend: touched.append(backend))
    distributed.init_from_env("cuda")  # a rank that has its GPU goes on
    assert touched == [1, "nccl"]


@pytest.mark.parametrize("argv, why", [(["--nproc", "abc"], "whole number"), (["--nproc=-2"], ">= 0"),
                                       (["--nproc", "-2"], ">= 0"), (["--nproc"], "needs a value"),
                                       # the value is everything after the first '='
                                       (["--nproc=2=3"], r"whole number of processes .* got '2=3'")])
def test_strip_nproc_refuses_what_is_not_a_count(argv, why):
    with pytest.raises(distributed.NprocError, match=why) as info:
        distributed.strip_nproc(argv)
    assert isinstance(info.value, ValueError)  # the CLI's one-line error


def test_parse_nproc_is_an_argparse_type(capsys):
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--nproc", type=distributed.parse_nproc, default=0)
    assert ap.parse_args(["--nproc", "2"]).nproc == 2
    with pytest.raises(SystemExit) as stop:
        ap.parse_args(["--nproc", "abc"])
    assert stop.value.code == 2 and "whole number" in capsys.readouterr().err  # argparse's usage error, our words


def test_nproc_0_and_1_run_in_this_process(monkeypatch):
    """parse_nproc's "0 and 1 run in this process": --nproc 0 and 1 run the command here (torchrun is for
    2 or more)."""
    monkeypatch.setattr(distributed, "torchrun", lambda *a, **k: pytest.fail("torchrun started"))
    monkeypatch.delenv(errors.ERRORS_DIR_ENV, raising=False)
    for n in ("0", "1"):
        ran = []
        code = distributed.run_command("sft", ["--nproc", n], lambda: distributed.command_parser("sft", "d", "e"),
                                       lambda args: ran.append(args) or 7, preflight=lambda argv, n: None)
        assert code == 7 and len(ran) == 1


def test_torchrun_runs_the_preflight_before_any_worker(monkeypatch):
    def refuse(argv, nproc):
        raise ValueError(f"batch 8 does not split into {nproc}")

    monkeypatch.setattr(distributed.subprocess, "Popen", lambda *a, **k: pytest.fail("torchrun started"))
    with pytest.raises(ValueError, match="split into 3"):
        distributed.torchrun("sft", ["--batch-size", "8"], 3, preflight=refuse)


class _Done:
    """A stand-in for torchrun's Popen that exits 0 and records its environment (the other stand-ins below
    change what wait() returns)."""
    envs = []

    def __init__(self, cmd, env, **kwargs):
        self.envs.append(env)

    def wait(self):
        return 0

    def send_signal(self, signum):
        pass


def test_torchrun_shares_the_cores_among_the_workers_unless_threads_are_set(monkeypatch):
    """Each of N workers gets cpu_count // N OpenMP threads (8 cores, 2 workers: 4); an OMP_NUM_THREADS the
    user set wins."""
    monkeypatch.setattr(distributed.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(distributed.subprocess, "Popen", _Done)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    _Done.envs.clear()
    assert distributed.torchrun("sft", [], 2) == 0
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert distributed.torchrun("sft", [], 2) == 0
    assert [e["OMP_NUM_THREADS"] for e in _Done.envs] == ["4", "1"]


def test_torchrun_returns_the_highest_worker_status(monkeypatch, capsys):
    """Workers that failed with different statuses (1 and 3): the launcher exits with the highest one and
    says each worker's line once."""
    class Failed(_Done):
        def __init__(self, cmd, env, **kwargs):
            self.dir = env[errors.ERRORS_DIR_ENV]

        def wait(self):
            for rank, code in ((0, 1), (1, 3)):
                with open(f"{self.dir}/rank{rank:05d}.json", "w") as f:
                    json.dump({"line": f"rookworld sft: error: rank {rank}", "code": code}, f)
            return 1

    monkeypatch.setattr(distributed.subprocess, "Popen", Failed)
    assert distributed.torchrun("sft", [], 2) == 3
    assert capsys.readouterr().err.splitlines() == ["rookworld sft: error: rank 0", "rookworld sft: error: rank 1"]


def test_worker_errors_are_said_once(tmp_path):
    for rank, line in enumerate(["rookworld sft: error: same", "rookworld sft: error: same", "rookworld sft: error: other"]):
        (tmp_path / f"rank{rank:05d}.json").write_text(json.dumps({"line": line, "code": 1}))
    (tmp_path / "rank00009.json").write_text("torn")
    assert errors.worker_errors(tmp_path) == (["rookworld sft: error: same", "rookworld sft: error: other"],
                                                   [1, 1, 1])


def test_a_worker_stopped_by_its_peer_is_said_only_without_a_primary_error(tmp_path):
    peer = {"line": "rookworld sft: error: stopped because another worker failed (gloo)", "code": 1, "secondary": True}
    (tmp_path / "rank00001.json").write_text(json.dumps(peer))
    assert errors.worker_errors(tmp_path) == ([peer["line"]], [1])
    (tmp_path / "rank00000.json").write_text(json.dumps({"line": "rookworld sft: error: disk full", "code": 1}))
    assert errors.worker_errors(tmp_path) == (["rookworld sft: error: disk full"], [1, 1])


def test_one_interrupt_line_names_the_signal_that_was_sent(tmp_path, monkeypatch, capsys):
    """SIGTERM to one worker: it said "interrupted (SIGTERM)" and its peer, which saw no signal,
    "interrupted (Ctrl-C)", two final lines that contradict each other. The peer's line is now secondary
    (shown only where no worker named a signal); and after a Ctrl-C at the launcher, the launcher's own
    "Ctrl-C" line stands for the workers' (torchrun passes them SIGTERM)."""
    monkeypatch.setenv(errors.ERRORS_DIR_ENV, str(tmp_path))
    for rank, name in ((0, "SIGTERM"), (1, errors.PEER_STOPPED)):
        monkeypatch.setenv("RANK", str(rank))
        assert errors.report_interrupted("grpo", name) == 130
    term = "rookworld grpo: interrupted (SIGTERM); the same command resumes from the latest checkpoint"
    assert errors.worker_errors(tmp_path) == ([term], [130, 130])
    (tmp_path / "rank00000.json").unlink()
    assert errors.worker_errors(tmp_path)[0] == [
        "rookworld grpo: interrupted (with another process); the same command resumes from the latest checkpoint"]

    class CtrlC(_Done):  # torchrun under a Ctrl-C: the launcher gets SIGINT, the workers write SIGTERM lines
        def __init__(self, cmd, env, **kwargs):
            self.dir = Path(env[errors.ERRORS_DIR_ENV])

        def wait(self):
            distributed.signal.raise_signal(distributed.signal.SIGINT)  # the launcher's handler passes it on
            (self.dir / "rank00000.json").write_text(json.dumps({"line": term, "code": 130}))
            return 130

    monkeypatch.delenv(errors.ERRORS_DIR_ENV)
    monkeypatch.delenv("RANK")
    monkeypatch.setattr(distributed.subprocess, "Popen", CtrlC)
    assert distributed.torchrun("grpo", ["--steps", "1"], 2) == 130
    assert capsys.readouterr().err.splitlines() == [
        "rookworld grpo: interrupted (Ctrl-C); the same command resumes from the latest checkpoint"]


def test_a_torchrun_killed_by_a_signal_exits_1_saying_so(monkeypatch, capsys):
    class Killed(_Done):  # what Popen.wait() returns for a child that SIGKILL ended: -9, no status a shell can use
        def wait(self):
            return -9

    monkeypatch.setattr(distributed.subprocess, "Popen", Killed)
    assert distributed.torchrun("sft", ["--max-steps", "1"], 2) == 1
    assert "torchrun was killed by SIGKILL; its workers stop with it" in capsys.readouterr().err


def test_a_worker_killed_by_sigkill_exits_137_and_says_out_of_memory(monkeypatch, tmp_path):
    """A worker ended by SIGKILL: the launcher returns 128 + 9 = 137 (the shell's status for a signal) and
    writes one line naming the rank, the signal and the OOM killer; SIGTERM gives 143 and no OOM hint."""
    from torch.distributed import run as torch_run
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    monkeypatch.setenv(errors.ERRORS_DIR_ENV, str(tmp_path))
    argv = ["--standalone", "--nproc_per_node=2", "-m", "rookworld_lib.lab.cli", "sft", "--max-steps", "1"]
    for sig, want, oom in ((signal.SIGKILL, 137, True), (signal.SIGTERM, 143, False)):
        failure = ProcessFailure(local_rank=1, pid=1, exitcode=-int(sig), error_file=str(tmp_path / "none"))

        def fail(args, failure=failure):
            raise ChildFailedError("rookworld_lib.lab.cli", {1: failure})

        monkeypatch.setattr(torch_run, "run", fail)
        assert distributed._launch(argv) == want
        line = json.loads((tmp_path / "rank_launcher.json").read_text())["line"]
        assert line.startswith(f"rookworld sft: error: worker rank 1 was killed by {sig.name}")
        assert ("out of memory?" in line) == oom


def test_a_worker_record_without_a_line_or_code_is_skipped(tmp_path):
    """worker_errors reads what it can: a record missing its code or line, or not an object, is skipped
    like a torn file, and the others still count."""
    (tmp_path / "rank00000.json").write_text(json.dumps({"line": "rookworld sft: error: no code"}))
    (tmp_path / "rank00001.json").write_text(json.dumps(["not", "a", "record"]))
    (tmp_path / "rank00002.json").write_text(json.dumps({"line": "rookworld sft: error: disk full", "code": 1}))
    assert errors.worker_errors(tmp_path) == (["rookworld sft: error: disk full"], [1])
