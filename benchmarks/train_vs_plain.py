"""meshscale's training step beside a plain loop, side by side in the same processes, rounds interleaved
(A B A B ...) so that clocks, temperature and other tenants weigh on both alike.

1. llama: meshscale's layout step (train.build and train.step.run_step, built as `meshscale train
   --model llama-1b --fsdp F --tp T --activation-checkpointing selective --precision bf16` builds them) beside a
   plain loop written the way torchtitan writes it. On one GPU: FSDP2 of one rank. Under torchrun, any --layout
   of fsdp and tp whose product is the world size; every rank runs both sides in lock step.
2. resnet (one rank): meshscale's data-parallel step (`train --model resnet50 --precision bf16 --channels-last
   --batch 128 --no-timing`, built by train/build.py, DDP of one rank) beside benchmarks/train_ddp_plain.py's loop.

The plain llama side mirrors torchtitan's llama3 parallelize and train step: a DeviceMesh with named dimensions
("dp_shard", "tp"; tp innermost, consecutive ranks); tensor parallelism by parallelize_module (the embedding
RowwiseParallel from replicated ids to a sequence shard, the final norm SequenceParallel, the head ColwiseParallel
from a sequence shard; per block SequenceParallel norms, PrepareModuleInput gathering the sequence before attention
and the feed-forward, ColwiseParallel wq/wk/wv/w1/w3, RowwiseParallel wo/w2 back to the sequence shard); then
op-level selective activation checkpointing per block; then fully_shard per block and at the root on the dp_shard
mesh, bf16 parameters and fp32 gradient reduction; AdamW (betas 0.9, 0.95); zero_grad, forward, loss, backward,
step. Where meshscale chose otherwise, the plain side does as meshscale does, so that both drive the same engines
the same way and the ratio measures meshscale's step around them:
- no loss parallelism (torchtitan's default under tp keeps the logits vocabulary-sharded into the loss): the head
  gathers the whole logits on every tp rank;
- the selective policy saves every matmul and attention output (torchtitan recomputes every other matmul, and also
  saves tensor parallelism's reduce-scatter outputs so that its backward does not repeat them:
  `--plain-checkpointing torchtitan` gives the plain side that policy instead);
- fully_shard wraps the blocks and the root only (torchtitan also wraps the embedding, and the norm with the head,
  apart; llama-1b's head is tied to its embedding, which that split would separate); every block reshards after
  its forward;
- with tp alone fully_shard still runs, on a shard mesh of one rank, for bf16 mixed precision (torchtitan applies
  no FSDP then, and trains a tp-only run in fp32); no gradient clipping (torchtitan clips at norm 1).
Both sides build the model from the same seed and train the same per-rank batch (meshscale's synthetic batch of
the rank's data-parallel index): the first steps' losses, printed, agree.

    python benchmarks/train_vs_plain.py                  # on one GPU: both parts
    python benchmarks/train_vs_plain.py --dry-run        # on a CPU: llama-tiny and small-cnn, a few steps
    python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/train_vs_plain.py --layout fsdp=2
    python -m torch.distributed.run --standalone --nproc-per-node 4 benchmarks/train_vs_plain.py --dry-run \\
        --layout fsdp=2,tp=2                             # on a CPU: 4 Gloo ranks

Rank 0 prints one JSON line per part and round (each side's step time as the slowest rank saw it, tokens/s in all
and per GPU, the ratio), the first steps' losses of each side, then one summary line per part: the median over
rounds of each side's throughput and of the ratio meshscale / plain, with its min and max; with
--one-gpu-tokens-per-s, each side's scaling against that one-GPU figure."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Callable, Optional, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from meshscale.errors import MeshscaleError, WorkerError  # noqa: E402
from meshscale.train.config import TrainConfig  # noqa: E402

FIRST_STEPS = 2      # steps whose losses each side reports before the warm-up (same weights and data: they agree)
PLAIN_DIMENSIONS = ("fsdp", "tp")   # what the plain side is written for


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


@dataclass
class Run:
    """This rank's part in the comparison: rank 0 prints and writes the rows."""

    args: argparse.Namespace
    device: torch.device
    rank: int
    world: int
    out: Optional[TextIO] = None

    def emit(self, row: dict) -> None:
        if self.rank == 0:
            print(json.dumps(row), flush=True)
            if self.out:
                self.out.write(json.dumps(row) + "\n")

    def say(self, line: str) -> None:
        if self.rank == 0:
            print(line, flush=True)

    def line_up(self) -> None:
        """Every rank has come this far before any starts a clock (a tiny all-reduce, waited for)."""
        dist.all_reduce(torch.zeros(1, device=self.device))
        sync(self.device)

    def slowest(self, seconds: float) -> float:
        """The longest of the ranks' ``seconds``: a lock-step run goes at its slowest rank's pace."""
        t = torch.tensor([seconds], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def mean(self, value: torch.Tensor) -> float:
        """``value`` averaged over the ranks."""
        total = value.detach().float().reshape(1).clone()
        dist.all_reduce(total)
        return total.item() / self.world

    @property
    def gpus(self) -> str:
        return f"{self.world} {'GPU' if self.device.type == 'cuda' else 'CPU rank'}{'s' if self.world > 1 else ''}"


# ---- part 1: a Llama-style transformer --------------------------------------------------------------------------
def parse_layout(text: str) -> dict[str, int]:
    """--layout fsdp=2,tp=2 (or `scale --layouts`' spelling of one layout, fsdp2xtp2): fsdp and tp only."""
    from meshscale.train.parallel.plan import parse_layouts
    try:
        degrees = parse_layouts(text.replace("=", "").replace(",", "x"))[0]
    except MeshscaleError:
        raise MeshscaleError(f"--layout {text}: write the degrees as fsdp=F,tp=T (or fsdpFxtpT)") from None
    other = sorted(set(degrees) - set(PLAIN_DIMENSIONS))
    if other:
        raise MeshscaleError(f"--layout {text}: the plain side is written for {' and '.join(PLAIN_DIMENSIONS)}; "
                             f"{', '.join(other)} has no plain counterpart here")
    return degrees


def llama_config(args, world: int, device_type: str) -> TrainConfig:
    """meshscale's configuration of the run, as `meshscale train` makes it, checked as `train` checks it."""
    from meshscale.train.config import LayoutOptions, SpeedOptions
    from meshscale.train.parallel.plan import check_layout_run
    degrees = parse_layout(args.layout) if args.layout else {"fsdp": world}
    cfg = TrainConfig(model=args.llama, world=world, batch_per_rank=args.llama_batch, timing=False,
                      device=device_type, speed=SpeedOptions(precision=args.precision),
                      layout=LayoutOptions(checkpointing="selective", seq_len=args.seq_len, **degrees))
    check_layout_run(cfg)
    return cfg


def meshscale_llama(cfg: TrainConfig, device):
    """meshscale's trainer and its step (the global loss of each step)."""
    from meshscale.train.build import build
    from meshscale.train.step import run_step
    t = build(cfg, device, 0, 1)
    counter = iter(range(1 << 30))
    return t, lambda: run_step(t, next(counter), 1e-4)[1]


def plain_tensor_parallel(model, tp_mesh) -> None:
    """torchtitan's tensor and sequence parallel plan for its Llama (no loss parallelism: see the docstring).
    Written out here rather than taken from train/parallel/apply.py: the plain side is the independent reference,
    and its losses agreeing with meshscale's is what shows the two plans are the same arithmetic."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    parallelize_module(model, tp_mesh, {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate(), use_local_output=True),
    })
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, {
            "attention_norm": SequenceParallel(),
            # the block's other inputs (rotary tables, positions) pass as they are
            "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None, None),
                                            desired_input_layouts=(Replicate(), None, None, None)),
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
        })


def selective_policy(kind: str) -> Callable:
    """The plain side's op-level selective checkpointing (a context_fn): ``meshscale``'s choice, every matmul and
    attention output kept; or ``torchtitan``'s own save list and rule, which also keeps tensor parallelism's
    reduce-scatter outputs (its backward does not repeat them) and recomputes every second matmul."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    aten = torch.ops.aten
    attention = {aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_efficient_attention.default,
                 aten._scaled_dot_product_cudnn_attention.default,
                 aten._scaled_dot_product_flash_attention_for_cpu.default}   # the CPU kernel: dry runs
    if kind == "meshscale":
        save = {aten.mm.default, aten.addmm.default, aten.bmm.default, *attention}
    else:
        save = {aten.mm.default, aten.max.default, aten._scaled_dot_product_attention_math.default,
                torch.ops._c10d_functional.reduce_scatter_tensor.default, *attention}

    def context():
        matmuls = {"forward": 0, "recompute": 0}   # counted apart in the forward and in its recomputation

        def policy(ctx, op, *args, **kwargs):
            mode = "recompute" if ctx.is_recompute else "forward"
            if op == aten.mm.default:
                matmuls[mode] += 1
            second = kind == "torchtitan" and op == aten.mm.default and matmuls[mode] % 2 == 0
            return CheckpointPolicy.MUST_SAVE if op in save and not second else CheckpointPolicy.PREFER_RECOMPUTE
        return create_selective_checkpoint_contexts(policy)
    return context


def plain_llama(cfg: TrainConfig, model_cfg, device, x: torch.Tensor, y: torch.Tensor,
                plain_checkpointing: str = "meshscale") -> Callable[[], torch.Tensor]:
    """torchtitan's way: the mesh, the model from the seed, tensor parallelism, selective op checkpointing per
    block, fully_shard per block then the root with bf16 params / fp32 reduce, AdamW; the loop is zero_grad,
    forward, loss, backward, step. Returns the step (this rank's loss)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from meshscale.train.transformer import Transformer
    layout = cfg.layout.parallel_layout()
    mesh = init_device_mesh(device.type, (layout.fsdp, layout.tp), mesh_dim_names=("dp_shard", "tp"))
    torch.manual_seed(cfg.seed)
    with torch.device(device):   # whole on the device, the values meshscale's shards have (seeded by name)
        model = Transformer(model_cfg, x.shape[1], seed=cfg.seed)
    if layout.tp > 1:
        plain_tensor_parallel(model, mesh["tp"])
    context = selective_policy(plain_checkpointing)
    for name, block in list(model.layers.items()):
        model.layers[name] = checkpoint_wrapper(block, context_fn=context, preserve_rng_state=False)
    bf16 = cfg.speed.precision == "bf16"
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 else MixedPrecisionPolicy()
    for block in model.layers.values():
        fully_shard(block, mesh=mesh["dp_shard"], mp_policy=mp)
    fully_shard(model, mesh=mesh["dp_shard"], mp_policy=mp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=5e-5)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x).flatten(0, 1).float(), y.flatten())
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def first_losses(run: Run, label: str, ours, plain) -> None:
    """Each side's first steps' losses, over the global batch (meshscale's step returns that mean; the plain
    side's rank losses are averaged here: tp ranks hold the same value, so the mean over all ranks is the mean
    over the data-parallel ranks)."""
    losses = {"meshscale": [ours().item() for _ in range(FIRST_STEPS)],
              "plain": [run.mean(plain()) for _ in range(FIRST_STEPS)]}
    run.emit({"part": "llama", "layout": label, "ranks": run.world, "first_losses": losses})
    run.say(f"llama {label}: first {FIRST_STEPS} losses: " +
            "; ".join(f"{side} {' '.join(f'{v:.6f}' for v in values)}" for side, values in losses.items()))


def llama_part(run: Run, cfg: TrainConfig) -> None:
    t, ours = meshscale_llama(cfg, run.device)
    x, y = t.batches.get(0)   # meshscale's synthetic batch of this rank: the plain side trains the same tensors
    plain = plain_llama(cfg, t.spec.transformer, run.device, x, y, run.args.plain_checkpointing)
    label = " ".join(f"{d}{getattr(t.layout, d)}" for d in PLAIN_DIMENSIONS if getattr(t.layout, d) > 1) or "fsdp1"
    if run.args.plain_checkpointing != "meshscale":
        label += " (plain: torchtitan's checkpointing)"
    first_losses(run, label, ours, plain)
    compare(run, "llama", label, cfg.global_batch * x.shape[1], "tokens", ours, plain)


# ---- part 2: ResNet-50, the data-parallel path -------------------------------------------------------------------
def meshscale_resnet(args, device):
    from meshscale.train.build import build
    from meshscale.train.recipe import learning_rate
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

    from meshscale.models.registry import get_model, image_spec
    from meshscale.train.builders import build_model
    torch.backends.cudnn.benchmark = device.type == "cuda"
    spec = get_model(args.resnet)
    if args.image_size:
        spec = image_spec(spec, 3, args.image_size, args.image_size, spec.num_classes)
    torch.manual_seed(1)
    model = build_model(spec).to(device).to(memory_format=torch.channels_last)
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


def compare(run: Run, part: str, label: str, units_per_step: float, unit: str, ours, plain) -> None:
    """Warm both, then ``--rounds`` interleaved rounds; one JSON line per round, then the medians. Every rank
    runs both sides in the same order (their collectives pair up); a side's time is its slowest rank's."""
    args = run.args
    for step in (ours, plain):
        for _ in range(args.warmup):
            step()
    rates: dict[str, list[float]] = {"meshscale": [], "plain": []}
    ratios = []
    for r in range(args.rounds):
        order = (("meshscale", ours), ("plain", plain)) if r % 2 == 0 else (("plain", plain), ("meshscale", ours))
        seconds = {}
        for side, step in order:   # alternate who goes first
            run.line_up()
            seconds[side] = run.slowest(timed(step, args.steps, run.device))
        row = {"part": part, "layout": label, "ranks": run.world, "round": r}
        for side in ("meshscale", "plain"):
            rates[side].append(units_per_step / seconds[side])
            row[f"{side}_{unit}_per_s"] = rates[side][-1]
            row[f"{side}_{unit}_per_s_per_rank"] = rates[side][-1] / run.world
        for side in ("meshscale", "plain"):
            row[f"{side}_step_s"] = seconds[side]
        ratios.append(seconds["plain"] / seconds["meshscale"])
        row["ratio"] = ratios[-1]
        row["device"] = torch.cuda.get_device_name(run.device) if run.device.type == "cuda" else "cpu"
        run.emit(row)
    each = "GPU" if run.device.type == "cuda" else "rank"
    median = {side: statistics.median(values) for side, values in rates.items()}
    sides = ", ".join(f"{side} {median[side]:,.0f} {unit}/s ({median[side] / run.world:,.0f} per {each})"
                      for side in ("meshscale", "plain"))
    run.say(f"{part} {label} on {run.gpus}: {sides}; meshscale / plain throughput = {statistics.median(ratios):.3f} "
            f"(median of {args.rounds} rounds; min {min(ratios):.3f}, max {max(ratios):.3f})")
    one = args.one_gpu_tokens_per_s
    if part == "llama" and one:
        scaled = ", ".join(f"{side} {median[side] / one:.2f}x ({median[side] / one / run.world:.2f} per {each})"
                           for side in ("meshscale", "plain"))
        run.say(f"{part} {label} on {run.gpus} against one GPU's {one:,.0f} tokens/s: {scaled}")


def body(run: Run, parts: list[str], cfg: Optional[TrainConfig]) -> None:
    """The parts on this rank (every rank runs them all, in step)."""
    # FSDP2 warns once per rank that the root returns a view (the logits reshaped for the loss): nothing here
    # changes that view in place
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
    args = run.args
    if run.rank == 0 and args.out:
        run.out = open(args.out, "a")
    try:
        if "llama" in parts:
            llama_part(run, cfg)
        if "resnet" in parts:
            compare(run, "resnet", "ddp1", args.resnet_batch, "images", meshscale_resnet(args, run.device),
                    plain_resnet(args, run.device))
    finally:
        if run.out:
            run.out.close()


def rank_main(ctx, args: argparse.Namespace, parts: list[str], cfg: Optional[TrainConfig]) -> None:
    """One rank under torchrun (meshscale.execute.launch made its process group, with the timeout)."""
    body(Run(args, ctx.device, ctx.rank, ctx.world_size), parts, cfg)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry-run", action="store_true", help="CPU (Gloo), tiny models, a few steps: checks the "
                   "script runs")
    p.add_argument("--parts", default=None, help="llama,resnet (default: both on one rank, llama under torchrun; "
                   "resnet runs on one rank only)")
    p.add_argument("--layout", default=None, help="llama under torchrun: fsdp=F,tp=T with F x T the world size "
                   "(default: fsdp = the world size)")
    p.add_argument("--plain-checkpointing", choices=("meshscale", "torchtitan"), default="meshscale",
                   help="llama: the plain side's selective policy: meshscale's (like for like) or torchtitan's own")
    p.add_argument("--llama", default="llama-1b")
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--llama-batch", type=int, default=2, help="sequences per data-parallel rank")
    p.add_argument("--resnet", default="resnet50")
    p.add_argument("--resnet-batch", type=int, default=128)
    p.add_argument("--image-size", type=int, default=None)
    p.add_argument("--precision", default="bf16")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20, help="timed steps per round and side")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--one-gpu-tokens-per-s", type=float, default=None, help="llama: meshscale's tokens/s on one "
                   "GPU at the same per-rank batch; rank 0 prints each side's scaling against it")
    p.add_argument("--timeout-s", type=float, default=300.0, help="seconds any collective may take")
    p.add_argument("--out", default=None, help="append the JSON lines here")
    args = p.parse_args()
    if args.dry_run:
        args.llama, args.seq_len, args.llama_batch = "llama-tiny", 64, 2
        args.resnet, args.resnet_batch, args.image_size = "small-cnn", 8, 32
        args.precision, args.warmup, args.steps, args.rounds = "fp32", 1, 2, 2
    return args


def main() -> None:
    args = parse_args()
    from meshscale.execute import in_torchrun, launch
    from meshscale.execute.world import launcher
    rank = os.environ.get("RANK", "0")
    try:
        torchrun = in_torchrun()
        world = launcher().world_size if torchrun else 1
        parts = (args.parts or ("llama" if torchrun else "llama,resnet")).split(",")
        unknown = sorted(set(parts) - {"llama", "resnet"})
        if unknown or ("resnet" in parts and world > 1):
            raise MeshscaleError(f"--parts {args.parts}: give llama and/or resnet; resnet runs on one rank only")
        device_type = "cpu" if args.dry_run else "cuda"
        cfg = llama_config(args, world, device_type) if "llama" in parts else None
        if torchrun:
            launch(rank_main, world, (args, parts, cfg), backend="gloo" if args.dry_run else "nccl",
                   timeout_s=args.timeout_s)
            return
        device = torch.device("cpu") if args.dry_run else torch.device("cuda", 0)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        init_one_rank(device)
        try:
            body(Run(args, device, 0, 1), parts, cfg)
        finally:
            dist.destroy_process_group()
    except MeshscaleError as exc:   # bad input (2), or a rank that failed (1): one line
        if rank == "0":
            print(f"train_vs_plain: error: {exc}", file=sys.stderr)
        sys.exit(1 if isinstance(exc, WorkerError) else 2)


if __name__ == "__main__":
    main()
