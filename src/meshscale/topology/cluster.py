"""Clusters: N copies of a node system joined by a fat tree (two or three levels) or a rail-optimized network
of InfiniBand or Ethernet.

`plan_cluster` sizes the tree and computes its figures by formula (switches per level, per-node peak,
bisection, worst-case latency); `build_cluster` turns the plan into a `Topology` (node names prefixed
``n<k>/``, device indices global: node * gpus + local) for the routing queries on small clusters.

Assumptions, after the NVIDIA DGX-1 System Architecture whitepaper (2017), section 3.3 and table 1:
- a level-1 (leaf) switch takes as many systems as fit with as many up-links as down-links (non-blocking;
  fewer up-links with ``oversubscription`` > 1): 36-port EDR switches -> 4 DGX-1 x 4 ports = 16 down + 16 up;
- every level uses the same number of ports per switch as a leaf (the whitepaper: "each level of the fat tree has
  the same number of links"), so a level-2 switch links 32 leaves: 32 leaves x 4 = 128 systems, 16 level-2
  switches; beyond that a third level (pods of half as many leaves, the other half of the ports going up);
- InfiniBand latency 1.01 us system to system plus 0.09 us per EDR switch hop; Ethernet figures chosen so
  that the 3-hop worst case is the whitepaper's 5 us.

Rail-optimized (``network="rail"``), after NVIDIA's DGX SuperPOD reference architecture and Wang et al., "Rail-only"
(2023): NIC k of every node (the NIC nearest GPU k) goes to the leaf switch of rail k, one port per node, so
same-rail NICs of different nodes are one switch apart. A rail leaf holds as many nodes as it has down-ports
(up-links reserved as for a fat-tree leaf: 32 + 32 on a 64-port NDR switch, the SuperPOD's 32-node scalable unit);
more nodes make more rail groups, every rail leaf's up-links spread over a level of spine switches whose ports
all face the leaves (at most one link from a spine to each leaf; the SuperPOD's 16 spines for 32 rail leaves). One group has no spine: traffic between different rails crosses a node's
NVLink to the NIC of the right rail (NCCL's PXN), as in a rail-only network.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping
from dataclasses import astuple, dataclass, field, replace
from functools import cached_property, lru_cache
from numbers import Integral

from meshscale.errors import TopologyError
import meshscale.topology.links as calc
from meshscale.topology.catalog import load_system
from meshscale.topology.fabric import NET_LINKS, NETWORKS, PLACEMENTS, STATED_RADIX, Cluster, NetLink, net_link  # noqa: F401
from meshscale.topology.schema import require_devices
from meshscale.topology.limits import CLUSTER_RANGES
from meshscale.topology.model import Link, Node, Topology
from meshscale.topology.multinode import node_copy_links, node_copy_nodes
from meshscale.units import is_digits
from meshscale.validation import Range, text


@dataclass
class ClusterSpec:
    """What to build. ``None`` fields are derived: levels (2 or 3 as needed), nodes_per_leaf, radix."""

    node: str = "dgx1-p100"
    nodes: int = 124
    nics: int = 4
    link: str = "edr"
    levels: int | None = None
    nodes_per_leaf: int | None = None
    radix: int | None = None
    oversubscription: float = 1.0
    gpudirect: bool = True
    network: str = "fat-tree"     # or "rail": a leaf per rail (and rail group)
    placement: str = "spread"     # the job's nodes on an oversubscribed tree: spread over busy leaves, or packed


@dataclass
class ClusterPlan:
    """A sized cluster and its figures (bandwidths per direction unless the name says otherwise)."""

    spec: ClusterSpec
    node_topology: Topology
    net: NetLink
    levels: int
    nodes_per_leaf: int           # on a rail network: nodes per rail group (one port each on every rail leaf)
    radix: int
    ports_used: int               # ports of each switch in use (down + up)
    down_ports_per_leaf: int
    up_ports_per_leaf: int
    switches: list[int]           # per level, level 1 first
    max_nodes: int                # largest cluster this many levels can hold
    node_bandwidth_bytes_per_s: float       # one node into the network, per direction
    node_peak_bits_per_s: float             # nominal, both directions (DGX-1 whitepaper: 800 Gb/s)
    bisection_bytes_per_s: float            # per direction, at the ports' data rate (halves of whole leaves)
    bisection_whitepaper_bytes_per_s: float  # both directions, the DGX-1 whitepaper's formula (6,012 GB/s)
    switch_hops: int                        # worst case (on a rail network: between same-rail NICs)
    latency_s: float                        # worst case, node to node (ditto)
    notes: list[str] = field(default_factory=list)

    @property
    def gpus_per_node(self) -> int:
        return len(self.node_topology.devices())

    @property
    def world_size(self) -> int:
        return self.spec.nodes * self.gpus_per_node

    @property
    def rails(self) -> int:
        return self.cluster.rails

    @property
    def groups(self) -> int:
        """Leaves of a fat tree, rail groups of a rail network: sets of nodes whose traffic stays under one leaf
        (per rail)."""
        return math.ceil(self.spec.nodes / self.nodes_per_leaf)

    def leaves_of_node(self, k: int) -> list[int]:
        return self.cluster.leaves_of_node(k)

    @property
    def cluster(self) -> Cluster:
        """The sized network as the typed description a cluster `Topology` carries."""
        spec = self.spec
        return Cluster(spec.node, spec.nodes, spec.nics, self.net, spec.link, self.levels, self.nodes_per_leaf,
                       tuple(self.switches), self.latency_s, spec.network, spec.oversubscription, spec.gpudirect,
                       self.radix, spec.placement)

    def layout(self) -> str:
        """The network in words: "2-level fat tree", "rail-optimized, 8 rails, 2 levels"."""
        if self.rails:
            return f"rail-optimized, {self.rails} rails, {self.levels} level{'s' if self.levels > 1 else ''}"
        return f"{self.levels}-level fat tree"


def _nodes_per_leaf(nics: int, radix: int, oversubscription: float) -> int:
    """The most nodes whose ports plus their up-links fit on one switch."""
    n = 0
    while (n + 1) * nics + math.ceil((n + 1) * nics / oversubscription) <= radix:
        n += 1
    return n


@dataclass
class _Shape:
    """How a network is sized: nodes per leaf (rail group), ports of a leaf, levels, switches per level, the most
    nodes these levels hold, worst hops, and whether traffic between groups climbs through oversubscribed up-links."""

    per_leaf: int
    down: int
    up: int
    levels: int
    switches: list[int]
    max_nodes: int
    hops: int
    climbs: bool


def _fat_tree_shape(spec: ClusterSpec, net: NetLink, radix: int) -> _Shape:
    per_leaf = spec.nodes_per_leaf or _nodes_per_leaf(spec.nics, radix, spec.oversubscription)
    down = per_leaf * spec.nics
    up = math.ceil(down / spec.oversubscription)
    if per_leaf < 1 or down + up > radix:
        raise TopologyError(f"{spec.nics} {net.name} ports per node and their up-links do not fit a {radix}-port "
                            f"switch; use fewer --nics, a larger --radix or fewer --nodes-per-leaf")
    ports = down + up
    leaves = math.ceil(spec.nodes / per_leaf)
    max2 = per_leaf * ports  # a level-2 switch has one link to each of `ports` leaves
    pod_leaves = ports // 2
    max3 = per_leaf * pod_leaves * ports
    levels = spec.levels or (1 if leaves == 1 else 2 if spec.nodes <= max2 else 3)
    if levels not in (1, 2, 3):
        raise TopologyError(f"--levels {levels} is not supported; use 2 or 3")
    if levels == 1 and leaves > 1:
        raise TopologyError(f"{spec.nodes} nodes need {leaves} leaf switches, more than one level holds; use --levels 2")
    if levels == 2 and spec.nodes > max2:
        raise TopologyError(f"{spec.nodes} nodes exceed the {max2} a two-level tree of {radix}-port switches holds "
                            f"({per_leaf} per leaf, {ports} leaves); use --levels 3 or fewer nodes")
    if spec.nodes > max3:
        raise TopologyError(f"{spec.nodes} nodes exceed the {max3} a three-level tree of {radix}-port switches holds; "
                            "use a larger --radix or fewer nodes")
    if levels == 1:
        return _Shape(per_leaf, down, up, 1, [1], per_leaf, 1, False)
    if levels == 2:
        return _Shape(per_leaf, down, up, 2, [leaves, up], max2, 3, True)
    pods = math.ceil(leaves / pod_leaves)
    return _Shape(per_leaf, down, up, 3, [leaves, pods * up, math.ceil(pods * up * pod_leaves / ports)], max3, 5, True)


def _rail_shape(spec: ClusterSpec, net: NetLink, radix: int, gpus: int) -> _Shape:
    if spec.nodes > 1 and spec.nics < gpus:
        raise TopologyError(f"a rail-optimized network gives each GPU of a node its own NIC and rail (NIC k, nearest "
                            f"GPU k, on rail k); {spec.node} has {gpus} GPUs per node but {spec.nics} NICs: pass "
                            f"--nics {gpus} or --network fat-tree")
    per_group = spec.nodes_per_leaf or _nodes_per_leaf(1, radix, spec.oversubscription)
    up = math.ceil(per_group / spec.oversubscription)
    if per_group < 1 or per_group + up > radix:
        raise TopologyError(f"{per_group} nodes per rail leaf and their up-links do not fit a {radix}-port switch; "
                            "use a larger --radix or fewer --nodes-per-leaf")
    ports = per_group + up
    groups = math.ceil(spec.nodes / per_group)
    max2 = per_group * (radix // spec.nics)  # a spine (all its ports) has one link to each of up to `radix` rail leaves
    levels = spec.levels or (1 if groups == 1 else 2)
    if levels not in (1, 2):
        raise TopologyError(f"--levels {levels}: a rail-optimized network is modelled with 1 or 2 levels (rail leaves, "
                            "spines); use --levels 2 or --network fat-tree")
    if levels == 1 and groups > 1:
        raise TopologyError(f"{spec.nodes} nodes need {groups} rail groups of {per_group} nodes, more than one level "
                            "holds; use --levels 2")
    if spec.nodes > max(max2, per_group):
        raise TopologyError(f"{spec.nodes} nodes exceed the {max(max2, per_group)} the rails of {radix}-port switches hold "
                            f"({per_group} nodes per rail group, {max(1, radix // spec.nics)} groups of {spec.nics} "
                            "rails under one spine level); use fewer nodes, a larger --radix or --network fat-tree")
    leaves = groups * spec.nics
    if levels == 1:
        return _Shape(per_group, per_group, up, 1, [leaves], per_group, 1, False)
    spines = math.ceil(leaves * up / radix)
    return _Shape(per_group, per_group, up, 2, [leaves, spines], max2, 3 if groups > 1 else 1, groups > 1)


def plan_cluster(spec: ClusterSpec) -> ClusterPlan:
    """Size the network for ``spec`` and compute its figures; a one-line error if it cannot be built."""
    net = net_link(spec.link)
    if spec.nodes < 1:
        raise TopologyError(f"a cluster needs at least one node, got {spec.nodes}; pass --nodes 1 or more")
    if spec.nics < 1:
        raise TopologyError(f"a cluster node needs at least one NIC, got {spec.nics}; pass --nics 1 or more")
    if spec.oversubscription < 1:
        raise TopologyError(f"oversubscription {spec.oversubscription} is below 1; use 1 (non-blocking) or more")
    if spec.network not in NETWORKS:
        raise TopologyError(f"unknown network {spec.network!r}; use {' or '.join(NETWORKS)}")
    if spec.placement not in PLACEMENTS:
        raise TopologyError(f"unknown placement {spec.placement!r}; use {' or '.join(PLACEMENTS)}")
    node_topo = require_devices(load_system(spec.node))
    radix = spec.radix or net.radix
    if spec.network == "rail":
        shape = _rail_shape(spec, net, radix, len(node_topo.devices()))
    else:
        shape = _fat_tree_shape(spec, net, radix)
    node_bw = spec.nics * net.bandwidth_bytes_per_s
    half = spec.nodes // 2
    blocking = spec.oversubscription if shape.climbs else 1.0
    bisection = half * node_bw / blocking
    whitepaper = spec.nodes * spec.nics * 2 * net.nominal_gbits * 1e9 * net.whitepaper_encoding / 8 * 0.5 / blocking
    notes = []
    if not spec.gpudirect:
        notes.append("GPUDirect RDMA off: GPU traffic is staged through host memory (NICs hang off the CPUs)")
    if spec.network == "rail" and shape.levels == 1 and spec.nodes > 1:
        notes.append("one rail group, no spine: traffic between different rails crosses a node's NVLink to the NIC "
                     "of the right rail (NCCL's PXN)")
    hops = shape.hops if spec.nodes > 1 else 0
    return ClusterPlan(spec, node_topo, net, shape.levels, shape.per_leaf, radix, shape.down + shape.up, shape.down,
                       shape.up, shape.switches, shape.max_nodes, node_bw, 2 * spec.nics * net.nominal_gbits * 1e9,
                       bisection, whitepaper, hops,
                       (net.system_latency_s + hops * net.switch_latency_s) if spec.nodes > 1 else 0.0, notes)


def _attach_points(node: Topology, plan: ClusterPlan) -> list[tuple[str, str | None]]:
    """(NIC name or None to add one, attach point) for each NIC of a node, reusing the system's own NICs of
    the right kind (their PCIe attachment stays), then adding NICs round robin on PCIe switches or CPUs."""
    own = [n for n in node.nodes_of("nic") if node.nodes[n].attrs.get("port_kind") == plan.net.kind]
    hosts = node.nodes_of("pcie_switch") or node.nodes_of("cpu") or node.nodes_of("host")
    if not hosts:
        raise TopologyError(f"{node.name} has no PCIe switch or CPU to attach a NIC to; describe its host in the file")
    points = [(nic, None) for nic in own[: plan.spec.nics]]
    points += [(None, hosts[i % len(hosts)]) for i in range(plan.spec.nics - len(points))]
    return points


def _host_of(node: Topology, name: str) -> str:
    """The CPU behind a NIC or PCIe switch (for staging through host memory)."""
    cpus = set(node.nodes_of("cpu") + node.nodes_of("host"))
    if name in cpus:
        return name
    seen, frontier = {name}, [name]
    while frontier:  # breadth-first over PCIe links to the nearest CPU
        nxt = []
        for x in frontier:
            for l in node.links_of(x, "pcie"):
                y = l.other(x)
                if y in cpus:
                    return y
                if y not in seen and node.nodes[y].kind == "pcie_switch":
                    seen.add(y)
                    nxt.append(y)
        frontier = nxt
    raise TopologyError(f"{node.name}: {name} reaches no CPU over PCIe; GPUDirect off needs a host path")


def _bundled(pairs: list[tuple[str, str]], net: NetLink) -> list[Link]:
    """One link per switch pair, its ``count`` the parallel cables between them."""
    bundles: dict[tuple[str, str], int] = {}
    for key in pairs:
        bundles[key] = bundles.get(key, 0) + 1
    return [Link(a, b, net.kind, net.bandwidth_bytes_per_s * n, 0.0, count=n, rate=net.name) for (a, b), n in bundles.items()]


def build_cluster(plan: ClusterPlan) -> Topology:
    """The cluster as one `Topology`: every node copied with prefix ``n<k>/`` (`_node_part`), NICs linked to leaf
    switches (`ClusterPlan.leaves_of_node`), leaves to level-2 switches (a fat tree: one link to each; rails: each
    leaf's up-links spread over the spines), level-2 to level-3 by pod. Switches carry latency_s. A node whose
    devices are numbered without gaps gives a `ClusterTopology`, which builds the whole graph only when asked."""
    node = plan.node_topology
    indices = sorted(node.nodes[d].index for d in node.devices())
    if indices == list(range(indices[0], indices[0] + len(indices))):
        return ClusterTopology(plan)
    nodes, links = _whole_cluster(plan, lambda k: _node_part(plan, _attach_points(node, plan), k))
    return Topology(_cluster_name(plan), nodes, links, _cluster_title(plan), cluster=plan.cluster)


def _cluster_name(plan: ClusterPlan) -> str:
    return f"{plan.node_topology.name}x{plan.spec.nodes}-{plan.net.name}{'-rail' if plan.rails else ''}"


def _cluster_title(plan: ClusterPlan) -> str:
    node, spec = plan.node_topology, plan.spec
    return f"{spec.nodes} x {node.title or node.name}, {spec.nics}x {plan.net.name.upper()} per node, {plan.layout()}"


def _node_part(plan: ClusterPlan, points: list[tuple[str, str | None]], k: int) -> tuple[dict[str, Node], list[Link]]:
    """Node ``k`` as the cluster holds it: its parts (`_part_nodes`) and their links (`_part_links`)."""
    return _part_nodes(plan, points, k), _part_links(plan, points, k)


def _part_nodes(plan: ClusterPlan, points: list[tuple[str, str | None]], k: int) -> dict[str, Node]:
    """Node ``k``'s parts: the node's named ``n<k>/...`` (devices numbered from k x its GPUs), its NICs (the node's
    own, or added on a x16 slot) marked with the network's rate, rail and GPUDirect RDMA."""
    node, net, p = plan.node_topology, plan.net, f"n{k}/"
    nodes = node_copy_nodes(node, k, k * len(node.devices()))
    for j, (nic, _at) in enumerate(points):
        if nic is None:  # a NIC the system file does not have: added
            nic = f"net{j}"
            nodes[p + nic] = Node(p + nic, "nic", {"port_kind": net.kind, "port_rate": net.name, "node": k})
        nodes[p + nic].attrs.update(port_rate=net.name, gpudirect_rdma=plan.spec.gpudirect, rdma=net.rdma)
        if plan.rails:
            nodes[p + nic].attrs["rail"] = j
    return nodes


def _part_links(plan: ClusterPlan, points: list[tuple[str, str | None]], k: int) -> list[Link]:
    """Node ``k``'s links: the node's, an added NIC's on a x16 slot, a NIC re-hung off its CPU without
    GPUDirect RDMA, and each NIC's to its leaf switch."""
    node, net, spec, p = plan.node_topology, plan.net, plan.spec, f"n{k}/"
    links = node_copy_links(node, k)
    nic_latency = net.system_latency_s / 2  # the 1.01 us split over the two NIC links of a path
    for j, ((nic, at), leaf) in enumerate(zip(points, plan.leaves_of_node(k))):
        if nic is None:
            nic = f"net{j}"
            links.append(Link(p + nic, p + at, "pcie", calc.pcie_bandwidth(3, 16), 1.0e-6, generation=3, width=16))
        if not spec.gpudirect:  # re-hang the NIC off its CPU: traffic must cross host memory
            for i, l in enumerate(links):
                if p + nic in (l.a, l.b) and l.kind == "pcie":
                    links[i] = Link(**{**vars(l), "a": p + nic, "b": p + _host_of(node, l.other(p + nic)[len(p):])})
        links.append(Link(p + nic, f"l1/{leaf}", net.kind, net.bandwidth_bytes_per_s, nic_latency, rate=net.name))
    return links


def _switch(plan: ClusterPlan, level: int, s: int) -> Node:
    """Switch ``s`` of ``level`` (1: the leaves; on rails, each leaf's rail and group)."""
    rail = {"rail": s % plan.rails, "group": s // plan.rails} if plan.rails and level == 1 else {}
    sw = {"latency_s": plan.net.switch_latency_s, "radix": plan.radix, "rate": plan.net.name}
    return Node(f"l{level}/{s}", "net_switch", dict(sw, level=level, **rail))


def _leaf_up_links(plan: ClusterPlan, leaf: int) -> list[Link]:
    """A leaf's links up to level 2: a fat tree's one to each spine of its pod, a rail leaf's up-links spread
    over the spines (bundled where several reach one)."""
    net = plan.net
    if plan.rails and plan.levels == 2:
        spines, up = plan.switches[1], plan.up_ports_per_leaf
        return _bundled([(f"l1/{leaf}", f"l2/{(leaf * up + u) % spines}") for u in range(up)], net)
    if plan.levels < 2:
        return []
    pod = leaf // (plan.ports_used // 2 if plan.levels == 3 else plan.switches[0])
    spines = [pod * plan.up_ports_per_leaf + s if plan.levels == 3 else s for s in range(plan.up_ports_per_leaf)]
    return [Link(f"l1/{leaf}", f"l2/{spine}", net.kind, net.bandwidth_bytes_per_s, 0.0, rate=net.name)
            for spine in spines]


def _whole_cluster(plan: ClusterPlan, part) -> tuple[dict[str, Node], list[Link]]:
    """Every node's parts (``part(k)``: `_node_part`) and every switch, with all their links, in one graph."""
    nodes: dict[str, Node] = {}
    links: list[Link] = []
    for k in range(plan.spec.nodes):
        copied, copied_links = part(k)
        nodes.update(copied)
        links += copied_links
    for level, count in enumerate(plan.switches, start=1):
        nodes.update((f"l{level}/{s}", _switch(plan, level, s)) for s in range(count))
    for leaf in range(plan.switches[0]):
        links += _leaf_up_links(plan, leaf)
    if plan.levels == 3:
        up = plan.ports_used - plan.ports_used // 2
        # spread each level-2 switch's up-links over the level-3 switches
        links += _bundled([(f"l2/{spine}", f"l3/{(spine * up + j) % plan.switches[2]}")
                           for spine in range(plan.switches[1]) for j in range(up)], plan.net)
    return nodes, links


_PART_NAME = re.compile(r"(n|l)(0|[1-9][0-9]*)/")


class ClusterTopology(Topology):
    """A cluster of identical nodes as `build_cluster` lays it out, built from one node and the network's shape.
    Node k's parts are the node's, renamed ``n<k>/`` and renumbered (`_node_part`); each switch and up-link
    follows from the plan. What NCCL's model and the step model ask of a cluster -- a device by index, a part by
    name, a node's own view, a part's links, a leaf's up-links -- is answered from node k's part alone, so pricing
    a collective does work that does not grow with the nodes. The whole graph (`nodes` iterated, `links`: every
    node's parts, every switch) is built on first use, for the commands that walk it (drawing, routing across
    the network, the flow simulator), and checked as any topology is."""

    def __init__(self, plan: ClusterPlan):
        # Topology's fields but nodes and links, which `_whole` builds (`nodes` looks parts up before that)
        self.name, self.title, self.attrs, self.cluster = _cluster_name(plan), _cluster_title(plan), {}, plan.cluster
        self.plan = plan
        self._points = _attach_points(plan.node_topology, plan)
        self._node_devices = plan.node_topology.devices()
        self._part_nodes: dict[int, dict[str, Node]] = {}
        self._part_links: dict[int, list[Link]] = {}
        self._part_index: dict[int, dict[str, list[Link]]] = {}   # node k: each part's links, in order
        self._switches: dict[str, Node] = {}

    @cached_property
    def _whole(self) -> tuple[dict[str, Node], list[Link]]:
        nodes, links = _whole_cluster(self.plan, self.part)
        nodes.update(self._switches)  # the switches already looked up stay the objects handed out
        Topology(self.name, nodes, links, self.title, self.attrs, self.cluster)  # checked as every topology is
        return nodes, links

    @property
    def nodes(self) -> Mapping[str, Node]:
        return self._whole[0] if "_whole" in self.__dict__ else _PartLookup(self)

    @property
    def links(self) -> list[Link]:
        return self._whole[1]

    def part(self, k: int) -> tuple[dict[str, Node], list[Link]]:
        """Node ``k``'s parts and their links (`_node_part`), each built once."""
        return self.part_nodes(k), self.part_links(k)

    def part_nodes(self, k: int) -> dict[str, Node]:
        if k not in self._part_nodes:
            self._part_nodes[k] = _part_nodes(self.plan, self._points, k)
        return self._part_nodes[k]

    def part_links(self, k: int) -> list[Link]:
        if k not in self._part_links:
            self._part_links[k] = _part_links(self.plan, self._points, k)
        return self._part_links[k]

    def node_named(self, name: str) -> Node:
        """The part or switch called ``name``; KeyError for any other name."""
        found = _PART_NAME.match(name)
        if found is None:
            raise KeyError(name)
        kind, number = found.group(1), int(found.group(2))
        if kind == "n" and number < self.plan.spec.nodes:
            return self.part_nodes(number)[name]
        level, rest = number, name[found.end():]
        if kind == "l" and 1 <= level <= len(self.plan.switches) and is_digits(rest) and str(int(rest)) == rest \
                and int(rest) < self.plan.switches[level - 1]:
            return self._switches.setdefault(name, _switch(self.plan, level, int(rest)))
        raise KeyError(name)

    def node_of_part(self, name: str) -> int | None:
        """The node whose part ``name`` is (None: a switch)."""
        found = _PART_NAME.match(name)
        return int(found.group(2)) if found and found.group(1) == "n" else None

    def links_of(self, name: str, kind: str | None = None) -> list[Link]:
        k = self.node_of_part(name)
        if k is None or "_whole" in self.__dict__ or k >= self.plan.spec.nodes:
            return super().links_of(name, kind)
        if k not in self._part_index:
            index: dict[str, list[Link]] = {}
            for l in self.part_links(k):
                index.setdefault(l.a, []).append(l)
                if l.b != l.a:
                    index.setdefault(l.b, []).append(l)
            self._part_index[k] = index
        return [l for l in self._part_index[k].get(name, ()) if kind is None or l.kind == kind]

    def links_between(self, a: str, b: str) -> list[Link]:
        return [l for l in self.links_of(a) if l.other(a) == b and a != b]

    def node_view(self, k: int) -> Topology:
        """Node ``k`` on its own (its parts and the links among them), as `simulate.nccl.network.node_view` cuts
        it out of a cluster."""
        key = ("meshscale.simulate.nccl.node_view", k)
        if key not in self.route_cache:
            nodes, links = self.part(k)
            self.route_cache[key] = Topology(f"{self.name}/n{k}", dict(nodes),
                                             [l for l in links if l.a in nodes and l.b in nodes], self.title)
        return self.route_cache[key]

    def up_links(self, leaf: str) -> list[Link]:
        """Level-1 switch ``leaf``'s links to the level above (none on one level)."""
        return _leaf_up_links(self.plan, int(leaf.removeprefix("l1/")))

    def leaves_of(self, k: int) -> list[str]:
        """The switch each network port of node ``k`` links to, in the order of its NICs."""
        return [f"l1/{leaf}" for leaf in self.plan.leaves_of_node(k)]

    @cached_property
    def _of_kind(self) -> dict[str, list[str]]:
        """Node 0's part names by kind (without the prefix), then the switches: the order `nodes` keeps."""
        out: dict[str, list[str]] = {}
        for name, node in self.part_nodes(0).items():
            out.setdefault(node.kind, []).append(name[len("n0/"):])
        return out

    def nodes_of(self, kind: str) -> list[str]:
        if "_whole" in self.__dict__:
            return super().nodes_of(kind)
        names = [f"n{k}/{x}" for k in range(self.plan.spec.nodes) for x in self._of_kind.get(kind, ())]
        if kind == "net_switch":
            names += [f"l{level}/{s}" for level, count in enumerate(self.plan.switches, start=1) for s in range(count)]
        return names

    @cached_property
    def _devices(self) -> list[str]:
        return [f"n{k}/{d}" for k in range(self.plan.spec.nodes) for d in self._node_devices]

    def devices(self) -> list[str]:
        return list(self._devices)

    def device_indices(self) -> list[int]:
        return list(range(len(self._devices)))

    def device(self, index: int) -> str:
        k, i = divmod(index, len(self._node_devices)) if isinstance(index, Integral) else (-1, 0)
        if 0 <= k < self.plan.spec.nodes:
            return f"n{k}/{self._node_devices[i]}"
        have = self.device_indices()
        raise TopologyError(f"{self.name} has no {self.device_kind} {index}; its {self.device_kind}s are {have}")

    @property
    def device_kind(self) -> str:
        return self.plan.node_topology.device_kind

    @property
    def gpu_model(self) -> str:
        return self.plan.node_topology.gpu_model


class _PartLookup(Mapping):
    """A `ClusterTopology`'s nodes before its whole graph is built: a name is looked up in its node's part (or
    made, for a switch); iterating them, or counting them, builds the whole graph."""

    def __init__(self, topo: ClusterTopology):
        self._topo = topo

    def __getitem__(self, name: str) -> Node:
        return self._topo.node_named(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self._topo._whole[0])

    def __len__(self) -> int:
        return len(self._topo._whole[0])


CLUSTER_FILE_KEYS = ("node", "nodes", "nics", "link", "levels", "nodes_per_leaf", "radix", "oversubscription",
                     "gpudirect", "network", "placement")


def _checked_fields(entry: dict, path: str) -> dict:
    """A cluster file's fields, each checked as the matching option is: one line naming the file and field."""
    from meshscale.errors import MeshscaleError

    fields = dict(entry)
    try:
        for key, check in CLUSTER_RANGES.items():
            if fields.get(key) is not None:
                fields[key] = check(fields[key], f"{path}: cluster: {key}")
        fields["node"] = text(fields["node"], f"{path}: cluster: node", 4096)
        if "gpudirect" in fields and not isinstance(fields["gpudirect"], bool):
            raise MeshscaleError(f"{path}: cluster: gpudirect: {fields['gpudirect']!r} is not true or false; "
                                 "write gpudirect: true or gpudirect: false (unquoted)")
        if "placement" in fields and fields["placement"] not in PLACEMENTS:
            raise MeshscaleError(f"{path}: cluster: placement: unknown placement {fields['placement']!r}; use "
                                 f"{' or '.join(PLACEMENTS)}")
        if "network" in fields and fields["network"] not in NETWORKS:
            raise MeshscaleError(f"{path}: cluster: network: unknown network {fields['network']!r}; use {' or '.join(NETWORKS)}")
    except TopologyError:
        raise
    except MeshscaleError as exc:
        raise TopologyError(str(exc)) from None
    return fields


def cluster_file_spec(path: str) -> ClusterSpec | None:
    """The `ClusterSpec` of a cluster file (YAML with a top-level ``cluster:`` mapping of node, nodes, nics,
    link, levels, oversubscription, gpudirect, network; link a name, ``25GB/s,5us``, or {rate, latency}); None for
    any other file or name (a system)."""
    from pathlib import Path

    from meshscale.validation import load_structured

    import re

    from meshscale.validation import read_text

    candidate = Path(path)
    if candidate.suffix not in (".yaml", ".yml") or not candidate.is_file():
        return None
    # a system file (thousands of GPUs, say) is parsed once, by the loader of systems, not here as well
    if not re.search(r"""(^|[{,]\s*)["']?cluster["']?\s*:""", read_text(candidate, "system or cluster file"), re.M):
        return None
    data = load_structured(candidate, "system or cluster file", yaml_ok=True)  # unreadable, not UTF-8, too deep: one line
    if not isinstance(data, dict) or "cluster" not in data:
        return None
    entry = data["cluster"]
    if not isinstance(entry, dict) or "node" not in entry:
        raise TopologyError(f"{path}: 'cluster:' needs a mapping with at least 'node: SYSTEM'")
    unknown = sorted(set(entry) - set(CLUSTER_FILE_KEYS))
    if unknown:
        raise TopologyError(f"{path}: unknown cluster key(s) {', '.join(unknown)}; use {', '.join(CLUSTER_FILE_KEYS)}")
    fields = _checked_fields(entry, path)
    link = fields.get("link", "edr")
    if isinstance(link, dict):
        rate = link.get("rate")
        if rate is None:
            raise TopologyError(f"{path}: a link mapping needs 'rate' (e.g. 25GB/s), and optionally 'latency' (5us)")
        link = f"{rate},{link['latency']}" if link.get("latency") else str(rate)
    fields["link"] = str(link)
    node = Path(str(fields["node"]))
    if not node.is_absolute() and node.suffix in (".yaml", ".yml", ".json") and not node.exists():
        fields["node"] = str(candidate.parent / node)  # a node file named relative to the cluster file
    return ClusterSpec(**fields)


def cluster_spec(system: str, nodes: int | None = None, link: str | None = None, nics: int | None = None,
                 gpudirect: bool | None = None, **shape) -> ClusterSpec | None:
    """The cluster ``--system NAME|FILE`` with ``--nodes N --link RATE --nics K --gpudirect`` names (a cluster file,
    its fields overridden by the options given), or None when they name a single system. ``shape``: the network's
    other fields (network, levels, nodes_per_leaf, radix, oversubscription), None where not given."""
    unknown = sorted(set(shape) - set(CLUSTER_FILE_KEYS))
    if unknown:
        raise TopologyError(f"unknown cluster field(s) {', '.join(unknown)}; use {', '.join(CLUSTER_FILE_KEYS)}")
    spec = cluster_file_spec(system)
    cluster_options = {"nodes": nodes, "link": link, "nics": nics, "gpudirect": gpudirect, **shape}
    given = {k: v for k, v in cluster_options.items() if v is not None}
    if spec is None:
        if not given:
            return None
        if nodes is None:
            named = ", ".join(f"--{k.replace('_', '-')}" for k in given)
            raise TopologyError(f"{named} describe a cluster; add --nodes N (nodes of {system}) or pass a cluster file")
        spec = _own_network_spec(system, nodes, link, nics, shape.get("radix"))
    for key, value in given.items():
        setattr(spec, key, value)
    if shape.get("placement") is not None:
        if spec.placement not in PLACEMENTS:
            raise TopologyError(f"--placement {spec.placement}: unknown placement; use {' or '.join(PLACEMENTS)}")
        if spec.oversubscription <= 1:
            raise TopologyError(f"--placement {spec.placement}: the network is not oversubscribed (1:1), so where a "
                                "job's nodes sit changes nothing; add --oversubscription K or drop it")
    return spec


def system_or_cluster(system: str, nodes: int | None = None, link: str | None = None, nics: int | None = None,
                      gpudirect: bool | None = None, **shape) -> Topology:
    """The system, or the cluster of it, that `cluster_spec` finds in these options, as one `Topology`. Every
    command resolves ``--system`` (and the cluster options) through here."""
    return spec_topology(system, cluster_spec(system, nodes, link, nics, gpudirect, **shape))


def spec_topology(system: str, spec: ClusterSpec | None) -> Topology:
    """The topology of what `cluster_spec` resolved: the system itself (None) or the cluster ``spec`` describes."""
    return load_system(system) if spec is None else build_cluster(plan_cluster(spec))


def cluster_topology(spec: ClusterSpec, nodes: int | None = None) -> Topology:
    """``nodes`` full nodes (default ``spec.nodes``) of the cluster ``spec`` as one topology (the tree re-sized
    for that many nodes; one node: the node's own system), built once per spec: NCCL's model keeps its ring and
    tree search on the topology object, so every later size costs next to nothing."""
    return _cluster_topology(astuple(replace(spec, nodes=nodes or spec.nodes)))


@lru_cache(maxsize=64)
def _cluster_topology(fields: tuple) -> Topology:
    plan = plan_cluster(ClusterSpec(*fields))
    return build_cluster(plan) if plan.spec.nodes > 1 else plan.node_topology


def describe(plan: ClusterPlan) -> str:
    """The cluster's figures as lines of text (what `meshscale cluster` and `topo` print)."""
    spec = plan.spec
    lines = [f"{spec.nodes} x {plan.node_topology.name} ({plan.world_size} GPUs), {spec.nics}x {plan.net.name.upper()} "
             f"per node, GPUDirect RDMA {'on' if spec.gpudirect else 'off'}"]
    hosts = plan.node_topology.attrs.get("hosts")
    if isinstance(hosts, int) and hosts > 1:
        lines.append(f"  node:            one NVLink domain of {plan.gpus_per_node} GPUs over {hosts} hosts (compute "
                     f"trays: {spec.nodes * hosts} Slurm nodes in all); the network joins the domains")
    ports = f"{plan.radix}-port switches ({plan.down_ports_per_leaf} down + {plan.up_ports_per_leaf} up per leaf)"
    if plan.rails:
        lines += [f"  rail-optimized:  {plan.rails} rails (NIC k of every node, nearest GPU k, on rail k), "
                  f"{plan.levels} level(s), {plan.groups} rail group(s) of up to {plan.nodes_per_leaf} nodes, {ports}",
                  f"  level-1 switches: {plan.switches[0]} ({plan.switches[0] // plan.rails} per rail)"]
        lines += [f"  level-2 switches: {count} (spine)" for count in plan.switches[1:]]
        across = ("3 switch hops through the spine" if plan.levels > 1
                  else "none through the network: over a node's NVLink to the right rail")
        between = (f"1 switch hop on a rail inside a group, {plan.switch_hops} across groups" if plan.groups > 1
                   else "1 switch hop on a rail")
        lines += [f"  node to node:    {between}; across rails: {across}"]
    else:
        lines += [f"  fat tree:        {plan.levels} level(s), {plan.nodes_per_leaf} nodes per level-1 switch, {ports}"]
        lines += [f"  level-{k} switches: {count}" for k, count in enumerate(plan.switches, start=1)]
        if plan.groups > 1:
            lines += [f"  node to node:    1 switch hop on one leaf, {plan.switch_hops} across leaves"]
    lines += [f"  holds up to:     {plan.max_nodes} nodes at {plan.levels} level(s)",
              f"  per-node peak:   {plan.node_peak_bits_per_s / 1e9:,.0f} Gb/s (nominal, both directions); "
              f"{plan.node_bandwidth_bytes_per_s / 1e9:,.1f} GB/s data per direction",
              f"  bisection:       {plan.bisection_whitepaper_bytes_per_s / 1e9:,.0f} GB/s as the DGX-1 whitepaper counts it "
              f"(nominal x encoding, both directions); {plan.bisection_bytes_per_s / 1e9:,.0f} GB/s per direction at data rate",
              f"  worst latency:   {plan.latency_s * 1e6:.2f} us ({plan.switch_hops} switch hops"
              f"{', same rail' if plan.rails else ''})"]
    lines += [f"  note: {note}" for note in plan.notes]
    return "\n".join(lines)


def node_network(system: str) -> tuple[str, int] | None:
    """(link, ports) of a node system's own InfiniBand NICs of a catalog rate (hgx-h100: 8x NDR, dgx1-p100: 4x
    EDR, gb300-nvl72: 72x XDR); None for a node without them."""
    topo = load_system(system)
    rates = [str(topo.nodes[n].attrs.get("port_rate", "")).lower() for n in topo.nodes_of("nic")
             if topo.nodes[n].attrs.get("port_kind") == "infiniband"]
    rates = [r for r in rates if r in NET_LINKS]
    return (rates[0], len(rates)) if rates else None


def _own_network_spec(system: str, nodes: int, link: str | None, nics: int | None,
                      radix: int | None = None) -> ClusterSpec:
    """``nodes`` of ``system`` on its own NICs where the options leave the network out (else 4x EDR, the DGX-1's);
    a node too wide for one leaf switch of that network (an NVL72 rack's 72 NICs) on rails: NIC k of every
    node on rail k's leaf, as the network of rack-scale systems is built."""
    own = node_network(system)
    link = link or (own[0] if own else "edr")
    nics = nics if nics is not None else own[1] if own and own[0] == link else default_nics(link)
    spec = ClusterSpec(node=system, nodes=nodes, link=link, nics=nics)
    wide = _nodes_per_leaf(nics, radix or net_link(link).radix, 1.0) < 1
    if wide and nics >= len(require_devices(load_system(system)).devices()):
        spec.network = "rail"
    return spec


def default_nics(link: str) -> int:
    """Ports per node when not given: 4 for InfiniBand and stated RDMA rates (DGX-1), 2 for Ethernet."""
    return 2 if net_link(link).kind == "ethernet" else 4
