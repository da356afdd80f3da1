"""GPT-2 in pure PyTorch, with a static KV cache, reading and writing the Hugging Face GPT-2 format.

The math is GPT-2's exactly: pre-LayerNorm blocks (eps 1e-5), tanh-approximate GELU ("gelu_new"),
learned absolute positions, and an LM head tied to the token embedding. Module names mirror
Hugging Face's `GPT2LMHeadModel`, so loading and saving its format (config.json + model.safetensors)
is a rename plus the Conv1D transpose: Hugging Face stores matmul weights shaped (in, out), the
transpose of nn.Linear. transformers is never imported here.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
from dataclasses import fields, replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch.utils.checkpoint import checkpoint

from .config import config_class, option, validate
from .lm_head_loss import linear_cross_entropy, linear_token_logprobs
from .paths import TMP_PREFIX, atomic_path, atomic_write, naming
from .tokenizer import EOT_TOKEN, write_hf_tokenizer

ATTN_IMPLS = ("sdpa", "math")


@config_class(frozen=True)
class GPTConfig:
    """Shape and behaviour of a GPT-2 model. Defaults are GPT-2 124M (124,439,808 parameters)."""

    block_size: int = option(1024, "maximum sequence length (learned positions)", min=1)
    vocab_size: int = option(50257, "real vocabulary; logits are always returned for exactly this many", min=1)
    n_layer: int = option(12, "transformer blocks", min=1)
    n_head: int = option(12, "attention heads per block", min=1)
    n_embd: int = option(768, "residual stream width", min=1)
    dropout: float = option(0.0, "residual (attention output, MLP) dropout while training; off in eval (GPT-2's "
                            "resid_pdrop)", min=0.0, max=1.0, max_open=True)
    embd_dropout: float | None = option(None, "dropout on the embeddings (embd_pdrop); None: = dropout",
                                        min=0.0, max=1.0, max_open=True)
    attn_dropout: float | None = option(None, "dropout on the attention weights (attn_pdrop); None: = dropout",
                                        min=0.0, max=1.0, max_open=True)
    bias: bool = option(True, "biases in linear layers and LayerNorms (GPT-2 has them)")
    layer_norm_epsilon: float = option(1e-5, "GPT-2's LayerNorm epsilon", min=0.0, min_open=True)
    pad_vocab_to_multiple: int = option(1, "pad the embedding rows to a multiple (64 -> 50304) for faster matmuls",
                                        min=1)
    attn_impl: str = option("sdpa", '"sdpa" (F.scaled_dot_product_attention) or "math" (explicit, FLOP-countable)',
                            choices=ATTN_IMPLS)
    gradient_checkpointing: bool = option(False, "recompute each block's activations in backward to save memory")

    def __post_init__(self):
        validate(self)
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")

    @property
    def embd_pdrop(self) -> float:
        return self.dropout if self.embd_dropout is None else self.embd_dropout

    @property
    def attn_pdrop(self) -> float:
        return self.dropout if self.attn_dropout is None else self.attn_dropout

    @property
    def padded_vocab_size(self) -> int:
        m = self.pad_vocab_to_multiple
        return (self.vocab_size + m - 1) // m * m

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @classmethod
    def preset(cls, name: str, **overrides) -> "GPTConfig":
        """A named shape from PRESETS, with any field overridden."""
        if name not in PRESETS:
            raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(PRESETS)}")
        return replace(PRESETS[name], **overrides)


PRESETS = {
    "gpt2": GPTConfig(),  # 124M
    "gpt2-medium": GPTConfig(n_layer=24, n_head=16, n_embd=1024),  # 355M
    "gpt2-large": GPTConfig(n_layer=36, n_head=20, n_embd=1280),  # 774M
    "gpt2-xl": GPTConfig(n_layer=48, n_head=25, n_embd=1600),  # 1558M
    # CPU-sized models for tests, notebooks and the cpu profile; same vocabulary, shorter context.
    "tiny": GPTConfig(n_layer=2, n_head=2, n_embd=64, block_size=256),
    "cpu-small": GPTConfig(n_layer=4, n_head=4, n_embd=128, block_size=256),
    "cpu-medium": GPTConfig(n_layer=6, n_head=6, n_embd=384, block_size=256),
}


class KVCache:
    """A preallocated key/value cache: (n_layer, B, n_head, max_len, head_dim), written in place.

    Static shapes mean no reallocation per decoded token and make the decode step graph-capturable.
    """

    def __init__(self, config: GPTConfig, batch_size: int, max_len: int, device, dtype):
        if max_len > config.block_size:
            raise ValueError(f"KV cache length {max_len} exceeds the model's block_size {config.block_size}")
        shape = (config.n_layer, batch_size, config.n_head, max_len, config.head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.max_len = max_len

    def update(self, layer: int, start: int | torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        if isinstance(start, torch.Tensor):
            # Static-shape decode: the write position is a device tensor (no host sync, so the step
            # can be captured as a CUDA graph) and attention runs over the whole buffer, whose
            # unwritten slots the caller's mask hides.
            self.k[layer].index_copy_(2, start, k.to(self.k.dtype))
            self.v[layer].index_copy_(2, start, v.to(self.v.dtype))
            return self.k[layer], self.v[layer]
        end = start + k.size(2)
        self.k[layer, :, :, start:end] = k
        self.v[layer, :, :, start:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.resid_dropout = nn.Dropout(config.dropout)

    def forward(self, x, attn_mask=None, cache: KVCache | None = None, layer: int = 0, start: int = 0):
        B, T, C = x.shape
        nh, hd = self.config.n_head, self.config.head_dim
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, nh, hd).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            k, v = cache.update(layer, start, k, v)
        dropout_p = self.config.attn_pdrop if self.training else 0.0
        if attn_mask is None and q.size(-2) != k.size(-2):  # new tokens after cached ones: their causal mask
            # sits at the bottom right; SDPA's is_causal would put it at the top left
            attn_mask = torch.ones(q.size(-2), k.size(-2), dtype=torch.bool, device=q.device).tril(k.size(-2) - q.size(-2))
        is_causal = attn_mask is None
        if self.config.attn_impl == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)
        else:
            y = _math_attention(q, k, v, attn_mask, dropout_p)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True = may attend) as the additive one (0 / -inf) that SDPA makes of it.

    SDPA converts a boolean mask this way on every call; GPT.forward converts once for all layers,
    which halved a CPU decode step's attention time. The outputs are bit for bit the same."""
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, float("-inf"))


def _attention_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the queries will have: autocast's where it is on, else the activations'."""
    return torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype


def _math_attention(q, k, v, attn_mask, dropout_p):
    """softmax(QK^T / sqrt(d) + mask) V, written out so FLOP counters and readers see every op;
    attn_mask boolean (True = may attend) or additive (additive_mask), None for plain causal."""
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    if attn_mask is None:
        Tq, Tk = q.size(-2), k.size(-2)
        attn_mask = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(diagonal=Tk - Tq)
    if attn_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    else:
        scores = scores + attn_mask
    weights = F.dropout(F.softmax(scores, dim=-1), p=dropout_p)
    return weights @ v


class MLP(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x):
        # GPT-2 uses the tanh approximation; exact-erf GELU drifts from the released weights.
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon, bias=config.bias)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon, bias=config.bias)
        self.mlp = MLP(config)

    def forward(self, x, attn_mask=None, cache=None, layer=0, start=0):
        x = x + self.attn(self.ln_1(x), attn_mask, cache, layer, start)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """GPT-2: token and position embeddings, n_layer pre-LayerNorm blocks, an LM head tied to wte."""

    def __init__(self, config: GPTConfig | None = None):
        super().__init__()
        if config is not None and not isinstance(config, GPTConfig):  # GPT({}) built the 124M model ({} is falsy)
            raise TypeError(f"GPT(config): give a GPTConfig (GPTConfig(**fields), GPTConfig.preset(name)) or None, "
                            f"got {type(config).__name__}")
        self.config = config = config or GPTConfig()
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.padded_vocab_size, config.n_embd),
                wpe=nn.Embedding(config.block_size, config.n_embd),
                drop=nn.Dropout(config.embd_pdrop),
                h=nn.ModuleList(Block(config) for _ in range(config.n_layer)),
                ln_f=nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon, bias=config.bias),
            )
        )
        self.lm_head = nn.Linear(config.n_embd, config.padded_vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied, as in GPT-2
        # What every prompt is preceded by (tokenizer.encode_prompt): EOT for the models our SFT trains,
        # which saw EOT before every sample. `meta`: what a task layer records about the model (the
        # chess layer: its text layout), under keys starting with META_PREFIX. Both travel in config.json;
        # `source`: the directory from_pretrained read (None for a fresh model).
        self.prompt_prefix = EOT_TOKEN
        self.meta: dict = {}
        self.source: str | None = None
        self.apply(self._init_weights)
        # GPT-2 scales the residual projections by 1/sqrt(2 * n_layer) so the residual stream's
        # variance does not grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self) -> int:
        """Unique parameters (the tied head counted once); padded vocab rows included if any."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, idx, position_ids=None, attn_mask=None, cache: KVCache | None = None,
                start: int | torch.Tensor = 0,
                last_only: bool = False, targets: torch.Tensor | None = None, logits_from: int = 0,
                score_tokens: torch.Tensor | None = None, temperature: float = 1.0):
        """Logits (B, T, vocab_size) for token ids idx (B, T); (B, 1, vocab_size) with last_only.

        logits_from skips the LM head (a large share of a small model's cost) on positions before it,
        which still feed attention: scoring completions needs no logits over the prompt. With targets
        (B, T) it returns the mean next-token cross-entropy instead (targets of -1 ignored), equal to
        `lm_loss(model(idx), targets)` but from the fused, chunked `lm_head_loss` (no logits stored).
        With score_tokens (B, T - logits_from) it returns (log-probs, entropies), each (B, T - logits_from),
        of those tokens under softmax(logits / temperature) at the positions from logits_from on, from
        `lm_head_loss.linear_token_logprobs` (no logits stored; the entropies carry no gradient).

        position_ids (B, T) default to start..start+T-1; attn_mask is a boolean (B, 1, T, T_total)
        mask, True = may attend (left-padded batches), or its additive form (additive_mask), else
        plain causal. `start` is where idx goes in the cache: an int, or a (1,) device tensor for
        static-shape decoding (CUDA graphs).
        """
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.is_floating_point() or idx.dtype == torch.bool:
            what = f"{idx.dim()}-D {idx.dtype} tensor" if isinstance(idx, torch.Tensor) else type(idx).__name__
            raise ValueError(f"GPT: idx must be a 2-D (batch, time) tensor of token ids (torch.long), got a {what}"
                             + (" (one sequence: idx[None])" if isinstance(idx, torch.Tensor) and idx.dim() == 1 else ""))
        B, T = idx.shape
        if isinstance(start, torch.Tensor):  # static-shape decode (see KVCache.update)
            if position_ids is None or attn_mask is None:
                raise ValueError("a tensor `start` (static-shape decode) needs explicit position_ids and attn_mask")
        elif position_ids is None:
            position_ids = torch.arange(start, start + T, device=idx.device).unsqueeze(0)
        if not isinstance(start, torch.Tensor) and start + T > self.config.block_size:
            raise ValueError(f"sequence of length {start + T} exceeds block_size {self.config.block_size}")
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(position_ids))
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = additive_mask(attn_mask, _attention_dtype(x))
        use_ckpt = self.config.gradient_checkpointing and self.training and cache is None
        for i, block in enumerate(self.transformer.h):
            if use_ckpt:
                x = checkpoint(block, x, attn_mask, None, i, start, use_reentrant=False)
            else:
                x = block(x, attn_mask, cache, i, start)
        # Padded vocabulary rows are never targets, sampled or scored. Sliced only when there are
        # any: a slice's backward is a zeroed copy of the whole (V, C) gradient.
        padded = self.config.padded_vocab_size > self.config.vocab_size
        weight = self.lm_head.weight[: self.config.vocab_size] if padded else self.lm_head.weight
        if targets is not None:
            return linear_cross_entropy(self.transformer.ln_f(x), weight, targets)
        if score_tokens is not None:
            return linear_token_logprobs(self.transformer.ln_f(x[:, logits_from:]), weight, score_tokens, temperature)
        if last_only:
            x = x[:, -1:]
        elif logits_from:
            x = x[:, logits_from:]
        logits = self.lm_head(self.transformer.ln_f(x))
        return logits[..., : self.config.vocab_size] if padded else logits

    # --- Hugging Face GPT-2 format

    @classmethod
    def from_pretrained(cls, directory: str | Path, **config_overrides) -> "GPT":
        """Load a Hugging Face GPT-2 directory (config.json + model.safetensors), every key checked in
        both directions: a silently missing key (strict=False) leaves a layer at its random init, and
        the model still runs, just badly. In eval mode (dropout off), as transformers' from_pretrained
        returns it; a trainer switches to train mode itself."""
        if not isinstance(directory, (str, os.PathLike)) or not str(directory).strip():
            raise ValueError(f"GPT.from_pretrained: directory must name a Hugging Face GPT-2 folder (config.json + "
                             f"model.safetensors), got {directory!r}")
        config_path, weights_path = Path(directory) / "config.json", Path(directory) / "model.safetensors"
        for path in (config_path, weights_path):
            if not path.is_file():
                raise _not_found(path)
        hf = read_config_json(config_path)
        config = config_from_hf(hf, config_path, **config_overrides)
        prefix = hf.get(PROMPT_PREFIX_KEY, "")
        if not isinstance(prefix, str):
            raise CheckpointFormatError(f"{config_path}: {PROMPT_PREFIX_KEY} must be a string "
                                        f"(e.g. \"<|endoftext|>\"), got {prefix!r}")
        # Checkpoints saved from GPT2Model (no LM head) have no "transformer." prefix.
        state = {(k if k.startswith(("transformer.", "lm_head.")) else "transformer." + k): v
                 for k, v in read_safetensors(weights_path).items() if not k.endswith(MASK_BUFFER_SUFFIXES)}
        head = state.pop("lm_head.weight", None)
        if head is None and hf.get("tie_word_embeddings", True) is False:  # transformers: a separate head, missing
            raise CheckpointFormatError(f"{config_path}: tie_word_embeddings is false and {weights_path.name} holds "
                                        "no lm_head.weight (transformers would start that head at random); GPT-2 "
                                        "ties the head to transformer.wte.weight: set tie_word_embeddings to true")

        model = cls(config)
        own = model.state_dict()
        own.pop("lm_head.weight")  # tied to transformer.wte.weight
        parts = [f"{what} keys: {', '.join(sorted(keys))}" for what, keys in
                 (("missing", set(own) - set(state)), ("unexpected", set(state) - set(own))) if keys]
        if parts:
            raise CheckpointFormatError(f"{weights_path}: " + "; ".join(parts))
        if head is not None and not torch.equal(head, state["transformer.wte.weight"]):
            raise CheckpointFormatError(f"{weights_path}: lm_head.weight differs from transformer.wte.weight "
                                        "(GPT-2 ties them)")
        converted = {}
        for key, tensor in state.items():
            conv1d = key.endswith(CONV1D_SUFFIXES)  # stored (in, out), as transformers' Conv1D holds them
            want = tuple(own[key].shape)[::-1] if conv1d else tuple(own[key].shape)
            if key == "transformer.wte.weight":  # the file holds the vocabulary's rows, no padding
                want = (config.vocab_size, *want[1:])
            if tuple(tensor.shape) != want:  # both in the file's layout
                raise CheckpointFormatError(f"{weights_path}: {key} has shape {tuple(tensor.shape)}, expected {want}")
            if not tensor.is_floating_point():  # an integer copy would load as truncated weights, silently
                raise CheckpointFormatError(f"{weights_path}: {key} holds {tensor.dtype} values; weights are floating point")
            if not torch.isfinite(tensor).all():  # trains only NaN losses, samples one token: say where
                raise CheckpointFormatError(f"{weights_path}: {key} holds NaN or infinite values")
            if conv1d:
                tensor = tensor.t()
            if key == "transformer.wte.weight":  # zero rows up to the padded vocabulary
                tensor = F.pad(tensor, (0, 0, 0, config.padded_vocab_size - config.vocab_size))
            converted[key] = tensor.to(own[key].dtype)
        converted["lm_head.weight"] = converted["transformer.wte.weight"]  # the same tied parameter
        model.load_state_dict(converted, strict=True)
        model.prompt_prefix, model.source = prefix, str(directory)
        model.meta = {k: v for k, v in hf.items() if k.startswith(META_PREFIX) and k != PROMPT_PREFIX_KEY}
        return model.eval()

    def exported_tensors(self):
        """(name, tensor) of each weight an export holds, in this model's own layout: the tied head left
        out (transformers re-ties it from tie_word_embeddings), the vocabulary without its padding rows."""
        for key, tensor in self.state_dict().items():
            if key != "lm_head.weight":
                yield key, tensor[: self.config.vocab_size] if key == "transformer.wte.weight" else tensor

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights as an export holds them, on the CPU: Hugging Face's names and Conv1D layout
        (`exported_tensors`). Two models export the same weights when these are equal, whatever their
        padding."""
        return {key: (t.t() if key.endswith(CONV1D_SUFFIXES) else t).detach().cpu().contiguous()
                for key, t in self.exported_tensors()}

    def save_pretrained(self, directory: str | Path) -> None:
        """Write config.json + model.safetensors that transformers' GPT2LMHeadModel loads, and GPT-2's
        tokenizer files for its AutoTokenizer (tokenizer.write_hf_tokenizer, where transformers is here)."""
        if bad := [k for k in self.meta if not k.startswith(META_PREFIX) or k == PROMPT_PREFIX_KEY]:
            raise ValueError(f"model.meta keys must start with {META_PREFIX!r} (and not be {PROMPT_PREFIX_KEY!r}): {bad}")
        if not self.config.bias:  # its export would lack keys every GPT-2 loader asks for (from_pretrained refused it)
            raise ValueError("GPTConfig.bias is False: GPT-2's format (the export) holds a bias in every layer; train "
                             "with bias=True to export")
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        state = self.hf_state_dict()
        weights = directory / "model.safetensors"
        for stale in directory.glob(f"{TMP_PREFIX}{weights.name}.*"):  # a killed export's (one writer per directory)
            stale.unlink(missing_ok=True)
        with atomic_path(weights) as tmp:
            try:
                save_file(state, str(tmp), metadata={"format": "pt"})
            except SafetensorError as exc:  # a full disk, say: an OSError naming the file, not safetensors' own
                raise _os_error(exc, weights) from None
        write_hf_tokenizer(directory, self.config.block_size)  # before config.json, the mark of a whole export
        text = json.dumps({**hf_config_dict(self.config), **self.meta, PROMPT_PREFIX_KEY: self.prompt_prefix},
                          indent=2) + "\n"
        config_path = directory / "config.json"
        with naming(config_path):
            atomic_write(config_path, lambda f: f.write(text.encode()))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -1) -> torch.Tensor:
    """Mean next-token cross-entropy; positions whose target is ignore_index do not count."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=ignore_index)


def config_from_dict(d: dict) -> GPTConfig:
    if unknown := sorted(set(d) - {f.name for f in fields(GPTConfig)}):
        raise ValueError(f"unknown GPTConfig field(s): {', '.join(unknown)}")
    return GPTConfig(**d)


# --- Hugging Face GPT-2 format: what GPT.from_pretrained and save_pretrained check and write

CONV1D_SUFFIXES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
# Causal-mask buffers that older transformers versions saved with the weights; they hold no learned
# values, so they are recognised and dropped rather than reported as unexpected.
MASK_BUFFER_SUFFIXES = (".attn.bias", ".attn.masked_bias")  # note the dot: not attn.c_attn.bias
# Settings of transformers' GPT2Config that change the math; we implement GPT-2's defaults only.
REQUIRED_HF_SETTINGS = {
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "reorder_and_upcast_attn": False,
    "add_cross_attention": False,
}
TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
# transformers' three GPT-2 dropout rates -> our GPTConfig fields; 0.1 each when absent, as in
# transformers' GPT2Config (every GPT-2 release writes them).
HF_DROPOUTS = {"resid_pdrop": "dropout", "embd_pdrop": "embd_dropout", "attn_pdrop": "attn_dropout"}
HF_DEFAULT_PDROP = 0.1
# config.json keys of our own (transformers ignores unknown keys): GPT.prompt_prefix, and a task
# layer's GPT.meta. A GPT-2 directory without PROMPT_PREFIX_KEY is prompted with no prefix.
META_PREFIX = "rookworld_"
PROMPT_PREFIX_KEY = "rookworld_prompt_prefix"
# a GRPO export's rollout temperature (GPT.meta), which sampled evaluations use; an SFT run drops it
ROLLOUT_TEMPERATURE_KEY = "rookworld_rollout_temperature"


class CheckpointFormatError(ValueError):
    """A Hugging Face GPT-2 directory that cannot be loaded faithfully."""


def _not_found(path: Path) -> CheckpointFormatError:
    d = path.parent
    if path.name == "model.safetensors" and (other := next((n for n in ("model.safetensors.index.json", "pytorch_model.bin")
                                                             if (d / n).is_file()), None)):
        how = "sharded weights" if other.endswith("index.json") else "PyTorch pickle weights"
        return CheckpointFormatError(f"{path} not found: {d} holds {how} ({other}), which are not read here; "
                                     "save one model.safetensors with transformers: GPT2LMHeadModel.from_pretrained(DIR)"
                                     ".save_pretrained(NEW_DIR, max_shard_size='100GB')")
    if path.name == "config.json" and path.parent.is_file():
        return CheckpointFormatError(f"{d} is a file, not a model directory; a training checkpoint (step_*.pt) "
                                     "exports with rookworld_lib.core.checkpoint.export_hf")
    if path.name == "config.json" and (d / "final" / "config.json").is_file():
        return CheckpointFormatError(f"{path} not found: {d} is a run directory; its model is {d / 'final'}")
    return CheckpointFormatError(f"{path} not found: a Hugging Face GPT-2 directory needs config.json and "
                                 "model.safetensors")


def read_config_json(path: Path) -> dict:
    """A config.json as a dict; CheckpointFormatError naming the file when it is missing, unreadable,
    not JSON or not a JSON object."""
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError):
        raise _not_found(Path(path)) from None
    except json.JSONDecodeError as exc:
        raise CheckpointFormatError(f"{path}: not valid JSON (line {exc.lineno} column {exc.colno}: "
                                    f"{exc.msg})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckpointFormatError(f"{path}: cannot read ({exc})") from None
    if not isinstance(d, dict):
        raise CheckpointFormatError(f"{path}: expected a JSON object of GPT-2 settings, got {type(d).__name__}")
    return d


def read_safetensors(path: Path) -> dict:
    """The tensors of a .safetensors file; CheckpointFormatError naming the file when it is truncated,
    corrupt or unreadable (safetensors' own SafetensorError names no file)."""
    try:
        return load_file(str(path))
    except SafetensorError as exc:
        raise CheckpointFormatError(f"{path}: truncated or corrupt safetensors file ({exc}); copy or export "
                                    "the model again") from None
    except OSError as exc:
        raise CheckpointFormatError(f"{path}: cannot read ({exc.strerror or exc})") from None


def hf_config_dict(config: GPTConfig) -> dict:
    """transformers' GPT2Config for `config`, as config.json holds it."""
    return {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "activation_function": "gelu_new",
        "n_positions": config.block_size, "n_ctx": config.block_size, "n_embd": config.n_embd,
        "n_layer": config.n_layer, "n_head": config.n_head, "n_inner": None, "vocab_size": config.vocab_size,
        "layer_norm_epsilon": config.layer_norm_epsilon,
        "resid_pdrop": config.dropout, "embd_pdrop": config.embd_pdrop, "attn_pdrop": config.attn_pdrop,
        "bos_token_id": 50256, "eos_token_id": 50256, "tie_word_embeddings": True,
        **REQUIRED_HF_SETTINGS,
        "initializer_range": 0.02, "torch_dtype": "float32",
    }


def config_from_hf(d: dict, source: Path, **overrides) -> GPTConfig:
    """The GPTConfig of a config.json dict (GPT-2's math only), with `overrides` applied."""
    if d.get("model_type", "gpt2") != "gpt2":
        raise CheckpointFormatError(f"{source}: model_type is {d.get('model_type')!r}, expected 'gpt2'")
    act = d.get("activation_function", "gelu_new")
    if act not in TANH_GELUS:
        raise CheckpointFormatError(f"{source}: activation_function {act!r} is not GPT-2's tanh GELU {TANH_GELUS}")
    missing = [k for k in ("n_positions", "vocab_size", "n_layer", "n_head", "n_embd") if k not in d]
    if missing:
        raise CheckpointFormatError(f"{source}: config.json lacks the field{'s' if len(missing) > 1 else ''} "
                                    f"{', '.join(map(repr, missing))}")
    n_inner = d.get("n_inner")
    if n_inner is not None and (not isinstance(d["n_embd"], int) or n_inner != 4 * d["n_embd"]):
        raise CheckpointFormatError(f"{source}: n_inner={n_inner} is not 4 * n_embd; only GPT-2's MLP width "
                                    "is supported")
    for key, want in REQUIRED_HF_SETTINGS.items():
        if d.get(key, want) != want:
            raise CheckpointFormatError(f"{source}: {key}={d[key]!r} is not supported (GPT-2 uses {want!r})")
    base = dict(block_size=d["n_positions"], vocab_size=d["vocab_size"], n_layer=d["n_layer"], n_head=d["n_head"],
                n_embd=d["n_embd"], layer_norm_epsilon=d.get("layer_norm_epsilon", 1e-5))
    for key, name in HF_DROPOUTS.items():
        v = d.get(key, HF_DEFAULT_PDROP)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v < 1.0:
            raise CheckpointFormatError(f"{source}: {key}={v!r} is not a dropout rate in [0, 1)")
        base[name] = float(v)
    try:
        GPTConfig(**base)
    except (TypeError, ValueError) as exc:
        raise CheckpointFormatError(f"{source}: {exc}") from None
    if "dropout" in overrides:  # dropout=... sets every rate unless they are given too
        base.update(embd_dropout=None, attn_dropout=None)
    base.update(overrides)
    try:
        return GPTConfig(**base)
    except (TypeError, ValueError) as exc:  # TypeError: an unknown field name, or a value of the wrong type
        raise ValueError(f"model overrides {overrides} for {source}: {exc}") from None


def _os_error(exc: Exception, path: Path) -> OSError:
    """safetensors reports I/O failures as text ("... No space left on device (os error 28)"): the
    OSError they stand for, naming `path`."""
    m = re.search(r"os error (\d+)", str(exc))
    code = int(m.group(1)) if m else errno.EIO
    return OSError(code, os.strerror(code) if m else f"could not write the model ({exc})", str(path))


# --- FLOPs of the model's matmuls (lab.perf turns them into MFU; sampling picks decode threads by them)

FLOP_KINDS = ("train", "forward", "decode")


def flops_breakdown(config: GPTConfig, seq_len: int) -> dict[str, int]:
    """Forward FLOPs per token, by matmul, of a GPT-2 shaped model whose attention spans `seq_len` keys
    (2 per multiply-add, the matmuls only, attention over the full score matrix: docs/perf.md's table)."""
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
    """Model FLOPs per token of `kind`: "forward" (a pass over `seq_len` tokens), "train" (3x forward: backward
    is 2x, no optimizer step) or "decode" (one new token attending to `seq_len` cached keys, its own included)."""
    if kind not in FLOP_KINDS:
        raise ValueError(f"kind must be one of {FLOP_KINDS}, got {kind!r}")
    fwd = sum(flops_breakdown(config, seq_len).values())
    return 3 * fwd if kind == "train" else fwd
