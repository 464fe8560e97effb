"""The report's plots as inline SVG strings (matplotlib's object API with the Agg/SVG canvas: no pyplot, no
global backend state, text kept as text so the page stays small and searchable)."""
from __future__ import annotations

import functools
import io
import tempfile
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from meshscale.topology.model import Topology
from meshscale.topology.queries import pair_bandwidth, relation
from meshscale.units import format_bytes, gbps

_RC = {"svg.fonttype": "none", "svg.hashsalt": "meshscale", "font.size": 9, "axes.grid": True, "grid.alpha": 0.3}
STYLES = {"measured": dict(marker="o", linestyle="-"), "predicted": dict(marker="s", linestyle="--"),
          "bound": dict(marker="", linestyle=":", linewidth=2)}


@dataclass
class Series:
    """One line of a plot: x values, y values (bytes/s or samples/s), a label and a style key of STYLES."""

    label: str
    x: list[float]
    y: list[float]
    style: str = "measured"


def to_svg(fig: Figure, plot_id: str) -> str:
    """The figure as an <svg> element (no XML prologue) carrying ``id`` and class ``plot``."""
    buf = io.StringIO()
    with matplotlib.rc_context(_RC):
        fig.savefig(buf, format="svg", bbox_inches="tight")
    text = buf.getvalue()
    svg = text[text.index("<svg"):]
    return svg.replace("<svg", f'<svg id="{plot_id}" class="plot" role="img"', 1)


def _figure(width_in: float = 7.0, height_in: float = 3.6) -> Figure:
    return Figure(figsize=(width_in, height_in))


def _styled(fn):
    """Build the plot under the report's rc settings (fonts, grid), leaving the caller's settings alone."""
    return functools.wraps(fn)(matplotlib.rc_context(_RC)(fn))


@_styled
def topology_plot(topo: Topology, plot_id: str) -> str:
    """The topology diagram from `meshscale.topology.draw` when it exists, else the relation matrix as a
    heatmap of per-pair bandwidth labelled with the nvidia-smi relation (NV2, PIX, SYS...)."""
    try:
        from meshscale.topology.draw import draw
    except ImportError:
        draw = None
    if draw is not None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "topology.svg"
            draw(topo, path)
            text = path.read_text()
        svg = text[text.index("<svg"):]
        return svg.replace("<svg", f'<svg id="{plot_id}" class="plot" role="img"', 1)
    devices = topo.devices()
    n = len(devices)
    matrix = np.zeros((n, n))
    for i, a in enumerate(devices):
        for j, b in enumerate(devices):
            matrix[i, j] = np.nan if a == b else gbps(pair_bandwidth(topo, a, b))
    labels = [f"{'GPU' if topo.device_kind == 'gpu' else 'CPU'}{topo.nodes[d].index}" for d in devices]
    fig = _figure(1.2 + 0.6 * n, 0.9 + 0.55 * n)
    ax = fig.add_subplot()
    image = ax.imshow(matrix, cmap="viridis")
    middle = float(np.nanmedian(matrix)) if n > 1 else 0.0
    for i, a in enumerate(devices):
        for j, b in enumerate(devices):
            text = "X" if a == b else f"{relation(topo, a, b)}\n{matrix[i, j]:.0f}"
            ax.text(j, i, text, ha="center", va="center", fontsize=7,
                    color="black" if a == b or matrix[i, j] >= middle else "white")
    ax.set_xticks(range(n), labels)
    ax.set_yticks(range(n), labels)
    ax.grid(False)
    ax.set_title(f"{topo.name}: relation and line rate, GB/s per direction")
    fig.colorbar(image, ax=ax, label="GB/s")
    return to_svg(fig, plot_id)


@_styled
def heatmap(matrix: np.ndarray, labels: list[str], title: str, unit: str, plot_id: str, fmt: str = "{:.1f}") -> str:
    """A labelled square heatmap (NaN cells blank): the P2P bandwidth or latency matrix."""
    n = len(labels)
    fig = _figure(1.4 + 0.6 * n, 1.0 + 0.55 * n)
    ax = fig.add_subplot()
    image = ax.imshow(matrix, cmap="viridis")
    finite = matrix[np.isfinite(matrix)]
    middle = float(np.median(finite)) if finite.size else 0.0
    for i in range(n):
        for j in range(n):
            if np.isfinite(matrix[i, j]):
                ax.text(j, i, fmt.format(matrix[i, j]), ha="center", va="center", fontsize=7,
                        color="white" if matrix[i, j] < middle else "black")
    ax.set_xticks(range(n), labels)
    ax.set_yticks(range(n), labels)
    ax.set_xlabel("destination")
    ax.set_ylabel("source")
    ax.grid(False)
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label=unit)
    return to_svg(fig, plot_id)


@_styled
def busbw_plot(title: str, series: list[Series], plot_id: str) -> str:
    """Bus bandwidth (GB/s) against message size (log scale), one line per series."""
    fig = _figure()
    ax = fig.add_subplot()
    for s in series:
        ax.plot(s.x, [gbps(v) for v in s.y], label=s.label, **STYLES.get(s.style, {}))
    ax.set_xscale("log", base=2)
    sizes = sorted({x for s in series for x in s.x})
    ticks = sizes[:: max(1, len(sizes) // 8)]
    ax.set_xticks(ticks, [format_bytes(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("message size")
    ax.set_ylabel("bus bandwidth, GB/s")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    return to_svg(fig, plot_id)


@_styled
def scaling_plot(title: str, bars: list[Series], speedups: list[Series], plot_id: str) -> str:
    """Throughput bars per world size (one group per series of ``bars``) and the ``speedups`` lines on a
    second axis against the ideal (speedup = world size)."""
    fig = _figure()
    ax = fig.add_subplot()
    sizes = sorted({x for s in bars for x in s.x})
    width = 0.8 / max(1, len(bars))
    speed = ax.twinx()
    for k, s in enumerate(bars):
        pos = [sizes.index(x) + (k - (len(bars) - 1) / 2) * width for x in s.x]
        hatch = "//" if s.style == "predicted" else None
        ax.bar(pos, s.y, width, label=f"{s.label} (samples/s)", hatch=hatch, alpha=0.8, color=f"C{k}")
    for k, s in enumerate(speedups):
        speed.plot([sizes.index(x) for x in s.x if x in sizes], [y for x, y in zip(s.x, s.y) if x in sizes],
                   color=f"C{k}", marker="o", linestyle="--" if s.style == "predicted" else "-",
                   label=f"{s.label} (speedup)")
    speed.plot(range(len(sizes)), sizes, color="grey", linestyle=":", label="ideal speedup")
    speed.set_ylabel("speedup")
    speed.grid(False)
    ax.set_xticks(range(len(sizes)), [str(x) for x in sizes])
    ax.set_xlabel("ranks")
    ax.set_ylabel("throughput, samples/s")
    ax.set_title(title)
    lines, names = ax.get_legend_handles_labels()
    lines2, names2 = speed.get_legend_handles_labels()
    ax.legend(lines + lines2, names + names2, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2)
    return to_svg(fig, plot_id)


@_styled
def breakdown_plot(title: str, world_sizes: list[int], parts: dict[str, list[float]], plot_id: str) -> str:
    """Stacked bars of the step time split into compute, communication and data loading per world size."""
    fig = _figure(7.0, 3.0)
    ax = fig.add_subplot()
    bottom = np.zeros(len(world_sizes))
    for name, values in parts.items():
        ax.bar([str(w) for w in world_sizes], [v * 1e3 for v in values], bottom=bottom * 1e3, label=name)
        bottom += np.array(values)
    ax.set_xlabel("ranks")
    ax.set_ylabel("time per step, ms")
    ax.set_title(title)
    ax.legend(fontsize=7)
    return to_svg(fig, plot_id)
