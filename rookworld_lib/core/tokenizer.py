"""GPT-2 byte-pair encoding through tiktoken, fully offline.

tiktoken's named encodings fetch their rank files over the network, so we build the
`tiktoken.Encoding` from the identical file shipped in `data/gpt2.tiktoken`, after checking its
sha256 so that a truncated or edited file can never silently change token ids.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import inspect
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

import tiktoken

from .paths import REPO_ROOT, atomic_write, cache_dir

log = logging.getLogger(__name__)

RANKS_SHA256 = "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"
EOT_TOKEN = "<|endoftext|>"
EOT_ID = 50256
VOCAB_SIZE = 50257
# GPT-2's pre-tokenisation regex (tiktoken's r50k_base); contractions, letters, digits,
# punctuation runs, and whitespace that does not swallow the space before the next word.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

RESTORE_HINT = (
    "Restore it with `git checkout -- data/gpt2.tiktoken`, or re-extract it from the sdist of "
    "openai-whisper==20250625 (`pip download --no-deps --no-binary=:all: openai-whisper==20250625`, "
    "file whisper/assets/gpt2.tiktoken), or point ROOKWORLD_TOKENIZER_FILE at a good copy."
)


class TokenizerFileError(RuntimeError):
    """The GPT-2 rank file is missing, unreadable or not the expected bytes."""


def default_ranks_path() -> Path:
    """The rank file: ROOKWORLD_TOKENIZER_FILE when set (read at every load), else the repository's: part
    of the code, not of a data set (ROOKWORLD_DATA_DIR points at data sets, which never hold it)."""
    override = os.environ.get("ROOKWORLD_TOKENIZER_FILE")
    return Path(override) if override else REPO_ROOT / "data" / "gpt2.tiktoken"


@functools.lru_cache(maxsize=4)
def _ranks(path: str) -> dict[bytes, int]:
    """The ranks of a rank file (one `base64(token) rank` pair per line) whose sha256 is GPT-2's."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise TokenizerFileError(f"GPT-2 rank file {path} cannot be read ({exc.strerror}). {RESTORE_HINT}") from None
    digest = hashlib.sha256(raw).hexdigest()
    if digest != RANKS_SHA256:
        raise TokenizerFileError(
            f"GPT-2 rank file {path} is corrupt: sha256 {digest} != expected {RANKS_SHA256}. {RESTORE_HINT}"
        )
    return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in raw.splitlines() if line)}


@functools.lru_cache(maxsize=4)
def _build(path: str) -> tiktoken.Encoding:
    """The encoding of a checked rank file (_ranks)."""
    return tiktoken.Encoding(name="gpt2_offline", pat_str=GPT2_PATTERN, mergeable_ranks=_ranks(path),
                             special_tokens={EOT_TOKEN: EOT_ID}, explicit_n_vocab=VOCAB_SIZE)


def get_tokenizer(path: str | Path | None = None) -> tiktoken.Encoding:
    """The GPT-2 tokenizer (50257 tokens, `<|endoftext|>` = 50256), built from the shipped rank file."""
    return _build(str(path or default_ranks_path()))


def encode(text: str, tokenizer: tiktoken.Encoding | None = None) -> list[int]:
    """Encode text that may contain `<|endoftext|>` as the special token, never as plain text."""
    return (tokenizer or get_tokenizer()).encode(text, allowed_special={EOT_TOKEN})


def encode_prompt(prompt: str, prefix: str, tokenizer: tiktoken.Encoding | None = None) -> list[int]:
    """The token ids of `prefix` (a model's `prompt_prefix`) and then the prompt. Our SFT puts
    `<|endoftext|>` before every sample, so the models it trains expect it in front of a prompt;
    without it they read a prompt as the tail of the sample before it."""
    return encode(prefix + prompt, tokenizer)


def token_boundaries(text: str, tokenizer: tiktoken.Encoding | None = None) -> list[str]:
    """The text of each token, so a reader can see where the BPE cuts a string."""
    enc = tokenizer or get_tokenizer()
    return [enc.decode_single_token_bytes(t).decode("utf-8", errors="replace") for t in encode(text, enc)]


def _hf_tokenizer_cache() -> Path:
    return cache_dir() / f"gpt2-{RANKS_SHA256[:16]}.tokenizer.json"


def hf_tokenizer_json() -> str | None:
    """GPT-2's tokenizer as transformers' tokenizer.json (encoding exactly as get_tokenizer() does),
    built once by transformers' TikTokenConverter and cached in paths.cache_dir();
    None where transformers is not installed and nothing is cached."""
    cache = _hf_tokenizer_cache()
    try:
        return cache.read_text()
    except (OSError, UnicodeDecodeError):
        pass
    try:  # optional heavy dependency: only the first export on a machine needs it
        from tokenizers import Tokenizer
        from transformers.convert_slow_tokenizer import TikTokenConverter
    except ImportError:
        return None
    enc = get_tokenizer()  # the rank file checked first (its sha256), with the error that says how to restore it
    # transformers 5 calls the special tokens extra_special_tokens, 4.x additional_special_tokens
    special = ("extra_special_tokens" if "extra_special_tokens" in inspect.signature(TikTokenConverter).parameters
               else "additional_special_tokens")
    sample = "<|endoftext|>Q: 3+4 = 7; rev(abc) = cba  -0.25 e2e4 1/2 ÄÖ 日本\n"
    try:
        converter = TikTokenConverter(vocab_file=str(default_ranks_path()), pattern=GPT2_PATTERN, **{special: [EOT_TOKEN]})
        # the checked ranks: tiktoken's own loader would leave a copy of the file in /tmp/data-gym-cache
        converter.load_tiktoken_bpe = _ranks
        text = converter.converted().to_str()
        if Tokenizer.from_str(text).encode(sample).ids != encode(sample, enc):
            raise ValueError("it encodes otherwise than tiktoken")
    except Exception as exc:  # an optional file: an export without it, never a failed export
        log.warning("no tokenizer files in exports: transformers' TikTokenConverter failed (%s)", exc)
        return None
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(cache, lambda f: f.write(text.encode()))
    except OSError:  # an unwritable home: built again next time
        pass
    return text


def write_hf_tokenizer(directory: str | Path, max_length: int) -> bool:
    """Write tokenizer.json and tokenizer_config.json into a model folder, so that transformers'
    AutoTokenizer.from_pretrained(directory) reads GPT-2's tokenizer offline; False (nothing written)
    where hf_tokenizer_json() has none."""
    if (text := hf_tokenizer_json()) is None:
        return False
    config = {"tokenizer_class": "GPT2Tokenizer", "bos_token": EOT_TOKEN, "eos_token": EOT_TOKEN,
              "unk_token": EOT_TOKEN, "add_prefix_space": False, "errors": "replace", "model_max_length": max_length}
    atomic_write(Path(directory) / "tokenizer.json", lambda f: f.write(text.encode()))
    atomic_write(Path(directory) / "tokenizer_config.json", lambda f: f.write((json.dumps(config, indent=2) + "\n").encode()))
    return True


def check_model_tokenizer(directory: str | Path) -> None:
    """Raise ValueError when a model folder's tokenizer (tokenizer.json, else the slow tokenizer's
    vocab.json and merges.txt) is not GPT-2's: the texts here are encoded with get_tokenizer() whatever
    the folder holds, so such a model would read and write other tokens than it was trained on (and an
    export would pair it with GPT-2's). A folder without them, or a Python without `tokenizers`, passes;
    GPT-2's own (ours, the hub's) encodes a probe text as tiktoken."""
    folder = Path(directory)
    path, vocab, merges = folder / "tokenizer.json", folder / "vocab.json", folder / "merges.txt"
    if path.is_file():
        ours = _hf_tokenizer_cache()  # what our exports write: no parse needed
        with contextlib.suppress(OSError):
            if ours.stat().st_size == path.stat().st_size and ours.read_bytes() == path.read_bytes():
                return
    elif vocab.is_file() and merges.is_file():
        path = vocab
    else:
        return
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers  # optional (comes with transformers)
    except ImportError:
        return
    # every printable ASCII character alone at a line's start (a task's "P:" starts a text) and after a
    # space, then mixed text: a tokenizer that swaps two single-character tokens differs somewhere
    printable = [chr(c) for c in range(33, 127)]
    probe = "\n".join(printable) + " " + " ".join(printable) + " Q: 3+4 = 7; rev(abc) = cba  -0.25 e2e4 1/2 ÄÖ 日本"
    try:
        if path == vocab:  # GPT2Tokenizer's files: byte-level BPE
            tok = Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        else:
            tok = Tokenizer.from_file(str(path))
        ids = tok.encode(probe).ids
    except Exception as exc:  # a tokenizer file transformers could not read either
        raise ValueError(f"{path}: unreadable ({type(exc).__name__}: {exc}); a GPT-2 model folder needs "
                         "GPT-2's tokenizer or none") from None
    if ids != encode(probe):
        at = next((i for i, (a, b) in enumerate(zip(ids, encode(probe))) if a != b), min(len(ids), len(encode(probe))))
        text = get_tokenizer().decode(encode(probe)[at:at + 3])
        raise ValueError(f"{path}: not GPT-2's tokenizer (it encodes {text!r} as {ids[at:at + 3]}, GPT-2 as "
                         f"{encode(probe)[at:at + 3]}); the texts here are GPT-2's tokens, so this model cannot be "
                         "scored or trained here")


def check_vocabulary(model) -> None:
    """Raise ValueError naming the model's config.json unless its vocabulary is GPT-2's 50,257 tokens, or
    naming its folder's tokenizer.json when that is not GPT-2's (check_model_tokenizer): what it reads is
    encoded, and what it writes decoded, with get_tokenizer(). A folder with more rows (llm.c's 50,304)
    is refused by training too: its export would hold them, and nothing here could sample it."""
    if getattr(model, "source", None):
        check_model_tokenizer(model.source)
    n = model.config.vocab_size
    if n != VOCAB_SIZE:
        where = f"{model.source}/config.json: " if getattr(model, "source", None) else ""
        fix = (f"; for an embedding padded past GPT-2's tokens, keep the first {VOCAB_SIZE:,} rows of "
               f"transformer.wte.weight (and of lm_head.weight, if untied) and set vocab_size {VOCAB_SIZE} "
               "in config.json" if n > VOCAB_SIZE else "")
        raise ValueError(f"{where}vocab_size {n}: the texts here are GPT-2's {VOCAB_SIZE:,} tokens "
                         f"(data/gpt2.tiktoken); a model over another vocabulary (added tokens, a cut or padded "
                         f"embedding) cannot be trained, sampled or scored here{fix}")


# A sample or prompt belongs to task T when its text starts with "T: "; SFTConfig.task_weights mixes
# such pools in the packed stream.
def task_of(text: str, tasks: Iterable[str]) -> str | None:
    """The task of a sample text among `tasks` ("S: 3+4 = 7" -> "S"); None when it starts with none of them."""
    return next((t for t in tasks if isinstance(text, str) and text.startswith(f"{t}: ")), None)
