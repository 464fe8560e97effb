"""Rich tables for bench results: nccl-tests' columns plus the topology bound, and the p2p matrices."""
from __future__ import annotations

from itertools import groupby
from typing import Callable

from rich.table import Table

from meshscale.bench.cases import DTYPE_LABELS
from meshscale.collectives.kinds import kind
from meshscale.results import Result
from meshscale.topology.multinode import network_assumed
from meshscale.units import gbps


def collective_tables(result: Result) -> list[Table]:
    """One table per collective: out-of-place and in-place columns side by side, then bound and %bound, and
    the predicted time and busbw where the topology was known."""
    tables = []
    rows = result.rows
    several = len({(r["dtype"], r["redop"]) for r in rows}) > 1
    for (collective, dtype, redop), group in groupby(rows, key=lambda r: (r["collective"], r["dtype"], r["redop"])):
        group = list(group)
        of_type = f" {DTYPE_LABELS.get(dtype, dtype)}{'' if redop == 'none' else ' ' + redop}" if several else ""
        world = result.meta.get("world_size", "?")
        hosts = result.meta.get("hosts")
        where = f" on {len(hosts)} hosts ({', '.join(hosts)})" if hosts else ""
        cycles = (result.meta.get("spec") or {}).get("cycles", 1)
        of_cycles = f", median of {cycles} cycles" if cycles > 1 else ""
        table = Table(title=f"{collective}{of_type}: {world} ranks over {result.meta.get('backend', '?')}{where}, "
                            f"time = {_AVERAGE[result.meta.get('average', 3)]}{of_cycles}")
        for col in ("size(B)", "count", "type", "redop", "root"):
            table.add_column(col, justify="right")
        places = [p for p in (False, True) if any(r["inplace"] == p for r in group)]  # torch lacks some variants
        each = any("iter_times_s" in r for r in group)  # -I 1: nccl-tests' per-iteration columns
        spread = any("cycle_times_s" in r for r in group)  # --cycles: the slowest cycle's time over the fastest
        columns = (("time(us)", "algbw GB/s", "busbw GB/s", "#wrong") + (PER_ITER_COLUMNS if each else ())
                   + (("cycles max/min",) if spread else ()))
        for inplace in places:
            for col in columns:
                table.add_column(f"{'in-place' if inplace else 'out-of-place'}\n{col}", justify="right")
        table.add_column("bound\nGB/s", justify="right")
        table.add_column("%bound", justify="right")
        predicted = any(r.get("predicted_time_s") for r in group)
        if predicted:
            table.add_column("predicted\ntime(us)", justify="right")
            table.add_column("predicted\nbusbw GB/s", justify="right")
        for size, same in groupby(group, key=lambda r: r["size_bytes"]):
            same = list(same)
            by_place = {r["inplace"]: r for r in same}
            first = same[0]
            cells = [str(size), str(first["count"]), DTYPE_LABELS.get(first["dtype"], first["dtype"]), first["redop"],
                     str(first["root"])]
            for inplace in places:
                r = by_place.get(inplace)
                cells += ([f"{r['time_s'] * 1e6:.2f}", f"{gbps(r['algbw_bytes_per_s']):.2f}",
                           f"{gbps(r['busbw_bytes_per_s']):.2f}", "N/A" if r["wrong"] is None else str(r["wrong"])]
                          + (_per_iter_cells(r) if each else [])
                          + ([f"{max(r['cycle_times_s']) / min(r['cycle_times_s']):.2f}"] if spread else [])
                          if r else ["-"] * len(columns))
            bound = first.get("bound_busbw_bytes_per_s")
            best = max(r["busbw_bytes_per_s"] for r in same)
            cells += [f"{gbps(bound):.1f}" if bound else "-", f"{100 * best / bound:.0f}%" if bound else "-"]
            if predicted:
                time_s = first.get("predicted_time_s")
                cells += [f"{time_s * 1e6:.2f}", f"{gbps(first['predicted_busbw_bytes_per_s']):.2f}"] if time_s else ["-"] * 2
            table.add_row(*cells, style="red" if any(r["wrong"] for r in same) else None)
        tables.append(table)
    return tables


_AVERAGE = {0: "rank 0's", 1: "mean over ranks", 2: "fastest rank", 3: "slowest rank"}
# nccl-tests' -I columns (its src/util.cu): each call's time is its slowest rank's; min, max, p99, coefficient of
# variation
PER_ITER_COLUMNS = ("i_min(us)", "i_max(us)", "i_p99(us)", "i_cv%")


def _per_iter_cells(r: dict) -> list[str]:
    return [nccl_figure(r[k] * 1e6, 7).strip() for k in ("iter_min_s", "iter_max_s", "iter_p99_s")] + \
        [nccl_figure(r["iter_cv_pct"], 7).strip()]


def p2p_tables(result: Result) -> list[Table]:
    """One matrix per mode (GB/s, or us for latency): rows = source, columns = destination."""
    tables = []
    names = result.meta.get("devices", [])
    for mode in result.meta.get("modes", []):
        cells = {(r["src"], r["dst"]): r for r in result.rows if r["mode"] == mode}
        if not cells:
            continue
        latency = mode == "latency"
        srcs = [n for n in ["host", *names] if any(k[0] == n for k in cells)]
        dsts = [n for n in [*names, "host"] if any(k[1] == n for k in cells)]
        table = Table(title="latency, us (median of small copies)" if latency else f"{mode} bandwidth, GB/s")
        table.add_column("src \\ dst")
        for d in dsts:
            table.add_column(d, justify="right")
        for s in srcs:
            row = [s]
            for d in dsts:
                r = cells.get((s, d))
                row.append("-" if r is None else f"{r['latency_s'] * 1e6:.1f}" if latency
                           else f"{gbps(r['bandwidth_bytes_per_s']):.1f}")
            table.add_row(*row)
        tables.append(table)
    return tables


class RowStream:
    """nccl-tests' text lines, one per size as soon as its places (out-of-place, in-place) are measured:
    ``add(row)`` for each row as it comes, ``echo(line)`` prints; with ``cycles`` > 1 a line opens each cycle;
    ``per_iter`` (-I 1) adds nccl-tests' i_min, i_max, i_p99 and i_cv% columns to each place. Narrower than
    nccl-tests' line (``width``), the count, type, redop and root columns go to the heading."""

    def __init__(self, places: tuple[str, ...], echo: Callable[[str], None], cycles: int = 1,
                 width: int | None = None, per_iter: bool = False):
        self.places, self.echo, self.cycles, self.per_iter = places, echo, cycles, per_iter
        self.narrow = width is not None and width < len(stream_header(False, per_iter)[1])
        self._series: tuple | None = None
        self._cycle: int | None = None
        self._pending: list[dict] = []

    def add(self, row: dict) -> None:
        if row.get("cycle", 0) != self._cycle:
            self._cycle, self._series = row.get("cycle", 0), None
            if self.cycles > 1:
                self.echo(f"# cycle {self._cycle + 1} of {self.cycles}")
        series = (row["collective"], row["dtype"], row["redop"])
        if series != self._series:
            self._series = series
            if self.narrow:
                self.echo(f"# {row['collective']}: type {DTYPE_LABELS.get(row['dtype'], row['dtype'])}, redop "
                          f"{row['redop']}, root {row['root']}")
            else:
                self.echo(f"# {row['collective']}")
            for line in stream_header(self.narrow, self.per_iter):
                self.echo(line)
        self._pending.append(row)
        expected = [p for p in ("out", "in") if p in self.places and p in kind(row["collective"]).places]
        if len(self._pending) == len(expected):
            self.echo(_stream_line(self._pending, self.narrow, self.per_iter))
            self._pending = []


_PLACE_HEADS = (f" {'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}", f" {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}")
_ITER_HEADS = (f"  {'i_min':>7}  {'i_max':>7}  {'i_p99':>7}  {'i_cv%':>7}", f"  {'(us)':>7}  {'(us)':>7}  {'(us)':>7}  {'(%)':>7}")


def stream_header(narrow: bool, per_iter: bool = False) -> tuple[str, str, str]:
    """nccl-tests' three heading lines (the places, the names, the units); ``per_iter``: with its -I columns."""
    heads = [a + (b if per_iter else "") for a, b in zip(_PLACE_HEADS, _ITER_HEADS)]
    ids = 11 if narrow else 51  # size; or size, count, type, redop and root
    if per_iter:  # each place's name over the middle of its columns
        names = ("out-of-place (+ per-iteration)", "in-place (+ per-iteration)")
        first = "#" + "".join(f"{name:^{len(heads[0])}}" for name in names).rstrip()
        first = "#" + " " * ids + first[1:]
    else:
        first = f"#{'':>{ids + 13}}out-of-place{'':>23}in-place"
    if narrow:
        return first, f"#{'size':>11}" + heads[0] * 2, f"#{'(B)':>11}" + heads[1] * 2
    return (first, f"#{'size':>11}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}" + heads[0] * 2,
            f"#{'(B)':>11}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}" + heads[1] * 2)


def nccl_figure(value: float, width: int) -> str:
    """A figure in ``width`` characters as nccl-tests prints its times and bandwidths: two decimals while they
    fit, then one, then none, then exponent form (so 10,000 us and more stay in their column)."""
    for decimals in (2, 1, 0):
        text = f"{value:>{width}.{decimals}f}"
        if len(text) <= width:
            return text
    return f"{value:>{width}.1e}" if width >= 7 else f"{value:>{width}.0e}"


def _stream_line(rows: list[dict], narrow: bool = False, per_iter: bool = False) -> str:
    first = rows[0]
    line = f"{first['size_bytes']:>12}"
    if not narrow:
        line += (f"  {first['count']:>12}  {DTYPE_LABELS.get(first['dtype'], first['dtype']):>8}  "
                 f"{first['redop']:>6}  {first['root']:>6}")
    by_place = {r["inplace"]: r for r in rows}
    for inplace in (False, True):
        r = by_place.get(inplace)
        if r is None:
            line += f" {'-':>7}  {'-':>6}  {'-':>6}  {'-':>6}" + (f"  {'-':>7}" * 4 if per_iter else "")
            continue
        wrong = "N/A" if r["wrong"] is None else str(r["wrong"])
        line += (f" {nccl_figure(r['time_s'] * 1e6, 7)}  {nccl_figure(gbps(r['algbw_bytes_per_s']), 6)}  "
                 f"{nccl_figure(gbps(r['busbw_bytes_per_s']), 6)}  {wrong:>6}")
        if per_iter:
            line += "".join(f"  {nccl_figure(r[k] * 1e6, 7)}" for k in ("iter_min_s", "iter_max_s", "iter_p99_s"))
            line += f"  {nccl_figure(r['iter_cv_pct'], 7)}"
    return line


def sweep_header(spec, world_size: int, backend: str) -> list[str]:
    """nccl-tests' opening lines (what runs, before the first result arrives), each under 80 columns."""
    sizes = spec.sizes_bytes
    step = f"{sizes[1] - sizes[0]}(bytes)" if len(sizes) > 2 and sizes[2] - sizes[1] == sizes[1] - sizes[0] \
        else f"{sizes[1] // sizes[0]}(factor)" if len(sizes) > 1 else "-"
    lines = [f"# meshscale bench collective: {world_size} ranks over {backend}, one process each",
             f"# minBytes {sizes[0]} maxBytes {sizes[-1]} step: {step}",
             f"# warmup iters: {spec.warmup_iters} iters: {spec.iters} validation: {int(spec.check)} "
             f"graph: {int(spec.cuda_graph)} cycles: {spec.cycles}"]
    if spec.blocking:
        lines.append("# Blocking Enabled: wait for completion and barrier after each collective")
    if spec.cpu_time:
        lines.append("# times are the host's (launch to completion), not the GPU's")
    if spec.per_iter:
        lines.append("# Per-Iteration Report: each call timed; i_* of each call's slowest rank"
                     + (f", the first {spec.per_iter_skip} calls left out" if spec.per_iter_skip else ""))
    if spec.register:
        lines.append("# buffers from NCCL's allocator, registered with the communicator (-R 1)")
    return lines + ["#"]


def bound_lines(result: Result) -> list[str]:
    """Under nccl-tests' lines: per collective, its best busbw against the topology's bound (`--format table`
    has the bound and the prediction of every size)."""
    lines = []
    for collective, group in groupby(result.rows, key=lambda r: r["collective"]):
        group = list(group)
        bound = group[0].get("bound_busbw_bytes_per_s")
        if bound:
            best = max(r["busbw_bytes_per_s"] for r in group)
            lines.append(f"# {collective}: best busbw {gbps(best):.2f} GB/s of the topology's bound "
                         f"{gbps(bound):.1f} GB/s ({100 * best / bound:.0f}%)")
    return lines


def closing_lines(result: Result) -> list[str]:
    """nccl-tests' last lines: the wrong elements over every row and the mean bus bandwidth (GB/s)."""
    rows = result.rows
    wrong = sum(r["wrong"] or 0 for r in rows)
    checked = any(r["wrong"] is not None for r in rows)
    mean_busbw = gbps(sum(r["busbw_bytes_per_s"] for r in rows) / len(rows)) if rows else 0.0
    verdict = ("OK" if not wrong else "FAILED") if checked else "(not checked)"
    lines = [f"# Out of bounds values : {wrong} {verdict}", f"# Avg bus bandwidth    : {mean_busbw:g} GB/s"]
    if result.meta.get("interrupted"):
        lines.append(f"# interrupted after {len(rows)} rows")
    topology = result.meta.get("topology") or {}
    if network_assumed(topology.get("attrs") or {}):
        lines.append(f"# bound and predicted figures are on {topology.get('title')}: a %bound over 100% says the "
                     f"path between hosts is faster than assumed")
    return lines


def io_table(report) -> Table:
    """`bench io`'s rates side by side (an `IoReport`): each read pass, decoding and the GPUs' demand, in
    samples/s and bytes/s (`format_rate`, each figure with its unit)."""
    from meshscale.units import format_rate

    table = Table(title=f"input pipeline of {report.data.root} ({report.data.kind})")
    for c in ("stage", "processes", "seconds", "files", "read", "samples"):
        table.add_column(c, justify="left" if c == "stage" else "right")
    for p in (report.first, report.cached):
        table.add_row(f"read, {p.label} pass" + ("" if p.label != "first" or p.evicted else " (not evicted)"),
                      str(p.readers), f"{p.seconds:.3f}", format_rate(p.files_per_s, "files"), format_rate(p.bytes_per_s),
                      format_rate(report.storage_samples_per_s(p), "samples"))
    if report.decode:
        d = report.decode
        table.add_row(f"decode to {d.what}", str(d.readers), f"{d.seconds:.3f}", "-", "-",
                      format_rate(d.samples_per_s, "samples"))
    if report.demand:
        need = report.demand.samples_per_s * report.data.bytes_per_sample
        table.add_row("GPUs" + (" (PREDICTED)" if report.demand.predicted else " (measured)"), "-", "-", "-",
                      format_rate(need), format_rate(report.demand.samples_per_s, "samples"))
    return table
