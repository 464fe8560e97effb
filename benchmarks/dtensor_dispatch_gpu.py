"""The host's time per op on DTensors against plain tensors on this machine, beside the step model's allowances
(kernels.DTENSOR_HOST_SECONDS_PER_OP, HOST_SECONDS_PER_OP). As PyTorch's own
test/distributed/tensor/test_dtensor_dispatch_overhead.py times it: each op called REPEAT times in a row, the
median (the first call's sharding propagation excluded), here for the ops a tensor-parallel linear decomposes
into and for a foreach op over a list of DTensors. One process, a one-rank mesh (NCCL on a GPU, Gloo on CPU): the
dispatch is host work, the same on one rank as on four. It measures; nothing in the model is sized on it.

    PYTHONPATH=src python benchmarks/dtensor_dispatch_gpu.py            # GPU if there is one, else CPU
    PYTHONPATH=src python benchmarks/dtensor_dispatch_gpu.py --cpu      # dry run
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from meshscale.predict.training.kernels import DTENSOR_HOST_SECONDS_PER_OP, HOST_SECONDS_PER_OP

REPEAT = 200


def per_call_us(fn, sync) -> float:
    """Median host time of one call of ``fn`` (the first, a cache miss, excluded)."""
    times = []
    for _ in range(REPEAT + 1):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    sync()
    return statistics.median(times[1:]) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="run on CPU (Gloo) even where a GPU exists")
    args = parser.parse_args()
    cuda = torch.cuda.is_available() and not args.cpu
    device = "cuda" if cuda else "cpu"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1, timeout=timedelta(seconds=60))
    try:
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        mesh = init_device_mesh(device, (1,))
        dtype = torch.bfloat16 if cuda else torch.float32
        x = torch.rand(512, 512, device=device, dtype=dtype)
        w = torch.rand(512, 512, device=device, dtype=dtype)
        xs, ws = distribute_tensor(x, mesh, [Shard(0)]), distribute_tensor(w, mesh, [Replicate()])
        params = [torch.rand(4096, device=device) for _ in range(64)]
        dparams = [distribute_tensor(p, mesh, [Shard(0)]) for p in params]
        cases = [("add", lambda: x + x, lambda: xs + xs),
                 ("t", lambda: w.t(), lambda: ws.t()),
                 ("view", lambda: x.view(-1), lambda: xs.view(-1)),
                 ("mm", lambda: x.mm(w), lambda: xs.mm(ws)),
                 ("_foreach_mul_ (64 tensors)", lambda: torch._foreach_mul_(params, 0.999),
                  lambda: torch._foreach_mul_(dparams, 0.999))]
        print(f"{torch.__version__} on {torch.cuda.get_device_name(0) if cuda else 'CPU'}; median of {REPEAT} "
              f"calls each, microseconds of host time per op")
        print(f"{'op':28s} {'plain':>8s} {'DTensor':>8s}")
        for name, plain, on_dtensor in cases:
            print(f"{name:28s} {per_call_us(plain, sync):8.1f} {per_call_us(on_dtensor, sync):8.1f}")
        print(f"the step model: {HOST_SECONDS_PER_OP * 1e6:.0f} us an op, {DTENSOR_HOST_SECONDS_PER_OP * 1e6:.0f} us "
              f"on DTensors (PyTorch's test's expected_dispatch_time)")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
