"""The tour on GPUs (run on the GPU machine: pytest -m gpu tests/integration/test_tour_gpu.py)."""
from __future__ import annotations

import pytest


@pytest.mark.gpu
def test_fast_tour_on_all_gpus(tmp_path):
    import torch

    from meshscale.report.tour import TourSettings, run_tour
    from meshscale.results import load_result

    n = torch.cuda.device_count()
    if n < 2:
        pytest.fail(f"this test needs 2 or more GPUs, found {n}")
    outcome = run_tour(tmp_path, TourSettings(fast=True))
    assert {s.name: s.status for s in outcome.stages} == {s.name: "done" for s in outcome.stages}, outcome.stages
    p2p = load_result(tmp_path / "p2p.json")
    pairs = {(r["src"], r["dst"]) for r in p2p.rows if r["mode"] == "unidirectional"}
    gpu_pairs = {(a, b) for a, b in pairs if a.startswith("gpu") and b.startswith("gpu")}
    assert len(gpu_pairs) == n * (n - 1)
    assert {("host", f"gpu{i}") for i in range(n)} <= pairs  # host<->device copies are measured too
    collective = load_result(tmp_path / "collective.json")
    assert collective.meta["backend"] == "nccl" and not any(r["wrong"] for r in collective.rows)
    assert all(r["bound_busbw_bytes_per_s"] for r in collective.rows)
    page = outcome.index.read_text()
    assert f"{n} GPUs" in page and "No GPU on this machine" not in page
    assert page.count('class="plot"') >= 6
