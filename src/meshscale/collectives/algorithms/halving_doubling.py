"""Recursive halving-doubling (Rabenseifner): reduce-scatter by recursive halving (log2 p exchanges of half the
remaining data with the partner at distance p/2, p/4, ...), all-gather by recursive doubling. For n not a power
of two, the standard pre/post step: the first 2r ranks (r = n - 2^floor(log2 n)) pair up, the odd one folds
its data into the even one before and gets the result back after."""
from __future__ import annotations

from meshscale.collectives.algorithms.base import Builder, check_root, layout, positions, rotate
from meshscale.collectives.algorithms.tree import binomial_gather, binomial_scatter

SUPPORTS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce")


def fold(order: list[int]) -> tuple[list[int], dict[int, list[int]], list[tuple[int, int]]]:
    """Participants (a power of two), the ranks each represents, and the (folded odd, even partner) pairs."""
    n = len(order)
    r = n - (1 << (n.bit_length() - 1))
    parts = [order[2 * i] for i in range(r)] + order[2 * r:]
    reps = {order[2 * i]: [order[2 * i], order[2 * i + 1]] for i in range(r)}
    reps.update({x: [x] for x in order[2 * r:]})
    return parts, reps, [(order[2 * i + 1], order[2 * i]) for i in range(r)]


def hd_reduce_scatter(b: Builder, start: int, parts: list[int], reps: dict, blocks: dict[int, list[int]]) -> int:
    """Participant j ends with the blocks of the ranks it represents, summed over all participants."""
    p, step = len(parts), start
    sets = {j: list(range(p)) for j in range(p)}
    mask = p // 2
    while mask:
        for j in range(p):
            partner = j ^ mask
            for k in sets[j]:
                if (k & mask) == (partner & mask):
                    for x in reps[parts[k]]:
                        for c in blocks[x]:
                            b.send(step, parts[j], parts[partner], c, "reduce")
        sets = {j: [k for k in sets[j] if (k & mask) == (j & mask)] for j in range(p)}
        step, mask = step + 1, mask // 2
    return step


def hd_all_gather(b: Builder, start: int, parts: list[int], reps: dict, blocks: dict[int, list[int]]) -> int:
    """Participant j starts with the blocks of the ranks it represents; all end with every block."""
    p, step = len(parts), start
    sets = {j: [j] for j in range(p)}
    mask = 1
    while mask < p:
        for j in range(p):
            for k in sets[j]:
                for x in reps[parts[k]]:
                    for c in blocks[x]:
                        b.send(step, parts[j], parts[j ^ mask], c, "copy")
        sets = {j: sets[j] + sets[j ^ mask] for j in range(p)}
        step, mask = step + 1, mask * 2
    return step


def _pairs(b: Builder, step: int, pairs: list[tuple[int, int]], chunks_of, op: str, back: bool) -> int:
    """The pre (odd -> even) or post (even -> odd, ``back``) step of the fold."""
    for odd, even in pairs:
        src, dst = (even, odd) if back else (odd, even)
        for c in chunks_of(odd):
            b.send(step, src, dst, c, op)
    return step + 1 if pairs else step


def halving_doubling(collective: str, ranks: list[int], nbytes: int, topology, *, order=None, root: int = 0,
                     pieces: int = 1, elem_bytes: int = 4, **_):
    """Rabenseifner's algorithm; broadcast = binomial scatter + all-gather, reduce = reduce-scatter + gather."""
    n = len(ranks)
    root = check_root(collective, root, n)
    base = positions(ranks, order)
    chunks, ids = layout(collective, n, nbytes, n, pieces, elem_bytes)
    blocks = {p: ids[p] for p in range(n)}
    every = [c for block in ids for c in block]
    parts, reps, pairs = fold(base)
    bld = Builder(chunks)
    step = 0
    if collective in ("all_reduce", "reduce_scatter", "reduce"):
        step = _pairs(bld, step, pairs, lambda odd: every, "reduce", back=False)
        step = hd_reduce_scatter(bld, step, parts, reps, blocks)
        if collective == "all_reduce":
            step = hd_all_gather(bld, step, parts, reps, blocks)
        step = _pairs(bld, step, pairs, (lambda odd: every) if collective == "all_reduce" else blocks.get, "copy", back=True)
        if collective == "reduce":
            tree = rotate(base, root)
            binomial_gather(bld, step, tree, [blocks[p] for p in tree])
    else:
        if collective == "broadcast":
            tree = rotate(base, root)
            step = binomial_scatter(bld, step, tree, [blocks[p] for p in tree])
        step = _pairs(bld, step, pairs, blocks.get, "copy", back=False)
        step = hd_all_gather(bld, step, parts, reps, blocks)
        _pairs(bld, step, pairs, lambda odd: [c for c in every if c not in blocks[odd]], "copy", back=True)
    return bld.schedule(collective, "halving_doubling", ranks, nbytes, root,
                        meta={"participants": [ranks[p] for p in parts]}, elem_bytes=elem_bytes)
