"""The flow-level simulator: fair sharing, latency, dependencies, the DGX-1 whitepaper's figure 10, busbw factors."""
import numpy as np
import pytest

from meshscale.collectives.schedule import Chunk, Schedule, Step, Transfer
from meshscale.errors import MeshscaleError
from meshscale.simulate.engine import max_min_rates, run_flows
from meshscale.collectives.kinds import kind
from meshscale.simulate.params import INTEL_P2P_OVERHEAD, SimParams
from meshscale.simulate.sim import simulate
from meshscale.topology import from_dict, load_system, system_names

MIB = 1 << 20


def pcie_4gpu():
    """DGX-1 whitepaper, figure 10: one CPU, switch A with GPU0+GPU1, switch B with GPU2+GPU3 (PCIe 3.0 x16)."""
    if "pcie-4gpu" in system_names():
        return load_system("pcie-4gpu")
    return from_dict({
        "name": "pcie-4gpu", "defaults": {"pcie": {"generation": 3, "width": 16}},
        "nodes": [{"name": "cpu0", "kind": "cpu"}, {"name": "swA", "kind": "pcie_switch"}, {"name": "swB", "kind": "pcie_switch"}]
        + [{"name": f"gpu{i}", "kind": "gpu", "index": i} for i in range(4)],
        "links": [{"a": "swA", "b": "cpu0", "kind": "pcie"}, {"a": "swB", "b": "cpu0", "kind": "pcie"}]
        + [{"a": f"gpu{i}", "b": "swA" if i < 2 else "swB", "kind": "pcie"} for i in range(4)],
    })


def broadcast_tree(first_child, pairs, nbytes=64 * MIB):
    """A one-chunk broadcast from rank 0: root -> first_child, then the two transfers in ``pairs``."""
    steps = [Step([Transfer(0, first_child, 0, nbytes)]), Step([Transfer(s, d, 0, nbytes) for s, d in pairs])]
    return Schedule("broadcast", "tree", [0, 1, 2, 3], nbytes, [Chunk(0, 0, nbytes)], steps, root=0)


def test_max_min_shares_a_link_and_gives_the_rest_to_others():
    # resource 0 (cap 10) carries keys 0 and 1; resource 1 (cap 100) carries keys 1 and 2
    weights = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    rates = max_min_rates(weights, np.ones(3), np.array([10.0, 100.0]))
    assert rates[0] == pytest.approx(5) and rates[1] == pytest.approx(5)
    assert rates[2] == pytest.approx(95)  # takes what key 1 leaves on resource 1


def test_figure10_contended_tree_is_slower():
    topo = pcie_4gpu()
    bad = simulate(broadcast_tree(1, [(0, 2), (1, 3)]), topo)
    good = simulate(broadcast_tree(2, [(0, 1), (2, 3)]), topo)
    # the contended tree shares switch A's uplink in its second step: that step takes twice as long
    assert bad.time_s > 1.4 * good.time_s
    assert "cpu0" in bad.bottleneck.name  # a switch uplink
    # link load counts the 64-byte TLPs of P2P through the Intel root complex (x1.2, INTEL_P2P_OVERHEAD)
    assert bad.bottleneck.bytes == pytest.approx(2 * 64 * MIB * INTEL_P2P_OVERHEAD)
    uplinks = [l for l in good.links if "cpu0" in l.name]
    assert uplinks and all(l.bytes == pytest.approx(64 * MIB * INTEL_P2P_OVERHEAD) for l in uplinks)  # each crossed once


def test_one_transfer_time_is_latency_plus_bytes_over_effective_rate():
    topo = pcie_4gpu()
    params = SimParams()
    run = run_flows(topo, ["gpu0"], ["gpu1"], np.array([1e8]), np.array([False]), [[]], params)
    rate = topo.links[2].bandwidth_bytes_per_s * params.efficiency_of("pcie")
    latency = 2 * topo.links[2].latency_s + params.message_latency_of("pcie")
    assert run.time_s == pytest.approx(latency + 1e8 / rate, rel=1e-6)


def test_dependencies_and_reduce_cost_are_respected():
    topo = pcie_4gpu()
    slow = SimParams(reduce_bytes_per_s=1e9)  # slower than PCIe: the reduction sets the pace
    n = 1e8
    run = run_flows(topo, ["gpu0", "gpu1"], ["gpu1", "gpu2"], np.array([n, n]), np.array([True, False]), [[], [0]], slow)
    assert run.start_s[1] >= run.finish_s[0]
    assert run.finish_s[0] >= n / 1e9


def test_bus_factors_follow_nccl_tests():
    assert kind("all_reduce").busbw_factor(8) == pytest.approx(1.75)
    assert kind("all_gather").busbw_factor(4) == pytest.approx(0.75)
    assert kind("broadcast").busbw_factor(8) == 1.0
    with pytest.raises(MeshscaleError):
        kind("nonsense")


def test_bad_ranks_give_one_line_errors():
    topo = pcie_4gpu()
    bad = broadcast_tree(1, [(0, 2), (1, 3)])
    bad.ranks = [0, 1, 2, 9]
    with pytest.raises(MeshscaleError, match="no gpu 9"):
        simulate(bad, topo)
    bad.ranks = [0, 1, 2, 2]
    with pytest.raises(MeshscaleError, match="repeats"):
        simulate(bad, topo)


@pytest.mark.parametrize("algorithm, pieces", [("ring", 4), ("tree_packing", 4), ("hierarchical", 1)])
def test_a_time_to_beat_changes_no_outcome(algorithm, pieces):
    """`auto` gives each candidate the best time so far: a run that would end by then ends with its own time, one
    that would end after it reports an infinite time (however early it stops)."""
    from meshscale.collectives.algorithms import build
    from meshscale.simulate.sim import simulate
    from meshscale.topology.cluster import system_or_cluster
    topo = system_or_cluster("dgx1-p100", 2)
    schedule = build(algorithm, "all_reduce", list(range(16)), 64 << 20, topo, pieces=pieces)
    alone = simulate(schedule, topo).time_s
    assert simulate(schedule, topo, give_up_s=alone).time_s == alone
    assert simulate(schedule, topo, give_up_s=alone * 1.5).time_s == alone
    assert simulate(schedule, topo, give_up_s=alone * 0.999).time_s == float("inf")
