"""docs/learning_curve.md's checkpoint tables are the runs of docs/learning_curve.json, cell for cell.

Every table whose header has `step`, `tokens` and `train wall (s)` shows one run of the shipped curve
(`rookworld eval RUN --every-checkpoint` rows, gathered under the run's name), and each run of the curve
has exactly one such table: its steps, tokens (M, 2 decimals), train wall seconds, train loss, val loss
(with the step it was measured at, in parentheses, where the table says so or where it is not the
checkpoint's own step) and the five strict rates in percent to one decimal. The "last point, 95%
intervals" line under a table gives the run's last row with its Wilson bounds.

A cell agrees when it is its record rounded at the printed precision; at an exact half (k/672 can be
6.25%) either neighbour is accepted. tests/test_learning_curve.py checks the record itself (well-formed
rows, Wilson lows); this file checks only that the page says what the record holds. No torch: parsing only.
"""

import json
import re

import pytest

from rookworld_lib.lab.places import DOCS_DIR

STRICT = ("policy/valid", "policy/legal_best_move", "policy/best_move_accuracy", "env/valid", "env/next_fen_exact")
# header cell (bold and backticks removed, lower case) -> the row's field; the pages use two wordings
COLUMNS = {
    "step": "step", "tokens": "tokens", "train wall (s)": "train_wall_s", "train loss": "train_loss",
    "val loss (at step)": "val_loss", "val loss": "val_loss",
    "p: valid": "policy/valid", "valid p:": "policy/valid",
    "p: legal best": "policy/legal_best_move", "legal best": "policy/legal_best_move",
    "p: best move": "policy/best_move_accuracy", "best move": "policy/best_move_accuracy",
    "a: valid": "env/valid", "valid a:": "env/valid",
    "a: next position exact": "env/next_fen_exact", "exact next position": "env/next_fen_exact",
}
NUM = r"[-+]?\d+(?:\.\d+)?"


def _clean(cell: str) -> str:
    return cell.replace("**", "").replace("`", "").strip()


def _cells(line: str) -> list:
    return [_clean(c) for c in line.strip().strip("|").split("|")]


def _rounds_to(text: str, exact: float, decimals: int) -> bool:
    """text is exact rounded to `decimals` places (either neighbour at an exact half)."""
    assert re.fullmatch(NUM, text) and len(text.split(".")[1] if "." in text else "") == decimals, text
    return abs(float(text) - exact) <= 0.5 * 10 ** -decimals + 1e-9


def _tables(lines):
    """(first line number, header cells, body rows [(line number, cells)], trailing text lines) per curve table."""
    out, i = [], 0
    while i < len(lines):
        head = _cells(lines[i]) if lines[i].startswith("|") else []
        if [h.lower() for h in head[:1]] == ["step"] and "train wall (s)" in [h.lower() for h in head]:
            start, body, i = i + 1, [], i + 2  # skip the |---| line
            while i < len(lines) and lines[i].startswith("|"):
                body.append((i + 1, _cells(lines[i])))
                i += 1
            tail = []
            while i < len(lines) and not lines[i].startswith(("|", "#", "**")):
                tail.append((i + 1, lines[i]))
                i += 1
            out.append((start, head, body, tail))
        else:
            i += 1
    return out


DOC = (DOCS_DIR / "learning_curve.md").read_text().splitlines()
CURVES = json.loads((DOCS_DIR / "learning_curve.json").read_text())
TABLES = _tables(DOC)


def _run_of(body) -> str:
    """The run whose (step, tokens) sequence the table shows; exactly one must."""
    steps = [int(c[0]) for _, c in body]
    hits = [name for name, run in CURVES.items() if [r["step"] for r in run["rows"]] == steps]
    assert len(hits) == 1, f"table with steps {steps} matches runs {hits} of docs/learning_curve.json"
    return hits[0]


def test_every_run_of_the_curve_has_exactly_one_table_and_every_curve_table_a_run():
    assert len(TABLES) >= 1
    shown = [_run_of(body) for _, _, body, _ in TABLES]
    assert sorted(shown) == sorted(CURVES), f"tables show {shown}; docs/learning_curve.json holds {list(CURVES)}"


@pytest.mark.parametrize("table", TABLES, ids=[f"line{t[0]}" for t in TABLES])
def test_checkpoint_table_equals_its_run(table):
    start, head, body, _ = table
    fields = [COLUMNS[h.lower()] for h in head]  # an unknown header fails here, by name
    name = _run_of(body)
    rows = {r["step"]: r for r in CURVES[name]["rows"]}
    explicit = head[fields.index("val_loss")].lower().endswith("(at step)")
    wrong = []
    for ln, cells in body:
        assert len(cells) == len(fields), f"line {ln}: {len(cells)} cells, header has {len(fields)}"
        r = rows[int(cells[0])]
        for f, cell in zip(fields, cells):
            if f == "step":
                continue
            if f == "tokens":
                ok = cell.endswith("M") and _rounds_to(cell[:-1], r["tokens"] / 1e6, 2)
            elif f == "train_wall_s":
                ok = _rounds_to(cell.replace(",", ""), r["train_wall_s"], 0)
            elif f == "train_loss":
                ok = _rounds_to(cell, r["train_loss"], 3)
            elif f == "val_loss":
                m = re.fullmatch(rf"({NUM})(?: \((\d+)\))?", cell)
                at = int(m.group(2)) if m and m.group(2) else None
                # the step in parentheses: always where the header says "(at step)", else only when it differs
                want_at = r["val_loss_step"] if explicit or r["val_loss_step"] != r["step"] else None
                ok = bool(m) and _rounds_to(m.group(1), r["val_loss"], 3) and at == want_at
            else:
                ok = _rounds_to(cell, 100 * r[f]["value"], 1)
            if not ok:
                shown = r[f]["value"] * 100 if f in STRICT else r[f]
                wrong.append(f"line {ln}, step {r['step']}, {f}: page {cell!r}, record {shown!r}"
                             + (f" at step {r['val_loss_step']}" if f == "val_loss" else ""))
    assert not wrong, f"{name!r} (docs/learning_curve.json) against the table at line {start}:\n" + "\n".join(wrong)


def _last_point_lines():
    for _start, _, body, tail in TABLES:
        for ln, text in tail:
            if text.startswith("last point, 95% intervals:"):
                yield pytest.param(_run_of(body), ln, text, id=f"line{ln}")


@pytest.mark.parametrize("name, ln, text", list(_last_point_lines()))
def test_last_point_intervals_equal_the_runs_last_row(name, ln, text):
    last = CURVES[name]["rows"][-1]
    found = dict((m, (v, lo, hi)) for m, v, lo, hi in
                 re.findall(rf"([\w/]+) ({NUM}) \[({NUM}), ({NUM})\]", text.split(":", 1)[1]))
    assert sorted(found) == sorted(STRICT), f"line {ln}: metrics {sorted(found)}"
    wrong = [f"{m}: page {found[m]}, record {tuple(round(100 * last[m][k], 3) for k in ('value', 'low', 'high'))}"
             for m in STRICT
             if not all(_rounds_to(t, 100 * last[m][k], 1) for t, k in zip(found[m], ("value", "low", "high")))]
    assert not wrong, f"line {ln} against {name!r} step {last['step']}:\n" + "\n".join(wrong)


def test_the_parser_sees_a_wrong_cell():
    """The comparison is not vacuous: one digit changed in a copy of the first table is caught."""
    start, head, body, tail = TABLES[0]
    ln, cells = body[-1]
    i = [COLUMNS[h.lower()] for h in head].index("policy/legal_best_move")
    bad = [*cells[:i], f"{float(cells[i]) + 0.1:.1f}", *cells[i + 1:]]
    with pytest.raises(AssertionError, match="policy/legal_best_move"):
        test_checkpoint_table_equals_its_run((start, head, [*body[:-1], (ln, bad)], tail))
