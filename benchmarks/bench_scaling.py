"""Scaling of 1 vs N processes on one machine (a benchmark, not a test: pytest does not collect it).

    .venv/bin/python benchmarks/bench_scaling.py [--nproc 2] [--model cpu-small] [--json out.json]
    python benchmarks/bench_scaling.py --device cuda --model gpt2 --sft-batch-size 16 --block-size 1024 \
        --compile --prompts 64 --group-size 8 --max-new-tokens 96 --json gpu.json

Runs `rookworld sft` and `rookworld grpo` once in one process and once under torchrun with
--nproc N, with the same global batch, and prints one JSON object: SFT tokens/s and GRPO
samples/s (completions per second) for each, and the scaling efficiency
(throughput with N processes) / (N x throughput with 1). Medians over the steps after the first
two (warm-up). With --device cuda only the one-process run is made (one GPU), and the SFT
figure comes with its MFU against the device's table peak. The numbers in docs/scaling.md come
from this script.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOKWORLD = [sys.executable, "-m", "rookworld_lib.lab.cli"]


def run(args: list[str], threads: int) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    subprocess.run(ROOKWORLD + args, check=True, env=env, stdout=subprocess.DEVNULL)


def median_after_warmup(metrics: Path, key: str) -> float:
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    values = [r[key] for r in records if r.get(key) is not None][2:]
    if not values:
        raise SystemExit(f"{metrics}: fewer than 3 steps with {key!r}")
    return statistics.median(values)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--model", default="cpu-small")
    ap.add_argument("--device", default="cpu", help="cpu (1 vs N processes) or cuda (one GPU, one process)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--compile", action="store_true", help="torch.compile for SFT")
    ap.add_argument("--pad-vocab", type=int, default=1, help="pad the vocabulary to a multiple of this (64 on GPU)")
    ap.add_argument("--sft-steps", type=int, default=8)
    ap.add_argument("--sft-batch-size", type=int, default=8)
    ap.add_argument("--block-size", type=int, default=256)
    ap.add_argument("--grpo-steps", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=8, help="GRPO prompts per step")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    gpu = args.device.startswith("cuda")
    N = 1 if gpu else args.nproc
    out: dict = {"machine": platform.platform(), "cpu_count": cores, "torch": torch.__version__,
                 "python": platform.python_version(), "model": args.model, "nproc": N, "device": args.device}
    if gpu:
        out["gpu"] = torch.cuda.get_device_name(0)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sft = ["sft", "--model", args.model, "--batch-size", str(args.sft_batch_size), "--block-size",
               str(args.block_size), "--max-steps", str(args.sft_steps), "--warmup-steps", "1", "--eval-interval", "0",
               "--checkpoint-interval", "0", "--no-progress", "--device", args.device, "--dtype", args.dtype]
        sft += ["--compile"] if args.compile else []
        sft += ["--model-overrides", f"pad_vocab_to_multiple={args.pad_vocab}"] if args.pad_vocab > 1 else []
        run(sft + ["--out", str(tmp / "sft1"), "--export-hf"], threads=cores)
        s1 = median_after_warmup(tmp / "sft1" / "metrics.jsonl", "throughput/tokens_per_s")
        out["sft"] = {"settings": f"batch {args.sft_batch_size} x {args.block_size} tokens (global), dtype "
                                  f"{args.dtype}, compile {args.compile}, vocab padded to a multiple of "
                                  f"{args.pad_vocab}", "tokens_per_s_1": s1}
        if gpu:
            from rookworld_lib.lab import perf
            from rookworld_lib.core.model import GPTConfig
            shape = GPTConfig.preset(args.model, pad_vocab_to_multiple=args.pad_vocab)  # the head it trained
            flops = perf.flops_per_token(shape, args.block_size, "train") * s1
            peak = perf.table_peak(out["gpu"], "bf16" if args.dtype in ("auto", "bf16") else "fp32")
            out["sft"]["model_tflops"] = flops / 1e12
            out["sft"]["mfu_vs_table_peak"] = flops / (peak * 1e12) if peak else None
        else:
            run(sft + ["--out", str(tmp / "sftN"), "--no-export-hf", "--nproc", str(N)],
                threads=max(1, cores // N))
            sN = median_after_warmup(tmp / "sftN" / "metrics.jsonl", "throughput/tokens_per_s")
            out["sft"].update({f"tokens_per_s_{N}": sN, "efficiency": sN / (N * s1)})
        grpo = ["grpo", "--init-from", str(tmp / "sft1" / "final"), "--steps", str(args.grpo_steps),
                "--prompts-per-step", str(args.prompts), "--group-size", str(args.group_size), "--max-new-tokens",
                str(args.max_new_tokens), "--rollout-chunks", str(N), "--minibatch-size",
                str(args.prompts * args.group_size // 2), "--no-progress", "--device", args.device, "--dtype",
                args.dtype]
        run(grpo + ["--out", str(tmp / "grpo1")], threads=cores)
        per_step = args.prompts * args.group_size
        settings = f"{args.prompts} prompts x {args.group_size} completions x {args.max_new_tokens} new tokens per step"
        g1 = per_step / median_after_warmup(tmp / "grpo1" / "grpo_metrics.jsonl", "time/step")
        out["grpo"] = {"settings": settings, "samples_per_s_1": g1}
        for key in ("time/sampling", "time/scoring", "time/update", "throughput/generated_tokens_per_s", "ratio/onpolicy_dev"):
            out["grpo"][key] = median_after_warmup(tmp / "grpo1" / "grpo_metrics.jsonl", key)
        if not gpu:
            run(grpo + ["--out", str(tmp / "grpoN"), "--nproc", str(N)], threads=max(1, cores // N))
            gN = per_step / median_after_warmup(tmp / "grpoN" / "grpo_metrics.jsonl", "time/step")
            out["grpo"].update({f"samples_per_s_{N}": gN, "efficiency": gN / (N * g1)})
    text = json.dumps(out)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
