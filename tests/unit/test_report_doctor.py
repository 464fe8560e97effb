"""`doctor` on faked machines: no driver, a link down, a small /dev/shm, NCCL knobs, InfiniBand."""
from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from meshscale.report.doctor import DoctorEnv, run_doctor

from conftest import FakeNVML

GIB = 1 << 30
VERSIONS = {"torch": "2.11.0", "cuda": "12.8", "nccl": "2.28.9", "cuda_devices": 8, "gloo": True}


def fake_env(tmp_path: Path, nvml=None, shm_bytes=16 * GIB, environ=None, memlock=-1, ib=False, versions=VERSIONS):
    net = tmp_path / "net"
    for name, state in (("lo", "unknown"), ("eth0", "up"), ("ib0", "up")):
        (net / name).mkdir(parents=True, exist_ok=True)
        (net / name / "operstate").write_text(state)
    (net / "eth0" / "speed").write_text("100000")
    ib_dir = tmp_path / "infiniband"
    if ib:
        port = ib_dir / "mlx5_0" / "ports" / "1"
        port.mkdir(parents=True)
        (port / "state").write_text(ib if isinstance(ib, str) else "4: ACTIVE")
        (port / "rate").write_text("400 Gb/sec (4X NDR)")
    statvfs = lambda path: SimpleNamespace(f_blocks=shm_bytes // 4096, f_frsize=4096)
    return DoctorEnv(environ=environ or {}, nvml=nvml, nvml_error="" if nvml else "NVMLError_LibraryNotFound",
                     net_dir=net, ib_dir=ib_dir, statvfs=statvfs, memlock_bytes=lambda: memlock,
                     versions=lambda: dict(versions))


def by_name(checks):
    return {c.name: c for c in checks}


def test_healthy_gpu_machine_passes(tmp_path):
    checks = run_doctor(fake_env(tmp_path, FakeNVML.machine(), ib=True))
    assert not [c for c in checks if c.status in ("warn", "fail")], [vars(c) for c in checks]
    found = by_name(checks)
    assert "8 GPU(s)" in found["gpus"].message and "NVIDIA H200" in found["gpus"].message
    assert found["nvlink GPU3"].message == "18 of 18 NVLinks up"
    assert found["ib mlx5_0/1"].status == "pass"


def test_no_driver_warns_and_still_checks_the_rest(tmp_path):
    checks = run_doctor(fake_env(tmp_path, None, versions=dict(VERSIONS, cuda=None, nccl=None, cuda_devices=0)))
    found = by_name(checks)
    assert found["driver"].status == "warn" and "CPU workers" in found["driver"].message and found["driver"].fix
    assert not any(c.name.startswith(("nvlink", "p2p", "pcie")) for c in checks)
    assert found["shm"].status == "pass" and found["versions"].status == "pass"


def test_a_link_down_fails_with_a_fix(tmp_path):
    checks = run_doctor(fake_env(tmp_path, FakeNVML.machine("Tesla V100-SXM2-32GB", nvlinks=6, links_down={2: 1})))
    found = by_name(checks)
    assert found["nvlink GPU2"].status == "fail" and "5 of 6" in found["nvlink GPU2"].message
    assert "nvidia-smi nvlink" in found["nvlink GPU2"].fix
    assert all(found[f"nvlink GPU{i}"].status == "pass" for i in range(8) if i != 2)


def test_pcie_cards_have_no_expected_link_count(tmp_path):
    checks = run_doctor(fake_env(tmp_path, FakeNVML.machine("Tesla P100-PCIE-16GB", gpus=4, nvlinks=0)))
    assert by_name(checks)["nvlink GPU0"].status == "info"


def test_small_shm_warns_with_docker_fix(tmp_path):
    found = by_name(run_doctor(fake_env(tmp_path, shm_bytes=64 << 20)))
    assert found["shm"].status == "warn" and "64 MiB" in found["shm"].message and "--shm-size" in found["shm"].fix


def test_missing_shm_fails(tmp_path):
    env = fake_env(tmp_path)
    env.statvfs = lambda path: (_ for _ in ()).throw(FileNotFoundError(path))
    assert by_name(run_doctor(env))["shm"].status == "fail"


def test_p2p_pcie_and_memlock_problems(tmp_path):
    env = fake_env(tmp_path, FakeNVML.machine(gpus=4, p2p={(0, 3): 5}, pcie=(4, 16),
                                                  pcie_now=dict.fromkeys(range(4), (3, 8))), memlock=64 << 10, ib=True)
    found = by_name(run_doctor(env))
    assert found["p2p"].status == "warn" and "GPU0-GPU3" in found["p2p"].message
    assert found["pcie GPU1"].status == "warn" and "x8 of x16" in found["pcie GPU1"].message
    assert found["memlock"].status == "warn" and "memlock=-1" in found["memlock"].fix


def test_nccl_knobs_are_explained(tmp_path):
    environ = {"NCCL_P2P_DISABLE": "1", "NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth", "NCCL_IB_DISABLE": "1"}
    found = by_name(run_doctor(fake_env(tmp_path, environ=environ)))
    assert found["NCCL_P2P_DISABLE"].status == "warn" and "host memory" in found["NCCL_P2P_DISABLE"].message
    assert found["NCCL_DEBUG"].status == "info"
    assert found["NCCL_SOCKET_IFNAME"].status == "info"  # eth matches eth0
    assert found["NCCL_IB_DISABLE"].status == "info"  # nothing lost without InfiniBand
    found = by_name(run_doctor(fake_env(tmp_path / "b", environ={"NCCL_SOCKET_IFNAME": "=ens1f0"})))
    assert found["NCCL_SOCKET_IFNAME"].status == "fail" and "eth0" in found["NCCL_SOCKET_IFNAME"].fix
    found = by_name(run_doctor(fake_env(tmp_path / "c", environ={"NCCL_SOCKET_IFNAME": "^lo,ib"})))
    assert found["NCCL_SOCKET_IFNAME"].status == "info"  # eth0 remains


def test_cpu_torch_on_gpu_machine_fails(tmp_path):
    env = fake_env(tmp_path, FakeNVML.machine(), versions=dict(VERSIONS, cuda=None, cuda_devices=0))
    assert by_name(run_doctor(env))["torch-cuda"].status == "fail"


def test_down_infiniband_port_warns(tmp_path):
    found = by_name(run_doctor(fake_env(tmp_path, ib="1: DOWN")))
    assert found["ib mlx5_0/1"].status == "warn"


def test_a_broken_check_is_a_line_not_a_traceback(tmp_path):
    nvml = FakeNVML.machine()
    nvml.nvmlDeviceGetP2PStatus = lambda *a: 1 / 0
    found = by_name(run_doctor(fake_env(tmp_path, nvml)))
    assert found["p2p"].status == "warn" and "could not run" in found["p2p"].message


def test_real_machine_runs(tmp_path):
    checks = run_doctor()
    assert {"driver", "shm", "versions"} <= {c.name for c in checks}
    assert all(c.status in ("pass", "warn", "fail", "info") for c in checks)


def test_real_h200_machine_dump_is_healthy(tmp_path):
    nvml = FakeNVML.from_dump()
    found = by_name(run_doctor(fake_env(tmp_path, nvml, versions=dict(VERSIONS, cuda_devices=2))))
    assert found["driver"].message.startswith(f"NVIDIA driver {nvml.driver}")
    assert "2 GPU(s): NVIDIA H200" in found["gpus"].message
    assert found["nvlink GPU0"].message == found["nvlink GPU1"].message == "18 of 18 NVLinks up"
    assert found["p2p"].status == "pass" and found["pcie GPU0"].status == "pass"


def test_cli_doctor_writes_json_and_fails_on_a_failed_check(tmp_path, monkeypatch, capsys):
    import sys

    from meshscale import cli
    from meshscale.report.doctor import Check
    from meshscale.results import load_result

    checks = [Check("pass", "driver", "570"), Check("fail", "shm", "64 MiB", "run with --ipc=host")]
    monkeypatch.setattr("meshscale.report.doctor.run_doctor", lambda: checks)
    out = tmp_path / "doctor.json"
    monkeypatch.setattr(sys, "argv", ["meshscale", "doctor", "--json", str(out)])
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == 1 and "fix: run with --ipc=host" in capsys.readouterr().out
    assert [r["name"] for r in load_result(out).rows] == ["driver", "shm"]
