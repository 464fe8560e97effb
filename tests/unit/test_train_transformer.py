"""The transformer module agrees with the shape's own arithmetic, and the pieces a layout cuts it into cover it
exactly once."""
import pytest
import torch

from meshscale.models.layout import ParallelLayout
from meshscale.models.transformer import config_from_fields
from meshscale.train.parallel.apply import context_chunks, split_stage, stage_ids
from meshscale.train.transformer import Transformer, apply_rotary, rotary_tables

SHAPES = {
    "llama": dict(layers=3, d_model=32, heads=4, kv_heads=2, ffn_dim=48, vocab_size=64, max_seq_len=16,
                  style="llama", tie_embeddings=False),
    "llama-tied": dict(layers=2, d_model=32, heads=4, kv_heads=4, ffn_dim=48, vocab_size=64, max_seq_len=16,
                       style="llama", tie_embeddings=True),
    "gpt2": dict(layers=2, d_model=32, heads=4, ffn_dim=128, vocab_size=64, max_seq_len=16, style="gpt2"),
}


@pytest.mark.parametrize("name", SHAPES)
def test_module_parameters_equal_the_config_count(name):
    cfg = config_from_fields(name, SHAPES[name], "test")
    model = Transformer(cfg, 16)
    assert sum(p.numel() for p in model.parameters()) == cfg.params()  # a tied head counted once


def test_rotary_keeps_each_pair_length_and_position_zero():
    cfg = config_from_fields("r", SHAPES["llama"], "test")
    cos, sin = rotary_tables(cfg, 16)
    x = torch.randn(2, 16, 4, cfg.head_dim)
    y = apply_rotary(x, cos, sin)
    pairs = lambda t: t.unflatten(-1, (-1, 2)).norm(dim=-1)  # noqa: E731
    assert torch.allclose(pairs(x), pairs(y), atol=1e-5)
    assert torch.equal(x[:, 0], y[:, 0])


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_context_chunks_partition_the_sequence_with_equal_causal_work(cp):
    chunks = [context_chunks(32, cp, r) for r in range(cp)]
    assert sorted(torch.cat(chunks).tolist()) == list(range(32))
    work = [int((c + 1).sum()) for c in chunks]  # keys each rank's queries attend to, causally
    assert len(set(work)) == 1


@pytest.mark.parametrize("pp, schedule", [(2, "1f1b"), (3, "gpipe"), (2, "interleaved-1f1b")])
def test_pipeline_stages_hold_every_layer_once(pp, schedule):
    cfg = config_from_fields("p", {**SHAPES["llama"], "layers": 4 if schedule == "interleaved-1f1b" else 3}, "test")
    layout = ParallelLayout(pp=pp, pp_schedule=schedule, micro_batches=pp, stages_per_rank=2)
    model = Transformer(cfg, 16)
    stages = sorted(s for r in range(pp) for s in stage_ids(layout, r))
    parts = [split_stage(model, s, len(stages)) for s in stages]
    names = [n for part in parts for n in part.layers.keys()]
    assert sorted(names, key=int) == [str(i) for i in range(cfg.layers)]
    assert parts[0].tok_embeddings is not None and parts[-1].output is not None
    assert all(p.tok_embeddings is None for p in parts[1:]) and all(p.output is None for p in parts[:-1])
