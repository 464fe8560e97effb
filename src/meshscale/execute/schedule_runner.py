"""Run a `Schedule` for real: point-to-point transfers per step (`dist.batch_isend_irecv`) plus local
reductions, over NCCL on GPUs or Gloo on CPUs. Schedule rank i is process rank i of the group.

Each rank keeps a working copy of the schedule's logical buffer (see `collectives.schedule`): its input is
copied in at `input_spans`, the steps run, its output is read out at `output_spans`. A step's sends read the
buffer as it was before the step; its receives land in scratch space (or straight in the buffer when this rank
does not send that chunk in the step) and are applied after the whole step has arrived.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from meshscale.collectives.algorithms import build
from meshscale.collectives.schedule import Schedule, buffer_bytes, input_spans, output_spans
from meshscale.errors import MeshscaleError


@dataclass
class _Recv:
    peer: int
    start: int  # element offsets in the working buffer
    stop: int
    reduce: bool
    scratch: int  # element offset in the scratch buffer, or -1 when received in place


@dataclass
class _RankStep:
    sends: list[tuple[int, int, int]]  # (peer, start, stop)
    recvs: list[_Recv]


@dataclass
class RankPlan:
    """What one rank does in a schedule, in elements of ``elem_size`` bytes; built once, run many times."""

    schedule: Schedule
    rank: int
    elem_size: int
    steps: list[_RankStep]
    scratch_elems: int
    buffer_elems: int


def plan_rank(schedule: Schedule, rank: int, elem_size: int) -> RankPlan:
    """Precompute ``rank``'s sends and receives per step for tensors of ``elem_size``-byte elements."""
    if schedule.elem_bytes % elem_size:
        raise MeshscaleError(f"schedule chunks are multiples of {schedule.elem_bytes} bytes; tensors of "
                             f"{elem_size}-byte elements do not fit them: build it with elem_bytes={elem_size}")
    if not 0 <= rank < schedule.n:
        raise MeshscaleError(f"rank {rank} is outside the schedule's {schedule.n} ranks")
    chunks = schedule.chunks
    steps, most = [], 0
    for step in schedule.steps:
        mine = [t for t in step.transfers if rank in (t.src, t.dst)]
        sent_chunks = {t.chunk for t in mine if t.src == rank}
        sends, recvs, used = [], [], 0
        for t in mine:
            start = chunks[t.chunk].offset_bytes // elem_size
            stop = start + chunks[t.chunk].nbytes // elem_size
            if t.src == rank:
                sends.append((t.dst, start, stop))
                continue
            in_place = t.op == "copy" and t.chunk not in sent_chunks
            recvs.append(_Recv(t.src, start, stop, t.op == "reduce", -1 if in_place else used))
            used += 0 if in_place else stop - start
        most = max(most, used)
        steps.append(_RankStep(sends, recvs))
    total = buffer_bytes(schedule.collective, schedule.n, schedule.nbytes) // elem_size
    return RankPlan(schedule, rank, elem_size, steps, most, total)


def run_plan(plan: RankPlan, inp: torch.Tensor, out: torch.Tensor, group=None,
             buffers: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """Run one rank's part of the schedule: ``inp`` and ``out`` are this rank's 1-D input and output tensors
    (sizes as the collective defines; a rank with no input or output may pass empty tensors). ``buffers``:
    (work, scratch) to reuse across calls (see `make_buffers`)."""
    s, r = plan.schedule, plan.rank
    work, scratch = buffers or make_buffers(plan, inp.dtype, inp.device)
    _copy_spans(input_spans(s, r), plan.elem_size, inp, work, into_work=True)
    peer = (lambda i: i) if group is None else (lambda i: dist.get_global_rank(group, i))
    for step in plan.steps:
        ops = [dist.P2POp(dist.isend, work[a:b], peer(p), group) for p, a, b in step.sends]
        for rv in step.recvs:
            target = work[rv.start:rv.stop] if rv.scratch < 0 else scratch[rv.scratch:rv.scratch + rv.stop - rv.start]
            ops.append(dist.P2POp(dist.irecv, target, peer(rv.peer), group))
        if not ops:
            continue
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        for rv in step.recvs:  # apply after the whole step: the step's sends read the old values
            if rv.scratch < 0:
                continue
            got = scratch[rv.scratch:rv.scratch + rv.stop - rv.start]
            if rv.reduce:
                work[rv.start:rv.stop] += got
            else:
                work[rv.start:rv.stop].copy_(got)
    _copy_spans(output_spans(s, r), plan.elem_size, out, work, into_work=False)


def make_buffers(plan: RankPlan, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The working copy of the logical buffer and the scratch space for received chunks."""
    return (torch.zeros(plan.buffer_elems, dtype=dtype, device=device),
            torch.empty(max(plan.scratch_elems, 1), dtype=dtype, device=device))


def _copy_spans(spans: list[tuple[int, int]], elem_size: int, tensor: torch.Tensor, work: torch.Tensor,
                into_work: bool) -> None:
    flat = tensor.view(-1)  # contiguous tensors only: a reshaped copy would lose the output
    need = sum(n for _, n in spans) // elem_size
    if flat.numel() < need:
        raise MeshscaleError(f"{'input' if into_work else 'output'} tensor has {flat.numel()} elements; "
                             f"this rank needs {need}")
    pos = 0
    for offset, nbytes in spans:
        a, n = offset // elem_size, nbytes // elem_size
        if into_work:
            work[a:a + n].copy_(flat[pos:pos + n])
        else:
            flat[pos:pos + n].copy_(work[a:a + n])
        pos += n


def schedule_callable(schedule: Schedule, group=None) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """``schedule`` as a callable ``op(tensor_in, tensor_out)`` for this process (its rank in ``group`` is its
    schedule rank). Tensors are 1-D and contiguous with the sizes of the collective (see
    `collectives.schedule`); the rank's plan and buffers are built on the first call and reused. ``op.schedule``
    is the schedule, for callers that report its algorithm or channels."""
    state: dict = {}

    def op(tensor_in: torch.Tensor, tensor_out: torch.Tensor) -> None:
        key = (tensor_in.dtype, tensor_in.device)
        if key not in state:
            plan = plan_rank(schedule, dist.get_rank(group), tensor_in.element_size())
            state[key] = (plan, make_buffers(plan, tensor_in.dtype, tensor_in.device))
        plan, buffers = state[key]
        run_plan(plan, tensor_in, tensor_out, group, buffers)

    op.schedule = schedule
    return op


def run_schedule(schedule: Schedule, inp: torch.Tensor, out: torch.Tensor, group=None) -> None:
    """Run ``schedule`` on this process (its rank in ``group`` is its schedule rank): one call, no reuse."""
    schedule_callable(schedule, group)(inp, out)


def schedule_op(collective: str, ranks: list[int], nbytes: int, algo: str = "ring", topology=None, *, root: int = 0,
                **options) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """`schedule_callable` of meshscale's algorithm ``algo`` for ``collective`` over device indices ``ranks``
    (options as `meshscale.collectives.algorithms.build`). To run the simulator's choice, choose the schedule
    first (`meshscale.simulate.choose`) and pass it to `schedule_callable`."""
    return schedule_callable(build(algo, collective, ranks, nbytes, topology, root=root, **options))
