"""Transformer shapes, layouts and the memory arithmetic: mechanisms, and the presets against their sources."""
import json

import pytest

from meshscale.errors import MeshscaleError
from meshscale.models.layout import DIMENSIONS, ParallelLayout, check_layout
from meshscale.models.memory import activation_elements_per_token, training_memory
from meshscale.models.transformer import load_model_config, preset, preset_names


def _last_digit(published: int) -> int:
    """One unit of the last digit a source prints (46.7B: 0.1B; an exact count: 1)."""
    unit = 1
    while published % (unit * 10) == 0:
        unit *= 10
    return unit


@pytest.mark.parametrize("name", [n for n in preset_names() if preset(n).published_params])
def test_preset_parameter_count_is_the_published_one(name):
    # exact counts of the released weights, or a figure as rounded as its source prints it (GPT-3's 175.0B,
    # Mixtral's 46.7B): within one unit of its last digit
    cfg = preset(name)
    assert abs(cfg.params() - cfg.published_params) <= _last_digit(cfg.published_params)


@pytest.mark.parametrize("name", [n for n in preset_names() if preset(n).published_active_params])
def test_moe_preset_active_count_is_the_published_one(name):
    # sources count a token's active parameters with the input embedding (Mistral, Qwen, DeepSeek) or without
    # it (OpenAI's gpt-oss model card)
    cfg = preset(name)
    unit = _last_digit(cfg.published_active_params)
    assert min(abs(cfg.active_params(e) - cfg.published_active_params) for e in (True, False)) <= unit


def _hf_llama(cfg):
    return {"model_type": "llama", "num_hidden_layers": cfg.layers, "hidden_size": cfg.d_model,
            "num_attention_heads": cfg.heads, "num_key_value_heads": cfg.kv_heads, "intermediate_size": cfg.ffn_dim,
            "vocab_size": cfg.vocab_size, "max_position_embeddings": cfg.max_seq_len,
            "tie_word_embeddings": cfg.tie_embeddings, "rope_theta": cfg.rope_theta}


@pytest.mark.parametrize("name", ["llama3-8b", "llama-1b", "llama2-7b"])
def test_hf_config_gives_the_preset_count(tmp_path, name):
    cfg = preset(name)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_hf_llama(cfg)))
    assert load_model_config(str(path)).params() == cfg.params()


def test_hf_gpt2_config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
                                "vocab_size": 50257, "n_positions": 1024}))
    assert load_model_config(str(path)).params() == preset("gpt2-small").params()


@pytest.mark.parametrize("change,field", [({"num_hidden_layers": 0}, "num_hidden_layers"),
                                          ({"hidden_size": -5}, "hidden_size"),
                                          ({"num_attention_heads": "x"}, "num_attention_heads"),
                                          ({"num_attention_heads": 7}, "divisible")])
def test_bad_hf_config_names_the_field(tmp_path, change, field):
    data = {**_hf_llama(preset("llama-tiny")), **change}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    with pytest.raises(MeshscaleError) as err:
        load_model_config(str(path))
    assert field in str(err.value) or field.replace("num_hidden_layers", "layers") in str(err.value)


# values whose bool() or str() would pass for something else: "false" and [false] are true, ["gpt2"] a llama
@pytest.mark.parametrize("change,field", [({"tie_word_embeddings": "false"}, "tie_word_embeddings"),
                                          ({"tie_word_embeddings": [False]}, "tie_word_embeddings"),
                                          ({"tie_word_embeddings": 0}, "tie_word_embeddings"),
                                          ({"tie_word_embeddings": {}}, "tie_word_embeddings"),
                                          ({"model_type": ["gpt2"]}, "model_type"),
                                          ({"model_type": 2}, "model_type"),
                                          ({"rope_theta": "10000"}, "rope_theta"),
                                          ({"rope_theta": True}, "rope_theta"),
                                          ({"num_hidden_layers": True}, "num_hidden_layers"),
                                          ({"vocab_size": [32000]}, "vocab_size")])
def test_a_field_of_the_wrong_kind_is_refused_in_one_line_naming_it(tmp_path, change, field):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**_hf_llama(preset("llama-tiny")), **change}))
    with pytest.raises(MeshscaleError, match=field) as err:
        load_model_config(str(path))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("tie", [True, False])
def test_a_boolean_is_read_as_written(tmp_path, tie):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**_hf_llama(preset("llama-tiny")), "tie_word_embeddings": tie}))
    assert load_model_config(str(path)).tie_embeddings is tie


def test_a_preset_field_of_the_wrong_kind_is_refused():
    from meshscale.models.transformer import config_from_fields
    good = {"layers": 2, "d_model": 64, "heads": 4, "ffn_dim": 128, "vocab_size": 100, "max_seq_len": 32}
    assert config_from_fields("x", good, "preset x").tie_embeddings is False
    for change in ({"tie_embeddings": "no"}, {"style": ["gpt2"]}, {"published_params": "many"}, {"source": 3}):
        with pytest.raises(MeshscaleError, match=f"preset x: {next(iter(change))}"):
            config_from_fields("x", {**good, **change}, "preset x")


def test_missing_hf_field(tmp_path):
    data = _hf_llama(preset("llama-tiny"))
    del data["vocab_size"]
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(MeshscaleError, match="vocab_size"):
        load_model_config(str(tmp_path / "config.json"))


def test_training_flops_approach_kaplans_six_n_for_short_sequences_and_grow_with_length():
    # Kaplan et al. 2020: training costs about 6 N FLOPs per token (N: non-embedding parameters) while the context
    # is small beside 12 x d_model; attention adds a term that grows with the sequence
    for name in ("llama3-8b", "gpt2-xl", "llama3-70b"):
        cfg = preset(name)
        flops = [cfg.training_flops_per_token(s) for s in (128, 1024, 8192)]
        assert flops == sorted(flops)
        assert flops[0] == pytest.approx(6 * cfg.matmul_params(), rel=0.02)


@pytest.mark.parametrize("layout", [ParallelLayout(fsdp=2, tp=2, pp=2, micro_batches=2),
                                    ParallelLayout(dp=2, cp=3), ParallelLayout(tp=4, fsdp=2)])
def test_groups_partition_the_world(layout):
    for dim in DIMENSIONS:
        groups = layout.groups(dim)
        ranks = sorted(r for g in groups for r in g)
        assert ranks == list(range(layout.world_size))
        assert all(len(g) == getattr(layout, dim) for g in groups)
        for g in groups:
            assert layout.group_of(dim, g[0]) == g


def test_tp_groups_are_consecutive_and_pp_farthest():
    layout = ParallelLayout(fsdp=2, tp=4, pp=2, micro_batches=2)
    assert layout.group_of("tp", 0) == [0, 1, 2, 3]
    assert layout.group_of("pp", 0) == [0, 8]


@pytest.mark.parametrize("layout,world,rule", [
    (ParallelLayout(fsdp=2, tp=2), 8, "world has 8"),
    (ParallelLayout(tp=3), 3, "attention heads"),
    (ParallelLayout(pp=4, micro_batches=4), 4, "at least one layer"),
    (ParallelLayout(pp=2, micro_batches=1), 2, "at least 2 micro-batches"),
    (ParallelLayout(cp=2), 2, "multiple of 4"),
])
def test_bad_layouts_are_refused_with_the_rule(layout, world, rule):
    with pytest.raises(MeshscaleError, match=rule):
        check_layout(layout, world, preset("llama-tiny"), seq_len=30)


def test_sequence_longer_than_positions():
    with pytest.raises(MeshscaleError, match="positions"):
        check_layout(ParallelLayout(), 1, preset("llama-tiny"), seq_len=65)


def test_memory_falls_with_sharding_and_checkpointing():
    cfg = preset("llama3-8b")
    kw = dict(batch=2, seq_len=4096)
    totals = [training_memory(cfg, ParallelLayout(fsdp=n), **kw).total_bytes for n in (1, 2, 4, 8)]
    assert totals == sorted(totals, reverse=True)
    acts = [training_memory(cfg, ParallelLayout(fsdp=8), checkpointing=c, **kw).activations_bytes
            for c in ("none", "selective", "full")]
    assert acts == sorted(acts, reverse=True)
    # tensor and context parallelism split the activations (not in half: tests/unit/test_memory_model.py)
    base = training_memory(cfg, ParallelLayout(fsdp=2), **kw).activations_bytes
    assert training_memory(cfg, ParallelLayout(fsdp=2, tp=2), **kw).activations_bytes < base
    assert training_memory(cfg, ParallelLayout(fsdp=2, cp=2), **kw).activations_bytes < base


def test_pipeline_schedules_hold_different_numbers_of_micro_batches():
    cfg = preset("llama3-8b")
    kw = dict(batch=8, seq_len=2048)
    gpipe = training_memory(cfg, ParallelLayout(pp=4, micro_batches=8, pp_schedule="gpipe"), stage=0, **kw)
    one_f = training_memory(cfg, ParallelLayout(pp=4, micro_batches=8), stage=0, **kw)
    # GPipe holds all 8 micro-batches, 1F1B's first stage 4 (and each stage its receive buffers)
    assert 1.8 * one_f.activations_bytes < gpipe.activations_bytes < 2 * one_f.activations_bytes
    later = training_memory(cfg, ParallelLayout(pp=4, micro_batches=8), stage=3, **kw)
    assert later.activations_bytes < one_f.activations_bytes and later.logits_bytes > 0 == one_f.logits_bytes


def test_full_checkpointing_keeps_one_value_per_hidden_unit():
    cfg = preset("llama-1b")
    assert activation_elements_per_token(cfg, "full") == cfg.d_model
    assert activation_elements_per_token(cfg, "none") > activation_elements_per_token(cfg, "selective")
