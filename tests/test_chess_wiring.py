"""What the chess layer's commands and data checks hand on, checked against the data card
(data/README.md), the commands' own help, python-chess and Stockfish: the split a plain `rookworld
sft` measures its val loss on, the reward `rookworld grpo --reward` trains on, the label the gated
reward reads, the record checks, the shard reader, and what the engine pool sends Stockfish."""

import gzip
import json
import shutil

import chess
import chess.engine
import pytest
import torch
from helpers_chess import needs_stockfish, shipped

from rookworld_lib.chess import data, reward_examples, training
from rookworld_lib.chess.engine import EnginePool, EngineSettings, limit_key
from rookworld_lib.core.model import GPT, GPTConfig
from rookworld_lib.core.paths import DATA_DIR, DataFormatError
from rookworld_lib.core.task_vocab import TaskVocab
from rookworld_lib.core.tokenizer import EOT_ID, get_tokenizer


def test_a_plain_sft_trains_on_the_train_split_and_measures_on_the_val_split_never_test():
    cfg, _ = training._sft_config_from_args(training.build_sft_parser().parse_args(["--out", "x"]))
    assert tuple(cfg.val_data) == (str(DATA_DIR / "policy_val.jsonl"), str(DATA_DIR / "env_val.jsonl"))
    assert tuple(cfg.train_data) == (str(DATA_DIR / "policy_train.jsonl"), str(DATA_DIR / "env_train.jsonl"))
    for held_out in ("policy_val.jsonl", "env_test.jsonl"):  # records that say they are val or test
        with pytest.raises(DataFormatError):
            training.check_train_split([DATA_DIR / held_out])


def test_a_held_out_record_anywhere_in_a_training_file_is_refused_naming_its_line(tmp_path):
    """Not only the first record: train records with two test records after them (a concatenation) are
    refused at the first test one, file:line; the train file alone passes."""
    train = (DATA_DIR / "policy_train.jsonl").read_text().splitlines(keepends=True)[:40]
    test = (DATA_DIR / "policy_test.jsonl").read_text().splitlines(keepends=True)[:2]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(train + test))
    with pytest.raises(DataFormatError, match=rf"^{mixed}:41: a 'test' record in the training data"):
        training.check_train_split([DATA_DIR / "policy_train.jsonl", mixed])
    training.check_train_split([DATA_DIR / "policy_train.jsonl", DATA_DIR / "env_train.jsonl"])


def test_train_records_as_val_data_and_a_file_given_twice_are_refused():
    """--val-data of train records measured a 'val loss' on training samples; a --train-data file given
    twice counted its samples twice and let val_fraction hold out copies whose twins were trained on."""
    train, val = DATA_DIR / "policy_train.jsonl", DATA_DIR / "policy_val.jsonl"
    with pytest.raises(DataFormatError, match=rf"^{train}:1: a 'train' record in the val data"):
        training.check_train_split([DATA_DIR / "env_train.jsonl"], [train])
    for paths, vals in (([train, train], []), ([train], [train])):
        with pytest.raises(ValueError, match=rf"^{train} is given twice \(--train-data, --val-data\)"):
            training.check_train_split(paths, vals)
    training.check_train_split([train, DATA_DIR / "env_train.jsonl"], [val, DATA_DIR / "env_val.jsonl"])


@pytest.mark.parametrize("reward, want", [("gated", [training.chess_reward]), ("graded", None)])
def test_grpo_trains_on_the_reward_its_option_names(tmp_path, monkeypatch, reward, want):
    given = {}

    class Stop(Exception):
        pass

    def trainer(model, items, cfg, *, reward_funcs, reward_weights, **_):  # what GRPOTrainer would be handed
        given.update(funcs=reward_funcs, weights=reward_weights)
        raise Stop

    monkeypatch.setattr(training, "GRPOTrainer", trainer)
    GPT(GPTConfig.preset("tiny")).save_pretrained(tmp_path / "m")
    args = training.build_grpo_parser().parse_args(["--init-from", str(tmp_path / "m"), "--out", str(tmp_path / "o"),
                                                    "--reward", reward, "--layout", "compact"])
    with pytest.raises(Stop):
        training._run_grpo(args)
    funcs, weights = training.reward_functions(reward)
    assert [f.__name__ for f in given["funcs"]] == [f.__name__ for f in funcs] and given["weights"] == weights
    assert given["funcs"] == want if want else len(funcs) > 1  # gated: one function; graded: one per component


def test_the_gated_reward_scores_against_the_records_label_without_asking_stockfish(monkeypatch):
    monkeypatch.setenv("STOCKFISH_PATH", "/nonexistent/stockfish")  # the label is the only truth at hand
    rec = shipped("P", "test")[0]
    assert training.chess_reward([rec["prompt"]], [rec["completion"]], truth=[rec]) == [1.0]  # the label's own answer


def test_record_checks_refuse_a_negative_ply_and_a_legal_move_count_python_chess_does_not_give():
    rec = shipped("P", "test")[0]
    n = chess.Board(rec["fen"]).legal_moves.count()
    assert rec["n_legal"] == n and data.validate_record(rec) is None
    for bad in ({"ply": -1}, {"n_legal": n - 1}, {"n_legal": n + 1}):  # data/README.md: half-moves played, >= 0
        assert data.validate_record({**rec, **bad}) is not None, bad


def test_a_split_in_two_shards_keeps_every_skipped_line_and_a_split_twice_over_is_refused(tmp_path):
    lines = (DATA_DIR / "policy_train.jsonl").read_text().splitlines()[:5]
    (tmp_path / "policy_train-00000.jsonl").write_text("\n".join(lines[:3]) + "\n")
    (tmp_path / "policy_train-00001.jsonl").write_text("\n".join(lines[3:]) + "\nnot json\n")
    got = data.load_split("P", "train", tmp_path, on_error="skip")
    assert (len(got), got.n_skipped) == (5, 1)
    twice = tmp_path / "twice"
    twice.mkdir()
    shutil.copy(DATA_DIR / "policy_val.jsonl", twice / "policy_val.jsonl")  # plain and gzipped: each record twice
    with gzip.open(twice / "policy_val.jsonl.gz", "wb") as fh:
        fh.write((DATA_DIR / "policy_val.jsonl").read_bytes())
    with pytest.raises(DataFormatError):
        data.load_split("P", "val", twice)


def test_the_data_cards_side_to_move_counts_are_python_chess_s():
    summary = data.summarize()
    for name, info in summary["files"].items():
        with open(DATA_DIR / name) as fh:
            turns = [chess.Board(json.loads(line)["fen"]).turn for line in fh]
        assert (info["white_to_move"], info["black_to_move"]) == (turns.count(chess.WHITE), turns.count(chess.BLACK)), name
    card = (DATA_DIR / "README.md").read_text().splitlines()
    table = data.render_card_tables(summary)
    rows = [line for line in table.splitlines() if line.startswith("|")]
    assert rows and all(line in card for line in rows), [line for line in rows if line not in card]


def test_reward_examples_are_what_their_names_say():
    rec = next(r for r in data.load_split("P", "test").records if len(r["moves"]) == 5)
    examples = reward_examples.policy_examples(rec)
    assert examples["5th"].endswith(f"B: {rec['moves'][4]}") and examples["2nd"].endswith(f"B: {rec['moves'][1]}")
    for r in data.load_split("P", "test").records[:200]:  # "a random legal move outside them"
        if "random legal" not in (ex := reward_examples.policy_examples(r)):  # every legal move is a candidate
            continue
        move = ex["random legal"].rsplit("B: ", 1)[1]
        assert move not in r["moves"] and chess.Move.from_uci(move) in chess.Board(r["fen"]).legal_moves
    env = data.load_split("A", "test").records[0]
    fen, reward, terminated, truncated = env["completion"].split("+")  # data/README.md's A: completion
    wrong = reward_examples.env_examples(env)["wrong terminated flag"]
    assert wrong == "+".join([fen, reward, str(1 - int(terminated)), truncated])


def test_reward_examples_keep_the_candidates_shape_and_change_what_they_say():
    """'random legal' and 'illegal' keep the record's candidates, the last replaced by the move; 'illegal'
    names two squares and python-chess finds it illegal; 'best repeated' repeats the best move and its
    eval in every slot (none for one candidate); 'one FEN char off' changes exactly one character."""
    for r in data.load_split("P", "test").records[:300]:
        ex, n = reward_examples.policy_examples(r), len(r["moves"])
        for cat in ("random legal", "illegal"):
            if cat in ex:
                head, move = ex[cat].rsplit(" B: ", 1)
                assert head == f" M: {' '.join([*r['moves'][:-1], move])} E: {' '.join(r['evals'])}"
        move = chess.Move.from_uci(ex["illegal"].rsplit("B: ", 1)[1])
        assert move.from_square != move.to_square and not chess.Board(r["fen"]).is_legal(move), r["id"]
        if n > 1:
            best, ev = r["moves"][0], r["evals"][0]
            assert ex["best repeated"] == f" M: {' '.join([best] * n)} E: {' '.join([ev] * n)} B: {best}"
    one = dict(r, moves=r["moves"][:1], evals=r["evals"][:1])
    assert "best repeated" not in reward_examples.policy_examples(one)
    for r in data.load_split("A", "test").records[:300]:
        ex = reward_examples.env_examples(r)
        exact, off = ex["exact"], ex["one FEN char off"]
        assert len(off) == len(exact) and sum(a != b for a, b in zip(off, exact)) == 1, r["id"]


@pytest.mark.parametrize("op, i, want", [("r", 1, "aXc"), ("r", 3, "abX"), ("i", 1, "aXbc"), ("i", 3, "abcX"),
                                         ("d", 1, "ac"), ("d", 3, "ab"), ("s", 0, "bac"), ("s", 2, "acb")])
def test_edit_chars_edits_at_the_index_given(op, i, want):
    """edit_chars on "abc", worked by hand: replace, insert, delete, swap at i; an index past the end
    replaces or deletes the last character and swaps the last two."""
    chars = list("abc")
    reward_examples.edit_chars(chars, op, i, "X")
    assert "".join(chars) == want


def test_limit_keys_are_spelled_in_one_order():
    assert limit_key(chess.engine.Limit(depth=8, nodes=1000)) == "depth=8,nodes=1000"


@needs_stockfish
def test_the_pool_sends_its_hash_size_and_searches_at_the_limit_asked():
    fen = "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"
    with EnginePool(EngineSettings(depth=8, hash_mb=32), size=1, cache=False) as pool:
        (a,) = pool.analyse_many([fen], limit=chess.engine.Limit(depth=2), multipv=3)
        assert pool._engines[0].protocol.config["Hash"] == 32  # python-chess's record of the option it sent
    assert (a.limit, a.depth) == ("depth=2", 2)


# Behaviours of chess/training that no test pinned (mutation round 5: each test below is red with its mutant)

def test_a_fresh_model_reads_and_writes_the_layout_set_on_it():
    """layout_of: "its recorded one"; a fresh model without a record is compact. A fresh model given the
    original layout (set_layout, as `rookworld grpo --layout original` does before training) reads and
    writes the original layout, not the fresh model's default."""
    model = GPT(GPTConfig.preset("tiny", block_size=32))
    assert model.source is None and training.layout_of(model) == "compact"
    assert training.layout_of(training.set_layout(model, "original")) == "original"
    assert training.layout_of(training.set_layout(model, "compact")) == "compact"


def test_the_uci_order_sorts_the_original_layouts_candidates_too(tmp_path):
    """RecordReader("original", "uci"): each P: answer lists its (move, eval) pairs sorted by move text
    (the layout's own order shuffles them), each eval still beside its move, B: the record's best. Records
    without a mate score: the original layout spells those in pawns (M5 as 999.95)."""
    recs = [r for r in shipped("P", "train")[:40] if not any("M" in e for e in r["evals"])][:12]
    assert len(recs) == 12
    path = tmp_path / "policy_train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    texts = training.RecordReader("original", "uci").load_texts([path])
    assert len(texts) == len(recs)
    for rec, text in zip(recs, texts):
        moves = text.split(" M: ")[1].split(" E: ")[0].split()
        evals = text.split(" E: ")[1].split(" B: ")[0].split()
        assert moves == sorted(rec["moves"]), (moves, rec["moves"])
        assert dict(zip(moves, evals)) == dict(zip(rec["moves"], rec["evals"]))
        assert text.rstrip().endswith(" B: " + rec["best"])


def test_text_lines_that_also_carry_a_task_field_are_read_as_text_lines(tmp_path):
    """A file of {"text": ...} lines is text whatever other fields its lines carry (_holds_records: records
    are lines with a task and no text); their texts are read as written."""
    texts = [r["prompt"] + r["completion"] for r in shipped("P", "train")[:3]]
    path = tmp_path / "tagged.jsonl"
    path.write_text("".join(json.dumps({"text": t, "task": "P"}) + "\n" for t in texts))
    assert training.RecordReader().load_texts([path]) == texts


def test_prompt_items_take_the_p_and_a_records_and_leave_the_others_out():
    """prompt_items of a mixed list (P:, A: and mate-in-one records, as evaluation sets hold): one item per
    P:/A: record, its prompt the record's and the record as truth; the M1 records are not GRPO prompts."""
    p, a = shipped("P", "train")[:2], shipped("A", "train")[:2]
    m1 = shipped("M1", None)[:2]
    assert {r["task"] for r in m1} == {"M1"}
    items = training.prompt_items([p[0], m1[0], a[0], m1[1], p[1], a[1]])
    assert [(i.task, i.prompt) for i in items] == [(r["task"], r["prompt"]) for r in (p[0], a[0], p[1], a[1])]
    assert [i.truth["id"] for i in items] == [r["id"] for r in (p[0], a[0], p[1], a[1])]


def test_vocab_distance_spreads_its_records_and_reports_the_mass_outside_as_a_probability():
    """vocab_distance(n=2) of 4 records measures records 0 and 2 (every len // n-th); its KL at a position is
    -log of the probability the model gives the vocabulary there, and mass_outside_max is the largest
    probability outside it (1 - p_inside), both recomputed here from the model's softmax."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", block_size=128)).eval()
    tok = get_tokenizer()
    encoded = lambda r: [EOT_ID, *tok.encode(r["prompt"]), *tok.encode(r["completion"])]  # noqa: E731
    recs, lengths = [], set()
    for r in shipped("P", "train")[:40]:  # four records of four lengths: each measured one is told apart
        if len(encoded(r)) not in lengths and len(recs) < 4:
            recs.append(r)
            lengths.add(len(encoded(r)))
    seqs = [encoded(r) for r in recs]
    assert len(set(map(len, seqs))) == 4
    vocab = TaskVocab({t for s in seqs for t in s})
    d = training.vocab_distance(model, vocab, recs, "compact", n=2)
    assert d["records"] == 2 and d["positions"] == len(seqs[0]) + len(seqs[2])
    inside = []
    with torch.no_grad():
        for s in (seqs[0], seqs[2]):
            p = torch.softmax(model(torch.tensor([s]))[0].double(), -1)
            inside.append(p[:, vocab.ids].sum(-1))
    inside = torch.cat(inside)
    assert abs(d["kl_max"] - float((-inside.log()).max())) < 1e-3
    assert abs(d["mass_outside_max"] - float((1 - inside).max())) < 1e-5
    assert 0 < d["mass_outside_max"] < 1
