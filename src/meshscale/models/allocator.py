"""Device memory outside the model's own tensors: how PyTorch's CUDA caching allocator rounds what it is asked
for, what the CUDA context and NCCL hold outside it. Torch-free: the rules as PyTorch's and NCCL's sources
state them (docs/references.md, "Memory").

The caching allocator (c10/cuda/CUDACachingAllocator.cpp, expandable segments off, PyTorch's default):
- every request is rounded up to a multiple of 512 bytes (`round_size`): ``memory_allocated`` counts these
  blocks, not the bytes asked for;
- a block comes from a segment obtained with cudaMalloc (``memory_reserved`` counts the segments): a request of
  at most 1 MiB from a 2 MiB segment of the small pool, one below 10 MiB from a 20 MiB segment of the large
  pool, a larger one from a segment of its own size rounded up to 2 MiB (`get_allocation_size`);
- freed blocks stay cached in the pool of the stream that allocated them and are reused only by that stream;
  a cached block larger than a request is split (large pool: when more than 1 MiB would remain), and only a
  segment with no block in use can be returned to the driver (empty_cache, or a cudaMalloc that failed: the
  allocator then frees its cached segments and retries before raising out-of-memory).

Outside the allocator: the CUDA context (the driver's per-process state and the kernels of the libraries
loaded, CUDA 12's lazy loading keeping it to about half a GiB), and NCCL's buffers, allocated by NCCL itself
per communicator: for each channel and each peer it connects to, one buffer per protocol (LL 512 KiB, LL128
about 4.7 MiB, Simple NCCL_BUFFSIZE = 4 MiB), and with NVLink SHARP (NVLS) a multicast buffer per channel for
each GPU of the node.
"""
from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20
GIB = 1 << 30

# c10/cuda/CUDACachingAllocator.cpp (c10/core/AllocatorConfig.h in later releases)
ALLOCATOR_MIN_BLOCK_BYTES = 512              # kMinBlockSize: every block a multiple of it
ALLOCATOR_SMALL_REQUEST_BYTES = 1 * MIB      # kSmallSize: the largest request served from the small pool
ALLOCATOR_SMALL_SEGMENT_BYTES = 2 * MIB      # kSmallBuffer: the small pool's segments
ALLOCATOR_LARGE_SEGMENT_BYTES = 20 * MIB     # kLargeBuffer: segments for requests of 1 to 10 MiB
ALLOCATOR_MIN_LARGE_ALLOC_BYTES = 10 * MIB   # kMinLargeAlloc: from here a request gets a segment of its own
ALLOCATOR_ROUND_LARGE_BYTES = 2 * MIB        # kRoundLarge: those segments are rounded up to it

# The CUDA context with PyTorch's kernels loaded lazily (CUDA_MODULE_LOADING=LAZY, CUDA 12's default): about
# 500-600 MiB on Hopper, what nvidia-smi shows for a process that has allocated no tensor; the upper end taken.
CUDA_CONTEXT_BYTES = 600 * MIB
# cuBLAS's workspace, allocated through the caching allocator once per stream that runs matmuls: on Hopper
# (sm_90) 4096 KiB x 8 (aten/src/ATen/cuda/CublasHandlePool.cpp, CUBLAS_WORKSPACE_CONFIG's default there).
CUBLAS_WORKSPACE_BYTES = 32 * MIB

# NCCL src/init.cc: DEFAULT_LL_BUFFSIZE (8 lines x 512 threads x 8 steps x 16 B), DEFAULT_LL128_BUFFSIZE
# (120 elements x 640 threads x 8 steps x 8 B), DEFAULT_BUFFSIZE (NCCL_BUFFSIZE, 4 MiB)
NCCL_LL_BUFFER_BYTES = 8 * 512 * 8 * 16
NCCL_LL128_BUFFER_BYTES = 120 * 640 * 8 * 8
NCCL_SIMPLE_BUFFER_BYTES = 4 * MIB
NCCL_CONNECTION_BYTES = NCCL_LL_BUFFER_BYTES + NCCL_LL128_BUFFER_BYTES + NCCL_SIMPLE_BUFFER_BYTES
NCCL_NVLS_ALIGN_BYTES = 2 * MIB   # NVLS_MEM_ALIGN_SIZE, beside each NVLS buffer (src/transport/nvls.cc)
# channels NCCL opens on an NVLink node when the collective model gives none (H100/H200: 16 for 2-8 GPUs)
DEFAULT_NCCL_CHANNELS = 16


def allocator_block_bytes(request_bytes: int) -> int:
    """The block the caching allocator hands out for a request (`round_size`): a multiple of 512 bytes, at
    least 512. ``memory_allocated`` counts these."""
    if request_bytes < ALLOCATOR_MIN_BLOCK_BYTES:
        return ALLOCATOR_MIN_BLOCK_BYTES
    return -(-request_bytes // ALLOCATOR_MIN_BLOCK_BYTES) * ALLOCATOR_MIN_BLOCK_BYTES


def allocator_segment_bytes(request_bytes: int) -> int:
    """The segment cudaMalloc'ed when no cached block can serve a request (`get_allocation_size` of the
    rounded block): 2 MiB for the small pool, 20 MiB below 10 MiB, else the block rounded up to 2 MiB."""
    block = allocator_block_bytes(request_bytes)
    if block <= ALLOCATOR_SMALL_REQUEST_BYTES:
        return ALLOCATOR_SMALL_SEGMENT_BYTES
    if block < ALLOCATOR_MIN_LARGE_ALLOC_BYTES:
        return ALLOCATOR_LARGE_SEGMENT_BYTES
    return -(-block // ALLOCATOR_ROUND_LARGE_BYTES) * ALLOCATOR_ROUND_LARGE_BYTES


def blocks_bytes(tensor_bytes: float, tensors: int = 1) -> float:
    """``tensors`` equal tensors of ``tensor_bytes`` each, as the allocator counts them."""
    return tensors * allocator_block_bytes(max(1, int(round(tensor_bytes)))) if tensors and tensor_bytes > 0 else 0.0


@dataclass(frozen=True)
class Communicator:
    """One NCCL communicator a rank belongs to: its ``ranks``, the ``channels`` NCCL runs it on, the peers each
    channel connects to (``connections``: 1 for a ring, 2 with a tree beside it, 1 per peer for point-to-point)
    and, with NVLS on, the GPUs of the node it spans (``nvls_gpus``; 0: off)."""

    name: str
    ranks: int
    channels: int = DEFAULT_NCCL_CHANNELS
    connections: int = 1
    nvls_gpus: int = 0


def nccl_buffer_bytes(communicators: tuple[Communicator, ...] | list[Communicator]) -> float:
    """Device memory NCCL allocates for ``communicators`` (outside PyTorch's allocator): per channel and
    connection one buffer per protocol; with NVLS, nChannels x 2 x (Simple buffer + its alignment) for each GPU
    of the node (NCCL src/transport/nvls.cc: nvlsPerRankSize x nHeads)."""
    total = 0.0
    for c in communicators:
        if c.ranks < 2:
            continue
        total += c.channels * c.connections * NCCL_CONNECTION_BYTES
        if c.nvls_gpus > 1:
            total += c.channels * 2 * (NCCL_SIMPLE_BUFFER_BYTES + NCCL_NVLS_ALIGN_BYTES) * c.nvls_gpus
    return total
