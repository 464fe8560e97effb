"""doctor's error and health counters on faked GPUs: each bad state gives a warn or fail line with its fix, a
healthy GPU passes, and a counter the GPU lacks gives no line."""
from __future__ import annotations

from meshscale.app import health
from meshscale.app.doctor import run_doctor

from conftest import FakeNVML
from test_report_doctor import by_name, fake_env

HEALTHY = {"ecc": {(k, w): 0 for k in (0, 1) for w in (0, 1)}, "remapped_rows": (0, 0, 0, 0),
           "nvlink_errors": {(link, c): 0 for link in range(18) for c in range(4)}, "pcie_replay": 0,
           "throttle": 0, "persistence": 1, "pstate": 8}


def machine(gpus=2, **bad):
    """An H100 machine whose GPUs report healthy counters; ``bad`` = {gpu: {key: value}} overrides."""
    nvml = FakeNVML.machine("NVIDIA H100 80GB HBM3", gpus=gpus, pcie=(5, 16), pcie_now=bad.pop("pcie_now", None))
    for g, gpu in enumerate(nvml.gpus):
        gpu.update({k: (dict(v) if isinstance(v, dict) else v) for k, v in HEALTHY.items()})
        gpu.update(bad.get(f"gpu{g}", {}))
    return nvml


def doctor(tmp_path, nvml, log=""):
    env = fake_env(tmp_path, nvml)
    env.kernel_log = lambda: log
    slept = []
    env.sleep = slept.append
    return by_name(run_doctor(env)), slept


def test_healthy_counters_pass_without_waiting(tmp_path):
    found, slept = doctor(tmp_path, machine(), log="[  1.0] nvidia: loading\n")
    for name in ("ecc", "row-remap", "nvlink-errors", "pcie-replay", "throttle", "xid"):
        assert found[f"{name} GPU1"].status == "pass", found[f"{name} GPU1"]
    assert found["persistence"].status == "pass"
    assert slept == []  # nothing non-zero: no second read


def test_row_remap_failure_fails_and_pending_warns(tmp_path):
    found, _ = doctor(tmp_path, machine(gpu0={"remapped_rows": (3, 1, 0, 1)}, gpu1={"remapped_rows": (0, 1, 1, 0)}))
    assert found["row-remap GPU0"].status == "fail" and "RMA" in found["row-remap GPU0"].fix
    assert found["row-remap GPU1"].status == "warn" and "reset" in found["row-remap GPU1"].fix


def test_retired_pages_on_gpus_without_row_remapping(tmp_path):
    nvml = machine(gpu0={"remapped_rows": "ERR:NotSupported", "retired_pages": {0: [0x10], 1: [0x20, 0x30]},
                         "retired_pending": 1})
    found, _ = doctor(tmp_path, nvml)
    assert "row-remap GPU0" not in found
    assert found["retired-pages GPU0"].status == "warn" and "1 page(s)" in found["retired-pages GPU0"].message
    assert "pending" in found["retired-pages GPU0"].message
    assert "retired-pages GPU1" not in found  # GPU1 has row remapping instead


def test_rising_nvlink_crc_fails_and_a_fixed_count_warns(tmp_path):
    rising = {**HEALTHY["nvlink_errors"], (5, 3): [10, 42]}  # CRC data errors grow between the two reads
    fixed = {**HEALTHY["nvlink_errors"], (2, 0): 7}
    found, slept = doctor(tmp_path, machine(gpu0={"nvlink_errors": rising}, gpu1={"nvlink_errors": fixed}))
    assert slept == [health.COUNTER_INTERVAL_S]
    assert found["nvlink-errors GPU0"].status == "fail"
    assert "link 5 CRC data 42 (up 32" in found["nvlink-errors GPU0"].message and "reseat" in found["nvlink-errors GPU0"].fix
    assert found["nvlink-errors GPU1"].status == "warn" and "link 2 replay 7" in found["nvlink-errors GPU1"].message


def test_pcie_replays_and_a_link_at_gen3_x8(tmp_path):
    nvml = machine(pcie_now={1: (3, 8)}, gpu0={"pcie_replay": [5, 9]}, gpu1={"pcie_replay": 4})
    found, _ = doctor(tmp_path, nvml)
    assert found["pcie-replay GPU0"].status == "fail" and found["pcie-replay GPU1"].status == "warn"
    pcie = found["pcie GPU1"]
    assert pcie.status == "warn" and "x8 of x16" in pcie.message and "gen 3 of 5" in pcie.message
    assert "7.9 GB/s of 63.0 GB/s" in pcie.message and "reseat" in pcie.fix


def test_low_pcie_generation_warns_only_when_busy(tmp_path):
    idle, _ = doctor(tmp_path / "a", machine(pcie_now={0: (3, 16)}))
    busy, _ = doctor(tmp_path / "b", machine(pcie_now={0: (3, 16)}, gpu0={"pstate": 0}))
    assert idle["pcie GPU0"].status == "info" and busy["pcie GPU0"].status == "warn"


def test_thermal_and_power_throttles(tmp_path):
    found, _ = doctor(tmp_path, machine(gpu0={"throttle": 0x40 | 0x4}, gpu1={"throttle": 0x4}))
    assert found["throttle GPU0"].status == "fail" and "thermal" in found["throttle GPU0"].message
    assert "airflow" in found["throttle GPU0"].fix
    assert found["throttle GPU1"].status == "info"  # a power cap under load is normal


def test_ecc_uncorrected_since_boot_fails_and_lifetime_warns(tmp_path):
    ecc0 = {**HEALTHY["ecc"], (1, 0): 2, (1, 1): 2}
    ecc1 = {**HEALTHY["ecc"], (1, 1): 1, (0, 1): 100}
    found, _ = doctor(tmp_path, machine(gpu0={"ecc": ecc0}, gpu1={"ecc": ecc1}))
    assert found["ecc GPU0"].status == "fail" and found["ecc GPU1"].status == "warn"


def test_persistence_off_warns(tmp_path):
    found, _ = doctor(tmp_path, machine(gpu1={"persistence": 0}))
    assert found["persistence"].status == "warn" and "GPU1" in found["persistence"].message
    assert "nvidia-persistenced" in found["persistence"].fix


def test_xid_lines_are_matched_to_their_gpu(tmp_path):
    log = ("[ 10.1] NVRM: Xid (PCI:0000:19:00): 79, pid=1234, GPU has fallen off the bus.\n"
           "[ 11.0] NVRM: Xid (PCI:0000:19:00): 45, pid=1234, Ch 00000010\n")
    found, _ = doctor(tmp_path, machine(), log=log)
    assert found["xid GPU1"].status == "fail" and "XID 79" in found["xid GPU1"].message  # bus 00000000:19:00.0
    assert found["xid GPU0"].status == "pass"


def test_unreadable_kernel_log_is_info(tmp_path):
    found, _ = doctor(tmp_path, machine(), log="")
    assert found["xid"].status == "info" and "dmesg" in found["xid"].fix
