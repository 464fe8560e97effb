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


def _h200_rows(share, size=1 << 30, time_s=None):
    """An all_gather row on 2 H200 at ``share`` of the corpus figure (nccl-tests-h200x2: 1 GiB about 280 GB/s)."""
    from meshscale.report.expected import corpus_expected
    expected = corpus_expected("NVIDIA H200", 2, "all_gather", size, False)
    busbw = share * expected.busbw_bytes_per_s
    return [{"collective": "all_gather", "size_bytes": size, "inplace": False, "busbw_bytes_per_s": busbw,
             "time_s": time_s or size / 2 / busbw, "bound_busbw_bytes_per_s": 450e9, "wrong": 0}], expected


def _refs(topo=None):
    from meshscale.report.expected import references
    return lambda r: references(topo, "NVIDIA H200", 2, r["collective"], r["size_bytes"], bool(r.get("inplace")))


def test_collective_at_60_percent_of_the_corpus_figure_warns_naming_it():
    rows, expected = _h200_rows(0.60)
    v = collective_verdict(rows, [], references=_refs())
    assert v.level == "warn"
    assert f"expected about {expected.busbw_bytes_per_s / 1e9:.3g} GB/s" in v.text
    assert "nccl-tests, 2x H200" in v.text and "(60%)" in v.text


def test_healthy_run_and_small_message_spread_give_no_warning():
    rows, _ = _h200_rows(0.95)
    assert collective_verdict(rows, [], references=_refs()).level in ("good", "info")
    small, _ = _h200_rows(0.70, size=64 << 10)
    v = collective_verdict(small, [], references=_refs())
    assert v.level not in ("warn", "bad") and "(70%)" in v.text
    well_above, _ = _h200_rows(1.6)
    assert collective_verdict(well_above, [], references=_refs()).level not in ("warn", "bad")


def test_model_gap_beyond_its_known_error_is_a_finding():
    topo = load_system("hgx-h200")
    from meshscale.report.expected import model_expected
    model = model_expected(topo, 2, "all_gather", 1 << 30)
    assert model.basis == "model" and "known error" in model.source
    rows, expected = _h200_rows(1.0)
    rows[0]["busbw_bytes_per_s"] = model.busbw_bytes_per_s * 0.3  # far off the model, inside no spread either
    v = collective_verdict(rows, [], references=lambda r: (None, model))
    assert v.level in ("warn", "bad") and "NCCL cost model" in v.text
    # the corpus says the machine is healthy, the model is far off: a finding, not a warning
    far = type(model)(expected.busbw_bytes_per_s * 3, model.floor, model.source, "model", model.error)
    v = collective_verdict(_h200_rows(1.0)[0], [], references=lambda r: (expected, far))
    assert v.level == "info" and "Finding" in v.text and "the model or the machine is off" in v.text
    assert f"known error here is {model.error:.0%}" in v.text


def test_staged_copies_are_judged_against_the_measured_host_path():
    from meshscale.report.verdicts import host_path_rates, p2p_verdict
    rows = [{"src": "gpu0", "dst": "host", "mode": "unidirectional", "bandwidth_bytes_per_s": 55e9},
            {"src": "host", "dst": "gpu1", "mode": "unidirectional", "bandwidth_bytes_per_s": 55e9},
            {"src": "gpu1", "dst": "host", "mode": "unidirectional", "bandwidth_bytes_per_s": 55e9},
            {"src": "host", "dst": "gpu0", "mode": "unidirectional", "bandwidth_bytes_per_s": 55e9}]
    rates = host_path_rates(rows)
    assert abs(rates[("gpu0", "gpu1")] - 27.5e9) < 1e6
    staged = [{"src": "gpu0", "dst": "gpu1", "mode": "staged", "bandwidth_bytes_per_s": 27.6e9},
              {"src": "gpu1", "dst": "gpu0", "mode": "staged", "bandwidth_bytes_per_s": 27.5e9}]
    v = p2p_verdict(staged, rates, [], "host path")
    assert v.level == "good" and "host path" in v.text


def test_no_efficiency_without_a_one_rank_baseline():
    lone = [{"world_size": 2, "mode": "weak", "efficiency": 1.0, "throughput_samples_per_s": 3000.0}]
    v = scaling_verdict(lone, [])
    assert v.level == "info" and "no one-rank baseline measured: efficiency not stated" in v.text
    assert "100%" not in v.text
    two = lone + [{"world_size": 4, "mode": "weak", "efficiency": 0.9, "throughput_samples_per_s": 5400.0}]
    assert "90% of linear" in scaling_verdict(two, []).text


def test_scaling_prediction_gap_is_a_finding():
    from meshscale.report.verdicts import scaling_gap
    measured = [{"world_size": 1, "speedup": 1.0, "throughput_samples_per_s": 100.0},
                {"world_size": 2, "speedup": 0.72, "throughput_samples_per_s": 72.0}]
    predicted = [{"world_size": 1, "speedup": 1.0, "throughput_samples_per_s": 100.0},
                 {"world_size": 2, "speedup": 1.85, "throughput_samples_per_s": 185.0}]
    found = scaling_gap(measured, predicted)
    assert "1.85x speedup predicted, 0.72x measured" in found and "model or the machine is off" in found
    predicted[1].update(speedup=0.75, throughput_samples_per_s=75.0)
    assert scaling_gap(measured, predicted) == ""


def test_one_gpu_without_nvlink_peers_is_not_a_down_link():
    from meshscale.report.verdicts import hints, topology_verdict
    from meshscale.topology import load_system, subset
    one = subset(load_system("hgx-h100"), [0])
    one.links = [l for l in one.links if l.kind != "nvlink"]  # one SXM GPU in a VM: NVML shows no NVLink peer
    assert topology_verdict(one).level == "info" and "no peer visible" in topology_verdict(one).text
    assert not [h for h in hints({}, one) if "NVLink" in h]
    board = load_system("hgx-h100")
    broken = subset(board, list(range(8)))
    gpu = broken.gpus()[0]
    broken.links = [l for l in broken.links if not (l.kind == "nvlink" and gpu in (l.a, l.b))][:]  # GPU0 lost its links
    assert any("NVLinks: a link is down" in h for h in hints({}, broken))


def test_eager_run_is_judged_above_its_own_per_call_floor():
    """An eager GPU run whose every call costs 45 us (this host's launch path) is healthy up to the size where the
    link takes over; the same run with its largest size at 60% of nccl-tests still warns."""
    from meshscale.report.verdicts import EAGER_CALL_S, per_call_floor_s
    meta = {"backend": "nccl", "spec": {"impl": "native"}}
    rows = []
    for size in (64 << 10, 1 << 20, 4 << 20):
        row, _ = _h200_rows(1.0, size=size)
        row[0]["time_s"] = 45e-6 + size / 2 / 300e9
        row[0]["busbw_bytes_per_s"] = size / 2 / row[0]["time_s"]
        rows += row
    big, _ = _h200_rows(0.97)
    floor = per_call_floor_s(rows + big, meta)
    assert abs(floor - rows[0]["time_s"]) < 1e-9 and floor > EAGER_CALL_S
    assert per_call_floor_s(rows, {"backend": "nccl", "spec": {"impl": "nccl"}}) == 0.0  # NCCL called directly
    v = collective_verdict(rows + big, [], references=_refs(), floor_s=floor)
    assert v.level not in ("warn", "bad"), v.text
    assert collective_verdict(rows + big, [], references=_refs()).level in ("warn", "bad")  # no floor: it warns
    slow, _ = _h200_rows(0.60)
    v = collective_verdict(rows + slow, [], references=_refs(), floor_s=floor)
    assert v.level == "warn" and "(60%)" in v.text


def test_scaling_efficiency_is_judged_against_the_prediction_of_the_same_series():
    measured = [{"world_size": 1, "mode": "strong", "efficiency": 1.0},
                {"world_size": 2, "mode": "strong", "efficiency": 0.78, "speedup": 1.56}]
    predicted = [{"world_size": 2, "mode": "strong", "efficiency": 0.88, "speedup": 1.75}]
    assert scaling_verdict(measured, []).level == "warn"  # no prediction: judged against linear
    v = scaling_verdict(measured, [], predicted)
    assert v.level == "good" and "predicted 88%" in v.text and "expected" in v.text
    measured[1]["efficiency"] = 0.60  # far below what the model expects: still a warning
    assert scaling_verdict(measured, [], predicted).level in ("warn", "bad")
