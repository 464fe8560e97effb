"""Minimum-cost spanning arborescence: Edmonds' algorithm as networkx runs it, on plain dictionaries.

Tree packing asks for one arborescence per column-generation round on the complete graph of the ranks (32 ranks:
992 edges, up to 60 rounds); networkx's `minimum_spanning_arborescence` copies its whole graph at every cycle it
contracts, which made it most of `plan`'s time on clusters. This follows the same steps without the copies, so
that it returns the same tree, ties included (costs of equal trees are common: most links go unpriced):

- the costs are turned into positive weights as networkx does (top - cost, top = max + 1 + (max - min));
- edges are read grouped by source (sources in the order nodes first appear in the list, as a networkx
  DiGraph holds them); nodes are visited in that order; each takes its heaviest incoming edge,
  the first one (in the order the edges were added, grouped by source) among equal ones;
- an edge closing a cycle contracts the cycle into a new node, last in the order; edges entering it are
  reweighted by the cycle edge they would replace; the visit starts again from the first node;
- the cycles are expanded back, each losing the edge its entering edge replaces (or its lightest edge).
"""
from __future__ import annotations

from meshscale.errors import MeshscaleError


def spanning_arborescence(edges: list[tuple[int, int, float]]) -> dict[int, int]:
    """Child -> parent of the minimum-cost spanning arborescence of the directed graph ``edges`` (u, v, cost),
    rooted at the one node no edge enters; `MeshscaleError` when there is none."""
    if not edges:
        return {}
    first: dict = {}  # nodes in the order they appear; a DiGraph lists its edges grouped by source in that order
    for u, v, _ in edges:
        first.setdefault(u)
        first.setdefault(v)
    by_source: dict = {x: [] for x in first}
    for e in edges:
        by_source[e[0]].append(e)
    edges = [e for x in first for e in by_source[x]]
    costs = [w for _, _, w in edges]
    top = max(costs) + 1 + (max(costs) - min(costs))
    order: dict = {}  # node -> None, in the order nodes appear (and contracted nodes after)
    pred: dict = {}  # node -> {source: [edge keys]}, both in the order added
    succ: dict = {}  # node -> {target: [edge keys]}
    ends: dict[int, tuple] = {}  # edge key -> (source, target) now
    weight: dict[int, float] = {}
    for key, (u, v, w) in enumerate(edges):
        for x in (u, v):
            if x not in order:
                order[x], pred[x], succ[x] = None, {}, {}
        pred[v].setdefault(u, []).append(key)
        succ[u].setdefault(v, []).append(key)
        ends[key] = (u, v)
        weight[key] = top - w
    group: dict = {x: x for x in order}  # union-find: the branching's components
    chosen: dict = {}  # node -> key of its selected incoming edge
    branching: dict[int, None] = {}  # the selected keys, in the order networkx's branching holds them
    levels: list[tuple] = []  # per contraction: cycle keys, its lightest, entering keys, {key: its target then}
    selected: set = set()
    visit, i = list(order), 0
    while i < len(visit):
        v = visit[i]
        i += 1
        if v in selected:
            continue
        selected.add(v)
        best, best_w = None, float("-inf")
        for keys in pred[v].values():
            for key in keys:
                if weight[key] > best_w:
                    best, best_w = key, weight[key]
        if best is None or best_w <= 0:
            continue
        u = ends[best][0]
        closes = _find(group, u) == _find(group, v)
        chosen[v] = best
        branching[best] = None
        group[_find(group, u)] = _find(group, v)
        if closes:
            _contract(v, best, chosen, branching, levels, order, pred, succ, ends, weight, group, selected)
            visit, i = list(order), 0
    # the same set operations as networkx's, in its order: the order a set lists its members (and so the order
    # of the tree's edges) depends on them
    edges_kept = set(branching)
    for cycle, lightest, entering, before in reversed(levels):
        enters = [k for k in entering if k in edges_kept]  # the edge that reaches the cycle, if any
        edges_kept.update(cycle)
        if not enters:  # the root's cycle: it gives up its lightest edge
            edges_kept.remove(lightest)
        else:  # it gives up the edge into the node the entering edge reaches
            target = before[enters[0]]
            edges_kept.remove(next(k for k in cycle if before[k] == target))
    kept: dict = {x: [] for x in first}
    for k in edges_kept:
        kept[edges[k][0]].append(k)
    parent = {edges[k][1]: edges[k][0] for x in first for k in kept[x]}
    if len(parent) != len({x for e in edges for x in e[:2]}) - 1:
        raise MeshscaleError("no spanning arborescence: some node cannot be reached from the root")
    return parent


def _contract(v, best, chosen, branching, levels, order, pred, succ, ends, weight, group, selected) -> None:
    """Contract the cycle ``best`` just closed (through ``v``) into a new node, as networkx's step I2."""
    path, x = [], ends[best][0]
    while x != v:  # from the new edge's source up the selected edges to v
        path.append(chosen[x])
        x = ends[chosen[x]][0]
    cycle = path[::-1] + [best]
    into = {ends[k][1]: weight[k] for k in cycle}  # cycle node -> weight of its cycle edge
    lightest, low = None, float("inf")
    for k in cycle:
        if weight[k] < low:
            lightest, low = k, weight[k]
    node = ("contracted", len(levels))
    before: dict = {}
    entering: list[int] = []
    new_edges = []
    for a in order:  # every edge in the graph's order: sources in order, their targets in order, keys
        for b, keys in succ[a].items():
            for k in keys:
                if a in into and b not in into:
                    new_edges.append((node, b, k, weight[k]))
                elif a not in into and b in into:
                    before[k] = b
                    entering.append(k)
                    new_edges.append((a, node, k, weight[k] + (low - into[b])))
    for k in cycle:
        before[k] = ends[k][1]
    for k in cycle:
        del branching[k]
    for c in into:
        for b, keys in succ[c].items():
            for k in keys:
                if chosen.get(b) == k and b not in into:
                    del branching[k]  # leaves the branching with the node; re-enters below, last
        for a in pred.pop(c):
            succ[a].pop(c, None)
        for b in succ.pop(c):
            pred[b].pop(c, None)
        del order[c]
        chosen.pop(c, None)
        selected.discard(c)
    order[node], pred[node], succ[node] = None, {}, {}
    group[node] = node
    for a, b, k, w in new_edges:
        pred[b].setdefault(a, []).append(k)
        succ[a].setdefault(b, []).append(k)
        ends[k], weight[k] = (a, b), w
        if chosen.get(b) == k:  # a selected edge leaving the cycle stays selected, joining its component
            branching[k] = None
            group[_find(group, node)] = _find(group, b)
    levels.append((cycle, lightest, entering, before))


def _find(group: dict, x):
    while group[x] != x:
        group[x] = group[group[x]]
        x = group[x]
    return x


__all__ = ["spanning_arborescence"]
