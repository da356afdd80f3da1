"""What a model's P: answers are made of, greedy and sampled (docs/grpo.md, section 4).

    python benchmarks/policy_anatomy.py MODEL_DIR [--policy 400] [--samples 4] [--temperature 0.3]

For the first --policy test positions: candidates listed per answer, how many distinct, the share
of listed moves that are legal (overall and by slot), and the answers that hold as many distinct
legal candidates as the strict `policy/valid` metric asks (tasks.valid_policy_answer). Moves are
read from the M: field even when the answer does not parse (tasks.read_policy_fields, as the graded
reward reads them), so a malformed answer still counts.

Why a listed move is illegal (`why_illegal`), as shares of all listed moves: not a move at all (not
UCI, or a null move such as e2e2); its from-square holds no piece of the side to move (the model
misread the board); the piece there never moves that way, even on an empty board (misread the
piece's rules); or the piece could move so on an empty board, but this position forbids it (a piece
in the way, the target square held by its own side, a pawn's capture with nothing to take, its own
king left in check, castling without the right).
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


ILLEGAL_KINDS = ("not a move", "no own piece on the from-square", "not how that piece moves",
                 "blocked or forbidden in this position")


def why_illegal(board: chess.Board, text: str) -> str | None:
    """None for a legal move, else which of ILLEGAL_KINDS it is (see the module docstring)."""
    if tasks.legal_move(board, text) is not None:
        return None
    try:
        move = chess.Move.from_uci(text) if tasks.is_uci_syntax(text) else None
    except ValueError:
        move = None
    if move is None:
        return ILLEGAL_KINDS[0]
    piece = board.piece_at(move.from_square)
    if piece is None or piece.color != board.turn:
        return ILLEGAL_KINDS[1]
    alone = chess.Board(None)  # the piece alone, with an enemy rook on the target (a pawn may capture)
    alone.set_piece_at(move.from_square, piece)
    alone.set_piece_at(move.to_square, chess.Piece(chess.ROOK, not piece.color))
    alone.turn = piece.color
    pattern = alone.is_pseudo_legal(move) or alone.is_pseudo_legal(chess.Move(move.from_square, move.to_square,
                                                                              promotion=move.promotion))
    if not pattern and piece.piece_type == chess.PAWN:  # a push: onto an empty square
        alone.remove_piece_at(move.to_square)
        pattern = alone.is_pseudo_legal(move)
    castling = (piece.piece_type == chess.KING and chess.square_rank(move.from_square) == chess.square_rank(move.to_square)
                and abs(chess.square_file(move.from_square) - chess.square_file(move.to_square)) == 2
                and move.from_square in (chess.E1, chess.E8))
    return ILLEGAL_KINDS[3] if pattern or castling else ILLEGAL_KINDS[2]


def anatomy(completions: list[str], records: list[dict]) -> dict:
    c, legal_at, listed_at = Counter(), Counter(), Counter()
    for completion, rec in zip(completions, records):
        board, parse = chess.Board(rec["fen"]), tasks.parse_policy_completion(completion)
        moves = list(tasks.read_policy_fields(completion, parse).moves)  # M: as far as it reads, malformed or not
        kinds = [why_illegal(board, m) for m in moves]
        legal = [k is None for k in kinds]
        c.update(k for k in kinds if k is not None)
        need = tasks.candidates_wanted(board, rec["moves"])
        c["answers"] += 1
        c["listed"] += len(moves)
        c["distinct"] += len(set(moves))
        c["legal"] += sum(legal)
        c["five distinct"] += len(set(moves)) == len(moves) == need
        c["enough distinct legal"] += len({m for m, ok in zip(moves, legal) if ok}) >= need
        c["valid"] += tasks.valid_policy_answer(board, parse, rec["moves"])
        for i, ok in enumerate(legal[:tasks.MAX_CANDIDATES]):
            listed_at[i] += 1
            legal_at[i] += ok
    n = c["answers"]
    return {"answers": n, "moves listed per answer": round(c["listed"] / n, 2),
            "distinct moves per answer": round(c["distinct"] / n, 2),
            "legal share of listed moves": round(c["legal"] / max(1, c["listed"]), 3),
            "legal share by slot": [round(legal_at[i] / max(1, listed_at[i]), 3) for i in sorted(listed_at)],
            "listed moves that are illegal, by why": {k: round(c[k] / max(1, c["listed"]), 3) for k in ILLEGAL_KINDS},
            "answers with as many distinct candidates as needed": round(c["five distinct"] / n, 3),
            "answers with as many distinct legal candidates as needed": round(c["enough distinct legal"] / n, 3),
            "policy/valid": round(c["valid"] / n, 3)}


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The measurement's options, shared with the SFT experiments that end in it."""
    ap.add_argument("--policy", type=int, default=400, help="P: test records")
    ap.add_argument("--samples", type=int, default=4, help="sampled answers per prompt")
    ap.add_argument("--temperature", type=float, default=0.3, help="sampling temperature (the cpu recipe's)")


def measure(model: GPT, args: argparse.Namespace, prompt_of=None, seed: int = 0) -> dict:
    """anatomy() of the model's greedy and sampled answers on the first args.policy P: test positions,
    prompted by prompt_of(record) (default: the P: prompt in the model's layout)."""
    cfg = workflow.eval_config(workflow.resolve("cpu"), seed)
    records = data.load_split("P", "test").records[:args.policy]
    prompts = [prompt_of(r) if prompt_of else evaluate.policy_prompt_of(r, cfg.for_model(model).layout)
               for r in records]
    greedy = evaluate.complete(model, prompts, cfg)
    sampled = evaluate.complete(model, prompts, dataclasses.replace(cfg, sample_temperature=args.temperature),
                                samples=args.samples)
    return {"greedy": anatomy(greedy, records),
            f"sampled at T={args.temperature:g}": anatomy(sampled, [r for r in records for _ in range(args.samples)]),
            "first prompt": prompts[0], "first greedy answers": greedy[:3]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a Hugging Face model directory (an export of ours)")
    add_arguments(ap)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = GPT.from_pretrained(args.model).eval()
    print(json.dumps({"model": args.model, **measure(model, args)}, indent=1))


if __name__ == "__main__":
    main()
