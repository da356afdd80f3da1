"""Side-by-side speed benchmarks: our training step, sampler and GRPO step against transformers and TRL,
and our GRPO step over a task vocabulary against the same step over all of GPT-2.

`rookworld bench [--quick] [--json]` runs the comparisons (a)-(d) below in one process, with
the same weights and shapes on both sides; with --json the last line is one JSON object. Targets live
here (TARGETS), never in timed tests; docs/perf.md has the measurements.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import sys
import tempfile
import time
import warnings
from dataclasses import asdict, replace
from pathlib import Path

import torch

from . import perf
from ..core import grpo
from ..core.model import GPT, GPTConfig, PRESETS
from ..core.sampling import NO_EOS, SamplingConfig, generate, left_pad
from ..core.tokenizer import EOT_ID, EOT_TOKEN, get_tokenizer, hf_tokenizer_json
from ..core.train_grpo import GRPOTrainConfig, GRPOTrainer, PromptItem
from ..core.config import SEED_MAX, config_class, option, path_arg, validate
from ..core.train_utils import Runtime, build_adamw, check_device_name, clip_grad_norm, resolve_device, setup_runtime
from ..core.train_step import TrainStep
from ..core.task_vocab import TaskVocab, pin_bias_coordinate
from ..chess import data as chess_data
from ..chess.training import chess_reward, prompt_items, train_records
from .tuning import random_batches
from .workflow import PROFILES

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


@config_class(frozen=True)
class BenchConfig:
    """Shapes and repetitions of the four comparisons."""

    model: str = option("cpu-small", "GPTConfig preset shared by every comparison", choices=tuple(PRESETS))
    # (a) training step
    train_batch: int = option(8, "sequences per training step", min=1)
    train_seq_len: int = option(128, "tokens per sequence", min=1)
    precision: str = option("fp32", "fp32, or bf16: autocast on both sides (TRL gets bf16=True)", choices=("fp32", "bf16"))
    # (b) sampling, and the group size (c) shares
    sample_prompts: int = option(8, "distinct prompts", min=1)
    group_size: int = option(8, "completions per prompt (GRPO's G)", min=1)
    prompt_len: int = option(40, "longest prompt; lengths vary in [prompt_len // 2, prompt_len]", min=1)
    new_tokens: int = option(48, "tokens generated per row", min=1)
    # (c) GRPO step
    trl: bool = option(True, "attempt the TRL comparison when trl is importable")
    grpo_prompts: int = option(2, "prompts per GRPO step", min=1)
    grpo_new_tokens: int = option(24, "completion length", min=1)
    grpo_steps: int = option(3, "timed GRPO steps per contender (after one warm-up step)", min=1)
    # where, and how long
    device: str = option("auto", "auto, cpu, cuda, cuda:N")
    warmup: int = option(1, "untimed repetitions per contender", min=0)
    repeats: int = option(5, "timed repetitions per contender (median reported)", min=1)
    seed: int = option(0, "weights, data and sampling seed", min=0, max=SEED_MAX)

    def __post_init__(self):
        validate(self)  # types, ranges and choices (the option() checks above)
        check_device_name(self)
        block = PRESETS[self.model].block_size
        if self.train_seq_len > block or self.prompt_len + self.new_tokens > block:
            longest = max(self.train_seq_len, self.prompt_len + self.new_tokens)
            raise ValueError(f"BenchConfig: sequences of {longest} positions are longer than the {self.model} model's "
                             f"block_size {block}: give --model with {longest} positions or more (gpt2: 1024), or --quick "
                             "(its shapes fit every model)")


# Bench sizes (not the workflow's or the pipeline's profiles: these only set the benchmark's shapes).
FULL = BenchConfig()
QUICK = BenchConfig(train_batch=4, train_seq_len=64, sample_prompts=2, prompt_len=32, new_tokens=24,
                    grpo_new_tokens=12, repeats=3, grpo_steps=2)
# The default on a GPU: GPT-2 124M, bf16, a training batch of 16 x 1024, 256 rollout rows of 128 tokens.
GPU = BenchConfig(model="gpt2", train_batch=16, train_seq_len=1024, sample_prompts=32, prompt_len=64, new_tokens=128,
                  grpo_prompts=8, grpo_new_tokens=64, warmup=2, precision="bf16")
# Rollout rows (prompts x group) measured by --rollout-sweep on a GPU; the CPU gets the first two.
SWEEP_ROWS = (64, 256, 1024, 2048)
# What the workbench aims for, ours / theirs in throughput (sampling: >= 2x also with the other core busy).
TARGETS = {"train_step_speedup_vs_transformers": 1.5, "sampling_speedup_vs_transformers": 3.0,
           "grpo_step_speedup_vs_trl": 5.0, "grpo_task_vocab_speedup": 5.0}


def make_models(cfg: BenchConfig, workdir: Path, device: torch.device):
    """Our GPT (seeded init) and transformers' GPT2LMHeadModel loaded from its save_pretrained copy."""
    import transformers  # optional heavy dependency (the dev extras): only the comparisons need it

    torch.manual_seed(cfg.seed)
    ours = GPT(GPTConfig.preset(cfg.model, dropout=0.0))
    ours.save_pretrained(workdir)
    theirs = transformers.GPT2LMHeadModel.from_pretrained(workdir, attn_implementation="sdpa")
    return ours.to(device), theirs.to(device)


def _race(cfg: BenchConfig, device: torch.device, ours, theirs, tokens: int) -> dict:
    """Time ours and transformers' in turns: both timings with tokens/s, and ours over theirs."""
    t = perf.benchmark_interleaved({"ours": ours, "transformers": theirs}, warmup=cfg.warmup, repeats=cfg.repeats,
                                   sync=device)
    return {**{who: {**t[who].as_dict(), "tokens_per_s": t[who].per_second(tokens)} for who in t},
            "speedup": t["transformers"].median_s / t["ours"].median_s}


# --- (a) training step ---

SAME_WEIGHTS_ATOL = 1e-3  # fp32 logits of one model under ours and transformers' code (measured: ~1e-5)


def bench_train_step(cfg: BenchConfig, ours: GPT, theirs, runtime: Runtime) -> dict:
    """SFT's TrainStep against transformers' usual step, same batch, optimizer factory and clip."""
    device = runtime.device
    x, y = (t.to(device) for t in random_batches(1, cfg.train_batch, cfg.train_seq_len, seed=cfg.seed + 1)[0])
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # full fp32 for the check (a GPU's TF32 differs by ~1e-3)
    try:
        with torch.no_grad():
            diff = (ours.eval()(x) - theirs.eval()(input_ids=x).logits).abs().max().item()
    finally:
        torch.set_float32_matmul_precision(precision)
    if not diff <= SAME_WEIGHTS_ATOL:  # the premise of the race: one model, two implementations (NaN too)
        raise ValueError(f"bench: the two contenders' logits differ by up to {diff:.3g} (> {SAME_WEIGHTS_ATOL:g} in "
                         "fp32) on the same batch: they do not hold the same weights, so their timings compare nothing")
    ours.train()
    theirs.train()
    # The same optimizer for both contenders (SFT's: build_adamw, weight decay 0.1): this compares models.
    step_ours = TrainStep(ours, build_adamw(ours, lr=1e-4, weight_decay=0.1, device_type=device.type), runtime)
    opt_theirs = build_adamw(theirs, lr=1e-4, weight_decay=0.1, device_type=device.type)

    def step_theirs():
        # The usual transformers path: labels = inputs, shifted inside the model (T-1 targets).
        with runtime.autocast():
            loss = theirs(input_ids=x, labels=x).loss
        loss.backward()
        clip_grad_norm(theirs, step_ours.grad_clip)
        opt_theirs.step()
        opt_theirs.zero_grad(set_to_none=True)

    tokens = cfg.train_batch * cfg.train_seq_len
    return {"tokens_per_step": tokens, "loss_impl": step_ours.loss_impl, "initial_logits_max_abs_diff": diff,
            **_race(cfg, device, lambda: step_ours(x, y), step_theirs, tokens)}


# --- (b) sampling ---

def rollout_prompts(cfg: BenchConfig) -> list[list[int]]:
    """cfg.sample_prompts random prompts, lengths in [prompt_len // 2, prompt_len], the first the longest."""
    g = torch.Generator().manual_seed(cfg.seed + 2)
    lo = max(1, cfg.prompt_len // 2)
    lengths = torch.randint(lo, cfg.prompt_len + 1, (cfg.sample_prompts,), generator=g).tolist()
    lengths[0] = cfg.prompt_len
    return [torch.randint(0, 50000, (n,), generator=g).tolist() for n in lengths]


def bench_sampling(cfg: BenchConfig, ours: GPT, theirs, runtime: Runtime) -> dict:
    """Our sampler against transformers' generate, the same rows and tokens, interleaved."""
    device = runtime.device
    ours.eval()
    theirs.eval()
    prompts = rollout_prompts(cfg)
    G, L = cfg.group_size, cfg.new_tokens
    rows = [p for p in prompts for _ in range(G)]  # group by group, as generate lays them out
    ids, valid = left_pad(rows, EOT_ID, device)
    scfg = SamplingConfig(max_new_tokens=L, temperature=1.0, top_k=0, top_p=1.0, num_samples=G, eos_id=NO_EOS,
                          pad_id=EOT_ID, seed=cfg.seed)
    counts = {}

    def sample_ours():
        with runtime.autocast():
            counts["ours"] = generate(ours, prompts, scfg).stats["generated_tokens"]

    def sample_theirs():
        with torch.no_grad(), runtime.autocast():
            out = theirs.generate(input_ids=ids, attention_mask=valid.long(), do_sample=True, temperature=1.0,
                                  top_k=0, top_p=1.0, max_new_tokens=L, min_new_tokens=L, pad_token_id=EOT_ID,
                                  eos_token_id=EOT_ID, use_cache=True)
        counts["transformers"] = (out.size(1) - ids.size(1)) * out.size(0)

    n_tokens = len(rows) * L
    out = {"rows": len(rows), "new_tokens_per_row": L, "generated_tokens": n_tokens,
           "prompt_lengths": [len(p) for p in prompts], **_race(cfg, device, sample_ours, sample_theirs, n_tokens)}
    if counts.get("ours") != n_tokens or counts.get("transformers") != n_tokens:
        raise RuntimeError(f"sampling benchmark generated unequal work: {counts}, expected {n_tokens} each")
    # Model FLOPs per generated token at the mean context length (prefill excluded: a lower bound).
    mean_ctx = sum(len(p) for p in rows) / len(rows) + (L + 1) / 2
    decode_flops = perf.flops_per_token(ours.config, max(1, round(mean_ctx)), "decode") * n_tokens
    for who in ("ours", "transformers"):
        out[who]["decode_tflops"] = decode_flops / out[who]["median_s"] / 1e12
    return out


def rollout_sweep(cfg: BenchConfig, workdir: Path, runtime: Runtime, progress=print) -> dict:
    """Our sampler's generated tokens/s against rollout batch size (prompts x group), per decode mode, with
    (b)'s prompt lengths and full new-token budget: GRPO's rollout as a GPU leaves the launch-bound regime."""
    cuda = runtime.device.type == "cuda"
    rows, modes = (SWEEP_ROWS, ("dynamic", "static", "cuda_graph")) if cuda else (SWEEP_ROWS[:2], ("dynamic", "static"))
    # On a GPU the padded vocabulary (50304 rows), as GRPO there: the same logits, on fast matmul kernels.
    pad = 64 if cuda else 1
    progress(f"[bench] rollout sweep: rows {rows} x {cfg.new_tokens} tokens, vocab padded to x{pad}")
    model = GPT.from_pretrained(workdir, pad_vocab_to_multiple=pad).to(runtime.device).eval()
    out = []
    for n_rows in rows:
        n_prompts = max(1, n_rows // cfg.group_size)
        prompts = rollout_prompts(replace(cfg, sample_prompts=n_prompts))
        for mode in modes:
            scfg = SamplingConfig(max_new_tokens=cfg.new_tokens, num_samples=cfg.group_size, eos_id=NO_EOS,
                                  pad_id=EOT_ID, seed=cfg.seed, decode=mode)

            def sample():  # timed at once, in this iteration
                with runtime.autocast():
                    generate(model, prompts, scfg)  # noqa: B023

            perf.reset_peak_memory(runtime.device)  # this row's peak, not the process's (part (a)'s)
            t = perf.benchmark(sample, warmup=1, repeats=max(2, cfg.repeats // 2), sync=runtime.device)
            n_tokens = n_prompts * cfg.group_size * cfg.new_tokens
            out.append({"rows": n_prompts * cfg.group_size, "decode": mode, "new_tokens_per_row": cfg.new_tokens,
                        **t.as_dict(), "tokens_per_s": t.per_second(n_tokens),
                        "peak_memory_mb": perf.max_memory_mb(runtime.device)})
            progress(f"[bench]     {out[-1]['rows']:5d} rows, {mode:10s}: {out[-1]['tokens_per_s']:,.0f} tok/s")
    return {"rollout_sweep": out, "rollout_sweep_pad_vocab_to_multiple": pad}


# --- (c) GRPO step ---

def vowel_reward(text: str) -> float:
    """A cheap, deterministic reward with spread across completions (share of vowels)."""
    return sum(c in "aeiouAEIOU" for c in text) / max(1, len(text))


def grpo_prompt_texts(n: int) -> list[str]:
    """n policy prompts (`P: <FEN>`), cycling through FENS."""
    return [f"P: {FENS[i % len(FENS)]}" for i in range(n)]


def hf_gpt2_tokenizer():
    """A transformers fast tokenizer of our exports' tokenizer.json (same ids as tiktoken), offline."""
    from tokenizers import Tokenizer  # optional heavy dependencies (tokenizers comes with transformers)
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(hf_tokenizer_json()), eos_token=EOT_TOKEN,
                                   pad_token=EOT_TOKEN, bos_token=EOT_TOKEN, padding_side="left")


def our_grpo_trainer(cfg: BenchConfig, workdir: Path, device: torch.device):
    """The GRPOTrainer `rookworld grpo` runs, set up as TRL is in `_trl_grpo_times` (dapo, beta 0,
    one minibatch per step, clip 1.0, no weight decay), rewarding completions with vowel_reward."""
    items = [PromptItem("P", t) for t in grpo_prompt_texts(len(FENS))]
    tcfg = GRPOTrainConfig(steps=cfg.grpo_steps + 1, prompts_per_step=cfg.grpo_prompts, group_size=cfg.group_size,
                           max_new_tokens=cfg.grpo_new_tokens, minibatch_size=cfg.grpo_prompts * cfg.group_size,
                           lr=1e-6, weight_decay=0.0, grad_clip=1.0, loss=grpo.GRPOConfig(loss_type="dapo", beta=0.0),
                           dtype=cfg.precision, device=str(device), seed=cfg.seed, progress=False)
    torch.manual_seed(cfg.seed)
    return GRPOTrainer(GPT.from_pretrained(workdir), items, tcfg, reward_funcs=lambda completions, **_: [vowel_reward(c) for c in completions])


def _trl_grpo_times(cfg: BenchConfig, workdir: Path, device: torch.device) -> list[float]:
    """Wall time of each GRPOTrainer optimizer step (one generation round per step; the first with TRL's setup)."""
    import datasets  # optional heavy dependencies (the dev extras): only the TRL comparison needs them
    import transformers
    from trl import GRPOConfig, GRPOTrainer

    G, L = cfg.group_size, cfg.grpo_new_tokens
    n_steps = cfg.grpo_steps + 1
    ds = datasets.Dataset.from_dict({"prompt": grpo_prompt_texts(cfg.grpo_prompts * n_steps)})
    model = transformers.GPT2LMHeadModel.from_pretrained(workdir, attn_implementation="sdpa")
    stamps: list[float] = []

    class StepTimer(transformers.TrainerCallback):
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
        # TRL turns it on by default; ours does not recompute, so neither may TRL (transformers 5 renamed the field
        # activation_checkpointing and warns on the old name)
        **{("activation_checkpointing" if "activation_checkpointing" in GRPOConfig.__dataclass_fields__
            else "gradient_checkpointing"): False},
    )
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [vowel_reward(c) for c in completions],
                          args=args, train_dataset=ds, processing_class=hf_gpt2_tokenizer(), callbacks=[StepTimer()])
    stamps.append(time.perf_counter())
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        # TRL 1.16 reads the model's is_gradient_checkpointing, which transformers 5 deprecates: TRL's to mend, not ours
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        trainer.train()
    return [b - a for a, b in zip(stamps, stamps[1:])]


def bench_grpo(cfg: BenchConfig, workdir: Path, device: torch.device) -> dict:
    """Our GRPO step against TRL's (each in its own loop: TRL's steps are timed by callbacks)."""
    settings = {"prompts_per_step": cfg.grpo_prompts, "group_size": cfg.group_size, "precision": cfg.precision,
                "completion_tokens": cfg.grpo_new_tokens, "loss_type": "dapo", "beta": 0.0, "timed_steps": cfg.grpo_steps}
    if not cfg.trl:
        return {"status": "skipped", "reason": "TRL comparison disabled (--no-trl)", **settings}
    try:
        import trl  # optional heavy dependency: its absence skips the comparison
    except ImportError as exc:
        return {"status": "skipped", "reason": f"trl is not installed ({exc}); `pip install trl` (it must not replace "
                f"the installed torch: check with `pip install --dry-run trl`)", **settings}
    trainer = our_grpo_trainer(cfg, workdir, device)
    records = []
    ours = perf.benchmark(lambda: records.append(trainer.train_step()), warmup=1, repeats=cfg.grpo_steps, sync=device)
    timed = records[1:]  # the first step is warm-up
    settings["ours_completion_len_mean"] = sum(r["completions/mean_length"] for r in timed) / len(timed)
    try:
        trl_times = _trl_grpo_times(cfg, workdir, device)
    except Exception as exc:  # TRL's API moves between versions: report, do not lose the rest of the bench
        return {"status": "failed", "reason": f"TRL GRPOTrainer failed: {type(exc).__name__}: {exc}",
                "trl_version": trl.__version__, "ours": ours.as_dict(), **settings}
    theirs = perf.summarize_times(trl_times[1:] or trl_times)  # the first step is warm-up
    completions = cfg.grpo_prompts * cfg.group_size
    return {"status": "ok", "trl_version": trl.__version__, **settings,
            "ours": {**ours.as_dict(), "completions_per_s": completions / ours.median_s},
            "trl": {**theirs.as_dict(), "completions_per_s": completions / theirs.median_s},
            "speedup": theirs.median_s / ours.median_s,
            "note": "ours timed in its own loop; TRL timed between its optimizer steps (callbacks), not interleaved"}


# --- (d) GRPO step over the task vocabulary ---

def bench_grpo_vocab(cfg: BenchConfig, device: torch.device, profile_grpo: GRPOTrainConfig) -> dict:
    """The cpu profile's GRPO step (its prompts, group, budget, temperature, KL) on a model marked with
    the shipped training text's vocabulary, as a vocab="task" SFT export is: vocab="auto" against
    vocab="full", interleaved, with the chess reward on the shipped training records."""
    records = train_records()
    vocab = TaskVocab({t for r in records for t in get_tokenizer().encode("".join(chess_data.record_text(r, "compact")),
                                                                         allowed_special="all")} | {EOT_ID})
    torch.manual_seed(cfg.seed)
    compact = GPT(vocab.compact_config(GPTConfig.preset(cfg.model, dropout=0.0)))
    pin_bias_coordinate(compact)
    marked = vocab.expand(compact)
    # without cuDNN attention: in a few steps its per-shape plans (paid by whichever contender meets a
    # shape first) would outweigh the head this row measures (docs/perf.md)
    tcfg = replace(profile_grpo, device=str(device), dtype=cfg.precision, seed=cfg.seed, progress=False,
                   out_dir=None, steps=cfg.warmup + cfg.grpo_steps + 1, cudnn_attention=False)
    trainers = {v: GRPOTrainer(copy.deepcopy(marked), prompt_items(records), replace(tcfg, vocab=v),
                               reward_funcs=chess_reward) for v in ("auto", "full")}
    steps = {v: [] for v in trainers}
    t = perf.benchmark_interleaved({v: (lambda v=v: steps[v].append(trainers[v].train_step())) for v in trainers},
                                   warmup=cfg.warmup, repeats=cfg.grpo_steps, sync=device)
    n = tcfg.prompts_per_step * tcfg.group_size
    timed = {v: s[cfg.warmup:] for v, s in steps.items()}  # the phases of the timed steps, not the warm-up's
    out = {v: {**t[v].as_dict(), "completions_per_s": n / t[v].median_s,
               **{k: sum(r[f"time/{k}"] for r in timed[v]) / len(timed[v]) for k in ("sampling", "scoring", "update")},
               "completion_len_mean": sum(r["completions/mean_length"] for r in timed[v]) / len(timed[v])}
           for v in trainers}
    return {"task": out["auto"], "full": out["full"], "speedup": t["full"].median_s / t["auto"].median_s,
            "task_tokens": len(trainers["auto"].vocab), "model": cfg.model,
            "settings": {k: getattr(tcfg, k) for k in ("prompts_per_step", "group_size", "max_new_tokens", "temperature",
                                                       "minibatch_size")} | {"beta": tcfg.loss.beta}}


# --- Driver ---

def _report(progress, part: dict) -> None:
    progress(f"[bench]     ours {part['ours']['tokens_per_s']:.0f} tok/s, transformers "
             f"{part['transformers']['tokens_per_s']:.0f} tok/s, speedup {part['speedup']:.2f}x")


def run_bench(cfg: BenchConfig = QUICK, progress=print, sweep: bool = False) -> dict:
    """Run (a), (b), (c) and, with sweep, the rollout sweep; return the object --json prints."""
    import transformers  # optional heavy dependency, as above

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", module="transformers|trl")
    runtime = setup_runtime(cfg.device, cfg.precision)  # bf16 autocast for both contenders, or fp32
    load_before = list(os.getloadavg())  # others' work before the bench adds its own
    t_start = time.perf_counter()
    out: dict = {"settings": asdict(cfg), "environment": perf.environment_info(runtime.device)}
    with tempfile.TemporaryDirectory(prefix="rookworld-bench-") as tmp, runtime.backend_flags(), \
            perf.UtilizationSampler(interval_s=0.5) as util:
        workdir = Path(tmp)
        progress(f"[bench] (a) training step: {cfg.model}, batch {cfg.train_batch} x {cfg.train_seq_len} tokens")
        out["train_step"] = bench_train_step(cfg, *make_models(cfg, workdir, runtime.device), runtime)
        _report(progress, out["train_step"])
        # Fresh copies for sampling: the training step changed the weights of both models.
        progress(f"[bench] (b) sampling: {cfg.sample_prompts} prompts x {cfg.group_size} samples x {cfg.new_tokens} tokens")
        out["sampling"] = bench_sampling(cfg, *make_models(cfg, workdir, runtime.device), runtime)
        _report(progress, out["sampling"])
        if sweep:
            out.update(rollout_sweep(cfg, workdir, runtime, progress))
        progress(f"[bench] (c) GRPO step: {cfg.grpo_prompts} prompts x {cfg.group_size} x {cfg.grpo_new_tokens} tokens")
        g = out["grpo_step"] = bench_grpo(cfg, workdir, runtime.device)
        progress(f"[bench]     {g['status']}" + (f": speedup {g['speedup']:.2f}x" if g["status"] == "ok" else f": {g['reason']}"))
        progress("[bench] (d) GRPO step, task vocabulary vs all of GPT-2 (the cpu profile's step)")
        v = out["grpo_task_vocab"] = bench_grpo_vocab(cfg, runtime.device, PROFILES["cpu"].grpo)
        progress(f"[bench]     task {v['task']['completions_per_s']:.1f} completions/s, full "
                 f"{v['full']['completions_per_s']:.1f} completions/s, speedup {v['speedup']:.2f}x")
    # the load averages: other users' work on a shared machine, to read beside the speedups (before the
    # bench, and after it: the bench's own threads included)
    return {**out, "utilization": util.summary(), "load_average_before": load_before, "load_average": list(os.getloadavg()),
            "wall_s": time.perf_counter() - t_start, "train_step_speedup_vs_transformers": out["train_step"]["speedup"],
            "sampling_speedup_vs_transformers": out["sampling"]["speedup"],
            "grpo_step_speedup_vs_trl": out["grpo_step"].get("speedup"),
            "grpo_task_vocab_speedup": out["grpo_task_vocab"]["speedup"], "targets": TARGETS}


def build_parser() -> argparse.ArgumentParser:
    """The `rookworld bench` options."""
    p = argparse.ArgumentParser(prog="rookworld bench", description=__doc__.split("\n\n")[0],
                                epilog="Speedups are ours/theirs in throughput (> 1: ours is faster). Targets: "
                                       + ", ".join(f"{k} >= {v}x" for k, v in TARGETS.items()) + ".")
    p.add_argument("--quick", action="store_true", help="small shapes, about a minute on two CPU cores")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line of output")
    p.add_argument("--model", choices=sorted(PRESETS), help=f"model preset (default: {FULL.model}; {GPU.model} with the "
                   "GPU shapes)")
    p.add_argument("--repeats", type=int, help=f"timed repetitions per contender of the training-step and sampling "
                   f"rows (default: {FULL.repeats}; {QUICK.repeats} with --quick); the GRPO rows time --grpo-steps")
    p.add_argument("--grpo-steps", type=int, help=f"timed GRPO steps per contender of the GRPO rows (default: "
                   f"{FULL.grpo_steps}; {QUICK.grpo_steps} with --quick)")
    p.add_argument("--warmup", type=int, help=f"untimed repetitions per contender before timing (default: {FULL.warmup}; "
                   f"{GPU.warmup} with the GPU shapes); the TRL comparison warms up one step on each side")
    p.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cpu, cuda, cuda:N (default: auto)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default, or 0: torch's choice)")
    p.add_argument("--no-trl", action="store_true", help="skip the TRL GRPOTrainer comparison")
    p.add_argument("--precision", choices=["fp32", "bf16"], help="both contenders' precision (default: fp32; "
                   "bf16 with the GPU shapes)")
    p.add_argument("--rollout-sweep", action="store_true", help="also measure our sampler's tokens/s against rollout "
                   f"batch size {SWEEP_ROWS} (first two on CPU) and decode mode")
    p.add_argument("--out", type=lambda text: Path(path_arg(text)), metavar="OUT", help="also write the JSON result to this file")
    return p


def cli(argv: list[str] | None = None) -> int:
    """`rookworld bench`: run the four comparisons and print the speedups (or one JSON line)."""
    args = build_parser().parse_args(argv)
    if args.threads is not None and not 0 <= args.threads <= 256:
        raise ValueError(f"--threads must be from 0 to 256 (torch CPU threads; 0 leaves them to torch), got {args.threads}")
    if args.out is not None:  # checked before minutes of timing
        _check_writable(args.out)
    cfg = QUICK if args.quick else GPU if resolve_device(args.device).type == "cuda" else FULL
    over = {k: getattr(args, k) for k in ("precision", "model", "repeats", "warmup", "grpo_steps")}
    cfg = replace(cfg, device=args.device, trl=not args.no_trl, **{k: v for k, v in over.items() if v is not None})
    if args.threads:
        torch.set_num_threads(args.threads)
    log = (lambda msg: print(msg, file=sys.stderr)) if args.json else print
    result = run_bench(cfg, progress=log, sweep=args.rollout_sweep)
    if args.json:  # printed before the file is written: a failed write leaves the result on screen
        print(json.dumps(result, default=perf._json_default))
    else:
        g = result["grpo_step"]
        for key, target in TARGETS.items():
            value = f"{result[key]:.2f}x" if result[key] is not None else f"{g['status']} ({g['reason']})"
            print(f"{key.replace('_', ' ')}: {value} (target {target}x)")
        print(load_line(result))
    if args.out:
        perf.to_json(result, args.out)
    return 0


def _a_bench_result(path: Path) -> bool:
    with contextlib.suppress(OSError, UnicodeDecodeError, ValueError, TypeError):  # unreadable, not JSON, not an object
        return "grpo_step" in json.loads(path.read_text())
    return False


def _check_writable(out: Path) -> None:
    """--out must be a JSON file that can be written: a directory, a parent that is a file, a folder
    where no file can be made (a read-only disk, /proc), or a file that is no earlier bench result (it
    would be lost) is refused before the bench runs."""
    if out.is_dir():
        raise ValueError(f"--out {out} is a directory; give the path of a JSON file")
    if out.is_file() and not _a_bench_result(out):
        raise ValueError(f"--out {out} exists and is no bench result (a JSON object with 'grpo_step'): the bench would "
                         "replace it; give another path, or delete it")
    if file := next((p for p in out.parents if p.is_file()), None):
        raise ValueError(f"--out {out}: {file} is a file, not a directory")
    folder = next(p for p in out.absolute().parents if p.exists())  # where the file, or its folders, will be made
    try:
        tempfile.TemporaryFile(dir=folder).close()
        if out.exists():
            out.open("a").close()
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot write there ({exc.strerror}); choose a directory you can write to") from None


def load_line(result: dict) -> str:
    """The machine's load around a bench run, for the plain-text output (--json has the numbers)."""
    host = result["utilization"].get("host_cpu_pct")
    return (f"load average (1, 5, 15 min) before {', '.join(f'{x:.2f}' for x in result['load_average_before'])}, "
            f"after {', '.join(f'{x:.2f}' for x in result['load_average'])}"
            + (f"; all cores {host['mean']:.0f}% busy on average while it ran" if host else ""))
