"""Bandwidth figures as nccl-tests reports them: algbw = S / t and busbw = algbw x a per-collective factor."""
from __future__ import annotations

from meshscale.errors import MeshscaleError


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' busbw factor: 2(n-1)/n all_reduce, (n-1)/n all_gather, reduce_scatter, all_to_all, gather
    and scatter, 1 broadcast, reduce and send/recv."""
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"):
        return (n - 1) / n
    if collective in ("broadcast", "reduce", "sendrecv", "send_recv", "p2p"):
        return 1.0
    raise MeshscaleError(f"no bus bandwidth factor for collective {collective!r}")


def algbw(nbytes: float, time_s: float) -> float:
    """Algorithm bandwidth in bytes/s (nccl-tests' size over time)."""
    return nbytes / time_s if time_s > 0 else float("inf")
