"""Issue 28, items 3, 8 and 9 (data): every command reads a data directory the same way (plain,
gzip-compressed or sharded files, `data.load_split`); missing data and settings that select nothing
are one line, never a skipped suite with exit 0 or a traceback; `convert` names what is wrong with an
input (a directory, a Parquet column), and accepts a UTF-8 byte-order mark.

Each test runs the `rookworld` command in-process (`cli.main`), as a user meets it.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from rookworld_lib.chess import data
from rookworld_lib.lab.cli import main

pytestmark = pytest.mark.fault
ROOT = Path(__file__).resolve().parent.parent
TINY = {"n_layer": 1, "n_embd": 32, "n_head": 2}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A tiny Hugging Face model (block_size 256: a P: prompt and a short answer fit)."""
    from rookworld_lib.core.model import GPT, GPTConfig

    out = tmp_path_factory.mktemp("model") / "model"
    GPT(GPTConfig.preset("tiny", **TINY, block_size=256)).save_pretrained(out)
    return out


def shipped_lines(name: str, n: int, split: str | None = None) -> list[str]:
    """The first `n` lines of a shipped data file (of `split` only, when given)."""
    lines = (ROOT / "data" / name).read_text().splitlines()
    return [ln for ln in lines if split is None or json.loads(ln)["split"] == split][:n]


def write_shards(directory: Path, name: str, lines: list[str]) -> None:
    """`name`'s lines as two gzip-compressed shards, as `rookworld datagen --shard-size N --compress` writes them."""
    directory.mkdir(parents=True, exist_ok=True)
    half = len(lines) // 2
    for shard, part in enumerate((lines[:half], lines[half:])):
        with gzip.open(directory / data.data_file_name(name, shard, compress=True), "wt") as f:
            f.write("".join(ln + "\n" for ln in part))


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    """A data directory in shards only: 4 records of each test split, 4 mate-in-one test records, 4 of
    each training split."""
    d = tmp_path_factory.mktemp("sharded")
    for name in ("policy_test.jsonl", "env_test.jsonl", "policy_train.jsonl", "env_train.jsonl"):
        write_shards(d, name, shipped_lines(name, 4))
    write_shards(d, data.MATE_FILE, shipped_lines(data.MATE_FILE, 4, split="test"))
    return d


def policy_only(tmp_path: Path) -> Path:
    """A data directory with a policy test file and nothing else (as a converted rook set)."""
    d = tmp_path / "policy-only"
    d.mkdir()
    (d / "policy_test.jsonl").write_text("".join(ln + "\n" for ln in shipped_lines("policy_test.jsonl", 2)))
    return d


def eval_argv(model: Path, data_dir: Path, *extra: str) -> list[str]:
    return ["eval", str(model), "--data-dir", str(data_dir), "--max-new-tokens", "4", "--selfplay-games", "0", *extra]


def grpo_argv(model: Path, data_dir: Path, out: Path, *extra: str) -> list[str]:
    return ["grpo", "--init-from", str(model), "--data-dir", str(data_dir), "--out", str(out), "--device", "cpu",
            "--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "4",
            "--report-to", "none", "--no-progress", *extra]


def one_error_line(capsys, command: str) -> str:
    """The single `rookworld <command>: error: ...` line on stderr (and no traceback)."""
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith(f"rookworld {command}: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err[-2000:]
    return lines[0]


# --- item 3: one reader of data files, for every command

def test_eval_reads_sharded_compressed_test_data(model, sharded, capsys):
    assert main(eval_argv(model, sharded, "--json")) == 0
    out, err = capsys.readouterr()
    results = json.loads(out.splitlines()[-1])
    assert results["policy/valid"]["n"] == 4 and results["env/valid"]["n"] == 4
    assert results["mate_in_one/accuracy"]["n"] == 4
    assert "skipped" not in err and "not found" not in err


def test_grpo_trains_on_sharded_compressed_data(model, sharded, tmp_path, capsys):
    assert main(grpo_argv(model, sharded, tmp_path / "grpo")) == 0
    assert "GRPO finished at step 1" in capsys.readouterr().out
    assert (tmp_path / "grpo" / "final" / "model.safetensors").is_file()


def test_eval_without_any_test_data_is_one_error_naming_the_directory(model, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    argv = eval_argv(model, tmp_path / "empty") + ["--selfplay-games", "2", "--selfplay-max-plies", "2"]
    assert main(argv) == 1
    line = one_error_line(capsys, "eval")
    assert f"{tmp_path / 'empty'}: no test data: looked for policy_test.jsonl[.gz] or policy_test-NNNNN.jsonl[.gz]" in line
    assert "env_test.jsonl[.gz]" in line and "mate_in_one.jsonl[.gz]" in line
    (tmp_path / "a-file").write_text("x")  # a --data-dir that is no folder says so (it read as an empty one)
    for given, why in (("a-file", "a file, not a directory"), ("missing", "no such directory")):
        assert main(eval_argv(model, tmp_path / given) + ["--selfplay-games", "0"]) == 1
        assert f"{tmp_path / given} ({why}): no test data: looked for" in one_error_line(capsys, "eval")


def test_grpo_without_training_data_is_one_error_naming_the_directory(model, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(grpo_argv(model, tmp_path / "empty", tmp_path / "grpo")) == 1
    line = one_error_line(capsys, "grpo")
    assert f"{tmp_path / 'empty'}: no training data: no policy_train.jsonl[.gz] or policy_train-NNNNN.jsonl[.gz]" in line
    assert not (tmp_path / "grpo" / "checkpoints").exists()
    assert main(grpo_argv(model, tmp_path / "missing", tmp_path / "grpo")) == 1
    assert f"{tmp_path / 'missing'} (no such directory): no training data" in one_error_line(capsys, "grpo")


def test_eval_says_which_suite_it_skips(model, tmp_path, capsys):
    d = policy_only(tmp_path)
    assert main(eval_argv(model, d, "--json")) == 0
    out, err = capsys.readouterr()
    assert json.loads(out.splitlines()[-1])["policy/valid"]["n"] == 2
    assert f"{d}: no env_test.jsonl[.gz] or env_test-NNNNN.jsonl[.gz]: the env suite is skipped" in err
    assert f"{d}: no mate_in_one.jsonl[.gz] or mate_in_one-NNNNN.jsonl[.gz]: the mate-in-one suite is skipped" in err


# --- item 8: no traceback, no silent setting

def test_eval_with_no_suite_selected_is_one_line(model, tmp_path, capsys):
    assert main(eval_argv(model, policy_only(tmp_path), "--max-policy", "0")) == 1
    line = one_error_line(capsys, "eval")
    assert "no suite selected" in line and "--selfplay-games N" in line


@pytest.mark.parametrize("value", ["0", "-3"])
def test_max_new_tokens_below_one_is_refused_by_grpo_as_by_eval(model, sharded, tmp_path, capsys, value):
    for command, argv in (("eval", eval_argv(model, sharded)), ("grpo", grpo_argv(model, sharded, tmp_path / "grpo"))):
        assert main(argv + ["--max-new-tokens", value]) == 1
        assert f"max_new_tokens (--max-new-tokens) must be an integer >= 1, got {value}" in one_error_line(capsys, command)
    assert not (tmp_path / "grpo").exists()


def test_position_explorer_refuses_env_records_in_a_clear_message(model):
    from rookworld_lib.core.model import GPT
    from rookworld_lib.lab import explore

    env = [json.loads(ln) for ln in shipped_lines("env_test.jsonl", 1)]
    with pytest.raises(ValueError, match=r"shows P: \(policy\) records; records\[0\] is a record of task 'A'"):
        explore.PositionExplorer(GPT.from_pretrained(model), env)


# --- items 8 and 9: convert's inputs

@pytest.fixture
def pq(tmp_path):
    pytest.importorskip("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    return lambda name, columns: pq.write_table(pa.table(columns), tmp_path / name) or tmp_path / name


def convert_argv(tmp_path: Path, *inputs) -> list[str]:
    return ["convert", *map(str, inputs), "--out", str(tmp_path / "out"), "--workers", "1", "--no-progress"]


def test_convert_parquet_text_column_of_ints_is_one_line(tmp_path, pq, capsys):
    assert main(convert_argv(tmp_path, pq("ints.parquet", {"text": [1, 2, 3]}))) == 1
    assert "ints.parquet: column 'text' holds int64, not strings" in one_error_line(capsys, "convert")


def test_convert_parquet_without_text_column_lists_its_columns(tmp_path, pq, capsys):
    assert main(convert_argv(tmp_path, pq("lines.parquet", {"line": ["x"], "n": [1]}))) == 1
    assert "lines.parquet: no 'text' column (columns: line, n)" in one_error_line(capsys, "convert")


def test_convert_calls_a_directory_a_directory(tmp_path, capsys):
    (tmp_path / "rook").mkdir()
    assert main(convert_argv(tmp_path, tmp_path / "rook")) == 1
    assert f"{tmp_path / 'rook'}: is a directory; give the data files in it" in one_error_line(capsys, "convert")
    assert main(convert_argv(tmp_path, "/dev/null")) == 1  # a device is there: "no such file" was wrong
    assert "/dev/null: not a regular file (a device, socket or pipe); give a data file" in one_error_line(capsys, "convert")
    assert main(convert_argv(tmp_path, tmp_path / "missing.txt")) == 1
    assert f"{tmp_path / 'missing.txt'}: no such file" in one_error_line(capsys, "convert")


@pytest.mark.parametrize("name", ["arbiter.txt", "arbiter.jsonl"])
def test_convert_accepts_a_byte_order_mark(tmp_path, capsys, name):
    env = json.loads(shipped_lines("env_test.jsonl", 1)[0])
    text = env["prompt"] + env["completion"]
    (tmp_path / name).write_text((json.dumps({"text": text}) if name.endswith(".jsonl") else text) + "\n",
                                 encoding="utf-8-sig")
    assert main(convert_argv(tmp_path, tmp_path / name, "--json")) == 0
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert report["written"] == {"A": 1} and report["errors"] == 0


def test_a_gap_in_a_shard_numbering_is_refused_by_every_reader_naming_the_missing_file(tmp_path, model, capsys):
    gap = tmp_path / "gap"
    gap.mkdir()
    for name in ("policy_test.jsonl", "env_test.jsonl", "policy_train.jsonl", "env_train.jsonl"):
        lines = shipped_lines(name, 6)
        for shard in (0, 2):  # shard 1 lost (a deleted file, a copy cut short)
            with gzip.open(gap / data.data_file_name(name, shard, compress=True), "wt") as f:
                f.write("".join(ln + "\n" for ln in lines[2 * shard:2 * shard + 2]))
    lost = gap / data.data_file_name("policy_test.jsonl", 1, compress=True)
    assert main(eval_argv(model, gap)) == 1
    assert f"{lost}: missing shard" in one_error_line(capsys, "eval")
    assert main(grpo_argv(model, gap, tmp_path / "out")) == 1
    assert "missing shard" in one_error_line(capsys, "grpo") and not (tmp_path / "out" / "metrics.jsonl").exists()


# --- convert under a hostile user: killed, stopped, given odd files

def _policy_lines(n: int) -> str:
    """`n` original P: lines (shipped test records written in the original layout), one text."""
    from rookworld_lib.chess import tasks
    recs = [json.loads(ln) for ln in shipped_lines("policy_test.jsonl", 40)]
    lines = [tasks.policy_prompt(r["fen"], "original") + tasks.policy_completion(r["moves"], r["evals"], r["best"], "original")
             for r in recs]
    return "".join(lines[i % len(lines)] + "\n" for i in range(n))


def test_convert_workers_left_by_a_killed_command_hold_no_lock_and_end_with_it(tmp_path):
    """SIGKILL on `convert --workers 2` left its pool's workers alive (reparented, asleep) holding the
    --out lock they had inherited with fork: every later convert there was refused as busy."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from rookworld_lib.core.paths import busy_message

    src = tmp_path / "rook.txt"
    src.write_text(_policy_lines(8))
    out = tmp_path / "out"
    script = ("import multiprocessing, os, signal, sys\nfrom pathlib import Path\n"
              "from rookworld_lib.chess import convert\nfrom rookworld_lib.core.paths import run_lock\n"
              "with run_lock(sys.argv[1]):\n"
              "    chunks = convert._converted([Path(sys.argv[2])], 'test', 2, 1)\n"
              "    next(chunks)  # the pool's workers run (the generator held: its end would stop them)\n"
              "    print(*[p.pid for p in multiprocessing.active_children()], flush=True)\n"
              "    os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", script, str(out), str(src)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    workers = [int(p) for p in proc.stdout.split()]
    assert len(workers) == 2
    assert busy_message(out) is None  # the lock died with the command, though its workers may still be ending
    deadline = time.monotonic() + 20
    while (alive := [p for p in workers if os.path.exists(f"/proc/{p}")]) and time.monotonic() < deadline:
        time.sleep(0.1)
    for p in alive:  # do not leave them to the next test
        os.kill(p, signal.SIGKILL)
    assert not alive, "a conversion worker outlived its command"


def test_a_forked_child_does_not_inherit_a_run_lock(tmp_path):
    import os

    from rookworld_lib.core.paths import LOCK_FILE, run_lock

    lock = str((tmp_path / "run" / LOCK_FILE).resolve())
    with run_lock(tmp_path / "run"):
        pid = os.fork()
        if pid == 0:  # the child: exit status 1 when it holds a descriptor of the lock file
            held = any(os.readlink(f"/proc/self/fd/{fd}") == lock for fd in os.listdir("/proc/self/fd")
                       if os.path.exists(f"/proc/self/fd/{fd}"))
            # the lock's number stays taken (by /dev/null): a file the child opens gets another, which the stale
            # file object's close, as the child leaves the block, cannot take from it
            with open(os.devnull) as mine:
                reused = any(os.readlink(f"/proc/self/fd/{fd}") == os.devnull and fd == mine.fileno()
                             for fd in map(int, os.listdir("/proc/self/fd")) if fd < mine.fileno())
            os._exit(int(held) + 2 * int(reused))
        assert os.waitpid(pid, 0)[1] == 0


@pytest.mark.parametrize("stop", ["SIGTERM", "Ctrl-C"])
def test_convert_stopped_midway_says_so_and_leaves_nothing(tmp_path, capsys, monkeypatch, stop):
    """SIGTERM (`timeout`, a scheduler) killed convert where it stood: no line, and its hidden temporary
    outputs (GBs on a full data set) stayed in --out for good; Ctrl-C left a new --out holding only .lock."""
    import os
    import signal

    from rookworld_lib.chess import convert

    src = tmp_path / "rook.txt"
    src.write_text(_policy_lines(30))
    real, seen = convert.convert_line, []

    def line(text, **kw):
        seen.append(1)
        if len(seen) == 10:
            if stop == "SIGTERM":
                os.kill(os.getpid(), signal.SIGTERM)
            else:
                raise KeyboardInterrupt
        return real(text, **kw)

    monkeypatch.setattr(convert, "convert_line", line)
    before = signal.getsignal(signal.SIGTERM)
    assert main(convert_argv(tmp_path, src)) == 130
    assert capsys.readouterr().err.strip().endswith(f"rookworld convert: interrupted ({stop})")
    assert not (tmp_path / "out").exists()  # the folder it made is gone, temporary files and lock with it
    assert signal.getsignal(signal.SIGTERM) is before


def test_convert_removes_the_temporary_files_a_killed_conversion_left(tmp_path):
    from rookworld_lib.chess import convert

    src = tmp_path / "rook.txt"
    src.write_text(_policy_lines(3))
    out = tmp_path / "out"
    out.mkdir()
    stale = [out / ".tmp-policy_test.jsonl.k1ll3d", out / ".tmp-convert_errors_test.txt.abc"]
    other = out / ".tmp-policy_val.jsonl.x"  # another split's: a conversion into it may be under way
    for p in (*stale, other):
        p.write_text("torn")
    convert.convert([src], out, split="test", workers=1)
    assert not any(p.exists() for p in stale) and other.exists()
    assert len(data.load_split("P", "test", out)) == 3


def test_convert_says_a_worker_died_in_one_line(tmp_path, monkeypatch):
    """A worker killed (the OOM killer) gave BrokenProcessPool's traceback."""
    from rookworld_lib.chess import convert

    src = tmp_path / "rook.txt"
    src.write_text(_policy_lines(4))
    monkeypatch.setattr(convert, "_convert_chunk", _die)  # forked workers see it
    with pytest.raises(ValueError, match=r"a conversion worker died .* run again, with fewer --workers \(this run: 2\)"):
        convert.convert([src], tmp_path / "out", split="test", workers=2, chunk_lines=1)
    assert not (tmp_path / "out").exists()


def _die(chunk, split):
    import os
    os._exit(1)


def test_convert_names_utf16_bare_carriage_returns_and_reads_a_dictionary_column(tmp_path, pq, capsys):
    """PowerShell's UTF-16 was "not a text file (NUL bytes)"; classic-Mac line ends made one line whose
    reason was "unexpected text after B: move"; a dictionary-encoded Parquet text column was refused."""
    import pyarrow as pa

    lines = _policy_lines(3)
    (tmp_path / "ps.txt").write_bytes(b"\xff\xfe" + lines.encode("utf-16-le"))
    assert main(convert_argv(tmp_path, tmp_path / "ps.txt")) == 1
    assert "ps.txt: UTF-16 text (its byte-order mark); save it as UTF-8, e.g. iconv" in one_error_line(capsys, "convert")
    (tmp_path / "mac.txt").write_text(lines.replace("\n", "\r"))
    assert main(convert_argv(tmp_path, tmp_path / "mac.txt")) == 1
    assert "mac.txt: its lines end in a bare carriage return" in one_error_line(capsys, "convert")
    table = pq("dict.parquet", {"text": pa.array(lines.splitlines()).dictionary_encode()})
    assert main(convert_argv(tmp_path, table)) == 0
    assert len(data.load_split("P", "test", tmp_path / "out")) == 3


def test_convert_counts_reasons_by_kind_however_many_values_the_lines_hold(tmp_path, capsys):
    """SAN moves, eval texts and byte offsets were unquoted in their reasons: 60k lines printed 58,684
    kinds; the printed counts now stop at MAX_REASONS_SHOWN kinds."""
    from rookworld_lib.chess import convert

    assert (convert.reason_kind("M: not UCI: Nf3 e4 d4") == convert.reason_kind("M: not UCI: Bb5")
            == "M: not UCI: ...")
    assert convert.reason_kind("E: not an eval: 0. x; B: not UCI: 'Nf3'") == "E: not an eval: ...; B: not UCI: '...'"
    assert convert.reason_kind("not UTF-8 (invalid start byte at byte 87)") == "not UTF-8 (invalid start byte at byte N)"
    assert (convert.reason_kind('its \'text\' is [1, "a"], not the line as a string')
            == "its 'text' is ..., not the line as a string")
    src = tmp_path / "fields.txt"  # 29 kinds: "expected 7 '+'-separated fields, found k" (k kept: it says what to fix)
    src.write_text("".join("+".join(["x"] * k) + "\n" for k in range(1, 31) if k != 7))
    assert main(convert_argv(tmp_path, src)) == 1
    out = capsys.readouterr().out
    assert out.count("-separated fields, found") == convert.MAX_ERRORS_SHOWN + convert.MAX_REASONS_SHOWN
    assert f"... and {29 - convert.MAX_REASONS_SHOWN} other kinds of reason ({29 - convert.MAX_REASONS_SHOWN} lines; --json counts them all)" in out


def test_convert_refuses_a_bare_file_name_and_a_chunk_size_below_one(tmp_path):
    from rookworld_lib.chess import convert

    src = tmp_path / "rook.txt"
    src.write_text(_policy_lines(2))
    with pytest.raises(ValueError, match=r"inputs must be a list of files, got one: .*rook.txt"):
        convert.convert(str(src), tmp_path / "a")
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=rf"chunk_lines must be a whole number of lines >= 1, got {bad!r}"):
            convert.convert([src], tmp_path / "a", chunk_lines=bad)
    assert not (tmp_path / "a").exists()


def test_convert_names_castling_written_king_takes_rook():
    from rookworld_lib.chess import convert

    line = "A: r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1+e1h1+e1h1+r3k2r/8/8/8/8/8/8/R4RK1 b kq - 1 1+0.001+0+0"
    assert convert.convert_line(line).startswith("castling written king-takes-rook (e1h1): our records spell it "
                                                 "king-to-square (e1g1)")


def test_convert_with_workers_under_forkserver_converts(tmp_path):
    """Python 3.14's default start method on Linux: every worker's parent was the fork server, so each
    exited at once and the run failed as "a conversion worker died (killed: out of memory?)"."""
    import subprocess
    import sys

    src = tmp_path / "rook.txt"
    src.write_text(_policy_lines(6))
    script = ("import multiprocessing, sys\nfrom rookworld_lib.chess import convert\n"
              "multiprocessing.set_start_method('forkserver', force=True)\n"
              "r = convert.convert([sys.argv[1]], sys.argv[2], workers=2, chunk_lines=2)\nprint(r.written['P'])\n")
    proc = subprocess.run([sys.executable, "-c", script, str(src), str(tmp_path / "out")], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.split() == ["6"], proc.stderr[-2000:]


def test_convert_names_utf16_and_bare_cr_json_lines_and_gzip_inputs_with_advice_that_runs(tmp_path, capsys):
    import gzip

    line = json.dumps({"text": _policy_lines(1).strip()}) + "\n"
    (tmp_path / "ps.jsonl").write_bytes(b"\xff\xfe" + (line * 3).encode("utf-16-le"))
    assert main(convert_argv(tmp_path, tmp_path / "ps.jsonl")) == 1
    assert "ps.jsonl: UTF-16 text (its byte-order mark)" in one_error_line(capsys, "convert")
    (tmp_path / "mac.jsonl").write_text((line * 3).replace("\n", "\r"))
    assert main(convert_argv(tmp_path, tmp_path / "mac.jsonl")) == 1
    assert "mac.jsonl: its lines end in a bare carriage return" in one_error_line(capsys, "convert")
    with gzip.open(tmp_path / "ps.txt.gz", "wb") as f:
        f.write(b"\xff\xfe" + _policy_lines(3).encode("utf-16-le"))
    assert main(convert_argv(tmp_path, tmp_path / "ps.txt.gz")) == 1
    assert (f"save it as UTF-8, e.g. zcat {tmp_path / 'ps.txt.gz'} | iconv -f UTF-16 -t UTF-8 | gzip > ps.utf8.txt.gz"
            in one_error_line(capsys, "convert"))


def test_the_reason_counts_pair_quotes_around_values_not_apostrophes_or_one_letter_quotes():
    from rookworld_lib.chess import convert

    fen = "rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR W KQkq - 0 2"
    assert (convert.reason_kind(f"prompt: FEN does not parse: expected 'w' or 'b' for turn part of fen: '{fen}'")
            == "prompt: FEN does not parse: expected 'w' or 'b' for turn part of fen: '...'")
    assert (convert.reason_kind("illegal move pushed without a legality check (the original generator's board.push): "
                                "'e7e8' x") == "illegal move pushed without a legality check (the original generator's "
                                               "board.push): '...' x")
