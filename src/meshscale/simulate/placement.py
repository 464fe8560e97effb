"""Placement: the best K-GPU subset of a machine's free GPUs for a data-parallel job.

K-subsets of the free GPUs are ranked by the all_reduce busbw NCCL's cost model predicts for them at a
gradient-bucket size (`Fabric.cost`, as `plan` predicts NCCL); equal predictions are told apart by the
busbw bound of the subset's links (what any schedule could reach), then by the lower device indices.

The model runs once per shape of subset, not once per subset: two subsets whose GPUs see the same paths to each
other (NCCL's path type and rate of every pair) and share PCIe switches and CPUs alike get the same prediction
(`shape`), so a DGX-2's 12,870 ways to take 8 of 16 GPUs cost one prediction. Up to `EXHAUSTIVE_SUBSETS` subsets
are all shaped; beyond that a search starts from every free GPU, grows a subset greedily by pair rate and
improves it by swapping one GPU in and one out while the prediction rises. On a cluster (nodes joined by a
network, NVL72 racks among them) the GPUs packed into the fewest nodes are ranked against the GPUs spread over
them (`_node_candidates`).
"""
from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass, replace

from meshscale.collectives.bounds import busbw_bound
from meshscale.errors import MeshscaleError
from meshscale.results import Result
from meshscale.simulate.cost import Call
from meshscale.simulate.fabric import Fabric
from meshscale.simulate.nccl.search import analyse, local_cpu, pair_path
from meshscale.simulate.nccl.tables import constants, gpu_sm
from meshscale.topology import Topology

PLACEMENT_BYTES = 64 << 20  # a gradient bucket (Horovod's fusion buffer)
EXHAUSTIVE_SUBSETS = 50_000  # subsets shaped one by one; more are searched
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
    every = sorted(topo.device_indices())
    if free is None:
        return every
    unknown = sorted(set(free) - set(every))
    if unknown:
        raise MeshscaleError(f"--free lists GPU(s) {unknown} that {topo.name} lacks; its GPUs are "
                             f"{','.join(map(str, every))}")
    if len(set(free)) != len(free):
        raise MeshscaleError(f"--free lists a GPU twice: {free}; give each free GPU once")
    return sorted(free)


def rank_placements(fabric: Fabric, gpus: int, free: list[int] | None = None,
                    nbytes: int = PLACEMENT_BYTES) -> list[Placement]:
    """The ``gpus``-subsets of the ``free`` devices of ``fabric`` considered (all of them up to
    `EXHAUSTIVE_SUBSETS`), best first (see the module docstring)."""
    topo = fabric.topology
    if topo.device_kind != "gpu":
        raise MeshscaleError(f"{topo.name} has no GPUs to place a job on")
    pool = free_devices(topo, free)
    if not 2 <= gpus <= len(pool):
        raise MeshscaleError(f"--gpus {gpus}: {len(pool)} free GPU(s) ({','.join(map(str, pool))}); "
                             f"pick 2 to {len(pool)}")
    ranker = _Ranker(fabric, nbytes)
    if len({_domain(topo, d)[0] for d in pool}) > 1:
        found = [ranker.placement(devices) for devices in _node_candidates(topo, pool, gpus)]
    elif math.comb(len(pool), gpus) <= EXHAUSTIVE_SUBSETS:
        found = [ranker.placement(list(subset)) for subset in itertools.combinations(pool, gpus)]
    else:
        found = ranker.search(pool, gpus)
    best = max(p.busbw_bytes_per_s for p in found)
    for p in found:  # the bound only breaks ties among the best (it routes every pair: not free)
        if p.busbw_bytes_per_s >= best * (1 - SAME_BUSBW):
            p.bound_busbw_bytes_per_s = ranker.bound(p.devices)
    return sorted(found, key=lambda p: (-round(p.busbw_bytes_per_s / best / SAME_BUSBW),
                                        -(p.bound_busbw_bytes_per_s or 0.0), p.devices))


def _domain(topo: Topology, device: int) -> tuple[int, int | None]:
    """(cluster node, host) of a device: the node of a cluster (`node_copy` marks it; 0 for one system) and the host
    inside it where the node is a rack of several (an NVL72's compute trays; None on a single-host node)."""
    attrs = topo.nodes[topo.device(device)].attrs
    return int(attrs.get("node", 0)), attrs.get("host")


def _node_candidates(topo: Topology, pool: list[int], gpus: int) -> list[list[int]]:
    """The subsets worth ranking on a cluster, whose GPUs split into nodes (NVLink domains) joined by a network: a
    job's GPUs packed into the fewest nodes, the fullest first, and for comparison spread one node at a time
    (round robin). Every NCCL prediction of a cluster searches its nodes and its network, so the thousands of
    subsets of a single machine are not tried."""
    by_node: dict[int, list[int]] = {}
    for d in pool:
        by_node.setdefault(_domain(topo, d)[0], []).append(d)
    order = sorted(by_node, key=lambda k: (-len(by_node[k]), k))
    packed = [d for k in order for d in by_node[k]][:gpus]
    spread, queues = [], [list(by_node[k]) for k in sorted(by_node)]
    while len(spread) < gpus:
        for q in queues:
            if q and len(spread) < gpus:
                spread.append(q.pop(0))
    return [sorted(packed)] + ([sorted(spread)] if sorted(spread) != sorted(packed) else [])


def visible_devices(topo: Topology, devices: list[int]) -> list[str]:
    """What a scheduler's prolog sets for ``devices``: one CUDA_VISIBLE_DEVICES line where they share a host, else
    one per host (a cluster's node k; an NVL72 rack's compute tray h), each with the host's own numbering (the
    rank of the GPU among its host's)."""
    hosts: dict[tuple, list[int]] = {}
    for d in sorted(topo.device_indices()):
        hosts.setdefault(_domain(topo, d), []).append(d)
    chosen: dict[tuple, list[int]] = {}
    for d in devices:
        where = _domain(topo, d)
        chosen.setdefault(where, []).append(hosts[where].index(d))
    if len(hosts) == 1:
        return ["CUDA_VISIBLE_DEVICES=" + ",".join(map(str, devices))]
    multi_node = len({k for k, _h in hosts}) > 1
    lines = []
    for (k, h), local in sorted(chosen.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        label = ", ".join(x for x in (f"node {k}" if multi_node else "", f"host {h}" if h is not None else "") if x)
        lines.append(f"{label}: CUDA_VISIBLE_DEVICES=" + ",".join(map(str, local)))
    return lines


class _Ranker:
    """NCCL's prediction (and the links' bound) of a subset, computed once per `shape`."""

    def __init__(self, fabric: Fabric, nbytes: int):
        self.fabric, self.topo, self.nbytes, self.env = fabric, fabric.topology, nbytes, fabric.nccl.env
        self.c = constants(None)
        self.sm = gpu_sm(self.topo.gpu_model)
        self._pairs: dict = {}
        self._found: dict = {}
        self._bounds: dict = {}
        self._shapes: dict = {}
        self.predictions = 0  # how many times the model ran (once per shape)

    def pair(self, u: int, v: int) -> tuple:
        """NCCL's path type and rate (GB/s) from device u to v."""
        if (u, v) not in self._pairs:
            capacity: dict = {}
            a, b = self.topo.device(u), self.topo.device(v)
            p = pair_path(self.topo, a, b, self.c, self.sm, capacity, self.env)
            self._pairs[(u, v)] = (p.path_type, round(min(capacity[k] / f for k, f in p.uses), 6)) if p else ("-", 0.0)
        return self._pairs[(u, v)]

    def shape(self, devices: list[int]) -> tuple:
        """What NCCL's model sees of a subset, up to renaming its GPUs: every GPU's paths to the others, and how
        many of the subset share its PCIe switch and its CPU (their up-links carry those GPUs together)."""
        key = tuple(devices)
        if key not in self._shapes:
            near = [self._uplinks(d) for d in devices]
            switches, cpus = Counter(n[0] for n in near), Counter(n[1] for n in near)
            pairs = self._pairs
            rows = sorted((tuple(sorted(pairs.get((d, e)) or self.pair(d, e) for e in devices if e != d)),
                           switches[n[0]], cpus[n[1]]) for d, n in zip(devices, near))
            self._shapes[key] = tuple(rows)
        return self._shapes[key]

    def _uplinks(self, device: int) -> tuple:
        key = ("up", device)
        if key not in self._pairs:
            name = self.topo.device(device)
            switch = next((l.other(name) for l in self.topo.links_of(name, "pcie")
                           if self.topo.nodes[l.other(name)].kind == "pcie_switch"), None)
            self._pairs[key] = (switch, local_cpu(self.topo, name))
        return self._pairs[key]

    def placement(self, devices: list[int]) -> Placement:
        key = self.shape(devices)
        if key not in self._found:
            self.predictions += 1
            r = self.fabric.cost(Call("all_reduce", self.nbytes, tuple(devices)))
            ring = analyse(self.topo, devices, env=self.env).ring
            self._found[key] = Placement(devices, r.busbw_bytes_per_s, r.time_s, r.detail, None,
                                         ring.path_type, ring.channels, ring.bw_gbps)
        return replace(self._found[key], devices=list(devices))

    def bound(self, devices: list[int]) -> float | None:
        if len({_domain(self.topo, d)[0] for d in devices}) > 1:
            return None  # across a cluster's nodes the max-flow would route every pair of GPUs (as sim's bound)
        key = self.shape(devices)
        if key not in self._bounds:
            self._bounds[key] = busbw_bound(self.topo, "all_reduce", devices)
        return self._bounds[key]

    def search(self, pool: list[int], gpus: int) -> list[Placement]:
        """Subsets grown from every free GPU (greedily, by the rate to the GPUs taken), each then improved by
        one-in one-out swaps while NCCL's prediction rises; every subset looked at is returned."""
        seen: dict[tuple, Placement] = {}

        def look(devices: list[int]) -> Placement:
            key = tuple(sorted(devices))
            if key not in seen:
                seen[key] = self.placement(list(key))
            return seen[key]

        for seed in pool:
            taken = [seed]
            while len(taken) < gpus:
                taken.append(max((d for d in pool if d not in taken),
                                 key=lambda d: (min(self.pair(t, d)[1] for t in taken), -d)))
            current = look(taken)
            improved = True
            while improved:
                improved = False
                for out in list(current.devices):
                    for into in (d for d in pool if d not in current.devices):
                        trial = look([d for d in current.devices if d != out] + [into])
                        if trial.busbw_bytes_per_s > current.busbw_bytes_per_s * (1 + SAME_BUSBW):
                            current, improved = trial, True
                            break
                    if improved:
                        break
        return list(seen.values())


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
                   "cuda_visible_devices": visible_devices(topo, ranked[0].devices),
                   "why": why(ranked[0], ranked[1] if len(ranked) > 1 else None)})
