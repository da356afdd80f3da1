"""Train a model over the tokens its task text uses; export it as the full GPT-2 it stands for.

Chess text in our layouts uses a few hundred of GPT-2's 50,257 tokens (515 in the shipped data, EOT
included), yet a full-vocabulary LM head costs 6 * n_embd * 50,257 FLOPs per trained token: for
cpu-small about eight times its transformer blocks. A `TaskVocab` trains a compact model, whose
embedding has one row per task token, and `expand` writes the GPT-2 model it stands for, exactly:

- one coordinate of the final LayerNorm's output is pinned (gain 0, bias PINNED_BIAS) from the
  start, so each token's weight on it is a per-token logit bias, learned like any other weight;
- every token outside the vocabulary gets a row that is -OFF_LOGIT / PINNED_BIAS on that coordinate
  and 0 elsewhere: its logit is -OFF_LOGIT whatever the input, so all of them together hold at most
  50,257 * e^-40 (2e-13) of the probability, below float32's resolution. The expanded model's
  log-probs of task tokens, its samples and its cross-entropy on task text are the compact model's.

The expanded model is a plain GPT-2 (transformers loads it). A token outside the vocabulary in a
prompt gets that fixed row as its embedding: like a token a full-vocabulary model never saw in
training, it carries no meaning.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

import torch

from .model import GPT, GPTConfig
from .tokenizer import EOT_ID, VOCAB_SIZE

PINNED = 0  # the final LayerNorm's output coordinate that carries the constant
PINNED_BIAS = 5.0  # its value; the off-vocabulary rows are -OFF_LOGIT / PINNED_BIAS there (norm 8, not 40)
OFF_LOGIT = 40.0  # minus the logit of every token outside the vocabulary


class TaskVocab:
    """The GPT-2 token ids a task's text uses, in ascending order; compact id i is GPT-2 id ids[i]."""

    def __init__(self, token_ids: Iterable[int]):
        ids = sorted({int(t) for t in token_ids})
        if not ids or ids[0] < 0 or ids[-1] >= VOCAB_SIZE:
            raise ValueError(f"TaskVocab needs GPT-2 token ids in [0, {VOCAB_SIZE}), got {len(ids)} ids "
                             f"spanning {ids[:1]}..{ids[-1:]}")
        self.ids = torch.tensor(ids)
        self.index = torch.full((VOCAB_SIZE,), -1, dtype=torch.long)  # GPT-2 id -> compact id (-1: outside)
        self.index[self.ids] = torch.arange(len(ids))

    def __len__(self) -> int:
        return len(self.ids)

    def compact(self, tokens: torch.Tensor) -> torch.Tensor:
        """GPT-2 ids -> compact ids; a negative id (an ignored target) stays -1."""
        if bool((past := tokens >= VOCAB_SIZE).any()):  # the lookup table would raise a bare IndexError
            raise ValueError(f"token ids {sorted(set(tokens[past].tolist()))[:10]} are not GPT-2 token ids "
                             f"(0..{VOCAB_SIZE - 1}): a padded vocabulary's extra rows are no text")
        out = self.index[tokens.clamp(min=0)].masked_fill(tokens < 0, -1)
        if bool(((out < 0) & (tokens >= 0)).any()):
            missing = sorted(set(tokens[(out < 0) & (tokens >= 0)].tolist()))[:10]
            raise ValueError(f"token ids {missing} are not in the task vocabulary ({len(self)} tokens, built from "
                             "the training and val text): build it from every text the model reads")
        return out

    def compact_config(self, config: GPTConfig) -> GPTConfig:
        """`config`'s shape over this vocabulary (pin_bias_coordinate the model built from it)."""
        return replace(config, vocab_size=len(self))

    def expand(self, model: GPT, outside: torch.Tensor | None = None) -> GPT:
        """The full GPT-2 that a compact `model` stands for. Tokens outside the vocabulary get the rows
        `outside` (VOCAB_SIZE, n_embd): those of the model this one was restricted from; by default
        the off rows of the module docstring (the model must then be pinned)."""
        C = model.config
        assert C.vocab_size == len(self), f"a model over {C.vocab_size} tokens, a vocabulary of {len(self)}"
        if outside is None:
            assert pinned(model), "an unpinned model: expand it into the rows it was restricted from"
        full = _resized(model, VOCAB_SIZE)
        with torch.no_grad():
            wte = full.transformer.wte.weight  # tied to lm_head.weight
            if outside is None:
                wte.zero_()
                wte[:VOCAB_SIZE, PINNED] = -OFF_LOGIT / PINNED_BIAS
            else:
                wte[:VOCAB_SIZE] = outside[:VOCAB_SIZE].to(wte)
            wte[self.ids.to(wte.device)] = model.transformer.wte.weight[: len(self)]
        return full

    def restrict(self, model: GPT) -> GPT:
        """`model` over this vocabulary only: its embedding rows of these tokens, every other weight
        shared by value. Its softmax is the full model's renormalised over the vocabulary, the same to
        float precision when the rest holds no mass (`of_model`'s vocabularies: at most 2e-13); a
        pinned model stays pinned (pin_bias_coordinate), so `expand` writes it back exactly."""
        compact = _resized(model, len(self))
        wte = model.transformer.wte.weight
        with torch.no_grad():
            compact.transformer.wte.weight[: len(self)] = wte[self.ids.to(wte.device)]
        if pinned(model):
            pin_bias_coordinate(compact)
        return compact

    @classmethod
    def of_model(cls, model: GPT) -> "TaskVocab | None":
        """The task vocabulary a full model was expanded from (`expand`'s off rows mark the rest), or
        None for a model that is not pinned or holds no off row (a model trained over all of GPT-2)."""
        if not pinned(model):
            return None
        wte = model.transformer.wte.weight.detach()[:VOCAB_SIZE]
        off = torch.zeros_like(wte[0])
        off[PINNED] = -OFF_LOGIT / PINNED_BIAS
        inside = (wte != off).any(dim=1)
        return cls(inside.nonzero().squeeze(1).tolist()) if not bool(inside.all()) else None

    def union(self, token_ids: Iterable[int]) -> "TaskVocab":
        """This vocabulary with `token_ids` added."""
        return TaskVocab([*self.ids.tolist(), *token_ids])


def _resized(model: GPT, vocab_size: int) -> GPT:
    """A GPT of `model`'s shape over `vocab_size` tokens, holding every weight of `model` but the
    embedding (tied to the head), and its meta, prompt prefix, source and train/eval mode."""
    wte = model.transformer.wte.weight
    out = GPT(replace(model.config, vocab_size=vocab_size)).to(wte.device, wte.dtype)
    state = {k: v for k, v in model.state_dict().items() if k not in ("transformer.wte.weight", "lm_head.weight")}
    missing, unexpected = out.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) == {"transformer.wte.weight", "lm_head.weight"}, (missing, unexpected)
    out.meta, out.prompt_prefix, out.source = dict(model.meta), model.prompt_prefix, model.source
    return out.train(model.training)


def sampling_view(model: GPT, prompts: list[list[int]], vocab: TaskVocab | None = None
                  ) -> tuple[GPT, TaskVocab | None, list[list[int]]]:
    """(model, vocabulary, prompts) to sample GPT-2-id `prompts` with: the restriction of `model` to
    `vocab` (default: the one it marks, of_model) joined by every prompt token and EOT, with compact
    prompt ids (for a marked model: greedy answers the full model's up to float rounding, samples the
    same to 2e-13, several times faster); (model, None, prompts) when there is no vocabulary.
    vocab.ids[compact ids] are the GPT-2 ids."""
    vocab = vocab or TaskVocab.of_model(model)
    if vocab is None:
        return model, None, prompts
    vocab = vocab.union({t for p in prompts for t in p} | {EOT_ID})
    return vocab.restrict(model), vocab, [vocab.index[p].tolist() for p in prompts]


@torch.no_grad()
def outside_logmass(model: GPT, vocab: TaskVocab, sequences: list[list[int]], temperature: float = 1.0) -> torch.Tensor:
    """-log of the probability `model` (over all of GPT-2) gives the tokens of `vocab`, at every
    position of `sequences` (GPT-2 ids; real prompts and completions), at `temperature`: the KL, in
    nats per token, from the policy restricted to the vocabulary (`TaskVocab.restrict`) to the full one."""
    was_training = model.training
    model.eval()
    out = []
    for seq in sequences:
        logits = model(torch.tensor([seq], device=model.transformer.wte.weight.device))[0].float() / temperature
        out.append(logits.logsumexp(-1) - logits[:, vocab.ids.to(logits.device)].logsumexp(-1))
    model.train(was_training)
    return torch.cat(out).cpu()


def pinned(model: GPT) -> bool:
    """True when the final LayerNorm's coordinate PINNED is pinned (gain 0, bias PINNED_BIAS)."""
    ln = model.transformer.ln_f
    return ln.bias is not None and ln.weight[PINNED].item() == 0.0 and ln.bias[PINNED].item() == PINNED_BIAS


def pin_bias_coordinate(model: GPT) -> None:
    """Pin the final LayerNorm's output coordinate PINNED to PINNED_BIAS: gain 0, bias PINNED_BIAS,
    and their gradients there zeroed, so that AdamW (which decays neither) never moves them."""
    ln = model.transformer.ln_f
    with torch.no_grad():
        ln.weight[PINNED] = 0.0
        ln.bias[PINNED] = PINNED_BIAS
    for p in (ln.weight, ln.bias):
        p.register_hook(lambda grad: grad.index_fill(0, torch.tensor([PINNED], device=grad.device), 0.0))
