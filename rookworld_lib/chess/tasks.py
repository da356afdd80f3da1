"""Chess task formats: the policy task ``P:`` and the environment task ``A:``.

Policy, compact layout (the default)::

    P: <FEN> M: <m1 m2 m3 m4 m5> E: <e1 e2 e3 e4 e5> B: <best>

Up to five UCI candidates in Stockfish's multipv order, best first for the side to move, and their
evals (:func:`format_eval`); prompt = ``P: <FEN>``, completion = `` M: ... B: <best>`` (the trainer
appends EOT). The original RookWorld layout (what a pretrained RookWorld-LM reads and writes) pads
each field to a fixed width, shuffles the (move, eval) pairs and spells evals its own way::

    P: <FEN padded to 90>M: <moves padded to 30>E: <evals padded to 40>B: <best>

Its prompt keeps all but the last padding space: GPT-2's BPE attaches that space to the ``M``, so
cutting there keeps tokens(prompt) + tokens(completion) == tokens(text). The original generator's
``B:`` for black is the *worst* candidate (it reversed the list); :mod:`rookworld_lib.chess.convert`
keeps that label apart (``original_best``) and uses Stockfish's best.

Environment (the truth: :func:`environment_step`)::

    A: <FEN>+<uci>+<history>+<new FEN>+<reward>+<terminated>+<truncated>

FENs: the compact layout writes the standard FEN (:func:`canonical_fen`: an en-passant square after
every double push); the original writes ``A:`` FENs as python-chess's ``board.fen()``
(:func:`original_fen`: only when a capture is legal) and ``P:`` FENs as given. Parsers accept both,
and every comparison of positions uses :func:`same_position`.

Builders raise ``ValueError`` on bad arguments (caller bugs). Parsers accept *any* input and never
raise: their ``errors`` name everything wrong, and ``ok`` is True only for well-formed input.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
import random
import re
import reprlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import chess

from ..core import tokenizer

EOT = "<|endoftext|>"
POLICY_PREFIX = "P: "
ENV_PREFIX = "A: "
TASKS = ("P", "A")  # the two tasks' tags: a text "P: ..." is a policy sample or prompt, "A: ..." an environment one
MAX_CANDIDATES = 5
HISTORY_LEN = 10
LAYOUTS = ("compact", "original")
ORIGINAL_FEN_WIDTH = 90
ORIGINAL_MOVES_WIDTH = 30
ORIGINAL_EVALS_WIDTH = 40
# New-token budget of a completion (EOT included) by layout: the longest P:/A: completion of the
# shipped data, EOT included, is 73 tokens compact and 79 original (an A: one, a padded P: one): room
# to spare.
COMPLETION_BUDGET = {"compact": 96, "original": 128}

REWARD_LEGAL = 0.001
REWARD_WIN = 1.0
REWARD_DRAW = 0.5
REWARD_ILLEGAL = -1.0
ENV_REWARDS = (REWARD_LEGAL, REWARD_WIN, REWARD_DRAW, REWARD_ILLEGAL)
# (reward, terminated, truncated) of a move: legal and the game goes on, the mover wins, a draw,
# an illegal or unparseable move (environment_step gives no other)
ENV_OUTCOMES = ((REWARD_LEGAL, 0, 0), (REWARD_WIN, 1, 0), (REWARD_DRAW, 1, 0), (REWARD_ILLEGAL, 0, 1))

# Centipawn stand-in for a mate score: mate in n -> +-(MATE_CP - n). Larger than any Stockfish
# centipawn score (|cp| < 32000 * 100 / 208), so every mate ranks above every material eval.
MATE_CP = 100_000
MAX_PAWNS = 500.0  # |eval| <= 500 pawns (= MATE_CP // 2 centipawns)
ORIGINAL_MATE_PAWNS = 900.0  # original layout: |eval| >= 900 pawns spells a mate (MATE_CP - n) / 100
# Lichess's win-probability model: W(cp) = 1 / (1 + exp(-0.00368208 cp)).
WIN_PROB_SLOPE = 0.00368208

UCI_RE = re.compile(r"[a-h][1-8][a-h][1-8][qrbn]?")
# re.ASCII: digits 0-9 alone (\d and float() take any script's, so an answer in Arabic-Indic digits scored 1.0)
_PAWNS_RE = re.compile(r"[+-]?(?:\d{1,3}(?:\.\d{1,4})?|\.\d{1,4})", re.ASCII)
_MATE_RE = re.compile(r"([+-]?)[M#]([1-9]\d{0,2})", re.ASCII)


# --- Small helpers ---

def task_of(text: str) -> str | None:
    """The task of a sample or prompt text: "P", "A", or None when it is neither."""
    return tokenizer.task_of(text, TASKS)


def is_uci_syntax(text: str) -> bool:
    """True for a well-formed UCI move string (``e2e4``, ``e7e8q``); says nothing of legality."""
    return isinstance(text, str) and UCI_RE.fullmatch(text) is not None


def fen_error(fen: str) -> str | None:
    """Why `fen` is not a usable standard-chess position, or None when it is. Accepts both
    en-passant conventions; rejects non-canonical spellings such as ``44``."""
    if not isinstance(fen, str):
        return f"FEN must be a string, got {type(fen).__name__}"
    return _checked_board(fen)[1]


FEN_FIELDS = ("placement", "side to move", "castling rights", "en-passant square", "halfmove clock", "fullmove number")


def checked_board(fen: str) -> tuple[chess.Board | None, str | None]:
    """(board, None) for a usable FEN, else (None, why): one parse for both. Never raises.
    The board is the caller's own copy."""
    err = fen_error(fen)
    return (None, err) if err else (_checked_board(fen)[0].copy(stack=False), None)


@functools.lru_cache(maxsize=8192)
def _checked_board(fen: str) -> tuple[chess.Board | None, str | None]:
    # cached: callers must copy the board before changing it
    if not fen.strip():
        return None, "FEN is empty"
    if fen != fen.strip() or "  " in fen:
        return None, "FEN has stray whitespace"
    if len(fen.split(" ")) != 6:
        return None, f"FEN must have 6 space-separated fields, has {len(fen.split(' '))}"
    try:
        board = chess.Board(fen)
    except ValueError as exc:
        return None, f"FEN does not parse: {exc}"
    status = board.status()  # first: python-chess's fen() drops impossible castling rights, so the form would differ
    if status != chess.STATUS_VALID:
        return None, f"FEN is not a legal chess position ({status_words(status)})"
    if (canonical := board.fen(en_passant="fen")) != fen:
        differ = [f"{name} {ours!r} (python-chess writes {theirs!r})" for name, ours, theirs
                  in zip(FEN_FIELDS, fen.split(" "), canonical.split(" ")) if ours != theirs]
        return None, f"FEN is not in canonical form: {'; '.join(differ)}"
    return board, None


def _require_fen(fen: str, where: str) -> chess.Board:
    """The (cached, shared) board of a valid `fen`; ValueError naming `where` otherwise."""
    err = fen_error(fen)
    if err:
        raise ValueError(f"{where}: {err}: {fen!r}")
    return _checked_board(fen)[0]


def status_words(status: chess.Status) -> str:
    """python-chess's board status in words: "no white king, pawns on backrank"."""
    return ", ".join(s.name.lower().replace("_", " ") for s in chess.Status if s and s in status)


def legal_move(board: chess.Board, text: str) -> chess.Move | None:
    """The legal move spelled `text` in UCI, or None. Never raises. Legality is `board.is_legal`,
    never `board.push` (which accepts illegal moves); castling is the king's two-square move (e1g1), as
    UCI writes it outside Chess960: python-chess also takes king-takes-own-rook (e1h1) as legal, which
    would be a second spelling of one candidate."""
    if not is_uci_syntax(text):
        return None
    try:
        move = chess.Move.from_uci(text)
    except ValueError:  # e2e2: UCI's shape, but python-chess refuses a null move spelled so
        return None
    return move if board.is_legal(move) and board.uci(move) == text else None


def canonical_fen(board: chess.Board) -> str:
    """The standard FEN (en-passant square after every double push, as Stockfish writes it), not
    python-chess's default (only when a capture is possible)."""
    return board.fen(en_passant="fen")


def original_fen(fen: str) -> str:
    """`fen` as the original RookWorld data write it: python-chess's ``board.fen()`` (an en-passant
    square only when a legal capture exists). `fen` must be valid."""
    return _require_fen(fen, "original_fen").fen(en_passant="legal")


def fen_for_layout(fen: str, layout: str) -> str:
    """The FEN spelling a layout uses: as given for compact, :func:`original_fen` for original."""
    check_layout(layout)
    return fen if layout == "compact" else original_fen(fen)


@functools.lru_cache(maxsize=65536)
def normalized_fen(fen: str) -> str | None:
    """One spelling per position (python-chess's default FEN), or None for an invalid FEN: two FENs
    describe the same position exactly when these agree."""
    return None if fen_error(fen) else _checked_board(fen)[0].fen(en_passant="legal")


def same_position(a: str, b: str) -> bool:
    """True when FENs `a` and `b` are valid and describe the same position, whatever convention
    each uses for the en-passant square. Never raises."""
    na = normalized_fen(a)
    return na is not None and na == normalized_fen(b)


def position_key(fen: str) -> str:
    """The position a FEN describes, not its clocks, in one spelling whatever its en-passant
    convention (:func:`board_key`): FENs that :func:`same_position` equates share a key. An invalid
    FEN: its first four fields as written."""
    return " ".join(fen.split(" ")[:4]) if fen_error(fen) else board_key(_checked_board(fen)[0])


def board_key(board: chess.Board) -> str:
    """:func:`position_key` of a board: python-chess's EPD (placement, turn, castling, and the
    en-passant square only where a legal capture exists)."""
    return board.epd(en_passant="legal")


# --- Evaluations ---

@dataclass(frozen=True)
class Eval:
    """An evaluation from the side to move's point of view: centipawns or mate in n moves."""

    cp: int | None = None  # centipawns; None for a mate score
    mate: int | None = None  # moves to mate: > 0 the side to move mates, < 0 it is mated

    def __post_init__(self):
        if (self.cp is None) == (self.mate is None):
            raise ValueError(f"Eval needs exactly one of cp or mate, got cp={self.cp!r}, mate={self.mate!r}")
        if self.mate == 0:
            raise ValueError("Eval mate must be non-zero (a mated position has no candidate moves)")
        for name, v in (("cp", self.cp), ("mate", self.mate)):  # mate=True rendered "MTrue"; cp 12.7 two ways
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                raise ValueError(f"Eval {name} must be a whole number, got {v!r}")
        if self.cp is not None and abs(self.cp) > MATE_CP // 2:
            raise ValueError(f"Eval cp must be in [-{MATE_CP // 2}, {MATE_CP // 2}], got {self.cp}")

    @classmethod
    def from_score(cls, score) -> Eval:
        """From a python-chess `Score` already seen from the side to move (`PovScore.relative`)."""
        mate = score.mate()
        if mate is not None:  # "mate 0" (the side to move is mated) reads as mated in 1
            return cls(mate=mate or -1)
        return cls(cp=max(-MATE_CP // 2, min(MATE_CP // 2, int(score.score()))))

    def to_cp(self) -> int:
        """Centipawns with mates mapped to +-(MATE_CP - n): monotone in how good the position is."""
        return self.cp if self.mate is None else int(math.copysign(MATE_CP - abs(self.mate), self.mate))

    def __str__(self) -> str:
        return format_eval(self)


def win_prob(cp: float) -> float:
    """Lichess's logistic win-probability model in [0, 1] for a centipawn score."""
    x = max(-50.0, min(50.0, WIN_PROB_SLOPE * float(cp)))
    return 1.0 / (1.0 + math.exp(-x))


def format_eval(e: Eval, layout: str = "compact") -> str:
    """Compact: ``0.35``, ``-1.2``, ``0.0`` (pawns, at most 2 decimals), ``M3`` or ``-M2``.
    Original: Python's float text of ``score(mate_score=100000) / 100``, as the original generator
    wrote it: the same pawns, and mates as ``999.97`` (mate in 3) or ``-999.98`` (mated in 2)."""
    if not isinstance(e, Eval):  # a text failed as "'str' object has no attribute 'mate'"
        raise ValueError(f"format_eval takes an Eval (parse_eval reads one from text), got {type(e).__name__} {e!r:.40}")
    if layout != "compact":
        check_layout(layout)
        return str(e.to_cp() / 100)
    if e.mate is not None:
        return f"M{e.mate}" if e.mate > 0 else f"-M{-e.mate}"
    text = f"{e.cp / 100:.2f}".rstrip("0")  # cp is an int: never "-0.00"
    return text + "0" if text.endswith(".") else text


def parse_eval(text: str) -> Eval | None:
    """The Eval spelled by `text`, or None. Accepts both layouts' :func:`format_eval` forms (and
    ``#3``): pawns up to 500, mates as ``M3`` / ``-M2`` or as the original's ``+-9xx.xx``."""
    return _parse_eval(text) if isinstance(text, str) and len(text) <= 12 else None


@functools.lru_cache(maxsize=65536)
def _parse_eval(text: str) -> Eval | None:
    m = _MATE_RE.fullmatch(text)
    if m:
        n = int(m.group(2))
        return Eval(mate=-n if m.group(1) == "-" else n)
    if _PAWNS_RE.fullmatch(text):
        value = float(text)  # at most 3 digits and 4 decimals: always finite
        if abs(value) >= ORIGINAL_MATE_PAWNS:  # original spelling of a mate: +-(MATE_CP - n) / 100
            n = MATE_CP - int(round(abs(value) * 100))
            return Eval(mate=n if value > 0 else -n) if 1 <= n <= 999 else None
        if abs(value) > MAX_PAWNS:
            return None
        return Eval(cp=int(round(value * 100)))
    return None


def _as_eval(e: Eval | str) -> Eval:
    parsed = e if isinstance(e, Eval) else parse_eval(e)
    if parsed is None:
        raise ValueError(f"not an eval: {e!r}")
    return parsed


# --- Labels: one check for the data files' records and for the truth a reward is given ---

def policy_truth_error(board: chess.Board, moves, evals) -> str | None:
    """Why `moves` and `evals` cannot be the labelled candidates of `board`'s position, or None: they
    must be a list of 1..MAX_CANDIDATES distinct legal UCI moves and a list of as many evals, each an
    :class:`Eval` or its text (:func:`format_eval`)."""
    if not isinstance(moves, (list, tuple)) or not 1 <= len(moves) <= MAX_CANDIDATES:
        return f"field 'moves' must be a list of 1..{MAX_CANDIDATES} legal UCI moves, got {reprlib.repr(moves)}"
    for m in moves:
        if legal_move(board, m) is None:
            return f"move {reprlib.repr(m)} in 'moves' is not a legal UCI move in this position"
    if len(set(moves)) != len(moves):
        return f"field 'moves' repeats a move: {list(moves)}"
    if not isinstance(evals, (list, tuple)) or len(evals) != len(moves):
        return f"field 'evals' must be a list of {len(moves)} evals, one per move, got {reprlib.repr(evals)}"
    for e in evals:
        if not isinstance(e, Eval) and (parse_eval(e) is None or format_eval(parse_eval(e)) != e):
            return f"eval {reprlib.repr(e)} in 'evals' is not in the eval format (pawns like '0.35', mates like " \
                   "'M3' / '-M2')"
    return None


def env_truth_error(new_fen, reward, terminated, truncated) -> str | None:
    """Why these cannot be the label of an ``A:`` prompt, or None: a valid FEN, and (reward,
    terminated, truncated) one of :data:`ENV_OUTCOMES` (the flags 0/1, as the data write them, or bools)."""
    if err := fen_error(new_fen):
        return f"field 'new_fen': {err}: {reprlib.repr(new_fen)}"
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or reward not in ENV_REWARDS:
        return f"field 'reward' must be one of {ENV_REWARDS}, got {reprlib.repr(reward)}"
    for name, flag in (("terminated", terminated), ("truncated", truncated)):
        if not isinstance(flag, (int, float)) or flag not in (0, 1):
            return f"field {name!r} must be 0 or 1, got {reprlib.repr(flag)}"
    if (reward, terminated, truncated) not in ENV_OUTCOMES:
        return (f"reward/terminated/truncated {reward}/{terminated:g}/{truncated:g} is no outcome of a move: "
                "0.001/0/0 (legal, the game goes on), 1.0/1/0 (the mover wins), 0.5/1/0 (a draw), "
                "-1.0/0/1 (an illegal/unparseable move)")
    return None


# --- Policy task: builders ---

def policy_prompt(fen: str, layout: str = "compact", *, fen_width: int = ORIGINAL_FEN_WIDTH) -> str:
    """``P: <FEN>`` (compact) or the fixed-width original prompt: the FEN padded to `fen_width`
    (90; 89 in some original files), minus the last space (it belongs to `` M:``). The FEN is
    written as given: the original P: sets hold both en-passant conventions."""
    check_layout(layout)
    _require_fen(fen, "policy_prompt")
    if layout == "compact":
        return POLICY_PREFIX + fen
    return POLICY_PREFIX + _pad(fen, fen_width)[:-1]


def _pad(field: str, width: int) -> str:
    """The original layout's fixed-width field: left-justified, and at least one space after it."""
    return field.ljust(max(width, len(field) + 1))


def policy_completion(moves: Sequence[str], evals: Sequence[Eval | str], best: str,
                      layout: str = "compact", *, shuffle_seed: int | None = None, shuffle: bool = True) -> str:
    """`` M: ... E: ... B: <best>`` (no EOT). The original layout writes its own evals and shuffles
    the (move, eval) pairs with `shuffle_seed` (default: from the moves, so a sample always renders
    the same); ``shuffle=False`` keeps the given order (to write an original line back)."""
    check_layout(layout)
    moves, evals = list(moves), [_as_eval(e) for e in evals]
    if not 1 <= len(moves) <= MAX_CANDIDATES:
        raise ValueError(f"policy_completion: need 1..{MAX_CANDIDATES} moves, got {len(moves)}")
    if len(evals) != len(moves):
        raise ValueError(f"policy_completion: {len(moves)} moves but {len(evals)} evals")
    for m in [*moves, best]:
        if not is_uci_syntax(m):
            raise ValueError(f"policy_completion: {m!r} is not a UCI move")
    if len(set(moves)) != len(moves):
        raise ValueError(f"policy_completion: duplicate moves {moves}")
    if best not in moves:
        raise ValueError(f"policy_completion: best move {best!r} is not among the candidates {moves}")
    texts = [format_eval(e, layout) for e in evals]
    if layout == "compact":
        return f" M: {' '.join(moves)} E: {' '.join(texts)} B: {best}"
    pairs = list(zip(moves, texts))
    if shuffle:
        if shuffle_seed is None:
            shuffle_seed = int.from_bytes(hashlib.sha256(" ".join(moves).encode()).digest()[:8], "little")
        random.Random(shuffle_seed).shuffle(pairs)
    m_field, e_field = (" ".join(column) for column in zip(*pairs))
    return f" M: {_pad(m_field, ORIGINAL_MOVES_WIDTH)}E: {_pad(e_field, ORIGINAL_EVALS_WIDTH)}B: {best}"


def policy_text(fen: str, moves: Sequence[str], evals: Sequence[Eval | str], best: str,
                layout: str = "compact", *, shuffle_seed: int | None = None, shuffle: bool = True,
                fen_width: int = ORIGINAL_FEN_WIDTH) -> tuple[str, str]:
    """(prompt, completion) for one policy sample."""
    return (policy_prompt(fen, layout, fen_width=fen_width),
            policy_completion(moves, evals, best, layout, shuffle_seed=shuffle_seed, shuffle=shuffle))


def check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


# --- Policy task: parsers ---

@dataclass(frozen=True)
class _Parsed:
    """What every parse result shares: `ok` is True only for well-formed input (no `errors`)."""

    errors: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.errors


@dataclass(frozen=True)
class PolicyParse(_Parsed):
    """A policy prompt, completion or full sample as written: the FEN (prompts and samples), every
    token of ``M:``, one eval per token of ``E:`` (None where it does not parse), the ``B:`` token,
    and how many of the markers M:/E:/B: were found in order (`sections`)."""

    fen: str | None = None
    moves: tuple[str, ...] = ()
    evals: tuple[Eval | None, ...] = ()
    best: str | None = None
    layout: str = "unknown"  # compact | original | unknown
    sections: int = 0

    @property
    def eval_map(self) -> dict[str, Eval]:
        """move -> eval for the well-formed (move, eval) pairs; empty when the counts differ."""
        if len(self.moves) != len(self.evals):
            return {}
        return {m: e for m, e in zip(self.moves, self.evals) if e is not None and is_uci_syntax(m)}


_MARKERS = {marker: re.compile(rf"(?<!\S){marker}") for marker in ("M:", "E:", "B:")}  # after whitespace or at 0


def _parser(result, what: str, prefix: str | None = None):
    """Make a parser total: a non-string, a missing `prefix`, or a bug of the parser itself gives a
    `result` whose errors say so (parsers take any input and never raise)."""
    def wrap(parse):
        @functools.wraps(parse)
        def total(text):
            if not isinstance(text, str):
                return result(errors=(f"{what} must be a string, got {type(text).__name__}",))
            if prefix is not None and not text.startswith(prefix):
                return result(errors=(f"{what} does not start with {prefix!r}",))
            try:
                return parse(text)
            except Exception as exc:  # pragma: no cover - a safety net; tests assert it never fires
                return result(errors=(f"internal parser error: {type(exc).__name__}: {exc}",))
        return total
    return wrap


def _detect_layout(completion: str) -> str:
    if re.fullmatch(r" M: \S+(?: \S+)* E: \S+(?: \S+)* B: \S+", completion):
        return "compact"
    m = re.fullmatch(r" M: (.*?)E: (.*?)B: \S+", completion, flags=re.S)
    if m and len(m.group(1)) >= ORIGINAL_MOVES_WIDTH and len(m.group(2)) >= ORIGINAL_EVALS_WIDTH \
            and m.group(1).endswith(" ") and m.group(2).endswith(" "):
        return "original"
    return "unknown"


def _before_eot(text: str, errors: list[str]) -> str:
    """The text before one <|endoftext|> (an EOT ends a completion); text after it is an error."""
    text, _, after = text.partition(EOT)
    if after.strip():
        errors.append("text after <|endoftext|>")
    return text


def _sections(text: str, errors: list[str]) -> dict[str, str]:
    """marker -> body for the markers M:, E:, B: found in that order. A missing marker, and text
    before the first one, are reported in `errors`; the rest is still parsed."""
    starts, pos = {}, 0
    for marker, pattern in _MARKERS.items():
        found = pattern.search(text, pos)
        if found is None:
            errors.append(f"missing {marker}")
            continue
        starts[marker], pos = found.start(), found.end()
    if starts:
        first, head = next(iter(starts)), text[: min(starts.values())].strip()
        if head:
            errors.append(f"unexpected text before {first} {head[:20]!r}")
    ends = [*list(starts.values())[1:], len(text)]
    return {m: text[i + len(m): end] for (m, i), end in zip(starts.items(), ends)}


def candidates_wanted(board: chess.Board, truth_moves=()) -> int:
    """How many candidates a P: answer lists: as many as the data give (the truth's candidates: a label
    made with fewer principal variations lists fewer), else MAX_CANDIDATES or every legal move when
    there are fewer."""
    return len(truth_moves) or min(MAX_CANDIDATES, board.legal_moves.count())


def valid_policy_answer(board: chess.Board, parse: PolicyParse, truth_moves=()) -> bool:
    """A format-valid P: answer (the strict `policy/valid` metric): the strict parser finds no error,
    and its candidates are legal moves, as many as the data give (candidates_wanted), each with its
    eval, B: among them."""
    return parse.ok and all(legal_move(board, m) is not None for m in parse.moves) and \
        len(parse.moves) == candidates_wanted(board, truth_moves)


@_parser(PolicyParse, "completion")
def parse_policy_completion(completion: str) -> PolicyParse:
    """Parse `` M: ... E: ... B: <move>`` (either layout; one trailing EOT allowed). Never raises."""
    errors: list[str] = []
    text = _before_eot(completion, errors)
    bodies = _sections(text, errors)
    if not bodies:
        return PolicyParse(errors=tuple(errors))
    moves: tuple[str, ...] = ()
    if "M:" in bodies:
        moves = tuple(bodies["M:"].split())
        if not moves:
            errors.append("M: is empty")
        elif len(moves) > MAX_CANDIDATES:
            errors.append(f"M: has {len(moves)} moves, at most {MAX_CANDIDATES} allowed")
        bad = [m for m in moves if not is_uci_syntax(m)]
        if bad:
            errors.append(f"M: not UCI: {' '.join(b[:12] for b in bad[:3])}")
        if len(set(moves)) != len(moves):
            errors.append("M: repeats a move")
    evals: tuple[Eval | None, ...] = ()
    if "E:" in bodies:
        tokens = bodies["E:"].split()
        evals = tuple(parse_eval(t) for t in tokens)
        if not tokens:
            errors.append("E: is empty")
        bad = [t for t, e in zip(tokens, evals) if e is None]
        if bad:
            errors.append(f"E: not an eval: {' '.join(b[:12] for b in bad[:3])}")
        if "M:" in bodies and len(tokens) != len(moves):
            errors.append(f"E: has {len(tokens)} evals for {len(moves)} moves")
    best = None
    if "B:" in bodies:
        tokens = bodies["B:"].split()
        if not tokens:
            errors.append("B: is empty")
        else:
            best = tokens[0]
            if len(tokens) > 1:
                errors.append("unexpected text after B: move")
            if not is_uci_syntax(best):
                errors.append(f"B: not UCI: {best[:12]!r}")
            elif moves and best not in moves:
                errors.append("B: move is not among the M: candidates")
    layout = _detect_layout(text) if not errors else "unknown"
    return PolicyParse(moves=moves, evals=evals, best=best, layout=layout, sections=len(bodies),
                       errors=tuple(errors))


def read_policy_fields(completion: str, strict: PolicyParse | None = None) -> PolicyParse:
    """The M:/E:/B: fields of any text, as far as they can be read (for graded rewards of malformed
    answers): each marker's first occurrence, in any order, read up to the next marker, in the text
    before one EOT. `sections` counts the markers found; `errors` are those of the strict parse
    (`strict`: :func:`parse_policy_completion` of the same text, when the caller has it). A
    format-valid completion reads as the strict parser reads it. Never raises."""
    strict = parse_policy_completion(completion) if strict is None else strict
    if not isinstance(completion, str):
        return strict
    text = completion.partition(EOT)[0]
    starts = sorted(m.start() for p in _MARKERS.values() for m in p.finditer(text))
    bodies = {}
    for marker, pattern in _MARKERS.items():
        found = pattern.search(text)
        if found is not None:
            end = next((s for s in starts if s > found.start()), len(text))
            bodies[marker] = text[found.end(): end].split()
    return PolicyParse(moves=tuple(bodies.get("M:", ())), evals=tuple(map(parse_eval, bodies.get("E:", ()))),
                       best=(bodies.get("B:") or [None])[0], sections=len(bodies), errors=strict.errors)


@_parser(PolicyParse, "prompt", POLICY_PREFIX)
def parse_policy_prompt(prompt: str) -> PolicyParse:
    """Parse ``P: <FEN>`` in either layout (the original pads the FEN with spaces). Never raises."""
    body = prompt[len(POLICY_PREFIX):]
    fen = body.rstrip(" ")
    err = fen_error(fen)
    return PolicyParse(fen=fen, layout="compact" if fen == body else "original", errors=(err,) if err else ())


def split_policy_text(text: str) -> tuple[str, str] | None:
    """Cut a full policy sample into (prompt, completion) at the space before ``M:``; None if absent."""
    if not isinstance(text, str) or not text.startswith(POLICY_PREFIX):
        return None
    found = _MARKERS["M:"].search(text, len(POLICY_PREFIX))
    if found is None or found.start() == len(POLICY_PREFIX):  # no M:, or no FEN before it
        return None
    return text[: found.start() - 1], text[found.start() - 1:]


@_parser(PolicyParse, "sample")
def parse_policy(text: str) -> PolicyParse:
    """Parse a full policy sample (prompt + completion). Never raises."""
    parts = split_policy_text(text)
    if parts is None:
        return PolicyParse(errors=("not a policy sample: expected 'P: <FEN> M: ...'",))
    pp, cp = parse_policy_prompt(parts[0]), parse_policy_completion(parts[1])
    errors = tuple(f"prompt: {e}" for e in pp.errors) + cp.errors
    layout = cp.layout if pp.layout == cp.layout else "unknown"
    return dataclasses.replace(cp, fen=pp.fen, layout=layout, errors=errors)


# --- Environment task ---

def format_reward(reward: float) -> str:
    """``0.001``, ``1.0``, ``0.5``, ``-1.0`` (the four environment rewards); others as ``%g``."""
    return str(float(reward)) if reward in ENV_REWARDS else f"{reward:g}"


def _check_env_move_text(text: str, what: str) -> None:
    if not isinstance(text, str) or not text or "+" in text or any(c.isspace() for c in text):
        raise ValueError(f"{what} must be a non-empty string without '+' or whitespace, got {text!r}")


def env_prompt(fen: str, move: str, history: Sequence[str]) -> str:
    """``A: <FEN>+<move>+<history>+``; `history` is the full field, ending with `move`."""
    _require_fen(fen, "env_prompt")
    _check_env_move_text(move, "env_prompt: move")
    history = list(history)
    if not history or history[-1] != move:
        raise ValueError(f"env_prompt: history must end with the current move {move!r}, got {history}")
    if len(history) > HISTORY_LEN:
        raise ValueError(f"env_prompt: history has {len(history)} moves, at most {HISTORY_LEN}")
    for h in history:
        _check_env_move_text(h, "env_prompt: history entry")
    return f"{ENV_PREFIX}{fen}+{move}+{' '.join(history)}+"


def env_completion(new_fen: str, reward: float, terminated: int | bool, truncated: int | bool) -> str:
    """``<new FEN>+<reward>+<terminated>+<truncated>`` (no EOT)."""
    _require_fen(new_fen, "env_completion")
    if reward not in ENV_REWARDS:
        raise ValueError(f"env_completion: reward must be one of {ENV_REWARDS}, got {reward!r}")
    for name, flag in (("terminated", terminated), ("truncated", truncated)):  # "0" was written as 1
        if flag not in (0, 1) or isinstance(flag, str):
            raise ValueError(f"env_completion: {name} must be 0 or 1 (or a bool), got {flag!r}")
    return f"{new_fen}+{format_reward(reward)}+{int(bool(terminated))}+{int(bool(truncated))}"


@dataclass(frozen=True)
class EnvTransition:
    """One environment step, as python-chess computes it: the ground truth of an ``A:`` sample."""

    fen: str
    move: str
    history: tuple[str, ...]
    new_fen: str
    reward: float
    terminated: int
    truncated: int
    kind: str  # legal | illegal | unparseable
    termination: str | None = None  # checkmate | stalemate | insufficient_material | seventyfive_moves

    @property
    def prompt(self) -> str:
        return env_prompt(self.fen, self.move, self.history)

    @property
    def completion(self) -> str:
        return env_completion(self.new_fen, self.reward, self.terminated, self.truncated)


def environment_step(fen: str, move: str, previous_moves: Iterable[str] = ()) -> EnvTransition:
    """The reference transition: `move` (UCI text) applied to `fen` with a real legality check. A
    wrong move is a transition too; ValueError only for a bad `fen` or a `move` the format cannot
    hold (empty, '+' or whitespace)."""
    board = _require_fen(fen, "environment_step").copy(stack=False)  # a copy costs less than a parse
    _check_env_move_text(move, "environment_step: move")
    if isinstance(previous_moves, str):  # its characters became the history
        raise ValueError(f"environment_step: previous_moves is a sequence of UCI moves, got one string {previous_moves!r}: "
                         "give previous_moves.split()")
    history = (*previous_moves, move)[-HISTORY_LEN:]  # the history field ends with the current move
    legal = legal_move(board, move)
    if legal is None:
        kind = "illegal" if is_uci_syntax(move) else "unparseable"
        return EnvTransition(fen, move, history, fen, REWARD_ILLEGAL, 0, 1, kind)
    board.push(legal)
    # the position alone decides the outcome: ten moves of history cannot prove a repetition
    return legal_transition(fen, move, previous_moves, canonical_fen(board), board.outcome(claim_draw=False))


def transition_differences(ref: EnvTransition, **label) -> list[str]:
    """The fields of a labelled transition (`label`: any of new_fen, reward, terminated, truncated,
    termination) that differ from the reference `ref` (environment_step's); the next position is
    compared as a position (same_position), whatever its en-passant spelling."""
    return [k for k, v in label.items() if not (same_position(v, ref.new_fen) if k == "new_fen" else v == getattr(ref, k))]


def legal_transition(fen: str, move: str, previous_moves: Iterable[str], new_fen: str,
                     outcome: chess.Outcome | None) -> EnvTransition:
    """The transition of a legal `move` from `fen`, given the position it reaches and that position's
    outcome (``board.outcome(claim_draw=False)``): for a caller that has the board after the move."""
    history = (*previous_moves, move)[-HISTORY_LEN:]
    if outcome is None:
        return EnvTransition(fen, move, history, new_fen, REWARD_LEGAL, 0, 0, "legal")
    reward = REWARD_WIN if outcome.winner is not None else REWARD_DRAW
    return EnvTransition(fen, move, history, new_fen, reward, 1, 0, "legal", outcome.termination.name.lower())


@dataclass(frozen=True)
class EnvParse(_Parsed):
    """A parsed environment prompt (its fen, move, history) or completion (the other fields). Fields
    are None where they are missing or malformed; `new_fen` is the text as written (`fen_valid`
    says whether it is a valid FEN)."""

    fen: str | None = None
    move: str | None = None
    history: tuple[str, ...] = ()
    new_fen: str | None = None
    reward: float | None = None
    terminated: int | None = None
    truncated: int | None = None
    fields: int = 0  # how many '+'-separated fields the completion had
    fen_valid: bool = False


@_parser(EnvParse, "prompt", ENV_PREFIX)
def parse_env_prompt(prompt: str) -> EnvParse:
    """Parse an environment prompt. Never raises."""
    parts = prompt[len(ENV_PREFIX):].split("+")
    if len(parts) != 4 or parts[3] != "":
        return EnvParse(errors=("prompt must be 'A: <FEN>+<move>+<history>+'",))
    fen, move, hist = parts[:3]
    err = fen_error(fen)
    history = tuple(hist.split(" ")) if hist else ()
    errors = tuple(why for wrong, why in (
        (err is not None, err),
        (not move or any(c.isspace() for c in move), "move field is empty or has whitespace"),
        (not history or history[-1] != move, "history does not end with the current move"),
        (len(history) > HISTORY_LEN, f"history has {len(history)} moves, at most {HISTORY_LEN}"),
        (hist != hist.strip() or "  " in hist, "history has stray whitespace"),
    ) if wrong)
    return EnvParse(fen=fen if not err else None, move=move, history=history, errors=errors)


_FLOAT_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)  # as _PAWNS_RE


@_parser(EnvParse, "completion")
def parse_env_completion(completion: str) -> EnvParse:
    """Parse ``<new FEN>+<reward>+<terminated>+<truncated>`` (a trailing ``+`` and one EOT are
    allowed, as in the original RookWorld data). Never raises."""
    errors: list[str] = []
    text = _before_eot(completion, errors)
    if text.endswith("+"):
        text = text[:-1]
    parts = text.split("+")
    if len(parts) != 4:
        errors.append(f"expected 4 '+'-separated fields, found {len(parts)}")
    new_fen = parts[0] or None
    fen_err = fen_error(new_fen) if new_fen else None
    if new_fen is None or fen_err:
        errors.append(f"new FEN: {fen_err}" if new_fen else "new FEN is empty")
    reward = None
    if len(parts) > 1:
        if _FLOAT_RE.fullmatch(parts[1]) and len(parts[1]) <= 16 and math.isfinite(float(parts[1])):
            reward = float(parts[1])
        else:
            errors.append(f"reward is not a number: {parts[1][:16]!r}")
    flags = {}
    for k, name in ((2, "terminated"), (3, "truncated")):
        field = parts[k] if len(parts) > k else None
        flags[name] = int(field) if field in ("0", "1") else None
        if field is not None and flags[name] is None:
            errors.append(f"{name} is not 0/1: {field[:16]!r}")
    return EnvParse(new_fen=new_fen, reward=reward, fields=len(parts), fen_valid=new_fen is not None and not fen_err,
                    errors=tuple(errors), **flags)

