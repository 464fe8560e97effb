"""Where a benchmark runs: the ranks (`meshscale.execute.world`) and the topology of their devices (for the bound)."""
from __future__ import annotations

import os

from meshscale.execute.world import World
from meshscale.topology import Topology, subset
from meshscale.topology.discover import discover

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
    if len(indices) < world.size:  # fewer GPUs visible here than ranks: the others are on other hosts
        return None
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
