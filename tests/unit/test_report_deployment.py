"""doctor's deployment checks on faked machines: in or out of a container, the NGC guide's run flags, the image's
CUDA against the driver, and GPUs in MIG mode with their instances' shares (topo shows them too)."""
from __future__ import annotations

import pytest

from meshscale.app.deployment import check_container, check_cuda_against_driver, check_partitions, in_container
from meshscale.app.doctor import run_doctor
from meshscale.topology.nvml_discovery import nvml_topology
from meshscale.topology.text import summary

from conftest import FakeNVML
from test_report_doctor import GIB, VERSIONS, by_name, fake_env


def _container(tmp_path, marker=".dockerenv"):
    (tmp_path / marker).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / marker).write_text("")


def test_outside_a_container_it_only_says_so(tmp_path):
    env = fake_env(tmp_path, FakeNVML.machine())
    assert in_container(env) == ""
    (line,) = check_container(env)
    assert line.status == "info" and "not in a container" in line.message


@pytest.mark.parametrize("marker", [".dockerenv", "run/.containerenv"])
def test_a_container_is_recognised_by_its_runtime_marker_or_cgroup(tmp_path, marker):
    _container(tmp_path, marker)
    assert in_container(fake_env(tmp_path)) == f"/{marker} exists"


def test_cgroup_and_environment_say_container(tmp_path):
    (tmp_path / "proc/1").mkdir(parents=True)
    (tmp_path / "proc/1/cgroup").write_text("0::/kubepods/besteffort/pod1234\n")
    assert "kubepods" in in_container(fake_env(tmp_path))
    other = tmp_path / "other"
    other.mkdir()
    assert in_container(fake_env(other, environ={"container": "podman"})) == "$container=podman"


def test_a_container_started_as_the_ngc_guide_says_passes(tmp_path):
    _container(tmp_path)
    checks = by_name(check_container(fake_env(tmp_path, FakeNVML.machine(), environ={"NVIDIA_VISIBLE_DEVICES": "all"})))
    assert checks["container-gpus"].status == "pass" and "NVIDIA_VISIBLE_DEVICES=all" in checks["container-gpus"].message
    assert checks["container-flags"].status == "pass" and checks["cuda-driver"].status == "pass"


def test_docker_defaults_are_caught_with_the_flags_to_add(tmp_path):
    _container(tmp_path)
    env = fake_env(tmp_path, FakeNVML.machine(), shm_bytes=64 << 20, memlock=64 << 10, ib=True)
    flags = by_name(check_container(env))["container-flags"]
    assert flags.status == "warn" and "--shm-size=1g" in flags.message and "--ulimit memlock=-1" in flags.fix


def test_a_cuda_container_without_gpus_fails_with_the_fix(tmp_path):
    _container(tmp_path)
    gpus = by_name(check_container(fake_env(tmp_path, None)))["container-gpus"]
    assert gpus.status == "fail" and "--gpus all" in gpus.fix
    cpu_only = by_name(check_container(fake_env(tmp_path, None, versions=dict(VERSIONS, cuda=None))))["container-gpus"]
    assert cpu_only.status == "info"


@pytest.mark.parametrize("cuda, compat, status", [("12.8", False, "pass"), ("12.4", False, "pass"),
                                                   ("12.9", False, "warn"), ("13.0", False, "fail"),
                                                   ("13.0", True, "warn")])
def test_the_image_cuda_against_what_the_driver_supports(tmp_path, cuda, compat, status):
    if compat:
        (tmp_path / "usr/local/cuda/compat").mkdir(parents=True)
    (line,) = check_cuda_against_driver(fake_env(tmp_path, FakeNVML.machine(), versions=dict(VERSIONS, cuda=cuda)))
    assert line.status == status and "up to 12.8" in line.message  # the fake driver supports CUDA 12.8


def test_mig_instances_show_with_their_shares(tmp_path):
    nvml = FakeNVML.machine(name="NVIDIA H100 80GB HBM3", mig={0: 3})
    checks = by_name(check_partitions(fake_env(tmp_path, nvml)))
    assert set(checks) == {"mig GPU0"}
    assert "3 instance(s)" in checks["mig GPU0"].message and "1g.10gb (12% of the SMs" in checks["mig GPU0"].message
    whole = check_partitions(fake_env(tmp_path, FakeNVML.machine()))
    assert [c.message for c in whole] == ["no GPU in MIG mode (whole GPUs)"]
    topo = nvml_topology(FakeNVML.machine(name="NVIDIA H100 80GB HBM3", mig={1: 2}), sm_counts={})
    assert "gpu1: MIG on, 2 instance(s): 1g.10gb" in summary(topo)


def test_doctor_on_a_healthy_host_stays_clean(tmp_path):
    checks = run_doctor(fake_env(tmp_path, FakeNVML.machine(), ib=True))
    assert not [c for c in checks if c.status in ("warn", "fail")]
    assert {"container", "cuda-driver", "partitions"} - {c.name for c in checks} == {"cuda-driver"}  # on a host: no image
