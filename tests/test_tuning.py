"""The tuning matrix: loss parity catches result-changing rows; unsupported rows are reported."""

import json
from dataclasses import replace

import pytest
import torch

from rookworld_lib.lab import perf, tuning
from rookworld_lib.core.model import GPT, GPTConfig
from rookworld_lib.core.train_step import TrainStep
from rookworld_lib.core.train_utils import decay_groups, setup_runtime

# Small enough for CI: tiny model, 2 x 16 tokens, 3 steps.
BASE = tuning.TuneConfig(model="tiny", batch_size=2, seq_len=16, steps=3, timed_from=1, device="cpu")


@pytest.fixture(scope="module")
def matrix():
    variants = [
        tuning.Variant("baseline", "baseline"),
        # a planted change that alters the result: 30x the learning rate
        tuning.Variant("planted-lr", "lr", {"lr": 0.03}),
        # changes that must not alter the result
        tuning.Variant("attn_impl=math", "attn_impl", {"attn_impl": "math"}),
        tuning.Variant("pad_vocab_to_multiple=64", "pad_vocab_to_multiple", {"pad_vocab_to_multiple": 64}),
        tuning.Variant("grad_accum=2", "grad_accum", {"grad_accum": 2}),
        tuning.Variant("gradient_checkpointing=True", "gradient_checkpointing", {"gradient_checkpointing": True}),
        tuning.Variant("optimizer=fused", "optimizer", {"optimizer": "fused"}),
        tuning.Variant("batch_size=4", "batch_size", {"batch_size": 4}, expect_parity=False),
        # unsupported here: reported, not dropped
        tuning.Variant("precision=tf32", "precision", {"precision": "tf32"}),
        tuning.Variant("offload_optimizer=True", "offload_optimizer", {"offload_optimizer": True}),
        tuning.Variant("grad_accum=3", "grad_accum", {"grad_accum": 3}),
    ]
    return tuning.run_matrix(BASE, variants, profile_memory=False, progress=False, repeat_baseline=True)


def test_planted_change_is_caught(matrix):
    planted = matrix.row("planted-lr")
    assert planted["status"] == "ok"
    assert planted["changes_result"] is True
    assert abs(planted["loss_delta"]) > matrix.tolerance
    assert "planted-lr" in matrix.flagged()


@pytest.mark.parametrize("name", ["attn_impl=math", "pad_vocab_to_multiple=64", "grad_accum=2",
                                  "gradient_checkpointing=True", "optimizer=fused"])
def test_equivalent_rows_keep_the_result(matrix, name):
    row = matrix.row(name)
    assert row["status"] == "ok", row["reason"]
    assert row["changes_result"] is False
    assert abs(row["loss_delta"]) < 1e-3  # all fp32: equal up to rounding
    assert name not in matrix.flagged()


def test_repeated_baseline_reproduces_the_loss(matrix):
    row = matrix.row("baseline (repeat)")
    assert row["status"] == "ok" and row["loss_delta"] == 0.0 and row["speedup"] > 0


def test_rows_with_different_data_are_not_flagged(matrix):
    row = matrix.row("batch_size=4")
    assert row["status"] == "ok" and row["expect_parity"] is False
    assert "batch_size=4" not in matrix.flagged()
    # the table a user reads says so too: its loss is not compared, so it is neither CHANGED nor same
    assert matrix.table().loc["batch_size=4", "result"] == "n/a (other data)"
    assert matrix.table().loc["planted-lr", "result"] == "CHANGED"


def test_unsupported_rows_are_reported_with_reasons(matrix):
    assert "no CPU equivalent" in matrix.row("precision=tf32")["reason"]
    assert "CPU memory" in matrix.row("offload_optimizer=True")["reason"]
    assert "micro-batches" in matrix.row("grad_accum=3")["reason"]
    for name in ("precision=tf32", "offload_optimizer=True", "grad_accum=3"):
        assert matrix.row(name)["status"] == "skipped"
    assert len(matrix.rows) == 12  # nothing silently dropped (11 variants + the repeated baseline)



def test_a_row_too_long_for_the_model_a_crash_and_a_non_finite_loss_are_rows_that_say_why(monkeypatch):
    """Nothing is dropped from the matrix: a sequence longer than the model's context is skipped naming
    both lengths; a step that raises is a failed row naming the exception; a loss that goes non-finite is
    a failed row listing the losses; an MFU above 100% is a failed row naming it (it ended the matrix)."""
    real = tuning._train

    def train(step, cfg, batches, profile, trace_path):
        if cfg.lr == 0.5:
            raise RuntimeError("boom")
        out = real(step, cfg, batches, profile, trace_path)
        if cfg.lr == 0.9:  # a step timed impossibly fast: above 100% of any peak, even re-measured
            return {**out, "step_time_s": 1e-12}
        return {**out, "losses": [*out["losses"][:-1], float("nan")]} if cfg.lr == 0.7 else out

    monkeypatch.setattr(tuning, "_train", train)
    block = GPTConfig.preset("tiny").block_size
    base = replace(BASE, steps=2)
    result = tuning.run_matrix(base, [tuning.Variant("baseline", "baseline"),
                                      tuning.Variant("too long", "seq_len", {"seq_len": block + 1}, expect_parity=False),
                                      tuning.Variant("crash", "lr", {"lr": 0.5}), tuning.Variant("nan", "lr", {"lr": 0.7}),
                                      tuning.Variant("mfu", "lr", {"lr": 0.9}), tuning.Variant("after", "lr", {"lr": 0.1})],
                               profile_memory=False, progress=False)
    # an impossible MFU (a wrong count or a peak measured in a busy moment) fails its row, not the matrix
    assert [r["status"] for r in result.rows] == ["ok", "skipped", "failed", "failed", "failed", "ok"]
    assert result.row("mfu")["reason"].startswith("MFUError: MFU ") and "of the measured peak" in result.row("mfu")["reason"]
    assert result.row("too long")["reason"] == f"seq_len {block + 1} exceeds the tiny model's block_size {block}"
    assert tuning.unsupported_reason(replace(base, seq_len=block), torch.device("cpu")) is None  # exactly the context fits
    assert result.row("crash")["reason"] == "RuntimeError: boom"
    assert result.row("nan")["reason"].startswith("non-finite loss [") and result.row("nan")["reason"].endswith("nan]")


def test_a_rows_speed_and_mfu_are_its_timed_steps_median(monkeypatch):
    """The row's speed from known step times (the clock replaced), each figure worked out here: the
    median of the timed steps, warm-up steps untimed, tokens over it, FLOPs over it against the peak."""
    calls = []

    def timed(fn, warmup, repeats, sync):
        calls.append((warmup, repeats))
        for _ in range(warmup + repeats):
            fn()
        return perf.summarize_times([0.3, 0.1, 0.2, 0.9])  # median 0.25 (linear interpolation)

    monkeypatch.setattr(tuning.perf, "benchmark", timed)
    peak = perf.Peak("cpu", "fp32", table_tflops=None, measured_tflops=1.0)
    row = tuning.run_config(replace(BASE, steps=5, timed_from=1), peaks={"fp32": peak}, profile_memory=False)
    assert calls == [(1, 4)] and len(row["losses"]) == 5
    flops = perf.flops_per_token(BASE.model_config(), 16, "train") * 2 * 16  # checked against FlopCounterMode
    assert (row["step_time_s"], row["step_time_p10_s"]) == (pytest.approx(0.25), pytest.approx(0.13))
    assert row["tokens_per_s"] == pytest.approx(2 * 16 / 0.25) and row["flops_per_step"] == flops
    assert row["achieved_tflops"] == pytest.approx(flops / 0.25 / 1e12)
    assert row["mfu_measured"] == pytest.approx(flops / 0.25 / 1e12 / 1.0) and row["mfu_table"] is None


def test_rows_carry_speed_mfu_and_memory(matrix):
    base = matrix.row("baseline")
    assert base["speedup"] == 1.0 and base["loss_delta"] == 0.0
    assert base["flops_per_step"] == perf.flops_per_token(BASE.model_config(), BASE.seq_len, "train") * 2 * 16
    for row in matrix.ok_rows():
        assert row["tokens_per_s"] > 0 and row["step_time_s"] > 0
        assert row["step_time_p10_s"] <= row["step_time_s"] <= row["step_time_p90_s"]
        # tokens over the median step time; above 1 is faster than the baseline; a train step's FLOPs (forward
        # and backward: perf.flops_per_token's "train", checked against FlopCounterMode in test_perf)
        assert row["tokens_per_s"] == pytest.approx(row["tokens_per_step"] / row["step_time_s"])
        assert row["speedup"] == pytest.approx(row["tokens_per_s"] / base["tokens_per_s"])
        assert row["achieved_tflops"] == pytest.approx(row["flops_per_step"] / row["step_time_s"] / 1e12)
        assert 0 < row["mfu_measured"] <= 1
        assert row["mfu_table"] is None  # CPU: no data-sheet peak
        assert len(row["losses"]) == BASE.steps
    assert base["tokens_per_step"] == 2 * 16
    json.dumps(matrix.as_dict())
    table = matrix.table()  # for people: every row, rounded strings, no NaN; a skipped row shows its reason only
    assert list(table.index) == [r["name"] for r in matrix.rows] and not table.isna().any().any()
    assert table.loc["baseline", "vs baseline"] == "1.00x" and table.loc["baseline", "result"] == "same"
    for r in matrix.rows:
        shown = table.loc[r["name"]]
        if r["status"] != "ok":
            assert shown["note"] == r["reason"] and shown.drop(["status", "note"]).eq("").all()
        else:
            assert shown["tokens/s"] == f"{r['tokens_per_s']:,.0f}" and "e" not in shown["ms/step (median)"]
            # MFU over the measured matmul peak of the row's precision, which it names
            assert shown["MFU (measured peak)"] == f"{100 * r['mfu_measured']:.2g}% of {r['peak_measured_tflops']:.3g} TFLOP/s"
    assert "MFU (data-sheet peak)" not in table  # a CPU has none: no column of n/a
    sheet = tuning.MatrixResult(matrix.baseline, [{**r, "mfu_table": 0.25} if r["status"] == "ok" else r
                                                  for r in matrix.rows], matrix.tolerance, {"device": "cuda"}, {}, {})
    assert sheet.table().loc["baseline", "MFU (data-sheet peak)"] == "25%"


def test_scaling_and_figures(matrix):
    pts = matrix.scaling("batch_size")
    assert [p["value"] for p in pts] == [2, 4]
    for p in pts:  # a batch of `value` rows of seq_len tokens per median step
        assert p["tokens_per_s"] == pytest.approx(p["value"] * BASE.seq_len / p["step_time_s"])
    assert len(tuning.speedup_figure(matrix).data) == 1
    # a line each for step time and tokens/s per variable, and the baseline's repeat (run last) beside each
    assert [t.legendgroup for t in tuning.scaling_figure(matrix).data] == ["time", "tps", "repeat", "repeat"] * 2
    layout = tuning.scaling_figure(matrix).layout  # the log x axes say so
    assert [layout[f"xaxis{i}"].title.text for i in (3, 4)] == ["batch size (log scale)", "seq len (log scale)"]


def test_run_config_profiles_memory_by_phase(tmp_path):
    """The state a row holds, in MiB: fp32 parameters (4 bytes each, the tied head once, counted by torch),
    AdamW's two moments twice that; a CPU's peak is that state plus the profiled step's highest phase."""
    row = tuning.run_config(replace(BASE, steps=2, timed_from=1), trace_path=tmp_path / "t.json")
    assert row["status"] == "ok"
    assert [m["phase"] for m in row["memory_by_phase"]] == ["forward", "backward", "optimizer"]
    assert row["peak_mem_mb"] > row["state_mb"]["params_mb"]
    n = sum(p.numel() for p in GPT(GPTConfig.preset("tiny")).parameters())
    assert row["state_mb"]["params_mb"] == pytest.approx(4 * n / 2**20)
    assert row["state_mb"]["optimizer_mb"] == pytest.approx(2 * 4 * n / 2**20)
    step_peak = max(m["peak_mb"] for m in row["memory_by_phase"])
    assert row["peak_mem_mb"] == pytest.approx(3 * 4 * n / 2**20 + step_peak)
    assert row["top_ops"] and (tmp_path / "t.json").exists()


def test_default_variants_cover_the_issue_list():
    variants = tuning.default_variants(tuning.TuneConfig(), allow_compile=False)
    variables = {v.variable for v in variants}
    assert variables >= {"baseline", "precision", "compile", "batch_size", "seq_len", "attn_impl", "optimizer",
                         "pad_vocab_to_multiple", "gradient_checkpointing", "grad_accum", "offload_optimizer"}
    compile_rows = [v for v in variants if v.variable == "compile"]
    assert {v.overrides["compile"] for v in compile_rows} == {"default", "max-autotune"}
    assert all(v.skip_reason for v in compile_rows)
    # batch size and sequence length halved and doubled (4 -> 2, 8; 64 -> 32, 128): other data, so not
    # parity-checked; every other row is
    shape = {(v.variable, v.overrides[v.variable]) for v in variants if v.variable in ("batch_size", "seq_len")}
    assert shape == {("batch_size", 2), ("batch_size", 8), ("seq_len", 32), ("seq_len", 128)}
    assert all(v.expect_parity is (v.variable not in ("batch_size", "seq_len")) for v in variants)


def test_cpu_offload_adamw_matches_adamw():
    """The offloaded AdamW steps as torch's AdamW, also when a parameter has no gradient in a step
    (torch's skips it there: its moments do not move it)."""
    torch.manual_seed(0)
    a = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_size=300))
    b = GPT(a.config)
    b.load_state_dict(a.state_dict())
    oa = torch.optim.AdamW(decay_groups(a, 0.1), lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    ob = tuning.CPUOffloadAdamW(decay_groups(b, 0.1), lr=1e-2)
    x = torch.randint(0, 300, (2, 17))
    for step in range(4):
        for m, o in ((a, oa), (b, ob)):
            from rookworld_lib.core.model import lm_loss

            lm_loss(m(x[:, :-1]), x[:, 1:]).backward()
            if step == 2:  # a parameter this step's loss did not reach
                m.transformer.ln_f.weight.grad = None
            o.step()
            o.zero_grad(set_to_none=True)
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6, msg=n)


def test_padded_vocab_gets_the_same_initial_weights():
    state = tuning.initial_state(BASE)
    padded = GPT(GPTConfig.preset("tiny", pad_vocab_to_multiple=64))
    tuning.load_initial_state(padded, state)
    wte = padded.transformer.wte.weight
    assert wte.shape[0] == 50304
    torch.testing.assert_close(wte[:50257], state["transformer.wte.weight"])
    assert wte[50257:].abs().sum() == 0


def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="TuneConfig.precision"):
        tuning.TuneConfig(precision="fp8")
    with pytest.raises(ValueError, match="TuneConfig.compile"):
        tuning.TuneConfig(compile="reduce-overhead")
    with pytest.raises(ValueError, match="TuneConfig.timed_from"):
        tuning.TuneConfig(steps=2, timed_from=2)
    with pytest.raises(ValueError, match="TuneConfig.model"):
        tuning.TuneConfig(model="gpt5")


def test_random_batches_are_seeded_and_shifted():
    batches = tuning.random_batches(2, batch_size=3, seq_len=10, seed=1)
    x, y = batches[1]
    assert x.shape == y.shape == (3, 10)
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert torch.equal(tuning.random_batches(2, 3, 10, seed=1)[0][0], batches[0][0])


def test_each_step_trains_on_the_next_of_the_cycled_batches(monkeypatch):
    """The n_batches seeded batches are cycled step by step: with 2 batches and 3 steps the steps see
    batch 0, 1, 0 (random_batches' order)."""
    seen, real = [], TrainStep.__call__

    def record(self, x, y):
        seen.append(x.clone())
        return real(self, x, y)

    monkeypatch.setattr(TrainStep, "__call__", record)
    cfg = replace(BASE, steps=3, timed_from=1, n_batches=2)
    row = tuning.run_config(cfg, peaks={"fp32": perf.Peak("cpu", "fp32", None, 1e3)}, profile_memory=False)
    assert row["status"] == "ok"
    batches = tuning.random_batches(2, 2, 16, seed=0)
    assert len(seen) == 3 and all(torch.equal(s, batches[i][0]) for s, i in zip(seen, (0, 1, 0)))


def test_mfu_recheck_remeasures_a_low_peak():
    peaks = {"fp32": perf.Peak(device="cpu", precision="fp32", table_tflops=None, measured_tflops=1e-9)}
    real = perf.measure_peak_tflops("cpu", "fp32", n=256)
    util = tuning.checked_mfu(real * 1e12 * 0.01, 1.0, peaks, torch.device("cpu"), "fp32")
    assert 0 < util.vs_measured <= 1
    assert peaks["fp32"].measured_tflops > 1e-9


def test_mfu_recheck_keeps_the_higher_peak(monkeypatch):
    """An impossible MFU re-measures the peak and keeps the larger of the two: a re-measurement lower than
    the first (0.5 < 1.0 TFLOP/s) leaves the peak at 1.0 for later rows; a higher one (4.0) replaces it, and
    2 TFLOP/s is then 50% of it."""
    cpu = torch.device("cpu")
    peaks = {"fp32": perf.Peak("cpu", "fp32", table_tflops=None, measured_tflops=1.0)}
    monkeypatch.setattr(tuning.perf, "measure_peak_tflops", lambda *a, **k: 0.5)
    with pytest.raises(perf.MFUError):
        tuning.checked_mfu(2e12, 1.0, peaks, cpu, "fp32")
    assert peaks["fp32"].measured_tflops == 1.0
    monkeypatch.setattr(tuning.perf, "measure_peak_tflops", lambda *a, **k: 4.0)
    assert tuning.checked_mfu(2e12, 1.0, peaks, cpu, "fp32").vs_measured == 0.5
    assert peaks["fp32"].measured_tflops == 4.0


def test_train_step_accepts_a_compiled_model_without_calling_it():
    # torch.compile's wrapper proxies len() to the module, so `compiled or model` raised TypeError
    # on a GPU run; building the step must not touch the wrapper's truth value.
    model = GPT(GPTConfig.preset("tiny"))
    compiled = torch.compile(model)  # lazy: nothing is compiled until the first call
    step = TrainStep(model, tuning.make_optimizer(model, tuning.TuneConfig()), setup_runtime("cpu", "fp32"),
                     forward_model=compiled)
    assert step.forward_model is compiled


def _timed(tps_low, tps_high):
    """A row's timing: the tokens/s interval [tps_low, tps_high] from the p90 and p10 step times of 100 tokens."""
    return {"tokens_per_step": 100, "step_time_p90_s": 100 / tps_low, "step_time_p10_s": 100 / tps_high}


def test_a_speed_difference_inside_the_baselines_spread_or_its_repeats_is_noise():
    base, repeat = _timed(90, 110), _timed(150, 170)  # a repeat 1.6x faster: this machine's run-to-run noise
    assert tuning._tokens_per_s_overlap(_timed(120, 130), [base, repeat])  # between them: noise
    assert not tuning._tokens_per_s_overlap(_timed(120, 130), [base])  # without the repeat it would not be
    assert not tuning._tokens_per_s_overlap(_timed(200, 220), [base, repeat])  # faster than both: real
    # a baseline and a repeat that disagree say that the host drifted, in the notebook and on the figure
    named = [{**base, "name": "baseline", "status": "ok", "tokens_per_s": 100.0},
             {**repeat, "name": "baseline (repeat)", "status": "ok", "tokens_per_s": 160.0, "speedup": 1.6}]
    result = tuning.MatrixResult(None, named, 0.05, {}, {}, {"host_cpu_pct": {"mean": 97.8, "max": 100.0}})
    assert result.drift() == ("host speed drifted: the baseline's repeat ran at 1.60x the baseline, outside both "
                              "p10-p90 intervals (host CPU 98% busy on average); speed-ups in this run are no surer "
                              "than that")
    named[1].update(_timed(105, 115), tokens_per_s=110.0, speedup=1.1)
    assert result.drift() is None  # within the baseline's own spread


def test_run_matrix_verdicts_from_rows_of_known_numbers(monkeypatch):
    """run_matrix's verdicts, each worked out by hand from canned rows (run_config replaced): the baseline is
    put first when the list lacks it; the speed-up is tokens/s over the baseline's; loss_delta is the row's
    loss minus the baseline's, and a loss lower by more than the tolerance changes the result too; the noise
    spans the baseline and its repeat; a row on other data that changes the loss is not flagged."""
    def row(name, variable, tps_low, tps_high, tps, loss, parity=True):
        return {"name": name, "variable": variable, "status": "ok", "expect_parity": parity,
                "tokens_per_s": tps, "final_loss": loss, **_timed(tps_low, tps_high)}

    canned = {"warm-up": row("warm-up", "baseline", 1, 2, 1.5, 0.0),
              "baseline": row("baseline", "baseline", 90, 110, 100.0, 2.0),
              "lower": row("lower", "lr", 300, 320, 310.0, 1.9),
              "mid": row("mid", "attn_impl", 120, 130, 125.0, 2.0),
              "other data": row("other data", "batch_size", 400, 420, 410.0, 2.5, parity=False),
              "baseline (repeat)": row("baseline (repeat)", "baseline-repeat", 150, 170, 160.0, 2.0)}
    monkeypatch.setattr(tuning, "run_config", lambda cfg, v, **kw: dict(canned[v.name]))
    variants = [tuning.Variant("lower", "lr", {"lr": 0.03}), tuning.Variant("mid", "attn_impl", {"attn_impl": "math"}),
                tuning.Variant("other data", "batch_size", {"batch_size": 4}, expect_parity=False)]
    result = tuning.run_matrix(BASE, variants, progress=False, repeat_baseline=True)
    assert [r["name"] for r in result.rows] == ["baseline", "lower", "mid", "other data", "baseline (repeat)"]
    lower, mid = result.row("lower"), result.row("mid")
    assert lower["speedup"] == pytest.approx(3.1) and mid["speedup"] == pytest.approx(1.25)
    assert lower["loss_delta"] == pytest.approx(-0.1) and lower["changes_result"] is True
    assert mid["within_noise"] is True and lower["within_noise"] is False  # between the baseline and its repeat
    assert result.row("other data")["changes_result"] is True and result.flagged() == ["lower"]


@pytest.mark.parametrize("flags, capability, native", [
    ("fpu sse avx2 fma", "AVX2", False),
    ("fpu avx2 avx512f avx512bw avx512_vnni", "AVX512", False),  # AVX-512 without BF16: oneDNN emulates it
    ("fpu avx2 avx512f avx512bw avx512_bf16", "AVX512", True),  # e.g. AMD Zen 4, Intel Cooper Lake
    ("fpu avx512f amx_tile amx_bf16", "AVX512", True),  # Intel Sapphire Rapids
])
def test_cpu_bf16_gate_reads_the_cpu_flags(monkeypatch, flags, capability, native):
    monkeypatch.setattr(perf, "_cpuinfo", lambda key: {"flags": flags, "model name": "test CPU"}.get(key))
    monkeypatch.setattr(perf, "cpu_capability", lambda: capability)
    assert perf.cpu_native_bf16() is native
    reason = tuning.unsupported_reason(replace(BASE, precision="bf16"), torch.device("cpu"))
    assert (reason is None) is native
    if not native:
        assert f"this CPU ({capability}) has no native bf16 matmul" in reason


def test_the_matrix_takes_the_peak_it_is_given():
    """Notebook 04 prints a measured peak, then runs the matrix: the MFU columns are against that peak,
    not a second measurement (docs quoted one peak while the columns used another)."""
    peak = perf.Peak(device="cpu", precision="fp32", table_tflops=None, measured_tflops=1e3)  # far above any CPU
    result = tuning.run_matrix(BASE, [tuning.Variant("baseline", "baseline")], profile_memory=False, progress=False,
                               peaks={"fp32": peak})
    row = result.row("baseline")
    assert result.peaks["fp32"] is peak
    assert row["mfu_measured"] == pytest.approx(row["achieved_tflops"] / 1e3)


# --- refusals no other test reaches (a coverage audit), each against a hand-worked value ---

def test_a_compiled_row_on_a_cpu_without_a_cpp_compiler_is_skipped_with_the_reason(monkeypatch):
    """torch.compile on a CPU builds C++ kernels: with none of g++, c++ or clang++ on PATH the row is
    skipped saying so; any one of them is enough, and an uncompiled row never needs one."""
    cfg, cpu = replace(BASE, compile="default"), torch.device("cpu")
    monkeypatch.setattr(tuning.shutil, "which", lambda name: None)
    assert tuning.unsupported_reason(cfg, cpu) == "torch.compile on CPU needs a C++ compiler (g++/clang++), none found"
    assert tuning.unsupported_reason(BASE, cpu) is None  # compile="off"
    monkeypatch.setattr(tuning.shutil, "which", lambda name: "/usr/bin/clang++" if name == "clang++" else None)
    assert tuning.unsupported_reason(cfg, cpu) is None


def test_initial_weights_of_another_shape_are_refused_naming_the_tensor():
    """load_initial_state copies the baseline's weights into each row's model, padding the vocabulary
    rows only: a model of another width (64 -> 32 columns of the token embedding, its first tensor) or a
    smaller vocabulary (1000 rows < 50257) cannot take them, and the error names the tensor and shapes."""
    torch.manual_seed(0)
    state = {k: v.detach().clone() for k, v in GPT(GPTConfig(n_layer=1, n_head=2, n_embd=64, block_size=16)).named_parameters()}
    narrow = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, block_size=16))
    with pytest.raises(ValueError, match=r"^cannot map initial weights transformer\.wte\.weight \(50257, 64\) onto "
                                         r"\(50257, 32\)$"):
        tuning.load_initial_state(narrow, state)
    small_vocab = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=64, block_size=16, vocab_size=1000))
    with pytest.raises(ValueError, match=r"^cannot map initial weights transformer\.wte\.weight \(50257, 64\) onto "
                                         r"\(1000, 64\)$"):
        tuning.load_initial_state(small_vocab, state)


def test_an_impossible_mfu_against_a_table_only_peak_is_an_error_not_a_remeasurement():
    """A peak given without a measurement (get_peak(measure=False): the data sheet's only) cannot be
    re-measured upward, so 2 TFLOP/s against a 1 TFLOP/s sheet (200%) is the FLOP count's error, raised as
    perf.MFUError; the peak is left as given. Half the sheet's rate is 50% of it."""
    sheet = perf.Peak(device="NVIDIA H100 80GB HBM3", precision="bf16", table_tflops=1.0, measured_tflops=None)
    peaks = {"bf16": sheet}
    with pytest.raises(perf.MFUError, match=r"^MFU 200\.0% of the data-sheet peak \(2 TFLOP/s achieved vs 1 TFLOP/s on "
                                            r"NVIDIA H100 80GB HBM3, bf16\) is impossible"):
        tuning.checked_mfu(2e12, 1.0, peaks, torch.device("cpu"), "bf16")
    assert peaks == {"bf16": sheet}
    util = tuning.checked_mfu(0.5e12, 1.0, peaks, torch.device("cpu"), "bf16")
    assert (util.vs_table, util.vs_measured) == (0.5, None)
