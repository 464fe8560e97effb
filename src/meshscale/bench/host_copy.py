"""Host <-> device copy bandwidth of one GPU, pinned and pageable host memory, both directions, by nvbandwidth's
method (its host_to_device_memcpy_ce / device_to_host_memcpy_ce): a 512 MiB buffer, 16 copies between two CUDA
events on a stream of their own, the stream held by a spin kernel until every copy is queued (so the host's
queueing is not timed), the host thread on the GPU's own CPUs, and the median of 3 such samples."""
from __future__ import annotations

import os
import statistics
from contextlib import contextmanager
from typing import Any, Iterator

from meshscale.errors import MeshscaleError
from meshscale.results import Result, measured
from meshscale.units import is_digits

DIRECTIONS = ("host->device", "device->host")
MEMORIES = ("pinned", "pageable")
# nvbandwidth's defaults (common.h: defaultBufferSize 512 MiB, defaultLoopCount 16, defaultAverageLoopCount 3)
BUFFER_BYTES, COPIES_PER_SAMPLE, SAMPLES = 512 << 20, 16, 3
SPIN_CYCLES = 20_000_000  # about 10 ms at GPU clocks: longer than queueing 16 copies takes the host
METHOD = ("nvbandwidth's: copies between CUDA events on their own stream, queued behind a spin kernel, the host "
          "thread on the GPU's CPUs; the median sample")


def host_copy(size_bytes: int = BUFFER_BYTES, iters: int = COPIES_PER_SAMPLE, warmup_iters: int = 2, device: int = 0,
              samples: int = SAMPLES, cpus: list[int] | None = None) -> Result:
    """A "bench-host-copy" Result: one row per (direction, memory) with the median sample's seconds per copy and
    bytes/s, and every sample's rate. ``cpus``: the GPU's local CPUs, where the host thread runs meanwhile.
    Raises MeshscaleError (one line) where torch sees no CUDA GPU."""
    import torch

    if size_bytes < 1 or iters < 1 or warmup_iters < 0 or samples < 1:
        raise MeshscaleError("host copies need a size >= 1 byte, iters >= 1, samples >= 1 and warmup_iters >= 0")
    if not torch.cuda.is_available():
        raise MeshscaleError("host<->device copies need a CUDA GPU, and torch sees none")
    rows: list[dict[str, Any]] = []
    with torch.cuda.device(device), _on_cpus(cpus):
        gpu = torch.empty(size_bytes, dtype=torch.uint8, device=device)
        stream = torch.cuda.Stream()
        for memory in MEMORIES:
            host = torch.ones(size_bytes, dtype=torch.uint8, pin_memory=memory == "pinned")
            for direction in DIRECTIONS:
                dst, src = (gpu, host) if direction == "host->device" else (host, gpu)
                times = [seconds_per_copy(dst, src, iters, warmup_iters if k == 0 else 0, stream)
                         for k in range(samples)]
                seconds = statistics.median(times)
                rows.append({"direction": direction, "memory": memory, "size_bytes": size_bytes, "seconds": seconds,
                             "bandwidth_bytes_per_s": size_bytes / seconds,
                             "sample_bytes_per_s": [size_bytes / t for t in times]})
            del host
    return measured("bench-host-copy", rows, device=f"cuda:{device}", gpu=torch.cuda.get_device_name(device),
                    iters=iters, warmup_iters=warmup_iters, samples=samples, method=METHOD,
                    cpus=cpu_text(cpus) if cpus else None)


def seconds_per_copy(dst, src, iters: int, warmup_iters: int, stream=None) -> float:
    """Seconds per ``dst.copy_(src)`` over ``iters`` copies on ``stream`` (default: the current one). A pageable
    copy blocks the host while the driver stages it through its own pinned buffer; the events still bracket all of
    it on the stream."""
    import torch

    stream = stream if stream is not None else torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        for _ in range(warmup_iters):
            dst.copy_(src, non_blocking=True)
        stream.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        spin = getattr(torch.cuda, "_sleep", None)
        if spin is not None:  # hold the stream while the copies are queued, as nvbandwidth's spin kernel does
            spin(SPIN_CYCLES)
        start.record()
        for _ in range(iters):
            dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def parse_cpu_list(text: str | None) -> list[int]:
    """'0-51,104-155' (nvidia-smi's CPU affinity) as CPU numbers; [] for an empty or unreadable list."""
    cpus: list[int] = []
    for part in (text or "").split(","):
        lo, _, hi = part.strip().partition("-")
        if not is_digits(lo) or hi and not is_digits(hi):
            return []
        cpus += list(range(int(lo), int(hi or lo) + 1))
    return cpus


def cpu_text(cpus: list[int]) -> str:
    from meshscale.topology.nvml_discovery import cpu_list
    return cpu_list(cpus)


@contextmanager
def _on_cpus(cpus: list[int] | None) -> Iterator[None]:
    """Run the block on ``cpus`` (those this process may use), then restore the process's CPUs."""
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    wanted = set(cpus or []) & allowed
    if not wanted:
        yield
        return
    os.sched_setaffinity(0, wanted)
    try:
        yield
    finally:
        os.sched_setaffinity(0, allowed)
