"""meshscale.plots: each chart kind once, as inline SVG for the report or a PNG/SVG/PDF file for --plot."""
import json
from pathlib import Path

import numpy as np
import pytest

from meshscale import plots
from meshscale.errors import MeshscaleError
from meshscale.results import Result, load_result
from meshscale.topology.cluster import ClusterSpec, plan_cluster
from meshscale.topology.draw import draw_fat_tree

FIXTURES = Path(__file__).parents[1] / "fixtures"
ROWS = [{"world_size": n, "throughput_samples_per_s": 100.0 * n * 0.9 ** (n > 1), "speedup": n * 0.9 ** (n > 1)}
        for n in (1, 2, 4)]


def texts(fig):
    """Every title, axis label, tick label and legend entry of a figure."""
    out = [fig._suptitle.get_text()] if fig._suptitle else []
    for ax in fig.axes:
        out += [ax.get_title(), ax.get_xlabel(), ax.get_ylabel(), *(t.get_text() for t in ax.get_xticklabels())]
        if ax.get_legend():
            out += [t.get_text() for t in ax.get_legend().get_texts()]
    return out


def test_scale_result_chart_keeps_the_train_figure_s_words():
    fig = plots.scale_result_chart(Result("scale", ROWS, meta={"model": "m", "mode": "ddp", "scaling": "weak",
                                                              "batch": 8, "device": "cpu"}))
    words = texts(fig)
    assert "m ddp: weak scaling, 8 per worker" in words and "workers" in words and "samples/s" in words
    assert {"throughput", "speedup", "ideal"} <= set(words)


def test_scale_plot_draws_the_predicted_column_beside_the_measured_one():
    rows = [dict(r, predicted_samples_per_s=r["throughput_samples_per_s"] * 1.1) for r in ROWS]
    fig = plots.scale_result_chart(Result("scale", rows, meta={"model": "m", "mode": "ddp", "scaling": "weak",
                                                              "batch": 8, "device": "cpu"}))
    assert {"throughput", "PREDICTED throughput", "speedup", "PREDICTED speedup", "ideal"} <= set(texts(fig))
    heights = sorted(round(b.get_height(), 6) for b in fig.axes[0].patches)
    assert heights == sorted(round(v, 6) for r in rows for v in (r["throughput_samples_per_s"],
                                                                 r["predicted_samples_per_s"]))


def test_predicted_chart_says_so_and_has_one_group_per_variant():
    rows = [dict(r, variant=v) for v in ("edr ring", "10gbe ring") for r in ROWS]
    words = texts(plots.rows_scaling_chart(rows, "resnet50", predicted=True))
    assert "resnet50 (PREDICTED)" in words and "samples/s (predicted)" in words
    assert {"edr ring throughput", "10gbe ring speedup", "10gbe ring throughput"} <= set(words)
    assert "ideal" not in words


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".pdf", b"%PDF"), (".svg", b"<?xml")])
def test_save_writes_the_format_of_the_suffix(tmp_path, suffix, magic):
    path = plots.save(plots.rows_scaling_chart(ROWS, "t"), tmp_path / "sub" / f"s{suffix}")
    assert path.read_bytes().startswith(magic)


def test_save_refuses_an_unknown_suffix_and_an_unwritable_place(tmp_path):
    fig = plots.rows_scaling_chart(ROWS, "t")
    with pytest.raises(MeshscaleError, match=r"use a \.png or \.svg or \.pdf file name"):
        plots.save(fig, tmp_path / "s.jpeg")
    (tmp_path / "file").write_text("")
    with pytest.raises(MeshscaleError, match="cannot write"):
        plots.save(fig, tmp_path / "file" / "s.png")


def test_p2p_chart_has_a_panel_per_mode_and_measure():
    result = load_result(FIXTURES / "p2p_h200x2.json")
    fig = plots.p2p_chart(result)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["P2P unidirectional: GB/s", "P2P staged: GB/s", "P2P latency, us",
                      "P2P bidirectional: GB/s"]
    assert fig._suptitle.get_text().endswith("(nccl)")
    with pytest.raises(MeshscaleError, match="nothing|no bandwidth"):
        plots.p2p_chart(Result("bench-p2p", [{"src": 0, "dst": 1, "mode": "latency", "latency_s": None}]))


def test_to_svg_is_an_inline_element_with_the_id():
    svg = plots.to_svg(plots.busbw_chart("all_reduce: busbw", [plots.Series("measured", [1024, 2048], [1e9, 2e9])]),
                       "plot-x")
    assert svg.startswith('<svg id="plot-x" class="plot" role="img"') and "all_reduce: busbw" in svg


def test_fat_tree_drawing_is_written(tmp_path):
    plan = plan_cluster(ClusterSpec("dgx1-p100", 124, 4, "edr"))
    path = draw_fat_tree(plan, tmp_path / "tree.svg")
    assert "fat tree" in path.read_text() and "level 1:" in path.read_text()


def test_report_and_bench_draw_the_same_p2p_grid():
    data = json.loads((FIXTURES / "p2p_h200x2.json").read_text())
    grids = plots.p2p_grids(data["rows"], "latency", ["gpu0", "gpu1"], ["GPU0", "GPU1"])
    assert len(grids) == 1 and grids[0].low_is_good and grids[0].matrix[0, 1] == pytest.approx(41.98, abs=0.01)


def test_busbw_chart_has_log_size_and_log_bandwidth_axes():
    sizes = [2 ** k for k in range(10, 31, 4)]
    fig = plots.busbw_chart("all_reduce", [plots.Series("measured", sizes, [1e6 * k for k in range(1, 7)])])
    ax = fig.axes[0]
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")


def svg_texts(svg: str) -> list[str]:
    """The text of every <text> element of an SVG (RC keeps text as text)."""
    import re
    return [re.sub(r"<[^>]+>", "", t) for t in re.findall(r"<text\b[^>]*>(.*?)</text>", svg, re.S)]


def test_log_axes_label_their_ticks_in_plain_text():
    sizes = [2 ** k for k in range(10, 31, 2)]
    fig = plots.busbw_chart("all_reduce", [plots.Series("measured", sizes, [1e7 * 3 ** k for k in range(len(sizes))])])
    labels = [t for t in svg_texts(plots.to_svg(fig, "p")) if t.strip()]
    assert len(labels) > 10  # the ticks, the axis labels, the title and the legend are there as text
    assert not [t for t in labels if "mathdefault" in t or "$" in t]
    assert "1K" in labels and "1G" in labels  # sizes in bytes
    assert {"0.1", "1", "10", "100", "1K"} & set(labels)  # GB/s decades as plain numbers


def test_a_log_axis_within_one_decade_still_labels_its_ticks():
    sizes = [2 ** k for k in range(10, 31, 4)]
    gbps = [5.0 + 0.1 * k for k in range(len(sizes))]  # no decade inside the axis: minor ticks carry the labels
    fig = plots.busbw_chart("all_reduce", [plots.Series("measured", sizes, [v * 1e9 for v in gbps])])
    fig.canvas.draw()  # tick labels are decided when the figure is drawn
    labels = [t.get_text() for t in fig.axes[0].yaxis.get_ticklabels(which="both") if t.get_text()]
    assert labels and all(float(t) for t in labels)  # plain numbers, each parses


def test_every_log_axis_goes_through_log_axis():
    # a log scale set elsewhere gets matplotlib's mathtext labels back
    import re
    src = Path(plots.__file__).parent
    found = [f"{path.relative_to(src)}: {line.strip()}" for path in src.rglob("*.py")
             for line in path.read_text().splitlines()
             if re.search(r"set_[xy]scale\(|loglog\(|semilog[xy]\(", line) and "getattr(ax" not in line]
    assert found == []


def test_heatmap_colour_scale_starts_at_zero_and_reaches_the_bound():
    matrix = np.array([[np.nan, 27.59], [27.62, np.nan]])
    fig = plots.heatmaps([plots.Grid("P2P copy: GB/s", matrix, ["GPU0", "GPU1"], "GB/s")])
    assert fig.axes[0].images[0].get_clim() == (0.0, 27.62)
    bounded = plots.heatmaps([plots.Grid("P2P copy: GB/s", matrix, ["GPU0", "GPU1"], "GB/s", bound=50.0)])
    assert bounded.axes[0].images[0].get_clim() == (0.0, 50.0)


def test_pack_keeps_groups_whole_and_legends_short():
    groups = [["a", "a'"], ["b", "b'"], ["c"], ["d", "d'"]]
    charts = plots.pack(groups, 5)
    assert charts == [["a", "a'", "b", "b'", "c"], ["d", "d'"]]
    assert all(len(c) <= 5 for c in charts)


def test_to_svg_carries_the_legend_entry_count():
    series = [plots.Series(f"s{k}", [1024, 2048], [1e9, 2e9]) for k in range(3)]
    svg = plots.to_svg(plots.busbw_chart("t", series), "plot-y")
    assert 'data-legend-entries="3"' in svg
