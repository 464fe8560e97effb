"""The scaling figure in the style of the DGX-1 whitepaper's figures 5 and 6: bars = throughput per world size,
line = speedup, dashed = ideal (linear) speedup."""
from __future__ import annotations

from pathlib import Path

from meshscale.results import Result


def plot_scaling(result: Result, path: str | Path) -> Path:
    """Write the figure of a "scale" result to ``path`` (png, svg or pdf by suffix)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result.rows
    worlds = [r["world_size"] for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(x, [r["throughput_samples_per_s"] for r in rows], color="#76b900", label="throughput")
    ax.set_xticks(list(x), [str(w) for w in worlds])
    ax.set_xlabel("GPUs" if result.meta.get("device") == "cuda" else "workers")
    ax.set_ylabel("samples/s")
    twin = ax.twinx()
    twin.plot(x, [r["speedup"] for r in rows], "o-", color="black", label="speedup")
    twin.plot(x, [w / worlds[0] * rows[0]["speedup"] for w in worlds], "--", color="gray", label="ideal")
    twin.set_ylabel("speedup")
    twin.set_ylim(0, max(worlds) / worlds[0] * rows[0]["speedup"] * 1.1)
    m = result.meta
    batch = f"{m.get('batch')} per worker" if m.get("scaling") == "weak" else f"global batch {m.get('batch')}"
    ax.set_title(f"{m.get('model')} {m.get('mode')}: {m.get('scaling')} scaling, {batch}")
    lines = ax.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    ax.legend(lines, [h.get_label() for h in lines], loc="upper left")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    plt.close(fig)
    return path
