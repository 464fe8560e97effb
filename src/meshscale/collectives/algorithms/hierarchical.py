"""Hierarchical collectives for clusters: inside each node, then across nodes, then inside again. Nodes are
groups of ranks (``groups``, device indices), by default the hosts of the topology (devices that reach each
other without the network). all_reduce with equal groups is NCCL-like: ring reduce-scatter in every node, ring
all_reduce of each 1/L share across nodes (rank l of every node together), ring all-gather in every node.
Everything else goes through one leader per node (the root in its own node): binomial trees inside, a ring
or binomial tree between the leaders."""
from __future__ import annotations

from meshscale.collectives.algorithms.base import Builder, check_root, host_groups, layout, rotate
from meshscale.collectives.algorithms.ring import ring_all_gather, ring_reduce_scatter
from meshscale.collectives.algorithms.tree import binomial_bcast, binomial_gather, binomial_reduce, binomial_scatter
from meshscale.collectives.kinds import kind
from meshscale.errors import MeshscaleError

SUPPORTS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "gather", "scatter", "all_to_all")


def _groups(ranks: list[int], topology, groups) -> list[list[int]]:
    """Groups as rank positions; they must partition the ranks."""
    if groups is None:
        groups = host_groups(ranks, topology)
        if len(groups) < 2:
            raise MeshscaleError(f"hierarchical needs ranks on two or more hosts, but {ranks} share one; "
                                 "pass groups=[[...], [...]] or use ring")
    flat = [d for g in groups for d in g]
    if sorted(flat) != sorted(ranks) or any(not g for g in groups):
        raise MeshscaleError(f"groups {groups} must split the ranks {ranks} into non-empty parts, each rank once")
    index = {d: i for i, d in enumerate(ranks)}
    return [[index[d] for d in g] for g in groups]


def _each(fn, start: int, orders: list[list[int]], items) -> int:
    """Run one primitive in every group side by side; the step after the slowest."""
    return max([fn(start, order, item) for order, item in zip(orders, items)], default=start)


def hierarchical(collective: str, ranks: list[int], nbytes: int, topology, *, groups=None, root: int = 0,
                 pieces: int = 1, elem_bytes: int = 4, **_):
    """Intra-node, inter-node, intra-node phases over ``groups`` (default: the topology's hosts)."""
    n = len(ranks)
    root = check_root(collective, root, n)
    parts = _groups(ranks, topology, groups)
    lead = [root if root in g and kind(collective).rooted else g[0] for g in parts]
    members = [rotate(g, l) for g, l in zip(parts, lead)]  # leader first
    G, sizes = len(parts), {len(g) for g in parts}
    meta = {"groups": [[ranks[p] for p in g] for g in members]}
    bld = None

    if collective == "all_reduce" and len(sizes) == 1:  # NCCL-like: RS in node, AR across, AG in node
        L = sizes.pop()
        chunks, ids = layout(collective, n, nbytes, L * G, pieces, elem_bytes)
        bld = Builder(chunks)
        local = [[c for g in range(G) for c in ids[l * G + g]] for l in range(L)]
        step = _each(lambda s, o, _: ring_reduce_scatter(bld, s, o, local), 0, members, members)
        columns = [[m[l] for m in members] for l in range(L)]
        shares = [[ids[l * G + g] for g in range(G)] for l in range(L)]
        step = _each(lambda s, o, blocks: ring_reduce_scatter(bld, s, o, blocks), step, columns, shares)
        step = _each(lambda s, o, blocks: ring_all_gather(bld, s, o, blocks), step, columns, shares)
        _each(lambda s, o, _: ring_all_gather(bld, s, o, local), step, members, members)
        return bld.schedule(collective, "hierarchical", ranks, nbytes, None, meta=meta, elem_bytes=elem_bytes)

    blocks = G if collective == "all_reduce" else 1
    chunks, ids = layout(collective, n, nbytes, blocks, pieces, elem_bytes)
    bld = Builder(chunks)
    every = [c for block in ids for c in block]
    group_chunks = [[c for p in m for c in ids[p]] for m in members] if len(ids) == n else []
    held = [[ids[p] for p in m] for m in members] if len(ids) == n else []
    leaders = rotate(lead, root) if root in lead else lead
    order_of = {l: i for i, l in enumerate(lead)}
    lead_held = [group_chunks[order_of[l]] for l in leaders] if group_chunks else []

    def intra(fn, start, per_group=None):
        return _each(lambda s, o, item: fn(bld, s, o, item), start, members, per_group or [every] * G)

    if collective == "all_reduce":
        step = intra(binomial_reduce, 0)
        step = ring_reduce_scatter(bld, step, lead, ids)
        step = ring_all_gather(bld, step, lead, ids)
        intra(binomial_bcast, step)
    elif collective == "broadcast":
        intra(binomial_bcast, binomial_bcast(bld, 0, leaders, every))
    elif collective == "reduce":
        binomial_reduce(bld, intra(binomial_reduce, 0), leaders, every)
    elif collective == "all_gather":
        step = intra(binomial_gather, 0, held)
        intra(binomial_bcast, ring_all_gather(bld, step, lead, group_chunks, wave=False))
    elif collective == "reduce_scatter":
        step = ring_reduce_scatter(bld, intra(binomial_reduce, 0), lead, group_chunks, wave=False)
        intra(binomial_scatter, step, held)
    elif collective == "gather":
        binomial_gather(bld, intra(binomial_gather, 0, held), leaders, lead_held)
    elif collective == "scatter":
        intra(binomial_scatter, binomial_scatter(bld, 0, leaders, lead_held), held)
    else:  # all_to_all: to my leader, across the leaders, to the destination (hops skipped when not needed)
        group_of = {p: i for i, m in enumerate(members) for p in m}
        for c in chunks:
            s, d = divmod(c.id, n)
            path = [s, d] if group_of[s] == group_of[d] else [s, lead[group_of[s]], lead[group_of[d]], d]
            for stage, (u, v) in enumerate(zip(path, path[1:])):
                if u != v:
                    bld.send(stage, u, v, c.id)
    return bld.schedule(collective, "hierarchical", ranks, nbytes, root, meta=meta, elem_bytes=elem_bytes)
