"""Task formats: builders, parsers (never raise), eval text, layouts, the environment step."""

import math
import random

import chess
import pytest
from helpers_chess import mutate, random_positions
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rookworld_lib.chess import tasks
from rookworld_lib.chess.tasks import Eval
from rookworld_lib.core.tokenizer import encode

START = chess.STARTING_FEN
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# ------------------------------------------------------------------------------------------
# Evals
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("e, text", [
    (Eval(cp=35), "0.35"), (Eval(cp=-120), "-1.2"), (Eval(cp=0), "0.0"), (Eval(cp=-1), "-0.01"),
    (Eval(cp=100), "1.0"), (Eval(cp=1234), "12.34"), (Eval(mate=3), "M3"), (Eval(mate=-2), "-M2"),
])
def test_eval_text_forms(e, text):
    assert tasks.format_eval(e) == text
    assert tasks.parse_eval(text) == e


def test_eval_round_trip_and_order():
    values = [Eval(cp=c) for c in range(-3000, 3001, 7)] + [Eval(mate=m) for m in (1, 2, 5, 30, -1, -4, -30)]
    for e in values:
        assert tasks.parse_eval(tasks.format_eval(e)) == e
    # a mate for the side to move beats every material eval; sooner mates beat later ones
    assert Eval(mate=5).to_cp() > Eval(cp=15000).to_cp() > Eval(cp=-15000).to_cp() > Eval(mate=-5).to_cp()
    assert Eval(mate=1).to_cp() > Eval(mate=2).to_cp() and Eval(mate=-2).to_cp() > Eval(mate=-1).to_cp()
    assert tasks.win_prob(Eval(mate=1).to_cp()) > 0.99 and tasks.win_prob(Eval(mate=-1).to_cp()) < 0.01
    assert tasks.parse_eval("#3") == Eval(mate=3)


@pytest.mark.parametrize("bad", ["", "M0", "M", "-", "1e3", "nan", "inf", "1.2.3", "M-3", "0,5", "1000.0", "500.01", " 0.3", "--M2",
                                 "٠.٤٨", "M٣", "０.５"])  # digits of other scripts: \\d and float() take them
def test_parse_eval_rejects(bad):
    assert tasks.parse_eval(bad) is None


def test_an_answer_in_other_digits_is_not_format_valid():
    """Arabic-Indic digits in E: (or in an A: reward) made an answer valid, scoring 1.0, though the data's
    own check refuses the same text: the format is ASCII digits."""
    arabic = str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩")
    p = tasks.parse_policy_completion(" M: e2e4 d2d4 E: " + "0.3 0.2".translate(arabic) + " B: e2e4")
    assert not p.ok and tasks.parse_policy_completion(" M: e2e4 d2d4 E: 0.3 0.2 B: e2e4").ok
    new = chess.Board()
    new.push_uci("e2e4")
    assert not tasks.parse_env_completion(f"{new.fen()}+" + "0.001".translate(arabic) + "+0+0").ok
    assert tasks.parse_env_completion(f"{new.fen()}+0.001+0+0").ok


def test_eval_from_engine_score_is_side_to_move_view():
    from chess.engine import Cp, Mate, PovScore

    # Stockfish reports scores relative to the side to move; python-chess keeps that in PovScore
    black_winning = PovScore(Cp(250), chess.BLACK)
    assert Eval.from_score(black_winning.pov(chess.BLACK)) == Eval(cp=250)
    assert Eval.from_score(PovScore(Mate(2), chess.WHITE).pov(chess.WHITE)) == Eval(mate=2)
    assert Eval.from_score(PovScore(Mate(-3), chess.BLACK).pov(chess.BLACK)) == Eval(mate=-3)


# ------------------------------------------------------------------------------------------
# Policy format
# ------------------------------------------------------------------------------------------

MOVES = ["e2e4", "d2d4", "g1f3", "c2c4", "g2g3"]
EVALS = ["0.3", "0.28", "0.25", "0.2", "M2"]


def test_compact_policy_layout():
    prompt, completion = tasks.policy_text(START, MOVES, EVALS, "e2e4")
    assert prompt == f"P: {START}"
    assert completion == " M: e2e4 d2d4 g1f3 c2c4 g2g3 E: 0.3 0.28 0.25 0.2 M2 B: e2e4"
    p = tasks.parse_policy(prompt + completion)
    assert p.ok and p.layout == "compact" and p.fen == START
    assert p.moves == tuple(MOVES) and p.best == "e2e4"
    assert [tasks.format_eval(e) for e in p.evals] == EVALS


def test_original_layout_fixed_widths_and_shuffled_pairs():
    prompt, completion = tasks.policy_text(START, MOVES, EVALS, "e2e4", "original")
    text = prompt + completion
    # the ROOK/RookWorld layout: 'P: ' + FEN.ljust(90) + 'M: ' + moves.ljust(30) + 'E: ' + evals.ljust(40) + 'B: '
    assert text.index("M:") == 3 + 90
    assert text.index("E:") - text.index("M:") == 3 + 30
    assert text.index("B:") - text.index("E:") == 3 + 40
    assert prompt.endswith(" ") and completion.startswith(" M: ")
    p = tasks.parse_policy(text)
    assert p.ok and p.layout == "original" and p.best == "e2e4"
    assert set(p.moves) == set(MOVES)
    # pairs stay pairs after the shuffle
    assert {m: tasks.format_eval(e) for m, e in zip(p.moves, p.evals)} == dict(zip(MOVES, EVALS))
    # deterministic by default, and really shuffled for some seed
    assert tasks.policy_completion(MOVES, EVALS, "e2e4", "original") == completion
    orders = {tasks.parse_policy_completion(tasks.policy_completion(MOVES, EVALS, "e2e4", "original", shuffle_seed=s)).moves
              for s in range(10)}
    assert len(orders) > 1


def test_reads_a_real_rook_v1_line():
    # a line of the original ROOK v1 / RookWorld policy data (shuffled pairs: B: is not first)
    fen = "rnbqkbnr/pppppppp/8/4P3/8/8/PPPP1PPP/RNBQKBNR w KQkq - 1 3"
    line = ("P: " + fen.ljust(90) + "M: " + "g1f3 b1c3 c2c3 f2f4 d2d4".ljust(30)
            + "E: " + "0.8 0.71 0.65 0.58 0.98".ljust(40) + "B: d2d4")
    p = tasks.parse_policy(line)
    assert p.ok and p.layout == "original" and p.fen == fen
    assert p.moves == ("g1f3", "b1c3", "c2c3", "f2f4", "d2d4") and p.best == "d2d4"
    assert p.eval_map["d2d4"] == Eval(cp=98)
    prompt, completion = tasks.split_policy_text(line)
    assert completion.startswith(" M: ") and prompt == tasks.policy_prompt(fen, "original")


def _token_invariant(prompt, completion):
    return encode(prompt) + encode(completion) == encode(prompt + completion)


def split_text(text):
    """(prompt, completion) of a full P: sample, or of an A: sample cut at its third '+'."""
    if tasks.task_of(text) == "P":
        return tasks.split_policy_text(text)
    cut = len("+".join(text.split("+", 3)[:3])) + 1
    return text[:cut], text[cut:]


def test_token_split_invariant_policy_both_layouts():
    rng = random.Random(0)
    for board in random_positions(150, seed=1):
        legal = [m.uci() for m in board.legal_moves]
        moves = rng.sample(legal, min(5, len(legal)))
        evals = [Eval(cp=rng.randint(-900, 900)) if rng.random() < 0.9 else Eval(mate=rng.choice([1, 3, -2]))
                 for _ in moves]
        for layout in tasks.LAYOUTS:
            prompt, completion = tasks.policy_text(tasks.canonical_fen(board), moves, evals, moves[0], layout)
            assert _token_invariant(prompt, completion), (layout, prompt, completion)
            assert _token_invariant(prompt, completion + tasks.EOT)
            assert split_text(prompt + completion) == (prompt, completion)


def test_token_split_invariant_environment():
    rng = random.Random(2)
    for board in random_positions(150, seed=3):
        fen = tasks.canonical_fen(board)
        move = rng.choice([m.uci() for m in board.legal_moves] + ["e9e4", "Nf3", "0000"])
        tr = tasks.environment_step(fen, move, ["e2e4", "e7e5"][: rng.randint(0, 2)])
        assert _token_invariant(tr.prompt, tr.completion)
        assert _token_invariant(tr.prompt, tr.completion + tasks.EOT)
        assert split_text(tr.prompt + tr.completion) == (tr.prompt, tr.completion)


@pytest.mark.parametrize("kwargs, match", [
    (dict(moves=[], evals=[], best="e2e4"), "1..5 moves"),
    (dict(moves=MOVES, evals=EVALS[:4], best="e2e4"), "evals"),
    (dict(moves=MOVES, evals=EVALS, best="a2a3"), "not among"),
    (dict(moves=["e2e4", "e2e4"], evals=["0.1", "0.1"], best="e2e4"), "duplicate"),
    (dict(moves=["Nf3"], evals=["0.1"], best="Nf3"), "not a UCI move"),
    (dict(moves=["e2e4"], evals=["zz"], best="e2e4"), "not an eval"),
    (dict(moves=["e2e4"], evals=["0.1"], best="e2e4", layout="fancy"), "layout"),
])
def test_policy_builder_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        tasks.policy_completion(**kwargs)


def test_policy_prompt_rejects_bad_fen():
    with pytest.raises(ValueError, match="FEN"):
        tasks.policy_prompt("not a fen")


@pytest.mark.parametrize("completion, expect", [
    ("", "missing M:"),
    (" M: e2e4 E: 0.3", "missing B:"),
    (" M: e2e4 d2d4 E: 0.3 B: e2e4", "1 evals for 2 moves"),
    (" M: e2e4 E: x B: e2e4", "not an eval"),
    (" M: e2e4 E: 0.1 B: Nf3", "not UCI"),
    (" M: e2e4 E: 0.1 B: d2d4", "not among"),
    (" M: a2a3 b2b3 c2c3 d2d3 e2e3 f2f3 E: 0 0 0 0 0 0 B: a2a3", "at most 5"),
    ("hello M: e2e4 E: 0.1 B: e2e4", "unexpected text before"),
    (" M: e2e4 E: 0.1 B: e2e4 junk", "unexpected text after"),
    (" M: e2e4 E: 0.1 B: e2e4<|endoftext|>more", "text after <|endoftext|>"),
])
def test_policy_parser_names_the_problem(completion, expect):
    p = tasks.parse_policy_completion(completion)
    assert not p.ok
    assert any(expect in e for e in p.errors), p.errors


def test_policy_parser_accepts_eot_and_reports_ok():
    p = tasks.parse_policy_completion(" M: e2e4 E: 0.1 B: e2e4" + tasks.EOT)
    assert p.ok and p.best == "e2e4" and p.sections == 3


# ------------------------------------------------------------------------------------------
# Parsers never raise
# ------------------------------------------------------------------------------------------

PARSERS = [tasks.parse_policy_completion, tasks.parse_policy, tasks.parse_policy_prompt,
           tasks.parse_env_prompt, tasks.parse_env_completion]


def _check_parse_result(result):
    assert isinstance(result.errors, tuple)
    assert result.ok == (not result.errors)
    assert not any(e.startswith("internal") for e in result.errors), result.errors


@FUZZ
@given(st.text(max_size=300))
def test_parsers_never_raise_on_arbitrary_text(text):
    for parse in PARSERS:
        _check_parse_result(parse(text))
    assert tasks.parse_eval(text) is None or isinstance(tasks.parse_eval(text), Eval)
    tasks.split_policy_text(text)
    tasks.fen_error(text)


@FUZZ
@given(st.sampled_from(["P: ", "A: ", " M: ", "+", " E: ", " B: "]), st.text(alphabet="abcdefgh12345678/ wbKQkq-+MEB:.0", max_size=200))
def test_parsers_never_raise_on_near_format_text(prefix, body):
    for parse in PARSERS:
        _check_parse_result(parse(prefix + body))


@pytest.mark.parametrize("value", [None, 3, b"P: x", ["M:"], 1.5])
def test_parsers_accept_non_strings(value):
    for parse in PARSERS:
        r = parse(value)
        assert not r.ok and "string" in r.errors[0]


def test_parsers_never_raise_on_mutated_real_samples():
    rng = random.Random(7)
    texts = []
    for board in random_positions(40, seed=11):
        fen = tasks.canonical_fen(board)
        moves = [m.uci() for m in list(board.legal_moves)[:5]]
        for layout in tasks.LAYOUTS:
            texts.append(tasks.policy_completion(moves, ["0.1"] * len(moves), moves[0], layout))
            texts.append(tasks.policy_prompt(fen, layout))
        tr = tasks.environment_step(fen, moves[0])
        texts += [tr.prompt, tr.completion]
    n_ok = 0
    for text in texts:
        for _ in range(60):
            m = mutate(text, rng, edits=rng.randint(1, 4))
            for parse in PARSERS:
                r = parse(m)
                _check_parse_result(r)
                n_ok += r.ok
    assert n_ok > 0  # some mutations stay well-formed, and they parse as such


# ------------------------------------------------------------------------------------------
# Environment
# ------------------------------------------------------------------------------------------

def test_env_format_and_legal_move():
    tr = tasks.environment_step(START, "e2e4")
    assert tr.prompt == f"A: {START}+e2e4+e2e4+"
    # standard FEN: the en-passant square is written after every double push
    assert tr.completion == "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1+0.001+0+0"
    assert (tr.reward, tr.terminated, tr.truncated, tr.kind) == (0.001, 0, 0, "legal")
    p = tasks.parse_env_completion(tr.completion)
    assert p.ok and p.new_fen == tr.new_fen and p.reward == 0.001 and (p.terminated, p.truncated) == (0, 0)
    assert tasks.parse_env_completion(tr.completion + "+").ok  # original data's trailing '+'
    pp = tasks.parse_env_prompt(tr.prompt)
    assert pp.ok and pp.fen == START and pp.move == "e2e4" and pp.history == ("e2e4",)


def _after(*moves):
    b = chess.Board()
    for m in moves:
        b.push_uci(m)
    return b


def test_env_checkmate_rewards_the_mover():
    b = _after("f2f3", "e7e5", "g2g4")
    tr = tasks.environment_step(tasks.canonical_fen(b), "d8h4", ["f2f3", "e7e5", "g2g4"])
    assert (tr.reward, tr.terminated, tr.truncated, tr.termination) == (1.0, 1, 0, "checkmate")
    assert tr.history == ("f2f3", "e7e5", "g2g4", "d8h4")
    assert tr.completion.endswith("+1.0+1+0")


def test_env_draws():
    stalemate = tasks.environment_step("7k/8/6Q1/8/8/8/8/K7 w - - 0 1", "g6f7")
    assert (stalemate.reward, stalemate.terminated, stalemate.termination) == (0.5, 1, "stalemate")
    bare = tasks.environment_step("8/8/8/8/8/8/1b6/K5k1 w - - 0 1", "a1b2")
    assert (bare.reward, bare.terminated, bare.termination) == (0.5, 1, "insufficient_material")
    seventyfive = tasks.environment_step("8/8/8/4k3/8/8/4K3/4R3 w - - 149 120", "e1d1")
    assert (seventyfive.reward, seventyfive.terminated, seventyfive.termination) == (0.5, 1, "seventyfive_moves")
    # the fifty-move rule is a claim, not an ending (FIDE 9.3; python-chess: outcome(claim_draw=False) is None)
    fen = "8/8/8/4k3/8/8/4K3/4R3 w - - 99 80"
    board = chess.Board(fen)
    board.push_uci("e1d1")
    assert board.can_claim_fifty_moves() and board.outcome(claim_draw=False) is None
    fifty = tasks.environment_step(fen, "e1d1")
    assert (fifty.reward, fifty.terminated, fifty.termination) == (0.001, 0, None)


@pytest.mark.parametrize("fen, move, kind", [
    (START, "e2e5", "illegal"),  # not a pawn move
    (START, "e7e5", "illegal"),  # the opponent's pawn
    ("4k3/8/8/8/8/8/4r3/4K3 w - - 0 1", "e1e2x", "unparseable"),
    ("4k3/4r3/8/8/8/8/4N3/4K3 w - - 0 1", "e2c3", "illegal"),  # pinned knight
    ("4k3/8/8/8/8/8/3r4/4K3 w - - 0 1", "e1d1", "illegal"),  # into the rook's file
    ("k7/4P3/8/8/8/8/8/4K3 w - - 0 1", "e7e8", "illegal"),  # promotion needs a piece
    ("k7/4P3/8/8/8/8/8/4K3 w - - 0 1", "e7e8n", "legal"),
    (START, "Nf3", "unparseable"),
    (START, "0000", "unparseable"),  # the UCI null move is not a move of the task
    ("r3k2r/8/8/8/8/8/8/R3K2R w - - 0 1", "e1g1", "illegal"),  # no castling right
    (START, "e2e2", "illegal"),  # UCI's shape, but python-chess refuses to build such a null move
])
def test_env_illegal_and_unparseable_moves(fen, move, kind):
    tr = tasks.environment_step(fen, move)
    assert tr.kind == kind
    if kind != "legal":
        assert (tr.new_fen, tr.reward, tr.terminated, tr.truncated) == (fen, -1.0, 0, 1)
        assert tr.completion == f"{fen}+-1.0+0+1"


def test_legality_uses_is_legal_not_push():
    board = chess.Board("4k3/4r3/8/8/8/8/4N3/4K3 w - - 0 1")
    pinned = chess.Move.from_uci("e2c3")
    assert pinned in board.pseudo_legal_moves and not board.is_legal(pinned)
    board.copy().push(pinned)  # push accepts it silently ...
    assert tasks.environment_step(board.fen(), "e2c3").kind == "illegal"  # ... the task does not


def test_env_en_passant_and_castling():
    b = _after("e2e4", "a7a6", "e4e5", "d7d5")
    tr = tasks.environment_step(tasks.canonical_fen(b), "e5d6")
    assert tr.kind == "legal" and "3p4" not in tr.new_fen.split()[0].split("/")[3]
    assert chess.Board(tr.new_fen).piece_at(chess.D5) is None
    castle = tasks.environment_step("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", "e1g1")
    assert castle.new_fen.startswith("r3k2r/8/8/8/8/8/8/R4RK1 b kq")


def test_castling_is_the_kings_two_square_move_only():
    """python-chess's is_legal also takes king-takes-own-rook (e1h1, e1a1) in standard chess, a second
    spelling of one move that is not in legal_moves: it is not a legal move here, so it cannot be a second
    'distinct' candidate of a format-valid answer, and an A: prompt with it is an illegal move."""
    fen = "r3k2r/pppppppp/8/8/8/8/PPPPPPPP/R3K2R w KQkq - 0 1"
    board = chess.Board(fen)
    assert board.is_legal(chess.Move.from_uci("e1h1")) and chess.Move.from_uci("e1h1") not in list(board.legal_moves)
    assert tasks.legal_move(board, "e1g1") and tasks.legal_move(board, "e1c1")
    assert tasks.legal_move(board, "e1h1") is None and tasks.legal_move(board, "e1a1") is None
    aliases = tasks.parse_policy_completion(" M: e1g1 e1h1 e1c1 e1a1 a2a3 E: 0.1 0.1 0.1 0.1 0.0 B: e1g1")
    assert aliases.ok and not tasks.valid_policy_answer(board, aliases)
    assert tasks.environment_step(fen, "e1h1").kind == "illegal"


def test_env_history_is_capped_at_ten():
    prev = ["g1f3", "g8f6", "f3g1", "f6g8"] * 3
    tr = tasks.environment_step(START, "e2e4", prev)
    assert len(tr.history) == 10 and tr.history[-1] == "e2e4"
    with pytest.raises(ValueError, match="end with the current move"):
        tasks.env_prompt(START, "e2e4", ["d2d4"])
    with pytest.raises(ValueError, match="'\\+'"):
        tasks.environment_step(START, "e2e4+")


@pytest.mark.parametrize("parse, text, expect", [
    (tasks.parse_env_completion, "x", "expected 4"),
    (tasks.parse_env_completion, f"{START}+0.001+0", "expected 4"),
    (tasks.parse_env_completion, f"{START}+abc+0+0", "reward is not a number"),
    (tasks.parse_env_completion, f"{START}+0.001+2+0", "terminated is not 0/1"),
    (tasks.parse_env_completion, f"{START}+0.001+0+yes", "truncated is not 0/1"),
    (tasks.parse_env_completion, "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBN w KQkq - 0 1+0.001+0+0", "new FEN"),
    (tasks.parse_env_prompt, "P: x", "does not start"),
    (tasks.parse_env_prompt, f"A: {START}+e2e4+", "must be"),
    (tasks.parse_env_prompt, f"A: {START}+e2e4+d2d4+", "history does not end"),
    (tasks.parse_env_prompt, "A: nonsense+e2e4+e2e4+", "FEN"),
])
def test_env_completion_and_prompt_parsers_name_the_problem(parse, text, expect):
    p = parse(text)
    assert not p.ok and any(expect in e for e in p.errors), p.errors


def test_fen_error_cases():
    assert tasks.fen_error(START) is None
    assert "6 space-separated" in tasks.fen_error("8/8/8/8/8/8/8/8 w - -")
    assert "legal chess position" in tasks.fen_error("8/8/8/8/8/8/8/8 w - - 0 1")  # no kings
    assert "two subsequent digits" in tasks.fen_error("rnbqkbnr/pppppppp/44/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1")
    assert "canonical" in tasks.fen_error("rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 00 1")
    assert tasks.fen_error(" " + START) == "FEN has stray whitespace"
    assert tasks.task_of("P: x") == "P" and tasks.task_of("A: x") == "A" and tasks.task_of("B: x") is None


def test_a_position_key_is_python_chess_epd_whatever_the_clocks_and_the_en_passant_spelling():
    """One key per position, as same_position judges positions: after 1.e4 the compact data write e3 (every
    double push), the original data and python-chess's default write - (no black pawn can take), and a
    transposition that reaches the position without the double push writes -. A square a pawn can take on
    stays: that is another position."""
    board = chess.Board()
    board.push_uci("e2e4")
    want = board.epd()  # placement, side, castling, en passant where a capture is legal: no clocks
    assert want == "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq -"
    for spelling in ("e3", "-"):
        for clocks in ("0 1", "0 7", "12 40"):
            fen = f"rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq {spelling} {clocks}"
            assert tasks.position_key(fen) == want == tasks.board_key(chess.Board(fen))
    for uci in ("d7d5", "e4e5", "f7f5"):
        board.push_uci(uci)
    assert tasks.position_key(tasks.canonical_fen(board)) == board.epd() != tasks.position_key(board.fen(en_passant="fen").replace(" f6 ", " - "))
    assert board.epd().split(" ")[3] == "f6"
    assert tasks.position_key("not a fen at all x y") == "not a fen at"  # an invalid FEN: its first four fields


def test_an_original_mate_spelling_that_names_no_mate_reads_as_no_eval():
    # 999.99 pawns is mate in 1 (100000 - 1 centipawns); 999.999 would be "mate in 0.1": no eval, not an error
    assert tasks.parse_eval("999.99") == tasks.Eval(mate=1) and tasks.parse_eval("-999.99") == tasks.Eval(mate=-1)
    assert tasks.parse_eval("999.999") is None


def test_eval_edges_mated_bounds_and_canonical_spelling():
    from chess.engine import Cp, Mate

    # python-chess orders Mate(0) (the side to move is mated) at or below Mate(-1); so must our centipawns
    ordered = [Mate(0), Mate(-1), Mate(-5), Cp(-300), Cp(0), Cp(250), Mate(7), Mate(1)]
    assert all(a <= b for a, b in zip(ordered, ordered[1:]))
    cps = [Eval.from_score(s).to_cp() for s in ordered]
    assert cps == sorted(cps) and Eval.from_score(Mate(0)) == Eval(mate=-1)
    # "pawns up to 500" (format_eval's range); the original layout spells mate n as +-(MATE_CP - n) / 100
    assert tasks.parse_eval("500.0") == Eval(cp=50_000) and tasks.parse_eval("500.01") is None
    # (MATE_CP = 100,000 centipawns): 998.5 is mate 150, 998.99 mate 101, 999.99 mate 1; 900.0 would be mate 10,000
    assert [tasks.parse_eval(t) for t in ("-998.5", "998.99", "999.99", "900.0")] == \
        [Eval(mate=-150), Eval(mate=101), Eval(mate=1), None]
    board = chess.Board()
    assert tasks.policy_truth_error(board, ["e2e4"], ["0.35"]) is None
    for spelling in ("+0.35", "0.350", "00.35"):  # each reads as 0.35, but a label holds the format's one spelling
        assert tasks.parse_eval(spelling) == Eval(cp=35)
        assert tasks.policy_truth_error(board, ["e2e4"], [spelling]) is not None, spelling
    # the engine's order, not the evals' (under a node budget a later line's eval can be the higher one)
    assert tasks.policy_truth_error(board, ["e2e4", "d2d4", "g1f3"], ["0.35", "-0.73", "0.3"]) is None
    with pytest.raises(ValueError, match=r"^format_eval takes an Eval \(parse_eval reads one from text\), got str '0.35'$"):
        tasks.format_eval("0.35")


def test_env_history_holds_the_last_ten_moves_ending_with_this_one():
    # the original RookWorld A: prompt: the last 10 moves played, the current one last
    board, moves = chess.Board(), []
    for uci in ("e2e4", "e7e5", "g1f3", "b8c6", "f1b5", "a7a6", "b5a4", "g8f6", "e1g1", "f8e7", "f1e1", "b7b5"):
        moves.append(uci)
        fen = board.fen()
        board.push_uci(uci)
    step = tasks.environment_step(fen, moves[-1], moves[:-1])
    assert step.history == tuple(moves[-10:]) and len(step.history) == tasks.HISTORY_LEN == 10
    wrong = tasks.environment_step(fen, "a1a8", moves[:-1])  # an illegal move's transition keeps the same field
    assert wrong.kind == "illegal" and wrong.history == (*moves[-10:-1], "a1a8")
    prompt = tasks.env_prompt(fen, moves[-1], step.history)
    assert tasks.parse_env_prompt(prompt).errors == ()
    eleven = prompt.replace("+" + " ".join(moves[-10:]) + "+", "+" + " ".join(moves[-11:]) + "+")
    spaced = prompt.replace(" ".join(moves[-2:]), "  ".join(moves[-2:]))
    assert tasks.parse_env_prompt(eleven).errors and tasks.parse_env_prompt(spaced).errors
    trailing = prompt[:-1] + " +"
    assert any("whitespace" in e for e in tasks.parse_env_prompt(trailing).errors)


def test_policy_samples_need_a_fen_before_m_and_one_layout_and_a_reward_is_a_short_number():
    assert tasks.split_policy_text("P: M: e2e4 E: 0.1 B: e2e4") is None  # no FEN before M:
    assert tasks.parse_policy("P: M: e2e4 E: 0.1 B: e2e4").errors
    fen = chess.STARTING_FEN
    for prompt_layout, completion_layout, want in (("compact", "compact", "compact"), ("original", "original", "original"),
                                                   ("original", "compact", "unknown")):
        text = tasks.policy_prompt(fen, prompt_layout) + tasks.policy_completion(["e2e4"], ["0.3"], "e2e4", completion_layout)
        assert tasks.parse_policy(text).layout == want, (prompt_layout, completion_layout)
    board = chess.Board(fen)
    board.push_uci("e2e4")
    after = board.fen()
    assert tasks.parse_env_completion(f"{after}+0.001+0+0").reward == 0.001
    assert tasks.parse_env_completion(f"{after}+{'1' * 17}+0+0").reward is None  # 17 digits: no reward text


def _after_e4() -> str:
    board = chess.Board()
    board.push_uci("e2e4")
    return board.fen()  # python-chess's FEN of a real position: the reference for a good one


def _fen_of_the_board_is_accepted():
    assert tasks.fen_error(chess.Board()) == "FEN must be a string, got Board"  # the parser's answer: no raise
    assert tasks.fen_error(_after_e4()) is None
    tasks.policy_prompt(chess.Board().fen())


@pytest.mark.parametrize("call, match, boundary", [
    pytest.param(lambda: tasks.policy_prompt(chess.Board()),  # the board, not its FEN
                 r"^policy_prompt: FEN must be a string, got Board: Board\('rnbqkbnr/",
                 _fen_of_the_board_is_accepted, id="fen-is-a-board"),
    pytest.param(lambda: tasks.env_prompt(None, "e2e4", ["e2e4"]),
                 r"^env_prompt: FEN must be a string, got NoneType: None$",
                 lambda: tasks.env_prompt(START, "e2e4", ["e2e4"]), id="fen-none"),
    pytest.param(lambda: Eval(), r"^Eval needs exactly one of cp or mate, got cp=None, mate=None$", lambda: Eval(cp=0), id="eval-neither"),
    pytest.param(lambda: Eval(cp=35, mate=2), r"^Eval needs exactly one of cp or mate, got cp=35, mate=2$", lambda: Eval(mate=2),
                 id="eval-both"),
    pytest.param(lambda: Eval(mate=0), r"Eval mate must be non-zero", lambda: Eval(mate=-1), id="eval-mate-0"),
    pytest.param(lambda: Eval(cp=tasks.MATE_CP // 2 + 1), r"^Eval cp must be in \[-50000, 50000\], got 50001$",  # |cp| <= 500 pawns (MAX_PAWNS)
                 lambda: Eval(cp=tasks.MATE_CP // 2), id="eval-cp-high"),
    pytest.param(lambda: Eval(cp=-tasks.MATE_CP // 2 - 1), r"^Eval cp must be in \[-50000, 50000\], got -50001$",
                 lambda: Eval(cp=-tasks.MATE_CP // 2), id="eval-cp-low"),
    pytest.param(lambda: tasks.env_prompt(START, "e2e4", ["g1f3", "f3g1"] * 5 + ["e2e4"]),
                 r"^env_prompt: history has 11 moves, at most 10$",
                 lambda: tasks.env_prompt(START, "e2e4", ["g1f3", "f3g1"] * 4 + ["g1f3", "e2e4"]), id="history-11"),
    pytest.param(lambda: tasks.env_completion(_after_e4(), 0.3, 0, 0),
                 r"^env_completion: reward must be one of \(0\.001, 1\.0, 0\.5, -1\.0\), got 0\.3$",
                 lambda: [tasks.env_completion(_after_e4(), r, 0, 0) for r in tasks.ENV_REWARDS], id="reward"),
])
def test_builders_name_the_bad_argument(call, match, boundary):
    with pytest.raises(ValueError, match=match):
        call()
    boundary()  # the nearest good value passes the same check


# Behaviours of chess/tasks that no test pinned (mutation round 6, stop 68: each test below is red with its mutant)

def test_an_infinite_reward_is_not_a_reward():
    """'1e999' has the shape of a number but float() makes it inf: no reward of the format (0.001, 1.0, 0.5,
    -1.0) or any finite number; the completion is not well-formed."""
    board = chess.Board()
    board.push_uci("e2e4")
    assert math.isinf(float("1e999"))
    p = tasks.parse_env_completion(f"{board.fen()}+1e999+0+0")
    assert not p.ok and p.reward is None
    assert tasks.parse_env_completion(f"{board.fen()}+0.001+0+0").ok


def test_with_fewer_than_five_legal_moves_an_answer_lists_every_legal_move():
    """A lone white king in the corner has three legal moves (python-chess): with no label, a valid answer lists
    those three, not five."""
    board = chess.Board("7k/8/8/8/8/8/8/K7 w - - 0 1")
    legal = sorted(m.uci() for m in board.legal_moves)
    assert len(legal) == 3
    assert tasks.candidates_wanted(board) == 3
    three = tasks.parse_policy_completion(f" M: {' '.join(legal)} E: 0.0 0.0 0.0 B: {legal[0]}")
    assert tasks.valid_policy_answer(board, three)
    two = tasks.parse_policy_completion(f" M: {' '.join(legal[:2])} E: 0.0 0.0 B: {legal[0]}")
    assert two.ok and not tasks.valid_policy_answer(board, two)


def test_eval_map_is_empty_when_the_counts_differ():
    """PolicyParse.eval_map's docstring: empty when the M: and E: counts differ (no guessing which eval is whose)."""
    p = tasks.parse_policy_completion(" M: e2e4 d2d4 E: 0.3 B: e2e4")
    assert p.moves == ("e2e4", "d2d4") and len(p.evals) == 1 and p.eval_map == {}
    assert tasks.PolicyParse(moves=("e2e4", "d2d4"), evals=(Eval(cp=30),)).eval_map == {}


def test_a_fen_as_wide_as_the_original_field_keeps_every_character():
    """The original prompt pads the FEN to fen_width with at least one space after it, and drops that last space
    (it belongs to ' M:'): a FEN exactly fen_width long is written whole, and parses back."""
    fen = chess.STARTING_FEN
    prompt = tasks.policy_prompt(fen, "original", fen_width=len(fen))
    assert prompt == "P: " + fen
    assert tasks.parse_policy_prompt(prompt).fen == fen


def test_an_unpadded_completion_is_not_the_original_layout():
    """The original layout pads M: to 30 and E: to 40 characters (docs: 'P: <FEN padded to 90>M: <moves padded
    to 30>E: <evals padded to 40>B:'); double spaces without those widths are neither layout."""
    text = " M: e2e4  E: 0.3  B: e2e4"
    p = tasks.parse_policy_completion(text)
    assert p.layout == "unknown"
    padded = " M: " + "e2e4".ljust(30) + "E: " + "0.3".ljust(40) + "B: e2e4"
    assert tasks.parse_policy_completion(padded).layout == "original"


def test_the_original_mate_spelling_has_the_range_of_the_compact_one():
    """A mate is M1..M999 in the compact spelling (three digits); the original spells mate n as
    (100000 - n) / 100 pawns: 990.01 is mate in 999 (100000 - 99001), 989.99 would be mate in 1001 and 900.01
    mate in 9999, no mate either spelling holds."""
    assert tasks.parse_eval("M999") == Eval(mate=999) and tasks.parse_eval("M1000") is None
    assert tasks.parse_eval("990.01") == Eval(mate=999) and tasks.parse_eval("-990.01") == Eval(mate=-999)
    for text in ("989.99", "-989.99", "900.01", "950.0"):
        assert tasks.parse_eval(text) is None, text


def test_builders_refuse_arguments_they_would_write_wrongly():
    """env_completion(..., "0", "0") wrote +1+1; a history string became single characters; Eval(mate=True)
    rendered "MTrue"; record_text(rec, "bogus") gave the original layout's texts."""
    from rookworld_lib.chess import data

    fen = chess.STARTING_FEN
    with pytest.raises(ValueError, match=r"env_completion: terminated must be 0 or 1 \(or a bool\), got '0'"):
        tasks.env_completion(fen, 0.001, "0", "0")
    assert tasks.env_completion(fen, 0.001, False, 1).endswith("+0+1")
    with pytest.raises(ValueError, match=r"previous_moves is a sequence of UCI moves, got one string 'e2e4 e7e5'"):
        tasks.environment_step(fen, "g1f3", "e2e4 e7e5")
    for bad in ({"mate": True}, {"cp": 12.7}):
        with pytest.raises(ValueError, match="must be a whole number"):
            tasks.Eval(**bad)
    rec = data.load_split("A", "test").records[0]
    with pytest.raises(ValueError):
        data.record_text(rec, "bogus")
