"""What `meshscale predict` computes: prediction rows for one system or cluster and its variants
(NVLink vs PCIe systems, InfiniBand vs Ethernet, ring vs hierarchical vs parameter server, the exchange modes),
or predictions beside a measured `scale` run."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from meshscale.errors import MeshscaleError
from meshscale.predict.against_measured import compare_scale
from meshscale.predict.frameworks import FRAMEWORKS, MODES, resolve_framework
from meshscale.predict.profile import profile_from_result
from meshscale.predict.scaling import Job, predict_cluster, predict_system, profile_for
from meshscale.results import Result, load_result
from meshscale.simulate.nccl_env import NcclEnv
from meshscale.topology import load_system
from meshscale.topology.schema import require_devices
from meshscale.topology.cluster import default_nics
from meshscale.models.registry import get_model

COMPARE_PRESETS = {"algorithms": ("nccl", "ring", "hierarchical", "ps-sync"), "modes": MODES, "frameworks": tuple(FRAMEWORKS),
                   "links": ("edr", "10gbe"), "nvlink-pcie": ("dgx1-p100", "pcie-8gpu-2socket")}
COMPARE_KINDS = {"algorithms": "exchange", "modes": "exchange", "frameworks": "framework",
                 "links": "link"}  # the rest compare systems


@dataclass(kw_only=True)
class PredictRequest:
    """A prediction as the command line states it: what runs where, how it scales and exchanges, calibrations."""

    model: str | None = None                 # None: the model of ``measured``
    system: str = "dgx1-p100"                # one system, or the node of a cluster with ``nodes``
    gpus: tuple[int, ...] = (1, 2, 4, 8)     # GPU counts on one system
    nodes: tuple[int, ...] | None = None     # node counts of a cluster (instead of ``gpus``)
    link: str = "edr"
    nics: int | None = None                  # None: 4, or 2 for Ethernet
    gpudirect: bool = True
    cluster_shape: dict = field(default_factory=dict)  # the cluster's other fields (network, oversubscription, ...)
    batch_per_gpu: int = 64                  # weak scaling
    global_batch: int | None = None          # strong scaling when given
    mode: str | None = None                  # `meshscale train`'s modes (None: the framework's, else ddp)
    framework: str | None = None             # how gradients are exchanged (None: the mode's)
    wire: str | None = None                  # what gradients travel as (None: the framework's)
    algo: str = "nccl"                       # the all-reduce algorithm: NCCL's pick, or ring / hierarchical forced
    profile: Path | None = None
    compute_efficiency: float = 0.4
    p2p: Path | None = None
    bench: Path | None = None  # a measured all_reduce to fit the link model to (after p2p); with nodes, the network
    compare: str | None = None
    measured: Path | None = None
    partition: str | None = None             # each GPU split into MIG instances ("3g.40gb") or time slices ("1/4")
    nccl_env: NcclEnv | None = None          # NCCL's environment (--nccl-env)

    @property
    def weak(self) -> bool:
        return self.global_batch is None


def _exchange_of(variant: str, kind: str, req: PredictRequest) -> tuple[str | None, str | None, str]:
    """(mode, framework, algorithm) of one variant: a mode, a framework or an all-reduce algorithm compared,
    the request's own otherwise."""
    if kind == "framework":
        return None, variant, req.algo
    if kind != "exchange":
        return req.mode, req.framework, req.algo
    if variant in MODES:
        return variant, None, req.algo
    if req.mode == "ps-sync":
        raise MeshscaleError(f"--compare with algorithm {variant} compares all-reduces; use --mode ddp or allreduce")
    return req.mode, req.framework, variant


def predict_rows(req: PredictRequest) -> tuple[list[dict], Job, Result | None]:
    """Rows (one per variant and GPU/node count; with ``measured``, one per measured row with its error),
    the job of the last variant, and the measured result if any."""
    from meshscale.scenario import resolve_fabric  # looked up when called, as cli/collectives does

    measured = load_result(req.measured) if req.measured else None
    model = req.model or (measured.meta.get("model") if measured else None)
    if not model:
        raise MeshscaleError("name a model with --model (e.g. resnet50)")
    spec = get_model(model)
    profile = profile_from_result(load_result(req.profile)) if req.profile else None
    p2p = load_result(req.p2p) if req.p2p else None
    bench = load_result(req.bench) if req.bench else None
    variants, kind = [req.system], "system"
    if req.compare:
        variants = list(COMPARE_PRESETS.get(req.compare) or req.compare.split(","))
        kind = COMPARE_KINDS.get(req.compare, "system")
    rows: list[dict] = []
    job = None
    for variant in variants:
        system = variant if kind == "system" else req.system
        net = variant if kind == "link" else req.link
        nics = req.nics or default_nics(net)
        # the fabric as sim and plan resolve it (`resolve_fabric`); with nodes, the cluster of two of them: a
        # measured all_reduce is a multi-node one, fitted there it gives the network every node count is built with
        fabric = resolve_fabric(system, {"nodes": 2, "link": net, "nics": nics, "gpudirect": req.gpudirect,
                                         **req.cluster_shape} if req.nodes else None, p2p, bench,
                                {"nccl_env": req.nccl_env} if req.nccl_env else None)
        params, fit = fabric.params, fabric.network_fit
        topo = fabric.topology if fabric.cluster is None else require_devices(load_system(system))
        partition = None
        if req.partition:
            from meshscale.topology.partitions import split_system
            topo, partition = split_system(topo, req.partition)
        asked_mode, asked_framework, algorithm = _exchange_of(variant, kind, req)
        mode, framework = resolve_framework(asked_mode, asked_framework)
        job = Job(model, spec.params, profile_for(topo, profile, spec.flops_per_sample, req.compute_efficiency, model),
                  req.batch_per_gpu if req.weak else req.global_batch, weak=req.weak, algorithm=algorithm, mode=mode,
                  framework=framework, wire=req.wire, nccl_env=req.nccl_env)
        if partition:  # the whole GPU's step on the slice's share of it
            job.profile = job.profile.scaled(partition.step_time_factor, partition.describe())
        if fit:
            job.network_source = fit.source
        # the node counts vary from the resolved cluster (its link the fitted one where --bench fitted it)
        cluster = replace(fabric.cluster, nodes=1, link=fit.link if fit else fabric.cluster.link) if req.nodes else None
        if measured:
            found = compare_scale(measured, job, topo, params, cluster)
        elif cluster:
            found = predict_cluster(job, cluster, list(req.nodes), params)
        else:
            found = predict_system(job, topo, list(req.gpus), params)
        rows += [dict(r, variant=variant) for r in found]
    return rows, job, measured
