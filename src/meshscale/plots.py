"""Every chart meshscale draws, drawn once: scaling bars with speedup lines, heatmaps, bus bandwidth against
message size, step-time breakdowns.

matplotlib's object API on the Agg canvas: no pyplot, no global backend state. Each chart function returns a
`Figure`; `to_svg` turns it into an inline <svg> element (the report), `save` writes PNG, SVG or PDF by the
path's suffix (``--plot``). One look everywhere: the rc settings below apply while a figure is built and saved.
"""
from __future__ import annotations

import functools
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, LogFormatter, NullLocator

from meshscale.errors import MeshscaleError
from meshscale.results import Result
from meshscale.safe_io import atomic_write
from meshscale.units import format_bytes, format_count, gbps

# text kept as text in SVG (small, searchable pages); a fixed hash salt so the same figure gives the same bytes
# and no mathtext: names and labels come from files and options, where a "$" is a dollar sign, not TeX
RC = {"svg.fonttype": "none", "svg.hashsalt": "meshscale", "font.size": 9, "axes.grid": True, "grid.alpha": 0.3,
      "text.parse_math": False}
STYLES = {"measured": dict(marker="o", linestyle="-"), "predicted": dict(marker="s", linestyle="--"),
          "bound": dict(marker="", linestyle=":", linewidth=2)}
SUFFIXES = (".png", ".svg", ".pdf")
MAX_LEGEND_ENTRIES = 6  # more than this is unreadable at a glance: split the chart instead


@dataclass
class Series:
    """One line or bar group of a chart: x values, y values (bytes/s or samples/s), a label and a style key of
    STYLES."""

    label: str
    x: list[float]
    y: list[float]
    style: str = "measured"


@dataclass
class Grid:
    """One heatmap panel: a square matrix (NaN cells blank), source on the rows and destination on the columns.
    ``low_is_good`` (latency) reverses the colours so that the good end is bright in every panel. The colour
    scale runs from zero to ``bound`` (or the largest value), so that near-equal values look near-equal."""

    title: str
    matrix: np.ndarray
    labels: list[str]
    unit: str
    fmt: str = "{:.1f}"
    low_is_good: bool = False
    bound: float | None = None  # the colour scale's top (a line rate); None: the largest value


class PlainLogFormatter(LogFormatter):
    """matplotlib's choice of which log ticks to label (decades; some minor ticks when the axis spans little
    more than one), each label plain text from ``label``."""

    def __init__(self, label: Callable[[float], str], base: float, minor: bool):
        super().__init__(base=base, labelOnlyBase=not minor)
        self.label = label

    def __call__(self, x: float, pos: int | None = None) -> str:
        return self.label(x) if super().__call__(x, pos) else ""


def log_axis(ax: Axes, which: str, label: Callable[[float], str] = format_count, base: float = 10,
             ticks: list[float] | None = None) -> None:
    """Make ``ax``'s ``which`` ("x" or "y") axis logarithmic with plain-text tick labels (``label``: 10, 100, 1K;
    `format_bytes` for sizes), at ``ticks`` alone where given. matplotlib's own log labels are mathtext
    ($\\mathdefault{10^{1}}$), which RC's text.parse_math=False would print literally: every log axis goes
    through here."""
    getattr(ax, f"set_{which}scale")("log", base=base)
    axis = ax.xaxis if which == "x" else ax.yaxis
    if ticks is not None:
        axis.set_major_locator(FixedLocator(ticks))
        axis.set_minor_locator(NullLocator())
    axis.set_major_formatter(PlainLogFormatter(label, base, minor=False))
    axis.set_minor_formatter(PlainLogFormatter(label, base, minor=True))


def styled(fn):
    """Build a figure under meshscale's rc settings, leaving the caller's settings alone."""
    return functools.wraps(fn)(matplotlib.rc_context(RC)(fn))


def legend_entries(fig: Figure) -> int:
    """How many entries the figure's legends hold, all axes together."""
    return sum(len(ax.get_legend().get_texts()) for ax in fig.axes if ax.get_legend() is not None)


def pack(groups: list[list[Any]], room: int = MAX_LEGEND_ENTRIES) -> list[list[Any]]:
    """Consecutive ``groups`` (series that belong together, e.g. one system's bars and speedup line) packed
    into as few charts as keep each legend within ``room`` entries; a group is never torn apart."""
    charts: list[list[Any]] = [[]]
    for group in groups:
        if charts[-1] and len(charts[-1]) + len(group) > room:
            charts.append([])
        charts[-1].extend(group)
    return charts


def to_svg(fig: Figure, plot_id: str) -> str:
    """The figure as an <svg> element (no XML prologue) carrying ``id``, class ``plot`` and the number of legend
    entries as ``data-legend-entries``."""
    buf = io.StringIO()
    with matplotlib.rc_context(RC):
        fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    svg = text[text.index("<svg"):]
    return svg.replace("<svg", f'<svg id="{plot_id}" class="plot" role="img" '
                              f'data-legend-entries="{legend_entries(fig)}"', 1)


def save(fig: Figure, path: str | Path, suffixes: tuple[str, ...] = SUFFIXES, dpi: int = 120) -> Path:
    """Write the figure to ``path`` in the format its suffix names, whole or not at all (`atomic_write`); a
    one-line error for another suffix or an unwritable place."""
    path = Path(path)
    if path.suffix.lower() not in suffixes:
        raise MeshscaleError(f"cannot write {path}: use a {' or '.join(suffixes)} file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MeshscaleError(f"cannot write {path} ({exc.strerror}); choose a writable path") from None

    def write(tmp: Path) -> None:
        with matplotlib.rc_context(RC):
            fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format=path.suffix.lower()[1:])

    return atomic_write(path, write)


# ---- scaling: throughput bars, speedup lines (the DGX-1 whitepaper's figures 5 and 6) ----------------------
@styled
def scaling_chart(title: str, bars: list[Series], speedups: list[Series], x_label: str = "ranks",
                  y_label: str = "throughput, samples/s", ideal: str | None = "ideal speedup") -> Figure:
    """Throughput bars per world size (one group per series of ``bars``) and the ``speedups`` lines on a second
    axis, against the ideal speedup (= world size) labelled ``ideal`` unless that is None."""
    sizes = sorted({x for s in bars for x in s.x})
    fig = Figure(figsize=(max(7.0, len(sizes) * 0.9 + 2), 3.6))
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(bars))
    speed = ax.twinx()
    for k, s in enumerate(bars):
        pos = [sizes.index(x) + (k - (len(bars) - 1) / 2) * width for x in s.x]
        hatch = "//" if s.style == "predicted" else None
        ax.bar(pos, s.y, width, label=s.label, hatch=hatch, alpha=0.8, color=f"C{k}")
    for k, s in enumerate(speedups):
        speed.plot([sizes.index(x) for x in s.x if x in sizes], [y for x, y in zip(s.x, s.y) if x in sizes],
                   color=f"C{k}", marker="o", linestyle="--" if s.style == "predicted" else "-", label=s.label)
    if ideal:
        speed.plot(range(len(sizes)), sizes, color="grey", linestyle=":", label=ideal)
    speed.set_ylim(bottom=0)
    speed.set_ylabel("speedup")
    speed.grid(False)
    ax.set_xticks(range(len(sizes)), [str(x) for x in sizes])
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.set_title(title)
    lines, names = ax.get_legend_handles_labels()
    lines2, names2 = speed.get_legend_handles_labels()
    ax.legend(lines + lines2, names + names2, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2)
    return fig


def rows_scaling_chart(rows: list[dict[str, Any]], title: str, x_label: str = "GPUs", predicted: bool = False) -> Figure:
    """`scaling_chart` of scale / predict rows (world_size, throughput_samples_per_s, speedup), one bar group
    and one speedup line per ``variant`` when the rows name one. A prediction says so in its title and axis."""
    style = "predicted" if predicted else "measured"
    bars, speedups = [], []
    for variant in dict.fromkeys(r.get("variant", "") for r in rows):
        part = sorted((r for r in rows if r.get("variant", "") == variant), key=lambda r: r["world_size"])
        x = [r["world_size"] for r in part]
        bars.append(Series(f"{variant} throughput".strip(), x, [r["throughput_samples_per_s"] for r in part], style))
        speedups.append(Series(f"{variant} speedup".strip(), x, [r["speedup"] for r in part], style))
    if predicted:
        return scaling_chart(f"{title} (PREDICTED)", bars, speedups, x_label, "samples/s (predicted)", None)
    return scaling_chart(title, bars, speedups, x_label, "samples/s", "ideal")


def scale_result_chart(result: Result) -> Figure:
    """The chart of a `meshscale scale` result, titled with its model, exchange mode and batch: the measured
    throughput and speedup, and beside them the PREDICTED ones where the rows carry the prediction
    (``predicted_samples_per_s``, as `scale` prints it in its PREDICTED/s column)."""
    m = result.meta
    batch = f"{m.get('batch')} per worker" if m.get("scaling") == "weak" else f"global batch {m.get('batch')}"
    title = f"{m.get('model')} {m.get('mode')}: {m.get('scaling')} scaling, {batch}"
    x_label = "GPUs" if m.get("device") == "cuda" else "workers"
    rows = sorted((r for r in result.rows if r.get("throughput_samples_per_s")), key=lambda r: r["world_size"])
    predicted = [r for r in rows if r.get("predicted_samples_per_s")]
    if not predicted:
        return rows_scaling_chart(result.rows, title, x_label)
    x, base = [r["world_size"] for r in rows], rows[0]
    bars = [Series("throughput", x, [r["throughput_samples_per_s"] for r in rows], "measured"),
            Series("PREDICTED throughput", [r["world_size"] for r in predicted],
                   [r["predicted_samples_per_s"] for r in predicted], "predicted")]
    first = predicted[0]
    lines = [Series("speedup", x, [r["throughput_samples_per_s"] / base["throughput_samples_per_s"] * base["world_size"]
                                   for r in rows], "measured"),
             Series("PREDICTED speedup", [r["world_size"] for r in predicted],
                    [r["predicted_samples_per_s"] / first["predicted_samples_per_s"] * first["world_size"]
                     for r in predicted], "predicted")]
    return scaling_chart(title, bars, lines, x_label, "samples/s", "ideal")


# ---- heatmaps ------------------------------------------------------------------------------------------
@styled
def heatmaps(grids: list[Grid], title: str = "") -> Figure:
    """The grids side by side, each with its colour bar and every value written in its cell."""
    n = max(len(g.labels) for g in grids)
    fig = Figure(figsize=((1.6 + 0.6 * n) * len(grids), 1.2 + 0.55 * n), layout="constrained")
    for k, grid in enumerate(grids):
        _heatmap(fig, fig.add_subplot(1, len(grids), k + 1), grid)
    if title:
        fig.suptitle(title)
    return fig


def _heatmap(fig: Figure, ax: Any, grid: Grid) -> None:
    m = grid.matrix
    low, high = colour_limits(grid)
    image = ax.imshow(m, cmap="viridis_r" if grid.low_is_good else "viridis", vmin=low, vmax=high)
    for (i, j), value in np.ndenumerate(m):
        if np.isfinite(value):
            bright = ((value - low) / (high - low or 1) > 0.5) != grid.low_is_good  # viridis is light at the top
            ax.text(j, i, grid.fmt.format(value), ha="center", va="center", fontsize=7,
                    color="black" if bright else "white")
    ax.set_xticks(range(len(grid.labels)), grid.labels, rotation=45 if len(grid.labels) > 8 else 0)
    ax.set_yticks(range(len(grid.labels)), grid.labels)
    ax.set_xlabel("destination")
    ax.set_ylabel("source")
    ax.grid(False)
    ax.set_title(grid.title)
    fig.colorbar(image, ax=ax, label=grid.unit, shrink=0.8)


def colour_limits(grid: Grid) -> tuple[float, float]:
    """The colour scale of a grid: zero to its bound, or to its largest value (never the data's own minimum,
    which would stretch 27.59-27.62 GB/s over the whole palette)."""
    finite = grid.matrix[np.isfinite(grid.matrix)]
    top = max([float(finite.max())] if finite.size else [0.0])
    return 0.0, max(top, grid.bound or 0.0) or 1.0


def p2p_grids(rows: list[dict[str, Any]], mode: str, ends: list[Any], labels: list[str]) -> list[Grid]:
    """The bandwidth (GB/s) and latency (us) grids of one `bench p2p` mode over ``ends`` (the rows' src/dst
    values, shown as ``labels``); only the grids that have a value."""
    bandwidth = np.full((len(ends), len(ends)), np.nan)
    latency = np.full_like(bandwidth, np.nan)
    for r in rows:
        if r.get("mode", "copy") == mode and r["src"] in ends and r["dst"] in ends:
            i, j = ends.index(r["src"]), ends.index(r["dst"])
            bandwidth[i, j] = gbps(r.get("bandwidth_bytes_per_s") or np.nan)
            latency[i, j] = (r.get("latency_s") or np.nan) * 1e6
    grids = [Grid(f"P2P {mode}: GB/s", bandwidth, labels, "GB/s"),
             Grid("P2P latency, us" if mode == "latency" else f"P2P {mode}: latency, us", latency, labels, "us", "{:.0f}", low_is_good=True)]
    return [g for g in grids if np.isfinite(g.matrix).any()]


def p2p_chart(result: Result) -> Figure:
    """Every grid of a `bench p2p` result in one figure, a panel per mode and measure."""
    ends = sorted({r["src"] for r in result.rows} | {r["dst"] for r in result.rows}, key=lambda x: (str(type(x)), x))
    modes = dict.fromkeys(r.get("mode", "copy") for r in result.rows)
    grids = [g for mode in modes for g in p2p_grids(result.rows, mode, ends, [str(e) for e in ends])]
    if not grids:
        raise MeshscaleError("the p2p result has no bandwidth or latency to draw")
    return heatmaps(grids, f"meshscale bench p2p: {result.machine.get('hostname', '')} "
                           f"({result.meta.get('backend', '')})")


# ---- collectives and step time -------------------------------------------------------------------------
@styled
def busbw_chart(title: str, series: list[Series]) -> Figure:
    """Bus bandwidth (GB/s) against message size, one line per series; both axes logarithmic, since sizes and
    bandwidths span decades (a linear axis lays everything below 1 MiB flat on zero)."""
    fig = Figure(figsize=(7.0, 3.6))
    ax = fig.add_subplot()
    for s in series:
        ax.plot(s.x, [gbps(v) for v in s.y], label=s.label, **STYLES.get(s.style, {}))
    sizes = sorted({x for s in series for x in s.x})
    log_axis(ax, "x", format_bytes, base=2, ticks=sizes[:: max(1, len(sizes) // 8)])
    if any(gbps(v) > 0 for s in series for v in s.y):
        log_axis(ax, "y")
    ax.set_xlabel("message size")
    ax.set_ylabel("bus bandwidth, GB/s")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    return fig


@styled
def loss_chart(title: str, series: list[Series]) -> Figure:
    """Training loss against step, one line per run (linear axes: a loss curve is read for its shape)."""
    fig = Figure(figsize=(7.0, 3.0))
    ax = fig.add_subplot()
    for s in series:
        ax.plot(s.x, s.y, label=s.label, **{**STYLES.get(s.style, {}), "marker": ""})
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(title)
    if len(series) > 1:
        ax.legend(fontsize=7)
    return fig


@styled
def breakdown_chart(title: str, world_sizes: list[int], parts: dict[str, list[float]]) -> Figure:
    """Stacked bars of the step time (seconds) split into compute, communication and data loading per world
    size."""
    fig = Figure(figsize=(7.0, 3.0))
    ax = fig.add_subplot()
    bottom = np.zeros(len(world_sizes))
    for name, values in parts.items():
        ax.bar([str(w) for w in world_sizes], [v * 1e3 for v in values], bottom=bottom * 1e3, label=name)
        bottom += np.array(values)
    ax.set_xlabel("ranks")
    ax.set_ylabel("time per step, ms")
    ax.set_title(title)
    ax.legend(fontsize=7)
    return fig
