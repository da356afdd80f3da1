import copy
import dataclasses
import json
import math
import statistics

import pytest
import torch

from rookworld_lib.lab.cli import main
from rookworld_lib.core import grpo, train_grpo
from rookworld_lib.core.model import GPT, GPTConfig
from rookworld_lib.core.sampling import sequence_logprobs
from rookworld_lib.core.tokenizer import EOT_ID, encode
from rookworld_lib.core.train_grpo import RESUME_MAY_CHANGE, GRPOTrainConfig, GRPOTrainer, PromptItem
from sft_helpers import item_reward


def toy_items():
    return [PromptItem("P", f"P: toy prompt {i}") for i in range(6)] + \
           [PromptItem("A", f"A: toy env {i}+e2e4+") for i in range(6)]


def toy_reward(item, text):
    # deterministic and varied within a group: parity of the completion's character count
    return float(len(text) % 2)


def make(cfg_kw=None, reward=toy_reward, **trainer_kw):
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", block_size=64))
    kw = dict(steps=1, prompts_per_step=4, group_size=4, max_new_tokens=8, lr=3e-3, minibatch_size=16,
              loss=grpo.GRPOConfig(beta=0.0), seed=1, progress=False, task_weights={"P": 0.5, "A": 0.5})
    kw.update(cfg_kw or {})
    return GRPOTrainer(model, toy_items(), GRPOTrainConfig(**kw), reward_funcs=item_reward(reward), **trainer_kw)


def record_rows(trainer):
    """The (step, rows) of each minibatch the trainer takes, in order, read where it picks its rows (my_rows)."""
    calls, real = [], trainer.my_rows
    trainer.my_rows = lambda rows: (calls.append((trainer.step, rows.tolist())), real(rows))[1]
    return calls


def rollout_batch(table, group_size, weights=(1.0,), width=1, mask_len=None):
    """A rollout of hand-set rewards (`table`: a row per completion, a column per reward function), prompt
    q<g> for group g: every token 7 at old log-prob -0.5, row i's mask its first mask_len[i] tokens (all)."""
    n = table.size(0)
    mask = torch.ones(n, width, dtype=torch.bool) if mask_len is None else \
        torch.arange(width)[None, :] < torch.tensor(mask_len)[:, None]
    return train_grpo.RolloutBatch([PromptItem("P", f"q{i // group_size}") for i in range(n)], [[1]] * n,
                                   torch.full((n, width), 7), torch.full((n, width), -0.5), mask,
                                   torch.zeros(n, dtype=torch.bool), train_grpo.reward_sum(table, list(weights)),
                                   [f"c{i}" for i in range(n)], table, n * width)


def per_row_logprob(trainer):
    b = trainer.last_batch
    with torch.no_grad():
        lp = sequence_logprobs(trainer.model, b.prompt_ids, b.tokens)
    return (lp * b.mask).sum(1) / b.mask.sum(1).clamp(min=1)


def test_one_step_raises_logprob_of_high_reward_completions():
    trainer = make()
    rec = trainer.train_step()
    adv = trainer.last_advantages
    assert (adv > 0).any() and (adv < 0).any()
    # log-probs before the update are the sampler's old log-probs (same function, same weights)
    b = trainer.last_batch
    # prompted as SFT trained it: EOT, then the prompt (model.prompt_prefix)
    assert all(ids[0] == EOT_ID and ids[1:] == encode(i.prompt) for ids, i in zip(b.prompt_ids, b.items))
    before = (b.old_logprobs * b.mask).sum(1) / b.mask.sum(1).clamp(min=1)
    after = per_row_logprob(trainer)
    delta = after - before
    assert delta[adv > 0].mean() > 0
    assert delta[adv < 0].mean() < 0
    for key in ("reward", "rewards/P/mean", "rewards/A/mean", "frac_reward_zero_std", "clip_ratio/region_mean",
                "grad_norm", "time/sampling", "time/scoring", "time/update", "completions/clipped_ratio", "completions/mean_length"):
        assert key in rec, key


def test_on_policy_first_pass_has_ratio_one():
    trainer = make()
    rec = trainer.train_step()
    assert abs(rec["ratio/mean"] - 1.0) < 1e-4
    assert rec["clip_ratio/region_mean"] == 0.0
    assert rec["ratio/onpolicy_dev"] < 1e-4


def test_onpolicy_ratio_dev_isolates_the_first_minibatch():
    # Four minibatches, two passes (mu = 2): the later updates are scored after updates, so the step's mean
    # ratio moves away from 1, while the first minibatch (same weights as the sampler) stays at ratio 1.
    # A completion's ratio and clip share in the rollout rows are those of its first update (COMPLETION_KEYS):
    # for the first minibatch, ratio 1 and nothing clipped, though the second pass sees it after updates.
    trainer = make({"minibatch_size": 4, "lr": 3e-2, "mu": 2})
    calls = record_rows(trainer)
    rec = trainer.train_step()
    assert rec["ratio/onpolicy_dev"] < 1e-4
    assert max(rec["ratio/max"] - 1.0, 1.0 - rec["ratio/min"]) > 1e-2
    first = calls[0][1]
    assert len(calls) == 8 and all(abs(trainer.last_rollout[i]["ratio"] - 1.0) < 1e-5 for i in first)
    assert all(trainer.last_rollout[i]["clip_fraction"] == 0.0 for i in first)
    assert rec["num_completions"] == 4 * 4  # the step's completions (prompts x group), not a minibatch's 4
    # the per-task reward spread is the sample std (Bessel), as TRL's per-function one
    rewards = [r for r, i in zip(trainer.last_batch.rewards.tolist(), trainer.last_batch.items) if i.task == "P"]
    assert rec["rewards/P/std"] == pytest.approx(torch.tensor(rewards).std().item())


def test_kl_is_taken_against_the_frozen_starting_model():
    """The KL term's reference is the model GRPO started from, frozen: a "reference" that followed the
    policy (KL toward the last step, a pitfall of DESIGN.md) passed every test here. At step 2 (one
    minibatch, one pass: scored before its update, at the sampler's log-probs) the logged KL is k3's mean
    over the mask against a copy of the starting model, computed here from the formula."""
    trainer = make({"loss": grpo.GRPOConfig(beta=0.04, mask_truncated_completions=False), "steps": 2, "mu": 1,
                    "minibatch_size": 16, "lr": 3e-2})
    start = copy.deepcopy(trainer.model)
    trainer.train_step()
    rec = trainer.train_step()
    b = trainer.last_batch
    with torch.no_grad():
        log_r = sequence_logprobs(start, b.prompt_ids, b.tokens) - b.old_logprobs
    k3 = log_r.exp() - log_r - 1  # Schulman's k3 estimator of KL(pi_theta || pi_ref)
    assert rec["kl"] > 1e-4 and rec["kl"] == pytest.approx(k3[b.mask.bool()].mean().item(), rel=1e-3)
    assert all(torch.equal(p, q) for p, q in zip(trainer.ref.parameters(), start.parameters()))
    assert not all(torch.equal(p, q) for p, q in zip(trainer.model.parameters(), start.parameters()))


def test_nonfinite_loss_skipped_counted_and_stops_after_k(monkeypatch):
    real = grpo.grpo_loss

    def nan_loss(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        return loss * float("nan"), metrics

    monkeypatch.setattr(grpo, "grpo_loss", nan_loss)
    trainer = make({"max_nonfinite_in_a_row": 2, "steps": 3, "minibatch_size": 16})
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(FloatingPointError, match="non-finite losses/gradient norms in a row"):
        trainer.train()
    assert trainer.skipped_updates >= 2
    assert all(torch.equal(a, p) for a, p in zip(before, trainer.model.parameters()))


def test_dynamic_sampling_under_gdpo_ties_a_group_on_every_reward_function_not_their_sum():
    """GDPO (normalize_then_sum) normalises each reward function within its group: a group whose weighted
    sums tie (1 x 1 + 2 x 0 = 1 x 0 + 2 x 0.5) still has advantages of +-0.39, and dynamic sampling dropped it;
    a group tied in every function has none. The sum decides under sum_then_normalize, as before."""
    table = torch.tensor([[1.0, 0.0], [0.0, 0.5], [1.0, 1.0], [1.0, 1.0], [0.0, 1.0], [2.0, 0.5]])
    weights = [1.0, 2.0]
    batch = rollout_batch(table, 2, weights)
    adv = grpo.group_advantages(table, 2, reward_weights=weights, multi_objective_aggregation="normalize_then_sum")[0]
    assert adv[0].abs() > 0.3 and adv[2] == adv[3] == 0  # q0 has a signal under GDPO, q1 none
    kept = lambda per_function: sorted({i.prompt for i in train_grpo._varied_groups(batch, 2, per_function).items})  # noqa: E731
    assert kept(True) == ["q0", "q2"] and kept(False) == ["q2"]  # q2's sums differ (2 vs 3); q0's tie at 1
    # a function of weight 0 adds nothing to GDPO's advantage: a group varied in it alone has none, and was kept
    # (the graded reward's P/valid has weight 0)
    table = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0], [1.0, 1.0]])  # q0 varies in the first function only
    for weights, want in (([0.0, 1.0], []), ([1.0, 0.0], ["q0"])):
        adv = grpo.group_advantages(table, 2, reward_weights=weights, multi_objective_aggregation="normalize_then_sum")[0]
        assert bool(adv[:2].abs().max() > 0) == bool(want)
        assert sorted({i.prompt for i in train_grpo._varied_groups(rollout_batch(table, 2, weights), 2, True, weights).items}) == want


def test_dynamic_sampling_drops_tied_groups():
    calls = {"n": 0}

    def reward(item, text):
        calls["n"] += 1
        return 1.0 if item.task == "P" else float(len(text) % 2)  # P groups always tie

    trainer = make({"dynamic_sampling": True, "max_refill_rounds": 2}, reward=reward)
    rec = trainer.train_step()
    assert rec["frac_reward_zero_std"] > 0
    assert all(i.task == "A" for i in trainer.last_batch.items)


@pytest.mark.parametrize("field,value", [("group_size", 1), ("task_weights", {"P": -1.0}), ("scale_rewards", "z"),
                                         ("mu", 0), ("temperature", 0.0), ("lr", float("inf")),
                                         ("weight_decay", float("nan")), ("grad_clip", float("nan")),
                                         ("min_lr_ratio", float("nan")), ("top_p", 0.0), ("lr", "1e-5"),
                                         ("device", "cdua"), ("out_dir", 5), ("warmup_steps", 10**6)])
def test_config_validation_names_field(field, value):
    with pytest.raises(ValueError, match=field):
        GRPOTrainConfig(**{field: value})


def test_cli_refuses_non_finite_settings_in_one_line(tmp_path, capsys):

    for flag in ("--lr", "--weight-decay", "--grad-clip"):
        code = main(["grpo", "--init-from", str(tmp_path / "none"), "--out", str(tmp_path / "o"), flag, "nan",
                     "--layout", "compact"])
        err = capsys.readouterr().err
        assert code == 1 and "must be a finite number" in err and "Traceback" not in err, err


def test_kill_and_resume_gives_identical_parameters(tmp_path):
    cfg = {"steps": 3, "prompts_per_step": 2, "max_new_tokens": 5, "minibatch_size": 4, "mu": 2,
           "loss": grpo.GRPOConfig(beta=0.04)}
    straight = make({**cfg, "out_dir": str(tmp_path / "a")})
    straight.train()
    first = make({**cfg, "out_dir": str(tmp_path / "b")})
    first.train(until=1)  # checkpoint written where it stops, as after a kill
    del first
    resumed = make({**cfg, "out_dir": str(tmp_path / "b")})
    assert resumed.step == 1 and resumed.resumed_from is not None
    resumed.train()
    for (name, a), b in zip(straight.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(a, b), name
    lines = (tmp_path / "b" / "grpo_metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3  # one record per step, none repeated after the resume


def nan_first_loss(monkeypatch):
    """The first grpo_loss call of the test returns NaN; the others are untouched."""
    real, calls = grpo.grpo_loss, {"n": 0}

    def first_nan(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        calls["n"] += 1
        return (loss * float("nan") if calls["n"] == 1 else loss), metrics

    monkeypatch.setattr(grpo, "grpo_loss", first_nan)


def test_the_non_finite_count_survives_a_resume(monkeypatch, tmp_path):
    nan_first_loss(monkeypatch)
    cfg = {"steps": 3, "minibatch_size": 16, "out_dir": str(tmp_path)}
    assert make(cfg).train(until=2)[0]["nonfinite/total"] == 1
    resumed = make(cfg)
    assert resumed.step == 2 and resumed.train()[-1]["nonfinite/total"] == 1  # not back to 0


def test_completions_are_written_at_step_1_and_every_interval(tmp_path):
    make({"steps": 3, "minibatch_size": 16, "out_dir": str(tmp_path), "completions_interval": 2}).train()
    rows = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert sorted({r["step"] for r in rows}) == [1, 2] and len(rows) == 2 * 4 * 4  # steps 1 and 2: 4 prompts x 4
    for step in (1, 2):  # each prompt's group of 4 in turn, one prompt per group
        group = [r for r in rows if r["step"] == step]
        assert [r["group"] for r in group] == [i // 4 for i in range(16)]
        assert all(len({r["prompt"] for r in group[4 * g:4 * g + 4]}) == 1 for g in range(4))


def test_each_rollout_chunk_samples_with_its_own_seed():
    # two chunks of the same prompt: the same seed would draw the same completions in both
    torch.manual_seed(0)
    cfg = GRPOTrainConfig(steps=1, prompts_per_step=2, group_size=4, max_new_tokens=8, rollout_chunks=2,
                          minibatch_size=8, loss=grpo.GRPOConfig(beta=0.0), seed=1, progress=False)
    trainer = GRPOTrainer(GPT(GPTConfig.preset("tiny", block_size=64)), [PromptItem("P", "P: one prompt")] * 2, cfg,
                          reward_funcs=item_reward(toy_reward))
    trainer.train_step()
    texts = trainer.last_batch.completions
    assert len(texts) == 8 and texts[:4] != texts[4:]


def test_the_on_policy_deviation_reads_both_sides_of_one():
    assert train_grpo.onpolicy_deviation([{"ratio/min": 0.9, "ratio/max": 1.0}]) == pytest.approx(0.1)
    assert train_grpo.onpolicy_deviation([{"ratio/min": 1.0, "ratio/max": 1.02}, None,
                                          {"ratio/min": 0.99, "ratio/max": 1.0}]) == pytest.approx(0.02)
    assert math.isnan(train_grpo.onpolicy_deviation([None, {"ratio/min": float("nan"), "ratio/max": float("nan")}]))


def test_export_writes_hugging_face_format(tmp_path):
    trainer = make({"out_dir": str(tmp_path)})
    trainer.train()
    out = trainer.export()
    assert (out / "config.json").exists() and (out / "model.safetensors").exists()
    reloaded = GPT.from_pretrained(out)
    for a, b in zip(trainer.model.parameters(), reloaded.parameters()):
        assert torch.equal(a, b)


def test_single_nan_is_skipped_counted_and_run_goes_on(monkeypatch):
    nan_first_loss(monkeypatch)
    trainer = make({"steps": 2, "minibatch_size": 16})
    history = trainer.train()
    assert trainer.skipped_updates == 1 and len(history) == 2
    assert history[0]["nonfinite/total"] == 1 and history[1]["grad_norm"] > 0


def test_close_drops_the_wrapper_and_a_closed_multiprocess_trainer_refuses_to_train():
    trainer = make()
    sentinel = object()
    trainer.ddp = sentinel  # stands in for the DDP wrapper of a multi-process run
    assert trainer.policy is sentinel
    trainer.close()
    trainer.close()  # idempotent
    assert trainer.policy is trainer.model and trainer.closed
    assert len(trainer.train()) == 1  # one process: nothing to average, training goes on
    trainer.dist = type(trainer.dist)(rank=0, world_size=2, local_rank=0)
    with pytest.raises(RuntimeError, match="closed"):
        trainer.train()


def test_resume_refuses_another_run_naming_what_differs(tmp_path):
    from rookworld_lib.core import checkpoint as ck

    out = str(tmp_path / "run")
    cfg = {"steps": 1, "prompts_per_step": 2, "max_new_tokens": 4, "minibatch_size": 8, "out_dir": out}
    make(cfg).train()
    assert make({**cfg, "steps": 2}).resumed_from is not None  # a longer run of the same settings resumes
    assert make({**cfg, "steps": 2}, reward_weights=[1.0]).resumed_from is not None
    # the reward is the functions' weighted sum: another weight is another objective
    with pytest.raises(ValueError, match=r"other settings \(reward_funcs: 'toy_reward x1' -> 'toy_reward x0\.5'\)"):
        make({**cfg, "steps": 2}, reward_weights=[0.5])
    # the attention kernel is a speed choice a resume may change (and checkpoints from before the field lack it)
    assert make({**cfg, "steps": 2, "cudnn_attention": False}).resumed_from is not None
    # settings compared as they resolve: "auto" is "full" for a model that marks no task vocabulary, and
    # dtype "auto" is fp32 on a CPU (both were refused as other settings); fp32 against bf16 is another run
    assert make({**cfg, "steps": 2, "vocab": "full", "dtype": "fp32"}).resumed_from is not None
    with pytest.raises(ValueError, match=r"other settings \(dtype: 'fp32' -> 'bf16'\)"):
        make({**cfg, "dtype": "bf16"})
    assert set(RESUME_MAY_CHANGE) <= {f.name for f in dataclasses.fields(GRPOTrainConfig)}
    for change, name in (({"lr": 1e-4}, "lr"), ({"group_size": 2}, "group_size"), ({"seed": 2}, "seed"),
                         ({"task_weights": {"P": 0.75, "A": 0.25}}, r"task_weights: \{'P': 0\.5, 'A': 0\.5\} -> \{'P'"),
                         ({"task_weights": {"A": 0.5, "P": 0.5}}, r"task_weights: \{'P': 0\.5, 'A': 0\.5\} -> \{'A'"),
                         ({"loss": grpo.GRPOConfig(beta=0.0, loss_type="dr_grpo", max_completion_length=4)}, r"loss\.loss_type")):  # only that: the budget is the trainer's either way
        with pytest.raises(ValueError, match=rf"other settings \({name}: "):
            make({**cfg, **change})
    torch.manual_seed(0)
    other_prompts = [PromptItem("P", "P: another prompt"), PromptItem("A", "A: another+e2e4+")]
    with pytest.raises(ValueError, match=r"other settings \(prompts: "):
        GRPOTrainer(GPT(GPTConfig.preset("tiny", block_size=64)), other_prompts,
                    GRPOTrainConfig(**{**cfg, "group_size": 4, "lr": 3e-3, "seed": 1, "progress": False,
                                       "loss": grpo.GRPOConfig(beta=0.0), "task_weights": {"P": 0.5, "A": 0.5}}),
                    reward_funcs=item_reward(toy_reward))
    # the same prompts labelled anew (deeper evals, say): another reward for the same completions; it resumed
    relabelled = [PromptItem(i.task, i.prompt, {"evals": ["0.5"]}) for i in toy_items()]
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=r"other settings \(ground truth: \"the checkpoint's labels of these prompts\" -> 'other labels'\)"):
        GRPOTrainer(GPT(GPTConfig.preset("tiny", block_size=64)), relabelled,
                    GRPOTrainConfig(**{**cfg, "group_size": 4, "lr": 3e-3, "seed": 1, "progress": False,
                                       "loss": grpo.GRPOConfig(beta=0.0), "task_weights": {"P": 0.5, "A": 0.5}}),
                    reward_funcs=item_reward(toy_reward))
    # another starting model, handed in as a Python user would: its weights are not the run's (helper-36)
    torch.manual_seed(1)
    with pytest.raises(ValueError, match=r"other settings \(starting model: 'the first or latest weights of the run' -> 'other weights'\)"):
        GRPOTrainer(GPT(GPTConfig.preset("tiny", block_size=64)), toy_items(),
                    GRPOTrainConfig(**{**cfg, "group_size": 4, "lr": 3e-3, "seed": 1, "progress": False,
                                       "loss": grpo.GRPOConfig(beta=0.0), "task_weights": {"P": 0.5, "A": 0.5}}),
                    reward_funcs=item_reward(toy_reward))
    # a checkpoint of another kind (here: relabelled as SFT) is refused by kind
    path = ck.latest_checkpoint(tmp_path / "run" / "checkpoints")
    state = ck.load_checkpoint(path)
    ck.save_checkpoint(tmp_path / "run" / "checkpoints", {**state, "kind": "sft", "step": state["step"] + 1})
    with pytest.raises(ValueError, match="not a GRPO one"):
        make(cfg)


def test_resume_refuses_another_init_model(tmp_path):
    cfg = GRPOTrainConfig(steps=1, prompts_per_step=2, group_size=4, max_new_tokens=4, minibatch_size=8,
                          loss=grpo.GRPOConfig(beta=0.0), seed=1, progress=False, out_dir=str(tmp_path / "run"))
    model = GPT(GPTConfig.preset("tiny", block_size=64))
    GRPOTrainer(model, toy_items(), cfg, reward_funcs=item_reward(toy_reward), init_from=str(tmp_path / "a")).train()
    with pytest.raises(ValueError, match=r"other settings \(init_from: "):
        GRPOTrainer(model, toy_items(), cfg, reward_funcs=item_reward(toy_reward), init_from=str(tmp_path / "b"))
    assert GRPOTrainer(model, toy_items(), cfg, reward_funcs=item_reward(toy_reward), init_from=str(tmp_path / "a")).resumed_from


def test_grpo_refuses_a_run_dir_another_run_is_writing(tmp_path):
    from rookworld_lib.core.paths import RunDirBusyError, run_lock

    trainer = make({"out_dir": str(tmp_path), "prompts_per_step": 2, "max_new_tokens": 4, "minibatch_size": 8})
    with run_lock(tmp_path), pytest.raises(RunDirBusyError, match="being written by another run"):
        trainer.train()
    assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "grpo_metrics.jsonl").exists()
    trainer.train()  # the lock is gone with its holder
    assert (tmp_path / "grpo_metrics.jsonl").exists()


def test_under_torchrun_every_rank_says_rank_0s_busy_error_and_none_reads_the_checkpoints(tmp_path, monkeypatch):
    """Rank 0 alone holds out_dir's lock. A job started twice: the second job's rank 1 compared checkpoints the
    first job was still writing, and said "another run saved step_N" or "out_dir must be on a filesystem that
    every node shares" (false, one machine), beside or instead of the busy line. Every rank now raises rank
    0's RunDirBusyError, before reading a checkpoint (construction) and before training (train)."""
    import os
    import re

    from rookworld_lib.core import distributed
    from rookworld_lib.core.distributed import DistInfo
    from rookworld_lib.core.paths import RunDirBusyError, busy_message, run_lock

    settings = {"out_dir": str(tmp_path), "prompts_per_step": 2, "max_new_tokens": 4, "minibatch_size": 8, "steps": 1}
    make(settings).train()
    again = make({**settings, "steps": 2})
    rank_0_says = []  # what rank 0 broadcasts; this process plays rank 1
    monkeypatch.setattr(distributed, "broadcast_object", lambda obj, src=0: rank_0_says[-1])
    with run_lock(tmp_path):
        rank_0_says.append(busy_message(tmp_path))
        assert "being written by another run" in rank_0_says[-1]
        # the holder named once, as the lock file says it now (not also the run that held it before)
        assert re.search(rf"\(pid {os.getpid()} since [-0-9: ]+\)", rank_0_says[-1]) and rank_0_says[-1].count("pid") == 1
        again.dist = DistInfo(rank=1, world_size=2)
        monkeypatch.setattr(again, "_check_checkpoint_is_ours", lambda: pytest.fail("rank 1 went on to the checkpoints"))
        with pytest.raises(RunDirBusyError, match="being written by another run"):
            again.train()
        with pytest.raises(RunDirBusyError, match="being written by another run"):
            again.find_checkpoint()
    assert busy_message(tmp_path) is None and busy_message(tmp_path / "nowhere") is None  # the holder is gone
    assert not (tmp_path / "nowhere").exists()  # asking made no folder (a rank that only checks writes nothing)


def test_a_run_refused_as_busy_does_not_say_it_resumed(tmp_path, caplog):
    import logging

    from rookworld_lib.core.paths import RunDirBusyError, run_lock

    settings = {"out_dir": str(tmp_path), "prompts_per_step": 2, "max_new_tokens": 4, "minibatch_size": 8, "steps": 1}
    make(settings).train()
    again = make({**settings, "steps": 2})  # finds the checkpoint of step 1
    with caplog.at_level(logging.INFO), run_lock(tmp_path), pytest.raises(RunDirBusyError):
        again.train()
    assert "resumed from" not in caplog.text
    with caplog.at_level(logging.INFO):
        again.train()
    assert "GRPO resumed from" in caplog.text and "at step 1" in caplog.text


def test_a_completions_ratio_and_clip_fraction_count_its_own_tokens_only():
    # by hand, clip range [0.8, 1.2]; padding tokens (ratio 3) must not count. Row 1: loss tokens at ratios
    # 1.5, 1, 1: mean 3.5 / 3, a third outside. Row 2: 1.5, 1: mean 1.25, half outside. GSPO's sequence
    # ratio, the same for every token of a row: 1.5 ** (1/3) = 1.145 (inside) and 1.5 ** (1/2) = 1.225 (outside).
    # Row 3, below the range: 0.5, 1: mean 0.75, half outside; its sequence ratio 0.5 ** (1/2) = 0.707 (outside)
    lp = torch.tensor([[math.log(1.5), 0.0, 0.0, math.log(3.0)], [math.log(1.5), 0.0, math.log(3.0), math.log(3.0)],
                       [math.log(0.5), 0.0, math.log(3.0), math.log(3.0)]])
    old = torch.zeros(3, 4)
    m = torch.tensor([[True, True, True, False], [True, True, False, False], [True, True, False, False]])
    stats = train_grpo._row_ratio_stats(lp, old, m, grpo.GRPOConfig())
    assert stats.T.tolist() == [pytest.approx([3.5 / 3, 1 / 3]), pytest.approx([1.25, 0.5]), pytest.approx([0.75, 0.5])]
    seq = train_grpo._row_ratio_stats(lp, old, m, grpo.GRPOConfig(importance_sampling_level="sequence"))
    assert seq.T.tolist() == [pytest.approx([1.5 ** (1 / 3), 0.0]), pytest.approx([1.5 ** 0.5, 1.0]),
                              pytest.approx([0.5 ** 0.5, 1.0])]
    # clip-higher, range [0.8, 1.28]: ratio 1.25 is inside, 0.78 outside (row stats [1.125, 0], [0.89, 0.5])
    lp = torch.tensor([[math.log(1.25), 0.0], [math.log(0.78), 0.0]])
    stats = train_grpo._row_ratio_stats(lp, torch.zeros(2, 2), torch.ones(2, 2, dtype=torch.bool),
                                        grpo.GRPOConfig(clip_eps_low=0.2, clip_eps_high=0.28))
    assert stats.T.tolist() == [pytest.approx([1.125, 0.0]), pytest.approx([0.89, 0.5])]


def test_dapo_with_truncated_rows_masked_divides_by_the_kept_tokens_only():
    # a tiny model that ends some completions (its EOT logit raised) and runs others to the budget
    trainer = make({"max_new_tokens": 3, "loss": grpo.GRPOConfig(beta=0.0, loss_type="dapo",
                                                                 mask_truncated_completions=True)})
    with torch.no_grad():
        trainer.model.transformer.ln_f.bias[0] = 3.0
        trainer.model.transformer.wte.weight[EOT_ID] = 0.0
        trainer.model.transformer.wte.weight[EOT_ID, 0] = 3.0
    rec = trainer.train_step()
    b, adv = trainer.last_batch, trainer.last_advantages
    kept = b.mask.sum(1) * ~b.truncated  # DAPO: a truncated row leaves the loss, its tokens the count
    assert b.truncated.any() and (~b.truncated).any() and (adv[~b.truncated] != 0).any()
    # one on-policy minibatch (ratio 1): the loss is -sum_i A_i n_i / sum_i n_i over the kept rows
    assert rec["loss"] == pytest.approx(float(-(adv * kept).sum() / kept.sum()), abs=1e-5)
    ended = (b.tokens.masked_fill(~b.mask, -1) == EOT_ID).any(1)  # the share of completions that never ended
    assert torch.equal(~ended, b.truncated) and rec["completions/clipped_ratio"] == pytest.approx(float((~ended).float().mean()))


def test_num_tokens_counts_prompt_and_completion_tokens_as_trl_does():
    trainer = make()
    rec = trainer.train_step()
    b = trainer.last_batch
    prompts = sum(1 + len(encode(i.prompt)) for i in b.items)  # <|endoftext|> + the prompt, per row
    assert rec["num_tokens"] == prompts + int(b.mask.sum()) and prompts == sum(map(len, b.prompt_ids))


def test_each_dynamic_sampling_round_draws_with_its_own_seed():
    trainer = make({"dynamic_sampling": True, "max_refill_rounds": 3}, reward=lambda item, text: 1.0)
    seeds, collect = [], trainer.collect  # every group ties, so all three refills run
    trainer.collect = lambda items, seed, timings: (seeds.append(seed), collect(items, seed, timings))[1]
    trainer.train_step()
    assert len(seeds) == 4 and len(set(seeds)) == 4, seeds
    # and none is another step's: step 0's first refill drew what step 7919's rollout did (a linear offset)
    main = {trainer.cfg.seed * 1_000_003 + step for step in range(10**5)}
    assert not main & set(seeds[1:]) and all(0 <= s < 2**63 for s in seeds)


def test_the_learning_rate_follows_the_cosine_from_lr_at_the_first_step_to_the_floor_at_the_last():
    """Without warm-up, step 1 trains at lr, the middle step of three halfway down the cosine, and the last at
    lr * min_lr_ratio (the option's help: the floor is reached at the last step): 1e-3, 5.5e-4, 1e-4 by hand."""
    records = make({"steps": 3, "lr": 1e-3, "min_lr_ratio": 0.1, "prompts_per_step": 2, "group_size": 2,
                    "max_new_tokens": 2, "minibatch_size": 4}).train()
    assert [r["learning_rate"] for r in records] == [pytest.approx(v, rel=1e-9) for v in (1e-3, 5.5e-4, 1e-4)]


def test_each_step_takes_its_minibatches_in_its_own_order():
    """The minibatch order is seeded from (seed, step) (the module's docstring): each step's passes cover
    every row once, and two steps do not visit the rows in the same order."""
    trainer = make({"steps": 2, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 2, "minibatch_size": 2})
    calls = record_rows(trainer)
    trainer.train()
    orders = [[r for s, rows in calls if s == step for r in rows] for step in (0, 1)]
    assert all(sorted(o) == list(range(4)) for o in orders) and orders[0] != orders[1]


def test_rollout_chunks_must_be_between_one_and_the_prompts_of_a_step():
    """A step's prompts are sampled in rollout_chunks chunks: 0 chunks, or more chunks than prompts (an
    empty chunk), is refused naming the field and the value; 1 and prompts_per_step are the bounds."""
    for chunks in (0, 5, -1):
        with pytest.raises(ValueError) as info:
            GRPOTrainConfig(prompts_per_step=4, rollout_chunks=chunks)
        assert str(info.value) == f"GRPOTrainConfig.rollout_chunks must be in 1..prompts_per_step, got {chunks}"
    assert [GRPOTrainConfig(prompts_per_step=4, rollout_chunks=c).rollout_chunks for c in (1, 4)] == [1, 4]


def test_a_warm_up_as_long_as_the_run_is_allowed_and_a_longer_one_refused():
    """warmup_steps may equal steps (the run ends at the peak, as cosine_lr documents) but not exceed it."""
    assert GRPOTrainConfig(steps=3, warmup_steps=3).warmup_steps == 3
    with pytest.raises(ValueError, match=r"warmup_steps.*must be <= steps \(3\)"):
        GRPOTrainConfig(steps=3, warmup_steps=4)


def test_settings_that_cannot_be_split_over_the_processes_are_refused_naming_the_field():
    """Under torchrun a minibatch and a step's completions are split evenly over the ranks, and dynamic
    sampling's batches would differ in size: each is refused up front; one process takes any of them."""
    for kw, message in ((dict(minibatch_size=3), r"minibatch_size must be a multiple of the number of processes \(2\), got 3"),
                        (dict(prompts_per_step=3, group_size=3, minibatch_size=2, rollout_chunks=1),
                         r"prompts_per_step times group_size must be a multiple .* got 3 x 3 = 9"),
                        (dict(dynamic_sampling=True), r"dynamic_sampling is not supported with more than one process")):
        cfg = GRPOTrainConfig(**kw)
        with pytest.raises(ValueError, match=rf"^GRPOTrainConfig\.{message}"):
            train_grpo.check_world_size(cfg, 2)
        train_grpo.check_world_size(cfg, 1)
    train_grpo.check_world_size(GRPOTrainConfig(minibatch_size=4, prompts_per_step=2, group_size=2), 2)


def _alternate(prompts, completions, **_):
    """Rewards 0, 1 within each group of 2 rows (the trainer scores a chunk's rows group by group): no
    group is ever tied, whatever the completions."""
    return [float(i % 2) for i in range(len(completions))]


def test_dynamic_sampling_keeps_a_batch_without_ties_whole_and_refills_nothing():
    """No group tied: dynamic sampling drops nothing, samples no refill round (refill_rounds 0, one
    collect) and trains on the batch as drawn; every group tied: all max_refill_rounds rounds are
    sampled, none helps, and the step keeps its first batch (each group's rewards equal: advantages 0)."""
    for reward, rounds, zero_std in ((_alternate, 0, 0.0), (item_reward(lambda item, text: 1.0), 2, 1.0)):
        torch.manual_seed(0)
        cfg = GRPOTrainConfig(steps=1, prompts_per_step=2, group_size=2, max_new_tokens=3, minibatch_size=4,
                              loss=grpo.GRPOConfig(beta=0.0), seed=1, progress=False, dynamic_sampling=True,
                              max_refill_rounds=2)
        trainer = GRPOTrainer(GPT(GPTConfig.preset("tiny", n_layer=1, block_size=32)), toy_items(), cfg,
                              reward_funcs=reward)
        batches, collect = [], trainer.collect
        trainer.collect = lambda items, seed, timings: (batches.append(collect(items, seed, timings)), batches[-1])[1]
        rec = trainer.train_step()
        assert rec["dynamic_sampling/refill_rounds"] == rounds and len(batches) == 1 + rounds, rec
        assert rec["frac_reward_zero_std"] == zero_std
        first, b = batches[0], trainer.last_batch
        assert len(b.items) == 4 and b.items == first.items and b.completions == first.completions
        assert torch.equal(b.tokens, first.tokens) and torch.equal(b.rewards, first.rewards)
        assert b.rewards.tolist() == ([0.0, 1.0, 0.0, 1.0] if rounds == 0 else [1.0] * 4)
        # TRL's group scaling, (r - mean) / sample std: rewards 0, 1 -> -/+0.5 / sqrt(0.5); a tie -> 0
        half = 0.5 ** 0.5
        assert trainer.last_advantages.tolist() == pytest.approx([-half, half, -half, half] if rounds == 0 else [0.0] * 4,
                                                                 abs=1e-3)


def test_resume_refuses_another_sampling_vocabulary_naming_both(tmp_path):
    """A run over an opted-in task vocabulary (vocab="task", task_vocab=) cannot be continued over all of
    GPT-2 (vocab="full"): the refusal names the vocabularies, the run's as its count of task tokens
    (the ones given, every prompt token and EOT, counted here from GPT-2's ids) and this one's as all."""
    from rookworld_lib.core.task_vocab import TaskVocab
    from rookworld_lib.core.tokenizer import get_tokenizer

    items = [PromptItem("P", f"Q: {i} A:") for i in range(4)]
    given = {t for s in ("yes no maybe",) for t in get_tokenizer().encode(s)}
    ids = given | {t for i in items for t in encode(i.prompt)} | {EOT_ID}
    cfg = GRPOTrainConfig(steps=1, prompts_per_step=2, group_size=2, max_new_tokens=3, minibatch_size=4,
                          loss=grpo.GRPOConfig(beta=0.0), vocab="task", progress=False, report_to="none",
                          export_hf=False, out_dir=str(tmp_path))
    reward = item_reward(toy_reward)
    torch.manual_seed(0)
    GRPOTrainer(GPT(GPTConfig.preset("tiny", n_layer=1, block_size=32)), items, cfg, reward_funcs=reward,
                task_vocab=TaskVocab(given)).train()
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=rf"other settings \(vocab: '{len(ids)} task tokens' -> 'all tokens'"):
        GRPOTrainer(GPT(GPTConfig.preset("tiny", n_layer=1, block_size=32)), items,
                    dataclasses.replace(cfg, vocab="full"), reward_funcs=reward)


def test_a_trl_users_inputs_are_refused_in_one_line_each_and_tensors_weigh_as_numbers(tmp_path):
    """What a TRL script hands its trainer (a transformers model, a hub id, reward_funcs=None, a scalar weight,
    one PromptItem) gave tracebacks from deep inside; a reward function named like a task was renamed, and
    rewards/<task>/mean then logged the task's total under the function's TRL name; an inf or a value past
    float32 (of either sign: None or NaN is the only unscorable) was refused without naming the function; 0-d tensor weights were "not finite numbers"."""
    transformers = pytest.importorskip("transformers")
    kw = dict(steps=1, prompts_per_step=2, group_size=2, max_new_tokens=4, minibatch_size=4, progress=False,
              loss=grpo.GRPOConfig(beta=0.0), task_weights=None)
    model, cfg, f = GPT(GPTConfig.preset("tiny", block_size=64)), GRPOTrainConfig(**kw), item_reward(toy_reward)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_head=2, n_embd=8))
    for bad, match in ((dict(model=hf), r"model must be a rookworld GPT, got GPT2LMHeadModel: load .* GPT\.from_pretrained"),
                       (dict(model="gpt2"), r"model must be a rookworld GPT, got str 'gpt2'"),
                       (dict(reward_funcs=None), r"reward_funcs must be a function .* got NoneType None"),
                       (dict(reward_weights=2.0), r"reward_weights must be a list of one number per reward function, got float 2\.0"),
                       (dict(items=toy_items()[0]), r"items must be a list of PromptItem, got one PromptItem")):
        args = {"model": model, "items": toy_items(), "cfg": cfg, "reward_funcs": f, **bad}
        with pytest.raises(ValueError, match=match):
            GRPOTrainer(**args)
    with pytest.raises(ValueError, match="PromptItem.task must be a non-empty name without a trailing colon"):
        PromptItem("math:", "2+2")

    def accuracy(prompts, completions, **_):
        return [0.0] * len(completions)

    with pytest.raises(ValueError, match=r"reward function 'accuracy' has the name of a task: rewards/accuracy/mean"):
        GRPOTrainer(model, [PromptItem("accuracy", f"Q {i}") for i in range(4)], cfg, reward_funcs=[accuracy, f])
    weighted = GRPOTrainer(model, toy_items(), cfg, reward_funcs=[f, f], reward_weights=torch.tensor([1.0, 0.5]))
    assert weighted.reward_weights == [1.0, 0.5]
    for value, shown in ((float("inf"), "inf"), (1e39, r"1e\+39"), (float("-inf"), "-inf"), (-1e39, r"-1e\+39")):
        def huge(prompts, completions, value=value, **_):
            return [value] + [0.0] * (len(completions) - 1)

        with pytest.raises(ValueError, match=rf"^reward function 'huge' gave {shown} for completion 0: each value must be finite in float32"):
            GRPOTrainer(model, toy_items(), cfg, reward_funcs=huge).train()


def test_truth_that_is_no_json_is_not_compared_on_resume_and_json_truth_is(tmp_path):
    """A verifier object or a set in PromptItem.truth: its text holds a memory address or a hash-seed order,
    so every resume was refused as "other labels"; such truth is not compared (JSON truth still is)."""

    class Checker:
        def __init__(self, want):
            self.want = want

    cfg = {"steps": 1, "prompts_per_step": 2, "max_new_tokens": 4, "minibatch_size": 8, "out_dir": str(tmp_path / "o"),
           "group_size": 4, "lr": 3e-3, "seed": 1, "progress": False, "loss": grpo.GRPOConfig(beta=0.0),
           "task_weights": {"P": 0.5, "A": 0.5}}

    def items(truth):
        return [PromptItem(i.task, i.prompt, truth()) for i in toy_items()]

    torch.manual_seed(0)
    GRPOTrainer(GPT(GPTConfig.preset("tiny", block_size=64)), items(lambda: {"check": Checker("a")}),
                GRPOTrainConfig(**cfg), reward_funcs=item_reward(toy_reward)).train()
    torch.manual_seed(0)
    resumed = GRPOTrainer(GPT(GPTConfig.preset("tiny", block_size=64)), items(lambda: {"check": Checker("a")}),
                          GRPOTrainConfig(**{**cfg, "steps": 2}), reward_funcs=item_reward(toy_reward))
    assert resumed.resumed_from is not None and resumed.prompts.truth_fingerprint is None


def test_reward_functions_get_trls_trainer_state_and_those_needing_what_is_not_passed_are_refused_up_front():
    """TRL passes trainer_state (a curriculum reads its global_step), log_metric and log_extra, and gathers
    async functions: trainer_state is passed here; a function that requires the other two, or is async,
    failed after the first rollout (TypeError, "gave coroutine"): it is refused when the trainer is built."""
    seen = []

    def curriculum(prompts, completions, trainer_state, **_):
        seen.append((trainer_state.global_step, trainer_state.max_steps))
        return [float(trainer_state.global_step >= 1)] * len(completions)

    cfg = GRPOTrainConfig(steps=2, prompts_per_step=2, group_size=2, max_new_tokens=4, minibatch_size=4, progress=False,
                          loss=grpo.GRPOConfig(beta=0.0), task_weights=None)
    model = GPT(GPTConfig.preset("tiny", block_size=64))
    GRPOTrainer(model, toy_items(), cfg, reward_funcs=curriculum).train()
    assert seen == [(0, 2), (1, 2)]

    def logs(prompts, completions, log_metric, **_):
        return [0.0] * len(completions)

    async def slow(prompts, completions, **_):
        return [0.0] * len(completions)

    class Judge:
        async def __call__(self, prompts, completions, **_):
            return [0.0] * len(completions)

    def narrow(prompts, completions):  # no **kwargs: "unexpected keyword argument 'task'" after the first rollout
        return [0.0] * len(completions)

    def every_column(prompts, completions, task, truth, completion_ids, trainer_state):  # all named: it is called
        return [0.0] * len(completions)

    for f, match in ((logs, r"reward function 'logs' needs log_metric, which TRL passes and this trainer does not"),
                     (slow, r"reward function 'slow' is async"), (Judge(), r"reward function 'Judge' is async"),
                     (narrow, r"reward function 'narrow' takes no task, truth, completion_ids, trainer_state: it is "
                              r"called as TRL calls one, .*; end its parameters with \*\*kwargs")):
        with pytest.raises(ValueError, match=match):
            GRPOTrainer(model, toy_items(), cfg, reward_funcs=[curriculum, f])
    GRPOTrainer(model, toy_items(), cfg, reward_funcs=[curriculum, every_column])


def test_a_model_it_cannot_train_and_items_that_are_no_list_are_refused_when_the_trainer_is_built(tmp_path):
    """A half-precision model ran a whole rollout, wrote grpo_metrics.jsonl, then stopped in torch's "Expected
    out tensor to have dtype c10::Half"; a frozen one in "optimizer got an empty parameter list"; items=None
    in "'NoneType' object is not iterable"."""
    cfg = GRPOTrainConfig(steps=1, prompts_per_step=2, group_size=2, max_new_tokens=2, progress=False,
                          out_dir=str(tmp_path / "grpo"), report_to="none")

    def zero(completions, **_):
        return [0.0] * len(completions)

    def tiny():
        return GPT(GPTConfig.preset("tiny", block_size=64))

    for model, items, message in (
            (tiny().half(), toy_items(), r"^model weights are torch.float16: the trainer keeps fp32 weights and runs bf16 "
                                         r"under autocast \(GRPOTrainConfig.dtype='bf16'\); call model.float\(\)$"),
            (tiny().to(torch.bfloat16), toy_items(), r"^model weights are torch.bfloat16: "),
            (tiny().requires_grad_(False), toy_items(), r"^model has no parameter that requires a gradient \(frozen: "),
            (tiny(), None, r"^items must be a list of PromptItem\(task, prompt\), got NoneType None$"),
            (tiny(), 5, r"^items must be a list of PromptItem\(task, prompt\), got int 5$")):
        with pytest.raises(ValueError, match=message):
            GRPOTrainer(model, items, cfg, reward_funcs=zero)
    with pytest.raises(ValueError, match=r"^task_vocab must be a TaskVocab \(TaskVocab\(token ids of the task text\)\), "
                                         r"got list \[1, 2, 3\]$"):  # "'list' object has no attribute 'union'"
        GRPOTrainer(tiny(), toy_items(), cfg, reward_funcs=zero, task_vocab=[1, 2, 3])
    assert not (tmp_path / "grpo").exists()


def test_reward_funcs_that_are_no_ordered_collection_of_functions_are_refused_naming_what_they_got():
    """A set of functions paired its weights in hash order (another pairing each run); a number ended in
    "'int' object is not iterable"."""
    cfg = GRPOTrainConfig(steps=1, prompts_per_step=2, group_size=2, max_new_tokens=2, progress=False)
    model = GPT(GPTConfig.preset("tiny", block_size=64))

    def zero(completions, **_):
        return [0.0] * len(completions)

    for given in ({zero}, 5, frozenset([zero])):
        with pytest.raises(ValueError, match=r"^reward_funcs must be a function f\(prompts, completions, \*\*columns\) "
                                             r"or a list of them \(in the order of reward_weights\), got "):
            GRPOTrainer(model, toy_items(), cfg, reward_funcs=given)
    assert GRPOTrainer(model, toy_items(), cfg, reward_funcs=(zero, zero)).reward_names == ["zero", "zero_2"]


def test_the_logged_advantage_spread_is_the_steps_batch_not_the_mean_of_its_minibatches():
    """With several minibatches (and mu > 1) advantages/std was the mean of each minibatch's population std,
    below the batch's own (0.82 against 0.86 in one run)."""
    trainer = make({"prompts_per_step": 4, "group_size": 4, "minibatch_size": 4, "mu": 2})
    record = trainer.train()[-1]
    adv = trainer.last_advantages
    assert adv.std(correction=0).item() > 0  # the check needs a spread
    assert record["advantages/std"] == pytest.approx(adv.std(correction=0).item(), abs=1e-7)
    assert record["advantages/mean"] == pytest.approx(adv.mean().item(), abs=1e-7)


def test_an_unscorable_completion_does_not_make_a_group_varied():
    """Dynamic sampling keeps the groups with a signal. [1, unscorable] has none (group_advantages: 0, 0,
    as TRL's, tested for parity), yet its sum (nansum: 0 for the unscorable one) reads as a spread; each
    kept group is one with a non-zero advantage, the reference. In groups of 3, [1, 0, unscorable] has one
    (+-0.71 for the two scored, by hand) beside it and is kept; [1, 1, unscorable] ties and is dropped."""
    table = torch.tensor([[1.0], [math.nan], [0.0], [1.0], [math.nan], [math.nan]])
    batch = rollout_batch(table, 2)
    adv = grpo.group_advantages(table, 2, reward_weights=[1.0])[0]
    signal = sorted({batch.items[i].prompt for i in range(6) if adv[i] != 0})
    assert signal == ["q1"] and sorted({i.prompt for i in train_grpo._varied_groups(batch, 2).items}) == signal
    table = torch.tensor([[1.0], [0.0], [math.nan], [1.0], [1.0], [math.nan]])
    adv = grpo.group_advantages(table, 3, reward_weights=[1.0])[0]
    assert adv[:2].abs().min() > 0.5 and adv[3:].abs().max() == 0
    assert [i.prompt for i in train_grpo._varied_groups(rollout_batch(table, 3), 3).items] == ["q0"] * 3


def test_batches_of_unequal_width_are_joined_with_padding_outside_the_completion():
    """Joining rollout chunks (or refill rounds) whose completions differ in length pads the shorter ones
    with the end token, log-prob 0 and mask False: padding never enters a completion's tokens."""
    eot = 0
    short = rollout_batch(torch.tensor([[1.0], [0.0]]), 2, width=1)
    long = rollout_batch(torch.tensor([[0.0], [1.0]]), 2, width=3, mask_len=[3, 2])
    joined = train_grpo._concat([short, long], eot)
    assert joined.mask.tolist() == [[True, False, False], [True, False, False],
                                    [True, True, True], [True, True, False]]
    assert joined.tokens.tolist() == [[7, eot, eot], [7, eot, eot], [7, 7, 7], [7, 7, 7]]
    assert joined.old_logprobs.tolist() == [[-0.5, 0.0, 0.0], [-0.5, 0.0, 0.0], [-0.5] * 3, [-0.5] * 3]
    assert joined.rewards.tolist() == [1.0, 0.0, 0.0, 1.0] and joined.generated_tokens == 2 + 6


def test_the_sampling_rate_counts_every_token_sampled_dropped_groups_too(monkeypatch):
    """Under dynamic sampling the rate is every sampled token (dropped groups' and refills' too) over the
    sampling time; it counted the kept completions' tokens only, reading low by the share dropped."""
    counted = []
    real = train_grpo.generate

    def counting(*args, **kwargs):
        rollout = real(*args, **kwargs)
        counted.append(int(rollout.mask.sum()))
        return rollout

    def reward(item, text):
        return 1.0 if item.task == "P" else float(len(text) % 2)  # P groups always tie: dropped

    trainer = make({"dynamic_sampling": True, "max_refill_rounds": 2}, reward=reward)
    monkeypatch.setattr(train_grpo, "generate", counting)
    rec = trainer.train_step()
    kept = rec["completions/mean_length"] * rec["num_completions"]
    assert sum(counted) > kept
    assert rec["throughput/generated_tokens_per_s"] * rec["time/sampling"] == pytest.approx(sum(counted), rel=1e-6)


def test_under_dynamic_sampling_the_reward_is_every_sampled_completions_and_the_kept_groups_have_their_own(monkeypatch):
    """The P: prompts are always solved (1.0: their groups tie and are dropped), the A: ones half the time.
    `reward`, `rewards/<task>/mean` and the completion lengths describe every completion the step sampled,
    refills included, as without dynamic sampling; they described the kept groups only, so a policy that
    solved more prompts logged a lower reward (here 0.5 for 0.75 sampled) and no P: reward at all.
    `dynamic_sampling/kept_reward` is the trained batch's mean; `num_completions` its size."""
    scored, lengths, real = [], [], train_grpo.generate

    def reward(item, text):
        scored.append((item.task, 1.0 if item.task == "P" else float(len(text) % 2)))
        return scored[-1][1]

    def counting(*args, **kwargs):
        rollout = real(*args, **kwargs)
        lengths.extend(rollout.mask.sum(1).tolist())
        return rollout

    monkeypatch.setattr(train_grpo, "generate", counting)
    trainer = make({"dynamic_sampling": True, "max_refill_rounds": 2}, reward=reward)
    rec = trainer.train_step()
    batch = trainer.last_batch
    assert rec["dynamic_sampling/refill_rounds"] >= 1 and len(scored) > len(batch.items)  # groups were dropped
    assert rec["reward"] == pytest.approx(statistics.mean(r for _, r in scored))
    # reward_std beside it, over the same completions (TRL's nanstd of the rewards it averages), and
    # frac_reward_zero_std over every sampled group, refills included: they were the kept batch's and the first round's
    assert rec["reward_std"] == pytest.approx(statistics.stdev(r for _, r in scored))
    G = trainer.cfg.group_size
    groups = [{r for _, r in scored[k:k + G]} for k in range(0, len(scored), G)]
    assert rec["frac_reward_zero_std"] == pytest.approx(sum(len(g) == 1 for g in groups) / len(groups))
    assert rec["rewards/P/mean"] == 1.0 and rec["rewards/A/mean"] == pytest.approx(statistics.mean(r for t, r in scored if t == "A"))
    assert rec["completions/mean_length"] == pytest.approx(statistics.mean(lengths)) and len(lengths) == len(scored)
    assert rec["dynamic_sampling/kept_reward"] == pytest.approx(batch.rewards.mean().item())
    assert rec["dynamic_sampling/kept_reward"] < rec["reward"]
    assert rec["num_completions"] == len(batch.items) and all(i.task == "A" for i in batch.items)
    assert "dynamic_sampling/kept_reward" not in make().train_step()


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_ranks_metrics_merge_to_the_metrics_of_one_call_over_all_rows(level):
    """Under torchrun each rank scores its rows; the merged metrics are those of one grpo_loss call over
    every row. Token means are weighted by tokens: by completions, ranks whose completions differ in
    length (here rank 1's are shorter) logged another kl, ratio and clip share. At sequence level (GSPO)
    the ratio and clip shares are per completion, weighted by completions."""
    torch.manual_seed(0)
    N, T = 4, 6
    lp = torch.randn(N, T) * 0.1 - 1
    old, ref = lp + torch.randn(N, T) * 0.2, lp + torch.randn(N, T) * 0.3
    adv, mask = torch.tensor([1.0, -1.0, 0.5, -0.5]), torch.ones(N, T, dtype=torch.bool)
    mask[2:, 2:] = False
    cfg = grpo.GRPOConfig(beta=0.04, loss_type="dapo", clip_eps_low=0.1, clip_eps_high=0.1,
                          importance_sampling_level=level)
    kw = dict(ref_logprobs=ref, config=cfg, num_items_in_batch=float(mask.sum()), num_completions_in_batch=N)
    whole = grpo.grpo_loss(lp, old, adv, mask, **kw)[1]
    halves = [{k: float(v) for k, v in grpo.grpo_loss(lp[s], old[s], adv[s], mask[s], **{**kw, "ref_logprobs": ref[s]})[1].items()}
              for s in (slice(0, 2), slice(2, 4))]
    merged = train_grpo._merge_ranks(halves, sequence=level == "sequence")
    assert halves[0]["kl"] != pytest.approx(halves[1]["kl"])  # the weighting matters here
    assert halves[0]["ratio/mean"] != pytest.approx(halves[1]["ratio/mean"])
    for key, value in whole.items():
        if key not in ("advantages/mean", "advantages/std"):  # the step's whole batch, set in _step
            assert merged[key] == pytest.approx(float(value), rel=1e-5, abs=1e-7), key


def test_rollout_chunks_that_do_not_divide_the_prompts_sample_every_prompt():
    """3 prompts in 2 chunks: every prompt is sampled, each once (bounds 0, 2, 3); integer division lost the last."""
    trainer = make({"prompts_per_step": 3, "rollout_chunks": 2, "group_size": 2, "minibatch_size": 6})
    drawn = []
    collect = trainer.collect
    trainer.collect = lambda items, seed, timings: (drawn.append(list(items)), collect(items, seed, timings))[1]
    rec = trainer.train_step()
    assert rec["num_completions"] == 6 and trainer.last_batch.items == [i for i in drawn[0] for _ in range(2)]


def test_a_resume_on_the_model_trained_in_place_keeps_the_frozen_reference(tmp_path):
    """GRPO trains its model in place; a trainer built again on that same object in the same process (a
    notebook cell run again) resumes from the checkpoint, which the resume check allows. Its KL reference
    is the checkpoint's frozen starting model, not the trained weights it was handed."""
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", block_size=64))
    start = copy.deepcopy(model.state_dict())
    cfg = GRPOTrainConfig(steps=2, prompts_per_step=2, group_size=4, max_new_tokens=5, lr=3e-2, minibatch_size=8,
                          loss=grpo.GRPOConfig(beta=0.04), seed=1, progress=False, out_dir=str(tmp_path),
                          task_weights={"P": 0.5, "A": 0.5})
    GRPOTrainer(model, toy_items(), cfg, reward_funcs=item_reward(toy_reward)).train(until=1)
    assert not all(torch.equal(v, start[k]) for k, v in model.state_dict().items())  # trained in place
    again = GRPOTrainer(model, toy_items(), cfg, reward_funcs=item_reward(toy_reward))
    assert again.step == 1
    assert all(torch.equal(v, start[k]) for k, v in again.ref.state_dict().items())
