"""Honest speed accounting: FLOPs per token, peak tables, measured peaks, MFU, timing, profiling.

Every speed figure in the workbench goes through this module, so the rules live in one place:

- FLOPs are *model* FLOPs (what the math of GPT-2 needs), never what a kernel happens to execute:
  activation recomputation (gradient checkpointing) does not raise them, and a flash kernel that
  skips masked attention blocks does not lower them. This is MFU as defined by PaLM and used by
  nanoGPT and llm.c.
- Training costs 3x the forward pass (backward = 2x forward: one matmul for the input gradient and
  one for the weight gradient per forward matmul). Timing a forward pass and counting training
  FLOPs is the bug that once reported 173.81% MFU; `mfu()` refuses any result above 100%.
- Timings synchronise the accelerator, warm up first, repeat, and report the median with its spread.

The public names other modules and notebooks use: `flops_per_token`, `flops_breakdown`,
`PEAK_TFLOPS`, `table_peak`, `measure_peak_tflops`, `get_peak`, `mfu`, `benchmark`,
`benchmark_interleaved`, `UtilizationSampler`, `profile_phases`, `environment_info`.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .model import GPTConfig

FLOP_KINDS = ("train", "forward", "decode")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")

# ---------------------------------------------------------------------------------------------
# FLOPs
# ---------------------------------------------------------------------------------------------


def flops_breakdown(config: GPTConfig, seq_len: int) -> dict[str, int]:
    """Forward FLOPs per token of a GPT-2 shaped model, by component (2 FLOPs per multiply-add).

    For a token in a sequence whose attention spans `seq_len` keys, per layer (C = n_embd):
      - `qkv`: the fused Q/K/V projection, 2 * C * 3C
      - `attn_scores`: q . k for every key, 2 * seq_len * C (all heads together)
      - `attn_values`: the softmax-weighted sum of values, 2 * seq_len * C
      - `attn_proj`: the attention output projection, 2 * C * C
      - `mlp`: the two MLP matmuls, 2 * C * 4C * 2
    and once per token:
      - `lm_head`: the output projection onto the (padded) vocabulary, 2 * C * padded_vocab. It is
        tied to the token embedding, but it is a real matmul and is counted.

    Left out, by convention (PaLM, nanoGPT, llm.c) and because they are small next to the matmuls:
    LayerNorm, softmax, GELU, the residual adds, bias adds, dropout, the attention scale and mask,
    the token and position embedding lookups (gathers, not matmuls) and the loss. Attention is
    counted over the full seq_len x seq_len score matrix although causality makes half of it
    masked; that is what an explicit-math attention executes and what the MFU convention counts.
    """
    if not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive integer, got {seq_len!r}")
    C, L = config.n_embd, config.n_layer
    return {
        "qkv": L * 2 * C * 3 * C,
        "attn_scores": L * 2 * seq_len * C,
        "attn_values": L * 2 * seq_len * C,
        "attn_proj": L * 2 * C * C,
        "mlp": L * 2 * C * 4 * C * 2,
        "lm_head": 2 * C * config.padded_vocab_size,
    }


def flops_per_token(config: GPTConfig, seq_len: int, kind: str = "train") -> int:
    """Model FLOPs per token.

    kind:
      - "forward": one forward pass over a sequence of `seq_len` tokens, per token;
      - "train": forward + backward = 3 x forward (the optimizer step is not counted);
      - "decode": one new token attending to `seq_len` cached keys (its own included), as in
        KV-cached sampling; same matmuls as "forward" with seq_len = the current context length.

    Equals sum(flops_breakdown(...)) (x3 for train), i.e. L * (24 C^2 + 4 seq_len C) + 2 C V_padded
    per forward token; see `flops_breakdown` for what is counted and what is left out. Within 2%
    of torch.utils.flop_counter.FlopCounterMode with attn_impl="math" (tests/test_perf.py).
    """
    if kind not in FLOP_KINDS:
        raise ValueError(f"kind must be one of {FLOP_KINDS}, got {kind!r}")
    fwd = sum(flops_breakdown(config, seq_len).values())
    return 3 * fwd if kind == "train" else fwd


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs that torch.utils.flop_counter.FlopCounterMode counts while running fn()."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


# ---------------------------------------------------------------------------------------------
# Peaks
# ---------------------------------------------------------------------------------------------

# Dense (no 2:4 sparsity) peak TFLOP/s from the vendors' data sheets. bf16/fp16 use tensor cores
# with fp32 accumulation; tf32 uses tensor cores; fp32 is the plain CUDA-core rate. Data sheets
# usually print sparse figures (2x these) with an asterisk: these are the halved, dense ones.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 SXM": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H100 PCIe": {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2},
    "H100 NVL": {"bf16": 835.0, "fp16": 835.0, "tf32": 417.5, "fp32": 60.0},
    "H200": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "RTX 4090": {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6},
}


def table_entry(device_name: str) -> str | None:
    """The PEAK_TFLOPS key for a device name such as torch.cuda.get_device_name(), or None.

    "NVIDIA H100 80GB HBM3" (the SXM part) -> "H100 SXM"; "NVIDIA H100 PCIe" -> "H100 PCIe";
    "NVIDIA H200" and "NVIDIA GH200 ..." -> "H200"; any A100 -> "A100"; "... RTX 4090" -> "RTX 4090".
    CPUs and unknown GPUs have no entry: their MFU is reported against the measured peak only.
    """
    name = device_name.upper()
    if "H200" in name:
        return "H200"
    if "H100" in name:
        if "PCIE" in name:
            return "H100 PCIe"
        if "NVL" in name:
            return "H100 NVL"
        return "H100 SXM"
    if "A100" in name:
        return "A100"
    if "4090" in name:
        return "RTX 4090"
    return None


def table_peak(device_name: str, precision: str) -> float | None:
    """Dense peak TFLOP/s for this device and precision from PEAK_TFLOPS, or None if absent."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    key = table_entry(device_name)
    return PEAK_TFLOPS[key][precision] if key else None


def resolve_device(device: str | torch.device | None = None) -> torch.device:
    """"auto"/None -> cuda if available else cpu; anything else as torch.device."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(device: str | torch.device | None = None) -> str:
    """Human-readable name: the GPU's marketing name, or the CPU model with the thread count."""
    device = resolve_device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_name()} ({torch.get_num_threads()} threads)"


def synchronize(device: str | torch.device | None = None) -> None:
    """Wait for queued accelerator work; a no-op on CPU. Call before reading a clock."""
    device = resolve_device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def precision_dtype(precision: str) -> torch.dtype:
    return {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


@contextmanager
def tf32_matmuls(enabled: bool):
    """Allow (or forbid) TF32 tensor-core matmuls on CUDA inside the block; restores the old setting."""
    old_mm, old_cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old_mm
        torch.backends.cudnn.allow_tf32 = old_cudnn


def measure_peak_tflops(device: str | torch.device | None = None, precision: str = "fp32", n: int | None = None,
                        warmup: int = 2, repeats: int = 5) -> float:
    """Achievable matmul TFLOP/s: an n x n @ n x n matmul in the run's dtype, warmed up and synced.

    The *best* of `repeats` timings is used (a peak is what the hardware can do, and on a shared
    machine the slower repeats measure the neighbours). n defaults to 8192 on a GPU and 1024 on a
    CPU (large enough to leave the cache-bound regime, small enough to take well under a second).
    """
    device = resolve_device(device)
    n = n or (8192 if device.type == "cuda" else 1024)
    dtype = precision_dtype(precision)
    gen = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    b = torch.randn(n, n, generator=gen).to(device=device, dtype=dtype)
    with tf32_matmuls(precision == "tf32") if device.type == "cuda" else nullcontext():
        timing = benchmark(lambda: a @ b, warmup=warmup, repeats=repeats, sync=device)
    return 2 * n**3 / timing.min_s / 1e12


@dataclass(frozen=True)
class Peak:
    """The two denominators of MFU for one device and precision."""

    device: str  # device name (GPU marketing name or CPU model)
    precision: str  # fp32 / tf32 / bf16 / fp16
    table_tflops: float | None  # data-sheet dense peak; None where PEAK_TFLOPS has no entry (CPUs)
    measured_tflops: float | None  # best large-matmul rate measured here; None if not measured

    def as_dict(self) -> dict:
        return asdict(self)


def get_peak(device: str | torch.device | None = None, precision: str = "fp32", measure: bool = True,
             **measure_kwargs) -> Peak:
    """Table peak for the device's name plus (if measure) a measured large-matmul peak."""
    device = resolve_device(device)
    name = device_name(device)
    table = table_peak(name, precision) if device.type == "cuda" else None
    measured = measure_peak_tflops(device, precision, **measure_kwargs) if measure else None
    return Peak(device=name, precision=precision, table_tflops=table, measured_tflops=measured)


class MFUError(ValueError):
    """An MFU above 100%: the FLOP count or the timing is wrong (e.g. train FLOPs over a forward timing)."""


@dataclass(frozen=True)
class MFU:
    achieved_tflops: float  # model FLOPs / wall time
    vs_table: float | None  # fraction of the data-sheet peak (None: no table entry)
    vs_measured: float | None  # fraction of the measured matmul peak (None: not measured)
    peak: Peak

    def as_dict(self) -> dict:
        d = asdict(self)
        d["peak"] = self.peak.as_dict()
        return d


def mfu(flops: float, seconds: float, peak: Peak) -> MFU:
    """Model FLOPs utilisation of `flops` model FLOPs done in `seconds`, against both peaks.

    Raises MFUError if either fraction exceeds 1: that is always a bug in the FLOP count (e.g. 6N
    per token over a forward-only timing) or in the timing (unsynchronised CUDA), never a result.
    """
    if not (flops > 0 and seconds > 0 and math.isfinite(flops) and math.isfinite(seconds)):
        raise ValueError(f"mfu needs positive, finite flops and seconds; got flops={flops!r}, seconds={seconds!r}")
    achieved = flops / seconds / 1e12
    vs_table = achieved / peak.table_tflops if peak.table_tflops else None
    vs_measured = achieved / peak.measured_tflops if peak.measured_tflops else None
    for label, value, denom in (("data-sheet", vs_table, peak.table_tflops),
                                ("measured", vs_measured, peak.measured_tflops)):
        if value is not None and value > 1.0:
            raise MFUError(f"MFU {value:.1%} of the {label} peak ({achieved:.4g} TFLOP/s achieved vs {denom:.4g} "
                           f"TFLOP/s on {peak.device}, {peak.precision}) is impossible: check that the FLOPs "
                           f"counted match the work timed (train = 3x forward) and that the timing synchronises")
    return MFU(achieved_tflops=achieved, vs_table=vs_table, vs_measured=vs_measured, peak=peak)


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """Wall-clock seconds of `repeats` timed calls (after warm-up)."""

    median_s: float
    p10_s: float  # 10th percentile (linear interpolation)
    p90_s: float  # 90th percentile
    min_s: float
    mean_s: float
    times_s: tuple[float, ...] = field(repr=False)

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: the relative spread; large values mean a noisy machine."""
        return (self.p90_s - self.p10_s) / self.median_s if self.median_s > 0 else float("nan")

    def per_second(self, amount: float) -> float:
        """Throughput of `amount` units (tokens, samples) done once per call, at the median time."""
        return amount / self.median_s

    def as_dict(self) -> dict:
        d = asdict(self)
        d["times_s"] = list(self.times_s)
        d["spread"] = self.spread
        return d


def _quantile(sorted_xs: list[float], q: float) -> float:
    if len(sorted_xs) == 1:
        return sorted_xs[0]
    pos = q * (len(sorted_xs) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_xs) - 1)
    return sorted_xs[lo] + (sorted_xs[hi] - sorted_xs[lo]) * (pos - lo)


def summarize_times(times: list[float]) -> Timing:
    if not times:
        raise ValueError("no timings to summarize")
    xs = sorted(times)
    return Timing(median_s=statistics.median(xs), p10_s=_quantile(xs, 0.1), p90_s=_quantile(xs, 0.9),
                  min_s=xs[0], mean_s=statistics.fmean(xs), times_s=tuple(times))


def _sync_fn(sync) -> Callable[[], None]:
    if callable(sync):
        return sync
    if sync is False or sync is None:
        return lambda: None
    if sync is True:
        # Synchronise every initialised GPU; CPU work is already done when fn returns.
        return lambda: torch.cuda.synchronize() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    device = torch.device(sync)
    return lambda: synchronize(device)


def benchmark(fn: Callable[[], object], warmup: int = 2, repeats: int = 10, sync=True) -> Timing:
    """Time fn(): `warmup` untimed calls, then `repeats` timed ones; median, p10/p90, min, mean.

    sync: True (default) synchronises CUDA (when initialised) before starting and before stopping
    each clock, so queued GPU work is inside the measurement; False skips it; a device ("cuda:0")
    syncs that device; a callable is called instead. Usage:

        t = benchmark(lambda: model(x), warmup=2, repeats=10)
        print(t.median_s, t.p10_s, t.p90_s, t.per_second(x.numel()))
    """
    if warmup < 0 or repeats < 1:
        raise ValueError(f"benchmark needs warmup >= 0 and repeats >= 1, got {warmup}, {repeats}")
    do_sync = _sync_fn(sync)
    for _ in range(warmup):
        fn()
    do_sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        do_sync()
        times.append(time.perf_counter() - t0)
    return summarize_times(times)


def benchmark_interleaved(fns: dict[str, Callable[[], object]], warmup: int = 2, repeats: int = 10,
                          sync=True) -> dict[str, Timing]:
    """Time several functions in turns (a, b, a, b, ...) so they share the machine's noise.

    For side-by-side comparisons on a shared or thermally throttling machine, interleaving is fairer
    than timing one function's repeats and then the other's. Returns one Timing per name.
    """
    do_sync = _sync_fn(sync)
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    do_sync()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            do_sync()
            times[name].append(time.perf_counter() - t0)
    return {name: summarize_times(ts) for name, ts in times.items()}


# ---------------------------------------------------------------------------------------------
# Utilisation sampling (CPU always; NVML GPU metrics where a GPU and pynvml or nvidia-smi exist)
# ---------------------------------------------------------------------------------------------


class _Nvml:
    """GPU utilisation, memory, power and temperature via pynvml, else nvidia-smi, else nothing."""

    def __init__(self, index: int = 0):
        self.kind = None
        self.handle = None
        try:
            import pynvml  # provided by the nvidia-ml-py package

            pynvml.nvmlInit()
            self.pynvml = pynvml
            self.handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self.kind = "pynvml"
        except Exception:
            if shutil.which("nvidia-smi"):
                self.kind = "nvidia-smi"
        self.index = index

    def sample(self) -> dict | None:
        try:
            if self.kind == "pynvml":
                nv, h = self.pynvml, self.handle
                util = nv.nvmlDeviceGetUtilizationRates(h)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                return {"gpu_util_pct": float(util.gpu), "gpu_mem_used_mb": mem.used / 2**20,
                        "gpu_power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                        "gpu_temp_c": float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))}
            if self.kind == "nvidia-smi":
                out = subprocess.run(
                    ["nvidia-smi", f"--id={self.index}", "--query-gpu=utilization.gpu,memory.used,power.draw,temperature.gpu",
                     "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5).stdout
                u, m, p, t = (float(x) for x in out.strip().split(",")[:4])
                return {"gpu_util_pct": u, "gpu_mem_used_mb": m, "gpu_power_w": p, "gpu_temp_c": t}
        except Exception:
            return None
        return None


def _process_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def _host_cpu_times() -> tuple[float, float] | None:
    """(busy, total) jiffies from /proc/stat, for machine-wide CPU utilisation."""
    try:
        parts = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        vals = [float(x) for x in parts]
        idle = vals[3] + (vals[4] if len(vals) > 4 else 0.0)
        return sum(vals) - idle, sum(vals)
    except (OSError, IndexError, ValueError):
        return None


class UtilizationSampler:
    """Sample CPU (and GPU, via NVML) utilisation in a background thread while a block runs.

        with UtilizationSampler(interval_s=0.2) as util:
            run_training()
        util.summary()  # {"process_cpu_pct": {"mean":..., "max":...}, "host_cpu_pct": ..., "gpu_util_pct": ...}

    process_cpu_pct is this process's CPU time over wall time in percent of one core (200 = two
    busy cores); host_cpu_pct is the whole machine's busy share in percent of all cores (so other
    users' load shows there). GPU metrics appear only where a GPU and pynvml or nvidia-smi exist.
    """

    def __init__(self, interval_s: float = 0.2, gpu: bool | None = None, gpu_index: int = 0):
        self.interval_s = interval_s
        self.gpu = torch.cuda.is_available() if gpu is None else gpu
        self.gpu_index = gpu_index
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self):
        nvml = _Nvml(self.gpu_index) if self.gpu else None
        last_t, last_cpu, last_host = time.perf_counter(), _process_cpu_seconds(), _host_cpu_times()
        while not self._stop.wait(self.interval_s):
            now, cpu, host = time.perf_counter(), _process_cpu_seconds(), _host_cpu_times()
            s = {"t": now, "process_cpu_pct": 100.0 * (cpu - last_cpu) / max(now - last_t, 1e-9)}
            if host and last_host and host[1] > last_host[1]:
                s["host_cpu_pct"] = 100.0 * (host[0] - last_host[0]) / (host[1] - last_host[1])
            if nvml is not None:
                s.update(nvml.sample() or {})
            self.samples.append(s)
            last_t, last_cpu, last_host = now, cpu, host

    def __enter__(self):
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="UtilizationSampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        return False

    def summary(self) -> dict:
        keys = sorted({k for s in self.samples for k in s if k != "t"})
        out = {"n_samples": len(self.samples), "interval_s": self.interval_s}
        for k in keys:
            xs = [s[k] for s in self.samples if k in s]
            out[k] = {"mean": statistics.fmean(xs), "max": max(xs)}
        return out


# ---------------------------------------------------------------------------------------------
# Profiling: trace export, top operators, memory by phase
# ---------------------------------------------------------------------------------------------

PHASE_PREFIX = "phase:"


def phase(name: str):
    """Mark a region (e.g. phase("forward")) so profile_phases can attribute time and memory to it."""
    return torch.profiler.record_function(PHASE_PREFIX + name)


@dataclass
class ProfileResult:
    top_ops: list[dict]  # [{"name", "calls", "self_ms", "total_ms", "self_pct"}], by self time
    memory_by_phase: list[dict]  # [{"phase", "start_mb", "peak_mb", "end_mb", "peak_extra_mb"}]
    trace_path: str | None  # Chrome/Perfetto trace (open in chrome://tracing or ui.perfetto.dev)
    device: str

    def as_dict(self) -> dict:
        return asdict(self)


def _memory_by_phase(prof, device_type: str) -> list[dict]:
    """Live allocated bytes (relative to the profile's start) within each marked phase.

    Built from the profiler's allocator events ([memory] rows: +bytes on allocation, -bytes on
    free), so it is the torch allocator's view: what tensors hold, not the process RSS.
    """
    try:
        events = prof.profiler.kineto_results.events()
    except AttributeError:  # profiler internals moved: no memory breakdown rather than a crash
        return []
    want = torch.device(device_type).type
    mem, phases = [], []
    for e in events:
        name = e.name()
        if name == "[memory]":
            if str(e.device_type()).split(".")[-1].lower() == want:
                mem.append((e.start_ns(), e.nbytes()))
        elif name.startswith(PHASE_PREFIX):
            phases.append((name[len(PHASE_PREFIX):], e.start_ns(), e.end_ns()))
    mem.sort()
    phases.sort(key=lambda p: p[1])
    out = []
    for pname, start, end in phases:
        live_start = sum(b for t, b in mem if t < start)
        live, peak = live_start, live_start
        for t, b in mem:
            if start <= t <= end:
                live += b
                peak = max(peak, live)
        out.append({"phase": pname, "start_mb": live_start / 2**20, "peak_mb": peak / 2**20, "end_mb": live / 2**20,
                    "peak_extra_mb": (peak - live_start) / 2**20})
    return out


def profile_phases(fn: Callable[[], object], steps: int = 1, trace_path: str | Path | None = None,
                   device: str | torch.device | None = None, top_k: int = 15) -> ProfileResult:
    """Run fn() `steps` times under torch.profiler (with memory); export a trace, tabulate top ops.

    fn should mark its phases with `perf.phase("forward")` etc.; memory_by_phase then reports, for
    each marked region, the live tensor memory at its start, its peak and its end (MB, relative to
    what was allocated before profiling began: parameters and any earlier state are the baseline).
    """
    from torch.profiler import ProfilerActivity, profile

    device = resolve_device(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities, profile_memory=True, record_shapes=False) as prof:
        for _ in range(steps):
            fn()
        synchronize(device)
    if trace_path is not None:
        trace_path = Path(trace_path)
        trace_path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace_path))
    averages = prof.key_averages()
    use_device = device.type == "cuda"

    def self_us(e):
        return getattr(e, "self_device_time_total", 0.0) if use_device else e.self_cpu_time_total

    rows = [e for e in averages if not e.key.startswith(PHASE_PREFIX) and e.key != "[memory]"]
    total = sum(self_us(e) for e in rows) or 1.0
    rows.sort(key=self_us, reverse=True)
    top = [{"name": e.key, "calls": int(e.count), "self_ms": self_us(e) / 1e3,
            "total_ms": (getattr(e, "device_time_total", 0.0) if use_device else e.cpu_time_total) / 1e3,
            "self_pct": 100.0 * self_us(e) / total} for e in rows[:top_k]]
    return ProfileResult(top_ops=top, memory_by_phase=_memory_by_phase(prof, device.type),
                         trace_path=str(trace_path) if trace_path else None, device=device_name(device))


def max_memory_mb(device: str | torch.device | None = None) -> float | None:
    """Peak allocated accelerator memory since the last reset (CUDA), else None."""
    device = resolve_device(device)
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return None


def reset_max_memory(device: str | torch.device | None = None) -> None:
    device = resolve_device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


# ---------------------------------------------------------------------------------------------
# Provenance
# ---------------------------------------------------------------------------------------------


def environment_info(device: str | torch.device | None = None) -> dict:
    """Date, machine and software versions to store beside every measured number."""
    device = resolve_device(device)
    info = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "device": device_name(device),
        "device_type": device.type,
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": getattr(torch.backends.cpu, "get_cpu_capability", lambda: "unknown")(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=Path(__file__).resolve().parent).stdout.strip()
        if commit:
            info["git_commit"] = commit
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def to_json(obj, path: str | Path) -> Path:
    """Write a results object as indented JSON (dataclasses and tuples converted)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, default=_json_default))
    return path


def _json_default(o):
    if hasattr(o, "as_dict"):
        return o.as_dict()
    if isinstance(o, (torch.device, torch.dtype)):
        return str(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"cannot serialise {type(o).__name__}")
