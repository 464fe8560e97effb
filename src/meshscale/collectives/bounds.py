"""The busbw a collective can reach at best on a topology: the `bound` column of `meshscale bench collective`.

busbw (nccl-tests, see `meshscale.collectives.kinds`) is normalised so that a bandwidth-optimal algorithm over a
ring runs at the per-direction bandwidth of the ring's links, whatever the number of ranks. So the bound is a
per-direction bandwidth, found from the topology as follows (n ranks, S = the nccl-tests size):

- Injection. Every rank must push out at least busbw x t bytes (all_reduce 2(n-1)/n S, all_gather and
  reduce_scatter (n-1)/n S, broadcast and reduce S for a pipelined chain or ring), so busbw <= the rate at which
  the slowest rank can send to the others: the max-flow from it to all other ranks inside the fabric NCCL
  would use (NVLink, through NVSwitches if any; else PCIe / QPI / shared memory in the host; else the network;
  fabrics are not added together, NCCL does not stripe a ring over two of them).
- Cuts. A ring crosses any split of the ranks in two at least once in each direction, and the crossing link
  carries the full busbw rate; with several rings the rates add up over the links that cross. So
  busbw <= the per-direction capacity of the worst balanced split (`bisection_bandwidth` of the ranks). This is
  what limits two DGX-1s joined by four EDR ports, while a single NVSwitch box is limited by injection.
- all_to_all forwards nothing: across a balanced split each side sends (n/2)^2 blocks of S/n, so
  busbw = (n-1)/n S / t <= bisection x 4(n-1)/n^2, and <= injection.
- gather / scatter: only the root's link matters: it receives (sends) (n-1)/n S, so busbw <= its injection.
- send_recv: rank r sends S to rank r+1 at the same time as all the others: busbw <= the slowest such pair.

The bound is optimistic on purpose (line rate, no protocol overhead): NCCL reaches about 75-85 % of it on
NVLink systems for large messages.
"""
from __future__ import annotations

import networkx as nx

from meshscale.collectives.kinds import kind
from meshscale.errors import MeshscaleError
from meshscale.topology import Topology, bisection_bandwidth, pair_bandwidth
from meshscale.topology.queries import FABRICS

_FLOW_UNIT = 1e6  # max-flow on integer MB/s, as in meshscale.topology.queries


def _ring(topology: Topology, fabric: tuple, names: list[str], root: str) -> float:
    return min(_least_injection(topology, fabric, names), float(bisection_bandwidth(topology, names)))


def _exchange(topology: Topology, fabric: tuple, names: list[str], root: str) -> float:
    n = len(names)
    cut = float(bisection_bandwidth(topology, names)) * 4 * (n - 1) / n ** 2
    return min(_least_injection(topology, fabric, names), cut)


def _least_injection(topology: Topology, fabric: tuple, names: list[str]) -> float:
    """The slowest rank's injection, one max-flow per class of twin ranks: ranks with the same neighbours over the
    same capacities inject alike (swapping them maps the graph and the rank set onto themselves), so the 72 GPUs
    of an NVL72 rack, each on the same 18 switch chips, take one max-flow, not 72."""
    g = _graph(topology, fabric, names)
    classes: dict[frozenset, str] = {}
    for name in names:
        twins = frozenset((v, d["capacity"]) for v, d in g[name].items()) if name in g else frozenset()
        classes.setdefault(twins, name)
    return min(_injection(topology, fabric, names, name) for name in classes.values())


def _root(topology: Topology, fabric: tuple, names: list[str], root: str) -> float:
    return _injection(topology, fabric, names, root)


def _pairs(topology: Topology, fabric: tuple, names: list[str], root: str) -> float:
    return min(pair_bandwidth(topology, a, b) for a, b in zip(names, names[1:] + names[:1]))


# a collective's record names its traffic pattern (`CollectiveKind.bound`); see the module docstring
PATTERNS = {"ring": _ring, "exchange": _exchange, "root": _root, "pairs": _pairs}


def busbw_bound(topology: Topology, collective: str, ranks: list[int], root: int = 0) -> float:
    """Upper bound, bytes/s, on the nccl-tests busbw of ``collective`` over the devices with indices ``ranks``
    (rank i on device ``ranks[i]``; ``root`` is a rank). See the module docstring for the reasoning."""
    k = kind(collective)
    if k.variable:
        raise MeshscaleError(f"{k.name} has no bound: its blocks differ in size from pair to pair")
    pattern = PATTERNS[k.bound]
    if len(ranks) < 2:
        raise MeshscaleError(f"a bandwidth bound needs at least 2 ranks, got {len(ranks)}")
    names = [topology.device(i) for i in ranks]
    key = ("meshscale.collectives.bounds", kind(collective).bound, tuple(names), names[root])
    if key not in topology.route_cache:  # the same for every size of a sweep
        topology.route_cache[key] = pattern(topology, _fabric_of(topology, names), names, names[root])
    return topology.route_cache[key]


def _fabric_of(topo: Topology, names: list[str]) -> tuple:
    """The first fabric (in NCCL's order of preference) in which the ranks reach each other, ranks relaying."""
    for fabric in FABRICS:
        g = _graph(topo, fabric, names)
        if all(n in g for n in names) and all(nx.has_path(g, names[0], n) for n in names[1:]):
            return fabric
    raise MeshscaleError(f"{topo.name}: devices {names} are not connected; check the topology's links")


def _graph(topo: Topology, fabric: tuple, names: list[str]) -> nx.DiGraph:
    """Directed capacity graph (MB/s per direction) of one fabric; only its relays and the ranks take part."""
    _, link_kinds, relay_kinds = fabric
    allowed = {n for n, node in topo.nodes.items() if node.kind in relay_kinds} | set(names)
    g = nx.DiGraph()
    for link in topo.links:
        if link.kind in link_kinds and link.a in allowed and link.b in allowed:
            cap = int(round(link.bandwidth_bytes_per_s / _FLOW_UNIT))
            for u, v in ((link.a, link.b), (link.b, link.a)):
                g.add_edge(u, v, capacity=g[u][v]["capacity"] + cap if g.has_edge(u, v) else cap)
    return g


def _injection(topo: Topology, fabric: tuple, names: list[str], src: str) -> float:
    """Bytes/s that ``src`` can send to all the other ranks at once inside ``fabric`` (max-flow)."""
    g = _graph(topo, fabric, names)
    sink = "__meshscale_sink__"
    for n in names:
        if n != src:
            g.add_edge(n, sink)  # no capacity attribute: unbounded
    return nx.maximum_flow_value(g, src, sink) * _FLOW_UNIT
