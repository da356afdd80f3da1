"""Data: Stockfish-labelled ``P:``/``A:`` samples, the mate-in-one set, and a validating loader.

Generation (``rookworld datagen``, :func:`generate`)
    1. *Games*, each seeded from (seed, game index), of three kinds: ``random`` (uniformly random
       legal moves: long games, odd material, promotions, bare-king endings), ``opening`` (2-16
       random plies, then engine self-play) and ``selfplay`` (engine self-play from the start with
       a node budget and a share of random moves drawn per colour, 1 to 2048 nodes and 0-30%
       noise: from blunder-fests that end in mate to long, even games that reach endgames).
       Engine games run until the game is over (claimable draws included) or ``max_plies``;
       random games run on to an automatic ending (mate, stalemate, insufficient material,
       75-move rule) or 3 x ``max_plies``: the source of most rare terminal transitions.
       ``mate_games`` extra held-out games (a strong engine against a weak, noisy one) feed
       only the mate-in-one set.
    2. *Splits by game*: game i goes to test if i % 10 == 9, to val if i % 10 == 8, else train.
       A position (FEN without clocks) belongs to the split of the first game that reaches it;
       later visits from other splits are dropped, so no position is in two splits. Within a
       split, duplicate positions (P:) and duplicate (position, move) pairs (A:) are removed.
    3. *Samples*: a share (``policy_rate``) of each game's positions becomes ``P:`` samples:
       three times more for positions with a check or a legal castling, all positions with a
       legal en-passant capture or promotion, a quarter as many from random games. A share
       (``env_rate``) of its moves becomes ``A:`` samples: three times more castlings, all
       en-passant captures and promotions, half as many from random games, and always the
       game's last move (mates, stalemates, insufficient material, 75-move rule). With
       probability ``illegal_rate`` an ``A:`` sample gets a sibling at the same position with an
       illegal move (into check, a pinned piece, an opponent's piece, castling without the right,
       a promotion without a piece) or an unparseable one (SAN, off-board squares, truncated
       moves, the null move ``0000``, words). Every position of a val/test game with a mate in
       one becomes a mate-in-one sample, labelled with every mating move (brute force).
    4. *Labels*: multipv-5 Stockfish analysis of every ``P:`` position (one thread, cleared hash,
       a depth limit: reproducible, so the label audit can re-run it), in parallel on ``workers``
       engine processes. ``A:`` labels come from a python-chess replay (`tasks.environment_step`).

    Every completed game and label is appended to a work directory as it finishes; an interrupted
    run started again with the same settings reuses them and only does what is missing. The
    final files are written atomically (temporary file, then rename).

Files (JSON lines, one object per line, UTF-8)
    ``policy_{train,val,test}.jsonl``, ``env_{train,val,test}.jsonl``, ``mate_in_one.jsonl``;
    the fields of each record are in :data:`SCHEMA` and in ``data/README.md``.

Loading (:func:`load_jsonl`, :func:`load_split`)
    Every line is validated (JSON, fields and types, a valid FEN, legal moves, prompt and
    completion consistent with the fields). A bad line raises :class:`DataFormatError` with
    ``file:line: reason``; with ``on_error="skip"`` it is skipped, counted and reported.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import random
import shutil
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import chess
import chess.engine

from . import tasks
from .paths import DATA_DIR, atomic_write

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
TASK_FILES = {"P": "policy_{split}.jsonl", "A": "env_{split}.jsonl"}
MATE_FILE = "mate_in_one.jsonl"
GAME_KINDS = ("random", "opening", "selfplay")
ORIGINAL_SOURCE = "original"  # records converted from the original RookWorld data (rookworld convert)
SELFPLAY_NODES = (1, 8, 32, 128, 512, 2048)
SELFPLAY_NOISE = (0.0, 0.05, 0.15, 0.3)
ENV_KINDS = ("legal", "illegal", "unparseable")
RANDOM_PLIES_FACTOR = 3  # random games may run to 3 x max_plies
RANDOM_POLICY_WEIGHT = 0.25  # random-game positions are odd: sample fewer of them as P:
RANDOM_ENV_WEIGHT = 0.5  # ... and as A:

SCHEMA: dict[str, dict[str, str]] = {
    "P": {
        "id": "str, unique: P-<game>-<ply>",
        "task": '"P"',
        "split": "train | val | test",
        "game": "int, index of the source game (splits are by game)",
        "ply": "int, half-moves played in that game before this position",
        "source": "random | opening | selfplay (how the game was played) | original (rookworld convert)",
        "fen": "str, the position (standard FEN)",
        "moves": "list of 1-5 UCI moves, Stockfish multipv order, best first for the side to move",
        "evals": "list of eval texts, one per move, side to move's view: pawns '0.35' or mates 'M3' / '-M2'",
        "best": "str, = moves[0], the best move for the side to move",
        "n_legal": "int, number of legal moves",
        "tags": "list of: check, castling, en_passant, promotion, mate (position features)",
        "engine": "str, engine id, e.g. 'Stockfish 15.1'",
        "limit": "str, search limit, e.g. 'depth=8' (one thread, hash cleared per search)",
        "prompt": "str, 'P: <fen>' (compact layout)",
        "completion": "str, ' M: ... E: ... B: <best>' (compact layout, without EOT)",
        "original_best": "optional str: a converted original line's own B: (for black its worst listed move)",
    },
    "A": {
        "id": "str, unique: A-<game>-<ply>[-x<k>]",
        "task": '"A"',
        "split": "train | val | test",
        "game": "int",
        "ply": "int",
        "source": "random | opening | selfplay",
        "fen": "str, position before the move",
        "move": "str, the move as written (UCI for legal/illegal ones, anything without '+' or spaces otherwise)",
        "history": "list of up to 10 move strings, the current move last",
        "new_fen": "str, position after the move (= fen when the move is illegal or unparseable)",
        "reward": "float: 0.001 legal, 1.0 mover wins, 0.5 draw, -1.0 illegal/unparseable",
        "terminated": "int 0/1",
        "truncated": "int 0/1 (1 exactly for illegal/unparseable moves)",
        "kind": "legal | illegal | unparseable",
        "termination": "null | checkmate | stalemate | insufficient_material | seventyfive_moves",
        "tags": "list of: capture, castling, en_passant, promotion, check (move features)",
        "prompt": "str, 'A: <fen>+<move>+<history>+'",
        "completion": "str, '<new_fen>+<reward>+<terminated>+<truncated>' (without EOT)",
    },
    "M1": {
        "id": "str, unique: M1-<game>-<ply>",
        "task": '"M1"',
        "split": "val | test (mate-in-one positions come only from held-out games)",
        "game": "int",
        "ply": "int",
        "source": "random | opening | selfplay",
        "fen": "str, a position whose side to move can mate in one",
        "mating_moves": "list of every UCI move that mates at once",
        "prompt": "str, 'P: <fen>'",
    },
}


# --------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DatagenConfig:
    """Settings of one data-generation run. Bad values fail at construction, naming the field."""

    out_dir: str = str(DATA_DIR)  # where the JSONL files are written
    seed: int = 20261122  # seeds every game and every sampling decision
    games: int = 320  # number of games played (split 8:1:1 into train/val/test by game)
    depth: int | None = 8  # Stockfish depth of the P: labels (None: use nodes)
    nodes: int | None = None  # Stockfish node budget of the P: labels (None: use depth)
    multipv: int = 5  # candidate moves per P: label
    workers: int = 2  # Stockfish processes (and threads) used in parallel
    policy_rate: float = 0.12  # share of a game's positions sampled as P: (x3 for special positions)
    env_rate: float = 0.12  # share of a game's moves sampled as A: (the last move always)
    illegal_rate: float = 0.12  # per A: sample, chance of an extra illegal/unparseable move at that position
    random_share: float = 0.15  # share of 'random' games
    opening_share: float = 0.3  # share of 'opening' games (the rest are 'selfplay')
    max_plies: int = 300  # a game stops after this many half-moves
    mate_games: int = 160  # extra held-out games (strong vs weak side) that feed only the mate-in-one set
    work_dir: str | None = None  # resumable state; default <out_dir>/.datagen-work
    keep_work: bool = False  # keep the work directory after a successful run
    stockfish: str | None = None  # Stockfish binary (default: STOCKFISH_PATH, PATH, /usr/games/stockfish)

    def __post_init__(self):
        def bad(name, why):
            raise ValueError(f"DatagenConfig.{name} {why}, got {getattr(self, name)!r}")

        def is_int(v):
            return isinstance(v, int) and not isinstance(v, bool)

        if not is_int(self.seed):
            bad("seed", "must be an int")
        if not is_int(self.games) or self.games < 1:
            bad("games", "must be a positive int")
        if not is_int(self.mate_games) or self.mate_games < 0:
            bad("mate_games", "must be an int >= 0")
        if self.depth is None and self.nodes is None:
            raise ValueError("DatagenConfig: set depth or nodes (the P: labels need a reproducible limit)")
        if self.depth is not None and (not is_int(self.depth) or not 1 <= self.depth <= 40):
            bad("depth", "must be an int in 1..40 or None")
        if self.nodes is not None and (not is_int(self.nodes) or self.nodes < 1):
            bad("nodes", "must be a positive int or None")
        if not is_int(self.multipv) or not 1 <= self.multipv <= tasks.MAX_CANDIDATES:
            bad("multipv", f"must be an int in 1..{tasks.MAX_CANDIDATES}")
        if not is_int(self.workers) or not 1 <= self.workers <= 256:
            bad("workers", "must be an int in 1..256")
        for name in ("policy_rate", "env_rate", "illegal_rate", "random_share", "opening_share"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                bad(name, "must be a number in [0, 1]")
        if self.random_share + self.opening_share > 1.0 + 1e-12:
            raise ValueError("DatagenConfig: random_share + opening_share must be <= 1")
        if not is_int(self.max_plies) or not 1 <= self.max_plies <= 2000:
            bad("max_plies", "must be an int in 1..2000")

    def content_key(self) -> dict:
        """The settings that decide the output (not where it goes or how many workers)."""
        skip = {"out_dir", "work_dir", "workers", "keep_work", "stockfish"}
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in skip}

    @property
    def limit(self) -> chess.engine.Limit:
        return chess.engine.Limit(depth=self.depth, nodes=self.nodes)

    def work_path(self) -> Path:
        return Path(self.work_dir) if self.work_dir else Path(self.out_dir) / ".datagen-work"


def split_of_game(index: int, cfg: DatagenConfig | None = None) -> str:
    """test for i % 10 == 9, val for i % 10 == 8, train otherwise; the mate games are test."""
    if cfg is not None and index >= cfg.games:
        return "test"
    r = index % 10
    return "test" if r == 9 else "val" if r == 8 else "train"


# --------------------------------------------------------------------------------------------
# Games
# --------------------------------------------------------------------------------------------

def game_plan(index: int, cfg: DatagenConfig) -> dict:
    """The seeded recipe of game `index`: its kind and engine strength/noise per colour."""
    rng = random.Random(f"{cfg.seed}:plan:{index}")
    if index >= cfg.games:  # a mate game: a strong side against a weak, noisy one
        strong = rng.choice((0, 1))
        nodes, noise = [0, 0], [0.0, 0.0]
        nodes[strong], noise[strong] = rng.choice((128, 512, 2048)), 0.0
        nodes[1 - strong], noise[1 - strong] = rng.choice((1, 8)), rng.choice((0.15, 0.3))
        return {"kind": "selfplay", "random_plies": 0, "nodes": nodes, "noise": noise, "mate_only": True}
    u = rng.random()
    kind = "random" if u < cfg.random_share else "opening" if u < cfg.random_share + cfg.opening_share else "selfplay"
    plan = {"kind": kind}
    if kind == "opening":
        nodes = rng.choice(SELFPLAY_NODES[2:])
        plan.update(random_plies=rng.randint(2, 16), nodes=[nodes, nodes], noise=[0.03, 0.03])
    elif kind == "selfplay":
        plan.update(random_plies=0, nodes=[rng.choice(SELFPLAY_NODES), rng.choice(SELFPLAY_NODES)],
                    noise=[rng.choice(SELFPLAY_NOISE), rng.choice(SELFPLAY_NOISE)])
    return plan


def play_game(index: int, cfg: DatagenConfig, pool) -> dict:
    """Play game `index`: deterministic given the seed, since each game holds one engine for its
    whole length (hash cleared at its start) and is replayed from the start if that engine dies."""
    from .engine import EngineFailedError, EngineSessionLost

    plan = game_plan(index, cfg)
    if plan["kind"] == "random":
        return _play(index, cfg, plan, None)
    for _ in range(4):
        try:
            with pool.session() as session:
                return _play(index, cfg, plan, session)
        except EngineSessionLost as exc:
            log.warning("game %d: %s; replaying it on a fresh engine", index, exc)
    raise EngineFailedError(f"game {index}: Stockfish kept dying")


def _play(index: int, cfg: DatagenConfig, plan: dict, session) -> dict:
    rng = random.Random(f"{cfg.seed}:moves:{index}")
    board = chess.Board()
    moves: list[str] = []
    # random games run on to an automatic ending (insufficient material, 75-move rule,
    # stalemate, mate): the source of the rare terminal transitions; engine games stop at a
    # claimable draw
    claim = plan["kind"] != "random"
    cap = cfg.max_plies if claim else RANDOM_PLIES_FACTOR * cfg.max_plies
    while len(moves) < cap and board.outcome(claim_draw=claim) is None:
        side = 0 if board.turn == chess.WHITE else 1
        if plan["kind"] == "random" or len(moves) < plan["random_plies"] or rng.random() < plan["noise"][side]:
            move = rng.choice(list(board.legal_moves))
        else:
            move = session.play(board, chess.engine.Limit(nodes=plan["nodes"][side]))
        board.push(move)
        moves.append(move.uci())
    outcome = board.outcome(claim_draw=claim)
    return {"game": index, **plan, "moves": moves,
            "termination": outcome.termination.name.lower() if outcome else "max_plies",
            "result": outcome.result() if outcome else "*"}


# --------------------------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------------------------

def position_tags(board: chess.Board) -> list[str]:
    """check / castling / en_passant / promotion: features of the side to move's options."""
    tags = []
    if board.is_check():
        tags.append("check")
    if any(True for _ in board.generate_castling_moves()):
        tags.append("castling")
    if board.has_legal_en_passant():
        tags.append("en_passant")
    seventh = board.pieces_mask(chess.PAWN, board.turn) & (chess.BB_RANK_7 if board.turn == chess.WHITE else chess.BB_RANK_2)
    if seventh and any(m.promotion for m in board.generate_legal_moves(from_mask=seventh)):
        tags.append("promotion")
    return tags


def move_tags(board: chess.Board, move: chess.Move) -> list[str]:
    tags = []
    if board.is_capture(move):
        tags.append("capture")
    if board.is_castling(move):
        tags.append("castling")
    if board.is_en_passant(move):
        tags.append("en_passant")
    if move.promotion:
        tags.append("promotion")
    if board.gives_check(move):
        tags.append("check")
    return tags


def mating_moves(board: chess.Board) -> list[str]:
    """Every legal move that checkmates at once (sorted UCI)."""
    out = []
    for move in board.legal_moves:
        if board.gives_check(move):
            board.push(move)
            if board.is_checkmate():
                out.append(move.uci())
            board.pop()
    return sorted(out)


_WORDS = ("resign", "draw", "none", "pass", "move", "e4", "?", "--")


def wrong_move(board: chess.Board, rng: random.Random) -> str:
    """A seeded illegal (well-formed UCI) or unparseable move text for `board` (no '+', no spaces)."""
    legal = list(board.legal_moves)
    own = [sq for sq in chess.SQUARES if board.color_at(sq) == board.turn]
    makers = []

    def pseudo_illegal():
        bad = [m for m in board.pseudo_legal_moves if not board.is_legal(m)]
        return rng.choice(bad).uci() if bad else None

    def opponent_piece():
        b = board.copy(stack=False)
        b.turn = not b.turn
        ms = list(b.pseudo_legal_moves)
        return rng.choice(ms).uci() if ms else None

    def own_piece_wrong_square():
        for _ in range(20):
            frm, to = rng.choice(own), rng.choice(chess.SQUARES)
            m = chess.Move(frm, to)
            if frm != to and not board.is_legal(m):
                return m.uci()
        return None

    def castle_without_right():
        options = ["e1g1", "e1c1"] if board.turn == chess.WHITE else ["e8g8", "e8c8"]
        options = [o for o in options if not board.is_legal(chess.Move.from_uci(o))]
        return rng.choice(options) if options else None

    def promotion_without_piece():
        promos = [m for m in legal if m.promotion]
        return rng.choice(promos).uci()[:4] if promos else None

    def null_move():
        return "0000"

    def san():
        m = rng.choice(legal)
        return board.san(m).rstrip("+#") if legal else None

    def off_board():
        f = rng.choice("abcdefgh")
        return rng.choice([f"{f}9{f}7", f"{f}0{f}2", f"i{rng.randint(1, 8)}h{rng.randint(1, 8)}", f"{f}2{f}"])

    def truncated():
        return rng.choice(legal).uci()[: rng.choice((2, 3))] if legal else None

    def word():
        return rng.choice(_WORDS)

    makers = [pseudo_illegal, opponent_piece, own_piece_wrong_square, castle_without_right,
              promotion_without_piece, null_move, san, off_board, truncated, word]
    weights = [4, 2, 3, 1, 2, 1, 3, 1, 1, 1]
    for _ in range(50):
        text = rng.choices(makers, weights)[0]()
        if text and "+" not in text and not any(c.isspace() for c in text):
            if tasks.environment_step(tasks.canonical_fen(board), text).kind != "legal":
                return text
    return "0000"


@dataclass
class _Selection:
    policy: list = field(default_factory=list)  # dicts without labels
    env: list = field(default_factory=list)
    mate: list = field(default_factory=list)


def select_samples(games: list[dict], cfg: DatagenConfig, progress: bool = False) -> _Selection:
    """Deterministic sample selection from the games (in game order), with the split ownership
    and dedupe rules of the module docstring."""
    sel = _Selection()
    owner: dict[str, str] = {}
    seen_p: set[str] = set()
    seen_a: set[tuple[str, str]] = set()
    seen_m: set[str] = set()
    it: Iterable = sorted(games, key=lambda g: g["game"])
    if progress:
        from tqdm.auto import tqdm
        it = tqdm(it, desc="sampling", unit="game", total=len(games))
    for g in it:
        split = split_of_game(g["game"], cfg)
        mate_only = bool(g.get("mate_only"))
        rng = random.Random(f"{cfg.seed}:sample:{g['game']}")
        board = chess.Board()
        history: list[str] = []
        n = len(g["moves"])
        base = {"split": split, "game": g["game"], "source": g["kind"]}
        for ply, uci in enumerate(g["moves"]):
            fen = tasks.canonical_fen(board)
            key = tasks.position_key(fen)
            move = chess.Move.from_uci(uci)
            mine = owner.setdefault(key, split) == split
            u_p, u_a, u_x = rng.random(), rng.random(), rng.random()
            if mine and not mate_only:
                ptags = position_tags(board)
                rate = cfg.policy_rate * (3 if ptags else 1) * (RANDOM_POLICY_WEIGHT if g["kind"] == "random" else 1)
                if {"en_passant", "promotion"} & set(ptags):
                    rate = 1.0  # rare: keep them all
                if u_p < rate and key not in seen_p:
                    seen_p.add(key)
                    sel.policy.append({**base, "ply": ply, "fen": fen, "tags": ptags,
                                       "n_legal": board.legal_moves.count()})
                mtags = move_tags(board, move)
                rare = bool({"en_passant", "promotion"} & set(mtags))
                env_rate = cfg.env_rate * (3 if "castling" in mtags else 1) * (RANDOM_ENV_WEIGHT if g["kind"] == "random" else 1)
                take = u_a < env_rate or rare or ply == n - 1
                if take and (key, uci) not in seen_a:
                    seen_a.add((key, uci))
                    sel.env.append({**base, "ply": ply, "fen": fen, "move": uci,
                                    "previous": history[-(tasks.HISTORY_LEN - 1):], "tags": mtags})
                    if u_x < cfg.illegal_rate:
                        text = wrong_move(board, rng)
                        if (key, text) not in seen_a:
                            seen_a.add((key, text))
                            sel.env.append({**base, "ply": ply, "fen": fen, "move": text, "wrong": True,
                                            "previous": history[-(tasks.HISTORY_LEN - 1):], "tags": []})
            if mine and split != "train" and key not in seen_m:
                mates = mating_moves(board)
                if mates:
                    seen_m.add(key)
                    sel.mate.append({**base, "ply": ply, "fen": fen, "mating_moves": mates})
            board.push(move)
            history.append(uci)
    return sel


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------

def policy_record(s: dict, analysis, engine_name: str) -> dict:
    moves = list(analysis.moves)
    evals = [tasks.format_eval(e) for e in analysis.evals]
    tags = list(s["tags"])
    if analysis.evals and analysis.evals[0].mate is not None:
        tags.append("mate")
    prompt, completion = tasks.policy_text(s["fen"], moves, evals, moves[0])
    return {"id": f"P-{s['game']:05d}-{s['ply']:03d}", "task": "P", "split": s["split"], "game": s["game"],
            "ply": s["ply"], "source": s["source"], "fen": s["fen"], "moves": moves, "evals": evals,
            "best": moves[0], "n_legal": s["n_legal"], "tags": tags, "engine": engine_name,
            "limit": analysis.limit, "prompt": prompt, "completion": completion}


def env_record(s: dict, suffix: str = "") -> dict:
    tr = tasks.environment_step(s["fen"], s["move"], s["previous"])
    return {"id": f"A-{s['game']:05d}-{s['ply']:03d}{suffix}", "task": "A", "split": s["split"], "game": s["game"],
            "ply": s["ply"], "source": s["source"], "fen": tr.fen, "move": tr.move, "history": list(tr.history),
            "new_fen": tr.new_fen, "reward": tr.reward, "terminated": tr.terminated, "truncated": tr.truncated,
            "kind": tr.kind, "termination": tr.termination, "tags": s["tags"], "prompt": tr.prompt,
            "completion": tr.completion}


def mate_record(s: dict) -> dict:
    return {"id": f"M1-{s['game']:05d}-{s['ply']:03d}", "task": "M1", "split": s["split"], "game": s["game"],
            "ply": s["ply"], "source": s["source"], "fen": s["fen"], "mating_moves": s["mating_moves"],
            "prompt": tasks.policy_prompt(s["fen"])}


# --------------------------------------------------------------------------------------------
# Append-only work files (resumable state)
# --------------------------------------------------------------------------------------------

class _Appender:
    """Append JSON lines; flush each (survives a kill of the process), fsync every `sync_every`."""

    def __init__(self, path: Path, sync_every: int = 64):
        self.path = path
        self.fh = open(path, "a", encoding="utf-8")
        self.lock = threading.Lock()
        self.sync_every = sync_every
        self.n = 0

    def write(self, obj: dict) -> None:
        line = json.dumps(obj, separators=(",", ":")) + "\n"
        with self.lock:
            self.fh.write(line)
            self.fh.flush()
            self.n += 1
            if self.n % self.sync_every == 0:
                os.fsync(self.fh.fileno())

    def close(self) -> None:
        with self.lock:
            if not self.fh.closed:
                self.fh.flush()
                os.fsync(self.fh.fileno())
                self.fh.close()


def _read_work_lines(path: Path) -> list[dict]:
    """Lines of a work file. Each line is written whole and flushed, so only the last one can be
    torn (a kill mid-write): it has no newline and is cut off. Anything else is corruption."""
    if not path.exists():
        return []
    raw = path.read_bytes()
    if raw and not raw.endswith(b"\n"):
        keep = raw.rfind(b"\n") + 1
        log.warning("%s: dropping a torn last line left by an interrupted run", path)
        with open(path, "r+b") as fh:
            fh.truncate(keep)
        raw = raw[:keep]
    out = []
    for k, line in enumerate(raw.split(b"\n")[:-1]):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            raise DataFormatError(f"{path}:{k + 1}: corrupt work file ({exc}); delete {path.parent} "
                                  "or rerun with --fresh") from None
        out.append(obj)
    return out


def _atomic_write_jsonl(path: Path, records: Iterable[dict]) -> int:
    n = 0

    def write(fh):
        nonlocal n
        for rec in records:
            fh.write((json.dumps(rec, separators=(",", ":"), ensure_ascii=True) + "\n").encode())
            n += 1

    atomic_write(path, write)
    return n


class WorkDirMismatch(RuntimeError):
    """The work directory belongs to a run with other settings."""


# --------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------

@dataclass
class DatagenReport:
    """What a run produced and how long each stage took."""

    counts: dict  # file name -> records
    games_played: int  # games played in this invocation (the rest were reused)
    games_reused: int
    positions_labelled: int  # analyses run in this invocation
    labels_reused: int
    seconds: dict  # stage -> wall seconds
    engine: str
    out_dir: str
    config: dict

    @property
    def label_positions_per_s(self) -> float:
        s = self.seconds.get("label", 0.0)
        return self.positions_labelled / s if s > 0 else float("nan")


def generate(cfg: DatagenConfig, *, progress: bool = True, fresh: bool = False,
             _stop_after_labels: int | None = None) -> DatagenReport:
    """Run (or resume) data generation; write the JSONL files into cfg.out_dir.

    `_stop_after_labels` is for tests: raise KeyboardInterrupt after that many new labels, as
    if the user had pressed Ctrl-C.
    """
    from .engine import EnginePool, EngineSettings

    out = Path(cfg.out_dir)
    work = cfg.work_path()
    settings = EngineSettings(depth=cfg.depth, nodes=cfg.nodes, multipv=cfg.multipv, path=cfg.stockfish)
    seconds: dict[str, float] = {}
    pool = EnginePool(settings, size=cfg.workers, cache=False)  # finds Stockfish first: no stray dirs
    try:
        if fresh and work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True, exist_ok=True)
        out.mkdir(parents=True, exist_ok=True)
        engine_name = pool.version
        state = {"config": cfg.content_key(), "engine": engine_name}
        cfg_path = work / "config.json"
        if cfg_path.exists():
            old = json.loads(cfg_path.read_text())
            if old != state:
                raise WorkDirMismatch(
                    f"{work} holds an interrupted run with other settings ({_diff(old, state)}); "
                    "rerun with those settings to resume it, or pass --fresh to discard it")
        else:
            cfg_path.write_text(json.dumps(state, indent=1))

        # 1. games
        t0 = time.perf_counter()
        games = {g["game"]: g for g in _read_work_lines(work / "games.jsonl")}
        reused_games = len(games)
        n_games = cfg.games + cfg.mate_games
        todo = [i for i in range(n_games) if i not in games]
        if todo:
            app = _Appender(work / "games.jsonl", sync_every=8)
            try:
                for g in _parallel(lambda i: play_game(i, cfg, pool), todo, cfg.workers, progress, "games"):
                    app.write(g)
                    games[g["game"]] = g
            finally:
                app.close()
        seconds["games"] = time.perf_counter() - t0

        # 2. selection (cheap, deterministic)
        t0 = time.perf_counter()
        sel = select_samples([games[i] for i in range(n_games)], cfg, progress=progress)
        seconds["select"] = time.perf_counter() - t0

        # 3. labels
        t0 = time.perf_counter()
        labels = {rec["fen"]: rec for rec in _read_work_lines(work / "labels.jsonl")}
        reused_labels = len(labels)
        fens = list(dict.fromkeys(s["fen"] for s in sel.policy if s["fen"] not in labels))
        labelled_now = 0
        if fens:
            app = _Appender(work / "labels.jsonl")
            counter = [0]

            def on_result(i, analysis):
                rec = {"fen": fens[i], "limit": analysis.limit, "depth": analysis.depth,
                       "moves": list(analysis.moves), "evals": [tasks.format_eval(e) for e in analysis.evals]}
                app.write(rec)
                labels[fens[i]] = rec
                counter[0] += 1
                if _stop_after_labels is not None and counter[0] >= _stop_after_labels:
                    raise KeyboardInterrupt("test interruption")

            try:
                pool.analyse_many(fens, progress=progress, desc="labelling", on_result=on_result)
            finally:
                app.close()
                labelled_now = counter[0]
        seconds["label"] = time.perf_counter() - t0

        # 4. records
        t0 = time.perf_counter()
        counts = _write_outputs(out, sel, labels, engine_name)
        seconds["write"] = time.perf_counter() - t0
    finally:
        pool.close()
    if not cfg.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    return DatagenReport(counts=counts, games_played=len(todo), games_reused=reused_games,
                         positions_labelled=labelled_now, labels_reused=reused_labels, seconds=seconds,
                         engine=engine_name, out_dir=str(out), config=dataclasses.asdict(cfg))


def _diff(old: dict, new: dict) -> str:
    a, b = old.get("config", {}), new.get("config", {})
    diffs = [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    if old.get("engine") != new.get("engine"):
        diffs.append(f"engine: {old.get('engine')!r} -> {new.get('engine')!r}")
    return "; ".join(diffs) or "unknown difference"


def _parallel(fn, items: list, workers: int, progress: bool, desc: str) -> Iterator:
    from .engine import threaded

    for _, result in threaded(fn, items, workers, progress, desc, unit=desc.rstrip("s") or "item"):
        yield result


class _LabelView:
    def __init__(self, rec: dict):
        self.moves = tuple(rec["moves"])
        self.evals = tuple(tasks.parse_eval(e) for e in rec["evals"])
        self.limit = rec["limit"]


def _write_outputs(out: Path, sel: _Selection, labels: dict, engine_name: str) -> dict:
    by_file: dict[str, list[dict]] = {}
    for s in sel.policy:
        rec = labels[s["fen"]]
        if not rec["moves"]:
            continue
        by_file.setdefault(TASK_FILES["P"].format(split=s["split"]), []).append(
            policy_record(s, _LabelView(rec), engine_name))
    wrong_count: Counter = Counter()
    for s in sel.env:
        suffix = ""
        if s.get("wrong"):
            wrong_count[(s["game"], s["ply"])] += 1
            suffix = f"-x{wrong_count[(s['game'], s['ply'])]}"
        by_file.setdefault(TASK_FILES["A"].format(split=s["split"]), []).append(env_record(s, suffix))
    by_file[MATE_FILE] = [mate_record(s) for s in sel.mate]
    counts = {}
    for split in SPLITS:
        for task in ("P", "A"):
            name = TASK_FILES[task].format(split=split)
            counts[name] = _atomic_write_jsonl(out / name, by_file.get(name, []))
    counts[MATE_FILE] = _atomic_write_jsonl(out / MATE_FILE, by_file[MATE_FILE])
    return counts


# --------------------------------------------------------------------------------------------
# Loading and validation
# --------------------------------------------------------------------------------------------

class DataFormatError(ValueError):
    """A malformed data line; the message is ``file:line: reason``."""


@dataclass(frozen=True)
class LineError:
    path: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


@dataclass
class LoadedData:
    """Records of one JSONL file (dicts, in file order) and the lines skipped with on_error='skip'."""

    path: str
    records: list[dict]
    skipped: list[LineError] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self):
        return iter(self.records)

    def __getitem__(self, i):
        return self.records[i]

    @property
    def n_skipped(self) -> int:
        return len(self.skipped)


_COMMON = {"id": str, "task": str, "split": str, "game": int, "ply": int, "source": str, "fen": str, "prompt": str}
_FIELDS = {
    "P": {**_COMMON, "moves": list, "evals": list, "best": str, "n_legal": int, "tags": list, "engine": str,
          "limit": str, "completion": str},
    "A": {**_COMMON, "move": str, "history": list, "new_fen": str, "reward": (int, float), "terminated": int,
          "truncated": int, "kind": str, "termination": (str, type(None)), "tags": list, "completion": str},
    "M1": {**_COMMON, "mating_moves": list},
}
# Optional fields: converted original P: lines keep their B: label, which for black is the original
# generator's worst candidate (rookworld_lib.convert), beside our best (= moves[0]).
_OPTIONAL = {"P": {"original_best": str}}
_SPLITS_OF = {"P": SPLITS, "A": SPLITS, "M1": ("val", "test")}


def validate_record(rec, task: str | None = None) -> str | None:
    """Why `rec` is not a valid record (of `task`, when given), or None when it is."""
    try:
        return _validate(rec, task)
    except Exception as exc:  # pragma: no cover - a validator must not crash on odd input
        return f"invalid record ({type(exc).__name__}: {exc})"


def _validate(rec, task):
    if not isinstance(rec, dict):
        return f"expected a JSON object, got {type(rec).__name__}"
    t = rec.get("task")
    if t not in _FIELDS:
        return f"field 'task' must be one of {sorted(_FIELDS)}, got {t!r}"
    if task is not None and t != task:
        return f"expected a {task!r} record, got task {t!r}"
    for name, typ in _FIELDS[t].items():
        if name not in rec:
            return f"missing field {name!r}"
        v = rec[name]
        if isinstance(v, bool) and typ is not bool or not isinstance(v, typ):
            return f"field {name!r} has type {type(v).__name__}"
    extra = set(rec) - set(_FIELDS[t]) - set(_OPTIONAL.get(t, {}))
    if extra:
        return f"unknown field(s) {sorted(extra)}"
    if rec["split"] not in _SPLITS_OF[t]:
        return f"field 'split' must be one of {_SPLITS_OF[t]}, got {rec['split']!r}"
    if rec["source"] not in (*GAME_KINDS, ORIGINAL_SOURCE):
        return f"field 'source' must be one of {(*GAME_KINDS, ORIGINAL_SOURCE)}, got {rec['source']!r}"
    if rec["game"] < 0 or rec["ply"] < 0:
        return "fields 'game' and 'ply' must be >= 0"
    board, err = tasks.checked_board(rec["fen"])
    if err:
        return f"field 'fen': {err}"
    if t == "P":
        return _validate_policy(rec, board)
    if t == "A":
        return _validate_env(rec, board)
    return _validate_mate(rec, board)


def _validate_policy(rec, board):
    moves, evals = rec["moves"], rec["evals"]
    if not 1 <= len(moves) <= tasks.MAX_CANDIDATES:
        return f"field 'moves' must hold 1..{tasks.MAX_CANDIDATES} moves, has {len(moves)}"
    for m in moves:
        if not isinstance(m, str) or tasks.legal_move(board, m) is None:
            return f"move {m!r} in 'moves' is not a legal UCI move in this position"
    if len(set(moves)) != len(moves):
        return "field 'moves' repeats a move"
    if len(evals) != len(moves):
        return f"field 'evals' has {len(evals)} entries for {len(moves)} moves"
    for e in evals:
        if not isinstance(e, str) or tasks.parse_eval(e) is None or tasks.format_eval(tasks.parse_eval(e)) != e:
            return f"eval {e!r} is not in the eval format (pawns like '0.35', mates like 'M3' / '-M2')"
    if rec["best"] != moves[0]:
        return f"field 'best' {rec['best']!r} is not moves[0] {moves[0]!r}"
    if "original_best" in rec and (not isinstance(rec["original_best"], str) or rec["original_best"] not in moves):
        return f"field 'original_best' {rec['original_best']!r} is not among 'moves'"
    if rec["n_legal"] != board.legal_moves.count():
        return f"field 'n_legal' is {rec['n_legal']}, the position has {board.legal_moves.count()} legal moves"
    prompt, completion = tasks.policy_text(rec["fen"], moves, evals, rec["best"])
    if rec["prompt"] != prompt:
        return "field 'prompt' does not match 'fen'"
    if rec["completion"] != completion:
        return "field 'completion' does not match moves/evals/best"
    return None


def _validate_env(rec, board):
    if rec["kind"] not in ENV_KINDS:
        return f"field 'kind' must be one of {ENV_KINDS}, got {rec['kind']!r}"
    move = rec["move"]
    if not move or "+" in move or any(c.isspace() for c in move):
        return "field 'move' must be non-empty without '+' or whitespace"
    hist = rec["history"]
    if not hist or hist[-1] != move or len(hist) > tasks.HISTORY_LEN or not all(isinstance(h, str) for h in hist):
        return f"field 'history' must be 1..{tasks.HISTORY_LEN} moves ending with the current move"
    err = tasks.fen_error(rec["new_fen"])
    if err:
        return f"field 'new_fen': {err}"
    if rec["reward"] not in tasks.ENV_REWARDS:
        return f"field 'reward' must be one of {tasks.ENV_REWARDS}, got {rec['reward']!r}"
    if rec["terminated"] not in (0, 1) or rec["truncated"] not in (0, 1):
        return "fields 'terminated' and 'truncated' must be 0 or 1"
    wrong = rec["kind"] != "legal"
    if wrong and (rec["new_fen"] != rec["fen"] or rec["reward"] != tasks.REWARD_ILLEGAL or rec["truncated"] != 1
                  or rec["terminated"] != 0):
        return "an illegal/unparseable move must give new_fen = fen, reward -1.0, terminated 0, truncated 1"
    if not wrong and (rec["truncated"] != 0 or rec["reward"] == tasks.REWARD_ILLEGAL):
        return "a legal move must give truncated 0 and a reward other than -1.0"
    if wrong == (tasks.legal_move(board, move) is not None):
        return f"field 'kind' is {rec['kind']!r} but the move is {'legal' if not wrong else 'illegal'}"
    if rec["prompt"] != tasks.env_prompt(rec["fen"], move, hist):
        return "field 'prompt' does not match fen/move/history"
    if rec["completion"] != tasks.env_completion(rec["new_fen"], rec["reward"], rec["terminated"], rec["truncated"]):
        return "field 'completion' does not match new_fen/reward/terminated/truncated"
    return None


def _validate_mate(rec, board):
    mates = rec["mating_moves"]
    if not mates:
        return "field 'mating_moves' is empty"
    for m in mates:
        mv = tasks.legal_move(board, m) if isinstance(m, str) else None
        if mv is None:
            return f"mating move {m!r} is not legal"
        board.push(mv)
        ok = board.is_checkmate()
        board.pop()
        if not ok:
            return f"mating move {m!r} does not mate"
    if rec["prompt"] != tasks.policy_prompt(rec["fen"]):
        return "field 'prompt' does not match 'fen'"
    return None


def load_jsonl(path: str | os.PathLike, *, task: str | None = None, on_error: str = "raise") -> LoadedData:
    """Load and validate every line of a data file.

    on_error="raise": the first bad line raises DataFormatError("file:line: reason").
    on_error="skip": bad lines are skipped; LoadedData.skipped lists them (file, line, reason)
    and a warning reports how many.
    """
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    path = Path(path)
    try:
        fh = open(path, "rb")
    except OSError as exc:
        raise DataFormatError(f"{path}: cannot read ({exc.strerror}); regenerate with `rookworld datagen` "
                              f"or restore it with `git checkout -- {path.name}`") from None
    records, skipped, ids = [], [], set()
    with fh:
        for lineno, raw in enumerate(fh, 1):
            rec, reason = None, None
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                reason = f"not UTF-8 ({exc.reason} at byte {exc.start})"
            else:
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                    reason = validate_record(rec, task)
                except ValueError as exc:
                    reason = f"invalid JSON ({exc})"
                if reason is None and rec["id"] in ids:
                    reason = f"duplicate id {rec['id']!r}"
            if reason is not None:
                err = LineError(str(path), lineno, reason)
                if on_error == "raise":
                    raise DataFormatError(str(err))
                skipped.append(err)
                continue
            ids.add(rec["id"])
            records.append(rec)
    if skipped:
        log.warning("%s: skipped %d malformed line(s); first: %s", path, len(skipped), skipped[0])
    return LoadedData(str(path), records, skipped)


def data_file(task: str, split: str | None = None, data_dir: str | os.PathLike | None = None) -> Path:
    """Path of a shipped file: task 'P' or 'A' with a split, or 'M1' (the mate-in-one set)."""
    base = Path(data_dir) if data_dir is not None else DATA_DIR
    if task == "M1":
        return base / MATE_FILE
    if task not in TASK_FILES or split not in SPLITS:
        raise ValueError(f"task must be 'P', 'A' or 'M1' and split one of {SPLITS}, got {task!r}, {split!r}")
    return base / TASK_FILES[task].format(split=split)


def load_split(task: str, split: str, data_dir=None, *, on_error: str = "raise") -> LoadedData:
    """The records of one task ('P' or 'A') and split ('train', 'val', 'test')."""
    return load_jsonl(data_file(task, split, data_dir), task=task, on_error=on_error)


def load_mate_in_one(data_dir=None, *, on_error: str = "raise") -> LoadedData:
    return load_jsonl(data_file("M1", None, data_dir), task="M1", on_error=on_error)


def record_text(rec: dict, layout: str = "compact") -> tuple[str, str]:
    """(prompt, completion) of a P: or A: record in `layout`: the record's own texts for compact;
    for original, the fixed-width P: sample and A: texts whose FENs are spelled as python-chess's
    ``board.fen()`` (see tasks), as a pretrained RookWorld-LM reads and writes them."""
    if layout == "compact":
        return rec["prompt"], rec["completion"]
    if rec["task"] == "P":
        return tasks.policy_text(rec["fen"], rec["moves"], rec["evals"], rec["best"], layout)
    return (tasks.env_prompt(tasks.original_fen(rec["fen"]), rec["move"], rec["history"]),
            tasks.env_completion(tasks.original_fen(rec["new_fen"]), rec["reward"], rec["terminated"], rec["truncated"]))


# --------------------------------------------------------------------------------------------
# Audits (re-derive labels; used by the tests and notebook 00)
# --------------------------------------------------------------------------------------------

def _audit_multipv(rec: dict) -> int:
    # multipv is not stored: fewer candidates than legal moves means multipv = len(moves); a full
    # list means any multipv >= n_legal, which Stockfish treats as n_legal
    n = len(rec["moves"])
    return n if n < rec["n_legal"] else tasks.MAX_CANDIDATES


def audit_policy_labels(records: list[dict], *, workers: int | None = None, progress: bool = False) -> list[dict]:
    """Re-run Stockfish at each P: record's recorded limit and report every difference in the
    candidate moves or evals (an empty list: every label, B: included, is reproduced)."""
    from .engine import EnginePool, EngineSettings, parse_limit_key

    problems = []
    groups: dict[tuple[str, int], list[dict]] = {}
    for rec in records:
        groups.setdefault((rec["limit"], _audit_multipv(rec)), []).append(rec)
    for (limit, multipv), recs in groups.items():
        lim = parse_limit_key(limit)
        settings = EngineSettings(depth=lim.depth, nodes=lim.nodes, time=lim.time, multipv=multipv)
        with EnginePool(settings, size=workers, cache=False) as pool:
            version = pool.version
            analyses = pool.analyse_many([r["fen"] for r in recs], progress=progress, desc="audit")
        for rec, a in zip(recs, analyses):
            got = {"engine": version, "best": a.best, "moves": list(a.moves),
                   "evals": [tasks.format_eval(e) for e in a.evals]}
            for key, value in got.items():
                if rec[key] != value:
                    problems.append({"id": rec["id"], "field": key, "expected": rec[key], "got": value})
    return problems


def audit_env_samples(records: list[dict]) -> list[dict]:
    """Replay every A: record with python-chess (`tasks.environment_step`, legality by
    `board.is_legal`) and report every field that differs."""
    problems = []
    for rec in records:
        tr = tasks.environment_step(rec["fen"], rec["move"], rec["history"][:-1])
        got = {"new_fen": tr.new_fen, "reward": tr.reward, "terminated": tr.terminated, "truncated": tr.truncated,
               "kind": tr.kind, "termination": tr.termination, "history": list(tr.history), "prompt": tr.prompt,
               "completion": tr.completion}
        for key, value in got.items():
            if rec[key] != value:
                problems.append({"id": rec["id"], "field": key, "expected": rec[key], "got": value})
    return problems


def audit_mate_in_one(records: list[dict]) -> list[dict]:
    """Check that every M1 record lists exactly the moves that mate at once."""
    problems = []
    for rec in records:
        got = mating_moves(chess.Board(rec["fen"]))
        if got != rec["mating_moves"]:
            problems.append({"id": rec["id"], "field": "mating_moves", "expected": rec["mating_moves"], "got": got})
    return problems


# --------------------------------------------------------------------------------------------
# Summaries (the data card's numbers)
# --------------------------------------------------------------------------------------------

def summarize(data_dir=None) -> dict:
    """Counts per file, colour balance, features and terminations of a data directory, and the
    number of positions two splits share (``shared_positions``, 0 by construction)."""
    base = Path(data_dir) if data_dir is not None else DATA_DIR
    out: dict = {"files": {}}
    names = [TASK_FILES[t].format(split=s) for t in ("P", "A") for s in SPLITS] + [MATE_FILE]
    keys: dict[str, set] = {s: set() for s in SPLITS}
    for name in names:
        path = base / name
        if not path.exists():
            continue
        data = load_jsonl(path)
        recs = data.records
        if recs and recs[0]["task"] in ("P", "A"):
            for r in recs:
                keys[r["split"]].add(tasks.position_key(r["fen"]))
        info = {"records": len(recs), "bytes": path.stat().st_size,
                "white_to_move": sum(" w " in r["fen"] for r in recs),
                "black_to_move": sum(" b " in r["fen"] for r in recs),
                "games": len({r["game"] for r in recs}),
                "sources": dict(Counter(r["source"] for r in recs))}
        if recs and recs[0]["task"] in ("P", "A"):
            info["tags"] = dict(Counter(t for r in recs for t in r["tags"]))
        if recs and recs[0]["task"] == "A":
            info["kinds"] = dict(Counter(r["kind"] for r in recs))
            info["terminations"] = dict(Counter(r["termination"] for r in recs if r["termination"]))
        if recs and recs[0]["task"] == "P":
            info["limit"] = sorted({r["limit"] for r in recs})
            info["engine"] = sorted({r["engine"] for r in recs})
        out["files"][name] = info
    # positions (FEN without clocks) of P:/A: prompts that two splits share: 0 by construction
    out["shared_positions"] = {f"{a}/{b}": len(keys[a] & keys[b])
                               for i, a in enumerate(SPLITS) for b in SPLITS[i + 1:]}
    return out


def render_card_tables(summary: dict) -> str:
    """Markdown tables of a summary, for the data card."""
    rows = ["| file | records | games | white to move | black to move | size (KB) |", "|---|---:|---:|---:|---:|---:|"]
    for name, f in summary["files"].items():
        rows.append(f"| {name} | {f['records']} | {f['games']} | {f['white_to_move']} | {f['black_to_move']} "
                    f"| {f['bytes'] / 1024:.0f} |")
    rows += ["", "| file | sources | features | kinds | terminations |", "|---|---|---|---|---|"]
    for name, f in summary["files"].items():
        def fmt(d):
            return ", ".join(f"{k} {v}" for k, v in sorted((d or {}).items())) or "-"
        rows.append(f"| {name} | {fmt(f.get('sources'))} | {fmt(f.get('tags'))} | {fmt(f.get('kinds'))} "
                    f"| {fmt(f.get('terminations'))} |")
    return "\n".join(rows)


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    d = DatagenConfig()
    p = argparse.ArgumentParser(
        prog="rookworld datagen",
        description="Generate Stockfish-labelled P:/A: samples and the mate-in-one set as JSON lines "
                    "(resumable: rerun the same command after an interruption), or validate/summarise files.",
    )
    p.add_argument("--out", default=d.out_dir, help="output directory (default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="random seed (default: %(default)s)")
    p.add_argument("--games", type=int, default=d.games, help="games to play (default: %(default)s)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--depth", type=int, default=None, help=f"Stockfish depth of the labels (default: {d.depth})")
    g.add_argument("--nodes", type=int, default=None, help="Stockfish node budget of the labels instead of a depth")
    p.add_argument("--multipv", type=int, default=d.multipv, help="candidate moves per label (default: %(default)s)")
    p.add_argument("--workers", type=int, default=None, help="Stockfish processes (default: usable cores)")
    p.add_argument("--policy-rate", type=float, default=d.policy_rate, help="share of positions sampled as P: (default: %(default)s)")
    p.add_argument("--env-rate", type=float, default=d.env_rate, help="share of moves sampled as A: (default: %(default)s)")
    p.add_argument("--illegal-rate", type=float, default=d.illegal_rate, help="chance of an extra illegal/unparseable A: sample (default: %(default)s)")
    p.add_argument("--random-share", type=float, default=d.random_share, help="share of random-move games (default: %(default)s)")
    p.add_argument("--opening-share", type=float, default=d.opening_share, help="share of random-opening games (default: %(default)s)")
    p.add_argument("--max-plies", type=int, default=d.max_plies, help="half-move cap per game (default: %(default)s)")
    p.add_argument("--mate-games", type=int, default=d.mate_games, help="extra held-out games for the mate-in-one set (default: %(default)s)")
    p.add_argument("--work-dir", default=None, help="resumable state (default: <out>/.datagen-work)")
    p.add_argument("--fresh", action="store_true", help="discard an interrupted run's state instead of resuming it")
    p.add_argument("--keep-work", action="store_true", help="keep the work directory after success")
    p.add_argument("--stockfish", default=None, help="Stockfish binary (default: STOCKFISH_PATH, PATH, /usr/games/stockfish)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--validate", nargs="*", metavar="FILE", default=None,
                   help="validate data files (default: every data file in --out) and exit")
    p.add_argument("--summary", action="store_true", help="print the data card tables of --out and exit")
    return p


def cli(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .engine import StockfishNotFoundError, usable_cores

    if args.validate is not None:
        files = [Path(f) for f in args.validate] or sorted(Path(args.out).glob("*.jsonl"))
        bad = 0
        for f in files:
            try:
                data = load_jsonl(f)
                print(f"{f}: {len(data)} records OK")
            except DataFormatError as exc:
                print(f"error: {exc}", file=sys.stderr)
                bad += 1
        return 1 if bad else 0
    if args.summary:
        try:
            print(render_card_tables(summarize(args.out)))
        except DataFormatError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        return 0
    try:
        depth = args.depth if args.depth is not None else (None if args.nodes is not None else DatagenConfig.depth)
        cfg = DatagenConfig(out_dir=args.out, seed=args.seed, games=args.games, depth=depth, nodes=args.nodes,
                            multipv=args.multipv, workers=args.workers or usable_cores(),
                            policy_rate=args.policy_rate, env_rate=args.env_rate, illegal_rate=args.illegal_rate,
                            random_share=args.random_share, opening_share=args.opening_share,
                            max_plies=args.max_plies, mate_games=args.mate_games, work_dir=args.work_dir, keep_work=args.keep_work,
                            stockfish=args.stockfish)
    except ValueError as exc:
        print(f"rookworld datagen: {exc}", file=sys.stderr)
        return 2
    try:
        report = generate(cfg, progress=not args.no_progress, fresh=args.fresh)
    except StockfishNotFoundError as exc:
        print(f"rookworld datagen: {exc}", file=sys.stderr)
        return 2
    except (WorkDirMismatch, DataFormatError) as exc:
        print(f"rookworld datagen: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"\nrookworld datagen: interrupted; finished games and labels are kept in {cfg.work_path()}. "
              "Run the same command again to resume.", file=sys.stderr)
        return 130
    print(json.dumps({"counts": report.counts, "games_played": report.games_played,
                      "games_reused": report.games_reused, "positions_labelled": report.positions_labelled,
                      "labels_reused": report.labels_reused, "seconds": {k: round(v, 2) for k, v in report.seconds.items()},
                      "label_positions_per_s": round(report.label_positions_per_s, 2), "engine": report.engine,
                      "workers": cfg.workers, "config": cfg.content_key()}, indent=1))
    return 0


__all__ = [
    "SPLITS", "SCHEMA", "DatagenConfig", "DatagenReport", "generate", "split_of_game", "game_plan", "play_game",
    "select_samples", "position_tags", "move_tags", "mating_moves", "wrong_move", "policy_record", "env_record",
    "mate_record", "DataFormatError", "LineError", "LoadedData", "validate_record", "load_jsonl", "data_file",
    "load_split", "load_mate_in_one", "record_text", "audit_policy_labels", "audit_env_samples",
    "audit_mate_in_one", "summarize", "render_card_tables", "cli", "WorkDirMismatch",
]
