"""Topology-aware synthesis: rings and trees chosen from the topology's links.

- `ring_bandwidth` / `best_ring`: a ring's rate is that of its slowest hop, and hops that share a directed
  link (a PCIe uplink, QPI) split it, so the best ring on a PCIe tree crosses each uplink once per direction.
- `pack_rings`: link-disjoint Hamiltonian cycles of the direct links (NVLink), each used in both directions as
  two channels: DGX-1 P100 -> 2 rings = 4 channels, V100 -> 3 rings over its doubled links. With no such
  cycle (a subset missing NVLinks, switched or PCIe systems), the best contention-aware ring.
- `pack_trees`: the Blink idea: spanning trees rooted at the root with rates, packed by a linear program
  (scipy linprog, column generation with minimum-cost arborescences, `arborescence.spanning_arborescence`) so that every link is used at once.
- `broadcast_bound`: the min-cut bound of a broadcast, min over receivers of the max-flow from the root
  (networkx), computed independently of the trees.
"""
from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from meshscale.collectives.algorithms.base import Builder, check_ranks, check_root
from meshscale.collectives.algorithms.dbtree import tree_bcast, tree_reduce
from meshscale.collectives.arborescence import spanning_arborescence
from meshscale.collectives.algorithms.ring import ring
from meshscale.collectives.schedule import Chunk, Schedule, split_bytes
from meshscale.errors import MeshscaleError, TopologyError
from meshscale.topology import Topology, route, subset
from meshscale.topology.shared_routes import share_routes

EXHAUSTIVE_MAX = 9  # ring orders are enumerated up to this many devices, improved locally beyond


@dataclass
class Ring:
    """A ring order of device indices and its rate (bytes/s per direction, contention included)."""

    order: list[int]
    bandwidth_bytes_per_s: float


@dataclass
class RingPacking:
    """Rings whose directed links never overlap; ``channels`` lists each ring in both directions."""

    rings: list[Ring]
    disjoint: bool  # True when the rings use separate direct links, False for a fallback ring

    @property
    def channels(self) -> list[list[int]]:
        return [o for r in self.rings for o in (r.order, [r.order[0]] + r.order[:0:-1])]

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """Rate of all channels together in one direction of each ring (a ring all_reduce's bus rate)."""
        return sum(r.bandwidth_bytes_per_s for r in self.rings) * 2 if self.rings else 0.0


@dataclass
class TreePacking:
    """Spanning trees (child -> parent, device indices) rooted at ``root`` with their rates in bytes/s."""

    root: int
    trees: list[dict[int, int]]
    rates_bytes_per_s: list[float]
    meta: dict = field(default_factory=dict)

    @property
    def bandwidth_bytes_per_s(self) -> float:
        return float(sum(self.rates_bytes_per_s))


# ---- link shares of a transfer ---------------------------------------------------------------------------

def _shares(topo: Topology, a: int, b: int) -> dict[tuple[int, int], float]:
    """Directed link -> share of the a->b transfer's bytes that crosses it (its paths split the route)."""
    r = route(topo, topo.device(a), topo.device(b))
    out: dict[tuple[int, int], float] = defaultdict(float)
    for p in r.paths:
        for dl in p.directed_links:
            out[dl] += p.bandwidth_bytes_per_s / r.bandwidth_bytes_per_s
    return out


def _capacity(topo: Topology, dl: tuple[int, int]) -> float:
    return topo.links[dl[0]].bandwidth_bytes_per_s


def ring_bandwidth(topo: Topology, order: list[int]) -> float:
    """Rate of a ring whose hops all run at once: min over hops of the route bandwidth and over directed links
    of capacity / number of hops crossing it (fractional for routes that spread)."""
    load: dict[tuple[int, int], float] = defaultdict(float)
    best = float("inf")
    for a, b in zip(order, order[1:] + order[:1]):
        best = min(best, route(topo, topo.device(a), topo.device(b)).bandwidth_bytes_per_s)
        for dl, share in _shares(topo, a, b).items():
            load[dl] += share
    return min([best] + [_capacity(topo, dl) / x for dl, x in load.items()])


def best_ring(topo: Topology, devices: list[int]) -> Ring:
    """The ring order of ``devices`` with the highest `ring_bandwidth`: exhaustive up to EXHAUSTIVE_MAX
    devices, else a greedy tour improved by 2-opt."""
    devices = check_ranks(devices, topo)
    if len(devices) <= 2:
        return Ring(list(devices), ring_bandwidth(topo, devices) if len(devices) == 2 else 0.0)
    first, rest = devices[0], devices[1:]
    if len(devices) <= EXHAUSTIVE_MAX:
        best = Ring(list(devices), -1.0)
        for perm in itertools.permutations(rest):
            if perm[0] > perm[-1]:
                continue  # the same ring backwards
            order = [first, *perm]
            bw = ring_bandwidth(topo, order)
            if bw > best.bandwidth_bytes_per_s * (1 + 1e-9):
                best = Ring(order, bw)
        return best
    order = [first]
    left = set(rest)
    while left:  # greedy: the fastest next hop
        nxt = max(sorted(left), key=lambda d: route(topo, topo.device(order[-1]), topo.device(d)).bandwidth_bytes_per_s)
        order.append(nxt)
        left.remove(nxt)
    bw, improved = ring_bandwidth(topo, order), True
    while improved:
        improved = False
        for i, j in itertools.combinations(range(1, len(order)), 2):
            cand = order[:i] + order[i:j + 1][::-1] + order[j + 1:]
            cbw = ring_bandwidth(topo, cand)
            if cbw > bw * (1 + 1e-9):
                order, bw, improved = cand, cbw, True
    return Ring(order, bw)


# ---- ring packing ----------------------------------------------------------------------------------------

# Ring packing searches over link units; real bonds are at most tens of links, so more units than this between
# two devices are packed as this many wider ones (same total bandwidth) instead of searching for ever.
MAX_PACKED_UNITS = 64


def _direct_graph(topo: Topology, devices: list[int]) -> tuple[dict[frozenset, int], dict[frozenset, float]]:
    """Units (link count, at most `MAX_PACKED_UNITS`) and per-unit bandwidth of the direct device-device links
    among ``devices``."""
    units, per_unit = {}, {}
    names = {topo.device(d): d for d in devices}
    for link in topo.links:
        if link.a in names and link.b in names:
            key = frozenset((names[link.a], names[link.b]))
            units[key] = units.get(key, 0) + link.count
            per_unit[key] = link.bandwidth_bytes_per_s / link.count
    for key, n in units.items():
        if n > MAX_PACKED_UNITS:
            per_unit[key] *= n / MAX_PACKED_UNITS
            units[key] = MAX_PACKED_UNITS
    return units, per_unit


def hamiltonian_cycles(devices: list[int], edges: set[frozenset], limit: int = 20000) -> list[list[int]]:
    """Hamiltonian cycles of the simple graph ``edges`` over ``devices``, one direction each (up to ``limit``)."""
    adj = {d: sorted(e for e in devices if e != d and frozenset((d, e)) in edges) for d in devices}
    first, n, out = devices[0], len(devices), []

    def walk(path: list[int], seen: set[int]) -> None:
        if len(out) >= limit:
            return
        if len(path) == n:
            if frozenset((path[-1], first)) in edges and path[1] < path[-1]:
                out.append(list(path))
            return
        for nxt in adj[path[-1]]:
            if nxt not in seen:
                seen.add(nxt)
                path.append(nxt)
                walk(path, seen)
                path.pop()
                seen.remove(nxt)

    if n >= 3:
        walk([first], {first})
    return out


def pack_rings(topo: Topology, devices: list[int]) -> RingPacking:
    """The most bandwidth in link-disjoint bidirectional rings over the direct links of ``devices``; when the
    direct links hold no Hamiltonian cycle, the single best ring over any fabric (`best_ring`)."""
    devices = check_ranks(devices, topo)
    units, per_unit = _direct_graph(topo, devices)
    cycles = hamiltonian_cycles(devices, set(units)) if len(devices) >= 3 else []
    if len(devices) == 2 and frozenset(devices) in units:  # two GPUs: each direct link unit is a ring
        key = frozenset(devices)
        return RingPacking([Ring(list(devices), per_unit[key]) for _ in range(units[key])], True)
    if not cycles:
        return RingPacking([best_ring(topo, devices)], False)
    rate = [min(per_unit[frozenset(e)] for e in zip(c, c[1:] + c[:1])) for c in cycles]
    best: tuple[float, list[int]] = (0.0, [])

    def search(start: int, left: dict, chosen: list[int], total: float) -> None:
        nonlocal best
        if total > best[0] + 1e-6:
            best = (total, list(chosen))
        for i in range(start, len(cycles)):
            edges = [frozenset(e) for e in zip(cycles[i], cycles[i][1:] + cycles[i][:1])]
            if all(left[e] > 0 for e in edges):
                for e in edges:
                    left[e] -= 1
                chosen.append(i)
                search(i, left, chosen, total + rate[i])  # i again: a cycle may repeat on doubled links
                chosen.pop()
                for e in edges:
                    left[e] += 1

    search(0, dict(units), [], 0.0)
    rings = [Ring(cycles[i], rate[i]) for i in best[1]]
    return RingPacking(rings, True)


def packed_ring(collective: str, ranks: list[int], nbytes: int, topology: Topology, **options) -> Schedule:
    """The ring algorithm over the synthesized channels of `pack_rings` (each ring both ways)."""
    if topology is None:
        raise MeshscaleError("packed_ring needs a topology to synthesize rings from; give --system or use ring")
    packing = pack_rings(topology, ranks)
    s = ring(collective, ranks, nbytes, topology, **{**options, "rings": packing.channels, "bidirectional": False})
    s.algorithm = "packed_ring"
    s.meta["ring_bandwidth_bytes_per_s"] = [r.bandwidth_bytes_per_s for r in packing.rings]
    return s


# ---- tree packing ----------------------------------------------------------------------------------------

def tree_fabric(topo: Topology, devices: list[int]) -> Topology:
    """The links trees are packed on (as Blink): only NVLink (direct or through NVSwitches) when it joins all
    of ``devices``, else every link. Other devices are dropped: they neither send nor relay. Memoized on the
    topology, so that the routes found on the fabric serve every schedule built on it."""
    key = ("meshscale.collectives.tree_fabric", tuple(devices))
    if key not in topo.route_cache:
        topo.route_cache[key] = _tree_fabric(topo, devices)
    return topo.route_cache[key]


def _tree_fabric(topo: Topology, devices: list[int]) -> Topology:
    everyone = len(set(devices)) == len(topo.devices())
    sub = topo if everyone else subset(topo, devices)  # all devices: the topology itself, and its routes
    keep = {n for n, node in sub.nodes.items() if node.kind in ("gpu", "worker", "nvswitch")}
    links = [l for l in sub.links if l.kind == "nvlink" and l.a in keep and l.b in keep]
    g = nx.Graph()
    g.add_nodes_from(sub.device(d) for d in devices)
    g.add_edges_from((l.a, l.b) for l in links)
    if not all(nx.has_path(g, sub.device(devices[0]), sub.device(d)) for d in devices):
        return sub
    nodes = {n: sub.nodes[n] for n in keep}
    return Topology(f"{sub.name}:nvlink", nodes, links, sub.title, dict(sub.attrs, fabric="nvlink"))


def _tree_column(tree: dict[int, int], shares: dict, links: dict, both: bool) -> np.ndarray:
    col = np.zeros(len(links))
    for child, parent in tree.items():
        for pair in [(parent, child), (child, parent)] if both else [(parent, child)]:
            for dl, x in shares[pair].items():
                col[links[dl]] += x
    return col


def pack_trees(topo: Topology, devices: list[int], root: int = 0, both_directions: bool = False,
               max_rounds: int = 60) -> TreePacking:
    """Spanning trees of ``devices`` rooted at rank position ``root`` and their rates, maximizing the total
    rate under every directed link's capacity (a linear program solved by column generation). Any device
    may feed any other over its route; routes that share a link are charged for it. ``both_directions``
    charges each tree edge both ways (reduce up then broadcast down, for all_reduce). Memoized on the
    topology: every pipeline depth and size `auto` tries packs the same trees."""
    devices = check_ranks(devices, topo)
    key = ("meshscale.collectives.pack_trees", tuple(devices), root, both_directions, max_rounds)
    if key not in topo.route_cache:
        topo.route_cache[key] = _pack_trees(topo, devices, root, both_directions, max_rounds)
    return topo.route_cache[key]


def _pack_trees(topo: Topology, devices: list[int], root: int, both_directions: bool, max_rounds: int) -> TreePacking:
    from scipy.optimize import linprog  # 0.13 s to load: only where trees are packed

    root_dev = devices[check_root("broadcast", root, len(devices))]
    if len(devices) == 1:
        return TreePacking(root_dev, [], [], {"rounds": 0})
    topo = tree_fabric(topo, devices)
    share_routes(topo, devices)
    shares = {}
    for a, b in itertools.permutations(devices, 2):
        try:
            shares[(a, b)] = _shares(topo, a, b)
        except TopologyError:
            pass  # no route on this fabric (NVLink-only: devices never relay); the pair is no tree edge
    links = {dl: i for i, dl in enumerate(sorted({dl for s in shares.values() for dl in s}))}
    cap = np.array([_capacity(topo, dl) for dl in links]) / 1e9  # GB/s keeps the LP well scaled
    edges = [(a, b) for (a, b) in shares if b != root_dev]
    # each edge's links and their shares, in the order its cost adds them up (a tie between trees is decided
    # to the last bit)
    terms = {(a, b): [(links[dl], x) for p in ([(a, b), (b, a)] if both_directions else [(a, b)])
                      for dl, x in shares[p].items()] for a, b in edges}

    def arborescence(cost) -> dict[int, int]:
        return spanning_arborescence([(a, b, cost(a, b)) for a, b in edges])

    # start from the widest tree: the route bandwidth as weight
    trees = [arborescence(lambda a, b: -route(topo, topo.device(a), topo.device(b)).bandwidth_bytes_per_s)]
    cols = [_tree_column(trees[0], shares, links, both_directions)]
    rounds = 0
    for rounds in range(1, max_rounds + 1):
        res = linprog(-np.ones(len(cols)), A_ub=np.array(cols).T, b_ub=cap, bounds=(0, None), method="highs")
        if res.status != 0:
            raise MeshscaleError(f"tree packing LP failed ({res.message}); report this with the topology")
        price = (-res.ineqlin.marginals).tolist()  # price of each link's capacity (the duals)

        def cost(a: int, b: int) -> float:
            return sum(price[i] * x for i, x in terms[(a, b)])

        tree = arborescence(cost)
        if sum(cost(p, c) for c, p in tree.items()) >= 1 - 1e-7 or tree in trees:
            break  # no tree would raise the rate: optimal
        trees.append(tree)
        cols.append(_tree_column(tree, shares, links, both_directions))
    keep = [(t, float(w) * 1e9) for t, w in zip(trees, res.x) if w > 1e-9]
    return TreePacking(root_dev, [t for t, _ in keep], [w for _, w in keep], {"rounds": rounds, "fabric": topo.name})


def broadcast_bound(topo: Topology, devices: list[int], root: int = 0, fabric: bool = True) -> float:
    """The min-cut bound of a broadcast from rank position ``root``: the smallest max-flow (bytes/s) from the
    root to any other device (other nodes relay freely), on the links of `tree_fabric` (``fabric``) or on
    all links of the devices' sub-topology."""
    devices = check_ranks(devices, topo)
    root_dev = devices[check_root("broadcast", root, len(devices))]
    sub = tree_fabric(topo, devices) if fabric else subset(topo, devices)
    g = nx.DiGraph()
    for link in sub.links:
        for u, v in ((link.a, link.b), (link.b, link.a)):
            old = g[u][v]["capacity"] if g.has_edge(u, v) else 0.0
            g.add_edge(u, v, capacity=old + link.bandwidth_bytes_per_s / 1e6)  # MB/s: well-scaled floats
    src = sub.device(root_dev)
    return min(nx.maximum_flow_value(g, src, sub.device(d)) for d in devices if d != root_dev) * 1e6


def tree_packing(collective: str, ranks: list[int], nbytes: int, topology: Topology, *, root: int = 0,
                 pieces: int = 1, elem_bytes: int = 4, **_) -> Schedule:
    """Broadcast / reduce / all_reduce over the packed trees, each tree carrying a share of the buffer in
    proportion to its rate, cut into ``pieces`` pipelined pieces."""
    if topology is None:
        raise MeshscaleError("tree_packing needs a topology to pack trees on; give --system or use binomial")
    n = len(ranks)
    root = check_root(collective, root, n)
    packing = pack_trees(topology, ranks, root, both_directions=collective == "all_reduce")
    elems = split_bytes(nbytes, 1, elem_bytes, collective)[0] // elem_bytes
    total = packing.bandwidth_bytes_per_s or 1.0
    share = [int(elems * w / total) for w in packing.rates_bytes_per_s]
    if share:
        share[int(np.argmax(packing.rates_bytes_per_s))] += elems - sum(share)
    chunks, per_tree = [], []
    for k, count in enumerate(share):
        ids = []
        if count:
            for size in split_bytes(count * elem_bytes, min(pieces, count), elem_bytes, collective):
                ids.append(len(chunks))
                chunks.append(Chunk(len(chunks), sum(c.nbytes for c in chunks), size))
        per_tree.append(ids)
    if not chunks:
        chunks = [Chunk(0, 0, nbytes)]
    bld = Builder(chunks)
    index = {d: i for i, d in enumerate(ranks)}
    for k, (tree, ids) in enumerate(zip(packing.trees, per_tree)):
        parent = {index[c]: index[p] for c, p in tree.items()}
        if collective == "broadcast":
            tree_bcast(bld, 0, parent, ids, k)
        elif collective == "reduce":
            tree_reduce(bld, 0, parent, ids, k)
        elif ids:
            tree_bcast(bld, tree_reduce(bld, 0, parent, ids, k) - len(ids) + 1, parent, ids, k)
    meta = {"trees": packing.trees, "tree_rates_bytes_per_s": packing.rates_bytes_per_s}
    return bld.schedule(collective, "tree_packing", ranks, nbytes, root, max(1, len(packing.trees)), meta, elem_bytes)


__all__ = ["Ring", "RingPacking", "TreePacking", "ring_bandwidth", "best_ring", "pack_rings", "packed_ring",
           "hamiltonian_cycles", "tree_fabric", "pack_trees", "broadcast_bound", "tree_packing"]
