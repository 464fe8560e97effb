"""Every catalog system written as NCCL's topology dump and as `nvidia-smi topo -m` text reads back with the
same GPU matrix (the oracle: the catalog's own matrix); files that are neither are refused in one line."""
import re

import pytest

from meshscale.topology import from_dict, load_system, system_names, to_dict
from meshscale.topology.foreign import (LEVELS, load_foreign, read_nccl_xml, read_topo_text, to_nccl_xml,
                                        to_topo_text)
from meshscale.topology.text import relation_matrix


def _gpu_block(topology) -> list[list[str]]:
    """The GPU x GPU relations of the matrix (NIC columns and affinity left aside)."""
    n = len(topology.devices())
    rows = [line.split() for line in relation_matrix(topology, bandwidth=False).splitlines()[1:1 + n]]
    return [row[1:1 + n] for row in rows]


@pytest.mark.parametrize("name", system_names())
@pytest.mark.parametrize("fmt", ["xml", "txt", "json"])
def test_every_catalog_system_round_trips_through_each_format(tmp_path, name, fmt):
    catalog = load_system(name)
    path = tmp_path / f"{name}.{fmt}"
    writers = {"xml": to_nccl_xml, "txt": to_topo_text, "json": lambda t: __import__("json").dumps(to_dict(t))}
    path.write_text(writers[fmt](catalog))
    back = load_system(str(path))
    assert _gpu_block(back) == _gpu_block(catalog)
    assert [back.nodes[g].attrs["model"] for g in back.gpus()] == [catalog.nodes[g].attrs["model"] for g in catalog.gpus()] \
        or fmt == "xml"  # a dump names no model: it comes from the compute capability, and says so
    if fmt != "json":
        assert back.attrs["assumed"], back.attrs


def test_a_dump_s_pcie_tree_gives_nvidia_smi_s_levels():
    # two GPUs under one switch (a port bridge each, as sysfs shows it), a third under a second switch of the
    # same CPU, a fourth on the other CPU
    xml = """<system version="1">
      <cpu numaid="0" affinity="0000ffff"><pci busid="0000:01:00.0" class="0x060400">
        <pci busid="0000:02:00.0" class="0x060400"><pci busid="0000:03:00.0" class="0x030200"><gpu dev="0" sm="80"/></pci></pci>
        <pci busid="0000:04:00.0" class="0x060400"><pci busid="0000:05:00.0" class="0x030200"><gpu dev="1" sm="80"/></pci></pci>
      </pci><pci busid="0000:11:00.0" class="0x060400"><pci busid="0000:12:00.0" class="0x030200"><gpu dev="2" sm="80"/></pci></pci></cpu>
      <cpu numaid="1" affinity="ffff0000"><pci busid="0000:81:00.0" class="0x030200"><gpu dev="3" sm="80"/></pci></cpu>
    </system>"""
    seen = read_nccl_xml(xml)
    assert seen.levels == {(0, 1): LEVELS["PIX"], (0, 2): LEVELS["PHB"], (1, 2): LEVELS["PHB"],
                           (0, 3): LEVELS["SYS"], (1, 3): LEVELS["SYS"], (2, 3): LEVELS["SYS"]}
    assert [g.cpu_affinity for g in seen.gpus] == ["0-15", "0-15", "0-15", "16-31"]


def test_text_with_nvlink_pairs_takes_their_pcie_level_from_the_other_pairs():
    text = """GPU 0: NVIDIA A100 80GB PCIe
GPU 1: NVIDIA A100 80GB PCIe
GPU 2: NVIDIA A100 80GB PCIe
        GPU0    GPU1    GPU2    CPU Affinity    NUMA Affinity
GPU0     X      NV12    PIX     0-15            0
GPU1    NV12     X      PIX     0-15            0
GPU2    PIX     PIX      X      0-15            0
"""
    seen = read_topo_text(text)
    assert seen.levels[(0, 1)] == LEVELS["PIX"] and seen.gpus[0].nvlinks_to_gpus == {1: 12}


@pytest.mark.parametrize("count", ["²", "①", "٣", "9" * 5001])
def test_an_nvlink_count_of_other_than_ascii_digits_is_refused_in_one_line(cli, tmp_path, count):
    path = tmp_path / "topo.txt"
    path.write_text(f"""        GPU0    GPU1    CPU Affinity    NUMA Affinity
GPU0     X      NV{count}    0-15            0
GPU1    NV{count}     X      0-15            0
""")
    run = cli("topo", "--system", str(path))
    assert run.exit_code == 2 and re.fullmatch(r"meshscale: error: [^\n]+\n", run.stderr), run.stderr
    assert "unknown relation" in run.stderr


@pytest.mark.parametrize("content, suffix", [("<html><body>hello</body></html>", ".xml"), ("<system><cpu/>", ".xml"),
                                             ("GPU0 X NV1\nGPU1 NV1\n", ".txt"), ("hello\n", ".txt")])
def test_files_that_are_not_a_dump_or_topo_text_are_refused_in_one_line(cli, tmp_path, content, suffix):
    path = tmp_path / f"machine{suffix}"
    path.write_text(content)
    run = cli("topo", "--system", str(path))
    assert run.exit_code == 2
    assert re.fullmatch(r"meshscale: error: [^\n]+\n", run.stderr), run.stderr
    assert str(path) in run.stderr


@pytest.mark.parametrize("name", ["dgx1-v100", "hgx-h100"])
def test_topo_of_an_nccl_dump_prints_the_catalog_s_gpu_matrix(cli, tmp_path, name):
    catalog = load_system(name)
    dump = tmp_path / f"{name}.xml"
    dump.write_text(to_nccl_xml(catalog))
    run = cli("topo", "--system", str(dump))
    assert run.exit_code == 0, run.output
    n = len(catalog.devices())
    rows = [line.split() for line in run.stdout.splitlines() if re.match(r"GPU\d+ ", line)][:n]  # the relation matrix
    assert [row[0] for row in rows] == [f"GPU{i}" for i in range(n)]
    assert [row[1:1 + n] for row in rows] == _gpu_block(catalog)
    assert "GPU model from the compute capability" in run.stderr  # what the dump lacked, stated
