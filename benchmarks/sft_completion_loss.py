"""The cpu profile's SFT with the loss on the answers alone (TRL's `completion_only_loss`): does the
capacity that predicting prompts takes buy legal candidates back? (docs/grpo.md, section 4)

    python benchmarks/sft_completion_loss.py --out runs/sft_completion_loss
    python benchmarks/compare_models.py runs/<make run>/training/sft/final runs/sft_completion_loss/sft/final
    python benchmarks/policy_anatomy.py runs/sft_completion_loss/sft/final
    python benchmarks/sft_completion_loss.py --tasks P --out runs/sft_completion_loss_P  # P: prompts only
    python benchmarks/sft_completion_loss.py --part history --out runs/sft_no_history_loss  # A: histories only

The library's SFT trains on every token of a sample's text, as GPT-2 pretraining and the original
RookWorld do. Here a train sample's prompt tokens (the record's `prompt` field: the task tag, the
FEN, for `A:` the move and the history) are inputs but not targets (target -1, which the loss
ignores); its answer and the EOT that ends it stay targets. A token counts as the prompt's when it
starts before the prompt's last character ends. `--tasks P` masks the `P:` prompts alone (the `A:`
samples keep the whole-text loss). `--part history` masks only the game history inside each `A:`
prompt (the record's `history` moves, `A: <FEN>+<move>+<history>+`): the tokens that start in it.
Everything else is the `cpu` profile's SFT (seed, data order, schedule, task vocabulary); the val
loss is still over whole texts.
"""

from __future__ import annotations

import argparse
import functools
import time
from pathlib import Path

import numpy as np
import torch

from rookworld_lib.chess import data
from rookworld_lib.chess.training import RecordReader
from rookworld_lib.core import train_sft
from rookworld_lib.core.paths import DATA_DIR
from rookworld_lib.core.tokenizer import EOT_TOKEN, get_tokenizer
from rookworld_lib.lab import workflow

PROMPT = 1 << 24  # a flag bit on a stored token id (GPT-2 ids are below 2**16): not a target


def spans(paths, part: str = "prompt") -> dict[str, tuple[int, int]]:
    """Each record's training text (the compact layout's: prompt + completion) -> the characters [a, b) whose
    tokens are not targets: its prompt (part "prompt"), or the history inside an A: prompt (part "history")."""
    out = {}
    for path in paths:
        for rec in data.load_jsonl(path):
            prompt = rec["prompt"]
            if part == "prompt":
                out[prompt + rec["completion"]] = (0, len(prompt))
            elif rec["task"] == "A":  # A: <FEN>+<move>+<history>+
                start = prompt.index("+", prompt.index("+") + 1) + 1
                out[prompt + rec["completion"]] = (start, len(prompt) - 1)
    return out


class AnswerOnlyStream(train_sft.PackedStream):
    """A PackedStream whose batches' targets are -1 where the token starts in its text's span (train stream only)."""

    def __init__(self, texts, *, name="train", spans: dict[str, tuple[int, int]], tasks=("P", "A"), **kwargs):
        """spans: spans(...)'s; tasks: whose spans are inputs only."""
        super().__init__(texts, name=name, **kwargs)
        if name != "train":
            return
        enc, cleaned = get_tokenizer(), [t.removesuffix(EOT_TOKEN) for t in texts]
        members = ([list(range(len(texts)))] if self.task_weights is None else
                   [[i for i, t in enumerate(texts) if t.startswith(f"{task}: ")] for task in self.pool_names])
        self.prompt_tokens = 0
        for (tokens, offsets), pool in zip(self.pools, members):
            for j, i in enumerate(pool):
                a, b = spans.get(cleaned[i], (0, 0)) if cleaned[i][0] in tasks else (0, 0)
                pos = 0  # where the token starts in the text
                for k in range(offsets[j] + 1, offsets[j + 1]):  # offsets[j] holds the sample's leading EOT
                    if pos >= b:
                        break
                    length = len(enc.decode_single_token_bytes(int(tokens[k])))
                    if pos >= a:
                        tokens[k] |= PROMPT
                        self.prompt_tokens += 1
                    pos += length

    def next_batch(self, batch_size, block_size):
        x, y = super().next_batch(batch_size, block_size)  # flagged ids (none outside the train stream)
        return x & (PROMPT - 1), (y & (PROMPT - 1)).masked_fill_(y & PROMPT != 0, -1)

    def token_ids(self):
        return np.unique(np.concatenate([tokens & (PROMPT - 1) for tokens, _ in self.pools]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=None, help="SFT steps (default: the cpu profile's; a few for a smoke run)")
    ap.add_argument("--tasks", nargs="+", choices=("P", "A"), default=["P", "A"], help="whose prompts are not targets")
    ap.add_argument("--part", choices=("prompt", "history"), default="prompt", help="what is not a target")
    args = ap.parse_args()
    cfg = workflow.sft_config(workflow.resolve("cpu", sft_steps=args.steps), args.out / "sft", DATA_DIR, args.seed)
    # the trainer builds its streams from the module's name
    train_sft.PackedStream = functools.partial(AnswerOnlyStream, spans=spans(cfg.train_data, args.part), tasks=tuple(args.tasks))
    torch.manual_seed(args.seed)
    start = time.time()
    result = train_sft.train_sft(cfg, reader=RecordReader("compact"))
    print(f"SFT {time.time() - start:.0f} s; last record {result.history[-1]}; model in {args.out / 'sft' / 'final'}")


if __name__ == "__main__":
    main()
