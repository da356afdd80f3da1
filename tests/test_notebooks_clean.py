"""Notebook hygiene: what nbval does not check.

Each numbered notebook has exactly one `parameters` cell, validates its parameters in the next
code cell, states its claims as asserts, and is committed without outputs (except cells that
nbval compares, marked NBVAL_CHECK_OUTPUT or tagged keep_output).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ipykernel.ipkernel import IPythonKernel

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
    assert "check(" in check_cell, f"{path.name}: the cell after 'parameters' must validate them with lab.parameters.check"
    assert sum("assert " in source(c) for c in cells) >= 2, f"{path.name}: claims must be asserts"
    for c in cells:
        kept = "NBVAL_CHECK_OUTPUT" in source(c) or "keep_output" in c.get("metadata", {}).get("tags", [])
        if not kept:
            assert not c.get("outputs") and c.get("execution_count") is None, f"{path.name}: outputs not stripped"
    assert "figures_dir" in source(cells[params[0]]), f"{path.name}: plots need a figures_dir parameter"
    assert nb["metadata"]["kernelspec"]["name"] == "rookworld", f"{path.name}: opens on the project's kernel (make setup installs it)"
    # JupyterLab writes the kernel's language_info into an opened notebook: anything else there marks a
    # notebook modified the moment it opens (the browser test checks the tab; the version is Python's own)
    info = dict(nb["metadata"]["language_info"])
    assert re.fullmatch(r"3\.\d+\.\d+", info.pop("version")), f"{path.name}: language_info needs Python's version"
    assert info == {k: v for k, v in IPythonKernel.language_info.items() if k != "version"}, \
        f"{path.name}: language_info is not what the kernel reports"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_cell_rebinds_a_parameter(path):
    """A cell that writes a derived value back into a parameter (`run_dir = run_dir or new_folder()`) keeps it
    when run again, or after the user changes what it derived from: 05 continued the old run's folder, 02
    built the last profile's model, 06 sampled at the last run's temperature. Derived values get names of
    their own."""
    import ast

    from rookworld_lib.lab.pipeline import declared_parameters

    params, cells = declared_parameters(path), code_cells(json.loads(path.read_text()))
    first = next(i for i, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", []))
    rebound = []
    for i, cell in enumerate(cells[first + 1:], first + 1):
        for node in ast.walk(ast.parse(source(cell))):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.NamedExpr)) else []
            for target in targets:  # names bound, also inside tuples; not a subscript's or attribute's base
                names = [target] if isinstance(target, ast.Name) else \
                    [e for e in getattr(target, "elts", []) if isinstance(e, ast.Name)]
                rebound += [f"code cell {i}: {n.id}" for n in names if n.id in params]
    assert not rebound, f"{path.name}: parameters rebound after the parameters cell: {rebound}"


def test_git_status_is_clean_after_make_labs_filter_install(tmp_path):
    """`make lab` installs nbstripout's git filter; on a fresh clone that must change no tracked file and
    show no notebook as modified (nbstripout renumbers cell ids, so the committed ids are its own).
    Git runs the filter once per notebook it re-reads (a process of ~3 s each): the filter's output for
    every notebook comes from one `nbstripout --textconv` over all of them (the same code on the same
    git config), and git itself re-reads one notebook through the installed filter."""
    root = NOTEBOOKS[0].parents[1]
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(root), str(clone)], check=True)
    past = time.time() - 60
    for nb in NOTEBOOKS:  # the working tree's notebooks, as they would be committed
        shutil.copy(nb, clone / "notebooks" / nb.name)
        # older than the index git writes next: else git holds them "racily clean" and runs the
        # filter on every one at `git status`, not only on the one touched below
        os.utime(clone / "notebooks" / nb.name, (past, past))
    subprocess.run(["git", "add", "-A"], cwd=clone, check=True)
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty", "-m", "wt"],
                   cwd=clone, check=True)
    nbstripout = Path(sys.executable).with_name("nbstripout")
    subprocess.run([str(nbstripout), "--install", "--attributes", ".gitattributes"], cwd=clone, check=True)
    names = [f"notebooks/{nb.name}" for nb in NOTEBOOKS]
    stripped = subprocess.run([str(nbstripout), "--textconv", *names], cwd=clone, check=True, capture_output=True).stdout
    committed = b"".join(subprocess.run(["git", "show", f"HEAD:{n}"], cwd=clone, check=True, capture_output=True).stdout
                         for n in names)
    assert stripped == committed, "nbstripout's filter would change a committed notebook"
    (clone / names[-1]).touch()  # git re-reads it through the filter
    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, check=True, capture_output=True, text=True)
    assert status.stdout == "", f"after `nbstripout --install` a fresh clone shows changes:\n{status.stdout}"
