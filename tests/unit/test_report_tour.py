"""Tour mechanics with stand-in stages: results saved as they finish, skipped stages and failures noted,
Ctrl-C keeps what finished, the report is written from what exists."""
from __future__ import annotations

from pathlib import Path

import pytest

from meshscale.errors import MeshscaleError
from meshscale.app.tour import Skipped, Stage, TourSettings, run_tour
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


# ---- one GPU: what the tour measures and predicts instead of collectives ---------------------------------
def _one_gpu_state(tmp_path, name="NVIDIA H100 80GB HBM3"):
    from types import SimpleNamespace

    from conftest import FakeNVML
    from meshscale.app.tour import TourState
    from meshscale.results import Result
    from meshscale.topology.nvml_discovery import nvml_topology

    state = TourState(TourSettings(fast=True), tmp_path)
    state.world = SimpleNamespace(backend="nccl", size=1)
    state.topology = nvml_topology(FakeNVML.machine(name, gpus=1, links_down={0: 18}), sm_counts={})
    rows = [{"batch_per_rank": b, "step_time_s": t, "samples_per_s": b / t} for b, t in ((32, 0.05), (64, 0.09))]
    profile = Result("train", rows, False, {"profile": True, "model": "resnet50", "device": "cuda", "precision": "fp32"})
    profile.save(tmp_path / "profile.json")
    state.results["profile"] = profile
    return state


def test_one_gpu_skips_what_needs_two_ranks_with_one_line(tmp_path):
    from meshscale.app.tour import collective_stage, p2p_stage, scale_stage

    state = _one_gpu_state(tmp_path)
    for stage, text in ((collective_stage, "one GPU, nothing to exchange"), (p2p_stage, "one GPU, no peer"),
                        (scale_stage, "one GPU, no scaling to measure")):
        try:
            stage(state)
        except Skipped as exc:
            assert str(exc).startswith(text) and "\n" not in str(exc)
        else:
            raise AssertionError(f"{stage.__name__} ran on one GPU")


def test_the_catalog_system_of_a_gpu_generation():
    from meshscale.app.tour import systems_of

    assert systems_of({"model": "NVIDIA H100 80GB HBM3", "nvlink_generation": 4}) == "hgx-h100"
    assert systems_of({"model": "NVIDIA H200", "nvlink_generation": 4}) == "hgx-h200"
    assert systems_of({"model": "NVIDIA H100 PCIe", "nvlink_generation": 4}) in ("hgx-h100", "hgx-h200")
    assert systems_of({"model": "NVIDIA A100 80GB PCIe", "nvlink_generation": 3}) == "dgx-a100"
    assert systems_of({"model": "Mystery GPU"}) is None


def test_one_gpu_predicts_the_systems_built_from_it_marked_predicted(tmp_path):
    from meshscale.report.figures import sections
    from meshscale.report.parts import Source
    from meshscale.app.tour import built_from_this_gpu

    out = built_from_this_gpu(_one_gpu_state(tmp_path))
    system, cluster = out["predict-system"], out["predict-cluster"]
    assert system.predicted and cluster.predicted
    assert sorted(r["world_size"] for r in system.rows) == [1, 2, 4, 8]
    assert sorted(r["world_size"] for r in cluster.rows) == [8, 16, 32]
    assert system.meta["system"] == "hgx-h100" and "NDR InfiniBand" in cluster.meta["system"]
    assert "predicted from this NVIDIA H100 80GB HBM3's profile" in system.meta["group"]
    assert all(r["throughput_samples_per_s"] > 0 for r in system.rows + cluster.rows)
    found = sections([Source(k, v) for k, v in out.items()])
    titles = [p.title for sec in found for p in sec.plots]
    assert len(titles) == 2 and all(t.startswith("predicted from this") for t in titles)
    assert all(p.verdict.text.startswith("predicted") for sec in found for p in sec.plots)


def test_host_copy_and_profile_are_tables_and_one_rank_draws_nothing():
    from meshscale.report.figures import sections
    from meshscale.report.parts import Source
    from meshscale.results import Result

    copies = Result("bench-host-copy", [{"direction": d, "memory": m, "size_bytes": 256 << 20, "seconds": 0.01,
                                         "bandwidth_bytes_per_s": 26.8e9} for d in ("host->device", "device->host")
                                        for m in ("pinned", "pageable")], False, {"gpu": "NVIDIA H100", "iters": 10})
    one_rank = Result("bench-collective", [{"collective": "all_reduce", "size_bytes": 1024, "busbw_bytes_per_s": 0.0}],
                      False, {"world_size": 1})
    single_bar = Result("scale", [{"world_size": 1, "mode": "weak", "throughput_samples_per_s": 900.0}], False, {})
    profile = Result("train", [{"batch_per_rank": 64, "step_time_s": 0.08, "samples_per_s": 800.0}], False,
                     {"profile": True, "model": "resnet50", "device": "cuda"})
    found = sections([Source("host-copy", copies), Source("collective", one_rank), Source("scale", single_bar),
                      Source("profile", profile)])
    titles = [sec.title for sec in found]
    assert titles[0].startswith("Host <-> device copies (NVIDIA H100")
    assert found[0].table[0] == {"direction": "host->device", "host memory": "pinned", "size": "256M",
                                 "bandwidth": "26.8 GB/s", "time per copy": "10.00 ms"}
    assert titles[1].startswith("Single-GPU training profile: resnet50")
    assert not any(p for sec in found for p in sec.plots)  # no busbw of one rank, no single-bar chart


def test_host_copy_without_a_gpu_is_one_line():
    import pytest
    import torch

    from meshscale.bench.host_copy import host_copy

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(MeshscaleError, match="^host<->device copies need a CUDA GPU, and torch sees none$"):
        host_copy(1 << 20)


@pytest.mark.parametrize("name, precision", [("NVIDIA H100 80GB HBM3", "bf16"), ("Tesla P100-SXM2-16GB", "fp32")])
def test_a_gpu_tour_trains_in_bf16_where_the_gpu_has_bf16_rates(tmp_path, name, precision):
    from meshscale.app.tour import _train_config
    cfg, _ = _train_config(_one_gpu_state(tmp_path, name))
    assert cfg.speed.precision == precision


def test_a_gpu_tour_draws_only_this_machine_and_its_predictions(tmp_path, monkeypatch):
    from meshscale.app import tour
    state = _one_gpu_state(tmp_path)
    monkeypatch.setattr(tour, "built_from_this_gpu", lambda s: {"predict-system": tour.Result("predict", [], True)})
    assert set(tour.predict_stage(state)) == {"predict-system"}  # no DGX-1 whitepaper reference charts
    state.world = None  # no GPU: the reference shows what GPUs would do
    assert {"whitepaper", "whitepaper-predicted"} <= set(tour.predict_stage(state))


def test_legends_say_predicted_once():
    from meshscale.report.figures import _legend
    assert _legend("predicted", "whitepaper-predicted DGX-1 NVLink") == "predicted whitepaper DGX-1 NVLink"
    assert _legend("measured", "scale this-machine") == "measured scale this-machine"


# ---- the scale stage within the tour's time, its rows consistent with their step times ---------------------
def _scale_state(tmp_path, size, settings):
    from types import SimpleNamespace

    from meshscale.app.tour import TourState
    state = TourState(settings, tmp_path)
    state.world = SimpleNamespace(backend="gloo", size=size)
    return state


def _fake_scale(clock, seconds_per_rank, stalled=()):
    """`train.scale.scale` for one world size: a run of ``seconds_per_rank`` x ranks on ``clock``; a world in
    ``stalled`` had its window stretched by a stall its median step does not show."""
    from meshscale.results import Result

    def run(cfg, worlds, weak, size):
        [n] = worlds
        clock[0] += seconds_per_rank * n
        batch = size if weak else size // n
        step_s = 0.1 * (1 + 0.1 * (n - 1))
        window = (batch * n / step_s) / (3 if n in stalled else 1)
        return Result("scale", [{"world_size": n, "mode": "ddp", "batch_per_rank": batch, "global_batch": batch * n,
                                 "step_time_s": step_s, "throughput_samples_per_s": window}], False, {})
    return run


@pytest.mark.parametrize("budget_left, runs", [(1000.0, 8), (2.0, 4), (-50.0, 2)])
def test_the_scale_stage_runs_what_fits_in_the_time_left(tmp_path, monkeypatch, budget_left, runs):
    """Weak scaling's one rank and most ranks always run; the rest while the time left allows, the baseline and
    most ranks of a mode first; what is left out is named."""
    from meshscale.app import tour

    clock = [0.0]
    monkeypatch.setattr(tour, "scale", _fake_scale(clock, 0.1))
    monkeypatch.setattr(tour.time, "monotonic", lambda: clock[0])
    state = _scale_state(tmp_path, 8, tour.TourSettings())
    monkeypatch.setattr(tour.TourState, "time_left_s", lambda self: budget_left - clock[0])
    rows = tour.scale_stage(state)["scale"].rows
    assert len(rows) == runs
    by_mode = {m: sorted(r["world_size"] for r in rows if r["mode"] == m) for m in ("weak", "strong")}
    assert by_mode["weak"][:1] == [1] and by_mode["weak"][-1] == 8  # always measured: a scaling figure
    assert by_mode["strong"] == [] or by_mode["strong"][:1] == [1] and 8 in by_mode["strong"]  # never alone
    assert (runs < 8) == any("tour --full" in n for n in state.notes)


def test_scale_rows_agree_with_their_step_times(tmp_path, monkeypatch):
    """A run whose window held a stall (its throughput a third of what its steps say) reads as what its median
    step says, so the other rows' speedup over it is not super-linear."""
    from meshscale.app import tour

    clock = [0.0]
    monkeypatch.setattr(tour, "scale", _fake_scale(clock, 0.1, stalled=(1,)))
    state = _scale_state(tmp_path, 4, tour.TourSettings(full=True))
    rows = tour.scale_stage(state)["scale"].rows
    for r in rows:
        assert r["throughput_samples_per_s"] * r["step_time_s"] == pytest.approx(r["global_batch"])
        assert r["efficiency"] == pytest.approx(r["speedup"] / r["world_size"]) and r["efficiency"] <= 1.0
    assert rows[0]["window_samples_per_s"] < rows[0]["throughput_samples_per_s"]


def test_scaling_figures_and_error_tables_say_what_their_figures_mean():
    from meshscale.predict.validate import validate_run
    from meshscale.report.figures import sections
    from meshscale.report.parts import Source
    from meshscale.results import load_result

    checked = validate_run(load_result(FIXTURES / "collective.json"), load_result(FIXTURES / "sim.json"))
    found = sections([Source("scale", load_result(FIXTURES / "scale.json")), Source("validate", checked)])
    scaling = [p for sec in found for p in sec.plots if "scaling" in p.title and "step time" not in p.title]
    assert scaling and all("parallel efficiency is that speedup divided by the ranks" in p.caption for p in scaling)
    [table] = [sec for sec in found if sec.title.startswith("Model against measurement")]
    assert "geometric mean" in table.note and "within" in table.note
