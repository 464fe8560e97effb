"""The kernel atlas: measured on a lent GPU (`meshscale bench kernels`), shipped as data, and how the step model
reads it: at a measured shape it gives the measurement whatever the analytic model says, between shapes it
stays between its neighbours, and GPUs take the atlas of their family or none."""
import random
import pytest

from meshscale.models.atlas import KernelAtlas, load_atlas, shipped_atlases
from meshscale.predict.training.hardware import gpu_spec, system_gpu
from meshscale.predict.training.measured import MeasuredKernels, compute_source, measured_kernels
from meshscale.topology.nvml_discovery import model_facts


@pytest.fixture(scope="module")
def atlas() -> KernelAtlas:
    found = shipped_atlases()
    assert found, "meshscale ships at least one kernel atlas"
    return found[0]


def test_every_shipped_atlas_is_physical():
    for atlas in shipped_atlases():
        facts = model_facts(atlas.gpu)[0]
        peaks = {"bf16": atlas.dense_bf16_flops, "fp32": facts["fp32_flops"], "tf32": facts["tf32_flops"],
                 "fp8-tensorwise": facts["fp8_flops"], "fp8-rowwise": facts["fp8_flops"]}
        assert all(0 < p.flops_per_s <= 1.02 * peaks[p.dtype] for p in atlas.gemm)
        assert all(0 < p.flops_per_s <= atlas.dense_bf16_flops for p in atlas.attention)
        assert 0.5 < atlas.stream_fraction <= 1.0
        assert 0 < atlas.kernel_floor_s <= atlas.eager_kernel_floor_s < 20e-6
        assert 0 < atlas.host_s_per_op < atlas.dtensor_host_s_per_op
        assert atlas.date and atlas.versions.get("torch")


def test_at_a_measured_shape_the_share_is_the_measurement_whatever_the_analytic_model(atlas):
    rng = random.Random(0)
    measured = MeasuredKernels(atlas, "bf16", atlas.dense_bf16_flops, 1.0)
    for point in rng.sample(atlas.gemm_points("bf16"), 20):
        scale = rng.uniform(0.1, 1.0)
        analytic = lambda m, n, k, s=scale: s * (1 + (m * 7 + n * 3 + k) % 5) / 6  # noqa: E731
        got = measured.gemm_share(point.m, point.n, point.k, point.layout, analytic)
        assert got == pytest.approx(point.flops_per_s / atlas.dense_bf16_flops, rel=1e-9)


def test_between_measured_shapes_a_constant_analytic_share_stays_between_the_neighbours(atlas):
    measured = MeasuredKernels(atlas, "bf16", atlas.dense_bf16_flops, 1.0)
    shares = {(p.m, p.n, p.k): p.flops_per_s / atlas.dense_bf16_flops for p in atlas.gemm_points("bf16")
              if p.layout == "nt"}
    rng = random.Random(1)
    ms = sorted({k[0] for k in shares})
    for _ in range(30):
        i = rng.randrange(len(ms) - 1)
        m = rng.randint(ms[i] + 1, ms[i + 1] - 1)
        n, k = rng.choice(sorted({(key[1], key[2]) for key in shares}))
        lo, hi = shares.get((ms[i], n, k)), shares.get((ms[i + 1], n, k))
        if lo is None or hi is None:
            continue
        got = measured.gemm_share(m, n, k, "nt", lambda *_: 0.5)
        assert min(lo, hi) * (1 - 1e-9) <= got <= max(lo, hi) * (1 + 1e-9)


def test_the_copy_curve_grows_with_bytes_and_passes_through_its_points(atlas):
    sizes = sorted(b for b, _ in atlas.stream)
    for b, t in atlas.stream:
        assert atlas.stream_seconds(b) == pytest.approx(t)
    probe = [atlas.stream_seconds(x) for x in [sizes[0] / 2, *sorted(random.Random(2).uniform(sizes[0], 4 * sizes[-1])
                                                                       for _ in range(50))]]
    assert probe == sorted(probe)


def test_gpus_take_their_familys_atlas_or_none():
    h100, _ = system_gpu("hgx-h100")
    h200, _ = system_gpu("hgx-h200")
    a100, _ = system_gpu("dgx-a100")
    b200, _ = system_gpu("hgx-b200")
    own = measured_kernels(h100, "bf16")
    assert own is not None and own.atlas.gpu == h100.model and own.bandwidth_ratio == 1.0
    other = measured_kernels(h200, "bf16")
    assert other is not None and other.bandwidth_ratio == pytest.approx(
        other.atlas.memory_bandwidth_bytes_per_s / h200.memory_bandwidth_bytes_per_s)
    assert measured_kernels(b200, "bf16") is not None   # the nearest older generation's shares of its own peaks
    assert measured_kernels(a100, "bf16") is None and "datasheet roofline" in compute_source(a100, "bf16")
    assert "kernel atlas" in compute_source(h100, "bf16") and "measured on" in compute_source(h200, "bf16")
    # fp8 prices its other kernels as bf16's: the source names the atlas wherever bf16's does
    for gpu in (h100, h200, a100, b200):
        assert compute_source(gpu, "fp8") == compute_source(gpu, "bf16")


def test_no_memory_bound_kernel_beats_the_copy_of_its_bytes(atlas):
    measured = MeasuredKernels(atlas, "bf16", atlas.dense_bf16_flops, 1.0)
    rate = max(atlas.stream)[0] / max(atlas.stream)[1]
    for nbytes in (4e3, 1e6, 3e7, 1e9):
        for category in ("norm", "optimizer", "copies/casts", "elementwise/activation"):
            assert measured.memory_seconds(nbytes, category, rate) >= nbytes / rate * (1 - 1e-12)
            assert measured.memory_seconds(nbytes, category, 2 * rate) < measured.memory_seconds(nbytes, category, rate)


def test_a_file_that_is_not_an_atlas_is_one_line(tmp_path):
    from meshscale.errors import MeshscaleError
    bad = tmp_path / "atlas.json"
    bad.write_text('{"gpu": "x"}')
    with pytest.raises(MeshscaleError, match="not a kernel atlas"):
        load_atlas(bad)


def test_bench_kernels_without_a_gpu_is_one_line(cli, tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    run = cli("bench", "kernels", "--output", tmp_path / "a.json")
    assert run.exit_code == 2 and run.stderr.count("\n") == 1 and "has none" in run.stderr
    assert not (tmp_path / "a.json").exists()


def test_a_gpu_spec_from_the_atlas_gpus_own_facts_prices_its_kernels_from_it(atlas):
    spec = gpu_spec({"model": atlas.gpu})
    assert measured_kernels(spec, "bf16").atlas == atlas
