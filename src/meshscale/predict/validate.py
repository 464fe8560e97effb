"""`meshscale validate`: the collective cost model against a corpus of measured nccl-tests figures (the
"collectives" corpus of `corpus_check`, which counts the errors and holds the bounds).

The corpus is a CSV file (``corpus/collectives.csv`` in this package; its sources are listed beside it in
``SOURCES.md``), one measurement a row: a system (a catalog name, or a system file relative to the corpus),
the GPU count (the first ``gpus`` devices), the collective, nccl-tests' size, in-place or not, the time in
microseconds and/or nccl-tests' busbw in GB/s, and what is known of NCCL (version; an algorithm or protocol
forced with NCCL_ALGO / NCCL_PROTO; NVLS disabled or not) and how many GPUs one host thread drove (nccl-tests
-g N launches them one after another). A row given as busbw only is turned into a time with nccl-tests' formula
(time = size x busbw factor / busbw), so that the ratio is the busbw ratio inverted. Figures are per size class.
"""
from __future__ import annotations

import csv
import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from meshscale.collectives.kinds import kind
from meshscale.errors import MeshscaleError
from meshscale.predict.corpus_check import CORPORA, SIZE_CLASSES, error, validation_result
from meshscale.results import Result
from meshscale.simulate.cost import Call, Prediction
from meshscale.simulate.fabric import Fabric
from meshscale.simulate.nccl_env import NcclSettings
from meshscale.topology import Topology
from meshscale.topology.catalog import load_system, system_names

CORPUS_COLUMNS = ("system", "gpus", "nodes", "collective", "size_bytes", "inplace", "time_us", "busbw_GBps",
                  "dtype", "nccl_version", "algo", "proto", "nvls", "gpus_per_thread", "source", "note")
REQUIRED = ("system", "gpus", "nodes", "collective", "size_bytes", "inplace", "source")
NCCL_ALGOS = ("ring", "tree", "nvls", "nvls_tree", "collnet", "collnet_direct", "collnet_chain", "pat")
NCCL_PROTOS = ("ll", "ll128", "simple")
SMALL_BYTES = 1 << 20  # the size classes: below 1 MiB (latency-bound), and 1 MiB and up
COLLECTIVES = CORPORA["collectives"]


def corpus_path() -> Path:
    """The corpus shipped with meshscale."""
    return COLLECTIVES.path()


@dataclass(frozen=True)
class Measurement:
    """One corpus row, checked. ``time_s`` is measured, or derived from busbw when ``basis`` is "busbw"."""

    row: int
    system: str
    gpus: int
    nodes: int
    collective: str
    size_bytes: int
    inplace: bool
    time_s: float
    basis: str
    dtype: str
    nccl_version: str
    algo: str
    proto: str
    nvls: str
    gpus_per_thread: int | None
    source: str
    note: str

    @property
    def size_class(self) -> str:
        return SIZE_CLASSES[self.size_bytes >= SMALL_BYTES]


def _positive(text: str, what: str, integer: bool = False) -> float | int:
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        raise MeshscaleError(f"{what} {text!r} is not a {'whole number' if integer else 'number'}") from None
    if not value > 0 or (not integer and not math.isfinite(value)):
        raise MeshscaleError(f"{what} {text!r} must be positive")
    return value


def _choice(text: str, what: str, allowed: tuple[str, ...]) -> str:
    if text and text.lower() not in allowed:
        raise MeshscaleError(f"{what} {text!r} is not one of {', '.join(allowed)} (or blank)")
    return text


class _Systems:
    """Topologies of the corpus's systems, loaded once each; system files are read relative to the corpus."""

    def __init__(self, corpus: Path):
        self.corpus = corpus
        self.loaded: dict[str, Topology] = {}

    def __call__(self, system: str) -> Topology:
        if system not in self.loaded:
            if system in system_names():
                self.loaded[system] = load_system(system)
            elif "/" in system or system.endswith((".yaml", ".yml", ".json")):
                path = self.corpus.parent / system
                if not path.exists():
                    raise MeshscaleError(f"system file {system} not found next to the corpus")
                self.loaded[system] = load_system(str(path))
            else:
                raise MeshscaleError(f"unknown system {system!r}; use a catalog name ({', '.join(system_names())}) "
                                     "or a system file relative to the corpus")
        return self.loaded[system]


def _measurement(raw: dict[str, str], row: int, systems: _Systems, multi_node: bool) -> Measurement:
    cell = {k: (raw.get(k) or "").strip() for k in CORPUS_COLUMNS}
    for name in REQUIRED:
        if not cell[name]:
            raise MeshscaleError(f"missing {name}")
    if not cell["time_us"] and not cell["busbw_GBps"]:
        raise MeshscaleError("missing time_us and busbw_GBps (give at least one)")
    gpus = _positive(cell["gpus"], "gpus", integer=True)
    nodes = _positive(cell["nodes"], "nodes", integer=True)
    if nodes > 1 and not multi_node:
        raise MeshscaleError(f"nodes {nodes}: multi-node rows are not validated yet (keep them in a separate file)")
    collective = kind(cell["collective"])
    size_bytes = _positive(cell["size_bytes"], "size_bytes", integer=True)
    if cell["inplace"] not in ("0", "1"):
        raise MeshscaleError(f"inplace {cell['inplace']!r} must be 0 (out-of-place) or 1 (in-place)")
    per_thread = _positive(cell["gpus_per_thread"], "gpus_per_thread", integer=True) if cell["gpus_per_thread"] else None
    if cell["nccl_version"] and not re.fullmatch(r"\d+\.\d+(\.\d+)?", cell["nccl_version"]):
        raise MeshscaleError(f"nccl_version {cell['nccl_version']!r} is not a version like 2.28.9")
    topology = systems(cell["system"])
    have = len(topology.devices()) * nodes
    if gpus > have:
        raise MeshscaleError(f"gpus {gpus}: {nodes} x {cell['system']} has only {have}")
    if cell["time_us"]:
        time_s, basis = _positive(cell["time_us"], "time_us") * 1e-6, "time"
        if cell["busbw_GBps"]:
            _positive(cell["busbw_GBps"], "busbw_GBps")
    else:
        busbw = _positive(cell["busbw_GBps"], "busbw_GBps") * 1e9
        time_s, basis = size_bytes * collective.busbw_factor(gpus) / busbw, "busbw"
    return Measurement(row, cell["system"], gpus, nodes, collective.name, size_bytes, cell["inplace"] == "1", time_s,
                       basis, cell["dtype"], cell["nccl_version"], _choice(cell["algo"], "algo", NCCL_ALGOS),
                       _choice(cell["proto"], "proto", NCCL_PROTOS), _choice(cell["nvls"], "nvls", ("on", "off")),
                       per_thread, cell["source"], cell["note"])


def load_corpus(path: str | Path | None = None, multi_node: bool = False) -> list[Measurement]:
    """Every row of a corpus file, checked; a bad row is a one-line error naming the file and the row.
    Rows of several nodes are refused unless ``multi_node`` (the model validated here is one node's)."""
    path = COLLECTIVES.path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise MeshscaleError(f"{path}: cannot read ({exc.strerror})") from None
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in REQUIRED + ("time_us", "busbw_GBps") if c not in (reader.fieldnames or [])]
    if missing:
        raise MeshscaleError(f"{path}: not a corpus file (no column {', '.join(missing)}); "
                             f"its columns are {','.join(CORPUS_COLUMNS)}")
    systems = _Systems(path)
    rows = []
    for number, raw in enumerate(reader, start=1):
        try:
            rows.append(_measurement(raw, number, systems, multi_node))
        except MeshscaleError as exc:
            raise MeshscaleError(f"{path}, row {number} (line {reader.line_num}): {exc}") from None
    if not rows:
        raise MeshscaleError(f"{path}: no rows")
    return rows


def _predict_time_s(m: Measurement, topology: Topology, algorithm: str) -> tuple[float, str]:
    ranks = tuple(topology.device_indices()[:m.gpus])
    # only what NCCL was forced to do: otherwise the model makes NCCL's own choice
    settings = NcclSettings(version=m.nccl_version or None, algo=m.algo.lower() if m.algo else None,
                            proto=m.proto or None, nvls=False if m.nvls == "off" else None,
                            gpus_per_thread=m.gpus_per_thread or 1)
    result = price_call(Fabric(topology, nccl=settings, algo=algorithm), Call(m.collective, m.size_bytes, ranks))
    return result.time_s, str(getattr(result, "detail", "") or "")


def price_call(fabric: Fabric, call: Call) -> Prediction:
    """One corpus row's call priced on its fabric (`Fabric.cost`, as sim prices it)."""
    return fabric.cost(call)


def validate(measurements: list[Measurement], algorithm: str = "nccl", corpus: str | Path | None = None,
             filters: dict[str, Any] | None = None) -> Result:
    """Predict every measurement (identical predictions once) and compare; a Result of kind "validate" whose
    meta["summary"] holds the per-class geomeans, the worst row and the pass/fail against the bounds. A row
    the model cannot predict (MeshscaleError) carries the reason and fails the whole."""
    if not measurements:
        raise MeshscaleError("no corpus rows to validate (the filters left none)")
    systems = _Systems(COLLECTIVES.path(corpus))
    cache: dict[tuple, tuple[float, str] | str] = {}
    rows = []
    for m in measurements:
        key = (m.system, m.gpus, m.collective, m.size_bytes, m.nccl_version, m.algo, m.proto, m.nvls, m.gpus_per_thread)
        if key not in cache:
            try:
                cache[key] = _predict_time_s(m, systems(m.system), algorithm)
            except MeshscaleError as exc:
                cache[key] = str(exc)
        found = cache[key]
        predicted_s, detail = found if isinstance(found, tuple) else (None, "")
        rows.append(_compared({k: v for k, v in asdict(m).items() if k != "time_s"}, m.time_s, predicted_s, detail,
                              found if isinstance(found, str) else f"predicted time {predicted_s}"))
    return _validation(rows, str(COLLECTIVES.path(corpus)), algorithm, filters or {})


def _compared(described: dict[str, Any], measured_s: float, predicted_s: float | None, model: str,
              problem: str) -> dict[str, Any]:
    """One row of a validation: what was measured (``described``, with its size_bytes), both times, their ratio."""
    ratio = predicted_s / measured_s if predicted_s and math.isfinite(predicted_s) else None
    return {**described, "size_class": SIZE_CLASSES[described["size_bytes"] >= SMALL_BYTES],
            "measured_time_s": measured_s, "predicted_time_s": predicted_s, "ratio": ratio,
            "error": None if ratio is None else error(ratio), "model": model,
            "problem": "" if ratio is not None else problem}


def _validation(rows: list[dict[str, Any]], corpus: str, algorithm: str, filters: dict[str, Any]) -> Result:
    return validation_result(COLLECTIVES, rows, corpus, algorithm=algorithm, filters=filters)


def validate_run(measured: Result, predicted: Result) -> Result:
    """The same comparison for one run: a `bench collective` result against the model's prediction of the same
    collectives and sizes (a "sim" result, e.g. the tour's); a Result of kind "validate" like `validate`'s."""
    model = {(r["collective"], r["size_bytes"]): r for r in predicted.rows}
    system = str(predicted.meta.get("system", "this machine"))
    world = int(measured.meta.get("world_size") or 0)
    rows = []
    for i, r in enumerate(measured.rows, 1):
        p = model.get((r["collective"], r["size_bytes"]))
        if p is None or not r.get("time_s"):
            continue
        described = {"row": i, "system": system, "gpus": world, "collective": r["collective"],
                     "size_bytes": r["size_bytes"], "inplace": r.get("inplace")}
        rows.append(_compared(described, r["time_s"], p.get("time_s"), p.get("algorithm", ""), "no prediction"))
    if not rows:
        raise MeshscaleError("no measured size has a prediction to compare with")
    return _validation(rows, "this run", predicted.meta.get("algorithm", "nccl"), {})


def validate_corpus(corpus: str | Path | None = None, system: str | None = None, collective: str | None = None,
                    algorithm: str = "nccl") -> Result:
    """Load a corpus (default: the shipped one), keep the rows of ``system`` / ``collective`` when given, and
    validate them."""
    measurements = load_corpus(corpus)
    if collective:
        collective = kind(collective).name
    chosen = [m for m in measurements if (not system or m.system == system)
              and (not collective or m.collective == collective)]
    if not chosen:
        have = sorted({m.system for m in measurements})
        raise MeshscaleError(f"no corpus rows for system {system or 'any'} and collective {collective or 'any'}; "
                             f"the corpus has {', '.join(have)}")
    return validate(chosen, algorithm, corpus, {"system": system, "collective": collective})


__all__ = ["COLLECTIVES", "CORPUS_COLUMNS", "Measurement", "SIZE_CLASSES", "SMALL_BYTES", "corpus_path", "load_corpus", "validate",
           "validate_corpus", "validate_run"]
