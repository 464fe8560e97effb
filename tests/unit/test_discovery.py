"""Discovery against a fake NVML module: an NVSwitch machine, a 2-socket PCIe machine, direct NVLinks, MIG, a
driver that supports almost nothing, and no NVML at all."""
import itertools
import json
from types import SimpleNamespace

import pytest

from meshscale.errors import MeshscaleError
from meshscale.topology import dumps, from_dict, pair_bandwidth, relation, route
from meshscale.topology.discover import discover
from meshscale.topology.nvml_discovery import LEVEL_RELATION, NoGPU, nvml_topology
from meshscale.topology.text import relation_matrix

from conftest import FakeNVML, NVMLError


SWITCH_BUSES = [f"00000000:{b:02X}:00.0" for b in (0xA0, 0xA1, 0xA2, 0xA3)]


def nvswitch_machine(gpus=4, **kw):
    """GPUs on two sockets, 18 NVLink 4 links each split 5/4/4/5 over 4 NVSwitches."""
    paths = [(f"c{g // 2}", f"hb{g // 2}", f"up{g}", f"leaf{g}") for g in range(gpus)]
    split = [bus for bus, n in zip(SWITCH_BUSES, (5, 4, 4, 5)) for _ in range(n)]
    nvlinks = {g: [(bus, 2) for bus in split] for g in range(gpus)}
    kw.setdefault("name", "NVIDIA H100 80GB HBM3")
    return FakeNVML.machine(paths=paths, nvlinks=nvlinks, **kw)


PCIE_PATHS = [  # (cpu, host bridge, upper switch, leaf switch) per GPU: every level of nvidia-smi appears
    ("c0", "hb0", "up0", "leaf0"),
    ("c0", "hb0", "up0", "leaf0"),  # 0-1 PIX
    ("c0", "hb0", "up0", "leaf1"),  # 0-2 PXB
    ("c0", "hb0", "up1", "leaf2"),  # 0-3 PHB
    ("c0", "hb1", "up2", "leaf3"),  # 0-4 NODE
    ("c1", "hb2", "up3", "leaf4"),  # 0-5 SYS
    ("c1", "hb2", "up3", "leaf4"),  # 5-6 PIX
    ("c1", "hb2", "up4", "leaf5"),  # 5-7 PHB
]


def test_nvswitch_machine_is_nv18_everywhere():
    fake = nvswitch_machine()
    topo = nvml_topology(fake, sm_counts={"00000000-1111-2222-3333-444444444444": 132})
    assert fake.initialized == 0  # nvmlShutdown was called
    assert len(topo.gpus()) == 4 and len(topo.nodes_of("nvswitch")) == 4
    for g in topo.gpus():
        assert topo.nvlink_count(g) == 18
        assert topo.nodes[g].attrs["nvlink_generation"] == 4
    for a, b in itertools.combinations(range(4), 2):
        assert relation(topo, a, b) == "NV18"
        assert route(topo, f"gpu{a}", f"gpu{b}").fabric == "nvlink"
        assert pair_bandwidth(topo, a, b) == pytest.approx(18 * 25e9)
    counts = sorted(l.count for l in topo.links_of("gpu0", "nvlink"))
    assert counts == [4, 4, 5, 5]
    assert topo.nodes["gpu0"].attrs["sm_count"] == 132
    assert topo.nodes["gpu0"].attrs["model"] == "NVIDIA H100 80GB HBM3"
    assert topo.nodes["gpu0"].attrs["memory_bytes"] == 80 << 30
    assert "NV18" in relation_matrix(topo)


def test_remote_type_unsupported_still_finds_the_switches():
    fake = nvswitch_machine(unsupported={"nvmlDeviceGetNvLinkRemoteDeviceType", "nvmlDeviceGetNvLinkVersion"})
    topo = nvml_topology(fake, sm_counts={})
    assert len(topo.nodes_of("nvswitch")) == 4
    assert all(relation(topo, a, b) == "NV18" for a, b in itertools.combinations(range(4), 2))
    assert topo.nodes["gpu1"].attrs["nvlink_generation"] == 4  # from the model name
    assert "nvmlDeviceGetNvLinkRemoteDeviceType" in topo.attrs["nvml_unsupported"]


def test_unknown_model_takes_generation_from_the_nvml_version_enum():
    fake = nvswitch_machine(nvlink_version=4, name="NVIDIA Future GPU")  # NVML_NVLINK_VERSION_3_0
    topo = nvml_topology(fake, sm_counts={})
    assert topo.nodes["gpu0"].attrs["nvlink_generation"] == 3
    assert topo.nodes["gpu0"].attrs["nvlink_version_nvml"] == 4


def test_pcie_machine_relations_match_nvml_levels():
    fake = FakeNVML.machine("Tesla P100-PCIE-16GB", paths=PCIE_PATHS, nvlinks=None, pcie=(3, 16), pcie_now={7: (1, 16)})
    topo = nvml_topology(fake, sm_counts={})
    assert not topo.nodes_of("nvswitch") and all(topo.nvlink_count(g) == 0 for g in topo.gpus())
    assert len(topo.nodes_of("cpu")) == 2
    seen = set()
    for a, b in itertools.combinations(range(8), 2):
        expected = LEVEL_RELATION[fake.nvmlDeviceGetTopologyCommonAncestor(a, b)]
        assert relation(topo, a, b) == expected, (a, b)
        assert topo.attrs["pcie_levels"][f"{a}-{b}"] == expected
        seen.add(expected)
    assert seen == {"PIX", "PXB", "PHB", "NODE", "SYS"}
    assert route(topo, "gpu0", "gpu5").fabric == "pcie"
    assert pair_bandwidth(topo, 0, 1) == pytest.approx(15.754e9, rel=1e-3)
    # link bandwidth follows what the link can do (GPU7 idles at gen 1, which would understate it); both kept
    gpu7 = topo.nodes["gpu7"].attrs
    assert (gpu7["pcie_generation"], gpu7["pcie_max_generation"]) == (1, 3)
    assert pair_bandwidth(topo, 5, 7) == pytest.approx(15.754e9, rel=1e-3)
    assert topo.nodes["gpu5"].attrs["numa"] == 1 and topo.nodes["gpu5"].attrs["cpu_affinity"] == "8-15"
    assert topo.nodes["gpu0"].attrs["cpu_affinity"] == "0-7"
    assert topo.attrs["p2p"]["0-1"]["read"] == "OK" and topo.attrs["p2p"]["0-5"]["read"] == "CNS"
    assert "nvmlDeviceGetNvLinkState" in topo.attrs["nvml_unsupported"]


def test_direct_nvlinks_are_bonded_into_counts():
    paths = [("c0", "hb0", f"up{g}", f"leaf{g}") for g in range(4)]
    bus = [f"00000000:{0x18 + g:02X}:00.0" for g in range(4)]
    # 0-1 two links, 0-2 one, 2-3 two, 1-3 one (each seen from both ends)
    pairs = {(0, 1): 2, (0, 2): 1, (2, 3): 2, (1, 3): 1}
    nvlinks = {g: [] for g in range(4)}
    for (a, b), n in pairs.items():
        nvlinks[a] += [(bus[b], 0)] * n
        nvlinks[b] += [(bus[a], 0)] * n
    topo = nvml_topology(FakeNVML.machine("Tesla V100-SXM2-16GB", paths=paths, nvlinks=nvlinks, nvlink_version=2), sm_counts={})
    for (a, b), n in pairs.items():
        assert relation(topo, a, b) == f"NV{n}"
        assert pair_bandwidth(topo, a, b) >= n * 25e9
    assert relation(topo, 0, 3) == "PHB"
    assert topo.nvlink_count("gpu0") == 3


def test_mig_instances_are_listed():
    topo = nvml_topology(nvswitch_machine(mig={1: 2}), sm_counts={})
    assert topo.nodes["gpu0"].attrs["mig_mode"] == "disabled"
    gpu1 = topo.nodes["gpu1"].attrs
    assert gpu1["mig_mode"] == "enabled" and len(gpu1["mig_instances"]) == 2
    assert gpu1["mig_instances"][0]["memory_bytes"] == 10 << 30


def test_a_driver_that_supports_little_gives_a_partial_valid_topology():
    optional = {"nvmlDeviceGetTopologyCommonAncestor", "nvmlDeviceGetCurrPcieLinkGeneration",
                "nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetMaxPcieLinkWidth",
                "nvmlDeviceGetCpuAffinity", "nvmlDeviceGetNumaNodeId", "nvmlDeviceGetMigMode", "nvmlDeviceGetP2PStatus",
                "nvmlDeviceGetNvLinkState", "nvmlDeviceGetUUID", "nvmlSystemGetCudaDriverVersion"}
    fake = FakeNVML.machine("Some GPU", paths=PCIE_PATHS[:2], nvlinks=None, unsupported=optional)
    topo = nvml_topology(fake, sm_counts={})
    assert len(topo.gpus()) == 2 and topo.nodes_of("cpu")
    assert set(topo.attrs["nvml_unsupported"]) >= optional - {"nvmlDeviceGetNumaNodeId"}
    assert relation(topo, 0, 1) in ("PIX", "PHB")
    assert pair_bandwidth(topo, 0, 1) > 0


@pytest.mark.parametrize("fake", [nvswitch_machine(), FakeNVML.machine("Tesla P100-PCIE-16GB", paths=PCIE_PATHS, nvlinks=None)])
def test_discovered_topology_round_trips_through_json(fake):
    topo = nvml_topology(fake, sm_counts={})
    assert from_dict(json.loads(dumps(topo))) == topo


def test_no_nvml_gives_cpu_topology_and_a_one_line_notice():
    with pytest.raises(NoGPU):
        nvml_topology(FakeNVML.machine(init_error="Driver Not Loaded"))
    found = discover(workers=3, nvml=FakeNVML.machine(init_error="Driver Not Loaded"))
    assert found.topology.device_kind == "worker" and len(found.topology.devices()) == 3
    assert "no NVIDIA GPU" in found.notice and "Driver Not Loaded" in found.notice
    assert "\n" not in found.notice


def test_zero_gpus_is_no_gpu():
    with pytest.raises(NoGPU, match="no GPU"):
        nvml_topology(FakeNVML.machine("x", gpus=0), sm_counts={})


def test_discover_on_this_machine_never_raises():
    found = discover(workers=2)
    assert found.topology.devices()
    if found.topology.device_kind == "worker":
        assert found.notice.startswith("no NVIDIA GPU")


def test_an_unexpected_nvml_answer_is_one_line_not_a_traceback():
    fake = nvswitch_machine()
    fake.nvmlDeviceGetHandleByIndex = lambda i: (_ for _ in ()).throw(NVMLError("Insufficient Permissions"))
    with pytest.raises(MeshscaleError, match="NVML discovery failed .*Insufficient Permissions.*--system"):
        discover(nvml=fake)


def test_known_models_get_catalog_facts_and_nvml_wins():
    topo = nvml_topology(nvswitch_machine(), sm_counts={"00000000-1111-2222-3333-444444444444": 130})
    gpu = topo.nodes["gpu0"].attrs
    assert gpu["memory_bandwidth_bytes_per_s"] == pytest.approx(3.35e12) and gpu["bf16_flops"] > 0
    assert gpu["sm_count"] == 130 and gpu["facts_from"] == "catalog hgx-h100"
    assert "assumed" not in topo.attrs and "facts_assumed" not in gpu


def test_an_unknown_model_gets_the_stated_default_and_says_so():
    unknown = FakeNVML.machine("Mystery GPU", paths=PCIE_PATHS[:2], nvlinks=None)
    topo = nvml_topology(unknown, sm_counts={})
    gpu = topo.nodes["gpu0"].attrs
    assert gpu["fp32_flops"] == pytest.approx(20e12) and gpu["bf16_flops"] == pytest.approx(200e12)
    assert gpu["facts_assumed"] and gpu["memory_bandwidth_bytes_per_s"] == pytest.approx(1e12)
    assert topo.attrs["assumed"][0].startswith("assumed: gpu0 (Mystery GPU): assumed: an A100-class PCIe card")
    assert "Mystery GPU" in discover(nvml=FakeNVML.machine("Mystery GPU", paths=PCIE_PATHS[:2], nvlinks=None)).notice


@pytest.mark.parametrize("name, source, nvlinks, fp32, bandwidth", [
    ("NVIDIA H100 PCIe", "H100 PCIe", 0, 51e12, 2.0e12),
    ("NVIDIA H100 NVL", "H100 NVL", 0, 60e12, 3.9e12),
    ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe", 0, 19.5e12, 1.935e12),
    ("NVIDIA L40S", "L40S", 0, 91.6e12, 864e9),
    ("NVIDIA A10", "A10", 0, 31.2e12, 600e9),
    ("Tesla T4", "T4", 0, 8.1e12, 320e9),
    ("Tesla V100-PCIE-32GB", "V100 32GB PCIe", 0, 14e12, 900e9),
    ("Tesla V100-PCIE-16GB", "V100 PCIe", 0, 14e12, 900e9),
])
def test_gpus_outside_the_catalog_take_facts_from_the_table_of_models(name, source, nvlinks, fp32, bandwidth):
    gpu = nvml_topology(FakeNVML.machine(name, paths=PCIE_PATHS[:1], nvlinks=None), sm_counts={}).nodes["gpu0"].attrs
    assert gpu["facts_from"].startswith(f"{source}: NVIDIA ") and "datasheet" in gpu["facts_from"]
    assert gpu["model_nvlinks"] == nvlinks and gpu["fp32_flops"] == pytest.approx(fp32)
    assert gpu["memory_bandwidth_bytes_per_s"] == pytest.approx(bandwidth) and "facts_assumed" not in gpu


def test_a_single_gpu_with_idle_links_reports_them_and_its_generation():
    fake = FakeNVML.machine("NVIDIA H100 80GB HBM3", gpus=1, links_down={0: 18})
    gpu = nvml_topology(fake, sm_counts={}).nodes["gpu0"].attrs
    assert gpu["nvlinks"] == 0 and gpu["nvlinks_reported"] == 18 and gpu["model_nvlinks"] == 18
    assert gpu["nvlink_generation"] == 4 and gpu["bf16_flops"] == pytest.approx(989.4e12)


def test_cpu_topology_round_trips_through_json():
    from meshscale.topology.discover import cpu_topology
    topo = cpu_topology(3)
    assert from_dict(json.loads(dumps(topo))) == topo


@pytest.mark.gpu
def test_real_machine_matches_nvidia_smi():
    """On a GPU machine: every GPU-GPU cell of our matrix equals `nvidia-smi topo -m`, and NVLink counts agree."""
    import re
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        pytest.skip("nvidia-smi not found")
    topo = discover().topology
    assert topo.device_kind == "gpu"
    smi = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=60).stdout
    rows = [l.split() for l in smi.splitlines() if re.match(r"\s*GPU\d+\s", l)]
    assert len(rows) == len(topo.gpus())
    for row in rows:
        i = int(row[0][3:])
        assert [relation(topo, i, j) for j in range(len(rows))] == row[1:1 + len(rows)], row
    for g in topo.gpus():
        if topo.nodes[g].attrs.get("nvlinks"):
            assert topo.nvlink_count(g) == topo.nodes[g].attrs["nvlinks"]


def test_unknown_remote_type_is_decided_by_the_bus_id():
    fake = nvswitch_machine()
    for gpu in fake.gpus:
        for link in gpu["links"]:
            link["remote_type"] = 0xFF
    topo = nvml_topology(fake, sm_counts={})
    assert len(topo.nodes_of("nvswitch")) == 4 and all(topo.nvlink_count(g) == 18 for g in topo.gpus())
