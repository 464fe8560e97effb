"""Drawings of a topology and of a cluster's fat tree (meshscale.plots' look: Agg canvas, no pyplot state).

Layout: a node's ``pos`` attr ([x, y]) wins. Otherwise the rank devices come first: the DGX-1 hybrid cube-mesh
as two squares with their diagonals (the second square mirrored so that the cube edges between them are short),
other small NVLink meshes as a polygon, anything else as a row (two rows when GPUs name their ``board``).
NVSwitches sit above the row, or between the two rows. Everything else (PCIe switches, CPUs, NICs, hosts,
network switches) is layered by hop distance from the devices, below them (above for the top board), each node
centred over the nodes it connects to one layer closer to the devices.
"""
from __future__ import annotations

import itertools
import math
import re
from collections import defaultdict
from pathlib import Path

import networkx as nx
from matplotlib.figure import Figure

import meshscale.plots as plots
from meshscale.errors import MeshscaleError
from meshscale.topology.cluster import ClusterPlan
from meshscale.topology.model import DEVICE_KINDS, Topology
from meshscale.units import is_digits

NODE_STYLE = {  # kind -> (face colour, edge colour)
    "gpu": ("#e3f2c1", "#4d7a00"), "worker": ("#e3f2c1", "#4d7a00"), "cpu": ("#cfe2f3", "#1f4e79"),
    "pcie_switch": ("#eeeeee", "#666666"), "nvswitch": ("#e1d5e7", "#6a3d9a"), "nic": ("#fde9c9", "#b45f06"),
    "net_switch": ("#fde9c9", "#b45f06"), "host": ("#cfe2f3", "#1f4e79"),
}
LINK_STYLE = {  # kind -> (colour, line style, base width)
    "nvlink": ("#76b900", "-", 1.6), "c2c": ("#76b900", "--", 1.6), "pcie": ("#999999", "-", 0.9), "qpi": ("#e69138", "--", 2.0),
    "upi": ("#e69138", "--", 2.0), "infiniband": ("#3d85c6", "-", 1.4), "ethernet": ("#a0522d", "-.", 1.2),
    "shm": ("#888888", ":", 1.2),
}
MIN_GAP = 0.9  # smallest horizontal distance between two nodes of one layer
MAX_STEM_CHARS = 80  # file names made from names in files stay short


def file_stem(name: str, fallback: str = "topology") -> str:
    """``name`` (read from a file, so anything) made safe as a file name in the current directory: letters,
    digits, ``_``, ``-`` and single dots only, no leading dot, at most `MAX_STEM_CHARS` characters."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
    stem = re.sub(r"\.{2,}", ".", stem).lstrip("._-")[:MAX_STEM_CHARS].rstrip("._-")
    return stem or fallback


def default_output(topology: Topology, fmt: str) -> Path:
    """Where a diagram goes when no path is given: ``<name>.<fmt>`` in the current directory."""
    return Path(f"{file_stem(topology.name)}.{fmt}")


def draw(topology: Topology, path: str | Path) -> Path:
    """Write a diagram of ``topology`` to ``path`` (.svg or .png) and return the path."""
    path = Path(path)
    if path.suffix.lower() not in (".svg", ".png"):
        raise MeshscaleError(f"cannot draw {path}: use a .svg or .png file name")
    return plots.save(topology_figure(topology), path)


@plots.styled
def topology_figure(topology: Topology) -> Figure:
    """The diagram of ``topology``: devices, switches, CPUs, NICs and every link, styled by kind."""
    if not topology.nodes:
        raise MeshscaleError(f"nothing to draw: {topology.name} has no nodes")
    pos = layout(topology)
    xs, ys = [p[0] for p in pos.values()], [p[1] for p in pos.values()]
    width, height = max(xs) - min(xs) + 2, max(ys) - min(ys) + 2
    scale = min(1.3, 24 / width, 20 / height)
    fig = Figure(figsize=(max(3.0, width * scale), max(2.5, height * scale + 0.8)))  # sized to its content
    ax = fig.add_subplot()
    _draw_links(ax, topology, pos)
    _draw_nodes(ax, topology, pos)
    ax.set_xlim(min(xs) - 1, max(xs) + 1)
    ax.set_ylim(min(ys) - 1, max(ys) + 1)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(topology.title or topology.name, fontsize=11)
    _legend(ax, topology)
    return fig


def draw_fat_tree(plan: ClusterPlan, path: str | Path) -> Path:
    """Write the drawing of a cluster's network (fat tree or rails) to ``path`` (png, svg or pdf by suffix)."""
    return plots.save(fat_tree_figure(plan), path)


@plots.styled
def fat_tree_figure(plan: ClusterPlan) -> Figure:
    """The network: switches per level as rows of boxes, nodes under their leaves (a rail network: each node
    under its rail group's leaf of every rail), dense meshes thinned."""
    fig = Figure(figsize=(12, 2 + 1.3 * plan.levels))
    ax = fig.add_subplot()
    n_nodes = plan.spec.nodes

    def xs(count: int) -> list[float]:
        return [(i + 0.5) / count for i in range(count)]

    rows = [("nodes", n_nodes)] + [(f"level {k + 1}", c) for k, c in enumerate(plan.switches)]
    pos = {name: xs(count) for name, count in rows}
    leaves = pos["level 1"]
    for k, x in enumerate(pos["nodes"]):
        for leaf in sorted(set(plan.leaves_of_node(k))):
            ax.plot([x, leaves[leaf]], [0, 1], lw=0.3, color="grey")
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
                 f"{plan.layout()}, bisection {plan.bisection_whitepaper_bytes_per_s / 1e9:,.0f} GB/s as the DGX-1 "
                 f"whitepaper counts it ({plan.bisection_bytes_per_s / 1e9:,.0f} GB/s per direction), worst latency "
                 f"{plan.latency_s * 1e6:.2f} us", fontsize=9)
    return fig


# ---- layout ------------------------------------------------------------------------------------------
def layout(topo: Topology) -> dict[str, tuple[float, float]]:
    """Positions (x, y) of every node, in layout units (about one node width apart)."""
    pos = _device_positions(topo)
    ys = [p[1] for p in pos.values()] or [0.0]
    top, bottom = max(ys), min(ys)
    two_rows = len(_boards(topo)) == 2 and not _is_cube_mesh(topo)
    xs = [p[0] for p in pos.values()] or [0.0]
    switches = sorted(topo.nodes_of("nvswitch"), key=lambda n: (topo.nodes[n].attrs.get("board", 0), _natural(n)))
    boards = sorted({topo.nodes[s].attrs.get("board", 0) for s in switches})
    for b in boards:
        row = [s for s in switches if topo.nodes[s].attrs.get("board", 0) == b]
        if two_rows:
            y = top - (top - bottom) * (1 + boards.index(b)) / (len(boards) + 1)
        else:
            y = top + 1.5 + boards.index(b)
        for k, s in enumerate(row):
            x = min(xs) + (max(xs) - min(xs)) * (k + 0.5) / len(row) if len(row) > 1 else sum(xs) / len(xs)
            pos[s] = (x, y)
    _layer_the_rest(topo, pos, top, bottom, two_rows)
    for name, node in topo.nodes.items():  # explicit positions win
        if isinstance(node.attrs.get("pos"), (list, tuple)) and len(node.attrs["pos"]) == 2:
            pos[name] = tuple(float(v) for v in node.attrs["pos"])
    return pos


def _device_positions(topo: Topology) -> dict[str, tuple[float, float]]:
    devices = topo.devices()
    if _is_cube_mesh(topo):
        # two squares with diagonals: 0 1 / 2 3 and, mirrored, 5 4 / 7 6; cube edges i - i+4 run between them
        corners = {0: (0, 1), 1: (1, 1), 2: (0, 0), 3: (1, 0), 5: (2.2, 1), 4: (3.2, 1), 7: (2.2, 0), 6: (3.2, 0)}
        return {d: (corners[topo.nodes[d].index][0] * 1.6, corners[topo.nodes[d].index][1] * 1.6) for d in devices}
    boards = _boards(topo)
    if len(boards) == 2:
        rows = [[d for d in devices if topo.nodes[d].attrs.get("board") == b] for b in boards]
        return {d: (float(k) * 1.35, 4.0 * (1 - r)) for r, row in enumerate(rows) for k, d in enumerate(row)}
    meshed = any(l.kind == "nvlink" and topo.nodes[l.a].kind in DEVICE_KINDS and topo.nodes[l.b].kind in DEVICE_KINDS
                 for l in topo.links)
    if meshed and 3 <= len(devices) <= 8:  # a small direct mesh reads best as a polygon
        n, radius = len(devices), 0.55 * len(devices) / math.pi + 0.6
        return {d: (radius * math.cos(math.pi / 2 + math.pi / n - 2 * math.pi * k / n),
                    radius * math.sin(math.pi / 2 + math.pi / n - 2 * math.pi * k / n)) for k, d in enumerate(devices)}
    return {d: (float(k) * 1.35, 0.0) for k, d in enumerate(devices)}


def _boards(topo: Topology) -> list:
    return sorted({topo.nodes[d].attrs.get("board") for d in topo.devices()} - {None})


def _is_cube_mesh(topo: Topology) -> bool:
    """The DGX-1 hybrid cube-mesh: GPUs 0-3 and 4-7 each fully joined, plus i - i+4 (16 NVLink pairs)."""
    if topo.nodes_of("nvswitch") or sorted(topo.nodes[d].index for d in topo.devices()) != list(range(8)):
        return False
    pairs = {frozenset((topo.nodes[l.a].index, topo.nodes[l.b].index)) for l in topo.links
             if l.kind == "nvlink" and topo.nodes[l.a].kind == "gpu" and topo.nodes[l.b].kind == "gpu"}
    quads = {frozenset(p) for q in ((0, 1, 2, 3), (4, 5, 6, 7)) for p in itertools.combinations(q, 2)}
    return pairs == quads | {frozenset((i, i + 4)) for i in range(4)}


def _layer_the_rest(topo: Topology, pos: dict, top: float, bottom: float, two_rows: bool) -> None:
    """Place the remaining nodes by hop distance from the devices, centred over their closer neighbours."""
    g = nx.Graph()
    g.add_nodes_from(topo.nodes)
    g.add_edges_from((l.a, l.b) for l in topo.links if l.kind != "nvlink")
    depth = _depths(topo, g)
    placed_depth = max(depth.values(), default=0)
    mid = (top + bottom) / 2
    by_depth = defaultdict(list)
    for name in topo.nodes:
        if name not in pos:
            by_depth[depth.get(name, placed_depth + 1)].append(name)
    for d in sorted(by_depth):
        layer = {}
        for name in sorted(by_depth[d], key=_natural):
            closer = [m for m in g[name] if m in pos and depth.get(m, -1) < d] or [m for m in g[name] if m in pos]
            x = sum(pos[m][0] for m in closer) / len(closer) if closer else 0.0
            up = two_rows and closer and sum(pos[m][1] for m in closer) / len(closer) > mid
            layer[name] = (x, top + 1.2 * d if up else bottom - 1.2 * d)
        for y in sorted({p[1] for p in layer.values()}):
            row = sorted((n for n in layer if layer[n][1] == y), key=lambda n: layer[n][0])
            for name, x in zip(row, _spread([layer[n][0] for n in row])):
                pos[name] = (x, y)


def _depths(topo: Topology, g: nx.Graph) -> dict[str, int]:
    """Hop distance from the devices, except that all CPUs share one layer (the deepest any of them needs) and
    whatever hangs off a CPU goes below that layer."""
    devices = set(topo.devices())
    cpus = [n for n in g if topo.nodes[n].kind == "cpu"]
    if not devices or not cpus:
        return nx.multi_source_dijkstra_path_length(g, devices or {next(iter(topo.nodes))}, weight=None)
    depth = nx.multi_source_dijkstra_path_length(g.subgraph(n for n in g if n not in cpus), devices, weight=None)
    cpu_depth = 1 + max((depth[m] for c in cpus for m in g[c] if m in depth), default=0)
    for name, d in nx.multi_source_dijkstra_path_length(g, set(cpus), weight=None).items():
        depth.setdefault(name, cpu_depth + d)
    return depth


def _spread(xs: list[float]) -> list[float]:
    """Sorted x positions pushed apart to at least MIN_GAP, then re-centred on their old mean."""
    out = []
    for x in xs:
        out.append(max(x, out[-1] + MIN_GAP) if out else x)
    shift = (sum(xs) - sum(out)) / len(xs) if xs else 0.0
    return [x + shift for x in out]


def _natural(name: str) -> tuple:
    digits = "".join(c for c in name if is_digits(c))
    return (name.rstrip("0123456789"), int(digits) if digits else -1, name)


# ---- drawing -----------------------------------------------------------------------------------------
def _label(topo: Topology, name: str) -> str:
    node = topo.nodes[name]
    if node.kind == "gpu":
        model = str(node.attrs.get("model", "")).replace("NVIDIA ", "").replace("Tesla ", "")
        return f"GPU{node.index}\n{model[:14]}" if model else f"GPU{node.index}"
    if node.kind == "worker":
        return f"worker{node.index}"
    if node.kind == "nic":
        kind, rate = node.attrs.get("port_kind", ""), node.attrs.get("port_rate", "")
        return f"{name}\n{str(rate).upper()}{' GbE' if kind == 'ethernet' else ''}"
    if node.kind == "nvswitch":
        return f"NVSwitch\n{name.removeprefix('nvswitch')}"
    return name


def _draw_nodes(ax, topo: Topology, pos: dict) -> None:
    for name, (x, y) in pos.items():
        face, edge = NODE_STYLE.get(topo.nodes[name].kind, ("white", "black"))
        small = topo.nodes[name].kind in ("pcie_switch", "nic")
        ax.text(x, y, _label(topo, name), ha="center", va="center", fontsize=6 if small else 7, zorder=3,
                bbox={"boxstyle": "round,pad=0.35", "facecolor": face, "edgecolor": edge, "linewidth": 1.0})


def _draw_links(ax, topo: Topology, pos: dict) -> None:
    from matplotlib.patches import FancyArrowPatch

    centre = [pos[d] for d in topo.devices()] or list(pos.values())
    cx, cy = sum(p[0] for p in centre) / len(centre), sum(p[1] for p in centre) / len(centre)
    for link in topo.links:
        (x1, y1), (x2, y2) = pos[link.a], pos[link.b]
        colour, style, base = LINK_STYLE.get(link.kind, ("black", "-", 1.0))
        rad = 0.0
        if abs(y1 - y2) < 1e-6 and _passes_a_node(pos, link.a, link.b):  # bend around a row's nodes, outwards
            dx, dy = x2 - x1, y2 - y1
            out = dy * ((x1 + x2) / 2 - cx) - dx * ((y1 + y2) / 2 - cy)
            rad = 0.3 if out >= 0 else -0.3
        width = base * (1 + 0.9 * (link.count - 1)) if link.kind == "nvlink" else base
        ax.add_patch(FancyArrowPatch((x1, y1), (x2, y2), arrowstyle="-", connectionstyle=f"arc3,rad={rad}",
                                     color=colour, linestyle=style, linewidth=min(width, 5.0), zorder=1, alpha=0.85))
        if link.count > 1:
            # at 40% of the way, so that the labels of two crossing diagonals do not sit on each other
            t = 0.5 if rad else 0.4
            mx, my = x1 + t * (x2 - x1) + rad * (y2 - y1) / 2, y1 + t * (y2 - y1) - rad * (x2 - x1) / 2
            ax.text(mx, my, f"x{link.count}", fontsize=6, ha="center", va="center", color="#333333", zorder=2,
                    bbox={"boxstyle": "round,pad=0.1", "facecolor": "white", "edgecolor": "none", "alpha": 0.8})


def _passes_a_node(pos: dict, a: str, b: str, clearance: float = 0.3) -> bool:
    (x1, y1), (x2, y2) = pos[a], pos[b]
    length2 = (x2 - x1) ** 2 + (y2 - y1) ** 2 or 1e-9
    for name, (x, y) in pos.items():
        if name in (a, b):
            continue
        t = ((x - x1) * (x2 - x1) + (y - y1) * (y2 - y1)) / length2
        if 0.05 < t < 0.95 and math.hypot(x - (x1 + t * (x2 - x1)), y - (y1 + t * (y2 - y1))) < clearance:
            return True
    return False


def _legend(ax, topo: Topology) -> None:
    from matplotlib.lines import Line2D

    kinds = sorted({l.kind for l in topo.links}, key=list(LINK_STYLE).index)
    handles = [Line2D([], [], color=LINK_STYLE[k][0], linestyle=LINK_STYLE[k][1], linewidth=LINK_STYLE[k][2],
                      label={"nvlink": "NVLink (width = links bonded)", "c2c": "NVLink-C2C", "pcie": "PCIe", "qpi": "QPI", "upi": "UPI",
                             "infiniband": "InfiniBand", "ethernet": "Ethernet", "shm": "shared memory"}[k])
               for k in kinds]
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
