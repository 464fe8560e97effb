"""The atlas's compiled blocks (train/blocks.py) and how the step model prices a torch.compile'd layer from them:
the two rotary formulations the bench runs compute the same block, the kernel classes split by name as the
profiler reports them, and a compiled layer's own memory ops (only those) take the measured blocks' ratio to
their bytes."""
import copy
import random
from dataclasses import replace

import pytest
import torch

from meshscale.train.blocks import complex_attention, kernel_class
from meshscale.models.atlas import BlockPoint, from_dict, shipped_atlases
from meshscale.models.layout import ParallelLayout
from meshscale.models.transformer import TransformerConfig
from meshscale.predict.training.kernels import BlockShape, kernel_seconds, rates
from meshscale.predict.training.hardware import gpu_spec
from meshscale.predict.training.measured import MeasuredKernels, measured_kernels, outside_block
from meshscale.predict.training.step import TrainingJob, compiled_block_bytes, step_kernels
from meshscale.train.transformer import Block, rotary_tables


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_torchtitans_complex_rotary_computes_the_same_block_as_the_engines_pairs(kv_heads):
    """An independent formulation (one complex product with the table, heads expanded and reshaped) against
    train's own (pairs of halves, repeat_interleave): same outputs and gradients on random weights."""
    torch.manual_seed(kv_heads)
    cfg = TransformerConfig("t", 1, 64, 4, kv_heads, 96, 100, 16, rope_theta=10000.0 * kv_heads)
    pairs = Block(cfg).double()
    turned = copy.deepcopy(pairs)
    complex_attention(turned.attention)
    cos, sin = (t.double() for t in rotary_tables(cfg, 16))
    x = torch.randn(3, 16, 64, dtype=torch.float64, requires_grad=True)
    outs = [b(x, cos, sin, torch.arange(16)) for b in (pairs, turned)]
    # rotary runs in fp32 in both (their tables and the complex product are fp32): fp32's tolerance
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    grads = [torch.autograd.grad(o.square().sum(), [x, *b.parameters()]) for o, b in zip(outs, (pairs, turned))]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_kernels_split_by_name_as_the_profiler_reports_them():
    assert kernel_class("triton_poi_fused__scaled_mm__to_copy_clamp_mul_reciprocal_7") == "elementwise"
    assert kernel_class("triton_red_fused__fused_rms_norm_backward_add_3") == "elementwise"
    assert kernel_class("nvjet_sm90_qqtst_128x256_128x4_2x1_v_bz_coopA_TNN") == "matmul"
    assert kernel_class("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "matmul"
    assert kernel_class("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26") == "attention"
    assert kernel_class("void cudnn::fusion::compute_dot_do_o_specialized<true, 64>(...)") == "attention"
    assert kernel_class("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy>") == "elementwise"


def _point(style="pairs", precision="bf16", compiled=True, seconds=1.0, kv=8, batch=1, seq=2048) -> BlockPoint:
    return BlockPoint(style, precision, compiled, 4096, 32, kv, 14336, batch, seq, seconds, 30, 0.01, 0.01)


def _measured_with(points) -> MeasuredKernels:
    atlas = replace(shipped_atlases()[0], blocks=tuple(points))
    return MeasuredKernels(atlas, "bf16", atlas.dense_bf16_flops, 1.0)


def _shape(p: BlockPoint) -> BlockShape:
    return BlockShape(p.style, p.heads, p.kv_heads, p.d_model, p.ffn_dim)


def _at(q: float, p: BlockPoint) -> BlockPoint:
    """``p`` measured at q times its model bytes at the shipped atlas's copy rate."""
    atlas = shipped_atlases()[0]
    return replace(p, elementwise_s=q * compiled_block_bytes(p) / (atlas.memory_bandwidth_bytes_per_s *
                                                                   atlas.stream_fraction))


def test_a_block_measured_at_q_times_its_bytes_at_the_copy_rate_gives_q_to_its_own_shape():
    rng = random.Random(3)
    for _ in range(6):
        style, fp8 = rng.choice(("pairs", "complex")), rng.random() < 0.5
        precision = "fp8-tensorwise" if fp8 else "bf16"
        shapes = [dict(kv=8, seq=8192), dict(kv=32, seq=4096), dict(kv=8, seq=4096)]
        qs = [rng.uniform(1.0, 3.0) for _ in shapes]
        points = [_at(q, _point(style, precision, **s)) for q, s in zip(qs, shapes)]
        points[2] = replace(points[2], d_model=8192, heads=64, ffn_dim=28672)   # a wider grouped-query block
        points[2] = _at(qs[2], points[2])
        # an eager block and the other style's are not read for this one
        points += [_point(style, precision, compiled=False, seconds=9.0),
                   _point("complex" if style == "pairs" else "pairs", precision, seconds=9.0)]
        measured = _measured_with(points)
        for q, p in zip(qs, points[:3]):
            assert measured.block_ratio(_shape(p), precision) == pytest.approx(q, rel=1e-9)
        # between the two grouped-query widths: the nearer one; multi-head: the multi-head block
        assert measured.block_ratio(BlockShape(style, 40, 8, 5120, 17920), precision) == pytest.approx(qs[0])
        assert measured.block_ratio(BlockShape(style, 64, 64, 8192, 22016), precision) == pytest.approx(qs[1])


def test_a_precision_not_measured_falls_back_to_another_fp8_recipe_then_bf16_and_none_without_blocks():
    bf16, fp8 = _at(2, _point()), _at(3, _point(precision="fp8-tensorwise"))
    shape = _shape(bf16)
    assert _measured_with([bf16, fp8]).block_ratio(shape, "fp8-rowwise") == pytest.approx(3)
    assert _measured_with([bf16]).block_ratio(shape, "fp8-rowwise") == pytest.approx(2)
    assert _measured_with([]).block_ratio(shape, "bf16") is None
    # a kind of attention not measured takes the other's
    assert _measured_with([bf16]).block_ratio(replace(shape, kv_heads=shape.heads), "bf16") == pytest.approx(2)


def test_fusion_leaves_a_compiled_block_fewer_bytes_than_the_eager_one():
    for style in ("pairs", "complex"):
        for precision in ("bf16", "fp8-tensorwise"):
            eager, compiled = (compiled_block_bytes(_point(style, precision, c)) for c in (False, True))
            assert 0 < compiled < eager


def _job(framework: str, precision: str = "bf16", fsdp: int = 8) -> TrainingJob:
    model = TransformerConfig("t", 4, 2048, 16, 4, 5632, 32000, 2048)
    return TrainingJob(model, ParallelLayout(fsdp=fsdp), 2 * fsdp, 2048, precision, "none",
                       framework=framework, rotary="complex")


def test_a_compiled_layers_own_memory_ops_are_tagged_and_fsdps_are_not():
    kernels = step_kernels(_job("compile"))
    layer = kernels.layer.forward + kernels.layer.backward
    inside = [k for k in layer if k.kind == "memory" and not outside_block(k.name)]
    assert inside and all(k.compiled_block == BlockShape("complex", 16, 4, 2048, 5632) for k in inside)
    around = [k for k in layer if outside_block(k.name)]
    assert around and not any(k.compiled_block for k in around)      # FSDP2's copies, the gradients' cast
    assert not any(k.compiled_block for k in kernels.ends.forward + kernels.ends.backward + tuple(kernels.per_step))
    assert not any(k.compiled_block for k in kernels.every() if k.kind != "memory")
    eager = step_kernels(_job("eager"))
    assert not any(k.compiled_block for k in eager.every())


def test_the_measured_ratio_scales_only_the_tagged_kernels(monkeypatch):
    gpu = gpu_spec({"model": "NVIDIA H100 80GB HBM3"})
    job = _job("compile")
    r = rates(gpu, "bf16")
    kernels = [k for k in step_kernels(job).every() if k.kind != "host"]
    base = {k: kernel_seconds(k, replace(r)) for k in kernels}
    for q in (1.0, 2.5):
        monkeypatch.setattr(MeasuredKernels, "block_ratio", lambda self, shape, precision, q=q: q)
        scaled = replace(r)     # a fresh memo
        for k in kernels:
            t = kernel_seconds(k, scaled)
            if not k.compiled_block:
                assert t == base[k]
            else:   # its bytes at the GPU's copy rate, times q (never under the launch floor)
                want = k.count * max(k.bytes / r.bandwidth_bytes_per_s * q, r.kernel_floor_s * (k.launches or 1))
                assert t == pytest.approx(max(want, k.count * r.kernel_floor_s), rel=1e-6)


def test_the_shipped_atlas_prices_compiled_blocks_slower_than_their_bytes_at_the_copy_rate():
    """Inductor's generated kernels do not beat the copy of their bytes (they are element-wise)."""
    measured = measured_kernels(gpu_spec({"model": "NVIDIA H100 80GB HBM3"}), "bf16")
    for p in measured.atlas.blocks:
        ratio = measured.block_ratio(_shape(p), p.precision)
        assert ratio is None or ratio >= 1.0


def test_blocks_survive_the_atlas_json():
    atlas = replace(shipped_atlases()[0], blocks=(_point(), _point("complex", "fp8-tensorwise", seconds=2.0)))
    import json
    assert from_dict(json.loads(atlas.to_json())).blocks == atlas.blocks


def test_grouped_query_expansion_moves_what_repeat_interleave_reads_and_writes():
    """Oracle: the tensors train's attention expands (k and v, each read narrow and written wide) counted on
    random shapes; none for multi-head attention; a framework whose attention takes grouped heads has none."""
    from meshscale.predict.training.framework import STEP_FRAMEWORKS, framework_pass
    from meshscale.predict.training.kernels import GQA_EXPANSION
    from meshscale.predict.training.workload import gqa_expansion, transformer_layer

    rng = random.Random(5)
    for _ in range(8):
        kv = rng.choice((1, 2, 4, 8))
        heads, hd, tokens, tp = kv * rng.choice((1, 2, 4)), rng.choice((16, 32)), rng.choice((8, 24)), 1
        model = TransformerConfig("t", 1, heads * hd, heads, kv, 4 * heads * hd, 100, tokens)
        k = torch.zeros(1, kv, tokens, hd, dtype=torch.bfloat16)
        wide = k.repeat_interleave(heads // kv, dim=1)
        moved = 2 * (k.numel() + wide.numel()) * k.element_size()    # k and v
        found = gqa_expansion(model, tokens, tp, 2)
        if kv == heads:
            assert found == []
            continue
        (op,) = found
        assert op.bytes == moved and op.backward_bytes == moved
        assert op.fused_bytes == 2 * wide.numel() * 2                 # fused: the wide k and v written
        layer = transformer_layer(model, float(tokens), tokens)
        assert any(x.name == GQA_EXPANSION for x in layer.forward)
        megatron = framework_pass(layer.forward + layer.backward, STEP_FRAMEWORKS["megatron"], layer=True)
        assert not any(x.name.startswith(GQA_EXPANSION) for x in megatron)
