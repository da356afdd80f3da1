import hashlib
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
