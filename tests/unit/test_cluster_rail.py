"""Rail-optimized networks: sizing (the DGX SuperPOD's switch counts), hops between nodes, NCCL's ring across
rail leaves vs an oversubscribed fat tree, the --network option wherever a cluster is accepted, bad input."""
import pytest

from meshscale.errors import MeshscaleError
from meshscale.results import load_result
from meshscale.simulate import nccl
from meshscale.simulate.nccl import tuning
from meshscale.simulate.cost import Call
from meshscale.simulate.fabric import Fabric
from meshscale.simulate.nccl_env import NcclSettings
from meshscale.topology import route
from meshscale.topology.cluster import ClusterSpec, build_cluster, describe, net_link, plan_cluster, system_or_cluster

H100 = dict(node="hgx-h100", nics=8, link="ndr", placement="packed")  # the leaves as built: the job is the cluster


def _ranks(topo):
    return [topo.nodes[d].index for d in topo.devices()]


def test_rail_sizing_matches_the_superpod_switch_counts():
    # DGX SuperPOD (B200/H100 reference architectures): 32 nodes per scalable unit, a 64-port NDR leaf per rail
    # (32 down + 32 up); 4 units = 128 nodes on 32 leaves and 16 spines; a two-level fabric tops out at 8 units
    plan = plan_cluster(ClusterSpec(nodes=128, network="rail", **H100))
    assert plan.nodes_per_leaf == 32 and plan.rails == 8 and plan.groups == 4
    assert plan.switches == [32, 16] and plan.max_nodes == 256 and plan.switch_hops == 3
    assert plan_cluster(ClusterSpec(nodes=64, network="rail", **H100)).switches == [16, 8]


def test_one_rail_group_is_one_switch_between_nodes_and_has_no_spine():
    rail = plan_cluster(ClusterSpec(nodes=16, oversubscription=2, network="rail", **H100))
    tree = plan_cluster(ClusterSpec(nodes=16, oversubscription=2, **H100))
    assert rail.levels == 1 and rail.switches == [8] and rail.switch_hops == 1
    assert tree.levels == 2 and tree.switch_hops == 3 and tree.groups == 4
    assert rail.latency_s < tree.latency_s
    rail_topo, tree_topo = build_cluster(rail), build_cluster(tree)
    # same-rail NICs of the first and last node: one switch on rails, leaf-spine-leaf in the tree
    r = route(rail_topo, "n0/ib3", "n15/ib3")
    assert [n for n in r.paths[0].nodes if n.startswith("l")] == ["l1/3"]
    assert r.latency_s == pytest.approx(rail.latency_s)
    t = route(tree_topo, "n0/ib3", "n15/ib3")
    assert len([n for n in t.paths[0].nodes if n.startswith("l")]) == 3
    assert {rail_topo.nodes[f"n7/ib{j}"].attrs["rail"] for j in range(8)} == set(range(8))
    assert "PXN" in " ".join(rail.notes)


def test_cluster_prints_the_rail_layout_and_draws_it(cli, tmp_path):
    r = cli("cluster", "-s", "hgx-h100", "--nodes", "128", "--nics", "8", "--link", "ndr", "--network", "rail",
            "--plot", tmp_path / "rails.png", "--json", tmp_path / "c.json")
    assert r.exit_code == 0, r.output
    assert "8 rails" in r.stdout and "level-1 switches: 32 (4 per rail)" in r.stdout
    assert "level-2 switches: 16 (spine)" in r.stdout and "1 switch hop on a rail inside a group, 3 across groups" in r.stdout
    assert (tmp_path / "rails.png").stat().st_size > 1000
    row = load_result(tmp_path / "c.json").rows[0]
    assert row["network"] == "rail" and row["rails"] == 8 and row["switches_per_level"] == [32, 16]
    tree = cli("cluster", "-s", "hgx-h100", "--nodes", "16", "--nics", "8", "--link", "ndr", "--oversubscription", "2")
    assert "fat tree:" in tree.stdout and "1 switch hop on one leaf, 3 across leaves" in tree.stdout


def _ring(nbytes: int, **shape):
    topo = build_cluster(plan_cluster(ClusterSpec(**{**H100, **shape})))
    return Fabric(topo, nccl=NcclSettings(algo="ring")).cost(Call("all_reduce", nbytes, tuple(_ranks(topo))))


def test_an_oversubscribed_fat_tree_cuts_the_ring_where_rails_do_not():
    full = _ring(1 << 30, nodes=4).busbw_bytes_per_s
    # one node per leaf at 2:1: every ring hop between nodes climbs through half the node's rate of up-links
    blocking = ClusterSpec(nodes=4, nodes_per_leaf=1, oversubscription=2, **H100)
    topo = build_cluster(plan_cluster(blocking))
    s = nccl.analyse(topo, _ranks(topo))
    assert s.inter_gbps == pytest.approx(4 * net_link("ndr").bandwidth_bytes_per_s / 1e9)  # 8 ports, 4 up-links
    assert s.inter_gbps < 0.55 * sum(n.gbps for n in s.nics)
    tree = _ring(1 << 30, nodes=4, nodes_per_leaf=1, oversubscription=2).busbw_bytes_per_s
    assert tree < 0.6 * full
    # the same nodes on rails, one node per rail group: each rail leaf carries one NIC's share of the ring
    rails = _ring(1 << 30, nodes=4, nodes_per_leaf=1, oversubscription=2, network="rail")
    assert rails.busbw_bytes_per_s == pytest.approx(full, rel=1e-3)  # (3 hops vs 1: a few us on 1 GiB)
    # the whole group on one rail leaf per rail: nothing climbs at all
    assert _ring(1 << 30, nodes=4, oversubscription=2, network="rail").busbw_bytes_per_s == pytest.approx(full, rel=1e-6)


def test_fabric_rate_counts_each_rail_leafs_share():
    topo = build_cluster(plan_cluster(ClusterSpec(nodes=4, nodes_per_leaf=1, oversubscription=8, network="rail", **H100)))
    s = nccl.analyse(topo, _ranks(topo))
    # a rail leaf of one node has 1 up-link (50 GB/s) for one NIC's eighth of the node's 400 GB/s: not a limit
    assert s.inter_gbps == pytest.approx(sum(n.gbps for n in s.nics))
    tree = build_cluster(plan_cluster(ClusterSpec(nodes=4, nodes_per_leaf=1, oversubscription=8, **H100)))
    ndr_gbps = net_link("ndr").bandwidth_bytes_per_s / 1e9
    assert nccl.analyse(tree, _ranks(tree)).inter_gbps == pytest.approx(ndr_gbps)  # the leaf's one up-link


def test_rails_take_fewer_hops_so_small_rings_are_faster():
    tree = _ring(4096, nodes=16, oversubscription=2).time_s
    rails = _ring(4096, nodes=16, oversubscription=2, network="rail").time_s
    assert rails < tree
    # 30 network steps of a 16-node ring all_reduce; NCCL's latency constants hold for a 3-hop EDR tree (1.28 us),
    # so the tree's 3 NDR hops (1.40 us) cost 0.12 us a step more and the rail's 1 hop (1.14 us) nothing more
    tree_latency_s = plan_cluster(ClusterSpec(nodes=16, oversubscription=2, **H100)).latency_s
    assert tree - rails == pytest.approx(30 * (tree_latency_s - nccl.REFERENCE_NET_LATENCY_S), rel=0.02)


def test_network_option_on_every_cluster_command(cli, tmp_path):
    args = ("-s", "hgx-h100", "--nodes", "2", "--nics", "8", "--link", "ndr", "--network", "rail")
    r = cli("sim", "all_reduce", *args, "--oversubscription", "2", "-b", "1M", "-e", "1M")
    assert r.exit_code == 0, r.output
    assert "hgx-h100x2-ndr-rail" in r.stdout
    r = cli("plan", "all_reduce", *args, "--bytes", "1M")
    assert r.exit_code == 0, r.output
    r = cli("topo", *args)
    assert r.exit_code == 0 and "rail-optimized:  8 rails" in r.stdout
    r = cli("predict", "--model", "resnet50", "-s", "hgx-h100", "--nodes", "1,2", "--nics", "8", "--link", "ndr",
            "--network", "rail", "--json", tmp_path / "p.json")
    assert r.exit_code == 0, r.output
    assert load_result(tmp_path / "p.json").meta["network"] == "rail"


def _cluster_file(tmp_path, **fields) -> str:
    path = tmp_path / "c.yaml"
    path.write_text("cluster:\n" + "".join(f"  {k}: {v}\n" for k, v in fields.items()))
    return str(path)


def test_a_cluster_file_names_its_network(cli, tmp_path):
    path = _cluster_file(tmp_path, node="hgx-h100", nodes=40, nics=8, link="ndr", network="rail", oversubscription=2)
    assert "1 rail group(s) of up to 42 nodes" in cli("cluster", "-s", path).stdout
    assert cli("topo", "-s", path, "--network", "fat-tree").stdout.count("fat tree:") == 1  # options override
    topo = system_or_cluster(path)
    assert topo.cluster.network == "rail" and topo.cluster.oversubscription == 2


def test_the_network_fit_keeps_the_rails(tmp_path):
    from meshscale.results import Result
    from meshscale.simulate.link_fit import fit_network
    path = tmp_path / "m.json"
    Result("bench-collective", [{"collective": "all_reduce", "size_bytes": s, "time_s": 1e-4 + s / 40e9,
                                 "busbw_bytes_per_s": 0.0} for s in (1 << 20, 1 << 28)],
           meta={"world_size": 16}).save(path)
    fitted, _ = fit_network(system_or_cluster("hgx-h100", nodes=2, nics=8, link="ndr", network="rail"), load_result(path))
    assert fitted.cluster.network == "rail" and fitted.name.endswith("-rail")


@pytest.mark.parametrize("spec, text", [
    (ClusterSpec(network="torus"), "unknown network 'torus'; use fat-tree or rail"),
    (ClusterSpec(nodes=2, nics=4, link="ndr", node="hgx-h100", network="rail"), "its own NIC"),
    (ClusterSpec(nodes=300, network="rail", **H100), "exceed the 256"),
    (ClusterSpec(nodes=64, levels=1, network="rail", **H100), "--levels 2"),
    (ClusterSpec(nodes=8, levels=3, network="rail", **H100), "1 or 2 levels"),
])
def test_bad_rail_specs_are_one_line_errors(spec, text):
    with pytest.raises(MeshscaleError, match=text) as e:
        plan_cluster(spec)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("args, words", [
    (("sim", "all_reduce", "-s", "hgx-h100", "--nodes", "2", "--network", "torus"), "unknown network"),
    (("sim", "all_reduce", "-s", "hgx-h100", "--nodes", "2", "--nics", "4", "--network", "rail"), "its own NIC"),
    (("cluster", "-s", "hgx-h100", "--nodes", "300", "--nics", "8", "--link", "ndr", "--network", "rail"), "exceed"),
    (("topo", "--network", "rail"), "--network describe a cluster"),
    (("sim", "all_reduce", "-s", "hgx-h100", "--network", "rail"), "add --nodes"),
    (("predict", "--model", "resnet50", "-s", "hgx-h100", "--network", "rail"), "add --nodes"),
    (("cluster", "--oversubscription", "0.5"), "--oversubscription"),
])
def test_bad_network_input_is_one_line_exit_2(cli, args, words):
    r = cli(*args)
    assert r.exit_code == 2, r.output
    assert words in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_a_cluster_file_with_an_unknown_network_is_exit_2(cli, tmp_path):
    r = cli("sim", "all_reduce", "-s", _cluster_file(tmp_path, node="hgx-h100", nodes=2, network="dragonfly"))
    assert r.exit_code == 2 and "unknown network 'dragonfly'" in r.stderr


def test_describe_of_a_fat_tree_is_unchanged_where_it_was_one_leaf():
    text = describe(plan_cluster(ClusterSpec(nodes=4)))
    assert "fat tree:" in text and "node to node" not in text  # one leaf: no hops to compare


def test_nvls_across_nodes_is_held_to_the_network_as_nccl_tunes_it():
    # tuning.cc: NVLS all-reduce runs at min(bwIntra, bwInter), NVLS tree at min(bwIntra, bwInter / 2) beyond two
    # nodes: a slower network lowers both (before, the NVLS tree ignored it and kept 520 GB/s on any network)
    def busbw(link, nodes):
        topo = build_cluster(plan_cluster(ClusterSpec(nodes=nodes, node="hgx-h100", nics=8, link=link)))
        p = nccl.predict(topo, "all_reduce", _ranks(topo), 1 << 30, nccl_algo="nvls_tree")
        return (1 << 30) * 2 * (p.system.n_ranks - 1) / p.system.n_ranks / p.time_s / 1e9
    fast, slow = busbw("ndr", 4), busbw("hdr", 4)
    assert slow < 0.75 * fast  # HDR is half NDR's rate
    assert busbw("ndr", 2) > busbw("ndr", 4)  # two nodes: the whole bwInter; more: half of it


def test_a_small_call_on_many_nodes_is_floored_by_the_trees_latency_not_the_rings():
    # the per-call floor is NCCL's cheapest latency: across 16 nodes the tree's log depth, not a 30-step ring
    topo = build_cluster(plan_cluster(ClusterSpec(nodes=16, **H100)))
    p = nccl.predict(topo, "all_reduce", _ranks(topo), 4096)
    ring_ll_us = tuning.latency_us(p.system, nccl.constants(), "all_reduce", "ring", "LL")
    assert p.time_s * 1e6 < 0.5 * ring_ll_us
