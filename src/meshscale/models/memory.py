"""The memory one rank needs to train a transformer under a layout, by the model's own arithmetic.

Static state, per parameter on the rank (its pipeline stage's layers, its tensor-parallel slice, divided by fsdp):
- bf16 mixed precision as FSDP2 runs it (MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)): fp32 sharded
  parameters 4 B, fp32 sharded gradients 4 B, AdamW's two fp32 moments 8 B; while a layer computes its parameters
  are all-gathered in bf16 (that layer and the one prefetched: 2 x 2 B) and its unsharded gradient is made in bf16
  and cast to fp32 for the reduce-scatter (2 B + 4 B, one layer).
  meshscale's layouts always run under FSDP2: --dp replicas are FSDP2's hybrid mode (a 2-D mesh, replicate x
  shard), and a layout without --fsdp is a shard group of one, so the same terms hold with fsdp = 1.
- fp32 training: 4 B parameters, 4 B gradients, 8 B moments; gathered copies in fp32.

Activations saved for backward, elements per token per layer (bf16: 2 B each), Llama style:
  none       7 d + 2 kv + 4 f: the two norms' inputs and outputs, Q (after rotary), K, V, attention output,
             SwiGLU's gate and up projections, SiLU output and the product fed to the down projection
             (Korthikanti et al., Reducing Activation Recomputation, section 4, counted for this block with
             FlashAttention, which keeps no seq x seq matrix).
  selective  5 d + 2 kv + 2 f: outputs of the matrix multiplications and of attention are kept, the element-wise
             ops (norms, rotary, SiLU, products) recomputed: the op-level policy meshscale's engine applies
             (train/parallel keeps every mm and attention output).
  selective, torchtitan's op-level policy: 4 d + kv + f. Its `_custom_policy` (torchtitan, distributed/
             activation_checkpoint.py) saves the ops of its save list except every second mm of the block, so
             of Q, K, V, the output projection, gate, up and down it keeps Q, V, gate and down; with the layer's
             input and attention's output (torchtitan trains Llama-style blocks; a GPT-2 block keeps the
             engine's count).
  full       d: each layer's input only; one layer's activations live again while it is recomputed.
GPT-2 style: none 8 d + 2 f, selective 5 d + 2 f (no separate gate), full d.
With tensor parallelism (with sequence parallelism, as torchtitan applies it) and context parallelism, each rank holds
1/tp and 1/cp of them. The head and loss keep bf16 logits, fp32 log-probabilities and their fp32 gradient: 10 B per
token per vocabulary entry (divided by tp with loss parallelism).

Mixture of experts (a MoE layer's MLP replaced): the routed experts' parameters are split over the expert-parallel
group (experts / ep per rank) and sharded over `ParallelLayout.expert_fsdp`, so each rank gathers only its own
experts; the rest of the layer is sharded over fsdp as before. A MoE layer keeps, per token, instead of the
MLP's: the router's fp32 logits (2 elements of bf16 per expert), and for each of the token's k routed copies its
permuted input and its expert's output (d each: each tensor-parallel rank routes all its group's tokens),
gate, up, SiLU and product (4 x expert width; selective: gate and up; torchtitan's policy: gate), the shared
experts like an MLP of their width; the routed part x the load imbalance (the busiest rank's tokens over the
mean). A model with dense layers keeps the mean over its layers.

Pipelines: stage 0 holds the activations of min(micro-batches, stages) micro-batches under 1F1B, all of them under
GPipe, and (1 + (pp - 1) / (pp x v)) x pp under interleaved 1F1B with v stages per rank (Narayanan et al. 2021).

Allowance: CUDA context and library workspaces outside PyTorch's allocator (CUDA_CONTEXT_BYTES), and the caching
allocator's reserve above the allocated peak (ALLOCATOR_RESERVE_FRACTION).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from meshscale.models.layout import CHECKPOINTING, ParallelLayout
from meshscale.models.transformer import TransformerConfig

GIB = 1 << 30
# The CUDA context with cuBLAS/cuDNN loaded and NCCL's channel buffers: about 0.5-1 GiB on Hopper (the memory
# nvidia-smi shows for a process that has allocated nothing); 1 GiB stated as the allowance.
CUDA_CONTEXT_BYTES = 1 * GIB
# PyTorch's caching allocator rounds blocks and keeps freed ones: reserved runs some percent above allocated
# (PyTorch CUDA semantics notes, memory management); 10% is the stated allowance.
ALLOCATOR_RESERVE_FRACTION = 0.10
LOGIT_BYTES_PER_ELEMENT = 2 + 4 + 4
MEMORY_PRECISIONS = ("bf16", "fp32")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one rank needs at its peak (the worst pipeline stage), by component."""

    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    gathered_bytes: float       # FSDP's unsharded layers (and gradients) in flight
    activations_bytes: float
    logits_bytes: float
    allowance_bytes: float      # context and workspaces + the allocator's reserve
    stage: int                  # the pipeline stage this is for

    @property
    def allocated_bytes(self) -> float:
        return (self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.gathered_bytes
                + self.activations_bytes + self.logits_bytes)

    @property
    def total_bytes(self) -> float:
        return self.allocated_bytes + self.allowance_bytes

    def fits(self, capacity_bytes: float) -> bool:
        return self.total_bytes <= capacity_bytes

    def breakdown(self) -> dict[str, float]:
        return {"params": self.params_bytes, "grads": self.grads_bytes, "optimizer": self.optimizer_bytes,
                "gathered": self.gathered_bytes, "activations": self.activations_bytes,
                "logits": self.logits_bytes, "allowance": self.allowance_bytes}


def activation_elements_per_token(model: TransformerConfig, checkpointing: str,
                                  selective_policy: str = "matmuls") -> float:
    """Elements one layer keeps for backward per token (see the module's docstring); ``selective_policy``:
    the engine's (matmuls) or torchtitan's (Llama-style blocks)."""
    d, kv, f = model.d_model, model.kv_dim, model.ffn_dim
    if checkpointing == "full":
        return d
    torchtitan = checkpointing == "selective" and selective_policy == "torchtitan"
    if model.style == "llama":
        if checkpointing == "none":
            return 7 * d + 2 * kv + 4 * f
        return 4 * d + kv + f if torchtitan else 5 * d + 2 * kv + 2 * f
    return 8 * d + 2 * f if checkpointing == "none" else 5 * d + 2 * f


def moe_elements_per_token(model: TransformerConfig, checkpointing: str, selective_policy: str = "matmuls",
                           tp: int = 1, imbalance: float = 1.0) -> float:
    """Elements one layer of ``model`` keeps per token, the mean over its dense and MoE layers (see the module's
    docstring), scaled so that x tokens / tp gives a tensor-parallel rank's share; a dense model's as
    `activation_elements_per_token`."""
    dense = activation_elements_per_token(model, checkpointing, selective_policy)
    if not model.is_moe or checkpointing == "full":
        return dense
    f, k, fs = model.ffn_dim, model.experts_per_token, model.shared_ffn_dim * model.shared_experts
    fe, d = model.routed_ffn_dim, model.d_model
    torchtitan = checkpointing == "selective" and selective_policy == "torchtitan"
    mlp = {"none": 4 * f, "selective": f if torchtitan else 2 * f}[checkpointing]
    per_f = {"none": 4, "selective": 1 if torchtitan else 2}[checkpointing]
    routed = k * (per_f * fe + 2 * d * tp) * imbalance
    moe = dense - mlp + 2 * model.experts * tp + routed + per_f * fs
    share = model.moe_share()
    return (1 - share) * dense + share * moe


def in_flight_micro_batches(layout: ParallelLayout, stage: int = 0) -> float:
    """Micro-batches whose activations stage ``stage`` holds at once."""
    m, pp = layout.micro_batches, layout.pp
    if pp == 1:
        return 1.0
    if layout.pp_schedule == "gpipe":
        return float(m)
    if layout.pp_schedule == "interleaved-1f1b":
        v = layout.stages_per_rank
        return min(float(m), (pp - stage) * (1 + (pp - 1) / (pp * v)))
    return float(min(m, pp - stage))


def stage_layers(model: TransformerConfig, layout: ParallelLayout, stage: int) -> int:
    """Layers on pipeline stage ``stage`` (the first stages take the remainder)."""
    base, extra = divmod(model.layers, layout.pp)
    return base + (1 if stage < extra else 0)


def training_memory(model: TransformerConfig, layout: ParallelLayout, *, batch: int, seq_len: int,
                    precision: str = "bf16", checkpointing: str = "none", loss_parallel: bool = False,
                    stage: int | None = None, selective_policy: str = "matmuls",
                    moe_imbalance: float = 1.0) -> MemoryEstimate:
    """Peak bytes of one rank. ``batch``: sequences per data-parallel rank per step (split into the layout's
    micro-batches). ``stage``: a pipeline stage, or None for the worst one. ``moe_imbalance``: the busiest
    rank's routed tokens over the mean (mixture-of-experts models)."""
    if stage is None:
        return max((training_memory(model, layout, batch=batch, seq_len=seq_len, precision=precision,
                                    checkpointing=checkpointing, loss_parallel=loss_parallel, stage=s,
                                    selective_policy=selective_policy, moe_imbalance=moe_imbalance)
                    for s in range(layout.pp)), key=lambda e: e.total_bytes)
    assert checkpointing in CHECKPOINTING and precision in MEMORY_PRECISIONS
    tp, cp, shards = layout.tp, layout.cp, layout.fsdp
    first, last = stage == 0, stage == layout.pp - 1
    layers = stage_layers(model, layout, stage)
    experts = model.expert_layer_params() / tp            # a layer's routed experts, all of them
    layer_params = model.layer_params() / tp - experts    # the rest of the layer, sharded by fsdp
    stage_params = layers * layer_params
    if first:
        stage_params += model.embedding_params() / tp
    if last:
        stage_params += (model.head_params() + model.norm_params()) / tp
        if model.tie_embeddings and layout.pp > 1:   # the tied head lives again on the last stage
            stage_params += model.vocab_size * model.d_model / tp

    compute_bytes = 2 if precision == "bf16" else 4
    # this rank's share: the experts split over ep and sharded over expert_fsdp, the rest over fsdp
    on_rank = stage_params / shards + layers * experts / (layout.ep * layout.expert_fsdp)
    params, grads, optimizer = on_rank * 4, on_rank * 4, on_rank * 8
    # two layers' parameters gathered (of the experts, this rank's), one layer's gradient unsharded (then cast to
    # fp32 for the reduce)
    gathered = (layer_params + experts / layout.ep) * (2 * compute_bytes +
                                                       (compute_bytes + 4 if precision == "bf16" else 4))

    micro = max(1, batch // layout.micro_batches)
    tokens = micro * seq_len / cp
    elements = moe_elements_per_token(model, checkpointing, selective_policy, tp, moe_imbalance)
    per_layer = elements * compute_bytes * tokens / tp
    activations = per_layer * layers * in_flight_micro_batches(layout, stage)
    if checkpointing == "full":   # one layer's full set lives again while it is recomputed
        recomputed = replace(model, dense_layers=0, moe_every=1) if model.is_moe else model   # a MoE layer
        activations += moe_elements_per_token(recomputed, "none", tp=tp, imbalance=moe_imbalance) * \
            compute_bytes * tokens / tp
    logits = tokens * model.vocab_size * LOGIT_BYTES_PER_ELEMENT / (tp if loss_parallel else 1) if last else 0.0
    allocated = params + grads + optimizer + gathered + activations + logits
    allowance = CUDA_CONTEXT_BYTES + ALLOCATOR_RESERVE_FRACTION * allocated
    return MemoryEstimate(params, grads, optimizer, gathered, activations, logits, allowance, stage)
