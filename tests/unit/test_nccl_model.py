"""NCCL's cost model on meshscale topologies: constants with sources, NCCL's choice per size, latency floor,
DGX-1 broadcast/reduce, socket crossing, forcing, NVLS only with multicast, scaling with the rank count."""
import pytest

from meshscale.errors import MeshscaleError
from meshscale.simulate import nccl
from meshscale.simulate.nccl import runtime, tuning
from meshscale.simulate import predict_collective
from meshscale.simulate.engine import run_flows
from meshscale.topology import load_system

GIB = 1 << 30


def test_every_family_loads_with_a_source():
    assert {"1.6", "2.7", "2.18", "2.20", "2.28"} <= set(nccl.families())
    for family in nccl.families():
        c = nccl.constants(family)
        assert c["family"] == family
        assert "tuning.cc" in c["source"] or "NCCL 1.x" in c["source"]
        assert c["base_latency_us"]["ring"]["LL"] > 0 and c["nvlink_bw_per_link"][90] == 20.6
    assert nccl.constants("2.18.5")["family"] == "2.18"
    assert nccl.constants(None)["family"] == "2.28"
    assert nccl.constants("1.6.1")["algorithms"] == ["ring"]
    with pytest.raises(MeshscaleError):
        nccl.constants("1.0")


def test_topology_facts_nccl_derives():
    h100 = nccl.analyse(load_system("hgx-h100"), list(range(8)))
    assert (h100.sm, h100.nvls, h100.ring.path_type) == (90, True, "NVL")
    assert h100.ring.total_gbps == pytest.approx(360)  # 6 rings at 60 GB/s on 18 x 20.6, duplicated to 12 x 30
    p100 = nccl.analyse(load_system("dgx1-p100"), list(range(8)))
    assert (p100.sm, p100.ring.channels, p100.ring.bw_gbps) == (60, 4, 18)  # 4 NVLink rings at 18 GB/s
    a100 = nccl.analyse(load_system("dgx-a100"), list(range(8)))
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
    c = nccl.constants("2.28")
    lat = {n: tuning.latency_us(nccl.analyse(topo, list(range(n))), c, "all_reduce", "ring", "LL")
           for n in (2, 4, 8)}
    assert lat[4] - lat[2] == pytest.approx(4 * 0.6) and lat[8] - lat[4] == pytest.approx(8 * 0.6)
    systems = {n: nccl.analyse(topo, list(range(n))) for n in (2, 4, 8)}
    # NCCL's estimate: ring busbw does not depend on the rank count, algbw = busBw * n / nsteps
    nccl_bus = {n: tuning.bus_bandwidth(s, c, "all_reduce", "ring", "Simple") * 2 * (n - 1) / n
                for n, s in systems.items()}
    assert nccl_bus[2] == pytest.approx(nccl_bus[8], rel=0.02)
    alg = {n: tuning.bus_bandwidth(systems[n], c, "all_gather", "ring", "Simple") for n in (2, 8)}
    assert alg[2] / alg[8] == pytest.approx((2 / 1) / (8 / 7), rel=0.02)
    # the run: a loop's 2(n-1) link steps and one copy inside the GPU, in lock step: busbw climbs towards the
    # link with the rank count, as the copy-out step weighs less
    bus = {n: predict_collective(topo, "all_reduce", list(range(n)), 4 * GIB, nvls=False).busbw_bytes_per_s
           for n in (2, 4, 8)}
    link = systems[2].ring.link_gbps  # 18 NVLinks x 20.6 GB/s
    assert link == pytest.approx(370.8) and systems[2].ring.total_gbps == 360.0
    local = 24 * c["per_channel_max_tree_bw"]["hopper"][0]
    for n in (2, 4, 8):
        sends = 2 * (n - 1)
        assert bus[n] == pytest.approx(sends / (sends / link + 1 / local) * 1e9, rel=0.01), n
    assert bus[2] < bus[4] < bus[8] < link * 1e9


def test_host_thread_driving_several_gpus_sets_a_floor():
    """One thread issuing the call on G GPUs: the loop runs at the longer of G issues and the device time."""
    topo = load_system("hgx-h200")
    launch_s = runtime.host_launch_s()
    one = predict_collective(topo, "all_reduce", [0, 1, 2, 3], 1024)
    four = predict_collective(topo, "all_reduce", [0, 1, 2, 3], 1024, gpus_per_thread=4)
    assert 4 * launch_s > one.time_s  # a small call: the thread is the bottleneck
    assert four.time_s == pytest.approx(4 * launch_s) and four.detail.endswith("(host launch bound)")
    big = predict_collective(topo, "all_reduce", [0, 1, 2, 3], GIB, gpus_per_thread=4)
    alone = predict_collective(topo, "all_reduce", [0, 1, 2, 3], GIB)
    assert big.time_s == pytest.approx(alone.time_s)  # the thread runs ahead: the kernels queue
    assert "host launch bound" not in big.detail


def test_host_launch_reproduces_its_source():
    """nccl-tests issue #123: all_reduce_perf -g G, Ring, 1 channel, 8 B on a DGX A100 (2022, an NCCL before
    2.28): 13.76 us (G=3) .. 33.7 (G=8); G=2 (10.0 us) is below the one-thread-per-GPU time the issue gives
    (12 us), within its run-to-run spread."""
    topo = load_system("dgx-a100")
    measured_us = {2: 10.0, 3: 13.76, 4: 16.88, 6: 25.2, 8: 33.7}
    for g, t_us in measured_us.items():
        p = nccl.predict(topo, "all_reduce", list(range(g)), 8, nccl_algo="ring", proto="LL", gpus_per_thread=g,
                               nccl_version="2.18")
        assert p.time_s * 1e6 == pytest.approx(t_us, rel=0.3 if g == 2 else 0.1), g


def test_launch_overhead_floor_reproduces_one_thread_per_gpu():
    """The same issue, one thread per GPU (-t G), Ring/LL: 12, 15, 17.6, 21 us for G = 2, 4, 6, 8: NCCL's own
    Ring/LL latency (7.8 .. 15 us) is below it; the floor adds the launch overhead."""
    topo = load_system("dgx-a100")
    measured_us = {2: 12.0, 4: 15.0, 6: 17.6, 8: 21.0}
    for g, t_us in measured_us.items():
        p = nccl.predict(topo, "all_reduce", list(range(g)), 8, nccl_algo="ring", proto="LL")
        assert p.time_s * 1e6 == pytest.approx(t_us, rel=0.1), g
        assert p.time_s > p.nccl_time_s  # NCCL's estimate leaves the overhead out


def test_launch_overhead_floor_leaves_nccl_choice_and_large_calls_alone():
    topo = load_system("hgx-h200")
    s = nccl.analyse(topo, [0, 1])
    c = nccl.constants()
    floor_us = runtime.call_floor_us(s, c, "all_gather")
    assert floor_us == pytest.approx(7.2 + 5.0)  # NCCL's Ring/LL 7.2 us (its printed table) + the overhead
    small = predict_collective(topo, "all_gather", [0, 1], 1024, nvls=False)
    # the overhead on top of NCCL's Ring/LL time: the floor + 1 KiB at LL's rate (a fraction of a us)
    assert floor_us * 1e-6 < small.time_s < (floor_us + 0.2) * 1e-6 and small.detail.startswith("nccl ring/LL")
    # LL128's own latency (NCCL: 15.9 us) is above the floor: forcing it changes nothing
    ll128 = predict_collective(topo, "all_gather", [0, 1], 1024, nccl_algo="ring", proto="LL128")
    assert ll128.time_s * 1e6 == pytest.approx(15.9, rel=0.05)
    big = nccl.predict(topo, "all_reduce", [0, 1], GIB)
    assert big.time_s == pytest.approx(big.candidates[0].time_s)  # far above the floor
    # point-to-point calls have their own latency, no collective floor
    p2p = nccl.predict(topo, "send_recv", [0, 1], 1024)
    assert p2p.time_s == pytest.approx(p2p.candidates[0].time_s)


def test_launch_overhead_adds_to_ll_and_simple_calls_of_any_size():
    """NCCL's estimate is the kernel's time: an LL or Simple call pays the launch overhead on top of NCCL's
    latency + size / bandwidth at every size; LL128's base latency already holds it; NCCL's choice is
    unchanged (it compares its own estimates)."""
    topo = load_system("hgx-h200")
    s = nccl.analyse(topo, [0, 1])
    c = nccl.constants()
    for proto, extra_us in (("Simple", 5.0), ("LL", 5.0), ("LL128", 0.0)):
        for nbytes in (4 << 20, 64 << 20, GIB):
            p = nccl.predict(topo, "all_gather", [0, 1], nbytes, nccl_algo="ring", proto=proto)
            kernel_us = runtime.predicted_us(s, c, "all_gather", "ring", proto, nbytes, 1.0)[0] - extra_us
            bw = (runtime.ring_loop_gbps(s, c, "all_gather", proto, 24) if proto != "LL"
                  else tuning.bus_bandwidth(s, c, "all_gather", "ring", proto))
            assert kernel_us == pytest.approx(tuning.latency_us(s, c, "all_gather", "ring", proto)
                                              + nbytes / (1000 * bw), rel=1e-9), (proto, nbytes)
            assert p.time_s * 1e6 == pytest.approx(kernel_us + extra_us, rel=1e-9), (proto, nbytes)
    assert runtime.launch_overhead_us("LL128") == 0.0 < runtime.launch_overhead_us("Simple")
    chosen = nccl.predict(topo, "all_gather", [0, 1], 4 << 20)
    assert chosen.candidates[0].nccl_time_s == min(e.nccl_time_s for e in chosen.candidates)


def test_host_launch_is_per_nccl_family():
    assert runtime.host_launch_s("2.28.9") == pytest.approx(6.1e-6)  # the 2x H200 C loop, NCCL 2.28.9
    assert runtime.host_launch_s("2.18.5") == pytest.approx(4.2e-6)  # nccl-tests issue #123, DGX A100
    assert runtime.host_launch_s("1.6") == runtime.host_launch_s("2.7")  # older than any measurement
    assert runtime.host_launch_s() == runtime.host_launch_s(nccl.DEFAULT_VERSION)


def test_schedule_algorithms_still_work():
    topo = load_system("dgx1-v100")
    ring = predict_collective(topo, "all_reduce", list(range(8)), 64 << 20, algorithm="ring")
    assert ring.algorithm == "ring" and ring.transfers > 0


# NCCL 2.28.9's own tuning table (NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING, NVLS off) on 2 and 4 H200 of an HGX
# H200: latency (us) / algorithm bandwidth (GB/s) per collective, algorithm and protocol, as NCCL printed it.
NCCL_PRINTED_H200 = {
    2: {("broadcast", "ring"): [(7.2, 141.0), (15.9, 331.2), (11.8, 360.0)],
        ("all_gather", "ring"): [(7.2, 282.0), (15.9, 662.4), (11.8, 720.0)],
        ("reduce_scatter", "ring"): [(7.2, 282.0), (15.9, 662.4), (11.8, 720.0)],
        ("all_reduce", "ring"): [(7.8, 141.0), (17.8, 331.2), (15.2, 360.0)],
        ("all_reduce", "tree"): [(8.0, 61.1), (16.5, 180.6), (16.4, 232.2)]},
    4: {("broadcast", "ring"): [(7.2, 141.0), (15.9, 331.2), (11.8, 360.0)],
        ("all_gather", "ring"): [(8.4, 188.0), (19.7, 441.6), (18.6, 480.0)],
        ("reduce_scatter", "ring"): [(8.4, 188.0), (19.7, 441.6), (18.6, 480.0)],
        ("all_reduce", "ring"): [(10.2, 94.0), (25.4, 220.8), (28.8, 240.0)],
        ("all_reduce", "tree"): [(10.4, 43.6), (21.5, 128.8), (32.4, 165.6)]},
}


@pytest.mark.parametrize("n_gpus", [2, 4])
def test_reproduces_nccl_printed_tuning_table_on_h200(n_gpus):
    topo = load_system("hgx-h200")
    s = nccl.analyse(topo, list(range(n_gpus)), "2.28.9")
    c = nccl.constants("2.28.9")
    assert (s.ring.channels, s.ring.bw_gbps) == (12, 30.0)  # "Pattern 4, nChannels 12, bw 30"
    assert runtime.comm_channels(s, c, "ring") == 24  # "24 coll channels"
    for (collective, algo), row in NCCL_PRINTED_H200[n_gpus].items():
        for proto, (lat_us, bw_gbps) in zip(nccl.PROTOCOLS, row):
            assert tuning.enabled(s, c, collective, algo, proto, nvls=False)
            assert tuning.latency_us(s, c, collective, algo, proto) == pytest.approx(lat_us, rel=0.02)
            assert tuning.bus_bandwidth(s, c, collective, algo, proto) == pytest.approx(bw_gbps, rel=0.02)
    assert not tuning.enabled(s, c, "all_gather", "tree", "Simple", nvls=False)


def test_tree_graph_follows_nccl_search_on_h200():
    """2 GPUs: chains 0->1 and 1->0 at 60 GB/s fill the ring's 12 channels ("Pattern 1, nChannels 12, bw 60,
    sameChannels 0"); 4 GPUs: fewer chains at 60, duplicated to 12 x 30 ("nChannels 12, bw 30")."""
    topo = load_system("hgx-h200")
    two = nccl.analyse(topo, [0, 1], "2.28.9").tree
    assert (two.channels, two.bw_gbps, two.same_channels) == (12, 60, False)
    four = nccl.analyse(topo, [0, 1, 2, 3], "2.28.9").tree
    assert (four.channels, four.bw_gbps) == (12, 30)
