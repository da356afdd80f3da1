"""The learning curve (issue 14): every checkpoint of an SFT run evaluated on the strict metrics
(`evaluate.checkpoint_curve`, `rookworld eval --every-checkpoint`), its figure, the measured curve
shipped in docs/, and the cpu-long profile that trains on data of its own."""

import dataclasses
import json
import math

import pytest
import torch

from rookworld_lib.lab import cli, pipeline, workflow
from rookworld_lib.chess import data, evaluate
from rookworld_lib.chess.training import RecordReader
from rookworld_lib.core.checkpoint import export_hf, list_checkpoints, model_from_checkpoint
from rookworld_lib.core.model import GPT
from rookworld_lib.core.paths import DATA_DIR, read_jsonl
from rookworld_lib.lab.places import DOCS_DIR, NOTEBOOKS_DIR
from rookworld_lib.lab.plots import learning_curve_figure
from rookworld_lib.core.train_sft import train_sft
from rookworld_lib.core.paths import run_lock

EVAL = evaluate.EvalConfig(max_new_tokens=12, batch_size=8, selfplay_games=0, samples=0)  # the greedy curve


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """A ci-sized SFT run over the task vocabulary with a checkpoint every 2 of its 6 steps."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("sft")
    cfg = workflow.sft_config(workflow.resolve("ci", sft_steps=6), out, DATA_DIR, seed=0)
    cfg = dataclasses.replace(cfg, checkpoint_interval=2, keep_checkpoints=0, eval_interval=3, progress=False,
                              report_to="none")
    train_sft(cfg, reader=RecordReader())  # the shipped records, in the compact layout
    return out, cfg


def _records():
    return data.load_split("P", "test").records[:6], data.load_split("A", "test").records[:6]


def test_checkpoint_curve_equals_each_checkpoints_export_evaluated_on_its_own(sft_run):
    run, cfg = sft_run
    test_p, test_a = _records()
    seen = []
    rows = evaluate.checkpoint_curve(run, test_p, test_a, EVAL, on_point=seen.append)
    assert seen == rows and [r["step"] for r in rows] == [2, 4, 6]
    history = [obj for _, obj, _ in read_jsonl(run / "metrics.jsonl")]
    for row, (step, path) in zip(rows, list_checkpoints(run / "checkpoints")):
        # the reference: the checkpoint written out as a Hugging Face model, loaded back, evaluated alone
        model = GPT.from_pretrained(export_hf(path, run / f"hf-{step}")).eval()
        ref = {**evaluate.evaluate_policy(model, test_p, EVAL), **evaluate.evaluate_environment(model, test_a, EVAL)}
        assert {m: (row[m]["value"], row[m]["n"]) for m in evaluate.STRICT_METRICS} == \
            {m: (ref[m].value, ref[m].n) for m in evaluate.STRICT_METRICS}
        assert row["tokens"] == step * cfg.batch_size * cfg.grad_accum * cfg.block_size
        assert row["train_wall_s"] == pytest.approx(sum(r["time/step"] for r in history if 0 < r["step"] <= step), abs=0.06)
        vals = [(r["step"], r["eval/loss"]) for r in history if r["step"] <= step and r.get("eval/loss") is not None]
        assert (row["val_loss_step"], row["val_loss"]) == vals[-1]
        assert row["train_loss"] == next(r["loss"] for r in history if r["step"] == step)
        for m in evaluate.STRICT_METRICS:
            assert row[m]["low"] <= row[m]["value"] <= row[m]["high"]
    table = evaluate.curve_table(rows)
    assert list(table.index) == [2, 4, 6] and list(table.columns[-5:]) == [f"{m} (%)" for m in evaluate.STRICT_METRICS]


def test_model_from_checkpoint_is_the_full_vocabulary_model_export_hf_writes(sft_run):
    run, _ = sft_run
    step, path = list_checkpoints(run / "checkpoints")[-1]
    model = model_from_checkpoint(path)
    exported = GPT.from_pretrained(export_hf(path, run / "hf-last"))
    assert model.config.vocab_size == 50257  # the task vocabulary expanded back to GPT-2's
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), exported.state_dict().values()))


def test_eval_every_checkpoint_writes_curve_json_and_names_a_run_without_checkpoints(sft_run, tmp_path, capsys):
    run, _ = sft_run
    assert cli.main(["eval", str(run), "--every-checkpoint", "--max-policy", "4", "--max-env", "4",
                     "--max-new-tokens", "12", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    written = json.loads((run / "curve.json").read_text())
    assert printed == written and [r["step"] for r in written] == [2, 4, 6]
    assert all(r["policy/valid"]["n"] == 4 and r["env/valid"]["n"] == 4 for r in written)
    # a second curve (here on fewer positions) keeps the first beside it
    assert cli.main(["eval", str(run), "--every-checkpoint", "--max-policy", "2", "--max-env", "2",
                     "--max-new-tokens", "12", "--json"]) == 0
    kept = [p for p in run.glob("curve-*.json")]
    assert len(kept) == 1 and json.loads(kept[0].read_text()) == written
    assert f"the previous curve: {kept[0]}" in capsys.readouterr().err
    assert all(r["policy/valid"]["n"] == 2 for r in json.loads((run / "curve.json").read_text()))
    assert cli.main(["eval", str(tmp_path), "--every-checkpoint"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("rookworld eval: error: ") and "no step_*.pt checkpoint" in err[-1]
    # a mistyped run folder is named, and not made (the run lock made it, with its .lock in it)
    assert cli.main(["eval", str(tmp_path / "typo" / "run"), "--every-checkpoint"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"rookworld eval: error: {tmp_path / 'typo' / 'run'}: no such folder; --every-checkpoint takes a "
        "`rookworld sft` --out")
    assert not (tmp_path / "typo").exists()
    metrics = (run / "metrics.jsonl").read_bytes()  # a run folder without its metrics (a GRPO run's, say)
    (run / "metrics.jsonl").unlink()
    assert cli.main(["eval", str(run), "--every-checkpoint"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"rookworld eval: error: {run / 'metrics.jsonl'}: missing; a learning curve is of a `rookworld sft` --out, "
        "whose metrics give each checkpoint's tokens and losses")  # was a bare FileNotFoundError
    (run / "metrics.jsonl").write_bytes(metrics)
    # a run still training there (it holds the run's lock) would rotate checkpoints away mid-curve: refused
    with run_lock(run):
        assert cli.main(["eval", str(run), "--every-checkpoint", "--max-policy", "4", "--max-env", "4"]) == 1
    assert "is being written by another run" in capsys.readouterr().err.strip().splitlines()[-1]
    # the env suite off (or no env test file): a policy-only curve, in strict JSON; it crashed in pass@1 over no records
    assert cli.main(["eval", str(run), "--every-checkpoint", "--max-policy", "2", "--max-env", "0",
                     "--max-new-tokens", "12"]) == 0

    def refuse(constant):
        raise ValueError(f"not strict JSON: {constant}")
    policy_only = json.loads((run / "curve.json").read_text(), parse_constant=refuse)
    assert [r["step"] for r in policy_only] == [2, 4, 6] and all("env/valid" not in r for r in policy_only)
    assert all(r["pass@1/policy/valid"]["n"] == 2 for r in policy_only)
    capsys.readouterr()
    (tmp_path / "grpo").mkdir()
    (tmp_path / "grpo" / "grpo_metrics.jsonl").write_text("")
    assert cli.main(["eval", str(tmp_path / "grpo"), "--every-checkpoint"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "is a GRPO run; --every-checkpoint evaluates the checkpoints of a `rookworld sft` run")


def test_learning_curve_figure_draws_every_metric_with_its_interval():
    rows = [{"step": s, "tokens": 1000 * s, "train_wall_s": 2.0 * s, "val_loss": 3.0 - s / 10,
             **{m: {"value": 0.1 * s, "low": 0.05 * s, "high": 0.2 * s, "n": 100} for m in evaluate.STRICT_METRICS}}
            for s in (1, 2)]
    fig = learning_curve_figure({"a": rows, "b": rows[:1]}, x="train_wall_s")
    assert len(fig.data) == 2 * 6 and sum(t.showlegend for t in fig.data) == 2
    valid = next(t for t in fig.data if t.name == "a" and t.yaxis == "y2")  # the policy/valid panel
    assert list(valid.x) == [2.0, 4.0] and list(valid.y) == pytest.approx([10.0, 20.0])
    assert list(valid.error_y.array) == pytest.approx([10.0, 20.0]) and list(valid.error_y.arrayminus) == pytest.approx([5.0, 10.0])
    with pytest.raises(ValueError, match="x='step'"):
        learning_curve_figure({"a": rows}, x="step")
    # this run among the reference runs: drawn last (on top), black stars, one legend entry
    fig = learning_curve_figure({"this run": rows[:1], "a": rows, "b": rows}, highlight="this run")
    mine = [t for t in fig.data if t.name == "this run"]
    assert fig.data[-1].name == "this run" and len(mine) == 6 and sum(t.showlegend for t in mine) == 1
    assert all(t.marker.symbol == "star" and t.line.color == "black" for t in mine)
    assert not any(t.marker.symbol for t in fig.data if t.name != "this run")
    with pytest.raises(ValueError, match="highlight='c' is not one of the curves"):
        learning_curve_figure({"a": rows}, highlight="c")


def test_the_shipped_learning_curve_is_well_formed():
    """docs/learning_curve.json holds the measured runs that notebook 05 and docs/learning_curve.md show."""
    curves = json.loads((DOCS_DIR / "learning_curve.json").read_text())
    assert len(curves) >= 2
    for name, run in curves.items():
        assert run["command"] and run["machine"], name
        tokens = [r["tokens"] for r in run["rows"]]
        assert tokens == sorted(tokens) and len(set(tokens)) == len(tokens), name
        for r in run["rows"]:
            assert math.isfinite(r["val_loss"]) and r["train_wall_s"] > 0
            for m in evaluate.STRICT_METRICS:
                e = r[m]
                assert 0 <= e["low"] <= e["value"] <= e["high"] <= 1 and e["n"] >= 500, (name, r["step"], m)
                assert evaluate.wilson(round(e["value"] * e["n"]), e["n"]).low == pytest.approx(e["low"])


def test_cpu_long_profile_trains_on_its_own_data_and_is_measured_on_the_shipped_test_split(tmp_path):
    prof = workflow.resolve("cpu-long")
    gen = workflow.datagen_config(prof, tmp_path / "data", DATA_DIR, workers=2)
    assert gen.exclude_dir == str(DATA_DIR) and gen.out_dir == str(tmp_path / "data") and gen.env_rate == 1.0
    (tmp_path / "data").mkdir()
    for name in ("policy_train.jsonl", "env_train.jsonl"):  # SFTConfig checks that its files exist
        (tmp_path / "data" / name).write_text((DATA_DIR / name).read_text())
    sft = workflow.sft_config(prof, tmp_path / "sft", DATA_DIR, seed=0, train_dir=tmp_path / "data")
    assert sft.train_data == (str(tmp_path / "data" / "policy_train.jsonl"), str(tmp_path / "data" / "env_train.jsonl"))
    assert sft.val_data == (str(DATA_DIR / "policy_val.jsonl"), str(DATA_DIR / "env_val.jsonl"))
    assert sft.checkpoint_interval > 0 and sft.keep_checkpoints == 0  # every checkpoint stays: a curve
    # 16,000 SFT steps with four checkpoints (docs/learning_curve.md, "More SFT or more GRPO"): the curve
    # evaluates as many as it did at 12,000 steps
    assert sft.max_steps == 16000 and sft.max_steps // sft.checkpoint_interval == 4
    assert workflow.resolve("cpu").datagen is None
    # cpu-long writes the P: candidates sorted by move text; cpu keeps the layout's order (docs/grpo.md section 4)
    assert prof.candidate_order == "uci" and workflow.resolve("cpu").candidate_order == "layout"
    # cpu-long's GRPO is cpu's recipe run four times as long (docs/learning_curve.md): one change
    cpu_grpo = workflow.resolve("cpu").grpo
    assert prof.grpo.steps == 4 * cpu_grpo.steps == 600
    assert dataclasses.replace(prof.grpo, steps=cpu_grpo.steps) == cpu_grpo and prof.reward == "graded"
    # `rookworld run --profile cpu-long` reaches notebook 05, and every notebook that takes a profile accepts it
    assert pipeline.PROFILES["cpu-long"] == {"profile": "cpu-long"}
    for name in ("02_forward_pass_health", "05_full_training"):
        nb = json.loads((NOTEBOOKS_DIR / f"{name}.ipynb").read_text())
        assert any("cpu-long" in "".join(c["source"]) or "sorted(workflow.PROFILES)" in "".join(c["source"])
                   for c in nb["cells"] if "check(\"profile\"" in "".join(c["source"])), name


def test_a_curve_checks_every_checkpoint_before_it_evaluates_and_leaves_no_lock_where_refused(sft_run, tmp_path, capsys):
    """A corrupt last checkpoint stopped the curve after every other one was evaluated (their rows lost),
    with advice to resume training; a checkpoints/ folder or an export given by mistake kept a .lock."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(sft_run[0], run)
    (run / "curve.json").unlink(missing_ok=True)
    last = list_checkpoints(run / "checkpoints")[-1][1]
    last.write_bytes(last.read_bytes()[:1000])
    assert cli.main(["eval", str(run), "--every-checkpoint", "--max-policy", "2", "--max-env", "2", "--max-new-tokens", "12"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"rookworld eval: error: {run / 'checkpoints'}: {last.name} fails its SHA-256 check (a corrupt file): "
                       "no checkpoint was evaluated; move it and its .sha256 away to evaluate the others")
    assert not any(line.startswith("{") for line in err) and not (run / "curve.json").exists()
    for given, hint in ((run / "checkpoints", f"{run / 'checkpoints'} is a run's checkpoints folder: give the run, {run}"),
                        (sft_run[0] / "final", "is an exported model: give the run folder it was exported from")):
        assert cli.main(["eval", str(given), "--every-checkpoint"]) == 1
        assert hint in capsys.readouterr().err
        assert not (given / ".lock").exists()
    last.unlink()  # as the message says; the curve of the others records how it was measured
    for p in run.glob("checkpoints/*.sha256"):
        if p.name.startswith(last.name):
            p.unlink()
    assert cli.main(["eval", str(run), "--every-checkpoint", "--max-policy", "2", "--max-env", "2", "--max-new-tokens", "12",
                     "--samples", "0"]) == 0
    rows = json.loads((run / "curve.json").read_text())
    assert [r["step"] for r in rows] == [2, 4]
    assert all(r["settings"]["max_policy"] == 2 and r["settings"]["samples"] == 0 and r["settings"]["model"] == str(run)
               for r in rows)
    assert "layout: compact" in capsys.readouterr().err  # the settings line, as a plain evaluation says it
    with run_lock(run):
        assert cli.main(["eval", str(run), "--every-checkpoint", "--max-policy", "2", "--max-env", "2"]) == 1
    assert capsys.readouterr().err.strip().endswith("a run training there, or another curve of it; wait for it to finish")
