"""Experiment tracking: TensorBoard event files that agree with the metrics JSON lines (and stay so
across a resume), and GRPO's completions.jsonl, checked against the reward and advantage functions."""

import json

import pytest
import torch
from sft_helpers import TEXTS, one_thread, tiny_cfg  # noqa: F401  (one_thread: autouse fixture)
from tensorboard.backend.event_processing import plugin_event_accumulator
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_train_grpo import make, toy_reward

from rookworld_lib.core import grpo
from rookworld_lib.chess import rewards
from rookworld_lib.chess.data import data_file, load_jsonl
from rookworld_lib.core.model import GPT, GPTConfig
from rookworld_lib.chess.training import chess_reward, prompt_items, task_weights
from rookworld_lib.core.train_grpo import (COMPLETION_KEYS, COMPLETIONS_FILE, METRICS_FILE, GRPOTrainConfig, GRPOTrainer,
                                           completions_markdown)
from rookworld_lib.core.train_sft import SFTTrainer
from rookworld_lib.core.train_utils import read_metrics


def interrupted(trainer, until: int, checkpoint_at: int):
    """Train to step `until` with the last checkpoint at `checkpoint_at`: the records and events after
    it are on disk, as when a run is killed before its next checkpoint."""
    save = trainer.save
    trainer.save = lambda: save() if trainer.step == checkpoint_at else None
    trainer.train(until=until)


def assert_events_equal_metrics(out_dir, metrics_file):
    """Every number of every metrics record is a TensorBoard scalar of the same name and step, once."""
    events = EventAccumulator(str(out_dir), size_guidance={"scalars": 0})
    events.Reload()
    records = read_metrics(out_dir / metrics_file)
    expected = {}
    for rec in records:
        for key, value in rec.items():
            if key != "step" and isinstance(value, (int, float)):  # a flag (nonfinite/skipped) as 0 or 1
                expected.setdefault(key, []).append((rec["step"], float(value)))
    assert set(events.Tags()["scalars"]) == set(expected)
    for key, points in expected.items():
        logged = [(e.step, e.value) for e in events.Scalars(key)]
        assert [s for s, _ in logged] == [s for s, _ in points], key  # each step once: the resume purged
        assert [v for _, v in logged] == pytest.approx([v for _, v in points], rel=1e-6, abs=1e-30), key
    return records


def test_grpo_events_and_completions_resume_without_duplicates(tmp_path):
    cfg = {"steps": 3, "prompts_per_step": 2, "max_new_tokens": 5, "minibatch_size": 8, "checkpoint_interval": 1,
           "completions_interval": 1, "out_dir": str(tmp_path)}
    interrupted(make(cfg), until=2, checkpoint_at=1)
    resumed = make(cfg)
    assert resumed.step == 1
    resumed.train()
    records = assert_events_equal_metrics(tmp_path, METRICS_FILE)
    assert [r["step"] for r in records] == [1, 2, 3]
    rows = [json.loads(line) for line in (tmp_path / COMPLETIONS_FILE).read_text().splitlines()]
    assert [r["step"] for r in rows] == [s for s in (1, 2, 3) for _ in range(2 * 4)]
    assert rows[-8:] == resumed.last_rollout
    # the text tables: the dashboard's own loader (the legacy EventAccumulator never purges tensors)
    events = plugin_event_accumulator.EventAccumulator(str(tmp_path), size_guidance={"tensors": 0})
    events.Reload()
    tables = events.Tensors("completions/text_summary")
    assert [t.step for t in tables] == [1, 2, 3]
    assert tables[-1].tensor_proto.string_val[0].decode() == completions_markdown(resumed.last_rollout)


def test_report_to_none_writes_no_event_files(tmp_path):
    make({"out_dir": str(tmp_path), "report_to": "none", "prompts_per_step": 2, "max_new_tokens": 4}).train()
    assert (tmp_path / METRICS_FILE).exists() and not list(tmp_path.glob("events.out.tfevents.*"))


def test_sft_report_to_none_writes_no_event_files(tmp_path):
    SFTTrainer(tiny_cfg(tmp_path, max_steps=2, report_to="none"), train_texts=TEXTS).train()
    assert (tmp_path / "metrics.jsonl").exists() and not list(tmp_path.glob("events.out.tfevents.*"))


def test_sft_events_equal_metrics_after_a_resume(tmp_path):
    cfg = tiny_cfg(tmp_path, max_steps=4, eval_interval=2, eval_steps=1, checkpoint_interval=1)
    interrupted(SFTTrainer(cfg, train_texts=TEXTS), until=3, checkpoint_at=2)
    SFTTrainer(cfg, train_texts=TEXTS).train()
    records = assert_events_equal_metrics(tmp_path, "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]


TYPES = {"step": int, "group": int, "task": str, "prompt": str, "completion": str, "reward": float,
         "advantage": float, "ratio": float, "clip_fraction": float}


def check_rows(rows, G, reward_of):
    """completions.jsonl rows: the keys and types, reward_of(row) as the reward, and each group's
    advantages as grpo.group_advantages gives them for its rewards."""
    for r in rows:
        assert list(r) == list(COMPLETION_KEYS) and all(type(r[k]) is t for k, t in TYPES.items()), r
        assert r["task"] in ("P", "A") and r["prompt"].startswith(r["task"] + ": ") and 0 <= r["clip_fraction"] <= 1
        assert r["reward"] == reward_of(r)
    for g in range(len(rows) // G):
        group = rows[g * G:(g + 1) * G]
        assert {r["group"] for r in group} == {g} and len({r["prompt"] for r in group}) == 1
        adv, _ = grpo.group_advantages(torch.tensor([r["reward"] for r in group]), G)
        assert [r["advantage"] for r in group] == pytest.approx(adv.tolist(), abs=1e-6)


def test_a_resume_without_tensorboard_still_hides_the_steps_it_redoes_from_the_earlier_events(tmp_path):
    """A run killed after its step-2 checkpoint, resumed with report_to="none" (a resume may change it), then
    again with TensorBoard: the killed run's step 3 stayed in the events beside the metrics file's redone one."""
    cfg = tiny_cfg(tmp_path, max_steps=4, eval_interval=2, eval_steps=1, checkpoint_interval=1)
    interrupted(SFTTrainer(cfg, train_texts=TEXTS), until=3, checkpoint_at=2)
    quiet = tiny_cfg(tmp_path, max_steps=4, eval_interval=2, eval_steps=1, checkpoint_interval=1, report_to="none")
    interrupted(SFTTrainer(quiet, train_texts=TEXTS), until=3, checkpoint_at=3)
    SFTTrainer(tiny_cfg(tmp_path, max_steps=5, eval_interval=2, eval_steps=1, checkpoint_interval=1),
               train_texts=TEXTS).train()
    events = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == [1, 2, 4, 5]  # 3 was logged by the quiet run alone


def test_completion_rows_carry_the_chess_rewards_of_their_text():
    records = [r for task in ("P", "A") for r in load_jsonl(data_file(task, "train"), task=task).records[:3]]
    truth = {item.prompt: rec for item, rec in zip(prompt_items(records), records)}
    score = {"P": rewards.score_policy, "A": rewards.score_environment}
    torch.manual_seed(0)
    cfg = GRPOTrainConfig(steps=1, prompts_per_step=4, group_size=4, max_new_tokens=12, minibatch_size=16,
                          loss=grpo.GRPOConfig(beta=0.0), seed=1, progress=False, task_weights=task_weights())
    trainer = GRPOTrainer(GPT(GPTConfig.preset("tiny", block_size=128)), prompt_items(records), cfg,
                          reward_funcs=chess_reward)  # chess rewards
    trainer.train_step()
    check_rows(trainer.last_rollout, 4, lambda r: score[r["task"]](r["prompt"], r["completion"], truth=truth[r["prompt"]]))
    assert {r["task"] for r in trainer.last_rollout} == {"P", "A"} and {r["step"] for r in trainer.last_rollout} == {1}


def test_completion_ratios_are_the_losses_at_each_rows_first_update():
    """Four minibatches, so that later rows are scored after updates; varied rewards (a parity toy)."""
    trainer = make({"minibatch_size": 4, "lr": 3e-2})
    rec = trainer.train_step()
    rows = trainer.last_rollout
    check_rows(rows, 4, lambda r: toy_reward(None, r["completion"]))
    assert any(r["advantage"] != 0 for r in rows)
    # Token-weighted within each minibatch, the rows' ratios give grpo_loss's ratio/mean. Rows go into
    # minibatches in _update's order (seeded by the step); the first minibatch is scored on-policy.
    order = torch.randperm(16, generator=torch.Generator().manual_seed(trainer.cfg.seed * 7_919 + 0))
    tokens = trainer.last_batch.mask.sum(1).float()
    means = []
    for mb in order.view(4, 4):
        ratio = torch.tensor([rows[i]["ratio"] for i in mb.tolist()])
        means.append(float((ratio * tokens[mb]).sum() / tokens[mb].sum()))
    assert rec["ratio/mean"] == pytest.approx(sum(means) / 4, rel=1e-6)
    assert all(abs(rows[i]["ratio"] - 1) < 1e-4 and rows[i]["clip_fraction"] == 0 for i in order[:4].tolist())
    assert max(abs(r["ratio"] - 1) for r in rows) > 1e-2  # later minibatches ran after updates


def test_a_new_event_file_sorts_after_every_earlier_one(tmp_path):
    """TensorBoard reads event files in name order (the time in whole seconds first, then host, pid and
    a counter that is not zero-padded): a writer opened in the same second as an earlier file waits for
    the next, or that file's steps could purge its own (this file's resume test failed so, now and then);
    a file stamped ahead of our clock holds nothing up."""
    import time

    from rookworld_lib.core.trainer import wait_past_event_files

    stamp = int(time.time())
    (tmp_path / f"events.out.tfevents.{stamp}.zz.1.9").write_bytes(b"")  # this second's
    wait_past_event_files(tmp_path)
    assert time.time() >= stamp + 1
    (tmp_path / f"events.out.tfevents.{int(time.time()) + 3600}.zz.1.9").write_bytes(b"")  # a clock ahead of ours
    start = time.monotonic()
    wait_past_event_files(tmp_path)
    assert time.monotonic() - start < 0.5
    stamp = int(time.time())  # beside it, a file of this second is still waited out
    (tmp_path / f"events.out.tfevents.{stamp}.zz.1.10").write_bytes(b"")
    wait_past_event_files(tmp_path)
    assert time.time() >= stamp + 1


def test_an_event_file_from_a_clock_ahead_of_ours_does_not_hold_a_run_up(tmp_path):
    import time

    (tmp_path / f"events.out.tfevents.{int(time.time()) + 3600}.host.1.0").write_bytes(b"")  # copied from a host ahead
    start = time.monotonic()
    make({"out_dir": str(tmp_path), "prompts_per_step": 2, "max_new_tokens": 4}).train()
    assert time.monotonic() - start < 60


def test_a_fresh_run_keeps_an_earlier_runs_events_in_a_folder_of_their_own(tmp_path):
    """A fresh start in a folder whose earlier run left no checkpoint: TensorBoard's default loader
    (tensorboard-data-server) ignores purge_step, so the earlier run's eval/loss showed as this run's,
    though this run logged none. Its events now go to tensorboard-<stamp>/, a run of their own."""
    import shutil

    SFTTrainer(tiny_cfg(tmp_path, max_steps=2, eval_interval=1, eval_steps=1), train_texts=TEXTS).train()
    earlier = sorted(p.name for p in tmp_path.glob("events.out.tfevents.*"))
    shutil.rmtree(tmp_path / "checkpoints")
    shutil.rmtree(tmp_path / "final", ignore_errors=True)
    SFTTrainer(tiny_cfg(tmp_path, max_steps=2, eval_interval=0), train_texts=TEXTS).train()
    records = assert_events_equal_metrics(tmp_path, "metrics.jsonl")  # this run's events only
    assert all(r.get("eval/loss") is None for r in records)  # so no eval/loss scalar (checked above)
    aside = list(tmp_path.glob("tensorboard-*"))
    assert len(aside) == 1 and sorted(p.name for p in aside[0].iterdir()) == earlier
    old = EventAccumulator(str(aside[0]), size_guidance={"scalars": 0})
    old.Reload()
    assert [e.step for e in old.Scalars("eval/loss")] == [0, 1, 2]


def test_a_step_logs_every_tasks_reward_null_where_it_drew_no_prompt_of_it(tmp_path):
    """A step that drew no P: prompt had no rewards/P/mean key at all, while the functions' keys were null."""
    trainer = make({"steps": 4, "prompts_per_step": 1, "out_dir": str(tmp_path), "report_to": "none"})
    trainer.train()
    records = read_metrics(tmp_path / METRICS_FILE)
    for rec in records:
        assert {"rewards/P/mean", "rewards/A/mean", "rewards/P/std", "rewards/A/std"} <= rec.keys()
        assert sum(rec[f"rewards/{t}/mean"] is None for t in "PA") == 1  # one prompt a step: one task


def test_a_grpo_run_records_its_settings_as_sft_does(tmp_path):
    """GRPO's settings lived only in its pickled checkpoints (none where checkpoint_interval is 0 until the
    end); SFT wrote sft_config.json. grpo_config.json: the config, the start model, the rewards and weights."""
    make({"steps": 1, "prompts_per_step": 2, "out_dir": str(tmp_path), "report_to": "none", "lr": 1e-3}).train()
    settings = json.loads((tmp_path / "grpo_config.json").read_text())
    assert settings["lr"] == 1e-3 and settings["steps"] == 1 and settings["loss"]["beta"] == 0.0
    assert settings["init_from"] is None and [w for _, w in settings["rewards"]] == [1.0]
    # a fresh run of other settings keeps the earlier one's beside its kept records
    import shutil
    for folder in ("checkpoints", "final"):
        shutil.rmtree(tmp_path / folder, ignore_errors=True)
    make({"steps": 1, "prompts_per_step": 2, "out_dir": str(tmp_path), "report_to": "none", "lr": 2e-3}).train()
    assert json.loads((tmp_path / "grpo_config.json").read_text())["lr"] == 2e-3
    assert [json.loads(p.read_text())["lr"] for p in tmp_path.glob("grpo_config-*.json")] == [1e-3]
