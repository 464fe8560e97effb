"""Step time of data-parallel training: compute + the gradient exchange the backward pass does not hide +
a fixed per-step overhead; and a scaling table like `meshscale scale`, marked predicted.

Modes, in `meshscale train`'s vocabulary. Gradients become ready during backward (the last layers first) in
buckets: "ddp" (DDP: 1 MiB first, then 25 MiB) and "allreduce" (Horovod-style fusion buffers of 64 MiB) exchange
each bucket as soon as it is ready and the previous one is done, so all but the tail is hidden behind backward.
"ps-sync" pushes every gradient to a parameter server and pulls the result after backward. Without overlap
(``overlap=False``) the whole exchange follows backward as one fused buffer, as frameworks without overlap
(CNTK in 2016) do. "ps-async" is not modelled: its steps do not wait for the exchange they start.
"""
from __future__ import annotations

from dataclasses import dataclass

from meshscale.errors import MeshscaleError, check_choice
from meshscale.predict.exchange_cost import Exchange
from meshscale.predict.profile import ComputeProfile

MODES = ("ddp", "allreduce", "ps-sync")
BACKWARD_SHARE = 2 / 3          # backward is about twice forward
FIRST_BUCKET_BYTES = 1 << 20    # DDP defaults
BUCKET_BYTES = 25 << 20
FUSION_BYTES = 64 << 20         # `train --mode allreduce`'s default --fusion-mb
DIST_OVERHEAD_S = 0.5e-3        # hooks, stream syncs and the optimizer's extra work with more than one rank


@dataclass
class StepPrediction:
    """One predicted point."""

    world_size: int
    nodes: int
    batch_per_rank: int
    compute_s: float
    comm_total_s: float
    comm_exposed_s: float
    overhead_s: float

    @property
    def step_time_s(self) -> float:
        return self.compute_s + self.comm_exposed_s + self.overhead_s

    @property
    def throughput_samples_per_s(self) -> float:
        return self.world_size * self.batch_per_rank / self.step_time_s


def buckets(gradient_bytes: float, first_bytes: int = FIRST_BUCKET_BYTES, cap_bytes: int = BUCKET_BYTES) -> list[float]:
    """Bucket sizes in the order backward fills them: a small first one, then full ones, then the rest."""
    out, left = [], float(gradient_bytes)
    size = first_bytes
    while left > 0:
        out.append(min(size, left))
        left -= out[-1]
        size = cap_bytes
    return out


def check_mode(mode: str) -> None:
    """A one-line error for a mode this model cannot time."""
    if mode == "ps-async":
        raise MeshscaleError("--mode ps-async is not modelled (its steps run on stale parameters without waiting "
                             "for the exchange); predict --mode ps-sync as the bound")
    check_choice(mode, MODES, "mode")


def exchange_buckets(gradient_bytes: float, mode: str, overlap: bool) -> list[float]:
    """The sizes exchanged per step, in order: one fused buffer without overlap, else the buckets of ``mode``."""
    if not overlap:
        return [float(gradient_bytes)]
    if mode == "allreduce":
        return buckets(gradient_bytes, FUSION_BYTES, FUSION_BYTES)
    return buckets(gradient_bytes)


def exposed_exchange_s(bucket_times_s: list[float], backward_s: float, compute_s: float, overlap: bool,
                       bucket_bytes: list[float]) -> float:
    """Exchange time left after compute ends. With overlap bucket i is ready when backward has produced its
    share of the gradients, and exchanges run one at a time; without, everything follows compute."""
    if not overlap:
        return sum(bucket_times_s)
    total, done, end = sum(bucket_bytes), 0.0, 0.0
    start_backward = compute_s - backward_s
    for nbytes, t in zip(bucket_bytes, bucket_times_s):
        done += nbytes
        ready = start_backward + backward_s * done / total
        end = max(end, ready) + t
    return max(0.0, end - compute_s)


def predict_step(profile: ComputeProfile, exchange: Exchange, gradient_bytes: float, batch_per_rank: int,
                 mode: str = "ddp", overlap: bool = True) -> StepPrediction:
    """Predict one step of ``batch_per_rank`` samples on every rank of ``exchange.fabric``."""
    check_mode(mode)
    if batch_per_rank < 1:
        raise MeshscaleError(f"batch per GPU must be at least 1, got {batch_per_rank}")
    fabric = exchange.fabric
    compute = profile.step_time(batch_per_rank)
    if fabric.world_size == 1:
        return StepPrediction(1, 1, batch_per_rank, compute, 0.0, 0.0, 0.0)
    overlap = overlap and mode != "ps-sync"  # a parameter-server round follows backward
    sizes = exchange_buckets(gradient_bytes, mode, overlap)
    times = [exchange.allreduce_s(b) for b in sizes]
    exposed = exposed_exchange_s(times, BACKWARD_SHARE * compute, compute, overlap, sizes)
    return StepPrediction(fabric.world_size, fabric.nodes, batch_per_rank, compute, sum(times), exposed,
                          DIST_OVERHEAD_S)


def per_rank_batch(world_size: int, batch: int, weak: bool) -> int:
    """The per-GPU batch: ``batch`` itself (weak scaling) or the global ``batch`` split evenly (strong)."""
    if weak:
        return batch
    if batch % world_size:
        raise MeshscaleError(f"global batch {batch} does not split evenly over {world_size} GPUs; "
                             "choose a batch divisible by every GPU count, or use --weak")
    return batch // world_size


def scaling_rows(points: list[StepPrediction], baseline: float, weak: bool, **extra) -> list[dict]:
    """Rows as `meshscale scale` writes them: speedup against ``baseline`` (1-GPU throughput at the same
    per-GPU batch for weak, the same global batch for strong), efficiency = speedup / GPUs."""
    rows = []
    for p in points:
        speedup = p.throughput_samples_per_s / baseline
        rows.append({**extra, "world_size": p.world_size, "nodes": p.nodes, "mode": "weak" if weak else "strong",
                     "batch_per_rank": p.batch_per_rank, "global_batch": p.batch_per_rank * p.world_size,
                     "step_time_s": p.step_time_s, "compute_s": p.compute_s, "comm_s": p.comm_total_s,
                     "comm_exposed_s": p.comm_exposed_s, "throughput_samples_per_s": p.throughput_samples_per_s,
                     "speedup": speedup, "efficiency": speedup / p.world_size,
                     "comm_share": p.comm_exposed_s / p.step_time_s})
    return rows
