"""Stockfish through python-chess's UCI driver: a pool of engine processes with a shared cache.

:func:`find_stockfish` names the install commands when no binary is found. With
:class:`EngineSettings`' ``fresh_search`` (the default), one thread and a depth or node limit, a
search starts from a cleared hash, so its result depends only on (position, limit): it can be cached
and audited. :class:`EnginePool` runs up to ``size`` engines, one thread each. Engines fail loudly
and never hang: every search has a time limit from its budget (:func:`search_timeout`), and a failed
start or request is retried on a fresh process, then raises :class:`EngineFailedError`. Each engine
runs in a process group of its own and is killed as a group: one behind a wrapper script dies with
its children.
(Data generation labels and plays on its own lean UCI client, :class:`.datagen.LeanPool`: same results.)

Engines end one way, :meth:`EnginePool.close` (``with``, garbage collection, Ctrl-C in ``map``, and
interpreter exit). python-chess runs each engine's event loop on a *non-daemon* thread, which Python
joins *before* ``atexit`` handlers run, so the exit hook uses ``threading._register_atexit``.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import itertools
import logging
import os
import queue
import shutil
import signal
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass

import chess
import chess.engine

from .tasks import Eval
from ..core.config import option, validate
from ..core.progress import tqdm

log = logging.getLogger(__name__)

DEFAULT_DEPTH = 8
DEBIAN_PATH = "/usr/games/stockfish"
INSTALL_HINT = (
    "Install Stockfish with `apt-get install -y stockfish` (Debian/Ubuntu; binary at /usr/games/stockfish) "
    "or `conda install -c conda-forge stockfish`, or set STOCKFISH_PATH to the binary."
)
TIMEOUT_FLOOR_S = 10.0  # engine start, and the least time any search gets before it counts as hung
SLOW_NODES_PER_S = 100_000  # a slow, loaded core (Stockfish searches 0.4-1.5M nodes/s on one)


class StockfishNotFoundError(RuntimeError):
    """No usable Stockfish binary; the message says where we looked and how to install one."""


class EngineFailedError(RuntimeError):
    """Stockfish failed on every retry (would not start, died, hung), or the pool is closed."""


class EngineSessionLost(EngineFailedError):
    """The engine of a session died; the caller must start the whole sequence again."""


def find_stockfish(path: str | os.PathLike | None = None) -> str:
    """The Stockfish binary: `path`, else ``STOCKFISH_PATH``, else ``stockfish`` on the PATH, else
    ``/usr/games/stockfish``. Raises StockfishNotFoundError with the install commands."""
    explicit = path if path is not None else os.environ.get("STOCKFISH_PATH") or None
    if explicit is None:
        found = shutil.which("stockfish") or shutil.which(DEBIAN_PATH)
        where = f"(looked at $STOCKFISH_PATH, `stockfish` on the PATH and {DEBIAN_PATH})"
    else:  # shutil.which takes a path with a directory as it is, and looks a bare name up on the PATH
        explicit = os.path.expanduser(str(explicit))
        found = shutil.which(explicit)
        where = f"at {explicit!r} ({'STOCKFISH_PATH' if path is None else 'the given path'}"
        where += (": a directory, not the program in it)" if os.path.isdir(explicit) else
                  ": a file without execute permission; chmod +x it)" if os.path.isfile(explicit) and os.sep in explicit
                  and not os.access(explicit, os.X_OK) else ")")
    if not found:
        raise StockfishNotFoundError(f"Stockfish not found {where}. {INSTALL_HINT}")
    return found


def stockfish_available(path: str | None = None) -> bool:
    """True when :func:`find_stockfish` finds a binary (it may still fail to run)."""
    try:
        return bool(find_stockfish(path))
    except StockfishNotFoundError:
        return False


MAX_WORKERS = 256  # processes a command runs at once (datagen's engines, convert's parsers): more is a typo


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask), at least 1."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# --- Settings and results ---

# every search the workbench runs: a label's, and a reward's of an unlisted move (10^8 nodes take minutes)
LIMIT_RANGES = {"depth": (1, 40), "nodes": (1, 10**8), "time": (0.001, 60.0)}


@dataclass(frozen=True)
class EngineSettings:
    """Stockfish search settings. Bad values fail at construction, naming the field."""

    depth: int | None = option(DEFAULT_DEPTH, "search depth in plies (None: no depth limit)",
                                min=LIMIT_RANGES["depth"][0], max=LIMIT_RANGES["depth"][1])
    nodes: int | None = option(None, "node budget per search (None: no node limit)",
                               min=LIMIT_RANGES["nodes"][0], max=LIMIT_RANGES["nodes"][1])
    time: float | None = option(None, "seconds per search (None: no time limit; time limits are not reproducible)",
                                min=LIMIT_RANGES["time"][0], max=LIMIT_RANGES["time"][1])
    multipv: int = option(5, "principal variations per analysis: the candidate moves of a P: label", min=1, max=256)
    threads: int = option(1, "Stockfish `Threads`; 1 keeps results reproducible (the pool adds processes instead)",
                          min=1, max=1024)
    hash_mb: int = option(16, "Stockfish `Hash` in MiB per process", min=1, max=65536)
    fresh_search: bool = option(True, "clear the hash (ucinewgame) before each search: results depend on "
                                "(position, limit) only")
    path: str | None = option(None, "Stockfish binary; None: STOCKFISH_PATH, the PATH, /usr/games/stockfish")
    max_retries: int = option(3, "times a failed engine start or request is retried on a fresh engine", min=0, max=100)

    def __post_init__(self):
        validate(self)
        if self.path is not None:  # validate lets a path-like through, as find_stockfish takes one: kept as text
            object.__setattr__(self, "path", os.fspath(self.path))
        if self.depth is None and self.nodes is None and self.time is None:
            raise ValueError("EngineSettings: set at least one of depth, nodes, time (an unlimited search never ends)")

    @property
    def limit(self) -> chess.engine.Limit:
        """The python-chess search limit of these settings."""
        return chess.engine.Limit(depth=self.depth, nodes=self.nodes, time=self.time)

    @property
    def limit_key(self) -> str:
        """A short, stable spelling of the limit, e.g. ``depth=8`` (recorded with every label)."""
        return limit_key(self.limit)

    @property
    def reproducible(self) -> bool:
        """True when a search result depends only on (position, limit)."""
        return self.fresh_search and self.threads == 1 and self.time is None


def limit_key(limit: chess.engine.Limit) -> str:
    """``depth=8``, ``nodes=1000``, ``depth=8,nodes=1000`` ...: a limit as recorded with labels."""
    parts = [f"{k}={getattr(limit, k)}" for k in ("depth", "nodes", "time") if getattr(limit, k) is not None]
    return ",".join(parts) or "unlimited"


def parse_limit_key(key: str) -> chess.engine.Limit:
    """Inverse of :func:`limit_key` (``depth=8``, ``nodes=1000``, ``depth=8,nodes=1000``), within
    LIMIT_RANGES: a record asking for a longer search would hold a reward for days."""
    kwargs = {}
    for part in key.split(","):
        name, _, value = part.partition("=")
        try:
            if name not in LIMIT_RANGES:
                raise ValueError(name)
            kwargs[name] = float(value) if name == "time" else int(value)
        except ValueError:
            raise ValueError(f"not a limit key: {key!r} (name=value parts joined by ',': depth and nodes "
                             "integers, time seconds, e.g. depth=8,nodes=1000)") from None
        low, high = LIMIT_RANGES[name]
        if not low <= kwargs[name] <= high:  # NaN too
            raise ValueError(f"limit {key!r}: {name} must be in [{low}, {high:g}]")
    return chess.engine.Limit(**kwargs)


def search_timeout(limit: chess.engine.Limit, multipv: int = 1, floor: float | None = None) -> float | None:
    """Seconds after which a search under `limit` counts as hung (None: never): `floor` plus 5x a
    pessimistic estimate, so a loaded machine never trips it. A depth-d search is taken to visit
    multipv * 20 * 2**d nodes (measured ~1.8x per ply: 24k at depth 8, 5M at 18, multipv 5)."""
    floor = TIMEOUT_FLOOR_S if floor is None else floor
    budgets = [limit.time] if limit.time else []
    if limit.nodes:
        budgets.append(limit.nodes / SLOW_NODES_PER_S)
    if limit.depth:
        budgets.append(multipv * 20 * 2.0 ** min(limit.depth, 60) / SLOW_NODES_PER_S)
    # the search stops at the first limit reached; 1e7 s keeps a depth-99 limit within threading's range
    return min(floor + 5 * min(budgets), 1e7) if budgets else None


@dataclass(frozen=True)
class Analysis:
    """A multipv analysis of one position: candidate moves (UCI), best first, and evals for the side to move."""

    fen: str
    moves: tuple[str, ...]
    evals: tuple[Eval, ...]
    limit: str  # limit_key of the search
    depth: int | None = None  # depth Stockfish reached (deepest line)

    @property
    def best(self) -> str | None:
        """The best move (UCI), None in a position without legal moves."""
        return self.moves[0] if self.moves else None


class AnalysisCache:
    """A thread-safe LRU of analyses keyed by (engine binary and settings, FEN, limit, multipv, root moves)."""

    def __init__(self, maxsize: int = 200_000):
        self.maxsize = maxsize
        self._data: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key):
        """The cached analysis or None (counted as a hit or a miss)."""
        with self._lock:
            value = self._data.get(key)
            if value is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key, value) -> None:
        """Store an analysis, evicting the least recently used beyond maxsize."""
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def clear(self) -> None:
        """Forget every analysis and reset the counters."""
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0

    def info(self) -> dict:
        """size, maxsize, hits and misses."""
        return {"size": len(self._data), "maxsize": self.maxsize, "hits": self.hits, "misses": self.misses}


SHARED_CACHE = AnalysisCache()

# --- Threads and engine processes ---

# what a dying, hung or babbling engine raises: the request is retried on a fresh engine
_RETRYABLE = (chess.engine.EngineError, asyncio.TimeoutError, TimeoutError, BrokenPipeError,
              ConnectionResetError, concurrent.futures.CancelledError)


def threaded(fn: Callable, items: Iterable, workers: int, progress: bool = False, desc: str = "",
             unit: str = "item", total: int | None = None) -> Iterator[tuple[int, object]]:
    """(index, fn(item)) as each call completes, on up to `workers` threads. `items` (`total` of them;
    len(items) by default) is read as calls complete, at most 2 x workers ahead: memory does not grow
    with the count. An exception (or Ctrl-C) stops the calls not yet started and propagates without
    waiting for the running ones, at exit too: the threads are daemons. (A ThreadPoolExecutor's are
    joined at exit, and a Ctrl-C that lands inside concurrent.futures.wait can leave a future's lock
    held, so that its worker never ends: `rookworld datagen` then hung after Ctrl-C.)"""
    total = len(items) if total is None else total  # type: ignore[arg-type]
    if not total:
        return
    todo = enumerate(items)
    jobs: queue.SimpleQueue = queue.SimpleQueue()  # C queues: no Python lock that a Ctrl-C could leave held
    done: queue.SimpleQueue = queue.SimpleQueue()

    def work() -> None:
        while (job := jobs.get()) is not None:
            try:
                done.put((job[0], True, fn(job[1])))
            except BaseException as exc:  # the consumer raises it
                done.put((job[0], False, exc))

    threads = [threading.Thread(target=work, name=f"rookworld-{k}", daemon=True) for k in range(min(workers, total))]
    running = 0
    for job in itertools.islice(todo, 2 * workers):
        jobs.put(job)
        running += 1
    for t in threads:
        t.start()
    with tqdm(total=total, desc=desc, unit=unit, disable=not progress) as bar:
        try:
            while running:
                i, ok, value = done.get()
                running -= 1
                if not ok:
                    raise value
                for job in itertools.islice(todo, 1):
                    jobs.put(job)
                    running += 1
                yield i, value
                bar.update(1)
        finally:  # the threads end after their running call; queued calls are dropped
            with contextlib.suppress(queue.Empty):
                while True:
                    jobs.get_nowait()
            for _ in threads:
                jobs.put(None)


def _kill_engine(eng: chess.engine.SimpleEngine, wait: float = 5.0) -> None:
    """Kill the engine's process group (see EnginePool._spawn): the engine and, behind a wrapper
    script, its children, which would otherwise live on. Then close the transport and wait until the
    engine has been reaped. The group is killed first: while its leader is unreaped, its id cannot be
    another process's (killed after the reaping, a new group that took the freed id would be hit)."""
    with contextlib.suppress(OSError):
        os.killpg(eng.transport.get_pid(), signal.SIGKILL)
    with contextlib.suppress(Exception):
        eng.close()
    with contextlib.suppress(Exception):
        eng.returncode.result(timeout=wait)


def _kill_all(engines: list, lock: threading.Lock, idle: queue.Queue) -> None:
    """End every engine of a pool, idle or busy: the one way they end. A module function, so that the
    pool's weakref finalizer runs it without keeping the pool alive."""
    with lock:
        victims = list(engines)
        engines.clear()
    with contextlib.suppress(queue.Empty):
        while True:
            idle.get_nowait()
    for eng in victims:
        _kill_engine(eng)


# After python-chess gives up on an engine that never said uciok, it kills the process and closes
# its event loop before the process is reaped; asyncio then warns "Loop ... that handles pid N is
# closed". Noise: the process is gone, and the pool reports the failure itself.
logging.getLogger("asyncio").addFilter(lambda record: not str(record.msg).startswith("Loop %r that handles pid"))
_LIVE_POOLS: weakref.WeakSet = weakref.WeakSet()
_EXITING = False


def close_all_engines(*, exiting: bool = False) -> None:
    """Close every live pool (run automatically at interpreter exit, with exiting=True: from then
    on no pool starts an engine, since nothing would be left to close it)."""
    global _EXITING
    _EXITING = _EXITING or exiting
    for pool in list(_LIVE_POOLS):
        pool.close()


# threading._register_atexit hooks run in threading._shutdown, before the non-daemon threads are
# joined: python-chess's engine threads end once our hook has killed their engines. Without the hook
# (another Python) atexit is the best we have.
try:
    threading._register_atexit(functools.partial(close_all_engines, exiting=True))  # type: ignore[attr-defined]
except (AttributeError, RuntimeError):  # pragma: no cover
    import atexit

    atexit.register(close_all_engines, exiting=True)

# --- The pool ---


class EnginePool:
    """Up to `size` Stockfish processes, started lazily, each used by one thread at a time; every
    public method is thread-safe. A failed start or request (the engine died, hung past
    :func:`search_timeout`, or spoke garbage) is retried on a fresh process `settings.max_retries`
    times, then raises EngineFailedError."""

    def __init__(self, settings: EngineSettings | None = None, size: int | None = None, *,
                 cache: AnalysisCache | bool = True):
        self.settings = settings or EngineSettings()
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(f"EnginePool size must be a positive int, got {size!r}")
        self.size = size or usable_cores()
        self.path = find_stockfish(self.settings.path)
        self.cache = SHARED_CACHE if cache is True else (cache or None)
        self.timeout = TIMEOUT_FLOOR_S  # for an engine to start, and the floor of every search's time limit
        self.restarts = 0  # engines replaced after a failure
        self._engines: list[chess.engine.SimpleEngine] = []  # every live engine, idle or busy
        self._idle: queue.LifoQueue = queue.LifoQueue()
        self._lock = threading.Lock()
        self._starting = 0  # engines being started (they count against `size`)
        self._generation = 0  # bumped when the engines are killed on purpose: in-flight requests stop
        self._closed = False
        self._version: str | None = None
        self._finalizer = weakref.finalize(self, _kill_all, self._engines, self._lock, self._idle)
        _LIVE_POOLS.add(self)

    # -- engine lifecycle ------------------------------------------------------------------
    def _spawn(self) -> chess.engine.SimpleEngine:
        """A started, configured engine; a failed start is retried, then EngineFailedError."""
        failures = []
        for _ in range(self.settings.max_retries + 1):
            eng = None
            try:
                # a process group of its own: killed as a group (_kill_engine), and out of reach of the
                # terminal's Ctrl-C, which the pool handles itself
                eng = chess.engine.SimpleEngine.popen_uci(self.path, timeout=self.timeout, setpgrp=True)
                eng.configure({"Threads": self.settings.threads, "Hash": self.settings.hash_mb})
                self._version = self._version or eng.id.get("name", "unknown")
                return eng
            except _RETRYABLE as exc:
                if eng is not None:
                    _kill_engine(eng)
                failures.append(f"{type(exc).__name__}: {str(exc) or f'no uciok within {self.timeout:.1f} s'}")
                log.warning("Stockfish at %s failed to start (%s)", self.path, failures[-1])
            except OSError as exc:  # not there, not executable, not a program: no retry helps
                raise StockfishNotFoundError(f"cannot start Stockfish at {self.path!r} ({exc.strerror or exc}). {INSTALL_HINT}") from None
        raise EngineFailedError(f"Stockfish failed to start {len(failures)} times ({self.path}); last: {failures[-1]}")

    def _check_open(self, generation: int) -> None:
        if self._closed or _EXITING:
            raise EngineFailedError("engine pool is closed")
        if generation != self._generation:
            raise EngineFailedError("engine pool was interrupted (its engines were killed)")

    def _checkout(self, generation: int) -> chess.engine.SimpleEngine:
        """An idle engine, or a new one while fewer than `size` run; else wait for one."""
        while True:
            self._check_open(generation)
            with contextlib.suppress(queue.Empty):
                return self._idle.get_nowait()
            with self._lock:
                spawn = len(self._engines) + self._starting < self.size
                self._starting += spawn
            if not spawn:
                with contextlib.suppress(queue.Empty):
                    return self._idle.get(timeout=0.5)
                continue
            try:
                eng = self._spawn()
            except BaseException:
                with self._lock:
                    self._starting -= 1
                raise
            with self._lock:  # one step from "starting" to "running": `size` is never exceeded
                self._starting -= 1
                if not (self._closed or _EXITING or generation != self._generation):
                    self._engines.append(eng)
                    return eng
            _kill_engine(eng)  # the pool was closed or interrupted while it started

    def _checkin(self, eng: chess.engine.SimpleEngine) -> None:
        with self._lock:
            keep = not self._closed and eng in self._engines  # not killed meanwhile
        if keep:
            self._idle.put(eng)
        else:
            _kill_engine(eng)

    def _discard(self, eng: chess.engine.SimpleEngine) -> None:
        with self._lock:
            if eng in self._engines:
                self._engines.remove(eng)
        _kill_engine(eng, wait=2.0)

    def _run(self, what: str, fn: Callable[[chess.engine.SimpleEngine], object]):
        """fn(engine) on a free engine; a failed request is retried on a fresh engine."""
        failures = []
        generation = self._generation
        for attempt in range(self.settings.max_retries + 1):
            eng = self._checkout(generation)
            try:
                result = fn(eng)
            except _RETRYABLE as exc:
                self._discard(eng)
                failures.append(f"{type(exc).__name__}: {exc}")
                self._check_open(generation)  # killed on purpose (close, Ctrl-C): no retry
                self.restarts += 1
                log.warning("Stockfish failed during %s (%s); restarting it (attempt %d of %d)",
                            what, failures[-1], attempt + 1, self.settings.max_retries + 1)
                continue
            except BaseException:
                self._discard(eng)  # state unknown (e.g. KeyboardInterrupt mid-search)
                raise
            self._checkin(eng)
            return result
        raise EngineFailedError(f"Stockfish failed on every attempt during {what}: {failures[-1]}")

    def _search(self, eng: chess.engine.SimpleEngine, board: chess.Board, limit: chess.engine.Limit,
                multipv: int | None = None, root_moves=None, game=None):
        """One search on `eng`: an analysis (multipv) or a move (multipv None). python-chess sets no
        deadline for depth or node limits, and its own cancellation leaves a hung engine's thread
        behind, so a watchdog kills the process past :func:`search_timeout`: it fails as a crash."""
        timeout = search_timeout(limit, multipv or 1, self.timeout)
        fired: list[bool] = []
        watchdog = threading.Timer(timeout or 0, lambda: (fired.append(True), eng.close()))
        watchdog.daemon = True
        if timeout is not None:
            watchdog.start()
        if game is None and self.settings.fresh_search:
            game = object()  # a new game object makes python-chess send ucinewgame: the hash is cleared
        try:
            if multipv is None:
                return eng.play(board, limit, game=game, root_moves=root_moves)
            return eng.analyse(board, limit, multipv=multipv, game=game, root_moves=root_moves)
        except chess.engine.EngineTerminatedError:
            if fired:
                raise TimeoutError(f"no answer within {timeout:.1f} s") from None
            raise
        finally:
            watchdog.cancel()

    # -- public API ------------------------------------------------------------------------
    @property
    def version(self) -> str:
        """The engine's UCI id name, e.g. ``Stockfish 15.1`` (starts an engine if none runs)."""
        if self._version is None:
            self._run("id", lambda eng: eng.id)
        return self._version or "unknown"

    def analyse(self, position: chess.Board | str, *, multipv: int | None = None,
                limit: chess.engine.Limit | None = None, root_moves: Sequence[str] | None = None) -> Analysis:
        """Multipv analysis of one position (cached). `root_moves` restricts the search to those
        UCI moves (used to evaluate a move outside the top candidates)."""
        board = chess.Board(position) if isinstance(position, str) else position.copy(stack=False)
        if not board.is_valid():
            raise ValueError(f"cannot analyse an invalid position {board.fen()!r} (status {board.status()!r}); "
                             "Stockfish crashes on those")
        multipv = multipv or self.settings.multipv
        limit = limit or self.settings.limit
        roots = tuple(sorted(root_moves)) if root_moves else None
        fen, lkey = board.fen(en_passant="fen"), limit_key(limit)
        # which engine searched, and how: another binary, hash size or thread count, or a search that
        # keeps the hash of earlier ones, answers otherwise (the cache is shared by every pool)
        s = self.settings
        key = (self.path, s.threads, s.hash_mb, s.fresh_search, fen, lkey, multipv, roots)
        hit = self.cache.get(key) if self.cache is not None else None
        if hit is not None:
            return hit
        if not any(board.legal_moves):
            result = Analysis(fen, (), (), lkey, 0)
        else:
            root_objs = [chess.Move.from_uci(m) for m in roots] if roots else None
            if root_objs and not all(board.is_legal(m) for m in root_objs):
                raise ValueError(f"root_moves {roots} are not all legal in {fen!r}")
            result = self._run("analyse", lambda eng: _to_analysis(
                fen, board.turn, self._search(eng, board, limit, multipv, root_objs), lkey))
        if self.cache is not None:
            self.cache.put(key, result)
        return result

    def map(self, fn: Callable, items: Iterable, *, progress: bool = False, desc: str = "", unit: str = "item",
            on_result: Callable[[int, object], None] | None = None) -> list:
        """[fn(item) for item in items], one thread per engine; `on_result(index, result)` runs in
        the calling thread as each completes. Ctrl-C kills this pool's engines at once, so nothing
        waits for a running search; later calls start fresh engines."""
        items = list(items)
        results: list = [None] * len(items)
        try:
            for i, result in threaded(fn, items, self.size, progress, desc, unit):
                results[i] = result
                if on_result is not None:
                    on_result(i, result)
        except BaseException as exc:
            if not isinstance(exc, Exception):  # Ctrl-C, SystemExit: the user wants out now
                self.interrupt()
            raise
        return results

    def analyse_many(self, positions: Iterable[chess.Board | str], *, multipv: int | None = None,
                     limit: chess.engine.Limit | None = None, progress: bool = False, desc: str = "analysing",
                     on_result: Callable[[int, Analysis], None] | None = None) -> list[Analysis]:
        """Analyse many positions on all engines in parallel (:meth:`map`); results in input order."""
        analyse = functools.partial(self.analyse, multipv=multipv, limit=limit)
        return self.map(analyse, positions, progress=progress, desc=desc, unit="pos", on_result=on_result)

    @contextlib.contextmanager
    def session(self):
        """Exclusive use of one engine for related searches (one game): the hash is cleared once, not
        before every search (about 4x faster for short searches, still reproducible). If the engine
        dies or hangs, :class:`EngineSessionLost` asks the caller to replay from the start."""
        eng = self._checkout(self._generation)
        sess = EngineSession(self, eng)
        try:
            yield sess
        except BaseException:
            self._discard(eng)
            raise
        if sess.dead:
            self._discard(eng)
        else:
            self._checkin(eng)

    def interrupt(self) -> None:
        """Kill every engine now (running searches fail with EngineFailedError, without retries);
        the pool stays open and starts fresh engines for later requests."""
        with self._lock:
            self._generation += 1
        _kill_all(self._engines, self._lock, self._idle)

    def close(self) -> None:
        """Kill every engine process and wait for it to be reaped; refuse new work. Idempotent."""
        self._closed = True
        self._finalizer()  # runs _kill_all once (a garbage-collected pool runs it too)
        _LIVE_POOLS.discard(self)

    def __enter__(self) -> EnginePool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EnginePool(size={self.size}, {self.settings.limit_key}, multipv={self.settings.multipv}, " \
               f"running={len(self._engines)}, closed={self._closed})"


class EngineSession:
    """One engine held by one thread; see :meth:`EnginePool.session`."""

    def __init__(self, pool: EnginePool, eng: chess.engine.SimpleEngine):
        self.pool = pool
        self._eng = eng
        self._game = object()
        self.dead = False

    def play(self, board: chess.Board, limit: chess.engine.Limit) -> chess.Move:
        """The engine's move under `limit`, in this session's game (hash kept between moves)."""
        if self.dead:
            raise EngineSessionLost("session engine already lost")
        try:
            result = self.pool._search(self._eng, board, limit, game=self._game)
        except _RETRYABLE as exc:
            self.dead = True
            self.pool.restarts += 1
            raise EngineSessionLost(f"Stockfish failed during a session ({type(exc).__name__}: {exc})") from None
        if result.move is None:
            raise EngineFailedError(f"Stockfish returned no move for {board.fen()!r}")
        return result.move


class NoLinesError(chess.engine.EngineError):
    """A search of a position with legal moves gave no line with a move and a score (retried, as a crash)."""


def _to_analysis(fen: str, turn: chess.Color, infos: list, limit: str) -> Analysis:
    """The lines of a multipv search of a position with legal moves (python-chess has checked each PV's
    moves); NoLinesError where none has both a move and a score: a broken engine, not an empty label."""
    lines, depths = {}, []  # first move -> eval, one per principal variation
    for info in infos:
        pv, score = info.get("pv"), info.get("score")
        if pv and score is not None and pv[0].uci() not in lines:
            lines[pv[0].uci()] = Eval.from_score(score.pov(turn))
            depths += [info["depth"]] if info.get("depth") is not None else []
    if not lines:
        raise NoLinesError(f"no line with a move and a score for {fen!r}")
    return Analysis(fen, tuple(lines), tuple(lines.values()), limit, max(depths, default=None))


# --- Process-wide pools ---

_POOLS: dict = {}
_DEFAULT_SETTINGS = EngineSettings()
_POOLS_LOCK = threading.Lock()


def get_pool(settings: EngineSettings | None = None, size: int | None = None) -> EnginePool:
    """A process-wide pool for these settings (created on first use, closed at exit)."""
    settings = settings or _DEFAULT_SETTINGS  # built once: the rewards ask for this pool on every score
    with _POOLS_LOCK:
        pool = _POOLS.get((settings, size))
        if pool is None or pool._closed:
            pool = _POOLS[(settings, size)] = EnginePool(settings, size)
        return pool

