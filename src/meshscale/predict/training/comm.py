"""The one place a training prediction prices a collective: `collective_cost` (and `collective_seconds`, its
time), on a `Allocation`: where the job's ranks run, the network that joins its nodes, the links' calibration and
NCCL's settings, as `predict`'s options and a corpus row state them. Every call is priced by `Fabric.cost` (the
one cost interface: NCCL's model, NCCL's own choice of algorithm and protocol unless one is forced) on the
group's allocation: inside one node, on the node's topology; across nodes, on the cluster of that many nodes.

A group of a layout is placed by its global ranks: rank r sits on node r // gpus_per_node, local GPU
r % gpus_per_node (the layout's rank order puts tp innermost, so tp groups fill a node first). Each group is
priced on the whole cluster it spans (NCCL's model picks Ring, Tree or NVLS-Tree for that many nodes).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from math import gcd
from typing import TYPE_CHECKING

from meshscale.collectives.kinds import kind

from meshscale.simulate.cost import Call
from meshscale.simulate.fabric import Fabric
from meshscale.simulate.nccl_env import DEFAULT_ENV, NcclEnv, NcclSettings

if TYPE_CHECKING:
    from meshscale.simulate.params import SimParams

TRAINING_COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "send_recv")


@dataclass(frozen=True, eq=False)
class Allocation:
    """Where a job's ranks run: ``nodes`` nodes of ``gpus_per_node`` GPUs of ``fabric`` (the node system, or a
    cluster of it: the network between nodes, the links' calibration and NCCL's settings, as `resolve_fabric`
    resolved them once). Every collective of the job is priced on it (`Fabric.at_nodes`, `Fabric.cost`) and
    cached per allocation."""

    fabric: Fabric
    gpus_per_node: int
    nodes: int = 1
    _cache: dict = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, system: str, gpus_per_node: int, nodes: int = 1, link: str = "ndr", nics: int = 8, *,
           gpudirect: bool = True, network: str = "fat-tree", oversubscription: float = 1.0,
           placement: str | None = None, nccl_env: NcclEnv = DEFAULT_ENV, nccl_algo: str | None = None) -> Allocation:
        """``nodes`` nodes of catalog system ``system``, a cluster of them on these network options when more than
        one."""
        from meshscale.simulate.fabric import resolve_fabric

        cluster = {"nodes": nodes, "link": link, "nics": nics, "gpudirect": gpudirect, "network": network,
                   "oversubscription": oversubscription, "placement": placement} if nodes > 1 else None
        return cls(resolve_fabric(system, cluster, nccl=NcclSettings(nccl_env, algo=nccl_algo)), gpus_per_node, nodes)

    @property
    def system(self) -> str:
        return self.fabric.cluster.node if self.fabric.cluster is not None else self.fabric.topology.name

    @property
    def params(self) -> SimParams | None:
        return self.fabric.params

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    def describe(self) -> str:
        text = f"{self.world_size} GPUs of {self.system}"
        cluster = self.fabric.cluster
        if self.nodes > 1 and cluster is not None:
            text += f" ({self.nodes} nodes, {cluster.nics}x {cluster.link.upper()} per node)"
        return text

    @property
    def switched(self) -> bool:
        """Whether the node's GPUs are all alike to each other (an NVSwitch joins them)."""
        return bool(self.at(1).topology.nodes_of("nvswitch"))

    def at(self, nodes: int, nccl_version: str | None = None, nics: int | None = None) -> Fabric:
        """The fabric of ``nodes`` of these nodes (one: the node alone), with NCCL of version ``nccl_version``
        (a framework's own) where given, and ``nics`` of each node's ports (a group's share) where given; built
        once per count, version and share."""
        key = ("fabric", nodes, nccl_version, nics)
        if key not in self._cache:
            found = self.fabric.at_nodes(nodes) if self.fabric.cluster is not None else self.fabric
            if nics is not None and nics != found.cluster.nics:
                found = _with_nics(found, nics)
            if nccl_version and nccl_version != found.nccl.version:
                found = replace(found, nccl=replace(found.nccl, version=nccl_version))
            self._cache[key] = found
        return self._cache[key]


def _with_nics(fabric: Fabric, nics: int) -> Fabric:
    """``fabric``'s cluster with ``nics`` ports per node (a group's share of them) on the same leaves (each leaf
    keeps its nodes, so traffic climbs where the whole job's would), its switches sized for that share; the whole
    fabric where a cluster file pins a shape that share cannot fill."""
    from meshscale.errors import MeshscaleError
    from meshscale.topology.cluster import cluster_topology

    spec = replace(fabric.cluster, nics=nics, nodes_per_leaf=fabric.topology.cluster.nodes_per_leaf)
    try:
        return Fabric(cluster_topology(spec), spec, fabric.params, fabric.network_fit, fabric.nccl, fabric.algo)
    except MeshscaleError:
        return fabric


def group_shape(ranks: Sequence[int], gpus_per_node: int) -> tuple[tuple[int, ...], int]:
    """(local GPU indices used on each node, nodes spanned) of a group of global ranks. Groups of one layout
    dimension use the same local GPUs on every node they span. A range (`ParallelLayout.group_ranks`) is shaped
    in closed form: its ranks step less than a node (every node between its ends is visited) or at least one
    (each on a node of its own), and its local indices repeat every gpus_per_node / gcd(step, gpus_per_node)."""
    if isinstance(ranks, range) and ranks.step > 0 and len(ranks):
        step, g = ranks.step, gpus_per_node
        nodes = len(ranks) if step >= g else ranks[-1] // g - ranks[0] // g + 1
        return tuple(sorted({r % g for r in ranks[:g // gcd(step, g)]})), nodes
    nodes = sorted({r // gpus_per_node for r in ranks})
    local = tuple(sorted({r % gpus_per_node for r in ranks}))
    return local, len(nodes)


@dataclass(frozen=True)
class CollectiveCost:
    """A collective's time, the channels it runs on (NCCL runs one thread block, on one SM, per channel) and
    what NCCL ran (algorithm/protocol; empty where unknown)."""

    seconds: float
    channels: int = 0
    chosen: str = ""


def collective_cost(collective: str, nbytes: float, ranks: Sequence[int], fabric: Allocation,
                    nccl_version: str | None = None) -> CollectiveCost:
    """Time and channels of ``collective`` of ``nbytes`` (the nccl-tests size: the whole gathered / reduced
    buffer; the message for send_recv) among global ``ranks`` placed on ``fabric`` (by NCCL ``nccl_version``:
    a framework's own, else the allocation's)."""
    if len(ranks) < 2 or nbytes <= 0:
        return CollectiveCost(0.0)
    local, nodes = group_shape(ranks, fabric.gpus_per_node)
    # sizes rounded to 1/64 of a power of two keep the cache small without moving a time by more than 1.6%
    key = (collective, _rounded(nbytes), local, nodes, nccl_version)
    found = fabric._cache.get(key)
    if found is None:
        found = fabric._cache[key] = _priced(*key, fabric)
    return found


def collective_seconds(collective: str, nbytes: float, ranks: Sequence[int], fabric: Allocation) -> float:
    """Seconds for ``collective`` (see `collective_cost`)."""
    return collective_cost(collective, nbytes, ranks, fabric).seconds


def _rounded(nbytes: float) -> int:
    step = max(1, 1 << max(0, int(nbytes).bit_length() - 7))
    return max(4, int(round(nbytes / step)) * step)


def _priced(collective: str, nbytes: int, local: tuple[int, ...], nodes: int, nccl_version: str | None,
            allocation: Allocation) -> CollectiveCost:
    fabric = allocation.at(nodes, nccl_version)
    if nodes > 1 and len(local) < allocation.gpus_per_node and allocation.switched:
        # every group of the dimension runs at once, one per set of local GPUs: they share the node's NICs, each
        # driving the ones nearest its GPUs (on an NVSwitch node every GPU is alike, so the group is priced on the
        # node's first GPUs and their NICs)
        groups = allocation.gpus_per_node // len(local)
        fabric = allocation.at(nodes, nccl_version, max(1, fabric.cluster.nics // groups))
        local = tuple(range(len(local)))
    found = fabric.cost(Call(kind(collective).name, nbytes, _device_ranks(allocation, fabric, local, nodes,
                                                                         collective == "send_recv")))
    return CollectiveCost(found.time_s, found.channels, found.chosen.split(",")[0])


def _device_ranks(allocation: Allocation, fabric: Fabric, local: tuple[int, ...], nodes: int,
                  pair: bool) -> tuple[int, ...]:
    """The devices of ``fabric`` a group of ``local`` GPUs on each of ``nodes`` nodes runs on (``pair``: one
    message between two of them, a pipeline hop), built once per group shape: every collective and size of a
    group asks the same."""
    key = ("devices", fabric, local, nodes, pair)   # a fabric is its own key (compared by identity)
    if key not in allocation._cache:
        indices, per_node = fabric.topology.device_indices(), allocation.gpus_per_node
        if pair:
            ranks = [indices[local[0]], indices[(per_node if nodes > 1 else 0) + local[-1]]]
        else:
            ranks = [indices[n * per_node + i] for n in range(nodes) for i in local]
        allocation._cache[key] = tuple(ranks)
    return allocation._cache[key]
