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
from meshscale.predict.training.kernels import kernel_seconds, rates
from meshscale.predict.training.hardware import gpu_spec
from meshscale.predict.training.measured import MeasuredKernels, _BLOCKS, measured_kernels, outside_block
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


def test_a_block_measured_at_q_times_its_bytes_at_the_copy_rate_gives_q():
    rng = random.Random(3)
    atlas = shipped_atlases()[0]
    rate = atlas.memory_bandwidth_bytes_per_s * atlas.stream_fraction
    for _ in range(6):
        style, fp8 = rng.choice(("pairs", "complex")), rng.random() < 0.5
        precision = "fp8-tensorwise" if fp8 else "bf16"
        qs = [rng.uniform(1.0, 3.0) for _ in range(2)]
        points = [_point(style, precision, seconds=1.0, kv=kv, seq=seq) for kv, seq in ((8, 8192), (32, 4096))]
        points = [replace(p, elementwise_s=q * compiled_block_bytes(p) / rate) for p, q in zip(points, qs)]
        # an eager block and the other style's are not read for this one
        points += [_point(style, precision, compiled=False, seconds=9.0),
                   _point("complex" if style == "pairs" else "pairs", precision, seconds=9.0)]
        got = _measured_with(points).block_ratio(style, precision)
        assert got == pytest.approx((qs[0] * qs[1]) ** 0.5, rel=1e-9)


def test_a_precision_not_measured_falls_back_to_another_fp8_recipe_then_bf16_and_none_without_blocks():
    atlas = shipped_atlases()[0]
    rate = atlas.memory_bandwidth_bytes_per_s * atlas.stream_fraction
    bf16, fp8 = _point(), _point(precision="fp8-tensorwise")
    bf16 = replace(bf16, elementwise_s=2 * compiled_block_bytes(bf16) / rate)
    fp8 = replace(fp8, elementwise_s=3 * compiled_block_bytes(fp8) / rate)
    assert _measured_with([bf16, fp8]).block_ratio("pairs", "fp8-rowwise") == pytest.approx(3)
    assert _measured_with([bf16]).block_ratio("pairs", "fp8-rowwise") == pytest.approx(2)
    assert _measured_with([]).block_ratio("pairs", "bf16") is None


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
    assert inside and all(k.compiled_block == "complex" for k in inside)
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
        monkeypatch.setattr(MeasuredKernels, "block_ratio", lambda self, style, precision, q=q: q)
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
    _BLOCKS.clear()
    for style in ("pairs", "complex"):
        for precision in ("bf16", "fp8-tensorwise"):
            ratio = measured.block_ratio(style, precision)
            assert ratio is None or ratio >= 1.0


def test_blocks_survive_the_atlas_json():
    atlas = replace(shipped_atlases()[0], blocks=(_point(), _point("complex", "fp8-tensorwise", seconds=2.0)))
    import json
    assert from_dict(json.loads(atlas.to_json())).blocks == atlas.blocks
