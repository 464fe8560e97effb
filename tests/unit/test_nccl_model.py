"""NCCL's cost model on meshscale topologies: the version families, NCCL's tuning table (filled once per
communicator, equal to the table NCCL prints), its choice per size, the protocols' trade, the host and launch
costs a run adds, and bounds a prediction keeps."""
import pytest

from meshscale.collectives.bounds import busbw_bound
from meshscale.errors import MeshscaleError
from meshscale.simulate import nccl
from meshscale.simulate.cost import Call
from meshscale.simulate.fabric import Fabric
from meshscale.simulate.nccl_env import NcclSettings
from meshscale.simulate.engine import run_flows
from meshscale.simulate.nccl import runtime, tables, tuning
from meshscale.simulate.nccl_env import parse_nccl_env
from meshscale.topology import load_system

GIB = 1 << 30


def test_a_version_takes_the_newest_family_not_newer():
    families = nccl.families()
    assert families == sorted(families, key=tables.version_key)
    for family in families:
        c = nccl.constants(family)
        assert c["family"] == family
        assert "tuning.cc" in c["source"] or "NCCL 1.x" in c["source"]
        assert nccl.constants(family + ".9")["family"] == family  # a patch release stays in its family
    for older, newer in zip(families, families[1:]):
        between = f"{tables.version_key(newer)[0]}.{tables.version_key(newer)[1] - 1}"
        if tables.version_key(older) <= tables.version_key(between):
            assert nccl.constants(between)["family"] == older
    assert nccl.constants(None)["family"] == nccl.constants(nccl.DEFAULT_VERSION)["family"]
    with pytest.raises(MeshscaleError, match="no NCCL constants"):
        nccl.constants("1.0")
    with pytest.raises(MeshscaleError, match="not a version"):
        nccl.constants("latest")


@pytest.mark.slow  # NCCL's search per communicator
def test_the_tuning_table_is_filled_once_per_communicator(monkeypatch):
    """NCCL fills its table once (ncclTopoTuneModel) and reads it for every call: predictions of every size and
    collective on one fabric fill it once; a communicator NCCL sets up differently (fewer channels) gets its own."""
    fills = []
    fill = tuning.fill_table
    monkeypatch.setattr(tuning, "fill_table", lambda s, c: fills.append(s) or fill(s, c))
    topo = load_system("hgx-h200")
    for collective in ("all_reduce", "all_gather", "broadcast"):
        for nbytes in (1 << 10, 1 << 20, 64 << 20, GIB):
            nccl.predict(topo, collective, list(range(8)), nbytes)
    assert len(fills) == 1
    nccl.predict(topo, "all_reduce", list(range(8)), GIB, nvls=False)  # NCCL_NVLS_ENABLE: the same table
    assert len(fills) == 1
    nccl.predict(topo, "all_reduce", list(range(8)), GIB, env=parse_nccl_env(["NCCL_MAX_NCHANNELS=4"]))
    assert len(fills) == 2 and fills[0] is not fills[1]


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
def test_the_table_is_the_one_nccl_prints_on_h200(n_gpus):
    topo = load_system("hgx-h200")
    s = nccl.analyse(topo, list(range(n_gpus)), "2.28.9")
    c = nccl.constants("2.28.9")
    assert (s.ring.channels, s.ring.bw_gbps) == (12, 30.0)  # "Pattern 4, nChannels 12, bw 30"
    assert runtime.comm_channels(s, c, "ring") == 24  # "24 coll channels"
    table = tuning.tuning_table(s, c)
    for (collective, algo), row in NCCL_PRINTED_H200[n_gpus].items():
        for proto, (lat_us, bw_gbps) in zip(nccl.PROTOCOLS, row):
            entry = table.entries[(collective, algo, proto)]
            assert entry.latency_us == pytest.approx(lat_us, rel=0.02)
            assert entry.bandwidth_gbps == pytest.approx(bw_gbps, rel=0.02)
    assert not any(a == "tree" for a, _, _ in table.offered("all_gather"))  # NCCL has no tree all-gather


def test_tree_graph_follows_nccl_search_on_h200():
    """2 GPUs: chains 0->1 and 1->0 at 60 GB/s fill the ring's 12 channels ("Pattern 1, nChannels 12, bw 60,
    sameChannels 0"); 4 GPUs: fewer chains at 60, duplicated to 12 x 30 ("nChannels 12, bw 30")."""
    topo = load_system("hgx-h200")
    two = nccl.analyse(topo, [0, 1], "2.28.9").tree
    assert (two.channels, two.bw_gbps, two.same_channels) == (12, 60, False)
    four = nccl.analyse(topo, [0, 1, 2, 3], "2.28.9").tree
    assert (four.channels, four.bw_gbps) == (12, 30)


def test_the_search_fills_a_gpus_links_and_never_more():
    """The ring graph carries at most what a GPU's NVLinks carry at NCCL's per-link rate, and all of it where
    rings through every GPU can use every link (NVSwitch; DGX-1's cube-mesh, whose rings use all 4 or 6 links).
    Two DGX-1 GPUs without an NVLink between them fall back to PCIe."""
    c = nccl.constants()
    for system in ("hgx-h100", "dgx-a100", "dgx1-p100", "dgx1-v100", "dgx2"):
        topo = load_system(system)
        s = nccl.analyse(topo, list(range(8)))
        links_gbps = sum(l.count for l in topo.links_of(topo.device(0), "nvlink")) * c["nvlink_bw_per_link"][s.sm]
        assert s.ring.path_type == "NVL"
        assert s.ring.total_gbps <= s.ring.link_gbps <= links_gbps + 1e-9, system
        assert s.ring.link_gbps >= 0.99 * links_gbps, system
    apart = nccl.analyse(load_system("dgx1-p100"), [0, 5])
    assert apart.ring.path_type != "NVL" and apart.ring.total_gbps < 18


def test_nccl_picks_the_fastest_of_its_own_estimates():
    topo = load_system("hgx-h100")
    for nbytes in (1 << 10, 1 << 20, 64 << 20, GIB):
        p = nccl.predict(topo, "all_reduce", list(range(8)), nbytes)
        assert (p.algo, p.proto) == (p.candidates[0].algo, p.candidates[0].proto)
        assert p.nccl_time_s == min(e.nccl_time_s for e in p.candidates)
    small = Fabric(topo).cost(Call("all_reduce", 1024, tuple(list(range(8)))))
    large = Fabric(topo).cost(Call("all_reduce", GIB, tuple(list(range(8)))))
    assert small.detail.startswith("nccl ring/LL,") and large.detail.startswith("nccl nvls/Simple")


@pytest.mark.parametrize("system", ["hgx-h100", "dgx-a100", "dgx1-v100"])
def test_ll_wins_tiny_messages_and_loses_large_ones(system):
    """LL's flag in every 8 B line makes each step cheap and halves the bandwidth: faster than Simple for a tiny
    message, slower for a large one, by NCCL's estimate and by the predicted time alike."""
    topo = load_system(system)

    def forced(proto, nbytes):
        return nccl.predict(topo, "all_reduce", list(range(8)), nbytes, nccl_algo="ring", proto=proto, nvls=False)

    for tiny_or_large, ll_faster in ((1024, True), (GIB, False)):
        ll, simple = forced("LL", tiny_or_large), forced("Simple", tiny_or_large)
        assert (ll.time_s < simple.time_s) == ll_faster
        assert (ll.nccl_time_s < simple.nccl_time_s) == ll_faster


def test_no_prediction_above_the_links_bound_without_in_switch_reduction():
    """Without NVLink SHARP (reduction in the switch), NCCL's algorithms move every byte over the GPUs' links:
    the predicted busbw stays under the links' bound; NVLS all-reduce may pass it (the switch reduces)."""
    for system in ("hgx-h100", "dgx-a100", "dgx1-p100", "pcie-8gpu-2socket"):
        topo = load_system(system)
        ranks = list(range(8))
        for collective in ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "send_recv"):
            bound = busbw_bound(topo, collective, ranks)
            for nbytes in (1 << 20, 64 << 20, GIB):
                r = Fabric(topo, nccl=NcclSettings(nvls=False)).cost(Call(collective, nbytes, tuple(ranks)))
                assert r.busbw_bytes_per_s <= bound * 1.0001, (system, collective, nbytes, r.detail)
    nvls = Fabric(load_system("hgx-h100")).cost(Call("all_reduce", 8 * GIB, tuple(list(range(8)))))
    assert nvls.detail.startswith("nccl nvls") and nvls.busbw_bytes_per_s > busbw_bound(
        load_system("hgx-h100"), "all_reduce", list(range(8))) * 0.9


def test_ring_latency_grows_by_steps_and_busbw_climbs_with_the_ranks():
    """NCCL's ring latency adds one hop per step (2(n-1) of them for all-reduce); the run's loop of 2(n-1) link
    steps and one copy inside the GPU weighs the copy less as n grows: busbw climbs, under the links."""
    topo = load_system("hgx-h100")
    c = nccl.constants()
    lat = {n: tuning.tuning_table(nccl.analyse(topo, list(range(n))), c).entries[("all_reduce", "ring", "LL")]
           .latency_us for n in (2, 4, 8)}
    assert lat[8] - lat[4] == pytest.approx(2 * (lat[4] - lat[2]))  # 8 steps more against 4
    bus = {n: Fabric(topo, nccl=NcclSettings(nvls=False)).cost(Call("all_reduce", 4 * GIB, tuple(list(range(n))))).busbw_bytes_per_s
           for n in (2, 4, 8)}
    link = nccl.analyse(topo, [0, 1]).ring.link_gbps * 1e9
    assert bus[2] < bus[4] < bus[8] < link


def test_dgx1_broadcast_and_reduce_reach_60():
    topo = load_system("dgx1-p100")
    for collective in ("broadcast", "reduce"):
        r = Fabric(topo).cost(Call(collective, GIB, tuple(list(range(8)))))
        assert r.busbw_bytes_per_s >= 60e9, (collective, r.detail)
    old = Fabric(topo, nccl=NcclSettings(version="1.6")).cost(Call("broadcast", GIB, tuple(list(range(8)))))
    assert old.busbw_bytes_per_s >= 60e9 and "ring/Simple" in old.detail


def test_socket_crossing_is_slower():
    topo = load_system("pcie-8gpu-2socket")
    one = Fabric(topo).cost(Call("all_reduce", 256 << 20, tuple([0, 1, 2, 3])))
    two = Fabric(topo).cost(Call("all_reduce", 256 << 20, tuple([0, 1, 4, 5])))
    assert two.busbw_bytes_per_s < 0.75 * one.busbw_bytes_per_s
    sched_one = Fabric(topo, algo="auto").cost(Call("all_reduce", 256 << 20, tuple([0, 1, 2, 3])))
    assert sched_one.busbw_bytes_per_s < 10.59e9  # the ring crosses the root complex: TLP overhead
    rates = {}
    for dst in (1, 4):
        run = run_flows(topo, ["gpu0"], [f"gpu{dst}"], [1e9], [False], [[]])
        rates[dst] = 1e9 / run.time_s
    assert rates[4] < 0.9 * rates[1]


def test_forced_algorithm_and_protocol_are_honoured():
    topo = load_system("hgx-h200")
    r = Fabric(topo, nccl=NcclSettings(algo="Ring", proto="simple")).cost(Call("all_reduce", 1 << 20, tuple(list(range(8)))))
    assert r.detail.startswith("nccl ring/Simple")
    r = Fabric(topo, nccl=NcclSettings(proto="LL")).cost(Call("all_reduce", GIB, tuple(list(range(8)))))
    assert "/LL," in r.detail
    with pytest.raises(MeshscaleError, match="cannot run"):
        Fabric(topo, nccl=NcclSettings(algo="tree")).cost(Call("broadcast", GIB, tuple(list(range(8)))))
    with pytest.raises(MeshscaleError, match="unknown NCCL protocol"):
        Fabric(topo, nccl=NcclSettings(proto="fast")).cost(Call("all_reduce", GIB, tuple(list(range(8)))))


def test_nvls_only_where_switches_multicast():
    for system in ("dgx-a100", "dgx2", "dgx1-v100"):
        with pytest.raises(MeshscaleError, match="cannot run"):
            Fabric(load_system(system), nccl=NcclSettings(algo="nvls")).cost(Call("all_reduce", GIB, tuple([0, 1, 2, 3])))
    h200 = load_system("hgx-h200")
    assert Fabric(h200, nccl=NcclSettings(algo="nvls")).cost(Call("all_reduce", GIB, tuple([0, 1, 2, 3]))).detail.startswith("nccl nvls")
    with pytest.raises(MeshscaleError):  # NCCL sets NVLS up only for 3 GPUs or more
        Fabric(h200, nccl=NcclSettings(algo="nvls")).cost(Call("all_reduce", GIB, tuple([0, 1])))


def test_host_thread_driving_several_gpus_sets_a_floor():
    """One thread issuing the call on G GPUs: a small call's loop grows by one launch per GPU; a large call's
    device time hides the launches (the thread runs ahead and the kernels queue)."""
    topo = load_system("hgx-h200")
    small = [Fabric(topo, nccl=NcclSettings(gpus_per_thread=g)).cost(Call("all_reduce", 1024, tuple([0, 1, 2, 3]))) for g in (1, 2, 3, 4)]
    alone = small[0].time_s
    bound = [r for r in small if "host launch bound" in r.detail]
    assert bound and all(b.time_s > alone for b in bound)
    steps = [b.time_s - a.time_s for a, b in zip(bound, bound[1:])]
    assert steps and all(step == pytest.approx(steps[0]) and step > 0 for step in steps)
    big = Fabric(topo, nccl=NcclSettings(gpus_per_thread=4)).cost(Call("all_reduce", GIB, tuple([0, 1, 2, 3])))
    assert big.time_s == pytest.approx(Fabric(topo).cost(Call("all_reduce", GIB, tuple([0, 1, 2, 3]))).time_s)
    assert "host launch bound" not in big.detail


def test_the_launch_overhead_is_paid_by_ll_and_simple_calls_and_leaves_the_choice(monkeypatch):
    """NCCL's estimate is the kernel's: LL and Simple calls pay the CUDA launch and set-up on top of it at every
    size, LL128's base latency already holds it. Without the overhead the times drop by it, NCCL's choice not."""
    topo = load_system("hgx-h200")
    sizes = (4 << 20, 64 << 20, GIB)

    def times():
        return {(proto, n): nccl.predict(topo, "all_gather", [0, 1], n, nccl_algo="ring", proto=proto)
                for proto in nccl.PROTOCOLS for n in sizes}

    with_overhead = times()
    chosen = {n: nccl.predict(topo, "all_gather", [0, 1], n).proto for n in sizes}
    overhead_us = tables.data_file()["launch_overhead_us"]
    monkeypatch.setitem(tables.data_file(), "launch_overhead_us", 0.0)
    without = times()
    for (proto, n), p in with_overhead.items():
        paid_us = (p.time_s - without[(proto, n)].time_s) * 1e6
        assert paid_us == pytest.approx(0.0 if proto == "LL128" else overhead_us, abs=1e-6), (proto, n)
        assert p.nccl_time_s == without[(proto, n)].nccl_time_s
    assert chosen == {n: nccl.predict(topo, "all_gather", [0, 1], n).proto for n in sizes}


def test_host_launch_is_per_nccl_family():
    """The newest family measured that is not newer than the version; older than any: the oldest measured."""
    per_family_us = tables.data_file()["host_launch_us_per_gpu"]
    measured = sorted(per_family_us, key=tables.version_key)
    for family in measured:
        assert runtime.host_launch_s(family) == pytest.approx(per_family_us[family] * 1e-6)
    assert runtime.host_launch_s("1.6") == runtime.host_launch_s(measured[0])
    assert runtime.host_launch_s("2.20") == runtime.host_launch_s(measured[-2])
    assert runtime.host_launch_s() == runtime.host_launch_s(nccl.DEFAULT_VERSION)


def test_schedule_algorithms_still_work():
    topo = load_system("dgx1-v100")
    ring = Fabric(topo, algo="ring").cost(Call("all_reduce", 64 << 20, tuple(list(range(8)))))
    assert ring.model == "flow" and ring.chosen.startswith("ring")


@pytest.mark.parametrize("system, version", [("dgx-a100", "2.18.5"), ("hgx-h200", "2.28.9")])
def test_a_smaller_call_never_runs_on_more_channels(system, version):
    """enqueue.cc sheds a channel while nBytes < nChannels x nThreads x threshold: the channels a call runs on never
    grow as the size falls, stay between 1 and the communicator's, and are all of them from nChannels x nThreads x
    threshold up (8 A100: 24 x 512 x 64 B = 768 KiB for Ring/Simple). A lower threshold (a counterfactual) keeps
    every channel down to a smaller size."""
    topo = load_system(system)
    s = nccl.analyse(topo, list(range(8)), version)
    c = nccl.constants(version)
    sizes = [1 << k for k in range(10, 31)]
    for algo, proto in (("ring", "LL"), ("ring", "LL128"), ("ring", "Simple"), ("tree", "Simple")):
        full = runtime.comm_channels(s, c, algo)
        used = [runtime.channels_used(s, c, algo, proto, n) for n in sizes]
        assert all(1 <= a <= b <= full for a, b in zip(used, used[1:]))
        threshold = c["thread_threshold_bytes"][proto] * (s.n_ranks if (algo, proto) == ("ring", "LL") else 1)
        assert runtime.channels_used(s, c, algo, proto, full * c["max_threads"][proto] * threshold) == full
    half = dict(c, thread_threshold_bytes={p: b / 2 for p, b in c["thread_threshold_bytes"].items()})
    below = 24 * 512 * 64 - 64 * 1024
    assert runtime.channels_used(s, half, "ring", "Simple", below) > runtime.channels_used(s, c, "ring", "Simple", below)
