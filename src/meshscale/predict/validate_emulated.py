"""`meshscale validate --emulated`: the emulated two-node runs (two torchrun agents on one 2x H200 host, NCCL over
sockets on loopback; ``corpus/emulated-two-node/``, docs/results/emulated-two-node.md tells each call) predicted as
the commands do, with the error per row and per family; the "emulated" corpus of `corpus_check`.

Each run is predicted from what was measured beside it and nothing of the run itself: the network's rate and
latency fitted to the all_reduce sweep measured next to it (`simulate.link_fit.fit_network`), the one-GPU profile
of the same call, DDP's buckets overlapped with backward as their gradients complete. Families (``corpus.yaml``):

- ``training``: `predict --nodes 2 --nics 1 --bench SWEEP --profile PROFILE --batch B` against the run's samples/s;
- ``scale``: `predict --from RUN --profile RUN --nodes 1,2 ...` against the 2-worker row of a `scale` run;
- ``all_reduce``: `sim all_reduce --nodes 2 --nics 1 --bench SWEEP` against that sweep, at each of its sizes;
- ``all_reduce_median``: the same against each size's median over a directory's sweeps (`bench collective -N`).

Bounds (`corpus_check.CORPORA["emulated"]`): each family's geomean |error| at most 15%, the target the runs' notes
set every point, and no row more than 2x off, as the collectives corpus. A single point is not held to 15%: a run
that met a slower loopback path than its sweep is a fact of the path, not of the model (the notes, kept beside
each row).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from meshscale.errors import MeshscaleError
from meshscale.results import Result, load_result
from meshscale.validation import load_structured

from meshscale.predict.corpus_check import CORPORA, error, validation_result

EMULATED = CORPORA["emulated"]
FAMILIES = EMULATED.groups
NICS = 1  # one NIC per node: each agent's socket path


def corpus_path() -> Path:
    return EMULATED.path()


@dataclass(frozen=True)
class Point:
    """One entry of the corpus: what is predicted (``family``), from which files, and where it is told."""

    family: str
    label: str  # the measured file (or the sweeps' directory) as the corpus names it
    inputs: str  # what it is predicted from, as the corpus names them
    source: str
    note: str
    model: str = ""
    batch: int = 0
    profile: Path | None = None
    bench: Path | None = None   # the sweep the network is fitted to (for all_reduce: also what is measured)
    measured: Path | None = None
    sweeps: tuple[Path, ...] = ()  # all_reduce_median: the sweeps whose per-size median is measured


def _file(base: Path, value: object, where: str) -> Path:
    path = base / str(value)
    if not path.is_file():
        raise MeshscaleError(f"{where}: no file {value} next to the corpus")
    return path


def _point(family: str, raw: dict, base: Path, where: str) -> Point:
    try:
        label = raw.get({"training": "measured", "scale": "run", "all_reduce": "sweep"}.get(family, "sweeps"))
        inputs = {"training": f"profile {raw.get('profile')}, sweep {raw.get('bench')}",
                  "scale": f"its own 1-worker row, sweep {raw.get('bench')}"}.get(family, "the sweep itself")
        common = {"family": family, "label": str(label), "inputs": inputs, "source": str(raw["source"]),
                  "note": str(raw.get("note", ""))}
        if family == "training":
            return Point(**common, model=str(raw["model"]), batch=int(raw["batch"]),
                         profile=_file(base, raw["profile"], where), bench=_file(base, raw["bench"], where),
                         measured=_file(base, raw["measured"], where))
        if family == "scale":
            run = _file(base, raw["run"], where)
            return Point(**common, model=str(raw["model"]), batch=int(raw["batch"]), profile=run,
                         bench=_file(base, raw["bench"], where), measured=run)
        if family == "all_reduce":
            return Point(**common, bench=_file(base, raw["sweep"], where))
        sweeps = tuple(sorted((base / str(raw["sweeps"])).glob("allreduce*.json")))
    except (KeyError, TypeError, ValueError) as e:
        raise MeshscaleError(f"{where}: missing or malformed field ({e})") from None
    if len(sweeps) < 2:
        raise MeshscaleError(f"{where}: {raw['sweeps']} holds {len(sweeps)} allreduce*.json sweep(s); a median "
                             "needs two or more")
    return Point(**common, sweeps=sweeps)


def load_emulated_corpus(path: str | Path | None = None) -> tuple[Path, list[Point]]:
    """(the node's system file, every point) of a corpus file; paths in it are relative to it."""
    path = EMULATED.path(path)
    data = load_structured(path, "emulated corpus", yaml_ok=True)
    if not isinstance(data, dict) or "node" not in data:
        raise MeshscaleError(f"{path}: expected a mapping with node: and the lists {', '.join(FAMILIES)}")
    unknown = sorted(set(data) - {"node", *FAMILIES})
    if unknown:
        raise MeshscaleError(f"{path}: unknown key(s) {', '.join(unknown)}; use node, {', '.join(FAMILIES)}")
    node = _file(path.parent, data["node"], str(path))
    points = []
    for family in FAMILIES:
        entries = data.get(family) or []
        if not isinstance(entries, list):
            raise MeshscaleError(f"{path}: {family} must be a list")
        points += [_point(family, raw if isinstance(raw, dict) else {}, path.parent, f"{path}: {family} entry {i}")
                   for i, raw in enumerate(entries, 1)]
    if not points:
        raise MeshscaleError(f"{path}: no points")
    return node, points


class _Predictor:
    """The commands' predictions for one node file, each network fit made once per sweep."""

    def __init__(self, node: Path):
        self.node = str(node)
        self.fits: dict[object, tuple] = {}

    def fit(self, key: object, sweep: Result) -> tuple:
        """(fitted cluster of two nodes, its fit) of ``sweep``, as `--nodes 2 --nics 1 --bench` makes them."""
        if key not in self.fits:
            from meshscale.simulate.link_fit import fit_network
            from meshscale.topology.cluster import system_or_cluster

            self.fits[key] = fit_network(system_or_cluster(self.node, 2, "edr", NICS, True), sweep)
        return self.fits[key]

    def throughput(self, p: Point) -> tuple[float, float]:
        """(predicted, measured) samples/s of a training run or of a scale run's 2-worker row."""
        from meshscale.predict import PredictRequest, predict_rows

        _, fit = self.fit(p.bench, load_result(p.bench))
        scale = p.family == "scale"
        rows, _, _ = predict_rows(PredictRequest(model=p.model, system=self.node, nodes=(1, 2) if scale else (2,),
                                                 link=fit.link, nics=NICS, batch=p.batch, profile=p.profile,
                                                 measured=p.measured if scale else None))
        if scale:
            row = next((r for r in rows if r["world_size"] == 2), None)
            if row is None:
                raise MeshscaleError(f"{p.measured}: no 2-worker row")
            return row["predicted_samples_per_s"], row["measured_samples_per_s"]
        return rows[0]["throughput_samples_per_s"], float(load_result(p.measured).meta["summary"]["samples_per_s"])

    def all_reduce(self, key: object, sweep: Result) -> list[tuple[int, float, float]]:
        """(size, predicted, measured time) at every size of ``sweep``, the network fitted to it alone."""
        from meshscale.simulate.fabric import Fabric
        from meshscale.simulate.plan import sim_sweep

        topology, _ = self.fit(key, sweep)
        measured = {int(r["size_bytes"]): float(r["time_s"]) for r in sweep.rows}
        ranks = topology.device_indices()
        predicted = {int(r["size_bytes"]): r["time_s"] for r in sim_sweep(Fabric(topology), "all_reduce", ranks, sorted(measured)).rows}
        return [(size, predicted[size], measured[size]) for size in sorted(measured)]


def _median_sweep(sweeps: tuple[Path, ...]) -> Result:
    """Each size's median over the sweeps taken as the cycles of one, as `bench collective -N` reports it."""
    from meshscale.collectives.rows import median_over_cycles

    loaded = [load_result(s) for s in sweeps]
    rows = [dict(row, cycle=i) for i, sweep in enumerate(loaded) for row in sweep.rows]
    first = loaded[0]
    return Result(first.kind, median_over_cycles(rows, int(first.meta.get("world_size") or 2)), first.predicted,
                  first.meta)


def _rows_of(p: Point, predictor: _Predictor) -> list[dict]:
    described = {"family": p.family, "inputs": p.inputs, "source": p.source, "note": p.note}
    if p.family in ("training", "scale"):
        predicted, measured = predictor.throughput(p)
        what = f"{p.model} b{p.batch}, {p.label}"
        return [dict(described, what=what, metric="samples/s", predicted=predicted, measured=measured)]
    if p.family == "all_reduce":
        sweep, key, name = load_result(p.bench), p.bench, p.label
    else:
        sweep, key = _median_sweep(p.sweeps), p.sweeps
        name = f"median of {len(p.sweeps)} in {p.label}"
    from meshscale.units import format_bytes
    return [dict(described, what=f"all_reduce {format_bytes(size)}, {name}", metric="time s", predicted=pred,
                 measured=meas) for size, pred, meas in predictor.all_reduce(key, sweep)]


def validate_emulated(path: str | Path | None = None) -> Result:
    """Predict every point of the corpus; a Result of kind "validate" (meta.emulated), one row per run or size,
    meta.summary per family against the bounds."""
    path = EMULATED.path(path)
    node, points = load_emulated_corpus(path)
    predictor = _Predictor(node)
    rows = []
    for p in points:
        try:
            found = _rows_of(p, predictor)
        except (KeyError, TypeError, ValueError) as e:
            raise MeshscaleError(f"{path}: {p.family} {p.label}: a file lacks a field or a figure ({e})") from None
        for r in found:
            if not (r["predicted"] > 0 and r["measured"] > 0 and math.isfinite(r["predicted"] / r["measured"])):
                raise MeshscaleError(f"{path}: {r['what']}: measured {r['measured']}, predicted {r['predicted']}; "
                                     "both must be positive")
            ratio = r["predicted"] / r["measured"]
            rows.append(dict(r, row=len(rows) + 1, ratio=ratio, error=error(ratio)))
    return validation_result(EMULATED, rows, path, emulated=True)


__all__ = ["EMULATED", "load_emulated_corpus", "validate_emulated"]
