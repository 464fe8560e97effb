"""A Hugging Face ``config.json`` read as preset-style fields (what `transformer.config_from_fields` takes): the
shape of a Llama-style, GPT-2-style or mixture-of-experts model, nothing downloaded.

Mixture-of-experts keys, per family (the transformers library's configuration classes):
- Mixtral: num_local_experts, num_experts_per_tok (experts as wide as intermediate_size).
- Qwen2-MoE / Qwen3-MoE: num_experts, num_experts_per_tok, moe_intermediate_size, decoder_sparse_step (a MoE layer
  every that many), mlp_only_layers (dense layers by index: only an empty list is read), Qwen2-MoE's
  shared_expert_intermediate_size (one shared expert, behind a sigmoid gate); norm_topk_prob renormalizes the
  top-k weights (no cost).
- DeepSeek-V2/V3: n_routed_experts, n_shared_experts, first_k_dense_replace, moe_intermediate_size,
  num_experts_per_tok, moe_layer_freq (1 only), scoring_func (softmax or sigmoid), topk_method (noaux_tc: a bias
  per expert on the scores), and multi-head latent attention: q_lora_rank, kv_lora_rank, qk_rope_head_dim,
  qk_nope_head_dim, v_head_dim.
- gpt-oss: num_local_experts, experts_per_token (and num_experts_per_tok), biases on the router, the experts and
  attention, attention sinks.

A key that describes compute meshscale does not model (sliding windows, multi-token prediction, device-limited
routing, quantized storage) or that meshscale does not know is returned in ``ignored``, to be named on one line;
a key that looks like an expert setting and is not one of the above is refused in one line.
"""
from __future__ import annotations

import re
from typing import Any

from meshscale.errors import MeshscaleError
from meshscale.validation import typed

# config.json keys for each field, first match wins (Llama/Mistral/Qwen use the first set, GPT-2 the second)
HF_KEYS = {
    "layers": ("num_hidden_layers", "n_layer"),
    "d_model": ("hidden_size", "n_embd"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads",),
    "ffn_dim": ("intermediate_size", "n_inner"),
    "vocab_size": ("vocab_size",),
    "max_seq_len": ("max_position_embeddings", "n_positions", "n_ctx"),
    "tie_embeddings": ("tie_word_embeddings",),
    "rope_theta": ("rope_theta",),
    "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "experts_per_token": ("num_experts_per_tok", "experts_per_token"),
    "expert_ffn_dim": ("moe_intermediate_size",),
    "shared_experts": ("n_shared_experts",),
    "shared_expert_ffn_dim": ("shared_expert_intermediate_size",),
    "dense_layers": ("first_k_dense_replace",),
    "moe_every": ("decoder_sparse_step", "moe_layer_freq"),
    "q_lora_rank": ("q_lora_rank",),
    "kv_lora_rank": ("kv_lora_rank",),
    "qk_rope_head_dim": ("qk_rope_head_dim",),
    "qk_nope_head_dim": ("qk_nope_head_dim",),
    "v_head_dim": ("v_head_dim",),
}
# keys that change nothing a training step costs: names, token ids, dropout, initialization, caching, the loss's
# coefficients, numerics of the same kernels (norm epsilons, rotary scaling, SwiGLU's clamp), the top-k weights'
# normalization and scaling
COSTLESS = {
    "architectures", "auto_map", "model_type", "torch_dtype", "dtype", "transformers_version", "_name_or_path",
    "bos_token_id", "eos_token_id", "pad_token_id", "use_cache", "initializer_range", "attention_dropout",
    "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "rms_norm_eps", "layer_norm_eps",
    "layer_norm_epsilon", "hidden_act", "activation_function", "rope_scaling", "rope_parameters",
    "router_aux_loss_coef", "output_router_logits", "norm_topk_prob", "routed_scaling_factor", "aux_loss_alpha",
    "seq_aux", "swiglu_limit", "initial_context_length", "pretraining_tp", "head_dim", "attention_bias", "mlp_bias",
    "scoring_func", "topk_method", "mlp_only_layers", "use_sliding_window", "max_window_layers", "sliding_window",
    "router_jitter_noise", "qkv_bias", "summary_type", "summary_use_proj", "summary_activation",
    "summary_proj_to_labels", "summary_first_dropout", "scale_attn_weights", "reorder_and_upcast_attn",
    "scale_attn_by_inverse_layer_idx", "task_specific_params", "tie_word_embeddings", "ep_size", "n_group",
    "topk_group", "use_qk_norm", "is_decoder", "layer_types", "num_nextn_predict_layers", "quantization_config",
    "rope_interleave", "partial_rotary_factor", "use_bfloat16",
}
# expert settings meshscale knows beyond HF_KEYS (read for their cost, or costless above)
_EXPERT_KEYS = {"norm_topk_prob", "routed_scaling_factor", "router_aux_loss_coef", "output_router_logits",
                "aux_loss_alpha", "seq_aux", "topk_method", "scoring_func", "mlp_only_layers", "n_group",
                "topk_group", "ep_size", "router_jitter_noise"}
_LOOKS_EXPERT = re.compile(r"expert|moe|router|routed|topk|top_k")
QWEN2 = ("qwen2", "qwen2_moe")
QWEN3 = ("qwen3", "qwen3_moe")


def _first(data: dict, keys: tuple[str, ...]) -> tuple[str, Any] | None:
    return next(((k, data[k]) for k in keys if k in data), None)


def _unmodelled(data: dict) -> list[str]:
    """Keys read but whose cost meshscale does not model (named in `ignored`), with what is priced instead."""
    said = []
    if data.get("sliding_window") and data.get("use_sliding_window", True) is not False:
        said.append(f"sliding_window {data['sliding_window']} (priced as full attention)")
    if data.get("num_nextn_predict_layers"):
        said.append(f"num_nextn_predict_layers {data['num_nextn_predict_layers']} (multi-token prediction "
                    "modules not priced)")
    if (data.get("topk_group") or 0) > 1 or (data.get("n_group") or 0) > 1:
        said.append(f"n_group {data.get('n_group')}/topk_group {data.get('topk_group')} (routing priced as "
                    "unrestricted)")
    if data.get("quantization_config"):
        said.append("quantization_config (weights priced as trained, in the compute precision)")
    return said


def _refuse_unknown_expert_keys(data: dict, path: str) -> None:
    known = {k for keys in HF_KEYS.values() for k in keys} | _EXPERT_KEYS
    for key in data:
        if _LOOKS_EXPERT.search(key) and key not in known:
            raise MeshscaleError(f"{path}: {key}: an expert setting meshscale does not know; it reads "
                                 + ", ".join(sorted(k for k in known if _LOOKS_EXPERT.search(k) or k.startswith("n_")
                                                    or k.startswith("first"))))
    layers = data.get("mlp_only_layers")
    if layers:
        raise MeshscaleError(f"{path}: mlp_only_layers {layers}: meshscale places dense layers by "
                             "first_k_dense_replace and decoder_sparse_step only")
    if data.get("moe_layer_freq", 1) != 1 and "decoder_sparse_step" not in data:
        raise MeshscaleError(f"{path}: moe_layer_freq {data['moe_layer_freq']}: meshscale reads 1 only")
    agreed = [data[k] for k in ("num_experts_per_tok", "experts_per_token") if k in data]
    if len(set(map(str, agreed))) > 1:
        raise MeshscaleError(f"{path}: num_experts_per_tok {agreed[0]} and experts_per_token {agreed[1]} disagree")


def _family_fields(data: dict, model_type: str, path: str) -> dict[str, Any]:
    """What each family's architecture adds beyond its keys: biases, norms, sinks, the router's scoring."""
    fields: dict[str, Any] = {}
    if model_type in QWEN2:
        fields["attention_bias"] = "qkv"        # Qwen2's q, k and v projections have biases, its output none
    elif data.get("attention_bias") is True:
        fields["attention_bias"] = "all"
    if model_type in QWEN3:
        fields["qk_norm"] = True
    if model_type == "qwen2_moe" and data.get("shared_expert_intermediate_size"):
        fields["shared_experts"], fields["shared_expert_gate"] = 1, True
    if model_type == "gpt_oss":
        fields.update(router_bias=True, expert_bias=True, attention_sinks=True)
    if data.get("topk_method") == "noaux_tc":
        fields["router_bias"] = True            # DeepSeek-V3's e_score_correction_bias, one per expert
    if "scoring_func" in data:
        fields["router"] = typed(data["scoring_func"], f"{path}: scoring_func", (str,), "a string")
    if data.get("head_dim") and not data.get("kv_lora_rank"):
        fields["attn_head_dim"] = data["head_dim"]
    return fields


def hf_fields(data: Any, path: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The preset-style fields of a parsed config.json (and how the file labels each), refusing in one line what
    cannot be read. ``fields["ignored"]``: what meshscale does not model, as lines' parts."""
    if not isinstance(data, dict):
        raise MeshscaleError(f"{path}: expected a JSON object (a Hugging Face config.json)")
    data = {k: v for k, v in data.items() if v is not None}  # a null field is an absent one
    model_type = typed(data.get("model_type", "llama"), f"{path}: model_type", (str,), "a string")
    _refuse_unknown_expert_keys(data, path)
    style = "gpt2" if model_type == "gpt2" else "llama"
    fields: dict[str, Any] = {"style": style}
    labels: dict[str, str] = {}
    for name, keys in HF_KEYS.items():
        found = _first(data, keys)
        if found is not None:
            labels[name], fields[name] = found
    if style == "gpt2" and "ffn_dim" not in fields and isinstance(fields.get("d_model"), int):
        fields["ffn_dim"] = 4 * fields["d_model"]
    missing = [k for k in ("layers", "d_model", "heads", "ffn_dim", "vocab_size", "max_seq_len") if k not in fields]
    if missing:
        raise MeshscaleError(f"{path}: missing field {HF_KEYS[missing[0]][0]} ({missing[0]})")
    if fields.get("experts") and "experts_per_token" not in fields:
        raise MeshscaleError(f"{path}: {labels['experts']} {fields['experts']} without num_experts_per_tok")
    family = _family_fields(data, model_type, path)
    fields.update({k: v for k, v in family.items() if k not in fields or k == "shared_experts"})
    read = {k for keys in HF_KEYS.values() for k in keys}
    unknown = sorted(k for k in data if k not in read and k not in COSTLESS)
    fields["ignored"] = tuple(_unmodelled(data) + unknown)
    return fields, labels
