"""Time of the gradient exchange: all-reduce (flat ring or hierarchical) or parameter server, on one system or a
cluster of them (a `Topology`; a cluster's carries its network as ``topology.cluster``).

Every all-reduce is priced by a `CostModel` (`simulate.cost`): by default NCCL's, inside a node and across nodes
on the whole cluster's topology (the one `sim` and `plan` use):
- nccl (the default): what NCCL picks for each size (Ring, Tree, NVLS-Tree, ...), as a run without NCCL_ALGO does;
- ring: one flat ring of all GPUs (NCCL_ALGO=Ring);
- hierarchical: reduce inside the node, a tree across nodes, broadcast back (NCCL_ALGO=Tree);
- ps (mode ps-sync): every GPU pushes its gradients to one server and pulls the result back, through the
  server's links (host PCIe on one node, the server node's NICs across nodes).
Inside a node another model may stand in (``intra``: `AlphaBetaCostModel`, say). Times are cached per bucket
size; the cluster topology (and so NCCL's ring and tree search on it) per cluster and node count, so a sweep up
to 124 nodes x 8 GPUs stays fast.
"""
from __future__ import annotations

from dataclasses import astuple, replace
from functools import lru_cache

from meshscale.errors import MeshscaleError, check_choice
from meshscale.simulate.cost import Call, CostModel, FlowCostModel, NcclCostModel
from meshscale.simulate.nccl_env import DEFAULT_ENV, NcclEnv
from meshscale.simulate.params import SimParams
from meshscale.topology import Topology
from meshscale.topology.cluster import ClusterSpec, build_cluster, plan_cluster

ALLREDUCE_ALGORITHMS = ("nccl", "ring", "hierarchical")
EXCHANGES = (*ALLREDUCE_ALGORITHMS, "ps")  # how one exchange travels: an all-reduce, or a parameter server
NCCL_ALGO_ACROSS_NODES = {"nccl": None, "ring": "ring", "hierarchical": "tree"}


def cluster_topology(spec: ClusterSpec, nodes: int | None = None) -> Topology:
    """``nodes`` full nodes (default ``spec.nodes``) of the cluster ``spec`` as one topology (the tree re-sized
    for that many nodes; one node: the node's own system), built once per spec: NCCL's model keeps its ring and
    tree search on the topology object, so every later size costs next to nothing."""
    return _cluster_topology(astuple(replace(spec, nodes=nodes or spec.nodes)))


@lru_cache(maxsize=64)
def _cluster_topology(fields: tuple) -> Topology:
    plan = plan_cluster(ClusterSpec(*fields))
    return build_cluster(plan) if plan.spec.nodes > 1 else plan.node_topology


def network_bytes_per_s(topo: Topology, params: SimParams | None = None) -> float:
    """What one node of the cluster ``topo`` moves into the network per direction, all NICs at their achieved
    rate; without GPUDirect RDMA no more than half the host's PCIe (the data crosses it twice)."""
    cluster, params = _cluster_of(topo), params or SimParams()
    bandwidth = cluster.node_bandwidth_bytes_per_s * params.efficiency_of(cluster.net.kind)
    if not cluster.gpudirect:
        bandwidth = min(bandwidth, host_bandwidth(topo) / cluster.nodes / 2)
    return bandwidth


def network_latency_s(topo: Topology, params: SimParams | None = None) -> float:
    """One message node to node on the cluster ``topo``: its wire and switches, the software's per message, and
    without GPUDirect RDMA two more crossings of the host's PCIe."""
    cluster, params = _cluster_of(topo), params or SimParams()
    latency = cluster.latency_s + params.message_latency_of(cluster.net.kind)
    if not cluster.gpudirect:
        latency += 2 * params.message_latency_of("pcie")
    return latency


def _cluster_of(topo: Topology):
    if topo.cluster is None:
        raise MeshscaleError(f"{topo.name} is one system; the network figures need a cluster (--nodes N)")
    return topo.cluster


def system_gpus(topo: Topology, gpus: int) -> int:
    """``gpus`` checked against the system's size: an error beyond it."""
    have = len(topo.devices())
    if not 1 <= gpus <= have:
        raise MeshscaleError(f"{topo.name} has {have} GPUs, cannot use {gpus}; pick --gpus between 1 and {have} "
                             "or describe a cluster with --nodes")
    return gpus


def host_bandwidth(topo: Topology) -> float:
    """Bytes/s per direction between the GPUs and the CPUs' memory: the PCIe links into the CPUs (not NICs)."""
    cpus = set(topo.nodes_of("cpu") + topo.nodes_of("host"))
    total = sum(l.bandwidth_bytes_per_s for l in topo.links if l.kind == "pcie" and (l.a in cpus) != (l.b in cpus)
                and topo.nodes[l.b if l.a in cpus else l.a].kind in ("pcie_switch", "gpu"))
    if total <= 0:
        raise MeshscaleError(f"{topo.name} has no PCIe path between GPUs and CPUs; a parameter server needs one")
    return total


class Exchange:
    """Exchange times of the first ``gpus`` GPUs of a system, or of every GPU of a cluster ``topology``, by one
    route (``EXCHANGES``). All-reduces are priced by ``intra`` inside a node (default: NCCL's model of
    ``nccl_version`` in ``nccl_env``) and by NCCL's model across nodes; ``params``: a calibration of the links.
    Times are cached per size."""

    def __init__(self, topology: Topology, gpus: int | None = None, algorithm: str = "nccl",
                 params: SimParams | None = None, intra: CostModel | None = None, nccl_version: str | None = None,
                 nccl_env: NcclEnv | None = None):
        check_choice(algorithm, EXCHANGES, "exchange")
        self.topology, self.algorithm, self.nccl_version = topology, algorithm, nccl_version
        self.world_size = system_gpus(topology, gpus) if gpus is not None else len(topology.devices())
        self.nodes = len({topology.nodes[d].attrs.get("node", 0) for d in topology.devices()[:self.world_size]})
        self.params = params or SimParams()
        env = nccl_env or DEFAULT_ENV
        if topology.device_kind == "gpu":
            self.intra = intra or NcclCostModel(env, nccl_version, self.params)
            # across nodes: NCCL's pick, or its algorithm forced; the links as calibrated, or NCCL's defaults
            self.across: CostModel = NcclCostModel(env, nccl_version, params, NCCL_ALGO_ACROSS_NODES.get(algorithm))
        else:  # CPU workers have no NCCL: meshscale's fastest schedule by flow simulation (Gloo's stand-in)
            self.intra = intra or FlowCostModel("auto", self.params)
            self.across = FlowCostModel("auto", self.params)
        self._cache: dict[float, float] = {}
        self.chosen: dict[float, str] = {}  # bytes -> what NCCL ran for that size (e.g. "tree/LL128")

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(self.topology.nodes[d].index for d in self.topology.devices()[:self.world_size])

    @property
    def gpus_per_node(self) -> int:
        return self.world_size // self.nodes

    @property
    def chosen_algorithm(self) -> str:
        """What NCCL ran for the largest all-reduce priced so far ("" before any, or for a parameter server)."""
        return self.chosen[max(self.chosen)] if self.chosen else ""

    def _priced(self, model: CostModel, nbytes: float) -> float:
        if nbytes not in self._cache:
            found = model.predict(Call("all_reduce", int(nbytes), self.ranks), self.topology)
            self._cache[nbytes] = found.time_s
            if found.model == "nccl":
                self.chosen[nbytes] = found.chosen.split(",")[0]
        return self._cache[nbytes]

    def ps_s(self, nbytes: float) -> float:
        """Push to one parameter server and pull back: every GPU's ``nbytes`` through the server's links."""
        per_node = self.gpus_per_node * nbytes / (host_bandwidth(self.topology) / self.nodes
                                                  * self.params.efficiency_of("pcie"))
        if self.nodes == 1:
            return 2 * (per_node + self.params.message_latency_of("pcie"))
        server = self.world_size * nbytes / network_bytes_per_s(self.topology, self.params)
        return 2 * (max(per_node, server) + network_latency_s(self.topology, self.params))

    def allreduce_s(self, nbytes: float) -> float:
        """Seconds to exchange ``nbytes`` of gradients once across the whole fabric."""
        if self.world_size < 2 or nbytes <= 0:
            return 0.0
        if self.algorithm == "ps":
            return self.ps_s(nbytes)
        if self.nodes == 1:
            return self._priced(self.intra, nbytes)
        try:
            return self._priced(self.across, nbytes)
        except MeshscaleError as e:
            if self.algorithm != "hierarchical":
                raise
            raise MeshscaleError(f"the hierarchical all-reduce across nodes is NCCL's tree, which NCCL "
                                 f"{self.nccl_version} does not have; use --algo ring") from e
