"""What every algorithm shares: input checks, the chunk layout in blocks, and a `Builder` that collects
transfers by step. Algorithms compose primitives (ring, chain, tree phases) that write into one Builder and
return the step after their last one, so phases run one after another or side by side."""
from __future__ import annotations

from collections import defaultdict

import networkx as nx

from meshscale.collectives.kinds import kind
from meshscale.collectives.schedule import DEFAULT_ELEM_BYTES, Chunk, Schedule, Step, Transfer, make_chunks, validate
from meshscale.errors import MeshscaleError
from meshscale.topology import Topology

NETWORK_LINKS = ("infiniband", "ethernet")


class Builder:
    """Collects transfers by step index; `schedule` drops empty steps and checks the result symbolically."""

    def __init__(self, chunks: list[Chunk]):
        self.chunks = chunks
        self.by_step: dict[int, list[Transfer]] = defaultdict(list)

    def send(self, step: int, src: int, dst: int, chunk: int, op: str = "copy", channel: int = 0) -> None:
        self.by_step[step].append(Transfer(src, dst, chunk, self.chunks[chunk].nbytes, op, channel))

    def schedule(self, collective: str, algorithm: str, ranks: list[int], nbytes: int, root: int | None,
                 channels: int = 1, meta: dict | None = None, elem_bytes: int = DEFAULT_ELEM_BYTES) -> Schedule:
        steps = [Step(self.by_step[k]) for k in sorted(self.by_step) if self.by_step[k]]
        meta = dict(meta or {})
        if elem_bytes != DEFAULT_ELEM_BYTES:
            meta["elem_bytes"] = elem_bytes
        s = Schedule(collective, algorithm, list(ranks), nbytes, self.chunks, steps,
                     root if kind(collective).rooted else None, channels, meta)
        validate(s)  # an algorithm bug must never reach the simulator or a GPU
        return s


def check_ranks(ranks: list[int], topology: Topology | None) -> list[int]:
    """Ranks must be distinct devices of the topology (any distinct integers when topology is None)."""
    ranks = [int(r) for r in ranks]
    if not ranks:
        raise MeshscaleError("no ranks given; list at least one device (e.g. --devices 0,1)")
    if len(set(ranks)) != len(ranks):
        dup = sorted({r for r in ranks if ranks.count(r) > 1})
        raise MeshscaleError(f"ranks {ranks} repeat device(s) {dup}; give each device once")
    if topology is not None:
        for r in ranks:
            topology.device(r)  # one-line TopologyError naming the valid devices
    return ranks


def check_root(collective: str, root: int, n: int) -> int:
    if kind(collective).rooted and not 0 <= root < n:
        raise MeshscaleError(f"root rank {root} is outside 0..{n - 1}; give the root as a rank position")
    return root


def positions(ranks: list[int], order: list[int] | None, what: str = "order") -> list[int]:
    """A rank order given in device indices, as rank positions; it must be a permutation of the ranks."""
    if order is None:
        return list(range(len(ranks)))
    if sorted(order) != sorted(ranks):
        raise MeshscaleError(f"{what} {list(order)} is not a permutation of the ranks {ranks}")
    index = {d: i for i, d in enumerate(ranks)}
    return [index[d] for d in order]


def rotate(order: list[int], first: int) -> list[int]:
    """The cyclic order starting at ``first``."""
    i = order.index(first)
    return order[i:] + order[:i]


def rooted_line(collective: str, order: list[int], root: int) -> list[int]:
    """``order`` as a line along which a rooted collective's data flows: from the root first when the root
    sends (broadcast, scatter), to the root last when it receives (reduce, gather)."""
    line = rotate(order, root)
    return line if kind(collective).from_root else line[1:] + [root]


def layout(collective: str, n: int, nbytes: int, blocks: int, pieces: int, elem_bytes: int):
    """Chunks and their ids by block: ``ids[b][k]`` are the chunks of block b for channel/part k of ``pieces``.
    A collective whose buffer has several units (segments, all_to_all blocks) has one block per unit; others
    cut the buffer into ``blocks`` blocks."""
    k = kind(collective)
    units = k.units(n)
    if units > 1:
        blocks, pieces = units, 1 if k.chunk_per_unit else pieces
    chunks = make_chunks(collective, n, nbytes, blocks * pieces if units == 1 else pieces, elem_bytes)
    return chunks, [[b * pieces + q for q in range(pieces)] for b in range(blocks)]


def is_switched(ranks: list[int], topology: Topology | None) -> tuple[bool, str]:
    """Whether the ranks talk through switches only (NVSwitch, PCIe switch, host): no two are linked directly.
    Returns (answer, the reason when not). An unknown topology (None) counts as switched."""
    if topology is None:
        return True, ""
    names = [topology.device(r) for r in ranks]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            direct = topology.links_between(a, b)
            if direct:
                return False, f"{a} and {b} are linked directly by {direct[0].label}"
    return True, ""


def host_groups(ranks: list[int], topology: Topology | None) -> list[list[int]]:
    """The ranks grouped by machine: devices joined without network links (InfiniBand, Ethernet) share a host."""
    if topology is None:
        raise MeshscaleError("hierarchical needs groups=[[...], ...] when no topology is given")
    g = nx.Graph()
    g.add_nodes_from(topology.nodes)
    g.add_edges_from((l.a, l.b) for l in topology.links if l.kind not in NETWORK_LINKS
                     and topology.nodes[l.a].kind not in ("nic", "net_switch")
                     and topology.nodes[l.b].kind not in ("nic", "net_switch"))
    component = {}
    for i, comp in enumerate(nx.connected_components(g)):
        component.update({n: i for n in comp})
    groups: dict[int, list[int]] = {}
    for r in ranks:
        groups.setdefault(component[topology.device(r)], []).append(r)
    return list(groups.values())


__all__ = ["Builder", "check_ranks", "check_root", "positions", "rotate", "layout", "is_switched", "host_groups"]
