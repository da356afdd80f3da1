"""The board-reading measures of the benchmarks that docs/grpo.md (section 4) quotes: policy_anatomy's
reasons for an illegal move and grpo_ablation's own-piece reward, checked on positions whose answer
python-chess and the rules of chess settle by hand; sft_completion_loss's targets, checked against the
records' own completions; and paired_interval_null's exact McNemar p (section 3)."""

import importlib.util
import json
from fractions import Fraction
from math import comb

import chess
import pytest

from rookworld_lib.chess import data
from rookworld_lib.core.paths import DATA_DIR, REPO_ROOT
from rookworld_lib.core.tokenizer import EOT_ID, get_tokenizer
from rookworld_lib.core.train_sft import PackedStream


def benchmark(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def why_illegal():
    return benchmark("policy_anatomy").why_illegal


START = chess.STARTING_FEN
CASES = [
    (START, "e2e4", None), (START, "g1f3", None),
    (START, "e2e2", "not a move"), (START, "e9e4", "not a move"), (START, "Nf3", "not a move"),
    (START, "e3e4", "no own piece on the from-square"),  # an empty square
    (START, "e7e5", "no own piece on the from-square"),  # black's pawn, white to move
    (START, "e2e5", "not how that piece moves"), (START, "b1b3", "not how that piece moves"),
    (START, "f1c4", "blocked or forbidden in this position"),  # the bishop's diagonal, e2 in the way
    (START, "e2d3", "blocked or forbidden in this position"),  # a pawn capture with nothing to take
    (START, "e1g1", "blocked or forbidden in this position"),  # castling through its own knight and bishop
    ("r3k2r/8/8/8/8/8/8/R3K2R w - - 0 1", "e1g1", "blocked or forbidden in this position"),  # no castling right
    ("4k3/8/8/8/8/8/8/R3K2r w - - 0 1", "a1a8", "blocked or forbidden in this position"),  # own king left in check
    ("4k3/P7/8/8/8/8/8/4K3 w - - 0 1", "a7a8q", None),
    ("4k3/P7/8/8/8/8/8/4K3 w - - 0 1", "a7b8q", "blocked or forbidden in this position"),  # nothing to take on b8
]


@pytest.mark.parametrize("fen, move, why", CASES)
def test_why_a_move_is_illegal(why_illegal, fen, move, why):
    board = chess.Board(fen)
    assert (move in {m.uci() for m in board.legal_moves}) == (why is None)  # python-chess agrees on legality
    assert why_illegal(board, move) == why


def test_the_own_piece_reward_reads_the_from_squares_of_every_listed_move():
    ablation = benchmark("grpo_ablation")
    start = "P: " + START
    # e2e4, d2d4, g1f3: white's pieces; e7e5: black's; e3e4: an empty square
    answer = " M: e2e4 e7e5 d2d4 e3e4 g1f3 E: 0.3 0.2 0.1 0.0 0.0 B: e2e4"
    assert ablation.own_piece_share(start, answer) == pytest.approx(3 / 5)
    assert ablation.own_piece_share("P: " + chess.Board("4k3/8/8/8/8/8/8/4K2r b - - 0 1").fen(), " M: h1h8 e1e2") == 0.5
    assert ablation.own_piece_share(start, " M: d2d4 d2d4 d2d4 E: 0.0 B: d2d4") == 1.0  # malformed, read leniently
    assert ablation.own_piece_share(start, " no field at all") == 0.0
    assert ablation.moves_own_piece(prompts=[start, "A: " + START + "+e2e4+"], completions=[answer, "x"]) == [0.6, None]
    assert ablation.moves_own_piece.__name__ == "P/moves_own_piece"


def test_the_answer_only_stream_keeps_each_answer_and_its_eot_as_targets_and_every_token_as_input(tmp_path):
    """sft_completion_loss's stream: its inputs are the plain stream's token for token, and the targets it
    keeps are, in stream order, each record's `completion` field followed by the EOT that ends it."""
    bench = benchmark("sft_completion_loss")
    recs = (data.load_jsonl(DATA_DIR / "policy_train.jsonl")[:12] + data.load_jsonl(DATA_DIR / "env_train.jsonl")[:12])
    texts = [r["prompt"] + r["completion"] for r in recs]
    paths = [tmp_path / "train.jsonl"]  # these records only: the spans are read from a data file, as the script reads them
    paths[0].write_text("".join(json.dumps(r) + "\n" for r in recs))
    mix = {"P": 0.5, "A": 0.5}
    answer_only = bench.AnswerOnlyStream(texts, seed=3, task_weights=mix, spans=bench.spans(paths))
    plain = PackedStream(texts, seed=3, task_weights=mix)
    n = 1500  # several samples from each pool, fewer tokens than one epoch's
    (x, y), (px, py) = answer_only.next_batch(1, n), plain.next_batch(1, n)
    assert x.equal(px) and (y[y >= 0] == py[y >= 0]).all() and 0.3 < (y >= 0).float().mean() < 0.7
    enc, kept = get_tokenizer(), y[0].tolist()
    # cut the kept targets at each EOT: each piece is one record's answer, in the order the stream drew them
    pieces, current = [], []
    for token in kept:
        if token == EOT_ID:
            pieces.append(enc.decode(current))
            current = []
        elif token >= 0:
            current.append(token)
    by_prompt = {r["prompt"] + r["completion"]: r["completion"] for r in recs}
    drawn = enc.decode(px[0].tolist()).split("<|endoftext|>")[1:-1]  # the whole samples the batch holds
    assert len(drawn) >= 8 and pieces[:len(drawn)] == [by_prompt[t] for t in drawn]
    assert answer_only.token_ids().max() < 2 ** 16 and answer_only.token_ids().tolist() == plain.token_ids().tolist()
    # --tasks P: the P: prompts alone are inputs only; an A: sample is a target whole, as in the plain stream
    x, y = bench.AnswerOnlyStream(texts, seed=3, task_weights=mix, spans=bench.spans(paths), tasks=("P",)).next_batch(1, n)
    ends = [i for i, t in enumerate(px[0].tolist()) if t == EOT_ID]
    for start, end in zip(ends, ends[1:]):  # each whole sample: x[start] is its EOT; y[start:end], its tokens and the next EOT
        sample = enc.decode(px[0][start + 1:end].tolist())
        kept = y[0][start:end]
        if sample.startswith("A: "):
            assert kept.equal(py[0][start:end]), sample[:40]
        else:
            assert enc.decode(kept[kept >= 0].tolist()) == by_prompt[sample] + "<|endoftext|>", sample[:40]
    assert {enc.decode(px[0][s + 1:s + 3].tolist()) for s in ends} >= {"P:", "A:"}  # both tasks were checked
    # --part history: an A: sample's targets are all its tokens but those of its history, which are its record's
    x, y = bench.AnswerOnlyStream(texts, seed=3, task_weights=mix, spans=bench.spans(paths, "history")).next_batch(1, n)
    histories = {r["prompt"] + r["completion"]: " ".join(r["history"]) for r in recs if r["task"] == "A"}
    for start, end in zip(ends, ends[1:]):
        sample, kept = enc.decode(px[0][start + 1:end].tolist()), y[0][start:end]
        dropped = px[0][start + 1:end + 1][kept < 0].tolist()
        assert enc.decode(dropped) == histories.get(sample, ""), sample[:40]
        assert (kept[kept >= 0] == py[0][start:end][kept >= 0]).all()
    assert any(histories.get(enc.decode(px[0][s + 1:e].tolist())) for s, e in zip(ends, ends[1:]))


def test_mcnemar_exact_p_is_the_two_sided_binomial_test():
    """paired_interval_null's exact McNemar p (docs/grpo.md, section 3, quotes p = 0.125 for 4 records lost
    and none gained) against the definition: the probability, under Binomial(lost + gained, 1/2), of every
    outcome no likelier than the one seen (the two-sided exact binomial test)."""
    p = benchmark("paired_interval_null").mcnemar_exact_p

    def by_definition(lost, gained):
        m = lost + gained
        pmf = [Fraction(comb(m, i), 2 ** m) for i in range(m + 1)]
        return float(sum(q for q in pmf if q <= pmf[gained]))

    assert p(4, 0) == 0.125 and p(0, 0) == 1.0
    for lost, gained in [(4, 0), (0, 4), (5, 1), (3, 3), (10, 2), (7, 8), (30, 12), (1, 0)]:
        assert p(lost, gained) == pytest.approx(min(1.0, by_definition(lost, gained)), rel=1e-12), (lost, gained)
