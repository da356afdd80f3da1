"""torch.distributed plumbing for the training loops, launched by torchrun.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; `init_from_env` joins the process group (gloo on
CPU, NCCL on GPU) when WORLD_SIZE > 1 and is a no-op otherwise, so every loop runs unchanged as a
single process. Only rank 0 writes logs and checkpoints (`is_main`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_from_env(device_type: str = "cpu") -> DistInfo:
    """Join the torchrun process group if there is one (gloo for CPU, NCCL for CUDA)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    info = DistInfo(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0")))
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(backend=backend)
    return info


def current() -> DistInfo:
    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))
    return DistInfo()


def is_main() -> bool:
    return current().is_main


def all_gather_objects(obj) -> list:
    """Every rank's `obj`, in rank order (a one-element list without a process group)."""
    info = current()
    if not info.enabled:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj, src: int = 0):
    if not current().enabled:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_reduce_sum(value: float) -> float:
    if not current().enabled:
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item())


def barrier() -> None:
    if current().enabled:
        dist.barrier()


def cleanup() -> None:
    """Destroy the process group.

    Drop DDP wrappers first (`GRPOTrainer.close()`; `train_sft` drops its own): one that outlives
    the group can hang the process at exit under gloo. No barrier here: on an error path the
    peers may be inside another collective, and a rank that exits lets torchrun stop them.
    """
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def torchrun(subcommand: str, argv: list[str], nproc: int) -> int:
    """Run `rookworld <subcommand> argv` under torchrun with nproc processes on this machine."""
    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {nproc}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "rookworld_lib.cli", subcommand, *argv]
    env = dict(os.environ)
    # each process gets its share of the cores; oversubscribed threads slow everything down
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    # torchrun dies with this launcher, even a SIGKILLed one (the kernel sends it SIGTERM, and it
    # stops its workers): no orphans keep writing into the out_dir. Ctrl-C and SIGTERM are passed on.
    proc = subprocess.Popen(cmd, env=env, preexec_fn=_terminate_with_parent)
    forward = lambda signum, frame: proc.send_signal(signum)  # noqa: E731
    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _terminate_with_parent() -> None:
    """In the child, before exec: ask Linux to send SIGTERM when the parent dies (elsewhere: nothing)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def strip_nproc(argv: list[str]) -> tuple[int, list[str]]:
    """Take `--nproc N` (or `--nproc=N`) out of argv; returns (N or 0, the rest)."""
    rest, nproc, i = [], 0, 0
    while i < len(argv):
        a = argv[i]
        if a == "--nproc" and i + 1 < len(argv):
            nproc = int(argv[i + 1])
            i += 2
            continue
        if a.startswith("--nproc="):
            nproc = int(a.split("=", 1)[1])
        else:
            rest.append(a)
        i += 1
    return nproc, rest
