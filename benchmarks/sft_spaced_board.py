"""Does the model read the board better when each square is its own token? (docs/grpo.md, section 4)

    python benchmarks/sft_spaced_board.py --out runs/sft_spaced_board

GPT-2's BPE merges a FEN's board into pieces of varying size (`4ppP1` -> `4`, `pp`, `P`, `1`), so
a square's position in the token sequence depends on everything before it. This script trains the
`cpu` profile's SFT on the shipped train split with the board of every P: prompt written one
square per token (`r n b q k b n r / p p p p p p p p / . . . . . . . . / ...`; side to move,
castling, en passant and clocks as before; A: records unchanged), then measures the P: answers on
the first 400 test positions, prompted the same way, with policy_anatomy's measures. It is an
experiment, not a layout of the workbench: prompts grow from about 50 to about 100 tokens, so the
same 3,000 steps see fewer P: records per step, and the val loss is over the rewritten val texts.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from policy_anatomy import add_arguments, measure

from rookworld_lib.chess import evaluate
from rookworld_lib.chess.data import split_paths
from rookworld_lib.chess.training import RecordReader
from rookworld_lib.core.model import GPT
from rookworld_lib.core.paths import DATA_DIR
from rookworld_lib.core.train_sft import train_sft
from rookworld_lib.lab import workflow


def spaced_board(fen: str) -> str:
    """The FEN with its board one square per token: pieces and '.' for empty squares, space-separated."""
    board, rest = fen.split(" ", 1)
    ranks = ["".join("." * int(c) if c.isdigit() else c for c in rank) for rank in board.split("/")]
    return " / ".join(" ".join(rank) for rank in ranks) + " " + rest


def spaced_text(text: str) -> str:
    if not text.startswith("P: "):
        return text
    head, sep, answer = text.partition(" M: ")
    return "P: " + spaced_board(head[3:]) + sep + answer


def write_texts(out: Path) -> None:
    reader = RecordReader("compact")
    out.mkdir(parents=True, exist_ok=True)
    for split in ("train", "val"):
        for path in split_paths(split, DATA_DIR):
            with open(out / Path(path).name, "w") as f:
                for text in reader.iter_texts([path]):
                    f.write(json.dumps({"text": spaced_text(text)}) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=None, help="SFT steps (default: the cpu profile's; a few for a smoke run)")
    add_arguments(ap)
    args = ap.parse_args()
    texts = args.out / "data"
    write_texts(texts)
    torch.manual_seed(args.seed)
    start = time.time()
    result = train_sft(workflow.sft_config(workflow.resolve("cpu", sft_steps=args.steps), args.out / "sft", texts, args.seed, texts))
    print(f"SFT {time.time() - start:.0f} s; last record {result.history[-1]}")
    model = GPT.from_pretrained(args.out / "sft" / "final").eval()
    print(json.dumps(measure(model, args, lambda r: spaced_text(evaluate.policy_prompt_of(r, "compact")), args.seed),
                     indent=1))


if __name__ == "__main__":
    main()
