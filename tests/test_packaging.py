"""environment.yml (conda) and pyproject.toml (pip) must list the same dependencies."""

import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONDA_TO_PIP = {"pytorch": "torch", "python-chess": "chess", "python-kaleido": "kaleido"}
CONDA_ONLY = {"python", "pip", "stockfish"}  # the interpreter, the installer, and the engine binary


def split(spec: str) -> tuple[str, str]:
    m = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", spec)
    return m.group(1).lower(), m.group(2).replace(" ", "")


def test_environment_yml_agrees_with_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pip_specs = dict(split(s) for s in project["dependencies"] + project["optional-dependencies"]["dev"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda_specs = {}
    for item in env["dependencies"]:
        if isinstance(item, str):
            name, ver = split(item)
            if name not in CONDA_ONLY:
                conda_specs[CONDA_TO_PIP.get(name, name)] = ver
    assert "stockfish" in {split(i)[0] for i in env["dependencies"] if isinstance(i, str)}
    assert conda_specs == pip_specs


def test_makefile_pins_cpu_torch_and_ci_calls_make_test():
    assert "torch==2.13.0" in (ROOT / "Makefile").read_text()
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_readme_shows_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert "make test" in readme and "make run" in readme


def test_cli_help_lists_every_subcommand():
    out = subprocess.run([sys.executable, "-m", "rookworld_lib.lab.cli", "--help"], capture_output=True, text=True, check=True)
    for sub in ("datagen", "sft", "grpo", "eval", "bench", "run"):
        assert sub in out.stdout


def test_every_public_name_the_readme_lists_imports_from_its_path_and_the_core_stays_chess_free():
    """The README's public-names table: each `from ... import ...` line works in a fresh interpreter,
    and its core lines load nothing of the chess layer or the lab."""
    lines = re.findall(r"^\|[^|]*\| `(from rookworld_lib\.[\w.]+ import [\w, ]+)` \|", (ROOT / "README.md").read_text(), re.M)
    assert len(lines) >= 12 and any("core.train_grpo" in line for line in lines)
    core = [line for line in lines if line.startswith("from rookworld_lib.core.")]
    # one interpreter: the core lines, what they loaded, then every line (one start of torch, not two)
    code = "\n".join([*core, "import sys", "print(sorted(m for m in sys.modules if m.startswith(('rookworld_lib.chess', "
                      "'rookworld_lib.lab'))))", *lines, "print('every line imported')"])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == "[]\nevery line imported\n"


def test_the_readmes_core_example_trains_a_task_of_its_own(tmp_path, monkeypatch):
    """The README's core example, run as it stands (twice, in tmp_path): GRPO lifts the toy reward."""
    block = re.search(r"The core on a task of your own.*?```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)[1]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the block's mkdtemp folders, here
    for _ in range(2):  # a second run of the same block starts afresh, not at the first one's end
        scope: dict = {}
        exec(compile(block.replace("print(", "(lambda *a: None)("), "README.md", "exec"), scope)
        rewards = [r["rewards/yes-no/mean"] for r in scope["history"]]
        assert sum(rewards[-10:]) / 10 >= 0.9, rewards
        assert all((tmp_path / scope["out"] / stage / "final" / "model.safetensors").is_file() for stage in ("sft", "grpo"))


def test_the_references_the_suite_compares_with_are_installed():
    """The strongest tests compare with references: transformers (GPT-2 logits, greedy generate), TRL's
    GRPO loss, Stockfish through python-chess (labels re-analysed), the original data's readers. Each
    skips where its reference is missing, so a suite run without them stayed green having compared with
    none: here their absence fails, once, saying what to install (the dev extras and Stockfish: make setup)."""
    import importlib.util

    from rookworld_lib.chess.engine import StockfishNotFoundError, find_stockfish

    missing = [m for m in ("transformers", "trl", "tokenizers", "datasets", "pyarrow")
               if importlib.util.find_spec(m) is None]
    try:
        find_stockfish()
    except StockfishNotFoundError as exc:
        missing.append(f"Stockfish ({exc})")
    assert not missing, f"the suite's references are missing: {missing}; `make setup` installs them"
