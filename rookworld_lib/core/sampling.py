"""Batched, KV-cached generation for GRPO rollouts.

Layout of a batch: prompts are left-padded to a common length P, so every row's last prompt token
sits at column P-1 and all rows decode in lock-step. Position ids count real tokens only (a row
padded by 3 starts at position 0 in column 3), in prefill and in every decode step. Each row stops
at its own EOS; after that it emits padding that the completion mask excludes.

Two log-probs are returned per sampled token:
- `logprobs`: under softmax(logits / temperature) over the full vocabulary, what GRPO scores
  with (`grpo.token_logprobs`), so old and new log-probs agree to float rounding when the policy
  has not changed;
- `sampling_logprobs`: under the distribution actually sampled from (after top-k / top-p);
  identical to `logprobs` when top_k=0 and top_p=1, the GRPO default.
"""

from __future__ import annotations

import contextlib
import math
import numbers
import time
from dataclasses import dataclass, field

import torch

from .grpo import token_logprobs  # the one definition, shared with GRPO scoring
from .model import GPT, KVCache, flops_per_token
from .tokenizer import EOT_ID
from .config import bad_field, config_class, option, validate


# How each decode step runs. dynamic: attention over the cache prefix written so far (shapes grow
# by one per token; cheapest in eager mode). static: fixed shapes, attention over the whole cache
# with unwritten slots masked, the write position a device tensor. cuda_graph: the static step
# captured once per call as a CUDA graph and replayed per token, so the GPU is not left waiting
# on hundreds of Python-issued kernel launches per token. All three give the same tokens.
DECODE_MODES = ("auto", "dynamic", "static", "cuda_graph")
# On a CPU, decode steps up to this many model FLOPs (all rows together) run on the faster of
# torch's intra-op threads and one thread. A decode step is dozens of small ops, each ending at a
# barrier of torch's OpenMP threads: with another process on a core every barrier waits for a
# descheduled thread, and on 2 cores with the other busy 2 threads took 2.5-8x as long per token as
# 1; idle, they were 10-25% faster (docs/perf.md). The choice is timed once per process and batch
# shape, on throwaway steps, and then kept: a float sum splits differently over 1 and 2 threads, so
# a choice that changed between calls would break "same seed, same tokens and log-probs". Another
# process may choose otherwise, so under torch.use_deterministic_algorithms (`--deterministic`) there
# is no timing: such steps run on one thread, and reruns and resumed runs sample the same bits.
# Bigger steps (GPT-2 124M at many rows) keep torch's threads: their matmuls dwarf the barriers.
SINGLE_THREAD_DECODE_FLOPS = 1e9
NO_EOS = -1  # SamplingConfig.eos_id meaning "no end-of-sequence token": every row decodes max_new_tokens
# The lowest sampling temperature above 0. Below it a draw is the greedy answer in all but name (a logit
# lead of 0.5 is a factor e^50), and logits / T head for float32's overflow (1e-45 gives inf, a NaN loss).
MIN_TEMPERATURE = 0.01


@config_class(frozen=True)
class SamplingConfig:
    """How completions are drawn."""

    max_new_tokens: int = option(64, "completion budget per row; rows that hit it are truncated", min=1)
    temperature: float = option(1.0, f"softmax temperature; 0 means greedy (argmax), else >= {MIN_TEMPERATURE}", min=0)
    top_k: int = option(0, "keep only the k most likely tokens (0 = off)", min=0)
    top_p: float = option(1.0, "nucleus: the smallest set with probability >= top_p (1 = off)", min=0, min_open=True,
                          max=1)
    num_samples: int = option(1, "completions per prompt (GRPO's G); rows are laid out group by group", min=1)
    eos_id: int | None = option(EOT_ID, f"token ending a completion (in the mask); None or NO_EOS ({NO_EOS}): never "
                                "stop early")
    pad_id: int = option(EOT_ID, "token emitted after EOS and used for left padding")
    seed: int | None = option(None, "seeds a private torch.Generator (0 to 2**64 - 1, torch's range); None draws "
                              "from the global RNG", min=0, max=2**64 - 1)
    decode: str = option("auto", "dynamic, static, cuda_graph, or auto (cuda_graph on CUDA, dynamic elsewhere)",
                         choices=DECODE_MODES)

    def __post_init__(self):
        for name, lowest in (("eos_id", NO_EOS), ("pad_id", 0)):  # the message says what a token id is
            v = getattr(self, name)
            if v is None:
                continue
            if not isinstance(v, numbers.Integral) or isinstance(v, bool) or v < lowest:
                raise ValueError(f"SamplingConfig.{name} must be a token id (an integer >= 0 and below the model's "
                                 f"vocabulary size)" + (f", or None / {NO_EOS} for no EOS" if name == "eos_id" else "")
                                 + f", got {v!r}")
            object.__setattr__(self, name, int(v))  # numpy and torch integers welcome
        validate(self)
        if 0 < self.temperature < MIN_TEMPERATURE:
            bad_field(type(self).__name__, "temperature", self.temperature,
                      f"must be 0 (greedy) or >= {MIN_TEMPERATURE}")


@dataclass
class Rollout:
    """Completions for N = len(prompts) * num_samples rows, group by group."""

    prompt_ids: list[list[int]]  # per row (each prompt repeated num_samples times)
    tokens: torch.Tensor  # (N, L) long; pad_id after each row's EOS
    logprobs: torch.Tensor  # (N, L) float32; see module docstring; 0 where mask is False
    sampling_logprobs: torch.Tensor  # (N, L) float32, under the filtered distribution
    mask: torch.Tensor  # (N, L) bool; completion tokens including the first EOS
    finished: torch.Tensor  # (N,) bool; True where the row produced EOS (else truncated)
    group_size: int = 1
    eos_id: int = EOT_ID
    stats: dict = field(default_factory=dict)  # prefill/generated token counts, decode steps

    @property
    def truncated(self) -> torch.Tensor:
        return ~self.finished

    def completion_ids(self, row: int, keep_eos: bool = False) -> list[int]:
        ids = self.tokens[row][self.mask[row]].tolist()
        return ids if keep_eos or not ids or ids[-1] != self.eos_id else ids[:-1]

    def completions(self, tokenizer) -> list[str]:
        """Decoded completion text per row, without the EOS token."""
        return [tokenizer.decode(self.completion_ids(i)) for i in range(self.tokens.size(0))]


def left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, valid) of shape (N, P): prompts right-aligned, valid marks the real tokens."""
    if not prompts:
        raise ValueError("no prompts; pass at least one")
    if (empty := next((i for i, p in enumerate(prompts) if len(p) == 0), None)) is not None:
        raise ValueError(f"prompt {empty} is empty; every prompt needs at least one token")
    P = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), P), pad_id, dtype=torch.long)
    valid = torch.zeros((len(prompts), P), dtype=torch.bool)
    for i, p in enumerate(prompts):
        ids[i, P - len(p):] = torch.tensor(p, dtype=torch.long)
        valid[i, P - len(p):] = True
    return ids.to(device), valid.to(device)


def padded_attention_mask(valid: torch.Tensor, q_len: int) -> torch.Tensor:
    """Boolean (N, 1, q_len, K) mask for the last q_len queries over K keys: causal, no pad keys.

    Each query may always see its own key, so a pad position never has an empty softmax row (whose
    NaN would leak into real rows through 0 * NaN in the value matmul).
    """
    K = valid.size(1)
    q_pos = torch.arange(K - q_len, K, device=valid.device)
    k_pos = torch.arange(K, device=valid.device)
    causal = k_pos[None, :] <= q_pos[:, None]
    own = k_pos[None, :] == q_pos[:, None]
    return (causal[None] & (valid[:, None, :] | own[None])).unsqueeze(1)


def position_ids_from_valid(valid: torch.Tensor) -> torch.Tensor:
    """Position of each column counting real tokens only (pads get 0)."""
    return (valid.long().cumsum(dim=1) - 1).clamp(min=0)


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k, then outside the nucleus, to -inf: transformers' TopKLogitsWarper
    followed by TopPLogitsWarper (min_tokens_to_keep=1), the same operations in the same order, so
    the kept sets agree token for token (the most likely token always survives).

    Top-p sums the probabilities from the *least* likely token up and drops those whose running
    sum stays <= 1 - top_p. Summing from the most likely token down (the obvious way) rounds the
    running mass upwards in float32 and drops a boundary token transformers keeps in ~2% of rows
    at top_p 0.9-0.99.
    """
    if top_k and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cum <= (1 - top_p)
        drop_sorted[..., -1:] = False  # keep the most likely token
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def _integer_dtype(dtype) -> bool:
    if isinstance(dtype, torch.dtype):
        return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)
    return getattr(dtype, "kind", "") in ("i", "u")  # numpy: signed / unsigned integers


def _listed(x, where: str, hint: str, quote: bool, what: str = "a list of token-id lists") -> list:
    """x as a list: text, a non-integer tensor or array, or a non-sequence is refused naming `where`."""
    if isinstance(x, (str, bytes)):
        shown = f" ({x[:30]!r})" if quote else ""
        raise ValueError(f"{where} is a string{shown}; pass token ids ({hint}), not text")
    if hasattr(x, "dtype") and hasattr(x, "tolist"):  # a torch tensor or a numpy array
        if not _integer_dtype(x.dtype):
            raise ValueError(f"{where} has dtype {x.dtype}; token ids must be integers")
        x = x.tolist()
    try:
        return list(x)
    except TypeError:
        raise ValueError(f"{where} must be {what}, got {type(x).__name__}") from None


def _token_rows(prompts, vocab_size: int) -> list[list[int]]:
    """prompts as lists of Python ints, each checked: integer ids in [0, vocab_size); clear errors otherwise."""
    where = "generate: prompts"
    if torch.is_tensor(prompts) and (prompts.dim() != 2 or not _integer_dtype(prompts.dtype)):
        raise ValueError(f"{where} as a tensor must be 2-D (num_prompts, length) of integer ids, got "
                         f"shape {tuple(prompts.shape)} and dtype {prompts.dtype}")
    prompts = _listed(prompts, where, "one list per prompt, e.g. [tokenizer.encode(text)]", quote=False)
    if not prompts:
        raise ValueError(f"{where} is empty; pass at least one prompt")
    rows = []
    for i, p in enumerate(prompts):
        if isinstance(p, numbers.Integral):
            raise ValueError(f"{where}[{i}] is a single id ({p!r}); pass one list of token ids per prompt")
        ids = _listed(p, f"{where}[{i}]", "tokenizer.encode(text)", quote=True, what="a list of token ids")
        if not ids:
            raise ValueError(f"{where}[{i}] is empty; every prompt needs at least one token")
        for j, t in enumerate(ids):
            if hasattr(t, "dtype") and hasattr(t, "item") and getattr(t, "ndim", 1) == 0 and _integer_dtype(t.dtype):
                t = t.item()  # a 0-d integer tensor or numpy scalar
            if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                raise ValueError(f"{where}[{i}][{j}] is {t!r} ({type(t).__name__}); token ids must be integers "
                                 f"in [0, {vocab_size}) (floats are not truncated)")
            if not 0 <= t < vocab_size:
                raise ValueError(f"{where}[{i}][{j}] = {t} is outside the model's vocabulary: token ids must be "
                                 f"in [0, {vocab_size})")
        rows.append([int(t) for t in ids])
    return rows


_CDF_BLOCK = 256  # vocabulary entries per block in sample_categorical's two-level search


def sample_categorical(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw per row of probs (N, V) by inverse CDF in float64; returns (N,) long.

    torch.multinomial draws one random number per vocabulary entry per row, which was most of a
    small model's decode step; this draws one uniform number per row. The search is two-level
    (sums of blocks of 256 entries, then the cumulative sum inside the chosen block) so the
    float64 cumulative sums stay short and accurate. A token of zero probability is never drawn:
    the search picks the first entry whose cumulative sum exceeds u, and a zero entry does not
    raise it; a u that rounds past the total falls back to the last entry with mass.
    Rows need not be normalised but must have a positive, finite sum.
    """
    N, V = probs.shape
    B = _CDF_BLOCK
    full = V // B
    # Block sums straight from the input (no full-size copy): 256 entries add up accurately in
    # float32 (pairwise), five times faster on a CPU than accumulating in float64; the cumulative
    # sums across blocks are float64.
    acc = torch.float64 if probs.dtype == torch.float64 else torch.float32
    block_mass = probs[:, : full * B].unflatten(1, (full, B)).sum(dim=-1, dtype=acc).double()
    if V % B:
        tail = probs[:, full * B :].sum(dim=-1, dtype=acc, keepdim=True).double()
        block_mass = torch.cat([block_mass, tail], dim=1)  # (N, nb)
    block_cdf = block_mass.cumsum(dim=-1)
    total = block_cdf[:, -1:]
    u = torch.rand((N, 1), dtype=torch.float64, device=probs.device, generator=generator) * total
    nb = block_mass.size(1)
    last_block = _last_positive(block_mass)
    b = torch.searchsorted(block_cdf, u, right=True).clamp(max=nb - 1)
    b = torch.minimum(b, last_block)
    cols = b * B + torch.arange(B, device=probs.device)  # (N, B); past V only in the last block
    inside = probs.gather(1, cols.clamp(max=V - 1)).double().masked_fill_(cols >= V, 0.0)
    offset = u - (block_cdf.gather(1, b) - block_mass.gather(1, b))
    j = torch.searchsorted(inside.cumsum(dim=-1), offset, right=True).clamp(max=B - 1)
    j = torch.minimum(j, _last_positive(inside))
    return (b * B + j)[:, 0]


def _last_positive(x: torch.Tensor) -> torch.Tensor:
    """(N, 1) index of the last positive entry of each row of x (N, K)."""
    idx = torch.arange(x.size(1), device=x.device).expand_as(x)
    return torch.where(x > 0, idx, torch.zeros_like(idx)).amax(dim=1, keepdim=True)


def check_fits(block_size: int, prompt_len: int, max_new_tokens: int, where: str = "") -> None:
    """Raise ValueError unless a prompt of `prompt_len` tokens and `max_new_tokens` new ones fit in
    `block_size` positions (the last new token is never fed back: prompt_len + max_new_tokens - 1 are run).
    `where`: which prompt that is (`items[3], 'Q: ...'`), for the message."""
    P, L = prompt_len, max_new_tokens
    what = f"the longest prompt ({P} tokens{': ' + where if where else ''})"
    if P > block_size:  # no completion budget makes it fit
        raise ValueError(f"{what} is longer than the model's block_size {block_size} "
                         "(its learned positions): no completion fits; use a model with a longer context")
    if P + L - 1 > block_size:
        raise ValueError(f"{what} + max_new_tokens ({L}) - 1 = {P + L - 1} positions exceed "
                         f"the model's block_size {block_size}; allowed: prompt length + max_new_tokens <= "
                         f"{block_size + 1}")


@torch.no_grad()
def generate(model: GPT, prompts: list[list[int]], config: SamplingConfig = SamplingConfig()) -> Rollout:
    """Sample `config.num_samples` completions for each prompt in one batched, KV-cached pass."""
    if not isinstance(config, SamplingConfig):  # a dict of its fields failed as "'dict' object has no attribute"
        raise ValueError(f"generate: config must be a SamplingConfig (SamplingConfig(**fields)), got {type(config).__name__}")
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    if torch.is_autocast_enabled(device.type):  # keys and values come out of autocast's matmuls
        dtype = torch.get_autocast_dtype(device.type)
    G = config.num_samples
    vocab = model.config.vocab_size
    for name in ("eos_id", "pad_id"):
        v = getattr(config, name)
        if v is not None and v >= vocab:
            raise ValueError(f"SamplingConfig.{name} = {v} is outside the model's vocabulary: it must be in "
                             f"[0, {vocab})" + (f", or None / {NO_EOS} for no EOS" if name == "eos_id" else ""))
    eos_id = NO_EOS if config.eos_id is None else int(config.eos_id)  # NO_EOS: no sampled token equals it
    rows = [p for p in _token_rows(prompts, vocab) for _ in range(G)]
    ids, valid = left_pad(rows, config.pad_id, device)
    N, P = ids.shape
    L = config.max_new_tokens
    check_fits(model.config.block_size, P, L)

    generator = None if config.seed is None else torch.Generator(device=device).manual_seed(config.seed)

    was_training = model.training
    model.eval()  # dropout off while sampling
    try:
        # P + L - 1 slots are written; one more, where the block allows it, is the CUDA graph's spare
        cache_len = min(P + L, model.config.block_size)
        cache = KVCache(model.config, N, cache_len, device, dtype)
        valid_all = torch.cat([valid, torch.zeros(N, cache_len - P, dtype=torch.bool, device=device)], dim=1)
        real_len = valid.sum(dim=1)  # next position id per row
        logits = model(ids, position_ids_from_valid(valid), padded_attention_mask(valid, P), cache, 0,
                       last_only=True)[:, -1]
        if torch.isnan(logits).any():  # else every row "samples" token 0 with NaN log-probs, without a word
            raise ValueError("generate: the model's logits for the prompts are NaN: its weights (or a forward hook) "
                             "hold NaN; nothing can be sampled from it")

        tokens = torch.full((N, L), config.pad_id, dtype=torch.long, device=device)
        logprobs = torch.zeros((N, L), dtype=torch.float32, device=device)
        sampling_logprobs = torch.zeros((N, L), dtype=torch.float32, device=device)
        mask = torch.zeros((N, L), dtype=torch.bool, device=device)
        finished = torch.zeros(N, dtype=torch.bool, device=device)
        check_every = 16 if device.type == "cuda" else 1  # all-finished check syncs the GPU
        decode_step = _decode_step(model, cache, valid_all, P, L, _decode_mode(config.decode, device))
        steps = 0
        # the prefill keeps torch's threads; with no decode step (L == 1) there is nothing to choose
        threads = _decode_threads(model, N, P + L // 2, device) if L > 1 else torch.get_num_threads()
        with _intra_op_threads(threads):
            for t in range(L):
                next_tok, lp_full, lp_samp = _next_token(logits.float(), config, generator)
                active = ~finished
                tokens[:, t] = torch.where(active, next_tok, torch.full_like(next_tok, config.pad_id))
                logprobs[:, t] = torch.where(active, lp_full, torch.zeros_like(lp_full))
                sampling_logprobs[:, t] = torch.where(active, lp_samp, torch.zeros_like(lp_samp))
                mask[:, t] = active
                finished = finished | (active & (next_tok == eos_id))
                steps = t + 1
                if t == L - 1 or ((t + 1) % check_every == 0 and bool(finished.all())):
                    break
                valid_all[:, P + t] = True
                logits = decode_step(tokens[:, t : t + 1], (real_len + t)[:, None], t)
    finally:
        model.train(was_training)

    return Rollout(
        prompt_ids=rows,
        tokens=tokens[:, :steps],
        logprobs=logprobs[:, :steps],
        sampling_logprobs=sampling_logprobs[:, :steps],
        mask=mask[:, :steps],
        finished=finished,
        group_size=G,
        eos_id=eos_id,
        stats={"prefill_tokens": int(valid.sum()), "generated_tokens": int(mask.sum()), "decode_steps": steps},
    )


def _next_token(logits: torch.Tensor, config: SamplingConfig, generator) -> tuple[torch.Tensor, ...]:
    """The next token of every row, its log-prob under softmax(logits / T) and under the
    distribution sampled from (after top-k / top-p; the same tensor when neither is on)."""
    if config.temperature == 0:
        next_tok = logits.argmax(dim=-1)
        lp_full = token_logprobs(logits[:, None], next_tok[:, None], 1.0)[:, 0]
        return next_tok, lp_full, lp_full
    filtering = config.top_k > 0 or config.top_p < 1.0
    scaled = logits if config.temperature == 1 else logits / config.temperature
    if filtering:
        filtered = filter_logits(scaled, config.top_k, config.top_p)
        next_tok = sample_categorical(filtered.softmax(dim=-1), generator)
        lp_full = token_logprobs(logits[:, None], next_tok[:, None], config.temperature)[:, 0]
        return next_tok, lp_full, token_logprobs(filtered[:, None], next_tok[:, None], 1.0)[:, 0]
    # One fused softmax pass over the vocabulary serves the draw and the log-prob (softmax, then
    # logsumexp, took two; they were a fifth of a small model's decode step). log(p) matches
    # token_logprobs to float rounding for every probability float32 holds as a normal number
    # (> 1e-38); a token that improbable is drawn about once in 1e38 draws.
    probs = scaled.softmax(dim=-1)
    next_tok = sample_categorical(probs, generator)
    lp = probs.gather(-1, next_tok[:, None]).log()[:, 0]
    return next_tok, lp, lp


_DECODE_THREADS: dict[tuple, int] = {}  # (model config, rows, torch's threads) -> threads chosen


def _decode_threads(model: GPT, rows: int, context: int, device: torch.device) -> int:
    """The intra-op threads this process decodes `rows` rows of `model` on (see
    SINGLE_THREAD_DECODE_FLOPS): torch's own, or one when one was faster on the first call (always
    one under deterministic algorithms)."""
    default = torch.get_num_threads()
    small = rows * flops_per_token(model.config, max(1, context), "decode") <= SINGLE_THREAD_DECODE_FLOPS
    if device.type != "cpu" or default == 1 or not small:
        return default
    if torch.are_deterministic_algorithms_enabled():
        return 1
    key = (model.config, rows, default)
    if key not in _DECODE_THREADS:
        _DECODE_THREADS[key] = _faster_threads(model, rows, context, default)
    return _DECODE_THREADS[key]


def _faster_threads(model: GPT, rows: int, context: int, default: int) -> int:
    """Times decode steps at `context` on a scratch cache (best of two each) on `default` threads
    and on one; nothing a caller sees is computed here."""
    dtype = next(model.parameters()).dtype
    cache = KVCache(model.config, rows, context + 1, "cpu", dtype)
    tok = torch.zeros((rows, 1), dtype=torch.long)
    pos = torch.full((rows, 1), context, dtype=torch.long)
    attend_all = torch.ones((rows, 1, 1, context + 1), dtype=torch.bool)
    best_s: dict[int, float] = {}
    for threads in (default, 1, default, 1):
        with _intra_op_threads(threads):
            start = time.perf_counter()
            model(tok, pos, attend_all, cache, context)
            best_s[threads] = min(best_s.get(threads, math.inf), time.perf_counter() - start)
    return min(best_s, key=best_s.get)


@contextlib.contextmanager
def _intra_op_threads(threads: int):
    default = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(default)


def _decode_mode(mode: str, device: torch.device) -> str:
    if mode == "auto":
        return "cuda_graph" if device.type == "cuda" else "dynamic"
    if mode == "cuda_graph" and device.type != "cuda":
        raise ValueError(f"SamplingConfig.decode='cuda_graph' needs a CUDA device, the model is on {device}")
    return mode


def _decode_step(model: GPT, cache: KVCache, valid_all: torch.Tensor, P: int, L: int, mode: str):
    """A function (tokens (N, 1), positions (N, 1), t) -> logits (N, V) of the next token, which
    writes token t's keys and values at cache slot P + t. valid_all (N, cache length: P + L, or
    P + L - 1 at a full block) marks the slots a row may attend to; the caller sets column P + t
    before the call."""
    if mode == "dynamic":
        def step(tok, pos, t):
            attn = padded_attention_mask(valid_all[:, : P + t + 1], 1)
            return model(tok, pos, attn, cache, P + t)[:, -1]
        return step
    mask = valid_all[:, None, None, :]  # a view: it sees every column the caller validates
    if mode == "static":
        start = torch.zeros(1, dtype=torch.long, device=valid_all.device)

        def step(tok, pos, t):
            start.fill_(P + t)
            return model(tok, pos, mask, cache, start)[:, -1]
        return step
    if L < 2:  # no decode step follows the prefill
        return None
    # the slot after the last written one; at a full block, the last decode step's own slot, which
    # no step attends to before that step overwrites it
    return _GraphedDecodeStep(model, cache, mask, P, spare_slot=valid_all.size(1) - 1)


def _graph_safe_autocast(device: torch.device):
    """The caller's autocast, with its weight-cast cache off: a cast cached while capturing would
    be freed when autocast exits, and the graph would then read freed memory."""
    if torch.is_autocast_enabled(device.type):
        return torch.autocast(device.type, dtype=torch.get_autocast_dtype(device.type), cache_enabled=False)
    return contextlib.nullcontext()


class _GraphedDecodeStep:
    """The static decode step captured as a CUDA graph, replayed once per token.

    Inputs are copied into the graph's own buffers before each replay; the logits come back in the
    graph's output buffer, valid until the next replay. Warm-up and capture write their keys and
    values to the cache's last slot, which no decode step attends to before a step writes it.
    """

    def __init__(self, model: GPT, cache: KVCache, mask: torch.Tensor, P: int, spare_slot: int):
        dev, n = mask.device, mask.size(0)
        self.tok = torch.zeros((n, 1), dtype=torch.long, device=dev)
        self.pos = torch.zeros((n, 1), dtype=torch.long, device=dev)
        self.start = torch.full((1,), spare_slot, dtype=torch.long, device=dev)
        self.P = P
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side), _graph_safe_autocast(dev):
            for _ in range(2):  # warm-up: kernel selection and allocations happen outside the graph
                model(self.tok, self.pos, mask, cache, self.start)
        torch.cuda.current_stream(dev).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), _graph_safe_autocast(dev):
            self.logits = model(self.tok, self.pos, mask, cache, self.start)[:, -1]

    def __call__(self, tok: torch.Tensor, pos: torch.Tensor, t: int) -> torch.Tensor:
        self.tok.copy_(tok)
        self.pos.copy_(pos)
        self.start.fill_(self.P + t)
        self.graph.replay()
        return self.logits


def sequence_logprobs(model: GPT, prompt_ids: list[list[int]], completion_tokens: torch.Tensor,
                      temperature: float = 1.0, pad_id: int = EOT_ID, return_logits: bool = False,
                      return_entropy: bool = False):
    """Log-probs (N, L) of completion tokens under `model`, from one full forward pass.

    The sequence is [left pad][prompt][completion], with the same position ids and attention mask
    the sampler used, so for an unchanged model in eval mode this reproduces Rollout.logprobs (the
    sampler turns dropout off; here the model's mode is the caller's: a model in train mode with dropout
    scores with dropout, as the GRPO update of such a model does). Gradients flow.
    Returns (logprobs, completion_logits) when return_logits is set, for entropy terms, and
    (logprobs, entropies) when return_entropy is set: the head fused with the log-softmax, chunk by
    chunk (`lm_head_loss.linear_token_logprobs`; no (N, L, V) logits kept; entropies detached).
    """
    device = completion_tokens.device
    ids, valid = left_pad(prompt_ids, pad_id, device)
    P = ids.size(1)
    L = completion_tokens.size(1)
    if L == 0:
        raise ValueError("sequence_logprobs: completion_tokens has no columns; there is nothing to score")
    # the last completion token is predicted, never fed: P + L - 1 positions (as in sampling)
    full = torch.cat([ids, completion_tokens[:, :-1]], dim=1)
    full_valid = torch.cat([valid, torch.ones_like(completion_tokens[:, :-1], dtype=torch.bool)], dim=1)
    position_ids, attn_mask = position_ids_from_valid(full_valid), padded_attention_mask(full_valid, P + L - 1)
    if return_entropy:
        return model(full, position_ids, attn_mask, logits_from=P - 1, score_tokens=completion_tokens,
                     temperature=temperature)
    logits = model(full, position_ids, attn_mask, logits_from=P - 1)  # the head runs only where a token is predicted
    completion_logits = logits[:, :L]
    lp = token_logprobs(completion_logits, completion_tokens, temperature)
    return (lp, completion_logits) if return_logits else lp
