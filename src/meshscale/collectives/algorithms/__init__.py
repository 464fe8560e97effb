"""The algorithm registry: ``ALGORITHMS[name]`` is an `Algorithm` (its function and the collectives it does).
Every function has the signature ``(collective, ranks, nbytes, topology, **options) -> Schedule``; `build`
checks the common inputs first. Common options: ``root`` (rank position), ``pieces`` (pipeline pieces per block
and channel), ``elem_bytes``; ``rings`` (ring), ``order`` (chain, binomial, double_binary_tree,
halving_doubling), ``groups`` (hierarchical), ``bidirectional`` (ring)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from meshscale.collectives.algorithms import chain, dbtree, direct, halving_doubling, hierarchical, ring, tree
from meshscale.collectives.algorithms.base import check_ranks
from meshscale.collectives.kinds import schedulable
from meshscale.collectives.schedule import Schedule
from meshscale.errors import MeshscaleError, check_choice
from meshscale.topology import Topology


@dataclass(frozen=True)
class Algorithm:
    name: str
    fn: Callable[..., Schedule]
    collectives: tuple[str, ...]
    summary: str


ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (
    Algorithm("ring", ring.ring, ring.SUPPORTS, "ring reduce-scatter + all-gather, pipelined, multi-ring"),
    Algorithm("chain", chain.chain, chain.SUPPORTS, "pipelined chain"),
    Algorithm("binomial", tree.binomial, tree.SUPPORTS, "binomial tree, log2(n) rounds"),
    Algorithm("double_binary_tree", dbtree.double_binary_tree, dbtree.SUPPORTS, "two complementary binary trees"),
    Algorithm("halving_doubling", halving_doubling.halving_doubling, halving_doubling.SUPPORTS,
              "recursive halving-doubling (Rabenseifner)"),
    Algorithm("direct", direct.direct, direct.SUPPORTS, "every piece straight to its destination, one step"),
    Algorithm("one_shot", direct.one_shot, ("all_reduce",), "one-shot all_reduce (switched topologies)"),
    Algorithm("two_shot", direct.two_shot, ("all_reduce",), "direct reduce-scatter + all-gather (switched topologies)"),
    Algorithm("hierarchical", hierarchical.hierarchical, hierarchical.SUPPORTS, "intra-node, inter-node, intra-node"),
)}


def _packed_ring(*args, **options) -> Schedule:
    from meshscale.collectives.synthesis import packed_ring  # synthesis builds on this package
    return packed_ring(*args, **options)


def _tree_packing(*args, **options) -> Schedule:
    from meshscale.collectives.synthesis import tree_packing
    return tree_packing(*args, **options)


ALGORITHMS["packed_ring"] = Algorithm("packed_ring", _packed_ring, ring.SUPPORTS,
                                      "ring over synthesized link-disjoint rings, both directions")
ALGORITHMS["tree_packing"] = Algorithm("tree_packing", _tree_packing, ("broadcast", "reduce", "all_reduce"),
                                       "LP-packed spanning trees weighted by rate (Blink)")


def build(algorithm: str, collective: str, ranks: list[int], nbytes: int, topology: Topology | None = None,
          **options) -> Schedule:
    """The schedule of ``algorithm`` for ``collective`` over ``ranks`` (device indices of ``topology``; any
    distinct integers when it is None). Raises MeshscaleError with a one-line reason when it does not apply."""
    collective = schedulable(collective).name
    check_choice(algorithm, ALGORITHMS, "algorithm")
    algo = ALGORITHMS[algorithm]
    if collective not in algo.collectives:
        raise MeshscaleError(f"algorithm {algorithm} cannot do {collective}; it supports {', '.join(algo.collectives)}")
    ranks = check_ranks(ranks, topology)
    for key in ("pieces", "elem_bytes"):
        if key in options and (not isinstance(options[key], int) or options[key] < 1):
            raise MeshscaleError(f"{key} must be a positive integer, got {options[key]!r}")
    return algo.fn(collective, ranks, int(nbytes), topology, **options)


def supported(algorithm: str) -> tuple[str, ...]:
    return ALGORITHMS[algorithm].collectives


__all__ = ["ALGORITHMS", "Algorithm", "build", "supported"]
