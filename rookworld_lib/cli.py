"""The `rookworld` command: one subcommand per stage of the workflow.

Each subcommand lives in the module that does the work, as `cli(argv) -> int` with its own
argparse parser (so `rookworld <sub> --help` is that module's help). This file only dispatches,
and imports a module only when its subcommand runs, so `rookworld --help` stays fast.
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {
    "datagen": ("rookworld_lib.data", "generate Stockfish-labelled P:/A: data and eval sets"),
    "convert": ("rookworld_lib.convert", "convert original RookWorld data (text, JSON lines, Parquet, Arrow) into records"),
    "sft": ("rookworld_lib.train_sft", "supervised pretraining on task text"),
    "grpo": ("rookworld_lib.train_grpo", "GRPO with verifiable chess rewards"),
    "eval": ("rookworld_lib.evaluate", "evaluate a checkpoint on held-out chess tasks"),
    "bench": ("rookworld_lib.bench", "side-by-side speed benchmarks against transformers/TRL"),
    "run": ("rookworld_lib.pipeline", "execute the numbered notebooks headless into runs/<timestamp>/"),
}


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = ["usage: rookworld <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {doc}" for name, (_, doc) in SUBCOMMANDS.items()]
    lines += ["", "`rookworld <command> --help` describes each command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"rookworld: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    try:
        return int(module.cli(rest) or 0)
    except Exception as exc:
        if not isinstance(exc, user_facing_errors()):
            raise
        # These errors already say what is wrong and how to fix it; a traceback would bury that.
        print(f"rookworld {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def user_facing_errors() -> tuple[type[Exception], ...]:
    """Errors whose message names the problem and its fix (bad input, missing files or engine)."""
    from .checkpoint import CheckpointError
    from .checkpoint_hf import CheckpointFormatError
    from .data import DataFormatError
    from .engine import StockfishNotFoundError
    from .nbparams import ParameterError
    from .tokenizer import TokenizerFileError

    return (TokenizerFileError, StockfishNotFoundError, DataFormatError, CheckpointError,
            CheckpointFormatError, ParameterError)


if __name__ == "__main__":
    raise SystemExit(main())
