"""Throughput of data generation and reward scoring (a benchmark, not a test: pytest skips it).

    .venv/bin/python tests/bench_data_rewards.py [--games 40] [--json out.json]

Prints one JSON object: data-generation rates with 1 and 2 workers at the shipped settings
(depth 8, multipv 5), and reward-scoring rates with and without the caches. The numbers in
docs/perf_data_rewards.md come from this script.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import tempfile
import time

import chess

from rookworld_lib import data, engine, rewards, tasks


def bench_datagen(games: int, workers: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cfg = data.DatagenConfig(out_dir=out, games=games, mate_games=0, workers=workers)
        t0 = time.perf_counter()
        rep = data.generate(cfg, progress=False)
        wall = time.perf_counter() - t0
    samples = sum(rep.counts.values())
    return {"workers": workers, "games": games, "positions_labelled": rep.positions_labelled,
            "label_seconds": round(rep.seconds["label"], 2),
            "label_positions_per_s": round(rep.label_positions_per_s, 2),
            "games_seconds": round(rep.seconds["games"], 2), "total_seconds": round(wall, 2),
            "samples_written": samples, "samples_per_s_end_to_end": round(samples / wall, 2),
            "p_positions_per_s_end_to_end": round(rep.positions_labelled / wall, 2)}


def _rate(fn, items, repeat=1) -> float:
    t0 = time.perf_counter()
    for _ in range(repeat):
        for it in items:
            fn(*it)
    return len(items) * repeat / (time.perf_counter() - t0)


def bench_rewards(n: int = 400) -> dict:
    rng = random.Random(0)
    pol = data.load_split("P", "val").records
    env = data.load_split("A", "val").records
    pol_items, pol_live, env_items = [], [], []
    for r in rng.sample(pol, min(n, len(pol))):
        move = rng.choice(r["moves"])  # a listed candidate: no engine call needed with truth
        c = f" M: {' '.join(r['moves'])} E: {' '.join(r['evals'])} B: {move}"
        pol_items.append((r["prompt"], c, r))
    for r in rng.sample(pol, 60):
        board = chess.Board(r["fen"])
        move = rng.choice([m.uci() for m in board.legal_moves])
        pol_live.append((r["prompt"], f" M: {move} E: 0.0 B: {move}"))
    for r in rng.sample(env, min(n, len(env))):
        env_items.append((r["prompt"], r["completion"]))
    out = {}
    # policy, ground truth from the data set
    out["policy_truth_uncached_per_s"] = round(_rate(lambda p, c, t: rewards.score_policy(p, c, truth=t, cache=False), pol_items), 1)
    rewards.clear_cache()
    _rate(lambda p, c, t: rewards.score_policy(p, c, truth=t), pol_items)  # fill
    out["policy_truth_cached_per_s"] = round(_rate(lambda p, c, t: rewards.score_policy(p, c, truth=t), pol_items, 5), 1)
    # policy, live Stockfish (no truth): a cold analysis cache means one search per position
    rewards.clear_truth()
    rewards.clear_cache(analyses=True)
    pool = engine.get_pool()
    pool.analyse(chess.STARTING_FEN)  # start the engines outside the timing
    rewards.clear_cache(analyses=True)
    out["policy_live_engine_cold_per_s"] = round(_rate(lambda p, c: rewards.score_policy(p, c), pol_live), 1)
    rewards.clear_cache()  # reward cache cold, analysis cache warm
    out["policy_live_engine_analysis_cached_per_s"] = round(_rate(lambda p, c: rewards.score_policy(p, c), pol_live), 1)
    out["policy_live_engine_fully_cached_per_s"] = round(_rate(lambda p, c: rewards.score_policy(p, c), pol_live, 20), 1)
    rewards.clear_cache(analyses=True)
    t0 = time.perf_counter()
    rewards.score_batch([p for p, _ in pol_live], [c for _, c in pol_live])
    out["policy_live_engine_score_batch_cold_per_s"] = round(len(pol_live) / (time.perf_counter() - t0), 1)
    # environment (truth by replay)
    out["env_uncached_per_s"] = round(_rate(lambda p, c: rewards.score_environment(p, c, cache=False), env_items), 1)
    rewards.clear_cache()
    _rate(lambda p, c: rewards.score_environment(p, c), env_items)
    out["env_cached_per_s"] = round(_rate(lambda p, c: rewards.score_environment(p, c), env_items, 5), 1)
    out["pool_size"] = pool.size
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--games", type=int, default=40, help="games per data-generation run")
    ap.add_argument("--skip-datagen", action="store_true")
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args()
    result = {"machine": f"{platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} usable cores",
              "loadavg_before": os.getloadavg(), "engine": engine.engine_version(),
              "settings": "depth=8, multipv=5, Threads=1, Hash=16, hash cleared per search"}
    if not args.skip_datagen:
        result["datagen"] = [bench_datagen(args.games, w) for w in (1, 2)]
    result["rewards"] = bench_rewards()
    result["loadavg_after"] = os.getloadavg()
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
