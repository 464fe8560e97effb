"""Gradient exchange modes of data-parallel training, behind one small interface.

- `ddp`: torch DistributedDataParallel.
- `allreduce`: Horovod-style distributed optimizer: gradients fused into buckets, each bucket all-reduced
  asynchronously as soon as its last gradient is accumulated during backward (overlap), optional bf16/fp16
  compression on the wire.
- `ps`: a parameter server, sharded over the ranks or held by ``ps_servers`` dedicated ranks: each server owns
  a contiguous slice of the flattened parameters and its optimizer state; workers push gradients to the
  owners (reduce-scatter, or a reduce per server), owners update their slices, workers pull the parameters
  back (all-gather, or a broadcast per server). With ``max_staleness`` k > 0 a pull stays in
  flight for up to k steps while the worker trains on parameters at most k steps old (bounded staleness);
  k = 0 is synchronous.

Per step the loop calls: ``zero_grad``, forward/backward on ``model``, ``finish`` (wait for the gradient
exchange), ``update`` (optimizer), ``pull`` (PS only). ``last_ready`` is the clock mark taken when the last
gradient became ready, so exposed communication = time from it to the end of ``finish``.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

from meshscale.errors import MeshscaleError, check_choice
from meshscale.execute.torch_collectives import all_gather_flat, reduce_scatter_flat
from meshscale.train.config import TRAIN_MODES, AllreduceOptions, DdpOptions, PsOptions
from meshscale.train.timing import Clock

WIRE_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def flat_params(params) -> torch.Tensor:
    """All parameters as one vector (``reshape``: channels-last weights are not viewable as flat)."""
    return torch.cat([p.detach().reshape(-1) for p in params])


def grad_view(flat: torch.Tensor, p: torch.Tensor, offset: int) -> torch.Tensor:
    """``p``'s slot in a flat bucket, with ``p``'s own strides (channels-last weights too): copying a gradient in
    is then one dense copy, and the optimizer's fused / foreach kernels see gradients laid out like their
    parameters (a layout mismatch sends foreach SGD to its slow path and makes fused SGD refuse)."""
    if p.dim() == 4 and p.is_contiguous(memory_format=torch.channels_last):
        return torch.as_strided(flat, p.shape, p.stride(), flat.storage_offset() + offset)
    return flat[offset:offset + p.numel()].view(p.shape)


class Exchange:
    """Common part: the wrapped model, its optimizer, and no-op hooks. A parallel layout's engines are an
    exchange too (train/parallel/engine.py): what they change is said by the class attributes below."""

    layout: Any = None          # the ParallelLayout run (None: a data-parallel mode over every rank)
    schedule: Any = None        # a pipeline schedule that runs forward and backward itself (None: call ``model``)
    first_stage = last_stage = True   # whether this rank's stages take the batch / produce the loss
    timed_phases = True         # the step's phases (exchange finish, update, pull) are timed apart by clock marks
    sharded = False             # checkpoints hold shards (torch.distributed.checkpoint), not rank files

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, clock: Clock):
        self.model, self.optimizer, self.clock = model, optimizer, clock
        self.last_ready: Any = None
        self.computes = True  # False on a dedicated parameter-server rank: no forward / backward there

    def reduce_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss a step reports: this rank's (each data-parallel rank's is a fair sample of the batch's)."""
        return loss

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def finish(self) -> None:
        """Wait until the gradients are exchanged."""

    def update(self, scaler: Any = None) -> None:
        """Apply the optimizer (through the fp16 grad scaler if there is one)."""
        if scaler is not None:
            scaler.step(self.optimizer)
            scaler.update()
        else:
            self.optimizer.step()

    def pull(self) -> None:
        """Fetch updated parameters (parameter server modes)."""

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])


class DDPExchange(Exchange):
    """torch DDP. With timing on, a thin comm hook (the default all-reduce) marks when the last bucket is
    ready; DDP waits for the all-reduces inside backward, so exposed comm = end of backward - that mark."""

    def __init__(self, model, optimizer, clock, device, bucket_cap_mb=25.0, bucket_view=False, static_graph=False,
                 timing=True):
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [device.index] if device.type == "cuda" else None
        ddp = DDP(model, device_ids=ids, bucket_cap_mb=bucket_cap_mb, gradient_as_bucket_view=bucket_view,
                  static_graph=static_graph)
        super().__init__(ddp, optimizer, clock)
        self._bucket_view = bucket_view
        if timing:
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

            def hook(state, bucket):
                if bucket.is_last():
                    self.last_ready = clock.mark()
                return allreduce_hook(state, bucket)
            ddp.register_comm_hook(None, hook)

    def zero_grad(self) -> None:
        # with gradient_as_bucket_view the grads are views into DDP's buckets: zero them, do not drop them
        self.optimizer.zero_grad(set_to_none=not self._bucket_view)


class _Bucket:
    def __init__(self, params: list[nn.Parameter], wire_dtype: torch.dtype | None):
        self.params = params
        self.offsets, n = [], 0
        for p in params:
            self.offsets.append(n)
            n += p.numel()
        p0 = params[0]
        self.flat = torch.zeros(n, dtype=p0.dtype, device=p0.device)
        self.wire = self.flat if wire_dtype is None else torch.zeros(n, dtype=wire_dtype, device=p0.device)
        self.ready = 0
        self.work: Any = None


class AllreduceExchange(Exchange):
    """Fused, overlapped all-reduce of gradients (Horovod's distributed optimizer).

    Buckets hold parameters in reverse registration order (about the order backward produces gradients) up
    to ``fusion_bytes`` each. Buckets are launched strictly in index order, as DDP does, so every rank issues
    the same sequence of collectives even when gradients arrive in a different order. ``allreduce`` is the
    collective: the native ``dist.all_reduce`` or a meshscale schedule executor with the same signature."""

    def __init__(self, model, optimizer, clock, world: int, fusion_bytes: int = 64 << 20, compression: str = "none",
                 allreduce: Callable | None = None):
        super().__init__(model, optimizer, clock)
        self.world = world
        self.allreduce = allreduce or dist.all_reduce
        wire = WIRE_DTYPES[compression]
        params = [p for p in model.parameters() if p.requires_grad]
        self.buckets: list[_Bucket] = []
        group, size = [], 0
        for p in reversed(params):
            group.append(p)
            size += p.numel() * p.element_size()
            if size >= fusion_bytes:
                self.buckets.append(_Bucket(group, wire))
                group, size = [], 0
        if group:
            self.buckets.append(_Bucket(group, wire))
        self._where = {p: (b, i) for b in self.buckets for i, p in enumerate(b.params)}
        for p in params:
            p.register_post_accumulate_grad_hook(self._on_grad)
        self._next = 0

    def _on_grad(self, p: torch.Tensor) -> None:
        bucket, i = self._where[p]
        grad_view(bucket.wire, p, bucket.offsets[i]).copy_(p.grad)
        bucket.ready += 1
        self._launch_ready()

    def _launch_ready(self, force: bool = False) -> None:
        while self._next < len(self.buckets) and (force or self.buckets[self._next].ready == len(self.buckets[self._next].params)):
            b = self.buckets[self._next]
            if b.ready < len(b.params):  # parameters that got no gradient this step contribute zeros
                for q, off in zip(b.params, b.offsets):
                    if q.grad is None:
                        b.wire[off:off + q.numel()].zero_()
            b.wire.div_(self.world)  # average before the sum: keeps fp16 in range, exact for powers of two
            b.work = self.allreduce(b.wire, async_op=True)
            self._next += 1
            if self._next == len(self.buckets):
                self.last_ready = self.clock.mark()

    def finish(self) -> None:
        self._launch_ready(force=True)
        for b in self.buckets:
            if b.work is not None:
                b.work.wait()
            if b.wire is not b.flat:
                b.flat.copy_(b.wire)
            for p, off in zip(b.params, b.offsets):
                p.grad = grad_view(b.flat, p, off)  # the reduced gradient, no copy back
            b.ready, b.work = 0, None
        self._next = 0


class PSExchange(Exchange):
    """Parameter server (see the module docstring), sharded over every rank (``servers`` = 0) or held by
    ``servers`` dedicated ranks, the last ones, that compute nothing (``computes`` False) while the others train.
    Each server owns a contiguous slice of the flattened parameters and its optimizer state
    (``optimizer_factory(params)`` builds it over the slice); the model's own parameters are only ever written by
    pulls. Sharded: push = reduce-scatter, pull = all-gather. Dedicated: one reduce to and one broadcast from each
    server."""

    def __init__(self, model, optimizer_factory, clock, rank: int, world: int, max_staleness: int = 0,
                 servers: int = 0):
        self.params = [p for p in model.parameters() if p.requires_grad]
        total = sum(p.numel() for p in self.params)
        self.server_ranks = list(range(world - servers, world)) if servers else list(range(world))
        self.workers = world - servers
        self.shard = -(-total // len(self.server_ranks))
        self.max_staleness, self.dedicated = max_staleness, servers > 0
        self.slot = self.server_ranks.index(rank) if rank in self.server_ranks else None
        p0 = self.params[0]
        flat = torch.zeros(self.shard * len(self.server_ranks), dtype=p0.dtype, device=p0.device)
        flat[:total] = flat_params(self.params)
        self.owned = nn.Parameter(self._slice(flat, self.slot).clone()) if self.slot is not None else None
        self.flat_grad = torch.zeros_like(flat)
        self.pending: deque = deque()  # (works, gathered parameters), oldest first
        super().__init__(model, optimizer_factory([self.owned]) if self.owned is not None else None, clock)
        self.computes = rank < self.workers

    def _slice(self, flat: torch.Tensor, slot: int) -> torch.Tensor:
        return flat[slot * self.shard:(slot + 1) * self.shard]

    def zero_grad(self) -> None:
        for p in self.params:  # the optimizer only knows the owned slice
            p.grad = None
        if self.owned is not None:
            self.owned.grad = None

    def finish(self) -> None:
        # push: each server receives the sum of its slice of every worker's (pre-averaged) gradients
        off = 0
        for p in self.params:
            g = self.flat_grad[off:off + p.numel()]
            g.copy_(p.grad.reshape(-1)) if p.grad is not None and self.computes else g.zero_()
            off += p.numel()
        self.flat_grad.div_(self.workers)
        if not self.dedicated:
            grad = torch.empty_like(self.owned)
            reduce_scatter_flat(grad, self.flat_grad)
            self.owned.grad = grad
            return
        for slot, server in enumerate(self.server_ranks):
            dist.reduce(self._slice(self.flat_grad, slot), server)
        if self.owned is not None:
            self.owned.grad = self._slice(self.flat_grad, self.slot).clone()

    def update(self, scaler: Any = None) -> None:
        if self.optimizer is not None:
            self.optimizer.step()

    def pull(self) -> None:
        gathered = torch.empty_like(self.flat_grad)
        # from a copy: the next update may change the owned slice while this pull is in flight
        if not self.dedicated:
            works = [all_gather_flat(gathered, self.owned.detach().clone(), async_op=True)]
        else:
            if self.owned is not None:
                self._slice(gathered, self.slot).copy_(self.owned.detach())
            works = [dist.broadcast(self._slice(gathered, slot), server, async_op=True)
                     for slot, server in enumerate(self.server_ranks)]
        self.pending.append((works, gathered))
        while len(self.pending) > self.max_staleness:
            self._install(*self.pending.popleft())

    def _install(self, works: list, gathered: torch.Tensor) -> None:
        for work in works:
            work.wait()
        off = 0
        with torch.no_grad():
            for p in self.params:  # copy, not re-point: keeps each parameter's memory format
                p.copy_(gathered[off:off + p.numel()].view(p.shape))
                off += p.numel()

    def state_dict(self) -> dict:
        pending = []
        for works, gathered in self.pending:
            for work in works:
                work.wait()
            pending.append(gathered)
        self.pending = deque(([], g) for g in pending)
        return {"optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
                "owned": self.owned.detach().clone() if self.owned is not None else None, "pending": pending}

    def load_state_dict(self, state: dict) -> None:
        if self.owned is not None:
            with torch.no_grad():
                self.owned.copy_(state["owned"])
            self.optimizer.load_state_dict(state["optimizer"])
        self.pending = deque(([], g.to(self.flat_grad.device)) for g in state["pending"])


def schedule_allreduce(collective: str, world: int) -> Callable | None:
    """The collective of the allreduce mode: None (native ``dist.all_reduce``) or, for ``schedule[:ALGO]``,
    meshscale's schedule executor running algorithm ALGO (default ring). The executor is blocking, so a bucket
    is reduced when it is launched and the returned handle is None (overlap then comes only from the CPU
    running ahead of the device)."""
    if collective == "native":
        return None
    kind, _, algo = collective.partition(":")
    if kind != "schedule":
        raise MeshscaleError(f"unknown collective {collective!r}; choose native or schedule[:ALGO] (e.g. schedule:ring)")
    from meshscale.execute.schedule_runner import schedule_op
    ops: dict = {}

    def allreduce(tensor: torch.Tensor, async_op: bool = True) -> None:
        key = (tensor.numel(), tensor.dtype)
        if key not in ops:  # one plan per bucket size, built on first use
            op = schedule_op("all_reduce", list(range(world)), tensor.numel() * tensor.element_size(), algo or "ring",
                             elem_bytes=tensor.element_size())
            ops[key] = (op, torch.empty_like(tensor))
        op, out = ops[key]
        op(tensor, out)
        tensor.copy_(out)
        return None
    return allreduce


def make_exchange(mode: str, model: nn.Module, optimizer_factory: Callable, clock: Clock, rank: int, world: int,
                  device: torch.device, ddp: DdpOptions = DdpOptions(), allreduce: AllreduceOptions = AllreduceOptions(),
                  ps: PsOptions = PsOptions(), timing: bool = True) -> Exchange:
    """The exchange for ``mode`` (one of TRAIN_MODES) around ``model`` (on ``device``), with that mode's options."""
    check_choice(mode, TRAIN_MODES, "mode")
    check_choice(allreduce.compression, WIRE_DTYPES, "compression")
    if ps.max_staleness < 0:
        raise MeshscaleError(f"--max-staleness must be >= 0, got {ps.max_staleness}")
    if mode == "ddp":
        return DDPExchange(model, optimizer_factory(model.parameters()), clock, device, ddp.bucket_cap_mb,
                           ddp.bucket_view, ddp.static_graph, timing)
    if mode == "allreduce":
        return AllreduceExchange(model, optimizer_factory(model.parameters()), clock, world,
                                 int(allreduce.fusion_mb * (1 << 20)), allreduce.compression,
                                 schedule_allreduce(allreduce.collective, world))
    return PSExchange(model, optimizer_factory, clock, rank, world, ps.max_staleness if mode == "ps-async" else 0,
                      ps.servers)
