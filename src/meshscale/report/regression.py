"""`meshscale compare A.json B.json`: row-by-row ratios of two runs of the same benchmark, flagging every figure
that got worse by more than a threshold (a nightly job's check for a degraded link or a slower stack)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from meshscale.errors import MeshscaleError
from meshscale.results import Result

# kind -> (row keys that identify a row, [(figure, higher is better)])
SPECS: dict[str, tuple[tuple[str, ...], tuple[tuple[str, bool], ...]]] = {
    "bench-collective": (("collective", "size_bytes", "dtype", "inplace", "redop", "root"),
                         (("busbw_bytes_per_s", True),)),
    "sim": (("collective", "size_bytes", "algorithm"), (("busbw_bytes_per_s", True),)),
    "bench-p2p": (("src", "dst", "mode"), (("bandwidth_bytes_per_s", True), ("latency_s", False))),
    "scale": (("world_size", "mode"), (("throughput_samples_per_s", True), ("efficiency", True))),
    "predict": (("world_size", "mode"), (("throughput_samples_per_s", True), ("efficiency", True))),
}


@dataclass
class Change:
    """One figure of one row in both runs. ``ratio`` is B / A; ``score`` is the same ratio turned so that
    below 1 is always worse (A / B for times)."""

    key: dict[str, Any]
    figure: str
    a: float
    b: float
    ratio: float
    score: float
    dropped: bool


@dataclass
class Comparison:
    kind: str
    threshold: float
    changes: list[Change] = field(default_factory=list)
    only_a: list[dict[str, Any]] = field(default_factory=list)
    only_b: list[dict[str, Any]] = field(default_factory=list)
    wrong: list[dict[str, Any]] = field(default_factory=list)  # rows whose check failed in B and not in A
    missing: list[tuple[dict[str, Any], str]] = field(default_factory=list)  # (row, figure) A has and B lacks or NaN
    allow_missing: bool = False  # rows or figures missing from B are listed but do not fail the comparison

    @property
    def dropped(self) -> list[Change]:
        return [c for c in self.changes if c.dropped]

    @property
    def incomplete(self) -> bool:
        """B lacks rows or figures that A has (a broken or partial run, not the same sweep)."""
        return bool(self.only_a or self.missing)

    @property
    def failed(self) -> bool:
        return bool(self.dropped or self.wrong or (self.incomplete and not self.allow_missing))


def compare(a: Result, b: Result, threshold_pct: float = 5.0, allow_missing: bool = False) -> Comparison:
    """Match the rows of ``a`` and ``b`` by their identifying keys and flag figures that dropped by more than
    ``threshold_pct`` percent. Rows of ``a`` missing from ``b``, and figures ``b`` lacks or has as NaN, fail the
    comparison too (a nightly gate must not pass a broken run) unless ``allow_missing``."""
    if a.kind != b.kind:
        raise MeshscaleError(f"cannot compare a {a.kind!r} result with a {b.kind!r} result; give two runs of the same command")
    if a.kind not in SPECS:
        raise MeshscaleError(f"results of kind {a.kind!r} have no figures to compare; use one of {', '.join(SPECS)}")
    if not 0 <= threshold_pct < 100:
        raise MeshscaleError(f"threshold {threshold_pct}% is out of range; give a percentage between 0 and 100")
    keys, figures = SPECS[a.kind]
    index_a, index_b = _index(a.rows, keys), _index(b.rows, keys)
    out = Comparison(a.kind, threshold_pct, allow_missing=allow_missing)
    limit = 1 - threshold_pct / 100
    for ident, row_a in index_a.items():
        row_b = index_b.get(ident)
        if row_b is None:
            out.only_a.append(_key(ident, keys))
            continue
        if row_b.get("wrong") and not row_a.get("wrong"):
            out.wrong.append(_key(ident, keys))
        for figure, higher_better in figures:
            va, vb = row_a.get(figure), row_b.get(figure)
            if not _usable(va) or va <= 0:
                continue
            if not _usable(vb):
                out.missing.append((_key(ident, keys), figure))
                continue
            ratio = vb / va
            score = ratio if higher_better else (va / vb if vb > 0 else float("inf"))
            out.changes.append(Change(_key(ident, keys), figure, va, vb, ratio, score, score < limit))
    out.only_b = [_key(ident, keys) for ident in index_b if ident not in index_a]
    if not out.changes and not (out.missing and not allow_missing):
        raise MeshscaleError(f"the two {a.kind} results share no row (matched on {', '.join(keys)}); "
                             "compare runs of the same sweep")
    return out


def _usable(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _index(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[tuple, dict[str, Any]]:
    return {tuple(r.get(k) for k in keys): r for r in rows}


def _key(ident: tuple, keys: tuple[str, ...]) -> dict[str, Any]:
    return {k: v for k, v in zip(keys, ident) if v is not None}
