"""``--impl nccl``: the collectives called straight into NCCL, the library torch itself loaded, the way
nccl-tests calls it — one C call per operation (a group of send/recv for all_to_all, gather, scatter and
send_recv, as nccl-tests does), on torch's current stream, through ctypes.

Why: torch.distributed's eager path costs about 20 us of Python and C++ bookkeeping per call (see
`benchmarks/small_message_paths.py`), which hides what the interconnect does with small messages. The
communicator is NCCL's own, created from a unique id passed through the launcher's store; processes and
rendezvous stay torch.distributed's. Buffers are the (inp, out) of `meshscale.bench.cases`.
"""
from __future__ import annotations

import ctypes
import glob
import os
import sys
from typing import Callable

import torch

from meshscale.errors import MeshscaleError

# nccl.h enums
NCCL_DTYPES = {torch.int32: 2, torch.float16: 6, torch.float32: 7, torch.bfloat16: 9}
NCCL_OPS = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
_P, _S, _I = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
_SIGNATURES = {
    "ncclAllReduce": [_P, _P, _S, _I, _I, _P, _P],
    "ncclBroadcast": [_P, _P, _S, _I, _I, _P, _P],
    "ncclReduce": [_P, _P, _S, _I, _I, _I, _P, _P],
    "ncclAllGather": [_P, _P, _S, _I, _P, _P],
    "ncclReduceScatter": [_P, _P, _S, _I, _I, _P, _P],
    "ncclSend": [_P, _S, _I, _I, _P, _P],
    "ncclRecv": [_P, _S, _I, _I, _P, _P],
    "ncclGroupStart": [],
    "ncclGroupEnd": [],
    "ncclCommDestroy": [_P],
}


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]  # NCCL_UNIQUE_ID_BYTES


def load_nccl() -> ctypes.CDLL:
    """The libnccl that torch loaded (found by soname among loaded libraries), else the pip wheel's copy."""
    candidates = ["libnccl.so.2"]
    for site in sys.path:
        candidates += sorted(glob.glob(os.path.join(site, "nvidia", "nccl", "lib", "libnccl.so*")))
    for name in candidates:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        for fn, argtypes in _SIGNATURES.items():
            getattr(lib, fn).argtypes = argtypes
            getattr(lib, fn).restype = _I
        lib.ncclGetErrorString.restype = ctypes.c_char_p
        lib.ncclGetErrorString.argtypes = [_I]
        lib.ncclGetUniqueId.argtypes = [ctypes.POINTER(_UniqueId)]
        lib.ncclCommInitRank.argtypes = [ctypes.POINTER(_P), _I, _UniqueId, _I]
        return lib
    raise MeshscaleError("--impl nccl needs NCCL's library (libnccl.so.2), which this torch does not load; "
                         "use --impl native")


class NcclComm:
    """One NCCL communicator over all ranks of the launch; ``op`` returns one collective call."""

    def __init__(self, rank: int, world: int, device: torch.device, store, key: str = "meshscale/nccl-uid"):
        self.lib, self.rank, self.world, self.device = load_nccl(), rank, world, device
        uid = _UniqueId()
        # the n-th communicator of every rank pairs with the n-th of the others: one id per generation, so a
        # second sweep in the same launch never reads the first one's id
        key = f"{key}/{store.add(f'{key}/made-by/{rank}', 1)}"
        if rank == 0:
            self._check(self.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
            store.set(key, ctypes.string_at(ctypes.addressof(uid), ctypes.sizeof(uid)))
        else:  # the id is raw bytes with NULs: copy it whole (a c_char field would stop at the first NUL)
            ctypes.memmove(ctypes.addressof(uid), store.get(key), ctypes.sizeof(uid))  # blocks up to the store's timeout
        self.comm = ctypes.c_void_p()
        with torch.cuda.device(device):
            self._check(self.lib.ncclCommInitRank(ctypes.byref(self.comm), world, uid, rank), "ncclCommInitRank")

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            raise MeshscaleError(f"{what} failed on rank {self.rank}: {self.lib.ncclGetErrorString(code).decode()}")

    def close(self) -> None:
        if self.comm:
            self.lib.ncclCommDestroy(self.comm)
            self.comm = ctypes.c_void_p()

    def op(self, collective: str, op: str, root: int) -> Callable[[torch.Tensor, torch.Tensor], None]:
        """A callable (inp, out) -> None that enqueues ``collective`` on the current stream, as nccl-tests'
        ``runColl`` does: pointers and counts are read once per buffer pair, not per call."""
        lib, comm, rank, world = self.lib, self.comm, self.rank, self.world
        stream_of = torch._C._cuda_getCurrentRawStream  # a plain int: what the CUDA graph capture stream is too
        dev, red = self.device.index, NCCL_OPS[op]
        cache: dict = {}

        def args(inp: torch.Tensor, out: torch.Tensor):
            key = (inp.data_ptr(), out.data_ptr())
            if key not in cache:
                dtype = NCCL_DTYPES.get(out.dtype if out.numel() else inp.dtype)
                if dtype is None:
                    raise MeshscaleError(f"--impl nccl has no NCCL type for {out.dtype}")
                cache.clear()
                cache[key] = (inp.data_ptr(), out.data_ptr(), inp.numel(), out.numel(), dtype,
                              max(inp.element_size(), out.element_size()))
            return cache[key]

        def call(code: int) -> None:
            if code != 0:
                self._check(code, collective)

        if collective == "all_reduce":
            def run(inp, out):
                i, o, n, _, t, _ = args(inp, out)
                call(lib.ncclAllReduce(i, o, n, t, red, comm, stream_of(dev)))
        elif collective == "broadcast":
            def run(inp, out):
                i, o, n, _, t, _ = args(inp, out)
                call(lib.ncclBroadcast(i, o, n, t, root, comm, stream_of(dev)))
        elif collective == "reduce":
            def run(inp, out):
                i, o, n, _, t, _ = args(inp, out)
                call(lib.ncclReduce(i, o, n, t, red, root, comm, stream_of(dev)))
        elif collective == "all_gather":
            def run(inp, out):
                i, o, n, _, t, _ = args(inp, out)
                call(lib.ncclAllGather(i, o, n, t, comm, stream_of(dev)))
        elif collective == "reduce_scatter":
            def run(inp, out):
                i, o, _, n, t, _ = args(inp, out)
                call(lib.ncclReduceScatter(i, o, n, t, red, comm, stream_of(dev)))
        elif collective in ("all_to_all", "gather", "scatter", "send_recv"):
            pairs = _peer_pattern(collective, rank, world, root)
            group_start, group_end = lib.ncclGroupStart, lib.ncclGroupEnd
            plans: dict = {}

            def plan(inp, out):
                """The group's (function, arguments without the stream), built once per buffer pair."""
                key = (inp.data_ptr(), out.data_ptr())
                if key not in plans:
                    i, o, ni, no, t, esize = args(inp, out)
                    chunk = (no if collective in ("scatter", "send_recv") else ni) // (world if collective == "all_to_all" else 1)
                    steps = []
                    for peer, send_at, recv_at in pairs:
                        if send_at is not None:
                            steps.append((lib.ncclSend, (_P(i + send_at * chunk * esize), _S(chunk), _I(t), _I(peer), comm)))
                        if recv_at is not None:
                            steps.append((lib.ncclRecv, (_P(o + recv_at * chunk * esize), _S(chunk), _I(t), _I(peer), comm)))
                    plans.clear()
                    plans[key] = steps
                return plans[key]

            def run(inp, out):
                steps, s = plan(inp, out), _P(stream_of(dev))
                code = group_start()
                for fn, fn_args in steps:
                    code = code or fn(*fn_args, s)
                call(code or group_end())
        else:
            raise MeshscaleError(f"--impl nccl has no call for {collective}")
        return run


def _peer_pattern(collective: str, rank: int, world: int, root: int) -> list[tuple[int, int | None, int | None]]:
    """(peer, chunk index sent from inp or None, chunk index received into out or None) per peer, as
    nccl-tests' alltoall / gather / scatter / sendrecv groups them."""
    if collective == "all_to_all":
        return [(p, p, p) for p in range(world)]
    if collective == "gather":
        if rank == root:
            return [(p, 0 if p == root else None, p) for p in range(world)]
        return [(root, 0, None)]
    if collective == "scatter":
        if rank == root:
            return [(p, p, 0 if p == root else None) for p in range(world)]
        return [(root, None, 0)]
    if collective == "send_recv":
        if world == 1:
            return [(0, 0, 0)]
        return [((rank + 1) % world, 0, None), ((rank - 1) % world, None, 0)]
    raise MeshscaleError(f"no peer pattern for {collective}")
