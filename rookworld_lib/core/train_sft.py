"""Supervised pretraining (SFT) on task text: packed samples, tasks mixed by `task_weights` (`PackedStream` in memory, or
`StreamingPackedStream` reading large sharded sets as it goes, stream=True), AdamW, warm-up
+ cosine, the val loss every `eval_interval` steps, metrics in `<out_dir>/metrics.jsonl`. On CPU with
deterministic=True a resumed run ends bit-identical to an uninterrupted one.

Under torchrun (`rookworld sft --nproc N`) every rank reads the same stream and trains on rows
r, r + W, ... of each micro-batch (batch_size must be a multiple of W); DDP averages the gradients,
so the global batch, the data order and the checkpoints do not depend on W, and a run resumes at
another world size. Losses are averaged over ranks before the NaN guard sees them.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import itertools
import os
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .config import SEED_MAX, bad_field, check_applies, check_number, check_weights, config_class, option, validate
from .model import GPT, PRESETS, ROLLOUT_TEMPERATURE_KEY, GPTConfig, read_config_json
from .paths import RUNS_DIR, DataFormatError, json_lines
from .task_vocab import TaskVocab, pin_bias_coordinate
from .tokenizer import EOT_ID, EOT_TOKEN, VOCAB_SIZE, check_vocabulary, get_tokenizer, task_of
from .train_step import LOSS_IMPLS, TrainStep
from .train_utils import DTYPES, WarmupCosineSchedule, build_adamw, check_device_name, seed_everything
from .trainer import FINAL_DIR, Trainer, check_export_spares

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
# One metrics record per step, in this order, named as TRL names them. loss is null when non-finite;
# eval/loss is null except at eval steps (and step 0); grad_norm is before clipping; time/step and
# throughput cover data, forward, backward and optimizer (not eval or checkpoints); num_tokens so far;
# nonfinite/*: this update skipped, skipped updates in total and in a row.
RECORD_KEYS = ("step", "loss", "eval/loss", "learning_rate", "grad_norm", "throughput/tokens_per_s", "time/step",
               "num_tokens", "nonfinite/skipped", "nonfinite/total", "nonfinite/in_a_row")


# -- configuration ---------------------------------------------------------------------------------

@config_class(frozen=True)
class SFTConfig:
    """Settings of one SFT run. Bad values fail at construction with a message naming the field."""

    # model
    model: str = option("cpu-small", "GPTConfig preset for a scratch start: tiny, cpu-small, cpu-medium, gpt2, ...", choices=tuple(sorted(PRESETS)))
    model_overrides: dict = option(factory=dict, help="GPTConfig fields to override, e.g. dropout=0.1")
    init_from: str = option("scratch", '"scratch" (random init of the preset) or a Hugging Face GPT-2 directory')
    # data
    train_data: tuple[str, ...] = option((), 'JSONL training files, read by the trainer\'s TextReader ({"text": ...} lines, or TRL\'s prompt/completion records; a task layer\'s reader may read its own records)', path=True)
    val_data: tuple[str, ...] = option((), "JSONL files for the val loss; empty: hold out val_fraction of train", path=True)
    task_weights: dict[str, float] | None = option(None, "each task's share of the packed stream, a task's samples being those that start with its tag ('S: ...' is task S), e.g. {'math': 0.7, 'code': 0.3}; None: one pool, the data's own mix")
    stream: bool = option(False, "read train_data/val_data as they are used (tokenized on the fly through a shuffle buffer): memory does not grow with the data; for large sharded sets")
    shuffle_buffer: int = option(10_000, "samples held in each task's shuffle buffer when stream=True", min=1)
    val_fraction: float = option(0.05, "share of training samples held out for val when there is no val data (0 = none)", min=0.0, max=1.0, max_open=True)
    # batch
    block_size: int = option(256, "tokens per packed sequence (at most the model's block_size)", min=1)
    batch_size: int = option(8, "sequences per micro-batch", min=1)
    grad_accum: int = option(1, "micro-batches per optimizer step, at most 65,536 (tokens/step = batch_size*grad_accum*block_size)", min=1, max=2**16)
    # optimizer and schedule
    lr: float = option(6e-4, "peak learning rate", min=0.0, min_open=True)
    min_lr: float = option(6e-5, "learning rate at the end of the cosine decay", min=0.0)
    warmup_steps: int = option(100, "steps of linear warm-up from lr/warmup_steps to lr", min=0)
    max_steps: int = option(1000, "optimizer steps in the run", min=1)
    weight_decay: float = option(0.1, "AdamW decoupled weight decay on 2-D weights (not biases, LayerNorms); lr * "
                                 "weight_decay < 1", min=0.0)
    betas: tuple[float, float] = option((0.9, 0.95), "AdamW (beta1, beta2)")
    grad_clip: float = option(1.0, "clip the global grad norm to this (0 = no clipping, norm still logged)", min=0.0)
    max_nonfinite_in_a_row: int = option(5, "stop after this many consecutive skipped (non-finite) updates", min=1)
    # system
    device: str = option("auto", '"auto" (cuda if available, else cpu), "cpu", "cuda", "cuda:1", ...')
    dtype: str = option("auto", '"auto" (bf16 autocast on CUDA with bf16, else fp32), "fp32" or "bf16"', choices=DTYPES)
    compile: bool = option(False, "torch.compile the model (faster on GPU after a slow first step)")
    loss_impl: str = option("auto", 'LM head + loss: "fused" (chunked, logits never stored), "plain" (logits, then cross-entropy), "auto" (fused on CPU, plain on CUDA)', choices=LOSS_IMPLS)
    activation_checkpointing: bool = option(False, "recompute activations in backward: less memory, ~30% slower")
    vocab: str = option("full", 'LM head: "full" (GPT-2\'s 50,257 tokens) or "task": a compact model over the tokens of the train and val text, exported as the exact full GPT-2 (scratch starts; see task_vocab)', choices=("full", "task"))
    deterministic: bool = option(False, "deterministic algorithms: bit-identical reruns and resumes on CPU")
    seed: int = option(1337, "seeds the init, dropout, the val split and the data order", min=0, max=SEED_MAX)
    # evaluation, logging, checkpoints
    eval_interval: int = option(100, "steps between val-loss measurements (0 = never)", min=0)
    eval_steps: int = option(20, "val batches per measurement (the same batches every time)", min=1)
    checkpoint_interval: int = option(500, "steps between checkpoints (0 = only at the end)", min=0)
    keep_checkpoints: int = option(2, "checkpoints kept on disk, newest first (0 = all)", min=0)
    out_dir: str = option(str(RUNS_DIR / "sft"), "metrics.jsonl, checkpoints/ and final/ (HF export) go here", path=True)
    resume: bool = option(True, "continue from out_dir's latest checkpoint when there is one")
    export_hf: bool = option(True, "at the end, write the model in Hugging Face format to <out_dir>/final")
    progress: bool = option(True, "show a tqdm progress bar")
    report_to: str = option("tensorboard", '"tensorboard": the metrics also as event files in out_dir (tensorboard --logdir runs); "none"', choices=("tensorboard", "none"))

    def __post_init__(self):
        validate(self)  # types, ranges and choices of every field (see the option() checks above)
        object.__setattr__(self, "task_weights", check_weights(self, "task_weights"))
        name = type(self).__name__
        model_block = self._check_model()
        for fname in ("train_data", "val_data"):
            self._check_files(fname)
        if self.block_size > model_block and self.init_from != "scratch":  # its learned positions end there
            bad_field(name, "block_size", self.block_size, f"must be <= the block_size {model_block} of the model in "
                      f"{self.init_from} (--block-size {model_block})")
        if self.block_size > model_block:
            bad_field(name, "block_size", self.block_size,
                      f"must be <= the model's block_size {model_block} (raise it with "
                      f"model_overrides={{'block_size': {self.block_size}}}, --model-overrides "
                      f"block_size={self.block_size})")
        if self.init_from != "scratch":
            check_export_spares(self.init_from, self.out_dir if self.export_hf else None, name)
        check_number(self, "min_lr", min=0.0, max=self.lr)
        if self.lr * self.weight_decay >= 1:  # decoupled decay scales each weight by 1 - lr*wd a step: its sign flips
            bad_field(name, "weight_decay", self.weight_decay, f"must be < 1/lr ({1 / self.lr:g}): AdamW scales each "
                      "weight by 1 - lr*weight_decay a step")
        if self.vocab == "task" and self.init_from != "scratch":
            bad_field(name, "init_from", self.init_from, "must be 'scratch' with vocab='task' (it trains a new compact "
                      "head)")
        if self.warmup_steps > self.max_steps:
            bad_field(name, "warmup_steps", self.warmup_steps, f"must be <= max_steps ({self.max_steps})")
        check_applies(self, "shuffle_buffer", self.stream, "unless stream=True: set that too")
        check_applies(self, "val_fraction", (not self.val_data and not self.stream) or self.val_fraction == 0,
                      "when val_data is given or stream=True (the val samples are then val_data's): give no val_data")
        betas = self.betas
        if (not isinstance(betas, (tuple, list)) or len(betas) != 2
                or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0.0 <= b < 1.0 for b in betas)):
            bad_field(name, "betas", betas, "must be two numbers in [0, 1)")
        object.__setattr__(self, "betas", tuple(float(b) for b in betas))
        check_device_name(self)

    def _check_model(self) -> int:
        """Check model_overrides and init_from; returns the block_size of the model they give."""
        name = type(self).__name__
        if not isinstance(self.model_overrides, dict):
            bad_field(name, "model_overrides", self.model_overrides, "must be a dict of GPTConfig fields")
        if unknown := sorted(set(self.model_overrides) - {f.name for f in dataclasses.fields(GPTConfig)}):
            bad_field(name, "model_overrides", self.model_overrides, f"has unknown GPTConfig field(s) {unknown}")
        if self.model_overrides.get("vocab_size", VOCAB_SIZE) != VOCAB_SIZE:  # the data are GPT-2 tokens
            bad_field(name, "model_overrides", self.model_overrides,
                      f"must not change vocab_size: the training text is tokenized into GPT-2's {VOCAB_SIZE} tokens "
                      "(pad_vocab_to_multiple pads the embedding instead)")
        if self.model_overrides.get("bias", True) is not True:  # its export is no GPT-2 (save_pretrained refuses it)
            bad_field(name, "model_overrides", self.model_overrides, "must not set bias=False: the run exports GPT-2, "
                      "whose format holds a bias in every layer")
        if "gradient_checkpointing" in self.model_overrides:
            bad_field(name, "model_overrides", self.model_overrides,
                      "must not set gradient_checkpointing (use SFTConfig.activation_checkpointing)")
        if not isinstance(self.init_from, str) or not self.init_from:
            bad_field(name, "init_from", self.init_from, 'must be "scratch" or a Hugging Face GPT-2 directory')
        if self.init_from != "scratch" and not (Path(self.init_from) / "config.json").is_file():
            final = Path(self.init_from) / "final"  # a run directory, as grpo and eval say
            bad_field(name, "init_from", self.init_from, f"is a run directory; its model is {final}" if (
                final / "config.json").is_file() else 'must be "scratch" or a directory with config.json + '
                'model.safetensors (none found there)')
        try:
            model_config = self.model_config()
        except ValueError as exc:
            bad_field(name, "model_overrides", self.model_overrides, f"gives an invalid model ({exc})")
        if self.init_from == "scratch":
            return model_config.block_size
        hf = read_config_json(Path(self.init_from) / "config.json")  # CheckpointFormatError when unreadable
        for key, hf_key in (("n_layer",) * 2, ("n_head",) * 2, ("n_embd",) * 2, ("block_size", "n_positions")):
            if key in self.model_overrides and self.model_overrides[key] != hf.get(hf_key):  # the weights give the shape
                bad_field(name, "model_overrides", self.model_overrides,  # (block_size: the position embeddings' rows)
                          f"sets {key}={self.model_overrides[key]}, but the model in {self.init_from} has "
                          f"{hf_key}={hf.get(hf_key)}: a Hugging Face start keeps its shape")
        model_block = self.model_overrides.get("block_size", hf.get("n_positions", 1024))
        if not isinstance(model_block, int) or isinstance(model_block, bool):
            bad_field(name, "init_from", self.init_from, f"has a config.json whose n_positions is {model_block!r}")
        return model_block

    def _check_files(self, fname: str) -> None:
        """A list of existing JSONL files (a single path is accepted; lists become tuples)."""
        value = getattr(self, fname)
        if isinstance(value, (str, os.PathLike)):
            value = (value,)
        if not isinstance(value, (tuple, list)) or not all(isinstance(p, (str, os.PathLike)) for p in value):
            bad_field(type(self).__name__, fname, value, "must be a list of JSONL file paths")
        object.__setattr__(self, fname, tuple(str(p) for p in value))  # lists -> tuple (frozen)
        if dirs := [p for p in getattr(self, fname) if Path(p).is_dir()]:
            bad_field(type(self).__name__, fname, value, f"names directories, not files: {dirs} (give the JSONL "
                      "files in them)", got=False)
        if missing := [p for p in getattr(self, fname) if not Path(p).exists()]:
            bad_field(type(self).__name__, fname, value, f"names file(s) that do not exist: {missing}", got=False)
        if odd := [p for p in getattr(self, fname) if not Path(p).is_file()]:  # a FIFO or a device: read once, or never
            bad_field(type(self).__name__, fname, value, f"names what is not a regular file: {odd}", got=False)

    def model_config(self) -> GPTConfig:
        """The model shape of a scratch start (a Hugging Face start reads its config.json instead)."""
        return GPTConfig.preset(self.model, **self.model_overrides, gradient_checkpointing=self.activation_checkpointing)

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.grad_accum * self.block_size


# Beyond Trainer's, fields a resume may change: they do not change the math of the steps taken.
# max_steps may grow (the schedule stretches; a warning says so). Everything else must match.
RESUME_MAY_CHANGE = Trainer.resume_may_change | {"report_to", "train_data", "val_data", "max_steps", "compile",
                                                 "activation_checkpointing", "eval_interval", "eval_steps", "export_hf"}


# -- reading sample texts --------------------------------------------------------------------------

def sample_text(sample, where: str) -> str:
    """A sample's training text: a string; {"text": ...}; or TRL's prompt-completion form {"prompt": ...,
    "completion": ...}, trained on as prompt + completion (the whole text, as every sample here: no
    completion-only loss). Anything else raises naming `where`."""
    if isinstance(sample, str):
        text = sample
    elif isinstance(sample, Mapping) and isinstance(sample.get("text"), str):
        text = sample["text"]
    elif isinstance(sample, Mapping) and isinstance(sample.get("prompt"), str) and isinstance(sample.get("completion"), str):
        text = sample["prompt"] + sample["completion"]
    else:
        got = f"an object with keys {sorted(sample)}" if isinstance(sample, Mapping) else type(sample).__name__
        raise DataFormatError(f'{where}: expected a string, {{"text": ...}} or {{"prompt": ..., "completion": ...}} '
                              f"(strings), got {got}")
    if not text.strip():
        raise DataFormatError(f"{where}: an empty sample")
    return text


class TextReader:
    """How SFT reads its data files: JSON lines ``{"text": "..."}`` or ``{"prompt": "...", "completion": "..."}``
    (`sample_text`; ``.jsonl`` or gzipped ``.jsonl.gz``),
    each line checked as it is read (a bad one raises DataFormatError "file:line: reason"). A task layer
    passes its own, a subclass that may also render records of its own format; `name` enters
    a streamed run's fingerprint and `meta` is recorded in the model's export (GPT.meta)."""

    name = "text"
    meta: dict = {}
    # the GPT.meta keys this reader decides, present in `meta` or not (absent: the reader's default): a
    # start model's values for them are not this run's
    meta_keys: tuple[str, ...] = ()

    def iter_texts(self, paths: Sequence[str | os.PathLike]) -> Iterator[str]:
        """The sample texts of `paths`, one at a time (memory does not grow with the files)."""
        for path in paths:
            for lineno, rec in json_lines(path):
                if not isinstance(rec, Mapping):  # a bare JSON string or number: not a data file of ours
                    raise DataFormatError(f'{path}:{lineno}: expected an object {{"text": ...}} or {{"prompt": ..., '
                                          f'"completion": ...}}, got a JSON {type(rec).__name__}')
                yield sample_text(rec, f"{path}:{lineno}")

    def load_texts(self, paths: Sequence[str | os.PathLike]) -> list[str]:
        """All the sample texts of `paths`, in file order."""
        return list(self.iter_texts(paths))

    def prepare(self, cfg: SFTConfig) -> None:
        """Called once by SFTTrainer with its config, before any file is read: a task layer's reader checks the
        files (a split SFT must not train on) and settles what depends on the start model (its layout)."""


# -- packing ---------------------------------------------------------------------------------------

_TASK_BLOCK = 4096  # task draws are made in blocks of this many samples


@functools.lru_cache(maxsize=4)
def _task_block(seed: int, cuts: tuple[float, ...], block: int) -> np.ndarray:
    """The pools (0, 1, ... in task_weights' order) of samples block * _TASK_BLOCK, ... of a stream: a
    pure function. A uniform draw u falls in pool k when cuts[k-1] <= u < cuts[k] (cuts: _mix)."""
    u = np.random.default_rng([seed, 0x5F7, block]).random(_TASK_BLOCK)
    return np.searchsorted(np.array(cuts), u, side="right").astype(np.int8)


def _mix(task_weights: dict[str, float] | None) -> tuple[list[str], tuple[float, ...]]:
    """(pool names, cuts) of a stream: one pool "all" for None, else one per task with the running
    shares at which a draw moves on to the next task's pool."""
    if task_weights is None:
        return ["all"], ()
    total = sum(task_weights.values())
    return list(task_weights), tuple(itertools.accumulate(w / total for w in list(task_weights.values())[:-1]))


@functools.lru_cache(maxsize=8)
def _permutation(seed: int, pool: int, epoch: int, n: int) -> np.ndarray:
    """The order of a pool's n samples in one epoch (read-only: shared by every caller)."""
    return np.random.default_rng([seed, 1 + pool, epoch]).permutation(n)


def _encode_pool(enc, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, offsets): [EOT] + the tokens of each text, concatenated; text i is tokens[offsets[i]:offsets[i+1]]."""
    parts = [np.array([EOT_ID, *ids], dtype=np.int32)
             for start in range(0, len(texts), 8192)  # in chunks: Python int lists are big
             for ids in enc.encode_batch(texts[start: start + 8192], allowed_special={EOT_TOKEN})]
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=offsets[1:])
    return (np.concatenate(parts) if parts else np.empty(0, dtype=np.int32)), offsets  # an unused pool may be empty


def _check_tags(texts: Sequence[str], tasks: list[str], name: str) -> None:
    """Refuse a sample that starts with none of the tasks' tags, naming it by its index in `texts`."""
    if (i := next((i for i, t in enumerate(texts) if task_of(t.lstrip(), tasks) is None), None)) is not None:
        tags = " or ".join(f"'{t}: '" for t in tasks)
        raise ValueError(f"{name} sample {i} starts with {texts[i].lstrip()[:24]!r}: with task_weights set, "
                         f"every sample must start with {tags} (give its task a weight, 0 to leave it out, or set "
                         "task_weights=None)")


def _check_pools(task_weights: dict[str, float], present: list[str], name: str) -> None:
    """Refuse a task with a share above 0 and no samples in the data (present: the tasks that have some)."""
    if missing := [t for t, w in task_weights.items() if w > 0 and t not in present]:
        raise ValueError(f"task_weights gives {missing[0]!r} a share of {task_weights[missing[0]]:g}, but the {name} "
                         f"data has no sample that starts with '{missing[0]}: '; set its weight to 0 or add its samples")


class PackedStream:
    """An endless, shuffled, packed token stream over sample texts, with a resumable position.

    Each sample is stored as [EOT] + tokens and the stream reads EOT s_0 EOT s_1 ...; a batch is the
    next batch_size * block_size + 1 tokens cut into rows (input row[:-1], target row[1:]), so every
    token is a target exactly once. Attention crosses sample boundaries as in GPT-2 pretraining; the
    EOT says an unrelated sample starts. Each task's samples go in a fresh permutation every epoch.
    All draws are pure functions of (seed, sample index), so the position is three numbers and a
    resumed run reads the same tokens.

    texts: full sample strings ("S: 3+4 = 7", "R: abc = cba"); a trailing <|endoftext|> is dropped
    (each sample gets one in front). task_weights ({"S": 0.7, "R": 0.3}): the chance that the next
    sample is of each task, a task's samples being those that start with its tag ("S: ..."); every
    text must then start with one of them. None: one pool, the data's own mix.
    """

    def __init__(self, texts: Sequence[str], *, seed: int, task_weights: dict[str, float] | None = None,
                 name: str = "train", tokenizer=None):
        if len(texts) == 0:
            raise ValueError(f"{name} data is empty: no samples to train on")
        self.name, self.seed, self.task_weights = name, int(seed), task_weights
        self.pool_names, self.cuts = _mix(task_weights)
        if task_weights is None:
            groups = {"all": list(range(len(texts)))}
        else:
            _check_tags(texts, self.pool_names, name)
            groups = {t: [] for t in self.pool_names}
            for i, text in enumerate(texts):
                groups[task_of(text.lstrip(), self.pool_names)].append(i)
            _check_pools(task_weights, [t for t in self.pool_names if groups[t]], name)
        cleaned = [text.removesuffix(EOT_TOKEN) for text in texts]
        if empty := [i for i, t in enumerate(cleaned) if not t.strip()]:
            raise ValueError(f"{name} sample {empty[0]} is empty")
        enc = tokenizer or get_tokenizer()
        self.pools = [_encode_pool(enc, [cleaned[i] for i in members]) for members in groups.values()]
        self.n_tokens = sum(len(t) for t, _ in self.pools)
        self.n_samples = len(texts)
        self.fingerprint = self._fingerprint()
        self.reset()

    # -- position ---------------------------------------------------------------------------

    def reset(self) -> None:
        """Back to the start of the stream."""
        self._cursor = (0, 0, (0,) * len(self.pools))  # (sample index, token offset, draws per pool)

    def state_dict(self) -> dict:
        sample, offset, counts = self._cursor
        return {"sample": sample, "offset": offset, "counts": list(counts), "fingerprint": self.fingerprint}

    def load_state_dict(self, state: dict) -> None:
        if state.get("fingerprint") != self.fingerprint:
            raise ValueError(
                f"the {self.name} data differ from the data of the checkpoint (seed, task_weights, samples or "
                "their tokens changed), so resuming would not continue the same run; restore the original data "
                "or start a new run in another out_dir (--out)")
        self._cursor = (int(state["sample"]), int(state["offset"]), tuple(int(c) for c in state["counts"]))

    def _fingerprint(self) -> str:
        h = hashlib.sha256(json.dumps([self.seed, self.task_weights, self.pool_names]).encode())
        for tokens, offsets in self.pools:
            h.update(offsets.tobytes())
            h.update(tokens.tobytes())
        return h.hexdigest()[:32]

    # -- reading ----------------------------------------------------------------------------

    def _pool_of(self, sample: int) -> int:
        if len(self.pools) == 1:
            return 0
        return int(_task_block(self.seed, self.cuts, sample // _TASK_BLOCK)[sample % _TASK_BLOCK])

    def _sample_tokens(self, pool: int, k: int) -> np.ndarray:
        """The k-th sample drawn from a pool: epoch k // n, in that epoch's permutation."""
        tokens, offsets = self.pools[pool]
        epoch, j = divmod(k, len(offsets) - 1)
        i = _permutation(self.seed, pool, epoch, len(offsets) - 1)[j]
        return tokens[offsets[i]: offsets[i + 1]]

    def _read(self, n: int, cursor):
        out = np.empty(n, dtype=np.int64)
        sample, offset, counts = cursor[0], cursor[1], list(cursor[2])
        filled = 0
        while filled < n:
            pool = self._pool_of(sample)
            toks = self._sample_tokens(pool, counts[pool])
            take = min(n - filled, len(toks) - offset)
            out[filled: filled + take] = toks[offset: offset + take]
            filled += take
            offset += take
            if offset == len(toks):
                sample, offset = sample + 1, 0
                counts[pool] += 1
        return out, (sample, offset, tuple(counts))

    def next_batch(self, batch_size: int, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y), each (batch_size, block_size) int64 on CPU, y = x shifted by one token."""
        body, after = self._read(batch_size * block_size, self._cursor)
        last, _ = self._read(1, after)
        self._cursor = after
        buf = torch.from_numpy(np.concatenate([body, last]))
        return buf[:-1].view(batch_size, block_size), buf[1:].view(batch_size, block_size)

    def token_ids(self) -> np.ndarray:
        """The distinct GPT-2 ids of the stream (EOT included): what a task vocabulary must hold."""
        return np.unique(np.concatenate([tokens for tokens, _ in self.pools]))


def _content_digest(path: Path, whole: int = 8 << 20, block: int = 64 << 10, blocks: int = 128) -> str:
    """SHA-256 of a training file's size and bytes: all of them up to `whole` bytes; beyond, `blocks`
    evenly spaced blocks (first and last included): a streamed data set may be many GB, read at every start."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        if size <= whole:
            h.update(f.read())
        else:
            for i in range(blocks):
                f.seek((size - block) * i // (blocks - 1))
                h.update(f.read(block))
    return h.hexdigest()


class StreamingPackedStream(PackedStream):
    """PackedStream's stream (same packing, task draws and resumable position) read from JSONL files
    as it goes: each pool's samples come through a seeded shuffle buffer of `buffer` texts, the
    files in a fresh seeded order every epoch, each line tokenized when it is used. Every line is
    validated once when the stream is made (a pass over the files: a bad line, file:line, stops the run
    before its first step, not hours in, where its fix would change the data a resume must find).
    Memory is the buffer, whatever the size of the files. Deterministic given the seed; a resume
    (load_state_dict) replays the draws up to the saved position without tokenizing them."""

    def __init__(self, paths: Sequence[str | os.PathLike], *, seed: int, task_weights: dict[str, float] | None = None,
                 reader: TextReader | None = None, buffer: int = 10_000, name: str = "train", tokenizer=None):
        self.name, self.seed, self.task_weights = name, int(seed), task_weights
        self.paths, self.reader, self.buffer = [str(p) for p in paths], reader or TextReader(), int(buffer)
        self.enc = tokenizer or get_tokenizer()
        self.pool_names, self.cuts = _mix(task_weights)
        # every line checked now; fail now, not at the first draw from an empty pool
        present = {task_of(text.lstrip(), self.pool_names) for text in self.reader.iter_texts(self.paths)}
        if task_weights is None and not present:
            raise ValueError(f"{name} data is empty: no samples to train on")
        if task_weights is not None:
            _check_pools(task_weights, [t for t in self.pool_names if task_weights[t] > 0 and t in present], name)
        self.pools = [None] * len(self.pool_names)  # nothing held: see token_ids
        self.n_samples = self.n_tokens = None  # unknown without a pass over the data
        self.fingerprint = self._fingerprint()
        self.reset()

    def _texts(self, pool: str, epoch: int) -> Iterator[str]:
        """One epoch of a pool's texts: the files in this epoch's seeded order."""
        files = list(self.paths)
        random.Random(f"{self.seed}:{pool}:{epoch}").shuffle(files)
        for text in self.reader.iter_texts(files):
            if pool == "all" or task_of(text.lstrip(), self.pool_names) == pool:
                yield text

    def _shuffled(self, pool: str) -> Iterator[str]:
        """The pool's endless sample sequence: every epoch's texts through the shuffle buffer, which holds
        the whole pool where the pool is smaller (a larger buffer would fill from epoch after epoch, for
        ever)."""
        rng, buf, size = random.Random(f"{self.seed}:{pool}:buffer"), [], self.buffer
        for epoch in itertools.count():
            for text in self._texts(pool, epoch):
                if len(buf) < size:
                    buf.append(text)
                    continue
                j = rng.randrange(size)
                buf[j], text = text, buf[j]
                yield text
            if not buf:
                return  # an empty pool (refused when the stream is made)
            size = min(size, len(buf))

    def reset(self) -> None:
        super().reset()
        self._sources = [self._shuffled(pool) for pool in self.pool_names]
        self._drawn = [0] * len(self.pool_names)  # samples taken from each source
        self._recent: list[dict] = [{} for _ in self.pool_names]  # k -> tokens of the last samples read

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)  # checks the fingerprint, sets the cursor
        cursor = self._cursor
        self.reset()
        self._cursor = cursor
        for pool, k in enumerate(cursor[2]):  # replay: the k samples before the position, untokenized
            for _ in range(k):
                next(self._sources[pool])
            self._drawn[pool] = k

    def _fingerprint(self) -> str:
        # each file by name and content (names and sizes alone let a same-size edit resume on other data)
        files = [(Path(p).name, _content_digest(Path(p))) for p in self.paths]
        return hashlib.sha256(json.dumps(["stream", self.seed, self.task_weights, self.pool_names, self.reader.name,
                                          self.buffer, files]).encode()).hexdigest()[:32]

    def _sample_tokens(self, pool: int, k: int) -> np.ndarray:
        """The k-th sample of a pool; reads go forward (a batch looks one sample ahead, then resumes there)."""
        recent = self._recent[pool]
        while k not in recent:
            if k < self._drawn[pool]:
                raise RuntimeError(f"{self.name} stream: sample {k} of pool {pool} was read and dropped")
            text = next(self._sources[pool]).removesuffix(EOT_TOKEN)
            if not text.strip():
                raise ValueError(f"{self.name} data hold an empty sample")
            recent[self._drawn[pool]] = np.array([EOT_ID, *self.enc.encode(text, allowed_special={EOT_TOKEN})],
                                                 dtype=np.int32)
            self._drawn[pool] += 1
            recent.pop(self._drawn[pool] - 3, None)  # keep the last two
        return recent[k]

    def token_ids(self) -> np.ndarray:
        """The distinct GPT-2 ids of the data, from one pass over the files (bounded memory: a mark per id)."""
        seen = np.zeros(VOCAB_SIZE, dtype=bool)
        seen[EOT_ID] = True
        texts = (t.removesuffix(EOT_TOKEN) for t in self.reader.iter_texts(self.paths))
        while chunk := list(itertools.islice(texts, 8192)):
            for ids in self.enc.encode_batch(chunk, allowed_special={EOT_TOKEN}):
                seen[ids] = True
        return np.flatnonzero(seen)


def split_val(texts: Sequence[str], fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """(train, val): a seeded random `fraction` of the samples (at least one) held out for val."""
    n_val = max(1, round(len(texts) * fraction))
    if n_val >= len(texts):
        raise ValueError(f"cannot hold out {n_val} val samples from {len(texts)}: give val data or lower val_fraction")
    order = np.random.default_rng([seed, 0x7A1]).permutation(len(texts))
    val_idx = set(order[:n_val].tolist())
    return ([t for i, t in enumerate(texts) if i not in val_idx], [t for i, t in enumerate(texts) if i in val_idx])


# -- the trainer -----------------------------------------------------------------------------------

class SFTTrainer(Trainer):
    """One SFT run: model, optimizer, schedule, data streams and loop state. Built on an out_dir that
    holds a checkpoint (and resume=True), it continues that run; `train()` is trainer.Trainer's loop."""

    kind, name, metrics_file = "sft", "SFT", METRICS_FILE
    settings_file = "sft_config.json"
    resume_may_change = RESUME_MAY_CHANGE
    stop_hint = "Lower lr, check the data, or try dtype='fp32'."

    def __init__(self, cfg: SFTConfig, *, train_texts: Sequence[str] | None = None,
                 val_texts: Sequence[str] | None = None, reader: TextReader | None = None,
                 on_step: Callable[[dict], None] | None = None):
        super().__init__(cfg, cfg.max_steps, on_step=on_step)
        self.export_at_end = cfg.export_hf
        W = self.dist.world_size
        if W > 1 and cfg.batch_size % W:
            raise ValueError(f"SFTConfig.batch_size ({cfg.batch_size}) must be a multiple of the world size {W} "
                             "under torchrun: each rank trains on batch_size / world_size rows of every "
                             "micro-batch, so the global batch stays the same whatever the world size")
        if reader is not None and not callable(getattr(reader, "load_texts", None)):
            raise ValueError(f"reader must be a TextReader (or an object with its load_texts, meta, ...), got "
                             f"{type(reader).__name__} {reader!r:.60}")
        self.reader = reader or TextReader()  # how data files become texts; its meta goes into the export
        self.reader.prepare(cfg)
        self._load_data(train_texts, val_texts)
        self.data = self.train_stream
        ckpt = self.find_checkpoint()
        # vocab="task": the model is trained over the tokens its text uses and exported as full GPT-2;
        # a resumed run keeps its checkpoint's (no pass over streamed data)
        self.vocab = None
        val_changed = ckpt is not None and self._val_changed(ckpt)
        if cfg.vocab == "task":
            saved = (ckpt or {}).get("extra", {}).get("task_vocab")
            streams = [s for s in (self.train_stream, self.val_stream) if s is not None]
            self.vocab = TaskVocab(saved or np.unique(np.concatenate([s.token_ids() for s in streams])))
            log.info("task vocabulary: %d of GPT-2's %d tokens", len(self.vocab), VOCAB_SIZE)
            # val texts the vocabulary was not built from: other val data, or none at the start (its eval was off)
            unseen = saved and self.val_stream is not None and (val_changed or ckpt["extra"].get("val", "") is None)
            if unseen and len(missing := np.setdiff1d(self.val_stream.token_ids(), self.vocab.ids)):
                raise ValueError(f"the val texts (--val-data) hold {len(missing)} token(s) the run's task vocabulary lacks "
                                 f"(built at the run's start from its train and val texts; {ckpt['path'].name} holds it): "
                                 "resume with the run's own val data (or eval_interval as at its start), or start a new "
                                 "run in another out_dir (--out)")
        seed_everything(cfg.seed)
        self.model = self._build_model(ckpt).to(self.runtime.device)
        self.optimizer = build_adamw(self.model, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=cfg.betas,
                                     device_type=self.runtime.device.type)
        self.schedule = WarmupCosineSchedule(cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.max_steps)
        if ckpt is not None:
            self.restore(ckpt)
        self.seed_rank(ckpt, cfg.seed)
        forward = self.wrap_ddp(self.model)  # torch.compile shares its parameters (checkpoints save through unwrap)
        self.compiled = torch.compile(forward) if cfg.compile else forward
        # the training step that `rookworld bench` and notebook 04's matrix time (tuning.TrainStep)
        self.stepper = TrainStep(self.model, self.optimizer, self.runtime, grad_accum=cfg.grad_accum,
                                 grad_clip=cfg.grad_clip, loss_impl=cfg.loss_impl, forward_model=self.compiled,
                                 ddp=self.ddp)
        self.loss_impl = self.stepper.loss_impl

    def _load_data(self, train_texts, val_texts) -> None:
        cfg = self.cfg
        if train_texts is None and not cfg.train_data:
            raise ValueError("no training data: set SFTConfig.train_data (JSONL files) or pass train_texts")
        if cfg.stream and train_texts is None and val_texts is None:
            return self._stream_data()
        if cfg.stream:  # texts handed in are in memory: nothing to stream, and the stream's val rules would not hold
            raise ValueError("SFTConfig.stream=True reads train_data/val_data files as it goes; texts passed as "
                             "train_texts/val_texts are in memory already: pass stream=False, or give files")
        for name, given in (("train_texts", train_texts), ("val_texts", val_texts)):
            if isinstance(given, (str, bytes)):  # a str is a sequence of one-character samples
                raise ValueError(f"{name} must be a list of texts (or records), got one {type(given).__name__}: "
                                 "wrap it in a list")
        if train_texts is not None:
            train_texts = [sample_text(t, f"train_texts[{i}]") for i, t in enumerate(train_texts)]
        if val_texts is not None:  # an empty list is no val data, as None is
            val_texts = [sample_text(t, f"val_texts[{i}]") for i, t in enumerate(val_texts)] or None
        check_applies(cfg, "val_fraction", val_texts is None or cfg.val_fraction == 0,
                      "when val_texts are passed (they are the val samples): pass none")
        if train_texts is None:
            train_texts = self.reader.load_texts(cfg.train_data)
        if val_texts is None and cfg.val_data:
            val_texts = self.reader.load_texts(cfg.val_data)
        if cfg.task_weights is not None:  # named by their place in what the user gave, before any val split
            for name, texts in (("train", train_texts), ("val", val_texts or ())):
                _check_tags(texts, list(cfg.task_weights), name)
        if val_texts is None:
            if cfg.val_fraction > 0:  # held out whether or not eval is on, so the training data never depend on it
                train_texts, val_texts = split_val(train_texts, cfg.val_fraction, cfg.seed)
            elif cfg.eval_interval > 0:
                raise ValueError(f"SFTConfig.eval_interval is {cfg.eval_interval}, but there is no val data to measure on: "
                                 "set val_data or a val_fraction > 0 (or pass val_texts), or eval_interval 0")
        self.train_stream = PackedStream(train_texts, seed=cfg.seed, task_weights=cfg.task_weights, name="train")
        if cfg.batch_size * cfg.block_size > self.train_stream.n_tokens:  # before any memory is spent on it
            raise ValueError(f"SFTConfig.batch_size {cfg.batch_size} x block_size {cfg.block_size} = "
                             f"{cfg.batch_size * cfg.block_size:,} tokens per micro-batch is more than the "
                             f"{self.train_stream.n_tokens:,} tokens of the training data; lower --batch-size")
        log.info("SFT data: %d train samples (%d tokens with EOTs)%s", self.train_stream.n_samples,
                 self.train_stream.n_tokens, f", {len(val_texts)} val samples" if val_texts else "")
        self.val_stream = None
        if val_texts and cfg.eval_interval > 0:
            mix = cfg.task_weights  # the training mix (a task of weight 0 left out), where val holds every task of it
            if mix is not None and not {t for t, w in mix.items() if w > 0} <= {task_of(t.lstrip(), mix) for t in val_texts}:
                mix = None  # val data without some task: measure it as it is
            self.val_stream = PackedStream(val_texts, seed=cfg.seed, task_weights=mix, name="val")

    def _stream_data(self) -> None:
        """stream=True: both streams read their files as they go (see StreamingPackedStream)."""
        cfg = self.cfg
        if cfg.eval_interval > 0 and not cfg.val_data:
            raise ValueError(f"SFTConfig.eval_interval is {self.cfg.eval_interval}, but a stream (SFTConfig.stream) "
                             "holds no samples back for val: set val_data, or eval_interval=0")
        opts = dict(seed=cfg.seed, reader=self.reader, buffer=cfg.shuffle_buffer)
        self.train_stream = StreamingPackedStream(cfg.train_data, task_weights=cfg.task_weights, name="train", **opts)
        self.val_stream = None
        if cfg.eval_interval > 0:
            try:
                self.val_stream = StreamingPackedStream(cfg.val_data, task_weights=cfg.task_weights, name="val", **opts)
            except ValueError:  # val data without some task: measure it as it is
                self.val_stream = StreamingPackedStream(cfg.val_data, task_weights=None, name="val", **opts)
        log.info("SFT data: streaming %d train file(s), %d val file(s), shuffle buffer %d", len(cfg.train_data),
                 len(cfg.val_data), cfg.shuffle_buffer)

    def _build_model(self, ckpt: dict | None) -> GPT:
        """The checkpoint's model shape, a scratch preset, or a Hugging Face start."""
        cfg = self.cfg
        if ckpt is not None:
            model = GPT(dataclasses.replace(GPTConfig(**ckpt["model_config"]),
                                            gradient_checkpointing=cfg.activation_checkpointing))
            model.meta = dict(ckpt.get("model_meta") or {})  # what a Hugging Face start carried, as a run without a stop keeps it
        elif cfg.init_from == "scratch":
            model = GPT(self.vocab.compact_config(cfg.model_config()) if self.vocab else cfg.model_config())
        else:
            model = GPT.from_pretrained(cfg.init_from, **cfg.model_overrides,
                                        gradient_checkpointing=cfg.activation_checkpointing)
            check_vocabulary(model)  # GPT-2's tokens, no more: the export must be what eval and grpo sample
        # what a start model carried for its task stays, but not how it was sampled (a GRPO export's
        # rollout temperature) or rendered (the reader's keys): this run's text decides those
        stale = {ROLLOUT_TEMPERATURE_KEY, *self.reader.meta_keys}
        model.meta = {k: v for k, v in model.meta.items() if k not in stale} | self.reader.meta
        model.prompt_prefix = EOT_TOKEN  # PackedStream puts EOT before every sample
        if self.vocab is not None:
            pin_bias_coordinate(model)  # a checkpoint's values, loaded later, were pinned since step 0
        return model

    def model_ids(self, tokens: torch.Tensor) -> torch.Tensor:
        """GPT-2 token ids as the model reads them (compact ids under vocab='task')."""
        return tokens if self.vocab is None else self.vocab.compact(tokens)

    def resume_differences(self, ckpt: dict) -> dict[str, tuple]:
        """How the data files become texts (the reader: a layout, a candidate order) must be the checkpoint's:
        otherwise the data fingerprint differs, and the refusal blamed the data files."""
        saved = (ckpt.get("extra") or {}).get("reader")  # None: a checkpoint from before the record
        return {} if saved in (None, self.reader.name) else {"text reader": (saved, self.reader.name)}

    def resolved_settings(self) -> dict:
        """init_from as a full path: `model`, `model/` and `/abs/model` are one start (a resume named them apart)."""
        start = self.cfg.init_from
        return {**super().resolved_settings(), "init_from": start if start == "scratch" else str(Path(start).resolve())}

    def checkpoint_extra(self) -> dict:
        val = {"val": None if self.val_stream is None else self.val_stream.fingerprint, "reader": self.reader.name}
        return val if self.vocab is None else {**val, "task_vocab": self.vocab.ids.tolist()}  # export_hf expands with it

    def _val_changed(self, ckpt: dict) -> bool:
        """Whether the val loss is measured on other texts, or on more or fewer of them, than before the
        checkpoint (a resume may change --val-data and --eval-steps): said once, since eval/loss then
        breaks its series there. A checkpoint from before the record: not known, nothing said; eval off
        before or after the resume (eval_interval 0): no series to break."""
        extra, saved = ckpt.get("extra") or {}, ckpt.get("config") or {}
        if self.val_stream is None or extra.get("val", "") is None:  # no val loss from here, or none before it
            return False
        now = self.val_stream.fingerprint
        changed = [what for what, differs in (("val data (--val-data)", "val" in extra and extra["val"] != now),
                                               ("--eval-steps", saved.get("eval_steps", self.cfg.eval_steps)
                                                != self.cfg.eval_steps)) if differs]
        if changed:
            log.warning("%s changed since the checkpoint at step %d: eval/loss from then on is not comparable with "
                        "the values before", " and ".join(changed), ckpt["step"])
        return bool(changed)

    def export_model(self) -> GPT:
        """The full GPT-2 (the compact model expanded under vocab='task')."""
        return self.model if self.vocab is None else self.vocab.expand(self.model)

    # -- what the scaffold asks -----------------------------------------------------------

    def start(self, metrics) -> None:
        """A fresh run logs the val loss before step 1."""
        cfg = self.cfg
        if self.fresh and cfg.eval_interval > 0:
            self.record(metrics, {**dict.fromkeys(RECORD_KEYS), "step": 0, "eval/loss": self.evaluate(),
                                  "num_tokens": 0, "nonfinite/total": 0, "nonfinite/in_a_row": 0})

    def after_step(self, record: dict) -> None:
        cfg = self.cfg
        if cfg.eval_interval > 0 and (self.step % cfg.eval_interval == 0 or self.step == cfg.max_steps):
            record["eval/loss"] = self.evaluate()

    def postfix(self, rec: dict) -> str:
        parts = [f"loss {rec['loss']:.4f}" if rec["loss"] is not None else "loss nan"]
        if rec.get("eval/loss") is not None:
            parts.append(f"val {rec['eval/loss']:.4f}")
        parts += [f"lr {rec['learning_rate']:.2e}", f"{rec['throughput/tokens_per_s']:.0f} tok/s"]
        if rec["nonfinite/total"]:
            parts.append(f"skipped {rec['nonfinite/total']}")
        return ", ".join(parts)

    # -- one step ---------------------------------------------------------------------------

    def train_step(self, batch: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict:
        """One optimizer step; returns its metrics record.

        batch: an (x, y) pair to use for every micro-batch instead of the data stream (which then
        does not advance), e.g. to check that the model can overfit one batch.
        """
        cfg, rt = self.cfg, self.runtime
        t0 = time.perf_counter()
        self.compiled.train()
        lr = self.schedule.apply(self.optimizer, self.step)
        loss_sum = torch.zeros((), device=rt.device)
        for micro in range(cfg.grad_accum):
            x, y = map(self.model_ids, batch if batch is not None
                       else self.train_stream.next_batch(cfg.batch_size, cfg.block_size))
            # under DDP, gradients are all-reduced once, in the backward of the last micro-batch
            loss_sum += self.stepper.accumulate(rt.to_device(self.my_rows(x)), rt.to_device(self.my_rows(y)),
                                                sync=micro == cfg.grad_accum - 1)
        grad_norm = self.stepper.clip()  # DDP-averaged: the same on every rank
        # the mean over ranks (the loss of the global batch); a host sync, which the step needs anyway
        loss_value = self.rank_mean(loss_sum.item())
        applied = self.guard.observe(loss_value, grad_norm)  # every rank decides alike
        self.stepper.update(applied)
        self.step += 1
        rt.synchronize()
        dt = time.perf_counter() - t0
        tokens = cfg.tokens_per_step
        record = {"step": self.step, "loss": loss_value, "eval/loss": None, "learning_rate": lr,
                  "grad_norm": grad_norm.item(), "throughput/tokens_per_s": tokens / dt, "time/step": dt,
                  "num_tokens": self.step * tokens, "nonfinite/skipped": not applied, "nonfinite/total": self.guard.total,
                  "nonfinite/in_a_row": self.guard.in_a_row}
        assert tuple(record) == RECORD_KEYS
        return record

    @torch.no_grad()
    def evaluate(self) -> float | None:
        """Mean loss over the first eval_steps val batches (the same batches every call)."""
        if self.val_stream is None:
            return None
        cfg, rt = self.cfg, self.runtime
        self.compiled.eval()
        self.val_stream.reset()
        total = torch.zeros((), device=rt.device)
        for _ in range(cfg.eval_steps):
            x, y = map(self.model_ids, self.val_stream.next_batch(cfg.batch_size, cfg.block_size))
            total += self.stepper.loss(rt.to_device(self.my_rows(x)), rt.to_device(self.my_rows(y)))
        self.compiled.train()
        return self.rank_mean((total / cfg.eval_steps).item())


@dataclass
class SFTResult:
    """What `train_sft` returns."""

    model: GPT  # the trained model (on its training device, in train mode)
    step: int  # optimizer steps completed
    history: list[dict]  # the metrics records written by this call
    checkpoint: Path | None  # the last checkpoint saved
    final_dir: Path | None  # the Hugging Face export, if written
    out_dir: Path


def train_sft(cfg: SFTConfig, *, train_texts: Sequence[str] | None = None, val_texts: Sequence[str] | None = None,
              reader: TextReader | None = None, until: int | None = None,
              on_step: Callable[[dict], None] | None = None) -> SFTResult:
    """Run (or resume) SFT as configured. Texts given here replace cfg.train_data / cfg.val_data, which
    `reader` reads (default: {"text": ...} lines).

    on_step(record) is called after every record's metrics are written (e.g. to update a live plot), a fresh
    run's step-0 record (the val loss before training) included.
    """
    trainer = SFTTrainer(cfg, train_texts=train_texts, val_texts=val_texts, reader=reader, on_step=on_step)
    history = trainer.train(until=until)
    done = trainer.step >= cfg.max_steps and cfg.export_hf
    return SFTResult(trainer.export_model(), trainer.step, history, trainer.last_checkpoint,
                     trainer.out_dir / FINAL_DIR if done else None, trainer.out_dir)
