"""The training step: one optimizer step of next-token training. SFT trains with it; the lab's
tuning matrix and `rookworld bench` time it, so a speed figure is the speed of training."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from .model import lm_loss
from .train_utils import Runtime, clip_grad_norm

LOSS_IMPLS = ("auto", "fused", "plain")
PHASE_PREFIX = "phase:"


def phase(name: str):
    """Mark a region (e.g. phase("forward")) so lab.perf.profile_phases can attribute time and memory to it."""
    return torch.profiler.record_function(PHASE_PREFIX + name)


def resolve_loss_impl(impl: str, device: torch.device) -> str:
    """"auto" -> the fused chunked LM head + loss on CPU (no logits written), the plain one on CUDA
    (cuBLAS wins there; docs/perf.md has both measured)."""
    if impl == "auto":
        return "plain" if device.type == "cuda" else "fused"
    return impl


def batch_loss(model, x: torch.Tensor, y: torch.Tensor, impl: str = "fused") -> torch.Tensor:
    """Mean next-token loss of a batch: "plain" forms the logits, then cross-entropy; "fused" asks
    the model for the loss (lm_head_loss, logits never stored). Called through any wrapper."""
    if impl == "plain":
        return lm_loss(model(x), y)
    return model(x, targets=y)


class TrainStep:
    """One optimizer step of next-token training, its phases marked for `lab.perf.profile_phases`.

    Calling it, `ts(x, y)`, runs forward and backward on `grad_accum` micro-batches (losses scaled by
    1/grad_accum: the full batch's mean gradient), clips, steps, zeroes the gradients and returns the
    mean loss, detached, without a device sync. A loop that decides between micro-batches (SFT: its
    data stream, DDP's no_sync, the non-finite guard) calls the pieces: `accumulate`, `clip`, `update`.
    """

    def __init__(self, model: torch.nn.Module, optimizer, runtime: Runtime, *, grad_accum: int = 1,
                 grad_clip: float = 1.0, loss_impl: str = "auto", forward_model: torch.nn.Module | None = None,
                 ddp=None):
        self.model = model  # holds the parameters the optimizer and clipping see
        # what the loss runs through (torch.compile / DDP wrapper). Not `forward_model or model`:
        # a compiled module proxies len() to the wrapped one, so its truth value raises TypeError.
        self.forward_model = model if forward_model is None else forward_model
        self.optimizer = optimizer
        self.runtime = runtime
        self.grad_accum = grad_accum
        self.grad_clip = grad_clip
        self.loss_impl = resolve_loss_impl(loss_impl, self.runtime.device)
        self.ddp = ddp  # a DistributedDataParallel wrapper: gradients all-reduce on the last micro-batch only

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The batch's mean loss under the runtime's autocast (also SFT's val loss, under no_grad)."""
        with phase("forward"), self.runtime.autocast():
            return batch_loss(self.forward_model, x, y, impl=self.loss_impl)

    def accumulate(self, x: torch.Tensor, y: torch.Tensor, sync: bool = True) -> torch.Tensor:
        """Forward and backward of one micro-batch; returns its loss / grad_accum, detached.
        sync=False skips DDP's all-reduce (every micro-batch but the last)."""
        with nullcontext() if sync or self.ddp is None else self.ddp.no_sync():
            loss = self.loss(x, y) / self.grad_accum
            with phase("backward"):
                loss.backward()
        return loss.detach()

    def clip(self) -> torch.Tensor:
        """Clip the global grad norm to grad_clip (0: measure only); the norm before, as a tensor."""
        return clip_grad_norm(self.model, self.grad_clip)

    def update(self, apply: bool = True) -> None:
        """The optimizer step (skipped when not `apply`, e.g. a non-finite loss), then zero_grad."""
        if apply:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        total = torch.zeros((), device=x.device)
        chunks = list(zip(x.chunk(self.grad_accum), y.chunk(self.grad_accum)))
        for i, (xm, ym) in enumerate(chunks):
            total += self.accumulate(xm, ym, sync=i == len(chunks) - 1).float()
        with phase("optimizer"):
            self.clip()
            self.update()
        return total
