"""Printing tables people read, at any terminal width and into a pipe.

The width is the terminal's, or COLUMNS where it is set (piped or not). Figures are right-justified in every
meshscale table, and a figure is never cut: a number cut in two is worse than a wide line. A table wider than
the width is fitted, in this order, until it fits (`fit_table`): a lighter frame; headers on two lines; columns
holding one value in every row said once under the table; label columns left out, the widest first, and named
under the table; columns one space apart instead of three; headers broken after a "/" too. A column that tells the rows apart (the first, and any the table's maker names) is never left
out: it folds instead, so that every row keeps its identity. Into a pipe at a stated COLUMNS the frame is plain
ASCII, so that the width holds in bytes too. Where the figures and the rows' identity alone are wider than the
width, the table prints wide rather than cut a figure or lose a row's name. Into a pipe with no COLUMNS, tables
and text print at their natural width (one line per row, whole for grep).
"""
from __future__ import annotations

import copy
import os
from collections.abc import Collection

from rich import box
from rich.console import Console
from rich.table import Column, Table

from meshscale.units import is_digits


# a rule under the headers and spaces between columns, all ASCII: a stated width is a width in bytes for awk/cut
PLAIN = box.Box("    \n    \n -- \n    \n    \n    \n    \n    \n", ascii=True)


def columns_set() -> bool:
    """True when the user stated a width (COLUMNS), which holds into a pipe too."""
    return is_digits(os.environ.get("COLUMNS", "").strip())


def text_console() -> Console:
    """A console for lines of text: wrapped at word boundaries on a terminal or at a stated COLUMNS, never
    wrapped into a pipe or a log otherwise (a line there stays one line, whole for grep)."""
    console = Console(highlight=False)
    console.soft_wrap = not (console.is_terminal or columns_set())
    return console


def stream_width(err: bool = False) -> int | None:
    """The width lines printed as they come must keep (a terminal's, or a stated COLUMNS), or None (no limit)."""
    console = Console(stderr=err)
    return console.width if console.is_terminal or columns_set() else None


def progress(text: str):
    """A spinner with ``text`` on stderr while work that takes seconds runs (``with progress(...):``), so that a
    terminal does not sit silent. It is erased when the work ends, so an error stays one line; into a pipe or a
    log it prints nothing."""
    from contextlib import nullcontext
    console = Console(stderr=True)
    return console.status(text) if console.is_terminal else nullcontext()


def print_text(text: str) -> None:
    """Print lines of text wrapped at word boundaries where a width holds (a terminal or a stated COLUMNS), each
    continuation indented under its line; a word (a figure, a list with no space) is never cut."""
    import textwrap
    console = text_console()
    if console.soft_wrap:
        print(text)
        return
    for line in text.splitlines() or [""]:
        indent = " " * (len(line) - len(line.lstrip()) + 2)
        print(textwrap.fill(line, console.width, subsequent_indent=indent, break_long_words=False,
                            break_on_hyphens=False, replace_whitespace=False, drop_whitespace=True) if line else "")


def keep_figures_whole(table: Table) -> Table:
    """Right-justified (figure) columns never wrap; labels fold when they must."""
    for column in table.columns:
        if column.justify == "right":
            column.no_wrap = True
        else:
            column.overflow = "fold"
    return table


def _width(table: Table, console: Console, folded: frozenset[str] = frozenset()) -> int:
    """The width ``table`` takes with no label folded (one line per row) but the label columns headed ``folded``,
    which count at their narrowest (their longest word)."""
    wide = console.options.update_width(10_000)
    if folded:
        table = copy.copy(table)
        table.columns = [copy.copy(c) for c in table.columns]
        for column in table.columns:
            if _header(column) in folded and not _is_figure(column):
                narrowest = Table(column.header, box=None, show_header=True, show_edge=False, pad_edge=False)
                for cell in _cells(column):
                    narrowest.add_row(cell)
                column.max_width = console.measure(narrowest, options=wide).minimum
    return console.measure(table, options=wide).maximum


def _cells(column: Column) -> list:
    return list(column._cells)  # rich keeps a column's cells here; Table has no public reader


def _rebuilt(table: Table, columns: list[Column], notes: list[str], **frame) -> Table:
    """A copy of ``table`` with only ``columns``, ``notes`` added to its caption and ``frame`` its new frame."""
    caption = "; ".join(([str(table.caption)] if table.caption else []) + notes) or None
    settings = {"title": table.title, "caption": caption, "box": table.box, "show_edge": table.show_edge,
                "pad_edge": table.pad_edge, "padding": table.padding, "title_style": table.title_style,
                "caption_justify": "left", **frame}
    out = Table(**settings)
    for column in columns:
        out.add_column(column.header, justify=column.justify, style=column.style, no_wrap=column.no_wrap,
                       overflow=column.overflow, header_style=column.header_style)
    for row in zip(*(_cells(c) for c in columns)) if columns else []:
        out.add_row(*row)
    return out


def _is_figure(column: Column) -> bool:
    return column.justify == "right"


def _header(column: Column) -> str:
    return str(column.header).replace("\n", " ")


def _widest_first(columns: list[Column]) -> list[Column]:
    return sorted(columns, key=lambda c: -max((len(str(x)) for x in [c.header, *_cells(c)]), default=0))


def fit_table(table: Table, width: int, console: Console, identity: Collection[str] = ()) -> Table:
    """``table`` fitted to ``width`` columns without cutting a figure (the steps are in the module's docstring),
    each step taken only as far as it must; the table itself when it fits already. The first column and those
    headed ``identity`` tell the rows apart: they are never left out, and fold where they must."""
    plain = not console.is_terminal  # into a pipe at a stated width: the plain frame, fitting or not
    if _width(table, console) <= width and not plain:
        return table
    frame = {"box": PLAIN, "show_edge": False, "pad_edge": False}
    columns, constants, left_out = [copy.copy(c) for c in table.columns], {}, []  # headers change: copies

    def current() -> Table:
        notes = ([f"in every row: {', '.join(f'{h} {v}' for h, v in constants.items())}"] if constants else []) + \
                ([f"left out at {width} columns: {', '.join(left_out)}"] if left_out else [])
        return _rebuilt(table, columns, notes, **frame)

    keep = frozenset([_header(columns[0])] if columns else []) | frozenset(identity)

    def fits() -> bool:
        return _width(current(), console, keep) <= width

    if fits():
        return current()
    for column in columns:  # headers on two lines: "busbw GB/s" over its figures
        if isinstance(column.header, str) and " " in column.header and "\n" not in column.header:
            head, _, tail = column.header.rpartition(" ")
            column.header = f"{head}\n{tail}"
    one_value = [c for c in columns[1:] if table.row_count >= 2 and len({str(x) for x in _cells(c)}) == 1]
    for column in _widest_first(one_value):
        if fits():
            return current()
        constants[_header(column)] = str(_cells(column)[0])
        columns = [c for c in columns if c is not column]
    for column in _widest_first([c for c in columns if not _is_figure(c) and _header(c) not in keep]):
        if fits():
            return current()
        left_out.append(_header(column))
        columns = [c for c in columns if c is not column]
    if fits():
        return current()
    frame["padding"] = (0, 0)  # columns one space apart (the frame's blank separator) instead of three
    if fits():
        return current()
    for column in columns:  # then headers broken after a "/" too: "tokens/" over "s/GPU"
        column.header = _split_header(column)
    return current()


def _split_header(column: Column) -> str:
    """``column``'s header on at most two lines, broken at a space or after a "/" where its wider line is the
    narrowest (never narrower than the column's widest cell, which sets the width anyway)."""
    text = str(column.header).replace("\n", " ")
    cells = max((len(str(c)) for c in _cells(column)), default=0)
    best, width = text, len(text)
    for i, char in enumerate(text):
        if char in " /":
            head, tail = (text[:i], text[i + 1:]) if char == " " else (text[:i + 1], text[i + 1:])
            # a part of one or two characters ("samples/" over "s") reads worse than the width it saves
            if min(len(head), len(tail)) > 2 and max(len(head), len(tail), cells) < max(width, cells):
                best, width = f"{head}\n{tail}", max(len(head), len(tail))
    return best


def table_console(table: Table, console: Console | None = None) -> Console:
    """A console as wide as the terminal, or as wide as ``table`` needs to keep its figures whole: at least its
    narrowest whole-figure width on a terminal or at a stated COLUMNS, its natural width (one line per row) in
    a pipe."""
    console = console or text_console()
    measured = console.measure(keep_figures_whole(table), options=console.options.update_width(10_000))
    needed = measured.minimum if console.is_terminal or columns_set() else measured.maximum
    if needed <= console.width:
        return console
    return Console(width=needed, highlight=False, file=console.file, force_terminal=console.is_terminal,
                   no_color=console.no_color)


def print_tables(*tables: Table, console: Console | None = None, identity: Collection[str] = ()) -> None:
    """Print each table fitted to the width with its figures whole (see `fit_table`, `table_console`); the
    columns headed ``identity`` tell its rows apart, and are never left out."""
    for table in tables:
        console_now = console or text_console()
        if console_now.is_terminal or columns_set():
            table = fit_table(keep_figures_whole(table), console_now.width, console_now, identity)
        table_console(table, console_now).print(table)


def write_result_files(result, json_path=None, csv_path=None, note: str = "") -> None:
    """Save ``result`` as JSON and its rows as CSV where asked, saying where each went."""
    import typer
    if json_path:
        typer.echo(f"wrote {result.save(json_path)}{note}")
    if csv_path:
        typer.echo(f"wrote {result.save_csv(csv_path)}{note}")
