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

from meshscale.errors import MeshscaleError, check_choice
from meshscale.safe_io import atomic_write
from meshscale.validation import _show, load_structured, mapping, number, sequence, typed

SCHEMA = "meshscale-result/1"
KINDS = ("topology", "bench-collective", "bench-p2p", "bench-pairs", "bench-host-copy", "bench-io", "sim", "plan", "place",
         "train", "scale", "predict",
         "cluster", "doctor", "tour", "validate")
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL", "TORCH_SYMM", "NVSHMEM_", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS",
                "GLOO_", "MASTER_", "WORLD_SIZE")


# The kernel categories a GPU profile's meta.kernel_categories uses (`train --profile-batches`), and the step
# model's breakdown by category: one vocabulary for what measures and what predicts.
KERNEL_CATEGORIES = ("matmul: attention projections", "matmul: MLP", "matmul: head", "matmul: other", "attention",
                     "conv", "batch norm", "norm", "elementwise/activation", "rotary", "embedding/loss", "optimizer",
                     "copies/casts", "FSDP copies", "communication", "other")

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
        text = json.dumps({"schema": SCHEMA, **asdict(self)}, indent=2, default=str) + "\n"
        return atomic_write(path, text)  # a failed write leaves no half a result behind

    def save_csv(self, path: str | Path) -> Path:
        """The rows as CSV: a header of every key any row has (in first-seen order), one line per row; a list
        (per-rank times) as JSON text in its cell, a missing value empty."""
        import csv
        import io
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        keys = list(dict.fromkeys(k for row in self.rows for k in row))
        text = io.StringIO()
        writer = csv.DictWriter(text, keys, lineterminator="\n")
        writer.writeheader()
        for row in self.rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in row.items()})
        return atomic_write(path, text.getvalue())


# Row keys that must be there, per kind, for the readers (report, compare, calibration) to use a row.
REQUIRED_ROW_KEYS = {
    "bench-collective": ("collective", "size_bytes", "time_s", "busbw_bytes_per_s"),
    "sim": ("collective", "size_bytes", "time_s", "busbw_bytes_per_s"),
    "bench-p2p": ("src", "dst"),
    "bench-pairs": ("rank_a", "rank_b", "p2p_bytes_per_s"),
    "scale": ("world_size", "throughput_samples_per_s"),
    "predict": ("world_size", "throughput_samples_per_s"),
}
# A row value under a key with one of these unit suffixes (or one of these names) is a figure: a finite number
# >= 0 and below MAX_FIGURE (an exabyte, an exabyte a second, 30 years: beyond any machine; larger values overflow
# the charts' log axes)
FIGURE_SUFFIXES = ("_s", "_bytes", "_per_s", "_share")
FIGURE_KEYS = ("world_size", "count", "efficiency", "speedup", "global_batch", "batch_per_rank", "wrong")
MAX_FIGURE = 1e18
# Row values the readers group, sort and match rows by: text, or (the ends of a transfer) a device's name or index,
# the same in every row
TEXT_KEYS = ("collective", "mode", "algorithm", "variant", "dtype", "redop", "bottleneck", "label", "impl", "system",
             "model")
END_KEYS = ("src", "dst")
# Row values the readers take as true or false ("false" as text would read as true)
FLAG_KEYS = ("inplace", "predicted")
# Row values the readers match rows of two runs by (compare): one value each
MATCH_KEYS = TEXT_KEYS + END_KEYS + ("inplace", "root", "size_bytes", "world_size", "batch_per_rank")
# Figures a run cannot have measured as zero: the readers divide by them
POSITIVE_KEYS = {"scale": ("throughput_samples_per_s",), "predict": ("throughput_samples_per_s",)}


def _end(value: Any, where: str) -> Any:
    return typed(value, where, (str, int), "a device name or index")


def _text(value: Any, where: str) -> str:
    return typed(value, where, (str,), "text")


def _texts(value: Any, where: str) -> list:
    for i, item in enumerate(sequence(value, where)):
        _text(item, f"{where}[{i}]")
    return value


def _flag(value: Any, where: str) -> bool:
    return typed(value, where, (bool,), "true or false")


def _candidates(value: Any, where: str) -> list:
    for i, item in enumerate(sequence(value, where)):
        mapping(item, f"{where}[{i}]")
        number(item.get("time_s"), f"{where}[{i}].time_s", 0, MAX_FIGURE)
        _text(item.get("algorithm"), f"{where}[{i}].algorithm")
    return value


# The provenance fields the readers use, each with its check (others are carried along unread)
META_CHECKS = {"world_size": lambda v, w: number(v, w, 1, 1 << 24, integer=True), "spec": mapping, "summary": mapping,
               "topology": mapping, "candidates": _candidates, "weak": _flag,
               **{k: _text for k in ("backend", "device", "model", "system", "group", "label", "scaling", "corpus")}}
MACHINE_CHECKS = {"hostname": _text, "gpus": _texts, "cpu_count": lambda v, w: number(v, w, 1, 1 << 24, integer=True)}


def load_result(path: str | Path) -> Result:
    """Read a result file; one line naming the file and the field when it is not a well-formed one: rows a
    list of mappings, meta and provenance mappings, a known kind, figures finite numbers."""
    path = Path(path)
    data = load_structured(path, "meshscale result file")
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise MeshscaleError(f"{path}: not a meshscale result (no schema {SCHEMA!r}); give a file a meshscale command wrote")
    data = dict(data)
    data.pop("schema")
    unknown = sorted(set(data) - {f for f in Result.__dataclass_fields__})
    if unknown or "kind" not in data or "rows" not in data:
        problem = f"unknown field(s) {unknown}" if unknown else "lacks 'kind' or 'rows'"
        raise MeshscaleError(f"{path}: malformed result ({problem}); give a file a meshscale command wrote")
    try:
        check_choice(data["kind"], KINDS, "result kind")
    except MeshscaleError as exc:
        raise MeshscaleError(f"{path}: kind: {exc}") from None
    for name in ("meta", "machine", "software", "env"):
        mapping(data.get(name, {}), f"{path}: {name}")
    for name, checks in (("meta", META_CHECKS), ("machine", MACHINE_CHECKS)):
        for key, value in data.get(name, {}).items():
            if key in checks and value is not None:
                checks[key](value, f"{path}: {name}.{key}")
    if not isinstance(data.get("predicted", False), bool):
        raise MeshscaleError(f"{path}: predicted: expected true or false, got {_show(data['predicted'])}")
    if not isinstance(data.get("created", ""), str):
        raise MeshscaleError(f"{path}: created: expected a date string, got {_show(data['created'])}")
    for i, row in enumerate(sequence(data["rows"], f"{path}: rows")):
        _check_row(mapping(row, f"{path}: rows[{i}]"), data["kind"], f"{path}: rows[{i}]")
    for key in END_KEYS:  # sorted together: names or indices, not both
        if len({type(row[key]) for row in data["rows"] if row.get(key) is not None}) > 1:
            raise MeshscaleError(f"{path}: rows mix device names and indices in {key}; give one or the other")
    return Result(**data)


def _check_row(row: dict[str, Any], kind: str, where: str) -> None:
    missing = [k for k in REQUIRED_ROW_KEYS.get(kind, ()) if row.get(k) is None]
    if missing:
        raise MeshscaleError(f"{where}: lacks {', '.join(missing)}; a {kind} row needs {', '.join(REQUIRED_ROW_KEYS[kind])}")
    for key, value in row.items():
        if isinstance(value, (list, dict)) and key in MATCH_KEYS:
            raise MeshscaleError(f"{where}.{key}: expected one value, got a {type(value).__name__}")
        if value is not None and key in FLAG_KEYS:
            _flag(value, f"{where}.{key}")
        if value is not None and key in TEXT_KEYS + END_KEYS:
            (_text if key in TEXT_KEYS else _end)(value, f"{where}.{key}")
        if value is None or not (key.endswith(FIGURE_SUFFIXES) or key in FIGURE_KEYS):
            continue
        positive = key in POSITIVE_KEYS.get(kind, ())
        # lists of one figure: per rank (..._times_s) or per repeated sample (sample_...); per rank, per call
        # (rank_iter_times_s: a list of lists)
        listed = isinstance(value, list) and (key.endswith("times_s") or key.startswith("sample_"))
        items = value if listed else [value]
        if listed and key.startswith("rank_"):
            items = [x for per_rank in value for x in (per_rank if isinstance(per_rank, list) else [per_rank])]
        for item in items:
            number(item, f"{where}.{key}", 0, MAX_FIGURE, lo_open=positive)


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
