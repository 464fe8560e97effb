"""Discovery replayed from what NVML really answered on the lent 2x H200 machine (benchmarks/nvml_dump.py,
2026-11-21): NVSwitches hidden behind bus id FFFFFFFF:FF:FF.0, NVLink version enum 6 (= NVLink 4.0)."""
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from meshscale.topology import pair_bandwidth, relation, route
from meshscale.topology.nvml_discovery import nvml_topology

DUMP = json.loads((Path(__file__).parents[1] / "fixtures" / "nvml_h200x2.json").read_text())


class NVMLError(Exception):
    pass


class ReplayNVML:
    """Answers the pynvml calls discovery makes from the dump; anything the dump lacks is NotSupported."""

    NVMLError = NVMLError
    NVML_NVLINK_MAX_LINKS = 18
    NVML_FEATURE_ENABLED = 1
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_NVLINK_CAP_P2P_SUPPORTED = 0

    def __getattr__(self, name):  # every call not answered below
        def unsupported(*args):
            raise NVMLError(f"{name}: NotSupported")
        return unsupported

    def nvmlInit(self): pass
    def nvmlShutdown(self): pass
    def nvmlSystemGetDriverVersion(self): return DUMP["driver"]
    def nvmlSystemGetCudaDriverVersion(self): return DUMP["cuda_driver"]
    def nvmlDeviceGetCount(self): return len(DUMP["gpus"])
    def nvmlDeviceGetHandleByIndex(self, i): return i
    def nvmlDeviceGetName(self, h): return DUMP["gpus"][h]["name"]
    def nvmlDeviceGetUUID(self, h): return DUMP["gpus"][h]["uuid"]
    def nvmlDeviceGetPciInfo(self, h): return SimpleNamespace(busId=DUMP["gpus"][h]["bus_id"])
    def nvmlDeviceGetMemoryInfo(self, h): return SimpleNamespace(total=DUMP["gpus"][h]["memory_total"])
    def nvmlDeviceGetCurrPcieLinkGeneration(self, h): return DUMP["gpus"][h]["pcie_gen_cur"]
    def nvmlDeviceGetMaxPcieLinkGeneration(self, h): return DUMP["gpus"][h]["pcie_gen_max"]
    def nvmlDeviceGetCurrPcieLinkWidth(self, h): return DUMP["gpus"][h]["pcie_width_cur"]
    def nvmlDeviceGetMaxPcieLinkWidth(self, h): return DUMP["gpus"][h]["pcie_width_max"]
    def nvmlDeviceGetMigMode(self, h): return DUMP["gpus"][h]["mig_mode"]
    def nvmlDeviceGetCpuAffinity(self, h, n): return DUMP["gpus"][h]["cpu_affinity"][:n]
    def nvmlDeviceGetTopologyCommonAncestor(self, a, b): return DUMP["gpus"][a]["ancestor"][str(b)]
    def nvmlDeviceGetP2PStatus(self, a, b, cap): return 0

    def _link(self, h, link):
        entry = DUMP["gpus"][h]["links"][link]
        if "version" not in entry:
            raise NVMLError("link not supported")
        return entry

    def nvmlDeviceGetNvLinkState(self, h, link): return self._link(h, link)["state"]
    def nvmlDeviceGetNvLinkVersion(self, h, link): return self._link(h, link)["version"]
    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link): return self._link(h, link)["remote_type"]
    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link): return SimpleNamespace(busId=self._link(h, link)["remote_bus_id"])
    def nvmlDeviceGetNvLinkCapability(self, h, link, cap): return 1


def test_real_h200_pair_is_nv18_through_nvswitch():
    topo = nvml_topology(ReplayNVML(), sm_counts={})
    assert len(topo.gpus()) == 2
    assert [topo.nvlink_count(g) for g in topo.gpus()] == [18, 18]
    assert relation(topo, 0, 1) == "NV18"  # what nvidia-smi topo -m printed on that machine
    assert route(topo, "gpu0", "gpu1").fabric == "nvlink"
    assert pair_bandwidth(topo, 0, 1) == pytest.approx(18 * 25e9)
    assert {l.generation for l in topo.links if l.kind == "nvlink"} == {4}
