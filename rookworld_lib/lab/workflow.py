"""The end-to-end workflow of notebook 05: profiles, stage timing and the training report.

A profile holds the SFT, GRPO and evaluation configs of every stage for one kind of machine:
- `ci`: seconds per stage, for nbval and tests; shows the plumbing, not learning;
- `cpu`: a small model on 2 CPU cores, all of `make run` in 9-29 minutes by host (README); SFT trains over
  the task's tokens only (`SFTConfig.vocab="task"`: 4.4-7.6x the tokens per second of a full GPT-2 head
  at this size) and the evaluations cover the whole test split;
- `cpu-long`: about 2 h 42-54 min on 2 CPU cores (estimated from stages timed as one command: the
  AMD VM's run with 12,000 SFT steps, an Intel VM's up to GRPO; docs/learning_curve.md): its own training data first (`datagen`: 1,400 games, every move an `A:` record,
  none of the shipped val/test positions), then a 6 x 192 model for 33M tokens (16,000 steps), its
  `P:` candidates sorted by move text (`candidate_order="uci"`: the greedy answer stops repeating
  one), checkpoints along SFT for the curve, GRPO with the `cpu` recipe for four times its steps
  (600), evaluation on the shipped test split;
- `gpu`: GPT-2 124M with bf16 autocast and torch.compile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..core import grpo as grpo_lib
from ..core import progress
from ..core.config import is_int
from ..chess.data import split_paths
from ..chess.datagen import DatagenConfig
from ..chess.engine import usable_cores
from ..chess.evaluate import EvalConfig, Estimate
from ..chess.tasks import COMPLETION_BUDGET
from ..chess.training import task_weights, training_tasks
from ..core.train_grpo import GRPOTrainConfig
from ..core.train_sft import SFTConfig
from ..core.train_utils import setup_runtime


@dataclass(frozen=True)
class Profile:
    """One kind of machine's sizes for every stage of notebook 05 (the fields say what each run fills in)."""

    name: str  # profile name
    sft: SFTConfig  # SFT from scratch (train/val data, out_dir, seed: see sft_config)
    grpo: GRPOTrainConfig  # GRPO after SFT (out_dir, seed, completion budget: see grpo_config)
    eval: EvalConfig  # before/after evaluation (budget, layout, seed: see eval_config)
    heldout: int  # test records (half P:, half A:) for the held-out reward comparison
    datagen: dict | None = None  # DatagenConfig fields of the profile's own training data; None: the shipped set
    reward: str = "graded"  # GRPO's reward (chess.training.reward_functions): "graded" or "gated"
    candidate_order: str = "layout"  # how SFT writes the P: candidates (chess.training.CANDIDATE_ORDERS)

    def summary(self, init_from: str | None = None, layout: str = "compact"):
        """The sizes a reader checks, one line per stage (a DataFrame; the full settings are the fields), for
        a run in `layout` that trains from scratch or, given init_from, starts GRPO from that model."""
        s, g, e = self.sft, self.grpo, self.eval
        every = lambda n: "all" if n is None else n  # noqa: E731
        own = self.datagen is not None and not init_from
        data = f"own: {self.datagen.get('games', '?')} games (datagen)" if own else "shipped set"
        shape = ", ".join(f"{k}={v}" for k, v in s.model_overrides.items() if k != "pad_vocab_to_multiple")
        rows = {
            "data": data,
            "SFT": f"none: GRPO starts from {init_from}" if init_from else
                   f"{s.model}{f' ({shape})' if shape else ''} on {s.device}, {s.max_steps} steps x {s.batch_size * s.grad_accum} x {s.block_size} tokens, "
                   f"lr {s.lr:g}, vocab {s.vocab}, P: candidates in {self.candidate_order} order",
            "GRPO": f"{g.steps} steps x {g.prompts_per_step} prompts x {g.group_size} samples, <= {_budget(self, layout)} tokens, "
                    f"T {g.temperature:g}, lr {g.lr:g}, KL {g.loss.beta:g}, reward {self.reward}",
            "evaluation": f"P: {every(e.max_policy)}, A: {every(e.max_env)}, mate-in-one {every(e.max_mate)}, "
                          f"self-play {e.selfplay_games} games, pass@1 over {e.samples} samples, held-out reward on {self.heldout}",
        }
        return pd.DataFrame({"profile " + self.name: rows})


def _profile(name, device, model, *, sft: dict, grpo: dict, beta: float, evals: dict, heldout: int,
             dtype: str = "fp32", pad_vocab_to_multiple: int = 1, compile: bool = False, model_overrides: dict | None = None,
             datagen: dict | None = None, candidate_order: str = "layout") -> Profile:
    # pad_vocab_to_multiple=64 on GPU: LM-head matmuls on fast kernels, 1.5x faster steps (docs/perf.md)
    return Profile(
        name,
        SFTConfig(**{**dict(model=model, device=device, dtype=dtype, compile=compile, eval_steps=4, checkpoint_interval=0,
                            task_weights=task_weights(),
                            model_overrides={"pad_vocab_to_multiple": pad_vocab_to_multiple, **(model_overrides or {})}),
                     **sft}),
        GRPOTrainConfig(device=device, dtype=dtype, warmup_steps=0, task_weights=task_weights(),
                        export_hf=False, checkpoint_interval=0,  # notebook 05 exports to <run>/training/final;
                        # a run's folder is new (resume finds nothing), but a training cell stopped by Ctrl-C saves
                        # a checkpoint, and running it again resumes there (resume=True, the configs' default)
                        loss=grpo_lib.GRPOConfig(beta=beta), **grpo),  # GRPOTrainer scores at the sampling temperature
        EvalConfig(**{"samples": 4, **evals}), heldout, datagen, candidate_order=candidate_order)


# the cpu profile's GRPO (docs/grpo.md, one change at a time on one SFT model): the graded reward,
# sampled at T=0.3 (near the greedy answers evaluated), 16 prompts x 4 per step for 150 steps (9,600
# completions; over the task vocabulary a step costs what an SFT step does), lr 5e-5, KL 0.04: legal
# best moves +13.3 points [+7.8, +18.9], valid A: +14.0 [+6.6, +21.4], nothing down. Its 72-token budget cuts
# short the one shipped answer longer than that (A:, 73 tokens with EOT; tasks.COMPLETION_BUDGET)
_CPU_GRPO = dict(steps=150, prompts_per_step=16, group_size=4, max_new_tokens=72, lr=5e-5, minibatch_size=32,
                 temperature=0.3)
_CPU_EVALS = dict(evals=dict(max_policy=None, max_env=None, max_mate=50, selfplay_games=8, selfplay_max_plies=40),
                  heldout=160)  # the whole test split


PROFILES = {
    "ci": _profile("ci", "cpu", "tiny", sft=dict(max_steps=8, batch_size=4, block_size=128, lr=3e-3, warmup_steps=2,
                                                 vocab="task"),
                   grpo=dict(steps=2, prompts_per_step=4, group_size=4, max_new_tokens=24, lr=1e-4, minibatch_size=16),
                   beta=0.04, evals=dict(max_policy=8, max_env=8, max_mate=4, selfplay_games=2, selfplay_max_plies=4),
                   heldout=8),
    "cpu": _profile("cpu", "cpu", "cpu-small",
                    sft=dict(max_steps=3000, batch_size=8, block_size=256, lr=2e-3, warmup_steps=100, vocab="task"),
                    grpo=_CPU_GRPO, beta=0.04, **_CPU_EVALS),
    # About 2 h 42-54 min on 2 idle cores (estimated: 2 h 19 min measured as one command with 12,000 SFT
    # steps on an AMD VM, plus 4,000 steps at 0.34 s; on an Intel VM, stages up to GRPO as one command):
    # data 16-26 min (1,400 games: ~71k P: labels, ~196k A: moves), SFT 16,000
    # steps of 8 x 256 tokens (33M tokens, 87-93 min; a checkpoint every 4,000 steps for the learning curve:
    # `rookworld eval <run>/training/sft --every-checkpoint`), GRPO with cpu's recipe.
    # Twice the data and steps of 700 games and 6,000 steps: legal best moves 33.7% -> 51.0%, exact next
    # positions 0.4% -> 18.6% (docs/learning_curve.md). The P: candidates sorted by move text (docs/grpo.md
    # section 4): on the same data, format-valid P: answers 0.0% -> 10.1% after SFT, 0.4% -> 11.8% after GRPO.
    # GRPO runs 600 steps, not cpu's 150 (~40 min, not ~9): on the same SFT model, format-valid P: 11.8% ->
    # 20.3%, legal best moves 60.0% -> 68.8% (docs/learning_curve.md, "GRPO four times as long").
    # 16,000 SFT steps, not 12,000 (600 GRPO steps after each, seed 0): format-valid P: 20.3% -> 35.5%, legal
    # best moves 68.8% -> 74.2%, exact next positions 24.7% -> 33.8%, nothing down (docs/learning_curve.md,
    # "More SFT or more GRPO")
    "cpu-long": _profile("cpu-long", "cpu", "cpu-small", model_overrides=dict(n_layer=6, n_embd=192, n_head=6),
                         sft=dict(max_steps=16000, batch_size=8, block_size=256, lr=2e-3, warmup_steps=200,
                                  vocab="task", checkpoint_interval=4000, keep_checkpoints=0),
                         grpo=dict(_CPU_GRPO, steps=600), beta=0.04, **_CPU_EVALS,
                         datagen=dict(games=1400, policy_rate=0.5, env_rate=1.0, mate_games=0, seed=20261125),
                         candidate_order="uci"),
    "gpu": _profile("gpu", "cuda", "gpt2",
                    sft=dict(max_steps=4000, batch_size=32, block_size=512, lr=6e-4, warmup_steps=200),
                    grpo=dict(steps=200, prompts_per_step=64, group_size=8, max_new_tokens=96, lr=1e-6,
                              minibatch_size=128),
                    beta=0.04, evals=dict(max_policy=1000, max_env=1000, max_mate=500, selfplay_games=64,
                                          selfplay_max_plies=200),
                    heldout=1000, dtype="auto", pad_vocab_to_multiple=64, compile=True),
}


def resolve(name: str, *, device: str | None = None, dtype: str | None = None, sft_steps: int | None = None,
            grpo_steps: int | None = None) -> Profile:
    """A named profile with the notebook's overrides applied (None keeps the profile's value)."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; choose one of {sorted(PROFILES)}")
    for field, steps in (("sft_steps", sft_steps), ("grpo_steps", grpo_steps)):  # else a warmup_steps error, say
        if steps is not None and not is_int(steps, 1):
            raise ValueError(f"resolve: {field} must be an integer >= 1 (None: the profile's), got {steps!r}")
    p = PROFILES[name]
    sft = {key: value for key, value in (("device", device), ("dtype", dtype)) if value is not None}
    grpo = dict(sft)
    if sft_steps is not None:
        sft.update(max_steps=sft_steps, warmup_steps=min(p.sft.warmup_steps, sft_steps))
    if grpo_steps is not None:
        grpo["steps"] = grpo_steps
    return dataclasses.replace(p, sft=dataclasses.replace(p.sft, **sft), grpo=dataclasses.replace(p.grpo, **grpo))


def sft_config(p: Profile, out_dir: Path, data_dir: Path, seed: int, train_dir: Path | None = None) -> SFTConfig:
    """The profile's SFT settings for one run: the train files of train_dir (default: data_dir), the
    val files of data_dir, ten val-loss points."""
    d, t = Path(data_dir), Path(train_dir or data_dir)
    training_tasks(t)  # none there: named here (SFT's "no training data: set SFTConfig.train_data" names no folder)
    return dataclasses.replace(
        p.sft, train_data=split_paths("train", t), val_data=split_paths("val", d), min_lr=p.sft.lr / 10,
        seed=seed, eval_interval=max(1, p.sft.max_steps // 10), out_dir=str(out_dir))


def datagen_config(p: Profile, out_dir: Path, exclude_dir: Path, workers: int | None = None):
    """The profile's own training data: generated into out_dir, never on exclude_dir's val/test positions."""
    return DatagenConfig(**{**p.datagen, "out_dir": str(out_dir), "exclude_dir": str(exclude_dir),
                            "workers": workers or usable_cores()})


def _budget(p: Profile, layout: str) -> int:
    # the profile's budget, raised to what an original-layout completion needs (tasks.COMPLETION_BUDGET)
    own = p.grpo.max_new_tokens
    if layout not in COMPLETION_BUDGET:
        raise ValueError(f"layout must be one of {sorted(COMPLETION_BUDGET)}, got {layout!r}")
    return own if layout == "compact" else max(own, COMPLETION_BUDGET[layout])


def grpo_config(p: Profile, out_dir: Path | None, seed: int, layout: str = "compact") -> GRPOTrainConfig:
    """The profile's GRPO settings for one run (the completion budget fits the layout; out_dir None: keep nothing)."""
    budget = _budget(p, layout)
    return dataclasses.replace(p.grpo, max_new_tokens=budget, seed=seed, out_dir=None if out_dir is None else str(out_dir),
                               loss=dataclasses.replace(p.grpo.loss, max_completion_length=budget))


def eval_config(p: Profile, seed: int, layout: str = "compact") -> EvalConfig:
    """The profile's evaluation settings (room for 24 tokens beyond the GRPO budget; pass@1 sampled at
    GRPO's rollout temperature)."""
    return dataclasses.replace(p.eval, max_new_tokens=_budget(p, layout) + 24, layout=layout, seed=seed,
                               sample_temperature=p.grpo.temperature)


def onpolicy_ratio_tolerance(p: Profile) -> float:
    """The largest |ratio - 1| allowed on a step's first, on-policy minibatch: float error only.

    fp32 sampler and scorer differ in summation order only: on the cpu profile's SFT model at T = 0.3
    their token log-probs differ by 6e-7 (median), at most 4e-5, and the step's deviation grew to 4.5e-4
    over a cpu run's 150 steps (measured 2026-11-29), to 7.9e-4 since the KL clamp of 2026-12-03 (an
    AMD EPYC VM with AVX-512, step 113 of `make run` at e11f9d4); under bf16 each rounds its own activations (a few
    percent per token); beyond 0.1 something else is at work."""
    half = setup_runtime(p.grpo.device, p.grpo.dtype).amp_dtype is not None  # "auto": bf16 only where CUDA has it
    return 0.1 if half else 1e-3


GRPO_SUMMARY_COLUMNS = {"step": "step", "reward": "reward", "kl": "KL", "entropy": "entropy",
                        "clip_ratio/region_mean": "clipped", "frac_reward_zero_std": "tied groups",
                        "completions/mean_length": "tokens", "ratio/onpolicy_dev": "on-policy |ratio-1|",
                        "time/sampling": "sampling (s)", "time/scoring": "scoring (s)", "time/update": "update (s)"}


def grpo_summary(history: list[dict], last: int = 10):
    """The last GRPO steps' key metrics as a table with short headers (the metric keys are in
    GRPO_SUMMARY_COLUMNS). Columns a run does not log are left out: `kl` exists only with a reference
    model (beta > 0), `entropy` only when logits are scored."""
    frame = pd.DataFrame(history)
    if "step" not in frame.columns:  # no step logged yet: an empty table, not a KeyError
        return pd.DataFrame()
    keep = [c for c in GRPO_SUMMARY_COLUMNS if c in frame.columns]
    return frame[keep].tail(last).rename(columns=GRPO_SUMMARY_COLUMNS).set_index("step")


class StageTimer:
    """Wall time per named stage: `with timer("SFT"): ...`; `timer.seconds` keeps the record. Each
    stage's start and end ("done", "interrupted", or "failed" when it raised) are also progress lines of a
    `rookworld run` (`progress.report`)."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, stage: str):
        t0 = time.perf_counter()
        progress.report(f"{stage} started")
        outcome = "failed"
        try:
            yield
            outcome = "done"
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM in a training loop: it saved a checkpoint, it did not fail
            outcome = "interrupted"
            raise
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - t0
            progress.report(f"{stage} {outcome} ({time.perf_counter() - t0:.1f} s)")


def reward_trend(history: list[dict]):
    """Did the sampled reward rise? Per reward key that the run logged (rewards/<task>/mean, and each
    reward function's rewards/<name>/mean), the mean over the first and the last quarter of the steps."""
    # each task's total first, then its reward functions (a task's only function that repeats its total at
    # every step, as A/reward does, is left out; of several, each is a component, even where it equals the total)
    keys = sorted({k for r in history for k in r if k.startswith("rewards/") and k.endswith("/mean")},
                  key=lambda k: (k.split("/")[1], k.count("/"), k))
    functions = Counter(k.split("/")[1] for k in keys if k.count("/") == 3)
    keys = [k for k in keys if not (k.count("/") == 3 and functions[k.split("/")[1]] == 1 and all(
        r.get(k) == r.get(f"rewards/{k.split('/')[1]}/mean") for r in history))]
    q = max(1, len(history) // 4)
    rows = {}
    for key in keys:
        first = [r[key] for r in history[:q] if r.get(key) is not None]
        last = [r[key] for r in history[-q:] if r.get(key) is not None]
        if first and last:
            a, b = sum(first) / len(first), sum(last) / len(last)
            rows[key.removeprefix("rewards/").removesuffix("/mean")] = {"first quarter": round(a, 4),
                                                                        "last quarter": round(b, 4),
                                                                        "change": round(b - a, 4)}
    return pd.DataFrame.from_dict(rows, orient="index")


def improvement_verdict(diff: Estimate, metric: str = "held-out reward") -> str:
    """A plain sentence on whether a before/after difference is resolved at 95%."""
    if diff.n == 0:
        return f"No {metric} comparison was made."
    where = f"{diff.value:+.4f} (95% CI [{diff.low:+.4f}, {diff.high:+.4f}], n={diff.n})"
    if diff.low > 0:
        return f"GRPO improved the {metric} by {where}; the interval excludes zero."
    if diff.high < 0:
        return f"GRPO lowered the {metric} by {where}; the interval excludes zero."
    return (f"GRPO changed the {metric} by {where}; the interval includes zero, so this run does not show an "
            f"improvement at 95% confidence.")


def chess_verdict(strict) -> str:
    """One sentence on the strict chess metrics (an `evaluate.paired_change` table): which moved."""
    if strict.empty:
        return "No strict chess metric was measured."
    moved = [f"{m} {row['moved']} ({row['change (points)']} points)" for m, row in strict.iterrows()
             if row["moved"] != "no resolved change"]
    if not moved:
        return ("GRPO moved no strict chess metric at 95% confidence (" + ", ".join(strict.index) + ": "
                "every interval includes zero).")
    return "Strict chess metrics that GRPO moved at 95% confidence: " + "; ".join(moved) + "; the others showed no change resolved at 95%."


def signal_line(history: list[dict]) -> str | None:
    """A sentence on GRPO's learning signal: the share of sampled completions in groups whose rewards
    differed (1 - TRL's `frac_reward_zero_std`), and a warning when no step had any (every advantage 0)."""
    tied = [r["frac_reward_zero_std"] for r in history if r.get("frac_reward_zero_std") is not None]
    if not tied:
        return None
    if min(tied) >= 1.0 - 1e-9:
        return (f"**Learning signal: none.** In all {len(tied)} GRPO steps the completions of every group scored "
                "alike (`frac_reward_zero_std` 1.0), so every advantage was zero: whatever changed below, the "
                "reward did not drive it.")
    mean = sum(tied) / len(tied)
    return (f"**Learning signal:** {100 * (1 - mean):.0f}% of the sampled completions were in groups whose rewards "
            f"differed (mean over {len(tied)} GRPO steps; `frac_reward_zero_std` {mean:.2f}).")


def start_label(init_from: str | None) -> str:
    """The name of the model GRPO starts from, in tables: "SFT", or "init_from" for a model brought in."""
    return "init_from" if init_from else "SFT"


def training_report(profile: Profile, table, diff: Estimate, seconds: dict[str, float], strict=None,
                    grpo_history: list[dict] | None = None, init_from: str | None = None) -> str:
    """Markdown for the run report: stage times, the before/after table, GRPO's learning signal, the
    strict chess metrics (an `evaluate.paired_change` table) and the verdicts; init_from: the model
    GRPO started from, when no SFT ran."""
    g, shape = profile.grpo, profile.sft.model_config()
    start = f"GRPO from {init_from}" if init_from else (f"{profile.sft.model} at {shape.n_layer} x {shape.n_embd}, "
                                                        f"{profile.sft.max_steps} SFT steps")
    lines = [f"## Training ({profile.name} profile: {start}, {g.steps} GRPO steps of {g.prompts_per_step}x{g.group_size})", "",
             "| stage | wall time (s) |", "| --- | ---: |"]
    lines += [f"| {k} | {v:.1f} |" for k, v in seconds.items()]
    steps_s = sum(r.get("time/step") or 0.0 for r in grpo_history or [])
    lines += ["", "Wall times are this session's: a run continued with `rookworld run --resume` counts only what it "
              "ran after the resume" + (f"; GRPO's {len(grpo_history)} steps took {steps_s:.1f} s in all (their "
                                        "`time/step`, over every session)" if grpo_history else "") + "."]
    lines += ["", markdown_table(table), ""]
    if any(str(m).startswith("pass@1/") for m in table.index):
        lines += [interval_note(profile), ""]
    if signal := signal_line(grpo_history or []):
        lines += [signal, ""]
    lines += [f"**Verdict:** {improvement_verdict(diff)}"]
    if strict is not None:
        before = start_label(init_from)
        lines += ["", f"Strict chess metrics, {before} vs {before}+GRPO on the same test records (paired 95% intervals):", "",
                  markdown_table(strict), "", f"**Chess verdict:** {chess_verdict(strict)}"]
    return "\n".join(lines) + "\n"


def interval_note(profile: Profile) -> str:
    """What the report's intervals are, for a table with pass@1 rows (their n reads like a greedy rate's)."""
    k = profile.eval.samples
    return (f"Rates carry Wilson 95% intervals over the n test records. A `pass@1/` rate is the mean over each "
            f"record's {k} samples at T {profile.grpo.temperature:g}; its interval is Wilson's at the effective "
            f"number of independent draws, between n and n x {k} (`evaluate.pass_at_1`), so it can be narrower "
            f"than a greedy rate's at the same n. A change's interval comes from the paired per-record "
            f"differences (`evaluate.paired_change`), not from the two levels' intervals.")


def markdown_table(df) -> str:
    """A pandas DataFrame as a Markdown table (index first), without the optional tabulate package."""
    cols = [df.index.name or ""] + [str(c) for c in df.columns]
    rows = [[str(i)] + [str(v) for v in row] for i, row in zip(df.index, df.itertuples(index=False))]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])
