"""`meshscale bench collective`: nccl-tests style size sweeps of torch.distributed (or meshscale) collectives,
with a correctness check of every size and the topology's bound beside every busbw.

One launch runs the whole sweep: every rank walks the same (collective, size, place) list, names each step
with ``ctx.phase`` (so a failure says which operation), times it (`harness.time_op`), checks it, and the
per-rank times and wrong counts are gathered so that every rank returns the same rows.
"""
from __future__ import annotations

import contextlib
import json
import threading
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from meshscale.bench.cases import (ALLTOALLV_ALIGN_BYTES, ALLTOALLV_SPREAD, DTYPE_LABELS, DTYPES, OPS, Case,
                                  count_wrong, largest_value, make_case)
from meshscale.bench.harness import all_ranks, check_average, per_iteration, reduce_times, time_op
from meshscale.bench.impl import IMPLS, meshscale_op, native_op
from meshscale.execute.world_topology import joined_topology, world_topology
from meshscale.execute.world import World
from meshscale.collectives.kinds import NAMES, kind
from meshscale.collectives.rows import median_over_cycles
from meshscale.errors import MeshscaleError, check_choice
from meshscale.execute import Interrupted, RankContext, launch
from meshscale.results import Result, measured
from meshscale.safe_io import release_scratch, scratch_file
from meshscale.simulate.cost import Call
from meshscale.simulate.fabric import Fabric
from meshscale.topology import Topology, to_dict
from meshscale.units import format_bytes


FIRST_OP_WARMUP = 50


@dataclass(kw_only=True)
class CollectiveSpec:
    """What to measure; sizes in bytes as nccl-tests counts them (see `meshscale.collectives.kinds`)."""

    collectives: list[str] = field(default_factory=lambda: ["all_reduce"])
    sizes_bytes: list[int] = field(default_factory=lambda: [1 << 10])
    dtypes: tuple[str, ...] = ("float32",)  # each a sweep of its own, as nccl-tests' -d all runs them
    ops: tuple[str, ...] = ("sum",)  # each a sweep of the reducing collectives (nccl-tests' -o all)
    root: int = 0
    places: tuple[str, ...] = ("out", "in")
    warmup_iters: int = 5
    iters: int = 20
    average: int = 1  # nccl-tests' default: the mean over ranks
    check: bool = True
    cuda_graph: bool = False
    impl: str = "native"
    algo: str | None = None
    per_iter: bool = False  # also time each call (nccl-tests' -I 1): its summary columns beside the mean
    per_iter_skip: int = 0  # leading calls the per-iteration summary leaves out (nccl-tests' -K)
    cycles: int = 1  # the whole sweep this many times (nccl-tests' -N); each size reports the median cycle
    blocking: bool = False  # wait for each call and pass a barrier before the next (nccl-tests' -z)
    cpu_time: bool = False  # the host's time from the first timed launch to the last completion (nccl-tests' -C)
    register: int = 0  # 1: the buffers from NCCL's allocator, registered with the communicator (nccl-tests' -R 1)
    spread: float = ALLTOALLV_SPREAD  # all_to_allv: even (0) to distance-weighted (1) blocks (NCCL_TESTS_ALLTOALLV_SPREAD)


def parse_collectives(names: list[str]) -> list[str]:
    """Canonical collective names; 'all' means every one."""
    if not names or any(n.lower() == "all" for n in names):
        return list(NAMES)
    try:
        return [kind(n).name for n in names]
    except MeshscaleError as unknown:
        raise MeshscaleError(f"{unknown} (or 'all')") from None


def parse_dtypes(text: str) -> tuple[str, ...]:
    """``-d``: a type by nccl-tests' name (float, half, bfloat16, double, int32, int64, uint8) or torch's
    (float32, float16, float64), several with commas, or all."""
    if text.strip().lower() == "all":
        return tuple(DTYPES)
    by_label = {label: name for name, label in DTYPE_LABELS.items()}
    names = [by_label.get(t.strip(), t.strip()) for t in text.split(",") if t.strip()]
    for name in names:
        check_choice(name, {**DTYPES, **{label: None for label in by_label}, "all": None}, "dtype")
    return tuple(dict.fromkeys(names))


def parse_ops(text: str) -> tuple[str, ...]:
    """``-o``: sum, prod, min, max, avg, several with commas, or all (nccl-tests' names)."""
    if text.strip().lower() == "all":
        return OPS
    names = [t.strip() for t in text.split(",") if t.strip()]
    for name in names:
        check_choice(name, (*OPS, "all"), "reduction op")
    return tuple(dict.fromkeys(names))


def runnable_ops(spec: CollectiveSpec, backend: str) -> tuple[str, ...]:
    """The ops the sweep runs: ``-o all`` on CPU workers leaves out avg, which Gloo cannot do."""
    ops = tuple(op for op in spec.ops if not (op == "avg" and backend == "gloo" and len(spec.ops) > 1))
    return ops or spec.ops


def validate(spec: CollectiveSpec, world: World) -> None:
    """Reject anything that cannot run, with one line that says how to fix it."""
    if not spec.dtypes or not spec.ops:
        raise MeshscaleError("give at least one --dtype and one --op")
    for dtype in spec.dtypes:
        check_choice(dtype, DTYPES, "dtype")
    for op in spec.ops:
        check_choice(op, OPS, "reduction op")
    if spec.impl not in IMPLS:
        raise MeshscaleError(f"unknown --impl {spec.impl!r}; use native, meshscale or nccl")
    if spec.impl == "nccl" and world.backend != "nccl":
        raise MeshscaleError("--impl nccl calls NCCL directly and needs GPUs; use --impl native with CPU workers")
    check_average(spec.average)
    if spec.iters < 1 or spec.warmup_iters < 0 or spec.cycles < 1:
        raise MeshscaleError("--iters and --cycles must be >= 1 and --warmup-iters >= 0")
    if "avg" in runnable_ops(spec, world.backend) and world.backend == "gloo" and any(kind(c).reducing for c in spec.collectives):
        # Gloo rejects ReduceOp.AVG up to torch 2.7 at least, and int32 even in 2.13: refuse it everywhere
        raise MeshscaleError("--op avg needs NCCL (GPUs); Gloo does not average: use --op sum with --cpus")
    if spec.cuda_graph and spec.blocking:
        raise MeshscaleError("--blocking waits and passes a barrier after each call, which a CUDA graph cannot hold; "
                             "drop one of --blocking and --cuda-graph")
    if spec.cuda_graph and world.backend != "nccl":
        raise MeshscaleError("--cuda-graph needs GPUs (NCCL); drop it for CPU workers")
    if not 0 <= spec.root < world.size:
        raise MeshscaleError(f"--root {spec.root} is not a rank; use 0..{world.size - 1}")
    _check_nccl_tests_options(spec, world)
    reducing = any(kind(c).reducing for c in spec.collectives)
    for dtype in (d for d in spec.dtypes if reducing and not DTYPES[d].is_floating_point):
        for op in runnable_ops(spec, world.backend):
            if largest_value(op, world.size) > torch.iinfo(DTYPES[dtype]).max:
                raise MeshscaleError(f"--dtype {DTYPE_LABELS[dtype]} --op {op} over {world.size} ranks overflows "
                                     f"the checked values; use a wider type (int32) or fewer ranks")
    for c in spec.collectives:
        for dtype in spec.dtypes:
            _check_sizes(spec, world, c, dtype)


def _check_nccl_tests_options(spec: CollectiveSpec, world: World) -> None:
    """nccl-tests 2.19's -I/-K, -R and alltoallv, where torch.distributed can do them; one line where not."""
    if spec.per_iter_skip and not spec.per_iter:
        raise MeshscaleError("--per-iter-skip (-K) leaves out calls of the per-iteration summary; give -I 1 with it")
    if spec.per_iter and not 0 <= spec.per_iter_skip < spec.iters:
        raise MeshscaleError(f"--per-iter-skip {spec.per_iter_skip}: give 0..{spec.iters - 1} (fewer than --iters)")
    if spec.register == 2:
        raise MeshscaleError("-R 2 (NCCL symmetric windows, ncclCommWindowRegister) has no torch.distributed call for "
                             "its collectives' buffers in torch 2.11-2.13; -R 1 registers them locally (ncclCommRegister)")
    if spec.register and (world.backend != "nccl" or spec.impl != "native"):
        raise MeshscaleError("-R 1 registers the buffers with torch's NCCL communicator (ProcessGroupNCCL."
                             "register_mem_pool): it needs GPUs and --impl native" + (
                                 "; CPU workers' Gloo has no buffers to register" if world.backend != "nccl" else ""))
    variable = [c for c in spec.collectives if kind(c).variable]
    if variable and spec.impl != "native":
        raise MeshscaleError(f"{variable[0]} runs as torch.distributed's all_to_all_single with split sizes; use "
                             "--impl native (or leave it out of the list)")
    if not 0 <= spec.spread <= 1:
        raise MeshscaleError(f"--spread {spec.spread}: give 0 (even blocks) to 1 (distance-weighted, the default)")
    if spec.spread != ALLTOALLV_SPREAD and not variable:
        raise MeshscaleError("--spread shapes all_to_allv's blocks; add all_to_allv to the collectives or drop it")


def _check_sizes(spec: CollectiveSpec, world: World, c: str, dtype: str) -> None:
    """Every size of the sweep splits into whole ``dtype`` elements (per rank where ``c`` is segmented)."""
    elem = DTYPES[dtype].itemsize
    k = kind(c)
    if world.size < k.min_ranks:
        raise MeshscaleError(f"{c} needs at least {k.min_ranks} ranks; use --cpus {k.min_ranks} or --gpus {k.min_ranks}")
    if not set(spec.places) & set(k.places):
        raise MeshscaleError(f"{c} runs only {'in-place' if k.places == ('in',) else 'out-of-place'} in "
                             f"torch.distributed; use --place both or --place {k.places[0]}")
    if k.variable:  # nccl-tests aligns each block to 16 bytes: a rank's share of each peer must hold one
        for size in (x for x in spec.sizes_bytes if x // world.size < ALLTOALLV_ALIGN_BYTES):
            raise MeshscaleError(f"size {size} B leaves less than {ALLTOALLV_ALIGN_BYTES} B per peer for {c} over "
                                 f"{world.size} ranks; use sizes of at least {ALLTOALLV_ALIGN_BYTES * world.size} B")
        return
    unit = elem * (world.size if k.segmented else 1)
    for size in spec.sizes_bytes:
        if size % unit:
            what = f"{world.size} ranks x {elem}-byte {dtype}" if k.segmented else f"{elem}-byte {dtype}"
            raise MeshscaleError(f"size {size} B does not split into {what} elements for {c}; "
                                 f"use sizes that are multiples of {unit} B (e.g. --min-bytes {unit})")



def rank_sweep(ctx: RankContext, spec: CollectiveSpec, topology: Topology | None = None,
               row_log: str | None = None) -> list[dict[str, Any]]:
    """The whole sweep on one rank; returns the rows (identical on every rank). ``topology`` (of the ranks'
    devices, rank i on device i) feeds topology-aware meshscale algorithms. Rank 0 appends each finished row to
    the JSON-lines file ``row_log`` as it goes, so the launcher can show it at once and keep it on Ctrl-C."""
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    n, rows = ctx.world_size, []
    comm = None
    if spec.impl == "nccl":
        from meshscale.bench.nccl_direct import NcclComm
        ctx.phase("creating the NCCL communicator for --impl nccl")
        comm = NcclComm(ctx.rank, n, ctx.device, ctx.store)
    # torch creates its NCCL communicator at its first collective: let that be this barrier, not the one
    # before the first timed loop (its setup threads slowed that loop 2x: all_reduce 1 KiB 31 us instead of 15)
    ctx.barrier()
    try:
        for cycle in range(spec.cycles):
            _sweep(ctx, spec, topology, comm, rows, row_log if ctx.rank == 0 else None, cycle)
    finally:
        if comm is not None:
            torch.cuda.synchronize()
            comm.close()
    return rows


def series(spec: CollectiveSpec, backend: str) -> list[tuple[str, str, str]]:
    """(collective, dtype, op) of each sweep over the sizes, in nccl-tests' order: per collective, every type,
    and for a reducing collective every op (one op, unused, for the others)."""
    ops = runnable_ops(spec, backend)
    return [(c, d, o) for c in spec.collectives for d in spec.dtypes for o in (ops if kind(c).reducing else ops[:1])]


def _sweep(ctx: RankContext, spec: CollectiveSpec, topology: Topology | None, comm, rows: list,
           row_log: str | None, cycle: int) -> None:
    for collective, dtype, op in series(spec, ctx.backend):
        k = kind(collective)
        for size in spec.sizes_bytes:
            for place in (p for p in ("out", "in") if p in spec.places and p in k.places):
                ctx.phase(f"{collective} {format_bytes(size)} {'in-place' if place == 'in' else 'out-of-place'}")
                row = _measure_one(ctx, spec, topology, comm, (collective, size, dtype, op, place == "in"), not rows)
                rows.append(dict(row, cycle=cycle))
                if row_log:
                    with open(row_log, "a") as log:
                        log.write(json.dumps(rows[-1]) + "\n")


def _measure_one(ctx: RankContext, spec: CollectiveSpec, topology: Topology | None, comm, what: tuple,
                 first: bool) -> dict[str, Any]:
    """One (collective, size, dtype, op, in place) timed and checked on every rank; its row (the same on all)."""
    collective, size, dtype, op, inplace = what
    n, k, elem = ctx.world_size, kind(collective), DTYPES[dtype].itemsize
    with _registered(ctx, spec.register) as buffers:
        with buffers():
            case = make_case(collective, size, dtype, op, spec.root, inplace, ctx.rank, n, ctx.device, spec.spread)
        run_op = _operation(ctx, spec, topology, comm, collective, size, op, elem, case)
        case.reset()
        # the sweep's first op also pays the fresh communicator's connection setup: more warm-up
        warmup = max(spec.warmup_iters, FIRST_OP_WARMUP) if first and ctx.device.type == "cuda" else spec.warmup_iters
        each = [] if spec.per_iter else None
        t = time_op(_blocking(lambda: run_op(case.inp, case.out), ctx) if spec.blocking
                    else lambda: run_op(case.inp, case.out), ctx.device, ctx.barrier, warmup, spec.iters,
                    spec.cuda_graph, each, spec.cpu_time)
        wrong = -1
        if spec.check:  # a fresh run on fresh inputs: the timed loop overwrote in-place buffers
            case.reset()
            run_op(case.inp, case.out)
            wrong = count_wrong(case, op, n)
        per_rank = all_ranks([t, wrong, *(each or ())], ctx.device)
    time_s = reduce_times([r[0] for r in per_rank], spec.average)
    size_bytes = case.size_bytes if k.variable else size  # all_to_allv: the bytes its aligned blocks hold
    algbw, busbw = k.algbw_busbw(size_bytes, time_s, n)
    row = {"collective": collective, "size_bytes": size_bytes,
           "count": case.count if k.variable else k.count(size, n, elem), "dtype": dtype,
           "redop": op if k.reducing else "none", "root": spec.root if k.rooted else -1, "inplace": inplace,
           "time_s": time_s, "algbw_bytes_per_s": algbw, "busbw_bytes_per_s": busbw,
           "wrong": int(sum(r[1] for r in per_rank)) if spec.check else None, "rank_times_s": [r[0] for r in per_rank]}
    if each:  # every call of every rank: nccl-tests' -I summary of the slowest rank's calls
        row.update(per_iteration([r[2:] for r in per_rank], spec.per_iter_skip))
    return row


def _operation(ctx: RankContext, spec: CollectiveSpec, topology: Topology | None, comm, collective: str, size: int,
               op: str, elem: int, case: Case) -> Callable[[Any, Any], None]:
    """The call that runs ``collective`` once on ``case``'s buffers, by ``spec.impl``."""
    n = ctx.world_size
    if spec.impl == "native":
        splits = (case.send_counts, case.recv_counts) if case.send_counts is not None else None
        return native_op(collective, op, spec.root, ctx.rank, n, splits)
    if spec.impl == "nccl":
        return comm.op(collective, op, spec.root)
    return meshscale_op(collective, list(range(n)), size, spec.algo, elem, op, spec.root, topology)


@contextlib.contextmanager
def _registered(ctx: RankContext, register: int) -> Iterator[Callable[[], Any]]:
    """``-R 1`` as torch.distributed does user buffer registration: the buffers made inside ``buffers()`` come
    from NCCL's allocator (ncclMemAlloc, ProcessGroupNCCL's mem_allocator) in a pool of their own and are
    registered with the communicator (ncclCommRegister, register_mem_pool) as ``buffers()`` ends, before the size
    is timed; deregistered when this ends, as nccl-tests registers its buffers. ``register`` 0: nothing changes."""
    if not register:
        yield contextlib.nullcontext
        return
    import torch.distributed as dist
    backend = dist.distributed_c10d._get_default_group()._get_backend(ctx.device)
    pool = torch.cuda.MemPool(backend.mem_allocator)
    registered = []

    @contextlib.contextmanager
    def buffers() -> Iterator[None]:
        with torch.cuda.use_mem_pool(pool):
            yield
        backend.register_mem_pool(pool)
        registered.append(pool)
    try:
        yield buffers
    finally:
        if registered:
            torch.cuda.synchronize()
            backend.deregister_mem_pool(pool)


def _blocking(run: Callable[[], None], ctx: RankContext) -> Callable[[], None]:
    """``run``, then wait for it on the device and meet the other ranks (nccl-tests' -z 1)."""
    def step() -> None:
        run()
        if ctx.device.type == "cuda":
            torch.cuda.current_stream().synchronize()
        ctx.barrier()
    return step


class SweepInterrupted(Interrupted):
    """Ctrl-C or SIGTERM stopped the sweep; ``result`` holds the rows finished before it (meta: interrupted)."""

    def __init__(self, message: str, result: Result):
        super().__init__(message)
        self.result = result


def bench_collectives(spec: CollectiveSpec, world: World, timeout_s: float = 120.0,
                      on_row: Callable[[dict], None] | None = None) -> Result:
    """Run the sweep on ``world`` and return a "bench-collective" Result (rows with the bound and the predicted
    time of each, the topology). Under torchrun across hosts the ranks gather the hosts' topologies first.

    ``on_row(row)`` sees each row as soon as the ranks have measured it. On Ctrl-C or SIGTERM this raises
    `SweepInterrupted`, whose result keeps the rows finished so far."""
    validate(spec, world)
    topology = world_topology(world)
    row_log = str(scratch_file("rows", ".jsonl"))  # removed below, at exit, on SIGTERM, or by the next run
    follower = _RowFollower(row_log, on_row)
    follower.start()
    try:
        rows, joined = launch(_measure, world.size, (spec, world, topology, row_log), backend=world.backend,
                              timeout_s=timeout_s)[0]
    except (Interrupted, KeyboardInterrupt) as stop:
        follower.finish()
        message = str(stop) if isinstance(stop, Interrupted) else "interrupted (Ctrl-C)"
        raise SweepInterrupted(message, _result(spec, world, topology, follower.rows, interrupted=True)) from None
    finally:
        follower.finish()
        release_scratch(Path(row_log))
    return _result(spec, world, joined or topology, rows)


def _result(spec: CollectiveSpec, world: World, topology: Topology | None, rows: list[dict],
            interrupted: bool = False) -> Result:
    """The "bench-collective" Result of ``rows`` (the median over cycles), each given the topology's bound and
    predicted figures."""
    rows = median_over_cycles(rows, world.size)
    bounds, predictions = _model_figures(topology, spec, world.size)
    for row in rows:
        row["bound_busbw_bytes_per_s"] = bounds.get(row["collective"])
        predicted = predictions.get((row["collective"], row["size_bytes"]))
        row["predicted_time_s"] = predicted.time_s if predicted else None
        row["predicted_busbw_bytes_per_s"] = predicted.busbw_bytes_per_s if predicted else None
    extra = {"interrupted": True} if interrupted else {}
    return measured("bench-collective", rows, spec=asdict(spec), world_size=world.size, backend=world.backend,
                    average=spec.average, topology=to_dict(topology) if topology else None,
                    hosts=topology.attrs.get("hosts") if topology else None, **extra)


class _RowFollower(threading.Thread):
    """Reads the rows rank 0 appends to ``path`` while the sweep runs, hands each to ``on_row`` and keeps them."""

    def __init__(self, path: str, on_row: Callable[[dict], None] | None):
        super().__init__(daemon=True, name="meshscale-row-follower")
        self.path, self.on_row, self.rows = path, on_row, []
        self._done = threading.Event()
        self._offset = 0

    def run(self) -> None:
        while not self._done.wait(0.1):
            self._read()

    def finish(self) -> None:
        """Stop following and read what is left (idempotent)."""
        if not self._done.is_set():
            self._done.set()
            self.join()
            self._read()

    def _read(self) -> None:
        with open(self.path) as log:
            log.seek(self._offset)
            text = log.read()
        complete = text[:text.rfind("\n") + 1]  # a line still being written waits for the next read
        self._offset += len(complete.encode())
        for line in complete.splitlines():
            self.rows.append(json.loads(line))
            if self.on_row:
                self.on_row(self.rows[-1])


def _measure(ctx: RankContext, spec: CollectiveSpec, world: World, topology: Topology | None, row_log: str):
    """One rank's sweep, and the joined topology of the hosts when the ranks span several (else None)."""
    joined = joined_topology(world, ctx, topology)
    return rank_sweep(ctx, spec, topology or joined, row_log), joined


def _model_figures(topology, spec: CollectiveSpec, world_size: int) -> tuple[dict, dict]:
    """The busbw bound of each collective and NCCL's predicted result (`Fabric.cost`) of each (collective, size),
    where the topology is known and there are 2 ranks or more; a collective the model cannot price goes without
    its prediction (the measurement stands)."""
    from meshscale.collectives.bounds import busbw_bound
    if topology is None or world_size < 2:
        return {}, {}
    fabric = Fabric(topology)
    ranks = topology.device_indices()
    priced = [c for c in spec.collectives if not kind(c).variable]  # all_to_allv: no bound, no cost model
    bounds = {c: busbw_bound(topology, c, ranks, spec.root) for c in priced}
    predictions = {}
    for c in priced:
        for size in spec.sizes_bytes:
            try:
                predictions[(c, size)] = fabric.cost(Call(c, size, tuple(ranks), spec.root))
            except MeshscaleError:
                continue
    return bounds, predictions


def any_wrong(result: Result) -> bool:
    """True when any row found a wrong element (the command then exits 1)."""
    return any(row.get("wrong") for row in result.rows)
