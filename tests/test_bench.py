"""`rookworld bench`: runs at a tiny size and prints one JSON object last. Never asserts on speed."""

import json
import math
import sys
import types
from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

from rookworld_lib.core.model import GPTConfig  # noqa: E402
from rookworld_lib.core.train_utils import setup_runtime  # noqa: E402
from rookworld_lib.lab import bench, perf  # noqa: E402


def _positive_finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x) and x > 0


def test_quick_json_bench_at_tiny_size(capsys, monkeypatch):
    # Part (d) is the cpu profile's GRPO step (16 prompts x 4 samples x 72 tokens), twice per contender:
    # on the full GPT-2 vocabulary that alone took ~55 s here. The test checks that each part runs and
    # reports, not the numbers, so (d) runs one timed step per contender of a smaller step (the same code).
    cpu = bench.PROFILES["cpu"]
    small_step = replace(cpu.grpo, prompts_per_step=2, group_size=2, max_new_tokens=16, minibatch_size=4)
    monkeypatch.setattr(bench, "PROFILES", {**bench.PROFILES, "cpu": replace(cpu, grpo=small_step)})
    monkeypatch.setattr(bench, "QUICK", replace(bench.QUICK, grpo_steps=1))
    rc = bench.cli(["--quick", "--json", "--model", "tiny", "--repeats", "1", "--warmup", "0", "--no-trl"])
    assert rc == 0
    out = capsys.readouterr().out.strip().splitlines()
    result = json.loads(out[-1])  # the last line is the one JSON object
    for key in ("sampling_speedup_vs_transformers", "train_step_speedup_vs_transformers"):
        assert _positive_finite(result[key]), key
    ts, sm = result["train_step"], result["sampling"]
    for part in (ts, sm):
        for who in ("ours", "transformers"):
            assert _positive_finite(part[who]["tokens_per_s"])
            assert _positive_finite(part[who]["median_s"])
        # a speed-up above 1 means ours is faster: our rate over theirs (their time over ours)
        assert part["speedup"] == pytest.approx(part["ours"]["tokens_per_s"] / part["transformers"]["tokens_per_s"])
    assert ts["initial_logits_max_abs_diff"] < 1e-3  # same weights in both models
    assert ts["loss_impl"] == "fused"  # what SFT runs on a CPU (SFTConfig.loss_impl="auto")
    assert sm["generated_tokens"] == sm["rows"] * sm["new_tokens_per_row"]
    # decode TFLOP/s: each generated token's FLOPs at its own context (each prompt G times, tokens 1..L after
    # it) over the median time; the bench takes them at the mean context, so they agree to its rounding
    L, G = sm["new_tokens_per_row"], sm["rows"] // len(sm["prompt_lengths"])
    flops = lambda ctx: perf.flops_per_token(GPTConfig.preset("tiny"), ctx, "decode")  # noqa: E731
    slope = flops(2) - flops(1)  # FLOPs per token of context (attention): the same at every length
    assert flops(101) - flops(100) == slope
    exact = G * sum(flops(n + i) for n in sm["prompt_lengths"] for i in range(1, L + 1))
    implied = sm["ours"]["decode_tflops"] * sm["ours"]["median_s"] * 1e12
    assert abs(implied - exact) <= 0.5 * slope * sm["generated_tokens"] * (1 + 1e-9)
    assert len(result["load_average_before"]) == len(result["load_average"]) == 3
    assert bench.load_line(result).startswith("load average (1, 5, 15 min) before ")
    assert bench.load_line({**result, "utilization": {"host_cpu_pct": {"mean": 55.0, "max": 90.0}}}).endswith(
        "; all cores 55% busy on average while it ran")
    assert result["settings"]["model"] == "tiny"
    assert result["grpo_step"]["status"] == "skipped" and "--no-trl" in result["grpo_step"]["reason"]
    assert result["grpo_step_speedup_vs_trl"] is None
    assert result["environment"]["torch"]
    v = result["grpo_task_vocab"]
    assert _positive_finite(result["grpo_task_vocab_speedup"]) and v["task_tokens"] < 50257
    for part in (v["task"], v["full"]):
        assert _positive_finite(part["completions_per_s"]) and _positive_finite(part["median_s"])
    assert v["speedup"] == pytest.approx(v["task"]["completions_per_s"] / v["full"]["completions_per_s"])
    assert v["settings"]["prompts_per_step"] == 2 and v["settings"]["group_size"] == 2


def test_hf_tokenizer_matches_tiktoken():
    from rookworld_lib.core.tokenizer import get_tokenizer

    hf = bench.hf_gpt2_tokenizer()
    enc = get_tokenizer()
    for text in bench.grpo_prompt_texts(3) + [" M: e2e4 d2d4 E: 0.31 -0.2 B: e2e4<|endoftext|>"]:
        assert hf(text)["input_ids"] == enc.encode(text, allowed_special="all")


def test_bench_config_validation():
    with pytest.raises(ValueError, match="BenchConfig.repeats"):
        bench.BenchConfig(repeats=0)
    # the GPU shapes with a CPU preset (--model cpu-small on a CUDA machine): the message named no option
    with pytest.raises(ValueError, match=r"sequences of 1000 positions are longer than the tiny model's block_size 256: "
                                         r"give --model with 1000 positions or more \(gpt2: 1024\), or --quick"):
        bench.BenchConfig(model="tiny", train_seq_len=1000)
    # a sampled row is prompt and completion: 200 + 100 tokens exceed tiny's 256, 200 + 56 fit
    with pytest.raises(ValueError, match="block_size 256"):
        bench.BenchConfig(model="tiny", prompt_len=200, new_tokens=100)
    bench.BenchConfig(model="tiny", prompt_len=200, new_tokens=56)


def test_cli_rejects_unknown_model_and_negative_threads():
    with pytest.raises(SystemExit) as exc:
        bench.cli(["--model", "gpt5"])
    assert exc.value.code == 2
    for threads in ("-1", "257", str(10**20)):  # 10**20 overflowed torch's int64 with no option named
        with pytest.raises(ValueError, match=rf"^--threads must be from 0 to 256 \(torch CPU threads; 0 leaves them to torch\), got {threads}$"):
            bench.cli(["--threads", threads])


def test_grpo_step_against_trl(tmp_path, recwarn):
    """Needs trl (skipped without it): the GRPO comparison runs both trainers and reports what it timed,
    and turns TRL's activation checkpointing off under the name the installed transformers reads
    (transformers 5 warns on the old `gradient_checkpointing`)."""
    pytest.importorskip("trl")
    cfg = bench.BenchConfig(model="tiny", grpo_prompts=2, group_size=2, grpo_new_tokens=4, grpo_steps=2, device="cpu")
    bench.make_models(cfg, tmp_path, bench.perf.resolve_device("cpu"))  # writes the shared weights
    res = bench.bench_grpo(cfg, tmp_path, bench.perf.resolve_device("cpu"))
    assert not [str(w.message) for w in recwarn if "checkpointing" in str(w.message)]
    assert res["status"] == "ok", res.get("reason")
    assert (res["loss_type"], res["beta"], res["prompts_per_step"], res["group_size"]) == ("dapo", 0.0, 2, 2)
    for side in ("ours", "trl"):
        assert _positive_finite(res[side]["median_s"]) and res[side]["completions_per_s"] == pytest.approx(4 / res[side]["median_s"])
    assert res["speedup"] == pytest.approx(res["trl"]["median_s"] / res["ours"]["median_s"])
    assert 1 <= res["ours_completion_len_mean"] <= cfg.grpo_new_tokens


# --- the driver and the command's outputs, with the timed parts canned (no timing asserted) ---


def _canned_result(grpo_step: dict) -> dict:
    """A result as run_bench returns it, with numbers picked so that each printed figure is known by hand."""
    return {"settings": {"model": "tiny"}, "grpo_step": grpo_step,
            "train_step_speedup_vs_transformers": 1.234, "sampling_speedup_vs_transformers": 3.457,
            "grpo_step_speedup_vs_trl": None, "grpo_task_vocab_speedup": 6.17, "targets": dict(bench.TARGETS),
            "utilization": {"host_cpu_pct": {"mean": 42.4, "max": 90.0}},
            "load_average_before": [0.5, 1.0, 1.5], "load_average": [2.0, 2.25, 2.5], "wall_s": 12.5}


def test_cli_text_output_out_file_threads_and_sweep_flag(monkeypatch, tmp_path, capsys):
    """`rookworld bench` without --json prints one line per target (the speed-up to two decimals, or the
    GRPO comparison's status and reason where it has no speed-up) and the load line; --out writes the
    result object unchanged; --threads N sets torch's CPU threads before the bench runs; --rollout-sweep
    reaches run_bench. run_bench is canned: the lines below are worked out by hand from its numbers."""
    failed = {"status": "failed", "reason": "TRL GRPOTrainer failed: RuntimeError: boom"}
    canned = _canned_result(failed)
    seen = {}

    def fake_run_bench(cfg, progress=print, sweep=False):
        seen.update(cfg=cfg, sweep=sweep, threads=torch.get_num_threads())
        return canned

    monkeypatch.setattr(bench, "run_bench", fake_run_bench)
    before = torch.get_num_threads()
    want = 1 if before != 1 else 2  # a count other than the current one, so that setting it shows
    out = tmp_path / "results" / "bench.json"  # a directory that does not exist yet
    try:
        assert bench.cli(["--quick", "--device", "cpu", "--threads", str(want), "--out", str(out),
                          "--rollout-sweep"]) == 0
    finally:
        torch.set_num_threads(before)
    assert seen["threads"] == want, f"--threads {want}: torch ran the bench on {seen['threads']} threads"
    assert seen["sweep"] is True, "--rollout-sweep did not reach run_bench"
    # --quick: the QUICK shapes (batch 4 x 64 tokens), the TRL comparison on (no --no-trl), the device given
    assert (seen["cfg"].train_batch, seen["cfg"].train_seq_len, seen["cfg"].trl, seen["cfg"].device) == (4, 64, True, "cpu")
    assert capsys.readouterr().out.splitlines() == [
        "train step speedup vs transformers: 1.23x (target 1.5x)",
        "sampling speedup vs transformers: 3.46x (target 3.0x)",
        "grpo step speedup vs trl: failed (TRL GRPOTrainer failed: RuntimeError: boom) (target 5.0x)",
        "grpo task vocab speedup: 6.17x (target 5.0x)",
        "load average (1, 5, 15 min) before 0.50, 1.00, 1.50, after 2.00, 2.25, 2.50; "
        "all cores 42% busy on average while it ran",
    ]
    assert json.loads(out.read_text()) == canned, "--out must hold the result object, unchanged"


def test_the_training_race_refuses_two_models_that_differ():
    """Row (a) reported how far the two contenders' logits differ but raced them whatever it was: with one
    MLP weight of transformers' copy scaled by 5 it reported a speed-up between two different models."""
    import tempfile

    cfg = replace(bench.QUICK, model="tiny", repeats=1, warmup=0)
    with tempfile.TemporaryDirectory() as d:
        ours, theirs = bench.make_models(cfg, Path(d), torch.device("cpu"))
    with torch.no_grad():
        theirs.transformer.h[0].mlp.c_fc.weight.mul_(5)
    with pytest.raises(ValueError, match=r"^bench: the two contenders' logits differ by up to .+ \(> 0\.001 in fp32\)"):
        bench.bench_train_step(cfg, ours, theirs, setup_runtime("cpu", "fp32"))
    with torch.no_grad():  # NaN logits are no closer: a NaN difference is not <= the tolerance
        theirs.transformer.h[0].mlp.c_fc.weight[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"^bench: the two contenders' logits differ by up to nan "):
        bench.bench_train_step(cfg, ours, theirs, setup_runtime("cpu", "fp32"))


def test_the_sampling_race_refuses_unequal_work(monkeypatch):
    """Both samplers must generate rows x new tokens (1 prompt x 2 samples x 3 = 6): our sampler stopping one
    token short is refused, naming both counts. The models and our generate are stand-ins."""
    cfg = bench.BenchConfig(model="tiny", sample_prompts=1, group_size=2, prompt_len=4, new_tokens=3, repeats=1,
                            warmup=0, device="cpu")
    ours = types.SimpleNamespace(eval=lambda: None, config=None)
    theirs = types.SimpleNamespace(eval=lambda: None,
                             generate=lambda input_ids, **kw: torch.zeros(input_ids.size(0), input_ids.size(1) + 3))
    monkeypatch.setattr(bench, "generate", lambda model, prompts, scfg: types.SimpleNamespace(stats={"generated_tokens": 5}))
    with pytest.raises(RuntimeError, match=r"generated unequal work: \{'ours': 5, 'transformers': 6\}, expected 6"):
        bench.bench_sampling(cfg, ours, theirs, setup_runtime("cpu", "fp32"))


def test_rollout_prompts_span_half_to_full_length_the_first_longest():
    """rollout_prompts' docstring: lengths in [prompt_len // 2, prompt_len] (40: 20 to 40), the first the
    longest; 64 prompts reach below 30, so the whole range is drawn from."""
    lengths = [len(p) for p in bench.rollout_prompts(bench.BenchConfig(model="tiny", sample_prompts=64, prompt_len=40))]
    assert len(lengths) == 64 and lengths[0] == 40 and all(20 <= n <= 40 for n in lengths)
    assert min(lengths) < 30


def test_cli_refuses_an_out_it_cannot_write_before_the_bench_and_prints_before_writing(monkeypatch, tmp_path, capsys):
    """`--out` in a folder where no file can be made (/proc) ran the whole bench, then failed, and with --json
    printed nothing: minutes of timing lost. It is now refused first; and the result is printed before the
    file is written, so a write that fails later still leaves it on screen. --grpo-steps reaches the config."""
    monkeypatch.setattr(bench, "run_bench", lambda *a, **k: pytest.fail("the bench ran before --out was checked"))
    with pytest.raises(ValueError, match=r"^--out /proc/rw_bench\.json: cannot write there \(.+\); choose a directory"):
        bench.cli(["--quick", "--device", "cpu", "--out", "/proc/rw_bench.json"])
    with pytest.raises(ValueError, match=rf"^--out {tmp_path} is a directory; give the path of a JSON file$"):
        bench.cli(["--quick", "--device", "cpu", "--out", str(tmp_path)])
    canned, seen = _canned_result({"status": "skipped", "reason": "TRL comparison disabled (--no-trl)"}), {}
    monkeypatch.setattr(bench, "run_bench", lambda cfg, progress=print, sweep=False: seen.update(cfg=cfg) or canned)

    def full_disk(result, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(bench.perf, "to_json", full_disk)
    with pytest.raises(OSError, match="No space left"):
        bench.cli(["--quick", "--device", "cpu", "--json", "--grpo-steps", "7", "--out", str(tmp_path / "b.json")])
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == canned and seen["cfg"].grpo_steps == 7


def test_cli_threads_zero_leaves_torch_alone_and_json_goes_last(monkeypatch, capsys):
    """--threads 0 is torch's choice (the count is left as it was); with --json the progress lines go to
    stderr and stdout's last line is the result; no --rollout-sweep, no sweep; --no-trl turns TRL off."""
    canned = _canned_result({"status": "skipped", "reason": "TRL comparison disabled (--no-trl)"})
    seen = {}

    def fake_run_bench(cfg, progress=print, sweep=False):
        progress("[bench] a progress line")
        seen.update(cfg=cfg, sweep=sweep, threads=torch.get_num_threads())
        return canned

    monkeypatch.setattr(bench, "run_bench", fake_run_bench)
    before = torch.get_num_threads()
    try:
        assert bench.cli(["--quick", "--device", "cpu", "--threads", "0", "--json", "--no-trl"]) == 0
    finally:
        torch.set_num_threads(before)
    assert seen["threads"] == before and seen["sweep"] is False and seen["cfg"].trl is False
    cap = capsys.readouterr()
    assert cap.err == "[bench] a progress line\n"
    assert json.loads(cap.out.splitlines()[-1]) == canned and len(cap.out.splitlines()) == 1
    # without --quick, on a CPU: FULL's shapes (cpu-small, a training batch of 8 x 128 tokens)
    assert bench.cli(["--device", "cpu", "--json", "--no-trl"]) == 0
    assert (seen["cfg"].model, seen["cfg"].train_batch, seen["cfg"].train_seq_len) == ("cpu-small", 8, 128)


def test_run_bench_with_rollout_sweep_assembles_the_result(monkeypatch):
    """run_bench's driver with (a)-(d) canned and the rollout sweep real (tiny model, 2 new tokens): the
    top-level speed-ups are the parts' own, a failed TRL comparison leaves grpo_step_speedup_vs_trl None
    and its reason in the progress line, and the sweep times our sampler at the CPU's first two SWEEP_ROWS
    (shrunk here to 4 and 8 rows: 2 and 4 prompts x group 2; the real 64 and 256 took 5 s), dynamic and
    static decode, tokens/s = rows x 2 new tokens / median time."""
    def make_models(cfg, workdir, device):  # the weights rollout_sweep loads from the work directory
        torch.manual_seed(0)
        bench.GPT(GPTConfig.preset("tiny", dropout=0.0)).save_pretrained(workdir)
        return "ours", "theirs"

    def part(ours, theirs):
        return {"ours": {"tokens_per_s": ours}, "transformers": {"tokens_per_s": theirs}, "speedup": ours / theirs}

    monkeypatch.setattr(bench, "SWEEP_ROWS", (4, 8, 16, 32))
    monkeypatch.setattr(bench, "make_models", make_models)
    monkeypatch.setattr(bench, "bench_train_step", lambda cfg, ours, theirs, runtime: part(1000.4, 500.2))
    monkeypatch.setattr(bench, "bench_sampling", lambda cfg, ours, theirs, runtime: part(300.0, 100.0))
    monkeypatch.setattr(bench, "bench_grpo", lambda cfg, workdir, device: {
        "status": "failed", "reason": "TRL GRPOTrainer failed: RuntimeError: boom"})
    monkeypatch.setattr(bench, "bench_grpo_vocab", lambda cfg, device, profile: {
        "task": {"completions_per_s": 12.34}, "full": {"completions_per_s": 2.0}, "speedup": 6.17})
    # each sweep row's peak memory is its own: the allocator's high-water mark (CUDA's, faked here) that
    # part (a)'s training step left is reset before the row, not reported as the row's
    peak = {"mb": 16426.0}
    monkeypatch.setattr(bench.perf, "max_memory_mb", lambda device="auto": peak["mb"])
    monkeypatch.setattr(bench.perf, "reset_peak_memory", lambda device="auto": peak.update(mb=len(lines)))
    cfg = bench.BenchConfig(model="tiny", new_tokens=2, prompt_len=8, group_size=2, repeats=1, device="cpu")
    lines = []
    res = bench.run_bench(cfg, progress=lines.append, sweep=True)
    assert res["train_step_speedup_vs_transformers"] == 2.0 and res["sampling_speedup_vs_transformers"] == 3.0
    assert res["grpo_step_speedup_vs_trl"] is None and res["grpo_task_vocab_speedup"] == 6.17
    assert res["targets"] == bench.TARGETS and res["settings"]["model"] == "tiny"
    assert "[bench]     ours 1000 tok/s, transformers 500 tok/s, speedup 2.00x" in lines
    assert "[bench]     failed: TRL GRPOTrainer failed: RuntimeError: boom" in lines
    assert "[bench]     task 12.3 completions/s, full 2.0 completions/s, speedup 6.17x" in lines
    assert "[bench] rollout sweep: rows (4, 8) x 2 tokens, vocab padded to x1" in lines
    sweep = res["rollout_sweep"]
    assert [(r["rows"], r["decode"]) for r in sweep] == [(4, "dynamic"), (4, "static"), (8, "dynamic"), (8, "static")]
    assert res["rollout_sweep_pad_vocab_to_multiple"] == 1
    assert len({r["peak_memory_mb"] for r in sweep}) == 4 and 16426.0 not in {r["peak_memory_mb"] for r in sweep}
    for r in sweep:
        assert r["new_tokens_per_row"] == 2 and len(r["times_s"]) == 2  # max(2, repeats // 2) timed calls
        assert r["tokens_per_s"] == pytest.approx(r["rows"] * 2 / r["median_s"]), r
        line = f"[bench]     {r['rows']:>5} rows, {r['decode']:<10}: "
        shown = [x for x in lines if x.startswith(line)]
        assert len(shown) == 1 and shown[0].endswith(" tok/s"), (line, lines)
        assert int(shown[0][len(line):-len(" tok/s")].replace(",", "")) == round(r["tokens_per_s"]), shown


def test_grpo_comparison_without_trl_is_skipped_with_the_install_advice(monkeypatch, tmp_path):
    """Where `import trl` fails the GRPO comparison is skipped, before our trainer is built, and says how
    to install trl without replacing torch; the settings it would have run stay in the result."""
    monkeypatch.setitem(sys.modules, "trl", None)  # `import trl` raises ImportError
    monkeypatch.setattr(bench, "our_grpo_trainer", lambda *a: pytest.fail("our trainer built without trl"))
    cfg = bench.BenchConfig(model="tiny", grpo_prompts=3, group_size=2, grpo_new_tokens=5, device="cpu")
    res = bench.bench_grpo(cfg, tmp_path, torch.device("cpu"))
    assert res["status"] == "skipped", res
    assert res["reason"].startswith("trl is not installed (") and "`pip install trl`" in res["reason"], res["reason"]
    assert "pip install --dry-run trl" in res["reason"], res["reason"]
    assert (res["prompts_per_step"], res["group_size"], res["completion_tokens"]) == (3, 2, 5)
    assert "speedup" not in res


def _fake_trl(monkeypatch):
    """A stand-in `trl` module (version 0.0-test), so that `import trl` in bench_grpo succeeds."""
    fake_trl = types.ModuleType("trl")
    fake_trl.__version__ = "0.0-test"
    monkeypatch.setitem(sys.modules, "trl", fake_trl)


def test_grpo_comparison_reports_a_failing_trl_run_and_keeps_ours(monkeypatch, tmp_path):
    """A TRL GRPOTrainer that raises (its API moves between versions) makes the comparison "failed", with
    the exception's type and message and trl's version, and our side's timing kept: 1 warm-up + 1 timed
    step of a tiny model (1 prompt x 2 completions x at most 3 tokens). trl is a stand-in module here."""
    _fake_trl(monkeypatch)

    def trl_times(cfg, workdir, device):
        raise RuntimeError("GRPOConfig got an unexpected keyword")

    monkeypatch.setattr(bench, "_trl_grpo_times", trl_times)
    torch.manual_seed(0)
    bench.GPT(GPTConfig.preset("tiny", dropout=0.0)).save_pretrained(tmp_path)
    cfg = bench.BenchConfig(model="tiny", grpo_prompts=1, group_size=2, grpo_new_tokens=3, grpo_steps=1, device="cpu")
    res = bench.bench_grpo(cfg, tmp_path, torch.device("cpu"))
    assert res["status"] == "failed", res
    assert res["reason"] == "TRL GRPOTrainer failed: RuntimeError: GRPOConfig got an unexpected keyword"
    assert res["trl_version"] == "0.0-test"
    assert len(res["ours"]["times_s"]) == 1 and _positive_finite(res["ours"]["median_s"])
    assert 1 <= res["ours_completion_len_mean"] <= 3
    assert "speedup" not in res and "trl" not in res


def test_grpo_comparison_leaves_trls_first_step_untimed(monkeypatch, tmp_path):
    """TRL's first optimizer step carries its setup and is not timed: step times [9, 1, 3] s give a median of
    2 s, 2 prompts x 2 completions over it 2 completions/s, and a speed-up of TRL's median over ours. Both
    trainers are stand-ins (ours: a no-op step)."""
    _fake_trl(monkeypatch)
    ours = types.SimpleNamespace(train_step=lambda: {"completions/mean_length": 2.0})
    monkeypatch.setattr(bench, "our_grpo_trainer", lambda cfg, workdir, device: ours)
    monkeypatch.setattr(bench, "_trl_grpo_times", lambda cfg, workdir, device: [9.0, 1.0, 3.0])
    cfg = bench.BenchConfig(model="tiny", grpo_prompts=2, group_size=2, grpo_new_tokens=3, grpo_steps=2, device="cpu")
    res = bench.bench_grpo(cfg, tmp_path, torch.device("cpu"))
    assert res["status"] == "ok" and res["trl"]["times_s"] == [1.0, 3.0] and res["trl"]["median_s"] == 2.0
    assert res["trl"]["completions_per_s"] == 2.0 and res["speedup"] == pytest.approx(2.0 / res["ours"]["median_s"])
    assert res["ours_completion_len_mean"] == 2.0
