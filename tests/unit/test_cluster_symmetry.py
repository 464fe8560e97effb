"""A cluster of identical nodes is priced from one node's graph and the network's shape: the work does not grow
with its nodes, and the answer is the one the whole graph gives."""
import random

import pytest

from meshscale.simulate.cost import Call
from meshscale.simulate.fabric import Fabric, resolve_fabric
from meshscale.topology import cluster
from meshscale.topology.model import Topology


def _parts_built(monkeypatch) -> list[int]:
    """The node parts a test builds (each node k of a cluster, nodes and links counted apart)."""
    built: list[int] = []
    for name in ("_part_nodes", "_part_links"):
        original = getattr(cluster, name)
        monkeypatch.setattr(cluster, name, lambda plan, points, k, f=original: built.append(k) or f(plan, points, k))
    return built


def test_pricing_every_gpu_of_a_cluster_builds_one_node_whatever_its_size(monkeypatch):
    built = _parts_built(monkeypatch)
    counts = []
    for nodes in (16, 2048):
        built.clear()
        fabric = resolve_fabric("hgx-h100", {"nodes": nodes})
        ranks = tuple(range(fabric.world_size))
        found = [fabric.cost(Call(c, 1 << 26, ranks)) for c in ("all_reduce", "all_gather")]
        found.append(fabric.cost(Call("send_recv", 1 << 20, (0, 8))))   # node 0 to node 1
        assert all(p.time_s > 0 for p in found) and "_whole" not in vars(fabric.topology)
        counts.append(sorted(set(built)))
    assert counts[0] == counts[1] == [0, 1]


@pytest.mark.parametrize("shape", [
    {"node": "hgx-h100", "nodes": 12, "nics": 8, "link": "ndr", "nodes_per_leaf": 2, "oversubscription": 2},
    {"node": "hgx-h100", "nodes": 9, "nics": 8, "link": "ndr", "nodes_per_leaf": 2, "oversubscription": 4,
     "placement": "packed"},
    {"node": "hgx-h100", "nodes": 70, "nics": 8, "link": "ndr", "network": "rail"},
    {"node": "dgx1-p100", "nodes": 6, "nics": 4, "link": "edr", "gpudirect": False},
])
def test_a_cluster_built_from_one_node_prices_as_its_whole_graph(shape):
    """The oracle: the same cluster as a plain topology of every node and switch, which NCCL's model reads by
    scanning it; random groups (the same local GPUs on random nodes) and collectives agree to the last bit."""
    plan = cluster.plan_cluster(cluster.ClusterSpec(**shape))
    lazy = cluster.build_cluster(plan)
    nodes, links = cluster._whole_cluster(plan, lambda k: cluster._node_part(plan, cluster._attach_points(
        plan.node_topology, plan), k))
    whole = Topology(lazy.name, nodes, links, lazy.title, cluster=plan.cluster)
    assert isinstance(lazy, cluster.ClusterTopology) and not isinstance(whole, cluster.ClusterTopology)
    rng = random.Random(len(nodes))
    per = len(plan.node_topology.devices())
    for _ in range(4):
        local = sorted(rng.sample(range(per), rng.choice([1, 2, per])))
        chosen = sorted(rng.sample(range(plan.spec.nodes), rng.randint(2, min(6, plan.spec.nodes))))
        ranks = tuple(k * per + i for k in chosen for i in local)
        for collective in ("all_reduce", "reduce_scatter", "send_recv"):
            call = Call(collective, rng.choice([1 << 12, 1 << 24, 1 << 30]), ranks if collective != "send_recv"
                        else ranks[:1] + ranks[-1:])
            a, b = Fabric(lazy).cost(call), Fabric(whole).cost(call)
            assert (a.time_s, a.chosen, a.channels) == (b.time_s, b.chosen, b.channels), (collective, ranks)
    assert "_whole" not in vars(lazy)


def test_a_group_of_a_layout_is_shaped_in_closed_form_as_its_ranks_listed():
    from meshscale.predict.training.comm import group_shape

    rng = random.Random(7)
    for _ in range(2000):
        per, start, step, n = rng.choice([1, 2, 4, 6, 8, 72]), rng.randrange(200), rng.randrange(1, 40), \
            rng.randrange(1, 60)
        ranks = range(start, start + step * n, step)
        assert group_shape(ranks, per) == group_shape(list(ranks), per)


def test_the_ring_search_answers_renamed_gpus_with_its_rings_renamed():
    """Searched once per shape: the same search over other names (a node alone, node k of a cluster) gives the
    rings the depth-first search itself gives them."""
    from meshscale.simulate.nccl import search
    from meshscale.simulate.nccl.tables import PATH_TYPES

    rng = random.Random(3)
    for trial in range(30):
        n = rng.randint(2, 5)
        resources = [("r", i) for i in range(2 * n)]
        capacity = {r: rng.choice([10.0, 24.0, 40.0, 60.0]) for r in resources}
        uses = {(a, b): [(r, rng.choice([1.0, 1.2])) for r in rng.sample(resources, 2)]
                for a in range(n) for b in range(n) if a != b and rng.random() < 0.9}
        kinds = {pair: rng.choice(PATH_TYPES[:4]) for pair in uses}
        for prefix in ("gpu", f"n{trial}/gpu"):
            names = [f"{prefix}{i}" for i in range(n)]
            paths = {(names[a], names[b]): search._PairPath(kinds[(a, b)], u) for (a, b), u in uses.items()}
            for speed, closed in ((10.0, True), (12.0, False)):
                assert search._searched_rings(names, paths, capacity, speed, 6, closed) == \
                    search._dfs_rings(names, paths, capacity, speed, 6, closed)
