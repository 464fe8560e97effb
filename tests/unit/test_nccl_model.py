"""NCCL's cost model on meshscale topologies: constants with sources, NCCL's choice per size, latency floor,
DGX-1 broadcast/reduce, socket crossing, forcing, NVLS only with multicast, scaling with the rank count."""
import pytest

from meshscale.errors import MeshscaleError
from meshscale.simulate import nccl_model, predict_collective
from meshscale.simulate.engine import run_flows
from meshscale.topology import load_system

GIB = 1 << 30


def test_every_family_loads_with_a_source():
    assert {"1.6", "2.7", "2.18", "2.20", "2.28"} <= set(nccl_model.families())
    for family in nccl_model.families():
        c = nccl_model.constants(family)
        assert c["family"] == family
        assert "tuning.cc" in c["source"] or "NCCL 1.x" in c["source"]
        assert c["base_latency_us"]["ring"]["LL"] > 0 and c["nvlink_bw_per_link"][90] == 20.6
    assert nccl_model.constants("2.18.5")["family"] == "2.18"
    assert nccl_model.constants(None)["family"] == "2.28"
    assert nccl_model.constants("1.6.1")["algorithms"] == ["ring"]
    with pytest.raises(MeshscaleError):
        nccl_model.constants("1.0")


def test_topology_facts_nccl_derives():
    h100 = nccl_model.analyse(load_system("hgx-h100"), list(range(8)))
    assert (h100.sm, h100.nvls, h100.ring.path_type) == (90, True, "NVL")
    assert h100.ring.total_gbps == pytest.approx(360)  # 6 rings at 60 GB/s on 18 x 20.6, duplicated to 12 x 30
    p100 = nccl_model.analyse(load_system("dgx1-p100"), list(range(8)))
    assert (p100.sm, p100.ring.channels, p100.ring.bw_gbps) == (60, 4, 18)  # 4 NVLink rings at 18 GB/s
    a100 = nccl_model.analyse(load_system("dgx-a100"), list(range(8)))
    assert a100.sm == 80 and not a100.nvls and a100.ring.total_gbps == pytest.approx(240)


def test_choice_changes_with_size():
    topo = load_system("hgx-h100")
    ranks = list(range(8))
    small = predict_collective(topo, "all_reduce", ranks, 1024)
    large = predict_collective(topo, "all_reduce", ranks, GIB)
    assert small.detail.startswith("nccl ring/LL,")
    assert large.detail.startswith("nccl nvls/Simple")
    no_nvls = predict_collective(topo, "all_reduce", ranks, GIB, nvls=False)
    assert no_nvls.detail.startswith("nccl ring/Simple")
    assert large.busbw_bytes_per_s > 1.15 * no_nvls.busbw_bytes_per_s  # NVLS ~475 against ring ~360 GB/s


def test_small_all_reduce_latency_floor_on_nvswitch():
    for system in ("hgx-h100", "dgx-a100", "hgx-h200"):
        t = predict_collective(load_system(system), "all_reduce", list(range(8)), 1024).time_s
        assert 10e-6 <= t <= 30e-6, (system, t)


def test_dgx1_broadcast_and_reduce_reach_60():
    topo = load_system("dgx1-p100")
    for collective in ("broadcast", "reduce"):
        r = predict_collective(topo, collective, list(range(8)), GIB)
        assert r.busbw_bytes_per_s >= 60e9, (collective, r.detail)
    old = predict_collective(topo, "broadcast", list(range(8)), GIB, nccl_version="1.6")
    assert old.busbw_bytes_per_s >= 60e9 and "ring/Simple" in old.detail


def test_socket_crossing_is_slower():
    topo = load_system("pcie-8gpu-2socket")
    one = predict_collective(topo, "all_reduce", [0, 1, 2, 3], 256 << 20)
    two = predict_collective(topo, "all_reduce", [0, 1, 4, 5], 256 << 20)
    assert two.busbw_bytes_per_s < 0.75 * one.busbw_bytes_per_s
    assert 9e9 <= one.busbw_bytes_per_s <= 11e9 and 5e9 <= two.busbw_bytes_per_s <= 7e9  # ">10" and ">5" GB/s
    sched_one = predict_collective(topo, "all_reduce", [0, 1, 2, 3], 256 << 20, algorithm="auto")
    assert sched_one.busbw_bytes_per_s < 10.59e9  # the ring crosses the root complex: TLP overhead
    rates = {}
    for dst in (1, 4):
        run = run_flows(topo, ["gpu0"], [f"gpu{dst}"], [1e9], [False], [[]])
        rates[dst] = 1e9 / run.time_s
    assert rates[4] < 0.9 * rates[1]
    assert rates[4] == pytest.approx(9.15e9, rel=0.05)  # measured across QPI


def test_forced_algorithm_and_protocol_are_honoured():
    topo = load_system("hgx-h200")
    r = predict_collective(topo, "all_reduce", list(range(8)), 1 << 20, nccl_algo="Ring", proto="simple")
    assert r.detail.startswith("nccl ring/Simple")
    r = predict_collective(topo, "all_reduce", list(range(8)), GIB, proto="LL")
    assert "/LL," in r.detail
    with pytest.raises(MeshscaleError, match="cannot run"):
        predict_collective(topo, "broadcast", list(range(8)), GIB, nccl_algo="tree")
    with pytest.raises(MeshscaleError, match="unknown NCCL protocol"):
        predict_collective(topo, "all_reduce", list(range(8)), GIB, proto="fast")


def test_nvls_only_where_switches_multicast():
    for system in ("dgx-a100", "dgx2", "dgx1-v100"):
        with pytest.raises(MeshscaleError, match="cannot run"):
            predict_collective(load_system(system), "all_reduce", [0, 1, 2, 3], GIB, nccl_algo="nvls")
    h200 = load_system("hgx-h200")
    assert predict_collective(h200, "all_reduce", [0, 1, 2, 3], GIB, nccl_algo="nvls").detail.startswith("nccl nvls")
    with pytest.raises(MeshscaleError):  # NCCL sets NVLS up only for 3 GPUs or more
        predict_collective(h200, "all_reduce", [0, 1], GIB, nccl_algo="nvls")


def test_ranks_scale_as_the_formulas_say():
    topo = load_system("hgx-h100")
    c = nccl_model.constants("2.28")
    lat = {n: nccl_model.latency_us(nccl_model.analyse(topo, list(range(n))), c, "all_reduce", "ring", "LL")
           for n in (2, 4, 8)}
    assert lat[4] - lat[2] == pytest.approx(4 * 0.6) and lat[8] - lat[4] == pytest.approx(8 * 0.6)
    bus = {n: predict_collective(topo, "all_reduce", list(range(n)), 4 * GIB, nvls=False).busbw_bytes_per_s
           for n in (2, 4, 8)}
    assert bus[2] == pytest.approx(bus[8], rel=0.02)  # ring busbw does not depend on the rank count
    alg = {n: predict_collective(topo, "all_gather", list(range(n)), 4 * GIB).algbw_bytes_per_s for n in (2, 8)}
    assert alg[2] / alg[8] == pytest.approx((2 / 1) / (8 / 7), rel=0.02)  # algbw = busBw * n / (n - 1)


def test_host_thread_driving_several_gpus_sets_a_floor():
    topo = load_system("hgx-h200")
    one = predict_collective(topo, "all_reduce", [0, 1, 2, 3], 1024)
    four = predict_collective(topo, "all_reduce", [0, 1, 2, 3], 1024, gpus_per_thread=4)
    assert four.time_s == pytest.approx(4 * nccl_model.host_launch_s()) and four.time_s > one.time_s


def test_schedule_algorithms_still_work():
    topo = load_system("dgx1-v100")
    ring = predict_collective(topo, "all_reduce", list(range(8)), 64 << 20, algorithm="ring")
    assert ring.algorithm == "ring" and ring.transfers > 0
