"""Diagrams: files are written, valid (SVG parses as XML, PNG has its signature) and carry the GPU labels."""
import xml.etree.ElementTree as ET

import pytest

from meshscale.errors import MeshscaleError
from meshscale.topology import from_dict, load_system
from meshscale.topology.discover import cpu_topology
from meshscale.topology.draw import _is_cube_mesh, draw, layout

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def svg_text(path) -> str:
    root = ET.parse(path).getroot()  # raises on malformed XML
    assert root.tag.endswith("svg")
    return " ".join(t for t in root.itertext())


@pytest.mark.parametrize("system", ["dgx1-v100", "dgx2", "hgx-h200", "pcie-8gpu-2socket"])
def test_svg_is_xml_with_every_gpu_label(tmp_path, system):
    topo = load_system(system)
    path = draw(topo, tmp_path / f"{system}.svg")
    text = svg_text(path)
    for g in topo.gpus():
        assert f"GPU{topo.nodes[g].index}" in text
    if topo.nodes_of("nvswitch"):
        assert "NVSwitch" in text


def test_png_has_signature_and_size(tmp_path):
    path = draw(load_system("dgx1-p100"), tmp_path / "p100.png")
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 10_000


def test_cube_mesh_is_two_squares_with_pcie_below():
    v100, p100 = load_system("dgx1-v100"), load_system("dgx1-p100")
    assert _is_cube_mesh(v100) and _is_cube_mesh(p100) and not _is_cube_mesh(load_system("dgx2"))
    pos = layout(v100)
    gpu_y = {pos[g][1] for g in v100.gpus()}
    assert len(gpu_y) == 2  # the two squares share their top and bottom rows
    assert all(pos[n][1] < min(gpu_y) for n in v100.nodes_of("pcie_switch") + v100.nodes_of("cpu"))
    assert len({pos[n] for n in pos}) == len(pos)  # no two nodes on one spot


def test_nvswitch_rows_sit_between_gpu_rows():
    topo = load_system("dgx2")
    pos = layout(topo)
    top = [pos[g][1] for g in topo.gpus()[:8]]
    bottom = [pos[g][1] for g in topo.gpus()[8:]]
    switches = [pos[s][1] for s in topo.nodes_of("nvswitch")]
    assert min(top) > max(switches) and min(switches) > max(bottom)


def test_pos_attr_wins_and_cpu_topology_draws(tmp_path):
    data = {"name": "two", "nodes": [{"name": "gpu0", "kind": "gpu", "index": 0, "pos": [5, 7]},
                                     {"name": "gpu1", "kind": "gpu", "index": 1}],
            "links": [{"a": "gpu0", "b": "gpu1", "kind": "nvlink", "generation": 4, "count": 3}]}
    topo = from_dict(data)
    assert layout(topo)["gpu0"] == (5.0, 7.0)
    assert "GPU1" in svg_text(draw(topo, tmp_path / "two.svg"))
    assert "worker1" in svg_text(draw(cpu_topology(2), tmp_path / "cpu.svg"))


def test_bad_suffix_is_a_user_error(tmp_path):
    with pytest.raises(MeshscaleError, match="svg or .png"):
        draw(load_system("pcie-4gpu"), tmp_path / "x.pdf")


def test_a_file_without_devices_still_draws(tmp_path):
    data = {"name": "sockets", "nodes": [{"name": "cpu0", "kind": "cpu"}, {"name": "cpu1", "kind": "cpu"}],
            "links": [{"a": "cpu0", "b": "cpu1", "kind": "upi", "bandwidth_gb_per_s": 40}]}
    assert "cpu1" in svg_text(draw(from_dict(data), tmp_path / "sockets.svg"))


def test_station_square_keeps_pcie_below():
    topo = load_system("dgx-station")
    pos = layout(topo)
    assert all(pos[s][1] < min(pos[g][1] for g in topo.gpus()) for s in topo.nodes_of("pcie_switch"))


def test_the_fat_tree_picture_states_the_figures_the_text_states():
    from meshscale.topology.cluster import ClusterSpec, describe, plan_cluster
    from meshscale.topology.draw import fat_tree_figure
    plan = plan_cluster(ClusterSpec(node="dgx1-p100", nodes=124))
    title = fat_tree_figure(plan).axes[0].get_title()
    text = describe(plan)
    for figure in ("6,012 GB/s", "3,100 GB/s", "1.28 us"):
        assert figure in title and figure in text, (figure, title)


def test_a_small_topology_is_drawn_small():
    """A one-GPU VM (GPU, its PCIe link, a CPU) is a small picture, not a page-wide one of three tiny boxes."""
    from meshscale.topology.draw import topology_figure
    vm = from_dict({"name": "vm", "nodes": [{"name": "gpu0", "kind": "gpu", "index": 0, "model": "NVIDIA H100 80GB HBM3"},
                                            {"name": "pcie0", "kind": "pcie_switch"}, {"name": "cpu0", "kind": "cpu"}],
                    "links": [{"a": "gpu0", "b": "pcie0", "kind": "pcie", "generation": 5, "width": 16},
                              {"a": "pcie0", "b": "cpu0", "kind": "pcie", "generation": 5, "width": 16}]})
    one = topology_figure(vm).get_size_inches()
    eight = topology_figure(load_system("hgx-h100")).get_size_inches()
    assert one[0] <= 4.0 and one[0] < eight[0] / 2
