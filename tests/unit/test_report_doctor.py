"""`doctor` on faked machines: no driver, a link down, a small /dev/shm, NCCL knobs, InfiniBand."""
from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from meshscale.app.doctor import run_doctor
from meshscale.app.doctor_env import DoctorEnv

from conftest import FakeNVML

GIB = 1 << 30
VERSIONS = {"torch": "2.11.0", "cuda": "12.8", "nccl": "2.28.9", "cuda_devices": 8, "gloo": True}


class FakeTime:
    """A clock only `sleep` moves: doctor's watch of the error counters takes no real time."""

    def __init__(self):
        self.now, self.slept = 0.0, []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def fake_env(tmp_path: Path, nvml=None, shm_bytes=16 * GIB, environ=None, memlock=-1, ib=False, versions=VERSIONS, vm=False):
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
    modules = tmp_path / "modules"
    modules.write_text("nvidia_peermem 16384 0 - Live 0x0\nnvidia 1 2 - Live 0x0\n")
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2" + (" hypervisor" if vm else "") + "\n")
    return DoctorEnv(cpuinfo=cpuinfo, environ=environ or {}, nvml=nvml, nvml_error="" if nvml else "NVMLError_LibraryNotFound",
                     net_dir=net, ib_dir=ib_dir, statvfs=statvfs, memlock_bytes=lambda: memlock,
                     versions=lambda: dict(versions), sys_root=tmp_path, proc_modules=modules,
                     cpu_affinity=lambda: set(range(8)), **_fake_time())


def _fake_time() -> dict:
    time = FakeTime()
    return {"clock": time.clock, "sleep": time.sleep}


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
    from meshscale.app.doctor_env import Check
    from meshscale.results import load_result

    checks = [Check("pass", "driver", "570"), Check("fail", "shm", "64 MiB", "run with --ipc=host")]
    monkeypatch.setattr("meshscale.app.doctor_levels.run_levels", lambda level: checks)
    out = tmp_path / "doctor.json"
    monkeypatch.setattr(sys, "argv", ["meshscale", "doctor", "--json", str(out)])
    with pytest.raises(SystemExit) as info:
        cli.main()
    assert info.value.code == 1 and "fix: run with --ipc=host" in capsys.readouterr().out
    assert [r["name"] for r in load_result(out).rows] == ["driver", "shm"]


# ---- multi-node checks --------------------------------------------------------------------------------------
def pci_device(root: Path, chain: str, numa: int) -> Path:
    """A device directory at the end of a PCI chain ('pci0000:17/0000:17:00.0/...') under root/sys/devices."""
    device = root / "sys/devices" / chain
    device.mkdir(parents=True, exist_ok=True)
    (device / "numa_node").write_text(str(numa))
    return device


def link_to(at: Path, target: Path) -> None:
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(target)


def ib_port(tmp_path: Path, dev: str, chain: str, numa: int, state="4: ACTIVE", rate="400 Gb/sec (4X NDR)") -> None:
    port = tmp_path / "infiniband" / dev / "ports" / "1"
    port.mkdir(parents=True)
    (port / "state").write_text(state)
    (port / "rate").write_text(rate)
    (port / "link_layer").write_text("InfiniBand")
    link_to(tmp_path / "infiniband" / dev / "device", pci_device(tmp_path, chain, numa))


SWITCH0 = "pci0000:17/0000:17:00.0/0000:18:00.0"  # root complex, root port, a PCIe switch's upstream port
SWITCH1 = "pci0000:9a/0000:9a:00.0/0000:9b:00.0"  # another socket's


def gpu_machine_with_nics(tmp_path: Path) -> DoctorEnv:
    """GPU0 beside mlx5_0 under one PCIe switch; GPU1 on the other socket, whose only NIC is down."""
    env = fake_env(tmp_path, FakeNVML.machine(gpus=2, paths=[("c0", "h0", "u0", "l0"), ("c1", "h1", "u1", "l1")]))
    link_to(tmp_path / "sys/bus/pci/devices/0000:18:00.0", pci_device(tmp_path, f"{SWITCH0}/0000:19:00.0/0000:1a:00.0", 0))
    link_to(tmp_path / "sys/bus/pci/devices/0000:19:00.0", pci_device(tmp_path, f"{SWITCH1}/0000:9c:00.0/0000:9d:00.0", 1))
    ib_port(tmp_path, "mlx5_0", f"{SWITCH0}/0000:19:04.0/0000:1b:00.0", 0)
    ib_port(tmp_path, "mlx5_1", "pci0000:5d/0000:5d:00.0/0000:5e:00.0", 1, state="1: DOWN", rate="10 Gb/sec (4X SDR)")
    return env


def test_gpudirect_passes_beside_a_nic_and_warns_across_sockets(tmp_path):
    found = by_name(run_doctor(gpu_machine_with_nics(tmp_path)))
    assert found["gpudirect GPU0"].status == "pass" and "mlx5_0/1 is PIX" in found["gpudirect GPU0"].message
    assert found["gpudirect GPU1"].status == "warn" and "host memory" in found["gpudirect GPU1"].message
    assert "NCCL_NET_GDR_LEVEL" in found["gpudirect GPU1"].fix


def test_gpudirect_without_a_nic_or_gpu_is_info(tmp_path):
    assert by_name(run_doctor(fake_env(tmp_path, FakeNVML.machine(gpus=2))))["gpudirect"].status == "info"
    assert by_name(run_doctor(fake_env(tmp_path / "b", None)))["gpudirect"].status == "info"


def test_peer_memory_module_missing_warns_with_modprobe(tmp_path):
    env = gpu_machine_with_nics(tmp_path)
    assert by_name(run_doctor(env))["peermem"].status == "pass"
    env.proc_modules.write_text("nvidia 1 2 - Live 0x0\nmlx5_ib 1 0 - Live 0x0\n")
    found = by_name(run_doctor(env))["peermem"]
    assert found.status == "warn" and "modprobe nvidia_peermem" in found.fix
    assert by_name(run_doctor(fake_env(tmp_path / "b", FakeNVML.machine(gpus=2))))["peermem"].status == "info"  # no IB


def test_rank_bound_to_its_gpus_numa_node(tmp_path):
    # FakeNVML.machine: 8 CPUs per socket, GPU0 on socket 0 (CPUs 0-7), GPU1 on socket 1 (CPUs 8-15)
    env = gpu_machine_with_nics(tmp_path)
    env.environ = {"LOCAL_RANK": "0"}
    assert by_name(run_doctor(env))["numa-binding"].status == "pass"
    env.environ = {"LOCAL_RANK": "1"}
    found = by_name(run_doctor(env))["numa-binding"]
    assert found.status == "fail" and "8-15" in found.message and "numactl --cpunodebind=1" in found.fix
    env.cpu_affinity = lambda: set(range(16))
    assert by_name(run_doctor(env))["numa-binding"].status == "warn"
    env.environ = {"LOCAL_RANK": "0", "CUDA_VISIBLE_DEVICES": "1"}  # local rank 0 drives GPU1
    assert by_name(run_doctor(env))["numa-binding"].status == "warn"
    env.environ = {}
    assert by_name(run_doctor(env))["numa-binding"].status == "info"


def test_nccl_ib_hca_must_select_an_active_port(tmp_path):
    env = gpu_machine_with_nics(tmp_path)
    for value, status in (("mlx5", "info"), ("=mlx5_0", "info"), ("mlx5_0:1", "info"), ("^mlx5_0", "fail"),
                          ("=mlx5", "fail"), ("mlx5_0:2", "fail"), ("mlx4", "fail")):
        env.environ = {"NCCL_IB_HCA": value}
        found = by_name(run_doctor(env))["NCCL_IB_HCA"]
        assert found.status == status, (value, found)
        assert status == "info" or "mlx5_0:1" in found.fix or "down" in found.fix
    env = fake_env(tmp_path / "b", environ={"NCCL_IB_HCA": "mlx5"})  # no InfiniBand at all
    assert by_name(run_doctor(env))["NCCL_IB_HCA"].status == "warn"


def test_nccl_selection_syntax():
    from meshscale.app.doctor import nccl_selects

    names = ["eth0", "eth1", "ens1f0", "lo"]
    assert nccl_selects("eth", names) == ["eth0", "eth1"]
    assert nccl_selects("=eth0", names) == ["eth0"]
    assert nccl_selects("^eth,lo", names) == ["ens1f0"]
    assert nccl_selects("^=eth0", names) == ["eth1", "ens1f0", "lo"]
    assert nccl_selects("mlx5_1:1", ["mlx5_0:1", "mlx5_1:1", "mlx5_1:2"]) == ["mlx5_1:1"]


def test_ib_port_slower_than_the_fastest_warns(tmp_path):
    ib_port(tmp_path, "mlx5_0", f"{SWITCH0}/0000:19:04.0/0000:1b:00.0", 0)
    ib_port(tmp_path, "mlx5_1", f"{SWITCH1}/0000:9c:04.0/0000:9e:00.0", 1, rate="200 Gb/sec (4X HDR)")
    found = by_name(run_doctor(fake_env(tmp_path)))
    assert found["ib mlx5_0/1"].status == "pass"
    assert found["ib mlx5_1/1"].status == "warn" and "400 Gb/s" in found["ib mlx5_1/1"].message
    assert "ibstat" in found["ib mlx5_1/1"].fix


def test_a_link_down_on_an_eight_gpu_board_fails_even_in_a_vm(tmp_path):
    """Cloud 8-GPU machines are VMs with working NVLinks: a link down among live ones is a fault there too."""
    checks = by_name(run_doctor(fake_env(tmp_path, FakeNVML.machine("NVIDIA H100 80GB HBM3", links_down={5: 1}), vm=True)))
    assert checks["nvlink GPU5"].status == "fail" and "17 of 18" in checks["nvlink GPU5"].message
    assert "multi-GPU board" in checks["nvlink GPU5"].message
    assert checks["nvlink GPU0"].status == "pass"


def test_one_gpu_with_inactive_links_is_info_and_doctor_prints_no_fail(tmp_path):
    nvml = FakeNVML.machine("NVIDIA H100 80GB HBM3", gpus=1, links_down={0: 18})
    checks = run_doctor(fake_env(tmp_path, nvml, versions=dict(VERSIONS, cuda_devices=1)))
    link = by_name(checks)["nvlink GPU0"]
    assert link.status == "info" and "NVLink inactive: no peer visible" in link.message
    assert "one GPU visible" in link.message and "18 link(s) idle" in link.message
    assert [c for c in checks if c.status == "fail"] == []


def test_all_links_idle_in_a_vm_with_gpus_whose_links_have_no_known_far_end(tmp_path):
    """Two passed-through GPUs whose links NVML cannot follow anywhere: inactive, not broken."""
    nvml = FakeNVML.machine("NVIDIA A100-SXM4-80GB", gpus=2, nvlinks={0: [("", 9)] * 12, 1: [("", 9)] * 12},
                            links_down={0: 12, 1: 12})
    found = by_name(run_doctor(fake_env(tmp_path, nvml, vm=True)))
    for i in (0, 1):
        assert found[f"nvlink GPU{i}"].status == "info"
        assert "the CPU reports a hypervisor" in found[f"nvlink GPU{i}"].message


def test_nvml_virtualization_mode_marks_a_vm(tmp_path):
    nvml = FakeNVML.machine("NVIDIA A100-SXM4-80GB", gpus=2, nvlinks={0: [("", 9)] * 12, 1: [("", 9)] * 12},
                            links_down={0: 12, 1: 12})
    nvml.nvmlDeviceGetVirtualizationMode = lambda handle: 1  # passthrough
    found = by_name(run_doctor(fake_env(tmp_path, nvml)))
    assert "NVML reports GPU0 virtualized (mode 1)" in found["nvlink GPU0"].message


def test_one_gpu_whose_nvlink_state_nvml_cannot_report_is_info(tmp_path):
    """A one-GPU VM (seen on an H100 80GB HBM3 cloud VM): every nvmlDeviceGetNvLinkState raises, so NVML reports
    neither up nor down links; that is no fault."""
    nvml = FakeNVML.machine("NVIDIA H100 80GB HBM3", gpus=1, unsupported=("nvmlDeviceGetNvLinkState",))
    checks = run_doctor(fake_env(tmp_path, nvml, versions=dict(VERSIONS, cuda_devices=1)))
    link = by_name(checks)["nvlink GPU0"]
    assert link.status == "info" and "NVML reports no NVLink state" in link.message
    assert [c for c in checks if c.status == "fail"] == []
