"""The graded policy reward (issue 26): components computed in every answer, malformed or not, each
raising the total in every band; the lenient field reader; the components as TRL-signature reward
functions for the GRPO trainer; and the default policy reward unchanged. Truth: the shipped records
(engine=None, no Stockfish); legality: python-chess."""

import math
import random

import chess
import pytest
from helpers_chess import mutate, shipped

from rookworld_lib.chess import rewards, tasks
from rookworld_lib.chess.reward_examples import reward_distribution
from rookworld_lib.core.train_grpo import PromptItem, score_completions

G = rewards.GradedWeights()
COMPONENTS = rewards.GRADED_COMPONENTS


@pytest.fixture(scope="module")
def recs():
    """The shipped test records used below, by id: five candidates and 21 legal moves (r5), a mate
    with zero-quality candidates (rz), two legal moves only (r2)."""
    by_id = {r["id"]: r for r in shipped("P", "test")}
    return {"r5": by_id["P-00009-002"], "rz": by_id["P-00089-047"], "r2": by_id["P-00009-057"]}


def graded(rec, completion):
    return rewards.score_policy_detailed(rec["prompt"], completion, truth=rec, engine=None, weights=G)


def legal(rec, uci: str) -> bool:
    return chess.Board(rec["fen"]).is_legal(chess.Move.from_uci(uci))


def illegal_moves(rec, n: int) -> list[str]:
    """`n` moves in UCI syntax that python-chess calls illegal in the record's position."""
    rng, out = random.Random(rec["id"]), []
    while len(out) < n:
        m = chess.Move(rng.choice(chess.SQUARES), rng.choice(chess.SQUARES)).uci()
        if m[:2] != m[2:] and m not in out and not legal(rec, m):
            out.append(m)
    return out


def m_e_b(moves, evals, best, pre="", post=""):
    return f"{pre} M: {' '.join(moves)} E: {' '.join(evals)} B: {best}{post}"


# --- The lenient reader ---

def test_read_policy_fields_reads_malformed_answers_and_agrees_on_valid_ones(recs):
    r = recs["r5"]
    strict = tasks.parse_policy_completion(r["completion"])
    read = tasks.read_policy_fields(r["completion"])
    assert strict.ok and (read.moves, read.evals, read.best, read.sections) == \
        (strict.moves, strict.evals, strict.best, strict.sections)
    out_of_order = tasks.read_policy_fields(" B: g1f3 junk M: g1f3 e2e3 E: 0.14<|endoftext|>B: e2e4")
    assert out_of_order.best == "g1f3" and out_of_order.moves == ("g1f3", "e2e3") and out_of_order.sections == 3
    assert out_of_order.evals == (tasks.Eval(cp=14),) and not out_of_order.ok  # the strict parser's errors
    assert tasks.parse_policy_completion(" B: g1f3 M: g1f3").best is None  # what the strict parser misses
    assert tasks.read_policy_fields("no fields here").sections == 0
    assert tasks.read_policy_fields(None).errors and tasks.read_policy_fields(None).sections == 0


# --- Component values on hand-made completions ---

def test_component_values(recs):
    r = recs["r5"]
    c1, c2, c3 = r["moves"][:3]
    e1, e2 = r["evals"][:2]
    x = illegal_moves(r, 1)[0]
    assert legal(r, c1) and legal(r, c2) and not legal(r, x)
    loop = graded(r, m_e_b([c1, c1, c1, x], [e1, e1, e1, "0.0"], c1))  # the greedy loop, one illegal entry
    assert (loop.best_legal, loop.best_quality, loop.moves_legal, loop.moves_distinct, loop.evals_accuracy) == \
        (1.0, 1.0, 0.75, 0.2, 1.0)
    assert loop.format == pytest.approx(0.8)  # all but "distinct moves"
    no_b = graded(r, f" M: {c1} {c2} E: {e1} {e2}")
    assert (no_b.best_legal, no_b.best_quality, no_b.moves_legal, no_b.moves_distinct, no_b.evals_accuracy) == \
        (0.0, 0.0, 1.0, 0.4, 1.0)
    assert no_b.format == pytest.approx(0.6)  # no B: section, no B: among the moves
    b_first = graded(r, f" B: {c2} M: {c1}")  # out of order: the strict parser reads no B:
    assert (b_first.best_legal, b_first.moves_legal, b_first.moves_distinct, b_first.evals_accuracy) == \
        (1.0, 1.0, 0.2, 0.0)
    assert b_first.best_quality == rewards.quality_from_cp(*(tasks.parse_eval(e).to_cp() for e in (e1, e2)))
    assert b_first.format == pytest.approx(0.2)  # only "a UCI move list"
    illegal_b = graded(r, m_e_b([c1, c2, c3], r["evals"][:3], x))
    assert (illegal_b.best_legal, illegal_b.best_quality, illegal_b.cp_loss) == (0.0, 0.0, None)
    assert graded(r, m_e_b([c1, c2, c3], r["evals"][:3], c1)).moves_legal == illegal_b.moves_legal == 1.0  # no gate
    for garbage in ("hello world", "", "d2d4 d2d4 0.14 g1f3", "<|endoftext|> M: g1f3"):
        g = graded(r, garbage)
        assert g.total == 0.0 and all(getattr(g, k) == 0.0 for k in COMPONENTS)
    assert rewards.score_policy("P: not a fen", r["completion"], truth=None, engine=None, weights=G) == 0.0


def test_moves_distinct_counts_what_the_data_give(recs):
    r2 = recs["r2"]  # two legal moves: both are a full candidate list
    board = chess.Board(r2["fen"])
    assert board.legal_moves.count() == len(r2["moves"]) == 2
    assert graded(r2, r2["completion"]).moves_distinct == 1.0
    one = graded(r2, m_e_b([r2["moves"][0]] * 2, [r2["evals"][0]] * 2, r2["moves"][0]))
    assert one.moves_distinct == 0.5 and one.moves_legal == 1.0
    r5 = recs["r5"]
    too_many = [m.uci() for m in chess.Board(r5["fen"]).legal_moves][:7]  # seven distinct legal moves
    assert graded(r5, f" M: {' '.join(too_many)}").moves_distinct == 1.0  # capped (format pays for the count)


def test_evals_accuracy_and_best_quality_follow_the_truth(recs):
    r = recs["r5"]
    off = ["0.64", *r["evals"][1:]]  # the best move's eval 0.5 pawns too high
    d = graded(r, m_e_b(r["moves"], off, r["moves"][0]))
    w = tasks.win_prob
    assert d.evals_accuracy == pytest.approx((4 + 1 - abs(w(64) - w(14))) / 5)
    assert d.best_quality == 1.0
    for k, move in enumerate(r["moves"]):
        q = graded(r, m_e_b(r["moves"], r["evals"], move)).best_quality
        assert q == rewards.quality_from_cp(tasks.parse_eval(r["evals"][0]).to_cp(), tasks.parse_eval(r["evals"][k]).to_cp())


# --- Every component raises the total in every band ---

def _raises_only(rec, base, better, component, band):
    b, v = graded(rec, base), graded(rec, better)
    for text in (base, better):
        assert band(rec, text), (band.__name__, text)
    assert getattr(v, component) > getattr(b, component), (component, base, better)
    for other in COMPONENTS:
        if other not in (component, "valid"):  # `valid`: the strict metric's indicator, made of the others
            assert getattr(v, other) == pytest.approx(getattr(b, other)), (component, other, base, better)
    assert v.total > b.total


def junk(rec, text):  # text before the first marker
    return any(e.startswith("unexpected text before") for e in tasks.parse_policy_completion(text).errors)


def malformed(rec, text):
    return not tasks.parse_policy_completion(text).ok


def valid(rec, text):
    return tasks.parse_policy_completion(text).ok


def valid_illegal(rec, text):
    p = tasks.parse_policy_completion(text)
    return p.ok and not legal(rec, p.best)


def valid_legal(rec, text):
    p = tasks.parse_policy_completion(text)
    return p.ok and legal(rec, p.best)


@pytest.mark.parametrize("band, pre", [(malformed, ""), (junk, " ?? junk")])
def test_each_component_raises_the_total_in_malformed_answers(recs, band, pre):
    r5, rz = recs["r5"], recs["rz"]
    c1, c2, c3 = r5["moves"][:3]
    e1, e2 = r5["evals"][:2]
    x = illegal_moves(r5, 1)[0]
    z1, zero = rz["moves"][0], rz["moves"][2]  # zero: a legal move of quality 0 (the others mate)
    assert rewards.quality_from_cp(*(tasks.parse_eval(rz["evals"][k]).to_cp() for k in (0, 2))) == 0.0
    cases = [
        (rz, m_e_b([z1, z1], [rz["evals"][0]] * 2, illegal_moves(rz, 1)[0], pre), m_e_b([z1, z1], [rz["evals"][0]] * 2, zero, pre), "best_legal"),
        (r5, m_e_b([c3, c3], [e1, e1], c2, pre), m_e_b([c3, c3], [e1, e1], c1, pre), "best_quality"),
        (r5, m_e_b([c1, x, c1], [e1, "0.0", e1], c1, pre), m_e_b([c1, c1, c1], [e1, e1, e1], c1, pre), "moves_legal"),
        (r5, m_e_b([c1, c1, c1], [e1, e1, e1], c1, pre), m_e_b([c1, c2, c1], [e1, e2, e1], c1, pre), "moves_distinct"),
        (r5, m_e_b([c1, c1], ["3.0", "3.0"], c1, pre), m_e_b([c1, c1], [e1, e1], c1, pre), "evals_accuracy"),
        (r5, m_e_b([c1, c1], [e1], c1, pre), m_e_b([c1, c1], [e1, e1], c1, pre), "format"),
    ]
    for rec, base, better, component in cases:
        _raises_only(rec, base, better, component, band)


def test_each_component_raises_the_total_in_format_valid_answers(recs):
    r5, r2, rz = recs["r5"], recs["r2"], recs["rz"]
    c, e = r5["moves"], r5["evals"]
    x, y = illegal_moves(r5, 2)
    x2, y2 = illegal_moves(r2, 2)
    zx = illegal_moves(rz, 1)[0]
    # format-valid with an illegal B: (format is 1, best_* are 0: the other components move)
    _raises_only(r2, m_e_b([*r2["moves"], x2, y2], [*r2["evals"], "0.0", "0.0"], x2),
                 m_e_b([*r2["moves"], x2], [*r2["evals"], "0.0"], x2), "moves_legal", valid_illegal)
    _raises_only(r5, m_e_b([c[0], x], [e[0], "0.0"], x), m_e_b([c[0], c[1], x, y], [e[0], e[1], "0.0", "0.0"], x),
                 "moves_distinct", valid_illegal)
    _raises_only(r5, m_e_b([c[0], x], ["3.0", "0.0"], x), m_e_b([c[0], x], [e[0], "0.0"], x), "evals_accuracy",
                 valid_illegal)
    # from an illegal B: to a legal one of quality 0 (both format-valid)
    zm, ze = [*rz["moves"][:4], zx], [*rz["evals"][:4], "0.0"]
    _raises_only(rz, m_e_b(zm, ze, zx), m_e_b(zm, ze, rz["moves"][2]), "best_legal", valid)
    # format-valid with a legal B:
    _raises_only(r5, m_e_b(c, e, c[1]), m_e_b(c, e, c[0]), "best_quality", valid_legal)
    _raises_only(r2, m_e_b([*r2["moves"], x2], [*r2["evals"], "0.0"], r2["moves"][0]),
                 m_e_b(r2["moves"], r2["evals"], r2["moves"][0]), "moves_legal", valid_legal)
    _raises_only(r5, m_e_b([c[0], x], [e[0], "0.0"], c[0]), m_e_b([c[0], c[1], x, y], [e[0], e[1], "0.0", "0.0"], c[0]),
                 "moves_distinct", valid_legal)
    _raises_only(r5, m_e_b(c, ["3.0", *e[1:]], c[0]), m_e_b(c, e, c[0]), "evals_accuracy", valid_legal)


def test_garbage_is_the_floor_and_bands_keep_the_legal_best_move(recs):
    r = recs["r5"]
    rng = random.Random(0)
    texts = [mutate(r["completion"], rng, rng.randint(1, 12)) for _ in range(300)] + ["", "garbage !!", "M:"]
    for t in texts:
        d = graded(r, t)
        assert 0.0 <= d.total <= 1.0 and math.isfinite(d.total)
        assert d.total == pytest.approx(math.fsum(getattr(G, k) * getattr(d, k) for k in COMPONENTS))
    assert graded(r, "garbage !!").total == 0.0 == min(graded(r, t).total for t in texts)
    loop = m_e_b([r["moves"][0]] * 5, [r["evals"][0]] * 5, r["moves"][0])  # malformed, names the best move
    illegal_b = m_e_b([*r["moves"][:4], illegal_moves(r, 1)[0]], r["evals"], illegal_moves(r, 1)[0])
    assert graded(r, r["completion"]).total == 1.0 > graded(r, loop).total > graded(r, illegal_b).total
    # the default reward made the opposite trade (issue 26)
    assert rewards.score_policy(r["prompt"], loop, truth=r, engine=None) < \
        rewards.score_policy(r["prompt"], illegal_b, truth=r, engine=None)


def test_graded_weights_are_checked():
    assert math.fsum(getattr(G, k) for k in COMPONENTS) == pytest.approx(1.0)
    assert rewards.component_reward_weights() == [getattr(G, k) for k in COMPONENTS] + [1.0]
    with pytest.raises(ValueError, match="sum to 1"):
        rewards.GradedWeights(best_legal=0.5)
    with pytest.raises(ValueError, match="best_legal"):
        rewards.GradedWeights(best_legal=-0.2, best_quality=0.6)


# --- The default reward is unchanged ---

# Computed with the default score_policy at a07bc39, before the graded reward was added
# (truth = the record, engine=None): record id, completion, reward.
OLD_DEFAULT = [
    ("P-00009-002", " M: g1f3 e2e3 a2a3 c2c4 b4b5 E: 0.14 0.13 0.11 0.11 -0.06 B: e2e3", 0.998094176342),
    ("P-00009-002", " M: g1f3 e2e3 a2a3 c2c4 b4b5 E: 0.14 0.13 0.11 0.11 -0.06 B: b4b5", 0.963244339324),
    ("P-00009-002", " M: g1f3 e2e3 a2a3 c2c4 h2h4 E: 0.14 0.13 0.11 0.11 -0.06 B: h2h4", 0.853209438455),
    ("P-00009-002", " M: g1f3 e2e3 a2a3 c2c4 g8a5 E: 0.14 0.13 0.11 0.11 -0.06 B: g8a5", -0.25),
    ("P-00009-002", " M: g1f3 g1f3 g1f3 g1f3 g1f3 E: 0.14 0.14 0.14 0.14 0.14 B: g1f3", -0.608666666667),
    ("P-00009-002", " M: g1f73 e2e3 a2a3 c2c4 b4b5 E: 0.14 0.1 0.11 0.11 -0.06 eB: g13f", -0.936666666667),
    ("P-00009-002", "!4la8qtwq.qb,yo,anva1t52!!dceq?r", -1.0),
    ("P-00009-004", " M: d2d4 g1f3 e2e4 d1c2 d2d3 E: 0.64 0.3 0.1 0.05 -0.17 B: g1f3", 0.93958660698),
    ("P-00009-004", " M: d2d4 g1f3 e2e4 d1c2 g2g4 E: 0.64 0.3 0.1 0.05 -0.17 B: g2g4", 0.774514786802),
    ("P-00009-004", " M:d2d4 g1f3 e2e4 d1c2 d2d3 E: 0.64 0.3 0.1 c0.05 -0.17 B:ed2d4", -0.91),
]
OLD_UNGATED = [(OLD_DEFAULT[4][:2], 0.78), (OLD_DEFAULT[5][:2], -0.45), (OLD_DEFAULT[-1][:2], -0.35)]


def test_default_policy_reward_is_unchanged():
    by_id = {r["id"]: r for r in shipped("P", "test")}
    ungated = rewards.PolicyWeights(format_gate=False)  # pinned the same way
    for weights, table in ((None, OLD_DEFAULT), (ungated, [(*key, old) for key, old in OLD_UNGATED])):
        for rid, completion, old in table:
            rec = by_id[rid]
            assert rewards.score_policy(rec["prompt"], completion, truth=rec, engine=None, weights=weights) == old


# --- The components as reward functions for the GRPO trainer ---

def _batch(recs):
    env = shipped("A", "test")[:2]
    r = recs["r5"]
    loop = m_e_b([r["moves"][0]] * 5, [r["evals"][0]] * 5, r["moves"][0])
    rows = [(r, r["completion"]), (r, loop), (r, "garbage"), (recs["r2"], " B: d7e7"),
            (env[0], env[0]["completion"]), (env[1], "junk")]
    return [PromptItem(rec["task"], rec["prompt"], rec) for rec, _ in rows], [c for _, c in rows]


def test_component_reward_functions(recs, monkeypatch):
    items, completions = _batch(recs)
    funcs = rewards.policy_component_rewards(engine=None)
    assert [f.__name__ for f in funcs] == [f"P/{k}" for k in COMPONENTS] + ["A/reward"]
    prompts, truth, task = [i.prompt for i in items], [i.truth for i in items], [i.task for i in items]
    rewards.clear_cache()
    parses = []
    real = tasks.parse_policy_completion
    monkeypatch.setattr(tasks, "parse_policy_completion", lambda c: parses.append(c) or real(c))
    values = {f.__name__: f(prompts=prompts, completions=completions, task=task, truth=truth) for f in funcs}
    n_policy = sum(t == "P" for t in task)
    assert len(parses) == n_policy and rewards.cache_info()["graded"]["misses"] == n_policy  # one parse each
    assert rewards.cache_info()["graded"]["hits"] == n_policy * (len(COMPONENTS) - 1)
    for i, item in enumerate(items):
        if item.task == "P":
            d = graded(item.truth, completions[i])
            assert [values[f"P/{k}"][i] for k in COMPONENTS] == [getattr(d, k) for k in COMPONENTS]
            assert values["A/reward"][i] is None
        else:
            assert all(values[f"P/{k}"][i] is None for k in COMPONENTS)
            assert values["A/reward"][i] == rewards.score_environment(item.prompt, completions[i], truth=item.truth)
    # the trainer's weighted nansum: the graded reward on P: rows, the environment reward on A: rows
    total = score_completions(funcs, rewards.component_reward_weights(), items, completions).tolist()
    for i, item in enumerate(items):
        want = (rewards.score_policy(item.prompt, completions[i], truth=item.truth, engine=None, weights=G)
                if item.task == "P" else rewards.score_environment(item.prompt, completions[i], truth=item.truth))
        assert total[i] == pytest.approx(want, abs=1e-6)


def test_component_reward_functions_read_trl_columns(recs):
    items, completions = _batch(recs)
    cols = ("fen", "moves", "evals", "limit", "new_fen", "reward", "terminated", "truncated")
    columns = {c: [i.truth.get(c) for i in items] for c in cols}
    prompts = [i.prompt for i in items]
    for f in rewards.policy_component_rewards(engine=None):
        with_truth = f(prompts, completions, truth=[i.truth for i in items])
        assert f(prompts=prompts, completions=completions, **columns) == with_truth
    conversation = [[{"role": "user", "content": p}] for p in prompts]
    assert rewards.policy_component_rewards(engine=None)[0](conversation, completions, **columns)[0] == 1.0


def test_graded_reward_through_the_existing_dispatch(recs):
    r = recs["r5"]
    assert rewards.score(r["prompt"], " B: e2e3", truth=r, engine=None, policy_weights=G) == \
        graded(r, " B: e2e3").total > 0.0
    f = rewards.trl_reward_function("P", policy_weights=G)
    assert f([r["prompt"]], ["garbage"], fen=[r["fen"]], moves=[r["moves"]], evals=[r["evals"]]) == [0.0]


def test_reward_distribution_takes_the_graded_weights(recs):
    rows = {row["category"]: row["reward"] for row in reward_distribution([recs["r5"]], policy_weights=G)}
    assert rows["best"] == 1.0 > rows["best repeated"] > rows["illegal"] > rows["garbage"] == 0.0
    old = {row["category"]: row["reward"] for row in reward_distribution([recs["r5"]])}
    assert old["best repeated"] < old["illegal"]  # the default's ranking, unchanged
    # env rows (task A): right but for the terminated flag earns 1 - that flag's weight, 0.05 in
    # GRADED_ENV_WEIGHTS, 0.1 by default
    env = shipped("A", "test")[0]
    graded_env = reward_distribution((), [env], env_weights=rewards.GRADED_ENV_WEIGHTS)
    assert {row["task"] for row in graded_env} == {"A"}
    assert {r["category"]: r["reward"] for r in graded_env}["wrong terminated flag"] == pytest.approx(0.95)
    assert {r["category"]: r["reward"] for r in reward_distribution((), [env])}["wrong terminated flag"] == pytest.approx(0.9)


def test_grpo_reward_variants_name_their_functions_and_weigh_a_valid_next_fen():
    from rookworld_lib.chess import rewards as R
    from rookworld_lib.chess.training import chess_reward, reward_functions

    funcs, weights = reward_functions("gated")
    assert funcs == [chess_reward] and weights == [1.0]
    funcs, weights = reward_functions("graded")
    assert [f.__name__ for f in funcs] == [f"P/{c}" for c in R.GRADED_COMPONENTS] + ["A/reward"]
    assert len(weights) == len(funcs) and abs(sum(weights[:-1]) - 1) < 1e-9
    assert R.GRADED_ENV_WEIGHTS.fen_valid > 0 and R.DEFAULT_ENV_WEIGHTS.fen_valid == 0
    with pytest.raises(ValueError, match="reward variant"):
        reward_functions("other")
    # the measured recipe is the default everywhere: the function, `rookworld grpo` and every profile
    from rookworld_lib.chess.training import build_grpo_parser
    from rookworld_lib.lab.workflow import PROFILES

    assert [f.__name__ for f in reward_functions()[0]] == [f.__name__ for f in funcs]
    assert build_grpo_parser().parse_args(["--init-from", "m"]).reward == "graded"
    assert {p.reward for p in PROFILES.values()} == {"graded"}


def test_the_graded_variants_environment_reward_weighs_a_valid_next_fen_as_written():
    """The A: reward GRPO trains under "graded" is GRADED_ENV_WEIGHTS' (a valid next FEN 0.25): a mutant
    that passed the default weights (valid FEN 0) kept every other test green. A valid but wrong next FEN,
    the position before the move, with the reward and flags right, scored by hand: placement 62 of 64
    squares (b8 and c6 differ), castling and en passant right, side and both clocks wrong."""
    from rookworld_lib.chess.training import reward_functions

    before, after = ("rnbqkbnr/p1pppppp/1p6/8/1P6/2P5/P2PPPPP/RNBQKBNR b KQkq - 0 2",
                     "r1bqkbnr/p1pppppp/1pn5/8/1P6/2P5/P2PPPPP/RNBQKBNR w KQkq - 1 3")
    prompt = f"A: {before}+b8c6+b2b4 b7b6 c2c3 b8c6+"
    truth = {"fen": before, "move": "b8c6", "new_fen": after, "reward": 0.001, "terminated": 0, "truncated": 0}
    fields = 0.5 * 62 / 64 + 0.1 + 0.1
    env = next(f for f in reward_functions("graded")[0] if f.__name__ == "A/reward")
    # format, valid FEN, exact FEN, FEN fields, reward, terminated, truncated
    graded = 0.1 + 0.25 + 0.25 * 0 + 0.2 * fields + 0.1 + 0.05 + 0.05
    default = 0.1 + 0.0 + 0.3 * 0 + 0.3 * fields + 0.1 + 0.1 + 0.1
    got = env([prompt, prompt], [f"{before}+0.001+0+0", f"{after}+0.001+0+0"], task=["A", "A"], truth=[truth, truth])
    assert got == pytest.approx([graded, 1.0], abs=1e-9) and abs(graded - default) > 0.05


def test_the_graded_valid_component_is_the_strict_metric_not_the_parse():
    prompt = tasks.policy_prompt(chess.STARTING_FEN)
    truth = {"fen": chess.STARTING_FEN, "moves": ["e2e4", "d2d4"], "evals": ["0.3", "0.3"]}
    illegal = " M: e2e5 E: 0.1 B: e2e5"  # parses, but e2e5 is no move here
    assert tasks.parse_policy_completion(illegal).ok
    g = rewards.score_policy_detailed(prompt, illegal, truth=truth, engine=None, weights=rewards.GradedWeights())
    assert g.valid == 0.0
    good = rewards.score_policy_detailed(prompt, " M: e2e4 d2d4 E: 0.3 0.3 B: e2e4", truth=truth, engine=None,
                                         weights=rewards.GradedWeights())
    assert good.valid == 1.0
