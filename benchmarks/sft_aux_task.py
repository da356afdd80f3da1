"""Does an auxiliary task about the position teach the model to read the board? (docs/grpo.md, section 4)

    python benchmarks/sft_aux_task.py --out runs/sft_aux [--task legal|pieces] [--positions 3962] [--source P]

policy_anatomy finds that more than half of the moves the `cpu` SFT model lists start from a square
without a piece of the side to move: it does not read the board from the FEN. This script adds a
third text task to the `cpu` profile's SFT, built by python-chess alone (no engine):

    --task legal:   L: <FEN> = <every legal move in UCI, sorted>
    --task pieces:  S: <FEN> = <every piece of the side to move and its square, a1 to h8: Ra1 Nb1 ...>

for the positions of the first --positions train records of --source (P: records, or P: then A:
records' positions before the move), deduplicated. The P: and A: texts and the val texts are the
shipped ones, so the val loss compares with the baseline's. The profile's stream draws a P: or an A:
text with even odds (SFTConfig.task_weights {'P': 0.5, 'A': 0.5}); the auxiliary texts are drawn on the P: side, so
the same 3,000 steps see the A: texts as often as the baseline does and the P: texts less often. It
then measures the P: answers on the first --policy test positions with policy_anatomy's measures,
greedy and sampled, and how many auxiliary answers on 50 test positions are exactly right. An
experiment, not a workbench task.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import time
from pathlib import Path

import chess
import torch
from policy_anatomy import add_arguments, measure

from rookworld_lib.chess import data, evaluate
from rookworld_lib.chess.data import split_paths
from rookworld_lib.chess.training import RecordReader
from rookworld_lib.core.model import GPT
from rookworld_lib.core.paths import DATA_DIR
from rookworld_lib.core import train_sft as sft_module
from rookworld_lib.core.tokenizer import encode_prompt, task_of
from rookworld_lib.core.train_sft import train_sft
from rookworld_lib.lab import workflow


def legal_moves(board: chess.Board) -> str:
    return " ".join(sorted(m.uci() for m in board.legal_moves))


def own_pieces(board: chess.Board) -> str:
    return " ".join(p.symbol().upper() + chess.square_name(sq) for sq, p in sorted(board.piece_map().items())
                    if p.color == board.turn)


TASKS = {"legal": ("L", legal_moves), "pieces": ("S", own_pieces)}  # --task: (text prefix, answer)


def aux_text(task: str, fen: str) -> str:
    """The auxiliary text of a position: its prefix and FEN, ' = ', the answer."""
    letter, answer = TASKS[task]
    return f"{letter}: {fen} = {answer(chess.Board(fen))}"


def positions(source: str, limit: int) -> list[str]:
    fens, seen = [], set()
    for task in ("P", "A") if source == "PA" else ("P",):
        for rec in data.load_split(task, "train").records:
            if rec["fen"] not in seen and chess.Board(rec["fen"]).legal_moves.count():
                seen.add(rec["fen"])
                fens.append(rec["fen"])
    return fens[:limit]


def write_texts(out: Path, task: str, fens: list[str], seed: int) -> int:
    """The shipped train texts with the auxiliary texts mixed in at random places; the shipped val texts."""
    reader = RecordReader("compact")
    out.mkdir(parents=True, exist_ok=True)
    train = list(reader.iter_texts(split_paths("train", DATA_DIR))) + [aux_text(task, f) for f in fens]
    random.Random(seed).shuffle(train)
    files = {"policy_train": train}  # every train text in one file (split_paths finds it as the P: file)
    for task in ("P", "A"):  # the val files as shipped, text for text
        files[data.data_file(task, "val").stem] = list(reader.iter_texts(data.split_files(task, "val", DATA_DIR)))
    for stem, texts in files.items():
        with open(out / f"{stem}.jsonl", "w") as f:
            f.writelines(json.dumps({"text": t}) + "\n" for t in texts)
    return len(fens)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--task", choices=sorted(TASKS), default="legal", help="the auxiliary task (see the description above)")
    ap.add_argument("--positions", type=int, default=3962, help="auxiliary texts (distinct train positions)")
    ap.add_argument("--source", choices=("P", "PA"), default="P", help="whose positions: P: records, or P: then A:")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=None, help="SFT steps (default: the cpu profile's; a few for a smoke run)")
    add_arguments(ap)
    args = ap.parse_args()
    texts = args.out / "data"
    n = write_texts(texts, args.task, positions(args.source, args.positions), args.seed)
    letter = TASKS[args.task][0]
    print(f"{n} {letter}: texts, e.g. {aux_text(args.task, chess.STARTING_FEN)}")
    # the stream sorts texts into its P: and A: pools by their task; an auxiliary text joins the P: pool
    sft_module.task_of = lambda text, tasks: "P" if text.startswith(f"{letter}:") else task_of(text, tasks)
    torch.manual_seed(args.seed)
    start = time.time()
    result = train_sft(workflow.sft_config(workflow.resolve("cpu", sft_steps=args.steps), args.out / "sft", texts, args.seed))
    print(f"SFT {time.time() - start:.0f} s; last record {result.history[-1]}")
    model = GPT.from_pretrained(args.out / "sft" / "final").eval()
    records = data.load_split("P", "test").records[:50]
    cfg = workflow.eval_config(workflow.resolve("cpu"), args.seed)
    prompts = [f"{letter}: {r['fen']} =" for r in records]
    # up to 200 tokens, as many as the context leaves after the longest prompt (evaluate refuses more)
    room = model.config.block_size + 1 - max(len(encode_prompt(p, model.prompt_prefix)) for p in prompts)
    answers = evaluate.complete(model, prompts, dataclasses.replace(cfg, max_new_tokens=min(200, room)))
    exact = sum(a.strip() == aux_text(args.task, r["fen"]).split(" = ", 1)[1] for a, r in zip(answers, records))
    print(json.dumps({**measure(model, args, seed=args.seed), f"{letter}: answers exactly right (first 50 test positions)": exact,
                      f"first {letter}: answer": answers[0]}, indent=1))


if __name__ == "__main__":
    main()
