"""The one result format every measuring or predicting command writes and every reader (report, compare,
predict --from) loads: a kind, rows of plain values, and where they came from.

Row keys carry their units (`size_bytes`, `time_s`, `busbw_bytes_per_s`). Predictions say so
(`predicted: True` on the result); measured results carry the machine, software and environment knobs.
"""
from __future__ import annotations

import json
import os
import platform
import socket
import time
from dataclasses import asdict, dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from meshscale.errors import MeshscaleError

SCHEMA = "meshscale-result/1"
KINDS = ("topology", "bench-collective", "bench-p2p", "sim", "plan", "train", "scale", "predict", "cluster", "doctor", "tour",
         "validate")
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL", "TORCH_SYMM", "NVSHMEM_", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
                "GLOO_", "MASTER_", "WORLD_SIZE")


@dataclass
class Result:
    """Rows of one kind of figure, and their provenance."""

    kind: str
    rows: list[dict[str, Any]]
    predicted: bool = False
    meta: dict[str, Any] = field(default_factory=dict)  # command line, options, topology name...
    machine: dict[str, Any] = field(default_factory=dict)
    software: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"schema": SCHEMA, **asdict(self)}, indent=2, default=str) + "\n")
        return path


def load_result(path: str | Path) -> Result:
    """Read a result file; a clear error if it is not one."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise MeshscaleError(f"{path}: cannot read ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise MeshscaleError(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise MeshscaleError(f"{path}: not a meshscale result (no schema {SCHEMA!r}); give a file a meshscale command wrote")
    data.pop("schema")
    try:
        return Result(**data)
    except TypeError as exc:
        raise MeshscaleError(f"{path}: malformed result ({exc})") from None


def provenance() -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """(machine, software, env) of this process: host, CPU, GPUs; torch/CUDA/NCCL versions; NCCL_* knobs."""
    import torch

    machine: dict[str, Any] = {"hostname": socket.gethostname(), "platform": platform.platform(),
                               "cpu_count": os.cpu_count(), "gpus": []}
    software: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                                "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        machine["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        try:
            software["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            software["nccl"] = None
    try:
        software["meshscale"] = version("meshscale")
    except PackageNotFoundError:  # run from a source tree, not installed
        software["meshscale"] = None
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)}
    return machine, software, env


def measured(kind: str, rows: list[dict[str, Any]], **meta: Any) -> Result:
    """A measured result stamped with this process's provenance."""
    machine, software, env = provenance()
    return Result(kind, rows, False, meta, machine, software, env)
