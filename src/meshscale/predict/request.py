"""The one predictor of `meshscale predict`: a `PredictRequest` (predict/question.py) resolved once (`prepare`:
the model, the `Fabric` it runs on, its compute's calibration or measured step) and answered by the step model
(`training.step.predict_step`) on an `Allocation` of that fabric per size: one layout (`predict_training`), a
scaling sweep (`sweep.predict_rows`: data parallelism is the layout's dp degree), variants, every layout ranked
(``search``) or a measured `scale` run beside (`predict.answer` picks which). `validate --training` prices each
corpus run through `predict_training` too, so a run gets one figure whichever way it is asked.

The compute: the per-layer kernels on the GPU's datasheet roofline, calibrated by a measured profile when one is
given (or documented for the model on that GPU family); where the measured step stands for the job (`_stands`),
or on devices without a datasheet (CPU workers), the measured step itself.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from meshscale.errors import MeshscaleError
from meshscale.models.layout import filled_degrees, ParallelLayout
from meshscale.models.transformer import TransformerConfig, is_transformer_model, load_model_config
from meshscale.predict.frameworks import FRAMEWORKS, PREDICTED_MODES
from meshscale.predict.question import IMAGE_BATCH, SEQUENCE_BATCH, PredictRequest
from meshscale.predict.profile import ComputeProfile, documented_profile, profile_from_result, sustained_ratio
from meshscale.predict.training.comm import Allocation
from meshscale.predict.training.hardware import GpuSpec, device_spec, gpu_spec, require_fp8, sku_spec
from meshscale.predict.training.moe import DEFAULT_IMBALANCE
from meshscale.predict.training.replicas import GradientExchange
from meshscale.predict.training.search import search_layouts
from meshscale.predict.training.step import Calibration, TrainingJob, TrainingPrediction, predict_step
from meshscale.simulate.fabric import Fabric
from meshscale.topology import Topology


RESNETS = {"resnet18": 18, "resnet34": 34, "resnet50": 50, "resnet101": 101, "resnet152": 152}
COMPARE_PRESETS = {"algorithms": ("nccl", "ring", "tree", "ps-sync"), "modes": PREDICTED_MODES,
                   "frameworks": tuple(FRAMEWORKS), "links": ("edr", "10gbe"),
                   "nvlink-pcie": ("dgx1-p100", "pcie-8gpu-2socket")}
COMPARE_KINDS = {"algorithms": "exchange", "modes": "exchange", "frameworks": "framework", "links": "link"}


@dataclass(frozen=True)
class Model:
    """What trains, resolved: a transformer shape, a ResNet depth or train's small CNN (per-layer kernels each)."""

    name: str
    transformer: TransformerConfig | None = None
    resnet_depth: int = 0
    autocast: bool = False
    ddp: bool = False           # train's own models: DDP, not FSDP2
    small_cnn: bool = False     # train's small CNN


def resolve_model(req: PredictRequest, name: str) -> Model:
    """The model a request names (a corpus row's own shape, train's registry, a transformer preset or
    config.json), or a one-line error."""
    from meshscale.models.registry import MODELS, get_model

    if req.shape is not None:
        return Model(name, req.shape, autocast=bool(req.autocast), ddp=req.sharding == "none")
    if name in RESNETS:
        return Model(name, resnet_depth=RESNETS[name], autocast=True, ddp=True)
    spec = MODELS.get(name)
    if spec is not None:   # train's own models train under torch.autocast and DDP
        return Model(name, spec.transformer, autocast=True, ddp=True, small_cnn=spec.family == "cnn")
    if is_transformer_model(name):
        return Model(name, load_model_config(name))
    get_model(name)   # the registry's one-line error, listing the known names
    raise MeshscaleError(f"unknown model {name!r}")


def default_network(node_system: str) -> tuple[str, int]:
    """(link, ports) of a node's own InfiniBand NICs in the catalog (hgx-h100: 8x NDR; dgx1-p100: 4x EDR); a
    node without them: 4x EDR, the DGX-1's."""
    from meshscale.topology.cluster import node_network

    return node_network(node_system) or ("edr", 4)


@dataclass(frozen=True)
class Where:
    """A request's system resolved once: the `Fabric` (the node, or a cluster of it: its network, the links'
    calibration, NCCL's settings), the node every size is built of (possibly partitioned) and its GPU;
    `allocation` places a size on it."""

    fabric: Fabric
    node: Topology
    gpu: GpuSpec
    max_nodes: int | None = None      # a cluster file's size: a sweep goes up to it
    partition: object = None          # Partition, or None

    @property
    def node_system(self) -> str:
        return self.fabric.cluster.node if self.fabric.cluster is not None else self.node.name

    @property
    def gpus_per_node(self) -> int:
        return len(self.node.devices())

    @property
    def notices(self) -> tuple[str, ...]:
        return self.fabric.notices

    def allocation(self, gpus: int | None = None, nodes: int | None = None) -> Allocation:
        """``gpus`` GPUs (more than a node's: whole nodes) or ``nodes`` whole nodes."""
        per_node = self.gpus_per_node
        world = gpus if gpus is not None else (nodes or 1) * per_node
        if world < 1:
            raise MeshscaleError("the GPU count must be at least 1")
        if world > per_node and world % per_node:
            raise MeshscaleError(f"--gpus {world}: more than one node of {self.node_system} ({per_node} GPUs) "
                                 f"must be whole nodes; use a multiple of {per_node}")
        count = max(1, world // per_node)
        if count > 1 and self.fabric.cluster is None:
            raise MeshscaleError(f"{world} GPUs span {count} nodes of {self.node_system}: describe the network "
                                 "between them (--nodes, or --link/--nics) or give a cluster file")
        fabric = self.fabric if count > 1 or self.partition is None else replace(self.fabric, topology=self.node,
                                                                                  cluster=None)
        return Allocation(fabric, min(world, per_node), count)


def where_on(topology: Topology, params=None) -> Where:
    """A topology in hand (a run's own, as `scale` recorded it; its links calibrated by ``params``) as the one
    node every size is placed on."""
    return Where(Fabric(topology, params=params), topology, device_spec(topology.nodes[topology.devices()[0]].attrs))


def _spans_nodes(req: PredictRequest, node_system: str) -> bool:
    """Whether the request places ranks on more than one node (or a cluster file says it has them)."""
    if req.nodes:
        return True
    from meshscale.topology import load_system
    from meshscale.topology.schema import require_devices
    per_node = len(require_devices(load_system(node_system)).devices())
    return any(g > per_node for g in req.gpus or ())


def resolve_where(req: PredictRequest, system: str, link: str | None, nccl_algo: str | None) -> Where:
    """The fabric of ``system`` (a catalog name, a file, or a cluster file whose node, network and size the
    options given override) as `resolve_fabric` resolves it for every command, with the request's calibration
    and NCCL's settings; its network the node's own NICs unless the options say."""
    from meshscale.simulate.fabric import resolve_fabric
    from meshscale.simulate.nccl_env import NcclSettings
    from meshscale.topology.cluster import cluster_file_spec

    spec = cluster_file_spec(system)
    node_system = spec.node if spec is not None else system
    options = {"link": link, "nics": req.nics, "gpudirect": req.gpudirect, "network": req.network,
               "oversubscription": req.oversubscription, "placement": req.placement}
    if spec is None:
        own_link, own_nics = default_network(system)
        options["link"] = link or own_link
        options["nics"] = req.nics or (own_nics if options["link"] == own_link else 4)
    cluster = None
    if spec is not None or _spans_nodes(req, node_system):
        cluster = {**options, "nodes": None if spec is not None else 2}
    settings = NcclSettings(req.nccl_env or NcclSettings().env, algo=nccl_algo or None)
    fabric = resolve_fabric(system, cluster, req.p2p, req.bench, settings)
    node = fabric.at_nodes(1).topology if fabric.cluster is not None else fabric.topology
    partition = None
    if req.partition:
        from meshscale.topology.partitions import split_system
        node, partition = split_system(node, req.partition)
    gpu = sku_spec(req.gpu) if req.gpu else device_spec(node.nodes[node.devices()[0]].attrs)
    return Where(fabric, node, gpu, spec.nodes if spec is not None else None, partition)


def split_framework(name: str | None) -> tuple[str, str | None]:
    """(what runs the step, how whole replicas exchange gradients) for --framework ``name``: an exchange
    framework (ddp, horovod, cntk-2016) runs eager PyTorch's step with its own exchange; a step framework
    (framework.STEP_FRAMEWORKS) the mode's exchange. Unknown: one line listing them all."""
    from meshscale.errors import check_choice
    from meshscale.predict.training.framework import DEFAULT_FRAMEWORK, STEP_FRAMEWORKS

    if name is None:
        return DEFAULT_FRAMEWORK, None
    check_choice(name, (*STEP_FRAMEWORKS, *FRAMEWORKS), "framework")
    return (DEFAULT_FRAMEWORK, name) if name in FRAMEWORKS else (name, None)


def base_job(req: PredictRequest, model: Model, where: Where, batch: int) -> TrainingJob:
    """The job of ``model`` at ``batch`` per data-parallel rank, on one GPU (the layout comes per size)."""
    step, replicas = split_framework(req.framework)
    exchange = GradientExchange.of(req.mode, replicas, req.wire)
    transformer = model.transformer
    if transformer is None and req.seq_len:
        raise MeshscaleError(f"--seq-len is for transformers; {model.name} takes images")
    if transformer is None and req.attention != "sdpa":
        raise MeshscaleError(f"--attention is for transformers; {model.name} has no attention")
    seq_len = req.seq_len or (min(transformer.max_seq_len, 2048) if transformer is not None else 0)
    if transformer is None and req.cp_attention:
        raise MeshscaleError(f"--cp-attention is for transformers; {model.name} has no attention")
    # whole replicas under an exchange framework; the shard dimension is the step framework's own otherwise
    sharding = req.sharding or ("none" if model.ddp or replicas else "fsdp2")
    if step != "eager" and transformer is not None:
        sharding = "fsdp2"
    if req.precision == "fp8":
        require_fp8(where.gpu)
    elif req.fp8_recipe is not None:
        raise MeshscaleError(f"--fp8-recipe {req.fp8_recipe} scales fp8's casts: add --precision fp8")
    if (req.ep or req.moe_imbalance) and (transformer is None or not transformer.is_moe):
        raise MeshscaleError(f"--{'ep' if req.ep else 'moe-imbalance'} is for models with experts; {model.name} has "
                             "none")
    return TrainingJob(transformer, ParallelLayout(), batch, seq_len, req.precision, req.checkpointing,
                       model.resnet_depth, req.channels_last, model.autocast if req.autocast is None else req.autocast,
                       cuda_graph=req.cuda_graph, selective_policy=req.selective_policy, rotary=req.rotary,
                       sharding=sharding, attention=req.attention, exchange=exchange, small_cnn=model.small_cnn,
                       moe_imbalance=req.moe_imbalance or DEFAULT_IMBALANCE, fp8_recipe=req.fp8_recipe or "tensorwise",
                       framework=step, cp_method=req.cp_attention or "", memory_recipe=req.memory_recipe)


def measured_profile(req: PredictRequest, model: Model, where: Where) -> ComputeProfile | None:
    """The profile that times or calibrates the job: the one given, else one documented for the model on the
    GPU's family; on a partition, the slice's share of the whole GPU."""
    if isinstance(req.profile, ComputeProfile):
        return req.profile
    if req.profile is not None:
        from meshscale.results import load_result
        return profile_from_result(load_result(req.profile))
    return documented_profile(model.name, where.gpu.model)


def layout_of(req: PredictRequest, world: int, fill: str) -> ParallelLayout:
    """The layout the options name; the degree not given takes what the others leave (``fill``: dp for
    replicated models, fsdp for transformers under FSDP2)."""
    given = filled_degrees(dict(req.degrees), world, fill)
    micro = req.micro_batches or (given.get("pp", 1) if given.get("pp", 1) > 1 else 1)
    return ParallelLayout(**given, pp_schedule=req.pp_schedule, micro_batches=micro,
                          stages_per_rank=(req.stages_per_rank or 2) if req.pp_schedule == "interleaved-1f1b" else 1,
                          ep=req.ep or 1)


def calibration_of(req: PredictRequest, job: TrainingJob, profile: ComputeProfile, node: Topology) -> Calibration:
    """A measured profile fitted to the datasheet roofline of the GPU it was measured on (`fit_calibration`: a
    factor on every kernel, and a fixed cost per step when it has two batches or more). A profile with the GPU's
    kernel time per category (`train --profile-batches` on a GPU) calibrates each category first
    (`category_calibration`); the fit then finds what the categories leave: the host."""
    from meshscale.predict.training.step import fit_calibration

    if not profile.gpu_model:
        raise MeshscaleError(f"{req.profile}: the profile does not say which GPU measured it")
    gpu = gpu_spec({"model": profile.gpu_model})
    one = Allocation(Fabric(node), 1)   # one GPU: nothing to exchange
    single = replace(job, layout=ParallelLayout())
    categories = None
    if profile.kernel_categories:
        categories = category_calibration(replace(single, batch=profile.kernel_categories.batch_per_rank), gpu,
                                          dict(profile.kernel_categories.seconds_per_step))
    base = Calibration(1.0, gpu.model, categories=categories) if categories else None
    # the fit is measured = host + factor x kernels: the model's kernel time, without the host-bound part of its
    # passes (the profile's own host is what the fit finds)
    steps = [predict_step(replace(single, batch=b), one, gpu, base) for b in profile.batches]
    predicted = [p.step_s - p.launch_s for p in steps]
    return replace(fit_calibration(predicted, profile.step_time_s, gpu.model), categories=categories)


def category_calibration(job: TrainingJob, gpu: GpuSpec, measured_s: dict[str, float]):
    """Each measured category's time over the roofline time of the step model's kernels in it on ``gpu`` (the
    profile's GPU, at the profile's batch); a category the profile did not measure keeps the datasheet's price,
    and categories the model has no kernel in are left to the fit."""
    from meshscale.predict.training.breakdown import step_kernel_list
    from meshscale.predict.training.kernels import CategoryCalibration, category_of, rates, roofline_seconds

    r = rates(gpu, job.precision, 1.0, job.attention, job.fp8_recipe)
    transformer = job.model is not None
    roofs: dict[str, float] = {}
    for k in step_kernel_list(job):
        c = category_of(k, transformer)
        roofs[c] = roofs.get(c, 0.0) + roofline_seconds(k, r)
    ratios = tuple((c, measured_s[c] / roof) for c, roof in roofs.items() if roof > 0 and c in measured_s)
    return CategoryCalibration(r, ratios, transformer)


def same_job(req: PredictRequest, job: TrainingJob, meta: dict) -> None:
    """A profile calibrates the kernels it ran: refuse, in one line, one measured on another model, precision,
    memory format (an NCHW ResNet runs other batch-norm and convolution kernels than a channels-last one),
    activation checkpointing or sequence length."""
    config = meta.get("config") or {}
    speed, layout = config.get("speed") or {}, config.get("layout") or {}
    asked = {"model": req.model, "precision": req.precision}
    measured = {"model": meta.get("model"), "precision": meta.get("precision", speed.get("precision"))}
    if job.model is None:  # the memory format is the ResNets'
        asked["channels-last"], measured["channels-last"] = req.channels_last, speed.get("channels_last")
    elif layout:  # a transformer's profile: the checkpointing and the sequence it ran
        asked["activation-checkpointing"] = job.checkpointing
        measured["activation-checkpointing"] = layout.get("checkpointing")
        # train's default sequence is predict's: the model's positions, at most 2,048
        asked["seq-len"], measured["seq-len"] = job.seq_len, layout.get("seq_len") or min(job.model.max_seq_len, 2048)

    def said(key: str, value) -> str:
        if key == "channels-last":
            return "--channels-last" if value else "NCHW images (no --channels-last)"
        return f"--{key} {value}"
    for key, value in measured.items():
        if value is not None and value != asked[key]:
            raise MeshscaleError(f"--profile {req.profile}: measured with {said(key, value)}, the prediction asks "
                                 f"{said(key, asked[key])}; profile the same job (`meshscale train --profile-batches`)")


@dataclass(frozen=True)
class Prepared:
    """A request resolved for one variant: the job on one GPU, where it runs, and its compute's calibration
    (kernels) or measured step (a model without them); `at` predicts one size."""

    req: PredictRequest
    model: Model
    where: Where
    job: TrainingJob
    calibration: Calibration | None
    nccl_algo: str | None
    measured: ComputeProfile | None = None   # the measured step on this GPU, where it stands (`_stands`)

    def allocation(self, gpus: int | None = None, nodes: int | None = None) -> Allocation:
        return self.where.allocation(gpus, nodes)

    def at(self, allocation: Allocation, batch: int, layout: ParallelLayout | None = None) -> TrainingPrediction:
        """The step of ``batch`` per data-parallel rank on ``allocation`` (the request's layout, filled). A
        measured step of the whole model is the compute of replicas that each run the whole model, at the batches
        it measured; a layout that splits the model (FSDP shards, tensor, pipeline or context parallelism), or
        another batch, takes the kernels, calibrated by it."""
        fill = "fsdp" if self.job.model is not None and self.job.sharding != "none" else "dp"
        layout = layout or layout_of(self.req, allocation.world_size, fill)
        job = replace(self.job, layout=layout, batch=batch)
        whole = layout.fsdp == layout.tp == layout.pp == layout.cp == 1
        inside = self.measured is not None and self.measured.batches[0] <= batch <= self.measured.batches[-1]
        if self.measured is not None and (self.where.gpu.sm_count == 0 or (whole and inside)):
            job = replace(job, measured=self.measured)
        return predict_step(job, allocation, self.where.gpu, self.calibration)


def prepare(req: PredictRequest, system: str | None = None, link: str | None = None,
            exchange: tuple[str | None, str | None] | None = None, nccl_algo: str | None = None,
            where: Where | None = None) -> Prepared:
    """``req`` resolved on ``system`` (default the request's; or ``where``, resolved already) with ``link`` and
    the exchange (mode, framework) a compared variant sets."""
    name = req.model or (req.measured and _measured_model(req.measured))
    if not name:
        raise MeshscaleError("name a model with --model (e.g. resnet50)")
    if exchange is not None:
        req = replace(req, mode=exchange[0], framework=exchange[1])
    model = resolve_model(req, name)
    nccl_algo = nccl_algo if nccl_algo is not None else req.nccl_algo
    where = where or resolve_where(req, system or req.system, link or req.link, nccl_algo)
    batch = req.batch or (SEQUENCE_BATCH if model.transformer is not None else IMAGE_BATCH)
    profile = measured_profile(req, model, where)
    req = replace(req, model=name, precision=req.precision or (profile.precision if profile else None) or "fp32")
    job = base_job(req, model, where, batch)
    calibration, measured = None, None
    kernels = where.gpu.sm_count > 0   # a device without a datasheet (CPU workers) has no roofline
    if kernels and profile is not None and _datasheet(profile.gpu_model):
        if isinstance(req.profile, Path):
            from meshscale.results import load_result
            same_job(req, job, load_result(req.profile).meta)
        calibration = calibration_of(req, job, profile, where.node)
    if profile is not None and (not kernels or _stands(profile, where)):
        measured = _on_this_gpu(profile, where)
    elif not kernels:
        raise MeshscaleError(f"{name} runs on {where.gpu.model}, which has no datasheet: give its measured step "
                             "(--profile, from `meshscale train --profile-batches --json`)")
    if where.partition is not None:
        factor, what = where.partition.step_time_factor, where.partition.describe()
        calibration = replace(calibration, factor=calibration.factor * factor) if calibration else \
            Calibration(factor, where.gpu.model)
        measured = measured.scaled(factor, what) if measured is not None else None
    if profile is not None and profile.gradients:
        job = replace(job, measured_gradients=tuple(profile.gradients))
    return Prepared(req, model, where, job, calibration, nccl_algo, measured)


def _datasheet(gpu_model: str) -> bool:
    """Whether the catalog knows ``gpu_model``'s rates (a profile measured on it can calibrate the kernels)."""
    try:
        gpu_spec({"model": gpu_model})
    except MeshscaleError:
        return False
    return bool(gpu_model)


def _stands(profile: ComputeProfile, where: Where) -> bool:
    """Whether a profile of a model with kernels stands for the step as measured on ``where``'s GPU: measured
    there (its GPU model, or no GPU said), or on the same chip at another clock (the catalog gives both base
    clocks: the P100 SXM2 and PCIe), and not by kernel category (categories calibrate the kernels)."""
    if profile.kernel_categories is not None:
        return False
    if not profile.gpu_model or profile.gpu_model == where.gpu.model:
        return True
    ratio = sustained_ratio(profile, where.node.nodes[where.node.devices()[0]].attrs)
    return bool(ratio) and ratio[1] == "FP32 at base clock"


def _on_this_gpu(profile: ComputeProfile, where: Where) -> ComputeProfile:
    """A measured profile on the GPU of ``where``: moved there by the sustained FP32 rates (`sustained_ratio`)
    when it was measured on another model of GPU."""
    ratio = sustained_ratio(profile, where.node.nodes[where.node.devices()[0]].attrs)
    if ratio and abs(ratio[0] - 1) > 1e-3:
        return profile.scaled(ratio[0], f"compute x {ratio[0]:.3f}: {profile.gpu_model or 'profile GPU'} vs "
                                        f"{where.gpu.model}, {ratio[1]}")
    return profile


def _measured_model(path: Path) -> str | None:
    from meshscale.results import load_result
    return load_result(path).meta.get("model")


def predict_training(req: PredictRequest, prepared: Prepared | None = None
                     ) -> tuple[list[TrainingPrediction], GpuSpec]:
    """The prediction of the layout asked on one GPU or node count (one row), or with ``search`` every layout
    ranked (``prepared``: the request resolved already)."""
    if req.global_batch is not None and not req.search:
        raise MeshscaleError("--global-batch is for --search and --strong; a layout takes --batch (per "
                             "data-parallel rank)")
    counts = req.gpus or req.nodes or ()
    if len(counts) > 1:
        flag = "--gpus" if req.gpus else "--nodes"
        raise MeshscaleError(f"{flag} {','.join(map(str, counts))}: a layout runs on one count; give one number")
    prepared = prepared or prepare(req)
    allocation = prepared.allocation(req.gpus[0] if req.gpus else None, req.nodes[0] if req.nodes else None)
    if req.search:
        return search_layouts(prepared.job, allocation, prepared.where.gpu,
                              req.global_batch or allocation.world_size, prepared.calibration), prepared.where.gpu
    return [prepared.at(allocation, prepared.job.batch)], prepared.where.gpu
