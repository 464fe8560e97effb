"""Point-to-point sends as NCCL runs them: each channel's part moves in FIFO-step chunks through two copies, one
across the link and one inside a GPU; the chunks overlap the two, so a part pays the link copy of every chunk
and the local copy of one."""
import pytest

from meshscale.simulate import nccl
from meshscale.simulate.nccl import p2p, runtime
from meshscale.topology import from_dict, load_system

KIB, MIB = 1 << 10, 1 << 20
LINK_GBPS = 38.7 / 2  # Hopper perChMaxTreeBw over the two blocks of a graph channel: a copy across NVLink
LOCAL_GBPS = 38.7  # the whole per-channel ceiling: a copy inside one GPU
LATENCY_US = 8.4 + 3.4  # Ring/Simple base + one NVLink step


def switched(n: int, model: str = "NVIDIA H200", nvlinks: int = 18):
    """n GPUs of ``model`` behind one NVSwitch, ``nvlinks`` links each."""
    nodes = [{"name": "sw", "kind": "nvswitch"}]
    nodes += [{"name": f"g{i}", "kind": "gpu", "index": i, "model": model} for i in range(n)]
    links = [{"a": f"g{i}", "b": "sw", "kind": "nvlink", "generation": 4, "count": nvlinks} for i in range(n)]
    return from_dict({"name": "switched", "nodes": nodes, "links": links})


def _system(topo, n, version="2.28"):
    return nccl.analyse(topo, list(range(n)), version), nccl.constants(version)


def test_drain_is_one_chunk_of_the_local_copy():
    s, c = _system(switched(2), 2)
    chunk_us = 512 * KIB / (1000 * LOCAL_GBPS)  # NCCL_P2P_NVL_CHUNKSIZE, 13.5 us on Hopper
    assert p2p.p2p_drain_us(s, c, 512 * KIB, 1) == pytest.approx(chunk_us)
    # a part of many chunks still drains one chunk: the others overlapped the link copy
    assert p2p.p2p_drain_us(s, c, 16 * MIB, 1) == pytest.approx(chunk_us)
    # a part smaller than a chunk is one chunk of its own size
    assert p2p.p2p_drain_us(s, c, 256 * KIB, 1) == pytest.approx(chunk_us / 2)
    # two sends sharing a block split its warps: their last chunks drain at half the rate each
    assert p2p.p2p_drain_us(s, c, 16 * MIB, 2) == pytest.approx(2 * chunk_us)


def test_four_mib_send_over_sixteen_channels_pays_one_chunk_fill():
    """2 H200 (synthetic switch): a 4 MiB send runs on 16 channels of 256 KiB, one chunk each, so each channel
    copies across NVLink and then inside the receiver back to back."""
    topo = switched(2)
    p = nccl.predict(topo, "send_recv", [0, 1], 4 * MIB)
    assert p.channels == 16
    part = 4 * MIB / 16
    link_only_us = LATENCY_US + part / (1000 * LINK_GBPS)
    assert p.time_s * 1e6 == pytest.approx(link_only_us + part / (1000 * LOCAL_GBPS), rel=1e-6)
    assert p.time_s * 1e6 - link_only_us > 6.0  # the fill: about 6.8 us, a quarter of the call


def test_fill_weighs_less_as_the_parts_grow():
    """The fill is at most one chunk per channel, so its share of the time falls with the size."""
    topo = switched(2)
    s, c = _system(topo, 2)
    shares = []
    for nbytes in (4 * MIB, 16 * MIB, 64 * MIB, 256 * MIB):
        p = nccl.predict(topo, "send_recv", [0, 1], nbytes)
        shares.append(p2p.p2p_drain_us(s, c, nbytes / p.channels, 1) / (p.time_s * 1e6))
    assert shares == sorted(shares, reverse=True)
    assert shares[0] > 0.2 and shares[-1] < 0.02


def test_all_to_all_sends_share_blocks_when_channels_run_out():
    """4 GPUs, 1 GiB all-to-all: each of the 3 sends to a peer runs on 16 channels, 48 parts over the 32 p2p
    channels, so a channel holds 2 of them and drains two chunks; at 64 MiB 3 x 8 parts fit one to a channel."""
    topo = switched(4)
    s, c = _system(topo, 4)
    names = [topo.device(r) for r in range(4)]
    assert p2p.p2p_op_channels(topo, s, c, names, (1 << 30) / 4) == (16, 32)
    assert p2p.p2p_op_channels(topo, s, c, names, (64 * MIB) / 4) == (8, 32)
    big = nccl.predict(topo, "all_to_all", list(range(4)), 1 << 30)
    per_gpu_us = 3 * (1 << 30) / 4 / (1000 * s.ring.link_gbps)  # the links at their capacity
    assert big.time_s * 1e6 == pytest.approx(LATENCY_US + per_gpu_us + 2 * 512 * KIB / (1000 * LOCAL_GBPS), rel=1e-6)


def test_pci_parts_drain_a_pci_chunk():
    """On PCIe NCCL's p2p chunk is 128 KiB (NCCL_P2P_PCI_CHUNKSIZE): a large part drains that much."""
    topo = load_system("pcie-4gpu")
    s, c = _system(topo, 2)
    assert s.ring.path_type != "NVL"
    local = runtime.p2p_local_copy_gbps(s, c)
    assert p2p.p2p_drain_us(s, c, 64 * MIB, 1) == pytest.approx(128 * KIB / (1000 * local))


def test_local_copy_is_twice_a_blocks_link_copy():
    for topo, n in ((switched(2), 2), (load_system("dgx-a100"), 8)):
        s, c = _system(topo, n)
        assert runtime.p2p_local_copy_gbps(s, c) == pytest.approx(2 * runtime.p2p_channel_gbps(s, c))

