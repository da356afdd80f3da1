"""Data generation (``rookworld datagen``, :func:`generate`): Stockfish-labelled ``P:``/``A:`` samples and the
mate-in-one set, as the record files :mod:`rookworld_lib.chess.data` loads. The data card (``data/README.md``)
describes the recipe with the shipped set's numbers.

Games are seeded per index (:func:`game_plan`, :func:`play_game`) and split by game (:func:`split_of_game`): a
position belongs to the split of the first game that reaches it, or to none when `exclude_dir` names a data set
that holds it in val or test. :func:`select_samples` picks positions (``P:``), moves (``A:``, with
:func:`wrong_move` siblings) and mate-in-one positions; Stockfish (on datagen's own UCI client, :class:`LeanPool`)
labels ``P:`` at a reproducible limit (one thread, cleared hash) and python-chess replays ``A:``. Finished games
and labels are appended to a work directory, so an interrupted run resumes with the same settings (and a finished
one, its files unchanged, is kept as it is); record files are written atomically at the end, and one that would
be empty is not written (an older one of that name is removed). A run holds ``<out>/.lock`` while it writes
(:func:`.core.paths.run_lock`, as training does): a second run there stops before it touches anything.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gzip
import hashlib
import json
import logging
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import chess
import chess.engine

from . import engine, tasks
from .data import (DATA_FILES, GZIP_LEVEL, MATE_FILE, TASK_FILES, checked_files, data_file_name, data_files_of, file_digest, load_data_file,
                   load_jsonl, mating_moves, move_tags, not_a_folder, position_tags, render_card_tables, role_of, summarize)
from .engine import (INSTALL_HINT, LIMIT_RANGES, MAX_WORKERS, Analysis, EngineFailedError, EngineSessionLost, EngineSettings, StockfishNotFoundError,
                     find_stockfish, search_timeout, threaded, usable_cores)
from ..core.paths import (DATA_DIR, LOCK_FILE, DataFormatError, JsonlAppender, atomic_file, atomic_write, json_line, json_lines, naming,
                          run_lock)
from ..core.progress import tqdm
from ..core.config import (SEED_MAX, add_config_arguments, bad_field, check_applies, config_class, config_kwargs_from_args, field_docs, flag_name, option, path_arg,
                           validate)

log = logging.getLogger(__name__)

SELFPLAY_NODES = (1, 8, 32, 128, 512, 2048)
SELFPLAY_NOISE = (0.0, 0.05, 0.15, 0.3)
RANDOM_PLIES_FACTOR = 3  # random games may run to 3 x max_plies
RANDOM_POLICY_WEIGHT = 0.25  # random-game positions are odd: sample fewer of them as P:
RANDOM_ENV_WEIGHT = 0.5  # ... and as A:


# --- Configuration ---

@config_class(frozen=True)
class DatagenConfig:
    """Settings of one data-generation run. Bad values fail at construction, naming the field."""

    out_dir: str = option(str(DATA_DIR / "generated"), "output directory (never the shipped data/: its files are the reference set)",
                          path=True)
    seed: int = option(20261122, "seeds every game and every sampling decision", min=0, max=SEED_MAX)
    games: int = option(320, "games to play (split 8:1:1 into train/val/test by game)", min=1)
    depth: int | None = option(8, "Stockfish depth of the P: labels (None: use nodes)", min=1, max=LIMIT_RANGES["depth"][1])
    nodes: int | None = option(None, "Stockfish node budget of the P: labels instead of a depth", min=1,
                               max=LIMIT_RANGES["nodes"][1])
    multipv: int = option(5, "candidate moves per P: label", min=1, max=tasks.MAX_CANDIDATES)
    workers: int = option(2, "Stockfish processes (and threads) in parallel", min=1, max=MAX_WORKERS)
    policy_rate: float = option(0.12, "share of a game's positions sampled as P: (x3 for special ones; 0: no P:)", min=0, max=1)
    env_rate: float = option(0.12, "share of a game's moves sampled as A: (the last move always; 1: every move)", min=0, max=1)
    illegal_rate: float = option(0.12, "per A: sample, chance of an extra illegal/unparseable move there", min=0, max=1)
    random_share: float = option(0.15, "share of random-move games", min=0, max=1)
    opening_share: float = option(0.3, "share of random-opening games (the rest are engine self-play)", min=0, max=1)
    max_plies: int = option(300, "half-move cap per game (random-move games: 3x)", min=1, max=2000)
    mate_games: int = option(160, "extra held-out games (strong vs weak side) feeding only the mate-in-one set", min=0)
    test_games: int = option(0, "extra test-split games after the mate games (grow the test split; train/val unchanged)", min=0)
    work_dir: str | None = option(None, "resumable state (None: <out>/.datagen-work)", path=True)
    shard_size: int = option(0, "records per output shard, <name>-00000.jsonl (0: one file per split)", min=0)
    compress: bool = option(False, "gzip the output files (.jsonl.gz)")
    keep_work: bool = option(False, "keep the work directory after a successful run")
    stockfish: str | None = option(None, "Stockfish binary (None: STOCKFISH_PATH, PATH, /usr/games/stockfish)", path=True)
    exclude_dir: str | None = option(None, "a data set whose val and test positions (P:, A: and mate-in-one) are "
                                     "never sampled: more training data for a model evaluated on that set's test split", path=True)

    def __post_init__(self):
        validate(self)  # types and ranges of every field (the option() checks above)
        if self.depth is None and self.nodes is None:
            raise ValueError("DatagenConfig: set depth or nodes (the P: labels need a reproducible limit)")
        if self.random_share + self.opening_share > 1.0 + 1e-12:
            raise ValueError(f"DatagenConfig: random_share + opening_share (--random-share, --opening-share) must be <= 1, "
                             f"got {self.random_share:g} + {self.opening_share:g}")
        # the label settings are the P: records' alone (games are played at their own node budgets)
        for name in ("multipv", "nodes", *(("depth",) if self.depth is not None else ())):
            check_applies(self, name, self.policy_rate > 0, "at policy_rate=0 (no P: records to label): set policy_rate > 0")
        if self.exclude_dir and _inside(self.exclude_dir, self.out_dir):
            bad_field("DatagenConfig", "exclude_dir", self.exclude_dir, "is out_dir or lies inside it: its held-out "
                      "positions would be those of the data set this run replaces; give another data set's folder")

    def content_key(self) -> dict:
        """The settings that decide the output (not where it goes or how many workers)."""
        skip = {"out_dir", "work_dir", "workers", "keep_work", "stockfish"}
        key = _resolved_exclude({k: v for k, v in dataclasses.asdict(self).items() if k not in skip})
        if self.exclude_dir:  # the positions themselves: a changed set there is another data set here
            held = "\n".join(sorted(heldout_positions(self.exclude_dir))).encode()
            key["exclude_positions"] = hashlib.sha256(held).hexdigest()[:16]
        return key

    def work_path(self) -> Path:
        """Where the resumable state of this run lives."""
        return Path(self.work_dir) if self.work_dir else Path(self.out_dir) / ".datagen-work"


def _resolved_exclude(key: dict) -> dict:
    """The settings with exclude_dir as an absolute path: `data`, `data/` and `/abs/data` are one data set
    (a resume named them apart; a record of an older version holds the path as written)."""
    if key.get("exclude_dir"):
        key = {**key, "exclude_dir": str(Path(key["exclude_dir"]).resolve())}
    return key


def split_of_game(index: int, cfg: DatagenConfig | None = None) -> str:
    """By index, 8:1:1 (i % 10: 8 val, 9 test); every game from cfg.games on (mate, extra test games) is test."""
    if cfg is not None and index >= cfg.games:
        return "test"
    return {8: "val", 9: "test"}.get(index % 10, "train")


# --- Games ---

def game_plan(index: int, cfg: DatagenConfig) -> dict:
    """The seeded recipe of game `index`: its kind and engine strength/noise per colour."""
    rng = random.Random(f"{cfg.seed}:plan:{index}")
    if cfg.games <= index < cfg.games + cfg.mate_games:  # a mate game: a strong side against a weak, noisy one
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


def play_game(index: int, cfg: DatagenConfig, pool: LeanPool) -> dict:
    """Play game `index`: deterministic given the seed, since each game holds one engine for its
    whole length (hash cleared at its start) and is replayed from the start if that engine dies.
    `pool` is datagen's LeanPool (or an EnginePool: the same moves, at more CPU per move)."""
    plan = game_plan(index, cfg)
    if plan["kind"] == "random":
        return _play(index, cfg, plan, None)
    for _ in range(4):
        try:
            with pool.session() as session:
                return _play(index, cfg, plan, session)
        except EngineSessionLost as exc:
            if getattr(pool, "_closed", False):  # killed on purpose (Ctrl-C closes the pool): nothing failed, no replay
                raise EngineFailedError("engine pool is closed") from None
            log.warning("game %d: %s; replaying it on a fresh engine", index, lost := exc)
    raise EngineFailedError(f"game {index}: Stockfish kept dying (the last time: {lost})")


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


# --- Sampling ---

_WORDS = ("resign", "draw", "none", "pass", "move", "e4", "?", "--")


def wrong_move(board: chess.Board, rng: random.Random) -> str:
    """A seeded illegal (well-formed UCI) or unparseable move text for `board` (no '+', no spaces)."""
    legal = list(board.legal_moves)
    own = [sq for sq in chess.SQUARES if board.color_at(sq) == board.turn]
    castles = ["e1g1", "e1c1"] if board.turn == chess.WHITE else ["e8g8", "e8c8"]

    def pick(options):  # a seeded choice as text (a Move's is its UCI), or None where the maker cannot apply
        return str(rng.choice(options)) if options else None

    def opponent_piece():
        b = board.copy(stack=False)
        b.turn = not b.turn
        return pick(list(b.pseudo_legal_moves))

    def own_piece_wrong_square():
        for _ in range(20):
            move = chess.Move(rng.choice(own), rng.choice(chess.SQUARES))
            if move.from_square != move.to_square and not board.is_legal(move):
                return move.uci()
        return None

    def off_board():
        f = rng.choice("abcdefgh")
        return rng.choice([f"{f}9{f}7", f"{f}0{f}2", f"i{rng.randint(1, 8)}h{rng.randint(1, 8)}", f"{f}2{f}"])

    makers = {  # maker: weight; illegal moves in well-formed UCI first, then unparseable texts
        lambda: pick([m for m in board.pseudo_legal_moves if not board.is_legal(m)]): 4,  # pinned, into check
        opponent_piece: 2,
        own_piece_wrong_square: 3,
        lambda: pick([c for c in castles if not board.is_legal(chess.Move.from_uci(c))]): 1,  # castling, no right
        lambda: (pick([m for m in legal if m.promotion]) or "")[:4]: 2,  # a promotion without its piece
        lambda: "0000": 1,  # the null move
        lambda: board.san(rng.choice(legal)).rstrip("+#"): 3,  # SAN (a move was played here: legal is not empty)
        off_board: 1,
        lambda: pick(legal)[: rng.choice((2, 3))]: 1,  # truncated
        lambda: rng.choice(_WORDS): 1,
    }
    for _ in range(50):
        text = rng.choices(list(makers), list(makers.values()))[0]()
        if text and "+" not in text and not any(c.isspace() for c in text):
            if tasks.environment_step(tasks.canonical_fen(board), text).kind != "legal":
                return text
    return "0000"


@dataclass
class _Selection:
    policy: list = field(default_factory=list)  # dicts without labels
    env: list = field(default_factory=list)
    mate: list = field(default_factory=list)


def heldout_positions(data_dir: str | Path) -> set[str]:
    """The position keys of a data set's val and test records (P:, A: and mate-in-one): a run with
    exclude_dir gives them to no split, so its training data never holds that set's held-out positions."""
    names = [TASK_FILES[t].format(split=s) for t in ("P", "A") for s in ("val", "test")] + [MATE_FILE]
    files = [f for name in names for f in checked_files(name, data_dir)]  # a lost shard's positions would leak
    if not files:
        raise ValueError(f"DatagenConfig.exclude_dir {str(data_dir)!r} holds no val/test data files ({', '.join(names)})")
    return {tasks.position_key(r["fen"]) for f in files for r in load_jsonl(f).records if r["split"] != "train"}


def select_samples(games: list[dict], cfg: DatagenConfig, progress: bool = False) -> Iterator[_Selection]:
    """Deterministic sample selection, one _Selection per game in game order, with the split
    ownership and dedupe rules of the module docstring (a generator: A: records can be written
    while later games are still being sampled)."""
    owner: dict[str, str] = dict.fromkeys(heldout_positions(cfg.exclude_dir), "excluded") if cfg.exclude_dir else {}
    seen_p: set[str] = set()
    seen_a: set[tuple[str, str]] = set()
    seen_m: set[str] = set()
    for g in tqdm(sorted(games, key=lambda g: g["game"]), desc="sampling", unit="game", disable=not progress):
        sel = _Selection()
        split = split_of_game(g["game"], cfg)
        rng = random.Random(f"{cfg.seed}:sample:{g['game']}")
        board = chess.Board()
        fen = tasks.canonical_fen(board)
        history: list[str] = []
        for ply, uci in enumerate(g["moves"]):
            key = tasks.board_key(board)  # one key per position, whatever the en-passant spelling
            played = None  # the A: sample of the move played, if taken
            move = chess.Move.from_uci(uci)
            mine = owner.setdefault(key, split) == split
            here = {"split": split, "game": g["game"], "source": g["kind"], "ply": ply, "fen": fen}
            previous = history[-(tasks.HISTORY_LEN - 1):]
            u_p, u_a, u_x = rng.random(), rng.random(), rng.random()
            if mine and not g.get("mate_only"):
                ptags = position_tags(board)
                rate = cfg.policy_rate * (3 if ptags else 1) * (RANDOM_POLICY_WEIGHT if g["kind"] == "random" else 1)
                if {"en_passant", "promotion"} & set(ptags) and cfg.policy_rate > 0:
                    rate = 1.0  # rare: keep them all (unless P: samples are off)
                if u_p < rate and key not in seen_p:
                    seen_p.add(key)
                    sel.policy.append({**here, "tags": ptags, "n_legal": board.legal_moves.count()})
                mtags = move_tags(board, move)
                rare = bool({"en_passant", "promotion"} & set(mtags))
                env_rate = cfg.env_rate * (3 if "castling" in mtags else 1) * (RANDOM_ENV_WEIGHT if g["kind"] == "random" else 1)
                take = cfg.env_rate >= 1 or u_a < env_rate or rare or ply == len(g["moves"]) - 1  # 1: every move
                if take and (key, uci) not in seen_a:
                    seen_a.add((key, uci))
                    played = {**here, "move": uci, "previous": previous, "tags": mtags}
                    sel.env.append(played)
                    if u_x < cfg.illegal_rate:  # at most one wrong sibling per position
                        text = wrong_move(board, rng)
                        if (key, text) not in seen_a:
                            seen_a.add((key, text))
                            sel.env.append({**here, "move": text, "wrong": True, "previous": previous, "tags": []})
            if mine and split != "train" and key not in seen_m:
                mates = mating_moves(board)
                if mates:
                    seen_m.add(key)
                    sel.mate.append({**here, "mating_moves": mates})
            board.push(move)
            history.append(uci)
            fen = tasks.canonical_fen(board)  # the next position: this move's new FEN too
            if played is not None:  # its transition from the board at hand (see env_record)
                # the position alone decides (environment_step): a fivefold repetition needs the game's history
                played["after"] = (fen, board.copy(stack=False).outcome(claim_draw=False))
        yield sel


def _record(task: str, s: dict, suffix: str = "", **fields) -> dict:
    """A record: the fields every kind starts with, then `fields`."""
    return {"id": f"{task}-{s['game']:05d}-{s['ply']:03d}{suffix}", "task": task, "split": s["split"],
            "game": s["game"], "ply": s["ply"], "source": s["source"], "fen": s["fen"], **fields}


def policy_record(s: dict, label: dict, engine_name: str) -> dict:
    """The P: record of a selected position and its Stockfish label (a position with legal moves)."""
    moves, evals = label["moves"], label["evals"]
    tags = list(s["tags"]) + (["mate"] if tasks.parse_eval(evals[0]).mate is not None else [])
    prompt, completion = tasks.policy_text(s["fen"], moves, evals, moves[0])
    return _record("P", s, moves=moves, evals=evals, best=moves[0], n_legal=s["n_legal"], tags=tags,
                   engine=engine_name, limit=label["limit"], prompt=prompt, completion=completion)


def env_record(s: dict) -> dict:
    """The A: record of a selected move as python-chess replays it; a wrong-move sibling (one per
    position at most) is A-<game>-<ply>-x1. A move of the game carries its transition from the
    sampling pass (`after`: new FEN and outcome), which is tasks.environment_step's without parsing
    the FEN again (a third of the cost; tests/test_datagen.py checks they agree on every move)."""
    if "after" in s:
        tr = tasks.legal_transition(s["fen"], s["move"], s["previous"], *s["after"])
    else:
        tr = tasks.environment_step(s["fen"], s["move"], s["previous"])
    return _record("A", s, "-x1" if s.get("wrong") else "", move=tr.move, history=list(tr.history),
                   new_fen=tr.new_fen, reward=tr.reward, terminated=tr.terminated, truncated=tr.truncated,
                   kind=tr.kind, termination=tr.termination, tags=s["tags"], prompt=tr.prompt,
                   completion=tr.completion)


def mate_record(s: dict) -> dict:
    return _record("M1", s, mating_moves=s["mating_moves"], prompt=tasks.policy_prompt(s["fen"]))


class _Outputs:
    """The record files of a run, written in record order while it runs: each name as one file or
    as shards of cfg.shard_size records (``env_train-00000.jsonl[.gz]``), each shard written
    atomically into the work directory as soon as it is full. The record stream is deterministic,
    so a resumed run keeps the shards already there and only counts their records (it never builds
    them again). :meth:`publish` moves the files into the output directory at the end."""

    def __init__(self, work: Path, cfg: DatagenConfig):
        self.dir = work / "out"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.size, self.compress = cfg.shard_size, cfg.compress
        self.counts: dict[str, int] = {}  # file name -> records so far
        self.pending: dict[str, list[dict]] = {}  # the records of each name's shard being filled
        self._plain: dict[str, tuple] = {}  # unsharded: name -> (atomic_file context, its file, what writes to it)
        self._done: dict[str, tuple[int, bool]] = {}  # name -> (shard, whether it was on disk at its first record)

    def file_name(self, name: str, shard: int | None) -> str:
        return data_file_name(name, shard if self.size else None, self.compress)

    def add(self, name: str, make: Callable[[], dict]) -> None:
        """Append the record make() builds to `name`; make() is not called for a record of a shard
        that an interrupted run finished."""
        n = self.counts.get(name, 0)
        self.counts[name] = n + 1
        if self.size and self._finished(name, n // self.size):
            return
        rec = make()
        if not self.size:
            with naming(self.dir / self.file_name(name, None)):  # a full disk names the file
                self._write(self._plain_file(name), [rec])
            return
        self.pending.setdefault(name, []).append(rec)
        if len(self.pending[name]) == self.size:
            self._flush(name, n // self.size)

    def _finished(self, name: str, shard: int) -> bool:
        """Whether shard `shard` of `name` is on disk (one stat per shard, not per record)."""
        if self._done.get(name, (None,))[0] != shard:
            self._done[name] = (shard, (self.dir / self.file_name(name, shard)).exists())
        return self._done[name][1]

    def _plain_file(self, name: str):
        """The open (temporary) file of an unsharded name, gzipped when compressing."""
        if name not in self._plain:
            ctx = atomic_file(self.dir / self.file_name(name, None))
            raw = ctx.__enter__()
            self._plain[name] = (ctx, raw, _gzip_writer(raw) if self.compress else raw)
        return self._plain[name][2]

    @staticmethod
    def _write(f, recs: list[dict]) -> None:
        f.write(b"".join(json_line(r) for r in recs))

    def _flush(self, name: str, shard: int) -> None:
        recs, self.pending[name] = self.pending[name], []

        def write(raw):  # closing the gzip stream writes its trailer, and leaves `raw` open
            with _gzip_writer(raw) if self.compress else contextlib.nullcontext(raw) as f:
                self._write(f, recs)

        atomic_write(self.dir / self.file_name(name, shard), write)

    def finish(self) -> None:
        """Write the last shard of every name; complete the unsharded files."""
        for name, recs in self.pending.items():
            if recs:
                self._flush(name, (self.counts[name] - 1) // self.size)
        for name, (ctx, raw, f) in self._plain.items():
            if f is not raw:
                with naming(self.dir / self.file_name(name, None)):
                    f.close()  # writes the gzip trailer; the atomic file is renamed below
            ctx.__exit__(None, None, None)
        self._plain.clear()

    def abort(self) -> None:
        """An error: the unsharded files being written are dropped (finished shards stay)."""
        for ctx, _, _ in self._plain.values():
            with contextlib.suppress(Exception):
                ctx.__exit__(RuntimeError, RuntimeError("aborted"), None)
        self._plain.clear()

    def publish(self, out: Path, replaces: set[str] | None) -> tuple[dict, list[str]]:
        """Move every file into `out`, removing that name's older files there (another layout, a
        longer run's extra shards, a file this run leaves empty) that `replaces` names (the data set datagen
        made there before; None: every one, as --fresh asks): a split another tool added (convert) stays.
        Returns ({name: records}, the file names published)."""
        published = []
        for name in DATA_FILES:
            mine = {p.name for p in data_files_of(name, self.dir)}
            for old in data_files_of(name, out):
                if old.name not in mine and (replaces is None or old.name in replaces):
                    old.unlink()
            for f in sorted(mine):
                shutil.move(self.dir / f, out / f)  # a rename, unless --work-dir is on another filesystem
            published += sorted(mine)
        return {name: self.counts[name] for name in DATA_FILES if self.counts.get(name)}, published


def _gzip_writer(raw) -> gzip.GzipFile:
    """A gzip stream into the binary file `raw`, with no name or time in its header: the same
    records give the same bytes on every run."""
    return gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=GZIP_LEVEL, mtime=0, filename="")


# --- Stockfish: datagen's lean UCI client ---
# python-chess's commands, but only the last info line of each PV parsed (python-chess turns every
# line's PV into moves): the same labels and moves for 1/1.3 of its CPU (benchmarks/bench_datagen.py).

def go_command(limit: chess.engine.Limit) -> str:
    """The UCI `go` line of a depth or node limit."""
    return "go" + "".join(f" {k} {getattr(limit, k)}" for k in ("depth", "nodes") if getattr(limit, k))


class UciAnalyser:
    """One Stockfish process (in a process group of its own) spoken to in plain UCI. Raises
    EngineFailedError when the process dies, or is killed by the watchdog past its time limit."""

    def __init__(self, path: str, settings: EngineSettings):
        self.go, self.limit_key = go_command(settings.limit), settings.limit_key
        self.floor = engine.TIMEOUT_FLOOR_S  # read now: the fault tests lower it
        self.timeout = search_timeout(settings.limit, settings.multipv, self.floor)
        self.dead, self.name, self.path = False, "unknown", path
        try:
            self.proc = subprocess.Popen([path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         text=True, bufsize=1, start_new_session=True)
        except OSError as exc:
            raise StockfishNotFoundError(f"cannot start Stockfish at {path!r} ({exc.strerror or exc}). {INSTALL_HINT}") from None
        for line in self._exchange("uci\n", "uciok", self.floor):
            if line.startswith("id name "):
                self.name = line[8:].strip()
        self._exchange(f"setoption name Threads value {settings.threads}\nsetoption name Hash value "
                       f"{settings.hash_mb}\nsetoption name MultiPV value {settings.multipv}\nisready\n",
                       "readyok", self.floor)

    def _exchange(self, commands: str, until: str, timeout: float) -> list[str]:
        """Send `commands`, return the lines up to the one starting with `until` (included); a watchdog kills
        the process after `timeout` seconds, so a hung engine fails instead of blocking."""
        watchdog = threading.Timer(timeout, self.kill)
        watchdog.daemon = True
        watchdog.start()
        lines = []
        try:
            self.proc.stdin.write(commands)
            self.proc.stdin.flush()
            for line in self.proc.stdout:
                lines.append(line)
                if line.startswith(until):
                    return lines
        except (OSError, ValueError):  # a broken pipe, or a pipe closed by kill()
            pass
        finally:
            watchdog.cancel()
        self.kill()
        raise EngineFailedError(f"Stockfish ({self.path}) ended without {until!r} (died, or no answer within {timeout} s)")

    def analyse(self, fen: str) -> Analysis:
        """The multipv analysis of `fen` from a cleared hash: what EnginePool.analyse returns."""
        board = chess.Board(fen)  # a position of a played game: valid
        fen = board.fen(en_passant="fen")
        if not any(board.legal_moves):
            return Analysis(fen, (), (), self.limit_key, 0)
        last = {}  # multipv index -> tokens of its last info line with a PV
        try:
            for line in self._exchange(f"ucinewgame\nposition fen {fen}\n{self.go}\n", "bestmove", self.timeout):
                if line.startswith("info depth") and " pv " in line:
                    t = line.split()
                    last[int(t[t.index("multipv") + 1]) if "multipv" in t else 1] = t
            lines = {}  # first move -> eval, best first (as engine._to_analysis)
            for _, t in sorted(last.items()):
                i, move = t.index("score"), t[t.index("pv") + 1]
                score = chess.engine.Mate(int(t[i + 2])) if t[i + 1] == "mate" else chess.engine.Cp(int(t[i + 2]))
                if not board.is_legal(chess.Move.from_uci(move)):
                    raise ValueError(f"illegal move {move!r} in {fen!r}")
                lines.setdefault(move, tasks.Eval.from_score(score))
            depth = max((int(t[t.index("depth") + 1]) for t in last.values()), default=None)
        except (ValueError, IndexError) as exc:  # an info line unread (no score, a word for a number) or an illegal move
            self.kill()
            raise EngineFailedError(f"Stockfish gave an analysis that cannot be used ({exc})") from None
        if not lines:
            self.kill()
            raise EngineFailedError(f"Stockfish gave no line with a move and a score for {fen!r}")
        return Analysis(fen, tuple(lines), tuple(lines.values()), self.limit_key, depth)

    def play(self, board: chess.Board, limit: chess.engine.Limit) -> chess.Move:
        """The engine's move in `board` under `limit` (depth or nodes), sent as python-chess's session
        sends it: the root position and every move since. EngineSessionLost if the process fails."""
        root = board.root().fen(en_passant="fen")
        position = "startpos" if root == chess.STARTING_FEN else f"fen {root}"
        moves = " ".join(m.uci() for m in board.move_stack)
        try:
            last = self._exchange(f"position {position}{' moves ' + moves if moves else ''}\n{go_command(limit)}\n",
                                  "bestmove", search_timeout(limit, 1, self.floor))[-1]
            if not board.is_legal(move := chess.Move.from_uci(last.split()[1])):  # 0000 too
                raise ValueError(f"illegal bestmove {move.uci()!r} in {board.fen()!r}")
            return move
        except (EngineFailedError, ValueError, IndexError) as exc:  # the last two: a garbled or illegal bestmove
            self.kill()
            raise EngineSessionLost(f"Stockfish failed during a session ({type(exc).__name__}: {exc})") from None

    def kill(self) -> None:
        """End the process and its process group (idempotent); it is reaped before this returns."""
        if not self.dead:  # once, before the reaping below frees the group id
            self.dead = True
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            self.proc.stdin.close()
        with contextlib.suppress(Exception):
            self.proc.wait(timeout=5)


class LeanPool(contextlib.AbstractContextManager):
    """Datagen's engine processes (:class:`UciAnalyser`), one per thread and MultiPV, started on first
    use and replaced when one dies: `size` threads label at once (:meth:`label_many`), a game plays on
    its thread's (:meth:`session`). :meth:`close` (``with``) kills every process and refuses new work."""

    def __init__(self, settings: EngineSettings, size: int):
        self.settings, self.size = settings, size
        self.path = find_stockfish(settings.path)
        self._live: list[UciAnalyser] = []  # every process, for close()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise EngineFailedError("engine pool is closed")

    def _process(self, multipv: int) -> UciAnalyser:
        """The calling thread's process at `multipv`, started if it has none or it died."""
        p = getattr(self._local, f"multipv{multipv}", None)
        if p is None or p.dead:
            self._check_open()
            p = UciAnalyser(self.path, dataclasses.replace(self.settings, multipv=multipv))
            with self._lock:
                self._live.append(p)
            if self._closed:  # closed while it started
                p.kill()
                self._check_open()
            setattr(self._local, f"multipv{multipv}", p)
        return p

    def _end(self, p: UciAnalyser) -> None:
        p.kill()
        with self._lock:
            if p in self._live:
                self._live.remove(p)

    def version(self) -> str:
        """The engine's UCI id name, e.g. ``Stockfish 15.1`` (starts this thread's game process)."""
        return self._process(multipv=1).name

    def label_many(self, fens: Sequence[str], *, progress: bool = False,
                   on_result: Callable[[int, Analysis], None] | None = None) -> None:
        """Analyse `fens` at the pool's settings (the results of EnginePool.analyse) on `size` threads;
        `on_result(index, analysis)` runs in the calling thread as each completes. A failed search is
        retried on a fresh process `max_retries` times; an error or Ctrl-C closes the pool at once."""
        if not self.settings.reproducible:
            raise ValueError("label_many needs reproducible settings (a depth or node limit, one thread, fresh_search)")

        def label(fen: str) -> Analysis:
            failures = []
            for _ in range(self.settings.max_retries + 1):
                p = self._process(self.settings.multipv)
                try:
                    return p.analyse(fen)
                except EngineFailedError as exc:
                    self._end(p)
                    self._check_open()  # killed on purpose (close, Ctrl-C): no retry
                    failures.append(str(exc))
                    log.warning("Stockfish failed while labelling (%s); restarting it", exc)
            raise EngineFailedError(f"Stockfish failed on every attempt while labelling: {failures[-1]}")

        try:
            for i, analysis in threaded(label, list(fens), self.size, progress, "labelling", unit="pos"):
                if on_result is not None:
                    on_result(i, analysis)
        except BaseException:
            self.close()
            raise

    @contextlib.contextmanager
    def session(self):
        """This thread's game process, as :meth:`.engine.EnginePool.session` (MultiPV 1, the hash
        cleared at the start): its `play` gives the same moves. If the process dies, EngineSessionLost
        asks the caller to replay the game."""
        p = self._process(multipv=1)
        try:
            try:
                p._exchange("ucinewgame\nisready\n", "readyok", p.floor)  # as python-chess's first move of a game
            except EngineFailedError as exc:  # it died while idle (or the pool closed: the run is stopping)
                self._check_open()
                raise EngineSessionLost(f"Stockfish failed at a session's start ({exc})") from None
            yield p
        except BaseException:
            self._end(p)
            raise

    def close(self) -> None:
        """Kill every process (each is reaped) and refuse new work. Idempotent."""
        with self._lock:
            self._closed = True
            victims, self._live = self._live, []
        for p in victims:
            p.kill()

    def __exit__(self, *exc) -> None:
        self.close()


# --- Generation ---

class WorkDirMismatch(RuntimeError):
    """The work directory belongs to a run with other settings."""


@dataclass
class DatagenReport:
    """What a run produced and how long each stage took."""

    counts: dict  # file name -> records, for the files written
    games_played: int  # games played in this invocation (the rest were reused)
    games_reused: int
    positions_labelled: int  # analyses run in this invocation
    labels_reused: int
    seconds: dict  # stage -> wall seconds
    engine: str
    env_records: int = 0  # A: records written (their building is timed in "select")
    reused: bool = False  # the data set in out_dir was this run's settings' own, its files unchanged: kept as it was

    @property
    def label_positions_per_s(self) -> float:
        """Positions labelled per second in this invocation (NaN when none were)."""
        s = self.seconds.get("label", 0.0)
        return self.positions_labelled / s if s > 0 else float("nan")


def generate(cfg: DatagenConfig, *, progress: bool = True, fresh: bool = False) -> DatagenReport:
    """Run (or resume) data generation into cfg.out_dir, holding its lock (one writer per directory:
    a second run raises RunDirBusyError before it writes anything). Engine failures and Ctrl-C
    propagate; what was finished stays in the work directory for the next run. A data set that these
    settings and engine made there, its files unchanged since (`<out>/.datagen.json` records their
    digests), is kept and reported (`reused`) without a game played; `fresh` makes it again."""
    if cfg.exclude_dir:  # a bad --exclude-dir stops here, before anything is started or written
        heldout_positions(cfg.exclude_dir)
    _check_work_dir(cfg.work_path(), cfg.out_dir)
    settings = EngineSettings(depth=cfg.depth, nodes=cfg.nodes, multipv=cfg.multipv, path=cfg.stockfish)
    with LeanPool(settings, size=cfg.workers) as pool:  # finds and starts Stockfish first: no stray dirs
        engine_name = pool.version()
        # the work directory is locked too where it lies outside --out (--work-dir): two runs sharing one
        # would write each other's games
        outside = not _inside(cfg.work_path(), cfg.out_dir)
        with run_lock(cfg.out_dir), (run_lock(cfg.work_path()) if outside else contextlib.nullcontext()):
            report = _generate(cfg, pool, engine_name, progress, fresh)
            if not cfg.keep_work:
                _remove_work(cfg.work_path(), keep_lock=False)
    return report


WORK_ENTRIES = ("config.json", "games.jsonl", "labels.jsonl", "out")  # all a work directory holds, with LOCK_FILE


def _check_work_dir(work: Path, out_dir) -> None:
    """Refuse a work directory that datagen would delete with what it must keep: --out itself or a folder
    above it, or a folder holding files of its own (a work directory holds only WORK_ENTRIES)."""
    if _inside(out_dir, work):
        raise ValueError(f"DatagenConfig.work_dir is {work}, which is out_dir or a folder above it: datagen deletes "
                         "its work directory when it finishes; choose a folder of its own")
    if work.is_dir() and (foreign := sorted(p.name for p in work.iterdir() if p.name not in (*WORK_ENTRIES, LOCK_FILE))):
        raise ValueError(f"DatagenConfig.work_dir {work} holds files that are not datagen's ({', '.join(foreign[:3])}"
                         f"{', ...' if len(foreign) > 3 else ''}): datagen empties and deletes its work directory; "
                         "choose an empty or new folder")


def _remove_work(work: Path, keep_lock: bool) -> None:
    """Delete what datagen keeps in `work` (WORK_ENTRIES), then the folder itself unless keep_lock, or
    where something else is left in it."""
    for name in WORK_ENTRIES + (() if keep_lock else (LOCK_FILE,)):
        item = work / name
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(item) if item.is_dir() and not item.is_symlink() else item.unlink()
    if not keep_lock:
        with contextlib.suppress(OSError):  # not empty: something not ours stays, with its folder
            work.rmdir()


MADE_FILE = ".datagen.json"  # in --out: the settings, engine, counts and file digests of the data set made there


def _data_set_files(out_dir, names: Iterable[str]) -> dict[str, str] | None:
    """The data files `names` in `out_dir` -> their digests (None where one is missing)."""
    try:
        return {n: file_digest(Path(out_dir) / n).hex() for n in names}
    except FileNotFoundError:
        return None


def _kept(made: dict, state: dict, out_dir) -> DatagenReport | None:
    """The report of the data set that `made` (its MADE_FILE) describes, when these settings and engine
    made it and its files are there unchanged; else None (it is made again)."""
    t, files, r = time.perf_counter(), made.get("files"), made.get("report")
    if (_settings_of(made) != state or not files or not isinstance(files, dict) or not isinstance(r, dict)
            or _data_set_files(out_dir, files) != files):  # its own files: a split another tool added is not its
        return None
    try:
        return DatagenReport(counts=dict(r["counts"]), games_played=0, games_reused=int(r["games"]), positions_labelled=0,
                             labels_reused=int(r["labels"]), seconds={"check": time.perf_counter() - t},
                             engine=state["engine"], env_records=int(r["env_records"]), reused=True)
    except (KeyError, TypeError, ValueError):  # a record edited by hand: the data set is made again
        return None


def _settings_of(made) -> dict | None:
    """The settings and engine a MADE_FILE record holds (None: not a record)."""
    return {k: made.get(k) for k in ("config", "engine")} if isinstance(made, dict) else None


def _generate(cfg: DatagenConfig, pool: LeanPool, engine_name: str, progress: bool, fresh: bool) -> DatagenReport:
    """The run itself, under the lock: games, sample selection, labels, then the record files."""
    work, state = cfg.work_path(), {"config": cfg.content_key(), "engine": engine_name}
    made_here = None  # the settings of the data set datagen last published there
    with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):  # unreadable or not a record: none
        made_here = json.loads((Path(cfg.out_dir) / MADE_FILE).read_text())
        made_here = {**made_here, "config": _resolved_exclude(made_here.get("config") or {})}  # an older record's
    if not fresh and isinstance(made_here, dict) and (kept := _kept(made_here, state, cfg.out_dir)):
        return kept
    if not fresh and not _resumes_into(work, cfg.out_dir) and _settings_of(made_here) != state and (
            there := [f.name for name in DATA_FILES for f in data_files_of(name, cfg.out_dir)]):
        differ = f" ({_settings_diff(made_here, state)})" if isinstance(made_here, dict) else ""
        raise ValueError(f"{cfg.out_dir} already holds a data set ({', '.join(there[:3])}{', ...' if len(there) > 3 else ''}) "
                         f"that no run of these settings made{differ}: datagen would replace it; choose an empty --out, "
                         "delete those files, or pass --fresh to replace them")
    seconds: dict[str, float] = {}
    clock = time.perf_counter
    _open_work_dir(work, state, fresh, cfg.out_dir)
    t = clock()
    games, played = _play_games(cfg, pool, work / "games.jsonl", progress)
    seconds["games"], t = clock() - t, clock()
    outputs = _Outputs(work, cfg)
    try:
        # one pass: A: records are written as their games are sampled (memory does not grow with
        # them); P: positions and mate-in-one positions wait for the labels
        policy, mate = [], []
        for sel in select_samples(games, cfg, progress=progress):  # cheap and deterministic: never stored
            policy += sel.policy
            mate += sel.mate
            for s in sel.env:
                outputs.add(TASK_FILES["A"].format(split=s["split"]), functools.partial(env_record, s))
        seconds["select"], t = clock() - t, clock()
        labels, labelled = _label(list(dict.fromkeys(s["fen"] for s in policy)), pool, work / "labels.jsonl",
                                  progress)
        seconds["label"], t = clock() - t, clock()
        for s in policy:
            if labels[s["fen"]]["moves"]:  # a position without legal moves has no label
                outputs.add(TASK_FILES["P"].format(split=s["split"]),
                            functools.partial(policy_record, s, labels[s["fen"]], engine_name))
        for s in mate:
            outputs.add(MATE_FILE, functools.partial(mate_record, s))
        outputs.finish()
    except BaseException:
        outputs.abort()
        raise
    ours = made_here.get("files") if not fresh and isinstance(made_here, dict) else None  # datagen's files there
    counts, published = outputs.publish(Path(cfg.out_dir), set(ours) if isinstance(ours, dict) else None)
    env_records = sum(n for k, n in counts.items() if k.startswith("env_"))
    made = {**state, "files": _data_set_files(cfg.out_dir, published),
            "report": {"counts": counts, "games": len(games), "labels": len(labels), "env_records": env_records}}
    atomic_write(Path(cfg.out_dir) / MADE_FILE, lambda f: f.write(json.dumps(made, indent=1).encode()))
    seconds["write"] = clock() - t
    return DatagenReport(counts=counts, games_played=played, games_reused=len(games) - played,
                         positions_labelled=labelled, labels_reused=len(labels) - labelled, seconds=seconds,
                         engine=engine_name, env_records=env_records)


def _inside(path: Path, folder) -> bool:
    return Path(path).resolve().is_relative_to(Path(folder).resolve())


def _resumes_into(work: Path, out_dir) -> bool:
    """Whether `work` holds an interrupted run into `out_dir` (recorded as "out"; a work directory of an
    older version: one inside out_dir), whose data set there is its own to replace."""
    try:
        recorded = json.loads((work / "config.json").read_text()).get("out")
    except (OSError, ValueError, AttributeError):
        return False
    return recorded == str(Path(out_dir).resolve()) if recorded else _inside(work, out_dir)


def _open_work_dir(work: Path, state: dict, fresh: bool, out_dir) -> None:
    """Create the work directory (recording the --out it works for), or check that the one there has
    this run's settings (its games and labels are valid only for those)."""
    if fresh and work.exists():  # emptied, its .lock kept: another run must not take a lock held on it
        _remove_work(work, keep_lock=True)
    work.mkdir(parents=True, exist_ok=True)
    path = work / "config.json"
    if not path.exists():
        record = {**state, "out": str(Path(out_dir).resolve())}
        atomic_write(path, lambda f: f.write(json.dumps(record, indent=1).encode()))
        return
    try:
        if not isinstance(old := json.loads(path.read_text()), dict):  # valid JSON, but not the record written
            raise ValueError(path)
    except ValueError:
        raise DataFormatError(f"corrupt work file: {path}; delete {work} or rerun with --fresh") from None
    if diffs := _settings_diff({**old, "config": _resolved_exclude(old.get("config") or {})}, state):
        raise WorkDirMismatch(f"{work} holds the work of a run with other settings, interrupted or kept by --keep-work "
                              f"({diffs}); rerun with those settings to resume or keep it, or pass --fresh to discard it")


def _settings_diff(old: dict, new: dict) -> str:
    """"key: old -> new; ..." between two records of settings and engine (see _settings_of)."""
    a = {**(old.get("config") or {}), "engine": old.get("engine")}
    b = {**new["config"], "engine": new["engine"]}
    return "; ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))


def _read_work(path: Path) -> list[dict]:
    """The finished items of a work file; a torn last line (a kill mid-write) is left out, and redone."""
    if not path.exists():
        return []
    try:
        return [item for _, item in json_lines(path, torn_tail=True)]
    except DataFormatError as exc:
        raise DataFormatError(f"corrupt work file: {exc}; delete {path.parent} or rerun with --fresh") from None


def _play_games(cfg: DatagenConfig, pool: LeanPool, path: Path, progress: bool) -> tuple[list[dict], int]:
    """Every game in index order (those in the work file reused), and how many were played now."""
    games = {g["game"]: g for g in _read_work(path)}
    n = cfg.games + cfg.mate_games + cfg.test_games
    # the indices to play, generated as games finish: memory grows with the games played, not the count asked for
    todo = (i for i in range(n) if i not in games)
    total = n - sum(i < n for i in games)
    if total:
        with JsonlAppender(path, sync_every=8) as app:  # a game is slow to replay: sync often
            for _, g in threaded(lambda i: play_game(i, cfg, pool), todo, cfg.workers, progress, "games", unit="game",
                                 total=total):
                app.write(g)
                games[g["game"]] = g
    return [games[i] for i in sorted(games)], total


def _label(fens: list[str], pool: LeanPool, path: Path, progress: bool) -> tuple[dict, int]:
    """Stockfish labels by FEN (those in the work file reused), and how many were analysed now."""
    labels = {rec["fen"]: rec for rec in _read_work(path)}
    todo = [f for f in fens if f not in labels]
    if todo:
        with JsonlAppender(path) as app:
            def on_result(i, analysis):
                rec = {"fen": todo[i], "limit": analysis.limit, "depth": analysis.depth,
                       "moves": list(analysis.moves), "evals": [tasks.format_eval(e) for e in analysis.evals]}
                app.write(rec)
                labels[todo[i]] = rec

            pool.label_many(todo, progress=progress, on_result=on_result)
    return labels, len(todo)


# --- Command line ---

def build_parser() -> argparse.ArgumentParser:
    """`rookworld datagen`'s options: one per DatagenConfig field, plus the modes."""
    p = argparse.ArgumentParser(
        prog="rookworld datagen",
        description="Generate Stockfish-labelled P:/A: samples and the mate-in-one set as JSON lines "
                    "(resumable: rerun the same command after an interruption), or validate/summarise files.")
    docs = field_docs(DatagenConfig)
    p.add_argument("--out", dest="out_dir", default=None, type=path_arg,
                   help=f"output directory (default: {DatagenConfig.out_dir}, git-ignored); --validate and "
                        f"--summary read it, or the shipped {DATA_DIR} without --out")
    add_config_arguments(p, DatagenConfig, skip=("out_dir", "depth", "nodes", "workers"))
    depth_or_nodes = p.add_mutually_exclusive_group()  # default None, so that giving one clears the other
    depth_or_nodes.add_argument("--depth", type=int, help=f"{docs['depth']} (default: {DatagenConfig.depth})")
    depth_or_nodes.add_argument("--nodes", type=int, help=docs["nodes"])
    p.add_argument("--workers", type=int, help=f"{docs['workers']} (default: the usable cores)")
    p.add_argument("--fresh", action="store_true", help="discard an interrupted run's state instead of resuming it, and replace a data set already in --out (one these settings made too)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--validate", nargs="*", metavar="FILE", default=None, type=path_arg,
                   help="validate data files (default: every data file in --out) and exit")
    p.add_argument("--summary", action="store_true", help="print the data card tables of --out and exit")
    return p


def _fail(message: str, status: int, lead: str = "") -> int:
    """Say what went wrong in one `rookworld datagen:` line on stderr; return the exit status."""
    print(f"{lead}rookworld datagen: {message}", file=sys.stderr)
    return status


def _no_data_files(out: str) -> str:
    return f"no data files (*.jsonl, *.jsonl.gz) in {out}{not_a_folder(out)}"


def _validate_files(files: list[Path], out: str) -> int:
    """Validate every line of `files`, and the shard numbering of their directories (a missing shard is
    lost records); one line per file, errors on stderr; 1 if any is bad."""
    if not files:
        return _fail(f"error: {_no_data_files(out)}", 1)
    bad = 0
    for f in files:
        if f.is_dir():  # `--validate DIR`: its files are what is meant
            bad += _fail(f"error: {f} is a directory; give the files in it ({f}/*.jsonl*), or validate it with "
                         f"--validate --out {f}", 1)
            continue
        try:  # a file named as datagen names them holds that task's records of that split alone
            print(f"{f}: {len(load_data_file(f, *role) if (role := role_of(f)) else load_jsonl(f))} records OK")
        except DataFormatError as exc:
            bad += _fail(f"error: {exc}", 1)
    for d in sorted({f.parent for f in files}):  # a missing shard (lost records), a split in two layouts (read twice)
        for name in DATA_FILES:
            try:
                checked_files(name, d)
            except DataFormatError as exc:
                bad += _fail(f"error: {exc}", 1)
    return 1 if bad else 0


def cli(argv: list[str] | None = None) -> int:
    """`rookworld datagen`: 0 on success, 130 after Ctrl-C; 1 for any error a user can cause (bad data files or
    settings, a missing or failing Stockfish, an --out that another run is writing or that cannot be written), in
    one line on stderr: engine failures and Ctrl-C here (the finished work is kept for the same command), the rest
    from `cli.main`, which names an unwritable path without promising a resume. A command line argparse cannot
    parse is refused with its usage and status 2, as in every `rookworld` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.validate is not None or args.summary:  # they read files: a generation setting would be ignored
        mode = "--validate" if args.validate is not None else "--summary"
        # a value equal to the default passes: argparse's, or the one a run would take for it (depth 8, the cores)
        taken = {"depth": DatagenConfig.depth if args.nodes is None else None, "workers": min(usable_cores(), MAX_WORKERS)}
        unused = [flag_name(dest) for dest, value in vars(args).items()
                  if dest not in ("out_dir", "validate", "summary", "no_progress") and value != parser.get_default(dest)
                  and (dest not in taken or value != taken[dest])]
        if args.validate and args.out_dir is not None:  # the files given are read; --out names none of them
            unused.insert(0, "--out")
        if args.validate is not None and args.summary:
            unused.insert(0, "--summary")
        if unused:
            raise ValueError(f"{mode} reads the data files in --out and generates nothing: {', '.join(unused)} "
                             "would be ignored; leave them out")
    if args.out_dir is None:  # reading defaults to the shipped set; writing never goes there by default
        args.out_dir = str(DATA_DIR) if args.validate is not None or args.summary else DatagenConfig.out_dir
    if args.validate is not None:
        out = Path(args.out_dir)
        return _validate_files([Path(f) for f in args.validate] or sorted([*out.glob("*.jsonl"), *out.glob("*.jsonl.gz")]),
                               args.out_dir)
    if args.summary:
        summary = summarize(args.out_dir)
        if not summary["files"]:
            raise ValueError(_no_data_files(args.out_dir))
        print(render_card_tables(summary))
        return 0
    fields = config_kwargs_from_args(DatagenConfig, args)
    if fields["depth"] is None and fields["nodes"] is None:
        fields["depth"] = DatagenConfig.depth
    cfg = DatagenConfig(**{**fields, "workers": min(usable_cores(), MAX_WORKERS) if args.workers is None else args.workers})
    def resume() -> str:
        if (cfg.work_path() / "games.jsonl").exists():
            return f"finished games and labels are kept in {cfg.work_path()}; run the same command again to resume"
        return "no game was finished: nothing to resume"

    try:
        report = generate(cfg, progress=not args.no_progress, fresh=args.fresh)
    except (EngineFailedError, chess.engine.EngineError, TimeoutError) as exc:
        return _fail(f"error: Stockfish failed ({type(exc).__name__}: {exc}); {resume()}", 1)
    except KeyboardInterrupt:
        return _fail(f"interrupted; {resume()}", 130, lead="\n")
    if report.reused:
        print(f"{cfg.out_dir}: the data set these settings made is there, its files unchanged: kept "
              "(--fresh makes it again)", file=sys.stderr)
    rate = report.label_positions_per_s
    print(json.dumps({**dataclasses.asdict(report), "seconds": {k: round(v, 2) for k, v in report.seconds.items()},
                      "label_positions_per_s": round(rate, 2) if math.isfinite(rate) else None,  # strict JSON
                      "workers": cfg.workers,
                      "config": cfg.content_key()}, indent=1))
    return 0
