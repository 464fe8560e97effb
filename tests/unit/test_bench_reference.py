"""The GPU comparison script reads nccl-tests output correctly and judges ratios by the issue's targets."""
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_vs_nccl_tests", ROOT / "benchmarks" / "bench_vs_nccl_tests.py")
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)


@pytest.mark.parametrize("n", [2, 4])
def test_reference_files_parse(n):
    table = script.parse_nccl_tests(ROOT / "benchmarks" / "reference" / f"nccl-tests-h200x{n}.txt")
    assert {k[0] for k in table} == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"}
    sizes = sorted({k[1] for k in table})
    assert sizes[0] == 1024 and sizes[-1] == 1 << 30 and len(sizes) == 11
    big = table[("all_reduce", 1 << 30, False)]
    # busbw = algbw x 2(n-1)/n, as printed
    assert big["busbw_bytes_per_s"] == pytest.approx(big["algbw_bytes_per_s"] * 2 * (n - 1) / n, rel=0.01)


def test_compare_applies_the_targets():
    ref = {("all_reduce", 1 << 30, True): {"time_s": 3.3e-3, "busbw_bytes_per_s": 326e9},
           ("all_reduce", 1024, True): {"time_s": 15e-6, "busbw_bytes_per_s": 7e7}}
    rows = [{"collective": "all_reduce", "size_bytes": 1 << 30, "inplace": True, "time_s": 3.6e-3, "busbw_bytes_per_s": 300e9},
            {"collective": "all_reduce", "size_bytes": 1024, "inplace": True, "time_s": 17e-6, "busbw_bytes_per_s": 6e7},
            {"collective": "reduce", "size_bytes": 1024, "inplace": True, "time_s": 17e-6, "busbw_bytes_per_s": 6e7}]
    lines = script.compare(rows, ref)
    assert [l["verdict"] for l in lines] == ["FAIL", "pass"]  # 300/326 is 8 % short; 17/15 us is 13 % slower
