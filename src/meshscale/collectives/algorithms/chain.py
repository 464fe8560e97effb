"""Pipelined chain: the buffer cut into pieces that flow down a line of ranks, one hop per step, so the time
approaches N/B for many pieces whatever the length (NVIDIA DGX-1 whitepaper, section 4.4). Also the rooted phases of the ring algorithm."""
from __future__ import annotations

from meshscale.collectives.algorithms.base import Builder, check_root, layout, positions, rooted_line
from meshscale.collectives.kinds import kind

SUPPORTS = ("broadcast", "reduce", "all_reduce", "gather", "scatter", "all_gather", "reduce_scatter")


def chain_bcast(b: Builder, start: int, order: list[int], chunks: list[int], channel: int = 0) -> int:
    """order[0] sends every chunk down the chain; piece q crosses hop j at step start + q + j."""
    for q, c in enumerate(chunks):
        for j in range(len(order) - 1):
            b.send(start + q + j, order[j], order[j + 1], c, "copy", channel)
    return start + len(chunks) + len(order) - 2 if len(order) > 1 else start


def chain_reduce(b: Builder, start: int, order: list[int], chunks: list[int], channel: int = 0) -> int:
    """Partial sums flow down the chain to order[-1]; piece q crosses hop j at step start + q + j."""
    for q, c in enumerate(chunks):
        for j in range(len(order) - 1):
            b.send(start + q + j, order[j], order[j + 1], c, "reduce", channel)
    return start + len(chunks) + len(order) - 2 if len(order) > 1 else start


def chain_gather(b: Builder, start: int, order: list[int], held: list[list[int]], channel: int = 0) -> int:
    """Each position j holds chunks held[j]; all of them travel down to order[-1]. At step i position j
    forwards what position j - i started with."""
    m = len(order)
    for i in range(m - 1):
        for j in range(i, m - 1):
            for c in held[j - i]:
                b.send(start + i, order[j], order[j + 1], c, "copy", channel)
    return start + m - 1


def chain_scatter(b: Builder, start: int, order: list[int], held: list[list[int]], channel: int = 0) -> int:
    """order[0] holds everything; position m must end with held[m]. The farthest data leaves first."""
    m = len(order)
    for i in range(m - 1):
        for j in range(0, i + 1):
            target = m - 1 - i + j  # the position whose data position j forwards at step i
            if target > j:
                for c in held[target]:
                    b.send(start + i, order[j], order[j + 1], c, "copy", channel)
    return start + m - 1


def chain(collective: str, ranks: list[int], nbytes: int, topology, *, order=None, root: int = 0,
          pieces: int = 1, elem_bytes: int = 4, **_):
    """Pipelined chain along ``order`` (device indices; default the rank order rotated to the root).
    all_reduce = reduce down the chain, then broadcast back; all_gather / reduce_scatter go through the end."""
    n = len(ranks)
    root = check_root(collective, root, n)
    line = positions(ranks, order)
    if kind(collective).rooted:
        line = rooted_line(collective, line, root)
    chunks, ids = layout(collective, n, nbytes, 1, pieces, elem_bytes)
    bld = Builder(chunks)
    every = [c for block in ids for c in block]
    held = [ids[r] for r in line] if len(ids) == n else []  # segment chunks by chain position
    if collective == "broadcast":
        chain_bcast(bld, 0, line, every)
    elif collective == "reduce":
        chain_reduce(bld, 0, line, every)
    elif collective == "all_reduce":
        chain_bcast(bld, chain_reduce(bld, 0, line, every) - len(every) + 1, line[::-1], every)
    elif collective == "gather":
        chain_gather(bld, 0, line, held)
    elif collective == "scatter":
        chain_scatter(bld, 0, line, held)
    elif collective == "all_gather":
        chain_bcast(bld, chain_gather(bld, 0, line, held), line[::-1], every)
    else:  # reduce_scatter: reduce everything to the end, then scatter back
        back = line[::-1]
        chain_scatter(bld, chain_reduce(bld, 0, line, every), back, [ids[r] for r in back])
    return bld.schedule(collective, "chain", ranks, nbytes, root, meta={"order": [ranks[p] for p in line]},
                        elem_bytes=elem_bytes)
