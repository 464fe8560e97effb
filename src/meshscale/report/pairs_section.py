"""The report's section for `bench pairs`: two heatmaps (p2p bandwidth and 2-rank all_reduce bus bandwidth of
every worker pair, symmetric) and a verdict naming the outliers the statistic flagged."""
from __future__ import annotations

import numpy as np

import meshscale.plots as plots
from meshscale.report.parts import Plot, Section, Source, slug
from meshscale.report.verdicts import Verdict
from meshscale.units import gbps

FIGURES = (("p2p_bytes_per_s", "p2p, GB/s"), ("all_reduce_busbw_bytes_per_s", "2-rank all_reduce busbw, GB/s"))


def pair_grids(rows: list[dict], workers: list[str]) -> list[plots.Grid]:
    """One symmetric worker x worker grid per figure; the diagonal blank."""
    grids = []
    for key, title in FIGURES:
        matrix = np.full((len(workers), len(workers)), np.nan)
        for r in rows:
            value = gbps(r.get(key) or np.nan)
            matrix[r["rank_a"], r["rank_b"]] = matrix[r["rank_b"], r["rank_a"]] = value
        grids.append(plots.Grid(f"pairs {title}", matrix, workers, "GB/s"))
    return grids


def pairs_section(source: Source) -> Section:
    meta = source.result.meta
    workers = meta.get("workers") or sorted({r["a"] for r in source.result.rows} | {r["b"] for r in source.result.rows})
    flagged = meta.get("outlier_workers") or []
    verdict = (Verdict("bad", "outliers: " + "; ".join(flagged)) if flagged else
               Verdict("good", "no worker below half of the others' median"))
    pid = slug("pairs", source.label)
    figure = plots.to_svg(plots.heatmaps(pair_grids(source.result.rows, workers)), pid)
    return Section(f"Worker pairs ({source.label})", plots=[Plot(pid, "Every worker pair, measured once", figure, verdict)])
