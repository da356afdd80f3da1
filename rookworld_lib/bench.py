"""Side-by-side speed benchmarks: our GPT, sampler and GRPO step against transformers and TRL.

`rookworld bench [--quick] [--json]` runs, in one process, with the same weights and shapes:

(a) one training step (forward, backward, AdamW) of our GPT against transformers'
    GPT2LMHeadModel loaded from our save_pretrained() output, with the same optimizer settings;
(b) rollout sampling: `sampling.generate` against `GPT2LMHeadModel.generate`, same prompts (left
    padded, varied lengths), same rows, temperature 1, no top-k/top-p, and the same number of new
    tokens in every row (our sampler gets an EOS id no token has; transformers gets
    min_new_tokens = max_new_tokens), so both do exactly the same amount of decoding;
(c) one GRPO step (sample a group per prompt, score, group advantages, policy forward, loss,
    backward, AdamW) against TRL's GRPOTrainer with the same model, prompts, group size and
    completion length, when TRL is installed; otherwise the JSON says why it was skipped.

Each comparison alternates the two contenders (perf.benchmark_interleaved), so a noisy neighbour
slows both. Speedups are ours over theirs in throughput (> 1: ours is faster). With --json the
last line printed is one JSON object holding the speedups, the absolute figures and the settings.
Speed targets live here (and in notebook 04), never in timed tests.

Shapes: `QUICK` (--quick), `FULL` (CPU default) and `GPU` (the default on a CUDA device: GPT-2
124M in bf16 autocast on both sides, a 16 x 1024 training batch, 256 rollout rows of 128 tokens).
--rollout-sweep adds our sampler's tokens/s against rollout batch size for each decode mode
(dynamic, static, CUDA graph), the figure behind the GRPO-rollout throughput target.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from . import perf
from .model import GPT, GPTConfig, PRESETS
from .train_sft import batch_loss, resolve_loss_impl

EOT_ID = 50256
NEVER_EOS = -1  # an id no token has: rows never stop early, so every row decodes max_new_tokens

# A few policy prompts (`P: <FEN>`) for the GRPO comparison; positions from well-known openings.
FENS = (
    "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1",
    "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1",
    "rnbqkbnr/pp1ppppp/8/2p5/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2",
    "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3",
    "rnbqkb1r/pppppppp/5n2/8/3P4/8/PPP1PPPP/RNBQKBNR w KQkq - 1 2",
    "rnbqkbnr/ppp1pppp/8/3p4/3P4/8/PPP1PPPP/RNBQKBNR w KQkq - 0 2",
    "r1bqkb1r/pppp1ppp/2n2n2/4p3/2B1P3/5N2/PPPP1PPP/RNBQK2R w KQkq - 4 4",
    "rnbqk2r/pppp1ppp/5n2/2b1p3/2B1P3/5N2/PPPP1PPP/RNBQK2R w KQkq - 4 4",
)


@dataclass(frozen=True)
class BenchConfig:
    """Shapes and repetitions of the three comparisons."""

    model: str = "cpu-small"  # GPTConfig preset shared by every comparison
    train_batch: int = 8  # (a) sequences per training step
    train_seq_len: int = 128  # (a) tokens per sequence
    sample_prompts: int = 8  # (b) distinct prompts
    group_size: int = 8  # (b, c) completions per prompt (GRPO's G)
    prompt_len: int = 40  # (b) longest prompt; lengths vary in [prompt_len // 2, prompt_len]
    new_tokens: int = 48  # (b) tokens generated per row
    grpo_prompts: int = 2  # (c) prompts per GRPO step
    grpo_new_tokens: int = 24  # (c) completion length
    warmup: int = 1  # untimed repetitions per contender
    repeats: int = 5  # timed repetitions per contender (median reported)
    grpo_steps: int = 3  # (c) timed GRPO steps per contender (after one warm-up step)
    seed: int = 0
    device: str = "auto"
    trl: bool = True  # attempt the TRL comparison when trl is importable
    precision: str = "fp32"  # fp32, or bf16: autocast on both sides (TRL gets bf16=True)

    def __post_init__(self):
        if self.model not in PRESETS:
            raise ValueError(f"BenchConfig.model must be one of {sorted(PRESETS)}, got {self.model!r}")
        for name in ("train_batch", "train_seq_len", "sample_prompts", "group_size", "prompt_len", "new_tokens",
                     "grpo_prompts", "grpo_new_tokens", "repeats", "grpo_steps"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"BenchConfig.{name} must be a positive integer, got {v!r}")
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"BenchConfig.precision must be 'fp32' or 'bf16', got {self.precision!r}")
        if not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"BenchConfig.warmup must be an integer >= 0, got {self.warmup!r}")
        block = PRESETS[self.model].block_size
        if self.train_seq_len > block or self.prompt_len + self.new_tokens > block:
            raise ValueError(f"BenchConfig: sequences longer than the {self.model} model's block_size {block}")


FULL = BenchConfig()
QUICK = BenchConfig(model="cpu-small", train_batch=4, train_seq_len=64, sample_prompts=2, group_size=8,
                    prompt_len=32, new_tokens=24, grpo_prompts=2, grpo_new_tokens=12, warmup=1, repeats=3,
                    grpo_steps=2)
# The default on a GPU: GPT-2 124M, bf16, a training batch of 16 x 1024, 256 rollout rows.
GPU = BenchConfig(model="gpt2", train_batch=16, train_seq_len=1024, sample_prompts=32, group_size=8, prompt_len=64,
                  new_tokens=128, grpo_prompts=8, grpo_new_tokens=64, warmup=2, repeats=5, grpo_steps=3,
                  precision="bf16")
# Rollout rows (prompts x group) measured by --rollout-sweep on a GPU; the CPU gets the first two.
SWEEP_ROWS = (64, 256, 1024, 2048)


def _amp(cfg: BenchConfig, device: torch.device):
    """bf16 autocast for both contenders when cfg.precision says so."""
    if cfg.precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _quiet_transformers():
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
    except Exception:
        pass
    warnings.filterwarnings("ignore", module="transformers")
    warnings.filterwarnings("ignore", module="trl")


def make_models(cfg: BenchConfig, workdir: Path, device: torch.device):
    """Our GPT (seeded init) and transformers' GPT2LMHeadModel loaded from its save_pretrained copy."""
    import transformers

    torch.manual_seed(cfg.seed)
    ours = GPT(GPTConfig.preset(cfg.model, dropout=0.0))
    ours.save_pretrained(workdir)
    theirs = transformers.GPT2LMHeadModel.from_pretrained(workdir, attn_implementation="sdpa")
    return ours.to(device), theirs.to(device)


def _adamw(params, lr=1e-4):
    # The same optimizer for both contenders: this compares models, not optimizers.
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0, foreach=True)


def _speedup(ours: perf.Timing, theirs: perf.Timing) -> float:
    return theirs.median_s / ours.median_s


# ---------------------------------------------------------------------------------------------
# (a) training step
# ---------------------------------------------------------------------------------------------


def bench_train_step(cfg: BenchConfig, ours: GPT, theirs, device: torch.device) -> dict:
    g = torch.Generator().manual_seed(cfg.seed + 1)
    data = torch.randint(0, 50257, (cfg.train_batch, cfg.train_seq_len + 1), generator=g).to(device)
    x, y = data[:, :-1], data[:, 1:]
    with torch.no_grad():
        diff = (ours.eval()(x) - theirs.eval()(input_ids=x).logits).abs().max().item()
    ours.train()
    theirs.train()
    opt_ours, opt_theirs = _adamw(ours.parameters()), _adamw(theirs.parameters())
    # Our loss as SFT computes it by default: the fused chunked LM head + loss on CPU, the plain
    # one on CUDA (SFTConfig.loss_impl="auto"; docs/perf.md has both measured).
    loss_impl = resolve_loss_impl("auto", device)

    def step_ours():
        with _amp(cfg, device):
            loss = batch_loss(ours, x, y, impl=loss_impl)
        loss.backward()
        opt_ours.step()
        opt_ours.zero_grad(set_to_none=True)

    def step_theirs():
        # The usual transformers path: labels = inputs, shifted inside the model (T-1 targets).
        with _amp(cfg, device):
            loss = theirs(input_ids=x, labels=x).loss
        loss.backward()
        opt_theirs.step()
        opt_theirs.zero_grad(set_to_none=True)

    t = perf.benchmark_interleaved({"ours": step_ours, "transformers": step_theirs}, warmup=cfg.warmup,
                                   repeats=cfg.repeats, sync=device)
    tokens = cfg.train_batch * cfg.train_seq_len
    return {
        "tokens_per_step": tokens,
        "loss_impl": loss_impl,
        "initial_logits_max_abs_diff": diff,
        "ours": {**t["ours"].as_dict(), "tokens_per_s": t["ours"].per_second(tokens)},
        "transformers": {**t["transformers"].as_dict(), "tokens_per_s": t["transformers"].per_second(tokens)},
        "speedup": _speedup(t["ours"], t["transformers"]),
    }


# ---------------------------------------------------------------------------------------------
# (b) sampling
# ---------------------------------------------------------------------------------------------


def rollout_prompts(cfg: BenchConfig) -> list[list[int]]:
    g = torch.Generator().manual_seed(cfg.seed + 2)
    lo = max(1, cfg.prompt_len // 2)
    lengths = torch.randint(lo, cfg.prompt_len + 1, (cfg.sample_prompts,), generator=g).tolist()
    lengths[0] = cfg.prompt_len
    return [torch.randint(0, 50000, (n,), generator=g).tolist() for n in lengths]


def bench_sampling(cfg: BenchConfig, ours: GPT, theirs, device: torch.device) -> dict:
    from .sampling import SamplingConfig, generate, left_pad

    ours.eval()
    theirs.eval()
    prompts = rollout_prompts(cfg)
    G, L = cfg.group_size, cfg.new_tokens
    rows = [p for p in prompts for _ in range(G)]  # group by group, as generate lays them out
    ids, valid = left_pad(rows, EOT_ID, device)
    scfg = SamplingConfig(max_new_tokens=L, temperature=1.0, top_k=0, top_p=1.0, num_samples=G, eos_id=NEVER_EOS,
                          pad_id=EOT_ID, seed=cfg.seed)
    counts = {}

    def sample_ours():
        with _amp(cfg, device):
            ro = generate(ours, prompts, scfg)
        counts["ours"] = ro.stats["generated_tokens"]

    def sample_theirs():
        with torch.no_grad(), _amp(cfg, device):
            out = theirs.generate(input_ids=ids, attention_mask=valid.long(), do_sample=True, temperature=1.0,
                                  top_k=0, top_p=1.0, max_new_tokens=L, min_new_tokens=L, pad_token_id=EOT_ID,
                                  eos_token_id=EOT_ID, use_cache=True)
        counts["transformers"] = (out.size(1) - ids.size(1)) * out.size(0)

    t = perf.benchmark_interleaved({"ours": sample_ours, "transformers": sample_theirs}, warmup=cfg.warmup,
                                   repeats=cfg.repeats, sync=device)
    n_tokens = len(rows) * L
    if counts.get("ours") != n_tokens or counts.get("transformers") != n_tokens:
        raise RuntimeError(f"sampling benchmark generated unequal work: {counts}, expected {n_tokens} each")
    # Model FLOPs per generated token at the mean context length (prefill excluded: a lower bound).
    mean_ctx = sum(len(p) for p in rows) / len(rows) + (L + 1) / 2
    decode_flops = perf.flops_per_token(ours.config, max(1, round(mean_ctx)), "decode") * n_tokens
    return {
        "rows": len(rows), "new_tokens_per_row": L, "generated_tokens": n_tokens,
        "prompt_lengths": [len(p) for p in prompts],
        "ours": {**t["ours"].as_dict(), "tokens_per_s": t["ours"].per_second(n_tokens),
                 "decode_tflops": decode_flops / t["ours"].median_s / 1e12},
        "transformers": {**t["transformers"].as_dict(), "tokens_per_s": t["transformers"].per_second(n_tokens),
                         "decode_tflops": decode_flops / t["transformers"].median_s / 1e12},
        "speedup": _speedup(t["ours"], t["transformers"]),
    }


def rollout_sweep(cfg: BenchConfig, model: GPT, device: torch.device, rows: tuple[int, ...] = SWEEP_ROWS,
                  modes: tuple[str, ...] | None = None) -> list[dict]:
    """Our sampler's generated tokens/s against rollout batch size (prompts x group), per decode mode.

    Same prompt lengths and new-token budget as (b); every row decodes the full budget. This is the
    GRPO rollout's throughput as the batch grows, where a GPU leaves the launch-bound regime.
    """
    from .sampling import SamplingConfig, generate

    model.eval()
    modes = modes or (("dynamic", "static", "cuda_graph") if device.type == "cuda" else ("dynamic", "static"))
    out = []
    for n_rows in rows:
        n_prompts = max(1, n_rows // cfg.group_size)
        prompts = rollout_prompts(replace(cfg, sample_prompts=n_prompts))
        for mode in modes:
            scfg = SamplingConfig(max_new_tokens=cfg.new_tokens, num_samples=cfg.group_size, eos_id=NEVER_EOS,
                                  pad_id=EOT_ID, seed=cfg.seed, decode=mode)

            def sample():  # timed at once, in this iteration
                with _amp(cfg, device):
                    generate(model, prompts, scfg)  # noqa: B023

            t = perf.benchmark(sample, warmup=1, repeats=max(2, cfg.repeats // 2), sync=device)
            n_tokens = n_prompts * cfg.group_size * cfg.new_tokens
            out.append({"rows": n_prompts * cfg.group_size, "decode": mode, "new_tokens_per_row": cfg.new_tokens,
                        **t.as_dict(), "tokens_per_s": t.per_second(n_tokens),
                        "peak_memory_mb": perf.max_memory_mb(device)})
    return out


# ---------------------------------------------------------------------------------------------
# (c) GRPO step
# ---------------------------------------------------------------------------------------------


def vowel_reward(text: str) -> float:
    """A cheap, deterministic reward with spread across completions (share of vowels)."""
    return sum(c in "aeiouAEIOU" for c in text) / max(1, len(text))


def grpo_prompt_texts(cfg: BenchConfig, n: int) -> list[str]:
    return [f"P: {FENS[i % len(FENS)]}" for i in range(n)]


def hf_gpt2_tokenizer():
    """A transformers fast tokenizer built offline from our GPT-2 rank file (same ids as tiktoken)."""
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    from .tokenizer import EOT_TOKEN, GPT2_PATTERN, default_ranks_path

    conv = TikTokenConverter(vocab_file=str(default_ranks_path()), pattern=GPT2_PATTERN,
                             extra_special_tokens=[EOT_TOKEN])
    return PreTrainedTokenizerFast(tokenizer_object=conv.converted(), eos_token=EOT_TOKEN, pad_token=EOT_TOKEN,
                                   bos_token=EOT_TOKEN, padding_side="left")


def _our_grpo_step_fn(cfg: BenchConfig, model: GPT, device: torch.device):
    from . import grpo
    from .sampling import SamplingConfig, generate, sequence_logprobs
    from .tokenizer import get_tokenizer

    enc = get_tokenizer()
    G, L = cfg.group_size, cfg.grpo_new_tokens
    texts = grpo_prompt_texts(cfg, len(FENS))
    prompt_ids = [enc.encode(t) for t in texts]
    opt = _adamw(model.parameters(), lr=1e-6)
    gcfg = grpo.GRPOConfig(loss_type="dapo", beta=0.0)  # TRL's defaults
    state = {"i": 0}

    def step():
        i = state["i"]
        batch = [prompt_ids[(i * cfg.grpo_prompts + k) % len(prompt_ids)] for k in range(cfg.grpo_prompts)]
        state["i"] += 1
        model.eval()
        with _amp(cfg, device):
            ro = generate(model, batch, SamplingConfig(max_new_tokens=L, num_samples=G, eos_id=NEVER_EOS,
                                                       pad_id=EOT_ID))
        rewards = [vowel_reward(t) for t in ro.completions(enc)]
        adv, stats = grpo.group_advantages(rewards, G)
        model.train()
        with _amp(cfg, device):
            lp = sequence_logprobs(model, ro.prompt_ids, ro.tokens)
        loss, _ = grpo.grpo_loss(lp.float(), ro.logprobs, adv.to(device), ro.mask, config=gcfg, group_stats=stats)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _trl_grpo_times(cfg: BenchConfig, workdir: Path, device: torch.device) -> list[float]:
    """Wall time of each GRPOTrainer optimizer step (one generation round per step)."""
    import datasets
    import transformers
    from trl import GRPOConfig, GRPOTrainer

    G, L = cfg.group_size, cfg.grpo_new_tokens
    n_steps = cfg.grpo_steps + 1
    texts = grpo_prompt_texts(cfg, cfg.grpo_prompts * n_steps)
    ds = datasets.Dataset.from_dict({"prompt": texts})
    tok = hf_gpt2_tokenizer()
    model = transformers.GPT2LMHeadModel.from_pretrained(workdir, attn_implementation="sdpa")

    def reward(completions, **kwargs):
        return [vowel_reward(c) for c in completions]

    stamps: list[float] = []

    class StepTimer(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            if not stamps:
                stamps.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kw):
            perf.synchronize(device)
            stamps.append(time.perf_counter())

    args = GRPOConfig(
        output_dir=str(workdir / "trl"), per_device_train_batch_size=cfg.grpo_prompts * G, num_generations=G,
        max_completion_length=L, generation_kwargs={"min_new_tokens": L}, temperature=1.0, top_k=0, top_p=1.0,
        beta=0.0, learning_rate=1e-6, max_steps=n_steps, gradient_accumulation_steps=1, steps_per_generation=1,
        num_iterations=1, logging_steps=10**6, save_strategy="no", report_to="none", disable_tqdm=True,
        use_cpu=device.type == "cpu", bf16=cfg.precision == "bf16", fp16=False, dataloader_num_workers=0, seed=cfg.seed,
        shuffle_dataset=False, log_completions=False,
        gradient_checkpointing=False,  # TRL turns it on by default; ours does not recompute, so neither may TRL
    )
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=ds, processing_class=tok,
                          callbacks=[StepTimer()])
    with contextlib.redirect_stdout(io.StringIO()):
        trainer.train()
    return [b - a for a, b in zip(stamps, stamps[1:])]


def bench_grpo(cfg: BenchConfig, workdir: Path, device: torch.device) -> dict:
    settings = {"prompts_per_step": cfg.grpo_prompts, "group_size": cfg.group_size,
                "completion_tokens": cfg.grpo_new_tokens, "loss_type": "dapo", "beta": 0.0, "timed_steps": cfg.grpo_steps,
        "precision": cfg.precision}
    try:
        from . import grpo

        missing = [n for n in ("grpo_loss", "group_advantages", "GRPOConfig") if not hasattr(grpo, n)]
        if missing:
            return {"status": "skipped", "reason": f"rookworld_lib.grpo lacks {missing}", **settings}
    except ImportError as exc:
        return {"status": "skipped", "reason": f"rookworld_lib.grpo cannot be imported: {exc}", **settings}
    if not cfg.trl:
        return {"status": "skipped", "reason": "TRL comparison disabled (--no-trl)", **settings}
    try:
        import trl
    except ImportError as exc:
        return {"status": "skipped", "reason": f"trl is not installed ({exc}); `pip install trl` (it must not replace "
                f"the installed torch: check with `pip install --dry-run trl`)", **settings}
    torch.manual_seed(cfg.seed)
    model = GPT.from_pretrained(workdir).to(device)
    ours_step = _our_grpo_step_fn(cfg, model, device)
    ours = perf.benchmark(ours_step, warmup=1, repeats=cfg.grpo_steps, sync=device)
    try:
        trl_times = _trl_grpo_times(cfg, workdir, device)
    except Exception as exc:
        return {"status": "failed", "reason": f"TRL GRPOTrainer failed: {type(exc).__name__}: {exc}",
                "trl_version": trl.__version__, "ours": ours.as_dict(), **settings}
    theirs = perf.summarize_times(trl_times[1:] or trl_times)  # the first step is warm-up
    completions = cfg.grpo_prompts * cfg.group_size
    return {
        "status": "ok", "trl_version": trl.__version__, **settings,
        "ours": {**ours.as_dict(), "completions_per_s": completions / ours.median_s},
        "trl": {**theirs.as_dict(), "completions_per_s": completions / theirs.median_s},
        "speedup": theirs.median_s / ours.median_s,
        "note": "ours timed in its own loop; TRL timed between its optimizer steps (callbacks), not interleaved",
    }


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def run_bench(cfg: BenchConfig = QUICK, progress=print, sweep: bool = False) -> dict:
    """Run (a), (b), (c) and, with sweep, the rollout sweep; return the object --json prints."""
    _quiet_transformers()
    device = perf.resolve_device(cfg.device)
    t_start = time.perf_counter()
    out: dict = {"settings": asdict(cfg), "environment": perf.environment_info(device)}
    with tempfile.TemporaryDirectory(prefix="rookworld-bench-") as tmp, \
            perf.UtilizationSampler(interval_s=0.5) as util:
        workdir = Path(tmp)
        ours, theirs = make_models(cfg, workdir, device)
        progress(f"[bench] (a) training step: {cfg.model}, batch {cfg.train_batch} x {cfg.train_seq_len} tokens")
        out["train_step"] = bench_train_step(cfg, ours, theirs, device)
        progress(f"[bench]     ours {out['train_step']['ours']['tokens_per_s']:.0f} tok/s, transformers "
                 f"{out['train_step']['transformers']['tokens_per_s']:.0f} tok/s, speedup {out['train_step']['speedup']:.2f}x")
        # Fresh copies for sampling: the training step above changed the weights of both models.
        ours, theirs = make_models(cfg, workdir, device)
        progress(f"[bench] (b) sampling: {cfg.sample_prompts} prompts x {cfg.group_size} samples x {cfg.new_tokens} tokens")
        out["sampling"] = bench_sampling(cfg, ours, theirs, device)
        progress(f"[bench]     ours {out['sampling']['ours']['tokens_per_s']:.0f} tok/s, transformers "
                 f"{out['sampling']['transformers']['tokens_per_s']:.0f} tok/s, speedup {out['sampling']['speedup']:.2f}x")
        del theirs
        if sweep:
            rows = SWEEP_ROWS if device.type == "cuda" else SWEEP_ROWS[:2]
            # On a GPU the sweep runs the padded vocabulary (50304 rows), as GRPO there does: the same
            # logits, with the LM head on fast matmul kernels.
            pad = 64 if device.type == "cuda" else 1
            progress(f"[bench] rollout sweep: rows {rows} x {cfg.new_tokens} tokens, vocab padded to x{pad}")
            sweep_model = GPT.from_pretrained(workdir, pad_vocab_to_multiple=pad).to(device)
            out["rollout_sweep"] = rollout_sweep(cfg, sweep_model, device, rows)
            out["rollout_sweep_pad_vocab_to_multiple"] = pad
            del sweep_model
            for r in out["rollout_sweep"]:
                progress(f"[bench]     {r['rows']:5d} rows, {r['decode']:10s}: {r['tokens_per_s']:,.0f} tok/s")
        del ours
        progress(f"[bench] (c) GRPO step: {cfg.grpo_prompts} prompts x {cfg.group_size} x {cfg.grpo_new_tokens} tokens")
        out["grpo_step"] = bench_grpo(cfg, workdir, device)
        g = out["grpo_step"]
        progress(f"[bench]     {g['status']}" + (f": speedup {g['speedup']:.2f}x" if g["status"] == "ok" else f": {g['reason']}"))
    out["utilization"] = util.summary()
    out["wall_s"] = time.perf_counter() - t_start
    out["train_step_speedup_vs_transformers"] = out["train_step"]["speedup"]
    out["sampling_speedup_vs_transformers"] = out["sampling"]["speedup"]
    out["grpo_step_speedup_vs_trl"] = out["grpo_step"].get("speedup")
    out["targets"] = {"sampling_speedup_vs_transformers": 2.0, "train_step_speedup_vs_transformers": 1.2,
                      "grpo_step_speedup_vs_trl": 1.0}
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rookworld bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Speedups are ours/theirs in throughput (> 1: ours is faster). Targets on CPU: "
                                       "sampling >= 2x, training step >= 1.2x, GRPO step ahead of TRL.")
    p.add_argument("--quick", action="store_true", help="small shapes, about a minute on two CPU cores")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line of output")
    p.add_argument("--model", choices=sorted(PRESETS), help="model preset (default: cpu-small)")
    p.add_argument("--repeats", type=int, help="timed repetitions per contender")
    p.add_argument("--warmup", type=int, help="untimed repetitions per contender before timing")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--no-trl", action="store_true", help="skip the TRL GRPOTrainer comparison")
    p.add_argument("--precision", choices=["fp32", "bf16"], help="both contenders' precision (default: fp32; "
                   "bf16 with the GPU shapes)")
    p.add_argument("--rollout-sweep", action="store_true", help="also measure our sampler's tokens/s against rollout "
                   f"batch size {SWEEP_ROWS} (first two on CPU) and decode mode")
    p.add_argument("--out", type=Path, help="also write the JSON result to this file")
    return p


def cli(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = QUICK if args.quick else FULL
    if not args.quick and perf.resolve_device(args.device).type == "cuda":
        cfg = GPU
    over = {"device": args.device, "trl": not args.no_trl}
    if args.precision:
        over["precision"] = args.precision
    if args.model:
        over["model"] = args.model
    if args.repeats is not None:
        over["repeats"] = args.repeats
    if args.warmup is not None:
        over["warmup"] = args.warmup
    try:
        cfg = replace(cfg, **over)
    except ValueError as exc:
        print(f"rookworld bench: {exc}", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    log = (lambda msg: print(msg, file=sys.stderr)) if args.json else print
    result = run_bench(cfg, progress=log, sweep=args.rollout_sweep)
    if args.out:
        perf.to_json(result, args.out)
    if args.json:
        print(json.dumps(result, default=perf._json_default))
    else:
        print(f"training step speedup vs transformers: {result['train_step_speedup_vs_transformers']:.2f}x (target 1.2x)")
        print(f"sampling speedup vs transformers:      {result['sampling_speedup_vs_transformers']:.2f}x (target 2x)")
        g = result["grpo_step"]
        print("GRPO step vs TRL:                      " + (f"{g['speedup']:.2f}x" if g["status"] == "ok"
                                                             else f"{g['status']} ({g['reason']})"))
    return 0


if __name__ == "__main__":
    raise SystemExit(cli())
