"""The engine builds on the meta device and each rank materializes its shards: on 4 Gloo ranks, every parameter
gathered whole (`full_tensor`) equals a whole-model build from the same seed, bit for bit, under fsdp, tp x fsdp,
pp x fsdp (each stage's own parameters), ep x fsdp (moe-tiny's routed experts split over ranks), dp x fsdp (FSDP2's
replicas) and cp x fsdp (the rotary tables are the rank's positions' rows); and the initial values are the init
rule's distribution."""
import pytest
import torch

from meshscale.execute import launch
from meshscale.train.config import LayoutOptions, TrainConfig
from meshscale.train.parallel.plan import with_default_layout
from meshscale.train.seeded_init import BLOCK_ELEMENTS, block_rows, fill_local, full_value
from meshscale.train.transformer import INIT_STD, Transformer

SEED = 7
LAYOUTS = [("llama-tiny", dict(fsdp=4)), ("llama-tiny", dict(tp=2, fsdp=2)),
           ("llama-tiny", dict(pp=2, fsdp=2, micro_batches=2)), ("moe-tiny", dict(ep=2, fsdp=2)),
           ("llama-tiny", dict(cp=2, fsdp=2)), ("llama-tiny", dict(dp=2, fsdp=2))]


def _cfg(model, layout):
    cfg = TrainConfig(model=model, world=4, batch_per_rank=2, steps=1, seed=SEED, timing=False,
                      layout=LayoutOptions(**layout))
    return with_default_layout(cfg)


def _mismatches(ctx, configs):
    """Per layout: this rank's parameters (gathered whole) and buffers that differ from a whole-model build."""
    import warnings

    from meshscale.train.parallel.engine import build_layout
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    found = []
    for cfg in configs:
        t = build_layout(cfg, ctx.device)
        whole = Transformer(t.spec.transformer, t.spec.input_shape[0], seed=SEED)
        expected = {n: p for n, p in whole.named_parameters()}
        bad, checked = [], 0
        for part in t.exchange.parts:
            for name, p in part.named_parameters():
                name = part.parameter_name(name)
                full = p.full_tensor() if hasattr(p, "full_tensor") else p
                checked += 1
                if not torch.equal(full.detach(), expected[name].detach()):
                    bad.append(name)
            mine = part.local_positions if part.local_positions is not None else torch.arange(whole.seq_len)
            for buffer in ("rope_cos", "rope_sin"):
                if not torch.equal(getattr(part, buffer), getattr(whole, buffer)[mine]):
                    bad.append(buffer)
            if not torch.equal(part.positions, mine):
                bad.append("positions")
        found.append((bad, checked))
    return found


def test_sharded_materialization_equals_a_whole_model_build_on_every_layout():
    configs = [_cfg(model, layout) for model, layout in LAYOUTS]
    ranks = launch(_mismatches, 4, (configs,), timeout_s=60, deadline_s=120)
    for (model, layout), per_rank in zip(LAYOUTS, zip(*ranks)):
        for rank, (bad, checked) in enumerate(per_rank):
            assert checked > 0 and not bad, (model, layout, rank, bad)


def test_a_shard_is_the_part_of_the_full_value_whatever_the_cut():
    """The oracle without ranks: any box of rows and columns of a parameter filled from (seed, name) is the
    same box of its full value (blocks of rows, a box across block boundaries, an empty one)."""
    from unittest import mock
    shape, name = (3 * block_rows((0, 300)) + 5, 300), "layers.0.feed_forward.w1.weight"
    full = full_value(SEED, name, shape, "normal", INIT_STD)
    assert full.shape == shape and block_rows(shape) * shape[1] >= BLOCK_ELEMENTS
    for rows, cols in [((0, shape[0]), (0, 300)), ((5, 400), (100, 250)), ((700, 700), (0, 300))]:
        local = torch.empty(rows[1] - rows[0], cols[1] - cols[0])
        box = (local, shape, (rows[0], cols[0]))
        with mock.patch("meshscale.train.seeded_init.local_box", return_value=box):
            fill_local(local, SEED, name, "normal", INIT_STD)
        assert torch.equal(local, full[rows[0]:rows[1], cols[0]:cols[1]])
    # another name or seed draws other numbers, from the same distribution
    other = full_value(SEED, "layers.1.feed_forward.w1.weight", shape, "normal", INIT_STD)
    assert not torch.equal(other, full) and not torch.equal(full_value(SEED + 1, name, shape, "normal", INIT_STD), full)
    for x in (full, other):
        assert abs(float(x.std()) - INIT_STD) < 0.05 * INIT_STD and abs(float(x.mean())) < 0.05 * INIT_STD


@pytest.mark.parametrize("model", ["llama-tiny", "moe-tiny", "gpt-tiny"])
def test_the_init_rule_keeps_gpt2_s_initialisation(model):
    """Matrices normal with std 0.02, biases zero, norms' scales one (as the modules' own init had them)."""
    from meshscale.models.registry import get_model
    spec = get_model(model)
    m = Transformer(spec.transformer, spec.input_shape[0], seed=SEED)
    for name, p in m.named_parameters():
        if name.endswith("norm.weight") or ".ln" in name:
            assert torch.equal(p, torch.ones_like(p)), name
        elif name.endswith("bias"):
            assert torch.equal(p, torch.zeros_like(p)), name
        else:
            assert p.numel() < 500 or abs(float(p.detach().std()) - INIT_STD) < 0.1 * INIT_STD, name
