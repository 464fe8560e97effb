"""The DGX-1 whitepaper's figures 5 and 6 from one described model (the CNTK 2016 framework profile, the
documented P100 profile, NCCL's cost model for NCCL 1.x), with nothing fitted to the figures."""
import importlib.util
import inspect

import pytest

import meshscale.predict.whitepaper as whitepaper
from meshscale.predict.whitepaper import MEASURED, reproduce


# The targets: each 8-GPU throughput within 15%, NVLink / PCIe (1.38 weak, 1.63 strong) within 10%. The P100
# PCIe computes slower than the profiled SXM2 by the FP32 rates at the base clocks (1328 vs 1126 MHz: 1.18), the
# clock each holds under its power cap at full load (the whitepaper prediction's notes).
TARGET, RATIO_TARGET = 0.15, 0.10


@pytest.mark.parametrize("mode", ["weak", "strong"])
def test_figure_within_the_targets(mode):
    fig = reproduce(mode)
    assert abs(fig.errors[0]) < TARGET and abs(fig.errors[1]) < TARGET, (mode, fig.predicted, fig.exposed_s)
    assert fig.ratio == pytest.approx(MEASURED[mode][0] / MEASURED[mode][1], rel=RATIO_TARGET), (mode, fig.exposed_s)


def test_pcie_compute_is_the_base_clock_ratio_of_the_whole_step():
    weak, strong = reproduce("weak"), reproduce("strong")
    for fig in (weak, strong):
        assert fig.compute_s[1] / fig.compute_s[0] == pytest.approx(1328 / 1126, rel=1e-3)


def test_nvlink_beats_pcie_more_in_strong_scaling():
    assert reproduce("strong").ratio > reproduce("weak").ratio > 1.1


def test_the_exchange_is_what_differs_and_the_model_has_no_fit():
    weak, strong = reproduce("weak"), reproduce("strong")
    # the same gradients, the same calls: the exchange per step does not depend on the batch
    assert weak.exchange_s == pytest.approx(strong.exchange_s)
    assert weak.exposed_s == weak.exchange_s  # CNTK 2016 exchanged after backward
    assert weak.exchange_s[1] > 3 * weak.exchange_s[0]  # PCIe across QPI vs four NVLink rings
    assert strong.compute_s[0] < weak.compute_s[0] / 4  # batch 8 per GPU: a fixed part that does not shrink
    source = inspect.getsource(whitepaper)
    assert "minimize" not in source and "comm_scale" not in source
    assert not [name for name in dir(whitepaper) if "fit" in name.lower()]
    assert importlib.util.find_spec("meshscale.predict.comm_fit") is None


def test_cli_prints_the_figures(cli):
    done = cli("predict", "--model", "resnet50", "--system", "dgx1-p100", "--gpus", "1,2,4,8", "--compare",
               "nvlink-pcie", "--framework", "cntk-2016")
    assert done.exit_code == 0, done.stderr
    fig = reproduce("weak")
    assert f"{fig.predicted[0]:,.1f}" in done.stdout and f"{fig.predicted[1]:,.1f}" in done.stdout
