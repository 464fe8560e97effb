"""Minimum spanning arborescence against networkx's on random graphs: the same total cost, and a valid
arborescence (every node but the root one parent, no cycle, only edges that exist)."""
import networkx as nx
import numpy as np
import pytest

from meshscale.collectives.arborescence import min_arborescence
from meshscale.errors import MeshscaleError


def random_graph(rng, n, root, integer):
    """Cost matrix (inf: no edge) and the same graph for networkx; the root reaches everyone directly."""
    cost = np.full((n, n), np.inf)
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    for u in range(n):
        for v in range(n):
            if u != v and v != root and (u == root or rng.random() < 0.5):
                w = float(rng.integers(0, 4)) if integer else float(rng.normal())  # integers: many ties
                cost[u, v] = w
                g.add_edge(u, v, w=w)
    return cost, g


@pytest.mark.parametrize("integer", [False, True])
def test_equal_cost_to_networkx_and_a_valid_arborescence(integer):
    rng = np.random.default_rng(7)
    for _ in range(150):
        n = int(rng.integers(2, 14))
        root = int(rng.integers(n))
        cost, g = random_graph(rng, n, root, integer)
        parent = min_arborescence(cost, root)
        assert parent[root] == -1
        assert all(0 <= parent[v] < n and np.isfinite(cost[parent[v], v]) for v in range(n) if v != root)
        for v in range(n):  # following parents from any node reaches the root within n steps: no cycle
            seen = 0
            while v != root:
                v, seen = parent[v], seen + 1
                assert seen <= n
        expected = sum(d["w"] for _, _, d in nx.minimum_spanning_arborescence(g, attr="w").edges(data=True))
        assert sum(cost[parent[v], v] for v in range(n) if v != root) == pytest.approx(expected, abs=1e-9)


def test_unreachable_node_is_an_error():
    cost = np.full((3, 3), np.inf)
    cost[0, 1] = 1.0  # node 2 has no incoming edge
    with pytest.raises(MeshscaleError):
        min_arborescence(cost, 0)
