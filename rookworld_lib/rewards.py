"""Verifiable rewards for the policy task ``P:`` and the environment task ``A:``.

Both scorers take the prompt and the sampled completion, return a float in ``[-1, 1]`` and never
raise because of what the completion (or the prompt) holds. The ``*_detailed`` variants return every
component for logging and notebooks.

Ground truth
    ``truth=`` takes a data-set record (a dict from ``data/*.jsonl``, as ``data.load_split``
    returns them), a :class:`PolicyTruth` / :class:`EnvTruth`, or an ``engine.Analysis``.
    Without it, a truth registered with :func:`register_truth` for the prompt's position is used
    (GRPO can register its prompt set once); otherwise the policy truth comes from live Stockfish
    (multipv-5 at the default :class:`~rookworld_lib.engine.EngineSettings`, depth 8 like the
    shipped data) and the environment truth from a python-chess replay of the prompt (exact, no
    engine needed). A policy reward that has no truth and may not use the engine is an error of the
    set-up, not a low score: StockfishNotFoundError (no engine installed) or MissingTruthError
    (``engine=None``) - never a silent constant. So is a truth for another position (TruthError).

Policy reward (``score_policy``), range [-1, 1]:
    ========================  ==============================================================
    garbage                   -1.0: none of the ``M:``/``E:``/``B:`` fields is present
                              (or the prompt is not ``P: <valid FEN>``)
    ``B:`` missing/illegal    -0.5 + 0.25 * format, in [-0.5, -0.25]
    ``B:`` legal              weighted sum of the components, in [0, 1] (:class:`PolicyWeights`:
                              0.5 best_quality, 0.1 format, 0.1 moves_legal,
                              0.15 moves_overlap, 0.15 evals_accuracy)
    ========================  ==============================================================
    components, each in [0, 1]:
    - ``format``: fraction of five checks passed (the three fields, in order; 1-5 distinct UCI
      moves; as many parseable evals as moves; ``B:`` one UCI move among the candidates; no
      other text);
    - ``best_quality`` (:func:`quality_from_cp`): 0.9 * Lichess move accuracy of the drop in win
      probability from the engine's best move to ``B:``, plus 0.1 * (1 - min(cp_loss, 1000) /
      1000), so it is graded by centipawn loss and still separates mate in 1 from mate in 3
      (mates count as +-(100000 - n) cp). A legal move outside the truth's candidates is
      evaluated by Stockfish restricted to that move, at the truth's limit, and capped at the
      last candidate's eval (multipv ranked it no better); with no engine at hand its eval is
      estimated as the last candidate's minus ``unlisted_margin_cp`` (``PolicyScore.estimated``);
    - ``moves_legal``: fraction of ``M:`` entries that are legal and distinct;
    - ``moves_overlap``: |M ∩ truth candidates| / |truth candidates|;
    - ``evals_accuracy``: mean over ``M:`` moves that are truth candidates of
      1 - |W(predicted eval) - W(true eval)|, W the logistic win probability (0 when none is).

Environment reward (``score_environment``), range [-1, 1]:
    -1.0 when no field is well-formed (garbage); otherwise a weighted sum in [0, 1] of
    ``format`` (fraction of the four fields well-formed, and exactly four), ``fen_exact`` (the
    same position as the truth's by :func:`tasks.same_position`: either en-passant convention
    counts), ``fen_fields`` (partial credit per FEN field, on both FENs in one convention: the
    placement by matching squares, then side to move, castling, en passant, halfmove clock and
    fullmove number), ``reward`` (equal to the truth's), ``terminated`` and ``truncated`` (each
    equal to the truth's). Any FEN of another position scores strictly less than a correct one.

Rewards are deterministic: truths are exact (replay) or come from reproducible engine searches
(one thread, cleared hash, depth limit), and results are memoised in an LRU cache keyed by
(prompt, completion, truth, weights) - see :func:`cache_info`, :func:`clear_cache`.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields

import chess

from . import tasks
from .tasks import Eval

log = logging.getLogger(__name__)

class TruthError(ValueError):
    """The ground truth handed to a scorer cannot be used: not a P: truth, or another position."""


class MissingTruthError(TruthError):
    """A policy reward was asked for a position with no ground truth while the engine was disabled."""


POLICY_RANGE = (-1.0, 1.0)
ENV_RANGE = (-1.0, 1.0)
GARBAGE = -1.0
ILLEGAL_BASE = -0.5
ILLEGAL_FORMAT_WEIGHT = 0.25
CP_LOSS_CAP = 1000


# --------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------

def _check_weights(obj) -> None:
    total = 0.0
    for f in fields(obj):
        if f.name == "unlisted_margin_cp":
            continue
        v = getattr(obj, f.name)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{type(obj).__name__}.{f.name} must be a finite number >= 0, got {v!r}")
        total += v
    if abs(total - 1.0) > 1e-9:
        raise ValueError(f"{type(obj).__name__}: weights must sum to 1 (so legal answers score in [0, 1]), got {total}")


@dataclass(frozen=True)
class PolicyWeights:
    """Weights of the policy components for a legal ``B:`` (they sum to 1)."""

    best_quality: float = 0.5  # quality of B: by centipawn loss against the engine's best
    format: float = 0.1  # structure of the completion
    moves_legal: float = 0.1  # legal, distinct M: candidates
    moves_overlap: float = 0.15  # overlap of M: with the engine's top candidates
    evals_accuracy: float = 0.15  # accuracy of the E: evals of the candidates the engine also lists
    unlisted_margin_cp: int = 50  # offline estimate: a legal move outside the candidates = last eval minus this

    def __post_init__(self):
        _check_weights(self)
        if isinstance(self.unlisted_margin_cp, bool) or not isinstance(self.unlisted_margin_cp, int) \
                or not 0 <= self.unlisted_margin_cp <= 10_000:
            raise ValueError(f"PolicyWeights.unlisted_margin_cp must be an int in 0..10000, got {self.unlisted_margin_cp!r}")


@dataclass(frozen=True)
class EnvWeights:
    """Weights of the environment components (they sum to 1)."""

    format: float = 0.1  # four well-formed '+'-separated fields
    fen_exact: float = 0.3  # next FEN exactly right
    fen_fields: float = 0.3  # partial credit per FEN field
    reward: float = 0.1  # reward value right
    terminated: float = 0.1  # terminated flag right
    truncated: float = 0.1  # truncated flag right

    def __post_init__(self):
        _check_weights(self)


DEFAULT_POLICY_WEIGHTS = PolicyWeights()
DEFAULT_ENV_WEIGHTS = EnvWeights()


# --------------------------------------------------------------------------------------------
# Truth
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PolicyTruth:
    """Engine candidates for a position: moves best first, their evals, and the search limit."""

    fen: str
    moves: tuple[str, ...]
    evals: tuple[Eval, ...]
    limit: str = "depth=8"  # engine.limit_key of the search that produced them

    @property
    def best(self) -> str | None:
        return self.moves[0] if self.moves else None


@dataclass(frozen=True)
class EnvTruth:
    """The correct environment completion for a prompt."""

    new_fen: str
    reward: float
    terminated: int
    truncated: int


def policy_truth(obj) -> PolicyTruth:
    """A PolicyTruth from a P: record (dict or dataclass), an engine.Analysis or a PolicyTruth."""
    if isinstance(obj, PolicyTruth):
        return obj
    from .engine import Analysis  # local: keep `import rewards` light

    if isinstance(obj, Analysis):
        return PolicyTruth(obj.fen, obj.moves, obj.evals, obj.limit)
    get = obj.get if isinstance(obj, Mapping) else (lambda k, d=None: getattr(obj, k, d))
    evals = tuple(e if isinstance(e, Eval) else tasks.parse_eval(e) for e in get("evals"))
    if any(e is None for e in evals):
        raise ValueError(f"truth has an unparseable eval: {get('evals')}")
    return PolicyTruth(get("fen"), tuple(get("moves")), evals, get("limit", None) or "depth=8")


def env_truth(obj) -> EnvTruth:
    """An EnvTruth from an A: record (dict or dataclass), a tasks.EnvTransition or an EnvTruth."""
    if isinstance(obj, EnvTruth):
        return obj
    get = obj.get if isinstance(obj, Mapping) else (lambda k, d=None: getattr(obj, k, d))
    return EnvTruth(get("new_fen"), float(get("reward")), int(get("terminated")), int(get("truncated")))


_REGISTRY_LOCK = threading.Lock()
_POLICY_TRUTH: dict[str, PolicyTruth] = {}
_ENV_TRUTH: dict[str, EnvTruth] = {}
_REGISTRY_VERSION = [0]  # part of the reward cache keys: registering truth invalidates old results


def register_truth(records: Iterable) -> int:
    """Remember ground truth from data-set records (P: by position, A: by prompt) so that
    score_policy / score_environment use it without a `truth=` argument. Returns how many."""
    n = 0
    with _REGISTRY_LOCK:
        for rec in records:
            get = rec.get if isinstance(rec, Mapping) else (lambda k, d=None, r=rec: getattr(r, k, d))
            task = get("task")
            if task == "P":
                t = policy_truth(rec)
                _POLICY_TRUTH[_policy_key(t.fen)] = t
            elif task == "A":
                _ENV_TRUTH[get("prompt") or tasks.env_prompt(get("fen"), get("move"), get("history"))] = env_truth(rec)
            else:
                continue
            n += 1
        _REGISTRY_VERSION[0] += 1
    return n


def _policy_key(fen: str) -> str:
    # one key per position whatever the en-passant spelling (original prompts may differ from ours)
    return tasks.position_key(tasks.normalized_fen(fen) or fen)


def clear_truth() -> None:
    with _REGISTRY_LOCK:
        _POLICY_TRUTH.clear()
        _ENV_TRUTH.clear()
        _REGISTRY_VERSION[0] += 1


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PolicyScore:
    """Every component of a policy reward (see the module docstring)."""

    total: float
    format: float = 0.0
    best_legal: float = 0.0
    best_quality: float = 0.0
    cp_loss: float | None = None  # centipawn loss of B: (None when B: is not a legal move)
    moves_legal: float = 0.0
    moves_overlap: float = 0.0
    evals_accuracy: float = 0.0
    best_rank: int | None = None  # 1-based rank of B: among the truth's candidates, None if unlisted
    truth_source: str = "none"  # given | registered | engine | none
    estimated: bool = False  # B:'s eval was estimated (no engine for a move outside the candidates)
    errors: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class EnvScore:
    """Every component of an environment reward (see the module docstring)."""

    total: float
    format: float = 0.0
    fen_exact: float = 0.0
    fen_fields: float = 0.0
    reward: float = 0.0
    terminated: float = 0.0
    truncated: float = 0.0
    truth_source: str = "none"  # given | registered | replay | none
    errors: tuple[str, ...] = ()

    def as_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------------------------
# Policy scoring
# --------------------------------------------------------------------------------------------

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
        parse.sections == 3 and not any(e.startswith("missing") for e in parse.errors),
        bool(parse.moves) and len(parse.moves) <= tasks.MAX_CANDIDATES
        and all(tasks.is_uci_syntax(m) for m in parse.moves) and len(set(parse.moves)) == len(parse.moves),
        bool(parse.evals) and len(parse.evals) == len(parse.moves) and all(e is not None for e in parse.evals),
        parse.best is not None and tasks.is_uci_syntax(parse.best) and parse.best in parse.moves,
        "unexpected text" not in errs and "text after" not in errs,
    ]
    return sum(checks) / len(checks)


_ENGINE_SENTINEL = "auto"


def _resolve_engine(engine):
    """An EnginePool, or None when scoring must stay offline."""
    if engine is None or engine is False:
        return None
    if engine == _ENGINE_SENTINEL:
        from . import engine as eng_mod

        if not eng_mod.stockfish_available():
            return None
        return eng_mod.get_pool()
    return engine


def _unlisted_eval(board: chess.Board, move: str, truth: PolicyTruth, pool,
                   weights: PolicyWeights) -> tuple[Eval | None, bool]:
    """(eval, estimated) of a legal move outside the truth's candidates."""
    last = truth.evals[-1] if truth.evals else None
    if pool is not None:
        from .engine import parse_limit_key

        try:
            limit = parse_limit_key(truth.limit)
        except ValueError:
            limit = None
        a = pool.analyse(board, multipv=1, limit=limit, root_moves=[move])
        if a.candidates:
            e = a.candidates[0].eval
            if last is not None and e.to_cp() > last.to_cp():
                e = last  # multipv ranked it below the last candidate: it is no better
            return e, False
    if last is None:
        return None, True
    if last.mate is not None:
        return _mate_shift(last), True
    return Eval(cp=max(-tasks.MATE_CP // 2, last.cp - weights.unlisted_margin_cp)), True


def _mate_shift(e: Eval) -> Eval:
    # one move slower to mate / one move sooner to be mated: strictly worse than `e`
    if e.mate > 0:
        return Eval(mate=e.mate + 1)
    return Eval(mate=e.mate + 1) if e.mate < -1 else Eval(mate=-1)


def _policy_truth_for(board: chess.Board, truth: PolicyTruth | None, engine) -> tuple[PolicyTruth | None, str, object]:
    pool = _resolve_engine(engine)
    if truth is not None:
        fen = board.fen(en_passant="fen")
        if not isinstance(truth.fen, str) or truth.fen.split(" ")[:3] != fen.split(" ")[:3]:
            raise TruthError(f"the truth is for {truth.fen!r}, not for the prompt's position {fen!r}")
        return truth, "given", pool
    with _REGISTRY_LOCK:
        t = _POLICY_TRUTH.get(_policy_key(board.fen()))
    if t is not None:
        return t, "registered", pool
    if pool is None:
        if engine is None or engine is False:
            return None, "none", None
        from .engine import find_stockfish

        find_stockfish()  # raises StockfishNotFoundError naming the install commands
    a = pool.analyse(board)
    return PolicyTruth(a.fen, a.moves, a.evals, a.limit), "engine", pool


def score_policy_detailed(prompt: str, completion: str, *, truth=None, engine="auto",
                          weights: PolicyWeights | None = None, cache: bool = True) -> PolicyScore:
    """Every component of the policy reward. `engine`: "auto" (the shared pool when Stockfish is
    installed), an EnginePool, or None (offline: needs a truth, estimates unlisted moves).

    Never raises because of the prompt or completion. It raises only for the set-up, where a
    reward silently computed without ground truth would be worse than a stop: no truth (none given
    or registered) and no Stockfish: StockfishNotFoundError naming the install commands; no truth
    and engine=None: MissingTruthError; a truth for another position, or not a P: truth:
    TruthError; an engine that keeps dying: EngineFailedError.
    """
    weights = weights or DEFAULT_POLICY_WEIGHTS
    try:
        t = policy_truth(truth) if truth is not None else None
    except Exception as exc:
        raise TruthError(f"unusable policy truth ({type(exc).__name__}: {exc}); pass a P: record, "
                         "a PolicyTruth or an engine.Analysis") from None
    if cache and isinstance(prompt, str) and isinstance(completion, str):
        try:
            return _cached_policy(prompt, completion, t, engine, weights, _REGISTRY_VERSION[0])
        except TypeError as exc:  # an unhashable engine argument: score uncached
            if "unhashable" not in str(exc):
                raise
    return _policy_uncached(prompt, completion, t, engine, weights)


@functools.lru_cache(maxsize=200_000)
def _cached_policy(prompt, completion, truth, engine, weights, registry_version) -> PolicyScore:
    return _policy_uncached(prompt, completion, truth, engine, weights)


def _policy_uncached(prompt, completion, truth, engine, weights) -> PolicyScore:
    pp = tasks.parse_policy_prompt(prompt)
    if not pp.ok:
        return PolicyScore(total=GARBAGE, errors=tuple(f"prompt: {e}" for e in pp.errors))
    board = chess.Board(pp.fen)
    if not any(board.legal_moves):
        return PolicyScore(total=GARBAGE, errors=("prompt: the position has no legal moves",))
    truth_obj, source, pool = _policy_truth_for(board, truth, engine)
    if truth_obj is None:
        raise MissingTruthError(f"no ground truth for {pp.fen!r} and engine=None: pass truth=, call "
                                "register_truth() with the data set, or allow the engine")
    return _score_policy(board, completion, truth_obj, source, weights, pool)


def _score_policy(board: chess.Board, completion, truth: PolicyTruth, source: str, weights: PolicyWeights,
                  pool) -> PolicyScore:
    from .engine import EngineFailedError, StockfishNotFoundError

    try:
        return _score_policy_inner(board, completion, truth, source, weights, pool)
    except (EngineFailedError, StockfishNotFoundError, TruthError):
        raise
    except Exception as exc:  # pragma: no cover - safety net; the fuzz tests assert it never fires
        log.error("internal error scoring a policy completion: %r", exc)
        return PolicyScore(total=GARBAGE, truth_source=source, errors=(f"internal error: {type(exc).__name__}: {exc}",))


def _score_policy_inner(board, completion, truth, source, weights, pool) -> PolicyScore:
    parse = tasks.parse_policy_completion(completion)
    if parse.sections == 0:
        return PolicyScore(total=GARBAGE, truth_source=source, errors=parse.errors)
    fmt = _format_score(parse)
    best_move = tasks.legal_move(board, parse.best) if parse.best else None
    # M: candidates
    legal_m = []
    for m in parse.moves:
        if tasks.legal_move(board, m) is not None and m not in legal_m:
            legal_m.append(m)
    moves_legal = len(legal_m) / len(parse.moves) if parse.moves else 0.0
    truth_set = set(truth.moves)
    overlap = len(truth_set.intersection(legal_m)) / len(truth.moves) if truth.moves else 0.0
    true_eval = dict(zip(truth.moves, truth.evals))
    pred_eval = parse.eval_map
    accs = [1.0 - abs(pred_eval[m].win_prob() - true_eval[m].win_prob())
            for m in legal_m if m in true_eval and m in pred_eval]
    evals_acc = sum(accs) / len(accs) if accs else 0.0
    if best_move is None:
        total = round(ILLEGAL_BASE + ILLEGAL_FORMAT_WEIGHT * fmt, 12)
        why = "B: missing" if parse.best is None else "B: is not a legal move"
        return PolicyScore(total=total, format=fmt, moves_legal=moves_legal, moves_overlap=overlap,
                           evals_accuracy=evals_acc, truth_source=source, errors=parse.errors + (why,))
    b = parse.best
    estimated = False
    if b in true_eval:
        move_eval = true_eval[b]
        rank = truth.moves.index(b) + 1
    else:
        rank = None
        move_eval, estimated = _unlisted_eval(board, b, truth, pool, weights)
    best_eval = truth.evals[0] if truth.evals else None
    if best_eval is None or move_eval is None:
        quality, loss = 0.0, None
    else:
        loss = float(max(0, best_eval.to_cp() - move_eval.to_cp()))
        quality = quality_from_cp(best_eval.to_cp(), move_eval.to_cp())
    total = _wsum((weights.best_quality, quality), (weights.format, fmt), (weights.moves_legal, moves_legal),
                  (weights.moves_overlap, overlap), (weights.evals_accuracy, evals_acc))
    return PolicyScore(total=min(1.0, max(0.0, total)), format=fmt, best_legal=1.0, best_quality=quality,
                       cp_loss=loss, moves_legal=moves_legal, moves_overlap=overlap, evals_accuracy=evals_acc,
                       best_rank=rank, truth_source=source, estimated=estimated, errors=parse.errors)


def score_policy(prompt: str, completion: str, *, truth=None, engine="auto",
                 weights: PolicyWeights | None = None, cache: bool = True) -> float:
    """Policy reward in [-1, 1] (see the module docstring). Never raises because of the texts."""
    try:
        return _finite(score_policy_detailed(prompt, completion, truth=truth, engine=engine,
                                             weights=weights, cache=cache).total)
    except Exception as exc:
        from .engine import EngineFailedError, StockfishNotFoundError

        if isinstance(exc, (StockfishNotFoundError, EngineFailedError, TruthError)):
            raise  # the set-up, not the text: a silent constant reward would be worse
        log.error("internal error in score_policy: %r", exc)
        return GARBAGE


def _wsum(*pairs: tuple[float, float]) -> float:
    """Weighted sum, rounded to 12 decimals so that a perfect answer scores exactly 1.0."""
    return round(math.fsum(w * v for w, v in pairs), 12)


def _finite(x: float) -> float:
    if not isinstance(x, float) or not math.isfinite(x):
        return GARBAGE
    return min(1.0, max(-1.0, x))


# --------------------------------------------------------------------------------------------
# Environment scoring
# --------------------------------------------------------------------------------------------

def _expand_placement(placement: str) -> list[str]:
    """64 one-character squares (digits expanded to '.'); malformed ranks pad/cut to 8 with '?'."""
    ranks = placement.split("/")
    out = []
    for r in range(8):
        row = ""
        if r < len(ranks):
            for ch in ranks[r]:
                row += "." * int(ch) if ch in "123456789" else ch
        out.extend((row + "?" * 8)[:8])
    return out


def fen_field_credit(pred: str, truth: str) -> float:
    """Partial credit in [0, 1]: placement (0.5, by matching squares), then 0.1 each for side to
    move, castling, en passant, halfmove clock and fullmove number. Valid FENs are compared in one
    en-passant convention (:func:`tasks.normalized_fen`), so the spelling costs nothing."""
    truth = tasks.normalized_fen(truth) or truth
    pred = tasks.normalized_fen(pred) or pred
    p = pred.split(" ")
    t = truth.split(" ")
    if not p or not t:
        return 0.0
    tp = _expand_placement(t[0])
    pp = _expand_placement(p[0])
    placement = sum(a == b for a, b in zip(pp, tp)) / 64
    if len(p[0].split("/")) != 8 or placement == 1.0 and p[0] != t[0]:
        placement = min(placement, 63 / 64)  # malformed or differently spelled: never full credit
    rest = sum(0.1 for k in range(1, 6) if k < len(p) and k < len(t) and p[k] == t[k])
    if len(p) > 6:
        rest = max(0.0, rest - 0.1)
    return 0.5 * placement + rest


def _env_truth_for(prompt_parse: tasks.EnvPromptParse, prompt: str, truth) -> tuple[EnvTruth | None, str]:
    if truth is not None:
        return truth, "given"
    with _REGISTRY_LOCK:
        t = _ENV_TRUTH.get(prompt)
    if t is not None:
        return t, "registered"
    if not prompt_parse.ok:
        return None, "none"
    try:
        tr = tasks.environment_step(prompt_parse.fen, prompt_parse.move, prompt_parse.history[:-1])
    except ValueError:
        return None, "none"
    return EnvTruth(tr.new_fen, tr.reward, tr.terminated, tr.truncated), "replay"


def score_environment_detailed(prompt: str, completion: str, *, truth=None, weights: EnvWeights | None = None,
                               cache: bool = True) -> EnvScore:
    """Every component of the environment reward. Never raises."""
    try:
        weights = weights or DEFAULT_ENV_WEIGHTS
        t = env_truth(truth) if truth is not None else None
        if cache and isinstance(prompt, str) and isinstance(completion, str):
            return _cached_env(prompt, completion, t, weights, _REGISTRY_VERSION[0])
        return _env_uncached(prompt, completion, t, weights)
    except Exception as exc:
        log.error("internal error scoring an environment completion: %r", exc)
        return EnvScore(total=GARBAGE, errors=(f"internal error: {type(exc).__name__}: {exc}",))


@functools.lru_cache(maxsize=200_000)
def _cached_env(prompt, completion, truth, weights, registry_version) -> EnvScore:
    return _env_uncached(prompt, completion, truth, weights)


def _env_uncached(prompt, completion, truth, weights) -> EnvScore:
    pp = tasks.parse_env_prompt(prompt)
    t, source = _env_truth_for(pp, prompt, truth)
    if t is None:
        return EnvScore(total=GARBAGE, errors=tuple(f"prompt: {e}" for e in pp.errors) or ("prompt: no truth",))
    return _score_env(completion, t, source, weights)


def _score_env(completion, t: EnvTruth, source: str, weights: EnvWeights) -> EnvScore:
    parse = tasks.parse_env_completion(completion)
    good = [parse.fen_valid, parse.reward is not None, parse.terminated is not None, parse.truncated is not None]
    if not any(good):
        return EnvScore(total=GARBAGE, truth_source=source, errors=parse.errors)
    fmt = (sum(good) + (parse.fields == 4)) / 5
    pred_fen = parse.new_fen or ""
    exact = float(tasks.same_position(pred_fen, t.new_fen))
    partial = 1.0 if exact else fen_field_credit(pred_fen, t.new_fen)
    rew = float(parse.reward is not None and abs(parse.reward - t.reward) < 1e-9)
    term = float(parse.terminated == t.terminated)
    trunc = float(parse.truncated == t.truncated)
    total = _wsum((weights.format, fmt), (weights.fen_exact, exact), (weights.fen_fields, partial),
                  (weights.reward, rew), (weights.terminated, term), (weights.truncated, trunc))
    return EnvScore(total=min(1.0, max(0.0, total)), format=fmt, fen_exact=exact, fen_fields=partial, reward=rew,
                    terminated=term, truncated=trunc, truth_source=source, errors=parse.errors)


def score_environment(prompt: str, completion: str, *, truth=None, weights: EnvWeights | None = None,
                      cache: bool = True) -> float:
    """Environment reward in [-1, 1] (see the module docstring). Never raises."""
    try:
        return _finite(score_environment_detailed(prompt, completion, truth=truth, weights=weights, cache=cache).total)
    except Exception as exc:  # pragma: no cover
        log.error("internal error in score_environment: %r", exc)
        return GARBAGE


# --------------------------------------------------------------------------------------------
# Dispatch, batches, cache
# --------------------------------------------------------------------------------------------

def score(prompt: str, completion: str, *, truth=None, **kwargs) -> float:
    """score_policy or score_environment by the prompt's prefix; -1.0 for any other prompt."""
    task = tasks.task_of(prompt)
    if task == "P":
        return score_policy(prompt, completion, truth=truth, **kwargs)
    if task == "A":
        kwargs.pop("engine", None)
        return score_environment(prompt, completion, truth=truth, **kwargs)
    return GARBAGE


def score_batch(prompts: list[str], completions: list[str], truths: list | None = None, *,
                engine="auto", prefetch: bool = True) -> list[float]:
    """Scores for a batch. With `prefetch`, the engine analyses every position that needs one
    first, on all pool processes in parallel, so the per-item scoring then hits the cache."""
    if len(prompts) != len(completions) or (truths is not None and len(truths) != len(prompts)):
        raise ValueError("score_batch: prompts, completions and truths must have the same length")
    truths = truths or [None] * len(prompts)
    if prefetch:
        _prefetch(prompts, completions, truths, engine)
    return [score(p, c, truth=t, engine=engine) for p, c, t in zip(prompts, completions, truths)]


def _prefetch(prompts, completions, truths, engine) -> None:
    """Warm the analysis cache on all engines in parallel: first the multipv analyses of positions
    without a truth, then the restricted searches of legal B: moves outside the candidates."""
    pool = _resolve_engine(engine)
    if pool is None:
        return
    import concurrent.futures

    from .engine import parse_limit_key

    items = []  # (fen, board, truth or None, completion)
    for p, c, t in zip(prompts, completions, truths):
        if tasks.task_of(p) != "P" or not isinstance(c, str):
            continue
        pp = tasks.parse_policy_prompt(p)
        if not pp.ok:
            continue
        board = chess.Board(pp.fen)
        if not any(board.legal_moves):
            continue
        try:
            tr = policy_truth(t) if t is not None else _POLICY_TRUTH.get(_policy_key(pp.fen))
        except Exception:
            continue
        items.append((pp.fen, board, tr, c))

    def run(fn, jobs):
        with concurrent.futures.ThreadPoolExecutor(max_workers=pool.size) as ex:
            return list(ex.map(fn, jobs))

    def analyse(fen):
        try:
            a = pool.analyse(fen)
            return PolicyTruth(a.fen, a.moves, a.evals, a.limit)
        except ValueError as exc:
            log.warning("prefetch failed for %s: %s", fen, exc)
            return None

    missing = list(dict.fromkeys(fen for fen, _, tr, _ in items if tr is None))
    found = dict(zip(missing, run(analyse, missing)))
    roots = []
    for fen, board, tr, c in items:
        tr = tr or found.get(fen)
        best = tasks.parse_policy_completion(c).best
        if tr is not None and best and best not in tr.moves and tasks.legal_move(board, best) is not None:
            roots.append((fen, best, tr.limit))

    def root(job):
        fen, move, limit = job
        try:
            pool.analyse(fen, multipv=1, limit=parse_limit_key(limit), root_moves=[move])
        except ValueError as exc:
            log.warning("prefetch failed for %s %s: %s", fen, move, exc)

    run(root, list(dict.fromkeys(roots)))


# --------------------------------------------------------------------------------------------
# Example completions (notebook 00, robustness checks)
# --------------------------------------------------------------------------------------------

_MUTATION_ALPHABET = "abcdefgh12345678qrbnkpPNBRQK/ -+.M:E0"


def mutate_text(text: str, rng, edits: int = 1) -> str:
    """`text` with `edits` random character edits (replace, insert, delete, swap): a garbled answer."""
    chars = list(text)
    for _ in range(edits):
        op = rng.choice("rids")
        i = rng.randrange(len(chars) + 1)
        if op == "r" and chars:
            chars[min(i, len(chars) - 1)] = rng.choice(_MUTATION_ALPHABET)
        elif op == "i":
            chars.insert(i, rng.choice(_MUTATION_ALPHABET))
        elif op == "d" and chars:
            del chars[min(i, len(chars) - 1)]
        elif op == "s" and len(chars) > 1:
            j = min(i, len(chars) - 2)
            chars[j], chars[j + 1] = chars[j + 1], chars[j]
    return "".join(chars)


def policy_examples(rec, seed: int = 0) -> dict[str, str]:
    """Completions of graded quality for one P: record, keyed by category: the record's M:/E: with
    B: = best, 2nd, 5th candidate, a random legal move outside them, an illegal move; a garbled
    copy of the true completion (3-8 character edits); and random garbage."""
    import random as _random

    rng = _random.Random(f"{seed}:{rec['id']}")
    board = chess.Board(rec["fen"])
    head = f" M: {' '.join(rec['moves'])} E: {' '.join(rec['evals'])} B: "
    out = {"best": head + rec["moves"][0]}
    if len(rec["moves"]) > 1:
        out["2nd"] = head + rec["moves"][1]
    if len(rec["moves"]) > 4:
        out["5th"] = head + rec["moves"][4]
    others = sorted(m.uci() for m in board.legal_moves if m.uci() not in rec["moves"])
    if others:
        out["random legal"] = head + rng.choice(others)
    while True:
        m = chess.Move(rng.choice(chess.SQUARES), rng.choice(chess.SQUARES))
        if m.from_square != m.to_square and not board.is_legal(m):
            out["illegal"] = head + m.uci()
            break
    out["garbled"] = mutate_text(rec["completion"], rng, rng.randint(3, 8))
    out["garbage"] = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789 .,!?") for _ in range(rng.randint(5, 40)))
    return out


def env_examples(rec, seed: int = 0) -> dict[str, str]:
    """Completions for one A: record: exact, one FEN character off, wrong flags, garbled, garbage."""
    import random as _random

    rng = _random.Random(f"{seed}:{rec['id']}")
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
            "garbled": mutate_text(rec["completion"], rng, rng.randint(3, 8)),
            "garbage": "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789 .,!?") for _ in range(rng.randint(5, 40)))}


def reward_distribution(policy_records=(), env_records=(), seed: int = 0) -> list[dict]:
    """One row per (record, example category): task, category, reward, id (for tables and plots)."""
    rows = []
    for rec in policy_records:
        for cat, completion in policy_examples(rec, seed).items():
            rows.append({"task": "P", "category": cat, "reward": score_policy(rec["prompt"], completion, truth=rec),
                         "id": rec["id"]})
    for rec in env_records:
        for cat, completion in env_examples(rec, seed).items():
            rows.append({"task": "A", "category": cat,
                         "reward": score_environment(rec["prompt"], completion, truth=rec), "id": rec["id"]})
    return rows


def cache_info() -> dict:
    """Hit/miss counts of the reward caches and of the shared engine-analysis cache."""
    from .engine import SHARED_CACHE

    return {"policy": _cached_policy.cache_info()._asdict(), "environment": _cached_env.cache_info()._asdict(),
            "analysis": SHARED_CACHE.info()}


def clear_cache(analyses: bool = False) -> None:
    """Empty the reward caches (and the engine-analysis cache with `analyses=True`)."""
    _cached_policy.cache_clear()
    _cached_env.cache_clear()
    if analyses:
        from .engine import SHARED_CACHE

        SHARED_CACHE.clear()


__all__ = [
    "TruthError", "MissingTruthError", "POLICY_RANGE", "ENV_RANGE", "PolicyWeights", "EnvWeights", "PolicyTruth", "EnvTruth", "policy_truth",
    "env_truth", "register_truth", "clear_truth", "PolicyScore", "EnvScore",
    "move_accuracy", "quality_from_cp", "fen_field_credit", "score_policy", "score_policy_detailed", "score_environment",
    "score_environment_detailed", "score", "score_batch", "cache_info", "clear_cache", "mutate_text",
    "policy_examples", "env_examples", "reward_distribution",
]


# ============================================================================================
# TRL reward functions: `GRPOTrainer(reward_funcs=...)`
# (an appended section: everything above is the library's own scoring, used unchanged here)
# ============================================================================================
#
# TRL calls a reward function as f(prompts=..., completions=..., completion_ids=..., **columns),
# where `columns` holds every other column of the data set, one value per completion, plus its own
# extras (trainer_state, log_extra, log_metric). The functions below read the ground truth from
# the columns our data records carry (data/*.jsonl): a P: record's `fen`, `moves`, `evals`
# (and `limit`), an A: record's `new_fen`, `reward`, `terminated`, `truncated`; so a
# `datasets.Dataset` made from `data.load_split(...)` records works as it is. They return one
# float per completion and never raise; None (TRL's "not applicable / unscorable", which TRL turns
# into NaN and leaves out of the advantages) where a completion cannot be scored: a prompt of the
# other task (for the single-task functions), a prompt of neither task, or a P: prompt with no
# truth in its columns, none registered and no engine (each logged once as a warning).

POLICY_TRUTH_COLUMNS = ("fen", "moves", "evals")  # plus the optional "limit"
ENV_TRUTH_COLUMNS = ("new_fen", "reward", "terminated", "truncated")
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
    if isinstance(x, (list, tuple)):
        msgs = [m for m in x if isinstance(m, Mapping)]
        if not msgs:
            return None
        if role is not None:
            picked = [m for m in msgs if m.get("role") == role] or msgs
            return _content_text(picked[-1].get("content"))
        texts = [_content_text(m.get("content")) for m in msgs]
        return "".join(t for t in texts if t is not None)
    return None


def _column_values(columns: Mapping, i: int, names: tuple[str, ...]) -> dict | None:
    out = {}
    for name in names:
        col = columns.get(name)
        if col is None or isinstance(col, str):
            return None
        try:
            v = col[i]
        except (IndexError, KeyError, TypeError):
            return None
        if v is None:
            return None
        out[name] = v
    return out


def _trl_score_one(task, prompt, completion, columns, i, engine, policy_weights, env_weights):
    p = trl_text(prompt, role="user")
    if p is None:
        _trl_warn("prompt", f"TRL reward: a prompt of type {type(prompt).__name__} has no readable text; scored None")
        return None
    c = trl_text(completion)
    c = "" if c is None else c  # an empty or unreadable answer is scored as garbage
    kind = tasks.task_of(p)
    if task is not None and kind != task:
        return None  # the other task's prompt: not this function's to score
    if kind == "P":
        row = _column_values(columns, i, POLICY_TRUTH_COLUMNS)
        truth = None
        if row is not None:
            limit = _column_values(columns, i, ("limit",))
            truth = policy_truth({**row, **(limit or {})})
        return score_policy(p, c, truth=truth, engine=engine, weights=policy_weights)
    if kind == "A":
        row = _column_values(columns, i, ENV_TRUTH_COLUMNS)
        # without truth columns the environment truth is replayed from the prompt (exact)
        return score_environment(p, c, truth=env_truth(row) if row is not None else None, weights=env_weights)
    _trl_warn("task", f"TRL reward: prompt {p[:40]!r} is neither a P: nor an A: prompt; scored None")
    return None


def trl_reward_function(task: str | None = None, *, engine=None, policy_weights: PolicyWeights | None = None,
                        env_weights: EnvWeights | None = None):
    """A reward function with TRL's signature, `f(prompts, completions, **columns) -> list[float | None]`.

    task: "P" (policy only; None for A: prompts), "A" (environment only; None for P: prompts) or
    None (both, by each prompt's prefix). engine: as `score_policy`'s; the default None keeps
    scoring offline and deterministic (a legal B: move outside the truth's candidates gets an
    estimated eval); "auto" uses Stockfish when installed. Prompts and completions may be strings
    or TRL conversations. See this section's header for the truth columns and the None cases.
    """
    if task not in (None, "P", "A"):
        raise ValueError(f"trl_reward_function: task must be 'P', 'A' or None, got {task!r}")
    name = {None: "rookworld_reward", "P": "rookworld_policy_reward", "A": "rookworld_env_reward"}[task]

    def reward(prompts, completions, **columns) -> list:
        out = []
        prompts = list(prompts) if prompts is not None else []
        for i, completion in enumerate(list(completions or [])):
            try:
                prompt = prompts[i] if i < len(prompts) else None
                out.append(_trl_score_one(task, prompt, completion, columns, i, engine, policy_weights, env_weights))
            except Exception as exc:  # set-up errors (no truth and no engine, a truth for another position)
                _trl_warn(type(exc).__name__, f"TRL reward ({name}): {type(exc).__name__}: {exc}; such completions "
                          "are scored None (TRL leaves them out of the advantages)")
                out.append(None)
        return out

    reward.__name__ = reward.__qualname__ = name
    return reward


trl_reward = trl_reward_function(None)  # P: and A: prompts, by prefix
trl_policy_reward = trl_reward_function("P")
trl_env_reward = trl_reward_function("A")

__all__ += ["trl_reward_function", "trl_reward", "trl_policy_reward", "trl_env_reward", "trl_text",
            "POLICY_TRUTH_COLUMNS", "ENV_TRUTH_COLUMNS"]
