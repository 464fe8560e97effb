"""What `meshscale predict` asks of the training model: a model, a layout (or --search), the step's shape and
where it runs, resolved into a `TrainingJob`, a `Placement`, a GPU and an optional calibration."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from meshscale.errors import MeshscaleError
from meshscale.models.layout import ParallelLayout
from meshscale.models.transformer import TransformerConfig, is_transformer_model, load_model_config
from meshscale.predict.training.breakdown import step_kernel_list
from meshscale.predict.training.comm import Placement
from meshscale.predict.training.hardware import GpuSpec, gpu_spec, system_gpu
from meshscale.predict.training.kernels import CategoryCalibration, category_of, rates, roofline_seconds
from meshscale.predict.training.search import search_layouts
from meshscale.predict.training.step import (Calibration, TrainingJob, TrainingPrediction, fit_calibration,
                                             predict_step)

# `meshscale train`'s models (its registry) as the shapes they are: they train under torch.autocast
TRAIN_MODELS = {"gpt-small": "gpt2-small", "gpt-medium": "gpt2-medium"}
RESNETS = {"resnet18": 18, "resnet34": 34, "resnet50": 50, "resnet101": 101, "resnet152": 152}
DEFAULT_LINK = "ndr"   # one 400 Gb/s port per GPU, as HGX/DGX H100 and H200 nodes are built


@dataclass(kw_only=True)
class TrainingRequest:
    """The command line's training question."""

    model: str
    system: str
    gpus: int | None = None          # world size (default: one node); or
    nodes: int | None = None         # whole nodes
    link: str | None = None
    nics: int | None = None
    batch: int = 1                   # per data-parallel rank (ignored by --search)
    global_batch: int | None = None  # --search: sequences per step over all ranks (default: one per GPU)
    seq_len: int | None = None
    precision: str = "bf16"
    checkpointing: str = "none"
    channels_last: bool = False
    degrees: dict | None = None      # dp/fsdp/tp/pp/cp given on the command line
    pp_schedule: str = "1f1b"
    micro_batches: int | None = None
    search: bool = False
    profile: Path | None = None
    cuda_graph: bool = False         # the step replayed as one CUDA graph (train --cuda-graph)
    attention: str = "sdpa"          # the attention kernel (kernels.ATTENTION_KERNELS)


def is_training_model(name: str) -> bool:
    """Whether ``name`` is a model the step model knows (transformer preset or config, ResNet, train's GPTs)."""
    return name in TRAIN_MODELS or name in RESNETS or is_transformer_model(name)


def _model(name: str) -> tuple[TransformerConfig | None, int, bool]:
    """(transformer shape, ResNet depth, autocast) of a model name or config path. train's own models (ResNets,
    its GPTs) train under torch.autocast and DDP; transformers under FSDP2 in the compute precision."""
    if name in RESNETS:
        return None, RESNETS[name], True
    if name in TRAIN_MODELS:
        return load_model_config(TRAIN_MODELS[name]), 0, True
    return load_model_config(name), 0, False


def placement_of(req: TrainingRequest, gpus_per_node: int) -> Placement:
    if req.gpus and req.nodes:
        raise MeshscaleError("give the size once: --gpus N or --nodes N")
    world = req.gpus or (req.nodes or 1) * gpus_per_node
    if world > gpus_per_node and world % gpus_per_node:
        raise MeshscaleError(f"--gpus {world}: more than one node of {req.system} ({gpus_per_node} GPUs) must be "
                             f"whole nodes; use a multiple of {gpus_per_node}")
    nodes = max(1, world // gpus_per_node)
    return Placement(req.system, min(world, gpus_per_node), nodes, req.link or DEFAULT_LINK,
                     req.nics or gpus_per_node)


def layout_of(req: TrainingRequest, world: int, resnet: bool) -> ParallelLayout:
    """The layout the options name; the degree not given takes what the others leave (fsdp for transformers,
    dp for ResNets)."""
    given = {k: v for k, v in (req.degrees or {}).items() if v is not None}
    fill = "dp" if resnet else "fsdp"
    if fill not in given:
        others = 1
        for v in given.values():
            others *= v
        if world % others:
            raise MeshscaleError(f"{' x '.join(f'--{k} {v}' for k, v in given.items())} = {others} does not divide "
                                 f"the {world} GPUs")
        given[fill] = world // others
    micro = req.micro_batches or (given.get("pp", 1) if given.get("pp", 1) > 1 else 1)
    return ParallelLayout(**given, pp_schedule=req.pp_schedule, micro_batches=micro,
                          stages_per_rank=2 if req.pp_schedule == "interleaved-1f1b" else 1)


def calibration_of(req: TrainingRequest, job: TrainingJob) -> Calibration | None:
    """A measured single-GPU profile fitted to the datasheet roofline of the GPU it was measured on
    (`fit_calibration`: a factor on every kernel, and a fixed cost per step when it has two batches or more).
    A profile with the GPU's kernel time per category (`train --profile-batches` on a GPU) calibrates each
    category first (`category_calibration`); the fit then finds what the categories leave: the host."""
    if not req.profile:
        return None
    from meshscale.predict.profile import profile_from_result
    from meshscale.results import load_result

    result = load_result(req.profile)
    same_job(req, job, result)
    profile = profile_from_result(result)
    if not profile.gpu_model:
        raise MeshscaleError(f"{req.profile}: the profile does not say which GPU measured it")
    gpu = gpu_spec({"model": profile.gpu_model})
    one = Placement(req.system, 1)
    single = replace(job, layout=ParallelLayout())
    categories = None
    if profile.kernel_categories:
        categories = category_calibration(replace(single, batch=profile.kernel_categories.batch_per_rank), gpu,
                                          dict(profile.kernel_categories.seconds_per_step))
    base = Calibration(1.0, gpu.model, categories=categories) if categories else None
    predicted = [predict_step(replace(single, batch=b), one, gpu, base).step_s for b in profile.batches]
    return replace(fit_calibration(predicted, profile.step_time_s, gpu.model), categories=categories)


def category_calibration(job: TrainingJob, gpu: GpuSpec, measured_s: dict[str, float]) -> CategoryCalibration:
    """Each measured category's time over the roofline time of the step model's kernels in it on ``gpu`` (the
    profile's GPU, at the profile's batch); a category the profile did not measure keeps the datasheet's price,
    and categories the model has no kernel in are left to the fit."""
    r = rates(gpu, job.precision, 1.0, job.attention)
    transformer = job.model is not None
    roofs: dict[str, float] = {}
    for k in step_kernel_list(job):
        c = category_of(k, transformer)
        roofs[c] = roofs.get(c, 0.0) + roofline_seconds(k, r)
    ratios = tuple((c, measured_s[c] / roof) for c, roof in roofs.items() if roof > 0 and c in measured_s)
    return CategoryCalibration(r, ratios, transformer)


def same_job(req: TrainingRequest, job: TrainingJob, result) -> None:
    """A profile calibrates the kernels it ran: refuse, in one line, one measured on another model, precision,
    memory format (an NCHW ResNet runs other batch-norm and convolution kernels than a channels-last one),
    activation checkpointing or sequence length."""
    meta = result.meta
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


def predict_training(req: TrainingRequest) -> tuple[list[TrainingPrediction], GpuSpec]:
    """The prediction of the layout asked (one row), or with ``search`` every layout ranked."""
    if req.global_batch is not None and not req.search:
        raise MeshscaleError("--global-batch is for --search; a layout takes --batch (per data-parallel rank)")
    gpu, per_node = system_gpu(req.system)
    placement = placement_of(req, per_node)
    transformer, depth, autocast = _model(req.model)
    if transformer is None and req.seq_len:
        raise MeshscaleError(f"--seq-len is for transformers; {req.model} takes images")
    if transformer is None and req.attention != "sdpa":
        raise MeshscaleError(f"--attention is for transformers; {req.model} has no attention")
    if transformer is not None and not req.seq_len:
        seq_len = min(transformer.max_seq_len, 2048)
    else:
        seq_len = req.seq_len or 0
    base = TrainingJob(transformer, ParallelLayout(), req.batch, seq_len, req.precision, req.checkpointing,
                       depth, req.channels_last, autocast, cuda_graph=req.cuda_graph,
                       sharding="none" if req.model in TRAIN_MODELS else "fsdp2", attention=req.attention)
    calibration = calibration_of(req, base)
    if req.search:
        return search_layouts(base, placement, gpu, req.global_batch or placement.world_size, calibration), gpu
    job = replace(base, layout=layout_of(req, placement.world_size, transformer is None))
    return [predict_step(job, placement, gpu, calibration)], gpu
