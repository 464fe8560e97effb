"""Minimum-cost spanning arborescence (Chu-Liu / Edmonds) over a dense cost matrix.

Tree packing asks for one per column-generation round on the complete graph of the ranks (32 ranks: 992 edges,
up to 60 rounds); networkx's `minimum_spanning_arborescence` copies its graph at every contraction, this works on
arrays: each node takes its cheapest incoming edge; a cycle among those is contracted into one node whose
incoming costs are reduced by the edge each cycle node gives up, solved again, and expanded.

Tie rule (deterministic): of equally cheap incoming edges a node takes the one from the lowest index; a contracted
cycle becomes the last node of the smaller problem, its members keeping their order.
"""
from __future__ import annotations

import numpy as np

from meshscale.errors import MeshscaleError


def min_arborescence(cost: np.ndarray, root: int) -> list[int]:
    """Parent of every node (-1 for ``root``) in the spanning arborescence rooted at ``root`` of least total
    cost; ``cost[u, v]`` is the cost of edge u -> v, ``inf`` where there is none. Raises `MeshscaleError`
    when some node cannot be reached."""
    c = np.array(cost, dtype=float)
    np.fill_diagonal(c, np.inf)
    c[:, root] = np.inf
    return [int(p) for p in _solve(c, root)]


def _solve(c: np.ndarray, root: int) -> np.ndarray:
    n = len(c)
    best = np.argmin(c, axis=0)  # the first of equal minima: the lowest parent index
    best[root] = -1
    others = np.arange(n) != root
    if not np.all(np.isfinite(c[best[others], np.arange(n)[others]])):
        raise MeshscaleError("no spanning arborescence: some node has no incoming edge from the others")
    cycle = _cycle(best, root)
    if not cycle:
        return best
    in_cycle = np.zeros(n, dtype=bool)
    in_cycle[cycle] = True
    outside = np.flatnonzero(~in_cycle)
    m = len(outside)
    into = c[np.ix_(outside, cycle)] - c[best[cycle], cycle]  # entering at v gives up v's edge in the cycle
    enter = np.argmin(into, axis=1)
    leave_from = c[np.ix_(cycle, outside)]
    leave = np.argmin(leave_from, axis=0)
    small = np.full((m + 1, m + 1), np.inf)
    small[:m, :m] = c[np.ix_(outside, outside)]
    small[:m, m] = into[np.arange(m), enter]
    small[m, :m] = leave_from[leave, np.arange(m)]
    sub = _solve(small, int(np.flatnonzero(outside == root)[0]))
    parent = best.copy()
    for j, v in enumerate(outside):
        p = sub[j]
        parent[v] = -1 if p < 0 else cycle[leave[j]] if p == m else outside[p]
    u = sub[m]
    parent[cycle[enter[u]]] = outside[u]
    return parent


def _cycle(parent: np.ndarray, root: int) -> list[int]:
    """The nodes of one cycle of the parent pointers (in index order), or [] when they form a tree."""
    state = [0] * len(parent)  # 0 unseen, 1 on the current walk, 2 done
    state[root] = 2
    for start in range(len(parent)):
        walk, v = [], start
        while state[v] == 0:
            state[v] = 1
            walk.append(v)
            v = int(parent[v])
        if state[v] == 1:  # the walk met itself
            return sorted(walk[walk.index(v):])
        for w in walk:
            state[w] = 2
    return []


__all__ = ["min_arborescence"]
