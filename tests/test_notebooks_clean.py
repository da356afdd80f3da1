"""Notebook hygiene: what nbval does not check.

Each numbered notebook has exactly one `parameters` cell, validates its parameters in the next
code cell, states its claims as asserts, and is committed without outputs (except cells that
nbval compares, marked NBVAL_CHECK_OUTPUT or tagged keep_output).
"""

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def code_cells(nb):
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def source(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def test_the_numbered_sequence_is_there():
    names = [p.name[:2] for p in NOTEBOOKS]
    for number in ("01", "02", "03", "04", "05"):
        assert number in names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_hygiene(path):
    nb = json.loads(path.read_text())
    ids = [c.get("id") for c in nb["cells"]]
    assert all(ids) and len(set(ids)) == len(ids), f"{path.name}: every cell needs its own id (nbformat 4.5)"
    cells = code_cells(nb)
    params = [i for i, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(params) == 1, f"{path.name}: needs exactly one cell tagged 'parameters'"
    check_cell = source(cells[params[0] + 1])
    assert "check(" in check_cell, f"{path.name}: the cell after 'parameters' must validate them with config.check"
    assert sum("assert " in source(c) for c in cells) >= 2, f"{path.name}: claims must be asserts"
    for c in cells:
        kept = "NBVAL_CHECK_OUTPUT" in source(c) or "keep_output" in c.get("metadata", {}).get("tags", [])
        if not kept:
            assert not c.get("outputs") and c.get("execution_count") is None, f"{path.name}: outputs not stripped"
    assert "figures_dir" in source(cells[params[0]]), f"{path.name}: plots need a figures_dir parameter"
