"""``--impl nccl``: the collectives called straight into NCCL, the library torch itself loaded, the way
nccl-tests calls it — one C call per operation on torch's current stream, through ctypes. send_recv is a group
of ncclSend/ncclRecv as in nccl-tests; so are all_to_all, gather and scatter with a library older than NCCL 2.28
(from 2.28 they are ncclAlltoAll, ncclGather and ncclScatter: the same transfers, one call).

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

from meshscale.collectives.kinds import CollectiveKind, direct_peers, kind
from meshscale.errors import MeshscaleError

# nccl.h enums
NCCL_DTYPES = {torch.uint8: 1, torch.int32: 2, torch.int64: 4, torch.float16: 6, torch.float32: 7, torch.float64: 8,
               torch.bfloat16: 9}  # ncclDataType_t
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


def launch_handle(lib: ctypes.CDLL) -> ctypes.CDLL:
    """A second handle on ``lib`` whose functions have no ``argtypes``: a call then converts nothing, which
    saves about a microsecond per call; every argument must therefore already be a ctypes object."""
    return ctypes.CDLL(lib._name)


class NcclComm:
    """One NCCL communicator over all ranks of the launch; ``op`` returns one collective call."""

    def __init__(self, rank: int, world: int, device: torch.device, store, key: str = "meshscale/nccl-uid"):
        self.lib, self.rank, self.world, self.device = load_nccl(), rank, world, device
        # the launch path: the same library through a handle without argtypes, called with ctypes objects only
        self.fast = launch_handle(self.lib)
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
        ``runColl`` does: one C call, or one group of ncclSend/ncclRecv.

        Python's share of a call is kept to a tuple lookup and the C calls themselves: the calls' arguments are
        built once per buffer pair as ctypes objects and passed to functions without ``argtypes`` (whose
        per-call conversion costs about a microsecond per call), and the stream object is made once per stream.
        """
        k = kind(collective)
        if k.nccl_function is None and k.reducing:
            raise MeshscaleError(f"--impl nccl has no call for {collective}")
        fast = self.fast
        stream_of, dev = torch._C._cuda_getCurrentRawStream, self.device.index  # an int: the capture stream too
        streams: dict[int, ctypes.c_void_p] = {}
        plans: dict = {}

        def plan(inp: torch.Tensor, out: torch.Tensor) -> list[tuple[Callable, tuple]]:
            """The calls (function, arguments without the stream), built once per buffer pair."""
            key = (inp.data_ptr(), out.data_ptr())
            steps = plans.get(key)
            if steps is None:
                plans.clear()
                steps = plans[key] = self._calls(k, op, root, inp, out)
            return steps

        def run(inp: torch.Tensor, out: torch.Tensor) -> None:
            steps, raw = plan(inp, out), stream_of(dev)
            stream = streams.get(raw)
            if stream is None:
                stream = streams[raw] = _P(raw)
            if len(steps) == 1:
                fn, args = steps[0]
                code = fn(*args, stream)
            else:
                code = fast.ncclGroupStart()
                for fn, args in steps:
                    code = code or fn(*args, stream)
                code = code or fast.ncclGroupEnd()
            if code != 0:
                self._check(code, collective)
        return run

    def _calls(self, k: CollectiveKind, op: str, root: int, inp: torch.Tensor, out: torch.Tensor) -> list[tuple[Callable, tuple]]:
        """(function, ctypes arguments up to the stream) of each C call collective ``k`` makes on (inp, out).
        NCCL's collective calls all take (sendbuff, recvbuff, count, datatype, [op,] [root,] comm, stream),
        count being nccl-tests' (one unit: a rank's segment, or the whole buffer)."""
        fast, comm, world = self.fast, self.comm, self.world
        dtype = NCCL_DTYPES.get(out.dtype if out.numel() else inp.dtype)
        if dtype is None:
            raise MeshscaleError(f"--impl nccl has no NCCL type for {out.dtype}")
        i, o, t = inp.data_ptr(), out.data_ptr(), _I(dtype)
        count = k.unit_elems(self.rank, world, root, inp.numel(), out.numel())
        single = self.single_call(k)
        if single is not None:
            extra = ((_I(NCCL_OPS[op]),) if k.reducing else ()) + ((_I(root),) if k.rooted else ())
            return [(single, (_P(i), _P(o), _S(count), t, *extra, comm))]
        esize = max(inp.element_size(), out.element_size())
        steps = []
        for peer, send_at, recv_at in direct_peers(k, self.rank, world, root):
            if send_at is not None:
                steps.append((fast.ncclSend, (_P(i + send_at * count * esize), _S(count), t, _I(peer), comm)))
            if recv_at is not None:
                steps.append((fast.ncclRecv, (_P(o + recv_at * count * esize), _S(count), t, _I(peer), comm)))
        return steps

    def single_call(self, k: CollectiveKind) -> Callable | None:
        """NCCL's one entry point for collective ``k``, or None where it is a group of ncclSend/ncclRecv
        (send_recv always; all_to_all, gather and scatter before NCCL 2.28, which added ncclAlltoAll, ncclGather
        and ncclScatter). One C call instead of a group of 2 + 2 x ranks also costs Python one call, not many."""
        try:
            return getattr(self.fast, k.nccl_function) if k.nccl_function else None
        except AttributeError:  # an older library without the symbol
            return None
