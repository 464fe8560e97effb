"""Does a gradient exchange slow the backward pass it overlaps, or the other way round? Under torchrun (one GPU
per rank), GPT-small's forward + backward alone, all-reduces of DDP-sized buckets alone (on a side stream), and
both at once (the all-reduces issued as backward starts), each timed with CUDA events over several iterations.
Prints the compute and the exchange time of each, and their slowdowns when they run together.

    torchrun --nproc-per-node 2 benchmarks/experiments/overlap_contention.py [--model gpt-small] [--batch 16] [--buckets 6]
"""
from __future__ import annotations

import argparse
import statistics

import torch
import torch.distributed as dist

from torchrun_rank import join

from meshscale.train.builders import build_model
from meshscale.train.readiness import sample_batch
from meshscale.train.step import loss_fn


def _loss(model, spec, x, y):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        return loss_fn(spec.input_kind, model(x), y)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt-small")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--buckets", type=int, default=6, help="all-reduces of 25 MiB each per iteration")
    ap.add_argument("--iters", type=int, default=8)
    args = ap.parse_args()
    rank, device, spec = join(args.model)
    model = build_model(spec).to(device)
    x, y = sample_batch(spec, args.batch, device)
    buckets = [torch.ones(25 * 2**20 // 4, device=device) for _ in range(args.buckets)]
    side = torch.cuda.Stream(device)

    def compute():
        model.zero_grad(set_to_none=True)
        _loss(model, spec, x, y).backward()

    def exchange():
        with torch.cuda.stream(side):
            return [dist.all_reduce(b, async_op=True) for b in buckets]

    def timed(run_compute: bool, run_exchange: bool) -> tuple[float, float, float]:
        start = torch.cuda.Event(enable_timing=True)
        compute_done, exchange_done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        dist.barrier()
        torch.cuda.synchronize()
        start.record()
        side.wait_event(start)
        works = exchange() if run_exchange else []
        if run_compute:
            compute()
        compute_done.record()
        with torch.cuda.stream(side):  # the side stream waits for NCCL's, so its event marks the exchange's end
            for w in works:
                w.wait()
            exchange_done.record(side)
        torch.cuda.synchronize()
        return (start.elapsed_time(compute_done) * 1e-3, start.elapsed_time(exchange_done) * 1e-3,
                max(start.elapsed_time(compute_done), start.elapsed_time(exchange_done)) * 1e-3)

    for _ in range(3):  # warm-up: kernels, NCCL's connections
        timed(True, True)
    results = {}
    for name, flags in (("compute alone", (True, False)), ("exchange alone", (False, True)), ("both", (True, True))):
        runs = [timed(*flags) for _ in range(args.iters)]
        results[name] = [statistics.median(r[i] for r in runs) for i in range(3)]
    if rank == 0:
        c_alone, e_alone, both = results["compute alone"][0], results["exchange alone"][1], results["both"]
        mb = sum(b.numel() * 4 for b in buckets) / 1e6
        print(f"{args.model} batch {args.batch}, {args.buckets} all-reduces of 25 MiB ({mb:.0f} MB), "
              f"{dist.get_world_size()} ranks, median of {args.iters}")
        print(f"  compute alone   {c_alone * 1e3:8.1f} ms")
        print(f"  exchange alone  {e_alone * 1e3:8.1f} ms  ({mb / 1e3 / e_alone:.2f} GB/s algbw)")
        print(f"  both: compute   {both[0] * 1e3:8.1f} ms  (x{both[0] / c_alone:.3f})")
        print(f"  both: exchange  {both[1] * 1e3:8.1f} ms  (x{both[1] / e_alone:.3f})")
        print(f"  both: step      {both[2] * 1e3:8.1f} ms  (perfect overlap {max(c_alone, e_alone) * 1e3:.1f}, "
              f"none {(c_alone + e_alone) * 1e3:.1f})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
