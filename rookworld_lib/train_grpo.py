"""The GRPO loop: sample groups, score them with verifiable rewards, update with the clipped loss.

One step:
1. draw `prompts_per_step` prompts (P: and A: mixed by `policy_fraction`);
2. sample `group_size` completions per prompt with the KV-cached sampler (dropout off);
3. score each completion with the chess rewards (ground truth from the data set where present);
4. compute group advantages; optionally drop zero-variance groups and refill (dynamic sampling);
5. run `mu` passes over the rollout in minibatches, each an optimizer step on `grpo_loss`, with
   the sampler's log-probs as the old policy and, when beta > 0, a frozen reference model.
Every step appends one JSON line of metrics. The model stays in eval mode throughout, so dropout
never perturbs the log-probs that the ratio compares (TRL's `disable_dropout`).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import random
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable

import torch

from . import grpo
from .model import GPT
from .sampling import SamplingConfig, generate, sequence_logprobs
from .tokenizer import EOT_ID, encode, get_tokenizer


@dataclass(frozen=True)
class PromptItem:
    """One training prompt: its task ("P" or "A"), the prompt text, and ground truth if known."""

    task: str
    prompt: str
    truth: dict | None = None


@dataclass
class GRPOTrainConfig:
    """Settings of the GRPO loop (the loss itself is configured by `loss`, a grpo.GRPOConfig)."""

    steps: int = 20  # optimizer-level GRPO steps (each = one rollout batch)
    prompts_per_step: int = 8  # prompts per rollout batch
    group_size: int = 4  # completions per prompt (G)
    policy_fraction: float = 0.5  # share of P: prompts; the rest are A: prompts
    max_new_tokens: int = 96  # completion budget; longer completions are truncated
    temperature: float = 1.0  # sampling temperature (also used to score log-probs)
    top_k: int = 0  # sampler top-k (0 = off; GRPO scores the full distribution)
    top_p: float = 1.0  # sampler nucleus (1 = off)
    mu: int = 1  # inner passes over each rollout batch (1 = strictly on-policy)
    minibatch_size: int = 16  # completions per optimizer step inside a pass
    lr: float = 1e-5  # peak learning rate
    min_lr_ratio: float = 0.1  # cosine floor as a fraction of lr
    warmup_steps: int = 0  # linear warm-up steps
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 1.0  # max global grad norm (0 = off)
    scale_rewards: str = "group"  # advantage scaling: "group", "batch" or "none" (Dr. GRPO)
    dynamic_sampling: bool = False  # drop zero-variance groups and refill (DAPO)
    max_refill_rounds: int = 3  # extra sampling rounds allowed per step when refilling
    loss: grpo.GRPOConfig = field(default_factory=grpo.GRPOConfig)  # the loss (clip, aggregation, KL, ...)
    max_nonfinite_in_a_row: int = 5  # stop after this many consecutive non-finite losses
    checkpoint_interval: int = 0  # steps between checkpoints (0 = only at the end, if out_dir)
    out_dir: str | None = None  # metrics.jsonl and checkpoints go here (None = nowhere)
    seed: int = 0  # seeds prompt order and sampling
    device: str = "cpu"  # "cpu" or "cuda"

    def __post_init__(self):
        positive = ("steps", "prompts_per_step", "group_size", "max_new_tokens", "mu", "minibatch_size",
                    "max_nonfinite_in_a_row")
        for name in positive:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"GRPOTrainConfig.{name} must be a positive integer, got {v!r}")
        if self.group_size < 2:
            raise ValueError(f"GRPOTrainConfig.group_size must be >= 2 (a group of one has no baseline), got {self.group_size}")
        if not 0.0 <= self.policy_fraction <= 1.0:
            raise ValueError(f"GRPOTrainConfig.policy_fraction must be in [0, 1], got {self.policy_fraction!r}")
        if not self.temperature > 0:
            raise ValueError(f"GRPOTrainConfig.temperature must be > 0, got {self.temperature!r}")
        if not self.lr > 0:
            raise ValueError(f"GRPOTrainConfig.lr must be > 0, got {self.lr!r}")
        if self.scale_rewards not in ("group", "batch", "none"):
            raise ValueError(f"GRPOTrainConfig.scale_rewards must be group, batch or none, got {self.scale_rewards!r}")
        for name in ("warmup_steps", "checkpoint_interval", "max_refill_rounds"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"GRPOTrainConfig.{name} must be an integer >= 0, got {v!r}")
        if self.grad_clip < 0 or self.weight_decay < 0:
            raise ValueError("GRPOTrainConfig.grad_clip and weight_decay must be >= 0")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"GRPOTrainConfig.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")


RewardFn = Callable[[PromptItem, str], float]


def prompt_items(records, layout: str = "compact") -> list[PromptItem]:
    """PromptItems from data-set records (rookworld_lib.data), each carrying its record as truth."""
    from .data import record_text

    return [PromptItem(r["task"], record_text(r, layout)[0], r) for r in records if r["task"] in ("P", "A")]


def default_reward(item: PromptItem, completion: str) -> float:
    """The chess rewards: policy or environment scorer by task, with ground truth when present."""
    from . import rewards

    score = rewards.score_policy if item.task == "P" else rewards.score_environment
    if item.truth is not None:
        return float(score(item.prompt, completion, truth=item.truth))
    return float(score(item.prompt, completion))


def lr_at(step: int, cfg: GRPOTrainConfig) -> float:
    """Linear warm-up, then cosine decay to lr * min_lr_ratio at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    span = max(1, cfg.steps - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / span)
    floor = cfg.lr * cfg.min_lr_ratio
    return floor + 0.5 * (cfg.lr - floor) * (1 + math.cos(math.pi * progress))


class PromptSampler:
    """Draws P:/A: prompts in the configured ratio, reshuffling each pool when it runs out."""

    def __init__(self, items: list[PromptItem], policy_fraction: float, seed: int):
        self.pools = {t: [i for i in items if i.task == t] for t in ("P", "A")}
        if policy_fraction > 0 and not self.pools["P"]:
            raise ValueError("policy_fraction > 0 but there are no P: prompts")
        if policy_fraction < 1 and not self.pools["A"]:
            raise ValueError("policy_fraction < 1 but there are no A: prompts")
        self.fraction = policy_fraction
        self.rng = random.Random(seed)
        self.order = {t: [] for t in self.pools}

    def _next(self, task):
        if not self.order[task]:
            self.order[task] = list(range(len(self.pools[task])))
            self.rng.shuffle(self.order[task])
        return self.pools[task][self.order[task].pop()]

    def draw(self, n: int) -> list[PromptItem]:
        n_policy = round(n * self.fraction)
        return [self._next("P") for _ in range(n_policy)] + [self._next("A") for _ in range(n - n_policy)]

    def state_dict(self):
        return {"rng": self.rng.getstate(), "order": copy.deepcopy(self.order)}

    def load_state_dict(self, state):
        self.rng.setstate(state["rng"])
        self.order = copy.deepcopy(state["order"])


@dataclass
class RolloutBatch:
    items: list[PromptItem]  # one per row (each prompt repeated group_size times)
    prompt_ids: list[list[int]]
    tokens: torch.Tensor
    old_logprobs: torch.Tensor
    mask: torch.Tensor
    truncated: torch.Tensor
    rewards: torch.Tensor
    completions: list[str]
    generated_tokens: int = 0


def collect_rollouts(model: GPT, items: list[PromptItem], cfg: GRPOTrainConfig, reward_fn: RewardFn,
                     tokenizer, seed: int, timings: dict) -> RolloutBatch:
    t0 = time.perf_counter()
    prompt_ids = [encode(i.prompt, tokenizer) for i in items]
    rollout = generate(model, prompt_ids, SamplingConfig(
        max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
        num_samples=cfg.group_size, seed=seed))
    t1 = time.perf_counter()
    completions = rollout.completions(tokenizer)
    rows = [item for item in items for _ in range(cfg.group_size)]
    rewards = torch.tensor([reward_fn(item, text) for item, text in zip(rows, completions)], dtype=torch.float32)
    t2 = time.perf_counter()
    timings["sampling"] += t1 - t0
    timings["scoring"] += t2 - t1
    return RolloutBatch(rows, rollout.prompt_ids, rollout.tokens, rollout.logprobs, rollout.mask,
                        rollout.truncated, rewards, completions, int(rollout.stats["generated_tokens"]))


def _concat(batches: list[RolloutBatch]) -> RolloutBatch:
    L = max(b.tokens.size(1) for b in batches)

    def pad(t, value):
        return torch.nn.functional.pad(t, (0, L - t.size(1)), value=value)

    return RolloutBatch(
        items=[i for b in batches for i in b.items], prompt_ids=[p for b in batches for p in b.prompt_ids],
        tokens=torch.cat([pad(b.tokens, EOT_ID) for b in batches]),
        old_logprobs=torch.cat([pad(b.old_logprobs, 0.0) for b in batches]),
        mask=torch.cat([pad(b.mask, False) for b in batches]),
        truncated=torch.cat([b.truncated for b in batches]), rewards=torch.cat([b.rewards for b in batches]),
        completions=[c for b in batches for c in b.completions],
        generated_tokens=sum(b.generated_tokens for b in batches))


def _select_groups(batch: RolloutBatch, keep: torch.Tensor, G: int) -> RolloutBatch:
    rows = keep.repeat_interleave(G).nonzero().squeeze(1)
    r = rows.tolist()
    return RolloutBatch([batch.items[i] for i in r], [batch.prompt_ids[i] for i in r], batch.tokens[rows],
                        batch.old_logprobs[rows], batch.mask[rows], batch.truncated[rows], batch.rewards[rows],
                        [batch.completions[i] for i in r], batch.generated_tokens)


def group_std(rewards: torch.Tensor, G: int) -> torch.Tensor:
    return rewards.view(-1, G).std(dim=1, unbiased=False)


class GRPOTrainer:
    """Holds the policy, the optional frozen reference, the optimizer and the loop state."""

    def __init__(self, model: GPT, items: list[PromptItem], cfg: GRPOTrainConfig,
                 reward_fn: RewardFn = default_reward, on_step: Callable[[dict], None] | None = None):
        if cfg.loss.temperature != cfg.temperature:  # entropy must be measured where log-probs are
            cfg.loss = dataclasses.replace(cfg.loss, temperature=cfg.temperature)
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.model = model.to(self.device)
        self.ref = None
        if cfg.loss.beta > 0:
            self.ref = copy.deepcopy(model).eval().requires_grad_(False)
        fused = self.device.type == "cuda"
        self.optimizer = torch.optim.AdamW(model.param_groups(cfg.weight_decay), lr=cfg.lr, betas=(0.9, 0.99),
                                           fused=fused, foreach=None if fused else True)
        self.prompts = PromptSampler(items, cfg.policy_fraction, cfg.seed)
        self.reward_fn = reward_fn
        self.tokenizer = get_tokenizer()
        self.on_step = on_step
        self.step = 0
        self.nonfinite_in_a_row = 0
        self.skipped_updates = 0
        self.history: list[dict] = []
        self.last_batch: RolloutBatch | None = None
        self.last_advantages: torch.Tensor | None = None

    # -- one step ---------------------------------------------------------------------------

    def rollout(self, timings: dict) -> tuple[RolloutBatch, dict]:
        cfg, G = self.cfg, self.cfg.group_size
        seed = cfg.seed * 1_000_003 + self.step
        batch = collect_rollouts(self.model, self.prompts.draw(cfg.prompts_per_step), cfg, self.reward_fn,
                                 self.tokenizer, seed, timings)
        info = {"frac_reward_zero_std": float((group_std(batch.rewards, G) < 1e-6).float().mean()), "refill_rounds": 0}
        if not cfg.dynamic_sampling:
            return batch, info
        kept = _select_groups(batch, group_std(batch.rewards, G) >= 1e-6, G)
        generated = batch.generated_tokens
        for round_ in range(cfg.max_refill_rounds):
            if len(kept.items) >= cfg.prompts_per_step * G:
                break
            more = collect_rollouts(self.model, self.prompts.draw(cfg.prompts_per_step), cfg, self.reward_fn,
                                    self.tokenizer, seed + 7919 * (round_ + 1), timings)
            generated += more.generated_tokens
            kept = _concat([kept, _select_groups(more, group_std(more.rewards, G) >= 1e-6, G)])
            info["refill_rounds"] = round_ + 1
        if not kept.items:  # every group tied: fall back to the original batch (zero gradient, logged)
            return batch, info
        n = min(len(kept.items), cfg.prompts_per_step * G)
        kept = _select_groups(kept, torch.arange(len(kept.items) // G) < n // G, G)
        kept.generated_tokens = generated
        return kept, info

    def train_step(self) -> dict:
        cfg, G = self.cfg, self.cfg.group_size
        self.model.eval()  # dropout off for sampling, scoring and the update (see module docstring)
        timings = {"sampling": 0.0, "scoring": 0.0, "update": 0.0}
        t_start = time.perf_counter()
        batch, info = self.rollout(timings)
        adv, adv_stats = grpo.group_advantages(batch.rewards, G, scale=cfg.scale_rewards)
        adv = adv.to(self.device)
        self.last_batch, self.last_advantages = batch, adv  # kept for inspection in notebooks and tests

        t0 = time.perf_counter()
        ref_lp = None
        if self.ref is not None:
            with torch.no_grad():
                ref_lp = sequence_logprobs(self.ref, batch.prompt_ids, batch.tokens, cfg.temperature)
        lr = lr_at(self.step, cfg)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        n = len(batch.items)
        loss_metrics, grad_norms, losses = [], [], []
        gen = torch.Generator().manual_seed(cfg.seed + self.step)
        for _ in range(cfg.mu):
            order = torch.randperm(n, generator=gen)
            for start in range(0, n, cfg.minibatch_size):
                rows = order[start:start + cfg.minibatch_size]
                r = rows.tolist()
                lp, logits = sequence_logprobs(self.model, [batch.prompt_ids[i] for i in r], batch.tokens[rows],
                                               cfg.temperature, return_logits=True)
                loss, metrics = grpo.grpo_loss(
                    lp, batch.old_logprobs[rows], adv[rows], batch.mask[rows],
                    ref_logprobs=None if ref_lp is None else ref_lp[rows], config=cfg.loss,
                    logits=logits, truncated=batch.truncated[rows], group_stats=adv_stats)
                if not torch.isfinite(loss):
                    self.nonfinite_in_a_row += 1
                    self.skipped_updates += 1
                    self.optimizer.zero_grad(set_to_none=True)
                    if self.nonfinite_in_a_row >= cfg.max_nonfinite_in_a_row:
                        raise FloatingPointError(
                            f"GRPO stopped at step {self.step}: {self.nonfinite_in_a_row} non-finite losses in a row "
                            f"(checkpoints already written in {cfg.out_dir} are intact)")
                    continue
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(),
                                                      cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
                if not torch.isfinite(norm):
                    self.nonfinite_in_a_row += 1
                    self.skipped_updates += 1
                    self.optimizer.zero_grad(set_to_none=True)
                    continue
                self.optimizer.step()
                self.nonfinite_in_a_row = 0
                grad_norms.append(norm.item())
                losses.append(loss.item())
                loss_metrics.append(metrics)
        timings["update"] += time.perf_counter() - t0
        elapsed = time.perf_counter() - t_start

        record = {"step": self.step, "lr": lr}
        for key in (loss_metrics[0] if loss_metrics else {}):
            record[key] = _mean([m[key] for m in loss_metrics])
        # info last: frac_reward_zero_std is measured before dynamic sampling drops tied groups
        record.update({"loss": _mean(losses), "grad_norm": _mean(grad_norms),
                       "skipped_updates": self.skipped_updates, **info})
        record.update({f"group_{k}": v for k, v in adv_stats.as_metrics().items()})
        for task in ("P", "A"):
            sel = torch.tensor([i.task == task for i in batch.items])
            if sel.any():
                record[f"reward_mean_{task}"] = batch.rewards[sel].mean().item()
                record[f"reward_std_{task}"] = batch.rewards[sel].std(unbiased=False).item()
        lengths = batch.mask.sum(1).float()
        record.update({"reward_mean": batch.rewards.mean().item(), "completion_len_mean": lengths.mean().item(),
                       "completion_len_max": lengths.max().item(), "frac_truncated": batch.truncated.float().mean().item(),
                       "time_sampling": timings["sampling"], "time_scoring": timings["scoring"],
                       "time_update": timings["update"], "time_step": elapsed,
                       "generated_tokens_per_s": batch.generated_tokens / max(timings["sampling"], 1e-9)})
        self.step += 1
        self.history.append(record)
        if self.cfg.out_dir:
            out = Path(self.cfg.out_dir)
            out.mkdir(parents=True, exist_ok=True)
            with open(out / "grpo_metrics.jsonl", "a") as f:
                f.write(json.dumps(record) + "\n")
        if self.on_step:
            self.on_step(record)
        return record

    def train(self, progress: bool = True) -> list[dict]:
        from tqdm.auto import tqdm

        bar = tqdm(total=self.cfg.steps, initial=self.step, desc="GRPO", disable=not progress)
        while self.step < self.cfg.steps:
            rec = self.train_step()
            bar.update(1)
            bar.set_postfix(reward=f"{rec['reward_mean']:.3f}", kl=f"{rec.get('kl', 0.0):.4f}")
        bar.close()
        return self.history


def _mean(values):
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else float("nan")


def cli(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rookworld grpo", description="GRPO on chess with verifiable rewards.")
    ap.add_argument("--init-from", required=True, help="Hugging Face GPT-2 directory (our export or RookWorld-LM)")
    ap.add_argument("--data-dir", default=None, help="directory of rookworld datagen output (default data/)")
    ap.add_argument("--layout", default="compact", choices=["compact", "original"],
                    help="P: prompt layout (original for a pretrained RookWorld-LM)")
    ap.add_argument("--out", required=True, help="output directory (metrics, checkpoints, final model)")
    for f in fields(GRPOTrainConfig):
        if f.name in ("loss", "out_dir"):
            continue
        default = f.default
        kind = type(default) if not isinstance(default, bool) else None
        if isinstance(default, bool):
            ap.add_argument(f"--{f.name.replace('_', '-')}", action=argparse.BooleanOptionalAction, default=default)
        else:
            ap.add_argument(f"--{f.name.replace('_', '-')}", type=kind, default=default)
    ap.add_argument("--beta", type=float, default=0.0, help="KL coefficient (0 = no reference model)")
    ap.add_argument("--loss-type", default="grpo", help="grpo | bnpo | dr_grpo | dapo")
    args = ap.parse_args(argv)
    from .data import load_split

    values = {f.name: getattr(args, f.name) for f in fields(GRPOTrainConfig) if f.name not in ("loss", "out_dir")}
    cfg = GRPOTrainConfig(**values, out_dir=args.out,
                          loss=grpo.GRPOConfig(beta=args.beta, loss_type=args.loss_type,
                                               max_completion_length=args.max_new_tokens))
    model = GPT.from_pretrained(args.init_from)
    records = load_split("P", "train", args.data_dir).records + load_split("A", "train", args.data_dir).records
    trainer = GRPOTrainer(model, prompt_items(records, args.layout), cfg)
    trainer.train()
    model.save_pretrained(Path(args.out) / "final")
    Path(args.out, "grpo_config.json").write_text(json.dumps(asdict(cfg), indent=2, default=str))
    print(f"GRPO finished: {cfg.steps} steps; model in {Path(args.out) / 'final'}")
    return 0
