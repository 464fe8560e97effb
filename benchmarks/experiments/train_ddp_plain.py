"""The baseline meshscale's training modes are compared against: a plain PyTorch DDP ResNet-50 (or any
torchvision model) on synthetic data, bf16 autocast, SGD. Nothing from meshscale is imported.

    python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/experiments/train_ddp_plain.py --batch 256

--batch is per GPU. Rank 0 prints one JSON line (and appends it to --out): world, batch, samples/s."""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet50")
    p.add_argument("--batch", type=int, default=256, help="per GPU")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--out", default=None, help="append the JSON line here")
    p.add_argument("--tag", default="plain-ddp")
    a = p.parse_args()

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off on the lent machines
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    model = getattr(torchvision.models, a.model)().cuda()
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    model = model.to(memory_format=fmt)
    model = DDP(model, device_ids=[local])
    if a.compile:
        model = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * a.batch * world / 256, momentum=0.9, weight_decay=5e-5)
    x = torch.randn(a.batch, 3, 224, 224, device="cuda").contiguous(memory_format=fmt)
    y = torch.randint(1000, (a.batch,), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    if rank == 0:
        row = {"script": a.tag, "model": a.model, "world_size": world, "batch_per_rank": a.batch,
               "global_batch": a.batch * world, "channels_last": a.channels_last, "compile": a.compile,
               "step_time_s": elapsed / a.steps, "throughput_samples_per_s": a.batch * world * a.steps / elapsed}
        print(json.dumps(row), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(row) + "\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
