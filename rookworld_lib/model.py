"""GPT-2 in pure PyTorch, with Hugging Face interop and a static KV cache.

The math is GPT-2's exactly: pre-LayerNorm blocks (eps 1e-5), tanh-approximate GELU ("gelu_new"),
learned absolute positions, and an LM head tied to the token embedding. Module names mirror
Hugging Face's `GPT2LMHeadModel` so that loading and saving is a rename plus the Conv1D transpose.
transformers is never imported here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .lm_head_loss import linear_cross_entropy
from .tokenizer import EOT_TOKEN

ATTN_IMPLS = ("sdpa", "math")


@dataclass(frozen=True)
class GPTConfig:
    """Shape and behaviour of a GPT-2 model. Defaults are GPT-2 124M (124,439,808 parameters)."""

    block_size: int = 1024  # maximum sequence length (learned positions)
    vocab_size: int = 50257  # real vocabulary; logits are always returned for exactly this many
    n_layer: int = 12  # transformer blocks
    n_head: int = 12  # attention heads per block
    n_embd: int = 768  # residual stream width
    dropout: float = 0.0  # residual (attention output, MLP) dropout while training; off in eval (GPT-2's resid_pdrop)
    embd_dropout: float | None = None  # dropout on the embeddings (embd_pdrop); None: = dropout
    attn_dropout: float | None = None  # dropout on the attention weights (attn_pdrop); None: = dropout
    bias: bool = True  # biases in linear layers and LayerNorms (GPT-2 has them)
    layer_norm_epsilon: float = 1e-5  # GPT-2's LayerNorm epsilon
    pad_vocab_to_multiple: int = 1  # pad the embedding rows to a multiple (64 -> 50304) for faster matmuls
    attn_impl: str = "sdpa"  # "sdpa" (F.scaled_dot_product_attention) or "math" (explicit, FLOP-countable)
    gradient_checkpointing: bool = False  # recompute each block's activations in backward to save memory

    def __post_init__(self):
        for name in ("block_size", "vocab_size", "n_layer", "n_head", "n_embd", "pad_vocab_to_multiple"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"GPTConfig.{name} must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise ValueError(f"GPTConfig.n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        for name, optional in (("dropout", False), ("embd_dropout", True), ("attn_dropout", True)):
            value = getattr(self, name)
            if (value is not None or not optional) and (
                    isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0):
                raise ValueError(f"GPTConfig.{name} must be a number in [0, 1){' or None' * optional}, got {value!r}")
        if self.attn_impl not in ATTN_IMPLS:
            raise ValueError(f"GPTConfig.attn_impl must be one of {ATTN_IMPLS}, got {self.attn_impl!r}")
        if not self.layer_norm_epsilon > 0:
            raise ValueError(f"GPTConfig.layer_norm_epsilon must be > 0, got {self.layer_norm_epsilon!r}")

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
        is_causal = attn_mask is None
        if self.config.attn_impl == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)
        else:
            y = _math_attention(q, k, v, attn_mask, dropout_p)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


def _math_attention(q, k, v, attn_mask, dropout_p):
    """softmax(QK^T / sqrt(d) + mask) V, written out so FLOP counters and readers see every op."""
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    if attn_mask is None:
        Tq, Tk = q.size(-2), k.size(-2)
        attn_mask = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(diagonal=Tk - Tq)
    scores = scores.masked_fill(~attn_mask, float("-inf"))
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
        # The P: layout the model reads and writes (tasks.LAYOUTS); saved in config.json and read
        # back by from_pretrained ("original" for a GPT-2 directory that records none).
        self.layout = "compact"
        # What every prompt is preceded by (tokenizer.encode_prompt): EOT for the models our SFT
        # trains, which saw EOT before every sample; saved in config.json and read back ("" for a
        # GPT-2 directory that records none, as the original RookWorld evaluation prompts).
        self.prompt_prefix = EOT_TOKEN
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

    def num_params(self, exclude_positions: bool = False) -> int:
        """Unique parameters (the tied head counted once); padded vocab rows included if any."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.transformer.wpe.weight.numel() if exclude_positions else n

    def forward(self, idx, position_ids=None, attn_mask=None, cache: KVCache | None = None,
                start: int | torch.Tensor = 0,
                last_only: bool = False, targets: torch.Tensor | None = None, logits_from: int = 0):
        """Logits (B, T, vocab_size) for token ids idx (B, T); (B, 1, vocab_size) with last_only.

        logits_from skips the LM head (a large share of a small model's cost) on positions before it,
        which still feed attention: scoring completions needs no logits over the prompt. With targets
        (B, T) it returns the mean next-token cross-entropy instead (targets of -1 ignored), equal to
        `lm_loss(model(idx), targets)` but from the fused, chunked `lm_head_loss` (no logits stored).

        position_ids (B, T) default to start..start+T-1; attn_mask is a boolean (B, 1, T, T_total)
        mask, True = may attend (left-padded batches), else plain causal. `start` is where idx goes
        in the cache: an int, or a (1,) device tensor for static-shape decoding (CUDA graphs).
        """
        B, T = idx.shape
        if isinstance(start, torch.Tensor):  # static-shape decode (see KVCache.update)
            if position_ids is None or attn_mask is None:
                raise ValueError("a tensor `start` (static-shape decode) needs explicit position_ids and attn_mask")
        elif position_ids is None:
            position_ids = torch.arange(start, start + T, device=idx.device).unsqueeze(0)
        if not isinstance(start, torch.Tensor) and start + T > self.config.block_size:
            raise ValueError(f"sequence of length {start + T} exceeds block_size {self.config.block_size}")
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(position_ids))
        use_ckpt = self.config.gradient_checkpointing and self.training and cache is None
        for i, block in enumerate(self.transformer.h):
            if use_ckpt:
                x = checkpoint(block, x, attn_mask, None, i, start, use_reentrant=False)
            else:
                x = block(x, attn_mask, cache, i, start)
        # Padded vocabulary rows are never targets, sampled or scored. Sliced only when there are
        # any: a slice's backward is a zeroed copy of the whole (V, C) gradient.
        padded = self.config.padded_vocab_size > self.config.vocab_size
        if targets is not None:
            weight = self.lm_head.weight[: self.config.vocab_size] if padded else self.lm_head.weight
            return linear_cross_entropy(self.transformer.ln_f(x), weight, targets)
        if last_only:
            x = x[:, -1:]
        elif logits_from:
            x = x[:, logits_from:]
        logits = self.lm_head(self.transformer.ln_f(x))
        return logits[..., : self.config.vocab_size] if padded else logits

    def param_groups(self, weight_decay: float):
        """AdamW groups: decay 2-D weights (matmuls, embeddings), not biases or LayerNorm gains."""
        decay = [p for p in self.parameters() if p.requires_grad and p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.requires_grad and p.dim() < 2]
        return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]

    # --- Hugging Face GPT-2 format

    @classmethod
    def from_pretrained(cls, directory: str | Path, **config_overrides) -> "GPT":
        """Load a Hugging Face GPT-2 directory (config.json + model.safetensors), strictly."""
        from .checkpoint_hf import load_hf_gpt2

        return load_hf_gpt2(cls, Path(directory), **config_overrides)

    def save_pretrained(self, directory: str | Path) -> None:
        """Write config.json + model.safetensors that transformers' GPT2LMHeadModel loads."""
        from .checkpoint_hf import save_hf_gpt2

        save_hf_gpt2(self, Path(directory))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -1) -> torch.Tensor:
    """Mean next-token cross-entropy; positions whose target is ignore_index do not count."""
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1), ignore_index=ignore_index)


def config_from_dict(d: dict) -> GPTConfig:
    names = {f.name for f in fields(GPTConfig)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise ValueError(f"unknown GPTConfig field(s): {', '.join(unknown)}")
    return GPTConfig(**d)


