"""One function per collective, in the nccl-tests spirit: allocate its buffers for one size, fill them with
exact small integers, and say what each rank must hold afterwards.

Inputs are integers 1..7 (prod: 1 or 2, with exactly one 2 per element across ranks; avg: multiples of the
rank count), so sums, products and means stay exact in float16, bfloat16, float32 and int32 for up to 36
ranks. Each element's value depends on its index, the sending rank and (where chunks travel) the chunk, so a
chunk put in the wrong place is caught too.

Buffer layout (``inp``, ``out``) per rank, as `meshscale.execute.schedule_runner` expects it too:
all_reduce / broadcast / reduce: one buffer (``inp is out``: torch.distributed works in place);
all_gather: inp = own chunk, out = all chunks; reduce_scatter: inp = all chunks, out = own chunk;
all_to_all: inp = one chunk per destination, out = one chunk per source; gather: inp = own chunk, out = all
chunks at the root (empty elsewhere); scatter: inp = all chunks at the root (empty elsewhere), out = own chunk;
send_recv: inp is sent to rank+1, out receives from rank-1.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from meshscale.bench.formulas import SPLIT

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "int32": torch.int32}
# nccl-tests' type names, for the table
DTYPE_LABELS = {"float32": "float", "float16": "half", "bfloat16": "bfloat16", "int32": "int32"}
OPS = ("sum", "prod", "min", "max", "avg")
# torch.distributed only has in-place all_reduce, broadcast and reduce, and only out-of-place all_to_all,
# gather, scatter and send/recv; all_gather and reduce_scatter have both (input = a chunk of the output).
PLACES = {"all_reduce": ("in",), "broadcast": ("in",), "reduce": ("in",), "all_gather": ("out", "in"),
          "reduce_scatter": ("out", "in"), "all_to_all": ("out",), "gather": ("out",), "scatter": ("out",),
          "send_recv": ("out",)}


@dataclass
class Case:
    """The buffers of one collective at one size on one rank, and how to reset and check them."""

    inp: torch.Tensor
    out: torch.Tensor
    reset: Callable[[], None]  # refill the inputs (an in-place op overwrote them)
    result: torch.Tensor  # the part of the buffers this rank checks afterwards
    expected: Optional[Callable[[], torch.Tensor]]  # what ``result`` must equal; None: nothing to check here


def values(rank: int, count: int, world: int, dtype: torch.dtype, op: str, device: torch.device,
           salt: int = 0) -> torch.Tensor:
    """The ``count`` input values rank ``rank`` contributes (to chunk ``salt``), exact small integers."""
    i = torch.arange(count, dtype=torch.int32, device=device)
    if op == "prod":
        v = torch.where((i + rank) % world == 0, 2, 1)
    else:
        v = (i + 3 * rank + 5 * salt) % 7 + 1
        if op == "avg":
            v = v * world  # the mean over ranks is then the (integer) sum of the base values
    return v.to(dtype)


def reduced(count: int, world: int, dtype: torch.dtype, op: str, device: torch.device, salt: int = 0) -> torch.Tensor:
    """The reduction over all ranks of their `values` (for chunk ``salt``), computed exactly in int32."""
    if op == "prod":
        return torch.full((count,), 2, dtype=dtype, device=device)
    acc = values(0, count, world, torch.int32, "sum" if op == "avg" else op, device, salt)
    for r in range(1, world):
        v = values(r, count, world, torch.int32, "sum" if op == "avg" else op, device, salt)
        acc = torch.minimum(acc, v) if op == "min" else torch.maximum(acc, v) if op == "max" else acc + v
    return acc.to(dtype)


def chunk_count(collective: str, size_bytes: int, world: int, elem_bytes: int) -> int:
    """Elements in one chunk (split collectives) or in the whole buffer (others): nccl-tests' count column."""
    return size_bytes // elem_bytes // (world if collective in SPLIT else 1)


def make_case(collective: str, size_bytes: int, dtype_name: str, op: str, root: int, inplace: bool, rank: int,
              world: int, device: torch.device) -> Case:
    """Buffers, reset and expected result of ``collective`` at ``size_bytes`` for this rank."""
    dtype = DTYPES[dtype_name]
    c = chunk_count(collective, size_bytes, world, torch.empty((), dtype=dtype).element_size())
    return _SETUPS[collective](c, dtype, op, root, inplace, rank, world, device)


def _empty(n: int, dtype, device) -> torch.Tensor:
    return torch.empty(n, dtype=dtype, device=device)


def _all_reduce(c, dtype, op, root, inplace, rank, world, device) -> Case:
    buf = _empty(c, dtype, device)
    return Case(buf, buf, lambda: buf.copy_(values(rank, c, world, dtype, op, device)), buf,
                lambda: reduced(c, world, dtype, op, device))


def _broadcast(c, dtype, op, root, inplace, rank, world, device) -> Case:
    buf = _empty(c, dtype, device)

    def reset():
        if rank == root:
            buf.copy_(values(root, c, world, dtype, "sum", device))
        else:
            buf.zero_()
    return Case(buf, buf, reset, buf, lambda: values(root, c, world, dtype, "sum", device))


def _reduce(c, dtype, op, root, inplace, rank, world, device) -> Case:
    buf = _empty(c, dtype, device)
    expected = (lambda: reduced(c, world, dtype, op, device)) if rank == root else None  # others: undefined
    return Case(buf, buf, lambda: buf.copy_(values(rank, c, world, dtype, op, device)), buf, expected)


def _all_gather(c, dtype, op, root, inplace, rank, world, device) -> Case:
    out = _empty(world * c, dtype, device)
    inp = out[rank * c:(rank + 1) * c] if inplace else _empty(c, dtype, device)
    return Case(inp, out, lambda: inp.copy_(values(rank, c, world, dtype, "sum", device)), out,
                lambda: torch.cat([values(r, c, world, dtype, "sum", device) for r in range(world)]))


def _reduce_scatter(c, dtype, op, root, inplace, rank, world, device) -> Case:
    inp = _empty(world * c, dtype, device)
    out = inp[rank * c:(rank + 1) * c] if inplace else _empty(c, dtype, device)

    def reset():
        inp.copy_(torch.cat([values(rank, c, world, dtype, op, device, salt=k) for k in range(world)]))
    return Case(inp, out, reset, out, lambda: reduced(c, world, dtype, op, device, salt=rank))


def _all_to_all(c, dtype, op, root, inplace, rank, world, device) -> Case:
    inp, out = _empty(world * c, dtype, device), _empty(world * c, dtype, device)

    def reset():
        inp.copy_(torch.cat([values(rank, c, world, dtype, "sum", device, salt=d) for d in range(world)]))
    return Case(inp, out, reset, out,
                lambda: torch.cat([values(s, c, world, dtype, "sum", device, salt=rank) for s in range(world)]))


def _gather(c, dtype, op, root, inplace, rank, world, device) -> Case:
    inp, out = _empty(c, dtype, device), _empty(world * c if rank == root else 0, dtype, device)
    expected = (lambda: torch.cat([values(r, c, world, dtype, "sum", device) for r in range(world)])) if rank == root else None
    return Case(inp, out, lambda: inp.copy_(values(rank, c, world, dtype, "sum", device)), out, expected)


def _scatter(c, dtype, op, root, inplace, rank, world, device) -> Case:
    inp, out = _empty(world * c if rank == root else 0, dtype, device), _empty(c, dtype, device)

    def reset():
        if rank == root:
            inp.copy_(torch.cat([values(r, c, world, dtype, "sum", device, salt=1) for r in range(world)]))
        out.zero_()
    return Case(inp, out, reset, out, lambda: values(rank, c, world, dtype, "sum", device, salt=1))


def _send_recv(c, dtype, op, root, inplace, rank, world, device) -> Case:
    inp, out = _empty(c, dtype, device), _empty(c, dtype, device)

    def reset():
        inp.copy_(values(rank, c, world, dtype, "sum", device))
        out.zero_()
    return Case(inp, out, reset, out, lambda: values((rank - 1) % world, c, world, dtype, "sum", device))


_SETUPS = {"all_reduce": _all_reduce, "broadcast": _broadcast, "reduce": _reduce, "all_gather": _all_gather,
           "reduce_scatter": _reduce_scatter, "all_to_all": _all_to_all, "gather": _gather, "scatter": _scatter,
           "send_recv": _send_recv}


def count_wrong(case: Case, op: str, world: int) -> int:
    """Elements of this rank's result that differ from the expected values (0 where nothing is checked)."""
    if case.expected is None:
        return 0
    got, want = case.result, case.expected()
    if op == "avg" and got.is_floating_point():
        # NCCL's float avg multiplies by 1/n before summing: allow the rounding that introduces
        tol = torch.finfo(got.dtype).eps * world
        return int((~torch.isclose(got.float(), want.float(), rtol=tol, atol=0)).sum())
    return int((got != want).sum())
