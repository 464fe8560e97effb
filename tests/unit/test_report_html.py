"""The report page from fixture results: every figure, its verdict, no remote asset; the CLI writes it."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from meshscale.errors import MeshscaleError
from meshscale.report.html import load_sources, render
from meshscale.results import load_result

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "report"


@pytest.fixture(scope="module")
def page():
    return render(load_sources([FIXTURES]))


def test_every_figure_has_a_plot_and_a_verdict(page):
    figures = re.findall(r'<figure id="fig-([^"]+)">(.*?)</figure>', page, re.S)
    assert len(figures) >= 10
    for fig_id, body in figures:
        assert f'<svg id="{fig_id}" class="plot"' in body
        assert re.search(r'class="verdict (good|warn|bad|info)">[^<]+', body)


def test_figures_follow_the_data(page):
    collective = load_result(FIXTURES / "collective.json")
    for name in {r["collective"] for r in collective.rows}:
        assert f'id="plot-busbw-{name.replace("_", "-")}"' in page
    assert "measured collective" in page and "predicted sim" in page and "link bound" in page
    assert page.count('id="plot-p2p-') == 3  # unidirectional, bidirectional, latency
    assert "90% of the line rate on the slowest pair" in page and "85% of the line rate on the slowest pair" in page
    assert "plot-scaling-this-machine-strong" in page and "plot-breakdown-this-machine-weak" in page
    assert "8 GPUs (Tesla P100-SXM2-16GB)" in page
    assert not re.search(r"""(src|href)=["']?https?:""", page)


def test_a_subset_of_results_gives_a_subset_of_figures():
    page = render(load_sources([FIXTURES / "scale.json"]))
    assert "plot-scaling" in page and "plot-busbw" not in page and "plot-p2p" not in page


def test_cli_report_and_errors(tmp_path, cli):
    out = cli("report", str(FIXTURES / "collective.json"), str(FIXTURES / "sim.json"), "--output", str(tmp_path / "r"))
    assert out.exit_code == 0, out.output
    assert "plot-busbw-all-reduce" in (tmp_path / "r" / "index.html").read_text()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(MeshscaleError, match="no meshscale result"):
        load_sources([empty])


def test_separate_train_runs_become_one_scaling_figure():
    from meshscale.report.figures import train_runs_as_scale
    from meshscale.report.parts import Source
    from meshscale.results import Result
    runs = [Source(f"train-{n}", Result("train", [], meta={"summary": {
        "world_size": n, "batch_per_rank": 64, "global_batch": 64 * n, "samples_per_s": 200.0 * n * (1 - 0.05 * (n > 1)),
        "step_time_s": 0.3, "compute_s": 0.25, "comm_s": 0.05, "data_s": 0.0, "comm_share": 0.15}})) for n in (16, 8)]
    merged = train_runs_as_scale(runs)
    assert [r["world_size"] for r in merged.result.rows] == [8, 16]
    assert all(r["mode"] == "weak" for r in merged.result.rows)
    assert merged.result.rows[1]["speedup"] == pytest.approx(16.0)  # same efficiency at 8 and 16
    page = render(runs)
    assert "plot-scaling-training-runs-weak" in page


def test_scaling_rows_accept_every_writer_shape():
    from meshscale.report.figures import scaling_rows
    from meshscale.results import Result
    # `meshscale scale`: the exchange in "mode", weak/strong in meta.scaling
    sweep = Result("scale", [{"world_size": 1, "mode": "ddp", "throughput_samples_per_s": 100.0, "speedup": 1.0,
                              "efficiency": 1.0},
                             {"world_size": 2, "mode": "ddp", "throughput_samples_per_s": 150.0, "speedup": 1.5,
                              "efficiency": 0.75}], meta={"scaling": "strong"})
    assert [r["mode"] for r in scaling_rows(sweep)] == ["strong", "strong"]
    # `meshscale predict --from`: predicted beside measured, no speedup
    beside = Result("predict", [{"world_size": 4, "mode": "ddp", "measured_samples_per_s": 300.0, "predicted_samples_per_s": 360.0},
                                {"world_size": 2, "mode": "ddp", "measured_samples_per_s": 180.0, "predicted_samples_per_s": 190.0}],
                    predicted=True, meta={"weak": True})
    rows = {r["world_size"]: r for r in scaling_rows(beside)}
    assert rows[4]["throughput_samples_per_s"] == 360.0 and rows[4]["mode"] == "weak"
    assert rows[4]["speedup"] == pytest.approx(360 / 190 * 2) and rows[2]["efficiency"] == pytest.approx(1.0)
    assert scaling_rows(Result("scale", [{"world_size": 2, "mode": "weak"}])) == []  # no throughput: left out


def headings(page):
    return [re.sub(r"<[^>]+>", "", h) for h in re.findall(r"<h[1-3][^>]*>(.*?)</h[1-3]>", page, re.S)]


def test_headings_are_clean_and_every_legend_is_short(page):
    found = headings(page)
    assert found and not any("`" in h for h in found)
    assert not any(re.search(r"\b(\w+)\b, \1\b", h) for h in found), found  # no "P2P latency, latency"
    assert "P2P latency (p2p)" in found
    counts = [int(n) for n in re.findall(r'class="plot" role="img" data-legend-entries="(\d+)"', page)]
    assert counts and max(counts) <= 6


def test_ranks_have_one_name_in_plots_and_notes():
    from meshscale.report.parts import Source
    from meshscale.report.verdicts import rank_label
    from meshscale.results import Result
    assert [rank_label(x) for x in (3, "3", "gpu3", "worker1", "nic0")] == ["GPU3", "GPU3", "GPU3", "worker1", "nic0"]
    assert rank_label(2, "worker") == "worker2"
    rows = [{"src": f"worker{a}", "dst": f"worker{b}", "mode": "copy", "bandwidth_bytes_per_s": 1e9 * (1 + a + b),
             "latency_s": 1e-5} for a in range(2) for b in range(2) if a != b]
    page = render([Source("cpu", Result("bench-p2p", rows, meta={"backend": "gloo"}, machine={"cpu_count": 2}))])
    labels = set(re.findall(r">(worker\d|CPU\d|GPU\d)<", page))  # tick labels of the heatmap (SVG text)
    assert labels == {"worker0", "worker1"}, labels
    assert "CPU0" not in page


def test_cluster_plan_and_predict_results_have_their_own_sections():
    from meshscale.report.parts import Source
    from meshscale.results import Result
    from meshscale.simulate.fabric import Fabric
    from meshscale.simulate.plan import plan, plan_result
    from meshscale.topology.catalog import load_system
    chosen = plan_result(plan(Fabric(load_system("hgx-h200"), algo="auto"), "all_reduce", list(range(8)), 1 << 30))
    cluster = Result("cluster", [{"nodes": 16, "gpus": 128, "levels": 2, "bisection_bytes_per_s": 1.6e12,
                                  "latency_s": 2e-6}], True, {"node": "hgx-h200", "link": "ndr"})
    predicted = Result("predict", [{"world_size": n, "variant": "ndr ring", "predicted_samples_per_s": 900.0 * n}
                                   for n in (8, 16)], True, {"scaling": "weak"})
    page = render([Source("plan", chosen), Source("cluster", cluster), Source("predict", predicted)])
    titles = headings(page)
    assert any(t.startswith("Plan (predicted): all_reduce of 1G on hgx-h200, 8 ranks") for t in titles), titles
    assert any(t.startswith("Cluster (predicted): hgx-h200 nodes over ndr") for t in titles)
    assert "Predicted scaling (not measured)" in titles
    assert "(chosen)</td>" in page and "1600.0 GB/s" in page and "2.0 us" in page and "<td>ndr ring</td>" in page


def test_the_dgx1_reference_charts_have_short_legends():
    from meshscale.report.parts import Source
    from meshscale.app.tour import whitepaper_results
    page = render([Source(name, result) for name, result in whitepaper_results().items()])
    counts = [int(n) for n in re.findall(r'data-legend-entries="(\d+)"', page)]
    assert len(counts) >= 2 and max(counts) <= 6, counts



def test_p2p_bandwidth_colours_run_up_to_the_line_rate(page):
    """The fixture's best pair measures 18 GB/s over a 20 GB/s NVLink: the colour bar reaches the line rate."""
    svg = re.search(r'<svg id="plot-p2p-p2p-unidirectional-bandwidth".*?</svg>', page, re.S).group(0)
    numbers = {float(t) for t in re.findall(r">\s*(\d+\.\d)\s*</text>", svg)}  # cell values and colour bar ticks
    assert {0.0, 14.2, 18.0, 20.0} <= numbers and max(numbers) == 20.0


def test_train_place_and_a_foreign_sim_each_have_their_place():
    from meshscale.report.parts import Source
    from meshscale.results import Result
    from meshscale.simulate.fabric import Fabric
    from meshscale.simulate.plan import sim_sweep
    from meshscale.topology.catalog import load_system
    losses = [2.3, 1.9, 1.4, 1.1]
    train = Result("train", [{"step": k, "loss": v, "step_time_s": 0.1} for k, v in enumerate(losses)], meta={
        "summary": {"world_size": 2, "samples_per_s": 160.0, "step_time_s": 0.1, "compute_s": 0.08, "comm_s": 0.015,
                    "data_s": 0.005, "comm_share": 0.15, "eval_accuracy": 0.875, "eval_loss": 0.41}})
    place = Result("place", [{"rank": 1, "devices": [0, 1, 2, 3], "busbw_bytes_per_s": 7.3e10, "time_s": 1.4e-3,
                              "algorithm": "ring", "bound_busbw_bytes_per_s": 1e11, "path_type": "NVL"},
                             {"rank": 2, "devices": [0, 1, 4, 5], "busbw_bytes_per_s": 3.7e10, "time_s": 2.8e-3,
                              "algorithm": "ring", "bound_busbw_bytes_per_s": 5e10, "path_type": "NVL"}], True,
                   {"system": "dgx1-v100", "gpus": 4, "size_bytes": 1 << 26, "subsets": 70, "why": ["rings over NVLink"]})
    other = sim_sweep(Fabric(load_system("dgx1-v100")), "all_reduce", list(range(8)), [1 << 20, 1 << 24])
    measured = load_result(FIXTURES / "collective.json")
    page = render([Source("collective", measured), Source("my_sim", other), Source("run", train),
                   Source("place", place)])
    titles = headings(page)
    assert "Training: loss per step, time split and accuracy" in titles and 'id="plot-loss-run"' in page
    assert "87.5%" in page and "15.0%" in page  # accuracy and communication share of the summary
    assert any(t.startswith("Placement (predicted): 4 of dgx1-v100") for t in titles), titles
    assert "<td>0,1,2,3</td>" in page and "<td>0,1,4,5</td>" in page and "rings over NVLink" in page
    # the dgx1-v100 prediction is not drawn on the measured machine's chart, but on its own with its own bound
    assert measured.meta["topology"]["name"] != "dgx1-v100"
    assert "Collectives predicted on dgx1-v100 (not the measured machine)" in titles
    own = page[page.index('id="plot-busbw-dgx1-v100-all-reduce"'):]
    assert "predicted my_sim" in own and "link bound (dgx1-v100)" in own
    measured_chart = page[page.index('id="plot-busbw-all-reduce"'):page.index('id="plot-busbw-dgx1-v100-all-reduce"')]
    assert "predicted my_sim" not in measured_chart


def test_a_layout_run_shows_each_dimension_busy_and_exposed():
    from meshscale.report.parts import Source
    from meshscale.results import Result
    comm = {"fsdp": {"operations": 9.0, "bytes": 5e5, "seconds": 0.058, "exposed_seconds": 0.031},
            "pp": {"operations": None, "bytes": None, "seconds": 0.041, "exposed_seconds": 0.036}}
    train = Result("train", [{"step": 0, "loss": 5.5}], meta={"summary": {
        "world_size": 4, "samples_per_s": 96.0, "layout": "fsdp2 pp2", "comm_s": 0.044, "bubble_s": 0.031,
        "comm_by_dimension": comm}})
    page = render([Source("run", train)])
    assert any(t.startswith("Training: communication per parallel dimension") for t in headings(page))
    assert "<td>fsdp</td><td>9</td>" in page and "<td>58.00 ms</td><td>31.00 ms</td>" in page
    assert "<td>36.00 ms</td>" in page and "<td>31.00 ms</td>" in page  # pp's exposed time, and the bubble
