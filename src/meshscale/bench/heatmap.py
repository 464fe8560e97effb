"""Heatmap image of a bench-p2p result: one panel per mode, source on the rows, destination on the columns."""
from __future__ import annotations

from pathlib import Path

from meshscale.results import Result
from meshscale.units import gbps


def plot_p2p(result: Result, path: str | Path) -> Path:
    """Write a PNG (or any format matplotlib knows from the suffix) of every p2p matrix of ``result``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    devices = list(result.meta.get("devices", []))
    modes = list(result.meta.get("modes", []))
    names = devices + (["host"] if any("host" in (r["src"], r["dst"]) for r in result.rows) else [])
    fig, axes = plt.subplots(1, len(modes), figsize=(4.2 * len(modes) + 1, 4), squeeze=False)
    for ax, mode in zip(axes[0], modes):
        latency = mode == "latency"
        grid = np.full((len(names), len(names)), np.nan)
        for r in result.rows:
            if r["mode"] == mode and r["src"] in names and r["dst"] in names:
                value = r["latency_s"] * 1e6 if latency else gbps(r["bandwidth_bytes_per_s"])
                grid[names.index(r["src"]), names.index(r["dst"])] = value
        image = ax.imshow(grid, cmap="viridis_r" if latency else "viridis")
        ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
        ax.set_yticks(range(len(names)), names)
        ax.set_xlabel("destination")
        ax.set_ylabel("source")
        ax.set_title(f"{mode} ({'us' if latency else 'GB/s'})")
        low, high = np.nanmin(grid), np.nanmax(grid)
        for (y, x), value in np.ndenumerate(grid):
            if not np.isnan(value):
                bright = (value - low) / (high - low or 1) > 0.5  # viridis is light at the top end
                ax.text(x, y, f"{value:.1f}" if value < 100 else f"{value:.0f}", ha="center", va="center",
                        color="black" if bright != latency else "white", fontsize=8)
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.suptitle(f"meshscale bench p2p: {result.machine.get('hostname', '')} ({result.meta.get('backend', '')})")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
