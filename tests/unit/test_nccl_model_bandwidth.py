"""What a run of NCCL moves beyond NCCL's own estimate: a tree inside one node is a chain, point-to-point sends
run on as many channels as NCCL gives them for their size."""
import pytest

from meshscale.simulate import nccl
from meshscale.simulate.nccl import p2p, runtime, tuning
from meshscale.topology import load_system

GIB = 1 << 30
MIB = 1 << 20


def _time_s(topo, collective, n, nbytes, **kw):
    return nccl.predict(topo, collective, list(range(n)), nbytes, nccl_version="2.28.9", nvls=False, **kw)


def test_tree_in_one_node_moves_what_its_chain_moves():
    topo = load_system("hgx-h200")
    # a chain of two sends the data once each way, like a ring of two: the same protocol, about the same time
    tree_ll = _time_s(topo, "all_reduce", 2, GIB, nccl_algo="tree", proto="LL")
    ring_ll = _time_s(topo, "all_reduce", 2, GIB, nccl_algo="ring", proto="LL")
    assert tree_ll.time_s == pytest.approx(ring_ll.time_s, rel=0.05)
    # on four, the GPUs in the middle of the chain send it up and down: twice the time of a chain of two
    two = _time_s(topo, "all_reduce", 2, GIB, nccl_algo="tree", proto="Simple")
    four = _time_s(topo, "all_reduce", 4, GIB, nccl_algo="tree", proto="Simple")
    assert four.time_s == pytest.approx(2 * two.time_s, rel=0.05)
    # NCCL's estimate (its choice) is left as NCCL computes it: LL over a tree divided by 3.8
    assert tree_ll.nccl_time_s > 1.5 * tree_ll.time_s


def test_a_send_runs_on_more_channels_as_it_grows():
    """4 H200: a send starts on the p2p channels split among the peers and doubles its channels while a channel
    would carry more than 32 chunks: the channels never shrink as the size grows, stay within the p2p channels,
    and the time never falls below the bytes over the channels' ceilings."""
    topo = load_system("hgx-h200")
    s = nccl.analyse(topo, list(range(4)), "2.28.9")
    c = nccl.constants("2.28.9")
    previous = 0
    for nbytes in (16 * MIB, 64 * MIB, 256 * MIB, GIB):
        prediction = _time_s(topo, "send_recv", 4, nbytes)
        assert previous <= prediction.channels <= 32
        previous = prediction.channels
        ceiling_gbps = min(prediction.channels * runtime.p2p_channel_gbps(s, c), s.ring.link_gbps)
        assert prediction.time_s > nbytes / (ceiling_gbps * 1e9)
    assert previous > _time_s(topo, "send_recv", 4, 16 * MIB).channels


def test_older_nccl_caps_a_sends_channels():
    """Before 2.22 a send ran on at most the channels that keep nRanks x them within 4 x the p2p channels."""
    topo = load_system("dgx-a100")
    names = [topo.device(r) for r in range(8)]
    sends = {}
    for version in ("2.18.5", "2.28.9"):
        s = nccl.analyse(topo, list(range(8)), version)
        sends[version], p2p_channels = p2p.p2p_op_channels(topo, s, nccl.constants(version), names, GIB)
        assert sends[version] <= p2p_channels
    assert sends["2.18.5"] * 8 <= 4 * p2p_channels < sends["2.28.9"] * 8


def test_tree_on_an_nvlink_mesh_keeps_nccls_bandwidth():
    """DGX-1V: a middle GPU of the chain sends up and down over different NVLinks, no port is shared: a large
    call runs at NCCL's tree bandwidth (the launch aside), not at a chain's shared port."""
    topo = load_system("dgx1-v100")
    assert nccl.analyse(topo, list(range(8))).gpu_mesh
    p = nccl.predict(topo, "all_reduce", list(range(8)), 8 * GIB, nccl_algo="tree", proto="Simple")
    assert p.time_s == pytest.approx(p.nccl_time_s, rel=0.01)
    assert p.time_s > p.nccl_time_s


@pytest.mark.parametrize("proto", ["Simple", "LL128"])
def test_ring_loop_runs_its_steps_in_lock_step(proto):
    """H200 all-gather at 1 GiB: a loop of n chunks is n-1 steps over the link and a copy out of the receive
    buffer inside the GPU, one after the other. The copy weighs 1 step in 2 on 2 GPUs, 1 in 4 on 4: busbw climbs
    with the ranks, under the links' capacity (measured with Simple: 271 and 327 GB/s out of place)."""
    topo = load_system("hgx-h200")
    link_gbps = nccl.analyse(topo, [0, 1]).ring.link_gbps
    busbw = {}
    for n in (2, 4, 8):
        run = _time_s(topo, "all_gather", n, GIB, nccl_algo="ring", proto=proto)
        busbw[n] = GIB * (n - 1) / n / run.time_s / 1e9
    assert busbw[2] < busbw[4] < busbw[8] < link_gbps
    # a broadcast makes one step per chunk on each GPU, the busiest over the link: the links set its pace
    # (measured 366-371 GB/s at 1 GiB, above the search's 12 channels x 30 GB/s)
    bcast = _time_s(topo, "broadcast", 2, GIB, nccl_algo="ring", proto="Simple")
    assert nccl.analyse(topo, [0, 1]).ring.total_gbps < GIB / bcast.time_s / 1e9 <= link_gbps


def test_nvls_chunk_shrinks_with_size_as_nccl_picks_it():
    """calcCollChunking: the NVLS chunk is at most 128 KiB and shrinks (to 16 KiB at the least) for smaller
    calls: it never shrinks as the size grows."""
    topo = load_system("hgx-h100")
    s = nccl.analyse(topo, list(range(8)), "2.18.5")
    c = nccl.constants("2.18.5")
    sizes = [1 << k for k in range(20, 34)]
    chunk = [runtime.nvls_loop_bytes(s, c, size, 16) // (16 * 8) for size in sizes]
    assert chunk == sorted(chunk) and chunk[0] == 16384 and chunk[-1] == 131072


def test_nvls_pipeline_fill_weighs_less_as_the_size_grows():
    """The NVLS all-reduce's three warp groups pipeline its loops: the first loop's bytes cross two stages
    before the pipeline runs full, a cost that weighs less as the loops grow in number. NCCL's choice does not
    see it: its estimate stays below the predicted time."""
    topo = load_system("hgx-h100")
    s = nccl.analyse(topo, list(range(8)), "2.18.5")
    c = nccl.constants("2.18.5")
    steady_gbps = runtime.nvls_traffic_gbps(s, c, "nvls")
    excess = []
    for size in (4 << 20, 64 << 20, GIB, 8 * GIB):
        p = nccl.predict(topo, "all_reduce", list(range(8)), size, nccl_version="2.18.5")
        assert p.algo == "nvls" and p.nccl_time_s < p.time_s
        excess.append(p.time_s / (size / (steady_gbps * 1e9)) - 1)
    assert all(a > b > 0 for a, b in zip(excess, excess[1:]))


def test_ring_ll_chunks_round_up_before_2_20():
    """NCCL 2.18's runRing rounds an LL / LL128 chunk up to a multiple of its minimum chunk and runs every step of
    the ring on whole chunks: within one rounding step the time does not grow with the size, and a call never
    moves fewer bytes than it holds. From 2.20 the host cuts each channel one contiguous part: the time grows
    with every byte."""
    topo = load_system("dgx-a100")
    s = nccl.analyse(topo, list(range(8)), "2.18.5")
    c = nccl.constants("2.18.5")
    for nbytes in (1 << 10, 1 << 20, 4 * MIB, 64 * MIB, GIB):
        for proto in ("LL", "LL128"):
            assert runtime.ring_chunked_bytes(s, c, "all_reduce", proto, nbytes, 24) >= nbytes

    def time_s(version, nbytes):
        return nccl.predict(topo, "all_reduce", list(range(8)), nbytes, nccl_version=version, nccl_algo="ring",
                            proto="LL128").time_s

    # 3.6 and 7 MiB over 192 chunk slots both round up to two 19.2 KB minimum chunks; 7.1 MiB needs three
    assert time_s("2.18.5", int(3.6 * MIB)) == pytest.approx(time_s("2.18.5", 7 * MIB))
    assert time_s("2.18.5", int(7.1 * MIB)) > time_s("2.18.5", 7 * MIB)
    assert time_s("2.28.9", int(3.6 * MIB)) < time_s("2.28.9", 7 * MIB)



def test_older_nccl_credits_ring_ll_less_and_the_run_keeps_the_lines_rate():
    """NCCL 2.18 / 2.20 credit a ring's LL with 1/4 of its bandwidth for all-reduce and 1/3 for all-gather (2.21
    on: 1/2), at most llMaxBw. That is NCCL's choice only: a run moves its 16 B lines at their 8 B of data, so
    crediting LL less (a counterfactual factor) slows NCCL's estimate and leaves the predicted run as it was."""
    topo = load_system("dgx-a100")
    s = nccl.analyse(topo, list(range(8)), "2.18.5")
    old, new = nccl.constants("2.18.5"), nccl.constants("2.28.9")
    assert tuning.ring_ll_factor(s, old, "all_reduce") < tuning.ring_ll_factor(s, old, "all_gather") \
        < tuning.ring_ll_factor(s, new, "all_reduce")
    ll_cap_gbps = tuning.arch_row(old["ll_max_bw"], s)[0]
    for collective in ("all_reduce", "all_gather", "broadcast"):
        bus = tuning.bus_bandwidth(s, old, collective, "ring", "LL") * tuning.ring_steps(collective, 8) / 8
        assert bus <= ll_cap_gbps + 1e-9
    stingy = dict(old, ring_ll_factor={"reducing_or_nodes": 0.1, "other": 0.1})
    for collective in ("all_reduce", "all_gather"):
        assert tuning.bus_bandwidth(s, stingy, collective, "ring", "LL") < \
            tuning.bus_bandwidth(s, old, collective, "ring", "LL")
        assert runtime.predicted_us(s, stingy, collective, "ring", "LL", 64 * MIB, 1.0) == \
            runtime.predicted_us(s, old, collective, "ring", "LL", 64 * MIB, 1.0)


def test_an_ampere_gpu_reads_the_ampere_rows_of_nccls_tables():
    """NCCL indexes its per-channel ceilings by compute capability: an A100 (sm80) takes the Ampere row. Changing
    the Hopper row leaves an A100's predictions as they were; lowering the Ampere Simple ceiling below the links'
    share slows the A100's send, and its ring all-reduce through the copy out of the receive buffer (a block's link
    steps run at the search's per-channel speed, `block_link_gbps`)."""
    topo = load_system("dgx-a100")
    s = nccl.analyse(topo, list(range(8)), "2.18.5")
    c = nccl.constants("2.18.5")
    assert s.arch == "ampere"

    def with_row(arch, gbps):
        rows = {k: list(v) for k, v in c["per_channel_max_tree_bw"].items()}
        rows[arch] = [gbps] * 3
        return dict(c, per_channel_max_tree_bw=rows)

    for collective in ("all_reduce", "send_recv"):
        if collective == "send_recv":
            def time_us(constants):
                return p2p.p2p_us(topo, s, constants, collective, list(range(8)), GIB, 0, 1.0)[0]
        else:
            def time_us(constants):
                return runtime.predicted_us(s, constants, collective, "ring", "Simple", GIB, 1.0)[0]
        assert time_us(with_row("hopper", 1.0)) == time_us(c)
        assert time_us(with_row("ampere", 4.0)) > (1.5 if collective == "send_recv" else 1.1) * time_us(c)
