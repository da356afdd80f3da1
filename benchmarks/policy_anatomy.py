"""What a model's P: answers are made of, greedy and sampled (docs/grpo.md, section 4).

    python benchmarks/policy_anatomy.py MODEL_DIR [--policy 400] [--samples 4] [--temperature 0.3]

For the first --policy test positions: candidates listed per answer, how many distinct, the share
of listed moves that are legal (overall and by slot), and the answers that hold as many distinct
legal candidates as the strict `policy/valid` metric asks (tasks.valid_policy_answer). Moves are
read from the M: field even when the answer does not parse (tasks.read_policy_fields, as the graded
reward reads them), so a malformed answer still counts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections import Counter

import chess
import torch

from rookworld_lib.chess import data, evaluate, tasks
from rookworld_lib.core.model import GPT
from rookworld_lib.lab import workflow


def anatomy(completions: list[str], records: list[dict]) -> dict:
    c, legal_at, listed_at = Counter(), Counter(), Counter()
    for completion, rec in zip(completions, records):
        board, parse = chess.Board(rec["fen"]), tasks.parse_policy_completion(completion)
        moves = list(tasks.read_policy_fields(completion, parse).moves)  # M: as far as it reads, malformed or not
        legal = [tasks.legal_move(board, m) is not None for m in moves]
        need = min(tasks.MAX_CANDIDATES, board.legal_moves.count())
        c["answers"] += 1
        c["listed"] += len(moves)
        c["distinct"] += len(set(moves))
        c["legal"] += sum(legal)
        c["five distinct"] += len(set(moves)) == len(moves) == need
        c["enough distinct legal"] += len({m for m, ok in zip(moves, legal) if ok}) >= need
        c["valid"] += tasks.valid_policy_answer(board, parse)
        for i, ok in enumerate(legal[:tasks.MAX_CANDIDATES]):
            listed_at[i] += 1
            legal_at[i] += ok
    n = c["answers"]
    return {"answers": n, "moves listed per answer": round(c["listed"] / n, 2),
            "distinct moves per answer": round(c["distinct"] / n, 2),
            "legal share of listed moves": round(c["legal"] / max(1, c["listed"]), 3),
            "legal share by slot": [round(legal_at[i] / max(1, listed_at[i]), 3) for i in sorted(listed_at)],
            "answers with as many distinct candidates as needed": round(c["five distinct"] / n, 3),
            "answers with as many distinct legal candidates as needed": round(c["enough distinct legal"] / n, 3),
            "policy/valid": round(c["valid"] / n, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a Hugging Face model directory (an export of ours)")
    ap.add_argument("--policy", type=int, default=400, help="P: test records")
    ap.add_argument("--samples", type=int, default=4, help="sampled answers per prompt")
    ap.add_argument("--temperature", type=float, default=0.3, help="sampling temperature (the cpu recipe's)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = workflow.eval_config(workflow.resolve("cpu"), 0)
    model = GPT.from_pretrained(args.model).eval()
    records = data.load_split("P", "test").records[:args.policy]
    prompts = [evaluate.policy_prompt_of(r, cfg.for_model(model).layout) for r in records]
    greedy = evaluate.complete(model, prompts, cfg)
    sampled = evaluate.complete(model, prompts, dataclasses.replace(cfg, sample_temperature=args.temperature),
                                samples=args.samples)
    print(json.dumps({"model": args.model, "greedy": anatomy(greedy, records),
                      f"sampled at T={args.temperature:g}": anatomy(sampled, [r for r in records for _ in range(args.samples)]),
                      "first greedy answers": greedy[:3]}, indent=1))


if __name__ == "__main__":
    main()
