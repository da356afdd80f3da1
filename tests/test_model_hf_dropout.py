"""model (Hugging Face format): transformers' three GPT-2 dropout rates (resid_pdrop, embd_pdrop, attn_pdrop), each
read into its own GPTConfig field, applied where transformers applies it, and written back."""

import json

import pytest
import torch

from rookworld_lib.core.model import GPT, CheckpointFormatError, GPTConfig

TINY = dict(n_layer=1, n_head=2, n_embd=32, block_size=32)


def _with_rates(tmp_path, **rates):
    GPT(GPTConfig.preset("tiny", **TINY)).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(rates)
    for key in [k for k, v in rates.items() if v is None]:
        del cfg[key]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def _applied(model: GPT) -> dict:
    """The rates the modules use: embeddings, attention weights, residual and MLP outputs."""
    block = model.transformer.h[0]
    return {"embd": model.transformer.drop.p, "attn": model.config.attn_pdrop,
            "resid": block.attn.resid_dropout.p, "mlp": block.mlp.dropout.p}


def test_each_rate_is_read_into_its_own_field_and_written_back(tmp_path):
    _with_rates(tmp_path, resid_pdrop=0.1, embd_pdrop=0.2, attn_pdrop=0.3)
    model = GPT.from_pretrained(tmp_path)
    assert _applied(model) == {"embd": 0.2, "attn": 0.3, "resid": 0.1, "mlp": 0.1}
    out = tmp_path / "again"
    model.save_pretrained(out)
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["resid_pdrop"], cfg["embd_pdrop"], cfg["attn_pdrop"]) == (0.1, 0.2, 0.3)


def test_rates_match_transformers_modules(tmp_path):
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=32,
                                                              resid_pdrop=0.15, embd_pdrop=0.05, attn_pdrop=0.25))
    hf.save_pretrained(tmp_path)
    ours = _applied(GPT.from_pretrained(tmp_path))
    theirs = {"embd": hf.transformer.drop.p, "attn": hf.transformer.h[0].attn.attn_dropout.p,
              "resid": hf.transformer.h[0].attn.resid_dropout.p, "mlp": hf.transformer.h[0].mlp.dropout.p}
    assert ours == pytest.approx(theirs)


def test_absent_rates_default_to_transformers_0_1(tmp_path):
    _with_rates(tmp_path, resid_pdrop=None, embd_pdrop=None, attn_pdrop=None)
    assert set(_applied(GPT.from_pretrained(tmp_path)).values()) == {0.1}


def test_dropout_override_sets_every_rate_unless_they_are_given(tmp_path):
    _with_rates(tmp_path, resid_pdrop=0.1, embd_pdrop=0.0, attn_pdrop=0.3)
    assert set(_applied(GPT.from_pretrained(tmp_path, dropout=0.05)).values()) == {0.05}
    assert _applied(GPT.from_pretrained(tmp_path, dropout=0.0, attn_dropout=0.2))["attn"] == 0.2


@pytest.mark.parametrize("impl", ["sdpa", "math"])
def test_attention_dropout_acts_in_training_only(tmp_path, impl):
    """attn_pdrop drops attention weights in train mode and never in eval mode, on both attention paths
    (residual dropout off, so only the attention weights can differ), as transformers' attn_dropout does."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", **TINY, dropout=0.0, attn_dropout=0.5, attn_impl=impl))
    idx = torch.randint(0, 50257, (2, 16))
    model.eval()
    assert torch.equal(model(idx), model(idx))
    model.train()
    assert not torch.equal(model(idx), model(idx))


def test_bad_rate_names_the_field(tmp_path):
    """A rate in config.json that is text, a boolean or 1 (a dropout rate lies in [0, 1)) is refused under the key
    the file spells, not loaded (False as 0.0) nor reported under our GPTConfig field's name."""
    for key, value in (("attn_pdrop", "0.1"), ("attn_pdrop", 1.0), ("resid_pdrop", False)):
        folder = _with_rates(tmp_path / f"{key}-{value}", **{key: value})
        with pytest.raises(CheckpointFormatError) as info:
            GPT.from_pretrained(folder)
        assert str(info.value) == f"{folder / 'config.json'}: {key}={value!r} is not a dropout rate in [0, 1)"
    with pytest.raises(ValueError, match="GPTConfig.embd_dropout"):
        GPTConfig(embd_dropout=1.5)
