"""NCCL's model across nodes: each GPU's traffic to other nodes leaves through its own NIC, and NCCL's pick
(Tree, NVLS-Tree) overtakes the flat ring as the nodes grow."""
import pytest

from meshscale.simulate import nccl_model, predict_collective
from meshscale.topology.cluster import system_or_cluster


def _ranks(topo):
    return [topo.nodes[d].index for d in topo.devices()]


@pytest.mark.parametrize("collective", ["all_to_all", "send_recv"])
def test_point_to_point_across_nodes_is_bounded_by_each_gpus_nic(collective):
    """All GPUs of a node share its NICs: an all_to_all over 2 nodes moves half of each GPU's buffer across, at
    most at the node's network / GPUs per node each; a send to the next node uses one NIC."""
    cluster = system_or_cluster("dgx-a100", 2, "hdr", 8)
    ranks = _ranks(cluster)
    s = nccl_model.analyse(cluster, ranks)
    per_gpu_gbps = s.inter_gbps / s.ppn
    p = predict_collective(cluster, collective, ranks, 1 << 30)
    n = len(ranks)
    if collective == "all_to_all":
        algbw_bound = per_gpu_gbps * n / (n - s.ppn)
        assert p.busbw_bytes_per_s / 1e9 <= algbw_bound * (n - 1) / n * 1.0001
    else:
        assert p.busbw_bytes_per_s / 1e9 <= nccl_model.gpu_net_gbps(s) * 1.0001
    assert p.busbw_bytes_per_s / 1e9 < s.inter_gbps / 2  # far from the whole node's network


def test_all_to_all_across_nodes_grows_with_the_nics():
    few, many = (predict_collective(c, "all_to_all", _ranks(c), 1 << 30)
                 for c in (system_or_cluster("dgx-a100", 2, "hdr", k) for k in (2, 8)))
    assert many.busbw_bytes_per_s > 2 * few.busbw_bytes_per_s


def test_the_tree_overtakes_the_ring_as_nodes_grow():
    ratios = []
    for nodes in (2, 8, 32):
        cluster = system_or_cluster("hgx-h100", nodes, "ndr", 8)
        ranks = _ranks(cluster)
        picked = predict_collective(cluster, "all_reduce", ranks, 25 << 20)
        ring = predict_collective(cluster, "all_reduce", ranks, 25 << 20, nccl_algo="ring")
        assert picked.time_s <= ring.time_s * 1.0001
        ratios.append(ring.time_s / picked.time_s)
    assert ratios[0] < ratios[1] < ratios[2]
    assert "ring" not in picked.detail
