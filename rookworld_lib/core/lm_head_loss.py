"""The LM head and next-token cross-entropy fused, chunk by chunk over the rows.

For a GPT-2-sized vocabulary the head and the loss dominate a small model's training step. Here
each chunk of rows goes through logits -> loss -> gradient of the logits in the forward pass, and
that gradient becomes at once the gradients of the hidden states and of the head weight: the full
(rows, 50257) logits never exist, and the backward pass only scales the stored gradients.

Each chunk's logits are formed vocabulary-major, (V, rows) = weight @ hidden.T, and the softmax is
taken in place (max, subtract + exp, sum, scale): on a 2-core AVX2 CPU that made the forward matmul
1.6x faster than (rows, V), at half the cost of `torch.logsumexp` plus a second exp (docs/perf.md).
The math is `F.cross_entropy(hidden @ weight.T, targets)`'s up to float summation order. Gradients
are computed in the forward pass, so this is for training and evaluation losses, not double backward.
"""

from __future__ import annotations

import contextlib
import functools
import threading

import torch

# Rows per chunk on a CPU. The chunk's logits go to one reused buffer (_logits_buffer), so its size
# no longer costs page faults per chunk; with the buffer, chunks grew from 128 to 256 rows (docs/perf.md,
# "Re-run on 2026-11-25": the step 7% faster, buffer and rows together).
CPU_CHUNK_ROWS = 256
# On an accelerator there are no page faults (caching allocator) and bigger matmuls are better;
# 2048 rows of float32 GPT-2 logits are 412 MB.
DEVICE_CHUNK_ROWS = 2048


_CPU_WORKSPACE = threading.local()  # this thread's CPU chunk buffers, by name, reused across chunks and calls


def _logits_buffer(weight: torch.Tensor, rows: int, name: str = "logits") -> torch.Tensor | None:
    """A (V, rows) float32 buffer for one chunk's logits on the CPU, reused: a fresh 25 MB block
    costs its page faults on every chunk (the (V, C) @ (C, 128) matmul ran 15.7 ms into a new
    block, 11.5 ms into a reused one). None elsewhere: the caching allocator already reuses."""
    if weight.device.type != "cpu":
        return None
    need = weight.size(0) * rows
    buf = getattr(_CPU_WORKSPACE, name, None)
    if buf is None or buf.numel() < need:
        buf = torch.empty(need, dtype=torch.float32)  # 51 MB at 256 rows
        setattr(_CPU_WORKSPACE, name, buf)
    return buf[:need].view(weight.size(0), rows)


def _chunk_logits(weight: torch.Tensor, h: torch.Tensor, name: str = "logits") -> torch.Tensor:
    """(V, rows) float32 logits weight @ h.T, into the reused CPU buffer when there is one."""
    buf = _logits_buffer(weight, h.size(0), name)
    return (weight @ h.t()).float() if buf is None else torch.mm(weight, h.t(), out=buf)


def default_chunk_rows(device: torch.device) -> int:
    """Rows per chunk on `device` (see CPU_CHUNK_ROWS and DEVICE_CHUNK_ROWS)."""
    return CPU_CHUNK_ROWS if device.type == "cpu" else DEVICE_CHUNK_ROWS


def _checked(fn: str, hidden: torch.Tensor, other: torch.Tensor, what: str, chunk_rows: int | None) -> int:
    """chunk_rows (default_chunk_rows where None) once hidden (..., C) and other (...) agree; ValueError else."""
    if hidden.shape[:-1] != other.shape:
        raise ValueError(f"{fn}: hidden {tuple(hidden.shape)} and {what} {tuple(other.shape)} disagree")
    chunk_rows = default_chunk_rows(hidden.device) if chunk_rows is None else chunk_rows
    if chunk_rows < 1:  # range(0, M, 0) raises; a negative step never runs and leaves the outputs unwritten
        raise ValueError(f"{fn}: chunk_rows must be >= 1, got {chunk_rows}")
    return chunk_rows


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, ignore_index, chunk_rows, grad_enabled):
        # hidden (M, C), weight (V, C), targets (M,); grad_enabled: the caller's grad mode (forward
        # itself always runs with grad off, and needs_input_grad ignores torch.no_grad)
        n_valid = (targets != ignore_index).sum()
        denom = n_valid.clamp(min=1).to(torch.float32)
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        need_grad = grad_enabled and (ctx.needs_input_grad[0] or ctx.needs_input_grad[1])
        plain_fp32 = (hidden.dtype == weight.dtype == torch.float32
                      and not torch.is_autocast_enabled(hidden.device.type))
        grad_hidden = torch.empty_like(hidden, dtype=torch.float32) if need_grad else None
        grad_weight = None
        for start in range(0, hidden.size(0), chunk_rows):
            h = hidden[start:start + chunk_rows]
            t = targets[start:start + chunk_rows]
            keep = t != ignore_index
            safe_t = torch.where(keep, t, torch.zeros_like(t))[None, :]
            # (V, rows); under autocast the matmul may run in bf16
            logits = _chunk_logits(weight, h) if plain_fp32 else (weight @ h.t()).float()
            picked = logits.gather(0, safe_t)[0]
            row_max = logits.amax(dim=0)
            probs = logits.sub_(row_max).exp_()  # in place: unnormalised softmax, no new buffer
            total = probs.sum(dim=0)
            lse = row_max + total.log()
            loss += torch.where(keep, lse - picked, torch.zeros_like(lse)).sum()
            if not need_grad:
                continue
            # d(loss)/d(logits) = (softmax - onehot) / n_valid on kept rows, 0 on ignored ones
            scale = keep.to(torch.float32) / denom
            g = probs.mul_(scale / total)
            g.scatter_add_(0, safe_t, -scale[None, :])
            if plain_fp32:
                torch.mm(g.t(), weight, out=grad_hidden[start:start + chunk_rows])
                if grad_weight is None:
                    grad_weight = g @ h
                else:
                    grad_weight.addmm_(g, h)  # in place: no (V, C) temporary per chunk
            else:  # mixed precision: the matmuls in the autocast/input dtype, sums in float32
                grad_hidden[start:start + chunk_rows] = (g.t().to(weight.dtype) @ weight).float()
                gw = (g.to(h.dtype) @ h).float()
                grad_weight = gw if grad_weight is None else grad_weight.add_(gw)
        if need_grad and grad_weight is None:  # no rows at all
            grad_weight = torch.zeros_like(weight, dtype=torch.float32)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.input_dtypes = (hidden.dtype, weight.dtype)
        # an all-ignored batch gives nan, as F.cross_entropy does
        return torch.where(n_valid > 0, loss / denom, torch.full_like(loss, float("nan")))

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        h_dtype, w_dtype = ctx.input_dtypes
        if grad_loss.device.type == "cpu" and bool(grad_loss == 1):  # the usual case: no (V, C) product
            grad_loss = None
        gh = (grad_hidden if grad_loss is None else grad_hidden * grad_loss).to(h_dtype) if ctx.needs_input_grad[0] else None
        gw = (grad_weight if grad_loss is None else grad_weight * grad_loss).to(w_dtype) if ctx.needs_input_grad[1] else None
        return gh, gw, None, None, None, None


def eager_under_compile(fn):
    """torch.compile leaves `fn` to eager mode: the chunk loop and the in-place accumulation are
    already what a compiler would produce, and a graph break is cheaper than a retrace. The same graph
    break as decorating with `torch.compiler.disable`, but decided at call time: that decorator imports
    torch._dynamo (about 1.8 s) in every process that imports the model, compiling or not."""
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if torch.compiler.is_compiling():  # a constant while dynamo traces; False in eager mode
            return torch.compiler.disable(fn)(*args, **kwargs)
        return fn(*args, **kwargs)
    return call


@eager_under_compile
def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         ignore_index: int = -1, chunk_rows: int | None = None) -> torch.Tensor:
    """Mean cross-entropy of softmax(hidden @ weight.T) at targets, without materialising the logits.

    hidden (..., C), weight (V, C), targets (...) long; positions whose target is ignore_index do
    not count. Equal to `F.cross_entropy((hidden @ weight.T).reshape(-1, V), targets.reshape(-1))`.
    chunk_rows (rows of logits alive at once) defaults to `default_chunk_rows(hidden.device)`.
    """
    chunk_rows = _checked("linear_cross_entropy", hidden, targets, "targets", chunk_rows)
    return _LinearCrossEntropy.apply(hidden.reshape(-1, hidden.size(-1)), weight, targets.reshape(-1),
                                     ignore_index, chunk_rows, torch.is_grad_enabled())


class _LinearTokenLogprobs(torch.autograd.Function):
    # forward keeps each row's log-sum-exp only; backward recomputes the chunk's logits (one more
    # matmul) instead of holding (rows, V) of them
    @staticmethod
    def forward(ctx, hidden, weight, tokens, inv_temp, chunk_rows):
        M = hidden.size(0)
        logprobs = torch.empty(M, dtype=torch.float32, device=hidden.device)
        entropy, lse = torch.empty_like(logprobs), torch.empty_like(logprobs)
        for start in range(0, M, chunk_rows):
            rows = slice(start, start + chunk_rows)
            y = _chunk_logits(weight, hidden[rows]).mul_(inv_temp)  # (V, r) scaled logits
            picked = y.gather(0, tokens[rows][None])[0]
            row_max = y.amax(dim=0)
            y.sub_(row_max)
            e = torch.exp(y, out=_logits_buffer(weight, y.size(1), "exp")) if y.device.type == "cpu" else y.exp()
            total = e.sum(dim=0)
            # entropy = log(total) - sum(e * y) / total, with y the max-shifted scaled logits
            entropy[rows] = total.log() - e.mul_(y).sum(dim=0) / total
            lse[rows] = row_max + total.log()
            logprobs[rows] = picked - lse[rows]
        ctx.save_for_backward(hidden, weight, tokens, lse)
        ctx.inv_temp, ctx.chunk_rows = inv_temp, chunk_rows
        # the backward recomputes the logits as this forward made them (a bf16 matmul under autocast
        # off the CPU): against a log-sum-exp of other logits its softmax would not sum to one
        kind = hidden.device.type
        ctx.amp = (kind, torch.get_autocast_dtype(kind)) if torch.is_autocast_enabled(kind) else None
        ctx.mark_non_differentiable(entropy)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, _grad_entropy):
        hidden, weight, tokens, lse = ctx.saved_tensors
        grad_hidden = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device)
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for start in range(0, hidden.size(0), ctx.chunk_rows):
            rows = slice(start, start + ctx.chunk_rows)
            h, u = hidden[rows], grad_logprobs[rows].float()
            # d logprob / d logits = (onehot - softmax) / T, times the incoming gradient u per row
            with torch.autocast(*ctx.amp) if ctx.amp else contextlib.nullcontext():
                y = _chunk_logits(weight, h)
            g = y.mul_(ctx.inv_temp).sub_(lse[rows]).exp_().mul_(-u * ctx.inv_temp)
            g.scatter_add_(0, tokens[rows][None], (u * ctx.inv_temp)[None])
            torch.mm(g.t(), weight, out=grad_hidden[rows])
            grad_weight.addmm_(g, h)
        return grad_hidden.to(hidden.dtype), grad_weight.to(weight.dtype), None, None, None


@eager_under_compile
def linear_token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, tokens: torch.Tensor,
                          temperature: float = 1.0, chunk_rows: int | None = None):
    """(log-probs, entropies) of softmax(hidden @ weight.T / temperature), per position, without
    materialising the logits: hidden (..., C) float32, weight (V, C), tokens (...) long -> two
    float32 tensors shaped like tokens. The log-probs are `grpo.token_logprobs` of those logits to
    float rounding and carry gradients to hidden and weight; the entropies (nats) are detached."""
    chunk_rows = _checked("linear_token_logprobs", hidden, tokens, "tokens", chunk_rows)
    lp, ent = _LinearTokenLogprobs.apply(hidden.reshape(-1, hidden.size(-1)), weight, tokens.reshape(-1).long(),
                                         1.0 / temperature, chunk_rows)
    return lp.view(tokens.shape), ent.view(tokens.shape)
