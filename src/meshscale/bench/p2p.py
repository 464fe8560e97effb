"""`meshscale bench p2p`: copy bandwidth and latency between every pair of devices, like nvbandwidth and
CUDA's p2pBandwidthLatencyTest.

GPUs: one process drives all GPUs. ``unidirectional`` = `dst.copy_(src)` from GPU i to GPU j (peer-to-peer when
the pair supports it), timed with CUDA events; ``bidirectional`` = both directions at once, reported as the
sum of the two (as p2pBandwidthLatencyTest does); ``staged`` = GPU i -> pinned host memory -> GPU j, for
contrast; host<->device rows have src or dst "host"; ``latency`` = median time of many small copies.
CPU workers: the same matrices between worker processes over Gloo send/recv; the pairs take turns while the
other ranks wait at a barrier.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

from meshscale.execute.world_topology import joined_topology, world_topology
from meshscale.execute.world import World
from meshscale.errors import MeshscaleError
from meshscale.execute import RankContext, launch
from meshscale.results import Result, measured

BANDWIDTH_MODES = ("unidirectional", "bidirectional", "staged")
P2P_MODES = (*BANDWIDTH_MODES, "latency")


@dataclass
class P2PSpec:
    """What to measure: copies of ``size_bytes``, ``iters`` timed after ``warmup_iters``; latency from the median
    of ``latency_iters`` copies of ``latency_bytes``."""

    size_bytes: int = 64 << 20
    iters: int = 10
    warmup_iters: int = 2
    latency_bytes: int = 4
    latency_iters: int = 100


def check_spec(spec: P2PSpec) -> None:
    """One-line errors for sizes and counts that cannot work."""
    if spec.size_bytes < 4 or spec.latency_bytes < 4:
        raise MeshscaleError("p2p sizes must be at least 4 bytes; use e.g. --size 64M")
    if spec.iters < 1 or spec.latency_iters < 1 or spec.warmup_iters < 0:
        raise MeshscaleError("--iters and --latency-iters must be >= 1, --warmup-iters >= 0")


def bench_p2p(spec: P2PSpec, world: World, timeout_s: float = 120.0) -> Result:
    """Measure every pair of the world's devices; a "bench-p2p" Result with one row per (src, dst, mode)."""
    check_spec(spec)
    if world.size < 2 and world.backend == "gloo":
        raise MeshscaleError("p2p needs at least 2 CPU workers; use --cpus 2 or more")
    topology = world_topology(world)
    if world.backend == "nccl":
        rows, devices = gpu_rows(spec, world.size), [f"gpu{i}" for i in range(world.size)]
    else:
        rows, joined = launch(_cpu_measure, world.size, (spec, world, topology), backend="gloo", timeout_s=timeout_s)[0]
        devices = [f"worker{i}" for i in range(world.size)]
        topology = topology or joined
    from meshscale.topology import to_dict
    modes = [m for m in P2P_MODES if any(r["mode"] == m for r in rows)]
    return measured("bench-p2p", rows, spec=asdict(spec), devices=devices, modes=modes, backend=world.backend,
                    world_size=world.size, topology=to_dict(topology) if topology else None)


def _row(src: str, dst: str, mode: str, size_bytes: int, bandwidth: float | None = None,
         latency: float | None = None) -> dict[str, Any]:
    return {"src": src, "dst": dst, "mode": mode, "size_bytes": size_bytes, "bandwidth_bytes_per_s": bandwidth,
            "latency_s": latency}


# ---- GPUs: one process, all devices --------------------------------------------------------------------
def gpu_rows(spec: P2PSpec, n: int) -> list[dict[str, Any]]:
    """All matrices for GPUs 0..n-1 of this process."""
    count = spec.size_bytes
    send = [torch.ones(count, dtype=torch.uint8, device=i) for i in range(n)]
    recv = [torch.empty(count, dtype=torch.uint8, device=i) for i in range(n)]
    streams = [torch.cuda.Stream(device=i) for i in range(n)]
    idle = [torch.cuda.Stream(device=i) for i in range(n)]  # see _copy
    host = torch.empty(count, dtype=torch.uint8, pin_memory=True)
    rows = []
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            t = _time_gpu([(recv[j], send[i], streams[i], idle[j])], spec)
            rows.append(_row(f"gpu{i}", f"gpu{j}", "unidirectional", count, count / t))
            rows.append(_row(f"gpu{i}", f"gpu{j}", "staged", count, count / _time_staged(send[i], host, recv[j], spec)))
            small = _latency_gpu(recv[j][: spec.latency_bytes], send[i][: spec.latency_bytes], streams[i], idle[j], spec)
            rows.append(_row(f"gpu{i}", f"gpu{j}", "latency", spec.latency_bytes, latency=small))
            if i < j:  # both directions at once; the same figure for (i, j) and (j, i)
                t = _time_gpu([(recv[j], send[i], streams[i], idle[j]), (recv[i], send[j], streams[j], idle[i])], spec)
                rows += [_row(f"gpu{a}", f"gpu{b}", "bidirectional", count, 2 * count / t) for a, b in ((i, j), (j, i))]
    for i in range(n):  # host <-> device through pinned memory, on a stream of that GPU
        rows.append(_row("host", f"gpu{i}", "unidirectional", count, count / _time_gpu([(recv[i], host, streams[i], None)], spec)))
        rows.append(_row(f"gpu{i}", "host", "unidirectional", count, count / _time_gpu([(host, send[i], streams[i], None)], spec)))
    return rows


def _copy(dst: torch.Tensor, src: torch.Tensor, stream: torch.cuda.Stream, dst_idle: torch.cuda.Stream | None) -> None:
    """dst.copy_(src) issued on ``stream``. A copy between GPUs also orders itself after the destination's
    current stream; making that an idle stream keeps the two directions of a bidirectional test apart."""
    with torch.cuda.stream(stream):
        if dst_idle is None:
            dst.copy_(src, non_blocking=True)
        else:
            with torch.cuda.stream(dst_idle):
                dst.copy_(src, non_blocking=True)


def _time_gpu(copies: list[tuple], spec: P2PSpec) -> float:
    """Seconds per iteration of running all ``copies`` (dst, src, stream, dst_idle) at once: the slowest stream."""
    for _ in range(spec.warmup_iters):
        for c in copies:
            _copy(*c)
    _sync_all()
    events = []
    for dst, src, stream, idle in copies:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        events.append((start, end, stream))
    for _ in range(spec.iters):
        for c in copies:
            _copy(*c)
    for start, end, stream in events:
        end.record(stream)
    _sync_all()
    return max(start.elapsed_time(end) for start, end, _ in events) / 1e3 / spec.iters


def _sync_all() -> None:
    for d in range(torch.cuda.device_count()):
        torch.cuda.synchronize(d)


def _time_staged(src: torch.Tensor, host: torch.Tensor, dst: torch.Tensor, spec: P2PSpec) -> float:
    """Seconds per copy GPU -> pinned host -> GPU, one after the other (wall clock: two devices are involved)."""
    def once() -> None:
        host.copy_(src)  # blocking both ways: one copy after the other through the one host buffer
        dst.copy_(host)
    for _ in range(spec.warmup_iters):
        once()
    torch.cuda.synchronize(dst.device)
    start = time.perf_counter()
    for _ in range(spec.iters):
        once()
    torch.cuda.synchronize(dst.device)
    return (time.perf_counter() - start) / spec.iters


def _latency_gpu(dst: torch.Tensor, src: torch.Tensor, stream, idle, spec: P2PSpec) -> float:
    """Median seconds of one small copy, each timed by its own pair of events."""
    pairs = []
    for k in range(spec.warmup_iters + spec.latency_iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        _copy(dst, src, stream, idle)
        end.record(stream)
        if k >= spec.warmup_iters:
            pairs.append((start, end))
    pairs[-1][1].synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in pairs) / 1e3


# ---- CPU workers: Gloo send/recv, one pair at a time -----------------------------------------------------
def _cpu_measure(ctx: RankContext, spec: P2PSpec, world: World, topology):
    """One rank's pairs, and the joined topology of the hosts when the ranks span several (else None)."""
    return cpu_rank(ctx, spec), joined_topology(world, ctx, topology)


def cpu_rank(ctx: RankContext, spec: P2PSpec) -> list[dict[str, Any]]:
    """Every ordered pair in turn (the others wait at a barrier); returns all rows on every rank."""
    n, me = ctx.world_size, ctx.rank
    send = torch.ones(spec.size_bytes, dtype=torch.uint8)
    recv = torch.empty(spec.size_bytes, dtype=torch.uint8)
    tick = torch.zeros(max(1, spec.latency_bytes), dtype=torch.uint8)
    rows = []
    for a in range(n):
        for b in range(n):
            if a == b:
                continue
            ctx.phase(f"p2p worker{a} -> worker{b}")
            ctx.barrier()
            if me not in (a, b):
                continue
            other = b if me == a else a
            t = _time_cpu(lambda: dist.send(send, b) if me == a else dist.recv(recv, a), me == a, other, spec)
            lat = _latency_cpu(tick, me == a, other, spec)
            if me == a:
                rows.append(_row(f"worker{a}", f"worker{b}", "unidirectional", spec.size_bytes, spec.size_bytes / t))
                rows.append(_row(f"worker{a}", f"worker{b}", "latency", spec.latency_bytes, latency=lat))
            if a < b:
                def both() -> None:
                    for req in (dist.isend(send, other), dist.irecv(recv, other)):
                        req.wait()
                t = _time_cpu(both, me == a, other, spec)
                if me == a:
                    rows += [_row(f"worker{x}", f"worker{y}", "bidirectional", spec.size_bytes, 2 * spec.size_bytes / t)
                             for x, y in ((a, b), (b, a))]
    ctx.phase("p2p gathering results")
    every: list = [None] * n
    dist.all_gather_object(every, rows)
    merged = [r for part in every for r in part]
    order = {m: k for k, m in enumerate(P2P_MODES)}
    return sorted(merged, key=lambda r: (order[r["mode"]], r["src"], r["dst"]))


def _time_cpu(step, timer: bool, other: int, spec: P2PSpec) -> float:
    """Seconds per ``step`` on the timing rank: it waits for a one-byte acknowledgement of the last one."""
    ack = torch.zeros(1, dtype=torch.uint8)
    for _ in range(spec.warmup_iters):
        step()
    dist.send(ack, other) if timer else dist.recv(ack, other)  # line up before the clock starts
    start = time.perf_counter()
    for _ in range(spec.iters):
        step()
    dist.recv(ack, other) if timer else dist.send(ack, other)
    return (time.perf_counter() - start) / spec.iters


def _latency_cpu(tick: torch.Tensor, first: bool, other: int, spec: P2PSpec) -> float:
    """Median one-way time of a small message: half of each ping-pong round trip."""
    times = []
    for k in range(spec.warmup_iters + spec.latency_iters):
        start = time.perf_counter()
        if first:
            dist.send(tick, other)
            dist.recv(tick, other)
        else:
            dist.recv(tick, other)
            dist.send(tick, other)
        if k >= spec.warmup_iters:
            times.append((time.perf_counter() - start) / 2)
    return statistics.median(times)
