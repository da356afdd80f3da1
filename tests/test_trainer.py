"""The shared training loop (core.trainer.Trainer) driven by a minimal subclass: its step cap, export, start(), the
metrics synced before each checkpoint, and a Ctrl-C in the last step or during the final save."""

import dataclasses
import os
import signal

import pytest
import torch

from rookworld_lib.core import checkpoint as ck
from rookworld_lib.core.model import GPT, GPTConfig
from rookworld_lib.core.paths import JsonlAppender
from rookworld_lib.core.trainer import Trainer
from rookworld_lib.core.train_utils import read_metrics


@dataclasses.dataclass(frozen=True)
class MiniConfig:
    out_dir: str | None = None
    device: str = "cpu"
    dtype: str = "fp32"
    resume: bool = True
    max_nonfinite_in_a_row: int = 3
    checkpoint_interval: int = 0
    keep_checkpoints: int = 0
    progress: bool = False
    report_to: str = "none"
    deterministic: bool = False
    steps: int = 4


class MiniTrainer(Trainer):
    """The shared loop around a tiny GPT it never updates: each step's record is records(step)."""

    kind, name = "mini", "mini"

    def __init__(self, cfg, records=None, **kw):
        super().__init__(cfg, cfg.steps, **kw)
        torch.manual_seed(0)
        self.model = GPT(GPTConfig.preset("tiny", block_size=8))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)
        self.schedule = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda s: 1.0)
        self.records = records or (lambda step: {"loss": 1.0 / step})
        self.started = []  # the step at each call of start()
        if (ckpt := self.find_checkpoint()) is not None:
            self.restore(ckpt)

    def start(self, metrics):
        self.started.append(self.step)

    def train_step(self):
        self.step += 1
        return {"step": self.step, **self.records(self.step)}


def test_each_checkpoint_is_saved_after_the_metrics_it_covers_are_synced(tmp_path, monkeypatch):
    """A power cut after a save never loses a record the checkpoint covers: the metrics file is fsynced
    before every checkpoint is written."""
    events = []
    sync, save = JsonlAppender.sync, ck.save_checkpoint
    monkeypatch.setattr(JsonlAppender, "sync", lambda self: (events.append(("sync", self.path.name)), sync(self))[1])
    monkeypatch.setattr(ck, "save_checkpoint", lambda d, state, **kw: (events.append(("save", state["step"])),
                                                                       save(d, state, **kw))[1])
    MiniTrainer(MiniConfig(out_dir=str(tmp_path), checkpoint_interval=2, steps=3)).train()
    saves = [i for i, e in enumerate(events) if e[0] == "save"]
    assert [events[i] for i in saves] == [("save", 2), ("save", 3)]
    assert all(events[i - 1] == ("sync", "metrics.jsonl") for i in saves), events


def test_the_export_is_written_when_the_run_reaches_its_steps_not_where_until_stops_it(tmp_path):
    class Exporting(MiniTrainer):
        export_at_end = True

    trainer = Exporting(MiniConfig(out_dir=str(tmp_path), steps=3))
    trainer.train(until=2)
    assert trainer.step == 2 and not (tmp_path / "final").exists()
    trainer.train()
    assert trainer.step == 3 and (tmp_path / "final" / "config.json").is_file()


def test_start_runs_only_when_a_call_has_steps_to_train(tmp_path):
    """start() (SFT logs its step-0 val loss there) runs once per train() call that trains: a call with
    nothing left to do, or an until at or before the step reached, writes nothing."""
    trainer = MiniTrainer(MiniConfig(out_dir=str(tmp_path), steps=3))
    trainer.train(until=2)
    trainer.train(until=1)
    trainer.train()
    trainer.train()
    assert trainer.started == [0, 2]
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]


def test_a_ctrl_c_while_the_last_checkpoint_is_saved_still_stops_the_caller(tmp_path):
    """In one process a signal that arrives during the run's final save (after the loop looked for one)
    is not lost: the run is saved, and the caller is told to stop (a notebook's next cell does not run)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        trainer = MiniTrainer(MiniConfig(out_dir=str(tmp_path), steps=2))
        save = trainer.save
        trainer.save = lambda: (trainer.step == 2 and os.kill(os.getpid(), signal.SIGINT), save())[1]
        with pytest.raises(KeyboardInterrupt, match="SIGINT"):
            trainer.train()
        assert [s for s, _ in ck.list_checkpoints(tmp_path / "checkpoints")] == [2]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_until_past_the_runs_steps_stops_at_its_steps(tmp_path):
    trainer = MiniTrainer(MiniConfig(out_dir=str(tmp_path), steps=3))
    assert [r["step"] for r in trainer.train(until=5)] == [1, 2, 3] and trainer.step == 3
    assert [s for s, _ in ck.list_checkpoints(tmp_path / "checkpoints")] == [3]


def test_an_until_that_is_no_step_and_an_on_step_that_is_no_function_are_refused_before_a_step():
    """until=-1 returned without training and until=1.5 ran to step 2; on_step=5 failed after step 1 had
    trained (TypeError: 'int' object is not callable)."""
    trainer = MiniTrainer(MiniConfig())
    for until in (-1, 0, 1.5, True, "2"):
        with pytest.raises(ValueError, match=r"^MiniTrainer.train: until must be a step >= 1 \(or None: to the end\), got "):
            trainer.train(until=until)
    assert trainer.step == 0
    with pytest.raises(ValueError, match=r"^on_step must be a function f\(record: dict\), got int 5"):
        MiniTrainer(MiniConfig(), on_step=5)


def test_a_ctrl_c_in_the_runs_last_step_still_exports_it(tmp_path):
    """The run reached its steps: it is saved and exported as a finished run, and the caller is still told to stop."""
    class Exporting(MiniTrainer):
        export_at_end = True

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        trainer = Exporting(MiniConfig(out_dir=str(tmp_path), steps=2),
                            on_step=lambda record: record["step"] == 2 and os.kill(os.getpid(), signal.SIGINT))
        with pytest.raises(KeyboardInterrupt, match="SIGINT"):
            trainer.train()
        assert [s for s, _ in ck.list_checkpoints(tmp_path / "checkpoints")] == [2]
        assert (tmp_path / "final" / "config.json").is_file()
    finally:
        signal.signal(signal.SIGINT, previous)
