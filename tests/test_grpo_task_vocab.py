"""GRPO over the task vocabulary a model marks: the same policy, losses and gradients as over all of
GPT-2 (to float precision), the same samples under a seed, and an export that is the full GPT-2 again."""

import dataclasses

import pytest
import torch

from rookworld_lib.core import grpo
from rookworld_lib.core.model import GPT, GPTConfig
from rookworld_lib.core.sampling import sequence_logprobs
from rookworld_lib.core.task_vocab import PINNED, TaskVocab, pin_bias_coordinate, sampling_view
from rookworld_lib.core.tokenizer import EOT_ID, encode_prompt, get_tokenizer
from rookworld_lib.core.train_grpo import GRPOTrainConfig, GRPOTrainer, PromptItem

TEXTS = [f"Q: {i} A: {a}" for i in range(20) for a in ("yes", "no", "maybe")]


def marked_model(seed=0) -> tuple[GPT, TaskVocab]:
    """A full GPT-2 expanded from a random compact model over the toy texts' tokens (what a
    vocab="task" SFT export is), and that vocabulary."""
    tok = get_tokenizer()
    vocab = TaskVocab({t for s in TEXTS for t in tok.encode(s)} | {EOT_ID})
    torch.manual_seed(seed)
    compact = GPT(vocab.compact_config(GPTConfig.preset("tiny", block_size=32)))
    pin_bias_coordinate(compact)
    with torch.no_grad():  # a trained model's per-token biases and embeddings are not at their init scale
        compact.transformer.wte.weight.normal_(0, 0.5)
    return vocab.expand(compact.eval()), vocab


def test_the_marked_vocabulary_is_found_and_restriction_keeps_the_policy():
    full, vocab = marked_model()
    found = TaskVocab.of_model(full)
    assert found is not None and torch.equal(found.ids, vocab.ids)
    assert TaskVocab.of_model(GPT(GPTConfig.preset("tiny", block_size=32))) is None  # trained over all of GPT-2
    compact = vocab.restrict(full)
    ids = torch.tensor([encode_prompt(TEXTS[4], full.prompt_prefix, get_tokenizer())])
    with torch.no_grad():
        lp_full = torch.log_softmax(full(ids).double(), -1)[..., vocab.ids]
        lp_compact = torch.log_softmax(compact(vocab.compact(ids)).double(), -1)
    assert torch.allclose(lp_full, lp_compact, atol=1e-6)
    back = vocab.expand(compact)
    for (name, a), (_, b) in zip(full.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, b), name


def test_a_row_sharing_a_coordinate_with_the_off_row_stays_in_and_sampling_adds_eot_and_prompt_tokens():
    full, vocab = marked_model()
    kept = int(vocab.ids[3])
    with torch.no_grad():  # a task token whose embedding is 0 in one coordinate, as the off rows are
        full.transformer.wte.weight[kept, PINNED + 1] = 0.0
    found = TaskVocab.of_model(full)
    assert found is not None and kept in found.ids.tolist() and torch.equal(found.ids, vocab.ids)
    # a vocabulary handed in without EOT or the prompt's tokens: sampling needs both, so the view adds them
    without = TaskVocab([t for t in vocab.ids.tolist() if t != EOT_ID][:5])
    prompt = get_tokenizer().encode("Q: 7 A:")
    _, used, (compact_prompt,) = sampling_view(full, [prompt], without)
    assert EOT_ID in used.ids.tolist() and set(prompt) <= set(used.ids.tolist())
    assert used.ids[torch.tensor(compact_prompt)].tolist() == prompt


def test_grpo_loss_and_gradients_equal_the_full_vocabulary_ones():
    full, vocab = marked_model(1)
    compact = vocab.restrict(full)
    tok = get_tokenizer()
    prompts = [encode_prompt(f"Q: {i} A:", full.prompt_prefix, tok) for i in range(4)]
    completions = torch.tensor([tok.encode(" yes") + [EOT_ID], tok.encode(" no") + [EOT_ID],
                                tok.encode(" maybe") + [EOT_ID], tok.encode(" no") + [EOT_ID]])
    adv = torch.tensor([1.0, -0.5, 0.25, -0.75])
    mask = torch.ones_like(completions, dtype=torch.bool)
    cfg = grpo.GRPOConfig(beta=0.0)
    grads, losses = [], []
    for model, p, c, pad in ((full, prompts, completions, EOT_ID),
                             (compact, [vocab.compact(torch.tensor(x)).tolist() for x in prompts],
                              vocab.compact(completions), int(vocab.index[EOT_ID]))):
        model.zero_grad()
        lp = sequence_logprobs(model, p, c, 0.7, pad)
        old = (lp.detach() - 0.05).float()  # off-policy by a little, so the ratio and the clip take part
        loss, _ = grpo.grpo_loss(lp.float(), old, adv, mask, config=cfg)
        loss.backward()
        losses.append(loss.item())
        grads.append({k: v.grad.clone() for k, v in model.named_parameters()})
    assert losses[0] == pytest.approx(losses[1], rel=1e-5, abs=1e-7)
    g_full, g_compact = grads
    for name, g in g_compact.items():
        ref = g_full[name]
        if name == "transformer.wte.weight":
            ref = ref[vocab.ids]
        if name.startswith("transformer.ln_f."):  # the pinned coordinate is held (pin_bias_coordinate)
            assert g[PINNED] == 0
            g, ref = g[torch.arange(len(g)) != PINNED], ref[torch.arange(len(ref)) != PINNED]
        assert torch.allclose(g, ref, rtol=1e-4, atol=1e-6), name


def toy_reward(prompts, completions, **_):
    return [float(c.strip() == "yes") + 0.5 * float(c.strip() == "maybe") for c in completions]


@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_grpo_over_the_task_vocabulary_trains_as_the_full_loop(tmp_path, beta):
    """Same seed, same samples and rewards, the same weights after the updates (the pinned coordinate,
    which the task-vocabulary loop holds, aside); the export is a full GPT-2 again."""
    items = [PromptItem("P", f"Q: {i} A:") for i in range(20)]
    cfg = GRPOTrainConfig(steps=3, prompts_per_step=4, group_size=4, max_new_tokens=4,
                          minibatch_size=8, lr=1e-3, loss=grpo.GRPOConfig(beta=beta), progress=False,
                          report_to="none", seed=3, temperature=0.9)
    runs = {}
    for vocab in ("full", "auto"):
        full, _ = marked_model(2)
        trainer = GRPOTrainer(full, items, dataclasses.replace(cfg, vocab=vocab, out_dir=str(tmp_path / vocab)),
                              reward_funcs=toy_reward)
        history = trainer.train()
        runs[vocab] = (trainer, history, trainer.export_model())
        for (name, a), b in zip(full.state_dict().items(), runs[vocab][2].state_dict().values()):
            assert torch.equal(a, b), f"the model handed in is the trained one ({vocab}): {name}"
    (t_full, h_full, m_full), (t_task, h_task, m_task) = runs["full"], runs["auto"]
    assert t_full.vocab is None and t_task.vocab is not None and t_task.model.config.vocab_size == len(t_task.vocab)
    assert [r["reward"] for r in h_full] == [r["reward"] for r in h_task]
    assert t_full.last_batch.completions == t_task.last_batch.completions
    for a, b in zip(h_full, h_task):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-4, abs=1e-6)
    assert m_task.config.vocab_size == m_full.config.vocab_size
    for (name, a), (_, b) in zip(m_full.state_dict().items(), m_task.state_dict().items()):
        if name.startswith("transformer.ln_f."):
            keep = torch.arange(len(a)) != PINNED
            a, b = a[keep], b[keep]
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-5), name
    # the checkpoint exports the same full model
    from rookworld_lib.core.checkpoint import model_from_checkpoint

    again = model_from_checkpoint(tmp_path / "auto" / "checkpoints")
    for (name, a), (_, b) in zip(m_task.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name


def test_an_unmarked_model_opts_in_with_a_given_vocabulary(tmp_path):
    """vocab='task' on a model that marks none needs task_vocab=; the export keeps every other row."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", block_size=32)).eval()
    items = [PromptItem("P", f"Q: {i} A:") for i in range(8)]
    cfg = GRPOTrainConfig(steps=1, prompts_per_step=2, group_size=2, max_new_tokens=3,
                          minibatch_size=4, progress=False, report_to="none", vocab="task")
    with pytest.raises(ValueError, match="marks no task vocabulary"):
        GRPOTrainer(model, items, cfg, reward_funcs=toy_reward)
    tok = get_tokenizer()
    given = TaskVocab({t for s in TEXTS for t in tok.encode(s)})
    before = model.transformer.wte.weight.detach().clone()
    length = lambda prompts, completions, **_: [float(len(c)) for c in completions]  # noqa: E731 (varies: an update)
    trainer = GRPOTrainer(model, items, cfg, reward_funcs=length, task_vocab=given)
    trainer.train()
    out = trainer.export_model()
    outside = torch.ones(len(before), dtype=torch.bool)
    outside[trainer.vocab.ids] = False
    assert torch.equal(out.transformer.wte.weight[outside], before[outside])
    assert not torch.equal(out.transformer.wte.weight[trainer.vocab.ids], before[trainer.vocab.ids])


def test_the_distance_to_the_full_policy_is_the_kl_of_the_restriction():
    """outside_logmass is KL(restricted || full) per position, computed here from the two softmaxes;
    for a marked model it is below float32's resolution, for an unmarked one it is not."""
    from rookworld_lib.core.task_vocab import outside_logmass

    full, vocab = marked_model(3)
    tok = get_tokenizer()
    seqs = [encode_prompt(t, full.prompt_prefix, tok) for t in TEXTS[:3]]
    assert outside_logmass(full, vocab, seqs).max() < 1e-6
    torch.manual_seed(0)
    other = GPT(GPTConfig.preset("tiny", block_size=32)).eval()
    kl = outside_logmass(other, vocab, seqs, temperature=0.7)
    with torch.no_grad():
        p = torch.softmax(other(torch.tensor([seqs[0]]))[0].double() / 0.7, -1)
    q = p[:, vocab.ids] / p[:, vocab.ids].sum(-1, keepdim=True)
    reference = (q * (q.log() - p[:, vocab.ids].log())).sum(-1)
    assert torch.allclose(kl[: len(seqs[0])].double(), reference, rtol=1e-4) and kl.min() > 1.0
