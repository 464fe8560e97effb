"""`meshscale doctor`'s error and health counters: what DCGM's health watches look at, read from NVML (and
the kernel log for XIDs), each a pass/warn/fail/info line with what it means and what to do.

Sources (docs/references.md): NVIDIA's "XID Errors" guide (what each XID means), its "GPU Memory Error
Management" guide (ECC, page retirement, row remapping: a pending retirement/remap needs a GPU reset, a failed
remap an RMA), the NVML API reference (counter and throttle-reason encodings) and DCGM's user guide (health
watches and `dcgmi diag`). Counters that NVML does not support on a GPU (row remapping before Ampere, page
retirement after it) give no line. Link error counters (NVLink CRC, replay and recovery; PCIe replays) are judged
as DCGM judges them, by rate: read twice, the level's `COUNTER_INTERVAL_S` apart, against the limits of DCGM's
hardware-limits header (`CounterRule`); their counts since boot are info lines, past events."""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Callable

from meshscale.app.doctor_env import Check, DoctorEnv, nvml_gpus as gpus, nvml_text

# nvmlDeviceGetTotalEccErrors(handle, error type, counter type)
ECC_CORRECTED, ECC_UNCORRECTED = 0, 1
ECC_VOLATILE, ECC_AGGREGATE = 0, 1
# nvmlDeviceGetRetiredPages causes: pages retired after multiple single-bit errors, after a double-bit error
RETIRED_SINGLE_BIT, RETIRED_DOUBLE_BIT = 0, 1
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
class CounterRule:
    """How DCGM's health watch (DcgmHealthWatch.cpp) judges one corrected-error counter: its growth over the
    watch, as a rate per ``unit_s`` seconds, or with ``unit_s`` None as a count within the watch, against the
    limit of DCGM's hardware-limits header (`DCGM_LIMITS_HEADER`) named by ``source``."""

    counter: str
    limit: float
    unit_s: float | None
    source: str
    over: str  # the status at the limit (or above it)
    under: str  # the status of growth below the limit
    strict: bool = False  # DCGM compares with > (True) or >= (False)

    def rate(self, grew: int, seconds: float) -> float:
        """Growth per unit. A watch shorter than the unit gives a lower bound: the unit around it holds at least
        ``grew`` (one PCIe replay seen in 1 s is at least 1 per minute, not 60)."""
        return float(grew) if self.unit_s is None else grew * self.unit_s / max(seconds, self.unit_s)

    def status(self, grew: int, seconds: float) -> str:
        if grew <= 0:
            return "pass"
        rate = self.rate(grew, seconds)
        return self.over if (rate > self.limit if self.strict else rate >= self.limit) else self.under

    def _unit(self) -> str:
        return {None: " in the watch", 1: "/s", 60: "/min"}[self.unit_s]

    def reading(self, grew: int, seconds: float) -> str:
        if self.unit_s is None:
            return f"+{grew} in {seconds:.1f} s"
        said = "at least " if seconds < self.unit_s else ""
        return f"+{grew} in {seconds:.1f} s = {said}{self.rate(grew, seconds):.3g}{self._unit()}"

    def threshold(self) -> str:
        return (f"{self.over} at {'>' if self.strict else '>='} {self.limit:g}{self._unit()} per {self.source}, "
                f"DCGM's {DCGM_LIMITS_HEADER}")


DCGM_LIMITS_HEADER = "DcgmGPUHardwareLimits.h"
# "RM has informed us that CRC errors only matter at rates of 100+ per second"; growth below it warns
NVLINK_CRC_RULE = CounterRule("CRC", 100.0, 1, "DCGM_LIMIT_MAX_NVLINK_CRC_ERROR", "fail", "warn")
# "Replay and recovery errors are failures, not warnings": any within the watch
NVLINK_ERROR_RULE = CounterRule("replay/recovery", 1, None, "DCGM_LIMIT_MAX_NVLINK_ERROR", "fail", "fail")
# "8 replays per minute is the maximum recommended by RM"; DCGM warns above it
PCIE_REPLAY_RULE = CounterRule("PCIe replays", 8, 60, "DCGM_LIMIT_MAX_PCIREPLAY_RATE", "warn", "pass", strict=True)
# nvmlDeviceGetNvLinkErrorCounter's counters and their rules
NVLINK_RULES = {0: replace(NVLINK_ERROR_RULE, counter="replay"), 1: replace(NVLINK_ERROR_RULE, counter="recovery"),
                2: replace(NVLINK_CRC_RULE, counter="CRC flit"), 3: replace(NVLINK_CRC_RULE, counter="CRC data")}


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
        for counter in NVLINK_RULES:
            value = _call(env.nvml.nvmlDeviceGetNvLinkErrorCounter, handle, link, counter)
            if value is not None:
                counts[link, counter] = int(value)
    return counts


def _read_counters(env: DoctorEnv, listed) -> dict[int, tuple[dict, int | None]]:
    """{gpu: ({(link, counter): count}, PCIe replays or None)}."""
    return {i: (_nvlink_counts(env, h), _call(env.nvml.nvmlDeviceGetPcieReplayCounter, h)) for i, h, _ in listed}


def check_link_errors(env: DoctorEnv) -> list[Check]:
    """NVLink replay/recovery/CRC counters per link and the PCIe replay counter, judged as DCGM's health watch
    judges them: by their growth while doctor watches (``env.counter_interval_s``, timed by ``env.clock``), each
    verdict with its DCGM limit. Their counts since the driver loaded are info lines: past events, not a rate."""
    if env.nvml is None:
        return []
    listed = gpus(env)
    started = env.clock()
    first = _read_counters(env, listed)
    if not any(links or pcie is not None for links, pcie in first.values()):
        return []  # no GPU supports either counter: nothing to watch
    env.sleep(env.counter_interval_s)
    # Both reads walk the counters in the same order, so each counter's window is the time between the reads' starts.
    seconds = max(env.clock() - started, 1e-9)
    second = _read_counters(env, listed)
    out = []
    for i, _, _ in listed:
        (links0, pcie0), (links1, pcie1) = first[i], second[i]
        if links1:
            out += _nvlink_lines(i, links0, links1, seconds)
        if pcie1 is not None:
            out += _pcie_replay_lines(i, pcie0 or 0, pcie1, seconds)
    return out


def _since_boot(name: str, counts: list[str]) -> list[Check]:
    """The info line of counts since the driver loaded (none when every count is zero)."""
    if not counts:
        return []
    more = f" (+{len(counts) - 6} more)" if len(counts) > 6 else ""
    return [Check("info", f"{name} since boot", "; ".join(counts[:6]) + more + ": counts since the driver loaded, "
                  "past events, not judged (DCGM judges the rate: the line above)",
                  "rerun doctor while a job runs to see whether they grow under load")]


def _nvlink_lines(gpu: int, before: dict, after: dict, seconds: float) -> list[Check]:
    grown = []
    for (link, counter), value in sorted(after.items()):
        rule = NVLINK_RULES[counter]
        grew = value - before.get((link, counter), value)
        if grew > 0:
            grown.append((rule.status(grew, seconds), f"link {link} {rule.counter} {rule.reading(grew, seconds)} "
                          f"({rule.threshold()})"))
    counts = [f"link {link} {NVLINK_RULES[c].counter} {v}" for (link, c), v in sorted(after.items()) if v]
    name = f"nvlink-errors GPU{gpu}"
    if not grown:
        links = len({link for link, _ in after})
        line = Check("pass", name, f"no replay, recovery or CRC counter grew in {seconds:.1f} s on {links} link(s) "
                     f"(CRC {NVLINK_CRC_RULE.threshold()}; replay/recovery {NVLINK_ERROR_RULE.threshold()})")
        return [line] + _since_boot(name, counts)
    status = _worst(s for s, _ in grown)
    fix = ("a link with CRC errors at DCGM's rate, or replaying/recovering, corrupts or stalls traffic: drain the "
           "node, reseat the GPU baseboard/cables, check the fabric manager log, RMA if it persists"
           if status == "fail" else "CRC errors below DCGM's limit: rerun doctor (a longer --level watches longer) "
           "and watch whether the rate climbs")
    message = "; ".join(text for _, text in grown[:6]) + (f" (+{len(grown) - 6} more)" if len(grown) > 6 else "")
    return [Check(status, name, message, fix if status != "pass" else "")] + _since_boot(name, counts)


def _pcie_replay_lines(gpu: int, before: int, after: int, seconds: float) -> list[Check]:
    name = f"pcie-replay GPU{gpu}"
    grew = after - before
    status = PCIE_REPLAY_RULE.status(grew, seconds)
    now = PCIE_REPLAY_RULE.reading(grew, seconds) if grew > 0 else f"none in {seconds:.1f} s"
    line = Check(status, name, f"PCIe replays {now} ({PCIE_REPLAY_RULE.threshold()})",
                 "reseat the card and riser, check the slot; a replaying link loses bandwidth to every copy"
                 if status != "pass" else "")
    return [line] + _since_boot(name, [f"PCIe replay counter {after}"] if after else [])


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
