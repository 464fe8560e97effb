"""Fitting the simulator to a measured NCCL all_reduce (2x H200): copy engines reach more of NVLink than
NCCL's kernels, so the p2p-only calibration over-predicts large all_reduces; the collective fit corrects it."""
from pathlib import Path

import pytest

from meshscale.errors import MeshscaleError
from meshscale.results import load_result
from meshscale.simulate import calibrate, calibrate_collective
from meshscale.simulate.cost import Call
from meshscale.simulate.fabric import Fabric
from meshscale.topology import load

FIX = Path(__file__).parents[1] / "fixtures"


@pytest.fixture(scope="module")
def setup():
    topo = load(FIX / "topo_h200x2.json")
    bench = load_result(FIX / "bench_allreduce_h200x2.json")
    p2p_params = calibrate(topo, load_result(FIX / "p2p_h200x2.json"))
    measured = {r["size_bytes"]: r["busbw_bytes_per_s"] for r in bench.rows}
    return topo, bench, p2p_params, measured


def test_fit_matches_the_largest_size_and_lowers_nvlink_efficiency(setup):
    topo, bench, p2p_params, measured = setup
    fitted = calibrate_collective(topo, bench, p2p_params)
    largest = max(measured)
    got = Fabric(topo, params=fitted).cost(Call("all_reduce", largest, tuple([0, 1]))).busbw_bytes_per_s
    assert got == pytest.approx(measured[largest], rel=0.02)
    assert fitted.efficiency_of("nvlink") < p2p_params.efficiency_of("nvlink")
    assert "all_reduce busbw" in fitted.source


def test_fit_improves_a_size_it_was_not_fitted_on(setup):
    topo, bench, p2p_params, measured = setup
    fitted = calibrate_collective(topo, bench, p2p_params)
    size = 256 << 20
    error = lambda params: abs(Fabric(topo, params=params).cost(Call("all_reduce", size, tuple([0, 1]))).busbw_bytes_per_s
                               / measured[size] - 1)
    assert error(fitted) < error(p2p_params)
    assert error(fitted) < 0.10


def test_wrong_kind_is_refused(setup):
    topo, _, p2p_params, _ = setup
    with pytest.raises(MeshscaleError, match="bench-collective"):
        calibrate_collective(topo, load_result(FIX / "p2p_h200x2.json"), p2p_params)
