"""perf: FLOP counts against PyTorch's FlopCounterMode, peak tables, MFU guard, timing helpers."""

import json
import math
import os
import threading
import time

import pytest
import torch

from rookworld_lib.lab import perf
from rookworld_lib.core.model import GPT, GPTConfig, KVCache, lm_loss

# Several shapes: the tiny preset, a wider/deeper one with a padded vocabulary, and small-vocab
# shapes where attention is a large share of the FLOPs (so a wrong attention term shows).
SHAPES = [
    (GPTConfig.preset("tiny", attn_impl="math"), [16, 96]),
    (GPTConfig(n_layer=3, n_head=4, n_embd=96, block_size=256, pad_vocab_to_multiple=64, attn_impl="math"), [32, 200]),
    (GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=512, vocab_size=512, attn_impl="math"), [8, 256, 512]),
    (GPTConfig(n_layer=1, n_head=3, n_embd=48, block_size=128, vocab_size=1000, bias=False, attn_impl="math"), [128]),
]
CASES = [(cfg, T) for cfg, seq_lens in SHAPES for T in seq_lens]


def _ids(cfg, B, T):
    return torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("cfg,T", CASES, ids=[f"L{c.n_layer}C{c.n_embd}V{c.vocab_size}T{t}" for c, t in CASES])
def test_forward_and_train_flops_match_flop_counter(cfg, T):
    torch.manual_seed(0)
    model = GPT(cfg)
    B = 2
    idx = _ids(cfg, B, T + 1)
    fwd = perf.count_flops(lambda: model(idx[:, :-1]))
    assert perf.flops_per_token(cfg, T, "forward") * B * T == pytest.approx(fwd, rel=0.02)
    train = perf.count_flops(lambda: lm_loss(model(idx[:, :-1]), idx[:, 1:]).backward())
    assert perf.flops_per_token(cfg, T, "train") * B * T == pytest.approx(train, rel=0.02)


@pytest.mark.parametrize("context", [1, 17, 100])
def test_decode_flops_match_flop_counter(context):
    cfg = GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=128, vocab_size=700, attn_impl="math")
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    B = 3
    idx = _ids(cfg, B, context)
    cache = KVCache(cfg, B, context, "cpu", torch.float32)
    with torch.no_grad():
        if context > 1:
            model(idx[:, :-1], cache=cache, start=0)
        counted = perf.count_flops(lambda: model(idx[:, -1:], cache=cache, start=context - 1))
    # one new token per row attending to `context` keys, its own included
    assert perf.flops_per_token(cfg, context, "decode") * B == pytest.approx(counted, rel=0.02)


def test_train_is_three_forwards_and_breakdown_sums():
    cfg = GPTConfig()
    parts = perf.flops_breakdown(cfg, 1024)
    fwd = perf.flops_per_token(cfg, 1024, "forward")
    assert sum(parts.values()) == fwd
    assert perf.flops_per_token(cfg, 1024, "train") == 3 * fwd
    # GPT-2 124M at T=1024: 6N-style estimate (N without position embeddings) plus attention
    n_matmul = cfg.n_layer * 12 * cfg.n_embd**2 + cfg.n_embd * cfg.vocab_size
    assert perf.flops_per_token(cfg, 1024, "train") == 6 * n_matmul + 12 * cfg.n_layer * cfg.n_embd * 1024
    assert parts["lm_head"] == 2 * 768 * 50257
    assert perf.flops_breakdown(GPTConfig(pad_vocab_to_multiple=64), 8)["lm_head"] == 2 * 768 * 50304


def test_flops_bad_arguments():
    """An unknown kind, and a seq_len that is not a positive integer: 0, or True (an int subclass, refused on
    purpose rather than counted as a context of 1)."""
    with pytest.raises(ValueError, match="kind"):
        perf.flops_per_token(GPTConfig(), 16, "backward")
    with pytest.raises(ValueError, match="seq_len"):
        perf.flops_per_token(GPTConfig(), 0, "train")
    with pytest.raises(ValueError, match="seq_len must be a positive integer, got True"):
        perf.flops_per_token(GPTConfig(), True, "train")


@pytest.mark.parametrize("name,key,bf16", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989.4),
    ("NVIDIA H100 SXM5 80GB", "H100 SXM", 989.4),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756.0),
    ("NVIDIA H200", "H200", 989.4),
    ("NVIDIA H200 NVL", "H200 NVL", 835.5),  # the NVL card: 1,671 TFLOP/s bf16 with sparsity in its data sheet
    ("NVIDIA A100-SXM4-80GB", "A100", 312.0),
    ("NVIDIA A100 80GB PCIe", "A100", 312.0),
    ("NVIDIA GeForce RTX 4090", "RTX 4090", 165.2),
])
def test_peak_table_by_device_name(name, key, bf16):
    assert perf.table_entry(name) == key
    assert perf.table_peak(name, "bf16") == bf16
    assert 0 < perf.table_peak(name, "fp32") <= perf.table_peak(name, "tf32") <= perf.table_peak(name, "bf16")


def test_no_table_peak_for_cpus_or_unknown_gpus():
    assert perf.table_peak("AMD EPYC 7B13 (2 threads)", "fp32") is None
    assert perf.table_peak("NVIDIA Tesla T4", "bf16") is None
    peak = perf.get_peak("cpu", "fp32", measure=False)
    assert peak.table_tflops is None and peak.measured_tflops is None
    with pytest.raises(ValueError, match="precision"):
        perf.table_peak("NVIDIA H100", "int8")


def test_mfu_against_both_peaks_and_refuses_above_100_percent():
    peak = perf.Peak(device="NVIDIA H100 80GB HBM3", precision="bf16", table_tflops=989.4, measured_tflops=700.0)
    ok = perf.mfu(flops=400e12, seconds=1.0, peak=peak)
    assert ok.achieved_tflops == pytest.approx(400.0)
    assert ok.vs_table == pytest.approx(400 / 989.4) and ok.vs_measured == pytest.approx(400 / 700)
    with pytest.raises(perf.MFUError, match="measured"):
        perf.mfu(flops=800e12, seconds=1.0, peak=peak)
    with pytest.raises(perf.MFUError, match="data-sheet"):
        perf.mfu(flops=1000e12, seconds=1.0, peak=peak)
    with pytest.raises(ValueError):
        perf.mfu(flops=1.0, seconds=0.0, peak=peak)


def test_the_17381_percent_bug_is_refused():
    """Counting training FLOPs (3x forward) over a forward-only timing inflates MFU 3x."""
    cfg, T, B = GPTConfig(), 1024, 16
    peak = perf.Peak(device="NVIDIA GeForce RTX 4090", precision="bf16", table_tflops=165.2, measured_tflops=None)
    true_forward_mfu = 0.5794  # a plausible, honest forward-pass MFU
    forward_flops = perf.flops_per_token(cfg, T, "forward") * B * T
    forward_seconds = forward_flops / (true_forward_mfu * 165.2e12)
    assert perf.mfu(forward_flops, forward_seconds, peak).vs_table == pytest.approx(true_forward_mfu)
    wrong_flops = perf.flops_per_token(cfg, T, "train") * B * T  # 3x too many for a forward timing
    with pytest.raises(perf.MFUError, match="173.8"):
        perf.mfu(wrong_flops, forward_seconds, peak)


def test_measured_peak_and_cpu_mfu_are_sane():
    peak = perf.get_peak("cpu", "fp32", n=256, warmup=1, repeats=3)
    assert peak.table_tflops is None
    assert math.isfinite(peak.measured_tflops) and peak.measured_tflops > 0
    m = perf.mfu(peak.measured_tflops * 1e12 * 0.5, 1.0, peak)
    assert m.vs_table is None and m.vs_measured == pytest.approx(0.5)


def test_benchmark_warms_up_repeats_and_syncs():
    calls, syncs = [], []
    t = perf.benchmark(lambda: calls.append(1), warmup=3, repeats=7, sync=lambda: syncs.append(1))
    assert len(calls) == 10
    assert len(syncs) == 1 + 7  # once after warm-up, once per timed call
    assert len(t.times_s) == 7
    assert t.min_s <= t.p10_s <= t.median_s <= t.p90_s
    assert t.per_second(100) == pytest.approx(100 / t.median_s)
    json.dumps(t.as_dict())
    with pytest.raises(ValueError):
        perf.benchmark(lambda: None, warmup=0, repeats=0)


def test_benchmark_interleaved_alternates():
    order = []
    res = perf.benchmark_interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                                     warmup=1, repeats=3, sync=False)
    assert order == ["a", "b"] * 4
    assert set(res) == {"a", "b"} and len(res["a"].times_s) == 3


def test_quantiles():
    t = perf.summarize_times([5.0, 1.0, 3.0, 2.0, 4.0])
    assert t.median_s == 3.0 and t.min_s == 1.0
    assert t.p10_s == pytest.approx(1.4) and t.p90_s == pytest.approx(4.6)
    assert t.spread == pytest.approx((4.6 - 1.4) / 3.0)


def test_a_gpus_data_sheet_peak_is_the_precisions(monkeypatch):
    """On CUDA, MFU's data-sheet denominator is the run's precision's: NVIDIA's H100 SXM sheet gives
    989.4 (bf16), 494.7 (tf32), 66.9 (fp32) dense TFLOP/s. Run here with the device faked (no test reached
    get_peak's CUDA branch: a bf16 MFU over the fp32 peak would read 15x too high)."""
    monkeypatch.setattr(perf, "resolve_device", lambda device: torch.device("cuda"))
    monkeypatch.setattr(perf, "device_name", lambda device: "NVIDIA H100 80GB HBM3")
    for precision, tflops in (("bf16", 989.4), ("tf32", 494.7), ("fp32", 66.9)):
        peak = perf.get_peak("cuda", precision, measure=False)
        assert (peak.precision, peak.table_tflops, peak.measured_tflops) == (precision, tflops, None)


def test_utilization_sampler_records_cpu():
    """The sampler, run for real around a matmul loop, reads this process's CPU as the OS accounts it
    (time.process_time over the loop): on an idle machine about one core, under load what the process got."""
    wall, cpu = perf.time.perf_counter(), time.process_time()
    with perf.UtilizationSampler(interval_s=0.05) as util:
        a = torch.randn(256, 256)
        end = perf.time.perf_counter() + 0.4
        while perf.time.perf_counter() < end:
            a @ a
    got = 100 * (time.process_time() - cpu) / (perf.time.perf_counter() - wall)  # % of one core, top's unit
    s = util.summary()
    assert s["n_samples"] >= 1  # the last one at the block's end: under load the thread may not get a core before
    # the busiest interval at least half the loop's average, and no process uses more than all cores
    assert 0.5 * got <= s["process_cpu_pct"]["max"] <= 100 * os.cpu_count() + 10, (got, s)


def test_a_block_shorter_than_an_interval_or_whose_thread_never_ran_still_gets_its_sample(monkeypatch):
    """Under a loaded suite the sampler's thread got no core during a 0.4-s block (0 samples, an empty
    summary); a block shorter than the interval had none either. The block's last interval is sampled
    at its end, from its start."""
    wall, cpu = time.perf_counter(), time.process_time()
    with perf.UtilizationSampler(interval_s=60) as util:
        end = time.perf_counter() + 0.2
        while time.perf_counter() < end:
            pass
    got = 100 * (time.process_time() - cpu) / (time.perf_counter() - wall)  # what the OS gave the loop (% of a core)
    s = util.summary()
    # the one sample covers the block: the CPU the loop got, not a fixed share (a fresh clone's suite on 2 busy
    # cores gave the loop 46% of a core, and an absolute 50% failed)
    assert s["n_samples"] == 1 and 0.5 * got <= s["process_cpu_pct"]["max"] <= 100 * os.cpu_count() + 10, (got, s)
    # a thread that never ran: the sample covers the whole block
    idle = perf.UtilizationSampler(interval_s=0.05)
    monkeypatch.setattr(idle, "_thread", threading.Thread(target=lambda: None))
    with idle:
        time.sleep(0.2)
    assert len(idle.samples) == 1 and idle.samples[0]["process_cpu_pct"] < 50


def test_profile_phases_memory_trace_and_top_ops(tmp_path):
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", block_size=64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = _ids(model.config, 2, 33)

    def step():
        with perf.phase("forward"):
            loss = lm_loss(model(idx[:, :-1]), idx[:, 1:])
        with perf.phase("backward"):
            loss.backward()
        with perf.phase("optimizer"):
            opt.step()
            opt.zero_grad(set_to_none=True)

    res = perf.profile_phases(step, trace_path=tmp_path / "trace.json", device="cpu")
    assert (tmp_path / "trace.json").stat().st_size > 0
    assert [m["phase"] for m in res.memory_by_phase] == ["forward", "backward", "optimizer"]
    fwd, bwd, optm = res.memory_by_phase
    logits_mb = 2 * 32 * 50257 * 4 / 2**20
    assert fwd["peak_extra_mb"] >= logits_mb  # the logits alone are live at the end of forward
    # first step: AdamW allocates its two moments (8 bytes per parameter)
    n = sum(p.numel() for p in model.parameters())
    assert optm["end_mb"] - optm["start_mb"] >= 0.9 * 8 * n / 2**20 - 4 * n / 2**20  # + moments - freed grads
    assert res.top_ops and res.top_ops[0]["self_ms"] >= res.top_ops[-1]["self_ms"]
    assert abs(sum(r["self_pct"] for r in res.top_ops)) <= 100.0 + 1e-6


def test_the_recorded_commit_says_when_the_code_differs_from_it(tmp_path, monkeypatch):
    """A bench or tuning JSON, and a run's report, record the commit their numbers came from; measured on a
    modified checkout they named the bare commit (docs/perf.md had to say so by hand). `-dirty` as git
    describe writes it, for changed tracked files (an untracked file changes no code that ran)."""
    import subprocess

    from rookworld_lib.lab import places

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "code.py")
    git("commit", "-qm", "one")
    monkeypatch.setattr(places, "REPO_ROOT", tmp_path)
    head = git("rev-parse", "--short", "HEAD")
    (tmp_path / "notes.txt").write_text("untracked")
    assert places.git_commit() == head == perf.environment_info("cpu")["git_commit"]
    (tmp_path / "code.py").write_text("x = 2\n")
    assert places.git_commit() == f"{head}-dirty" == perf.environment_info("cpu")["git_commit"]
    monkeypatch.setattr(places, "REPO_ROOT", tmp_path / "not-a-checkout")
    assert places.git_commit() is None


def test_environment_info_is_json():
    info = perf.environment_info("cpu")
    assert info["torch"] == torch.__version__ and info["device_type"] == "cpu"
    json.dumps(info)


def test_profile_phases_drops_kineto_usdt_lines_and_keeps_other_stderr(capfd):
    def step():  # C-level stderr written while profiling: a real line must survive
        os.write(2, b"a real warning\n")
        torch.ones(3).add_(1)

    perf.profile_phases(step, device="cpu")
    err = capfd.readouterr().err
    assert "a real warning" in err and "USDT:" not in err


def test_the_measured_peak_is_the_best_repeats_rate_of_an_n_cubed_matmul(monkeypatch):
    # an n x n matmul is 2 n^3 FLOPs (one multiply and one add per term), as torch's FlopCounterMode counts
    from torch.utils.flop_counter import FlopCounterMode

    a = torch.randn(256, 256)
    with FlopCounterMode(display=False) as counter:
        a @ a
    assert counter.get_total_flops() == 2 * 256**3
    # the best of the repeats counts (1 s of [1, 2, 3]): 2e9 FLOPs in 1 s is 0.002 TFLOP/s
    monkeypatch.setattr(perf, "benchmark", lambda fn, **kw: perf.summarize_times([2.0, 1.0, 3.0]))
    assert perf.measure_peak_tflops("cpu", n=1000) == pytest.approx(0.002)


_PEAK = perf.Peak(device="NVIDIA H100 80GB HBM3", precision="bf16", table_tflops=989.4, measured_tflops=None)


def _one_timing_is_every_quantile():
    one = perf.summarize_times([0.25])
    assert (one.median_s, one.p10_s, one.p90_s, one.min_s, one.mean_s) == (0.25,) * 5


@pytest.mark.parametrize("call, match, boundary", [
    pytest.param(lambda: perf.summarize_times([]), r"^summarize_times: times is empty; it needs at least one timing$",
                 _one_timing_is_every_quantile, id="no-times"),
    pytest.param(lambda: perf.benchmark(lambda: None, warmup=-1), r"^benchmark needs warmup >= 0 and repeats >= 1, got -1, 10$",
                 lambda: perf.benchmark(lambda: None, warmup=0, repeats=1, sync=False), id="warmup-negative"),
    pytest.param(lambda: perf.benchmark(lambda: None, repeats=0), r"^benchmark needs warmup >= 0 and repeats >= 1, got 2, 0$",
                 None, id="repeats-0"),
    pytest.param(lambda: perf.mfu(1e12, float("inf"), _PEAK),  # a timer that never stopped: not "0% MFU"
                 r"^mfu needs positive, finite flops and seconds; got flops=1000000000000\.0, seconds=inf$",
                 lambda: perf.mfu(1e12, 1e-2, _PEAK), id="mfu-inf-seconds"),
    pytest.param(lambda: perf.mfu(0, 1.0, _PEAK), r"^mfu needs positive, finite flops and seconds; got flops=0, seconds=1\.0$",
                 None, id="mfu-zero-flops"),
    pytest.param(lambda: perf.table_peak("NVIDIA H100", "int8"), r"^precision must be one of \(.*'bf16'.*\), got 'int8'$",
                 lambda: perf.table_peak("NVIDIA H100", "bf16"), id="precision"),
])
def test_bad_timing_arguments_say_what_is_wrong(call, match, boundary):
    with pytest.raises(ValueError, match=match):
        call()
    if boundary is not None:
        boundary()  # the nearest good value passes the same check


# --- host facts off the usual Linux x86 path, and the JSON writer (a coverage audit) ---

def _fake_proc(monkeypatch, tmp_path, files: dict[str, str]):
    """perf reads /proc/<name> through `Path`: point each name at a file in tmp_path holding the given text."""
    from pathlib import Path

    real = {f"/proc/{name}": tmp_path / name for name in files}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    monkeypatch.setattr(perf, "Path", lambda p: real.get(str(p), Path(p)))


def test_cpu_facts_where_proc_cpuinfo_has_no_model_name_or_is_missing(monkeypatch, tmp_path):
    """ARM Linux lists no "model name" (and macOS has no /proc/cpuinfo): the field is None, the CPU is
    named by what `platform` knows, and no bf16 flags means no native bf16."""
    import platform

    arm = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm\nCPU implementer\t: 0x41\n"
    _fake_proc(monkeypatch, tmp_path, {"cpuinfo": arm})
    assert perf._cpuinfo("Features") == "fp asimd evtstrm"
    assert perf._cpuinfo("model name") is None
    assert perf.cpu_name() == (platform.processor() or platform.machine() or "unknown CPU")
    assert perf.cpu_native_bf16() is False
    (tmp_path / "cpuinfo").unlink()  # macOS
    assert perf._cpuinfo("model name") is None and perf._cpuinfo("Features") is None


def test_host_cpu_times_read_proc_stat_and_give_none_where_it_is_missing_or_unreadable(monkeypatch, tmp_path):
    """(busy, total) jiffies from /proc/stat's first line, idle and iowait (fields 4 and 5) not busy:
    100+0+50+800+50 = 1000 in all, 1000-800-50 = 150 busy. A machine without /proc/stat (macOS) or a line
    that is not numbers gives None, so the sampler leaves host_cpu_pct out instead of failing."""
    _fake_proc(monkeypatch, tmp_path, {"stat": "cpu  100 0 50 800 50\ncpu0 50 0 25 400 25\n"})
    assert perf._host_cpu_times() == (150.0, 1000.0)
    # a host running VMs: guest (9th) and guest_nice (10th) are counted again inside user and nice (proc(5)),
    # so they add nothing: user 100 nice 0 system 50 idle 800 iowait 50 irq 5 softirq 5 steal 10 = 1020, 170 busy
    (tmp_path / "stat").write_text("cpu  100 0 50 800 50 5 5 10 60 0\n")
    assert perf._host_cpu_times() == (170.0, 1020.0)
    (tmp_path / "stat").write_text("cpu  100 zero 50\n")
    assert perf._host_cpu_times() is None
    (tmp_path / "stat").unlink()
    assert perf._host_cpu_times() is None


def test_to_json_writes_results_devices_dtypes_and_paths_and_names_what_it_cannot(tmp_path):
    """to_json (`rookworld bench --out`): an object with as_dict() as that dict (a Timing with its spread,
    (3 - 1) / 2 = 1), a dataclass as its fields, a device, dtype or path as its text; anything else is a
    TypeError naming its type, and no file is written."""
    timing = perf.Timing(median_s=2.0, p10_s=1.0, p90_s=3.0, min_s=1.0, mean_s=2.0, times_s=(1.0, 2.0, 3.0))
    peak = perf.Peak(device="cpu", precision="fp32", table_tflops=None, measured_tflops=0.5)
    out = perf.to_json({"timing": timing, "peak": peak, "device": torch.device("cpu"), "dtype": torch.bfloat16,
                        "trace": tmp_path / "trace.json"}, tmp_path / "sub" / "result.json")
    assert json.loads(out.read_text()) == {
        "timing": {"median_s": 2.0, "p10_s": 1.0, "p90_s": 3.0, "min_s": 1.0, "mean_s": 2.0,
                   "times_s": [1.0, 2.0, 3.0], "spread": 1.0},
        "peak": {"device": "cpu", "precision": "fp32", "table_tflops": None, "measured_tflops": 0.5},
        "device": "cpu", "dtype": "torch.bfloat16", "trace": str(tmp_path / "trace.json")}
    for bad, name in ((object(), "object"), ({1, 2}, "set")):
        with pytest.raises(TypeError, match=rf"^cannot serialise {name}$"):
            perf.to_json({"x": bad}, tmp_path / "bad.json")
    assert not (tmp_path / "bad.json").exists()


# --- behaviours a mutation audit found unpinned (peak table, MFU edge, timing, sync, sampler, memory) ---

# Dense TFLOP/s as NVIDIA's data sheets and architecture whitepapers print them (the sparse figures halved):
# (fp32 CUDA-core, tf32, bf16, fp16). fp16 and bf16 run at one tensor-core rate, tf32 at half of it.
_DATA_SHEET = {
    "H100 SXM": (66.9, 494.7, 989.4, 989.4),
    "H100 PCIe": (51.2, 378.0, 756.0, 756.0),
    "H100 NVL": (60.0, 417.5, 835.5, 835.5),  # 1,671 sparse bf16 (835.0 here until 2026-11-30)
    "H200": (66.9, 494.7, 989.4, 989.4),
    "H200 NVL": (60.0, 417.5, 835.5, 835.5),
    "A100": (19.5, 156.0, 312.0, 312.0),
    "RTX 4090": (82.6, 82.6, 165.2, 165.2),
}


@pytest.mark.parametrize("key", sorted(_DATA_SHEET))
def test_each_peak_table_row_is_the_data_sheets_dense_figures(key):
    """Every precision of a table row is the data sheet's dense figure (a sparse 2x figure would halve MFU)."""
    fp32, tf32, bf16, fp16 = _DATA_SHEET[key]
    assert perf.PEAK_TFLOPS[key] == {"fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": fp16}


def test_every_peak_row_has_fp16_at_bf16s_rate_and_tf32_at_half_of_it():
    """Tensor cores of these GPUs multiply fp16 and bf16 at one rate and tf32 at half of it (data sheets),
    including the H100 NVL row; and the H100 NVL card is named by its own row, an A10/A40/L4 by none."""
    for key, row in perf.PEAK_TFLOPS.items():
        assert row["fp16"] == row["bf16"] and row["tf32"] == pytest.approx(row["bf16"] / 2, rel=1e-3), key
        assert row["fp32"] <= row["tf32"], key
    assert perf.table_entry("NVIDIA H100 NVL") == "H100 NVL"
    assert perf.PEAK_TFLOPS["H100 NVL"]["fp32"] == 60.0 and perf.PEAK_TFLOPS["H100 NVL"]["tf32"] == 417.5
    for other in ("NVIDIA A10", "NVIDIA A40", "NVIDIA L4"):
        assert perf.table_entry(other) is None, other


def test_mfu_of_exactly_the_peak_is_allowed():
    """mfu refuses only *above* 100%: 2 TFLOP in 1 s against a 2 TFLOP/s peak is an MFU of exactly 1."""
    peak = perf.Peak(device="cpu", precision="fp32", table_tflops=None, measured_tflops=2.0)
    assert perf.mfu(2e12, 1.0, peak).vs_measured == 1.0
    with pytest.raises(ValueError, match=r"^mfu needs positive, finite flops and seconds; got flops=inf, seconds=1\.0$"):
        perf.mfu(float("inf"), 1.0, _PEAK)  # an overflowed FLOP count: not an "impossible MFU" nor a number


def test_summarize_times_mean_is_the_mean_and_times_stay_in_call_order():
    """mean_s is the arithmetic mean ((3 + 1 + 8) / 3 = 4, the median 3) and times_s keeps the calls' order,
    so a drift over the repeats stays visible."""
    t = perf.summarize_times([3.0, 1.0, 8.0])
    assert (t.mean_s, t.median_s, t.min_s) == (4.0, 3.0, 1.0)
    assert t.times_s == (3.0, 1.0, 8.0)


def test_the_measured_peak_multiplies_at_the_documented_size_in_the_precisions_dtype(monkeypatch):
    """measure_peak_tflops times a 1024 x 1024 matmul on a CPU (its docstring), in bf16 for bf16, fp16 for
    fp16 and fp32 for fp32 and tf32; 2 * 1024^3 FLOPs in 1 s is 2.147e-3 TFLOP/s."""
    seen = {}

    def fake_benchmark(fn, **kwargs):
        seen["out"] = fn()
        return perf.summarize_times([1.0])

    monkeypatch.setattr(perf, "benchmark", fake_benchmark)
    assert perf.measure_peak_tflops("cpu", "fp32") == pytest.approx(2 * 1024**3 / 1e12)
    assert seen["out"].shape == (1024, 1024) and seen["out"].dtype == torch.float32
    for precision, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16), ("tf32", torch.float32)):
        perf.measure_peak_tflops("cpu", precision, n=8)
        assert seen["out"].dtype == dtype, precision


def test_benchmark_sync_waits_for_the_gpu_or_the_device_it_names(monkeypatch):
    """sync=True calls torch.cuda.synchronize once the GPU is initialised, sync=<device> synchronises that
    device: once after warm-up and once per timed call (here 1 + 2); sync=False waits for nothing."""
    cuda_syncs, device_syncs = [], []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: cuda_syncs.append(a))
    perf.benchmark(lambda: None, warmup=1, repeats=2, sync=True)
    assert len(cuda_syncs) == 3
    perf.benchmark(lambda: None, warmup=1, repeats=2, sync=False)
    assert len(cuda_syncs) == 3
    monkeypatch.setattr(perf, "synchronize", lambda device: device_syncs.append(device))
    perf.benchmark(lambda: None, warmup=1, repeats=2, sync="cuda:1")
    assert device_syncs == [torch.device("cuda:1")] * 3


def test_the_sampler_gives_each_intervals_cpu_shares_and_a_summary_of_mean_and_max(monkeypatch):
    """Driven by fake clocks: process_cpu_pct is CPU seconds over wall seconds of each interval (0.5/1 = 50%,
    1.5/1 = 150%, 0); host_cpu_pct the interval's busy jiffies over its total ((150-0)/(1000-0) = 15%,
    (450-150)/(1600-1000) = 50%), left out where the total did not advance; the summary's mean and max skip
    the timestamp."""
    import types

    util = perf.UtilizationSampler(interval_s=0)
    walls, cpus = iter([0.0, 1.0, 2.0, 3.0]), iter([0.0, 0.5, 2.0, 2.0])
    hosts = iter([(0.0, 0.0), (150.0, 1000.0), (450.0, 1600.0), (450.0, 1600.0)])

    def host():
        if len(util.samples) == 2:  # the fourth reading: this interval's sample is the last
            util._stop.set()
        return next(hosts)

    monkeypatch.setattr(perf, "time", types.SimpleNamespace(perf_counter=lambda: next(walls), process_time=lambda: next(cpus)))
    monkeypatch.setattr(perf, "_host_cpu_times", host)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    util._last = util._read()  # what __enter__ reads
    util._run()  # the thread's loop, run here
    assert [s["process_cpu_pct"] for s in util.samples] == [50.0, 150.0, 0.0]
    assert [s.get("host_cpu_pct") for s in util.samples] == [15.0, 50.0, None]
    assert util.summary() == {"n_samples": 3, "interval_s": 0, "host_cpu_pct": {"mean": 32.5, "max": 50.0},
                              "process_cpu_pct": {"mean": pytest.approx(200 / 3), "max": 150.0}}


class _Event:
    """The parts of a kineto event _memory_by_phase reads."""

    def __init__(self, name, start, end=0, nbytes=0, device="DeviceType.CPU"):
        self._name, self._start, self._end, self._nbytes, self._device = name, start, end, nbytes, device

    def name(self):
        return self._name

    def start_ns(self):
        return self._start

    def end_ns(self):
        return self._end

    def nbytes(self):
        return self._nbytes

    def device_type(self):
        return self._device


def test_memory_by_phase_counts_the_devices_live_bytes_from_the_profiles_start():
    """1 MiB allocated before the phase, then +3, -2, +0.5 MiB inside it (a CUDA allocation is another
    device's): start 1, peak 4, end 2.5, peak_extra 3 MiB; a later phase starts from what is still live."""
    import types

    mib = 2**20
    events = [_Event("[memory]", 0, nbytes=mib), _Event(perf.PHASE_PREFIX + "forward", 10, 20),
              _Event("[memory]", 12, nbytes=3 * mib), _Event("[memory]", 13, nbytes=100 * mib, device="DeviceType.CUDA"),
              _Event("[memory]", 15, nbytes=-2 * mib), _Event("[memory]", 18, nbytes=mib // 2),
              _Event(perf.PHASE_PREFIX + "optimizer", 30, 40), _Event("[memory]", 35, nbytes=-mib)]
    prof = types.SimpleNamespace(profiler=types.SimpleNamespace(kineto_results=types.SimpleNamespace(events=lambda: events)))
    assert perf._memory_by_phase(prof, "cpu") == [
        {"phase": "forward", "start_mb": 1.0, "peak_mb": 4.0, "end_mb": 2.5, "peak_extra_mb": 3.0},
        {"phase": "optimizer", "start_mb": 2.5, "peak_mb": 2.5, "end_mb": 1.5, "peak_extra_mb": 0.0}]
    assert perf._memory_by_phase(types.SimpleNamespace(), "cpu") == []  # profiler internals moved


def test_cpu_native_bf16_reads_either_bf16_flag(monkeypatch, tmp_path):
    """AVX512-BF16 or AMX-BF16 in /proc/cpuinfo's flags means native bf16; AVX-512 alone does not."""
    for flags, native in (("fpu avx512f avx512_bf16", True), ("fpu avx512f amx_bf16 amx_tile", True), ("fpu avx512f", False)):
        _fake_proc(monkeypatch, tmp_path, {"cpuinfo": f"processor\t: 0\nflags\t\t: {flags}\n"})
        assert perf.cpu_native_bf16() is native, flags


def test_tensor_bytes_and_the_gpu_memory_peak_in_mib(monkeypatch):
    """tensor_bytes is elements x element size (3 fp32 + 2 bf16 = 16 bytes); max_memory_mb is CUDA's peak in
    MiB (3 * 2^20 bytes = 3.0), None on a CPU."""
    assert perf.tensor_bytes([torch.zeros(3), torch.zeros(2, dtype=torch.bfloat16)]) == 16
    assert perf.max_memory_mb("cpu") is None
    monkeypatch.setattr(perf, "resolve_device", lambda device: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * 2**20)
    assert perf.max_memory_mb("cuda") == 3.0
