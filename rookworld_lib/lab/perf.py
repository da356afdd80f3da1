"""Honest speed accounting: FLOPs per token, peak tables, measured peaks, MFU, timing, profiling.

Every speed figure in the workbench goes through this module, so the counting rules (docs/perf.md)
live in one place: model FLOPs, training = 3x forward, and no MFU above 100% (the 173.81% bug).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import importlib.metadata
import itertools
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Callable

import torch
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from ..core.model import FLOP_KINDS, GPTConfig, flops_breakdown, flops_per_token  # noqa: F401  (public here too)
from ..core.train_step import PHASE_PREFIX, phase  # noqa: F401  (public here too)
from ..core.train_utils import Runtime, resolve_device
from .places import git_commit

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")

# --- FLOPs ---

def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs that torch.utils.flop_counter.FlopCounterMode counts while running fn()."""
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


# --- Peaks ---

# Dense (no 2:4 sparsity) peak TFLOP/s from the vendors' data sheets. bf16/fp16 use tensor cores
# with fp32 accumulation; tf32 uses tensor cores; fp32 is the plain CUDA-core rate. Data sheets
# usually print sparse figures (2x these) with an asterisk: these are the halved, dense ones.
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100 SXM": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H100 PCIe": {"bf16": 756.0, "fp16": 756.0, "tf32": 378.0, "fp32": 51.2},
    "H100 NVL": {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},  # 1,671 sparse, as the H200 NVL
    "H200": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "H200 NVL": {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
    "A100": {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
    "RTX 4090": {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6},
}


def table_entry(device_name: str) -> str | None:
    """The PEAK_TFLOPS key for a name such as torch.cuda.get_device_name() ("NVIDIA H100 80GB HBM3" ->
    "H100 SXM"), or None: CPUs and unknown GPUs get MFU against the measured peak only."""
    name = device_name.upper()
    if "H100" in name:
        return "H100 PCIe" if "PCIE" in name else "H100 NVL" if "NVL" in name else "H100 SXM"
    if "H200" in name:
        return "H200 NVL" if "NVL" in name else "H200"
    return "A100" if "A100" in name else "RTX 4090" if "4090" in name else None


def table_peak(device_name: str, precision: str) -> float | None:
    """Dense peak TFLOP/s for this device and precision from PEAK_TFLOPS, or None if absent."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    key = table_entry(device_name)
    return PEAK_TFLOPS[key][precision] if key else None


def _cpuinfo(key: str) -> str | None:
    """The first `key : value` of /proc/cpuinfo (Linux), or None."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() == key:
                return line.split(":", 1)[1].strip()
    return None


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (or what platform knows)."""
    return _cpuinfo("model name") or platform.processor() or platform.machine() or "unknown CPU"


def cpu_capability() -> str:
    """The SIMD level torch's CPU kernels use (e.g. "AVX2", "AVX512"), or "unknown"."""
    return str(getattr(torch.backends.cpu, "get_cpu_capability", lambda: "unknown")())


def cpu_native_bf16() -> bool:
    """Whether the CPU multiplies bf16 in hardware: the AVX512-BF16 or AMX-BF16 flag of /proc/cpuinfo
    (torch's capability string says "AVX512" on both kinds of AVX-512 CPU). Without it oneDNN emulates
    bf16, many times slower than fp32; with it, bf16 autocast trains cpu-long's SFT step 1.07-1.21x faster (docs/perf.md; a whole run was not faster)."""
    return bool({"avx512_bf16", "amx_bf16"} & set((_cpuinfo("flags") or "").split()))


def device_name(device: str | torch.device = "auto") -> str:
    """Human-readable name: the GPU's marketing name, or the CPU model with the thread count."""
    device = resolve_device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_name()} ({torch.get_num_threads()} thread{'s' if torch.get_num_threads() != 1 else ''})"


def tensor_bytes(tensors) -> int:
    """Bytes the tensors hold (elements x element size)."""
    return sum(t.numel() * t.element_size() for t in tensors)


def synchronize(device: str | torch.device = "auto") -> None:
    """Wait for queued accelerator work; a no-op on CPU. Call before reading a clock."""
    device = resolve_device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_peak_tflops(device: str | torch.device = "auto", precision: str = "fp32", n: int | None = None,
                        warmup: int = 2, repeats: int = 5) -> float:
    """Achievable TFLOP/s of an n x n matmul in the run's dtype (n 8192 on a GPU, 1024 on a CPU: out of cache,
    < 1 s). The *best* repeat counts: a peak is what the hardware can do; slower repeats measure the neighbours."""
    device = resolve_device(device)
    n = n or (8192 if device.type == "cuda" else 1024)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    gen = torch.Generator(device="cpu").manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen).to(device=device, dtype=dtype) for _ in range(2))
    with Runtime(device, None, tf32=precision == "tf32", deterministic=False).backend_flags():  # TF32 for its row only
        timing = benchmark(lambda: a @ b, warmup=warmup, repeats=repeats, sync=device)
    return 2 * n**3 / timing.min_s / 1e12


@dataclass(frozen=True)
class Peak:
    """The two denominators of MFU for one device and precision."""

    device: str  # device name (GPU marketing name or CPU model)
    precision: str  # fp32 / tf32 / bf16 / fp16
    table_tflops: float | None  # data-sheet dense peak; None where PEAK_TFLOPS has no entry (CPUs)
    measured_tflops: float | None  # best large-matmul rate measured here; None if not measured


def get_peak(device: str | torch.device = "auto", precision: str = "fp32", measure: bool = True,
             **measure_kwargs) -> Peak:
    """Table peak for the device's name plus (if measure) a measured large-matmul peak."""
    device = resolve_device(device)
    name = device_name(device)
    return Peak(name, precision, table_tflops=table_peak(name, precision) if device.type == "cuda" else None,
                measured_tflops=measure_peak_tflops(device, precision, **measure_kwargs) if measure else None)


class MFUError(ValueError):
    """An MFU above 100%: the FLOP count or the timing is wrong (e.g. train FLOPs over a forward timing)."""


@dataclass(frozen=True)
class MFU:
    """Model FLOPs utilisation against both peaks (see `mfu`)."""

    achieved_tflops: float  # model FLOPs / wall time
    vs_table: float | None  # fraction of the data-sheet peak (None: no table entry)
    vs_measured: float | None  # fraction of the measured matmul peak (None: not measured)
    peak: Peak


def mfu(flops: float, seconds: float, peak: Peak) -> MFU:
    """Model FLOPs utilisation of `flops` model FLOPs done in `seconds`, against both peaks; MFUError above 1."""
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


# --- Timing ---

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
        """The fields and the spread as a JSON-ready dict."""
        return {**asdict(self), "times_s": list(self.times_s), "spread": self.spread}


def summarize_times(times: list[float]) -> Timing:
    """Median, p10/p90 (linear interpolation between order statistics), min and mean of `times`."""
    if not times:
        raise ValueError("summarize_times: times is empty; it needs at least one timing")
    xs = sorted(times)
    deciles = statistics.quantiles(xs, n=10, method="inclusive") if len(xs) > 1 else xs * 9
    return Timing(median_s=statistics.median(xs), p10_s=deciles[0], p90_s=deciles[-1], min_s=xs[0],
                  mean_s=statistics.fmean(xs), times_s=tuple(times))


def _sync_fn(sync) -> Callable[[], None]:
    """True: every initialised GPU (CPU work is done when fn returns); False: none; a device: that one."""
    if callable(sync):
        return sync
    if sync is True:
        return lambda: torch.cuda.synchronize() if torch.cuda.is_initialized() else None
    if not sync:
        return lambda: None
    device = torch.device(sync)
    return lambda: synchronize(device)


def benchmark(fn: Callable[[], object], warmup: int = 2, repeats: int = 10, sync=True) -> Timing:
    """Time fn(): `warmup` untimed calls, then `repeats` timed ones; median, p10/p90, min, mean.
    `sync` (see _sync_fn) runs after warm-up and before each clock stops, so queued GPU work is timed."""
    return benchmark_interleaved({"fn": fn}, warmup=warmup, repeats=repeats, sync=sync)["fn"]


def benchmark_interleaved(fns: dict[str, Callable[[], object]], warmup: int = 2, repeats: int = 10,
                          sync=True) -> dict[str, Timing]:
    """Time several functions in turns (a, b, a, b, ...) so they share a noisy machine's slowdowns."""
    if warmup < 0 or repeats < 1:
        raise ValueError(f"benchmark needs warmup >= 0 and repeats >= 1, got {warmup}, {repeats}")
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


# --- Utilisation sampling (CPU always; NVML GPU metrics where a GPU and pynvml or nvidia-smi exist) ---

def _gpu_sampler(index: int) -> Callable[[], dict]:
    """GPU utilisation, memory, power and temperature: via pynvml (cheap), else nvidia-smi, else {}."""
    keys = ("gpu_util_pct", "gpu_mem_used_mb", "gpu_power_w", "gpu_temp_c")
    try:
        import pynvml  # provided by the nvidia-ml-py package

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(index)
        return lambda: dict(zip(keys, (
            float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu), pynvml.nvmlDeviceGetMemoryInfo(h).used / 2**20,
            pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            float(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)))))
    except Exception:
        if not shutil.which("nvidia-smi"):
            return dict
    cmd = ["nvidia-smi", f"--id={index}", "--query-gpu=utilization.gpu,memory.used,power.draw,temperature.gpu",
           "--format=csv,noheader,nounits"]
    return lambda: dict(zip(keys, (float(x) for x in subprocess.run(
        cmd, capture_output=True, text=True, timeout=5).stdout.strip().split(",")[:4])))


def _host_cpu_times() -> tuple[float, float] | None:
    """(busy, total) jiffies from /proc/stat (idle = idle + iowait), for machine-wide utilisation. Fields 1-8
    (user .. steal) only: guest and guest_nice are already inside user and nice (proc(5)), as psutil counts."""
    try:
        vals = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
        return sum(vals) - sum(vals[3:5]), sum(vals)
    except (OSError, ValueError):
        return None


class UtilizationSampler:
    """Sample CPU (and GPU) utilisation in a background thread while a `with` block runs. process_cpu_pct: this
    process's CPU time over wall time, in percent of one core (200 = two busy cores); host_cpu_pct: the whole
    machine's busy share of all cores (other users' load shows there)."""

    def __init__(self, interval_s: float = 0.2):
        self.interval_s = interval_s
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="UtilizationSampler", daemon=True)
        self._last = None  # (perf_counter, process_time, host CPU times) of the last reading
        self._gpu = dict  # the GPU metrics reader (_run makes it where there is a GPU)

    def _read(self) -> tuple:
        # time.process_time: this process's CPU time in nanoseconds (CLOCK_PROCESS_CPUTIME_ID); os.times() counts
        # 10 ms ticks, which over a short interval read two busy cores as up to 220%
        return time.perf_counter(), time.process_time(), _host_cpu_times()

    def _sample(self) -> None:
        (last_t, last_cpu, last_host), (now, cpu, host) = self._last, self._read()
        s = {"t": now, "process_cpu_pct": 100.0 * (cpu - last_cpu) / max(now - last_t, 1e-9)}
        if host and last_host and host[1] > last_host[1]:
            s["host_cpu_pct"] = 100.0 * (host[0] - last_host[0]) / (host[1] - last_host[1])
        with contextlib.suppress(Exception):  # a GPU metric that cannot be read is left out, not fatal
            s.update(self._gpu())
        self.samples.append(s)
        self._last = (now, cpu, host)

    def _run(self):
        if torch.cuda.is_available():
            self._gpu = _gpu_sampler(0)
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self):
        self._last = self._read()  # the block's start, whenever the thread gets a core
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)
        # the interval the block ended in, where it is half an interval or more: a block shorter than an
        # interval, or one whose thread never got a core on a loaded machine, had no sample at all
        if not self._thread.is_alive() and (not self.samples or time.perf_counter() - self._last[0] >= self.interval_s / 2):
            self._sample()

    def summary(self) -> dict:
        """{"n_samples", "interval_s", and per metric {"mean", "max"}} over the samples taken."""
        out = {"n_samples": len(self.samples), "interval_s": self.interval_s}
        for k in sorted({k for s in self.samples for k in s if k != "t"}):
            xs = [s[k] for s in self.samples if k in s]
            out[k] = {"mean": statistics.fmean(xs), "max": max(xs)}
        return out


# --- Profiling: trace export, top operators, memory by phase ---

@dataclass
class ProfileResult:
    """What profile_phases measured."""

    top_ops: list[dict]  # [{"name", "calls", "self_ms", "total_ms", "self_pct"}], by self time
    memory_by_phase: list[dict]  # [{"phase", "start_mb", "peak_mb", "end_mb", "peak_extra_mb"}]
    trace_path: str | None  # Chrome/Perfetto trace (open in chrome://tracing or ui.perfetto.dev)


def _memory_by_phase(prof, device_type: str) -> list[dict]:
    """Live allocated bytes (relative to the profile's start) within each marked phase, from the
    profiler's allocator events (+bytes on allocation, -bytes on free): what tensors hold, not RSS."""
    try:
        events = prof.profiler.kineto_results.events()
    except AttributeError:  # profiler internals moved: no memory breakdown rather than a crash
        return []
    mem, phases = [], []
    for e in events:
        name = e.name()
        if name == "[memory]" and str(e.device_type()).split(".")[-1].lower() == device_type:
            mem.append((e.start_ns(), e.nbytes()))
        elif name.startswith(PHASE_PREFIX):
            phases.append((name[len(PHASE_PREFIX):], e.start_ns(), e.end_ns()))
    mem.sort()
    out = []
    for pname, start, end in sorted(phases, key=lambda p: p[1]):
        live_start = sum(b for t, b in mem if t < start)
        live = list(itertools.accumulate((b for t, b in mem if start <= t <= end), initial=live_start))
        out.append({"phase": pname, "start_mb": live_start / 2**20, "peak_mb": max(live) / 2**20,
                    "end_mb": live[-1] / 2**20, "peak_extra_mb": (max(live) - live_start) / 2**20})
    return out


@contextlib.contextmanager
def _without_kineto_usdt_lines():
    """Kineto prints a `USDT: ... profiler_start` / `profiler_stop` line on the C stderr at every profile
    (a notebook cell shows each one). Only KINETO_LOG_LEVEL=6 silences them, which hides its errors too,
    so fd 2 goes to a file while profiling and every other line is written back."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured.read().decode(errors="replace").splitlines(keepends=True)
                    if not line.startswith("USDT:")]
            sys.stderr.write("".join(kept))


def profile_phases(fn: Callable[[], object], trace_path: str | Path | None = None,
                   device: str | torch.device = "auto", top_k: int = 15) -> ProfileResult:
    """Run fn() once under torch.profiler (with memory); export a trace, tabulate the top ops, and give each
    `phase(...)` region's live tensor memory at its start, peak and end (MiB, from the profile's start)."""
    device = resolve_device(device)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with _without_kineto_usdt_lines(), profile(activities=activities, profile_memory=True, record_shapes=False) as prof:
        fn()
        synchronize(device)
    if trace_path is not None:
        trace_path = Path(trace_path)
        trace_path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(trace_path))
    use_device = device.type == "cuda"

    def self_us(e):
        return getattr(e, "self_device_time_total", 0.0) if use_device else e.self_cpu_time_total

    rows = [e for e in prof.key_averages() if not e.key.startswith(PHASE_PREFIX) and e.key != "[memory]"]
    total = sum(self_us(e) for e in rows) or 1.0
    rows.sort(key=self_us, reverse=True)
    top = [{"name": e.key, "calls": int(e.count), "self_ms": self_us(e) / 1e3,
            "total_ms": (getattr(e, "device_time_total", 0.0) if use_device else e.cpu_time_total) / 1e3,
            "self_pct": 100.0 * self_us(e) / total} for e in rows[:top_k]]
    return ProfileResult(top_ops=top, memory_by_phase=_memory_by_phase(prof, device.type),
                         trace_path=str(trace_path) if trace_path else None)


def max_memory_mb(device: str | torch.device = "auto") -> float | None:
    """Peak allocated accelerator memory since the last reset_peak_memory (CUDA), else None."""
    device = resolve_device(device)
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def reset_peak_memory(device: str | torch.device = "auto") -> None:
    """Start a new peak for max_memory_mb (CUDA; nothing elsewhere): without it a measurement's peak
    is the process's so far."""
    device = resolve_device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


# --- Provenance ---

def environment_info(device: str | torch.device = "auto") -> dict:
    """Date, machine and software versions to store beside every measured number."""
    device = resolve_device(device)
    info = {"date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"), "device": device_name(device),
            "device_type": device.type, "cpu": cpu_name(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "cpu_capability": cpu_capability(),
            "cpu_native_bf16": cpu_native_bf16(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        info["transformers"] = importlib.metadata.version("transformers")
    if commit := git_commit():
        info["git_commit"] = commit
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
    if is_dataclass(o):
        return asdict(o)
    if isinstance(o, (torch.device, torch.dtype, Path)):
        return str(o)
    raise TypeError(f"cannot serialise {type(o).__name__}")
