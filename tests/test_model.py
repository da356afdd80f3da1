import re
import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from rookworld_lib.core.model import (GPT, CheckpointFormatError, GPTConfig, KVCache, PRESETS, additive_mask,
                                      config_from_dict, hf_config_dict, lm_loss)
from rookworld_lib.core.sampling import padded_attention_mask

transformers = pytest.importorskip("transformers")


def small_hf_config(**kw):
    base = dict(vocab_size=50257, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    base.update(kw)
    return transformers.GPT2Config(**base)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(small_hf_config()).eval()
    # A random init has tiny LayerNorm-free differences; perturb LN and biases so every tensor matters.
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "ln" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    d = tmp_path_factory.mktemp("hf")
    hf.save_pretrained(d, safe_serialization=True)
    return d, hf


def test_default_is_gpt2_124m():
    with torch.device("meta"):  # shapes only: no 124M random numbers drawn
        assert GPT(GPTConfig()).num_params() == 124_439_808


def test_presets_param_counts():
    # Known GPT-2 family sizes (tied head, with positions).
    expected = {"gpt2-medium": 354_823_168, "gpt2-large": 774_030_080, "gpt2-xl": 1_557_611_200}
    for name, n in expected.items():
        c = PRESETS[name]
        V, T, C, L = c.vocab_size, c.block_size, c.n_embd, c.n_layer
        per_layer = 12 * C * C + 13 * C
        assert V * C + T * C + L * per_layer + 2 * C == n


def test_config_rejects_bad_values_naming_field():
    with pytest.raises(ValueError, match="n_head"):
        GPTConfig(n_embd=100, n_head=3)
    with pytest.raises(ValueError, match="dropout"):
        GPTConfig(dropout=1.5)
    with pytest.raises(ValueError, match="attn_impl"):
        GPTConfig(attn_impl="flash2")
    with pytest.raises(ValueError, match="n_layer"):
        GPTConfig(n_layer=0)


def test_load_hf_logits_match(hf_dir):
    d, hf = hf_dir
    ours = GPT.from_pretrained(d).eval()
    idx = torch.randint(0, 50257, (3, 40))
    with torch.no_grad():
        ref = hf(idx).logits
        got = ours(idx)
    assert got.shape == (3, 40, 50257)
    assert (got - ref).abs().max().item() < 1e-4


def test_save_then_transformers_loads_same_logits(hf_dir, tmp_path):
    d, hf = hf_dir
    ours = GPT.from_pretrained(d).eval()
    ours.save_pretrained(tmp_path)
    back = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    idx = torch.randint(0, 50257, (2, 33))
    with torch.no_grad():
        assert (back(idx).logits - ours(idx)).abs().max().item() < 1e-4


def test_layer_norm_epsilon_is_read_and_written_as_transformers_uses_it(tmp_path):
    """A config.json's layer_norm_epsilon is the model's (here 0.1, far from GPT-2's 1e-5, so it shows in the
    logits): a transformers folder loads with transformers' logits, and the export writes it back so that
    transformers, reading the export, gives ours."""
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(small_hf_config(layer_norm_epsilon=0.1)).save_pretrained(tmp_path / "hf")
    idx = torch.randint(0, 50257, (2, 10))
    with torch.no_grad():
        ours = GPT.from_pretrained(tmp_path / "hf")
        assert ours.config.layer_norm_epsilon == 0.1
        theirs = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "hf").eval()
        assert (ours(idx) - theirs(idx).logits).abs().max().item() < 1e-4
        ours.save_pretrained(tmp_path / "ours")
        assert json.loads((tmp_path / "ours" / "config.json").read_text())["layer_norm_epsilon"] == 0.1
        back = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "ours").eval()
        assert (back(idx).logits - ours(idx)).abs().max().item() < 1e-4


def test_vocab_padding_keeps_outputs(hf_dir):
    d, _ = hf_dir
    plain = GPT.from_pretrained(d).eval()
    padded = GPT.from_pretrained(d, pad_vocab_to_multiple=64).eval()
    assert padded.transformer.wte.weight.shape[0] == 50304
    idx = torch.randint(0, 50257, (2, 17))
    with torch.no_grad():
        assert padded(idx).shape[-1] == 50257
        assert torch.allclose(plain(idx), padded(idx), atol=1e-5)


def test_a_padded_models_export_round_trips_as_its_hf_state_dict(hf_dir, tmp_path):
    # the gpu profile pads the vocabulary to 50304 rows; its export (and the reload) holds 50257: the
    # weights compare as exported, as notebook 05 checks its export
    d, _ = hf_dir
    padded = GPT.from_pretrained(d, pad_vocab_to_multiple=64)
    with torch.no_grad():
        padded.transformer.wte.weight[50257:] = 7.0  # whatever the padding rows hold is not exported
    padded.save_pretrained(tmp_path)
    back = GPT.from_pretrained(tmp_path)
    ours, theirs, on_disk = padded.hf_state_dict(), back.hf_state_dict(), load_file(tmp_path / "model.safetensors")
    assert ours.keys() == theirs.keys() == on_disk.keys()
    assert all(torch.equal(ours[k], theirs[k]) and torch.equal(ours[k], on_disk[k]) for k in ours)
    assert ours["transformer.wte.weight"].shape == (50257, padded.config.n_embd)
    assert [p.shape for p in padded.parameters()] != [p.shape for p in back.parameters()]


def test_math_attention_matches_sdpa(hf_dir):
    d, _ = hf_dir
    a = GPT.from_pretrained(d).eval()
    b = GPT.from_pretrained(d, attn_impl="math").eval()
    idx = torch.randint(0, 50257, (2, 21))
    with torch.no_grad():
        assert torch.allclose(a(idx), b(idx), atol=1e-5)


@pytest.mark.parametrize("impl", ["sdpa", "math"])
def test_a_boolean_mask_converted_once_gives_what_each_layer_converting_it_gives(impl):
    """GPT.forward turns a boolean mask into the additive one once for all layers (additive_mask); the
    reference is each attention layer given the boolean mask itself (SDPA converts it per call; the
    math path masks with it): bit for bit the same, left-padded prefill and cached decode step."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", attn_impl=impl)).eval()
    valid = torch.tensor([[False, False, True, True, True], [True] * 5, [False, True, True, True, True]])
    idx, pos = torch.randint(0, 50257, valid.shape), (valid.cumsum(1) - 1).clamp(min=0)
    allowed = padded_attention_mask(valid, 5)

    def reference(x, mask, position_ids, cache=None, start=0):
        h = model.transformer.wte(x) + model.transformer.wpe(position_ids)
        for i, block in enumerate(model.transformer.h):
            h = block(h, mask, cache, i, start)
        return model.lm_head(model.transformer.ln_f(h))

    with torch.no_grad():
        assert additive_mask(allowed, torch.float32).dtype == torch.float32
        assert torch.equal(model(idx, pos, allowed), reference(idx, allowed, pos))
        caches = [KVCache(model.config, 3, 6, "cpu", torch.float32) for _ in range(2)]
        model(idx, pos, allowed, caches[0], 0)
        reference(idx, allowed, pos, caches[1], 0)
        step = padded_attention_mask(torch.cat([valid, torch.ones(3, 1, dtype=torch.bool)], 1), 1)
        tok, where = torch.randint(0, 50257, (3, 1)), pos[:, -1:] + 1
        assert torch.equal(model(tok, where, step, caches[0], 5), reference(tok, step, where, caches[1], 5))


def test_strict_keys_missing_and_unexpected(hf_dir, tmp_path):
    """A missing or an unknown tensor is refused by name; the causal-mask buffers older transformers versions
    saved with the weights (attn.bias, attn.masked_bias) are not weights: they are dropped, and the model holds
    the file's weights exactly."""
    d, _ = hf_dir
    state = load_file(str(d / "model.safetensors"))
    (tmp_path / "config.json").write_text((d / "config.json").read_text())
    missing = dict(state)
    missing.pop("transformer.h.1.mlp.c_fc.bias")
    save_file(missing, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointFormatError, match="missing keys: transformer.h.1.mlp.c_fc.bias"):
        GPT.from_pretrained(tmp_path)
    extra = dict(state)
    extra["transformer.h.0.attn.q_norm.weight"] = torch.ones(4)
    save_file(extra, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointFormatError, match="unexpected keys: transformer.h.0.attn.q_norm.weight"):
        GPT.from_pretrained(tmp_path)
    T = 64  # small_hf_config's n_positions
    buffers = {"transformer.h.0.attn.bias": torch.tril(torch.ones(T, T, dtype=torch.uint8)).view(1, 1, T, T),
               "transformer.h.0.attn.masked_bias": torch.tensor(-1e4)}
    save_file({**state, **buffers}, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    torch.testing.assert_close(GPT.from_pretrained(tmp_path).state_dict(), GPT.from_pretrained(d).state_dict(),
                               rtol=0, atol=0)


def test_weights_that_are_integers_or_not_finite_are_refused_naming_the_tensor(hf_dir, tmp_path):
    """Integer weights used to load as truncated floats (a model of zeros, silently) and NaN weights as a
    model eval scored 0% and SFT blamed on the learning rate: each is refused, naming the file and the
    key. Half-precision weights load, upcast, as before."""
    d, _ = hf_dir
    state = load_file(str(d / "model.safetensors"))
    (tmp_path / "config.json").write_text((d / "config.json").read_text())
    weights = tmp_path / "model.safetensors"
    for key, tensor, says in (("transformer.h.0.mlp.c_fc.weight", None, "holds torch.int32 values; weights are floating point"),
                              ("transformer.ln_f.weight", float("nan"), "holds NaN or infinite values"),
                              ("transformer.wpe.weight", float("inf"), "holds NaN or infinite values")):
        bad = dict(state)
        bad[key] = bad[key].to(torch.int32) if tensor is None else bad[key].clone().index_fill_(0, torch.tensor([0]), tensor)
        save_file(bad, str(weights), metadata={"format": "pt"})
        with pytest.raises(CheckpointFormatError, match=rf"^{re.escape(str(weights))}: {re.escape(key)} {says}$"):
            GPT.from_pretrained(tmp_path)
    save_file({k: v.half() for k, v in state.items()}, str(weights), metadata={"format": "pt"})
    assert GPT.from_pretrained(tmp_path).transformer.ln_f.weight.dtype == torch.float32


def test_rejects_non_gpt2_activation(hf_dir, tmp_path):
    d, _ = hf_dir
    cfg = json.loads((d / "config.json").read_text())
    cfg["activation_function"] = "gelu"
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointFormatError, match="activation_function"):
        GPT.from_pretrained(tmp_path)


def test_an_untied_config_without_its_head_is_refused_not_tied(hf_dir, tmp_path):
    """tie_word_embeddings false and no lm_head.weight: transformers gives that model a separate head
    (at random); tying it silently would give other logits than transformers'. One error instead."""
    d, _ = hf_dir
    cfg = json.loads((d / "config.json").read_text())
    cfg["tie_word_embeddings"] = False
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointFormatError, match="config.json: tie_word_embeddings is false and model.safetensors holds no lm_head.weight"):
        GPT.from_pretrained(tmp_path)


def test_missing_directory_names_files(tmp_path):
    with pytest.raises(CheckpointFormatError, match="config.json"):
        GPT.from_pretrained(tmp_path / "nowhere")


def test_tanh_gelu_not_erf():
    # Our MLP must use GELU's tanh approximation (GPT-2); exact erf differs measurably.
    torch.manual_seed(0)
    m = GPT(GPTConfig.preset("tiny")).eval()
    x = torch.linspace(-4, 4, 64).repeat(1, 1, 4)[:, :, :64].expand(1, 4, 64).contiguous() * 3
    mlp = m.transformer.h[0].mlp
    with torch.no_grad():
        h = mlp.c_fc(x)
        want = mlp.c_proj(torch.nn.functional.gelu(h, approximate="tanh"))
        erf = mlp.c_proj(torch.nn.functional.gelu(h))
        assert torch.allclose(mlp(x), want)
        assert not torch.allclose(mlp(x), erf, atol=1e-7)


def test_causality_future_token_does_not_change_past():
    torch.manual_seed(0)
    m = GPT(GPTConfig.preset("tiny")).eval()
    idx = torch.randint(0, 50257, (1, 30))
    idx2 = idx.clone()
    idx2[0, 20] = (idx[0, 20] + 1) % 50257
    with torch.no_grad():
        a, b = m(idx), m(idx2)
    assert torch.equal(a[:, :20], b[:, :20])
    assert not torch.allclose(a[:, 20:], b[:, 20:])


def test_dropout_off_in_eval_and_on_in_train():
    torch.manual_seed(0)
    m = GPT(GPTConfig.preset("tiny", dropout=0.2))
    idx = torch.randint(0, 50257, (2, 16))
    m.eval()
    with torch.no_grad():
        assert torch.equal(m(idx), m(idx))
    m.train()
    with torch.no_grad():
        assert not torch.equal(m(idx), m(idx))


def test_gradient_checkpointing_gives_the_same_gradients_from_fewer_saved_tensors():
    """gradient_checkpointing gives the gradients of the plain model, and in train mode it saves far fewer
    tensors for backward (each block's input; the rest is recomputed: the memory it is for), counted with
    torch.autograd.graph.saved_tensors_hooks. Off, or in eval mode, every op saves its own."""
    torch.manual_seed(0)
    a = GPT(GPTConfig.preset("tiny"))
    b = GPT(GPTConfig.preset("tiny", gradient_checkpointing=True))
    b.load_state_dict(a.state_dict())
    idx = torch.randint(0, 50257, (2, 16))
    saved = {}
    for name, m in (("plain", a), ("checkpointed", b), ("checkpointed, eval", b)):
        m.train(name != "checkpointed, eval")
        count = [0]

        def pack(t):
            count[0] += 1
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = lm_loss(m(idx[:, :-1]), idx[:, 1:])
        if name != "checkpointed, eval":
            loss.backward()
        saved[name] = count[0]
    for (na, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-6), na
    assert saved["checkpointed"] * 3 < saved["plain"] == saved["checkpointed, eval"], saved


def test_loss_at_init_near_uniform():
    torch.manual_seed(0)
    m = GPT(GPTConfig.preset("tiny")).eval()
    idx = torch.randint(0, 50257, (4, 64))
    with torch.no_grad():
        loss = lm_loss(m(idx[:, :-1]), idx[:, 1:]).item()
    assert abs(loss - torch.log(torch.tensor(50257.0)).item()) < 0.2


def test_init_spreads_each_weight_as_transformers_gpt2_does():
    """GPT-2's init (transformers' GPT2PreTrainedModel._init_weights): N(0, 0.02) for the matrices and
    embeddings, 0.02 / sqrt(2 n_layer) for the residual projections (c_proj), zero biases, unit gains."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    ours = GPT(GPTConfig.preset("tiny", block_size=64))
    theirs = transformers.GPT2LMHeadModel(transformers.GPT2Config(**hf_config_dict(ours.config)))
    mine, ref = dict(ours.named_parameters()), dict(theirs.named_parameters())

    def spread(params, suffix):
        return torch.cat([p.detach().flatten() for n, p in params.items() if n.endswith(suffix)]).std().item()

    assert spread(ref, "c_proj.weight") == pytest.approx(0.01, rel=0.03)  # the reference itself: 0.02 / sqrt(4)
    for suffix in ("c_proj.weight", "c_attn.weight", "c_fc.weight", "wte.weight", "wpe.weight"):
        assert spread(mine, suffix) == pytest.approx(spread(ref, suffix), rel=0.03), suffix
    for suffix in ("c_proj.bias", "ln_1.bias", "ln_f.weight"):
        assert torch.equal(torch.cat([p.flatten() for n, p in mine.items() if n.endswith(suffix)]),
                           torch.cat([p.flatten() for n, p in ref.items() if n.endswith(suffix)])), suffix


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_exported_files_get_the_users_umask_not_0600(tmp_path, umask, mode):
    """safetensors' save_file writes its file 0600: an export shared with other users (a --out on a
    shared filesystem) gets the mode `touch` would give it, the weights as well as config.json."""
    code = ("import os, sys; os.umask(int(sys.argv[1])); from rookworld_lib.core.model import GPT, GPTConfig; "
            "GPT(GPTConfig.preset('tiny', block_size=8)).save_pretrained(sys.argv[2])")
    subprocess.run([sys.executable, "-c", code, str(umask), str(tmp_path / "final")], check=True)
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in (tmp_path / "final").iterdir()} == \
        {name: oct(mode) for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")}


def test_an_export_carries_the_tokenizer_transformers_reads_offline(tmp_path):
    """AutoTokenizer.from_pretrained(export) is GPT-2's tokenizer, offline: the ids tiktoken gives (our
    get_tokenizer) for every shipped test text and for awkward strings, and the text back from them."""
    from rookworld_lib.chess import data
    from rookworld_lib.core.tokenizer import EOT_ID, encode

    GPT(GPTConfig.preset("tiny", block_size=64)).save_pretrained(tmp_path)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert tok.eos_token_id == tok.bos_token_id == EOT_ID and len(tok) == 50257 and tok.model_max_length == 64
    texts = [r["prompt"] + r["completion"] for split in ("P", "A") for r in data.load_split(split, "test").records]
    texts += ["<|endoftext|>P: 8/8/8/8/8/8/8/8 w - - 0 1", "Ünïcödé 日本語 🚀 I'M don't\t\ttab  \n\n x", "   lead", "trail   "]
    for text in texts:
        assert tok.encode(text) == encode(text), text
        assert tok.decode(tok.encode(text)) == text


def test_a_model_over_another_vocabulary_is_named_before_it_samples_or_trains(tmp_path):
    """A GPT-2 directory with vocab_size 50258 (a pad token added) loads with transformers' logits, but
    an id past GPT-2's cannot be decoded: eval and GRPO refuse it naming config.json; SFT trains a
    padded embedding no more (it trained 50304 rows into an export that eval and grpo then refused), nor
    one missing GPT-2 ids (1000); the message for the padded one says how to cut it to GPT-2's."""
    from rookworld_lib.chess import data, evaluate
    from rookworld_lib.core.train_grpo import GRPOTrainConfig, GRPOTrainer, PromptItem
    from rookworld_lib.core.train_sft import SFTConfig, train_sft

    for n in (50258, 1000):
        GPT(GPTConfig.preset("tiny", block_size=64, vocab_size=n)).save_pretrained(tmp_path / str(n))
        model = GPT.from_pretrained(tmp_path / str(n))
        message = rf"{tmp_path / str(n)}/config.json: vocab_size {n}: the texts here are GPT-2's 50,257 tokens"
        with pytest.raises(ValueError, match=message + ".* cannot be trained, sampled or scored here"):
            evaluate.complete(model, [data.load_split("P", "test").records[0]["prompt"]], evaluate.EvalConfig())
        with pytest.raises(ValueError, match=message):
            GRPOTrainer(model, [PromptItem("P", "Q:")] * 2, GRPOTrainConfig(progress=False),
                        reward_funcs=lambda completions, **_: [0.0] * len(completions))
    for n, fix in ((1000, ""), (50258, r"; for an embedding padded past GPT-2's tokens, keep the first 50,257 rows")):
        cfg = SFTConfig(init_from=str(tmp_path / str(n)), block_size=32, out_dir=str(tmp_path / "sft"), max_steps=1,
                        warmup_steps=0, val_fraction=0.0, eval_interval=0, progress=False, report_to="none")
        with pytest.raises(ValueError, match=rf"vocab_size {n}: .* cannot be trained, sampled or scored here{fix}"):
            train_sft(cfg, train_texts=["P: a b c d e f g h i j k l m n o p q r s t u v w x y z"] * 64)
        assert not (tmp_path / "sft" / "final").exists()


def test_a_run_whose_export_would_overwrite_the_model_it_starts_from_is_refused(tmp_path):
    """--init-from w/final with --out w: the export (w/final) would replace the model trained from, in
    SFT and in GRPO alike; refused before anything is written."""
    from rookworld_lib.core.train_grpo import GRPOTrainConfig, GRPOTrainer, PromptItem
    from rookworld_lib.core.train_sft import SFTConfig

    GPT(GPTConfig.preset("tiny", block_size=64)).save_pretrained(tmp_path / "w" / "final")
    before = (tmp_path / "w" / "final" / "model.safetensors").read_bytes()
    message = f"would export into {tmp_path / 'w' / 'final'}, which holds the model it starts from"
    with pytest.raises(ValueError, match=message):
        SFTConfig(init_from=str(tmp_path / "w" / "final"), block_size=32, out_dir=str(tmp_path / "w"))
    SFTConfig(init_from=str(tmp_path / "w" / "final"), block_size=32, out_dir=str(tmp_path / "w"), export_hf=False)
    with pytest.raises(ValueError, match=message):
        GRPOTrainer(GPT.from_pretrained(tmp_path / "w" / "final"), [PromptItem("P", "Q:")] * 2,
                    GRPOTrainConfig(out_dir=str(tmp_path / "w"), progress=False),
                    reward_funcs=lambda completions, **_: [0.0] * len(completions), init_from=str(tmp_path / "w" / "final"))
    assert (tmp_path / "w" / "final" / "model.safetensors").read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["final"]
    inside = tmp_path / "w" / "final" / "base"  # a model kept inside the folder the export replaces
    GPT(GPTConfig.preset("tiny", block_size=64)).save_pretrained(inside)
    with pytest.raises(ValueError, match=message.replace("starts from", r"starts from \(" + str(inside))):
        SFTConfig(init_from=str(inside), block_size=32, out_dir=str(tmp_path / "w"))


def test_a_directory_we_cannot_read_says_what_it_holds(tmp_path):
    """Sharded or pickle weights, a run directory instead of its final/, a checkpoint file: each named for
    what it is, with the way to a loadable model."""
    GPT(GPTConfig.preset("tiny", block_size=16)).save_pretrained(tmp_path / "run" / "final")
    for name in ("model.safetensors.index.json", "pytorch_model.bin"):
        d = tmp_path / name.split(".")[0]
        d.mkdir()
        (d / "config.json").write_text((tmp_path / "run" / "final" / "config.json").read_text())
        (d / name).write_text("{}")
        with pytest.raises(CheckpointFormatError, match=rf"{d}/model.safetensors not found: {d} holds .* \({name}\)"):
            GPT.from_pretrained(d)
    with pytest.raises(CheckpointFormatError, match=rf"{tmp_path / 'run'} is a run directory; its model is {tmp_path / 'run' / 'final'}"):
        GPT.from_pretrained(tmp_path / "run")
    (tmp_path / "step_00000003.pt").write_bytes(b"x")
    with pytest.raises(CheckpointFormatError, match="step_00000003.pt is a file, not a model directory"):
        GPT.from_pretrained(tmp_path / "step_00000003.pt")


def test_a_model_folder_with_another_tokenizer_is_refused_where_ours_would_misread_it(tmp_path):
    """A GPT-2-shaped model whose folder holds another tokenizer.json (here a character-level one) would
    be fed GPT-2 tokens it was never trained on, and GRPO's export would pair it with GPT-2's: eval and
    GRPO refuse it naming the file. Our own exports, and GPT-2's tokenizer from anywhere, pass."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from rookworld_lib.chess import evaluate
    from rookworld_lib.core.tokenizer import check_vocabulary
    from rookworld_lib.core.train_grpo import GRPOTrainConfig, GRPOTrainer, PromptItem

    GPT(GPTConfig.preset("tiny", block_size=64)).save_pretrained(tmp_path / "ours")
    check_vocabulary(GPT.from_pretrained(tmp_path / "ours"))  # our export: GPT-2's tokenizer
    chars = Tokenizer(models.WordLevel({c: i for i, c in enumerate("PA: abcdefghijklmnopqrstuvwxyz/012345678+-.KQRBNkqrbnpw")},
                                       unk_token="a"))
    chars.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    GPT(GPTConfig.preset("tiny", block_size=64)).save_pretrained(tmp_path / "chars")
    chars.save(str(tmp_path / "chars" / "tokenizer.json"))
    model = GPT.from_pretrained(tmp_path / "chars")  # the weights load: the core reads tensors
    message = f"{tmp_path / 'chars' / 'tokenizer.json'}: not GPT-2's tokenizer"
    with pytest.raises(ValueError, match=message):
        evaluate.complete(model, ["P: 8/8/8/8/8/8/8/8 w - - 0 1"], evaluate.EvalConfig())
    with pytest.raises(ValueError, match=message):
        GRPOTrainer(model, [PromptItem("P", "Q:")] * 2, GRPOTrainConfig(progress=False),
                    reward_funcs=lambda completions, **_: [0.0] * len(completions))
    hub = transformers.GPT2TokenizerFast(tokenizer_object=Tokenizer.from_file(str(tmp_path / "ours" / "tokenizer.json")))
    hub.save_pretrained(tmp_path / "hub")  # GPT-2's tokenizer written by transformers (other bytes than ours)
    (tmp_path / "ours" / "tokenizer.json").write_bytes((tmp_path / "hub" / "tokenizer.json").read_bytes())
    check_vocabulary(GPT.from_pretrained(tmp_path / "ours"))
    # the slow tokenizer's files alone (vocab.json, merges.txt): GPT-2's pass, a character-level pair is refused
    bpe = json.loads((tmp_path / "ours" / "tokenizer.json").read_text())["model"]
    (tmp_path / "ours" / "tokenizer.json").unlink()
    (tmp_path / "ours" / "vocab.json").write_text(json.dumps(bpe["vocab"]))
    (tmp_path / "ours" / "merges.txt").write_text(
        "#version: 0.2\n" + "".join((m if isinstance(m, str) else " ".join(m)) + "\n" for m in bpe["merges"]))
    check_vocabulary(GPT.from_pretrained(tmp_path / "ours"))
    (tmp_path / "chars" / "tokenizer.json").unlink()
    (tmp_path / "chars" / "vocab.json").write_text(json.dumps(chars.get_vocab()))
    (tmp_path / "chars" / "merges.txt").write_text("#version: 0.2\n")
    with pytest.raises(ValueError, match=f"{tmp_path / 'chars' / 'vocab.json'}: not GPT-2's tokenizer"):
        evaluate.complete(GPT.from_pretrained(tmp_path / "chars"), ["P: 8/8/8/8/8/8/8/8 w - - 0 1"], evaluate.EvalConfig())


def test_from_pretrained_returns_eval_mode_as_transformers_does(tmp_path):
    # dropout 0.1, as GPT-2's own config has it: in train mode every forward pass would differ
    transformers.GPT2LMHeadModel(small_hf_config(resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)).save_pretrained(tmp_path)
    ours, theirs = GPT.from_pretrained(tmp_path), transformers.GPT2LMHeadModel.from_pretrained(tmp_path)
    assert not ours.training and not theirs.training
    idx = torch.randint(0, 50257, (2, 9))
    with torch.no_grad():
        assert (ours(idx) - theirs(idx).logits).abs().max().item() < 1e-4


@pytest.mark.parametrize("impl, checkpointing", [("sdpa", False), ("math", False), ("sdpa", True)],
                         ids=["sdpa", "math", "sdpa-checkpointing-train-mode"])
def test_a_cached_decode_without_mask_or_positions_equals_the_full_forward(impl, checkpointing):
    """A core user's loop: prefill, then one or two tokens at a time from the cache, nothing else passed,
    gives the full forward's logits. Also in train mode (dropout 0) with gradient_checkpointing, which
    must not bypass the cache."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", block_size=32, attn_impl=impl, gradient_checkpointing=checkpointing))
    model.train(checkpointing)
    idx = torch.randint(0, 50257, (2, 9))
    with torch.no_grad():
        full = model(idx)
        cache = KVCache(model.config, 2, 9, "cpu", torch.float32)
        parts = [model(idx[:, :5], cache=cache, start=0), model(idx[:, 5:6], cache=cache, start=5),
                 model(idx[:, 6:9], cache=cache, start=6)]
    assert (torch.cat(parts, dim=1) - full).abs().max().item() < 1e-5


def _untie_head(state):
    state["lm_head.weight"] = state["transformer.wte.weight"] + 0.1 * torch.randn_like(state["transformer.wte.weight"])


def _short_positions(state):
    state["transformer.wpe.weight"] = state["transformer.wpe.weight"][:32].contiguous()


def _narrow_mlp(state):
    state["transformer.h.0.mlp.c_fc.weight"] = state["transformer.h.0.mlp.c_fc.weight"][:, :192].contiguous()


# (config.json edit, weights edit, the file the error names, the message after "<file>: "). Each is a folder
# GPT.from_pretrained cannot read as GPT-2's math with the weights as they are; what transformers 5's
# GPT2LMHeadModel.from_pretrained does with the same folder (checked by hand against the hf_dir model) is
# in the comment: it either refuses too, or loads a model whose logits are not the ones our GPT-2 would give.
NOT_GPT2_AS_WE_READ_IT = {
    # transformers' GPT2LMHeadModel loads it as GPT-2 (no error); AutoModelForCausalLM picks Llama's class by it
    "model_type": (lambda c: c.update(model_type="llama"), None, "config.json",
                   "model_type is 'llama', expected 'gpt2'"),
    # transformers' GPT2Config.from_dict takes a null model_type as GPT-2's; ours does not guess
    "model_type null": (lambda c: c.update(model_type=None), None, "config.json", "model_type is None, expected 'gpt2'"),
    # transformers falls back to GPT2Config's n_layer=12 and starts layers 2..11 at random (logits differ by 0.5)
    "no n_layer": (lambda c: c.pop("n_layer"), None, "config.json", "config.json lacks the field 'n_layer'"),
    # transformers falls back to GPT2Config's n_embd=768, n_head=12 and refuses the 64-wide weights (size mismatch)
    "no n_head, n_embd": (lambda c: (c.pop("n_embd"), c.pop("n_head")), None, "config.json",
                          "config.json lacks the fields 'n_head', 'n_embd'"),
    # transformers builds a 192-wide MLP and refuses the 256-wide c_fc (size mismatch)
    "n_inner": (lambda c: c.update(n_inner=192), None, "config.json",
                "n_inner=192 is not 4 * n_embd; only GPT-2's MLP width is supported"),
    # transformers loads both and honours them: logits differ by 0.018 and 0.002 from GPT-2's math
    "scale_attn_weights": (lambda c: c.update(scale_attn_weights=False), None, "config.json",
                           "scale_attn_weights=False is not supported (GPT-2 uses True)"),
    "scale_attn_by_inverse_layer_idx": (lambda c: c.update(scale_attn_by_inverse_layer_idx=True), None, "config.json",
                                        "scale_attn_by_inverse_layer_idx=True is not supported (GPT-2 uses False)"),
    # transformers loads both (cross-attention layers at random init, unused without encoder states)
    "reorder_and_upcast_attn": (lambda c: c.update(reorder_and_upcast_attn=True), None, "config.json",
                                "reorder_and_upcast_attn=True is not supported (GPT-2 uses False)"),
    "add_cross_attention": (lambda c: c.update(add_cross_attention=True), None, "config.json",
                            "add_cross_attention=True is not supported (GPT-2 uses False)"),
    # transformers 5 loads the file's lm_head.weight as a separate head (logits differ by 3.8 from the tied one)
    "untied lm_head": (None, _untie_head, "model.safetensors",
                       "lm_head.weight differs from transformer.wte.weight (GPT-2 ties them)"),
    # transformers refuses: size mismatch for transformer.wpe.weight
    "shape": (None, _short_positions, "model.safetensors",
              "transformer.wpe.weight has shape (32, 64), expected (64, 64)"),
    # a Conv1D weight is named in the file's (in, out) layout, as transformers' size-mismatch error names it
    "Conv1D shape": (None, _narrow_mlp, "model.safetensors",
                     "transformer.h.0.mlp.c_fc.weight has shape (64, 192), expected (64, 256)"),
}


@pytest.mark.parametrize("case", list(NOT_GPT2_AS_WE_READ_IT))
def test_a_folder_that_is_not_gpt2_as_we_read_it_is_refused_naming_the_field_and_the_file(hf_dir, tmp_path, case):
    """One refusal per way a Hugging Face folder can differ from GPT-2's math (another model type, a
    missing size, another MLP width or attention scaling, an untied head, a tensor of another shape): a
    CheckpointFormatError naming the file and the field, never a model that runs with other logits."""
    d, _ = hf_dir
    edit_config, edit_weights, culprit, message = NOT_GPT2_AS_WE_READ_IT[case]
    config = json.loads((d / "config.json").read_text())
    if edit_config:
        edit_config(config)
    (tmp_path / "config.json").write_text(json.dumps(config))
    state = load_file(str(d / "model.safetensors"))
    if edit_weights:
        torch.manual_seed(0)
        edit_weights(state)
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointFormatError) as info:
        GPT.from_pretrained(tmp_path)
    assert str(info.value) == f"{tmp_path / culprit}: {message}"


def test_gpt2s_own_variants_of_those_settings_still_load(hf_dir, tmp_path):
    """The refusals above are not blanket ones: n_inner written out as 4 * n_embd and an lm_head.weight
    saved equal to the embedding (both GPT-2, and what transformers loads to the same logits) load, and
    give the hf_dir model's logits. So do a config.json without tie_word_embeddings (GPT-2's own on the Hub
    has none; transformers' GPT2Config defaults it to True: the head is tied, as transformers reads that
    folder) and transformers' GPT2Model folder (no head, keys without "transformer.")."""
    d, hf = hf_dir
    config = json.loads((d / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "n_inner": 4 * 64}))
    state = load_file(str(d / "model.safetensors"))
    save_file({**state, "lm_head.weight": state["transformer.wte.weight"].clone()}, str(tmp_path / "model.safetensors"),
              metadata={"format": "pt"})
    idx = torch.randint(0, 50257, (1, 12))
    with torch.no_grad():
        assert (GPT.from_pretrained(tmp_path)(idx) - hf(idx).logits).abs().max().item() < 1e-4
    untold = tmp_path / "no tie_word_embeddings"
    untold.mkdir()
    del config["tie_word_embeddings"]
    (untold / "config.json").write_text(json.dumps(config))
    save_file(state, str(untold / "model.safetensors"), metadata={"format": "pt"})
    hf.transformer.save_pretrained(tmp_path / "GPT2Model")
    theirs = transformers.GPT2LMHeadModel.from_pretrained(untold).eval()
    with torch.no_grad():
        assert (GPT.from_pretrained(untold)(idx) - theirs(idx).logits).abs().max().item() < 1e-4
        assert (GPT.from_pretrained(tmp_path / "GPT2Model")(idx) - hf(idx).logits).abs().max().item() < 1e-4


def test_missing_or_unreadable_config_and_weights_are_named(hf_dir, tmp_path):
    """Without config.json, with one that is not UTF-8, or with files the OS will not read (procfs files,
    unreadable even for root: /proc/self/mem reads EIO at offset 0, /proc/self/environ cannot be mapped):
    a CheckpointFormatError naming the file and the cause, not a traceback from json or safetensors.
    transformers refuses the first two too (no config: GPT2Config's 768-wide default mismatches the
    weights; bad bytes: "is not a valid JSON file")."""
    import os
    import re

    from rookworld_lib.core.model import read_config_json

    d, _ = hf_dir
    weights, config = tmp_path / "model.safetensors", tmp_path / "config.json"
    weights.write_bytes((d / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointFormatError, match=re.escape(f"{config} not found: a Hugging Face GPT-2 directory "
                                                              "needs config.json and model.safetensors")):
        GPT.from_pretrained(tmp_path)
    # read_config_json (SFT's init_from reads it without a check before) names the missing file alike
    with pytest.raises(CheckpointFormatError, match=re.escape(f"{config} not found")):
        read_config_json(config)
    config.write_bytes(b"\xff" + (d / "config.json").read_bytes())
    with pytest.raises(CheckpointFormatError, match=re.escape(f"{config}: cannot read ('utf-8' codec can't decode "
                                                              "byte 0xff in position 0: invalid start byte)")):
        GPT.from_pretrained(tmp_path)
    if not os.path.exists("/proc/self/mem"):
        pytest.skip("procfs: Linux only")
    config.unlink()
    config.symlink_to("/proc/self/mem")
    with pytest.raises(CheckpointFormatError, match=re.escape(f"{config}: cannot read ([Errno 5] Input/output error)")):
        GPT.from_pretrained(tmp_path)
    config.unlink()
    config.write_text((d / "config.json").read_text())
    weights.unlink()
    weights.symlink_to("/proc/self/environ")
    with pytest.raises(CheckpointFormatError, match=re.escape(f"{weights}: cannot read (No such device")):
        GPT.from_pretrained(tmp_path)


STATIC_DECODE_NEEDS_BOTH = r"^a tensor `start` \(static-shape decode\) needs explicit position_ids and attn_mask$"


@pytest.mark.parametrize("call, match", [
    pytest.param(lambda m: GPTConfig.preset("gpt5"), r"^unknown model preset 'gpt5'; choose one of \['cpu-medium', ",
                 id="preset"),
    pytest.param(lambda m: KVCache(m.config, 1, m.config.block_size + 1, "cpu", torch.float32),
                 r"^KV cache length 33 exceeds the model's block_size 32$", id="cache-too-long"),
    pytest.param(lambda m: m(torch.zeros(1, 33, dtype=torch.long)), r"^sequence of length 33 exceeds block_size 32$",
                 id="sequence-too-long"),
    pytest.param(lambda m: m(torch.zeros(1, 3, dtype=torch.long), start=30), r"^sequence of length 33 exceeds block_size 32$",
                 id="continuation-too-long"),
    pytest.param(lambda m: m(torch.zeros(1, 1, dtype=torch.long), start=torch.tensor(3)),
                 STATIC_DECODE_NEEDS_BOTH, id="tensor-start"),
    pytest.param(lambda m: m(torch.zeros(1, 1, dtype=torch.long), position_ids=torch.tensor([[3]]),
                             cache=KVCache(m.config, 1, 8, "cpu", torch.float32), start=torch.tensor([3])),
                 STATIC_DECODE_NEEDS_BOTH, id="tensor-start-without-mask"),
    pytest.param(lambda m: m(torch.zeros(1, 1, dtype=torch.long), attn_mask=torch.ones(1, 1, 1, 8, dtype=torch.bool),
                             cache=KVCache(m.config, 1, 8, "cpu", torch.float32), start=torch.tensor([3])),
                 STATIC_DECODE_NEEDS_BOTH, id="tensor-start-without-positions"),
    pytest.param(lambda m: config_from_dict({"n_layer": 2, "n_layers": 2}), r"^unknown GPTConfig field\(s\): n_layers$",
                 id="config-field"),
])
def test_bad_model_arguments_name_what_is_wrong(call, match):
    """What a notebook user can get wrong calling the model directly: a preset name, a cache or a sequence
    longer than the context (the last position a model has a learned embedding for), a static-decode start
    without its positions or without its mask (it attends over the whole cache: unwritten slots need the mask), a
    misspelt config field. The longest sequence that fits runs."""
    torch.manual_seed(0)
    m = GPT(GPTConfig.preset("tiny", n_layer=1, n_embd=16, n_head=2, block_size=32)).eval()
    with pytest.raises(ValueError, match=match):
        call(m)
    with torch.no_grad():
        assert m(torch.zeros(1, 32, dtype=torch.long)).shape == (1, 32, m.config.vocab_size)


def test_a_bias_free_model_is_not_exported_as_gpt2(tmp_path):
    """GPT-2's format has a bias in every layer: a GPTConfig(bias=False) model's export lacked them, and
    from_pretrained (and so GRPO and eval) refused it. save_pretrained says so instead, writing nothing."""
    with pytest.raises(ValueError, match=r"^GPTConfig.bias is False: GPT-2's format \(the export\) holds a bias"):
        GPT(GPTConfig.preset("tiny", bias=False)).save_pretrained(tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_token_ids_that_are_no_2d_integer_tensor_and_a_directory_that_is_no_path_are_named():
    """model(idx) took a 1-D tensor to "not enough values to unpack", a float one to torch's "Expected tensor
    for argument #1 'indices'", a list to "'list' object has no attribute 'shape'"; from_pretrained(None)
    to a TypeError from pathlib."""
    model = GPT(GPTConfig.preset("tiny", block_size=8))
    for idx, got in ((torch.tensor([1, 2]), r"a 1-D torch.int64 tensor \(one sequence: idx\[None\]\)"),
                     (torch.tensor([[1.0, 2.0]]), "a 2-D torch.float32 tensor"), ([[1, 2]], "a list"),
                     (torch.tensor([[True]]), "a 2-D torch.bool tensor")):
        with pytest.raises(ValueError, match=rf"^GPT: idx must be a 2-D \(batch, time\) tensor of token ids \(torch.long\), got {got}$"):
            model(idx)
    assert model(torch.tensor([[1, 2]], dtype=torch.int32)).shape == (1, 2, 50257)  # int32 ids embed as int64 do
    for directory in (None, "", 3):
        with pytest.raises(ValueError, match=r"^GPT.from_pretrained: directory must name a Hugging Face GPT-2 folder"):
            GPT.from_pretrained(directory)


def test_gpt_refuses_a_config_that_is_not_a_gptconfig():
    """GPT({}) built the 124M model ({} is falsy); GPT({"n_layer": 2}) failed with an AttributeError."""
    for bad in ({}, {"n_layer": 2}, "tiny"):
        with pytest.raises(TypeError, match=r"GPT\(config\): give a GPTConfig"):
            GPT(bad)
