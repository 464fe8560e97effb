"""The tour on GPUs (run on the GPU machine: pytest -m gpu tests/integration/test_tour_gpu.py). It adapts to
the GPUs it finds: with one, the skips and what is measured and predicted instead; with two or more, the
pairs and the collective sweep."""
from __future__ import annotations

import pytest


@pytest.mark.gpu
def test_fast_tour_on_all_gpus(tmp_path):
    import torch

    from meshscale.app.tour import TourSettings, run_tour
    from meshscale.results import load_result

    n = torch.cuda.device_count()
    if n < 1:
        pytest.fail("no CUDA GPU visible to torch")
    outcome = run_tour(tmp_path, TourSettings(fast=True))
    statuses = {s.name: s.status for s in outcome.stages}
    page = outcome.index.read_text()
    if n == 1:
        assert statuses == {"discover": "done", "doctor": "done", "p2p": "skipped", "collective": "skipped",
                            "host-copy": "done", "scale": "skipped", "profile": "done", "sim": "skipped",
                            "predict": "done"}, outcome.stages
        assert "collective: one GPU, nothing to exchange; skipped" in page
        copies = load_result(tmp_path / "host-copy.json")
        assert {(r["direction"], r["memory"]) for r in copies.rows} == {
            (d, m) for d in ("host->device", "device->host") for m in ("pinned", "pageable")}
        assert all(r["bandwidth_bytes_per_s"] > 1e9 for r in copies.rows)  # any PCIe link moves > 1 GB/s
        assert load_result(tmp_path / "profile.json").meta["profile"]
        for name in ("predict-system", "predict-cluster"):
            assert load_result(tmp_path / f"{name}.json").predicted
        assert "1 GPU" in page and ("Host &lt;-&gt; device copies" in page or "Host <-> device copies" in page) and "Single-GPU training profile" in page
        assert "plot-busbw" not in page and "predicted from this" in page
        assert "DGX-1 whitepaper reference" not in page  # only this machine and what is predicted from it
        if torch.cuda.is_bf16_supported():
            assert load_result(tmp_path / "profile.json").meta.get("precision") == "bf16"
        doctor = load_result(tmp_path / "doctor.json")
        assert not [r for r in doctor.rows if r["status"] == "fail" and r["name"].startswith("nvlink")]
        return
    assert statuses == {s.name: "done" for s in outcome.stages}, outcome.stages
    p2p = load_result(tmp_path / "p2p.json")
    pairs = {(r["src"], r["dst"]) for r in p2p.rows if r["mode"] == "unidirectional"}
    gpu_pairs = {(a, b) for a, b in pairs if a.startswith("gpu") and b.startswith("gpu")}
    assert len(gpu_pairs) == n * (n - 1)
    assert {("host", f"gpu{i}") for i in range(n)} <= pairs  # host<->device copies are measured too
    collective = load_result(tmp_path / "collective.json")
    assert collective.meta["backend"] == "nccl" and not any(r["wrong"] for r in collective.rows)
    assert all(r["bound_busbw_bytes_per_s"] for r in collective.rows)
    assert f"{n} GPUs" in page and "No GPU on this machine" not in page
    assert page.count('class="plot"') >= 6
