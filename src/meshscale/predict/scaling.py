"""Predict a whole scaling curve (several GPU or node counts) for one model on one system or cluster."""
from __future__ import annotations

from dataclasses import dataclass, field

from meshscale.errors import MeshscaleError, check_choice
from meshscale.predict.exchange_cost import ALLREDUCE_ALGORITHMS, Exchange, cluster_topology
from meshscale.predict.frameworks import FRAMEWORKS, MODE_FRAMEWORK, WIRE_BYTES, Bucket, Framework, check_mode
from meshscale.predict.gradient_tensors import GradientTensor, gradient_tensors
from meshscale.predict.profile import ComputeProfile, documented_profile, flops_profile, sustained_ratio
from meshscale.predict.step_time import StepPrediction, per_rank_batch, predict_step, scaling_rows
from meshscale.results import Result
from meshscale.simulate.nccl_env import NcclEnv
from meshscale.simulate.params import SimParams
from meshscale.topology import Topology
from meshscale.topology.cluster import ClusterSpec

PS_WIRE = "fp32"  # a parameter server receives the gradients as they are


@dataclass
class Job:
    """What to predict: a model (its gradient tensors), its compute profile, how it is scaled (``batch`` per GPU
    when ``weak``, else in all) and exchanged (``mode`` as in `meshscale train`, the all-reduce ``algorithm``,
    and the ``framework`` whose exchange it is: default the mode's; ``wire`` overrides the framework's wire)."""

    model: str
    params: int
    profile: ComputeProfile
    batch: int
    weak: bool = True
    algorithm: str = "nccl"
    mode: str = "ddp"
    framework: Framework | None = None
    wire: str | None = None
    gradients: list[GradientTensor] | None = None
    notes: list[str] = field(default_factory=list)
    nccl_env: NcclEnv | None = None  # NCCL's environment the exchange runs in (None: its defaults)
    network_source: str = ""         # where the cluster network's figures come from when fitted to a measurement

    def __post_init__(self) -> None:
        check_mode(self.mode)
        if self.algorithm == "ps":
            raise MeshscaleError("a parameter server is a mode, not an all-reduce algorithm: use --mode ps-sync")
        check_choice(self.algorithm, ALLREDUCE_ALGORITHMS, "all-reduce algorithm")
        if self.wire is not None:
            check_choice(self.wire, WIRE_BYTES, "wire precision")
        if self.framework is None and self.mode != "ps-sync":
            self.framework = FRAMEWORKS[MODE_FRAMEWORK[self.mode]]
        if self.gradients is None and self.profile.gradients and sum(g.elements for g in self.profile.gradients) == self.params:
            self.gradients = list(self.profile.gradients)
            self.notes.append("gradient readiness: measured by the profile run (when backward completed each gradient)")
        if self.gradients is None:
            self.gradients = gradient_tensors(self.model, self.params)

    @property
    def route(self) -> str:
        """How one exchange travels: the all-reduce algorithm, or "ps" (through a server) in mode ps-sync."""
        return "ps" if self.mode == "ps-sync" else self.algorithm

    @property
    def overlap(self) -> bool:
        return bool(self.framework and self.framework.overlap)

    def buckets(self) -> list[Bucket]:
        """The exchanges of one step: the framework's all-reduces, or one push to the server after backward."""
        if self.framework is None:
            return [Bucket(float(self.params * WIRE_BYTES[self.wire or PS_WIRE]), 1.0)]
        return self.framework.exchange(self.gradients, self.wire)

    def exchange_sizes(self) -> list[float]:
        """Bytes of each exchange of one step, in issue order."""
        return [b.nbytes for b in self.buckets()]

    def exchange(self, topology: Topology, gpus: int | None = None, params: SimParams | None = None) -> Exchange:
        """The exchange on the first ``gpus`` GPUs of ``topology`` (None: all of them, every node of a cluster):
        the NCCL cost model of the framework's NCCL version, refined by ``params`` (a calibration) when given."""
        version = self.framework.nccl_version if self.framework else None
        return Exchange(topology, gpus, self.route, params, nccl_version=version, nccl_env=self.nccl_env)

    def step(self, exchange: Exchange, batch_per_rank: int) -> StepPrediction:
        return predict_step(self.profile, exchange, self.buckets(), batch_per_rank)


def gpu_flops(topo: Topology) -> float | None:
    """FP32 FLOP/s of the system's first GPU, if the catalog says."""
    devices = topo.devices()
    value = topo.nodes[devices[0]].attrs.get("fp32_flops") if devices else None
    return float(value) if value else None


def profile_for(topo: Topology, profile: ComputeProfile | None, flops_per_sample: float | None,
                efficiency: float = 0.4, model: str = "") -> ComputeProfile:
    """The compute profile on ``topo``'s GPU: a measured one, else a documented one for ``model`` on that GPU's
    family (either rescaled by `sustained_ratio` when taken on a GPU of another rate), else one from the model's
    FLOPs. A one-line error when none is possible."""
    target = gpu_flops(topo)
    profile = profile or documented_profile(model, topo.gpu_model)
    if profile is None:
        if not flops_per_sample:
            raise MeshscaleError("the model has no profile and no FLOPs per sample; pass --profile profile.json")
        return flops_profile(flops_per_sample, target or 0.0, efficiency, gpu_model=topo.gpu_model)
    devices = topo.devices()
    ratio = sustained_ratio(profile, topo.nodes[devices[0]].attrs if devices else {})
    if ratio and abs(ratio[0] - 1) > 1e-3:
        return profile.scaled(ratio[0], f"compute x {ratio[0]:.3f}: {profile.gpu_model or 'profile GPU'} vs "
                                        f"{topo.gpu_model}, {ratio[1]}")
    return profile


def predict_exchanges(job: Job, exchanges: list[Exchange], one_gpu: Topology) -> list[dict]:
    """Rows for each exchange (one per GPU or node count), speedup against one GPU of ``one_gpu``."""
    points = [job.step(ex, per_rank_batch(ex.world_size, job.batch, job.weak)) for ex in exchanges]
    base = job.step(job.exchange(one_gpu, 1), job.batch)
    rows = scaling_rows(points, base.throughput_samples_per_s, job.weak, model=job.model,
                        algorithm=job.route, exchange_mode=job.mode,
                        framework=job.framework.name if job.framework else "parameter server")
    # what NCCL ran for the largest bucket at each size: Ring in a node, Tree or NVLS-Tree across many
    return [dict(r, nccl_algo=ex.chosen_algorithm) for r, ex in zip(rows, exchanges)]


def predict_system(job: Job, topo: Topology, gpus: list[int], params: SimParams | None = None) -> list[dict]:
    """Predicted scaling on 1 system for each GPU count in ``gpus``."""
    return [dict(r, system=topo.name) for r in predict_exchanges(job, [job.exchange(topo, g, params) for g in gpus], topo)]


def predict_cluster(job: Job, spec: ClusterSpec, nodes: list[int], params: SimParams | None = None) -> list[dict]:
    """Predicted scaling on ``nodes`` full nodes of a cluster (each count re-sizes the tree)."""
    exchanges = [job.exchange(cluster_topology(spec, n), None, params) for n in nodes]
    rows = predict_exchanges(job, exchanges, cluster_topology(spec, 1))
    return [dict(r, system=spec.node, link=spec.link, nics=spec.nics) for r in rows]


def prediction_result(rows: list[dict], job: Job, **meta) -> Result:
    """A Result of kind "predict" (predicted=True) carrying the job's assumptions."""
    notes = job.notes + job.profile.notes
    return Result("predict", rows, True, {"model": job.model, "batch": job.batch, "weak": job.weak,
                                          "algorithm": job.route, "exchange_mode": job.mode, "overlap": job.overlap,
                                          "framework": job.framework.name if job.framework else None,
                                          "framework_source": job.framework.source if job.framework else None,
                                          "profile": job.profile.source,
                                          "notes": notes, **meta})
