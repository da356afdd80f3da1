"""torch.distributed plumbing for the training loops, launched by torchrun.

torchrun sets RANK, WORLD_SIZE and LOCAL_RANK; `init_from_env` joins the process group (gloo on
CPU, NCCL on GPU) when WORLD_SIZE > 1 and is a no-op otherwise, so every loop runs unchanged as a
single process. Only rank 0 writes logs and checkpoints (`DistInfo.is_main`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from .errors import ERRORS_DIR_ENV, end_with_parent, report_interrupted, worker_errors


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def main_process() -> bool:
    """True outside torchrun and on its rank 0: the process that speaks for the run."""
    return os.environ.get("RANK", "0") == "0"


def init_from_env(device_type: str = "cpu") -> DistInfo:
    """Join the torchrun process group if there is one (gloo for CPU, NCCL for CUDA)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    info = DistInfo(int(os.environ.get("RANK", "0")), world, int(os.environ.get("LOCAL_RANK", "0")))
    if world > 1 and not dist.is_initialized():
        if device_type == "cuda":
            gpus = torch.cuda.device_count()
            if info.local_rank >= gpus:  # one GPU per process: CUDA's "invalid device ordinal" says none of this
                raise NprocError(f"--nproc {world} runs one process per GPU, and this machine has {gpus}: "
                                 f"give --nproc {gpus} or fewer (or --device cpu)")
            torch.cuda.set_device(info.local_rank)
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    return info


def _enabled() -> bool:
    """A process group of more than one rank is up (the collectives below are no-ops otherwise)."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_gather_objects(obj) -> list:
    """Every rank's `obj`, in rank order (a one-element list without a process group)."""
    if not _enabled():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj, src: int = 0):
    """Rank `src`'s `obj` on every rank."""
    if not _enabled():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_reduce_sum(value: float) -> float:
    """The sum of `value` over all ranks."""
    return _all_reduce(value, "SUM")


def all_reduce_max(value: float) -> float:
    """The largest `value` of all ranks (a phase's wall time: its slowest rank's)."""
    return _all_reduce(value, "MAX")


def _all_reduce(value: float, op: str) -> float:
    if not _enabled():
        return float(value)
    # NCCL reduces CUDA tensors only (gloo CPU ones)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
    return float(t.item())


def barrier() -> None:
    if _enabled():
        dist.barrier()


def cleanup() -> None:
    """Destroy the process group (drop DDP wrappers first: see Trainer.close).

    No barrier: on an error path the peers may be inside another collective, and a rank that
    exits lets torchrun stop them."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def torchrun(subcommand: str, argv: list[str], nproc: int, *,
             preflight: Callable[[list[str], int], None] | None = None) -> int:
    """Run `rookworld <subcommand> argv` under torchrun with nproc processes on this machine.

    preflight(argv, nproc) runs first: its ValueError stops the command once, before any worker
    starts. The workers hand their one-line errors here (cli.ERRORS_DIR_ENV); each distinct line is
    printed once, without torchrun's traceback, and the exit status returned."""
    assert nproc >= 1, nproc
    if preflight is not None:
        preflight(list(argv), nproc)
    # each process gets its share of the cores; oversubscribed threads slow everything down (a set value wins)
    env = {"OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // nproc)), **os.environ}
    with tempfile.TemporaryDirectory(prefix="rookworld-errors-") as errors_dir:
        env[ERRORS_DIR_ENV] = errors_dir
        # torchrun's own log directory goes in there too (without --log-dir it leaves a torchelastic_* in /tmp)
        cmd = [sys.executable, "-m", "rookworld_lib.core.distributed", "--standalone", f"--nproc_per_node={nproc}",
               f"--log-dir={errors_dir}", "-m", "rookworld_lib.lab.cli", subcommand, *argv]
        # torchrun dies with this launcher, even a SIGKILLed one (the kernel sends it SIGTERM, and it
        # stops its workers): no orphans keep writing into the out_dir. Ctrl-C and SIGTERM are passed on.
        proc = subprocess.Popen(cmd, env=env, preexec_fn=end_with_parent)
        interrupted = []

        def forward(signum, frame):
            interrupted.append(signum)
            proc.send_signal(signum)

        previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            code = proc.wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
        lines, codes = worker_errors(Path(errors_dir))
    if signal.SIGINT in interrupted:  # Ctrl-C, or SIGINT to this launcher alone: the workers may have seen SIGTERM
        lines = [line for line in lines if not line.startswith(f"rookworld {subcommand}: interrupted")]
    for line in lines:
        print(line, file=sys.stderr, flush=True)
    if signal.SIGINT in interrupted:
        report_interrupted(subcommand)
        return 130
    if codes:
        return max(codes)
    if code < 0:  # torchrun itself killed: its workers get SIGTERM from the kernel (worker_dies_with_agent)
        print(f"rookworld {subcommand}: error: torchrun was killed by {signal.Signals(-code).name}; its workers "
              "stop with it, after their step; the same command resumes from the latest checkpoint",
              file=sys.stderr, flush=True)
    elif code and not lines:
        print(f"rookworld {subcommand}: error: torchrun exited with status {code}; the workers' output above "
              "says why", file=sys.stderr, flush=True)
    return 1 if code < 0 else code


def _launch(argv: list[str]) -> int:
    """`python -m rookworld_lib.core.distributed <torchrun args>`: torchrun, minus the traceback it prints
    when a worker fails (the worker has said why, in one line or with its own traceback)."""
    # torchrun's launcher (the elastic agent): imported by the launching process alone, never by a worker
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    # its loggers set their own levels: quiet each (a worker's failure is said by the worker)
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic"):
            logging.getLogger(name).setLevel(logging.CRITICAL)
    launcher = os.getppid()
    try:
        run(parse_args(argv))
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        if failure.exitcode < 0:  # killed by a signal (the OOM killer's SIGKILL): no worker could say so
            module = "rookworld_lib.lab.cli"  # torchrun() runs `-m rookworld_lib.lab.cli <command> ...`
            _say_killed(argv[argv.index(module) + 1] if module in argv[:-1] else "", rank,
                        signal.Signals(-failure.exitcode).name)
        return failure.exitcode if failure.exitcode > 0 else 128 - failure.exitcode
    except SignalException as exc:  # Ctrl-C or SIGTERM: the agent has stopped the workers
        return 128 + int(exc.sigval)
    except KeyboardInterrupt:
        return 130
    finally:  # the launcher killed (kill -9): nobody will read the workers' lines; its folder goes with it
        if os.getppid() != launcher and os.environ.get(ERRORS_DIR_ENV):
            shutil.rmtree(os.environ[ERRORS_DIR_ENV], ignore_errors=True)
    return 0


def _say_killed(command: str, rank: int, signame: str) -> None:
    """The launcher's line for a worker a signal ended, ahead of its peers' "stopped because another worker
    failed" (a primary error, as a worker's own: errors.worker_errors)."""
    if errors_dir := os.environ.get(ERRORS_DIR_ENV):
        line = (f"rookworld {command}: error: worker rank {rank} was killed by {signame}"
                + (" (out of memory? the kernel's OOM killer sends it)" if signame == "SIGKILL" else "")
                + "; the same command resumes from the latest checkpoint")
        with contextlib.suppress(OSError):
            Path(errors_dir, "rank_launcher.json").write_text(json.dumps({"line": line, "code": 1, "secondary": False}))


def worker_dies_with_agent() -> None:
    """In a worker that torchrun started for distributed.torchrun: SIGTERM (stop after the step, save)
    when torchrun's agent dies, even by SIGKILL; torchrun asks it for itself, its workers do not."""
    if os.environ.get(ERRORS_DIR_ENV) and os.environ.get("RANK") is not None:
        agent = os.getppid()
        end_with_parent()
        if os.getppid() != agent:  # it died before the request was made
            os.kill(os.getpid(), signal.SIGTERM)


class NprocError(argparse.ArgumentTypeError, ValueError):
    """A --nproc value that is not a whole number >= 0."""


def parse_nproc(text) -> int:
    """--nproc's value: a whole number >= 0 (0 and 1 run in this process). Use as argparse `type=`."""
    try:
        n = int(str(text).strip())
    except ValueError:
        raise NprocError(f"--nproc must be a whole number of processes (0 = this process), got {text!r}") from None
    if n < 0:
        raise NprocError(f"--nproc must be >= 0 (0 = this process), got {n}")
    return n


def strip_nproc(argv: list[str]) -> tuple[int, list[str]]:
    """Take `--nproc N` (or `--nproc=N`) out of argv; returns (N or 0, the rest).

    Raises NprocError (a ValueError) for a value that is not a whole number >= 0."""
    rest, nproc, args = [], 0, iter(argv)
    for a in args:
        if a == "--":
            rest += [a, *args]
        elif a == "--nproc":
            value = next(args, None)
            if value is None:
                raise NprocError("--nproc needs a value: the number of processes (0 = this process)")
            nproc = parse_nproc(value)
        elif a.startswith("--nproc="):
            nproc = parse_nproc(a.split("=", 1)[1])
        else:
            rest.append(a)
    return nproc, rest


def command_parser(subcommand: str, description: str, example: str, nproc_note: str = "") -> argparse.ArgumentParser:
    """The parser of a training command that runs under torchrun with --nproc (see run_command)."""
    ap = argparse.ArgumentParser(prog=f"rookworld {subcommand}", description=description,
                                 epilog=f"example: {example}; add --nproc 2 to run two processes under torchrun "
                                        "(DDP: gloo on CPU, NCCL on GPU)")
    ap.add_argument("--nproc", type=parse_nproc, default=0, metavar="N",
                    help=f"processes on this machine, via torchrun (0 = this process{nproc_note})")
    return ap


def run_command(subcommand: str, argv: list[str] | None, build_parser: Callable[[], argparse.ArgumentParser],
                run: Callable[[argparse.Namespace], int], preflight: Callable[[list[str], int], None]) -> int:
    """A training command's `cli`: with --nproc N > 1 start N workers under torchrun (after preflight);
    otherwise parse argv, log at INFO (rank 0 only) and return run(args), leaving the process group after."""
    nproc, rest = strip_nproc(list(sys.argv[1:] if argv is None else argv))
    if nproc > 1:
        return torchrun(subcommand, rest, nproc, preflight=preflight)
    worker_dies_with_agent()
    args = build_parser().parse_args(rest)
    logging.basicConfig(level=logging.INFO if main_process() else logging.WARNING, format="%(message)s")
    try:
        return run(args)
    finally:
        cleanup()


if __name__ == "__main__":
    code = _launch(sys.argv[1:])
    # torchrun's process ends without the interpreter's teardown: its workers have ended and the launcher
    # removes --log-dir, so all that is left is freeing torch's objects one by one (0.9 s of every --nproc
    # command on a 2-core VM; docs/perf.md)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
