"""Cluster builder: the DGX-1 whitepaper's table 1 / section 3.3 figures, tree sizing, the built graph, bad input."""
import pytest

from meshscale.errors import MeshscaleError
from meshscale.topology import bisection_bandwidth, relation, route
from meshscale.topology.cluster import ClusterSpec, build_cluster, net_link, plan_cluster


def test_table1_infiniband():
    plan = plan_cluster(ClusterSpec("dgx1-p100", nodes=124, nics=4, link="edr"))
    assert round(plan.bisection_whitepaper_bytes_per_s / 1e9) == 6012
    assert plan.node_peak_bits_per_s == pytest.approx(800e9)
    assert plan.latency_s == pytest.approx(1.28e-6)
    assert plan.switch_hops == 3 and plan.levels == 2
    # at the ports' data rate (12.5 GB/s per EDR 4x port, per direction) half the nodes send 62 x 4 x 12.5
    assert plan.bisection_bytes_per_s == pytest.approx(62 * 4 * 12.5e9)


def test_table1_ethernet():
    plan = plan_cluster(ClusterSpec("dgx1-p100", nodes=124, nics=2, link="10gbe"))
    assert round(plan.bisection_whitepaper_bytes_per_s / 1e9) == 310
    assert plan.node_peak_bits_per_s == pytest.approx(40e9)
    assert plan.latency_s == pytest.approx(5e-6)


def test_switch_counts_and_third_level():
    plan = plan_cluster(ClusterSpec(nodes=128))
    assert plan.nodes_per_leaf == 4 and plan.radix == 36
    assert plan.switches == [32, 16] and plan.max_nodes == 128
    bigger = plan_cluster(ClusterSpec(nodes=129))
    assert bigger.levels == 3 and bigger.switch_hops == 5
    assert bigger.latency_s > plan.latency_s
    with pytest.raises(MeshscaleError, match="--levels 3"):
        plan_cluster(ClusterSpec(nodes=129, levels=2))


@pytest.mark.parametrize("oversub", [1.0, 2.0])
def test_bisection_formula_matches_graph(oversub):
    # whole leaves on each side of the cut (the formula's case): 4 leaves of 2 nodes
    plan = plan_cluster(ClusterSpec(nodes=8, nodes_per_leaf=2, oversubscription=oversub))
    topo = build_cluster(plan)
    hosts = [f"n{k}/cpu0" for k in range(8)]  # one terminal per node: the network's bisection, not a node's
    assert bisection_bandwidth(topo, hosts) == pytest.approx(plan.bisection_bytes_per_s, rel=1e-3)


def test_built_graph_names_indices_and_latency():
    plan = plan_cluster(ClusterSpec(nodes=6))
    topo = build_cluster(plan)
    assert len(topo.devices()) == 48
    assert topo.device(13) == "n1/gpu5"
    assert relation(topo, 0, 13) == "NET" and relation(topo, 0, 1) == "NV1"
    r = route(topo, "n0/ib0", "n5/ib0")  # leaf 0 to leaf 1: NIC links + 3 switches
    assert r.latency_s == pytest.approx(plan.latency_s)
    assert len(topo.nodes_of("net_switch")) == sum(plan.switches)


def test_gpudirect_off_stages_through_host():
    on = build_cluster(plan_cluster(ClusterSpec(nodes=2)))
    off = build_cluster(plan_cluster(ClusterSpec(nodes=2, gpudirect=False)))
    path_on = route(on, "n0/gpu0", "n1/gpu0").paths[0].nodes
    path_off = route(off, "n0/gpu0", "n1/gpu0").paths[0].nodes
    assert not any("cpu" in n for n in path_on)
    assert "n0/cpu0" in path_off and "n1/cpu0" in path_off


def test_added_nics_for_a_system_without_them():
    plan = plan_cluster(ClusterSpec(nodes=2, nics=8, link="hdr"))
    topo = build_cluster(plan)
    assert len([n for n in topo.nodes_of("nic") if topo.nodes[n].attrs.get("port_rate") == "hdr"]) == 16
    assert plan.node_bandwidth_bytes_per_s == pytest.approx(8 * net_link("hdr").bandwidth_bytes_per_s)


@pytest.mark.parametrize("spec, text", [
    (ClusterSpec(nics=0), "at least one NIC"),
    (ClusterSpec(nodes=0), "at least one node"),
    (ClusterSpec(link="fddi"), "unknown network link"),
    (ClusterSpec(nics=40), "do not fit"),
    (ClusterSpec(nodes=10**6), "three-level"),
])
def test_bad_input_is_one_line(spec, text):
    with pytest.raises(MeshscaleError, match=text) as info:
        plan_cluster(spec)
    assert "\n" not in str(info.value)
