"""GRPO math: token log-probs, group advantages and the clipped policy-gradient loss.

Pure tensor code; no sampling, no model, no training loop.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


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

    The one definition shared by the sampler (`sampling.py`, for the old log-probs it stores) and
    by GRPO scoring (for the new log-probs), so an unchanged policy gives a ratio of exactly 1.
    Computed in float32 (float64 inputs stay float64) as gather(x) - logsumexp(x), which avoids
    materialising a second (B, T, V) tensor of log-probs.

    Which distribution is scored: the sampler draws from softmax(logits / T) *after* top-k / top-p
    filtering, but GRPO scores against the temperature-scaled *full* distribution softmax(logits / T).
    With top_k=0 and top_p=1 (the GRPO default) the two coincide. With filtering they differ by the
    log of the kept probability mass; TRL makes the same choice (its `_get_per_token_logps` divides
    logits by `temperature` and applies a full-vocabulary log-softmax, whatever top_k / top_p the
    generator used). The sampler also records the filtered log-probs for anyone who wants to
    correct for it.
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
    B, T, V = logits.shape
    flat = logits.reshape(B * T, V)
    out = []
    for start in range(0, max(B * T, 1), chunk_size):
        x = _scaled(flat[start : start + chunk_size], temperature)
        logp = F.log_softmax(x, dim=-1)
        out.append(-(logp.exp() * logp).sum(-1))
    return torch.cat(out).reshape(B, T)
