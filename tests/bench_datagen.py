"""Data at scale (issue #14 item 1): P: label cost against the raw Stockfish search, A: transitions
per second, and the SFT loaders' peak memory (a benchmark, not a test: pytest skips it).

    .venv/bin/python tests/bench_datagen.py labels [--positions 300] [--rounds 3]
    .venv/bin/python tests/bench_datagen.py games [--games 1000]
    .venv/bin/python tests/bench_datagen.py env [--games 200]
    .venv/bin/python tests/bench_datagen.py loader --mode stream|memory [--full-pass] --batches 200 FILE ...

`labels` interleaves, round by round on the same positions (the shipped data's depth 8, multipv 5):
raw search (plain UCI lines to one Stockfish, nothing parsed; and to two at once, the ideal on two
cores), the python-chess pool (`EnginePool.analyse_many`, what datagen used before) and datagen's
labeller (`EnginePool.label_many`). Each line is one JSON object; the numbers in docs/datagen.md
come from this script. Run `loader` once per mode: peak RSS is the process's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

from rookworld_lib.chess import data, datagen, engine
from rookworld_lib.core.tokenizer import get_tokenizer


def _cpu() -> tuple[float, float]:
    """(this process's CPU seconds, reaped children's CPU seconds)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def _raw(fens: list[str], depth: int, multipv: int) -> None:
    """The raw search: one Stockfish, the three UCI lines of a fresh-search analysis per position,
    read up to `bestmove` without parsing anything."""
    p = subprocess.Popen([engine.find_stockfish()], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def until(prefix):
        for line in p.stdout:
            if line.startswith(prefix):
                return

    p.stdin.write(f"uci\nsetoption name Threads value 1\nsetoption name Hash value 16\n"
                  f"setoption name MultiPV value {multipv}\nisready\n")
    p.stdin.flush()
    until("readyok")
    for fen in fens:
        p.stdin.write(f"ucinewgame\nposition fen {fen}\ngo depth {depth}\n")
        p.stdin.flush()
        until("bestmove")
    p.stdin.write("quit\n")
    p.stdin.flush()
    p.wait()


def _timed(fn) -> dict:
    (c0, k0), t0 = _cpu(), time.perf_counter()
    fn()
    (c1, k1), t1 = _cpu(), time.perf_counter()
    return {"wall_s": t1 - t0, "python_cpu_s": c1 - c0, "engine_cpu_s": k1 - k0}


def bench_labels(n: int, rounds: int, depth: int = 8, multipv: int = 5) -> None:
    recs = data.load_split("P", "train")[:n]
    fens = [r["fen"] for r in recs]
    enc = get_tokenizer()
    tokens = sum(len(enc.encode(r["prompt"] + r["completion"])) + 1 for r in recs)  # + EOT
    settings = engine.EngineSettings(depth=depth, multipv=multipv)
    halves = [fens[0::2], fens[1::2]]

    def raw2():
        threads = [threading.Thread(target=_raw, args=(h, depth, multipv)) for h in halves]
        [t.start() for t in threads]
        [t.join() for t in threads]

    def pooled(method):  # engines are started (and closed, so their CPU is counted) inside the timing
        def run():
            with engine.EnginePool(settings, size=2, cache=False) as pool:
                getattr(pool, method)(fens)
        return run

    for r in range(rounds):
        load = os.getloadavg()[0]
        out = {"round": r, "positions": n, "tokens": tokens, "loadavg_1min": round(load, 2)}
        for name, fn in (("raw1", lambda: _raw(fens, depth, multipv)), ("raw2", raw2),
                         ("pool_python_chess", pooled("analyse_many")), ("label_many", pooled("label_many"))):
            t = _timed(fn)
            out[name] = {k: round(v, 3) for k, v in t.items()} | {"positions_per_s": round(n / t["wall_s"], 2),
                                                                   "tokens_per_s": round(tokens / t["wall_s"], 1)}
        raw1, raw2w = out["raw1"]["wall_s"], out["raw2"]["wall_s"]
        for name in ("pool_python_chess", "label_many"):
            w = out[name]["wall_s"]
            out[name]["vs_raw2_wall"] = round(w / raw2w, 3)  # 2 engines vs 2 raw engines, same machine state
            out[name]["core_s_per_pos_vs_raw1"] = round(2 * w / raw1, 3)  # 2 cores' time vs one raw engine's
        print(json.dumps(out), flush=True)


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


def bench_games(n: int) -> None:
    """The shipped set's first `n` engine games, played on python-chess sessions and on lean sessions:
    the same moves (checked), and the CPU each costs."""
    cfg = datagen.DatagenConfig(test_games=16)
    idx = [i for i in range(cfg.games + cfg.mate_games + cfg.test_games) if datagen.game_plan(i, cfg)["kind"] != "random"][:n]
    games, out = {}, {"games": len(idx), "loadavg_1min": round(os.getloadavg()[0], 2)}
    for name, opener in (("python_chess_session", "session"), ("lean_session", "lean_session")):
        def play_all():
            with engine.EnginePool(engine.EngineSettings(), size=2, cache=False) as pool:
                pool.lean_session = getattr(pool, opener)  # datagen.play_game opens pool.lean_session()
                games[name] = [g for _, g in engine.threaded(lambda i: datagen.play_game(i, cfg, pool), idx, 2)]
        out[name] = {k: round(v, 2) for k, v in _timed(play_all).items()}
    a, b = (sorted(games[k], key=lambda g: g["game"]) for k in ("python_chess_session", "lean_session"))
    out["plies"], out["same_moves"] = sum(len(g["moves"]) for g in a), a == b
    print(json.dumps(out), flush=True)


def bench_loader(mode: str, files: list[str], batches: int, batch_size: int, block_size: int,
                 full_pass: bool = False) -> None:
    from rookworld_lib.core.train_sft import PackedStream, StreamingPackedStream, load_texts

    t0 = time.perf_counter()
    if mode == "stream":
        stream = StreamingPackedStream(files, seed=0, policy_fraction=None)
    else:
        stream = PackedStream(load_texts(files), seed=0, policy_fraction=None)
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
    lab = sub.add_parser("labels")
    lab.add_argument("--positions", type=int, default=300)
    lab.add_argument("--rounds", type=int, default=3)
    gm = sub.add_parser("games")
    gm.add_argument("--games", type=int, default=1000)
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
        bench_labels(a.positions, a.rounds)
    elif a.what == "games":
        bench_games(a.games)
    elif a.what == "env":
        bench_env(a.games, a.workers)
    else:
        bench_loader(a.mode, a.files, a.batches, a.batch_size, a.block_size, a.full_pass)


if __name__ == "__main__":
    sys.exit(main())
