"""Data at scale: datagen's lean UCI client against python-chess's, A: transitions, SFT loader memory.

    .venv/bin/python benchmarks/bench_datagen.py labels [--positions 300] [--rounds 4] [--workers 1]
    .venv/bin/python benchmarks/bench_datagen.py games [--games 60] [--rounds 4] [--workers 1]
    .venv/bin/python benchmarks/bench_datagen.py env [--games 200]
    .venv/bin/python benchmarks/bench_datagen.py loader --mode stream|memory [--full-pass] --batches 200 FILE ...

`labels` and `games` time the two drivers on the same work in interleaved rounds (the order swapped
every round, so a change in the machine's load hits both): the P: labels of the first positions of
policy_train at the shipped settings (depth 8, multipv 5; EnginePool.analyse_many against
LeanPool.label_many), and the shipped set's first engine games (EnginePool.session against
LeanPool.session; the moves are checked equal). Engines start and end inside each timing. CPU is
this process's plus the reaped engines' (getrusage): the figure to compare on a shared machine.
One JSON object per round; the numbers in docs/datagen.md come from this script.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time

from rookworld_lib.chess import data, datagen, engine


def _cpu() -> tuple[float, float]:
    """(this process's CPU seconds, reaped children's CPU seconds)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def _timed(fn) -> dict:
    (c0, k0), t0 = _cpu(), time.perf_counter()
    fn()
    (c1, k1), t1 = _cpu(), time.perf_counter()
    return {"wall_s": round(t1 - t0, 2), "python_cpu_s": round(c1 - c0, 2), "engine_cpu_s": round(k1 - k0, 2),
            "cpu_s": round(c1 - c0 + k1 - k0, 2)}


def _rounds(what: str, n: int, rounds: int, contenders: dict, check=None) -> None:
    """Time `contenders` {name: fn} in turn, `rounds` times, swapping the order each round."""
    names = list(contenders)
    for r in range(rounds):
        out = {what: n, "round": r, "loadavg_1min": round(os.getloadavg()[0], 2)}
        for name in names if r % 2 == 0 else names[::-1]:
            out[name] = _timed(contenders[name])
        out["cpu_python_chess_over_lean"] = round(out["python_chess"]["cpu_s"] / out["lean"]["cpu_s"], 3)
        if check is not None:
            out.update(check())
        print(json.dumps(out), flush=True)


def bench_labels(n: int, rounds: int, workers: int) -> None:
    fens = [r["fen"] for r in data.load_split("P", "train")[:n]]
    settings = engine.EngineSettings(depth=8, multipv=5)
    got = {}

    def python_chess():
        with engine.EnginePool(settings, size=workers, cache=False) as pool:
            got["python_chess"] = pool.analyse_many(fens)

    def lean():
        with datagen.LeanPool(settings, size=workers) as pool:
            out = {}
            pool.label_many(fens, on_result=out.__setitem__)
            got["lean"] = [out[i] for i in range(len(fens))]

    _rounds("positions", n, rounds, {"python_chess": python_chess, "lean": lean},
            lambda: {"same_labels": got["python_chess"] == got["lean"]})


def bench_games(n: int, rounds: int, workers: int) -> None:
    cfg = datagen.DatagenConfig(test_games=16)
    idx = [i for i in range(cfg.games + cfg.mate_games + cfg.test_games) if datagen.game_plan(i, cfg)["kind"] != "random"][:n]
    games = {}

    def play(name, pool):
        with pool:
            games[name] = sorted((g for _, g in engine.threaded(lambda i: datagen.play_game(i, cfg, pool), idx, workers)),
                                 key=lambda g: g["game"])

    _rounds("games", len(idx), rounds,
            {"python_chess": lambda: play("python_chess", engine.EnginePool(engine.EngineSettings(), size=workers, cache=False)),
             "lean": lambda: play("lean", datagen.LeanPool(engine.EngineSettings(), size=workers))},
            lambda: {"plies": sum(len(g["moves"]) for g in games["lean"]), "same_moves": games["python_chess"] == games["lean"]})


def bench_env(games: int, workers: int) -> None:
    """A: transitions from every move of random games (python-chess only, no labels)."""
    with tempfile.TemporaryDirectory() as out:
        cfg = datagen.DatagenConfig(out_dir=out, games=games, mate_games=0, random_share=1.0, opening_share=0.0,
                                    policy_rate=0.0, env_rate=1.0, workers=workers, shard_size=100_000, compress=True)
        load, t0, (c0, _) = os.getloadavg()[0], time.perf_counter(), _cpu()
        rep = datagen.generate(cfg, progress=False)
        wall, cpu = time.perf_counter() - t0, _cpu()[0] - c0
    n = rep.env_records
    print(json.dumps({"games": games, "loadavg_1min": round(load, 2), "env_records": n,
                      "env_per_python_cpu_s": round(n / cpu, 1),  # the contention-free figure (one Python thread works)
                      "seconds": {k: round(v, 2) for k, v in rep.seconds.items()},
                      "env_per_s_sampling_and_writing": round(n / rep.seconds["select"], 1),
                      "env_per_s_end_to_end": round(n / wall, 1)}), flush=True)


def bench_loader(mode: str, files: list[str], batches: int, batch_size: int, block_size: int,
                 full_pass: bool = False) -> None:
    from rookworld_lib.chess.training import RecordReader
    from rookworld_lib.core.train_sft import PackedStream, StreamingPackedStream

    t0 = time.perf_counter()
    if mode == "stream":
        stream = StreamingPackedStream(files, seed=0, reader=RecordReader())
    else:
        stream = PackedStream(RecordReader().load_texts(files), seed=0)
    ready = time.perf_counter() - t0
    vocab = {}
    if full_pass:  # the task vocabulary's pass: every record of every file read, validated and tokenized once
        t0 = time.perf_counter()
        vocab = {"vocab_tokens": len(stream.token_ids()), "vocab_pass_s": round(time.perf_counter() - t0, 1)}
    t0 = time.perf_counter()
    for _ in range(batches):
        stream.next_batch(batch_size, block_size)
    dt = time.perf_counter() - t0
    print(json.dumps({"mode": mode, "files": len(files), "loadavg_1min": round(os.getloadavg()[0], 2),
                      "ready_s": round(ready, 2), **vocab, "batches": batches,
                      "tokens_per_s": round(batches * batch_size * block_size / dt),
                      "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}), flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    for name, n, default in (("labels", "--positions", 300), ("games", "--games", 60)):
        p = sub.add_parser(name)
        p.add_argument(n, dest="n", type=int, default=default)
        p.add_argument("--rounds", type=int, default=4)
        p.add_argument("--workers", type=int, default=1, help="engines per driver")
    env = sub.add_parser("env")
    env.add_argument("--games", type=int, default=200)
    env.add_argument("--workers", type=int, default=2)
    ld = sub.add_parser("loader")
    ld.add_argument("--mode", choices=("stream", "memory"), required=True)
    ld.add_argument("--batches", type=int, default=200)
    ld.add_argument("--batch-size", type=int, default=8)
    ld.add_argument("--block-size", type=int, default=256)
    ld.add_argument("--full-pass", action="store_true", help="also build the task vocabulary (a pass over every record)")
    ld.add_argument("files", nargs="+")
    a = ap.parse_args(argv)
    if a.what == "labels":
        bench_labels(a.n, a.rounds, a.workers)
    elif a.what == "games":
        bench_games(a.n, a.rounds, a.workers)
    elif a.what == "env":
        bench_env(a.games, a.workers)
    else:
        bench_loader(a.mode, a.files, a.batches, a.batch_size, a.block_size, a.full_pass)


if __name__ == "__main__":
    sys.exit(main())
