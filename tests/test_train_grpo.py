import pytest
import torch

from rookworld_lib import grpo
from rookworld_lib.model import GPT, GPTConfig
from rookworld_lib.sampling import sequence_logprobs
from rookworld_lib.train_grpo import GRPOTrainConfig, GRPOTrainer, PromptItem, lr_at


def toy_items():
    return [PromptItem("P", f"P: toy prompt {i}") for i in range(6)] + \
           [PromptItem("A", f"A: toy env {i}+e2e4+") for i in range(6)]


def toy_reward(item, text):
    # deterministic and varied within a group: parity of the completion's character count
    return float(len(text) % 2)


def make(cfg_kw=None, reward=toy_reward):
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", block_size=64))
    kw = dict(steps=1, prompts_per_step=4, group_size=4, max_new_tokens=8, lr=3e-3, minibatch_size=16,
              loss=grpo.GRPOConfig(beta=0.0), seed=1)
    kw.update(cfg_kw or {})
    return GRPOTrainer(model, toy_items(), GRPOTrainConfig(**kw), reward_fn=reward)


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
    before = (b.old_logprobs * b.mask).sum(1) / b.mask.sum(1).clamp(min=1)
    after = per_row_logprob(trainer)
    delta = after - before
    assert delta[adv > 0].mean() > 0
    assert delta[adv < 0].mean() < 0
    for key in ("reward_mean", "reward_mean_P", "reward_mean_A", "frac_reward_zero_std", "clip_frac_region",
                "grad_norm", "time_sampling", "time_scoring", "time_update", "frac_truncated", "completion_len_mean"):
        assert key in rec, key


def test_on_policy_first_pass_has_ratio_one():
    trainer = make()
    rec = trainer.train_step()
    assert abs(rec["ratio_mean"] - 1.0) < 1e-4
    assert rec["clip_frac_region"] == 0.0


def test_reference_model_and_kl_logged_when_beta_positive():
    trainer = make({"loss": grpo.GRPOConfig(beta=0.04), "mu": 2, "minibatch_size": 8})
    assert trainer.ref is not None
    rec = trainer.train_step()
    assert rec["kl"] >= 0.0  # k3 is non-negative per token


def test_nonfinite_loss_skipped_counted_and_stops_after_k(monkeypatch):
    real = grpo.grpo_loss

    def nan_loss(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        return loss * float("nan"), metrics

    monkeypatch.setattr(grpo, "grpo_loss", nan_loss)
    trainer = make({"max_nonfinite_in_a_row": 2, "steps": 3, "minibatch_size": 16})
    before = [p.detach().clone() for p in trainer.model.parameters()]
    with pytest.raises(FloatingPointError, match="non-finite losses in a row"):
        trainer.train()
    assert trainer.skipped_updates >= 2
    assert all(torch.equal(a, p) for a, p in zip(before, trainer.model.parameters()))


def test_dynamic_sampling_drops_tied_groups():
    calls = {"n": 0}

    def reward(item, text):
        calls["n"] += 1
        return 1.0 if item.task == "P" else float(len(text) % 2)  # P groups always tie

    trainer = make({"dynamic_sampling": True, "max_refill_rounds": 2}, reward=reward)
    rec = trainer.train_step()
    assert rec["frac_reward_zero_std"] > 0
    assert all(i.task == "A" for i in trainer.last_batch.items)


def test_lr_schedule_warmup_and_cosine():
    cfg = GRPOTrainConfig(steps=10, warmup_steps=2, lr=1.0, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == 0.5 and lr_at(1, cfg) == 1.0
    assert abs(lr_at(2, cfg) - 1.0) < 1e-12 and abs(lr_at(10, cfg) - 0.1) < 1e-12


@pytest.mark.parametrize("field,value", [("group_size", 1), ("policy_fraction", 1.5), ("scale_rewards", "z"),
                                         ("mu", 0), ("temperature", 0.0)])
def test_config_validation_names_field(field, value):
    with pytest.raises(ValueError, match=field):
        GRPOTrainConfig(**{field: value})
