"""Across nodes `predict` times the gradient exchange by the same NCCL cost model as `sim`, on the same cluster."""
import pytest

from meshscale.errors import MeshscaleError
from meshscale.predict import PredictRequest, predict_rows
from meshscale.predict.gradient_tensors import resnet50_gradients
from meshscale.predict.training.comm import Allocation, _rounded, collective_cost
from meshscale.predict.training.replicas import GradientExchange
from meshscale.simulate.cost import Call
from meshscale.simulate.fabric import Fabric
from meshscale.simulate.nccl_env import NcclSettings
from meshscale.topology.cluster import system_or_cluster


@pytest.mark.parametrize("nccl_algo", [None, "ring", "tree"])
def test_two_nodes_exchange_each_bucket_as_sim_on_the_cluster(nccl_algo):
    allocation = Allocation.of("dgx1-p100", 8, 2, "edr", 4, nccl_algo=nccl_algo)
    cluster = system_or_cluster("dgx1-p100", 2, "edr", 4)  # built as `sim --nodes 2` builds it
    ranks = [cluster.nodes[d].index for d in cluster.devices()]
    assert len(ranks) == 16
    buckets = GradientExchange("ddp").buckets(resnet50_gradients())
    assert len(buckets) > 1
    for b in buckets:  # priced at the size the cache rounds to (within 1.6%)
        call = Call("all_reduce", _rounded(b.nbytes), tuple(ranks))
        expected = Fabric(cluster, nccl=NcclSettings(algo=nccl_algo)).cost(call).time_s
        assert collective_cost("all_reduce", b.nbytes, list(range(16)), allocation).seconds == pytest.approx(expected, rel=1e-9)


def _sweep(link: str, nics: int, **kw) -> list[dict]:
    rows, _, _ = predict_rows(PredictRequest(model="resnet50", system="dgx1-p100", nodes=(1, 2, 8), link=link,
                                             nics=nics, batch=32, nccl_algo="ring", **kw))
    return rows


def test_slower_network_slower_exchange_and_sweep_reuses_the_cluster():
    from meshscale.topology.cluster import ClusterSpec, cluster_topology

    edr, gbe = _sweep("edr", 4), _sweep("10gbe", 2)
    assert [r["world_size"] for r in edr] == [8, 16, 64]
    assert edr[0]["throughput_samples_per_s"] == pytest.approx(gbe[0]["throughput_samples_per_s"])  # one node
    for fast, slow in zip(edr[1:], gbe[1:]):
        assert slow["throughput_samples_per_s"] < fast["throughput_samples_per_s"]
    one, again = (cluster_topology(ClusterSpec("dgx1-p100", 1, 4, "edr"), 8) for _ in range(2))
    assert one is again  # one topology per cluster and node count: NCCL's search on it runs once


def test_a_tree_on_an_nccl_without_one_is_a_one_line_error():
    with pytest.raises(MeshscaleError) as info:
        predict_rows(PredictRequest(model="resnet50", system="dgx1-p100", nodes=(2,), link="edr", nics=4,
                                    framework="cntk-2016", nccl_algo="tree"))
    assert "\n" not in str(info.value)


def test_nccl_picks_a_tree_at_scale_and_it_beats_the_forced_ring():
    """Without NCCL_ALGO NCCL runs Tree (or NVLS-Tree) across many nodes, where a flat ring's 2(n-1) steps cost
    latency that grows with the nodes; the pick is never slower than the forced ring, and the gap grows."""
    gaps = []
    nbytes = 25 << 20
    for nodes in (8, 32):
        ranks = list(range(8 * nodes))
        picked = collective_cost("all_reduce", nbytes, ranks, Allocation.of("hgx-h100", 8, nodes, "ndr", 8))
        ring = collective_cost("all_reduce", nbytes, ranks, Allocation.of("hgx-h100", 8, nodes, "ndr", 8, nccl_algo="ring"))
        assert picked.seconds <= ring.seconds
        assert not picked.chosen.startswith("ring") and ring.chosen.startswith("ring")
        gaps.append(ring.seconds / picked.seconds)
    assert gaps[1] > gaps[0] > 1


def test_a_dimensions_groups_share_the_nodes_nics():
    """Every group of a layout dimension runs at once: a group of one GPU per node (FSDP under tp 8) drives that
    GPU's own NIC, not all eight; the node's one group of eight drives them all. Without GPUDirect RDMA the
    staging through host memory can only slow it."""
    from meshscale.topology.cluster import NET_LINKS

    nbytes = 64 << 20
    one_nic_s = nbytes / 2 / NET_LINKS["ndr"].bandwidth_bytes_per_s   # each rank receives the other's half
    allocation = Allocation.of("hgx-h100", 8, 2, "ndr", 8)
    alone = collective_cost("all_gather", nbytes, [0, 8], allocation).seconds
    assert alone >= one_nic_s
    whole = collective_cost("all_gather", nbytes * 8, list(range(16)), allocation).seconds
    assert whole < 8 * alone   # eight groups' bytes through eight NICs, not one
    staged = collective_cost("all_gather", nbytes, [0, 8], Allocation.of("hgx-h100", 8, 2, "ndr", 8, gpudirect=False))
    assert staged.seconds >= alone


def test_staged_copies_share_the_pcie_up_link_with_every_gpu_below_it():
    """Without GPUDirect RDMA (the NICs on the CPUs' root ports) every GPU's traffic crosses its PCIe switch's
    up-link to host memory, and every GPU below that switch stages at once: a NIC gets at most up-link / GPUs
    below it."""
    from meshscale.simulate.nccl.network import links_gbps, node_view
    from meshscale.simulate.nccl.search import analyse
    from meshscale.simulate.nccl.tables import constants
    from meshscale.topology import route

    for system, nics in (("hgx-h100", 8), ("dgx1-v100", 4)):
        direct = analyse(system_or_cluster(system, nodes=2, link="ndr", nics=nics), list(range(16)))
        cluster = system_or_cluster(system, nodes=2, link="ndr", nics=nics, gpudirect=False)
        staged = analyse(cluster, list(range(16)))
        assert staged.inter_gbps < direct.inter_gbps
        node = node_view(cluster, 0)
        for path in staged.nics:
            to_host = route(node, path.gpu, next(iter(node.nodes_of("cpu")))).paths[0]
            up = to_host.directed_links[1]       # GPU -> PCIe switch -> (up-link) -> CPU
            below = [g for g in node.devices() if up[0] in {i for i, _ in route(node, g, to_host.nodes[-1]).paths[0].directed_links}]
            rate = links_gbps(node, [up], constants(None))[up]
            assert len(below) >= 2 and path.gbps <= rate / len(below) * (1 + 1e-9)


def test_a_job_spread_over_busy_leaves_gets_one_kth_of_its_network():
    """Spread over the leaves of a k:1 tree (a shared cluster), every node's traffic climbs through up-links
    its busy neighbours share: 1/k of the node's rate; packed on one leaf, nothing climbs."""
    from meshscale.simulate.nccl.search import analyse
    from meshscale.topology.cluster import system_or_cluster

    base = analyse(system_or_cluster("hgx-h100", nodes=2, link="ndr", nics=8), list(range(16))).inter_gbps
    for k in (2.0, 4.0, 8.0):
        spread = analyse(system_or_cluster("hgx-h100", nodes=2, link="ndr", nics=8, oversubscription=k),
                         list(range(16))).inter_gbps
        packed = analyse(system_or_cluster("hgx-h100", nodes=2, link="ndr", nics=8, oversubscription=k,
                                           placement="packed"), list(range(16))).inter_gbps
        assert spread == pytest.approx(base / k) and packed == base


def test_the_two_node_llama_example_is_slower_for_each_network_handicap(cli, tmp_path):
    """The layout model prices its collectives on the fabric the options describe: each handicap slows it."""
    import json

    base = ["--model", "llama3-8b", "--system", "hgx-h100", "--nodes", "2", "--link", "ndr", "--nics", "8",
            "--tp", "8", "--fsdp", "2", "--batch", "1", "--seq-len", "8192", "--precision", "bf16"]

    def tokens(*more) -> float:
        out = tmp_path / "p.json"
        run = cli("predict", *base, *more, "--json", out)
        assert run.exit_code == 0, run.stderr
        return json.loads(out.read_text())["rows"][0]["tokens_per_s_per_gpu"]

    plain = tokens()
    for more in (("--oversubscription", "4"), ("--no-gpudirect",), ("--nccl-env", "NCCL_MAX_NCHANNELS=1")):
        assert tokens(*more) < plain * 0.995, more
    assert tokens("--oversubscription", "4", "--placement", "packed") == plain
    refused = cli("predict", *base, "--placement", "packed")
    assert refused.exit_code == 2 and "not oversubscribed" in refused.stderr
