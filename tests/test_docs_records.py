"""docs/grpo.md's recorded figures equal the raw records they cite (docs/grpo_ablation.jsonl), so the docs
cannot drift from the records: section 3's table (rows 1-23), the GRPO-seed table, the SFT-seed table, the
single-change tables and their seed-level view, and the section-3/4 inline intervals of named runs.

The jsonl holds two formats (docs/grpo.md section 3, "Raw results"): its first 13 lines give each metric as
[before, after, change, low, high] already in points, to 0.1; the later ones (benchmarks/grpo_ablation.py) give
fractions under before/after/change/low/high, which the doc shows in points to 0.1. A shown figure is right
when it is a rounding of the record to 0.1 (at an exact .x5 either neighbour: the doc's tables were written
by hand and by more than one formatter), and a 0.0 shown for a value off zero carries the value's sign.

Pure text and JSON: no torch, well under a second.
"""

from __future__ import annotations

import json
import re

import pytest

from rookworld_lib.lab.places import DOCS_DIR

DOC = (DOCS_DIR / "grpo.md").read_text()
DOC_LINES = DOC.splitlines()
DOC_FLAT = " ".join(line.strip() for line in DOC_LINES)  # inline figures wrap across lines
RECORDS = [json.loads(line) for line in (DOCS_DIR / "grpo_ablation.jsonl").read_text().splitlines() if line.strip()]
BY_NAME = {r["name"]: r for r in RECORDS}
FIELDS = ("before", "after", "change", "low", "high")
NUM = r"[+-]?\d+(?:\.\d+)?"
CELL = re.compile(rf"({NUM})(?:\s*\[({NUM}),\s*({NUM})\])?")

# Section 3's rows and the jsonl line each comes from, matched by the row's change, its GRPO seconds and its
# figures (the doc names only some rows' records). Row 13's identical twin is the old-format line
# graded2_T03_s100_pps16 (489 s), whose greedy and A: figures are the same; the table cites the later
# harness run shipped_s100 (1,093 s in the row's text).
TABLE_ROWS = {
    1: "graded_s40", 2: "graded_T03_s100", 3: "graded_T03_s100_pf1", 4: "graded_T03_s100_lr2e5_b01",
    5: "gated_T03_s100", 6: "graded2_T03_s100", 7: "graded2_T03_s100_gdpo", 8: "graded2_T03_s100_pf075",
    9: "graded3_T03_s100_pf075", 10: "graded2_T03_s200_pf075", 11: "graded4_valid_pps16", 12: "graded2_pps16_s150",
    13: "shipped_s100", 14: "g8x8", 15: "g2x32", 16: "split2500_g193", 17: "shipped_seed1", 18: "shipped_seed2",
    19: "shipped_seed3", 20: "shipped_seed4", 21: "own_piece01_seed1", 22: "own_piece01_seed2",
    23: "cpu_intel_gated",
}
TABLE_COLUMNS = ("policy/legal_best_move", "env/valid", "policy/best_move_accuracy", "policy/valid",
                 "pass@1/policy/legal_best_move", "pass@1/env/valid", "pass@1/policy/valid")
SEED_ROWS = {"1": "shipped_seed1", "2": "shipped_seed2", "3": "shipped_seed3", "4": "shipped_seed4"}  # 0: make run's
SEED_COLUMNS = ("policy/legal_best_move", "env/valid", "pass@1/policy/legal_best_move", "pass@1/env/valid",
                "policy/best_move_accuracy")
SFT_ROWS = {  # the label's start -> the run (rows `sftseed*` of the jsonl)
    "0, 0, **250 steps**": "sftseed0_grpo0_steps250", "1, 0, **250 steps**": "sftseed1_grpo0_steps250",
    "3, 0, **250 steps**": "sftseed3_grpo0_steps250", "1, 0, **lr 1e-4**": "sftseed1_grpo0_lr1e-4",
    "0, 0": "sftseed0_grpo0", "1, 0": "sftseed1_grpo0", "1, 1": "sftseed1_grpo1", "1, 2": "sftseed1_grpo2",
    "2, 0": "sftseed2_grpo0", "3, 0": "sftseed3_grpo0",
}
SFT_COLUMNS = ("env/valid", "pass@1/policy/legal_best_move", "pass@1/env/valid", "policy/best_move_accuracy",
               "pass@1/policy/best_move_accuracy")


def points(record: dict, metric: str, field: str) -> tuple[float, bool]:
    """The record's value in points, and whether the record already rounded it (the old format)."""
    value = record["metrics"][metric]
    if isinstance(value, list):
        return value[FIELDS.index(field)], True
    return 100 * value[field], False


def assert_shown(shown: str, value: float, pre_rounded: bool, what: str, digits: int = 1) -> None:
    got = float(shown)
    if pre_rounded:
        assert got == pytest.approx(value, abs=1e-9), f"{what}: the doc shows {shown}, the record {value}"
        return
    half = 0.5 * 10 ** -digits
    assert abs(got - value) <= half + 1e-9, f"{what}: the doc shows {shown}, the record {value:.4f}"
    if got == 0 and value != 0 and shown[0] in "+-":
        assert (shown[0] == "-") == (value < 0), f"{what}: the doc shows {shown} for {value:.4f}"


def assert_cell(cell: str, record: dict, metric: str, what: str) -> None:
    m = CELL.search(cell.replace("**", "").replace("(old)", ""))
    assert m, f"{what}: no figure in {cell!r}"
    for field, shown in zip(("change", "low", "high"), m.groups()):
        if shown is not None:
            assert_shown(shown, *points(record, metric, field), f"{what} {field}")


def table(header: str) -> list[tuple[int, list[str]]]:
    """The body rows (doc line number, cells) of the markdown tables whose header line starts with `header`,
    one table after the other."""
    starts = [i for i, line in enumerate(DOC_LINES) if line.strip().startswith(header)]
    assert starts, f"no table headed {header!r} in docs/grpo.md"
    rows = []
    for start in starts:
        for i in range(start + 2, len(DOC_LINES)):
            line = DOC_LINES[i].strip()
            if not line.startswith("|"):
                break
            rows.append((i + 1, [c.strip() for c in line.strip("|").split("|")]))
    return rows


SECTION3 = table("| # | change (reward graded unless said)")
SEEDS = table("| GRPO seed | legal best | valid `A:`")
SFT_SEEDS = table("| SFT seed, GRPO seed | legal best (SFT -> GRPO)")


def test_the_raw_records_are_in_the_two_formats_the_doc_describes():
    assert all("over" in r and "set" not in r for r in RECORDS[:13])
    assert all("set" in r for r in RECORDS[13:])
    assert all("seed" not in r for r in RECORDS[13:17]) and all("seed" in r and "sft" in r for r in RECORDS[17:])
    assert len(BY_NAME) == len(RECORDS), "a run name appears twice in docs/grpo_ablation.jsonl"


def test_every_section3_row_has_its_record():
    assert [int(cells[0]) for _, cells in SECTION3] == sorted(TABLE_ROWS)
    assert set(TABLE_ROWS.values()) <= set(BY_NAME)


@pytest.mark.parametrize("lineno,cells", SECTION3, ids=[f"row{cells[0]}" for _, cells in SECTION3])
def test_section3_table_row_equals_its_record(lineno, cells):
    row = int(cells[0])
    record = BY_NAME[TABLE_ROWS[row]]
    if cells[2] != "-":
        assert int(cells[2]) == record["grpo_s"], f"row {row} (docs/grpo.md:{lineno}): GRPO seconds"
    assert len(cells) == 3 + len(TABLE_COLUMNS)
    for cell, metric in zip(cells[3:], TABLE_COLUMNS):
        assert_cell(cell, record, metric, f"row {row} (docs/grpo.md:{lineno}) {metric}")


@pytest.mark.parametrize("lineno,cells", [s for s in SEEDS if s[1][0] in SEED_ROWS],
                         ids=[f"seed{c[0]}" for _, c in SEEDS if c[0] in SEED_ROWS])
def test_grpo_seed_table_row_equals_its_record(lineno, cells):
    record = BY_NAME[SEED_ROWS[cells[0]]]
    what = f"GRPO seed {cells[0]} (docs/grpo.md:{lineno})"
    for cell, metric in zip(cells[1:6], SEED_COLUMNS):
        assert_cell(cell, record, metric, f"{what} {metric}")
    m = re.fullmatch(r"([\d.]+) -> ([\d.]+); ([\d.]+) -> ([\d.]+)", cells[6])
    assert m, f"{what}: sampled reward cell {cells[6]!r}"
    trend = record["reward_trend"]
    wanted = (trend["P"]["first quarter"], trend["P"]["last quarter"], trend["A"]["first quarter"],
              trend["A"]["last quarter"])
    for shown, value in zip(m.groups(), wanted):
        assert_shown(shown, value, False, f"{what} sampled reward", digits=3)


def test_the_grpo_seed_tables_mean_of_5_is_the_mean_of_its_rows():
    rows = {cells[0].split(" ")[0]: cells for _, cells in SEEDS}
    assert set(rows) == {"0", "1", "2", "3", "4", "mean"}
    for k, metric in enumerate(SEED_COLUMNS, start=1):
        shown = [float(CELL.search(rows[s][k].replace("**", "")).group(1)) for s in "01234"]
        # from the records where there is one (seed 0 is make run's own report, in the table only)
        raw = [shown[0]] + [points(BY_NAME[SEED_ROWS[s]], metric, "change")[0] for s in "1234"]
        mean = CELL.search(rows["mean"][k]).group(1)
        assert_shown(mean, sum(shown) / 5, False, f"mean of 5, {metric}, of the shown rows")
        assert_shown(mean, sum(raw) / 5, False, f"mean of 5, {metric}, of the records")


@pytest.mark.parametrize("lineno,cells", SFT_SEEDS, ids=[f"sft[{c[0].replace('*', '')[:20]}]" for _, c in SFT_SEEDS])
def test_sft_seed_table_row_equals_its_record(lineno, cells):
    label = next(k for k in sorted(SFT_ROWS, key=len, reverse=True) if cells[0].startswith(k))
    record = BY_NAME[SFT_ROWS[label]]
    what = f"SFT seed row {label!r} (docs/grpo.md:{lineno})"
    m = re.fullmatch(r"([\d.]+) -> ([\d.]+), (.*)", cells[1])
    assert m, f"{what}: legal best cell {cells[1]!r}"
    assert_shown(m.group(1), *points(record, "policy/legal_best_move", "before"), f"{what} legal best before")
    assert_shown(m.group(2), *points(record, "policy/legal_best_move", "after"), f"{what} legal best after")
    assert_cell(m.group(3), record, "policy/legal_best_move", f"{what} legal best")
    for cell, metric in zip(cells[2:], SFT_COLUMNS):
        assert_cell(cell, record, metric, f"{what} {metric}")
    seconds = re.search(r"([\d,]+) s\)", cells[0])
    if seconds:
        assert int(seconds.group(1).replace(",", "")) == record["grpo_s"], f"{what}: GRPO seconds"


def test_every_sft_seed_run_of_the_jsonl_is_in_the_table():
    shown = {SFT_ROWS[next(k for k in sorted(SFT_ROWS, key=len, reverse=True) if c[0].startswith(k))]
             for _, c in SFT_SEEDS}
    assert shown == {r["name"] for r in RECORDS if r["name"].startswith("sftseed")}


# Inline intervals of named runs (sections 3-4): the text as the doc writes it (line breaks as spaces), the run
# and the metric. A reworded sentence fails here on purpose: re-point it at its record.
INLINE = [
    ("legal best +6.7 [+3.8, +9.6], valid `A:` +16.5", "cpu_intel_graded", "policy/legal_best_move"),
    ("valid `A:` +16.5 [+12.2, +20.8])", "cpu_intel_graded", "env/valid"),
    ("pass@1 legal best moves +5.5 [+3.9, +7.1]", "cpu_intel_graded", "pass@1/policy/legal_best_move"),
    ("pass@1 valid `A:` +15.0 [+12.1, +17.9]", "cpu_intel_graded", "pass@1/env/valid"),
    ("(seed 2: +0.8 [-1.5, +3.2])", "shipped_seed2", "policy/legal_best_move"),
    ("one of them below its start (-2.5 [-4.9, -0.0])", "sftseed1_grpo2", "policy/legal_best_move"),
    ("7 of 730 positions to 3, pass@1 -0.5 [-0.9, -0.1]", "sftseed1_grpo0", "pass@1/policy/best_move_accuracy"),
    ("(4 of 730, +0.5 [+0.0, +1.1]", "sftseed0_grpo0_steps250", "policy/valid"),
    ("GRPO does not lift them from there (+0.7 [-1.4, +2.7])", "split2500_g193", "policy/legal_best_move"),
    ("valid `A:` answers, +15.0 [+11.6, +18.5]", "cpulong_shipped", "env/valid"),
    ("pass@1 legal best moves, +2.9 [+0.9, +4.9]", "cpulong_shipped", "pass@1/policy/legal_best_move"),
    ("greedy legal best moves, +2.7 [-0.8, +6.3]", "cpulong_shipped", "policy/legal_best_move"),
    ("greedy +1.9, pass@1 +4.8 [+2.7, +6.8]", "cpulong_bestlegal", "pass@1/policy/legal_best_move"),
    ("**+9.9 [+6.4, +13.4] to 60.8%**", "cpulong2x_shipped", "policy/legal_best_move"),
    ("Valid `A:` +7.3 [+4.4, +10.2]", "cpulong2x_shipped", "env/valid"),
    ("pass@1 legal best moves +5.9 [+3.8, +8.0]", "cpulong2x_shipped", "pass@1/policy/legal_best_move"),
    ("pass@1 best-move accuracy +1.2 [+0.2, +2.1]", "cpulong2x_shipped", "pass@1/policy/best_move_accuracy"),
    ("pass@1 exact next positions +1.8 [+0.2, +3.4]", "cpulong2x_shipped", "pass@1/env/next_fen_exact"),
    ("seeds 1 and 2: +10.4 [+6.8, +14.0]", "cpulong2x_shipped_g1", "policy/legal_best_move"),
    ("and +10.5 [+6.9, +14.2], nothing down", "cpulong2x_shipped_g2", "policy/legal_best_move"),
    ("(+19.0 [+15.6, +22.5] legal best moves, to 28.5%", "order_cpu_uci", "policy/legal_best_move"),
    ("best first: +5.2 [+2.9, +7.5], to 22.9%", "order_cpu_layout", "policy/legal_best_move"),
    ("format-valid `P:` answers +5.8 [+3.5, +8.0] to 10.0%", "order_cpulong14k_uci", "policy/valid"),
    ("(pass@1 +3.4 [+2.3, +4.6])", "order_cpulong14k_uci", "pass@1/policy/valid"),
    ("legal best moves +4.8 [+1.0, +8.6] to 66.0%", "order_cpulong14k_uci", "policy/legal_best_move"),
    ("valid `A:` +5.5 [+2.9, +8.1]", "order_cpulong14k_uci", "env/valid"),
    ("exact next positions +2.8 [+0.1, +5.6]", "order_cpulong14k_uci", "env/next_fen_exact"),
    ("9.3% format-valid (+5.1 [+3.0, +7.1])", "order_cpulong14k_uci_g1", "policy/valid"),
    ("legal best moves +4.1 [+0.3, +7.9]", "order_cpulong14k_uci_g1", "policy/legal_best_move"),
    ("legal best moves +7.4 [+4.1, +10.7] to 63.4%", "order_cpulong14k_layout", "policy/legal_best_move"),
    ("valid `A:` +4.2 [+1.7, +6.7]", "order_cpulong14k_layout", "env/valid"),
    ("10.1% -> 14.7% (+4.5 [+1.8, +7.3])", "cpulong_uci_g1", "policy/valid"),
    ("legal best moves +9.6 [+5.6, +13.6]", "cpulong_uci_g1", "policy/legal_best_move"),
    ("(seeds 0 and 1; +10.1 [+6.9, +13.4]", "cpulong_uci_steps600", "policy/valid"),
    ("+8.6 [+5.5, +11.7]), legal best moves", "cpulong_uci_steps600_g1", "policy/valid"),
    ("legal best moves **+15.5 [+11.4, +19.6] and", "cpulong_uci_steps600", "policy/legal_best_move"),
    ("and +16.8 [+12.8, +20.9]**", "cpulong_uci_steps600_g1", "policy/legal_best_move"),
    ("(GRPO's lift +12.2 [+8.6, +15.8]", "cpulong_uci_sft16k_g600", "policy/legal_best_move"),
    ("lifts legal best moves **+15.1 [+11.9, +18.3]** to 20.8%", "nohistory_cpu_intel_g0", "policy/legal_best_move"),
    ("valid `A:` **+7.7 [+4.1, +11.3]** to 78.7%", "nohistory_cpu_intel_g0", "env/valid"),
    ("valid `A:` **+18.0 [+13.9, +22.0]** to 75.7%", "cpu_intel_bd3618d_g1", "env/valid"),
    ("+4.6 [+0.7, +8.5] to 75.6%", "nohistory_cpu_intel_g1", "env/valid"),
    ("legal best moves +5.2 [+2.6, +7.8] and", "cpu_intel_bd3618d_g1", "policy/legal_best_move"),
    ("pass@1 legal best moves +1.9 [+0.7, +3.1] and", "cpu_intel_bd3618d_g1", "pass@1/policy/legal_best_move"),
    ("pass@1 valid `A:` +17.7 [+15.1, +20.4]; nothing falls", "cpu_intel_bd3618d_g1", "pass@1/env/valid"),
    ("lifts legal best moves +3.0 [+1.0, +5.1] to 18.4%", "cpu_intel_bd3618d_g2", "policy/legal_best_move"),
    ("valid `A:` +16.2 [+11.9, +20.5] to 74.0%", "cpu_intel_bd3618d_g2", "env/valid"),
    ("(pass@1 legal best moves +1.1 [-0.1, +2.3])", "cpu_intel_bd3618d_g2", "pass@1/policy/legal_best_move"),
    ("+6.2 [+2.7, +9.8] from the history-masked one", "nohistory_cpu_intel_g2", "env/valid"),
    ("and +15.6 [+12.4, +18.9] (to 18.4% and 21.4%)", "nohistory_cpu_intel_g2", "policy/legal_best_move"),
    ("**+13.6 [+10.5, +16.7]** (to 20.5% and 19.3%)", "nohistory_cpu_intel_g1", "policy/legal_best_move"),
]


@pytest.mark.parametrize("text,name,metric", INLINE, ids=[f"{n}:{m}" for _, n, m in INLINE])
def test_inline_interval_equals_its_record(text, name, metric):
    assert text in DOC_FLAT, f"docs/grpo.md no longer says {text!r}: re-point this check at the figure's record"
    m = re.search(rf"({NUM})\s*\[({NUM}),\s*({NUM})\]", text.replace("**", ""))
    for field, shown in zip(("change", "low", "high"), m.groups()):
        assert_shown(shown, *points(BY_NAME[name], metric, field), f"{text!r} ({name}) {field}")


# Section 3's single changes under three GRPO seeds or more (seven tables: dynamic sampling, no KL term and T 0.6;
# the learning rate; a reward weighting; groups of 8; GDPO; the P: share; 300 steps): each row against the SFT model (the run's own
# record) and head to head with the shipped recipe of its seed (`compare_models.py`, kept in the record's
# `head_to_head`; a change shown in bold is one the comparison resolved).
SINGLE = table("| change (one, to the shipped recipe) | GRPO seed |")  # the seven tables
SHIPPED = "cpu_intel_bd3618d_g"  # the shipped recipe's runs (the seed follows): the reference, not a change
SINGLE_RUNS = {  # the row's label -> its runs' name without the seed, and the change they record
    "none (the shipped recipe)": (SHIPPED, {}),
    "`dynamic_sampling` on": ("dynamic_sampling_cpu_intel_g", {"dynamic_sampling": True}),
    "no KL term (`beta` 0)": ("no_kl_cpu_intel_g", {"loss": {"beta": 0.0}}),
    "T 0.6 (0.3)": ("temperature06_cpu_intel_g", {"temperature": 0.6}),
    "lr 1e-4 (5e-5)": ("lr1e-4_cpu_intel_g", {"lr": 1e-4}),
    "lr 2.5e-5 (5e-5)": ("lr2.5e-5_cpu_intel_g", {"lr": 2.5e-5}),
    "`best_legal` 0.35, `moves_distinct` 0.1 (0.2, 0.25)": ("bestlegal_cpu_intel_g",
                                                            {"gw": {"best_legal": 0.35, "moves_distinct": 0.1}}),
    "group 8 x 8 prompts (4 x 16)": ("group8_cpu_intel_g", {"group_size": 8, "prompts_per_step": 8}),
    "GDPO (`multi_objective_aggregation` normalize_then_sum)": ("gdpo_cpu_intel_g",
                                                                {"multi_objective_aggregation": "normalize_then_sum"}),
    "3 in 4 prompts `P:` (`task_weights` 0.75 / 0.25; 0.5 / 0.5)": ("pf075_cpu_intel_g",
                                                                   {"task_weights": {"P": 0.75, "A": 0.25}}),
    "300 steps (150)": ("steps300_cpu_intel_g", {"steps": 300}),
}
SINGLE_COLUMNS = ("policy/legal_best_move", "env/valid", "pass@1/policy/legal_best_move", "pass@1/env/valid")


@pytest.mark.parametrize("lineno,cells", SINGLE, ids=[f"{c[0][:12]}-{c[1]}" for _, c in SINGLE])
def test_single_change_table_row_equals_its_record(lineno, cells):
    name, change = SINGLE_RUNS[cells[0]]
    record = BY_NAME[name + cells[1]]
    what = f"{cells[0]} seed {cells[1]} (docs/grpo.md:{lineno})"
    assert record["seed"] == int(cells[1]) and int(cells[2].split()[0]) == record["grpo_s"], what
    assert record["set"] == change, what
    for cell, metric in zip(cells[3:7], SINGLE_COLUMNS):
        assert_cell(cell, record, metric, f"{what} {metric}")
    head = record.get("head_to_head")
    assert cells[7:] == (["-"] * 4 if head is None else
                         [f"**{c}**" if head["moved"][m] != "no resolved change" else c
                          for m in SINGLE_COLUMNS for c in [head["change"][m]]]), what


def test_every_single_change_run_of_the_jsonl_is_in_its_table():
    shown = {SINGLE_RUNS[cells[0]][0] + cells[1] for _, cells in SINGLE}
    assert {n for n in BY_NAME if n.startswith(tuple(prefix for prefix, _ in SINGLE_RUNS.values()))} <= shown


# The single changes side by side (section 3, "seed-level view"): each row the mean of a change's
# head-to-head changes (one per GRPO seed, as its records keep them) with a Student t 95% interval over the
# seeds; then the seed-to-seed spread pooled over the changes.
SEED_LEVEL = table("| single change | GRPO seeds | head to head, mean over the seeds:")


def head_to_head_changes(prefix: str, metric: str) -> list[float]:
    runs = sorted(n for n in BY_NAME if n.startswith(prefix) and n[len(prefix):].isdigit())
    return [float(CELL.match(BY_NAME[n]["head_to_head"]["change"][metric]).group(1)) for n in runs]


def seed_level(values: list[float]) -> tuple[float, float, float]:
    from scipy import stats

    mean, n = sum(values) / len(values), len(values)
    half = stats.t.ppf(0.975, n - 1) * (sum((v - mean) ** 2 for v in values) / (n - 1) / n) ** 0.5
    return mean, mean - half, mean + half


def pooled_sd(metric: str) -> tuple[float, int]:
    """The seed-to-seed standard deviation of a head-to-head change, pooled over the changes, and its degrees of freedom."""
    groups = [head_to_head_changes(prefix, metric) for prefix, _ in SINGLE_RUNS.values() if prefix != SHIPPED]
    ss = sum(sum((v - sum(g) / len(g)) ** 2 for v in g) for g in groups)
    df = sum(len(g) - 1 for g in groups)
    return (ss / df) ** 0.5, df


@pytest.mark.parametrize("lineno,cells", SEED_LEVEL, ids=[c[0][:16] for _, c in SEED_LEVEL])
def test_seed_level_row_is_the_mean_of_its_head_to_head_changes(lineno, cells):
    prefix = SINGLE_RUNS[cells[0]][0]
    assert int(cells[1]) == len(head_to_head_changes(prefix, SINGLE_COLUMNS[0])) >= 3, f"{cells[0]}: seeds"
    for cell, metric in zip(cells[2:], SINGLE_COLUMNS):
        m = CELL.search(cell.replace("**", ""))
        for shown, value, field in zip(m.groups(), seed_level(head_to_head_changes(prefix, metric)), ("mean", "low", "high")):
            assert_shown(shown, value, False, f"{cells[0]} {metric} {field} (docs/grpo.md:{lineno})")
    assert len(cells) == 2 + len(SINGLE_COLUMNS)


def test_seed_level_table_holds_every_single_change():
    assert sorted(c[0] for _, c in SEED_LEVEL) == sorted(k for k, (p, _) in SINGLE_RUNS.items() if p != SHIPPED)


def test_the_pooled_seed_spread_and_what_it_resolves_are_the_records():
    from scipy import stats

    (legal, df), (valid, _) = pooled_sd("policy/legal_best_move"), pooled_sd("env/valid")
    half = [stats.t.ppf(0.975, 2) * sd / 3 ** 0.5 for sd in (legal, valid)]
    seeds = next(n for n in range(2, 1000) if stats.t.ppf(0.975, n - 1) * legal / n ** 0.5 <= 2.0)
    said = (f"a standard deviation of {legal:.1f} points on greedy legal best moves and {valid:.1f} on valid `A:` "
            f"answers ({df} degrees of freedom). At that spread three seeds per arm resolve only changes of about "
            f"±{half[0]:.1f} and ±{half[1]:.1f} points, and a 2-point change in greedy legal best moves needs about "
            f"{seeds} seeds per arm")
    assert said in DOC_FLAT, f"docs/grpo.md's seed-level paragraph should say: {said}"
