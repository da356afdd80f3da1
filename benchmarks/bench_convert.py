"""Throughput and peak memory of `rookworld convert` on a large generated original-format file.

    python benchmarks/bench_convert.py --lines 1000000 --workers 2 [--dir DIR]

Writes DIR/original.txt (P: and A: lines in the original layouts, half each, from seeded random
games; the distinct lines are repeated to reach --lines, which costs the converter the same work
per line), converts it in a child process and prints one JSON line: lines/s and the child's peak
RSS (GNU time, /usr/bin/time). Run it at two sizes to see that memory does not grow with the file.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the tests' original-format line builders
from test_convert import original_env_line, original_policy_line, random_board  # noqa: E402


def distinct_lines(n: int, seed: int = 0) -> list[str]:
    rng, out = random.Random(seed), []
    while len(out) < n:
        board = random_board(rng, rng.randint(0, 60))
        if board.is_game_over():
            continue
        out.append(original_policy_line(board, rng, fen_width=rng.choice((89, 90))))
        move = rng.choice(list(board.legal_moves)).uci()
        recent = [m.uci() for m in board.move_stack[-9:]] + [move]
        out.append(original_env_line(board, move, recent, prefix=rng.random() < 0.5))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--distinct", type=int, default=20_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="bench-convert-"))
    work.mkdir(parents=True, exist_ok=True)
    src = work / "original.txt"
    lines = distinct_lines(args.distinct)
    with open(src, "w") as fh:
        for i in range(args.lines):
            fh.write(lines[i % len(lines)] + "\n")
    t0 = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "maxrss_kib=%M", sys.executable, "-m", "rookworld_lib.lab.cli", "convert", str(src), "--out", str(work / "out"),
                           "--workers", str(args.workers), "--no-progress", "--json"],
                          capture_output=True, text=True, check=True)
    wall = time.perf_counter() - t0
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    # GNU time's %M: the largest resident set of the converter and its worker processes (KiB)
    peak_mib = int(proc.stderr.rsplit("maxrss_kib=", 1)[1].split()[0]) / 1024
    print(json.dumps({"lines": report["lines"], "written": report["written"], "errors": report["errors"],
                      "convert_seconds": report["seconds"], "lines_per_s": report["lines_per_s"],
                      "wall_seconds": round(wall, 1), "peak_rss_mib_largest_process": round(peak_mib, 1),
                      "workers": args.workers, "input_mib": round(src.stat().st_size / 2**20, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
