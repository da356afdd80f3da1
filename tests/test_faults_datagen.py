"""Issue 28, datagen's part: nothing lost, nothing silent, each fault as a user meets it.

- two `rookworld datagen` into one `--out`: the second stops before it touches anything, in one line
  naming the directory and the other run's pid; `--validate` reports a shard numbering with a gap
  (the file whose records are lost);
- an engine behind a wrapper script whose descendant holds the engine's pipe: datagen still ends in
  one line, and no process of the wrapper's outlives the run (python-chess's pool included); an engine
  that answers an illegal bestmove loses its session;
- `--games 200000`: nothing is allocated per game before the first game is played;
- messages: bad settings end in one line and exit 1 (a command line argparse cannot parse: usage and
  exit 2, as in every `rookworld` command); an unwritable `--out` is named, without a promise to
  resume; `--summary` of a missing directory says so.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import tracemalloc
from pathlib import Path

import chess
import pytest
from forked_child import ForkedChild, cli_main
from helpers_chess import needs_stockfish, wait_gone
from test_data_messages import one_line
from test_faults import DATAGEN_ARGS, assert_one_clear_message, child_env, fake_engine, run_driver

from rookworld_lib.chess import datagen, engine
from rookworld_lib.chess.engine import EngineSessionLost, EngineSettings
from rookworld_lib.lab.cli import main

pytestmark = pytest.mark.fault
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def fast_timeouts(monkeypatch):
    """Engine start and search limits of 0.5 s plus next to nothing: a hung engine fails within seconds."""
    monkeypatch.setattr(engine, "TIMEOUT_FLOOR_S", 0.5)
    monkeypatch.setattr(engine, "SLOW_NODES_PER_S", 1e8)


def datagen_argv(out: Path, stockfish: str, *extra: str) -> list[str]:
    return ["datagen", "--out", str(out), "--stockfish", stockfish, *DATAGEN_ARGS, *extra]


# --- one writer per data directory ------------------------------------------------------------

def test_a_second_datagen_into_a_busy_out_stops_before_touching_anything(tmp_path, capsys, fast_timeouts):
    out, marker = tmp_path / "d", tmp_path / "searching"
    marker.mkdir()
    hung = fake_engine(tmp_path, "never answers go")  # the first run stays in its first games
    # `rookworld datagen ...` in a process of its own, where Ctrl-C raises KeyboardInterrupt (forked_child.py)
    first = ForkedChild(cli_main, datagen_argv(out, hung), env=child_env(FAKE_ENGINE_MARKER=str(marker)))
    try:
        deadline = time.monotonic() + 60
        while not os.listdir(marker) and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.listdir(marker) and first.poll() is None, first.communicate()[1][-2000:]
        before = {p: p.stat().st_mtime_ns for p in out.rglob("*")}
        assert main(datagen_argv(out, hung)) == 1
        line = one_line(capsys.readouterr().err, "rookworld datagen", f"{out} is being written by another run "
                        f"(pid {first.pid} since")
        assert line.startswith("rookworld datagen: error: ")
        assert {p: p.stat().st_mtime_ns for p in out.rglob("*")} == before  # the first run's files, untouched
    finally:
        first.send_signal(signal.SIGINT)
        try:
            first.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            first.kill()
            first.communicate()


def test_validate_names_a_missing_shard(tmp_path, capsys):
    def shard(name: str, source: str, numbers):
        lines = (ROOT / "data" / source).read_text().splitlines(keepends=True)
        for i in numbers:
            (tmp_path / f"{name}-{i:05d}.jsonl").write_text(lines[i])

    shard("policy_val", "policy_val.jsonl", (0, 2, 3))  # 00001 lost
    shard("env_val", "env_val.jsonl", (1,))  # a shard set that does not start at 00000
    assert main(["datagen", "--out", str(tmp_path), "--validate"]) == 1
    out, err = capsys.readouterr()
    assert out.count("records OK") == 4  # every line of the shards there is valid
    missing = [x for x in err.splitlines() if "missing shard" in x]
    assert sorted(missing) == [f"rookworld datagen: error: {tmp_path / name}: missing shard (1 missing: shards are numbered "
                               "from 00000 without gaps); its records are lost: generate the data again"
                               for name in ("env_val-00000.jsonl", "policy_val-00001.jsonl")], err
    assert main(["datagen", "--out", str(tmp_path), "--summary"]) == 1  # the card's counts would leave them out
    assert "policy_val-00001.jsonl: missing shard" in capsys.readouterr().err
    (tmp_path / "policy_val-00001.jsonl").write_text((tmp_path / "policy_val-00000.jsonl").read_text())
    (tmp_path / "env_val-00001.jsonl").rename(tmp_path / "env_val-00000.jsonl")
    assert main(["datagen", "--out", str(tmp_path), "--validate"]) == 0  # complete again
    # a split in two layouts would be counted twice: --validate and --summary say so
    import gzip
    text = (ROOT / "data" / "policy_test.jsonl").read_bytes()
    (tmp_path / "policy_test.jsonl").write_bytes(text)
    (tmp_path / "policy_test.jsonl.gz").write_bytes(gzip.compress(text))
    for command in ("--validate", "--summary"):
        assert main(["datagen", "--out", str(tmp_path), command]) == 1
        assert "policy_test.jsonl, policy_test.jsonl.gz hold the same split in 2 layouts" in capsys.readouterr().err


# --- an engine behind a wrapper script --------------------------------------------------------

def wrapped_engine(tmp_path: Path) -> tuple[str, Path]:
    """A bash script that starts the fake engine that never answers `go` as its child (no exec),
    beside a sleeping descendant that holds the engine's stdout, as a wrapper's stray child does;
    the descendants' pids go to the returned file."""
    pids = tmp_path / "descendants"
    path = tmp_path / "wrapped-stockfish"
    path.write_text(f'#!/bin/bash\nsleep 600 &\necho $! >> "{pids}"\n"{fake_engine(tmp_path, "never answers go")}"\n')
    path.chmod(0o755)
    return str(path), pids


def no_survivors(pids: Path) -> list[int]:
    """The wrapper's descendants still alive after a few seconds (killed here, so that none stays)."""
    alive = wait_gone([int(p) for p in pids.read_text().split()], timeout=5)
    for pid in alive:
        os.kill(pid, signal.SIGKILL)
    return alive


def test_datagen_on_a_wrapped_hung_engine_ends_in_one_line_and_leaves_no_process(tmp_path, capsys, fast_timeouts):
    wrapper, pids = wrapped_engine(tmp_path)
    assert main(datagen_argv(tmp_path / "d", wrapper)) == 1
    one_line(capsys.readouterr().err, "rookworld datagen", "Stockfish failed", "EngineFailedError")
    assert pids.read_text().split() and no_survivors(pids) == []


def test_the_python_chess_pool_kills_a_wrapped_engine_with_its_children(tmp_path, fast_timeouts):
    wrapper, pids = wrapped_engine(tmp_path)
    with engine.EnginePool(engine.EngineSettings(path=wrapper, max_retries=1), size=1, cache=False) as pool:
        with pytest.raises(engine.EngineFailedError, match="no answer within"):
            pool.analyse(chess.STARTING_FEN)
    assert len(pids.read_text().split()) == 2 and no_survivors(pids) == []  # one per engine started


# --- a huge --games ---------------------------------------------------------------------------

def test_a_huge_games_count_allocates_nothing_per_game_before_the_first_game(tmp_path, capsys, monkeypatch):
    def first_game_fails(index, cfg, pool):
        raise engine.EngineFailedError(f"game {index}: stopped by the test")

    monkeypatch.setattr(datagen, "play_game", first_game_fails)
    tracemalloc.start()
    try:
        rc = main(datagen_argv(tmp_path / "d", fake_engine(tmp_path, "never answers go"), "--games", "200000"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert rc == 1
    one_line(capsys.readouterr().err, "rookworld datagen", "stopped by the test")
    assert peak < 20 * 2**20, f"{peak / 2**20:.0f} MiB allocated before the first game"  # was ~1 KiB per game


# --- messages ---------------------------------------------------------------------------------

@pytest.mark.parametrize("setting, says", [(["--games", "0"], "games (--games) must be an integer >= 1, got 0"),
                                            (["--shard-size", "-1"], "shard_size (--shard-size) must be an integer >= 0, got -1"),
                                            (["--policy-rate", "2"], "policy_rate (--policy-rate) must be a finite number in [0, 1]"),
                                            (["--workers", "0"], "workers (--workers) must be an integer in 1..256, got 0")])
def test_a_bad_datagen_setting_ends_in_one_line_and_exit_1(tmp_path, capsys, setting, says):
    assert main(["datagen", "--out", str(tmp_path / "d"), *setting]) == 1
    assert one_line(capsys.readouterr().err, "rookworld datagen", says).startswith("rookworld datagen: error: ")
    assert not (tmp_path / "d").exists()  # nothing written


def test_a_command_line_argparse_cannot_parse_shows_the_usage_and_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["datagen", "--out", str(tmp_path / "d"), "--games", "many"])
    assert exc.value.code == 2
    assert "usage: rookworld datagen" in capsys.readouterr().err and not (tmp_path / "d").exists()


def test_an_unwritable_out_is_named_without_promising_a_resume(tmp_path, capsys, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere: refuse below ro as the kernel refuses another user
        real = os.mkdir

        def mkdir(path, *args, **kwargs):
            if str(path).startswith(f"{ro}{os.sep}"):
                raise PermissionError(13, os.strerror(13), str(path))
            return real(path, *args, **kwargs)

        monkeypatch.setattr(os, "mkdir", mkdir)
    assert main(datagen_argv(ro / "out", fake_engine(tmp_path, "never answers go"))) == 1
    line = one_line(capsys.readouterr().err, "rookworld datagen", f"Permission denied: {ro / 'out'}",
                    "choose a directory you can write to")
    assert "resume" not in line and "kept" not in line


def test_summary_of_a_missing_or_empty_directory_is_one_line_and_exit_1(tmp_path, capsys):
    assert main(["datagen", "--out", str(tmp_path / "nowhere"), "--summary"]) == 1
    one_line(capsys.readouterr().err, "rookworld datagen",
             f"error: no data files (*.jsonl, *.jsonl.gz) in {tmp_path / 'nowhere'} (no such directory)")
    assert main(["datagen", "--out", str(tmp_path), "--summary"]) == 1
    line = one_line(capsys.readouterr().err, "rookworld datagen", f"no data files (*.jsonl, *.jsonl.gz) in {tmp_path}")
    assert "no such directory" not in line


def test_convert_into_a_directory_another_run_writes_is_refused_in_one_line(tmp_path, capsys):
    from rookworld_lib.core.paths import run_lock

    lines = tmp_path / "rook_val.txt"
    lines.write_text("P: not an original line\n")
    with run_lock(tmp_path / "out"):  # as a datagen or convert run into that directory holds it
        assert main(["convert", str(lines), "--out", str(tmp_path / "out"), "--no-progress"]) == 1
    one_line(capsys.readouterr().err, "rookworld convert", f"{tmp_path / 'out'} is being written by another run "
             f"(pid {os.getpid()} since")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [".lock"]  # no errors file, no output


def test_fresh_keeps_the_lock_of_the_work_directory_it_empties(tmp_path):
    """--fresh empties the work directory it holds locked (an outside --work-dir is locked too): deleting
    the lock file with the rest let a second run take a new lock on it and write the same games."""
    from rookworld_lib.core.paths import LOCK_FILE, RunDirBusyError, run_lock

    work = tmp_path / "work"
    (work / "out").mkdir(parents=True)
    (work / "games.jsonl").write_text("{}\n")
    with run_lock(work):
        datagen._open_work_dir(work, {"config": {}, "engine": "x"}, True, tmp_path / "out")
        assert sorted(p.name for p in work.iterdir()) == sorted([LOCK_FILE, "config.json"])
        with pytest.raises(RunDirBusyError):
            with run_lock(work):
                pass


def test_an_illegal_bestmove_loses_the_session_instead_of_entering_the_game(tmp_path):
    """A well-formed but illegal bestmove (e2e4 with black to move, from test_faults' engine that plays illegal
    moves) is refused: the session is lost (the game is replayed on a fresh engine), and the move never reaches
    the board (python-chess's push does not check it)."""
    settings = EngineSettings(path=fake_engine(tmp_path, "plays illegal moves"))
    board = chess.Board()
    board.push_uci("e2e4")
    with datagen.LeanPool(settings, size=1) as pool:
        with pytest.raises(EngineSessionLost, match="illegal bestmove"):
            with pool.session() as s:
                s.play(board, chess.engine.Limit(nodes=1))


def test_labels_from_an_engine_that_answers_in_form_only_end_in_one_line_and_publish_nothing(tmp_path):
    """Random games (no engine moves), so only the P: labels meet the engine: an illegal PV move, a search
    without lines (bestmove 0000) or an info line without a score is an engine failure, retried and then
    said in one line; nothing is published (an illegal label used to go out with exit 0, a search without
    lines to drop every P: record, silently)."""
    kinds = ("plays illegal moves", "answers without lines", "answers without a score")
    jobs = ["from rookworld_lib.chess import engine\nengine.TIMEOUT_FLOOR_S = 0.5\nengine.SLOW_NODES_PER_S = 1e8\n"
            "from rookworld_lib.lab.cli import main\n"
            f"raise SystemExit(main({datagen_argv(tmp_path / str(i), fake_engine(tmp_path, k), '--random-share', '1', '--opening-share', '0', '--policy-rate', '1')!r}))"
            for i, k in enumerate(kinds)]
    for i, result in enumerate(run_driver(jobs, child_env())):
        assert_one_clear_message(result, "rookworld datagen", "Stockfish failed on every attempt while labelling")
        assert not [p for p in (tmp_path / str(i)).glob("*.jsonl*")], kinds[i]


def test_a_work_dir_that_would_take_what_must_stay_is_refused_before_anything_runs(tmp_path, capsys):
    """datagen deletes its work directory when it finishes (and empties it on --fresh): a --work-dir that is
    --out or a folder above it, or one holding files of its own, is refused in one line, and nothing in
    it is touched. A folder datagen made is removed as before, and only what datagen keeps in it."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine\n")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine\n")
    for work, why in ((out, "which is out_dir or a folder above it"), (tmp_path, "which is out_dir or a folder above it"),
                      (mine, "holds files that are not datagen's (notes.txt)")):
        for extra in ((), ("--fresh",)):
            assert main(datagen_argv(out, "/usr/games/stockfish", "--work-dir", str(work), *extra)) == 1
            one_line(capsys.readouterr().err, "rookworld datagen", f"--work-dir) {work}" if "holds" in why else
                     f"--work-dir) is {work}", why)
    assert (out / "notes.txt").read_text() == (mine / "notes.txt").read_text() == "mine\n"
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    # a left-over work directory of datagen's (its files and a lock) is no stranger: taken, then removed whole
    work = tmp_path / "work"
    work.mkdir()
    (work / ".lock").write_text("")
    (work / "games.jsonl").write_text("")
    datagen._remove_work(work, keep_lock=True)
    assert sorted(p.name for p in work.iterdir()) == [".lock"]
    (work / "config.json").write_text("{}")
    (work / "stray").write_text("not ours\n")  # appeared during a run: kept, with its folder
    datagen._remove_work(work, keep_lock=False)
    assert sorted(p.name for p in work.iterdir()) == ["stray"]


@needs_stockfish
def test_a_finished_run_deletes_a_work_dir_outside_out_lock_and_all(tmp_path):
    """--work-dir outside --out is locked while the run writes, and deleted, its lock file too, when the run
    finishes without keep_work (core.paths.run_lock never deletes its file); the data files are in --out.
    A tiny run: random games, no P: samples, so no search."""
    out, work = tmp_path / "out", tmp_path / "work"
    cfg = datagen.DatagenConfig(out_dir=str(out), work_dir=str(work), games=2, mate_games=0, random_share=1.0,
                                opening_share=0.0, policy_rate=0.0, env_rate=1.0, max_plies=10, workers=1)
    report = datagen.generate(cfg, progress=False)
    assert report.counts.get("env_train.jsonl") and (out / "env_train.jsonl").exists()
    assert not work.exists()


# --- a resumed run's work directory, a STOCKFISH_PATH that is no program ------------------------

def test_a_corrupt_work_file_of_a_resumed_run_is_refused_in_one_line_naming_it(tmp_path, capsys, fast_timeouts):
    """An interrupted run's work directory whose config.json was torn (a disk filled, a kill mid-copy):
    the resumed run stops in one line that names that file and the two ways out, before it plays a
    game, and leaves the file as it found it (it may be the only record of the run's settings)."""
    out = tmp_path / "d"
    work = out / ".datagen-work"  # datagen's default work directory: <out>/.datagen-work
    work.mkdir(parents=True)
    for torn in ('{"config": {"games": 2, "mate_games": 0, "ran', "[]"):  # cut short; valid JSON but no record
        (work / "config.json").write_text(torn)
        assert main(datagen_argv(out, fake_engine(tmp_path, "never answers go"))) == 1
        line = one_line(capsys.readouterr().err, "rookworld datagen",
                        f"corrupt work file: {work / 'config.json'}; delete {work} or rerun with --fresh")
        assert line.startswith("rookworld datagen: error: ")
        assert (work / "config.json").read_text() == torn
        assert sorted(p.name for p in work.iterdir()) == ["config.json"]  # no games.jsonl: nothing was played
        assert not [p for p in out.iterdir() if p.suffix in (".jsonl", ".gz")]  # nor any data file written


def not_a_program(tmp_path: Path) -> str:
    """An executable file that is not a program: text with the x bit and no #! line, as a STOCKFISH_PATH
    set to a downloaded README, an HTML error page or a script without its shebang would be."""
    path = tmp_path / "stockfish"
    path.write_text("Stockfish 17 - see https://stockfishchess.org for the binary\n")
    path.chmod(0o755)
    return str(path)


def test_a_stockfish_path_that_is_not_a_program_ends_datagen_in_one_line_and_starts_nothing(tmp_path, capsys,
                                                                                            monkeypatch):
    import psutil

    path = not_a_program(tmp_path)
    monkeypatch.setenv("STOCKFISH_PATH", path)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    out = tmp_path / "d"
    assert main(["datagen", "--out", str(out), *DATAGEN_ARGS]) == 1  # no --stockfish: STOCKFISH_PATH's
    # execve's ENOEXEC, in the kernel's words: the file is there and executable, the kernel cannot run it
    line = one_line(capsys.readouterr().err, "rookworld datagen",
                    f"cannot start Stockfish at {path!r} (Exec format error). ", "set STOCKFISH_PATH to the binary")
    assert line.startswith("rookworld datagen: error: cannot start Stockfish")
    assert {p.pid for p in psutil.Process().children(recursive=True)} == before  # no engine process left
    assert not out.exists()  # the engine is started first: a run that cannot start one writes nothing


def test_the_python_chess_pool_refuses_a_stockfish_path_that_is_not_a_program_at_once(tmp_path, monkeypatch):
    """The pool behind the rewards, eval and the explorers: no retry can make a text file run, so the
    first failed start is a StockfishNotFoundError naming the file, not EngineFailedError after retries."""
    path = not_a_program(tmp_path)
    monkeypatch.setenv("STOCKFISH_PATH", path)
    board = chess.Board()
    with engine.EnginePool(engine.EngineSettings(max_retries=3), size=1, cache=False) as pool:
        assert pool.path == path
        with pytest.raises(engine.StockfishNotFoundError) as info:
            pool.analyse(board.fen())
        assert pool.restarts == 0 and pool._engines == []
    assert str(info.value).startswith(f"cannot start Stockfish at {path!r} (Exec format error). ")  # the path once
    assert "failed to start" not in str(info.value)
