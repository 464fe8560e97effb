"""Running a fleet: `meshscale why-hung` (which rank a hung job waits for) and `meshscale bench pairs` (every
worker pair, outliers named)."""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from meshscale.cli.output import text_console


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
        console.print(line)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the meshscale app."""
    app.command("why-hung")(why_hung)
