"""One typed fabric: a cluster's network is `topology.cluster` (a `Cluster`), whichever way the cluster was
described, and no reader takes it from an untyped dict."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from meshscale.topology.cluster import NET_LINKS, system_or_cluster
from meshscale.topology.fabric import Cluster, network_of
from meshscale.topology.multinode import HostReport, join_hosts
from meshscale.topology.nics import Port

SRC = Path(__file__).resolve().parents[2] / "src" / "meshscale"


def test_a_catalog_cluster_and_the_same_cluster_from_a_file_are_one_cluster(tmp_path):
    path = tmp_path / "eight.yaml"
    path.write_text("cluster:\n  node: hgx-h100\n  nodes: 8\n  nics: 8\n  link: ndr\n")
    from_file = system_or_cluster(str(path)).cluster
    from_options = system_or_cluster("hgx-h100", nodes=8, link="ndr", nics=8).cluster
    assert isinstance(from_file, Cluster) and from_file == from_options
    assert from_file.nodes == 8 and from_file.net == NET_LINKS["ndr"]
    # and a different cluster is not equal: the comparison looks at the network
    assert system_or_cluster("hgx-h100", nodes=8, link="hdr", nics=8).cluster != from_options


def test_a_cluster_topology_knows_its_leaves_and_a_single_system_has_no_cluster():
    one = system_or_cluster("hgx-h100")
    assert one.cluster is None
    rails = system_or_cluster("hgx-h100", nodes=64, link="ndr", nics=8, network="rail").cluster
    # every NIC of a node on its own rail's leaf; nodes of one rail group share those leaves
    assert len(set(rails.leaves_of_node(0))) == 8 and rails.leaves_of_node(0) == rails.leaves_of_node(1)
    tree = system_or_cluster("hgx-h100", nodes=64, link="ndr", nics=8).cluster
    assert len(set(tree.leaves_of_node(0))) == 1
    assert tree.latency_s > NET_LINKS["ndr"].system_latency_s  # switch hops add to the NICs' own


def _joined(ports):
    from meshscale.topology import load_system

    node = load_system("hgx-h100")
    return join_hosts([HostReport(h, node, list(ports)) for h in ("a", "b")])


@pytest.mark.parametrize("ports, name", [
    ((), "10gbe"),                                                       # no port found: 10 GbE assumed
    ((Port("eth0", "ethernet", "up", 25.0),), "25gbe"),
    ((Port("mlx5_0/1", "infiniband", "ACTIVE", 200.0),), "hdr"),
    ((Port("mlx5_0/1", "infiniband", "ACTIVE", 400.0), Port("mlx5_1/1", "infiniband", "ACTIVE", 400.0)), "ndr"),
])
def test_joined_hosts_carry_the_network_they_found_with_its_own_latency(ports, name):
    topo = _joined(ports)
    net = NET_LINKS[name]
    assert topo.cluster.net == net and topo.cluster.nodes == 2 and topo.cluster.nics == max(1, len(ports))
    assert topo.cluster.latency_s == pytest.approx(net.system_latency_s + net.switch_latency_s)
    # the links of the joined topology say the same as its Cluster: one message, NIC link, switch, NIC link
    up = [l for l in topo.links if l.b == "l1/0"]
    assert 2 * up[0].latency_s + topo.nodes["l1/0"].attrs["latency_s"] == pytest.approx(topo.cluster.latency_s)


def test_an_assumed_ethernet_is_slower_to_answer_than_the_infiniband_found():
    assumed, ib = _joined(()), _joined((Port("mlx5_0/1", "infiniband", "ACTIVE", 100.0),))
    assert assumed.cluster.latency_s > 2 * ib.cluster.latency_s


def test_a_port_of_an_unlisted_rate_keeps_its_rate_and_the_nearest_ports_latencies():
    odd = network_of("ethernet", 40e9 / 8)
    assert odd.bandwidth_bytes_per_s == 40e9 / 8
    assert (odd.system_latency_s, odd.switch_latency_s) in {(n.system_latency_s, n.switch_latency_s)
                                                            for n in NET_LINKS.values() if n.kind == "ethernet"}


def test_no_reader_takes_the_cluster_from_an_untyped_dict():
    pattern = re.compile(r"""attrs\s*\[\s*["']cluster["']|attrs\.get\(\s*["']cluster["']|["']cluster["']\s+(not\s+)?in\s+\w*\.?attrs""")
    found = [f"{p.relative_to(SRC)}:{i}" for p in SRC.rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, f"read the typed topology.cluster instead: {found}"


def test_a_one_node_p2p_measurement_calibrates_a_cluster_of_that_node_as_the_node_itself():
    """`bench p2p` names the devices of the one node it ran on (gpu0, gpu1, ...); on a cluster of that node they
    are the first node's, so sim --nodes and predict --nodes fit the same links as the node alone."""
    from meshscale.results import Result
    from meshscale.simulate.link_fit import calibrated

    rows = [{"src": f"gpu{a}", "dst": f"gpu{b}", "mode": "unidirectional", "bandwidth_bytes_per_s": 5e9,
             "latency_s": 4e-6} for a in range(4) for b in range(4) if a != b]
    p2p = Result("bench-p2p", rows)
    alone = calibrated(system_or_cluster("pcie-4gpu"), p2p).params
    clustered = calibrated(system_or_cluster("pcie-4gpu", nodes=2), p2p).params
    assert alone.efficiency == clustered.efficiency and "calibrated" in clustered.source
    assert alone.efficiency["pcie"] < 1.0


def test_a_cluster_topology_keeps_its_cluster_through_json():
    """A cluster's topology written out (`topo --format json`, a result's meta.topology) and read back is the
    same cluster: its Cluster too, not only its nodes and links."""
    from meshscale.topology.schema import dumps, from_dict
    import json

    for topo in (system_or_cluster("hgx-h100", nodes=3, link="ndr", nics=8, network="rail"), _joined(())):
        again = from_dict(json.loads(dumps(topo)))
        assert again.cluster == topo.cluster and again.cluster is not None
    from meshscale.errors import TopologyError

    written = json.loads(dumps(_joined(())))
    for bad in ({"nodes": "two"}, {**written["fabric"], "nodes": "two"}, {**written["fabric"], "latency_s": -1},
                {**written["fabric"], "net": {**written["fabric"]["net"], "radix": None}}):
        with pytest.raises(TopologyError, match="fabric"):
            from_dict({**written, "fabric": bad})
