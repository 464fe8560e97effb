"""The memory one rank needs to train a transformer under a layout: the tensors alive at each moment of a step,
as the frameworks' own code holds them, and what PyTorch's caching allocator, the CUDA context and NCCL add.

Moments (`step_moments`; the peak is the largest, and the breakdown is what is alive then):
- build: a framework that builds the whole model in fp32 on every rank before it shards it (and under a pipeline
  deep-copies it once per local stage before dropping the other stages' layers) holds 2 x 4 B per parameter of the
  model at once (`builds_whole_model`). meshscale's engine, torchtitan and llm-foundry build on the meta device
  and materialize their shards only: no moment beyond the step's (meshscale draws each parameter's initial value
  on the CPU, one block of rows at a time: train/seeded_init.py).
- forward (at the loss), backward (the loss's backward; the first layer's backward; the end, where the first
  stage reduces its embedding) and optimizer (AdamW's step).

What is alive, by component (one rank: its pipeline stage's layers, its tensor-parallel slice, 1/fsdp of it):
- params, optimizer: FSDP keeps fp32 sharded parameters (4 B) and AdamW's fp32 m and v (8 B) for the whole
  run; Megatron's distributed optimizer keeps bf16 parameters and fp32 main gradients whole, its fp32 master
  copy, m and v sharded over the data-parallel ranks.
- grads: fp32 sharded gradients, made by each layer's reduce-scatter and alive until the next step's zero_grad
  (set to None): through the optimizer, and through the later micro-batches of gradient accumulation.
- gathered: FSDP2 (torch.distributed.fsdp._fully_shard) all-gathers a layer's parameters in the compute
  precision into one buffer on its all-gather stream and copies them out into the unsharded parameters: in
  forward the current layer's (copy and buffer), in backward also the next layer's, prefetched; the layer's
  unsharded gradient and its fp32 reduce-scatter input (the previous layer's is released first,
  reduce_scatter_max_input_buffers = 1). The root module (embedding, final norm, head) is not resharded after
  forward: it stays gathered, its gradient unsharded, until the end of backward. Under a pipeline the stages
  keep every layer gathered for the step (reshard_after_forward=False) and torch.distributed.pipelining turns
  off the reduction until the last micro-batch (set_requires_gradient_sync(False)), so each layer's gradient is
  accumulated unsharded in fp32 (FSDPParam.unsharded_accumulated_grad, the reduce dtype). FSDP1 (llm-foundry's
  Composer, FULL_SHARD, limit_all_gathers) holds the same: at most two units gathered, one unit's gradient.
- activations: what each layer saves for backward (`layer_saved_bytes`, per checkpointing policy and
  framework), times the layers of the stage and the micro-batches in flight (`in_flight_micro_batches`: 1F1B's
  warm-up, all of them under GPipe, PyTorch's interleaved schedule's warm-up), with the final norm's and a
  pipeline's receive buffers (one per micro-batch, made once by PipelineStage) and kept stage outputs.
- logits: the loss's tensors per logit (`LOSS_BYTES_PER_LOGIT`): the recipe's loss, or under torch.compile the
  compiled one where the framework compiles its loss (torchtitan since April 2025), which writes no fp32 copy.
- transient: a layer's backward (the gradients in flight, what checkpointing recomputes) and AdamW's step:
  torch's foreach implementation (meshscale: torch.optim.AdamW's default on CUDA) makes sqrt(v) for every
  parameter at once (4 B each), the fused one nothing, a for-loop one parameter's.

Per layer and token (`layer_saved_bytes`, bf16 e = 2 B, fp32 4 B), as autograd saves them on CUDA (checked
against the tensors autograd saves for meshscale's own block in tests/unit/test_memory_model.py):
- none, Llama: each norm its input (the fused RMSNorm: input and a per-token rstd) and its output (the next
  matmul's input); Q after rotary, K and V repeated to the query heads (meshscale and torchtitan repeat them
  before SDPA), attention's output and log-sum-exp; SwiGLU's gate and up projections, SiLU's output and the
  product: 8 d + 4 f. GPT-2: 8 d + 2 f (GELU's input and output). With tensor (sequence) parallelism the norms
  are split along the sequence, the gathered inputs of the column-parallel matmuls are whole, the rest 1/tp;
  with context parallelism each rank holds its tokens, and K and V gathered over the whole sequence (meshscale's
  all-gather attention) and the causal mask as a bias of (seq / cp) x seq.
- selective: meshscale's op-level policy keeps every matmul's and attention's output and the block's input
  (5 d + 2 kv + 2 f); torchtitan's op policy keeps every second matmul (Q, V, gate, down), attention's output
  and the input (4 d + kv + f); Megatron's selective recomputation recomputes the core attention only, which
  with FlashAttention keeps nothing else, so it keeps what none keeps.
- full: the block's input; while a layer's backward runs, what it recomputed lives again.
- compiled blocks (torch.compile, `compiled`): what AOTAutograd's partitioner hands to backward: none, SwiGLU's
  SiLU output recomputed (8 d + 3 f); a selective policy's saved outputs that no backward node reads are dropped,
  the down projection's (torchtitan's policy: 3 d + kv + f; meshscale's: 4 d + 2 kv + 2 f). Checked against the
  partitioner on meshscale's block in tests/unit/test_memory_frameworks.py.

Above the tensors: the caching allocator's cache (`reserved_bytes`: each stream's pool grows to its own peak
and keeps what it freed: FSDP's all-gather and reduce-scatter streams beside the compute stream; and a phase's
transients, a few vocabulary-sized loss buffers against per-parameter optimizer temporaries, are taken as not
reusing each other's cached blocks; the loss's own segments replayed as the allocator serves them,
`loss_segments_per_logit`: the eager loss's bf16 logits leave a segment its fp32 gradients cannot use; FSDP2's root
all-gather output held in the copy-in stream's pool beside the first layer's), the CUDA context and NCCL's buffers
(models/allocator.py). Published figures count one of these: torchtitan's "memory" is the reserved peak.

`fits`: the allocator returns its cache to the driver and retries before it raises out-of-memory, so what must
fit is the allocated peak; what is reserved without pressure is the upper end. Both carry the accounting's own
uncertainty, MEMORY_ACCOUNTING_UNCERTAINTY. yes: the upper end fits; no: even the lower end does not; tight:
between.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from math import ceil

from meshscale.models.allocator import (CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_BYTES, GIB, Communicator,
                                        nccl_buffer_bytes)
from meshscale.models.layout import CHECKPOINTING, ParallelLayout
from meshscale.models.transformer import TransformerConfig

MEMORY_PRECISIONS = ("bf16", "fp32")
SELECTIVE_POLICIES = ("matmuls", "torchtitan", "megatron")
SHARDINGS = ("fsdp2", "fsdp1", "none")
# The accounting's stated accuracy: a layout's allocated peak within 10% of PyTorch's (the bound
# benchmarks/memory_vs_train.py checks on lent GPUs); it widens `fits`'s yes / no into "tight".
MEMORY_ACCOUNTING_UNCERTAINTY = 0.10
# bytes per logit (token x vocabulary entry) of each loss, by moment: (forward at the loss, saved until its
# backward, at the start of its backward)
LOSS_BYTES_PER_LOGIT = {
    # F.cross_entropy(logits.float()): bf16 logits, their fp32 copy, log_softmax's fp32 output (saved); backward:
    # nll_loss's fp32 gradient, log_softmax's fp32 gradient beside the saved output
    "eager": (2 + 4 + 4, 4, 4 + 4 + 4),
    # a fused kernel reading bf16 logits (flash-attn's CrossEntropyLoss, llm-foundry's MPT default): the logits
    # saved, their bf16 gradient made in backward
    "fused": (2, 2, 2 + 2),
    # Megatron's vocab-parallel cross-entropy on fp32 logits, its softmax and gradient in place
    "fp32-inplace": (2 + 4, 4, 4 + 2),
    # the eager loss under torch.compile (torchtitan's components/loss.py compiles it with the blocks): Inductor
    # reduces over the vocabulary without writing the fp32 copy or log_softmax's output, the partitioner saves the
    # bf16 logits (and per-token statistics), and backward is generated kernels writing the bf16 gradient (nll_loss's
    # zeros-and-scatter a pointwise where: Inductor's scatter_upon_const_tensor)
    "compiled": (2, 2, 2 + 2),
}
# The same losses as the allocator sees them, bf16 logits: each vocabulary-sized tensor made (+) or freed (-) in the
# step's order, in bytes per logit. Each is larger than 10 MiB, so it gets a segment of its own, and a freed one
# serves a later tensor only if it holds it (`loss_segments_per_logit`). The eager loss: the head's bf16 logits,
# their fp32 copy and log_softmax's output; the copy freed with the call, the logits by the training loop's
# `del pred`; backward: nll_loss's fp32 gradient, log_softmax's, then the cast to the bf16 gradient.
LOSS_EVENTS: dict[str, tuple[tuple[str, str, int], ...]] = {
    "eager": (("+", "logits", 2), ("+", "fp32", 4), ("+", "log_softmax", 4), ("-", "fp32", 0), ("-", "logits", 0),
              ("+", "nll grad", 4), ("+", "log_softmax grad", 4), ("-", "nll grad", 0), ("-", "log_softmax", 0),
              ("+", "logits grad", 2), ("-", "log_softmax grad", 0), ("-", "logits grad", 0)),
    "fused": (("+", "logits", 2), ("+", "logits grad", 2), ("-", "logits", 0), ("-", "logits grad", 0)),
    "compiled": (("+", "logits", 2), ("+", "logits grad", 2), ("-", "logits", 0), ("-", "logits grad", 0)),
    "fp32-inplace": (("+", "logits", 2), ("+", "fp32", 4), ("-", "logits", 0), ("+", "logits grad", 2),
                     ("-", "fp32", 0), ("-", "logits grad", 0)),
}
OPTIMIZER_IMPLEMENTATIONS = ("foreach", "fused", "for-loop")


@dataclass(frozen=True)
class MemoryRecipe:
    """How a framework holds a training step's memory, beyond the layout and the checkpointing policy."""

    name: str
    loss: str                        # LOSS_BYTES_PER_LOGIT's key
    optimizer: str                   # OPTIMIZER_IMPLEMENTATIONS: what AdamW's step makes
    builds_whole_model: bool         # the whole fp32 model on every rank before sharding (and a copy per stage)
    bf16_gathers: bool = False       # FSDP gathers bf16 parameters even under autocast (Composer's DEFAULT)
    megatron_states: bool = False    # bf16 parameters and fp32 main gradients whole, master/m/v over data ranks
    repeats_kv: bool = True          # K and V repeated to the query heads before attention (saved at their width)
    compiles_loss: bool = True       # under torch.compile the loss is compiled with the blocks
    source: str = ""

    def loss_under(self, compiled: bool) -> str:
        """The loss as it runs (LOSS_BYTES_PER_LOGIT's key) with the blocks compiled or not: the recipe's, compiled
        where the recipe compiles its eager loss with them. The step's memory and its time read this one rule."""
        return "compiled" if compiled and self.loss == "eager" and self.compiles_loss else self.loss


RECIPES: dict[str, MemoryRecipe] = {r.name: r for r in (
    MemoryRecipe("meshscale", "eager", "foreach", False, compiles_loss=False,
                 source="train/: Transformer built on the meta device, parallelized, then each rank's shards "
                        "materialized; F.cross_entropy on fp32 logits, outside the compiled blocks under --compile "
                        "(train/step.py); torch.optim.AdamW (foreach on CUDA)"),
    MemoryRecipe("torchtitan", "eager", "fused", False,
                 source="torchtitan since 2025-04 (bbb1b616e): meta-device init; cross_entropy_loss on pred.float(), "
                        "compiled under --training.compile (components/loss.py); optimizer.implementation = fused"),
    MemoryRecipe("torchtitan-2024", "eager", "foreach", False, compiles_loss=False,
                 source="torchtitan through 2024 (9dec370, its Dec 2024 performance tables): meta-device init; the "
                        "loss left eager under compile (train.py: 'compiling loss function causes CUDA errors'); "
                        "AdamW foreach (optimizer.fused off by default)"),
    MemoryRecipe("llm-foundry", "fused", "for-loop", False, bf16_gathers=True, repeats_kv=False,
                 source="llm-foundry MPT: init_device meta, loss_fn fused_crossentropy, Composer "
                        "DecoupledAdamW (a loop over parameters), FSDP mixed precision DEFAULT (bf16 parameters)"),
    MemoryRecipe("deepspeed", "eager", "fused", False,
                 source="DeepSpeed ZeRO: the model on the device in bf16 before the engine (stage 3: partitioned "
                        "at init, zero.Init); FusedAdam; the stages' static state predict/training/framework.py"),
    MemoryRecipe("megatron", "fp32-inplace", "fused", False, megatron_states=True,
                 source="Megatron-Core: distributed optimizer (fp32 master, m, v over data-parallel ranks), "
                        "fp32 main gradients, vocab-parallel cross-entropy"),
)}


@dataclass(frozen=True)
class Moment:
    """What is allocated at one moment of the step, by component, and which stream's pool holds what
    (``pools``: all-gather and reduce-scatter streams; the rest is the compute stream's)."""

    name: str
    parts: dict[str, float]
    pools: dict[str, float] = field(default_factory=dict)
    transient: float = 0.0      # of ``parts``, what this phase makes and frees (its own cached blocks)
    idle: float = 0.0           # beside ``parts``: segments this phase made, free now but too small for its tensors

    @property
    def allocated_bytes(self) -> float:
        return sum(self.parts.values())


@dataclass(frozen=True)
class MemoryEstimate:
    """One rank's memory (the worst pipeline stage's): the allocated peak and its moment, the caching
    allocator's reserve, the CUDA context and NCCL's buffers."""

    stage: int
    moments: tuple[Moment, ...]
    reserved_bytes: float        # the allocator's segments at their peak, its cache kept (no memory pressure)
    reserved_low_bytes: float    # the same if each pool's blocks served all its phases
    context_bytes: float
    nccl_bytes: float

    @property
    def peak(self) -> Moment:
        return max(self.moments, key=lambda m: m.allocated_bytes)

    @property
    def allocated_bytes(self) -> float:
        return self.peak.allocated_bytes

    @property
    def outside_bytes(self) -> float:
        """Outside PyTorch's allocator: the CUDA context and NCCL's buffers."""
        return self.context_bytes + self.nccl_bytes

    @property
    def total_bytes(self) -> float:
        """The device memory the rank uses at its peak with the allocator's cache kept (nvidia-smi's figure)."""
        return self.reserved_bytes + self.outside_bytes

    def bounds(self) -> tuple[float, float]:
        """What must fit: at least the allocated peak (the cache given back under pressure), at most the reserved
        peak, each widened by the accounting's uncertainty."""
        u = MEMORY_ACCOUNTING_UNCERTAINTY
        return (self.allocated_bytes * (1 - u) + self.outside_bytes,
                self.reserved_bytes * (1 + u) + self.outside_bytes)

    def verdict(self, capacity_bytes: float) -> str:
        """yes (even the upper end fits), no (not even the lower end), tight (between)."""
        low, high = self.bounds()
        return "yes" if high <= capacity_bytes else "no" if low > capacity_bytes else "tight"

    def margin(self, capacity_bytes: float) -> float:
        """The device's memory less the predicted peak (negative: over)."""
        return capacity_bytes - self.total_bytes

    def fits(self, capacity_bytes: float) -> bool:
        return self.verdict(capacity_bytes) != "no"

    def moment_peak(self, *names: str) -> float:
        """The largest allocation at the moments named (build; forward, backward, optimizer: the steps')."""
        return max((m.allocated_bytes for m in self.moments if m.name in names), default=0.0)

    def largest(self, part: str) -> float:
        """The most of one component alive at any moment."""
        return max(m.parts.get(part, 0.0) for m in self.moments)

    def breakdown(self) -> dict[str, float]:
        """The peak's allocated bytes by component, then the allocator's cache, the context and NCCL's buffers."""
        parts = {k: v for k, v in self.peak.parts.items() if v}
        return {**parts, "allocator_cache": self.reserved_bytes - self.allocated_bytes,
                "cuda_context": self.context_bytes, "nccl_buffers": self.nccl_bytes}

    # the components at their most, by name (callers and tests read these)
    @property
    def params_bytes(self) -> float:
        return self.largest("params")

    @property
    def gathered_bytes(self) -> float:
        return self.largest("gathered")

    @property
    def activations_bytes(self) -> float:
        return self.largest("activations")

    @property
    def logits_bytes(self) -> float:
        return self.largest("logits")


class _once:
    """A property of a frozen instance computed on first use and kept in its ``__dict__`` (which then answers):
    functools.cached_property without the lock Python 3.11's takes on every first use."""

    def __init__(self, method):
        self.method, self.__doc__ = method, method.__doc__

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.method(instance)
        return value


@dataclass(frozen=True)
class RankShape:
    """One rank of one pipeline stage: what its components are computed from (each derived figure found once:
    a stage's moments ask them many times)."""

    model: TransformerConfig
    layout: ParallelLayout
    stage: int
    recipe: MemoryRecipe
    precision: str          # bf16 | fp32
    checkpointing: str
    selective_policy: str
    sharding: str           # fsdp2 | fsdp1 | none
    autocast: bool          # fp32 parameters under torch.autocast
    loss_parallel: bool
    micro: int              # sequences per micro-batch
    seq_len: int
    moe_imbalance: float = 1.0   # mixture of experts: the busiest rank's routed tokens over the mean
    compiled: bool = False       # the blocks (and, where the recipe does, the loss) under torch.compile
    fp8_gather: bool = False     # the layers' weights all-gathered in fp8 (torchao's float8 all-gather, tensorwise)

    @_once
    def e(self) -> int:
        """Bytes of an activation element."""
        return 2 if self.precision == "bf16" else 4

    @_once
    def gather_bytes(self) -> int:
        """Bytes of a parameter as FSDP gathers it (fp32 under autocast, unless the framework casts it)."""
        if self.precision == "fp32" or (self.autocast and not self.recipe.bf16_gathers):
            return 4
        return 2

    @_once
    def layer_gather_bytes(self) -> int:
        """Bytes of a layer's parameter as FSDP gathers it: fp8's one byte under torchao's float8 all-gather (the
        unsharded weight is the fp8 tensor the matmul takes), else `gather_bytes`; the root stays unconverted."""
        return 1 if self.fp8_gather else self.gather_bytes

    @_once
    def loss(self) -> str:
        """The loss as it runs (LOSS_BYTES_PER_LOGIT's key): the recipe's, compiled under torch.compile where the
        recipe compiles its eager loss."""
        return self.recipe.loss_under(self.compiled)

    @_once
    def tokens(self) -> float:
        """This rank's tokens of one micro-batch (context parallelism: its share of the sequence)."""
        return self.micro * self.seq_len / self.layout.cp

    @_once
    def first(self) -> bool:
        return self.stage == 0

    @_once
    def last(self) -> bool:
        return self.stage == self.layout.pp - 1

    @_once
    def layers(self) -> int:
        return stage_layers(self.model, self.layout, self.stage)

    @_once
    def expert_params(self) -> float:
        """Of a layer, the routed experts on this rank (experts / ep of them; the mean over the layers)."""
        return self.model.expert_layer_params() / self.layout.tp / self.layout.ep

    @_once
    def layer_params(self) -> float:
        """A layer's parameters as this rank gathers them: the layer but its routed experts (its tensor-parallel
        slice), and its own experts."""
        m = self.model
        return (m.layer_params() - m.expert_layer_params()) / self.layout.tp + self.expert_params

    @_once
    def ends_params(self) -> float:
        """The embedding (first stage), final norm and head (last stage) on this rank."""
        m, ends = self.model, 0.0
        if self.first:
            ends += m.embedding_params()
        if self.last:
            ends += m.head_params() + m.norm_params()
            if m.tie_embeddings and self.layout.pp > 1:   # the tied head lives again on the last stage
                ends += m.vocab_size * m.d_model
        return ends / self.layout.tp

    @_once
    def stage_params(self) -> float:
        return self.layers * self.layer_params + self.ends_params

    @_once
    def fsdp(self) -> bool:
        """Whether FSDP holds the parameters (gathers them, reduce-scatters their gradients): not under DDP or
        Megatron's distributed optimizer."""
        return self.sharding != "none" and not self.recipe.megatron_states

    @_once
    def shards(self) -> int:
        """The ranks FSDP shards over: fsdp and cp (context-parallel ranks hold the same parameters:
        torchtitan's dp_shard_cp, meshscale's sharding_mesh)."""
        return 1 if self.sharding == "none" else self.layout.fsdp * self.layout.cp

    @_once
    def state_params(self) -> float:
        """The parameters whose state the rank keeps: its stage's sharded over `shards`, the routed experts over
        what expert parallelism leaves of them (`ParallelLayout.expert_fsdp`)."""
        experts = self.layers * self.expert_params
        expert_shards = 1 if self.sharding == "none" else self.layout.expert_fsdp
        return (self.stage_params - experts) / self.shards + experts / expert_shards


# ---- model state -------------------------------------------------------------------------------------------
def state_bytes(r: RankShape) -> dict[str, float]:
    """Parameters (with DDP's gradient buckets), gradients (once made) and optimizer state of the rank."""
    p = r.stage_params
    if r.recipe.megatron_states:   # the experts' state over their own data-parallel ranks (data / ep)
        data, experts = r.layout.dp * r.layout.fsdp, r.layers * r.expert_params
        master = 12 * ((p - experts) / data + experts / max(1, data // r.layout.ep))
        return {"params": p * r.e, "grads": p * 4, "optimizer": master}
    # DDP copies each gradient into its bucket, buckets allocated once for the run
    buckets = p * 4 if r.sharding == "none" and r.layout.dp > 1 and not r.recipe.megatron_states else 0.0
    held = r.state_params
    return {"params": held * 4 + buckets, "grads": held * 4, "optimizer": held * 8}


def optimizer_temporary_bytes(r: RankShape) -> float:
    """What AdamW's step allocates beside its state: foreach: sqrt(v) of every parameter at once; for-loop:
    of the largest parameter (a FSDP1 unit's flat shard); fused: nothing."""
    if r.recipe.optimizer == "fused":
        return 0.0
    if r.recipe.optimizer == "foreach":
        return r.state_params * 4
    largest = r.layer_params if r.sharding == "fsdp1" else max(r.layer_params / 3, r.ends_params)
    return largest * 4 / r.shards


def build_bytes(model: TransformerConfig, layout: ParallelLayout, recipe: MemoryRecipe) -> float:
    """The build's peak of a framework that builds the whole fp32 model on the device, and under a pipeline a deep
    copy of it per local stage (the first copy whole beside the original, later ones beside the trimmed earlier
    ones); nothing for one that builds on the meta device (meshscale's engine since it materializes shards)."""
    if not recipe.builds_whole_model:
        return 0.0
    whole = model.params() * 4.0
    if layout.pp == 1:
        return whole
    v = layout.stages_per_rank if layout.pp_schedule == "interleaved-1f1b" else 1
    return 2 * whole + (v - 1) * whole / (layout.pp * v)


# ---- FSDP's gathered parameters and unsharded gradients ----------------------------------------------------
def gathered_bytes(r: RankShape, backward: bool) -> tuple[float, float]:
    """(compute-stream bytes, all-gather-stream bytes) of a layer's gathers at its forward or backward: the
    unsharded parameters of the current layer and one all-gather buffer (in forward the current layer's, kept
    until the next layer's copy-out; in backward the next layer's, prefetched; a shard group of one copies
    without a buffer), and in backward the layer's unsharded gradient (in the parameters' compute dtype, fp8's
    too) and its fp32 reduce-scatter input. A pipeline keeps its layers gathered instead
    (`pipeline_gathered_bytes`)."""
    if not r.fsdp or r.layout.pp > 1:
        return 0.0, 0.0
    g, p = r.layer_gather_bytes, r.layer_params
    buffer = g * p if r.shards > 1 else 0.0
    return (g * p + p * (r.gather_bytes + 4), buffer) if backward else (g * p, buffer)


def root_gather_buffer_bytes(r: RankShape) -> float:
    """FSDP2's all-gather output of the root (embedding, final norm, head), the step's first all-gather: made on
    the all-gather copy-in stream (foreach_all_gather under implicit prefetch) and released only at the next
    group's wait_for_unshard, so that stream's pool holds it beside the first layer's buffer, and keeps both cached
    (models/allocator.py: a stream's cached blocks serve that stream only)."""
    if r.sharding != "fsdp2" or not r.fsdp or r.layout.pp > 1 or r.shards < 2:
        return 0.0
    return r.gather_bytes * r.ends_params


def root_bytes(r: RankShape) -> float:
    """The root module's (embedding, final norm, head) unsharded parameters, held from forward to the end of
    backward (FSDP does not reshard the root after forward; a pipeline stage keeps all of its parameters
    gathered, `pipeline_gathered_bytes`)."""
    return 0.0 if not r.fsdp or r.layout.pp > 1 else r.gather_bytes * r.ends_params


def root_grad_bytes(r: RankShape, end: bool) -> float:
    """The root's unsharded gradients, reduced only at the end of backward: the head's (and final norm's) from
    the head's backward on, the embedding's at the very end."""
    if not r.fsdp or r.layout.pp > 1:   # a pipeline stage accumulates them with its layers'
        return 0.0
    if end:
        return r.gather_bytes * r.ends_params
    if not r.last:
        return 0.0
    m = r.model
    head = m.vocab_size * m.d_model if m.tie_embeddings else m.head_params()
    return r.gather_bytes * (head + m.norm_params()) / r.layout.tp


def pipeline_gathered_bytes(r: RankShape, accumulated: bool) -> float:
    """A pipeline stage's layers kept gathered for the step, and once a backward has run their gradients
    accumulated unsharded in fp32 (FSDP2 without reduce-scatter until the last micro-batch)."""
    if r.layout.pp == 1 or not r.fsdp:
        return 0.0
    return r.stage_params * (r.gather_bytes + (4 if accumulated else 0))


def autocast_copies_bytes(r: RankShape) -> float:
    """torch.autocast's bf16 copies of fp32 weights, cached for the forward and saved by each matmul for
    backward: all of the rank's matmul weights, when its parameters are not gathered in bf16 already."""
    if not r.autocast or r.precision != "bf16" or r.gather_bytes == 2:
        return 0.0
    return 2 * r.stage_params


# ---- activations ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerWidths:
    """Per-token widths of one layer's tensors on a rank (its tensor-parallel slice), and the token counts they
    are held for: ``local`` (the rank's tokens), ``split`` (sequence-parallel: 1/tp of them), ``keys`` (K and V,
    gathered over the whole sequence under context parallelism)."""

    d: float          # the residual stream (whole)
    q: float          # queries, attention's output (d / tp)
    kv: float         # K or V as their projections make them (kv / tp)
    kv_attn: float    # K or V as attention saves them: repeated to the query heads (d / tp) or not
    f: float          # the FFN's hidden width / tp
    heads: float      # query heads / tp (attention's fp32 log-sum-exp per head)
    local: float
    split: float
    keys: float


def layer_widths(r: RankShape, repeats_kv: bool = True) -> LayerWidths:
    m, tp = r.model, r.layout.tp
    t = r.tokens
    return LayerWidths(m.d_model, m.d_model / tp, m.kv_dim / tp, (m.d_model if repeats_kv else m.kv_dim) / tp,
                       m.ffn_dim / tp, m.heads / tp, t, t / tp, t * r.layout.cp)


def _norm_input_bytes(r: RankShape) -> float:
    """What a norm saves of its input per element: the input (the fused RMSNorm / LayerNorm keep it and a
    per-token statistic); under autocast the residual stream is fp32 and the norm runs in fp32."""
    return 4 if r.gather_bytes == 4 and r.autocast else r.e


def _norm_stats_bytes(r: RankShape, tokens: float) -> float:
    """A norm's per-token fp32 statistics, saved beside its input: RMSNorm's rstd; LayerNorm's mean and rstd."""
    return (4 if r.model.style == "llama" else 8) * tokens


def layer_saved_bytes(r: RankShape, policy: str | None = None, moe_share: float | None = None) -> float:
    """Bytes one layer saves for backward for one micro-batch (see the module's docstring): its norms (or, under
    checkpointing, the block's input), attention's part and the feed-forward block's."""
    policy = policy or r.checkpointing
    if policy == "selective" and r.selective_policy == "megatron":   # core attention only: with FlashAttention
        policy = "none"                                               # nothing beyond what none keeps
    w = layer_widths(r, repeats_kv=r.recipe.repeats_kv)
    if policy == "full":
        return _norm_input_bytes(r) * w.d * w.split
    if policy == "none":   # inputs and their statistics, and outputs (the matmuls' inputs)
        norms = 2 * (_norm_input_bytes(r) * w.d * w.split + _norm_stats_bytes(r, w.split) + r.e * w.d * w.local)
    else:                  # the checkpointed block's input
        norms = _norm_input_bytes(r) * w.d * w.split
    return norms + attention_saved_bytes(r, w, policy) + ffn_saved_bytes(r, w, policy, moe_share)


def attention_saved_bytes(r: RankShape, w: LayerWidths, policy: str) -> float:
    """Attention's part: none, Q, K and V as attention takes them, its output and log-sum-exp (with context
    parallelism the causal mask as a bias, (seq / cp) x seq, for the memory-efficient kernel); selective, the
    projections' outputs it keeps (all four, or torchtitan's Q and V) and attention's output."""
    e, lse = r.e, 4 * w.heads * w.local
    if policy == "selective":
        kept = w.q + w.kv if r.selective_policy == "torchtitan" else w.q + 2 * w.kv + w.d
        return e * (kept + w.q) * w.local + lse
    saved = e * (2 * w.q * w.local + 2 * w.kv_attn * w.keys) + lse
    if r.layout.cp > 1:
        saved += e * (r.seq_len / r.layout.cp) * r.seq_len
    return saved


def ffn_saved_bytes(r: RankShape, w: LayerWidths, policy: str, moe_share: float | None = None) -> float:
    """The feed-forward block's part: none, SwiGLU's gate and up projections, SiLU's output and their product
    (GPT-2: GELU's input and output); selective, its matmuls' outputs (torchtitan's policy: the fifth and seventh
    of the block's, the gate and the down projection; GPT-2's fifth, the up projection). A mixture of experts:
    the mean over the layers (``moe_share``: the share of MoE layers, default the model's) of the dense MLP's and
    `moe_ffn_saved_bytes`.

    A compiled block (`compiled_saved_discount`) saves what its backward graph reads: AOTAutograd's partitioner
    drops the saved values no backward node uses and recomputes the element-wise ops whose output backward does
    not hand to a library kernel, so SiLU's output is recomputed from the gate (none) and the down projection's
    output, which only the residual add consumes, is not kept (selective policies that save it)."""
    e, llama = r.e, r.model.style == "llama"
    if policy == "none":
        dense = e * (4 if llama else 2) * w.f * w.local
    elif r.selective_policy == "torchtitan":
        dense = e * (w.f + (w.d if llama else 0)) * w.local
    else:
        dense = e * ((2 if llama else 1) * w.f + w.d) * w.local
    dense -= compiled_saved_discount(r, w, policy)
    if not r.model.is_moe:
        return dense
    share = r.model.moe_share() if moe_share is None else moe_share
    return (1 - share) * dense + share * moe_ffn_saved_bytes(r, w, policy)


def compiled_saved_discount(r: RankShape, w: LayerWidths, policy: str) -> float:
    """What a compiled dense MLP does not save that the eager one does (`ffn_saved_bytes`): under no
    checkpointing SwiGLU's SiLU output (recomputed in backward's fused kernel from the gate; GELU's output is the
    second matmul's input, which its weight gradient reads, so GPT-2 keeps both); under a selective policy that
    saves the down projection's output (torchtitan's every odd matmul on Llama, meshscale's every matmul), that
    output."""
    if not r.compiled or policy == "full":
        return 0.0
    llama = r.model.style == "llama"
    if policy == "none":
        return r.e * w.f * w.local if llama else 0.0
    keeps_down = r.selective_policy == "matmuls" or (r.selective_policy == "torchtitan" and llama)
    return r.e * w.d * w.local if keeps_down else 0.0


def moe_ffn_saved_bytes(r: RankShape, w: LayerWidths, policy: str) -> float:
    """A MoE layer's part in place of the MLP's: the router's fp32 logits; for each of a token's k routed
    copies its permuted input and its expert's output (each tensor-parallel rank routes all its group's
    tokens) and the expert's gate, up, SiLU and product (selective: gate and up; torchtitan's policy: the gate),
    times the load imbalance (the busiest rank's tokens over the mean); the shared experts as an MLP of their
    width."""
    m, tp = r.model, r.layout.tp
    per_width = 4 if policy == "none" else 1 if r.selective_policy == "torchtitan" else 2
    routed = m.experts_per_token * (per_width * m.routed_ffn_dim + 2 * m.d_model * tp) * r.moe_imbalance
    elements = 2 * m.experts * tp + routed + per_width * m.shared_ffn_dim * m.shared_experts
    return r.e * elements * w.local / tp


def layer_backward_bytes(r: RankShape) -> float:
    """What a layer's backward holds beside the saved activations: the gradients in flight (the FFN's three
    hidden-width ones and two of the residual width) and, under checkpointing, what it recomputed."""
    w, e = layer_widths(r), r.e
    grads = e * ((3 if r.model.style == "llama" else 2) * w.f + 2 * w.d) * w.local
    moe = 1.0 if r.model.is_moe else None   # the layer recomputed: a MoE one, where the model has them
    return grads + layer_saved_bytes(r, "none", moe) - layer_saved_bytes(r, None, moe)   # what is recomputed


def ends_saved_bytes(r: RankShape) -> float:
    """The final norm's input and output (saved by the head's matmul), on the last stage."""
    if not r.last:
        return 0.0
    w = layer_widths(r)
    return _norm_input_bytes(r) * w.d * w.split + _norm_stats_bytes(r, w.split) + r.e * w.d * w.local


def in_flight_micro_batches(layout: ParallelLayout, stage: int = 0) -> float:
    """Micro-batches whose activations stage ``stage`` holds at once, as PyTorch's schedules run them: 1F1B
    warms up with min(m, pp - stage) forwards and then alternates backward-first; GPipe runs every forward
    first; interleaved 1F1B warms up (v - 1) x m/rounds + 2 (pp - 1 - rank) chunks of 1/v of the rank's layers
    and then runs a forward before each backward (torch.distributed.pipelining.schedules, _get_warmup_ops)."""
    m, pp = layout.micro_batches, layout.pp
    if pp == 1:
        return 1.0
    if layout.pp_schedule == "gpipe":
        return float(m)
    if layout.pp_schedule == "interleaved-1f1b":
        v = layout.stages_per_rank
        per_round = m // max(1, m // pp)
        warmup = min(m * v, (v - 1) * per_round + 2 * (pp - 1 - stage))
        return min(m * v, warmup + 1) / v
    return float(min(m, pp - stage))


def pipeline_buffers_bytes(r: RankShape, in_flight: float) -> float:
    """A pipeline stage's own buffers: the activations it receives and the gradients it receives, one buffer
    per micro-batch each (PipelineStage makes them once), and the outputs it keeps for each micro-batch in
    flight until their backward (the last stage's: its logits)."""
    if r.layout.pp == 1:
        return 0.0
    hidden = r.e * r.model.d_model * r.tokens
    m = r.layout.micro_batches
    kept = in_flight * (r.e * r.model.vocab_size * r.tokens if r.last else hidden)
    received = 0.0 if r.first else (m - in_flight) * hidden   # those in flight are the first layer's saved input
    return received + (0.0 if r.last else m * hidden) + kept


# ---- the loss ---------------------------------------------------------------------------------------------
def loss_bytes(r: RankShape) -> tuple[float, float, float]:
    """(at the loss's forward, saved until its backward, at its backward) on the last stage: the recipe's bytes
    per logit over the rank's tokens and vocabulary (every tensor-parallel rank gathers the whole logits unless
    the loss is vocabulary-parallel; before the gather each holds its slice)."""
    if not r.last:
        return 0.0, 0.0, 0.0
    forward, saved, backward = LOSS_BYTES_PER_LOGIT[r.loss]
    if r.precision == "fp32":   # fp32 logits: the eager loss's .float() is the tensor itself
        forward, backward = forward + 2 - (4 if r.loss == "eager" else 0), backward + 2
    logits = _logits(r)
    tp = r.layout.tp
    slice_ = r.e * r.tokens * r.model.vocab_size / tp if tp > 1 and not r.loss_parallel else 0.0
    return forward * logits + slice_, saved * logits, backward * logits


def _logits(r: RankShape) -> float:
    """The logits one rank's loss holds: its tokens times the vocabulary (its slice under a vocabulary-parallel
    loss)."""
    return r.tokens * r.model.vocab_size / (r.layout.tp if r.loss_parallel else 1)


def loss_segments_per_logit(events: tuple[tuple[str, str, int], ...], steps: int = 2) -> tuple[float, float]:
    """(the allocator's segments, the most alive at once) in bytes per logit, replaying ``events`` (LOSS_EVENTS)
    for ``steps`` steps as the caching allocator serves them: a request takes the smallest free block that holds it
    (best fit), splitting off the rest; a freed block merges with its free neighbours in its segment; where no free
    block holds it, a new segment of its size is made; segments are kept (no memory pressure)."""
    segments: list[list[list]] = []   # per segment, its blocks in order: [size, owner or None]
    alive = peak = 0.0
    for _ in range(steps):
        for op, name, size in events:
            if op == "-":
                blocks = next(b for b in segments if any(x[1] == name for x in b))
                block = next(x for x in blocks if x[1] == name)
                alive -= block[0]
                block[1] = None
                _merge_free(blocks)
                continue
            free = [(x[0], s, j) for s, blocks in enumerate(segments) for j, x in enumerate(blocks)
                    if x[1] is None and x[0] >= size]
            if free:
                held, s, j = min(free)
                segments[s][j:j + 1] = [[size, name]] + ([[held - size, None]] if held > size else [])
            else:
                segments.append([[size, name]])
            alive += size
            peak = max(peak, alive)
    return float(sum(b[0] for blocks in segments for b in blocks)), peak


def _merge_free(blocks: list[list]) -> None:
    """Merge adjacent free blocks of one segment (the caching allocator's free_block)."""
    i = 0
    while i < len(blocks) - 1:
        if blocks[i][1] is None and blocks[i + 1][1] is None:
            blocks[i][0] += blocks.pop(i + 1)[0]
        else:
            i += 1


def loss_idle_bytes(r: RankShape) -> float:
    """At the loss's backward, what the allocator holds for the loss beyond its tensors alive then: segments it
    made earlier in the step that are free but too small for the tensors it makes now (the eager loss: the bf16
    logits' segment, freed by `del pred`, cannot hold the fp32 gradients: 14 B per logit reserved for 12 alive).
    bf16 logits only (fp32 ones have no bf16 copy); none on a pipeline's last stage, which keeps its output, the
    logits, until their backward (`pipeline_buffers_bytes`), so their segment is in use, not idle."""
    if not r.last or r.precision != "bf16" or r.layout.pp > 1:
        return 0.0
    segments, _ = loss_segments_per_logit(LOSS_EVENTS[r.loss])
    return max(0.0, segments - LOSS_BYTES_PER_LOGIT[r.loss][2]) * _logits(r)


# ---- the step's moments -----------------------------------------------------------------------------------
def _moment(name: str, pools: dict[str, float], made: float = 0.0, idle: float = 0.0, **parts: float) -> Moment:
    """A moment of ``parts``; ``made``: of them, what this phase makes and frees again; ``idle``: what it holds
    cached beside them that it cannot use (`Moment.idle`)."""
    return Moment(name, {k: v for k, v in parts.items() if v}, {k: v for k, v in pools.items() if v}, made, idle)


def _accumulated(r: RankShape, in_flight: float) -> bool:
    """Whether a backward ran before the stage's fullest forward (its layers' gradients then accumulated)."""
    return r.layout.micro_batches > ceil(in_flight) and r.layout.pp_schedule != "gpipe"


def step_moments(r: RankShape) -> list[Moment]:
    """The moments of one step of rank ``r`` (see the module's docstring), each with what is alive."""
    state, n = state_bytes(r), in_flight_micro_batches(r.layout, r.stage)
    grads = state["grads"]
    # the fp32 sharded gradients, on the reduce-scatter stream (FSDP) or the compute stream (DDP, Megatron)
    rs = grads if r.fsdp else 0.0
    # gradients alive through forward: accumulated over micro-batches without a pipeline; Megatron's buffer always
    held = grads if (r.layout.micro_batches > 1 and r.layout.pp == 1) or r.recipe.megatron_states else 0.0
    acts = activations_bytes(r, n)
    acc = _accumulated(r, n)
    piped = pipeline_gathered_bytes(r, acc)
    loss_f, loss_saved, loss_b = loss_bytes(r)
    kept_loss = (n - 1) * loss_saved
    fwd_c, fwd_ag = gathered_bytes(r, backward=False)
    bwd_c, bwd_ag = gathered_bytes(r, backward=True)
    held_params = root_bytes(r) + piped + autocast_copies_bytes(r)
    base = dict(params=state["params"], optimizer=state["optimizer"], grads=held)
    pools = {"reduce-scatter": rs if held else 0.0, "all-gather": fwd_ag}
    # a layer's backward under a pipeline: its bf16 gradient beside the fp32 one it is added to
    layer_grad = r.layer_params * (r.gather_bytes + 4) if r.layout.pp > 1 and r.fsdp else 0.0
    layer_bwd = layer_backward_bytes(r) + layer_grad
    head_grad = root_grad_bytes(r, end=False)
    root_ag = root_gather_buffer_bytes(r)
    # the step's start (FSDP2): the root's all-gather output not yet released beside the first layer's
    moments = [_moment("forward", {**pools, "all-gather": root_ag + fwd_ag}, **base,
                       gathered=fwd_c + fwd_ag + root_ag + held_params)] if root_ag else []
    moments += [
        _moment("forward", pools, loss_f, **base, gathered=fwd_c + fwd_ag + held_params, activations=acts,
                logits=kept_loss + loss_f),
        _moment("backward", pools, loss_b, loss_idle_bytes(r), **base, gathered=fwd_ag + held_params,
                activations=acts, logits=kept_loss + loss_b),
        _moment("backward", {**pools, "all-gather": bwd_ag}, layer_bwd, **base, activations=acts,
                gathered=bwd_c + bwd_ag + held_params + head_grad, logits=kept_loss, transient=layer_bwd),
    ]
    if r.layout.pp > 1 and not acc:   # a later backward: one micro-batch fewer, the gradients accumulated
        moments.append(_moment("backward", pools, layer_bwd, **base, activations=activations_bytes(r, n - 1),
                               gathered=held_params - piped + pipeline_gathered_bytes(r, True) + head_grad,
                               logits=max(0.0, n - 2) * loss_saved, transient=layer_bwd))
    moments.append(_end_of_backward(r, state, rs))
    temp = optimizer_temporary_bytes(r)
    moments.append(_moment("optimizer", {"reduce-scatter": rs}, temp, params=state["params"],
                           optimizer=state["optimizer"], grads=grads, transient=temp))
    return moments


def activations_bytes(r: RankShape, in_flight: float) -> float:
    """The activations of ``in_flight`` micro-batches on the rank's stage, with the pipeline's buffers."""
    per_micro_batch = r.layers * layer_saved_bytes(r) + ends_saved_bytes(r)
    return in_flight * per_micro_batch + pipeline_buffers_bytes(r, in_flight)


def _end_of_backward(r: RankShape, state: dict[str, float], rs: float) -> Moment:
    """The end of backward: every gradient made; the root's unsharded gradients (the embedding's dense one on
    the first stage) and their fp32 reduce-scatter input beside the gathered root (and a pipeline stage's
    gathered layers, resharded only after this)."""
    root_grad = root_grad_bytes(r, end=True)
    reduce = (r.ends_params if r.layout.pp == 1 else r.layer_params) * 4 if r.fsdp else 0.0
    gathered = root_bytes(r) + root_grad + reduce + pipeline_gathered_bytes(r, False)
    # every layer's sharded gradient made, the root's (reduced last) not yet
    grads = state["grads"] - (r.ends_params * 4 / r.shards if r.layout.pp == 1 and r.fsdp else 0.0)
    return _moment("backward", {"reduce-scatter": rs}, reduce, params=state["params"],
                   optimizer=state["optimizer"], grads=grads, gathered=gathered)


# ---- the allocator's reserve and the whole estimate ------------------------------------------------------
def reserved_bytes(moments: list[Moment]) -> tuple[float, float]:
    """(reserved, reserved if every cached block served the later requests): each stream's pool at its own peak
    (the caching allocator gives a stream's cached blocks to that stream only), and in the compute stream's pool
    what one phase left cached and the next could not use. A cached block serves any request it holds (split),
    never a larger one: the optimizer's per-parameter temporaries are smaller than the loss's vocabulary-sized
    buffers, so the loss takes new segments and what of the optimizer's cache the forward's own tensors did not
    take stays reserved beside it; the optimizer's step reuses the loss's cached blocks, their excess stays."""
    def pool(m: Moment, name: str) -> float:
        return m.pools.get(name, 0.0)

    build = max((m.allocated_bytes for m in moments if m.name == "build"), default=0.0)
    moments = [m for m in moments if m.name != "build"]   # the step reuses what the build freed
    side = sum(max(pool(m, name) for m in moments) for name in ("all-gather", "reduce-scatter"))
    compute = [m.allocated_bytes - pool(m, "all-gather") - pool(m, "reduce-scatter") for m in moments]
    optimizer = max((m.transient for m in moments if m.name == "optimizer"), default=0.0)
    loss = max((m.parts.get("logits", 0.0) for m in moments if m.name != "optimizer"), default=0.0)

    def left_cached(m: Moment) -> float:
        if m.name == "optimizer":
            return max(0.0, loss - optimizer)
        if not m.parts.get("logits"):   # the loss's buffers not taken yet: the optimizer's cache serves the rest
            return 0.0
        made = sum(m.parts.get(k, 0.0) for k in ("activations", "gathered", "transient"))
        return max(0.0, optimizer - made)

    high = max(c + left_cached(m) + m.idle for c, m in zip(compute, moments)) + side
    return max(build, high), max(build, max(compute) + side)


def default_communicators(layout: ParallelLayout) -> tuple[Communicator, ...]:
    """The NCCL communicators of a rank of ``layout`` as meshscale's engine makes them: tensor, context and
    replica groups, FSDP's (fsdp x cp), each of more than one rank, the world's (the loss's group), and a
    pipeline's point-to-point one (a send and a receive connection per channel)."""
    shard = layout.fsdp * layout.cp   # FSDP's group: fsdp and cp flattened into one
    comms = [Communicator(dim, n) for dim, n in (("tp", layout.tp), ("cp", layout.cp), ("shard", shard),
                                                 ("dp", layout.dp)) if n > 1]
    if layout.ep > 1:   # the experts' all-to-all: point-to-point connections to each peer of the group
        comms.append(Communicator("ep", layout.ep, channels=2, connections=layout.ep - 1))
    if layout.pp > 1:
        comms.append(Communicator("pp", layout.pp, channels=2, connections=2))
    if layout.world_size > 1:
        comms.append(Communicator("world", layout.world_size))
    return tuple(comms)


def stage_memory(r: RankShape, communicators: tuple[Communicator, ...] | None = None) -> MemoryEstimate:
    """The estimate for rank ``r``: its step's moments (and the build's), the allocator's reserve, the context
    and NCCL's buffers."""
    moments = [replace(m, parts={**m.parts, "workspace": CUBLAS_WORKSPACE_BYTES}) for m in step_moments(r)]
    build = build_bytes(r.model, r.layout, r.recipe)
    if build:
        moments.append(Moment("build", {"build": build}))
    high, low = reserved_bytes(moments)
    comms = default_communicators(r.layout) if communicators is None else communicators
    return MemoryEstimate(r.stage, tuple(moments), high, low, CUDA_CONTEXT_BYTES, nccl_buffer_bytes(comms))


def training_memory(model: TransformerConfig, layout: ParallelLayout, *, batch: int, seq_len: int,
                    precision: str = "bf16", checkpointing: str = "none", loss_parallel: bool = False,
                    stage: int | None = None, selective_policy: str = "matmuls", recipe: str = "meshscale",
                    sharding: str = "fsdp2", autocast: bool = False, moe_imbalance: float = 1.0,
                    communicators: tuple[Communicator, ...] | None = None, compiled: bool = False,
                    fp8_gather: bool = False) -> MemoryEstimate:
    """Peak memory of one rank. ``batch``: sequences per data-parallel rank per step (split into the layout's
    micro-batches). ``stage``: a pipeline stage, or None for the one with the largest peak. ``recipe``: the
    framework (RECIPES); ``moe_imbalance``: a mixture of experts' busiest rank's routed tokens over the mean;
    ``communicators``: NCCL's (default: `default_communicators`); ``compiled``: the blocks (and the recipe's loss)
    under torch.compile; ``fp8_gather``: the layers' weights all-gathered in fp8 (torchao's tensorwise float8)."""
    assert checkpointing in CHECKPOINTING and precision in MEMORY_PRECISIONS and sharding in SHARDINGS
    shape = RankShape(model, layout, 0, RECIPES[recipe], precision, checkpointing, selective_policy, sharding,
                      autocast, loss_parallel, max(1, batch // layout.micro_batches), seq_len, moe_imbalance,
                      compiled, fp8_gather)
    stages = range(layout.pp) if stage is None else [stage]
    found = [stage_memory(replace(shape, stage=s), communicators) for s in stages]
    return max(found, key=lambda e: (e.total_bytes, e.allocated_bytes))


def activation_elements_per_token(model: TransformerConfig, checkpointing: str,
                                  selective_policy: str = "matmuls") -> float:
    """Elements one layer saves for backward per token, on one rank without tensor or context parallelism
    (bf16; the per-head log-sum-exp counted in elements of 2 bytes)."""
    shape = RankShape(model, ParallelLayout(), 0, RECIPES["meshscale"], "bf16", checkpointing, selective_policy,
                      "fsdp2", False, False, 1, 1)
    return layer_saved_bytes(shape) / 2


def stage_layers(model: TransformerConfig, layout: ParallelLayout, stage: int) -> int:
    """Layers on pipeline stage ``stage`` (the first stages take the remainder)."""
    base, extra = divmod(model.layers, layout.pp)
    return base + (1 if stage < extra else 0)


__all__ = ["GIB", "MEMORY_ACCOUNTING_UNCERTAINTY", "MEMORY_PRECISIONS", "RECIPES", "MemoryEstimate",
           "MemoryRecipe", "Moment", "RankShape", "activation_elements_per_token", "in_flight_micro_batches",
           "layer_saved_bytes", "stage_layers", "step_moments", "training_memory"]
