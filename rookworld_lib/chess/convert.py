"""The original RookWorld data: read its lines and local copies of its data sets into our records.

Original lines (the generators of the public RookWorld repository, ``dev/data/``) are written in
the original layout of :mod:`rookworld_lib.chess.tasks`. ``P:`` (rook sets): ``B:`` is the first multipv
move for white but the *last* (the worst) for black, as the generator reversed the list for black.
``A:`` (arbiter sets; the rookworld text sets add the ``A: `` prefix): moves were pushed without a
legality check, and ``outcome()`` saw the game's whole move stack (so repetition endings appear).

Every line becomes one of our records (``source: "original"``: ``P:`` candidates best first, the
line's ``B:`` kept as ``original_best``; ``A:`` rows only where python-chess's replay agrees) or an
error ``file:line: reason``; the README's "Bring your own RookWorld" describes the command.
"""

from __future__ import annotations

import argparse
import array
import concurrent.futures
import contextlib
import gzip
import hashlib
import itertools
import json
import multiprocessing
import os
import re
import signal
import sys
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import chess
import numpy as np

from . import tasks
from .data import ORIGINAL_LIMIT, ORIGINAL_SOURCE, SPLITS, TASK_FILES, data_files_of, move_tags, position_tags
from ..core.config import path_arg
from ..core.errors import end_with_parent, sigterm_as_interrupt
from ..core.paths import LOCK_FILE, TMP_PREFIX, atomic_file, decoded_lines, json_line, read_jsonl, run_lock
from ..core.progress import tqdm
from .engine import MAX_WORKERS, usable_cores
from .rewards import EnvTruth

ORIGINAL_ENGINE = "unknown (original RookWorld data)"
MAX_ERRORS_SHOWN = 10
MAX_REASONS_SHOWN = 20  # kinds of reason in the printed counts (--json and the errors file have all)


# --- One line ---

@dataclass(frozen=True)
class OriginalPolicyLine:
    """A ``P:`` line as written: candidates in the line's order, eval texts as written."""

    fen: str
    moves: tuple[str, ...]
    evals: tuple[str, ...]
    best: str
    fen_width: int  # 90 or 89: the width the FEN was padded to


@dataclass(frozen=True)
class OriginalEnvLine:
    """An ``A:`` line as written: its prompt fields, its answer (an EnvTruth) and its prefix."""

    fen: str
    move: str
    history: tuple[str, ...]
    answer: EnvTruth  # the next FEN, reward and flags the line states
    prefixed: bool  # the line starts with "A: " (rookworld text sets) or not (arbiter sets)


def parse_policy_line(text: str) -> OriginalPolicyLine | str:
    """An original ``P:`` line, or the reason it cannot be one. Never raises."""
    parse = tasks.parse_policy(text)
    if not parse.ok:
        return "; ".join(parse.errors)
    if parse.layout != "original":
        return ("not the original fixed-width layout (FEN 89/90, M 30, E 40 characters)"
                + (": its fields are separated by tabs" if "\t" in text else ""))
    width = text.index(" M:") + 1 - len(tasks.POLICY_PREFIX)
    board = tasks.checked_board(parse.fen)[0]
    for m in parse.moves:
        if tasks.legal_move(board, m) is None:
            return f"M: move {m!r} is not legal in this position"
    evals = text[text.index(" E:") + 3: text.index(" B:")].split() if " B:" in text else []
    return OriginalPolicyLine(parse.fen, parse.moves, tuple(evals), parse.best, width)


def parse_env_line(text: str) -> OriginalEnvLine | str:
    """An original ``A:`` line (with or without the prefix), or the reason it cannot be one."""
    prefixed = text.startswith(tasks.ENV_PREFIX)
    parts = (text[len(tasks.ENV_PREFIX):] if prefixed else text).split("+")
    if len(parts) != 7:
        return f"expected 7 '+'-separated fields, found {len(parts)}"
    if err := tasks.fen_error(parts[0]):
        return f"impossible position: {err}"
    prompt = tasks.parse_env_prompt(tasks.ENV_PREFIX + "+".join(parts[:3]) + "+")
    answer = tasks.parse_env_completion("+".join(parts[3:]))
    if prompt.ok and not answer.ok and tasks.legal_move(tasks.checked_board(prompt.fen)[0], prompt.move) is None:
        # e7e8 without a piece: the original generator's board.push left a pawn on the back rank
        return f"illegal move pushed without a legality check (the original generator's board.push): {answer.errors[0]}"
    if not (prompt.ok and answer.ok):
        return "; ".join(prompt.errors + answer.errors)
    if answer.reward not in tasks.ENV_REWARDS:
        return f"reward {parts[4]!r} is not one of {tasks.ENV_REWARDS}"
    truth = EnvTruth(answer.new_fen, answer.reward, answer.terminated, answer.truncated)
    return OriginalEnvLine(prompt.fen, prompt.move, prompt.history, truth, prefixed)


def _disagreement(line: OriginalEnvLine, ref: tasks.EnvTransition) -> str | None:
    """Why the original row differs from python-chess's transition, or None when it agrees."""
    a = line.answer
    diff = tasks.transition_differences(ref, **asdict(a))  # new_fen, reward, terminated, truncated
    if not diff:
        return None
    if ref.kind == "illegal" and a.truncated == 0:
        board = tasks.checked_board(line.fen)[0]
        if len(line.move) == 4 and board.is_legal(move := chess.Move.from_uci(line.move)) and board.is_castling(move):
            return (f"castling written king-takes-rook ({line.move}): our records spell it king-to-square "
                    f"({board.uci(move)}), as UCI and the original generator's legal moves do")
        return "illegal move pushed without a legality check (the original generator's board.push)"
    if a.terminated and not ref.terminated and a.reward == tasks.REWARD_DRAW:
        return "a repetition ending: the position and ten moves of history do not decide it"
    return f"transition disagrees with python-chess: {', '.join(d.replace('new_fen', 'new FEN') for d in diff)}"


# values that reasons give unquoted: the moves of "M: not UCI: Nf3 e4", a byte offset, a JSON line's 'text' value
_UNQUOTED = ((re.compile(r"(not UCI|not an eval): [^;']+"), r"\1: ..."), (re.compile(r"at byte \d+"), "at byte N"),
             (re.compile(r"(its 'text' is ).*(, not the line as a string)"), r"\1...\2"))


def reason_kind(reason: str) -> str:
    """A line's reason as its kind of problem, for the counts: the moves, FENs and values it quotes or lists
    become '...' (so the counts do not grow with the input); a quoted single character (the '+' of "7
    '+'-separated fields"), a field marker ('M:', 'P: '), a pattern ('P: <FEN> M: ...') and the JSON key 'text'
    are part of the kind, the words that say what to fix."""
    def kind(m: re.Match) -> str:
        quoted = m.group(1) or m.group(2)
        return m.group(0) if re.fullmatch(r"[A-Z]: ?|text", quoted) or "<FEN>" in quoted else "'...'"

    for pattern, repl in _UNQUOTED:
        reason = pattern.sub(repl, reason)
    return _QUOTED.sub(kind, reason)


# a quoted value: its quote opens after the start, a space, '(' or ':' and closes before the end, a space or
# punctuation (so the apostrophe of "generator's" and a one-letter 'w' pair with no quote of the value after them)
_QUOTED = re.compile(r"(?:(?<=^)|(?<=[\s(:]))(?:'([^']{2,}?)'|\"([^\"]{2,}?)\")(?=$|[\s;,.):])")


def convert_line(text: str, *, split: str = "test", ident: str = "0", number: int = 0) -> dict | str:
    """Our record for one original line (``P:``, ``A:`` or an unprefixed arbiter line), or the
    reason it cannot be converted. `ident` makes the record id; `number` fills ``game``."""
    try:
        # a line's end: CRLF, or padding after its last field; its start: indentation, or the byte-order mark
        # of a file joined to this one with `cat` (utf-8-sig takes only the first file's)
        text = text.rstrip().lstrip(" \t\ufeff")
        if text.startswith(tasks.POLICY_PREFIX):
            line = parse_policy_line(text)
            return line if isinstance(line, str) else policy_record(line, split, f"P-{ident}", number)
        line = parse_env_line(text)
        if isinstance(line, str):
            return line
        ref = tasks.environment_step(line.fen, line.move, line.history[:-1])
        return _disagreement(line, ref) or env_record(line, ref, split, f"A-{ident}", number)
    except Exception as exc:  # a converter must report a line, never stop on it
        return f"internal error ({type(exc).__name__}: {exc})"


def policy_record(line: OriginalPolicyLine, split: str, ident: str, number: int = 0) -> dict:
    """Our P: record: candidates best first by eval, the line's B: as original_best. The original lines
    shuffle their (move, eval) pairs; for white, B: is Stockfish's first choice, so among moves tied at
    the top eval it comes first (else the shuffled order would pick one of the tied moves as best)."""
    evals = [tasks.parse_eval(e) for e in line.evals]
    board = tasks.checked_board(line.fen)[0]
    first = line.best if board.turn == chess.WHITE else None
    order = sorted(range(len(line.moves)), key=lambda i: (-evals[i].to_cp(), line.moves[i] != first))
    moves = [line.moves[i] for i in order]
    texts = [tasks.format_eval(evals[i]) for i in order]
    tags = position_tags(board) + (["mate"] if evals[order[0]].mate is not None else [])
    prompt, completion = tasks.policy_text(line.fen, moves, texts, moves[0])
    return {"id": ident, "task": "P", "split": split, "game": number, "ply": 0, "source": ORIGINAL_SOURCE,
            "fen": line.fen, "moves": moves, "evals": texts, "best": moves[0], "n_legal": board.legal_moves.count(),
            "tags": tags, "engine": ORIGINAL_ENGINE, "limit": ORIGINAL_LIMIT, "prompt": prompt,
            "completion": completion, "original_best": line.best}


def env_record(line: OriginalEnvLine, ref: tasks.EnvTransition, split: str, ident: str, number: int = 0) -> dict:
    """Our A: record from a row that python-chess's replay confirms."""
    board = tasks.checked_board(line.fen)[0]
    move = tasks.legal_move(board, line.move)
    return {"id": ident, "task": "A", "split": split, "game": number, "ply": 0, "source": ORIGINAL_SOURCE,
            "fen": ref.fen, "move": ref.move, "history": list(ref.history), "new_fen": ref.new_fen,
            "reward": ref.reward, "terminated": ref.terminated, "truncated": ref.truncated, "kind": ref.kind,
            "termination": ref.termination, "tags": move_tags(board, move) if move is not None else [],
            "prompt": ref.prompt, "completion": ref.completion}


# --- Files ---

_NULL_TEXT = "its 'text' is null, not the line as a string"
_ARROW_TEXT_TYPES = ("string", "large_string", "string_view")  # by name: string_view is pyarrow >= 16


def _table_texts(path: Path) -> Iterator[str | ValueError]:
    """The `text` column of a Parquet or Arrow file, batch by batch (a null: a ValueError)."""
    try:  # optional: only Parquet/Arrow input needs pyarrow
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"{path}: reading Parquet/Arrow needs pyarrow: pip install pyarrow "
                         "(or export the data set's text column as a .txt file)") from None
    kind = "Parquet" if path.name.lower().removesuffix(".gz").endswith(".parquet") else "Arrow"
    if path.name.lower().endswith(".gz"):  # pyarrow reads neither through gzip
        raise ValueError(f"{path}: a gzipped {kind} file; decompress it first (gunzip -k {path})")
    with contextlib.ExitStack() as stack:
        try:
            if kind == "Parquet":
                table = pq.ParquetFile(path)
                schema = table.schema_arrow  # the batches below hold the text column only
                batches = table.iter_batches(batch_size=4096, columns=["text"]) if "text" in schema.names else ()
            else:
                source = stack.enter_context(pa.memory_map(str(path)))
                try:
                    batches = pa.ipc.open_stream(source)  # what the datasets library writes
                    schema = batches.schema
                except pa.ArrowInvalid:
                    reader = pa.ipc.open_file(source)
                    schema, batches = reader.schema, (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowException as exc:  # pyarrow's own words name no file
            raise ValueError(f"{path}: not a readable {kind} file ({exc})") from None
        if "text" not in schema.names:
            raise ValueError(f"{path}: no 'text' column (columns: {', '.join(schema.names) or 'none'})")
        kind = schema.field("text").type
        if str(kind.value_type if pa.types.is_dictionary(kind) else kind) not in _ARROW_TEXT_TYPES:  # a dictionary of strings reads as strings
            raise ValueError(f"{path}: column 'text' holds {kind}, not strings (the original lines as text)")
        for batch in batches:  # a null row is an error, as a JSON line's null 'text' is (it was skipped uncounted)
            yield from (ValueError(_NULL_TEXT) if t is None else t for t in batch.column("text").to_pylist())


def _check_head(path: Path) -> bytes:
    """The first 8 kB of a text or JSON-lines input (gzipped too), once it is not named here, in one line, as
    no UTF-8 lines: UTF-16, binary, or lines ending in a bare carriage return (each would be hundreds of per-line
    reasons, or one line)."""
    gz = path.name.lower().endswith(".gz")
    try:
        with (gzip.open if gz else open)(path, "rb") as fh:
            head = fh.read(8192)
    except (gzip.BadGzipFile, EOFError) as exc:  # not gzip, or cut off
        raise ValueError(f"{path}: not a whole gzip file ({exc}); decompress a good copy, or give the text file") from None
    unpack, repack = (f"zcat {path} | ", " | gzip") if gz else ("", "")
    out = Path(path.name[:-3] if gz else path.name)
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):  # what Windows PowerShell's `>` writes
        raise ValueError(f"{path}: UTF-16 text (its byte-order mark); save it as UTF-8, e.g. {unpack}iconv -f UTF-16 -t "
                         f"UTF-8{'' if gz else f' {path}'}{repack} > {out.stem}.utf8{out.suffix}{'.gz' if gz else ''}")
    if b"\0" in head:  # a binary file given by mistake: one line, not hundreds
        raise ValueError(f"{path}: not a text file (NUL bytes in its first 8 kB); give text lines, JSON lines, "
                         ".parquet or .arrow")
    if b"\r" in head and b"\n" not in head:  # classic Mac line ends: the whole file read as one line
        raise ValueError(f"{path}: its lines end in a bare carriage return (\\r), not \\n; convert them first, e.g. "
                         f"{unpack or 'cat ' + str(path) + ' | '}tr '\\r' '\\n'{repack} > {out.stem}.unix{out.suffix}{'.gz' if gz else ''}")
    return head


def _text_file_lines(path: Path) -> Iterator[tuple[int, str | ValueError]]:
    """(line number, text) of a text file (gzipped too), decoded strictly: a line that is not UTF-8 is a
    ValueError with the byte, as a JSON line's is (replacement characters made FEN errors of it)."""
    try:
        for n, text, why in decoded_lines(path):
            yield n, text if why is None else ValueError(why)
    except (gzip.BadGzipFile, EOFError) as exc:  # not gzip, or cut off (lines before that were read)
        raise ValueError(f"{path}: not a whole gzip file ({exc}); decompress a good copy, or give the text file") from None


_NO_TEXT = "not a JSON object with a 'text' field"
_OURS = ("a record in our own format already (rookworld datagen's): use its directory as it is (--data-dir), "
         "no conversion needed")


def iter_lines(path: str | os.PathLike) -> Iterator[tuple[int, str | ValueError]]:
    """(line number, text) of each non-blank line of one input file (gzipped too: .txt.gz, .jsonl.gz),
    streamed: .txt (any other suffix too) one line each; .jsonl/.json a ``text`` field per JSON line, or a ValueError with
    the reason a line has none (conversion reports it as that line's error); .parquet and .arrow
    a ``text`` column, numbered by row."""
    path = Path(path)
    suffix = Path(path.name.lower().removesuffix(".gz")).suffix  # a gzipped file reads as its inner kind
    if suffix in (".parquet", ".arrow"):
        items: Iterable = enumerate(_table_texts(path), 1)
    else:
        head = _check_head(path)  # UTF-16, binary or bare-CR text: one line, not a reason per line
        if suffix not in (".jsonl", ".json"):
            items = _text_file_lines(path)
        elif head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"["):  # a JSON array: each physical line refused alone
            raise ValueError(f"{path}: a JSON array; give JSON lines (one object with a 'text' field per line)")
        else:
            # a non-UTF-8 line keeps read_jsonl's reason; any other bad line lacks a 'text' field
            items = ((n, v["text"] if isinstance(v, dict) and isinstance(v.get("text"), str) else
                      ValueError(why if why and why.startswith("not UTF-8") else
                                 _OURS if isinstance(v, dict) and {"task", "prompt", "completion"} <= v.keys() else
                                 f"its 'text' is {json.dumps(v['text'])[:20]}, not the line as a string"
                                 if isinstance(v, dict) and "text" in v else _NO_TEXT))
                     for n, v, why in read_jsonl(path))
    for n, text in items:
        if isinstance(text, ValueError) or text and text.strip():
            yield n, text


@dataclass
class ConvertReport:
    """What a conversion did: lines read, records written per task, errors by reason."""

    lines: int = 0
    written: Counter = field(default_factory=Counter)  # "P" / "A" -> records
    reasons: Counter = field(default_factory=Counter)  # reason -> lines
    first_errors: list[str] = field(default_factory=list)  # the first MAX_ERRORS_SHOWN, file:line: reason
    seconds: float = 0.0
    outputs: dict = field(default_factory=dict)  # task -> path
    duplicates: int = 0  # records equal to an earlier one (prompt and completion), each written: n counts them again
    short_lists: int = 0  # P: records listing fewer candidates than min(5, legal moves): policy/valid asks as few

    @property
    def errors(self) -> int:
        """Lines that did not convert."""
        return sum(self.reasons.values())

    @property
    def lines_per_s(self) -> float:
        """Conversion speed (NaN before any time has passed)."""
        return self.lines / self.seconds if self.seconds > 0 else float("nan")

    def as_dict(self) -> dict:
        """The report as JSON-ready values (paths as strings)."""
        return {"lines": self.lines, "written": dict(self.written), "errors": self.errors,
                "duplicates": self.duplicates, "short_candidate_lists": self.short_lists,
                "errors_by_reason": dict(self.reasons.most_common()), "first_errors": self.first_errors,
                "seconds": round(self.seconds, 2),  # strict JSON: no NaN for a rate without time
                "lines_per_s": round(self.lines_per_s, 1) if self.seconds > 0 else None,
                "outputs": {k: str(v) for k, v in self.outputs.items()}}


def _convert_chunk(chunk: list[tuple[str, int, str | ValueError]], split: str) -> list[tuple[int, dict | str]]:
    return [(number, str(text) if isinstance(text, ValueError) else
             convert_line(text, split=split, ident=ident, number=number)) for ident, number, text in chunk]


def _chunks(inputs: list[Path], size: int) -> Iterator[tuple[Path, list[tuple[str, int, str | ValueError]]]]:
    for k, path in enumerate(inputs):
        lines = iter_lines(path)
        while chunk := [(f"{k}-{lineno}", lineno, text) for lineno, text in itertools.islice(lines, size)]:
            yield path, chunk


def _worker_start(parent: int) -> None:
    """A conversion worker ends with the command: killed when it dies (even by SIGKILL), and SIGTERM ends it
    as it would any process (the command's handler raises in its main thread only)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    end_with_parent(signal.SIGKILL)
    if os.getppid() != parent:  # the command died before the request was made
        os._exit(1)


def _converted(inputs: list[Path], split: str, workers: int, size: int) -> Iterator[tuple[Path, list]]:
    """(input, [(line number, record or reason)]) per chunk, in input order."""
    if workers <= 1:
        yield from ((path, _convert_chunk(chunk, split)) for path, chunk in _chunks(inputs, size))
        return
    # fork, whatever the start method (forkserver is Python 3.14's default on Linux): a forked worker's parent is
    # this command, whose death the worker follows (a fork server's would outlive it); elsewhere as the platform does
    forked = (dict(mp_context=multiprocessing.get_context("fork"), initializer=_worker_start, initargs=(os.getpid(),))
              if "fork" in multiprocessing.get_all_start_methods() else {})
    with concurrent.futures.ProcessPoolExecutor(workers, **forked) as pool:
        try:
            pending: deque = deque()
            for path, chunk in _chunks(inputs, size):
                pending.append((path, pool.submit(_convert_chunk, chunk, split)))
                if len(pending) >= 2 * workers:  # at most 2 chunks per worker in flight: bounded memory
                    path, fut = pending.popleft()
                    yield path, fut.result()
            for path, fut in pending:
                yield path, fut.result()
        except concurrent.futures.process.BrokenProcessPool:  # a worker killed: the OOM killer, or a user's kill
            raise ValueError(f"a conversion worker died (killed: out of memory?); nothing was written; run again, with "
                             f"fewer --workers (this run: {workers}) if memory is short") from None
        finally:
            pool.shutdown(cancel_futures=True)


def convert(inputs: Iterable[str | os.PathLike], out_dir: str | os.PathLike, *, split: str = "test",
            workers: int = 1, chunk_lines: int = 2000, progress: bool = False) -> ConvertReport:
    """Convert original lines into ``<out_dir>/policy_<split>.jsonl`` and ``env_<split>.jsonl`` (ready for
    ``rookworld eval --data-dir``, ``grpo`` and ``sft``); each line that does not convert goes to
    ``<out_dir>/convert_errors_<split>.txt`` as ``file:line: reason``. Outputs appear atomically when the whole
    input is done, only for a task with records (another task's file is left as it is). When no line converts,
    nothing is written: out_dir is left as it was (the report holds the reasons, and no outputs)."""
    if isinstance(inputs, (str, os.PathLike)):  # one file given bare: its characters are no file names
        raise ValueError(f"inputs must be a list of files, got one: {str(inputs)!r}; give [{str(inputs)!r}]")
    if isinstance(chunk_lines, bool) or not isinstance(chunk_lines, int) or chunk_lines < 1:
        raise ValueError(f"chunk_lines must be a whole number of lines >= 1, got {chunk_lines!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise ValueError(f"workers (--workers) must be a whole number of processes from 1 to {MAX_WORKERS}, got {workers!r}")
    inputs = [Path(p) for p in inputs]
    for p in inputs:
        if p.is_dir():
            raise ValueError(f"{p}: is a directory; give the data files in it (.txt, .jsonl, .parquet or .arrow), "
                             f"e.g. {p}/*.txt")
        if not p.is_file():
            raise ValueError(f"{p}: not a regular file (a device, socket or pipe); give a data file" if p.exists()
                             else f"{p}: no such file")
    out = Path(out_dir)
    errors_path = out / f"convert_errors_{split}.txt"
    report = ConvertReport()
    t0 = time.perf_counter()
    made = [p for p in (out, *out.parents) if not p.exists()]  # deepest first: the folders this call would make
    new_lock = not (out / LOCK_FILE).exists()
    try:
        _convert_into(out, inputs, split, workers, chunk_lines, progress, report, errors_path)
    except BaseException as exc:  # no line converted, an input that cannot be read (a broken gzip), Ctrl-C, SIGTERM
        # nothing was published, and every temporary file is gone: the lock file and the folders made here too
        if new_lock:
            (out / LOCK_FILE).unlink(missing_ok=True)
        for folder in made:
            with contextlib.suppress(OSError):
                folder.rmdir()
        if not isinstance(exc, _NothingConverted):
            raise
    report.seconds = time.perf_counter() - t0
    return report


class _NothingConverted(Exception):
    """Raised inside the writing block when no line converted, so that every output is discarded."""


def _convert_into(out: Path, inputs: list[Path], split: str, workers: int, chunk_lines: int, progress: bool,
                  report: ConvertReport, errors_path: Path) -> None:
    with contextlib.ExitStack() as stack:  # on an error every output's temporary file is removed
        stack.enter_context(run_lock(out))  # one writer per directory, as datagen and training: RunDirBusyError
        if there := [f.name for t in ("P", "A") for f in data_files_of(TASK_FILES[t].format(split=split), out)]:
            raise ValueError(f"{out} already holds {', '.join(there)}: converting would replace them; choose "
                             "another --out (or --split), delete them first, or convert every input of this split "
                             "in one command")
        names = [errors_path.name] + [TASK_FILES[t].format(split=split) for t in ("P", "A")]
        for stale in [p for name in names for p in out.glob(f"{TMP_PREFIX}{name}.*")]:  # a killed conversion's
            stale.unlink(missing_ok=True)
        err_fh = stack.enter_context(atomic_file(errors_path))
        outputs: dict = {}
        bar = stack.enter_context(tqdm(unit=" lines", desc="convert", disable=not progress))
        seen = array.array("Q")  # 8 bytes of each record's hash: millions of lines in tens of MB
        for path, results in stack.enter_context(contextlib.closing(_converted(inputs, split, workers, chunk_lines))):
            for number, res in results:
                report.lines += 1
                if isinstance(res, str):
                    # a lone surrogate quoted from the line (JSON's "\ud800") is shown as that escape, not refused
                    res = res.encode(errors="backslashreplace").decode()
                    msg = f"{path}:{number}: {res}"
                    err_fh.write((msg + "\n").encode())
                    report.reasons[reason_kind(res)] += 1
                    if len(report.first_errors) < MAX_ERRORS_SHOWN:
                        report.first_errors.append(msg)
                    continue
                task = res["task"]
                if task not in outputs:
                    outputs[task] = stack.enter_context(atomic_file(out / TASK_FILES[task].format(split=split)))
                outputs[task].write(json_line(res))
                report.written[task] += 1
                seen.append(int.from_bytes(hashlib.blake2b(f"{res['prompt']}\0{res['completion']}".encode(),
                                                           digest_size=8).digest(), "little"))
                report.short_lists += task == "P" and len(res["moves"]) < min(5, res["n_legal"])
            bar.update(len(results))
        if not outputs:
            raise _NothingConverted
        report.duplicates = len(seen) - np.unique(np.frombuffer(seen, dtype=np.uint64)).size
    report.outputs = {t: out / TASK_FILES[t].format(split=split) for t in ("P", "A") if t in outputs}
    report.outputs["errors"] = errors_path


def cli(argv: list[str] | None = None) -> int:
    """`rookworld convert`: 0 when the inputs were read and gave records (lines that do not convert are
    reported), 1 when no line converted; an input that cannot be read raises (cli.main reports it in
    one line, exit status 1)."""
    ap = argparse.ArgumentParser(
        prog="rookworld convert",
        description="Convert original RookWorld data (P: rook lines, A: arbiter/rookworld lines; .txt, "
                    ".jsonl with a 'text' field, .parquet, .arrow) into our validated records, streaming. "
                    "Lines that do not convert are listed as file:line: reason, with counts by reason.",
        epilog="example: rookworld convert rook_val_500.txt arbiter_test.txt --out data/original --split test; "
               "then: rookworld eval /path/to/RookWorld-LM-124M --data-dir data/original")
    ap.add_argument("inputs", nargs="+", metavar="FILE", type=path_arg, help="original data files")
    ap.add_argument("--out", required=True, metavar="DIR", type=path_arg, help="output directory (policy_<split>.jsonl, env_<split>.jsonl)")
    ap.add_argument("--split", default="test", choices=list(SPLITS), help="split the records go to (default: %(default)s)")
    ap.add_argument("--workers", type=int, default=None, help="processes (default: usable cores)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--json", action="store_true", help="print the report as one JSON object")
    args = ap.parse_args(argv)
    with sigterm_as_interrupt():  # its temporary files go, as after Ctrl-C
        report = convert(args.inputs, args.out, split=args.split, progress=not args.no_progress,  # an unreadable input: one line from cli.main
                         workers=min(usable_cores(), MAX_WORKERS) if args.workers is None else args.workers)
    status = 0 if sum(report.written.values()) else 1  # nothing to evaluate or train on is a failure
    if args.json:
        print(json.dumps(report.as_dict()))
    else:
        print(f"{report.lines} lines in {report.seconds:.1f} s ({report.lines_per_s:.0f} lines/s): "
              f"{report.written['P']} P: and {report.written['A']} A: records, {report.errors} not converted")
        if report.duplicates:
            print(f"  {report.duplicates} records repeat an earlier one (each written; a test split counts "
                  "every copy)")
        if report.short_lists:
            print(f"  {report.short_lists} P: records list fewer candidates than min(5, legal moves): "
                  "policy/valid asks their answers for as many")
        for msg in report.first_errors:
            print(f"  {msg}")
        if report.errors > len(report.first_errors):
            print(f"  ... all {report.errors} in {report.outputs['errors']}" if "errors" in report.outputs
                  else f"  ... and {report.errors - len(report.first_errors)} more (counts by reason below)")
        for reason, n in report.reasons.most_common(MAX_REASONS_SHOWN):
            print(f"  {n:>8}  {reason}")
        if len(report.reasons) > MAX_REASONS_SHOWN:
            print(f"  ... and {len(report.reasons) - MAX_REASONS_SHOWN} other kinds of reason "
                  f"({sum(n for _, n in report.reasons.most_common()[MAX_REASONS_SHOWN:])} lines; --json counts them all)")
        for t, p in report.outputs.items():
            print(f"{t}: {p}")
    if status:
        why = (f"none of the {report.lines} lines converted (their reasons by count in the report)" if report.lines
               else "the inputs hold no lines")
        print(f"rookworld convert: error: {why}; nothing was written to {args.out}", file=sys.stderr)
    return status
