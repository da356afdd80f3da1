"""Stockfish through python-chess's UCI driver: a pool of engine processes with a shared cache.

- :func:`find_stockfish` looks in ``STOCKFISH_PATH``, then the PATH, then ``/usr/games/stockfish``
  (Debian's package); if none is there, :class:`StockfishNotFoundError` names the install commands.
- :class:`EngineSettings` holds the search settings (threads, hash, depth/nodes/time, multipv).
  With ``fresh_search=True`` (the default) every search starts from a cleared hash table
  (``ucinewgame``), so with one thread and a depth or node limit a result depends only on
  (position, limit): it can be cached, and the label audit can reproduce it.
- :class:`EnginePool` runs up to ``size`` engine processes (default: one per usable core), hands
  each to one thread at a time, restarts an engine that dies and retries the request on a fresh
  one, and caches analyses keyed by (FEN, limit, multipv, root moves).
- No orphans, and the interpreter exits by itself: python-chess's ``SimpleEngine`` runs its event
  loop on a *non-daemon* thread, which Python joins at exit *before* ``atexit`` handlers run, so an
  engine left open hangs the exit. Every pool registers with ``threading._register_atexit`` (run
  before those joins) and with ``weakref.finalize`` (run when the pool is garbage collected), and
  both close its engines.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import functools
import logging
import os
import queue
import shutil
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass

import chess
import chess.engine

from .tasks import Eval

log = logging.getLogger(__name__)

DEFAULT_DEPTH = 8
DEBIAN_PATH = "/usr/games/stockfish"
INSTALL_HINT = (
    "Install Stockfish with `apt-get install -y stockfish` (Debian/Ubuntu; binary at /usr/games/stockfish) "
    "or `conda install -c conda-forge stockfish`, or set STOCKFISH_PATH to the binary."
)


class StockfishNotFoundError(RuntimeError):
    """No usable Stockfish binary; the message says where we looked and how to install one."""


class EngineFailedError(RuntimeError):
    """An analysis failed on every retry (the engine kept dying), or the pool is closed."""


class EngineSessionLost(EngineFailedError):
    """The engine of a session died; the caller must start the whole sequence again."""


def find_stockfish(path: str | os.PathLike | None = None) -> str:
    """The Stockfish binary: `path`, else ``STOCKFISH_PATH``, else ``stockfish`` on the PATH, else
    ``/usr/games/stockfish``. Raises StockfishNotFoundError with the install commands."""
    explicit = path if path is not None else os.environ.get("STOCKFISH_PATH") or None
    if explicit is not None:
        explicit = os.path.expanduser(str(explicit))
        resolved = shutil.which(explicit) if os.sep not in explicit else explicit
        if resolved and os.path.isfile(resolved) and os.access(resolved, os.X_OK):
            return resolved
        source = "STOCKFISH_PATH" if path is None else "the given path"
        raise StockfishNotFoundError(f"Stockfish not found at {explicit!r} ({source}). {INSTALL_HINT}")
    for candidate in (shutil.which("stockfish"), DEBIAN_PATH):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise StockfishNotFoundError(
        f"Stockfish not found (looked at $STOCKFISH_PATH, `stockfish` on the PATH and {DEBIAN_PATH}). {INSTALL_HINT}"
    )


def stockfish_available(path: str | None = None) -> bool:
    try:
        find_stockfish(path)
        return True
    except StockfishNotFoundError:
        return False


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


# --------------------------------------------------------------------------------------------
# Settings and results
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EngineSettings:
    """Stockfish search settings. Bad values fail at construction, naming the field."""

    depth: int | None = DEFAULT_DEPTH  # search depth in plies (None: no depth limit)
    nodes: int | None = None  # node budget per search (None: no node limit)
    time: float | None = None  # seconds per search (None: no time limit; time limits are not reproducible)
    multipv: int = 5  # principal variations per analysis: the candidate moves of a P: label
    threads: int = 1  # Stockfish `Threads`; 1 keeps results reproducible, the pool adds processes instead
    hash_mb: int = 16  # Stockfish `Hash` in MiB per process
    fresh_search: bool = True  # clear the hash (ucinewgame) before each search: results depend on (position, limit) only
    path: str | None = None  # Stockfish binary; None: STOCKFISH_PATH, PATH, /usr/games/stockfish
    max_retries: int = 3  # times a request is retried on a fresh engine after the engine died

    def __post_init__(self):
        def bad(name, why):
            raise ValueError(f"EngineSettings.{name} {why}, got {getattr(self, name)!r}")

        for name in ("depth", "nodes"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                bad(name, "must be a positive int or None")
        if self.depth is not None and self.depth > 99:
            bad("depth", "must be <= 99")
        if self.time is not None and (isinstance(self.time, bool) or not isinstance(self.time, (int, float))
                                      or not self.time > 0):
            bad("time", "must be a positive number of seconds or None")
        if self.depth is None and self.nodes is None and self.time is None:
            raise ValueError("EngineSettings: set at least one of depth, nodes, time (an unlimited search never ends)")
        if isinstance(self.multipv, bool) or not isinstance(self.multipv, int) or not 1 <= self.multipv <= 256:
            bad("multipv", "must be an int in 1..256")
        if isinstance(self.threads, bool) or not isinstance(self.threads, int) or not 1 <= self.threads <= 1024:
            bad("threads", "must be an int in 1..1024")
        if isinstance(self.hash_mb, bool) or not isinstance(self.hash_mb, int) or not 1 <= self.hash_mb <= 65536:
            bad("hash_mb", "must be an int in 1..65536 (MiB)")
        if not isinstance(self.fresh_search, bool):
            bad("fresh_search", "must be a bool")
        if self.path is not None and not isinstance(self.path, str):
            bad("path", "must be a string or None")
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int) or not 0 <= self.max_retries <= 100:
            bad("max_retries", "must be an int in 0..100")

    @property
    def limit(self) -> chess.engine.Limit:
        return chess.engine.Limit(depth=self.depth, nodes=self.nodes, time=self.time)

    @property
    def limit_key(self) -> str:
        """A short, stable spelling of the limit, e.g. ``depth=8`` (recorded with every label)."""
        return limit_key(self.limit)

    @property
    def reproducible(self) -> bool:
        """True when a search result depends only on (position, limit)."""
        return self.fresh_search and self.threads == 1 and self.time is None

    def to_dict(self) -> dict:
        return asdict(self)


def limit_key(limit: chess.engine.Limit) -> str:
    parts = [f"{k}={getattr(limit, k)}" for k in ("depth", "nodes", "time") if getattr(limit, k) is not None]
    return ",".join(parts) or "unlimited"


def parse_limit_key(key: str) -> chess.engine.Limit:
    """Inverse of :func:`limit_key` (``depth=8``, ``nodes=1000``, ``depth=8,nodes=1000``)."""
    kwargs = {}
    for part in key.split(","):
        name, _, value = part.partition("=")
        if name not in ("depth", "nodes", "time") or not value:
            raise ValueError(f"not a limit key: {key!r}")
        kwargs[name] = float(value) if name == "time" else int(value)
    return chess.engine.Limit(**kwargs)


@dataclass(frozen=True)
class Candidate:
    """One principal variation: its first move (UCI), eval for the side to move, and the line."""

    move: str
    eval: Eval
    pv: tuple[str, ...] = ()


@dataclass(frozen=True)
class Analysis:
    """A multipv analysis of one position, candidates best first for the side to move."""

    fen: str
    candidates: tuple[Candidate, ...]
    limit: str  # limit_key of the search
    depth: int | None = None  # depth Stockfish reached (deepest line)

    @property
    def best(self) -> str | None:
        return self.candidates[0].move if self.candidates else None

    @property
    def moves(self) -> tuple[str, ...]:
        return tuple(c.move for c in self.candidates)

    @property
    def evals(self) -> tuple[Eval, ...]:
        return tuple(c.eval for c in self.candidates)


class AnalysisCache:
    """A thread-safe LRU of analyses keyed by (FEN, limit, multipv, root moves)."""

    def __init__(self, maxsize: int = 200_000):
        self.maxsize = maxsize
        self._data: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key):
        with self._lock:
            value = self._data.get(key)
            if value is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key, value) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._data)

    def info(self) -> dict:
        return {"size": len(self._data), "maxsize": self.maxsize, "hits": self.hits, "misses": self.misses}


SHARED_CACHE = AnalysisCache()

# --------------------------------------------------------------------------------------------
# Exit handling: close every engine before Python joins the engines' non-daemon threads
# --------------------------------------------------------------------------------------------

_LIVE_POOLS: weakref.WeakSet = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()
_EXITING = False


def _close_engines(engines: list, lock: threading.Lock) -> None:
    with lock:
        victims = list(engines)
        engines.clear()
    for eng in victims:
        _kill_engine(eng)


def _kill_engine(eng: chess.engine.SimpleEngine, wait: float = 5.0) -> None:
    """Close the transport (which kills the process) and wait until it has been reaped."""
    try:
        eng.close()
    except Exception:  # pragma: no cover - closing must never fail loudly
        pass
    with contextlib.suppress(Exception):
        eng.returncode.result(timeout=wait)


def close_all_engines() -> None:
    """Close every engine of every live pool (also run automatically at interpreter exit)."""
    with _LIVE_LOCK:
        pools = list(_LIVE_POOLS)
    for pool in pools:
        with contextlib.suppress(Exception):
            pool.close()


def _at_thread_shutdown() -> None:
    global _EXITING
    _EXITING = True  # from here on no pool starts or restarts an engine
    close_all_engines()


try:  # runs in threading._shutdown(), i.e. *before* the non-daemon engine threads are joined
    threading._register_atexit(_at_thread_shutdown)  # type: ignore[attr-defined]
except (AttributeError, RuntimeError):  # pragma: no cover - a Python without the hook
    pass
atexit.register(close_all_engines)  # belt and braces (too late for hung joins, fine for the rest)

# --------------------------------------------------------------------------------------------
# The pool
# --------------------------------------------------------------------------------------------

_RETRYABLE = (chess.engine.EngineTerminatedError, chess.engine.EngineError, asyncio.TimeoutError,
              TimeoutError, BrokenPipeError, ConnectionResetError, concurrent.futures.CancelledError)


def threaded(fn: Callable, items: list, workers: int, progress: bool = False, desc: str = "",
             unit: str = "item") -> Iterator[tuple[int, object]]:
    """(index, fn(item)) as each call completes, on up to `workers` threads, with an optional
    progress bar. An exception (or Ctrl-C) cancels the calls not yet started and propagates."""
    if not items:
        return
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(items), desc=desc, unit=unit)
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(workers, len(items)),
                                                   thread_name_prefix="rookworld") as ex:
            futures = {ex.submit(fn, it): i for i, it in enumerate(items)}
            try:
                for fut in concurrent.futures.as_completed(futures):
                    yield futures[fut], fut.result()
                    if bar is not None:
                        bar.update(1)
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
    finally:
        if bar is not None:
            bar.close()


class EnginePool:
    """Up to `size` Stockfish processes, each used by one thread at a time.

    Engines start lazily on first use. Every public method is thread-safe; :meth:`analyse_many`
    runs one request per engine in parallel. An engine that dies (killed, crashed) is discarded
    and the request retried on a fresh process, up to `settings.max_retries` times.
    """

    def __init__(self, settings: EngineSettings | None = None, size: int | None = None, *,
                 cache: AnalysisCache | bool | None = True, timeout: float = 30.0):
        self.settings = settings or EngineSettings()
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ValueError(f"EnginePool size must be a positive int, got {size!r}")
        self.size = size or usable_cores()
        self.path = find_stockfish(self.settings.path)
        if cache is True or cache is None:
            self.cache = SHARED_CACHE
        elif cache is False:
            self.cache = None
        else:
            self.cache = cache
        self.timeout = timeout
        self._engines: list[chess.engine.SimpleEngine] = []  # every live engine (idle or busy)
        self._lock = threading.Lock()
        self._idle: queue.LifoQueue = queue.LifoQueue()
        self._closed = False
        self._version: str | None = None
        self.restarts = 0
        self._finalizer = weakref.finalize(self, _close_engines, self._engines, self._lock)
        with _LIVE_LOCK:
            _LIVE_POOLS.add(self)

    # -- engine lifecycle ------------------------------------------------------------------
    def _spawn(self) -> chess.engine.SimpleEngine:
        try:
            eng = chess.engine.SimpleEngine.popen_uci(self.path, timeout=self.timeout)
        except (FileNotFoundError, PermissionError) as exc:
            raise StockfishNotFoundError(f"cannot start Stockfish at {self.path!r} ({exc}). {INSTALL_HINT}") from None
        try:
            eng.configure({"Threads": self.settings.threads, "Hash": self.settings.hash_mb})
            if self._version is None:
                self._version = eng.id.get("name", "unknown")
        except Exception:
            _kill_engine(eng)
            raise
        return eng

    def _checkout(self) -> chess.engine.SimpleEngine:
        while True:
            if self._closed or _EXITING:
                raise EngineFailedError("engine pool is closed")
            try:
                return self._idle.get_nowait()
            except queue.Empty:
                pass
            with self._lock:
                can_spawn = len(self._engines) < self.size
                if can_spawn:
                    placeholder = object()
                    self._engines.append(placeholder)  # reserve the slot while spawning
            if can_spawn:
                try:
                    eng = self._spawn()
                except BaseException:
                    with self._lock:
                        self._engines.remove(placeholder)
                    raise
                with self._lock:
                    self._engines[self._engines.index(placeholder)] = eng
                    if self._closed:
                        self._engines.remove(eng)
                        _kill_engine(eng)
                        raise EngineFailedError("engine pool is closed")
                return eng
            try:
                return self._idle.get(timeout=0.5)
            except queue.Empty:
                continue

    def _checkin(self, eng) -> None:
        if self._closed:
            self._discard(eng)
        else:
            self._idle.put(eng)

    def _discard(self, eng) -> None:
        with self._lock:
            if eng in self._engines:
                self._engines.remove(eng)
        _kill_engine(eng, wait=2.0)

    def _run(self, what: str, fn: Callable[[chess.engine.SimpleEngine], object]):
        last_exc: BaseException | None = None
        for attempt in range(self.settings.max_retries + 1):
            eng = self._checkout()
            try:
                result = fn(eng)
            except _RETRYABLE as exc:
                last_exc = exc
                self._discard(eng)
                if self._closed or _EXITING:
                    break
                self.restarts += 1
                log.warning("Stockfish died during %s (%s: %s); restarting it (attempt %d of %d)",
                            what, type(exc).__name__, exc, attempt + 1, self.settings.max_retries + 1)
                continue
            except BaseException:
                self._discard(eng)  # state unknown (e.g. KeyboardInterrupt mid-search)
                raise
            self._checkin(eng)
            return result
        raise EngineFailedError(f"Stockfish failed on every attempt during {what}: "
                                f"{type(last_exc).__name__}: {last_exc}")

    # -- public API ------------------------------------------------------------------------
    @property
    def version(self) -> str:
        """The engine's UCI id name, e.g. ``Stockfish 15.1`` (starts an engine if none runs)."""
        if self._version is None:
            self._run("id", lambda eng: eng.id)
        return self._version or "unknown"

    def pids(self) -> list[int]:
        """Process ids of the running engines (for fault tests and monitoring)."""
        with self._lock:
            engines = [e for e in self._engines if isinstance(e, chess.engine.SimpleEngine)]
        out = []
        for e in engines:
            with contextlib.suppress(Exception):
                out.append(e.transport.get_pid())
        return out

    def _board(self, position: chess.Board | str) -> chess.Board:
        board = chess.Board(position) if isinstance(position, str) else position.copy(stack=False)
        if not board.is_valid():
            raise ValueError(f"cannot analyse an invalid position {board.fen()!r} (status {board.status()!r}); "
                             "Stockfish crashes on those")
        return board

    def analyse(self, position: chess.Board | str, *, multipv: int | None = None,
                limit: chess.engine.Limit | None = None, root_moves: Sequence[str] | None = None) -> Analysis:
        """Multipv analysis of one position (cached). `root_moves` restricts the search to those
        UCI moves (used to evaluate a move outside the top candidates)."""
        board = self._board(position)
        multipv = multipv or self.settings.multipv
        limit = limit or self.settings.limit
        roots = tuple(sorted(root_moves)) if root_moves else None
        fen = board.fen(en_passant="fen")
        key = (fen, limit_key(limit), multipv, roots)
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                return hit
        if not any(board.legal_moves):
            result = Analysis(fen, (), limit_key(limit), 0)
        else:
            root_objs = [chess.Move.from_uci(m) for m in roots] if roots else None
            if root_objs and not all(board.is_legal(m) for m in root_objs):
                raise ValueError(f"root_moves {roots} are not all legal in {fen!r}")

            def search(eng):
                game = object() if self.settings.fresh_search else None
                return eng.analyse(board, limit, multipv=multipv, game=game, root_moves=root_objs)

            infos = self._run("analyse", search)
            result = _to_analysis(fen, board.turn, infos, limit_key(limit))
        if self.cache is not None:
            self.cache.put(key, result)
        return result

    def analyse_many(self, positions: Iterable[chess.Board | str], *, multipv: int | None = None,
                     limit: chess.engine.Limit | None = None, progress: bool = False, desc: str = "analysing",
                     on_result: Callable[[int, Analysis], None] | None = None) -> list[Analysis]:
        """Analyse many positions on all engines in parallel; results in input order.
        `on_result(index, analysis)` is called (in the calling thread) as each one completes."""
        positions = list(positions)
        results: list[Analysis | None] = [None] * len(positions)
        analyse = functools.partial(self.analyse, multipv=multipv, limit=limit)
        for i, result in threaded(analyse, positions, self.size, progress, desc, unit="pos"):
            results[i] = result
            if on_result is not None:
                on_result(i, result)
        return results  # type: ignore[return-value]

    def play(self, position: chess.Board | str, limit: chess.engine.Limit) -> chess.Move:
        """The engine's move under `limit` (uncached; a fresh search when settings.fresh_search)."""
        board = self._board(position)

        def go(eng):
            game = object() if self.settings.fresh_search else None
            return eng.play(board, limit, game=game)

        result = self._run("play", go)
        if result.move is None:
            raise EngineFailedError(f"Stockfish returned no move for {board.fen()!r}")
        return result.move

    @contextlib.contextmanager
    def session(self):
        """Exclusive use of one engine for a sequence of related searches (one game).

        The hash is cleared once, at the session's first search, instead of before every search:
        about 4x faster for short searches, and still reproducible, because nothing else touches
        that engine in between. If the engine dies, :class:`EngineSessionLost` is raised and
        the caller replays the sequence from its start on a fresh session.
        """
        eng = self._checkout()
        sess = EngineSession(self, eng)
        try:
            yield sess
        except BaseException:
            self._discard(eng)
            raise
        else:
            if sess.dead:
                self._discard(eng)
            else:
                self._checkin(eng)

    def close(self) -> None:
        """Kill every engine process and wait for it to be reaped. Idempotent."""
        self._closed = True
        with self._lock:
            victims = [e for e in self._engines if isinstance(e, chess.engine.SimpleEngine)]
            self._engines.clear()
        while True:
            try:
                self._idle.get_nowait()
            except queue.Empty:
                break
        for eng in victims:
            _kill_engine(eng)
        with _LIVE_LOCK:
            _LIVE_POOLS.discard(self)

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> EnginePool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EnginePool(size={self.size}, {self.settings.limit_key}, multipv={self.settings.multipv}, " \
               f"running={len(self.pids())}, closed={self._closed})"


class EngineSession:
    """One engine held by one thread; see :meth:`EnginePool.session`."""

    def __init__(self, pool: EnginePool, eng: chess.engine.SimpleEngine):
        self.pool = pool
        self._eng = eng
        self._game = object()
        self.dead = False

    def play(self, board: chess.Board, limit: chess.engine.Limit) -> chess.Move:
        if self.dead:
            raise EngineSessionLost("session engine already lost")
        try:
            result = self._eng.play(board, limit, game=self._game)
        except _RETRYABLE as exc:
            self.dead = True
            self.pool.restarts += 1
            raise EngineSessionLost(f"Stockfish died during a session ({type(exc).__name__}: {exc})") from None
        if result.move is None:
            raise EngineFailedError(f"Stockfish returned no move for {board.fen()!r}")
        return result.move


def _to_analysis(fen: str, turn: chess.Color, infos, limit: str) -> Analysis:
    if isinstance(infos, dict):
        infos = [infos]
    cands, depth = [], None
    seen = set()
    for info in infos:
        pv = info.get("pv")
        score = info.get("score")
        if not pv or score is None:
            continue
        move = pv[0].uci()
        if move in seen:
            continue
        seen.add(move)
        cands.append(Candidate(move, Eval.from_score(score.pov(turn)), tuple(m.uci() for m in pv)))
        d = info.get("depth")
        if d is not None:
            depth = d if depth is None else max(depth, d)
    return Analysis(fen, tuple(cands), limit, depth)


# --------------------------------------------------------------------------------------------
# Process-wide pools
# --------------------------------------------------------------------------------------------

_POOLS: dict = {}
_POOLS_LOCK = threading.Lock()


def get_pool(settings: EngineSettings | None = None, size: int | None = None) -> EnginePool:
    """A process-wide pool for these settings (created on first use, closed at exit)."""
    settings = settings or EngineSettings()
    key = (settings, size)
    with _POOLS_LOCK:
        pool = _POOLS.get(key)
        if pool is None or pool.closed:
            pool = EnginePool(settings, size)
            _POOLS[key] = pool
        return pool


def shutdown() -> None:
    """Close the process-wide pools (and every other live pool)."""
    with _POOLS_LOCK:
        _POOLS.clear()
    close_all_engines()


def engine_version(path: str | None = None) -> str:
    """The UCI id name of the Stockfish binary, e.g. ``Stockfish 15.1``."""
    with EnginePool(EngineSettings(path=path, depth=1), size=1, cache=False) as pool:
        return pool.version


__all__ = [
    "DEFAULT_DEPTH", "INSTALL_HINT", "StockfishNotFoundError", "EngineFailedError", "EngineSessionLost",
    "EngineSession", "find_stockfish",
    "stockfish_available", "usable_cores", "EngineSettings", "limit_key", "parse_limit_key", "Candidate",
    "Analysis", "AnalysisCache", "SHARED_CACHE", "EnginePool", "get_pool", "shutdown", "close_all_engines",
    "engine_version",
]
