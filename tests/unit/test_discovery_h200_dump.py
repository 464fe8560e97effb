"""Discovery replayed from what NVML really answered on the lent 2x H200 machine (benchmarks/nvml_dump.py,
2026-11-21): NVSwitches hidden behind bus id FFFFFFFF:FF:FF.0, NVLink version enum 6 (= NVLink 4.0)."""
import pytest

from meshscale.topology import pair_bandwidth, relation, route
from meshscale.topology.nvml_discovery import nvml_topology

from conftest import FakeNVML


def test_real_h200_pair_is_nv18_through_nvswitch():
    topo = nvml_topology(FakeNVML.from_dump(), sm_counts={})
    assert len(topo.gpus()) == 2
    assert [topo.nvlink_count(g) for g in topo.gpus()] == [18, 18]
    assert relation(topo, 0, 1) == "NV18"  # what nvidia-smi topo -m printed on that machine
    assert route(topo, "gpu0", "gpu1").fabric == "nvlink"
    assert pair_bandwidth(topo, 0, 1) == pytest.approx(18 * 25e9)
    assert {l.generation for l in topo.links if l.kind == "nvlink"} == {4}
