"""Verifiable rewards for the policy task ``P:`` and the environment task ``A:``.

``score_policy`` / ``score_environment`` return a float in ``[-1, 1]`` for (prompt, completion); the
``*_detailed`` variants return every component; ``trl_*`` wrap them for TRL. Nothing about the text
raises. The set-up does, since a reward without ground truth, or a crash scored as a bad answer, is
worse than a stop: TruthError (a truth that fails the record check, or for another position),
MissingTruthError (no truth, engine=None), StockfishNotFoundError (no truth, no Stockfish),
EngineFailedError (every retry failed), EngineArgumentError (an ``engine=`` that is no pool).

Ground truth: ``truth=`` (a ``data/*.jsonl`` record, a :class:`PolicyTruth` / :class:`EnvTruth`, an
``engine.Analysis``), else one from :func:`register_truth`, else live Stockfish for ``P:`` (multipv 5,
depth 8 like the shipped data) and a python-chess replay of the prompt for ``A:``. A given or
registered truth is checked as the data files' records are (:func:`policy_truth`, :func:`env_truth`),
once per distinct truth.

Policy: -1.0 for garbage (no ``M:``/``E:``/``B:``, or not ``P: <valid FEN>``); -0.5 + 0.25 * format
when ``B:`` is missing or illegal; else the weighted sum in [0, 1] (:class:`PolicyWeights`) of
    - ``best_quality``: :func:`quality_from_cp` of B:'s centipawn loss against the engine's best
      (mates count +-(100000 - n)). A legal move outside the candidates is searched alone, capped at
      the last candidate's eval; offline it is that eval minus ``unlisted_margin_cp`` (``estimated``);
    - ``format``: fraction of five checks (the fields in order; 1-5 distinct UCI moves; as many
      evals; ``B:`` among the moves; no other text);
    - ``moves_legal``: fraction of ``M:`` entries legal and distinct;
    - ``moves_overlap``: |M ∩ truth candidates| / |truth candidates|;
    - ``evals_accuracy``: mean 1 - |W(predicted) - W(true)| over listed moves the truth lists too
      (W the logistic win probability; 0 when there is none).
With ``PolicyWeights.format_gate`` (the default), a malformed completion (the strict parser reports an
error in its shape; unlike the strict ``policy/valid`` metric the gate does not ask for legal candidates,
nor for as many as the data give) is then mapped affinely into [-0.95, -0.55], below every well-formed
one, so the reward ranks well-formed with a legal ``B:`` ([0, 1]) above well-formed with an illegal
``B:`` (-0.25) above malformed above garbage (-1.0). A well-formed answer with some illegal or too few
candidates is not gated: its ``moves_legal`` and ``moves_overlap`` fall instead.
Without the gate a malformed answer that names the best move (five copies of it in ``M:``, the
typical greedy failure of a small SFT model) scored 0.78, above a well-formed answer with a worse
legal move, and GRPO had nothing to gain from valid text.

Graded policy reward (:class:`GradedWeights` as the weights; issue 26): seven components in [0, 1],
each computed on its own in every answer whose prompt parses, malformed or not (no gate), from the
fields read leniently (:func:`tasks.read_policy_fields`): ``best_legal`` (B: a legal move),
``best_quality`` (as above; 0 unless B: is legal), ``moves_legal`` (fraction of the M: entries that are
legal), ``moves_distinct`` (distinct legal M: moves / the candidates the data give, capped at 1: the greedy loop
``M: d2d4 d2d4 ...`` earns 1/5), ``evals_accuracy`` (as above, the (move, eval) pairs read by position)
``format`` (as above) and ``valid`` (1 when the answer is format-valid as the strict ``policy/valid``
metric counts it; weight 0 by default). The total is their weighted sum in [0, 1]; garbage (no M:/E:/B: marker, or a
prompt that is not ``P: <valid FEN>``) scores 0.0, the floor, with every component 0. Each component
raises the total in every band; :func:`policy_component_rewards` gives them one reward function each.

Environment: -1.0 when no field is well-formed; else the weighted sum (:class:`EnvWeights`) of
``format``, ``fen_exact`` (:func:`tasks.same_position`), ``fen_fields`` (:func:`fen_field_credit`: a
FEN of another position always scores less) and ``reward`` / ``terminated`` / ``truncated`` right.

Rewards are deterministic and memoised (LRU keyed by prompt, completion, truth, weights):
:func:`cache_info`, :func:`clear_cache`.
"""
from __future__ import annotations

import functools
import logging
import math
import reprlib
import threading
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields

import chess
import numpy as np

from . import tasks
from .engine import (SHARED_CACHE, Analysis, EngineFailedError, StockfishNotFoundError, find_stockfish, get_pool,
                     parse_limit_key, stockfish_available)
from .tasks import Eval
from ..core.config import option, validate

weight = functools.partial(option, min=0.0)  # a reward component's weight: an option, never negative

log = logging.getLogger(__name__)


class TruthError(ValueError):
    """The ground truth handed to a scorer cannot be used: of the wrong kind, or another position."""


class MissingTruthError(TruthError):
    """A policy reward was asked for a position with no ground truth while the engine was disabled."""


# errors of the set-up, not of the text: they pass the scorers' safety net (see the module docstring)
class EngineArgumentError(ValueError):
    """engine= is none of 'auto', None/False or an engine pool: no completion makes it right, so it is raised."""


SETUP_ERRORS = (TruthError, StockfishNotFoundError, EngineFailedError, EngineArgumentError)
POLICY_RANGE = (-1.0, 1.0)
GARBAGE = -1.0
ILLEGAL_BASE = -0.5
ILLEGAL_FORMAT_WEIGHT = 0.25
MALFORMED_RANGE = (-0.95, -0.55)  # gated malformed policy answers: above garbage, below valid-illegal (-0.25)
CP_LOSS_CAP = 1000
GRADED_RANGE = (0.0, 1.0)  # the graded policy reward; garbage scores the floor


# --- Weights ---

class _Weights:
    """Checked at construction: each field (`option`), then the sum, 1 so that legal answers score in [0, 1]."""

    _SETTINGS = ("unlisted_margin_cp", "format_gate")  # fields that are not weights

    def __post_init__(self):
        validate(self)
        total = math.fsum(getattr(self, f.name) for f in fields(self) if f.name not in self._SETTINGS)
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"{type(self).__name__}: weights must sum to 1 (so legal answers score in [0, 1]), "
                             f"got {total}")


def _unlisted_margin():  # the setting both policy weightings share
    return option(50, "offline estimate: a legal move outside the candidates = last eval minus this", min=0, max=10_000)


@dataclass(frozen=True)
class PolicyWeights(_Weights):
    """Weights of the policy components for a legal ``B:`` (they sum to 1)."""

    best_quality: float = weight(0.5, "quality of B: by centipawn loss against the engine's best")
    format: float = weight(0.1, "structure of the completion")
    moves_legal: float = weight(0.1, "legal, distinct M: candidates")
    moves_overlap: float = weight(0.15, "overlap of M: with the engine's top candidates")
    evals_accuracy: float = weight(0.15, "accuracy of the E: evals of the candidates the engine also lists")
    unlisted_margin_cp: int = _unlisted_margin()
    format_gate: bool = option(True, "score every malformed answer (the strict parser finds an error in its shape; "
                               "legality is not asked) in [-0.95, -0.55], below every well-formed one (the "
                               "ranking well-formed with a legal B: > with an illegal B: > malformed)")


@dataclass(frozen=True)
class GradedWeights(_Weights):
    """Weights of the graded policy reward's components (they sum to 1): legal, good B: (0.4) and a
    valid answer of distinct candidates (0.4) first, the two headline metrics; the rest support them."""

    best_legal: float = weight(0.2, "B: is a legal move")
    best_quality: float = weight(0.2, "quality of B: by centipawn loss against the engine's best (0 unless legal)")
    moves_legal: float = weight(0.1, "fraction of the M: entries that are legal moves")
    moves_distinct: float = weight(0.25, "distinct legal M: moves / the candidates the data give (tasks.candidates_wanted), at most 1")
    evals_accuracy: float = weight(0.1, "accuracy of the E: evals of the legal M: moves the engine also lists")
    format: float = weight(0.15, "structure of the completion (the five checks of the strict parser)")
    valid: float = weight(0.0, "the answer is format-valid as the strict policy/valid metric counts it "
                          "(tasks.valid_policy_answer: no parser error, legal candidates, as many as the data give)")
    unlisted_margin_cp: int = _unlisted_margin()


GRADED_COMPONENTS = ("best_legal", "best_quality", "moves_legal", "moves_distinct", "evals_accuracy", "format", "valid")


@dataclass(frozen=True)
class EnvWeights(_Weights):
    """Weights of the environment components (they sum to 1). A wrong next position still earns
    fen_fields times fen_field_credit: squares of the placement, then each other FEN field right."""

    format: float = weight(0.1, "four well-formed '+'-separated fields")
    fen_valid: float = weight(0.0, "the next FEN is a valid position (the strict env/valid metric's main check; "
                              "GRADED_ENV_WEIGHTS gives it weight)")
    fen_exact: float = weight(0.3, "next FEN exactly right")
    fen_fields: float = weight(0.3, "partial credit per FEN field")
    reward: float = weight(0.1, "reward value right")
    terminated: float = weight(0.1, "terminated flag right")
    truncated: float = weight(0.1, "truncated flag right")


DEFAULT_POLICY_WEIGHTS = PolicyWeights()
DEFAULT_ENV_WEIGHTS = EnvWeights()
DEFAULT_GRADED_WEIGHTS = GradedWeights()
# the graded reward's environment weights: a valid next FEN counts on its own (in the default it is one
# fifth of `format`, 0.02, and GRPO traded it for partial placement credit: env/valid fell 62% -> 45%)
GRADED_ENV_WEIGHTS = EnvWeights(format=0.1, fen_valid=0.25, fen_exact=0.25, fen_fields=0.2, reward=0.1,
                                terminated=0.05, truncated=0.05)


# --- Truth ---

PolicyTruth = Analysis  # engine candidates for a position: moves best first, their evals, the search's limit key


@dataclass(frozen=True)
class EnvTruth:
    """The correct environment completion for a prompt."""

    new_fen: str
    reward: float
    terminated: int
    truncated: int


POLICY_TRUTH_COLUMNS = ("fen", "moves", "evals")  # plus the optional "limit" (default DEFAULT_LIMIT)
ENV_TRUTH_COLUMNS = ("new_fen", "reward", "terminated", "truncated")
DEFAULT_LIMIT = "depth=8"  # the shipped data's search limit


def _getter(obj):
    return obj.get if isinstance(obj, Mapping) else (lambda k, d=None: getattr(obj, k, d))


def policy_truth(obj) -> PolicyTruth:
    """The PolicyTruth of a P: record (dict or dataclass), of one row of TRL's columns, or of a
    PolicyTruth (an engine.Analysis), checked as the data files' records are
    (:func:`tasks.policy_truth_error`); else TruthError, naming the field, its value and what is allowed.
    The limit is a label (converted original data say 'unknown'); one that is not a limit key, or one
    past engine.LIMIT_RANGES, leaves a search of an unlisted move to the engine's own limit."""
    return _checked_truth(_policy_truth, obj, (*POLICY_TRUTH_COLUMNS, "limit"))


def env_truth(obj) -> EnvTruth:
    """The EnvTruth of an A: record (dict or dataclass), of one row of TRL's columns, of a
    tasks.EnvTransition or of an EnvTruth, checked as the data files' records are
    (:func:`tasks.env_truth_error`); else TruthError, naming the field, its value and what is allowed."""
    return _checked_truth(_env_truth, obj, ENV_TRUTH_COLUMNS)


def _checked_truth(build, obj, names: tuple[str, ...]):
    """build(*the named fields of obj), memoised per distinct truth: GRPO scores each record's
    completions many times and checks its truth once."""
    get = _getter(obj)
    key = tuple(_field(get(name)) for name in names)
    try:
        hash(key)
    except TypeError:  # a field of an odd type (a dict, nested lists): checked uncached, which rejects it
        return build.__wrapped__(*key)
    return build(*key)


def _field(value):
    """A truth field as a hashable Python value: lists and numpy arrays (what `datasets` hands TRL)
    as tuples, numpy scalars as Python's."""
    if isinstance(value, np.floating):  # the shortest decimal: np.float32(0.001) is 0.001, not 0.0010000000474...
        return float(str(value))
    if isinstance(value, (np.ndarray, np.generic)):
        value = value.tolist()
    return tuple(value) if isinstance(value, list) else value


@functools.lru_cache(maxsize=65_536)
def _policy_truth(fen, moves, evals, limit) -> PolicyTruth:
    board, err = tasks.checked_board(fen)
    err = f"field 'fen': {err}: {reprlib.repr(fen)}" if err else tasks.policy_truth_error(board, moves, evals)
    if err is None and not isinstance(limit, (str, type(None))):
        err = f"field 'limit' must be a string such as 'depth=8' (or absent), got {reprlib.repr(limit)}"
    if err:
        raise TruthError(f"unusable policy truth: {err}")
    evals = tuple(e if isinstance(e, Eval) else tasks.parse_eval(e) for e in evals)
    return PolicyTruth(fen, moves, evals, limit or DEFAULT_LIMIT)


@functools.lru_cache(maxsize=65_536)
def _env_truth(new_fen, reward, terminated, truncated) -> EnvTruth:
    if err := tasks.env_truth_error(new_fen, reward, terminated, truncated):
        raise TruthError(f"unusable environment truth: {err}")
    return EnvTruth(new_fen, float(reward), int(terminated), int(truncated))


_REGISTRY_LOCK = threading.Lock()
_POLICY_TRUTH: dict[str, PolicyTruth] = {}
_ENV_TRUTH: dict[str, EnvTruth] = {}
_REGISTRY_VERSION = [0]  # part of the reward cache keys: registering truth invalidates old results


def register_truth(records: Iterable) -> int:
    """Remember ground truth from data-set records (P: by position, A: by prompt) so that
    score_policy / score_environment use it without a `truth=` argument. Returns how many."""
    n = 0
    with _REGISTRY_LOCK:
        for i, rec in enumerate(records):
            get = _getter(rec)
            try:
                if get("task") == "P":
                    t = policy_truth(rec)
                    _POLICY_TRUTH[tasks.position_key(t.fen)] = t
                elif get("task") == "A":
                    key = get("prompt") or tasks.env_prompt(get("fen"), get("move"), get("history"))
                    _ENV_TRUTH[key] = env_truth(rec)
            except TruthError as exc:
                raise TruthError(f"record {i} (id {get('id')!r}): {exc}") from None
            n += get("task") in ("P", "A")
        _REGISTRY_VERSION[0] += 1
    return n


def clear_truth() -> None:
    """Forget every registered truth."""
    with _REGISTRY_LOCK:
        _POLICY_TRUTH.clear()
        _ENV_TRUTH.clear()
        _REGISTRY_VERSION[0] += 1


# --- Results and components ---

@dataclass(frozen=True)
class _Score:
    total: float  # the reward
    format: float = 0.0  # structure of the completion, in [0, 1]
    truth_source: str = "none"  # given | registered | engine (P:) | replay (A:) | none
    errors: tuple[str, ...] = ()  # what the parser found wrong

    def as_dict(self) -> dict:
        """Every component by name (for tables and logs)."""
        return asdict(self)


@dataclass(frozen=True)
class _MoveScore(_Score):
    """The components both policy rewards measure on B: and M: (see the module docstring)."""

    # B: first, then M: and E:
    best_legal: float = 0.0
    cp_loss: float | None = None  # centipawn loss of B: (None when B: is not a legal move)
    best_quality: float = 0.0
    best_rank: int | None = None  # 1-based rank of B: among the truth's candidates, None if unlisted
    estimated: bool = False  # B:'s eval was estimated (no engine for a move outside the candidates)
    moves_legal: float = 0.0
    evals_accuracy: float = 0.0


@dataclass(frozen=True)
class PolicyScore(_MoveScore):
    """Every component of a policy reward: the shared ones and the overlap with the truth's candidates."""

    moves_overlap: float = 0.0


@dataclass(frozen=True)
class GradedScore(_MoveScore):
    """Every component of the graded policy reward: the shared ones, distinct candidates and validity."""

    moves_distinct: float = 0.0
    valid: float = 0.0


@dataclass(frozen=True)
class EnvScore(_Score):
    """Every component of an environment reward (see the module docstring)."""

    fen_valid: float = 0.0
    fen_exact: float = 0.0
    fen_fields: float = 0.0
    reward: float = 0.0
    terminated: float = 0.0
    truncated: float = 0.0


def move_accuracy(win_drop: float) -> float:
    """Lichess's move accuracy in [0, 1] for a drop in win probability (0..1) caused by a move."""
    raw = 1.031668 * math.exp(-4.354 * max(0.0, win_drop)) - 0.031669
    return min(1.0, max(0.0, raw / (1.031668 - 0.031669)))  # normalised: exactly 1 for no drop


def quality_from_cp(best_cp: int, move_cp: int) -> float:
    """B: quality in [0, 1]: 0.9 * Lichess move accuracy of the win-probability drop, plus
    0.1 * (1 - min(cp_loss, 1000) / 1000), which still separates moves whose win probabilities are
    equal in floating point (mate in 1 against mate in 3)."""
    loss = max(0, best_cp - move_cp)
    drop = max(0.0, tasks.win_prob(best_cp) - tasks.win_prob(move_cp))
    q = 0.9 * move_accuracy(drop) + 0.1 * (1.0 - min(loss, CP_LOSS_CAP) / CP_LOSS_CAP)
    return min(1.0, max(0.0, q))


def _format_score(parse: tasks.PolicyParse) -> float:
    errs = " | ".join(parse.errors)
    checks = [
        parse.sections == 3,  # all three markers, in order
        bool(parse.moves) and len(parse.moves) <= tasks.MAX_CANDIDATES
        and all(tasks.is_uci_syntax(m) for m in parse.moves) and len(set(parse.moves)) == len(parse.moves),
        bool(parse.evals) and len(parse.evals) == len(parse.moves) and all(e is not None for e in parse.evals),
        parse.best is not None and tasks.is_uci_syntax(parse.best) and parse.best in parse.moves,
        "unexpected text" not in errs and "text after" not in errs,
    ]
    return sum(checks) / len(checks)


def _expand_placement(placement: str) -> list[str]:
    """64 one-character squares (digits expanded to '.'); malformed ranks pad/cut to 8 with '?'."""
    ranks = (placement.split("/") + [""] * 8)[:8]
    rows = ("".join("." * int(ch) if ch in "123456789" else ch for ch in rank) for rank in ranks)
    return [square for row in rows for square in (row + "?" * 8)[:8]]


def fen_field_credit(pred: str, truth: str) -> float:
    """Partial credit in [0, 1]: placement (0.5, by matching squares), then 0.1 each for side to
    move, castling, en passant, halfmove clock and fullmove number. Valid FENs are compared in one
    en-passant convention (:func:`tasks.normalized_fen`), so the spelling costs nothing; an invalid
    prediction's en-passant field earns its credit as a valid truth writes it or in that convention."""
    p = (tasks.normalized_fen(pred) or pred).split(" ")
    t_fen = tasks.normalized_fen(truth)
    t = (t_fen or truth).split(" ")
    # the truth's field as written too (the standard FEN's square after every double push, as the data write it)
    ep = {t[3], truth.split(" ")[3]} if t_fen else set(t[3:4])
    placement = sum(a == b for a, b in zip(_expand_placement(p[0]), _expand_placement(t[0]))) / 64
    if len(p[0].split("/")) != 8 or placement == 1.0 and p[0] != t[0]:
        placement = min(placement, 63 / 64)  # malformed or differently spelled: never full credit
    rest = sum(0.1 for k in range(1, 6) if k < len(p) and k < len(t) and (p[k] in ep if k == 3 else p[k] == t[k]))
    if len(p) > 6:
        rest = max(0.0, rest - 0.1)
    return 0.5 * placement + rest


def _wsum(weights: _Weights, components: dict[str, float]) -> float:
    """The components weighted by the weights of the same names, clipped to [0, 1] after rounding
    to 12 decimals, so that a perfect answer scores exactly 1.0."""
    return min(1.0, max(0.0, round(math.fsum(getattr(weights, k) * v for k, v in components.items()), 12)))


# --- Where the truth comes from ---

def _resolve_engine(engine):
    """An EnginePool, or None when scoring stays offline ("auto" without Stockfish installed)."""
    if engine is None or engine is False:
        return None
    if engine == "auto":
        return get_pool() if stockfish_available() else None
    if not callable(getattr(engine, "analyse", None)):  # else an internal error, scored -1.0 as a bad answer is
        raise EngineArgumentError(f"engine must be 'auto', None or an engine pool (engine.EnginePool), got {engine!r:.60}")
    return engine


def _policy_truth_for(board: chess.Board, truth: PolicyTruth | None, engine, pool) -> tuple[PolicyTruth, str]:
    if truth is not None:
        fen = board.fen(en_passant="fen")
        # placement, turn, castling and a capturable en-passant square (another one is another position)
        truth_fen = tasks.normalized_fen(truth.fen) if isinstance(truth.fen, str) else None
        if truth_fen is None or tasks.position_key(truth_fen) != tasks.position_key(board.fen(en_passant="legal")):
            raise TruthError(f"the truth is for {truth.fen!r}, not for the prompt's position {fen!r}")
        return truth, "given"
    with _REGISTRY_LOCK:
        t = _POLICY_TRUTH.get(tasks.position_key(board.fen()))
    if t is not None:
        return t, "registered"
    if pool is None:
        if engine is None or engine is False:
            raise MissingTruthError(f"no ground truth for {board.fen()!r} and engine=None: pass truth=, call "
                                    "register_truth() with the data set, or allow the engine")
        find_stockfish()  # raises StockfishNotFoundError naming the install commands
    return pool.analyse(board), "engine"  # an Analysis is a PolicyTruth


def _unlisted_eval(board: chess.Board, move: str, truth: PolicyTruth, pool,
                   weights: PolicyWeights | GradedWeights) -> tuple[Eval | None, bool]:
    """(eval, estimated) of a legal move outside the truth's candidates."""
    last = truth.evals[-1] if truth.evals else None
    if pool is not None:
        try:
            limit = parse_limit_key(truth.limit)
        except ValueError:
            limit = None
        try:
            a = pool.analyse(board, multipv=1, limit=limit, root_moves=[move])  # EngineFailedError propagates
        except StockfishNotFoundError as exc:  # found, but it cannot run: a broken set-up, not "no engine to be had"
            raise EngineFailedError(f"searching {move} outside the candidates: {exc}") from None
        if a.evals:
            e = a.evals[0]
            return (last if last is not None and e.to_cp() > last.to_cp() else e), False  # ranked below `last`
    if last is None:
        return None, True
    if last.mate is not None:  # one move slower to mate / one sooner to be mated: strictly worse
        return (Eval(mate=last.mate + 1) if last.mate > 0 or last.mate < -1 else Eval(mate=-1)), True
    return Eval(cp=max(-tasks.MATE_CP // 2, last.cp - weights.unlisted_margin_cp)), True


def _env_truth_for(pp: tasks.EnvParse, prompt, truth: EnvTruth | None) -> tuple[EnvTruth | None, str]:
    if truth is not None:
        return _own_env_truth(pp, truth), "given"
    with _REGISTRY_LOCK:
        t = _ENV_TRUTH.get(prompt) if isinstance(prompt, str) else None
    if t is not None:
        return _own_env_truth(pp, t), "registered"
    if not pp.ok:
        return None, "none"
    t = tasks.environment_step(pp.fen, pp.move, pp.history[:-1])  # a parsed prompt's move is one it can replay
    return EnvTruth(t.new_fen, t.reward, t.terminated, t.truncated), "replay"  # python-chess's own: nothing to check


@functools.lru_cache(maxsize=65_536)
def _own_env_truth(pp: tasks.EnvParse, truth: EnvTruth) -> EnvTruth:
    """`truth`, once it is what the prompt's move gives (tasks.environment_step; the next position
    compared as a position); else TruthError: a truth for another prompt would score every answer
    against the wrong position. A prompt that does not parse has nothing to check against."""
    if not pp.ok:
        return truth
    ref = tasks.environment_step(pp.fen, pp.move, pp.history[:-1])
    if tasks.transition_differences(ref, new_fen=truth.new_fen, reward=truth.reward, terminated=truth.terminated,
                                    truncated=truth.truncated):
        raise TruthError(f"the truth (new_fen {truth.new_fen!r}, reward {truth.reward}, terminated {truth.terminated}, "
                         f"truncated {truth.truncated}) is not what the prompt's move {pp.move!r} gives (new_fen "
                         f"{ref.new_fen!r}, reward {ref.reward}, terminated {ref.terminated}, truncated {ref.truncated})")
    return truth


# --- Scoring: one safety net, one cache per task ---

def _never_raises(score_type, floor: float = GARBAGE):
    """The scorers' one safety net: set-up errors (SETUP_ERRORS) propagate; any other exception is a
    bug, logged and scored as garbage (`floor`) rather than stopping a run (fuzz tests assert it never fires)."""
    def wrap(fn):
        @functools.wraps(fn)
        def guarded(*args):
            try:
                return fn(*args)
            except SETUP_ERRORS:
                raise
            except Exception as exc:
                log.error("internal error in %s: %r", fn.__name__, exc)
                return score_type(total=floor, errors=(f"internal error: {type(exc).__name__}: {exc}",))
        return guarded
    return wrap


@functools.lru_cache(maxsize=200_000)
@_never_raises(PolicyScore)
def _policy(prompt, completion, truth, engine, weights, registry_version) -> PolicyScore:
    board, truth, source, pool, errors = _policy_setup(prompt, truth, engine)
    if board is None:
        return PolicyScore(total=GARBAGE, errors=errors)
    parse = tasks.parse_policy_completion(completion)
    if parse.sections == 0:
        return PolicyScore(total=GARBAGE, truth_source=source, errors=parse.errors)
    listed = _listed_components(board, parse, truth)
    gate = weights.format_gate and not parse.ok
    if parse.best is None or tasks.legal_move(board, parse.best) is None:
        why = "B: missing" if parse.best is None else "B: is not a legal move"
        total = ILLEGAL_BASE + ILLEGAL_FORMAT_WEIGHT * listed["format"]
        return PolicyScore(total=_gated(total) if gate else round(total, 12), truth_source=source,
                           errors=parse.errors + (why,), **listed)
    best = _best_components(board, parse.best, truth, pool, weights)
    total = _wsum(weights, {**listed, "best_quality": best["best_quality"]})
    return PolicyScore(total=_gated(total) if gate else total, best_legal=1.0, truth_source=source,
                       errors=parse.errors, **listed, **best)


def _policy_setup(prompt, truth: PolicyTruth | None, engine) -> tuple:
    """(board, truth, truth source, engine pool, errors) for a P: prompt; board None, with the errors,
    when the prompt is not ``P: <valid FEN>`` of a position with legal moves."""
    pp = tasks.parse_policy_prompt(prompt)
    if not pp.ok:
        return None, None, "none", None, tuple(f"prompt: {e}" for e in pp.errors)
    board = chess.Board(pp.fen)
    if not any(board.legal_moves):
        return None, None, "none", None, ("prompt: the position has no legal moves",)
    pool = _resolve_engine(engine)
    return (board, *_policy_truth_for(board, truth, engine, pool), pool, ())


@functools.lru_cache(maxsize=200_000)
@_never_raises(GradedScore, floor=GRADED_RANGE[0])
def _graded_policy(prompt, completion, truth, engine, weights, registry_version) -> GradedScore:
    board, truth, source, pool, errors = _policy_setup(prompt, truth, engine)
    if board is None:
        return GradedScore(total=GRADED_RANGE[0], errors=errors)
    strict = tasks.parse_policy_completion(completion)
    read = tasks.read_policy_fields(completion, strict)
    if read.sections == 0:  # no readable field: garbage
        return GradedScore(total=GRADED_RANGE[0], truth_source=source, errors=strict.errors)
    ok = [tasks.legal_move(board, m) is not None for m in read.moves]
    legal = list(dict.fromkeys(m for m, good in zip(read.moves, ok) if good))
    best_ok = read.best is not None and tasks.legal_move(board, read.best) is not None
    best = _best_components(board, read.best, truth, pool, weights) if best_ok else {}
    pairs = {m: e for m, e in reversed(list(zip(read.moves, read.evals))) if e is not None}  # first eval per move
    parts = dict(best_legal=float(best_ok), best_quality=best.pop("best_quality", 0.0),
                 moves_legal=sum(ok) / len(ok) if ok else 0.0,
                 moves_distinct=min(1.0, len(legal) / tasks.candidates_wanted(board, truth.moves)),
                 evals_accuracy=_evals_accuracy(legal, pairs, truth), format=_format_score(strict),
                 valid=float(tasks.valid_policy_answer(board, strict, truth.moves)))
    return GradedScore(total=_wsum(weights, parts), truth_source=source, errors=strict.errors, **parts, **best)


def _gated(total: float) -> float:
    """An ungated policy reward in [ILLEGAL_BASE, 1] mapped affinely into MALFORMED_RANGE: the order among
    malformed answers is kept (a legal best move still beats an illegal one), all below valid ones."""
    lo, hi = MALFORMED_RANGE
    return round(lo + (hi - lo) * (total - ILLEGAL_BASE) / (1.0 - ILLEGAL_BASE), 12)


def _listed_components(board: chess.Board, parse: tasks.PolicyParse, truth: PolicyTruth) -> dict[str, float]:
    """format, moves_legal, moves_overlap and evals_accuracy (see the module docstring)."""
    legal = list(dict.fromkeys(m for m in parse.moves if tasks.legal_move(board, m) is not None))
    return dict(format=_format_score(parse),
                moves_legal=len(legal) / len(parse.moves) if parse.moves else 0.0,
                moves_overlap=len(set(truth.moves).intersection(legal)) / len(truth.moves) if truth.moves else 0.0,
                evals_accuracy=_evals_accuracy(legal, parse.eval_map, truth))


def _evals_accuracy(moves, predicted: Mapping[str, Eval], truth: PolicyTruth) -> float:
    """Mean 1 - |W(predicted) - W(true)| over the `moves` that both `predicted` and the truth evaluate; 0 if none."""
    true_eval = dict(zip(truth.moves, truth.evals))
    accs = [1.0 - abs(tasks.win_prob(predicted[m].to_cp()) - tasks.win_prob(true_eval[m].to_cp()))
            for m in moves if m in true_eval and m in predicted]
    return sum(accs) / len(accs) if accs else 0.0


def _best_components(board: chess.Board, best: str, truth: PolicyTruth, pool,
                     weights: PolicyWeights | GradedWeights) -> dict:
    """best_quality, cp_loss, best_rank and estimated of a legal B: move."""
    true_eval = dict(zip(truth.moves, truth.evals))
    rank = truth.moves.index(best) + 1 if best in true_eval else None
    move_eval, estimated = (true_eval[best], False) if rank else _unlisted_eval(board, best, truth, pool, weights)
    if not truth.evals or move_eval is None:
        return dict(best_quality=0.0, cp_loss=None, best_rank=rank, estimated=estimated)
    best_cp, move_cp = truth.evals[0].to_cp(), move_eval.to_cp()
    return dict(best_quality=quality_from_cp(best_cp, move_cp), cp_loss=float(max(0, best_cp - move_cp)),
                best_rank=rank, estimated=estimated)


@functools.lru_cache(maxsize=200_000)
@_never_raises(EnvScore)
def _env(prompt, completion, truth, weights, registry_version) -> EnvScore:
    pp = tasks.parse_env_prompt(prompt)
    truth, source = _env_truth_for(pp, prompt, truth)
    if truth is None:
        return EnvScore(total=GARBAGE, errors=tuple(f"prompt: {e}" for e in pp.errors) or ("prompt: no truth",))
    parse = tasks.parse_env_completion(completion)
    good = [parse.fen_valid, parse.reward is not None, parse.terminated is not None, parse.truncated is not None]
    if not any(good):
        return EnvScore(total=GARBAGE, truth_source=source, errors=parse.errors)
    exact = float(tasks.same_position(parse.new_fen or "", truth.new_fen))
    parts = dict(format=(sum(good) + (parse.fields == 4)) / 5, fen_valid=float(parse.fen_valid), fen_exact=exact,
                 fen_fields=1.0 if exact else fen_field_credit(parse.new_fen or "", truth.new_fen),
                 reward=float(parse.reward is not None and abs(parse.reward - truth.reward) < 1e-9),
                 terminated=float(parse.terminated == truth.terminated),
                 truncated=float(parse.truncated == truth.truncated))
    return EnvScore(total=_wsum(weights, parts), truth_source=source, errors=parse.errors, **parts)


def _memo(fn, cache: bool, prompt, completion, *args):
    # texts of other types still score (as garbage) but are not cache keys
    if cache and isinstance(prompt, str) and isinstance(completion, str):
        return fn(prompt, completion, *args, _REGISTRY_VERSION[0])
    return fn.__wrapped__(prompt, completion, *args, _REGISTRY_VERSION[0])


def score_policy_detailed(prompt: str, completion: str, *, truth=None, engine="auto",
                          weights: PolicyWeights | GradedWeights | None = None,
                          cache: bool = True) -> PolicyScore | GradedScore:
    """Every component of the policy reward: a PolicyScore, or with GradedWeights the graded reward's
    GradedScore. `engine`: "auto" (the shared pool when Stockfish is installed), an EnginePool, or None
    (offline: needs a truth, estimates unlisted moves). Raises only the set-up errors of the module
    docstring, never because of the prompt or the completion."""
    if weights is not None and not isinstance(weights, (PolicyWeights, GradedWeights)):  # {} failed as "unhashable"
        raise ValueError(f"weights must be PolicyWeights or GradedWeights (None: the default), got {type(weights).__name__}")
    t, w = None if truth is None else policy_truth(truth), weights or DEFAULT_POLICY_WEIGHTS
    return _memo(_graded_policy if isinstance(w, GradedWeights) else _policy, cache, prompt, completion, t, engine, w)


def score_policy(prompt: str, completion: str, *, truth=None, engine="auto",
                 weights: PolicyWeights | GradedWeights | None = None, cache: bool = True) -> float:
    """Policy reward in [-1, 1] (graded: in [0, 1]); raises only for the set-up (see :func:`score_policy_detailed`)."""
    return score_policy_detailed(prompt, completion, truth=truth, engine=engine, weights=weights, cache=cache).total


def score_environment_detailed(prompt: str, completion: str, *, truth=None, weights: EnvWeights | None = None,
                               cache: bool = True) -> EnvScore:
    """Every component of the environment reward; raises only TruthError, for an unusable `truth`."""
    if weights is not None and not isinstance(weights, EnvWeights):
        raise ValueError(f"weights must be EnvWeights (None: the default), got {type(weights).__name__}")
    t = None if truth is None else env_truth(truth)
    return _memo(_env, cache, prompt, completion, t, weights or DEFAULT_ENV_WEIGHTS)


def score_environment(prompt: str, completion: str, *, truth=None, weights: EnvWeights | None = None,
                      cache: bool = True) -> float:
    """Environment reward in [-1, 1] (see :func:`score_environment_detailed`)."""
    return score_environment_detailed(prompt, completion, truth=truth, weights=weights, cache=cache).total


# --- Dispatch, batches, cache ---

def score(prompt: str, completion: str, *, truth=None, engine="auto", policy_weights=None, env_weights=None,
          cache: bool = True) -> float:
    """The one task dispatch: score_policy or score_environment by the prompt's prefix; -1.0 for a
    prompt of neither task."""
    task = tasks.task_of(prompt)
    if task == "P":
        return score_policy(prompt, completion, truth=truth, engine=engine, weights=policy_weights, cache=cache)
    if task == "A":
        return score_environment(prompt, completion, truth=truth, weights=env_weights, cache=cache)
    return GARBAGE


def score_batch(prompts: list[str], completions: list[str], truths: list | None = None, *, engine="auto") -> list[float]:
    """Scores for a batch. With an engine at hand, the items are scored on one thread per engine
    process, so that their searches run in parallel (same results)."""
    if len(prompts) != len(completions) or (truths is not None and len(truths) != len(prompts)):
        raise ValueError("score_batch: prompts, completions and truths must have the same length")
    jobs = list(zip(prompts, completions, truths or [None] * len(prompts)))
    pool = _resolve_engine(engine)
    one = lambda job: score(job[0], job[1], truth=job[2], engine=engine)  # noqa: E731
    return pool.map(one, jobs) if pool is not None else [one(job) for job in jobs]


def cache_info() -> dict:
    """Hit/miss counts of the reward caches and of the shared engine-analysis cache."""
    return {"policy": _policy.cache_info()._asdict(), "graded": _graded_policy.cache_info()._asdict(),
            "environment": _env.cache_info()._asdict(), "analysis": SHARED_CACHE.info()}


def clear_cache(analyses: bool = False) -> None:
    """Empty the reward caches (and the engine-analysis cache with `analyses=True`)."""
    _policy.cache_clear()
    _graded_policy.cache_clear()
    _env.cache_clear()
    if analyses:
        SHARED_CACHE.clear()


# --- TRL reward functions: `GRPOTrainer(reward_funcs=...)` ---
# TRL calls f(prompts=..., completions=..., completion_ids=..., **columns), one value per completion
# in each other data-set column: the truth comes from the columns our records carry, so a Dataset of
# `data.load_split(...)` records works as it is, in Python's or numpy's format. No completion makes
# them raise: None (TRL's "unscorable") for the other task's prompt, a prompt of neither task, or a
# row without truth (its columns absent or None there) when none can be had otherwise
# (MissingTruthError, StockfishNotFoundError), each logged once. The data set and the set-up do
# raise, since a column of Nones would silently drop rows from training: a row's truth that is there
# but unusable (TruthError: the field, its value, what is allowed; a truth for another position) and
# a failing engine (EngineFailedError).

_TRL_WARNED: set = set()


def _trl_warn(key: str, message: str) -> None:
    if key not in _TRL_WARNED:
        _TRL_WARNED.add(key)
        log.warning("%s", message)


def _content_text(content) -> str | None:
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):  # multimodal content: [{"type": "text", "text": ...}, ...]
        parts = [p.get("text") for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)]
        return "".join(parts) if parts else None
    return None


def trl_text(x, role: str | None = None) -> str | None:
    """The plain text of a TRL prompt or completion: a string as it is; a conversation (a list of
    {"role", "content"} messages, TRL's conversational format) as the content of its last message
    with `role` (prompts: "user") or, for role=None, of all its messages joined (completions)."""
    if isinstance(x, str):
        return x
    if isinstance(x, Mapping):
        return _content_text(x.get("content"))
    msgs = [m for m in x if isinstance(m, Mapping)] if isinstance(x, (list, tuple)) else []
    if not msgs:
        return None
    if role is not None:
        return _content_text(([m for m in msgs if m.get("role") == role] or msgs)[-1].get("content"))
    return "".join(t for t in (_content_text(m.get("content")) for m in msgs) if t is not None)


def _column_values(columns: Mapping, i: int, names: tuple[str, ...]) -> dict | None:
    """Row i of the named columns; None when a column is missing, a string, too short, or None there."""
    try:
        row = {n: columns[n][i] for n in names if not isinstance(columns[n], str)}
    except (KeyError, IndexError, TypeError):
        return None
    # `is not None`, not `in`: a row of a numpy-formatted data set holds arrays, which have no truth value
    return row if len(row) == len(names) and all(v is not None for v in row.values()) else None


def _truth_from_columns(kind: str, columns: Mapping, i: int) -> dict | None:
    """Row i's truth for a `kind` ("P" or "A") prompt from TRL's data-set columns; None when absent."""
    truth = _column_values(columns, i, POLICY_TRUTH_COLUMNS if kind == "P" else ENV_TRUTH_COLUMNS)
    if truth is not None and kind == "P":
        truth.update(_column_values(columns, i, ("limit",)) or {})
    return truth


def _trl_score_one(task, prompt, completion, columns, i, **kwargs) -> float | None:
    p = trl_text(prompt, role="user")
    if p is None:
        _trl_warn("prompt", f"TRL reward: a prompt of type {type(prompt).__name__} has no readable text; scored None")
        return None
    kind = tasks.task_of(p)
    if kind is None and task is None:
        _trl_warn("task", f"TRL reward: prompt {p[:40]!r} is neither a P: nor an A: prompt; scored None")
    if kind is None or task not in (None, kind):
        return None  # the other task's prompt: not this function's to score
    truth = _truth_from_columns(kind, columns, i)
    # an empty or unreadable answer is scored as garbage; without truth columns the environment
    # truth is replayed from the prompt (exact)
    return score(p, trl_text(completion) or "", truth=truth, **kwargs)


def trl_reward_function(task: str | None = None, *, engine=None, policy_weights: PolicyWeights | None = None,
                        env_weights: EnvWeights | None = None):
    """A reward function with TRL's signature, `f(prompts, completions, **columns) -> list[float | None]`.

    task: "P" or "A" (that task only; None for the other's prompts) or None (both, by prefix).
    engine: as `score_policy`'s; the default None keeps scoring offline and deterministic (a legal
    B: outside the candidates gets an estimated eval). Prompts and completions may be strings or
    TRL conversations; the columns lists, tuples or numpy arrays. Raises TruthError for a row whose
    truth is there but unusable and EngineFailedError, never because of a completion (see above).
    """
    if task not in (None, "P", "A"):
        raise ValueError(f"trl_reward_function: task must be 'P', 'A' or None, got {task!r}")
    name = {None: "rookworld_reward", "P": "rookworld_policy_reward", "A": "rookworld_env_reward"}[task]

    def reward(prompts, completions, **columns) -> list:
        if isinstance(completions, (str, bytes)) or isinstance(prompts, (str, bytes)):  # else scored letter by letter
            raise ValueError(f"{name}: prompts and completions must be lists of texts (one per row), got "
                             f"{type(prompts).__name__} and {type(completions).__name__}")
        out = []
        prompts = list(prompts) if prompts is not None else []
        for i, completion in enumerate(list(completions or [])):
            try:
                out.append(_trl_score_one(task, prompts[i] if i < len(prompts) else None, completion, columns, i,
                                          engine=engine, policy_weights=policy_weights, env_weights=env_weights))
            except (MissingTruthError, StockfishNotFoundError) as exc:  # no truth on this row, none to be had
                _trl_warn(type(exc).__name__, f"TRL reward ({name}): {type(exc).__name__}: {exc}; such completions "
                          "are scored None (TRL leaves them out of the advantages)")
                out.append(None)
        return out

    reward.__name__ = reward.__qualname__ = name
    reward.__doc__ = (f"TRL reward function {name}: one float (or None) per completion of "
                      f"{ {None: 'P: and A: prompts', 'P': 'P: prompts', 'A': 'A: prompts'}[task] }, "
                      "as rewards.trl_reward_function describes.")
    return reward


trl_reward = trl_reward_function(None)  # P: and A: prompts, by prefix
trl_policy_reward = trl_reward_function("P")
trl_env_reward = trl_reward_function("A")


# --- Graded components as reward functions: one metric each in the core's GRPO trainer ---

def _task_reward(kind: str, name: str, value):
    """A reward function with TRL's signature named `name`: value(prompt, completion, truth) for the
    rows of task `kind`, None for the other task's rows (and a prompt of neither task)."""
    def reward(prompts, completions, task=None, truth=None, **columns) -> list:
        out = []
        for i, (prompt, completion) in enumerate(zip(prompts, completions)):
            p = trl_text(prompt, role="user")
            if p is None or tasks.task_of(p) != kind:
                out.append(None)
                continue
            t = truth[i] if truth is not None else _truth_from_columns(kind, columns, i)
            out.append(float(value(p, trl_text(completion) or "", t)))
        return out

    reward.__name__ = reward.__qualname__ = name
    return reward


def policy_component_rewards(weights: GradedWeights | None = None, *, engine="auto",
                             env_weights: EnvWeights | None = None) -> list:
    """Reward functions with TRL's signature, `f(prompts, completions, task=None, truth=None, **columns)
    -> list[float | None]`, for the core's GRPO trainer: one per graded policy component, named
    "P/<component>" (GRADED_COMPONENTS order), None on A: rows; then "A/reward", the environment reward,
    None on P: rows. With :func:`component_reward_weights` as the trainer's reward_weights, their
    weighted sum is the graded policy reward on P: rows and the environment reward on A: rows. The seven
    components of a completion come from one memoised score_policy_detailed call. `truth`: one record
    per row (as the trainer passes it), else TRL's data-set columns; set-up errors propagate."""
    w = weights or DEFAULT_GRADED_WEIGHTS

    def component(name: str):
        return lambda p, c, t: getattr(score_policy_detailed(p, c, truth=t, engine=engine, weights=w), name)

    return [_task_reward("P", f"P/{name}", component(name)) for name in GRADED_COMPONENTS] + \
        [_task_reward("A", "A/reward", lambda p, c, t: score_environment(p, c, truth=t, weights=env_weights))]


def component_reward_weights(weights: GradedWeights | None = None, env_weight: float = 1.0) -> list[float]:
    """The reward_weights for :func:`policy_component_rewards`' functions, in their order."""
    w = weights or DEFAULT_GRADED_WEIGHTS
    return [getattr(w, name) for name in GRADED_COMPONENTS] + [env_weight]
