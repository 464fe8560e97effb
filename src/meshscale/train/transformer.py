"""A decoder-only transformer built from a `TransformerConfig`: Llama style (RMSNorm, SwiGLU, rotary positions,
grouped-query attention, no biases) or GPT-2 style (LayerNorm, GELU MLP, learned positions, biases, tied head).

Laid out as torchtitan lays out its Llama so that PyTorch's parallel engines apply by module name: layers in a
ModuleDict keyed "0".."L-1" (a pipeline stage deletes the ones it does not own and keeps the names, so checkpoints
of any layout share keys), ``attention.wq/wk/wv/wo`` and ``feed_forward.w1/w2/w3`` (tensor-parallel plans),
``tok_embeddings``, ``norm``, ``output`` (``None`` on stages that do not hold them). A mixture-of-experts layer has
``moe`` (train/moe.py) where a dense one has ``feed_forward``.

Attention reads its heads from the projections' local widths, so a tensor-parallel rank computes its own heads.
Context parallelism: each rank holds a slice of the sequence; ``attention_context`` (set by train/parallel)
gathers the other ranks' keys and values and says where this rank's queries sit (positions for rotary and the
causal mask). No dropout: runs are deterministic.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from meshscale.models.transformer import TransformerConfig
from meshscale.train.moe import GroupedExperts, MoE, is_moe_layer
from meshscale.train.seeded_init import init_parameters

# (k, v, positions of the local tokens) -> (k, v, positions of the keys) over the whole sequence: how a
# context-parallel rank sees the other ranks' tokens; None: the local tokens are the whole sequence
KVGather = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]


def rotary_tables(cfg: TransformerConfig, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotary angles, (seq_len, head_dim / 2), fp32 (Su et al., RoFormer)."""
    half = cfg.head_dim // 2
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, half, dtype=torch.float32) / half))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[2i], x[2i+1]) of each head by the angle of its position; x: (b, s, heads, head_dim)."""
    pairs = x.float().unflatten(-1, (-1, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        bias = cfg.has_bias
        self.head_dim = cfg.head_dim
        self.rotary = cfg.style == "llama"
        self.wq = nn.Linear(cfg.d_model, cfg.heads * cfg.head_dim, bias=bias)
        self.wk = nn.Linear(cfg.d_model, cfg.kv_dim, bias=bias)
        self.wv = nn.Linear(cfg.d_model, cfg.kv_dim, bias=bias)
        self.wo = nn.Linear(cfg.heads * cfg.head_dim, cfg.d_model, bias=bias)
        self.kv_gather: Optional[KVGather] = None     # context parallelism (train/parallel/context.py)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, -1, self.head_dim)
        k = self.wk(x).view(b, s, -1, self.head_dim)
        v = self.wv(x).view(b, s, -1, self.head_dim)
        if self.rotary:
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        key_positions = positions
        if self.kv_gather is not None:
            k, v, key_positions = self.kv_gather(k, v, positions)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if k.shape[1] != q.shape[1]:   # grouped-query attention: each key/value head serves several query heads
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
        if self.kv_gather is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:   # local queries against the whole sequence: the causal mask by absolute position
            mask = key_positions[None, :] <= positions[:, None]
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.wo(y.transpose(1, 2).reshape(b, s, -1))


class FeedForward(nn.Module):
    """SwiGLU (w2(silu(w1 x) * w3 x)) for Llama, GELU MLP (w2(gelu(w1 x))) for GPT-2."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        bias = cfg.has_bias
        self.w1 = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=bias)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=bias)
        self.w3 = nn.Linear(cfg.d_model, cfg.ffn_dim, bias=False) if cfg.style == "llama" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.w3 is not None:
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(F.gelu(self.w1(x)))


def norm(cfg: TransformerConfig) -> nn.Module:
    return nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps) if cfg.style == "llama" else nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)


class Block(nn.Module):
    def __init__(self, cfg: TransformerConfig, layer: int = 0):
        super().__init__()
        self.attention_norm, self.ffn_norm = norm(cfg), norm(cfg)
        self.attention = Attention(cfg)
        self.moe: Optional[MoE] = MoE(cfg) if is_moe_layer(cfg, layer) else None
        self.feed_forward: Optional[FeedForward] = FeedForward(cfg) if self.moe is None else None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, positions)
        return x + (self.moe if self.moe is not None else self.feed_forward)(self.ffn_norm(x))


class Transformer(nn.Module):
    """Token ids (batch, seq) -> logits (batch, seq, vocab). On a pipeline stage without the embedding the input
    is the previous stage's hidden states (batch, seq, d_model); without the head the output is hidden states.

    Built on a device, it starts from `initialise` with ``seed`` (default: torch's initial seed, which
    ``torch.manual_seed`` sets); built on the meta device, it holds no memory until the layout has parallelized
    it: then ``to_empty`` and `initialise` give each rank its part of the same values (train/parallel/engine.py)."""

    def __init__(self, cfg: TransformerConfig, seq_len: int, seed: Optional[int] = None):
        super().__init__()
        self.cfg, self.seq_len = cfg, seq_len
        self.tok_embeddings: Optional[nn.Embedding] = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_embeddings: Optional[nn.Embedding] = \
            nn.Embedding(cfg.max_seq_len, cfg.d_model) if cfg.style == "gpt2" else None
        self.layers = nn.ModuleDict({str(i): Block(cfg, i) for i in range(cfg.layers)})
        self.norm: Optional[nn.Module] = norm(cfg)
        self.output: Optional[nn.Linear] = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        # not saved: they follow from the shape and this rank's positions (`init_buffers`)
        self.register_buffer("rope_cos", torch.empty(seq_len, cfg.head_dim // 2), persistent=False)
        self.register_buffer("rope_sin", torch.empty(seq_len, cfg.head_dim // 2), persistent=False)
        self.register_buffer("positions", torch.empty(seq_len, dtype=torch.long), persistent=False)
        # a context-parallel rank's positions of the sequence (train/parallel/apply.py); None: all of them
        self.local_positions: Optional[torch.Tensor] = None
        if self.positions.device.type != "meta":
            self.initialise(torch.initial_seed() if seed is None else seed)

    def initialise(self, seed: int) -> None:
        """Parameters from (``seed``, each one's name) as `init_rule` says, whatever the layout has split
        (train/seeded_init.py); the buffers from this rank's positions; a mixture of experts' counters zero."""
        init_parameters(self, seed, init_rule, self.parameter_name)
        self.init_buffers()
        for block in self.layers.values():
            moe = getattr(block, "moe", None)
            if moe is not None:
                moe.reset_counters(self.positions.device)

    @torch.no_grad()
    def init_buffers(self) -> None:
        """The rotary tables and positions of this rank's tokens (all, or a context-parallel rank's), computed on
        the CPU (the same numbers on every device) and placed on the module's device."""
        device = self.positions.device
        with torch.device("cpu"):
            cos, sin = rotary_tables(self.cfg, self.seq_len)
            mine = torch.arange(self.seq_len) if self.local_positions is None else self.local_positions.cpu()
        self.rope_cos, self.rope_sin = cos[mine].contiguous().to(device), sin[mine].contiguous().to(device)
        self.positions = mine.to(device)

    def parameter_name(self, name: str) -> str:
        """A parameter's name as the whole model has it: without the wrappers' parts (activation checkpointing,
        torch.compile); a tied head is the embedding."""
        parts = [p for p in name.split(".") if p not in WRAPPER_NAMES]
        name = ".".join(parts)
        return "tok_embeddings.weight" if self.cfg.tie_embeddings and name == "output.weight" else name

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # every layout runs at the training length: the buffers are this rank's positions (all of them, or its
        # context-parallel slice); a pipeline stage's input may be a sequence-parallel shard, not the length
        positions, cos, sin = self.positions, self.rope_cos, self.rope_sin
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        if self.pos_embeddings is not None and self.tok_embeddings is not None:
            h = h + self.pos_embeddings(positions)
        for layer in self.layers.values():
            h = layer(h, cos, sin, positions)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h


# the parts of a parameter's name that wrappers add: checkpoint_wrapper's and torch.compile's
WRAPPER_NAMES = ("_checkpoint_wrapped_module", "_orig_mod")
INIT_STD = 0.02   # GPT-2's (Radford et al. 2019; its released code's initializer_range)


def init_rule(module: nn.Module, attr: str) -> tuple[str, float]:
    """GPT-2's initialisation for every layout alike: the matrices (linears, embeddings, routed experts) normal
    with std 0.02, biases zero, norms' scales one (their own reset)."""
    if isinstance(module, (nn.RMSNorm, nn.LayerNorm)):
        return ("ones", 0.0) if attr == "weight" else ("zeros", 0.0)
    if attr == "bias":
        return "zeros", 0.0
    if isinstance(module, (nn.Linear, nn.Embedding, GroupedExperts)):
        return "normal", INIT_STD
    raise AssertionError(f"no initial value for {type(module).__name__}.{attr}")
