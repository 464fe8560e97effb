"""What `meshscale doctor`'s checks look at and what they say: `DoctorEnv` (paths, environment, NVML module,
limits; `real()` reads this machine, tests build it by hand), `Check` (one line of output), and the readings
several checks share (the GPUs NVML sees, the InfiniBand devices, the kernel log). doctor.py, health.py and
deployment.py hold the checks."""
from __future__ import annotations

import os
import resource
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

# Seconds doctor watches the corrected-error counters, per level: level 3 watches DCGM's own health-watch window
# (one minute); a longer watch resolves lower rates (one PCIe replay in 1 s reads as 60 per minute).
COUNTER_INTERVAL_S = {1: 1.0, 2: 5.0, 3: 60.0}


@dataclass
class Check:
    """One line of doctor's output."""

    status: str  # pass, warn, fail or info
    name: str
    message: str
    fix: str = ""


def kernel_log() -> str:
    """The kernel ring buffer (`dmesg`), or "" where it cannot be read (no permission, no dmesg)."""
    try:
        return subprocess.run(["dmesg"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def _memlock_bytes() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return -1 if soft == resource.RLIM_INFINITY else soft


def _versions() -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    out: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": None,
                           "cuda_devices": torch.cuda.device_count() if torch.version.cuda else 0,
                           "gloo": dist.is_available() and dist.is_gloo_available()}
    try:
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if torch.version.cuda else None
    except Exception:
        pass
    return out


@dataclass
class DoctorEnv:
    """What the checks look at. `real()` fills it from this machine; tests build it by hand."""

    environ: dict[str, str] = field(default_factory=dict)
    nvml: Any = None  # an initialised pynvml-like module, or None when there is no driver
    nvml_error: str = ""  # why nvml is None
    shm_path: Path = Path("/dev/shm")
    net_dir: Path = Path("/sys/class/net")
    ib_dir: Path = Path("/sys/class/infiniband")
    sys_root: Path = Path("/")  # where /sys/bus/pci/devices lies (GPUs' PCI paths)
    proc_modules: Path = Path("/proc/modules")
    cpuinfo: Path = Path("/proc/cpuinfo")  # its "hypervisor" flag says this is a virtual machine
    cpu_affinity: Callable[[], set[int]] = lambda: os.sched_getaffinity(0)
    statvfs: Callable[[str], Any] = os.statvfs
    memlock_bytes: Callable[[], int] = _memlock_bytes  # -1 when unlimited
    versions: Callable[[], dict[str, Any]] = _versions
    kernel_log: Callable[[], str] = lambda: ""  # the kernel ring buffer (XID lines); real() reads dmesg
    sleep: Callable[[float], None] = time.sleep  # between two reads of the error counters
    clock: Callable[[], float] = time.monotonic  # times that wait: a counter's rate is its growth over it
    counter_interval_s: float = COUNTER_INTERVAL_S[1]  # the wait; `run_levels` sets its level's

    @classmethod
    def real(cls) -> "DoctorEnv":
        nvml, error = None, ""
        try:
            import pynvml
            pynvml.nvmlInit()
            nvml = pynvml
        except Exception as exc:  # library missing, no driver, driver/library mismatch
            error = f"{type(exc).__name__}: {exc}".strip(": ")
        return cls(environ=dict(os.environ), nvml=nvml, nvml_error=error, kernel_log=kernel_log)


def nvml_text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_gpus(env: DoctorEnv) -> list[tuple[int, Any, str]]:
    """(index, handle, name) of every GPU NVML sees."""
    nvml = env.nvml
    out = []
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        out.append((i, handle, nvml_text(nvml.nvmlDeviceGetName(handle))))
    return out


def ib_devices(env: DoctorEnv) -> list[str]:
    try:
        return sorted(p.name for p in env.ib_dir.iterdir())
    except OSError:
        return []
