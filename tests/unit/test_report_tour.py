"""Tour mechanics with stand-in stages: results saved as they finish, skipped stages and failures noted,
Ctrl-C keeps what finished, the report is written from what exists."""
from __future__ import annotations

from pathlib import Path

from meshscale.errors import MeshscaleError
from meshscale.report.tour import Skipped, Stage, TourSettings, run_tour
from meshscale.results import load_result

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "report"


def _stage(name, run):
    return Stage(name, name, lambda s: 1.0, run)


def _load(stem):
    return lambda state: {stem: load_result(FIXTURES / f"{stem}.json")}


def _skipped(state):
    raise Skipped("needs two ranks")


def _fails(state):
    raise MeshscaleError("rank 1 failed with boom during all_reduce 1M")


def _interrupt(state):
    raise KeyboardInterrupt


def test_stages_save_results_and_the_report_says_what_was_skipped(tmp_path):
    stages = (_stage("topology", _load("topology")), _stage("p2p", _skipped), _stage("scale", _fails),
              _stage("collective", _load("collective")))
    outcome = run_tour(tmp_path, TourSettings(fast=True), stages)
    assert [s.status for s in outcome.stages] == ["done", "skipped", "failed", "done"]
    assert {p.name for p in tmp_path.glob("*.json")} == {"topology.json", "collective.json", "tour.json"}
    page = outcome.index.read_text()
    assert "p2p: needs two ranks; skipped" in page and "boom during all_reduce" in page
    assert "not in this build" not in page
    assert 'id="plot-busbw-all-reduce"' in page
    tour = load_result(tmp_path / "tour.json")
    assert tour.kind == "tour" and [r["name"] for r in tour.rows] == ["topology", "p2p", "scale", "collective"]


def test_ctrl_c_keeps_what_finished(tmp_path):
    stages = (_stage("collective", _load("collective")), _stage("p2p", _interrupt), _stage("scale", _load("scale")))
    outcome = run_tour(tmp_path, TourSettings(fast=True), stages)
    assert outcome.interrupted
    assert [s.status for s in outcome.stages] == ["done", "interrupted", "not run"]
    assert (tmp_path / "collective.json").exists() and not (tmp_path / "scale.json").exists()
    assert 'id="plot-busbw-all-reduce"' in outcome.index.read_text()


def test_ctrl_c_seen_by_the_ranks_first_still_stops_the_tour(tmp_path):
    """Ctrl-C reaches the rank processes too; their failure may surface as an ordinary error."""
    import os
    import signal

    def ranks_died(state):
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            pass
        raise MeshscaleError("rank 0 failed with KeyboardInterrupt during all_reduce 1M")

    stages = (_stage("collective", _load("collective")), _stage("p2p", ranks_died), _stage("scale", _load("scale")))
    outcome = run_tour(tmp_path, TourSettings(fast=True), stages)
    assert [s.status for s in outcome.stages] == ["done", "interrupted", "not run"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
