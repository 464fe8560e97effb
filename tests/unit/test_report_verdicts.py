"""Verdicts: share of the bound, hints that name the cause, efficiency judgements."""
from __future__ import annotations

from meshscale.report.verdicts import (collective_verdict, expected_nvlinks, hints, scaling_verdict, share_verdict,
                                       topology_verdict)
from meshscale.topology import load_system
from meshscale.topology.model import Topology


def test_share_levels_and_text():
    good = share_verdict(92, 100, "link bound", [])
    assert good.level == "good" and good.text == "92% of the link bound — expected"
    bad = share_verdict(41, 100, "link bound", ["NVLink down"])
    assert bad.level == "bad" and bad.text.startswith("41% of the link bound — look at: NVLink down")
    assert share_verdict(60, 100, "x", []).level == "warn"


def test_expected_nvlinks_per_model():
    assert expected_nvlinks("Tesla P100-SXM2-16GB") == 4
    assert expected_nvlinks("Tesla V100-SXM2-32GB") == 6
    assert expected_nvlinks("NVIDIA A100-SXM4-80GB") == 12
    assert expected_nvlinks("NVIDIA H200") == 18
    assert expected_nvlinks("Tesla P100-PCIE-16GB") is None


def test_hints_name_knobs_cpu_and_missing_links():
    topo = load_system("dgx1-p100")
    assert hints({}, topo) == []
    assert any("NCCL_P2P_DISABLE" in h for h in hints({"NCCL_P2P_DISABLE": "1"}, topo))
    assert hints({"NCCL_P2P_DISABLE": "0"}) == []
    assert any("CPU fallback" in h for h in hints({}, None, cpu=True))
    # drop one NVLink of GPU 0: the topology verdict and the hints say so
    cut = next(i for i, l in enumerate(topo.links) if l.kind == "nvlink" and "gpu0" in (l.a, l.b))
    broken = Topology(topo.name, topo.nodes, [l for i, l in enumerate(topo.links) if i != cut], topo.title, topo.attrs)
    assert any("GPU0 has 3 of its 4 NVLinks" in h for h in hints({}, broken))
    assert topology_verdict(broken).level == "bad" and topology_verdict(topo).level == "good"
    narrow = Topology(topo.name, {n: type(v)(v.name, v.kind, dict(v.attrs)) for n, v in topo.nodes.items()},
                      topo.links, topo.title, topo.attrs)
    narrow.nodes["gpu5"].attrs.update(pcie_width=8, pcie_max_width=16, pcie_generation=1, pcie_max_generation=3)
    found = hints({}, narrow)
    assert len(found) == 1 and "GPU5's PCIe link runs x8 of x16" in found[0]  # the idle generation is no finding


def _rows(share):
    return [{"collective": "all_reduce", "size_bytes": s, "busbw_bytes_per_s": share * 1e9 * (s / 2**20),
             "bound_busbw_bytes_per_s": 1e9 * (s / 2**20), "wrong": 0} for s in (2**19, 2**20)]


def test_collective_verdict_uses_largest_size_and_cpu_context():
    assert collective_verdict(_rows(0.9), []).level == "good"
    low = collective_verdict(_rows(0.3), ["NCCL_P2P_DISABLE is set"])
    assert low.level == "bad" and "30%" in low.text and "NCCL_P2P_DISABLE" in low.text
    assert collective_verdict(_rows(0.3), [], cpu=True).level == "info"
    wrong = _rows(0.9)
    wrong[0]["wrong"] = 3
    assert collective_verdict(wrong, []).level == "bad"


def test_scaling_verdict_names_communication():
    rows = [{"world_size": 1, "mode": "weak", "efficiency": 1.0},
            {"world_size": 4, "mode": "weak", "efficiency": 0.5, "comm_share": 0.45, "step_time_s": 1.0, "data_s": 0.0}]
    v = scaling_verdict(rows, [])
    assert v.level == "bad" and "50%" in v.text and "communication takes 45%" in v.text
    rows[1]["efficiency"] = 0.93
    assert scaling_verdict(rows, []).level == "good"


def test_small_message_note_points_eager_gpu_runs_to_impl_nccl():
    from meshscale.report.verdicts import small_message_note
    rows = [{"size_bytes": 1024, "time_s": 32e-6}, {"size_bytes": 1 << 30, "time_s": 3e-3}]
    gpu = {"backend": "nccl", "spec": {"impl": "native"}}
    note = small_message_note(rows, gpu)
    assert note and "32 us" in note and "--impl nccl" in note
    assert small_message_note(rows, {"backend": "nccl", "spec": {"impl": "nccl"}}) is None  # already direct
    assert small_message_note(rows, {"backend": "gloo", "spec": {"impl": "native"}}) is None  # CPU workers
    assert small_message_note([{"size_bytes": 1024, "time_s": 12e-6}], gpu) is None  # not host-bound
