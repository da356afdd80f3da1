"""GRPO math: token log-probs, group advantages and the clipped policy-gradient loss.

Pure tensor code (no sampling, no model, no loop): from "N sampled completions with rewards" to
"a scalar to call backward() on". N completions are laid out group by group (the G samples of
prompt 0, then of prompt 1, ...) and padded to T tokens. ``logprobs`` [N, T] are under the policy
being trained, ``old_logprobs`` under the policy that sampled, ``ref_logprobs`` under the frozen
reference; ``mask`` [N, T] marks real completion tokens, |o_i| = mask[i].sum(); ``advantages`` [N].

The objective (DeepSeekMath, arXiv:2402.03300, eq. 3), as a loss to minimise::

    l_it  = -min(r_it * A_i, clip(r_it, 1 - eps_low, 1 + eps_high) * A_i)      policy term
            + beta * KL_it [* r_it if use_bias_correction_kl]                  (if a reference is given)
    r_it  = exp(logprobs_it - old_logprobs_it)                 importance_sampling_level="token"
    r_i   = exp(sum_t m_it (logprobs_it - old_logprobs_it) / |o_i|)   "sequence" (GSPO, 2507.18071)
    loss  = sum_it w_it * m_it * l_it                          w from `aggregation_weights`
            - entropy_coef * sum_it m_it H_it / K                      (if logits are given)

(loss_type="vespo" replaces the clipped policy term by -phi_i * A_i * logprobs_it, see `vespo_weights`.)
The entropy bonus is TRL's documented one, the mean token entropy whatever the loss type: K counts
the effective tokens of the whole accumulated batch (`num_items_in_batch`, so micro-batch bonuses
sum to the one-batch bonus exactly; without it, this call's tokens * N_glob / N). TRL sums each
micro-batch's mean / accumulation steps instead: the same unless micro-batches hold unequal token
counts (docs/grpo_options.md, "Accumulation").
Option names and meanings are TRL's GRPOConfig's (see GRPOConfig).

Signs: the loss is *minus* the advantage-weighted ratio. On the first inner iteration
(pi_theta == pi_old) every ratio is 1, nothing is clipped and the default loss equals -mean(A)
(zero for group-centred advantages of equal weight) while its gradient is not zero;
notebooks/03_grpo_sign_validation.ipynb asserts each of these.
"""

from __future__ import annotations

import math
import numbers
import warnings
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .config import bad_field, check_applies, check_number, config_class, is_int, option, validate

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "vespo")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")
KL_ESTIMATORS = ("k1", "k2", "k3")
ADVANTAGE_SCALES = ("group", "batch", "none")


# --- Log-probs and entropy: one definition, shared with the sampler

def _check_temperature(temperature: float) -> float:
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not temperature > 0:
        raise ValueError(f"temperature must be a number > 0, got {temperature!r} (greedy decoding scores at 1.0)")
    return float(temperature)


def _scaled(logits: Tensor, temperature: float) -> Tensor:
    # float32 at least (bf16/fp16 log-softmax over 50k tokens loses ~1e-2 nats); float64 stays float64.
    x = logits if logits.dtype == torch.float64 else logits.float()
    return x / temperature if temperature != 1.0 else x


def token_logprobs(logits: Tensor, tokens: Tensor, temperature: float = 1.0) -> Tensor:
    """log softmax(logits / temperature) at `tokens`: (B, T, V), (B, T) long -> (B, T).

    Shared by the sampler (old log-probs) and GRPO scoring (new ones), so an unchanged policy gives
    a ratio of exactly 1. Computed in float32 at least as gather(x) - logsumexp(x). Like TRL it
    scores the *full* temperature-scaled distribution whatever top-k / top-p the sampler used (the
    filtered log-probs are in `Rollout.sampling_logprobs`).
    """
    temperature = _check_temperature(temperature)
    if logits.dim() != 3 or tokens.shape != logits.shape[:2]:
        raise ValueError(f"token_logprobs wants logits (B, T, V) and tokens (B, T); got {tuple(logits.shape)} "
                         f"and {tuple(tokens.shape)}")
    x = _scaled(logits, temperature)
    picked = x.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(x, dim=-1)


def entropy_from_logits(logits: Tensor, temperature: float = 1.0, chunk_size: int = 256) -> Tensor:
    """Entropy (nats) of softmax(logits / temperature) at each position: (B, T, V) -> (B, T).

    Rows of the flattened (B*T, V) logits are processed `chunk_size` at a time to bound the extra
    memory to one chunk of log-probs; gradients flow through.
    """
    temperature = _check_temperature(temperature)
    if logits.dim() != 3:
        raise ValueError(f"entropy_from_logits wants logits (B, T, V); got {tuple(logits.shape)}")
    if not is_int(chunk_size, 1):
        raise ValueError(f"entropy_from_logits: chunk_size must be an integer >= 1, got {chunk_size!r}")
    B, T, V = logits.shape
    flat = logits.reshape(B * T, V)
    out = []
    for start in range(0, max(B * T, 1), chunk_size):
        x = _scaled(flat[start : start + chunk_size], temperature)
        logp = F.log_softmax(x, dim=-1)
        out.append(-(logp.exp() * logp).sum(-1))
    return torch.cat(out).reshape(B, T)


# --- Advantages

@dataclass(frozen=True)
class GroupStats:
    """Reward statistics from `group_advantages`; `as_metrics()` gives plain floats for logging."""

    num_groups: int  # number of prompts (groups) in the batch
    group_size: int  # G, completions per prompt
    frac_reward_zero_std: float  # TRL's: fraction of completions whose scaling std (group's, or the batch's) is ~0
    reward_mean: float  # mean reward over the scorable completions (weighted sum over reward functions)
    reward_std: float  # standard deviation of those rewards over the batch (Bessel-corrected; 0 if N == 1)
    reward_group_std_mean: float  # mean over groups of the within-group std (Bessel-corrected)
    num_unscorable: int = 0  # completions whose every reward is NaN (advantage 0, left out of the means)

    def as_metrics(self) -> dict[str, float]:
        return {k: float(v) for k, v in asdict(self).items()}


MULTI_OBJECTIVE_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")


def _nanstd(x: Tensor, dim=None, keepdim: bool = False) -> Tensor:
    """Bessel-corrected std ignoring NaN; NaN where fewer than two values are present (TRL's nanstd),
    except 0 over a dimension of size one (a group of one, a batch of one)."""
    dims = dim if dim is not None else tuple(range(x.dim()))
    mean = torch.nanmean(x, dim=dims, keepdim=True)
    var = torch.nanmean((x - mean) ** 2, dim=dims, keepdim=True)
    count = (~torch.isnan(x)).sum(dim=dims, keepdim=True).to(x.dtype)
    fill = float("nan") if (x.numel() if dim is None else x.size(dim)) > 1 else 0.0
    var = torch.where(count > 1, var * count / (count - 1).clamp(min=1), torch.full_like(var, fill))
    std = var.sqrt()
    return std if keepdim else std.squeeze(dims)


def _tied(g: Tensor, dim: int) -> Tensor:
    """True where the non-NaN values along `dim` are all equal (or fewer than two are present)."""
    nan = torch.isnan(g)
    hi = torch.where(nan, torch.full_like(g, -math.inf), g).amax(dim=dim)
    lo = torch.where(nan, torch.full_like(g, math.inf), g).amin(dim=dim)
    return (hi == lo) | ((~nan).sum(dim=dim) <= 1)


def _rewards_tensor(rewards) -> tuple[Tensor, torch.dtype]:
    if torch.is_tensor(rewards):
        out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
        return rewards.detach().to(torch.float64), out_dtype

    def fix(v):  # TRL's convention: a reward function returns None for a completion it cannot score
        if isinstance(v, (list, tuple)):
            return [fix(u) for u in v]
        return float("nan") if v is None else v

    try:
        return torch.as_tensor(fix(list(rewards)), dtype=torch.float64), torch.float32
    except (TypeError, ValueError) as exc:
        raise ValueError(f"group_advantages: rewards must be numbers (or None / NaN for unscorable), "
                         f"one per completion or one list per completion; {exc}") from None


def _check_advantage_inputs(rewards, group_size, scale, eps, reward_weights, aggregation):
    """group_advantages' argument checks; returns (rewards [N, K] float64, weights [K], output dtype)."""
    for name, value, choices in (("scale", scale, ADVANTAGE_SCALES),
                                 ("multi_objective_aggregation", aggregation, MULTI_OBJECTIVE_AGGREGATIONS)):
        if value not in choices:
            raise ValueError(f"group_advantages: {name} must be one of {choices}, got {value!r}")
    if not isinstance(group_size, numbers.Integral) or isinstance(group_size, bool) or group_size < 1:
        raise ValueError(f"group_advantages: group_size must be a positive integer, got {group_size!r}")
    group_size = int(group_size)  # numpy's integers as Python's, as the configs keep them
    if not (isinstance(eps, (int, float)) and not isinstance(eps, bool) and eps >= 0):
        raise ValueError(f"group_advantages: eps must be a number >= 0, got {eps!r}")
    r, out_dtype = _rewards_tensor(rewards)
    if r.dim() not in (1, 2) or r.numel() == 0:
        raise ValueError(f"group_advantages: rewards must be [N] or [N, num_reward_functions], got shape {tuple(r.shape)}")
    R = r.reshape(-1, 1) if r.dim() == 1 else r  # [N, K]
    N, K = R.shape
    if N % group_size:
        raise ValueError(f"group_advantages: got {N} rewards, which is not a positive multiple of group_size={group_size}")
    if torch.isinf(R).any():
        raise ValueError("group_advantages: rewards contain inf (NaN or None marks an unscorable completion; inf is an error)")
    w = torch.as_tensor([1.0] * K if reward_weights is None else reward_weights, dtype=torch.float64).reshape(-1)
    if w.numel() != K or not torch.isfinite(w).all():
        raise ValueError(f"group_advantages: reward_weights must be {K} finite numbers (one per reward function), "
                         f"got {reward_weights!r}")
    return R, w.to(R.device), out_dtype


def _sum_then_normalize(raw: Tensor, group_std: Tensor, G: int, scale: str, eps: float):
    """Weighted sum first, then centred per group and scaled by `scale`: (adv, std, tied) [N]."""
    g = raw.view(-1, G)
    std = _nanstd(raw).expand(raw.numel()) if scale == "batch" else group_std.repeat_interleave(G)
    adv = (g - torch.nanmean(g, dim=1, keepdim=True)).reshape(-1)
    if scale != "none":
        adv = adv / (std + eps)
    tied = _tied(g, dim=1).repeat_interleave(G)  # exact ties within the group: advantage exactly 0
    if scale == "batch":
        tied = tied | _tied(raw, dim=0)
    return adv, std, tied


def _normalize_then_sum(R: Tensor, w: Tensor, unscorable: Tensor, G: int, eps: float):
    """GDPO: each reward z-scored per group, weighted sum, then batch-normalised: (adv, std, tied)."""
    N, K = R.shape
    grouped = R.view(-1, G, K)
    mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
    z = (grouped - mean_k) / (_nanstd(grouped, dim=1, keepdim=True) + eps)
    z = torch.where(_tied(grouped, dim=1)[:, None, :] & ~torch.isnan(grouped), torch.zeros_like(z), z)
    x = torch.nansum(z.reshape(N, K) * w, dim=1).masked_fill(unscorable, float("nan"))
    std = _nanstd(x).expand(N)
    adv = (x - torch.nanmean(x)) / (std + eps)
    return adv, std, _tied(x, dim=0).expand(N)


def group_advantages(rewards, group_size: int, scale: str = "group", eps: float = 1e-4, *,
                     reward_weights=None, multi_objective_aggregation: str = "sum_then_normalize",
                     ) -> tuple[Tensor, GroupStats]:
    """Group-relative advantages, as TRL's GRPOTrainer computes them: (advantages [N], GroupStats).

    rewards: N = num_groups * group_size values laid out group by group, or an [N, K] table with
    one column per reward function (TRL's `rewards_per_func`). NaN (None in a list) marks a reward
    that could not be computed; a completion whose every reward is NaN is unscorable: left out of
    every mean and std, advantage 0 (TRL's rule). inf raises.

    multi_objective_aggregation, with weights w_k = reward_weights (default all 1):
    - "sum_then_normalize": r_i = sum_k w_k r_ik (NaN skipped), centred on the group mean, divided
      by `scale` (TRL's scale_rewards): "group": the group's std + eps (DeepSeekMath, TRL's default);
      "batch": the std of all N rewards + eps (PPO-Lite); "none": nothing (Dr. GRPO).
    - "normalize_then_sum" (GDPO, 2601.05242): each reward z-scored within its group, weighted sum,
      then centred and scaled by the batch mean and std (+ eps); `scale` is ignored, as in TRL.

    Stds are Bessel-corrected over the scorable values (TRL's nanstd), 0 for a group of one; eps is
    *added* to them. An exactly tied group gets advantages of exactly 0 (TRL can leave ulp / eps
    noise). `frac_reward_zero_std` is TRL's: the fraction of completions whose scaling std is ~0.
    Computed in float64, returned in the rewards' floating dtype (float32 for lists / int tensors).
    """
    R, w, out_dtype = _check_advantage_inputs(rewards, group_size, scale, eps, reward_weights,
                                              multi_objective_aggregation)
    N, G = R.shape[0], group_size
    unscorable = torch.isnan(R).all(dim=1)  # [N]
    raw = torch.nansum(R * w, dim=1).masked_fill(unscorable, float("nan"))  # TRL's logged `reward`
    g = raw.view(-1, G)  # the weighted rewards by group (logged stats; the input of sum_then_normalize)
    group_std = _nanstd(g, dim=1)
    if multi_objective_aggregation == "sum_then_normalize":
        adv, std, tied = _sum_then_normalize(raw, group_std, G, scale, eps)
    else:
        adv, std, tied = _normalize_then_sum(R, w, unscorable, G, eps)
    adv = torch.where(tied | torch.isnan(adv), torch.zeros_like(adv), adv)
    is_std_zero = torch.isclose(std, torch.zeros_like(std))
    scorable = raw[~unscorable]
    stats = GroupStats(
        num_groups=N // G,
        group_size=G,
        frac_reward_zero_std=float(is_std_zero.double().mean()),
        reward_mean=float(scorable.mean()) if scorable.numel() else float("nan"),
        reward_std=float(scorable.std()) if scorable.numel() > 1 else 0.0,
        reward_group_std_mean=float(torch.nanmean(group_std)),
        num_unscorable=int(unscorable.sum()),
    )
    return adv.to(out_dtype), stats


# --- Configuration

@config_class(frozen=True)
class GRPOConfig:
    """How the GRPO loss is formed. The defaults are the DeepSeekMath objective.

    Aggregation (`loss_type`), with m the effective mask, |o_i| = sum_t m_it, l_it the per-token
    loss, N the completions in this call and the two optional accumulation counts of `grpo_loss`
    (N_glob = num_completions_in_batch, default N; K = num_items_in_batch, default sum_it m_it):

    - "grpo":    (1/N_glob) * sum_i (1/|o_i|) sum_t m_it l_it   token mean per completion, then mean
                 over completions (DeepSeekMath); a token of a short completion weighs more.
    - "bnpo":    (N/N_glob) * sum_it m_it l_it / sum_it m_it    token mean over *this call's* tokens,
                 so micro-batches with unequal token counts differ from one batch (as in TRL).
    - "dr_grpo": sum_it m_it l_it / (N_glob * max_completion_length)   a constant per token (Dr. GRPO,
                 2503.20783); max_completion_length is required, as TRL uses its own.
    - "dapo":    sum_it m_it l_it / K    token mean over the *global* accumulated batch (DAPO,
                 2503.14476; TRL's default). With K = the effective tokens of all micro-batches,
                 the sum of the micro-batch losses equals the one-batch loss exactly.
    - "vespo":   VESPO (2602.10693): per token -phi_i * A_i * logprobs_it, phi_i a detached Gamma
                 weight of the sequence ratio (`vespo_weights`), no clipping; aggregated as "dapo".

    Rows with no effective token count in N (they add 0), as in TRL; `aggregation_weights` returns
    each mode's per-token weights. Every option and each difference from TRL's GRPOConfig (defaults,
    k1 / k2 estimators, log_ratio_clamp, accumulation counts, what is not implemented) is listed in
    docs/grpo_options.md and pinned by tests/test_trl_parity.py.
    """

    loss_type: str = option("grpo", 'how token losses are averaged: "grpo" (per completion, then over completions), "bnpo" (over the batch\'s tokens), "dr_grpo" (over a fixed max length), "dapo" (over the tokens of the whole accumulated batch), "vespo" (unclipped, each token weighted by a Gamma weight of its sequence\'s ratio; averaged as dapo); docs/grpo_options.md', choices=LOSS_TYPES)
    clip_eps_low: float = option(0.2, "ratio clipped below at 1 - clip_eps_low (TRL `epsilon`)", min=0.0, max=1.0, max_open=True)
    clip_eps_high: float = option(0.2, "ratio clipped above at 1 + clip_eps_high (TRL `epsilon_high`; DAPO clip-higher uses 0.28)", min=0.0)
    delta: float | None = option(None, "two-sided clipping (INTELLECT-2): unclipped ratio capped at delta (> 1 + clip_eps_high); None = off")
    importance_sampling_level: str = option("token", '"token": per-token ratio; "sequence": GSPO geometric-mean ratio per completion', choices=IMPORTANCE_SAMPLING_LEVELS)
    beta: float = option(0.04, "KL coefficient against the reference (initial) model; 0 runs without a reference model", min=0.0)
    kl_estimator: str = option("k3", "per-token KL(pi_theta || pi_ref) estimator, log r = ref - logp: k1 = -log r, k2 = (log r)^2 / 2, k3 = r - 1 - log r; differentiated through logp, without bias correction k2 pushes down KL(pi_theta || pi_ref), k3 the reverse KL(pi_ref || pi_theta), k1 nothing (its expected gradient is 0: a warning)", choices=KL_ESTIMATORS)
    use_bias_correction_kl: bool = option(False, "multiply the per-token KL by the importance ratio (TRL's option, on in TRL): k1 and k3 then push down KL(pi_theta || pi_ref)")
    entropy_coef: float = option(0.0, "entropy bonus: subtract entropy_coef * (mean token entropy of the accumulated batch) (needs logits); 0 = off", min=0.0)
    temperature: float = option(1.0, "temperature at which the entropy of `logits` is measured (the one used for logprobs; GRPOTrainer sets it to its temperature)", min=0.0, min_open=True)
    mask_truncated_completions: bool = option(False, "drop completions that hit the length budget (no EOS) from the loss (DAPO)")
    max_completion_length: int | None = option(None, "the sampler's max_new_tokens; the dr_grpo constant (required for dr_grpo; GRPOTrainer sets it to its max_new_tokens)", min=1)
    log_ratio_clamp: float | None = option(20.0, "clamp the importance log-ratio to [-c, c] and the KL's log(pi_ref / pi) to at most c before exp; None = off", min=0.0, min_open=True)
    vespo_k_pos: float = option(2.0, "vespo: power k of the Gamma weight for advantages >= 0 (TRL's vespo_k_pos)", min=0.0)
    vespo_lambda_pos: float = option(3.0, "vespo: decay lambda of the Gamma weight for advantages >= 0 (TRL's vespo_lambda_pos)", min=0.0)
    vespo_k_neg: float = option(3.0, "vespo: power k for advantages < 0 (TRL's vespo_k_neg)", min=0.0)
    vespo_lambda_neg: float = option(2.0, "vespo: decay lambda for advantages < 0 (TRL's vespo_lambda_neg)", min=0.0)

    def __post_init__(self):
        validate(self)  # types, ranges and choices of every field (the option() checks above)
        if self.delta is not None:
            check_number(self, "delta", min=1 + self.clip_eps_high, min_open=True)
        if self.loss_type == "dr_grpo" and self.max_completion_length is None:
            bad_field("GRPOConfig", "max_completion_length", None,
                      "must be set (the sampler's max_new_tokens) when loss_type='dr_grpo'")
        for name in ("vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg"):
            check_applies(self, name, self.loss_type == "vespo", "unless loss_type='vespo': set that")
        check_applies(self, "delta", self.loss_type != "vespo",
                      "with loss_type='vespo' (it caps the clipped objective, which vespo does not use): choose another loss_type")
        if self.kl_estimator == "k1" and self.beta > 0 and not self.use_bias_correction_kl:
            warnings.warn("GRPOConfig: kl_estimator='k1' without use_bias_correction_kl has an expected gradient "
                          "of 0 (E[grad log pi] = 0): the KL term regularises nothing; use k3 or k2, or "
                          "use_bias_correction_kl=True", stacklevel=3)


# --- Building blocks (public: the notebook and the tests use them)

def kl_estimate(logprobs: Tensor, ref_logprobs: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from tokens sampled by the policy (Schulman's k1/k2/k3).

    With log r = ref_logprobs - logprobs (r = pi_ref / pi_theta at the sampled token):
    k1 = -log r (unbiased, but negative whenever the reference likes the token more),
    k2 = (log r)^2 / 2 (>= 0, biased), k3 = r - 1 - log r (>= 0 and unbiased; TRL's and
    DeepSeekMath's choice). All three are exactly 0 where logprobs == ref_logprobs.

    These are estimates of the value. A loss differentiates them through logprobs, and in
    expectation over the policy's tokens k1's gradient is 0, k2's that of KL(pi_theta || pi_ref),
    k3's that of the reverse KL(pi_ref || pi_theta); times the importance ratio
    (GRPOConfig.use_bias_correction_kl) k1's and k3's are KL(pi_theta || pi_ref)'s
    (tests/test_grpo.py::test_the_kl_terms_expected_gradients).
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl_estimate: estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")
    if ref_logprobs.shape != logprobs.shape:  # broadcasting would pair other tokens' log-probs
        raise ValueError(f"kl_estimate: ref_logprobs must have the shape of logprobs {tuple(logprobs.shape)}, "
                         f"got {tuple(ref_logprobs.shape)}")
    log_r = ref_logprobs - logprobs
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r**2
    return torch.expm1(log_r) - log_r  # expm1: no cancellation for small log r


def effective_mask(mask: Tensor, truncated: Tensor | None = None, config: GRPOConfig | None = None) -> Tensor:
    """The mask the loss uses: `mask` as bool, minus truncated rows when mask_truncated_completions.

    truncated [N] bool marks completions that hit the length budget without EOS (Rollout.truncated).
    Sum this over all micro-batches to get `num_items_in_batch` for loss_type="dapo".
    """
    config = config or GRPOConfig()
    m = mask.bool()
    if config.mask_truncated_completions:
        if truncated is None:
            raise ValueError("grpo: mask_truncated_completions=True needs `truncated` (an [N] bool tensor)")
        if truncated.shape != m.shape[:1]:
            raise ValueError(f"grpo: truncated must have shape ({m.shape[0]},), got {tuple(truncated.shape)}")
        m = m & ~truncated.bool().to(m.device)[:, None]
    return m


def aggregation_weights(mask: Tensor, config: GRPOConfig | None = None, num_items_in_batch: int | float | None = None,
                        num_completions_in_batch: int | None = None, dtype: torch.dtype = torch.float32) -> Tensor:
    """Per-token weights w [N, T] with loss = sum_it w_it * l_it (zero on masked tokens): each
    aggregation mode's d loss / d l_it (the formulas of GRPOConfig's docstring)."""
    config = config or GRPOConfig()
    m = mask.bool()
    mf = m.to(dtype)
    N = m.shape[0]
    n_glob = float(num_completions_in_batch) if num_completions_in_batch is not None else float(N)
    # a count of the whole accumulated batch: a whole number, at least this call's completions (2 for 4 doubled
    # the loss, 0.5 multiplied it by 8, True counted 1)
    if num_completions_in_batch is not None and (isinstance(num_completions_in_batch, bool) or not n_glob.is_integer()
                                                 or n_glob < N):
        raise ValueError(f"grpo: num_completions_in_batch must be a whole number >= this call's {N} completions (it "
                         f"counts the whole accumulated batch), got {num_completions_in_batch!r}")
    lt = config.loss_type
    if lt == "grpo":
        return mf / (mf.sum(dim=1, keepdim=True).clamp(min=1.0) * n_glob)
    if lt == "bnpo":
        return mf * (N / n_glob) / mf.sum().clamp(min=1.0)
    if lt == "dr_grpo":
        return mf / (n_glob * config.max_completion_length)
    # dapo, and vespo (TRL normalises vespo as dapo)
    return mf / _batch_tokens(m, num_items_in_batch, dtype=dtype)


def _batch_tokens(mask: Tensor, num_items_in_batch: int | float | None = None,
                 num_completions_in_batch: int | None = None, dtype: torch.dtype = torch.float32) -> Tensor:
    """K, the effective tokens of the whole accumulated batch (at least 1): num_items_in_batch when
    given (checked to cover this call's tokens), else this call's tokens * N_glob / N (all of them
    for one batch; under accumulation the estimate TRL's division by the steps amounts to)."""
    own = mask.sum().to(dtype)
    if num_items_in_batch is None:
        scale = 1.0 if num_completions_in_batch is None else float(num_completions_in_batch) / mask.shape[0]
        return (own * scale).clamp(min=1.0)
    if not math.isfinite(float(num_items_in_batch)):  # NaN made the loss NaN, inf made it 0: nothing learned
        raise ValueError(f"grpo: num_items_in_batch must be a finite token count, got {num_items_in_batch!r}")
    if float(num_items_in_batch) < float(own):
        raise ValueError(f"grpo: num_items_in_batch={num_items_in_batch} is smaller than this micro-batch's "
                         f"{int(own)} effective tokens; it must count the whole accumulated batch")
    return own.new_tensor(max(float(num_items_in_batch), 1.0))


def importance_log_weights(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor, level: str = "token",
                           log_ratio_clamp: float | None = None) -> Tensor:
    """log importance weights (exp: the ratio pi_theta / pi_old): [N, T] per token (level "token") or
    [N, 1] per completion ("sequence").

    token:    logprobs_it - old_logprobs_it, 0 on masked positions (whatever they hold, even NaN);
    sequence: the masked mean of those (GSPO's log of the geometric-mean ratio); 0 for empty rows.
    Clamped to [-log_ratio_clamp, log_ratio_clamp] when given (zero gradient beyond the clamp).
    """
    if level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(f"grpo: importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS}, got {level!r}")
    m = mask.bool()
    log_ratio = torch.where(m, logprobs - old_logprobs.detach(), 0.0)
    if level == "sequence":
        log_ratio = log_ratio.sum(dim=1, keepdim=True) / m.sum(dim=1, keepdim=True).clamp(min=1).to(logprobs.dtype)
    if log_ratio_clamp is not None:
        log_ratio = log_ratio.clamp(-log_ratio_clamp, log_ratio_clamp)
    return log_ratio


def policy_objective(ratio: Tensor, advantages: Tensor, config: GRPOConfig | None = None) -> Tensor:
    """The clipped surrogate min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A), elementwise (to maximise).

    With config.delta set the unclipped ratio is first capped at delta (two-sided clipping). Where
    the clipped branch is the minimum (r > 1 + eps_high with A > 0, r < 1 - eps_low with A < 0) the
    gradient is zero; otherwise (A < 0 with a large r, say) it keeps flowing.
    """
    config = config or GRPOConfig()
    clipped = ratio.clamp(1.0 - config.clip_eps_low, 1.0 + config.clip_eps_high)
    unclipped = ratio.clamp(max=config.delta) if config.delta is not None else ratio
    return torch.minimum(unclipped * advantages, clipped * advantages)


VESPO_LOG_RATIO_CLAMP = 20.0  # TRL's per-token and per-sequence upper clamp of the vespo log-ratio
VESPO_MIN_WEIGHT = 1e-8  # TRL's lower clamp of the sequence ratio (log 1e-8 ~ -18.4)


@torch.no_grad()
def vespo_weights(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                  config: GRPOConfig | None = None) -> Tensor:
    """VESPO's Gamma weights phi(w) [N, 1] (2602.10693; TRL's `get_gamma_weights`), detached.

    w = exp(sum_t m_it clamp(logprobs_it - old_logprobs_it, -20, 20)), the *sequence* ratio (a sum,
    not GSPO's mean), clamped to [1e-8, e^20]; phi(w) = e^lambda w^k e^(-lambda w) (so phi(1) = 1),
    with the _pos (k, lambda) where A >= 0 and the _neg ones where A < 0; NaN or inf become 0.
    """
    config = config or GRPOConfig()
    lr = importance_log_weights(logprobs, old_logprobs, mask, "token", VESPO_LOG_RATIO_CLAMP)
    log_w = lr.sum(dim=1, keepdim=True).clamp(math.log(VESPO_MIN_WEIGHT), VESPO_LOG_RATIO_CLAMP)
    a = advantages.reshape(-1, 1).to(logprobs.dtype)
    nonneg = a >= 0
    k = torch.where(nonneg, config.vespo_k_pos, config.vespo_k_neg).to(logprobs.dtype)
    lam = torch.where(nonneg, config.vespo_lambda_pos, config.vespo_lambda_neg).to(logprobs.dtype).clamp(min=1e-4)
    phi = torch.exp(lam + k * log_w - lam * log_w.exp())
    return phi.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


# --- The loss

def _shape(x) -> object:
    return tuple(x.shape) if torch.is_tensor(x) else type(x).__name__


def _check_loss_inputs(logprobs, old_logprobs, advantages, mask, ref_logprobs, logits, config: GRPOConfig) -> None:
    """grpo_loss's argument checks: one ValueError naming the argument and the shape it needs."""
    if not isinstance(config, GRPOConfig):  # a dict of its fields failed as "'dict' object has no attribute"
        raise ValueError(f"grpo_loss: config must be a GRPOConfig (GRPOConfig(**fields)), got {type(config).__name__}")
    if not torch.is_tensor(logprobs) or logprobs.dim() != 2:
        raise ValueError(f"grpo_loss: logprobs must be an [N, T] tensor, got {_shape(logprobs)}")
    if not logprobs.is_floating_point():
        raise ValueError(f"grpo_loss: logprobs must be floating point, got {logprobs.dtype}")
    N, T = logprobs.shape
    if N == 0 or T == 0:
        raise ValueError(f"grpo_loss: need at least one completion and one position, got logprobs of shape {(N, T)}")
    for name, x in (("old_logprobs", old_logprobs), ("mask", mask), ("ref_logprobs", ref_logprobs)):
        if (x is not None or name != "ref_logprobs") and (not torch.is_tensor(x) or x.shape != logprobs.shape):
            raise ValueError(f"grpo_loss: {name} must have the shape of logprobs {(N, T)}, got {_shape(x)}")
    if mask.dtype != torch.bool and bool((odd := (mask != 0) & (mask != 1)).any()):  # .bool() read a 0.5 as True
        seen = mask[odd].unique()[:3].tolist()
        raise ValueError(f"grpo_loss: mask must be bool or hold only 0 and 1 (it marks completion tokens; a token's "
                         f"weight is the aggregation's, loss_type), got values such as {seen}")
    if not torch.is_tensor(advantages) or advantages.reshape(-1).shape != (N,):
        raise ValueError(f"grpo_loss: advantages must have shape ({N},), got {_shape(advantages)}")
    if logits is not None and (not torch.is_tensor(logits) or logits.dim() != 3 or logits.shape[:2] != (N, T)):
        raise ValueError(f"grpo_loss: logits must have shape ({N}, {T}, V), got {_shape(logits)}")
    if config.entropy_coef > 0 and logits is None:
        raise ValueError("grpo_loss: config.entropy_coef > 0 needs `logits` to compute the entropy bonus")


def _masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of x over the True positions of mask (same shape); NaN when there are none."""
    mf = mask.to(x.dtype)
    n = mf.sum()
    return torch.where(n > 0, (x * mf).sum() / n.clamp(min=1), math.nan)


def _loss_metrics(config: GRPOConfig, loss, pg_tok, w, ratio, m, adv, logprobs, old, kl_tok, ent_tok, phi) -> dict:
    """grpo_loss's metrics as plain floats (see its docstring), with one host sync; call under no_grad."""
    dtype = logprobs.dtype
    if config.importance_sampling_level == "sequence":
        unit = m.sum(dim=1, keepdim=True) > 0  # [N, 1]: completions with tokens
        clip_unit = torch.ones_like(unit)  # TRL counts every completion, empty ones too
    else:
        unit = clip_unit = m
    r, a = ratio.detach(), adv[:, None]
    low = (r < 1.0 - config.clip_eps_low) & (a < 0)
    high = (r > 1.0 + config.clip_eps_high) & (a > 0)
    tok_lr = importance_log_weights(logprobs.detach(), old, m, "token", config.log_ratio_clamp)
    values = {
        "loss": loss.detach(),
        "loss/policy": (pg_tok.detach() * w).sum(),
        "ratio/mean": _masked_mean(r, unit),
        "ratio/min": torch.where(unit.any(), torch.where(unit, r, math.inf).min(), math.nan),
        "ratio/max": torch.where(unit.any(), torch.where(unit, r, -math.inf).max(), math.nan),
        "clip_ratio/low_mean": _masked_mean(low.to(dtype), clip_unit),
        "clip_ratio/high_mean": _masked_mean(high.to(dtype), clip_unit),
        "clip_ratio/region_mean": _masked_mean((low | high).to(dtype), clip_unit),
        "approx_kl": _masked_mean(torch.expm1(tok_lr) - tok_lr, m),
        "advantages/mean": adv.mean(),
        "advantages/std": adv.std(correction=0),
        "num_tokens": m.sum(),
        "num_completions": adv.new_tensor(float(adv.numel())),
    }
    if kl_tok is not None:
        values["kl"] = _masked_mean(kl_tok.detach(), m)
    if ent_tok is not None:
        values["entropy"] = _masked_mean(ent_tok.detach(), m)
    if phi is not None:
        values["vespo/phi_seq_mean"] = phi.mean()
    return dict(zip(values, torch.stack([v.to(dtype).reshape(()) for v in values.values()]).tolist()))


def _policy_term(logprobs: Tensor, old: Tensor, adv: Tensor, m: Tensor, config: GRPOConfig):
    """The per-token policy loss (0 off the mask), the importance ratio ([N, T] or [N, 1]) and, for
    "vespo", the detached Gamma weights phi [N, 1] (None otherwise)."""
    N, T = logprobs.shape
    ratio = importance_log_weights(logprobs, old, m, config.importance_sampling_level, config.log_ratio_clamp).exp()
    a = adv[:, None]
    phi = None
    if config.loss_type == "vespo":
        phi = vespo_weights(logprobs.detach(), old, adv, m, config)  # no gradient
        pg_tok = -(phi * a) * torch.where(m, logprobs, 0.0)
    else:
        pg_tok = -policy_objective(ratio, a, config).expand(N, T)
    return torch.where(m, pg_tok, 0.0), ratio, phi


def _kl_per_token(ref_logprobs: Tensor, logprobs: Tensor, ratio: Tensor, m: Tensor, config: GRPOConfig) -> Tensor:
    """The per-token KL to the reference as it enters the loss (0 off the mask)."""
    # the masked logprobs - ref, scored against a zero reference: kl_estimate's log r = ref - logprobs. Clamped
    # on the side where exp(log r) overflows only: clamped above too, a token the policy likes e^20 times more
    # than the reference would get no KL gradient, where the penalty matters most
    lr = importance_log_weights(logprobs, ref_logprobs.to(logprobs), m, "token")
    lr = lr if config.log_ratio_clamp is None else lr.clamp(min=-config.log_ratio_clamp)
    kl_tok = torch.where(m, kl_estimate(lr, torch.zeros_like(lr), config.kl_estimator), 0.0)
    if config.use_bias_correction_kl:  # TRL: KL times the (differentiable) importance ratio
        kl_tok = torch.where(m, kl_tok * ratio, 0.0)
    return kl_tok


def grpo_loss(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
              ref_logprobs: Tensor | None = None, config: GRPOConfig | None = None, *,
              logits: Tensor | None = None, entropy: Tensor | None = None, truncated: Tensor | None = None,
              num_items_in_batch: int | float | None = None, num_completions_in_batch: int | None = None,
              group_stats: GroupStats | None = None) -> tuple[Tensor, dict[str, float]]:
    """The GRPO loss and its metrics: returns (scalar loss tensor, dict of plain floats).

    logprobs [N, T] under the policy being trained (gradients flow through these); old_logprobs [N, T]
    under the sampling policy, advantages [N] (both detached); mask [N, T] (bool or 0/1);
    ref_logprobs [N, T] (detached) adds the KL term when config.beta > 0 and the `kl` metric whenever
    given. Masked positions of the log-prob tensors may hold anything, NaN included (they are
    selected away, never multiplied by 0); masked positions of `logits` must be finite.

    Keyword-only: logits [N, T, V], the policy's raw logits at the completion positions, give the
    `entropy` metric (at config.temperature) and, with entropy_coef > 0, the entropy bonus; or entropy
    [N, T], the per-token entropies already measured (`sampling.sequence_logprobs(return_entropy=True)`),
    for the metric only;
    truncated [N] bool is required with mask_truncated_completions; num_items_in_batch ("dapo",
    "vespo", the entropy bonus: its effective tokens) and num_completions_in_batch ("grpo", "bnpo",
    "dr_grpo": its completions) count the whole accumulated batch, so that summed micro-batch
    losses reproduce the one-batch loss (bnpo excepted: its mean is over this call's tokens);
    group_stats (from `group_advantages`) is copied into the metrics.

    Metrics (NaN where undefined): loss, loss/policy (the policy term alone), kl (per token as it
    enters the loss, as TRL logs it), entropy, ratio/mean, /min, /max, clip_ratio/low_mean (ratio
    < 1 - eps_low where A < 0: zero gradient), clip_ratio/high_mean (ratio > 1 + eps_high where
    A > 0), clip_ratio/region_mean (either), approx_kl (k3 estimate of KL(pi_old || pi_theta)),
    advantages/mean, advantages/std (population), num_tokens, num_completions, vespo/phi_seq_mean.
    Token means run over the effective mask; at sequence level ratio metrics run over non-empty
    completions and clip fractions over all N (TRL's convention).
    """
    config = config or GRPOConfig()
    _check_loss_inputs(logprobs, old_logprobs, advantages, mask, ref_logprobs, logits, config)
    if entropy is not None and (not torch.is_tensor(entropy) or entropy.shape != logprobs.shape):
        raise ValueError(f"grpo_loss: entropy must have the shape of logprobs {tuple(logprobs.shape)}, got {_shape(entropy)}")
    if logprobs.dtype in (torch.float16, torch.bfloat16):
        logprobs = logprobs.float()
    N, T = logprobs.shape
    dtype = logprobs.dtype
    old = old_logprobs.to(logprobs).detach()  # logprobs' dtype and device
    adv = advantages.to(logprobs).detach().reshape(N)
    m = effective_mask(mask.to(logprobs.device), truncated, config)
    w = aggregation_weights(m, config, num_items_in_batch, num_completions_in_batch, dtype)

    pg_tok, ratio, phi = _policy_term(logprobs, old, adv, m, config)
    per_tok = pg_tok
    kl_tok = None
    if ref_logprobs is not None:
        kl_tok = _kl_per_token(ref_logprobs, logprobs, ratio, m, config)
        if config.beta > 0:
            per_tok = per_tok + config.beta * kl_tok
    loss = (per_tok * w).sum()

    # entropy bonus: the accumulated batch's mean token entropy, this call's share of it
    ent_tok = None
    if logits is not None or entropy is not None:
        measured = entropy_from_logits(logits, config.temperature) if logits is not None else entropy.detach()
        ent_tok = torch.where(m, measured.to(dtype), 0.0)
        if config.entropy_coef > 0:
            k = _batch_tokens(m, num_items_in_batch, num_completions_in_batch, dtype)
            loss = loss - config.entropy_coef * ent_tok.sum() / k

    with torch.no_grad():
        metrics = _loss_metrics(config, loss, pg_tok, w, ratio, m, adv, logprobs, old, kl_tok, ent_tok, phi)
    if group_stats is not None:
        metrics.update(group_stats.as_metrics())
    return loss, metrics


def _loss_and_gradient(logprobs: Tensor, *args, **kwargs) -> tuple[float, Tensor]:
    """grpo_loss(logprobs, *args, **kwargs) as a float, and its gradient with respect to logprobs."""
    lp = logprobs.detach().clone().requires_grad_(True)
    loss, _ = grpo_loss(lp, *args, **kwargs)
    (grad,) = torch.autograd.grad(loss, lp, allow_unused=True)
    return float(loss.detach()), torch.zeros_like(lp) if grad is None else grad


def logprob_gradient(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                     ref_logprobs: Tensor | None = None, config: GRPOConfig | None = None, **kwargs) -> Tensor:
    """d grpo_loss / d logprobs [N, T]: how hard, and in which direction, each token is pushed.

    Negative entries mean a gradient-descent step *raises* that token's log-prob. Takes the same
    arguments as `grpo_loss` (except `logits`, whose gradient is not the log-prob gradient).
    """
    if "logits" in kwargs:
        raise ValueError("logprob_gradient: logits are not supported (entropy gradients flow through logits)")
    return _loss_and_gradient(logprobs, old_logprobs, advantages, mask, ref_logprobs, config, **kwargs)[1]


def micro_batch_gradient(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor,
                         micro_batch_size: int, ref_logprobs: Tensor | None = None, config: GRPOConfig | None = None,
                         *, truncated: Tensor | None = None, global_counts: bool = True) -> tuple[Tensor, float]:
    """Accumulate d loss / d logprobs over micro-batches of rows, as a training loop would: (grad [N, T], loss).

    global_counts=True: each micro-batch gets the whole batch's num_items_in_batch and
    num_completions_in_batch and the losses are summed: the one-batch gradient exactly for grpo,
    dr_grpo and dapo (bnpo normalises by each micro-batch's own tokens). global_counts=False: each
    micro-batch normalised on its own and the losses averaged (TRL's recipe): exact for grpo and
    dr_grpo with equal-sized micro-batches only.
    """
    config = config or GRPOConfig()
    if not isinstance(micro_batch_size, int) or isinstance(micro_batch_size, bool) or micro_batch_size < 1:
        raise ValueError(f"micro_batch_gradient: micro_batch_size must be a positive integer, got {micro_batch_size!r}")
    N = logprobs.shape[0]
    counts = {"num_items_in_batch": int(effective_mask(mask, truncated, config).sum()),
              "num_completions_in_batch": N} if global_counts else {}
    parts = []
    for start in range(0, N, micro_batch_size):
        rows = slice(start, start + micro_batch_size)
        parts.append(_loss_and_gradient(logprobs[rows], old_logprobs[rows], advantages.reshape(-1)[rows], mask[rows],
                                        None if ref_logprobs is None else ref_logprobs[rows], config,
                                        truncated=None if truncated is None else truncated[rows], **counts))
    steps = 1 if global_counts else len(parts)  # the averaged losses divide by the accumulation steps
    return torch.cat([grad for _, grad in parts]) / steps, sum(loss for loss, _ in parts) / steps
