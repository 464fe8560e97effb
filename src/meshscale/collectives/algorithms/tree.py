"""Binomial tree (Thakur, Rabenseifner and Gropp 2005): ceil(log2 n) rounds; in the round of distance 2^k
each rank that has the data passes it 2^k places further (broadcast, scatter), and the reverse for reduce and
gather. Virtual rank v is ``order[v]`` with the root at v = 0. Pieces of a buffer follow one round apart."""
from __future__ import annotations

from meshscale.collectives.algorithms.base import Builder, check_root, layout, positions, rotate

SUPPORTS = ("broadcast", "reduce", "gather", "scatter", "all_reduce", "all_gather", "reduce_scatter")


def _rounds(m: int) -> int:
    return max(0, (m - 1).bit_length())


def binomial_bcast(b: Builder, start: int, order: list[int], chunks: list[int], channel: int = 0) -> int:
    """order[0] sends ``chunks`` to all; the largest distance first, so the root's subtrees start early."""
    r = _rounds(len(order))
    for t in range(r):
        k = r - 1 - t
        for v in range(0, len(order), 2 << k):
            if v + (1 << k) < len(order):
                for q, c in enumerate(chunks):
                    b.send(start + t + q, order[v], order[v + (1 << k)], c, "copy", channel)
    return start + r + len(chunks) - 1 if r else start


def binomial_reduce(b: Builder, start: int, order: list[int], chunks: list[int], channel: int = 0) -> int:
    """Sums flow to order[0]: in round k every v with bit k its lowest set bit sends to v - 2^k."""
    r = _rounds(len(order))
    for k in range(r):
        for v in range(1 << k, len(order), 2 << k):
            for q, c in enumerate(chunks):
                b.send(start + k + q, order[v], order[v - (1 << k)], c, "reduce", channel)
    return start + r + len(chunks) - 1 if r else start


def binomial_gather(b: Builder, start: int, order: list[int], held: list[list[int]], channel: int = 0) -> int:
    """Virtual v starts with held[v]; in round k, v sends everything of v .. v+2^k-1 to v - 2^k."""
    m, r = len(order), _rounds(len(order))
    for k in range(r):
        for v in range(1 << k, m, 2 << k):
            for u in range(v, min(v + (1 << k), m)):
                for c in held[u]:
                    b.send(start + k, order[v], order[v - (1 << k)], c, "copy", channel)
    return start + r


def binomial_scatter(b: Builder, start: int, order: list[int], held: list[list[int]], channel: int = 0) -> int:
    """order[0] holds everything; virtual v must end with held[v]. Subtrees get their share in one message."""
    m, r = len(order), _rounds(len(order))
    for t in range(r):
        k = r - 1 - t
        for v in range(0, m, 2 << k):
            if v + (1 << k) < m:
                for u in range(v + (1 << k), min(v + (2 << k), m)):
                    for c in held[u]:
                        b.send(start + t, order[v], order[v + (1 << k)], c, "copy", channel)
    return start + r


def binomial(collective: str, ranks: list[int], nbytes: int, topology, *, order=None, root: int = 0,
             pieces: int = 1, elem_bytes: int = 4, **_):
    """Binomial tree rooted at rank ``root`` over ``order`` (device indices; default the rank order).
    all_reduce = reduce + broadcast, all_gather = gather + broadcast, reduce_scatter = reduce + scatter."""
    n = len(ranks)
    root = check_root(collective, root, n)
    tree = rotate(positions(ranks, order), root)
    chunks, ids = layout(collective, n, nbytes, 1, pieces, elem_bytes)
    bld = Builder(chunks)
    every = [c for block in ids for c in block]
    held = [ids[p] for p in tree] if len(ids) == n else []
    if collective == "broadcast":
        binomial_bcast(bld, 0, tree, every)
    elif collective == "reduce":
        binomial_reduce(bld, 0, tree, every)
    elif collective == "all_reduce":
        binomial_bcast(bld, binomial_reduce(bld, 0, tree, every) - len(every) + 1, tree, every)
    elif collective == "gather":
        binomial_gather(bld, 0, tree, held)
    elif collective == "scatter":
        binomial_scatter(bld, 0, tree, held)
    elif collective == "all_gather":
        binomial_bcast(bld, binomial_gather(bld, 0, tree, held), tree, every)
    else:  # reduce_scatter
        binomial_scatter(bld, binomial_reduce(bld, 0, tree, every), tree, held)
    return bld.schedule(collective, "binomial", ranks, nbytes, root, meta={"order": [ranks[p] for p in tree]},
                        elem_bytes=elem_bytes)
