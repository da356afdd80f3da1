"""Pieces every training loop here shares (`trainer.Trainer` puts them together): schedule, optimizer,
precision, NaN guard, metrics, RNG and out_dir's lock."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.optim.optimizer import _get_fused_kernels_supported_devices
from torch.nn.attention import SDPBackend, sdpa_kernel

from .config import bad_field
from .paths import JsonlAppender, read_jsonl, write_jsonl

log = logging.getLogger(__name__)

DTYPES = ("auto", "fp32", "bf16")


# -- learning-rate schedule -----------------------------------------------------------------

def cosine_lr(step: int, *, lr: float, min_lr: float, warmup_steps: int, max_steps: int) -> float:
    """Learning rate of the update with 0-based index `step`: linear warm-up from lr/warmup_steps to lr
    (update warmup_steps-1 is the first at the peak), then a half cosine down to min_lr, reached
    exactly at update max_steps-1 and held after it. A warm-up as long as the run ends at the peak:
    min_lr is never reached."""
    if step < 0:
        raise ValueError(f"cosine_lr: step is a 0-based update index, got {step}")
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    span = max_steps - 1 - warmup_steps
    progress = 1.0 if span <= 0 else min(1.0, (step - warmup_steps) / span)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


@dataclass(frozen=True)
class WarmupCosineSchedule:
    """Linear warm-up then cosine decay (`cosine_lr`), a pure function of the step; its state_dict
    records the settings, so a resume can tell when the schedule changed."""

    lr: float  # peak learning rate
    min_lr: float  # floor reached at the last step
    warmup_steps: int  # updates of linear warm-up
    max_steps: int  # total updates of the run

    def __post_init__(self):
        if not self.lr > 0:
            raise ValueError(f"WarmupCosineSchedule.lr must be > 0, got {self.lr!r}")
        if not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"WarmupCosineSchedule.min_lr must be in [0, lr], got {self.min_lr!r}")
        if self.warmup_steps < 0 or self.max_steps < 1:
            raise ValueError("WarmupCosineSchedule: warmup_steps must be >= 0 and max_steps >= 1")

    def __call__(self, step: int) -> float:
        return cosine_lr(step, lr=self.lr, min_lr=self.min_lr, warmup_steps=self.warmup_steps,
                         max_steps=self.max_steps)

    def apply(self, optimizer: torch.optim.Optimizer, step: int) -> float:
        """Set every param group's lr for update `step` (times the group's optional "lr_scale")."""
        lr = self(step)
        for group in optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        return lr

    def state_dict(self) -> dict:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict) -> None:
        """Check that a checkpoint's schedule matches this one; log what changed if it does not."""
        if changed := {k: (v, getattr(self, k)) for k, v in state.items() if getattr(self, k, v) != v}:
            log.warning("LR schedule changed since the checkpoint: %s",
                        ", ".join(f"{k} {a} -> {b}" for k, (a, b) in changed.items()))


# -- optimizer ------------------------------------------------------------------------------

def _fused_supported(device_type: str) -> bool:
    return device_type in _get_fused_kernels_supported_devices()


def decay_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW param groups as nanoGPT forms them: weight decay on the 2-D weights (matmuls,
    embeddings; a tied head once), none on biases and LayerNorm gains."""
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def build_adamw(model_or_groups, *, lr: float, weight_decay: float, betas: tuple[float, float] = (0.9, 0.95),
                eps: float = 1e-8, device_type: str = "cpu", fused: bool | None = None) -> torch.optim.AdamW:
    """AdamW with weight decay on 2-D weights only (decay_groups), using the fastest implementation
    available. model_or_groups: a module or param groups. fused: None = the fused kernel where
    `device_type` has one, else "foreach". A param group without its own "weight_decay" takes `weight_decay`."""
    groups = (decay_groups(model_or_groups, weight_decay) if isinstance(model_or_groups, torch.nn.Module)
              else list(model_or_groups))
    if bad := [g for g in groups if not (isinstance(g, dict) and "params" in g)]:  # a bare list of tensors: an IndexError
        raise ValueError(f"build_adamw: give a module or param groups (dicts with 'params'), got {type(bad[0]).__name__}")
    groups = [{"weight_decay": weight_decay, **g, "params": list(g["params"])} for g in groups]
    groups = [g for g in groups if len(g["params"]) > 0]
    use_fused = _fused_supported(device_type) if fused is None else fused
    kwargs = {"fused": True} if use_fused else {"foreach": True}
    optimizer = torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps, **kwargs)
    log.info("AdamW: %s, %d tensors with weight decay, %d without", "fused" if use_fused else "foreach",
             sum(len(g["params"]) for g in groups if g.get("weight_decay", 0) > 0),
             sum(len(g["params"]) for g in groups if g.get("weight_decay", 0) == 0))
    return optimizer


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> torch.Tensor:
    """Clip the global grad norm to max_norm (0 = measure only); returns the norm before clipping,
    as a tensor (no host sync), non-finite when any gradient is."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return torch.zeros(())
    limit = max_norm if max_norm > 0 else float("inf")
    return torch.nn.utils.clip_grad_norm_(params, limit, foreach=True)


# -- device and precision -------------------------------------------------------------------

DEVICE_TYPES = ("cpu", "cuda", "mps")  # where the loops run (torch.device also names meta, xla, ...: not here)


def check_device_name(cfg) -> None:
    """cfg.device must be "auto" or a torch device of DEVICE_TYPES (whether it is here is resolve_device's)."""
    if cfg.device != "auto":
        try:
            kind = torch.device(cfg.device).type
        except (RuntimeError, ValueError, TypeError):
            kind = None
        if kind not in DEVICE_TYPES:
            bad_field(type(cfg).__name__, "device", cfg.device, "must be 'auto' or a torch device such as 'cpu', "
                      "'cuda', 'cuda:1', 'mps'")


def resolve_device(device: str = "auto", source: str = "--device") -> torch.device:
    """"auto" -> cuda when available, else cpu; anything else is checked to exist (ValueError naming
    `source`, where the value came from)."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        dev = None
    if dev is None or dev.type not in DEVICE_TYPES:
        raise ValueError(f"device {device!r} ({source}): must be 'auto' or a torch device such as 'cpu', 'cuda', "
                         "'cuda:1', 'mps'")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} ({source}) requested but CUDA is not available (use 'cpu' or 'auto')")
    if dev.type == "cuda" and dev.index is not None and dev.index >= (n := torch.cuda.device_count()):
        raise ValueError(f"device {device!r} ({source}): torch sees {n} CUDA device(s) here, "
                         + (f"cuda:0..cuda:{n - 1}" if n > 1 else "cuda:0 only") + " (CUDA_VISIBLE_DEVICES may hide others)")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r} ({source}) requested but MPS is not available")
    return dev


@dataclass(frozen=True)
class Runtime:
    """Where and how a loop computes: device, autocast dtype, TF32 and determinism settings."""

    device: torch.device  # where the model and batches live
    amp_dtype: torch.dtype | None  # autocast dtype (torch.bfloat16) or None for plain fp32
    tf32: bool  # allow TF32 matmuls on CUDA (fp32 inputs, ~10-bit mantissa products)
    deterministic: bool  # deterministic algorithms (bit-identical reruns on CPU; best effort on CUDA)

    def autocast(self):
        """bf16 autocast around forward passes (weights and optimizer stay fp32), or a no-op."""
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def attention_backends(self, cudnn: bool = True):
        """On CUDA with cudnn=False: SDPA may pick flash, memory-efficient or math attention, not cuDNN's.
        cuDNN builds an execution plan for each new (batch, length) shape, which costs up to seconds a
        step while a GRPO run meets new shapes, and is faster once warm (docs/perf.md). Else a no-op."""
        if cudnn or self.device.type != "cuda":
            return contextlib.nullcontext()
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])

    def to_device(self, t: torch.Tensor) -> torch.Tensor:
        """Move a CPU batch to the device (pinned and non-blocking on CUDA)."""
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device)

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def backend_flags(self) -> Iterator[None]:
        """Set TF32 and determinism for the duration of a run, then restore the previous settings.

        Deterministic mode only warns about an op without a deterministic kernel (a long run goes
        on), turns cuDNN benchmark off and sets the cuBLAS workspace CUDA needs for reproducible matmuls.
        """
        saved = (torch.get_float32_matmul_precision(), torch.are_deterministic_algorithms_enabled(),
                 torch.is_deterministic_algorithms_warn_only_enabled(), torch.backends.cudnn.benchmark,
                 torch.backends.cudnn.deterministic)
        try:
            if self.device.type == "cuda":
                torch.set_float32_matmul_precision("high" if self.tf32 else "highest")
            if self.deterministic:
                os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
                torch.use_deterministic_algorithms(True, warn_only=True)
                torch.backends.cudnn.benchmark = False
                torch.backends.cudnn.deterministic = True
            yield
        finally:
            torch.set_float32_matmul_precision(saved[0])
            torch.use_deterministic_algorithms(saved[1], warn_only=saved[2])
            torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[3], saved[4]


def setup_runtime(device: str = "auto", dtype: str = "auto", *, tf32: bool = True,
                  deterministic: bool = False) -> Runtime:
    """Resolve a device and a precision. dtype "auto": bf16 autocast on a CUDA device with bf16, else
    fp32; "bf16": autocast wherever asked (slow on CPU; an error on a GPU without bf16); "fp32": none."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    dev = resolve_device(device)
    cuda_bf16 = dev.type == "cuda" and torch.cuda.is_bf16_supported()
    if dtype == "bf16" and dev.type == "cuda" and not cuda_bf16:
        raise ValueError(f"dtype 'bf16' requested but {torch.cuda.get_device_name(dev)} does not support bfloat16")
    use_bf16 = dtype == "bf16" or (dtype == "auto" and cuda_bf16)
    return Runtime(dev, torch.bfloat16 if use_bf16 else None, tf32, deterministic)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The original module behind a torch.compile wrapper (or the module itself): no "_orig_mod." keys."""
    return getattr(model, "_orig_mod", model)


# -- non-finite guard -----------------------------------------------------------------------

class NonFiniteGuard:
    """Decides whether an update may be applied, and counts the ones that were skipped.

    `observe(loss, grad_norm)` is True when every value is finite (apply the update), else False
    (skip it); after `max_in_a_row` skips in a row `tripped` is True and the loop should stop."""

    def __init__(self, max_in_a_row: int):
        assert max_in_a_row >= 1, max_in_a_row  # the configs validate max_nonfinite_in_a_row
        self.max_in_a_row = max_in_a_row
        self.in_a_row = 0  # consecutive skipped updates so far
        self.total = 0  # skipped updates over the whole run

    def observe(self, *values) -> bool:
        finite = all(math.isfinite(float(v)) for v in values)  # float(): one host sync per value
        if finite:
            self.in_a_row = 0
        else:
            self.in_a_row += 1
            self.total += 1
        return finite

    @property
    def tripped(self) -> bool:
        return self.in_a_row >= self.max_in_a_row

    def describe(self) -> str:
        return (f"{self.in_a_row} non-finite losses/gradient norms in a row (limit {self.max_in_a_row}), "
                f"{self.total} in total")

    def state_dict(self) -> dict:
        return {"in_a_row": self.in_a_row, "total": self.total}

    def load_state_dict(self, state: dict) -> None:
        self.in_a_row, self.total = int(state["in_a_row"]), int(state["total"])


# -- metrics as JSON lines ------------------------------------------------------------------

def to_jsonable(value: Any) -> Any:
    """Tensors and NumPy scalars to Python numbers; NaN and infinities to None (strict JSON)."""
    if isinstance(value, torch.Tensor):
        value = value.item() if value.numel() == 1 else value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


class MetricsLogger(JsonlAppender):
    """One JSON object per line, flushed as it is written (survives a kill); a context manager.

    Non-finite numbers are written as null so the file is strict JSON that pandas and jq read.
    `resume_step=s` first drops records with "step" > s (written after the checkpoint a run
    resumes from, and about to be redone) and any torn line (a kill or a power cut cut it off), each
    reported with a warning naming file:line and whether the checkpoint had covered it; with
    `every_step` (one record per step) records missing before step s are reported as lost too.
    """

    def __init__(self, path: str | os.PathLike, *, resume_step: int | None = None, fresh: bool = False,
                 every_step: bool = False):
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        if fresh:
            path.write_text("")
        elif resume_step is not None and path.exists():
            write_jsonl(path, _records_up_to(path, resume_step, every_step))
        elif resume_step and every_step:  # deleted (or never written): the checkpoint's steps have no records
            log.warning("%s: missing: the records of every step up to %d are lost, though the checkpoint at step %d "
                        "covers them", path, resume_step, resume_step)
        super().__init__(path)

    def log(self, record: dict) -> dict:
        """Append `record` and return it as written (plain numbers, None for non-finite ones)."""
        clean = to_jsonable(record)
        self.write(clean)
        return clean


_STEP_FIELD = re.compile(rb'^\{\s*"step"\s*:\s*(\d+)\s*[,}]')  # a record's first field, whole even in a torn line


def _records_up_to(path: Path, step: int, every_step: bool) -> list[dict]:
    """The records of a metrics file up to `step` (the checkpoint a run resumes from). Each line that
    does not parse is dropped with a warning naming file:line and saying whether its record is lost (at
    or before `step`: the resume will not redo it) or will be redone; with `every_step`, so are records
    missing before `step`."""
    kept, last, lost = [], None, set()
    for lineno, rec, reason in read_jsonl(path):
        if reason is None:
            at = rec.get("step", 0) if isinstance(rec, dict) else None
            # one record a step (metrics) or rows of a step (completions), in step order; anything else is no record
            if type(at) is not int or (last is not None and (at <= last if every_step else at < last)):
                log.warning("%s:%d: dropped: %s", path, lineno, "not a record with a whole-number step"
                            if type(at) is not int else
                            f"step {at} after the record of step {last} (the steps of this file only increase)")
                continue
            last = at
            if at <= step:
                kept.append(rec)
            continue
        raw = path.read_bytes().split(b"\n")[lineno - 1]  # rare: only a torn line is read twice
        torn = int(m.group(1)) if (m := _STEP_FIELD.match(raw)) else None
        log.warning("%s:%d: a torn line (cut off by a kill or a power cut) dropped; %s", path, lineno,
                    _torn_fate(torn, last, step))
        if torn is not None and torn <= step:
            lost.add(torn)
    if every_step:
        present = {r.get("step") for r in kept}
        missing = [s for s in range(1, step + 1) if s not in present and s not in lost]
        if missing:  # a line deleted in the middle as well as a lost tail (said again at each later resume)
            what = (f"every record up to step {step} is" if not kept else f"the record of step {missing[0]} is"
                    if len(missing) == 1 else f"the records of steps {_ranges(missing)} are")
            log.warning("%s: %s missing: lost, though the checkpoint at step %d covers %s", path, what, step,
                        "it" if kept and len(missing) == 1 else "them")
    return kept


def _ranges(steps: list[int]) -> str:
    """Sorted steps as ranges: [2, 3, 4, 7] -> "2 to 4, 7"."""
    runs: list[list[int]] = []
    for s in steps:
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ", ".join(f"{a} to {b}" if b > a else f"{a}" for a, b in runs)


def _torn_fate(torn: int | None, last: int | None, step: int) -> str:
    """What a torn line of step `torn` (None: unreadable) after the record of step `last` means for a
    run resuming from the checkpoint at `step`."""
    if torn is None:
        lost = last is None or last < step
        return (f"its step is unreadable (it came {'first' if last is None else f'after the record of step {last}'})"
                + (f"; a record up to step {step}, which the checkpoint covers, may be lost" if lost else ""))
    if torn <= step:
        return f"the record of step {torn} is lost (the checkpoint at step {step} covers it; the run resumes after it)"
    return f"step {torn}, after the checkpoint at step {step}, is redone"


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """Every complete record of a metrics file; a torn last line (killed mid-write) is ignored."""
    records = []
    for lineno, rec, reason in read_jsonl(path, torn_tail=True):
        if reason is not None:
            raise ValueError(f"{path}:{lineno}: {reason}")
        records.append(rec)
    return records


# -- random number generators ---------------------------------------------------------------

def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and every CUDA device)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds CUDA


def rng_state() -> dict:
    """The state of every global RNG a training step can draw from (dropout, shuffles, sampling)."""
    np_state = np.random.get_state(legacy=False)
    np_state["state"] = {"key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                         "pos": int(np_state["state"]["pos"])}  # tensors: loadable with weights_only=True
    state = {"python": random.getstate(), "numpy": np_state, "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what `rng_state` captured (CUDA states only where this machine has CUDA)."""
    version, internal, gauss = state["python"]  # a serialiser may have turned the tuple into a list
    random.setstate((version, tuple(internal), gauss))
    np_state = dict(state["numpy"])
    key = np.asarray(np_state["state"]["key"])  # the tensor rng_state saves, or a list
    np_state["state"] = {"key": key.astype(np.uint32), "pos": int(np_state["state"]["pos"])}
    np.random.set_state(np_state)
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        cuda, n = state["cuda"], torch.cuda.device_count()
        if len(cuda) != n:
            log.warning("checkpoint has CUDA RNG states for %d devices, this machine has %d; restoring the first %d",
                        len(cuda), n, min(len(cuda), n))
        for i, s in enumerate(cuda[:n]):
            torch.cuda.set_rng_state(s.cpu(), i)
