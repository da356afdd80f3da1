"""The cpu profile's SFT on the shipped train split with each P: record's candidates reordered
(docs/grpo.md, section 4): does the greedy answer still repeat one move?

    python benchmarks/sft_candidate_order.py --order shuffle --out runs/sft_order_shuffle
    python benchmarks/policy_anatomy.py runs/sft_order_shuffle/sft/final

--order shuffle permutes each record's (move, eval) pairs with a seeded generator, as the original
RookWorld data do; --order uci sorts them by move text (the library's `RecordReader(candidate_order=
"uci")`, `rookworld sft --candidate-order uci`); --order best keeps the shipped order (best first),
the baseline trained by the same script. B: is unchanged. Our compact records list the best move
first and the record check insists on it, so for shuffle this script relaxes that one check for its
own reordered copy (in <out>/data); val data and everything else are the shipped files.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from pathlib import Path

import torch

from rookworld_lib.chess import data, tasks
from rookworld_lib.chess.training import RecordReader
from rookworld_lib.core.paths import DATA_DIR
from rookworld_lib.core.train_sft import train_sft
from rookworld_lib.lab import workflow


def shuffle(src: Path, dst: Path, seed: int) -> None:
    rng = random.Random(seed)
    with open(src) as f, open(dst, "w") as g:
        for line in f:
            rec = json.loads(line)
            pairs = list(zip(rec["moves"], rec["evals"]))
            rng.shuffle(pairs)
            rec["moves"], rec["evals"] = [m for m, _ in pairs], [e for _, e in pairs]
            rec["completion"] = tasks.policy_completion(rec["moves"], rec["evals"], rec["best"])
            g.write(json.dumps(rec) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--order", choices=("best", "shuffle", "uci"), default="shuffle")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=None, help="SFT steps (default: the cpu profile's; a few for a smoke run)")
    args = ap.parse_args()
    train = DATA_DIR
    if args.order == "shuffle":
        train = args.out / "data"
        train.mkdir(parents=True, exist_ok=True)
        shuffle(DATA_DIR / "policy_train.jsonl", train / "policy_train.jsonl", args.seed)
        shutil.copy(DATA_DIR / "env_train.jsonl", train / "env_train.jsonl")
        check = data.validate_record

        def best_need_not_lead(rec, task=None):
            error = check(rec, task)
            return None if error and "is not moves[0]" in error else error

        data.validate_record = best_need_not_lead
    torch.manual_seed(args.seed)
    start = time.time()
    result = train_sft(workflow.sft_config(workflow.resolve("cpu", sft_steps=args.steps), args.out / "sft", DATA_DIR, args.seed, train),
                       reader=RecordReader("compact", "uci" if args.order == "uci" else "layout"))
    print(f"SFT {time.time() - start:.0f} s; last record {result.history[-1]}; model in {args.out / 'sft' / 'final'}")


if __name__ == "__main__":
    main()
