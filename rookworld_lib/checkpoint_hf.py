"""Read and write the Hugging Face GPT-2 format (config.json + model.safetensors).

Hugging Face's GPT-2 stores its matmul weights as Conv1D, shaped (in, out): the transpose of
nn.Linear. Key checking is strict in both directions, because a silently missing key (strict=False)
leaves a layer at its random init and the model still runs, just badly.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .model import GPTConfig
from .paths import atomic_write
from .tasks import LAYOUTS

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


class CheckpointFormatError(ValueError):
    """A Hugging Face GPT-2 directory that cannot be loaded faithfully."""


# The P: layout a model was trained on travels in its config.json under this key (transformers
# ignores unknown keys). A GPT-2 directory without it is taken as an original RookWorld model,
# which reads and writes the original fixed-width layout (rookworld_lib.tasks).
LAYOUT_KEY = "rookworld_layout"
# What a prompt must be preceded by (GPT.prompt_prefix), for any tool that prompts the model:
# "<|endoftext|>" for models our SFT trained; a directory without the key gets "".
PROMPT_PREFIX_KEY = "rookworld_prompt_prefix"


def read_layout(directory: str | Path) -> tuple[str, str]:
    """(layout, why) of a Hugging Face GPT-2 directory: its recorded layout, or "original" when
    config.json records none (a model that is not ours: RookWorld-LM-124M and its kin)."""
    path = Path(directory) / "config.json"
    return _layout_of(read_config_json(path), path)


def _not_found(path: Path) -> CheckpointFormatError:
    return CheckpointFormatError(f"{path} not found: a Hugging Face GPT-2 directory needs config.json and "
                                 "model.safetensors")


def read_config_json(path: Path) -> dict:
    """A config.json as a dict; CheckpointFormatError naming the file when it is missing, unreadable,
    not JSON or not a JSON object."""
    try:
        d = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise _not_found(path) from None
    except json.JSONDecodeError as exc:
        raise CheckpointFormatError(f"{path}: not valid JSON (line {exc.lineno} column {exc.colno}: {exc.msg})") from None
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


def layout_for(init_from: str | os.PathLike | None) -> tuple[str, str]:
    """(layout, why) of a run starting from `init_from`: compact from scratch (None or "scratch"),
    else the init model's own (read_layout)."""
    if not init_from or init_from == "scratch":
        return "compact", "a scratch start trains the compact layout"
    return read_layout(init_from)


def _layout_of(d: dict, path: Path) -> tuple[str, str]:
    if LAYOUT_KEY not in d:
        return "original", f"{path} records no {LAYOUT_KEY!r}: taken as an original RookWorld model"
    layout = d[LAYOUT_KEY]
    if layout not in LAYOUTS:
        raise CheckpointFormatError(f"{path}: {LAYOUT_KEY} is {layout!r}, expected one of {LAYOUTS}")
    return layout, f"{path} records {LAYOUT_KEY}={layout!r}"


def hf_config_dict(config: GPTConfig) -> dict:
    """transformers' GPT2Config for `config`, as config.json holds it."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "activation_function": "gelu_new",
        "n_positions": config.block_size,
        "n_ctx": config.block_size,
        "n_embd": config.n_embd,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": None,
        "vocab_size": config.vocab_size,
        "layer_norm_epsilon": config.layer_norm_epsilon,
        "resid_pdrop": config.dropout,
        "embd_pdrop": config.embd_pdrop,
        "attn_pdrop": config.attn_pdrop,
        "bos_token_id": 50256,
        "eos_token_id": 50256,
        "tie_word_embeddings": True,
        **REQUIRED_HF_SETTINGS,
        "initializer_range": 0.02,
        "torch_dtype": "float32",
    }


# transformers' three GPT-2 dropout rates -> our GPTConfig fields; 0.1 each when absent, as in
# transformers' GPT2Config (every GPT-2 release writes them).
HF_DROPOUTS = {"resid_pdrop": "dropout", "embd_pdrop": "embd_dropout", "attn_pdrop": "attn_dropout"}
HF_DEFAULT_PDROP = 0.1


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
        raise CheckpointFormatError(f"{source}: n_inner={n_inner} is not 4 * n_embd; only GPT-2's MLP width is supported")
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


def load_hf_gpt2(cls, directory: Path, **config_overrides):
    """A `cls` (GPT) model from a Hugging Face GPT-2 directory, every key checked (see GPT.from_pretrained)."""
    config_path, weights_path = directory / "config.json", directory / "model.safetensors"
    for path in (config_path, weights_path):
        if not path.is_file():
            raise _not_found(path)
    hf = read_config_json(config_path)
    config = config_from_hf(hf, config_path, **config_overrides)
    layout, _ = _layout_of(hf, config_path)
    prefix = hf.get(PROMPT_PREFIX_KEY, "")
    if not isinstance(prefix, str):
        raise CheckpointFormatError(f"{config_path}: {PROMPT_PREFIX_KEY} must be a string (e.g. \"<|endoftext|>\"), "
                                    f"got {prefix!r}")
    # Checkpoints saved from GPT2Model (no LM head) have no "transformer." prefix.
    state = {(k if k.startswith(("transformer.", "lm_head.")) else "transformer." + k): v
             for k, v in read_safetensors(weights_path).items() if not k.endswith(MASK_BUFFER_SUFFIXES)}
    head = state.pop("lm_head.weight", None)

    model = cls(config)
    own = model.state_dict()
    own.pop("lm_head.weight")  # tied to transformer.wte.weight
    parts = [f"{what} keys: {', '.join(sorted(keys))}" for what, keys in
             (("missing", set(own) - set(state)), ("unexpected", set(state) - set(own))) if keys]
    if parts:
        raise CheckpointFormatError(f"{weights_path}: " + "; ".join(parts))
    if head is not None and not torch.equal(head, state["transformer.wte.weight"]):
        raise CheckpointFormatError(f"{weights_path}: lm_head.weight differs from transformer.wte.weight (GPT-2 ties them)")

    converted = {}
    for key, tensor in state.items():
        if key.endswith(CONV1D_SUFFIXES):
            tensor = tensor.t()
        if key == "transformer.wte.weight":  # zero rows up to the padded vocabulary
            tensor = torch.nn.functional.pad(tensor, (0, 0, 0, config.padded_vocab_size - config.vocab_size))
        if tensor.shape != own[key].shape:
            raise CheckpointFormatError(f"{weights_path}: {key} has shape {tuple(tensor.shape)}, expected {tuple(own[key].shape)}")
        converted[key] = tensor.to(own[key].dtype)
    converted["lm_head.weight"] = converted["transformer.wte.weight"]  # the same tied parameter
    model.load_state_dict(converted, strict=True)
    model.layout, model.prompt_prefix = layout, prefix
    return model


def save_hf_gpt2(model, directory: Path) -> None:
    """Write `model` as config.json + model.safetensors (see GPT.save_pretrained)."""
    config = model.config
    directory.mkdir(parents=True, exist_ok=True)
    state = {}
    for key, tensor in model.state_dict().items():
        if key == "lm_head.weight":
            continue  # tied; transformers re-ties it from tie_word_embeddings
        tensor = tensor.detach().cpu()
        if key.endswith(CONV1D_SUFFIXES):
            tensor = tensor.t()
        if key == "transformer.wte.weight":
            tensor = tensor[: config.vocab_size]
        state[key] = tensor.contiguous()
    layout = getattr(model, "layout", "compact")
    if layout not in LAYOUTS:
        raise ValueError(f"model.layout must be one of {LAYOUTS}, got {layout!r}")
    weights, tmp = directory / "model.safetensors", directory / "model.safetensors.tmp"
    try:
        save_file(state, str(tmp), metadata={"format": "pt"})
    except SafetensorError as exc:  # a full disk, say: an OSError naming the file, not safetensors' own error
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise _os_error(exc, weights) from None
    tmp.replace(weights)
    text = json.dumps({**hf_config_dict(config), LAYOUT_KEY: layout,
                       PROMPT_PREFIX_KEY: getattr(model, "prompt_prefix", "")}, indent=2) + "\n"
    config_path = directory / "config.json"
    try:
        atomic_write(config_path, lambda f: f.write(text.encode()))
    except OSError as exc:
        if exc.filename is not None:
            raise
        raise OSError(exc.errno, exc.strerror, str(config_path)) from None


def _os_error(exc: Exception, path: Path) -> OSError:
    """safetensors reports I/O failures as text ("... No space left on device (os error 28)"): the
    OSError they stand for, naming `path`."""
    m = re.search(r"os error (\d+)", str(exc))
    code = int(m.group(1)) if m else errno.EIO
    return OSError(code, os.strerror(code) if m else f"could not write the model ({exc})", str(path))
