"""Printing tables people read, at any terminal width and into a pipe.

Rich takes the width from the terminal (or COLUMNS). Figures are right-justified in every meshscale table, so
those columns never wrap: a number cut in two is worse than a wide line. Label columns fold instead. Where even
that does not fit, or the output goes to a pipe or a log, the console widens to the table rather than breaking
its figures (a terminal then wraps whole lines, which a reader can still follow).
"""
from __future__ import annotations

from rich.console import Console
from rich.table import Table


def text_console() -> Console:
    """A console for lines of text: wrapped at word boundaries on a terminal, never wrapped into a pipe or a log
    (a line there stays one line, whole for grep)."""
    console = Console(highlight=False)
    console.soft_wrap = not console.is_terminal
    return console


def keep_figures_whole(table: Table) -> Table:
    """Right-justified (figure) columns never wrap; labels fold when they must."""
    for column in table.columns:
        if column.justify == "right":
            column.no_wrap = True
        else:
            column.overflow = "fold"
    return table


def table_console(table: Table, console: Console | None = None) -> Console:
    """A console as wide as the terminal, or as wide as ``table`` needs to keep its figures whole: at least its
    narrowest whole-figure width on a terminal, its natural width (one line per row) in a pipe."""
    console = console or text_console()
    measured = console.measure(keep_figures_whole(table), options=console.options.update_width(10_000))
    needed = measured.minimum if console.is_terminal else measured.maximum
    if needed <= console.width:
        return console
    return Console(width=needed, highlight=False, file=console.file, force_terminal=console.is_terminal,
                   no_color=console.no_color)


def print_tables(*tables: Table, console: Console | None = None) -> None:
    """Print each table with its figures whole (see `table_console`)."""
    for table in tables:
        table_console(table, console).print(table)


def write_result_files(result, json_path=None, csv_path=None, note: str = "") -> None:
    """Save ``result`` as JSON and its rows as CSV where asked, saying where each went."""
    import typer
    if json_path:
        typer.echo(f"wrote {result.save(json_path)}{note}")
    if csv_path:
        typer.echo(f"wrote {result.save_csv(csv_path)}{note}")
