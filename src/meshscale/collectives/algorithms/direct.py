"""Direct algorithms for switched topologies (NVSwitch, a PCIe switch, one host): every rank talks to every
other at once. ``direct`` sends each piece straight to where it is needed (one step; for all_reduce this is
the one-shot: everyone reads everyone's buffer). ``two_shot`` all_reduce: a direct reduce-scatter (each rank
sums one block), then a direct all-gather of the sums, moving 2(n-1)/n of the buffer per rank, not n-1."""
from __future__ import annotations

from meshscale.collectives.algorithms.base import Builder, check_root, is_switched, layout
from meshscale.errors import MeshscaleError

SUPPORTS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "gather", "scatter", "all_to_all")


def _direct_exchange(b: Builder, step: int, n: int, blocks: list[list[int]], op: str) -> int:
    """One step in which every rank s sends to every other rank d: for "reduce" its copy of d's block (summed
    into d), for "copy" its own block s."""
    for s in range(n):
        for d in range(n):
            if s != d:
                for c in blocks[d if op == "reduce" else s]:
                    b.send(step, s, d, c, op, 0)
    return step + 1


def direct_reduce_scatter(b: Builder, step: int, n: int, blocks: list[list[int]]) -> int:
    """Every rank s adds its copy of block d into rank d."""
    return _direct_exchange(b, step, n, blocks, "reduce")


def direct_all_gather(b: Builder, step: int, n: int, blocks: list[list[int]]) -> int:
    """Every rank s copies its block s to every other rank."""
    return _direct_exchange(b, step, n, blocks, "copy")


def direct(collective: str, ranks: list[int], nbytes: int, topology, *, root: int = 0, pieces: int = 1,
           elem_bytes: int = 4, algorithm: str = "direct", **_):
    """Each needed piece goes straight from where it is to where it is needed, all in one step."""
    n = len(ranks)
    root = check_root(collective, root, n)
    chunks, ids = layout(collective, n, nbytes, 1, pieces, elem_bytes)
    every = [c for block in ids for c in block]
    bld = Builder(chunks)
    others = [r for r in range(n) if r != root]
    if collective == "all_reduce":
        for s in range(n):
            for d in range(n):
                if s != d:
                    for c in every:
                        bld.send(0, s, d, c, "reduce")
    elif collective == "reduce_scatter":
        direct_reduce_scatter(bld, 0, n, ids)
    elif collective == "all_gather":
        direct_all_gather(bld, 0, n, ids)
    elif collective in ("broadcast", "reduce"):
        for r in others:
            for c in every:
                bld.send(0, root, r, c) if collective == "broadcast" else bld.send(0, r, root, c, "reduce")
    elif collective in ("gather", "scatter"):
        for r in others:
            for c in ids[r]:
                bld.send(0, r, root, c) if collective == "gather" else bld.send(0, root, r, c)
    else:  # all_to_all: block s*n+d from s to d
        for c in chunks:
            if c.id // n != c.id % n:
                bld.send(0, c.id // n, c.id % n, c.id)
    return bld.schedule(collective, algorithm, ranks, nbytes, root, elem_bytes=elem_bytes)


def _need_switch(name: str, ranks: list[int], topology) -> None:
    switched, why = is_switched(ranks, topology)
    if not switched:
        raise MeshscaleError(f"{name} needs ranks that talk through a switch, but {why}; use ring or a tree")


def one_shot(collective: str, ranks: list[int], nbytes: int, topology, **options):
    """The one-shot all_reduce of switched systems: every rank adds in every other rank's buffer."""
    _need_switch("one_shot", ranks, topology)
    return direct(collective, ranks, nbytes, topology, **{**options, "algorithm": "one_shot"})


def two_shot(collective: str, ranks: list[int], nbytes: int, topology, *, pieces: int = 1, elem_bytes: int = 4, **_):
    """Two-shot all_reduce: direct reduce-scatter of n blocks, then direct all-gather of the sums."""
    _need_switch("two_shot", ranks, topology)
    n = len(ranks)
    chunks, ids = layout(collective, n, nbytes, n, pieces, elem_bytes)
    bld = Builder(chunks)
    direct_all_gather(bld, direct_reduce_scatter(bld, 0, n, ids), n, ids)
    return bld.schedule(collective, "two_shot", ranks, nbytes, None, elem_bytes=elem_bytes)
