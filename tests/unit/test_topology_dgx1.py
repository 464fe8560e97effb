import itertools

import networkx as nx
import pytest

from meshscale.topology import (bisection_bandwidth, load_system, pair_bandwidth, relation, route,
                                shared_links, subset)

P100_PAIRS = {tuple(map(int, p.split("-"))) for p in
              "0-1 0-2 0-3 0-4 1-2 1-3 1-5 2-3 2-6 3-7 4-5 4-6 4-7 5-6 5-7 6-7".split()}
CYCLES = ([0, 3, 2, 1, 5, 6, 7, 4], [0, 1, 3, 7, 5, 4, 6, 2])
V100_DOUBLED = {tuple(map(int, p.split("-"))) for p in "0-3 0-4 1-2 1-5 2-3 4-7 5-6 6-7".split()}


@pytest.fixture(scope="module")
def p100():
    return load_system("dgx1-p100")


def test_p100_cube_mesh(p100):
    nv_pairs = {(a, b) for a, b in itertools.combinations(range(8), 2) if relation(p100, a, b).startswith("NV")}
    assert nv_pairs == P100_PAIRS
    assert all(relation(p100, a, b) == "NV1" for a, b in P100_PAIRS)
    assert all(p100.nvlink_count(g) == 4 for g in p100.gpus())


def test_p100_hamiltonian_cycles_are_cycles_of_the_graph(p100):
    edges = {frozenset(p) for p in P100_PAIRS}
    for cycle in CYCLES:
        assert sorted(cycle) == list(range(8))
        assert all(frozenset((a, b)) in edges for a, b in zip(cycle, cycle[1:] + cycle[:1]))


def test_p100_routes_and_relations(p100):
    assert pair_bandwidth(p100, 0, 1) == pytest.approx(20e9)
    r = route(p100, "gpu0", "gpu5")  # no NVLink: PCIe up, across QPI, down
    assert r.fabric == "pcie"
    assert r.paths[0].nodes == ("gpu0", "pcie0", "cpu0", "cpu1", "pcie2", "gpu5")
    assert r.bandwidth_bytes_per_s == pytest.approx(15.754e9, rel=1e-3)
    assert relation(p100, 0, 5) == "SYS"
    assert relation(p100, "gpu0", "ib0") == "PIX"
    assert relation(p100, "gpu0", "ib1") == "PHB"


def test_shared_links_detects_contention(p100):
    # both cross QPI from socket 0 to socket 1
    assert shared_links(p100, (0, 5), (1, 6))
    # opposite directions of one link do not contend
    assert not shared_links(p100, (0, 5), (5, 0))
    assert not shared_links(p100, (0, 1), (2, 3))


def test_subset_keeps_indices_and_drops_other_gpus(p100):
    sub = subset(p100, [0, 1, 2, 3, 7])
    assert [sub.nodes[g].index for g in sub.gpus()] == [0, 1, 2, 3, 7]
    assert sub.device(4 if False else 7) == "gpu7"
    assert relation(sub, 3, 7) == "NV1" and relation(sub, 0, 7) == "SYS"
    with pytest.raises(Exception):
        sub.device(4)


def test_bisection_matches_a_hand_count(p100):
    # worst split: the two sockets; 4 NVLinks (80 GB/s) + QPI (25.6 GB/s) cross it
    assert bisection_bandwidth(p100) == pytest.approx(105.6e9, rel=1e-3)
    g = nx.Graph([(f"gpu{a}", f"gpu{b}") for a, b in P100_PAIRS])
    assert nx.is_connected(g)
