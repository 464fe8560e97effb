"""`doctor --level`: dcgmi's verdicts folded in where it is installed, else meshscale's own copy checks judged
against the datasheet and PCIe bounds (measurements faked here; the real ones run on a GPU machine)."""
from __future__ import annotations

import json

import pytest

from meshscale.errors import MeshscaleError
from meshscale.app.doctor_levels import CopyFigure, parse_dcgmi, run_levels

from conftest import FakeNVML
from test_report_doctor import by_name, fake_env

DCGM3 = {"DCGM GPU Diagnostic": {"test_categories": [
    {"category": "Deployment", "tests": [{"name": "Denylist", "results": [{"status": "Pass"}]},
                                         {"name": "Persistence Mode", "results": [{"status": "Warn", "warnings": [
                                             {"warning": "Persistence mode for GPU 0 is disabled.", "error_id": 5}]}]}]},
    {"category": "Integration", "tests": [{"name": "PCIe", "results": [
        {"gpu_ids": "0", "status": "Pass"},
        {"gpu_ids": "1", "status": "Fail", "warnings": [{"warning": "GPU 1 PCIe replay count above threshold"}]}]}]}]}}


def never(*args):
    raise AssertionError("must not be called")


def test_dcgmi_verdicts_are_folded_in(tmp_path):
    calls = []

    def run(command, timeout_s):
        calls.append((command, timeout_s))
        return 0, json.dumps(DCGM3)

    found = by_name(run_levels(2, fake_env(tmp_path, FakeNVML.machine(gpus=2)), which=lambda _: "/usr/bin/dcgmi",
                               run=run, measure=never, pairs=never))
    assert calls[0][0] == ["/usr/bin/dcgmi", "diag", "-r", "2", "-j"]
    assert found["dcgmi Denylist"].status == "pass" and found["dcgmi PCIe GPU0"].status == "pass"
    assert found["dcgmi PCIe GPU1"].status == "fail" and "replay count" in found["dcgmi PCIe GPU1"].message
    assert found["dcgmi Persistence Mode"].status == "warn"
    assert "driver" in found  # level 1's own checks stay


def test_dcgmi_without_json_is_one_warn_line():
    checks = parse_dcgmi({"nothing": []})
    assert checks == []
    from meshscale.app.doctor_levels import dcgmi_checks
    (line,) = dcgmi_checks("dcgmi", 1, lambda c, t: (255, "Error: unable to connect to host engine\n"))
    assert line.status == "warn" and "host engine" in line.message and "nv-hostengine" in line.fix


def figures(env, h2d=52e9, copy=2.9e12):
    return [CopyFigure(0, "device copy", copy, 3.35e12, "H100 SXM datasheet memory bandwidth (read + write)"),
            CopyFigure(0, "host->device", h2d, 63.0e9, "PCIe gen 5 x16 rate per direction"),
            CopyFigure(0, "device->host", 50e9, 63.0e9, "PCIe gen 5 x16 rate per direction")]


def test_level2_judges_copies_against_their_bounds(tmp_path):
    env = fake_env(tmp_path, FakeNVML.machine("NVIDIA H100 80GB HBM3", gpus=1))
    found = by_name(run_levels(2, env, which=lambda _: None, measure=figures, pairs=never))
    assert found["device copy GPU0"].status == "pass" and "87% of the H100 SXM" in found["device copy GPU0"].message
    slow = by_name(run_levels(2, env, which=lambda _: None, measure=lambda e: figures(e, h2d=20e9, copy=2.0e12), pairs=never))
    assert slow["host->device GPU0"].status == "fail" and "PCIe" in slow["host->device GPU0"].fix
    assert slow["device copy GPU0"].status == "warn"  # 60 %: between the poor and the good share
    assert "device copy GPU0" not in by_name(run_levels(1, env, which=lambda _: None, measure=never, pairs=never))


def test_level3_adds_the_pairs_and_no_gpu_says_so(tmp_path):
    from meshscale.app.doctor_env import Check
    env = fake_env(tmp_path, None)
    found = by_name(run_levels(3, env, which=lambda _: None, measure=never,
                               pairs=lambda: [Check("pass", "pairs", "1 GPU pair")]))
    assert found["copies"].status == "info" and found["pairs"].status == "pass"


def test_a_level_out_of_range_is_an_error(tmp_path):
    with pytest.raises(MeshscaleError, match="--level 4"):
        run_levels(4, fake_env(tmp_path))


@pytest.mark.parametrize("statuses, code", [(("pass", "warn", "info"), 0), (("pass", "warn", "fail"), 1)])
def test_the_cli_ends_with_the_summary_and_exits_1_only_on_a_failure(cli, monkeypatch, statuses, code):
    from meshscale.app import doctor, doctor_levels
    from meshscale.app.doctor_env import Check

    checks = [Check(s, f"check{i}", "said") for i, s in enumerate(statuses)]
    monkeypatch.setattr(doctor_levels, "run_levels", lambda level: checks)
    run = cli("doctor")
    assert run.exit_code == code
    assert run.stdout.strip().splitlines()[-1] == doctor.summary(checks)
