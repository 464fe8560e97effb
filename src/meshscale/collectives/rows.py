"""Rows of a collective sweep, as `bench collective` and nccl-tests' tables give them, combined across the cycles
of one run: one place that both the benchmark and the validation of its corpus read."""
from __future__ import annotations

import statistics

from meshscale.collectives.kinds import kind


def median_over_cycles(rows: list[dict], world_size: int) -> list[dict]:
    """One row per (collective, dtype, op, size, place) from the rows of every cycle: the median cycle's time (and per
    rank), bandwidths from it, the per-iteration figures of the cycle at the median (the lower middle), the wrong
    elements of all cycles, and each cycle's time in ``cycle_times_s``. Rows of a single cycle come back as they
    are, less their cycle number."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        key = (row["collective"], row.get("dtype"), row.get("redop"), row["size_bytes"], row["inplace"])
        groups.setdefault(key, []).append(row)
    if all(len(same) == 1 for same in groups.values()):
        return [{k: v for k, v in row.items() if k != "cycle"} for row in rows]
    combined = []
    for same in groups.values():
        row = dict(same[0])
        row.pop("cycle", None)
        row["cycle_times_s"] = [r["time_s"] for r in same]
        row["time_s"] = statistics.median(row["cycle_times_s"])
        row["algbw_bytes_per_s"], row["busbw_bytes_per_s"] = kind(row["collective"]).algbw_busbw(
            row["size_bytes"], row["time_s"], world_size)
        row["rank_times_s"] = [statistics.median(ts) for ts in zip(*(r["rank_times_s"] for r in same))]
        row["wrong"] = None if row["wrong"] is None else sum(r["wrong"] for r in same)
        if "iter_times_s" in row:  # per-iteration figures (-I): the median cycle's own, a consistent set
            middle = sorted(same, key=lambda r: r["time_s"])[(len(same) - 1) // 2]
            row.update({k: v for k, v in middle.items() if k.startswith(("iter_", "rank_iter_"))})
        combined.append(row)
    return combined
