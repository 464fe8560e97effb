"""The reference catalog: every system loads, round-trips through JSON, and has the wiring NVIDIA documents."""
import itertools
import json

import pytest

from meshscale.topology import (bisection_bandwidth, dumps, from_dict, load_system, pair_bandwidth, relation, route,
                                shared_links, system_names)

SYSTEMS = ["dgx-a100", "dgx-a100-320gb", "dgx-station", "dgx1-p100", "dgx1-v100", "dgx2", "gb200-nvl72", "gb300-nvl72",
           "hgx-b200", "hgx-b300", "hgx-h100", "hgx-h200",
           "pcie-4gpu", "pcie-8gpu-2socket"]
P100_PAIRS = {tuple(map(int, p.split("-"))) for p in
              "0-1 0-2 0-3 0-4 1-2 1-3 1-5 2-3 2-6 3-7 4-5 4-6 4-7 5-6 5-7 6-7".split()}
V100_DOUBLED = {tuple(map(int, p.split("-"))) for p in "0-3 0-4 1-2 1-5 2-3 4-7 5-6 6-7".split()}
CYCLES = ([0, 3, 2, 1, 5, 6, 7, 4], [0, 1, 3, 7, 5, 4, 6, 2])
GPU_ATTRS = ("model", "memory_bytes", "sm_count", "memory_bandwidth_bytes_per_s", "fp32_flops", "fp16_flops", "nvlinks")


@pytest.fixture(scope="module")
def catalog():
    return {name: load_system(name) for name in SYSTEMS}


def test_catalog_lists_every_reference_system():
    assert set(SYSTEMS) <= set(system_names())


@pytest.mark.parametrize("name", SYSTEMS)
def test_json_round_trip_is_equal(catalog, name):
    topo = catalog[name]
    assert from_dict(json.loads(dumps(topo))) == topo


@pytest.mark.parametrize("name", SYSTEMS)
def test_gpu_facts_are_complete_and_consistent(catalog, name):
    topo = catalog[name]
    assert [topo.nodes[g].index for g in topo.gpus()] == list(range(len(topo.gpus())))
    for g in topo.gpus():
        attrs = topo.nodes[g].attrs
        assert all(key in attrs for key in GPU_ATTRS), (g, [k for k in GPU_ATTRS if k not in attrs])
        assert attrs["nvlinks"] == topo.nvlink_count(g)  # the stated link count matches the wiring
        for link in topo.links_of(g, "nvlink"):
            assert link.generation == attrs["nvlink_generation"]
    assert topo.nodes_of("cpu") and topo.nodes_of("nic")
    for nic in topo.nodes_of("nic"):
        assert topo.nodes[nic].attrs["port_kind"] in ("infiniband", "ethernet") and topo.links_of(nic)


def test_dgx1_v100_doubles_exactly_the_eight_pairs(catalog):
    topo = catalog["dgx1-v100"]
    for a, b in itertools.combinations(range(8), 2):
        expected = "NV2" if (a, b) in V100_DOUBLED else "NV1" if (a, b) in P100_PAIRS else "SYS" if a // 4 != b // 4 else None
        if expected:
            assert relation(topo, a, b) == expected, (a, b)
    assert all(topo.nvlink_count(g) == 6 for g in topo.gpus())
    edges = {frozenset(p) for p in P100_PAIRS}
    for cycle in CYCLES:
        assert all(frozenset(e) in edges for e in zip(cycle, cycle[1:] + cycle[:1]))
    # the doubled pairs are the first Hamiltonian cycle
    first = CYCLES[0]
    assert {tuple(sorted(e)) for e in zip(first, first[1:] + first[:1])} == V100_DOUBLED
    assert pair_bandwidth(topo, 0, 3) == pytest.approx(50e9) and pair_bandwidth(topo, 0, 1) == pytest.approx(25e9)


def test_dgx2_every_pair_150_per_direction_through_nvswitch(catalog):
    topo = catalog["dgx2"]
    assert len(topo.gpus()) == 16 and len(topo.nodes_of("nvswitch")) == 12
    for g in topo.gpus():
        assert topo.nvlink_count(g) == 6
        assert all(topo.nodes[l.other(g)].kind == "nvswitch" for l in topo.links_of(g, "nvlink"))
    for a, b in itertools.combinations(range(16), 2):
        r = route(topo, f"gpu{a}", f"gpu{b}")
        assert r.fabric == "nvlink" and r.bandwidth_bytes_per_s == pytest.approx(150e9), (a, b)
        assert relation(topo, a, b) == "NV6"
    assert len(route(topo, "gpu0", "gpu15").paths) == 6  # one path per switch of the board


def test_dgx2_bisection_is_2_4_tb_per_s_both_ways(catalog):
    assert bisection_bandwidth(catalog["dgx2"], link_kinds={"nvlink"}) == pytest.approx(1.2e12)


@pytest.mark.parametrize("name,links,per_link", [("hgx-h100", 18, 25e9), ("hgx-h200", 18, 25e9), ("dgx-a100", 12, 25e9),
                                                  ("hgx-b200", 18, 50e9)])
def test_nvswitch_boards_are_uniform(catalog, name, links, per_link):
    topo = catalog[name]
    for a, b in itertools.combinations(range(8), 2):
        assert relation(topo, a, b) == f"NV{links}"
        assert pair_bandwidth(topo, a, b) == pytest.approx(links * per_link)
    if name in ("hgx-h100", "hgx-h200"):
        assert sorted(l.count for l in topo.links_of("gpu0", "nvlink")) == [4, 4, 5, 5]
    if name == "hgx-b200":  # two NVLink 5 switches, 9 links to each; their 14.4 TB/s aggregate (both ways)
        assert sorted(l.count for l in topo.links_of("gpu0", "nvlink")) == [9, 9]
        assert 2 * 8 * pair_bandwidth(topo, 0, 1) == pytest.approx(14.4e12)


def test_h200_differs_from_h100_in_memory_only(catalog):
    h100, h200 = (catalog[n].nodes["gpu0"].attrs for n in ("hgx-h100", "hgx-h200"))
    assert h200["memory_bytes"] > h100["memory_bytes"] and h200["memory_bandwidth_bytes_per_s"] > h100["memory_bandwidth_bytes_per_s"]
    assert h200["sm_count"] == h100["sm_count"] == 132


def test_dgx_station_is_all_to_all(catalog):
    topo = catalog["dgx-station"]
    assert all(relation(topo, a, b) == "NV2" for a, b in itertools.combinations(range(4), 2))
    assert all(topo.nvlink_count(g) == 6 for g in topo.gpus())


def test_figure_10_pcie_tree(catalog):
    topo = catalog["pcie-4gpu"]
    assert relation(topo, 0, 1) == "PIX" and relation(topo, 0, 2) == "PHB"
    # DGX-1 whitepaper, figure 10: 0->2 then (0->1, 2->3) has no contention; (0->2, 1->3) both climb switch A's uplink
    assert shared_links(topo, (0, 2), (1, 3))
    assert not shared_links(topo, (0, 1), (2, 3))
    assert pair_bandwidth(topo, 0, 3) == pytest.approx(15.754e9, rel=1e-3)


def test_two_socket_pcie_server(catalog):
    topo = catalog["pcie-8gpu-2socket"]
    assert relation(topo, 0, 1) == "PIX" and relation(topo, 0, 2) == "PHB" and relation(topo, 0, 4) == "SYS"
    r = route(topo, "gpu0", "gpu4")
    assert r.fabric == "pcie" and "cpu1" in r.paths[0].nodes
    assert r.bandwidth_bytes_per_s == pytest.approx(15.754e9, rel=1e-3)  # PCIe, not QPI, is the narrowest


def test_systems_command_lists_them_all(cli):
    result = cli("systems")
    assert result.exit_code == 0
    for name in SYSTEMS:
        assert name in result.output


@pytest.mark.parametrize("name,indices", [("hgx-h100", None), ("pcie-8gpu-2socket", None), ("dgx1-p100", [0, 1, 2, 4, 5]),
                                          ("dgx2", [0, 1, 2, 3, 8, 9, 10]), ("dgx-a100", [0, 1, 2, 3, 4, 5])])
def test_bisection_with_twins_equals_brute_force(monkeypatch, name, indices):
    from meshscale.topology import queries

    names = None if indices is None else [f"gpu{i}" for i in indices]
    fast = bisection_bandwidth(load_system(name), names)
    monkeypatch.setattr(queries, "_twin_classes", lambda links, names: [[n] for n in names])
    # every split, both halves, without the symmetry shortcuts
    monkeypatch.setattr(queries, "_halves", lambda classes, half, total: itertools.combinations(
        [m for c in classes for m in c], half))
    assert bisection_bandwidth(load_system(name), names) == pytest.approx(fast)


@pytest.mark.parametrize("name", SYSTEMS)
def test_no_attribute_is_a_fragment_of_a_split_value(catalog, name):
    """A flow mapping such as ``{model: NVSwitch (third generation, 64 ports)}`` splits at the comma into a cut
    value and a stray key with no value; no attribute of a catalog node may be empty or end inside parentheses."""
    for node in catalog[name].nodes.values():
        for key, value in node.attrs.items():
            assert value is not None, f"{name}: {node.name} has a stray key {key!r}"
            if isinstance(value, str):
                assert value.count("(") == value.count(")"), f"{name}: {node.name}.{key} = {value!r} is cut"
