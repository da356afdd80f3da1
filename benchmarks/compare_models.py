"""Two models judged on the same test records, with paired 95% intervals (docs/grpo.md): e.g. the
shipped recipe's final model against one that spent the same time differently.

    python benchmarks/compare_models.py runs/<a>/training/final runs/<b>/training/final --out cmp.json

Each model answers the whole `P:` and `A:` test splits (or the first --policy / --env records)
greedily and as pass@1 over --samples samples at --temperature (the cpu profile's rollout
temperature by default); the table is `evaluate.paired_change` with the first model as "before".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import torch

from rookworld_lib.chess import data, evaluate
from rookworld_lib.core.model import GPT
from rookworld_lib.lab import workflow


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("first", help="Hugging Face GPT-2 directory (the table's 'before')")
    ap.add_argument("second", help="Hugging Face GPT-2 directory (the table's 'after')")
    ap.add_argument("--policy", type=int, default=None, help="P: test records (default: all)")
    ap.add_argument("--env", type=int, default=None, help="A: test records (default: all)")
    ap.add_argument("--samples", type=int, default=4, help="pass@1 samples per prompt")
    ap.add_argument("--temperature", type=float, default=None, help="of the samples (default: the cpu profile's GRPO)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", type=Path, default=None, help="also write the table as JSON here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    prof = workflow.resolve("cpu")
    cfg = dataclasses.replace(workflow.eval_config(prof, args.seed), samples=args.samples,
                              sample_temperature=prof.grpo.temperature if args.temperature is None else args.temperature)
    policy = data.load_split("P", "test").records[:args.policy]
    env = data.load_split("A", "test").records[:args.env]
    results = []
    for directory in (args.first, args.second):
        model = GPT.from_pretrained(directory).eval()
        results.append({**evaluate.evaluate_policy(model, policy, cfg), **evaluate.evaluate_environment(model, env, cfg)})
    table = evaluate.paired_change(*results)
    print(f"before: {args.first}\nafter:  {args.second}")
    print(table.to_string())
    if args.out:
        args.out.write_text(json.dumps({"first": args.first, "second": args.second,
                                        "table": table.reset_index().to_dict(orient="records")}, indent=1) + "\n")


if __name__ == "__main__":
    main()
