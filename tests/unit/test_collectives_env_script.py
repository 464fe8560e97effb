"""benchmarks/collectives_env.py on the CPU: the commands it runs, how it reads bench and sim results, the error
and the table (the GPU run itself is the lead's)."""
import importlib.util
import math
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "collectives_env.py"


@pytest.fixture(scope="module")
def ce():
    spec = importlib.util.spec_from_file_location("collectives_env", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def _bench(rows):
    return {"kind": "bench-collective", "rows": [
        {"collective": c, "size_bytes": n, "inplace": inplace, "busbw_bytes_per_s": gbps * 1e9} for c, n, inplace, gbps in rows]}


def _sim(rows):
    return {"kind": "sim", "rows": [
        {"collective": c, "size_bytes": n, "busbw_bytes_per_s": gbps * 1e9, "algorithm": "nccl ring/Simple, 1 channels"}
        for c, n, gbps in rows]}


def test_every_process_runs_without_nvlink_sharp_and_the_model_is_told(ce):
    for name, settings in ce.SETTINGS.items():
        env = ce.process_env(name)
        assert all(env[k] == v for k, v in ce.NVLS_OFF.items())
        assert all(env[k] == v for k, v in (s.split("=", 1) for s in settings))
        sim = ce.sim_command(name, "all_reduce", "hgx-h200", 4, Path("x.json"))
        assert "NCCL_NVLS_ENABLE=0" in sim and all(s in sim for s in settings)
        assert sim[sim.index("--system") + 1] == "hgx-h200" and sim[sim.index("--gpus") + 1] == "4"
        bench = ce.bench_command(name, 4, Path("x.json"))
        assert bench[bench.index("-g") + 1] == "4" and "--impl" in bench and "nccl" in bench
        assert set(ce.COLLECTIVES) <= set(bench)
        assert ce.slug(name).replace("_", "").replace("-", "").isalnum()
    assert "--system" not in ce.sim_command("default", "broadcast", None, 2, Path("x.json"))  # this machine


def test_catalog_board_by_gpu_name(ce):
    assert ce.catalog_for("NVIDIA H200") == "hgx-h200"
    assert ce.catalog_for("NVIDIA H100 80GB HBM3") == "hgx-h100"
    assert ce.catalog_for("NVIDIA A10G") is None


def test_reads_out_of_place_rows_joins_and_errors(ce):
    measured = ce.measured_rows(_bench([("all_reduce", 1 << 20, False, 20.0), ("all_reduce", 1 << 20, True, 99.0),
                                        ("broadcast", 1 << 30, False, 50.0)]))
    assert measured == {("all_reduce", 1 << 20): 20.0, ("broadcast", 1 << 30): 50.0}  # in-place rows left out
    predicted = ce.predicted_rows(_sim([("all_reduce", 1 << 20, 22.0), ("broadcast", 1 << 30, 40.0),
                                        ("all_gather", 1 << 20, 10.0)]))
    rows = ce.join("MAX_NCHANNELS=1", measured, predicted)
    assert [r.collective for r in rows] == ["all_reduce", "all_gather", "broadcast"]
    by = {r.collective: r for r in rows}
    assert by["all_reduce"].error == pytest.approx(0.1)
    assert by["broadcast"].error == pytest.approx(-0.2)
    assert by["all_gather"].error is None and by["all_gather"].measured_gbps is None
    s = ce.summary(rows)["MAX_NCHANNELS=1"]
    assert s["rows"] == 2 and s["worst_error"] == pytest.approx(-0.2) and not s["within_bound"]
    assert s["geomean_abs_error"] == pytest.approx(math.exp((math.log(1.1) + abs(math.log(0.8))) / 2) - 1)
    text = ce.table(rows)
    assert "+10.0%" in text and "-20.0%" in text and "OUTSIDE" in text and "PREDICTED" in text


def test_no_gpu_and_no_dry_run_is_one_line(ce, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(ce, "_gpus_here", lambda: [])
    assert ce.main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("collectives_env: error:") and "\n" not in err
