"""Faults a user can cause on the data side end in one line naming what and where, never a traceback:
empty and non-UTF-8 data files, a broken engine or Ctrl-C during `rookworld datagen` (whose finished
work survives for the next run)."""

import gzip
import json
import os
import signal
import stat
import sys

import chess.engine
import pytest
from forked_child import ForkedChild, cli_main
from helpers_chess import needs_stockfish, shipped
from test_data import wait_until_labelled

from rookworld_lib.chess import convert, data, datagen, engine
from rookworld_lib.core import paths
from rookworld_lib.lab.cli import main

pytestmark = pytest.mark.fault


def one_line(err: str, prog: str, *needles: str) -> str:
    """The single `prog:` line of `err` (no traceback), holding every needle."""
    assert "Traceback" not in err, err[-2000:]
    lines = [x for x in err.splitlines() if x.startswith(f"{prog}:")]
    assert len(lines) == 1, err[-2000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def run_cli(capsys, *argv) -> tuple[int, str]:
    """`rookworld <argv>` in this process: (exit status, stderr)."""
    rc = main(list(argv))
    return rc, capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# Empty and non-UTF-8 files
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("content", [b"", b"\n\n  \n"], ids=["empty", "blank lines"])
def test_an_empty_data_file_is_an_error_naming_it(tmp_path, capsys, content):
    path = tmp_path / "policy_val.jsonl"
    path.write_bytes(content)
    with pytest.raises(data.DataFormatError, match=f"^{path}: no records"):
        data.load_jsonl(path)
    with pytest.raises(data.DataFormatError, match=f"^{path}: no records"):
        data.load_jsonl(path, on_error="skip")
    rc, err = run_cli(capsys, "datagen", "--validate", str(path))
    assert rc == 1 and "records OK" not in err
    assert f"{path}: no records" in err and "Traceback" not in err
    rc, err = run_cli(capsys, "datagen", "--out", str(tmp_path), "--validate")  # every file of --out
    assert rc == 1 and f"{path}: no records" in err
    rc, err = run_cli(capsys, "datagen", "--out", str(tmp_path), "--summary")
    assert rc == 1
    one_line(err, "rookworld datagen", f"{path}: no records")


def test_validate_without_files_is_an_error(tmp_path, capsys):
    rc, err = run_cli(capsys, "datagen", "--out", str(tmp_path), "--validate")
    assert rc == 1
    one_line(err, "rookworld datagen", "no data files", str(tmp_path))


def test_grpo_names_an_empty_policy_file(tmp_path, capsys):
    import torch

    from rookworld_lib.core.model import GPT, GPTConfig

    torch.manual_seed(0)
    GPT(GPTConfig.preset("tiny", n_layer=1, n_embd=32, n_head=2, block_size=128)).save_pretrained(tmp_path / "hf")
    (tmp_path / "policy_train.jsonl").write_text("")
    (tmp_path / "env_train.jsonl").write_text(json.dumps(shipped("A", "train")[0]) + "\n")
    rc, err = run_cli(capsys, "grpo", "--init-from", str(tmp_path / "hf"), "--data-dir", str(tmp_path),
                      "--out", str(tmp_path / "grpo"), "--steps", "1", "--no-progress", "--device", "cpu")
    assert rc == 1
    one_line(err, "rookworld grpo", f"{tmp_path / 'policy_train.jsonl'}: no records")


def _text_file_with_a_latin1_line(tmp_path):
    path = tmp_path / "texts.jsonl"
    good = json.dumps({"text": shipped("P", "val")[0]["prompt"]}).encode()
    path.write_bytes(good + b"\n" + b'{"text": "P: caf\xe9"}\n' + good + b"\n")
    return path


def test_a_non_utf8_line_of_a_text_file_is_named_by_file_and_line(tmp_path):
    path = _text_file_with_a_latin1_line(tmp_path)
    with pytest.raises(data.DataFormatError, match=f"^{path}:2: not UTF-8"):
        list(paths.json_lines(path))
    skipped = data.load_jsonl(path, on_error="skip").skipped  # text lines are not records, but line 2 is not UTF-8
    assert str(skipped[1]).startswith(f"{path}:2: not UTF-8")
    report = convert.convert([path], tmp_path / "out")
    assert [e for e in report.first_errors if e.startswith(f"{path}:2: ")] == [f"{path}:2: not UTF-8 (invalid "
                                                                                f"continuation byte at byte 16)"]
    with pytest.raises(data.DataFormatError, match="cannot read"):
        list(paths.json_lines(tmp_path / "missing.jsonl"))


def test_a_json_line_nested_too_deeply_to_read_is_named_by_file_and_line(tmp_path):
    """json's decoder recurses per level: 200,000 brackets raised RecursionError, a traceback in sft, eval
    and convert; it is a bad line like any other, and the lines around it are read."""
    from rookworld_lib.core.paths import read_jsonl
    path = tmp_path / "deep.jsonl"
    path.write_text('{"text": "P: a"}\n' + "[" * 200_000 + "\n" + '{"text": "P: b"}\n')
    assert list(read_jsonl(path)) == [(1, {"text": "P: a"}, None), (2, None, "invalid JSON (nested too deeply to read)"),
                                      (3, {"text": "P: b"}, None)]


def test_sft_names_the_non_utf8_line_of_a_text_file(tmp_path, capsys):
    path = _text_file_with_a_latin1_line(tmp_path)
    rc, err = run_cli(capsys, "sft", "--train-data", str(path), "--model", "tiny", "--max-steps", "1", "--warmup-steps", "0",
                      "--out", str(tmp_path / "sft"), "--no-progress", "--device", "cpu")
    assert rc == 1
    one_line(err, "rookworld sft", f"{path}:2: not UTF-8")


# --------------------------------------------------------------------------------------------
# A broken engine, Ctrl-C
# --------------------------------------------------------------------------------------------

DATAGEN = ["datagen", "--no-progress", "--games", "3", "--mate-games", "1", "--depth", "4", "--max-plies", "40",
           "--workers", "2"]


def failing_generate(exc: BaseException, games: bool = True):
    """A datagen.generate that raises `exc`, after leaving what a run that played some games leaves
    (its work directory's games file) unless `games` is False."""
    def generate(cfg, **kw):
        if games:
            cfg.work_path().mkdir(parents=True, exist_ok=True)
            (cfg.work_path() / "games.jsonl").write_text("")
        raise exc
    return generate


@pytest.mark.parametrize("exc", [
    engine.EngineFailedError("Stockfish failed on every attempt during analyse: EngineTerminatedError: gone"),
    chess.engine.EngineTerminatedError("engine process died unexpectedly (exit code: -9)"),
    TimeoutError("no answer in 30 s"),
], ids=lambda e: type(e).__name__)
def test_an_engine_failure_ends_datagen_in_one_line(tmp_path, capsys, monkeypatch, exc):
    monkeypatch.setattr(datagen, "generate", failing_generate(exc))
    rc, err = run_cli(capsys, *DATAGEN, "--out", str(tmp_path))
    assert rc == 1
    one_line(err, "rookworld datagen", "Stockfish failed", type(exc).__name__, str(exc),
             str(tmp_path / ".datagen-work"), "run the same command again")


def test_ctrl_c_ends_datagen_with_130_in_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(datagen, "generate", failing_generate(KeyboardInterrupt()))
    rc, err = run_cli(capsys, *DATAGEN, "--out", str(tmp_path))
    assert rc == 130
    one_line(err, "rookworld datagen", "interrupted", "run the same command again")
    monkeypatch.setattr(datagen, "generate", failing_generate(KeyboardInterrupt(), games=False))  # before any game
    rc, err = run_cli(capsys, *DATAGEN, "--out", str(tmp_path / "new"))
    assert rc == 130
    one_line(err, "rookworld datagen", "interrupted; no game was finished: nothing to resume")


FAKE_ENGINE = """\
#!{python}
# A UCI engine that starts and handshakes normally, then dies at its first search.
import sys
for line in sys.stdin:
    cmd = line.split()[:1]
    if cmd == ["uci"]:
        print("id name Fake 1\\noption name Threads type spin default 1 min 1 max 64\\n"
              "option name Hash type spin default 16 min 1 max 1024\\nuciok", flush=True)
    elif cmd == ["isready"]:
        print("readyok", flush=True)
    elif cmd in (["go"], ["quit"]):
        sys.exit(3)
"""


def test_an_engine_that_dies_at_its_first_search_ends_datagen_in_one_line(tmp_path):
    fake = tmp_path / "fake-stockfish"
    fake.write_text(FAKE_ENGINE.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "out"
    argv = [*DATAGEN, "--out", str(out), "--stockfish", str(fake), "--random-share", "0",
            "--opening-share", "0"]  # every game needs the engine
    proc = ForkedChild(cli_main, argv)  # `rookworld datagen ...` in a process of its own (forked_child.py)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr[-2000:]
    one_line(stderr, "rookworld datagen", "Stockfish failed", "EngineFailedError", f"Stockfish ({fake}) ended without",
             str(out / ".datagen-work"))  # the program that failed is named: STOCKFISH_PATH may name another
    assert (out / ".datagen-work" / "config.json").exists() and not list(out.glob("*.jsonl"))


@needs_stockfish
def test_an_engine_failure_mid_labelling_keeps_every_finished_label(tmp_path, monkeypatch, capsys):
    real, calls = datagen.UciAnalyser.analyse, []  # what datagen labels with (datagen.LeanPool.label_many)

    def dies_after_five(self, *args, **kwargs):
        calls.append(1)
        if len(calls) > 5:
            raise engine.EngineFailedError("Stockfish failed on every attempt during analyse: test")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(datagen.UciAnalyser, "analyse", dies_after_five)
    rc, err = run_cli(capsys, *DATAGEN, "--out", str(tmp_path))
    assert rc == 1
    one_line(err, "rookworld datagen", "Stockfish failed")
    work = tmp_path / ".datagen-work"
    kept = len((work / "labels.jsonl").read_text().splitlines())
    assert kept >= 1 and (work / "games.jsonl").exists() and not list(tmp_path.glob("*.jsonl"))
    monkeypatch.setattr(datagen.UciAnalyser, "analyse", real)
    assert main([*DATAGEN, "--out", str(tmp_path)]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["games_played"] == 0 and summary["labels_reused"] == kept


@needs_stockfish
def test_sigint_during_datagen_exits_130_in_one_line_and_resumes(tmp_path):
    argv = [*DATAGEN, "--out", str(tmp_path)]
    labels = tmp_path / ".datagen-work" / "labels.jsonl"
    # `rookworld datagen ...` in a process of its own, where Ctrl-C raises KeyboardInterrupt (forked_child.py)
    proc = wait_until_labelled(ForkedChild(cli_main, argv), labels, 3)
    os.kill(proc.pid, signal.SIGINT)  # as the user's Ctrl-C reaches datagen
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    one_line(err, "rookworld datagen", "interrupted", "run the same command again")
    kept = len(labels.read_bytes().splitlines())
    again = ForkedChild(cli_main, argv)  # the same command again
    again_out, again_err = again.communicate(timeout=300)
    assert again.returncode == 0, again_err[-2000:]
    summary = json.loads(again_out)
    assert summary["games_played"] == 0 and summary["labels_reused"] >= kept - 1  # at most a torn line redone


def test_a_split_in_two_layouts_is_refused_not_read_twice(tmp_path, capsys):
    """policy_test.jsonl beside its .gz copy (or beside shards) would be read twice: every position
    counted twice in eval, its intervals too narrow. It is one line naming both files."""
    import gzip
    import shutil

    shutil.copy(data.data_file("P", "test"), tmp_path / "policy_test.jsonl")
    (tmp_path / "policy_test.jsonl.gz").write_bytes(gzip.compress((tmp_path / "policy_test.jsonl").read_bytes()))
    with pytest.raises(data.DataFormatError, match=r"policy_test.jsonl, policy_test.jsonl.gz hold the same split in 2 layouts"):
        data.load_split("P", "test", tmp_path)
    (tmp_path / "policy_test.jsonl.gz").unlink()
    shutil.copy(tmp_path / "policy_test.jsonl", tmp_path / "policy_test-00000.jsonl")
    with pytest.raises(data.DataFormatError, match="policy_test.jsonl, policy_test-00000.jsonl hold the same split"):
        data.split_files("P", "test", tmp_path)
    (tmp_path / "policy_test.jsonl").unlink()
    assert len(data.load_split("P", "test", tmp_path).records) == len(data.load_split("P", "test").records)
    rc, err = run_cli(capsys, "datagen", "--out", str(tmp_path), "--validate")
    assert rc == 0, err


@needs_stockfish
def test_datagen_and_convert_refuse_to_replace_a_data_set_already_in_out(tmp_path, capsys):
    """A finished data set (here the shipped one) in --out is never replaced silently: datagen and
    convert stop in one line before writing, and every file is as it was; datagen --fresh replaces."""
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(data.data_file("P", "test").parent, out, ignore=shutil.ignore_patterns("gpt2.tiktoken"))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    rc, err = run_cli(capsys, *DATAGEN, "--out", str(out))
    assert rc == 1
    one_line(err, "rookworld datagen", f"{out} already holds a data set (policy_train.jsonl", "pass --fresh to replace them")
    original = tmp_path / "rook.txt"
    original.write_text("P: " + " " * 10 + "\n")
    rc, err = run_cli(capsys, "convert", str(original), "--out", str(out), "--split", "test", "--workers", "1")
    assert rc == 1
    one_line(err, "rookworld convert", f"{out} already holds policy_test.jsonl, env_test.jsonl: converting would replace them")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != ".lock"} == before  # the lock: held while refusing
    # a data set datagen made: the same settings again redo it (notebook 05 run again in its run folder); others stop
    mine = tmp_path / "mine"
    assert run_cli(capsys, *DATAGEN, "--out", str(mine))[0] == 0
    made = {p.name: p.read_bytes() for p in mine.glob("*.jsonl")}
    assert run_cli(capsys, *DATAGEN, "--out", str(mine))[0] == 0
    assert {p.name: p.read_bytes() for p in mine.glob("*.jsonl")} == made
    rc, err = run_cli(capsys, *DATAGEN[:-2], "--workers", "1", "--depth", "3", "--out", str(mine))
    assert rc == 1 and "that no run of these settings made" in err
    # a --work-dir left by a run into another --out (interrupted, or kept) resumes nothing here: the data set
    # in this --out is still refused, not replaced
    work = tmp_path / "work"
    assert run_cli(capsys, *DATAGEN, "--out", str(tmp_path / "first"), "--work-dir", str(work), "--keep-work")[0] == 0
    rc, err = run_cli(capsys, *DATAGEN, "--out", str(out), "--work-dir", str(work))
    assert rc == 1 and f"{out} already holds a data set" in err
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.name != ".lock"} == before


def test_validate_names_a_directory_given_as_a_file_and_a_file_given_as_out(tmp_path, capsys):
    rc, err = run_cli(capsys, "datagen", "--validate", str(tmp_path))
    assert rc == 1
    one_line(err, "rookworld datagen", f"{tmp_path} is a directory; give the files in it", f"--validate --out {tmp_path}")
    (tmp_path / "p.jsonl").write_text("")
    rc, err = run_cli(capsys, "datagen", "--summary", "--out", str(tmp_path / "p.jsonl"))
    assert rc == 1
    one_line(err, "rookworld datagen", f"in {tmp_path / 'p.jsonl'} (a file, not a directory)")


def test_validate_holds_a_named_file_to_its_task_and_split(tmp_path, capsys):
    """A file named as datagen names them holds that task's records of that split, as every reader
    requires (sft, eval and grpo refuse the others): --validate said "records OK" for A: records in a
    policy file and test records in a val file. A file of another name is checked record by record only."""
    lines = {name: (data.DATA_DIR / name).read_text().splitlines(keepends=True)[:2]
             for name in ("env_train.jsonl", "policy_test.jsonl", "policy_train.jsonl")}
    (tmp_path / "policy_train.jsonl").write_text("".join(lines["env_train.jsonl"]))
    (tmp_path / "policy_val-00000.jsonl.gz").write_bytes(gzip.compress("".join(lines["policy_test.jsonl"]).encode()))
    (tmp_path / "mine.jsonl").write_text("".join(lines["policy_train.jsonl"] + lines["env_train.jsonl"]))
    rc, err = run_cli(capsys, "datagen", "--validate", *(str(tmp_path / n) for n in
                                                          ("policy_train.jsonl", "policy_val-00000.jsonl.gz", "mine.jsonl")))
    first = json.loads(lines["policy_test.jsonl"][0])["id"]
    assert rc == 1 and err.splitlines() == [
        f"rookworld datagen: error: {tmp_path}/policy_train.jsonl:1: expected a 'P' record, got task 'A'",
        f"rookworld datagen: error: {tmp_path}/policy_val-00000.jsonl.gz: record {first!r} is a 'test' record in the val "
        "split's file: a split's files hold its records alone (datagen writes them so; `rookworld convert --split val` "
        "for converted data)"]
    assert main(["datagen", "--validate", str(tmp_path / "mine.jsonl")]) == 0
    assert capsys.readouterr().out == f"{tmp_path}/mine.jsonl: 4 records OK\n"
    assert [data.role_of(n) for n in ("env_test.jsonl.gz", "policy_train-00012.jsonl", "mate_in_one.jsonl",
                                      "policy_train-1.jsonl", "policy_trains.jsonl")] == [
        ("A", "test"), ("P", "train"), ("M1", None), None, None]


@pytest.mark.parametrize("argv", [["datagen", "--out", ""], ["datagen", "--validate", ""], ["datagen", "--exclude-dir", ""],
                                  ["datagen", "--work-dir", ""], ["datagen", "--stockfish", " "],
                                  ["convert", "x.txt", "--out", ""], ["convert", "", "--out", "x"]])
def test_an_empty_path_is_a_usage_error_naming_its_option(argv, capsys, tmp_path, monkeypatch):
    """Path("") is the current folder: `datagen --out ''` wrote a data set there (checked against data/'s
    files), `--exclude-dir ''` excluded nothing, `--summary --out ''` summarised the shipped set."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:  # argparse's usage error
        main(argv)
    assert stop.value.code == 2
    name = argv[-2] if not argv[-1].strip() else "FILE"
    assert capsys.readouterr().err.splitlines()[-1] == \
        f"rookworld {argv[0]}: error: argument {name}: an empty path names no file or folder"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv, ignored", [
    (["--validate", "--games", "5", "--fresh"], "--games, --fresh"),
    (["--summary", "--depth", "3", "--compress"], "--compress, --depth"),
    (["--validate", "--summary"], "--summary"),
    (["--summary", "--workers", "1", "--stockfish", "sf"], "--stockfish, --workers")])
def test_validate_and_summary_refuse_the_generation_settings_they_would_ignore(argv, ignored, capsys, tmp_path,
                                                                              monkeypatch):
    """`datagen --validate --games 5 --fresh` validated the shipped files and dropped both settings without
    a word: --validate and --summary read files, so a generation setting beside them is refused."""
    monkeypatch.chdir(tmp_path)
    assert main(["datagen", *argv]) == 1  # one line, as a config check (argparse's usage text and exit 2 before)
    mode = argv[0]
    assert capsys.readouterr().err.splitlines() == [
        f"rookworld datagen: error: {mode} reads the data files in --out and generates nothing: {ignored} "
        "would be ignored; leave them out"]
    assert list(tmp_path.iterdir()) == []
    assert main(["datagen", "--summary", "--no-progress", "--out", str(paths.DATA_DIR)]) == 0  # what reading takes


@needs_stockfish
def test_the_same_datagen_again_keeps_a_split_another_tool_added_to_its_out(tmp_path, capsys):
    """`datagen` (train only), then `convert --split val` into the same --out, then the same datagen
    command: the data set was made again, as if changed (every data file in --out was in its digest), and
    the converted policy_val.jsonl deleted without a word. Datagen now keeps its own data set and
    replaces only its own files; the split it did not make stays, whatever happens."""
    mix = tmp_path / "mix"
    argv = (*DATAGEN[:3], "5", "--test-games", "0", "--mate-games", "0", "--depth", "4", "--max-plies", "40",
            "--workers", "1", "--out", str(mix))
    assert run_cli(capsys, *argv)[0] == 0 and not (mix / "policy_val.jsonl").exists()
    capsys.readouterr()
    converted = "".join(json.dumps(r) + "\n" for r in shipped("P", "val")[:5])  # what convert --split val writes
    (mix / "policy_val.jsonl").write_text(converted)
    rc, err = run_cli(capsys, *argv)
    assert rc == 0 and "its files unchanged: kept" in err
    assert (mix / "policy_val.jsonl").read_text() == converted
    train = mix / "policy_train.jsonl"
    made = train.read_bytes()
    train.write_bytes(made[: made.index(b"\n") + 1])  # a record deleted by hand: made again
    rc, err = run_cli(capsys, *argv)
    assert rc == 0 and "kept" not in err and train.read_bytes() == made
    assert (mix / "policy_val.jsonl").read_text() == converted


@pytest.mark.parametrize("extra, message", [
    (("--policy-rate", "0", "--multipv", "3"), "DatagenConfig.multipv (--multipv) has no effect at policy_rate=0 "
     "(no P: records to label): set policy_rate > 0, or leave multipv at its default (5), got 3"),
    (("--policy-rate", "0", "--nodes", "300"), "DatagenConfig.nodes (--nodes) has no effect at policy_rate=0"),
    (("--policy-rate", "0", "--depth", "3"), "DatagenConfig.depth (--depth) has no effect at policy_rate=0"),
    (("--exclude-dir", "{out}"), "DatagenConfig.exclude_dir (--exclude-dir) is out_dir or lies inside it: its held-out "
     "positions would be those of the data set this run replaces; give another data set's folder"),
    (("--validate", "{out}/x.jsonl"), "--validate reads the data files in --out and generates nothing: --out would be "
     "ignored; leave them out")])
def test_datagen_refuses_a_setting_another_makes_void_and_an_exclude_dir_that_is_its_out(extra, message, tmp_path, capsys):
    """At --policy-rate 0 no P: record is labelled, so --multipv, --nodes and --depth changed nothing (and
    still made the data set another); --exclude-dir at --out excluded the held-out positions of the set being
    replaced, so the same command was refused next time; --validate FILE dropped --out without a word."""
    out = tmp_path / "d"
    rc, err = run_cli(capsys, "datagen", "--no-progress", "--out", str(out), *(a.format(out=out) for a in extra))
    assert rc == 1
    one_line(err, "rookworld datagen", message)
    assert not out.exists()


def test_validate_and_summary_take_a_setting_at_the_value_a_run_would_use(capsys):
    """A value equal to the default passes (the README's rule): --depth 8 and --workers <the cores> were refused
    beside --summary where --games 320 passed, since their command-line default is "none given"."""
    from rookworld_lib.chess.engine import MAX_WORKERS, usable_cores

    for extra in (("--depth", "8"), ("--workers", str(min(usable_cores(), MAX_WORKERS))), ("--games", "320")):
        assert main(["datagen", "--summary", "--out", str(paths.DATA_DIR), *extra]) == 0, extra
    capsys.readouterr()


@needs_stockfish
def test_a_full_disk_during_datagen_names_the_file_it_was_writing(tmp_path, capsys, monkeypatch):
    import errno

    def full(f, recs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(datagen._Outputs, "_write", staticmethod(full))
    rc, err = run_cli(capsys, *DATAGEN, "--out", str(tmp_path / "d"))
    assert rc == 1
    one_line(err, "rookworld datagen", f"No space left on device: {tmp_path / 'd' / '.datagen-work'}", ".jsonl",
             "free some space")


def test_keep_aside_never_replaces_an_earlier_kept_file(tmp_path):
    f = tmp_path / "metrics.jsonl"
    kept = []
    for n in range(3):  # three earlier runs' files with the same mtime (one second): three distinct names
        f.write_text(f"run {n}\n")
        os.utime(f, (1_700_000_000, 1_700_000_000))
        kept.append(paths.keep_aside(f))
        assert not f.exists()
    assert len(set(kept)) == 3
    assert [k.read_text() for k in kept] == ["run 0\n", "run 1\n", "run 2\n"]  # every earlier run's records survive


def test_a_byte_order_mark_at_the_start_of_a_jsonl_file_is_no_data(tmp_path):
    f = tmp_path / "win.jsonl"
    f.write_bytes(b'\xef\xbb\xbf{"a": 1}\n{"b": 2}\n')
    assert list(paths.read_jsonl(f)) == [(1, {"a": 1}, None), (2, {"b": 2}, None)]
    assert [v for _, v in paths.json_lines(f)] == [{"a": 1}, {"b": 2}]
    assert next(paths.decoded_lines(f))[1] == '{"a": 1}\n'


def test_a_cut_off_gzip_jsonl_is_one_data_format_error_naming_the_file(tmp_path):
    whole = gzip.compress(b"".join(b'{"text": "line %d"}\n' % i for i in range(2000)))
    cut = tmp_path / "train.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])  # a download cut off half way
    with pytest.raises(paths.DataFormatError, match="train.jsonl.gz: cannot read"):
        list(paths.json_lines(cut))
