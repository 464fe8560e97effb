"""Running a fleet: `meshscale why-hung` (which rank a hung job waits for) and `meshscale bench pairs` (every
worker pair, outliers named)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from meshscale.cli.checks import COUNT, COUNT_OR_ZERO, CPU_COUNT, GPU_COUNT, TIMEOUT_S, checked, output_file, size_bytes
from meshscale.cli.output import print_tables, text_console, write_result_files
from meshscale.units import format_bytes, gbps


def why_hung(directory: Path = typer.Argument(..., help="directory of Flight Recorder dumps, one file per rank "
                                              "(TORCH_FR_DUMP_TEMP_FILE=DIR/nccl_trace_rank_)"),
             nccl_log: Optional[List[Path]] = typer.Option(None, "--nccl-log", help="NCCL_DEBUG=INFO output to read "
                                                           "too (default: DIR's *.log and *.txt files)")) -> None:
    """Say which collective each rank of a hung job is in, which ranks never entered it, and the last one each
    completed, from PyTorch Flight Recorder dumps (and NCCL_DEBUG=INFO logs)."""
    from meshscale.report.why_hung import why_hung as explain
    report = explain(directory, nccl_log or [])
    console = text_console()
    for line in report.lines():
        console.print(line, markup=False)  # text from the dumps: a [tag] in an op name is text, not markup


def pairs(
    size: Optional[str] = typer.Option(None, "--size", help="bytes per message (default 64M on GPUs, 4M on CPU workers)", callback=checked(size_bytes)),
    iters: int = typer.Option(10, "--iters", "-n", callback=checked(COUNT)),
    warmup_iters: int = typer.Option(2, "--warmup-iters", "-w", callback=checked(COUNT_OR_ZERO)),
    bisect: bool = typer.Option(False, "--bisect", help="also halve the group while one half is slow, to find a bad worker"),
    gpus: Optional[int] = typer.Option(None, "--gpus", "-g", help="GPU count: ranks over NCCL (default: all GPUs)", callback=checked(GPU_COUNT)),
    cpus: Optional[int] = typer.Option(None, "--cpus", help="CPU worker ranks over Gloo (default when no GPU)", callback=checked(CPU_COUNT)),
    timeout_s: float = typer.Option(120.0, "--timeout-s", help="per-operation timeout; a stuck or dead rank ends the run", callback=checked(TIMEOUT_S)),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the result (meshscale JSON) here", callback=checked(output_file())),
) -> None:
    """Every pair of workers (GPUs, nodes under torchrun) measured once in O(N) rounds: p2p and a 2-rank
    all_reduce beside the model's figure, the slow workers and pairs named."""
    from meshscale.bench.pairs import PairsSpec, bench_pairs
    from meshscale.execute.world import resolve_world
    from meshscale.units import parse_bytes

    world = resolve_world(gpus, cpus)
    rank0 = int(os.environ.get("RANK", "0")) == 0
    if world.notice and rank0:
        typer.echo(world.notice, err=True)
    spec = PairsSpec(size_bytes=parse_bytes(size or ("64M" if world.backend == "nccl" else "4M")), iters=iters,
                     warmup_iters=warmup_iters, bisect=bisect)
    result = bench_pairs(spec, world, timeout_s)
    if not rank0:
        return
    print_tables(pairs_table(result))
    console = text_console()
    for line in pairs_lines(result):
        console.print(line)
    write_result_files(result, json_path)


def pairs_table(result) -> Table:
    table = Table(title=f"every pair of {result.meta['world_size']} workers, {format_bytes(result.meta['spec']['size_bytes'])} "
                        "messages (median iteration, slower rank of the pair)")
    for col in ("pair", "round", "p2p GB/s", "all_reduce busbw GB/s", "model GB/s", "p2p/model"):
        table.add_column(col, justify="left" if col == "pair" else "right")
    for r in result.rows:
        expected = r.get("expected_bytes_per_s")
        table.add_row(f"{r['a']}-{r['b']}", str(r["round"]), f"{gbps(r['p2p_bytes_per_s']):.3g}",
                      f"{gbps(r['all_reduce_busbw_bytes_per_s']):.3g}", f"{gbps(expected):.1f}" if expected else "-",
                      f"{r['p2p_bytes_per_s'] / expected:.0%}" if expected else "-")
    return table


def pairs_lines(result) -> list[str]:
    """The outliers (or that there are none), the bisection's steps, and what the model's figure means here."""
    meta = result.meta
    out = [f"slow worker: {w}" for w in meta["outlier_workers"]] + [f"slow pair: {p}" for p in meta["outlier_pairs"]]
    if not out:
        out.append("no worker or pair below half of the others' median")
    for step in meta.get("bisect") or []:
        figures = ", ".join(f"{g}: {gbps(v):.2f} GB/s" for g, v in zip(step["groups"], step.get("busbw_bytes_per_s", [])))
        out.append(f"bisect {step['suspects']}: {figures or 'not measured'} -> {step['verdict']}")
    if meta["backend"] == "gloo":
        out.append("model figure for CPU workers: an assumed shared-memory rate; the fleet statistic judges them")
    return out


def register(app: typer.Typer) -> None:
    """Add this module's commands to the meshscale app (`bench pairs` joins the bench sub-app)."""
    from meshscale.cli.bench import bench_app
    app.command("why-hung", short_help="Say where a hung job's ranks stopped (Flight Recorder)")(why_hung)
    bench_app.command("pairs", short_help="Measure every pair of workers; slow ones named")(pairs)
