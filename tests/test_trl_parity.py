"""Parity with TRL's GRPOTrainer: TRL's *own* code, run on the same tensors as ours.

- The loss: `GRPOTrainer._compute_loss` is called with a stand-in `self` whose per-token log-prob
  function returns fixed tensors (TRL's `_get_per_token_logps_and_entropies` replaced; the
  entropies come from TRL's own `entropy_from_logits`), so loss, gradients (to the log-probs and to
  the logits) and the logged metrics are TRL's, to be matched by `grpo.grpo_loss`.
- The advantages: the block of `GRPOTrainer._generate_and_score_completions` that turns the
  rewards table into advantages (from `unscorable_mask = ...` to `nan_to_num(advantages)`) is cut
  out of TRL's installed source and executed on the same rewards, to be matched by
  `grpo.group_advantages`.

Every documented difference (GRPOConfig's docstring, docs/grpo_options.md) is pinned at the end.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import math
import textwrap
import types
from collections import defaultdict

import pytest
import torch

from rookworld_lib.core import grpo
from rookworld_lib.core.grpo import GRPOConfig, group_advantages, grpo_loss


@functools.cache
def trl_grpo():
    """TRL's GRPO trainer module, imported by the first test that needs it: its import (transformers,
    datasets, accelerate: seconds) is paid by the pytest-xdist worker that runs this file, not by each
    worker that collects it."""
    return pytest.importorskip("trl.trainer.grpo_trainer", reason="trl is in the dev extras (make setup installs it)")


def trl_entropy_from_logits(logits):
    trl_grpo()  # skips the test where trl is missing
    from trl.trainer.utils import entropy_from_logits

    return entropy_from_logits(logits)

F64 = torch.float64
N, T, V = 8, 7, 6


# ------------------------------------------------------------------------------------------
# TRL's loss on fixed tensors
# ------------------------------------------------------------------------------------------

class _OneProcess:
    """accelerate.Accelerator as seen by _compute_loss on one process."""

    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


def trl_loss(lp, old, adv, mask, ref=None, *, loss_type="grpo", beta=0.0, eps_low=0.2, eps_high=0.2, delta=None,
             level="token", logits=None, temperature=1.0, entropy_coef=0.0, bias_kl=True, steps=1, num_items=None,
             max_len=T, vespo=(2.0, 3.0, 3.0, 2.0), steps_per_generation=None):
    """TRL's GRPOTrainer._compute_loss on one micro-batch: (loss, metrics dict of floats).

    steps: gradient_accumulation_steps; steps_per_generation (default: steps) the micro-batches one
    generation batch is split into, over which TRL's num_items_in_batch counts.
    """
    entropies = None
    if logits is not None:
        entropies = trl_entropy_from_logits(logits / temperature)  # TRL scores at logits / temperature
    metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    args = types.SimpleNamespace(
        use_bias_correction_kl=bias_kl, delta=delta, steps_per_generation=steps_per_generation or steps,
        vespo_k_pos=vespo[0], vespo_lambda_pos=vespo[1], vespo_k_neg=vespo[2], vespo_lambda_neg=vespo[3],
        entropy_target=0.2, entropy_coef_delta=0.0, entropy_coef_min=0.0, entropy_coef_max=1.0)
    stub = types.SimpleNamespace(
        args=args, loss_type=loss_type, beta=beta, epsilon_low=eps_low, epsilon_high=eps_high,
        importance_sampling_level=level, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        use_vllm=False, vllm_importance_sampling_correction=False, aux_loss_enabled=False,
        model=types.SimpleNamespace(training=True), current_gradient_accumulation_steps=steps,
        max_completion_length=max_len, accelerator=_OneProcess(), entropy_coef=entropy_coef,
        use_adaptive_entropy=False, _entropy_bonus_enabled=entropy_coef != 0.0, _metrics=metrics,
        _last_world_entropy=float("inf"), _entropy_window_stats=None,
        get_gamma_weights=trl_grpo().GRPOTrainer.get_gamma_weights,
        get_off_policy_mask=trl_grpo().GRPOTrainer.get_off_policy_mask,
        get_high_entropy_mask=lambda *a, **k: None)
    stub._get_per_token_logps_and_entropies = lambda *a, **k: (lp, entropies if entropies is not None
                                                               else torch.zeros_like(lp), None)
    n = lp.shape[0]
    inputs = {
        "prompt_ids": torch.zeros(n, 1, dtype=torch.long), "prompt_mask": torch.ones(n, 1, dtype=torch.long),
        "completion_ids": torch.zeros(n, lp.shape[1], dtype=torch.long), "completion_mask": mask.to(lp.dtype),
        "advantages": adv, "old_per_token_logps": old,
        "num_items_in_batch": torch.tensor(float(num_items if num_items is not None else mask.sum())),
    }
    if ref is not None:
        inputs["ref_per_token_logps"] = ref
    loss = trl_grpo().GRPOTrainer._compute_loss(stub, None, inputs)
    return loss, {k: v[-1] for k, v in metrics["train"].items()}


def make_batch(seed=0):
    """Ragged rows (one empty, one full), off-policy by enough to clip on both sides."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([3, T, 0, 5, 1, 6, 4, 2])
    mask = torch.arange(T)[None, :] < lengths[:, None]
    old = -torch.rand(N, T, generator=g, dtype=F64) * 3 - 0.1
    shift = torch.tensor([0.45, -0.45, 0.3, -0.3, 0.2, 0.05, -0.25, 0.35], dtype=F64)[:, None]
    lp = old + shift + 0.15 * torch.randn(N, T, generator=g, dtype=F64)
    ref = old + 0.3 * torch.randn(N, T, generator=g, dtype=F64)
    adv = torch.tensor([1.0, -0.7, -1.2, 0.4, -0.9, -0.3, 0.6, -0.8], dtype=F64)
    logits = torch.randn(N, T, V, generator=g, dtype=F64) * 2
    return lp, old, adv, mask, ref, logits


def ours(lp, old, adv, mask, ref, cfg, logits=None, **kw):
    return grpo_loss(lp, old, adv, mask, ref, cfg, logits=logits, **kw)


def _leaves(*xs):
    return [None if x is None else x.detach().clone().requires_grad_(True) for x in xs]


def _grads(loss, leaves):
    live = [x for x in leaves if x is not None]
    gs = torch.autograd.grad(loss, live, allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for x, g in zip(live, gs)]


LOSS_METRICS = {"clip_ratio/low_mean": "clip_ratio/low_mean", "clip_ratio/high_mean": "clip_ratio/high_mean",
                "clip_ratio/region_mean": "clip_ratio/region_mean", "kl": "kl", "entropy": "entropy",
                "vespo/phi_seq_mean": "vespo/phi_seq_mean"}


def trl_entropy_coef(entropy_coef, micro_mask, steps, num_items):
    """The coefficient at which TRL's bonus on a micro-batch, entropy_coef * (its token mean) / steps,
    equals ours, entropy_coef * (its entropy sum) / (the accumulated batch's tokens): the whole of
    the documented difference, 1x entropy_coef when every micro-batch holds num_items / steps tokens."""
    return entropy_coef * float(micro_mask.sum()) * steps / max(num_items, 1)


def check_against_trl(loss_type, level, beta, bias_kl, entropy_coef, steps, clip=(0.2, 0.2), delta=None,
                      temperature=1.0, seed=0, truncated=None):
    """One configuration: `steps` equal micro-batches, each through TRL and through grpo_loss.

    truncated [N]: mask_truncated_completions on (TRL zeroes those rows of completion_mask upstream).
    TRL's entropy bonus is taken at `trl_entropy_coef` (it averages per micro-batch, ours per batch).
    """
    lp, old, adv, mask, ref, logits = make_batch(seed)
    eff = mask if truncated is None else mask & ~truncated[:, None]
    cfg = GRPOConfig(loss_type=loss_type, importance_sampling_level=level, beta=beta, clip_eps_low=clip[0],
                     clip_eps_high=clip[1], delta=delta, use_bias_correction_kl=bias_kl, entropy_coef=entropy_coef,
                     temperature=temperature, max_completion_length=T, log_ratio_clamp=None,
                     mask_truncated_completions=truncated is not None)
    use_logits = entropy_coef > 0
    ref_in = ref if beta > 0 else None
    a_lp, a_lg = _leaves(lp, logits if use_logits else None)
    b_lp, b_lg = _leaves(lp, logits if use_logits else None)
    num_items = int(eff.sum())
    size = N // steps
    for s in range(0, N, size):
        sl = slice(s, s + size)
        t_loss, t_m = trl_loss(a_lp[sl], old[sl], adv[sl], eff[sl], None if ref_in is None else ref_in[sl],
                               loss_type=loss_type, beta=beta, eps_low=clip[0], eps_high=clip[1], delta=delta,
                               level=level, logits=None if a_lg is None else a_lg[sl], temperature=temperature,
                               entropy_coef=trl_entropy_coef(entropy_coef, eff[sl], steps, num_items),
                               bias_kl=bias_kl, steps=steps, num_items=num_items)
        o_loss, o_m = ours(b_lp[sl], old[sl], adv[sl], mask[sl], None if ref_in is None else ref_in[sl], cfg,
                           logits=None if b_lg is None else b_lg[sl], num_items_in_batch=num_items,
                           num_completions_in_batch=N, truncated=None if truncated is None else truncated[sl])
        torch.testing.assert_close(o_loss, t_loss, rtol=1e-10, atol=1e-12)
        for trl_name, our_name in LOSS_METRICS.items():
            if trl_name in t_m and (trl_name != "entropy" or use_logits):
                assert o_m[our_name] == pytest.approx(t_m[trl_name], rel=1e-6, abs=1e-7), (trl_name, s)
        t_loss.backward()
        o_loss.backward()
    torch.testing.assert_close(b_lp.grad, a_lp.grad, rtol=1e-10, atol=1e-12)
    if use_logits:
        torch.testing.assert_close(b_lg.grad, a_lg.grad, rtol=1e-10, atol=1e-12)


SHARED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "vespo")


@pytest.mark.parametrize("loss_type", SHARED_LOSS_TYPES)
def test_loss_gradient_and_metrics_match_trl_over_the_option_grid(loss_type):
    """level x beta x use_bias_correction_kl x entropy_coef x accumulation (1 or 2 micro-batches)."""
    grid = itertools.product(grpo.IMPORTANCE_SAMPLING_LEVELS, (0.0, 0.1), (False, True), (0.0, 0.05), (1, 2))
    for level, beta, bias_kl, entropy_coef, steps in grid:
        if beta == 0.0 and bias_kl:
            continue  # no KL term: the flag has nothing to act on
        check_against_trl(loss_type, level, beta, bias_kl, entropy_coef, steps)


@pytest.mark.parametrize("clip, delta", [((0.2, 0.28), None), ((0.2, 0.2), 1.5), ((0.1, 0.3), 1.4)])
@pytest.mark.parametrize("level", grpo.IMPORTANCE_SAMPLING_LEVELS)
def test_clip_higher_and_two_sided_clipping_match_trl(clip, delta, level):
    for loss_type in ("grpo", "dapo"):
        check_against_trl(loss_type, level, 0.04, True, 0.0, 2, clip=clip, delta=delta, seed=1)


def test_entropy_bonus_at_a_temperature_matches_trl():
    for loss_type in SHARED_LOSS_TYPES:
        check_against_trl(loss_type, "token", 0.0, False, 0.1, 4, temperature=0.7, seed=2)


def test_on_policy_matches_trl():
    lp, _, adv, mask, ref, _ = make_batch(3)
    for loss_type, bias_kl in itertools.product(SHARED_LOSS_TYPES, (False, True)):
        cfg = GRPOConfig(loss_type=loss_type, beta=0.1, use_bias_correction_kl=bias_kl, max_completion_length=T)
        (a,), (b,) = _leaves(lp), _leaves(lp)
        t_loss, _ = trl_loss(a, a.detach(), adv, mask, ref, loss_type=loss_type, beta=0.1, bias_kl=bias_kl)
        o_loss, _ = grpo_loss(b, b.detach(), adv, mask, ref, cfg)
        torch.testing.assert_close(o_loss, t_loss, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(_grads(o_loss, [b])[0], _grads(t_loss, [a])[0], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("steps", (1, 2, 4))
def test_mask_truncated_completions_matches_trl(steps):
    """TRL zeroes truncated rows of completion_mask upstream; ours takes the flag and `truncated`.
    With the entropy bonus, in one batch and under accumulation, where the micro-batches hold
    unequal token counts (8 and 12, or 3, 5, 6 and 6)."""
    truncated = torch.tensor([False, True, False, False, True, False, False, False])
    for loss_type, level in itertools.product(SHARED_LOSS_TYPES, grpo.IMPORTANCE_SAMPLING_LEVELS):
        check_against_trl(loss_type, level, 0.05, True, 0.05, steps, seed=4, truncated=truncated)


def test_sequence_clip_fraction_counts_empty_rows_as_trl():
    """Issue item 2: with a fully masked row, TRL divides by all rows; so do we now."""
    lp, old, adv, mask, _, _ = make_batch(0)
    assert not mask[2].any()
    _, t_m = trl_loss(lp, old, adv, mask, level="sequence")
    _, o_m = grpo_loss(lp, old, adv, mask, config=GRPOConfig(importance_sampling_level="sequence"))
    assert t_m["clip_ratio/region_mean"] > 0
    assert o_m["clip_ratio/region_mean"] == pytest.approx(t_m["clip_ratio/region_mean"], abs=1e-7)
    assert o_m["clip_ratio/region_mean"] * N == pytest.approx(round(o_m["clip_ratio/region_mean"] * N))  # out of all 8 rows


# ------------------------------------------------------------------------------------------
# TRL's advantages on the same rewards
# ------------------------------------------------------------------------------------------

def _trl_block(first: str, last: str) -> str:
    """The lines of _generate_and_score_completions from the one holding `first` to the one holding `last`."""
    src = inspect.getsource(trl_grpo().GRPOTrainer._generate_and_score_completions)
    start = src.rindex("\n", 0, src.index(first)) + 1
    stop = src.index("\n", src.index(last, start))
    return textwrap.dedent(src[start:stop])


@functools.cache
def trl_advantage_code():
    return compile(_trl_block("unscorable_mask = torch.isnan(rewards_per_func)",
                              "advantages = torch.nan_to_num(advantages, nan=0.0)"), "<trl advantages>", "exec")


@functools.cache
def trl_reward_metrics_code():
    return compile(_trl_block("rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)",
                              '["frac_reward_zero_std"].append('), "<trl reward metrics>", "exec")


def trl_advantages(rewards_per_func: torch.Tensor, G: int, scale: str = "group",
                   aggregation: str = "sum_then_normalize", weights=None):
    """(advantages, logged metrics: frac_reward_zero_std, reward, reward_std) from TRL's own code (float32)."""
    K = rewards_per_func.shape[1]
    stub = types.SimpleNamespace(
        multi_objective_aggregation=aggregation, scale_rewards=scale, reward_funcs=[None] * K,
        reward_weights=torch.tensor(weights if weights is not None else [1.0] * K, dtype=torch.float32),
        _metrics={"train": defaultdict(list)})
    ns = {"torch": torch, "nanstd": trl_grpo().nanstd, "self": stub, "device": "cpu", "mode": "train",
          "rewards_per_func": rewards_per_func.float(), "num_generations": G}
    exec(trl_advantage_code(), ns)
    exec(trl_reward_metrics_code(), ns)
    return ns["advantages"], {k: v[-1] for k, v in stub._metrics["train"].items()}


@functools.cache
def trl_logged_rewards_code():
    return compile(_trl_block("for i, reward_func_name in enumerate(self.reward_func_names):",
                              '["frac_reward_zero_std"].append('), "<trl logged rewards>", "exec")


def trl_logged_rewards(rewards_per_func: torch.Tensor, G: int, names: list[str], aggregation: str, weights) -> dict:
    """What TRL logs of a step's rewards (reward, reward_std, frac_reward_zero_std, rewards/<name>/mean
    and /std), from its own code, after its own advantage code (scale "group")."""
    stub = types.SimpleNamespace(
        multi_objective_aggregation=aggregation, scale_rewards="group", reward_funcs=[None] * len(names),
        reward_func_names=names, reward_weights=torch.tensor(weights, dtype=torch.float32),
        _metrics={"train": defaultdict(list)})
    ns = {"torch": torch, "nanstd": trl_grpo().nanstd, "self": stub, "device": "cpu", "mode": "train",
          "rewards_per_func": rewards_per_func.float(), "num_generations": G}
    exec(trl_advantage_code(), ns)
    exec(trl_logged_rewards_code(), ns)
    return {k: v[-1] for k, v in stub._metrics["train"].items()}


def reward_tables():
    """[N, K] rewards: plain, ties, NaN here and there, unscorable rows and a whole unscorable group."""
    g = torch.Generator().manual_seed(7)
    plain = torch.rand(12, 1, generator=g)
    tied = plain.clone()
    tied[0:4] = 0.5  # an exactly tied group
    nan1 = tied.clone()
    nan1[5, 0] = float("nan")  # one unscorable completion
    nan1[9:11, 0] = float("nan")  # a group with two left
    lone = plain.clone()
    lone[4:7, 0] = float("nan")  # a group with a single scorable completion
    allnan = plain.clone()
    allnan[8:12, 0] = float("nan")  # a whole group unscorable
    two = torch.rand(12, 2, generator=g)
    two[0:4, 1] = 0.25  # function 1 tied in group 0
    two[3, 0] = float("nan")  # partially scored
    two[6, :] = float("nan")  # unscorable: both functions NaN
    two[8:12, 0] = float("nan")  # function 0 never applies to group 2
    return {"plain": plain, "tied": tied, "nan": nan1, "lone": lone, "allnan": allnan, "two": two}


@pytest.mark.parametrize("aggregation", grpo.MULTI_OBJECTIVE_AGGREGATIONS)
@pytest.mark.parametrize("scale", grpo.ADVANTAGE_SCALES)
def test_advantages_and_frac_reward_zero_std_match_trl(scale, aggregation):
    for name, table in reward_tables().items():
        weights = [1.0, 0.5] if table.shape[1] == 2 else None
        for G in (4, 2):
            want, trl_m = trl_advantages(table, G, scale, aggregation, weights)
            rewards = table[:, 0] if table.shape[1] == 1 and G == 4 else table  # [N] and [N, 1] alike
            got, stats = group_advantages(rewards, G, scale=scale, reward_weights=weights,
                                          multi_objective_aggregation=aggregation)
            torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5, msg=f"{name} G={G}")
            assert stats.frac_reward_zero_std == pytest.approx(trl_m["frac_reward_zero_std"]), (name, G)
            assert stats.reward_mean == pytest.approx(trl_m["reward"], rel=1e-6, abs=1e-6), (name, G)
            assert stats.reward_std == pytest.approx(trl_m["reward_std"], rel=1e-5, abs=1e-6), (name, G)
            assert stats.num_unscorable == int(torch.isnan(table).all(1).sum())


@pytest.mark.parametrize("aggregation", grpo.MULTI_OBJECTIVE_AGGREGATIONS)
def test_the_trainers_logged_rewards_are_trls(aggregation):
    """GRPOTrainer's step record logs a step's rewards as TRL's trainer does: `reward` and
    `reward_std` over the scorable completions, `frac_reward_zero_std` on the std the aggregation
    scales by, `rewards/<function>/mean` and `/std` (Bessel) for every function, one included."""
    from rookworld_lib.core.model import GPT, GPTConfig
    from rookworld_lib.core.train_grpo import GRPOTrainConfig, GRPOTrainer, PromptItem

    for name, table in reward_tables().items():
        K = table.shape[1]
        names = ["first", "second"][:K]
        weights = [1.0, 0.5][:K]

        def column(k):
            def reward(prompts, completions, **_):
                return [None if math.isnan(v) else v for v in table[:, k].tolist()]
            reward.__name__ = names[k]
            return reward
        torch.manual_seed(0)
        cfg = GRPOTrainConfig(steps=1, prompts_per_step=3, group_size=4, max_new_tokens=2,
                              multi_objective_aggregation=aggregation, progress=False, report_to="none", seed=0,
                              loss=GRPOConfig(beta=0.0))
        trainer = GRPOTrainer(GPT(GPTConfig.preset("tiny", block_size=32)), [PromptItem("P", f"Q: {i}") for i in range(3)],
                              cfg, reward_funcs=[column(k) for k in range(K)], reward_weights=weights)
        record = trainer.train()[-1]
        want = trl_logged_rewards(table, 4, names, aggregation, weights)
        for key, value in want.items():
            got = record.get(key)
            if math.isnan(value):
                assert got is None or math.isnan(got), (name, key, got)
            else:
                assert got == pytest.approx(value, rel=1e-5, abs=1e-6), (name, key, got, value)


def test_frac_reward_zero_std_under_batch_scaling_is_trls():
    """Issue item 3: under scale="batch" TRL measures the batch std: 0 unless the whole batch ties."""
    rewards = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.25, 0.75])
    frac = trl_advantages(rewards[:, None], 2, "batch")[1]["frac_reward_zero_std"]
    _, stats = group_advantages(rewards, 2, scale="batch")
    assert frac == stats.frac_reward_zero_std == 0.0
    _, stats = group_advantages(rewards, 2, scale="group")
    assert stats.frac_reward_zero_std == trl_advantages(rewards[:, None], 2, "group")[1]["frac_reward_zero_std"] == 0.5
    _, stats = group_advantages(torch.full((4,), 0.3), 2, scale="batch")
    assert stats.frac_reward_zero_std == 1.0


def test_none_rewards_are_unscorable_as_in_trl():
    """A reward function returning None (TRL: NaN) leaves the completion out, with advantage 0."""
    got, stats = group_advantages([1.0, None, 0.0, 0.5], 4)
    want, _ = trl_advantages(torch.tensor([[1.0], [float("nan")], [0.0], [0.5]]), 4)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert got[1] == 0 and stats.num_unscorable == 1


# ------------------------------------------------------------------------------------------
# Documented differences, pinned
# ------------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers 5 renames TRL still calls
def test_difference_defaults(tmp_path):
    """Defaults differ (DeepSeekMath here, TRL's own there); every option exists under both names."""
    ours_cfg = GRPOConfig()
    trl_cfg = pytest.importorskip("trl").GRPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    assert (ours_cfg.loss_type, trl_cfg.loss_type) == ("grpo", "dapo")
    assert (ours_cfg.beta, trl_cfg.beta) == (0.04, 0.0)
    assert (ours_cfg.use_bias_correction_kl, trl_cfg.use_bias_correction_kl) == (False, True)
    assert (ours_cfg.clip_eps_low, ours_cfg.clip_eps_high) == (trl_cfg.epsilon, 0.2)
    assert trl_cfg.epsilon_high is None  # TRL's trainer then uses epsilon, as our clip_eps_high default 0.2
    assert ours_cfg.entropy_coef == trl_cfg.entropy_coef == 0.0
    assert ours_cfg.importance_sampling_level == trl_cfg.importance_sampling_level == "token"
    assert ours_cfg.mask_truncated_completions == trl_cfg.mask_truncated_completions is False
    assert ours_cfg.delta is None and trl_cfg.delta is None
    assert trl_cfg.scale_rewards == "group" and trl_cfg.multi_objective_aggregation == "sum_then_normalize"
    assert (ours_cfg.vespo_k_pos, ours_cfg.vespo_lambda_pos, ours_cfg.vespo_k_neg, ours_cfg.vespo_lambda_neg) == \
        (trl_cfg.vespo_k_pos, trl_cfg.vespo_lambda_pos, trl_cfg.vespo_k_neg, trl_cfg.vespo_lambda_neg)
    sig = inspect.signature(group_advantages)
    assert sig.parameters["scale"].default == "group" and sig.parameters["eps"].default == 1e-4
    assert sig.parameters["multi_objective_aggregation"].default == "sum_then_normalize"


def test_difference_log_ratio_clamp():
    """Ours clamps log-ratios at +-20 by default; TRL exponentiates unclamped. Equal within the clamp."""
    lp, old, adv, mask, ref, _ = make_batch(5)
    big = lp.clone()
    big[0, 0] = old[0, 0] + 25.0  # beyond the clamp
    cfg = GRPOConfig(loss_type="dapo", beta=0.0)
    t_loss, _ = trl_loss(big, old, adv, mask, loss_type="dapo")
    o_clamped, _ = grpo_loss(big, old, adv, mask, config=cfg)
    o_free, _ = grpo_loss(big, old, adv, mask, config=GRPOConfig(loss_type="dapo", beta=0.0, log_ratio_clamp=None))
    torch.testing.assert_close(o_free, t_loss, rtol=1e-10, atol=1e-12)
    # A = +1 on row 0: the ratio is clipped at 1 + eps either way, so the value agrees; its metric differs
    torch.testing.assert_close(o_clamped, t_loss, rtol=1e-10, atol=1e-12)
    _, m = grpo_loss(big, old, adv, mask, config=cfg)
    assert m["ratio/max"] == pytest.approx(math.exp(20.0))


def test_the_kl_is_clamped_only_where_its_exp_would_overflow():
    """A token the policy likes e^25 times more than the reference: TRL's KL value and gradient (the clamp
    at +-20 gave it no KL gradient and a kl stuck near 19). A token the reference likes e^25 times more:
    clamped at 20 (TRL exponentiates the 25), so its k3 is e^20 - 21 and its gradient 0."""
    lp, old, adv, mask, ref, _ = make_batch(7)
    ref = ref.clone()
    ref[0, 0], ref[1, 0] = lp[0, 0] - 25.0, lp[1, 0] + 25.0  # both tokens in the mask (rows of 3 and T)
    cfg = GRPOConfig(loss_type="dapo", beta=0.04)
    theirs, ours_ = _leaves(lp), _leaves(lp)
    t_loss, t_m = trl_loss(theirs[0], old, adv, mask, ref, loss_type="dapo", beta=0.04, bias_kl=False)
    o_loss, o_m = grpo_loss(ours_[0], old, adv, mask, ref, cfg)
    t_grad, o_grad = _grads(t_loss, theirs)[0], _grads(o_loss, ours_)[0]
    above = torch.ones_like(mask)
    above[1, 0] = False
    torch.testing.assert_close(o_grad[above], t_grad[above], rtol=1e-10, atol=1e-12)
    assert o_grad[0, 0] != 0 and o_grad[1, 0] == 0 and t_grad[1, 0] != 0
    free = lambda **kw: grpo_loss(lp, old, adv, mask, ref, GRPOConfig(loss_type="dapo", beta=0.04, **kw))[1]["kl"]  # noqa: E731
    n = mask.sum().item()
    assert free(log_ratio_clamp=None) == pytest.approx(t_m["kl"])
    assert free() == pytest.approx(t_m["kl"] - (math.expm1(25.0) - 25.0 - math.expm1(20.0) + 20.0) / n, rel=1e-9)


@pytest.mark.filterwarnings("ignore:GRPOConfig. kl_estimator='k1' without use_bias_correction_kl:UserWarning")
def test_difference_kl_estimators_and_metric_without_beta():
    """TRL has only k3 and logs `kl` only when beta != 0; ours offers k1/k2 and logs kl whenever ref is given."""
    lp, old, adv, mask, ref, _ = make_batch(6)
    _, t_m = trl_loss(lp, old, adv, mask, ref, beta=0.0)
    _, o_m = grpo_loss(lp, old, adv, mask, ref, GRPOConfig(beta=0.0))
    assert "kl" not in t_m and "kl" in o_m
    t_loss, _ = trl_loss(lp, old, adv, mask, ref, beta=0.1, bias_kl=False)
    for est in ("k1", "k2"):
        o_loss, _ = grpo_loss(lp, old, adv, mask, ref, GRPOConfig(beta=0.1, kl_estimator=est, log_ratio_clamp=None))
        assert not torch.allclose(o_loss, t_loss)


def test_difference_unequal_micro_batches():
    """TRL divides grpo / bnpo / dr_grpo losses by the accumulation steps; ours scales by the
    micro-batch's share N / num_completions_in_batch: equal for equal-sized micro-batches (tested
    above), exact (TRL is not) for unequal ones. So is the entropy bonus given num_items_in_batch."""
    lp, old, adv, mask, _, logits = make_batch(7)
    parts = (slice(0, 2), slice(2, 8))
    cfg = GRPOConfig(loss_type="dr_grpo", max_completion_length=T, entropy_coef=0.05)
    full, _ = grpo_loss(lp, old, adv, mask, config=cfg, logits=logits)
    ours_sum = sum(grpo_loss(lp[sl], old[sl], adv[sl], mask[sl], config=cfg, logits=logits[sl],
                             num_items_in_batch=int(mask.sum()), num_completions_in_batch=N)[0] for sl in parts)
    trl_full, _ = trl_loss(lp, old, adv, mask, loss_type="dr_grpo", logits=logits, entropy_coef=0.05)
    trl_sum = sum(trl_loss(lp[sl], old[sl], adv[sl], mask[sl], loss_type="dr_grpo", logits=logits[sl],
                           entropy_coef=0.05, steps=2)[0] for sl in parts)
    torch.testing.assert_close(full, trl_full, rtol=1e-12, atol=1e-12)  # one batch: the same loss
    torch.testing.assert_close(ours_sum, full, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(trl_sum, trl_full)


def test_difference_exact_zero_for_tied_groups():
    """A tied group: exactly 0 here; TRL's float32 (x - mean) / (0 + 1e-4) can leave rounding noise."""
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.2, 0.9])
    got, _ = group_advantages(rewards, 3)
    want, _ = trl_advantages(rewards[:, None], 3)
    assert torch.all(got[:3] == 0)
    assert want[:3].abs().max() < 1e-2  # 3 * 0.1 / 3 != 0.1 in float32: noise of order ulp / eps
    torch.testing.assert_close(got[3:], want[3:], rtol=1e-5, atol=1e-5)


def test_difference_inf_rewards_raise():
    """TRL lets inf through to NaN advantages; ours refuses it (NaN / None mark unscorable)."""
    with pytest.raises(ValueError, match="inf"):
        group_advantages([1.0, float("inf")], 2)


def test_difference_not_implemented_options_are_absent():
    """TRL options with no counterpart here (docs/grpo_options.md lists them)."""
    names = {f.name for f in dataclasses.fields(GRPOConfig)}
    for trl_only in ("top_entropy_quantile", "off_policy_mask_threshold", "use_adaptive_entropy",
                     "sapo_temperature_pos", "vllm_importance_sampling_correction"):
        assert trl_only not in names
    for loss_type in ("cispo", "sapo", "luspo"):
        with pytest.raises(ValueError, match="loss_type"):
            GRPOConfig(loss_type=loss_type)


def test_difference_entropy_bonus_under_accumulation_is_the_batch_token_mean():
    """TRL's bonus is each micro-batch's token mean / steps; ours the accumulated batch's token mean.

    Hand-computed: no policy signal (A = 0), T = 3, V = 4, two micro-batches of two rows.
    Micro-batch 1: row 0 truncated (masked by mask_truncated_completions), row 1 one token at
    uniform logits (H = log 4). Micro-batch 2: rows 2 and 3 two tokens each, uniform over two
    tokens (H = log 2). Five tokens, 6 log 2 nats: ours -c * 6 log 2 / 5 = -1.2 c log 2, the one-batch
    value (TRL's own at one step); TRL's sum -c * (log 4 / 1 + 4 log 2 / 4) / 2 = -1.5 c log 2, the
    lone token of micro-batch 1 weighing as much as the four of micro-batch 2.
    """
    c, steps = 0.1, 2
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    truncated = torch.tensor([True, False, False, False])
    eff = mask & ~truncated[:, None]
    logits = torch.zeros(4, 3, 4, dtype=F64)
    logits[2:, :, 2:] = -100.0  # two live tokens: H = log 2 (to 1e-40)
    lp = torch.full((4, 3), -1.0, dtype=F64)
    adv = torch.zeros(4, dtype=F64)
    cfg = GRPOConfig(loss_type="dapo", entropy_coef=c, mask_truncated_completions=True)
    parts = (slice(0, 2), slice(2, 4))
    ours_sum = sum(grpo_loss(lp[sl], lp[sl], adv[sl], mask[sl], config=cfg, logits=logits[sl], truncated=truncated[sl],
                             num_items_in_batch=5, num_completions_in_batch=4)[0] for sl in parts)
    trl_sum = sum(trl_loss(lp[sl], lp[sl], adv[sl], eff[sl], loss_type="dapo", logits=logits[sl], entropy_coef=c,
                           steps=steps, num_items=5)[0] for sl in parts)
    trl_one_batch, _ = trl_loss(lp, lp, adv, eff, loss_type="dapo", logits=logits, entropy_coef=c)
    assert float(ours_sum) == pytest.approx(-1.2 * c * math.log(2), rel=1e-12)
    assert float(trl_one_batch) == pytest.approx(-1.2 * c * math.log(2), rel=1e-12)
    assert float(trl_sum) == pytest.approx(-1.5 * c * math.log(2), rel=1e-12)


@pytest.mark.parametrize("loss_type, ours_want, trl_want", [("dapo", (-1.0, 1.0), (-0.5, 1.5)),
                                                             ("vespo", (1.0, -2.0), (0.5, -3.0))])
def test_difference_window_tokens_with_steps_per_generation(loss_type, ours_want, trl_want):
    """dapo / vespo divide by the accumulation window's effective tokens: ours counts them
    (num_items_in_batch = the window's), TRL estimates them from its generation batch as
    num_items_in_batch * gradient_accumulation_steps / steps_per_generation.

    Hand-computed, on-policy (ratio 1, VESPO weight phi(1) = 1): the loss is -sum_it A_i / K (dapo)
    or -sum_it A_i lp_it / K (vespo). One generation batch of two windows (steps_per_generation=2,
    gradient_accumulation_steps=1): window 1 one token (lp -1, A 1), window 2 three tokens (lp -1,
    -2, -3, A -1). Ours: K = 1 and 3, each window's own one-batch loss (dapo -1 and 1, vespo 1 and
    -2); TRL: K = 4 * 1 / 2 = 2 for both, so window 1 gets half its loss and gradient, window 2 1.5x.
    """
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    lp = torch.tensor([[-1.0, 0.0, 0.0], [-1.0, -2.0, -3.0]], dtype=F64)
    adv = torch.tensor([1.0, -1.0], dtype=F64)
    cfg = GRPOConfig(loss_type=loss_type)
    for row in range(2):
        sl = slice(row, row + 1)
        k = int(mask[sl].sum())
        ours_loss, _ = grpo_loss(lp[sl], lp[sl], adv[sl], mask[sl], config=cfg, num_items_in_batch=k)
        trl_window, _ = trl_loss(lp[sl], lp[sl], adv[sl], mask[sl], loss_type=loss_type, num_items=4,
                                 steps=1, steps_per_generation=2)
        trl_own_batch, _ = trl_loss(lp[sl], lp[sl], adv[sl], mask[sl], loss_type=loss_type, num_items=k)
        assert float(ours_loss) == pytest.approx(ours_want[row], rel=1e-12) == float(trl_own_batch)
        assert float(trl_window) == pytest.approx(trl_want[row], rel=1e-12)
