"""Where a run's ranks are, for a benchmark and a training run alike: the ranks (`meshscale.execute.world`) and
the topology of their devices (for the bound).

On one host, discovery of this machine. Under torchrun across hosts, each host's local rank 0 discovers its
host (devices and network ports), every rank gathers the reports over the run's process group, and the hosts
are joined into one topology (`meshscale.topology.multinode`)."""
from __future__ import annotations

import os

import torch.distributed as dist

from meshscale.execute import RankContext
from meshscale.execute.world import in_torchrun
from meshscale.execute.world import World
from meshscale.topology import Topology, subset
from meshscale.topology.discover import cpu_topology, discover
from meshscale.topology.multinode import HostReport, hostname, join_hosts
from meshscale.topology.nics import discover_ports
from meshscale.units import is_digits


def spans_hosts() -> bool:
    """True under torchrun when the ranks do not all run on this host (LOCAL_WORLD_SIZE < WORLD_SIZE)."""
    if not in_torchrun():
        return False
    world = int(os.environ["WORLD_SIZE"])
    return int(os.environ.get("LOCAL_WORLD_SIZE", world)) < world


def world_topology(world: World, ctx: RankContext | None = None) -> Topology | None:
    """The topology of the devices the ranks use (rank i on device i), or None when it cannot be known (more
    ranks than local devices; ranks on several hosts before their process group exists). With ``ctx`` (every
    rank calls it) on several hosts: the hosts' topologies gathered and joined."""
    if spans_hosts():
        return gathered_topology(world, ctx) if ctx is not None else None
    return host_topology(world)


def joined_topology(world: World, ctx: RankContext, topology: Topology | None) -> Topology | None:
    """Inside every rank: the hosts' topologies joined when the ranks span several hosts and ``topology`` (what
    the launching process found) is not known; else None. Collective across hosts."""
    return world_topology(world, ctx) if topology is None and spans_hosts() else None


def host_topology(world: World) -> Topology | None:
    """The topology of this host's devices that ``world.size`` ranks use, or None when it has too few."""
    if world.backend == "gloo":  # CPU workers are CPU workers, on a GPU machine too
        return cpu_topology(world.size)
    found = discover().topology
    devices = found.devices()
    if world.size > len(devices) or found.device_kind != "gpu":
        return None
    indices = [found.nodes[d].index for d in devices]
    if world.backend == "nccl":
        indices = visible_indices(os.environ.get("CUDA_VISIBLE_DEVICES"), indices)
    if len(indices) < world.size:  # fewer GPUs visible here than ranks: the others are on other hosts
        return None
    if indices[: world.size] == [found.nodes[d].index for d in devices]:
        return found
    return subset(found, indices[: world.size])


def gathered_topology(world: World, ctx: RankContext) -> Topology | None:
    """Every host's report gathered on every rank and joined; None when a host could not tell its devices.
    Collective: every rank of the group must call it."""
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    report = None
    if ctx.local_rank == 0:
        topology = host_topology(World(local_world, world.backend))
        report = HostReport(hostname(), topology, discover_ports()) if topology is not None else "unknown"
    reports: list = [None] * ctx.world_size
    dist.all_gather_object(reports, report)  # bounded by the process group's timeout
    reports = [r for r in reports if r is not None]
    if any(r == "unknown" for r in reports):
        return None
    return join_hosts(reports)


def visible_indices(cuda_visible_devices: str | None, indices: list[int]) -> list[int]:
    """The nvidia-smi indices of CUDA devices 0, 1, ...: CUDA_VISIBLE_DEVICES when it lists numbers, else all
    of them in order (UUID lists are not mapped: the bound then assumes the first GPUs)."""
    listed = [x.strip() for x in (cuda_visible_devices or "").split(",") if x.strip()]
    if listed and all(is_digits(x) and int(x) in indices for x in listed):
        return [int(x) for x in listed]
    return indices
