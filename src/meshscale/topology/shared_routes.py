"""Routes found once per kind of node pair of a cluster, and copied to every pair of that kind.

A cluster is built from copies of one node (`topology.multinode.node_copy`: every node and link named ``n<k>/...``
and marked ``node=k``), each joined to the same network switches the same way or to other switches. Two nodes
whose copies are identical and whose links leave them for the same switches can be swapped without changing the
topology (the swap is an automorphism), so the route between GPU x of node i and GPU y of node j is the route
between GPU x of node i' and GPU y of node j' with the two nodes' names exchanged, for any i', j' of the same
kinds. The flow simulator asks for the route of every pair of ranks a schedule uses (all of them for direct,
one-shot or tree-packed schedules): on 4 nodes of 8 GPUs that is 992 max-flows over the whole cluster graph,
where 184 serve. A route whose paths cross a third node is not copied (that node would need a swap too): it is
found by its own max-flow, as are the routes of any topology that is not made of such copies.

A copied route carries the same bandwidth as the pair's own max-flow. Where several flows reach that maximum, the
max-flow picks one by the order it meets the graph's nodes, so the kind of a pair also says which of its two nodes
comes first; with that, every route of up to 32 GPUs of the catalog's systems in clusters is the one its own
max-flow finds (tests/unit/test_shared_routes.py checks some). Beyond (3 DGX-2s: 64 of 2,256 routes) a copy can
split its paths otherwise than that max-flow would: an equally fast route over other NICs.
"""
from __future__ import annotations

from collections import defaultdict

from meshscale.topology.model import Topology
from meshscale.topology.queries import FABRICS, Path, Route, route

_SIGNATURES = "meshscale.topology.shared_routes"


def _group(topo: Topology, name: str) -> int | None:
    k = topo.nodes[name].attrs.get("node")
    return k if isinstance(k, int) and name.startswith(f"n{k}/") else None


def _local(name: str, k: int) -> str:
    return name[len(f"n{k}/"):]


def _signatures(topo: Topology) -> tuple[dict[int, tuple], dict[int, tuple]]:
    """Per node copy k, with the prefix ``n<k>/`` taken off: what a route inside it can see (its nodes and the
    links between them), and what a route leaving it sees besides (the switches its other links go to).
    Copies with equal signatures can be swapped."""
    if _SIGNATURES in topo.route_cache:
        return topo.route_cache[_SIGNATURES]
    inside: dict[int, list] = defaultdict(list)
    outside: dict[int, list] = defaultdict(list)
    for name, node in topo.nodes.items():
        k = _group(topo, name)
        if k is not None:
            attrs = sorted((a, repr(v)) for a, v in node.attrs.items() if a not in ("node", "index"))
            inside[k].append((_local(name, k), node.kind, tuple(attrs)))
    for link in topo.links:
        ka, kb = _group(topo, link.a), _group(topo, link.b)
        shape = (link.kind, link.bandwidth_bytes_per_s, link.latency_s, link.count, link.generation, link.width,
                 link.rate)
        if ka is not None and ka == kb:
            inside[ka].append((_local(link.a, ka), _local(link.b, ka), shape))
        elif ka is not None and kb is not None:  # nodes wired to each other: no swap keeps that
            outside[ka].append(("unique", ka))
            outside[kb].append(("unique", kb))
        elif ka is not None:
            outside[ka].append((_local(link.a, ka), link.b, shape))
        elif kb is not None:
            outside[kb].append((link.a, _local(link.b, kb), shape))
    found = ({k: tuple(sorted(m, key=repr)) for k, m in inside.items()},
             {k: tuple(sorted(outside[k], key=repr)) for k in inside})
    topo.route_cache[_SIGNATURES] = found
    return found


def _renamed(topo: Topology, r: Route, swap: dict[int, int], index: dict[tuple[str, str, str], int]) -> Route | None:
    """``r`` with node copies renamed by ``swap`` (k -> k'); None when a path crosses a copy not in it."""
    def name(n: str) -> str | None:
        k = _group(topo, n)
        if k is None:
            return n
        return f"n{swap[k]}/{n[len(f'n{k}/'):]}" if k in swap else None

    paths = []
    for p in r.paths:
        nodes = tuple(name(n) for n in p.nodes)
        if None in nodes:
            return None
        links = []
        for i, d in p.directed_links:
            link = topo.links[i]
            a, b = name(link.a), name(link.b)
            if a is None or b is None:
                return None
            links.append((index[(a, b, link.kind)], d))
        paths.append(Path(nodes, tuple(links), p.bandwidth_bytes_per_s))
    return Route(name(r.src), name(r.dst), r.fabric, tuple(paths), r.bandwidth_bytes_per_s, r.latency_s)


def share_routes(topo: Topology, ranks: list[int]) -> None:
    """Fill ``topo``'s route cache for every ordered pair of ``ranks``: one max-flow per kind of pair (the two
    GPUs' names inside their nodes and the two nodes' signatures), copied to the other pairs of that kind."""
    names = [topo.device(r) for r in ranks]
    groups = {n: _group(topo, n) for n in names}
    if any(k is None for k in groups.values()):
        return  # not a cluster of node copies: every route is its own
    inside, outside = _signatures(topo)
    index = {(l.a, l.b, l.kind): i for i, l in enumerate(topo.links)}
    found: dict[tuple, tuple[int, int, Route]] = {}
    for a in names:
        for b in names:
            if a == b or (a, b) in topo.route_cache:
                continue
            ka, kb = groups[a], groups[b]
            # a route inside one node over a fabric no link of the node leaves by (its NVLink, its PCIe) sees only
            # the node's inside; any other route sees both nodes whole
            inner = (_local(a, ka), _local(b, kb), inside[ka]) if ka == kb else None
            # (which node comes first: the max-flow meets the graph's nodes in order, and of several equal flows
            # takes the one that order gives)
            whole = (_local(a, ka), _local(b, kb), inside[ka], inside[kb], (ka > kb) - (ka < kb), outside[ka],
                     outside[kb])
            kind = inner if inner in found and _closed(outside[ka], found[inner][2].fabric) else whole
            if kind not in found:
                r = route(topo, a, b)
                found[whole] = (ka, kb, r)
                if inner is not None and _closed(outside[ka], r.fabric):
                    found[inner] = found[whole]
                continue
            ca, cb, r = found[kind]
            copied = _renamed(topo, r, {ca: ka, cb: kb}, index)
            topo.route_cache[(a, b)] = copied if copied is not None else route(topo, a, b)


def _closed(outside: tuple, fabric: str) -> bool:
    """Whether no link of ``fabric``'s kinds leaves a node of this outside signature (the network fabric leaves)."""
    kinds = next(k for name, k, _ in FABRICS if name == fabric)
    return fabric != "network" and all(entry[0] != "unique" and entry[2][0] not in kinds for entry in outside)


__all__ = ["share_routes"]
