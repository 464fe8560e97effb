"""Batch norm's channels-last kernels priced by their mechanism: the bytes they move against HBM, the
instructions they issue against the SMs' issue slots and their reciprocal/conversion unit."""
from dataclasses import replace

import pytest

from meshscale.predict.training.hardware import gpu_spec, system_gpu
from meshscale.predict.training.kernels import instruction_seconds, kernel_seconds, rates
from meshscale.predict.training.workload import batch_norm_kernels, bn_instructions, resnet_step

H100, _ = system_gpu("hgx-h100")


def _statistics(kernels):
    return next(k for k in kernels if k.name.endswith(" statistics") and "running" not in k.name)


@pytest.mark.parametrize("model,boost_mhz", [("NVIDIA H100 80GB HBM3", 1980), ("NVIDIA A100-SXM4-40GB", 1410),
                                             ("Tesla V100-SXM2-16GB", 1530), ("NVIDIA A10", 1695)])
def test_the_clock_the_fp32_rate_implies_is_the_published_boost_clock(model, boost_mhz):
    # boost clocks from the architecture whitepapers / datasheets, not from the FP32 figure the clock is derived from
    assert gpu_spec({"model": model, "memory_bytes": 1}).clock_hz == pytest.approx(boost_mhz * 1e6, rel=0.01)


def test_the_statistics_kernel_grows_with_its_elements_and_is_never_below_its_bytes_or_its_instructions():
    r = rates(H100, "bf16")
    times = []
    for rows in (6272, 25088, 100352, 401408, 1605632):
        k = _statistics(batch_norm_kernels("bn", rows, 256, 2))
        t = kernel_seconds(k, r)
        assert t >= (times[-1] if times else 0.0)      # equal only at the launch floor
        assert t >= k.bytes / r.bandwidth_bytes_per_s
        assert t >= k.instructions.issued / r.issue_per_s
        assert t >= k.instructions.xu / r.xu_per_s
        times.append(t)
    assert times[-1] > 16 * times[0]


def test_fp32_activations_move_more_bytes_than_bf16_and_take_no_less_time():
    r = rates(H100, "fp32")
    for half, full in zip(batch_norm_kernels("bn", 100352, 512, 2), batch_norm_kernels("bn", 100352, 512, 4)):
        assert full.bytes >= half.bytes
        assert (full.backward_bytes or 0) >= (half.backward_bytes or 0)
        assert kernel_seconds(full, r) >= kernel_seconds(half, r)


def test_more_sms_at_the_same_clock_and_bandwidth_are_never_slower():
    big = replace(H100, sm_count=2 * H100.sm_count, fp32_flops=2 * H100.fp32_flops)
    assert big.clock_hz == pytest.approx(H100.clock_hz)
    for k in resnet_step(50, 128).forward + resnet_step(50, 128).backward:
        if k.name.startswith("bn"):
            assert kernel_seconds(k, rates(big, "bf16")) <= kernel_seconds(k, rates(H100, "bf16"))


def test_with_unbounded_bandwidth_each_kernel_and_its_backward_take_their_own_instructions():
    # the backward kernels (reduce, input gradient) are priced by their own arithmetic, carried through autograd's
    # pass, not by their forward's
    r = replace(rates(H100, "bf16"), bandwidth_bytes_per_s=1e30)
    step = resnet_step(50, 128)
    rows, channels = 128 * 112 * 112, 64            # the stem's batch norm
    elements = rows * channels
    expected = {"bn0.0 statistics": "statistics", "bn0.0 normalize": "transform",
                "bn0.0 statistics backward": "backward_reduce", "bn0.0 normalize backward": "backward_elemt"}
    for k in step.forward + step.backward:
        if k.name in expected:
            own = bn_instructions(expected.pop(k.name), elements, 2)
            assert k.instructions == own
            assert kernel_seconds(k, r) == pytest.approx(instruction_seconds(own, r))
    assert not expected


def test_where_bandwidth_outgrows_the_issue_rate_the_welford_pass_stops_following_the_bandwidth():
    # H200: the H100's SMs and clock with 1.43x its bandwidth; the normalize pass (memory-bound) speeds up by about
    # that ratio, the statistics pass (its Welford divides once per element) by less
    h200, _ = system_gpu("hgx-h200")
    assert h200.clock_hz == pytest.approx(H100.clock_hz) and h200.sm_count == H100.sm_count
    ratio = h200.memory_bandwidth_bytes_per_s / H100.memory_bandwidth_bytes_per_s
    kernels = batch_norm_kernels("bn", 401408, 256, 2)
    stats, normalize = _statistics(kernels), kernels[-1]
    a, b = rates(H100, "bf16"), rates(h200, "bf16")
    assert kernel_seconds(normalize, a) / kernel_seconds(normalize, b) == pytest.approx(ratio, rel=0.01)
    assert kernel_seconds(stats, a) / kernel_seconds(stats, b) < ratio * 0.95
