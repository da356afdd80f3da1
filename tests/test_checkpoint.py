import errno
import json
import os
import signal
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rookworld_lib.core import checkpoint as ck
from rookworld_lib.core.model import GPT, GPTConfig
from rookworld_lib.core.train_utils import WarmupCosineSchedule, build_adamw

EXPORT_FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


def small_model(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig.preset("tiny", n_layer=1, n_embd=16, n_head=2, block_size=16))


class Position:
    """A stand-in data stream: anything with state_dict/load_state_dict."""

    def __init__(self, i=0):
        self.i = i

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, s):
        self.i = s["i"]


def trained_state(step=1, seed=0):
    model = small_model(seed)
    opt = build_adamw(model, lr=1e-2, weight_decay=0.1, device_type="cpu")
    x = torch.randint(0, 50257, (2, 8))
    model(x).float().logsumexp(-1).mean().backward()
    opt.step()
    sched = WarmupCosineSchedule(1e-2, 1e-3, 2, 10)
    return model, opt, sched, ck.training_state(step=step, model=model, optimizer=opt, scheduler=sched,
                                                data=Position(7), config={"lr": 1e-2}, extra={"guard": {"n": 1}})


def test_round_trip_restores_everything(tmp_path, caplog):
    import random

    import numpy as np

    model, opt, sched, state = trained_state(step=3)
    # what this process draws from each global RNG right after the state was captured
    expected_draw, expected_py, expected_np = torch.rand(4), random.random(), np.random.rand()
    path = ck.save_checkpoint(tmp_path, state)
    assert path.name == "step_00000003.pt"
    pointer = json.loads((tmp_path / "latest").read_text())
    assert pointer == {"file": path.name, "step": 3, "bytes": path.stat().st_size, "sha256": ck.file_sha256(path)}
    loaded = ck.load_checkpoint(tmp_path)  # a directory resolves to its latest checkpoint
    assert loaded["kind"] == "sft" and loaded["config"] == {"lr": 1e-2} and loaded["extra"]["guard"] == {"n": 1}

    fresh, data = small_model(seed=1), Position()
    fresh_opt = build_adamw(fresh, lr=1e-2, weight_decay=0.1, device_type="cpu")
    torch.manual_seed(12345)  # anything: the checkpoint's RNG states must win
    random.seed(12345)
    np.random.seed(12345)
    other = WarmupCosineSchedule(2e-2, 1e-3, 2, 10)  # the schedule is the run's settings: a change is said
    step = ck.restore_training_state(loaded, model=fresh, optimizer=fresh_opt, scheduler=other, data=data)
    assert step == 3 and data.i == 7
    assert torch.equal(torch.rand(4), expected_draw) and random.random() == expected_py and np.random.rand() == expected_np
    assert "LR schedule changed since the checkpoint: lr 0.01 -> 0.02" in caplog.text
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name
    sa, sb = opt.state_dict()["state"], fresh_opt.state_dict()["state"]
    assert sa.keys() == sb.keys()
    assert all(torch.equal(sa[k][n], sb[k][n]) for k in sa for n in ("exp_avg", "exp_avg_sq", "step"))


def test_restore_refuses_a_checkpoint_without_the_state_asked_for(tmp_path):
    model = small_model()
    state = ck.training_state(step=1, model=model)
    with pytest.raises(ck.CheckpointLoadError, match="no optimizer state"):
        ck.restore_training_state(state, model=model, optimizer=build_adamw(model, lr=1.0, weight_decay=0.0))


def test_keep_last_prunes_older_checkpoints_after_the_new_one_is_in_place(tmp_path):
    *_, state = trained_state()
    for step in (1, 2, 3, 4):
        ck.save_checkpoint(tmp_path, {**state, "step": step}, keep_last=2)
    assert [s for s, _ in ck.list_checkpoints(tmp_path)] == [3, 4]
    assert ck.latest_checkpoint(tmp_path).name == "step_00000004.pt"
    ck.save_checkpoint(tmp_path, {**state, "step": 5}, keep_last=0)
    assert [s for s, _ in ck.list_checkpoints(tmp_path)] == [3, 4, 5]


def test_stray_entries_named_like_checkpoints_neither_count_towards_keep_last_nor_stand_for_the_latest(tmp_path):
    """A folder named step_00000099.pt was taken as a checkpoint (and, without the pointer, as the run's
    checkpoint folder); a stray file named past the run's steps counted towards keep_last, so one real
    checkpoint fewer was kept, and was never pruned."""
    *_, state = trained_state()
    (tmp_path / "step_00000099.pt").mkdir()
    (tmp_path / "step_00000098.pt").write_bytes(b"")
    for step in (1, 2, 3, 4):
        ck.save_checkpoint(tmp_path, {**state, "step": step}, keep_last=2)
    assert [s for s, _ in ck.list_checkpoints(tmp_path)] == [3, 4, 98]  # two real ones kept; the folder is none
    assert (tmp_path / "step_00000099.pt").is_dir() and (tmp_path / "step_00000098.pt").exists()
    (tmp_path / "step_00000098.pt").unlink()
    (tmp_path / ck.POINTER).unlink()
    assert ck.load_checkpoint(tmp_path)["step"] == 4  # the newest checkpoint file, not the folder


def test_latest_without_pointer_falls_back_to_the_highest_step(tmp_path):
    *_, state = trained_state()
    ck.save_checkpoint(tmp_path, {**state, "step": 2})
    ck.save_checkpoint(tmp_path, {**state, "step": 10})
    (tmp_path / "latest").unlink()
    assert ck.latest_checkpoint(tmp_path).name == "step_00000010.pt"
    assert ck.latest_checkpoint(tmp_path / "nowhere") is None


def _partial_then(exc):
    def fake_save(obj, f, *args, **kwargs):
        f.write(b"PK\x03\x04 half a checkpoint")
        raise exc
    return fake_save


def assert_previous_intact(directory, step):
    latest = ck.latest_checkpoint(directory)
    assert latest.name == f"step_{step:08d}.pt"
    assert ck.load_checkpoint(directory)["step"] == step
    assert not [p for p in os.listdir(directory) if p.startswith(".tmp-")]


def test_disk_full_during_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    *_, state = trained_state()
    first = ck.save_checkpoint(tmp_path, {**state, "step": 1})
    monkeypatch.setattr(ck.torch, "save", _partial_then(OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))))
    with pytest.raises(ck.CheckpointSaveError) as info:
        ck.save_checkpoint(tmp_path, {**state, "step": 2})
    msg = str(info.value)
    assert "step_00000002.pt" in msg and "No space left on device" in msg
    assert f"previous checkpoint {first} is intact" in msg
    assert isinstance(info.value, OSError)  # callers catching OSError see it too
    assert not (tmp_path / "step_00000002.pt").exists()
    assert_previous_intact(tmp_path, 1)


def test_disk_full_at_fsync_or_pointer_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    *_, state = trained_state()
    ck.save_checkpoint(tmp_path, {**state, "step": 1})

    def failing_fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ck.os, "fsync", failing_fsync)
    with pytest.raises(ck.CheckpointSaveError, match="No space left"):
        ck.save_checkpoint(tmp_path, {**state, "step": 2})
    monkeypatch.undo()
    assert_previous_intact(tmp_path, 1)

    # the checkpoint file lands, then the pointer write fails: the pointer still names step 1
    real = ck.atomic_write

    def pointer_fails(path, write):
        if os.path.basename(path) == ck.POINTER:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, write)

    monkeypatch.setattr(ck, "atomic_write", pointer_fails)
    with pytest.raises(ck.CheckpointSaveError, match="intact"):
        ck.save_checkpoint(tmp_path, {**state, "step": 3})
    monkeypatch.undo()
    assert_previous_intact(tmp_path, 1)


def test_first_save_failing_says_there_is_no_earlier_checkpoint(tmp_path, monkeypatch):
    *_, state = trained_state()
    monkeypatch.setattr(ck.torch, "save", _partial_then(OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(ck.CheckpointSaveError, match="no earlier checkpoint"):
        ck.save_checkpoint(tmp_path, state)
    assert os.listdir(tmp_path) == []


def test_corrupt_and_partial_checkpoints_give_a_clear_error_naming_the_file(tmp_path):
    *_, state = trained_state()
    path = ck.save_checkpoint(tmp_path, {**state, "step": 1})
    good = path.read_bytes()

    path.write_bytes(good[: len(good) // 2])  # truncated behind our back: the pointer's size disagrees
    with pytest.raises(ck.CheckpointLoadError, match=r"step_00000001\.pt: .*bytes on disk.*truncated"):
        ck.load_checkpoint(tmp_path)
    with pytest.raises(ck.CheckpointLoadError, match=r"step_00000001\.pt: its bytes changed since it was saved"):
        ck.load_checkpoint(path)  # the file itself, without the pointer's size: its .sha256 disagrees
    (tmp_path / "step_00000001.pt.sha256").unlink()  # an older checkpoint: no digest beside it or in latest
    pointer = json.loads((tmp_path / "latest").read_text())
    (tmp_path / "latest").write_text(json.dumps({k: v for k, v in pointer.items() if k != "sha256"}))
    with pytest.raises(ck.CheckpointLoadError, match=r"step_00000001\.pt: corrupt or incomplete"):
        ck.load_checkpoint(path)

    path.write_bytes(b"\x00" * 1000)
    with pytest.raises(ck.CheckpointLoadError, match=r"step_00000001\.pt: corrupt or incomplete"):
        ck.load_checkpoint(path)

    other = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(2)}, other)
    with pytest.raises(ck.CheckpointLoadError, match=r"weights\.pt: not a RookWorld training checkpoint"):
        ck.load_checkpoint(other)

    with pytest.raises(ck.CheckpointLoadError, match=r"missing\.pt: checkpoint file not found"):
        ck.load_checkpoint(tmp_path / "missing.pt")
    with pytest.raises(ck.CheckpointLoadError, match=r"model\.pt: checkpoint file not found$"):  # a mistyped path:
        ck.load_checkpoint(tmp_path / "elsewhere" / "model.pt")  # no advice to move a folder of no checkpoints
    (tmp_path / "empty").mkdir()
    with pytest.raises(ck.CheckpointLoadError, match=r"empty: no checkpoint in this directory"):
        ck.load_checkpoint(tmp_path / "empty")

    (tmp_path / "latest").write_text("{not json")
    with pytest.raises(ck.CheckpointLoadError, match="latest.*unreadable"):
        ck.load_checkpoint(tmp_path)


def test_flipped_bytes_are_refused_by_their_checksum(tmp_path):
    *_, state = trained_state()
    ck.save_checkpoint(tmp_path, {**state, "step": 1})
    path = ck.save_checkpoint(tmp_path, {**state, "step": 2}, keep_last=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "step_00000002.pt", "step_00000002.pt.sha256"]
    assert json.loads((tmp_path / "latest").read_text())["sha256"] == ck.file_sha256(path)
    data = bytearray(path.read_bytes())
    for k in (len(data) // 2, len(data) // 2 + 7, len(data) // 2 + 99):  # three bytes inside the tensor data
        data[k] ^= 0x5A
    path.write_bytes(bytes(data))  # same size: the pointer's byte count cannot see it
    for target in (tmp_path, path):
        with pytest.raises(ck.CheckpointLoadError, match=r"step_00000002\.pt: its bytes changed .*not loaded"):
            ck.load_checkpoint(target)
    # with its .sha256 file gone too, the digest in `latest` still refuses it; every checkpoint damaged: the
    # message says how to start over
    ck._digest_path(path).unlink()
    with pytest.raises(ck.CheckpointLoadError, match=r"its bytes changed .*no other intact checkpoint is in .*: to "
                                                     r"train from the start, move .* away"):
        ck.load_checkpoint(tmp_path)


def test_one_damaged_record_of_a_checksum_does_not_condemn_an_intact_checkpoint(tmp_path):
    """A damaged .sha256 file beside an intact checkpoint: `latest` records the same file's digest, so
    it loads; an older damaged checkpoint is named with advice that keeps `latest`, which names the
    intact newest one."""
    *_, state = trained_state()
    old = ck.save_checkpoint(tmp_path, {**state, "step": 1})
    new = ck.save_checkpoint(tmp_path, {**state, "step": 2})
    ck._digest_path(new).write_text("garbage\n")
    assert ck.load_checkpoint(tmp_path)["step"] == 2
    old.write_bytes(old.read_bytes()[:-9] + b"123456789")  # the older one damaged (same size)
    with pytest.raises(ck.CheckpointLoadError) as info:
        ck.load_checkpoint(old)
    assert str(info.value).endswith(f"the newest intact checkpoint there is {new.name} (step 2): to resume from it, "
                                    f"delete {old.name} in {tmp_path} and run the same command again")


KILL_DURING_SAVE = textwrap.dedent("""
    import os, signal, sys, torch
    from rookworld_lib.core import checkpoint as ck
    from rookworld_lib.core.model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset("tiny", n_layer=1, n_embd=16, n_head=2, block_size=16))
    state = ck.training_state(step=1, model=model)
    ck.save_checkpoint(sys.argv[1], state)
    real_save = torch.save
    def save_then_die(obj, f, *a, **k):
        f.write(b"PK\\x03\\x04 the first bytes of a checkpoint")
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)  # a real SIGKILL, in the middle of the write
    torch.save = save_then_die
    ck.save_checkpoint(sys.argv[1], {**state, "step": 2})
    print("unreachable")
""")


def _kill_during_save_main(argv: list[str]) -> None:
    """`python -c KILL_DURING_SAVE DIR`, in a process forked with torch imported (forked_child.py)."""
    sys.argv = ["-c", *argv]
    exec(KILL_DURING_SAVE, {"__name__": "__main__"})


def test_a_kill_during_save_leaves_the_latest_checkpoint_whole(tmp_path):
    from forked_child import ForkedChild

    proc = ForkedChild(_kill_during_save_main, [str(tmp_path)])
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, stderr
    assert "unreachable" not in stdout
    leftovers = [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]
    assert leftovers  # the torn temporary file is there...
    assert ck.latest_checkpoint(tmp_path).name == "step_00000001.pt"  # ...but latest names a whole one
    assert ck.load_checkpoint(tmp_path)["step"] == 1
    ck.save_checkpoint(tmp_path, {**ck.load_checkpoint(tmp_path), "step": 2})  # the next save cleans up
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tmp-")]
    assert ck.load_checkpoint(tmp_path)["step"] == 2


def test_restore_from_checkpoint_and_export_hf(tmp_path):
    model, *_, state = trained_state()
    path = ck.save_checkpoint(tmp_path / "ckpt", state)
    restored = small_model(seed=1).eval()
    assert ck.restore_training_state(ck.load_checkpoint(path), model=restored) == 1
    x = torch.randint(0, 50257, (1, 8))
    model.eval()
    with torch.no_grad():
        assert torch.equal(restored(x), model(x))
    out = ck.export_hf(tmp_path / "ckpt")
    assert out == tmp_path / "ckpt" / "step_00000001-hf"
    hf = GPT.from_pretrained(out).eval()
    with torch.no_grad():
        torch.testing.assert_close(hf(x), model(x))
    assert ck.export_hf(model, tmp_path / "final") == tmp_path / "final"
    assert (tmp_path / "final" / "model.safetensors").is_file()
    with pytest.raises(ck.CheckpointLoadError, match="not a RookWorld"):
        ck.export_hf(out / "model.safetensors")


class _FullDisk:
    """A file on a disk that fills after `room` bytes: write raises ENOSPC, as the kernel reports it."""

    def __init__(self, f, room=4096):
        self.f, self.room = f, room

    def write(self, data):
        self.room -= len(data)
        if self.room < 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self.f.write(data)

    def __getattr__(self, name):
        return getattr(self.f, name)


def test_a_real_torch_save_on_a_full_disk_says_no_space_left(tmp_path, monkeypatch):
    """torch's zip writer turns the ENOSPC of a write into '[enforce fail ...] unexpected pos'; the
    error names the full disk instead (issue 18, item 8)."""
    *_, state = trained_state()
    first = ck.save_checkpoint(tmp_path, {**state, "step": 1})
    real = ck.atomic_write
    monkeypatch.setattr(ck, "atomic_write", lambda path, write: real(path, lambda f: write(_FullDisk(f))))
    with pytest.raises(ck.CheckpointSaveError) as info:
        ck.save_checkpoint(tmp_path, {**state, "step": 2})
    msg = str(info.value)
    assert "step_00000002.pt: No space left on device" in msg and "unexpected pos" not in msg
    assert f"previous checkpoint {first} is intact" in msg and info.value.errno == errno.ENOSPC
    assert_previous_intact(tmp_path, 1)


def test_a_checkpoint_directory_below_a_file_is_named(tmp_path):
    (tmp_path / "out").write_text("a file\n")
    *_, state = trained_state()
    for call in (lambda: ck.save_checkpoint(tmp_path / "out" / "checkpoints", state),
                 lambda: ck.latest_checkpoint(tmp_path / "out" / "checkpoints")):
        with pytest.raises(ck.CheckpointError, match=f"{tmp_path / 'out'} is a file, not a directory"):
            call()


def test_hf_directory_errors_name_the_file(tmp_path):
    from safetensors import SafetensorError

    from rookworld_lib.core import model as model_module
    from rookworld_lib.core.model import CheckpointFormatError

    small_model().save_pretrained(tmp_path / "m")
    weights, config = tmp_path / "m" / "model.safetensors", tmp_path / "m" / "config.json"
    good = config.read_text()
    for text, why in (('{"n_layer": \n', "not valid JSON"), ("[1, 2]", "expected a JSON object"),
                      (good.replace('"n_layer": 1', '"n_layer": "abc"'), "GPTConfig.n_layer must be an integer >= 1")):
        config.write_text(text)
        with pytest.raises(CheckpointFormatError, match=f"{config}: {why}"):
            GPT.from_pretrained(tmp_path / "m")
    config.write_text(good)
    with pytest.raises(ValueError, match="model overrides .*dropout"):
        GPT.from_pretrained(tmp_path / "m", dropout="abc")
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    with pytest.raises(CheckpointFormatError, match=f"{weights}: truncated or corrupt safetensors file"):
        GPT.from_pretrained(tmp_path / "m")

    def full(*args, **kwargs):  # what safetensors raises on a full disk
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    out = tmp_path / "out"
    small_model(seed=1).save_pretrained(out)
    before = (out / "model.safetensors").read_bytes()
    model_module.save_file, real = full, model_module.save_file
    try:
        with pytest.raises(OSError) as info:
            small_model().save_pretrained(out)
    finally:
        model_module.save_file = real
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(out / "model.safetensors")
    assert (out / "model.safetensors").read_bytes() == before  # the earlier export is untouched
    assert sorted(os.listdir(out)) == EXPORT_FILES  # no temporary file left


def test_an_export_reaches_the_disk_before_it_replaces_the_old_one(tmp_path, monkeypatch):
    """model.safetensors is fsynced under a temporary name, renamed, and the directory fsynced, as
    every other file the workbench writes whole: a crash leaves the old export or the new one."""
    from rookworld_lib.core import paths

    synced, real = [], paths._fsync
    monkeypatch.setattr(paths, "_fsync", lambda path, flags: (synced.append(Path(path)), real(path, flags)))
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / ".tmp-model.safetensors.killed").write_bytes(b"torn")  # what a killed export leaves
    small_model().save_pretrained(tmp_path / "m")
    assert sorted(os.listdir(tmp_path / "m")) == EXPORT_FILES  # the next export removes it
    weights = [p for p in synced if p.name.startswith(".tmp-model.safetensors.")]
    assert len(weights) == 1 and not weights[0].exists() and synced.index(weights[0]) < synced.index(tmp_path / "m")
    torch.testing.assert_close(GPT.from_pretrained(tmp_path / "m").state_dict(), small_model().state_dict(),
                               rtol=0, atol=0)


def test_prompt_prefix_travels_in_config_json(tmp_path):
    """How the model must be prompted is written beside its layout, so transformers, TRL or vLLM
    users can read it; a directory without the key (a RookWorld-LM download) gets none."""
    from rookworld_lib.core.model import PROMPT_PREFIX_KEY, CheckpointFormatError

    small_model().save_pretrained(tmp_path / "m")
    path = tmp_path / "m" / "config.json"
    config = json.loads(path.read_text())
    assert config[PROMPT_PREFIX_KEY] == "<|endoftext|>"
    assert GPT.from_pretrained(tmp_path / "m").prompt_prefix == "<|endoftext|>"
    path.write_text(json.dumps({**config, PROMPT_PREFIX_KEY: ""}))
    assert GPT.from_pretrained(tmp_path / "m").prompt_prefix == ""
    del config[PROMPT_PREFIX_KEY]
    path.write_text(json.dumps(config))
    assert GPT.from_pretrained(tmp_path / "m").prompt_prefix == ""
    path.write_text(json.dumps({**config, PROMPT_PREFIX_KEY: 50256}))
    with pytest.raises(CheckpointFormatError, match=f"config.json: {PROMPT_PREFIX_KEY} must be a string"):
        GPT.from_pretrained(tmp_path / "m")


def test_a_pointer_to_a_lost_checkpoint_asks_to_delete_only_what_is_there(tmp_path):
    """`latest` naming a step file that is gone: the message points at the newest intact checkpoint
    and asks to delete the pointer, not the file that does not exist."""
    import json as json_lib

    model = torch.nn.Linear(2, 2)
    ck.save_checkpoint(tmp_path, {"format": ck.FORMAT, "version": ck.VERSION, "step": 2, "model": model.state_dict(),
                                  "model_config": {}})
    (tmp_path / ck.POINTER).write_text(json_lib.dumps({"file": "step_00000099.pt"}))
    with pytest.raises(ck.CheckpointLoadError) as info:
        ck.load_checkpoint(tmp_path)
    assert str(info.value).endswith("the newest intact checkpoint there is step_00000002.pt (step 2): to resume from "
                                    f"it, delete latest in {tmp_path} and run the same command again")


def test_a_failed_atomic_write_names_the_file_it_was_writing(tmp_path):
    """A full disk while a data or metrics file is written: the error names that file (an OSError from
    write() carries none), and the file is as it was."""
    import errno

    from rookworld_lib.core.paths import atomic_file

    target = tmp_path / "policy_test.jsonl"
    target.write_text("old\n")

    def full(_):
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(OSError) as info, atomic_file(target) as f:
        f.write(b"new\n")
        full(f)
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(target)
    assert target.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["policy_test.jsonl"]


def test_a_checkpoints_export_carries_the_models_layout_and_prompt_prefix(tmp_path):
    """`eval --every-checkpoint` and `export_hf(step_N.pt)` rebuild the model from a checkpoint: what
    the model carries for its task (GPT.meta, such as the original layout, and its prompt prefix)
    comes back with it, as the run's final export has it."""
    from rookworld_lib.core.model import GPT, GPTConfig

    model = GPT(GPTConfig.preset("tiny", block_size=16))
    model.meta, model.prompt_prefix = {"rookworld_layout": "original"}, ""
    path = ck.save_checkpoint(tmp_path / "checkpoints", ck.training_state(step=3, model=model))
    back = ck.model_from_checkpoint(path)
    assert back.meta == {"rookworld_layout": "original"} and back.prompt_prefix == ""
    config = json.loads((ck.export_hf(path, tmp_path / "hf") / "config.json").read_text())
    assert config["rookworld_layout"] == "original" and config["rookworld_prompt_prefix"] == ""


def test_a_checkpoint_of_a_newer_format_version_is_refused_naming_both_versions(tmp_path):
    model = torch.nn.Linear(2, 2)
    for version, refused in ((ck.VERSION, False), (ck.VERSION + 1, True)):
        out = tmp_path / str(version)
        ck.save_checkpoint(out, {"format": ck.FORMAT, "version": version, "step": 2, "model": model.state_dict(),
                                 "model_config": {}})
        if not refused:
            assert ck.load_checkpoint(out)["version"] == version
            continue
        with pytest.raises(ck.CheckpointLoadError, match=rf"format version {version} is newer than this code's {ck.VERSION}"):
            ck.load_checkpoint(out)


@pytest.mark.parametrize("pointer", ['{"step": 1, "bytes": 10}', '["step_00000001.pt"]', '{"file": 1}'])
def test_a_latest_pointer_without_a_file_name_is_refused_and_deleting_it_falls_back(tmp_path, pointer):
    """`latest` must name its checkpoint file: one that is valid JSON but names none (no "file", not an
    object, a number for a name) is refused as unreadable, with the remedy; following it (deleting the
    pointer) loads the newest step_*.pt."""
    model = torch.nn.Linear(2, 2)
    for step in (1, 2):
        ck.save_checkpoint(tmp_path, {"format": ck.FORMAT, "version": ck.VERSION, "step": step,
                                      "model": model.state_dict(), "model_config": {}}, keep_last=0)
    (tmp_path / ck.POINTER).write_text(pointer)
    with pytest.raises(ck.CheckpointLoadError) as info:
        ck.load_checkpoint(tmp_path)
    assert str(info.value) == (f"{tmp_path / 'latest'}: unreadable latest-checkpoint pointer (missing 'file'); "
                               "delete it to fall back to the newest step_*.pt file")
    (tmp_path / ck.POINTER).unlink()
    assert ck.load_checkpoint(tmp_path)["step"] == 2


def test_a_checkpoint_without_step_model_or_config_is_refused_naming_what_it_lacks(tmp_path):
    """A file with our format marker but not what a resume or an export reads (step, model, model_config):
    refused naming each missing key, not a KeyError later in a loop."""
    path = tmp_path / "step_00000004.pt"
    torch.save({"format": ck.FORMAT, "version": ck.VERSION, "model": {"w": torch.zeros(2)}}, path)
    with pytest.raises(ck.CheckpointLoadError) as info:
        ck.load_checkpoint(path)
    assert str(info.value) == f"{path}: checkpoint lacks step, model_config"
    torch.save({"format": ck.FORMAT, "version": ck.VERSION}, path)
    with pytest.raises(ck.CheckpointLoadError, match=r"step_00000004\.pt: checkpoint lacks step, model, model_config$"):
        ck.model_from_checkpoint(tmp_path)  # the directory: its only step file, no pointer


def test_saving_beside_a_corrupt_pointer_refuses_to_guess_and_writes_nothing(tmp_path):
    """The pointer says which checkpoint is latest (and which the keep_last pruning keeps); when it cannot
    be read, a save refuses (CheckpointSaveError, as for a full disk) naming the pointer and the remedy,
    and leaves the directory as it was; once the pointer is deleted the same save succeeds."""
    state = {"format": ck.FORMAT, "version": ck.VERSION, "model": torch.nn.Linear(2, 2).state_dict(), "model_config": {}}
    ck.save_checkpoint(tmp_path, {**state, "step": 1})
    (tmp_path / ck.POINTER).write_text("{not json")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ck.CheckpointSaveError) as info:
        ck.save_checkpoint(tmp_path, {**state, "step": 2})
    assert str(info.value).startswith(f"could not save checkpoint {tmp_path / 'step_00000002.pt'}: "
                                      f"{tmp_path / 'latest'}: unreadable latest-checkpoint pointer ("), str(info.value)
    assert "); delete it to fall back to the newest step_*.pt file" in str(info.value)
    # step 1 is there, intact: no word that it is missing (a CheckpointLoadError is a RuntimeError too, and was
    # once taken for a failed write, whose message adds that no earlier checkpoint exists)
    assert "no earlier checkpoint exists" not in str(info.value), str(info.value)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    (tmp_path / ck.POINTER).unlink()
    path = ck.save_checkpoint(tmp_path, {**state, "step": 2})
    assert json.loads((tmp_path / ck.POINTER).read_text())["file"] == "step_00000002.pt" == path.name


def _task_vocab_grpo_run(tmp_path):
    """A one-step GRPO run that opted into a task vocabulary (vocab="task", task_vocab=) on a model loaded
    from tmp_path / "base", which marks none; its checkpoints in tmp_path / "run" / "checkpoints"."""
    from rookworld_lib.core import grpo
    from rookworld_lib.core.task_vocab import TaskVocab
    from rookworld_lib.core.tokenizer import get_tokenizer
    from rookworld_lib.core.train_grpo import GRPOTrainConfig, GRPOTrainer, PromptItem

    torch.manual_seed(0)
    GPT(GPTConfig.preset("tiny", n_layer=1, n_embd=16, n_head=2, block_size=32)).save_pretrained(tmp_path / "base")
    items = [PromptItem("P", f"Q: {i} A:") for i in range(4)]
    cfg = GRPOTrainConfig(steps=1, prompts_per_step=2, group_size=2, max_new_tokens=3, minibatch_size=4, lr=1e-2,
                          loss=grpo.GRPOConfig(beta=0.0), vocab="task", progress=False, report_to="none",
                          export_hf=False, out_dir=str(tmp_path / "run"))
    given = TaskVocab({t for s in ("yes no maybe", "Q: 1 A:") for t in get_tokenizer().encode(s)})
    trainer = GRPOTrainer(GPT.from_pretrained(tmp_path / "base"), items, cfg, init_from=str(tmp_path / "base"),
                          reward_funcs=lambda completions, **_: [float(len(c)) for c in completions], task_vocab=given)
    trainer.train()
    return trainer


def test_a_grpo_checkpoint_over_an_opted_in_task_vocabulary_exports_with_its_base_models_rows(tmp_path):
    """model_from_checkpoint (export_hf, eval --every-checkpoint) of a run over task_vocab= rebuilds the
    full GPT-2: the trained task rows, every other embedding row from the base model the run started from,
    as the trainer's own export_model() has it. With that base folder gone it cannot, and says so."""
    import re
    import shutil

    from safetensors.torch import load_file

    trainer = _task_vocab_grpo_run(tmp_path)
    ckpt_dir = tmp_path / "run" / "checkpoints"
    assert ck.load_checkpoint(ckpt_dir)["extra"]["task_vocab_base"] == str((tmp_path / "base").resolve())
    back = ck.model_from_checkpoint(ckpt_dir)
    want = trainer.export_model().state_dict()
    assert back.state_dict().keys() == want.keys()
    for name, tensor in back.state_dict().items():
        assert torch.equal(tensor, want[name]), name
    base_wte = load_file(str(tmp_path / "base" / "model.safetensors"))["transformer.wte.weight"]
    outside = torch.ones(len(base_wte), dtype=torch.bool)
    outside[trainer.vocab.ids] = False
    assert back.config.vocab_size == 50257 and int(outside.sum()) == 50257 - len(trainer.vocab)
    assert torch.equal(back.transformer.wte.weight[outside], base_wte[outside])  # the base model's rows, as saved
    assert not torch.equal(back.transformer.wte.weight[~outside], base_wte[~outside])  # trained
    shutil.rmtree(tmp_path / "base")
    message = (f"{ckpt_dir}: a GRPO run over a task vocabulary of the model in {str((tmp_path / 'base').resolve())!r}; "
               "exporting it needs that model's other embedding rows, and it is not there")
    with pytest.raises(ck.CheckpointLoadError, match=re.escape(message)):
        ck.model_from_checkpoint(ckpt_dir)


# Behaviours of core/checkpoint that no test pinned (mutation round 6, stop 68: each test below is red with its mutant)

def test_restore_is_strict_about_the_models_keys():
    """restore_training_state's docstring: "(strictly)". A 2-layer checkpoint restored into a 1-layer model
    must fail (torch's strict load_state_dict: unexpected keys), not load layer 0 and drop layer 1."""
    state = ck.training_state(step=1, model=GPT(GPTConfig.preset("tiny", n_layer=2, n_embd=16, n_head=2, block_size=16)))
    with pytest.raises(RuntimeError, match="Unexpected key"):
        ck.restore_training_state(state, model=small_model())


def test_training_state_of_a_compiled_model_has_the_original_modules_keys():
    """training_state's docstring: a torch.compile'd model's original module is saved: its keys are the
    plain module's state_dict keys, none prefixed "_orig_mod."."""
    model = small_model()
    state = ck.training_state(step=1, model=torch.compile(model))
    assert list(state["model"]) == list(model.state_dict())


def test_a_checkpoint_grown_since_it_was_saved_is_refused_by_the_pointers_byte_count(tmp_path):
    """load_checkpoint(dir) compares the file's size with the `bytes` the pointer recorded. With no digest
    recorded (an older checkpoint: no .sha256, no sha256 in `latest`) the size is the only check: a file
    with bytes appended (overwritten by another writer) must be refused, naming both sizes."""
    path = ck.save_checkpoint(tmp_path, ck.training_state(step=1, model=small_model()))
    saved = path.stat().st_size
    ck._digest_path(path).unlink()
    pointer = json.loads((tmp_path / "latest").read_text())
    (tmp_path / "latest").write_text(json.dumps({k: v for k, v in pointer.items() if k != "sha256"}))
    with open(path, "ab") as f:
        f.write(b"\0" * 64)
    with pytest.raises(ck.CheckpointLoadError, match=rf"{saved + 64} bytes on disk, {saved} when it was saved"):
        ck.load_checkpoint(tmp_path)
