"""The software that runs a transformer's training step (`predict --framework`), and what each one does to the
step the kernels model (`step.step_kernels`, `step.predict_step`) prices. One meaning: the framework is what runs
the step; for whole replicas (ResNets, DDP models) the exchange frameworks of `predict.frameworks` (ddp, horovod,
cntk-2016) name it, and the step itself is eager PyTorch's.

- eager (the default): eager PyTorch as `meshscale train` and torchtitan run it: every aten op issued from the
  host through the dispatcher (and through DTensor's under tensor parallelism and for FSDP2's sharded
  parameters), each element-wise op its own kernel, FSDP2 per layer (workload.py, step.py).
- compile: torch.compile as torchtitan applies it (torchtitan, distributed/compile.py `apply_compile`: each
  TransformerBlock compiled, fullgraph; components/loss.py: the loss compiled too). Inductor fuses each chain of
  element-wise ops between two matrix products (or attention) into one generated kernel that reads the chain's
  inputs and writes its outputs once (`Kernel.fused_bytes`: rotary's casts and products, SwiGLU's SiLU and
  product, autocast's input casts into the norm that feeds them, the loss's softmax and its backward); matrix
  products and attention stay the library's kernels. The compiled block is one graph: its kernels are launched
  from generated code without the dispatcher and autograd per op (one host launch each, DTensor traced away,
  its redistributions functional collectives in the graph); what stays outside the blocks (FSDP2's hooks and
  copies, the embedding, the head, the optimizer) stays eager.
- megatron: Megatron-Core with Transformer Engine (Megatron-LM examples/llama/train_llama3_8b_h100_fp8.sh and
  NeMo's performance recipes): TE's fused kernels (norm, rotary `--apply-rope-fusion`, bias-SwiGLU
  `--bias-swiglu-fusion`, bias-dropout-add, the fused cross entropy `--cross-entropy-loss-fusion`), each its own
  kernel (no chains merged); weight gradients accumulated by the wgrad GEMM straight into fp32 main gradients
  (`gradient_accumulation_fusion`, on by default: no cast kernel, no accumulation kernel); its own tensor and
  sequence parallel layers on plain tensors (no DTensor dispatch); with `tp_comm_overlap` (NeMo's performance
  recipes, Transformer Engine's userbuffers) each all-gather and reduce-scatter of sequence parallelism runs in
  chunks beside the linear it feeds or drains, so only its first chunk and what exceeds the GEMM are exposed
  (`overlapped_tp_seconds`); the data-parallel dimension (meshscale's --fsdp) is its distributed optimizer
  (`--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather`): parameters replicated, gradients
  reduce-scattered in buckets (DistributedDataParallelConfig.bucket_size: max(40M, 1M x dp) parameters) over the
  last micro-batch's backward, in fp32 (NeMo's DDP config, grad_reduce_in_fp32), the updated bf16 parameters
  all-gathered in buckets over the next step's first forward; Adam as multi-tensor fused kernels on the fp32
  main parameters (Apex / TE FusedAdam). CUDA graphs only where asked (`--cuda-graph`; the recipes' H100 rows
  run without).
- zero1, zero2, zero3: DeepSpeed's ZeRO stages (Rajbhandari et al. 2020; DeepSpeed's ZeRO configuration docs) on
  an eager PyTorch model (plain tensors: no DTensor), FusedAdam on the fp32 partition, gradients and
  parameters on the wire in the model's bf16. zero1 partitions the optimizer states: after the last
  micro-batch's backward the gradients are reduce-scattered (reduce_bucket_size 5e8 elements) and after the step
  the updated parameters all-gathered (allgather_bucket_size 5e8), neither overlapped (overlap_comm defaults to
  false below stage 3); zero2 also partitions the gradients, reducing them after every micro-batch's backward;
  zero3 partitions the parameters too, gathering each layer before its forward and backward and reduce-scattering
  its gradients with prefetch and overlap (overlap_comm defaults to true at stage 3), as FSDP does.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from math import ceil

from meshscale.errors import MeshscaleError
from meshscale.models.memory import MemoryEstimate, Moment, reserved_bytes
from meshscale.predict.training.kernels import GQA_EXPANSION, Kernel, launches_of, memory_op

# Megatron-Core DistributedDataParallelConfig.bucket_size: max(40M, 1M x dp) parameters per bucket
MEGATRON_BUCKET_PARAMS, MEGATRON_BUCKET_PER_RANK = 40_000_000, 1_000_000
# DeepSpeed ZeRO: reduce_bucket_size and allgather_bucket_size default to 5e8 elements
ZERO_BUCKET_ELEMENTS = 500_000_000
# Apex / TE multi_tensor_apply (csrc/multi_tensor_apply.cuh): chunks of 65,536 elements, at most 320 blocks and
# 110 tensors (four lists: parameters, gradients, two moments: depth 4 takes 36) per launch
FUSED_ADAM_CHUNK, FUSED_ADAM_BLOCKS, FUSED_ADAM_TENSORS = 65536, 320, 36
# FusedAdam per parameter: the fp32 parameter, gradient and two moments read (16 B), parameter and moments
# written (12 B); Megatron's distributed optimizer also writes the bf16 model copy of its shard (2 B)
FUSED_ADAM_BYTES_PER_PARAM = 28.0


@dataclass(frozen=True)
class StepFramework:
    """What one framework does to a transformer's step (see the module's docstring)."""

    name: str
    fuses: bool = False             # element-wise ops run in fused kernels (`Kernel.fused_bytes`)
    merges_chains: bool = False     # ... consecutive ones in one generated kernel (Inductor)
    fused_ends: tuple[str, ...] = ()   # ops of the ends (embedding, norm, head, loss) it fuses too, by name
    graph_layers: bool = False      # the layers' kernels launched from a compiled graph: one host op each
    dtensor: bool = True            # tensor parallelism and the sharded optimizer through DTensor
    tp_overlap: bool = False        # sequence parallelism's collectives overlapped with the linears
    fused_optimizer: bool = False   # Adam as multi-tensor fused kernels on fp32 main parameters
    grad_accumulation_fusion: bool = False   # wgrad GEMMs accumulate into fp32 main gradients (no cast)
    sharding: str = "fsdp2"         # what the --fsdp dimension does: fsdp2, distopt, zero1, zero2, zero3
    expands_gqa: bool = True        # grouped-query heads expanded before attention (False: its attention takes them)
    wire_bytes: int = 0             # a sharded dimension's gradients on the wire (0: FSDP2's fp32 reduce)
    # how it holds memory (models/memory.RECIPES); "": the run's own (eager and compiled steps are run by
    # meshscale's engine, torchtitan and llm-foundry alike, which hold memory differently)
    memory_recipe: str = ""
    source: str = ""


STEP_FRAMEWORKS = {f.name: f for f in (
    StepFramework("eager", source="PyTorch eager: meshscale train, torchtitan (FSDP2, DTensor)"),
    StepFramework("compile", fuses=True, merges_chains=True, fused_ends=("cross-entropy",), graph_layers=True,
                  dtensor=True, source="torch.compile per TransformerBlock and on the loss (torchtitan "
                                       "distributed/compile.py apply_compile, components/loss.py)"),
    StepFramework("megatron", fuses=True, fused_ends=("cross-entropy", "final norm"), dtensor=False,
                  tp_overlap=True, fused_optimizer=True, grad_accumulation_fusion=True, sharding="distopt",
                  expands_gqa=False,
                  wire_bytes=4, memory_recipe="megatron",
                  source="Megatron-Core with Transformer Engine (distributed optimizer, overlapped grad reduce and "
                         "param gather, TP comm overlap)"),
    StepFramework("zero1", dtensor=False, fused_optimizer=True, sharding="zero1", wire_bytes=2,
                  memory_recipe="deepspeed", source="DeepSpeed ZeRO stage 1"),
    StepFramework("zero2", dtensor=False, fused_optimizer=True, sharding="zero2", wire_bytes=2,
                  memory_recipe="deepspeed", source="DeepSpeed ZeRO stage 2"),
    StepFramework("zero3", dtensor=False, fused_optimizer=True, sharding="zero3", wire_bytes=2,
                  memory_recipe="deepspeed", source="DeepSpeed ZeRO stage 3"),
)}
DEFAULT_FRAMEWORK = "eager"


def step_framework(name: str) -> StepFramework:
    return STEP_FRAMEWORKS[name]


def check_framework(name: str, transformer: bool, degrees: dict[str, int]) -> None:
    """Refuse, in one line, a framework the model does not know or a layout it does not run."""
    if name not in STEP_FRAMEWORKS:
        raise MeshscaleError(f"--framework {name}: use one of {', '.join(STEP_FRAMEWORKS)}")
    if name == DEFAULT_FRAMEWORK:
        return
    if not transformer:
        raise MeshscaleError(f"--framework {name} prices a transformer's step; an image model trains under ddp, "
                             "horovod or cntk-2016")
    if name.startswith("zero") and any(degrees.get(k, 1) > 1 for k in ("tp", "pp", "cp")):
        raise MeshscaleError(f"--framework {name}: DeepSpeed's ZeRO is priced for data parallelism (--fsdp its "
                             "partition group); drop --tp, --pp and --cp")
    if STEP_FRAMEWORKS[name].sharding in ("distopt", "zero1", "zero2") and degrees.get("dp", 1) > 1:
        raise MeshscaleError(f"--framework {name}: its data parallelism is --fsdp (the group its optimizer is "
                             "partitioned over); drop --dp")


def _merged(run: list[Kernel]) -> Kernel:
    """A chain of fused element-wise ops as one generated kernel."""
    first = run[0]
    return replace(first, name=" + ".join(k.name for k in run), bytes=sum(k.bytes for k in run), ops=1,
                   launches=1, dtensor_ops=0, instructions=first.instructions)


def fused_pass(kernels: tuple[Kernel, ...], fw: StepFramework, names: tuple[str, ...] | None = None,
               graph: bool = False) -> tuple[Kernel, ...]:
    """One pass's kernels under ``fw``: the element-wise ops it fuses (all with a fused traffic, or only those
    ``names`` start with) at their fused traffic, an op fused away dropped, each its own kernel or (merging)
    each chain between two library kernels one; from a compiled graph (``graph``) every kernel is one host launch
    and host-only work (DTensor's redistributions, views) is traced away; without DTensor the same ops are plain."""
    out: list[Kernel] = []
    run: list[Kernel] = []

    def close() -> None:
        if run:
            out.extend([_merged(run)] if fw.merges_chains and len(run) > 1 else run)
            run.clear()
    for k in kernels:
        fusable = fw.fuses and k.kind == "memory" and k.fused_bytes is not None and \
            (names is None or k.name.startswith(names))
        if k.kind == "host" and (graph or not fw.dtensor):
            continue
        if fusable:
            if k.fused_bytes > 0:
                run.append(replace(k, bytes=k.fused_bytes, ops=1, launches=1, dtensor_ops=0))
            continue
        close()   # a library kernel, or an op left unfused, ends the chain
        plain = k if fw.dtensor else replace(k, dtensor_ops=0)
        if graph:   # launched from generated code: one host launch per GPU kernel
            plain = replace(plain, ops=launches_of(plain), dtensor_ops=0)
        out.append(plain)
    close()
    return tuple(out)


def framework_pass(kernels: tuple[Kernel, ...], fw: StepFramework, layer: bool) -> tuple[Kernel, ...]:
    """A layer's (``layer``) or the ends' pass as ``fw`` runs it."""
    if fw.name == DEFAULT_FRAMEWORK:
        return kernels
    if not fw.expands_gqa:   # its attention kernel reads grouped key/value heads (Transformer Engine's)
        kernels = tuple(k for k in kernels if not k.name.startswith(GQA_EXPANSION))
    if fw.grad_accumulation_fusion:   # the wgrad GEMMs write fp32 main gradients: no casts, no accumulation
        kernels = tuple(k for k in kernels if "gradient to fp32" not in k.name and "gradients to fp32" not in k.name)
    if layer:
        return fused_pass(kernels, fw, None, fw.graph_layers)
    return fused_pass(kernels, fw, fw.fused_ends or ("\0",), False)


def fused_adam_kernels(params_on_rank: float, numels: list[int]) -> list[Kernel]:
    """Adam over this rank's fp32 main parameters as multi_tensor_apply launches it: one kernel per at most
    FUSED_ADAM_BLOCKS chunks or FUSED_ADAM_TENSORS tensors."""
    chunks = sum(ceil(n / FUSED_ADAM_CHUNK) for n in numels if n > 0) if numels else \
        ceil(params_on_rank / FUSED_ADAM_CHUNK)
    launches = max(1, ceil(chunks / FUSED_ADAM_BLOCKS), ceil(len(numels) / FUSED_ADAM_TENSORS) if numels else 1)
    return [memory_op("adamw step (fused)", params_on_rank * FUSED_ADAM_BYTES_PER_PARAM, ops=1, launches=launches)]


def overlapped_tp_seconds(pairs: list[tuple[float, float]], tp: int) -> float:
    """Sequence parallelism's collectives run in ``tp`` chunks beside the GEMM each one feeds or drains
    (Transformer Engine's userbuffers: a ring exchange of chunks, each chunk's GEMM while the next moves): per
    (collective, GEMM) pair the first chunk's transfer is exposed, and whatever the transfer takes beyond the
    GEMM."""
    return sum(max(comm / tp, comm - gemm) for comm, gemm in pairs if comm > 0)


def bucket_params(fw: StepFramework, params: float, shards: int) -> list[float]:
    """The parameters of each bucket a distributed optimizer or ZeRO reduces and gathers, in backward's order."""
    size = max(MEGATRON_BUCKET_PARAMS, MEGATRON_BUCKET_PER_RANK * shards) if fw.sharding == "distopt" \
        else ZERO_BUCKET_ELEMENTS
    full, rest = divmod(params, size)
    return [float(size)] * int(full) + ([rest] if rest > 0 else [])


def pipelined_exposed_s(times_s: list[float], needed_at_s: list[float]) -> float:
    """Transfers run one after another from time 0; the work waits for transfer i at ``needed_at_s[i]`` of its
    own progress: what the transfers add to the work's time (the largest lateness)."""
    done, late = 0.0, 0.0
    for t, need in zip(times_s, needed_at_s):
        done += t
        late = max(late, done - need)
    return max(0.0, late)


# Static bytes per parameter of a rank's stage by what ZeRO's --fsdp group of N partitions (ZeRO paper,
# Rajbhandari et al. 2020, figure 1: mixed-precision Adam keeps 2 B of bf16 parameters, 2 B of gradients and K = 12
# B of fp32 parameters and moments per parameter): (replicated, partitioned) bytes. Megatron's distributed
# optimizer is the memory model's own recipe (models/memory.RECIPES["megatron"]).
PARTITIONED_STATE_BYTES = {"zero1": (2.0 + 2.0, 12.0), "zero2": (2.0, 2.0 + 12.0), "zero3": (0.0, 2.0 + 2.0 + 12.0)}


def framework_memory(estimate: MemoryEstimate, fw: StepFramework, params: float, shards: int) -> MemoryEstimate:
    """``estimate`` (the memory model's, per phase) with the static state ZeRO keeps for the stage's ``params``
    (per rank, before data-parallel sharding) over ``shards`` ranks at every phase: parameters, gradients (where
    the phase holds them) and the optimizer's fp32 state replicated or partitioned as PARTITIONED_STATE_BYTES
    says; ZeRO-1 and -2 gather no layers (ZeRO-3 gathers as FSDP does); the allocator's reserve recomputed."""
    if fw.sharding not in PARTITIONED_STATE_BYTES:
        return estimate
    replicated, partitioned = PARTITIONED_STATE_BYTES[fw.sharding]
    optimizer = 12.0 * params / shards
    params_bytes = 2.0 * params if fw.sharding != "zero3" else 2.0 * params / shards
    grads = replicated * params + partitioned * params / shards - params_bytes - optimizer

    def state(m: Moment) -> Moment:
        parts = {**m.parts, "params": params_bytes, "optimizer": optimizer}
        if m.parts.get("grads"):
            parts["grads"] = grads
        if fw.sharding != "zero3" and "gathered" in parts:
            parts["gathered"] = 0.0
        return replace(m, parts=parts)
    moments = tuple(state(m) if m.name != "build" else m for m in estimate.moments)
    high, low = reserved_bytes(list(moments))
    return replace(estimate, moments=moments, reserved_bytes=high, reserved_low_bytes=low)
