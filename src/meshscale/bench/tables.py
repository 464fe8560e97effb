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
    for collective, group in groupby(rows, key=lambda r: r["collective"]):
        group = list(group)
        world = result.meta.get("world_size", "?")
        hosts = result.meta.get("hosts")
        where = f" on {len(hosts)} hosts ({', '.join(hosts)})" if hosts else ""
        cycles = (result.meta.get("spec") or {}).get("cycles", 1)
        of_cycles = f", median of {cycles} cycles" if cycles > 1 else ""
        table = Table(title=f"{collective}: {world} ranks over {result.meta.get('backend', '?')}{where}, "
                            f"time = {_AVERAGE[result.meta.get('average', 3)]}{of_cycles}")
        for col in ("size(B)", "count", "type", "redop", "root"):
            table.add_column(col, justify="right")
        places = [p for p in (False, True) if any(r["inplace"] == p for r in group)]  # torch lacks some variants
        each = any("iter_median_s" in r for r in group)  # --iter-times
        spread = any("cycle_times_s" in r for r in group)  # --cycles: the slowest cycle's time over the fastest
        columns = (("time(us)", "algbw GB/s", "busbw GB/s", "#wrong") + (("median(us)", "slowest(us)") if each else ())
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
                          + ([f"{r['iter_median_s'] * 1e6:.2f}", f"{r['iter_max_s'] * 1e6:.2f}"] if each else [])
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
    ``add(row)`` for each row as it comes, ``echo(line)`` prints; with ``cycles`` > 1 a line opens each cycle."""

    def __init__(self, places: tuple[str, ...], echo: Callable[[str], None], cycles: int = 1):
        self.places, self.echo, self.cycles = places, echo, cycles
        self._collective: str | None = None
        self._cycle: int | None = None
        self._pending: list[dict] = []

    def add(self, row: dict) -> None:
        if row.get("cycle", 0) != self._cycle:
            self._cycle, self._collective = row.get("cycle", 0), None
            if self.cycles > 1:
                self.echo(f"# cycle {self._cycle + 1} of {self.cycles}")
        if row["collective"] != self._collective:
            self._collective = row["collective"]
            self.echo(f"# {row['collective']}")
            for line in _STREAM_HEADER:
                self.echo(line)
        self._pending.append(row)
        expected = [p for p in ("out", "in") if p in self.places and p in kind(row["collective"]).places]
        if len(self._pending) == len(expected):
            self.echo(_stream_line(self._pending))
            self._pending = []


_STREAM_HEADER = (
    f"#{'':>64}out-of-place{'':>23}in-place",
    f"#{'size':>11}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}" + f" {'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}" * 2,
    f"#{'(B)':>11}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}" + f" {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}" * 2,
)


def _stream_line(rows: list[dict]) -> str:
    first = rows[0]
    line = (f"{first['size_bytes']:>12}  {first['count']:>12}  {DTYPE_LABELS.get(first['dtype'], first['dtype']):>8}  "
            f"{first['redop']:>6}  {first['root']:>6}")
    by_place = {r["inplace"]: r for r in rows}
    for inplace in (False, True):
        r = by_place.get(inplace)
        if r is None:
            line += f" {'-':>7}  {'-':>6}  {'-':>6}  {'-':>6}"
            continue
        wrong = "N/A" if r["wrong"] is None else str(r["wrong"])
        line += (f" {r['time_s'] * 1e6:>7.2f}  {gbps(r['algbw_bytes_per_s']):>6.2f}  "
                 f"{gbps(r['busbw_bytes_per_s']):>6.2f}  {wrong:>6}")
    return line


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
    samples/s and bytes/s."""
    from meshscale.units import format_bytes

    table = Table(title=f"input pipeline of {report.data.root} ({report.data.kind})")
    for c in ("stage", "processes", "seconds", "files/s", "read/s", "samples/s"):
        table.add_column(c, justify="left" if c == "stage" else "right")
    for p in (report.first, report.cached):
        table.add_row(f"read, {p.label} pass" + ("" if p.label != "first" or p.evicted else " (not evicted)"),
                      str(p.readers), f"{p.seconds:.3f}", f"{p.files_per_s:,.0f}", f"{format_bytes(p.bytes_per_s)}/s",
                      f"{report.storage_samples_per_s(p):,.0f}")
    if report.decode:
        d = report.decode
        table.add_row(f"decode to {d.what}", str(d.readers), f"{d.seconds:.3f}", "-", "-", f"{d.samples_per_s:,.0f}")
    if report.demand:
        need = report.demand.samples_per_s * report.data.bytes_per_sample
        table.add_row("GPUs" + (" (PREDICTED)" if report.demand.predicted else " (measured)"), "-", "-", "-",
                      f"{format_bytes(need)}/s", f"{report.demand.samples_per_s:,.0f}")
    return table
