"""One question, one answer: what `meshscale predict` (and the Python API) returns for a `PredictRequest`, and
the options that cannot change it refused, each in one line.

The question decides the shape of the answer, never the model: one GPU or node count (or a layout's degrees)
is one layout's step; a list of counts, a comparison or no count is a scaling sweep; ``search`` ranks every
layout; ``measured`` lays the prediction beside a `scale` run. All of them are the step model on the same
allocations (`request.Prepared.at`), so a size gets the same figure in each.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from meshscale.errors import MeshscaleError
from meshscale.predict.frameworks import FRAMEWORKS
from meshscale.models.layout import check_degrees
from meshscale.predict.question import PredictRequest
from meshscale.predict.request import Prepared, predict_training, prepare
from meshscale.predict.sweep import SweepInfo, predict_rows
from meshscale.predict.training.hardware import GpuSpec
from meshscale.predict.training.step import TrainingPrediction
from meshscale.results import Result

CLUSTER_OPTIONS = ("link", "nics", "gpudirect", "network", "oversubscription", "placement")
EXCHANGE_OPTIONS = ("mode", "framework", "wire")
SWEEP_OPTIONS = ("compare", "measured")


@dataclass
class Answer:
    """``kind``: layout, search, sweep or beside; the layouts' predictions, or the sweep's rows."""

    kind: str
    predictions: list[TrainingPrediction] = field(default_factory=list)
    rows: list[dict] = field(default_factory=list)
    info: SweepInfo | None = None
    measured: Result | None = None
    gpu: GpuSpec | None = None
    notices: list[str] = field(default_factory=list)   # lines said under the answer


def shape_of(req: PredictRequest) -> str:
    """What kind of answer ``req`` asks for."""
    counts = req.gpus or req.nodes or ()
    if req.search:
        return "search"
    if req.measured:
        return "beside"
    if req.compare or len(counts) > 1 or (not counts and not req.degrees):
        return "sweep"
    return "layout"


def _flag(name: str) -> str:
    return {"measured": "--from", "checkpointing": "--activation-checkpointing"}.get(name, "--" + name.replace("_", "-"))


def refuse_what_does_not_apply(req: PredictRequest, kind: str, prepared: Prepared) -> None:
    """A one-line error naming the first option given that cannot change this answer, and why."""
    given = lambda names: [n for n in names if getattr(req, n) is not None]  # noqa: E731
    counts = req.gpus or req.nodes or ()
    if req.gpus and req.nodes:
        raise MeshscaleError("give the size once: --gpus (GPU counts) or --nodes (node counts)")
    if kind == "search" and (req.degrees or len(counts) > 1 or req.micro_batches):
        raise MeshscaleError("--search chooses the layout itself on one GPU count: drop --dp/--fsdp/--tp/--pp/--cp, "
                             "--micro-batches and lists of counts")
    if kind in ("sweep", "beside") and (req.degrees or req.micro_batches or req.pp_schedule != "1f1b"):
        raise MeshscaleError("a layout's degrees (--dp/--fsdp/--tp/--pp/--cp, --micro-batches, --pp-schedule) set "
                             "one layout on one count; give one --gpus or --nodes count, without --compare or --from")
    if req.pp_schedule != "1f1b" and not (req.pp or 1) > 1 and kind != "search":
        raise MeshscaleError(f"--pp-schedule {req.pp_schedule} schedules a pipeline: add --pp N (N > 1)")
    if kind in ("layout", "search"):
        for name in given(SWEEP_OPTIONS):
            raise MeshscaleError(f"{_flag(name)} is for a sweep (a list of --gpus or --nodes counts)")
    job = prepared.job
    replicated = job.model is None or job.sharding == "none"
    exchange_options = [n for n in EXCHANGE_OPTIONS if n != "framework" or req.framework in FRAMEWORKS]
    for name in given(exchange_options) if not replicated else ():
        shards = "FSDP2" if job.framework == "eager" else job.framework
        raise MeshscaleError(f"{_flag(name)} says how whole replicas exchange gradients (ResNets, DDP models); "
                             f"{job.name} trains under {shards}, whose collectives are its own")
    if req.cp_attention and kind != "search" and not (req.cp or 1) > 1:
        raise MeshscaleError(f"--cp-attention {req.cp_attention} runs context parallelism's attention: add --cp N "
                             "(N > 1)")
    if job.model is not None and req.channels_last:
        raise MeshscaleError("--channels-last is the memory format of images; transformers take tokens")
    if prepared.calibration is None and prepared.measured is not None and req.cuda_graph and job.model is None \
            and not job.resnet_depth:
        raise MeshscaleError("--cuda-graph changes the host's issuing of per-layer kernels; a model timed by its "
                             "measured step has none to change")
    if req.partition and req.nodes:
        raise MeshscaleError("--partition splits the GPUs of one system; drop --nodes (slices of several nodes talk "
                             "over the network like whole GPUs)")
    per_node = prepared.where.gpus_per_node
    one_node = not req.nodes and not prepared.where.max_nodes and max(counts or (1, 2, 4, 8)) <= per_node
    for name in given(CLUSTER_OPTIONS) if one_node and not req.bench else ():
        raise MeshscaleError(f"{_flag(name)} describes the network between nodes, and every size here fits in "
                             f"one {prepared.where.node_system} ({per_node} GPUs): add --nodes N or more --gpus")


def answer(req: PredictRequest) -> Answer:
    """The answer to ``req``, after refusing what does not apply."""
    kind = shape_of(req)
    check_degrees(dict(req.degrees))  # before anything sized by their product
    prepared = prepare(req)   # the fabric resolved once
    refuse_what_does_not_apply(req, kind, prepared)
    if kind in ("layout", "search"):
        if not (req.gpus or req.nodes) and req.degrees:   # the degrees' product, or one node
            total = check_degrees(dict(req.degrees))
            req = replace(req, gpus=(prepared.where.gpus_per_node if total <= 1 else total,))
            prepared = replace(prepared, req=req)
        predictions, gpu = predict_training(req, prepared)
        return Answer(kind, predictions=predictions, gpu=gpu,
                      notices=network_notices(req, predictions[0].allocation.nodes, prepared) + model_notices(prepared))
    rows, info, measured = predict_rows(req, None if req.compare else prepared)
    return Answer(kind, rows=rows, info=info, measured=measured,
                  notices=network_notices(req, max((r.get("nodes") or 1 for r in rows), default=1), prepared)
                  + model_notices(prepared))


def model_notices(prepared: Prepared) -> list[str]:
    """The config.json fields the model was read without, named on one line (never dropped silently)."""
    shape = prepared.model.transformer
    if shape is None or not shape.ignored:
        return []
    return [f"{prepared.req.model}: fields meshscale does not model: {'; '.join(shape.ignored)}"]


def network_notices(req: PredictRequest, nodes: int, prepared: Prepared) -> list[str]:
    """What the network's oversubscription did, said plainly: an oversubscribed tree slows only traffic that
    climbs above the leaf switches; spread over busy leaves (the default) all of it climbs, packed on one leaf
    none does."""
    cluster = prepared.where.fabric.cluster
    if not req.oversubscription or req.oversubscription <= 1 or cluster is None or nodes < 2:
        return []
    per_leaf = prepared.where.fabric.at_nodes(nodes).topology.cluster.nodes_per_leaf
    k = f"{req.oversubscription:g}"
    if cluster.placement == "spread":
        return [f"--oversubscription {k}: the {nodes} nodes are taken to sit on leaves of their own whose up-links "
                f"busy neighbours share {k}:1 (--placement spread, a shared cluster); --placement packed puts "
                f"{'them on one leaf' if nodes <= per_leaf else 'them on the fewest leaves'} ({per_leaf} nodes "
                "per leaf)"]
    if nodes > per_leaf:
        return []
    return [f"--oversubscription {k}: the {nodes} nodes share one leaf switch ({per_leaf} nodes per leaf, "
            "--placement packed), so no traffic climbs to the oversubscribed links"]
