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

Pipelines: stage 0 holds the activations of min(micro-batches, stages) micro-batches under 1F1B, all of them under
GPipe, and (1 + (pp - 1) / (pp x v)) x pp under interleaved 1F1B with v stages per rank (Narayanan et al. 2021).

Allowance: CUDA context and library workspaces outside PyTorch's allocator (CUDA_CONTEXT_BYTES), and the caching
allocator's reserve above the allocated peak (ALLOCATOR_RESERVE_FRACTION).
"""
from __future__ import annotations

from dataclasses import dataclass

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
                    stage: int | None = None, selective_policy: str = "matmuls") -> MemoryEstimate:
    """Peak bytes of one rank. ``batch``: sequences per data-parallel rank per step (split into the layout's
    micro-batches). ``stage``: a pipeline stage, or None for the worst one."""
    if stage is None:
        return max((training_memory(model, layout, batch=batch, seq_len=seq_len, precision=precision,
                                    checkpointing=checkpointing, loss_parallel=loss_parallel, stage=s,
                                    selective_policy=selective_policy)
                    for s in range(layout.pp)), key=lambda e: e.total_bytes)
    assert checkpointing in CHECKPOINTING and precision in MEMORY_PRECISIONS
    tp, cp, shards = layout.tp, layout.cp, layout.fsdp
    first, last = stage == 0, stage == layout.pp - 1
    layers = stage_layers(model, layout, stage)
    layer_params = model.layer_params() / tp
    stage_params = layers * layer_params
    if first:
        stage_params += model.embedding_params() / tp
    if last:
        stage_params += (model.head_params() + model.norm_params()) / tp
        if model.tie_embeddings and layout.pp > 1:   # the tied head lives again on the last stage
            stage_params += model.vocab_size * model.d_model / tp

    compute_bytes = 2 if precision == "bf16" else 4
    params = stage_params * 4 / shards
    grads = stage_params * 4 / shards
    optimizer = stage_params * 8 / shards
    # two layers' parameters gathered, one layer's gradient unsharded (then cast to fp32 for the reduce)
    gathered = layer_params * (2 * compute_bytes + (compute_bytes + 4 if precision == "bf16" else 4))

    micro = max(1, batch // layout.micro_batches)
    tokens = micro * seq_len / cp
    per_layer = activation_elements_per_token(model, checkpointing, selective_policy) * compute_bytes * tokens / tp
    activations = per_layer * layers * in_flight_micro_batches(layout, stage)
    if checkpointing == "full":   # one layer's full set lives again while it is recomputed
        activations += activation_elements_per_token(model, "none") * compute_bytes * tokens / tp
    logits = tokens * model.vocab_size * LOGIT_BYTES_PER_ELEMENT / (tp if loss_parallel else 1) if last else 0.0
    allocated = params + grads + optimizer + gathered + activations + logits
    allowance = CUDA_CONTEXT_BYTES + ALLOCATOR_RESERVE_FRACTION * allocated
    return MemoryEstimate(params, grads, optimizer, gathered, activations, logits, allowance, stage)
