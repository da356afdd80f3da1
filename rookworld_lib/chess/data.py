"""Data: the record files, their schema, and a loader that validates every line.

The files are JSON lines: ``policy_{train,val,test}.jsonl``, ``env_{train,val,test}.jsonl`` and
``mate_in_one.jsonl``, with the fields of :data:`SCHEMA` (described in ``data/README.md``), made by
``rookworld datagen`` (:mod:`.datagen`) or ``rookworld convert`` (:mod:`.convert`), which never leave
an empty file. :func:`load_jsonl` checks every line (JSON, fields and types, FEN, legal moves, texts
that match the fields); the audits re-derive the labels (Stockfish, python-chess); :func:`summarize`
counts what the data card shows.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import chess

from . import tasks
from .engine import EnginePool, EngineSettings, parse_limit_key
from ..core import paths as core_paths
from ..core.paths import DATA_DIR, DataFormatError, atomic_write, cache_dir, read_jsonl, unreadable

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
TASK_FILES = {"P": "policy_{split}.jsonl", "A": "env_{split}.jsonl"}
MATE_FILE = "mate_in_one.jsonl"
DATA_FILES = (*(TASK_FILES[t].format(split=s) for t in ("P", "A") for s in SPLITS), MATE_FILE)  # the data card's order
GZIP_LEVEL = 6  # of compressed output: near level 9's size at a third of its time
GAME_KINDS = ("random", "opening", "selfplay")
ORIGINAL_SOURCE = "original"  # records converted from the original RookWorld data (rookworld convert)
ORIGINAL_LIMIT = "unknown"
ENV_KINDS = ("legal", "illegal", "unparseable")


def _first_fields(task: str, ident: str, splits: str, fen: str) -> dict[str, tuple]:
    """The fields every record kind starts with."""
    return {"id": (str, f"unique: {ident}"), "task": (str, f'"{task}"'), "split": (str, splits),
            "game": (int, "index of the source game (splits are by game)"),
            "ply": (int, "half-moves played in that game before this position"),
            "source": (str, "random | opening | selfplay (how the game was played) | original (rookworld convert)"),
            "fen": (str, fen)}


# Every field of each record kind: (its JSON type, what it holds). The loader checks records against
# this table, so the documented and the validated fields cannot drift apart.
SCHEMA: dict[str, dict[str, tuple]] = {
    "P": {
        **_first_fields("P", "P-<game>-<ply>", "train | val | test", "the position (standard FEN)"),
        "moves": (list, "1-5 UCI moves, Stockfish multipv order, best first for the side to move"),
        "evals": (list, "eval texts, one per move, side to move's view: pawns '0.35' or mates 'M3' / '-M2'"),
        "best": (str, "= moves[0], the best move for the side to move"),
        "n_legal": (int, "number of legal moves"),
        "tags": (list, "any of: check, castling, en_passant, promotion, mate (position features)"),
        "engine": (str, "engine id, e.g. 'Stockfish 15.1'"),
        "limit": (str, "search limit, e.g. 'depth=8' (one thread, hash cleared per search)"),
        "prompt": (str, "'P: <fen>' (compact layout)"),
        "completion": (str, "' M: ... E: ... B: <best>' (compact layout, without EOT)"),
        "original_best": (str, "optional: a converted original line's own B: (for black its worst listed move)"),
    },
    "A": {
        **_first_fields("A", "A-<game>-<ply>[-x<k>]", "train | val | test", "position before the move"),
        "move": (str, "the move as written (UCI for legal/illegal ones, anything without '+' or spaces otherwise)"),
        "history": (list, "up to 10 move strings, the current move last"),
        "new_fen": (str, "position after the move (= fen when the move is illegal or unparseable)"),
        "reward": ((int, float), "0.001 legal, 1.0 mover wins, 0.5 draw, -1.0 illegal/unparseable"),
        "terminated": (int, "0/1"),
        "truncated": (int, "0/1 (1 exactly for illegal/unparseable moves)"),
        "kind": (str, "legal | illegal | unparseable"),
        "termination": ((str, type(None)), "null | checkmate | stalemate | insufficient_material | seventyfive_moves"),
        "tags": (list, "any of: capture, castling, en_passant, promotion, check (move features)"),
        "prompt": (str, "'A: <fen>+<move>+<history>+'"),
        "completion": (str, "'<new_fen>+<reward>+<terminated>+<truncated>' (without EOT)"),
    },
    "M1": {
        **_first_fields("M1", "M1-<game>-<ply>", "val | test (mate-in-one positions come only from held-out games)",
                        "a position whose side to move can mate in one"),
        "mating_moves": (list, "every UCI move that mates at once"),
        "prompt": (str, "'P: <fen>'"),
    },
}
OPTIONAL_FIELDS = {"original_best"}  # a converted original P: line's own B: label (see convert)


# --- Record features (the `tags` fields; shared by datagen and convert) ---

def position_tags(board: chess.Board) -> list[str]:
    """check / castling / en_passant / promotion: features of the side to move's options."""
    seventh = board.pieces_mask(chess.PAWN, board.turn) & (chess.BB_RANK_7 if board.turn == chess.WHITE else chess.BB_RANK_2)
    has = {"check": board.is_check(), "castling": any(True for _ in board.generate_castling_moves()),
           "en_passant": board.has_legal_en_passant(),
           "promotion": any(m.promotion for m in board.generate_legal_moves(from_mask=seventh)) if seventh else False}
    return [tag for tag, yes in has.items() if yes]


def move_tags(board: chess.Board, move: chess.Move) -> list[str]:
    """capture / castling / en_passant / promotion / check: features of `move` on `board`."""
    has = {"capture": board.is_capture(move), "castling": board.is_castling(move),
           "en_passant": board.is_en_passant(move), "promotion": bool(move.promotion), "check": board.gives_check(move)}
    return [tag for tag, yes in has.items() if yes]


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


# --- Loading and validation ---

@dataclass(frozen=True)
class LineError:
    """One bad line of a data file: where, and why."""

    path: str
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


class LoadedData(list):
    """The records of one JSONL file (dicts, in file order), its path, and the lines skipped under
    on_error='skip'."""

    def __init__(self, path: str, records: list[dict], skipped: list[LineError] | None = None):
        super().__init__(records)
        self.path, self.skipped = path, skipped or []

    @property
    def records(self) -> list[dict]:
        """The records themselves (this list), as a name that reads well at call sites."""
        return self

    @property
    def n_skipped(self) -> int:
        return len(self.skipped)


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
    if t not in SCHEMA:
        return f"field 'task' must be one of {sorted(SCHEMA)}, got {t!r}"
    if task is not None and t != task:
        return f"expected a {task!r} record, got task {t!r}"
    for name, (typ, _) in SCHEMA[t].items():
        if name not in rec:
            if name not in OPTIONAL_FIELDS:
                return f"missing field {name!r}"
        elif isinstance(rec[name], bool) or not isinstance(rec[name], typ):  # JSON true is no int here
            want = " or ".join(t.__name__ for t in (typ if isinstance(typ, tuple) else (typ,)))
            return f"field {name!r} has type {type(rec[name]).__name__}, not {want}"
    if extra := set(rec) - set(SCHEMA[t]):
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
    return {"P": _validate_policy, "A": _validate_env, "M1": _validate_mate}[t](rec, board)


def _validate_policy(rec, board):
    moves, evals = rec["moves"], rec["evals"]
    if err := tasks.policy_truth_error(board, moves, evals):  # the check of the truth a reward is given
        return err
    if rec["best"] != moves[0]:
        return f"field 'best' {rec['best']!r} is not moves[0] {moves[0]!r}"
    if rec.get("original_best", moves[0]) not in moves:
        return f"field 'original_best' {rec['original_best']!r} is not among 'moves'"
    if rec["n_legal"] != board.legal_moves.count():
        return f"field 'n_legal' is {rec['n_legal']}, the position has {board.legal_moves.count()} legal moves"
    if rec["limit"] != ORIGINAL_LIMIT:  # a search a reward may repeat: one it can finish (a str: SCHEMA)
        try:
            parse_limit_key(rec["limit"])
        except ValueError as exc:
            return f"field 'limit': {exc} (or {ORIGINAL_LIMIT!r})"
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
    if not hist or hist[-1] != move or len(hist) > tasks.HISTORY_LEN or not all(
            isinstance(h, str) and h and "+" not in h and not any(c.isspace() for c in h) for h in hist):
        return (f"field 'history' must be 1..{tasks.HISTORY_LEN} moves (each non-empty, without '+' or whitespace) "
                "ending with the current move")
    if err := tasks.env_truth_error(rec["new_fen"], rec["reward"], rec["terminated"], rec["truncated"]):
        return err  # the check of the truth a reward is given
    wrong = rec["kind"] != "legal"
    if wrong and (rec["new_fen"] != rec["fen"] or rec["reward"] != tasks.REWARD_ILLEGAL or rec["truncated"] != 1
                  or rec["terminated"] != 0):
        return "an illegal/unparseable move must give new_fen = fen, reward -1.0, terminated 0, truncated 1"
    if not wrong and (rec["truncated"] != 0 or rec["reward"] == tasks.REWARD_ILLEGAL):
        return "a legal move must give truncated 0 and a reward other than -1.0"
    if wrong == (tasks.legal_move(board, move) is not None):
        return f"field 'kind' is {rec['kind']!r} but the move is {'legal' if wrong else 'illegal'}"
    step = tasks.environment_step(rec["fen"], move, hist[:-1])  # the transition the environment reward checks
    if rec["kind"] != step.kind:  # illegal (UCI's shape) or unparseable (not): datagen --summary counts them apart
        return f"field 'kind' is {rec['kind']!r}, but the move {move!r} is {step.kind}"
    label = (rec["reward"], rec["terminated"], rec["termination"])
    if tasks.transition_differences(step, **{k: rec[k] for k in ("new_fen", "reward", "terminated", "termination")}):
        return (f"fields new_fen/reward/terminated/termination are {rec['new_fen']!r}/{label[0]}/{label[1]}/{label[2]!r}, "
                f"but the move gives {step.new_fen!r}/{step.reward}/{step.terminated}/{step.termination!r} "
                "(tasks.environment_step: the position alone decides, so no repetition ends a game)")
    if rec["prompt"] != tasks.env_prompt(rec["fen"], move, hist):
        return "field 'prompt' does not match fen/move/history"
    if rec["completion"] != tasks.env_completion(rec["new_fen"], rec["reward"], rec["terminated"], rec["truncated"]):
        return "field 'completion' does not match new_fen/reward/terminated/truncated"
    return None


def _validate_mate(rec, board):
    mates = rec["mating_moves"]
    if not mates:
        return "field 'mating_moves' is empty"
    mating = mating_moves(board)
    for m in mates:
        mv = tasks.legal_move(board, m) if isinstance(m, str) else None
        if mv is None:
            return f"mating move {m!r} is not legal"
        if mv.uci() not in mating:
            return f"mating move {m!r} does not mate"
    if sorted(mates) != mating:  # the card: every move that mates at once, each once (an eval counts against it)
        return f"field 'mating_moves' must list every mating move once: {mating}, got {mates}"
    if rec["prompt"] != tasks.policy_prompt(rec["fen"]):
        return "field 'prompt' does not match 'fen'"
    return None


def load_jsonl(path: str | os.PathLike, *, task: str | None = None, on_error: str = "raise") -> LoadedData:
    """Load and validate every line of a data file: the first bad line raises DataFormatError
    ("file:line: reason"), or with on_error="skip" is skipped, listed in LoadedData.skipped and counted
    in a warning. A file that cannot be read or holds no record raises DataFormatError either way.
    Bytes found wholly valid before (in any process) are parsed again, not re-checked (_validated)."""
    if on_error not in ("raise", "skip"):
        raise ValueError(f"load_jsonl: on_error must be 'raise' or 'skip', got {on_error!r}")
    path = Path(path)
    shipped = path.resolve().parent == DATA_DIR.resolve()  # the repository's data/: git holds a copy
    fix = f"restore it with `git checkout -- data/{path.name}`" if shipped else "regenerate it with `rookworld datagen`"
    records, skipped, ids = [], [], set()
    try:
        digest = file_digest(path)
        if (tasks_in := _validated(digest)) is not None and (task is None or tasks_in == {task}):
            records = [rec for _, rec, _ in read_jsonl(path)]
            if _unchanged(path, digest):  # the bytes parsed are the bytes found valid (not replaced meanwhile)
                return LoadedData(str(path), records, [])
            digest, records = file_digest(path), []
        for lineno, rec, reason in read_jsonl(path):
            reason = reason or validate_record(rec, task)
            if reason is None and rec["id"] in ids:
                reason = f"duplicate id {rec['id']!r}"
            if reason is None:
                ids.add(rec["id"])
                records.append(rec)
            elif on_error == "raise":
                raise DataFormatError(str(LineError(str(path), lineno, reason)))
            else:
                skipped.append(LineError(str(path), lineno, reason))
    except (OSError, EOFError) as exc:  # EOFError: a truncated .gz
        raise DataFormatError(f"{unreadable(path, exc)}; {fix}") from None
    if not records and not skipped:
        raise DataFormatError(f"{path}: no records (the file is empty); {fix}")
    if skipped:
        log.warning("%s: skipped %d malformed line(s); first: %s", path, len(skipped), skipped[0])
    elif _unchanged(path, digest):  # the bytes checked are the bytes hashed (not replaced meanwhile)
        _VALIDATED[digest] = frozenset(r["task"] for r in records)
        with contextlib.suppress(OSError):  # an unwritable cache: checked again next time
            (mark := _validated_mark(digest)).parent.mkdir(parents=True, exist_ok=True)
            atomic_write(mark, lambda f: f.write(" ".join(sorted(_VALIDATED[digest])).encode()))
    return LoadedData(str(path), records, skipped)


# Contents (their digest) that load_jsonl found wholly valid, with the tasks they hold: the same bytes are
# parsed again but not re-checked (the FEN parse costs ~1 ms a record: 3 s for the shipped splits in every
# process that loads them). In this process, and across processes by a mark in paths.cache_dir() named by
# the digest and by the validator's own code (this module, tasks.py, core/paths.py's JSON-lines reader,
# python-chess's version): a change to
# any of them checks every file again.
_VALIDATED: dict[bytes, frozenset[str]] = {}
_VALIDATOR = hashlib.blake2b(b"".join(Path(m.__file__).read_bytes() for m in (sys.modules[__name__], tasks, core_paths))
                             + chess.__version__.encode(), digest_size=8).hexdigest()


def file_digest(path: Path) -> bytes:
    """The blake2b-128 digest of a file's bytes."""
    return hashlib.blake2b(path.read_bytes(), digest_size=16).digest()


def _unchanged(path: Path, digest: bytes) -> bool:
    try:
        return file_digest(path) == digest
    except OSError:
        return False


def _validated_mark(digest: bytes) -> Path:
    return cache_dir() / "valid-data" / f"{digest.hex()}-{_VALIDATOR}"


def _validated(digest: bytes) -> frozenset[str] | None:
    """The tasks of contents found wholly valid before (here or in another process), else None."""
    if digest not in _VALIDATED:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            if tasks_in := frozenset(_validated_mark(digest).read_text().split()):
                _VALIDATED[digest] = tasks_in
    return _VALIDATED.get(digest)


def data_file_name(name: str, shard: int | None = None, compress: bool = False) -> str:
    """The file holding `name` (a DATA_FILES name such as ``env_train.jsonl``): itself, or its shard
    ``env_train-00003.jsonl``; ``.gz`` appended when compressed."""
    stem = name.removesuffix(".jsonl")
    return f"{stem}{'' if shard is None else f'-{shard:05d}'}.jsonl{'.gz' if compress else ''}"


def data_files_of(name: str, data_dir: str | os.PathLike | None = None) -> list[Path]:
    """Every file of `name` in a directory, in record order: ``name`` or ``name.gz``, else its
    shards (``<stem>-00000.jsonl[.gz]``, ...). Empty when there is none."""
    base, stem = Path(data_dir or DATA_DIR), name.removesuffix(".jsonl")
    whole = [base / data_file_name(name, None, gz) for gz in (False, True)]
    shards = [p for p in base.glob(f"{stem}-*.jsonl*") if _SHARD_RE.fullmatch(p.name[len(stem):])]
    return [p for p in whole if p.exists()] + sorted(shards)


_SHARD_RE = re.compile(r"-\d{5}\.jsonl(\.gz)?")


def missing_shards(name: str, data_dir: str | os.PathLike | None = None) -> list[Path]:
    """The shards of `name` that a directory lacks: shards are numbered from 00000 without gaps, so
    each number below the highest one there names a file whose records are lost."""
    stem = name.removesuffix(".jsonl")
    shards = {int(p.name[len(stem) + 1:len(stem) + 6]): p for p in data_files_of(name, data_dir)
              if _SHARD_RE.fullmatch(p.name[len(stem):])}
    if not shards:
        return []
    gz = shards[min(shards)].name.endswith(".gz")  # a lost shard was compressed as its neighbours are
    return [Path(data_dir or DATA_DIR) / data_file_name(name, i, gz) for i in range(max(shards)) if i not in shards]


def iter_records(paths, *, task: str | None = None) -> Iterator[tuple[str, int, dict]]:
    """(file, line number, record) of every line of `paths` in order, each validated as it is read
    (memory does not grow with the files): a bad line raises DataFormatError ``file:line: reason``."""
    for path in paths:
        try:
            for lineno, rec, reason in read_jsonl(path):
                reason = reason or validate_record(rec, task)
                if reason is not None:
                    raise DataFormatError(str(LineError(str(path), lineno, reason)))
                yield str(path), lineno, rec
        except (OSError, EOFError) as exc:  # EOFError: a truncated .gz
            raise DataFormatError(unreadable(path, exc)) from None


def data_file(task: str, split: str | None = None, data_dir: str | os.PathLike | None = None) -> Path:
    """Path of a shipped file: task 'P' or 'A' with a split, or 'M1' (the mate-in-one set)."""
    base = Path(data_dir or DATA_DIR)
    if task == "M1":
        return base / MATE_FILE
    if task not in TASK_FILES or split not in SPLITS:
        raise ValueError(f"task must be 'P', 'A' or 'M1' and split one of {SPLITS}, got {task!r}, {split!r}")
    return base / TASK_FILES[task].format(split=split)


def split_files(task: str, split: str | None = None, data_dir: str | os.PathLike | None = None) -> list[Path]:
    """Every file of one task and split (or of the mate-in-one set, task 'M1') in a directory: plain,
    gzip-compressed or sharded (checked_files); empty when there is none."""
    path = data_file(task, split, data_dir)
    return checked_files(path.name, path.parent)


def checked_files(name: str, data_dir: str | os.PathLike | None = None) -> list[Path]:
    """data_files_of(name), read by every reader of a data set: a gap in a shard numbering raises
    DataFormatError naming the missing file (reading around it would lose its records silently); two
    layouts of one split (plain and .gz, or a whole file and shards) raise too: both would be read."""
    base = Path(data_dir or DATA_DIR)
    if lost := missing_shards(name, base):
        raise DataFormatError(f"{lost[0]}: missing shard ({len(lost)} missing: shards are numbered from 00000 "
                              "without gaps); its records are lost: generate the data again")
    files = data_files_of(name, base)
    layouts = {("shards" if _SHARD_RE.search(f.name) else "whole", f.name.endswith(".gz")) for f in files}
    if len(layouts) > 1:
        raise DataFormatError(f"{base}: {', '.join(f.name for f in files)} hold the same split in "
                              f"{len(layouts)} layouts (plain and .gz, or a whole file and shards); each would be "
                              "read, every record twice: keep one layout")
    return files


def split_paths(split: str, data_dir: str | os.PathLike | None = None) -> tuple[str, ...]:
    """The P: then the A: files of a split (split_files), as SFT's train_data / val_data take them."""
    return tuple(str(f) for task in ("P", "A") for f in split_files(task, split, data_dir))


def not_a_folder(path) -> str:
    """Why `path` holds no data files though it was given as a data directory: " (no such directory)",
    " (a file, not a directory)", or "" where it is a directory (for messages)."""
    p = Path(path)
    return "" if p.is_dir() else " (a file, not a directory)" if p.exists() else " (no such directory)"


def looked_for(task: str, split: str | None = None) -> str:
    """The names a split's files may have, for messages: ``policy_test.jsonl[.gz] or policy_test-NNNNN.jsonl[.gz]``."""
    stem = data_file(task, split).stem
    return f"{stem}.jsonl[.gz] or {stem}-NNNNN.jsonl[.gz]"


def load_split(task: str, split: str, data_dir=None, *, on_error: str = "raise") -> LoadedData:
    """The records of one task ('P' or 'A') and split ('train', 'val', 'test'): its file, its .gz or
    its shards, in order. Every reader of a split goes through here (or load_mate_in_one)."""
    if task == "M1":  # one file of val and test records: its test records were blamed on the file
        raise ValueError("load_split reads 'P' and 'A' splits; the mate-in-one set is one file of val and test records: "
                         "load_mate_in_one(data_dir), then keep the records whose 'split' you want")
    return _load_all(task, split, data_dir, on_error)


def load_mate_in_one(data_dir=None, *, on_error: str = "raise") -> LoadedData:
    """The mate-in-one records (val and test)."""
    return _load_all("M1", None, data_dir, on_error)


def load_data_file(path: str | os.PathLike, task: str, split: str | None, *, on_error: str = "raise") -> LoadedData:
    """load_jsonl of one file of `task`'s `split` (None: the mate-in-one set's, any split): a record of
    another task or of another split is refused, naming the file."""
    part = load_jsonl(path, task=task, on_error=on_error)
    if split is not None and (other := next((r for r in part if r["split"] != split), None)):
        # a test record trained on, or a train record scored as held out
        raise DataFormatError(f"{path}: record {other['id']!r} is a {other['split']!r} record in the {split} split's "
                              f"file: a split's files hold its records alone (datagen writes them so; `rookworld "
                              f"convert --split {split}` for converted data)")
    return part


def role_of(path: str | os.PathLike) -> tuple[str, str | None] | None:
    """(task, split) of a data file by its name, as datagen names them (``policy_val.jsonl``,
    ``env_train-00003.jsonl.gz``; ``mate_in_one.jsonl``: ("M1", None)); None for another name."""
    name = Path(path).name
    for task, split in [(t, s) for t in TASK_FILES for s in SPLITS] + [("M1", None)]:
        stem = data_file(task, split).stem
        if name in (f"{stem}.jsonl", f"{stem}.jsonl.gz") or (name.startswith(stem) and _SHARD_RE.fullmatch(name[len(stem):])):
            return task, split
    return None


def _load_all(task: str, split: str | None, data_dir, on_error: str) -> LoadedData:
    """load_jsonl over every file of a split (split_files), as one LoadedData; none raises
    DataFormatError naming the directory and the names looked for."""
    files = split_files(task, split, data_dir)
    if not files:
        raise DataFormatError(f"{Path(data_dir or DATA_DIR)}: no {looked_for(task, split)} "
                              "(`rookworld datagen --out DIR` or `rookworld convert ... --out DIR` writes them)")
    parts = [load_data_file(f, task, split, on_error=on_error) for f in files]
    if len(parts) == 1:
        return parts[0]
    return LoadedData(str(files[0]), [r for part in parts for r in part], [e for part in parts for e in part.skipped])


def record_text(rec: dict, layout: str = "compact") -> tuple[str, str]:
    """(prompt, completion) of a P: or A: record in `layout`: the record's own texts for compact;
    for original, the fixed-width P: sample and A: texts whose FENs are spelled as python-chess's
    ``board.fen()`` (see tasks), as a pretrained RookWorld-LM reads and writes them."""
    tasks.check_layout(layout)  # any other name gave the original layout's texts
    if layout == "compact":
        return rec["prompt"], rec["completion"]
    if rec["task"] == "P":
        return tasks.policy_text(rec["fen"], rec["moves"], rec["evals"], rec["best"], layout)
    return (tasks.env_prompt(tasks.original_fen(rec["fen"]), rec["move"], rec["history"]),
            tasks.env_completion(tasks.original_fen(rec["new_fen"]), rec["reward"], rec["terminated"], rec["truncated"]))


# --- Audits (re-derive labels; used by the tests and notebook 00) ---

def audit_policy_labels(records: list[dict], *, workers: int | None = None, progress: bool = False) -> list[dict]:
    """Re-run Stockfish at each P: record's recorded limit and report every difference in the
    candidate moves or evals (an empty list: every label, B: included, is reproduced)."""
    problems = []
    groups: dict[tuple[str, int], list[dict]] = {}
    for rec in records:  # multipv is not stored: len(moves), or any value >= n_legal for a full list
        multipv = len(rec["moves"]) if len(rec["moves"]) < rec["n_legal"] else tasks.MAX_CANDIDATES
        groups.setdefault((rec["limit"], multipv), []).append(rec)
    for (limit, multipv), recs in groups.items():
        lim = parse_limit_key(limit)
        settings = EngineSettings(depth=lim.depth, nodes=lim.nodes, time=lim.time, multipv=multipv)
        with EnginePool(settings, size=workers, cache=False) as pool:
            version = pool.version
            analyses = pool.analyse_many([r["fen"] for r in recs], progress=progress, desc="audit")
        for rec, a in zip(recs, analyses):
            problems += _differences(rec, {"engine": version, "best": a.best, "moves": list(a.moves),
                                           "evals": [tasks.format_eval(e) for e in a.evals]})
    return problems


def audit_env_samples(records: list[dict]) -> list[dict]:
    """Replay every A: record with python-chess (`tasks.environment_step`, legality by
    `board.is_legal`) and report every field that differs."""
    problems = []
    for rec in records:
        tr = tasks.environment_step(rec["fen"], rec["move"], rec["history"][:-1])
        problems += _differences(rec, {
            "new_fen": tr.new_fen, "reward": tr.reward, "terminated": tr.terminated, "truncated": tr.truncated,
            "kind": tr.kind, "termination": tr.termination, "history": list(tr.history), "prompt": tr.prompt,
            "completion": tr.completion})
    return problems


def audit_mate_in_one(records: list[dict]) -> list[dict]:
    """Check that every M1 record lists exactly the moves that mate at once."""
    return [p for rec in records for p in _differences(rec, {"mating_moves": mating_moves(chess.Board(rec["fen"]))})]


def _differences(rec: dict, got: dict) -> list[dict]:
    """An audit's findings for one record: each field whose re-derived value differs."""
    return [{"id": rec["id"], "field": k, "expected": rec[k], "got": v} for k, v in got.items() if rec[k] != v]


# --- Summaries (the data card's numbers) ---

def summarize(data_dir=None) -> dict:
    """Counts per file, colour balance, features and terminations of a data directory, and the
    number of positions two splits share (``shared_positions``, 0 by construction)."""
    base = Path(data_dir or DATA_DIR)
    out: dict = {"files": {}}
    keys: dict[str, set] = {s: set() for s in SPLITS}
    for name in DATA_FILES:
        files = checked_files(name, base)  # the file, or its shards
        if not files:
            continue
        recs = [r for f in files for r in load_jsonl(f)]  # each holds at least one record
        task = recs[0]["task"]
        info = {"records": len(recs), "bytes": sum(f.stat().st_size for f in files),
                "white_to_move": sum(" w " in r["fen"] for r in recs),
                "black_to_move": sum(" b " in r["fen"] for r in recs),
                "games": len({r["game"] for r in recs}),
                "sources": dict(Counter(r["source"] for r in recs))}
        if task in ("P", "A"):
            for r in recs:
                keys[r["split"]].add(tasks.position_key(r["fen"]))
            info["tags"] = dict(Counter(t for r in recs for t in r["tags"]))
        if task == "A":
            info["kinds"] = dict(Counter(r["kind"] for r in recs))
            info["terminations"] = dict(Counter(r["termination"] for r in recs if r["termination"]))
        if task == "P":
            info["limit"] = sorted({r["limit"] for r in recs})
            info["engine"] = sorted({r["engine"] for r in recs})
        out["files"][name] = info
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
    def fmt(d):
        return ", ".join(f"{k} {v}" for k, v in sorted((d or {}).items())) or "-"

    for name, f in summary["files"].items():
        rows.append(f"| {name} | {fmt(f.get('sources'))} | {fmt(f.get('tags'))} | {fmt(f.get('kinds'))} "
                    f"| {fmt(f.get('terminations'))} |")
    if shared := summary.get("shared_positions"):  # the leak check: 0 by construction for datagen's own sets
        rows += ["", "| splits | positions in both |", "|---|---:|", *(f"| {k} | {v} |" for k, v in shared.items())]
    return "\n".join(rows)
