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

import threading

import torch

# Rows per chunk on a CPU. The chunk's logits go to one reused buffer (_logits_buffer), so its size
# no longer costs page faults per chunk; 256 rows ran 4-7% faster than 128 (docs/perf.md).
CPU_CHUNK_ROWS = 256
# On an accelerator there are no page faults (caching allocator) and bigger matmuls are better;
# 2048 rows of float32 GPT-2 logits are 412 MB.
DEVICE_CHUNK_ROWS = 2048


_CPU_WORKSPACE = threading.local()  # .logits: this thread's CPU logits buffer, reused across chunks and calls


def _logits_buffer(weight: torch.Tensor, rows: int) -> torch.Tensor | None:
    """A (V, rows) float32 buffer for one chunk's logits on the CPU, reused: a fresh 25 MB block
    costs its page faults on every chunk (the (V, C) @ (C, 128) matmul ran 15.7 ms into a new
    block, 11.5 ms into a reused one). None elsewhere: the caching allocator already reuses."""
    if weight.device.type != "cpu":
        return None
    need = weight.size(0) * rows
    buf = getattr(_CPU_WORKSPACE, "logits", None)
    if buf is None or buf.numel() < need:
        buf = _CPU_WORKSPACE.logits = torch.empty(need, dtype=torch.float32)  # 51 MB at 256 rows
    return buf[:need].view(weight.size(0), rows)


def default_chunk_rows(device: torch.device) -> int:
    """Rows per chunk on `device` (see CPU_CHUNK_ROWS and DEVICE_CHUNK_ROWS)."""
    return CPU_CHUNK_ROWS if device.type == "cpu" else DEVICE_CHUNK_ROWS


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
            if plain_fp32 and (buf := _logits_buffer(weight, h.size(0))) is not None:
                logits = torch.mm(weight, h.t(), out=buf)  # (V, rows)
            else:
                logits = (weight @ h.t()).float()  # autocast may run this matmul in bf16
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


# torch.compile leaves this function to eager mode: the chunk loop and the in-place accumulation
# are already what a compiler would produce, and a graph break here is cheaper than a retrace.
@torch.compiler.disable
def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         ignore_index: int = -1, chunk_rows: int | None = None) -> torch.Tensor:
    """Mean cross-entropy of softmax(hidden @ weight.T) at targets, without materialising the logits.

    hidden (..., C), weight (V, C), targets (...) long; positions whose target is ignore_index do
    not count. Equal to `F.cross_entropy((hidden @ weight.T).reshape(-1, V), targets.reshape(-1))`.
    chunk_rows (rows of logits alive at once) defaults to `default_chunk_rows(hidden.device)`.
    """
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"linear_cross_entropy: hidden {tuple(hidden.shape)} and targets "
                         f"{tuple(targets.shape)} disagree")
    if chunk_rows is None:
        chunk_rows = default_chunk_rows(hidden.device)
    if chunk_rows < 1:
        raise ValueError(f"linear_cross_entropy: chunk_rows must be >= 1, got {chunk_rows}")
    return _LinearCrossEntropy.apply(hidden.reshape(-1, hidden.size(-1)), weight, targets.reshape(-1),
                                     ignore_index, chunk_rows, torch.is_grad_enabled())
