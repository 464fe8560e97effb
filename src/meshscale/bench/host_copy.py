"""Host <-> device copy bandwidth of one GPU: pinned and pageable host memory, both directions, each copy
timed with CUDA events over several iterations (what nvbandwidth calls host_to_device / device_to_host)."""
from __future__ import annotations

from typing import Any

from meshscale.errors import MeshscaleError
from meshscale.results import Result, measured

DIRECTIONS = ("host->device", "device->host")
MEMORIES = ("pinned", "pageable")


def host_copy(size_bytes: int = 256 << 20, iters: int = 10, warmup_iters: int = 2, device: int = 0) -> Result:
    """A "bench-host-copy" Result: one row per (direction, memory) with seconds per copy and bytes/s.
    Raises MeshscaleError (one line) where torch sees no CUDA GPU."""
    import torch

    if size_bytes < 1 or iters < 1 or warmup_iters < 0:
        raise MeshscaleError("host copies need a size >= 1 byte, iters >= 1 and warmup_iters >= 0")
    if not torch.cuda.is_available():
        raise MeshscaleError("host<->device copies need a CUDA GPU, and torch sees none")
    rows: list[dict[str, Any]] = []
    with torch.cuda.device(device):
        gpu = torch.empty(size_bytes, dtype=torch.uint8, device=device)
        for memory in MEMORIES:
            host = torch.ones(size_bytes, dtype=torch.uint8, pin_memory=memory == "pinned")
            for direction in DIRECTIONS:
                dst, src = (gpu, host) if direction == "host->device" else (host, gpu)
                seconds = seconds_per_copy(dst, src, iters, warmup_iters)
                rows.append({"direction": direction, "memory": memory, "size_bytes": size_bytes, "seconds": seconds,
                             "bandwidth_bytes_per_s": size_bytes / seconds})
            del host
    return measured("bench-host-copy", rows, device=f"cuda:{device}", gpu=torch.cuda.get_device_name(device),
                    iters=iters, warmup_iters=warmup_iters)


def seconds_per_copy(dst, src, iters: int, warmup_iters: int) -> float:
    """Mean seconds of ``dst.copy_(src)`` on the current stream. A pageable copy blocks the host while the
    driver stages it through its own pinned buffer; the events still bracket all of it on the stream."""
    import torch

    for _ in range(warmup_iters):
        dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        dst.copy_(src, non_blocking=True)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / iters
