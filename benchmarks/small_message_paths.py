"""Per-call cost of small NCCL operations through several paths, timed like nccl-tests (CUDA events around
`iters` back-to-back calls, mean over ranks): dist.all_reduce, the ProcessGroup backend called directly (no Python
wrapper checks), dist.all_reduce(async_op=True) with the handles waited at the end, and ncclAllReduce and
all_to_all (ncclAlltoAll from NCCL 2.28, else a group of ncclSend/ncclRecv) called directly through ctypes
(meshscale's --impl nccl; "argtypes" is the same all-reduce with ctypes converting Python ints on every call).
Every path runs twice: on the legacy default stream and on a non-blocking stream of its own (nccl-tests').
    torchrun --nproc-per-node 2 benchmarks/small_message_paths.py"""
import os

import torch
import torch.distributed as dist

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
backend = dist.group.WORLD._get_backend(torch.device("cuda"))
opts = dist.AllreduceOptions()
opts.reduceOp = dist.ReduceOp.SUM
store = dist.distributed_c10d._get_default_store()
from meshscale.bench.nccl_direct import NcclComm  # noqa: E402  (run with PYTHONPATH=src)
comm = NcclComm(rank, world, torch.device("cuda", rank), store)


def paths(t, out):
    return {"dist.all_reduce": lambda: dist.all_reduce(t),
            "backend.allreduce": lambda: backend.allreduce([t], opts),
            "async_op=True": lambda: dist.all_reduce(t, async_op=True),
            "ncclAllReduce (argtypes)": lambda: comm.lib.ncclAllReduce(t.data_ptr(), t.data_ptr(), t.numel(), 7, 0,
                                                                       comm.comm, torch._C._cuda_getCurrentRawStream(rank)),
            "ncclAllReduce (ctypes)": (lambda run: lambda: run(t, t))(comm.op("all_reduce", "sum", 0)),
            "all_to_all (ctypes)": (lambda run: lambda: run(t, out))(comm.op("all_to_all", "sum", 0))}


def per_call_us(call) -> float:
    for _ in range(20):
        call()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    works = [call() for _ in range(200)]
    end.record()
    for w in works:
        if hasattr(w, "wait"):  # dist handles; the ctypes paths return an NCCL code
            w.wait()
    end.synchronize()
    us = torch.tensor([start.elapsed_time(end) * 1e3 / 200], device="cuda")
    dist.all_reduce(us)
    return us.item() / world


own = torch.cuda.Stream()
for size in (1024, 16384, 262144, 1048576):
    t, out = torch.ones(size // 4, device="cuda"), torch.empty(size // 4, device="cuda")
    for name, call in paths(t, out).items():
        legacy = per_call_us(call)
        own.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(own):
            separate = per_call_us(call)
        torch.cuda.current_stream().wait_stream(own)
        if rank == 0:
            print(f"{size:>8} B  {name:<26} default stream {legacy:7.2f} us   own stream {separate:7.2f} us")
torch.cuda.synchronize()
comm.close()
dist.destroy_process_group()
