"""Throughput of data generation and reward scoring (a benchmark, not a test).

    .venv/bin/python benchmarks/bench_data_rewards.py [--games 40] [--json out.json]

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
import resource
import tempfile
import time

import chess

from rookworld_lib.chess import data, datagen, engine, rewards


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)  # reaped children: the engines of closed pools
    return ru.ru_utime + ru.ru_stime


def bench_datagen(games: int, workers: int) -> dict:
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as out:
        cfg = datagen.DatagenConfig(out_dir=out, games=games, mate_games=0, workers=workers)
        c0, t0 = _children_cpu(), time.perf_counter()
        rep = datagen.generate(cfg, progress=False)
        wall, engine_cpu = time.perf_counter() - t0, _children_cpu() - c0
    samples = sum(rep.counts.values())
    return {"workers": workers, "games": games, "loadavg_1min_before": round(load, 2),
            "engine_cpu_seconds": round(engine_cpu, 2),
            "positions_per_engine_cpu_second": round(rep.positions_labelled / max(engine_cpu, 1e-9), 2),
            "positions_labelled": rep.positions_labelled,
            "label_seconds": round(rep.seconds["label"], 2),
            "label_positions_per_s": round(rep.label_positions_per_s, 2),
            "games_seconds": round(rep.seconds["games"], 2), "total_seconds": round(wall, 2),
            "samples_written": samples, "samples_per_s_end_to_end": round(samples / wall, 2),
            "p_positions_per_s_end_to_end": round(rep.positions_labelled / wall, 2)}


def _rate(fn, items, repeat=1, best_of=3, reset=None) -> float:
    """Items per second, the best of `best_of` timings (the least disturbed by other processes);
    `reset` runs before each timing (e.g. to empty a cache)."""
    best = 0.0
    for _ in range(best_of):
        if reset is not None:
            reset()
        t0 = time.perf_counter()
        for _ in range(repeat):
            for it in items:
                fn(*it)
        best = max(best, len(items) * repeat / (time.perf_counter() - t0))
    return best


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
    _rate(lambda p, c, t: rewards.score_policy(p, c, truth=t), pol_items, best_of=1, reset=rewards.clear_cache)  # fill
    out["policy_truth_cached_per_s"] = round(_rate(lambda p, c, t: rewards.score_policy(p, c, truth=t), pol_items, 5), 1)
    # policy, live Stockfish (no truth): a cold analysis cache means one search per position
    rewards.clear_truth()
    pool = engine.get_pool()
    pool.analyse(chess.STARTING_FEN)  # start the engines outside the timing
    cold = lambda: rewards.clear_cache(analyses=True)  # noqa: E731
    out["policy_live_engine_cold_per_s"] = round(_rate(lambda p, c: rewards.score_policy(p, c), pol_live, reset=cold), 1)
    out["policy_live_engine_analysis_cached_per_s"] = round(
        _rate(lambda p, c: rewards.score_policy(p, c), pol_live, reset=rewards.clear_cache), 1)
    out["policy_live_engine_fully_cached_per_s"] = round(_rate(lambda p, c: rewards.score_policy(p, c), pol_live, 20), 1)
    batch = [([p for p, _ in pol_live], [c for _, c in pol_live])]
    out["policy_live_engine_score_batch_cold_per_s"] = round(
        _rate(lambda ps, cs: rewards.score_batch(ps, cs), batch, reset=cold) * len(pol_live), 1)
    # environment (truth by replay)
    out["env_uncached_per_s"] = round(_rate(lambda p, c: rewards.score_environment(p, c, cache=False), env_items), 1)
    _rate(lambda p, c: rewards.score_environment(p, c), env_items, best_of=1, reset=rewards.clear_cache)
    out["env_cached_per_s"] = round(_rate(lambda p, c: rewards.score_environment(p, c), env_items, 5), 1)
    out["pool_size"] = pool.size
    return out


def _engine_version() -> str:
    """The UCI id name of the Stockfish binary, e.g. ``Stockfish 15.1``."""
    with engine.EnginePool(engine.EngineSettings(depth=1), size=1, cache=False) as pool:
        return pool.version


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--games", type=int, default=40, help="games per data-generation run")
    ap.add_argument("--skip-datagen", action="store_true")
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args()
    result = {"machine": f"{platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} usable cores",
              "loadavg_before": os.getloadavg(), "engine": _engine_version(),
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
