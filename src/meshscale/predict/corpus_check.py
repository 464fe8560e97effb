"""The one validation framework of `meshscale validate`: every corpus (collectives, training, emulated two-node
runs, NCCL's choices) is a `Corpus` record here, found the same way, its rows compared with one error definition
and summed up by one function against its `Bounds`.

A validator turns its corpus's rows into dicts with ``row`` (1-based), the key its figures are grouped by, and
either ``ratio`` (predicted / measured; None where the model could not predict the row) or ``same`` (a choice,
right or wrong). `validation_result` does the rest.

error = predicted / measured - 1 (positive: the model says more than was measured). Over rows, geomean |error| =
exp(mean |ln(predicted / measured)|) - 1: a row 10% above and a row 10% below count alike, and an outlier cannot
hide behind rows of the other sign. A row is max(ratio, 1 / ratio) times off.

A corpus gathered from publications of very different sizes (one table of 47 runs, another of 2) can weigh each
publication equally (``weight_by``): the geomean over publications of each publication's geomean, exp(mean over
publications p of mean over p's rows |ln ratio|) - 1, so a model cannot meet its bound by fitting the largest
table alone; the bound on the geomean then holds on that figure.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

from meshscale.errors import MeshscaleError
from meshscale.results import Result

ERROR_DEFINITION = ("error = predicted / measured - 1{of}; geomean |error| = exp(mean |ln(predicted / measured)|) - 1; "
                    "worst = max(predicted / measured, measured / predicted)")


def error(ratio: float) -> float:
    """A row's error from its ratio predicted / measured."""
    return ratio - 1


def times_off(ratio: float) -> float:
    """How many times off a row is, either way."""
    return max(ratio, 1 / ratio)


def geomean_abs_error(ratios: Iterable[float]) -> float | None:
    """exp(mean |ln ratio|) - 1 over ``ratios``; None for none."""
    logs = [abs(math.log(r)) for r in ratios]
    return math.exp(sum(logs) / len(logs)) - 1 if logs else None


def weighted_geomean_abs_error(rows: Iterable[dict[str, Any]], key: str) -> tuple[float | None, int]:
    """(exp(mean over the groups of ``key`` of each group's mean |ln ratio|) - 1, the number of groups) over the
    rows with a ratio: each group weighs the same whatever its size; (None, 0) for none."""
    logs: dict[Any, list[float]] = {}
    for r in rows:
        if r.get("ratio"):
            logs.setdefault(r[key], []).append(abs(math.log(r["ratio"])))
    if not logs:
        return None, 0
    return math.exp(sum(sum(v) / len(v) for v in logs.values()) / len(logs)) - 1, len(logs)


def distance(row: dict[str, Any]) -> float:
    """How far a row is from its measurement, to list the worst first: |ln ratio|, infinite where the model did
    not predict it or picked otherwise, 0 for a right choice."""
    if "same" in row:
        return 0.0 if row["same"] else math.inf
    return abs(math.log(row["ratio"])) if row.get("ratio") else math.inf


@dataclass(frozen=True)
class Bounds:
    """What a corpus must meet. ``groups``: each group's geomean |error| bound, per group name (a bound for every
    group under the name "*"); ``agreement``: every row's choice must be the measured one."""

    geomean_abs_error: float | None = None   # over all rows
    worst_times_off: float | None = None     # any one row
    groups: tuple[tuple[str, float], ...] = ()
    agreement: bool = False
    fits: bool = False                       # every row that ran: the memory model's `fits` yes or tight

    def group(self, name: str) -> float | None:
        found = dict(self.groups)
        return found.get(name, found.get("*"))


@dataclass(frozen=True)
class Corpus:
    """One corpus of `meshscale validate`: its flag, its shipped file (relative to predict/corpus/), what a row
    is, what its figures are grouped by and the bounds it must meet."""

    name: str
    flag: str                 # the `validate` flag that picks it ("" for the default)
    default: str              # the shipped file or directory, relative to predict/corpus/
    noun: str                 # what one row is: row, run, call
    quantity: str             # what predicted and measured are, for the error definition
    group_by: str             # the row key its figures are given per
    bounds: Bounds
    breakdown: tuple[str, ...] = ()   # row keys of a finer table, reported, not bounded
    directory: bool = False           # the corpus is a directory of files, not one file
    note: str = ""                    # said under the figures (what is reported but not bounded)
    target: float | None = None       # a per-row |error| counted per group (within it or not), not enforced
    largest: tuple[str, ...] = ()     # row keys whose largest value each group reports (max_<key>), not bounded
    groups: tuple[str, ...] = field(default=())  # the group order to report in (others follow, sorted)
    weight_by: str = ""               # a row key whose groups weigh equally in the bounded geomean ("": rows do)

    def path(self, override: str | Path | None = None) -> Path:
        """``--corpus`` when given, else the shipped one; one error for a path that is not there."""
        path = Path(override) if override else Path(__file__).resolve().parent / "corpus" / self.default
        if not (path.is_dir() if self.directory else path.is_file()):
            what = "directory" if self.directory else "file"
            raise MeshscaleError(f"{path}: no such {what} (validate {self.flag or ''} --corpus takes a {self.name} "
                                 f"corpus {what})".replace("  ", " "))
        return path

    @property
    def error_definition(self) -> str:
        return ERROR_DEFINITION.format(of=f" ({self.quantity})" if self.quantity else "")


SIZE_CLASSES = ("below 1 MiB", "1 MiB and up")
CORPORA: dict[str, Corpus] = {c.name: c for c in (
    Corpus("collectives", "", "collectives.csv", "row",
           "time; busbw-only rows: time from nccl-tests' busbw formula", "size_class",
           Bounds(worst_times_off=2.0, groups=((SIZE_CLASSES[0], 0.25), (SIZE_CLASSES[1], 0.08))),
           breakdown=("system", "size_class"), groups=SIZE_CLASSES),
    Corpus("training", "--training", "training.yaml", "run", "tokens/s per GPU or samples/s", "publication",
           Bounds(geomean_abs_error=0.10, worst_times_off=1.4, fits=True), breakdown=("family",),
           weight_by="publication",
           note="the geomean bound holds on the publications weighted equally; the runs' own geomean is reported"),
    Corpus("emulated", "--emulated", "emulated-two-node/corpus.yaml", "row",
           "samples/s for runs, time for all_reduce", "family", Bounds(worst_times_off=2.0, groups=(("*", 0.15),)),
           groups=("training", "scale", "all_reduce", "all_reduce_median"), target=0.15),
    Corpus("choices", "--choices", "nccl-choices-h200x2", "call", "", "collective", Bounds(agreement=True),
           directory=True, largest=("channel_gap",), note="a call is right when the model picks NCCL's logged algorithm and protocol; "
                                "channels are reported, not bounded"),
)}


def _figures(rows: list[dict[str, Any]], target: float | None = None) -> dict[str, Any]:
    """rows, geomean |error|, mean error (signed, geometric), the worst row and how far off it is, and how many
    rows are within ``target``."""
    ratios = [r for r in rows if r.get("ratio")]
    choices = [r for r in rows if "same" in r]
    out: dict[str, Any] = {"rows": len(choices) or len(ratios)}  # the rows the figures are of
    if choices:
        out["same"] = sum(bool(r["same"]) for r in choices)
    if ratios:
        worst = max(ratios, key=distance)
        out.update(geomean_abs_error=geomean_abs_error(r["ratio"] for r in ratios),
                   mean_error=math.exp(sum(math.log(r["ratio"]) for r in ratios) / len(ratios)) - 1,
                   worst_row=worst["row"], worst_times_off=times_off(worst["ratio"]))
        if target is not None:
            out["within_target"] = sum(abs(error(r["ratio"])) <= target for r in ratios)
    return out


def summarize(corpus: Corpus, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures over all rows, per group (each against its bound) and per breakdown, and whether the rows are
    within the corpus's bounds."""
    bounds = corpus.bounds
    whole = {**_figures(rows), "rows": len(rows)}
    # a group bounded by name is always reported (no rows: nothing to fail); others where they have rows
    named = [n for n, _ in bounds.groups if n != "*"]
    names = [g for g in dict.fromkeys([*corpus.groups, *named]) if g in named
             or any(r[corpus.group_by] == g for r in rows)]
    names += sorted({r[corpus.group_by] for r in rows} - set(names))
    groups = {}
    for name in names:
        mine = [r for r in rows if r[corpus.group_by] == name]
        figures = {**_figures(mine, corpus.target), **{f"max_{k}": max(r[k] for r in mine) for k in corpus.largest if mine}}
        bound = bounds.group(name)
        geomean = figures.get("geomean_abs_error")
        groups[name] = {**figures, "bound": bound, "passed": bound is None or geomean is None or geomean <= bound}
    breakdown = []
    if corpus.breakdown:
        for key in sorted({tuple(r[k] for k in corpus.breakdown) for r in rows if r.get("ratio")},
                          key=lambda k: tuple(corpus.groups.index(v) if v in corpus.groups else v for v in k)):
            mine = [r for r in rows if r.get("ratio") and tuple(r[k] for k in corpus.breakdown) == key]
            breakdown.append({**dict(zip(corpus.breakdown, key)), **_figures(mine)})
    unpredicted = sum(1 for r in rows if "ratio" in r and not r["ratio"])
    bounded = whole.get("geomean_abs_error", 0)
    if corpus.weight_by:
        weighted, count = weighted_geomean_abs_error(rows, corpus.weight_by)
        whole.update(weighted_geomean_abs_error=weighted, weighted_by=corpus.weight_by, weighted_groups=count)
        bounded = weighted or 0
    memory = memory_figures(rows, corpus.weight_by)
    within = [not bounds.fits or not memory["no"], all(g["passed"] for g in groups.values()), not unpredicted,
              bounds.geomean_abs_error is None or bounded <= bounds.geomean_abs_error,
              bounds.worst_times_off is None or whole.get("worst_times_off", 1) <= bounds.worst_times_off,
              not bounds.agreement or whole.get("same") == len(rows)]
    return {**whole, "unpredicted": unpredicted, "groups": groups, "breakdown": breakdown, "memory": memory,
            "bounds": asdict(bounds), "passed": all(within), "error_definition": corpus.error_definition}


def memory_figures(rows: list[dict[str, Any]], weight_by: str = "") -> dict[str, Any]:
    """How many rows the memory model says fit (``fits``: yes, tight, no), and the rows it says do not; where
    rows state the memory they used (``memory_ratio``: predicted / published), the figures of those (reported,
    not bounded): over all of them, per ``weight_by`` group, and each group weighing the same."""
    verdicts = [r["fits"] for r in rows if r.get("fits") in ("yes", "tight", "no")]
    out = {"rows": len(verdicts), **{v: verdicts.count(v) for v in ("yes", "tight", "no")},
           "no_rows": [r["row"] for r in rows if r.get("fits") == "no"]}
    stated = [{**r, "ratio": r["memory_ratio"]} for r in rows if r.get("memory_ratio")]
    if stated:
        out["published"] = _figures(stated)
        if weight_by:
            groups = sorted({r[weight_by] for r in stated})
            out["published"]["groups"] = {g: _figures([r for r in stated if r[weight_by] == g]) for g in groups}
            weighted, count = weighted_geomean_abs_error(stated, weight_by)
            out["published"].update(weighted_geomean_abs_error=weighted, weighted_groups=count)
    return out


def validation_result(corpus: Corpus, rows: list[dict[str, Any]], where: str | Path, **meta: Any) -> Result:
    """A Result of kind "validate": the rows and meta.summary, meta.corpus (the file), meta.validates (the
    corpus's name)."""
    if not rows:
        raise MeshscaleError(f"{where}: no rows to validate")
    return Result("validate", rows, True, {"corpus": str(where), "validates": corpus.name, **meta,
                                           "summary": summarize(corpus, rows)})


__all__ = ["Bounds", "CORPORA", "Corpus", "ERROR_DEFINITION", "SIZE_CLASSES", "distance", "error",
           "geomean_abs_error", "memory_figures", "summarize", "times_off", "validation_result",
           "weighted_geomean_abs_error"]
