"""Training checkpoints: atomic saves, a "latest" pointer, clear errors, exact resume.

A checkpoint is one `torch.save` file, `<dir>/step_00000100.pt`: a dict of plain data and tensors
(see `training_state`), so it loads with `torch.load(weights_only=True)` and no pickle code runs.
`<dir>/latest` is a JSON pointer {"file", "step", "bytes", "sha256"} to the newest complete
checkpoint, and `<file>.sha256` beside each one lets a load refuse, by name, a file whose bytes
changed since it was saved (a flipped bit, a disk error, another writer).

Every file is written atomically (`paths.atomic_write`), the checkpoint before the pointer that
names it, so a kill at any moment leaves `latest` naming a whole checkpoint; a failed save (a full
disk, say) leaves both as they were and says so, and old checkpoints go only after a save succeeded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import os
import re
import time
from pathlib import Path

import torch

from .errors import CheckpointError
from .model import ROLLOUT_TEMPERATURE_KEY, GPT, config_from_dict
from .paths import TMP_PREFIX, atomic_write
from .task_vocab import TaskVocab
from .train_utils import rng_state, set_rng_state, unwrap

log = logging.getLogger(__name__)

FORMAT = "rookworld-checkpoint"
VERSION = 1
POINTER = "latest"
_NAME = re.compile(r"^step_(\d+)\.pt$")


class CheckpointSaveError(CheckpointError, OSError):
    """Saving failed; the previous checkpoint and the latest pointer are untouched."""


class CheckpointLoadError(CheckpointError, ValueError):
    """A checkpoint file is missing, truncated, corrupt or not a checkpoint of ours."""


# --- Writing

class _RecordingFile:
    """A file for torch.save that remembers the OSError of a failed write: torch's zip writer reports
    it as "[enforce fail at inline_container.cc] unexpected pos", which names neither the cause nor
    a full disk."""

    def __init__(self, f):
        self.f, self.error = f, None

    def __getattr__(self, name):  # fileno, tell, ...: the file's own
        return getattr(self.f, name)

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except OSError as exc:
            self.error = self.error or exc
            raise

    def write(self, data):
        return self._call(self.f.write, data)

    def flush(self):
        return self._call(self.f.flush)


def _check_directory(directory: Path) -> None:
    """Refuse a checkpoint directory below a path that is a file, naming that file."""
    for parent in (directory, *directory.parents):
        if parent.exists():
            if not parent.is_dir():
                raise CheckpointError(f"{parent} is a file, not a directory: checkpoints go to {directory}; "
                                          "choose another --out (or move the file)")
            return


# --- Finding checkpoints

def checkpoint_path(directory: str | os.PathLike, step: int) -> Path:
    return Path(directory) / f"step_{step:08d}.pt"


def list_checkpoints(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """(step, path) of every finished checkpoint file in `directory`, oldest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in directory.iterdir() if (m := _NAME.match(p.name)) and p.is_file())


def _read_pointer(directory: Path) -> dict | None:
    pointer = directory / POINTER
    try:
        info = json.loads(pointer.read_text())
        if not isinstance(info, dict) or not isinstance(info.get("file"), str):
            raise ValueError("missing 'file'")
        return info
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        _check_directory(directory)
        raise
    except (OSError, ValueError) as exc:
        raise CheckpointLoadError(f"{pointer}: unreadable latest-checkpoint pointer ({exc}); "
                                  f"delete it to fall back to the newest step_*.pt file") from None


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The checkpoint `latest` names; without a pointer, the highest-step file; None if there is none."""
    directory = Path(directory)
    info = _read_pointer(directory)
    if info is not None:
        return directory / info["file"]
    found = list_checkpoints(directory)
    return found[-1][1] if found else None


# --- Save and load

def save_checkpoint(directory: str | os.PathLike, state: dict, *, keep_last: int = 2) -> Path:
    """Write `state` (see `training_state`) as `<directory>/step_<step>.pt` and point `latest` at it.

    keep_last: how many checkpoints to keep (older ones are deleted after this save succeeded);
    0 keeps them all. Raises CheckpointSaveError, with the previous checkpoint intact, on failure.
    """
    directory = Path(directory)
    step = int(state["step"])
    path = checkpoint_path(directory, step)
    previous = None
    sinks: list[_RecordingFile] = []  # torch's zip writer turns a failed write (ENOSPC) into "unexpected pos"
    _check_directory(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        previous = latest_checkpoint(directory)
        _remove(directory.glob(f"{TMP_PREFIX}*"))  # left by a save that was killed (one writer per directory)
        t0 = time.perf_counter()
        def write(f):
            sinks.append(_RecordingFile(f))
            torch.save(state, sinks[-1])

        atomic_write(path, write)
        size, digest = path.stat().st_size, file_sha256(path)
        atomic_write(_digest_path(path), lambda f: f.write(f"{digest}  {path.name}\n".encode()))
        pointer = json.dumps({"file": path.name, "step": step, "bytes": size, "sha256": digest}) + "\n"
        atomic_write(directory / POINTER, lambda f: f.write(pointer.encode()))
    except CheckpointLoadError as exc:  # an unreadable pointer (a RuntimeError too, so first): refuse to guess what is latest
        raise CheckpointSaveError(f"could not save checkpoint {path}: {exc}") from exc
    except (OSError, RuntimeError) as exc:  # torch's zip writer reports I/O failures as RuntimeError
        kept = f"the previous checkpoint {previous} is intact and still the latest" if previous and previous.exists() \
            else "no earlier checkpoint exists in that directory"
        cause = next((sink.error for sink in sinks if sink.error is not None), exc)
        reason = cause.strerror if isinstance(cause, OSError) and cause.strerror else str(cause)
        if isinstance(cause, OSError) and cause.errno == errno.ENOSPC:
            reason, kept = "No space left on device", f"{kept}; free some space and run the same command again to resume"
        err = CheckpointSaveError(f"could not save checkpoint {path}: {reason}; {kept}")
        err.errno = cause.errno if isinstance(cause, OSError) else None
        raise err from exc
    log.info("saved checkpoint %s (%.1f MB, %.2fs)", path, size / 1e6, time.perf_counter() - t0)
    if keep_last > 0:  # the newest up to this one: a stray file named past it (step_99.pt) neither counts nor goes
        for old in [p for s, p in list_checkpoints(directory) if s <= step][:-keep_last]:
            _remove((old, _digest_path(old)))
    return path


def weights_fingerprint(model: GPT, sample: int = 4096) -> str:
    """A short hash of a model's weights as its export holds them (names, shapes and a strided sample
    of at most `sample` values per tensor; the tied head and vocabulary padding left out): a run's
    starting model, so that a resume into the same out_dir can tell it is handed another one."""
    h = hashlib.sha256()
    for key, tensor in unwrap(model).exported_tensors():
        flat = tensor.detach().reshape(-1)
        h.update(f"{key}{tuple(tensor.shape)}".encode())
        h.update(flat[:: max(1, flat.numel() // sample)].to("cpu", torch.float32).numpy().tobytes())
    return h.hexdigest()[:16]


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _saved_digests(path: Path) -> set[str]:
    """The SHA-256s recorded when `path` was saved: its .sha256 file's, and the `latest` pointer's when
    it names `path` (empty for older checkpoints). Two records: one damaged record does not condemn an
    intact file, and one lost record does not let a damaged file pass."""
    found = set()
    with contextlib.suppress(OSError, IndexError):
        found.add(_digest_path(path).read_text().split()[0])
    with contextlib.suppress(CheckpointLoadError, OSError):
        info = _read_pointer(path.parent) or {}
        if info.get("file") == path.name and isinstance(info.get("sha256"), str):
            found.add(info["sha256"])
    return found


def intact(path: Path) -> bool:
    """Whether `path` has the bytes it was saved with: its SHA-256 is one recorded for it (see
    _saved_digests), or nothing was recorded (an older checkpoint)."""
    saved = _saved_digests(path)
    return not saved or file_sha256(path) in saved


def _remove(paths) -> None:
    """Delete files, leaving alone any that cannot be deleted: cleanup must not fail a save."""
    for p in paths:
        with contextlib.suppress(OSError):
            p.unlink()


def load_checkpoint(path: str | os.PathLike) -> dict:
    """Load a checkpoint file, or the latest one of a checkpoint directory, and check its format.

    Raises CheckpointLoadError naming the file when it is missing, truncated, corrupt, or not ours.
    """
    path = Path(path)
    expected_bytes = None
    if path.is_dir():
        expected_bytes = (_read_pointer(path) or {}).get("bytes")
        target = latest_checkpoint(path)
        if target is None:
            raise CheckpointLoadError(f"{path}: no checkpoint in this directory (no '{POINTER}' pointer, no step_*.pt)")
        path = target
    if not path.is_file():
        raise CheckpointLoadError(f"{path}: checkpoint file not found{_others(path)}")
    size = path.stat().st_size
    if expected_bytes is not None and size != expected_bytes:
        raise CheckpointLoadError(f"{path}: {size} bytes on disk, {expected_bytes} when it was saved: the file "
                                  f"was truncated or overwritten{_others(path)}")
    if not intact(path):
        raise CheckpointLoadError(f"{path}: its bytes changed since it was saved (its SHA-256 is not the one "
                                  f"recorded in {_digest_path(path).name} or {POINTER}): a corrupted file, not "
                                  f"loaded{_others(path)}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # zip/pickle errors come in many types; all mean the same here
        raise CheckpointLoadError(f"{path}: corrupt or incomplete checkpoint ({_reason(exc)}){_others(path)}") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointLoadError(f"{path}: not a RookWorld training checkpoint (no format={FORMAT!r} marker); "
                                  f"a Hugging Face model directory loads with GPT.from_pretrained instead")
    if ckpt.get("version", 0) > VERSION:
        raise CheckpointLoadError(f"{path}: checkpoint format version {ckpt['version']} is newer than this "
                                  f"code's {VERSION}; update rookworld_lib")
    if missing := [k for k in ("step", "model", "model_config") if k not in ckpt]:
        raise CheckpointLoadError(f"{path}: checkpoint lacks {', '.join(missing)}")
    return ckpt


def _reason(exc: Exception) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    detail = next((line for line in lines if "WeightsUnpickler error" in line), lines[0] if lines else "")
    return f"{type(exc).__name__}: {detail[:300]}"


def _others(path: Path) -> str:
    """Where to go from a checkpoint that cannot be loaded: the newest intact one beside it (its
    digest checked) and how to resume from it."""
    named = None
    with contextlib.suppress(CheckpointLoadError, OSError):
        named = (_read_pointer(path.parent) or {}).get("file")
    for step, other in reversed(list_checkpoints(path.parent)):
        if other != path and intact(other):
            # the pointer goes too where it names the bad (or lost) file; one that names another stays
            gone = [n for n in (path.name, POINTER) if (path.parent / n).exists() and (n != POINTER or named in (None, path.name))]
            return (f"; the newest intact checkpoint there is {other.name} (step {step}): to resume from it, delete "
                    f"{' and '.join(gone)} in {path.parent} and run the same command again")
    if not path.exists() and not (path.parent / POINTER).exists():  # a mistyped path: nothing to start over from
        return ""
    return (f"; no other intact checkpoint is in {path.parent}: to train from the start, move {path.parent} away "
            "and run the same command again")


# --- Training state <-> checkpoint dict

def training_state(*, step: int, model: torch.nn.Module, optimizer=None, scheduler=None, data=None,
                   config=None, extra: dict | None = None, kind: str = "sft") -> dict:
    """Everything a loop needs to continue exactly from `step`, as a checkpoint dict.

    model may be torch.compile'd (its original module is saved); optimizer, scheduler and data
    are anything with state_dict(); config is a dataclass or a dict; the RNG states of this
    process are captured now, so call this at a step boundary.
    """
    raw = unwrap(model)
    return {
        "format": FORMAT,
        "version": VERSION,
        "kind": kind,
        "step": int(step),
        "model": raw.state_dict(),
        "model_config": dataclasses.asdict(raw.config),
        # what the model carries for its task (GPT.meta, the prompt prefix): an export of this checkpoint keeps it
        "model_meta": dict(getattr(raw, "meta", {})), "prompt_prefix": getattr(raw, "prompt_prefix", None),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "scheduler": scheduler.state_dict() if scheduler is not None else None,
        "data": data.state_dict() if data is not None else None,
        "rng": rng_state(),
        "config": dataclasses.asdict(config) if dataclasses.is_dataclass(config) else config,
        "extra": extra or {},
        "torch_version": str(torch.__version__),
        "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def restore_training_state(ckpt: dict, *, model: torch.nn.Module, optimizer=None, scheduler=None, data=None) -> int:
    """Load a checkpoint dict into live objects (strictly) and return its step.

    The RNG states are restored last, so nothing done while rebuilding the objects (a model's
    random init, say) shifts the random stream the resumed run sees.
    """
    unwrap(model).load_state_dict(ckpt["model"], strict=True)
    for name, obj in (("optimizer", optimizer), ("scheduler", scheduler), ("data", data)):
        if obj is None:
            continue
        if ckpt.get(name) is None:
            raise CheckpointLoadError(f"checkpoint at step {ckpt['step']} holds no {name} state to resume from")
        obj.load_state_dict(ckpt[name])
    if ckpt.get("rng") is not None:
        set_rng_state(ckpt["rng"])
    return int(ckpt["step"])


def model_from_checkpoint(path: str | os.PathLike):
    """The full GPT-2-vocabulary model a checkpoint file (or a run's checkpoint directory: its
    latest) holds, on CPU; an SFT run over the task vocabulary is expanded back to every GPT-2 token."""
    ckpt = load_checkpoint(Path(path))  # names the file it cannot load
    model = GPT(config_from_dict({**ckpt["model_config"], "gradient_checkpointing": False}))
    model.load_state_dict(ckpt["model"], strict=True)
    model.meta = dict(ckpt.get("model_meta") or {})  # checkpoints before 2026-11-28 carry none: the defaults
    if ckpt.get("kind") == "grpo" and isinstance(ckpt.get("config"), dict) and "temperature" in ckpt["config"]:
        # as GRPO's own export records it: an evaluation samples pass@1 at the rollout temperature
        model.meta[ROLLOUT_TEMPERATURE_KEY] = ckpt["config"]["temperature"]
    if ckpt.get("prompt_prefix") is not None:
        model.prompt_prefix = ckpt["prompt_prefix"]
    extra = ckpt.get("extra", {})
    if ids := extra.get("task_vocab"):  # a run over a task vocabulary (SFT or GRPO): the full GPT-2
        outside = None
        if base := extra.get("task_vocab_base"):  # GRPO's opt-in on a model that marks no vocabulary
            if not Path(base, "config.json").is_file():
                raise CheckpointLoadError(f"{path}: a GRPO run over a task vocabulary of the model in {base!r}; "
                                          "exporting it needs that model's other embedding rows, and it is not there")
            outside = GPT.from_pretrained(base).transformer.wte.weight.detach()
        model = TaskVocab(ids).expand(model, outside)
    return model


def export_hf(source, directory: str | os.PathLike | None = None) -> Path:
    """Write a model in Hugging Face GPT-2 format (config.json + model.safetensors).

    source: a GPT (possibly compiled) or a checkpoint file/directory. directory defaults to
    `<checkpoint dir>/<checkpoint name>-hf` for a checkpoint source. Returns the directory.
    """
    if isinstance(source, torch.nn.Module):
        model = unwrap(source)
        if directory is None:
            raise ValueError("export_hf: give a directory when exporting a model object")
    else:
        path = Path(source)
        model = model_from_checkpoint(path)
        resolved = latest_checkpoint(path) if path.is_dir() else path
        if directory is None:
            directory = resolved.with_name(resolved.stem + "-hf")
    directory = Path(directory)
    model.save_pretrained(directory)
    return directory
