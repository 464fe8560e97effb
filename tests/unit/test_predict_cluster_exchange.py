"""Across nodes `predict` times the gradient exchange by the same NCCL cost model as `sim`, on the same cluster."""
import pytest

from meshscale.predict.exchange_cost import cluster_topology
from meshscale.predict.scaling import Job, predict_cluster, profile_for
from meshscale.simulate import predict_collective
from meshscale.topology import load_system
from meshscale.topology.cluster import ClusterSpec, system_or_cluster
from meshscale.models.registry import get_model


def _job(algorithm: str) -> Job:
    spec = get_model("resnet50")
    return Job("resnet50", spec.params, profile_for(load_system("dgx1-p100"), None, spec.flops_per_sample), 32,
               algorithm=algorithm)


@pytest.mark.parametrize("algorithm, nccl_algo", [("nccl", None), ("ring", "ring"), ("hierarchical", "tree")])
def test_two_nodes_exchange_each_bucket_as_sim_on_the_cluster(algorithm, nccl_algo):
    job = _job(algorithm)
    exchange = job.exchange(cluster_topology(ClusterSpec("dgx1-p100", 1, 4, "edr"), 2))
    cluster = system_or_cluster("dgx1-p100", 2, "edr", 4)  # built as `sim --nodes 2` builds it
    ranks = [cluster.nodes[d].index for d in cluster.devices()]
    assert len(ranks) == 16
    sizes = job.exchange_sizes()
    assert len(sizes) > 1
    for nbytes in sizes:
        expected = predict_collective(cluster, "all_reduce", ranks, int(nbytes), nccl_algo=nccl_algo).time_s
        assert exchange.allreduce_s(nbytes) == pytest.approx(expected, rel=1e-9)


def test_slower_network_slower_exchange_and_sweep_reuses_the_cluster():
    job = _job("ring")
    edr, gbe = (predict_cluster(job, ClusterSpec("dgx1-p100", 1, nics, link), [1, 2, 8])
                for link, nics in (("edr", 4), ("10gbe", 2)))
    assert [r["world_size"] for r in edr] == [8, 16, 64]
    assert edr[0]["throughput_samples_per_s"] == pytest.approx(gbe[0]["throughput_samples_per_s"])  # one node
    for fast, slow in zip(edr[1:], gbe[1:]):
        assert slow["throughput_samples_per_s"] < fast["throughput_samples_per_s"]
    one, again = (cluster_topology(ClusterSpec("dgx1-p100", 1, 4, "edr"), 8) for _ in range(2))
    assert one is again  # one topology per cluster and node count: NCCL's search on it runs once


def test_hierarchical_on_an_nccl_without_tree_is_a_one_line_error():
    from meshscale.errors import MeshscaleError
    from meshscale.predict.frameworks import FRAMEWORKS

    job = _job("hierarchical")
    job.framework = FRAMEWORKS["cntk-2016"]  # NCCL 1.6: rings only
    with pytest.raises(MeshscaleError, match="use --algo ring"):
        predict_cluster(job, ClusterSpec("dgx1-p100", 1, 4, "edr"), [2])


def test_nccl_picks_a_tree_at_scale_and_it_beats_the_forced_ring():
    """Without NCCL_ALGO NCCL runs Tree (or NVLS-Tree) across many nodes, where a flat ring's 2(n-1) steps cost
    latency that grows with the nodes; the pick is never slower than the forced ring, and the gap grows."""
    spec = ClusterSpec("hgx-h100", 1, 8, "ndr")
    gaps = []
    for nodes in (8, 32):
        fabric = cluster_topology(spec, nodes)
        picked, ring = _job("nccl").exchange(fabric), _job("ring").exchange(fabric)
        nbytes = 25 << 20
        assert picked.allreduce_s(nbytes) <= ring.allreduce_s(nbytes)
        assert not picked.chosen_algorithm.startswith("ring")
        assert ring.chosen_algorithm.startswith("ring")
        gaps.append(ring.allreduce_s(nbytes) / picked.allreduce_s(nbytes))
    assert gaps[1] > gaps[0] > 1
