"""Mixture-of-experts shapes: Hugging Face config.json of each family read to the preset's counts, the active
parameters' properties, and what is ignored or refused in one line."""
import json
from dataclasses import replace

import pytest

from meshscale.errors import MeshscaleError
from meshscale.models.transformer import load_model_config, preset

# config.json keys as the released checkpoints spell them (tokens ids, dropout, ... are left out)
HF = {
    "mixtral-8x7b": {"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                     "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 32000,
                     "max_position_embeddings": 32768, "num_local_experts": 8, "num_experts_per_tok": 2,
                     "rope_theta": 1e6, "tie_word_embeddings": False, "sliding_window": None, "head_dim": 128},
    "qwen3-30b-a3b": {"model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048,
                      "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
                      "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
                      "decoder_sparse_step": 1, "norm_topk_prob": True, "mlp_only_layers": [], "vocab_size": 151936,
                      "max_position_embeddings": 40960, "tie_word_embeddings": False, "use_sliding_window": False,
                      "sliding_window": None, "max_window_layers": 48, "rope_theta": 1e6},
    "deepseek-v3": {"model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168,
                    "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432,
                    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
                    "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1, "q_lora_rank": 1536,
                    "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
                    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "n_group": 8, "topk_group": 4,
                    "routed_scaling_factor": 2.5, "norm_topk_prob": True, "num_nextn_predict_layers": 1,
                    "vocab_size": 129280, "max_position_embeddings": 163840, "tie_word_embeddings": False},
    "gpt-oss-120b": {"model_type": "gpt_oss", "num_hidden_layers": 36, "hidden_size": 2880, "head_dim": 64,
                     "num_attention_heads": 64, "num_key_value_heads": 8, "intermediate_size": 2880,
                     "num_local_experts": 128, "num_experts_per_tok": 4, "experts_per_token": 4,
                     "attention_bias": True, "sliding_window": 128, "swiglu_limit": 7.0, "vocab_size": 201088,
                     "max_position_embeddings": 131072, "tie_word_embeddings": False, "rope_theta": 150000,
                     "layer_types": ["sliding_attention", "full_attention"] * 18},
}


def _load(tmp_path, data):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return load_model_config(str(path))


@pytest.mark.parametrize("name", sorted(HF))
def test_each_family_config_json_gives_the_preset_counts(tmp_path, name):
    cfg, want = _load(tmp_path, HF[name]), preset(name)
    assert (cfg.params(), cfg.active_params(), cfg.matmul_params()) == \
        (want.params(), want.active_params(), want.matmul_params())


def test_qwen2_moe_shared_expert_and_its_gate(tmp_path):
    # Qwen1.5-MoE-A2.7B: 60 experts of 1408, top 4, one shared expert of 5632 behind a sigmoid gate, qkv biases;
    # its model card: 14.3B total, 2.7B activated
    data = {"model_type": "qwen2_moe", "num_hidden_layers": 24, "hidden_size": 2048, "num_attention_heads": 16,
            "num_key_value_heads": 16, "intermediate_size": 5632, "moe_intermediate_size": 1408, "num_experts": 60,
            "num_experts_per_tok": 4, "shared_expert_intermediate_size": 5632, "decoder_sparse_step": 1,
            "vocab_size": 151936, "max_position_embeddings": 8192, "tie_word_embeddings": False}
    cfg = _load(tmp_path, data)
    assert (cfg.shared_experts, cfg.shared_expert_gate, cfg.attention_bias) == (1, True, "qkv")
    assert abs(cfg.params() - 14.3e9) < 0.1e9 and abs(cfg.active_params() - 2.7e9) < 0.1e9


def test_ignored_fields_are_named_and_costless_ones_are_not(tmp_path):
    cfg = _load(tmp_path, {**HF["gpt-oss-120b"], "some_new_knob": 3})
    said = " ".join(cfg.ignored)
    assert "sliding_window 128" in said and "some_new_knob" in said and "swiglu_limit" not in said
    assert "num_nextn_predict_layers" in " ".join(_load(tmp_path, HF["deepseek-v3"]).ignored)
    assert _load(tmp_path, HF["qwen3-30b-a3b"]).ignored == ()


@pytest.mark.parametrize("change,words", [({"num_experts_per_group": 2}, "num_experts_per_group"),
                                          ({"num_experts_per_tok": 200}, "experts per token"),
                                          ({"mlp_only_layers": [0]}, "mlp_only_layers"),
                                          ({"scoring_func": "sparsemixer"}, "sparsemixer"),
                                          ({"experts_per_token": 3}, "disagree")])
def test_unknown_or_impossible_expert_settings_are_refused_in_one_line(tmp_path, change, words):
    base = HF["gpt-oss-120b"] if "experts_per_token" in change else HF["qwen3-30b-a3b"]
    with pytest.raises(MeshscaleError, match=words) as err:
        _load(tmp_path, {**base, **change})
    assert "\n" not in str(err.value)


def test_experts_without_top_k_are_refused(tmp_path):
    data = {k: v for k, v in HF["mixtral-8x7b"].items() if k != "num_experts_per_tok"}
    with pytest.raises(MeshscaleError, match="num_experts_per_tok"):
        _load(tmp_path, data)


@pytest.mark.parametrize("name", ["llama3-8b", "gpt2-small", "llama-tiny"])
def test_a_dense_models_active_parameters_are_all_of_them(name):
    cfg = preset(name)
    assert cfg.active_params() == cfg.params() and cfg.moe_layer_count() == 0


@pytest.mark.parametrize("name", ["mixtral-8x7b", "deepseek-v3", "gpt-oss-20b", "moe-tiny"])
def test_top_k_of_all_experts_makes_every_parameter_active(name):
    cfg = preset(name)
    every = replace(cfg, experts_per_token=cfg.experts)
    assert every.active_params() == every.params() == cfg.params()
    assert cfg.active_params() < cfg.params()


def test_dense_layers_and_sparse_steps_count_the_moe_layers():
    cfg = preset("deepseek-v3")
    assert cfg.moe_layer_count() == 58
    assert replace(preset("moe-tiny"), layers=8, moe_every=2).moe_layer_count() == 4
