"""Where the ranks of a run go: how many, on GPUs over NCCL or on CPU worker processes over Gloo, from the
``--gpus`` / ``--cpus`` options that benchmarks, training and scaling sweeps share."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from meshscale.errors import MeshscaleError
from meshscale.execute.launch import launcher

DEFAULT_CPU_WORKERS = 2


@dataclass
class World:
    """The ranks of a run: ``size`` processes over ``backend``; ``notice`` tells the user what was chosen."""

    size: int
    backend: str                     # nccl | gloo
    notice: str = ""

    @property
    def device(self) -> str:
        """The torch device type of every rank."""
        return "cuda" if self.backend == "nccl" else "cpu"


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_gpus(count: int) -> None:
    """A clear error, before anything starts, when this machine has fewer than ``count`` GPUs."""
    have = gpu_count()
    if count > have:
        fix = f"use --gpus {have} or fewer" if have else "use --cpus N for CPU worker processes"
        raise MeshscaleError(f"--gpus {count}: this machine has {have} GPU{'' if have == 1 else 's'}; {fix}")


def resolve_world(gpus: int | None, cpus: int | None, default: World | None = None) -> World:
    """``--gpus N`` (NCCL) or ``--cpus N`` (Gloo); with neither, ``default`` if given, else all GPUs if any,
    else `DEFAULT_CPU_WORKERS` CPU workers. Under torchrun the launcher's WORLD_SIZE wins and the backend
    follows the presence of GPUs (unless --cpus asks for Gloo)."""
    _not_both(gpus, cpus)
    env = launcher()
    if env is not None:
        return World(env.world_size, "nccl" if gpu_count() and cpus is None else "gloo")
    if gpus is not None:
        _check_counts("--gpus", [gpus])
        return World(gpus, "nccl")
    if cpus is not None:
        _check_counts("--cpus", [cpus])
        return World(cpus, "gloo")
    if default is not None:
        return default
    if gpu_count():
        return World(gpu_count(), "nccl", f"using all {gpu_count()} GPUs over NCCL (choose with --gpus N)")
    n = DEFAULT_CPU_WORKERS
    return World(n, "gloo", f"no GPU found: using {n} CPU worker processes over Gloo (choose with --cpus N)")


def resolve_sweep(gpus: list[int] | None, cpus: list[int] | None) -> list[World]:
    """One world per size of a sweep over ``--gpus 1,2,4`` or ``--cpus 1,2`` (default: one CPU worker), smallest
    first, each size checked as `resolve_world` checks one."""
    _not_both(gpus, cpus)
    flag, counts = ("--gpus", gpus) if gpus is not None else ("--cpus", cpus if cpus is not None else [1])
    if not counts:
        raise MeshscaleError(f"{flag}: give world sizes of at least 1, e.g. {flag} 1,2,4")
    _check_counts(flag, counts)
    return [World(n, "nccl" if flag == "--gpus" else "gloo") for n in sorted(set(counts))]


def _not_both(gpus: object, cpus: object) -> None:
    if gpus is not None and cpus is not None:
        raise MeshscaleError("give --gpus or --cpus, not both")


def _check_counts(flag: str, counts: list[int]) -> None:
    for n in counts:
        if n < 1:
            raise MeshscaleError(f"{flag} {n}: need at least 1")
    if flag == "--gpus":
        check_gpus(max(counts))
