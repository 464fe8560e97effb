"""Synthesis: ring packing on the DGX-1s, contention-free rings on PCIe trees, tree packing against the
independently computed max-flow bound."""
import itertools
from collections import Counter

import pytest

from meshscale.collectives.algorithms import build
from meshscale.collectives.synthesis import (best_ring, broadcast_bound, pack_rings, pack_trees, ring_bandwidth,
                                             tree_fabric)
from meshscale.errors import MeshscaleError
from meshscale.topology import load_system, route, system_names

P100, V100 = load_system("dgx1-p100"), load_system("dgx1-v100")


def hop_links(topo, order):
    """Directed links used by the hops of a ring order, with multiplicity."""
    used = Counter()
    for a, b in zip(order, order[1:] + order[:1]):
        used.update(route(topo, topo.device(a), topo.device(b)).directed_links())
    return used


def test_p100_two_rings_four_disjoint_channels():
    packing = pack_rings(P100, list(range(8)))
    assert packing.disjoint and len(packing.rings) == 2 and len(packing.channels) == 4
    used = Counter()
    for order in packing.channels:
        assert sorted(order) == list(range(8))
        used.update(hop_links(P100, order))
    assert max(used.values()) == 1  # no directed link carries two channels
    assert all(P100.links[i].kind == "nvlink" for i, _ in used)
    assert packing.bandwidth_bytes_per_s == pytest.approx(4 * 20e9)


def test_v100_three_rings_on_doubled_links():
    packing = pack_rings(V100, list(range(8)))
    assert len(packing.rings) == 3 and len(packing.channels) == 6
    units = Counter()
    for ring in packing.rings:
        units.update(frozenset(e) for e in zip(ring.order, ring.order[1:] + ring.order[:1]))
    for pair, count in units.items():  # never more rings over a pair than it has links
        a, b = (V100.device(d) for d in pair)
        assert count <= sum(l.count for l in V100.links_between(a, b) if l.kind == "nvlink")
    assert any(c == 2 for c in units.values())  # the doubled links carry two rings


def test_subset_rings_are_orders_of_the_subset():
    for sub in [(0, 1, 2, 3), (0, 1, 2, 3, 7), (4, 5, 6), (0, 5, 6), (1, 2, 5, 6, 7)]:
        packing = pack_rings(P100, list(sub))
        assert packing.rings
        for order in packing.channels:
            assert sorted(order) == sorted(sub)
        if not packing.disjoint:  # no NVLink cycle: the fallback ring is the best one
            assert packing.rings[0].bandwidth_bytes_per_s == pytest.approx(
                max(ring_bandwidth(P100, [sub[0], *p]) for p in itertools.permutations(sub[1:])))


@pytest.mark.parametrize("system", [s for s in ("pcie-4gpu", "pcie-8gpu-2socket") if s in system_names()])
def test_pcie_ring_crosses_each_uplink_once_per_direction(system):
    topo = load_system(system)
    devices = [topo.nodes[d].index for d in topo.devices()]
    ring = best_ring(topo, devices)
    used = hop_links(topo, ring.order)
    assert max(used.values()) == 1
    worst = [0, 2, 1, 3] + devices[4:]  # 0 -> 2 and 1 -> 3 both climb the first switch's uplink
    assert ring_bandwidth(topo, worst) < ring.bandwidth_bytes_per_s


def test_bound_is_the_cut_at_the_root():
    assert broadcast_bound(P100, list(range(8))) == pytest.approx(80e9, rel=1e-3)  # 4 NVLinks out of the root
    assert broadcast_bound(P100, list(range(8)), fabric=False) > 90e9  # + PCIe when every link counts
    assert tree_fabric(P100, [0, 5, 6]).attrs.get("fabric") != "nvlink"  # 0 has no NVLink to 5 or 6


@pytest.mark.parametrize("system", system_names())
def test_tree_packing_reaches_bound_on_catalog(system):
    topo = load_system(system)
    devices = [topo.nodes[d].index for d in topo.devices()][:8]
    packing = pack_trees(topo, devices, 0)
    bound = broadcast_bound(topo, devices, 0)
    assert packing.bandwidth_bytes_per_s == pytest.approx(bound, rel=0.05)
    assert packing.bandwidth_bytes_per_s <= bound * (1 + 1e-6)
    for tree in packing.trees:  # spanning trees rooted at the root
        assert set(tree) == set(devices) - {devices[0]}


@pytest.mark.parametrize("topo", [P100, V100], ids=["p100", "v100"])
def test_tree_packing_reaches_bound_on_subsets(topo):
    subsets = [s for k in range(3, 9) for s in itertools.combinations(range(8), k)]
    for i, sub in enumerate(subsets[::5]):
        root = i % len(sub)
        rate = pack_trees(topo, list(sub), root).bandwidth_bytes_per_s
        assert rate == pytest.approx(broadcast_bound(topo, list(sub), root), rel=0.05), sub


def test_tree_packing_schedule():
    s = build("tree_packing", "broadcast", list(range(8)), 4 * 1000, P100, root=0, pieces=4)
    rates = s.meta["tree_rates_bytes_per_s"]
    assert s.channels == len(rates) > 1
    moved = Counter()
    for _, t in s.transfers():
        if t.src == 0:
            moved[t.channel] += t.nbytes
    shares = [moved[k] / sum(moved.values()) for k in range(len(rates))]
    assert shares == pytest.approx([r / sum(rates) for r in rates], abs=0.02)


def test_packed_ring_schedule_and_bad_input():
    s = build("packed_ring", "all_reduce", list(range(8)), 4 * 8 * 4, P100)
    assert s.channels == 4
    with pytest.raises(MeshscaleError, match="repeat"):
        pack_rings(P100, [0, 1, 1])
    with pytest.raises(MeshscaleError, match="no gpu 8"):
        pack_trees(P100, [0, 8])
