"""Our rewards as TRL reward functions: `rewards.trl_reward` & co. (signature prompts, completions,
**columns -> list), fed with the data set's truth columns, and a two-step TRL GRPOTrainer run with them."""

from __future__ import annotations

import json
import logging
import math

import pytest
from helpers_chess import shipped

from rookworld_lib.chess import data, rewards
from rookworld_lib.core.paths import DATA_DIR

COLUMNS = ("task", "fen", "moves", "evals", "limit", "new_fen", "reward", "terminated", "truncated")


def _records(n_policy=3, n_env=3):
    pol = [json.loads(line) for line in (DATA_DIR / "policy_val.jsonl").read_text().splitlines()[:n_policy]]
    env = [json.loads(line) for line in (DATA_DIR / "env_val.jsonl").read_text().splitlines()[:n_env]]
    return pol + env


def _columns(records):
    """As TRL passes them: one list per data-set column, every column present for every row (None where absent)."""
    return {c: [r.get(c) for r in records] for c in COLUMNS}


def _direct(rec, completion):
    if rec["task"] == "P":
        return rewards.score_policy(rec["prompt"], completion, truth=rec, engine=None)
    return rewards.score_environment(rec["prompt"], completion, truth=rec)


def _completions(records):
    """Per record: the true answer, a wrong one and garbage."""
    out = []
    for r in records:
        wrong = r["completion"].replace("B: ", "B: a1a1 ") if r["task"] == "P" else r["completion"][:-3] + "1+1"
        out.append([r["completion"], wrong, "garbage !!"])
    return out


def test_trl_reward_equals_direct_scoring_with_the_record_as_truth():
    recs = _records()
    cols = _columns(recs)
    for k in range(3):
        comps = [c[k] for c in _completions(recs)]
        got = rewards.trl_reward([r["prompt"] for r in recs], comps, **cols)
        assert got == [_direct(r, c) for r, c in zip(recs, comps)]
    assert rewards.trl_reward([r["prompt"] for r in recs], [r["completion"] for r in recs], **cols) == [1.0] * 6


def test_single_task_functions_return_none_for_the_other_task():
    recs = _records(2, 2)
    prompts, comps, cols = [r["prompt"] for r in recs], [r["completion"] for r in recs], _columns(recs)
    assert rewards.trl_policy_reward(prompts, comps, **cols) == [1.0, 1.0, None, None]
    assert rewards.trl_env_reward(prompts, comps, **cols) == [None, None, 1.0, 1.0]
    assert rewards.trl_policy_reward.__name__ == "rookworld_policy_reward"  # TRL logs rewards/<name>/mean
    assert rewards.trl_env_reward.__name__ == "rookworld_env_reward"
    assert rewards.trl_reward.__name__ == "rookworld_reward"


def test_a_text_where_a_list_of_texts_is_due_is_refused_not_scored_letter_by_letter():
    f = rewards.trl_reward_function("P")
    with pytest.raises(ValueError, match=r"^rookworld_policy_reward: prompts and completions must be lists of texts "
                                         r"\(one per row\), got str and str$"):
        f(prompts="P: x", completions="B: e2e4")  # returned 7 Nones, one per character


def test_conversational_prompts_and_completions():
    recs = _records(2, 2)
    cols = _columns(recs)
    plain = rewards.trl_reward([r["prompt"] for r in recs], [c[1] for c in _completions(recs)], **cols)
    chat_prompts = [[{"role": "system", "content": "You are RookWorld."}, {"role": "user", "content": r["prompt"]}]
                    for r in recs]
    chat_comps = [[{"role": "assistant", "content": c[1]}] for c in _completions(recs)]
    assert rewards.trl_reward(chat_prompts, chat_comps, **cols) == plain
    parts = [[{"role": "assistant", "content": [{"type": "text", "text": c[1]}]}] for c in _completions(recs)]
    assert rewards.trl_reward(chat_prompts, parts, **cols) == plain
    assert rewards.trl_text([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], "user") == "a"


def test_never_raises_and_says_why(caplog):
    recs = _records(1, 1)
    prompts = [r["prompt"] for r in recs]
    rewards._TRL_WARNED.clear()
    with caplog.at_level(logging.WARNING, logger="rookworld_lib.chess.rewards"):
        # no truth columns, nothing registered, no engine: the policy reward cannot be computed -> None;
        # the environment truth is replayed from the prompt
        out = rewards.trl_reward(prompts, [r["completion"] for r in recs])
    assert out == [None, 1.0]
    assert "MissingTruthError" in caplog.text
    # odd types, odd prompts, missing prompts: None or a score, never an exception
    cols = _columns(recs)
    odd = rewards.trl_reward([None, 42, "Q: what?", prompts[0]], [None, 3.5, "z", {"bad": 1}],
                             **_columns([recs[0]] * 4))
    assert odd[:3] == [None, None, None] and odd[3] == -1.0
    assert rewards.trl_reward(prompts[:1], ["a", "b"], **cols) == [rewards.trl_reward(prompts[:1], ["a"], **cols)[0],
                                                                   None]
    with pytest.raises(ValueError, match="task"):
        rewards.trl_reward_function("B")


def test_engine_and_weights_are_passed_through():
    recs = _records(1, 1)
    prompts, cols = [r["prompt"] for r in recs], _columns(recs)
    comps = [c[1] for c in _completions(recs)]
    pw = rewards.PolicyWeights(best_quality=0.0, format=1.0, moves_legal=0.0, moves_overlap=0.0, evals_accuracy=0.0)
    fn = rewards.trl_reward_function(policy_weights=pw)
    assert fn(prompts, comps, **cols)[0] == rewards.score_policy(prompts[0], comps[0], truth=recs[0], engine=None,
                                                                 weights=pw)


# ------------------------------------------------------------------------------------------
# TRL's GRPOTrainer, two steps, our reward functions
# ------------------------------------------------------------------------------------------

def _byte_tokenizer():
    """A byte-level tokenizer (256 bytes + <|endoftext|>, no merges), built offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<|endoftext|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


@pytest.mark.filterwarnings("ignore::FutureWarning")  # transformers 5 renames TRL still calls
def test_trl_grpo_trainer_trains_two_steps_on_our_rewards(tmp_path):
    trl = pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = _byte_tokenizer()
    torch.manual_seed(0)
    eos = tokenizer.eos_token_id
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=256, n_embd=32, n_layer=2, n_head=2,
                                       bos_token_id=eos, eos_token_id=eos, pad_token_id=eos))
    recs = _records(1, 1)
    # the README's data set for RookWorld-LM: its prompts in the original layout, which that model reads
    # (the records' own "prompt" is the compact layout of the models trained here); the truth in the columns
    prompts = [data.record_text(r, "original")[0] for r in recs]
    assert all(p != r["prompt"] for p, r in zip(prompts, recs) if r["task"] == "P")  # P: FENs padded to 90
    by_prompt = dict(zip(prompts, recs))
    dataset = datasets.Dataset.from_list([{"prompt": p, **{c: r.get(c) for c in COLUMNS}} for p, r in zip(prompts, recs)])

    calls = []

    def recording(fn):
        def wrapped(prompts, completions, **kwargs):
            out = fn(prompts, completions, **kwargs)
            calls.append((fn.__name__, list(prompts), list(completions), kwargs, out))
            return out
        wrapped.__name__ = fn.__name__
        return wrapped

    args = trl.GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4, num_generations=4,
                          max_completion_length=8, max_steps=2, learning_rate=1e-3, use_cpu=True, report_to="none",
                          logging_steps=1, save_strategy="no", seed=0, bf16=False, dataloader_num_workers=0,
                          disable_tqdm=True)
    trainer = trl.GRPOTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer,
                              reward_funcs=[recording(rewards.trl_policy_reward), recording(rewards.trl_env_reward)])
    trainer.train()

    assert trainer.state.global_step == 2
    assert len(calls) == 4  # two functions, two generation rounds
    seen_tasks = set()
    for name, prompts, completions, kwargs, out in calls:
        assert len(out) == len(prompts) == 4
        for p, c, r in zip(prompts, completions, out):
            rec = by_prompt[p]
            seen_tasks.add(rec["task"])
            if name == {"P": "rookworld_policy_reward", "A": "rookworld_env_reward"}[rec["task"]]:
                assert r == _direct(rec, c)  # the truth came through TRL's columns (the prompt's layout aside)
            else:
                assert r is None
        assert kwargs["fen"] == [by_prompt[p]["fen"] for p in prompts]
    assert seen_tasks == {"P", "A"}  # one epoch of two prompts: both tasks
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert len(logged) == 2
    for h in logged:
        assert math.isfinite(h["reward"]) and -1.0 <= h["reward"] <= 1.0
        assert any(h.get(f"rewards/{n}/mean") is not None for n in ("rookworld_policy_reward", "rookworld_env_reward"))


# Behaviours of the TRL reward functions that no test pinned (mutation round 6, stop 68: each red with its mutant)

def test_trl_a_row_whose_truth_cells_are_none_has_no_truth():
    """The TRL functions' contract (module comment): a row without truth, 'its columns absent or None
    there', is not a truth. An A: row with None in every truth column is replayed from the prompt (the exact
    answer scores 1.0); with no engine, a P: row of None cells is scored None (TRL's unscorable), not a TruthError."""
    a = next(r for r in shipped("A", "val") if r["kind"] == "legal")
    cols = {"new_fen": [None], "reward": [None], "terminated": [None], "truncated": [None]}
    assert rewards.trl_env_reward([a["prompt"]], [a["completion"]], **cols) == [1.0]
    p = shipped("P", "val")[0]
    f = rewards.trl_reward_function("P", engine=None)
    assert f([p["prompt"]], [p["completion"]], fen=[None], moves=[None], evals=[None]) == [None]
