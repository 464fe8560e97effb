"""bench p2p: the CPU-worker matrices over Gloo (every ordered pair, every mode), JSON and heatmap; GPU run marked."""
import pytest
import torch

from meshscale.plots import p2p_chart, save
from meshscale.bench.p2p import P2PSpec, bench_p2p
from meshscale.bench.tables import p2p_tables
from meshscale.execute.world import World
from meshscale.errors import MeshscaleError
from meshscale.results import load_result


def test_cpu_workers_every_pair_and_mode(tmp_path):
    result = bench_p2p(P2PSpec(size_bytes=256 << 10, iters=2, warmup_iters=1, latency_iters=5), World(3, "gloo"))
    pairs = {(a, b) for a in range(3) for b in range(3) if a != b}
    for mode in ("unidirectional", "bidirectional", "latency"):
        got = {(int(r["src"][-1]), int(r["dst"][-1])) for r in result.rows if r["mode"] == mode}
        assert got == pairs, mode
    for r in result.rows:
        if r["mode"] == "latency":
            assert r["latency_s"] > 0 and r["bandwidth_bytes_per_s"] is None
        else:
            assert r["bandwidth_bytes_per_s"] > 0 and r["size_bytes"] == 256 << 10
    bidi = {(r["src"], r["dst"]): r["bandwidth_bytes_per_s"] for r in result.rows if r["mode"] == "bidirectional"}
    assert all(bidi[(a, b)] == bidi[(b, a)] for a, b in bidi)
    assert result.meta["modes"] == ["unidirectional", "bidirectional", "latency"]
    saved = load_result(result.save(tmp_path / "p2p.json"))
    assert saved.kind == "bench-p2p" and saved.rows == result.rows
    png = save(p2p_chart(saved), tmp_path / "p2p.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert len(p2p_tables(saved)) == 3


def test_p2p_bad_input():
    with pytest.raises(MeshscaleError, match="at least 2 CPU workers"):
        bench_p2p(P2PSpec(), World(1, "gloo"))
    with pytest.raises(MeshscaleError, match="at least 4 bytes"):
        bench_p2p(P2PSpec(size_bytes=2), World(2, "gloo"))


@pytest.mark.gpu
def test_gpu_matrix_has_every_pair_and_the_host():
    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip("needs 2 GPUs")
    result = bench_p2p(P2PSpec(size_bytes=64 << 20, iters=5, latency_iters=20), World(n, "nccl"))
    uni = {(r["src"], r["dst"]) for r in result.rows if r["mode"] == "unidirectional"}
    assert ("host", "gpu0") in uni and ("gpu0", "host") in uni and ("gpu0", "gpu1") in uni
    assert all(r["bandwidth_bytes_per_s"] > 1e9 for r in result.rows if r["mode"] != "latency")
