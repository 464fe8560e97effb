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


@pytest.mark.parametrize("nbytes, channels", [(16 * MIB, 8), (64 * MIB, 8), (256 * MIB, 16), (GIB, 32)])
def test_send_runs_on_the_channels_nccl_gives_its_size(nbytes, channels):
    """4 H200: 32 p2p channels (2 per NVLink, 18 links, at most the 32 p2p channels); a send starts on 32 / 4 = 8
    and doubles while a channel would carry more than 32 chunks of 512 KiB."""
    prediction = _time_s(load_system("hgx-h200"), "send_recv", 4, nbytes)
    assert prediction.channels == channels
    per_channel_bytes_per_s = 38.7 / 2 * 1e9  # Hopper perChMaxTreeBw over the two blocks of a graph channel
    floor_s = nbytes / min(channels * per_channel_bytes_per_s, 370.8e9)  # 18 NVLinks x 20.6 GB/s
    drain_s = 512 * 1024 / 38.7e9  # the last 512 KiB chunk's copy inside the receiver (test_nccl_p2p_pipeline)
    assert floor_s + drain_s < prediction.time_s < floor_s + drain_s + 20e-6


def test_older_nccl_caps_a_sends_channels():
    """Before 2.22 a send ran on at most the channels that keep nRanks x them within 4 x the p2p channels."""
    topo = load_system("dgx-a100")
    names = [topo.device(r) for r in range(8)]
    for version, channels in (("2.18.5", 16), ("2.28.9", 32)):
        s = nccl.analyse(topo, list(range(8)), version)
        c = nccl.constants(version)
        assert p2p.p2p_op_channels(topo, s, c, names, GIB) == (channels, 32)


def test_tree_on_an_nvlink_mesh_keeps_nccls_bandwidth():
    """DGX-1V: a middle GPU of the chain sends up and down over different NVLinks, no port is shared."""
    topo = load_system("dgx1-v100")
    prediction = nccl.predict(topo, "all_reduce", list(range(8)), GIB, nccl_algo="tree", proto="Simple")
    assert nccl.analyse(topo, list(range(8))).gpu_mesh
    overhead_s = runtime.launch_overhead_us("Simple") * 1e-6  # the launch, on top of NCCL's estimate
    assert prediction.time_s == pytest.approx(prediction.nccl_time_s + overhead_s, rel=1e-9)


@pytest.mark.parametrize("proto, link_gbps", [("Simple", 370.8), ("LL128", min(370.8 * 0.92, 24 * 36.7 / 2))])
def test_ring_loop_runs_its_steps_in_lock_step(proto, link_gbps):
    """H200 all-gather at 1 GiB: a loop of n chunks is n-1 steps over the link (its capacity, 18 NVLinks x 20.6 GB/s,
    with LL128's factor and per-block ceiling) and a copy out of the receive buffer inside the GPU (24 blocks
    at perChMaxTreeBw), one after the other. The copy weighs 1 step in 2 on 2 GPUs, 1 in 4 on 4: busbw climbs
    with the ranks (measured with Simple: 271 and 327 GB/s out of place)."""
    topo = load_system("hgx-h200")
    local_gbps = 24 * 38.7
    busbw = {}
    for n in (2, 4):
        run = _time_s(topo, "all_gather", n, GIB, nccl_algo="ring", proto=proto)
        busbw[n] = GIB * (n - 1) / n / run.time_s / 1e9
        expected = (n - 1) / ((n - 1) / link_gbps + 1 / local_gbps)
        assert busbw[n] == pytest.approx(expected, rel=0.01), n
    assert busbw[2] < busbw[4] < link_gbps
    # a broadcast makes one step per chunk on each GPU, the busiest over the link: the links set its pace
    # (measured 366-371 GB/s at 1 GiB, above the search's 12 channels x 30 GB/s)
    bcast = _time_s(topo, "broadcast", 2, GIB, nccl_algo="ring", proto="Simple")
    assert GIB / bcast.time_s / 1e9 == pytest.approx(370.8, rel=0.01)


def test_nvls_chunk_shrinks_with_size_as_nccl_picks_it():
    """calcCollChunking on 8 GPUs (8 heads) x 16 NVLS channels: 128 KiB from 1 GiB, 64 KiB below, 32 KiB below
    64 MiB, 16 KiB below 8 MiB."""
    topo = load_system("hgx-h100")
    s = nccl.analyse(topo, list(range(8)), "2.18.5")
    c = nccl.constants("2.18.5")
    chunk = {size: runtime.nvls_loop_bytes(s, c, size, 16) // (16 * 8)
             for size in (1 << 20, 4 << 20, 8 << 20, 32 << 20, 64 << 20, 512 << 20, GIB, 8 * GIB)}
    assert chunk == {1 << 20: 16384, 4 << 20: 16384, 8 << 20: 32768, 32 << 20: 32768, 64 << 20: 65536,
                     512 << 20: 65536, GIB: 131072, 8 * GIB: 131072}


def test_nvls_pipeline_fill_is_two_loops_of_its_three_stages():
    """The NVLS all-reduce's three warp groups pipeline its loops: the first loop's bytes cross two stages
    before the pipeline runs full. At 4 MiB (two loops of 2 MiB) that is twice the bytes' own time; at 8 GiB
    (a 16 MiB loop) half a percent. NCCL's choice does not see it."""
    topo = load_system("hgx-h100")
    s = nccl.analyse(topo, list(range(8)), "2.18.5")
    c = nccl.constants("2.18.5")
    bw = runtime.nvls_traffic_gbps(s, c, "nvls")
    fixed_us = runtime.launch_overhead_us("Simple") + tuning.latency_us(s, c, "all_reduce", "nvls", "Simple")
    for size, loop in ((4 << 20, 2 << 20), (8 * GIB, 16 << 20)):
        p = nccl.predict(topo, "all_reduce", list(range(8)), size, nccl_version="2.18.5")
        assert p.algo == "nvls"
        assert p.time_s * 1e6 == pytest.approx(fixed_us + (size + 2 * loop) / (1000 * bw), rel=1e-9)
        assert p.nccl_time_s < p.time_s
