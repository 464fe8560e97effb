"""`doctor`'s deployment checks: the container runtime NVIDIA's NGC guide relies on, and the GPU's partitions.

NGC containers (seed 002) carry CUDA, cuDNN, NCCL and the framework; the host carries only the driver, and the
NVIDIA Container Toolkit hands the GPUs into the container (`docker run --gpus all`). The guide's run line adds
`--shm-size=1g --ulimit memlock=-1` (seed 003 too): the data loader's workers and NCCL's shared-memory transport
need more than Docker's 64 MiB /dev/shm, and RDMA pins memory. A container's CUDA runs on the host's driver when
the driver supports that CUDA version (CUDA's minor version compatibility: the same major version is enough for
most programs; a newer major needs the forward-compatibility package, on datacenter GPUs only).

Partitions (seed 004): a GPU in MIG mode shows its instances with each one's shares (MIG User Guide); ranks on
MIG instances exchange through host memory, never over NVLink.
"""
from __future__ import annotations

import re
import shutil

from meshscale.app.doctor_env import Check, DoctorEnv, ib_devices, nvml_gpus, nvml_text
from meshscale.units import format_bytes

CONTAINER_MARKERS = (".dockerenv", "run/.containerenv")  # Docker's and Podman's
CGROUP_WORDS = ("docker", "containerd", "kubepods", "libpod", "lxc")
SHM_MIN_BYTES = 1 << 30  # NCCL's shared-memory transport and DataLoader workers need more than Docker's 64 MiB


def in_container(env: DoctorEnv) -> str:
    """What says this runs in a container ('' if nothing does): a runtime's marker file, the cgroup, $container."""
    root = env.sys_root
    for marker in CONTAINER_MARKERS:
        if (root / marker).exists():
            return f"/{marker} exists"
    try:
        cgroup = (root / "proc/1/cgroup").read_text()
    except OSError:
        cgroup = ""
    word = next((w for w in CGROUP_WORDS if w in cgroup), None)
    if word:
        return f"PID 1's cgroup names {word}"
    if env.environ.get("container"):
        return f"$container={env.environ['container']}"
    return ""


def _cuda_of(code: int | None) -> tuple[int, int] | None:
    """NVML's CUDA driver version (12040) as (12, 4)."""
    return (code // 1000, code % 1000 // 10) if code else None


def _version(text: str | None) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def check_cuda_against_driver(env: DoctorEnv) -> list[Check]:
    """The CUDA the framework was built with (and the image's NCCL) against what the host's driver supports."""
    versions = env.versions()
    runtime = _version(versions.get("cuda")) or _version(env.environ.get("CUDA_VERSION"))
    nccl = versions.get("nccl") or env.environ.get("NCCL_VERSION")
    if env.nvml is None or runtime is None:
        return [Check("info", "cuda-driver", "no driver or no CUDA build here: nothing to match")]
    try:
        supported = _cuda_of(env.nvml.nvmlSystemGetCudaDriverVersion())
    except Exception:  # an old driver lacks the call
        supported = None
    driver = nvml_text(env.nvml.nvmlSystemGetDriverVersion())
    what = f"CUDA {runtime[0]}.{runtime[1]} (NCCL {nccl or '?'}) on driver {driver}"
    if supported is None:
        return [Check("info", "cuda-driver", f"{what}: the driver does not say which CUDA it supports")]
    said = f"{what}, which supports CUDA up to {supported[0]}.{supported[1]}"
    if runtime <= supported:
        return [Check("pass", "cuda-driver", said)]
    compat = (env.sys_root / "usr/local/cuda/compat").is_dir()
    fix = ("use an NGC image (or PyTorch build) for CUDA <= "
           f"{supported[0]}.{supported[1]}, or upgrade the host driver")
    if runtime[0] > supported[0]:
        if compat:
            return [Check("warn", "cuda-driver", f"{said}: runs only through the image's forward-compatibility package "
                          "(datacenter GPUs only)", fix)]
        return [Check("fail", "cuda-driver", f"{said}: a newer CUDA major version than the driver's, CUDA calls fail",
                      fix)]
    return [Check("warn", "cuda-driver", f"{said}: minor-version compatibility runs most code, but kernels JIT-compiled "
                  "from newer PTX fail", fix)]


def check_shm(env: DoctorEnv) -> list[Check]:
    try:
        st = env.statvfs(str(env.shm_path))
    except OSError:
        return [Check("fail", "shm", f"{env.shm_path} is missing", "mount a tmpfs there; in Docker pass --shm-size=1g or --ipc=host")]
    size = st.f_blocks * st.f_frsize
    gib = size / (1 << 30)
    if size < SHM_MIN_BYTES:
        return [Check("warn", "shm", f"{env.shm_path} is only {size / (1 << 20):.0f} MiB (Docker's default is 64 MiB)",
                      "run the container with --shm-size=1g (or --ipc=host); NCCL and DataLoader workers need it")]
    return [Check("pass", "shm", f"{env.shm_path} is {gib:.1f} GiB")]


def check_memlock(env: DoctorEnv) -> list[Check]:
    limit = env.memlock_bytes()
    if limit < 0:
        return [Check("pass", "memlock", "locked-memory limit is unlimited")]
    fix = "raise it: in Docker --ulimit memlock=-1, on a host `* - memlock unlimited` in /etc/security/limits.conf"
    if ib_devices(env):
        return [Check("warn", "memlock", f"locked-memory limit is {format_bytes(limit)}: RDMA over InfiniBand needs to pin "
                      "buffers and NCCL may fail or fall back to sockets", fix)]
    return [Check("info", "memlock", f"locked-memory limit is {format_bytes(limit)} (matters only for InfiniBand/RDMA)", fix)]


def check_container(env: DoctorEnv) -> list[Check]:
    """Inside a container: the NVIDIA Container Toolkit's hand-over of the GPUs and the NGC guide's run flags.
    On a host: whether the toolkit is installed (for running NGC images)."""
    how = in_container(env)
    if not how:
        tool = next((t for t in ("nvidia-ctk", "nvidia-container-cli") if shutil.which(t)), None)
        if tool:
            return [Check("info", "container", f"not in a container; the NVIDIA Container Toolkit is installed ({tool})")]
        return [Check("info", "container", "not in a container; no NVIDIA Container Toolkit on PATH (needed to run "
                      "NGC images with `docker run --gpus all`)")]
    out = []
    handed = env.environ.get("NVIDIA_VISIBLE_DEVICES")
    devices = (env.sys_root / "dev/nvidiactl").exists()
    if env.nvml is None and not devices and not env.versions().get("cuda"):
        out.append(Check("info", "container-gpus", f"in a CPU-only container ({how}): no GPU handed in, CPU workers "
                         "only", "for GPUs: an NGC image and `docker run --gpus all` (NVIDIA Container Toolkit)"))
    elif env.nvml is None and not devices:
        out.append(Check("fail", "container-gpus", f"in a container ({how}) with no GPU device and no NVML: the NVIDIA "
                         "Container Toolkit did not hand the GPUs in", "run with `docker run --gpus all` (or "
                         "--runtime=nvidia); install the NVIDIA Container Toolkit on the host"))
    else:
        out.append(Check("pass", "container-gpus", f"in a container ({how}); GPUs handed in by the NVIDIA Container "
                         f"Toolkit (NVIDIA_VISIBLE_DEVICES={handed or 'unset'})"))
    flags = {"--shm-size=1g": check_shm(env), "--ulimit memlock=-1": check_memlock(env)}
    wrong = [flag for flag, checks in flags.items() if any(c.status in ("warn", "fail") for c in checks)]
    unset = [flag for flag, checks in flags.items() if flag not in wrong and any(c.status == "info" for c in checks)]
    if wrong:
        out.append(Check("warn", "container-flags", f"the NGC run flags {' '.join(wrong)} seem missing (see shm and "
                         "memlock)", f"docker run --gpus all --ipc=host {' '.join(wrong + unset)} ..."))
    elif unset:
        out.append(Check("info", "container-flags", f"{' '.join(unset)} not given, as the NGC guide asks (it matters "
                         "here only for InfiniBand/RDMA)", f"docker run --gpus all --ipc=host {' '.join(unset)} ..."))
    else:
        out.append(Check("pass", "container-flags", "shared memory and locked memory as the NGC guide asks"))
    return out + check_cuda_against_driver(env)


def check_partitions(env: DoctorEnv) -> list[Check]:
    """GPUs in MIG mode and their instances, each with its shares of the GPU (as `predict --partition` takes)."""
    if env.nvml is None:
        return [Check("info", "partitions", "no GPU: no partitions")]
    from meshscale.topology.nvml_discovery import mig_instances
    from meshscale.topology.partitions import partition_text

    out = []
    for i, handle, name in nvml_gpus(env):
        try:
            mode = env.nvml.nvmlDeviceGetMigMode(handle)
        except Exception:  # a GPU without MIG
            continue
        if not mode or mode[0] != getattr(env.nvml, "NVML_DEVICE_MIG_ENABLE", 1):
            continue
        instances = mig_instances(env.nvml, handle)
        profiles = [partition_text(inst.get("name", ""), name) for inst in instances]
        out.append(Check("info", f"mig GPU{i}", f"MIG on, {len(instances)} instance(s): {'; '.join(profiles) or 'none'}; "
                         "ranks on different instances exchange through host memory (no NVLink or P2P)"))
    return out or [Check("info", "partitions", "no GPU in MIG mode (whole GPUs)")]
