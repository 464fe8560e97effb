"""Where a benchmark runs: how many ranks, which backend, and the topology of those devices (for the bound)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from meshscale.errors import MeshscaleError
from meshscale.execute import in_torchrun
from meshscale.topology import Topology, subset
from meshscale.topology.discover import discover

DEFAULT_CPU_WORKERS = 2


@dataclass
class World:
    """The ranks of a run: ``size`` processes over ``backend``; ``notice`` tells the user what was chosen."""

    size: int
    backend: str
    notice: str = ""


def resolve_world(gpus: int | None, cpus: int | None) -> World:
    """``--gpus N`` (NCCL), ``--cpus N`` (Gloo), or with neither all GPUs if any, else CPU workers.
    Under torchrun the launcher's WORLD_SIZE wins and the backend follows the presence of GPUs."""
    if gpus is not None and cpus is not None:
        raise MeshscaleError("give --gpus or --cpus, not both")
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if in_torchrun():
        return World(int(os.environ["WORLD_SIZE"]), "nccl" if have and cpus is None else "gloo")
    for name, n in (("--gpus", gpus), ("--cpus", cpus)):
        if n is not None and n < 1:
            raise MeshscaleError(f"{name} {n}: need at least 1")
    if gpus is not None:
        if gpus > have:
            fix = f"use --gpus {have} or fewer" if have else "use --cpus N for CPU worker processes"
            raise MeshscaleError(f"--gpus {gpus}: this machine has {have} GPU{'' if have == 1 else 's'}; {fix}")
        return World(gpus, "nccl")
    if cpus is not None:
        return World(cpus, "gloo")
    if have:
        return World(have, "nccl", f"using all {have} GPUs over NCCL (choose with --gpus N)")
    n = DEFAULT_CPU_WORKERS
    return World(n, "gloo", f"no GPU found: using {n} CPU worker processes over Gloo (choose with --cpus N)")


def world_topology(world: World) -> Topology | None:
    """The topology of the devices the ranks use (rank i on CUDA device i), or None when it cannot be known
    (ranks on several hosts under torchrun, or more ranks than local devices)."""
    found = discover(world.size if world.backend == "gloo" else None).topology
    devices = found.devices()
    if world.size > len(devices) or (world.backend == "nccl") != (found.device_kind == "gpu"):
        return None
    indices = [found.nodes[d].index for d in devices]
    if world.backend == "nccl":
        indices = visible_indices(os.environ.get("CUDA_VISIBLE_DEVICES"), indices)
    if indices[: world.size] == [found.nodes[d].index for d in devices]:
        return found
    return subset(found, indices[: world.size])


def visible_indices(cuda_visible_devices: str | None, indices: list[int]) -> list[int]:
    """The nvidia-smi indices of CUDA devices 0, 1, ...: CUDA_VISIBLE_DEVICES when it lists numbers, else all
    of them in order (UUID lists are not mapped: the bound then assumes the first GPUs)."""
    listed = [x.strip() for x in (cuda_visible_devices or "").split(",") if x.strip()]
    if listed and all(x.isdigit() and int(x) in indices for x in listed):
        return [int(x) for x in listed]
    return indices
