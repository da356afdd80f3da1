"""The GRPO loop: sample groups, score them with verifiable rewards, update with the clipped loss.

One step:
1. draw `prompts_per_step` prompts (the tasks mixed by `task_weights`, or as the items come);
2. sample `group_size` completions per prompt with the KV-cached sampler (dropout off);
3. score each completion with the reward functions (TRL's signature: `f(prompts, completions, **columns)`,
   the columns being each prompt item's `task` and `truth`, each completion's GPT-2 `completion_ids`, and
   `trainer_state` (TRL's: here its `global_step` and `max_steps`); TRL's `log_metric` and `log_extra`
   are not passed, and async functions are not run: both refused when the trainer is built);
4. compute group advantages; optionally drop zero-variance groups and refill (dynamic sampling);
5. run `mu` passes over the rollout in minibatches, each an optimizer step on `grpo_loss`, with
   the sampler's log-probs as the old policy and, when beta > 0, a frozen reference model.
Every step appends one JSON line of metrics (and TensorBoard scalars); every `completions_interval`
steps the step's completions go to completions.jsonl, one row each (COMPLETION_KEYS). The model stays
in eval mode throughout, so dropout never perturbs the log-probs that the ratio compares (TRL's
`disable_dropout`). Each step's sampling and minibatch order are seeded from (seed, step), and the
prompt order and every global RNG are in the checkpoint: with deterministic=True, on CPU, a resumed run
ends bit-identical to an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import hashlib
import inspect
import json
import math
import numbers
import random
import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from . import distributed, grpo
from .checkpoint import weights_fingerprint
from .config import SEED_MAX, bad_field, check_applies, check_weights, config_class, option, validate
from .model import GPT, META_PREFIX, ROLLOUT_TEMPERATURE_KEY
from .sampling import MIN_TEMPERATURE, SamplingConfig, check_fits, generate, sequence_logprobs
from .task_vocab import TaskVocab, sampling_view
from .tokenizer import EOT_ID, check_vocabulary, encode_prompt, get_tokenizer
from .train_utils import WarmupCosineSchedule, build_adamw, check_device_name, clip_grad_norm, to_jsonable
from .trainer import Trainer, check_export_spares

METRICS_FILE = "grpo_metrics.jsonl"
COMPLETIONS_FILE = "completions.jsonl"
# A completions.jsonl row: the step; the group (prompt index within the step); the prompt's task; prompt and
# completion text; reward and advantage; the completion's mean token ratio new/old at its first update
# and the fraction of its tokens with a ratio outside [1 - clip_eps_low, 1 + clip_eps_high] (null when
# none of its tokens enter the loss).
COMPLETION_KEYS = ("step", "group", "task", "prompt", "completion", "reward", "advantage", "ratio", "clip_fraction")


@dataclass(frozen=True)
class PromptItem:
    """One training prompt: its task (a name: the pools task_weights mixes, and the key of the per-task
    reward metrics rewards/<task>/mean), the prompt text, ground truth if known (handed to the reward
    functions, with the task, as the `truth` column), and `columns`: a data set's other columns, each handed
    to the reward functions by its name, one value per completion, as TRL hands them
    (`PromptItem("add", "12+34=", columns={"answer": "46"})` -> `f(prompts, completions, answer=[...], **kw)`;
    None where an item lacks a column another has)."""

    task: str
    prompt: str
    truth: dict | None = None
    columns: Mapping[str, Any] | None = None

    def __post_init__(self):
        if not isinstance(self.task, str) or not self.task.strip() or self.task.endswith(":"):
            raise ValueError(f"PromptItem.task must be a non-empty name without a trailing colon ('P', for prompts "
                             f"'P: ...'), got {self.task!r}")
        if not isinstance(self.prompt, str):
            raise ValueError(f"PromptItem.prompt must be text, got {type(self.prompt).__name__} {self.prompt!r:.60}")
        if self.columns is not None and not isinstance(self.columns, Mapping):
            raise ValueError(f"PromptItem.columns must be a mapping of column names to values, got {_shown(self.columns)}")
        if taken := [k for k in self.columns or () if k in REWARD_KWARGS or not isinstance(k, str) or not k.isidentifier()]:
            raise ValueError(f"PromptItem.columns: {taken[0]!r} cannot be a column's name (a reward function gets it "
                             f"as a keyword: a Python name, none of {REWARD_KWARGS})")


@config_class(frozen=True)
class GRPOTrainConfig:
    """Settings of the GRPO loop (the loss itself is configured by `loss`, a grpo.GRPOConfig)."""

    steps: int = option(20, "GRPO steps, each one rollout batch (prompts_per_step x group_size completions) trained on in mu passes of minibatch_size completions, one optimizer step each", min=1)
    prompts_per_step: int = option(8, "prompts per rollout batch", min=1)
    group_size: int = option(4, "completions per prompt (G)", min=2)
    task_weights: dict[str, float] | None = option(None, "each task's share of a step's prompts (PromptItem.task), e.g. {'math': 0.7, 'code': 0.3}; None: drawn from all prompts as one pool")
    max_new_tokens: int = option(96, "completion budget; longer completions are truncated", min=1)
    temperature: float = option(1.0, "sampling temperature (also used to score log-probs)", min=MIN_TEMPERATURE)
    vocab: str = option("auto", '"auto": sample and score over the task vocabulary a model marks (a vocab="task" SFT export: the same policy to float precision, several times faster; see task_vocab), else over all of GPT-2; "full": always all 50,257 tokens; "task": the marked vocabulary, or the trainer\'s task_vocab= (an opt-in for a model that marks none)', choices=("auto", "full", "task"))
    top_k: int = option(0, "sampler top-k (0 = off; GRPO scores the full distribution)", min=0)
    top_p: float = option(1.0, "sampler nucleus (1 = off)", min=0.0, max=1.0, min_open=True)
    mu: int = option(1, "inner passes over each rollout batch (1: one pass, in which only the first minibatch is on-policy; "
                        "the later ones follow an update)", min=1)
    minibatch_size: int = option(16, "completions per optimizer step inside a pass", min=1)
    lr: float = option(1e-5, "peak learning rate", min=0.0, min_open=True)
    min_lr_ratio: float = option(0.1, "cosine floor as a fraction of lr, reached at the last step (a 1-step run "
                                      "trains at the floor; TRL's linear schedule starts at lr)", min=0.0, max=1.0)
    warmup_steps: int = option(0, "linear warm-up steps", min=0)
    weight_decay: float = option(0.0, "AdamW weight decay", min=0.0)
    grad_clip: float = option(1.0, "max global grad norm (0 = off)", min=0.0)
    multi_objective_aggregation: str = option("sum_then_normalize", 'several reward functions: "sum_then_normalize" (their weighted sum is the reward, as in TRL) or "normalize_then_sum" (GDPO: each z-scored within its group, then summed and batch-normalised; scale_rewards is then ignored)', choices=("sum_then_normalize", "normalize_then_sum"))
    scale_rewards: str = option("group", 'advantage scaling: "group", "batch" or "none" (Dr. GRPO); with multi_objective_aggregation "sum_then_normalize"', choices=("group", "batch", "none"))
    dynamic_sampling: bool = option(False, "drop zero-variance groups and refill (DAPO)")
    max_refill_rounds: int = option(3, "extra sampling rounds allowed per step when refilling (dynamic_sampling=True)", min=0)
    loss: grpo.GRPOConfig = option(factory=grpo.GRPOConfig, help="the loss (clip, aggregation, KL, ...)")
    max_nonfinite_in_a_row: int = option(5, "stop after this many consecutive non-finite losses", min=1)
    rollout_chunks: int = option(1, "prompts of a step are sampled in this many chunks (bounds memory; the unit of work a rank takes under torchrun; each chunk has its own seed)")
    dtype: str = option("auto", '"auto" (bf16 autocast on CUDA with bf16, else fp32), "fp32" or "bf16"', choices=("fp32", "bf16", "auto"))
    cudnn_attention: bool = option(True, "on CUDA, let attention use cuDNN's kernel (PyTorch's choice): 1.2x faster a step of the gpu profile's once warm, but its first steps on a fresh machine cost about 7 s more, so a run of a few dozen steps is faster without (docs/perf.md); no effect on CPU")
    checkpoint_interval: int = option(25, "steps between checkpoints, with out_dir (0 = only where the run stops: a SIGKILL then loses the run); a Ctrl-C or SIGTERM saves where it stops either way", min=0)
    keep_checkpoints: int = option(2, "checkpoints kept on disk, newest first (0 = all)", min=0)
    out_dir: str | None = option(None, "grpo_metrics.jsonl, completions.jsonl, checkpoints/ and final/ go here (None = keep nothing)",
                                 path=True)
    export_hf: bool = option(True, "at the end, write the trained model (the full GPT-2) in Hugging Face format to <out_dir>/final, as SFT does (trainer.export(dir) writes it anywhere)")
    report_to: str = option("tensorboard", '"tensorboard": the metrics also as event files in out_dir (tensorboard --logdir runs); "none"', choices=("tensorboard", "none"))
    completions_interval: int = option(10, "write the step's completions (completions.jsonl, TensorBoard text) at step 1 and every this many steps (0 = never)", min=0)
    resume: bool = option(True, "continue from out_dir/checkpoints when it holds a checkpoint of this run")
    seed: int = option(0, "seeds prompt order and sampling", min=0, max=SEED_MAX)
    device: str = option("auto", '"auto" (cuda if available, else cpu), "cpu", "cuda", "cuda:1", ...')
    deterministic: bool = option(False, "deterministic algorithms, and small decode steps always on one thread (no "
                                        "timed choice): bit-identical reruns and resumes on CPU")
    progress: bool = option(True, "show a tqdm bar")

    def __post_init__(self):
        validate(self)  # types, ranges and choices of every field (the option() checks above)
        object.__setattr__(self, "task_weights", check_weights(self, "task_weights"))  # frozen, as SFTConfig
        check_device_name(self)
        if not 1 <= self.rollout_chunks <= self.prompts_per_step:
            bad_field(type(self).__name__, "rollout_chunks", self.rollout_chunks, "must be in 1..prompts_per_step")
        if self.warmup_steps > self.steps:
            bad_field(type(self).__name__, "warmup_steps", self.warmup_steps, f"must be <= steps ({self.steps})")
        if self.lr * self.weight_decay >= 1:  # as SFTConfig's: decoupled decay would flip each weight's sign
            bad_field(type(self).__name__, "weight_decay", self.weight_decay, f"must be < 1/lr ({1 / self.lr:g}): "
                      "AdamW scales each weight by 1 - lr*weight_decay a step")
        if not isinstance(self.loss, grpo.GRPOConfig):
            bad_field(type(self).__name__, "loss", self.loss, "must be a grpo.GRPOConfig")
        check_applies(self, "max_refill_rounds", self.dynamic_sampling, "unless dynamic_sampling=True: set that too")
        for name in ("kl_estimator", "use_bias_correction_kl"):  # the trainer keeps no reference model at beta 0
            check_applies(self.loss, name, self.loss.beta > 0, "at beta=0 (no KL term, no reference model): set beta > 0")
        check_applies(self, "scale_rewards", self.multi_objective_aggregation == "sum_then_normalize",
                      "unless multi_objective_aggregation='sum_then_normalize' (normalize_then_sum z-scores each reward "
                      "in its group): set that")


# TRL's reward-function signature: f(prompts, completions, **columns) -> one float (or None:
# unscorable) per completion; the columns here are `task`, `truth`, the items' own `columns` and, in the
# trainer, TRL's `completion_ids` (each completion's GPT-2 token ids, its end token included), one value
# per completion, and `trainer_state`.
RewardFunc = Callable[..., Sequence[float | None]]
RESUME_MAY_CHANGE = Trainer.resume_may_change | {"steps", "completions_interval", "report_to", "cudnn_attention",
                                                 "export_hf"}  # how long, what is logged or written, a kernel choice


def score_completions(reward_funcs: Sequence[RewardFunc], weights: Sequence[float], items: list[PromptItem],
                      completions: list[str]) -> torch.Tensor:
    """The weighted sum of the reward functions per completion, as TRL sums them: None counts as
    NaN and is left out of the sum (nansum); every function must give one value per completion."""
    return reward_sum(reward_table(reward_funcs, items, completions), weights)


def reward_sum(table: torch.Tensor, weights: Sequence[float]) -> torch.Tensor:
    """[N] weighted nansum of a reward_table's columns."""
    return (table * torch.tensor(weights, dtype=torch.float32)).nansum(1)


@dataclass(frozen=True)
class TrainerState:
    """The `trainer_state` a reward function is handed (TRL passes transformers' TrainerState): the GRPO
    steps done before this rollout, and the run's total (GRPOTrainConfig.steps), e.g. for a curriculum.
    Each step is one rollout batch and its mu passes of optimizer updates; transformers' global_step
    counts the updates, so a TRL curriculum's step thresholds are these divided by the updates a step makes."""

    global_step: int
    max_steps: int


UNSUPPORTED_REWARD_KWARGS = ("log_metric", "log_extra")  # TRL passes them; this trainer does not
REWARD_KWARGS = ("prompts", "completions", "task", "truth", "completion_ids", "trainer_state")  # what reward_table passes


def check_reward_function(f: RewardFunc, columns: Sequence[str] = ()) -> None:
    """Refuse, before any rollout, a reward function this trainer cannot call as TRL would: an async one
    (TRL gathers them), one that requires TRL's log_metric / log_extra, or one that requires a column
    that neither the trainer nor the items' `columns` (their names: `columns`) give."""
    name = reward_name(f)
    if inspect.iscoroutinefunction(f) or inspect.iscoroutinefunction(inspect.getattr_static(type(f), "__call__", None)):  # an object's
        raise ValueError(f"reward function {name!r} is async: give a plain function (TRL runs async ones with "
                         "asyncio.gather; this trainer calls them in turn)")
    params = {}
    with contextlib.suppress(TypeError, ValueError):  # a builtin without a signature: called as it is
        params = inspect.signature(f).parameters
    if needs := [p for p in UNSUPPORTED_REWARD_KWARGS if p in params and params[p].default is inspect.Parameter.empty]:
        raise ValueError(f"reward function {name!r} needs {', '.join(needs)}, which TRL passes and this trainer "
                         "does not (docs/grpo_options.md): give it a default, or log through the returned rewards")
    given = (*REWARD_KWARGS, *columns)  # prompts, completions, then the columns
    if absent := [p for p, v in params.items() if v.default is inspect.Parameter.empty and p not in given
                  and v.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)]:
        raise ValueError(f"reward function {name!r} requires {', '.join(map(repr, absent))}, which no prompt gives: a "
                         f"data set's column reaches it as PromptItem(..., columns={{{absent[0]!r}: ...}}) (the columns "
                         f"given: {', '.join(given[2:])})")
    kinds = {p.kind for p in params.values()}
    if params and inspect.Parameter.VAR_KEYWORD not in kinds:  # it is called with every column by keyword
        missing = [c for c in (*REWARD_KWARGS, *columns) if c not in params or params[c].kind is inspect.Parameter.POSITIONAL_ONLY]
        if missing:
            raise ValueError(f"reward function {name!r} takes no {', '.join(missing)}: it is called as TRL calls one, "
                             f"f({', '.join(c + '=...' for c in (*REWARD_KWARGS, *columns))}); end its parameters with **kwargs")


def reward_table(reward_funcs: Sequence[RewardFunc], items: list[PromptItem], completions: list[str],
                 completion_ids: list[list[int]] | None = None, trainer_state: TrainerState | None = None) -> torch.Tensor:
    """[N, F]: each reward function's value per completion (TRL's rewards_per_func), None as NaN."""
    names = dict.fromkeys(k for i in items for k in i.columns or ())  # the items' own columns, in first-seen order
    columns = {"task": [i.task for i in items], "truth": [i.truth for i in items],
               **{k: [(i.columns or {}).get(k) for i in items] for k in names}}
    if completion_ids is not None:
        columns["completion_ids"] = completion_ids
    if trainer_state is not None:
        columns["trainer_state"] = trainer_state
    prompts = [i.prompt for i in items]
    per_func = []
    for f in reward_funcs:
        values = f(prompts=prompts, completions=completions, **columns)
        if isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__len__") or len(values) != len(completions):
            got = f"{len(values)} values" if isinstance(values, (list, tuple)) else _shown(values)
            raise ValueError(f"reward function {reward_name(f)!r} gave {got} for {len(completions)} completions; it "
                             "must give a list of one float (or None: unscorable) per completion")
        # one-element tensors and numpy values (np.True_ of `np.array(completions) == "yes"`) as the numbers they
        # hold, as TRL's torch.tensor(values) takes them
        values = [v.item() if (isinstance(v, torch.Tensor) and v.numel() == 1) or (
            isinstance(v, (np.generic, np.ndarray)) and v.size == 1) else v for v in values]
        if (bad := next((i for i, v in enumerate(values) if not (v is None or isinstance(v, numbers.Real))), None)) is not None:
            raise ValueError(f"reward function {reward_name(f)!r} gave {_shown(values[bad])} for completion {bad}; "
                             "each value must be a float (or None: unscorable)")
        if (bad := next((i for i, v in enumerate(values) if v is not None and abs(float(v)) > FLOAT32_MAX), None)) is not None:
            raise ValueError(f"reward function {reward_name(f)!r} gave {values[bad]!r} for completion {bad}: each value "
                             "must be finite in float32 (|x| <= 3.4e38; None or NaN: unscorable)")
        per_func.append([float("nan") if v is None else float(v) for v in values])
    return torch.tensor(per_func, dtype=torch.float32).reshape(len(per_func), len(completions)).T


FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def reward_name(f: RewardFunc) -> str:
    """A reward function's name in metrics (`rewards/<name>/mean`), as TRL names it: its __name__; a
    partial's function's; a callable object's class name."""
    while isinstance(f, functools.partial):
        f = f.func
    return getattr(f, "__name__", None) or type(f).__name__


def _shown(value, type_name: bool = True) -> str:
    text = repr(value)
    return f"{type(value).__name__ + ' ' if type_name else ''}{text[:60]}{'...' if len(text) > 60 else ''}"


def reward_setup(reward_funcs, reward_weights, tasks, columns: Sequence[str] = ()) -> tuple[list[RewardFunc], list[float], list[str]]:
    """The trainer's reward functions (each checked against the items' `columns`: check_reward_function), their weights (one finite
    number each, 1.0 by default) and their names in metrics: TRL's, a second "<lambda>" "<lambda>_2",
    none a task's name (rewards/<task>/mean is the task's weighted total). ValueError in one line."""
    if reward_funcs is None or isinstance(reward_funcs, (str, bytes)):
        raise ValueError(f"reward_funcs must be a function f(prompts, completions, **columns) or a list of them, "
                         f"got {_shown(reward_funcs)}")
    if isinstance(reward_funcs, (set, frozenset)) or not (callable(reward_funcs) or isinstance(reward_funcs, Iterable)):
        raise ValueError(f"reward_funcs must be a function f(prompts, completions, **columns) or a list of them (in the "
                         f"order of reward_weights), got {_shown(reward_funcs)}")
    funcs = [reward_funcs] if callable(reward_funcs) else list(reward_funcs)
    if (bad := next((f for f in funcs if not callable(f)), None)) is not None:
        raise ValueError(f"reward_funcs: {_shown(bad)} is not callable; give a function f(prompts, completions, "
                         "**columns) or a list of them")
    for f in funcs:
        check_reward_function(f, columns)
    if reward_weights is not None and not hasattr(reward_weights, "__len__"):
        raise ValueError(f"reward_weights must be a list of one number per reward function, got {_shown(reward_weights)}")
    given = [1.0] * len(funcs) if reward_weights is None else [  # 0-d tensors and numpy values as their numbers
        w.item() if (isinstance(w, torch.Tensor) and w.numel() == 1) or (isinstance(w, (np.ndarray, np.generic))
                     and w.size == 1) else w for w in reward_weights]
    if not all(isinstance(w, numbers.Real) and not isinstance(w, bool) and math.isfinite(w) for w in given):
        raise ValueError(f"reward_weights must be finite numbers, got {given}")
    weights = [float(w) for w in given]
    if not funcs or len(weights) != len(funcs):
        raise ValueError(f"give one or more reward functions and one weight each (got {len(funcs)} "
                         f"functions, {len(weights)} weights)")
    names: list[str] = []  # unique in metrics (a second "<lambda>" is "<lambda>_2"), as TRL names them
    for name in map(reward_name, funcs):
        unique, n = name, 1
        while unique in names:
            n += 1
            unique = f"{name}_{n}"
        names.append(unique)
    if clash := sorted(set(names) & set(tasks)):  # renamed, it logged the task's total
        raise ValueError(f"reward function {clash[0]!r} has the name of a task: rewards/{clash[0]}/mean would be "
                         "both the function's mean and the task's weighted total; rename the function or the task")
    return funcs, weights, names


class PromptSampler:
    """Draws prompts: each task at its share of task_weights (None: one pool of every item), each
    pool reshuffled when it runs out."""

    def __init__(self, items: list[PromptItem], task_weights: dict[str, float] | None, seed: int):
        self.weights = task_weights
        if task_weights is None:
            self.pools = {"all": list(items)}
        else:
            if (other := next((n for n, i in enumerate(items) if i.task not in task_weights), None)) is not None:
                raise ValueError(f"prompt {other}: task {items[other].task!r}, which task_weights {task_weights} "
                                 "does not name; give it a weight (0 leaves it out) or set task_weights=None")
            self.pools = {t: [i for i in items if i.task == t] for t in task_weights}
            if missing := [t for t, w in task_weights.items() if w > 0 and not self.pools[t]]:
                raise ValueError(f"task_weights gives {missing[0]!r} a share of {task_weights[missing[0]]:g}, but no "
                                 f"prompt is of that task; set its weight to 0 or add its prompts")
        if not any(self.pools.values()):
            raise ValueError("GRPOTrainer got no prompts: the items list is empty")
        # the tasks of the per-task metrics: task_weights' order, else the items' first appearance
        self.tasks = list(task_weights or dict.fromkeys(i.task for i in items))
        self.rng = random.Random(seed)
        self.order = {t: [] for t in self.pools}
        self.credit = dict.fromkeys(self.pools, 0.0)  # see counts

    def _next(self, task):
        if not self.order[task]:
            self.order[task] = list(range(len(self.pools[task])))
            self.rng.shuffle(self.order[task])
        return self.pools[task][self.order[task].pop()]

    def counts(self, n: int) -> dict[str, int]:
        """How many of the next n prompts each pool gives, by smooth weighted round robin (nginx's):
        each prompt goes to the task with the most credit, every task earning its share per prompt
        and the chosen one paying 1, the credit carried from step to step. Every task with a weight
        is drawn at its share in the long run, however few prompts a step has (0.1 of 4 prompts: one
        step in 2.5); where n * share is whole, each step gets exactly that (0.5 of 16: 8 and 8)."""
        if self.weights is None:
            return {"all": n}
        total, out = sum(self.weights.values()), dict.fromkeys(self.weights, 0)
        for _ in range(n):
            for task, w in self.weights.items():
                self.credit[task] += w / total
            pick = max(self.credit, key=self.credit.get)  # the first of equals
            self.credit[pick] -= 1.0
            out[pick] += 1
        return out

    def draw(self, n: int) -> list[PromptItem]:
        return [self._next(task) for task, k in self.counts(n).items() for _ in range(k)]

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the prompt pools (task and text, in order): a resume must draw from the same."""
        h = hashlib.sha256()
        for pool in self.pools.values():
            for item in pool:
                h.update(f"{item.task}\x00{item.prompt}\x00".encode())
        return h.hexdigest()

    @property
    def truth_fingerprint(self) -> str | None:
        """SHA-256 of the prompts' ground truth, in order: the same prompts labelled anew (deeper evals, other
        candidates) give other rewards, so a resume must score against the same truth. None where a truth is
        no JSON (a verifier object, a set): its text would differ between processes, so it is not compared."""
        h = hashlib.sha256()
        try:
            for pool in self.pools.values():
                for item in pool:
                    h.update(json.dumps(item.truth, sort_keys=True).encode() + b"\x00")
        except (TypeError, ValueError):
            return None
        return h.hexdigest()

    def state_dict(self):
        return {"rng": self.rng.getstate(), "order": copy.deepcopy(self.order), "credit": dict(self.credit)}

    def load_state_dict(self, state):
        if set(state["order"]) != set(self.pools):
            raise ValueError(f"the checkpoint drew prompts from the pools {sorted(state['order'])}, this run from "
                             f"{sorted(self.pools)} (task_weights): resume with the run's own task_weights")
        self.rng.setstate(state["rng"])
        self.order = copy.deepcopy(state["order"])
        # a checkpoint from before the credit: zero, where a step of whole shares leaves it
        self.credit = dict(state.get("credit") or dict.fromkeys(self.pools, 0.0))


@dataclass
class RolloutBatch:
    """Sampled and scored completions, one row each (each prompt repeated group_size times)."""

    items: list[PromptItem]
    prompt_ids: list[list[int]]
    tokens: torch.Tensor  # EOT-padded completion tokens
    old_logprobs: torch.Tensor  # the sampler's log-probs of those tokens
    mask: torch.Tensor  # which tokens belong to the completion
    truncated: torch.Tensor  # cut at max_new_tokens
    rewards: torch.Tensor  # the reward functions' weighted sum
    completions: list[str]
    reward_table: torch.Tensor  # [rows, functions] (reward_table)
    generated_tokens: int = 0  # tokens sampled for this batch, dropped groups included


def _concat(batches: list[RolloutBatch], eot: int) -> RolloutBatch:
    L = max(b.tokens.size(1) for b in batches)

    def pad(t, value):
        return torch.nn.functional.pad(t, (0, L - t.size(1)), value=value)

    return RolloutBatch(
        items=[i for b in batches for i in b.items], prompt_ids=[p for b in batches for p in b.prompt_ids],
        tokens=torch.cat([pad(b.tokens, eot) for b in batches]),
        old_logprobs=torch.cat([pad(b.old_logprobs, 0.0) for b in batches]),
        mask=torch.cat([pad(b.mask, False) for b in batches]),
        truncated=torch.cat([b.truncated for b in batches]), rewards=torch.cat([b.rewards for b in batches]),
        completions=[c for b in batches for c in b.completions],
        reward_table=torch.cat([b.reward_table for b in batches]), generated_tokens=sum(b.generated_tokens for b in batches))


def _select_groups(batch: RolloutBatch, keep: torch.Tensor, G: int) -> RolloutBatch:
    rows = keep.repeat_interleave(G).nonzero().squeeze(1)
    r = rows.tolist()
    return RolloutBatch([batch.items[i] for i in r], [batch.prompt_ids[i] for i in r], batch.tokens[rows],
                        batch.old_logprobs[rows], batch.mask[rows], batch.truncated[rows], batch.rewards[rows],
                        [batch.completions[i] for i in r], batch.reward_table[rows], batch.generated_tokens)


def _refill_seed(seed: int, step: int, round_: int) -> int:
    """Refill round `round_` of `step`'s base seed, hashed from the three by numpy's SeedSequence (< 2**63): an
    offset from the step's own seed (seed * 1_000_003 + step + 7919 * (round + 1)) was step + 7919's seed."""
    return int(np.random.SeedSequence([seed, step, round_ + 1]).generate_state(1, np.uint64)[0] >> 1)


def _scored(batch: RolloutBatch) -> torch.Tensor:
    """The batch's rewards, NaN for an unscorable completion (every function gave None)."""
    return batch.rewards.masked_fill(batch.reward_table.isnan().all(1), float("nan"))


def _varied_groups(batch: RolloutBatch, G: int, per_function: bool = False,
                   weights: Sequence[float] | None = None) -> RolloutBatch:
    """The groups whose scorable rewards are not all tied (the ones dynamic sampling keeps): an
    unscorable completion (advantage 0) cannot break a tie. per_function (GDPO's normalize_then_sum,
    which normalises each reward function within its group): a group ties when every function of a
    nonzero weight (`weights`, one per function; None: all) does, whatever their weighted sums."""
    table = batch.reward_table.T
    columns = ([c for k, c in enumerate(table) if weights is None or weights[k] != 0] if per_function
               else [_scored(batch)])
    varied = torch.zeros(len(batch.items) // G, dtype=torch.bool)
    for column in columns:
        r = column.view(-1, G)
        spread = (torch.where(r.isnan(), -math.inf, r).amax(1)
                  - torch.where(r.isnan(), math.inf, r).amin(1))  # -inf where none is scorable, 0 where one is
        varied |= spread >= 1e-6
    return _select_groups(batch, varied, G)


class GRPOTrainer(Trainer):
    """The policy, the optional frozen reference, the prompts and the loop state; resumes from out_dir.

    model: the GPT to train (in place: after train() it holds the trained weights); items: the
    PromptItems to draw from (mixed by cfg.task_weights); reward_funcs: one function or a list, each
    called as TRL calls them, f(prompts=[...], completions=[...], task=[...], truth=[...],
    completion_ids=[...]) with one entry per completion (task and truth from its PromptItem: put
    whatever a reward needs to know about a prompt, such as its solution, in truth; completion_ids
    its GPT-2 token ids, the end token included where it ended), returning one float or None each;
    reward_weights: one per function (default 1 each; their weighted sum is the reward); on_step:
    called with each step's metrics record; init_from: the directory the model was loaded from (a
    resume must name the same); task_vocab: the opt-in vocabulary of cfg.vocab="task" for a model
    that marks none. With out_dir, train() writes metrics, completions and checkpoints there and, at
    the end, the Hugging Face export to <out_dir>/final (cfg.export_hf); export(dir) writes it anywhere.

    Under torchrun each rank samples and scores its share of the rollout chunks, then every rank
    gathers the global batch; each minibatch is split across the ranks and normalised by global
    counts, so the update does not depend on the world size.
    """

    kind, name, metrics_file = "grpo", "GRPO", METRICS_FILE
    settings_file = "grpo_config.json"
    log_files = (COMPLETIONS_FILE,)
    resume_may_change = RESUME_MAY_CHANGE
    stop_hint = "Lower lr, or check the rewards and the model."

    def __init__(self, model: GPT, items: list[PromptItem], cfg: GRPOTrainConfig,
                 reward_funcs: RewardFunc | Sequence[RewardFunc], reward_weights: Sequence[float] | None = None,
                 on_step: Callable[[dict], None] | None = None, init_from: str | None = None,
                 task_vocab: TaskVocab | None = None):
        # the loss's copies of the sampler's settings are the sampler's, as TRL has one field for each: entropy is
        # measured where log-probs are, and dr_grpo divides by the budget sampled (another silently scaled its step)
        if (cfg.loss.temperature, cfg.loss.max_completion_length) != (cfg.temperature, cfg.max_new_tokens):
            cfg = dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, temperature=cfg.temperature,
                                                                    max_completion_length=cfg.max_new_tokens))
        if not isinstance(model, GPT):  # TRL takes a transformers model or a hub id; a traceback followed
            raise ValueError(f"model must be a rookworld GPT, got {type(model).__name__}"
                             f"{f' {model!r}' if isinstance(model, (str, Path)) else ''}: load a Hugging Face GPT-2 "
                             "directory with GPT.from_pretrained(directory)")
        if isinstance(items, PromptItem):
            raise ValueError("items must be a list of PromptItem, got one PromptItem: wrap it in a list")
        if not isinstance(items, Iterable) or isinstance(items, (str, bytes, Mapping)):
            raise ValueError(f"items must be a list of PromptItem(task, prompt), got {_shown(items)}")
        if task_vocab is not None and not isinstance(task_vocab, TaskVocab):
            raise ValueError(f"task_vocab must be a TaskVocab (TaskVocab(token ids of the task text)), got {_shown(task_vocab)}")
        if not any(p.requires_grad for p in model.parameters()):
            raise ValueError("model has no parameter that requires a gradient (frozen: requires_grad_(False)): nothing "
                             "to train; call model.requires_grad_(True)")
        if (dtypes := {p.dtype for p in model.parameters()}) != {torch.float32}:
            raise ValueError(f"model weights are {', '.join(sorted(map(str, dtypes)))}: the trainer keeps fp32 weights and "
                             "runs bf16 under autocast (GRPOTrainConfig.dtype='bf16'); call model.float()")
        check_vocabulary(model)  # prompts are encoded, completions decoded, with GPT-2's tokenizer
        self.start_weights = weights_fingerprint(model)  # the model as handed in: a resume must be handed it too
        # and what the task layer recorded in it (a layout); not the rollout temperature, which this trainer's
        # exports record (the model handed in is updated in place: handed in again, it carries that)
        self.start_meta = {k: v for k, v in model.meta.items() if k != ROLLOUT_TEMPERATURE_KEY}
        super().__init__(cfg, cfg.steps, on_step=on_step)
        self.export_at_end = cfg.export_hf and cfg.out_dir is not None
        self.init_from = str(Path(init_from).resolve()) if init_from is not None else None
        check_export_spares(init_from, cfg.out_dir, type(self).__name__)
        check_world_size(cfg, self.dist.world_size)
        self.tokenizer = get_tokenizer()
        # over a task vocabulary the model is its restriction (task_vocab.TaskVocab.restrict) and token ids
        # are compact; `outside`: the rows an export gives every other token (None: the off rows)
        self.vocab, self.outside, self.full_model = None, None, None
        items = list(items)  # a generator is read once, here (the sampler read it empty)
        if (bad := next((k for k, i in enumerate(items) if not isinstance(i, PromptItem)), None)) is not None:
            raise ValueError(f"items[{bad}] is a {type(items[bad]).__name__}, not a PromptItem(task, prompt)")
        prompts = [encode_prompt(i.prompt, model.prompt_prefix, self.tokenizer) for i in items]
        if (empty := next((k for k, p in enumerate(prompts) if not p), None)) is not None:
            raise ValueError(f"items[{empty}]: the prompt is empty (and so is the model's prompt prefix): nothing to "
                             "complete")
        # before anything is written to out_dir: the longest prompt and its completion must fit the model
        longest = max(range(len(prompts)), key=lambda k: len(prompts[k]), default=None)
        if longest is not None:
            check_fits(model.config.block_size, len(prompts[longest]), cfg.max_new_tokens,
                       where=f"items[{longest}], {_shown(items[longest].prompt, type_name=False)}")
        if cfg.vocab != "full":
            compact, self.vocab, _ = sampling_view(model, prompts, task_vocab)
            if self.vocab is None and cfg.vocab == "task":
                raise ValueError("GRPOTrainConfig.vocab='task': the model marks no task vocabulary (only vocab='task' "
                                 "SFT exports do); pass task_vocab=TaskVocab(token ids of the task text) to opt in, "
                                 "or use vocab='auto' or 'full'")
            if self.vocab is not None:
                if task_vocab is not None:
                    self.outside = model.transformer.wte.weight.detach()[:model.config.vocab_size].clone()
                self.full_model, model = model, compact
        self.eot = EOT_ID if self.vocab is None else int(self.vocab.index[EOT_ID])
        self.model = model.to(self.runtime.device)
        self.ref = copy.deepcopy(self.model).eval().requires_grad_(False) if cfg.loss.beta > 0 else None
        self.optimizer = build_adamw(self.model, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.99),
                                     device_type=self.runtime.device.type)
        self.schedule = WarmupCosineSchedule(cfg.lr, cfg.lr * cfg.min_lr_ratio, cfg.warmup_steps, cfg.steps)
        self.prompts = self.data = PromptSampler(items, cfg.task_weights, cfg.seed)
        self.reward_funcs, self.reward_weights, self.reward_names = reward_setup(
            reward_funcs, reward_weights, self.prompts.tasks, columns=list(dict.fromkeys(k for i in items for k in i.columns or ())))
        self.tokens_seen: int | None = 0  # prompt and completion tokens of every batch so far (TRL's num_tokens)
        self.last_batch: RolloutBatch | None = None
        self.last_advantages: torch.Tensor | None = None
        self.last_rollout: list[dict] = []  # the latest step's completions, as completions.jsonl rows
        ckpt = self.find_checkpoint()
        if ckpt is not None:
            self.restore(ckpt)
        self.wrap_ddp(self.model)

    @property
    def policy(self) -> torch.nn.Module:
        """What the loss runs through: the DDP wrapper under torchrun, else the model."""
        return self.ddp or self.model

    @property
    def skipped_updates(self) -> int:
        return self.guard.total

    # -- what the scaffold asks -----------------------------------------------------------

    def checkpoint_extra(self) -> dict:
        now = self.model if self.vocab is None else self.vocab.expand(self.model, self.outside)
        extra = {"init_from": self.init_from, "prompts": self.prompts.fingerprint,
                 "truth": self.prompts.truth_fingerprint, "tokens_seen": self.tokens_seen,
                 # the model handed in at the start, and as train() leaves it (the weights saved here)
                 "start_weights": self.start_weights, "weights": weights_fingerprint(now),
                 "rewards": [[n, w] for n, w in zip(self.reward_names, self.reward_weights)],
                 "task_vocab": None if self.vocab is None else self.vocab.ids.tolist(),
                 "task_vocab_base": None if self.outside is None else self.init_from or "unknown",
                 "meta": self.start_meta}
        if self.ref is not None:
            extra["ref"] = self.ref.state_dict()
        return extra

    def restore_extra(self, extra: dict) -> None:
        self.tokens_seen = extra.get("tokens_seen")  # None: a checkpoint from before the count (not logged then)
        self.start_weights = extra.get("start_weights") or self.start_weights  # the run's own start, kept across resumes
        if self.ref is not None:
            self.ref.load_state_dict(extra["ref"], strict=True)

    def settings(self) -> dict:
        """grpo_config.json: the config's fields, the model it started from and the reward functions with their weights."""
        return {**super().settings(), "init_from": self.init_from,
                "rewards": [[n, w] for n, w in zip(self.reward_names, self.reward_weights)]}

    def resolved_settings(self) -> dict:
        """vocab "auto" resolves to "task" or "full" (the task tokens themselves: resume_differences)."""
        return {**super().resolved_settings(), "vocab": "full" if self.vocab is None else "task"}

    def resume_differences(self, ckpt: dict) -> dict[str, tuple]:
        """The model a run starts from, its prompt set and its reward functions must be the checkpoint's too."""
        extra, diff = ckpt.get("extra") or {}, {}
        if self.init_from is not None and extra.get("init_from") not in (None, self.init_from):
            diff["init_from"] = (extra["init_from"], self.init_from)
        # what the task layer recorded in the model (a layout rewrites every prompt: named, not "another prompt
        # set"); a checkpoint from before the record: not compared
        was, now = extra.get("meta", self.start_meta), self.start_meta
        meta = {f"meta.{k.removeprefix(META_PREFIX)}": (was.get(k), now.get(k))  # rookworld_layout: meta.layout
                for k in sorted(was.keys() | now.keys()) if was.get(k) != now.get(k)}
        diff.update(meta)
        if not meta and extra.get("prompts") not in (None, self.prompts.fingerprint):
            diff["prompts"] = ("another prompt set", "this data")
        elif None not in (extra.get("truth"), self.prompts.truth_fingerprint) and extra["truth"] != self.prompts.truth_fingerprint:
            diff["ground truth"] = ("the checkpoint's labels of these prompts", "other labels")
        saved, shape = ckpt.get("model_config") or {}, dataclasses.asdict(self.model.config)
        diff.update({f"model.{k}": (saved[k], shape[k]) for k in ("n_layer", "n_head", "n_embd", "vocab_size",
                                                                  "block_size", "bias") if saved.get(k, shape[k]) != shape[k]})
        same_shape = not any(k.startswith("model.") for k in diff)  # else the shape says it
        if same_shape and extra.get("start_weights") is not None and self.start_weights not in (extra["start_weights"],
                                                                                               extra["weights"]):
            diff["starting model"] = ("the first or latest weights of the run", "other weights")
        rewards = [[n, w] for n, w in zip(self.reward_names, self.reward_weights)]
        if extra.get("rewards", rewards) != rewards:  # reward functions by name, with their weights
            diff["reward_funcs"] = tuple(", ".join(f"{n} x{w:g}" for n, w in r) for r in (extra["rewards"], rewards))
        mine = None if self.vocab is None else self.vocab.ids.tolist()
        if extra.get("task_vocab", mine) != mine:
            diff["vocab"] = tuple("all tokens" if v is None else f"{len(v)} task tokens" for v in (extra["task_vocab"], mine))
        return diff

    def train(self, until: int | None = None) -> list[dict]:
        """Trainer.train; over a task vocabulary the model handed in is then updated in place to the
        trained weights (expanded), as the full-vocabulary loop leaves it."""
        try:
            return super().train(until)
        finally:
            if self.full_model is not None:
                with torch.no_grad():
                    self.full_model.load_state_dict(self.export_model().state_dict())

    def export_model(self) -> torch.nn.Module:
        """The full GPT-2 (the model expanded back from the task vocabulary), recording the rollout
        temperature it was trained at (ROLLOUT_TEMPERATURE_KEY: an evaluation samples pass@1 there)."""
        model = self.model if self.vocab is None else self.vocab.expand(self.model, self.outside)
        model.meta = {**model.meta, ROLLOUT_TEMPERATURE_KEY: self.cfg.temperature}
        return model

    def sampling_vocabulary(self) -> str:
        """What the policy is sampled and scored over, in words (for a run's log)."""
        return "all of GPT-2's 50,257 tokens" if self.vocab is None else f"the model's {len(self.vocab)} task tokens"

    def encode(self, prompt: str) -> list[int]:
        """A prompt's token ids as the model reads them (compact over a task vocabulary)."""
        ids = encode_prompt(prompt, self.model.prompt_prefix, self.tokenizer)
        return ids if self.vocab is None else self.vocab.index[ids].tolist()

    def postfix(self, rec: dict) -> str:
        kl = rec.get("kl")
        reward = rec.get("reward")  # None (NaN) when no completion of the step could be scored
        return ("reward n/a" if reward is None else f"reward {reward:.3f}") + (f", kl {kl:.4f}" if kl is not None else "")

    # -- rollouts ---------------------------------------------------------------------------

    def collect(self, items: list[PromptItem], seed: int, timings: dict) -> RolloutBatch:
        """Sample and score `items` in cfg.rollout_chunks chunks, this rank's share, then gather."""
        cfg, G = self.cfg, self.cfg.group_size
        k = min(cfg.rollout_chunks, len(items))
        bounds = [round(i * len(items) / k) for i in range(k + 1)]
        mine = []
        for c in range(self.dist.rank, k, self.dist.world_size):
            chunk = items[bounds[c]:bounds[c + 1]]
            t0 = time.perf_counter()
            # Sample under the same autocast as scoring: old and new log-probs then round alike,
            # and the on-policy ratio stays at 1 up to summation order.
            with self.runtime.autocast():
                rollout = generate(self.model, [self.encode(i.prompt) for i in chunk], SamplingConfig(
                    max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k,
                    top_p=cfg.top_p, num_samples=G, seed=(seed * 10_007 + c) % 2**64,  # a generator seed: < 2**64
                    eos_id=self.eot, pad_id=self.eot))
            t1 = time.perf_counter()
            ids = [rollout.completion_ids(r, keep_eos=True) for r in range(rollout.tokens.size(0))]
            ids = ids if self.vocab is None else [self.vocab.ids[i].tolist() for i in ids]  # GPT-2's ids
            completions = [self.tokenizer.decode(i[:-1] if i and i[-1] == EOT_ID else i) for i in ids]
            rows = [item for item in chunk for _ in range(G)]
            table = reward_table(self.reward_funcs, rows, completions, ids, TrainerState(self.step, cfg.steps))
            timings["sampling"] += t1 - t0
            timings["scoring"] += time.perf_counter() - t1
            mine.append((c, RolloutBatch(rows, rollout.prompt_ids, rollout.tokens.cpu(), rollout.logprobs.cpu(),
                                         rollout.mask.cpu(), rollout.truncated.cpu(),
                                         reward_sum(table, self.reward_weights), completions, table,
                                         int(rollout.stats["generated_tokens"]))))
        parts = sorted((p for rank_parts in distributed.all_gather_objects(mine) for p in rank_parts),
                       key=lambda cp: cp[0])
        return _concat([b for _, b in parts], self.eot)

    def rollout(self, timings: dict) -> tuple[RolloutBatch, dict, RolloutBatch]:
        """The step's batch to train on, its record entries, and every completion sampled for it (with
        dynamic sampling, the dropped groups and the refills too: what the step's reward metrics describe)."""
        cfg, G = self.cfg, self.cfg.group_size
        seed = cfg.seed * 1_000_003 + self.step
        batch = self.collect(self.prompts.draw(cfg.prompts_per_step), seed, timings)
        info = {"dynamic_sampling/refill_rounds": 0}
        if not cfg.dynamic_sampling:
            return batch, {**self._sampled_stats(batch), **info}, batch
        sampled = [batch]
        per_function = cfg.multi_objective_aggregation == "normalize_then_sum"
        # GDPO's advantage is a weighted sum of per-function z-scores: a function of weight 0 adds nothing to it,
        # so a group varied in that function alone has no signal (its advantages are all 0)
        weights = self.reward_weights if per_function else None
        kept = _varied_groups(batch, G, per_function, weights)  # generated_tokens counts every sampled token, dropped groups too
        for round_ in range(cfg.max_refill_rounds):
            if len(kept.items) >= cfg.prompts_per_step * G:
                break
            more = self.collect(self.prompts.draw(cfg.prompts_per_step), _refill_seed(cfg.seed, self.step, round_), timings)
            sampled.append(more)
            kept = _concat([kept, _varied_groups(more, G, per_function, weights)], self.eot)
            info["dynamic_sampling/refill_rounds"] = round_ + 1
        sampled = _concat(sampled, self.eot)
        info = {**self._sampled_stats(sampled), **info}
        if not kept.items:  # every group tied: keep the original batch (zero gradient, logged)
            return batch, info, sampled
        n = min(len(kept.items), cfg.prompts_per_step * G)
        return _select_groups(kept, torch.arange(len(kept.items) // G) < n // G, G), info, sampled

    def _sampled_stats(self, sampled: RolloutBatch) -> dict:
        """TRL's frac_reward_zero_std (on the std that scale_rewards, or GDPO's aggregation, uses; unscorable
        completions left out) and reward_std (of the weighted rewards `reward` averages), over every completion
        the step sampled: with dynamic sampling, the refills and the groups it drops too, as `reward`."""
        stats = grpo.group_advantages(sampled.reward_table, self.cfg.group_size, scale=self.cfg.scale_rewards,
                                      reward_weights=self.reward_weights,
                                      multi_objective_aggregation=self.cfg.multi_objective_aggregation)[1]
        return {"frac_reward_zero_std": stats.frac_reward_zero_std, "reward_std": stats.reward_std}

    # -- one step ---------------------------------------------------------------------------

    def train_step(self) -> dict:
        """One GRPO step (steps 1-5 of the module docstring); returns its metrics record."""
        with self.runtime.attention_backends(cudnn=self.cfg.cudnn_attention):
            return self._step()

    def _step(self) -> dict:
        cfg = self.cfg
        self.model.eval()  # dropout off for sampling, scoring and the update (see module docstring)
        timings = {"sampling": 0.0, "scoring": 0.0, "update": 0.0}
        t_start = time.perf_counter()
        batch, info, sampled = self.rollout(timings)
        if batch.reward_table.isnan().all():
            warnings.warn("GRPO: every reward function gave None (or NaN) for every completion of a step, so the "
                          "step has no reward to learn from; check the reward functions", stacklevel=2)
        if self.tokens_seen is not None:
            self.tokens_seen += sum(map(len, batch.prompt_ids)) + int(batch.mask.sum())
        adv, adv_stats = grpo.group_advantages(batch.reward_table, cfg.group_size, scale=cfg.scale_rewards,
                                               reward_weights=self.reward_weights,
                                               multi_objective_aggregation=cfg.multi_objective_aggregation)
        self.last_batch, self.last_advantages = batch, adv  # kept for inspection in notebooks and tests
        lr = self.schedule.apply(self.optimizer, self.step)
        t0 = time.perf_counter()
        updates = self._update(batch, adv)
        timings["update"] += time.perf_counter() - t0
        record = {"step": self.step + 1, "learning_rate": lr, **self._loss_record(updates)}
        if "advantages/mean" in record:  # the step's batch, not the mean over its minibatches of each one's spread
            record["advantages/mean"], record["advantages/std"] = adv.mean().item(), adv.std(correction=0).item()
        # info after the loss metrics: frac_reward_zero_std is measured before dynamic sampling drops groups
        record.update(info)
        record.update({f"group/{k}": v for k, v in adv_stats.as_metrics().items()})
        record.update(self._batch_record(sampled, timings, time.perf_counter() - t_start))
        record["num_completions"] = len(batch.items)  # the step's trained ones (a loss call's are a minibatch's)
        if cfg.dynamic_sampling:  # the kept groups' mean reward: above the sampled one, since tied groups go
            record["dynamic_sampling/kept_reward"] = _scored(batch).nanmean().item()
        self.last_rollout = self._rollout_rows(batch, adv, updates["row_stats"])
        self.step += 1
        return record

    def after_step(self, record: dict) -> None:
        """At step 1 and every completions_interval steps: the step's completions to completions.jsonl
        and, as a table, to TensorBoard (rank 0, in train())."""
        every, step = self.cfg.completions_interval, record["step"]
        if not every or (step % every and step != 1):
            return
        if (out := self.logs.get(COMPLETIONS_FILE)) is not None:
            for row in self.last_rollout:
                out.write(row)
        if self.tensorboard is not None:
            self.tensorboard.add_text("completions", completions_markdown(self.last_rollout), step)

    def _rollout_rows(self, batch: RolloutBatch, adv: torch.Tensor, row_stats: torch.Tensor) -> list[dict]:
        """The step's completions as COMPLETION_KEYS rows; each rank measured the ratios of its rows."""
        ratio, clip = torch.stack(distributed.all_gather_objects(row_stats.cpu())).nanmean(0).tolist()
        G, step = self.cfg.group_size, self.step + 1
        # the reward as the metrics take it: NaN (null in the file) where no reward function scored the completion
        rewards = batch.rewards.masked_fill(batch.reward_table.isnan().all(1), float("nan"))
        return to_jsonable([dict(zip(COMPLETION_KEYS, (step, i // G, item.task, item.prompt, text, *values)))
                            for i, (item, text, *values) in enumerate(zip(batch.items, batch.completions,
                                                                          rewards.tolist(), adv.tolist(),
                                                                          ratio, clip))])

    def _update(self, batch: RolloutBatch, adv: torch.Tensor) -> dict:
        """`mu` passes over the batch in minibatches, each an optimizer step on grpo_loss (skipped,
        and counted by the guard, when non-finite; the loop stops once the guard trips)."""
        cfg, rt, W = self.cfg, self.runtime, self.dist.world_size
        dev = rt.device
        tokens, old_lp, mask = batch.tokens.to(dev), batch.old_logprobs.to(dev), batch.mask.to(dev)
        truncated, adv = batch.truncated.to(dev), adv.to(dev)
        ref_lp = None
        if self.ref is not None:
            with torch.no_grad(), rt.autocast():
                ref_lp = sequence_logprobs(self.ref, batch.prompt_ids, tokens, cfg.temperature, self.eot).float()
        n = len(batch.items)
        effective = grpo.effective_mask(mask, truncated, cfg.loss)
        out = {"metrics": [], "grad_norms": [], "losses": [], "first": None,
               "row_stats": torch.full((2, n), float("nan"), device=dev)}  # see _row_ratio_stats
        # fp32 on a CPU: score with the head fused into the log-softmax (no (rows, tokens, V) logits;
        # 1.65x faster at cpu-small); the entropy bonus needs the logits themselves
        fused = dev.type == "cpu" and rt.amp_dtype is None and cfg.loss.entropy_coef == 0
        gen = torch.Generator().manual_seed(cfg.seed * 7_919 + self.step)
        for pass_ in range(cfg.mu):
            order = torch.randperm(n, generator=gen)  # the same on every rank
            for start in range(0, n, cfg.minibatch_size):
                global_rows = order[start:start + cfg.minibatch_size]
                rows = self.my_rows(global_rows).to(dev)
                prompts = [batch.prompt_ids[i] for i in rows.tolist()]
                with rt.autocast():  # fused: (log-probs, entropies); else (log-probs, logits)
                    lp, extra = sequence_logprobs(self.policy, prompts, tokens[rows], cfg.temperature, self.eot,
                                                  return_logits=not fused, return_entropy=fused)
                logits, entropy = (None, extra) if fused else (extra, None)
                # Normalise by the whole minibatch's counts (all ranks), then undo DDP's mean over ranks.
                loss, metrics = grpo.grpo_loss(
                    lp.float(), old_lp[rows], adv[rows], mask[rows],
                    ref_logprobs=None if ref_lp is None else ref_lp[rows], config=cfg.loss, logits=logits, entropy=entropy,
                    truncated=truncated[rows],
                    num_items_in_batch=float(effective[global_rows.to(dev)].sum()),
                    num_completions_in_batch=len(global_rows))
                out["first"] = out["first"] or metrics  # scored before any update: its ratio must be 1
                if pass_ == 0:  # each row's ratio at its first update, from tensors at hand (no host sync)
                    out["row_stats"][:, rows] = _row_ratio_stats(lp.detach().float(), old_lp[rows], effective[rows],
                                                                 cfg.loss)
                self.optimizer.zero_grad(set_to_none=True)
                (loss * W).backward()
                norm = clip_grad_norm(self.model, cfg.grad_clip)
                global_loss = distributed.all_reduce_sum(loss.item())
                if self.guard.observe(global_loss, norm):  # every rank decides alike
                    self.optimizer.step()
                    out["grad_norms"].append(norm.item())
                    out["losses"].append(global_loss)
                    out["metrics"].append(metrics)
                self.optimizer.zero_grad(set_to_none=True)
                if self.guard.tripped:
                    return out
        return out

    def _loss_record(self, updates: dict) -> dict:
        """The loss metrics averaged over the step's applied updates, each update's taken over its whole
        minibatch (every rank's rows: _merge_ranks), so that they do not depend on the process count."""
        record = {}
        per_rank = distributed.all_gather_objects(updates["metrics"])  # the ranks apply the same updates
        sequence = self.cfg.loss.importance_sampling_level == "sequence"
        gathered = [_merge_ranks(list(ms), sequence) for ms in zip(*per_rank)]
        for key in (gathered[0] if gathered else {}):
            record[key] = _mean([m[key] for m in gathered])
        # The ratios above average over minibatches, later ones after updates (off-policy). The first
        # minibatch is scored by the same weights that sampled: any deviation of its ratio from 1 is
        # a sampler/trainer log-prob mismatch (precision, temperature, masking), not learning.
        record["ratio/onpolicy_dev"] = onpolicy_deviation(distributed.all_gather_objects(updates["first"]))
        record.update({"loss": _mean(updates["losses"]), "grad_norm": _mean(updates["grad_norms"]),
                       "nonfinite/total": self.guard.total})
        return record

    def _batch_record(self, batch: RolloutBatch, timings: dict, elapsed: float) -> dict:
        """Rewards per task, completion lengths, truncation and timings of what the step sampled (with
        dynamic sampling, the groups it dropped too: else the reward would fall as more groups tie at the
        top). As TRL, an unscorable completion (every function gave None) is left out of the reward means."""
        record = {}
        rewards = _scored(batch)
        by_task = [(t, rewards[torch.tensor([i.task == t for i in batch.items])]) for t in self.prompts.tasks]
        # each task's total, then each function's (TRL's), over the rows each scored; none (a task no prompt of
        # the step drew, a function that scored nothing): NaN (null), as TRL's nanmean logs it
        for name, column in by_task + list(zip(self.reward_names, batch.reward_table.T)):
            scored = column[~column.isnan()]
            record[f"rewards/{name}/mean"] = scored.mean().item() if scored.numel() else float("nan")
            record[f"rewards/{name}/std"] = scored.std().item() if scored.numel() > 1 else float("nan")  # nanstd
        lengths = batch.mask.sum(1).float()
        # a phase's time is its slowest rank's (with fewer rollout chunks than ranks, some sample nothing)
        sampling_s, scoring_s = distributed.all_reduce_max(timings["sampling"]), distributed.all_reduce_max(timings["scoring"])
        record.update({"reward": rewards.nanmean().item(), "completions/mean_length": lengths.mean().item(),
                       "completions/max_length": lengths.max().item(), "completions/clipped_ratio": batch.truncated.float().mean().item(),
                       "time/sampling": sampling_s, "time/scoring": scoring_s,
                       "time/update": timings["update"], "time/step": elapsed,
                       "throughput/generated_tokens_per_s": batch.generated_tokens / max(sampling_s, 1e-9),
                       "num_tokens": self.tokens_seen,  # as TRL's: prompt and completion tokens so far
                       "world_size": self.dist.world_size})
        return record


def _row_ratio_stats(lp: torch.Tensor, old_lp: torch.Tensor, m: torch.Tensor, loss: grpo.GRPOConfig) -> torch.Tensor:
    """[2, rows]: each completion's mean ratio new/old over its loss tokens `m` (as grpo_loss forms the
    ratio: per token, or GSPO's per sequence) and the fraction of those tokens outside the clip range
    [1 - clip_eps_low, 1 + clip_eps_high]; NaN for a completion without loss tokens."""
    r = grpo.importance_log_weights(lp, old_lp, m, loss.importance_sampling_level, loss.log_ratio_clamp).exp()
    r = r.expand_as(m)
    outside = (r < 1.0 - loss.clip_eps_low) | (r > 1.0 + loss.clip_eps_high)
    n = m.sum(dim=1)
    return torch.stack([torch.where(m, r, 0.0).sum(dim=1), (outside & m).sum(dim=1).to(r.dtype)]) / n


def completions_markdown(rows: list[dict]) -> str:
    """Completions rows as a Markdown table (TensorBoard's text tab renders it)."""
    cols = ("group", "task", "reward", "advantage", "ratio", "clip_fraction", "prompt", "completion")

    def cell(v):
        text = "" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)
        return text.replace("|", "\\|").replace("\n", "\\n")

    return "\n".join([f"| {' | '.join(cols)} |", "|" + " --- |" * len(cols)]
                     + [f"| {' | '.join(cell(r[c]) for c in cols)} |" for r in rows])


_RANK_SUMS = ("loss", "loss/policy", "num_tokens", "num_completions")  # each rank holds a part of the sum
_PER_COMPLETION = ("vespo/phi_seq_mean",)  # (advantages/mean and /std: the step's whole batch, set in _step)


def _merge_ranks(ms: list[dict], sequence: bool) -> dict:
    """One update's metrics (grpo.grpo_loss) over the whole minibatch, from each rank's over its rows:
    sums summed, means weighted by their rows' tokens (completions for per-completion ones, and for the
    ratio and clip shares at sequence-level importance sampling: ratio/mean there averages completions
    with tokens, so it is approximate where some have none), extremes the extremes."""
    if len(ms) == 1:
        return ms[0]
    tokens, completions = [m["num_tokens"] for m in ms], [m["num_completions"] for m in ms]
    out = {}
    for key in ms[0]:
        vals = [m[key] for m in ms]
        if key in _RANK_SUMS:
            out[key] = sum(vals)
        elif key in ("ratio/min", "ratio/max"):
            finite = [v for v in vals if math.isfinite(v)]
            out[key] = (min if key == "ratio/min" else max)(finite) if finite else float("nan")
        else:
            by = completions if key in _PER_COMPLETION or (sequence and key.startswith(("ratio/", "clip_ratio/"))) else tokens
            pairs = [(w, v) for w, v in zip(by, vals) if w > 0 and math.isfinite(v)]
            out[key] = sum(w * v for w, v in pairs) / sum(w for w, _ in pairs) if pairs else float("nan")
    return out


def onpolicy_deviation(firsts: list[dict | None]) -> float:
    """The largest |ratio - 1| of the first minibatches (each rank's ratio/min and ratio/max), on either
    side of 1; NaN where none has a ratio (no completion token entered the loss)."""
    return max((max(m["ratio/max"] - 1.0, 1.0 - m["ratio/min"]) for m in firsts
                if m is not None and m["ratio/max"] == m["ratio/max"]), default=float("nan"))


def _mean(values):
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else float("nan")


def check_world_size(cfg: GRPOTrainConfig, world_size: int) -> None:
    """Settings that cannot be split over `world_size` processes (torchrun, --nproc) raise ValueError."""
    if world_size == 1:
        return
    # worded as config checks are (`GRPOTrainConfig.field ...`): the CLI adds the field's option
    n = cfg.prompts_per_step * cfg.group_size
    if cfg.dynamic_sampling:
        raise ValueError(f"GRPOTrainConfig.dynamic_sampling is not supported with more than one process ({world_size}): "
                         "the processes would hold batches of unequal size")
    if cfg.minibatch_size % world_size:
        raise ValueError(f"GRPOTrainConfig.minibatch_size must be a multiple of the number of processes ({world_size}), "
                         f"got {cfg.minibatch_size}")
    if n % world_size:
        raise ValueError(f"GRPOTrainConfig.prompts_per_step times group_size must be a multiple of the number of "
                         f"processes ({world_size}), got {cfg.prompts_per_step} x {cfg.group_size} = {n}")

