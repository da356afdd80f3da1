"""The LM head and next-token cross-entropy fused, chunk by chunk over the rows.

For a GPT-2-sized vocabulary the head and the loss dominate a small model's training step: the
(rows, 50257) logits are written, read by log-softmax, and read and written again by its backward.
Here each chunk of rows is taken through logits -> loss -> gradient of the logits in the forward
pass, and that gradient is turned at once into the gradients of the hidden states and of the
head weight. The full logits never exist, and the backward pass only scales the stored gradients.

The math is unchanged (mean cross-entropy over the targets that are not `ignore_index`, the same
as `F.cross_entropy(hidden @ weight.T, targets)`); only the float summation order differs.
Gradients are computed in the forward pass, so this is for training and evaluation losses, not for
double backward.
"""

from __future__ import annotations

import torch

# Rows per chunk: about 100 MB of float32 logits for the GPT-2 vocabulary. It bounds the transient
# memory; on a 2-core CPU 160 and 512 rows ran alike, 64 was slower (more, thinner matmuls).
DEFAULT_CHUNK_ROWS = 512


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, ignore_index, chunk_rows, grad_enabled):
        # hidden (M, C), weight (V, C), targets (M,); grad_enabled: the caller's grad mode (forward
        # itself always runs with grad off, and needs_input_grad ignores torch.no_grad)
        n_valid = (targets != ignore_index).sum()
        denom = n_valid.clamp(min=1).to(torch.float32)
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        need_grad = grad_enabled and (ctx.needs_input_grad[0] or ctx.needs_input_grad[1])
        grad_hidden = torch.zeros_like(hidden, dtype=torch.float32) if need_grad else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if need_grad else None
        for start in range(0, hidden.size(0), chunk_rows):
            h = hidden[start:start + chunk_rows]
            t = targets[start:start + chunk_rows]
            logits = (h @ weight.t()).float()  # autocast may run this matmul in bf16
            keep = t != ignore_index
            safe_t = torch.where(keep, t, torch.zeros_like(t))
            lse = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(1, safe_t[:, None])[:, 0]
            loss += torch.where(keep, lse - picked, torch.zeros_like(lse)).sum()
            if need_grad:
                # d(loss)/d(logits) = (softmax - onehot) / n_valid on kept rows, 0 on ignored ones
                g = logits.sub_(lse[:, None]).exp_()
                g.scatter_add_(1, safe_t[:, None], -torch.ones_like(lse)[:, None])
                g.mul_((keep.to(g.dtype) / denom)[:, None])
                if h.dtype == weight.dtype == torch.float32 and not torch.is_autocast_enabled(h.device.type):
                    # in place: no (V, C) temporary per chunk
                    torch.mm(g, weight, out=grad_hidden[start:start + chunk_rows])
                    grad_weight.addmm_(g.t(), h)
                else:  # mixed precision: the matmuls in the autocast/input dtype, sums in float32
                    grad_hidden[start:start + chunk_rows] = (g.to(weight.dtype) @ weight).float()
                    grad_weight += (g.t().to(h.dtype) @ h).float()
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.input_dtypes = (hidden.dtype, weight.dtype)
        # an all-ignored batch gives nan, as F.cross_entropy does
        return torch.where(n_valid > 0, loss / denom, torch.full_like(loss, float("nan")))

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        h_dtype, w_dtype = ctx.input_dtypes
        gh = (grad_hidden * grad_loss).to(h_dtype) if ctx.needs_input_grad[0] else None
        gw = (grad_weight * grad_loss).to(w_dtype) if ctx.needs_input_grad[1] else None
        return gh, gw, None, None, None, None


# torch.compile leaves this function to eager mode: the chunk loop and the in-place accumulation
# are already what a compiler would produce, and a graph break here is cheaper than a retrace.
@torch.compiler.disable
def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         ignore_index: int = -1, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> torch.Tensor:
    """Mean cross-entropy of softmax(hidden @ weight.T) at targets, without materialising the logits.

    hidden (..., C), weight (V, C), targets (...) long; positions whose target is ignore_index do
    not count. Equal to `F.cross_entropy((hidden @ weight.T).reshape(-1, V), targets.reshape(-1))`.
    """
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"linear_cross_entropy: hidden {tuple(hidden.shape)} and targets "
                         f"{tuple(targets.shape)} disagree")
    if chunk_rows < 1:
        raise ValueError(f"linear_cross_entropy: chunk_rows must be >= 1, got {chunk_rows}")
    return _LinearCrossEntropy.apply(hidden.reshape(-1, hidden.size(-1)), weight, targets.reshape(-1),
                                     ignore_index, chunk_rows, torch.is_grad_enabled())
