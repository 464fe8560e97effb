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


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_InvalidArgument(NVMLError):
    pass


class FakeNVML:
    """The pynvml functions discovery calls, answering from a description. Handles are GPU indices (ints), MIG
    handles are (gpu, slot) tuples. ``paths[i]`` is GPU i's chain (cpu, host bridge, upper switch, leaf switch):
    common-ancestor levels are derived from it, so they are consistent like a real PCIe tree."""

    NVMLError = NVMLError
    NVML_NVLINK_MAX_LINKS = 18
    NVML_FEATURE_ENABLED = 1
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_NVLINK_CAP_P2P_SUPPORTED = 0

    def __init__(self, name, paths, nvlinks=None, unsupported=(), pcie=(4, 16), mig=None, nvlink_version=6):
        self.name, self.paths = name, paths
        self.nvlinks = nvlinks  # {gpu: [(remote bus id, remote type), ...]} or None for no NVLink
        self.unsupported = set(unsupported)
        self.pcie, self.mig, self.nvlink_version = pcie, mig or {}, nvlink_version
        self.initialized = 0

    def __getattribute__(self, name):
        if name.startswith("nvml") and name in object.__getattribute__(self, "unsupported"):
            def unsupported(*args):
                raise NVMLError_NotSupported(name)
            return unsupported
        return object.__getattribute__(self, name)

    def nvmlInit(self):
        self.initialized += 1

    def nvmlShutdown(self):
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self):
        return b"570.133.20"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12080

    def nvmlDeviceGetCount(self):
        return len(self.paths)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return f"{self.name} MIG 1g.10gb" if isinstance(h, tuple) else self.name

    def nvmlDeviceGetUUID(self, h):
        return f"MIG-{h[0]}-{h[1]}" if isinstance(h, tuple) else f"GPU-0000000{h}-1111-2222-3333-444444444444"

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=f"00000000:{0x18 + h:02X}:00.0".encode())

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=(10 << 30) if isinstance(h, tuple) else (80 << 30))

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return 1 if h == len(self.paths) - 1 else self.pcie[0]  # the last GPU idles at gen 1

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self.pcie[1]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self.pcie[0]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self.pcie[1]

    def nvmlDeviceGetNumaNodeId(self, h):
        return int(self.paths[h][0][-1])

    def nvmlDeviceGetCpuAffinity(self, h, words):
        socket = int(self.paths[h][0][-1])
        return [((1 << 8) - 1) << (8 * socket)] + [0] * (words - 1)  # 8 cores per socket

    def nvmlDeviceGetMigMode(self, h):
        return [1, 1] if h in self.mig else [0, 0]

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, k):
        if k >= self.mig.get(h, 0):
            raise NVMLError("Not Found")
        return (h, k)

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        pa, pb = self.paths[a], self.paths[b]
        shared = next((k for k in range(4) if pa[k] != pb[k]), 4)  # length of the common prefix
        return {0: 50, 1: 40, 2: 30, 3: 20, 4: 10}[shared]

    def nvmlDeviceGetP2PStatus(self, a, b, cap):
        return 0 if self.paths[a][0] == self.paths[b][0] else 1  # CNS across sockets

    def _link(self, h, link):
        if self.nvlinks is None:
            raise NVMLError_NotSupported("no NVLink")
        if link >= len(self.nvlinks[h]):
            raise NVMLError_InvalidArgument("no such link")
        return self.nvlinks[h][link]

    def nvmlDeviceGetNvLinkState(self, h, link):
        self._link(h, link)
        return 1

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return SimpleNamespace(busId=self._link(h, link)[0].encode())

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        return self._link(h, link)[1]

    def nvmlDeviceGetNvLinkVersion(self, h, link):
        self._link(h, link)
        return self.nvlink_version

    def nvmlDeviceGetNvLinkCapability(self, h, link, cap):
        self._link(h, link)
        return 1


SWITCH_BUSES = [f"00000000:{b:02X}:00.0" for b in (0xA0, 0xA1, 0xA2, 0xA3)]


def nvswitch_machine(gpus=4, **kw):
    """GPUs on two sockets, 18 NVLink 4 links each split 5/4/4/5 over 4 NVSwitches."""
    paths = [(f"c{g // 2}", f"hb{g // 2}", f"up{g}", f"leaf{g}") for g in range(gpus)]
    split = [bus for bus, n in zip(SWITCH_BUSES, (5, 4, 4, 5)) for _ in range(n)]
    nvlinks = {g: [(bus, 2) for bus in split] for g in range(gpus)}
    return FakeNVML("NVIDIA H100 80GB HBM3", paths, nvlinks, **kw)


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
    fake = nvswitch_machine(nvlink_version=4)  # NVML_NVLINK_VERSION_3_0
    fake.name = "NVIDIA Future GPU"
    topo = nvml_topology(fake, sm_counts={})
    assert topo.nodes["gpu0"].attrs["nvlink_generation"] == 3
    assert topo.nodes["gpu0"].attrs["nvlink_version_nvml"] == 4


def test_pcie_machine_relations_match_nvml_levels():
    fake = FakeNVML("Tesla P100-PCIE-16GB", PCIE_PATHS, pcie=(3, 16))
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
    topo = nvml_topology(FakeNVML("Tesla V100-SXM2-16GB", paths, nvlinks, nvlink_version=2), sm_counts={})
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
    fake = FakeNVML("Some GPU", PCIE_PATHS[:2], unsupported=optional)
    topo = nvml_topology(fake, sm_counts={})
    assert len(topo.gpus()) == 2 and topo.nodes_of("cpu")
    assert set(topo.attrs["nvml_unsupported"]) >= optional - {"nvmlDeviceGetNumaNodeId"}
    assert relation(topo, 0, 1) in ("PIX", "PHB")
    assert pair_bandwidth(topo, 0, 1) > 0


@pytest.mark.parametrize("fake", [nvswitch_machine(), FakeNVML("Tesla P100-PCIE-16GB", PCIE_PATHS)])
def test_discovered_topology_round_trips_through_json(fake):
    topo = nvml_topology(fake, sm_counts={})
    assert from_dict(json.loads(dumps(topo))) == topo


class BrokenNVML:
    NVMLError = NVMLError

    def nvmlInit(self):
        raise NVMLError("Driver Not Loaded")


def test_no_nvml_gives_cpu_topology_and_a_one_line_notice():
    with pytest.raises(NoGPU):
        nvml_topology(BrokenNVML())
    found = discover(workers=3, nvml=BrokenNVML())
    assert found.topology.device_kind == "worker" and len(found.topology.devices()) == 3
    assert "no NVIDIA GPU" in found.notice and "Driver Not Loaded" in found.notice
    assert "\n" not in found.notice


def test_zero_gpus_is_no_gpu():
    with pytest.raises(NoGPU, match="no GPU"):
        nvml_topology(FakeNVML("x", []), sm_counts={})


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
    unknown = FakeNVML("Mystery GPU", PCIE_PATHS[:2])
    assert "fp32_flops" not in nvml_topology(unknown, sm_counts={}).nodes["gpu0"].attrs


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
    fake.nvlinks = {g: [(bus, 0xFF) for bus, _ in links] for g, links in fake.nvlinks.items()}
    topo = nvml_topology(fake, sm_counts={})
    assert len(topo.nodes_of("nvswitch")) == 4 and all(topo.nvlink_count(g) == 18 for g in topo.gpus())
