import dataclasses
import math
import re

import pandas as pd
import pytest

from rookworld_lib.lab import workflow
from rookworld_lib.chess import evaluate as ev, training
from rookworld_lib.chess.evaluate import Estimate
from rookworld_lib.core.paths import DATA_DIR


def history(with_kl: bool):
    rec = {"step": 1, "reward": 0.1, "entropy": 2.0, "clip_ratio/region_mean": 0.0, "frac_reward_zero_std": 0.25,
           "completions/mean_length": 40.0, "ratio/onpolicy_dev": 0.0, "time/sampling": 1.0, "time/scoring": 0.1,
           "time/update": 2.0, "loss": -0.01}
    if with_kl:
        rec["kl"] = 0.002
    return [dict(rec, step=i) for i in range(1, 13)]


def test_grpo_summary_keeps_only_logged_columns():
    # beta = 0 (the cpu profile) runs without a reference model, so no kl is logged
    no_kl = workflow.grpo_summary(history(False))
    assert "KL" not in no_kl.columns and len(no_kl) == 10 and list(no_kl.index) == list(range(3, 13))
    assert list(no_kl.columns) == [v for k, v in workflow.GRPO_SUMMARY_COLUMNS.items() if k not in ("kl", "step")]
    assert "KL" in workflow.grpo_summary(history(True), last=3).columns
    assert workflow.grpo_summary([]).empty  # no step logged yet (it raised KeyError)


def test_profile_summary_names_every_stage_in_one_short_table():
    table = workflow.PROFILES["cpu"].summary()
    assert list(table.index) == ["data", "SFT", "GRPO", "evaluation"] and table.shape == (4, 1)
    assert "150 steps x 16 prompts x 4 samples" in table.loc["GRPO"].item() and "P: all" in table.loc["evaluation"].item()


def test_a_run_from_a_brought_model_is_described_as_one():
    p = workflow.PROFILES["ci"]
    table = p.summary("/models/RookWorld-LM-124M", "original")
    assert table.loc["SFT"].item() == "none: GRPO starts from /models/RookWorld-LM-124M"
    assert "<= 128 tokens" in table.loc["GRPO"].item()  # the original layout's budget, which GRPO then uses
    assert "<= 24 tokens" in p.summary().loc["GRPO"].item()
    assert workflow.start_label(None) == "SFT" and workflow.start_label("/m") == "init_from"
    before = {"policy/valid": ev.rate([0, 1]), "env/valid": ev.rate([1, 1])}
    after = {"policy/valid": ev.rate([1, 1]), "env/valid": ev.rate([1, 1])}
    report = workflow.training_report(p, ev.comparison_table({"init_from": before, "init_from+GRPO": after}),
                                      ev.paired_difference([0.1, 0.2], [0.3, 0.4]), {"load init_from": 0.1},
                                      ev.paired_change(before, after), init_from="/m")
    assert report.startswith("## Training (ci profile: GRPO from /m, 2 GRPO steps of 4x4)") and "SFT" not in report


def test_onpolicy_tolerance_by_precision():
    assert workflow.onpolicy_ratio_tolerance(workflow.resolve("cpu")) == 1e-3
    assert workflow.onpolicy_ratio_tolerance(workflow.resolve("cpu", dtype="bf16")) == 0.1
    # "auto" is bf16 only on a CUDA device that has it: on the CPU the gpu profile's GRPO runs in fp32
    assert workflow.onpolicy_ratio_tolerance(workflow.resolve("gpu", device="cpu")) == 1e-3


def test_grpo_config_without_an_out_dir_keeps_nothing():
    assert workflow.grpo_config(workflow.resolve("ci"), None, seed=0).out_dir is None  # not a folder named "None"


def test_improvement_verdict_reads_the_interval():
    assert "excludes zero" in workflow.improvement_verdict(Estimate(0.05, 0.01, 0.09, 100))
    assert "lowered" in workflow.improvement_verdict(Estimate(-0.05, -0.09, -0.01, 100))
    assert "includes zero" in workflow.improvement_verdict(Estimate(0.01, -0.02, 0.04, 100))
    assert "No held-out reward" in workflow.improvement_verdict(Estimate(math.nan, math.nan, math.nan, 0))


def test_unknown_profile_is_named():
    with pytest.raises(ValueError, match="unknown profile 'tpu'"):
        workflow.resolve("tpu")


def test_gpu_profile_pads_the_vocabulary_and_cpu_does_not(tmp_path):
    # padding to 50304 rows was 1.51x faster on an H100 (docs/perf.md); the logits are unchanged
    gpu = workflow.sft_config(workflow.resolve("gpu"), tmp_path, DATA_DIR, seed=0)
    cpu = workflow.sft_config(workflow.resolve("cpu"), tmp_path, DATA_DIR, seed=0)
    assert gpu.model_overrides == {"pad_vocab_to_multiple": 64}
    assert cpu.model_overrides == {"pad_vocab_to_multiple": 1}
    assert gpu.model_config().padded_vocab_size == 50304 and cpu.model_config().padded_vocab_size == 50257


def test_chess_verdict_and_report_name_the_strict_metrics_that_moved():

    before = {"policy/valid": ev.rate([0] * 100), "env/next_fen_exact": ev.rate([1, 0] * 50)}
    after = {"policy/valid": ev.rate([1] * 40 + [0] * 60), "env/next_fen_exact": ev.rate([1, 0] * 50)}
    strict = ev.paired_change(before, after)
    verdict = workflow.chess_verdict(strict)
    assert verdict.startswith("Strict chess metrics that GRPO moved") and "policy/valid up (+40.0 [" in verdict
    assert "env/next_fen_exact" not in verdict
    same = ev.paired_change(before, before)
    assert workflow.chess_verdict(same).startswith("GRPO moved no strict chess metric")
    table = ev.comparison_table({"SFT": before, "SFT+GRPO": after})
    report = workflow.training_report(workflow.PROFILES["ci"], table, ev.paired_difference([0.0, 0.1], [0.2, 0.3]),
                                      {"SFT": 1.0}, strict)
    assert "| policy/valid | 0.0% [0.0, 3.7] (n=100) | 40.0% [" in report and f"**Chess verdict:** {verdict}" in report
    assert "pass@1" not in report  # no sampled rows: no note on their intervals
    sampled = {"pass@1/policy/valid": ev.pass_at_1([[1, 0, 0, 0]] * 30 + [[0] * 4] * 70)}
    report = workflow.training_report(workflow.PROFILES["cpu"], ev.comparison_table({"SFT": {**before, **sampled},
                                      "SFT+GRPO": {**after, **sampled}}), ev.paired_difference([0.0, 0.1], [0.2, 0.3]), {}, strict)
    # the pass@1 interval is narrower than Wilson's at the n it shows; the report says why, with the profile's k and T
    assert sampled["pass@1/policy/valid"].high - sampled["pass@1/policy/valid"].low < \
        ev.wilson(7.5, 100).high - ev.wilson(7.5, 100).low
    assert "each record's 4 samples at T 0.3; its interval is Wilson's at the effective number" in report


def test_reward_trend_compares_the_first_and_last_quarter_of_every_logged_reward():
    from rookworld_lib.lab import workflow

    history = [{"step": s, "rewards/P/mean": float(s), "rewards/A/mean": 1.0, "rewards/P/best_legal/mean": s / 8,
                "reward": 0.0} for s in range(1, 9)]
    history[0]["rewards/A/mean"] = None  # a step without A: rows
    for r in history:  # a function covering the whole task repeats its total: left out
        r["rewards/A/reward/mean"] = r["rewards/A/mean"]
    t = workflow.reward_trend(history)
    assert list(t.index) == ["A", "P", "P/best_legal"]
    assert t.loc["P"].tolist() == [1.5, 7.5, 6.0]  # steps 1-2 against 7-8
    assert t.loc["A"].tolist() == [1.0, 1.0, 0.0] and t.loc["P/best_legal", "change"] == 0.75
    # 10 steps: a quarter is 2 steps (10 // 4), not 3
    ten = workflow.reward_trend([{"step": s, "rewards/P/mean": float(s)} for s in range(1, 11)])
    assert ten.loc["P"].tolist() == [1.5, 9.5, 8.0]
    # one of several components that happens to equal the total (all 0 but one) is a component: kept
    parts = workflow.reward_trend([{"step": s, "rewards/P/mean": s / 2, "rewards/P/format/mean": s / 2,
                                    "rewards/P/valid/mean": 0.0} for s in (1, 2)])
    assert list(parts.index) == ["P", "P/format", "P/valid"]


def test_the_learning_signal_is_the_share_of_untied_groups_over_the_run():
    assert "**Learning signal:** 25% of the sampled completions" in workflow.signal_line(
        [{"frac_reward_zero_std": 1.0}, {"frac_reward_zero_std": 0.5}])  # 1 - (1.0 + 0.5) / 2
    assert workflow.signal_line([{"frac_reward_zero_std": 1.0}] * 3).startswith("**Learning signal: none.**")


def test_profiles_measure_pass_at_1_at_the_rollout_temperature():
    from rookworld_lib.lab import workflow

    for name, p in workflow.PROFILES.items():
        cfg = workflow.eval_config(p, 0)
        assert cfg.samples >= 4 and cfg.sample_temperature == p.grpo.temperature, name
        assert p.reward in ("gated", "graded"), name


def test_stage_timer_reports_a_stage_that_raised_as_failed_and_one_interrupted_as_such(tmp_path, monkeypatch):
    from rookworld_lib.core.progress import PROGRESS_ENV

    log = tmp_path / "progress.log"
    monkeypatch.setenv(PROGRESS_ENV, str(log))
    timer = workflow.StageTimer()
    with timer("data"):
        pass
    with pytest.raises(RuntimeError), timer("SFT"):
        raise RuntimeError("CUDA is not available")
    with pytest.raises(KeyboardInterrupt), timer("GRPO"):  # Ctrl-C or SIGTERM: checkpointed, not failed
        raise KeyboardInterrupt
    lines = log.read_text().splitlines()
    assert [line.split(" (")[0] for line in lines] == ["data started", "data done", "SFT started", "SFT failed",
                                                       "GRPO started", "GRPO interrupted"], lines
    assert set(timer.seconds) == {"data", "SFT", "GRPO"}


def test_the_report_says_when_grpo_had_no_learning_signal():
    from rookworld_lib.chess import evaluate as ev

    table = ev.comparison_table({"SFT": {"policy/cp_loss": ev.mean_interval([])}})
    assert "| policy/cp_loss | n/a (n=0) |" in workflow.markdown_table(table)  # not "nan [nan, nan]"
    args = (workflow.PROFILES["ci"], table, ev.paired_difference([0.0, 0.0], [0.0, 0.0]), {"GRPO": 0.4})
    tied = [{"step": s, "frac_reward_zero_std": 1.0} for s in (1, 2)]
    report = workflow.training_report(*args, grpo_history=tied)
    assert "**Learning signal: none.** In all 2 GRPO steps the completions of every group scored alike" in report
    some = [{"step": 1, "frac_reward_zero_std": 0.5}, {"step": 2, "frac_reward_zero_std": 0.25}]
    assert ("**Learning signal:** 62% of the sampled completions were in groups whose rewards differed (mean over 2 "
            "GRPO steps; `frac_reward_zero_std` 0.38)") in workflow.training_report(*args, grpo_history=some)
    assert "Learning signal" not in workflow.training_report(*args)


def test_fewer_sft_steps_shorten_the_warmup_and_the_eval_budget_has_room_beyond_grpos():
    p = workflow.resolve("cpu", sft_steps=50)  # the cpu profile warms up over 100 steps
    assert (p.sft.max_steps, p.sft.warmup_steps) == (50, 50)
    cpu = workflow.resolve("cpu")
    assert workflow.eval_config(cpu, seed=0).max_new_tokens == cpu.grpo.max_new_tokens + 24


def test_a_run_from_a_model_of_ones_own_reads_the_shipped_data():
    own = workflow.PROFILES["cpu-long"]
    assert own.summary().loc["data"].iloc[0] != "shipped set"
    assert own.summary(init_from="/some/model").loc["data"].iloc[0] == "shipped set"  # no SFT, so no datagen


def test_a_stage_timed_twice_adds_up(monkeypatch):
    clock = iter(range(100))  # each reading one second after the one before
    monkeypatch.setattr(workflow.time, "perf_counter", lambda: float(next(clock)))
    timer = workflow.StageTimer()
    for _ in range(2):
        with timer("eval"):
            pass
    assert timer.seconds["eval"] == 2.0  # a second each time


def test_grpo_steps_sets_grpos_steps_and_leaves_sft_and_the_profile_alone():
    """Notebook 05's grpo_steps (`rookworld run -p grpo_steps N`): GRPO's step count, nothing else; the
    cpu profile's values by hand from workflow.PROFILES: SFT 3,000 steps warmed up over 100, GRPO 150
    steps of 16 prompts x 4 samples."""
    p = workflow.resolve("cpu", grpo_steps=40)
    assert p.grpo.steps == 40
    assert (p.grpo.prompts_per_step, p.grpo.group_size, p.grpo.lr, p.grpo.temperature) == (16, 4, 5e-5, 0.3)
    assert (p.sft.max_steps, p.sft.warmup_steps) == (3000, 100)
    assert "40 steps x 16 prompts x 4 samples" in p.summary().loc["GRPO"].item()
    assert workflow.PROFILES["cpu"].grpo.steps == 150  # the named profile itself is untouched
    both = workflow.resolve("ci", sft_steps=5, grpo_steps=3)  # each override its own stage
    assert (both.sft.max_steps, both.sft.warmup_steps, both.grpo.steps) == (5, 2, 3)


def test_rookworld_run_passes_grpo_steps_to_the_notebook_that_declares_it(tmp_path, monkeypatch, capsys):
    """`rookworld run -p grpo_steps 40`: the value reaches notebook 05 as the integer 40 (the notebook
    hands it to workflow.resolve) and no other notebook; 0 is refused by notebook 05's own check before
    any notebook runs. The notebooks are not executed here: what papermill would be given is recorded."""
    from rookworld_lib.lab import pipeline
    from rookworld_lib.lab.cli import main

    given = {}
    monkeypatch.setattr(pipeline, "execute", lambda nb, out, params, run_dir: given.__setitem__(nb.name[:2], params))
    assert main(["run", "--profile", "cpu", "--out", str(tmp_path / "runs"), "-p", "grpo_steps", "40"]) == 0
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert sorted(given) == ["00", "01", "02", "03", "04", "05", "06"]
    assert given["05"]["grpo_steps"] == 40 and type(given["05"]["grpo_steps"]) is int
    assert given["05"]["profile"] == "cpu" and given["05"]["run_dir"] == str(run_dir)
    assert [name for name, params in given.items() if "grpo_steps" in params] == ["05"]
    capsys.readouterr()
    assert main(["run", "--profile", "cpu", "--out", str(tmp_path / "refused"), "-p", "grpo_steps", "0"]) == 1
    err = capsys.readouterr().err
    assert err == "rookworld run: error: 05_full_training.ipynb: notebook parameter 'grpo_steps' must be >= 1, got 0\n"
    assert not (tmp_path / "refused").exists()


def test_notebook_05s_training_cell_stopped_and_run_again_resumes_at_its_checkpoint(tmp_path):
    """A training cell stopped by Ctrl-C in JupyterLab saves a checkpoint (README); the profiles set
    resume=False, so the cell run again was refused ("resume=True continues it"), a setting the notebook
    does not offer. Now it resumes, and the metrics file holds every step once."""
    from rookworld_lib.chess.training import RecordReader
    from rookworld_lib.core.train_sft import METRICS_FILE, train_sft
    from rookworld_lib.core.train_utils import read_metrics

    from sft_helpers import TEXTS

    prof = workflow.resolve("ci")
    assert prof.sft.resume and prof.grpo.resume
    cfg = workflow.sft_config(prof, tmp_path / "training" / "sft", DATA_DIR, 0)  # the cell's config, on small texts
    texts = dict(train_texts=TEXTS[:16], val_texts=TEXTS[16:], reader=RecordReader("compact", prof.candidate_order))
    stopped = train_sft(cfg, until=3, **texts)
    assert stopped.step == 3 and stopped.checkpoint is not None
    again = train_sft(cfg, **texts)
    assert again.step == prof.sft.max_steps and [r["step"] for r in again.history][0] == 4
    assert [r["step"] for r in read_metrics(tmp_path / "training" / "sft" / METRICS_FILE)] == list(range(prof.sft.max_steps + 1))


# Behaviours of lab/workflow that no test pinned (mutation round 5: each test below is red with its mutant)

def test_the_cpu_profiles_sft_config_is_the_command_docs_grpo_md_gives_for_it(tmp_path):
    """docs/grpo.md (section on the anatomy runs) gives the `rookworld sft` command line whose SFTConfig is
    "the same SFTConfig as workflow.sft_config gives the cpu profile with that training directory, field
    for field but resume": its min_lr 2e-4 (a tenth of the lr; docs/learning_curve.md: "cosine decay to
    2e-4"), eval every 300 steps (3,000 / 10), the val files of data/, the train files of DIR."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    for name in ("policy_train.jsonl", "env_train.jsonl"):
        lines = (DATA_DIR / name).read_text().splitlines(keepends=True)[:20]
        (data_dir / name).write_text("".join(lines))
    out = tmp_path / "out"
    argv = ["--model", "cpu-small", "--model-overrides", "pad_vocab_to_multiple=1", "--train-data",
            str(data_dir / "policy_train.jsonl"), str(data_dir / "env_train.jsonl"), "--val-data",
            str(DATA_DIR / "policy_val.jsonl"), str(DATA_DIR / "env_val.jsonl"), "--block-size", "256",
            "--batch-size", "8", "--lr", "2e-3", "--min-lr", "2e-4", "--warmup-steps", "100", "--max-steps", "3000",
            "--vocab", "task", "--seed", "0", "--eval-interval", "300", "--eval-steps", "4",
            "--checkpoint-interval", "0", "--device", "cpu", "--dtype", "fp32", "--out", str(out)]
    documented, _ = training._sft_config_from_args(training.build_sft_parser().parse_args(argv))
    ours = workflow.sft_config(workflow.resolve("cpu"), out, DATA_DIR, seed=0, train_dir=data_dir)
    fields = [f.name for f in dataclasses.fields(ours) if f.name != "resume"]
    assert {f: getattr(ours, f) for f in fields} == {f: getattr(documented, f) for f in fields}


def test_an_interval_that_reaches_zero_is_no_improvement():
    """improvement_verdict: "resolved at 95%" means the interval excludes zero; a lower bound of exactly 0
    includes it (and an upper bound of exactly 0 is no resolved drop)."""
    assert "includes zero" in workflow.improvement_verdict(Estimate(0.05, 0.0, 0.1, 100))
    assert "includes zero" in workflow.improvement_verdict(Estimate(-0.05, -0.1, 0.0, 100))


def test_markdown_table_has_one_separator_cell_per_column():
    """A GitHub Markdown table needs as many cells in its delimiter row as in its header (else it is no
    table); the index is the first column. Written out by hand."""
    df = pd.DataFrame({"a": [1, 2], "b": ["x", "y"]}, index=pd.Index(["r1", "r2"], name="metric"))
    assert workflow.markdown_table(df) == ("| metric | a | b |\n"
                                           "|---|---|---|\n"
                                           "| r1 | 1 | x |\n"
                                           "| r2 | 2 | y |")



def test_overrides_a_layout_and_a_data_folder_it_cannot_use_are_named(tmp_path):
    """resolve(sft_steps=-5) was refused as warmup_steps -5, sft_steps="10" in a TypeError; layout="fancy" ended
    in KeyError 'fancy'; sft_config on a missing folder gave train_data=() (SFT then named no folder)."""
    for kw, message in ((dict(sft_steps="10"), "sft_steps must be an integer >= 1 (None: the profile's), got '10'"),
                        (dict(grpo_steps=-5), "grpo_steps must be an integer >= 1 (None: the profile's), got -5"),
                        (dict(sft_steps=True), "sft_steps must be an integer >= 1")):
        with pytest.raises(ValueError, match=rf"^resolve: {re.escape(message)}"):
            workflow.resolve("ci", **kw)
    p = workflow.resolve("ci", sft_steps=3)
    assert p.sft.max_steps == 3 and p.sft.warmup_steps == 2
    for make in (lambda: workflow.eval_config(p, 0, layout="fancy"), lambda: workflow.grpo_config(p, None, 0, "fancy")):
        with pytest.raises(ValueError, match=r"^layout must be one of \['compact', 'original'\], got 'fancy'$"):
            make()
    with pytest.raises(ValueError, match=rf"^{re.escape(str(tmp_path / 'none'))} \(no such directory\): no training data"):
        workflow.sft_config(p, tmp_path / "sft", tmp_path / "none", 0)


def test_the_reports_wall_times_say_they_are_this_sessions_and_grpos_steps_add_up_over_every_session():
    """After `rookworld run --resume` the report gave the last session's SFT time as the run's (24.2 s of
    a 77 s SFT), and steps per second read from it came out 3-4x too high."""
    from rookworld_lib.chess import evaluate as ev

    table = ev.comparison_table({"SFT": {"policy/cp_loss": ev.mean_interval([])}})
    args = (workflow.PROFILES["ci"], table, ev.paired_difference([0.0, 0.0], [0.0, 0.0]), {"GRPO": 0.4})
    history = [{"step": 1, "time/step": 2.5}, {"step": 2, "time/step": 1.25}]
    report = workflow.training_report(*args, grpo_history=history)
    assert ("Wall times are this session's: a run continued with `rookworld run --resume` counts only what it ran after "
            "the resume; GRPO's 2 steps took 3.8 s in all (their `time/step`, over every session).") in report
