"""Placement: the best K-GPU subset of a machine's free GPUs for a data-parallel job.

Every K-subset of the free GPUs is ranked by the all_reduce busbw NCCL's cost model predicts for it at a
gradient-bucket size (`predict_collective`, as `plan` predicts NCCL); equal predictions are told apart by the
busbw bound of the subset's links (what any schedule could reach), then by the lower device indices.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from meshscale.collectives.bounds import busbw_bound
from meshscale.errors import MeshscaleError
from meshscale.results import Result
from meshscale.simulate import nccl_model
from meshscale.simulate.auto import predict_collective
from meshscale.simulate.nccl_env import DEFAULT_ENV, NcclEnv
from meshscale.topology import Topology

PLACEMENT_BYTES = 64 << 20  # a gradient bucket (Horovod's fusion buffer)
SAME_BUSBW = 1e-6  # relative difference below which two predictions tie
_RING_PATHS = {
    "NVL": "rings over NVLink only",
    "PIX": "rings through one PCIe switch",
    "PXB": "rings through several PCIe switches",
    "PHB": "rings through a CPU's PCIe root",
    "SYS": "rings crossing the CPU-to-CPU link (QPI/UPI)",
}


@dataclass
class Placement:
    """One K-subset and what NCCL's model predicts for its all_reduce."""

    devices: list[int]
    busbw_bytes_per_s: float
    time_s: float
    algorithm: str
    bound_busbw_bytes_per_s: float | None
    path_type: str           # the farthest NCCL path type its ring graph uses
    channels: int
    channel_gbps: float      # NCCL's bandwidth per channel, GB/s

    @property
    def rings(self) -> str:
        return _RING_PATHS.get(self.path_type, self.path_type)

    @property
    def cuda_visible_devices(self) -> str:
        return "CUDA_VISIBLE_DEVICES=" + ",".join(map(str, self.devices))

    def row(self) -> dict:
        return {"devices": self.devices, "busbw_bytes_per_s": self.busbw_bytes_per_s, "time_s": self.time_s,
                "algorithm": self.algorithm, "bound_busbw_bytes_per_s": self.bound_busbw_bytes_per_s,
                "path_type": self.path_type, "rings": self.rings, "channels": self.channels,
                "channel_bytes_per_s": self.channel_gbps * 1e9}


def free_devices(topo: Topology, free: list[int] | None) -> list[int]:
    """The free device indices (default: every device), checked against the topology."""
    every = sorted(topo.nodes[d].index for d in topo.devices())
    if free is None:
        return every
    unknown = sorted(set(free) - set(every))
    if unknown:
        raise MeshscaleError(f"--free lists GPU(s) {unknown} that {topo.name} lacks; its GPUs are "
                             f"{','.join(map(str, every))}")
    if len(set(free)) != len(free):
        raise MeshscaleError(f"--free lists a GPU twice: {free}; give each free GPU once")
    return sorted(free)


def rank_placements(topo: Topology, gpus: int, free: list[int] | None = None,
                    nbytes: int = PLACEMENT_BYTES, nccl_env: NcclEnv | None = None) -> list[Placement]:
    """Every ``gpus``-subset of the ``free`` devices, best first (see the module docstring)."""
    if topo.device_kind != "gpu":
        raise MeshscaleError(f"{topo.name} has no GPUs to place a job on")
    pool = free_devices(topo, free)
    if not 2 <= gpus <= len(pool):
        raise MeshscaleError(f"--gpus {gpus}: {len(pool)} free GPU(s) ({','.join(map(str, pool))}); "
                             f"pick 2 to {len(pool)}")
    found = []
    for subset in itertools.combinations(pool, gpus):
        ranks = list(subset)
        r = predict_collective(topo, "all_reduce", ranks, nbytes, nccl_env=nccl_env)
        ring = nccl_model.analyse(topo, ranks, env=nccl_env or DEFAULT_ENV).ring
        found.append(Placement(ranks, r.busbw_bytes_per_s, r.time_s, r.detail or r.algorithm, None, ring.path_type,
                               ring.channels, ring.bw_gbps))
    best = max(p.busbw_bytes_per_s for p in found)
    for p in found:  # the bound only breaks ties among the best (it routes every pair: not free)
        if p.busbw_bytes_per_s >= best * (1 - SAME_BUSBW):
            p.bound_busbw_bytes_per_s = busbw_bound(topo, "all_reduce", p.devices)
    return sorted(found, key=lambda p: (-round(p.busbw_bytes_per_s / best / SAME_BUSBW),
                                        -(p.bound_busbw_bytes_per_s or 0.0), p.devices))


def why(best: Placement, runner_up: Placement | None) -> list[str]:
    """Why ``best`` was chosen over ``runner_up``, in a line or two."""
    lines = [f"{best.rings}: NCCL's search lays {best.channels} ring(s) of {best.channel_gbps:g} GB/s; runs "
             f"{best.algorithm}"]
    if runner_up is None:
        return lines
    gap = 1 - runner_up.busbw_bytes_per_s / best.busbw_bytes_per_s
    if gap > SAME_BUSBW:
        lines.append(f"runner-up {runner_up.devices}: {gap:.0%} less busbw; {runner_up.rings}, "
                     f"{runner_up.channels} ring(s) of {runner_up.channel_gbps:g} GB/s")
    elif (best.bound_busbw_bytes_per_s or 0) > (runner_up.bound_busbw_bytes_per_s or 0) * (1 + SAME_BUSBW):
        lines.append(f"runner-up {runner_up.devices}: the same predicted busbw; its links bound any schedule to "
                     f"{runner_up.bound_busbw_bytes_per_s / 1e9:.1f} GB/s against "
                     f"{best.bound_busbw_bytes_per_s / 1e9:.1f} GB/s")
    else:
        lines.append(f"runner-up {runner_up.devices}: equally good by prediction and bound; lower indices chosen")
    return lines


def placement_result(topo: Topology, ranked: list[Placement], gpus: int, free: list[int], nbytes: int,
                     shown: int = 10) -> Result:
    """A Result (kind place) of the ranking: the best ``shown`` subsets, best first."""
    return Result("place", [dict(p.row(), rank=i + 1) for i, p in enumerate(ranked[:shown])], True,
                  {"system": topo.name, "gpus": gpus, "free": free, "size_bytes": nbytes,
                   "subsets": len(ranked), "chosen": ranked[0].devices,
                   "cuda_visible_devices": ranked[0].cuda_visible_devices,
                   "why": why(ranked[0], ranked[1] if len(ranked) > 1 else None)})
