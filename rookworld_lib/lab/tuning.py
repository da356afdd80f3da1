"""The tuning matrix: core.train_step.TrainStep (the step SFT trains with) timed one setting at a time,
so a speed figure is the speed of training.

The matrix trains a baseline `TuneConfig` and then each row with one setting changed, from the same
initialisation on seeded batches. A row whose final loss is more than `tolerance` from the baseline's
is marked `changes_result` (a speed-up that changes the answer is not a speed-up); rows a device
cannot run are kept as `skipped` with the reason, a crash as `failed`.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from . import perf
from .health import state_bytes
from ..core.progress import tqdm
from ..core.model import GPT, GPTConfig, PRESETS
from ..core.config import SEED_MAX, bad_field, config_class, option, validate
from ..core.tokenizer import VOCAB_SIZE
from ..core.train_step import LOSS_IMPLS, TrainStep, resolve_loss_impl
from ..core.train_utils import build_adamw, decay_groups, resolve_device, setup_runtime
from .plots import series_colour

COMPILE_MODES = ("off", "default", "max-autotune")
OPTIMIZERS = ("auto", "foreach", "fused")
TUNE_PRECISIONS = ("fp32", "tf32", "bf16")
PARITY_TOLERANCE = 0.05


class CPUOffloadAdamW:
    """AdamW whose state and fp32 master weights live in CPU memory (ZeRO-Offload style, one device): the
    two moments (8 bytes/param) stay in host RAM, at the cost of two PCIe transfers per step."""

    def __init__(self, param_groups: list[dict], lr: float):
        pin = torch.cuda.is_available()
        self.device_params = [p for g in param_groups for p in g["params"]]
        cpu_groups = []
        for g in param_groups:
            masters = [torch.empty(p.shape, dtype=torch.float32, pin_memory=pin).copy_(p.detach()).requires_grad_()
                       for p in g["params"]]
            cpu_groups.append({**g, "params": masters})
        self.masters = [m for g in cpu_groups for m in g["params"]]
        self.grads = [torch.zeros(m.shape, dtype=torch.float32, pin_memory=pin) for m in self.masters]
        self.inner = build_adamw(cpu_groups, lr=lr, weight_decay=0.0, device_type="cpu", fused=False)
        self.param_groups = self.inner.param_groups

    @torch.no_grad()
    def step(self):
        """Copy the gradients out, update the CPU masters, copy the weights back. A parameter without a
        gradient this step is not stepped, as torch's AdamW skips it (a zero gradient would not do: the
        moments would still move it)."""
        for p, m, g in zip(self.device_params, self.masters, self.grads):
            m.grad = None if p.grad is None else g.copy_(p.grad, non_blocking=True)
        if self.device_params:  # the non-blocking copies must land before the CPU reads them
            perf.synchronize(self.device_params[0].device)
        self.inner.step()
        for p, m in zip(self.device_params, self.masters):
            p.copy_(m, non_blocking=True)

    def zero_grad(self, set_to_none: bool = True):
        """Drop the device gradients: the step copies them out, so dropping them is zeroing them."""
        for p in self.device_params:
            p.grad = None


def make_optimizer(model: GPT, cfg: TuneConfig):
    """AdamW from `build_adamw` (SFT's factory) in the implementation cfg asks for, or offloaded."""
    if cfg.offload_optimizer:
        return CPUOffloadAdamW(decay_groups(model, cfg.weight_decay), lr=cfg.lr)
    fused = {"auto": None, "fused": True, "foreach": False}[cfg.optimizer]
    return build_adamw(model, lr=cfg.lr, weight_decay=cfg.weight_decay,
                       device_type=next(model.parameters()).device.type, fused=fused)


# --- Configurations ---

@config_class(frozen=True)
class TuneConfig:
    """One training setup of the tuning matrix (the baseline, or the baseline with one change)."""

    model: str = option("tiny", "GPTConfig preset name (tiny, cpu-small, cpu-medium, gpt2, ...)", choices=tuple(PRESETS))
    # what is trained
    batch_size: int = option(4, "sequences per optimizer step, all micro-batches together", min=1)
    seq_len: int = option(64, "tokens per sequence", min=1)
    # how: numerics, kernels, memory
    precision: str = option("fp32", "fp32, tf32 (CUDA matmuls on tensor cores) or bf16 (autocast)", choices=TUNE_PRECISIONS)
    compile: str = option("off", "torch.compile mode: off, default or max-autotune", choices=COMPILE_MODES)
    attn_impl: str = option("sdpa", "sdpa (F.scaled_dot_product_attention) or math (softmax(QK^T)V)", choices=("sdpa", "math"))
    optimizer: str = option("auto", "AdamW implementation: auto (build_adamw's choice, as SFT), foreach or fused", choices=OPTIMIZERS)
    pad_vocab_to_multiple: int = option(1, "1 keeps 50257 rows; 64 pads the embedding/head to 50304", min=1)
    gradient_checkpointing: bool = option(False, "recompute block activations in backward")
    grad_accum: int = option(1, "micro-batches per optimizer step (batch_size is split between them)", min=1)
    offload_optimizer: bool = option(False, "keep AdamW state and master weights in CPU memory")
    loss_impl: str = option("auto", "LM head + loss: fused (chunked), plain (logits, then cross-entropy), auto (as SFT)", choices=LOSS_IMPLS)
    # the optimizer (build_adamw, as SFT)
    lr: float = option(1e-3, "AdamW learning rate (constant)", min=0.0, min_open=True)
    weight_decay: float = option(0.1, "AdamW weight decay on 2-D weights", min=0.0)
    grad_clip: float = option(1.0, "global grad-norm clip, as SFT's default (0 = measure only)", min=0.0)
    # the run
    steps: int = option(6, "optimizer steps per row; the loss after the last one is the parity check", min=1)
    timed_from: int = option(2, "steps before this index are warm-up (compile, allocator) and not timed", min=0)
    n_batches: int = option(2, "distinct random batches, cycled; few, so the loss moves measurably", min=1)
    device: str = option("auto", "auto (cuda if available), cpu, cuda, cuda:1, ...")
    seed: int = option(0, "initialisation and data seed", min=0, max=SEED_MAX)

    def __post_init__(self):
        validate(self)  # types, ranges and choices (the option() checks above)
        if self.timed_from >= self.steps:
            bad_field("TuneConfig", "timed_from", self.timed_from, f"must be an integer in [0, steps={self.steps})")

    def model_config(self) -> GPTConfig:
        """The GPTConfig this row trains (dropout off, so rows are comparable)."""
        return GPTConfig.preset(self.model, attn_impl=self.attn_impl, pad_vocab_to_multiple=self.pad_vocab_to_multiple,
                                gradient_checkpointing=self.gradient_checkpointing, dropout=0.0)


@dataclass(frozen=True)
class Variant:
    """A row of the matrix: the baseline with `overrides` applied."""

    name: str  # row label, e.g. "attn_impl=math"
    variable: str  # the setting varied ("baseline" for the baseline row)
    overrides: dict = field(default_factory=dict)  # TuneConfig fields changed
    expect_parity: bool = True  # False where the row trains on different data (batch size, seq len)
    skip_reason: str | None = None  # set to report the row as skipped without running it


def unsupported_reason(cfg: TuneConfig, device: torch.device) -> str | None:
    """Why this configuration cannot run (meaningfully) on `device`, or None if it can."""
    cuda, block = device.type == "cuda", PRESETS[cfg.model].block_size
    if cfg.seq_len > block:
        return f"seq_len {cfg.seq_len} exceeds the {cfg.model} model's block_size {block}"
    if cfg.batch_size % cfg.grad_accum:
        return f"batch_size {cfg.batch_size} is not divisible into {cfg.grad_accum} equal micro-batches"
    if cfg.precision == "tf32" and not cuda:
        return "TF32 is an NVIDIA tensor-core format (Ampere or newer); there is no CPU equivalent"
    if cfg.precision == "tf32" and torch.cuda.get_device_capability(device)[0] < 8:
        return f"TF32 needs compute capability 8.0+, {perf.device_name(device)} has less"
    if cfg.precision == "bf16" and cuda and not torch.cuda.is_bf16_supported():
        return f"{perf.device_name(device)} does not support bf16"
    if cfg.precision == "bf16" and not cuda and not perf.cpu_native_bf16():
        return (f"this CPU ({perf.cpu_capability()}) has no native bf16 matmul (no AVX512-BF16/AMX); autocast would "
                f"emulate it in software, many times slower than fp32")
    if cfg.compile != "off" and cuda and importlib.util.find_spec("triton") is None:
        return "torch.compile on CUDA needs triton, which is not installed"
    if cfg.compile != "off" and not cuda and not any(map(shutil.which, ("g++", "c++", "clang++"))):
        return "torch.compile on CPU needs a C++ compiler (g++/clang++), none found"
    if cfg.offload_optimizer and not cuda:
        return "the model already lives in CPU memory; optimizer offload applies to accelerator runs"
    return None


# --- Data and initialisation shared by every row ---

def random_batches(n: int, batch_size: int, seq_len: int, seed: int = 0) -> list[tuple]:
    """n (x, y) pairs of uniformly random tokens, y = x shifted by one."""
    t = torch.randint(0, VOCAB_SIZE, (n, batch_size, seq_len + 1), generator=torch.Generator().manual_seed(seed))
    return [(t[i, :, :-1].contiguous(), t[i, :, 1:].contiguous()) for i in range(n)]


def initial_state(cfg: TuneConfig) -> dict[str, torch.Tensor]:
    """The baseline model's initial weights (seeded); every row starts from these."""
    torch.manual_seed(cfg.seed)
    return {k: v.detach().clone() for k, v in GPT(GPTConfig.preset(cfg.model, dropout=0.0)).named_parameters()}


@torch.no_grad()
def load_initial_state(model: GPT, state: dict[str, torch.Tensor]) -> None:
    """Copy `state` into model; rows of a padded vocabulary beyond the state's are zero, and stay zero (never
    looked up, logits sliced off: no gradient), so a padded model computes exactly what the unpadded one does."""
    for name, p in model.named_parameters():
        src = state[name]
        if p.dim() != src.dim() or p.shape[1:] != src.shape[1:] or p.shape[0] < src.shape[0]:
            raise ValueError(f"cannot map initial weights {name} {tuple(src.shape)} onto {tuple(p.shape)}")
        p.zero_()
        p[: src.shape[0]].copy_(src)


# --- Running one row and the matrix ---

def checked_mfu(flops: float, seconds: float, peaks: dict, device: torch.device, precision: str) -> perf.MFU:
    """perf.mfu against the cached peak; above 100% of the *measured* peak, measure once more and keep the
    larger (on a shared machine the first can land in a busy moment). Still above 100%: the count is wrong."""
    if precision not in peaks:
        peaks[precision] = perf.get_peak(device, precision)
    peak = peaks[precision]
    try:
        return perf.mfu(flops, seconds, peak)
    except perf.MFUError:
        if peak.measured_tflops is None:
            raise
        again = perf.measure_peak_tflops(device, precision, repeats=10)
        peaks[precision] = replace(peak, measured_tflops=max(again, peak.measured_tflops))
        return perf.mfu(flops, seconds, peaks[precision])


def build_step(cfg: TuneConfig, device: torch.device, init_state: dict) -> TrainStep:
    """The model (from init_state), its optimizer and the TrainStep that `cfg` describes."""
    model = GPT(cfg.model_config())
    load_initial_state(model, init_state)
    model.to(device).train()
    compiled = None if cfg.compile == "off" else torch.compile(
        model, mode=None if cfg.compile == "default" else cfg.compile)
    # tf32 only in its own row: fp32 rows are the exact reference the others are compared with
    runtime = setup_runtime(str(device), "bf16" if cfg.precision == "bf16" else "fp32", tf32=cfg.precision == "tf32")
    return TrainStep(model, make_optimizer(model, cfg), runtime, grad_accum=cfg.grad_accum, grad_clip=cfg.grad_clip,
                     loss_impl=cfg.loss_impl, forward_model=compiled)


def _train(step: TrainStep, cfg: TuneConfig, batches: list, profile: bool, trace_path) -> dict:
    """cfg.steps steps, those from cfg.timed_from timed, then (if profile) one more under the profiler."""
    device = step.runtime.device
    losses = []

    def one_step():
        x, y = batches[len(losses) % len(batches)]
        losses.append(step(x, y))

    perf.reset_peak_memory(device)
    timing = perf.benchmark(one_step, warmup=cfg.timed_from, repeats=cfg.steps - cfg.timed_from, sync=device)
    held = state_bytes(step.model, step.optimizer)
    static = {"params_mb": held["params"] / 2**20, "grads_mb": held["grads"] / 2**20,
              "optimizer_mb": held["optimizer_state"] / 2**20}
    out = {"losses": [float(v) for v in losses], "step_times_s": list(timing.times_s), "step_time_s": timing.median_s,
           "step_time_p10_s": timing.p10_s, "step_time_p90_s": timing.p90_s, "peak_mem_mb": perf.max_memory_mb(device),
           "state_mb": static, "memory_by_phase": [], "top_ops": [], "trace_path": None}
    if profile:  # after the final loss is recorded, so it never affects parity
        x, y = batches[cfg.steps % len(batches)]
        prof = perf.profile_phases(lambda: step(x, y), trace_path=trace_path, device=device)
        out.update(memory_by_phase=prof.memory_by_phase, top_ops=prof.top_ops, trace_path=prof.trace_path)
        if out["peak_mem_mb"] is None and prof.memory_by_phase:  # CPU: state live at the start + the step's peak
            step_peak = max(m["peak_mb"] for m in prof.memory_by_phase)
            out["peak_mem_mb"] = static["params_mb"] + static["optimizer_mb"] + step_peak
    return out


def run_config(cfg: TuneConfig, variant: Variant | None = None, *, init_state: dict | None = None,
               peaks: dict | None = None, profile_memory: bool = True, trace_path: str | Path | None = None) -> dict:
    """Train `cfg` for cfg.steps steps and measure it: one row (a dict) labelled by `variant`, skipped or failed
    as the module docstring says; with profile_memory, one more step under the profiler (memory by phase, top ops)."""
    v = variant or Variant("config", "baseline")
    row = {"name": v.name, "variable": v.variable, "value": getattr(cfg, v.variable, None), "config": asdict(cfg),
           "expect_parity": v.expect_parity, "status": "ok", "reason": None}
    device = resolve_device(cfg.device)
    if reason := v.skip_reason or unsupported_reason(cfg, device):
        return {**row, "status": "skipped", "reason": reason}
    try:
        batches = random_batches(cfg.n_batches, cfg.batch_size, cfg.seq_len, seed=cfg.seed)
        step = build_step(cfg, device, init_state or initial_state(cfg))
        with step.runtime.backend_flags():
            run = _train(step, cfg, [(x.to(device), y.to(device)) for x, y in batches], profile_memory, trace_path)
    except Exception as exc:  # a crash is a result too: report it, never drop the row
        return {**row, "status": "failed", "reason": f"{type(exc).__name__}: {exc}"}
    losses = run["losses"]
    if not all(math.isfinite(v) for v in losses):
        row["status"], row["reason"] = "failed", f"non-finite loss {losses}"
    tokens, seconds = cfg.batch_size * cfg.seq_len, run["step_time_s"]
    flops = perf.flops_per_token(cfg.model_config(), cfg.seq_len, "train") * tokens
    try:
        util = checked_mfu(flops, seconds, {} if peaks is None else peaks, device, cfg.precision)
    except perf.MFUError as exc:  # a count or a peak gone wrong: this row's result, the others stand
        return {**row, "status": "failed", "reason": f"MFUError: {exc}"}
    return {**row, **run, "tokens_per_step": tokens, "tokens_per_s": tokens / seconds, "flops_per_step": flops,
            "achieved_tflops": util.achieved_tflops, "mfu_table": util.vs_table, "mfu_measured": util.vs_measured,
            "peak_table_tflops": util.peak.table_tflops, "peak_measured_tflops": util.peak.measured_tflops,
            "final_loss": losses[-1]}


def default_variants(base: TuneConfig, allow_compile: bool = True) -> list[Variant]:
    """The baseline plus one row per alternative value of each setting the matrix covers."""
    rows = [Variant("baseline", "baseline")]

    def alt(variable, value, expect_parity=True, skip=None):
        rows.append(Variant(f"{variable}={value}", variable, {variable: value}, expect_parity, skip))

    no_compile = "torch.compile disabled for this run (allow_compile=False): compiling takes minutes on a small CPU"
    for p in TUNE_PRECISIONS:
        if p != base.precision:
            alt("precision", p)
    for m in COMPILE_MODES:
        if m != base.compile:
            alt("compile", m, skip=None if allow_compile or m == "off" else no_compile)
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
    loss_impl = resolve_loss_impl(base.loss_impl, resolve_device(base.device))
    alt("loss_impl", "fused" if loss_impl == "plain" else "plain")
    return rows


def default_baseline(device: str = "auto", **overrides) -> TuneConfig:
    """SFT's CPU step on CPU; on GPU nanoGPT's set (GPT-2 124M, bf16, fused AdamW, padded vocabulary, T 1024)."""
    base = TuneConfig(device=device)
    if resolve_device(device).type == "cuda":
        base = replace(base, model="gpt2", batch_size=16, seq_len=1024, precision="bf16", optimizer="fused",
                       pad_vocab_to_multiple=64, steps=12, timed_from=4)
    return replace(base, **overrides)


@dataclass
class MatrixResult:
    """The rows of one matrix run, with the baseline, machine, peaks and utilisation."""

    baseline: TuneConfig
    rows: list[dict]
    tolerance: float
    environment: dict
    peaks: dict
    utilization: dict

    def row(self, name: str) -> dict:
        """The row called `name` (KeyError if there is none)."""
        for r in self.rows:
            if r["name"] == name:
                return r
        raise KeyError(name)

    def ok_rows(self) -> list[dict]:
        """The rows that ran."""
        return [r for r in self.rows if r["status"] == "ok"]

    def drift(self) -> str | None:
        """A warning when the baseline and its repeat disagree beyond both p10-p90 intervals: the
        host's speed changed during the matrix, so no speed-up of this run is sure (None otherwise)."""
        try:
            base, again = self.row("baseline"), self.row("baseline (repeat)")
        except KeyError:
            return None
        if base["status"] != "ok" or again["status"] != "ok" or _tokens_per_s_overlap(again, [base]):
            return None
        busy = self.utilization.get("host_cpu_pct", {}).get("mean")
        return (f"host speed drifted: the baseline's repeat ran at {again['speedup']:.2f}x the baseline, outside both "
                f"p10-p90 intervals{f' (host CPU {busy:.0f}% busy on average)' if busy is not None else ''}; "
                "speed-ups in this run are no surer than that")

    def flagged(self) -> list[str]:
        """Rows expected to keep the result that did not (|final loss - baseline| > tolerance)."""
        return [r["name"] for r in self.ok_rows() if r["expect_parity"] and r["changes_result"]]

    def table(self):
        """A pandas DataFrame for people: one row per matrix row, rounded to what the timing supports, units in
        the column names; a skipped or failed row shows only its reason. The raw numbers stay in `rows`."""
        def shown(r: dict) -> dict:
            if r["status"] != "ok":
                return {"row": r["name"], "status": r["status"], "note": r.get("reason") or ""}
            mfu, table_mfu = r["mfu_measured"], r.get("mfu_table")
            return {"row": r["name"], "status": "ok", "ms/step (median)": _ms(r["step_time_s"]),
                    "ms/step p10-p90": f"{_ms(r['step_time_p10_s'])}-{_ms(r['step_time_p90_s'])}",
                    "tokens/s": f"{r['tokens_per_s']:,.0f}",
                    "vs baseline": "" if r.get("speedup") is None else
                    f"{r['speedup']:.2f}x" + (" (noise)" if r.get("within_noise") and r["variable"] != "baseline" else ""),
                    # each row's MFU is over the measured peak of its own precision (a bf16 row: bf16's)
                    "MFU (measured peak)": f"{100 * mfu:.2g}% of {r['peak_measured_tflops']:.3g} TFLOP/s" if mfu else "",
                    "MFU (data-sheet peak)": f"{100 * table_mfu:.2g}%" if table_mfu else "n/a (no data-sheet peak for this device)",
                    "peak MiB": "" if r.get("peak_mem_mb") is None else f"{r['peak_mem_mb']:,.0f}",
                    "loss - baseline": "" if r.get("loss_delta") is None else f"{r['loss_delta']:+.1e}",
                    "result": "" if r.get("changes_result") is None else
                    "n/a (other data)" if not r["expect_parity"] else ("CHANGED" if r["changes_result"] else "same"),
                    "note": ""}

        table = pd.DataFrame([shown(r) for r in self.rows]).fillna("").set_index("row")
        if not any(r.get("mfu_table") for r in self.ok_rows()):  # a CPU: no data-sheet peak, a column of n/a
            table = table.drop(columns="MFU (data-sheet peak)")
        return table

    def scaling(self, variable: str) -> list[dict]:
        """(value, step time, tokens/s) for batch_size or seq_len rows, baseline included, sorted."""
        pts = [r for r in self.ok_rows() if r["variable"] == variable]
        if self.row("baseline")["status"] == "ok":
            pts.append({**self.row("baseline"), "value": getattr(self.baseline, variable)})
        return sorted(({"value": r["value"], "step_time_s": r["step_time_s"], "tokens_per_s": r["tokens_per_s"],
                        "p10_s": r["step_time_p10_s"], "p90_s": r["step_time_p90_s"]} for r in pts),
                      key=lambda d: d["value"])

    def as_dict(self) -> dict:
        """Everything as JSON-ready values (what notebook 04 writes to its results file)."""
        return {**asdict(self), "flagged": self.flagged()}  # asdict recurses into the baseline and the peaks


def run_matrix(base: TuneConfig, variants: list[Variant] | None = None, *, tolerance: float = PARITY_TOLERANCE,
               allow_compile: bool = True, profile_memory: bool = True, trace_dir: str | Path | None = None,
               progress: bool = True, repeat_baseline: bool = False, peaks: dict | None = None) -> MatrixResult:
    """Run the baseline and each variant (seeded batches of each row's own shape); fill in speedup, loss_delta
    and changes_result. repeat_baseline appends "baseline (repeat)", whose speedup is the machine's run-to-run
    noise. trace_dir receives the baseline's profiler trace. peaks: {precision: perf.Peak} already measured (the
    one a notebook printed), so the MFU columns are against it; a precision without one is measured once."""
    variants = list(variants if variants is not None else default_variants(base, allow_compile))
    if not variants or variants[0].variable != "baseline":
        variants.insert(0, Variant("baseline", "baseline"))
    if repeat_baseline:
        variants.append(Variant("baseline (repeat)", "baseline-repeat"))
    init, peaks, rows = initial_state(base), dict(peaks or {}), []
    # the process's own warm-up (thread pools, allocator, kernels) is paid here, not by the first row
    run_config(base, Variant("warm-up", "baseline"), init_state=init, peaks=peaks, profile_memory=False)
    with perf.UtilizationSampler(interval_s=0.25) as sampler:
        for v in tqdm(variants, desc="tuning matrix", disable=not progress):
            cfg = replace(base, **v.overrides)
            trace = Path(trace_dir) / "baseline_trace.json" if (trace_dir and v.variable == "baseline") else None
            rows.append(run_config(cfg, v, init_state=init, peaks=peaks, profile_memory=profile_memory,
                                   trace_path=trace))
    base_row = rows[0]
    # the noise: the baseline's step-to-step spread, and its run-to-run spread where it was repeated
    noise = [r for r in rows if r["variable"] in ("baseline", "baseline-repeat") and r["status"] == "ok"]
    for r in rows:
        if r["status"] == "ok" and base_row["status"] == "ok":
            r["speedup"] = r["tokens_per_s"] / base_row["tokens_per_s"]
            r["within_noise"] = _tokens_per_s_overlap(r, noise)
            r["loss_delta"] = r["final_loss"] - base_row["final_loss"]
            r["changes_result"] = abs(r["loss_delta"]) > tolerance
    return MatrixResult(baseline=base, rows=rows, tolerance=tolerance,
                        environment=perf.environment_info(resolve_device(base.device)), peaks=peaks,
                        utilization=sampler.summary())


def _ms(seconds: float) -> str:
    """Milliseconds to 3 significant digits, never in exponent notation."""
    ms = seconds * 1e3
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.3g}"


def _tokens_per_s_interval(r: dict) -> tuple[float, float]:
    """A row's tokens/s at its p90 and at its p10 step time."""
    return r["tokens_per_step"] / r["step_time_p90_s"], r["tokens_per_step"] / r["step_time_p10_s"]


def _tokens_per_s_overlap(row: dict, noise: list[dict]) -> bool:
    """Whether a row's tokens/s interval overlaps the span of the noise rows' intervals (the
    baseline, and its repeat): then its speed difference is inside the machine's noise."""
    lo, hi = _tokens_per_s_interval(row)
    spans = [_tokens_per_s_interval(r) for r in noise]
    return lo <= max(h for _, h in spans) and min(low for low, _ in spans) <= hi


# --- Figures ---

def speedup_figure(result: MatrixResult):
    """Bar chart: each row's tokens/s over the baseline's, with its p10-p90 interval; red bars change the result,
    grey ones are within the timing noise (speed-up shown as "~"), blue ones beyond it (and the baseline)."""
    rows = [r for r in result.ok_rows() if r["variable"] not in ("batch_size", "seq_len")]
    base_tps = result.row("baseline")["tokens_per_s"]
    speedups = [r["speedup"] for r in rows]
    colour = ["crimson" if r.get("changes_result") and r["expect_parity"] else
              "lightgray" if r.get("within_noise") and r["variable"] != "baseline" else "steelblue" for r in rows]
    spans = [_tokens_per_s_interval(r) for r in rows]
    bars = dict(type="data", symmetric=False, array=[hi / base_tps - s for (_, hi), s in zip(spans, speedups)],
                arrayminus=[s - lo / base_tps for (lo, _), s in zip(spans, speedups)])
    noise = [bool(r.get("within_noise")) and r["variable"] != "baseline" for r in rows]
    fig = go.Figure(go.Bar(x=[f"{r['name']} ({'~' if n else ''}{s:.2f}x)" for r, s, n in zip(rows, speedups, noise)], y=speedups, name="speedup",
                           error_y=bars, marker_color=colour))  # the speed-up in the row's label: a bar of 0.04x has no room
    fig.add_hline(y=1.0, line_dash="dash", line_color="gray")
    drifted = (f"; host speed drifted: the baseline's repeat ran at {result.row('baseline (repeat)')['speedup']:.2f}x"
               if result.drift() else "")
    fig.update_layout(title=f"Training throughput vs baseline ({result.baseline.model}, {result.environment['device']})"
                            f"<br><sup>blue = the baseline, or faster or slower than the noise; grey = within noise; "
                            f"red = changes the loss{drifted}</sup>", yaxis_title="tokens/s vs baseline",
                      xaxis_title="row (one setting changed)", template="plotly_white")
    return fig


def scaling_figure(result: MatrixResult):
    """Step time (median, p10-p90 bars; top) and tokens/s (bottom) against batch size (left) and sequence length
    (right), each panel its own y axis, ticks at the measured values. The baseline's repeat (run_matrix(
    repeat_baseline=True)), run after all other rows, is an open marker: how far the host's speed moved meanwhile."""
    try:
        again = result.row("baseline (repeat)")
    except KeyError:
        again = None
    again = again if again is not None and again["status"] == "ok" else None
    fig = make_subplots(rows=2, cols=2, shared_xaxes="columns", vertical_spacing=0.1, horizontal_spacing=0.12,
                        subplot_titles=("step time vs batch size", "step time vs sequence length",
                                        "throughput vs batch size", "throughput vs sequence length"))
    for col, variable in ((1, "batch_size"), (2, "seq_len")):
        pts = result.scaling(variable)
        xs, ms = [p["value"] for p in pts], [p["step_time_s"] * 1e3 for p in pts]
        bars = dict(type="data", symmetric=False, array=[p["p90_s"] * 1e3 - m for p, m in zip(pts, ms)],
                    arrayminus=[m - p["p10_s"] * 1e3 for p, m in zip(pts, ms)])
        fig.add_trace(go.Scatter(x=xs, y=ms, mode="lines+markers", name="step time (ms)", error_y=bars,
                                 line_color=series_colour(0), legendgroup="time", showlegend=col == 1), row=1, col=col)
        fig.add_trace(go.Scatter(x=xs, y=[p["tokens_per_s"] for p in pts], mode="lines+markers", name="tokens/s",
                                 line_color=series_colour(1), legendgroup="tps", showlegend=col == 1), row=2, col=col)
        if again is not None:
            x = [getattr(result.baseline, variable)]
            for row, y in ((1, again["step_time_s"] * 1e3), (2, again["tokens_per_s"])):
                fig.add_trace(go.Scatter(x=x, y=[y], mode="markers", name="baseline, run again at the end",
                                         marker=dict(symbol="circle-open", size=11, color=series_colour(2)),
                                         legendgroup="repeat", showlegend=col == 1 and row == 1), row=row, col=col)
        fig.update_xaxes(type="log", tickvals=xs, ticktext=[str(x) for x in xs], col=col)  # counts: integer ticks
        fig.update_xaxes(title_text=f"{variable.replace('_', ' ')} (log scale)", row=2, col=col)
        fig.update_yaxes(title_text="ms per step", row=1, col=col)
        fig.update_yaxes(title_text="tokens/s", row=2, col=col)
    drifted = "<br><sup>the host's speed drifted while the rows ran (open marker: the baseline run again at the end)</sup>"
    fig.update_layout(title=f"Scaling of one training step ({result.baseline.model}, {result.environment['device']})"
                            + (drifted if result.drift() else ""), template="plotly_white", height=650)
    return fig
