"""The cpu profile's SFT with an unlikelihood term on the P: answers (Welleck et al. 2019, "Neural
text generation with unlikelihood training"; docs/grpo.md, section 4): does it break the greedy
loop `M: d2d4 d2d4 d2d4 ...`?

    python benchmarks/sft_unlikelihood.py --level move --alpha 1.0 --out runs/sft_unlikelihood
    python benchmarks/policy_anatomy.py runs/sft_unlikelihood/sft/final
    python benchmarks/compare_models.py <make run>/training/sft/final runs/sft_unlikelihood/sft/final

The loss of a training step is the cross-entropy plus alpha times an unlikelihood term:
- `--level token` (Welleck's token level): at each position of a P: answer (from its ` M` token to
  the end of the record), every token already seen in the same record other than the target is a
  negative candidate c; the term is -sum_c log(1 - p(c)), averaged over the batch's answer positions.
- `--level move` (a repeated candidate as the negative sequence): for --records P: training
  records a step, drawn at random, and each candidate slot k = 2..5 of their M: field, the
  negative is candidate k-1 written again in slot k; the term is -log(1 - p(that move | the answer up
  to slot k)), the move's probability being the product of its tokens', averaged over the negatives.
Everything else is the `cpu` profile's SFT on the shipped data (the same seed, data order and
schedule); the val loss stays the plain cross-entropy.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from rookworld_lib.chess.data import split_paths
from rookworld_lib.chess.training import RecordReader
from rookworld_lib.core import train_step
from rookworld_lib.core.paths import DATA_DIR
from rookworld_lib.core.task_vocab import TaskVocab
from rookworld_lib.core.tokenizer import EOT_ID, get_tokenizer
from rookworld_lib.core.train_sft import train_sft
from rookworld_lib.lab import workflow


def unlikelihood(logits: torch.Tensor, x: torch.Tensor, y: torch.Tensor, eot: int, policy: int, answer: int):
    """(the mean unlikelihood term over P: answer positions, how many positions). x, y: (B, T) inputs
    and targets in the model's ids; eot, policy, answer: the ids of EOT, `P` and ` M`."""
    B, T = x.shape
    V = logits.size(-1)
    seen = F.one_hot(x, V).float().cumsum(1)  # tokens seen so far in the row, per token id
    # subtract what was seen before the record's opening EOT: seen within the record, EOT excluded
    opener = torch.where(x == eot, torch.arange(T).expand(B, T), torch.full_like(x, -1)).cummax(1).values
    before = torch.where((opener >= 0)[..., None], seen.gather(1, opener.clamp(min=0)[..., None].expand(B, T, V)),
                         torch.zeros_like(seen))
    negatives = ((seen - before) > 0) & ~F.one_hot(y.clamp(min=0), V).bool()
    # P: records only, from the ` M` of the answer on
    is_policy = torch.zeros(B, T, dtype=torch.bool)
    started = torch.zeros(B, T, dtype=torch.bool)
    for b in range(B):  # a few records per row: a plain loop over the record boundaries
        starts = (x[b] == eot).nonzero().flatten().tolist()
        for i, s in enumerate(starts):
            e = starts[i + 1] if i + 1 < len(starts) else T
            if s + 1 < T and x[b, s + 1] == policy:
                is_policy[b, s:e] = True
                m = (x[b, s:e] == answer).nonzero().flatten()
                if len(m):
                    started[b, s + int(m[0]):e] = True
    where = is_policy & started & (y >= 0)
    p = F.softmax(logits.float(), -1)
    term = -(torch.log1p(-p.clamp(max=1 - 1e-6)) * negatives).sum(-1)
    n = int(where.sum())
    return (term[where].sum() / max(1, n)), n


def repeat_negatives(text: str, tok, compact) -> list[tuple[list[int], int]]:
    """For slot k = 2..5 of a P: text's M: field: (EOT + the record up to slot k + candidate k-1 again,
    in the model's ids; where that repeated move starts)."""
    head, _, rest = text.partition(" M: ")
    moves = rest.split(" E: ")[0].split()
    out = []
    for k in range(1, len(moves)):
        ids = [EOT_ID, *tok.encode(f"{head} M: {' '.join(moves[:k])}")]
        out.append((compact(torch.tensor(ids + tok.encode(" " + moves[k - 1]))).tolist(), len(ids)))
    return out


def move_unlikelihood(model, negatives: list[tuple[list[int], int]], pad: int) -> torch.Tensor:
    """Mean of -log(1 - p(repeated move | prefix)) over the negatives (right-padded: the model is causal)."""
    width = max(len(ids) for ids, _ in negatives)
    x = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in negatives])
    logp = F.log_softmax(model(x[:, :-1]).float(), -1).gather(-1, x[:, 1:, None])[..., 0]  # logp[:, i]: token i+1
    pos = torch.arange(width - 1)[None]
    start = torch.tensor([s for _, s in negatives])[:, None]
    end = torch.tensor([len(ids) for ids, _ in negatives])[:, None]
    move_logp = (logp * ((pos >= start - 1) & (pos < end - 1))).sum(1)
    return -torch.log1p(-move_logp.exp().clamp(max=1 - 1e-6)).mean()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--level", choices=("token", "move"), default="move", help="the negatives (see the description above)")
    ap.add_argument("--alpha", type=float, default=1.0, help="weight of the unlikelihood term")
    ap.add_argument("--records", type=int, default=4, help="--level move: P: records whose repeats a step penalises")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=None, help="SFT steps (default: the cpu profile's)")
    args = ap.parse_args()
    prof = workflow.resolve("cpu", sft_steps=args.steps)
    cfg = workflow.sft_config(prof, args.out / "sft", DATA_DIR, args.seed)
    reader = RecordReader("compact")
    tok = get_tokenizer()
    # the compact ids SFTTrainer will use (vocab="task": the train and val texts' tokens, EOT included)
    ids = {EOT_ID}
    for path in [*split_paths("train", DATA_DIR), *split_paths("val", DATA_DIR)]:
        for text in reader.iter_texts([path]):
            ids.update(tok.encode(text))
    vocab = TaskVocab(ids)
    eot, policy, answer = (int(vocab.index[i]) for i in (EOT_ID, tok.encode("P")[0], tok.encode(" M")[0]))
    plain = train_step.batch_loss
    stats = {"ul": 0.0, "n": 0, "calls": 0}
    policy_texts = [t for path in split_paths("train", DATA_DIR) for t in reader.iter_texts([path]) if t.startswith("P:")]
    per_record = [repeat_negatives(text, tok, vocab.compact) for text in policy_texts]
    rng = np.random.default_rng(args.seed + 1)  # its own generator: the SFT's data order and init are the baseline's

    def with_unlikelihood(model, x, y, impl="fused"):
        if not torch.is_grad_enabled():  # the val loss: plain cross-entropy, comparable with the baseline's
            return plain(model, x, y, impl)
        if args.level == "move":
            ce = plain(model, x, y, impl)
            chosen = [n for r in rng.choice(len(per_record), args.records, replace=False) for n in per_record[r]]
            ul, n = move_unlikelihood(model, chosen, eot), len(chosen)
        else:
            logits = model(x)
            assert logits.size(-1) == len(vocab), (logits.size(-1), len(vocab))
            ce = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1), ignore_index=-1)
            ul, n = unlikelihood(logits, x, y, eot, policy, answer)
        stats["ul"] += float(ul.detach())
        stats["n"] += n
        stats["calls"] += 1
        return ce + args.alpha * ul

    train_step.batch_loss = with_unlikelihood
    torch.manual_seed(args.seed)
    start = time.time()
    result = train_sft(cfg, reader=reader)
    print(f"SFT {time.time() - start:.0f} s; level {args.level}; alpha {args.alpha}; mean unlikelihood term {stats['ul'] / max(1, stats['calls']):.4f} "
          f"over {stats['n'] / max(1, stats['calls']):.0f} positions or negatives a step; last record {result.history[-1]}; "
          f"model in {args.out / 'sft' / 'final'}")


if __name__ == "__main__":
    main()
