"""Applying a layout to a `Transformer`, in torchtitan's order: pipeline split, tensor/sequence parallel, expert
parallel, context parallel, activation checkpointing, then FSDP2 per block (a mixture of experts' parts on meshes of
their own) and at the root."""
from __future__ import annotations

import copy
from functools import partial

import torch
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh

from meshscale.errors import MeshscaleError
from meshscale.models.layout import ParallelLayout
from meshscale.models.memory import stage_layers
from meshscale.train.parallel.mesh import MOE_DIMS, LayoutMesh
from meshscale.train.transformer import Transformer


# ---- pipeline -----------------------------------------------------------------------------------------------
def stage_ids(layout: ParallelLayout, pp_rank: int) -> list[int]:
    """The pipeline stages this rank runs: one, or ``stages_per_rank`` interleaved ones (rank r: r, r + pp, ...)."""
    v = layout.stages_per_rank if layout.pp_schedule == "interleaved-1f1b" else 1
    return [pp_rank + k * layout.pp for k in range(v)]


def stage_count(layout: ParallelLayout) -> int:
    return layout.pp * (layout.stages_per_rank if layout.pp_schedule == "interleaved-1f1b" else 1)


def split_stage(model: Transformer, stage: int, stages: int) -> Transformer:
    """A copy of ``model`` keeping only what stage ``stage`` of ``stages`` runs (layer names kept; on the meta
    device the copy costs no memory)."""
    part = copy.deepcopy(model)
    split = _as_layout(stages)
    first = sum(stage_layers(model.cfg, split, s) for s in range(stage))
    keep = {str(i) for i in range(first, first + stage_layers(model.cfg, split, stage))}
    for name in list(part.layers.keys()):
        if name not in keep:
            del part.layers[name]
    if stage > 0:
        part.tok_embeddings = part.pos_embeddings = None
    if stage < stages - 1:
        part.norm = part.output = None
    return part


def _as_layout(stages: int) -> ParallelLayout:
    """The even split of layers over ``stages`` (training_memory's, so both count the same layers per stage)."""
    return ParallelLayout(pp=stages)


# ---- tensor parallel -----------------------------------------------------------------------------------------
def apply_tensor_parallel(model: Transformer, tp_mesh: DeviceMesh) -> None:
    """Megatron-style tensor parallelism with sequence parallelism, as torchtitan plans it: Q/K/V and the FFN's
    input projections split by columns, the output projections by rows; norms and the residual stream split
    along the sequence; the head gathers the full logits on every tp rank. A mixture of experts takes the tp
    rank's own tokens of the sequence (its parts are not split: `apply_experts`)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)
    if model.pos_embeddings is not None or model.cfg.style != "llama":
        raise MeshscaleError("--tp: tensor parallelism is implemented for Llama-style models; use --fsdp or --pp "
                             "for GPT-2-style ones")
    top = {}
    if model.tok_embeddings is not None:
        top["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1))
    if model.norm is not None:
        top["norm"] = SequenceParallel()
        top["output"] = ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate(), use_local_output=True)
    parallelize_module(model, tp_mesh, top)
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None, None),
                                            desired_input_layouts=(Replicate(), None, None, None)),
            "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "ffn_norm": SequenceParallel(),
            # a mixture of experts takes the rank's own positions of the sequence as plain tensors
            **(_mlp_plan() if block.moe is None else {"moe": PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Shard(1),), use_local_output=True)}),
        })


def _mlp_plan() -> dict:
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel
    return {"feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1))}


# ---- mixture of experts --------------------------------------------------------------------------------------
def apply_experts(model: Transformer, mesh: LayoutMesh) -> None:
    """Each MoE layer's part of the layout. Expert parallelism: the routed experts split over the ep ranks
    (DTensors sharded on dim 0 of the experts' ep mesh, each rank keeping its own block of the whole), tokens
    exchanged over the ep group. A sequence split over cp and tp ranks: its balance-loss counts added up over
    them. Gradients: FSDP averages each part over its own mesh (`apply_fsdp`); the factor that turns that average
    into the mean over the data ranks (dp x fsdp x cp; the tp ranks and an expert's ep group add their tokens'
    parts): routed experts tp / ep, router and shared experts tp. The balance loss's gradient: cp on each of a
    sequence's ranks, whose shares FSDP averages over the cp ranks (tp ranks' add up)."""
    from torch.distributed.tensor import Shard, distribute_tensor
    layout = mesh.layout
    for block in model.layers.values():
        moe = block.moe
        if moe is None:
            continue
        if layout.ep > 1:
            ep_mesh = mesh.experts["ep"]
            moe.ep_group = ep_mesh.get_group()
            for name in ("w1", "w2", "w3"):
                whole = getattr(moe.experts, name).detach()
                setattr(moe.experts, name, nn.Parameter(distribute_tensor(whole, ep_mesh, [Shard(0)],
                                                                          src_data_rank=None)))
        if layout.cp * layout.tp > 1:
            moe.sequence_group = mesh.sequence_group()
        moe.aux_scale = float(layout.cp)
        moe.experts.grad_scale = layout.tp / layout.ep
        moe.router.grad_scale = float(layout.tp)
        if moe.shared_experts is not None:
            moe.shared_experts.grad_scale = float(layout.tp)


# ---- context parallel ----------------------------------------------------------------------------------------
def context_chunks(seq_len: int, cp: int, cp_rank: int) -> torch.Tensor:
    """The positions a context-parallel rank holds: chunks ``r`` and ``2 cp - 1 - r`` of 2 cp equal chunks, so
    every rank has the same share of the causal attention's work (the load balancing of Llama 3's and
    torch's context parallelism)."""
    size = seq_len // (2 * cp)
    chunks = (cp_rank, 2 * cp - 1 - cp_rank)
    return torch.cat([torch.arange(c * size, (c + 1) * size) for c in chunks])


def apply_context_parallel(model: Transformer, cp_mesh: DeviceMesh, seq_len: int, device: torch.device) -> torch.Tensor:
    """Each rank keeps its positions' rotary tables (`Transformer.init_buffers`, once materialized); attention
    all-gathers keys and values over the cp group (differentiably: the backward reduce-scatters their gradients),
    as Llama 3 trained long contexts (The Llama 3 Herd of Models, section 3.3.2). Returns this rank's positions
    (to slice inputs and targets)."""
    cp, rank = cp_mesh.size(), cp_mesh.get_local_rank()
    mine = context_chunks(seq_len, cp, rank)
    every = torch.cat([context_chunks(seq_len, cp, r) for r in range(cp)]).to(device)
    model.local_positions = mine
    if model.positions.device.type != "meta":   # built on a device: its tables now, not at materialization
        model.init_buffers()

    def gather(k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor):
        # along the sequence (dim 1), in rank order: `every` lists the positions in that order
        return (funcol.all_gather_tensor_autograd(k.contiguous(), gather_dim=1, group=cp_mesh),
                funcol.all_gather_tensor_autograd(v.contiguous(), gather_dim=1, group=cp_mesh), every)
    for block in model.layers.values():
        block.attention.kv_gather = gather
    return mine


# ---- activation checkpointing --------------------------------------------------------------------------------
def _save_matmuls_and_attention():
    """Op-level selective checkpointing: keep the outputs of matrix multiplications and attention, recompute
    the element-wise ops (torchtitan's selective op policy, without its every-other-matmul refinement)."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
    aten = torch.ops.aten
    keep = {aten.mm.default, aten.addmm.default, aten.bmm.default,
            aten._scaled_dot_product_efficient_attention.default, aten._scaled_dot_product_flash_attention.default,
            aten._scaled_dot_product_cudnn_attention.default,
            aten._scaled_dot_product_flash_attention_for_cpu.default,
            aten._scaled_mm.default}   # fp8's matmuls (torchtitan's save list has them too)

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE
    return create_selective_checkpoint_contexts(policy)


def apply_checkpointing(model: Transformer, policy: str) -> None:
    """Wrap each block: ``full`` keeps only its input and recomputes it in backward; ``selective`` keeps what
    `_save_matmuls_and_attention` says, except in a mixture-of-experts block, recomputed whole: op-level caching
    cannot replay its dispatch (the token counts' host copy and the all-to-alls around it)."""
    if policy == "none":
        return
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    for name, block in list(model.layers.items()):
        extra = {"context_fn": _save_matmuls_and_attention} if policy == "selective" and block.moe is None else {}
        model.layers[name] = checkpoint_wrapper(block, preserve_rng_state=False, **extra)


# ---- FSDP2 ---------------------------------------------------------------------------------------------------
def apply_fsdp(model: nn.Module, mesh: LayoutMesh, bf16: bool, reshard_after_forward: bool = True) -> None:
    """fully_shard each block, then the root (embedding, norm, head); bf16 parameters and compute with fp32
    gradient reduction when ``bf16`` (MixedPrecisionPolicy, as torchtitan trains). A MoE layer's routed experts
    (under ep or tp) and its router and shared experts (under tp) first, each on its own mesh (`apply_experts`)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 \
        else MixedPrecisionPolicy()
    shard = partial(fully_shard, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    layout = mesh.layout
    for block in model.layers.values():
        moe = getattr(block, "moe", None)
        if moe is not None and (layout.ep > 1 or layout.tp > 1):
            shard(moe.experts, mesh=mesh.expert_sharding_mesh())
        if moe is not None and layout.tp > 1:
            rest = mesh.fsdp_mesh(MOE_DIMS)
            for part in (moe.router, moe.shared_experts):
                if part is not None:
                    shard(part, mesh=rest)
        shard(block, mesh=mesh.sharding_mesh())
    shard(model, mesh=mesh.sharding_mesh())


def apply_compile(model: Transformer, mode: str | None) -> None:
    """torch.compile each block, as torchtitan does (the blocks share their compiled code; FSDP2's hooks stay
    outside it); a mixture of experts' host syncs (the all-to-all's splits) break its graph there."""
    if mode is None:
        return
    for name, block in list(model.layers.items()):
        model.layers[name] = torch.compile(block, mode=None if mode == "default" else mode)


def parallelize(model: Transformer, mesh: LayoutMesh, seq_len: int, checkpointing: str, bf16: bool,
                compile_mode: str | None = None, device: torch.device | None = None) -> list[Transformer]:
    """This rank's stage modules of ``model`` (built on the meta device, or identically on every rank), each
    parallelized; ``device``: where they will run (context parallelism's positions are placed there)."""
    layout = mesh.layout
    if layout.pp > 1:
        parts = [split_stage(model, s, stage_count(layout)) for s in stage_ids(layout, mesh.coordinate("pp"))]
    else:
        parts = [model]
    for part in parts:
        if layout.tp > 1:
            apply_tensor_parallel(part, mesh["tp"])
        apply_experts(part, mesh)
        if layout.cp > 1:
            apply_context_parallel(part, mesh["cp"], seq_len, device or part.positions.device)
        apply_checkpointing(part, checkpointing)
        apply_compile(part, compile_mode)
        # a pipeline runs each stage several times a step: keep its parameters gathered between micro-batches
        apply_fsdp(part, mesh, bf16, reshard_after_forward=layout.pp == 1)
    return parts


def materialize(parts: list[Transformer], device: torch.device, seed: int) -> None:
    """Give each part built on the meta device its memory on ``device`` (this rank's shards only) and its
    initial values: those a whole-model build from ``seed`` has, whatever the layout split."""
    for part in parts:
        part.to_empty(device=device)
        part.initialise(seed)
