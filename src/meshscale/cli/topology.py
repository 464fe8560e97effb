"""`meshscale topo` and `meshscale systems`."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from meshscale.cli.checks import checked, output_file
from meshscale.errors import check_choice
from meshscale.topology import dumps, load_catalog, load_system
from meshscale.topology.discover import discover
from meshscale.topology.text import per_gpu_bandwidth, relation_matrix, summary
from meshscale.units import gbps
from meshscale.validation import atomic_write

FORMATS = ("matrix", "json", "svg", "png")


def resolve_system(system: Optional[str], workers: Optional[int] = None):
    """The topology a command works on: ``--system NAME|FILE``, or this machine (with a notice if no GPU)."""
    if system:
        return load_system(system), ""
    found = discover(workers)
    return found.topology, found.notice


def topo(system: Optional[str] = typer.Option(None, "--system", "-s", help="catalog name or system file; default: this machine"),
         fmt: str = typer.Option("matrix", "--format", help="matrix, json, svg or png"),
         output: Optional[Path] = typer.Option(None, "--output", help="file to write (svg/png default: <name>.<format>)", callback=checked(output_file()))) -> None:
    """Show a system's topology: the nvidia-smi style matrix, JSON (loadable again), or a diagram."""
    check_choice(fmt, FORMATS, "format")
    topology, notice = resolve_system(system)
    if notice:
        typer.echo(notice, err=True)
    if fmt == "matrix":
        text = f"{summary(topology)}\n\n{relation_matrix(topology)}"
    elif fmt == "json":
        text = dumps(topology)
    else:
        from meshscale.topology.draw import default_output, draw
        path = output or default_output(topology, fmt)
        draw(topology, path)
        typer.echo(f"wrote {path}")
        return
    if output:
        atomic_write(output, text + "\n")
        typer.echo(f"wrote {output}")
    else:
        typer.echo(text)


def systems() -> None:
    """List the reference systems of the catalog."""
    table = Table(title="meshscale catalog (bandwidth per GPU, per direction)")
    for col in ("name", "GPUs", "GPU model", "NVLink GB/s", "PCIe GB/s", "description"):
        table.add_column(col, justify="right" if "GB/s" in col or col == "GPUs" else "left")
    for t in load_catalog():
        nvlink, pcie = per_gpu_bandwidth(t)
        table.add_row(t.name, str(len(t.gpus())), t.gpu_model, f"{gbps(nvlink):.0f}", f"{gbps(pcie):.1f}", t.title)
    Console(width=160).print(table)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the meshscale app."""
    app.command()(topo)
    app.command()(systems)
