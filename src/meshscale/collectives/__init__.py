"""meshscale collectives layer: the schedule format (`schedule`), the algorithms (`algorithms`), topology-aware
synthesis of rings and trees (`synthesis`)."""
from __future__ import annotations


def build_schedule(collective: str, ranks: list[int], nbytes: int, algo: str | None = None, topology=None, **options):
    """The schedule of algorithm ``algo`` (default ring) for a collective over device indices ``ranks``; see
    `meshscale.collectives.algorithms.build` for the options (root, pieces, elem_bytes, rings, groups...)."""
    from meshscale.collectives.algorithms import build  # lazy: the algorithms import this package's schedule
    return build(algo or "ring", collective, ranks, nbytes, topology, **options)
