"""The topology data model: typed nodes and links, shared by every layer of meshscale.

A `Topology` is plain data (nodes, links, a few attributes). The networkx graphs used for queries are
derived from it on demand and never exposed; see `queries.py` for paths, bandwidths and relations.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import networkx as nx

from meshscale.errors import TopologyError

if TYPE_CHECKING:
    from meshscale.topology.fabric import Cluster

# "worker" is a CPU process acting as a rank on machines with no GPU (linked to its host over shared memory).
NODE_KINDS = ("gpu", "cpu", "pcie_switch", "nvswitch", "nic", "net_switch", "host", "worker")
DEVICE_KINDS = ("gpu", "worker")
# "c2c": NVLink-C2C, the coherent link between a Grace CPU and its GPUs (GH200, GB200, GB300), not an NVLink port
# of the GPU's NVLink fabric (NVIDIA GB200 NVL72 datasheet: 900 GB/s both directions)
LINK_KINDS = ("pcie", "nvlink", "c2c", "qpi", "upi", "infiniband", "ethernet", "shm")

# Default one-way latency per hop, seconds; a link may set its own. Rough public figures: NVLink and PCIe
# P2P about a microsecond per hop as seen by a copy engine, the inter-socket link less, InfiniBand 1.01 us
# system to system (NVIDIA DGX-1 System Architecture whitepaper, section 3.3) split over the two NIC links.
DEFAULT_LATENCY_S = {
    "nvlink": 0.7e-6,
    "c2c": 0.7e-6,      # an NVLink-family link: NVLink's figure
    "pcie": 1.0e-6,
    "qpi": 0.5e-6,
    "upi": 0.5e-6,
    "infiniband": 0.505e-6,
    "ethernet": 2.5e-6,
    "shm": 2.0e-6,
}


@dataclass
class Node:
    """A device in the system. ``attrs`` holds kind-specific facts (GPU model, index, memory_bytes, numa...)."""

    name: str
    kind: str
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def index(self) -> int | None:
        return self.attrs.get("index")


@dataclass
class Link:
    """A bidirectional link; ``bandwidth_bytes_per_s`` is per direction for the whole bundle of ``count`` links."""

    a: str
    b: str
    kind: str
    bandwidth_bytes_per_s: float
    latency_s: float
    count: int = 1
    generation: int | None = None
    width: int | None = None
    rate: str | None = None

    def other(self, name: str) -> str:
        return self.b if name == self.a else self.a

    @property
    def label(self) -> str:
        """Short human name: 'NVLink1 x2', 'PCIe3 x16', 'EDR 4x', 'QPI'."""
        if self.kind == "nvlink":
            return f"NVLink{self.generation or ''} x{self.count}"
        if self.kind == "pcie":
            return f"PCIe{self.generation or ''} x{self.width or '?'}"
        if self.kind == "infiniband":
            return f"{(self.rate or 'IB').upper()} {self.width or 4}x" + (f" x{self.count}" if self.count > 1 else "")
        return self.kind.upper() + (f" x{self.count}" if self.count > 1 else "")


@dataclass
class Topology:
    """A system: named nodes and the links between them. Construct, then treat as read-only. ``cluster``: the
    network joining the nodes of a cluster (or of hosts joined under torchrun); None for one system."""

    name: str
    nodes: dict[str, Node]
    links: list[Link]
    title: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)
    cluster: Cluster | None = None

    def __post_init__(self) -> None:
        self._check()

    def _check(self) -> None:
        seen_pairs: dict[tuple[str, str, str], int] = {}
        for i, link in enumerate(self.links):
            where = f"link {i} ({link.a} - {link.b})"
            for end in (link.a, link.b):
                if end not in self.nodes:
                    raise TopologyError(f"{self.name}: {where} names node {end!r}, which does not exist; define it under nodes")
            if link.a == link.b:
                raise TopologyError(f"{self.name}: {where} joins a node to itself; give two different nodes")
            if link.kind not in LINK_KINDS:
                raise TopologyError(f"{self.name}: {where} has unknown kind {link.kind!r}; use one of {', '.join(LINK_KINDS)}")
            if not link.bandwidth_bytes_per_s > 0:
                raise TopologyError(f"{self.name}: {where} has bandwidth {link.bandwidth_bytes_per_s}; it must be positive")
            if link.latency_s < 0:
                raise TopologyError(f"{self.name}: {where} has negative latency {link.latency_s}; it must be >= 0")
            key = (*sorted((link.a, link.b)), link.kind)
            if key in seen_pairs:
                raise TopologyError(
                    f"{self.name}: {where} repeats link {seen_pairs[key]} ({link.kind}); merge them into one entry with count: N"
                )
            seen_pairs[key] = i
        for name, node in self.nodes.items():
            if node.name != name:
                raise TopologyError(f"{self.name}: node key {name!r} differs from its name {node.name!r}")
            if node.kind not in NODE_KINDS:
                raise TopologyError(f"{self.name}: node {name!r} has unknown kind {node.kind!r}; use one of {', '.join(NODE_KINDS)}")
        indices = [n.index for n in self.nodes.values() if n.kind in DEVICE_KINDS]
        if any(not isinstance(i, int) for i in indices) or len(set(indices)) != len(indices):
            raise TopologyError(f"{self.name}: every GPU (or worker) needs a distinct integer index (the nvidia-smi number)")
        if self.nodes_of("gpu") and self.nodes_of("worker"):
            raise TopologyError(f"{self.name}: mixes GPUs and CPU workers; a system has one kind of rank device")

    # ---- lookups -------------------------------------------------------------------------------------
    def gpus(self) -> list[str]:
        """GPU node names in nvidia-smi order (by index)."""
        return sorted(self.nodes_of("gpu"), key=lambda name: self.nodes[name].index)

    def devices(self) -> list[str]:
        """The rank devices in index order: the GPUs, or the CPU workers of a machine with no GPU."""
        kind = "gpu" if self.nodes_of("gpu") else "worker"
        return sorted(self.nodes_of(kind), key=lambda name: self.nodes[name].index)

    def device_indices(self) -> list[int]:
        """The rank devices' indices, in the order `devices` names them."""
        return [self.nodes[d].index for d in self.devices()]

    @property
    def device_kind(self) -> str:
        return "gpu" if self.nodes_of("gpu") else "worker"

    def device(self, index: int) -> str:
        """The name of the device (GPU or worker) with index ``index`` (the nvidia-smi number for GPUs)."""
        name = self._device_by_index.get(index)
        if name is not None:
            return name
        have = self.device_indices()
        raise TopologyError(f"{self.name} has no {self.device_kind} {index}; its {self.device_kind}s are {have}")

    @cached_property
    def _device_by_index(self) -> dict[int, str]:
        # device() sits in the inner loops of ring search and simulation: a dict, not a sort per call
        return {self.nodes[name].index: name for name in self.devices()}

    def nodes_of(self, kind: str) -> list[str]:
        return list(self._nodes_by_kind.get(kind, ()))

    def links_of(self, name: str, kind: str | None = None) -> list[Link]:
        """Links that touch node ``name`` (optionally of one kind)."""
        return [l for l in self._links_by_node.get(name, ()) if kind is None or l.kind == kind]

    def links_between(self, a: str, b: str) -> list[Link]:
        return [l for l in self._links_by_node.get(a, ()) if l.other(a) == b and a != b]

    # indexes of the read-only data: a cluster of thousands of nodes asks these in its inner loops, where a
    # scan of every link per question costs time that grows with the square of the cluster
    @cached_property
    def _nodes_by_kind(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for n in self.nodes.values():
            out.setdefault(n.kind, []).append(n.name)
        return out

    @cached_property
    def _links_by_node(self) -> dict[str, list[Link]]:
        out: dict[str, list[Link]] = {}
        for l in self.links:
            out.setdefault(l.a, []).append(l)
            if l.b != l.a:
                out.setdefault(l.b, []).append(l)
        return out

    @cached_property
    def route_cache(self) -> dict:
        """Memo of query results (routes, bisections), filled by `queries` (not part of the data)."""
        return {}

    def nvlink_count(self, gpu: str) -> int:
        """Number of NVLinks leaving a GPU (to peers or to NVSwitches)."""
        return sum(l.count for l in self.links_of(gpu, "nvlink"))

    @property
    def gpu_model(self) -> str:
        models = {self.nodes[g].attrs.get("model", "?") for g in self.devices()}
        return ", ".join(sorted(models)) if models else "none"

    @cached_property
    def graph(self) -> nx.MultiGraph:
        """The undirected multigraph of nodes and links (for internal queries; the API is meshscale's)."""
        g = nx.MultiGraph()
        for node in self.nodes.values():
            g.add_node(node.name, kind=node.kind)
        for i, link in enumerate(self.links):
            g.add_edge(link.a, link.b, key=i, link=link)
        return g
