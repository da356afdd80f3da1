"""The original RookWorld formats and `rookworld convert`, on fixtures written here by the original
generators' rules (jorahn/RookWorld dev/data: rook/generate_*.py, arbiter/generate_rollouts.py and
make_dataset.py, rookworld.py), with an independent parser in the style of its evaluation scripts."""

from __future__ import annotations

import gzip
import json
import random
import subprocess
import sys

import chess
import chess.engine
import pytest

from rookworld_lib.lab.cli import main
from rookworld_lib.chess import convert, data, evaluate, rewards, tasks, training
from rookworld_lib.core.tokenizer import get_tokenizer

ENC = get_tokenizer()


# --------------------------------------------------------------------------------------------
# Fixtures, written as the original generators wrote them (f-strings, python-chess, no library code)
# --------------------------------------------------------------------------------------------

def original_policy_line(board: chess.Board, rng: random.Random, fen_width: int = 90, mate: int | None = None) -> str:
    """A rook line: multipv-ordered candidates (best first for the side to move), evals as
    str(score(mate_score=100000) / 100), pairs shuffled, B: = first for white, last for black."""
    legal = sorted(m.uci() for m in board.legal_moves)
    moves = rng.sample(legal, min(5, len(legal)))
    scores = sorted((rng.randint(-900, 900) for _ in moves), reverse=True)
    povs = [chess.engine.Cp(s) for s in scores]
    if mate is not None:
        povs[0] = chess.engine.Mate(mate)
        povs.sort(key=lambda s: s.score(mate_score=100000), reverse=True)
    evals = [str(s.score(mate_score=100000) / 100) for s in povs]
    fen = board.fen(en_passant="fen") if rng.random() < 0.5 else board.fen()  # both conventions occur
    combined = list(zip(moves, evals))
    rng.shuffle(combined)
    shuffled_moves, shuffled_evals = zip(*combined)
    best = moves[-1] if board.turn == chess.BLACK else moves[0]
    fen_part = f"P: {fen:{fen_width}}"
    return fen_part + f"M: {' '.join(shuffled_moves):30}" + f"E: {' '.join(shuffled_evals):40}" + f"B: {best}"


def original_env_line(board: chess.Board, action: str, recent: list[str], prefix: bool) -> str:
    """An arbiter row: board.fen() before and after, board.push without a legality check,
    reward 1.0 / 0.5 / 0.001 / -1.0 from outcome(), flags as ints; rookworld sets add 'A: '."""
    previous_state = board.fen()
    board = board.copy()
    illegal = False
    try:
        board.push(chess.Move.from_uci(action))
    except (ValueError, AssertionError):
        illegal = True
    outcome = board.outcome()
    reward = (1.0 if outcome.winner is not None else 0.5) if outcome is not None else 0.001
    reward = -1.0 if illegal else reward
    text = f"{previous_state}+{action}+{' '.join(recent)}+{board.fen()}+{reward}+{int(board.is_game_over())}+{int(illegal)}"
    return ("A: " + text) if prefix else text


def independent_policy_parse(line: str) -> tuple[str, list[str], list[float], str]:
    """As the original rook_accuracy.py splits a line."""
    p, m = line.split("M: ", 1)
    m, e = m.split("E: ", 1)
    e, b = e.split("B: ", 1)
    return p.split("P: ")[1].strip(), m.split(), [float(x) for x in e.split()], b.strip()


def random_board(rng: random.Random, plies: int) -> chess.Board:
    board = chess.Board()
    for _ in range(plies):
        if board.is_game_over():
            break
        board.push(rng.choice(list(board.legal_moves)))
    return board


def policy_fixtures() -> list[str]:
    rng = random.Random(7)
    lines = []
    for k in range(24):
        board = random_board(rng, rng.randint(0, 40))
        if board.is_game_over():
            continue
        lines.append(original_policy_line(board, rng, fen_width=90 if k % 2 else 89,
                                          mate=[None, 15, -3, 1][k % 4]))
    return lines


# A double push with a legal en-passant capture (e5 pawn can take d6) and one without.
EP_POSSIBLE = chess.Board("rnbqkbnr/1ppppppp/p7/4P3/8/8/PPPP1PPP/RNBQKBNR b KQkq - 0 2")  # ...d7d5, then e5xd6 is legal
EP_IMPOSSIBLE = chess.Board()  # 1. c2c4: no black pawn can take


def env_fixtures() -> list[tuple[str, bool]]:
    """(line, expected to convert)."""
    out = []
    for prefix in (True, False):
        out.append((original_env_line(EP_POSSIBLE, "d7d5", ["e4e5", "d7d5"], prefix), True))
        out.append((original_env_line(EP_IMPOSSIBLE, "c2c4", ["c2c4"], prefix), True))
        mate = chess.Board("6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1")
        out.append((original_env_line(mate, "a1a8", ["a1a8"], prefix), True))
        out.append((original_env_line(chess.Board(), "e2e5", ["e2e5"], prefix), False))  # illegal, pushed anyway
    out.append(("4k3/8/8/8/8/8/8/8 w - - 0 1+a2a3+a2a3+4k3/8/8/8/8/8/8/8 b - - 0 1+0.001+0+0", False))  # no king
    return out


def written_back(parsed: convert.OriginalPolicyLine | convert.OriginalEnvLine) -> str:
    """A line convert parsed, written back in the original layout by the library's builders (python-chess's
    FENs in A: lines, the same prefix, the P: pairs in the line's order and its FEN width)."""
    if isinstance(parsed, convert.OriginalPolicyLine):
        return "".join(tasks.policy_text(parsed.fen, parsed.moves, parsed.evals, parsed.best, "original",
                                         shuffle=False, fen_width=parsed.fen_width))
    a = parsed.answer
    prompt = tasks.env_prompt(tasks.original_fen(parsed.fen), parsed.move, parsed.history)
    completion = tasks.env_completion(tasks.original_fen(a.new_fen), a.reward, a.terminated, a.truncated)
    return (prompt if parsed.prefixed else prompt.removeprefix("A: ")) + completion


# --------------------------------------------------------------------------------------------
# Evals
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,mate", [("999.85", 15), ("-999.97", -3), ("999.99", 1), ("-999.99", -1), ("999.0", 100)])
def test_original_mate_spelling_is_read_and_written(text, mate):
    e = tasks.parse_eval(text)
    assert e == tasks.Eval(mate=mate)
    assert tasks.format_eval(e, "original") == text
    assert tasks.format_eval(e) == (f"M{mate}" if mate > 0 else f"-M{-mate}")
    # the original generator's own arithmetic
    assert str(chess.engine.Mate(mate).score(mate_score=100000) / 100) == text


def test_original_pawns_equal_python_float_text_and_impossible_values_are_refused():
    for cp in (-230, 360, 408, 0, 7, -1, 12345):
        assert tasks.format_eval(tasks.Eval(cp=cp), "original") == str(cp / 100)
        assert tasks.parse_eval(str(cp / 100)) == tasks.Eval(cp=cp)
    assert tasks.parse_eval("600.0") is None  # neither pawns (> 500) nor a mate (< 900)
    assert tasks.parse_eval("-1000.0") is None  # "mated in 0": not a candidate eval


# --------------------------------------------------------------------------------------------
# P: lines
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("line", policy_fixtures())
def test_policy_line_parses_writes_back_and_tokenizes(line):
    ours = convert.parse_policy_line(line)
    assert not isinstance(ours, str), ours
    fen, moves, evals, best = independent_policy_parse(line)
    assert (ours.fen, list(ours.moves), ours.best) == (fen, moves, best)
    assert [tasks.parse_eval(e).to_cp() / 100 for e in ours.evals] == evals
    assert ours.fen_width == line.index("M: ") - 3
    assert written_back(ours) == line  # the original layout written back, byte for byte
    prompt, completion = tasks.split_policy_text(line)
    assert ENC.encode_ordinary(prompt) + ENC.encode_ordinary(completion) == ENC.encode_ordinary(line)
    assert prompt == tasks.policy_prompt(fen, "original", fen_width=ours.fen_width)


@pytest.mark.parametrize("line", policy_fixtures()[:8])
def test_policy_record_orders_candidates_by_eval_and_keeps_the_original_label(line):
    fen, moves, evals, best = independent_policy_parse(line)
    rec = convert.convert_line(line, ident="t", split="test")
    assert data.validate_record(rec, "P") is None
    by_eval = [m for _, m in sorted(zip(evals, moves), key=lambda p: -p[0])]
    assert rec["moves"][0] == by_eval[0] and rec["best"] == by_eval[0]
    assert rec["original_best"] == best
    black = fen.split()[1] == "b"
    # the original label is the worst listed move for black, the best for white
    assert best == (by_eval[-1] if black else by_eval[0]) or evals[moves.index(best)] == (min(evals) if black else max(evals))
    # the record renders back in either layout, tokenization-safe
    for layout in tasks.LAYOUTS:
        p, c = data.record_text(rec, layout)
        assert ENC.encode_ordinary(p) + ENC.encode_ordinary(c) == ENC.encode_ordinary(p + c)
        assert tasks.parse_policy(p + c).ok


def test_a_white_lines_b_comes_first_among_moves_tied_at_the_top():
    """The original lines shuffle their (move, eval) pairs; for white B: is Stockfish's first choice, so
    of five moves at 0.0 (RookWorld's rook_val_500, line 4, has such a line) B: is the converted best, not
    the first of the shuffled ones. For black B: is the worst move and decides nothing."""
    fen = chess.STARTING_FEN
    line = f"P: {fen:90}M: {'a2a3 b2b3 c2c3 d2d3 e2e3':30}E: {'0.0 0.0 0.0 0.0 0.0':40}B: d2d3"
    rec = convert.convert_line(line, ident="t", split="test")
    assert (rec["best"], rec["moves"][0], rec["original_best"]) == ("d2d3", "d2d3", "d2d3")
    assert data.validate_record(rec, "P") is None
    black = chess.Board()
    black.push_uci("e2e4")
    line = f"P: {black.fen():90}M: {'a7a6 b7b6 c7c6 d7d6 e7e6':30}E: {'0.3 0.3 0.3 0.3 0.3':40}B: e7e6"
    assert convert.convert_line(line, ident="t", split="test")["best"] == "a7a6"  # the stable order


def test_a_line_listing_an_illegal_move_is_refused():
    fen = chess.STARTING_FEN  # e2e5: a pawn cannot advance three squares (python-chess agrees)
    assert not chess.Board(fen).is_legal(chess.Move.from_uci("e2e5"))
    line = f"P: {fen:90}M: {'a2a3 e2e5 c2c3 d2d3 e2e3':30}E: {'0.1 0.3 0.0 -0.5 0.2':40}B: e2e5"
    assert convert.convert_line(line, ident="t", split="test") == "M: move 'e2e5' is not legal in this position"


def test_the_mate_tag_comes_from_the_best_candidate_not_the_first_listed():
    # the original lines shuffle their pairs; 999.99 pawns spells mate in 1 (100000 - 1 centipawns)
    fen = chess.STARTING_FEN
    mate_second = convert.convert_line(f"P: {fen:90}M: {'a2a3 b2b3 c2c3 d2d3 e2e3':30}E: {'0.1 999.99 0.0 -0.5 0.2':40}"
                                       "B: b2b3", ident="t", split="test")
    assert mate_second["best"] == "b2b3" and mate_second["evals"][0] == "M1" and "mate" in mate_second["tags"]
    mated_first = convert.convert_line(f"P: {fen:90}M: {'a2a3 b2b3 c2c3 d2d3 e2e3':30}E: {'-999.99 0.1 0.0 -0.5 0.2':40}"
                                       "B: e2e3", ident="t", split="test")
    assert mated_first["best"] == "e2e3" and mated_first["evals"][-1] == "-M1" and "mate" not in mated_first["tags"]


# --------------------------------------------------------------------------------------------
# A: lines
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("line,ok", env_fixtures())
def test_env_line_converts_or_says_why(line, ok):
    res = convert.convert_line(line, ident="t")
    if not ok:
        assert isinstance(res, str) and res
        return
    assert isinstance(res, dict), res
    assert data.validate_record(res, "A") is None
    parts = line.removeprefix("A: ").split("+")  # independent parse
    assert (res["fen"], res["move"], " ".join(res["history"])) == tuple(parts[:3])
    assert tasks.same_position(res["new_fen"], parts[3])
    assert (res["reward"], res["terminated"], res["truncated"]) == (float(parts[4]), int(parts[5]), int(parts[6]))
    parsed = convert.parse_env_line(line)
    assert written_back(parsed) == line  # written back as the original did
    prompt, completion = data.record_text(res, "original")
    full = "A: " + line.removeprefix("A: ")
    assert prompt + completion == full
    assert ENC.encode_ordinary(prompt) + ENC.encode_ordinary(completion) == ENC.encode_ordinary(full)


def test_impossible_rows_name_their_reason():
    no_king = env_fixtures()[-1][0]
    assert convert.convert_line(no_king).startswith("impossible position")
    illegal = original_env_line(chess.Board(), "e2e5", ["e2e5"], True)
    assert "legality" in convert.convert_line(illegal)
    # a promotion without its piece, pushed unchecked: a pawn left on the back rank, said as the pushed
    # illegal move it is (not only as the impossible FEN it made), in words
    pawn = chess.Board("8/4P3/8/8/8/8/k7/4K3 w - - 3 40")
    assert convert.convert_line(original_env_line(pawn, "e7e8", ["e7e8"], True)) == (
        "illegal move pushed without a legality check (the original generator's board.push): new FEN: FEN is not a "
        "legal chess position (pawns on backrank)")


# --------------------------------------------------------------------------------------------
# Positions, not strings
# --------------------------------------------------------------------------------------------

def _after(board: chess.Board, uci: str) -> chess.Board:
    b = board.copy()
    b.push_uci(uci)
    return b


def test_same_position_ignores_only_the_en_passant_spelling():
    no_capture = _after(EP_IMPOSSIBLE, "c2c4")
    assert no_capture.fen() != no_capture.fen(en_passant="fen")
    assert tasks.same_position(no_capture.fen(), no_capture.fen(en_passant="fen"))
    capture = _after(EP_POSSIBLE, "d7d5")
    assert capture.fen() == capture.fen(en_passant="fen")  # d6 is written either way
    without = capture.fen().replace(" d6 ", " - ")
    assert not tasks.same_position(capture.fen(), without)  # the capture right differs: another position
    assert not tasks.same_position("garbage", "garbage")


def _env_case(board: chess.Board, move: str):
    t = tasks.environment_step(board.fen(en_passant="fen"), move, [])
    after = _after(board, move)
    wrong = _after(board, next(m.uci() for m in board.legal_moves if m.uci() != move))
    truth_spellings = [after.fen(), after.fen(en_passant="fen")]
    return t, truth_spellings, wrong


@pytest.mark.parametrize("board,move", [(EP_IMPOSSIBLE, "c2c4"), (EP_POSSIBLE, "d7d5"), (chess.Board(), "g1f3")])
def test_env_reward_full_credit_for_either_convention_and_less_for_other_positions(board, move):
    t, spellings, wrong = _env_case(board, move)
    for truth in (t, {"new_fen": t.new_fen.replace(" c3 ", " - "), "reward": t.reward,
                      "terminated": t.terminated, "truncated": t.truncated}):
        for fen in spellings:
            assert rewards.score_environment(t.prompt, f"{fen}+0.001+0+0", truth=truth) == 1.0
        others = [wrong.fen(), wrong.fen(en_passant="fen")]
        if spellings[0].split()[3] != "-":  # where a legal capture exists, dropping it is another position
            others.append(spellings[0].replace(f" {spellings[0].split()[3]} ", " - "))
        for fen in others:
            assert rewards.score_environment(t.prompt, f"{fen}+0.001+0+0", truth=truth) < 1.0


def test_next_fen_exact_metric_counts_positions(monkeypatch):
    t, spellings, wrong = _env_case(EP_IMPOSSIBLE, "c2c4")
    rec = {"task": "A", "fen": t.fen, "move": t.move, "history": list(t.history), "new_fen": t.new_fen,
           "reward": t.reward, "terminated": 0, "truncated": 0}
    completions = [f"{fen}+0.001+0+0" for fen in spellings] + [f"{wrong.fen()}+0.001+0+0"]
    monkeypatch.setattr(evaluate, "complete", lambda model, prompts, cfg: completions[: len(prompts)])
    res = evaluate.evaluate_environment(None, [rec, rec, rec], evaluate.EvalConfig(layout="compact", samples=0))
    assert res["env/next_fen_exact"].value == pytest.approx(2 / 3)


# --------------------------------------------------------------------------------------------
# Files and the command
# --------------------------------------------------------------------------------------------

def write_original_files(tmp_path):
    pol = tmp_path / "rook_val.txt"
    pol.write_text("\n".join(policy_fixtures()) + "\n")
    env = tmp_path / "arbiter_test.jsonl"  # a data set's JSON lines export, 'text' column
    env.write_text("".join(json.dumps({"text": line}) + "\n" for line, _ in env_fixtures()))
    return pol, env


def test_convert_files_writes_loadable_records_and_reports_every_bad_line(tmp_path):
    pol, env = write_original_files(tmp_path)
    out = tmp_path / "converted"
    report = convert.convert([pol, env], out, split="test", workers=2, chunk_lines=3)
    n_env_ok = sum(ok for _, ok in env_fixtures())
    assert report.written == {"P": len(policy_fixtures()), "A": n_env_ok}
    assert report.lines == len(policy_fixtures()) + len(env_fixtures())
    assert report.errors == len(env_fixtures()) - n_env_ok and sum(report.reasons.values()) == report.errors
    errors = (out / "convert_errors_test.txt").read_text().splitlines()
    assert len(errors) == report.errors and all(e.startswith(f"{env}:") for e in errors)
    assert data.load_split("P", "test", out).records[0]["source"] == "original"
    assert len(data.load_split("A", "test", out)) == n_env_ok


def test_gzipped_inputs_and_padded_lines_convert_as_the_plain_ones_and_a_broken_gzip_is_named(tmp_path, capsys):
    """.txt.gz and .jsonl.gz read as their inner kind (they were read as text: every line an error), and
    padding after a line's last field is its end, as CRLF is (it refused every padded line, blaming the
    P: columns); a gzip file cut off is one line naming it."""
    import gzip

    pol, env = write_original_files(tmp_path)
    plain = convert.convert([pol, env], tmp_path / "plain", split="test", workers=1)
    texts = pol.read_text().splitlines() + [json.loads(line)["text"] for line in env.read_text().splitlines()]
    padded = tmp_path / "padded.txt"
    padded.write_text("".join(t + " \t \n" for t in texts))
    zipped = tmp_path / "lines.txt.gz"
    zipped.write_bytes(gzip.compress(padded.read_bytes()))
    jsonl = tmp_path / "lines.jsonl.gz"
    jsonl.write_bytes(gzip.compress("".join(json.dumps({"text": t}) + "\n" for t in padded.read_text().splitlines()).encode()))
    for i, source in enumerate((padded, zipped, jsonl)):
        report = convert.convert([source], tmp_path / f"out{i}", split="test", workers=1)
        assert (report.written, report.errors) == (plain.written, plain.errors), source
        for task in ("P", "A"):
            assert [r["completion"] for r in data.load_split(task, "test", tmp_path / f"out{i}")] == \
                [r["completion"] for r in data.load_split(task, "test", tmp_path / "plain")]
    cut = tmp_path / "cut.txt.gz"
    cut.write_bytes(zipped.read_bytes()[:60])
    assert main(["convert", str(cut), "--out", str(tmp_path / "cut"), "--workers", "1", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert f"rookworld convert: error: {cut}: not a whole gzip file" in err and "Traceback" not in err
    assert not (tmp_path / "cut").exists()  # nothing published, and the folder made for it taken back


def test_training_positions_that_are_test_positions_are_counted_aloud(tmp_path, caplog, monkeypatch):
    # converted splits are not split by position (datagen's are): the same lines as train and as test
    pol, env = write_original_files(tmp_path)
    out = tmp_path / "converted"
    convert.convert([pol], out, split="train")
    train = training.train_records(out)  # no val or test files there yet: nothing to say
    assert train and "stand at a position of its val or test records" not in caplog.text
    convert.convert([pol, env], out, split="test")
    assert len(training.train_records(out)) == len(train)
    assert f"{out}: {len(train)} of the {len(train)} training records stand at a position of its val or test records" in caplog.text
    caplog.clear()
    assert training.train_records() and "stand at a position" not in caplog.text  # the shipped set: split by position
    monkeypatch.setenv("RANK", "1")  # under torchrun, rank 0 says it for every process
    assert len(training.train_records(out)) == len(train) and "stand at a position" not in caplog.text


def test_convert_reads_parquet_and_arrow(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    lines = policy_fixtures()[:5]
    table = pa.table({"text": lines})
    pq.write_table(table, tmp_path / "rook.parquet")
    with pa.ipc.new_stream(str(tmp_path / "rook.arrow"), table.schema) as w:
        w.write_table(table)
    for name in ("rook.parquet", "rook.arrow"):
        assert list(convert.iter_lines(tmp_path / name)) == list(enumerate(lines, 1))
    # a null row is counted as an error, named as a JSON line's null 'text' is; an empty one is a blank line
    # (both were skipped, so the report's lines and errors left the null out)
    pq.write_table(pa.table({"text": [lines[0], None, "", lines[1]]}), tmp_path / "holes.parquet")
    report = convert.convert([tmp_path / "holes.parquet"], tmp_path / "out", split="train", workers=1)
    assert (report.lines, report.errors, sum(report.written.values())) == (3, 1, 2)
    assert report.first_errors == [f"{tmp_path / 'holes.parquet'}:2: its 'text' is null, not the line as a string"]
    # a file that is no Parquet or Arrow is named with pyarrow's reason (pyarrow's words alone named no file);
    # a gzipped one, which pyarrow cannot read, says so (it went to the Arrow reader)
    (tmp_path / "bad.parquet").write_text("not parquet\n")
    (tmp_path / "bad.arrow").write_text("not arrow\n")
    gzip_path = tmp_path / "rook.parquet.gz"
    gzip_path.write_bytes(gzip.compress((tmp_path / "rook.parquet").read_bytes()))
    for name, why in (("bad.parquet", "not a readable Parquet file (Parquet magic bytes not found"),
                      ("bad.arrow", "not a readable Arrow file ("),
                      ("rook.parquet.gz", f"a gzipped Parquet file; decompress it first (gunzip -k {gzip_path})")):
        with pytest.raises(ValueError) as info:
            list(convert.iter_lines(tmp_path / name))
        assert str(info.value).startswith(f"{tmp_path / name}: {why}"), str(info.value)


def test_convert_cli_prints_counts_and_reasons(tmp_path, capsys):
    pol, env = write_original_files(tmp_path)
    assert convert.cli([str(pol), str(env), "--out", str(tmp_path / "o"), "--workers", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "not converted" in out and "impossible position" in out and "legality" in out
    assert main(["convert", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o")]) == 1
    assert "rookworld convert: error: " in capsys.readouterr().err


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600)])
def test_converted_files_get_the_users_umask_not_0600(tmp_path, umask, mode):
    """Files are written atomically (a temporary file renamed over the target); they still get the mode
    a plain `open()` gives under the user's umask, as `ls -l` shows after `touch`."""
    pol, _ = write_original_files(tmp_path)
    # `rookworld convert`'s own cli (what `rookworld_lib.lab.cli.main` dispatches to): the umask is read
    # once at import, hence a process per umask; this import skips torch, which convert never needs (0.5 s, not 5)
    code = ("import os, sys; os.umask(int(sys.argv[1])); from rookworld_lib.chess.convert import cli; "
            "sys.exit(cli([sys.argv[2], '--out', sys.argv[3], '--workers', '1', '--no-progress']))")
    subprocess.run([sys.executable, "-c", code, str(umask), str(pol), str(tmp_path / "o")], check=True,
                   capture_output=True)
    written = sorted((tmp_path / "o").iterdir())
    assert written and {p.name: oct(p.stat().st_mode & 0o777) for p in written} == {p.name: oct(mode) for p in written}


# --------------------------------------------------------------------------------------------
# A stand-in for the real checkpoint: trained here on original-layout text, exported without our
# layout key (as a RookWorld-LM-124M download is), then evaluated and GRPO-trained with no flag
# --------------------------------------------------------------------------------------------

def test_original_model_stand_in_is_evaluated_and_grpo_trained_in_the_original_layout(tmp_path, capfd, monkeypatch):
    import torch

    from rookworld_lib.chess.training import LAYOUT_KEY
    from rookworld_lib.core import train_grpo
    from rookworld_lib.core.model import GPT, PROMPT_PREFIX_KEY
    from rookworld_lib.core.train_sft import SFTConfig, train_sft

    pol, env = write_original_files(tmp_path)
    for split in ("train", "test"):
        convert.convert([pol, env], tmp_path / "orig", split=split)
    sft = train_sft(SFTConfig(model="tiny", model_overrides={"n_layer": 1, "n_embd": 32, "n_head": 2},
                              train_data=(str(tmp_path / "orig/policy_train.jsonl"), str(tmp_path / "orig/env_train.jsonl")),
                              block_size=256, batch_size=2, max_steps=2, warmup_steps=0,
                              eval_interval=0, val_fraction=0.0, checkpoint_interval=0, device="cpu",
                              out_dir=str(tmp_path / "sft"), progress=False), reader=training.RecordReader("original"))
    config = json.loads((sft.final_dir / "config.json").read_text())
    assert config[LAYOUT_KEY] == "original" and config[PROMPT_PREFIX_KEY] == "<|endoftext|>"
    del config[LAYOUT_KEY], config[PROMPT_PREFIX_KEY]  # what a downloaded RookWorld-LM-124M looks like
    (sft.final_dir / "config.json").write_text(json.dumps(config))
    loaded = GPT.from_pretrained(sft.final_dir)
    assert training.layout_of(loaded) == "original" and loaded.prompt_prefix == ""
    capfd.readouterr()

    assert evaluate.cli([str(sft.final_dir), "--data-dir", str(tmp_path / "orig"), "--max-policy", "2",
                         "--max-env", "2", "--selfplay-games", "0", "--json"]) == 0
    out, err = capfd.readouterr()
    assert "layout: original" in err and "prompt prefix ''" in err and f"max_new_tokens {tasks.COMPLETION_BUDGET['original']}" in err
    # which temperature pass@1 sampled at, and why (the export records none: 1.0)
    assert "; pass@1 over 4 samples at T 1 (the model records no rollout temperature: to compare with a GRPO export, give its --sample-temperature)" in err
    results = json.loads(out.strip().splitlines()[-1])
    assert "policy/original_label_agreement" in results and "env/next_fen_exact" in results

    seen = []
    real = train_grpo.GRPOTrainer.__init__

    def spy(self, model, items, cfg, **kw):
        seen.extend(items)
        seen.append(cfg)
        real(self, model, items, cfg, **kw)

    torch.manual_seed(0)
    import unittest.mock as mock

    with mock.patch.object(train_grpo.GRPOTrainer, "__init__", spy):
        assert training.grpo_cli(["--init-from", str(sft.final_dir), "--data-dir", str(tmp_path / "orig"),
                                  "--out", str(tmp_path / "grpo"), "--steps", "1", "--prompts-per-step", "2",
                                  "--group-size", "2", "--minibatch-size", "4", "--device", "cpu"]) == 0
    err = capfd.readouterr().err
    assert "layout: original" in err
    prefix = GPT.from_pretrained(sft.final_dir).prompt_prefix  # the run says what it samples over and reads first
    assert f"sampling over all of GPT-2's 50,257 tokens; prompt prefix {prefix!r}" in err, err
    # and how its rewards score a B: outside the candidates, which differs with and without Stockfish
    from rookworld_lib.chess.engine import find_stockfish
    assert f"; a legal B: outside the data's candidates is searched by Stockfish ({find_stockfish()})\n" in err, err
    items, cfg = seen[:-1], seen[-1]
    assert cfg.max_new_tokens == tasks.COMPLETION_BUDGET["original"]
    for item in items:  # the prompts are the original layout's
        want = data.record_text(item.truth, "original")[0]
        assert item.prompt == want
        if item.task == "P":
            assert len(item.prompt) == len("P: ") + tasks.ORIGINAL_FEN_WIDTH - 1  # padded, minus the space before M:
    assert json.loads((tmp_path / "grpo/final/config.json").read_text())[LAYOUT_KEY] == "original"

    # the opt-in for a model that marks no task vocabulary: the data's tokens, the distance printed, a full export;
    # run where no Stockfish is found, which the run says
    monkeypatch.setenv("STOCKFISH_PATH", str(tmp_path / "no-stockfish"))
    assert training.grpo_cli(["--init-from", str(sft.final_dir), "--data-dir", str(tmp_path / "orig"),
                              "--out", str(tmp_path / "grpo-task"), "--steps", "1", "--prompts-per-step", "2",
                              "--group-size", "2", "--minibatch-size", "4", "--device", "cpu", "--vocab", "task",
                              "--reward", "graded"]) == 0
    err = capfd.readouterr().err
    assert "tokens of the training records" in err and "nats/token from the full one" in err, err
    assert "sampling over the model's " in err and " task tokens; prompt prefix" in err, err
    assert ("; a legal B: outside the data's candidates gets an estimated eval (no Stockfish found: the last candidate's "
            "minus 50 cp), so the rewards differ from a run with Stockfish; install it (make setup) or set STOCKFISH_PATH\n") in err, err
    start, out = GPT.from_pretrained(sft.final_dir), GPT.from_pretrained(tmp_path / "grpo-task/final")
    vocab = training.data_vocab([i.truth for i in items], "original")
    outside = torch.ones(start.config.vocab_size, dtype=torch.bool)
    outside[vocab.ids] = False
    w0, w1 = start.transformer.wte.weight, out.transformer.wte.weight
    assert out.config.vocab_size == start.config.vocab_size and torch.equal(w0[outside], w1[outside])


def test_an_unreadable_json_line_is_reported_with_its_line_number(tmp_path):
    src = tmp_path / "set.jsonl"
    good = policy_fixtures()[0]
    src.write_text(json.dumps({"text": good}) + "\n\n{broken\n" + json.dumps({"txt": good}) + "\n")
    report = convert.convert([src], tmp_path / "out", workers=1)
    assert report.written == {"P": 1} and report.lines == 3
    assert report.first_errors == [f"{src}:3: not a JSON object with a 'text' field",
                                   f"{src}:4: not a JSON object with a 'text' field"]


def test_a_line_quoting_a_lone_surrogate_is_reported_and_the_rest_converted(tmp_path, capsys):
    """JSON may spell a lone surrogate ("\\ud800"); the line's reason quotes it, and writing or printing that
    reason stopped the whole conversion (`'utf-8' codec can't encode`): it is shown as the escape."""
    src = tmp_path / "set.jsonl"
    good = policy_fixtures()[0]
    src.write_text(json.dumps({"text": good}) + "\n" + json.dumps({"text": good.replace(" B: ", "\ud800 B: ")}) + "\n")
    assert convert.cli([str(src), "--out", str(tmp_path / "out"), "--workers", "1", "--no-progress"]) == 0
    assert f"{src}:2: " in capsys.readouterr().out
    errors = (tmp_path / "out" / "convert_errors_test.txt").read_text().splitlines()
    assert len(errors) == 1 and errors[0].startswith(f"{src}:2: ") and "\\ud800" in errors[0]
    assert len(data.load_split("P", "test", tmp_path / "out")) == 1


def test_layout_records_read_alike_from_a_directory_and_a_loaded_model(tmp_path):
    """read_layout (a directory) and layout_of (a loaded model) agree: recorded, original (no record,
    no prefix: a RookWorld-LM-124M copy, even after a save), compact (our SFT's EOT prefix), refused."""
    from rookworld_lib.chess.training import LAYOUT_KEY, layout_of, read_layout, set_layout
    from rookworld_lib.core.model import GPT, GPTConfig, CheckpointFormatError

    model = GPT(GPTConfig.preset("tiny", block_size=32))
    assert layout_of(model) == "compact"  # a fresh model
    cases = {"recorded": (set_layout(GPT(model.config), "original"), "original")}
    plain = GPT(model.config)
    plain.prompt_prefix = ""
    cases["no record, no prefix"] = (plain, "original")
    cases["no record, EOT prefix"] = (GPT(model.config), "compact")
    for name, (m, want) in cases.items():
        m.save_pretrained(tmp_path / name)
        assert read_layout(tmp_path / name)[0] == want, name
        assert layout_of(GPT.from_pretrained(tmp_path / name)) == want, name
    config = json.loads((tmp_path / "recorded/config.json").read_text())
    (tmp_path / "recorded/config.json").write_text(json.dumps({**config, LAYOUT_KEY: "wide"}))
    with pytest.raises(CheckpointFormatError, match="rookworld_layout is 'wide'"):
        read_layout(tmp_path / "recorded")
    with pytest.raises(CheckpointFormatError, match=f"{tmp_path / 'recorded'}/config.json: rookworld_layout is 'wide'"):
        layout_of(GPT.from_pretrained(tmp_path / "recorded"))
    with pytest.raises(ValueError, match="layout must be one of"):
        set_layout(model, "wide")


def test_convert_fails_when_no_line_converts_and_names_our_own_records(tmp_path, capsys):
    """Nothing converted is exit status 1, not a success with 0 records; a file of our own records gets
    the reason that it needs no conversion; counts keep a quoted single character ('+') of the reason."""
    ours = tmp_path / "policy_test.jsonl"
    ours.write_text("".join((data.DATA_DIR / "policy_test.jsonl").read_text().splitlines(keepends=True)[:3]))
    garbage = tmp_path / "orig.txt"
    garbage.write_text("A: also garbage\nhello\n")
    assert convert.cli([str(ours), "--out", str(tmp_path / "a" / "deep" / "er"), "--workers", "1", "--no-progress"]) == 1
    captured = capsys.readouterr()
    assert "3  a record in our own format already (rookworld datagen's): use its directory as it is" in captured.out
    assert "rookworld convert: error: none of the 3 lines converted" in captured.err
    assert not (tmp_path / "a").exists()  # the --out folder as it was (here: none, nor its parents), not a lock and an errors file
    kept = tmp_path / "b"
    kept.mkdir()
    (kept / "convert_errors_test.txt").write_text("an earlier run's\n")
    assert convert.cli([str(garbage), "--out", str(kept), "--workers", "1", "--no-progress", "--json"]) == 1
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["errors_by_reason"] == {"expected 7 '+'-separated fields, found 1": 2}, report["errors_by_reason"]
    assert f"none of the 2 lines converted (their reasons by count in the report); nothing was written to {kept}" in captured.err
    assert sorted(p.name for p in kept.iterdir()) == ["convert_errors_test.txt"]
    assert (kept / "convert_errors_test.txt").read_text() == "an earlier run's\n"
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert convert.cli([str(empty), "--out", str(tmp_path / "e"), "--workers", "1", "--no-progress"]) == 1
    assert "rookworld convert: error: the inputs hold no lines; nothing was written" in capsys.readouterr().err
    assert main(["convert", str(garbage), "--out", str(tmp_path / "c"), "--workers", "0"]) == 1
    assert "--workers) must be a whole number of processes from 1 to 256, got 0" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()
    # 10**20 overflowed in the process pool (a traceback, and a lock left in --out); 100,000 forked that many
    for workers in ("257", str(10**20)):
        assert main(["convert", str(garbage), "--out", str(tmp_path / "c"), "--workers", workers]) == 1
        assert f"--workers) must be a whole number of processes from 1 to 256, got {workers}\n" in capsys.readouterr().err
        assert not (tmp_path / "c").exists()


def test_convert_lists_the_first_ten_errors_and_names_a_stalemate_mismatch_by_its_new_fen(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_text("".join(f"junk line {i}\n" for i in range(15)))
    report = convert.convert([bad], tmp_path / "out")
    assert report.errors == 15 and len(report.first_errors) == convert.MAX_ERRORS_SHOWN == 10
    fen = "k7/8/1Q6/8/8/8/8/7K w - - 0 1"
    board = chess.Board(fen)
    board.push_uci("b6c7")
    assert board.is_stalemate()  # the move ends the game by the rules: no repetition is involved
    why = convert.convert_line(f"A: {fen}+b6c7+b6c7+{fen}+0.5+1+0")  # reward and flags right, the next FEN wrong
    assert isinstance(why, str) and "new FEN" in why and "repetition" not in why


# --------------------------------------------------------------------------------------------
# Lines the original generators never wrote, the Arrow file format, and the errors file named
# --------------------------------------------------------------------------------------------

def _with_reward(line: str, reward: str) -> str:
    """An original A: line with its reward field (the fifth '+'-separated one) replaced."""
    parts = line.split("+")
    parts[4] = reward
    return "+".join(parts)


def _fivefold_line() -> str:
    """A knight shuffle whose 16th ply repeats the start position a fifth time: the original
    generator's outcome() (the whole move stack) ends the game there, 0.5 terminated; the
    position and ten moves of history do not show it."""
    moves = ["g1f3", "g8f6", "f3g1", "f6g8"] * 4
    board = chess.Board()
    for m in moves[:-1]:
        board.push_uci(m)
    line = original_env_line(board, moves[-1], moves[-10:], True)
    assert line.endswith("+0.5+1+0"), line  # python-chess's own verdict on the game, as the generator wrote it
    return line


ODD_LINES = [
    ("compact-P", f"P: {chess.STARTING_FEN} M: e2e4 d2d4 E: 0.35 0.3 B: e2e4",  # our layout, not fixed-width
     "not the original fixed-width layout (FEN 89/90, M 30, E 40 characters)"),
    ("reward-abc", _with_reward(original_env_line(chess.Board(), "g1f3", ["g1f3"], True), "abc"),
     "reward is not a number: 'abc'"),
    ("reward-0.3", _with_reward(original_env_line(chess.Board(), "g1f3", ["g1f3"], True), "0.3"),
     "reward '0.3' is not one of (0.001, 1.0, 0.5, -1.0)"),
    ("fivefold", _fivefold_line(), "a repetition ending: the position and ten moves of history do not decide it"),
    ("tabs", f"P: {chess.STARTING_FEN}\tM: e2e4 d2d4\tE: 0.35 0.3\tB: e2e4",  # was "internal error (substring not found)"
     "not the original fixed-width layout (FEN 89/90, M 30, E 40 characters): its fields are separated by tabs"),
    # python-chess's fen() drops impossible rights: the form differed, and the reason said only that
    ("castling", original_env_line(chess.Board("r3k2r/pppppppp/8/8/8/8/PPPPPPPP/R2K3R w kq - 0 1"), "d1e1", ["d1e1"], True)
     .replace(" w kq - ", " w KQkq - ", 1), "impossible position: FEN is not a legal chess position (bad castling rights)"),
    ("fullmove-0", original_env_line(chess.Board(), "g1f3", ["g1f3"], True).replace(" w KQkq - 0 1", " w KQkq - 0 0", 1),
     "impossible position: FEN is not in canonical form: fullmove number '0' (python-chess writes '1')"),
]


@pytest.mark.parametrize("line, reason", [(line, reason) for _, line, reason in ODD_LINES],
                         ids=[name for name, _, _ in ODD_LINES])
def test_lines_the_original_generators_did_not_write_are_refused_with_their_reason(line, reason):
    """A compact-layout P: line (already ours), a reward that is no number or none of the four the
    generator wrote, and a repetition ending that the position alone cannot decide: each is one
    line's reason, never a record."""
    assert convert.convert_line(line, ident="t") == reason


def test_the_reasons_counts_group_by_kind_and_keep_the_word_that_says_what_to_fix():
    """Quoted moves, FENs and values group together; a quoted field or key stayed '...' too, which hid
    what to fix ("not a JSON object with a '...' field")."""
    assert convert.reason_kind("M: move 'e2e5' is not legal in this position") == \
        convert.reason_kind("M: move 'a1a8' is not legal in this position") == "M: move '...' is not legal in this position"
    for kept in ("not a JSON object with a 'text' field", "expected 7 '+'-separated fields, found 3",
                 "not a policy sample: expected 'P: <FEN> M: ...'", "not a policy sample: expected 'M:'"):
        assert convert.reason_kind(kept) == kept
    assert convert.reason_kind("reward is not a number: 'abc'") == "reward is not a number: '...'"


def test_a_line_indented_or_led_by_a_byte_order_mark_converts_as_the_plain_line(tmp_path):
    """Two Windows files joined with `cat` put the second one's byte-order mark at the start of a line
    (utf-8-sig takes only the file's first); it and an indented line were refused with reasons about
    FEN or '+' fields."""
    pol, env = write_original_files(tmp_path)
    texts = pol.read_text().splitlines()[:2] + [json.loads(line)["text"] for line in env.read_text().splitlines()][:2]
    for i, text in enumerate(texts):
        plain = convert.convert_line(text, ident="x")
        assert isinstance(plain, dict), plain
        for led in ("\ufeff" + text, "  " + text, "\t" + text, "\ufeff " + text):
            assert convert.convert_line(led, ident="x") == plain, (i, led[:4])
    joined = tmp_path / "joined.txt"
    joined.write_bytes("".join(t + "\r\n" for t in texts[:2]).encode("utf-8-sig") * 2)  # `cat a.txt b.txt`
    report = convert.convert([joined], tmp_path / "out", split="test", workers=1)
    assert report.errors == 0 and report.written["P"] == 4, report


def test_arrow_file_format_reads_as_the_stream_format(tmp_path):
    """`datasets` writes the Arrow stream format; pyarrow's ipc.new_file writes the file format (a footer
    indexing its record batches). Both give the same lines, every batch of them, and the same records."""
    pa = pytest.importorskip("pyarrow")

    lines = policy_fixtures()[:6]
    batches = [pa.record_batch({"text": lines[:4]}), pa.record_batch({"text": lines[4:]})]  # two batches
    for name, writer in (("stream", pa.ipc.new_stream), ("file", pa.ipc.new_file)):
        (tmp_path / name).mkdir()
        with writer(str(tmp_path / name / "rook.arrow"), batches[0].schema) as w:
            for b in batches:
                w.write_batch(b)
    with pytest.raises(pa.ArrowInvalid):  # the file format really is not the stream one
        pa.ipc.open_stream(str(tmp_path / "file" / "rook.arrow"))
    assert list(convert.iter_lines(tmp_path / "file" / "rook.arrow")) == list(enumerate(lines, 1))
    for name in ("stream", "file"):
        report = convert.convert([tmp_path / name / "rook.arrow"], tmp_path / name / "out", workers=1)
        assert report.written == {"P": 6} and report.errors == 0, (name, report.first_errors)
    stream, file = (data.load_split("P", "test", tmp_path / name / "out").records for name in ("stream", "file"))
    assert file == stream
    assert [r["original_best"] for r in file] == [independent_policy_parse(x)[3] for x in lines]


def test_convert_cli_names_the_errors_file_when_more_errors_than_it_lists(tmp_path, capsys):
    """Past the first ten errors the report names the file that holds them all."""
    src = tmp_path / "mixed.txt"
    src.write_text(policy_fixtures()[0] + "\n" + "".join(f"junk line {i}\n" for i in range(11)))
    out = tmp_path / "out"
    assert convert.cli([str(src), "--out", str(out), "--workers", "1", "--no-progress"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert f"  ... all 11 in {out / 'convert_errors_test.txt'}" in printed, printed
    assert sum(line.startswith(f"  {src}:") for line in printed) == 10  # the first ten, listed
    errors = (out / "convert_errors_test.txt").read_text().splitlines()
    assert errors == [f"{src}:{n}: expected 7 '+'-separated fields, found 1" for n in range(2, 13)]


def test_the_report_counts_repeated_records_and_short_candidate_lists(tmp_path, capsys):
    """Each copy of a line became a record with no word, and eval then counted every copy in n; a P:
    line listing 2 of 20 legal moves converted silently, and policy/valid then asks answers for 2."""
    lines = policy_fixtures()[:2]
    start = chess.Board()
    short = f"P: {start.fen():90}M: {'e2e4 d2d4':30}E: {'0.3 0.28':40}B: e2e4"  # 2 candidates of 20 legal moves
    source = tmp_path / "rook.txt"
    source.write_text("\n".join([lines[0], lines[0], lines[0], lines[1], short]) + "\n")
    report = convert.convert([source], tmp_path / "out", split="test", workers=1)
    assert (report.written["P"], report.duplicates, report.short_lists) == (5, 2, 1)
    assert report.as_dict()["duplicates"] == 2 and report.as_dict()["short_candidate_lists"] == 1
    assert main(["convert", str(source), "--out", str(tmp_path / "cli"), "--workers", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "  2 records repeat an earlier one" in out and "  1 P: records list fewer candidates than min(5, legal moves)" in out


def test_a_text_input_that_is_not_utf8_or_not_text_or_a_json_array_is_named_so(tmp_path):
    """A Latin-1 byte in a text line was decoded as a replacement character and reported as a FEN error
    (a JSON line said "not UTF-8"); a binary file became hundreds of lines of reasons; a JSON array got
    "not a JSON object with a 'text' field" on every physical line."""
    good = policy_fixtures()[0]
    latin = tmp_path / "latin1.txt"
    latin.write_bytes(good.encode() + b"\n" + good.encode().replace(b" M:", b"\xa0M:", 1) + b"\n")
    report = convert.convert([latin], tmp_path / "a", split="test", workers=1)
    assert report.written["P"] == 1 and report.first_errors == [f"{latin}:2: not UTF-8 (invalid start byte at byte {good.index(' M:')})"]
    binary = tmp_path / "pytorch_model.bin"
    binary.write_bytes(b"PK\x03\x04" + bytes(range(256)) * 40)
    with pytest.raises(ValueError, match=rf"{binary}: not a text file \(NUL bytes in its first 8 kB\)"):
        convert.convert([binary], tmp_path / "b", split="test", workers=1)
    nulls = tmp_path / "rows.jsonl"
    nulls.write_text(json.dumps({"text": good}) + "\n" + json.dumps({"text": None}) + "\n" + json.dumps({"line": good}) + "\n")
    report = convert.convert([nulls], tmp_path / "n", split="test", workers=1)
    assert report.first_errors == [f"{nulls}:2: its 'text' is null, not the line as a string",
                                   f"{nulls}:3: not a JSON object with a 'text' field"]
    array = tmp_path / "lines.json"
    array.write_text(json.dumps([{"text": good}, {"text": good}], indent=1))
    with pytest.raises(ValueError, match=rf"{array}: a JSON array; give JSON lines"):
        convert.convert([array], tmp_path / "c", split="test", workers=1)
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


@pytest.mark.parametrize("share", [0.0, 0.25, 0.9, 1.0])
def test_policy_fraction_gives_the_rest_to_the_environment_task(share):
    w = training.task_weights(share)
    assert w == {"P": share, "A": pytest.approx(1 - share)}  # the shares sum to 1: the rest is A:
    assert sum(w.values()) == pytest.approx(1.0)


def test_policy_fraction_on_the_command_line_reaches_the_sft_config(tmp_path):
    args = training.build_sft_parser().parse_args(["--policy-fraction", "1", "--train-data", "x.jsonl"])
    assert training.task_weights(args.policy_fraction) == {"P": 1.0, "A": 0.0}  # P: alone, as the option's help says


def test_a_p_line_with_four_candidates_of_many_is_a_short_list_and_five_is_not(tmp_path):
    start = chess.Board()
    four = f"P: {start.fen():90}M: {'e2e4 d2d4 g1f3 c2c4':30}E: {'0.3 0.28 0.25 0.2':40}B: e2e4"
    five = f"P: {start.fen():90}M: {'e2e4 d2d4 g1f3 c2c4 e2e3':30}E: {'0.3 0.28 0.25 0.2 0.1':40}B: e2e4"
    src = tmp_path / "rook.txt"
    src.write_text(four + "\n" + five + "\n")
    report = convert.convert([src], tmp_path / "out", split="test", workers=1)
    # independent count: candidates listed < min(5, legal moves)
    expected = sum(len(line.split("M:")[1].split("E:")[0].split()) < min(5, start.legal_moves.count())
                   for line in (four, five))
    assert report.written["P"] == 2 and report.short_lists == expected == 1


# Behaviours of chess/convert that no test pinned (mutation round 5: each test below is red with its mutant)

def test_an_a_line_with_an_eighth_field_is_refused_for_its_field_count():
    """An arbiter row has exactly 7 '+'-separated fields (FEN, move, history, next FEN, reward,
    terminated, truncated); one more is refused as such, not read as some other fault."""
    line = original_env_line(chess.Board(), "g1f3", ["g1f3"], True)
    assert isinstance(convert.convert_line(line, ident="t"), dict)
    assert convert.convert_line(line + "+0", ident="t") == "expected 7 '+'-separated fields, found 8"


def test_a_row_that_claims_a_win_python_chess_does_not_see_is_a_disagreement_not_a_repetition():
    """Only a draw (0.5) that python-chess cannot see from the position and ten moves can be a repetition
    ending; a row claiming the game ended in a win after 1. Nf3 disagrees with python-chess."""
    line = original_env_line(chess.Board(), "g1f3", ["g1f3"], True)
    assert line.endswith("+0.001+0+0")
    won = line[: -len("+0.001+0+0")] + "+1.0+1+0"
    reason = convert.convert_line(won, ident="t")
    assert isinstance(reason, str) and reason.startswith("transition disagrees with python-chess"), reason


def test_lines_of_only_spaces_are_blank_and_skipped_with_the_numbers_kept(tmp_path):
    """iter_lines yields each non-blank line: a line of spaces or tabs (padding the generators wrote) is
    blank, not a line to report; the others keep their physical line numbers."""
    lines = policy_fixtures()[:2]
    path = tmp_path / "rook.txt"
    path.write_text(lines[0] + "\n   \n\t\n" + lines[1] + "\n")
    assert [(n, t.strip()) for n, t in convert.iter_lines(path)] == [(1, lines[0]), (4, lines[1])]
    report = convert.convert([path], tmp_path / "out", split="test", workers=1)
    assert (report.lines, report.errors, report.written["P"]) == (2, 0, 2)


def test_a_json_array_led_by_a_byte_order_mark_is_named_as_an_array(tmp_path):
    """A Windows tool's JSON array (UTF-8 with a byte-order mark) is a JSON array all the same."""
    array = tmp_path / "lines.json"
    array.write_bytes(json.dumps([{"text": t} for t in policy_fixtures()[:2]], indent=1).encode("utf-8-sig"))
    with pytest.raises(ValueError, match=rf"{array}: a JSON array; give JSON lines"):
        list(convert.iter_lines(array))


def test_parallel_conversion_writes_the_records_in_input_order(tmp_path):
    """With workers and many small chunks in flight, the outputs keep the input's line order (a record's
    `game` is its line number), as one worker writes them."""
    lines = policy_fixtures()
    path = tmp_path / "rook.txt"
    path.write_text("\n".join(lines) + "\n")
    report = convert.convert([path], tmp_path / "par", split="test", workers=2, chunk_lines=1)
    games = [json.loads(line)["game"] for line in (tmp_path / "par" / "policy_test.jsonl").read_text().splitlines()]
    assert report.written["P"] == len(lines) and games == list(range(1, len(lines) + 1))


def test_records_of_two_input_files_get_distinct_ids(tmp_path):
    """Every record's id is its own across the inputs of one conversion (line 1 of each file is not the
    same record)."""
    lines = policy_fixtures()
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("\n".join(lines[:3]) + "\n")
    b.write_text("\n".join(lines[3:6]) + "\n")
    convert.convert([a, b], tmp_path / "out", split="test", workers=1)
    ids = [json.loads(line)["id"] for line in (tmp_path / "out" / "policy_test.jsonl").read_text().splitlines()]
    assert len(ids) == 6 and len(set(ids)) == 6, ids


def test_a_repeat_is_a_record_equal_in_prompt_and_completion_not_the_same_position_again(tmp_path):
    """ConvertReport.duplicates counts records equal to an earlier one in prompt and completion: the same
    line twice is one repeat; the same position with other candidates (another completion) is none."""
    one, other = (original_policy_line(chess.Board(), random.Random(s)) for s in (1, 2))
    assert one.split("M: ")[0] == other.split("M: ")[0] and one != other  # same prompt, other answer
    path = tmp_path / "rook.txt"
    path.write_text(f"{one}\n{other}\n")
    assert convert.convert([path], tmp_path / "a", split="test", workers=1).duplicates == 0
    path.write_text(f"{one}\n{other}\n{one}\n")
    assert convert.convert([path], tmp_path / "b", split="test", workers=1).duplicates == 1


def test_the_cli_says_more_errors_only_when_it_did_not_list_them_all(tmp_path, capsys):
    """`rookworld convert` lists the first MAX_ERRORS_SHOWN errors; the "... all N in <file>" line is for
    more errors than it listed, never for a run whose errors (none, or three) are all on screen."""
    lines = policy_fixtures()[:4]
    good = tmp_path / "good.txt"
    good.write_text("\n".join(lines) + "\n")
    assert convert.cli([str(good), "--out", str(tmp_path / "a"), "--workers", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "4 P: and 0 A: records, 0 not converted" in out and "..." not in out, out
    some = tmp_path / "some.txt"
    some.write_text("\n".join(lines + ["x", "y", "z"]) + "\n")
    assert convert.cli([str(some), "--out", str(tmp_path / "b"), "--workers", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "3 not converted" in out and out.count(f"{some}:") == 3 and "..." not in out, out
