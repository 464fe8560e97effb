"""torch.distributed's own collectives on one rank's (inp, out) tensors, and the one place that knows which
names this torch gives them.

``CALLS[name]`` is the call a collective's record names (`CollectiveKind.torch_call`), as a function
``(inp, out, red, root, rank, world) -> None``: ``red`` is a ``dist.ReduceOp``, ``root`` a rank. Buffers are
laid out as the record's input and output units say (see `meshscale.bench.cases`).
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist

# torch 2.13 renamed the flat all-gather / reduce-scatter (the old names warn); torch 2.11 has only the old ones.
all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def _send_recv(inp: torch.Tensor, out: torch.Tensor, red, root: int, rank: int, world: int) -> None:
    ops = [dist.P2POp(dist.isend, inp, (rank + 1) % world), dist.P2POp(dist.irecv, out, (rank - 1) % world)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()


CALLS: dict[str, Callable[..., None]] = {
    "all_reduce": lambda inp, out, red, root, rank, world: dist.all_reduce(out, op=red),
    "broadcast": lambda inp, out, red, root, rank, world: dist.broadcast(out, root),
    "reduce": lambda inp, out, red, root, rank, world: dist.reduce(out, root, op=red),
    "all_gather_into_tensor": lambda inp, out, red, root, rank, world: all_gather_flat(out, inp),
    "reduce_scatter_tensor": lambda inp, out, red, root, rank, world: reduce_scatter_flat(out, inp, op=red),
    "all_to_all_single": lambda inp, out, red, root, rank, world: dist.all_to_all_single(out, inp),
    "gather": lambda inp, out, red, root, rank, world: dist.gather(
        inp, list(out.chunk(world)) if rank == root else None, dst=root),
    "scatter": lambda inp, out, red, root, rank, world: dist.scatter(
        out, list(inp.chunk(world)) if rank == root else None, src=root),
    "send_recv": _send_recv,
}

__all__ = ["CALLS", "all_gather_flat", "reduce_scatter_flat"]
