"""How far apart a host barrier releases the ranks, and what that does to a 20-iteration timed loop (nccl-tests'
-n 20) of small ncclAllReduce / all_to_all calls (ctypes, meshscale's --impl nccl): started after dist.barrier alone,
and after dist.barrier plus a one-element all-reduce on the timing stream (meshscale's harness). Same host clock for
all ranks (one machine), so the release skew is a difference of CLOCK_MONOTONIC readings.
    torchrun --nproc-per-node 2 benchmarks/experiments/start_skew.py"""
import os
import statistics
import time

import torch
import torch.distributed as dist

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
from meshscale.bench.nccl_direct import NcclComm  # noqa: E402  (run with PYTHONPATH=src)
comm = NcclComm(rank, world, torch.device("cuda", rank), dist.distributed_c10d._get_default_store())
stream = torch.cuda.Stream()
torch.cuda.set_stream(stream)


def gathered(value: float) -> list[float]:
    t = torch.tensor([value], dtype=torch.float64, device="cuda")
    out = torch.empty(world, dtype=torch.float64, device="cuda")
    dist.all_gather_into_tensor(out, t)
    return out.tolist()


skews = []
for _ in range(50):
    torch.cuda.synchronize()
    dist.barrier()
    released = time.clock_gettime_ns(time.CLOCK_MONOTONIC) / 1e3
    stamps = gathered(released)
    skews.append(max(stamps) - min(stamps))
if rank == 0:
    print(f"dist.barrier release skew over 50 barriers: median {statistics.median(skews):.1f} us, "
          f"max {max(skews):.1f} us")

for name in ("all_reduce", "all_to_all"):
    run = comm.op(name, "sum", 0)
    inp, out = torch.ones(256, device="cuda"), torch.empty(256, device="cuda")
    for align in (False, True):
        per_op = []
        for _ in range(15):
            for _ in range(5):
                run(inp, out)
            torch.cuda.synchronize()
            dist.barrier()
            if align:
                dist.all_reduce(torch.zeros(1, device="cuda"))
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                run(inp, out)
            end.record()
            end.synchronize()
            per_op.append(statistics.mean(gathered(start.elapsed_time(end) * 1e3 / 20)))
        if rank == 0:
            print(f"1 KiB {name:<10} 20 iterations after {'barrier + device all-reduce' if align else 'barrier only':<28}"
                  f" median of 15 {statistics.median(per_op):6.2f} us (min {min(per_op):.2f}, max {max(per_op):.2f})")
torch.cuda.synchronize()
comm.close()
dist.destroy_process_group()
