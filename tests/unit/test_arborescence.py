"""The spanning arborescence against networkx's on random graphs with many ties: the same tree (edges and
their order), a valid arborescence (every node but the root one parent, no cycle, only edges of the graph)."""
import networkx as nx
import numpy as np
import pytest

from meshscale.collectives.arborescence import spanning_arborescence
from meshscale.errors import MeshscaleError


def random_edges(rng, n, root, integer):
    """Edges (u, v, cost) with the root reaching everyone; integer costs in 0..2 make many equal trees."""
    return [(u, v, float(rng.integers(0, 3)) if integer else float(rng.normal()))
            for u in rng.permutation(n).tolist() for v in range(n)
            if u != v and v != root and (u == root or rng.random() < 0.6)]


@pytest.mark.parametrize("integer", [False, True])
def test_same_tree_as_networkx_and_a_valid_arborescence(integer):
    rng = np.random.default_rng(7)
    for _ in range(120):
        n = int(rng.integers(2, 24))
        root = int(rng.integers(n))
        edges = random_edges(rng, n, root, integer)
        parent = spanning_arborescence(edges)
        cost = {(u, v): w for u, v, w in edges}
        assert root not in parent and set(parent) == set(range(n)) - {root}
        assert all((p, c) in cost for c, p in parent.items())
        for v in range(n):  # following parents from any node reaches the root within n steps: no cycle
            for _ in range(n):
                if v == root:
                    break
                v = parent[v]
            assert v == root
        g = nx.DiGraph()
        g.add_weighted_edges_from(edges, weight="w")
        expected = [(c, p) for p, c in nx.minimum_spanning_arborescence(g, attr="w").edges]
        assert list(parent.items()) == expected


def test_unreachable_node_is_an_error():
    with pytest.raises(MeshscaleError):
        spanning_arborescence([(0, 1, 1.0), (2, 1, 0.5)])  # 0 and 2 both without a parent
