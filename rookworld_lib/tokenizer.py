"""GPT-2 byte-pair encoding through tiktoken, fully offline.

tiktoken's named-encoding registry fetches its rank files over the network on first use, which
fails on machines without internet, so this module never goes through it. We ship the identical
rank file in `data/gpt2.tiktoken` and construct the `tiktoken.Encoding` directly from it, after
checking its sha256 so a truncated or edited file can never silently change token ids.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import os
from pathlib import Path

import tiktoken

from .paths import DATA_DIR

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
    override = os.environ.get("ROOKWORLD_TOKENIZER_FILE")
    return Path(override) if override else DATA_DIR / "gpt2.tiktoken"


def load_ranks(path: str | Path) -> dict[bytes, int]:
    """Read and verify a tiktoken rank file: one `base64(token) rank` pair per line."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TokenizerFileError(f"GPT-2 rank file {path} cannot be read ({exc.strerror}). {RESTORE_HINT}") from None
    digest = hashlib.sha256(raw).hexdigest()
    if digest != RANKS_SHA256:
        raise TokenizerFileError(
            f"GPT-2 rank file {path} is corrupt: sha256 {digest} != expected {RANKS_SHA256}. {RESTORE_HINT}"
        )
    ranks = {}
    for line in raw.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


@functools.lru_cache(maxsize=4)
def _build(path: str) -> tiktoken.Encoding:
    ranks = load_ranks(path)
    if len(ranks) != EOT_ID:
        raise TokenizerFileError(f"GPT-2 rank file {path} has {len(ranks)} ranks, expected {EOT_ID}. {RESTORE_HINT}")
    return tiktoken.Encoding(
        name="gpt2_offline",
        pat_str=GPT2_PATTERN,
        mergeable_ranks=ranks,
        special_tokens={EOT_TOKEN: EOT_ID},
        explicit_n_vocab=VOCAB_SIZE,
    )


def get_tokenizer(path: str | Path | None = None) -> tiktoken.Encoding:
    """The GPT-2 tokenizer (50257 tokens, `<|endoftext|>` = 50256), built from the shipped rank file."""
    return _build(str(path or default_ranks_path()))


def encode(text: str, tokenizer: tiktoken.Encoding | None = None) -> list[int]:
    """Encode text that may contain `<|endoftext|>` as the special token, never as plain text."""
    return (tokenizer or get_tokenizer()).encode(text, allowed_special={EOT_TOKEN})


def token_boundaries(text: str, tokenizer: tiktoken.Encoding | None = None) -> list[str]:
    """The text of each token, so a reader can see where the BPE cuts a string."""
    enc = tokenizer or get_tokenizer()
    return [enc.decode_single_token_bytes(t).decode("utf-8", errors="replace") for t in encode(text, enc)]
