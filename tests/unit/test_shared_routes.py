"""Routes shared between node copies of a cluster: each copied route is the one its own max-flow finds."""
import pytest

from meshscale.topology import load_system, route
from meshscale.topology.cluster import system_or_cluster
from meshscale.topology.shared_routes import share_routes


def _cached_routes(topo):
    return {k: v for k, v in topo.route_cache.items() if isinstance(k, tuple) and len(k) == 2
            and isinstance(k[0], str)}


@pytest.mark.parametrize("system, nodes, shape", [
    ("dgx1-p100", 3, {}),                        # one leaf: every node copy swaps onto every other
    ("pcie-4gpu", 4, {"nodes_per_leaf": 2}),     # two leaves: copies swap only within a leaf
    ("dgx1-p100", 3, {"gpudirect": False}),      # NICs behind the CPUs
    ("dgx2", 2, {}),                             # equal flows over other NICs: which node comes first decides
])
@pytest.mark.slow  # a max-flow per route of a DGX-2
def test_every_copied_route_is_the_one_its_own_max_flow_finds(system, nodes, shape, monkeypatch):
    shared = system_or_cluster(system, nodes, **shape)
    ranks = [shared.nodes[d].index for d in shared.devices()]
    flows = []
    import meshscale.topology.queries as queries
    real = queries.nx.maximum_flow
    monkeypatch.setattr(queries.nx, "maximum_flow", lambda *a, **k: flows.append(1) or real(*a, **k))
    share_routes(shared, ranks)
    copied = _cached_routes(shared)
    n = len(ranks)
    assert len(copied) == n * (n - 1)
    assert len(flows) < len(copied)  # the point: fewer max-flows than pairs (one per kind of pair)
    own = system_or_cluster(system, nodes, **shape)
    for (a, b), r in sorted(copied.items())[::3]:  # every third pair: the oracle runs a max-flow each
        assert route(own, a, b) == r, (a, b)


def test_a_single_system_is_left_to_its_own_routes():
    topo = load_system("dgx1-p100")
    share_routes(topo, list(range(8)))
    assert not _cached_routes(topo)
