"""Figures of the predict layer: a scaling chart in the style of seed 000 figures 5/6 (bars of throughput,
lines of speedup) and a drawing of a cluster's fat tree."""
from __future__ import annotations

from pathlib import Path

from meshscale.topology.cluster import ClusterPlan


def scaling_plot(rows: list[dict], path: str | Path, title: str) -> Path:
    """Bars: throughput per GPU count for each variant; line on the right axis: speedup."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = list(dict.fromkeys(r.get("variant", "") for r in rows))
    sizes = sorted({r["world_size"] for r in rows})
    fig, ax = plt.subplots(figsize=(max(6, len(sizes) * 0.9 + 2), 4.5))
    width = 0.8 / len(variants)
    speed = ax.twinx()
    for i, v in enumerate(variants):
        by = {r["world_size"]: r for r in rows if r.get("variant", "") == v}
        xs = [j + (i - (len(variants) - 1) / 2) * width for j, s in enumerate(sizes) if s in by]
        ax.bar(xs, [by[s]["throughput_samples_per_s"] for s in sizes if s in by], width, label=f"{v} throughput".strip())
        speed.plot(xs, [by[s]["speedup"] for s in sizes if s in by], "o-", label=f"{v} speedup".strip())
    ax.set_xticks(range(len(sizes)), [str(s) for s in sizes])
    ax.set_xlabel("GPUs")
    ax.set_ylabel("samples/s (predicted)")
    speed.set_ylabel("speedup")
    ax.set_title(title + " (PREDICTED)")
    handles = ax.get_legend_handles_labels()[0] + speed.get_legend_handles_labels()[0]
    labels = ax.get_legend_handles_labels()[1] + speed.get_legend_handles_labels()[1]
    ax.legend(handles, labels, fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def tree_plot(plan: ClusterPlan, path: str | Path) -> Path:
    """The fat tree: switches per level as rows of boxes, nodes under their leaves (long rows are thinned)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 2 + 1.3 * plan.levels))
    n_nodes = plan.spec.nodes

    def xs(count: int) -> list[float]:
        return [(i + 0.5) / count for i in range(count)]

    rows = [("nodes", n_nodes)] + [(f"level {k + 1}", c) for k, c in enumerate(plan.switches)]
    pos = {name: xs(count) for name, count in rows}
    leaves = pos["level 1"]
    for k, x in enumerate(pos["nodes"]):
        ax.plot([x, leaves[k // plan.nodes_per_leaf]], [0, 1], lw=0.3, color="grey")
    for level in range(2, plan.levels + 1):
        lower, upper = pos[f"level {level - 1}"], pos[f"level {level}"]
        step = max(1, len(lower) * len(upper) // 600)  # thin very dense meshes
        for i, a in enumerate(lower):
            for j, b in enumerate(upper):
                if (i + j) % step == 0:
                    ax.plot([a, b], [level - 1, level], lw=0.2, color="tab:blue")
    for y, (name, count) in enumerate(rows):
        ax.scatter(pos[name], [y] * count, s=12 if name == "nodes" else 30, marker="s",
                   color="tab:green" if name == "nodes" else "tab:blue", zorder=3)
        ax.text(-0.02, y, f"{name}: {count}", ha="right", va="center", fontsize=8)
    ax.set_xlim(-0.2, 1.02)
    ax.axis("off")
    ax.set_title(f"{n_nodes} x {plan.node_topology.name}, {plan.spec.nics}x {plan.net.name.upper()}: "
                 f"{plan.levels}-level fat tree, bisection {plan.bisection_bytes_per_s * 2 / 1e9:,.0f} GB/s "
                 f"(both directions), worst latency {plan.latency_s * 1e6:.2f} us", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
