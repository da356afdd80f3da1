"""The tuning matrix: controlled training-speed experiments, one variable at a time.

A baseline `TuneConfig` is trained for a few optimizer steps from a fixed initialisation on fixed
batches; every other row changes exactly one setting (precision, torch.compile mode, batch size,
sequence length, attention kernel, AdamW implementation, vocabulary padding, activation
checkpointing, gradient accumulation, optimizer offload) and is trained the same way. Each row
records tokens/s, step time (median with p10/p90), MFU against the data-sheet and the measured
peak, peak memory, memory by phase, and the loss after the last step. A row whose final loss is
more than `tolerance` (0.05) from the baseline's is marked `changes_result`: a speed-up that
changes the answer is not a speed-up. Rows whose setting does not exist on the device are kept as
`skipped` with the reason; a row that crashes is kept as `failed` with the error.

The training step (`TrainStep`: forward, backward with accumulation, optimizer step, each marked
as a profiler phase) is deliberately plain so the SFT loop can reuse it, or hand `run_config` its
own step object with the same three methods.
"""

from __future__ import annotations

import math
import shutil
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from . import perf
from .model import GPT, GPTConfig, PRESETS, lm_loss

COMPILE_MODES = ("off", "default", "max-autotune")
OPTIMIZERS = ("foreach", "fused")
TUNE_PRECISIONS = ("fp32", "tf32", "bf16")
LOSS_IMPLS = ("plain", "fused")
PARITY_TOLERANCE = 0.05


@dataclass(frozen=True)
class TuneConfig:
    """One training setup of the tuning matrix (the baseline, or the baseline with one change)."""

    model: str = "tiny"  # GPTConfig preset name (tiny, cpu-small, cpu-medium, gpt2, ...)
    batch_size: int = 4  # sequences per optimizer step, all micro-batches together
    seq_len: int = 64  # tokens per sequence
    precision: str = "fp32"  # fp32, tf32 (CUDA matmuls on tensor cores) or bf16 (autocast)
    compile: str = "off"  # torch.compile mode: off, default or max-autotune
    attn_impl: str = "sdpa"  # sdpa (F.scaled_dot_product_attention) or math (explicit softmax(QK^T)V)
    optimizer: str = "foreach"  # AdamW implementation: foreach (multi-tensor) or fused (single kernel)
    pad_vocab_to_multiple: int = 1  # 1 keeps 50257 rows; 64 pads the embedding/head to 50304
    gradient_checkpointing: bool = False  # recompute block activations in backward
    grad_accum: int = 1  # micro-batches per optimizer step (batch_size is split between them)
    offload_optimizer: bool = False  # keep AdamW state and master weights in CPU memory
    loss_impl: str = "plain"  # LM head + loss: plain (logits, then F.cross_entropy) or fused (lm_head_loss, chunked)
    lr: float = 1e-3  # AdamW learning rate (constant)
    weight_decay: float = 0.1  # AdamW weight decay on 2-D weights
    steps: int = 6  # optimizer steps per row; the loss after the last one is the parity check
    timed_from: int = 2  # steps before this index are warm-up (compile, allocator) and not timed
    n_batches: int = 2  # distinct random batches, cycled; few, so the loss moves measurably
    seed: int = 0  # initialisation and data seed
    device: str = "auto"  # auto (cuda if available), cpu, cuda, cuda:1, ...

    def __post_init__(self):
        if self.model not in PRESETS:
            raise ValueError(f"TuneConfig.model must be one of {sorted(PRESETS)}, got {self.model!r}")
        for name in ("batch_size", "seq_len", "pad_vocab_to_multiple", "grad_accum", "steps", "n_batches"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"TuneConfig.{name} must be a positive integer, got {v!r}")
        if self.precision not in TUNE_PRECISIONS:
            raise ValueError(f"TuneConfig.precision must be one of {TUNE_PRECISIONS}, got {self.precision!r}")
        if self.compile not in COMPILE_MODES:
            raise ValueError(f"TuneConfig.compile must be one of {COMPILE_MODES}, got {self.compile!r}")
        if self.attn_impl not in ("sdpa", "math"):
            raise ValueError(f"TuneConfig.attn_impl must be 'sdpa' or 'math', got {self.attn_impl!r}")
        if self.loss_impl not in LOSS_IMPLS:
            raise ValueError(f"TuneConfig.loss_impl must be one of {LOSS_IMPLS}, got {self.loss_impl!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"TuneConfig.optimizer must be one of {OPTIMIZERS}, got {self.optimizer!r}")
        if not isinstance(self.timed_from, int) or not 0 <= self.timed_from < self.steps:
            raise ValueError(f"TuneConfig.timed_from must be an integer in [0, steps={self.steps}), got {self.timed_from!r}")
        if not (isinstance(self.lr, (int, float)) and self.lr > 0):
            raise ValueError(f"TuneConfig.lr must be > 0, got {self.lr!r}")
        if not (isinstance(self.weight_decay, (int, float)) and self.weight_decay >= 0):
            raise ValueError(f"TuneConfig.weight_decay must be >= 0, got {self.weight_decay!r}")

    def model_config(self) -> GPTConfig:
        return GPTConfig.preset(self.model, attn_impl=self.attn_impl, pad_vocab_to_multiple=self.pad_vocab_to_multiple,
                                gradient_checkpointing=self.gradient_checkpointing, dropout=0.0)

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len


@dataclass(frozen=True)
class Variant:
    """A row of the matrix: the baseline with `overrides` applied."""

    name: str  # row label, e.g. "attn_impl=math"
    variable: str  # the setting varied ("baseline" for the baseline row)
    overrides: dict = field(default_factory=dict)  # TuneConfig fields changed
    expect_parity: bool = True  # False where the row trains on different data (batch size, seq len)
    skip_reason: str | None = None  # set to report the row as skipped without running it


# ---------------------------------------------------------------------------------------------
# What the device supports
# ---------------------------------------------------------------------------------------------


def cpu_has_native_bf16() -> bool:
    cap = str(getattr(torch.backends.cpu, "get_cpu_capability", lambda: "")()).upper()
    return "AMX" in cap or "BF16" in cap


def unsupported_reason(cfg: TuneConfig, device: torch.device) -> str | None:
    """Why this configuration cannot run (meaningfully) on `device`, or None if it can."""
    mc = cfg.model_config()
    if cfg.seq_len > mc.block_size:
        return f"seq_len {cfg.seq_len} exceeds the {cfg.model} model's block_size {mc.block_size}"
    if cfg.batch_size % cfg.grad_accum:
        return f"batch_size {cfg.batch_size} is not divisible into {cfg.grad_accum} equal micro-batches"
    if cfg.precision == "tf32":
        if device.type != "cuda":
            return "TF32 is an NVIDIA tensor-core format (Ampere or newer); there is no CPU equivalent"
        if torch.cuda.get_device_capability(device)[0] < 8:
            return f"TF32 needs compute capability 8.0+, {perf.device_name(device)} has less"
    if cfg.precision == "bf16":
        if device.type == "cuda" and not torch.cuda.is_bf16_supported():
            return f"{perf.device_name(device)} does not support bf16"
        if device.type == "cpu" and not cpu_has_native_bf16():
            cap = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "unknown")()
            return (f"this CPU ({cap}) has no native bf16 matmul (no AVX512-BF16/AMX); autocast would emulate it "
                    f"in software, many times slower than fp32")
    if cfg.compile != "off":
        if device.type == "cuda":
            try:
                import triton  # noqa: F401
            except ImportError:
                return "torch.compile on CUDA needs triton, which is not installed"
        elif not (shutil.which("g++") or shutil.which("c++") or shutil.which("clang++")):
            return "torch.compile on CPU needs a C++ compiler (g++/clang++), none found"
    if cfg.offload_optimizer and device.type == "cpu":
        return "the model already lives in CPU memory; optimizer offload applies to accelerator runs"
    return None


# ---------------------------------------------------------------------------------------------
# Optimizers and the training step
# ---------------------------------------------------------------------------------------------


class CPUOffloadAdamW:
    """AdamW whose state and fp32 master weights live in CPU memory (ZeRO-Offload style, one device).

    After backward, gradients are copied to (pinned) CPU buffers, a CPU AdamW updates the master
    weights, and the result is copied back into the model's parameters. Accelerator memory then
    holds only weights and gradients: the two AdamW moments (8 bytes/param) stay in host RAM, at
    the cost of two PCIe transfers per step.
    """

    def __init__(self, param_groups: list[dict], lr: float, betas=(0.9, 0.95), eps: float = 1e-8):
        self.device_params: list[torch.nn.Parameter] = []
        cpu_groups = []
        pin = torch.cuda.is_available()
        for g in param_groups:
            masters = []
            for p in g["params"]:
                m = torch.empty(p.shape, dtype=torch.float32, device="cpu", pin_memory=pin)
                m.copy_(p.detach())
                m.requires_grad_(True)
                m.grad = torch.zeros_like(m, pin_memory=pin) if pin else torch.zeros_like(m)
                self.device_params.append(p)
                masters.append(m)
            cpu_groups.append({**{k: v for k, v in g.items() if k != "params"}, "params": masters})
        self.masters = [m for g in cpu_groups for m in g["params"]]
        self.inner = torch.optim.AdamW(cpu_groups, lr=lr, betas=betas, eps=eps, foreach=True)
        self.param_groups = self.inner.param_groups

    @torch.no_grad()
    def step(self):
        for p, m in zip(self.device_params, self.masters):
            if p.grad is None:
                m.grad.zero_()
            else:
                m.grad.copy_(p.grad, non_blocking=True)
        perf.synchronize(self.device_params[0].device if self.device_params else None)
        self.inner.step()
        for p, m in zip(self.device_params, self.masters):
            p.copy_(m, non_blocking=True)

    def zero_grad(self, set_to_none: bool = True):
        for p in self.device_params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def state_dict(self):
        return self.inner.state_dict()


def make_optimizer(model: GPT, cfg: TuneConfig):
    """AdamW (betas 0.9/0.95, GPT-2 style decay groups) in the implementation `cfg` asks for."""
    groups = model.param_groups(cfg.weight_decay)
    if cfg.offload_optimizer:
        return CPUOffloadAdamW(groups, lr=cfg.lr)
    kind = {"fused": {"fused": True}, "foreach": {"foreach": True}}[cfg.optimizer]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8, **kind)


class TrainStep:
    """One optimizer step of next-token training, split into three marked phases.

    step(x, y) with x, y of shape (batch, seq_len) runs forward + backward for each of `grad_accum`
    micro-batches (losses scaled by 1/grad_accum so the gradient is the full batch's mean), then
    the optimizer step, and returns the batch's mean loss as a detached tensor (no device sync).
    Phases are marked with perf.phase("forward" | "backward" | "optimizer") for profile_phases.
    """

    def __init__(self, model: torch.nn.Module, optimizer, precision: str = "fp32", grad_accum: int = 1,
                 forward_model: torch.nn.Module | None = None, loss_impl: str = "plain"):
        self.model = model
        self.loss_impl = loss_impl
        # e.g. torch.compile(model). Not `forward_model or model`: a compiled module proxies len()
        # to the wrapped one, so its truth value raises TypeError.
        self.forward_model = model if forward_model is None else forward_model
        self.optimizer = optimizer
        self.precision = precision
        self.grad_accum = grad_accum
        self.device = next(model.parameters()).device

    def autocast(self):
        if self.precision in ("bf16", "fp16"):
            return torch.autocast(self.device.type, dtype=perf.precision_dtype(self.precision))
        return nullcontext()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with perf.phase("forward"), self.autocast():
            if self.loss_impl == "fused":
                return self.forward_model(x, targets=y)
            return lm_loss(self.forward_model(x), y)

    def backward(self, loss: torch.Tensor) -> None:
        with perf.phase("backward"):
            (loss / self.grad_accum).backward()

    def optimizer_step(self) -> None:
        with perf.phase("optimizer"):
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        total = torch.zeros((), device=x.device)
        for xm, ym in zip(x.chunk(self.grad_accum), y.chunk(self.grad_accum)):
            loss = self.forward(xm, ym)
            self.backward(loss)
            total += loss.detach().float()
        self.optimizer_step()
        return total / self.grad_accum


# ---------------------------------------------------------------------------------------------
# Data and initialisation shared by every row
# ---------------------------------------------------------------------------------------------


def random_batches(n: int, batch_size: int, seq_len: int, vocab_size: int = 50257, seed: int = 0) -> list[tuple]:
    """n (x, y) pairs of uniformly random tokens, y = x shifted by one."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        t = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=g)
        out.append((t[:, :-1].contiguous(), t[:, 1:].contiguous()))
    return out


def batches_from_tokens(tokens: torch.Tensor, n: int, batch_size: int, seq_len: int) -> list[tuple]:
    """n (x, y) pairs cut consecutively from a 1-D token stream (e.g. shipped training text)."""
    need = n * batch_size * (seq_len + 1)
    if tokens.numel() < need:
        raise ValueError(f"token stream has {tokens.numel()} tokens, {need} needed for {n} batches of "
                         f"{batch_size} x {seq_len + 1}")
    t = tokens[:need].view(n, batch_size, seq_len + 1)
    return [(t[i, :, :-1].contiguous(), t[i, :, 1:].contiguous()) for i in range(n)]


def initial_state(cfg: TuneConfig) -> dict[str, torch.Tensor]:
    """The baseline model's initial weights (seeded); every row starts from these."""
    torch.manual_seed(cfg.seed)
    model = GPT(GPTConfig.preset(cfg.model, dropout=0.0))
    return {k: v.detach().clone() for k, v in model.named_parameters()}


@torch.no_grad()
def load_initial_state(model: GPT, state: dict[str, torch.Tensor]) -> None:
    """Copy `state` into model; a vocabulary padded beyond the state's rows gets zero rows.

    Padding rows are never looked up (token ids < 50257) and their logits are sliced off, so they
    receive no gradient and stay zero: a padded model computes exactly what the unpadded one does.
    """
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(state))
    if missing:
        raise KeyError(f"initial state lacks {missing[:3]}...")
    for name, p in params.items():
        src = state[name]
        if p.shape == src.shape:
            p.copy_(src)
        elif p.dim() == 2 and p.shape[1] == src.shape[1] and p.shape[0] >= src.shape[0]:
            p.zero_()
            p[: src.shape[0]].copy_(src)
        else:
            raise ValueError(f"cannot map initial weights {name} {tuple(src.shape)} onto {tuple(p.shape)}")


def state_bytes(model: torch.nn.Module, optimizer) -> dict[str, float]:
    """MB held by parameters, gradients and optimizer state on the model's device."""
    device = next(model.parameters()).device
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    opt = 0
    inner = getattr(optimizer, "inner", optimizer)
    for st in inner.state.values():
        for v in st.values():
            if torch.is_tensor(v) and v.device == device:
                opt += v.numel() * v.element_size()
    return {"params_mb": params / 2**20, "grads_mb": grads / 2**20, "optimizer_mb": opt / 2**20}


# ---------------------------------------------------------------------------------------------
# Running one row and the matrix
# ---------------------------------------------------------------------------------------------


def _peak_for(peaks: dict, device: torch.device, precision: str, measure: bool) -> perf.Peak:
    if precision not in peaks:
        peaks[precision] = perf.get_peak(device, precision, measure=measure)
    return peaks[precision]


def checked_mfu(flops: float, seconds: float, peaks: dict, device: torch.device, precision: str,
                measure: bool = True) -> perf.MFU:
    """perf.mfu against the cached peak; above 100% of the *measured* peak, measure once more.

    On a shared machine the first peak measurement can land in a busy moment and come out low. A
    peak is the best rate the hardware shows, so the re-measurement keeps the larger value. If
    the MFU still exceeds 100% the error stands: then the FLOPs or the timing are wrong.
    """
    peak = _peak_for(peaks, device, precision, measure)
    try:
        return perf.mfu(flops, seconds, peak)
    except perf.MFUError:
        if not measure or peak.measured_tflops is None:
            raise
        again = perf.measure_peak_tflops(device, precision, repeats=10)
        peaks[precision] = replace(peak, measured_tflops=max(again, peak.measured_tflops))
        return perf.mfu(flops, seconds, peaks[precision])


def run_config(cfg: TuneConfig, *, init_state: dict | None = None, batches: list | None = None,
               peaks: dict | None = None, measure_peak: bool = True, profile_memory: bool = True,
               trace_path: str | Path | None = None, name: str = "config", variable: str = "baseline",
               expect_parity: bool = True) -> dict:
    """Train `cfg` for cfg.steps steps and measure it; returns one row (a plain dict).

    Unsupported settings give status "skipped" with the reason. After the timed steps, one extra
    step runs under the profiler (if profile_memory) for memory by phase and the top operators; it
    comes after the final loss is recorded, so it never affects parity.
    """
    device = perf.resolve_device(cfg.device)
    row = {"name": name, "variable": variable, "value": _value_of(cfg, variable), "config": asdict(cfg),
           "expect_parity": expect_parity, "status": "ok", "reason": None}
    reason = unsupported_reason(cfg, device)
    if reason:
        return {**row, "status": "skipped", "reason": reason}
    peaks = {} if peaks is None else peaks
    try:
        init_state = init_state or initial_state(cfg)
        batches = batches or random_batches(cfg.n_batches, cfg.batch_size, cfg.seq_len, seed=cfg.seed)
        batches = [(x.to(device), y.to(device)) for x, y in batches]
        mc = cfg.model_config()
        model = GPT(mc)
        load_initial_state(model, init_state)
        model.to(device).train()
        optimizer = make_optimizer(model, cfg)
        fwd_model = model if cfg.compile == "off" else torch.compile(
            model, mode=None if cfg.compile == "default" else cfg.compile)
        step = TrainStep(model, optimizer, cfg.precision, cfg.grad_accum, forward_model=fwd_model,
                         loss_impl=cfg.loss_impl)
        tf32 = perf.tf32_matmuls(cfg.precision == "tf32") if device.type == "cuda" else nullcontext()
        losses, times = [], []
        perf.reset_max_memory(device)
        with tf32:
            for i in range(cfg.steps):
                x, y = batches[i % len(batches)]
                perf.synchronize(device)
                t0 = time.perf_counter()
                losses.append(step(x, y))
                perf.synchronize(device)
                times.append(time.perf_counter() - t0)
            losses = [float(v) for v in losses]
            cuda_peak = perf.max_memory_mb(device)
            static = state_bytes(model, optimizer)
            prof = None
            if profile_memory:
                x, y = batches[cfg.steps % len(batches)]
                prof = perf.profile_phases(lambda: step(x, y), steps=1, trace_path=trace_path, device=device)
    except Exception as exc:  # a crash is a result too: report it, never drop the row
        return {**row, "status": "failed", "reason": f"{type(exc).__name__}: {exc}"}

    timing = perf.summarize_times(times[cfg.timed_from:])
    tokens = cfg.tokens_per_step
    flops = perf.flops_per_token(mc, cfg.seq_len, "train") * tokens
    util = checked_mfu(flops, timing.median_s, peaks, device, cfg.precision, measure_peak)
    peak = util.peak
    if not all(math.isfinite(v) for v in losses):
        row["status"], row["reason"] = "failed", f"non-finite loss {losses}"
    mem_phases = prof.memory_by_phase if prof else []
    if cuda_peak is not None:
        peak_mem = cuda_peak
    elif mem_phases:  # CPU: state live at the step's start + the step's own peak (torch allocator view)
        peak_mem = static["params_mb"] + static["optimizer_mb"] + max(m["peak_mb"] for m in mem_phases)
    else:
        peak_mem = None
    row.update({
        "step_time_s": timing.median_s, "step_time_p10_s": timing.p10_s, "step_time_p90_s": timing.p90_s,
        "step_times_s": times, "tokens_per_step": tokens, "tokens_per_s": tokens / timing.median_s,
        "flops_per_step": flops, "achieved_tflops": util.achieved_tflops,
        "mfu_table": util.vs_table, "mfu_measured": util.vs_measured,
        "peak_table_tflops": peak.table_tflops, "peak_measured_tflops": peak.measured_tflops,
        "peak_mem_mb": peak_mem, "state_mb": static, "memory_by_phase": mem_phases,
        "top_ops": prof.top_ops if prof else [], "trace_path": prof.trace_path if prof else None,
        "losses": losses, "final_loss": losses[-1],
    })
    return row


def _value_of(cfg: TuneConfig, variable: str):
    return getattr(cfg, variable) if variable in TuneConfig.__dataclass_fields__ else None


def default_variants(base: TuneConfig, allow_compile: bool = True) -> list[Variant]:
    """The baseline plus one row per alternative value of each setting the issue lists."""
    rows = [Variant("baseline", "baseline")]

    def alt(variable, value, expect_parity=True, skip=None):
        rows.append(Variant(f"{variable}={value}", variable, {variable: value}, expect_parity, skip))

    for p in TUNE_PRECISIONS:
        if p != base.precision:
            alt("precision", p)
    for m in COMPILE_MODES:
        if m != base.compile:
            alt("compile", m, skip=None if allow_compile or m == "off" else
                "torch.compile disabled for this run (allow_compile=False): compiling takes minutes on a small CPU")
    for b in sorted({max(1, base.batch_size // 2), base.batch_size * 2} - {base.batch_size}):
        alt("batch_size", b, expect_parity=False)
    for t in sorted({max(1, base.seq_len // 2), base.seq_len * 2} - {base.seq_len}):
        alt("seq_len", t, expect_parity=False)
    alt("attn_impl", "math" if base.attn_impl == "sdpa" else "sdpa")
    alt("optimizer", "fused" if base.optimizer == "foreach" else "foreach")
    alt("pad_vocab_to_multiple", 64 if base.pad_vocab_to_multiple == 1 else 1)
    alt("gradient_checkpointing", not base.gradient_checkpointing)
    alt("grad_accum", 2 if base.grad_accum == 1 else 1)
    alt("offload_optimizer", not base.offload_optimizer)
    alt("loss_impl", "fused" if base.loss_impl == "plain" else "plain")
    return rows


def default_baseline(device: str = "auto", **overrides) -> TuneConfig:
    """A sensible baseline: fp32 eager on CPU; bf16, fused AdamW, padded vocab (nanoGPT's set) on GPU."""
    dev = perf.resolve_device(device)
    if dev.type == "cuda":
        base = TuneConfig(model="gpt2", batch_size=16, seq_len=1024, precision="bf16", optimizer="fused",
                          pad_vocab_to_multiple=64, steps=12, timed_from=4, device=device)
    else:
        base = TuneConfig(device=device)
    return replace(base, **overrides)


@dataclass
class MatrixResult:
    baseline: TuneConfig
    rows: list[dict]
    tolerance: float
    environment: dict
    peaks: dict
    utilization: dict

    def row(self, name: str) -> dict:
        for r in self.rows:
            if r["name"] == name:
                return r
        raise KeyError(name)

    def ok_rows(self) -> list[dict]:
        return [r for r in self.rows if r["status"] == "ok"]

    def flagged(self) -> list[str]:
        """Rows expected to keep the result that did not (|final loss - baseline| > tolerance)."""
        return [r["name"] for r in self.ok_rows() if r["expect_parity"] and r["changes_result"]]

    def table(self):
        """A pandas DataFrame: one row per matrix row, the columns a reader compares."""
        import pandas as pd

        cols = ["name", "status", "tokens_per_s", "step_time_s", "step_time_p10_s", "step_time_p90_s", "speedup",
                "mfu_measured", "mfu_table", "peak_mem_mb", "final_loss", "loss_delta", "changes_result", "reason"]
        return pd.DataFrame([{c: r.get(c) for c in cols} for r in self.rows])

    def scaling(self, variable: str) -> list[dict]:
        """(value, step time, tokens/s) for batch_size or seq_len rows, baseline included, sorted."""
        pts = [r for r in self.ok_rows() if r["variable"] == variable]
        base = self.row("baseline")
        if base["status"] == "ok":
            pts.append({**base, "value": getattr(self.baseline, variable)})
        return sorted(({"value": r["value"], "step_time_s": r["step_time_s"], "tokens_per_s": r["tokens_per_s"],
                        "p10_s": r["step_time_p10_s"], "p90_s": r["step_time_p90_s"]} for r in pts),
                      key=lambda d: d["value"])

    def as_dict(self) -> dict:
        return {"baseline": asdict(self.baseline), "tolerance": self.tolerance, "environment": self.environment,
                "peaks": {k: v.as_dict() for k, v in self.peaks.items()}, "utilization": self.utilization,
                "flagged": self.flagged(), "rows": self.rows}


def run_matrix(base: TuneConfig, variants: list[Variant] | None = None, *, tolerance: float = PARITY_TOLERANCE,
               allow_compile: bool = True, measure_peak: bool = True, profile_memory: bool = True,
               trace_dir: str | Path | None = None, batches: list | None = None, progress: bool = True,
               repeat_baseline: bool = False) -> MatrixResult:
    """Run the baseline and each variant; fill in speedup, loss_delta and changes_result.

    repeat_baseline appends a second run of the baseline ("baseline (repeat)"): its speedup
    against the first run is the run-to-run noise of this machine, the yardstick for reading the
    other rows' speedups.

    Every row starts from the same initial weights and trains on the same batches (re-cut for
    rows that change batch_size or seq_len). trace_dir, if given, receives the baseline's
    profiler trace (baseline_trace.json).
    """
    variants = variants if variants is not None else default_variants(base, allow_compile)
    if not variants or variants[0].variable != "baseline":
        variants = [Variant("baseline", "baseline")] + list(variants)
    if repeat_baseline:
        variants = list(variants) + [Variant("baseline (repeat)", "baseline-repeat")]
    device = perf.resolve_device(base.device)
    init = initial_state(base)
    peaks: dict = {}
    rows = []
    try:
        from tqdm.auto import tqdm

        it = tqdm(variants, desc="tuning matrix", disable=not progress)
    except ImportError:
        it = variants
    with perf.UtilizationSampler(interval_s=0.25) as sampler:
        for v in it:
            cfg = replace(base, **v.overrides)
            if v.skip_reason:
                rows.append({"name": v.name, "variable": v.variable, "value": _value_of(cfg, v.variable),
                             "config": asdict(cfg), "expect_parity": v.expect_parity, "status": "skipped",
                             "reason": v.skip_reason})
                continue
            same_data = (cfg.batch_size, cfg.seq_len, cfg.n_batches) == (base.batch_size, base.seq_len, base.n_batches)
            data = batches if (batches is not None and same_data) else None
            trace = Path(trace_dir) / "baseline_trace.json" if (trace_dir and v.variable == "baseline") else None
            rows.append(run_config(cfg, init_state=init, batches=data, peaks=peaks, measure_peak=measure_peak,
                                   profile_memory=profile_memory, trace_path=trace, name=v.name,
                                   variable=v.variable, expect_parity=v.expect_parity))
    base_row = rows[0]
    for r in rows:
        if r["status"] != "ok" or base_row["status"] != "ok":
            continue
        r["speedup"] = r["tokens_per_s"] / base_row["tokens_per_s"]
        r["loss_delta"] = r["final_loss"] - base_row["final_loss"]
        r["changes_result"] = abs(r["loss_delta"]) > tolerance
    return MatrixResult(baseline=base, rows=rows, tolerance=tolerance, environment=perf.environment_info(device),
                        peaks=peaks, utilization=sampler.summary())


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------


def speedup_figure(result: MatrixResult):
    """Bar chart: tokens/s of each row relative to the baseline; red bars change the result."""
    import plotly.graph_objects as go

    rows = [r for r in result.ok_rows() if r["variable"] not in ("batch_size", "seq_len")]
    colors = ["crimson" if r.get("changes_result") and r["expect_parity"] else "steelblue" for r in rows]
    fig = go.Figure(go.Bar(x=[r["name"] for r in rows], y=[r.get("speedup", float("nan")) for r in rows],
                           marker_color=colors, name="speedup",
                           text=[f"{r.get('speedup', float('nan')):.2f}x" for r in rows], textposition="outside"))
    fig.add_hline(y=1.0, line_dash="dash", line_color="gray")
    fig.update_layout(title=f"Training throughput vs baseline ({result.baseline.model}, {result.environment['device']})",
                      yaxis_title="tokens/s relative to baseline", xaxis_title="row (one setting changed)",
                      template="plotly_white")
    return fig


def scaling_figure(result: MatrixResult):
    """Step time and tokens/s against batch size and against sequence length."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("cost vs batch size", "cost vs sequence length"),
                        specs=[[{"secondary_y": True}, {"secondary_y": True}]])
    for col, variable in ((1, "batch_size"), (2, "seq_len")):
        pts = result.scaling(variable)
        xs = [p["value"] for p in pts]
        fig.add_trace(go.Scatter(x=xs, y=[p["step_time_s"] * 1e3 for p in pts], mode="lines+markers",
                                 name=f"step time (ms) vs {variable}",
                                 error_y=dict(type="data", symmetric=False,
                                              array=[(p["p90_s"] - p["step_time_s"]) * 1e3 for p in pts],
                                              arrayminus=[(p["step_time_s"] - p["p10_s"]) * 1e3 for p in pts])),
                      row=1, col=col, secondary_y=False)
        fig.add_trace(go.Scatter(x=xs, y=[p["tokens_per_s"] for p in pts], mode="lines+markers", line_dash="dot",
                                 name=f"tokens/s vs {variable}"), row=1, col=col, secondary_y=True)
        fig.update_xaxes(title_text=variable, type="log", row=1, col=col)
        fig.update_yaxes(title_text="step time (ms, p10-p90 bars)", row=1, col=col, secondary_y=False)
        fig.update_yaxes(title_text="tokens/s", row=1, col=col, secondary_y=True)
    fig.update_layout(title=f"Scaling of one training step ({result.baseline.model}, {result.environment['device']})",
                      template="plotly_white")
    return fig
