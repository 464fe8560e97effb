"""Timing of one operation on one rank, and the reduction of per-rank times the nccl-tests way.

GPU: CUDA events on a non-blocking stream of the timer's own around ``iters`` back-to-back ops (optionally
replayed from one CUDA graph). CPU: a barrier, then the wall clock around ``iters`` blocking ops. Each rank gets
its own time per op; `reduce_times` turns them into the one reported figure.

nccl-tests' ``-a/--average`` (src/common.cu): 0 = rank 0's time, 1 = the mean over ranks (its default),
2 = the minimum, 3 = the maximum. meshscale uses the same codes and the same default (1), so its figures compare
with published nccl-tests tables; ``--average 3`` reports the slowest rank (an operation is over only when its
last rank is done).
"""
from __future__ import annotations

import math
import time
from typing import Callable

import torch
import torch.distributed as dist

from meshscale.errors import MeshscaleError
from meshscale.execute.torch_collectives import all_gather_flat

AVERAGE_MODES = {0: "rank 0", 1: "mean over ranks", 2: "fastest rank", 3: "slowest rank"}
_REDUCE = {0: lambda t: t[0], 1: lambda t: sum(t) / len(t), 2: min, 3: max}


def check_average(average: int) -> int:
    """Validate an --average code."""
    if average not in AVERAGE_MODES:
        raise MeshscaleError(f"--average {average} is not a mode; use 0 (rank 0), 1 (mean, default), 2 (min) or 3 (max)")
    return average


def reduce_times(times_s: list[float], average: int) -> float:
    """One time from the per-rank times (index = rank), by nccl-tests' --average code (see `check_average`)."""
    return _REDUCE[check_average(average)](times_s)


def iteration_stats(times_s: list[float], skip: int = 0) -> dict[str, float]:
    """nccl-tests' per-iteration summary (``-I 1``; `computeIterStats` in its src/util.cu, 2.19.6) of ``times_s``,
    the first ``skip`` left out (``-K``): min, max, mean, p50 (the upper middle), p95 and p99 (nearest rank, so p99
    is the max below 100 samples), the population standard deviation and the coefficient of variation in percent."""
    xs = sorted(times_s[skip:])
    n = len(xs)
    if not n:
        raise MeshscaleError(f"--per-iter-skip {skip} leaves none of the {len(times_s)} iterations")

    def nearest(percent: int) -> float:
        return xs[min(n - 1, (n * percent + 99) // 100 - 1)]
    mean = sum(xs) / n
    stdev = math.sqrt(sum((x - mean) ** 2 for x in xs) / n)
    return {"iter_min_s": xs[0], "iter_max_s": xs[-1], "iter_mean_s": mean, "iter_p50_s": xs[n // 2],
            "iter_p95_s": nearest(95), "iter_p99_s": nearest(99), "iter_stdev_s": stdev,
            "iter_cv_pct": 100 * stdev / mean if mean > 0 else 0.0}


def per_iteration(rank_times_s: list[list[float]], skip: int = 0) -> dict:
    """Each rank's per-iteration times (row r = rank r's) as nccl-tests reports them: an iteration's time is its
    slowest rank's (the max over processes, one rank each here), summarised by `iteration_stats`; every rank's own
    times kept (nccl-tests' JSON ``per_process_max_times_us``, which its straggler finder reads)."""
    slowest = [max(times) for times in zip(*rank_times_s)]
    return {"iter_times_s": slowest, "rank_iter_times_s": [list(t) for t in rank_times_s], "iter_skip": skip,
            **iteration_stats(slowest, skip)}


def time_op(run: Callable[[], None], device: torch.device, barrier: Callable[[], None], warmup_iters: int,
            iters: int, cuda_graph: bool = False, iter_seconds: list[float] | None = None,
            cpu_time: bool = False) -> float:
    """Seconds per call of ``run`` on this rank: ``warmup_iters`` untimed calls, then ``iters`` timed ones (on a
    GPU back-to-back with the warm-up, so they are timed in steady state). Given a list, ``iter_seconds`` also
    receives each timed call's own seconds (a CUDA event between calls on a GPU). ``cpu_time``: on a GPU, the
    host's clock from the first timed launch to the last call's completion instead of the GPU's events."""
    if device.type == "cuda":
        return _time_cuda(run, barrier, warmup_iters, iters, cuda_graph, iter_seconds, cpu_time)
    for _ in range(warmup_iters):
        run()
    barrier()  # start together, so the slowest rank's time includes no waiting for late starters
    marks = [time.perf_counter()]
    for _ in range(iters):
        run()  # Gloo collectives block until done
        if iter_seconds is not None:
            marks.append(time.perf_counter())
    if iter_seconds is None:
        marks.append(time.perf_counter())
    else:
        iter_seconds.extend(b - a for a, b in zip(marks, marks[1:]))
    return (marks[-1] - marks[0]) / iters


def _time_cuda(run: Callable[[], None], barrier: Callable[[], None], warmup_iters: int, iters: int,
               cuda_graph: bool, iter_seconds: list[float] | None, cpu_time: bool = False) -> float:
    # Everything runs on a stream of its own, as in nccl-tests (cudaStreamNonBlocking): the legacy default stream
    # synchronizes with every other stream of the device (on the 2x H200, the difference was within run-to-run noise).
    caller = torch.cuda.current_stream()
    stream = torch.cuda.Stream()
    stream.wait_stream(caller)  # the inputs were written on the caller's stream
    with torch.cuda.stream(stream):
        seconds = _time_on_current_stream(run, barrier, warmup_iters, iters, cuda_graph, iter_seconds, cpu_time)
    caller.wait_stream(stream)
    return seconds


def _time_on_current_stream(run: Callable[[], None], barrier: Callable[[], None], warmup_iters: int, iters: int,
                            cuda_graph: bool, iter_seconds: list[float] | None, cpu_time: bool = False) -> float:
    if cuda_graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up outside the graph (NCCL sets up its buffers on first use)
            for _ in range(max(1, warmup_iters)):
                run()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()  # no NCCL work of the warm-up may still be in flight when capture starts
        # One operation per graph, replayed once per iteration: the host pays one graph launch per op, as a C
        # launch loop like nccl-tests pays one kernel launch, instead of torch's per-call Python/c10d path.
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
        step, lead_in = graph.replay, max(1, warmup_iters)  # the first replay uploads the graph: never timed
    else:
        step, lead_in = run, warmup_iters
    torch.cuda.synchronize()
    barrier()
    # Whatever the slower rank does between the host barrier and its first call would be timed too, spread over
    # only nccl-tests' 20 calls. A one-element all-reduce on this stream lines the GPUs up, and the warm-up calls
    # follow it with no host sync, so that time is spent on untimed calls and the timed ones start in the steady
    # state of back-to-back calls.
    if dist.is_initialized():
        dist.all_reduce(torch.zeros(1, device=torch.cuda.current_device()))
    for _ in range(lead_in):
        step()
    # one event between calls when each call is timed: the GPU does not wait on it, but each record costs the host
    # about 10 us, which shows where the host sets the pace (small sizes; docs/bench.md)
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1 if iter_seconds is not None else 2)]
    marks[0].record()
    host_start_s = time.perf_counter()
    for i in range(1, iters + 1):
        step()
        if iter_seconds is not None:
            marks[i].record()
    if iter_seconds is None:
        marks[-1].record()
    marks[-1].synchronize()
    host_s = time.perf_counter() - host_start_s
    if iter_seconds is not None:
        iter_seconds.extend(a.elapsed_time(b) / 1e3 for a, b in zip(marks, marks[1:]))
    return (host_s if cpu_time else marks[0].elapsed_time(marks[-1]) / 1e3) / iters


def all_ranks(values: list[float], device: torch.device) -> list[list[float]]:
    """Every rank's ``values`` (same length on all), on every rank: row r = rank r's."""
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    every = torch.empty(dist.get_world_size() * len(values), dtype=torch.float64, device=device)
    all_gather_flat(every, mine)
    return every.view(dist.get_world_size(), len(values)).tolist()
