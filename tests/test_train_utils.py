import contextlib
import json
import random
import re

import numpy as np
import pytest
import torch

from rookworld_lib.core import train_utils as tu


# ---- learning-rate schedule ---------------------------------------------------------------

def test_schedule_warmup_peak_and_end():
    kw = dict(lr=1e-3, min_lr=1e-4, warmup_steps=10, max_steps=110)
    assert tu.cosine_lr(0, **kw) == pytest.approx(1e-4)  # first update: lr / warmup_steps
    assert tu.cosine_lr(4, **kw) == pytest.approx(5e-4)  # linear
    assert tu.cosine_lr(9, **kw) == pytest.approx(1e-3)  # last warm-up update reaches the peak
    assert tu.cosine_lr(10, **kw) == pytest.approx(1e-3)  # cosine starts at the peak
    mid = 10 + (110 - 1 - 10) / 2
    assert tu.cosine_lr(int(mid), **kw) == pytest.approx(0.55e-3, rel=0.02)  # halfway: (lr + min_lr) / 2
    assert tu.cosine_lr(109, **kw) == pytest.approx(1e-4)  # the last update runs at min_lr exactly
    assert tu.cosine_lr(500, **kw) == pytest.approx(1e-4)  # and it is held after the end
    decay = [tu.cosine_lr(s, **kw) for s in range(10, 110)]
    assert all(a >= b for a, b in zip(decay, decay[1:]))


def test_schedule_edge_cases():
    assert tu.cosine_lr(0, lr=1.0, min_lr=0.1, warmup_steps=0, max_steps=5) == pytest.approx(1.0)
    assert tu.cosine_lr(4, lr=1.0, min_lr=0.1, warmup_steps=0, max_steps=5) == pytest.approx(0.1)
    assert tu.cosine_lr(0, lr=1.0, min_lr=0.1, warmup_steps=0, max_steps=1) == pytest.approx(0.1)
    assert tu.cosine_lr(2, lr=1.0, min_lr=0.1, warmup_steps=3, max_steps=3) == pytest.approx(1.0)


def test_schedule_apply_sets_every_group_with_its_scale():
    a, b = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([{"params": [a]}, {"params": [b], "lr_scale": 0.5}], lr=1.0)
    sched = tu.WarmupCosineSchedule(lr=2.0, min_lr=0.2, warmup_steps=4, max_steps=20)
    assert sched.apply(opt, 1) == pytest.approx(1.0)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([1.0, 0.5])
    assert sched.state_dict() == {"lr": 2.0, "min_lr": 0.2, "warmup_steps": 4, "max_steps": 20}


@pytest.mark.parametrize("kw, word", [(dict(lr=0.0), "lr"), (dict(min_lr=5.0), "min_lr"),
                                      (dict(max_steps=0), "max_steps")])
def test_schedule_rejects_bad_settings(kw, word):
    base = dict(lr=1.0, min_lr=0.1, warmup_steps=2, max_steps=10)
    with pytest.raises(ValueError, match=word):
        tu.WarmupCosineSchedule(**{**base, **kw})


# ---- optimizer ------------------------------------------------------------------------------

def test_build_adamw_decays_only_matrices_and_picks_an_implementation():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = tu.build_adamw(model, lr=1e-3, weight_decay=0.1, betas=(0.8, 0.99), eps=1e-6, device_type="cpu")
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and all(p.dim() == 2 for p in decay["params"])
    assert no_decay["weight_decay"] == 0.0 and all(p.dim() == 1 for p in no_decay["params"])
    # the betas and eps given, not the defaults (0.9, 0.95) and 1e-8, in every group
    assert all(tuple(g["betas"]) == (0.8, 0.99) and g["eps"] == 1e-6 for g in opt.param_groups)
    assert bool(opt.defaults.get("fused")) == tu._fused_supported("cpu")
    opt = tu.build_adamw(model, lr=1e-3, weight_decay=0.1, device_type="cpu", fused=False)
    assert opt.defaults["foreach"] and not opt.defaults.get("fused")


def test_a_gpt_decays_its_ten_matrices_and_embeddings_once_and_nothing_else():
    from rookworld_lib.core.model import GPT, GPTConfig

    model = GPT(GPTConfig.preset("tiny"))  # 2 blocks: wte (tied to the head: once), wpe, 4 Linear weights a block
    decay, no_decay = tu.build_adamw(model, lr=1e-3, weight_decay=0.1, device_type="cpu").param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)] for p in decay["params"]) == sorted(
        ["transformer.wte.weight", "transformer.wpe.weight"]
        + [f"transformer.h.{i}.{m}.weight" for i in range(2) for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")])
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_clip_grad_norm_reports_the_norm_before_clipping():
    p = torch.nn.Parameter(torch.zeros(2))
    model = torch.nn.Module()
    model.p = p
    p.grad = torch.tensor([3.0, 4.0])
    norm = tu.clip_grad_norm(model, 1.0)
    assert norm.item() == pytest.approx(5.0)
    assert p.grad.norm().item() == pytest.approx(1.0, rel=1e-5)
    p.grad = torch.tensor([3.0, 4.0])
    assert tu.clip_grad_norm(model, 0.0).item() == pytest.approx(5.0)  # 0 = measure only
    assert p.grad.tolist() == [3.0, 4.0]


# ---- non-finite guard -----------------------------------------------------------------------

def test_nonfinite_guard_counts_resets_and_trips():
    g = tu.NonFiniteGuard(max_in_a_row=3)
    assert g.observe(torch.tensor(1.0), torch.tensor(2.0))
    assert not g.observe(torch.tensor(float("nan")), torch.tensor(1.0))
    assert not g.observe(torch.tensor(1.0), torch.tensor(float("inf")))
    assert (g.in_a_row, g.total, g.tripped) == (2, 2, False)
    assert g.observe(0.5)  # a finite step resets the run of failures, not the total
    assert (g.in_a_row, g.total) == (0, 2)
    for _ in range(3):
        g.observe(float("nan"))
    assert g.tripped and "3 non-finite" in g.describe() and "limit 3" in g.describe()
    h = tu.NonFiniteGuard(3)
    h.load_state_dict(g.state_dict())
    assert (h.in_a_row, h.total) == (3, 5)


# ---- metrics ----------------------------------------------------------------------------------

def test_metrics_logger_writes_strict_json_lines(tmp_path):
    path = tmp_path / "m.jsonl"
    with tu.MetricsLogger(path) as m:
        m.log({"step": 1, "loss": torch.tensor(2.5), "grad_norm": float("nan"), "x": np.float32(1.5)})
        m.log({"step": 2, "loss": float("inf"), "val_loss": None})
    lines = path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": 1, "loss": 2.5, "grad_norm": None, "x": 1.5}, {"step": 2, "loss": None, "val_loss": None}]
    assert "NaN" not in path.read_text() and "Infinity" not in path.read_text()


def test_metrics_logger_resume_drops_later_records_and_a_torn_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in range(6)) + '{"step": 6, "lo')
    assert [r["step"] for r in tu.read_metrics(path)] == [0, 1, 2, 3, 4, 5]
    with tu.MetricsLogger(path, resume_step=3) as m:
        m.log({"step": 4})
    assert [r["step"] for r in tu.read_metrics(path)] == [0, 1, 2, 3, 4]
    with tu.MetricsLogger(path, fresh=True):
        pass
    assert path.read_text() == ""



def test_an_appender_on_a_file_of_whole_lines_cuts_nothing_and_warns_of_nothing(tmp_path, caplog):
    """Only an unterminated last line (a kill mid-append) is cut, with a warning; a resumed run's metrics
    file that ends in a newline is appended to as it is, without the false alarm."""
    from rookworld_lib.core.paths import JsonlAppender

    whole, torn = tmp_path / "whole.jsonl", tmp_path / "torn.jsonl"
    whole.write_bytes(b'{"step":1}\n{"step":2}\n')
    torn.write_bytes(b'{"step":1}\n{"st')
    for path in (whole, torn):
        with JsonlAppender(path) as log:
            log.write({"step": 3})
    assert whole.read_bytes() == b'{"step":1}\n{"step":2}\n{"step":3}\n'
    assert torn.read_bytes() == b'{"step":1}\n{"step":3}\n'
    assert [r.getMessage() for r in caplog.records if "torn" in r.getMessage()] == [
        f"{torn}: dropping a torn last line left by an interrupted run"]


def test_an_appender_fsyncs_every_sync_every_lines_and_at_close(tmp_path, monkeypatch):
    """What a power cut can lose is bounded: the lines are put on disk every `sync_every` lines (and by
    sync() and close()), not only when the file is closed. Closed, it holds no file descriptor (a
    notebook that trains again and again would run out of them)."""
    import os

    from rookworld_lib.core import paths

    fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    path, synced = tmp_path / "m.jsonl", []  # the lines in the file at each fsync
    with paths.JsonlAppender(path, sync_every=2) as log:
        real = os.fsync
        monkeypatch.setattr(paths.os, "fsync", lambda fd: (synced.append(path.read_bytes().count(b"\n")), real(fd))[1])
        for step in range(1, 6):
            log.write({"step": step})
        assert synced == [2, 4]
        log.sync()
        assert synced == [2, 4, 5]
    assert synced == [2, 4, 5, 5]
    assert fds is None or len(os.listdir("/proc/self/fd")) == fds


def test_an_atomic_rewrite_keeps_the_files_mode_and_names_only_the_errors_a_write_causes(tmp_path):
    """A file replaced atomically keeps the mode its owner gave it (a shared report chmod 0640 stays
    0640); `naming(path, errnos)` puts the path into a write's error (ENOSPC: which file?) and leaves
    any other error as it was raised (an EIO while reading the source is not the target's)."""
    import errno
    import os

    from rookworld_lib.core.paths import atomic_write, naming

    path = tmp_path / "report.md"
    path.write_text("old\n")
    os.chmod(path, 0o640)
    atomic_write(path, lambda f: f.write(b"new\n"))
    assert path.read_text() == "new\n" and path.stat().st_mode & 0o777 == 0o640
    with pytest.raises(OSError) as full:
        with naming(path, {errno.ENOSPC}):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert (full.value.errno, full.value.filename) == (errno.ENOSPC, str(path))
    with pytest.raises(OSError) as other:
        with naming(path, {errno.ENOSPC}):
            raise OSError(errno.EIO, "Input/output error")
    assert (other.value.errno, other.value.filename) == (errno.EIO, None)


def test_resume_names_the_missing_records_as_ranges_and_a_torn_line_whose_step_is_unreadable(tmp_path, caplog):
    """A metrics file that lost records 2-4 and 7 (a line deleted by hand, a tail cut) before the checkpoint
    at step 8 says so once, as ranges; a torn line whose step cannot be read says after which record it came."""
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 5, 6, 8)) + '{"st\n')
    with caplog.at_level("WARNING", logger=tu.log.name), tu.MetricsLogger(path, resume_step=8, every_step=True):
        pass
    said = [r.getMessage() for r in caplog.records]
    assert f"{path}: the records of steps 2 to 4, 7 are missing: lost, though the checkpoint at step 8 covers them" in said
    assert (f"{path}:5: a torn line (cut off by a kill or a power cut) dropped; its step is unreadable (it came after "
            "the record of step 8)") in said, said
    assert [r["step"] for r in tu.read_metrics(path)] == [1, 5, 6, 8]


def test_resume_drops_lines_that_are_json_but_no_record_and_steps_out_of_order_and_says_a_file_is_gone(tmp_path, caplog):
    """Hand-edited lines that parse but are no record ([1], "x", a text step) used to end a resume in a
    traceback; a record repeated out of order (1 2 3 4 2) was kept. Each is dropped with file:line. In a
    file of rows per step (completions) equal steps are rows, not repeats. A metrics file deleted before a
    resume loses the checkpoint's records, said as a missing one's are."""
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ({"step": 1}, [1], {"step": "2"}, {"step": 2}, {"step": 3},
                                                           "x", {"step": 2}, {"step": 4})))
    with caplog.at_level("WARNING", logger=tu.log.name), tu.MetricsLogger(path, resume_step=4, every_step=True):
        pass
    said = [r.getMessage() for r in caplog.records]
    assert [r["step"] for r in tu.read_metrics(path)] == [1, 2, 3, 4]
    assert f"{path}:2: dropped: not a record with a whole-number step" in said
    assert f"{path}:3: dropped: not a record with a whole-number step" in said
    assert f"{path}:6: dropped: not a record with a whole-number step" in said
    assert f"{path}:7: dropped: step 2 after the record of step 3 (the steps of this file only increase)" in said
    rows = tmp_path / "completions.jsonl"
    rows.write_text("".join(json.dumps({"step": s, "i": i}) + "\n" for i, s in enumerate((1, 1, 2, 2, 3))))
    with tu.MetricsLogger(rows, resume_step=2):
        pass
    assert [r["i"] for r in tu.read_metrics(rows)] == [0, 1, 2, 3]
    caplog.clear()
    with caplog.at_level("WARNING", logger=tu.log.name), tu.MetricsLogger(tmp_path / "gone.jsonl", resume_step=4,
                                                                          every_step=True):
        pass
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path / 'gone.jsonl'}: missing: the records of every step up to 4 are lost, though the checkpoint at step 4 "
        "covers them"]


def test_read_metrics_names_the_file_and_line_of_a_broken_record_in_the_middle(tmp_path):
    """A torn last line is a kill mid-write and is skipped; a broken line with records after it is damage,
    and reading the curve (eval --every-checkpoint) stops there, naming file:line."""
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, oops}\n{"step": 3}\n')
    with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:2: "):
        tu.read_metrics(path)


# ---- RNG state --------------------------------------------------------------------------------

def draws():
    return (random.random(), float(np.random.rand()), torch.rand(3).tolist(),
            torch.nn.functional.dropout(torch.ones(8), 0.5).tolist())


def test_rng_state_round_trip_through_a_weights_only_file(tmp_path):
    tu.seed_everything(123)
    state = tu.rng_state()
    expected = draws()
    torch.save(state, tmp_path / "rng.pt")
    tu.seed_everything(999)
    draws()
    tu.set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert draws() == expected


# ---- device and precision --------------------------------------------------------------------

def test_setup_runtime_on_cpu():
    rt = tu.setup_runtime("cpu", "auto")
    assert rt.device.type == "cpu" and rt.amp_dtype is None
    rt = tu.setup_runtime("cpu", "bf16")
    assert rt.amp_dtype == torch.bfloat16
    with rt.autocast():
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype"):
        tu.setup_runtime("cpu", "fp16")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            tu.setup_runtime("cuda", "auto")


def test_a_cuda_index_beyond_the_devices_here_is_named_before_torch_fails(monkeypatch):
    """`--device cuda:7` on a one-GPU machine ended in torch's "invalid device ordinal" at the first tensor;
    it is refused where the device is resolved (CUDA mocked: two devices here)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert tu.resolve_device("cuda:1") == torch.device("cuda:1") and tu.resolve_device("cuda") == torch.device("cuda")
    with pytest.raises(ValueError, match=r"^device 'cuda:7' \(--device\): torch sees 2 CUDA device\(s\) here, "
                                         r"cuda:0..cuda:1 \(CUDA_VISIBLE_DEVICES may hide others\)$"):
        tu.resolve_device("cuda:7")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ValueError, match=r"torch sees 1 CUDA device\(s\) here, cuda:0 only"):
        tu.resolve_device("cuda:1", source="notebook parameter 'device'")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="cuDNN attention exists only on CUDA")
def test_attention_backends_keep_sdpa_off_cudnn_with_the_same_output():
    # GRPO's shapes: a padded (boolean-masked) batch in bf16, where torch sends SDPA to cuDNN first
    rt = tu.setup_runtime("cuda", "bf16")
    q, k, v = (torch.randn(16, 12, 77, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    mask = torch.ones(16, 1, 77, 77, dtype=torch.bool, device="cuda").tril()
    mask[:3, ..., :5] = False  # left padding in three rows
    mask |= torch.eye(77, dtype=torch.bool, device="cuda")  # every query keeps one key (as padded rows do)

    def kernels(cudnn):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof, \
                rt.attention_backends(cudnn=cudnn):
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            torch.cuda.synchronize()
        return y, {e.key for e in prof.key_averages()}

    y_off, ops_off = kernels(False)
    y_on, _ = kernels(True)
    assert not any("cudnn_attention" in name for name in ops_off)
    torch.testing.assert_close(y_off.float(), y_on.float(), atol=2e-2, rtol=2e-2)


def test_attention_backends_leave_sdpa_alone_off_cuda():
    rt = tu.setup_runtime("cpu", "fp32")
    for cudnn in (True, False):
        assert isinstance(rt.attention_backends(cudnn=cudnn), contextlib.nullcontext)


def test_backend_flags_are_restored_after_the_run():
    before = torch.are_deterministic_algorithms_enabled()
    rt = tu.setup_runtime("cpu", "fp32", deterministic=True)
    with rt.backend_flags():
        assert torch.are_deterministic_algorithms_enabled()
    assert torch.are_deterministic_algorithms_enabled() == before


# Behaviours of core/train_utils that no test pinned (mutation round 6, stop 68: each test below is red with its mutant)

def test_seed_everything_reseeds_numpy_as_numpy_seed_does():
    """seed_everything's docstring: "Seed Python, NumPy and torch". NumPy's legacy global stream after it
    must be exactly the one np.random.seed(seed) gives, however much was drawn before."""
    np.random.seed(0)
    reference = np.random.rand(3).tolist()  # NumPy's own stream for seed 0
    for seed in (0, 2**32):  # seed % 2**32: 2**32 seeds NumPy as 0 does
        np.random.rand(17)  # draws before the call must not matter
        tu.seed_everything(seed)
        assert np.random.rand(3).tolist() == reference


def _write(path, steps):
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0}) + "\n" for s in steps))


def test_resume_reports_the_lost_record_of_the_checkpoint_step_itself(tmp_path, caplog):
    """every_step=True: records missing before (and at) the resume step are reported as lost. A file
    with steps 1..7 resumed from the checkpoint at step 8 has lost exactly the record of step 8."""
    path = tmp_path / "metrics.jsonl"
    _write(path, range(1, 8))
    with caplog.at_level("WARNING", logger=tu.log.name), tu.MetricsLogger(path, resume_step=8, every_step=True):
        pass
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"{path}: the record of step 8 is missing: lost, though the checkpoint at step 8 covers it"], said
    assert [r["step"] for r in tu.read_metrics(path)] == list(range(1, 8))


def test_resume_of_a_one_record_per_step_file_drops_a_repeated_step(tmp_path, caplog):
    """every_step=True is one record per step, so a step written twice in a row (1 2 2 3) is a repeat:
    the second copy is dropped with file:line, as out-of-order steps are; the file ends up 1 2 3."""
    path = tmp_path / "metrics.jsonl"
    _write(path, (1, 2, 2, 3))
    with caplog.at_level("WARNING", logger=tu.log.name), tu.MetricsLogger(path, resume_step=3, every_step=True):
        pass
    assert [r["step"] for r in tu.read_metrics(path)] == [1, 2, 3]
    assert any(r.getMessage().startswith(f"{path}:3: dropped: step 2 after the record of step 2") for r in caplog.records)


def test_a_torn_record_of_the_checkpoint_step_is_said_lost_once_and_not_again_as_missing(tmp_path, caplog):
    """every_step=True, records 1..3 whole and the record of step 4 torn by a kill, resumed from the
    checkpoint at step 4: the torn line is the one report (its record lost); step 4 is not also listed missing."""
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)) + '{"step": 4, "lo')
    with caplog.at_level("WARNING", logger=tu.log.name), tu.MetricsLogger(path, resume_step=4, every_step=True):
        pass
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"{path}:4: a torn line (cut off by a kill or a power cut) dropped; the record of step 4 is lost "
                    "(the checkpoint at step 4 covers it; the run resumes after it)"], said


def test_backend_flags_warn_only_inside_and_restore_every_cudnn_flag_after():
    """backend_flags' docstring: deterministic mode "only warns about an op without a deterministic kernel",
    turns cuDNN benchmark off, and every previous setting comes back after the run."""
    saved = (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic,
             torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    try:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = True, False
        torch.use_deterministic_algorithms(False)
        rt = tu.Runtime(torch.device("cpu"), None, tf32=False, deterministic=True)
        with rt.backend_flags():
            assert torch.are_deterministic_algorithms_enabled()
            assert torch.is_deterministic_algorithms_warn_only_enabled()  # a long run goes on past such an op
            assert torch.backends.cudnn.benchmark is False and torch.backends.cudnn.deterministic is True
        assert torch.backends.cudnn.benchmark is True and torch.backends.cudnn.deterministic is False
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[0], saved[1]
        torch.use_deterministic_algorithms(saved[2], warn_only=saved[3])


def test_build_adamw_gives_param_groups_without_their_own_decay_the_one_asked_and_refuses_bare_tensors():
    """Param groups took torch's default 0.01 whatever weight_decay said; a list of tensors was an IndexError."""
    lin = torch.nn.Linear(2, 2)
    opt = tu.build_adamw([{"params": [lin.weight]}, {"params": [lin.bias], "weight_decay": 0.0}], lr=1e-3,
                         weight_decay=0.3, fused=False)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.3, 0.0]
    with pytest.raises(ValueError, match=r"build_adamw: give a module or param groups \(dicts with 'params'\), got Parameter"):
        tu.build_adamw(list(lin.parameters()), lr=1e-3, weight_decay=0.0)
    with pytest.raises(ValueError, match="cosine_lr: step is a 0-based update index, got -3"):
        tu.cosine_lr(-3, lr=1.0, min_lr=0.1, warmup_steps=2, max_steps=10)
