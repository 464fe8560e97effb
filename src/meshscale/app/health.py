"""`meshscale doctor`'s error and health counters: what DCGM's health watches look at, read from NVML (and
the kernel log for XIDs), each a pass/warn/fail/info line with what it means and what to do.

Sources (docs/references.md): NVIDIA's "XID Errors" guide (what each XID means), its "GPU Memory Error
Management" guide (ECC, page retirement, row remapping: a pending retirement/remap needs a GPU reset, a failed
remap an RMA), the NVML API reference (counter and throttle-reason encodings) and DCGM's user guide (health
watches and `dcgmi diag`). Counters that NVML does not support on a GPU (row remapping before Ampere, page
retirement after it) give no line. Link error counters are read twice, `COUNTER_INTERVAL_S` apart, only where one
is non-zero: a count that grows while doctor watches is a live fault, a fixed one a past event."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from meshscale.app.doctor_env import Check, DoctorEnv, nvml_gpus as gpus, nvml_text

COUNTER_INTERVAL_S = 0.5

# nvmlDeviceGetTotalEccErrors(handle, error type, counter type)
ECC_CORRECTED, ECC_UNCORRECTED = 0, 1
ECC_VOLATILE, ECC_AGGREGATE = 0, 1
# nvmlDeviceGetRetiredPages causes: pages retired after multiple single-bit errors, after a double-bit error
RETIRED_SINGLE_BIT, RETIRED_DOUBLE_BIT = 0, 1
# nvmlDeviceGetNvLinkErrorCounter counters, and the verdict when the count grows while doctor watches
NVLINK_COUNTERS = {0: ("replay", "warn"), 1: ("recovery", "fail"), 2: ("CRC flit", "fail"), 3: ("CRC data", "fail")}
# nvmlClocksEventReasons bits (formerly ...ClocksThrottleReasons): (meaning, status)
THROTTLE_REASONS = {
    0x4: ("software power cap (drawing its power limit; normal at full load)", "info"),
    0x8: ("hardware slowdown (power brake or over-temperature signalled by the board)", "fail"),
    0x20: ("software thermal slowdown (the GPU or its memory is above its maximum operating temperature)", "warn"),
    0x40: ("hardware thermal slowdown (temperature too high: clocks cut by at least half)", "fail"),
    0x80: ("hardware power brake (an external power brake assertion, e.g. the power supply)", "fail"),
}
THROTTLE_FIX = ("check `nvidia-smi -q -d PERFORMANCE,TEMPERATURE,POWER`: airflow, fan and inlet temperature, the "
                "power supply and cables; a GPU that slows down stalls every collective it is in")

# XID codes from NVIDIA's "XID Errors" guide: (meaning, status)
XIDS = {
    13: ("graphics engine exception (often an application bug, e.g. an out-of-range access)", "warn"),
    31: ("GPU memory page fault (an illegal address: usually the application)", "warn"),
    43: ("GPU stopped processing (a fault in the application's kernel)", "warn"),
    45: ("preemptive cleanup after a previous error", "info"),
    48: ("double-bit ECC error", "fail"),
    61: ("internal micro-controller breakpoint/warning", "warn"),
    62: ("internal micro-controller halt", "fail"),
    63: ("ECC page retirement or row remapping recorded", "warn"),
    64: ("ECC page retirement or row remapping failure", "fail"),
    74: ("NVLink error", "fail"),
    79: ("GPU has fallen off the bus", "fail"),
    92: ("high single-bit ECC error rate", "warn"),
    94: ("contained ECC error (the affected application was stopped)", "warn"),
    95: ("uncontained ECC error (every application on the GPU was stopped)", "fail"),
    119: ("GSP RPC timeout", "fail"),
    120: ("GSP error", "fail"),
}
XID_FIX = ("see NVIDIA's XID guide for the code; reset the GPU (`nvidia-smi -r`) or reboot, and drain the node "
           "if it recurs (a fail code that repeats means RMA)")
_XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+)")
_STATUS_ORDER = ("pass", "info", "warn", "fail")


@dataclass(frozen=True)
class XidEvent:
    """One `NVRM: Xid` line of the kernel log."""

    bus_id: str  # as the kernel writes it, e.g. 0000:18:00
    code: int


def xid_events(log: str) -> list[XidEvent]:
    return [XidEvent(m.group(1).lower(), int(m.group(2))) for m in _XID_LINE.finditer(log)]


def _worst(statuses) -> str:
    return max(statuses, key=_STATUS_ORDER.index, default="pass")


def _call(fn, *args):
    """An NVML call's answer, or None where this GPU or driver does not support it."""
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported and kin: the counter does not exist here
        return None


def _bus_match(nvml_bus: str, kernel_bus: str) -> bool:
    """NVML's 00000000:18:00.0 against the kernel's 0000:18:00 (domain widths differ)."""
    domain, _, rest = nvml_bus.lower().partition(":")
    k_domain, _, k_rest = kernel_bus.partition(":")
    return rest.startswith(k_rest) and int(domain or "0", 16) == int(k_domain or "0", 16)


def check_xid(env: DoctorEnv) -> list[Check]:
    if env.nvml is None:
        return []
    log = env.kernel_log()
    if not log:
        return [Check("info", "xid", "the kernel log is not readable here: XID events unknown",
                      "run doctor as root (or with CAP_SYSLOG) to read `dmesg`, or check `dcgmi health -c`")]
    events = xid_events(log)
    out = []
    for i, handle, _ in gpus(env):
        bus = nvml_text(env.nvml.nvmlDeviceGetPciInfo(handle).busId)
        codes = sorted({e.code for e in events if _bus_match(bus, e.bus_id)})
        if not codes:
            out.append(Check("pass", f"xid GPU{i}", "no XID event in the kernel log (as far back as its buffer reaches)"))
            continue
        said = [f"XID {c}: {XIDS.get(c, ('see the XID guide', 'warn'))[0]}" for c in codes]
        status = _worst(XIDS.get(c, ("", "warn"))[1] for c in codes)
        out.append(Check(status, f"xid GPU{i}", "; ".join(said), XID_FIX))
    return out


def _per_gpu(env: DoctorEnv, check_one: Callable[[Any, int, Any], list[Check]]) -> list[Check]:
    """``check_one(nvml, index, handle)``'s lines for every GPU; none without NVML."""
    if env.nvml is None:
        return []
    return [line for i, handle, _ in gpus(env) for line in check_one(env.nvml, i, handle)]


def check_ecc(env: DoctorEnv) -> list[Check]:
    return _per_gpu(env, _ecc)


def _ecc(nvml: Any, i: int, handle: Any) -> list[Check]:
    """Uncorrected errors since the driver loaded (volatile) and over the GPU's life (aggregate)."""
    count = {(kind, when): _call(nvml.nvmlDeviceGetTotalEccErrors, handle, kind, when)
             for kind in (ECC_CORRECTED, ECC_UNCORRECTED) for when in (ECC_VOLATILE, ECC_AGGREGATE)}
    if all(v is None for v in count.values()):
        return []  # ECC off or not supported (consumer GPUs)
    text = (f"uncorrected {count[ECC_UNCORRECTED, ECC_VOLATILE]} since boot, {count[ECC_UNCORRECTED, ECC_AGGREGATE]} "
            f"lifetime; corrected {count[ECC_CORRECTED, ECC_VOLATILE]} since boot, "
            f"{count[ECC_CORRECTED, ECC_AGGREGATE]} lifetime")
    if count[ECC_UNCORRECTED, ECC_VOLATILE]:
        return [Check("fail", f"ecc GPU{i}", text + ": memory errors ECC could not correct",
                      "drain the GPU and reset it (`nvidia-smi -r`) so the bad rows are remapped/retired; "
                      "if uncorrected errors return, RMA")]
    if count[ECC_UNCORRECTED, ECC_AGGREGATE]:
        return [Check("warn", f"ecc GPU{i}", text + ": past uncorrected errors",
                      "check that their rows were remapped (`nvidia-smi -q -d ROW_REMAPPER`); watch for new ones")]
    return [Check("pass", f"ecc GPU{i}", text)]


def check_retired_memory(env: DoctorEnv) -> list[Check]:
    return _per_gpu(env, _retired_memory)


def _retired_memory(nvml: Any, i: int, handle: Any) -> list[Check]:
    """Row remapping (Ampere and later) and page retirement (earlier GPUs)."""
    rows = _call(nvml.nvmlDeviceGetRemappedRows, handle)
    if rows is not None:
        corrected, uncorrected, pending, failed = rows
        text = f"{corrected} row(s) remapped after corrected and {uncorrected} after uncorrected errors"
        if failed:
            return [Check("fail", f"row-remap GPU{i}", text + "; a remap FAILED (no spare row left)",
                          "the GPU cannot hide its bad memory any more: take it out of service and RMA it")]
        if pending:
            return [Check("warn", f"row-remap GPU{i}", text + "; a remap is pending until the GPU resets",
                          "drain the GPU and reset it (`nvidia-smi -r`) or reboot to apply the remap")]
        return [Check("pass", f"row-remap GPU{i}", text)]
    pages = [_call(nvml.nvmlDeviceGetRetiredPages, handle, cause) for cause in (RETIRED_SINGLE_BIT, RETIRED_DOUBLE_BIT)]
    pending = _call(nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
    if all(p is None for p in pages) and pending is None:
        return []
    single, double = (len(p or []) for p in pages)
    text = f"{single} page(s) retired after single-bit and {double} after double-bit errors"
    if pending:
        return [Check("warn", f"retired-pages GPU{i}", text + "; a retirement is pending until the GPU resets",
                      "drain the GPU and reset it (`nvidia-smi -r`) or reboot to retire the page")]
    if double:
        return [Check("warn", f"retired-pages GPU{i}", text,
                      "NVIDIA's guidance: RMA once retired pages reach the GPU's limit (60 on V100-class boards) "
                      "or when they keep growing")]
    return [Check("pass", f"retired-pages GPU{i}", text)]


def _nvlink_counts(env: DoctorEnv, handle) -> dict[tuple[int, int], int]:
    """{(link, counter): count} of every link NVML answers for."""
    counts = {}
    for link in range(int(getattr(env.nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        for counter in NVLINK_COUNTERS:
            value = _call(env.nvml.nvmlDeviceGetNvLinkErrorCounter, handle, link, counter)
            if value is not None:
                counts[link, counter] = int(value)
    return counts


def check_link_errors(env: DoctorEnv) -> list[Check]:
    """NVLink replay/recovery/CRC counters per link and the PCIe replay counter, each read twice where non-zero."""
    if env.nvml is None:
        return []
    nvml = env.nvml
    listed = gpus(env)
    first = {i: (_nvlink_counts(env, h), _call(nvml.nvmlDeviceGetPcieReplayCounter, h)) for i, h, _ in listed}
    if any(any(links.values()) or pcie for links, pcie in first.values()):
        env.sleep(COUNTER_INTERVAL_S)
        second = {i: (_nvlink_counts(env, h), _call(nvml.nvmlDeviceGetPcieReplayCounter, h)) for i, h, _ in listed}
    else:
        second = first
    out = []
    for i, _, _ in listed:
        (links0, pcie0), (links1, pcie1) = first[i], second[i]
        out += _nvlink_lines(i, links0, links1)
        if pcie1 is None:
            continue
        if pcie1 > (pcie0 or 0):
            out.append(Check("fail", f"pcie-replay GPU{i}", f"PCIe replay counter {pcie1}, up {pcie1 - pcie0} in "
                             f"{COUNTER_INTERVAL_S:g} s: the link is retransmitting now",
                             "reseat the card and riser, check the slot; a replaying link loses bandwidth to every copy"))
        elif pcie1:
            out.append(Check("warn", f"pcie-replay GPU{i}", f"PCIe replay counter {pcie1} since boot (not growing now)",
                             "watch it under load (`nvidia-smi -q | grep -i replay`); if it grows, reseat the card"))
        else:
            out.append(Check("pass", f"pcie-replay GPU{i}", "no PCIe replays"))
    return out


def _nvlink_lines(gpu: int, before: dict, after: dict) -> list[Check]:
    if not after:
        return []
    bad = []
    for (link, counter), value in sorted(after.items()):
        name, rising_status = NVLINK_COUNTERS[counter]
        grew = value - before.get((link, counter), value)
        if grew > 0:
            bad.append((rising_status, f"link {link} {name} {value} (up {grew} in {COUNTER_INTERVAL_S:g} s)"))
        elif value:
            bad.append(("warn", f"link {link} {name} {value}"))
    if not bad:
        links = len({link for link, _ in after})
        return [Check("pass", f"nvlink-errors GPU{gpu}", f"no replay, recovery or CRC errors on {links} link(s)")]
    status = _worst(s for s, _ in bad)
    fix = ("a link with growing CRC/recovery errors corrupts or stalls traffic: drain the node, reseat the GPU "
           "baseboard/cables, check the fabric manager log, RMA if it persists" if status == "fail" else
           "counts since the driver loaded: reset them (`nvidia-smi nvlink -e`) and watch whether they grow")
    return [Check(status, f"nvlink-errors GPU{gpu}", "; ".join(text for _, text in bad[:6])
                  + (f" (+{len(bad) - 6} more)" if len(bad) > 6 else ""), fix)]


def check_throttle(env: DoctorEnv) -> list[Check]:
    return _per_gpu(env, _throttle)


def _throttle(nvml: Any, i: int, handle: Any) -> list[Check]:
    read = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
        nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
    mask = _call(read, handle) if read else None
    if mask is None:
        return []
    found = [(text, status) for bit, (text, status) in THROTTLE_REASONS.items() if mask & bit]
    if not found:
        return [Check("pass", f"throttle GPU{i}", "no thermal, power or hardware slowdown")]
    status = _worst(s for _, s in found)
    return [Check(status, f"throttle GPU{i}", "clocks held down by " + "; ".join(t for t, _ in found),
                  THROTTLE_FIX if status != "info" else "")]


def check_persistence(env: DoctorEnv) -> list[Check]:
    if env.nvml is None:
        return []
    off = [i for i, handle, _ in gpus(env) if _call(env.nvml.nvmlDeviceGetPersistenceMode, handle) == 0]
    if not off:
        return [Check("pass", "persistence", "persistence mode on (or managed by nvidia-persistenced)")]
    return [Check("warn", "persistence", f"persistence mode off on GPU{', GPU'.join(map(str, off))}: the driver "
                  "tears the GPU down when no process holds it, so each job pays the initialization and loses "
                  "settings such as application clocks",
                  "run nvidia-persistenced (or `sudo nvidia-smi -pm 1`)")]


CHECKS = (check_xid, check_ecc, check_retired_memory, check_link_errors, check_throttle, check_persistence)
