"""Rack-scale systems (GB200 / GB300 NVL72), the B200 / B300 boards, XDR, and clusters of racks: the wiring NVIDIA
documents, memory as the device offers it, NCCL's model inside and across NVLink domains, Slurm's blocks."""
from __future__ import annotations

import itertools

import pytest

from meshscale.topology import load_system, pair_bandwidth, relation, route, system_names
from meshscale.topology.cluster import cluster_spec, plan_cluster, spec_topology
from meshscale.topology.fabric import NET_LINKS
from meshscale.topology.nvml_discovery import model_facts

RACKS = ("gb200-nvl72", "gb300-nvl72")


@pytest.fixture(scope="module")
def racks():
    return {name: load_system(name) for name in RACKS}


def test_every_catalog_gpu_holds_the_memory_its_device_reports():
    """Bytes = nvidia-smi's MiB x 2^20 of the model's row, and between the sold GB read in decimal and in binary
    units: a system file that wrote the sold figure as GiB (hgx-b200's 180 GiB, 1 GiB above the device's total)
    disagrees with the row."""
    for name in system_names():
        topo = load_system(name)
        for g in topo.gpus():
            attrs = topo.nodes[g].attrs
            row, known = model_facts(attrs["model"])
            assert known and "memory_mib" in row, (name, attrs["model"])
            assert attrs["memory_bytes"] == row["memory_mib"] << 20 == row["memory_bytes"], (name, row["name"])
            assert row["memory_sold_gb"] * 10**9 <= attrs["memory_bytes"] <= row["memory_sold_gb"] << 30, name


@pytest.mark.parametrize("name", RACKS)
def test_a_rack_is_one_nvlink_domain_of_72_gpus_on_18_switch_chips(racks, name):
    topo = racks[name]
    gpus, chips = topo.gpus(), topo.nodes_of("nvswitch")
    assert len(gpus) == 72 and len(chips) == 18 and len({topo.nodes[c].attrs["switch_tray"] for c in chips}) == 9
    for g in gpus:  # one NVLink 5 to each chip: 18 x 50 GB/s per direction
        ends = [l.other(g) for l in topo.links_of(g, "nvlink")]
        assert sorted(ends) == sorted(chips) and all(l.count == 1 for l in topo.links_of(g, "nvlink"))
    assert sum(len(topo.links_of(c, "nvlink")) for c in chips) == 18 * 72  # every port of every chip used
    for a, b in [(0, 1), (0, 71), (5, 40), (36, 35)]:
        assert relation(topo, a, b) == "NV18" and pair_bandwidth(topo, a, b) == pytest.approx(900e9)
        assert route(topo, f"gpu{a}", f"gpu{b}").fabric == "nvlink"
    hosts = {}
    for n in topo.nodes.values():
        if n.kind in ("gpu", "cpu", "nic"):
            hosts.setdefault(n.attrs["host"], []).append(n.kind)
    assert len(hosts) == 18 and all(sorted(set(k)) == ["cpu", "gpu", "nic"] and k.count("gpu") == 4 == k.count("nic")
                                    and k.count("cpu") == 2 for k in hosts.values())
    for g in gpus:  # NVLink-C2C to its own Grace, 900 GB/s both directions
        (c2c,) = topo.links_of(g, "c2c")
        assert c2c.bandwidth_bytes_per_s == pytest.approx(450e9)
        assert topo.nodes[c2c.other(g)].kind == "cpu" and topo.nodes[c2c.other(g)].attrs["host"] == topo.nodes[g].attrs["host"]


def test_gb300_nics_sit_one_switch_from_their_gpu_and_gb200_nics_behind_the_grace(racks):
    from meshscale.topology.text import host_view
    gb300, gb200 = (host_view(racks[n]) for n in ("gb300-nvl72", "gb200-nvl72"))
    assert relation(gb300, "gpu0", "ib0") == "PIX" and relation(gb200, "gpu0", "ib0") == "NODE"
    assert relation(gb200, "gpu0", "ib2") == "SYS"  # the other Grace's NIC


def test_an_all_reduce_inside_a_rack_never_crosses_the_network():
    from meshscale.simulate.nccl import analyse
    one = analyse(load_system("gb200-nvl72"), list(range(72)))
    assert one.n_nodes == 1 and not one.nics and one.ring.path_type == "NVL"
    two = spec_topology("gb200-nvl72", cluster_spec("gb200-nvl72", 2))
    inside, across = analyse(two, list(range(72))), analyse(two, list(range(36, 108)))
    assert inside.n_nodes == 1 and not inside.nics and inside.inter_gbps == 0
    assert across.n_nodes == 2 and across.inter_gbps > 0
    # each rack's NICs serve their own trays' GPUs, with GPUDirect RDMA over NVLink-C2C (NCCL_NET_GDR_C2C=1)
    assert across.nics and all(p.gdr for p in across.nics)
    for p in across.nics:
        assert two.nodes[p.nic].attrs["host"] == two.nodes[p.gpu].attrs["host"]


def test_72_gpus_in_one_rack_all_reduce_faster_than_9_nodes_of_8_with_a_nic_per_gpu():
    from meshscale.simulate.nccl.model import predict
    rack = load_system("gb200-nvl72")
    boards = spec_topology("hgx-b200", cluster_spec("hgx-b200", 9, "ndr", 8))
    for size in (1 << 20, 1 << 30):
        in_rack = predict(rack, "all_reduce", list(range(72)), size).time_s
        on_boards = predict(boards, "all_reduce", list(range(72)), size).time_s
        assert in_rack < on_boards, size


def test_rings_found_at_once_behind_switches_are_those_the_search_lays():
    """`_uniform_switch_rings` against the depth-first search it short-cuts, on boards and a slice of a rack."""
    from meshscale.simulate.nccl import search
    from meshscale.simulate.nccl.tables import constants, gpu_sm
    c = constants(None)
    for name, n in (("hgx-h100", 8), ("gb200-nvl72", 6)):
        topo = load_system(name)
        names = [topo.device(i) for i in range(n)]
        capacity, paths = {}, {}
        for a, b in itertools.permutations(names, 2):
            paths[(a, b)] = search.pair_path(topo, a, b, c, gpu_sm(topo.gpu_model), capacity)
        for speed, closed in itertools.product((45, 20), (True, False)):
            fast = search._pack_rings(names, paths, capacity, speed, 16, closed)
            bound = len(fast) if len(fast) < 16 else 16
            assert fast == search._searched_rings(names, paths, capacity, speed, bound, closed)[:len(fast)]
            assert len(search._searched_rings(names, paths, capacity, speed, 16, closed)) == len(fast)


def test_the_slowest_injection_of_twin_ranks_is_the_slowest_of_all():
    from meshscale.collectives import bounds
    from meshscale.topology.queries import FABRICS
    for name in ("dgx1-v100", "hgx-h100", "dgx2"):
        topo = load_system(name)
        names = topo.devices()
        fabric = bounds._fabric_of(topo, names)
        every = min(bounds._injection(topo, fabric, names, n) for n in names)
        assert bounds._least_injection(topo, fabric, names) == pytest.approx(every)
    assert FABRICS  # the bound's fabrics are the routing's


def test_a_cluster_of_racks_runs_on_their_own_nics_and_slurm_blocks_are_racks():
    """A rack's 72 NICs: on one 144-port XDR leaf (GB300), on rails where a 64-port NDR leaf cannot take them."""
    from meshscale.topology.slurm import parse_topology_conf, slurm_topology, topology_conf
    gb300, spec = cluster_spec("gb300-nvl72", 4), cluster_spec("gb200-nvl72", 4)
    assert (gb300.link, gb300.nics, gb300.network, plan_cluster(gb300).nodes_per_leaf) == ("xdr", 72, "fat-tree", 1)
    assert (spec.link, spec.nics, spec.network) == ("ndr", 72, "rail")
    assert (cluster_spec("hgx-h100", 2).link, cluster_spec("hgx-h100", 2).nics) == ("ndr", 8)  # own NICs
    plan = plan_cluster(spec)
    parsed = parse_topology_conf(topology_conf(slurm_topology(plan, "block", "gb")))
    assert [len(b.nodes) for b in parsed.blocks] == [18] * 4  # a rack's compute trays, one block each
    assert parsed.block_sizes == (18, 36, 72)
    assert len({n for b in parsed.blocks for n in b.nodes}) == 72


def test_place_on_racks_packs_the_fewest_nvlink_domains_and_names_each_host():
    from meshscale.simulate.fabric import Fabric
    from meshscale.simulate.placement import rank_placements, visible_devices
    topo = spec_topology("gb200-nvl72", cluster_spec("gb200-nvl72", 2))
    ranked = rank_placements(Fabric(topo), 80)
    assert ranked[0].devices == list(range(80))  # one full rack and 8 GPUs of the next
    assert ranked[0].busbw_bytes_per_s >= ranked[-1].busbw_bytes_per_s
    lines = visible_devices(topo, ranked[0].devices)
    assert lines[0] == "node 0, host 0: CUDA_VISIBLE_DEVICES=0,1,2,3" and len(lines) == 20
    assert visible_devices(load_system("gb200-nvl72"), [4, 5]) == ["host 1: CUDA_VISIBLE_DEVICES=0,1"]
    assert visible_devices(load_system("hgx-h100"), [2, 5]) == ["CUDA_VISIBLE_DEVICES=2,5"]


def test_each_new_link_generation_doubles_the_last():
    assert NET_LINKS["xdr"].bandwidth_bytes_per_s == pytest.approx(2 * NET_LINKS["ndr"].bandwidth_bytes_per_s)
    assert NET_LINKS["800gbe"].bandwidth_bytes_per_s == pytest.approx(2 * NET_LINKS["400gbe"].bandwidth_bytes_per_s)


@pytest.mark.parametrize("argv", [("sim", "all_reduce", "-s", "gb200-nvl72", "-b", "1M", "-e", "1G", "-f", "1024"),
                                  ("topo", "-s", "gb300-nvl72"),
                                  ("cluster", "-s", "gb200-nvl72", "--nodes", "4")])
def test_rack_commands_answer(cli, argv):
    r = cli(*argv)
    assert r.exit_code == 0, r.output
