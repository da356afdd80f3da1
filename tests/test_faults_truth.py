"""A malformed ground truth is a set-up error, never a score (issue 28, finding 4).

Each row hands the rewards the first shipped test record with one truth field broken, through the
public reward API (`score_policy` / `score_environment`, `register_truth`) and through the TRL reward
functions (the record's columns, as a `datasets.Dataset` hands them): every one raises TruthError with
one line naming the field, its value and what is allowed. The TRL functions take what `datasets`
hands them (lists, tuples, numpy arrays and scalars) and never raise because of a completion.
"""

from __future__ import annotations

import chess
import numpy as np
import pytest

from rookworld_lib.chess import data, rewards, tasks

pytestmark = pytest.mark.fault

COLUMNS = (*rewards.POLICY_TRUTH_COLUMNS, "limit", *rewards.ENV_TRUTH_COLUMNS)
POLICY = data.load_split("P", "test")[0]
ENV = data.load_split("A", "test")[0]
N_MOVES = len(POLICY["moves"])

# (record, field, bad value, what the one-line TruthError says)
BROKEN = [
    (POLICY, "moves", "e2e4", "field 'moves' must be a list of 1..5 legal UCI moves, got 'e2e4'"),
    (POLICY, "moves", ["zz"] * N_MOVES, "move 'zz' in 'moves' is not a legal UCI move in this position"),
    (POLICY, "moves", [], "field 'moves' must be a list of 1..5 legal UCI moves, got"),
    (POLICY, "moves", [POLICY["moves"][0]] * N_MOVES, "field 'moves' repeats a move"),
    (POLICY, "evals", POLICY["evals"][:1], f"field 'evals' must be a list of {N_MOVES} evals, one per move"),
    (POLICY, "evals", ["nan"] * N_MOVES, "eval 'nan' in 'evals' is not in the eval format"),
    (POLICY, "evals", [0.35] * N_MOVES, "eval 0.35 in 'evals' is not in the eval format"),
    (POLICY, "fen", "garbage", "field 'fen': FEN must have 6 space-separated fields, has 1: 'garbage'"),
    (POLICY, "limit", 8, "field 'limit' must be a string such as 'depth=8' (or absent), got 8"),
    (ENV, "reward", float("nan"), "field 'reward' must be one of (0.001, 1.0, 0.5, -1.0), got nan"),
    (ENV, "reward", 123.0, "field 'reward' must be one of (0.001, 1.0, 0.5, -1.0), got 123.0"),
    (ENV, "reward", "x", "field 'reward' must be one of (0.001, 1.0, 0.5, -1.0), got 'x'"),
    (ENV, "reward", True, "field 'reward' must be one of (0.001, 1.0, 0.5, -1.0), got True"),
    (ENV, "terminated", 7, "field 'terminated' must be 0 or 1, got 7"),
    (ENV, "truncated", "0", "field 'truncated' must be 0 or 1, got '0'"),
    (ENV, "new_fen", "garbage", "field 'new_fen': FEN must have 6 space-separated fields, has 1: 'garbage'"),
    (ENV, "reward", 0.5, "reward/terminated/truncated 0.5/0/0 is no outcome of a move"),
]
IDS = [f"{rec['task']}-{field}={value!r}"[:40] for rec, field, value, _ in BROKEN]


def _score(rec, completion, truth):
    if rec["task"] == "P":
        return rewards.score_policy(rec["prompt"], completion, truth=truth, engine=None)
    return rewards.score_environment(rec["prompt"], completion, truth=truth)


def _columns(recs):
    return {c: [r.get(c) for r in recs] for c in COLUMNS}


@pytest.mark.parametrize("rec, field, value, message", BROKEN, ids=IDS)
def test_a_malformed_truth_raises_truth_error_naming_the_field(rec, field, value, message):
    bad = {**rec, field: value}
    for completion in (rec["completion"], "garbage"):
        with pytest.raises(rewards.TruthError, match="unusable .* truth: ") as exc:
            _score(rec, completion, bad)
        assert message in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(rewards.TruthError, match=f"record 0 \\(id '{rec['id']}'\\): unusable") as exc:
        rewards.register_truth([bad])
    assert message in str(exc.value)
    # the TRL reward functions: a truth column that is there but unusable stops the run (a None would
    # silently drop the row from training)
    for reward in (rewards.trl_reward, rewards.trl_policy_reward if rec["task"] == "P" else rewards.trl_env_reward):
        with pytest.raises(rewards.TruthError) as exc:
            reward([rec["prompt"]], [rec["completion"]], **_columns([bad]))
        assert message in str(exc.value)


def test_a_truth_column_for_another_position_raises_in_trl():
    other = data.load_split("P", "test")[1]
    with pytest.raises(rewards.TruthError, match="not for the prompt's position"):
        rewards.trl_policy_reward([POLICY["prompt"]], [POLICY["completion"]], **_columns([other]))


def test_an_environment_truth_of_another_prompt_raises():
    """An A: truth holds no position to compare with the prompt's, so it is checked against the move's
    transition (tasks.environment_step): another record's truth, or a legal position the move does not
    reach, raise TruthError where they were scored silently (a perfect answer got 0.39); the record's own
    truth scores the answer 1.0, given, registered or as a TRL column."""
    env = data.load_split("A", "test").records
    rec, other = env[0], next(r for r in env[1:] if not tasks.same_position(r["new_fen"], env[0]["new_fen"]))
    assert rewards.score_environment(rec["prompt"], rec["completion"], truth=rec) == 1.0
    for wrong in (other, {**rec, "new_fen": other["new_fen"]}):
        with pytest.raises(rewards.TruthError, match=f"is not what the prompt's move '{rec['move']}' gives"):
            rewards.score_environment(rec["prompt"], rec["completion"], truth=wrong)
        with pytest.raises(rewards.TruthError, match="is not what the prompt's move"):
            rewards.trl_env_reward([rec["prompt"]], [rec["completion"]], **_columns([wrong]))
    rewards.register_truth([{**other, "prompt": rec["prompt"]}])  # registered under this prompt
    try:
        with pytest.raises(rewards.TruthError, match="is not what the prompt's move"):
            rewards.score_environment(rec["prompt"], rec["completion"])
    finally:
        rewards.clear_truth()


def test_trl_rewards_take_what_datasets_hands_them_and_no_completion_makes_them_raise():
    datasets = pytest.importorskip("datasets")
    recs = [*data.load_split("P", "test")[:3], *data.load_split("A", "test")[:3]]
    comps = [r["completion"] if i % 3 == 0 else r["completion"][:-4] if i % 3 == 1 else "garbage !!"
             for i, r in enumerate(recs)]
    expected = [_score(r, c, r) for r, c in zip(recs, comps)]
    assert len(set(expected)) > 2
    ds = datasets.Dataset.from_list([{c: r.get(c) for c in ("prompt", *COLUMNS)} for r in recs])
    tuples = {c: tuple(tuple(v) if isinstance(v, list) else v for v in col) for c, col in _columns(recs).items()}
    # python lists; numpy arrays per column and per row (float32 rewards and flags: None reads NaN there); tuples
    for cols in (ds[:], ds.with_format("numpy")[:], {"prompt": [r["prompt"] for r in recs], **tuples}):
        prompts = cols.pop("prompt")
        assert rewards.trl_reward(prompts, comps, **cols) == expected
    scalars = {"new_fen": [np.str_(ENV["new_fen"])], "reward": [np.float32(ENV["reward"])],
               "terminated": [np.bool_(ENV["terminated"])], "truncated": np.array([ENV["truncated"]])}
    assert rewards.trl_env_reward([ENV["prompt"]], [ENV["completion"]], **scalars) == [1.0]
    odd = [None, 3.5, {"bad": 1}, np.str_(comps[3]), ["x"], b"M: e2e4"]
    numpy_cols = ds.with_format("numpy")[:]
    out = rewards.trl_reward(list(numpy_cols.pop("prompt")), odd, **numpy_cols)
    assert out[3] == expected[3] and all(x is None or -1.0 <= x <= 1.0 for x in out)


def test_every_shipped_test_record_is_a_usable_truth():
    for rec in data.load_split("P", "test"):
        assert tasks.policy_truth_error(chess.Board(rec["fen"]), rec["moves"], rec["evals"]) is None, rec["id"]
        assert rewards.policy_truth(rec).moves == tuple(rec["moves"])
    for rec in data.load_split("A", "test"):
        fields = [rec[c] for c in rewards.ENV_TRUTH_COLUMNS]
        assert tasks.env_truth_error(*fields) is None, rec["id"]
        assert rewards.env_truth(rec) == rewards.EnvTruth(*fields)
