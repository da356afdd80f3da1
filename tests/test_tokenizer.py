import hashlib
import json
import random
import shutil

import chess
import pytest

from rookworld_lib.core import tokenizer as tok


def test_vocab_and_eot():
    enc = tok.get_tokenizer()
    assert enc.n_vocab == 50257
    assert enc.eot_token == 50256
    assert tok.encode("<|endoftext|>") == [50256]


def test_start_position_policy_prompt_tokens():
    # GPT-2 BPE of the start-position policy prompt (checked against tiktoken's r50k_base ids).
    prompt = "P: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
    expected = [47, 25, 374, 46803, 80, 74, 9374, 81, 14, 381, 381, 381, 381, 14, 23, 14, 23, 14, 23, 14, 23, 14,
                10246, 10246, 10246, 10246, 14, 49, 32819, 48, 42, 15766, 49, 266, 509, 48, 74, 80, 532, 657, 352]
    assert tok.encode(prompt) == expected
    assert tok.token_boundaries("P: rnbqkbnr")[:4] == ["P", ":", " r", "nb"]
    # a character the BPE cuts into byte tokens (U+00C4 is C3 84 in UTF-8): each piece is shown, as U+FFFD
    assert tok.encode("Ä") == [127, 226] and tok.token_boundaries("Ä") == ["\ufffd", "\ufffd"]


def test_matches_transformers_gpt2_byte_level_bpe_on_known_strings():
    # Independent anchors: well-known GPT-2 ids.
    enc = tok.get_tokenizer()
    assert enc.encode("Hello world") == [15496, 995]
    assert enc.encode(" the") == [262]
    assert enc.encode("e2e4") == [68, 17, 68, 19]


def _rookworld_strings(n, seed=0):
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        board = chess.Board()
        history = []
        for _ in range(rng.randint(0, 60)):
            moves = list(board.legal_moves)
            if not moves:
                break
            move = rng.choice(moves)
            history.append(move.uci())
            board.push(move)
        fen = board.fen()
        moves = [m.uci() for m in list(board.legal_moves)[:5]]
        out.append(f"P: {fen} M: {' '.join(moves)} E: 0.31 -0.12 M2 -M1 0.0 B: {moves[0] if moves else ''}")
        out.append(f"A: {fen}+{history[-1] if history else 'e2e4'}+{' '.join(history[-10:])}+{fen}+0.001+0+0")
    return out[:n]


def test_round_trip_1000_rookworld_strings():
    enc = tok.get_tokenizer()
    strings = _rookworld_strings(1000)
    assert len(strings) == 1000
    for s in strings:
        assert enc.decode(tok.encode(s)) == s
        assert enc.decode(tok.encode(s + "<|endoftext|>")) == s + "<|endoftext|>"


def test_shipped_file_hash():
    data = tok.default_ranks_path().read_bytes()
    assert hashlib.sha256(data).hexdigest() == tok.RANKS_SHA256


def test_corrupt_file_rejected_with_clear_message(tmp_path):
    bad = tmp_path / "gpt2.tiktoken"
    shutil.copy(tok.default_ranks_path(), bad)
    raw = bytearray(bad.read_bytes())
    raw[100] ^= 0x01
    bad.write_bytes(bytes(raw))
    with pytest.raises(tok.TokenizerFileError, match="corrupt.*sha256.*Restore it"):
        tok.get_tokenizer(bad)


def test_missing_file_rejected_with_clear_message(tmp_path):
    with pytest.raises(tok.TokenizerFileError, match="cannot be read.*openai-whisper==20250625"):
        tok.get_tokenizer(tmp_path / "nope.tiktoken")


def test_a_texts_task_is_its_tag_and_the_space_after_it():
    from rookworld_lib.core.tokenizer import task_of

    assert task_of("S: 3+4 = 7", ["S", "R"]) == "S" and task_of("R: abc = cba", ["S", "R"]) == "R"
    for text in ("Sum: 3+4", "S:3+4", "S 3+4", " S: 3+4", "", None):  # a word that starts like a tag is no tag
        assert task_of(text, ["S", "R"]) is None, text


def _tiny_export(directory):
    from rookworld_lib.core.model import GPT, GPTConfig

    GPT(GPTConfig.preset("tiny", n_layer=1, n_embd=16, n_head=2, block_size=16)).save_pretrained(directory)


def test_a_model_folder_without_tokenizer_files_passes_the_vocabulary_check(tmp_path):
    """A GPT-2 folder with weights and config only (a hub copy without its tokenizer, an export made
    where transformers is not installed) is read with our GPT-2 tokenizer: no error. A lone vocab.json
    is no tokenizer either (the slow tokenizer needs merges.txt beside it), even one that is not GPT-2's."""
    from rookworld_lib.core.model import GPT

    _tiny_export(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).unlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    model = GPT.from_pretrained(tmp_path)
    assert tok.check_vocabulary(model) is None
    (tmp_path / "vocab.json").write_text('{"a": 0, "b": 1}')
    assert tok.check_vocabulary(model) is None


def test_a_corrupt_tokenizer_json_is_named_as_unreadable(tmp_path):
    """A model folder whose tokenizer.json is cut short: eval and GRPO (check_vocabulary) refuse it naming
    the file and the parser's reason, as transformers' AutoTokenizer cannot load that folder either."""
    import re

    transformers = pytest.importorskip("transformers")
    from rookworld_lib.core.model import GPT

    _tiny_export(tmp_path)
    path = tmp_path / "tokenizer.json"
    path.write_bytes(path.read_bytes()[:27])  # '{"version": "1.0", ...' cut inside its first value
    with pytest.raises(Exception):  # noqa: B017 (the reference: transformers refuses the same folder)
        transformers.AutoTokenizer.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match=re.escape(f"{path}: unreadable (Exception: EOF while parsing")) as info:
        tok.check_vocabulary(GPT.from_pretrained(tmp_path))
    assert str(info.value).endswith("; a GPT-2 model folder needs GPT-2's tokenizer or none"), str(info.value)


class _RaisingConverter:
    """A TikTokenConverter that cannot convert (as transformers' does without what it needs)."""

    def __init__(self, vocab_file=None, pattern=None, **special):
        raise ValueError("`tiktoken` is required to read a `tiktoken` file")


class _OtherConverter:
    """A TikTokenConverter whose tokenizer encodes otherwise than GPT-2 (a two-word vocabulary)."""

    def __init__(self, vocab_file=None, pattern=None, **special):
        pass

    def converted(self):
        from tokenizers import Tokenizer, models

        return Tokenizer(models.WordLevel({"<|endoftext|>": 0, "Q": 1}, unk_token="Q"))


@pytest.mark.parametrize("converter,cause", [(_RaisingConverter, "`tiktoken` is required to read a `tiktoken` file"),
                                             (_OtherConverter, "it encodes otherwise than tiktoken")])
def test_a_failed_tokenizer_conversion_warns_and_exports_without_tokenizer_files(tmp_path, monkeypatch, caplog,
                                                                                converter, cause):
    """Where transformers' TikTokenConverter fails, or gives a tokenizer that encodes a probe text
    otherwise than tiktoken, an export still succeeds: weights and config only, one warning saying why,
    and nothing cached (the next export tries again)."""
    import importlib
    import logging

    pytest.importorskip("transformers")
    # the module hf_tokenizer_json imports it from (`transformers.convert_slow_tokenizer` is also a function)
    convert_slow_tokenizer = importlib.import_module("transformers.convert_slow_tokenizer")
    from rookworld_lib.core.model import GPT

    tok.get_tokenizer()  # built (and lru-cached) before anything is patched
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no tokenizer.json cached by an earlier run
    monkeypatch.setattr(convert_slow_tokenizer, "TikTokenConverter", converter)
    with caplog.at_level(logging.WARNING, logger="rookworld_lib.core.tokenizer"):
        assert tok.hf_tokenizer_json() is None
        _tiny_export(tmp_path / "m")
    warned = [r.getMessage() for r in caplog.records if r.name == "rookworld_lib.core.tokenizer"]
    assert warned == [f"no tokenizer files in exports: transformers' TikTokenConverter failed ({cause})"] * 2, warned
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    assert not (tmp_path / "cache").exists()
    assert GPT.from_pretrained(tmp_path / "m").config.n_embd == 16


def test_without_transformers_and_nothing_cached_an_export_has_no_tokenizer_files(tmp_path, monkeypatch, caplog):
    """Where transformers is not installed (an optional dependency) and no tokenizer.json was cached by an
    earlier export, hf_tokenizer_json() is None, quietly (nothing failed: nothing to warn about), and an
    export holds the weights and config only; nothing is cached."""
    import logging
    import sys

    from rookworld_lib.core.model import GPT

    tok.get_tokenizer()  # built (and lru-cached) before anything is patched
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setitem(sys.modules, "transformers.convert_slow_tokenizer", None)  # `import` raises ImportError
    with caplog.at_level(logging.WARNING, logger="rookworld_lib.core.tokenizer"):
        assert tok.hf_tokenizer_json() is None
        _tiny_export(tmp_path / "m")
    assert [r.getMessage() for r in caplog.records if r.name == "rookworld_lib.core.tokenizer"] == []
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["config.json", "model.safetensors"]
    assert not (tmp_path / "cache").exists()
    assert GPT.from_pretrained(tmp_path / "m").config.n_embd == 16


def test_an_unwritable_cache_still_gives_the_tokenizer_and_exports_it(tmp_path, monkeypatch):
    """A cache folder that cannot be made (here $XDG_CACHE_HOME is a file, as an unwritable home is) is no
    error: the converted tokenizer.json is returned (and built again next time), and it encodes as
    tiktoken does, checked with the `tokenizers` library itself."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    tok.get_tokenizer()
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache folder would go\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken"))  # where tiktoken's loader copies a rank file
    text = tok.hf_tokenizer_json()
    assert text is not None and blocker.read_text() == "a file where the cache folder would go\n"
    assert not (tmp_path / "tiktoken").exists()  # the converter took our checked ranks, not tiktoken's loader
    sample = "P: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1 M: e2e4 d2d4 B: e2e4"
    assert Tokenizer.from_str(text).encode(sample).ids == tok.get_tokenizer().encode(sample)
    (tmp_path / "m").mkdir()
    assert tok.write_hf_tokenizer(tmp_path / "m", 64) is True and (tmp_path / "m" / "tokenizer.json").read_text() == text


def test_a_tokenizer_json_with_two_single_character_tokens_swapped_is_refused(tmp_path):
    """GPT-2's own tokenizer.json with the ids of "P" and "M" swapped: it passed (the probe held neither
    letter alone), and eval scored the model with prompts it reads as other tokens."""
    pytest.importorskip("tokenizers")
    spec = json.loads(tok.hf_tokenizer_json())
    vocab = spec["model"]["vocab"]
    vocab["P"], vocab["M"] = vocab["M"], vocab["P"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    with pytest.raises(ValueError, match=r"tokenizer.json: not GPT-2's tokenizer \(it encodes '\w\\n\w' as \[\d+"):
        tok.check_model_tokenizer(tmp_path)
    # the same swap in our export's own text: the file is as long as GPT-2's (which passes without a parse)
    ours = tok.hf_tokenizer_json()
    swapped = ours.replace('"M":44,', '"M":@@,', 1).replace('"P":47,', '"P":44,', 1).replace('"M":@@,', '"M":47,', 1)
    assert swapped != ours and len(swapped) == len(ours)
    (tmp_path / "tokenizer.json").write_text(swapped)
    with pytest.raises(ValueError, match=r"tokenizer.json: not GPT-2's tokenizer"):
        tok.check_model_tokenizer(tmp_path)
    (tmp_path / "tokenizer.json").write_text(ours)  # GPT-2's own passes
    assert tok.check_model_tokenizer(tmp_path) is None


def test_a_model_folder_is_not_checked_where_the_tokenizers_library_is_missing(tmp_path, monkeypatch):
    """check_model_tokenizer reads a folder's tokenizer.json with `tokenizers` (it comes with transformers):
    a foreign tokenizer (a two-word vocabulary) is refused where that library is installed, and passes
    unchecked where it is not, as the docstring promises, rather than failing on the import."""
    import sys

    tokenizers = pytest.importorskip("tokenizers")
    foreign = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<|endoftext|>": 0, "Q": 1}, unk_token="Q"))
    foreign.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(ValueError, match="tokenizer.json: not GPT-2's tokenizer"):
        tok.check_model_tokenizer(tmp_path)
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    assert tok.check_model_tokenizer(tmp_path) is None


def test_the_rank_file_is_the_repositorys_whatever_data_set_rookworld_data_dir_names(tmp_path):
    """ROOKWORLD_DATA_DIR points at a data set (datagen's or convert's output, which never holds the
    tokenizer): the tokenizer still loads, from the repository's data/ (it failed, saying to restore an
    intact data/gpt2.tiktoken)."""
    import os
    import subprocess
    import sys

    code = ("from rookworld_lib.core import tokenizer as t, paths as p; "
            "print(p.DATA_DIR, t.default_ranks_path(), t.get_tokenizer().encode('P: e2e4'))")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ROOKWORLD_DATA_DIR": str(tmp_path)},
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == str(tmp_path.resolve()) and out[1] == str(tok.REPO_ROOT / "data" / "gpt2.tiktoken")
    assert " ".join(out[2:]) == str(tok.get_tokenizer().encode("P: e2e4"))
