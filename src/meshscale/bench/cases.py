"""The buffers of one collective at one size on one rank, filled with exact small integers, and what each
rank must hold afterwards: one function for every collective, read off its record
(`meshscale.collectives.kinds`): rank r's input is its input units, its output its output units, and an
output unit must end with the reduction over (or the one value of) the ranks whose input holds it.

Inputs are integers 1..7 (prod: 1 or 2, with exactly one 2 per element across ranks; avg: multiples of the
rank count), so sums, products and means stay exact in float16, bfloat16, float32 and int32 for up to 36
ranks. Each element's value depends on its index, the contributing rank and the unit, so a unit put in the
wrong place is caught too.

Buffer layout (``inp``, ``out``) per rank, as `meshscale.execute.schedule_runner` expects it too: out-of-place,
``inp`` holds the rank's input units and ``out`` its output units (either may be empty); in place, one tensor
holds the larger side and the other side is a view of it (``inp is out`` when both are the whole buffer, as
torch.distributed's all_reduce, broadcast and reduce work in place; a side without units is the whole tensor).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from meshscale.collectives.kinds import kind

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
          "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8}
# nccl-tests' type names (its -d and its tables); nccl-tests' int8, uint32, uint64 and fp8 types are not measured
# here (Gloo lacks them, or a sum of the test values over many ranks overflows int8)
DTYPE_LABELS = {"float32": "float", "float16": "half", "bfloat16": "bfloat16", "float64": "double", "int32": "int32",
                "int64": "int64", "uint8": "uint8"}
OPS = ("sum", "prod", "min", "max", "avg")


def largest_value(op: str, world: int) -> int:
    """The largest value a buffer holds (inputs or result) for ``op`` over ``world`` ranks (see `values`)."""
    if op == "prod":
        return 2
    return 7 * world * (world if op == "avg" else 1)


@dataclass
class Case:
    """The buffers of one collective at one size on one rank, and how to reset and check them."""

    inp: torch.Tensor
    out: torch.Tensor
    reset: Callable[[], None]  # refill the inputs (an in-place op overwrote them)
    result: torch.Tensor  # the part of the buffers this rank checks afterwards
    expected: Optional[Callable[[], torch.Tensor]]  # what ``result`` must equal; None: nothing to check here
    send_counts: Optional[list[int]] = None  # all_to_allv: elements to each peer, in rank order
    recv_counts: Optional[list[int]] = None  # all_to_allv: elements from each peer
    count: Optional[int] = None  # all_to_allv: nccl-tests' count column (elements per peer at the even split)
    size_bytes: Optional[int] = None  # all_to_allv: the most bytes a rank sends or receives (nccl-tests' size)


# nccl-tests' alltoallv (src/alltoallv.cu, 2.19.6) aligns every block to 16 bytes and, by default
# (NCCL_TESTS_ALLTOALLV_SPREAD=1), gives a peer at rank distance d a share d / (n(n-1)/2) of a rank's bytes
ALLTOALLV_ALIGN_BYTES = 16
ALLTOALLV_SPREAD = 1.0


def alltoallv_bytes(src: int, dst: int, n: int, total_bytes: int, spread: float = ALLTOALLV_SPREAD) -> int:
    """Bytes rank ``src`` sends rank ``dst`` of ``total_bytes`` per rank, as nccl-tests' generated pattern: a blend
    of the even share (``spread`` 0) and the distance-weighted one (``spread`` 1: none to itself, the most to the
    rank just before it), aligned down to 16 bytes."""
    if n == 1:
        return total_bytes // ALLTOALLV_ALIGN_BYTES * ALLTOALLV_ALIGN_BYTES
    distance = (dst - src) % n
    share = (1.0 - spread) * total_bytes / n + spread * distance * total_bytes / (n * (n - 1) / 2)
    return int(share) // ALLTOALLV_ALIGN_BYTES * ALLTOALLV_ALIGN_BYTES


def alltoallv_shape(size_bytes: int, n: int, elem_bytes: int) -> tuple[int, int]:
    """(count, bytes per rank) of an alltoallv sweep size, as nccl-tests derives them: the even split's elements
    per peer, aligned to 16 bytes, and the rank's total bytes they make."""
    count = size_bytes // elem_bytes // n // (ALLTOALLV_ALIGN_BYTES // elem_bytes) * (ALLTOALLV_ALIGN_BYTES // elem_bytes)
    return count, count * n * elem_bytes


def alltoallv_case(size_bytes: int, dtype_name: str, rank: int, world: int, device: torch.device,
                   spread: float = ALLTOALLV_SPREAD) -> Case:
    """all_to_allv's buffers on this rank: the block for each peer in rank order, each of `alltoallv_bytes`,
    its values set by (sender, receiver); the output the blocks from each peer in rank order."""
    dtype = DTYPES[dtype_name]
    elem = torch.empty((), dtype=dtype).element_size()
    count, total = alltoallv_shape(size_bytes, world, elem)
    send = [alltoallv_bytes(rank, d, world, total, spread) // elem for d in range(world)]
    recv = [alltoallv_bytes(s, rank, world, total, spread) // elem for s in range(world)]
    inp = torch.empty(sum(send), dtype=dtype, device=device)
    out = torch.empty(sum(recv), dtype=dtype, device=device)

    def reset() -> None:
        out.zero_()
        inp.copy_(torch.cat([values(rank, c, world, dtype, "sum", device, salt=d) for d, c in enumerate(send)]))

    def expected() -> torch.Tensor:
        return torch.cat([values(s, c, world, dtype, "sum", device, salt=rank) for s, c in enumerate(recv)])
    # the pattern depends on the distance alone: every rank sends and receives this total (nccl-tests' size column)
    return Case(inp, out, reset, out, expected, send, recv, count, sum(send) * elem)


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


def make_case(collective: str, size_bytes: int, dtype_name: str, op: str, root: int, inplace: bool, rank: int,
              world: int, device: torch.device, spread: float = ALLTOALLV_SPREAD) -> Case:
    """Buffers, reset and expected result of ``collective`` at ``size_bytes`` for this rank (``spread``: all_to_allv's
    blend of even and distance-weighted blocks)."""
    k, dtype = kind(collective), DTYPES[dtype_name]
    if k.variable:
        return alltoallv_case(size_bytes, dtype_name, rank, world, device, spread)
    c = k.count(size_bytes, world, torch.empty((), dtype=dtype).element_size())
    ins, outs = k.input_units(rank, world, root), k.output_units(rank, world, root)
    fill_op = op if k.reducing else "sum"  # values of a collective without reduction are plain
    if inplace:
        inp, out = _in_place(ins, outs, c, dtype, device)
    else:
        inp, out = torch.empty(len(ins) * c, dtype=dtype, device=device), torch.empty(len(outs) * c, dtype=dtype, device=device)

    def reset() -> None:
        out.zero_()  # first: in place, the input lies in it; a result left from the last run must not pass
        if ins:
            inp.copy_(torch.cat([values(rank, c, world, dtype, fill_op, device, salt=u) for u in ins]))

    def expected() -> torch.Tensor:
        sources = k.sources(world, root)
        return torch.cat([reduced(c, world, dtype, op, device, salt=u) if k.reducing
                          else values(min(sources[u]), c, world, dtype, "sum", device, salt=u) for u in outs])
    return Case(inp, out, reset, out, expected if outs else None)


def _in_place(ins: list[int], outs: list[int], c: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """One tensor over the larger side's units (they run contiguously); the other side a view at its units."""
    whole = max(ins, outs, key=len)
    buf = torch.empty(len(whole) * c, dtype=dtype, device=device)

    def view(units: list[int]) -> torch.Tensor:
        if not units or units == whole:
            return buf
        start = (units[0] - whole[0]) * c
        return buf[start:start + len(units) * c]
    return view(ins), view(outs)


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
