"""When do DDP's buckets become ready, and when do their all-reduces finish, inside a real training step? Under
torchrun (one GPU per rank) a model trains with DDP (bf16 autocast, DDP's default buckets) and a communication
hook notes, for each bucket, CUDA events when it is handed to the hook (its gradients are complete on the GPU)
and when its all-reduce has finished; rank 0 prints the last step's timeline in ms from the step's start.

    torchrun --nproc-per-node 2 benchmarks/experiments/ddp_bucket_timeline.py [--model gpt-small] [--batch 16]
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from torchrun_rank import join

from meshscale.train.builders import build_model
from meshscale.train.readiness import sample_batch
from meshscale.train.step import loss_fn


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt-small")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    rank, device, spec = join(args.model)
    model = DDP(build_model(spec).to(device), device_ids=[device.index])
    x, y = sample_batch(spec, args.batch, device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    marks: list[tuple[int, int, torch.cuda.Event, torch.cuda.Event]] = []

    def hook(_state, bucket):
        ready = torch.cuda.Event(enable_timing=True)
        ready.record()
        buffer = bucket.buffer()
        done = torch.cuda.Event(enable_timing=True)
        marks.append((bucket.index(), buffer.numel() * buffer.element_size(), ready, done))

        def finished(fut):
            done.record()  # this callback's stream waits for the all-reduce
            return fut.value()[0]
        return dist.all_reduce(buffer, async_op=True).get_future().then(finished)

    model.register_comm_hook(None, hook)
    for step in range(args.steps):
        marks.clear()
        start, forward_done, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        torch.cuda.synchronize()
        dist.barrier()
        start.record()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(spec.input_kind, model(x), y)
        forward_done.record()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        end.record()
        torch.cuda.synchronize()
    if rank == 0:
        ms = start.elapsed_time
        print(f"{args.model} batch {args.batch}, {dist.get_world_size()} ranks, DDP default buckets; last of {args.steps} steps")
        print(f"forward done {ms(forward_done):7.1f} ms; step end {ms(end):7.1f} ms")
        print(" bucket      MB   ready ms   all-reduce done ms   took ms (from max(ready, previous done))")
        previous = 0.0
        for index, nbytes, ready, done in marks:
            r, d = ms(ready), ms(done)
            print(f" {index:6d} {nbytes / 1e6:7.1f} {r:10.1f} {d:20.1f} {d - max(r, previous):9.1f}")
            previous = d
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
