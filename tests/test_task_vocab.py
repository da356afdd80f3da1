"""TaskVocab: a compact model trained over the task's tokens, expanded to the exact full GPT-2."""

import math

import pytest
import torch
import torch.nn.functional as F

from rookworld_lib.core.model import GPT, GPTConfig
from rookworld_lib.core.task_vocab import OFF_LOGIT, PINNED, PINNED_BIAS, TaskVocab, outside_logmass, pin_bias_coordinate, pinned
from rookworld_lib.core.tokenizer import EOT_ID, VOCAB_SIZE, get_tokenizer
from rookworld_lib.core.train_utils import build_adamw

TEXTS = ["P: rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1 M: e7e5 c7c5 E: 0.2 0.3 B: e7e5",
         "A: 8/8/8/8/8/8/6k1/4K2R w K - 0 1+e1g1+e1g1+8/8/8/8/8/8/6k1/5RK1 b - - 1 1+0.001+0+0"]
CONFIG = GPTConfig(n_layer=2, n_head=2, n_embd=32, block_size=64)


def _vocab_and_batch():
    enc = get_tokenizer()
    stream = [t for text in TEXTS for t in [EOT_ID, *enc.encode(text)]]
    vocab = TaskVocab(stream)
    tokens = torch.tensor(stream[:49])
    return vocab, tokens[:-1][None], tokens[1:][None]


def _trained_compact(vocab, x, y, steps=5):
    torch.manual_seed(0)
    model = GPT(vocab.compact_config(CONFIG))
    pin_bias_coordinate(model)
    opt = build_adamw(model, lr=1e-2, weight_decay=0.1, device_type="cpu")
    for _ in range(steps):
        model(vocab.compact(x), targets=vocab.compact(y)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return model


def test_training_keeps_the_bias_coordinate_pinned():
    vocab, x, y = _vocab_and_batch()
    model = _trained_compact(vocab, x, y)
    ln = model.transformer.ln_f
    assert ln.weight[PINNED].item() == 0.0 and ln.bias[PINNED].item() == PINNED_BIAS  # exactly: AdamW never moved them
    assert (ln.weight[PINNED + 1:] != 1.0).any() and (ln.bias[PINNED + 1:] != 0.0).any()  # the rest trained
    assert (model.transformer.wte.weight[:, PINNED] != 0).any()  # the per-token biases are learned


def test_expanded_model_is_the_compact_one_over_gpt2_ids():
    vocab, x, y = _vocab_and_batch()
    compact = _trained_compact(vocab, x, y).eval()
    compact.meta["rookworld_layout"] = "original"  # what a task layer records (GPT.meta) travels with the model
    full = vocab.expand(compact).eval()
    assert full.config.vocab_size == VOCAB_SIZE and full.transformer.wte.weight.shape[0] == VOCAB_SIZE
    with torch.no_grad():
        small = F.log_softmax(compact(vocab.compact(x)), dim=-1)
        big = F.log_softmax(full(x), dim=-1)
        # task tokens: the same log-probs; every other token: logit -OFF_LOGIT, whatever the input
        torch.testing.assert_close(big[..., vocab.ids], small, atol=2e-5, rtol=0)
        outside = torch.ones(VOCAB_SIZE, dtype=torch.bool)
        outside[vocab.ids] = False
        logits = full(x)
        torch.testing.assert_close(logits[..., outside], torch.full_like(logits[..., outside], -OFF_LOGIT))
        assert big[..., outside].exp().sum(-1).max().item() < 1e-12
        # the compact model's training loss is the full model's cross-entropy on the same text
        torch.testing.assert_close(full(x, targets=y), compact(vocab.compact(x), targets=vocab.compact(y)),
                                   atol=2e-5, rtol=0)
    assert (full.meta, full.prompt_prefix) == (compact.meta, compact.prompt_prefix) and full.meta is not compact.meta


def test_expanded_model_loads_in_transformers(tmp_path):
    transformers = pytest.importorskip("transformers")
    vocab, x, y = _vocab_and_batch()
    full = vocab.expand(_trained_compact(vocab, x, y)).eval()
    full.save_pretrained(tmp_path)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(input_ids=x).logits, full(x), atol=1e-4, rtol=1e-4)
    assert GPT.from_pretrained(tmp_path).config.vocab_size == VOCAB_SIZE


def test_compact_ids_and_bad_input():
    vocab, x, _ = _vocab_and_batch()
    enc = get_tokenizer()
    assert vocab.ids.tolist() == sorted({EOT_ID} | {t for text in TEXTS for t in enc.encode(text)})
    compact = vocab.compact(x)
    assert compact.min() >= 0 and compact.max() < len(vocab)
    assert torch.equal(vocab.ids[compact], x)  # a bijection on the vocabulary
    assert vocab.compact(torch.tensor([-1, int(vocab.ids[0])])).tolist() == [-1, 0]  # ignored targets stay ignored
    # also where GPT-2's token 0 ('!') is in the vocabulary: -1 is not read as it
    assert TaskVocab([0, 5, EOT_ID]).compact(torch.tensor([-1, 5, 0, -1])).tolist() == [-1, 1, 0, -1]
    unknown = next(t for t in range(VOCAB_SIZE) if vocab.index[t] < 0)
    with pytest.raises(ValueError, match=rf"token ids \[{unknown}\] are not in the task vocabulary"):
        vocab.compact(torch.tensor([unknown]))
    # an id past GPT-2's vocabulary (a padded head's extra row) is named, not an IndexError from the lookup table
    with pytest.raises(ValueError, match=rf"token ids \[{VOCAB_SIZE}, 60000\] are not GPT-2 token ids \(0..50256\)"):
        vocab.compact(torch.tensor([int(vocab.ids[0]), 60000, VOCAB_SIZE]))
    with pytest.raises(ValueError, match="GPT-2 token ids"):
        TaskVocab([VOCAB_SIZE])
    with pytest.raises(ValueError, match="GPT-2 token ids"):
        TaskVocab([])


def test_off_vocabulary_mass_is_below_float32_resolution():
    # the bound the module docstring states, from the constants themselves
    assert VOCAB_SIZE * math.exp(-OFF_LOGIT) < 1e-12


def test_sft_with_the_task_vocabulary_trains_resumes_and_exports_full_gpt2(tmp_path):
    from rookworld_lib.core.checkpoint import export_hf
    from rookworld_lib.core.train_sft import SFTConfig, SFTTrainer, train_sft

    enc = get_tokenizer()
    texts = TEXTS * 20
    cfg = SFTConfig(model="tiny", vocab="task", max_steps=6, batch_size=2, block_size=32, lr=3e-3, warmup_steps=1,
                    eval_interval=3, eval_steps=1, val_fraction=0.1, checkpoint_interval=3, out_dir=str(tmp_path),
                    progress=False, device="cpu", deterministic=True)
    half = train_sft(cfg, train_texts=texts, until=3)
    result = train_sft(cfg, train_texts=texts)  # resumes at step 3
    assert result.step == 6 and [r["step"] for r in result.history] == [4, 5, 6]
    vocab = TaskVocab([EOT_ID] + [t for text in TEXTS for t in enc.encode(text)])
    trainer = SFTTrainer(cfg, train_texts=texts)  # the finished run, reloaded
    assert trainer.model.config.vocab_size == len(vocab) == len(trainer.vocab)
    assert torch.equal(trainer.vocab.ids, vocab.ids)
    full = result.model.eval()  # train_sft returns the expanded model
    assert full.config.vocab_size == VOCAB_SIZE and half.model.config.vocab_size == VOCAB_SIZE
    exported = GPT.from_pretrained(result.final_dir)
    for a, b in zip(full.state_dict().values(), exported.state_dict().values()):
        assert torch.equal(a, b)
    from_checkpoint = GPT.from_pretrained(export_hf(result.checkpoint, tmp_path / "from-ckpt"))
    assert all(torch.equal(a, b) for a, b in zip(exported.parameters(), from_checkpoint.parameters()))
    x = torch.tensor([[EOT_ID, *enc.encode(TEXTS[0])]])
    with torch.no_grad():
        assert torch.isfinite(exported(x[:, :-1], targets=x[:, 1:]))
        assert exported(x)[..., ~torch.isin(torch.arange(VOCAB_SIZE), vocab.ids)].max().item() == -OFF_LOGIT
    with pytest.raises(ValueError, match="SFTConfig.init_from must be 'scratch' with vocab='task'"):
        SFTConfig(vocab="task", init_from=str(tmp_path / "final"), train_data=(), out_dir=str(tmp_path / "x"))


def test_the_mass_outside_a_vocabulary_is_measured_at_the_temperature_asked():
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", block_size=16)).eval()
    vocab = TaskVocab(set(range(100)) | {EOT_ID})
    seq = [5, 17, 42, 99]
    with torch.no_grad():
        logits = model(torch.tensor([seq]))[0].double()
    for t in (0.5, 1.0, 2.0):  # by definition: logsumexp over all tokens minus over the vocabulary's, of logits / T
        want = (logits / t).logsumexp(-1) - (logits[:, sorted(vocab.ids.tolist())] / t).logsumexp(-1)
        assert outside_logmass(model, vocab, [seq], temperature=t).tolist() == pytest.approx(want.tolist(), rel=1e-4)


# Behaviours of core/task_vocab that no test pinned (mutation round 5: each test below is red with its mutant)

def test_a_negative_token_id_is_refused_not_wrapped_onto_eot():
    """TaskVocab needs GPT-2 ids in [0, VOCAB_SIZE): -1 (an ignored target's id) is no token. Taken in, it
    would index the lookup table from the end and give EOT (id 50256) a compact id it does not have."""
    with pytest.raises(ValueError, match="GPT-2 token ids"):
        TaskVocab([-1, 5, 7])
    vocab = TaskVocab([5, 7])
    assert vocab.index[EOT_ID].item() == -1 and vocab.index[VOCAB_SIZE - 1].item() == -1


def test_a_pinned_model_without_an_off_row_marks_no_vocabulary():
    """of_model: None for a model "that is not pinned or holds no off row (a model trained over all of
    GPT-2)": pinning a full-vocabulary model's LayerNorm does not make every token a task token."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", block_size=32))
    assert model.config.vocab_size == VOCAB_SIZE
    pin_bias_coordinate(model)
    assert TaskVocab.of_model(model) is None


def test_measuring_the_mass_outside_leaves_the_model_in_the_mode_it_was_in():
    """outside_logmass scores in eval mode (no dropout) and gives the model back as it found it: a model in
    training stays in training (its dropout on), one in eval stays in eval."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", block_size=32))
    tok = get_tokenizer()
    seq = [EOT_ID, *tok.encode("P: 8/8/8 M: e2e4")]
    vocab = TaskVocab(seq)
    model.train()
    outside_logmass(model, vocab, [seq])
    assert model.training
    model.eval()
    outside_logmass(model, vocab, [seq])
    assert not model.training


def test_a_model_is_pinned_only_with_gain_zero_and_bias_pinned_bias_there():
    """pinned(): "gain 0, bias PINNED_BIAS" at coordinate PINNED. A LayerNorm whose bias there happens to be
    PINNED_BIAS but whose gain is not 0 does not carry the constant: no task vocabulary is read from it."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", block_size=32))
    with torch.no_grad():
        model.transformer.ln_f.bias[PINNED] = PINNED_BIAS
        model.transformer.ln_f.weight[PINNED] = 1.0
    assert not pinned(model)
    with torch.no_grad():
        model.transformer.ln_f.weight[PINNED] = 0.0
    assert pinned(model)


@pytest.mark.parametrize("training", [False, True])
def test_restrict_and_expand_keep_the_models_mode_prompt_prefix_meta_and_source(training):
    """_resized's contract: the new model holds the old one's meta, prompt prefix, source and train/eval
    mode. A model loaded from an original RookWorld folder has no prompt prefix ("") and is scored in
    eval mode; its restriction (the sampler's view) must read prompts the same way, without dropout."""
    torch.manual_seed(0)
    tok = get_tokenizer()
    vocab = TaskVocab([EOT_ID, *tok.encode("P: 8/8/8 M: e2e4 B: e2e4")])
    full = GPT(GPTConfig.preset("tiny", block_size=32)).train(training)
    pin_bias_coordinate(full)
    full.prompt_prefix, full.source, full.meta = "", "/models/x", {"rookworld_layout": "original"}
    for made in (vocab.restrict(full), vocab.expand(vocab.restrict(full))):
        assert made.training is training
        assert (made.prompt_prefix, made.source, made.meta) == ("", "/models/x", {"rookworld_layout": "original"})
