"""One of meshscale's transformer blocks as the memory tests probe it: bf16, its RMSNorms replaced by one that
saves what CUDA's fused kernel saves (its input and a per-token rstd; on a CPU PyTorch decomposes RMSNorm and
keeps fp32 copies instead), under a checkpointing policy. Shared by test_memory_model.py (what autograd keeps)
and test_memory_frameworks.py (what a compiled block hands to backward)."""
from __future__ import annotations

import torch
import torch.nn as nn

from meshscale.models.transformer import TransformerConfig


class _RMSNorm(torch.autograd.Function):
    """RMSNorm as CUDA's fused kernel saves it (input, per-token rstd), with its backward: the partitioner traces
    it."""

    @staticmethod
    def forward(ctx, x, weight):
        rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)
        ctx.save_for_backward(x, rstd, weight)
        return (x.float() * rstd).to(x.dtype) * weight

    @staticmethod
    def backward(ctx, grad):
        x, rstd, weight = ctx.saved_tensors
        normed = x.float() * rstd
        g = grad.float() * weight.float()
        dx = rstd * (g - normed * (g * normed).mean(-1, keepdim=True))
        return dx.to(x.dtype), (grad.float() * normed).sum((0, 1)).to(weight.dtype)


class FusedRMSNorm(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d, dtype=torch.bfloat16))

    def forward(self, x):
        return _RMSNorm.apply(x, self.weight)


def probe_block(cfg: TransformerConfig, policy: str, seq: int):
    """(a module holding the block as ``layers["0"]``, checkpointed by ``policy``; cos; sin; positions)."""
    from meshscale.train.parallel.apply import apply_checkpointing
    from meshscale.train.transformer import Block, rotary_tables

    holder = nn.Module()
    holder.layers = nn.ModuleDict({"0": Block(cfg).to(torch.bfloat16)})
    if cfg.style == "llama":
        block = holder.layers["0"]
        block.attention_norm, block.ffn_norm = FusedRMSNorm(cfg.d_model), FusedRMSNorm(cfg.d_model)
    apply_checkpointing(holder, policy)
    cos, sin = rotary_tables(cfg, seq)
    return holder, cos, sin, torch.arange(seq)
