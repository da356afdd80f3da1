"""GRPO steps on CUDA with and without cuDNN attention, interleaved (a benchmark, not a test).

    python benchmarks/bench_grpo_attention.py [--steps 40] [--json out.json]

Two GRPO trainers with the `gpu` profile's step (GPT-2 124M, 64 prompts x 8 completions x 96 tokens,
bf16 autocast, KL 0.04, the chess reward on the shipped training prompts) start from the same weights;
one lets scaled_dot_product_attention use cuDNN (`cudnn_attention=True`, PyTorch's choice and the
trainer's default), the other does not. Their steps alternate, the no-cuDNN trainer first, so that a
shape's first-time costs outside attention fall on the contender without cuDNN. cuDNN builds an execution plan
for each new attention shape; a GRPO step's shapes change with every rollout, so the plan building
shows up as slow steps, which the mean (the run's wall time) counts and the median hides: both are
printed, with every step's time and phases. docs/perf.md has the measurements.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import platform
import statistics
from pathlib import Path

import torch

from rookworld_lib.chess.training import chess_reward, prompt_items, train_records
from rookworld_lib.core.model import GPT, GPTConfig
from rookworld_lib.core.train_grpo import GRPOTrainer
from rookworld_lib.lab import perf
from rookworld_lib.lab.workflow import PROFILES


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40,
                    help="timed steps per contender (after one warm-up step); 12 showed mostly cuDNN's plan building")
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_grpo_attention.py needs CUDA: cuDNN attention exists only there")
    profile = PROFILES["gpu"]
    torch.manual_seed(args.seed)
    model = GPT(GPTConfig.preset(args.model, dropout=0.0, **profile.sft.model_overrides))
    items = prompt_items(train_records())
    cfg = dataclasses.replace(profile.grpo, device="cuda", seed=args.seed, progress=False, out_dir=None,
                              steps=args.steps + 2)
    trainers = {name: GRPOTrainer(copy.deepcopy(model), items, dataclasses.replace(cfg, cudnn_attention=cudnn),
                                  reward_funcs=chess_reward)
                for name, cudnn in (("without_cudnn", False), ("with_cudnn", True))}
    records = {name: [] for name in trainers}
    t = perf.benchmark_interleaved({name: (lambda n=name: records[n].append(trainers[n].train_step()))
                                    for name in trainers}, warmup=1, repeats=args.steps, sync="cuda")
    n = cfg.prompts_per_step * cfg.group_size
    out = {"model": args.model, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "python": platform.python_version(), "completions_per_step": n,
           "settings": {k: getattr(cfg, k) for k in ("prompts_per_step", "group_size", "max_new_tokens",
                                                     "temperature", "minibatch_size", "dtype")} | {"beta": cfg.loss.beta}}
    for name, timing in t.items():
        timed = records[name][1:]  # the warm-up step's record is the first
        out[name] = {**timing.as_dict(), "completions_per_s_mean": n / timing.mean_s,
                     "completions_per_s_median": n / timing.median_s,
                     **{f"{k}_s": [round(r[f"time/{k}"], 4) for r in timed] for k in ("sampling", "scoring", "update")},
                     "completion_len_mean": statistics.fmean(r["completions/mean_length"] for r in timed)}
        print(f"{name:>14}: mean {timing.mean_s:.3f} s, median {timing.median_s:.3f} s, max {max(timing.times_s):.3f} s "
              f"({n / timing.mean_s:.0f} completions/s by the mean)")
    out["speedup_mean"] = t["with_cudnn"].mean_s / t["without_cudnn"].mean_s
    out["speedup_median"] = t["with_cudnn"].median_s / t["without_cudnn"].median_s
    print(f"without cuDNN attention: {out['speedup_mean']:.2f}x by the mean, {out['speedup_median']:.2f}x by the median")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
