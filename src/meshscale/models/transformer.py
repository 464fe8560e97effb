"""Decoder-only transformer shapes: Llama-style (RMSNorm, SwiGLU, rotary positions, grouped-query attention, no
biases) and GPT-2-style (LayerNorm with bias, GELU MLP, learned positions, biases, tied head).

A `TransformerConfig` comes from a named preset (presets.yaml: published shapes, each with the parameter count its
source states) or a Hugging Face ``config.json`` (shapes only). Parameter counts and FLOPs follow from the shape.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from meshscale.errors import MeshscaleError
from meshscale.validation import load_structured, number, typed

STYLES = ("llama", "gpt2")
_PRESETS = Path(__file__).with_name("presets.yaml")
_MAX_DIM = 1 << 24  # no published shape is near 16M on any axis; larger is a typo


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

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def head_dim(self) -> int:
        return self.d_model // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): kv_heads x head_dim."""
        return self.kv_heads * self.head_dim

    @property
    def has_bias(self) -> bool:
        return self.style == "gpt2"

    # ---- parameters ------------------------------------------------------------------------------------
    def attention_params(self) -> int:
        """Q, K, V and output projections of one layer (with biases for GPT-2)."""
        d, kv = self.d_model, self.kv_dim
        weights = d * d + 2 * d * kv + d * d
        return weights + ((d + 2 * kv + d) if self.has_bias else 0)

    def mlp_params(self) -> int:
        """SwiGLU's three matrices (Llama) or GELU's two (GPT-2, with biases)."""
        d, f = self.d_model, self.ffn_dim
        if self.style == "llama":
            return 3 * d * f
        return 2 * d * f + f + d

    def norm_params(self) -> int:
        """One norm: RMSNorm has a scale, LayerNorm a scale and a bias."""
        return self.d_model * (1 if self.style == "llama" else 2)

    def layer_params(self) -> int:
        return self.attention_params() + self.mlp_params() + 2 * self.norm_params()

    def embedding_params(self) -> int:
        """Token embedding (and learned positions for GPT-2)."""
        return self.vocab_size * self.d_model + (self.max_seq_len * self.d_model if self.style == "gpt2" else 0)

    def head_params(self) -> int:
        """The output projection to the vocabulary: none of its own when tied to the embedding."""
        return 0 if self.tie_embeddings else self.vocab_size * self.d_model

    def params(self) -> int:
        """All parameters: embeddings, layers, final norm, head."""
        return self.embedding_params() + self.layers * self.layer_params() + self.norm_params() + self.head_params()

    def matmul_params(self) -> int:
        """Parameters that multiply every token: the layers' matrices and the head (the tied embedding counts
        once, as the head); embedding lookups, norms and biases do no matmul."""
        d = self.d_model
        per_layer = 2 * d * d + 2 * d * self.kv_dim + (3 if self.style == "llama" else 2) * d * self.ffn_dim
        return self.layers * per_layer + self.vocab_size * d

    # ---- FLOPs -----------------------------------------------------------------------------------------
    def attention_flops_per_token(self, seq_len: int, causal: bool = True) -> float:
        """Forward FLOPs of the attention scores and their weighted sum (QK^T and PV), per token, all layers.
        ``causal``: a token attends to (seq_len + 1) / 2 positions on average, as FlashAttention computes it;
        otherwise to all seq_len (the convention of MFU formulas)."""
        context = (seq_len + 1) / 2 if causal else seq_len
        return 2 * 2 * self.layers * self.heads * self.head_dim * context

    def training_flops_per_token(self, seq_len: int) -> float:
        """Forward + backward FLOPs per token as MFU is counted (PaLM appendix B, torchtitan, Megatron):
        6 x matmul parameters + 12 x layers x d_model x seq_len (attention taken as non-causal)."""
        return 6.0 * self.matmul_params() + 3 * self.attention_flops_per_token(seq_len, causal=False)

    def with_seq_len(self, seq_len: int) -> "TransformerConfig":
        return replace(self, max_seq_len=seq_len)


def _positive(value: Any, where: str) -> int:
    return int(number(value, where, 1, _MAX_DIM, integer=True))


def _check(cfg: TransformerConfig, where: str) -> TransformerConfig:
    """The rules a shape must obey, each refused in one line naming the field."""
    if cfg.style not in STYLES:
        raise MeshscaleError(f"{where}: style {cfg.style!r} is not one of {', '.join(STYLES)}")
    if cfg.d_model % cfg.heads:
        raise MeshscaleError(f"{where}: hidden size {cfg.d_model} is not divisible by the {cfg.heads} attention heads")
    if cfg.heads % cfg.kv_heads:
        raise MeshscaleError(f"{where}: {cfg.heads} attention heads are not a multiple of the {cfg.kv_heads} "
                             "key/value heads")
    return cfg


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
                                    published_params=published, source=source, **ints), where)


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


# Hugging Face config.json keys for each field, first match wins (Llama/Mistral/Qwen use the first set, GPT-2 the
# second). Only shapes are read; nothing is downloaded.
_HF_KEYS = {
    "layers": ("num_hidden_layers", "n_layer"),
    "d_model": ("hidden_size", "n_embd"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads",),
    "ffn_dim": ("intermediate_size", "n_inner"),
    "vocab_size": ("vocab_size",),
    "max_seq_len": ("max_position_embeddings", "n_positions", "n_ctx"),
}


def from_hf_config(path: str | Path) -> TransformerConfig:
    """The shape in a Hugging Face ``config.json`` (Llama-style or GPT-2-style model types)."""
    data = load_structured(path, "model config.json")
    if not isinstance(data, dict):
        raise MeshscaleError(f"{path}: expected a JSON object (a Hugging Face config.json)")
    data = {k: v for k, v in data.items() if v is not None}  # a null field is an absent one
    model_type = typed(data.get("model_type", "llama"), f"{path}: model_type", (str,), "a string")
    style = "gpt2" if model_type == "gpt2" else "llama"
    fields: dict[str, Any] = {"style": style}
    labels: dict[str, str] = {}
    for field_name, keys in _HF_KEYS.items():
        for key in keys:
            if key in data:
                fields[field_name], labels[field_name] = data[key], key
                break
    if style == "gpt2" and "ffn_dim" not in fields and "d_model" in fields:
        fields["ffn_dim"] = 4 * number(fields["d_model"], f"{path}: n_embd", 1, _MAX_DIM, integer=True)
    missing = [k for k in ("layers", "d_model", "heads", "ffn_dim", "vocab_size", "max_seq_len") if k not in fields]
    if missing:
        raise MeshscaleError(f"{path}: missing field {_HF_KEYS[missing[0]][0]} ({missing[0]})")
    for field_name, key in (("tie_embeddings", "tie_word_embeddings"), ("rope_theta", "rope_theta")):
        if key in data:  # checked with the rest, named as the file spells it
            fields[field_name], labels[field_name] = data[key], key
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
