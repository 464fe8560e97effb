"""`compare`: a synthetic drop is flagged, identical runs pass, mismatched inputs are clear errors."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from meshscale.errors import MeshscaleError
from meshscale.report.regression import compare
from meshscale.results import load_result

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "report"


def _scaled(result, key, factor, where=lambda r: True):
    out = copy.deepcopy(result)
    for row in out.rows:
        if where(row) and row.get(key) is not None:
            row[key] *= factor
    return out


def test_identical_runs_pass():
    for name in ("collective.json", "p2p.json", "scale.json", "sim.json"):
        a = load_result(FIXTURES / name)
        result = compare(a, copy.deepcopy(a))
        assert result.changes and not result.failed
        assert all(c.ratio == pytest.approx(1.0) for c in result.changes)


def test_ten_percent_drop_is_flagged_only_where_it_happened():
    a = load_result(FIXTURES / "collective.json")
    big = max(r["size_bytes"] for r in a.rows)
    b = _scaled(a, "busbw_bytes_per_s", 0.90, lambda r: r["collective"] == "all_reduce" and r["size_bytes"] == big)
    result = compare(a, b, threshold_pct=5)
    assert result.failed
    assert [(c.key["collective"], c.key["size_bytes"]) for c in result.dropped] == [("all_reduce", big)]
    assert result.dropped[0].ratio == pytest.approx(0.90)
    assert not compare(a, b, threshold_pct=15).failed  # under a looser threshold it is noise


def test_latency_rise_counts_as_a_drop_and_gains_do_not():
    a = load_result(FIXTURES / "p2p.json")
    slower = compare(a, _scaled(a, "latency_s", 1.2))
    assert slower.dropped and {c.figure for c in slower.dropped} == {"latency_s"}
    faster = compare(a, _scaled(a, "bandwidth_bytes_per_s", 1.3))
    assert not faster.failed


def test_scale_rows_match_on_world_size_and_mode():
    a = load_result(FIXTURES / "scale.json")
    b = _scaled(a, "throughput_samples_per_s", 0.8, lambda r: r["mode"] == "strong" and r["world_size"] == 8)
    b.rows = list(reversed(b.rows))  # order must not matter
    dropped = compare(a, b).dropped
    assert [(c.key["world_size"], c.key["mode"], c.figure) for c in dropped] == [(8, "strong", "throughput_samples_per_s")]


def test_missing_rows_are_listed_and_fail_unless_allowed():
    a = load_result(FIXTURES / "collective.json")
    b = copy.deepcopy(a)
    b.rows = b.rows[1:]
    result = compare(a, b)
    assert len(result.only_a) == 1 and not result.only_b and result.failed and not result.dropped
    assert not compare(a, b, allow_missing=True).failed


def test_nan_or_missing_figures_fail_unless_allowed():
    a = load_result(FIXTURES / "collective.json")
    b = copy.deepcopy(a)
    b.rows[0]["busbw_bytes_per_s"] = float("nan")
    b.rows[1].pop("busbw_bytes_per_s")
    result = compare(a, b)
    assert len(result.missing) == 2 and result.failed
    assert not compare(a, b, allow_missing=True).failed


def test_cli_fails_a_partial_run_and_allow_missing_accepts_it(tmp_path, cli):
    a = FIXTURES / "collective.json"
    data = json.loads(a.read_text())
    data["rows"] = data["rows"][: len(data["rows"]) // 4]
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps(data))
    assert cli("compare", str(a), str(partial)).exit_code == 1
    assert cli("compare", str(a), str(partial), "--allow-missing").exit_code == 0


def test_different_kinds_are_an_error():
    with pytest.raises(MeshscaleError, match="cannot compare"):
        compare(load_result(FIXTURES / "collective.json"), load_result(FIXTURES / "p2p.json"))


def test_cli_exit_codes(tmp_path, cli):
    a = FIXTURES / "collective.json"
    same = cli("compare", str(a), str(a))
    assert same.exit_code == 0, same.output
    data = json.loads(a.read_text())
    for row in data["rows"]:
        row["busbw_bytes_per_s"] *= 0.9
    worse = tmp_path / "worse.json"
    worse.write_text(json.dumps(data))
    dropped = cli("compare", str(a), str(worse), "--threshold", "5")
    assert dropped.exit_code == 1 and "DROP" in dropped.output
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for args in ([str(a), str(bad)], [str(a), str(FIXTURES / "p2p.json")]):
        out = cli("compare", *args)
        assert out.exit_code == 2 and out.stderr.startswith("meshscale: error:")


def test_console_script_exit_codes(tmp_path, cli_process):
    """Through the real entry point: 1 for a drop, 0 for none, 2 (one line, no traceback) for bad input."""
    a = FIXTURES / "collective.json"
    data = json.loads(a.read_text())
    data["rows"][0]["busbw_bytes_per_s"] *= 0.5
    worse, bad = tmp_path / "worse.json", tmp_path / "bad.json"
    worse.write_text(json.dumps(data))
    bad.write_text("[]")
    codes = {}
    for name, b in (("drop", worse), ("same", a), ("bad", bad)):
        done = cli_process("compare", str(a), str(b), timeout=60)
        codes[name] = done.returncode
        if name == "bad":
            assert done.stderr.startswith("meshscale: error:") and "Traceback" not in done.stderr
    assert codes == {"drop": 1, "same": 0, "bad": 2}
