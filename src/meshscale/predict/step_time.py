"""Step time of data-parallel training: compute + the gradient exchange the backward pass does not hide +
a fixed per-step overhead; and a scaling table like `meshscale scale`, marked predicted.

The exchange is a list of all-reduces in the order they are issued, each with the share of backward after which
its gradients are complete (the framework says which calls: see `meshscale.predict.frameworks`; the model's
layers when each gradient is complete: `meshscale.predict.gradient_tensors`). A framework that overlaps starts
each all-reduce once its gradients are complete and the previous one is done, so what the backward still to run
covers hides; one that does not (CNTK in 2016, a parameter server) starts them all after backward.
"""
from __future__ import annotations

from dataclasses import dataclass

from meshscale.errors import MeshscaleError
from meshscale.predict.exchange_cost import Exchange
from meshscale.predict.frameworks import Bucket
from meshscale.predict.profile import ComputeProfile

BACKWARD_SHARE = 2 / 3          # backward is about twice forward
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


def exposed_exchange_s(bucket_times_s: list[float], ready_shares: list[float], backward_s: float,
                       compute_s: float) -> float:
    """Exchange time left after compute ends: bucket i can start once ``ready_shares[i]`` of backward (the last
    ``backward_s`` of compute) is done (1.0: after backward, as a framework that does not overlap starts them),
    and exchanges run one at a time."""
    end = -compute_s  # times counted from the end of compute: all after backward sums exactly to the exchange
    for share, t in zip(ready_shares, bucket_times_s):
        end = max(end, -backward_s * (1.0 - share)) + t
    return max(0.0, end)


def predict_step(profile: ComputeProfile, exchange: Exchange, buckets: list[Bucket], batch_per_rank: int) -> StepPrediction:
    """Predict one step of ``batch_per_rank`` samples on every rank of the exchange, exchanging
    all-reduces of ``buckets`` (in issue order), each started once its gradients are complete."""
    if batch_per_rank < 1:
        raise MeshscaleError(f"batch per GPU must be at least 1, got {batch_per_rank}")
    compute = profile.step_time(batch_per_rank)
    if exchange.world_size == 1:
        return StepPrediction(1, 1, batch_per_rank, compute, 0.0, 0.0, 0.0)
    times = [exchange.allreduce_s(b.nbytes) for b in buckets]
    exposed = exposed_exchange_s(times, [b.ready_share for b in buckets], BACKWARD_SHARE * compute, compute)
    return StepPrediction(exchange.world_size, exchange.nodes, batch_per_rank, compute, sum(times), exposed,
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
