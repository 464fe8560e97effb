"""meshscale's training step beside a plain loop, side by side in one process on one device, rounds interleaved
(A B A B ...) so that clocks, temperature and other tenants weigh on both alike.

1. llama: meshscale's layout step (train/parallel: FSDP2 of one rank, bf16 MixedPrecisionPolicy, op-level
   selective activation checkpointing) for a Llama-style preset, beside a plain loop written the way torchtitan
   writes it (fully_shard per block and at the root, the same policies, AdamW, forward / loss / backward / step).
   Both train the same module class (meshscale.train.transformer), so the comparison is of the step around it.
2. resnet: meshscale's data-parallel step (`train --model resnet50 --precision bf16 --channels-last --batch 128
   --no-timing`, built by train/build.py, DDP of one rank) beside benchmarks/train_ddp_plain.py's loop.

    python benchmarks/train_vs_plain.py                  # on one GPU: both parts
    python benchmarks/train_vs_plain.py --dry-run        # on a CPU: llama-tiny and small-cnn, a few steps

Prints one JSON line per part and round, then one summary line per part: throughput of each and the ratio
meshscale / plain (median over rounds)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402


def init_one_rank(device: torch.device) -> dist.TCPStore:
    """A process group of one rank (FSDP2 and DDP want one), on a store made here (returned): no port is guessed."""
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=timedelta(seconds=120))
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timedelta(seconds=120),
                            **({"device_id": device} if device.type == "cuda" else {}))
    return store


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(step, steps: int, device: torch.device) -> float:
    """Seconds per step over ``steps`` steps, synced at the ends only."""
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return (time.perf_counter() - start) / steps


# ---- part 1: a Llama-style transformer --------------------------------------------------------------------------
def meshscale_llama(args, device):
    from meshscale.train.config import LayoutOptions, SpeedOptions, TrainConfig
    from meshscale.train.parallel.worker import build_layout, layout_step
    cfg = TrainConfig(model=args.llama, batch_per_rank=args.llama_batch, timing=False, device=device.type,
                      speed=SpeedOptions(precision=args.precision),
                      layout=LayoutOptions(fsdp=1, checkpointing="selective", seq_len=args.seq_len))
    t = build_layout(cfg, device)
    counter = iter(range(1 << 30))
    return lambda: layout_step(t, next(counter), 1e-4)


def plain_llama(args, device):
    """torchtitan's way: model built, selective op checkpointing per block, fully_shard per block then the root
    with bf16 params / fp32 reduce, AdamW; the loop is zero_grad, forward, loss, backward, step."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    from meshscale.models.transformer import load_model_config
    from meshscale.train.transformer import Transformer
    cfg = load_model_config(args.llama)
    torch.manual_seed(1)
    with torch.device(device):
        model = Transformer(cfg, args.seq_len)
    aten = torch.ops.aten
    save = {aten.mm.default, aten.addmm.default, aten._scaled_dot_product_flash_attention.default,
            aten._scaled_dot_product_efficient_attention.default, aten._scaled_dot_product_cudnn_attention.default,
            aten._scaled_dot_product_flash_attention_for_cpu.default}

    def context():
        return create_selective_checkpoint_contexts(
            lambda ctx, op, *a, **k: CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE)
    for name, block in list(model.layers.items()):
        model.layers[name] = checkpoint_wrapper(block, context_fn=context, preserve_rng_state=False)
    mesh = init_device_mesh(device.type, (1,))
    bf16 = args.precision == "bf16"
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    for block in model.layers.values():
        fully_shard(block, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=5e-5)
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randint(cfg.vocab_size, (args.llama_batch, args.seq_len), generator=g).to(device)
    y = torch.randint(cfg.vocab_size, (args.llama_batch, args.seq_len), generator=g).to(device)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()
    return step


# ---- part 2: ResNet-50, the data-parallel path -------------------------------------------------------------------
def meshscale_resnet(args, device):
    from meshscale.train.build import build, learning_rate
    from meshscale.train.config import SpeedOptions, TrainConfig
    from meshscale.train.step import run_step
    cfg = TrainConfig(model=args.resnet, batch_per_rank=args.resnet_batch, timing=False, device=device.type,
                      image_size=args.image_size, speed=SpeedOptions(precision=args.precision, channels_last=True))
    t = build(cfg, device, 0, 1)
    counter = iter(range(1 << 30))

    def step():
        i = next(counter)
        run_step(t, i, learning_rate(cfg, t.spec, i))
    return step


def plain_resnet(args, device):
    """benchmarks/train_ddp_plain.py's loop (DDP of one rank, bf16 autocast, channels-last, SGD)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from meshscale.train.models import get_model, image_spec
    torch.backends.cudnn.benchmark = device.type == "cuda"
    spec = get_model(args.resnet)
    if args.image_size:
        spec = image_spec(spec, 3, args.image_size, args.image_size, spec.num_classes)
    torch.manual_seed(1)
    model = spec.build().to(device).to(memory_format=torch.channels_last)
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * args.resnet_batch / 256, momentum=0.9, weight_decay=5e-5)
    x = torch.randn(args.resnet_batch, *spec.input_shape, device=device).contiguous(memory_format=torch.channels_last)
    y = torch.randint(spec.num_classes, (args.resnet_batch,), device=device)
    dtype = torch.bfloat16 if args.precision == "bf16" else None

    def step():
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def compare(part: str, unit_per_step: float, unit: str, ours, plain, args, device, out) -> None:
    """Warm both, then ``--rounds`` interleaved rounds; one JSON line per round and the median ratio."""
    for step in (ours, plain):
        for _ in range(args.warmup):
            step()
    sync(device)
    ratios = []
    for r in range(args.rounds):
        first, second = (ours, plain) if r % 2 == 0 else (plain, ours)   # alternate who goes first
        times = {id(first): timed(first, args.steps, device), id(second): timed(second, args.steps, device)}
        t_ours, t_plain = times[id(ours)], times[id(plain)]
        ratios.append(t_plain / t_ours)
        row = {"part": part, "round": r, f"meshscale_{unit}_per_s": unit_per_step / t_ours,
               f"plain_{unit}_per_s": unit_per_step / t_plain, "meshscale_step_s": t_ours, "plain_step_s": t_plain,
               "ratio": t_plain / t_ours, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
        print(json.dumps(row), flush=True)
        if out:
            out.write(json.dumps(row) + "\n")
    print(f"{part}: meshscale / plain throughput = {statistics.median(ratios):.3f} (median of {args.rounds} rounds; "
          f"min {min(ratios):.3f}, max {max(ratios):.3f})", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny models, a few steps: checks the script runs")
    p.add_argument("--parts", default="llama,resnet")
    p.add_argument("--llama", default="llama-1b")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--llama-batch", type=int, default=2)
    p.add_argument("--resnet", default="resnet50")
    p.add_argument("--resnet-batch", type=int, default=128)
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--precision", default="bf16")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20, help="timed steps per round and side")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--out", default=None, help="append the JSON lines here")
    args = p.parse_args()
    if args.dry_run:
        args.llama, args.seq_len, args.llama_batch = "llama-tiny", 64, 2
        args.resnet, args.resnet_batch, args.image_size = "small-cnn", 8, 32
        args.precision, args.warmup, args.steps, args.rounds = "fp32", 1, 2, 2
        device = torch.device("cpu")
    else:
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
    init_one_rank(device)
    out = open(args.out, "a") if args.out else None
    try:
        parts = args.parts.split(",")
        if "llama" in parts:
            ours = meshscale_llama(args, device)
            compare("llama", args.llama_batch * args.seq_len, "tokens", ours, plain_llama(args, device), args, device, out)
            del ours
        if "resnet" in parts:
            compare("resnet", args.resnet_batch, "images", meshscale_resnet(args, device), plain_resnet(args, device),
                    args, device, out)
    finally:
        if out:
            out.close()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
