"""checkpoint_hf: transformers' three GPT-2 dropout rates (resid_pdrop, embd_pdrop, attn_pdrop)."""

import json
import warnings

import pytest

from rookworld_lib.checkpoint_hf import CheckpointFormatError
from rookworld_lib.model import GPT, GPTConfig

TINY = dict(n_layer=1, n_head=2, n_embd=32, block_size=32)


def _with_rates(tmp_path, **rates):
    GPT(GPTConfig.preset("tiny", **TINY)).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(rates)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_equal_rates_round_trip_without_warning(tmp_path):
    GPT(GPTConfig.preset("tiny", dropout=0.1, **TINY)).save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["resid_pdrop"] == cfg["embd_pdrop"] == cfg["attn_pdrop"] == 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert GPT.from_pretrained(tmp_path).config.dropout == 0.1


def test_each_rate_is_read_not_only_resid_pdrop(tmp_path):
    for key in ("embd_pdrop", "attn_pdrop", "resid_pdrop"):
        rates = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, key: 0.2}
        _with_rates(tmp_path, **rates)
        with pytest.warns(UserWarning, match=r"resid_pdrop=.*embd_pdrop=.*attn_pdrop=.* differ.*using the largest, 0.2"):
            assert GPT.from_pretrained(tmp_path).config.dropout == 0.2


def test_explicit_dropout_override_wins_silently(tmp_path):
    _with_rates(tmp_path, resid_pdrop=0.1, embd_pdrop=0.0, attn_pdrop=0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert GPT.from_pretrained(tmp_path, dropout=0.05).config.dropout == 0.05


def test_transformers_config_rates_are_honoured(tmp_path):
    transformers = pytest.importorskip("transformers")
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=32, n_positions=32,
                                                              resid_pdrop=0.15, embd_pdrop=0.15, attn_pdrop=0.15))
    hf.save_pretrained(tmp_path)
    assert GPT.from_pretrained(tmp_path).config.dropout == 0.15


def test_bad_rate_names_the_field(tmp_path):
    _with_rates(tmp_path, attn_pdrop="0.1")
    with pytest.raises(CheckpointFormatError, match="attn_pdrop='0.1' is not a dropout rate"):
        GPT.from_pretrained(tmp_path)
