"""The alpha-beta ring model behind the one cost-model interface, and the one rule that sizes every call."""
from __future__ import annotations

import pytest

from meshscale.errors import MeshscaleError
from meshscale.simulate.alpha_beta import AlphaBetaCostModel
from meshscale.simulate.auto import FlowCostModel
from meshscale.simulate.cost import Call, CostModel, call_bytes
from meshscale.simulate.fabric import Fabric
from meshscale.simulate.nccl.cost_model import NcclCostModel
from meshscale.simulate.params import SimParams
from meshscale.topology import load_system, route

PCIE = load_system("pcie-8gpu-2socket")


def _time(topo, collective, nbytes, ranks, model: CostModel = AlphaBetaCostModel()) -> float:
    return model.predict(Call(collective, nbytes, tuple(ranks)), topo).time_s


def test_time_grows_with_bytes_and_with_ranks():
    sizes = [1 << k for k in range(10, 31, 4)]
    times = [_time(PCIE, "all_reduce", n, range(8)) for n in sizes]
    assert times == sorted(times) and len(set(times)) == len(times)
    for nbytes in (1024, 1 << 28):
        by_ranks = [_time(PCIE, "all_reduce", nbytes, range(p)) for p in (2, 3, 4, 6, 8)]
        assert by_ranks == sorted(by_ranks)


def test_an_all_reduce_is_a_reduce_scatter_then_an_all_gather():
    topo = load_system("dgx1-p100")
    for nbytes in (4096, 1 << 26):
        both = _time(topo, "reduce_scatter", nbytes, range(8)) + _time(topo, "all_gather", nbytes, range(8))
        assert _time(topo, "all_reduce", nbytes, range(8)) == pytest.approx(both, rel=1e-12)


def test_two_ranks_cost_the_route_latency_and_rate_of_their_one_link():
    """Oracle: Thakur et al.'s ring all-reduce, 2(p-1) alpha + 2(p-1)/p n beta, with alpha and beta read off the
    route between the two GPUs (PCIe through their switch) at the calibration's efficiency."""
    params = SimParams()
    r = route(PCIE, PCIE.device(0), PCIE.device(1))
    rate = sum(min([p.bandwidth_bytes_per_s] + [PCIE.links[i].bandwidth_bytes_per_s * params.efficiency_of(PCIE.links[i].kind)
                                                for i, _ in p.directed_links]) for p in r.paths)
    alpha = r.latency_s + params.message_latency_of("default")
    nbytes = 1 << 24
    assert _time(PCIE, "all_reduce", nbytes, [0, 1]) == pytest.approx(2 * alpha + nbytes / rate, rel=1e-12)


def test_a_calibration_that_halves_the_links_slows_large_calls():
    slow = AlphaBetaCostModel.from_params(SimParams(efficiency={k: 0.35 for k in ("pcie", "qpi", "nvlink")}))
    fast = AlphaBetaCostModel.from_params(SimParams(efficiency={k: 0.7 for k in ("pcie", "qpi", "nvlink")}))
    big = 1 << 30
    assert _time(PCIE, "all_reduce", big, range(8), slow) == pytest.approx(2 * _time(PCIE, "all_reduce", big, range(8), fast), rel=0.01)


def test_it_prices_only_ring_collectives():
    with pytest.raises(MeshscaleError, match="ring collectives"):
        _time(PCIE, "broadcast", 1 << 20, range(4))


@pytest.mark.parametrize("collective, ranks", [("all_reduce", 8), ("all_gather", 8), ("reduce_scatter", 3),
                                               ("all_to_all", 6), ("broadcast", 5)])
def test_every_size_is_rounded_down_to_what_nccl_tests_runs(collective, ranks):
    """nccl-tests sizes a call as whole elements, per rank where the buffer splits over the ranks, rounded
    down; never below one such step. The sweep, the cost interface and the fabric agree."""
    from meshscale.collectives.kinds import kind
    from meshscale.simulate.plan import sim_sweep

    step = 4 * ranks if kind(collective).segmented else 4
    for asked in (1, step - 1, step, 10 * step + 3, 1_000_003):
        got = call_bytes(collective, asked, ranks)
        assert got % step == 0 and got <= max(asked, step) and got + step > asked
    topo = load_system("hgx-h100")
    group = list(range(ranks))
    asked = 1_000_003
    swept = sim_sweep(Fabric(topo), collective, group, [asked]).rows[0]["size_bytes"]
    priced = NcclCostModel().predict(Call(collective, asked, tuple(group)), topo)
    assert swept == call_bytes(collective, asked, ranks) == Fabric(topo).cost(Call(collective, asked, tuple(group))).call.sized_bytes
    assert priced.time_s == pytest.approx(Fabric(topo).cost(Call(collective, asked, tuple(group))).time_s, rel=1e-12)
