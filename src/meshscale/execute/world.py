"""Where the ranks of a run go: how many, on GPUs over NCCL or on CPU worker processes over Gloo, from the
``--gpus`` / ``--cpus`` options that benchmarks, training and scaling sweeps share."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from meshscale.errors import MeshscaleError
from meshscale.units import is_digits

DEFAULT_CPU_WORKERS = 2


@dataclass
class World:
    """The ranks of a run: ``size`` processes over ``backend``; ``notice`` tells the user what was chosen."""

    size: int
    backend: str                     # nccl | gloo
    notice: str = ""

    @property
    def device(self) -> str:
        """The torch device type of every rank."""
        return "cuda" if self.backend == "nccl" else "cpu"


def in_torchrun() -> bool:
    """True when started by torchrun (or any launcher that sets RANK or WORLD_SIZE); the variables must then
    be usable (`launcher`)."""
    return launcher() is not None


LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
MAX_WORLD = 1 << 16
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"   # where torchrun's agent reads a failed rank's cause
LAUNCHER_REPORTS_ENV = "MESHSCALE_LAUNCHER_REPORTS"  # set by `meshscale launch`: it prints the ranks' errors


@dataclass(frozen=True)
class Launcher:
    """What a launcher (torchrun, or variables set by hand) told this process: its rank and the rendezvous."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    local_world_size: int = 1


def launcher(environ: Any = None) -> Launcher | None:
    """The launcher's variables, checked: None when neither RANK nor WORLD_SIZE is set; otherwise RANK,
    WORLD_SIZE, MASTER_ADDR and MASTER_PORT must all be set and sensible, each refused with one line."""
    env = os.environ if environ is None else environ
    if "RANK" not in env and "WORLD_SIZE" not in env:
        return None
    missing = [name for name in LAUNCHER_VARIABLES if not env.get(name, "").strip()]
    if missing:
        raise MeshscaleError(f"launcher variables: {', '.join(missing)} not set (RANK and WORLD_SIZE say a launcher "
                             "started this process); run under torchrun, or set all of "
                             f"{', '.join(LAUNCHER_VARIABLES)}, or none")
    world = _whole("WORLD_SIZE", env["WORLD_SIZE"], 1, MAX_WORLD)
    rank = _whole("RANK", env["RANK"], 0, world - 1)
    local_world = _whole("LOCAL_WORLD_SIZE", env.get("LOCAL_WORLD_SIZE", str(world)), 1, world)
    local_rank = _whole("LOCAL_RANK", env.get("LOCAL_RANK", "0"), 0, local_world - 1)
    port = _whole("MASTER_PORT", env["MASTER_PORT"], 1, 65535)
    host = env["MASTER_ADDR"].strip()
    if len(host) > 253 or any(c.isspace() or c in "\x00/" for c in host):
        raise MeshscaleError(f"MASTER_ADDR={host[:60]!r} is not a host name or address")
    return Launcher(rank, world, local_rank, host, port, local_world)


def tell_launcher(line: str) -> bool:
    """Record a failed rank's one-line error where torchrun's agent looks for it (TORCHELASTIC_ERROR_FILE, in
    the format torch's `ProcessFailure` reads: a string message and a timestamp). True when `meshscale launch`
    will print the line, so that the rank need not: in the agent's last attempt. Before it, the agent restarts
    the ranks (--max-restarts) and reports nothing, so the rank prints its line itself."""
    path = os.environ.get(ERROR_FILE_ENV)
    if not path:
        return False
    import json
    import time

    from meshscale.safe_io import atomic_write
    try:
        atomic_write(path, json.dumps({"message": line, "timestamp": int(time.time())}))
    except (MeshscaleError, OSError):
        return False
    restarts_left = _count(os.environ.get("TORCHELASTIC_MAX_RESTARTS")) - _count(
        os.environ.get("TORCHELASTIC_RESTART_COUNT"))
    return os.environ.get(LAUNCHER_REPORTS_ENV) == "1" and restarts_left <= 0


def _count(text: str | None) -> int:
    return int(text) if text and is_digits(text.strip()) else 0


def _whole(name: str, text: str, lo: int, hi: int) -> int:
    value = text.strip()
    if not is_digits(value) or not lo <= int(value) <= hi:
        raise MeshscaleError(f"{name}={text[:40]!r} is not a whole number in {lo}..{hi}; check the launcher's "
                             "variables")
    return int(value)


def gpu_count() -> int:
    import torch  # here, not at import: option parsing and --help must not pay for torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_gpus(count: int) -> None:
    """A clear error, before anything starts, when this machine has fewer than ``count`` GPUs."""
    have = gpu_count()
    if count > have:
        fix = f"use --gpus {have} or fewer" if have else "use --cpus N for CPU worker processes"
        raise MeshscaleError(f"--gpus {count}: this machine has {have} GPU{'' if have == 1 else 's'}; {fix}")


def usable_cores() -> int:
    """Cores this process may run on: its affinity mask where the OS keeps one (taskset or a container's cpuset
    narrows it below the machine's count), else os.cpu_count()."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def oversubscription(workers: int, backend: str) -> str:
    """The warning for ``workers`` CPU worker processes beyond the cores this process may use ("" when they fit).
    Not an error: the run works, but the workers take turns on the cores and every measured time includes it."""
    cores = usable_cores()
    if backend != "gloo" or workers <= cores:
        return ""
    return (f"meshscale: warning: {workers} CPU worker processes (--cpus {workers}) share {cores} "
            f"core{'s' if cores > 1 else ''}; they take turns, and the timings will show it")


def resolve_world(gpus: int | None, cpus: int | None, default: World | None = None) -> World:
    """``--gpus N`` (NCCL) or ``--cpus N`` (Gloo); with neither, ``default`` if given, else all GPUs if any,
    else `DEFAULT_CPU_WORKERS` CPU workers. Under torchrun the launcher's WORLD_SIZE wins and the backend
    follows the presence of GPUs (unless --cpus asks for Gloo)."""
    _not_both(gpus, cpus)
    env = launcher()
    if env is not None:
        have = gpu_count()
        if have and cpus is None and env.local_world_size > have:
            raise MeshscaleError(f"the launcher started {env.local_world_size} ranks on this node, which has {have} "
                                 f"GPU{'s' if have > 1 else ''}: start at most {have} per node (--nproc-per-node), "
                                 "or give --cpus for CPU workers over Gloo")
        return World(env.world_size, "nccl" if have and cpus is None else "gloo")
    if gpus is not None:
        _check_counts("--gpus", [gpus])
        return World(gpus, "nccl")
    if cpus is not None:
        _check_counts("--cpus", [cpus])
        return World(cpus, "gloo")
    if default is not None:
        return default
    if gpu_count():
        return World(gpu_count(), "nccl", f"using all {gpu_count()} GPUs over NCCL (choose with --gpus N)")
    n = DEFAULT_CPU_WORKERS
    return World(n, "gloo", f"no GPU found: using {n} CPU worker processes over Gloo (choose with --cpus N)")


def resolve_sweep(gpus: list[int] | None, cpus: list[int] | None) -> list[World]:
    """One world per size of a sweep over ``--gpus 1,2,4`` or ``--cpus 1,2`` (default: one CPU worker), smallest
    first, each size checked as `resolve_world` checks one."""
    _not_both(gpus, cpus)
    flag, counts = ("--gpus", gpus) if gpus is not None else ("--cpus", cpus if cpus is not None else [1])
    if not counts:
        raise MeshscaleError(f"{flag}: give world sizes of at least 1, e.g. {flag} 1,2,4")
    _check_counts(flag, counts)
    return [World(n, "nccl" if flag == "--gpus" else "gloo") for n in sorted(set(counts))]


def _not_both(gpus: object, cpus: object) -> None:
    if gpus is not None and cpus is not None:
        raise MeshscaleError("give --gpus or --cpus, not both")


def _check_counts(flag: str, counts: list[int]) -> None:
    for n in counts:
        if n < 1:
            raise MeshscaleError(f"{flag} {n}: need at least 1")
    if flag == "--gpus":
        check_gpus(max(counts))
