"""What `rookworld eval` prints without --json, and what `rookworld grpo --nproc N` refuses before any
worker starts: in-process `cli.main` calls on a tiny model and a few test records."""

import json
import math
from decimal import Decimal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rookworld_lib.chess import evaluate as ev
from rookworld_lib.core.model import GPT, GPTConfig
from rookworld_lib.lab import cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A tiny export (compact layout: our SFT's prompt prefix) in a directory named `tiny-export`."""
    path = tmp_path_factory.mktemp("eval") / "tiny-export"
    torch.manual_seed(0)
    GPT(GPTConfig.preset("tiny", n_layer=1, n_embd=32, n_head=2, block_size=256)).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def test_data(tmp_path_factory):
    """The first 3 policy and env test records and the first 2 mate-in-one test records of the shipped data."""
    path = tmp_path_factory.mktemp("evdata")
    for name in ("policy_test", "env_test"):
        lines = (ROOT / "data" / f"{name}.jsonl").read_text().splitlines(keepends=True)
        (path / f"{name}.jsonl").write_text("".join(lines[:3]))
    mates = [line for line in (ROOT / "data" / "mate_in_one.jsonl").read_text().splitlines(keepends=True)
             if json.loads(line)["split"] == "test"]
    (path / "mate_in_one.jsonl").write_text("".join(mates[:2]))
    return path


def _shown(e: dict) -> str:
    """An estimate from `rookworld eval --json` as the table shows it: rates and shares in percent to one
    decimal, means to 3 significant digits with their bounds to the same decimals, "n/a (n=0)" where
    nothing was scored."""
    if e["n"] == 0:
        return "n/a (n=0)"
    if e["kind"] in ("rate", "share"):
        return f"{100 * e['value']:.1f}% [{100 * e['low']:.1f}, {100 * e['high']:.1f}] (n={e['n']})"
    scale = e["value"] or max(abs(e["low"]), abs(e["high"]))  # a zero value: its bounds' scale
    places = max(0, 2 - Decimal(f"{scale:.2e}").adjusted()) if scale else 3  # the 3rd significant digit's place
    return f"{e['value']:.{places}f} [{e['low']:.{places}f}, {e['high']:.{places}f}] (n={e['n']})"


def _eval_both_ways(capsys, argv: list[str]) -> tuple[dict, list[str]]:
    """`rookworld eval ARGV --json`'s object and `rookworld eval ARGV`'s table lines (both exit 0)."""
    assert cli.main([*argv, "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    assert results.pop("settings")["model"] == argv[1]  # how it was measured, beside the metrics
    assert cli.main(argv) == 0
    cap = capsys.readouterr()
    assert "layout: compact" in cap.err  # the run's layout is said on stderr, not in the table
    return results, cap.out.splitlines()


def _rows(lines: list[str]) -> dict[str, str]:
    """The table's rows: metric name -> the rest of its line (this model's estimate, then the reported figure)."""
    return {line.split()[0]: line.split(None, 1)[1] for line in lines if "/" in line.split(" ", 1)[0]}


def test_eval_text_table_shows_the_json_numbers_for_a_real_model(capsys, tiny_model, test_data):
    """`rookworld eval MODEL` (no --json) end to end on an untrained tiny model, one record per suite:
    the table has one row per metric of the --json object, each showing the same estimate. An untrained
    model gets every rate 0 of 1, whose Wilson 95% interval is [0, z^2 / (1 + z^2)] = [0, 79.3%] (z = 1.96);
    cp_loss has no legal best move to average over (null in the JSON, n/a in the table)."""
    argv = ["eval", str(tiny_model), "--data-dir", str(test_data), "--max-policy", "1", "--max-env", "1",
            "--max-mate", "1", "--selfplay-games", "0", "--samples", "0", "--device", "cpu"]
    results, lines = _eval_both_ways(capsys, argv)
    assert lines[0].split() == ["tiny-export", "reported"], lines[0]  # the model directory's name heads its column
    rows = _rows(lines)
    assert sorted(rows) == sorted(results), (sorted(rows), sorted(results))
    for metric, e in results.items():
        assert rows[metric].startswith(_shown(e)), (metric, e, rows[metric])
    assert rows["policy/valid"].startswith("0.0% [0.0, 79.3] (n=1)"), rows["policy/valid"]
    assert rows["mate_in_one/accuracy"] == "0.0% [0.0, 79.3] (n=1)    13.7%"  # RookWorld-LM's reported 13.7%
    assert results["policy/cp_loss"]["value"] is None and rows["policy/cp_loss"].strip() == "n/a (n=0)"
    assert "tiny-export: estimate [95% interval] (n = records scored)" in lines


def test_eval_text_table_shows_distinct_rates_where_they_are(capsys, monkeypatch, tiny_model, test_data):
    """The same, with the decoding canned so that the rates differ (an all-zero table would not show a
    row printing another metric's value): of the 3 policy records the first is answered with its label,
    the second with its label's second move as B:, the third not at all; the env records 1 and 2 with
    their labels, the third not. Rates by hand (Wilson, z = 1.96): 2 of 3 is 66.7% [20.8, 93.9], 1 of 3
    is 33.3% [6.1, 79.2]."""
    labels = {}
    for name in ("policy_test", "env_test"):
        for i, line in enumerate((test_data / f"{name}.jsonl").read_text().splitlines()):
            rec = json.loads(line)
            text = rec["completion"]
            if rec["task"] == "P" and i == 1:
                text = text.rsplit(" B: ", 1)[0] + f" B: {rec['moves'][1]}"  # legal, not the best move
            labels[rec["prompt"]] = text if i < 2 else ""
    assert len(labels) == 6

    def complete(model, prompts, cfg, samples=0):
        return [labels[p] for p in prompts]

    monkeypatch.setattr(ev, "complete", complete)
    argv = ["eval", str(tiny_model), "--data-dir", str(test_data), "--max-policy", "3", "--max-env", "3",
            "--max-mate", "0", "--selfplay-games", "0", "--samples", "0", "--device", "cpu"]
    results, lines = _eval_both_ways(capsys, argv)
    rows = _rows(lines)
    assert sorted(rows) == sorted(results) and "mate_in_one/accuracy" not in rows  # --max-mate 0: no suite
    for metric, e in results.items():
        assert rows[metric].startswith(_shown(e)), (metric, e, rows[metric])
    two_of_three, one_of_three = "66.7% [20.8, 93.9] (n=3)", "33.3% [6.1, 79.2] (n=3)"
    assert rows["policy/valid"].strip() == two_of_three
    assert rows["policy/legal_best_move"].strip() == two_of_three
    assert rows["policy/best_move_accuracy"].strip() == one_of_three
    assert rows["env/next_fen_exact"] == f"{two_of_three}    99.6%"  # RookWorld-LM's reported 99.6%
    assert math.isclose(results["policy/valid"]["value"], 2 / 3)


# --- rookworld grpo --nproc N: what every worker would refuse is refused once, before torchrun starts ---

def _grpo_argv(tmp_path: Path, *extra: str) -> list[str]:
    # --layout given: the pre-start check needs no model directory (none exists at --init-from)
    return ["grpo", "--nproc", "2", "--init-from", str(tmp_path / "no-model"), "--out", str(tmp_path / "out"),
            "--layout", "compact", "--device", "cpu", *extra]


@pytest.fixture
def launches(monkeypatch):
    """The commands torchrun would have been started with (none is started: a stand-in process exits 0)."""
    started = []

    class Done:
        def __init__(self, cmd, **kw):
            started.append(cmd)

        def wait(self):
            return 0

    monkeypatch.setattr(subprocess, "Popen", Done)
    return started


@pytest.mark.parametrize("extra, nproc, message", [
    (["--dynamic-sampling"], "2", "GRPOTrainConfig.dynamic_sampling (--dynamic-sampling) is not supported with more "
                                  "than one process (2): the processes would hold batches of unequal size"),
    # 8 prompts x 4 completions (the defaults) = 32 completions a step, split over 2, but minibatches of 3
    (["--minibatch-size", "3"], "2", "GRPOTrainConfig.minibatch_size (--minibatch-size) must be a multiple of the "
                                     "number of processes (2), got 3"),
    # minibatches of 6 split over 3, but the 32 completions a step do not (an option the command was not given)
    (["--minibatch-size", "6"], "3", "GRPOTrainConfig.prompts_per_step (--prompts-per-step, not given) times "
                                     "group_size must be a multiple of the number of processes (3), got 8 x 4 = 32"),
], ids=["dynamic-sampling", "minibatch-not-split", "completions-not-split"])
def test_grpo_nproc_refuses_unsplittable_settings_before_starting_workers(capsys, tmp_path, launches, extra,
                                                                          nproc, message):
    """`rookworld grpo --nproc N` with settings no worker could run: exit status 1, the one line
    `rookworld grpo: error: <why>` on stderr, no torchrun started and no output directory made."""
    argv = _grpo_argv(tmp_path, *extra)
    argv[argv.index("--nproc") + 1] = nproc
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err == f"rookworld grpo: error: {message}\n", err
    assert launches == [], f"torchrun was started: {launches}"
    assert not (tmp_path / "out").exists()


def test_grpo_nproc_starts_torchrun_when_the_settings_split(capsys, tmp_path, launches):
    """The control for the refusals above: minibatches of 4 and 32 completions split over 2 processes, so
    the same command starts torchrun once, with 2 processes per node and the command's own options."""
    argv = _grpo_argv(tmp_path, "--minibatch-size", "4")
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert len(launches) == 1, launches
    cmd = launches[0]
    assert "--nproc_per_node=2" in cmd and "--nproc" not in cmd
    assert cmd[cmd.index("grpo") + 1:] == argv[3:], cmd  # everything after `grpo --nproc 2`, unchanged


def test_a_folder_that_is_no_gpt2_is_named_so_before_any_layout_is_read_from_it(tmp_path, capsys):
    """A Llama folder: grpo first said its layout was "taken as an original RookWorld model", then
    refused it; the refusal is now the only line, and nothing is written."""
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    assert cli.main(["grpo", "--init-from", str(tmp_path / "llama"), "--out", str(tmp_path / "o"), "--steps", "1"]) == 1
    out = capsys.readouterr()
    assert out.err.strip() == f"rookworld grpo: error: {tmp_path / 'llama'}/config.json: model_type is 'llama', expected 'gpt2'"
    assert not (tmp_path / "o").exists()


def test_a_grpo_resume_under_another_layout_names_the_layout_and_the_option_that_gives_it_back(tmp_path, capsys,
                                                                                              tiny_model):
    """--layout rewrites every prompt: the refusal said "prompts: 'another prompt set' -> 'this data'"; the
    layout the model records (GPT.meta) is now kept in the checkpoint and named, with the option."""
    for name in ("policy_train", "env_train"):
        lines = (ROOT / "data" / f"{name}.jsonl").read_text().splitlines(keepends=True)
        (tmp_path / f"{name}.jsonl").write_text("".join(lines[:4]))
    argv = ["grpo", "--init-from", str(tiny_model), "--data-dir", str(tmp_path), "--out", str(tmp_path / "g"),
            "--prompts-per-step", "2", "--group-size", "2", "--minibatch-size", "4", "--max-new-tokens", "4",
            "--no-progress", "--report-to", "none", "--device", "cpu"]
    assert cli.main([*argv, "--steps", "1"]) == 0
    assert cli.main([*argv, "--steps", "2"]) == 0  # the export (it records the rollout temperature) changes nothing
    capsys.readouterr()
    assert cli.main([*argv, "--steps", "3", "--layout", "original"]) == 1
    err = capsys.readouterr().err.strip()
    assert "other settings (meta.layout: 'compact' -> 'original')" in err and "prompt set" not in err, err
    assert err.endswith("; as before: --layout compact"), err


def test_the_rookworld_process_skips_the_collectors_teardown_and_in_process_calls_do_not():
    """`main()` as the process (argv None) ends with one collection and gc.freeze (docs/perf.md: the
    teardown's collector passes cost about 1.2 s a command); `main([...])` in a caller's process, as here,
    freezes nothing, so the caller's garbage is still collected."""
    import gc

    frozen = gc.get_freeze_count()
    assert cli.main(["--version"]) == 0 and gc.get_freeze_count() == frozen
    code = ("import gc, sys; from rookworld_lib.lab.cli import main; sys.argv = ['rookworld', '--version']; "
            "code = main(); print(gc.get_freeze_count() > 0, gc.garbage == []); sys.exit(code)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.split("\n")[-2] == "True True", done.stdout + done.stderr
