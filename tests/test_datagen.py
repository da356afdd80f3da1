"""Data at scale (datagen): A: from every move, the data card's sampling rates, sharded and compressed
output that resumes, node budgets, and the extra test games that leave train/val alone; how a game is
played (random plies, each colour's nodes and noise, a replay on a fresh engine); datagen's lean UCI
client (labels and games equal to python-chess's, faults). The shipped set is tests/test_data.py's."""

import contextlib
import gzip
import json
import os
import random
import signal
import sys
import time
from collections import Counter

import chess
import pytest
from helpers_chess import needs_stockfish, random_positions, wait_gone

from rookworld_lib.chess import data, datagen, engine, tasks
from rookworld_lib.chess.datagen import LeanPool
from rookworld_lib.chess.engine import EngineFailedError, EnginePool, EngineSessionLost, EngineSettings
from rookworld_lib.chess.tasks import Eval
from rookworld_lib.core.paths import read_jsonl

TINY = dict(games=10, mate_games=3, depth=4, max_plies=60, workers=2)


def _random_games(cfg, n: int) -> list[dict]:
    """Games of the random kind (python-chess only: no engine)."""
    return [datagen._play(i, cfg, {"kind": "random"}, None) for i in range(n)]


def _replay(fen: str, move: str) -> tuple:
    """An independent python-chess replay of one step: (new FEN, reward, terminated, truncated)."""
    board = chess.Board(fen)
    mv = chess.Move.from_uci(move) if tasks.is_uci_syntax(move) and move != "0000" else None
    if mv is None or not board.is_legal(mv):
        return fen, -1.0, 0, 1
    board.push(mv)
    if board.is_checkmate():
        return board.fen(en_passant="fen"), 1.0, 1, 0
    if board.is_stalemate() or board.is_insufficient_material() or board.is_seventyfive_moves():
        return board.fen(en_passant="fen"), 0.5, 1, 0
    return board.fen(en_passant="fen"), 0.001, 0, 0


def test_every_move_of_every_game_becomes_an_A_record_that_python_chess_replays():
    # 12 games of up to 120 plies: about 4,000 A: records, every one checked. They cover all three splits
    # (so positions owned by another split's game), captures, checks, promotions, castling, the three
    # game endings and both kinds of wrong move (asserted below), and the wrong-move share is measured
    # within about 0.005 (one standard deviation) of its rate, against a tolerance of 0.03.
    cfg = datagen.DatagenConfig(games=12, mate_games=0, env_rate=1.0, policy_rate=0.0, max_plies=120)
    games = _random_games(cfg, 12)
    sels = list(datagen.select_samples(games, cfg))
    assert not any(s.policy for s in sels)  # policy_rate 0: no P: at all
    owner, seen, tags, kinds, endings = {}, set(), Counter(), Counter(), Counter()
    for g, sel in zip(games, sels):
        board, expected, split = chess.Board(), [], datagen.split_of_game(g["game"], cfg)
        for uci in g["moves"]:  # every (position, move) whose position this game's split owns, once
            key = tasks.position_key(board.fen(en_passant="fen"))
            if owner.setdefault(key, split) == split and (key, uci) not in seen:
                seen.add((key, uci))
                expected.append((key, uci))
            board.push_uci(uci)
        legal = [s for s in sel.env if not s.get("wrong")]
        assert [(tasks.position_key(s["fen"]), s["move"]) for s in legal] == expected
        for s in sel.env:  # the original A: format's history: the last 10 moves, this one included
            assert s["previous"] + [g["moves"][s["ply"]]] == g["moves"][max(0, s["ply"] - 9): s["ply"] + 1]
        for s in sel.env:
            rec = datagen.env_record(s)
            assert (rec["new_fen"], rec["reward"], rec["terminated"], rec["truncated"]) == _replay(rec["fen"], rec["move"])
            assert data.validate_record(rec, "A") is None, rec["id"]
            # the record built from the sampling pass equals the reference step's
            assert rec == datagen.env_record({k: v for k, v in s.items() if k != "after"})
            tags.update(rec["tags"])
            kinds[rec["kind"]] += 1
            endings[rec["termination"]] += 1
    assert {datagen.split_of_game(g["game"], cfg) for g in games} == set(data.SPLITS)
    assert all(tags[t] for t in ("capture", "check", "promotion", "castling")), tags
    assert all(endings[t] for t in ("checkmate", "stalemate", "insufficient_material")), endings
    assert kinds["illegal"] and kinds["unparseable"], kinds
    env = [s for sel in sels for s in sel.env]
    wrong = sum(bool(s.get("wrong")) for s in env) / sum(not s.get("wrong") for s in env)
    assert abs(wrong - cfg.illegal_rate) < 0.03  # wrong-move siblings keep their proportion


def test_the_last_move_of_every_game_is_an_A_record_whatever_the_rate():
    cfg = datagen.DatagenConfig(games=6, mate_games=0, env_rate=0.0, policy_rate=0.0, illegal_rate=0.0, max_plies=80)
    games = _random_games(cfg, 6)
    for g, sel in zip(games, datagen.select_samples(games, cfg)):  # the game-ending move, and the rare moves
        assert sel.env[-1]["ply"] == len(g["moves"]) - 1, g["game"]
        assert all({"en_passant", "promotion"} & set(s["tags"]) for s in sel.env[:-1]), g["game"]


def _train_games(moves: list[list[str]], kind: str) -> list[dict]:
    """Games of the given moves, all in the train split (indices never 8 or 9 mod 10)."""
    return [{"game": 10 * (i // 8) + i % 8, "kind": kind, "moves": m} for i, m in enumerate(moves)]


def test_positions_with_a_check_or_castling_are_sampled_at_three_times_the_policy_rate():
    """data/README.md ("Sampling"): 12% of positions become P: samples, 36% of those with a check or a legal
    castling, a quarter of that in random games. At policy_rate 1/3 every such position of an engine game is a
    sample, a third of the plain ones; in random games 1/4 and 1/12 (tags from python-chess's boards)."""
    cfg = datagen.DatagenConfig(games=100, mate_games=0, policy_rate=1 / 3, env_rate=0.0, illegal_rate=0.0, max_plies=40)
    moves = [g["moves"] for g in _random_games(cfg, 16)]
    tagged, plain, rare = set(), set(), set()  # rare: a legal en-passant capture or promotion (all sampled)
    for m in moves:
        board = chess.Board()
        for uci in m:
            tags = set(data.position_tags(board))
            key = tasks.position_key(tasks.canonical_fen(board))
            (rare if tags & {"en_passant", "promotion"} else tagged if tags else plain).add(key)
            board.push_uci(uci)
    tagged -= rare
    plain -= tagged | rare
    assert len(tagged) > 100 and len(plain) > 1500
    for kind, share_tagged, share_plain in (("selfplay", 1.0, 1 / 3), ("random", 0.25, 1 / 12)):
        keys = {tasks.position_key(s["fen"]) for sel in datagen.select_samples(_train_games(moves, kind), cfg)
                for s in sel.policy}
        got_tagged, got_plain = len(keys & tagged) / len(tagged), len(keys & plain) / len(plain)
        assert abs(got_tagged - share_tagged) < 0.12, (kind, got_tagged)
        assert abs(got_plain - share_plain) < 0.05, (kind, got_plain)


def test_castling_moves_are_sampled_at_three_times_the_env_rate():
    """data/README.md ("Sampling"): 12% of moves become A: samples, 36% of castlings. At env_rate 1/3 every
    castling move of an engine game is an A: sample, and about a third of the other moves (python-chess's
    is_castling says which)."""
    rng, moves = random.Random(0), []
    for _ in range(40):  # short random games that castle whenever they can
        board = chess.Board()
        while board.ply() < 30 and not board.is_game_over():
            legal = list(board.legal_moves)
            board.push(next((m for m in legal if board.is_castling(m)), None) or rng.choice(legal))
        moves.append([m.uci() for m in board.move_stack])
    castlings, others = set(), set()
    for m in moves:
        board = chess.Board()
        for uci in m:
            key = (tasks.position_key(tasks.canonical_fen(board)), uci)
            (castlings if board.is_castling(chess.Move.from_uci(uci)) else others).add(key)
            board.push_uci(uci)
    assert len(castlings) >= 10
    cfg = datagen.DatagenConfig(games=100, mate_games=0, policy_rate=0.0, env_rate=1 / 3, illegal_rate=0.0)
    taken = {(tasks.position_key(s["fen"]), s["move"])
             for sel in datagen.select_samples(_train_games(moves, "selfplay"), cfg) for s in sel.env}
    assert castlings <= taken
    assert 0.25 < len(others & taken) / len(others) < 0.45  # a third, plus each game's last move


def test_the_mate_tag_follows_the_best_candidates_eval():
    s = {"split": "train", "game": 0, "ply": 0, "source": "engine", "fen": chess.STARTING_FEN, "tags": [], "n_legal": 20}
    label = {"moves": ["e2e4", "d2d4"], "limit": "depth=8"}
    assert "mate" in datagen.policy_record(s, {**label, "evals": ["M1", "0.2"]}, "sf")["tags"]
    assert "mate" not in datagen.policy_record(s, {**label, "evals": ["0.35", "-M2"]}, "sf")["tags"]


def test_each_position_is_labelled_for_the_policy_task_once():
    # eight training games of the same moves: every position is reached eight times in one split
    cfg = datagen.DatagenConfig(games=8, mate_games=0, env_rate=0.0, policy_rate=1.0, max_plies=60)
    game = _random_games(cfg, 1)[0]
    keys = [tasks.position_key(s["fen"]) for sel in datagen.select_samples([{**game, "game": i} for i in range(8)], cfg)
            for s in sel.policy]
    assert len(keys) > 20 and len(keys) == len(set(keys))


def test_a_position_reached_again_with_other_clocks_is_labelled_once():
    """The knights go out and back, then Nf3 again: the start position returns at ply 4 with clocks 4 3,
    not 0 1. It is the same position (python-chess's FEN without the clocks), and the same move from it:
    one P: record of each position, one A: record of each (position, move)."""
    game = {"game": 0, "kind": "selfplay", "moves": ["g1f3", "g8f6", "f3g1", "f6g8", "g1f3"]}
    board, plies = chess.Board(), []
    for m in game["moves"]:
        plies.append((" ".join(board.fen().split()[:4]), m))
        board.push_uci(m)
    assert len({board_fen for board_fen, _ in plies}) == 4 and plies[0] == plies[4]
    cfg = datagen.DatagenConfig(games=1, mate_games=0, env_rate=1.0, policy_rate=1.0)
    (sel,) = datagen.select_samples([game], cfg)
    assert sorted(tasks.position_key(s["fen"]) for s in sel.policy) == sorted({p for p, _ in plies})
    assert sorted((tasks.position_key(s["fen"]), s["move"]) for s in sel.env) == sorted(set(plies))


def test_a_wrong_move_sibling_is_one_a_record_per_position_and_text():
    """Each (position, move text) is one A: record, wrong-move siblings included: 60 games that leave the start
    position by its 20 legal moves (python-chess's), each with a wrong sibling there, give no pair twice."""
    cfg = datagen.DatagenConfig(games=100, mate_games=0, policy_rate=0.0, env_rate=1.0, illegal_rate=1.0)
    firsts = sorted(m.uci() for m in chess.Board().legal_moves)
    games = _train_games([[m] for m in firsts] * 3, "selfplay")
    pairs = [(tasks.position_key(s["fen"]), s["move"]) for sel in datagen.select_samples(games, cfg) for s in sel.env]
    wrong_at_start = [p for p in pairs if p[1] not in firsts]
    assert len(wrong_at_start) >= 5  # the first game's wrong sibling at least, and more than one text
    assert len(pairs) == len(set(pairs))


def test_a_fivefold_repetition_is_an_ordinary_transition_and_a_record_that_says_otherwise_is_refused():
    """The environment decides from the position alone (environment_step): a move that repeats a position
    a fifth time is a 0.001 transition, although the game that played it ends there (random games run on
    to fivefold repetition). Such a game's last record is the environment's, and the loader refuses a
    record labelled with the game's ending."""
    moves = ["g1f3", "g8f6", "f3g1", "f6g8"] * 3 + ["b1c3", "b8c6", "c3b1", "c6b8"]
    board = chess.Board()
    for m in moves:
        board.push_uci(m)
    assert board.outcome(claim_draw=False).termination == chess.Termination.FIVEFOLD_REPETITION
    game = {"game": 0, "kind": "random", "random_plies": 0, "moves": moves, "termination": "fivefold_repetition",
            "result": "1/2-1/2"}
    cfg = datagen.DatagenConfig(games=1, mate_games=0, env_rate=1.0, policy_rate=0.0)
    recs = [datagen.env_record(s) for sel in datagen.select_samples([game], cfg) for s in sel.env]
    last = next(r for r in recs if r["ply"] == len(moves) - 1 and r["kind"] == "legal")
    assert (last["reward"], last["terminated"], last["termination"]) == (0.001, 0, None)
    assert data.validate_record(last, "A") is None
    wrong = {**last, "reward": 0.5, "terminated": 1, "termination": "fivefold_repetition",
             "completion": tasks.env_completion(last["new_fen"], 0.5, 1, 0)}
    assert data.validate_record(wrong, "A") == (
        f"fields new_fen/reward/terminated/termination are {last['new_fen']!r}/0.5/1/'fivefold_repetition', but the "
        f"move gives {last['new_fen']!r}/0.001/0/None (tasks.environment_step: the position alone decides, so no "
        "repetition ends a game)")


SHARDED = dict(shard_size=5, compress=True, **TINY)


@pytest.fixture(scope="module")
def sharded_run(tmp_path_factory):
    """An uninterrupted sharded, compressed run: the reference of both tests below (made once)."""
    out = tmp_path_factory.mktemp("sharded")
    return out, datagen.generate(datagen.DatagenConfig(out_dir=str(out), **SHARDED), progress=False)


@needs_stockfish
def test_sharded_compressed_output_equals_one_plain_file_per_split(tmp_path, sharded_run):
    plain = datagen.generate(datagen.DatagenConfig(out_dir=str(tmp_path / "plain"), **TINY), progress=False)
    sh_dir, sharded = sharded_run
    assert sharded.counts == plain.counts
    for name, n in plain.counts.items():
        shards = data.data_files_of(name, sh_dir)
        assert [p.name for p in shards] == [data.data_file_name(name, k, True) for k in range(-(-n // 5))]
        assert b"".join(gzip.open(p).read() for p in shards) == (tmp_path / "plain" / name).read_bytes()
    assert data.summarize(sh_dir)["files"]["env_train.jsonl"]["records"] == plain.counts["env_train.jsonl"]
    assert len(data.load_split("P", "train", sh_dir)) == plain.counts["policy_train.jsonl"]


@pytest.mark.fault
@needs_stockfish
def test_sharded_run_interrupted_mid_write_resumes_without_losing_or_duplicating(tmp_path, monkeypatch, sharded_run):
    cfg = datagen.DatagenConfig(out_dir=str(tmp_path / "a"), **SHARDED)
    ref_dir, ref = sharded_run
    flushes, built = [], Counter()
    real_flush, real_env = datagen._Outputs._flush, datagen.env_record

    def flaky_flush(self, name, shard):
        real_flush(self, name, shard)
        flushes.append((name, shard))
        if len(flushes) == 6:
            raise KeyboardInterrupt("test interruption")

    monkeypatch.setattr(datagen._Outputs, "_flush", flaky_flush)
    with pytest.raises(KeyboardInterrupt):
        datagen.generate(cfg, progress=False)
    assert not list((tmp_path / "a").glob("*.jsonl*"))  # nothing published before the end
    monkeypatch.setattr(datagen._Outputs, "_flush", real_flush)
    monkeypatch.setattr(datagen, "env_record", lambda s: built.update([s["split"]]) or real_env(s))
    report = datagen.generate(cfg, progress=False)
    assert report.counts == ref.counts
    assert sum(built.values()) == ref.counts["env_train.jsonl"] + ref.counts.get("env_val.jsonl", 0) \
        + ref.counts.get("env_test.jsonl", 0) - 5 * 6  # the 6 finished shards were not built again
    for p in ref_dir.glob("*.jsonl*"):  # the data files (not the .lock, which names its run)
        assert (tmp_path / "a" / p.name).read_bytes() == p.read_bytes(), p.name


@needs_stockfish
def test_node_budget_labels_are_recorded_and_reproduced(tmp_path):
    cfg = datagen.DatagenConfig(out_dir=str(tmp_path), **{**TINY, "depth": None, "nodes": 2000, "keep_work": True})
    datagen.generate(cfg, progress=False)
    recs = data.load_split("P", "train", tmp_path)
    assert {r["limit"] for r in recs} == {"nodes=2000"}
    assert json.loads((tmp_path / ".datagen-work" / "config.json").read_text())["config"]["nodes"] == 2000
    sample = random.Random(0).sample(recs, 12)
    with EnginePool(EngineSettings(depth=None, nodes=2000, multipv=5), size=1, cache=False) as pool:
        for r in sample:  # python-chess at the recorded node budget gives the same label
            a = pool.analyse(r["fen"])
            assert (list(a.moves), [tasks.format_eval(e) for e in a.evals]) == (r["moves"], r["evals"]), r["id"]
    assert data.audit_policy_labels(sample) == []
    with pytest.raises(ValueError, match="set depth or nodes"):
        datagen.DatagenConfig(depth=None, nodes=None)


def test_extra_test_games_leave_train_and_val_alone():
    """Extra test games come after every other game, so they own no position that an earlier game
    reached, and the selection of the train/val games does not change."""
    # 10 games are one of each split's cycle (8 train, 1 val, 1 test): every random game starts from
    # the same position, so the extra test games meet positions that train and val games own
    base = datagen.DatagenConfig(games=10, mate_games=2, env_rate=0.5, policy_rate=0.5, max_plies=80)
    more = datagen.DatagenConfig(**{**vars(base), "test_games": 4})
    assert [datagen.split_of_game(i, more) for i in range(12, 16)] == ["test"] * 4
    assert not any(datagen.game_plan(i, more).get("mate_only") for i in range(12, 16))
    assert all(datagen.game_plan(i, more).get("mate_only") for i in range(10, 12))
    games = _random_games(more, 16)
    for g in games[10:12]:
        g["mate_only"] = True  # as play_game marks the mate games
    sel_base = list(datagen.select_samples(games[:12], base))
    sel_more = list(datagen.select_samples(games, more))
    assert sel_more[:12] == sel_base
    keys = {split: set() for split in data.SPLITS}
    for sel in sel_more:
        for s in sel.policy + sel.env:
            keys[s["split"]].add(tasks.position_key(s["fen"]))
    assert keys["train"] and keys["val"] and keys["test"]
    assert not (keys["test"] & keys["train"]) and not (keys["test"] & keys["val"])
    assert any(s["game"] >= 12 for sel in sel_more for s in sel.env)


@pytest.mark.parametrize("kwargs, field", [(dict(shard_size=-1), "shard_size"), (dict(test_games=-2), "test_games"),
                                           (dict(compress="yes"), "compress")])
def test_new_settings_reject_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"DatagenConfig.{field}"):
        datagen.DatagenConfig(**kwargs)


def test_validate_reads_compressed_shards_and_names_a_corrupt_one(tmp_path, capsys):
    recs = data.load_split("A", "val")[:3]
    with gzip.open(tmp_path / "env_val-00000.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)
    (tmp_path / "env_val-00001.jsonl.gz").write_bytes(gzip.compress(json.dumps(recs[0]).encode() + b"\n")[:-6])  # truncated
    assert datagen.cli(["--validate", "--out", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert "env_val-00000.jsonl.gz: 3 records OK" in out
    assert "env_val-00001.jsonl.gz: cannot read" in err
    (tmp_path / "env_val-00001.jsonl.gz").unlink()
    assert [r["id"] for r in data.load_split("A", "val", tmp_path)] == [r["id"] for r in recs]


def test_exclude_dir_keeps_the_shipped_held_out_positions_out_of_every_split():
    """More training data for a model evaluated on the shipped test split: with exclude_dir, no
    sampled record (P:, A:, mate) sits on a position of the shipped val or test files, and the rest of
    the selection is what it would have been (the same games, the same positions otherwise)."""
    shipped = {split: {tasks.position_key(r["fen"]) for t in ("P", "A") for _, r, _ in read_jsonl(data.data_file(t, split))}
               for split in ("val", "test")}  # as on disk: test_data.py validates these files
    held = datagen.heldout_positions(data.DATA_DIR)
    assert held >= shipped["val"] | shipped["test"]
    # 16 games (all three splits): the six opening lines and two of the random games reach shipped
    # held-out positions, the rest of the selection is thousands of samples that must stay as they were
    base = datagen.DatagenConfig(games=16, mate_games=0, env_rate=1.0, policy_rate=0.5, max_plies=60, seed=7)
    excl = datagen.DatagenConfig(**{**vars(base), "exclude_dir": str(data.DATA_DIR)})
    games = _random_games(base, 16)
    for g in games[:6]:  # random games rarely reach the shipped positions; six short opening lines do
        g["moves"] = ["e2e4", "e7e5", "g1f3", "b8c6"][:2 + g["game"] % 3]
    plain = [s for sel in datagen.select_samples(games, base) for s in sel.policy + sel.env + sel.mate]
    kept = [s for sel in datagen.select_samples(games, excl) for s in sel.policy + sel.env + sel.mate]
    hit = [s for s in plain if tasks.position_key(s["fen"]) in held]
    assert hit and {s["game"] for s in hit} - set(range(6)), "the check needs samples on held-out positions to remove"
    assert not [s for s in kept if tasks.position_key(s["fen"]) in held]
    strip = lambda rows: [(s["split"], s["game"], s["fen"], s.get("move")) for s in rows]  # noqa: E731
    assert strip(kept) == strip([s for s in plain if tasks.position_key(s["fen"]) not in held])
    with pytest.raises(ValueError, match="DatagenConfig.exclude_dir .* holds no val/test data files"):
        datagen.heldout_positions(data.DATA_DIR / "nope")


def test_one_position_reached_with_and_without_a_double_push_belongs_to_one_split():
    """1.e4 e5 2.Nf3 (game 0: train) and 1.Nf3 e5 2.e4 (game 9: test) reach one position, which the
    game with the double push spells with an en-passant square no pawn can take on: it is sampled in
    the split that reached it first, never in both (keys taken as written put it in both)."""
    cfg = datagen.DatagenConfig(games=10, mate_games=0, policy_rate=1.0, env_rate=1.0, illegal_rate=0.0)
    games = [{"game": 0, "kind": "selfplay", "moves": ["e2e4", "e7e5", "g1f3", "b8c6"]},
             {"game": 9, "kind": "selfplay", "moves": ["g1f3", "e7e5", "e2e4", "b8c6"]}]
    assert [datagen.split_of_game(g["game"], cfg) for g in games] == ["train", "test"]
    splits: dict[str, set] = {}
    for sel in datagen.select_samples(games, cfg):
        for s in sel.policy + sel.env:
            splits.setdefault(tasks.normalized_fen(s["fen"]).rsplit(" ", 2)[0], set()).add(s["split"])
    after_e4 = "rnbqkbnr/pppp1ppp/8/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R b KQkq -"
    assert splits[after_e4] == {"train"} and all(len(v) == 1 for v in splits.values()), splits


def test_exclude_dir_spelled_as_the_original_data_still_excludes_its_positions(tmp_path):
    """A converted original test split writes the position after 1.e4 as python-chess does (no en-passant
    square); datagen's games write e3. Excluded, it is sampled into no split."""
    from rookworld_lib.chess import convert
    board = chess.Board()
    board.push_uci("e2e4")
    line = f"P: {board.fen():90}M: {'e7e5 c7c5 e7e6 c7c6 d7d5':30}E: {'-0.3 -0.35 -0.4 -0.45 -0.5':40}B: d7d5"
    (tmp_path / "rook.txt").write_text(line + "\n")
    assert convert.convert([tmp_path / "rook.txt"], tmp_path / "orig", split="test").written == {"P": 1}
    cfg = datagen.DatagenConfig(games=10, mate_games=0, policy_rate=1.0, env_rate=1.0, illegal_rate=0.0,
                                exclude_dir=str(tmp_path / "orig"))
    game = {"game": 0, "kind": "selfplay", "moves": ["e2e4", "e7e5", "g1f3"]}
    sampled = [s["fen"] for sel in datagen.select_samples([game], cfg) for s in sel.policy + sel.env]
    assert len(sampled) == 4 and not [f for f in sampled if tasks.same_position(f, board.fen())], sampled


def test_a_bad_exclude_dir_stops_datagen_before_anything_is_written(tmp_path, capsys):
    """Checked up front, not once games are played: a corrected command then starts clean (it was refused
    as 'an interrupted run with other settings')."""
    from rookworld_lib.lab.cli import main

    out = tmp_path / "out"
    assert main(["datagen", "--games", "2", "--mate-games", "0", "--no-progress", "--out", str(out),
                 "--exclude-dir", str(tmp_path / "nope")]) == 1
    assert "DatagenConfig.exclude_dir (--exclude-dir) " in capsys.readouterr().err and not out.exists()
    gap = tmp_path / "gap"  # a held-out set that lost a shard: its positions would leak into the new data
    gap.mkdir()
    (gap / "policy_val-00001.jsonl").write_text((data.DATA_DIR / "policy_val.jsonl").read_text())
    assert main(["datagen", "--games", "2", "--mate-games", "0", "--no-progress", "--out", str(out),
                 "--exclude-dir", str(gap)]) == 1
    assert "policy_val-00000.jsonl: missing shard" in capsys.readouterr().err and not out.exists()


# ------------------------------------------------------------------------------------------
# Datagen's lean UCI client (LeanPool): python-chess's labels and moves, the pool's faults
# ------------------------------------------------------------------------------------------

@needs_stockfish
@pytest.mark.fault
@pytest.mark.parametrize("limit", [dict(depth=6), dict(depth=None, nodes=3000)])
def test_lean_labels_equal_python_chess_analysis_even_when_engines_are_killed(limit):
    """Same candidates, evals (mates for both colours included), limit and depth; a position without
    moves gets no label. Engines killed mid-run are replaced, and no process is left."""
    boards = random_positions(40, seed=51, max_plies=120)
    boards += [chess.Board("6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1"), chess.Board("r5k1/8/8/8/8/8/5PPP/6K1 b - - 0 1"),
               chess.Board("7k/5Q2/6K1/8/8/8/8/8 b - - 0 1")]  # mate in 1 for white, for black; stalemate
    fens = [b.fen(en_passant="fen") for b in boards]
    settings = EngineSettings(**limit, multipv=5)
    pool, killed, got = LeanPool(settings, size=2), [], {}

    def on_result(i, analysis):
        got[i] = analysis
        if len(killed) < 3 and i % 7 == 3:
            with pool._lock:
                pids = [p.proc.pid for p in pool._live if not p.dead]
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                killed.append(pids[0])

    pool.label_many(fens, on_result=on_result)
    pids = [p.proc.pid for p in pool._live]
    pool.close()
    assert killed and wait_gone(killed + pids, timeout=10) == []
    with EnginePool(settings, size=1, cache=False) as ref:
        expected = [ref.analyse(f) for f in fens]
    assert [got[i] for i in range(len(fens))] == expected
    assert expected[-3].evals[0] == Eval(mate=1) and expected[-2].evals[0] == Eval(mate=1)
    assert expected[-1].moves == ()
    with pytest.raises(ValueError, match="reproducible"):
        LeanPool(EngineSettings(depth=None, time=0.1), size=1).label_many(fens[:1])


@needs_stockfish
@pytest.mark.parametrize("nodes", [1, 64, 2048])
def test_lean_sessions_play_python_chess_sessions_moves(nodes):
    """Same commands (a cleared hash at the start, the game's history with every search), so the
    same moves, game after game on one process."""
    def game(pool, seed):
        rng, b = random.Random(seed), chess.Board()
        with pool.session() as s:
            while len(b.move_stack) < 40 and not b.is_game_over():
                b.push(rng.choice(list(b.legal_moves)) if rng.random() < 0.2 else s.play(b, chess.engine.Limit(nodes=nodes)))
        return [m.uci() for m in b.move_stack]

    with LeanPool(EngineSettings(), size=1) as lean, EnginePool(EngineSettings(), size=1, cache=False) as pool:
        assert [game(lean, seed) for seed in range(3)] == [game(pool, seed) for seed in range(3)]
        assert len(lean._live) == 1  # one process, kept between games


@needs_stockfish
@pytest.mark.fault
def test_lean_session_lost_when_its_engine_dies():
    with LeanPool(EngineSettings(), size=1) as pool:
        with pytest.raises(EngineSessionLost):
            with pool.session() as s:
                os.kill(pool._live[0].proc.pid, signal.SIGKILL)
                s.play(chess.Board(), chess.engine.Limit(nodes=64))
        assert pool._live == []
        with pool.session() as s:  # a fresh process replaces it
            assert s.play(chess.Board(), chess.engine.Limit(nodes=64)) in chess.Board().legal_moves
        pid = pool._live[0].proc.pid  # killed while idle between games: the next session says so
        os.kill(pid, signal.SIGKILL)
        assert wait_gone([pid]) == []
        with pytest.raises(EngineSessionLost):
            with pool.session():
                pass
        with pool.session() as s:
            assert s.play(chess.Board(), chess.engine.Limit(nodes=64)) in chess.Board().legal_moves
    with pytest.raises(EngineFailedError, match="closed"):
        with pool.session():
            pass


class _FirstMoveSession:
    """A stand-in engine session: plays the first legal move in UCI order and records (ply, nodes) of each call."""

    def __init__(self):
        self.calls = []

    def play(self, board, limit):
        self.calls.append((board.ply(), limit.nodes))
        return min(board.legal_moves, key=lambda m: m.uci())


def test_an_opening_game_plays_its_random_plies_then_each_colour_at_its_own_node_budget():
    """data/README.md: an opening game's first `random_plies` half-moves are random, and from then on (no noise)
    every move is the engine's, at the node budget of the side to move: engine calls from ply 3, 32 nodes for
    white and 512 for black."""
    cfg = datagen.DatagenConfig(games=1, mate_games=0, max_plies=20)
    session = _FirstMoveSession()
    plan = {"kind": "opening", "random_plies": 3, "nodes": [32, 512], "noise": [0.0, 0.0]}
    game = datagen._play(0, cfg, plan, session)
    assert len(game["moves"]) == 20
    assert session.calls == [(ply, 32 if ply % 2 == 0 else 512) for ply in range(3, 20)]


def test_the_noise_of_a_colour_makes_only_that_colours_moves_random():
    """Noise is per colour (data/README.md: each colour its own nodes and noise): with white's at 1 and black's
    at 0, the engine plays every black move, at black's 128 nodes, and no white one."""
    cfg = datagen.DatagenConfig(games=1, mate_games=0, max_plies=16)
    session = _FirstMoveSession()
    plan = {"kind": "selfplay", "random_plies": 0, "nodes": [8, 128], "noise": [1.0, 0.0]}
    game = datagen._play(0, cfg, plan, session)
    assert len(game["moves"]) == 16
    assert session.calls == [(ply, 128) for ply in range(1, 16, 2)]


def test_a_game_whose_engine_dies_is_replayed_on_a_fresh_one():
    """play_game replays a game from the start when its engine is lost mid-game (EngineSessionLost): a pool
    whose first session is lost finishes the game on its second; one always lost ends in "kept dying" after
    more than two tries."""
    cfg = datagen.DatagenConfig(games=10, mate_games=0, max_plies=6)
    index = next(i for i in range(10) if datagen.game_plan(i, cfg)["kind"] != "random")

    class Pool:
        sessions = 0

        @contextlib.contextmanager
        def session(self):
            Pool.sessions += 1
            if Pool.sessions == 1:
                raise EngineSessionLost("killed")
            yield _FirstMoveSession()

    game = datagen.play_game(index, cfg, Pool())
    assert Pool.sessions == 2 and len(game["moves"]) == 6

    class Dead:
        sessions = 0

        @contextlib.contextmanager
        def session(self):
            Dead.sessions += 1
            raise EngineSessionLost("killed")
            yield

    with pytest.raises(EngineFailedError, match="kept dying"):
        datagen.play_game(index, cfg, Dead())
    assert Dead.sessions > 2


@needs_stockfish
def test_a_game_whose_engine_the_interrupt_killed_is_neither_said_to_fail_nor_replayed(monkeypatch, caplog):
    """Ctrl-C closes the pool, which kills the game's engine: the game logged "Stockfish failed during a
    session ...; replaying it on a fresh engine" (4 of 4 tries), though nothing failed and nothing was replayed."""
    cfg = datagen.DatagenConfig(games=4, mate_games=0, max_plies=40)
    index = next(i for i in range(cfg.games) if datagen.game_plan(i, cfg)["kind"] != "random")
    play = datagen.UciAnalyser.play

    def interrupted(self, board, limit):  # the pool closed (as by Ctrl-C) during the game's first search
        pool.close()
        return play(self, board, limit)

    monkeypatch.setattr(datagen.UciAnalyser, "play", interrupted)
    with LeanPool(EngineSettings(), size=1) as pool:
        with pytest.raises(EngineFailedError, match="closed"):
            datagen.play_game(index, cfg, pool)
    assert "replaying" not in caplog.text and "failed" not in caplog.text


HUNG_ENGINE = """import os, sys, time
for line in sys.stdin:
    cmd = (line.split() or [""])[0]
    if cmd == "uci":
        print(*(f"option name {o} type spin default 1 min 1 max 1024" for o in ("Threads", "Hash", "MultiPV")),
              "uciok", sep="\\n", flush=True)
    elif cmd == "isready":
        print("readyok", flush=True)
    elif cmd == "go":  # hung in a search, deaf to its closed stdin
        open(os.path.join(sys.argv[1], str(os.getpid())), "w").close() or time.sleep(60)
"""


@pytest.mark.fault
def test_a_hung_engine_behind_a_wrapper_script_is_killed_with_its_child(tmp_path, monkeypatch):
    """A shell script runs the engine, hung in a search, as its child, which keeps the pipes open
    when the script is killed: every search still fails within seconds, and the lean client and
    python-chess's pool (each engine in a process group of its own, killed as a group) kill the child too."""
    marker = tmp_path / "searching"
    marker.mkdir()
    (tmp_path / "hung.py").write_text(HUNG_ENGINE)
    wrapper = tmp_path / "stockfish.sh"
    # no exec: a child; -S: no site-packages to scan, so it starts in milliseconds, well inside the limits
    wrapper.write_text(f"#!/bin/sh\n{sys.executable} -S {tmp_path / 'hung.py'} {marker}\nexit $?\n")
    wrapper.chmod(0o755)
    monkeypatch.setattr(engine, "TIMEOUT_FLOOR_S", 0.5)  # engine start and search limits: 0.5 s + the budget,
    monkeypatch.setattr(engine, "SLOW_NODES_PER_S", 1e8)  # and the budget of a depth-8 search next to nothing
    settings = EngineSettings(path=str(wrapper), max_retries=1)
    t0 = time.monotonic()
    with LeanPool(settings, size=1) as pool:
        with pytest.raises(EngineFailedError, match="every attempt while labelling"):
            pool.label_many([chess.STARTING_FEN])
    with LeanPool(settings, size=1) as pool:
        with pytest.raises(EngineSessionLost):
            with pool.session() as s:
                s.play(chess.Board(), chess.engine.Limit(nodes=64))
    children = [int(p) for p in os.listdir(marker)]
    assert len(children) == 3 and wait_gone(children, timeout=5) == []
    with EnginePool(settings, size=1, cache=False) as pool:
        with pytest.raises(EngineFailedError, match="every attempt during analyse"):
            pool.analyse(chess.STARTING_FEN)
    assert time.monotonic() - t0 < 30
    pooled = {int(p) for p in os.listdir(marker)} - set(children)
    assert len(pooled) == 2 and wait_gone(pooled, timeout=5) == []  # the first try and its one retry


def test_data_generation_conversion_and_the_command_import_no_torch():
    """datagen and convert (and their worker processes) stay light: their lock is core.paths', not the
    trainer's module; the `rookworld` command's errors live in core.errors; so importing them (and
    `rookworld --help`) loads no torch."""
    import subprocess
    import sys

    code = ("import sys, rookworld_lib.chess.datagen, rookworld_lib.chess.convert, rookworld_lib.lab.cli; "
            "print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_every_en_passant_position_is_a_p_sample_and_mate_games_are_held_out():
    from rookworld_lib.chess import datagen as dg

    # data/README.md ("Sampling"): P: samples at all positions with a legal en-passant capture or promotion
    moves = ["e2e4", "a7a6", "e4e5", "d7d5", "e5d6", "a6a5"]
    game = {"game": 9, "kind": "selfplay", "moves": moves}
    (sel,) = dg.select_samples([game], dg.DatagenConfig(games=10, mate_games=0, policy_rate=0.0001, env_rate=0.0001,
                                                        illegal_rate=0.0))
    board = chess.Board()
    for m in moves[:4]:
        board.push_uci(m)
    assert any(m.uci() == "e5d6" and board.is_en_passant(m) for m in board.legal_moves)  # exd6 e.p.
    assert board.fen() in [s["fen"] for s in sel.policy]
    # the mate games (indices games .. games + mate_games - 1) are val/test only, from the first one on
    cfg = dg.DatagenConfig(games=320)
    assert [dg.split_of_game(i, cfg) for i in (318, 319, 320, 321)] == ["val", "test", "test", "test"]


def test_mate_in_one_positions_come_only_from_val_and_test_games():
    """data/README.md: every position of a val/test game with a mate in one is a mate-in-one sample; a train
    game's are not (the set is held out). Scholar's mate, its mate in one checked with mating_moves: none from
    game 0 (train), the position before Qxf7# from games 8 (val) and 9 (test)."""
    scholar = ["e2e4", "e7e5", "f1c4", "b8c6", "d1h5", "g8f6", "h5f7"]
    board = chess.Board()
    for m in scholar[:-1]:
        board.push_uci(m)
    assert "h5f7" in datagen.mating_moves(board)
    cfg = datagen.DatagenConfig(games=10, mate_games=0, policy_rate=0.0, env_rate=0.0, illegal_rate=0.0)
    for index, split in ((0, "train"), (8, "val"), (9, "test")):
        (sel,) = datagen.select_samples([{"game": index, "kind": "selfplay", "moves": scholar}], cfg)
        mates = [(s["split"], s["ply"], s["mating_moves"]) for s in sel.mate]
        assert mates == ([] if split == "train" else [(split, 6, ["h5f7"])]), split
