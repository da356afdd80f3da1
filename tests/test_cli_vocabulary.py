"""Issue 29, item 4: one command-line vocabulary across the `rookworld` subcommands.

One table: each subcommand's `--help` as a user reads it. Every subcommand that writes a folder
names it `--out` (the old `--out-dir` still works, with a line saying the new name); every one that
runs a model takes `--device`, defaulting to auto; no help line names an internal or states two
defaults; `rookworld --version` answers; datagen's default output is not the shipped data set.
"""

from __future__ import annotations

import re

import pytest

from rookworld_lib import __version__
from rookworld_lib.core.paths import DATA_DIR
from rookworld_lib.lab.cli import SUBCOMMANDS, main

OUT = {"datagen", "convert", "sft", "grpo", "run", "bench"}  # bench: --out is its JSON result file
DEVICE = {"sft", "grpo", "eval", "bench"}
INTERNALS = ("see class docstring", "LOSS_IMPLS", "ref_logprobs", "COMPLETION_BUDGET", "rookworld_lib.")


def help_text(capsys, command: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def options(text: str) -> dict[str, str]:
    """{first flag: its whole entry (flags and help) on one line} for each option of a --help text."""
    blocks: list[list[str]] = []
    for line in text.split("\noptions:\n", 1)[1].splitlines():
        if line.startswith("  -"):
            blocks.append([line])
        elif line.startswith("    ") and blocks:
            blocks[-1].append(line)
    return {b[0].split()[0].rstrip(","): " ".join(" ".join(b).split()) for b in blocks}


def test_every_subcommand_is_in_the_table():
    assert set(SUBCOMMANDS) == OUT | DEVICE | {"run"}


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_help_speaks_one_vocabulary(capsys, command):
    text = help_text(capsys, command)
    opts = options(text)
    assert ("--out" in opts) == (command in OUT), f"{command}: output flag"
    assert "--out-dir" not in text, f"{command}: the deprecated --out-dir is listed"
    if command in DEVICE:
        assert "--device" in opts and re.search(r"default: '?auto", opts["--device"]), f"{command}: {opts.get('--device')}"
    fields = {"out_dir" if flag == "--out" else flag[2:].replace("-", "_") for flag in opts}
    for flag, doc in opts.items():
        assert len(re.findall(r"default", doc, re.I)) <= 1, f"{command} {flag}: two defaults: {doc}"
        assert not [w for w in INTERNALS if w in doc], f"{command} {flag} names an internal: {doc}"
        # an option's help names the others as the user types them (--val-fraction), not as Python does
        python_names = set(re.findall(r"(?<!'s )(?<![\w.`'-])([a-z]+(?:_[a-z]+)+)(?![\w`])", doc.split(" ", 1)[1]))
        assert not python_names & fields - {"sum_then_normalize", "normalize_then_sum"}, f"{command} {flag}: {doc}"


def test_the_old_output_flag_still_works_and_says_the_new_one(capsys):
    from rookworld_lib.chess import training

    args = training.build_grpo_parser().parse_args(["--init-from", "m", "--out-dir", "x"])
    assert args.out_dir == "x" and "--out-dir is deprecated, use --out" in capsys.readouterr().err
    assert training.build_sft_parser().parse_args(["--out", "y"]).out_dir == "y"


def test_version(capsys):
    assert main(["--version"]) == 0 and capsys.readouterr().out.strip() == f"rookworld {__version__}"


def test_help_on_a_command_is_that_commands_help(capsys):
    with pytest.raises(SystemExit) as done:
        main(["help", "grpo"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("usage: rookworld grpo")
    assert main(["help"]) == 0 and "commands:" in capsys.readouterr().out


def test_datagen_writes_elsewhere_than_the_shipped_set_by_default():
    from rookworld_lib.chess.datagen import DatagenConfig

    assert DatagenConfig().out_dir != str(DATA_DIR) and DatagenConfig().out_dir.startswith(str(DATA_DIR))


def test_an_error_names_the_option_in_either_spelling_and_an_unknown_command_is_a_usage_error(capsys):
    from rookworld_lib.lab.cli import with_flag

    for argv in (["--steps", "-5"], ["--steps=-5"]):
        assert with_flag("GRPOTrainConfig.steps must be an integer >= 1, got -5", argv) == \
            "GRPOTrainConfig.steps (--steps) must be an integer >= 1, got -5"
    assert main(["frobnicate"]) == 2  # argparse's status for a command line it cannot use
    assert "unknown command 'frobnicate'" in capsys.readouterr().err
    assert main(["help", "frobnicate"]) == 2  # not the general usage with status 0
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--help"], ["sft", "--help"]])
def test_help_into_a_pipe_its_reader_closed_ends_quietly(argv):
    """`rookworld --help | head -1`: the reader closes the pipe before the help is written; no
    BrokenPipeError traceback (unbuffered output, as where PYTHONUNBUFFERED=1 is set, hits it at once)."""
    import os
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "rookworld_lib.lab.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    proc.stdout.close()  # as `head` does once it has its line; here before the child writes a byte: every time
    err = proc.stderr.read().decode()
    proc.wait(60)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
