"""Example completions of graded quality, for showing what the rewards do (notebook 00) and for
robustness checks: the best move down to garbage, for P: and A: records of the data set."""

from __future__ import annotations

import random

import chess

from .rewards import score_environment, score_policy

MUTATION_ALPHABET = "abcdefgh12345678qrbnkpPNBRQK/ -+.M:E0"
GARBAGE_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 .,!?"


def edit_chars(chars: list[str], op: str, i: int, c: str | None = None) -> None:
    """One edit of `chars` in place at index `i` (0..len): r(eplace) or i(nsert) `c`, d(elete),
    s(wap with the next); an edit that does not fit (replace in nothing) does nothing."""
    if op == "r" and chars:
        chars[min(i, len(chars) - 1)] = c
    elif op == "i":
        chars.insert(i, c)
    elif op == "d" and chars:
        del chars[min(i, len(chars) - 1)]
    elif op == "s" and len(chars) > 1:
        j = min(i, len(chars) - 2)
        chars[j], chars[j + 1] = chars[j + 1], chars[j]


def mutate_text(text: str, rng: random.Random, edits: int = 1, alphabet: str = MUTATION_ALPHABET) -> str:
    """`text` with `edits` random character edits (replace, insert, delete, swap): a garbled answer."""
    chars = list(text)
    for _ in range(edits):
        op = rng.choice("rids")
        i = rng.randrange(len(chars) + 1)
        needs_char = op == "i" or (op == "r" and chars)
        edit_chars(chars, op, i, rng.choice(alphabet) if needs_char else None)
    return "".join(chars)


def _garbage(rng: random.Random) -> str:
    return "".join(rng.choice(GARBAGE_ALPHABET) for _ in range(rng.randint(5, 40)))


# The example categories from the best answer to garbage, P:'s then A:'s own (for a figure's axis)
CATEGORY_ORDER = ("best", "2nd", "5th", "random legal", "illegal", "best repeated", "exact", "one FEN char off",
                  "wrong terminated flag", "garbled", "garbage")


def policy_examples(rec, seed: int = 0) -> dict[str, str]:
    """Completions of graded quality for one P: record, keyed by category: the record's M:/E: with
    B: = best, 2nd, 5th candidate; a random legal move outside them, then an illegal move, each put in
    M: as the last candidate and named in B: (well-formed, as the gate reads it); the best move repeated in every M: slot
    (malformed: a small model's greedy failure); a garbled copy of the true completion (3-8
    character edits); and random garbage."""
    rng = random.Random(f"{seed}:{rec['id']}")
    board = chess.Board(rec["fen"])
    head = f" M: {' '.join(rec['moves'])} E: {' '.join(rec['evals'])} B: "
    out = {name: head + rec["moves"][k] for k, name in ((0, "best"), (1, "2nd"), (4, "5th")) if k < len(rec["moves"])}
    moves, evals = rec["moves"], rec["evals"]

    def as_last_candidate(move: str) -> str:  # well-formed: the move replaces the last candidate and is B:
        return f" M: {' '.join([*moves[:-1], move])} E: {' '.join(evals)} B: {move}"

    others = sorted(m.uci() for m in board.legal_moves if m.uci() not in moves)
    if others:
        out["random legal"] = as_last_candidate(rng.choice(others))
    while "illegal" not in out:
        m = chess.Move(rng.choice(chess.SQUARES), rng.choice(chess.SQUARES))
        if m.from_square != m.to_square and not board.is_legal(m):
            out["illegal"] = as_last_candidate(m.uci())
    if len(moves) > 1:
        out["best repeated"] = f" M: {' '.join([moves[0]] * len(moves))} E: {' '.join([evals[0]] * len(moves))} B: {moves[0]}"
    out["garbled"] = mutate_text(rec["completion"], rng, rng.randint(3, 8))
    out["garbage"] = _garbage(rng)
    return out


def env_examples(rec, seed: int = 0) -> dict[str, str]:
    """Completions for one A: record: exact, one FEN character off, wrong flags, garbled, garbage."""
    rng = random.Random(f"{seed}:{rec['id']}")
    fen, rest = rec["completion"].split("+", 1)
    while True:
        i = rng.randrange(len(fen))
        c = rng.choice("pnbrqkPNBRQK12345678/wb-")
        if c != fen[i]:
            break
    flags = rest.split("+")
    flags[1] = "1" if flags[1] == "0" else "0"
    return {"exact": rec["completion"], "one FEN char off": fen[:i] + c + fen[i + 1:] + "+" + rest,
            "wrong terminated flag": fen + "+" + "+".join(flags),
            "garbled": mutate_text(rec["completion"], rng, rng.randint(3, 8)), "garbage": _garbage(rng)}


def reward_distribution(policy_records=(), env_records=(), seed: int = 0, policy_weights=None,
                        env_weights=None) -> list[dict]:
    """One row per (record, example category): task, category, reward, id (for tables and plots).
    `policy_weights` / `env_weights`: score_policy's and score_environment's (None: the format-gated
    reward, `rewards.score`; rewards.GradedWeights() and rewards.GRADED_ENV_WEIGHTS: the graded one GRPO trains)."""
    rows = [{"task": "P", "category": cat, "reward": score_policy(rec["prompt"], c, truth=rec, weights=policy_weights),
             "id": rec["id"]}
            for rec in policy_records for cat, c in policy_examples(rec, seed).items()]
    return rows + [{"task": "A", "category": cat, "reward": score_environment(rec["prompt"], c, truth=rec, weights=env_weights),
                    "id": rec["id"]} for rec in env_records for cat, c in env_examples(rec, seed).items()]
