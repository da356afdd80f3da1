"""The end-to-end workflow of notebook 05: profiles, stage timing and the training report.

A profile fixes the size of every stage (data, SFT, evaluation, GRPO) for one kind of machine:
- `ci`: seconds per stage, for nbval and tests; shows the plumbing, not learning;
- `cpu`: a small model on 2 CPU cores, all of `make run` within about 20 minutes;
- `gpu`: GPT-2 124M with bf16 autocast and torch.compile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from . import grpo
from .evaluate import EvalConfig, Estimate
from .tasks import COMPLETION_BUDGET
from .train_grpo import GRPOTrainConfig
from .train_sft import SFTConfig


@dataclass(frozen=True)
class Profile:
    """Sizes and settings of every stage of the full training workflow."""

    name: str  # profile name
    device: str  # "cpu", "cuda" or "auto"
    model: str  # GPTConfig preset trained from scratch
    sft_steps: int  # SFT optimizer steps
    sft_batch_size: int  # packed sequences per SFT step
    sft_block_size: int  # tokens per packed sequence
    sft_lr: float  # SFT peak learning rate
    sft_warmup: int  # SFT warm-up steps
    grpo_steps: int  # GRPO steps
    grpo_prompts: int  # prompts per GRPO step
    grpo_group: int  # completions per prompt (G)
    grpo_max_new_tokens: int  # completion budget while sampling
    grpo_lr: float  # GRPO peak learning rate
    grpo_beta: float  # KL coefficient (0 = no reference model)
    grpo_minibatch: int  # completions per GRPO optimizer step
    grpo_mu: int  # inner passes per rollout batch
    grpo_policy_fraction: float  # share of P: prompts in GRPO
    eval_policy: int  # P: test records evaluated
    eval_env: int  # A: test records evaluated
    eval_mate: int  # mate-in-one test records evaluated
    selfplay_games: int  # self-play games
    selfplay_max_plies: int  # cap on half-moves per self-play game
    heldout: int  # test records (half P:, half A:) for the held-out reward comparison
    dtype: str = "fp32"  # SFT/GRPO precision ("auto" = bf16 on CUDA)
    compile: bool = False  # torch.compile for SFT
    pad_vocab_to_multiple: int = 1  # embedding/LM-head rows padded to a multiple (64 on GPU: 1.5x faster steps, docs/perf.md)


PROFILES = {
    "ci": Profile("ci", "cpu", "tiny", sft_steps=8, sft_batch_size=4, sft_block_size=128, sft_lr=3e-3, sft_warmup=2,
                  grpo_steps=2, grpo_prompts=4, grpo_group=4, grpo_max_new_tokens=24, grpo_lr=1e-4, grpo_beta=0.04,
                  grpo_minibatch=16, grpo_mu=1, grpo_policy_fraction=0.5, eval_policy=8, eval_env=8, eval_mate=4,
                  selfplay_games=2, selfplay_max_plies=4, heldout=8),
    "cpu": Profile("cpu", "cpu", "cpu-small", sft_steps=300, sft_batch_size=8, sft_block_size=256, sft_lr=2e-3,
                   sft_warmup=30, grpo_steps=40, grpo_prompts=8, grpo_group=4, grpo_max_new_tokens=72, grpo_lr=2e-4,
                   grpo_beta=0.0, grpo_minibatch=16, grpo_mu=1, grpo_policy_fraction=0.5, eval_policy=100,
                   eval_env=100, eval_mate=50, selfplay_games=8, selfplay_max_plies=40, heldout=160),
    "gpu": Profile("gpu", "cuda", "gpt2", sft_steps=4000, sft_batch_size=32, sft_block_size=512, sft_lr=6e-4,
                   sft_warmup=200, grpo_steps=200, grpo_prompts=64, grpo_group=8, grpo_max_new_tokens=96, grpo_lr=1e-6,
                   grpo_beta=0.04, grpo_minibatch=128, grpo_mu=1, grpo_policy_fraction=0.5, eval_policy=1000,
                   eval_env=1000, eval_mate=500, selfplay_games=64, selfplay_max_plies=200, heldout=1000,
                   dtype="auto", compile=True, pad_vocab_to_multiple=64),
}


def resolve(name: str, **overrides) -> Profile:
    """A named profile with any non-None field overridden (notebook parameters default to None)."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; choose one of {sorted(PROFILES)}")
    return dataclasses.replace(PROFILES[name], **{k: v for k, v in overrides.items() if v is not None})


def sft_config(p: Profile, out_dir: Path, data_dir: Path, seed: int, layout: str = "compact") -> SFTConfig:
    d = Path(data_dir)
    return SFTConfig(model=p.model, train_data=(str(d / "policy_train.jsonl"), str(d / "env_train.jsonl")),
                     val_data=(str(d / "policy_val.jsonl"), str(d / "env_val.jsonl")), layout=layout,
                     block_size=p.sft_block_size, batch_size=p.sft_batch_size, lr=p.sft_lr, min_lr=p.sft_lr / 10,
                     warmup_steps=p.sft_warmup, max_steps=p.sft_steps, device=p.device, dtype=p.dtype,
                     compile=p.compile, seed=seed, eval_interval=max(1, p.sft_steps // 10), eval_steps=4,
                     checkpoint_interval=0, out_dir=str(out_dir), resume=False, export_hf=True, progress=True,
                     model_overrides={"pad_vocab_to_multiple": p.pad_vocab_to_multiple})


def _budget(p: Profile, layout: str) -> int:
    # the profile's budget, raised to what an original-layout completion needs (tasks.COMPLETION_BUDGET)
    return p.grpo_max_new_tokens if layout == "compact" else max(p.grpo_max_new_tokens, COMPLETION_BUDGET[layout])


def grpo_config(p: Profile, out_dir: Path, seed: int, layout: str = "compact") -> GRPOTrainConfig:
    budget = _budget(p, layout)
    return GRPOTrainConfig(steps=p.grpo_steps, prompts_per_step=p.grpo_prompts, group_size=p.grpo_group,
                           policy_fraction=p.grpo_policy_fraction, max_new_tokens=budget,
                           mu=p.grpo_mu, minibatch_size=p.grpo_minibatch, lr=p.grpo_lr, warmup_steps=0,
                           dtype=p.dtype, device=p.device, seed=seed, out_dir=str(out_dir), resume=False,
                           loss=grpo.GRPOConfig(beta=p.grpo_beta, max_completion_length=budget))


def eval_config(p: Profile, seed: int, layout: str = "compact") -> EvalConfig:
    return EvalConfig(max_new_tokens=_budget(p, layout) + 24, max_policy=p.eval_policy, max_env=p.eval_env,
                      selfplay_games=p.selfplay_games, selfplay_max_plies=p.selfplay_max_plies, layout=layout,
                      seed=seed)


def onpolicy_ratio_tolerance(p: Profile) -> float:
    """The largest |ratio - 1| allowed on a step's first, on-policy minibatch: float error only.

    In fp32 the KV-cached sampler and the full-sequence scorer differ only in summation order
    (about 1e-6 per token). Under bf16 autocast each side rounds its own activations, so single
    tokens can differ by a few percent; beyond 0.1 something other than rounding is at work.
    """
    half = p.dtype in ("bf16", "fp16") or (p.dtype == "auto" and p.device in ("cuda", "auto")
                                            and torch.cuda.is_available())
    return 0.1 if half else 1e-3


GRPO_SUMMARY_COLUMNS = ("step", "reward_mean", "kl", "entropy", "clip_frac_region", "frac_reward_zero_std",
                        "completion_len_mean", "onpolicy_ratio_dev", "time_sampling", "time_scoring", "time_update")


def grpo_summary(history: list[dict], last: int = 10):
    """The last GRPO steps' key metrics as a table. Columns a run does not log are left out: `kl`
    exists only with a reference model (beta > 0), `entropy` only when logits are scored."""
    import pandas as pd

    frame = pd.DataFrame(history)
    return frame[[c for c in GRPO_SUMMARY_COLUMNS if c in frame.columns]].tail(last)


class StageTimer:
    """Wall time per named stage: `with timer("SFT"): ...`; `timer.seconds` keeps the record."""

    def __init__(self):
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, stage: str):
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - t0


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


def training_report(profile: Profile, table, diff: Estimate, seconds: dict[str, float]) -> str:
    """Markdown for the run report: stage times, the before/after table and the verdict."""
    lines = [f"## Training ({profile.name} profile: {profile.model}, {profile.sft_steps} SFT steps, "
             f"{profile.grpo_steps} GRPO steps of {profile.grpo_prompts}x{profile.grpo_group})", "",
             "| stage | wall time (s) |", "| --- | ---: |"]
    lines += [f"| {k} | {v:.1f} |" for k, v in seconds.items()]
    lines += ["", markdown_table(table), "", f"**Verdict:** {improvement_verdict(diff)}"]
    return "\n".join(lines) + "\n"


def markdown_table(df) -> str:
    """A pandas DataFrame as a Markdown table (index first), without the optional tabulate package."""
    cols = [df.index.name or ""] + [str(c) for c in df.columns]
    rows = [[str(i)] + [str(v) for v in row] for i, row in zip(df.index, df.itertuples(index=False))]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows])
