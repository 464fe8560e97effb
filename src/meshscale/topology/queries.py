"""Queries on a `Topology` that every later layer needs: routes and their bandwidth, the nvidia-smi relation
of two GPUs, sub-topologies, bisection bandwidth and link sharing.

Routing model. Devices (GPUs, workers) are endpoints, never relays. A transfer uses the fastest fabric that
joins its two ends, in the order NCCL prefers: NVLink (direct or through NVSwitches), then PCIe / QPI / UPI
inside a host, then the network. Inside that fabric it spreads over all paths the max-flow finds, so a DGX-2
GPU pair uses its six NVSwitch paths at once while a PCIe tree has one path.
"""
from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from dataclasses import dataclass

import networkx as nx
import numpy as np

from meshscale.errors import TopologyError
from meshscale.topology.model import DEVICE_KINDS, Link, Node, Topology

# Fabrics in order of preference: (name, link kinds it may use, node kinds that may relay).
FABRICS = (
    ("nvlink", {"nvlink"}, {"nvswitch"}),
    ("pcie", {"pcie", "c2c", "qpi", "upi", "shm"}, {"pcie_switch", "cpu", "host"}),
    ("network", {"pcie", "c2c", "qpi", "upi", "shm", "nvlink", "infiniband", "ethernet"},
     {"pcie_switch", "cpu", "host", "nic", "net_switch", "nvswitch"}),
)
_FLOW_UNIT = 1e6  # max-flow runs on integer capacities in MB/s

DirectedLink = tuple[int, int]  # (index into topology.links, 0 for a->b or 1 for b->a)


@dataclass(frozen=True)
class Path:
    """One path of a route and the share of the route's bandwidth it carries."""

    nodes: tuple[str, ...]
    directed_links: tuple[DirectedLink, ...]
    bandwidth_bytes_per_s: float


@dataclass(frozen=True)
class Route:
    """How data moves from ``src`` to ``dst``: the fabric used and the paths that carry it."""

    src: str
    dst: str
    fabric: str
    paths: tuple[Path, ...]
    bandwidth_bytes_per_s: float
    latency_s: float

    def directed_links(self) -> set[DirectedLink]:
        return {dl for p in self.paths for dl in p.directed_links}


def _fabric_graph(topo: Topology, fabric: tuple, src: str, dst: str) -> nx.DiGraph:
    """Directed graph of one fabric with capacities (per direction), relays restricted to allowed kinds."""
    _, link_kinds, relay_kinds = fabric
    allowed = {n for n, node in topo.nodes.items() if node.kind in relay_kinds} | {src, dst}
    g = nx.DiGraph()
    for i, link in enumerate(topo.links):
        if link.kind not in link_kinds or link.a not in allowed or link.b not in allowed:
            continue
        cap = int(round(link.bandwidth_bytes_per_s / _FLOW_UNIT))
        for u, v, direction in ((link.a, link.b, 0), (link.b, link.a, 1)):
            if g.has_edge(u, v):  # parallel links of one fabric add up
                g[u][v]["capacity"] += cap
                g[u][v]["links"].append((i, direction))
            else:
                g.add_edge(u, v, capacity=cap, links=[(i, direction)])
    return g


def _decompose(g: nx.DiGraph, flow: dict, src: str, dst: str) -> list[tuple[list[str], float]]:
    """Split a flow into simple paths with their rates (greedy: widest remaining path first)."""
    remaining = {(u, v): f for u, nbrs in flow.items() for v, f in nbrs.items() if f > 0}
    # cancel flow that goes both ways on one pair (max-flow may leave such cycles)
    for (u, v) in list(remaining):
        if (v, u) in remaining and (u, v) in remaining:
            m = min(remaining[(u, v)], remaining[(v, u)])
            for e in ((u, v), (v, u)):
                remaining[e] -= m
                if remaining[e] <= 0:
                    del remaining[e]
    paths = []
    while True:
        h = nx.DiGraph()
        h.add_edges_from((u, v, {"f": f}) for (u, v), f in remaining.items())
        if src not in h or dst not in h or not nx.has_path(h, src, dst):
            break
        path = nx.shortest_path(h, src, dst)
        rate = min(remaining[(u, v)] for u, v in zip(path, path[1:]))
        for e in zip(path, path[1:]):
            remaining[e] -= rate
            if remaining[e] <= 0:
                del remaining[e]
        paths.append((path, rate))
    return paths


def _path_latency(topo: Topology, nodes: list[str], links: list[DirectedLink]) -> float:
    relay = sum(topo.nodes[n].attrs.get("latency_s", 0.0) for n in nodes[1:-1])
    return relay + sum(topo.links[i].latency_s for i, _ in links)


def route(topo: Topology, src: str, dst: str) -> Route:
    """The route from node ``src`` to node ``dst`` (names), cached on the topology."""
    key = (src, dst)
    if key in topo.route_cache:
        return topo.route_cache[key]
    for name in (src, dst):
        if name not in topo.nodes:
            raise TopologyError(f"{topo.name} has no node {name!r}")
    if src == dst:
        raise TopologyError(f"a route needs two different nodes, got {src!r} twice")
    for fabric in FABRICS:
        g = _fabric_graph(topo, fabric, src, dst)
        if src not in g or dst not in g or not nx.has_path(g, src, dst):
            continue
        value, flow = nx.maximum_flow(g, src, dst, capacity="capacity")
        paths = []
        for nodes, rate in _decompose(g, flow, src, dst):
            # parallel links of one hop: take them all, in proportion (they were summed into one edge)
            hops = [g[u][v]["links"] for u, v in zip(nodes, nodes[1:])]
            directed = tuple(dl for hop in hops for dl in hop)
            paths.append(Path(tuple(nodes), directed, rate * _FLOW_UNIT))
        latency = min(_path_latency(topo, list(p.nodes), list(p.directed_links)) for p in paths)
        result = Route(src, dst, fabric[0], tuple(paths), value * _FLOW_UNIT, latency)
        topo.route_cache[key] = result
        return result
    raise TopologyError(f"{topo.name}: no path joins {src} and {dst}; check the links of both")


def pair_bandwidth(topo: Topology, a: int | str, b: int | str) -> float:
    """Bytes/s per direction between two devices (indices or names), over all paths of their route."""
    return route(topo, _name(topo, a), _name(topo, b)).bandwidth_bytes_per_s


def bottleneck_bandwidth(topo: Topology, path_nodes: list[int | str]) -> float:
    """The smallest route bandwidth along a sequence of devices (a chain or a ring's order)."""
    names = [_name(topo, x) for x in path_nodes]
    return min(route(topo, u, v).bandwidth_bytes_per_s for u, v in zip(names, names[1:]))


def _name(topo: Topology, x: int | str) -> str:
    return topo.device(x) if isinstance(x, int) else x


RELATION_LEGEND = (
    ("X", "Self"),
    ("SYS", "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)"),
    ("NODE", "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node"),
    ("PHB", "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)"),
    ("PXB", "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)"),
    ("PIX", "Connection traversing at most a single PCIe bridge"),
    ("NV#", "Connection traversing a bonded set of # NVLinks"),
    ("NET", "Connection traversing the network between hosts (meshscale's addition)"),
)


def relation(topo: Topology, a: int | str, b: int | str) -> str:
    """The `nvidia-smi topo -m` relation of two nodes: X, NV#, PIX, PXB, PHB, NODE, SYS (or NET across hosts)."""
    a, b = _name(topo, a), _name(topo, b)
    if a == b:
        return "X"
    direct = sum(l.count for l in topo.links_between(a, b) if l.kind == "nvlink")
    if direct:
        return f"NV{direct}"
    r = route(topo, a, b)
    if r.fabric == "nvlink":  # through NVSwitches: nvidia-smi reports the links each GPU brings
        return f"NV{min(topo.nvlink_count(a), topo.nvlink_count(b))}"
    if r.fabric == "network":
        return "NET"
    return path_class(topo, r.paths[0].nodes)


def path_class(topo: Topology, path_nodes: list[str], nccl: bool = False) -> str:
    """The PCIe class (`nics.RELATIONS`) of a route's path (its node names, both ends included): SYS across two
    CPUs, PHB through one (NODE where the CPU says its root ports sit behind separate host bridges), PHB through
    a host bridge below the CPU, PIX through at most one PCIe switch, else PXB. ``nccl``: as NCCL's path types,
    which have no NODE (PHB there). The one place path classes are computed on a topology: `relation` (and so
    bench pairs) and NCCL's model."""
    relays = [topo.nodes[n] for n in path_nodes[1:-1]]
    cpus = [n for n in relays if n.kind in ("cpu", "host")]
    if len(cpus) >= 2:
        return "SYS"
    if len(cpus) == 1:
        found = cpus[0].attrs.get("pcie_relation", "PHB")
        return "PHB" if nccl and found == "NODE" else found
    if any(n.attrs.get("host_bridge") for n in relays):  # a root port shared below the CPU (discovered machines)
        return "PHB"
    return "PIX" if len([n for n in relays if n.kind == "pcie_switch"]) <= 1 else "PXB"


def subset(topo: Topology, indices: list[int]) -> Topology:
    """The topology with only the given devices (by index); other devices and their links are dropped.
    Devices keep their original indices; everything that is not a device stays."""
    if len(set(indices)) != len(indices):
        raise TopologyError(f"device list {indices} repeats a device")
    keep = {topo.device(i) for i in indices}
    nodes = {n: Node(n, node.kind, dict(node.attrs)) for n, node in topo.nodes.items()
             if node.kind not in DEVICE_KINDS or n in keep}
    links = [Link(**vars(l)) for l in topo.links if l.a in nodes and l.b in nodes]
    attrs = dict(topo.attrs, subset_of=topo.name)
    return Topology(f"{topo.name}[{','.join(map(str, indices))}]", nodes, links, topo.title, attrs, topo.cluster)


def bisection_bandwidth(topo: Topology, names: list[str] | None = None, max_exhaustive: int = 16,
                        link_kinds: set[str] | None = None) -> float:
    """Bytes/s per direction across the worst cut that splits ``names`` (default: the devices) into two
    halves: the minimum over balanced splits of the max-flow from one half to the other. Exhaustive up to
    ``max_exhaustive`` nodes; beyond that, networkx's Kernighan-Lin bisection gives an upper bound.
    ``link_kinds`` limits the links counted (e.g. ``{"nvlink"}`` for a fabric's own bisection)."""
    names = list(names or topo.devices())
    if len(names) < 2:
        raise TopologyError("bisection bandwidth needs at least two nodes")
    key = ("bisection", tuple(names), max_exhaustive, frozenset(link_kinds) if link_kinds is not None else None)
    if key not in topo.route_cache:  # thousands of max-flows for 16 GPUs: worth remembering
        topo.route_cache[key] = _bisection(topo, names, max_exhaustive, link_kinds)
    return topo.route_cache[key]


def _bisection(topo: Topology, names: list[str], max_exhaustive: int, link_kinds: set[str] | None) -> float:
    from scipy.sparse import csr_matrix  # scipy's graph tools take 0.2 s to load: only where a cut is asked
    from scipy.sparse.csgraph import maximum_flow

    links = [l for l in topo.links if link_kinds is None or l.kind in link_kinds]
    index = {n: i for i, n in enumerate(topo.nodes)}
    size = len(index) + 2
    source, sink = size - 2, size - 1
    base: dict[tuple[int, int], int] = {}
    for link in links:
        cap = int(round(link.bandwidth_bytes_per_s / _FLOW_UNIT))
        for u, v in ((link.a, link.b), (link.b, link.a)):
            key = (index[u], index[v])
            base[key] = base.get(key, 0) + cap
    infinite = sum(base.values()) + 1
    # one sparse matrix for every cut: only the source/sink arcs change, so find their slots in .data once
    for n in names:
        base[(source, index[n])] = base[(index[n], sink)] = 0
    rows, cols = zip(*base.keys())
    matrix = csr_matrix((np.array(list(base.values()), dtype=np.int32), (rows, cols)), shape=(size, size))
    matrix.sort_indices()

    def slot(row: int, col: int) -> int:
        start, end = matrix.indptr[row], matrix.indptr[row + 1]
        return start + int(np.searchsorted(matrix.indices[start:end], col))

    from_source = {n: slot(source, index[n]) for n in names}
    to_sink = {n: slot(index[n], sink) for n in names}
    data = matrix.data.copy()

    def cut(half: tuple[str, ...]) -> float:
        matrix.data[:] = data
        for n in names:
            matrix.data[from_source[n] if n in half else to_sink[n]] = infinite
        return maximum_flow(matrix, source, sink).flow_value * _FLOW_UNIT

    half_size = len(names) // 2
    if len(names) <= max_exhaustive:
        return min(cut(half) for half in _halves(_twin_classes(links, names), half_size, len(names)))
    g = nx.Graph()
    for link in links:
        w = link.bandwidth_bytes_per_s + (g[link.a][link.b]["weight"] if g.has_edge(link.a, link.b) else 0)
        g.add_edge(link.a, link.b, weight=w)
    best = float("inf")
    for seed in range(4):
        a, _ = nx.algorithms.community.kernighan_lin_bisection(g, weight="weight", seed=seed)
        half = tuple(n for n in names if n in a)
        if 0 < len(half) < len(names):
            best = min(best, cut(half))
    return best


def _twin_classes(links: list[Link], names: list[str]) -> list[list[str]]:
    """Nodes with the same neighbours over the same capacities. Swapping two of them maps the graph onto itself
    (they cannot be linked to each other: each would list the other), so a cut only depends on how many of
    each class go to one half (a DGX-2 has 8 pairs of such GPUs: 1107 splits to try instead of 6435)."""
    neighbours: dict[str, Counter] = defaultdict(Counter)
    for link in links:
        cap = int(round(link.bandwidth_bytes_per_s / _FLOW_UNIT))
        neighbours[link.a][link.b] += cap
        neighbours[link.b][link.a] += cap
    classes: dict[frozenset, list[str]] = defaultdict(list)
    for n in names:
        classes[frozenset(neighbours[n].items())].append(n)
    return list(classes.values())


def _halves(classes: list[list[str]], half_size: int, total: int):
    """One half of every balanced split, up to swapping twins (and, for an even split, the two halves)."""
    sizes = [len(c) for c in classes]
    for counts in itertools.product(*(range(s + 1) for s in sizes)):
        if sum(counts) != half_size:
            continue
        if 2 * half_size == total and counts > tuple(s - c for s, c in zip(sizes, counts)):
            continue  # its complement gives the same cut (capacities are the same both ways)
        yield tuple(m for members, k in zip(classes, counts) for m in members[:k])


def shared_links(topo: Topology, first: tuple[str | int, str | int], second: tuple[str | int, str | int]) -> set[DirectedLink]:
    """The directed links that two transfers (src, dst) would both use; empty when they do not contend."""
    r1 = route(topo, _name(topo, first[0]), _name(topo, first[1]))
    r2 = route(topo, _name(topo, second[0]), _name(topo, second[1]))
    return r1.directed_links() & r2.directed_links()
