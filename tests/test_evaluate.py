import dataclasses
import math
import statistics

import chess
import pytest
import torch

from rookworld_lib.chess import data, tasks
from rookworld_lib.chess import evaluate as ev
from rookworld_lib.core.model import GPT, GPTConfig
from rookworld_lib.core.tokenizer import encode_prompt


def test_wilson_known_values():
    # Wilson 95% for 8/10: [0.4902, 0.9433] (Newcombe 1998, Table I style check)
    e = ev.wilson(8, 10)
    assert abs(e.value - 0.8) < 1e-12
    assert abs(e.low - 0.4902) < 1e-3 and abs(e.high - 0.9433) < 1e-3
    zero = ev.wilson(0, 20)
    assert zero.low == 0.0 and 0.15 < zero.high < 0.17
    assert math.isnan(ev.wilson(0, 0).value)


def test_mean_interval_is_student_t():
    e = ev.mean_interval([1.0, 2.0, 3.0, 4.0])
    assert e.value == 2.5 and e.n == 4
    half = 3.182446 * math.sqrt(5 / 3) / 2  # t(3 degrees of freedom, 0.975) = 3.182 in every t table
    assert e.high == pytest.approx(2.5 + half, abs=1e-6) and e.low == pytest.approx(2.5 - half, abs=1e-6)
    big = ev.mean_interval([0.0, 1.0] * 50)  # t(99, 0.975) = 1.984
    assert big.high - big.value == pytest.approx(1.984217 * math.sqrt(100 / 99 / 4) / 10, abs=1e-6)
    one = ev.mean_interval([0.2])  # one value: no interval at all, never a point
    assert (one.value, one.low, one.high, one.n) == (0.2, -math.inf, math.inf, 1) and str(one) == "0.2 (n=1, no interval)"
    assert (ev.mean_interval([0.2], share=True).low, ev.mean_interval([0.2], share=True).high) == (0.0, 1.0)
    # printed: the value to 3 significant digits, its bounds to the same decimals
    shown = {(0.75, 0.00895, 1.49): "0.750 [0.009, 1.490] (n=8)", (254.3, 194.2, 313.6): "254 [194, 314] (n=8)",
             (-0.0384, -0.0727, -0.0041): "-0.0384 [-0.0727, -0.0041] (n=8)", (36.3, 30.14, 42.46): "36.3 [30.1, 42.5] (n=8)",
             (0.0, -120.0, 120.0): "0 [-120, 120] (n=8)", (0.0, 0.0, 0.0): "0.000 [0.000, 0.000] (n=8)",
             (0.9996, 0.99, 1.0): "1.00 [0.99, 1.00] (n=8)"}
    assert {k: str(ev.Estimate(*k, n=8, kind="mean")) for k in shown} == shown
    # kept inside the values' range: a similarity in [0, 1] near 0 (the t interval reaches below it)
    near_zero = ev.mean_interval([0.0, 0.0, 0.0, 0.03], bounds=(0.0, 1.0))
    assert near_zero.low == 0.0 and near_zero.high == pytest.approx(0.0075 + 3.182446 * 0.015 / 2, abs=1e-6)
    # a share where every record scored 0: not the point [0, 0] but the Wilson interval of 0 of 8
    zeros = ev.mean_interval([0.0] * 8, share=True)
    assert (zeros.low, zeros.high) == (0.0, ev.wilson(0, 8).high) and zeros.high > 0.3 and zeros.kind == "share"
    assert ev.mean_interval([1.0] * 8, share=True).low == ev.wilson(8, 8).low


def test_similarity_is_one_minus_edit_distance_over_the_longer_length():
    # hand-worked: kitten -> sitting is 3 edits over 7 characters
    assert abs(ev.similarity("kitten", "sitting") - (1 - 3 / 7)) < 1e-12
    assert ev.similarity("", "abc") == 0.0 and ev.similarity("", "") == 1.0
    assert ev.similarity("abc", "abc") == 1.0
    assert abs(ev.similarity("abcd", "abce") - 0.75) < 1e-12


def start_record():
    board = chess.Board()
    return {"task": "P", "fen": board.fen(), "moves": ["e2e4", "d2d4", "g1f3", "c2c4", "e2e3"],
            "evals": ["0.35", "0.3", "0.28", "0.2", "0.15"], "limit": "depth=8"}


def test_without_stockfish_the_cp_loss_says_how_many_of_its_evals_were_estimated(monkeypatch):
    """A legal B: outside the candidates is searched by Stockfish where it is installed and estimated where
    not (rewards' engine="auto"): the same answers gave cp_loss 106 and 98 with nothing telling the two
    apart. Offline the results carry policy/cp_loss_estimated, the share of estimated evals."""
    from rookworld_lib.chess import rewards
    rec = start_record()
    completions = [" M: e2e4 d2d4 g1f3 c2c4 e2e3 E: 0.35 0.3 0.28 0.2 0.15 B: e2e4",
                   " M: e2e4 d2d4 g1f3 c2c4 e2e3 E: 0.35 0.3 0.28 0.2 0.15 B: a2a3"]  # a2a3: not a candidate
    cfg = ev.EvalConfig(selfplay_games=0)
    rewards.clear_cache(analyses=True)
    monkeypatch.setattr(rewards, "stockfish_available", lambda *a: False)
    offline = ev.evaluate_policy(None, [rec] * 2, cfg, completions=completions)
    assert offline["policy/cp_loss"].n == 2 and offline["policy/cp_loss_estimated"].value == pytest.approx(1 / 2)
    assert ev.NOTES["policy/cp_loss_estimated"].startswith("(ours only, without Stockfish)")
    rewards.clear_cache(analyses=True)
    monkeypatch.undo()
    if rewards.stockfish_available():
        assert "policy/cp_loss_estimated" not in ev.evaluate_policy(None, [rec] * 2, cfg, completions=completions)
    rewards.clear_cache(analyses=True)


def test_policy_metrics_by_hand():
    rec = start_record()
    completions = [
        " M: e2e4 d2d4 g1f3 c2c4 e2e3 E: 0.35 0.3 0.28 0.2 0.15 B: e2e4",  # perfect
        " M: d2d4 e2e4 a2a3 h2h3 b2b3 E: 0.3 0.35 0.0 0.0 0.0 B: d2d4",  # legal, not best, overlap 2/5
        " M: e2e5 E: 0.1 B: e2e5",  # illegal best move
        "garbage",
    ]
    cfg = ev.EvalConfig(selfplay_games=0)
    res = ev.evaluate_policy(None, [rec] * 4, cfg, completions=completions)
    # format-valid: well-formed with legal candidates, five of them here (the third lists one illegal move)
    assert res["policy/valid"].value == pytest.approx(2 / 4)
    assert res["policy/legal_best_move"].value == pytest.approx(2 / 4)
    assert res["policy/best_move_accuracy"].value == pytest.approx(1 / 4)
    assert res["policy/top5_overlap"].value == pytest.approx((1.0 + 0.4 + 0.0 + 0.0) / 4)
    # a share, printed as a percentage like the reference beside it (39.2%), its interval inside [0, 100]
    assert str(res["policy/top5_overlap"]) == "35.0% [0.0, 100.0] (n=4)"  # 0.35 +- 3.182 * 0.4726 / 2, clipped
    assert res["policy/cp_loss"].n == 2 and res["policy/cp_loss"].value == pytest.approx(2.5)  # (0 + 5) / 2
    # a mate given away costs 1,000 + the move's eval, as in Lichess's ACPL (evals clipped to +-10
    # pawns), not the ~100,000 cp of the mate score: one blunder must not swamp the mean
    mate = {**rec, "evals": ["M1", *rec["evals"][1:]]}
    mated = ev.evaluate_policy(None, [mate] * 2, cfg, completions=completions[:2])
    assert mated["policy/cp_loss"].value == pytest.approx((0 + (1000 - 30)) / 2)  # B: d2d4, eval 0.3
    assert ev.clipped_cp_loss(99_999, 1) == 0.0 and ev.clipped_cp_loss(-500, 99_500) == 500.0
    # the rates keep their per-record outcomes, in record order, for paired comparisons
    assert res["policy/valid"].outcomes == (1, 1, 0, 0)
    short = ev.evaluate_policy(None, [rec], cfg, completions=[" M: e2e4 d2d4 E: 0.35 0.3 B: e2e4"])
    assert short["policy/valid"].value == 0.0  # legal and well-formed, but two candidates where the data give five
    assert res["policy/legal_best_move"].outcomes == (1, 1, 0, 0)
    assert res["policy/best_move_accuracy"].outcomes == (1, 0, 0, 0)


def test_rate_is_wilson_with_outcomes():
    est = ev.rate([True, False, 1.0, 0.0, True])
    assert est.outcomes == (1, 0, 1, 0, 1)
    assert (est.value, est.low, est.high, est.n) == (lambda w: (w.value, w.low, w.high, w.n))(ev.wilson(3, 5))
    assert ev.rate([]).n == 0 and math.isnan(ev.rate([]).value)


def test_paired_change_says_which_strict_metric_moved():
    n = 200
    before = {"policy/valid": ev.rate([0] * n), "policy/legal_best_move": ev.rate([1, 0] * (n // 2)),
              "env/next_fen_exact": ev.rate([1] * n), "env/valid": ev.rate([i % 3 == 0 for i in range(n)])}
    after = {"policy/valid": ev.rate([1] * 60 + [0] * (n - 60)),  # 0% -> 30%: up
             "policy/legal_best_move": ev.rate([1, 0] * (n // 2)),  # the same records right: no change
             "env/next_fen_exact": ev.rate([0] * 40 + [1] * (n - 40)),  # 100% -> 80%: down
             "env/valid": ev.rate([i % 3 == 1 for i in range(n)])}  # same rate, other records: no change
    table = ev.paired_change(before, after)
    assert list(table.index) == ["policy/valid", "policy/legal_best_move", "env/valid", "env/next_fen_exact"]
    assert table["moved"].tolist() == ["up", "no resolved change", "no resolved change", "down"]
    assert table.loc["policy/valid", "change (points)"].startswith("+30.0 [")
    assert table.loc["env/next_fen_exact", "change (points)"].startswith("-20.0 [")
    with pytest.raises(ValueError, match="equal lengths"):
        ev.paired_change({"env/valid": ev.rate([1, 0])}, {"env/valid": ev.rate([1])})
    # records are paired by what they are about: other records, or the same in another order, are refused
    keys = [f"fen{i}" for i in range(n)]
    mine = {"env/valid": ev.rate(before["env/valid"].outcomes, keys)}
    assert ev.paired_change(mine, {"env/valid": ev.rate(after["env/valid"].outcomes, keys)}).shape[0] == 1
    with pytest.raises(ValueError, match=r"env/valid: the two evaluations are not of the same records in the same "
                                         r"order \(record 0: 'fen0' before, 'fen1' after\)"):
        ev.paired_change(mine, {"env/valid": ev.rate(after["env/valid"].outcomes, keys[1:] + keys[:1])})
    with pytest.raises(ValueError, match="cannot be paired"):  # an estimate without per-record outcomes
        ev.paired_change({"env/valid": ev.wilson(3, 4)}, {"env/valid": ev.wilson(2, 4)})


def test_end_to_end_small_model_runs_every_suite():
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", block_size=192)).eval()
    rec = start_record()
    t = tasks.environment_step(chess.Board().fen(), "e2e4", [])
    env_rec = {"task": "A", "prompt": t.prompt, "new_fen": t.new_fen, "reward": t.reward,
               "terminated": t.terminated, "truncated": t.truncated}
    mate = {"fen": "6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - 0 1", "mating_moves": ["a1a8"]}
    cfg = ev.EvalConfig(max_new_tokens=8, selfplay_games=2, selfplay_max_plies=3)
    res = ev.evaluate_all(model, [rec], [env_rec], [mate], cfg)
    for key in ("policy/valid", "env/next_fen_exact", "mate_in_one/accuracy", "self_play/legal_half_moves"):
        assert key in res and res[key].n >= 1
    # each suite takes its cap: max_mate as max_policy and max_env do, 0 turning the suite off
    capped = dataclasses.replace(cfg, max_policy=1, max_env=0, max_mate=2, selfplay_games=0)
    res2 = ev.evaluate_all(model, [rec] * 3, [env_rec], [mate] * 5, capped)
    assert (res2["policy/valid"].n, res2["mate_in_one/accuracy"].n) == (1, 2) and "env/valid" not in res2
    assert "mate_in_one/accuracy" not in ev.evaluate_all(model, [rec], [], [mate], dataclasses.replace(capped, max_mate=0))
    table = ev.comparison_table({"init": res})
    assert ev.REFERENCE_NAME in table.columns and ev.REFERENCE_NOTE in table.columns
    assert table.loc["policy/cp_loss", ev.REFERENCE_NOTE].startswith("(ours only) centipawns B: loses")
    # `rookworld eval`'s terminal table: every line fits 120 columns; its columns are explained below it
    text = ev.terminal_table(res, ev.model_label("runs/20260101-000000/training/final"))
    assert max(map(len, text.splitlines())) <= ev.TERMINAL_WIDTH
    assert text.splitlines()[0].split() == ["training/final", "reported"]
    assert "training/final: estimate [95% interval]" in text and "reported: RookWorld-LM-124M, 7M samples x 3 epochs" in text
    assert "  mate_in_one/accuracy: BIG-bench checkmate-in-one" in text


def test_config_validation():
    with pytest.raises(ValueError, match="decoding"):
        ev.EvalConfig(decoding="beam")
    with pytest.raises(ValueError, match="selfplay_games"):  # distinct starts run out (6,903 within 3 plies)
        ev.EvalConfig(selfplay_games=5000)


def test_paired_difference():
    d = ev.paired_difference([0.1, 0.2, 0.3, 0.4], [0.3, 0.4, 0.5, 0.6])
    assert d.value == pytest.approx(0.2) and d.low == pytest.approx(0.2) and d.high == pytest.approx(0.2)
    with pytest.raises(ValueError, match="equal lengths"):
        ev.paired_difference([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match=r"finite outcomes: record 1 is nan"):
        ev.paired_difference([0.1, float("nan")], [0.2, 0.3])
    # one record: no interval, so no verdict (the normal interval of one difference was a point)
    one = ev.paired_difference([0], [1])
    assert one.low == -math.inf and one.high == math.inf


def paired(both: int, gained: int, lost: int, neither: int) -> tuple[list[int], list[int]]:
    """before, after outcomes of a paired 2x2 table."""
    return ([1] * both + [0] * gained + [1] * lost + [0] * neither, [1] * both + [1] * gained + [0] * lost + [0] * neither)


def test_paired_rates_take_newcombes_interval():
    """A right/wrong metric's paired change is Newcombe's square-and-add interval (1998, method 10). The
    reference values are those of R's contingencytables package (Fagerland, Lydersen and Laake,
    "Statistical Analysis of Contingency Tables", chapter 8) for Cavo et al.'s table: 59 right both
    times, 6 right only in the first, 16 only in the second, 80 neither: -0.0621 [-0.1186, -0.0046]
    (its Wald interval, which every table here used before, [-0.1184, -0.0058])."""
    before, after = paired(59, 6, 16, 80)  # the package's first is our after
    d = ev.paired_difference(before, after)
    assert (round(d.value, 4), round(d.low, 4), round(d.high, 4)) == (-0.0621, -0.1186, -0.0046)
    # few of 730 records changed, all one way: the normal interval excluded zero at 4 gained and none lost,
    # where an exact McNemar test does not (p = 0.125; 5: p = 0.0625); Newcombe's agrees with the exact test
    # (6 gained: p = 0.031, resolved). (On a handful of records that all changed one way, 2 of 2, it excludes
    # zero where the exact test cannot: the ci profile's 8-record verdicts are a smoke test, not evidence.)
    for gained, resolved in ((4, False), (5, False), (6, True), (7, True)):
        assert (ev.paired_difference(*paired(100, gained, 0, 630 - gained)).low > 0) == resolved, gained
    for table in (paired(0, 1, 0, 0), paired(1, 1, 0, 0)):
        d = ev.paired_difference(*table)
        assert d.low < 0 < d.high, table
    before, after = paired(100, 4, 0, 626)
    row = ev.paired_change({"policy/valid": ev.rate(before)}, {"policy/valid": ev.rate(after)}).iloc[0]
    assert row["moved"] == "no resolved change" and row["change (points)"].startswith("+0.5 [-0.")
    # a clear change is still one
    assert ev.paired_difference(*paired(100, 30, 5, 595)).low > 0
    # no record changed: a change of zero with the width n records allow, not a point
    same = ev.paired_difference(*paired(100, 0, 0, 630))
    assert same.value == 0 and same.low < 0 < same.high


def _wilson(k, n, z=None):
    """Wilson's score interval written out from the textbook formula (z: scipy's 97.5% normal quantile)."""
    from scipy.stats import norm

    z = norm.ppf(0.975) if z is None else z
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def test_newcombe_takes_no_correlation_when_the_cross_product_is_small():
    """Method 10's phi is continuity-corrected: (AD - BC - n/2) / sqrt(margins) where AD - BC > n/2, AD - BC
    below 0, and 0 between. 10 right both times, 11 right only after, 10 only before, 12 neither: AD - BC
    = 120 - 110 = 10 <= n/2, so the interval is the plain square-and-add of the two Wilson intervals
    (Newcombe 1998, eq. for method 10 with phi = 0; Wilson's textbook formula written out here)."""
    z, n = 1.959964, 43

    def wilson(k):
        return (k / n, *_wilson(k, n, z))

    (p1, l1, u1), (p2, l2, u2) = wilson(10 + 11), wilson(10 + 10)  # after, before
    d = ev.paired_difference(*paired(10, 11, 10, 12))
    assert d.value == pytest.approx(p1 - p2)
    assert d.low == pytest.approx(p1 - p2 - math.hypot(p1 - l1, u2 - p2), abs=1e-9)
    assert d.high == pytest.approx(p1 - p2 + math.hypot(p2 - l2, u1 - p1), abs=1e-9)


def test_paired_change_of_anything_but_two_evaluations_is_refused():
    with pytest.raises(ValueError, match=r"^paired_change: before and after must be evaluate_all results \(dict metric "
                                         r"-> Estimate\), got list and list$"):
        ev.paired_change([1], [2])  # an empty table, without a word
    b = {"policy/valid": ev.rate([1, 0, 1])}
    with pytest.raises(ValueError, match=r"^paired_change: metrics must be a list of strict metrics .*got 'policy/valid'$"):
        ev.paired_change(b, b, metrics="policy/valid")  # read letter by letter: an empty table
    with pytest.raises(ValueError, match=r"^paired_change: \['policy/vaild'\] are no strict metric"):
        ev.paired_change(b, b, metrics=["policy/vaild"])
    with pytest.raises(ValueError, match=r"^paired_change: policy/valid is a saved result \(results_to_json\) without "
                                         r"its per-record outcomes"):  # was "'builtin_function_or_method' ... iterable"
        ev.paired_change(ev.results_to_json(b), ev.results_to_json(b))


def test_wilson_refuses_counts_no_trials_can_give():
    for k, n in ((5, 3), (1, -3), (-1, 4)):  # "math domain error", or -33.3% [699.9, -5.7]
        with pytest.raises(ValueError, match=rf"^wilson: k successes in n trials needs 0 <= k <= n and n > 0, got k={k}, n={n}$"):
            ev.wilson(k, n)
    assert ev.wilson(3, 3).value == 1.0 and ev.wilson(1.0 * 7 * (1 / 7) * 7, 7).value == pytest.approx(1.0)


def test_a_bound_near_zero_is_printed_with_its_sign():
    assert ev._points(0.00012) == "+0.01" and ev._points(-0.0003) == "-0.03" and ev._points(0.0) == "+0.0"
    assert ev._points(0.067) == "+6.7"
    # a change and its bounds at one number of decimals: "-0.03 [-0.1, +0.03]" read as if -0.1 were rounder
    assert ev._points(-0.0003, -0.00096, 0.0003) == "-0.03 [-0.10, +0.03]"
    assert ev._points(0.096, 0.064, 0.128) == "+9.6 [+6.4, +12.8]"
    assert ev._points(0.0, -0.005, 0.005) == "+0.0 [-0.5, +0.5]"
    assert ev._points(0.00004, -0.00004, 0.0012) == "+0.004 [-0.004, +0.120]"


def test_pass_at_1_interval_covers_95_percent_of_simulated_splits():
    """pass@1's Wilson interval at the effective number of draws: over simulated test splits (records of
    varied difficulty, k samples each) it covers the true rate about 95% of the time, where Wilson over
    the n records alone covered ~100% (too wide by up to sqrt(k)) and over n x k draws too few."""
    import random

    rng = random.Random(0)
    for alpha, beta in ((2, 8), (0.5, 2), (50, 50)):
        truth, covered, widths = alpha / (alpha + beta), 0, []
        for _ in range(400):
            per_record = []
            for _ in range(200):
                p = rng.betavariate(alpha, beta)
                per_record.append([rng.random() < p for _ in range(4)])
            e = ev.pass_at_1(per_record)
            covered += e.low <= truth <= e.high
            widths.append(e.high - e.low)
        assert 0.92 <= covered / 400 <= 0.98, (alpha, beta, covered)
    # the two limits: every record's samples alike (n draws), samples that vary only within records (n x k)
    assert (ev.pass_at_1([[1] * 4, [0] * 4] * 10).low, ev.pass_at_1([[1] * 4, [0] * 4] * 10).high) == \
        (ev.wilson(10, 20).low, ev.wilson(10, 20).high)
    assert ev.pass_at_1([[1, 0, 1, 0]] * 20).high == ev.wilson(40, 80).high
    assert ev.pass_at_1([[0.5, 0.0]]).value == 0.25  # fractional sample outcomes are averaged, not rounded
    with pytest.raises(ValueError, match="at least one sample for every record"):
        ev.pass_at_1([[1], []])


def test_heldout_rewards_exact_completion_scores_high():
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", block_size=192)).eval()
    rec = {**start_record(), "prompt": "P: " + chess.Board().fen()}
    values = ev.heldout_rewards(model, [rec], ev.EvalConfig(max_new_tokens=4, selfplay_games=0))
    assert len(values) == 1 and -1.0 <= values[0] <= 1.0


def test_heldout_rewards_are_the_training_reward_of_each_completion(monkeypatch):
    """The held-out reward is what GRPO trains on: the profile's reward functions and weights, summed
    as the trainer sums them (graded by default; gated is rewards.score)."""
    from rookworld_lib.chess import data, rewards

    recs = data.load_split("P", "test")[:2] + data.load_split("A", "test")[:2]
    texts = [recs[0]["completion"], "garbage", recs[2]["completion"], "garbage"]
    monkeypatch.setattr(ev, "_decode", lambda model, records, cfg, prompt_of: (
        list(records), [prompt_of(r, cfg.layout) for r in records], texts))
    graded = ev.heldout_rewards(None, recs, ev.EvalConfig(layout="compact"))
    assert graded == pytest.approx([1.0, 0.0, 1.0, -1.0])  # the label itself earns the whole reward
    gated = ev.heldout_rewards(None, recs, ev.EvalConfig(layout="compact"), reward="gated")
    assert gated == pytest.approx([rewards.score(r["prompt"], t, truth=r) for r, t in zip(recs, texts)])
    assert gated[1] < 0 == graded[1]  # the two rewards differ on a malformed answer
    # the truth travels with each record: nothing registered and no engine, the same rewards
    rewards.clear_truth()
    rewards.clear_cache()
    monkeypatch.setattr(rewards, "stockfish_available", lambda: False)
    assert ev.heldout_rewards(None, recs, ev.EvalConfig(layout="compact")) == pytest.approx([1.0, 0.0, 1.0, -1.0])


def test_results_to_json_leaves_the_outcomes_out():
    assert "outcomes" not in ev.results_to_json({"policy/valid": ev.rate([1, 0])})["policy/valid"]


def test_results_to_json_is_strict_json():
    import json

    results = {"a/rate": ev.wilson(0, 0), "b/mean": ev.mean_interval([1.0, 2.0])}
    out = json.dumps(ev.results_to_json(results), allow_nan=False)  # raises on NaN
    back = json.loads(out)
    assert back["a/rate"] == {"value": None, "low": None, "high": None, "n": 0, "kind": "rate"}
    assert back["b/mean"]["value"] == 1.5


def test_prompts_carry_the_models_prompt_prefix(monkeypatch):
    """Evaluation prompts a model as its SFT trained it (EOT first) unless told otherwise."""
    from rookworld_lib.core.tokenizer import EOT_ID, encode

    seen = []
    real = ev.generate
    monkeypatch.setattr(ev, "generate", lambda model, ids, sc: seen.append(ids) or real(model, ids, sc))
    model = GPT(GPTConfig.preset("tiny", block_size=192)).eval()
    prompt = tasks.policy_prompt(chess.Board().fen())
    ev.complete(model, [prompt], ev.EvalConfig(max_new_tokens=2))
    ev.complete(model, [prompt], ev.EvalConfig(max_new_tokens=2, prompt_prefix=""))
    model.prompt_prefix = ""
    ev.complete(model, [prompt], ev.EvalConfig(max_new_tokens=2))
    assert seen == [[[EOT_ID] + encode(prompt)], [encode(prompt)], [encode(prompt)]]


def test_a_label_with_fewer_candidates_asks_for_as_many():
    """`datagen --multipv 3` labels list three candidates of twenty legal moves: the strict metric and the
    graded reward ask for as many as the data give, so the label's own answer is valid and scores 1.0."""
    from rookworld_lib.chess import datagen, rewards

    s = {"split": "test", "game": 0, "source": "selfplay", "ply": 0, "fen": chess.STARTING_FEN, "tags": [], "n_legal": 20}
    rec = datagen.policy_record(s, {"moves": ["e2e4", "d2d4", "g1f3"], "evals": ["0.35", "0.3", "0.25"],
                                    "limit": "depth=8"}, "Stockfish 15.1")
    res = ev.evaluate_policy(None, [rec], ev.EvalConfig(selfplay_games=0), completions=[rec["completion"]])
    assert res["policy/valid"].value == 1.0
    graded = rewards.score_policy_detailed(rec["prompt"], rec["completion"], truth=rec, weights=rewards.GradedWeights())
    assert (graded.valid, graded.moves_distinct, graded.total) == (1.0, 1.0, 1.0)
    five = " M: e2e4 d2d4 g1f3 c2c4 e2e3 E: 0.35 0.3 0.25 0.2 0.1 B: e2e4"  # more than the data give: not valid
    assert ev.evaluate_policy(None, [rec], ev.EvalConfig(selfplay_games=0), completions=[five])["policy/valid"].value == 0.0


SCHOLAR = "r1bqkb1r/pppp1ppp/2n2n2/4p2Q/2B1P3/8/PPPP1PPP/RNB1K1NR w KQkq - 4 4"  # Qh5xf7 mates; Bc4xf7 only checks


def test_environment_metrics_by_hand(monkeypatch):
    t = tasks.environment_step(SCHOLAR, "h5f7")
    assert (t.reward, t.terminated, t.truncated) == (1.0, 1, 0)  # python-chess: mate
    rec = {"task": "A", "fen": t.fen, "move": "h5f7", "history": list(t.history), "prompt": t.prompt,
           "new_fen": t.new_fen, "reward": 1.0, "terminated": 1, "truncated": 0}
    completions = [t.completion,  # right
                   f"{t.new_fen}+1.0+0+0",  # well-formed, says the game goes on
                   f"{t.new_fen}+1.0+1"]  # a flag short: not valid, though its FEN, reward and first flag are right
    monkeypatch.setattr(ev, "complete", lambda model, prompts, cfg, samples=0: completions)
    res = ev.evaluate_environment(None, [rec] * 3, ev.EvalConfig(samples=0))
    assert res["env/valid"].outcomes == (1, 1, 0)
    assert res["env/next_fen_exact"].outcomes == (1, 1, 1) and res["env/reward_accuracy"].outcomes == (1, 1, 1)
    assert res["env/terminated_accuracy"].outcomes == (1, 0, 1)
    assert res["env/truncated_accuracy"].outcomes == (1, 1, 0)


def test_mate_in_one_counts_mates_not_checks(monkeypatch):
    board = chess.Board(SCHOLAR)
    for move, mates in (("h5f7", True), ("c4f7", False)):  # python-chess's verdict after each move
        after = board.copy()
        after.push_uci(move)
        assert after.is_checkmate() == mates and after.is_check()
    monkeypatch.setattr(ev, "complete", lambda model, prompts, cfg, samples=0: [" M: h5f7 E: M1 B: h5f7",
                                                                                " M: c4f7 E: 0.5 B: c4f7", "garbage"])
    res = ev.evaluate_mate_in_one(None, [{"fen": SCHOLAR, "mating_moves": ["h5f7"]}] * 3, ev.EvalConfig(samples=0))
    assert res["mate_in_one/accuracy"].outcomes == (1, 0, 0)


def test_top5_overlap_is_a_share_of_the_labels_own_candidates():
    rec = {**start_record(), "moves": ["e2e4", "d2d4", "g1f3"], "evals": ["0.35", "0.3", "0.28"]}
    res = ev.evaluate_policy(None, [rec], ev.EvalConfig(samples=0, selfplay_games=0),
                             completions=[" M: e2e4 d2d4 g1f3 E: 0.35 0.3 0.28 B: e2e4"])
    assert res["policy/top5_overlap"].value == 1.0  # three of three, not three of five


def test_records_pair_by_position_and_move():
    a, b = ({"fen": SCHOLAR, "move": m} for m in ("h5f7", "c4f7"))
    assert ev.record_key(a) != ev.record_key(b) and ev.record_key(a) == ev.record_key(dict(a))


def test_self_play_counts_every_legal_half_move_up_to_the_cap(monkeypatch):
    def first_legal(model, prompts, cfg, samples=0):  # a player that always names a legal move
        out = []
        for p in prompts:
            board = chess.Board(tasks.parse_policy_prompt(p).fen)
            move = sorted(m.uci() for m in board.legal_moves)[0]
            out.append(f" M: {move} E: 0.0 B: {move}")
        return out

    monkeypatch.setattr(ev, "complete", first_legal)
    res = ev.self_play(GPT(GPTConfig.preset("tiny", block_size=192)), ev.EvalConfig(selfplay_games=1, selfplay_max_plies=6))
    assert res["self_play/legal_half_moves"].value == 6.0
    # under sampled decoding each ply draws with its own seeds (none shared with another ply's batches):
    # every ply was seeded alike, so each one's draws used the same noise
    seeds = []
    monkeypatch.setattr(ev, "complete", lambda model, prompts, cfg, samples=0: seeds.append(cfg.seed) or first_legal(
        model, prompts, cfg))
    ev.self_play(GPT(GPTConfig.preset("tiny", block_size=192)), ev.EvalConfig(
        selfplay_games=3, selfplay_max_plies=4, decoding="sampled", temperature=0.6, seed=5))
    assert seeds == [5, 8, 11, 14]  # seed + ply x selfplay_games: each ply's batches start past the last ply's


def test_self_play_writes_each_position_as_the_layouts_training_data_do(monkeypatch):
    """After 1.e4 the compact data write the en-passant square (e3), the original data python-chess's
    default FEN (none: no capture is legal); self-play asked compact models in the second spelling,
    one they never trained on."""
    for layout, after_e4 in (("compact", "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1"),
                             ("original", "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1")):
        prompts = []
        monkeypatch.setattr(ev, "complete", lambda model, ps, cfg: prompts.extend(ps) or [" M: e2e4 E: 0.0 B: e2e4"] * len(ps))
        ev.self_play(GPT(GPTConfig.preset("tiny", block_size=192)), ev.EvalConfig(selfplay_games=1, selfplay_max_plies=3, layout=layout))
        assert prompts[:2] == [tasks.policy_prompt(chess.STARTING_FEN, layout), tasks.policy_prompt(after_e4, layout)], prompts
        assert len(prompts) == 2  # black's e2e4 is illegal: the game's count ends


def test_pass_at_1_samples_at_the_sample_temperature_not_the_sampled_decodings(monkeypatch):
    class Seen(Exception):
        pass

    def generate(model, ids, sc):
        raise Seen(sc.temperature, sc.num_samples)

    monkeypatch.setattr(ev, "generate", generate)
    cfg = ev.EvalConfig(decoding="sampled", temperature=1.7, sample_temperature=0.6, layout="compact")
    with pytest.raises(Seen) as seen:
        ev.complete(GPT(GPTConfig.preset("tiny", block_size=128)), ["P: x"], cfg, samples=4)
    assert seen.value.args == (0.6, 4)


def test_original_label_agreement_reads_the_original_best_and_fen_similarity_one_en_passant_spelling():
    board = chess.Board()
    rec = {"id": "r", "fen": board.fen(), "moves": ["e2e4", "d2d4"], "evals": ["0.3", "0.2"], "original_best": "d2d4",
           "task": "P", "split": "test"}
    prompt = tasks.policy_prompt(rec["fen"])
    scores = ev._score_policy([rec], [prompt], [" M: e2e4 d2d4 E: 0.3 0.2 B: d2d4"])
    assert scores["policy/original_label_agreement"].value == 1.0 and scores["policy/best_move_accuracy"].value == 0.0
    board.push_uci("e2e4")  # python-chess writes "-" (no capture is legal); the FEN standard writes e3 after any double step
    spelled = board.fen(en_passant="fen")
    assert spelled != board.fen()
    env = {"id": "a", "fen": chess.STARTING_FEN, "move": "e2e4", "history": ["e2e4"], "new_fen": spelled,
           "reward": 0.001, "terminated": 0, "truncated": 0, "task": "A", "split": "test"}
    env_prompt = tasks.env_prompt(chess.STARTING_FEN, "e2e4", ["e2e4"])
    out = ev._score_environment([env], [env_prompt], [tasks.env_completion(board.fen(), 0.001, 0, 0)])
    assert out["env/fen_similarity"].value == 1.0 and out["env/next_fen_exact"].value == 1.0


def test_self_play_starts_from_distinct_positions_the_first_the_initial_one_and_plays_past_a_claimable_draw(monkeypatch):
    prompts = []
    monkeypatch.setattr(ev, "complete", lambda model, ps, cfg: prompts.append(ps) or [""] * len(ps))  # every answer illegal
    model = GPT(GPTConfig.preset("tiny", block_size=128))
    ev.self_play(model, ev.EvalConfig(selfplay_games=60, layout="compact"))  # 20 positions lie one ply from the start
    starts = prompts[0]
    assert len(starts) == len(set(starts)) == 60 and starts[0] == tasks.policy_prompt(chess.STARTING_FEN)
    # the knights go out and back: a threefold repetition a player could claim at ply 8, not a game over
    dance = iter(["g1f3", "g8f6", "f3g1", "f6g8"] * 5)
    monkeypatch.setattr(ev, "complete", lambda model, ps, cfg: [f" M: {m} E: 0.0 B: {m}" for m in [next(dance)] * len(ps)])
    played = ev.self_play(model, ev.EvalConfig(selfplay_games=1, selfplay_max_plies=12, layout="compact"))
    assert played["self_play/legal_half_moves"].value == 12
    assert "self_play" not in ev.selected_suites([], [], [], ev.EvalConfig(selfplay_games=0))


def test_a_change_whose_interval_is_the_point_zero_has_not_moved():
    # pass@1 shares the same for every record before and after: every difference 0, the t interval [0, 0]
    keys = tuple(f"k{i}" for i in range(5))
    same = dataclasses.replace(ev.mean_interval([0.25] * 5, share=True), outcomes=(0.25,) * 5, keys=keys)
    table = ev.paired_change({"pass@1/policy/valid": same}, {"pass@1/policy/valid": same}, ["pass@1/policy/valid"])
    assert table.loc["pass@1/policy/valid", "change (points)"] == "+0.0 [+0.0, +0.0]"
    assert table.loc["pass@1/policy/valid", "moved"] == "no resolved change"


def test_the_test_suites_hold_only_test_records_and_curve_tables_count_tokens_in_millions():
    import json

    from rookworld_lib.core.paths import DATA_DIR

    with open(DATA_DIR / "mate_in_one.jsonl") as fh:
        splits = [json.loads(line)["split"] for line in fh]
    suites = ev.load_test_suites(keys=("M1",))
    assert len(suites["M1"]) == splits.count("test") and splits.count("val") > 0
    row = {"step": 10, "tokens": 2_500_000, "train_wall_s": 1.0, "train_loss": 2.0, "val_loss": 2.1}
    assert ev.curve_table([row])["tokens (M)"].tolist() == [2.5]


def test_a_bare_env_prompt_record_is_asked_in_the_models_layout(monkeypatch):
    """A user's own A: eval data may be bare prompts, {"prompt": ...}, as another tool wrote them: here
    the FEN standard's spelling, an en-passant square after every double step. A model of the original
    layout is asked in python-chess's spelling (the square only where a capture is legal), as it was
    trained; a compact model gets the prompt as written, and a prompt that does not parse is passed
    through untouched (the reward scores it as it is)."""
    written = "A: rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1+e7e5+e2e4 e7e5+"  # after 1. e4
    board = chess.Board()
    board.push_uci("e2e4")  # python-chess's replay of the history's first move: no black pawn can take on e3
    assert board.fen() == "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"
    asked = f"A: {board.fen()}+e7e5+e2e4 e7e5+"
    assert ev.env_prompt_of({"prompt": written}, "original") == asked
    assert ev.env_prompt_of({"prompt": written}, "compact") == written
    assert ev.env_prompt_of({"prompt": "A: e2e4"}, "original") == "A: e2e4"
    # scored through evaluate_environment: the truth is python-chess's replay of the prompt's move
    board.push_uci("e7e5")
    assert board.fen() == "rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq - 0 2"
    rec = {"prompt": written, "new_fen": board.fen(), "reward": 0.001, "terminated": 0, "truncated": 0}
    seen = []
    monkeypatch.setattr(ev, "complete", lambda model, prompts, cfg, samples=0: seen.extend(prompts) or [
        f"{board.fen()}+0.001+0+0", f"{board.fen()}+1.0+1+0"])
    res = ev.evaluate_environment(None, [rec, rec], ev.EvalConfig(layout="original", samples=0))
    assert seen == [asked, asked]
    assert res["env/valid"].outcomes == (1, 1) and res["env/next_fen_exact"].outcomes == (1, 1)
    assert res["env/reward_accuracy"].outcomes == (1, 0) and res["env/terminated_accuracy"].outcomes == (1, 0)


def test_a_short_context_model_gets_its_whole_budget_or_a_refusal_never_a_cut_that_depends_on_the_batch():
    """A 128-position model and A: prompts of about 100 tokens: the budget was cut, per batch, to fit the
    batch's longest prompt, so one prompt's greedy answer changed with --batch-size. Now the budget holds
    for every row, or the call is refused naming the budget that fits."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", block_size=128)).eval()
    prompts = [r["prompt"] for r in data.load_split("A", "test").records[:6]]
    longest = max(len(encode_prompt(p, "")) for p in prompts)
    assert 80 < longest < 128
    with pytest.raises(ValueError, match=rf"the longest prompt \({longest} tokens\) \+ max_new_tokens \(40\) .* "
                                         rf"give --max-new-tokens {129 - longest} or fewer"):
        ev.complete(model, prompts, ev.EvalConfig(max_new_tokens=40, layout="compact", prompt_prefix=""))
    fits = dict(max_new_tokens=129 - longest, layout="compact", prompt_prefix="")
    one = ev.complete(model, prompts, ev.EvalConfig(batch_size=1, **fits))
    assert one == ev.complete(model, prompts, ev.EvalConfig(batch_size=6, **fits))


# Behaviours of chess/evaluate that no test pinned (mutation round 6, stop 68: each test below is red with its mutant)

def test_pass_at_1_effective_draws_use_the_unbiased_variance_of_the_mean():
    """Design effect by hand: shares 3/4, 1/4, 2/4, 0/4; p = 0.375; the variance of the mean is the sample
    variance (n - 1 denominator, statistics.variance) over n = 0.3125 / 3 / 4; n_eff = p(1 - p) / that = 9,
    inside [n, n x k] = [4, 16]; the interval is Wilson's at 3.375 of 9."""
    per_record = [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]]
    shares = [sum(s) / len(s) for s in per_record]
    p = statistics.mean(shares)
    n_eff = p * (1 - p) / (statistics.variance(shares) / len(shares))
    assert math.isclose(n_eff, 9.0)
    low, high = _wilson(p * n_eff, n_eff)
    e = ev.pass_at_1(per_record)
    assert e.value == p and e.n == 4
    assert math.isclose(e.low, low, abs_tol=1e-6) and math.isclose(e.high, high, abs_tol=1e-6)


def test_a_constant_share_other_than_0_or_1_has_the_point_t_interval():
    """mean_interval(share=True) takes the Wilson interval only where every value is 0 (or every one 1); five
    records all at 0.4 have no spread: the Student t interval is the point 0.4 (sd 0)."""
    e = ev.mean_interval([0.4] * 5, share=True)
    assert (e.value, e.low, e.high, e.n, e.kind) == (0.4, 0.4, 0.4, 5, "share")


def test_pass_at_1_rows_refuse_to_pair_other_records(monkeypatch):
    """paired_change matches records by what they are about, for pass@1 rows as for greedy ones (module
    docstring: 'compares them record by record as it does greedy ones'): the same two A: records evaluated in
    the other order are refused, not paired position 1 with position 2."""
    steps = [tasks.environment_step(chess.STARTING_FEN, m) for m in ("e2e4", "d2d4")]
    records = [{"task": "A", "fen": t.fen, "move": t.move, "history": list(t.history), "prompt": t.prompt,
                "new_fen": t.new_fen, "reward": t.reward, "terminated": t.terminated, "truncated": t.truncated}
               for t in steps]
    right = {t.prompt: t.completion for t in steps}
    monkeypatch.setattr(ev, "complete", lambda model, prompts, cfg, samples=0:
                        [right[p] for p in prompts for _ in range(max(1, samples))])
    cfg = ev.EvalConfig(samples=2, sample_temperature=1.0, layout="compact", prompt_prefix="", selfplay_games=0)
    model = object()  # never decoded: complete is replaced
    before = ev.evaluate_environment(model, records, cfg)
    after = ev.evaluate_environment(model, records[::-1], cfg)
    assert before["pass@1/env/valid"].value == 1.0 and before["pass@1/env/valid"].n == 2
    with pytest.raises(ValueError, match="not of the same records"):
        ev.paired_change(before, after, ["pass@1/env/valid"])
    assert ev.paired_change(before, before, ["pass@1/env/valid"]).shape[0] == 1


def test_records_of_another_suite_and_completions_that_do_not_pair_up_are_refused_naming_them():
    """Found by a hostile audit: evaluate_policy zipped 1 completion with 3 records (every metric at n=1) and
    scored a str letter by letter; A: records gave KeyError 'moves'; mate in one scored P: positions 0%
    without a word; a bad label said nothing of the record."""
    P, A = data.load_split("P", "test").records[:3], data.load_split("A", "test").records[:2]
    cfg = ev.EvalConfig(samples=0, max_new_tokens=8, selfplay_games=0, layout="compact", prompt_prefix="")
    model = GPT(GPTConfig.preset("tiny", block_size=128))
    texts = [r["completion"] for r in P]
    for call, message in (
            (lambda: ev.evaluate_policy(None, P, cfg, completions=texts[:1]),
             r"^completions: 1 for 3 records; give one completion per record, in order$"),
            (lambda: ev.evaluate_policy(None, P, cfg, completions=texts[0]), r"^completions: one str for 3 records"),
            (lambda: ev.evaluate_policy(model, A, cfg),
             rf"^records\[0\] \({A[0]['id']}\) is a record of task 'A', not of task 'P': give this suite's records$"),
            (lambda: ev.evaluate_mate_in_one(model, P, cfg), r"^records\[0\] \(P-.*\) is a record of task 'P', not of task 'M1'"),
            (lambda: ev.evaluate_environment(model, P, cfg), r"not of task 'A'"),
            (lambda: ev.evaluate_policy(None, [{k: v for k, v in P[0].items() if k != "moves"}], cfg, completions=texts[:1]),
             r"^records\[0\] \(P-.*\): a record of task 'P' needs the field\(s\) moves$"),
            (lambda: ev.evaluate_policy(None, [dict(P[0], moves=["a1a8", *P[0]["moves"][1:]])], cfg, completions=texts[:1]),
             rf"^record {P[0]['id']}: unusable policy truth: move 'a1a8' in 'moves' is not a legal UCI move")):
        with pytest.raises(ValueError, match=message):
            call()
    assert ev.evaluate_policy(None, P, cfg, completions=texts)["policy/valid"].n == 3


def test_a_cap_takes_records_spread_over_the_file_the_same_for_every_model():
    """--max-policy 50 took the first 50 records: 5 of the shipped test split's 48 games, whose legal-best
    rate (42% for make run's GRPO model) lay outside the whole split's interval (19.9% [17.1, 22.9])."""
    records = data.load_split("P", "test").records
    games = {r["game"] for r in records}
    picked = ev.capped(records, 50)
    assert len(picked) == 50 and len({r["id"] for r in picked}) == 50
    assert [records.index(r) for r in picked] == sorted(records.index(r) for r in picked)  # in file order
    assert len({r["game"] for r in picked}) >= 0.75 * len(games) > 5 == len({r["game"] for r in records[:50]})
    assert ev.capped(records, None) == records == ev.capped(records, 10 ** 6) and ev.capped(records, 0) == []
    assert ev.capped(list(range(10)), 3) == [0, 3, 6]


def test_a_mean_whose_values_all_sit_at_a_bound_keeps_an_interval():
    """Every self-play game at the ply cap gave 100 [100, 100], every cp loss 0 gave 0 [0, 0]: certainty. As a
    rate at 0% or 100% does, such a mean takes the Wilson interval of n right (or n wrong), scaled to its bounds."""
    top = ev.mean_interval([40.0] * 8, bounds=(0.0, 40.0))  # every game at the ply cap
    w = ev.wilson(8, 8)
    assert top.value == top.high == 40.0 and top.low == pytest.approx(40.0 * w.low) and top.low < 40.0
    zero = ev.mean_interval([0.0] * 8, bounds=(0.0, 2000.0))  # every legal best move the engine's
    assert zero.value == zero.low == 0.0 and zero.high == pytest.approx(2000.0 * ev.wilson(0, 8).high)
    assert ev.mean_interval([0.0, 0.0, 0.0], share=True) == dataclasses.replace(ev.wilson(0, 3), kind="share")
    inside = ev.mean_interval([54.0, 54.0], bounds=(0.0, 2000.0))  # equal inside the bounds: the point (spread unknown)
    assert inside.low == inside.high == 54.0
    assert ev.mean_interval([0.0, 0.0]).low == ev.mean_interval([0.0, 0.0]).high == 0.0  # unbounded (a paired change)
    spread = ev.mean_interval([1.0, 3.0], bounds=(0.0, 10.0))  # values that differ keep Student's t
    assert spread.low == 0.0 and spread.value == 2.0


def test_statistics_helpers_refuse_outcomes_they_would_misread():
    """rate([0.3, 0.0, 0.2, 0.1]) was 75% and rate(['no', 'no']) 100%; newcombe_paired of 4 and 1 records
    paired the first; paired_difference(binary=True) truncated shares 0.5 and 0.9 to 0: no change."""
    for bad in ([0.3, 0.0], ["no", "no"], [2, 1]):
        with pytest.raises(ValueError, match="rate: outcomes are right/wrong"):
            ev.rate(bad)
    assert ev.rate([True, 0, 1.0]).value == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="rate: 1 keys for 2 outcomes"):
        ev.rate([1, 0], keys=["a"])
    for before, after in (([1, 1, 1, 1], [1]), ([], [])):
        with pytest.raises(ValueError, match="newcombe_paired needs the same records before and after"):
            ev.newcombe_paired(before, after)
    with pytest.raises(ValueError, match=r"paired_difference\(binary=True\) needs right/wrong outcomes"):
        ev.paired_difference([0.5, 0.2], [0.7, 0.9], binary=True)


def test_load_split_sends_the_mate_in_one_set_to_its_own_reader():
    """load_split("M1", "test") blamed the shipped file's val records on the file."""
    with pytest.raises(ValueError, match=r"load_split reads 'P' and 'A' splits; .* load_mate_in_one\(data_dir\)"):
        data.load_split("M1", "test")
