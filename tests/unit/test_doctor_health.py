"""doctor's error and health counters on faked GPUs: each bad state gives a warn or fail line with its fix, a
healthy GPU passes, and a counter the GPU lacks gives no line."""
from __future__ import annotations

from meshscale.app import health
from meshscale.app.doctor import run_doctor, summary
from meshscale.app.doctor_env import Check

from conftest import FakeNVML
from test_report_doctor import FakeTime, by_name, fake_env

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


def doctor(tmp_path, nvml, log="", interval_s=None):
    env = fake_env(tmp_path, nvml)
    env.kernel_log = lambda: log
    time = FakeTime()
    env.clock, env.sleep = time.clock, time.sleep
    env.counter_interval_s = interval_s or env.counter_interval_s
    return by_name(run_doctor(env)), time.slept


def test_healthy_counters_pass_after_one_watch(tmp_path):
    found, slept = doctor(tmp_path, machine(), log="[  1.0] nvidia: loading\n", interval_s=2.0)
    for name in ("ecc", "row-remap", "nvlink-errors", "pcie-replay", "throttle", "xid"):
        assert found[f"{name} GPU1"].status == "pass", found[f"{name} GPU1"]
    assert found["persistence"].status == "pass"
    assert slept == [2.0]  # one wait of the level's interval, for every GPU at once
    assert "nvlink-errors GPU1 since boot" not in found  # nothing counted: no info line


def test_no_counter_supported_means_no_wait(tmp_path):
    nvml = machine()
    for gpu in nvml.gpus:
        del gpu["nvlink_errors"], gpu["pcie_replay"]
    found, slept = doctor(tmp_path, nvml)
    assert slept == [] and "nvlink-errors GPU0" not in found and "pcie-replay GPU0" not in found


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


def crc_errors(since_boot: int, per_s: float, interval_s: float) -> dict:
    """Link 5's CRC data counter: ``since_boot`` at the first read, growing at ``per_s`` over the watch."""
    return {**HEALTHY["nvlink_errors"], (5, 3): [since_boot, since_boot + round(per_s * interval_s)]}


def test_crc_counts_since_boot_are_info_and_the_rate_is_judged(tmp_path):
    limit = health.NVLINK_CRC_RULE.limit
    healthy, slow, fast = crc_errors(31, 0, 1.0), crc_errors(6, limit / 10, 1.0), crc_errors(31, limit * 1.5, 1.0)
    found, _ = doctor(tmp_path, machine(gpus=3, gpu0={"nvlink_errors": healthy}, gpu1={"nvlink_errors": slow},
                                        gpu2={"nvlink_errors": fast}), interval_s=1.0)
    assert found["nvlink-errors GPU0"].status == "pass"  # 31 since boot, none now: a healthy machine
    assert found["nvlink-errors GPU0 since boot"].status == "info" and "CRC data 31" in found["nvlink-errors GPU0 since boot"].message
    assert found["nvlink-errors GPU1"].status == "warn"  # growing, below DCGM's rate
    assert found["nvlink-errors GPU2"].status == "fail" and "reseat" in found["nvlink-errors GPU2"].fix
    said = found["nvlink-errors GPU2"].message
    assert f"{limit * 1.5:g}/s" in said and f">= {limit:g}/s" in said and "DCGM_LIMIT_MAX_NVLINK_CRC_ERROR" in said


def test_the_rate_divides_by_the_time_watched(tmp_path):
    limit = health.NVLINK_CRC_RULE.limit
    # the same growth fails over a short watch and only warns over a watch ten times longer
    short, _ = doctor(tmp_path / "a", machine(gpu0={"nvlink_errors": crc_errors(0, limit, 1.0)}), interval_s=1.0)
    long, slept = doctor(tmp_path / "b", machine(gpu0={"nvlink_errors": crc_errors(0, limit, 1.0)}), interval_s=10.0)
    assert short["nvlink-errors GPU0"].status == "fail" and long["nvlink-errors GPU0"].status == "warn"
    assert slept == [10.0]


def test_any_replay_or_recovery_in_the_watch_fails(tmp_path):
    replays = {**HEALTHY["nvlink_errors"], (2, 0): [7, 7 + health.NVLINK_ERROR_RULE.limit]}
    fixed = {**HEALTHY["nvlink_errors"], (2, 1): 7}
    found, _ = doctor(tmp_path, machine(gpu0={"nvlink_errors": replays}, gpu1={"nvlink_errors": fixed}))
    assert found["nvlink-errors GPU0"].status == "fail" and "DCGM_LIMIT_MAX_NVLINK_ERROR" in found["nvlink-errors GPU0"].message
    assert found["nvlink-errors GPU1"].status == "pass" and found["nvlink-errors GPU1 since boot"].status == "info"


def test_pcie_replays_warn_above_dcgms_rate_per_minute(tmp_path):
    per_min = health.PCIE_REPLAY_RULE.limit
    interval_s = 60.0
    above = {"pcie_replay": [5, 5 + int(per_min) + 1]}
    at = {"pcie_replay": [5, 5 + int(per_min)]}  # DCGM warns only above its limit
    found, _ = doctor(tmp_path, machine(gpus=3, gpu0=above, gpu1=at, gpu2={"pcie_replay": 4}), interval_s=interval_s)
    assert found["pcie-replay GPU0"].status == "warn" and "DCGM_LIMIT_MAX_PCIREPLAY_RATE" in found["pcie-replay GPU0"].message
    assert found["pcie-replay GPU1"].status == "pass"
    assert found["pcie-replay GPU2"].status == "pass" and found["pcie-replay GPU2 since boot"].status == "info"


def test_a_watch_shorter_than_the_unit_bounds_the_rate_from_below(tmp_path):
    # one replay seen in 1 s is at least 1 per minute, not 60: no warning; more than the limit in 1 s is one
    per_min = int(health.PCIE_REPLAY_RULE.limit)
    found, _ = doctor(tmp_path, machine(gpu0={"pcie_replay": [0, 1]}, gpu1={"pcie_replay": [0, per_min + 1]}),
                      interval_s=1.0)
    assert found["pcie-replay GPU0"].status == "pass" and "at least 1/min" in found["pcie-replay GPU0"].message
    assert found["pcie-replay GPU1"].status == "warn"


def test_summary_counts_each_status():
    checks = [Check("pass", "a", ""), Check("pass", "b", ""), Check("warn", "c", ""), Check("info", "d", "")]
    assert summary(checks) == "doctor: 2 passed, 1 warning, 0 failures, 1 info"
    assert summary(checks + [Check("fail", "e", "")] * 2).startswith("doctor: 2 passed, 1 warning, 2 failures")


def test_a_link_at_gen3_x8(tmp_path):
    found, _ = doctor(tmp_path, machine(pcie_now={1: (3, 8)}))
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
