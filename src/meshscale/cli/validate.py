"""`meshscale validate`: the model against a corpus of measurements, every corpus of the one validation framework
(`meshscale.predict.corpus_check`) through one report: the rows farthest from their measurement, the figures per
group, one line per bound, the verdict, and exit code 1 outside the bounds."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.table import Table

from meshscale.cli.checks import checked, output_file
from meshscale.cli.output import print_tables, text_console, write_result_files
from meshscale.errors import MeshscaleError
from meshscale.predict.corpus_check import CORPORA, Corpus, distance
from meshscale.results import Result
from meshscale.units import format_bytes

WORST_ROWS_SHOWN = 10  # rows `validate` lists without --all
OK, OUT = "ok", "[bold red]OUT OF BOUNDS[/]"


@dataclass(frozen=True)
class Column:
    """One column of a corpus's row table: its header, its cell from a row, left-justified or not."""

    header: str
    cell: Callable[[dict[str, Any]], str]
    left: bool = False


def _percent(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _us(seconds: Optional[float]) -> str:
    return "-" if seconds is None else f"{seconds * 1e6:,.1f} us"


def _figure(r: dict[str, Any], key: str) -> str:
    return f"{r[key] * 1e3:,.2f} ms" if r["metric"] == "time s" else f"{r[key]:,.1f}/s"


ROW, ERROR = Column("row", lambda r: str(r["row"])), Column("error", lambda r: _percent(r["error"]) if r.get("ratio")
                                                             else f"[red]{r.get('problem', '')[:60]}[/]")
COLUMNS: dict[str, tuple[Column, ...]] = {
    "collectives": (ROW, Column("system", lambda r: r["system"], True), Column("GPUs", lambda r: str(r["gpus"])),
                    Column("collective", lambda r: r["collective"], True),
                    Column("size", lambda r: format_bytes(r["size_bytes"])),
                    Column("place", lambda r: "in" if r["inplace"] else "out", True),
                    Column("measured", lambda r: _us(r["measured_time_s"]) + (" (busbw)" if r.get("basis") == "busbw"
                                                                              else "")),
                    Column("predicted", lambda r: _us(r["predicted_time_s"])), ERROR,
                    Column("source", lambda r: r.get("source", "")[-48:], True)),
    "training": (ROW, Column("GPU", lambda r: r["gpu"], True), Column("GPUs", lambda r: str(r["world_size"])),
                 Column("model", lambda r: r["model"], True), Column("layout", lambda r: r["layout"], True),
                 Column("seq", lambda r: str(r["seq_len"] or "-")),
                 Column("ckpt", lambda r: r["activation_checkpointing"], True),
                 Column("measured", lambda r: f"{r['measured']:,.0f} " + ("tok/s/GPU" if r["metric"] ==
                                                                         "tokens_per_s_per_gpu" else "samples/s")),
                 Column("predicted", lambda r: f"{r['predicted']:,.0f}"), ERROR,
                 Column("source", lambda r: r["source"][:60], True)),
    "emulated": (ROW, Column("family", lambda r: r["family"], True), Column("what", lambda r: r["what"], True),
                 Column("measured", lambda r: _figure(r, "measured")),
                 Column("predicted", lambda r: _figure(r, "predicted")), ERROR,
                 Column("note", lambda r: r["note"][:60], True)),
    "choices": (ROW, Column("collective", lambda r: r["collective"], True),
                Column("size", lambda r: format_bytes(r["size_bytes"])),
                Column("NCCL", lambda r: f"{r['logged_algo']}/{r['logged_proto']}", True),
                Column("model", lambda r: f"{r['predicted_algo']}/{r['predicted_proto']}", True),
                Column("channels (NCCL / model)", lambda r: f"{r['logged_channels']} / {r['predicted_channels']}")),
}
GROUP_NAMES = {"size_class": "size class", "family": "family", "collective": "collective", "system": "system",
               "publication": "publication"}


def _run(corpus: Corpus, path: Optional[Path], system: Optional[str], collective: Optional[str], algo: str) -> Result:
    """The corpus's validation (each validator imported when asked for: the collectives' alone loads no torch)."""
    if corpus.name == "collectives":
        from meshscale.predict.validate import validate_corpus
        return validate_corpus(path, system, collective, algo)
    if corpus.name == "training":
        from meshscale.predict.training.validate import validate_training
        return validate_training(path)
    if corpus.name == "emulated":
        from meshscale.predict.validate_emulated import validate_emulated
        return validate_emulated(path)
    from meshscale.predict.validate_choices import validate_choices
    return validate_choices(path)


def _table(title: str, columns: tuple[Column, ...]) -> Table:
    table = Table(title=title)
    for c in columns:
        table.add_column(c.header, justify="left" if c.left else "right")
    return table


def _rows_table(corpus: Corpus, result: Result, show_all: bool) -> Table | None:
    """Every row in order, or the WORST_ROWS_SHOWN farthest from their measurement (a right choice is not listed)."""
    summary, where = result.meta["summary"], Path(result.meta["corpus"])
    rows = result.rows if show_all else sorted((r for r in result.rows if distance(r) > 0),
                                               key=lambda r: -distance(r))[:WORST_ROWS_SHOWN]
    if not rows:
        return None
    shown = f"every {corpus.noun}" if show_all else f"{len(rows)} worst {corpus.noun}s"
    model = f", model {result.meta['algorithm']}" if result.meta.get("algorithm") else ""
    table = _table(f"{shown} of {summary['rows']} ({where.parent.name}/{where.name}{model}) - PREDICTED vs measured",
                   COLUMNS[corpus.name])
    for r in rows:
        table.add_row(*(c.cell(r) for c in COLUMNS[corpus.name]))
    return table


def _figures_cells(f: dict[str, Any], corpus: Corpus) -> list[tuple[Column, str]]:
    """The cells a group's (or a breakdown entry's) figures fill, with their columns."""
    cells = [(Column(f"{corpus.noun}s", str), str(f["rows"]))]
    if "same" in f:
        cells.append((Column("as measured", str), f"{f['same']} of {f['rows']}"))
    if f.get("geomean_abs_error") is not None:
        cells += [(Column("geomean |error|", str), f"{f['geomean_abs_error']:.1%}"),
                  (Column("mean error", str), _percent(f["mean_error"])),
                  (Column("worst (times off)", str), f"{f['worst_times_off']:.2f}x (row {f['worst_row']})")]
    if "within_target" in f:
        cells.append((Column(f"within {corpus.target:.0%}", str), f"{f['within_target']} of {f['rows']}"))
    cells += [(Column(f"largest {k.replace('_', ' ')}", str), str(f[f"max_{k}"])) for k in corpus.largest]
    return cells


def _groups_tables(corpus: Corpus, summary: dict[str, Any]) -> list[Table]:
    tables = []
    for title, keys, entries in ((f"per {GROUP_NAMES[corpus.group_by]}", (corpus.group_by,),
                                  [{corpus.group_by: name, **g} for name, g in summary["groups"].items()]),
                                 (f"per {' and '.join(GROUP_NAMES[k] for k in corpus.breakdown)}", corpus.breakdown,
                                  summary["breakdown"])):
        entries = [e for e in entries if e["rows"]]
        if not entries:
            continue
        first = _figures_cells(entries[0], corpus)
        table = _table(title, tuple(Column(GROUP_NAMES[k], str, True) for k in keys) + tuple(c for c, _ in first))
        for e in entries:
            table.add_row(*(str(e[k]) for k in keys), *(cell for _, cell in _figures_cells(e, corpus)))
        tables.append(table)
    return tables


def _memory_table(result: Result) -> Table | None:
    """The runs that state the memory they used: the figure, what it counts, the estimate's same figure, the
    error; then each publication's geomean (reported, not bounded)."""
    rows = [r for r in result.rows if r.get("memory_ratio")]
    if not rows:
        return None
    table = _table("memory the runs state - PREDICTED vs published (GiB)",
                   (ROW, Column("counts", str, True), Column("published", str), Column("predicted", str),
                    Column("error", str), Column("publication", str, True)))
    for r in rows:
        table.add_row(str(r["row"]), r["memory_counts"], f"{r['memory_published_gib']:.2f}",
                      f"{r['memory_predicted_gib']:.2f}", _percent(r["memory_error"]), r["publication"][:70])
    return table


def _memory_lines(width: int, memory: dict[str, Any]) -> list[str]:
    """The memory figure against the runs that state one, per publication and weighted (reported)."""
    found = memory.get("published")
    if not found:
        return []
    each = "; ".join(f"{name}: {g['geomean_abs_error']:.1%} over {g['rows']}"
                     for name, g in found.get("groups", {}).items())
    weighted = (f", publications weighted {found['weighted_geomean_abs_error']:.1%}"
                if found.get("weighted_geomean_abs_error") is not None else "")
    return [f"{'memory figure':>{width}}: geomean |error| {found['geomean_abs_error']:.1%} over {found['rows']} runs "
            f"that state it, mean {_percent(found['mean_error'])}{weighted} (reported)",
            *([f"{'':>{width}}  {each}"] if each else [])]


def _bound_lines(corpus: Corpus, summary: dict[str, Any]) -> list[str]:
    """One line per bound the corpus is held to: the figure, the bound, ok or out."""
    bounds, noun = summary["bounds"], corpus.noun
    width = max([13, *(len(name) for name, g in summary["groups"].items() if g["bound"] is not None)])
    lines = []
    for name, g in summary["groups"].items():
        if g["bound"] is not None:
            figure = ("no rows predicted" if g.get("geomean_abs_error") is None
                      else f"geomean |error| {g['geomean_abs_error']:.1%} over {g['rows']} {noun}s")
            lines.append(f"{name:>{width}}: {figure} (bound {g['bound']:.0%}) {OK if g['passed'] else OUT}")
    if bounds["geomean_abs_error"] is not None and summary.get("weighted_by"):
        g, bound = summary["weighted_geomean_abs_error"], bounds["geomean_abs_error"]
        lines.append(f"{'all ' + noun + 's':>{width}}: geomean |error| {summary['geomean_abs_error']:.1%} over "
                     f"{summary['rows']} {noun}s (reported)")
        lines.append(f"{summary['weighted_by'] + 's':>{width}}: geomean over {summary['weighted_groups']} "
                     f"{summary['weighted_by']}s of each one's geomean |error|: {g:.1%} (bound {bound:.0%}) "
                     f"{OK if g <= bound else OUT}")
    elif bounds["geomean_abs_error"] is not None:
        g = summary["geomean_abs_error"]
        lines.append(f"{'all ' + noun + 's':>{width}}: geomean |error| {g:.1%} over {summary['rows']} {noun}s (bound "
                     f"{bounds['geomean_abs_error']:.0%}) {OK if g <= bounds['geomean_abs_error'] else OUT}")
    if bounds["worst_times_off"] is not None and summary.get("worst_times_off") is not None:
        off = summary["worst_times_off"]
        lines.append(f"{'worst ' + noun:>{width}}: {noun} {summary['worst_row']}, {off:.2f}x off (bound "
                     f"{bounds['worst_times_off']:g}x) {OK if off <= bounds['worst_times_off'] else OUT}")
    if bounds["agreement"]:
        lines.append(f"{summary['same']} of {summary['rows']} {noun}s as measured (bound: every {noun}) "
                     f"{OK if summary['same'] == summary['rows'] else OUT}")
    memory = summary.get("memory") or {}
    if bounds.get("fits") and memory.get("rows"):
        fit = memory["yes"] + memory["tight"]
        missed = f"; says no for {noun}s {', '.join(map(str, memory['no_rows']))}" if memory["no"] else ""
        lines.append(f"{'memory':>{width}}: fits for {fit} of {memory['rows']} {noun}s that ran (yes "
                     f"{memory['yes']}, tight {memory['tight']}{missed}; bound: every {noun}) "
                     f"{OK if not memory['no'] else OUT}")
    return lines + _memory_lines(width, memory)


def report(corpus: Corpus, result: Result, show_all: bool, json_out: Optional[Path], csv_path: Optional[Path]) -> None:
    """The one report of a validation; exit code 1 outside the bounds."""
    summary = result.meta["summary"]
    console = text_console()
    table = _rows_table(corpus, result, show_all)
    memory = _memory_table(result)
    print_tables(*([table] if table else []), *_groups_tables(corpus, summary), *([memory] if memory else []),
                 console=console)
    for line in _bound_lines(corpus, summary):
        console.print(line)
    if summary["unpredicted"]:
        first = next(r for r in result.rows if "ratio" in r and not r["ratio"])
        console.print(f"[bold red]{summary['unpredicted']} {corpus.noun}(s) not predicted[/], e.g. {corpus.noun} "
                      f"{first['row']}: {first['problem']}")
    if corpus.note:
        console.print(f"({corpus.note})")
    if summary.get("geomean_abs_error") is not None:
        console.print(f"({summary['error_definition']})")
    console.print("within bounds" if summary["passed"] else "[bold red]outside the bounds[/]")
    write_result_files(result, json_out, csv_path)
    if not summary["passed"]:
        sys.exit(1)  # typer.Exit would be swallowed by main()'s standalone_mode=False


def validate(system: Optional[str] = typer.Option(None, "--system", "-s", help="only the rows of this system"),
             collective: Optional[str] = typer.Option(None, "--collective", help="only the rows of this collective"),
             corpus: Optional[Path] = typer.Option(None, "--corpus", help="a corpus CSV (default: the one meshscale ships)"),
             algo: str = typer.Option("nccl", "--algo", help="the model: nccl (NCCL's cost model) or a meshscale algorithm / auto"),
             show_all: bool = typer.Option(False, "--all", help=f"list every row, not only the {WORST_ROWS_SHOWN} worst"),
             json_out: Optional[Path] = typer.Option(None, "--json", help="save a Result (kind validate)", callback=checked(output_file())),
             csv_path: Optional[Path] = typer.Option(None, "--csv", help="write the rows as CSV here", callback=checked(output_file())),
             training: bool = typer.Option(False, "--training", help="the training corpus: published training runs "
                                           "predicted by the step model (--corpus: a training YAML)"),
             emulated: bool = typer.Option(False, "--emulated", help="the emulated two-node corpus: runs and all_reduce "
                                           "sweeps of two agents over sockets, each predicted from the sweep and profile "
                                           "measured beside it (--corpus: its corpus.yaml)"),
             choices: bool = typer.Option(False, "--choices", help="NCCL's logged choice of algorithm, protocol and "
                                          "channels per call beside the model's (--corpus: a directory of logs)")) -> None:
    """Predict every measurement of the corpus and print the errors; exit code 1 when outside the bounds."""
    chosen = corpus_of({"--training": training, "--emulated": emulated, "--choices": choices})
    if chosen.flag and (system or collective or algo != "nccl"):
        raise MeshscaleError(f"{chosen.flag} validates its own corpus; --system, --collective and --algo are for the "
                             f"collectives corpus, and {', '.join(c.flag for c in CORPORA.values() if c.flag)} go "
                             "one at a time")
    report(chosen, _run(chosen, corpus, system, collective, algo), show_all, json_out, csv_path)


def corpus_of(flags: dict[str, bool]) -> Corpus:
    """The corpus the `validate` flags given pick: the one flagged, the collectives when none is."""
    given = [flag for flag, on in flags.items() if on]
    if len(given) > 1:
        raise MeshscaleError(f"{given[0]} validates its own corpus; {', '.join(flags)} go one at a time")
    by_flag = {c.flag: c for c in CORPORA.values()}
    return by_flag[given[0] if given else ""]


def register(app: typer.Typer) -> None:
    """Add this module's commands to the meshscale app."""
    app.command(short_help="Predict the corpus's measurements and print the errors")(validate)
