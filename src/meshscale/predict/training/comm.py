"""The one place a training prediction prices a collective: `collective_cost` (and `collective_seconds`, its time). It asks the one
cost interface (`meshscale.simulate.cost.collective_time_s`: NCCL's model, NCCL's own choice of algorithm and
protocol) on the group's placement:
inside one node, on the node's topology; across nodes, on the cluster topology `predict --nodes` builds
(`predict.exchange_cost.cluster_topology`). Re-point this function to change how every training collective is
priced.

A group of a layout is placed by its global ranks: rank r sits on node r // gpus_per_node, local GPU
r % gpus_per_node (the layout's rank order puts tp innermost, so tp groups fill a node first). A group spanning
more than MAX_PRICED_NODES nodes is priced on that many nodes and carried to its full size the way a ring's cost
grows: its bandwidth term by the bus factor ((p - 1) / p for all-gather and reduce-scatter, 2 (p - 1) / p for
all-reduce), its latency term by one network message per added ring step (Thakur, Rabenseifner and Gropp, 2005).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

MAX_PRICED_NODES = 16
TRAINING_COLLECTIVES = ("all_gather", "reduce_scatter", "all_reduce", "send_recv")
_STEPS_PER_RANK = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1, "send_recv": 0}


@dataclass(frozen=True)
class Placement:
    """Where a job's ranks run: ``nodes`` copies of catalog system ``system`` (``gpus_per_node`` GPUs each),
    joined by ``nics`` ports of ``link`` per node (GPUDirect RDMA)."""

    system: str
    gpus_per_node: int
    nodes: int = 1
    link: str = "ndr"
    nics: int = 8

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    def describe(self) -> str:
        text = f"{self.world_size} GPUs of {self.system}"
        return text + (f" ({self.nodes} nodes, {self.nics}x {self.link.upper()} per node)" if self.nodes > 1 else "")


def group_shape(ranks: list[int], gpus_per_node: int) -> tuple[tuple[int, ...], int]:
    """(local GPU indices used on each node, nodes spanned) of a group of global ranks. Groups of one layout
    dimension use the same local GPUs on every node they span."""
    nodes = sorted({r // gpus_per_node for r in ranks})
    local = tuple(sorted({r % gpus_per_node for r in ranks}))
    return local, len(nodes)


@dataclass(frozen=True)
class CollectiveCost:
    """A collective's time and the channels it runs on (NCCL runs one thread block, on one SM, per channel)."""

    seconds: float
    channels: int = 0


def collective_cost(collective: str, nbytes: float, ranks: list[int], fabric: Placement) -> CollectiveCost:
    """Time and channels of ``collective`` of ``nbytes`` (the nccl-tests size: the whole gathered / reduced
    buffer; the message for send_recv) among global ``ranks`` placed on ``fabric``."""
    if len(ranks) < 2 or nbytes <= 0:
        return CollectiveCost(0.0)
    local, nodes = group_shape(ranks, fabric.gpus_per_node)
    # sizes rounded to 1/64 of a power of two keep the cache small without moving a time by more than 1.6%
    size = _rounded(nbytes)
    return _priced(collective, size, local, nodes, fabric.system, fabric.link, fabric.nics, fabric.gpus_per_node)


def collective_seconds(collective: str, nbytes: float, ranks: list[int], fabric: Placement) -> float:
    """Seconds for ``collective`` (see `collective_cost`)."""
    return collective_cost(collective, nbytes, ranks, fabric).seconds


def _rounded(nbytes: float) -> int:
    step = max(1, 1 << max(0, int(nbytes).bit_length() - 7))
    return max(4, int(round(nbytes / step)) * step)


@lru_cache(maxsize=65536)
def _priced(collective: str, nbytes: int, local: tuple[int, ...], nodes: int, system: str, link: str, nics: int,
            gpus_per_node: int) -> CollectiveCost:
    from meshscale.simulate.cost import collective_time_s

    priced_nodes = min(nodes, MAX_PRICED_NODES)
    topo, devices = _topology(system, priced_nodes, link, nics)
    if collective == "send_recv":   # one message between two ranks of the group (a pipeline hop)
        ranks = [topo.nodes[devices[local[0]]].index,
                 topo.nodes[devices[(gpus_per_node if nodes > 1 else 0) + local[-1]]].index]
    else:
        ranks = [topo.nodes[devices[n * gpus_per_node + i]].index for n in range(priced_nodes) for i in local]
    found = collective_time_s(collective, nbytes, ranks, topo)  # the one cost interface (simulate/cost.py)
    t, channels = found.time_s, found.channels
    if nodes == priced_nodes:
        return CollectiveCost(t, channels)
    p_priced, p = len(ranks), nodes * len(local)
    factor = ((p - 1) / p) / ((p_priced - 1) / p_priced)
    latency = _STEPS_PER_RANK[collective] * (p - p_priced) * _network_latency_s(system, link, nics, nodes)
    return CollectiveCost(t * factor + latency, channels)


@lru_cache(maxsize=64)
def _topology(system: str, nodes: int, link: str, nics: int):
    """One node's topology, or a cluster of ``nodes`` of them (built once: NCCL's model keeps its ring and
    tree search on the topology object)."""
    from meshscale.topology import load_system

    if nodes == 1:
        topo = load_system(system)
    else:
        from meshscale.predict.exchange_cost import cluster_topology
        from meshscale.topology.cluster import ClusterSpec

        topo = cluster_topology(ClusterSpec(node=system, nodes=1, nics=nics, link=link, gpudirect=True), nodes)
    return topo, topo.devices()


@lru_cache(maxsize=256)
def _network_latency_s(system: str, link: str, nics: int, nodes: int) -> float:
    from meshscale.predict.exchange_cost import cluster_topology, network_latency_s
    from meshscale.topology.cluster import ClusterSpec

    return network_latency_s(cluster_topology(ClusterSpec(node=system, nodes=1, nics=nics, link=link, gpudirect=True), nodes))
