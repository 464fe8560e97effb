"""Data parallelism's gradient exchange among replicas (DDP, Horovod, CNTK 2016, a parameter server), one
mechanism for every model the step model prices with replicas that are not sharded (ResNets, train's GPTs under
DDP, a model timed by its measured profile):

- which exchanges a step makes: the framework's (`meshscale.predict.frameworks`: DDP's 25 MiB buckets of whole
  tensors in gradient-ready order, Horovod's 64 MiB fusion, CNTK's one all-reduce per matrix after backward), or
  one push to a parameter server and its pull back after backward (mode ps-sync);
- when each can start: once backward has completed its gradients (`meshscale.predict.gradient_tensors`: a
  layer's gradients are complete when backward has done the layers from the output down to it);
- how long each takes: the all-reduce among the replicas priced on the allocation (`comm.collective_cost`, by the
  framework's NCCL), the parameter server through its host's PCIe and its node's NICs;
- what stays exposed: exchanges run one at a time, each from when its gradients are complete; what the rest of
  backward covers hides (`exposed_exchange_s`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from meshscale.errors import MeshscaleError, check_choice
from meshscale.predict.frameworks import FRAMEWORKS, WIRE_BYTES, Bucket, Framework, resolve_framework
from meshscale.predict.gradient_tensors import GradientTensor
from meshscale.predict.training.comm import CollectiveCost, Allocation, collective_cost

PS_WIRE = "fp32"  # a parameter server receives the gradients as they are


@dataclass(frozen=True)
class GradientExchange:
    """How replicas exchange gradients: ``framework`` (a name of FRAMEWORKS; None: one parameter server, mode
    ps-sync) with its gradients on the wire as ``wire`` (None: the framework's)."""

    framework: str | None = "ddp"
    wire: str | None = None

    def __post_init__(self) -> None:
        if self.framework is not None:
            check_choice(self.framework, tuple(FRAMEWORKS), "framework")
        if self.wire is not None:
            check_choice(self.wire, tuple(WIRE_BYTES), "wire precision")

    @classmethod
    def of(cls, mode: str | None, framework: str | None, wire: str | None = None) -> GradientExchange:
        """The exchange `meshscale train --mode` (or a named framework) makes."""
        mode, found = resolve_framework(mode, framework)
        return cls(None if mode == "ps-sync" else found.name, wire)

    @property
    def spec(self) -> Framework | None:
        return FRAMEWORKS[self.framework] if self.framework else None

    @property
    def name(self) -> str:
        return self.framework or "parameter server"

    def buckets(self, gradients: list[GradientTensor]) -> list[Bucket]:
        """The exchanges of one step, in issue order, with when each can start."""
        if self.spec is None:
            params = sum(g.elements for g in gradients)
            return [Bucket(float(params * WIRE_BYTES[self.wire or PS_WIRE]), 1.0)]
        return self.spec.exchange(gradients, self.wire)


@dataclass(frozen=True)
class ReplicaCost:
    """One step's exchange: every exchange's time (``costs``), the exposed part, what NCCL ran for the
    largest."""

    costs: tuple[CollectiveCost, ...]
    exposed_s: float
    chosen: str = ""

    @property
    def total_s(self) -> float:
        return sum(c.seconds for c in self.costs)


def exposed_exchange_s(bucket_times_s: list[float], ready_shares: list[float], backward_s: float,
                       compute_s: float) -> float:
    """Exchange time left after compute ends: bucket i can start once ``ready_shares[i]`` of backward (the last
    ``backward_s`` of compute) is done (1.0: after backward, as a framework that does not overlap starts them),
    and exchanges run one at a time."""
    end = -compute_s  # times counted from the end of compute: all after backward sums exactly to the exchange
    for share, t in zip(ready_shares, bucket_times_s):
        end = max(end, -backward_s * (1.0 - share)) + t
    return max(0.0, end)


def replica_exchange(exchange: GradientExchange, gradients: list[GradientTensor], group: Sequence[int],
                     allocation: Allocation, backward_s: float, compute_s: float) -> ReplicaCost:
    """The step's gradient exchange among the replicas ``group`` (global ranks) on ``allocation``, after
    ``backward_s`` of backward ending ``compute_s`` of compute."""
    if len(group) < 2:
        return ReplicaCost((), 0.0)
    buckets = exchange.buckets(gradients)
    if exchange.spec is None:
        costs = [CollectiveCost(parameter_server_s(b.nbytes, len(group), allocation)) for b in buckets]
    else:
        version = exchange.spec.nccl_version
        costs = [collective_cost("all_reduce", b.nbytes, group, allocation, version) for b in buckets]
    exposed = exposed_exchange_s([c.seconds for c in costs], [b.ready_share for b in buckets], backward_s, compute_s)
    largest = max(range(len(buckets)), key=lambda i: buckets[i].nbytes)
    return ReplicaCost(tuple(costs), exposed, costs[largest].chosen)


def parameter_server_s(nbytes: float, world: int, allocation: Allocation) -> float:
    """Push to one parameter server and pull back: every GPU's ``nbytes`` through the server's links (its
    host's PCIe on one node; across nodes also the server node's NICs)."""
    from meshscale.simulate.params import SimParams

    params = allocation.params or SimParams()
    nodes = allocation.nodes
    if nodes > 16:
        raise MeshscaleError("a parameter server is priced up to 16 nodes")
    fabric = allocation.at(nodes)
    per_node = min(world, allocation.gpus_per_node) * nbytes / (host_bandwidth(fabric.topology) / nodes
                                                               * params.efficiency_of("pcie"))
    if nodes == 1:
        return 2 * (per_node + params.message_latency_of("pcie"))
    server = world * nbytes / network_bytes_per_s(fabric.topology, params)
    return 2 * (max(per_node, server) + fabric.network_latency_s())


def network_bytes_per_s(topo, params) -> float:
    """What one node of the cluster ``topo`` moves into the network per direction, all NICs at their achieved
    rate; without GPUDirect RDMA no more than half the host's PCIe (the data crosses it twice)."""
    cluster = topo.cluster
    bandwidth = cluster.node_bandwidth_bytes_per_s * params.efficiency_of(cluster.net.kind)
    if not cluster.gpudirect:
        bandwidth = min(bandwidth, host_bandwidth(topo) / cluster.nodes / 2)
    return bandwidth


def host_bandwidth(topo) -> float:
    """Bytes/s per direction between the GPUs and the CPUs' memory: the PCIe links into the CPUs (not NICs)."""
    cpus = set(topo.nodes_of("cpu") + topo.nodes_of("host"))
    total = sum(l.bandwidth_bytes_per_s for l in topo.links if l.kind == "pcie" and (l.a in cpus) != (l.b in cpus)
                and topo.nodes[l.b if l.a in cpus else l.a].kind in ("pcie_switch", "gpu"))
    if total <= 0:
        raise MeshscaleError(f"{topo.name} has no PCIe path between GPUs and CPUs; a parameter server needs one")
    return total
