"""The original RookWorld data: read its lines and local copies of its data sets into our records.

Original lines (the generators of the public RookWorld repository, ``dev/data/``)::

    P: <FEN padded to 90 (89 in some files)>M: <moves padded to 30>E: <evals padded to 40>B: <best>
    [A: ]<FEN>+<move>+<history>+<new FEN>+<reward>+<terminated>+<truncated>

- ``P:`` (the rook sets): the (move, eval) pairs are shuffled; evals are Python floats of
  ``score(mate_score=100000) / 100`` from the side to move's point of view (``999.85`` = mate in 15);
  ``B:`` is the first multipv move for white but the *last* (the worst of the five) for black, because
  the generator reversed the list for black.
- ``A:`` (the arbiter sets; the rookworld text sets add the ``A: `` prefix): FENs are python-chess's
  ``board.fen()`` (an en-passant square only when a capture is possible); the transition was made with
  ``board.push`` and no legality check, and ``outcome()`` with the game's whole move stack (so
  repetition endings appear).

Conversion (:func:`convert_line`, :func:`convert`, ``rookworld convert``)
    Every line becomes one of our records (``data.SCHEMA``, ``source: "original"``) or a
    :class:`LineError` ``file:line: reason``; nothing is scored or kept silently:

    - ``P:``: the candidates are re-ordered best first by their evals (the side to move's view), so
      ``best`` is the best listed move; the line's own ``B:`` is kept as ``original_best``. The
      engine and search limit are unknown (``engine``/``limit`` say so).
    - ``A:``: the transition is replayed with python-chess (legality by ``board.is_legal``); the line
      converts only when its next position (by :func:`tasks.same_position`), reward and flags agree.
      Rows the original generator got wrong (an illegal move pushed, a position without a king, a
      repetition ending that the position alone does not decide) are reported with the reason.

    Conversion streams: one line at a time in, one record at a time out, in bounded chunks over
    worker processes; memory does not grow with the input. Inputs: text files (one line each),
    JSON lines (a ``text`` field), Parquet and Arrow files (a ``text`` column; needs pyarrow), as the
    public data sets are published. Downloading them is the user's step.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import sys
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path


from . import tasks
from .data import ORIGINAL_SOURCE, SPLITS, TASK_FILES, move_tags, position_tags
from .rewards import EnvTruth

ORIGINAL_ENGINE = "unknown (original RookWorld data)"
ORIGINAL_LIMIT = "unknown"
MAX_ERRORS_SHOWN = 10


# --------------------------------------------------------------------------------------------
# One line
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class OriginalPolicyLine:
    """A ``P:`` line as written: candidates in the line's order, eval texts as written."""

    fen: str
    moves: tuple[str, ...]
    evals: tuple[str, ...]
    best: str
    fen_width: int  # 90 or 89: the width the FEN was padded to

    def text(self) -> str:
        """The line written back in the original layout (equal to the input for a well-formed line)."""
        prompt, completion = tasks.policy_text(self.fen, self.moves, self.evals, self.best, "original",
                                               shuffle=False, fen_width=self.fen_width)
        return prompt + completion


@dataclass(frozen=True)
class OriginalEnvLine:
    """An ``A:`` line as written: its prompt fields, its answer (an EnvTruth) and its prefix."""

    fen: str
    move: str
    history: tuple[str, ...]
    answer: EnvTruth  # the next FEN, reward and flags the line states
    prefixed: bool  # the line starts with "A: " (rookworld text sets) or not (arbiter sets)

    def text(self) -> str:
        """The line written back as the original did: python-chess's FENs, the same prefix."""
        a = self.answer
        prompt = tasks.env_prompt(tasks.original_fen(self.fen), self.move, self.history)
        completion = tasks.env_completion(tasks.original_fen(a.new_fen), a.reward, a.terminated, a.truncated)
        return (prompt if self.prefixed else prompt[len(tasks.ENV_PREFIX):]) + completion


def parse_policy_line(text: str) -> OriginalPolicyLine | str:
    """An original ``P:`` line, or the reason it cannot be one. Never raises."""
    parse = tasks.parse_policy(text)
    if not parse.ok:
        return "; ".join(parse.errors)
    width = text.index(" M:") + 1 - len(tasks.POLICY_PREFIX)
    if parse.layout != "original":
        return "not the original fixed-width layout (FEN 89/90, M 30, E 40 characters)"
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
    fen, move, hist, new_fen, reward, terminated, truncated = parts
    err = tasks.fen_error(fen)
    if err:
        return f"impossible position: {err}"
    if not move or any(c.isspace() for c in move):
        return "move field is empty or has whitespace"
    history = tuple(hist.split(" ")) if hist else ()
    if not history or history[-1] != move or len(history) > tasks.HISTORY_LEN:
        return f"history must be 1..{tasks.HISTORY_LEN} moves ending with the move"
    err = tasks.fen_error(new_fen)
    if err:
        return f"new FEN: {err}"
    try:
        value = float(reward)
    except ValueError:
        return f"reward is not a number: {reward[:16]!r}"
    if value not in tasks.ENV_REWARDS:
        return f"reward {reward!r} is not one of {tasks.ENV_REWARDS}"
    if terminated not in ("0", "1") or truncated not in ("0", "1"):
        return "terminated/truncated are not 0/1"
    return OriginalEnvLine(fen, move, history, EnvTruth(new_fen, value, int(terminated), int(truncated)), prefixed)


def _disagreement(line: OriginalEnvLine, ref: tasks.EnvTransition) -> str | None:
    """Why the original row differs from python-chess's transition, or None when it agrees."""
    a = line.answer
    same_fen = tasks.same_position(a.new_fen, ref.new_fen)
    diff = [name for name, x, y in (("reward", a.reward, ref.reward), ("terminated", a.terminated, ref.terminated),
                                    ("truncated", a.truncated, ref.truncated)) if x != y]
    if same_fen and not diff:
        return None
    if ref.kind == "illegal" and a.truncated == 0:
        return "illegal move pushed without a legality check (the original generator's board.push)"
    if a.terminated and not ref.terminated and a.reward == tasks.REWARD_DRAW:
        return "a repetition ending: the position and ten moves of history do not decide it"
    if not same_fen:
        diff.insert(0, "new FEN")
    return f"transition disagrees with python-chess: {', '.join(diff)}"


def convert_line(text: str, *, split: str = "test", ident: str = "0", number: int = 0) -> dict | str:
    """Our record for one original line (``P:``, ``A:`` or an unprefixed arbiter line), or the
    reason it cannot be converted. `ident` makes the record id; `number` fills ``game``."""
    try:
        text = text.rstrip("\r\n")
        if text.startswith(tasks.POLICY_PREFIX):
            line = parse_policy_line(text)
            return line if isinstance(line, str) else policy_record(line, split, f"P-{ident}", number)
        line = parse_env_line(text)
        if isinstance(line, str):
            return line
        ref = tasks.environment_step(line.fen, line.move, line.history[:-1])
        why = _disagreement(line, ref)
        return why if why else env_record(line, ref, split, f"A-{ident}", number)
    except Exception as exc:  # a converter must report a line, never stop on it
        return f"internal error ({type(exc).__name__}: {exc})"


def policy_record(line: OriginalPolicyLine, split: str, ident: str, number: int = 0) -> dict:
    """Our P: record: candidates best first by eval (stable for ties), the line's B: as original_best."""
    evals = [tasks.parse_eval(e) for e in line.evals]
    order = sorted(range(len(line.moves)), key=lambda i: -evals[i].to_cp())
    moves = [line.moves[i] for i in order]
    texts = [tasks.format_eval(evals[i]) for i in order]
    board = tasks.checked_board(line.fen)[0]
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


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------

def _need_pyarrow(path: Path):
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise ValueError(f"{path}: reading Parquet/Arrow needs pyarrow: pip install pyarrow "
                         "(or export the data set's text column as a .txt file)") from None


def _text_batches(table_batches, path: Path) -> Iterator[str]:
    for batch in table_batches:
        if "text" not in batch.schema.names:
            raise ValueError(f"{path}: no 'text' column (columns: {', '.join(batch.schema.names)})")
        yield from batch.column("text").to_pylist()


def iter_lines(path: str | os.PathLike) -> Iterator[str]:
    """The text lines of one input file, streamed: .txt (any other suffix too) one line each,
    .jsonl/.json a ``text`` field per JSON line (a ValueError in place of an unreadable one),
    .parquet and .arrow a ``text`` column."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        _need_pyarrow(path)
        import pyarrow.parquet as pq

        yield from _text_batches(pq.ParquetFile(path).iter_batches(batch_size=4096, columns=["text"]), path)
    elif suffix == ".arrow":
        _need_pyarrow(path)
        import pyarrow as pa

        with pa.memory_map(str(path)) as source:
            try:
                reader = pa.ipc.open_stream(source)  # what the datasets library writes
            except pa.ArrowInvalid:
                reader = pa.ipc.open_file(source)
                reader = (reader.get_batch(i) for i in range(reader.num_record_batches))
            yield from _text_batches(reader, path)
    elif suffix in (".jsonl", ".json"):
        with open(path, encoding="utf-8") as fh:
            for raw in fh:  # one item per line, blank ones too, so line numbers hold
                if not raw.strip():
                    yield ""
                    continue
                try:
                    yield json.loads(raw)["text"]
                except (ValueError, KeyError, TypeError):
                    yield ValueError("not a JSON object with a 'text' field")  # reported as this line's reason
    else:
        with open(path, encoding="utf-8", errors="replace") as fh:
            yield from fh


@dataclass
class ConvertReport:
    """What a conversion did: lines read, records written per task, errors by reason."""

    lines: int = 0
    written: Counter = field(default_factory=Counter)  # "P" / "A" -> records
    reasons: Counter = field(default_factory=Counter)  # reason -> lines
    first_errors: list[str] = field(default_factory=list)  # the first MAX_ERRORS_SHOWN, file:line: reason
    seconds: float = 0.0
    outputs: dict = field(default_factory=dict)  # task -> path

    @property
    def errors(self) -> int:
        return sum(self.reasons.values())

    @property
    def lines_per_s(self) -> float:
        return self.lines / self.seconds if self.seconds > 0 else float("nan")

    def as_dict(self) -> dict:
        return {"lines": self.lines, "written": dict(self.written), "errors": self.errors,
                "errors_by_reason": dict(self.reasons.most_common()), "first_errors": self.first_errors,
                "seconds": round(self.seconds, 2), "lines_per_s": round(self.lines_per_s, 1),
                "outputs": {k: str(v) for k, v in self.outputs.items()}}


def _reason_kind(reason: str) -> str:
    # counts group by the kind of problem, not by the move or text it quotes
    return re.sub(r"'[^']*'|\"[^\"]*\"", "'...'", reason)


def _convert_chunk(chunk: list[tuple[str, int, str]], split: str) -> list[tuple[int, dict | str]]:
    out = []
    for ident, number, text in chunk:
        bad = isinstance(text, ValueError)
        out.append((number, str(text) if bad else convert_line(text, split=split, ident=ident, number=number)))
    return out


def _chunks(inputs: list[Path], size: int) -> Iterator[tuple[Path, list[tuple[str, int, str]]]]:
    for k, path in enumerate(inputs):
        chunk = []
        for lineno, text in enumerate(iter_lines(path), 1):
            if text is None or isinstance(text, str) and not text.strip():
                continue
            chunk.append((f"{k}-{lineno}", lineno, text if isinstance(text, ValueError) else str(text)))
            if len(chunk) == size:
                yield path, chunk
                chunk = []
        if chunk:
            yield path, chunk


def convert(inputs: Iterable[str | os.PathLike], out_dir: str | os.PathLike, *, split: str = "test",
            workers: int = 1, chunk_lines: int = 2000, progress: bool = False,
            errors_file: str | os.PathLike | None = None) -> ConvertReport:
    """Convert original lines into ``<out_dir>/policy_<split>.jsonl`` and ``env_<split>.jsonl``
    (ready for ``rookworld eval --data-dir``, ``grpo`` and ``sft``). Every line that does not
    convert is written to `errors_file` (default ``<out_dir>/convert_errors_<split>.txt``) as
    ``file:line: reason``. Outputs appear atomically when the whole input is done."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    inputs = [Path(p) for p in inputs]
    for p in inputs:
        if not p.is_file():
            raise ValueError(f"{p}: no such file")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    finals = {t: out / TASK_FILES[t].format(split=split) for t in ("P", "A")}
    errors_path = Path(errors_file) if errors_file else out / f"convert_errors_{split}.txt"
    temps = {t: p.with_name(p.name + ".tmp") for t, p in finals.items()}
    report = ConvertReport()
    t0 = time.perf_counter()
    handles = {t: open(p, "w", encoding="utf-8") for t, p in temps.items()}
    err_fh = open(errors_path, "w", encoding="utf-8")
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(unit=" lines", desc="convert")
    pool = concurrent.futures.ProcessPoolExecutor(workers) if workers > 1 else None

    def results() -> Iterator[tuple[Path, list]]:
        # in input order; with workers, at most 2 chunks per worker in flight (bounded memory)
        pending: deque = deque()
        for path, chunk in _chunks(inputs, chunk_lines):
            if pool is None:
                yield path, _convert_chunk(chunk, split)
                continue
            pending.append((path, pool.submit(_convert_chunk, chunk, split)))
            if len(pending) >= 2 * workers:
                p, fut = pending.popleft()
                yield p, fut.result()
        while pending:
            p, fut = pending.popleft()
            yield p, fut.result()

    try:
        for path, chunk_results in results():
            for number, res in chunk_results:
                report.lines += 1
                if isinstance(res, str):
                    msg = f"{path}:{number}: {res}"
                    err_fh.write(msg + "\n")
                    report.reasons[_reason_kind(res)] += 1
                    if len(report.first_errors) < MAX_ERRORS_SHOWN:
                        report.first_errors.append(msg)
                else:
                    handles[res["task"]].write(json.dumps(res) + "\n")
                    report.written[res["task"]] += 1
            if bar is not None:
                bar.update(len(chunk_results))
        for t, fh in handles.items():
            fh.close()
            if report.written[t]:
                os.replace(temps[t], finals[t])
                report.outputs[t] = finals[t]
    finally:
        for fh in handles.values():
            fh.close()
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
        err_fh.close()
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        if bar is not None:
            bar.close()
    report.outputs["errors"] = errors_path
    report.seconds = time.perf_counter() - t0
    return report


def cli(argv: list[str] | None = None) -> int:
    from .engine import usable_cores

    ap = argparse.ArgumentParser(
        prog="rookworld convert",
        description="Convert original RookWorld data (P: rook lines, A: arbiter/rookworld lines; .txt, "
                    ".jsonl with a 'text' field, .parquet, .arrow) into our validated records, streaming. "
                    "Lines that do not convert are listed as file:line: reason, with counts by reason.",
        epilog="example: rookworld convert rook_val_500.txt arbiter_test.txt --out data/original --split test; "
               "then: rookworld eval /path/to/RookWorld-LM-124M --data-dir data/original")
    ap.add_argument("inputs", nargs="+", metavar="FILE", help="original data files")
    ap.add_argument("--out", required=True, metavar="DIR", help="output directory (policy_<split>.jsonl, env_<split>.jsonl)")
    ap.add_argument("--split", default="test", choices=list(SPLITS), help="split the records go to (default: %(default)s)")
    ap.add_argument("--workers", type=int, default=None, help="processes (default: usable cores)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument("--json", action="store_true", help="print the report as one JSON object")
    args = ap.parse_args(argv)
    try:
        report = convert(args.inputs, args.out, split=args.split, workers=args.workers or usable_cores(),
                         progress=not args.no_progress)
    except (ValueError, OSError) as exc:
        print(f"rookworld convert: error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report.as_dict()))
        return 0
    print(f"{report.lines} lines in {report.seconds:.1f} s ({report.lines_per_s:.0f} lines/s): "
          f"{report.written['P']} P: and {report.written['A']} A: records, {report.errors} not converted")
    for msg in report.first_errors:
        print(f"  {msg}")
    if report.errors > len(report.first_errors):
        print(f"  ... all {report.errors} in {report.outputs['errors']}")
    for reason, n in report.reasons.most_common():
        print(f"  {n:>8}  {reason}")
    for t, p in report.outputs.items():
        print(f"{t}: {p}")
    return 0


__all__ = ["OriginalPolicyLine", "OriginalEnvLine", "parse_policy_line", "parse_env_line", "convert_line",
           "policy_record", "env_record", "iter_lines", "ConvertReport", "convert", "cli"]
