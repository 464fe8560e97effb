"""Per-call time of a small ncclAllReduce in one torch process, launched from Python (meshscale's --impl nccl:
one ctypes call per op) and from a C loop called once (benchmarks/experiments/nccl_loop_lib.c), on the same communicator and
stream, 20 and 200 back-to-back calls after 20 warm-up calls, median of 15 timings, mean over ranks.
    torchrun --nproc-per-node 2 benchmarks/experiments/python_vs_c_launch.py /tmp/libnccl_loop.so"""
import ctypes
import os
import statistics
import sys

import torch
import torch.distributed as dist

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
from meshscale.bench.nccl_direct import NcclComm  # noqa: E402  (run with PYTHONPATH=src)
comm = NcclComm(rank, world, torch.device("cuda", rank), dist.distributed_c10d._get_default_store())
loop = ctypes.CDLL(sys.argv[1]).allreduce_loop
loop.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
stream = torch.cuda.Stream()
torch.cuda.set_stream(stream)
t = torch.ones(256, device="cuda")
run = comm.op("all_reduce", "sum", 0)
ways = {"python, one ctypes call per op": lambda n: [run(t, t) for _ in range(n)],
        "C loop, one ctypes call in all": lambda n: loop(t.data_ptr(), t.data_ptr(), t.numel(), comm.comm, stream.cuda_stream, n)}
for iters in (20, 200):
    for name, way in ways.items():
        samples = []
        for _ in range(15):
            torch.cuda.synchronize()
            dist.barrier()
            dist.all_reduce(torch.zeros(1, device="cuda"))
            way(20)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            way(iters)
            end.record()
            end.synchronize()
            us = torch.tensor([start.elapsed_time(end) * 1e3 / iters], device="cuda")
            dist.all_reduce(us)
            samples.append(us.item() / world)
        if rank == 0:
            print(f"1 KiB all_reduce, {iters:>3} calls, {name}: median {statistics.median(samples):6.2f} us "
                  f"(min {min(samples):.2f}, max {max(samples):.2f})")
torch.cuda.synchronize()
comm.close()
dist.destroy_process_group()
