"""SFT under torchrun (gloo on CPU): 2 processes train the parameters of 1 process on the same global
batch, and a checkpoint resumes at another world size (1 -> 2 and 2 -> 1).

The tolerance is 1e-5 with lr 5e-4: the two runs sum gradients in another order (rows split over
ranks, then all-reduced), and AdamW's first steps scale each update to about lr whatever the
gradient's size, so an element whose gradient is near AdamW's eps (1e-8) moves by a
slightly different amount (about 1% of lr) - summation noise, not a difference in the math.

Every run goes through the command line (`rookworld sft`, `--nproc 2` for torchrun), so the
launcher, rank-0-only writing and the exported model are covered too. One thread per process.
The command line runs in this process (`cli.main`, what the `rookworld` script calls): its
torchrun launcher and workers are the only processes started, two launches in all (a fresh
2-process run, a 1 -> 2 resume); each costs about three interpreter starts, the 4 steps of the
tiny model a fraction of a second.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch
from sft_helpers import TEXTS, one_thread  # noqa: F401  (one_thread: autouse fixture)

from rookworld_lib.lab.cli import main
from rookworld_lib.core.paths import DATA_DIR
from rookworld_lib.core import checkpoint as ck
from rookworld_lib.chess import training
from rookworld_lib.core import distributed
from rookworld_lib.core import train_sft as sft
from rookworld_lib.core.train_utils import read_metrics

TOL = 1e-5
ARGS = ["--model", "tiny", "--block-size", "32", "--batch-size", "4", "--grad-accum", "2", "--max-steps", "4",
        "--warmup-steps", "1", "--lr", "5e-4", "--min-lr", "5e-5", "--checkpoint-interval", "2",
        "--keep-checkpoints", "0", "--eval-interval", "2", "--eval-steps", "1", "--val-fraction", "0.1",
        "--deterministic", "--device", "cpu", "--no-progress", "--seed", "0"]


def argv(data: Path, out: Path) -> list[str]:
    return ["--train-data", str(data), *ARGS, "--out", str(out)]


def torchrun_sft(args: list[str], capfd, nproc: int = 2) -> str:
    """`rookworld sft --nproc N ...` as a user would type it (the CLI re-launches itself under
    torchrun), run by the CLI's entry point in this process; returns what the workers printed."""
    capfd.readouterr()  # what came before is not this run's
    code = main(["sft", "--nproc", str(nproc), *args])
    out, err = capfd.readouterr()
    assert code == 0, err[-4000:]
    return out


def params_at(out: Path, step: int) -> dict:
    return ck.load_checkpoint(ck.checkpoint_path(out / "checkpoints", step))["model"]


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def copy_checkpoint(src: Path, step: int, dst: Path) -> None:
    """Start a run directory from one checkpoint of another run (as if that run had stopped there)."""
    ck.save_checkpoint(dst / "checkpoints", ck.load_checkpoint(ck.checkpoint_path(src / "checkpoints", step)))


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    return path


def test_two_processes_match_one_and_resume_across_world_sizes(tmp_path, data_file, capfd, monkeypatch):
    torch.set_num_threads(1)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the torchrun workers' one thread each
    # 1 process, in this process: the reference, with checkpoints at steps 2 and 4
    ref = tmp_path / "one"
    assert training.sft_cli(argv(data_file, ref)) == 0
    assert "SFT finished at step 4" in capfd.readouterr().out

    # the same run as 2 processes under torchrun, fresh
    two = tmp_path / "two"
    scratch = tmp_path / "tmpdir"  # torchrun's temporary directory: it keeps nothing there once it ends
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    out = torchrun_sft(argv(data_file, two), capfd)
    assert out.count("SFT finished at step 4") == 1  # rank 0 reports; rank 1 stays quiet
    assert not [p.name for p in scratch.iterdir() if p.name.startswith("torchelastic_")]
    worst = max_diff(params_at(ref, 4), params_at(two, 4))
    print(f"max |1 process - 2 processes| = {worst:.2e}")
    assert worst <= TOL, worst
    moved = max_diff(params_at(ref, 4), params_at(ref, 2))
    assert moved > 1e-4, moved  # training did move the weights, far beyond the tolerance

    # 1-process checkpoint at step 2, resumed by 2 processes
    resumed = tmp_path / "one-then-two"
    copy_checkpoint(ref, 2, resumed)
    torchrun_sft(argv(data_file, resumed), capfd)
    worst = max_diff(params_at(ref, 4), params_at(resumed, 4))
    print(f"max |1 process - resumed 1 -> 2| = {worst:.2e}")
    assert worst <= TOL, worst

    # what rank 0 alone wrote: one metrics line per step, checkpoints, the export
    ref_records, two_records = read_metrics(ref / "metrics.jsonl"), read_metrics(two / "metrics.jsonl")
    assert [r["step"] for r in two_records] == [0, 1, 2, 3, 4]
    assert [r["step"] for r in read_metrics(resumed / "metrics.jsonl")] == [3, 4]
    for a, b in zip(ref_records, two_records):  # losses reduced across ranks = the global batch's loss
        for key in ("loss", "eval/loss", "grad_norm"):
            assert (a[key] is None) == (b[key] is None) and (a[key] is None or abs(a[key] - b[key]) < 1e-4), key
        assert a["num_tokens"] == b["num_tokens"] and a["learning_rate"] == b["learning_rate"]
    saved = ck.load_checkpoint(two / "checkpoints")
    assert saved["extra"]["world_size"] == 2 and len(saved["extra"]["rank_rng"]) == 2
    assert saved["data"] == ck.load_checkpoint(ref / "checkpoints")["data"]  # the same stream position
    assert (two / "final" / "model.safetensors").is_file()

    # and back: the 2-process checkpoint at step 2, resumed by 1 process
    back = tmp_path / "two-then-one"
    copy_checkpoint(two, 2, back)
    assert training.sft_cli(argv(data_file, back)) == 0
    worst = max_diff(params_at(ref, 4), params_at(back, 4))
    print(f"max |1 process - resumed 2 -> 1| = {worst:.2e}")
    assert worst <= TOL, worst
    shutil.rmtree(tmp_path)


def test_batch_size_must_divide_by_the_world_size(tmp_path, monkeypatch):
    monkeypatch.setattr(distributed, "init_from_env", lambda device_type: distributed.DistInfo(0, 2, 0))
    cfg = sft.SFTConfig(model="tiny", block_size=32, batch_size=3, max_steps=2, warmup_steps=0, eval_interval=0,
                        out_dir=str(tmp_path), progress=False, device="cpu")
    with pytest.raises(ValueError, match=r"SFTConfig\.batch_size \(3\) must be a multiple of the world size 2"):
        sft.SFTTrainer(cfg, train_texts=TEXTS)


def test_nproc_is_in_the_help_and_wraps_torchrun(monkeypatch):
    assert "--nproc N" in training.build_sft_parser().format_help()
    calls = []
    monkeypatch.setattr(training.distributed, "torchrun",
                        lambda sub, args, n, preflight: calls.append((sub, args, n, preflight)) or 0)
    assert training.sft_cli(["--nproc", "2", "--max-steps", "3"]) == 0
    assert calls == [("sft", ["--max-steps", "3"], 2, training._sft_preflight)]


def test_nproc_that_does_not_split_the_batch_is_refused_once_before_torchrun(capsys):
    # settings every worker would refuse are refused by the launcher, in one line, before any worker starts
    assert main(["sft", "--nproc", "3", "--batch-size", "8", "--train-data", str(DATA_DIR / "policy_train.jsonl")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["rookworld sft: error: --batch-size (8) must be a multiple of --nproc (3): each process trains "
                   "on batch_size / nproc rows of every micro-batch"]


def test_grpo_says_its_run_lines_once_under_torchrun(capsys, monkeypatch):
    # the launcher's preflight parses the settings silently; of the workers only rank 0 speaks
    args = training.build_grpo_parser().parse_args(["--init-from", "m", "--out", "o", "--layout", "compact"])
    training._grpo_config_from_args(args)
    assert capsys.readouterr().err == ""
    for rank, said in (("1", ""), ("0", "layout: compact (--layout); max_new_tokens 96\n")):
        monkeypatch.setenv("RANK", rank)
        training._grpo_config_from_args(args, say=training._say)
        assert capsys.readouterr().err == said


def test_the_grpo_launcher_says_once_when_some_processes_would_sample_nothing(monkeypatch, capsys):
    """A rank samples whole rollout chunks: --rollout-chunks 1 under --nproc 2 left one process idle while the
    other sampled every prompt, and nothing said so."""
    from rookworld_lib.core import grpo
    from rookworld_lib.core.train_grpo import GRPOTrainConfig

    for chunks, said in ((1, True), (2, False)):
        cfg = GRPOTrainConfig(prompts_per_step=4, group_size=2, minibatch_size=4, rollout_chunks=chunks,
                              loss=grpo.GRPOConfig(beta=0.0))
        monkeypatch.setattr(training, "_grpo_config_from_args", lambda args, cfg=cfg: (cfg, "compact"))
        training._grpo_preflight(["--init-from", "m", "--out", "o"], 2)
        err = capsys.readouterr().err
        assert ("rookworld grpo: note: --rollout-chunks 1 < --nproc 2: 1 of the processes sample nothing" in err) == said
