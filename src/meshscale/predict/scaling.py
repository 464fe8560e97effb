"""Predict a whole scaling curve (several GPU or node counts) for one model on one system or cluster."""
from __future__ import annotations

from dataclasses import dataclass, field

from meshscale.errors import MeshscaleError, check_choice
from meshscale.predict.exchange_cost import ALLREDUCE_ALGORITHMS, Exchange, Fabric, cluster_fabric, system_fabric
from meshscale.predict.profile import ComputeProfile, flops_profile
from meshscale.predict.step_time import StepPrediction, check_mode, per_rank_batch, predict_step, scaling_rows
from meshscale.results import Result
from meshscale.simulate.params import SimParams
from meshscale.topology import Topology
from meshscale.topology.cluster import ClusterSpec

BYTES_PER_GRADIENT = 4  # FP32 gradients, as DDP all-reduces them by default


@dataclass
class Job:
    """What to predict: a model (gradient size), its compute profile, how it is scaled (``batch`` per GPU when
    ``weak``, else in all) and exchanged (``mode`` as in `meshscale train`, the all-reduce ``algorithm``, and
    whether the exchange overlaps backward)."""

    model: str
    params: int
    profile: ComputeProfile
    batch: int
    weak: bool = True
    algorithm: str = "ring"
    mode: str = "ddp"
    comm_scale: float = 1.0
    overlap: bool = True
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_mode(self.mode)
        if self.algorithm == "ps":
            raise MeshscaleError("a parameter server is a mode, not an all-reduce algorithm: use --mode ps-sync")
        check_choice(self.algorithm, ALLREDUCE_ALGORITHMS, "all-reduce algorithm")

    @property
    def gradient_bytes(self) -> int:
        return self.params * BYTES_PER_GRADIENT

    @property
    def route(self) -> str:
        """How one exchange travels: the all-reduce algorithm, or "ps" (through a server) in mode ps-sync."""
        return "ps" if self.mode == "ps-sync" else self.algorithm

    def exchange(self, fabric: Fabric, params: SimParams | None = None) -> Exchange:
        return Exchange(fabric, self.route, self.comm_scale, params)

    def step(self, exchange: Exchange, batch_per_rank: int) -> StepPrediction:
        return predict_step(self.profile, exchange, self.gradient_bytes, batch_per_rank, self.mode, self.overlap)


def gpu_flops(topo: Topology) -> float | None:
    """FP32 FLOP/s of the system's first GPU, if the catalog says."""
    devices = topo.devices()
    value = topo.nodes[devices[0]].attrs.get("fp32_flops") if devices else None
    return float(value) if value else None


def profile_for(topo: Topology, profile: ComputeProfile | None, flops_per_sample: float | None,
                efficiency: float = 0.4) -> ComputeProfile:
    """The compute profile on ``topo``'s GPU: a measured one (rescaled by the FP32 rate when it was taken on a
    GPU of another rate), else one from the model's FLOPs. A one-line error when neither is possible."""
    target = gpu_flops(topo)
    if profile is None:
        if not flops_per_sample:
            raise MeshscaleError("the model has no profile and no FLOPs per sample; pass --profile profile.json")
        return flops_profile(flops_per_sample, target or 0.0, efficiency, gpu_model=topo.gpu_model)
    if profile.gpu_flops and target and abs(profile.gpu_flops / target - 1) > 1e-3:
        return profile.scaled(profile.gpu_flops / target,
                              f"compute x {profile.gpu_flops / target:.3f}: profile GPU {profile.gpu_flops / 1e12:.1f} "
                              f"vs {topo.gpu_model} {target / 1e12:.1f} TFLOP/s FP32")
    return profile


def predict_fabrics(job: Job, fabrics: list[Fabric], params: SimParams | None = None) -> list[dict]:
    """Rows for each fabric (one per GPU or node count), speedup against one GPU of the first fabric's node."""
    points = [job.step(job.exchange(fabric, params), per_rank_batch(fabric.world_size, job.batch, job.weak))
              for fabric in fabrics]
    base = job.step(job.exchange(Fabric(fabrics[0].node, 1), params), job.batch)
    return scaling_rows(points, base.throughput_samples_per_s, job.weak, model=job.model,
                        algorithm=job.route, exchange_mode=job.mode)


def predict_system(job: Job, topo: Topology, gpus: list[int], params: SimParams | None = None) -> list[dict]:
    """Predicted scaling on 1 system for each GPU count in ``gpus``."""
    return [dict(r, system=topo.name) for r in predict_fabrics(job, [system_fabric(topo, g) for g in gpus], params)]


def predict_cluster(job: Job, spec: ClusterSpec, nodes: list[int], params: SimParams | None = None) -> list[dict]:
    """Predicted scaling on ``nodes`` full nodes of a cluster (each count re-sizes the tree)."""
    fabrics = [cluster_fabric(spec, n, params)[0] for n in nodes]
    return [dict(r, system=spec.node, link=spec.link, nics=spec.nics) for r in predict_fabrics(job, fabrics, params)]


def prediction_result(rows: list[dict], job: Job, **meta) -> Result:
    """A Result of kind "predict" (predicted=True) carrying the job's assumptions."""
    notes = job.notes + job.profile.notes
    return Result("predict", rows, True, {"model": job.model, "batch": job.batch, "weak": job.weak,
                                          "algorithm": job.route, "exchange_mode": job.mode, "overlap": job.overlap,
                                          "comm_scale": job.comm_scale, "profile": job.profile.source,
                                          "notes": notes, **meta})
