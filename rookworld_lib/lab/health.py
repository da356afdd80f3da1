"""Forward-pass health checks for a GPT: the numbers notebook 02 shows and asserts.

Each function returns plain data (dicts, lists, floats) so a notebook can tabulate and assert it,
and a test can check it against an independent computation.
"""

from __future__ import annotations

import contextlib
import math
from collections import defaultdict

import torch

from ..core.model import GPT, lm_loss
from .perf import tensor_bytes


def _group(name: str, depth: int) -> str:
    """A parameter's group: wte / wpe / ln_f, or its block cut to `depth` parts ("h.0" or "h.0.attn")."""
    parts = name.split(".")
    if parts[1] == "h":
        return ".".join(parts[1:2 + depth])
    return parts[1] if parts[0] == "transformer" else parts[0]


def params_by_module(model: GPT) -> dict[str, int]:
    """Parameter counts grouped as embeddings / each block's modules / final LayerNorm (named_parameters()
    yields a shared tensor once, so the head tied to wte is counted once)."""
    counts: dict[str, int] = defaultdict(int)
    for name, p in model.named_parameters():
        counts[_group(name, 2)] += p.numel()
    return dict(counts)


def init_stats(model: GPT) -> list[dict]:
    """Mean and std of every parameter tensor, with the std GPT-2's init prescribes."""
    n_layer = model.config.n_layer
    rows = []
    for name, p in model.named_parameters():
        # residual projections scaled by 1/sqrt(2 n_layer); biases zero and LayerNorm gains one: no spread
        expected = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") else 0.02 if p.dim() >= 2 else 0.0
        rows.append({"name": name, "shape": tuple(p.shape), "mean": p.mean().item(),
                     "std": p.std().item() if p.numel() > 1 else 0.0, "expected_std": expected})
    return rows


def logits_stats(logits: torch.Tensor) -> dict:
    """Range, mean, std (NaN where no value is finite: a diverged model) and the count of non-finite
    values of a logits tensor."""
    x = logits.detach().float()
    finite = torch.isfinite(x)
    v = x[finite] if finite.any() else torch.full((1,), math.nan)
    return {"min": v.min().item(), "max": v.max().item(), "mean": v.mean().item(),
            "std": v.std().item() if v.numel() > 1 else math.nan, "nonfinite": int((~finite).sum())}


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module):
    """Dropout off for a measurement (a GPT is built in train mode: dropout 0.1 moved logits before a changed
    token by 0.68, a false causality leak), the model's mode put back after."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


def init_loss(model: GPT, idx: torch.Tensor) -> dict:
    """Next-token loss on idx against ln(vocab), dropout off: a fresh model should be near-uniform."""
    with torch.no_grad(), _eval_mode(model):
        return {"loss": lm_loss(model(idx[:, :-1]), idx[:, 1:]).item(), "uniform": math.log(model.config.vocab_size)}


def grad_norms_by_layer(model: GPT, idx: torch.Tensor) -> dict[str, float]:
    """L2 norm of the loss gradient per top-level group (embeddings, each block, ln_f)."""
    model.zero_grad(set_to_none=True)
    lm_loss(model(idx[:, :-1]), idx[:, 1:]).backward()
    sq: dict[str, float] = defaultdict(float)
    for name, p in model.named_parameters():
        if p.grad is not None:
            sq[_group(name, 1)] += p.grad.float().pow(2).sum().item()
    model.zero_grad(set_to_none=True)
    return {k: math.sqrt(v) for k, v in sq.items()}


def causality_violation(model: GPT, idx: torch.Tensor, position: int) -> dict:
    """Change the token at `position`; report how much logits before and at/after it moved (dropout off)."""
    changed = idx.clone()
    changed[:, position] = (changed[:, position] + 1) % model.config.vocab_size
    with torch.no_grad(), _eval_mode(model):
        a, b = model(idx), model(changed)
    return {"max_change_before": (a[:, :position] - b[:, :position]).abs().max().item() if position else 0.0,
            "max_change_after": (a[:, position:] - b[:, position:]).abs().max().item()}


def state_bytes(model: torch.nn.Module, optimizer) -> dict[str, int]:
    """Bytes held on the model's device by parameters (a tied one once), gradients and the optimizer's
    per-parameter state (AdamW's moments; not its scalar step counts)."""
    device = next(model.parameters()).device
    states = getattr(optimizer, "inner", optimizer).state.values()  # tuning's CPUOffloadAdamW keeps them on the CPU
    return {"params": tensor_bytes(model.parameters()),
            "grads": tensor_bytes([p.grad for p in model.parameters() if p.grad is not None]),
            "optimizer_state": tensor_bytes([v for s in states for v in s.values()
                                             if torch.is_tensor(v) and v.dim() > 0 and v.device == device])}


def memory_by_phase(model: GPT, idx: torch.Tensor, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes held after each phase of one training step, by exact accounting of tensors: params
    (unique), batch (inputs and targets), activations (unique storages autograd saved in the forward
    pass), grads, optimizer_state (after its first step: AdamW's two moments); on CUDA also the
    allocator's own memory_allocated after each phase, as `cuda_after_*`."""
    out = {"batch": tensor_bytes([idx]) * 2}

    def allocated(phase: str) -> None:
        if idx.device.type == "cuda":
            torch.cuda.synchronize()
            out[f"cuda_after_{phase}"] = torch.cuda.memory_allocated()

    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return t

    allocated("batch")
    optimizer.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = lm_loss(model(idx[:, :-1]), idx[:, 1:])
    param_ptrs = {p.untyped_storage().data_ptr() for p in model.parameters()}
    out["activations"] = sum(n for ptr, n in saved.items() if ptr not in param_ptrs)
    allocated("forward")
    loss.backward()
    allocated("backward")
    optimizer.step()
    held = state_bytes(model, optimizer)  # before zero_grad: the gradients are still there
    allocated("step")
    optimizer.zero_grad(set_to_none=True)
    return {"params": held["params"], **out, "grads": held["grads"], "optimizer_state": held["optimizer_state"]}
