import json

import nbformat
import pytest

from rookworld_lib import pipeline
from rookworld_lib.paths import NOTEBOOKS_DIR


def write_notebook(path, parameters: str, body: str):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(parameters)
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, nbformat.v4.new_code_cell(body)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


def test_declared_parameters_of_the_shipped_notebooks():
    declared = {nb.name[:2]: pipeline.declared_parameters(nb) for nb in pipeline.numbered_notebooks()}
    assert set(declared) == {"00", "01", "02", "03", "04", "05"}
    # every notebook can be pointed at the run's figures folder
    assert all("figures_dir" in names for names in declared.values())
    # comments with quotes and parentheses must not hide a parameter (papermill's inspector drops these)
    assert {"profile", "device", "run_dir", "sft_steps", "grpo_steps"} <= declared["05"]
    assert {"profile", "preset", "device"} <= declared["02"]


def test_papermill_reads_every_declared_parameter():
    # papermill parses the parameters cell itself when it injects values; a line it cannot parse
    # prints "Unable to parse line" and "Passed unknown parameter" on every headless run.
    from papermill.translators import PythonTranslator

    for path in pipeline.numbered_notebooks():
        nb = nbformat.read(str(path), as_version=4)
        cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
        seen = {p.name for p in PythonTranslator.inspect(cell)}
        assert pipeline.declared_parameters(path) <= seen, (path.name, pipeline.declared_parameters(path) - seen)


def test_run_passes_declared_parameters_and_collects_the_report(tmp_path):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    write_notebook(nbs / "00_first.ipynb",
                   'profile = "ci"  # "ci" or "cpu" (see the docs)\nrun_dir = None  # where it goes (None = nowhere)\n'
                   'figures_dir = "x"',
                   'from pathlib import Path\nassert profile == "cpu", profile\n'
                   'Path(run_dir, "report_first.md").write_text("## first fragment\\n")')
    write_notebook(nbs / "01_second.ipynb", "steps = 1  # (int)", "assert steps == 3, steps")
    run_dir = pipeline.run_pipeline("cpu", tmp_path / "runs", extra_parameters={"steps": 3}, notebooks_dir=nbs)
    record = json.loads((run_dir / "run.json").read_text())
    assert [n["status"] for n in record["notebooks"]] == ["ok", "ok"]
    assert record["notebooks"][0]["parameters"] == {"profile": "cpu", "run_dir": str(run_dir),
                                                    "figures_dir": str(run_dir / "figures")}
    assert record["notebooks"][1]["parameters"] == {"steps": 3}
    report = (run_dir / "report.md").read_text()
    assert "## first fragment" in report and "| 01_second.ipynb | ok |" in report


def test_failed_notebook_stops_the_run_and_says_so_in_the_report(tmp_path):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    write_notebook(nbs / "00_bad.ipynb", "x = 1", "raise ValueError('planted failure')")
    write_notebook(nbs / "01_never.ipynb", "x = 1", "pass")
    with pytest.raises(RuntimeError, match="00_bad.ipynb: .*planted failure") as info:
        pipeline.run_pipeline("cpu", tmp_path / "runs", notebooks_dir=nbs)
    run_dir = next((tmp_path / "runs").iterdir())
    assert str(run_dir) in str(info.value)
    report = (run_dir / "report.md").read_text()
    assert "**FAILED**" in report and "01_never" not in report


def test_unknown_parameter_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"\['no_such_parameter'\] are declared by none"):
        pipeline.run_pipeline("cpu", tmp_path / "runs", extra_parameters={"no_such_parameter": 1},
                              notebooks_dir=NOTEBOOKS_DIR)


def test_a_refused_run_leaves_no_run_directory(tmp_path):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    write_notebook(nbs / "00_first.ipynb", "steps = 1\nseed = 0", "pass")
    from rookworld_lib.config import ParameterError

    with pytest.raises(ParameterError, match=r"\['stepz'\] are declared by none .*; allowed: seed, steps"):
        pipeline.run_pipeline("cpu", tmp_path / "runs", extra_parameters={"stepz": 5}, notebooks_dir=nbs)
    with pytest.raises(ValueError, match=r"no notebooks selected .* by --only 99 \(available: 00_first.ipynb\)"):
        pipeline.run_pipeline("cpu", tmp_path / "runs", only=["99"], notebooks_dir=nbs)
    assert not (tmp_path / "runs").exists()
