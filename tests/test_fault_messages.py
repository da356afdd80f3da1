"""Issue 18, item 8: every error a user can cause ends in one line, exit status 1 (130 for Ctrl-C),
and no traceback; `eval --json` is strict JSON.

One table, one test: each row is a `rookworld` command line, a set-up that breaks something, the
substring the one error line must hold and the exit status. Every row runs as a user runs it, in
its own process (`rookworld_lib.lab.cli.main`, what the `rookworld` console script calls). Faults
a test cannot make for real here (a full disk, an unwritable directory as root, running out of
memory) are simulated in that process: `_inject_main` (or this file, run as a script) applies the named
injection and then calls `rookworld_lib.lab.cli.main`. The processes are forked from a server that has
torch and the library imported (forked_child.ForkedChild): a fresh interpreter spent ~4 s importing.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from forked_child import ForkedChild, cli_main

from rookworld_lib.chess import engine

pytestmark = pytest.mark.fault
ROOT = Path(__file__).resolve().parent.parent
TINY = {"n_layer": 1, "n_embd": 32, "n_head": 2}
HEAVY = os.environ.get("ROOKWORLD_HEAVY") == "1"
CUDA = torch.cuda.is_available()
TIMEOUT = 240  # per row; a row that hangs fails instead of stalling the suite


# =====================================================================================
# The table
# =====================================================================================

@dataclass
class Row:
    id: str
    argv: list[str]  # after `rookworld`; {name} is replaced by the fixture paths (see `world`)
    expect: str  # substring of the one error line ({name} replaced too); "" for none
    code: int = 1
    setup: Callable[[dict], None] | None = None  # breaks something in the world before the run
    inject: str | None = None  # a fault simulated inside the process (see INJECTIONS)
    interrupt: bool | int = False  # send SIGINT (or this signal) once training has written a metrics line
    check: Callable[[dict, subprocess.CompletedProcess], None] | None = None  # more assertions
    marks: list = field(default_factory=list)


def sft(*extra: str, out: str = "{tmp}/run") -> list[str]:
    """A one-step SFT run of a tiny model (from scratch unless --init-from) on a few lines of chess text."""
    base = ["sft", "--train-data", "{texts}", "--block-size", "32", "--batch-size", "2",
            "--max-steps", "1", "--warmup-steps", "0", "--eval-interval", "0",
            *(() if "--val-data" in extra else ("--val-fraction", "0")),  # void beside --val-data: refused
            "--device", "cpu", "--no-progress", "--no-export-hf", "--out", out]
    if "--init-from" not in extra:
        base += ["--model", "tiny"]
        for k, v in TINY.items():
            base += ["--model-overrides", f"{k}={v}"]
    return base + list(extra)


def run_p(only: str, name: str, value: str) -> list[str]:
    """`rookworld run` of the notebooks `only` names (numbers, space-separated) with one -p NAME VALUE."""
    return ["run", "--out", "{tmp}/runs", "--only", *only.split(), "-p", name, value]


def grpo(init: str, *extra: str) -> list[str]:
    return ["grpo", "--init-from", init, "--out", "{tmp}/grpo", "--device", "cpu", *extra]


def truncate_weights(w: dict) -> None:
    shutil.copytree(w["model"], w["tmp"] / "trunc")
    weights = w["tmp"] / "trunc" / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)


def break_config(w: dict) -> None:
    shutil.copytree(w["model"], w["tmp"] / "badjson")
    (w["tmp"] / "badjson" / "config.json").write_text('{"n_layer": \n')


def out_dir_is_a_file(w: dict) -> None:
    (w["tmp"] / "run").write_text("not a directory\n")


def read_only_dir(w: dict) -> None:
    (w["tmp"] / "ro").mkdir()
    os.chmod(w["tmp"] / "ro", 0o555)


def empty_train_file(w: dict) -> None:
    (w["tmp"] / "empty.jsonl").write_text("")


def strict_json_with_null(w: dict, proc: subprocess.CompletedProcess) -> None:
    def refuse(name):
        raise AssertionError(f"non-standard JSON constant {name} in eval --json output")

    results = json.loads(proc.stdout.strip().splitlines()[-1], parse_constant=refuse)
    assert results["policy/cp_loss"]["value"] is None  # no centipawn loss over no legal best moves


def kept(path: Path, text: str) -> None:
    assert path.read_text() == text, f"{path} was replaced"


def no_run_directory(w: dict, proc: subprocess.CompletedProcess) -> None:
    assert not (w["tmp"] / "runs").exists() or not any((w["tmp"] / "runs").iterdir())


ROWS = [
    # --- Ctrl-C
    Row("sft-ctrl-c", sft(out="{tmp}/run-ci") + ["--max-steps", "100000", "--checkpoint-interval", "50"],
        "rookworld sft: interrupted (Ctrl-C); the same command resumes", 130, interrupt=True),
    # SIGTERM (timeout, a scheduler) is named as such: it used to be reported as a Ctrl-C
    Row("sft-sigterm", sft(out="{tmp}/run-ci") + ["--max-steps", "100000", "--checkpoint-interval", "50"],
        "rookworld sft: interrupted (SIGTERM); the same command resumes", 130, interrupt=signal.SIGTERM),
    Row("sft-nproc-2-ctrl-c", sft("--nproc", "2", out="{tmp}/run-ci") + ["--max-steps", "100000"],
        "rookworld sft: interrupted", 130, interrupt=True,
        marks=[pytest.mark.heavy, pytest.mark.skipif(not HEAVY, reason="heavy: set ROOKWORLD_HEAVY=1")]),
    # --- loading a Hugging Face model directory
    Row("sft-truncated-safetensors", sft("--init-from", "{tmp}/trunc"),
        "{tmp}/trunc/model.safetensors: truncated or corrupt", setup=truncate_weights),
    Row("grpo-truncated-safetensors", grpo("{tmp}/trunc", "--steps", "1"),
        "{tmp}/trunc/model.safetensors: truncated or corrupt", setup=truncate_weights),
    Row("eval-truncated-safetensors", ["eval", "{tmp}/trunc", "--data-dir", "{evdata}", "--selfplay-games", "0"],
        "{tmp}/trunc/model.safetensors: truncated or corrupt", setup=truncate_weights),
    Row("eval-invalid-config-json", ["eval", "{tmp}/badjson", "--data-dir", "{evdata}", "--selfplay-games", "0"],
        "{tmp}/badjson/config.json: not valid JSON", setup=break_config),
    Row("grpo-invalid-config-json", grpo("{tmp}/badjson", "--steps", "1"),
        "{tmp}/badjson/config.json: not valid JSON", setup=break_config),
    Row("sft-invalid-config-json", sft("--init-from", "{tmp}/badjson"),
        "{tmp}/badjson/config.json: not valid JSON", setup=break_config),
    # --- the out-dir: a file, unwritable, a full disk
    Row("sft-out-dir-is-a-file", sft(), "{tmp}/run is a file, not a directory", setup=out_dir_is_a_file),
    Row("sft-default-refused-names-its-option", ["sft", "--model", "tiny", "--max-steps", "20", "--train-data", "{texts}",
                                                 "--out", "{tmp}/run"],
        "SFTConfig.warmup_steps (--warmup-steps, not given) must be <= max_steps (20), got 100"),
    Row("run-out-dir-is-a-file", ["run", "--out", "{tmp}/run", "--only", "01"], "{tmp}/run is a file, not a directory",
        setup=out_dir_is_a_file),
    Row("bench-out-below-a-file", ["bench", "--quick", "--out", "{tmp}/run/bench.json"],
        "--out {tmp}/run/bench.json: {tmp}/run is a file, not a directory", setup=out_dir_is_a_file),
    Row("bench-negative-threads", ["bench", "--quick", "--threads", "-2"], "--threads must be from 0 to 256"),
    # a file that is no earlier bench result is kept (the bench replaced it with its JSON)
    Row("bench-out-an-other-file", ["bench", "--quick", "--out", "{tmp}/run"],
        "--out {tmp}/run exists and is no bench result (a JSON object with 'grpo_step'): the bench would replace it",
        setup=out_dir_is_a_file, check=lambda w, proc: kept(w["tmp"] / "run", "not a directory\n")),
    # an empty path is the current folder to Path(""): each read or wrote there, or fell back to the shipped data
    *(Row(f"{argv[0]}-empty-{name.strip('-')}", argv,
          f"error: argument {name}: an empty path names no file or folder", 2, check=no_run_directory)
      for argv, name in ((sft("--train-data", ""), "--train-data"), (grpo("", "--steps", "1"), "--init-from"),
                         (grpo("{model}", "--data-dir", ""), "--data-dir"), (["eval", "", "--max-policy", "1"], "model"),
                         (["eval", "{model}", "--data-dir", ""], "--data-dir"), (["run", "--out", ""], "--out"),
                         (["run", "--resume", ""], "--resume"), (["bench", "--quick", "--out", ""], "--out"))),
    # a folder name that is not UTF-8 text (bytes b"\xff"): the run trained, then stopped where TensorBoard's writer
    # first wrote it, with "'utf-8' codec can't encode character '\udcff'" and no path named
    *(Row(f"{argv[0]}-out-not-utf8", argv, "error: argument --out: '{tmp}/run\\udcff' must be UTF-8 text", 2,
          check=lambda w, proc: [] == [p for p in w["tmp"].iterdir() if p.name.startswith("run")])
      for argv in (sft(out="{tmp}/run\udcff"), ["run", "--out", "{tmp}/run\udcff", "--only", "01"])),
    # `--train-data` with no file trained on the shipped data; `--only ''` ran every notebook, training included
    Row("sft-train-data-without-a-file", sft("--train-data"), "argument --train-data: expected at least one argument", 2),
    Row("run-parameter-twice", ["run", "--out", "{tmp}/runs", "--only", "01", "-p", "seed", "1", "-p", "seed", "2"],
        "-p seed is given twice; give each parameter once", check=no_run_directory),  # the last one won silently
    Row("run-empty-only", ["run", "--out", "{tmp}/runs", "--only", ""],
        "argument --only: an empty prefix selects every notebook; give a number such as 01 or 05", 2, check=no_run_directory),
    Row("bench-unknown-device", ["bench", "--quick", "--device", "tpu"], "BenchConfig.device (--device) must be 'auto' or a torch device"),
    Row("eval-unknown-device", ["eval", "{model}", "--data-dir", "{evdata}", "--device", "tpu"],
        "device 'tpu' (--device): must be 'auto' or a torch device"),
    # a device torch names but the loops do not run on (meta: tracebacks in sft, grpo, eval, files left in --out)
    Row("eval-meta-device", ["eval", "{model}", "--data-dir", "{evdata}", "--device", "meta"],
        "device 'meta' (--device): must be 'auto' or a torch device such as 'cpu', 'cuda', 'cuda:1', 'mps'"),
    Row("sft-weight-decay-flipping-signs", sft("--weight-decay", "1e9"),
        "SFTConfig.weight_decay (--weight-decay) must be < 1/lr (1666.67): AdamW scales each weight by 1 - lr*weight_decay"),
    Row("grpo-weight-decay-flipping-signs", grpo("{model}", "--weight-decay", "1e6"),
        "GRPOTrainConfig.weight_decay (--weight-decay) must be < 1/lr (100000)"),
    Row("sft-init-from-a-run-directory", sft("--init-from", "{tmp}/sftrun"),
        "SFTConfig.init_from (--init-from) is a run directory; its model is {tmp}/sftrun/final", setup=lambda w: (
            (w["tmp"] / "sftrun").mkdir(), shutil.copytree(w["model"], w["tmp"] / "sftrun" / "final"))),
    # a bias-free model has no GPT-2 export: refused before training (its final/ could not be loaded back)
    Row("sft-bias-free-model", sft("--model-overrides", "bias=false"),
        "SFTConfig.model_overrides (--model-overrides) must not set bias=False: the run exports GPT-2"),
    Row("sft-grad-accum-past-int64", sft("--grad-accum", str(10**20)),
        "SFTConfig.grad_accum (--grad-accum) must be an integer in 1..65536, got 100000000000000000000"),
    Row("sft-meta-device", sft("--device", "meta"), "SFTConfig.device (--device) must be 'auto' or a torch device",
        check=lambda w, p: _assert_absent(w["tmp"] / "run")),
    Row("grpo-meta-device", grpo("{model}", "--device", "meta"), "GRPOTrainConfig.device (--device) must be 'auto'",
        check=lambda w, p: _assert_absent(w["tmp"] / "grpo")),
    Row("sft-unwritable-out-dir", sft(out="{tmp}/ro/run"), "Permission denied: {tmp}/ro/run", setup=read_only_dir,
        inject="eacces:{tmp}/ro"),
    Row("sft-disk-full-checkpoint", sft(), "No space left on device", inject="enospc-checkpoint",
        check=lambda w, p: _assert_in("could not save checkpoint", p.stderr)),
    Row("sft-disk-full-export", sft("--export-hf"), "No space left on device: {tmp}/run/final/model.safetensors",
        inject="enospc-export"),
    # --- bad settings
    Row("sft-override-dropout-abc", sft("--model-overrides", "dropout=abc"), "dropout must be a finite number in [0.0, 1.0)"),
    Row("sft-override-vocab-size-10", sft("--model-overrides", "vocab_size=10"), "must not change vocab_size"),
    Row("sft-model-and-init-from", sft("--init-from", "{model}", "--model", "gpt2"),
        "--model gpt2 picks the model of a scratch start; --init-from trains the one in {model}"),
    Row("sft-init-from-another-shape", sft("--init-from", "{model}", "--model-overrides", "n_layer=12"),
        "model_overrides (--model-overrides) sets n_layer=12, but the model in {model} has n_layer=1"),
    Row("sft-on-the-test-split", sft("--train-data", "{evdata}/policy_test.jsonl"),
        "{evdata}/policy_test.jsonl:1: a 'test' record in the training data"),
    Row("sft-nproc-abc", sft("--nproc", "abc"), "--nproc must be a whole number of processes"),
    Row("sft-nproc-negative", sft("--nproc", "-2"), "--nproc must be >= 0"),
    Row("grpo-nproc-abc", grpo("{model}", "--nproc", "abc"), "--nproc must be a whole number of processes"),
    Row("sft-nproc-3-batch-8", sft("--nproc", "3", "--batch-size", "8"), "--batch-size (8) must be a multiple of --nproc (3)"),
    Row("sft-huge-batch", sft("--batch-size", "100000"), "tokens per micro-batch is more than the"),
    Row("sft-out-of-memory", sft(), "out of memory", inject="oom"),
    # --- training data that cannot be trained on, named before a step is taken
    Row("sft-train-data-is-a-directory", sft("--train-data", "{evdata}"),
        "SFTConfig.train_data (--train-data) names directories, not files: ['{evdata}'] (give the JSONL files in them)"),
    Row("sft-empty-train-file", sft("--train-data", "{tmp}/empty.jsonl"),
        "{tmp}/empty.jsonl: no samples (the file is empty)", setup=empty_train_file),
    Row("sft-mate-in-one-as-val-data", sft("--val-data", "data/mate_in_one.jsonl"),  # cwd: the repository root
        "data/mate_in_one.jsonl: holds 'M1' records (an evaluation set), not P:/A: training samples"),
    Row("sft-eval-without-val-data", sft("--eval-interval", "1"),
        "SFTConfig.eval_interval (--eval-interval) is 1, but there is no val data to measure on: set val_data or a "
        "val_fraction > 0 (or pass val_texts), or eval_interval 0"),
    Row("grpo-without-out", ["grpo", "--init-from", "{model}", "--device", "cpu"], "give an output directory: --out DIR"),
    # --- eval --json: strict JSON
    Row("eval-json-strict", ["eval", "{model}", "--data-dir", "{evdata}", "--max-policy", "1", "--selfplay-games", "0",
                             "--json"], "", 0, check=strict_json_with_null),
    # --- the notebook pipeline
    Row("run-misspelled-parameter", run_p("01", "sft_stepz", "5"), "['sft_stepz'] are declared by none of the selected notebooks", check=no_run_directory),
    Row("run-no-notebook-selected", ["run", "--out", "{tmp}/runs", "--only", "99"], "no notebooks selected",
        check=no_run_directory),
    Row("run-parameter-of-wrong-type", ["run", "--out", "{tmp}/runs", "-p", "sft_steps", "abc"],
        "notebook parameter 'sft_steps' must be int or NoneType, got str 'abc'", check=no_run_directory),
    Row("run-parameter-out-of-range", run_p("00", "workers", "0"), "00_data_and_rewards.ipynb: notebook parameter 'workers' must be >= 1, got 0", check=no_run_directory),
    Row("run-gpu-profile-without-cuda", ["run", "--out", "{tmp}/runs", "--profile", "gpu"],
        "--profile gpu trains on cuda, and torch sees no CUDA device here; choose --profile cpu",
        check=no_run_directory, marks=[pytest.mark.skipif(CUDA, reason="this machine has CUDA")]),
    Row("run-gpu-notebook-profile-without-cuda", ["run", "--out", "{tmp}/runs", "--profile", "cpu", "--only", "05",
                                                  "-p", "profile", "gpu"],
        "-p profile gpu trains on cuda, and torch sees no CUDA device here; leave -p profile out",
        check=no_run_directory, marks=[pytest.mark.skipif(CUDA, reason="this machine has CUDA")]),
    # the cuda comes from --profile gpu, whatever -p profile names: it blamed -p profile cpu and said to pass it
    Row("run-gpu-profile-with-a-cpu-notebook-profile", ["run", "--out", "{tmp}/runs", "--profile", "gpu", "--only", "05",
                                                        "-p", "profile", "cpu"],
        "--profile gpu trains on cuda, and torch sees no CUDA device here; choose --profile cpu",
        check=no_run_directory, marks=[pytest.mark.skipif(CUDA, reason="this machine has CUDA")]),
    Row("run-run-dir-that-is-no-folder", run_p("06", "run_dir", "{tmp}/nope"), "notebook parameter 'run_dir' must name an existing folder, got '{tmp}/nope' (no such folder)", check=no_run_directory),
    Row("run-unknown-model-preset", run_p("02", "preset", "bogus"), "notebook parameter 'preset' must be one of [None, ", check=no_run_directory),
    Row("run-resume-with-other-settings", ["run", "--resume", "{tmp}/runs", "-p", "sft_steps", "5"],
        "--resume takes the run's own settings (its run.json); drop -p", check=no_run_directory),
    Row("run-resume-of-no-run", ["run", "--resume", "{tmp}"],
        "--resume {tmp}: no readable run.json with a run's plan there", check=no_run_directory),
    Row("run-figures-dir-parameter", run_p("01", "figures_dir", "figs"), "-p figures_dir: rookworld run writes the figures into the run folder's figures/", check=no_run_directory),
    Row("run-run-dir-parameter-with-training", run_p("05 06", "run_dir", "elsewhere"), "-p run_dir: notebook 05 trains into the run folder", check=no_run_directory),
    Row("run-none-parameter", run_p("01", "n_samples", "None"), "notebook parameter 'n_samples' must be int, got NoneType None", check=no_run_directory),
    Row("run-device-parameter-without-cuda", run_p("03", "device", "cuda"),
        "-p device 'cuda': torch sees no CUDA device here; pass -p device cpu", check=no_run_directory,
        marks=[pytest.mark.skipif(CUDA, reason="this machine has CUDA")]),
    # a value past what the notebook's own data hold: refused before notebook 05 trains (it failed in 06, after)
    Row("run-position-past-the-test-positions", run_p("05 06", "position", "99999"), "notebook parameter 'position' must be <= 729, got 99999", check=no_run_directory),
    # a seed past the configs' range: SFT refused it after the run folder was made (the check cells had no bound)
    Row("run-seed-past-its-range", run_p("05", "seed", "-1"), "notebook parameter 'seed' must be >= 0, got -1", check=no_run_directory),
    Row("run-seed-past-numpys-bound", run_p("01", "seed", "5000000000"), "notebook parameter 'seed' must be <= 4294967295, got 5000000000", check=no_run_directory),
    Row("run-nan-parameter", run_p("03", "sgd_lr", "NaN"), "notebook parameter 'sgd_lr' must be a finite number, got nan", check=no_run_directory),
    # --- GRPO's settings: checked before the model is read, and before anything is written
    Row("grpo-bad-setting-before-missing-model", grpo("{tmp}/missing", "--steps", "-5"),
        "GRPOTrainConfig.steps (--steps) must be an integer >= 1, got -5"),
    Row("grpo-seed-beyond-its-range", grpo("{model}", "--steps", "1", "--seed", str(2**64)),
        f"GRPOTrainConfig.seed (--seed) must be an integer in 0..4294967295, got {2**64}",
        check=lambda w, p: _assert_absent(w["tmp"] / "grpo")),
    Row("grpo-completion-beyond-the-block", grpo("{model}", "--steps", "1", "--max-new-tokens", "100000"),
        "max_new_tokens (100000) - 1 = ", check=lambda w, p: _assert_absent(w["tmp"] / "grpo")),
]


def _assert_absent(path: Path) -> None:
    assert not path.exists(), sorted(p.name for p in path.iterdir())


def _assert_in(needle: str, text: str) -> None:
    assert needle in text, (needle, text[-2000:])


# =====================================================================================
# The test
# =====================================================================================

@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> dict:
    """A tiny Hugging Face model (block_size 256, so a P: prompt fits), chess text lines, one
    policy test record: made once for every row."""
    sys.path.insert(0, str(Path(__file__).parent))
    from sft_helpers import TEXTS

    from rookworld_lib.core.model import GPT, GPTConfig

    base = tmp_path_factory.mktemp("fault-messages")
    GPT(GPTConfig.preset("tiny", **TINY, block_size=256)).save_pretrained(base / "model")
    (base / "texts.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in TEXTS))
    (base / "evdata").mkdir()
    first = (ROOT / "data" / "policy_test.jsonl").read_text().splitlines()[0]
    (base / "evdata" / "policy_test.jsonl").write_text(first + "\n")
    return {"model": base / "model", "texts": base / "texts.jsonl", "evdata": base / "evdata", "base": base}


def fill(text: str, w: dict) -> str:
    return text.format(**{k: str(v) for k, v in w.items()})


def world(row: Row, shared: dict) -> dict:
    """The row's own directory ({tmp}), broken by its set-up."""
    w = {**shared, "tmp": shared["base"] / "rows" / row.id}
    w["tmp"].mkdir(parents=True)
    if row.setup:
        row.setup(w)
    return w


def child_env() -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("ROOKWORLD_TRACEBACK", None)
    return env


def shares_a_process(row: Row) -> bool:
    """Rows without a simulated fault or a signal run one after another in one process: a fresh
    interpreter per row would spend most of the suite importing torch."""
    skipped = any(m.name == "xfail" and m.kwargs.get("run") is False for m in row.marks)
    return not (row.inject or row.interrupt or skipped or any(m.name == "heavy" for m in row.marks))


@pytest.fixture(scope="module")
def batch(shared) -> dict:
    """{row id: (world, CompletedProcess)} for the rows that share a process (see `shares_a_process`):
    this file as a script with --batch calls `rookworld_lib.lab.cli.main` for each, its stdout and stderr
    captured at the file-descriptor level."""
    rows = [r for r in ROWS if shares_a_process(r)]
    worlds = {r.id: world(r, shared) for r in rows}
    jobs = [{"id": r.id, "argv": [fill(a, worlds[r.id]) for a in r.argv]} for r in rows]
    jobs_file = shared["base"] / "jobs.json"
    jobs_file.write_text(json.dumps(jobs))
    proc = run(_batch_main, [str(jobs_file)], child_env(), False, None, timeout=TIMEOUT * 3)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((shared["base"] / "jobs.json.results").read_text())
    return {r.id: (worlds[r.id], subprocess.CompletedProcess(jobs[i]["argv"], results[r.id]["code"],
                                                             results[r.id]["out"], results[r.id]["err"]))
            for i, r in enumerate(rows)}


@pytest.mark.parametrize("row", [pytest.param(r, id=r.id, marks=r.marks) for r in ROWS])
def test_one_line_no_traceback(row: Row, shared, request):
    if shares_a_process(row):
        w, proc = request.getfixturevalue("batch")[row.id]
    else:
        w = world(row, shared)
        argv = [fill(a, w) for a in row.argv]
        target, prefix = cli_main, []  # what the `rookworld` console script runs
        if row.inject:
            target, prefix = _inject_main, [fill(row.inject, w)]
        proc = run(target, prefix + argv, child_env(), row.interrupt, w["tmp"] / "run-ci" / "metrics.jsonl")
    err = proc.stderr
    assert "Traceback" not in err, err[-3000:]
    assert proc.returncode == row.code, (proc.returncode, err[-3000:])
    if row.expect:
        expect = fill(row.expect, w)
        lines = [x for x in err.splitlines() if x.startswith(f"rookworld {row.argv[0]}: ")]
        assert len(lines) == 1, err[-3000:]  # one line, said once (not once per torchrun worker)
        assert expect in lines[0], (expect, lines[0])
        assert err.count(expect) == 1, err[-3000:]
    if row.check:
        row.check(w, proc)


def run(target, argv: list[str], env: dict, interrupt: bool, metrics: Path | None,
        timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """target(argv) in a process of its own (forked: see forked_child.py), where SIGINT raises
    KeyboardInterrupt even when a shell that started this test in the background ignores it."""
    cmd = [f"{target.__module__}.{target.__name__}", *argv]
    proc = ForkedChild(target, argv, env=env, cwd=ROOT)
    if interrupt:
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline and not (metrics.exists() and metrics.stat().st_size):
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        proc.send_signal(signal.SIGINT if interrupt is True else interrupt)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"{cmd[2:6]} did not finish in {timeout} s:\n{err[-3000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def test_rows_are_named_once():
    assert len({r.id for r in ROWS}) == len(ROWS)
    assert all(r.argv[0] in ("sft", "grpo", "eval", "run", "bench") for r in ROWS)


# =====================================================================================
# Faults simulated inside the child process (this file run as a script)
# =====================================================================================

def _enospc_checkpoint(_arg: str) -> None:
    """A disk that fills after 4 KiB of a checkpoint file: the write fails with ENOSPC, as the
    kernel reports it (torch's zip writer turns that into 'unexpected pos')."""
    from rookworld_lib.core import checkpoint as ck

    real = ck.atomic_write

    class Full:
        def __init__(self, f):
            self.f, self.n = f, 0

        def write(self, data):
            self.n += len(data)
            if self.n > 4096:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

    def atomic_write(path, write):
        if Path(path).suffix == ".pt":
            return real(path, lambda f: write(Full(f)))
        return real(path, write)

    ck.atomic_write = atomic_write


def _enospc_export(_arg: str) -> None:
    """safetensors on a full disk: the error it raises (seen on a 20 MB tmpfs)."""
    from safetensors import SafetensorError

    from rookworld_lib.core import model

    def save_file(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    model.save_file = save_file


def _eacces(prefix: str) -> None:
    """A directory this user cannot write to. root writes anywhere, so for root mkdir refuses below
    `prefix` as the kernel would refuse another user."""
    if os.geteuid() != 0:
        return
    real = os.mkdir

    def mkdir(path, *args, **kwargs):
        if str(path).startswith(prefix + os.sep):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real(path, *args, **kwargs)

    os.mkdir = mkdir


def _oom(_arg: str) -> None:
    """The forward pass asks for more memory than there is (what a huge batch does), for real."""
    import torch

    from rookworld_lib.core.model import GPT

    def forward(self, *args, **kwargs):
        return torch.empty(10**13)  # 40 TB: the allocator refuses at once

    GPT.forward = forward


INJECTIONS = {"enospc-checkpoint": _enospc_checkpoint, "enospc-export": _enospc_export, "eacces": _eacces,
              "oom": _oom}


def _run_batch(jobs_file: Path) -> None:
    """Run each job's `rookworld` command line in this process, as the console script would,
    with fd 1 and 2 redirected to files; write {id: {code, out, err}} beside the jobs file."""
    import tempfile
    import traceback

    from rookworld_lib.lab.cli import main

    results = {}
    for job in json.loads(jobs_file.read_text()):
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            sys.stdout.flush()
            sys.stderr.flush()
            saved = os.dup(1), os.dup(2)
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            try:
                code = main(job["argv"])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                traceback.print_exc()  # what Python prints for an uncaught exception
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                os.close(saved[0])
                os.close(saved[1])
            out.seek(0)
            err.seek(0)
            results[job["id"]] = {"code": code, "out": out.read(), "err": err.read()}
    Path(f"{jobs_file}.results").write_text(json.dumps(results))


def _batch_main(argv: list[str]) -> None:
    """JOBS_FILE: _run_batch."""
    _run_batch(Path(argv[0]))
    sys.exit(0)


def _inject_main(argv: list[str]) -> None:
    """NAME[:ARG] ARGV...: apply the injection NAME, then `rookworld ARGV...`."""
    name, _, arg = argv[0].partition(":")
    INJECTIONS[name](arg)
    from rookworld_lib.lab.cli import main

    sys.exit(main(argv[1:]))


if __name__ == "__main__":
    if sys.argv[1] == "--batch":
        _batch_main(sys.argv[2:])
    _inject_main(sys.argv[2:])  # --inject NAME[:ARG] ARGV...


# =====================================================================================
# Which errors are the user's (cli.user_error_message), in process
# =====================================================================================

def test_user_errors_get_one_line_and_bugs_keep_their_traceback(monkeypatch, capsys):
    import types

    from rookworld_lib.lab import cli

    assert cli.user_error_message(AttributeError("'NoneType' object has no attribute 'x'")) is None
    assert cli.user_error_message(TypeError("unsupported operand")) is None
    assert cli.user_error_message(KeyError("rng")) is None
    assert cli.user_error_message(ValueError("SFTConfig.lr must be > 0, got -1")) == "SFTConfig.lr must be > 0, got -1"
    assert cli.user_error_message(OSError(errno.ENOSPC, "No space left on device", "/r/final/model.safetensors")
                                  ).startswith("No space left on device: /r/final/model.safetensors")
    assert cli.user_error_message(PermissionError(errno.EACCES, "Permission denied", "/ro/run")
                                  ).startswith("Permission denied: /ro/run")
    assert cli.user_error_message(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 9 "
                                               "bytes")).startswith("out of memory")
    assert cli.user_error_message(RuntimeError("something inside torch")) is None
    oom = RuntimeError("DefaultCPUAllocator: can't allocate memory")
    assert "lower --batch-size" in cli.user_error_message(oom, "sft")
    assert cli.user_error_message(oom, "grpo").endswith(": lower --prompts-per-step, --group-size or --minibatch-size, "
                                                         "or raise --rollout-chunks (prompts sampled at a time), or use a smaller model")

    def raising(exc):
        def run(argv):
            raise exc
        return types.SimpleNamespace(cli=run)

    monkeypatch.setitem(cli.SUBCOMMANDS, "fake", ("fake_module", "a test command"))
    for exc, code in ((KeyboardInterrupt(), 130), (ValueError("bad value\nsecond line"), 1)):
        monkeypatch.setattr(cli.importlib, "import_module", lambda name, exc=exc: raising(exc))
        assert cli.main(["fake"]) == code
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("rookworld fake: "), err
    monkeypatch.setattr(cli.importlib, "import_module", lambda name: raising(AttributeError("a bug")))
    with pytest.raises(AttributeError):
        cli.main(["fake"])
    monkeypatch.setenv(cli.TRACEBACK_ENV, "1")
    monkeypatch.setattr(cli.importlib, "import_module", lambda name: raising(ValueError("shown with its traceback")))
    with pytest.raises(ValueError):
        cli.main(["fake"])


def test_a_dangling_link_for_out_and_a_fifo_for_data_are_named_for_what_they_are(tmp_path, capsys):
    from rookworld_lib.lab import cli

    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    assert cli.main(["convert", str(Path(__file__)), "--out", str(tmp_path / "dangling")]) == 1
    assert capsys.readouterr().err.strip().endswith(f"{tmp_path / 'dangling'} is a symbolic link to nothing (to "
                                                    f"{tmp_path / 'gone'}, missing or a link loop), not a directory")
    os.mkfifo(tmp_path / "fifo.jsonl")
    assert cli.main(["sft", "--model", "tiny", "--out", str(tmp_path / "o"), "--train-data", str(tmp_path / "fifo.jsonl")]) == 1
    assert "(--train-data) names what is not a regular file: " in capsys.readouterr().err


def test_an_interrupted_training_command_says_it_resumes_and_others_do_not(monkeypatch, capsys):
    from rookworld_lib.core import errors

    monkeypatch.delenv(errors.ERRORS_DIR_ENV, raising=False)
    assert errors.report_interrupted("sft") == errors.report_interrupted("datagen") == 128 + 2  # the shell's SIGINT status
    sft_line, datagen_line = capsys.readouterr().err.splitlines()
    assert "resumes from the latest checkpoint" in sft_line and "resumes" not in datagen_line


# Behaviours of lab/cli that no test pinned (mutation round 6, stop 68: each test below is red with its mutant)

def _fake_command(monkeypatch, cli, run):
    monkeypatch.setitem(cli.SUBCOMMANDS, "fake", ("fake_module", "a test command"))
    monkeypatch.setattr(cli.importlib, "import_module", lambda name: types.SimpleNamespace(cli=run))


def _raiser(exc):
    def run(argv):
        raise exc
    return run


def test_ctrl_c_keeps_its_traceback_under_rookworld_traceback(monkeypatch):
    # module doc / README: ROOKWORLD_TRACEBACK=1 shows every traceback
    from rookworld_lib.lab import cli

    _fake_command(monkeypatch, cli, _raiser(KeyboardInterrupt()))
    monkeypatch.setenv(cli.TRACEBACK_ENV, "1")
    with pytest.raises(KeyboardInterrupt):
        cli.main(["fake"])


def test_an_os_error_without_errno_is_a_bug_and_keeps_its_traceback(monkeypatch, capsys):
    # an OSError with no errno names no file problem a user could fix; as a one-line message it would read
    # "error: Success" (os.strerror(0)): it must keep its traceback like any other bug
    from rookworld_lib.lab import cli

    assert cli.user_error_message(OSError("something low-level")) is None
    _fake_command(monkeypatch, cli, _raiser(OSError("something low-level")))
    monkeypatch.delenv(cli.TRACEBACK_ENV, raising=False)
    with pytest.raises(OSError):
        cli.main(["fake"])
    assert "Success" not in capsys.readouterr().err


def test_disk_full_says_what_to_do():
    # README's fault table: "No space left on device: <out>/grpo_metrics.jsonl; free some space (or choose
    # another --out) and run the same command again"
    from rookworld_lib.lab import cli

    msg = cli.user_error_message(OSError(errno.ENOSPC, "No space left on device", "/r/grpo_metrics.jsonl"), "grpo")
    assert msg == ("No space left on device: /r/grpo_metrics.jsonl; free some space (or choose another --out) "
                   "and run the same command again")


def test_resume_options_never_offer_a_value_for_an_on_off_flag():
    # a bool option is --x/--no-x (config.py: "bool -> --x/--no-x"): `--x True` is no command line
    from rookworld_lib.lab import cli

    diff = {"GRPOTrainConfig.lr": (0.003, 0.001), "GRPOTrainConfig.use_kl": (True, False)}
    assert cli.resume_options(diff, "  --lr LR\n  --use-kl, --no-use-kl\n") == "; as before: --lr 0.003"


def test_memory_error_reads_as_out_of_memory():
    # Python's MemoryError is a failed allocation: the one-line out-of-memory advice, not a traceback
    from rookworld_lib.lab import cli

    msg = cli.user_error_message(MemoryError(), "sft")
    assert msg is not None and msg.startswith("out of memory") and "lower --batch-size" in msg


def test_a_file_where_a_directory_is_wanted_is_named(tmp_path):
    # a real ENOTDIR from the OS: opening a path below a regular file
    from rookworld_lib.lab import cli

    (tmp_path / "out").write_text("x")
    with pytest.raises(NotADirectoryError) as info:
        open(tmp_path / "out" / "metrics.jsonl", "w")
    assert info.value.errno == errno.ENOTDIR
    assert cli.user_error_message(info.value) == f"{tmp_path / 'out'} is a file, not a directory"
    with pytest.raises(FileExistsError) as info:  # --out /dev/null: "File exists: /dev/null" said nothing useful
        os.makedirs("/dev/null")
    assert cli.user_error_message(info.value) == "/dev/null is not a directory"


@pytest.mark.parametrize("make_error", [
    pytest.param(lambda tmp: engine.find_stockfish(str(tmp / "no-such-stockfish")), id="stockfish-missing"),
    pytest.param(lambda tmp: (_ for _ in ()).throw(engine.EngineFailedError(
        "Stockfish failed on every attempt during analyse: TimeoutError: no answer within 11.3 s")), id="engine-failed"),
])
def test_a_missing_or_failing_stockfish_ends_the_command_in_one_line(monkeypatch, capsys, tmp_path, make_error):
    # README fault table: Stockfish missing -> "`rookworld datagen` prints it in one line"; a broken
    # Stockfish -> EngineFailedError, "`rookworld datagen` prints one line and exits 1"
    from rookworld_lib.lab import cli

    monkeypatch.delenv(cli.TRACEBACK_ENV, raising=False)
    _fake_command(monkeypatch, cli, lambda argv: make_error(tmp_path))
    assert cli.main(["fake"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rookworld fake: error: Stockfish"), err


def test_the_error_line_a_sigint_and_a_process_outside_our_launcher_get(monkeypatch, capsys):
    """report() writes `rookworld <command>: error: <message>` on stderr; SIGINT reads as "Ctrl-C" (its
    usual sender), other signals by name; a process with a RANK but no $ROOKWORLD_ERRORS_DIR (another
    launcher's worker) prints its line itself."""
    from rookworld_lib.core import errors

    monkeypatch.delenv(errors.ERRORS_DIR_ENV, raising=False)
    monkeypatch.setenv("RANK", "1")
    assert errors.report("sft", "disk   full\n now", 1) == 1
    assert errors.report_interrupted("datagen", "SIGINT") == errors.report_interrupted("datagen", "SIGTERM") == 130
    assert capsys.readouterr().err.splitlines() == ["rookworld sft: error: disk full now",
                                                    "rookworld datagen: interrupted (Ctrl-C)",
                                                    "rookworld datagen: interrupted (SIGTERM)"]
