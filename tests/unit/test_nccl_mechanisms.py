"""Collectives by mechanism: what one channel's block moves, the SHM transport through host memory, NVLS-Tree and
PAT where NCCL's tuning picks them. Each test states a property the mechanism must have, not a figure."""
import pytest

from meshscale.simulate import nccl
from meshscale.simulate.cost import Call
from meshscale.simulate.fabric import Fabric
from meshscale.simulate.nccl.network import PCIE_TLP_OVERHEAD_BYTES, PCIE_TLP_PAYLOAD_BYTES
from meshscale.simulate.nccl.runtime import block_link_gbps
from meshscale.simulate.nccl.tables import constants
from meshscale.simulate.nccl.tuning import nvls_net_graph
from meshscale.simulate.nccl_env import NcclSettings, parse_nccl_env
from meshscale.topology import Node, Topology, load_system
from meshscale.topology.cluster import system_or_cluster

GIB = 1 << 30
NO_NVLS = ["NCCL_NVLS_ENABLE=0"]


@pytest.fixture(scope="module")
def h200():
    return load_system("hgx-h200")


def _time(topo, ranks, settings, collective="all_reduce", nbytes=GIB):
    call = Call(collective, nbytes, tuple(ranks))
    return Fabric(topo, nccl=NcclSettings(env=parse_nccl_env(settings))).cost(call).time_s


def _with_host_memory(topo: Topology, gbps: float) -> Topology:
    """``topo`` whose CPUs' memory moves ``gbps``."""
    nodes = {k: Node(n.name, n.kind, dict(n.attrs, memory_bandwidth_bytes_per_s=gbps * 1e9) if n.kind == "cpu"
                     else dict(n.attrs)) for k, n in topo.nodes.items()}
    return Topology(f"{topo.name}-mem{gbps:g}", nodes, list(topo.links), topo.title, dict(topo.attrs))


@pytest.mark.parametrize("gpus, collective", [(2, "all_reduce"), (4, "all_gather"), (2, "broadcast")])
def test_time_falls_with_the_channels_until_the_links_set_the_pace(h200, gpus, collective):
    """Under NCCL_MAX_NCHANNELS=c the call's blocks set the pace while c blocks move less than the links carry:
    the time falls with c, never rises, and from the graph's channel count on it is the default's."""
    ranks = list(range(gpus))
    times = [_time(h200, ranks, [f"NCCL_MAX_NCHANNELS={c}", *NO_NVLS], collective) for c in (1, 2, 4, 8, 16, 24, 32)]
    assert all(b <= a * (1 + 1e-9) for a, b in zip(times, times[1:]))
    assert times[0] > 1.5 * times[1] and times[1] > 1.5 * times[2]  # far below the links: about 1/c
    assert times[-1] == pytest.approx(_time(h200, ranks, NO_NVLS, collective), rel=1e-9)


def test_one_block_moves_what_the_search_gives_a_channel_whatever_the_gpus(h200):
    """A single block's broadcast is the block's own rate: the top of the search's speed ladder for the GPU's
    generation over the two blocks of a graph channel, the same on 2 and 4 GPUs."""
    c = constants()
    per_block = c["speed_ladder_intra"]["sm90"][0] / 2
    for gpus in (2, 4):
        s = nccl.analyse(h200, list(range(gpus)), env=parse_nccl_env(["NCCL_MAX_NCHANNELS=1"]))
        assert block_link_gbps(s, c) == pytest.approx(per_block)
        t = _time(h200, list(range(gpus)), ["NCCL_MAX_NCHANNELS=1", *NO_NVLS], "broadcast")
        assert GIB / t / 1e9 == pytest.approx(per_block, rel=0.02)  # within the latency of one call


def test_shm_path_is_bound_by_host_memory_where_it_is_the_slowest(h200):
    """Every byte of the SHM transport is written to and read from the host's memory: where that memory is slower
    than the PCIe links the time follows it (twice the bytes over it), and where it is faster it does not count."""
    ranks, off = [0, 1], ["NCCL_P2P_DISABLE=1"]
    slow, slower = _with_host_memory(h200, 40.0), _with_host_memory(h200, 20.0)
    fast, faster = _with_host_memory(h200, 4000.0), _with_host_memory(h200, 8000.0)
    assert _time(slower, ranks, off) == pytest.approx(2 * _time(slow, ranks, off), rel=0.05)
    assert _time(fast, ranks, off) == pytest.approx(_time(faster, ranks, off), rel=1e-9)
    assert _time(slow, ranks, off) > 1.5 * _time(fast, ranks, off)
    # two hops (one each way) put 4 bytes through the host's memory per byte each hop carries: 40 / 4 = 10 GB/s
    assert GIB / _time(slow, ranks, off, "all_gather") / 1e9 / 2 == pytest.approx(40.0 / 4, rel=0.05)


def test_shm_moves_at_the_pcie_links_payload_rate_and_a_chain_skips_the_closing_hop(h200):
    """Over SHM the two GPUs behind one PCIe switch share its up-link: a ring's two hops each get half of it, a
    broadcast's chain (no hop back into the root) all of it; the rate is the link's after the TLP overhead of
    an SM's 128 B transactions, above NCCL's own rating of the link."""
    off = ["NCCL_P2P_DISABLE=1"]
    uplink_gbps = max(l.bandwidth_bytes_per_s for l in h200.links if l.kind == "pcie") / 1e9
    payload_gbps = uplink_gbps * PCIE_TLP_PAYLOAD_BYTES / (PCIE_TLP_PAYLOAD_BYTES + PCIE_TLP_OVERHEAD_BYTES)
    ring = GIB / _time(h200, [0, 1], off, "all_gather") / 1e9 / 2  # busbw of 2 GPUs: algbw / 2
    chain = GIB / _time(h200, [0, 1], off, "broadcast") / 1e9
    assert chain == pytest.approx(2 * ring, rel=0.05)
    assert chain == pytest.approx(payload_gbps, rel=0.03)
    assert chain > 16 * constants()["pci_rate_per_lane"][5] / 80  # NCCL's rating of PCIe Gen5 x16 (48 GB/s)


def test_nvls_tree_beyond_two_nodes_and_its_graph_within_the_links():
    """On NVLink SHARP nodes beyond two, NCCL's tuning picks NVLS-Tree for large all-reduces: its NVLS graph has a
    head GPU and a NIC per channel, each GPU's NVLinks carry (channels + 1) x bwIntra and bwInter stays within
    the NIC and below twice bwIntra."""
    for nodes, nics in ((4, 8),):
        cluster = system_or_cluster("hgx-h100", nodes, "ndr", nics)
        ranks = list(range(len(cluster.devices())))
        assert nccl.predict(cluster, "all_reduce", ranks, 256 << 20).algo == "nvls_tree"
        s = nccl.analyse(cluster, ranks)
        nch, bw_intra, bw_inter = nvls_net_graph(s, constants())
        assert nch == min(len(s.nics), int(s.ppn))
        assert (nch + 1) * bw_intra <= s.ring.link_gbps
        assert bw_intra <= bw_inter < 2 * bw_intra and bw_inter <= min(p.gbps for p in s.nics)
    # without NVLS the same call runs a ring or a tree
    off = nccl.predict(cluster, "all_reduce", ranks, 256 << 20, env=parse_nccl_env(NO_NVLS))
    assert off.algo in ("ring", "tree")


def test_pat_only_with_simple_at_one_gpu_per_node_and_cheaper_than_a_ring_at_scale():
    """PAT (all-gather, reduce-scatter) runs with one GPU per node and only the Simple protocol; its log-depth
    latency makes small calls cheaper than the ring's linear one as nodes grow."""
    nodes = 32
    cluster = system_or_cluster("hgx-h100", nodes, "ndr", 8)
    ranks = [8 * i for i in range(nodes)]
    p = nccl.predict(cluster, "all_gather", ranks, 1 << 20)
    assert (p.algo, p.proto) == ("pat", "Simple")
    assert all(e.proto == "Simple" for e in p.candidates if e.algo == "pat")
    ring = nccl.predict(cluster, "all_gather", ranks, 1 << 20, env=parse_nccl_env(["NCCL_ALGO=Ring"]))
    assert p.time_s < ring.time_s / 2
    full = nccl.predict(cluster, "all_gather", list(range(16)), 1 << 20)  # 8 GPUs per node: no PAT
    assert all(e.algo != "pat" for e in full.candidates)
