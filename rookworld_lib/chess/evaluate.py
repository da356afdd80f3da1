"""Held-out chess evaluation of a model: policy, environment, mate-in-one and self-play.

Every rate comes with a Wilson 95% interval and every mean with a Student t one, so a before/after
difference can be read against its noise; a pass@1 rate's Wilson interval counts a record's k samples
as the effective number of independent draws they are worth (:func:`pass_at_1`). A paired change is
Newcombe's square-and-add interval for a right/wrong metric and a t interval of the per-record
differences otherwise (:func:`paired_difference`), the records matched by :func:`record_key`.
Completions are decoded in batches by the GRPO sampler (greedy by default), in the model's own layout
(``training.layout_of(model)``) unless told otherwise.
Positions are compared as positions (:func:`tasks.same_position`), never as strings.

Beside greedy, ``EvalConfig.samples = k`` adds pass@1 for every strict metric (STRICT_METRICS), as
DeepSeek-R1 reports it: k completions per prompt at ``sample_temperature`` (GRPO's rollout
temperature), each scored, and a record's outcome the mean of its k (a value in [0, 1]). Those keys
are the strict ones with a ``pass@1/`` prefix (``pass@1/policy/valid``: SAMPLED_METRICS,
:func:`sampled_name`); :func:`paired_change` compares them record by record as it does greedy ones.

``policy/best_move_accuracy`` is agreement with Stockfish's best move; on converted original data
``policy/original_label_agreement`` is agreement with the original ``B:`` label (for black the worst
of the five listed moves), which is what RookWorld's own best-move figure measured. The reference
column holds RookWorld's reported figures, each on the row of what it measured (other data sets).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import random
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import chess
import pandas as pd
from rapidfuzz.distance import Levenshtein
from scipy.special import stdtrit

from . import data, rewards, tasks
from ..core.checkpoint import CheckpointLoadError, intact, list_checkpoints, model_from_checkpoint
from ..core.model import GPT, CheckpointFormatError
from ..core.paths import atomic_write, keep_aside, run_lock
from ..core.sampling import MIN_TEMPERATURE, SamplingConfig, check_fits, generate
from ..core.task_vocab import sampling_view
from ..core.tokenizer import EOT_ID, check_vocabulary, encode_prompt, get_tokenizer
from ..core.train_grpo import METRICS_FILE as GRPO_METRICS_FILE, ROLLOUT_TEMPERATURE_KEY, PromptItem, score_completions
from ..core.train_sft import METRICS_FILE
from ..core.train_utils import read_metrics, resolve_device
from ..core.config import (SEED_MAX, add_config_arguments, bad_field, config_class, config_kwargs_from_args, option, path_arg,
                           validate)
from .training import layout_of, read_layout, reward_functions

# Reported for RookWorld 7M x 3E (GPT-2 124M; the RookWorld repository's README), each on the row of
# the metric that measures the same thing: {metric: (value, what it measured and on which data)}.
REFERENCE_NAME = "RookWorld-LM-124M, 7M samples x 3 epochs (reported)"
REFERENCE_NOTE = "what the reference measured; notes"
REFERENCE_ROOKWORLD_LM_124M = {
    "policy/original_label_agreement":
        (0.166, "B: equal to the original label (for black the worst listed move), rook val set"),
    "policy/top5_overlap": (0.392, "M: moves shared with the original label's five, rook val set"),
    "mate_in_one/accuracy": (0.137, "BIG-bench checkmate-in-one"),
    "self_play/legal_half_moves": (36.3, "sampled (top-k 5, temperature 0.6) self-play from the start; ours is "
                                         "decoded as the evaluation decodes (greedy unless --decoding sampled) from "
                                         "distinct starts (the initial position, then 1-3 random plies) and stops at "
                                         "selfplay_max_plies: not the same measurement"),
    "env/next_fen_exact":
        (0.9961, "next FEN string equal (python-chess's board.fen() on both sides), arbiter test set"),
}


@dataclass(frozen=True)
class Estimate:
    """A rate (k of n) or a mean, with its 95% interval."""

    value: float
    low: float
    high: float
    n: int
    kind: str = "rate"  # "rate" (Wilson interval), "mean" (Student t) or "share" (a mean in [0, 1])
    # the per-record outcomes behind a rate, in record order, for paired comparisons: 1 or 0 per record,
    # or for a pass@1 rate the share of the record's samples that were right
    outcomes: tuple[float, ...] = field(default=(), repr=False, compare=False)
    # what each outcome is about (record_key), so that a paired comparison pairs the same records
    keys: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def __str__(self) -> str:
        if self.n == 0:  # nothing to average (a centipawn loss over no legal best move)
            return "n/a (n=0)"
        if self.kind in ("rate", "share"):
            return f"{100 * self.value:.1f}% [{100 * self.low:.1f}, {100 * self.high:.1f}] (n={self.n})"
        if not (math.isfinite(self.low) and math.isfinite(self.high)):  # one value: no interval to print
            return f"{self.value:.3g} (n={self.n}, no interval)"
        # the value to 3 significant digits (a zero value: its bounds' scale) and its bounds to the same
        # decimals: 0.750 [0.009, 1.490], not 0.75 [0.00895, 1.49]
        scale = abs(self.value) or max(abs(self.low), abs(self.high))
        digits = max(0, 2 - int(f"{scale:.2e}".partition("e")[2])) if scale else 3  # 0.9996: 1.00
        return f"{self.value:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}] (n={self.n})"


def wilson(k: float, n: int, z: float = 1.959964) -> Estimate:
    """Wilson score interval for k successes in n trials (well-behaved at 0%, 100% and small n); k may
    be a sum of per-trial shares (see `pass_at_1`)."""
    if n == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), 0)
    if not (n > 0 and -1e-9 * n <= k <= n * (1 + 1e-9)):  # (a sum of shares may round past n)
        raise ValueError(f"wilson: k successes in n trials needs 0 <= k <= n and n > 0, got k={k!r}, n={n!r}")
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return Estimate(p, max(0.0, centre - half), min(1.0, centre + half), n)


def record_key(rec: dict) -> str:
    """What an outcome is about, for pairing two evaluations: a P: record's position, an A: record's
    position and move (or its bare prompt)."""
    return " ".join(str(rec[f]) for f in ("fen", "move", "prompt") if rec.get(f) is not None)


def rate(outcomes: Sequence[bool | float], keys: Sequence[str] = ()) -> Estimate:
    """The Wilson estimate of a rate that keeps its per-record outcomes (and their record_key) for
    `paired_change`. Outcomes are right/wrong (bools, or 0 and 1; a share of samples is pass_at_1's)."""
    if bad := [x for x in outcomes if isinstance(x, str) or x not in (0, 1)]:  # 0.3 counted as right, 'no' too
        raise ValueError(f"rate: outcomes are right/wrong (True/False or 1/0), got {bad[0]!r}; for shares of samples "
                         "right use pass_at_1")
    if keys and len(keys) != len(outcomes):
        raise ValueError(f"rate: {len(keys)} keys for {len(outcomes)} outcomes; give one record_key per outcome")
    hits = tuple(int(bool(x)) for x in outcomes)
    return replace(wilson(sum(hits), len(hits)), outcomes=hits, keys=tuple(keys))


def pass_at_1(per_record: Sequence[Sequence[bool | float]], keys: Sequence[str] = ()) -> Estimate:
    """pass@1 from each record's sample outcomes: a record's outcome is the mean of its samples' (a
    share of right ones), the value their mean over records. The samples of one record are correlated,
    so the interval is Wilson's at the effective number of independent draws (the design effect of
    survey sampling: n_eff = p(1 - p) / Var(mean), the variance from the spread of the records' shares),
    kept between n (every record's samples alike) and n x k (independent samples). Unlike a normal
    interval it is not empty at 0% or 100%, where it takes the n x k draws."""
    if not per_record or any(len(s) == 0 for s in per_record):
        raise ValueError("pass@1 needs at least one sample for every record")
    shares = tuple(sum(map(float, s)) / len(s) for s in per_record)
    n, draws = len(shares), sum(map(len, per_record))
    p = sum(shares) / n
    spread = sum((x - p) ** 2 for x in shares) / (n - 1) / n if n > 1 else 0.0  # the variance of the mean
    n_eff = draws if spread == 0 or p in (0.0, 1.0) else min(draws, max(n, p * (1 - p) / spread))
    est = wilson(p * n_eff, n_eff)
    return Estimate(p, est.low, est.high, n, outcomes=shares, keys=tuple(keys))


def mean_interval(values: Sequence[float], share: bool = False, level: float = 0.95,
                  bounds: tuple[float, float] = (-math.inf, math.inf)) -> Estimate:
    """Mean and Student t 95% interval (n - 1 degrees of freedom; one value gives no interval: the whole
    of `bounds`), kept inside `bounds`, the values' possible range (a similarity in [0, 1], a count >= 0).
    `share`: values in [0, 1] shown as a percentage, as the rates are. Where every value sits at one bound
    (every game at the ply cap, every cp loss 0, every share 0 or 1) the t interval would be a point, certainty
    that n records cannot give: it takes the Wilson interval of n right or n wrong, scaled to `bounds`, as a rate
    at 0% or 100% does. Equal values inside the bounds keep the point (their spread is unknown, not the widest)."""
    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    n = len(vals)
    kind, (lo, hi) = ("share", (0.0, 1.0)) if share else ("mean", bounds)
    if n == 0:
        return Estimate(float("nan"), float("nan"), float("nan"), 0, kind)
    m = sum(vals) / n
    if n == 1:
        return Estimate(m, lo, hi, 1, kind)
    if all(v == vals[0] for v in vals) and vals[0] in (lo, hi) and math.isfinite(hi - lo):  # none off the bound
        w = wilson(n * (vals[0] == hi), n)
        return Estimate(m, lo + w.low * (hi - lo), lo + w.high * (hi - lo), n, kind)
    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (n - 1))
    half = float(stdtrit(n - 1, 0.5 + level / 2)) * sd / math.sqrt(n)
    return Estimate(m, max(lo, m - half), min(hi, m + half), n, kind)


EVAL_CLIP_CP = 1000  # Lichess clips evaluations to +-10 pawns for its average centipawn loss


def clipped_cp_loss(best_cp: float, cp_loss: float) -> float:
    """The centipawn loss of a move `cp_loss` below the best eval `best_cp`, with both evals clipped
    to +-EVAL_CLIP_CP first, as Lichess does: a mate given away (+-100,000 cp here, tasks.MATE_CP)
    costs at most 2,000, so that one blunder does not outweigh a test split of sound moves."""
    def clip(cp: float) -> float:
        return max(-EVAL_CLIP_CP, min(EVAL_CLIP_CP, cp))

    return float(clip(best_cp) - clip(best_cp - cp_loss))


def similarity(a: str, b: str) -> float:
    """1 - edit distance / the longer length (rapidfuzz's normalized Levenshtein similarity, unit
    costs): 1 for equal strings, 0 for nothing in common."""
    return Levenshtein.normalized_similarity(a, b)


@config_class(frozen=True)
class EvalConfig:
    """How an evaluation decodes and how much it covers."""

    decoding: str = option("greedy", '"greedy" or "sampled"', choices=("greedy", "sampled"))
    temperature: float = option(1.0, "for sampled decoding (>= 0.01 there; refused beside greedy decoding)", min=0.0)
    max_new_tokens: int | None = option(None, "completion budget in tokens; None: the model layout's (96 compact, 128 original)", min=1)
    batch_size: int = option(128, "rows decoded together: as many prompts greedy, batch_size // samples prompts "
                             "of `samples` rows each for pass@1 (more samples than this: a prompt's in batches of it); greedy answers do "
                             "not depend on it, pass@1's draws do (seeded by batch): compare models at one batch_size",
                             min=1)
    max_policy: int | None = option(None, "cap on P: records evaluated, spread evenly over the file (every game, the same "
                                    "records for every model); None = all; 0 = no policy suite", min=0)
    max_env: int | None = option(None, "cap on A: records evaluated, spread as max_policy's (None = all; 0 = no env suite)", min=0)
    max_mate: int | None = option(None, "cap on mate-in-one records evaluated, spread as max_policy's (None = all; 0 = no "
                                  "mate-in-one suite)", min=0)
    selfplay_games: int = option(8, "self-play games (0 = skip), each from its own start", min=0, max=1000)
    selfplay_max_plies: int = option(100, "a self-play game stops here even if all moves were legal", min=1)
    layout: str | None = option(None, "prompt layout; None: the model's own (training.layout_of; \"original\" for RookWorld-LM)", choices=tasks.LAYOUTS)
    prompt_prefix: str | None = option(None, "text before every prompt; None: the model's own (model.prompt_prefix: "
                                       "<|endoftext|> for models our SFT trained, \"\" for RookWorld-LM)")
    seed: int = option(0, "sampling seed and self-play opening randomisation", min=0, max=SEED_MAX)
    samples: int = option(4, "pass@1 beside greedy: the strict metrics averaged over this many samples per prompt "
                          "(keys pass@1/<metric>; 4 or more for a steady estimate; 0 = greedy only)", min=0)
    sample_temperature: float | None = option(None, "temperature of the pass@1 samples; None: the rollout temperature "
                                              "a GRPO export records (rookworld_rollout_temperature), else 1.0",
                                              min=MIN_TEMPERATURE)

    def __post_init__(self):
        validate(self)  # types, ranges and choices of every field (the option() checks above)
        if self.decoding == "sampled" and self.temperature < MIN_TEMPERATURE:
            bad_field(type(self).__name__, "temperature", self.temperature, f"must be >= {MIN_TEMPERATURE} for sampled "
                      "decoding (temperature 0 is greedy decoding: decoding='greedy')")

    def for_model(self, model) -> EvalConfig:
        """This config with the layout, prompt prefix and budget resolved: given values win, else the model's."""
        layout = self.layout or layout_of(model)
        prefix = getattr(model, "prompt_prefix", "") if self.prompt_prefix is None else self.prompt_prefix
        temperature = self.sample_temperature or getattr(model, "meta", {}).get(ROLLOUT_TEMPERATURE_KEY, 1.0)
        if not self.sample_temperature and not (type(temperature) in (int, float) and 0 < temperature < math.inf):
            raise CheckpointFormatError(f"{getattr(model, 'source', 'the model')}/config.json: {ROLLOUT_TEMPERATURE_KEY} "
                                        f"must be a finite number > 0, got {temperature!r} (or give --sample-temperature)")
        block = getattr(getattr(model, "config", None), "block_size", None)
        if block and (self.max_new_tokens or 0) >= block:  # no position left for a prompt
            raise ValueError(f"EvalConfig.max_new_tokens is {self.max_new_tokens}: the model's block_size {block} "
                             "holds the prompt and the completion; give fewer")
        return replace(self, layout=layout, prompt_prefix=prefix, sample_temperature=temperature,
                       max_new_tokens=self.max_new_tokens or tasks.COMPLETION_BUDGET[layout])


def complete(model: GPT, prompts: list[str], cfg: EvalConfig, samples: int = 0) -> list[str]:
    """Decode completions in batches of cfg.batch_size rows with the GRPO sampler: one per prompt
    as cfg.decoding says, or with samples=k, k per prompt at cfg.sample_temperature (prompt i's are
    items i*k to i*k+k-1; cfg.batch_size // k prompts a batch, or where k > batch_size one prompt's
    samples in batches of batch_size). Seeded by cfg.seed plus the batch's first prompt index (plus
    len(prompts) times the part of a prompt's samples a batch holds)."""
    check_vocabulary(model)  # an id past GPT-2's cannot be decoded
    tokenizer = get_tokenizer()
    cfg = cfg.for_model(model)
    # a vocab="task" export decodes over its task tokens (task_vocab.sampling_view): the same answers
    model, vocab, all_ids = sampling_view(model, [encode_prompt(p, cfg.prompt_prefix, tokenizer) for p in prompts])
    eot = EOT_ID if vocab is None else int(vocab.index[EOT_ID])
    # every row gets the whole budget, or the call is refused (as GRPO's is): a budget cut to fit each
    # batch's longest prompt made a row's greedy answer depend on --batch-size
    block, longest = model.config.block_size, max(map(len, all_ids), default=0)
    try:
        check_fits(block, longest, cfg.max_new_tokens)
    except ValueError as exc:
        raise ValueError(f"{exc}: give --max-new-tokens {block + 1 - longest} or fewer" if longest <= block
                         else str(exc)) from None
    out, new, k = [], cfg.max_new_tokens, max(1, samples)
    per_batch, rows = max(1, cfg.batch_size // k), min(k, cfg.batch_size)  # rows: a prompt's samples per batch
    temperature = cfg.sample_temperature if samples else 0.0 if cfg.decoding == "greedy" else cfg.temperature
    for start in range(0, len(prompts), per_batch):
        ids = all_ids[start:start + per_batch]
        # more samples than batch_size rows: the prompt's samples go in batches of batch_size, each seeded apart
        for part, done in enumerate(range(0, k, rows)):
            sc = SamplingConfig(max_new_tokens=new, temperature=temperature, num_samples=min(rows, k - done),
                                seed=cfg.seed + start + part * len(prompts), eos_id=eot, pad_id=eot)
            rollout = generate(model, ids, sc)
            out += [tokenizer.decode(c if vocab is None else vocab.ids[c].tolist())
                    for c in map(rollout.completion_ids, range(rollout.tokens.size(0)))]
    return out


def capped(records: Sequence, limit: int | None) -> list:
    """`limit` of `records` spread evenly over them, in order (all of them for None): a data file is in game
    order, so its first records were a few games' openings (the first 50 of the shipped test split: 5 of its
    48 games, whose legal-best rate, 42%, lies outside the whole split's interval). Seed-free, so every model
    and every run meets the same records, and paired changes pair them."""
    records = list(records)
    n = len(records)
    return records if limit is None or limit >= n else [records[i * n // limit] for i in range(limit)]


# What each suite reads of a record (a record without "task" is taken as the suite's)
_NEEDS = {"P": rewards.POLICY_TRUTH_COLUMNS, "A": ("new_fen",), "M1": ("fen",)}


def _decode(model: GPT, records: Sequence, cfg: EvalConfig, prompt_of_record, limit: int | None = None,
            completions: list[str] | None = None, task: str | None = None) -> tuple[list, list[str], list[str]]:
    """(records, prompts, completions): `limit` records spread over `records` (:func:`capped`; each of `task`,
    with what its suite reads), their prompts in the model's layout and the model's completions of them
    (unless given: one per record, in order)."""
    layout = cfg.for_model(model).layout
    records = capped(records, limit)
    for i, r in enumerate(records if task else ()):  # else a KeyError, or (mate in one) 0% of the wrong positions
        where = f"records[{i}]" + (f" ({r.get('id')})" if isinstance(r, dict) and r.get("id") else "")
        if not isinstance(r, dict) or r.get("task", task) != task:
            raise ValueError(f"{where} is " + (f"a record of task {r['task']!r}" if isinstance(r, dict) else
                                               f"a {type(r).__name__}") + f", not of task {task!r}: give this suite's records")
        if missing := [f for f in _NEEDS[task] if f not in r]:
            raise ValueError(f"{where}: a record of task {task!r} needs the field(s) {', '.join(missing)}")
    if completions is not None and (isinstance(completions, (str, bytes)) or len(completions) != len(records)):
        got = f"one {type(completions).__name__}" if isinstance(completions, (str, bytes)) else str(len(completions))
        raise ValueError(f"completions: {got} for {len(records)} records; give one completion per record, in order")
    prompts = [prompt_of_record(r, layout) for r in records]
    return records, prompts, completions if completions is not None else complete(model, prompts, cfg)


@contextlib.contextmanager
def _naming_record(i: int, rec: dict):
    """A ground truth the scorers refuse (TruthError, naming the field), said with the record it came from
    (its id, else its place; a pass@1 pass holds each record k times)."""
    try:
        yield
    except rewards.TruthError as exc:
        where = f"record {rec['id']}" if rec.get("id") else f"records[{i}]"
        raise type(exc)(f"{where}: {exc}") from exc


def policy_prompt_of(rec: dict, layout: str) -> str:
    return tasks.policy_prompt(rec["fen"], layout=layout)


def env_prompt_of(rec: dict, layout: str) -> str:
    """The A: prompt of a record in `layout` (python-chess's FEN spelling for original)."""
    if rec.get("fen") is None:  # a bare {"prompt": ...} record
        p = tasks.parse_env_prompt(rec["prompt"])
        if layout == "compact" or not p.ok:
            return rec["prompt"]
        rec = {"fen": p.fen, "move": p.move, "history": p.history}
    return tasks.env_prompt(tasks.fen_for_layout(rec["fen"], layout), rec["move"], rec["history"])


def prompt_of(rec: dict, layout: str) -> str:
    return policy_prompt_of(rec, layout) if rec.get("task", "P") == "P" else env_prompt_of(rec, layout)


def _with_pass_at_1(score, model: GPT, records: list, prompts: list[str], completions: list[str],
                    cfg: EvalConfig) -> dict:
    """score(records, prompts, completions) -> results, for the greedy completions and, with
    cfg.samples = k, the pass@1 of each strict metric over k samples per prompt (keys `sampled_name`);
    without a model (completions given to score) there is nothing to sample."""
    out, k = score(records, prompts, completions), cfg.samples
    if not k or model is None:
        return out
    per_sample = score([r for r in records for _ in range(k)], [p for p in prompts for _ in range(k)],
                       complete(model, prompts, cfg, samples=k))
    out.update({sampled_name(m): pass_at_1([e.outcomes[i:i + k] for i in range(0, len(e.outcomes), k)], out[m].keys)
                for m, e in per_sample.items() if m in STRICT_METRICS})
    return out


def evaluate_policy(model: GPT, records: Sequence, cfg: EvalConfig, completions: list[str] | None = None) -> dict:
    """Valid, legal-best, best-move accuracy (against Stockfish's best), top-5 overlap and centipawn
    loss (evals clipped to +-10 pawns: clipped_cp_loss) on P: records; on converted original records
    also agreement with the original B: label.
    With cfg.samples, also pass@1 of the strict ones (see the module docstring)."""
    return _with_pass_at_1(_score_policy, model, *_decode(model, records, cfg, policy_prompt_of, cfg.max_policy,
                                                          completions, "P"), cfg)


def _score_policy(records: list, prompts: list[str], completions: list[str]) -> dict:
    valid, legal, correct, overlaps, cp_losses, agree, estimated = [], [], [], [], [], [], []
    for i, (rec, prompt, text) in enumerate(zip(records, prompts, completions)):
        parse = tasks.parse_policy_completion(text)
        with _naming_record(i, rec):
            valid.append(tasks.valid_policy_answer(chess.Board(rec["fen"]), parse, rec["moves"]))
            score = rewards.score_policy_detailed(prompt, text, truth=rec)
        legal.append(score.best_legal >= 1.0)
        correct.append(parse.best is not None and parse.best == rec["moves"][0])
        if rec.get("original_best") is not None:
            agree.append(parse.best is not None and parse.best == rec["original_best"])
        overlaps.append(score.moves_overlap)
        if score.cp_loss is not None:
            cp_losses.append(clipped_cp_loss(tasks.parse_eval(rec["evals"][0]).to_cp(), score.cp_loss))
            estimated.append(score.estimated)
    keys = [record_key(r) for r in records]
    out = {"policy/valid": rate(valid, keys), "policy/legal_best_move": rate(legal, keys),
           "policy/best_move_accuracy": rate(correct, keys), "policy/top5_overlap": mean_interval(overlaps, share=True),
           "policy/cp_loss": mean_interval(cp_losses, bounds=(0.0, 2.0 * EVAL_CLIP_CP))}
    if any(estimated):  # no Stockfish: a B: outside the candidates got an estimated eval (rewards' engine="auto")
        out["policy/cp_loss_estimated"] = rate(estimated)
    if agree:
        out["policy/original_label_agreement"] = rate(agree, [record_key(r) for r in records
                                                              if r.get("original_best") is not None])
    return out


def evaluate_mate_in_one(model: GPT, records: Sequence, cfg: EvalConfig) -> dict:
    """Share of mate-in-one positions where B: is a mating move (checked by python-chess)."""
    records, _, completions = _decode(model, records, cfg, policy_prompt_of, cfg.max_mate, task="M1")
    hits = []
    for rec, text in zip(records, completions):
        board = chess.Board(rec["fen"])
        move = tasks.legal_move(board, tasks.parse_policy_completion(text).best or "")
        if move is not None:
            board.push(move)
        hits.append(move is not None and board.is_checkmate())
    return {"mate_in_one/accuracy": rate(hits, [record_key(r) for r in records])}


def evaluate_environment(model: GPT, records: Sequence, cfg: EvalConfig) -> dict:
    """Valid (the answer's form: a valid FEN, a number and two 0/1 flags, as tasks.parse_env_completion
    reads it, not whether a move could give that reward and those flags), FEN similarity (both FENs in
    one en-passant convention), and how often each part the environment reward checks is right: next
    position (:func:`tasks.same_position`), reward, flags.
    With cfg.samples, also pass@1 of the strict ones (see the module docstring)."""
    return _with_pass_at_1(_score_environment, model, *_decode(model, records, cfg, env_prompt_of, cfg.max_env,
                                                               task="A"), cfg)


def _score_environment(records: list, prompts: list[str], completions: list[str]) -> dict:
    valid, sims, right = [], [], {part: [] for part in ("fen_exact", "reward", "terminated", "truncated")}
    for i, (rec, prompt, text) in enumerate(zip(records, prompts, completions)):
        p = tasks.parse_env_completion(text)
        valid.append(p.ok)
        pred, true_fen = p.new_fen or "", rec["new_fen"]
        sims.append(similarity(tasks.normalized_fen(pred) or pred, tasks.normalized_fen(true_fen) or true_fen))
        with _naming_record(i, rec):
            score = rewards.score_environment_detailed(prompt, text, truth=rec)  # each part 1.0 (right) or 0.0
        for part, hits in right.items():
            hits.append(getattr(score, part) >= 1.0)
    keys = [record_key(r) for r in records]
    return {"env/valid": rate(valid, keys), "env/next_fen_exact": rate(right["fen_exact"], keys),
            "env/fen_similarity": mean_interval(sims, bounds=(0.0, 1.0)), "env/reward_accuracy": rate(right["reward"], keys),
            "env/terminated_accuracy": rate(right["terminated"], keys),
            "env/truncated_accuracy": rate(right["truncated"], keys)}


def self_play(model: GPT, cfg: EvalConfig) -> dict:
    """The policy plays both sides, python-chess referees; count legal half-moves before the first
    illegal or unparseable B: (games that end by the rules or hit the ply cap count all their moves).
    Games start from distinct positions, the initial one and others after 1-3 random opening plies:
    greedy decoding plays a start the same way every time, so a repeated start would be a repeated game."""
    cfg = cfg.for_model(model)
    rng = random.Random(cfg.seed)
    boards, starts = [], set()
    while len(boards) < cfg.selfplay_games:
        b = chess.Board()
        for _ in range(0 if not boards else rng.randint(1, 3)):
            b.push(rng.choice(list(b.legal_moves)))
        if b.fen() not in starts:
            starts.add(b.fen())
            boards.append(b)
    legal_plies = [0] * len(boards)
    alive = list(range(len(boards)))
    for ply in range(cfg.selfplay_max_plies):
        alive = [i for i in alive if not boards[i].is_game_over(claim_draw=False)]
        if not alive:
            break
        # each position in the layout's spelling (compact: the en-passant square after every double push, as
        # the training data write it; python-chess's default writes it only where a capture is legal)
        fens = [tasks.fen_for_layout(tasks.canonical_fen(boards[i]), cfg.layout) for i in alive]
        prompts = [tasks.policy_prompt(fen, cfg.layout) for fen in fens]
        # each ply's draws seeded apart (sampled decoding): one seed for all would give every ply the same noise
        texts = complete(model, prompts, replace(cfg, seed=cfg.seed + ply * cfg.selfplay_games))
        still = []
        for i, text in zip(alive, texts):
            move = tasks.legal_move(boards[i], tasks.parse_policy_completion(text).best or "")
            if move is None:
                continue  # first illegal move ends the count for this game
            boards[i].push(move)
            legal_plies[i] += 1
            still.append(i)
        alive = still
    return {"self_play/legal_half_moves": mean_interval(legal_plies, bounds=(0.0, cfg.selfplay_max_plies))}


def selected_suites(policy_records, env_records, mate_records, cfg: EvalConfig) -> list[str]:
    """The suites an evaluation runs: each with records and not capped at 0 (max_policy / max_env /
    max_mate), and self-play when cfg.selfplay_games > 0."""
    runs = {"policy": bool(policy_records) and cfg.max_policy != 0, "mate_in_one": bool(mate_records) and cfg.max_mate != 0,
            "env": bool(env_records) and cfg.max_env != 0, "self_play": cfg.selfplay_games > 0}
    return [name for name, yes in runs.items() if yes]


def evaluate_all(model: GPT, policy_records, env_records, mate_records, cfg: EvalConfig) -> dict:
    """Every suite of selected_suites (a suite without records, or capped at 0, is left out)."""
    suites = {"policy": lambda: evaluate_policy(model, policy_records, cfg),
              "mate_in_one": lambda: evaluate_mate_in_one(model, mate_records, cfg),
              "env": lambda: evaluate_environment(model, env_records, cfg), "self_play": lambda: self_play(model, cfg)}
    out = {}
    for name in selected_suites(policy_records, env_records, mate_records, cfg):
        out.update(suites[name]())
    return out


def comparison_table(columns: dict[str, dict], reference: dict = REFERENCE_ROOKWORLD_LM_124M):
    """A pandas DataFrame: one row per metric, one column per named result, then the reference and
    what the reference measured (so no row sets unlike things side by side without saying so)."""
    rows = []
    for m in sorted({m for res in columns.values() for m in res}):
        ref, measured = reference.get(m, (None, NOTES.get(m, "")))
        rows.append({"metric": m, **{name: str(res.get(m, "")) for name, res in columns.items()},
                     REFERENCE_NAME: "" if ref is None else _reference_text(ref),
                     REFERENCE_NOTE: measured})
    return pd.DataFrame(rows, columns=["metric", *columns, REFERENCE_NAME, REFERENCE_NOTE]).set_index("metric")


# What a metric with no reference figure measures, where its name does not say it (comparison_table)
NOTES = {"policy/cp_loss": "(ours only) centipawns B: loses against Stockfish's best, lower is better, over the "
                           "answers whose B: is legal: each model's own set of positions (n), not paired; a B: "
                           "outside the candidates is searched by Stockfish, estimated where none is installed",
         "policy/cp_loss_estimated": "(ours only, without Stockfish) share of those B: evals estimated: the last "
                                     "candidate's eval minus a margin, not searched"}

TERMINAL_WIDTH = 120


def terminal_table(results: dict, model: str, width: int = TERMINAL_WIDTH) -> str:
    """`rookworld eval`'s table for a terminal: metric, this model's estimate, and the figure reported
    for the original model where one measured the same thing, then a key saying what each reported
    figure measured; no line wider than `width`."""
    ref = "reported"
    rows = [{"metric": m, model: str(results[m]),
             ref: "" if m not in REFERENCE_ROOKWORLD_LM_124M else _reference_text(REFERENCE_ROOKWORLD_LM_124M[m][0])}
            for m in sorted(results)]
    table = pd.DataFrame(rows).set_index("metric").to_string(max_colwidth=width // 2)
    key = [f"{model}: estimate [95% interval] (n = records scored)",
           f"{ref}: {REFERENCE_NAME.removesuffix(' (reported)')}, GPT-2 124M, as its README reports it; measured as:"]
    key += [f"  {m}: {REFERENCE_ROOKWORLD_LM_124M[m][1]}" for m in sorted(results) if m in REFERENCE_ROOKWORLD_LM_124M]
    return "\n".join([table, "", *(textwrap.fill(k, width, subsequent_indent="    ") for k in key)])


def _reference_text(value: float) -> str:
    return f"{100 * value:.1f}%" if value <= 1 else f"{value}"


def heldout_rewards(model: GPT, records: Sequence, cfg: EvalConfig, reward: str = "graded") -> list[float]:
    """GRPO's training reward of the model's completion for each P:/A: record: the reward functions and
    weights the trainer sums (`training.reward_functions(reward)`), on held-out prompts with ground
    truth from the record."""
    records, prompts, completions = _decode(model, records, cfg, prompt_of)
    items = [PromptItem(rec["task"], prompt, rec) for rec, prompt in zip(records, prompts)]
    return score_completions(*reward_functions(reward), items, completions).tolist()


def newcombe_paired(before: Sequence[int], after: Sequence[int], z: float = 1.959964) -> Estimate:
    """after - before of a right/wrong rate on the same records, with Newcombe's square-and-add 95%
    interval for paired proportions (Statistics in Medicine 17:2635, 1998, method 10: each rate's Wilson
    interval, combined with their continuity-corrected correlation). Unlike the normal interval of the
    differences it is not a point when few records changed, all one way."""
    if len(before) != len(after) or not before:  # zip cut the longer one; none divided by zero
        raise ValueError(f"newcombe_paired needs the same records before and after, at least one: got {len(before)} "
                         f"and {len(after)}")
    n = len(before)
    a = sum(1 for b, x in zip(before, after) if b and x)  # right both times
    gained = sum(1 for b, x in zip(before, after) if x and not b)
    lost = sum(1 for b, x in zip(before, after) if b and not x)
    d = n - a - gained - lost
    p1, p2 = (a + gained) / n, (a + lost) / n
    r1, r2 = wilson(a + gained, n, z), wilson(a + lost, n, z)
    margins = (a + gained) * (lost + d) * (a + lost) * (gained + d)
    cross = a * d - gained * lost
    corr = 0.0 if margins == 0 else ((cross - n / 2) if cross > n / 2 else min(cross, 0)) / math.sqrt(margins)
    low = p1 - p2 - math.sqrt((p1 - r1.low) ** 2 + (r2.high - p2) ** 2 - 2 * corr * (p1 - r1.low) * (r2.high - p2))
    high = p1 - p2 + math.sqrt((p2 - r2.low) ** 2 + (r1.high - p1) ** 2 - 2 * corr * (p2 - r2.low) * (r1.high - p1))
    return Estimate(p1 - p2, low, high, n, "mean")


def paired_difference(before: Sequence[float], after: Sequence[float], binary: bool | None = None) -> Estimate:
    """Mean of after - before over the same records, with a paired 95% interval (record difficulty
    cancels): Newcombe's (newcombe_paired) for a right/wrong outcome per record (`binary`; None: when
    every outcome is 0 or 1), else the t interval of the differences (pass@1 shares, rewards). Fewer
    than two records give no interval."""
    if len(before) != len(after):
        raise ValueError(f"paired_difference needs equal lengths, got {len(before)} and {len(after)}")
    if not before:
        raise ValueError("paired_difference needs outcomes: none were given (an estimate built without per-record "
                         "outcomes, such as evaluate.wilson's, cannot be paired)")
    if bad := [i for i, v in enumerate((*before, *after)) if v is None or not math.isfinite(v)]:
        raise ValueError(f"paired_difference needs finite outcomes: record {bad[0] % len(before)} is "
                         f"{(*before, *after)[bad[0]]!r}")
    whole = all(v in (0, 1) for v in (*before, *after))
    if binary is None:
        binary = whole
    elif binary and not whole:  # int() truncated 0.5 and 0.9 to 0: no change reported
        raise ValueError("paired_difference(binary=True) needs right/wrong outcomes (0 or 1); these hold shares: "
                         "binary=False (or None) takes their t interval")
    # shares that are all whole and all unchanged (no sample right, say) leave a t interval no spread to
    # measure, a point at 0: the records' right/wrong interval stands in
    if len(before) >= 2 and (binary or (whole and list(before) == list(after))):
        return newcombe_paired([int(v) for v in before], [int(v) for v in after])
    return mean_interval([a - b for a, b in zip(after, before)])


def paired_estimates(before: Estimate, after: Estimate, metric: str = "") -> Estimate:
    """paired_difference of two evaluations' per-record outcomes, once their records are known to be the
    same ones in the same order (their record_key), where both recorded them."""
    b, a = before.keys, after.keys
    if b and a and b != a:
        i = next((i for i, (x, y) in enumerate(zip(b, a)) if x != y), min(len(b), len(a)))
        raise ValueError(f"{metric}: the two evaluations are not of the same records in the same order (record {i}: "
                         f"{b[i] if i < len(b) else 'none'!r} before, {a[i] if i < len(a) else 'none'!r} after); "
                         "evaluate both on one test split")
    # a strict metric's greedy rate is right/wrong per record (Newcombe's interval), its pass@1 a share (t),
    # even where every record's samples happen to agree; without a metric name, as the outcomes look
    binary = (not metric.startswith(SAMPLED_PREFIX)) if metric else None
    return paired_difference(before.outcomes, after.outcomes, binary=binary)


def _points(*xs: float) -> str:
    """Changes in percentage points (a change and its bounds: `+0.1 [-0.4, +0.8]`), to 0.1, or with as
    many more decimals, the same for all, as a value off zero needs not to read 0.0."""
    decimals = max([1] + [math.ceil(-math.log10(abs(100 * x))) for x in xs if x != 0 and round(100 * x, 1) == 0])
    first, *bounds = (f"{100 * x:+.{decimals}f}" for x in xs)
    return f"{first} [{', '.join(bounds)}]" if bounds else first


# The metrics a chess verdict rests on: each is right or wrong per record, with no partial credit.
STRICT_METRICS = ("policy/valid", "policy/legal_best_move", "policy/best_move_accuracy", "env/valid",
                  "env/next_fen_exact")
SAMPLED_PREFIX = "pass@1/"  # EvalConfig.samples = k: the strict metrics' pass@1 over k samples at a temperature


def sampled_name(metric: str) -> str:
    """The results key of a strict metric's pass@1 (`policy/valid` -> `pass@1/policy/valid`)."""
    return SAMPLED_PREFIX + metric


SAMPLED_METRICS = tuple(map(sampled_name, STRICT_METRICS))


def paired_change(before: dict, after: dict, metrics: Sequence[str] = STRICT_METRICS + SAMPLED_METRICS):
    """For each strict rate measured on the same records before and after (greedy, then pass@1 where
    both were sampled): both rates, the change with its paired 95% interval, and a plain word on
    whether it moved (up / down: the interval excludes zero; "no resolved change" otherwise). A greedy
    change has Newcombe's paired interval, a pass@1 change (per-record differences of sample shares)
    a t interval (`paired_difference`). The records are matched by record_key: two evaluations of other
    records, or in another order, are refused. A pandas DataFrame, one row per metric measured on both sides."""
    if not (isinstance(before, dict) and isinstance(after, dict)):  # lists gave an empty table without a word
        raise ValueError(f"paired_change: before and after must be evaluate_all results (dict metric -> Estimate), got "
                         f"{type(before).__name__} and {type(after).__name__}")
    strict = f"{', '.join(STRICT_METRICS)}, and each with {SAMPLED_PREFIX}"
    if isinstance(metrics, str):  # read letter by letter: no row
        raise ValueError(f"paired_change: metrics must be a list of strict metrics ({strict}), got {metrics!r}")
    if unknown := [m for m in metrics if m not in STRICT_METRICS + SAMPLED_METRICS]:
        raise ValueError(f"paired_change: {unknown} are no strict metric; the strict metrics: {strict}")
    if bad := [m for m in metrics if isinstance(before.get(m), dict) or isinstance(after.get(m), dict)]:
        raise ValueError(f"paired_change: {bad[0]} is a saved result (results_to_json) without its per-record "
                         "outcomes; pair two evaluate_all results of this session")
    rows = []
    for m in metrics:
        if m not in before or m not in after:
            continue
        b, a = before[m], after[m]
        diff = paired_estimates(b, a, m)
        moved = "up" if diff.low > 0 else "down" if diff.high < 0 else "no resolved change"
        rows.append({"metric": m, "before": str(b), "after": str(a),
                     "change (points)": _points(diff.value, diff.low, diff.high),
                     "moved": moved})
    return pd.DataFrame(rows, columns=["metric", "before", "after", "change (points)", "moved"]).set_index("metric")


def curve_point(history: Sequence[dict], step: int, results: dict) -> dict:
    """One point of a learning curve: from a training run's metrics records (`metrics.jsonl`), the
    training tokens, the training wall time up to `step` (the sum of `time/step`: val-loss and
    checkpoint pauses left out), the train loss at `step` and the latest val loss at or before it;
    from `results` (an evaluation), every STRICT_METRICS and SAMPLED_METRICS rate it measured, with its
    interval and n (an undefined one, over no records, as None: the row is strict JSON)."""
    done = [r for r in history if 0 < r["step"] <= step]
    at = next((r for r in reversed(done) if r["step"] == step), None)
    vals = [r for r in history if r["step"] <= step and r.get("eval/loss") is not None]
    row = {"step": step, "tokens": at["num_tokens"] if at else None,
           "train_wall_s": round(sum(r.get("time/step") or 0.0 for r in done), 1),
           "train_loss": at["loss"] if at else None,
           "val_loss": vals[-1]["eval/loss"] if vals else None, "val_loss_step": vals[-1]["step"] if vals else None}
    for m in (m for m in STRICT_METRICS + SAMPLED_METRICS if m in results):
        e = results[m]
        row[m] = {"value": _json_number(e.value), "low": _json_number(e.low), "high": _json_number(e.high), "n": e.n}
    return row


def checkpoint_curve(run_dir: str | Path, policy_records: Sequence, env_records: Sequence, cfg: EvalConfig,
                     on_point=None, device: str = "cpu") -> list[dict]:
    """The learning curve of a training run: a `curve_point` per checkpoint, oldest first.

    run_dir: a `rookworld sft` output directory (`checkpoints/step_*.pt`, `metrics.jsonl`); each
    checkpoint is evaluated on the P: and A: records (on `device`), each suite as evaluate_all selects it
    (none of its records, or capped at 0: left out). on_point(row) is called as each row is ready."""

    run_dir = Path(run_dir)
    found = _curve_checkpoints(run_dir)
    if not (run_dir / METRICS_FILE).is_file():  # else a bare FileNotFoundError
        raise CheckpointLoadError(f"{run_dir / METRICS_FILE}: missing; a learning curve is of a `rookworld sft` --out, "
                                  "whose metrics give each checkpoint's tokens and losses")
    history = read_metrics(run_dir / METRICS_FILE)
    suites = [s for s in selected_suites(policy_records, env_records, (), cfg) if s in ("policy", "env")]
    if not suites:
        raise ValueError("a learning curve needs P: or A: test records, and --max-policy or --max-env above 0")
    rows, device = [], resolve_device(device)
    for step, path in found:
        model = model_from_checkpoint(path).eval().to(device)
        results = {**(evaluate_policy(model, policy_records, cfg) if "policy" in suites else {}),
                   **(evaluate_environment(model, env_records, cfg) if "env" in suites else {})}
        rows.append(curve_point(history, step, results))
        if on_point is not None:
            on_point(rows[-1])
    return rows


def _curve_checkpoints(run_dir: Path, verify: bool = True) -> list[tuple[int, Path]]:
    """A learning curve's checkpoints, each checked against its SHA-256 (verify) before any is evaluated: a
    corrupt last one stopped the curve after hours of evaluating the others, its rows lost."""
    found = list_checkpoints(run_dir / "checkpoints")
    if not found:
        hint = (f"; {run_dir} is a run's checkpoints folder: give the run, {run_dir.parent}" if run_dir.name == "checkpoints"
                else f"; {run_dir} is an exported model: give the run folder it was exported from"
                if (run_dir / "config.json").is_file() else "")
        raise CheckpointLoadError(f"{run_dir / 'checkpoints'}: no step_*.pt checkpoint (give a `rookworld sft` "
                                  f"--out, trained with --checkpoint-interval N --keep-checkpoints 0){hint}")
    if verify and (bad := [p.name for _, p in found if not intact(p)]):
        raise CheckpointLoadError(f"{run_dir / 'checkpoints'}: {', '.join(bad)} fails its SHA-256 check (a corrupt "
                                  "file): no checkpoint was evaluated; move it and its .sha256 away to evaluate the others")
    return found


def curve_table(rows: Sequence[dict]):
    """A learning curve's rows as a table: tokens, wall time, losses and the strict rates in percent."""
    table = pd.DataFrame([{"step": r["step"], "tokens (M)": round(r["tokens"] / 1e6, 3) if r["tokens"] else None,
                           "train wall (s)": r["train_wall_s"], "train loss": r["train_loss"], "val loss": r["val_loss"],
                           **{f"{m} (%)": None if r[m]["value"] is None else round(100 * r[m]["value"], 1)
                              for m in STRICT_METRICS + SAMPLED_METRICS if m in r}}
                          for r in rows])
    return table.set_index("step")


def results_to_json(results: dict) -> dict:
    """Results as plain data for strict JSON: an undefined value (NaN: a rate over no records, say)
    becomes None (null), since strict parsers reject NaN and Infinity."""
    return {k: {f: _json_number(x) for f, x in asdict(v).items() if f not in ("outcomes", "keys")}
            for k, v in results.items()}


def _json_number(x):
    """x, or None for a float strict JSON cannot hold (NaN, infinities)."""
    return None if isinstance(x, float) and not math.isfinite(x) else x


def cli(argv: list[str] | None = None) -> int:

    ap = argparse.ArgumentParser(prog="rookworld eval", description="Evaluate a model on held-out chess tasks.",
                                 epilog="example: rookworld eval /path/to/RookWorld-LM-124M --data-dir data/original "
                                        "(after rookworld convert; the layout comes from the model)")
    ap.add_argument("model", type=path_arg, help="Hugging Face GPT-2 directory (ours or RookWorld-LM)")
    ap.add_argument("--data-dir", default=None, type=path_arg, help="directory with the test data: policy_test, env_test and "
                    "mate_in_one (.jsonl, .jsonl.gz or shards; default data/); a missing one skips its suite, "
                    "none at all is an error")
    add_config_arguments(ap, EvalConfig, metavars={"layout": "{" + ",".join(tasks.LAYOUTS) + "}"})
    ap.add_argument("--device", default="auto", help="auto (cuda when available), cpu, cuda, cuda:N (default: auto)")
    ap.add_argument("--json", action="store_true", help="print results as one JSON object")
    ap.add_argument("--every-checkpoint", action="store_true",
                    help="MODEL is a `rookworld sft` run directory: evaluate each of its checkpoints on the P: and A: "
                         "suites (a learning curve), print the table and write <run>/curve.json")
    args = ap.parse_args(argv)
    # options another makes void (on the command line only: a config of samples=0 keeps a sample temperature
    # to turn them on again with dataclasses.replace): one line, as a config check's
    if args.samples == 0 and args.sample_temperature is not None:
        raise ValueError("--sample-temperature has no effect with --samples 0 (greedy only): give --samples K, or leave it out")
    if args.decoding == "greedy" and args.temperature != EvalConfig.temperature:
        raise ValueError("--temperature has no effect with greedy decoding (the default --decoding): give --decoding "
                         "sampled, or leave it out (pass@1 samples take --sample-temperature)")
    if args.selfplay_max_plies != EvalConfig.selfplay_max_plies and (args.selfplay_games == 0 or args.every_checkpoint):
        raise ValueError("--selfplay-max-plies has no effect without self-play (" + ("--every-checkpoint runs the P: and "
                         "A: suites only" if args.every_checkpoint else "--selfplay-games 0") + "): leave it out")
    # refused: values that would turn on what the mode does not run (0, turning it off, says what the run does)
    if args.every_checkpoint and (given := [flag for flag, on in (
            ("--selfplay-games", args.selfplay_games not in (EvalConfig.selfplay_games, 0)),
            ("--max-mate", args.max_mate not in (None, 0))) if on]):
        raise ValueError(f"--every-checkpoint evaluates the P: and A: suites only: {', '.join(given)} would be ignored; leave it out")
    cfg = EvalConfig(**config_kwargs_from_args(EvalConfig, args))  # bad values stop here, before the model loads
    device = resolve_device(args.device)
    if args.every_checkpoint:
        return _curve_cli(args, cfg)
    suites = load_test_suites(args.data_dir)  # before the model loads: missing data or no suite stop here
    if not (chosen := selected_suites(suites["P"], suites["A"], suites["M1"], cfg)):
        raise ValueError("no suite selected: no suite with test records is left on (--max-policy / --max-env / "
                         "--max-mate 0 turn the policy / env / mate-in-one suite off) and --selfplay-games is 0; select "
                         "one with --selfplay-games N, --max-policy N, --max-env N, --max-mate N or a --data-dir holding "
                         "that suite's test data")
    if not {"policy", "env"} & set(chosen) and (given := [flag for flag, on in (
            ("--samples", args.samples not in (EvalConfig.samples, 0)), ("--sample-temperature", args.sample_temperature is not None)) if on]):
        raise ValueError(f"{', '.join(given)}: pass@1 is measured on the P: and A: suites, and neither runs here: leave it out")
    model = GPT.from_pretrained(args.model).eval().to(device)
    cfg = _say_settings(cfg, model, args)
    results = evaluate_all(model, suites["P"], suites["A"], suites["M1"], cfg)
    if args.json:
        print(json.dumps({"settings": eval_settings(cfg, args.model), **results_to_json(results)}, allow_nan=False))
    else:
        print(terminal_table(results, model_label(args.model)))
    return 0


def _say_settings(cfg: EvalConfig, model, args) -> EvalConfig:
    """cfg resolved for the model, its settings said on stderr: layout, prefix, budget, decoding, and the pass@1
    temperature with where it came from (1.0 for a model that records none: an SFT export's pass@1 is then not
    comparable with its GRPO export's, sampled at the rollout temperature, unless --sample-temperature sets both)."""
    given_t, cfg = cfg.sample_temperature, cfg.for_model(model)
    source = ("--sample-temperature" if given_t else f"{ROLLOUT_TEMPERATURE_KEY} in config.json"
              if ROLLOUT_TEMPERATURE_KEY in model.meta else
              "the model records no rollout temperature: to compare with a GRPO export, give its --sample-temperature")
    layout_from = "--layout" if args.layout else read_layout(args.model)[1] if Path(args.model, "config.json").is_file() else "checkpoint"
    print(f"layout: {cfg.layout} ({layout_from}); prompt prefix {cfg.prompt_prefix!r}; max_new_tokens {cfg.max_new_tokens}; "
          + ("greedy" if cfg.decoding == "greedy" else f"sampled decoding at T {cfg.temperature:g}")
          + (f"; pass@1 over {cfg.samples} samples at T {cfg.sample_temperature:g} ({source})" if cfg.samples else ""),
          file=sys.stderr)
    return cfg


def eval_settings(cfg: EvalConfig, model: str | Path) -> dict:
    """What an evaluation did, beside its results in --json and curve.json: the model and every EvalConfig field
    (resolved for the model: layout, prefix, budget, sample temperature)."""
    return {"model": str(model), **asdict(cfg)}


def model_label(path: str | Path) -> str:
    """A model directory's name for a table: `<run>/final` (or `/step_N`) rather than a bare "final"."""
    p = Path(path).resolve()
    return f"{p.parent.name}/{p.name}" if p.name == "final" or p.name.startswith("step") else p.name


_SUITE_NAMES = {"P": "policy", "A": "env", "M1": "mate-in-one"}
_SUITE_SPLIT = {"P": "test", "A": "test", "M1": None}  # the mate-in-one set is one file of val and test records


def load_test_suites(data_dir=None, keys: Sequence[str] = ("P", "A", "M1")) -> dict[str, list]:
    """The test records of each suite (P, A, M1) in a data directory (default data/), read by
    data.load_split / load_mate_in_one (plain, .gz or sharded files). A missing suite is an empty list
    and a line on stderr; a directory holding none of them raises, naming the files looked for."""
    base = Path(data_dir or data.DATA_DIR)
    found = {k: data.split_files(k, _SUITE_SPLIT[k], base) for k in keys}
    if not any(found.values()):
        raise ValueError(f"{base}{data.not_a_folder(base)}: no test data: looked for "
                         + "; ".join(data.looked_for(k, _SUITE_SPLIT[k]) for k in keys)
                         + " (`rookworld datagen --out DIR` or `rookworld convert ... --split test --out DIR` writes them)")
    suites = {}
    for k in keys:
        if k == "M1" and found[k]:
            suites[k] = [r for r in data.load_mate_in_one(base) if r["split"] == "test"]
        else:
            suites[k] = data.load_split(k, "test", base).records if found[k] else []
        if not suites[k]:
            why = "its file holds no test records" if found[k] else f"no {data.looked_for(k, _SUITE_SPLIT[k])}"
            print(f"{base}: {why}: the {_SUITE_NAMES[k]} suite is skipped", file=sys.stderr)
    return suites


def _curve_cli(args, cfg: EvalConfig) -> int:

    suites = load_test_suites(args.data_dir, ("P", "A"))

    def show(row):
        print(json.dumps({k: v["value"] if isinstance(v, dict) else v for k, v in row.items()}), file=sys.stderr)

    run = Path(args.model)
    if not run.is_dir():  # before the lock, which would make the folder
        raise CheckpointLoadError(f"{run}: no such folder; --every-checkpoint takes a `rookworld sft` --out")
    if not (run / METRICS_FILE).exists() and (run / GRPO_METRICS_FILE).exists():
        raise ValueError(f"{run} is a GRPO run; --every-checkpoint evaluates the checkpoints of a `rookworld sft` run")
    _curve_checkpoints(run, verify=False)  # before the lock, which would leave a .lock in a folder given by mistake
    # a run still training there would rotate its checkpoints away mid-curve: refused before any work
    with run_lock(run, busy="a run training there, or another curve of it; wait for it to finish"):
        _say_settings(cfg, model_from_checkpoint(_curve_checkpoints(run)[0][1]), args)  # every checkpoint intact
        rows = checkpoint_curve(run, suites["P"], suites["A"], cfg, on_point=show, device=args.device)  # capped by cfg.max_*
        settings = eval_settings(cfg, run)  # the pass@1 temperature as given (None: each checkpoint's own, else 1.0)
        rows = [{**row, "settings": settings} for row in rows]
        out = run / "curve.json"
        if out.exists():  # an earlier curve (hours of evaluation, perhaps on more positions) is kept beside it
            print(f"the previous curve: {keep_aside(out)}", file=sys.stderr)
        atomic_write(out, lambda f: f.write((json.dumps(rows, indent=1) + "\n").encode()))
    print(json.dumps(rows) if args.json else curve_table(rows).to_string())
    print(f"written: {out}", file=sys.stderr)
    return 0
