"""Double binary tree (as in NCCL): two binary trees over the non-root ranks, the second one mirrored (even
count) or shifted by one (odd count) so most ranks are inner nodes in one tree and leaves in the other. Each
tree carries half the buffer, in pieces pipelined up (reduce) and down (broadcast) the tree."""
from __future__ import annotations

from meshscale.collectives.algorithms.base import Builder, check_root, layout, positions

SUPPORTS = ("all_reduce", "broadcast", "reduce")


def inorder_tree(nodes: list[int], top: int) -> dict[int, int]:
    """Parent map of the balanced binary tree whose in-order walk is ``nodes``, hung under ``top``."""
    parent: dict[int, int] = {}

    def build(lo: int, hi: int, up: int) -> None:
        if lo > hi:
            return
        mid = (lo + hi + 1) // 2
        parent[nodes[mid]] = up
        build(lo, mid - 1, nodes[mid])
        build(mid + 1, hi, nodes[mid])

    build(0, len(nodes) - 1, top)
    return parent


def double_trees(nodes: list[int], top: int) -> tuple[dict[int, int], dict[int, int]]:
    """The two complementary trees over ``nodes`` (NCCL: mirror for an even count, shift for an odd one)."""
    second = nodes[::-1] if len(nodes) % 2 == 0 else nodes[1:] + nodes[:1]
    return inorder_tree(nodes, top), inorder_tree(second, top)


def _heights(parent: dict[int, int]) -> dict[int, int]:
    height = {v: 0 for v in parent}
    height.update({p: 0 for p in parent.values()})
    changed = True
    while changed:  # a few passes: trees here are at most a few levels deep
        changed = False
        for v, p in parent.items():
            if height[p] < height[v] + 1:
                height[p], changed = height[v] + 1, True
    return height


def _depth(parent: dict[int, int], v: int) -> int:
    d = 0
    while v in parent:
        v, d = parent[v], d + 1
    return d


def tree_reduce(b: Builder, start: int, parent: dict[int, int], chunks: list[int], channel: int = 0) -> int:
    """Each node sends its partial sum of piece q to its parent at step start + height + q."""
    h = _heights(parent)
    for v, p in parent.items():
        for q, c in enumerate(chunks):
            b.send(start + h[v] + q, v, p, c, "reduce", channel)
    top = max(h.values(), default=0)
    return start + top + len(chunks) - 1 if parent else start


def tree_bcast(b: Builder, start: int, parent: dict[int, int], chunks: list[int], channel: int = 0) -> int:
    """Piece q reaches a node of depth d at step start + d - 1 + q."""
    depth = {v: _depth(parent, v) for v in parent}
    for v, p in parent.items():
        for q, c in enumerate(chunks):
            b.send(start + depth[v] - 1 + q, p, v, c, "copy", channel)
    return start + max(depth.values(), default=0) + len(chunks) - 1 if parent else start


def double_binary_tree(collective: str, ranks: list[int], nbytes: int, topology, *, order=None, root: int = 0,
                       pieces: int = 1, elem_bytes: int = 4, **_):
    """Two trees over the ranks other than ``root`` (all_reduce: rank 0), each with half the buffer."""
    n = len(ranks)
    root = check_root(collective, root, n)
    others = [p for p in positions(ranks, order) if p != root]
    trees = double_trees(others, root)
    chunks, ids = layout(collective, n, nbytes, 2, pieces, elem_bytes)
    bld = Builder(chunks)
    for k, (parent, mine) in enumerate(zip(trees, ids)):
        if collective == "broadcast":
            tree_bcast(bld, 0, parent, mine, k)
        elif collective == "reduce":
            tree_reduce(bld, 0, parent, mine, k)
        else:
            tree_bcast(bld, tree_reduce(bld, 0, parent, mine, k) - len(mine) + 1, parent, mine, k)
    meta = {"trees": [{ranks[v]: ranks[p] for v, p in t.items()} for t in trees]}
    return bld.schedule(collective, "double_binary_tree", ranks, nbytes, root, 2, meta, elem_bytes)
