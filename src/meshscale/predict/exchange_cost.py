"""Time of the gradient exchange: all-reduce (flat ring or hierarchical) or parameter server, on one system or a
cluster of them.

Inside a node NCCL's cost model times the all-reduce (NCCL's own pick). Across nodes the all-reduce is NCCL's cost
model on the whole cluster's topology (the one `sim` and `plan` use):
- nccl (the default): what NCCL picks for each size (Ring, Tree, NVLS-Tree, ...), as a run without NCCL_ALGO does;
- ring: one flat ring of all GPUs (NCCL_ALGO=Ring);
- hierarchical: reduce inside the node, a tree across nodes, broadcast back (NCCL_ALGO=Tree);
- ps (mode ps-sync): every GPU pushes its gradients to one server and pulls the result back, through the
  server's links (host PCIe on one node, the server node's NICs across nodes).
Times are cached per bucket size; the cluster topology (and so NCCL's ring and tree search on it) per cluster
and node count, so a sweep up to 124 nodes x 8 GPUs stays fast.
"""
from __future__ import annotations

import itertools
from dataclasses import astuple, dataclass, replace
from functools import lru_cache

from meshscale.errors import MeshscaleError, check_choice
from meshscale.simulate.nccl_env import NcclEnv
from meshscale.simulate.params import SimParams
from meshscale.topology import Topology, route
from meshscale.topology.cluster import ClusterPlan, ClusterSpec, build_cluster, plan_cluster

ALLREDUCE_ALGORITHMS = ("nccl", "ring", "hierarchical")
EXCHANGES = (*ALLREDUCE_ALGORITHMS, "ps")  # how one exchange travels: an all-reduce, or a parameter server
NCCL_ALGO_ACROSS_NODES = {"nccl": None, "ring": "ring", "hierarchical": "tree"}


@dataclass
class Fabric:
    """Where a data-parallel job runs: ``gpus_per_node`` GPUs of each of ``nodes`` copies of ``node``."""

    node: Topology
    gpus_per_node: int
    nodes: int = 1
    net_bandwidth_bytes_per_s: float = 0.0  # per node per direction, effective (all NICs)
    net_latency_s: float = 0.0              # one message node to node: wire + switches + software
    name: str = ""
    cluster: Topology | None = None         # all nodes and their network, as one topology (several nodes)

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


def system_fabric(topo: Topology, gpus: int) -> Fabric:
    """The first ``gpus`` GPUs of one system; an error beyond the system's size."""
    have = len(topo.devices())
    if not 1 <= gpus <= have:
        raise MeshscaleError(f"{topo.name} has {have} GPUs, cannot use {gpus}; pick --gpus between 1 and {have} "
                             "or describe a cluster with --nodes")
    return Fabric(topo, gpus, 1, name=topo.name)


def cluster_fabric(spec: ClusterSpec, nodes: int, params: SimParams | None = None) -> tuple[Fabric, ClusterPlan]:
    """``nodes`` full nodes of the cluster ``spec`` (the tree re-sized for that many nodes)."""
    params = params or SimParams()
    plan = plan_cluster(replace(spec, nodes=nodes))
    kind = plan.net.kind
    bandwidth = plan.node_bandwidth_bytes_per_s * params.efficiency_of(kind)
    latency = plan.latency_s + params.message_latency_of(kind)
    if not spec.gpudirect:  # staged through host memory: the data crosses the host's PCIe twice
        bandwidth = min(bandwidth, host_bandwidth(plan.node_topology) / 2)
        latency += 2 * params.message_latency_of("pcie")
    fabric = Fabric(plan.node_topology, plan.gpus_per_node, nodes, bandwidth, latency,
                    f"{nodes} x {plan.node_topology.name} ({spec.nics}x {plan.net.name}{', rails' if plan.rails else ''})",
                    cluster_topology(replace(spec, nodes=nodes)) if nodes > 1 else None)
    return fabric, plan


def cluster_topology(spec: ClusterSpec) -> Topology:
    """The cluster ``spec`` as one topology, built once per spec: NCCL's model keeps its ring and tree search on
    the topology object, so every later size costs next to nothing."""
    return _cluster_topology(astuple(spec))


@lru_cache(maxsize=64)
def _cluster_topology(fields: tuple) -> Topology:
    return build_cluster(plan_cluster(ClusterSpec(*fields)))


def host_bandwidth(topo: Topology) -> float:
    """Bytes/s per direction between the GPUs and the CPUs' memory: the PCIe links into the CPUs (not NICs)."""
    cpus = set(topo.nodes_of("cpu") + topo.nodes_of("host"))
    total = sum(l.bandwidth_bytes_per_s for l in topo.links if l.kind == "pcie" and (l.a in cpus) != (l.b in cpus)
                and topo.nodes[l.b if l.a in cpus else l.a].kind in ("pcie_switch", "gpu"))
    if total <= 0:
        raise MeshscaleError(f"{topo.name} has no PCIe path between GPUs and CPUs; a parameter server needs one")
    return total


def _edge_bandwidth(topo: Topology, u: int, v: int, params: SimParams) -> float:
    """Effective bytes/s from device u to v: per path of the route, its rate capped by every link's line rate
    x that link kind's efficiency (a PCIe path across QPI runs at QPI's achieved rate); paths add up."""
    r = route(topo, topo.device(u), topo.device(v))
    return sum(min([path.bandwidth_bytes_per_s] + [topo.links[i].bandwidth_bytes_per_s * params.efficiency_of(topo.links[i].kind)
                                                   for i, _ in path.directed_links]) for path in r.paths)


def ring_alpha_beta_s(topo: Topology, ranks: list[int], nbytes: float, params: SimParams) -> float:
    """Ring all-reduce by alpha-beta on the widest ring order (all orders up to 8 devices, else greedy), with
    one ring per NVLink when the ring is all NVLink (``intra="alpha-beta"``: independent of the simulator's
    own ring choices)."""
    p = len(ranks)
    if p < 2:
        return 0.0
    edge = {(u, v): _edge_bandwidth(topo, u, v, params) for u in ranks for v in ranks if u != v}
    first, rest = ranks[0], ranks[1:]
    if p <= 8:
        orders = [[first, *perm] for perm in itertools.permutations(rest)]
    else:
        order = [first]
        while len(order) < p:
            order.append(max((r for r in ranks if r not in order), key=lambda r: edge[(order[-1], r)]))
        orders = [order]
    best, bandwidth = orders[0], 0.0
    for order in orders:
        b = min(edge[(u, v)] for u, v in zip(order, order[1:] + order[:1]))
        if b > bandwidth:
            best, bandwidth = order, b
    if all(any(l.kind == "nvlink" for l in topo.links_between(topo.device(u), topo.device(v)))
           for u, v in zip(best, best[1:] + best[:1])):
        # an all-NVLink ring: NCCL runs one ring per link (DGX-1 P100: 4 rings, "over 60 GB/s"), bounded by
        # the NVLinks each GPU has to the other ranks
        names = {topo.device(r) for r in ranks}
        bandwidth = max(bandwidth, min(sum(l.bandwidth_bytes_per_s * params.efficiency_of("nvlink")
                                           for l in topo.links_of(n, "nvlink") if l.other(n) in names) for n in names))
    alpha = max(route(topo, topo.device(u), topo.device(v)).latency_s for u, v in zip(best, best[1:] + best[:1]))
    alpha += params.message_latency_of("default")
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * nbytes / bandwidth


class Exchange:
    """Exchange times on one fabric by one route (``EXCHANGES``), as the NCCL of ``nccl_version`` would run
    them (None: the collective model's default). Intra-node times are cached per size."""

    def __init__(self, fabric: Fabric, algorithm: str = "nccl", params: SimParams | None = None,
                 intra: str = "simulator", nccl_version: str | None = None, nccl_env: NcclEnv | None = None):
        check_choice(algorithm, EXCHANGES, "exchange")
        if intra not in ("simulator", "alpha-beta"):
            raise MeshscaleError(f"unknown intra-node model {intra!r}; use simulator or alpha-beta")
        self.fabric, self.algorithm, self.intra, self.nccl_version = fabric, algorithm, intra, nccl_version
        self.nccl_env = nccl_env
        self.params = params or SimParams()
        self.calibration = params  # a fitted link model, or None (NCCL's defaults)
        self._cache: dict = {}
        self.source = ""
        self.chosen: dict[float, str] = {}  # bytes -> what NCCL ran for that size (e.g. "tree/LL128")

    def intra_allreduce_s(self, nbytes: float) -> float:
        """All-reduce of ``nbytes`` among the GPUs of one node (simulated, cached)."""
        g = self.fabric.gpus_per_node
        if g < 2:
            return 0.0
        if nbytes not in self._cache:
            ranks = [self.fabric.node.nodes[d].index for d in self.fabric.node.devices()[:g]]
            if self.intra == "alpha-beta":
                self.source = "alpha-beta ring on the topology"
                self._cache[nbytes] = ring_alpha_beta_s(self.fabric.node, ranks, nbytes, self.params)
            else:
                from meshscale.simulate import predict_collective
                self.source = "NCCL cost model"
                # inside a node NCCL makes its own choice (its rings, its protocols), as across nodes: one model
                found = predict_collective(self.fabric.node, "all_reduce", ranks, int(nbytes), params=self.params,
                                           nccl_version=self.nccl_version, nccl_env=self.nccl_env)
                self._cache[nbytes], self.chosen[nbytes] = found.time_s, _algo_proto(found.detail)
        return self._cache[nbytes]

    @property
    def chosen_algorithm(self) -> str:
        """What NCCL ran for the largest all-reduce priced so far ("" before any, or for a parameter server)."""
        return self.chosen[max(self.chosen)] if self.chosen else ""

    def ps_s(self, nbytes: float) -> float:
        """Push to one parameter server and pull back: every GPU's ``nbytes`` through the server's links."""
        f = self.fabric
        per_node = f.gpus_per_node * nbytes / (host_bandwidth(f.node) * self.params.efficiency_of("pcie"))
        if f.nodes == 1:
            return 2 * (per_node + self.params.message_latency_of("pcie"))
        server = f.world_size * nbytes / f.net_bandwidth_bytes_per_s
        return 2 * (max(per_node, server) + f.net_latency_s)

    def allreduce_s(self, nbytes: float) -> float:
        """Seconds to exchange ``nbytes`` of gradients once across the whole fabric."""
        f = self.fabric
        if f.world_size < 2 or nbytes <= 0:
            return 0.0
        if self.algorithm == "ps":
            return self.ps_s(nbytes)
        if f.nodes == 1:
            return self.intra_allreduce_s(nbytes)
        return self.cluster_allreduce_s(nbytes)

    def cluster_allreduce_s(self, nbytes: float) -> float:
        """All-reduce of ``nbytes`` among every GPU of the cluster: NCCL's cost model on the cluster topology,
        NCCL's pick, or the algorithm forced (ring, or tree for hierarchical), as `sim` would time it (cached per size)."""
        from meshscale.simulate import predict_collective

        f = self.fabric
        if f.cluster is None:
            raise MeshscaleError(f"{f.name or f.node.name}: a fabric of {f.nodes} nodes needs its cluster topology")
        key = ("cluster", nbytes)
        if key not in self._cache:
            self.source = "NCCL cost model on the cluster"
            ranks = [f.cluster.nodes[d].index for d in f.cluster.devices()]
            try:
                found = predict_collective(f.cluster, "all_reduce", ranks, int(nbytes), params=self.calibration,
                                           nccl_version=self.nccl_version, nccl_env=self.nccl_env,
                                           nccl_algo=NCCL_ALGO_ACROSS_NODES[self.algorithm])
                self._cache[key], self.chosen[nbytes] = found.time_s, _algo_proto(found.detail)
            except MeshscaleError as e:
                if self.algorithm != "hierarchical":
                    raise
                raise MeshscaleError(f"the hierarchical all-reduce across nodes is NCCL's tree, which NCCL "
                                     f"{self.nccl_version} does not have; use --algo ring") from e
        return self._cache[key]


def _algo_proto(detail: str) -> str:
    """"tree/LL128" out of a prediction's detail ("nccl tree/LL128, 24 channels")."""
    return detail.removeprefix("nccl ").split(",")[0]
