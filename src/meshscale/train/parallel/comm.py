"""Communication per parallel dimension, read from PyTorch's flight recorder: every collective and point-to-point
operation a rank issued (FSDP2's all-gathers and reduce-scatters, DTensor's, the pipeline's sends and receives,
context parallelism's all-gathers), with its process group, sizes, and on NCCL with timing enabled the
duration of its kernel. The device mesh names each dimension's group ("mesh_tp", "mesh_fsdp_cp", ...).

The durations are the communication kernels' own time, whether or not compute overlapped them: the time each
dimension keeps the network busy, not the part of the step it exposes. Gloo records neither durations (None)
nor point-to-point operations (a pipeline's sends and receives count on NCCL only)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from meshscale.models.layout import ParallelLayout

# Each rank sets these before its process groups start (the recorder is configured once per process).
FLIGHT_RECORDER_ENV = {"TORCH_FR_BUFFER_SIZE": "20000", "TORCH_NCCL_ENABLE_TIMING": "1"}

# a mesh group is "mesh_" and its dimensions joined (train/parallel/mesh.py); one that starts with fsdp (or the
# experts' efsdp) is an FSDP2 shard group (fsdp ranks x cp or tp ranks: the dimension that shards parameters); the
# experts' mesh names its shards efsdp and its replicas edp (models/layout.py: expert_fsdp, expert_dp)
_MESH_DIMENSIONS = {"tp": "tp", "cp": "cp", "ep": "ep", "fsdp": "fsdp", "dp": "dp", "pp": "pp", "efsdp": "fsdp",
                    "edp": "dp"}


def _degree(layout: ParallelLayout, mesh_dim: str) -> int:
    return {"ep": layout.ep, "efsdp": layout.expert_fsdp, "edp": layout.expert_dp}.get(mesh_dim) or \
        layout.degrees()[mesh_dim]
_DTYPE_BYTES = {"Float": 4, "BFloat16": 2, "Half": 2, "Double": 8, "Long": 8, "Int": 4, "Byte": 1, "Char": 1,
                "Bool": 1}


@dataclass
class DimensionComm:
    """One dimension's communication per step on this rank."""

    operations: float           # collectives and point-to-point operations
    bytes: float                # their input tensors' bytes
    seconds: float | None       # their kernels' time (NCCL with timing); None where not recorded


def _entry_bytes(entry: dict[str, Any]) -> float:
    total = 0.0
    for shape, dtype in zip(entry.get("input_sizes") or [], entry.get("input_dtypes") or []):
        n = 1
        for d in shape:
            n *= d
        total += n * _DTYPE_BYTES.get(dtype, 4)
    return total


def recorded_entries() -> list[dict[str, Any]]:
    """This process's flight-recorder entries (empty when the recorder is off). NCCL's groups record into the
    CUDA recorder (`_dump_nccl_trace_json`), Gloo's into the generic one (`_dump_fr_trace_json`): both are read."""
    import torch._C._distributed_c10d as c10d
    entries: list[dict[str, Any]] = []
    for name in ("_dump_nccl_trace_json", "_dump_fr_trace_json"):
        dump = getattr(c10d, name, None)
        if dump is not None:
            entries += json.loads(dump()).get("entries", [])
    return entries


def whole_world_dimension(layout: ParallelLayout) -> str | None:
    """The dimension whose group is the whole world, if any: the device mesh then hands it the default group."""
    if layout.world_size == 1:
        return None
    whole = [dim for dim, n in layout.degrees().items() if n == layout.world_size]
    if whole:
        return whole[0]
    return "fsdp" if layout.fsdp * layout.cp == layout.world_size else None


def _is_all_to_all(entry: dict[str, Any]) -> bool:
    return "all_to_all" in (entry.get("profiling_name") or "").replace("alltoall", "all_to_all")


def entry_dimension(entry: dict[str, Any], layout: ParallelLayout) -> str | None:
    """The dimension whose group ran a recorder entry; None for groups outside the mesh (the loss's average, on a
    group of its own) and for a dimension of one rank (its group moves nothing between ranks). An all-to-all is
    expert parallelism's, whichever group (the default one, when ep spans the world)."""
    group = entry.get("process_group") or ["", ""]
    name = group[1] if len(group) > 1 else ""
    if layout.ep > 1 and _is_all_to_all(entry):
        return "ep"
    if name == "default_pg":
        return whole_world_dimension(layout)
    dims = name.removeprefix("mesh_").split("_") if name.startswith("mesh_") else []
    if not dims or any(d not in _MESH_DIMENSIONS for d in dims):
        return None
    ranks = 1
    for d in dims:
        ranks *= _degree(layout, d)
    if ranks == 1:
        return None
    if _MESH_DIMENSIONS[dims[0]] == "fsdp":
        return "fsdp"
    return _MESH_DIMENSIONS[next(d for d in dims if _degree(layout, d) > 1)]


def comm_by_dimension(entries: list[dict[str, Any]], since_ns: int, steps: int,
                      layout: ParallelLayout) -> dict[str, dict[str, Any]]:
    """Per-step communication of each dimension (`entry_dimension`), over the operations issued from ``since_ns``
    (the start of the timed window, time.time_ns()) through ``steps`` steps."""
    if steps < 1:
        return {}
    out: dict[str, DimensionComm] = {}
    timed = {}
    for e in entries:
        dim = entry_dimension(e, layout)
        if dim is None or e.get("time_created_ns", 0) < since_ns:
            continue
        c = out.setdefault(dim, DimensionComm(0.0, 0.0, None))
        c.operations += 1 / steps
        c.bytes += _entry_bytes(e) / steps
        if e.get("duration_ms") is not None:
            timed[dim] = timed.get(dim, 0.0) + e["duration_ms"] / 1e3 / steps
    for dim, seconds in timed.items():
        out[dim].seconds = seconds
    return {dim: asdict(c) for dim, c in out.items()}
