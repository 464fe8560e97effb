"""One training step of a layout on a fabric: compute per layer and pass, every parallel dimension's
collectives, the pipeline's bubble, memory, tokens per second and MFU.

Per micro-batch and layer, on the rank's critical path: the layer's kernels (forward; backward with what
checkpointing recomputes), tensor parallelism's two all-gathers and two reduce-scatters of the activations
each way (sequence parallelism, torchtitan's plan; a full recompute repeats the forward's), context
parallelism's all-gather of K and V forward and again with a reduce-scatter of their gradients backward
(torchtitan's default all-gather rotation, not overlapped), and with pipeline stages one send/recv of the
stage's output activations each way.

Pipeline (pp stages, m micro-batches, v virtual stages per rank for interleaved 1F1B): the stage runs
(m + (pp - 1) / v) x (forward + backward) of one micro-batch (GPipe and 1F1B: v = 1; Narayanan et al. 2021);
the bubble is what exceeds m x (forward + backward).

FSDP2 (shard group fsdp): each layer's parameters are all-gathered in the compute precision (fp32 under
torch.autocast, whose parameters stay fp32) before its forward
and (resharded after forward when there is no pipeline, FSDP2's default) again before its backward; its
gradients are reduce-scattered in fp32. FSDP2 prefetches the next layer's all-gather while this layer computes,
so per layer only what the collective takes beyond the layer's compute is exposed, plus the first all-gather
and the last reduce-scatter. Replicas (dp) all-reduce each layer's gradient shard in the same backward stream.
Without a pipeline this happens for every micro-batch (resharded after each forward, gradients reduced after
each backward, as FSDP2 and FSDP1 do under gradient accumulation unless told not to); under a pipeline the
layers stay gathered for the step and their gradients are reduced once.

Eager PyTorch issues every op from the host (HOST_SECONDS_PER_OP each, DTENSOR_HOST_SECONDS_PER_OP on DTensors:
tensor parallelism's ops, FSDP2's optimizer); the GPU runs ahead only as far as the host has issued, so each pass
(a layer's forward, its backward, the ends, the optimizer) takes the longer of its kernels' time and its ops' host
time; a CUDA-graphed step (train --cuda-graph) pays only the kernels.

A ResNet trains data parallel only: its gradients (fp32) all-reduced in DDP's 25 MiB buckets, overlapped with
backward (only what exceeds backward, and the last bucket, is exposed).

A collective that overlaps compute takes SMs from it: NCCL runs one thread block per channel, each resident on
an SM for the collective's duration, so the compute it overlaps runs on the SMs left and loses channels /
SM count of its progress for that time (`contention_seconds`).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from math import ceil, exp, log

from meshscale.errors import MeshscaleError
from meshscale.models.layout import CHECKPOINTING, ParallelLayout, check_layout
from meshscale.models.allocator import DEFAULT_NCCL_CHANNELS, Communicator
from meshscale.models.memory import RECIPES, MemoryEstimate, default_communicators, training_memory
from meshscale.models.transformer import TransformerConfig
from meshscale.predict.gradient_tensors import GradientTensor, resnet50_gradients, transformer_gradients
from meshscale.predict.profile import ComputeProfile
from meshscale.predict.training.comm import CollectiveCost, Allocation, collective_cost, collective_seconds
from meshscale.predict.training.framework import (DEFAULT_FRAMEWORK, StepFramework, bucket_params, check_framework,
                                                  framework_memory, framework_pass, fused_adam_kernels,
                                                  overlapped_tp_seconds, pipelined_exposed_s, step_framework)
from meshscale.predict.training.replicas import (GradientExchange, ReplicaCost, exposed_exchange_s,
                                                 replica_exchange)
from meshscale.predict.training.hardware import FULL_WIDTH, STEP_PRECISIONS, GpuSpec, storage_precision
from meshscale.models.atlas import BlockPoint
from meshscale.predict.training.measured import BLOCK_BYTES, compute_source, outside_block
from meshscale.predict.training.fp8 import FP8_RECIPES, amax_precompute, gathered_bytes, gathered_weights, gathers_fp8
from meshscale.predict.training.moe import (DEFAULT_IMBALANCE, all_to_all_costs, fsdp_layer_costs,
                                            layer_params_on_rank, sharded_params_on_rank)
from meshscale.predict.training.context import CP_METHODS, ring_exposed_s
from meshscale.predict.training.kernels import (ATTENTION_KERNELS, BlockShape, CategoryCalibration, Kernel, Rates,
                                               host_seconds, issue_seconds, kernel_seconds, rates, total_seconds)
from meshscale.models.images import (RESNET_BLOCKS, SMALL_CNN_CLASSES, SMALL_CNN_IMAGE, resnet_params,
                                     resnet_tensor_numels, resnet_tensors, small_cnn_tensor_numels)
from meshscale.predict.training.workload import (ROTARY_STYLES, SELECTIVE_POLICIES, PassKernels,
                                                 accumulation_kernels, ddp_bucket_copies, element_bytes,
                                                 fsdp2_reduce_kernels, fsdp2_unshard_kernels, optimizer_kernels,
                                                 layer_tensor_numels, end_tensor_numels, resnet_step,
                                                 small_cnn_step, transformer_ends, transformer_layer)

BACKWARD_SHARE = 2 / 3   # of a measured step without per-layer kernels: backward is about twice forward
# A step measured on one rank lacks what more ranks add to each step outside the exchange: the communication
# hooks, stream synchronizations and the optimizer's extra work (the kernel model prices these as kernels and
# host ops; a measured step has none to add them to). An assumption carried from the first data-parallel model.
MEASURED_STEP_DIST_S = 0.5e-3
SHARDINGS = ("fsdp2", "fsdp1", "none")


@dataclass(frozen=True)
class StepKernels:
    """One rank's kernels of one step by pass: ``layer`` runs ``stage_layers`` times per micro-batch, ``ends``
    once per micro-batch, ``per_step`` once (optimizer, gradient accumulation, a pipeline's unshards)."""

    layer: PassKernels
    ends: PassKernels
    per_step: tuple[Kernel, ...]
    stage_layers: int = 1
    micro_batches: int = 1

    def every(self) -> list[Kernel]:
        """Every kernel and host work of the step, counts multiplied out (micro-batches, layers of the stage)."""
        return [replace(x, count=count) for x, count in self._counted()]

    def _counted(self) -> list[tuple[Kernel, int]]:
        """Every kernel of the step with its count multiplied out (what `every` makes of it)."""
        per_layer = self.layer.forward + self.layer.backward + self.layer.recompute
        return ([(x, x.count * self.stage_layers * self.micro_batches) for x in per_layer]
                + [(x, x.count * self.micro_batches) for x in self.ends.forward + self.ends.backward]
                + [(x, x.count) for x in self.per_step])

    def host_ops(self) -> int:
        """The aten ops eager PyTorch issues from the host for the step."""
        return int(round(sum(k.ops * count for k, count in self._counted())))


def _fsdp2(job: TrainingJob, fw: StepFramework) -> bool:
    """Whether FSDP2 shards the job's layers (fully_shard per block): the job's sharding and its framework's."""
    return job.sharding == "fsdp2" and fw.sharding == "fsdp2"


def step_kernels(job: TrainingJob) -> StepKernels:
    """The kernels the step model prices for ``job`` (what `_transformer` and `_resnet` time, and what
    `breakdown` groups by category)."""
    precision = storage_precision(job.precision)   # tf32 stores and moves fp32; only its matmuls differ
    if job.small_cnn:
        k = small_cnn_step(job.batch, precision=precision, autocast=job.autocast)
        numels = small_cnn_tensor_numels()
        k = replace(k, backward=k.backward + (ddp_bucket_copies(sum(numels), len(numels)),))
        return StepKernels(k, PassKernels((), ()), tuple(optimizer_kernels(sum(numels), "adamw", numels)))
    if job.model is None:
        k = resnet_step(job.resnet_depth, job.batch, image=job.image, precision=precision,
                        channels_last=job.channels_last, autocast=job.autocast)
        params = resnet_params(job.resnet_depth)
        k = replace(k, backward=k.backward + (ddp_bucket_copies(params, resnet_tensors(job.resnet_depth)),))
        optimizer = optimizer_kernels(params, "sgd", resnet_tensor_numels(job.resnet_depth))
        return StepKernels(k, PassKernels((), ()), tuple(optimizer))
    model, layout = job.model, job.layout
    m = layout.micro_batches
    tokens = job.batch // m * job.seq_len / layout.cp
    fw = step_framework(job.framework)
    fsdp2 = _fsdp2(job, fw)
    fp8_gathered = gathers_fp8(job.precision, job.fp8_recipe, fsdp2)
    layer = transformer_layer(model, tokens, job.seq_len, tp=layout.tp, cp=layout.cp, precision=precision,
                              checkpointing=job.checkpointing, autocast=job.autocast,
                              selective_policy=job.selective_policy, rotary_style=job.rotary, ep=layout.ep,
                              moe_imbalance=job.moe_imbalance, fp8_recipe=job.fp8_recipe, cp_method=cp_method_of(job),
                              fp8_gathered=fp8_gathered)
    if fw.graph_layers:
        layer = in_compiled_block(layer, model, job.rotary)
    ends = transformer_ends(model, tokens, tp=layout.tp, precision=precision, autocast=job.autocast)
    stage_layers = ceil(model.layers / layout.pp)
    ends_params = model.embedding_params() + model.head_params() if layout.pp == 1 else \
        max(model.embedding_params(), model.head_params() or model.vocab_size * model.d_model)
    # this rank's share of each tensor (FSDP shards dim 0, tensor parallelism splits the matrices; the routed
    # experts split over ep)
    on_rank = sharded_params_on_rank(model, layout, stage_layers, ends_params)
    shards = layout.tp * layout.fsdp
    numels = [ceil(n / shards) for n in stage_layers * layer_tensor_numels(model, layout.ep) + end_tensor_numels(model)]
    per_step = _optimizer_step(job, fw, on_rank, numels)
    if fsdp2:
        param_bytes = gathered_bytes(job.precision, job.fp8_recipe, 4 if job.autocast else element_bytes(job.precision))
        gathered = layer_params_on_rank(model, layout.ep, layout.tp)
        fp8_weights = gathered_weights(list(layer.forward)) if fp8_gathered else (0.0, 0)
        unshard = fsdp2_unshard_kernels(model, gathered, layout.fsdp, param_bytes, fp8_weights=fp8_weights)
        if fp8_gathered:
            per_step.append(amax_precompute(stage_layers * fp8_weights[0] / layout.fsdp,
                                            stage_layers * fp8_weights[1]))
        root = fsdp2_unshard_kernels(model, ends_params / layout.tp, layout.fsdp, param_bytes, tensors=2)
        ends = replace(ends, forward=ends.forward + tuple(root),       # the root stays gathered until backward
                       backward=ends.backward + tuple(fsdp2_reduce_kernels(ends_params / layout.tp, layout.fsdp)))
        reduce = fsdp2_reduce_kernels(gathered, layout.fsdp)
        if layout.pp == 1:       # resharded after forward: gathered again before backward
            layer = replace(layer, forward=layer.forward + tuple(unshard),
                            backward=layer.backward + tuple(unshard + reduce))
        else:                    # a pipeline keeps its layers gathered and reduces once, for the step
            per_step += stage_layers * (unshard + reduce)
    layer = PassKernels(*(framework_pass(p, fw, layer=True) for p in (layer.forward, layer.backward, layer.recompute)))
    if fw.graph_layers and not compiles_loss(job, fw):   # compiled blocks, the loss left eager
        fw = replace(fw, fused_ends=tuple(n for n in fw.fused_ends if n != "cross-entropy"))
    ends = PassKernels(*(framework_pass(p, fw, layer=False) for p in (ends.forward, ends.backward, ends.recompute)))
    return StepKernels(layer, ends, tuple(per_step), stage_layers, m)


def compiles_loss(job: TrainingJob, fw: StepFramework) -> bool:
    """Whether torch.compile runs the job's loss: under a compiling framework, where the job's memory recipe (the
    engine that runs it) compiles it too (`MemoryRecipe.loss_under`: torchtitan since 2025-04; not meshscale's
    train, nor torchtitan of 2024), the rule the step's memory reads."""
    return RECIPES[fw.memory_recipe or job.memory_recipe].loss_under(fw.graph_layers) == "compiled"


def in_compiled_block(layer: PassKernels, model: TransformerConfig, style: str) -> PassKernels:
    """A layer whose block torch.compile runs: its memory ops inside the block's graph (all but those FSDP2 runs
    around it, `measured.outside_block`) are priced as the atlas's compiled blocks nearest this one ran."""
    shape = BlockShape(style, model.heads, model.kv_heads, model.d_model, model.ffn_dim)

    def tag(kernels: tuple[Kernel, ...]) -> tuple[Kernel, ...]:
        return tuple(replace(k, compiled_block=shape) if k.kind == "memory" and not outside_block(k.name) else k
                     for k in kernels)
    return PassKernels(tag(layer.forward), tag(layer.backward), tag(layer.recompute))


def compiled_block_bytes(point: BlockPoint) -> float:
    """The bytes the step model moves in the memory-bound kernels of one block as the atlas ran it (``point``:
    forward and backward, no checkpointing, bf16 weights without FSDP, so fp8's weights cast in the layer), as
    torch.compile runs it (or eager): what `MeasuredKernels.block_ratio` holds the measured seconds against."""
    model = TransformerConfig("atlas block", 1, point.d_model, point.heads, point.kv_heads, point.ffn_dim, 32000,
                              point.seq_len)
    fp8 = point.precision.startswith("fp8-")
    layer = transformer_layer(model, float(point.batch * point.seq_len), point.seq_len,
                              precision="fp8" if fp8 else "bf16", rotary_style=point.style,
                              fp8_recipe=point.precision[4:] if fp8 else "tensorwise")
    fw = step_framework("compile" if point.compiled else "eager")
    kernels = framework_pass(layer.forward, fw, layer=True) + framework_pass(layer.backward, fw, layer=True)
    return sum(k.bytes * k.count for k in kernels if k.kind == "memory" and not outside_block(k.name))


BLOCK_BYTES[:] = [compiled_block_bytes]


def cp_method_of(job: TrainingJob) -> str:
    """How the job's framework runs context parallelism: the job's own, else the framework's (Megatron:
    Transformer Engine's p2p ring; PyTorch: meshscale train's masked attention over the gathered keys)."""
    return job.cp_method or ("p2p" if job.framework == "megatron" else "masked")


def _check_framework_job(job: TrainingJob) -> None:
    """Refuse, in one line, a framework the job's model or layout does not run under, and a context-parallel
    attention its framework does not run."""
    layout = job.layout
    check_framework(job.framework, job.model is not None,
                    {"tp": layout.tp, "pp": layout.pp, "cp": layout.cp, "dp": layout.dp})
    if layout.cp > 1 and (cp_method_of(job) == "p2p") != (job.framework == "megatron"):
        raise MeshscaleError(f"--cp-attention {cp_method_of(job)}: Megatron runs Transformer Engine's p2p ring, "
                             "PyTorch masked (meshscale train), allgather or alltoall (torch's context_parallel)")


def _optimizer_step(job: TrainingJob, fw: StepFramework, on_rank: float, numels: list[int]) -> list[Kernel]:
    """The step's optimizer and gradient accumulation on this rank: PyTorch's foreach AdamW (on DTensors under
    FSDP2 or tensor parallelism) with each later micro-batch's gradients added into .grad, or a fused Adam on
    the framework's fp32 partition (ZeRO-1 accumulates the whole gradient, Megatron's wgrad GEMMs accumulate
    into its main gradients)."""
    layout, m = job.layout, job.layout.micro_batches
    shard = on_rank                                # this rank's share of the stage's parameters
    if not fw.fused_optimizer:
        dtensor_params = (job.sharding == "fsdp2" or layout.tp > 1) and fw.dtensor
        return optimizer_kernels(shard, "adamw", numels, dtensor_params) + (m - 1) * accumulation_kernels(shard)
    accumulated = 0.0 if fw.grad_accumulation_fusion else (shard * layout.fsdp if fw.sharding == "zero1" else shard)
    return fused_adam_kernels(shard, numels) + (m - 1) * accumulation_kernels(accumulated) * (accumulated > 0)


@dataclass(frozen=True)
class Calibration:
    """A measured profile's verdict on the datasheet roofline of the GPU that measured it, ``gpu_model``:
    measured step = host_s + factor x predicted kernels, or, for a host-bound profile, the longer of floor_s and
    factor x predicted kernels. ``factor`` scales every kernel (each then keeps its own bound on another GPU);
    ``categories``, where the profile measured its kernel time per category, moves each category to another GPU
    by its roofline and the SMs' own time (`CategoryCalibration`; the factor then holds what they leave).
    ``host_s`` (a fixed cost per step that does not grow with the batch) is carried over unchanged; ``floor_s``
    (the host's own time per step, which the GPU waits for when its kernels are shorter) is the measuring
    machine's CPU, so it bounds predictions for the same GPU model only."""

    factor: float
    gpu_model: str
    host_s: float = 0.0
    floor_s: float = 0.0
    categories: CategoryCalibration | None = None   # the profile's kernel time per category, where measured

    def describe(self, gpu_model: str = "") -> str:
        """What calibrated a prediction for ``gpu_model`` (the calibrating GPU's own when empty)."""
        host = f" + {self.host_s * 1e3:.1f} ms per step" if self.host_s else ""
        floor = ""
        if self.floor_s:
            floor = f", host-bound at {self.floor_s * 1e3:.1f} ms per step" if gpu_model in ("", self.gpu_model) \
                else ", its host's floor not carried"
        what = "per kernel category " if self.categories else ""
        return f"calibrated {what}on {self.gpu_model} (x{self.factor:.2f}{host}{floor})"


def fit_calibration(predicted_s: list[float], measured_s: list[float], gpu_model: str) -> Calibration:
    """measured = host + factor x predicted, by least squares over the profile's batches (two or more). The
    roofline is a lower bound of the kernels' time, so a factor below 1 means the step grew less than its
    kernels must: the host set the pace (eager PyTorch issuing ops slower than the GPU runs them), and the
    profile gives a floor (its shortest step) and at most the largest batch's measured / predicted as the
    factor. One batch, or a fit with a negative host cost, gives the factor alone (geometric mean of the
    ratios)."""
    n = len(predicted_s)
    if n >= 2:
        mp, mm = sum(predicted_s) / n, sum(measured_s) / n
        spread = sum((p - mp) ** 2 for p in predicted_s)
        if spread > 0:
            factor = sum((p - mp) * (m - mm) for p, m in zip(predicted_s, measured_s)) / spread
            host = mm - factor * mp
            if factor < 1:
                largest = max(range(n), key=lambda i: predicted_s[i])
                return Calibration(measured_s[largest] / predicted_s[largest], gpu_model, floor_s=min(measured_s))
            if host >= 0:
                return Calibration(factor, gpu_model, host)
    ratio = exp(sum(log(m / p) for p, m in zip(predicted_s, measured_s)) / n)
    return Calibration(ratio, gpu_model)


@dataclass(frozen=True)
class TrainingJob:
    """What trains: a transformer shape or a ResNet (``resnet_depth``), the layout, and the step's shape.
    ``batch``: sequences (images) per data-parallel rank per step, split into the layout's micro-batches."""

    model: TransformerConfig | None
    layout: ParallelLayout
    batch: int
    seq_len: int = 0
    precision: str = "bf16"
    checkpointing: str = "none"
    resnet_depth: int = 0
    channels_last: bool = True
    autocast: bool = False      # fp32 parameters under torch.autocast (train's engine), else FSDP2 mixed precision
    image: int = 224
    cuda_graph: bool = False    # the step replayed as a CUDA graph: no host cost per op
    selective_policy: str = "matmuls"   # selective checkpointing: meshscale's engine's, or torchtitan's own
    rotary: str = "pairs"       # Llama's rotary as meshscale's engine computes it, or torchtitan's complex one
    memory_recipe: str = "meshscale"   # how the framework holds memory (models/memory.RECIPES): train's engine
    sharding: str = "fsdp2"     # transformers: fsdp2 (fully_shard per block and root, as meshscale's engine and
    # torchtitan apply it, also on one rank), fsdp1 (flat parameters: llm-foundry's Composer), none (DDP)
    attention: str = "sdpa"     # the attention kernel (kernels.ATTENTION_KERNELS): sdpa, what PyTorch picks
    small_cnn: bool = False     # train's small CNN (its kernels: `workload.small_cnn_step`) in place of a ResNet
    exchange: GradientExchange = GradientExchange()   # replicas' gradient exchange (unsharded data parallelism)
    framework: str = DEFAULT_FRAMEWORK   # what runs the step (framework.STEP_FRAMEWORKS): eager PyTorch by default
    cp_method: str = ""         # context parallelism's attention (context.CP_METHODS); "": the framework's
    measured: ComputeProfile | None = None   # the step as measured on this GPU, where it stands for the kernels
    measured_gradients: tuple[GradientTensor, ...] | None = None   # when backward completed each, as a profile saw it
    moe_imbalance: float = DEFAULT_IMBALANCE   # mixture of experts: the busiest ep rank's routed tokens / the mean
    fp8_recipe: str = "tensorwise"   # --precision fp8: torchao's float8 scaling (fp8.FP8_RECIPES)

    @property
    def name(self) -> str:
        if self.small_cnn:
            return "small-cnn"
        return self.model.name if self.model else f"resnet{self.resnet_depth}"

    def gradients(self) -> list[GradientTensor]:
        """The gradient tensors in parameter order, with when backward completes each: as a profile of this
        model measured them, else from the model's layers."""
        found = self.measured_gradients
        if self.small_cnn:
            return [GradientTensor(n) for n in small_cnn_tensor_numels()]
        if found and sum(g.elements for g in found) == self.params():
            return list(found)
        if self.model is None:
            if self.resnet_depth == 50:
                return resnet50_gradients()
            return [GradientTensor(n) for n in resnet_tensor_numels(self.resnet_depth)]
        return transformer_gradients(self.model, self.layout.ep)

    @property
    def samples_per_step(self) -> int:
        return self.batch * self.layout.data_parallel

    def params(self) -> int:
        """The model's parameters."""
        if self.model is not None:
            return self.model.params()
        if self.small_cnn:
            return sum(small_cnn_tensor_numels())
        return resnet_params(self.resnet_depth)

    def model_flops_per_sample(self) -> float:
        """Training FLOPs per sample as MFU counts them, from the model registry's one count per family
        (transformers: PaLM's 6N + attention per token; image models: 3 x 2 x their multiply-adds)."""
        if self.measured is not None:
            return 0.0
        if self.model:
            return self.model.training_flops_per_token(self.seq_len) * self.seq_len
        from meshscale.models.registry import resnet_size, small_cnn_size
        if self.small_cnn:
            return small_cnn_size("small-cnn", 3, SMALL_CNN_IMAGE, SMALL_CNN_IMAGE, SMALL_CNN_CLASSES)[1]
        return resnet_size(f"resnet{self.resnet_depth}", 3, self.image, self.image, 1000)[1]


@dataclass
class TrainingPrediction:
    """One predicted step of one layout (seconds per step, per rank on the slowest pipeline stage)."""

    job: TrainingJob
    allocation: Allocation
    gpu: GpuSpec
    compute_source: str
    step_s: float
    compute_s: float            # kernels of forward, backward, recompute and the optimizer
    tp_s: float = 0.0           # tensor-parallel collectives (critical path)
    cp_s: float = 0.0           # context-parallel exchange (critical path)
    pp_s: float = 0.0           # pipeline send/recv (critical path)
    bubble_s: float = 0.0       # pipeline fill and drain
    sharding_s: float = 0.0     # FSDP all-gather / reduce-scatter not hidden by compute
    replica_s: float = 0.0      # data-parallel all-reduce not hidden by backward
    exchange_s: float = 0.0     # replicas' whole gradient exchange (unsharded data parallelism), hidden or not
    nccl_algo: str = ""         # what NCCL ran for the largest of those exchanges
    host_s: float = 0.0         # a calibration's fixed cost per step
    contention_s: float = 0.0   # compute slowed by the SMs overlapped collectives occupy
    ep_s: float = 0.0           # expert parallelism's dispatch and combine all-to-alls (critical path)
    launch_s: float = 0.0       # passes the host took longer to issue than the GPU to run (part of compute_s)
    host_ops: int = 0           # aten ops eager PyTorch issues a step on the rank (0: a CUDA graph)
    memory: MemoryEstimate | None = None
    notes: list[str] = field(default_factory=list)
    rates: Rates | None = None  # what the kernels were timed with (for `synced_step_seconds`)

    @property
    def samples_per_s(self) -> float:
        return self.job.samples_per_step / self.step_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.samples_per_s * max(1, self.job.seq_len) / self.allocation.world_size

    @property
    def mfu(self) -> float:
        if self.job.measured is not None or not self.gpu.fp32_flops:
            return 0.0
        # fp8 trains its linears on the fp8 tensor cores and the rest in bf16: MFU against the bf16 peak (torchtitan
        # reports none for float8 runs; Megatron-Bridge gives model TFLOP/s, which this times the bf16 peak is)
        peak = self.gpu.matmul_flops("bf16" if self.job.precision == "fp8" else self.job.precision)
        return self.samples_per_s * self.job.model_flops_per_sample() / self.allocation.world_size / peak

    @property
    def fits(self) -> bool:
        """yes or tight (`memory_verdict`): the layout may run."""
        return self.memory is None or self.memory.fits(self.gpu.memory_bytes)

    @property
    def memory_verdict(self) -> str:
        """yes, tight or no (MemoryEstimate.verdict); "-" where no memory is modelled (image models)."""
        return self.memory.verdict(self.gpu.memory_bytes) if self.memory is not None else "-"

    @property
    def memory_margin_bytes(self) -> float | None:
        """The device's memory less the predicted peak (negative: over)."""
        return self.memory.margin(self.gpu.memory_bytes) if self.memory is not None else None

    def exposed(self) -> dict[str, float]:
        """Seconds per step beyond the kernels' own time, by cause (host-bound ops are inside compute_s)."""
        return {"tensor parallel": self.tp_s, "context parallel": self.cp_s, "expert all-to-all": self.ep_s,
                "pipeline send/recv": self.pp_s,
                "pipeline bubble": self.bubble_s, "FSDP gather/reduce": self.sharding_s,
                "replica all-reduce": self.replica_s, "host per step": self.host_s,
                "SMs held by NCCL": self.contention_s, "host-bound ops": self.launch_s}

    def why(self) -> str:
        """The step's largest costs beyond compute, in words."""
        parts = sorted(((v, k) for k, v in self.exposed().items() if v > 0.005 * self.step_s), reverse=True)
        if not parts:
            return "compute-bound: nothing exposed"
        return ", ".join(f"{k} {v / self.step_s:.0%}" for v, k in parts[:2]) + " of the step exposed"


def check_job(job: TrainingJob, world_size: int) -> None:
    """Refuse a job that cannot run, in one line naming the field."""
    for name, value, choices in (("--precision", job.precision, STEP_PRECISIONS),
                                 ("selective_policy", job.selective_policy, SELECTIVE_POLICIES),
                                 ("rotary", job.rotary, ROTARY_STYLES), ("sharding", job.sharding, SHARDINGS),
                                 ("memory_recipe", job.memory_recipe, tuple(RECIPES)),
                                 ("--attention", job.attention, ATTENTION_KERNELS),
                                 ("--activation-checkpointing", job.checkpointing, CHECKPOINTING),
                                 ("--fp8-recipe", job.fp8_recipe, FP8_RECIPES),
                                 ("--cp-attention", cp_method_of(job), CP_METHODS)):
        if value not in choices:
            raise MeshscaleError(f"{name} {value}: use one of {', '.join(choices)}")
    if not job.moe_imbalance >= 1:
        raise MeshscaleError(f"--moe-imbalance {job.moe_imbalance}: the busiest rank's tokens over the mean is at least 1")
    _check_framework_job(job)
    if job.batch < 1:
        raise MeshscaleError(f"--batch {job.batch}: must be at least 1")
    if job.model is None:
        if job.measured is None and not job.small_cnn and job.resnet_depth not in RESNET_BLOCKS:
            raise MeshscaleError(f"resnet{job.resnet_depth}: depths {', '.join(map(str, RESNET_BLOCKS))} are known")
        layout = job.layout
        if layout.tp > 1 or layout.pp > 1 or layout.cp > 1:
            raise MeshscaleError(f"{job.name} trains data parallel only: drop --tp, --pp and --cp")
        if layout.fsdp > 1 and layout.dp > 1 or layout.fsdp > 1 and job.measured is None:
            raise MeshscaleError(f"--fsdp shards a transformer's parameters (FSDP2); {job.name} trains under DDP: "
                                 "use --dp")
        if layout.micro_batches > 1:
            raise MeshscaleError(f"--micro-batches splits a transformer's step; {job.name} takes its batch whole")
        if job.checkpointing != "none":
            raise MeshscaleError(f"--activation-checkpointing is for transformers; {job.name} keeps its activations")
        check_layout(layout, world_size)
        return
    if job.seq_len < 1:
        raise MeshscaleError(f"--seq-len {job.seq_len}: must be at least 1")
    check_layout(job.layout, world_size, job.model, job.seq_len, job.batch)
    if job.batch % job.layout.micro_batches:
        raise MeshscaleError(f"--batch {job.batch}: must be divisible by --micro-batches {job.layout.micro_batches}")


def predict_step(job: TrainingJob, allocation: Allocation, gpu: GpuSpec,
                 calibration: Calibration | None = None) -> TrainingPrediction:
    """Predict one step of ``job`` on ``allocation``'s GPUs."""
    check_job(job, allocation.world_size)
    if job.measured is not None:   # timed by its measured step: no kernels, no rates
        found = _replicated(job, allocation, gpu, None, f"measured step: {job.measured.source or 'profile'}")
        return found
    r = rates(gpu, job.precision, calibration.factor if calibration else 1.0, job.attention, job.fp8_recipe)
    if calibration and calibration.categories:
        r = replace(r, calibrated=calibration.categories)
    source = calibration.describe(gpu.model) if calibration else compute_source(gpu, job.precision)
    if job.framework != DEFAULT_FRAMEWORK:
        source += f", {job.framework}"
    if job.model is None:   # a CNN's ops (or a measured step's): the host cost of that op mix
        r = replace(r, host_s_per_op=r.conv_host_s_per_op)
    found = _replicated(job, allocation, gpu, r, source) if job.model is None else _transformer(job, allocation, gpu, r, source)
    found.rates = r
    if calibration and calibration.host_s:
        found.host_s = calibration.host_s
        found.step_s += calibration.host_s
    # a host-bound profile's floor is its machine's CPU: it holds for that GPU's predictions, not another's
    if calibration and calibration.floor_s > found.step_s and calibration.gpu_model == gpu.model:
        found.host_s = calibration.floor_s - found.step_s
        found.step_s = calibration.floor_s
    return found


def _pass_seconds(kernels: tuple[Kernel, ...] | list[Kernel], r: Rates, job: TrainingJob) -> tuple[float, float]:
    """A pass's time: its kernels, or the host's issuing of their ops where that is longer (eager only); and
    how much longer the host made it."""
    gpu = total_seconds(list(kernels), r)
    host = 0.0 if job.cuda_graph else host_seconds(list(kernels), r)
    return max(gpu, host), max(0.0, host - gpu)


def _issue_order(kernels: StepKernels) -> tuple[list[tuple[tuple[Kernel, ...], int]], int, tuple[Kernel, ...]]:
    """The step's kernels in the order the host issues them: one micro-batch's as (kernels, times in a row) --
    the layers' forwards, the ends forward and backward, the layers' backwards (with what they recompute) --,
    how many micro-batches, then the per-step kernels."""
    layer, ends = kernels.layer, kernels.ends
    micro_batch = [(layer.forward, kernels.stage_layers), (ends.forward + ends.backward, 1),
                   (layer.recompute + layer.backward, kernels.stage_layers)]
    return micro_batch, kernels.micro_batches, kernels.per_step


# The issue timeline as a map of d = (GPU done) - (host issued): issuing a kernel that takes i on the host and
# runs r on the GPU turns d into max(d - i, 0) + r = max(d + (r - i), r). Such maps, max(d + a, b), compose into
# one of the same form, so a block repeated n times is one map too and the timeline costs the kernels of one
# micro-batch, not micro-batches x layers x kernels. A map is (a, b, host seconds, GPU seconds).
_NO_KERNELS = (0.0, float("-inf"), 0.0, 0.0)


def _then(first: tuple, second: tuple) -> tuple:
    a1, b1, i1, r1 = first
    a2, b2, i2, r2 = second
    return a1 + a2, max(b1 + a2, b2), i1 + i2, r1 + r2


def _repeated(block: tuple, n: int) -> tuple:
    """``block`` ``n`` times in a row: max(d + n a, b + max(0, (n - 1) a))."""
    if n <= 0:
        return _NO_KERNELS
    a, b, i, r = block
    return n * a, b + max(0.0, (n - 1) * a), n * i, n * r


def _as_map(times: list[tuple[float, float]]) -> tuple:
    block = _NO_KERNELS
    for issue_s, run_s in times:
        block = _then(block, (run_s - issue_s, run_s, issue_s, run_s))
    return block


def timeline_map(blocks: list[tuple[list[tuple[float, float]], int]]) -> tuple:
    """``blocks`` -- each a list of (issue s, run s) of kernels, repeated so many times in a row -- as one map."""
    timeline = _NO_KERNELS
    for times, repeat in blocks:
        timeline = _then(timeline, _repeated(_as_map(times), repeat))
    return timeline


def timeline_ends(timeline: tuple) -> tuple[float, float, float]:
    """(host seconds, GPU busy seconds, when the GPU finishes) of a timeline issued from an idle GPU."""
    a, b, host_s, gpu_s = timeline
    return host_s, gpu_s, host_s + max(a, b, 0.0)


def synced_step_seconds(p: TrainingPrediction) -> float:
    """The step as a loop that synchronizes the device after every step measures it (`train`'s timed mode):
    the step starts with the GPU idle and nothing queued, so the GPU runs each kernel only once the host has
    issued it (`issue_seconds`) and the previous kernel is done, and the host's lead-in is exposed.
    Without the sync (`train --no-timing`, and `step_s`) the host runs ahead across steps and a step costs the
    longer of its kernels and its ops' host time; the difference between the two, on the same kernels, is
    added to ``step_s``. A CUDA-graphed step replays from one launch: nothing added."""
    if p.job.cuda_graph or p.rates is None or p.job.measured is not None:
        return p.step_s
    micro_batch, micro_batches, per_step = _issue_order(step_kernels(p.job))

    def times(kernels: tuple[Kernel, ...]) -> list[tuple[float, float]]:
        return [(issue_seconds(k, p.rates), kernel_seconds(k, p.rates)) for k in kernels]

    one = timeline_map([(times(kernels), repeat) for kernels, repeat in micro_batch])
    host_total, gpu_total, gpu = timeline_ends(_then(_repeated(one, micro_batches), _as_map(times(per_step))))
    return p.step_s + max(0.0, gpu - max(gpu_total, host_total))


def contention_seconds(costs: list[CollectiveCost], overlapped_s: float, sm_count: int) -> float:
    """Compute progress lost while ``costs`` (run one after another) overlap ``overlapped_s`` of compute: for as
    long as both run, the collectives' channels are SMs the compute does not have."""
    busy = sum(c.seconds for c in costs)
    if busy <= 0 or sm_count <= 0:   # no SMs known (a device without a datasheet): nothing to take
        return 0.0
    channels = max(c.channels for c in costs)
    return min(busy, overlapped_s) * min(1.0, channels / sm_count)


def _passes_of(job: TrainingJob, r: Rates) -> tuple[tuple[float, float, float], float]:
    """(forward, backward, optimizer) seconds of an unsharded replica's step, and how much of it the host's
    issuing made longer: its kernels, or a model without them, its measured step (backward BACKWARD_SHARE of
    it, the optimizer inside)."""
    if job.measured is not None:
        step = job.measured.step_time(job.batch)
        return (step * (1 - BACKWARD_SHARE), step * BACKWARD_SHARE, 0.0), 0.0
    kernels = step_kernels(job)
    (forward, wait_f), (backward, wait_b) = (_pass_seconds(kernels.layer.forward, r, job),
                                             _pass_seconds(kernels.layer.backward, r, job))
    optimizer, wait_o = _pass_seconds(kernels.per_step, r, job)
    return (forward, backward, optimizer), wait_f + wait_b + wait_o


def _replicated(job: TrainingJob, allocation: Allocation, gpu: GpuSpec, r: Rates, source: str) -> TrainingPrediction:
    """A ResNet, or a model timed by its measured step: data parallel only, its replicas exchanging gradients
    as the framework does (`replicas.replica_exchange`), overlapped with backward where it overlaps."""
    (forward, backward, optimizer), launch = _passes_of(job, r)
    compute = forward + backward + optimizer
    group = job.layout.group_ranks("dp") if job.layout.dp > 1 else job.layout.group_ranks("fsdp")
    found = replica_exchange(job.exchange, job.gradients(), group, allocation, backward, forward + backward)
    p = _with_replicas(TrainingPrediction(job, allocation, gpu, source, compute, compute, launch_s=launch,
                                          host_ops=0 if job.cuda_graph or job.measured is not None
                                          else step_kernels(job).host_ops()), found, backward, gpu)
    if job.measured is not None and len(group) > 1:   # what one rank's measured step did not do
        p.host_s, p.step_s = MEASURED_STEP_DIST_S, p.step_s + MEASURED_STEP_DIST_S
    return p


def _with_replicas(p: TrainingPrediction, found: ReplicaCost, backward_s: float, gpu: GpuSpec) -> TrainingPrediction:
    """``p`` with its replicas' exchange: the exposed part added to the step, and the SMs the overlapped
    all-reduces hold taken from the backward they overlap (all but the last bucket overlap)."""
    overlapped = list(found.costs[:-1]) if p.job.exchange.spec and p.job.exchange.spec.overlap else []
    contention = contention_seconds(overlapped, backward_s, gpu.sm_count)
    p.step_s += found.exposed_s + contention
    p.replica_s, p.exchange_s, p.nccl_algo = found.exposed_s, found.total_s, found.chosen
    p.contention_s += contention
    return p


def _transformer(job: TrainingJob, allocation: Allocation, gpu: GpuSpec, r: Rates, source: str) -> TrainingPrediction:
    model, layout = job.model, job.layout
    e = element_bytes(job.precision)
    m = layout.micro_batches
    tokens = job.batch // m * job.seq_len / layout.cp
    kernels = step_kernels(job)
    layer, ends, stage_layers = kernels.layer, kernels.ends, kernels.stage_layers
    layer_f, wait_lf = _pass_seconds(layer.forward, r, job)
    layer_b, wait_lb = _pass_seconds(layer.backward + layer.recompute, r, job)

    def cost(name: str, nbytes: float, dim: str) -> CollectiveCost:
        return collective_cost(name, nbytes, layout.group_ranks(dim), allocation) if getattr(layout, dim) > 1 \
            else CollectiveCost(0.0)

    activation = tokens * model.d_model * e
    tp_f, tp_b = _tp_seconds(job, layer, r, cost, activation)
    kv = tokens * 2 * model.kv_dim / layout.tp * e   # this rank's K and V of one micro-batch
    cp_f, cp_b = _cp_seconds(job, layer, r, cost, allocation, kv)
    hop = collective_seconds("send_recv", activation / layout.tp, layout.group_ranks("pp")[:2], allocation) \
        if layout.pp > 1 else 0.0
    # expert parallelism: each MoE layer's dispatch and combine (and the token counts before the dispatch),
    # again in backward and in a full recompute; by the share of MoE layers
    a2a, splits = all_to_all_costs(model, layout, tokens, allocation, job.moe_imbalance, e)
    ep_f = model.moe_share() * (2 * a2a.seconds + splits.seconds)
    ep_b = model.moe_share() * 2 * a2a.seconds + (ep_f if job.checkpointing == "full" else 0.0)

    (ends_f, wait_ef), (ends_b, wait_eb) = _pass_seconds(ends.forward, r, job), _pass_seconds(ends.backward, r, job)
    forward = stage_layers * (layer_f + tp_f + cp_f + ep_f) + ends_f + hop
    backward = stage_layers * (layer_b + tp_b + cp_b + ep_b) + ends_b + hop
    v = layout.stages_per_rank if layout.pp_schedule == "interleaved-1f1b" else 1
    pipeline = (m + (layout.pp - 1) / v) * (forward + backward) if layout.pp > 1 else m * (forward + backward)
    bubble = pipeline - m * (forward + backward)

    fw = step_framework(job.framework)
    if fw.sharding in ("fsdp2", "zero3"):
        sharding, replica, contention, costs = _fsdp_seconds(job, fw, gpu, allocation, layer_f, layer_b,
                                                             stage_layers)
    else:
        replica = 0.0
        sharding, contention, costs = _partitioned_seconds(job, fw, gpu, cost, (stage_layers * layer_f + ends_f,
                                                                                stage_layers * layer_b + ends_b))
    optimizer, wait_o = _pass_seconds(kernels.per_step, r, job)
    launch = m * (stage_layers * (wait_lf + wait_lb) + wait_ef + wait_eb) + wait_o
    compute = m * (stage_layers * (layer_f + layer_b) + ends_f + ends_b) + optimizer
    step = pipeline + sharding + replica + optimizer + contention
    costs.update(tp=cost("all_gather", activation, "tp"),
                 cp=cost("all_gather", kv * layout.cp, "cp"))
    memory = job_memory(job, communicators(layout, costs, allocation.gpus_per_node))
    found = TrainingPrediction(job, allocation, gpu, source, step, compute,
                               tp_s=m * stage_layers * (tp_f + tp_b), cp_s=m * stage_layers * (cp_f + cp_b),
                               ep_s=m * stage_layers * (ep_f + ep_b),
                               pp_s=m * 2 * hop, bubble_s=bubble, sharding_s=sharding, replica_s=replica,
                               contention_s=contention, launch_s=launch, memory=memory,
                               host_ops=0 if job.cuda_graph else kernels.host_ops())
    ddp = job.sharding == "none" and layout.tp == layout.pp == layout.cp == 1   # whole replicas: DDP's buckets
    if not ddp or layout.dp < 2:
        return found
    # the last micro-batch's backward exchanges the accumulated gradients; the optimizer waits for it
    backward = stage_layers * layer_b + ends_b
    exchange = replica_exchange(job.exchange, job.gradients(), layout.group_ranks("dp"), allocation, backward,
                                pipeline)
    return _with_replicas(found, exchange, backward, gpu)


def stage_params(job: TrainingJob) -> float:
    """The parameters of the job's (largest) pipeline stage on one rank, before any data-parallel sharding (its
    tensor-parallel share; of the routed experts, its own: experts / ep)."""
    model, layout = job.model, job.layout
    ends = model.embedding_params() + model.head_params() if layout.pp == 1 else \
        max(model.embedding_params(), model.head_params() or model.vocab_size * model.d_model)
    return ceil(model.layers / layout.pp) * layer_params_on_rank(model, layout.ep, layout.tp) + ends / layout.tp


def _fsdp_seconds(job: TrainingJob, fw: StepFramework, gpu: GpuSpec, allocation: Allocation, layer_f: float,
                  layer_b: float, stage_layers: int) -> tuple[float, float, float]:
    """(exposed gathers and reductions, exposed replica all-reduce, compute lost to their SMs) of FSDP2's step,
    or ZeRO-3's (the same per-layer schedule, its gradients on the wire in the framework's precision), per layer
    of this stage over the whole step (a mixture of experts' routed experts over their own groups,
    `moe.fsdp_layer_costs`); autocast keeps (and gathers) fp32 parameters, fp8's tensorwise recipe gathers its
    linears' weights in fp8."""
    model, layout, m = job.model, job.layout, job.layout.micro_batches
    param_bytes = gathered_bytes(job.precision, job.fp8_recipe, 4 if job.autocast else element_bytes(job.precision))
    ddp = job.sharding == "none" and layout.tp == layout.pp == layout.cp == 1   # whole replicas: DDP's buckets
    gather_c, reduce_c, replicate_c = fsdp_layer_costs(model, layout, allocation, param_bytes, ddp,
                                                       fw.wire_bytes or 4.0)
    gather, reduce, replicate = gather_c.seconds, reduce_c.seconds, replicate_c.seconds
    backward_gather = gather if layout.pp == 1 else 0.0       # torchtitan keeps layers unsharded under a pipeline
    rounds = m if layout.pp == 1 else 1                       # gathers and reductions per layer per step
    per_round = m // rounds                                   # micro-batches each round's collectives overlap
    contention = rounds * stage_layers * (
        contention_seconds([gather_c], per_round * layer_f, gpu.sm_count)
        + contention_seconds([gather_c] * (layout.pp == 1) + [reduce_c, replicate_c], per_round * layer_b,
                             gpu.sm_count))
    sharding = gather + rounds * stage_layers * max(0.0, gather - per_round * layer_f)
    tail = reduce + replicate
    exposed_backward = rounds * stage_layers * max(0.0, backward_gather + tail - per_round * layer_b) + tail
    replica = exposed_backward * (replicate / tail) if tail else 0.0
    return sharding + exposed_backward - replica, replica, contention, {"fsdp": gather_c, "dp": replicate_c}


def _partitioned_seconds(job: TrainingJob, fw: StepFramework, gpu: GpuSpec, cost,
                         passes_s: tuple[float, float]) -> tuple[float, float, dict[str, CollectiveCost]]:
    """(exposed, compute lost to their SMs, the largest gather by dimension) of a step whose optimizer is partitioned over the --fsdp group and
    whose parameters are not (framework.py): the gradients reduce-scattered and the updated parameters
    all-gathered in buckets once per step (ZeRO-2: the gradients after every micro-batch). Megatron overlaps the
    reductions with the last micro-batch's backward (a bucket starts once backward has made its gradients) and
    the gathers with the next step's first forward (a bucket is waited for where forward first needs it),
    ``passes_s`` (forward, backward) of one micro-batch on this stage; ZeRO-1 and ZeRO-2 wait for both."""
    layout = job.layout
    if layout.fsdp == 1:
        return 0.0, 0.0, {}
    buckets = bucket_params(fw, stage_params(job), layout.fsdp)
    reduces = [cost("reduce_scatter", b * fw.wire_bytes, "fsdp") for b in buckets]
    gathers = [cost("all_gather", b * element_bytes(job.precision), "fsdp") for b in buckets]
    if fw.sharding != "distopt":
        times = layout.micro_batches if fw.sharding == "zero2" else 1
        return times * sum(c.seconds for c in reduces) + sum(c.seconds for c in gathers), 0.0, {"fsdp": gathers[0]}
    forward, backward = passes_s
    total, done, ready = sum(buckets), 0.0, []
    for b in buckets:
        done += b
        ready.append(done / total)
    reduced = exposed_exchange_s([c.seconds for c in reduces], ready, backward, backward)
    needed = [forward * (1 - share) for share in reversed(ready)]   # the first layers' bucket first
    gathered = pipelined_exposed_s([c.seconds for c in reversed(gathers)], needed)
    contention = contention_seconds(reduces, backward, gpu.sm_count) + contention_seconds(gathers, forward,
                                                                                         gpu.sm_count)
    return reduced + gathered, contention, {"fsdp": gathers[0]}


_QKV, _OUT, _MLP_IN, _DOWN = ("wq", "wk", "wv"), ("attention out",), ("w1 (gate)", "w3 (up)", "fc"), \
    ("w2 (down)", "fc out")


def _tp_seconds(job: TrainingJob, layer: PassKernels, r: Rates, cost, activation: float) -> tuple[float, float]:
    """Per layer and micro-batch, forward and backward: sequence parallelism's two all-gathers and two
    reduce-scatters of the activations each way (a full recompute repeats the forward's), exposed; under a
    framework that runs them beside the linears they feed or drain (Megatron's tp_comm_overlap: the all-gather
    before Q/K/V and before the MLP, the reduce-scatter after the output projection and after the down
    projection; backward the reverse, beside each linear's two backward products), what
    `framework.overlapped_tp_seconds` leaves."""
    layout = job.layout
    if layout.tp == 1:
        return 0.0, 0.0
    gather, scatter = (cost(c, activation, "tp").seconds for c in ("all_gather", "reduce_scatter"))
    recompute = job.checkpointing == "full"
    if not step_framework(job.framework).tp_overlap:
        forward = 2 * (gather + scatter)
        return forward, forward * (2 if recompute else 1)

    def gemm_s(kernels: tuple[Kernel, ...], names: tuple[str, ...], suffixes: tuple[str, ...]) -> float:
        wanted = {n + x for n in names for x in suffixes}
        return sum(kernel_seconds(k, r) for k in kernels if k.name in wanted)
    f_pairs = [(c, gemm_s(layer.forward, g, ("",))) for c, g in
               ((gather, _QKV), (scatter, _OUT), (gather, _MLP_IN), (scatter, _DOWN))]
    b_pairs = [(c, gemm_s(layer.backward, g, (" dgrad", " wgrad"))) for c, g in
               ((scatter, _QKV), (gather, _OUT), (scatter, _MLP_IN), (gather, _DOWN))]
    forward = overlapped_tp_seconds(f_pairs, layout.tp)
    return forward, overlapped_tp_seconds(b_pairs, layout.tp) + (forward if recompute else 0.0)


def _cp_seconds(job: TrainingJob, layer: PassKernels, r: Rates, cost, allocation: Allocation,
                kv_bytes: float) -> tuple[float, float]:
    """Per layer and micro-batch, forward and backward: what context parallelism's exchange of this rank's K and
    V (``kv_bytes``) leaves exposed (context.py): masked, the all-gather forward and the reduce-scatter of their
    gradients backward (a full recompute gathers again); a ring, what its rounds' kernels do not hide."""
    layout = job.layout
    if layout.cp == 1:
        return 0.0, 0.0
    method, recompute = cp_method_of(job), job.checkpointing == "full"
    gather = cost("all_gather", kv_bytes * layout.cp, "cp").seconds
    if method == "masked":
        return gather, gather * (2 if recompute else 1) + cost("reduce_scatter", kv_bytes * layout.cp, "cp").seconds
    pair = layout.group_ranks("cp")[:2]
    hop = collective_seconds("send_recv", kv_bytes, pair, allocation)
    # torch's ring sends the gradients in fp32 (its accumulators); Transformer Engine's in the activations'
    grad_hop = hop if method == "p2p" else collective_seconds("send_recv", kv_bytes * 4 / element_bytes(
        job.precision), pair, allocation)

    def rounds(kernels: tuple[Kernel, ...]) -> list[float]:
        found = [k for k in kernels if k.kind == "attention"]
        return [t for k in found for t in [kernel_seconds(k, r) / max(1, k.count)] * k.count]
    forward = ring_exposed_s(method, rounds(layer.forward), gather, hop, grad_hop, False)
    backward = ring_exposed_s(method, rounds(layer.backward), gather, hop, grad_hop, True)
    return forward, backward + (forward if recompute else 0.0)


def communicators(layout: ParallelLayout, costs: dict[str, CollectiveCost], gpus_per_node: int) -> tuple[Communicator, ...]:
    """The NCCL communicators of a rank (`default_communicators`, the memory model's), each collective group on
    the channels its step's largest collective runs on (NCCL's model), with NVLS buffers where NCCL's model picks
    NVLS for it."""
    out = []
    for c in default_communicators(layout):
        cost = costs.get("fsdp" if c.name == "shard" else c.name) if c.name in ("tp", "cp", "shard", "dp") else None
        if cost is not None or c.name in ("tp", "cp", "shard", "dp"):
            cost = cost or CollectiveCost(0.0)
            nvls = min(c.ranks, gpus_per_node) if cost.chosen.lower().startswith("nvls") else 0
            c = replace(c, channels=cost.channels or DEFAULT_NCCL_CHANNELS, nvls_gpus=nvls)
        out.append(c)
    return tuple(out)


def job_memory(job: TrainingJob, comms: tuple[Communicator, ...] | None = None) -> MemoryEstimate:
    """The memory model's estimate for a transformer job (models/memory.training_memory) under its framework:
    the framework's memory recipe where it has one (Megatron's, DeepSpeed's), the job's otherwise; ZeRO's
    partitioned state over the --fsdp group (`framework.framework_memory`). A compiled step (its layers from a
    graph) saves what its compiled blocks and loss save; fp8's tensorwise recipe gathers the layers in fp8 under FSDP2
    (as the step model prices its all-gathers, `fp8.gathers_fp8`)."""
    fw = step_framework(job.framework)
    found = training_memory(job.model, job.layout, batch=job.batch, seq_len=job.seq_len,
                            precision="fp32" if job.precision in FULL_WIDTH else "bf16",
                            checkpointing=job.checkpointing, selective_policy=job.selective_policy,
                            recipe=fw.memory_recipe or job.memory_recipe, sharding=job.sharding,
                            autocast=job.autocast, moe_imbalance=job.moe_imbalance, communicators=comms,
                            compiled=fw.graph_layers,
                            fp8_gather=gathers_fp8(job.precision, job.fp8_recipe, _fsdp2(job, fw)))
    return framework_memory(found, fw, stage_params(job), job.layout.fsdp)
