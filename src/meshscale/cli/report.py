"""`meshscale report`, `compare`, `doctor` and `tour`."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from meshscale.cli.output import print_tables, text_console
from meshscale.cli.checks import CPU_COUNT, TIMEOUT_S, checked, output_dir, output_file
from meshscale.validation import Range
from meshscale.units import format_bytes, gbps

STATUS_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "info": "cyan"}


def report(results: List[Path] = typer.Argument(..., help="result JSON files, or directories of them"),
           output: Path = typer.Option(Path("report"), "--output", help="directory for index.html", callback=checked(output_dir)),
           title: str = typer.Option("meshscale report", help="page title")) -> None:
    """Write a static HTML report (plots inline, no server) from result files."""
    from meshscale.report.html import load_sources, write_report
    skipped: list[str] = []
    page = write_report(load_sources(results, skipped), output, title)
    for line in skipped:  # one line per file of a folder that is no result
        typer.echo(f"meshscale: {line}", err=True)
    typer.echo(f"wrote {page}")


def _figure_text(figure: str, value: float) -> str:
    if figure.endswith("_bytes_per_s"):
        return f"{gbps(value):.2f} GB/s"
    if figure.endswith("_s"):
        return f"{value * 1e6:.1f} us"
    return f"{value:.3g}"


def compare(a: Path = typer.Argument(..., help="the reference run (result JSON)"),
            b: Path = typer.Argument(..., help="the new run of the same command"),
            threshold: float = typer.Option(5.0, "--threshold", "-t", help="percent drop that counts as a regression", callback=checked(Range(0, 99.999))),
            show_all: bool = typer.Option(False, "--all", help="list every row, not only the drops"),
            allow_missing: bool = typer.Option(False, "--allow-missing", help="rows or figures of A missing (or NaN) "
                                               "in B do not fail the comparison")) -> None:
    """Row-by-row ratios of two runs; exit code 1 when any figure dropped by more than the threshold, or when B
    lacks rows or figures A has (unless --allow-missing)."""
    from meshscale.report.regression import compare as run_compare
    from meshscale.results import load_result
    result = run_compare(load_result(a), load_result(b), threshold, allow_missing)
    table = Table(title=f"{b.name} against {a.name} ({result.kind}, threshold {threshold:g}%)")
    for col in ("row", "figure", "A", "B", "B/A", ""):
        table.add_column(col, justify="right" if col in ("A", "B", "B/A") else "left")
    for c in result.changes:
        if show_all or c.dropped:
            key = " ".join(format_bytes(v) if k == "size_bytes" else str(v) for k, v in c.key.items())
            table.add_row(key, c.figure, _figure_text(c.figure, c.a), _figure_text(c.figure, c.b), f"{c.ratio:.3f}",
                          "[bold red]DROP[/]" if c.dropped else "ok")
    console = text_console()
    if table.row_count:
        print_tables(table, console=console)
    for what, rows in (("only in A", result.only_a), ("only in B", result.only_b), ("wrong results in B", result.wrong)):
        if rows:
            console.print(f"{len(rows)} row(s) {what}: " + "; ".join(" ".join(map(str, r.values())) for r in rows[:5]))
    if result.missing:
        console.print(f"{len(result.missing)} figure(s) of A missing or not a number in B: "
                      + "; ".join(f"{' '.join(map(str, k.values()))} {f}" for k, f in result.missing[:5]))
    if result.incomplete:
        console.print("B is incomplete against A: " + ("allowed by --allow-missing" if allow_missing
                                                       else "a failure (pass --allow-missing to accept it)"))
    console.print(f"{len(result.dropped)} of {len(result.changes)} figures dropped by more than {threshold:g}%"
                  + ("" if result.failed else ": no regression"), highlight=False)
    if result.failed:
        sys.exit(1)  # typer.Exit would be swallowed by main()'s standalone_mode=False


def doctor(json_path: Optional[Path] = typer.Option(None, "--json", help="also save the checks as a result JSON", callback=checked(output_file())),
           level: int = typer.Option(1, "--level", help="1 configuration and error counters; 2 + memory and PCIe copies "
                                     "per GPU; 3 + every GPU pair and an all_reduce (dcgmi diag -r LEVEL where installed); "
                                     "each watches the error counters' rates for 1, 5 or 60 s",
                                     callback=checked(Range(1, 3, integer=True)))) -> None:
    """Check the driver, GPUs, NVLink, P2P, PCIe, /dev/shm, memlock, NCCL knobs, network, versions and the GPUs'
    error and health counters (corrected errors by rate, DCGM's limits); --level 2 and 3 also measure.
    Exit 0: no failure (warnings and info lines allowed); 1: at least one FAIL line; 2: bad input."""
    from meshscale.app.doctor import summary
    from meshscale.app.doctor_levels import run_levels
    checks = run_levels(level)
    console = text_console()
    for c in checks:
        console.print(f"[{STATUS_STYLE[c.status]}]{c.status.upper():<5}[/] {c.name}: {c.message}")
        if c.fix and c.status != "pass":
            console.print(f"      fix: {c.fix}")
    if json_path:
        from meshscale.results import measured
        console.print(f"wrote {measured('doctor', [vars(c) for c in checks]).save(json_path)}")
    console.print(summary(checks), highlight=False)
    if any(c.status == "fail" for c in checks):
        sys.exit(1)  # typer.Exit would be swallowed by main()'s standalone_mode=False


def tour(output: Path = typer.Option(Path("meshscale-tour"), "--output", help="report directory", callback=checked(output_dir)),
         full: bool = typer.Option(False, "--full", help="nccl-tests-length sweeps and every scale run, however long (the default keeps within a minute on GPUs, half a minute on CPU workers, and names the scale runs it left out)"),
         fast: bool = typer.Option(False, "--fast", help="the smallest sizes and steps (a smoke test)"),
         cpus: Optional[int] = typer.Option(None, "--cpus", help="CPU worker ranks when there is no GPU (default 2)", callback=checked(CPU_COUNT)),
         timeout_s: float = typer.Option(120.0, "--timeout-s", help="per-operation timeout of every distributed stage", callback=checked(TIMEOUT_S))) -> None:
    """Characterise this machine end to end (topology, p2p, collectives, scaling, predictions) into DIR/index.html,
    within a minute on one to eight GPUs and half a minute on CPU workers (--full: the long version)."""
    from meshscale.app.tour import TourSettings, run_tour
    created = not output.exists()
    try:
        outcome = run_tour(output, TourSettings(full=full, fast=fast, cpus=cpus, timeout_s=timeout_s))
    except BaseException:
        if created and output.is_dir() and not any(output.iterdir()):
            output.rmdir()  # a failed tour leaves no empty folder behind
        raise
    for stage in outcome.stages:
        style = {"done": "green", "skipped": "yellow", "failed": "bold red"}.get(stage.status, "cyan")
        text_console().print(f"[{style}]{stage.status:<11}[/] {stage.name:<10} {stage.seconds:6.1f} s  {stage.note}")
    typer.echo(f"wrote {outcome.index} (open it in a browser; the JSON of every stage is beside it)")
    if outcome.interrupted:
        sys.exit(130)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the meshscale app."""
    app.command(short_help="Write a static HTML report from result files")(report)
    app.command(short_help="Compare two runs row by row; exit 1 on a regression")(compare)
    app.command(short_help="Check the driver, links, knobs and health counters")(doctor)
    app.command(short_help="Characterise this machine end to end into a report")(tour)
