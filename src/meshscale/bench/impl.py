"""What runs one operation: torch.distributed's own collectives (``native``) or a meshscale schedule
executed by `meshscale.execute.schedule_runner` (``meshscale``). Both take the (inp, out) buffers of
`meshscale.bench.cases`."""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from meshscale.collectives.kinds import kind
from meshscale.errors import MeshscaleError

Op = Callable[[torch.Tensor, torch.Tensor], None]
IMPLS = ("native", "meshscale", "nccl")  # nccl: `meshscale.bench.nccl_direct`
REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
              "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}


def native_op(collective: str, op: str, root: int, rank: int, world: int,
              splits: tuple[list[int], list[int]] | None = None) -> Op:
    """One torch.distributed call of ``collective`` on this rank's (inp, out); ``splits``: all_to_allv's elements
    (to each peer, from each peer), as all_to_all_single's input and output split sizes."""
    from meshscale.execute.torch_collectives import CALLS
    if kind(collective).variable:
        if splits is None:
            raise MeshscaleError(f"{collective} needs its split sizes")
        send, recv = splits
        return lambda inp, out: dist.all_to_all_single(out, inp, output_split_sizes=recv, input_split_sizes=send)
    call, red = CALLS[kind(collective).torch_call], REDUCE_OPS[op]
    return lambda inp, out: call(inp, out, red, root, rank, world)


def meshscale_op(collective: str, ranks: list[int], nbytes: int, algo: str | None, elem_bytes: int,
                 op: str = "sum", root: int = 0, topology=None) -> Op:
    """The hook for ``--impl meshscale``: the schedule of algorithm ``algo`` (default ring; "auto": the
    simulator's fastest on ``topology``) for ``collective`` of ``nbytes`` (nccl-tests' size) over device indices
    ``ranks``, as a callable that runs this rank's part of it once. The schedule is built here, once per size,
    outside the timed loop. ``topology`` (of the devices ``ranks``, or None) serves topology-aware algorithms."""
    from meshscale.collectives.algorithms import build
    from meshscale.collectives.kinds import schedulable
    from meshscale.execute.schedule_runner import schedule_callable

    if op != "sum":
        raise MeshscaleError(f"--impl meshscale reduces with sum only (got --op {op}); use --op sum or --impl native")
    schedulable(collective)
    if algo == "auto":
        if topology is None:
            raise MeshscaleError("--algo auto needs the devices' topology to simulate on; name an algorithm")
        from meshscale.simulate import choose
        schedule = choose(topology, collective, ranks, nbytes, root=root).schedule
    else:
        schedule = build(algo or "ring", collective, ranks, nbytes, topology, root=root, elem_bytes=elem_bytes)
    return schedule_callable(schedule)
