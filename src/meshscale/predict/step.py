"""Step time of data-parallel training: compute + the gradient exchange the backward pass does not hide +
a fixed per-step overhead; and a scaling table like `meshscale scale`, marked predicted.

Overlap. Gradients become ready during backward (the last layers first) in buckets (DDP: 1 MiB first, then
25 MiB). In mode "ddp" each bucket is exchanged as soon as it is ready and the previous one is done, so all
but the tail is hidden behind backward; in mode "sync" the whole exchange follows backward (one fused
buffer), as frameworks without overlap (CNTK in 2016, a parameter server round) do.
"""
from __future__ import annotations

from dataclasses import dataclass

from meshscale.errors import MeshscaleError
from meshscale.predict.exchange_cost import Exchange
from meshscale.predict.profile import ComputeProfile

MODES = ("ddp", "sync")
BACKWARD_SHARE = 2 / 3          # backward is about twice forward
FIRST_BUCKET_BYTES = 1 << 20    # DDP defaults
BUCKET_BYTES = 25 << 20
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


def exposed_exchange_s(bucket_times_s: list[float], backward_s: float, compute_s: float, mode: str,
                       bucket_bytes: list[float]) -> float:
    """Exchange time left after compute ends. ddp: bucket i is ready when backward has produced its share of
    the gradients; exchanges run one at a time. sync: everything after compute."""
    if mode == "sync":
        return sum(bucket_times_s)
    if mode != "ddp":
        raise MeshscaleError(f"unknown mode {mode!r}; use one of {', '.join(MODES)}")
    total, done, end = sum(bucket_bytes), 0.0, 0.0
    start_backward = compute_s - backward_s
    for nbytes, t in zip(bucket_bytes, bucket_times_s):
        done += nbytes
        ready = start_backward + backward_s * done / total
        end = max(end, ready) + t
    return max(0.0, end - compute_s)


def predict_step(profile: ComputeProfile, exchange: Exchange, gradient_bytes: float, batch_per_rank: int,
                 mode: str = "ddp", compute_scale: float = 1.0) -> StepPrediction:
    """Predict one step of ``batch_per_rank`` samples on every rank of ``exchange.fabric``."""
    if batch_per_rank < 1:
        raise MeshscaleError(f"batch per GPU must be at least 1, got {batch_per_rank}")
    fabric = exchange.fabric
    compute = profile.step_time(batch_per_rank) * compute_scale
    if fabric.world_size == 1:
        return StepPrediction(1, 1, batch_per_rank, compute, 0.0, 0.0, 0.0)
    if mode == "sync" or exchange.algorithm == "ps":  # one fused exchange after backward
        sizes = [float(gradient_bytes)]
        mode = "sync"
    else:
        sizes = buckets(gradient_bytes)
    times = [exchange.allreduce_s(b) for b in sizes]
    exposed = exposed_exchange_s(times, BACKWARD_SHARE * compute, compute, mode, sizes)
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
