"""Ring algorithms (Thakur, Rabenseifner and Gropp 2005; NVIDIA DGX-1 whitepaper, section 4.4): reduce-scatter
in n-1 steps (position j sends block j-i-1 to j+1, which adds it), then all-gather in n-1 steps (received
blocks replace local ones). Blocks are cut into pieces that follow each other one step apart (pipelining). Several rings (channels) each carry their share of every block, side
by side; `bidirectional` adds each ring reversed. Rooted collectives run as a pipelined chain along the ring."""
from __future__ import annotations

from meshscale.collectives.algorithms.base import Builder, check_root, layout, positions, rooted_line
from meshscale.collectives.algorithms.chain import chain_bcast, chain_gather, chain_reduce, chain_scatter

SUPPORTS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "gather", "scatter", "all_to_all")


def ring_reduce_scatter(b: Builder, start: int, order: list[int], blocks: list[list[int]], channel: int = 0,
                        wave: bool = True) -> int:
    """Position j of ``order`` ends with ``blocks[j]`` summed over the ring; piece q of a block runs q steps
    behind piece 0 (``wave``) or beside it."""
    m, end = len(order), start
    for i in range(m - 1):
        for j in range(m):
            for q, c in enumerate(blocks[(j - i - 1) % m]):
                step = start + i + (q if wave else 0)
                b.send(step, order[j], order[(j + 1) % m], c, "reduce", channel)
                end = max(end, step + 1)
    return end


def ring_all_gather(b: Builder, start: int, order: list[int], blocks: list[list[int]], channel: int = 0,
                    wave: bool = True) -> int:
    """Position j starts with ``blocks[j]``; every position ends with all blocks."""
    m, end = len(order), start
    for i in range(m - 1):
        for j in range(m):
            for q, c in enumerate(blocks[(j - i) % m]):
                step = start + i + (q if wave else 0)
                b.send(step, order[j], order[(j + 1) % m], c, "copy", channel)
                end = max(end, step + 1)
    return end


def ring_all_to_all(b: Builder, start: int, order: list[int], moves: list[tuple[int, int, int]], channel: int = 0) -> int:
    """Each (chunk, src, dst) travels forward along the ring from src to dst, one hop per step."""
    m, where, end = len(order), {p: i for i, p in enumerate(order)}, start
    for c, src, dst in moves:
        hops = (where[dst] - where[src]) % m
        for h in range(hops):
            i = (where[src] + h) % m
            b.send(start + h, order[i], order[(i + 1) % m], c, "copy", channel)
        end = max(end, start + hops)
    return end


def ring(collective: str, ranks: list[int], nbytes: int, topology, *, rings=None, bidirectional: bool = False,
         root: int = 0, pieces: int = 1, elem_bytes: int = 4, **_):
    """Ring schedule over ``rings`` (list of orders of the device indices; default the rank order), one channel
    per ring (two with ``bidirectional``), every block cut into ``pieces`` per channel."""
    n = len(ranks)
    root = check_root(collective, root, n)
    orders = [positions(ranks, r, "ring") for r in (rings or [list(ranks)])]
    if bidirectional:
        orders += [o[::-1] for o in orders]
    channels = len(orders)
    chunks, ids = layout(collective, n, nbytes, n if collective == "all_reduce" else 1,
                         channels * pieces, elem_bytes)
    bld = Builder(chunks)
    if collective == "all_to_all":
        moves = [(c.id, c.id // n, c.id % n) for c in chunks if c.id // n != c.id % n]
        for k, order in enumerate(orders):
            ring_all_to_all(bld, 0, order, moves[k::channels], k)
    for k, order in enumerate(orders):
        if collective == "all_to_all":
            break
        mine = [ids[blk][k * pieces:(k + 1) * pieces] for blk in range(len(ids))]  # channel k's share
        by_pos = [mine[p] for p in order] if len(mine) == n else []  # block owned by each ring position
        every = [c for blk in mine for c in blk]
        if collective == "all_reduce":
            ring_all_gather(bld, ring_reduce_scatter(bld, 0, order, by_pos, k) - pieces + 1, order, by_pos, k)
        elif collective == "reduce_scatter":
            ring_reduce_scatter(bld, 0, order, by_pos, k)
        elif collective == "all_gather":
            ring_all_gather(bld, 0, order, by_pos, k)
        else:  # rooted: a pipelined chain along the ring
            line = rooted_line(collective, order, root)
            if collective == "broadcast":
                chain_bcast(bld, 0, line, every, k)
            elif collective == "reduce":
                chain_reduce(bld, 0, line, every, k)
            elif collective == "gather":
                chain_gather(bld, 0, line, [mine[p] for p in line], k)
            else:  # scatter
                chain_scatter(bld, 0, line, [mine[p] for p in line], k)
    meta = {"rings": [[ranks[p] for p in o] for o in orders], "pieces": pieces}
    return bld.schedule(collective, "ring", ranks, nbytes, root, channels, meta, elem_bytes)
