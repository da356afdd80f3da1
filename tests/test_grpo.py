"""Tests for rookworld_lib.core.grpo.

The centrepiece is `reference_loss`: the GRPO objective written out from the papers' formulas
(DeepSeekMath eq. 3, DAPO eq. 8, Dr. GRPO, GSPO eq. 5-7, Schulman's k1/k2/k3) with explicit
Python loops over completions and tokens, in float64 scalars, sharing no code with grpo.py.
grpo_loss must match its value and its gradient (by autograd through both) for every
aggregation mode, both clip sides, both importance-sampling levels and each KL estimator.
"""

from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rookworld_lib.core import grpo
from rookworld_lib.core.grpo import GRPOConfig, group_advantages, grpo_loss

F64 = torch.float64


# ------------------------------------------------------------------------------------------
# Independent reference (loops, scalars, paper formulas)
# ------------------------------------------------------------------------------------------

def _clamp_scalar(x, c):
    if c is None:
        return x
    if x > c:
        return x * 0 + c  # constant: no gradient beyond the clamp
    if x < -c:
        return x * 0 - c
    return x


def _entropy_scalar(logit_row, temperature):
    z = [v / temperature for v in logit_row]
    zmax = max(float(v.detach()) for v in z)
    exps = [torch.exp(v - zmax) for v in z]
    total = sum(exps)
    h = 0.0
    for e in exps:
        p = e / total
        h = h - p * torch.log(p)
    return h


def _vespo_phi(lp_row, old_row, toks, A, k_pos=2.0, lam_pos=3.0, k_neg=3.0, lam_neg=2.0):
    """VESPO's Gamma weight of one completion (2602.10693 as TRL implements it), a plain float."""
    s = sum(min(max(float(lp_row[t].detach()) - float(old_row[t]), -20.0), 20.0) for t in toks)
    log_w = min(max(s, math.log(1e-8)), 20.0)
    k, lam = (k_pos, lam_pos) if A >= 0 else (k_neg, lam_neg)
    return math.exp(lam + k * log_w - lam * math.exp(log_w))


def reference_loss(lp, old, adv, mask, ref=None, *, loss_type="grpo", eps_low=0.2, eps_high=0.2, level="token",
                   beta=0.0, estimator="k3", delta=None, logits=None, entropy_coef=0.0, temperature=1.0,
                   max_len=None, clamp=None, truncated=None, mask_truncated=False, n_items=None, n_completions=None,
                   bias_kl=False):
    """The GRPO loss for one (micro-)batch, term by term.

    entropy_coef follows TRL: minus entropy_coef times the mean token entropy of this call, scaled
    by its share N / n_completions of the accumulated batch; bias_kl multiplies each token's KL by
    the importance ratio (TRL's use_bias_correction_kl); loss_type "vespo" weights -A * logprob by
    the completion's Gamma weight (a constant) and normalises as dapo.
    """
    N, T = lp.shape
    tokens = []
    for i in range(N):
        if mask_truncated and bool(truncated[i]):
            tokens.append([])
        else:
            tokens.append([t for t in range(T) if bool(mask[i][t])])
    row_sums, lengths = [], []
    for i in range(N):
        A = float(adv[i])
        L = len(tokens[i])
        if level == "sequence" and L:
            s = 0.0
            for t in tokens[i]:
                s = s + (lp[i][t] - float(old[i][t]))
            seq_ratio = torch.exp(_clamp_scalar(s / L, clamp))
        row = 0.0
        phi = _vespo_phi(lp[i], old[i], tokens[i], A) if loss_type == "vespo" else None
        for t in tokens[i]:
            if level == "token":
                r = torch.exp(_clamp_scalar(lp[i][t] - float(old[i][t]), clamp))
            else:
                r = seq_ratio
            if phi is not None:
                term = -phi * A * lp[i][t]
            elif r < 1 - eps_low:
                r_clip = r * 0 + (1 - eps_low)
            elif r > 1 + eps_high:
                r_clip = r * 0 + (1 + eps_high)
            else:
                r_clip = r
            if phi is None:
                r_unclip = r if (delta is None or r <= delta) else r * 0 + delta
                surr1, surr2 = r_unclip * A, r_clip * A
                term = -(surr1 if surr1 <= surr2 else surr2)  # pessimistic (min) bound
            if ref is not None and beta > 0:
                log_r = float(ref[i][t]) - lp[i][t]  # log pi_ref / pi_theta, clamped above only (where exp overflows)
                log_r = log_r if clamp is None or log_r <= clamp else log_r * 0 + clamp
                if estimator == "k1":
                    kl = -log_r
                elif estimator == "k2":
                    kl = 0.5 * log_r * log_r
                else:
                    kl = torch.exp(log_r) - 1 - log_r
                if bias_kl:
                    kl = kl * r
                term = term + beta * kl
            row = row + term
        row_sums.append(row)
        lengths.append(L)
    n_glob = n_completions if n_completions is not None else N
    total_tokens = sum(lengths)
    bonus = 0.0
    if entropy_coef:  # TRL: the mean token entropy of this call, scaled for accumulation only
        ents = [_entropy_scalar(logits[i][t], temperature) for i in range(N) for t in tokens[i]]
        bonus = entropy_coef * (sum(ents) / max(len(ents), 1)) * (N / n_glob)
    if loss_type == "grpo":  # 1/G sum_i 1/|o_i| sum_t
        return sum(row / L for row, L in zip(row_sums, lengths) if L) / n_glob - bonus
    if loss_type == "bnpo":  # local token mean (scaled by this micro-batch's share of completions)
        return sum(row_sums) / max(total_tokens, 1) * (N / n_glob) - bonus
    if loss_type == "dr_grpo":  # 1/(G * max_len) sum_i sum_t
        return sum(row_sums) / (n_glob * max_len) - bonus
    if loss_type in ("dapo", "vespo"):  # 1/sum_i |o_i| sum_i sum_t, over the whole accumulated batch
        return sum(row_sums) / (n_items if n_items is not None else max(total_tokens, 1)) - bonus
    raise AssertionError(loss_type)


def reference_metrics(lp, old, adv, mask, eps_low, eps_high, level):
    """Clip fractions and ratio range, counted one token (or completion) at a time."""
    N, T = lp.shape
    units = []  # (ratio, A)
    empty = 0  # completions without tokens: TRL counts them in sequence-level clip fractions (never clipped)
    for i in range(N):
        toks = [t for t in range(T) if bool(mask[i][t])]
        if level == "token":
            units += [(math.exp(float(lp[i][t]) - float(old[i][t])), float(adv[i])) for t in toks]
        elif toks:
            s = sum(float(lp[i][t]) - float(old[i][t]) for t in toks) / len(toks)
            units.append((math.exp(s), float(adv[i])))
        else:
            empty += 1
    n = len(units)
    low = sum(1 for r, a in units if r < 1 - eps_low and a < 0)
    high = sum(1 for r, a in units if r > 1 + eps_high and a > 0)
    n_clip = n + empty
    return {
        "clip_ratio/low_mean": low / n_clip,
        "clip_ratio/high_mean": high / n_clip,
        "clip_ratio/region_mean": (low + high) / n_clip,
        "ratio/mean": sum(r for r, _ in units) / n,
        "ratio/min": min(r for r, _ in units),
        "ratio/max": max(r for r, _ in units),
    }


# ------------------------------------------------------------------------------------------
# Fixtures: a batch that exercises both clip sides at both levels, an empty and a full row
# ------------------------------------------------------------------------------------------

N, T, V = 8, 6, 5
ADV = [1.0, -0.7, -1.2, 0.4, 0.9, -0.3, 0.6, -0.8]
ROW_SHIFT = [0.45, -0.45, 0.35, -0.3, 0.0, 0.05, -0.1, 0.25]  # pushes whole rows past the clip range


def make_batch(seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(N, T, generator=g, dtype=F64) * 4 - 0.1
    lp = old + torch.tensor(ROW_SHIFT, dtype=F64)[:, None] + 0.3 * torch.randn(N, T, generator=g, dtype=F64)
    ref = old + 0.5 * torch.randn(N, T, generator=g, dtype=F64)
    mask = torch.rand(N, T, generator=g) > 0.35
    mask[0, :2] = True
    mask[1, :2] = True
    mask[4] = False  # an empty row
    mask[5] = True  # a full row
    logits = torch.randn(N, T, V, generator=g, dtype=F64)
    adv = torch.tensor(ADV, dtype=F64)
    return [x.to(dtype) if x.is_floating_point() else x for x in (lp, old, adv, mask, ref, logits)]


def _value_and_grad(fn, lp, logits=None):
    lp = lp.detach().clone().requires_grad_(True)
    inputs = [lp]
    if logits is not None:
        logits = logits.detach().clone().requires_grad_(True)
        inputs.append(logits)
    out = fn(lp, logits)
    grads = torch.autograd.grad(out, inputs, allow_unused=True)
    grads = [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads)]
    return out.detach(), grads


CLIPS = [(0.2, 0.2), (0.2, 0.28)]  # symmetric; DAPO clip-higher
# the math of k1's value and gradient is tested as such; a run with it gets the warning tested below
K1_WARNING = "ignore:GRPOConfig. kl_estimator='k1' without use_bias_correction_kl:UserWarning"


def test_the_kl_terms_expected_gradients():
    """The KL term is differentiated through log pi. Its expected gradient over the policy's tokens,
    computed exactly on a 5-token vocabulary (each token a one-token completion, weighted by its
    probability, on-policy, A = 0), against autograd of the exact divergences: k1's is 0 (it regularises
    nothing: a warning), k2's is that of KL(pi || ref), k3's (the default) that of the reverse KL(ref || pi);
    with use_bias_correction_kl, k1's and k3's are KL(pi || ref)'s."""
    torch.manual_seed(0)
    theta = torch.randn(5, dtype=torch.float64, requires_grad=True)
    ref = torch.log_softmax(torch.randn(5, dtype=torch.float64), -1)
    lp = torch.log_softmax(theta, -1)
    pi = lp.detach().exp()
    forward = torch.autograd.grad((lp.exp() * (lp - ref)).sum(), theta, retain_graph=True)[0]  # KL(pi || ref)
    reverse = torch.autograd.grad((ref.exp() * (ref - lp)).sum(), theta, retain_graph=True)[0]  # KL(ref || pi)
    one = torch.ones(1, 1, dtype=torch.bool)
    for estimator, bias, want in (("k1", False, torch.zeros(5, dtype=torch.float64)), ("k2", False, forward),
                                  ("k3", False, reverse), ("k1", True, forward), ("k3", True, forward)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cfg = GRPOConfig(loss_type="dapo", beta=1.0, kl_estimator=estimator, use_bias_correction_kl=bias,
                             log_ratio_clamp=None)
        assert [str(w.message).startswith("GRPOConfig: kl_estimator='k1'") for w in caught] == (
            [True] if (estimator, bias) == ("k1", False) else []), (estimator, bias)
        expected = sum(pi[y] * torch.autograd.grad(grpo_loss(
            lp[y].reshape(1, 1), lp[y].detach().reshape(1, 1), torch.zeros(1, dtype=torch.float64), one,
            ref[y].reshape(1, 1), cfg)[0], theta, retain_graph=True)[0] for y in range(5))
        torch.testing.assert_close(expected, want, atol=1e-12, rtol=0, msg=f"{estimator}, bias correction {bias}")


@pytest.mark.filterwarnings(K1_WARNING)
@pytest.mark.parametrize("loss_type, level, estimator, clip", list(itertools.product(
    grpo.LOSS_TYPES, grpo.IMPORTANCE_SAMPLING_LEVELS, [None, "k1", "k2", "k3"], CLIPS)))
def test_loss_and_gradient_match_reference(loss_type, level, estimator, clip):
    lp, old, adv, mask, ref, _ = make_batch()
    beta = 0.1 if estimator else 0.0
    cfg = GRPOConfig(loss_type=loss_type, importance_sampling_level=level, clip_eps_low=clip[0],
                     clip_eps_high=clip[1], beta=beta, kl_estimator=estimator or "k3", max_completion_length=T + 3)
    ref_in = ref if estimator else None
    got, (g_got,) = _value_and_grad(lambda x, _: grpo_loss(x, old, adv, mask, ref_in, cfg)[0], lp)
    want, (g_want,) = _value_and_grad(lambda x, _: reference_loss(
        x, old, adv, mask, ref_in, loss_type=loss_type, eps_low=clip[0], eps_high=clip[1], level=level,
        beta=beta, estimator=estimator, max_len=T + 3), lp)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_got, g_want, rtol=1e-12, atol=1e-12)
    assert torch.all(g_got[~mask] == 0)


@pytest.mark.parametrize("level", grpo.IMPORTANCE_SAMPLING_LEVELS)
@pytest.mark.parametrize("clip", CLIPS)
def test_clip_metrics_match_reference_and_cover_both_sides(level, clip):
    lp, old, adv, mask, ref, _ = make_batch()
    cfg = GRPOConfig(importance_sampling_level=level, clip_eps_low=clip[0], clip_eps_high=clip[1])
    _, metrics = grpo_loss(lp, old, adv, mask, config=cfg)
    want = reference_metrics(lp, old, adv, mask, clip[0], clip[1], level)
    for key, value in want.items():
        assert metrics[key] == pytest.approx(value, rel=1e-12, abs=1e-12), key
    # the fixture really exercises both sides (else the reference comparison proves little)
    assert metrics["clip_ratio/low_mean"] > 0 and metrics["clip_ratio/high_mean"] > 0
    assert metrics["clip_ratio/region_mean"] == pytest.approx(metrics["clip_ratio/low_mean"] + metrics["clip_ratio/high_mean"])


def test_clipped_side_has_zero_gradient_and_unclipped_side_does_not():
    # one token per completion: A>0 with ratio 1.5 (clipped), A<0 with ratio 0.5 (clipped),
    # A<0 with ratio 1.5 and A>0 with ratio 0.5 (pessimistic bound keeps the unclipped branch).
    old = torch.zeros(4, 1, dtype=F64)
    lp = torch.log(torch.tensor([[1.5], [0.5], [1.5], [0.5]], dtype=F64))
    adv = torch.tensor([1.0, -1.0, -1.0, 1.0], dtype=F64)
    mask = torch.ones(4, 1, dtype=torch.bool)
    g = grpo.logprob_gradient(lp, old, adv, mask)
    assert g[0, 0] == 0 and g[1, 0] == 0
    assert g[2, 0] > 0 and g[3, 0] < 0  # descent lowers the bad token, raises the good one
    _, m = grpo_loss(lp, old, adv, mask)
    assert m["clip_ratio/high_mean"] == 0.25 and m["clip_ratio/low_mean"] == 0.25 and m["clip_ratio/region_mean"] == 0.5


def test_other_metrics_match_direct_computation():
    lp, old, adv, mask, ref, logits = make_batch()
    cfg = GRPOConfig(kl_estimator="k2", temperature=0.7)
    _, m = grpo_loss(lp, old, adv, mask, ref, cfg, logits=logits)
    toks = [(i, t) for i in range(N) for t in range(T) if mask[i, t]]
    lr = [float(lp[i, t] - old[i, t]) for i, t in toks]
    assert m["approx_kl"] == pytest.approx(sum(math.exp(x) - 1 - x for x in lr) / len(toks), rel=1e-12)
    assert m["kl"] == pytest.approx(sum(0.5 * float(ref[i, t] - lp[i, t]) ** 2 for i, t in toks) / len(toks), rel=1e-12)
    ent = [float(_entropy_scalar(logits[i, t], 0.7)) for i, t in toks]
    assert m["entropy"] == pytest.approx(sum(ent) / len(ent), rel=1e-12)
    assert m["advantages/mean"] == pytest.approx(float(adv.mean()))
    assert m["advantages/std"] == pytest.approx(float(adv.std(correction=0)))
    assert m["num_tokens"] == int(mask.sum()) and m["num_completions"] == N
    assert all(type(v) is float for v in m.values())


# ------------------------------------------------------------------------------------------
# Options beyond the parametrised grid
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("loss_type", grpo.LOSS_TYPES)
def test_entropy_bonus_matches_reference_including_logit_gradient(loss_type):
    lp, old, adv, mask, ref, logits = make_batch(seed=1)
    cfg = GRPOConfig(loss_type=loss_type, entropy_coef=0.05, temperature=0.8, beta=0.02,
                     max_completion_length=T)
    got, g_got = _value_and_grad(lambda x, lg: grpo_loss(x, old, adv, mask, ref, cfg, logits=lg)[0], lp, logits)
    want, g_want = _value_and_grad(lambda x, lg: reference_loss(
        x, old, adv, mask, ref, loss_type=loss_type, beta=0.02, logits=lg, entropy_coef=0.05, temperature=0.8,
        max_len=T), lp, logits)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for a, b in zip(g_got, g_want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("level", grpo.IMPORTANCE_SAMPLING_LEVELS)
def test_two_sided_clipping_delta_and_log_ratio_clamp(level):
    lp, old, adv, mask, ref, _ = make_batch(seed=2)
    lp = lp.clone()
    lp[2, :] += 1.0  # A < 0 with ratio far above delta
    lp[1, :] += 30.0  # beyond the clamp
    for delta, clamp in [(1.5, None), (None, 0.5), (1.4, 0.6)]:
        cfg = GRPOConfig(importance_sampling_level=level, delta=delta, log_ratio_clamp=clamp, beta=0.05)
        got, (g1,) = _value_and_grad(lambda x, _: grpo_loss(x, old, adv, mask, ref, cfg)[0], lp)
        want, (g2,) = _value_and_grad(lambda x, _: reference_loss(
            x, old, adv, mask, ref, level=level, delta=delta, clamp=clamp, beta=0.05), lp)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(g1, g2, rtol=1e-12, atol=1e-12)
    # with delta, an A<0 token whose ratio exceeds delta is pushed no further
    cfg = GRPOConfig(delta=1.5, log_ratio_clamp=None)
    g = grpo.logprob_gradient(lp, old, adv, mask, config=cfg)
    far = mask[2] & ((lp[2] - old[2]).exp() > 1.5)
    assert far.any() and torch.all(g[2][far] == 0)


@pytest.mark.parametrize("loss_type", grpo.LOSS_TYPES)
def test_mask_truncated_completions(loss_type):
    lp, old, adv, mask, ref, _ = make_batch(seed=3)
    truncated = torch.zeros(N, dtype=torch.bool)
    truncated[[0, 3]] = True
    cfg = GRPOConfig(loss_type=loss_type, mask_truncated_completions=True, max_completion_length=T)
    got, (g_got,) = _value_and_grad(lambda x, _: grpo_loss(x, old, adv, mask, config=cfg, truncated=truncated)[0], lp)
    want, (g_want,) = _value_and_grad(lambda x, _: reference_loss(
        x, old, adv, mask, loss_type=loss_type, max_len=T, truncated=truncated, mask_truncated=True), lp)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g_got, g_want, rtol=1e-12, atol=1e-12)
    assert torch.all(g_got[[0, 3]] == 0)
    with pytest.raises(ValueError, match="truncated"):
        grpo_loss(lp, old, adv, mask, config=cfg)
    # off by default: truncated rows are trained on
    g_default = grpo.logprob_gradient(lp, old, adv, mask, truncated=truncated)
    assert g_default[0].abs().sum() > 0


@pytest.mark.parametrize("loss_type", grpo.LOSS_TYPES)
@pytest.mark.parametrize("level", grpo.IMPORTANCE_SAMPLING_LEVELS)
def test_micro_batch_accumulation_with_global_counts(loss_type, level):
    """4 micro-batches of 2, each given the whole batch's counts, sum to the batch-of-8 loss (bnpo excepted)."""
    lp, old, adv, mask, ref, _ = make_batch(seed=4)
    cfg = GRPOConfig(loss_type=loss_type, importance_sampling_level=level, max_completion_length=T, beta=0.1)
    full, (g_full,) = _value_and_grad(lambda x, _: grpo_loss(x, old, adv, mask, ref, cfg)[0], lp)
    n_items = int(grpo.effective_mask(mask, config=cfg).sum())
    x = lp.detach().clone().requires_grad_(True)
    total = 0.0
    for s in range(0, N, 2):
        sl = slice(s, s + 2)
        loss, _ = grpo_loss(x[sl], old[sl], adv[sl], mask[sl], ref[sl], cfg, num_items_in_batch=n_items,
                            num_completions_in_batch=N)
        micro_want = reference_loss(lp[sl], old[sl], adv[sl], mask[sl], ref[sl], loss_type=loss_type, level=level,
                                    max_len=T, beta=0.1, n_items=n_items, n_completions=N)
        torch.testing.assert_close(loss.detach(), micro_want.detach(), rtol=1e-12, atol=1e-12)
        loss.backward()
        total = total + loss.detach()
    want = reference_loss(lp, old, adv, mask, ref, loss_type=loss_type, level=level, max_len=T, beta=0.1)
    if loss_type == "bnpo":
        # each micro-batch normalised by its own token count: differs when those counts differ
        counts = [int(mask[s : s + 2].sum()) for s in range(0, N, 2)]
        assert len(set(counts)) > 1
        assert not torch.allclose(total, full)
        assert not torch.allclose(x.grad, g_full)
    else:
        torch.testing.assert_close(total, full, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(x.grad, g_full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(full, want.detach(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("loss_type", grpo.LOSS_TYPES)
def test_micro_batch_gradient_helper(loss_type):
    lp, old, adv, mask, _, _ = make_batch(seed=6)
    cfg = GRPOConfig(loss_type=loss_type, max_completion_length=T)
    full_loss, _ = grpo_loss(lp, old, adv, mask, config=cfg)
    full = grpo.logprob_gradient(lp, old, adv, mask, config=cfg)
    exact, total = grpo.micro_batch_gradient(lp, old, adv, mask, 2, config=cfg)
    naive, _ = grpo.micro_batch_gradient(lp, old, adv, mask, 2, config=cfg, global_counts=False)
    same = lambda a, b: torch.allclose(a, b, rtol=1e-12, atol=1e-15)  # noqa: E731
    assert same(exact, full) == (loss_type != "bnpo")
    assert (total == pytest.approx(float(full_loss), rel=1e-12)) == (loss_type != "bnpo")
    # dividing by the accumulation steps is exact for per-completion normalisers, not for token counts
    assert same(naive, full) == (loss_type in ("grpo", "dr_grpo"))


def test_dapo_without_global_count_is_local_and_bad_count_is_rejected():
    lp, old, adv, mask, _, _ = make_batch()
    cfg = GRPOConfig(loss_type="dapo")
    a, _ = grpo_loss(lp, old, adv, mask, config=cfg)
    b, _ = grpo_loss(lp, old, adv, mask, config=cfg, num_items_in_batch=int(mask.sum()))
    torch.testing.assert_close(a, b)
    with pytest.raises(ValueError, match="num_items_in_batch"):
        grpo_loss(lp, old, adv, mask, config=cfg, num_items_in_batch=1)
    with pytest.raises(ValueError, match="num_items_in_batch"):  # one token short of this call's own is too few
        grpo_loss(lp, old, adv, mask, config=cfg, num_items_in_batch=int(mask.sum()) - 1)
    for bad in (float("nan"), float("inf")):  # a NaN loss, or 0 (nothing learned), without a word
        with pytest.raises(ValueError, match=r"num_items_in_batch must be a finite token count, got (nan|inf)"):
            grpo_loss(lp, old, adv, mask, config=cfg, num_items_in_batch=bad)


def test_on_policy_ratio_one_loss_minus_mean_advantage_nonzero_gradient():
    lp, _, adv, mask, _, _ = make_batch()
    nonempty = mask.any(dim=1)
    loss, m = grpo_loss(lp, lp.detach(), adv, mask)
    assert loss.item() == pytest.approx(-float(adv[nonempty].sum()) / N, abs=1e-15)
    assert m["ratio/min"] == m["ratio/max"] == 1.0 and m["clip_ratio/region_mean"] == 0.0 and m["approx_kl"] == 0.0
    g = grpo.logprob_gradient(lp, lp, adv, mask)
    assert g.abs().sum() > 0
    # descent direction: raise positive-advantage tokens, lower negative ones
    assert torch.all((g[mask] < 0) == (adv[:, None].expand(N, T)[mask] > 0))


@pytest.mark.parametrize("loss_type", grpo.LOSS_TYPES)
def test_gspo_equals_grpo_gradient_on_policy(loss_type):
    lp, _, adv, mask, _, _ = make_batch()
    gs = [grpo.logprob_gradient(lp, lp, adv, mask, config=GRPOConfig(
        loss_type=loss_type, importance_sampling_level=lvl, max_completion_length=T)) for lvl in ("token", "sequence")]
    torch.testing.assert_close(gs[0], gs[1], rtol=1e-12, atol=1e-15)


def test_tied_group_gives_zero_gradient():
    adv, stats = group_advantages([0.3, 0.3, 0.3, 0.3, 1.0, 0.0, 0.5, 0.2], group_size=4)
    assert torch.all(adv[:4] == 0) and stats.frac_reward_zero_std == 0.5
    lp, old, _, mask, _, _ = make_batch()
    g = grpo.logprob_gradient(lp, old, adv.to(F64), mask)
    assert torch.all(g[:4] == 0) and g[4:].abs().sum() > 0


def test_kl_only_with_reference_and_positive_beta():
    lp, old, adv, mask, ref, _ = make_batch()
    base, m0 = grpo_loss(lp, old, adv, mask)
    assert "kl" not in m0
    no_ref, _ = grpo_loss(lp, old, adv, mask, None, GRPOConfig(beta=0.5))
    beta0, m1 = grpo_loss(lp, old, adv, mask, ref, GRPOConfig(beta=0.0))
    with_kl, m2 = grpo_loss(lp, old, adv, mask, ref, GRPOConfig(beta=0.5))
    assert no_ref == base and beta0 == base and with_kl != base
    assert m1["kl"] == m2["kl"] > 0  # measured whenever a reference is given


def test_padding_may_hold_garbage():
    lp, old, adv, mask, ref, _ = make_batch()
    dirty = [x.clone() for x in (lp, old, ref)]
    for x, fill in zip(dirty, (float("nan"), float("-inf"), float("inf"))):
        x[~mask] = fill
    for cfg in (GRPOConfig(beta=0.1, importance_sampling_level="sequence"),
                GRPOConfig(loss_type="vespo", beta=0.1, use_bias_correction_kl=True)):
        clean, (g_clean,) = _value_and_grad(lambda x, _: grpo_loss(x, old, adv, mask, ref, cfg)[0], lp)
        got, (g_got,) = _value_and_grad(lambda x, _: grpo_loss(x, dirty[1], adv, mask, dirty[2], cfg)[0], dirty[0])
        assert torch.isfinite(got) and torch.isfinite(g_got).all()
        torch.testing.assert_close(got, clean)
        torch.testing.assert_close(g_got, g_clean)


def test_empty_batch_mask_gives_zero_loss_and_nan_stats():
    lp, old, adv, _, _, _ = make_batch()
    mask = torch.zeros(N, T, dtype=torch.bool)
    for lt in grpo.LOSS_TYPES:
        loss, m = grpo_loss(lp, old, adv, mask, config=GRPOConfig(loss_type=lt, max_completion_length=T))
        assert loss.item() == 0.0 and m["num_tokens"] == 0 and math.isnan(m["ratio/mean"])
        assert m["clip_ratio/region_mean"] == 0.0 or math.isnan(m["clip_ratio/region_mean"])


def test_low_precision_inputs_are_upcast():
    lp, old, adv, mask, _, _ = make_batch(dtype=torch.float32)
    loss32, _ = grpo_loss(lp, old, adv, mask)
    loss16, _ = grpo_loss(lp.bfloat16(), old, adv, mask)
    assert loss16.dtype == torch.float32 and loss32.dtype == torch.float32
    assert abs(loss16.item() - loss32.item()) < 0.05


def test_group_stats_are_merged_into_metrics():
    adv, stats = group_advantages([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.5, 0.25], group_size=2)
    lp, old, _, mask, _, _ = make_batch()
    _, m = grpo_loss(lp, old, adv.to(F64), mask, group_stats=stats)
    assert m["frac_reward_zero_std"] == 0.5 and m["num_groups"] == 4.0


# ------------------------------------------------------------------------------------------
# gradcheck (finite differences, float64)
# ------------------------------------------------------------------------------------------

@pytest.mark.filterwarnings(K1_WARNING)
@pytest.mark.parametrize("cfg", [
    GRPOConfig(),
    GRPOConfig(loss_type="dapo", clip_eps_high=0.28, kl_estimator="k3", beta=0.04, entropy_coef=0.01),
    GRPOConfig(loss_type="dr_grpo", importance_sampling_level="sequence", kl_estimator="k1", beta=0.1,
               max_completion_length=T, use_bias_correction_kl=True),
    GRPOConfig(loss_type="bnpo", kl_estimator="k2", beta=0.2, delta=1.5, entropy_coef=0.02, temperature=1.3),
], ids=["default", "dapo-k3-entropy", "drgrpo-gspo-k1-bias-corrected", "bnpo-k2-delta"])
def test_gradcheck(cfg):
    lp, old, adv, mask, ref, logits = (x[:6] for x in make_batch(seed=5))  # rows 4 (empty) and 5 (full) included
    lp = lp.detach().requires_grad_(True)
    logits = logits[:, :, :2].detach().requires_grad_(True)

    def f(x, lg):
        return grpo_loss(x, old, adv, mask, ref, cfg, logits=lg)[0]

    assert torch.autograd.gradcheck(f, (lp, logits), eps=1e-6, atol=1e-7, rtol=1e-5)


# ------------------------------------------------------------------------------------------
# Aggregation weights (length bias)
# ------------------------------------------------------------------------------------------

def test_aggregation_weights_per_mode():
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[0, :2] = True  # short completion: 2 tokens
    mask[1, :8] = True  # long completion: 8 tokens
    w = {lt: grpo.aggregation_weights(mask, GRPOConfig(loss_type=lt, max_completion_length=10), dtype=F64)
         for lt in grpo.LOSS_TYPES}
    assert w["grpo"][0, 0] == pytest.approx(1 / (2 * 2)) and w["grpo"][1, 0] == pytest.approx(1 / (2 * 8))
    assert w["dapo"][0, 0] == w["dapo"][1, 0] == pytest.approx(1 / 10)
    assert w["bnpo"][0, 0] == w["bnpo"][1, 0] == pytest.approx(1 / 10)
    assert w["dr_grpo"][0, 0] == w["dr_grpo"][1, 0] == pytest.approx(1 / (2 * 10))
    for x in w.values():
        assert torch.all(x[~mask] == 0)
    # grpo: each completion's weights sum to 1/N, whatever its length
    torch.testing.assert_close(w["grpo"].sum(1), torch.full((2,), 0.5, dtype=F64))


# ------------------------------------------------------------------------------------------
# group_advantages
# ------------------------------------------------------------------------------------------

def test_group_advantages_known_values():
    adv, stats = group_advantages([0.7, 0.5], group_size=2, scale="none")
    torch.testing.assert_close(adv, torch.tensor([0.1, -0.1]))
    adv, _ = group_advantages([0.7, 0.5], group_size=2, scale="group", eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([1, -1]) / math.sqrt(2))  # Bessel-corrected std
    adv, _ = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64), 2, scale="batch", eps=0.0)
    std = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64).std()
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5, 0, 0], dtype=F64) / std)
    assert adv.dtype == F64
    _, stats = group_advantages([1, 1, 0, 1, 2, 2], group_size=2)
    assert stats.frac_reward_zero_std == pytest.approx(2 / 3) and stats.num_groups == 3
    # numpy's integers (a sweep's np.arange) are group sizes as Python's are; it was refused as no integer
    torch.testing.assert_close(group_advantages([1.0, 0.0, 2.0, 2.0], np.int64(2))[0],
                               group_advantages([1.0, 0.0, 2.0, 2.0], 2)[0])
    assert group_advantages([1.0, 0.0], np.int64(2))[1].group_size == 2


@pytest.mark.parametrize("bad, match", [
    (dict(rewards=[1.0, 2.0, 3.0], group_size=2), "multiple"),
    (dict(rewards=[1.0, 2.0], group_size=0), "group_size"),
    (dict(rewards=[1.0, 2.0], group_size=2, scale="std"), "scale"),
    (dict(rewards=[1.0, float("inf")], group_size=2), "inf"),
    (dict(rewards=[1.0, 2.0], group_size=2, eps=-1.0), "eps"),
])
def test_group_advantages_rejects_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(**bad)


grid = st.integers(min_value=-40, max_value=40).map(lambda k: k / 8)  # exact binary fractions


@st.composite
def grouped_rewards(draw, values=grid):
    g = draw(st.integers(min_value=1, max_value=6))
    n_groups = draw(st.integers(min_value=1, max_value=5))
    rewards = draw(st.lists(values, min_size=g * n_groups, max_size=g * n_groups))
    return rewards, g


@settings(max_examples=60, deadline=None)
@given(grouped_rewards(), st.sampled_from(grpo.ADVANTAGE_SCALES))
def test_property_advantages_sum_to_zero_per_group(data, scale):
    rewards, g = data
    adv, _ = group_advantages(torch.tensor(rewards, dtype=F64), g, scale=scale)
    assert torch.allclose(adv.view(-1, g).sum(1), torch.zeros(len(rewards) // g, dtype=F64), atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(grouped_rewards(), st.sampled_from(grpo.ADVANTAGE_SCALES),
       st.floats(min_value=-1e3, max_value=1e3, allow_nan=False))
def test_property_tied_group_has_exactly_zero_advantage(data, scale, tie_value):
    rewards, g = data
    rewards = [tie_value] * g + rewards  # prepend a tied group
    adv, stats = group_advantages(torch.tensor(rewards, dtype=F64), g, scale=scale)
    assert torch.all(adv[:g] == 0)
    if scale != "batch":  # TRL's frac_reward_zero_std: the std that scales, so under "batch" the batch's (0 or 1)
        assert stats.frac_reward_zero_std >= 1 / stats.num_groups


@settings(max_examples=60, deadline=None)
@given(grouped_rewards(), st.sampled_from(grpo.ADVANTAGE_SCALES), grid.map(lambda c: c * 16))
def test_property_shift_invariance(data, scale, shift):
    rewards, g = data
    r = torch.tensor(rewards, dtype=F64)
    a1, _ = group_advantages(r, g, scale=scale)
    a2, _ = group_advantages(r + shift, g, scale=scale)
    torch.testing.assert_close(a1, a2, rtol=1e-9, atol=1e-9)


@settings(max_examples=60, deadline=None)
@given(grouped_rewards(), st.sampled_from(["group", "batch"]), st.floats(min_value=1e-2, max_value=1e2))
def test_property_scale_invariance_when_std_scaled(data, scale, k):
    rewards, g = data
    r = torch.tensor(rewards, dtype=F64)
    a1, _ = group_advantages(r, g, scale=scale, eps=0.0)
    a2, _ = group_advantages(r * k, g, scale=scale, eps=0.0)
    torch.testing.assert_close(a1, a2, rtol=1e-9, atol=1e-9)
    # "none" is equivariant instead: advantages scale with the rewards
    b1, _ = group_advantages(r, g, scale="none")
    b2, _ = group_advantages(r * k, g, scale="none")
    torch.testing.assert_close(b1 * k, b2, rtol=1e-9, atol=1e-9)


def test_eps_breaks_scale_invariance_only_for_tiny_std():
    r = torch.tensor([1.0, 0.0, 0.5, 0.25], dtype=F64)
    big, _ = group_advantages(r, 4)
    small, _ = group_advantages(r * 1e-3, 4)
    assert (small / big).max() < 0.9  # std ~ 4e-4 against eps 1e-4: shrunk by about a fifth
    torch.testing.assert_close(big, group_advantages(r * 10, 4)[0], rtol=1e-3, atol=0)


# ------------------------------------------------------------------------------------------
# KL estimators
# ------------------------------------------------------------------------------------------

logp = st.floats(min_value=-30.0, max_value=0.0, allow_nan=False)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(logp, logp), min_size=1, max_size=20))
def test_property_kl_estimators(pairs):
    lp = torch.tensor([p for p, _ in pairs], dtype=F64)
    ref = torch.tensor([q for _, q in pairs], dtype=F64)
    k3 = grpo.kl_estimate(lp, ref, "k3")
    assert torch.all(k3 >= 0)
    assert torch.all(grpo.kl_estimate(lp, ref, "k2") >= 0)
    for est in grpo.KL_ESTIMATORS:
        assert torch.all(grpo.kl_estimate(lp, lp, est) == 0)
    torch.testing.assert_close(grpo.kl_estimate(lp, ref, "k1"), lp - ref)


def test_the_public_helpers_name_arguments_of_the_wrong_kind_or_shape():
    """kl_estimate broadcast a (2, T) reference against (4, T) log-probs (or failed in torch's words),
    entropy_from_logits(chunk_size=0) said "range() arg 3 must not be zero", grpo_loss(config={...})
    "'dict' object has no attribute"."""
    lp, old, adv, mask, ref, _ = make_batch()
    with pytest.raises(ValueError, match=r"^kl_estimate: ref_logprobs must have the shape of logprobs"):
        grpo.kl_estimate(lp, ref[:2])
    with pytest.raises(ValueError, match=r"^kl_estimate: ref_logprobs must have the shape of logprobs"):
        grpo.kl_estimate(lp, ref[:, :1])  # (N, 1) broadcast silently
    for chunk in (0, -1, 2.5):
        with pytest.raises(ValueError, match=rf"^entropy_from_logits: chunk_size must be an integer >= 1, got {chunk}$"):
            grpo.entropy_from_logits(torch.randn(1, 3, 10), chunk_size=chunk)
    with pytest.raises(ValueError, match=r"^grpo_loss: config must be a GRPOConfig \(GRPOConfig\(\*\*fields\)\), got dict$"):
        grpo_loss(lp, old, adv, mask, config={"loss_type": "dapo"})


def test_k1_can_be_negative_and_k3_is_unbiased():
    # reference prefers the sampled token: k1 < 0 on that token, k3 still >= 0
    assert grpo.kl_estimate(torch.tensor([-2.0]), torch.tensor([-1.0]), "k1").item() < 0
    assert grpo.kl_estimate(torch.tensor([-2.0]), torch.tensor([-1.0]), "k3").item() > 0
    # E_{x~p}[k3] = KL(p || q) exactly for a categorical p, q
    p = torch.tensor([0.5, 0.3, 0.2], dtype=F64)
    q = torch.tensor([0.2, 0.5, 0.3], dtype=F64)
    exact = (p * (p / q).log()).sum()
    for est in ("k1", "k3"):
        torch.testing.assert_close((p * grpo.kl_estimate(p.log(), q.log(), est)).sum(), exact)


# ------------------------------------------------------------------------------------------
# token_logprobs / entropy_from_logits (shared with the sampler)
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [1.0, 0.7, 2.5])
def test_token_logprobs_is_temperature_scaled_full_log_softmax(temperature):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 4, 11, generator=g) * 3
    tokens = torch.randint(0, 11, (3, 4), generator=g)
    got = grpo.token_logprobs(logits, tokens, temperature)
    want = torch.log_softmax(logits.double() / temperature, -1).gather(-1, tokens[..., None])[..., 0]
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    assert got.dtype == torch.float32
    assert grpo.token_logprobs(logits.bfloat16(), tokens, temperature).dtype == torch.float32
    assert grpo.token_logprobs(logits.double(), tokens, temperature).dtype == F64


def test_token_logprobs_gradient_and_errors():
    logits = torch.randn(2, 3, 7, dtype=F64, requires_grad=True)
    tokens = torch.randint(0, 7, (2, 3))
    assert torch.autograd.gradcheck(lambda x: grpo.token_logprobs(x, tokens, 0.9), (logits,))
    for bad in (0, -1.0, float("nan"), True):
        with pytest.raises(ValueError, match="temperature"):
            grpo.token_logprobs(logits, tokens, bad)
    with pytest.raises(ValueError, match="shape|wants"):
        grpo.token_logprobs(logits, tokens[:, :2])


def test_entropy_from_logits():
    uniform = torch.zeros(2, 3, 8)
    torch.testing.assert_close(grpo.entropy_from_logits(uniform), torch.full((2, 3), math.log(8)))
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 5, 9, generator=g, dtype=F64)
    p = torch.softmax(logits / 0.6, -1)
    want = -(p * p.log()).sum(-1)
    torch.testing.assert_close(grpo.entropy_from_logits(logits, 0.6), want)
    torch.testing.assert_close(grpo.entropy_from_logits(logits, 0.6, chunk_size=2), want)
    small = logits[:2, :3, :4].detach().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: grpo.entropy_from_logits(x, 0.6, chunk_size=4), (small,))
    # sharper temperature, lower entropy
    assert torch.all(grpo.entropy_from_logits(logits, 0.3) < grpo.entropy_from_logits(logits, 3.0))


def test_measured_entropies_give_the_logits_entropy_metric():
    g = torch.Generator().manual_seed(2)
    N, T = 3, 5
    logits = torch.randn(N, T, 11, generator=g)
    lp = grpo.token_logprobs(logits, torch.randint(0, 11, (N, T), generator=g))
    old, adv = lp.detach() - 0.1, torch.randn(N, generator=g)
    mask = torch.rand(N, T, generator=g) > 0.3
    cfg = GRPOConfig(temperature=0.8)
    loss_a, from_logits = grpo_loss(lp, old, adv, mask, config=cfg, logits=logits)
    loss_b, from_entropy = grpo_loss(lp, old, adv, mask, config=cfg, entropy=grpo.entropy_from_logits(logits, 0.8))
    assert from_entropy["entropy"] == pytest.approx(from_logits["entropy"], rel=1e-6)
    torch.testing.assert_close(loss_a, loss_b)  # metric only: no bonus without entropy_coef
    with pytest.raises(ValueError, match="entropy must have the shape"):
        grpo_loss(lp, old, adv, mask, config=cfg, entropy=torch.zeros(N, T + 1))


# ------------------------------------------------------------------------------------------
# Config validation and input errors
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("loss_type", "ppo"), ("clip_eps_low", 1.0), ("clip_eps_low", -0.1), ("clip_eps_high", -0.2),
    ("delta", 1.1), ("importance_sampling_level", "sentence"), ("beta", -0.01), ("kl_estimator", "k4"),
    ("entropy_coef", -1.0), ("temperature", 0.0), ("mask_truncated_completions", 1),
    ("max_completion_length", 0), ("log_ratio_clamp", 0.0), ("beta", float("nan")),
])
def test_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"GRPOConfig.{field}"):
        GRPOConfig(**{field: value})


def test_dr_grpo_requires_max_completion_length():
    with pytest.raises(ValueError, match="GRPOConfig.max_completion_length"):
        GRPOConfig(loss_type="dr_grpo")
    assert GRPOConfig(loss_type="dr_grpo", max_completion_length=64).max_completion_length == 64


def test_default_config_is_deepseekmath():
    cfg = GRPOConfig()
    assert (cfg.loss_type, cfg.importance_sampling_level, cfg.clip_eps_low, cfg.clip_eps_high) == ("grpo", "token", 0.2, 0.2)
    assert cfg.kl_estimator == "k3" and cfg.entropy_coef == 0.0 and not cfg.mask_truncated_completions


def test_grpo_loss_input_errors():
    lp, old, adv, mask, _, _ = make_batch()
    with pytest.raises(ValueError, match="old_logprobs"):
        grpo_loss(lp, old[:, :2], adv, mask)
    with pytest.raises(ValueError, match="advantages"):
        grpo_loss(lp, old, adv[:3], mask)
    with pytest.raises(ValueError, match="logits"):
        grpo_loss(lp, old, adv, mask, logits=torch.randn(N, T))
    with pytest.raises(ValueError, match="entropy_coef"):
        grpo_loss(lp, old, adv, mask, config=GRPOConfig(entropy_coef=0.1))
    with pytest.raises(ValueError, match="logprobs"):
        grpo_loss(lp[0], old, adv, mask)


# ------------------------------------------------------------------------------------------
# End to end on a tiny GPT: one SGD step moves log-probs the way the advantages say
# ------------------------------------------------------------------------------------------

def test_one_sgd_step_on_tiny_gpt_follows_advantages():
    from rookworld_lib.core.model import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny"))
    prompt = torch.randint(0, 50257, (1, 5)).expand(4, 5)
    completion = torch.randint(0, 50257, (4, 6))
    ids = torch.cat([prompt, completion], dim=1)
    mask = torch.ones(4, 6, dtype=torch.bool)
    adv, _ = group_advantages([1.0, 0.0, 1.0, 0.0], group_size=4)

    def seq_logprobs():
        return grpo.token_logprobs(model(ids)[:, 4:-1], completion)

    lp = seq_logprobs()
    loss, m = grpo_loss(lp, lp.detach(), adv, mask)
    assert m["ratio/min"] == m["ratio/max"] == 1.0
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():
        delta = (seq_logprobs() - lp.detach()).sum(1)
    assert torch.all(delta[adv > 0] > 0) and torch.all(delta[adv < 0] < 0)


# ------------------------------------------------------------------------------------------
# TRL's options (their TRL parity is in tests/test_trl_parity.py; these hold without TRL)
# ------------------------------------------------------------------------------------------

def test_unscorable_rewards_get_zero_advantage_and_leave_the_baseline():
    adv, stats = group_advantages([1.0, float("nan"), 0.0, None], group_size=4, scale="none")
    torch.testing.assert_close(adv, torch.tensor([0.5, 0.0, -0.5, 0.0]))
    assert stats.num_unscorable == 2 and stats.reward_mean == 0.5
    adv, _ = group_advantages([float("nan")] * 2 + [1.0, 0.0], group_size=2)
    assert adv[:2].tolist() == [0.0, 0.0] and adv[2] > 0 > adv[3]


def test_reward_weights_and_normalize_then_sum():
    table = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [0.0, 1.0]], dtype=F64)
    summed, _ = group_advantages(table, 2, scale="none", reward_weights=[1.0, 2.0])
    torch.testing.assert_close(summed, torch.tensor([0.5, -0.5, 0.5, -0.5], dtype=F64))
    gdpo, stats = group_advantages(table, 2, reward_weights=[1.0, 2.0], multi_objective_aggregation="normalize_then_sum")
    # per function z-scores within groups (function 1 is tied in both groups: 0), summed, then batch-normalised
    z = 0.5 / (math.sqrt(0.5) + 1e-4)
    x = torch.tensor([z, -z, z, -z], dtype=F64)
    torch.testing.assert_close(gdpo, x / (x.std() + 1e-4))
    assert stats.frac_reward_zero_std == 0.0
    with pytest.raises(ValueError, match="reward_weights"):
        group_advantages(table, 2, reward_weights=[1.0])
    with pytest.raises(ValueError, match="multi_objective_aggregation"):
        group_advantages(table, 2, multi_objective_aggregation="sum")


def test_vespo_weight_is_one_on_policy_and_scales_the_gradient():
    lp, _, adv, mask, _, _ = make_batch()
    phi = grpo.vespo_weights(lp, lp, adv, mask)
    torch.testing.assert_close(phi, torch.ones(N, 1, dtype=F64))  # phi(1) = e^lam * 1 * e^-lam
    cfg = GRPOConfig(loss_type="vespo")
    g = grpo.logprob_gradient(lp, lp, adv, mask, config=cfg)
    n_tok = int(mask.sum())
    torch.testing.assert_close(g, torch.where(mask, -adv[:, None] / n_tok, torch.zeros_like(lp)))
    off = grpo.vespo_weights(lp + 0.5 * mask, lp, adv, mask)  # sequence ratios far from 1: damped
    assert torch.all(off[mask.any(1)] < 1)


def test_bias_corrected_kl_is_kl_times_ratio():
    lp, old, adv, mask, ref, _ = make_batch()
    _, plain = grpo_loss(lp, old, adv, mask, ref, GRPOConfig(beta=0.1, log_ratio_clamp=None))
    _, corrected = grpo_loss(lp, old, adv, mask, ref, GRPOConfig(beta=0.1, use_bias_correction_kl=True,
                                                                 log_ratio_clamp=None))
    kl = grpo.kl_estimate(lp, ref) * (lp - old).exp()
    assert corrected["kl"] == pytest.approx(float(kl[mask].mean()), rel=1e-12)
    assert corrected["kl"] != plain["kl"]


def test_a_tied_group_is_exactly_zero_where_centring_it_is_not():
    # float64 0.1 x 3: the group mean is one ulp above 0.1, so (x - mean) / (std + eps) is about -1.4e-13, not 0
    r = torch.tensor([0.1, 0.1, 0.1, 0.3, 0.6, 0.9], dtype=torch.float64)
    g = r.view(2, 3)
    centred = (g - g.mean(dim=1, keepdim=True)) / (g.std(dim=1, keepdim=True) + 1e-4)
    assert centred[0].abs().max() > 0  # what the tie rule has to undo
    for scale in ("group", "batch", "none"):
        adv, _ = group_advantages(r, 3, scale=scale)
        assert torch.equal(adv[:3], torch.zeros(3, dtype=torch.float64)), scale


def test_group_stats_against_the_standard_library():
    import statistics

    r = [0.0, 1.0, 0.5, 0.2, 0.9, 0.9, -1.0, float("nan"), 0.25, 0.5, 0.75, 1.0]
    _, stats = group_advantages(torch.tensor(r, dtype=torch.float64), 4)
    groups = [[x for x in r[i:i + 4] if not math.isnan(x)] for i in range(0, 12, 4)]  # NaN: unscorable, left out
    scorable = [x for g in groups for x in g]
    assert stats.reward_group_std_mean == pytest.approx(statistics.mean(statistics.stdev(g) for g in groups))
    assert stats.reward_mean == pytest.approx(statistics.mean(scorable))
    assert stats.reward_std == pytest.approx(statistics.stdev(scorable))
    assert (stats.num_groups, stats.group_size, stats.num_unscorable) == (3, 4, 1)


def test_vespo_takes_the_positive_parameters_at_a_zero_advantage_as_trl_does():
    # TRL's get_gamma_weights: advantages >= 0 take (k_pos, lambda_pos) = (2, 3); log w = 0.1
    lp, old, mask = torch.tensor([[0.1]], dtype=F64), torch.zeros(1, 1, dtype=F64), torch.ones(1, 1, dtype=torch.bool)
    phi = grpo.vespo_weights(lp, old, torch.zeros(1, dtype=F64), mask, GRPOConfig(loss_type="vespo"))
    assert phi.item() == pytest.approx(math.exp(3 + 2 * 0.1 - 3 * math.exp(0.1)), rel=1e-12)


def test_the_entropy_bonus_without_a_token_count_scales_this_calls_tokens_to_the_whole_batch():
    # two of four completions in this call, 2 tokens each, uniform over 5 tokens (entropy ln 5 each):
    # K = 4 tokens * 4 / 2 = 8 (TRL's division over accumulation steps), so the bonus is -c * 4 ln 5 / 8
    lp, mask = torch.zeros(2, 2, dtype=F64), torch.ones(2, 2, dtype=torch.bool)
    adv, logits = torch.tensor([1.0, -0.5], dtype=F64), torch.zeros(2, 2, 5, dtype=F64)
    with_bonus, without = (grpo_loss(lp, lp, adv, mask, config=GRPOConfig(beta=0.0, entropy_coef=c), logits=logits,
                                     num_completions_in_batch=4)[0].item() for c in (0.1, 0.0))
    assert with_bonus - without == pytest.approx(-0.1 * 4 * math.log(5) / 8, rel=1e-12)


def test_group_std_mean_leaves_out_a_group_without_a_score_and_low_clipping_needs_a_negative_advantage():
    # group 1 scores 1 and 0 (Bessel std 0.7071); group 2 could not be scored at all: no std to average
    table = torch.tensor([[1.0], [0.0], [float("nan")], [float("nan")]], dtype=F64)
    _, stats = group_advantages(table, 2)
    assert stats.reward_group_std_mean == pytest.approx(math.sqrt(0.5)) and stats.num_unscorable == 2
    # TRL: is_low_clipped = (ratio < 1 - epsilon_low) & (advantages < 0); ratio 0.5 on one token
    lp, old, mask = torch.full((1, 1), math.log(0.5), dtype=F64), torch.zeros(1, 1, dtype=F64), torch.ones(1, 1, dtype=torch.bool)
    for a, low in ((0.0, 0.0), (-1.0, 1.0), (1.0, 0.0)):
        _, m = grpo_loss(lp, old, torch.tensor([a], dtype=F64), mask, config=GRPOConfig(beta=0.0))
        assert m["clip_ratio/low_mean"] == low, (a, m["clip_ratio/low_mean"])


# ------------------------------------------------------------------------------------------
# Bad arguments from a notebook: each check names the argument, what it needs and what it got
# ------------------------------------------------------------------------------------------

_LP = torch.tensor([[-0.5, -1.0, -2.0], [-0.1, -0.3, -0.7]], dtype=F64)  # [N=2, T=3]
_MASK = torch.ones(2, 3, dtype=torch.bool)
_ADV = torch.tensor([1.0, -1.0], dtype=F64)
_TRUNC = GRPOConfig(mask_truncated_completions=True)


@pytest.mark.parametrize("call, match, boundary", [
    pytest.param(lambda: grpo.entropy_from_logits(torch.zeros(2, 8)),  # one row of logits, no batch axis
                 r"entropy_from_logits wants logits \(B, T, V\); got \(2, 8\)",
                 lambda: grpo.entropy_from_logits(torch.zeros(1, 1, 2)), id="entropy-logits-2d"),
    pytest.param(lambda: group_advantages([[1.0, 0.5], [0.0]], 2),  # ragged per-function rewards
                 r"group_advantages: rewards must be numbers .*one list per completion; expected sequence of length 2",
                 lambda: group_advantages([[1.0, 0.5], [0.0, None]], 2), id="rewards-ragged"),
    pytest.param(lambda: group_advantages(["1.0", "0.0"], 2),  # reward text, unparsed
                 r"group_advantages: rewards must be numbers \(or None / NaN for unscorable\)",
                 lambda: group_advantages([1.0, None], 2), id="rewards-text"),
    pytest.param(lambda: group_advantages([], 2),
                 r"group_advantages: rewards must be \[N\] or \[N, num_reward_functions\], got shape \(0,\)",
                 lambda: group_advantages([0.0], 1), id="rewards-empty"),
    pytest.param(lambda: group_advantages(torch.zeros(2, 2, 1), 2),
                 r"rewards must be \[N\] or \[N, num_reward_functions\], got shape \(2, 2, 1\)",
                 lambda: group_advantages(torch.zeros(2, 2), 2), id="rewards-3d"),
    pytest.param(lambda: grpo.kl_estimate(_LP, _LP, "k4"),
                 r"kl_estimate: estimator must be one of \('k1', 'k2', 'k3'\), got 'k4'",
                 lambda: grpo.kl_estimate(_LP, _LP, "k1"), id="kl-estimator"),
    pytest.param(lambda: grpo.effective_mask(_MASK, torch.zeros(3, dtype=torch.bool), _TRUNC),
                 r"grpo: truncated must have shape \(2,\), got \(3,\)",
                 lambda: grpo.effective_mask(_MASK, torch.zeros(2, dtype=torch.bool), _TRUNC), id="truncated-shape"),
    pytest.param(lambda: grpo.effective_mask(_MASK, torch.zeros(2, 3, dtype=torch.bool), _TRUNC),  # the token mask
                 r"grpo: truncated must have shape \(2,\), got \(2, 3\)", None, id="truncated-per-token"),
    # a count of the whole accumulated batch: fewer than this call's completions (2 for 4 doubled the loss), a
    # fraction (0.5: 8x), True (1) or NaN scaled the loss without a word
    *[pytest.param(lambda bad=bad: grpo.aggregation_weights(_MASK, num_completions_in_batch=bad),
                   rf"grpo: num_completions_in_batch must be a whole number >= this call's {_MASK.shape[0]} completions "
                   rf"\(it counts the whole accumulated batch\), got {bad!r}",
                   lambda: grpo.aggregation_weights(_MASK, num_completions_in_batch=_MASK.shape[0]), id=f"num-completions-{bad}")
      for bad in (0, _MASK.shape[0] - 1, 0.5, True, float("nan"), float("inf"))],
    pytest.param(lambda: grpo.importance_log_weights(_LP, _LP, _MASK, "sentence"),
                 r"importance_sampling_level must be one of \('token', 'sequence'\), got 'sentence'",
                 lambda: grpo.importance_log_weights(_LP, _LP, _MASK, "sequence"), id="is-level"),
    pytest.param(lambda: grpo_loss(torch.tensor([[5, 7, 9], [1, 2, 3]]), _LP, _ADV, _MASK),  # token ids, not log-probs
                 r"grpo_loss: logprobs must be floating point, got torch.int64",
                 lambda: grpo_loss(_LP.float(), _LP, _ADV, _MASK), id="logprobs-int"),
    pytest.param(lambda: grpo_loss(_LP, _LP, _ADV, torch.tensor([[1.0, 0.5, 0.0], [2.0, 1.0, 1.0]])),  # weights, not a mask
                 r"grpo_loss: mask must be bool or hold only 0 and 1 .* got values such as \[0\.5, 2\.0\]",
                 lambda: grpo_loss(_LP, _LP, _ADV, torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])), id="mask-weights"),
    pytest.param(lambda: grpo_loss(torch.zeros(0, 3), torch.zeros(0, 3), torch.zeros(0), torch.ones(0, 3)),
                 r"grpo_loss: need at least one completion and one position, got logprobs of shape \(0, 3\)",
                 lambda: grpo_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1)),
                 id="no-completions"),
    pytest.param(lambda: grpo_loss(torch.zeros(2, 0), torch.zeros(2, 0), _ADV, torch.ones(2, 0)),
                 r"need at least one completion and one position, got logprobs of shape \(2, 0\)", None,
                 id="no-positions"),
    pytest.param(lambda: grpo.logprob_gradient(_LP, _LP, _ADV, _MASK, logits=torch.zeros(2, 3, 5)),
                 r"logprob_gradient: logits are not supported",
                 lambda: grpo.logprob_gradient(_LP, _LP, _ADV, _MASK, entropy=torch.zeros(2, 3)), id="gradient-logits"),
    pytest.param(lambda: grpo.micro_batch_gradient(_LP, _LP, _ADV, _MASK, 0),
                 r"micro_batch_gradient: micro_batch_size must be a positive integer, got 0",
                 lambda: grpo.micro_batch_gradient(_LP, _LP, _ADV, _MASK, 1), id="micro-batch-0"),
    pytest.param(lambda: grpo.micro_batch_gradient(_LP, _LP, _ADV, _MASK, 1.5),
                 r"micro_batch_size must be a positive integer, got 1.5", None, id="micro-batch-float"),
    pytest.param(lambda: grpo.micro_batch_gradient(_LP, _LP, _ADV, _MASK, True),  # a bool is an int to Python
                 r"micro_batch_size must be a positive integer, got True", None, id="micro-batch-bool"),
])
def test_bad_arguments_name_the_argument_and_the_value(call, match, boundary):
    with pytest.raises(ValueError, match=match):
        call()
    if boundary is not None:  # the nearest good value passes the same check
        boundary()


def test_a_group_tied_at_a_value_whose_float_mean_is_inexact_counts_as_tied():
    """Rewards of 0.1 (float64): three of them sum to 0.30000000000000004, so their float mean is an ulp off
    0.1 and their float std is ulps, not 0. The group is still tied: frac_reward_zero_std counts it (TRL:
    std isclose to 0; Python's exact statistics.stdev says 0), and under normalize_then_sum (GDPO) a
    component tied in its group adds exactly nothing (ulps divided by eps alone would be 1e-13): the
    advantages equal those of the other component alone."""
    import statistics

    tied = [0.1] * 3
    assert sum(tied) / 3 != 0.1 and statistics.stdev(tied) == 0.0
    _, stats = group_advantages(torch.tensor(tied + [0.2, 0.5, 0.9], dtype=torch.float64), 3)
    assert stats.frac_reward_zero_std == 0.5
    other = torch.tensor([0.3, 0.9, 0.2, 0.5, 0.1, 0.8], dtype=torch.float64)
    # tied in each group, at 0.1 in the first and 0.7 in the second: their ulp residues differ, so the batch
    # normalisation would not cancel them as one constant
    both = torch.stack([other, torch.tensor([0.1] * 3 + [0.7] * 3, dtype=torch.float64)], dim=1)
    kw = dict(multi_objective_aggregation="normalize_then_sum")
    alone, _ = group_advantages(other[:, None], 3, reward_weights=[1.0], **kw)
    with_tied, _ = group_advantages(both, 3, reward_weights=[1.0, 1.0], **kw)
    assert torch.equal(with_tied, alone)
