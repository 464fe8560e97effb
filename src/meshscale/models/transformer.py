"""Decoder-only transformer shapes: Llama-style (RMSNorm, SwiGLU, rotary positions, grouped-query attention, no
biases) and GPT-2-style (LayerNorm with bias, GELU MLP, learned positions, biases, tied head).

Mixture-of-experts models (Mixtral, Qwen2/3-MoE, DeepSeek-V2/V3, gpt-oss) replace the MLP of some layers by routed
experts (and shared ones); DeepSeek's multi-head latent attention (MLA) projects queries and keys/values through
low-rank latents. Their projections are counted as the configs define them, so total and active parameter counts
reproduce the published ones (presets.yaml holds both, with their sources).

A `TransformerConfig` comes from a named preset (presets.yaml: published shapes, each with the parameter count its
source states) or a Hugging Face ``config.json`` (shapes only; models/hf_config.py reads them). Parameter counts and
FLOPs follow from the shape.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property, lru_cache, wraps
from pathlib import Path
from typing import Any

from meshscale.errors import MeshscaleError
from meshscale.models.hf_config import hf_fields
from meshscale.validation import load_structured, number, typed

STYLES = ("llama", "gpt2")
_PRESETS = Path(__file__).with_name("presets.yaml")
_MAX_DIM = 1 << 24  # no published shape is near 16M on any axis; larger is a typo

# The largest shape meshscale takes on each axis, several times the largest published model's (sources in
# docs/references.md): predict's work grows with layers (kernels per layer), widths (tensor sizes, optimizer
# launches) and experts, so a bound here keeps every command on any config quick. A larger value is refused in one
# line naming the field, the limit and where the limit comes from.
SHAPE_LIMITS: dict[str, tuple[int, str]] = {
    "layers": (1024, "8x the deepest published decoder, Llama 3.1 405B's 126 layers"),
    "d_model": (1 << 17, "6x the widest, Megatron-Turing NLG 530B's hidden size of 20,480"),
    "heads": (1024, "8x the most attention heads published, 128 (Llama 3.1 405B, MT-NLG 530B)"),
    "kv_heads": (1024, "8x the most attention heads published, 128 (Llama 3.1 405B, MT-NLG 530B)"),
    "ffn_dim": (1 << 19, "6x the widest MLP, MT-NLG 530B's 81,920"),
    "vocab_size": (1 << 21, "8x the largest vocabulary, Gemma 3's 262,144"),
    "max_seq_len": (1 << 24, "above the longest context, Llama 4 Scout's 10,485,760 positions"),
    "experts": (4096, "10x the most routed experts, Kimi K2's 384"),
    "experts_per_token": (4096, "10x the most routed experts, Kimi K2's 384"),
    "expert_ffn_dim": (1 << 19, "6x the widest MLP, MT-NLG 530B's 81,920"),
    "shared_experts": (4096, "10x the most routed experts, Kimi K2's 384"),
    "dense_layers": (1024, "8x the deepest published decoder, Llama 3.1 405B's 126 layers"),
    "moe_every": (1024, "8x the deepest published decoder, Llama 3.1 405B's 126 layers"),
    "shared_expert_ffn_dim": (1 << 19, "6x the widest MLP, MT-NLG 530B's 81,920"),
    # a head's widths and attention's latent ranks: at most the hidden size's limit
    **{name: (1 << 17, "the hidden size's limit, 6x MT-NLG 530B's 20,480") for name in
       ("attn_head_dim", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")},
}


def _per_shape(method):
    """``method`` of a (frozen) shape, found once per shape and arguments: the step and memory models ask a
    layer's parameter counts millions of times in a layout search. Kept beside the fields, never compared."""
    name = method.__name__

    @wraps(method)
    def kept(self, *args, **kwargs):
        memo = self.__dict__.setdefault("_per_shape", {})
        key = (name, args, tuple(sorted(kwargs.items())))
        if key not in memo:
            memo[key] = method(self, *args, **kwargs)
        return memo[key]
    return kept


@dataclass(frozen=True)
class TransformerConfig:
    """The shape of a decoder-only transformer."""

    name: str
    layers: int
    d_model: int
    heads: int
    kv_heads: int
    ffn_dim: int
    vocab_size: int
    max_seq_len: int
    style: str = "llama"          # llama | gpt2
    tie_embeddings: bool = False
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    published_params: int | None = None
    source: str = ""
    # mixture-of-experts (0 experts: a dense model). A MoE layer replaces the MLP by `experts` routed experts of
    # width `expert_ffn_dim` (0: ffn_dim), `experts_per_token` of them chosen per token by the router's scores
    # (`router`: softmax or sigmoid), beside `shared_experts` that every token passes through; the first
    # `dense_layers` layers keep a dense MLP of ffn_dim (DeepSeek's first_k_dense_replace).
    experts: int = 0
    experts_per_token: int = 0
    expert_ffn_dim: int = 0
    shared_experts: int = 0
    dense_layers: int = 0
    router: str = "softmax"
    # after the dense layers, a MoE layer every `moe_every` layers (Qwen2-MoE's decoder_sparse_step: layer i is MoE
    # when (i + 1) % step == 0); a shared expert's width (0: expert_ffn_dim; Qwen2-MoE's
    # shared_expert_intermediate_size) and its sigmoid gate (Qwen2-MoE: a d_model -> 1 linear); biases on the
    # router (gpt-oss's linear; DeepSeek-V3's e_score_correction_bias) and on each expert's projections (gpt-oss)
    moe_every: int = 1
    shared_expert_ffn_dim: int = 0
    shared_expert_gate: bool = False
    router_bias: bool = False
    expert_bias: bool = False
    # attention beyond Llama's: a head width of its own (0: d_model / heads; Qwen3 and gpt-oss state 128 and 64),
    # RMSNorm of q and k per head (Qwen3), biases (qkv: Qwen2; all: q, k, v and the output, gpt-oss), a learned
    # sink logit per head (gpt-oss)
    attn_head_dim: int = 0
    qk_norm: bool = False
    attention_bias: str = "none"
    attention_sinks: bool = False
    # multi-head latent attention (DeepSeek-V2/V3; on when kv_lora_rank > 0): queries through a rank-q_lora_rank
    # latent (0: projected directly), keys and values through a rank-kv_lora_rank latent, each head's query and key
    # qk_nope_head_dim + qk_rope_head_dim wide (the rotary part of the key shared by the heads), its value v_head_dim
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    published_active_params: int | None = None
    ignored: tuple[str, ...] = ()   # config.json fields meshscale does not model, named where it is used

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @cached_property
    def head_dim(self) -> int:
        return self.attn_head_dim or self.d_model // self.heads

    @cached_property
    def kv_dim(self) -> int:
        """Width of K (and of V): kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    @cached_property
    def qk_head_dim(self) -> int:
        """Width of one head's query and key (MLA: its nope and rotary parts)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @cached_property
    def value_head_dim(self) -> int:
        return self.v_head_dim if self.is_mla else self.head_dim

    @cached_property
    def q_dim(self) -> int:
        """Width of all query heads together (d_model for a Llama or GPT-2 shape)."""
        return self.heads * self.qk_head_dim

    @property
    def has_bias(self) -> bool:
        return self.style == "gpt2"

    @property
    def routed_ffn_dim(self) -> int:
        """A routed expert's width."""
        return self.expert_ffn_dim or self.ffn_dim

    @property
    def shared_ffn_dim(self) -> int:
        """A shared expert's width."""
        return self.shared_expert_ffn_dim or self.routed_ffn_dim

    # ---- layers ----------------------------------------------------------------------------------------
    @_per_shape
    def moe_layer_count(self) -> int:
        """Layers whose MLP is a mixture of experts: after the dense ones, every moe_every-th."""
        if not self.is_moe:
            return 0
        return sum(1 for i in range(self.dense_layers, self.layers) if (i - self.dense_layers + 1) % self.moe_every == 0)

    @_per_shape
    def moe_share(self) -> float:
        """The share of the layers that are MoE layers (what an average layer of the step model carries)."""
        return self.moe_layer_count() / self.layers

    # ---- parameters ------------------------------------------------------------------------------------
    def attention_matrices(self) -> list[tuple[int, int]]:
        """(inputs, outputs) of each attention projection, in the order a layer applies them: Q, K, V and the
        output; under MLA the query latent and its up-projection, the key/value latent (with the shared rotary
        key) and its up-projection to every head's key and value, and the output."""
        d, h = self.d_model, self.heads
        if not self.is_mla:
            return [(d, self.q_dim), (d, self.kv_dim), (d, self.kv_dim), (h * self.value_head_dim, d)]
        q = [(d, self.q_lora_rank), (self.q_lora_rank, self.q_dim)] if self.q_lora_rank else [(d, self.q_dim)]
        kv = [(d, self.kv_lora_rank + self.qk_rope_head_dim),
              (self.kv_lora_rank, h * (self.qk_nope_head_dim + self.v_head_dim))]
        return q + kv + [(h * self.v_head_dim, d)]

    @_per_shape
    def attention_params(self) -> int:
        """The attention projections of one layer, their biases (GPT-2, Qwen2, gpt-oss), MLA's latent norms,
        Qwen3's per-head q/k norms and gpt-oss's sinks."""
        weights = sum(i * o for i, o in self.attention_matrices())
        outputs = [o for _, o in self.attention_matrices()]
        bias = "all" if self.has_bias else self.attention_bias
        biases = sum(outputs[:3]) + (outputs[-1] if bias == "all" else 0) if bias != "none" else 0
        norms = (self.q_lora_rank + self.kv_lora_rank) + (2 * self.head_dim if self.qk_norm else 0)
        return weights + biases + norms + (self.heads if self.attention_sinks else 0)

    @_per_shape
    def mlp_params(self) -> int:
        """The dense MLP: SwiGLU's three matrices (Llama) or GELU's two (GPT-2, with biases)."""
        d, f = self.d_model, self.ffn_dim
        if self.style == "llama":
            return 3 * d * f
        return 2 * d * f + f + d

    @_per_shape
    def expert_params(self) -> int:
        """One routed expert: SwiGLU's three matrices (gpt-oss: with biases)."""
        d, f = self.d_model, self.routed_ffn_dim
        return 3 * d * f + ((2 * f + d) if self.expert_bias else 0)

    @_per_shape
    def router_params(self) -> int:
        return self.d_model * self.experts + (self.experts if self.router_bias else 0)

    @_per_shape
    def shared_params(self) -> int:
        """The shared experts (and Qwen2-MoE's gate on them)."""
        return self.shared_experts * 3 * self.d_model * self.shared_ffn_dim + \
            (self.d_model if self.shared_expert_gate else 0)

    @_per_shape
    def moe_mlp_params(self, active: bool = False) -> int:
        """A MoE layer's MLP: the router, the routed experts (``active``: a token's top-k of them) and the shared
        ones."""
        routed = self.experts_per_token if active else self.experts
        return self.router_params() + routed * self.expert_params() + self.shared_params()

    @_per_shape
    def norm_params(self) -> int:
        """One norm: RMSNorm has a scale, LayerNorm a scale and a bias."""
        return self.d_model * (1 if self.style == "llama" else 2)

    @_per_shape
    def dense_layer_params(self) -> int:
        return self.attention_params() + self.mlp_params() + 2 * self.norm_params()

    @_per_shape
    def moe_layer_params(self, active: bool = False) -> int:
        return self.attention_params() + self.moe_mlp_params(active) + 2 * self.norm_params()

    @_per_shape
    def all_layer_params(self, active: bool = False) -> int:
        """Every layer's parameters (``active``: those one token passes through)."""
        moe = self.moe_layer_count()
        return (self.layers - moe) * self.dense_layer_params() + moe * self.moe_layer_params(active)

    @_per_shape
    def layer_params(self) -> float:
        """A layer's parameters: of a MoE model, the mean over its layers (dense and MoE)."""
        return self.all_layer_params() / self.layers if self.is_moe else self.dense_layer_params()

    @_per_shape
    def expert_layer_params(self) -> float:
        """Of `layer_params`, the routed experts' (what expert parallelism shards), mean over the layers."""
        return self.moe_layer_count() * self.experts * self.expert_params() / self.layers

    @_per_shape
    def embedding_params(self) -> int:
        """Token embedding (and learned positions for GPT-2)."""
        return self.vocab_size * self.d_model + (self.max_seq_len * self.d_model if self.style == "gpt2" else 0)

    @_per_shape
    def head_params(self) -> int:
        """The output projection to the vocabulary: none of its own when tied to the embedding."""
        return 0 if self.tie_embeddings else self.vocab_size * self.d_model

    @_per_shape
    def params(self) -> int:
        """All parameters: embeddings, layers, final norm, head."""
        return self.embedding_params() + self.all_layer_params() + self.norm_params() + self.head_params()

    @_per_shape
    def active_params(self, embedding: bool = True) -> int:
        """Parameters one token passes through: every layer's attention and dense MLP, a MoE layer's router, its
        top-k routed experts and its shared ones, the ends (``embedding`` False: without the input embedding's
        lookup, as OpenAI counts gpt-oss's active parameters). A dense model's are all of them."""
        ends = (self.embedding_params() if embedding else 0) + self.norm_params() + self.head_params()
        if self.tie_embeddings and not embedding:
            ends += self.vocab_size * self.d_model   # the tied matrix still multiplies every token as the head
        return self.all_layer_params(active=True) + ends

    @_per_shape
    def matmul_params(self) -> int:
        """Parameters that multiply every token: the layers' matrices (of a MoE layer the router, a token's top-k
        experts and the shared ones) and the head (the tied embedding counts once, as the head); embedding
        lookups, norms and biases do no matmul."""
        d = self.d_model
        attention = sum(i * o for i, o in self.attention_matrices())
        dense = (3 if self.style == "llama" else 2) * d * self.ffn_dim
        moe = d * self.experts + self.experts_per_token * 3 * d * self.routed_ffn_dim + \
            self.shared_experts * 3 * d * self.shared_ffn_dim
        moe_layers = self.moe_layer_count()
        return self.layers * attention + (self.layers - moe_layers) * dense + moe_layers * moe + self.vocab_size * d

    # ---- FLOPs -----------------------------------------------------------------------------------------
    def attention_flops_per_token(self, seq_len: int, causal: bool = True) -> float:
        """Forward FLOPs of the attention scores and their weighted sum (QK^T and PV), per token, all layers.
        ``causal``: a token attends to (seq_len + 1) / 2 positions on average, as FlashAttention computes it;
        otherwise to all seq_len (the convention of MFU formulas)."""
        context = (seq_len + 1) / 2 if causal else seq_len
        return 2 * self.layers * self.heads * (self.qk_head_dim + self.value_head_dim) * context

    def training_flops_per_token(self, seq_len: int) -> float:
        """Forward + backward FLOPs per token as MFU is counted (PaLM appendix B, torchtitan, Megatron):
        6 x matmul parameters + 12 x layers x d_model x seq_len (attention taken as non-causal); a MoE model's
        matmul parameters are a token's active ones."""
        return 6.0 * self.matmul_params() + 3 * self.attention_flops_per_token(seq_len, causal=False)

    def with_seq_len(self, seq_len: int) -> "TransformerConfig":
        return replace(self, max_seq_len=seq_len)


# the fields of mixture-of-experts, attention variants and MLA (whole numbers >= 0; moe_every >= 1)
_COUNT_FIELDS = ("experts", "experts_per_token", "expert_ffn_dim", "shared_experts", "dense_layers",
                 "shared_expert_ffn_dim", "attn_head_dim", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim",
                 "qk_nope_head_dim", "v_head_dim")
_FLAG_FIELDS = ("shared_expert_gate", "router_bias", "expert_bias", "qk_norm", "attention_sinks")
ROUTERS = ("softmax", "sigmoid")
ATTENTION_BIASES = ("none", "qkv", "all")


def _positive(value: Any, where: str) -> int:
    return int(number(value, where, 1, _MAX_DIM, integer=True))


def _check_moe(cfg: TransformerConfig, where: str) -> None:
    """A mixture of experts' rules: top-k within the experts, at least one MoE layer, no expert field without
    experts."""
    if not cfg.is_moe:
        stray = [k for k in ("experts_per_token", "expert_ffn_dim", "shared_experts", "dense_layers")
                 if getattr(cfg, k)]
        if stray:
            raise MeshscaleError(f"{where}: {stray[0]} {getattr(cfg, stray[0])} without experts (give experts > 0)")
        return
    if not 1 <= cfg.experts_per_token <= cfg.experts:
        raise MeshscaleError(f"{where}: {cfg.experts_per_token} experts per token: give 1 to the {cfg.experts} "
                             "experts")
    if cfg.router not in ROUTERS:
        raise MeshscaleError(f"{where}: router {cfg.router!r}: meshscale prices {', '.join(ROUTERS)} scoring")
    if cfg.moe_layer_count() == 0:
        raise MeshscaleError(f"{where}: no MoE layer: {cfg.dense_layers} dense layers of {cfg.layers} (moe_every "
                             f"{cfg.moe_every})")


def check_shape_limits(cfg: TransformerConfig, where: str, labels: dict[str, str] | None = None) -> None:
    """Every axis of ``cfg`` within `SHAPE_LIMITS`; one line naming the field, the limit and its source."""
    for field_name, (most, source) in SHAPE_LIMITS.items():
        value = getattr(cfg, field_name, 0)
        if isinstance(value, int) and value > most:
            label = (labels or {}).get(field_name, field_name)
            raise MeshscaleError(f"{where}: {label} {value:,} is above meshscale's limit of {most:,} ({source})")


def _check(cfg: TransformerConfig, where: str, labels: dict[str, str] | None = None) -> TransformerConfig:
    """The rules a shape must obey, each refused in one line naming the field."""
    check_shape_limits(cfg, where, labels)
    if cfg.style not in STYLES:
        raise MeshscaleError(f"{where}: style {cfg.style!r} is not one of {', '.join(STYLES)}")
    if cfg.d_model % cfg.heads and not cfg.attn_head_dim and not cfg.is_mla:
        raise MeshscaleError(f"{where}: hidden size {cfg.d_model} is not divisible by the {cfg.heads} attention heads")
    if cfg.heads % cfg.kv_heads:
        raise MeshscaleError(f"{where}: {cfg.heads} attention heads are not a multiple of the {cfg.kv_heads} "
                             "key/value heads")
    if cfg.attention_bias not in ATTENTION_BIASES:
        raise MeshscaleError(f"{where}: attention_bias {cfg.attention_bias!r}: use one of {', '.join(ATTENTION_BIASES)}")
    if cfg.is_mla and not (cfg.qk_nope_head_dim and cfg.qk_rope_head_dim and cfg.v_head_dim):
        raise MeshscaleError(f"{where}: multi-head latent attention (kv_lora_rank {cfg.kv_lora_rank}) needs "
                             "qk_nope_head_dim, qk_rope_head_dim and v_head_dim")
    _check_moe(cfg, where)
    return cfg


def _extra_fields(fields: dict, label) -> dict:
    """The MoE, attention and MLA fields present in ``fields``, each checked (see `TransformerConfig`)."""
    out: dict[str, Any] = {}
    for key in _COUNT_FIELDS:
        if key in fields:
            out[key] = int(number(fields[key], label(key), 0, _MAX_DIM, integer=True))
    if "moe_every" in fields:
        out["moe_every"] = _positive(fields["moe_every"], label("moe_every"))
    for key in _FLAG_FIELDS:
        if key in fields:
            out[key] = typed(fields[key], label(key), (bool,), "true or false")
    for key in ("router", "attention_bias"):
        if key in fields:
            out[key] = typed(fields[key], label(key), (str,), "a string")
    if fields.get("published_active_params") is not None:
        out["published_active_params"] = int(number(fields["published_active_params"],
                                                     label("published_active_params"), 1, integer=True))
    if "ignored" in fields:
        out["ignored"] = tuple(str(k) for k in fields["ignored"])
    return out


def config_from_fields(name: str, fields: dict, where: str, labels: dict[str, str] | None = None) -> TransformerConfig:
    """A config from preset-style fields (see presets.yaml), every number checked; ``labels`` names a field as the
    user's file spells it."""
    labels = labels or {}
    if not isinstance(fields, dict):
        raise MeshscaleError(f"{where}: expected a mapping of the model's fields")
    missing = [k for k in ("layers", "d_model", "heads", "ffn_dim", "vocab_size", "max_seq_len") if k not in fields]
    if missing:
        raise MeshscaleError(f"{where}: missing field {missing[0]}")
    ints = {k: _positive(fields[k], f"{where}: {labels.get(k, k)}") for k in
            ("layers", "d_model", "heads", "ffn_dim", "vocab_size", "max_seq_len")}
    label = lambda key: f"{where}: {labels.get(key, key)}"  # noqa: E731
    kv = _positive(fields.get("kv_heads", ints["heads"]), label("kv_heads"))
    # every other field of its own kind: "false" or [false] is no boolean (bool() of either is true)
    style = typed(fields.get("style", "llama"), label("style"), (str,), "a string")
    tie = typed(fields.get("tie_embeddings", style == "gpt2"), label("tie_embeddings"), (bool,), "true or false")
    theta = float(number(fields.get("rope_theta", 10000.0), label("rope_theta"), 0, 1e12, lo_open=True))
    published = fields.get("published_params")
    published = None if published is None else int(number(published, label("published_params"), 1, integer=True))
    source = typed(fields.get("source", ""), label("source"), (str,), "a string")
    return _check(TransformerConfig(name=name, kv_heads=kv, style=style, tie_embeddings=tie, rope_theta=theta,
                                    published_params=published, source=source, **ints,
                                    **_extra_fields(fields, label)), where, labels)


@lru_cache(maxsize=1)
def _preset_table() -> dict:
    return load_structured(_PRESETS, "model preset file", yaml_ok=True)


def preset_names() -> list[str]:
    return list(_preset_table())


def preset(name: str) -> TransformerConfig:
    table = _preset_table()
    if name not in table:
        raise MeshscaleError(f"unknown model {name!r}; presets: {', '.join(table)}, or a config.json file")
    return config_from_fields(name, table[name], f"model preset {name}")


def from_hf_config(path: str | Path) -> TransformerConfig:
    """The shape in a Hugging Face ``config.json`` (Llama-style, GPT-2-style and mixture-of-experts model types;
    `hf_config.hf_fields` reads it)."""
    fields, labels = hf_fields(load_structured(path, "model config.json"), str(path))
    return config_from_fields(Path(path).stem if Path(path).stem != "config" else Path(path).resolve().parent.name
                              or "config", fields, str(path), labels)


def load_model_config(name_or_path: str) -> TransformerConfig:
    """A preset by name, or a Hugging Face config.json by path (anything ending in .json)."""
    if name_or_path.endswith(".json") or Path(name_or_path).is_file():
        return from_hf_config(name_or_path)
    return preset(name_or_path)


def is_transformer_model(name_or_path: str) -> bool:
    """Whether ``name_or_path`` names a transformer preset or a config file (rather than a ResNet or CNN)."""
    return name_or_path in _preset_table() or name_or_path.endswith(".json")
