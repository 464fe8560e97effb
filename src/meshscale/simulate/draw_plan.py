"""`plan --svg`: the topology diagram of `meshscale.topology.draw` with the schedule's channels drawn over it,
one colour per channel, an arrow per (sender, receiver) pair the channel uses."""
from __future__ import annotations

from pathlib import Path

import meshscale.plots as plots
from meshscale.errors import MeshscaleError
from meshscale.topology import draw as topo_draw
from meshscale.units import format_bytes, gbps

COLOURS = ("#d62728", "#1f77b4", "#9467bd", "#ff7f0e", "#17becf", "#e377c2", "#8c564b", "#2ca02c")


def draw_plan(plan, path: str | Path) -> Path:
    """Write the diagram of ``plan`` (a `meshscale.simulate.plan.Plan`) to ``path`` (.svg or .png)."""
    from matplotlib import rc_context
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import FancyArrowPatch

    path = Path(path)
    if path.suffix.lower() not in (".svg", ".png"):
        raise MeshscaleError(f"cannot draw {path}: use a .svg or .png file name")
    topo, s, r = plan.topology, plan.schedule, plan.result
    pos = topo_draw.layout(topo)
    names = [topo.device(d) for d in s.ranks]
    pairs: dict[int, set[tuple[int, int]]] = {}
    for step in s.steps:
        for t in step.transfers:
            pairs.setdefault(t.channel, set()).add((t.src, t.dst))
    xs, ys = [p[0] for p in pos.values()], [p[1] for p in pos.values()]
    with rc_context(plots.RC):
        fig = Figure(figsize=(max(6.0, (max(xs) - min(xs) + 2) * 1.1), max(4.0, (max(ys) - min(ys) + 2) * 1.1 + 0.8)))
        ax = fig.add_subplot()
        topo_draw._draw_links(ax, topo, pos)  # the plain diagram underneath (same module, same look)
        topo_draw._draw_nodes(ax, topo, pos)
        handles = []
        for k, (channel, used) in enumerate(sorted(pairs.items())):
            colour = COLOURS[k % len(COLOURS)]
            for a, b in sorted(used):
                (x1, y1), (x2, y2) = pos[names[a]], pos[names[b]]
                ax.add_patch(FancyArrowPatch((x1, y1), (x2, y2), arrowstyle="-|>", mutation_scale=9,
                                             connectionstyle=f"arc3,rad={0.12 + 0.06 * (k % 4)}", color=colour,
                                             linewidth=1.3, alpha=0.8, zorder=4, shrinkA=12, shrinkB=12))
            handles.append(Line2D([], [], color=colour, linewidth=1.5, label=f"channel {channel}"))
        ax.set_xlim(min(xs) - 1, max(xs) + 1)
        ax.set_ylim(min(ys) - 1, max(ys) + 1)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(f"{s.collective} {format_bytes(s.nbytes)} on {topo.name}: {r.detail or s.algorithm}\n"
                     f"predicted busbw {gbps(r.busbw_bytes_per_s):.1f} GB/s, {r.time_s * 1e6:.0f} us", fontsize=10)
        if len(handles) <= 16:
            ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    return plots.save(fig, path, (".svg", ".png"), dpi=110)
