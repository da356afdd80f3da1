"""The Stockfish component: settings, discovery, analysis, cache, faults, clean exit."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import chess
import pytest
from helpers_chess import engine_pids, needs_stockfish, random_positions, wait_gone

from rookworld_lib.chess import engine
from rookworld_lib.chess.engine import EnginePool, EngineSettings
from rookworld_lib.chess.tasks import Eval

pytestmark = needs_stockfish


# ------------------------------------------------------------------------------------------
# Settings and discovery (no engine needed)
# ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, field", [
    (dict(depth=0), "depth"), (dict(depth=2.5), "depth"), (dict(depth=True), "depth"), (dict(nodes=-1), "nodes"),
    (dict(time=0), "time"), (dict(multipv=0), "multipv"), (dict(threads=0), "threads"),
    (dict(hash_mb=0), "hash_mb"), (dict(fresh_search="yes"), "fresh_search"), (dict(max_retries=-1), "max_retries"),
    (dict(path=3), "path"),
    # past LIMIT_RANGES: labels made under such settings would be refused by every loader
    (dict(depth=41), "depth"), (dict(depth=None, nodes=10**8 + 1), "nodes"), (dict(depth=None, time=61.0), "time"),
])
def test_settings_reject_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=f"EngineSettings.{field}"):
        EngineSettings(**kwargs)


def test_settings_need_a_limit_and_describe_it():
    with pytest.raises(ValueError, match="at least one of depth, nodes, time"):
        EngineSettings(depth=None)
    s = EngineSettings(depth=8)
    assert s.limit_key == "depth=8" and s.reproducible
    assert engine.parse_limit_key("depth=8,nodes=1000") == chess.engine.Limit(depth=8, nodes=1000)
    assert not EngineSettings(depth=None, time=0.1).reproducible
    assert not EngineSettings(threads=2).reproducible
    # the widest settings make labels the record check takes (one range for both)
    for kw in (dict(depth=40), dict(depth=None, nodes=10**8), dict(depth=None, time=60.0), dict(depth=1, nodes=1)):
        key = EngineSettings(**kw).limit_key
        assert engine.parse_limit_key(key) == EngineSettings(**kw).limit, key


def test_every_search_gets_a_generous_time_limit_from_its_budget():
    Limit = chess.engine.Limit
    floor = engine.TIMEOUT_FLOOR_S
    assert engine.search_timeout(Limit(depth=1)) > floor  # never below the floor, however small the search
    d8, d18 = engine.search_timeout(Limit(depth=8), 5), engine.search_timeout(Limit(depth=18), 5)
    assert floor < d8 < 20 and d18 > 600  # Stockfish takes ~0.07 s and ~16 s for these on one core
    assert engine.search_timeout(Limit(nodes=10**6)) == pytest.approx(floor + 50)  # 5x 10 s at 100k nodes/s
    assert engine.search_timeout(Limit(depth=30, nodes=1000)) < floor + 1  # the first limit reached counts
    assert engine.search_timeout(Limit(time=2.0), floor=1.0) == 11.0
    assert engine.search_timeout(Limit(mate=3)) is None  # no budget, no limit


@pytest.mark.fault
def test_missing_stockfish_names_the_install_commands(monkeypatch, tmp_path):
    monkeypatch.setenv("STOCKFISH_PATH", str(tmp_path / "no-such-stockfish"))
    with pytest.raises(engine.StockfishNotFoundError) as err:
        engine.find_stockfish()
    msg = str(err.value)
    assert "no-such-stockfish" in msg and "STOCKFISH_PATH" in msg
    assert "apt-get install -y stockfish" in msg and "conda install -c conda-forge stockfish" in msg
    with pytest.raises(engine.StockfishNotFoundError):
        EnginePool(EngineSettings(depth=1))
    monkeypatch.setenv("STOCKFISH_PATH", str(tmp_path))  # the folder, not the program in it: said so
    with pytest.raises(engine.StockfishNotFoundError, match=rf"at '{tmp_path}' \(STOCKFISH_PATH: a directory, not the "
                                                            r"program in it\)"):
        engine.find_stockfish()
    (tmp_path / "sf").write_text("#!/bin/sh\n")  # a program without the execute bit: said so, not just "not found"
    with pytest.raises(engine.StockfishNotFoundError, match=rf"at '{tmp_path / 'sf'}' \(the given path: a file without "
                                                            r"execute permission; chmod \+x it\)"):
        engine.find_stockfish(tmp_path / "sf")
    # nothing anywhere: PATH empty and no Debian binary
    monkeypatch.delenv("STOCKFISH_PATH")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(engine, "DEBIAN_PATH", str(tmp_path / "missing"))
    with pytest.raises(engine.StockfishNotFoundError, match="apt-get install -y stockfish"):
        engine.find_stockfish()


def test_found_via_stockfish_path(monkeypatch):
    real = engine.find_stockfish()
    monkeypatch.setenv("STOCKFISH_PATH", real)
    assert engine.find_stockfish() == real


# ------------------------------------------------------------------------------------------
# Analysis
# ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pool():
    p = EnginePool(EngineSettings(depth=8), size=2, cache=engine.AnalysisCache())
    yield p
    p.close()


def test_start_position_candidates(pool):
    a = pool.analyse(chess.STARTING_FEN)
    assert len(a.moves) == len(a.evals) == 5 and a.limit == "depth=8" and a.depth >= 8
    cps = [e.to_cp() for e in a.evals]
    assert cps == sorted(cps, reverse=True)  # multipv order: best first
    assert a.best in {"e2e4", "d2d4", "g1f3", "c2c4", "e2e3", "b1c3"}
    assert len(set(a.moves)) == 5 and all(chess.Move.from_uci(m) in chess.Board().legal_moves for m in a.moves)


def test_black_to_move_evals_are_from_blacks_view(pool):
    # White's queen on h5 hangs to the knight: Black to move is winning, so its evals are positive
    a = pool.analyse("rnbqkb1r/pppp1ppp/5n2/4p2Q/4P3/8/PPPP1PPP/RNB1KBNR b KQkq - 3 3")
    assert a.best == "f6h5"
    assert a.evals[0].to_cp() > 500  # side to move (Black) is winning
    assert a.evals[0].to_cp() >= max(e.to_cp() for e in a.evals)


def test_mate_in_one_for_black(pool):
    board = chess.Board()
    for m in ("f2f3", "e7e5", "g2g4"):
        board.push_uci(m)
    a = pool.analyse(board)
    assert a.best == "d8h4" and a.evals[0] == Eval(mate=1)
    assert str(a.evals[0]) == "M1"


def test_few_legal_moves_and_terminal_positions(pool):
    a = pool.analyse("7k/8/8/8/8/8/6q1/7K w - - 0 1")  # one legal move: Kxg2
    assert a.moves == ("h1g2",)
    mated = chess.Board("rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3")
    assert mated.is_checkmate() and pool.analyse(mated).moves == ()
    with pytest.raises(ValueError, match="invalid position"):
        pool.analyse("8/8/8/8/8/8/8/8 w - - 0 1")  # no kings: Stockfish would crash on it


def test_cache_is_keyed_by_position_and_limit(pool):
    fen = random_positions(1, seed=5)[0].fen()
    pool.cache.clear()
    a1 = pool.analyse(fen)
    info = pool.cache.info()
    assert (info["hits"], info["misses"]) == (0, 1)
    assert pool.analyse(fen) is a1 and pool.cache.info()["hits"] == 1
    a2 = pool.analyse(fen, limit=chess.engine.Limit(depth=4))
    assert a2.limit == "depth=4" and pool.cache.info()["misses"] == 2
    a3 = pool.analyse(fen, multipv=1)
    assert len(a3.moves) == 1 and pool.cache.info()["misses"] == 3
    # and by the engine that searched: pools sharing a cache (every pool's default) with another hash size,
    # or a search keeping the hash of earlier ones, answer otherwise (Hash 1 against 16 changed 6 of 30
    # depth-8 labels); a pool of the same settings shares the entries
    for other in (EngineSettings(depth=8, hash_mb=1), EngineSettings(depth=8, fresh_search=False)):
        with EnginePool(other, size=1, cache=pool.cache) as p:
            assert p.analyse(fen) is not a1
    with EnginePool(EngineSettings(depth=8), size=1, cache=pool.cache) as same:
        assert same.analyse(fen) is a1 and same._engines == []


def test_results_are_reproducible_across_processes_and_history(pool):
    fens = [b.fen() for b in random_positions(6, seed=8)]
    with EnginePool(EngineSettings(depth=8), size=1, cache=False) as fresh:
        first = [fresh.analyse(f) for f in fens]
        again = [fresh.analyse(f) for f in reversed(fens)][::-1]  # other search history in between
    other = [EnginePool.analyse(pool, f) for f in fens]
    assert first == again == other


def test_root_moves_evaluates_a_single_move(pool):
    a = pool.analyse(chess.STARTING_FEN, multipv=1, root_moves=["g1h3"])
    assert a.moves == ("g1h3",)
    with pytest.raises(ValueError, match="not all legal"):
        pool.analyse(chess.STARTING_FEN, root_moves=["e2e5"])
    with pytest.raises(ValueError, match="not all legal"):  # one illegal move among legal ones (python-chess: e2e5)
        pool.analyse(chess.STARTING_FEN, root_moves=["e2e4", "e2e5"])


# ------------------------------------------------------------------------------------------
# Faults and cleanup
# ------------------------------------------------------------------------------------------

@pytest.mark.fault
def test_killed_engine_mid_batch_loses_no_result_and_leaves_no_process():
    fens = [b.fen() for b in random_positions(24, seed=21, max_plies=60)]
    with EnginePool(EngineSettings(depth=8), size=1, cache=False) as ref:
        expected = [ref.analyse(f) for f in fens[:6]]
    pool = EnginePool(EngineSettings(depth=8), size=2, cache=False)
    killed = []

    def on_result(i, analysis):
        if len(killed) < 3 and i % 5 == 2:  # kill engines several times while others are busy
            for pid in engine_pids(pool)[:1]:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

    results = pool.analyse_many(fens, on_result=on_result)
    assert killed and pool.restarts >= 1
    assert all(r is not None and r.moves for r in results)
    assert results[:6] == expected  # retried results are the real ones
    seen = engine_pids(pool) + killed
    pool.close()
    assert wait_gone(seen, timeout=10) == []


def test_close_is_idempotent_and_refuses_new_work():
    pool = EnginePool(EngineSettings(depth=1), size=1, cache=False)
    pool.analyse(chess.STARTING_FEN)
    pids = engine_pids(pool)
    pool.close()
    pool.close()
    assert wait_gone(pids) == []
    with pytest.raises(engine.EngineFailedError, match="closed"):
        pool.analyse(chess.STARTING_FEN)


def test_an_engine_group_is_killed_while_its_leader_is_unreaped(monkeypatch):
    """Closing a pool kills each engine's process group while the engine's pid is still held (alive or
    a zombie): after the reaping, the freed id could be a new group's, which the kill would hit."""
    pool = EnginePool(EngineSettings(depth=1), size=1, cache=False)
    pool.analyse(chess.STARTING_FEN)
    held, killpg = [], os.killpg

    def recording_killpg(pgid, sig):
        held.append(Path(f"/proc/{pgid}").exists())
        killpg(pgid, sig)

    monkeypatch.setattr(os, "killpg", recording_killpg)
    pids = engine_pids(pool)
    pool.close()
    assert held == [True]
    assert wait_gone(pids) == []


def test_concurrent_callers_share_the_pool_safely():
    fens = [b.fen() for b in random_positions(12, seed=31)]
    with EnginePool(EngineSettings(depth=5), size=2, cache=False) as pool:
        out = {}

        def worker(k):
            out[k] = [pool.analyse(f) for f in fens[k::3]]

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(engine_pids(pool)) <= 2
        assert sum(len(v) for v in out.values()) == len(fens)


@pytest.mark.fault
def test_session_reproducible_and_recovers(monkeypatch):
    board = chess.Board()
    with EnginePool(EngineSettings(depth=1), size=1, cache=False) as pool:
        def game():
            b, moves = chess.Board(), []
            with pool.session() as s:
                for _ in range(8):
                    m = s.play(b, chess.engine.Limit(nodes=64))
                    b.push(m)
                    moves.append(m.uci())
            return moves

        assert game() == game()
        with pytest.raises(engine.EngineSessionLost):
            with pool.session() as s:
                os.kill(engine_pids(pool)[0], signal.SIGKILL)
                time.sleep(0.2)
                s.play(board, chess.engine.Limit(nodes=64))
        assert game() == game()  # a fresh engine replaces the dead one


SCRIPT = textwrap.dedent("""
    import chess
    from helpers_chess import engine_pids
    from rookworld_lib.chess import engine, rewards, tasks
    fen = "r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3"
    prompt = tasks.policy_prompt(fen)
    for best in ("f1b5", "b1c3", "a2a3", "e1e2", "h1h5"):
        completion = f" M: {best} E: 0.3 B: {best}"
        print(round(rewards.score_policy(prompt, completion), 4))
    print("PIDS", *engine_pids(engine.get_pool()), flush=True)
    # no close(), no shutdown(): the process must still exit by itself
""")


@pytest.mark.fault
def test_script_scoring_completions_exits_by_itself(tmp_path):
    script = tmp_path / "score_and_exit.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    scores = [float(x) for x in lines[:5]]
    assert all(-1.0 <= s <= 1.0 for s in scores) and scores[0] > scores[-1]
    pids = [int(p) for p in lines[-1].split()[1:]]
    assert pids, "the script should have started engines"
    assert wait_gone(pids, timeout=10) == []


def test_an_interrupt_fails_running_searches_at_once_without_restarting_engines():
    # Ctrl-C's path (pool.interrupt): the search in flight fails with EngineFailedError and is not retried on a
    # fresh engine, so no Stockfish is started behind the user's back; a later request starts one
    with EnginePool(EngineSettings(depth=40), size=1, cache=False) as pool:  # depth 40: a search of minutes
        failed = []

        def search():
            try:
                pool.analyse(chess.Board())
            except engine.EngineFailedError as exc:
                failed.append(exc)

        worker = threading.Thread(target=search)
        worker.start()
        deadline = time.monotonic() + 30
        while not pool._engines and time.monotonic() < deadline:  # the engine has started its search
            time.sleep(0.01)
        time.sleep(0.2)
        pool.interrupt()
        worker.join(20)
        assert not worker.is_alive() and len(failed) == 1 and pool.restarts == 0
        assert pool.analyse(chess.Board(), multipv=1, limit=chess.engine.Limit(depth=1)).moves


def test_the_analysis_cache_evicts_the_least_recently_used_entry_and_counts_hits():
    """An LRU as functools.lru_cache keeps one: a read makes an entry recent, so the one neither read nor
    written longest goes first when the cache is full."""
    c = engine.AnalysisCache(maxsize=2)
    c.put("a", 1)
    c.put("b", 2)
    assert c.get("a") == 1  # "a" is now the more recent
    c.put("c", 3)  # full: "b" goes
    assert (c.get("b"), c.get("a"), c.get("c")) == (None, 1, 3)
    assert (c.hits, c.misses) == (3, 1)


def _a_pathlib_path_is_kept_as_text():
    assert EngineSettings(path=Path(engine.DEBIAN_PATH)).path == engine.DEBIAN_PATH


def _limit_keys_round_trip():
    # python-chess's Limit is the reference for a good key, and limit_key writes what parse_limit_key reads
    assert engine.parse_limit_key("depth=8") == chess.engine.Limit(depth=8)
    limit = chess.engine.Limit(depth=8, nodes=1000, time=0.5)
    assert engine.parse_limit_key(engine.limit_key(limit)) == limit


def _a_pool_of_one_starts_nothing_and_closes():
    EnginePool(EngineSettings(depth=1), size=1, cache=False).close()  # engines start lazily: none here


def _limit(key: str):
    return lambda: engine.parse_limit_key(key)


@pytest.mark.parametrize("call, match, boundary", [
    # a pathlib.Path is a path (find_stockfish takes one too) and is kept as text; a number is not
    pytest.param(lambda: EngineSettings(path=3), r"^EngineSettings\.path must be a string, got 3$",
                 _a_pathlib_path_is_kept_as_text, id="path-number"),
    pytest.param(_limit("depth8"), r"^not a limit key: 'depth8' \(name=value parts", _limit_keys_round_trip, id="limit-no-equals"),
    pytest.param(_limit("movetime=100"), r"^not a limit key: 'movetime=100' \(name=value parts", _limit("time=0.1"), id="limit-unknown-name"),
    pytest.param(_limit("depth=8,nodes="), r"^not a limit key: 'depth=8,nodes=' \(name=value parts", _limit("depth=8,nodes=1"),
                 id="limit-empty-value"),
    pytest.param(_limit("depth=eight"), r"^not a limit key: 'depth=eight' \(name=value parts", None, id="limit-not-a-number"),
    pytest.param(_limit("depth=41"), r"^limit 'depth=41': depth must be in \[1, 40\]$", _limit("depth=40"),
                 id="limit-depth-past-its-range"),
    pytest.param(_limit("nodes=100000001"), r"^limit 'nodes=100000001': nodes must be in", _limit("nodes=100000000"),
                 id="limit-nodes-past-its-range"),
    pytest.param(_limit("time=nan"), r"^limit 'time=nan': time must be in \[0.001, 60\]$", _limit("time=60"), id="limit-time-nan"),
    pytest.param(lambda: EnginePool(size=0), r"^EnginePool size must be a positive int, got 0$",
                 _a_pool_of_one_starts_nothing_and_closes, id="pool-size-0"),
    pytest.param(lambda: EnginePool(size=2.0), r"^EnginePool size must be a positive int, got 2\.0$", None, id="pool-size-float"),
    pytest.param(lambda: EnginePool(size=True), r"^EnginePool size must be a positive int, got True$", None, id="pool-size-bool"),
])
def test_bad_engine_arguments_name_the_argument(call, match, boundary):
    with pytest.raises(ValueError, match=match):
        call()
    if boundary is not None:
        boundary()  # the nearest good value passes the same check


@needs_stockfish
def test_max_retries_zero_means_one_attempt_not_none():
    # max_retries is the number of *re*-tries: 0 still starts one engine and runs one search
    with EnginePool(EngineSettings(depth=4, max_retries=0), size=1, cache=False) as pool:
        a = pool.analyse(chess.STARTING_FEN, multipv=1)
    assert len(a.moves) == 1 and chess.Move.from_uci(a.moves[0]) in chess.Board().legal_moves


@needs_stockfish
def test_a_cached_full_analysis_never_answers_a_root_moves_request():
    cache = engine.AnalysisCache()
    with EnginePool(EngineSettings(depth=4), size=1, cache=cache) as pool:
        full = pool.analyse(chess.STARTING_FEN, multipv=1)
        restricted = pool.analyse(chess.STARTING_FEN, multipv=1, root_moves=["g1h3"])
    with EnginePool(EngineSettings(depth=4), size=1, cache=False) as fresh:  # independent reference: no cache
        ref = fresh.analyse(chess.STARTING_FEN, multipv=1, root_moves=["g1h3"])
    assert full.moves != ("g1h3",)
    assert restricted == ref and restricted.moves == ("g1h3",)


@needs_stockfish
def test_an_engine_killed_while_a_session_held_it_is_not_handed_out_again():
    # interrupt() kills every engine, the one a session holds too; when that session ends its dead
    # engine must not go back to the idle queue (the next request would fail on it, or burn a retry)
    with EnginePool(EngineSettings(depth=4, max_retries=0), size=1, cache=False) as pool:
        with pool.session():
            pool.interrupt()
        a = pool.analyse(chess.STARTING_FEN, multipv=1)
        assert len(a.moves) == 1 and pool.restarts == 0


# Behaviours of chess/engine that no test pinned (mutation round 6, stop 68: each test below is red with its mutant)

@needs_stockfish
def test_a_multipv_search_gets_the_watchdog_its_multipv_budget_calls_for(monkeypatch):
    # search_timeout's docstring: floor + 5 x (multipv * 20 * 2**depth nodes at 100k nodes/s).
    # depth 8, multipv 5: 10 + 5 * (5 * 20 * 256 / 100_000) = 11.28 s (multipv 1 would be 10.256 s)
    intervals = []

    class RecordingTimer(threading.Timer):
        def __init__(self, interval, function, *args, **kwargs):
            intervals.append(interval)
            super().__init__(interval, function, *args, **kwargs)

    with EnginePool(EngineSettings(depth=8), size=1, cache=False) as pool:
        pool.analyse(chess.STARTING_FEN, multipv=1)  # starts the engine (no Timer from engine start)
        monkeypatch.setattr(threading, "Timer", RecordingTimer)
        pool.analyse(chess.STARTING_FEN, multipv=5)
    assert intervals == [pytest.approx(10 + 5 * (5 * 20 * 2 ** 8 / 100_000))]


def test_analysis_depth_is_the_deepest_line():
    # Analysis.depth: "depth Stockfish reached (deepest line)"; hand-built python-chess infos
    board = chess.Board()
    infos = [
        {"pv": [chess.Move.from_uci("e2e4")], "score": chess.engine.PovScore(chess.engine.Cp(30), chess.WHITE), "depth": 9},
        {"pv": [chess.Move.from_uci("d2d4")], "score": chess.engine.PovScore(chess.engine.Cp(20), chess.WHITE), "depth": 12},
        {"pv": [chess.Move.from_uci("g1f3")], "score": chess.engine.PovScore(chess.engine.Cp(10), chess.WHITE), "depth": 7},
    ]
    a = engine._to_analysis(board.fen(), board.turn, infos, "depth=12")
    assert a.depth == 12 and a.moves == ("e2e4", "d2d4", "g1f3")


def test_threaded_yields_every_result_once_reading_items_at_most_two_per_thread_ahead():
    read = []

    def items():
        for i in range(20):
            read.append(i)
            yield i

    got = {}
    for i, square in engine.threaded(lambda x: x * x, items(), 3, total=20):
        assert len(read) <= len(got) + 1 + 2 * 3  # those yielded and this one, plus at most 2 x workers in flight
        got[i] = square
    assert got == {i: i * i for i in range(20)}


def test_threaded_raises_a_calls_error_and_starts_no_queued_call():
    started = []

    def call(i):
        started.append(i)
        if i == 0:
            raise ValueError("engine said no")
        time.sleep(0.05)
        return i

    with pytest.raises(ValueError, match="engine said no"):
        list(engine.threaded(call, range(50), 2))
    time.sleep(0.3)  # the running calls end; nothing queued starts after the error
    assert len(started) <= 1 + 2 * 2


INTERRUPTED_WHILE_A_CALL_NEVER_ENDS = textwrap.dedent("""
    import threading
    from rookworld_lib.chess.engine import threaded
    never = threading.Event()
    try:
        for i, _ in threaded(lambda i: i or never.wait(), range(6), 2):  # calls 1, 2, ... never return
            raise KeyboardInterrupt  # Ctrl-C reaches the main thread while they run
    except KeyboardInterrupt:
        print("interrupted", flush=True)
""")


@pytest.mark.fault
def test_ctrl_c_in_threaded_exits_without_waiting_for_running_calls():
    """A Ctrl-C that reached `rookworld datagen` inside concurrent.futures.wait once left a worker that
    never ended, and the exit waited for it (a fresh clone's make test: no exit 60 s after SIGINT).
    Whatever the running calls do, the interpreter exits at once."""
    proc = subprocess.run([sys.executable, "-c", INTERRUPTED_WHILE_A_CALL_NEVER_ENDS], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert (proc.returncode, proc.stdout) == (0, "interrupted\n"), proc.stderr
