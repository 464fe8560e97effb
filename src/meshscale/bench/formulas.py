"""algbw and busbw exactly as nccl-tests defines them (doc/PERFORMANCE.md of nccl-tests, DOMAIN.md).

``size_bytes`` is the size nccl-tests prints: the whole buffer (the gathered output of all_gather and gather,
the input of reduce_scatter and scatter, one rank's send buffer of all_to_all), and the one buffer of
all_reduce, broadcast, reduce and send_recv. algbw = size / time; busbw = algbw x factor, where the factor
makes busbw comparable with the per-link bandwidth whatever the rank count:
  all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all, gather, scatter (n-1)/n; others 1.
"""
from __future__ import annotations

from meshscale.errors import MeshscaleError
from meshscale.simulate.metrics import bus_factor

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "gather",
               "scatter", "send_recv")
REDUCING = ("all_reduce", "reduce_scatter", "reduce")  # take a reduction op
ROOTED = ("broadcast", "reduce", "gather", "scatter")  # take a root rank
SPLIT = ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter")  # size splits into one chunk per rank
# Names nccl-tests uses for its binaries (all_reduce_perf, alltoall_perf, sendrecv_perf...).
NCCL_TESTS_NAMES = {"all_to_all": "alltoall", "send_recv": "sendrecv"}


def check_collective(name: str) -> str:
    """The collective's canonical name, or a one-line error listing the known ones."""
    canonical = name.strip().lower().replace("-", "_")
    canonical = {v: k for k, v in NCCL_TESTS_NAMES.items()}.get(canonical, canonical)
    if canonical not in COLLECTIVES:
        raise MeshscaleError(f"unknown collective {name!r}; use one of {', '.join(COLLECTIVES)} (or 'all')")
    return canonical


def busbw_factor(collective: str, world_size: int) -> float:
    """The nccl-tests factor from algbw to busbw for ``collective`` on ``world_size`` ranks (one formula for
    measured and simulated figures: `meshscale.simulate.metrics.bus_factor`)."""
    return bus_factor(check_collective(collective), world_size)


def bandwidths(collective: str, size_bytes: int, time_s: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes/s of one operation of ``size_bytes`` that took ``time_s``."""
    algbw = size_bytes / time_s if time_s > 0 else 0.0
    return algbw, algbw * busbw_factor(collective, world_size)
