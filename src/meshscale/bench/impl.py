"""What runs one operation: torch.distributed's own collectives (``native``) or a meshscale schedule
executed by `meshscale.execute.schedule_runner` (``meshscale``). Both take the (inp, out) buffers of
`meshscale.bench.cases`."""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

from meshscale.errors import MeshscaleError

Op = Callable[[torch.Tensor, torch.Tensor], None]
IMPLS = ("native", "meshscale", "nccl")  # nccl: `meshscale.bench.nccl_direct`
REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
              "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}
# torch 2.13 renamed the flat all-gather / reduce-scatter (the old names warn); torch 2.11 has only the old.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def native_op(collective: str, op: str, root: int, rank: int, world: int) -> Op:
    """One torch.distributed call of ``collective`` on this rank's (inp, out)."""
    red = REDUCE_OPS[op]
    if collective == "all_reduce":
        return lambda inp, out: dist.all_reduce(out, op=red)
    if collective == "broadcast":
        return lambda inp, out: dist.broadcast(out, root)
    if collective == "reduce":
        return lambda inp, out: dist.reduce(out, root, op=red)
    if collective == "all_gather":
        return lambda inp, out: _all_gather_flat(out, inp)
    if collective == "reduce_scatter":
        return lambda inp, out: _reduce_scatter_flat(out, inp, op=red)
    if collective == "all_to_all":
        return lambda inp, out: dist.all_to_all_single(out, inp)
    if collective == "gather":
        return lambda inp, out: dist.gather(inp, list(out.chunk(world)) if rank == root else None, dst=root)
    if collective == "scatter":
        return lambda inp, out: dist.scatter(out, list(inp.chunk(world)) if rank == root else None, src=root)
    if collective == "send_recv":
        def send_recv(inp: torch.Tensor, out: torch.Tensor) -> None:
            ops = [dist.P2POp(dist.isend, inp, (rank + 1) % world), dist.P2POp(dist.irecv, out, (rank - 1) % world)]
            for req in dist.batch_isend_irecv(ops):
                req.wait()
        return send_recv
    raise MeshscaleError(f"no native implementation of {collective}")


def meshscale_op(collective: str, ranks: list[int], nbytes: int, algo: str | None, elem_bytes: int, rank: int,
                 op: str = "sum", root: int = 0, topology=None) -> Op:
    """The hook for ``--impl meshscale``: build the schedule of algorithm ``algo`` for ``collective`` of
    ``nbytes`` (nccl-tests' size) over device indices ``ranks``, and return a callable that runs this rank's
    part of it once. The schedule is built and planned here, once per size, outside the timed loop.
    ``topology`` (of the devices ``ranks``, or None) serves the topology-aware algorithms."""
    if op != "sum":
        raise MeshscaleError(f"--impl meshscale reduces with sum only (got --op {op}); use --op sum or --impl native")
    if collective == "send_recv":
        raise MeshscaleError("send_recv has no meshscale schedule; use --impl native")
    try:
        from meshscale.collectives import build_schedule  # the algorithm library (issue 4)
    except ImportError:
        raise MeshscaleError("--impl meshscale needs meshscale.collectives.build_schedule, which this version "
                             "does not have yet; use --impl native") from None
    from meshscale.execute.schedule_runner import make_buffers, plan_rank, run_plan

    schedule = build_schedule(collective, ranks, nbytes, algo, topology, root=root, elem_bytes=elem_bytes)
    plan = plan_rank(schedule, rank, elem_bytes)
    buffers: dict[str, tuple] = {}

    def run(inp: torch.Tensor, out: torch.Tensor) -> None:
        if "b" not in buffers:  # allocate once, on the buffers' device and dtype
            buffers["b"] = make_buffers(plan, out.dtype, out.device)
        run_plan(plan, inp, out, buffers=buffers["b"])
    return run
