"""A profile's SFT step on the CPU in several variants, interleaved (a benchmark, not a test).

    python benchmarks/bench_sft_step_cpu.py [--profile cpu-long] [--variants eager,compile,bf16]
                                            [--steps 60] [--threads 2] [--json out.json]

Each variant is an SFTTrainer built from the profile's `sft_config` on the shipped data (the P:
candidates in the profile's order) with one change: `compile` (torch.compile of the model, the
first step untimed and reported apart: it compiles), `bf16` (bf16 autocast, weights and optimizer in
fp32). All start from the same seed and read the same batches; their steps alternate, so a noisy
machine's slowdowns fall on all of them. Printed: each variant's first step, median, p10-p90 and mean
step, its speed against the first variant by the median, and the loss after the last step (the same
math: eager and compile agree to float noise; bf16 drifts as another seed would). docs/perf.md has the
measurements.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import tempfile
import time
from pathlib import Path

import torch

from rookworld_lib.chess.training import RecordReader
from rookworld_lib.core.paths import DATA_DIR
from rookworld_lib.core.train_sft import SFTTrainer
from rookworld_lib.lab import perf, workflow

VARIANTS = {"eager": {}, "compile": {"compile": True}, "bf16": {"dtype": "bf16"}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="cpu-long", choices=sorted(workflow.PROFILES))
    ap.add_argument("--variants", default="eager,compile", help=f"comma-separated, the first is the baseline: {', '.join(VARIANTS)}")
    ap.add_argument("--steps", type=int, default=60, help="timed steps per variant, after one untimed first step")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    names = args.variants.split(",")
    if unknown := set(names) - set(VARIANTS):
        ap.error(f"unknown variants {sorted(unknown)}; choose from {sorted(VARIANTS)}")
    torch.set_num_threads(args.threads)
    profile = workflow.resolve(args.profile, device="cpu")
    trainers, first = {}, {}
    scratch = tempfile.TemporaryDirectory(prefix="bench-sft-")  # out_dirs: the steps write nothing there
    for name in names:
        base = workflow.sft_config(profile, Path(scratch.name) / name, DATA_DIR, args.seed)
        cfg = dataclasses.replace(base, eval_interval=0, checkpoint_interval=0, progress=False, report_to="none",
                                  **VARIANTS[name])
        torch.manual_seed(args.seed)
        trainers[name] = SFTTrainer(cfg, reader=RecordReader("compact", profile.candidate_order))
    for name, trainer in trainers.items():
        t0 = time.perf_counter()
        trainer.train_step()
        first[name] = time.perf_counter() - t0
    losses = {}

    def step(name):
        def run():
            losses[name] = trainers[name].train_step()["loss"]
        return run

    timings = perf.benchmark_interleaved({name: step(name) for name in names}, warmup=0, repeats=args.steps, sync=False)
    base = timings[names[0]].median_s
    out = {"profile": args.profile, "cpu": perf.cpu_name(), "cpu_native_bf16": perf.cpu_native_bf16(),
           "threads": args.threads, "torch": torch.__version__, "python": platform.python_version(),
           "steps": args.steps, "tokens_per_step": trainers[names[0]].cfg.tokens_per_step, "variants": {}}
    for name in names:
        t = timings[name]
        out["variants"][name] = {"first_step_s": first[name], "median_s": t.median_s, "p10_s": t.p10_s, "p90_s": t.p90_s,
                                 "mean_s": t.mean_s, "speed_vs_" + names[0]: base / t.median_s, "loss_after": losses[name]}
        print(f"{name:8s} first step {first[name]:6.1f} s | median {t.median_s:.4f} s (p10 {t.p10_s:.4f}, p90 {t.p90_s:.4f}), "
              f"mean {t.mean_s:.4f} | {base / t.median_s:.3f}x {names[0]} | loss after {args.steps + 1} steps "
              f"{losses[name]:.5f}")
    print(f"load average at the end: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    scratch.cleanup()
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
