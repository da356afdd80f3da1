"""Scaling of 1 vs N processes on one machine (a benchmark, not a test: pytest does not collect it).

    .venv/bin/python tests/bench_scaling.py [--nproc 2] [--model cpu-small] [--json out.json]

Runs `rookworld sft` and `rookworld grpo` once in one process and once under torchrun with
--nproc N, with the same global batch, and prints one JSON object: SFT tokens/s and GRPO
samples/s (completions per second) for each, and the scaling efficiency
(throughput with N processes) / (N x throughput with 1). Medians over the steps after the first
two (warm-up). The numbers in docs/scaling.md come from this script.
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

ROOKWORLD = [sys.executable, "-m", "rookworld_lib.cli"]


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
    ap.add_argument("--sft-steps", type=int, default=8)
    ap.add_argument("--grpo-steps", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    N = args.nproc
    out: dict = {"machine": platform.platform(), "cpu_count": cores, "torch": torch.__version__,
                 "python": platform.python_version(), "model": args.model, "nproc": N}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sft = ["sft", "--model", args.model, "--batch-size", "8", "--block-size", "256", "--max-steps",
               str(args.sft_steps), "--warmup-steps", "1", "--eval-interval", "0", "--checkpoint-interval", "0",
               "--no-progress", "--device", "cpu"]
        run(sft + ["--out-dir", str(tmp / "sft1"), "--export-hf"], threads=cores)
        run(sft + ["--out-dir", str(tmp / "sftN"), "--no-export-hf", "--nproc", str(N)], threads=max(1, cores // N))
        s1 = median_after_warmup(tmp / "sft1" / "metrics.jsonl", "tokens_per_s")
        sN = median_after_warmup(tmp / "sftN" / "metrics.jsonl", "tokens_per_s")
        out["sft"] = {"settings": "batch 8 x 256 tokens (global)", "tokens_per_s_1": s1, f"tokens_per_s_{N}": sN,
                      "efficiency": sN / (N * s1)}
        grpo = ["grpo", "--init-from", str(tmp / "sft1" / "final"), "--steps", str(args.grpo_steps),
                "--prompts-per-step", "8", "--group-size", "4", "--max-new-tokens", "48", "--rollout-chunks",
                str(N), "--minibatch-size", "16", "--no-progress", "--device", "cpu"]
        run(grpo + ["--out-dir", str(tmp / "grpo1")], threads=cores)
        run(grpo + ["--out-dir", str(tmp / "grpoN"), "--nproc", str(N)], threads=max(1, cores // N))
        per_step = 8 * 4
        g1 = per_step / median_after_warmup(tmp / "grpo1" / "metrics.jsonl", "time_step")
        gN = per_step / median_after_warmup(tmp / "grpoN" / "metrics.jsonl", "time_step")
        out["grpo"] = {"settings": "8 prompts x 4 completions x 48 new tokens per step", "samples_per_s_1": g1,
                       f"samples_per_s_{N}": gN, "efficiency": gN / (N * g1)}
    text = json.dumps(out)
    if args.json:
        args.json.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
