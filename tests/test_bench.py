"""`rookworld bench`: runs at a tiny size and prints one JSON object last. Never asserts on speed."""

import json
import math
from dataclasses import replace

import pytest

pytest.importorskip("transformers")

from rookworld_lib.core.model import GPTConfig  # noqa: E402
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
    with pytest.raises(ValueError, match="block_size"):
        bench.BenchConfig(model="tiny", train_seq_len=1000)


def test_cli_rejects_unknown_model():
    with pytest.raises(SystemExit) as exc:
        bench.cli(["--model", "gpt5"])
    assert exc.value.code == 2


def test_grpo_step_against_trl(tmp_path):
    """Needs trl (skipped without it): the GRPO comparison runs both trainers and reports what it timed."""
    pytest.importorskip("trl")
    cfg = bench.BenchConfig(model="tiny", grpo_prompts=2, group_size=2, grpo_new_tokens=4, grpo_steps=2, device="cpu")
    bench.make_models(cfg, tmp_path, bench.perf.resolve_device("cpu"))  # writes the shared weights
    res = bench.bench_grpo(cfg, tmp_path, bench.perf.resolve_device("cpu"))
    assert res["status"] == "ok", res.get("reason")
    assert (res["loss_type"], res["beta"], res["prompts_per_step"], res["group_size"]) == ("dapo", 0.0, 2, 2)
    for side in ("ours", "trl"):
        assert _positive_finite(res[side]["median_s"]) and res[side]["completions_per_s"] == pytest.approx(4 / res[side]["median_s"])
    assert res["speedup"] == pytest.approx(res["trl"]["median_s"] / res["ours"]["median_s"])
    assert 1 <= res["ours_completion_len_mean"] <= cfg.grpo_new_tokens
