"""Shared helpers for the chess tests: seeded positions, shipped-data access, string mutations."""

from __future__ import annotations

import os
import random
import signal
import time

import chess
import pytest

from rookworld_lib.chess import data, tasks
from rookworld_lib.chess.engine import stockfish_available
from rookworld_lib.chess.reward_examples import MUTATION_ALPHABET, mutate_text

needs_stockfish = pytest.mark.skipif(not stockfish_available(), reason="Stockfish is not installed")


def random_positions(n: int, seed: int = 0, max_plies: int = 80) -> list[chess.Board]:
    """`n` positions (with legal moves) from seeded random games."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        board = chess.Board()
        for _ in range(rng.randint(0, max_plies)):
            moves = list(board.legal_moves)
            if not moves:
                break
            board.push(rng.choice(moves))
        if any(board.legal_moves):
            out.append(board.copy(stack=False))
    return out


def shipped(task: str, split: str) -> list[dict]:
    """Records of a shipped data file (skips the test when the file is absent)."""
    path = data.data_file(task, split)
    if not path.exists():
        pytest.skip(f"{path} is not generated")
    return data.load_jsonl(path, task=task).records


def mutate(text: str, rng: random.Random, edits: int = 1) -> str:
    """`edits` random character edits (replace / insert / delete / swap) of `text`, newlines included."""
    return mutate_text(text, rng, edits, alphabet=MUTATION_ALPHABET + " \n")


def corrupt_one_char(fen: str, rng: random.Random) -> str:
    """`fen` with exactly one character changed (never into the same text)."""
    alphabet = "pnbrqkPNBRQK12345678/wb-"
    while True:
        i = rng.randrange(len(fen))
        c = rng.choice(alphabet)
        if c != fen[i]:
            out = fen[:i] + c + fen[i + 1:]
            if out != fen and "+" not in out:
                return out


def policy_completion_for(rec: dict, best: str) -> str:
    """The record's true M:/E: fields with `best` in B: (the move under test)."""
    return f" M: {' '.join(rec['moves'])} E: {' '.join(rec['evals'])} B: {best}"


def a_legal_position_with(tag: str, records: list[dict]) -> dict:
    for r in records:
        if tag in r["tags"]:
            return r
    pytest.fail(f"no record tagged {tag!r}")


__all__ = ["needs_stockfish", "random_positions", "shipped", "mutate", "corrupt_one_char", "policy_completion_for",
           "a_legal_position_with", "tasks"]


def engine_pids(pool) -> list[int]:
    """Process ids of a pool's running engines (for the fault tests)."""
    with pool._lock:
        engines = list(pool._engines)
    return [e.transport.get_pid() for e in engines]


def wait_gone(pids, timeout: float = 10.0) -> list[int]:
    """Wait until none of `pids` is a live (non-zombie) process; return those still alive."""
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _alive(p)]
        if alive:
            time.sleep(0.05)
    return alive


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False


def default_sigint() -> None:
    """preexec_fn for a child that a test stops with SIGINT: a shell that started the test run in
    the background ignores SIGINT, its children inherit that, and Python raises KeyboardInterrupt
    only where SIGINT is not ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
