"""`train --trace FILE`: a Chrome trace of a few steps of rank 0, with the phases labelled and each collective
inside its step; the report names it."""
from __future__ import annotations

import json

import pytest

from meshscale.train.trace import TRACE_STEPS

PHASES = ("data", "forward", "backward", "exchange finish", "optimizer")


@pytest.mark.timeout(300)
def test_trace_holds_the_phases_and_collectives_of_each_traced_step(cli, tmp_path):
    trace, result_path = tmp_path / "trace.json", tmp_path / "train.json"
    result = cli("train", "--cpus", 2, "--steps", 5, "--timing-warmup", 1, "--batch", 8, "--trace", trace,
                 "--json", result_path)
    assert result.exit_code == 0, result.output
    assert f"wrote {trace}" in result.stdout
    events = json.loads(trace.read_text())["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    steps = [e for e in spans if e["name"].startswith("step ")]
    assert [e["name"] for e in sorted(steps, key=lambda e: e["ts"])] == [f"step {k}" for k in range(1, 1 + TRACE_STEPS)]
    for step in steps:
        inside = [e for e in spans if step["ts"] <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"] + 1]
        names = [e["name"] for e in inside]
        assert all(p in names for p in PHASES), names
        assert any("all_reduce" in n or "allreduce" in n for n in names)  # the gradient's bucket(s)
        start = {p: min(e["ts"] for e in inside if e["name"] == p) for p in PHASES}
        assert start["data"] <= start["forward"] <= start["backward"] <= start["exchange finish"] <= start["optimizer"]
    report = cli("report", result_path, "--output", tmp_path / "report")
    assert report.exit_code == 0 and str(trace) in (tmp_path / "report" / "index.html").read_text()


def test_trace_must_be_a_json_file(cli, tmp_path):
    result = cli("train", "--trace", tmp_path / "trace.txt")
    assert result.exit_code == 2 and "--trace" in result.stderr
