"""Shipped data: validity, splits, coverage, the label audit; the loader (data); resumable generation (datagen)."""

import contextlib
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import chess
import chess.engine
import pytest
from helpers_chess import default_sigint, needs_stockfish, random_positions, shipped, wait_gone

from rookworld_lib.chess import data, datagen, tasks
from rookworld_lib.chess.engine import EnginePool, EngineSettings, parse_limit_key
from rookworld_lib.core.paths import DATA_DIR, DataFormatError, JsonlAppender, read_jsonl, write_jsonl


SHIPPED = datagen.DatagenConfig(test_games=16)  # the data card's command: its games and their splits


@pytest.fixture(scope="module")
def ship():
    """Every shipped file, loaded (and so validated line by line)."""
    out = {}
    for task in ("P", "A"):
        for split in data.SPLITS:
            out[(task, split)] = shipped(task, split)
    path = data.data_file("M1")
    if not path.exists():
        pytest.skip("mate-in-one set not generated")
    out["M1"] = data.load_mate_in_one().records
    return out


# ------------------------------------------------------------------------------------------
# The shipped data set
# ------------------------------------------------------------------------------------------

def test_sizes_fit_the_cpu_profile(ship):
    assert len(ship[("P", "train")]) >= 3000 and len(ship[("A", "train")]) >= 3000
    for split in ("val", "test"):
        assert len(ship[("P", split)]) >= 200 and len(ship[("A", split)]) >= 200
    assert len(ship[("P", "test")]) >= 500 and len(ship[("A", "test")]) >= 500  # test-split evals need n >= 500
    assert len(ship["M1"]) >= 150
    total = sum(p.stat().st_size for p in DATA_DIR.glob("*.jsonl"))
    assert total < 10 * 2**20  # "a few MB"


def test_no_position_crosses_splits_and_no_duplicates(ship):
    owners = {}
    for split in data.SPLITS:
        keys = {tasks.position_key(r["fen"]) for task in ("P", "A") for r in ship[(task, split)]}
        for k in keys:
            assert owners.setdefault(k, split) == split, f"position {k} is in {owners[k]} and {split}"
        p_keys = [tasks.position_key(r["fen"]) for r in ship[("P", split)]]
        assert len(p_keys) == len(set(p_keys)), f"duplicate P: position in {split}"
        a_keys = [(tasks.position_key(r["fen"]), r["move"]) for r in ship[("A", split)]]
        assert len(a_keys) == len(set(a_keys)), f"duplicate A: sample in {split}"
        games = {r["game"] for task in ("P", "A") for r in ship[(task, split)]}
        assert all(datagen.split_of_game(g, SHIPPED) == split for g in games)
    train_keys = {k for k, s in owners.items() if s == "train"}
    assert not {tasks.position_key(r["fen"]) for r in ship["M1"]} & train_keys


def test_coverage_of_colours_and_special_positions(ship):
    policy, env = ship[("P", "train")], ship[("A", "train")]
    for recs in (policy, env):
        black = sum(" b " in r["fen"] for r in recs) / len(recs)
        assert 0.4 < black < 0.6
    tags = Counter(t for r in policy for t in r["tags"])
    for tag in ("check", "castling", "en_passant", "promotion", "mate"):
        assert tags[tag] >= 20, tags
    # both colours have mate-scored positions, and both colours promote
    assert {r["fen"].split()[1] for r in policy if "mate" in r["tags"]} == {"w", "b"}
    assert {r["fen"].split()[1] for r in policy if "promotion" in r["tags"]} == {"w", "b"}
    all_env = [r for s in data.SPLITS for r in ship[("A", s)]]
    terms = Counter(r["termination"] for r in all_env)
    for t in ("checkmate", "stalemate", "insufficient_material"):
        assert terms[t] >= 3, terms
    kinds = Counter(r["kind"] for r in env)
    assert kinds["illegal"] / len(env) >= 0.04 and kinds["unparseable"] / len(env) >= 0.04
    mtags = Counter(t for r in env for t in r["tags"])
    for tag in ("castling", "en_passant", "promotion", "check", "capture"):
        assert mtags[tag] >= 5, mtags
    assert Counter(r["source"] for r in policy).keys() == set(data.GAME_KINDS)


def test_policy_labels_are_best_first_for_the_side_to_move(ship):
    """The cheap whole-data audit: B: = moves[0] and evals never rise down the list, for both
    colours (the reversed-for-black bug would break this on every black position)."""
    for split in data.SPLITS:
        for r in ship[("P", split)]:
            cps = [tasks.parse_eval(e).to_cp() for e in r["evals"]]
            assert r["best"] == r["moves"][0]
            assert cps == sorted(cps, reverse=True), r["id"]
            assert len(r["moves"]) == min(5, r["n_legal"]), r["id"]


@needs_stockfish
def test_label_audit_reanalysis_matches_for_both_colours(ship):
    """Re-run Stockfish at the recorded settings on a seeded sample (half white, half black to
    move): the top move is B:, and the whole candidate list and evals are reproduced."""
    recs = ship[("P", "train")] + ship[("P", "val")] + ship[("P", "test")]
    rng = random.Random(2026)
    white = rng.sample([r for r in recs if " w " in r["fen"]], 60)
    black = rng.sample([r for r in recs if " b " in r["fen"]], 60)
    sample = white + black
    limits = {r["limit"] for r in sample}
    assert len(limits) == 1
    settings = EngineSettings(**{k: v for k, v in vars(parse_limit_key(limits.pop())).items()
                                 if k in ("depth", "nodes") and v is not None}, multipv=5)
    with EnginePool(settings, size=2, cache=False) as pool:
        assert pool.version == sample[0]["engine"]
        analyses = pool.analyse_many([r["fen"] for r in sample])
    mismatched = [r["id"] for r, a in zip(sample, analyses) if a.best != r["best"]]
    assert not mismatched, f"B: differs from Stockfish's top move for {mismatched}"
    for r, a in zip(sample, analyses):
        assert list(a.moves) == r["moves"] and [tasks.format_eval(e) for e in a.evals] == r["evals"], r["id"]


def _replay(fen: str, move: str):
    """An independent python-chess replay of one environment step (not tasks.environment_step)."""
    board = chess.Board(fen)
    try:
        mv = chess.Move.from_uci(move)
    except ValueError:
        mv = None
    if mv is None or not mv or not board.is_legal(mv):
        return fen, -1.0, 0, 1
    board.push(mv)
    new = board.fen(en_passant="fen")
    if board.is_checkmate():
        return new, 1.0, 1, 0
    if board.is_stalemate() or board.is_insufficient_material() or board.is_seventyfive_moves():
        return new, 0.5, 1, 0
    return new, 0.001, 0, 0


def test_environment_audit_every_sample_equals_a_replay(ship):
    n = Counter()
    for split in data.SPLITS:
        for r in ship[("A", split)]:
            assert (r["new_fen"], r["reward"], r["terminated"], r["truncated"]) == _replay(r["fen"], r["move"]), r["id"]
            assert r["prompt"] == f"A: {r['fen']}+{r['move']}+{' '.join(r['history'])}+"
            assert r["completion"] == f"{r['new_fen']}+{tasks.format_reward(r['reward'])}+{r['terminated']}+{r['truncated']}"
            n[r["reward"]] += 1
    assert set(n) == {0.001, 1.0, 0.5, -1.0}


def test_mate_in_one_set_is_complete_and_correct(ship):
    for r in ship["M1"]:
        board = chess.Board(r["fen"])
        mates = []
        for mv in board.legal_moves:
            board.push(mv)
            if board.is_checkmate():
                mates.append(mv.uci())
            board.pop()
        assert sorted(mates) == r["mating_moves"], r["id"]
        assert r["split"] in ("val", "test")


def test_data_card_matches_the_files(ship):
    card = (DATA_DIR / "README.md").read_text()
    files = {data.data_file(t, s).name: ship[(t, s)] for t in ("P", "A") for s in data.SPLITS}
    files[data.MATE_FILE] = ship["M1"]
    for name, recs in files.items():
        white = sum(" w " in r["fen"] for r in recs)
        assert f"| {name} | {len(recs)} | {len({r['game'] for r in recs})} | {white} | {len(recs) - white} |" in card, name
    assert "20261122" in card and "Stockfish 15.1" in card and "depth=8" in card
    assert {r["engine"] for r in ship[("P", "train")]} == {"Stockfish 15.1"}
    assert {r["limit"] for r in ship[("P", "train")]} == {"depth=8"}


# ------------------------------------------------------------------------------------------
# Loader
# ------------------------------------------------------------------------------------------

def _good_records():
    p = shipped("P", "val")[:2]
    a = shipped("A", "val")[:2]
    return p, a


@pytest.mark.fault
def test_malformed_lines_give_file_line_reason_or_are_skipped_and_counted(tmp_path):
    (p1, p2), (a1, a2) = _good_records()
    bad_best = {**p1, "best": p1["moves"][-1], "id": "bad-best"}
    bad_move = {**p2, "moves": ["a1a1"] + p2["moves"][1:], "id": "bad-move"}
    bad_reward = {**a1, "reward": 0.7, "id": "bad-reward"}
    lines = [json.dumps(p1), "{not json", json.dumps(bad_best), json.dumps(p2), json.dumps({"task": "P"}),
             json.dumps(bad_move), "", json.dumps(a1), json.dumps(bad_reward), json.dumps(p1), "[1, 2]"]
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(data.DataFormatError) as err:
        data.load_jsonl(path)
    assert str(err.value).startswith(f"{path}:2: invalid JSON")
    loaded = data.load_jsonl(path, on_error="skip")
    assert [r["id"] for r in loaded] == [p1["id"], p2["id"], a1["id"]]
    assert loaded.n_skipped == 7
    reasons = {e.line: e.reason for e in loaded.skipped}
    assert set(reasons) == {2, 3, 5, 6, 9, 10, 11}
    assert "best" in reasons[3] and "missing field" in reasons[5] and "not a legal" in reasons[6]
    assert "reward" in reasons[9] and "duplicate id" in reasons[10] and "JSON object" in reasons[11]
    assert str(loaded.skipped[0]) == f"{path}:2: {reasons[2]}"
    with pytest.raises(ValueError, match=r"^load_jsonl: on_error must be 'raise' or 'skip', got 'ignore'$"):
        data.load_jsonl(path, on_error="ignore")  # an AssertionError (none under python -O)
    with pytest.raises(data.DataFormatError, match=":1: expected a 'A' record"):
        data.load_jsonl(path, task="A")


def test_a_content_already_validated_is_not_checked_again_but_a_changed_one_is(tmp_path, monkeypatch):
    """load_jsonl checks the same bytes once per process (a notebook loads the splits, then SFT loads the
    training files again); new bytes at the same path, size and mtime are checked, and a file read as
    another task still fails."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # no mark of an earlier session's check
    monkeypatch.setattr(data, "_VALIDATED", {})
    (p1, p2), _ = _good_records()
    path = tmp_path / "policy_train.jsonl"
    path.write_text(json.dumps(p1) + "\n" + json.dumps(p2) + "\n")
    checked = []
    check = data.validate_record
    monkeypatch.setattr(data, "validate_record", lambda rec, task=None: checked.append(rec["id"]) or check(rec, task))
    first = data.load_jsonl(path, task="P")
    assert checked == [p1["id"], p2["id"]]
    assert data.load_jsonl(path, task="P") == first and data.load_jsonl(path) == first
    assert checked == [p1["id"], p2["id"]], "the same content was checked again"
    stat = path.stat()
    bad = json.dumps({**p2, "best": p2["moves"][-1]})[: len(json.dumps(p2))]  # same size: a line cut short
    path.write_text(json.dumps(p1) + "\n" + bad + "\n")
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    with pytest.raises(data.DataFormatError, match=f"{path}:2: "):
        data.load_jsonl(path, task="P")
    path.write_text(json.dumps(p1) + "\n" + json.dumps(p2) + "\n")
    with pytest.raises(data.DataFormatError, match=":1: expected a 'A' record"):
        data.load_jsonl(path, task="A")


@pytest.mark.parametrize("field, value, reason", [
    ("completion", " M: e2e4 E: 0.1 B: e2e4", "completion"),
    ("prompt", "P: 8/8/8/8/8/8/8/8 w - - 0 1", "prompt"),
    ("evals", ["0.30"], "eval"),
    ("fen", "not a fen", "fen"),
    ("split", "dev", "split"),
    ("n_legal", True, "type bool"),
    ("n_legal", "20", "field 'n_legal' has type str, not int"),  # what is wanted, too
    ("extra", 1, "unknown field"),
    # a search a reward may repeat for an unlisted move: a limit key it can finish (depth=99 held a reward for days)
    ("limit", "depth=99", "field 'limit': limit 'depth=99': depth must be in [1, 40] (or 'unknown')"),
    ("limit", "nodes=1000000000000", "nodes must be in [1, 1e+08]"),
    ("limit", "banana", "field 'limit': not a limit key: 'banana'"),
    ("limit", 8, "field 'limit'"),
])
def test_policy_record_validation_names_the_field(field, value, reason):
    (p1, _), _ = _good_records()
    rec = {**p1, field: value}
    if field == "evals":
        rec["evals"] = ["0.30"] + p1["evals"][1:]
    assert reason in data.validate_record(rec)


def test_a_split_file_holding_records_of_another_split_is_refused_naming_one(tmp_path):
    """Every reader of a split (GRPO's prompts, eval's suites, SFT's defaults) goes through load_split: test
    records in a train file (GRPO trained on them, exit 0) or train records in a test file (eval scored them
    as held out) are refused, naming the file and a record."""
    (tmp_path / "policy_train.jsonl").write_text((DATA_DIR / "policy_test.jsonl").read_text())
    first_test = json.loads((DATA_DIR / "policy_test.jsonl").read_text().splitlines()[0])["id"]
    with pytest.raises(data.DataFormatError, match=rf"policy_train.jsonl: record '{first_test}' is a 'test' record "
                                                   r"in the train split's file"):
        data.load_split("P", "train", tmp_path)
    lines = (DATA_DIR / "policy_test.jsonl").read_text().splitlines(keepends=True)
    train_line = (DATA_DIR / "policy_train.jsonl").read_text().splitlines(keepends=True)[0]
    (tmp_path / "policy_test.jsonl").write_text("".join(lines[:3] + [train_line]))
    with pytest.raises(data.DataFormatError, match=r"is a 'train' record in the test split's file"):
        data.load_split("P", "test", tmp_path)
    assert len(data.load_split("P", "test").records) == 730  # the shipped splits pass


def test_a_policy_record_limit_of_the_original_data_or_at_the_bounds_is_valid():
    (p1, _), _ = _good_records()
    for limit in ("unknown", "depth=40", "nodes=100000000", "depth=8,nodes=1000"):
        assert data.validate_record({**p1, "limit": limit}) is None, limit


def test_policy_record_validation_counts_legal_moves_with_python_chess():
    (p1, _), _ = _good_records()
    n = chess.Board(p1["fen"]).legal_moves.count()
    assert p1["n_legal"] == n and data.validate_record(p1) is None
    assert data.validate_record({**p1, "n_legal": n + 1}) == f"field 'n_legal' is {n + 1}, the position has {n} legal moves"


def test_env_record_validation_catches_wrong_transitions():
    _, (a1, _) = _good_records()
    illegal = next(r for r in shipped("A", "val") if r["kind"] != "legal")
    assert data.validate_record(a1) is None and data.validate_record(illegal) is None
    assert "illegal/unparseable" in data.validate_record({**illegal, "truncated": 0})
    assert "history" in data.validate_record({**a1, "history": ["x"]})
    assert "kind" in data.validate_record({**a1, "kind": "weird"})


def _not_mating(rec: dict) -> str:
    """A legal move of a mate-in-one record's position that does not mate (python-chess's verdict)."""
    board = chess.Board(rec["fen"])
    for mv in board.legal_moves:
        board.push(mv)
        mate = board.is_checkmate()
        board.pop()
        if not mate:
            return mv.uci()
    raise AssertionError(f"every move mates in {rec['id']}")


ILLEGAL_LABEL = {"reward": -1.0, "terminated": 0, "truncated": 1}  # what an illegal/unparseable move gives


def _labelled_illegal(r):  # a legal move labelled as an illegal one, consistently
    return {"kind": "illegal", "new_fen": r["fen"], **ILLEGAL_LABEL}


def _labelled_legal(r):  # an illegal move labelled as a legal one that leaves the board as it is
    return {"kind": "legal", "reward": 0.001, "truncated": 0}


# (id, record kind: P, A (a legal move), Ax (an illegal one) or M1, the broken fields, the validator's
# whole message[, marks]): every rule of the validator that the tables above do not reach
HISTORY_RULE = "field 'history' must be 1..10 moves (each non-empty, without '+' or whitespace) ending with the current move"
VALIDATOR_ROWS = [
    ("P-source", "P", lambda r: {"source": "engine"},
     "field 'source' must be one of ('random', 'opening', 'selfplay', 'original'), got 'engine'"),
    ("P-original_best", "P", lambda r: {"original_best": "a1a1"}, "field 'original_best' 'a1a1' is not among 'moves'"),
    # a B: that is another listed move, its completion written to match (the reversed-labels bug as a file holds
    # it): SFT would learn that B: while rewards and metrics grade moves[0]
    ("P-best-not-the-first-candidate", "P",
     lambda r: {"best": r["moves"][-1], "completion": tasks.policy_text(r["fen"], r["moves"], r["evals"], r["moves"][-1])[1]},
     lambda r: f"field 'best' {r['moves'][-1]!r} is not moves[0] {r['moves'][0]!r}"),
    ("A-move-with-a-space", "A", lambda r: {"move": "e2 e4", "history": ["e2 e4"]},
     "field 'move' must be non-empty without '+' or whitespace"),
    ("A-move-with-a-plus", "A", lambda r: {"move": "e2+e4", "history": ["e2+e4"]},
     "field 'move' must be non-empty without '+' or whitespace"),
    ("A-move-empty", "A", lambda r: {"move": "", "history": [""]}, "field 'move' must be non-empty without '+' or whitespace"),
    ("A-legal-with-the-illegal-label", "A", lambda r: {"new_fen": r["fen"], **ILLEGAL_LABEL},
     "a legal move must give truncated 0 and a reward other than -1.0"),
    ("A-legal-move-kind-illegal", "A", _labelled_illegal, "field 'kind' is 'illegal' but the move is legal"),
    ("Ax-illegal-with-a-legal-label", "Ax", lambda r: {"reward": 0.001, "truncated": 0},
     "an illegal/unparseable move must give new_fen = fen, reward -1.0, terminated 0, truncated 1"),
    ("Ax-illegal-move-kind-legal", "Ax", _labelled_legal, "field 'kind' is 'legal' but the move is illegal"),
    ("A-prompt", "A", lambda r: {"prompt": r["prompt"] + " "}, "field 'prompt' does not match fen/move/history"),
    # an entry the prompt cannot hold: named as the field's rule (it was the validator's crash net, naming env_prompt)
    ("A-history-entry-with-a-space", "A", lambda r: {"history": ["d2 d4", *r["history"][-9:]]}, HISTORY_RULE),
    ("A-completion", "A", lambda r: {"completion": r["completion"] + "+"},
     "field 'completion' does not match new_fen/reward/terminated/truncated"),
    ("Ax-illegal-move-kind-unparseable", "Ax", lambda r: {"kind": "unparseable" if r["kind"] == "illegal" else "illegal"},
     lambda r: f"field 'kind' is {'unparseable' if r['kind'] == 'illegal' else 'illegal'!r}, but the move {r['move']!r} "
               f"is {r['kind']}"),
    ("M1-no-mating-moves", "M1", lambda r: {"mating_moves": []}, "field 'mating_moves' is empty"),
    ("M1-illegal-mating-move", "M1", lambda r: {"mating_moves": ["a1a1"]}, "mating move 'a1a1' is not legal"),
    ("M1-a-move-that-does-not-mate", "M1", lambda r: {"mating_moves": [*r["mating_moves"], _not_mating(r)]},
     lambda r: f"mating move {_not_mating(r)!r} does not mate"),
    ("M1-prompt", "M1", lambda r: {"prompt": f"P: {chess.STARTING_FEN}"}, "field 'prompt' does not match 'fen'"),
    # every move that mates at once, each once (a duplicate or a missing one passed: only membership was checked)
    ("M1-a-mating-move-twice", "M1", lambda r: {"mating_moves": r["mating_moves"] * 2},
     lambda r: f"field 'mating_moves' must list every mating move once: {r['mating_moves']}, got "
               f"{r['mating_moves'] * 2}"),
    # data/README: `game` is the source game's index; mate-in-one records are held out (val / test only); the
    # history is the last <= 10 moves, the current one last (refused by its own rule, not the crash net)
    *[(f"{k}-negative-game", k, lambda r: {"game": -1}, "fields 'game' and 'ply' must be >= 0") for k in ("P", "A", "M1")],
    ("M1-train-split", "M1", lambda r: {"split": "train"}, "field 'split' must be one of ('val', 'test'), got 'train'"),
    ("A-history-ending-with-another-move", "A",
     lambda r: {"history": [*r["history"][:-1], "a2a3" if r["move"] != "a2a3" else "h2h3"]}, HISTORY_RULE),
    ("A-history-of-eleven-moves", "A", lambda r: {"history": ["a2a3"] * 10 + [r["move"]]}, HISTORY_RULE),
]


def _valid_record(kind: str) -> dict:
    """A shipped record of `kind` (see VALIDATOR_ROWS) that the validator passes."""
    if kind == "M1":
        rec = data.load_mate_in_one().records[0]
    else:
        recs = shipped("P" if kind == "P" else "A", "val")
        rec = next(r for r in recs if kind == "P" or r["kind"] == ("legal" if kind == "A" else "illegal"))
    assert data.validate_record(rec) is None, rec["id"]
    return rec


@pytest.mark.parametrize("kind, broken, message", [pytest.param(*row[1:4], id=row[0], marks=row[4:]) for row in VALIDATOR_ROWS])
def test_record_validation_says_which_rule_a_record_breaks(kind, broken, message):
    """A shipped record that passes, with one rule broken, gets that rule's message, whole."""
    rec = _valid_record(kind)
    want = message(rec) if callable(message) else message
    assert data.validate_record({**rec, **broken(rec)}) == want


def test_the_kind_rows_moves_are_legal_and_illegal_as_python_chess_says():
    """The kind rows of VALIDATOR_ROWS name the move legal or illegal (the validator once said it
    backwards: "'illegal' but the move is illegal" of a legal move); python-chess decides which it is."""
    legal, illegal = _valid_record("A"), _valid_record("Ax")
    assert chess.Move.from_uci(legal["move"]) in chess.Board(legal["fen"]).legal_moves
    assert not chess.Board(illegal["fen"]).is_legal(chess.Move.from_uci(illegal["move"]))


@pytest.mark.fault
def test_unreadable_and_non_utf8_files(tmp_path):
    with pytest.raises(data.DataFormatError, match="cannot read"):
        data.load_jsonl(tmp_path / "missing.jsonl")
    (p1, _), _ = _good_records()
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(json.dumps(p1).encode() + b"\n\xff\xfe broken\n")
    with pytest.raises(data.DataFormatError, match=":2: not UTF-8"):
        data.load_jsonl(path)
    loaded = data.load_jsonl(path, on_error="skip")
    assert loaded.n_skipped == 1 and len(loaded) == 1


def test_cli_validate_reports_file_and_line(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"task": "P"}\n')
    assert datagen.cli(["--validate", str(path)]) == 1
    assert f"{path}:1: missing field" in capsys.readouterr().err
    assert datagen.cli(["--validate", str(data.data_file("M1"))]) == 0


def test_cli_help_and_bad_settings(capsys):
    with pytest.raises(SystemExit) as ex:
        datagen.cli(["--help"])
    assert ex.value.code == 0 and "rookworld datagen" in capsys.readouterr().out
    with pytest.raises(ValueError, match="DatagenConfig.games"):  # `rookworld datagen` says it in one line, exit 1
        datagen.cli(["--games", "0", "--out", "/nonexistent"])


@pytest.mark.parametrize("kwargs, field", [
    (dict(games=0), "games"), (dict(depth=0), "depth"), (dict(multipv=6), "multipv"), (dict(workers=0), "workers"),
    (dict(policy_rate=1.5), "policy_rate"), (dict(max_plies=0), "max_plies"), (dict(mate_games=-1), "mate_games"),
])
def test_config_rejects_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"DatagenConfig.{field}"):
        datagen.DatagenConfig(**kwargs)


# ------------------------------------------------------------------------------------------
# Generation pieces and resumability
# ------------------------------------------------------------------------------------------

def test_wrong_moves_are_never_legal_and_fit_the_format():
    rng = random.Random(3)
    kinds = Counter()
    for board in random_positions(150, seed=4):
        text = datagen.wrong_move(board, rng)
        assert text and "+" not in text and not any(c.isspace() for c in text)
        tr = tasks.environment_step(tasks.canonical_fen(board), text)
        assert tr.kind in ("illegal", "unparseable") and tr.truncated == 1
        kinds[tr.kind] += 1
    assert kinds["illegal"] > 20 and kinds["unparseable"] > 20


def test_game_plans_and_splits_are_seeded():
    cfg = datagen.DatagenConfig(games=40, mate_games=5)
    plans = [datagen.game_plan(i, cfg) for i in range(45)]
    assert plans == [datagen.game_plan(i, cfg) for i in range(45)]
    assert {p["kind"] for p in plans[:40]} == set(data.GAME_KINDS)
    assert all(p.get("mate_only") for p in plans[40:])
    assert [datagen.split_of_game(i) for i in (0, 7, 8, 9, 18, 19)] == ["train", "train", "val", "test", "val", "test"]
    assert datagen.split_of_game(41, cfg) == "test"


def test_game_plans_follow_the_data_cards_recipe():
    """data/README.md: opening games play 2-16 random half-moves, then self-play at 32-2048 nodes with 3% random
    moves; self-play colours draw from (1..2048 nodes) x (0, 5, 15, 30% noise); a mate game pits a strong side
    (128-2048 nodes, no noise) against a weak, noisy one (1 or 8 nodes, 15 or 30% noise), either colour."""
    cfg = datagen.DatagenConfig(games=3000, mate_games=300)
    plans = [datagen.game_plan(i, cfg) for i in range(3300)]
    opening = [p for p in plans[:3000] if p["kind"] == "opening"]
    assert {p["random_plies"] for p in opening} == set(range(2, 17))
    assert {n for p in opening for n in p["nodes"]} == {32, 128, 512, 2048}
    assert all(p["nodes"][0] == p["nodes"][1] and p["noise"] == [0.03, 0.03] for p in opening)
    selfplay = [p for p in plans[:3000] if p["kind"] == "selfplay"]
    assert {n for p in selfplay for n in p["nodes"]} == {1, 8, 32, 128, 512, 2048}
    assert {x for p in selfplay for x in p["noise"]} == {0.0, 0.05, 0.15, 0.3}
    assert all(p["random_plies"] == 0 for p in selfplay)
    for p in plans[3000:]:
        strong = p["noise"].index(0.0)
        weak = 1 - strong
        assert p["mate_only"] and p["kind"] == "selfplay" and p["random_plies"] == 0
        assert p["nodes"][strong] in (128, 512, 2048) and p["nodes"][weak] in (1, 8) and p["noise"][weak] in (0.15, 0.3)
    assert {p["noise"].index(0.0) for p in plans[3000:]} == {0, 1}  # either colour is the strong one


def test_json_lines_survive_a_torn_tail_and_name_bad_lines(tmp_path):
    path = tmp_path / "work.jsonl"
    with JsonlAppender(path) as app:
        app.write({"a": 1})
        app.write({"a": 2})
    with open(path, "ab") as fh:
        fh.write(b'{"a": 3')  # a kill mid-write
    assert [v for _, v, _ in read_jsonl(path, torn_tail=True)] == [{"a": 1}, {"a": 2}]
    assert list(read_jsonl(path))[-1][2].startswith("invalid JSON")
    with JsonlAppender(path) as app:  # the torn line is cut before anything is appended
        app.write({"a": 4})
    assert path.read_text().splitlines() == ['{"a":1}', '{"a":2}', '{"a":4}']
    assert datagen._read_work(path) == [{"a": 1}, {"a": 2}, {"a": 4}]
    path.write_text('{"a":1}\n{broken\n{"a":2}\n')
    with pytest.raises(data.DataFormatError, match=f"corrupt work file: {path}:2: invalid JSON.*--fresh"):
        datagen._read_work(path)
    with pytest.raises(ValueError):  # strict JSON: NaN is refused, and nothing is left behind
        write_jsonl(tmp_path / "x.jsonl", [{"a": 1}, {"x": float("nan")}])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work.jsonl"]


TINY = dict(games=10, mate_games=3, depth=4, max_plies=60, workers=2)


def _files(d: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(d.glob("*.jsonl"))}


@contextlib.contextmanager
def interrupted_after_labels(n: int):
    """A Ctrl-C (KeyboardInterrupt) once `n` new labels are in the work file, as a user would press it."""
    class Interrupting(datagen.JsonlAppender):
        written = 0

        def write(self, obj):
            super().write(obj)
            if self.path.name == "labels.jsonl":
                Interrupting.written += 1
                if Interrupting.written >= n:
                    raise KeyboardInterrupt("test interruption")

    with pytest.MonkeyPatch.context() as mp, pytest.raises(KeyboardInterrupt):
        mp.setattr(datagen, "JsonlAppender", Interrupting)
        yield


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref")
    report = datagen.generate(datagen.DatagenConfig(out_dir=str(out), **TINY), progress=False)
    return out, report


@pytest.mark.fault
@needs_stockfish
def test_interrupted_generation_resumes_without_redoing_or_losing(reference_run, tmp_path):
    ref_dir, ref = reference_run
    assert ref.positions_labelled > 20 and not (ref_dir / ".datagen-work").exists()
    cfg = datagen.DatagenConfig(out_dir=str(tmp_path), **TINY)
    with interrupted_after_labels(12):
        datagen.generate(cfg, progress=False)
    work = tmp_path / ".datagen-work"
    done = len((work / "labels.jsonl").read_text().splitlines())
    assert done >= 12 and not list(tmp_path.glob("*.jsonl"))
    report = datagen.generate(cfg, progress=False)
    assert report.games_reused == TINY["games"] + TINY["mate_games"] and report.games_played == 0
    assert report.labels_reused == done and report.positions_labelled == ref.positions_labelled - done
    assert _files(tmp_path) == _files(ref_dir)  # byte-identical to the uninterrupted run
    for f in tmp_path.glob("*.jsonl"):
        data.load_jsonl(f)


def test_a_resumed_run_plays_only_the_games_its_work_file_lacks(tmp_path):
    """A run interrupted while it plays its games: the games already in the work file are reused, not played
    again (nor written twice). Random games (no engine): 4 in the work file, then games=7 plays 4, 5 and 6 only,
    and the work file holds 7 lines."""
    small = datagen.DatagenConfig(games=4, mate_games=0, random_share=1.0, opening_share=0.0, max_plies=12, workers=1)
    path = tmp_path / "games.jsonl"
    first, played = datagen._play_games(small, None, path, False)
    assert played == 4 and [g["game"] for g in first] == [0, 1, 2, 3]
    calls = []
    real = datagen.play_game

    def counting(i, cfg, pool):
        calls.append(i)
        return real(i, cfg, pool)

    full = datagen.DatagenConfig(**{**vars(small), "games": 7})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datagen, "play_game", counting)
        games, played = datagen._play_games(full, None, path, False)
    assert sorted(calls) == [4, 5, 6] and played == 3
    assert [g["game"] for g in games] == list(range(7)) and games[:4] == first
    assert len(path.read_text().splitlines()) == 7


def start_until_labelled(args: list[str], labels: Path, n: int, **popen) -> subprocess.Popen:
    """Start `rookworld datagen` (in its own session) and return once `labels` holds `n` lines."""
    return wait_until_labelled(subprocess.Popen(args, start_new_session=True, preexec_fn=default_sigint, **popen),
                               labels, n)


def wait_until_labelled(proc, labels: Path, n: int):
    """Return proc (a running datagen) once `labels` holds `n` lines."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if labels.exists() and len(labels.read_bytes().splitlines()) >= n:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "generation finished before it could be stopped"
    return proc


@pytest.mark.fault
@needs_stockfish
def test_sigkilled_generation_resumes(reference_run, tmp_path):
    """A real kill -9 of `rookworld datagen` mid-run, then the same command again."""
    ref_dir, ref = reference_run
    # `rookworld datagen`'s own cli, what `rookworld_lib.lab.cli.main` dispatches to; this import skips
    # torch, which datagen never needs (0.3 s a process instead of 5)
    args = [sys.executable, "-c", "import sys; from rookworld_lib.chess.datagen import cli; sys.exit(cli(sys.argv[1:]))",
            "--out", str(tmp_path), "--no-progress", "--games", str(TINY["games"]),
            "--mate-games", str(TINY["mate_games"]), "--depth", str(TINY["depth"]),
            "--max-plies", str(TINY["max_plies"]), "--workers", "2"]
    labels = tmp_path / ".datagen-work" / "labels.jsonl"
    proc = start_until_labelled(args, labels, 5, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    children = [int(p) for p in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                                text=True).stdout.split()]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert wait_gone(children, timeout=10) == []  # engines quit when their parent's pipes close
    done = len(labels.read_bytes().splitlines())
    rc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert rc.returncode == 0, rc.stderr
    summary = json.loads(rc.stdout)
    assert summary["labels_reused"] >= done - 1  # at most a torn last line is redone
    assert summary["positions_labelled"] + summary["labels_reused"] == ref.positions_labelled
    assert _files(tmp_path) == _files(ref_dir)


@needs_stockfish
def test_resume_refuses_other_settings_and_summarizes(tmp_path):
    tinier = {**TINY, "games": 3, "mate_games": 1}
    cfg = datagen.DatagenConfig(out_dir=str(tmp_path), **tinier)
    with interrupted_after_labels(1):
        datagen.generate(cfg, progress=False)
    other = datagen.DatagenConfig(out_dir=str(tmp_path), **{**tinier, "depth": 3})
    with pytest.raises(datagen.WorkDirMismatch, match="depth: 4 -> 3"):
        datagen.generate(other, progress=False)
    # the data set to exclude named as written (relative, a trailing slash) or absolute is one setting: it was
    # refused as "other settings" ('data/' -> '/abs/data')
    excluding = datagen.DatagenConfig(out_dir=str(tmp_path / "x"), **tinier, exclude_dir=str(data.DATA_DIR))
    with interrupted_after_labels(1):
        datagen.generate(excluding, progress=False)
    excluding = dataclasses.replace(excluding, exclude_dir=os.path.relpath(data.DATA_DIR) + os.sep)
    assert datagen.generate(excluding, progress=False).labels_reused >= 1
    made = tmp_path / "x" / datagen.MADE_FILE  # as an older version recorded it: the path as written
    made.write_text(json.dumps({**(old := json.loads(made.read_text())), "config": {**old["config"], "exclude_dir": "data"}}))
    datagen.generate(excluding, progress=False)  # the same command again: it was refused as another run's data set
    stale = tmp_path / "policy_val.jsonl"  # 3 games are all train: this run has no val records
    stale.write_text(json.dumps(shipped("P", "val")[0]) + "\n")
    report = datagen.generate(other, progress=False, fresh=True)
    assert not stale.exists() and "policy_val.jsonl" not in report.counts  # no empty file, no stale one
    assert report.counts == {p.name: len(data.load_jsonl(p)) for p in tmp_path.glob("*.jsonl")}
    assert {r["limit"] for r in data.load_split("P", "train", tmp_path)} == {"depth=3"}
    summary = data.summarize(tmp_path)
    n = len(data.load_split("P", "train", tmp_path))
    assert summary["files"]["policy_train.jsonl"]["records"] == n
    assert set(summary["shared_positions"].values()) == {0}
    assert f"| policy_train.jsonl | {n} |" in data.render_card_tables(summary)


@needs_stockfish
def test_an_exclude_dir_whose_held_out_positions_changed_is_another_setting(tmp_path):
    """The settings key holds the excluded set's positions, not only its path: after that set's val/test
    records change (a regenerated or extended data set), the same command neither keeps the data set made
    against the old one nor resumes a run interrupted against it; each says what changed. Kept, the data
    set held a training record at a now held-out position."""
    ex = tmp_path / "ex"
    ex.mkdir()
    (ex / "policy_test.jsonl").write_bytes(data.data_file("P", "test").read_bytes())
    tinier = {**TINY, "games": 3, "mate_games": 1}
    cfg = datagen.DatagenConfig(out_dir=str(tmp_path / "made"), **tinier, exclude_dir=str(ex))
    stopped = dataclasses.replace(cfg, out_dir=str(tmp_path / "stopped"))
    datagen.generate(cfg, progress=False)
    with interrupted_after_labels(1):
        datagen.generate(stopped, progress=False)
    assert datagen.generate(cfg, progress=False).reused
    before = cfg.content_key()["exclude_positions"]
    rec = data.load_split("P", "train", tmp_path / "made").records[0]  # now held out there
    with open(ex / "policy_test.jsonl", "a") as f:
        f.write(json.dumps({**rec, "split": "test", "id": "P-99999-000"}) + "\n")
    assert cfg.content_key()["exclude_positions"] != before
    with pytest.raises(ValueError, match=f"exclude_positions: '{before}' -> "):
        datagen.generate(cfg, progress=False)
    with pytest.raises(datagen.WorkDirMismatch, match=f"exclude_positions: '{before}' -> "):
        datagen.generate(stopped, progress=False)
    datagen.generate(cfg, progress=False, fresh=True)
    held = datagen.heldout_positions(ex)
    assert not [r for t in ("P", "A") for r in data.load_split(t, "train", tmp_path / "made").records
                if tasks.position_key(r["fen"]) in held]


def test_where_the_output_goes_and_how_many_workers_leave_the_settings_key_alone():
    """content_key (its docstring) holds what decides the output: a resume with another --workers, --out,
    --work-dir, --keep-work or Stockfish path is the same run (`rookworld datagen` defaults --workers to the
    usable cores); another depth is not."""
    base = datagen.DatagenConfig()
    for change in (dict(workers=7), dict(out_dir="/elsewhere"), dict(work_dir="/w"), dict(keep_work=True),
                   dict(stockfish="/usr/games/stockfish")):
        assert datagen.DatagenConfig(**change).content_key() == base.content_key(), change
    assert datagen.DatagenConfig(depth=3).content_key() != base.content_key()


@needs_stockfish
def test_the_same_settings_again_keep_their_data_set_unless_a_file_changed(reference_run, tmp_path, monkeypatch, capsys):
    """A finished data set asked for again with its settings (a resumed `rookworld run`, notebook 05's cell run
    again: cpu-long's 8 minutes of datagen were redone) is kept without a game played or a position labelled;
    a data file changed since, or --fresh, makes it again (byte-identical: games are seeded per index)."""
    import shutil

    ref_dir, ref = reference_run
    shutil.copytree(ref_dir, tmp_path, dirs_exist_ok=True)
    args = ["--out", str(tmp_path), "--no-progress", *[f"--{k.replace('_', '-')}={v}" for k, v in TINY.items()]]
    with monkeypatch.context() as mp:
        mp.setattr(datagen, "_play_games", lambda *a: pytest.fail("a game played for a data set these settings made"))
        assert datagen.cli(args) == 0
    out, err = capsys.readouterr()
    kept = json.loads(out)
    assert kept["reused"] and "its files unchanged: kept (--fresh makes it again)" in err
    assert kept["counts"] == ref.counts and kept["env_records"] == ref.env_records
    assert (kept["games_played"], kept["positions_labelled"]) == (0, 0)
    assert kept["games_reused"] == ref.games_played + ref.games_reused
    assert kept["labels_reused"] == ref.positions_labelled + ref.labels_reused
    assert _files(tmp_path) == _files(ref_dir)
    cfg = datagen.DatagenConfig(out_dir=str(tmp_path), **TINY)
    made = json.loads((tmp_path / datagen.MADE_FILE).read_text())
    state = {"config": cfg.content_key(), "engine": ref.engine}
    assert datagen._kept(made, state, tmp_path) is not None
    (tmp_path / "env_train.jsonl").rename(moved := tmp_path / "elsewhere")
    assert datagen._kept(made, state, tmp_path) is None  # a file gone
    moved.rename(tmp_path / "env_train.jsonl")
    assert datagen._kept({**made, "engine": "Stockfish 0"}, state, tmp_path) is None  # another engine
    assert datagen._kept({**made, "report": {}}, state, tmp_path) is None  # a record edited by hand
    first = (train := tmp_path / "policy_train.jsonl").read_bytes().splitlines(keepends=True)
    train.write_bytes(b"".join(first[1:]))  # a record deleted by hand
    again = datagen.generate(cfg, progress=False)
    assert not again.reused and again.games_played == ref.games_played + ref.games_reused
    assert _files(tmp_path) == _files(ref_dir)
    again = datagen.generate(cfg, progress=False, fresh=True)
    assert not again.reused and again.positions_labelled == ref.positions_labelled + ref.labels_reused
    assert _files(tmp_path) == _files(ref_dir)


def test_the_summary_counts_the_positions_each_pair_of_splits_shares(tmp_path):
    """The data card's leak check names every pair of splits with its count: a val position also in train
    is 1 of train/val (the checks passed a summary that named only train/test, all its values 0)."""
    import shutil

    for split in ("train", "val", "test"):
        shutil.copy(data.data_file("P", split), data.data_file("P", split, tmp_path))
    val = shipped("P", "val")[0]
    with data.data_file("P", "train", tmp_path).open("a") as f:
        f.write(json.dumps({**val, "id": "leaked-from-val", "split": "train"}) + "\n")
    assert data.summarize(tmp_path)["shared_positions"] == {"train/val": 1, "train/test": 0, "val/test": 0}


def test_contents_found_valid_once_are_not_checked_again_in_another_process(tmp_path, monkeypatch):
    """The shipped splits cost ~3 s of FEN checks in every process that loads them; contents found
    wholly valid are marked in the cache (named by their digest and the validator's code) and parsed
    again without the checks: the same records. Changed contents, or a mark of another validator, are
    checked again."""
    import shutil

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(data, "_VALIDATED", {})
    path = tmp_path / "policy_val.jsonl"
    shutil.copy(data.data_file("P", "val"), path)
    first = data.load_jsonl(path).records
    marks = list((tmp_path / "cache" / "rookworld" / "valid-data").iterdir())
    assert len(marks) == 1 and marks[0].name.endswith(data._VALIDATOR) and marks[0].read_text() == "P"
    monkeypatch.setattr(data, "_VALIDATED", {})  # as a new process starts
    monkeypatch.setattr(data, "validate_record", lambda rec, task=None: pytest.fail("checked again"))
    assert data.load_jsonl(path).records == first
    path.write_text(" " + path.read_text())  # the same records in other bytes: checked
    with pytest.raises(pytest.fail.Exception, match="checked again"):
        data.load_jsonl(path)
    monkeypatch.setattr(data, "_VALIDATOR", "another")  # a mark of another validator counts for nothing
    monkeypatch.setattr(data, "_VALIDATED", {})
    shutil.copy(data.data_file("P", "val"), path)
    with pytest.raises(pytest.fail.Exception, match="checked again"):
        data.load_jsonl(path)


# ------------------------------------------------------------------------------------------
# Output layouts, game-kind shares, the data card's tables, an empty directory
# ------------------------------------------------------------------------------------------

@needs_stockfish
@pytest.mark.parametrize("layout", [dict(shard_size=7), dict(compress=True)], ids=["shards-uncompressed", "one-gzip-file"])
def test_shards_without_gzip_and_gzip_without_shards_hold_the_plain_runs_bytes(reference_run, tmp_path, layout):
    """--shard-size 7 alone: files of 7 records (the last one shorter); --compress alone: one complete
    .gz per split (its trailer is written when the run ends). Either way the records, in order, are
    the plain run's bytes (reference_run: the same TINY settings, one plain file per split)."""
    import gzip

    ref_dir, ref = reference_run
    report = datagen.generate(datagen.DatagenConfig(out_dir=str(tmp_path), **TINY, **layout), progress=False)
    assert report.counts == ref.counts
    expected_names = []
    for name, n in ref.counts.items():
        stem = name.removesuffix(".jsonl")
        if layout.get("compress"):
            files = [tmp_path / f"{name}.gz"]
            content = gzip.decompress(files[0].read_bytes())  # EOFError without the trailer
        else:
            files = [tmp_path / f"{stem}-{k:05d}.jsonl" for k in range((n + 6) // 7)]
            assert [len(f.read_bytes().splitlines()) for f in files] == [7] * (n // 7) + ([n % 7] if n % 7 else []), name
            content = b"".join(f.read_bytes() for f in files)
        assert content == (ref_dir / name).read_bytes(), name
        expected_names += [f.name for f in files]
    assert sorted(p.name for p in tmp_path.glob("*.jsonl*")) == sorted(expected_names)


def test_game_kind_shares_above_one_are_refused(tmp_path, capsys):
    """random_share + opening_share is the share of games that are not self-play: at most 1."""
    from rookworld_lib.lab.cli import main

    cfg = datagen.DatagenConfig(random_share=0.4, opening_share=0.6)  # exactly 1: no self-play game, allowed
    assert {datagen.game_plan(i, cfg)["kind"] for i in range(40)} == {"random", "opening"}
    with pytest.raises(ValueError, match=r"^DatagenConfig: random_share \+ opening_share \(--random-share, "
                                         r"--opening-share\) must be <= 1, got 0\.5 \+ 0\.6$"):
        datagen.DatagenConfig(random_share=0.5, opening_share=0.6)
    out = tmp_path / "out"
    assert main(["datagen", "--random-share", "0.5", "--opening-share", "0.6", "--no-progress", "--out", str(out)]) == 1
    assert capsys.readouterr().err == ("rookworld datagen: error: DatagenConfig: random_share + opening_share (--random-share, "
                                       "--opening-share) must be <= 1, got 0.5 + 0.6\n")
    assert not out.exists()


def test_datagen_summary_prints_the_data_cards_tables(capsys):
    """`rookworld datagen --summary` (the shipped data/ without --out) prints the three tables of
    data/README.md, as they stand there: a line per file in the card's order, sizes in KB; then the positions
    each pair of splits shares (computed by summarize, and not printed before)."""
    card = (DATA_DIR / "README.md").read_text()
    assert datagen.cli(["--summary"]) == 0
    out = capsys.readouterr().out
    lines = out.rstrip("\n").split("\n")
    assert len(lines) == 2 * (2 + len(data.DATA_FILES)) + 1 + 6 and lines[2 + len(data.DATA_FILES)] == "", out
    assert lines[-5:] == ["| splits | positions in both |", "|---|---:|", "| train/val | 0 |", "| train/test | 0 |",
                          "| val/test | 0 |"]
    assert lines[0] == "| file | records | games | white to move | black to move | size (KB) |"
    assert [line.split(" | ")[0] for line in lines[2:9]] == [f"| {name}" for name in data.DATA_FILES]
    assert "| policy_train.jsonl | 3962 | 255 | 1929 | 2033 | 1824 |" in lines  # the card's first row, by hand
    assert out.rstrip("\n") in card, out


def test_loading_a_split_from_a_directory_without_it_names_the_directory_and_the_names(tmp_path):
    with pytest.raises(data.DataFormatError) as err:
        data.load_split("P", "train", tmp_path)
    assert str(err.value) == (f"{tmp_path}: no policy_train.jsonl[.gz] or policy_train-NNNNN.jsonl[.gz] "
                              "(`rookworld datagen --out DIR` or `rookworld convert ... --out DIR` writes them)")


# Behaviours of chess/data that no test pinned (mutation round 6, stop 68: each test below is red with its mutant)

def _write_lines(path, lines):
    path.write_text("".join(ln + "\n" for ln in lines))


def test_a_lost_first_shard_is_named(tmp_path):
    """Shards are numbered from 00000 without gaps (missing_shards' docstring): shards 1 and 2 without
    0 lose shard 0's records, and load_split refuses, naming policy_test-00000.jsonl."""
    lines = (DATA_DIR / "policy_test.jsonl").read_text().splitlines()[:4]
    _write_lines(tmp_path / "policy_test-00001.jsonl", lines[:2])
    _write_lines(tmp_path / "policy_test-00002.jsonl", lines[2:])
    with pytest.raises(DataFormatError, match=r"policy_test-00000\.jsonl: missing shard"):
        data.load_split("P", "test", tmp_path)


def test_a_file_that_only_starts_like_a_shard_is_not_read(tmp_path):
    """A shard is `<stem>-NNNNN.jsonl[.gz]` (data_files_of's docstring): a leftover
    `policy_test-00000.jsonl.tmp` beside the shard is not read (its records would be read twice)."""
    lines = (DATA_DIR / "policy_test.jsonl").read_text().splitlines()[:3]
    _write_lines(tmp_path / "policy_test-00000.jsonl", lines)
    _write_lines(tmp_path / "policy_test-00000.jsonl.tmp", lines)
    assert [p.name for p in data.data_files_of("policy_test.jsonl", tmp_path)] == ["policy_test-00000.jsonl"]
    assert len(data.load_split("P", "test", tmp_path)) == 3


def test_iter_records_checks_the_task_asked_for(tmp_path):
    """iter_records(task='A') over a policy file raises at its first line, as load_jsonl does."""
    path = tmp_path / "policy_val.jsonl"
    _write_lines(path, (DATA_DIR / "policy_val.jsonl").read_text().splitlines()[:2])
    assert len(list(data.iter_records([path], task="P"))) == 2
    with pytest.raises(DataFormatError, match=r":1: expected a 'A' record"):
        list(data.iter_records([path], task="A"))


def test_original_layout_spells_env_fens_as_python_chess_does():
    """data/README: the original layout writes A: FENs as python-chess's board.fen() (the en-passant
    square only when a legal capture exists). A shipped record whose FEN carries an uncapturable en-passant
    square is rendered with python-chess's spelling in its prompt and in its completion."""
    rec = next(r for r in shipped("A", "val") if r["fen"].split(" ")[3] != "-"
               and chess.Board(r["fen"]).fen() != r["fen"])
    prompt, completion = data.record_text(rec, "original")
    assert prompt == f"A: {chess.Board(rec['fen']).fen()}+{rec['move']}+{' '.join(rec['history'])}+"
    assert completion.split("+")[0] == chess.Board(rec["new_fen"]).fen()


def test_the_summary_counts_a_leaked_starting_position(tmp_path):
    """shared_positions counts every position two splits share, the starting position too: the train
    split holds it (python-chess's starting FEN); a copy of that record in val is 1 shared train/val position."""
    import shutil

    for split in ("train", "val", "test"):
        shutil.copy(data.data_file("P", split), data.data_file("P", split, tmp_path))
    start = next(r for r in shipped("P", "train") if r["fen"].split(" ")[:4] == chess.STARTING_FEN.split(" ")[:4])
    with data.data_file("P", "val", tmp_path).open("a") as f:
        f.write(json.dumps({**start, "id": "leaked-start", "split": "val"}) + "\n")
    assert data.summarize(tmp_path)["shared_positions"] == {"train/val": 1, "train/test": 0, "val/test": 0}


def test_position_tags_en_passant_only_for_a_legal_capture():
    """data/README's feature tag en_passant is a legal en-passant capture. After 1. e4 the FEN names
    e3, but no black pawn stands on d4 or f4 to take there: no tag. With a black pawn on d4 (a position set
    by hand: 1. e4 after ...d5-d4) d4xe3 is a legal capture: the tag."""
    after_e4 = chess.Board("rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1")
    assert "en_passant" not in data.position_tags(after_e4)
    capturable = chess.Board("rnbqkbnr/ppp1pppp/8/8/3pP3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 3")
    assert "en_passant" in data.position_tags(capturable)
