"""The training scaffold SFT and GRPO share (minGPT's trainer: one loop, extended by subclasses).

A subclass passes the run's length, sets `model`, `optimizer`, `schedule` and `data` (what holds the
data position), and supplies `train_step()` (one step's metrics record). `Trainer` does
the rest, identically for both: device, precision and the torchrun process group (one GPU per
rank, the DDP wrapper); resume checks (kind, settings, the same latest file on every rank); saving
(rank 0 writes, every rank's RNG state gathered) and export; the loop with out_dir's lock, one
metrics line per step (and, unless cfg.report_to is "none", the same scalars in TensorBoard event
files beside it: `tensorboard --logdir runs`), a tqdm bar, periodic checkpoints and the non-finite stop.
Ctrl-C (or SIGTERM) during the loop ends the step under way, saves a checkpoint and then stops
(KeyboardInterrupt), so the same command resumes where it stopped; a second Ctrl-C stops at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from tqdm.contrib.logging import logging_redirect_tqdm

from . import checkpoint as ckpt_lib
from . import distributed
from .config import is_int
from .errors import PEER_STOPPED, NonFiniteError
from .paths import RunDirBusyError, atomic_write, busy_message, keep_aside, run_lock, stamped_name
from .progress import tqdm
from .train_utils import MetricsLogger, NonFiniteGuard, rng_state, set_rng_state, setup_runtime, to_jsonable

log = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
FINAL_DIR = "final"


def wait_past_event_files(out_dir: Path) -> None:
    """Return once a new event file would sort after every one in out_dir. TensorBoard reads the files
    in name order, the name starting with the time in whole seconds: a writer opened in the second of
    an earlier file could sort before it (its counter is not zero-padded: ...pid.10 < ...pid.9), and
    that file's steps would then purge the new one's. A file from a clock ahead of ours: no wait."""
    now = time.time()
    stamps = (int(p.name.split(".")[3]) for p in Path(out_dir).glob("events.out.tfevents.*") if p.name.split(".")[3].isdigit())
    newest = max((s for s in stamps if s <= now), default=0)  # a file from a clock ahead of ours cannot be passed
    while time.time() < newest + 1:
        time.sleep(0.05)


class Trainer:
    """State and loop every training run shares; subclasses add the model, data and step."""

    kind = ""  # checkpoint kind ("sft", "grpo"): a resume refuses another kind's checkpoint
    name = ""  # shown in the progress bar and messages
    metrics_file = "metrics.jsonl"
    log_files: tuple[str, ...] = ()  # more JSON-lines files of step-tagged rows in out_dir, resumed like the metrics
    # config fields a resume may change (the rest must match the checkpoint's run): where it runs and how shown
    resume_may_change = frozenset({"max_nonfinite_in_a_row", "checkpoint_interval", "keep_checkpoints", "out_dir",
                                   "resume", "device", "deterministic", "progress"})
    stop_hint = ""  # what to try after a non-finite stop

    def __init__(self, cfg, total_steps: int, *, on_step: Callable[[dict], None] | None = None):
        """cfg: the run's config (out_dir, device, dtype, resume, checkpoint and non-finite settings)."""
        self.cfg = cfg
        self.total_steps = total_steps
        self.data = None  # the object whose state_dict() holds the data position (None: nothing to restore)
        if on_step is not None and not callable(on_step):  # else it failed after the first step had trained
            raise ValueError(f"on_step must be a function f(record: dict), got {type(on_step).__name__} {on_step!r:.60}")
        self.on_step = on_step
        self.out_dir = Path(cfg.out_dir) if cfg.out_dir else None
        self.ckpt_dir = self.out_dir / CHECKPOINT_DIR if self.out_dir else None
        self.runtime = setup_runtime(cfg.device, cfg.dtype, deterministic=getattr(cfg, "deterministic", False))
        self.dist = distributed.init_from_env(self.runtime.device.type)
        if self.dist.world_size > 1 and self.runtime.device.type == "cuda":  # one GPU per process
            self.runtime = dataclasses.replace(self.runtime, device=torch.device("cuda", self.dist.local_rank))
        self.guard = NonFiniteGuard(cfg.max_nonfinite_in_a_row)
        self.step = 0
        self.history: list[dict] = []
        self.last_checkpoint: Path | None = None
        self.resumed_from: Path | None = None
        self.ddp = None
        self.closed = False
        self.logs: dict[str, MetricsLogger] = {}  # rank 0, during train(): metrics_file and log_files, open
        self.tensorboard = None  # rank 0, during train(): the SummaryWriter of out_dir (report_to "tensorboard")

    # -- what a subclass provides ---------------------------------------------------------

    def train_step(self) -> dict:
        raise NotImplementedError

    def checkpoint_extra(self) -> dict:
        """What this loop adds to a checkpoint's `extra` (restored by `restore_extra`)."""
        return {}

    def restore_extra(self, extra: dict) -> None:
        pass

    def resume_differences(self, ckpt: dict) -> dict[str, tuple]:
        """Further {what: (saved, now)} that forbid resuming `ckpt` (beyond the config's fields)."""
        return {}

    def resolved_settings(self) -> dict:
        """Config fields as this run resolved them, {field: value}; recorded in every checkpoint, and a
        resume compares these rather than the fields as written (dtype "auto" is "fp32" on a CPU)."""
        return {"dtype": "fp32" if self.runtime.amp_dtype is None else "bf16"}

    def after_step(self, record: dict) -> None:
        """Runs after each step, before its record is logged (SFT measures the val loss here)."""

    def postfix(self, record: dict) -> str:
        return ""

    export_at_end = False  # write the Hugging Face export when the run reaches total_steps
    settings_file: str | None = None  # the run's settings as JSON in out_dir (sft_config.json, grpo_config.json)

    def settings(self) -> dict:
        """What settings_file records: the config's fields (a loop adds what else decides the run)."""
        return dataclasses.asdict(self.cfg)

    @property
    def fresh(self) -> bool:
        """Nothing trained or resumed yet: a fresh start of the run."""
        return self.step == 0 and self.resumed_from is None and not self.history

    def my_rows(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a global batch: rows r, r + W, r + 2W, ... (all of them in one process)."""
        return t[self.dist.rank::self.dist.world_size].contiguous()

    def rank_mean(self, value: float) -> float:
        """The mean of `value` over all ranks (itself in one process)."""
        return distributed.all_reduce_sum(value) / self.dist.world_size

    # -- resume -----------------------------------------------------------------------------

    def find_checkpoint(self) -> dict | None:
        """The checkpoint this run continues from, checked to be this run's; None for a fresh start.

        Every rank must see the same latest file (out_dir on a filesystem all nodes share).
        """
        if self.ckpt_dir is None:
            return None
        if self.dist.world_size > 1 and (busy := distributed.broadcast_object(
                busy_message(self.out_dir) if self.dist.is_main and self.out_dir is not None else None)):
            raise RunDirBusyError(busy)  # every rank: one line; the ranks could see another run's saves apart
        latest = ckpt_lib.latest_checkpoint(self.ckpt_dir)
        if self.dist.world_size > 1:
            mine = None if latest is None else latest.name
            if mine != (main_sees := distributed.broadcast_object(mine)):
                raise ValueError(f"rank {self.dist.rank} sees latest checkpoint {mine} in {self.ckpt_dir}, rank 0 "
                                 f"sees {main_sees}: under torchrun out_dir must be on a filesystem that every node "
                                 "shares")
        if latest is None:
            if self.out_dir is not None and (self.out_dir / FINAL_DIR).exists():  # checkpoints deleted, say
                raise ValueError(f"{self.out_dir} holds an earlier run's exported model ({self.out_dir / FINAL_DIR}) but "
                                 "no checkpoint to resume: a new run would replace it and that run's metrics; choose "
                                 f"another out_dir (--out), or delete {self.out_dir / FINAL_DIR} to start over there")
            return None
        if not self.cfg.resume:
            raise ValueError(f"{self.ckpt_dir} already holds checkpoints of an earlier run (latest {latest.name}); "
                             "resume=True (--resume) continues it; to start over, delete that directory or choose "
                             "another out_dir (--out)")
        ckpt = ckpt_lib.load_checkpoint(latest)
        if ckpt.get("kind") != self.kind:
            raise ValueError(f"{latest} is a {ckpt.get('kind')!r} checkpoint, not a {self.name} one; use another "
                             "out_dir (--out)")
        now = json.loads(json.dumps(dataclasses.asdict(self.cfg)))  # tuples -> lists, as stored
        saved = json.loads(json.dumps(ckpt.get("config") or {}))
        if "policy_fraction" in saved and "task_weights" in now:
            raise ValueError(f"{latest} was written before task_weights replaced policy_fraction (2026-11-28): this "
                             "version cannot continue it (its data order differs); start a new run in another "
                             "out_dir, or finish this one with the version that wrote it (git checkout febfa57)")
        # a field the checkpoint recorded as resolved is compared resolved (an older checkpoint: as written)
        mine = self.resolved_settings()
        for k, was in ((ckpt.get("extra") or {}).get("resolved") or {}).items():
            if k in now and k in mine:
                saved[k], now[k] = was, mine[k]
        diff = {}
        for k, v in now.items():
            if k in self.resume_may_change or (saved.get(k) == v and k != "task_weights"):
                continue
            if k == "task_weights":  # in order: the order of the tasks orders the pools, so another is another stream
                if list((saved.get(k) or {}).items()) != list((v or {}).items()):
                    diff[k] = (saved.get(k), v)
                continue
            if isinstance(v, dict) and isinstance(saved.get(k), dict):  # a nested config: name its changed fields
                diff.update({f"{k}.{f}": (saved[k].get(f), v.get(f)) for f in sorted(saved[k].keys() | v.keys())
                             if saved[k].get(f) != v.get(f)})
            else:
                diff[k] = (saved.get(k), v)
        diff.update(self.resume_differences(ckpt))
        if diff:
            changes = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in diff.items())
            err = ValueError(f"{self.ckpt_dir} holds a checkpoint of a run with other settings ({changes}); use the "
                             "same settings to resume it, or another out_dir (--out) for a new run")
            err.resume_diff = diff  # field -> (saved, now): a command line names the options that resume it
            raise err
        if ckpt["step"] > self.total_steps:
            raise ValueError(f"{latest} is at step {ckpt['step']}, past the {self.total_steps} steps this {self.name} run "
                             "is set to: nothing to train; set more steps to continue it, or another out_dir (--out) for a new run")
        ckpt["path"] = latest
        return ckpt

    def restore(self, ckpt: dict) -> None:
        """Continue from `ckpt` (see find_checkpoint): weights, optimizer, schedule, data, RNGs."""
        self.step = ckpt_lib.restore_training_state(ckpt, model=self.model, optimizer=self.optimizer,
                                                    scheduler=self.schedule, data=self.data)
        extra = ckpt["extra"]
        self.guard.load_state_dict(extra["guard"])
        self.restore_extra(extra)
        self.last_checkpoint = self.resumed_from = ckpt["path"]
        saved_w, W = extra.get("world_size", 1), self.dist.world_size
        # said once the run holds out_dir (train): a run refused as busy resumes nothing
        self._resume_note = ("%s resumed from %s at step %d%s", self.name, ckpt["path"], self.step,
                             "" if saved_w == W else f" (saved at world size {saved_w}, now {W})")

    def seed_rank(self, ckpt: dict | None, seed: int) -> None:
        """Give ranks > 0 their own RNG stream (dropout masks differ across ranks' rows); rank 0 keeps
        the single-process one. Exact on a resume at the saved world size, else derived from (seed, step, rank)."""
        if self.dist.rank == 0:
            return
        saved = (ckpt or {}).get("extra", {}).get("rank_rng")
        if saved is not None and len(saved) == self.dist.world_size:
            set_rng_state(saved[self.dist.rank])
        else:
            torch.manual_seed(seed * 1_000_003 + self.step * 7_919 + self.dist.rank)

    # -- torchrun -------------------------------------------------------------------------

    def wrap_ddp(self, model: torch.nn.Module) -> torch.nn.Module:
        """model wrapped in DistributedDataParallel under torchrun (itself otherwise).

        Buffers are not synced in forward: they are constants (no batch norm), so eval needs no collective."""
        if self.dist.world_size == 1:
            return model
        ids = [self.runtime.device.index] if self.runtime.device.type == "cuda" else None
        # torch 2.13 renamed broadcast_buffers (deprecated, with a FutureWarning) to forward_sync_buffers
        no_sync = ("forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP).parameters
                   else "broadcast_buffers")
        self.ddp = DDP(model, device_ids=ids, **{no_sync: False})
        return self.ddp

    def close(self) -> None:
        """Drop the DDP wrapper; call it before `distributed.cleanup()`. Idempotent.

        Under gloo a wrapper that outlives the process group joins gloo's threads in its destructor
        while holding the GIL they need, and the process hangs at exit (torch 2.13). A closed
        multi-process trainer refuses to train (its gradients would no longer be averaged).
        """
        self.ddp = None
        self.closed = True

    # -- checkpoints ------------------------------------------------------------------------

    def save(self) -> Path | None:
        """Checkpoint the run at a step boundary; returns the file written (None without out_dir).

        Every rank calls it (RNG states are gathered); rank 0 writes, and a failed write raises
        CheckpointSaveError on every rank. The metrics written so far are fsynced first, so a power
        cut never loses a record that the latest checkpoint covers (a resume does not redo it)."""
        if self.ckpt_dir is None:
            return None
        for log_file in self.logs.values():
            log_file.sync()
        W = self.dist.world_size
        extra = {"guard": self.guard.state_dict(), "world_size": W, "resolved": self.resolved_settings(),
                 **self.checkpoint_extra()}
        if W > 1:
            extra["rank_rng"] = distributed.all_gather_objects(rng_state())
        error, path = None, ckpt_lib.checkpoint_path(self.ckpt_dir, self.step)
        if self.dist.is_main:
            state = ckpt_lib.training_state(step=self.step, model=self.model, optimizer=self.optimizer,
                                            scheduler=self.schedule, data=self.data, config=self.cfg,
                                            extra=extra, kind=self.kind)
            try:
                path = ckpt_lib.save_checkpoint(self.ckpt_dir, state, keep_last=self.cfg.keep_checkpoints)
            except ckpt_lib.CheckpointSaveError as exc:
                error = exc
        if W > 1:
            message = distributed.broadcast_object(None if error is None else str(error))
            if message is not None and error is None:
                error = ckpt_lib.CheckpointSaveError(message)  # rank 0's, word for word: said once (errors.py)
        if error is not None:
            raise error
        self.last_checkpoint = path
        return path

    def export(self, directory: str | os.PathLike | None = None) -> Path:
        """The model in Hugging Face GPT-2 format, by default <out_dir>/final (rank 0 writes)."""
        if directory is None:
            if self.out_dir is None:
                raise ValueError(f"{self.name} export needs a directory when the trainer has no out_dir")
            directory = self.out_dir / FINAL_DIR
        directory = Path(directory)
        if self.dist.is_main:
            ckpt_lib.export_hf(self.export_model(), directory)
        distributed.barrier()
        return directory

    def export_model(self) -> torch.nn.Module:
        """What `export` writes: the trained model (a loop may expand it first)."""
        return self.model

    # -- the loop ---------------------------------------------------------------------------

    def train(self, until: int | None = None) -> list[dict]:
        """Train to total_steps, or stop after step `until` (a checkpoint is saved where it stops).

        Raises NonFiniteError after max_nonfinite_in_a_row skipped updates in a row (metrics and
        checkpoints stay on disk), RunDirBusyError when another run holds out_dir's lock."""
        if until is not None and not is_int(until, 1):
            raise ValueError(f"{type(self).__name__}.train: until must be a step >= 1 (or None: to the end), got {until!r}")
        if self.closed and self.dist.world_size > 1:
            raise RuntimeError(f"{type(self).__name__}.train: this trainer was closed (its DDP wrapper is gone); "
                               "make a new one")
        with self._out_dir_lock():
            self._check_checkpoint_is_ours()
            if note := self.__dict__.pop("_resume_note", None):
                log.info(*note)
            return self._loop(until)

    @contextlib.contextmanager
    def _out_dir_lock(self):
        """Rank 0 holds out_dir's lock (paths.run_lock) while the ranks train; when another run holds it,
        every rank raises the same RunDirBusyError (said once), none going on to check its checkpoints."""
        busy = None
        with contextlib.ExitStack() as stack:
            if self.out_dir is not None and self.dist.is_main:
                try:
                    stack.enter_context(run_lock(self.out_dir))
                except RunDirBusyError as exc:
                    busy = str(exc)
            if self.out_dir is not None and self.dist.world_size > 1:
                busy = distributed.broadcast_object(busy)
            if busy:
                raise RunDirBusyError(busy)
            yield

    def _check_checkpoint_is_ours(self) -> None:
        """Refuse to go on where out_dir's latest checkpoint is not the one this trainer left (another
        trainer saved there since: a cell run again on an old trainer would cut that run's logs back)."""
        if self.ckpt_dir is None:  # every rank sees out_dir (torchrun asks for a shared filesystem)
            return
        latest, mine = ckpt_lib.latest_checkpoint(self.ckpt_dir), self.last_checkpoint
        if latest is not None and (mine is None or latest.name != mine.name):
            raise ValueError(f"{self.ckpt_dir}: another run saved {latest.name} there after this trainer "
                             f"{f'left {mine.name}' if mine else 'was made'}; going on would cut that run's metrics "
                             f"back to step {self.step}: make a new {type(self).__name__} to continue from it")

    def start(self, metrics) -> None:
        """Runs once before the first step of a call to train() (SFT logs its step-0 val loss)."""

    def _loop(self, until: int | None) -> list[dict]:
        total = self.total_steps
        target = total if until is None else min(until, total)
        main, show = self.dist.is_main, self.cfg.progress and self.dist.is_main
        with contextlib.ExitStack() as stack:
            stack.enter_context(self.runtime.backend_flags())
            stack.callback(self._close_logs)
            if main and self.out_dir:  # rank 0 writes; a resume first drops the records after its checkpoint
                self._open_logs(stack)
            metrics = self.logs.get(self.metrics_file)
            bar = stack.enter_context(tqdm(total=total, initial=self.step, desc=self.name, disable=not show,
                                           dynamic_ncols=True))
            if show:
                stack.enter_context(logging_redirect_tqdm())  # log lines above the bar, not through it
            if self.step < target:
                self.start(metrics)
            stop = stack.enter_context(_stop_after_the_step())
            stopping = False
            while self.step < target:
                record = self.train_step()
                self.after_step(record)
                record = self.record(metrics, record)
                bar.update(1)
                bar.set_postfix_str(self.postfix(record), refresh=False)
                if self.guard.tripped:
                    raise self._nonfinite_error()
                interval = self.cfg.checkpoint_interval
                stopping = bool(distributed.all_reduce_sum(float(bool(stop)))) if self.dist.world_size > 1 else bool(stop)
                if (interval > 0 and self.step % interval == 0) or self.step == target or stopping:
                    self.save()
                if stopping and self.step < target:  # every rank alike (the flag is summed over ranks)
                    log.warning("%s stopped after step %d (%s)%s", self.name, self.step, stop[0] if stop else PEER_STOPPED,
                                f"; checkpoint {self.last_checkpoint}" if self.last_checkpoint else "")
                    raise KeyboardInterrupt(stop[0] if stop else PEER_STOPPED)  # the signal's name: the CLI says which
        if self.step >= total and self.export_at_end:
            self.export()
        # a signal in the run's last step (or, in one process, in the save or the log closing): the run is
        # saved and exported, and the caller stops too (under torchrun every rank decided alike in the loop)
        if stopping or (self.dist.world_size == 1 and stop):
            raise KeyboardInterrupt(stop[0] if stop else PEER_STOPPED)
        return self.history

    def _open_logs(self, stack: contextlib.ExitStack) -> None:
        resume_step = None if self.fresh else self.step
        for name in (self.metrics_file, *self.log_files):
            path = self.out_dir / name
            if self.fresh and path.is_file() and path.stat().st_size:  # an earlier run's, with no checkpoint left
                kept = keep_aside(path)  # a fresh start empties the file: its records are all that may be left of that run
                log.warning("%s: an earlier run's records, with no checkpoint to resume, are kept as %s; this run "
                            "starts afresh", path, kept.name)
            self.logs[name] = stack.enter_context(MetricsLogger(self.out_dir / name, fresh=self.fresh,
                                                                resume_step=resume_step,
                                                                every_step=name == self.metrics_file))
        if self.settings_file:  # atomic: a kill never leaves half of it
            text = json.dumps(to_jsonable(self.settings()), indent=2) + "\n"
            path = self.out_dir / self.settings_file
            if self.fresh and path.is_file() and path.read_text(errors="replace") != text:  # beside its kept records
                log.warning("%s: the settings of an earlier run there are kept as %s", path, keep_aside(path).name)
            atomic_write(path, lambda f: f.write(text.encode()))
        report = getattr(self.cfg, "report_to", "tensorboard") == "tensorboard"
        if self.fresh and (events := list(self.out_dir.glob("events.out.tfevents.*"))):
            # an earlier run's curves go to a folder of their own, which TensorBoard shows as its own run: its
            # default loader (tensorboard-data-server) ignores purge_step, and showed them as this run's
            aside = stamped_name(self.out_dir / "tensorboard", max(p.stat().st_mtime for p in events))
            aside.mkdir()
            for p in events:
                p.replace(aside / p.name)
            log.warning("%s: an earlier run's TensorBoard events, with no checkpoint to resume, are kept in %s; this "
                        "run starts afresh", self.out_dir, aside.name)
        if report or any(self.out_dir.glob("events.out.tfevents.*")):
            from torch.utils.tensorboard import SummaryWriter  # heavy (tensorboard): only where event files are

            # purge_step hides the events of earlier writers from this step on: a resume redoes the steps
            # after its checkpoint (as the metrics file drops them) and a fresh run replaces everything. With
            # report_to="none" (a resume may turn it off) the marker alone: the earlier writers' steps from
            # here on were shown beside the metrics file's redone ones.
            wait_past_event_files(self.out_dir)
            writer = SummaryWriter(str(self.out_dir), purge_step=0 if resume_step is None else resume_step + 1,
                                   flush_secs=10)
            if report:
                self.tensorboard = stack.enter_context(writer)
            else:
                writer.close()

    def _close_logs(self) -> None:
        self.logs, self.tensorboard = {}, None

    def record(self, metrics: MetricsLogger | None, record: dict) -> dict:
        """Log a step's record (rank 0 writes it; its numbers also to TensorBoard), keep it in history
        as written, call on_step (every record: SFT's step 0, the val loss before training, included)."""
        record = metrics.log(record) if metrics is not None else to_jsonable(record)
        if self.tensorboard is not None:  # every number of the record, a flag as 0 or 1 (null stays out)
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)):
                    self.tensorboard.add_scalar(k, float(v), record["step"])
        self.history.append(record)
        if self.on_step is not None and self.dist.is_main:
            self.on_step(record)
        return record

    def _nonfinite_error(self) -> NonFiniteError:
        where = (f"the latest checkpoint is {self.last_checkpoint}" if self.last_checkpoint
                 else "no checkpoint had been saved yet")
        metrics = f"; metrics are in {self.out_dir / self.metrics_file}" if self.out_dir else ""
        return NonFiniteError(f"{self.name} stopped at step {self.step}: {self.guard.describe()}. Skipped updates "
                              f"leave the parameters untouched and nothing was saved after them; {where}{metrics}. "
                              f"{self.stop_hint}".rstrip())


def check_export_spares(source: str | os.PathLike | None, out_dir: str | os.PathLike | None, owner: str) -> None:
    """Refuse an out_dir whose export (<out_dir>/final) is, or holds, the model the run starts from:
    the export would overwrite it."""
    if source and out_dir:
        final, start = (Path(out_dir) / FINAL_DIR).resolve(), Path(source).resolve()
        if start == final or final in start.parents:
            raise ValueError(f"{owner}: the run would export into {final}, which holds the model it starts from "
                             f"({source}), and overwrite it; choose another out_dir (--out)")


@contextlib.contextmanager
def _stop_after_the_step():
    """A list that Ctrl-C (SIGINT) or SIGTERM fills with the signal's name instead of stopping the
    process mid-step; the loop saves and stops after the step. The first signal puts SIGINT's previous
    handler back, so a second Ctrl-C raises at once; a later SIGTERM (a shutdown's next signal) is only
    recorded, so the save goes on. Off the main thread (no signal handlers there): inert."""
    requested: list[str] = []
    if threading.current_thread() is not threading.main_thread():
        yield requested
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def restore(*signals) -> None:
        for s in signals or previous:
            signal.signal(s, previous[s] if previous[s] is not None else signal.SIG_DFL)

    def request(signum, frame) -> None:
        requested.append(signal.Signals(signum).name)
        restore(signal.SIGINT)
        log.warning("%s: stopping after this step to save a checkpoint (Ctrl-C again stops at once)",
                    signal.Signals(signum).name)

    for s, handler in previous.items():
        if handler is not signal.SIG_IGN:  # a signal the process ignores stays ignored
            signal.signal(s, request)
    try:
        yield requested
    finally:
        restore()
