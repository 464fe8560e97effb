"""NCCL's model across nodes: each GPU's traffic to other nodes leaves through its own NIC, and NCCL's pick
(Tree, NVLS-Tree) overtakes the flat ring as the nodes grow."""
import pytest

from meshscale.simulate import nccl
from meshscale.simulate.nccl import p2p
from meshscale.simulate.cost import Call
from meshscale.simulate.fabric import Fabric
from meshscale.simulate.nccl_env import NcclSettings
from meshscale.topology.cluster import system_or_cluster


def _ranks(topo):
    return [topo.nodes[d].index for d in topo.devices()]


@pytest.mark.parametrize("collective", ["all_to_all", "send_recv"])
def test_point_to_point_across_nodes_is_bounded_by_each_gpus_nic(collective):
    """All GPUs of a node share its NICs: an all_to_all over 2 nodes moves half of each GPU's buffer across, at
    most at the node's network / GPUs per node each; a send to the next node uses one NIC."""
    cluster = system_or_cluster("dgx-a100", 2, "hdr", 8)
    ranks = _ranks(cluster)
    s = nccl.analyse(cluster, ranks)
    per_gpu_gbps = s.inter_gbps / s.ppn
    p = Fabric(cluster).cost(Call(collective, 1 << 30, tuple(ranks)))
    n = len(ranks)
    if collective == "all_to_all":
        algbw_bound = per_gpu_gbps * n / (n - s.ppn)
        assert p.busbw_bytes_per_s / 1e9 <= algbw_bound * (n - 1) / n * 1.0001
    else:
        assert p.busbw_bytes_per_s / 1e9 <= p2p.gpu_net_gbps(s) * 1.0001
    assert p.busbw_bytes_per_s / 1e9 < s.inter_gbps / 2  # far from the whole node's network


def test_all_to_all_across_nodes_grows_with_the_nics():
    few, many = (Fabric(c).cost(Call("all_to_all", 1 << 30, tuple(_ranks(c))))
                 for c in (system_or_cluster("dgx-a100", 2, "hdr", k) for k in (2, 8)))
    assert many.busbw_bytes_per_s > 2 * few.busbw_bytes_per_s


def test_the_tree_overtakes_the_ring_as_nodes_grow():
    ratios = []
    for nodes in (2, 8, 32):
        cluster = system_or_cluster("hgx-h100", nodes, "ndr", 8)
        ranks = _ranks(cluster)
        picked = Fabric(cluster).cost(Call("all_reduce", 25 << 20, tuple(ranks)))
        ring = Fabric(cluster, nccl=NcclSettings(algo="ring")).cost(Call("all_reduce", 25 << 20, tuple(ranks)))
        assert picked.time_s <= ring.time_s * 1.0001
        ratios.append(ring.time_s / picked.time_s)
    assert ratios[0] < ratios[1] < ratios[2]
    assert "ring" not in picked.detail


def test_hosts_joined_on_an_assumed_ethernet_get_its_latency_not_infinibands():
    """Hosts joined under torchrun carry their network in the topology (ports, one switch): an assumed 10 GbE port
    is priced with Ethernet's latency, not EDR InfiniBand's (the reference of NCCL's constants)."""
    from meshscale.topology import load_system
    from meshscale.topology.multinode import HostReport, join_hosts
    from meshscale.topology.nics import Port

    node = load_system("hgx-h100")
    assumed = join_hosts([HostReport("a", node), HostReport("b", node)])
    ib = join_hosts([HostReport(h, node, [Port("mlx5_0/1", "infiniband", "ACTIVE", 400.0)]) for h in ("a", "b")])
    eth, rdma = (nccl.analyse(t, _ranks(t)) for t in (assumed, ib))
    assert eth.net_extra_us > rdma.net_extra_us >= 0
    assert eth.net_extra_us * 1e-6 + nccl.REFERENCE_NET_LATENCY_S > 3e-6  # Ethernet's NIC-to-NIC microseconds
