"""Verifiable rewards: ranking on held-out positions, components, truth sources, cache, fuzzing."""

import math
import random

import chess
import pytest
from helpers_chess import corrupt_one_char, mutate, needs_stockfish, policy_completion_for, shipped
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rookworld_lib.chess import data, engine, rewards, tasks
from rookworld_lib.chess.reward_examples import edit_chars

FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.function_scoped_fixture])
LO, HI = rewards.POLICY_RANGE


@pytest.fixture(scope="module")
def val_policy():
    return shipped("P", "val")


@pytest.fixture(scope="module")
def val_env():
    return shipped("A", "val")


def _in_range(x):
    return isinstance(x, float) and math.isfinite(x) and LO <= x <= HI


def _illegal_uci(board: chess.Board, rng: random.Random) -> str:
    while True:
        m = chess.Move(rng.choice(chess.SQUARES), rng.choice(chess.SQUARES))
        if m.from_square != m.to_square and not board.is_legal(m):
            return m.uci()


def _garbage(rng: random.Random) -> str:
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789 .,;!?/-_=()[]{}"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60)))


# ------------------------------------------------------------------------------------------
# Ranking (acceptance)
# ------------------------------------------------------------------------------------------

@needs_stockfish
def test_policy_reward_ranks_best_2nd_5th_random_illegal_garbage(val_policy):
    rng = random.Random(0)
    pool = [r for r in val_policy if len(r["moves"]) == 5 and r["n_legal"] > 5]
    assert len(pool) >= 200
    recs = rng.sample(pool, 200)
    rand_moves = []
    for r in recs:
        board = chess.Board(r["fen"])
        rand_moves.append(rng.choice(sorted(m.uci() for m in board.legal_moves if m.uci() not in r["moves"])))
    # the random legal moves are outside the candidates: the engine evaluates them (in parallel)
    prompts = [r["prompt"] for r in recs]
    rand_scores = rewards.score_batch(prompts, [policy_completion_for(r, m) for r, m in zip(recs, rand_moves)], recs)
    ok, failures = 0, []
    for r, m, s_rand in zip(recs, rand_moves, rand_scores):
        board = chess.Board(r["fen"])
        s = [rewards.score_policy(r["prompt"], policy_completion_for(r, r["moves"][k]), truth=r) for k in (0, 1, 4)]
        s_illegal = rewards.score_policy(r["prompt"], policy_completion_for(r, _illegal_uci(board, rng)), truth=r)
        s_garbage = rewards.score_policy(r["prompt"], _garbage(rng), truth=r)
        cps = [tasks.parse_eval(r["evals"][k]).to_cp() for k in (0, 1, 4)]
        d_rand = rewards.score_policy_detailed(r["prompt"], policy_completion_for(r, m), truth=r)
        rand_cp = cps[0] - d_rand.cp_loss

        def ge(a, b, cp_a, cp_b):  # >=, and strictly > where the evals differ
            return a > b if cp_a != cp_b else a >= b

        chain = (ge(s[0], s[1], cps[0], cps[1]) and ge(s[1], s[2], cps[1], cps[2])
                 and ge(s[2], s_rand, cps[2], rand_cp) and s_rand > s_illegal > s_garbage)
        ok += chain
        if not chain:
            failures.append((r["id"], s, s_rand, s_illegal, s_garbage))
        assert not d_rand.estimated and d_rand.best_rank is None
    assert ok / len(recs) >= 0.95, failures[:5]


def test_policy_reward_ranks_valid_legal_above_valid_illegal_above_malformed_with_margins(val_policy):
    """Issue 14's check: the bands GRPO's group advantages see. Format-valid means the parser's verdict,
    the strict policy/valid metric. The malformed cases are the SFT model's real failures: the best move
    five times (greedy repetition), B: outside M:, a missing field."""
    rng = random.Random(4)
    bands = {"valid_legal": [], "valid_illegal": [], "malformed": [], "garbage": []}
    for r in [x for x in val_policy if len(x["moves"]) == 5 and x["n_legal"] > 5][:60]:
        board, m, e, p = chess.Board(r["fen"]), r["moves"], r["evals"], r["prompt"]
        other = rng.choice(sorted(x.uci() for x in board.legal_moves if x.uci() not in m))
        il = _illegal_uci(board, rng)
        texts = {"valid_legal": [policy_completion_for(r, m[k]) for k in (0, 4)]
                 + [f" M: {' '.join(m[:4] + [other])} E: {' '.join(e)} B: {other}"],
                 "valid_illegal": [f" M: {' '.join(m[:4] + [il])} E: {' '.join(e)} B: {il}"],
                 "malformed": [f" M: {' '.join([m[0]] * 5)} E: {' '.join([e[0]] * 5)} B: {m[0]}",
                               policy_completion_for(r, other), f" M: {' '.join(m)} B: {m[0]}"],
                 "garbage": [_garbage(rng), ""]}
        for band, completions in texts.items():
            assert all(tasks.parse_policy_completion(c).ok == band.startswith("valid") for c in completions), band
            bands[band] += [rewards.score_policy(p, c, truth=r) for c in completions]
    lo = {k: min(v) for k, v in bands.items()}
    hi = {k: max(v) for k, v in bands.items()}
    # every member of a band above every member of the next, by at least 0.2 (garbage: a floor)
    assert lo["valid_legal"] >= hi["valid_illegal"] + 0.2
    assert lo["valid_illegal"] >= hi["malformed"] + 0.2
    assert lo["malformed"] > hi["garbage"] == -1.0
    # the ungated reward let the greedy failure (best move x5) outscore a valid answer with a worse move
    ungated = rewards.PolicyWeights(format_gate=False)
    r = next(x for x in val_policy if len(x["moves"]) == 5 and x["n_legal"] > 5)
    repeat = f" M: {' '.join([r['moves'][0]] * 5)} E: {' '.join([r['evals'][0]] * 5)} B: {r['moves'][0]}"
    worse = policy_completion_for(r, r["moves"][4])
    assert rewards.score_policy(r["prompt"], repeat, truth=r, weights=ungated) > 0.75
    assert rewards.score_policy(r["prompt"], repeat, truth=r) < 0 < rewards.score_policy(r["prompt"], worse, truth=r)


def test_environment_reward_ranks_exact_corrupted_garbage(val_env):
    rng = random.Random(1)
    for r in val_env:
        exact = rewards.score_environment(r["prompt"], r["completion"], truth=r)
        fen, rest = r["completion"].split("+", 1)
        corrupted = rewards.score_environment(r["prompt"], corrupt_one_char(fen, rng) + "+" + rest, truth=r)
        garbage = rewards.score_environment(r["prompt"], _garbage(rng), truth=r)
        assert exact == 1.0 > corrupted > garbage, (r["id"], exact, corrupted, garbage)


def test_environment_reward_without_truth_replays_the_prompt(val_env):
    for r in val_env[:100]:
        d = rewards.score_environment_detailed(r["prompt"], r["completion"])
        assert d.truth_source == "replay" and d.total == 1.0


# ------------------------------------------------------------------------------------------
# Components
# ------------------------------------------------------------------------------------------

def test_policy_components_on_a_worked_example(val_policy):
    r = next(x for x in val_policy if len(x["moves"]) == 5 and x["n_legal"] > 5
             and tasks.parse_eval(x["evals"][0]).to_cp() - tasks.parse_eval(x["evals"][4]).to_cp() > 30)
    prompt, best = r["prompt"], r["best"]
    perfect = rewards.score_policy_detailed(prompt, r["completion"], truth=r)
    assert perfect.total == 1.0 and perfect.best_rank == 1 and perfect.cp_loss == 0 and perfect.errors == ()
    # only B: present: legal best move, no candidates or evals. Ungated it earns its components; gated
    # (the default) it is malformed, so it lands in MALFORMED_RANGE at the same affine position
    ungated = rewards.PolicyWeights(format_gate=False)
    only_b = rewards.score_policy_detailed(prompt, f" B: {best}", truth=r, weights=ungated)
    assert only_b.best_quality == 1.0 and only_b.moves_overlap == 0 and 0 < only_b.total < perfect.total
    lo, hi = rewards.MALFORMED_RANGE
    gated = rewards.score_policy(prompt, f" B: {best}", truth=r)
    assert gated == pytest.approx(lo + (hi - lo) * (only_b.total + 0.5) / 1.5)
    # wrong evals cost eval accuracy only
    bad_e = policy_completion_for(r, best).replace(" E: ", " E: 9.0 ", 1)
    bad_e = bad_e.replace(" " + r["evals"][-1] + " B:", " B:")
    d = rewards.score_policy_detailed(prompt, bad_e, truth=r)
    assert d.evals_accuracy < 1 and d.best_quality == 1.0 and d.total < 1.0
    # an illegal M: candidate costs move legality and overlap
    board = chess.Board(r["fen"])
    bad_m = f" M: {_illegal_uci(board, random.Random(2))} {' '.join(r['moves'][1:])} E: {' '.join(r['evals'])} B: {r['moves'][1]}"
    d = rewards.score_policy_detailed(prompt, bad_m, truth=r)
    assert d.moves_legal == 0.8 and d.moves_overlap == 0.8 and d.best_rank == 2
    # B: missing or illegal: ungated in [-0.5, -0.25], above garbage
    missing = rewards.score_policy(prompt, f" M: {best} E: 0.1", truth=r, weights=ungated)
    illegal = rewards.score_policy(prompt, policy_completion_for(r, _illegal_uci(board, random.Random(3))), truth=r,
                                   weights=ungated)
    assert -0.5 <= missing <= -0.25 and -0.5 <= illegal <= -0.25 and missing < illegal
    assert rewards.score_policy(prompt, "", truth=r) == -1.0


def test_layouts_score_alike(val_policy):
    for r in val_policy[:30]:
        compact = rewards.score_policy(r["prompt"], r["completion"], truth=r)
        prompt, completion = tasks.policy_text(r["fen"], r["moves"], r["evals"], r["best"], "original")
        assert rewards.score_policy(prompt, completion, truth=r) == compact == 1.0


def test_quality_is_graded_by_centipawn_loss():
    q = [rewards.quality_from_cp(50, 50 - loss) for loss in (0, 10, 50, 100, 300, 900, 5000)]
    assert q[0] == 1.0 and all(a > b for a, b in zip(q, q[1:])) and q[-1] < 0.1
    # mate in 1 beats mate in 3 even where both win probabilities round to 1.0
    assert rewards.quality_from_cp(tasks.Eval(mate=1).to_cp(), tasks.Eval(mate=3).to_cp()) < 1.0
    assert rewards.move_accuracy(0.0) == 1.0 and rewards.move_accuracy(1.0) == 0.0


def test_rewards_vary_with_the_answer_not_a_constant(val_policy):
    """The pitfall of a reward that is the same for every legal answer (ground truth dropped)."""
    values = set()
    for r in val_policy[:60]:
        for k in range(len(r["moves"])):
            values.add(round(rewards.score_policy(r["prompt"], policy_completion_for(r, r["moves"][k]), truth=r), 6))
    assert len(values) > 40


def test_environment_components():
    fen = chess.STARTING_FEN
    tr = tasks.environment_step(fen, "g1f3")
    prompt, good = tr.prompt, tr.completion
    full = rewards.score_environment_detailed(prompt, good)
    assert full.total == 1.0 and full.fen_exact == 1.0
    wrong_reward = rewards.score_environment_detailed(prompt, good.replace("+0.001+", "+1.0+"))
    assert wrong_reward.reward == 0 and wrong_reward.total == pytest.approx(0.9)
    wrong_flags = rewards.score_environment_detailed(prompt, good[:-3] + "1+1")
    assert wrong_flags.terminated == 0 and wrong_flags.truncated == 0 and wrong_flags.total == pytest.approx(0.8)
    side = rewards.score_environment_detailed(prompt, good.replace(" b KQkq", " w KQkq"))
    assert side.fen_exact == 0 and side.fen_fields == pytest.approx(0.9)
    assert rewards.score_environment(prompt, good + "+") == 1.0  # the original data's trailing '+'
    assert rewards.score_environment(prompt, good + tasks.EOT) == 1.0
    assert rewards.score_environment(prompt, "") == -1.0
    illegal = tasks.environment_step(fen, "e2e5")
    assert rewards.score_environment(illegal.prompt, illegal.completion) == 1.0
    assert rewards.score_environment(illegal.prompt, good) < 0.5


def test_fen_field_credit():
    t = chess.STARTING_FEN
    assert rewards.fen_field_credit(t, t) == pytest.approx(1.0)
    one_square = t.replace("RNBQKBNR", "RNBQKBN1", 1)
    assert rewards.fen_field_credit(one_square, t) == pytest.approx(0.5 * 63 / 64 + 0.5)
    assert rewards.fen_field_credit("", t) == 0.0
    assert rewards.fen_field_credit("x y z", t) < 0.1


@pytest.mark.parametrize("cls, kwargs, field", [
    (rewards.PolicyWeights, dict(best_quality=-0.1, format=0.7), "best_quality"),
    (rewards.PolicyWeights, dict(unlisted_margin_cp=-5), "unlisted_margin_cp"),
    (rewards.EnvWeights, dict(reward=float("nan")), "reward"),
])
def test_weights_are_validated(cls, kwargs, field):
    with pytest.raises(ValueError, match=f"{cls.__name__}.{field}"):
        cls(**kwargs)
    with pytest.raises(ValueError, match="sum to 1"):
        rewards.PolicyWeights(format=0.5)


# ------------------------------------------------------------------------------------------
# Truth sources, cache, determinism
# ------------------------------------------------------------------------------------------

@needs_stockfish
def test_live_engine_truth_matches_the_data_set(val_policy):
    rewards.clear_truth()
    for r in val_policy[:6]:
        for move in r["moves"][:3]:
            c = policy_completion_for(r, move)
            live = rewards.score_policy_detailed(r["prompt"], c)
            assert live.truth_source == "engine"
            assert live.total == rewards.score_policy(r["prompt"], c, truth=r)


def test_registered_truth_is_used_without_the_argument(val_policy, val_env):
    rewards.clear_truth()
    try:
        assert rewards.register_truth(val_policy[:20] + val_env[:20]) == 40
        r = val_policy[3]
        d = rewards.score_policy_detailed(r["prompt"], r["completion"], engine=None)
        assert d.truth_source == "registered" and d.total == 1.0
        e = val_env[3]
        assert rewards.score_environment_detailed(e["prompt"], e["completion"]).truth_source == "registered"
    finally:
        rewards.clear_truth()
    with pytest.raises(rewards.MissingTruthError, match="no ground truth"):
        rewards.score_policy(r["prompt"], r["completion"], engine=None)


def test_truth_for_another_position_is_a_clear_error(val_policy, val_env):
    a, b = val_policy[0], val_policy[1]
    with pytest.raises(rewards.TruthError, match="not for the prompt's position"):
        rewards.score_policy(a["prompt"], a["completion"], truth=b)
    with pytest.raises(rewards.TruthError, match="unusable policy truth"):
        rewards.score_policy(a["prompt"], a["completion"], truth=val_env[0])
    # the en-passant square counts where a pawn can take there (python-chess: e5d6 is legal in one, not the
    # other): the truth of the position with it is not the prompt's without it; an uncapturable one is the same
    with_ep, without = "4k3/8/8/3pP3/8/8/8/4K3 w - d6 0 2", "4k3/8/8/3pP3/8/8/8/4K3 w - - 0 2"
    assert chess.Board(with_ep).is_legal(chess.Move.from_uci("e5d6")) and not chess.Board(without).is_legal(
        chess.Move.from_uci("e5d6"))
    truth = {"fen": with_ep, "moves": ["e5d6", "e1d2"], "evals": ["1.5", "0.0"]}
    with pytest.raises(rewards.TruthError, match="not for the prompt's position"):
        rewards.score_policy(tasks.policy_prompt(without), " M: e5d6 e1d2 E: 1.5 0.0 B: e5d6", truth=truth, engine=None)
    assert rewards.score_policy(tasks.policy_prompt(with_ep), " M: e5d6 e1d2 E: 1.5 0.0 B: e5d6", truth=truth,
                                engine=None) == 1.0
    idle = "4k3/8/8/3p4/8/8/8/4K3 w - - 0 2"  # no white pawn beside d5 to take on d6: the square is spelling only
    truth = {"fen": "4k3/8/8/3p4/8/8/8/4K3 w - d6 0 2", "moves": ["e1d2"], "evals": ["0.0"]}
    assert rewards.score_policy(tasks.policy_prompt(idle), " M: e1d2 E: 0.0 B: e1d2", truth=truth, engine=None) > 0


def test_offline_scoring_estimates_unlisted_moves(val_policy):
    r = next(x for x in val_policy if len(x["moves"]) == 5 and x["n_legal"] > 5)
    board = chess.Board(r["fen"])
    other = next(m.uci() for m in board.legal_moves if m.uci() not in r["moves"])
    d = rewards.score_policy_detailed(r["prompt"], policy_completion_for(r, other), truth=r, engine=None)
    fifth = rewards.score_policy(r["prompt"], policy_completion_for(r, r["moves"][4]), truth=r, engine=None)
    assert d.estimated and d.best_rank is None and d.total < fifth


@pytest.mark.fault
def test_no_truth_and_no_stockfish_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("STOCKFISH_PATH", str(tmp_path / "missing"))
    rewards.clear_truth()
    prompt = tasks.policy_prompt("4k3/8/8/8/8/8/3PP3/4K3 w - - 0 1")
    with pytest.raises(engine.StockfishNotFoundError, match="apt-get install -y stockfish"):
        rewards.score_policy(prompt, " M: e1f1 E: 0.1 B: e1f1")
    # the environment reward needs no engine
    tr = tasks.environment_step("4k3/8/8/8/8/8/3PP3/4K3 w - - 0 1", "e1f1")
    assert rewards.score_environment(tr.prompt, tr.completion) == 1.0


def test_cache_hits_and_determinism(val_policy):
    r = val_policy[10]
    c = policy_completion_for(r, r["moves"][2])
    rewards.clear_cache()
    first = rewards.score_policy(r["prompt"], c, truth=r)
    before = rewards.cache_info()["policy"]["hits"]
    assert rewards.score_policy(r["prompt"], c, truth=r) == first
    assert rewards.cache_info()["policy"]["hits"] == before + 1
    assert rewards.score_policy(r["prompt"], c, truth=r, cache=False) == first
    rewards.clear_cache(analyses=True)
    assert rewards.score_policy(r["prompt"], c, truth=r) == first


def test_dispatch_and_batches(val_policy, val_env):
    p, a = val_policy[0], val_env[0]
    assert rewards.score(p["prompt"], p["completion"], truth=p) == 1.0
    assert rewards.score(a["prompt"], a["completion"], truth=a, engine=None) == 1.0
    assert rewards.score("Q: what", "x") == -1.0
    assert rewards.score_batch([p["prompt"], a["prompt"]], [p["completion"], a["completion"]], [p, a]) == [1.0, 1.0]
    with pytest.raises(ValueError, match="same length"):
        rewards.score_batch([p["prompt"]], [], None)


# ------------------------------------------------------------------------------------------
# Fuzzing: never raise, always a finite value in range
# ------------------------------------------------------------------------------------------

@FUZZ
@given(completion=st.text(max_size=200), idx=st.integers(0, 10_000))
def test_fuzz_arbitrary_policy_completions(val_policy, completion, idx):
    r = val_policy[idx % len(val_policy)]
    x = rewards.score_policy(r["prompt"], completion, truth=r, engine=None)
    assert _in_range(x)
    d = rewards.score_policy_detailed(r["prompt"], completion, truth=r, engine=None)
    assert d.total == x and not any(e.startswith("internal") for e in d.errors)


@FUZZ
@given(completion=st.text(max_size=200), idx=st.integers(0, 10_000))
def test_fuzz_arbitrary_environment_completions(val_env, completion, idx):
    r = val_env[idx % len(val_env)]
    assert _in_range(rewards.score_environment(r["prompt"], completion, truth=r))
    d = rewards.score_environment_detailed(r["prompt"], completion)
    assert _in_range(d.total) and not any(e.startswith("internal") for e in d.errors)


_EDITS = st.lists(st.tuples(st.sampled_from("rids"), st.integers(0, 400),
                            st.sampled_from(list("abcdefgh12345678qrbnkpPNBRQK/ -+.M:E0#\n"))), min_size=1, max_size=6)


def _apply(text, edits):
    chars = list(text)
    for op, i, c in edits:
        edit_chars(chars, op, min(i, len(chars)), c)
    return "".join(chars)


@FUZZ
@given(idx=st.integers(0, 10_000), edits=_EDITS)
def test_fuzz_mutated_real_completions(val_policy, val_env, idx, edits):
    p = val_policy[idx % len(val_policy)]
    d = rewards.score_policy_detailed(p["prompt"], _apply(p["completion"], edits), truth=p, engine=None)
    assert _in_range(d.total) and not any(e.startswith("internal") for e in d.errors)
    a = val_env[idx % len(val_env)]
    mutated = _apply(a["completion"], edits)
    e = rewards.score_environment_detailed(a["prompt"], mutated)
    assert _in_range(e.total) and not any(x.startswith("internal") for x in e.errors)
    if e.total == 1.0:  # full marks only for an answer that still says exactly the truth
        parsed = tasks.parse_env_completion(mutated)
        assert (parsed.new_fen, parsed.reward, parsed.terminated, parsed.truncated) == \
            (a["new_fen"], a["reward"], a["terminated"], a["truncated"])


@FUZZ
@given(prompt=st.text(max_size=120), completion=st.text(max_size=80))
def test_fuzz_arbitrary_prompts(prompt, completion):
    assert _in_range(rewards.score_environment(prompt, completion))
    assert _in_range(rewards.score_policy(prompt, completion, engine=None))
    assert _in_range(rewards.score("P: " + prompt, completion, engine=None))


@FUZZ
@given(st.one_of(st.none(), st.integers(), st.binary(max_size=20), st.lists(st.text(max_size=5), max_size=3)))
def test_fuzz_non_string_inputs(value):
    assert rewards.score_environment(value, value) == -1.0
    assert rewards.score_policy(value, value, engine=None) == -1.0


@pytest.mark.fault
@needs_stockfish
def test_mutated_real_completions_with_the_live_engine(val_policy, val_env):
    rng = random.Random(5)
    n = 0
    for r in rng.sample(val_policy, 40):
        for _ in range(8):
            m = mutate(r["completion"], rng, edits=rng.randint(1, 3))
            assert _in_range(rewards.score_policy(r["prompt"], m, truth=r))
            n += 1
    for r in rng.sample(val_env, 60):
        for _ in range(8):
            m = mutate(r["completion"], rng, edits=rng.randint(1, 3))
            assert _in_range(rewards.score_environment(r["prompt"], m))
            n += 1
    assert n == 800


# --- References and hand-worked values for the reward's constants and rules -------------------
# Lichess (lila, modules/analyse: WinPercent.scala, AccuracyPercent.scala; lichess.org/page/accuracy), in
# percent: Win% = 50 + 50 * (2 / (1 + exp(-0.00368208 * cp)) - 1);
# Accuracy% = 103.1668 * exp(-0.04354 * (Win%before - Win%after)) - 3.1669, clipped to [0, 100].

def _lichess_win_pct(cp: float) -> float:
    return 50 + 50 * (2 / (1 + math.exp(-0.00368208 * cp)) - 1)


def _lichess_accuracy_pct(win_before: float, win_after: float) -> float:
    return min(100.0, max(0.0, 103.1668 * math.exp(-0.04354 * (win_before - win_after)) - 3.1669))


def test_win_probability_and_move_accuracy_are_lichess_formulas():
    for cp in (-1500, -300, -35, 0, 20, 100, 450, 2000):
        assert tasks.win_prob(cp) == pytest.approx(_lichess_win_pct(cp) / 100, abs=1e-12)
    for before, after in ((60.0, 60.0), (62.5, 55.0), (80.0, 30.0), (100.0, 0.0), (51.0, 50.2), (40.0, 45.0)):
        # ours is in [0, 1], scaled so that no drop scores exactly 1 (Lichess: 99.9999%)
        assert rewards.move_accuracy((before - after) / 100) == pytest.approx(
            min(1.0, _lichess_accuracy_pct(before, after) / 99.9999), abs=1e-9)


def test_quality_is_lichess_accuracy_and_centipawn_loss_mixed_nine_to_one():
    for best, move in ((50, -100), (300, 250), (-20, -900), (0, -2000)):
        accuracy = _lichess_accuracy_pct(_lichess_win_pct(best), _lichess_win_pct(move)) / 99.9999
        loss = min(best - move, 1000) / 1000
        assert rewards.quality_from_cp(best, move) == pytest.approx(0.9 * accuracy + 0.1 * (1 - loss), abs=1e-9)


def test_environment_format_counts_readable_fields_and_the_field_count():
    # format = (readable fields among new FEN, reward, terminated, truncated + 1 for exactly four) / 5
    tr = tasks.environment_step(chess.STARTING_FEN, "g1f3")
    good, (fen, *_) = tr.completion, tr.completion.split("+")
    cases = {good: 5 / 5, "x+0.001+0+0": 4 / 5, f"{fen}+x+0+0": 4 / 5, "x+x+0+0": 3 / 5, "x+x+x+0": 2 / 5,
             good + "+9": 4 / 5}
    for completion, want in cases.items():
        assert rewards.score_environment_detailed(tr.prompt, completion).format == pytest.approx(want), completion


def test_fen_field_credit_hand_counted():
    t = chess.STARTING_FEN  # credit: 0.5 x the share of the 64 squares, + 0.1 per equal later field
    rank3 = "rnbqkbnr/pppppppp/8/8/8/{}/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
    # every square right, spelled "44": the squares count 64/64, but a differently spelled placement gets at most 63/64
    assert rewards.fen_field_credit(rank3.format("44"), t) == pytest.approx(0.5 * 63 / 64 + 0.5)
    # a ninth rank: the first eight match, but a malformed placement gets at most 63/64
    assert rewards.fen_field_credit(t.replace("RNBQKBNR w", "RNBQKBNR/8 w"), t) == pytest.approx(0.5 * 63 / 64 + 0.5)
    # a seventh field: the placement and five fields match, one field's credit taken back
    assert rewards.fen_field_credit(t + " 7", t) == pytest.approx(0.5 + 0.4)
    # a missing rank: ranks 1-5 of the prediction match (40 squares), then each is one rank off
    assert rewards.fen_field_credit("rnbqkbnr/pppppppp/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", t) == pytest.approx(
        0.5 * 40 / 64 + 0.5)
    # side to move and halfmove clock wrong
    assert rewards.fen_field_credit(t.replace(" w ", " b ").replace(" 0 1", " 3 1"), t) == pytest.approx(0.5 + 0.3)


def test_an_invalid_fen_earns_the_en_passant_credit_as_the_truth_writes_it():
    """After 1.e4 the compact data write e3 (the standard FEN), python-chess's default "-". An invalid
    prediction (a rank of nine squares) that writes e3 as its training data do lost the field's 0.1 to
    one writing "-"; now both earn it, and against a truth written "-" (the original layout's) only "-"."""
    board = chess.Board()
    board.push_uci("e2e4")
    standard, default = board.fen(en_passant="fen"), board.fen()
    assert " e3 " in standard and " - " in default
    invalid = standard.replace("4P3", "4P4")
    full = 0.5 * 63 / 64 + 0.5  # every square but the spelling, and the five later fields
    assert rewards.fen_field_credit(invalid, standard) == rewards.fen_field_credit(invalid.replace(" e3 ", " - "), standard) == pytest.approx(full)
    assert rewards.fen_field_credit(invalid.replace(" e3 ", " e6 "), standard) == pytest.approx(full - 0.1)
    assert rewards.fen_field_credit(invalid, default) == pytest.approx(full - 0.1)
    assert rewards.fen_field_credit(invalid.replace(" e3 ", " - "), default) == pytest.approx(full)


MOVES = ["e2e4", "d2d4", "g1f3", "c2c4", "b1c3"]


def _detail(evals, best, weights=None, engine=None, moves=MOVES):
    """The policy score of an answer naming `best` (every other field the truth's own) against a truth of
    the starting position whose candidates carry the given evals (labels, not Stockfish's)."""
    truth = {"fen": chess.STARTING_FEN, "moves": moves, "evals": evals}
    prompt, completion = tasks.policy_text(chess.STARTING_FEN, moves, evals, moves[0], "compact")
    completion = completion.rsplit(" B: ", 1)[0] + f" B: {best}"
    return rewards.score_policy_detailed(prompt, completion, truth=truth, engine=engine, weights=weights, cache=False)


def test_an_unlisted_move_ranks_strictly_below_a_mating_or_mated_last_candidate():
    # offline, an unlisted move is one move slower to mate (or one sooner to be mated) than the last candidate
    for evals in (["M1", "M2", "M3", "M4", "M5"], ["0.3", "0.2", "0.1", "-M4", "-M2"]):
        fifth, unlisted = _detail(evals, MOVES[4]), _detail(evals, "a2a3")
        assert unlisted.estimated and unlisted.cp_loss == fifth.cp_loss + 1  # M5 -> M6, -M2 -> -M1
        assert unlisted.best_quality < fifth.best_quality if evals[0] == "M1" else unlisted.best_quality <= fifth.best_quality
    # mated in 1 is the floor: nothing is worse, so the estimate equals it
    evals = ["0.3", "0.2", "0.1", "-M4", "-M1"]
    assert _detail(evals, "a2a3").best_quality == _detail(evals, MOVES[4]).best_quality


@needs_stockfish
def test_an_engine_searched_unlisted_move_never_ranks_above_the_last_candidate():
    # the labels put the last candidate at -9 pawns; Stockfish puts a2a3 near 0: it is capped at -9, the
    # truth's ranking (an unlisted move is no better than the listed ones) wins over a second search
    evals = ["9.0", "8.0", "7.0", "6.0", "-9.0"]
    fifth, unlisted = _detail(evals, MOVES[4], engine="auto"), _detail(evals, "a2a3", engine="auto")
    assert not unlisted.estimated and unlisted.best_quality == fifth.best_quality and unlisted.cp_loss == 1800


def test_graded_evals_accuracy_takes_each_moves_first_eval():
    graded = rewards.GradedWeights()
    truth = {"fen": chess.STARTING_FEN, "moves": MOVES[:2], "evals": ["0.3", "0.3"]}
    prompt, _ = tasks.policy_text(chess.STARTING_FEN, MOVES[:2], ["0.3", "0.3"], "e2e4", "compact")
    right_first = rewards.score_policy_detailed(prompt, " M: e2e4 e2e4 d2d4 E: 0.3 9.0 0.3 B: e2e4", truth=truth,
                                                engine=None, weights=graded)
    assert right_first.evals_accuracy == 1.0
    wrong_first = rewards.score_policy_detailed(prompt, " M: e2e4 e2e4 d2d4 E: 9.0 0.3 0.3 B: e2e4", truth=truth,
                                                engine=None, weights=graded)
    off = abs(_lichess_win_pct(900) - _lichess_win_pct(30)) / 100  # e2e4's first eval, 9.0 against 0.3
    assert wrong_first.evals_accuracy == pytest.approx(((1 - off) + 1.0) / 2)


def test_a_policy_prompt_of_a_finished_game_has_nothing_to_score():
    """A P: prompt whose position has no legal move (checkmate, stalemate; python-chess says so) asks for
    no answer: every completion scores the floor of its reward, naming why."""
    for fen in ("rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3",  # fool's mate
                "7k/5Q2/6K1/8/8/8/8/8 b - - 0 1"):  # stalemate
        assert not any(chess.Board(fen).legal_moves)
        prompt = tasks.policy_prompt(fen)
        detailed = rewards.score_policy_detailed(prompt, " M: e2e4 E: 0.1 B: e2e4", truth=None)
        assert detailed.total == -1.0 and detailed.errors == ("prompt: the position has no legal moves",), detailed



# --- truth fields of odd types and engine answers the data never hold (a coverage audit) ---

def test_a_truth_field_of_an_unhashable_type_is_refused_as_unusable_not_a_type_error():
    """A truth whose moves are a dict or a list of lists (a mangled record) cannot key the truth cache;
    it is checked uncached and refused as any bad truth is, naming the field, not with lru_cache's
    "unhashable type" TypeError."""
    with pytest.raises(rewards.TruthError, match=r"^unusable policy truth: field 'moves' must be a list of 1\.\.5 legal "
                                                r"UCI moves, got \{'e2e4': 1\}$"):
        rewards.policy_truth({"fen": chess.STARTING_FEN, "moves": {"e2e4": 1}, "evals": ["0.3"]})
    with pytest.raises(rewards.TruthError, match=r"^unusable policy truth: move \['e2e4'\] in 'moves' is not a legal"):
        rewards.score_policy(tasks.policy_prompt(chess.STARTING_FEN), " M: e2e4 E: 0.3 B: e2e4",
                             truth={"fen": chess.STARTING_FEN, "moves": [["e2e4"]], "evals": ["0.3"]}, engine=None)
    assert rewards.policy_truth({"fen": chess.STARTING_FEN, "moves": ["e2e4"], "evals": ["0.3"]}).moves == ("e2e4",)


class _SpyPool:
    """An EnginePool stand-in that answers every search with `evals` (moves: the root moves searched) and
    records each call's multipv, limit and root moves."""

    def __init__(self, evals):
        self.evals, self.calls = tuple(evals), []

    def analyse(self, board, multipv=None, limit=None, root_moves=None):
        self.calls.append((multipv, limit, root_moves))
        moves = tuple(root_moves or ())[:len(self.evals)]
        return engine.Analysis(board.fen(en_passant="fen"), moves, self.evals[:len(moves)], "depth=8")


def test_an_unlisted_move_of_a_truth_with_an_unknown_limit_is_searched_at_the_engines_own_limit():
    """Converted original data label their searches 'unknown': an unlisted B: move is then searched at the
    engine's own limit (limit=None), one line restricted to that move, as is one past engine.LIMIT_RANGES
    (depth=99 would hold the reward for days); a truth of 'depth=8' searches at depth 8. The searched
    eval counts: -0.50 against the best candidate's 0.30 is a loss of 80 cp."""
    evals = ["0.3", "0.2", "0.1", "0.0", "-0.1"]
    prompt, completion = tasks.policy_text(chess.STARTING_FEN, MOVES, evals, MOVES[0], "compact")
    completion = completion.rsplit(" B: ", 1)[0] + " B: a2a3"
    for label, limit in (("unknown", None), ("depth=99", None), ("depth=8", chess.engine.Limit(depth=8))):
        pool = _SpyPool([tasks.Eval(cp=-50)])
        truth = {"fen": chess.STARTING_FEN, "moves": MOVES, "evals": evals, "limit": label}
        d = rewards.score_policy_detailed(prompt, completion, truth=truth, engine=pool, cache=False)
        assert pool.calls == [(1, limit, ["a2a3"])], pool.calls
        assert d.errors == ("B: move is not among the M: candidates",)  # the format's rule, not the engine's
        assert d.estimated is False and d.best_rank is None and d.cp_loss == 80.0


def test_trl_columns_carry_the_records_limit_to_the_unlisted_move_search():
    """TRL's `limit` column is part of the truth. A record labelled 'unknown' (converted original data)
    has an unlisted B: searched at the engine's own limit (limit=None), a 'depth=3' one at depth 3; the
    module docstring and test_rewards say so for truth= given directly."""
    moves, evals = ["e2e4", "d2d4", "g1f3", "c2c4", "b1c3"], ["0.3", "0.2", "0.1", "0.0", "-0.1"]
    prompt = "P: " + chess.STARTING_FEN
    completion = f" M: {' '.join(moves)} E: {' '.join(evals)} B: a2a3"
    for label, want in (("unknown", None), ("depth=3", chess.engine.Limit(depth=3))):
        pool = _SpyPool([tasks.Eval(cp=-50)])
        f = rewards.trl_reward_function("P", engine=pool)
        rewards.clear_cache()
        f([prompt], [completion], fen=[chess.STARTING_FEN], moves=[moves], evals=[evals], limit=[label])
        assert pool.calls == [(1, want, ["a2a3"])], (label, pool.calls)


def test_an_engine_that_answers_no_line_scores_a_legal_move_without_quality():
    """Where the engine's search returns no principal variation (no candidates, no evals: a search cut off
    before its first line), a legal B: move is scored with no quality and no centipawn loss, marked
    estimated, rather than failing on the missing eval."""
    fen = "4k3/8/8/8/8/8/3PP3/4K3 w - - 0 1"  # a position no shipped data set registers
    pool = _SpyPool([])
    d = rewards.score_policy_detailed(tasks.policy_prompt(fen), " M: e1f1 E: 0.1 B: e1f1", engine=pool, cache=False)
    assert pool.calls == [(None, None, None), (1, chess.engine.Limit(depth=8), ["e1f1"])], pool.calls  # position, move
    assert d.truth_source == "engine" and d.errors == ()
    assert (d.best_legal, d.best_quality, d.cp_loss, d.best_rank, d.estimated) == (1.0, 0.0, None, None, True)


# Behaviours of chess/rewards that no test pinned (mutation round 6, stop 68: each test below is red with its mutant)

def test_format_is_the_fraction_of_its_five_checks_hand_counted():
    """The module docstring's five format checks (fields in order; 1-5 distinct UCI moves; as many
    evals; B: among the moves; no other text), each worth 1/5. g1f3 is legal at the start (python-chess) but
    not among the M: moves: 4/5. Text after the end-of-text token is 'other text': 4/5. Both in the graded
    reward's `format` component and in the default reward's."""
    truth = {"fen": chess.STARTING_FEN, "moves": ["e2e4", "d2d4"], "evals": ["0.3", "0.3"]}
    prompt = "P: " + chess.STARTING_FEN
    assert chess.Board().is_legal(chess.Move.from_uci("g1f3"))
    cases = {" M: e2e4 d2d4 E: 0.3 0.3 B: e2e4": 1.0,
             " M: e2e4 d2d4 E: 0.3 0.3 B: g1f3": 0.8,
             " M: e2e4 d2d4 E: 0.3 0.3 B: e2e4<|endoftext|>junk": 0.8}
    for completion, want in cases.items():
        for w in (rewards.GradedWeights(), rewards.PolicyWeights()):
            d = rewards.score_policy_detailed(prompt, completion, truth=truth, engine=None, weights=w, cache=False)
            assert d.format == pytest.approx(want, abs=1e-12), (completion, type(w).__name__)


def test_score_batch_refuses_truths_of_another_length():
    """score_batch's docstring/message: prompts, completions and truths have the same length."""
    p = shipped("P", "val")[:2]
    with pytest.raises(ValueError, match="same length"):
        rewards.score_batch([p[0]["prompt"]], [p[0]["completion"]], [p[0], p[1]], engine=None)


def test_weights_that_sum_to_slightly_more_than_one_are_refused():
    """'weights must sum to 1 (so legal answers score in [0, 1])': 1.05 is not 1."""
    with pytest.raises(ValueError, match="sum to 1"):
        rewards.PolicyWeights(best_quality=0.55)
    with pytest.raises(ValueError, match="sum to 1"):
        rewards.GradedWeights(best_legal=0.25)
    with pytest.raises(ValueError, match="sum to 1"):
        rewards.EnvWeights(format=0.05)


def test_register_truth_counts_only_the_truths_it_registers():
    """register_truth 'returns how many' truths it remembers: a mate-in-one record holds none."""
    p = shipped("P", "val")[0]
    m1 = shipped("M1", None)[0]
    assert m1["task"] == "M1"
    rewards.clear_truth()
    try:
        assert rewards.register_truth([p, m1]) == 1
    finally:
        rewards.clear_truth()


@pytest.mark.parametrize("engine", ["stockfish", 42, True])
def test_an_engine_argument_that_is_no_pool_is_raised_not_scored_as_a_bad_answer(engine):
    """engine="stockfish" scored every answer -1.0 with "internal error: AttributeError" (the safety net
    for bugs), though no completion can make that argument right: it is a set-up error, raised."""
    rec = data.load_split("P", "test").records[0]
    with pytest.raises(rewards.EngineArgumentError, match=r"^engine must be 'auto', None or an engine pool"):
        rewards.score_policy_detailed(rec["prompt"], rec["completion"], truth=rec, engine=engine, cache=False)
    assert rewards.score_policy_detailed(rec["prompt"], rec["completion"], truth=rec, engine=None, cache=False).total == 1.0


def test_weights_of_another_kind_are_named_not_unhashable():
    rec = data.load_split("P", "test").records[0]
    with pytest.raises(ValueError, match=r"^weights must be PolicyWeights or GradedWeights \(None: the default\), got dict$"):
        rewards.score_policy_detailed(rec["prompt"], rec["completion"], truth=rec, engine=None, weights={})
    env = data.load_split("A", "test").records[0]
    with pytest.raises(ValueError, match=r"^weights must be EnvWeights \(None: the default\), got PolicyWeights$"):
        rewards.score_environment_detailed(env["prompt"], env["completion"], truth=env, weights=rewards.PolicyWeights())
