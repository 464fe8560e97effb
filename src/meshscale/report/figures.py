"""Which figures a set of results yields: topology, P2P heatmaps, busbw curves per collective (measured,
predicted, bound), scaling bars with speedup lines, each with its verdict. Pure assembly; drawing is in
meshscale.plots (and topology.draw), judging in verdicts.py, the page in html.py."""
from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

import meshscale.plots as plots
from meshscale.plots import Series
from meshscale.report.expected import references
from meshscale.report.pairs_section import pairs_section
from meshscale.report.parts import Plot, Section, Source, slug
from meshscale.report.verdicts import (Verdict, collective_verdict, hints, host_path_rates, is_cpu_run, per_call_floor_s,
                                       p2p_verdict, rank_label, scaling_gap, scaling_verdict, small_message_note, topology_verdict)
from meshscale.results import Result
from meshscale.topology.draw import topology_figure
from meshscale.topology.model import Topology
from meshscale.topology.queries import pair_bandwidth
from meshscale.topology.text import relation_matrix, summary
from meshscale.topology.schema import from_dict
from meshscale.units import format_bytes, gbps, is_digits

SERIES_KEYS = ("system", "interconnect", "variant", "label")  # row keys that split a scaling result into series


def topology_of(sources: list[Source]) -> Topology | None:
    """The topology the results were measured on: a 'topology' result, else the first meta.topology."""
    ordered = sorted(sources, key=lambda s: s.result.kind != "topology")
    for s in ordered:
        data = s.result.meta.get("topology")
        if isinstance(data, dict) and "nodes" in data:
            return from_dict(data, f"{s.label} (meta.topology)")
    return None


def topology_section(topo: Topology) -> Section:
    pid = slug("topology", topo.name)
    plot = Plot(pid, summary(topo), plots.to_svg(topology_figure(topo), pid),
                topology_verdict(topo), "per-pair relation as nvidia-smi topo -m prints it, and the line rate of "
                "the best route", relation_matrix(topo))
    return Section("Topology", [plot])


def _device(topo: Topology | None, x: Any) -> tuple[str | None, str]:
    """(node name in ``topo`` or None, display label) of a P2P row's src/dst: an index or a name (gpu3, worker1)."""
    label = rank_label(x, topo.device_kind if topo is not None else None)
    if isinstance(x, str) and not is_digits(x):
        return (x if topo is not None and x in topo.nodes else None), label
    name = None
    if topo is not None:
        name = next((d for d in topo.devices() if topo.nodes[d].index == int(x)), None)
    return name, label


def p2p_section(sources: list[Source], topo: Topology | None) -> Section:
    """Bandwidth and latency heatmaps per mode. Bidirectional rows carry both directions together, so their
    line rate is twice the per-direction one."""
    section = Section("Point-to-point")
    for s in sources:
        by_mode = defaultdict(list)
        for row in s.result.rows:
            by_mode[row.get("mode", "copy")].append(row)
        cpu = is_cpu_run(s.result.meta, s.result.machine, topo)
        for mode, rows in by_mode.items():
            ends = sorted({r["src"] for r in rows} | {r["dst"] for r in rows}, key=lambda x: (str(type(x)), x))
            names, labels = zip(*(_device(topo, x) for x in ends))
            both = 2 if str(mode).startswith("bi") else 1
            pair_rate = _staged_rate if mode == "staged" else pair_bandwidth
            rate_of = {(a, b): both * pair_rate(topo, na, nb) for a, na in zip(ends, names)
                       for b, nb in zip(ends, names) if na and nb and na != nb}
            for grid in plots.p2p_grids(rows, mode, ends, list(labels)):
                measure = "latency" if grid.low_is_good else "bandwidth"
                if grid.low_is_good:
                    verdict = Verdict("info", "small-message latency per pair; outliers point at a longer route")
                else:
                    if rate_of:  # the colours run up to the line rate: a full-rate pair is the top of the scale
                        grid.bound = gbps(max(rate_of.values()))
                    judged_rate_of, what = _judged_rates(mode, rate_of, s.result.rows)
                    verdict = p2p_verdict(rows, judged_rate_of, hints(s.result.env, topo, cpu), what)
                    if cpu and verdict.level in ("warn", "bad"):
                        verdict = Verdict("info", verdict.text.split(" — ")[0] + " — expected for CPU workers over "
                                          "Gloo (the line rate is an assumed shared-memory rate)")
                pid = slug("p2p", s.label, mode, measure)
                heading = f"P2P {measure}" if measure == mode else f"P2P {measure}, {mode}"
                section.plots.append(Plot(pid, f"{heading} ({s.label})",
                                          plots.to_svg(plots.heatmaps([grid]), pid), verdict))
    return section


def _judged_rates(mode: str, rate_of: dict, all_rows: list[dict[str, Any]]) -> tuple[dict, str]:
    """What a mode's pairs are judged against: staged copies against the host path (the host<->device copies
    measured in the same result, else the host links' line rate), the others against their line rate."""
    if mode != "staged":
        return rate_of, "line rate"
    measured = host_path_rates(all_rows)
    if measured:
        return measured, "host path measured in this run (device->host, then host->device)"
    return rate_of, "host path's PCIe line rate"


def _staged_rate(topo: Topology, src: str, dst: str) -> float:
    """Line rate of a copy staged through host memory: down to the host, then up, one after the other."""
    def to_host(gpu: str) -> float:
        return max(pair_bandwidth(topo, gpu, cpu) for cpu in topo.nodes_of("cpu") + topo.nodes_of("host"))
    return 1 / (1 / to_host(src) + 1 / to_host(dst))


def _curve(rows: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    rows = sorted((r for r in rows if r.get(key) is not None), key=lambda r: r["size_bytes"])
    return [r["size_bytes"] for r in rows], [r[key] for r in rows]


def collective_section(measured: list[Source], predicted: list[Source], topo: Topology | None,
                       system: str = "") -> Section:
    """busbw charts per collective; ``system``: predictions for that system alone, with its own link bound."""
    section = Section(f"Collectives predicted on {system} (not the measured machine)" if system
                      else "Collectives: bus bandwidth against message size")
    names = sorted({r["collective"] for s in measured + predicted for r in s.result.rows})
    for name in names:
        series, verdict = [], None
        for s in measured:
            rows = [r for r in s.result.rows if r["collective"] == name and not r.get("inplace")]
            rows = rows or [r for r in s.result.rows if r["collective"] == name]
            if not rows:
                continue
            kinds = sorted({(str(r.get("dtype")), str(r.get("redop"))) for r in rows})  # -d all / -o all
            for dtype, redop in kinds:
                part = [r for r in rows if (str(r.get("dtype")), str(r.get("redop"))) == (dtype, redop)]
                suffix = "".join(f" {w}" for w, n in ((dtype, {k[0] for k in kinds}), (redop, {k[1] for k in kinds}))
                                 if len(n) > 1)
                series.append(Series(f"measured {s.label}{suffix}", *_curve(part, "busbw_bytes_per_s")))
            if verdict is None:
                x, y = _curve(rows, "bound_busbw_bytes_per_s")
                if x:
                    series.append(Series(f"link bound ({s.label})", x, y, "bound"))
                verdict = measured_collective_verdict(s, name, topo)
        for s in predicted:
            rows = [r for r in s.result.rows if r["collective"] == name]
            x, y = _curve(rows, "bound_busbw_bytes_per_s")
            if system and x and not any(v.style == "bound" for v in series):
                series.append(Series(f"link bound ({system})", x, y, "bound"))
            if len({r["size_bytes"] for r in rows}) == len(rows):  # one prediction per size (the fastest algorithm)
                series.append(Series(f"predicted {s.label}", *_curve(rows, "busbw_bytes_per_s"), "predicted"))
                continue
            for algo in sorted({str(r.get("algorithm", "")) for r in rows}):
                part = [r for r in rows if str(r.get("algorithm", "")) == algo]
                series.append(Series(f"predicted {s.label}, {algo}", *_curve(part, "busbw_bytes_per_s"), "predicted"))
        verdict = verdict or Verdict("info", "prediction only: no measurement of this collective to compare with")
        # the measured curves and the bound on every chart; the predictions spread over charts of short legends
        fixed = [x for x in series if x.style != "predicted"]
        predictions = [[x] for x in series if x.style == "predicted"]
        if len(fixed) >= plots.MAX_LEGEND_ENTRIES:  # too many measured curves to repeat: every curve once
            fixed, predictions = [], [[x] for x in series]
        charts = plots.pack(predictions, plots.MAX_LEGEND_ENTRIES - len(fixed)) if predictions else [[]]
        for k, chart in enumerate(charts):
            part = f", part {k + 1} of {len(charts)}" if len(charts) > 1 else ""
            pid = slug("busbw", *([system] if system else []), name, *([k + 1] if part else []))
            figure = plots.busbw_chart(f"{name}: bus bandwidth{part}", fixed + chart)
            section.plots.append(Plot(pid, f"{name}{part}", plots.to_svg(figure, pid), verdict))
    return section


def measured_collective_verdict(source: Source, name: str, topo: Topology | None) -> Verdict:
    """The verdict on one collective of a measured run, as the report prints it (both placements: the better
    one counts)."""
    rows = [r for r in source.result.rows if r["collective"] == name]
    cpu = is_cpu_run(source.result.meta, source.result.machine, topo)
    verdict = collective_verdict(rows, hints(source.result.env, topo, cpu), cpu, _references(source, topo),
                                 per_call_floor_s(rows, source.result.meta))
    note = small_message_note([r for r in rows if not r.get("inplace")] or rows, source.result.meta)
    return Verdict(verdict.level, f"{verdict.text}. {note}") if note else verdict


def _references(source: Source, topo: Topology | None):
    """The expected figures of a measured run's rows: the corpus for its GPU model and count, the cost model on
    its topology."""
    gpus = [str(g) for g in (source.result.machine or {}).get("gpus") or []]
    model = gpus[0] if gpus else (topo.gpu_model if topo is not None and topo.device_kind == "gpu" else "")
    world = int(source.result.meta.get("world_size") or 0)
    if not world:
        return None
    return lambda row: references(topo, model, world, row["collective"], row["size_bytes"], bool(row.get("inplace")))


def _group(source: Source) -> str:
    meta = source.result.meta
    return str(meta.get("group") or meta.get("system") or "this machine")


def _split(source: Source, rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out = defaultdict(list)
    for r in rows:
        extra = dict.fromkeys(str(r[k]) for k in SERIES_KEYS if r.get(k) is not None)  # ordered, no repeats
        out[" ".join([source.label, *extra])].append(r)
    return out


def scaling_rows(result: Result) -> list[dict[str, Any]]:
    """The rows of a scale / predict result in one shape: mode is weak or strong (a sweep that names its
    exchange in "mode" says weak/strong in meta.scaling), throughput is the measured or the predicted one
    (`predict --from` rows), speedup and efficiency filled in against the smallest world where missing."""
    meta = result.meta
    default = meta.get("scaling") if meta.get("scaling") in ("weak", "strong") else \
        ("strong" if meta.get("weak") is False else "weak")
    rows = []
    for r in result.rows:
        throughput = r.get("throughput_samples_per_s", r.get("predicted_samples_per_s"))
        if r.get("world_size") is None or not throughput:
            continue
        mode = r["mode"] if r.get("mode") in ("weak", "strong") else default
        rows.append(dict(r, mode=mode, throughput_samples_per_s=throughput))
    for key in {(r["mode"], *(str(r.get(k)) for k in SERIES_KEYS)) for r in rows}:
        part = [r for r in rows if (r["mode"], *(str(r.get(k)) for k in SERIES_KEYS)) == key]
        base = min(part, key=lambda r: r["world_size"])
        for r in part:
            if r.get("speedup") is None:
                r["speedup"] = r["throughput_samples_per_s"] / base["throughput_samples_per_s"] * base["world_size"]
                r["efficiency"] = r["speedup"] / r["world_size"]
    return rows


def _legend(style: str, label: str) -> str:
    """'predicted' + a series label, saying it once: a file named whitepaper-predicted adds no second one."""
    words = [re.sub(rf"[-_ ]?{style}$", "", w) for w in label.split() if w != style]
    return " ".join([style, *(w for w in words if w)])


def scaling_section(sources: list[Source]) -> Section:
    section = Section("Scaling: throughput and speedup")
    groups = defaultdict(list)
    sources = [Source(s.label, Result(s.result.kind, scaling_rows(s.result), s.result.predicted, s.result.meta,
                                      s.result.machine, s.result.software, s.result.env)) for s in sources]
    for s in [s for s in sources if s.result.rows]:
        groups[_group(s)].append(s)
    for group, members in groups.items():
        modes = sorted({r["mode"] for s in members for r in s.result.rows})
        for mode in modes:
            if len({r["world_size"] for s in members for r in s.result.rows if r["mode"] == mode}) < 2:
                continue  # one world size is a single bar: no scaling to show
            bars, speedups, verdict, extra = [], [], None, []
            for s in members:
                style = "predicted" if s.result.predicted or s.result.kind == "predict" else "measured"
                rows = [r for r in s.result.rows if r["mode"] == mode]
                for label, part in _split(s, rows).items():
                    part = sorted(part, key=lambda r: r["world_size"])
                    x = [r["world_size"] for r in part]
                    bars.append(Series(f"{_legend(style, label)} (samples/s)", x,
                                       [r["throughput_samples_per_s"] for r in part], style))
                    if all(r.get("speedup") is not None for r in part):
                        speedups.append(Series(f"{_legend(style, label)} (speedup)", x, [r["speedup"] for r in part],
                                               style))
                if style == "measured" and rows and verdict is None:
                    first_label, first = next(iter(_split(s, rows).items()))
                    cpu = is_cpu_run(s.result.meta, s.result.machine)
                    # the prediction of the same series (system, variant): never one system against another
                    predicted_parts = {label: part for p in members if p.result.predicted or p.result.kind == "predict"
                                       for label, part in _split(p, [r for r in p.result.rows if r["mode"] == mode]).items()}
                    predicted = predicted_parts.get(first_label) or \
                        (next(iter(predicted_parts.values())) if len(predicted_parts) == 1 else [])
                    verdict = scaling_verdict(first, hints(s.result.env, cpu=cpu), predicted)
                    if s.result.meta.get("source"):  # published figures: a reference, not this machine's fault
                        verdict = Verdict("info", f"reference ({s.result.meta['source']}): {verdict.text.split(' — ')[0]}")
                    finding = scaling_gap(first, predicted)
                    if finding:
                        verdict = Verdict("warn" if verdict.level == "good" else verdict.level,
                                          f"{verdict.text}. {finding}")
                    parts = {k[:-2]: [r.get(k) or 0.0 for r in sorted(rows, key=lambda r: r["world_size"])]
                             for k in ("compute_s", "comm_s", "data_s", "idle_s") if any(r.get(k) for r in rows)}
                    if parts:
                        pid = slug("breakdown", group, mode)
                        worlds = sorted(r["world_size"] for r in rows)
                        chart = plots.breakdown_chart(f"{mode} scaling: step time breakdown ({s.label})", worlds, parts)
                        extra.append(Plot(pid, f"{group}: {mode} scaling, step time", plots.to_svg(chart, pid),
                                          Verdict("info", "compute, exposed communication, data loading and idle "
                                                          "(the host between operators) per step, adding up to it")))
            if verdict is None:
                last = [r for s in members for r in s.result.rows if r["mode"] == mode and r.get("efficiency") is not None]
                verdict = scaling_verdict(last, []) if last else Verdict("info", "prediction only")
                verdict = Verdict("info", f"predicted: {verdict.text.split(' — ')[0]}")
            # one group per series (its bars and speedup line), a chart per few groups: short legends
            lines = {s.label.replace("(samples/s)", "(speedup)"): s for s in speedups}
            groups_of = [[b] + ([lines[b.label.replace("(samples/s)", "(speedup)")]]
                               if b.label.replace("(samples/s)", "(speedup)") in lines else []) for b in bars]
            charts = plots.pack(groups_of, plots.MAX_LEGEND_ENTRIES - 1)  # room for the ideal line
            for k, chart in enumerate(charts):
                part = f", part {k + 1} of {len(charts)}" if len(charts) > 1 else ""
                pid = slug("scaling", group, mode, *([k + 1] if part else []))
                title = f"{group}: {mode} scaling{part}"
                chart_bars = [x for x in chart if x in bars]
                chart_lines = [x for x in chart if x not in chart_bars]
                section.plots.append(Plot(pid, title, plots.to_svg(plots.scaling_chart(title, chart_bars, chart_lines),
                                                                   pid), verdict, caption=SCALING_CAPTION))
            section.plots.extend(extra)
    return section


def train_runs_as_scale(sources: list[Source]) -> Source | None:
    """Separate `meshscale train` runs (e.g. one per node count from the Slurm script) as one scaling result:
    a point per run from its summary, speedup against the smallest run. Weak when every run has the same
    batch per rank, else strong."""
    summaries = [s.result.meta["summary"] for s in sources if isinstance(s.result.meta.get("summary"), dict)]
    summaries = sorted((x for x in summaries if x.get("samples_per_s") and x.get("world_size")),
                       key=lambda x: x["world_size"])
    if not summaries:
        return None
    mode = "weak" if len({x.get("batch_per_rank") for x in summaries}) == 1 else "strong"
    base = summaries[0]
    rows = []
    for x in summaries:
        speedup = x["samples_per_s"] / base["samples_per_s"] * base["world_size"]
        rows.append({"world_size": x["world_size"], "mode": mode, "batch_per_rank": x.get("batch_per_rank"),
                     "global_batch": x.get("global_batch"), "throughput_samples_per_s": x["samples_per_s"],
                     "speedup": speedup, "efficiency": speedup / x["world_size"], "step_time_s": x.get("step_time_s"),
                     "compute_s": x.get("compute_s"), "comm_s": x.get("comm_s"), "data_s": x.get("data_s"),
                     "comm_share": x.get("comm_share")})
    first = next(s.result for s in sources if isinstance(s.result.meta.get("summary"), dict))
    return Source("train runs", Result("scale", rows, False, {"group": "training runs"}, first.machine, first.software,
                                       first.env))


# what the scaling figures' efficiency and the error tables' columns mean, one sentence beside each
SCALING_CAPTION = ("Bars: throughput in samples/s (the global batch over the run's median step where the run timed its "
                   "steps); line: speedup, each throughput over the one-rank run's; the verdict's parallel efficiency "
                   "is that speedup divided by the ranks, 100% being linear scaling.")
VALIDATE_NOTE = ("Each row's error is (predicted - measured) / measured time; geomean |error| is the geometric mean of "
                 "its absolute value over a size class's rows, bound is the model's stated accuracy for that class "
                 "(docs/validate.md; for the worst row, how many times off it may be), and within says whether the "
                 "geomean (or the worst row) stays inside that bound.")
PREDICTED_SCALING_NOTE = ("speedup = predicted samples/s over the series' smallest configuration's, times its GPU count "
                          "(one GPU's speedup is 1); efficiency = speedup / GPUs, 100% being linear scaling.")

TRAIN_SUMMARY = (("samples_per_s", "samples/s"), ("step_time_s", "step"), ("split_step_time_s", "step of the split"),
                 ("compute_s", "compute"), ("comm_s", "communication"), ("bubble_s", "pipeline bubble"),
                 ("data_s", "data loading"), ("idle_s", "idle"), ("comm_share", "communication share"),
                 ("eval_accuracy", "test accuracy"), ("eval_loss", "test loss"))


def train_section(sources: list[Source]) -> Section:
    """Training runs (`meshscale train`): the loss of every step, and each run's time split and final accuracy."""
    runs = [s for s in sources if s.result.rows and any("loss" in r for r in s.result.rows)]
    section = Section("Training: loss per step, time split and accuracy")
    if runs:
        series = [Series(s.label, [r["step"] for r in s.result.rows if "loss" in r],
                         [r["loss"] for r in s.result.rows if "loss" in r]) for s in runs]
        title = "training loss" + (f": {runs[0].label}" if len(runs) == 1 else "")
        verdict = Verdict("info", "the loss of each step on rank 0 (no fit, no smoothing)")
        pid = slug("loss", *[s.label for s in runs])
        section.plots.append(Plot(pid, title, plots.to_svg(plots.loss_chart(title, series), pid), verdict))
    for s in sources:
        summary = s.result.meta.get("summary") or {}
        row = {"run": s.label, "ranks": summary.get("world_size", "-")}
        for key, name in TRAIN_SUMMARY:
            value = summary.get(key)
            row[name] = "-" if value is None else (f"{100 * value:.1f}%" if key in ("comm_share", "eval_accuracy")
                                                   else f"{value:,.1f}" if key == "samples_per_s"
                                                   else f"{value:.3f}" if key == "eval_loss" else _cell(key, value))
        section.table.append(row)
    return section


def dimension_section(sources: list[Source]) -> Section:
    """Layout runs: each parallel dimension's communication per step, its busy and exposed time (measured)."""
    table = []
    for s in sources:
        summary = s.result.meta.get("summary") or {}
        for dim, c in (summary.get("comm_by_dimension") or {}).items():
            table.append({"run": s.label, "layout": summary.get("layout", "-"), "dimension": dim,
                          "operations": "-" if c.get("operations") is None else f"{c['operations']:.0f}",
                          "bytes": _cell("bytes", c.get("bytes")), "busy": _cell("busy_s", c.get("seconds")),
                          "exposed": _cell("exposed_s", c.get("exposed_seconds"))})
    return Section("Training: communication per parallel dimension and step (busy: running; exposed: not hidden "
                   "behind compute)", table=table)


def place_section(source: Source) -> Section:
    """A placement (`meshscale place`): the candidate GPU subsets, best first, and why the first was chosen."""
    meta = source.result.meta
    table = [{"rank": r.get("rank"), "GPUs": ",".join(map(str, r.get("devices") or [])),
              "busbw": _cell("busbw_bytes_per_s", r.get("busbw_bytes_per_s")), "time": _cell("time_s", r.get("time_s")),
              "bound": _cell("bound_busbw_bytes_per_s", r.get("bound_busbw_bytes_per_s")),
              "path": r.get("path_type", "-"), "algorithm": r.get("algorithm", "-"),
              "why": "; ".join(meta.get("why") or []) if r.get("rank") == 1 else ""} for r in source.result.rows]
    return Section(f"Placement (predicted): {meta.get('gpus', '?')} of {meta.get('system', '?')}'s GPUs for "
                   f"{format_bytes(int(meta.get('size_bytes') or 0))}, best of {meta.get('subsets', '?')} subsets first",
                   table=table)


def validate_section(source: Source) -> Section:
    """The model's error against measurements (`meshscale validate` of the corpus, or of this run's sweep): the
    geometric-mean |error| per size class against its bound, and the worst row."""
    summary = source.result.meta.get("summary", {})
    table = [{"size class": name, "rows": c["rows"],
              "geomean |error|": "-" if c.get("geomean_abs_error") is None else f"{100 * c['geomean_abs_error']:.1f}%",
              "bound": f"{100 * c['bound']:.0f}%", "within": "-" if not c["rows"] else ("yes" if c["passed"] else "no")}
             for name, c in summary.get("groups", {}).items()]
    worst = next((r for r in source.result.rows if r.get("row") == summary.get("worst_row")), None)
    if worst:
        bound = summary["bounds"]["worst_times_off"]
        table.append({"size class": "worst row", "rows": 1,
                      "geomean |error|": f"{worst['collective']} {worst['size_bytes']} B: {100 * worst['error']:+.1f}%",
                      "bound": f"{bound:.0f}x", "within": "yes" if summary["worst_times_off"] <= bound else "no"})
    where = source.result.meta.get("corpus", "")
    return Section(f"Model against measurement ({'this run' if where == 'this run' else 'the corpus'}): "
                   "geomean |error| per size class", table=table, note=VALIDATE_NOTE)


def host_copy_section(source: Source) -> Section:
    """Host<->device copy bandwidth of one GPU, pinned and pageable, as a table."""
    table = [{"direction": r["direction"], "host memory": r["memory"], "size": format_bytes(r["size_bytes"]),
              "bandwidth": f"{r['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s", "time per copy": f"{1e3 * r['seconds']:.2f} ms"}
             for r in source.result.rows]
    return Section(f"Host <-> device copies ({source.result.meta.get('gpu', 'GPU')}, CUDA events, "
                   f"{source.result.meta.get('iters', '?')} copies each)", table=table)


def profile_section(source: Source) -> Section:
    """A single-GPU training profile (`train --profile-batches`): step time per batch size."""
    meta = source.result.meta
    table = [{"batch per GPU": r["batch_per_rank"], "step time": f"{1e3 * r['step_time_s']:.1f} ms" if r.get("step_time_s") else "-",
              "samples/s": f"{r['samples_per_s']:.0f}" if r.get("samples_per_s") else "-"} for r in source.result.rows]
    return Section(f"Single-GPU training profile: {meta.get('model', '?')} on {meta.get('device', '?')} "
                   f"({meta.get('precision', '?')})", table=table)


def _cell(key: str, value: Any) -> Any:
    """A table cell in the unit its key names: bytes/s as GB/s, bits/s as Gb/s, seconds as us or ms."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-" if value is None else value
    if key.endswith("bytes_per_s"):
        return f"{value / 1e9:.1f} GB/s"
    if key.endswith("bits_per_s"):
        return f"{value / 1e9:.0f} Gb/s"
    if key.endswith("_s"):
        return f"{1e6 * value:.1f} us" if value < 1e-3 else f"{1e3 * value:.2f} ms"
    if key.endswith("bytes"):
        return format_bytes(int(value))
    return f"{value:.3g}" if isinstance(value, float) else value


def _words(key: str) -> str:
    """A row key as a column heading: unit suffixes dropped (the cell carries the unit), underscores as spaces."""
    return re.sub(r"_(bytes_per_s|bits_per_s|s|bytes)$", "", key).replace("_", " ")


def cluster_section(source: Source) -> Section:
    """A `predict cluster` sizing: one fat tree's switches, bandwidths and latency, as a table."""
    meta = source.result.meta
    table = [{_words(k): _cell(k, v) for k, v in row.items()} for row in source.result.rows]
    return Section(f"Cluster (predicted): {meta.get('node', '?')} nodes over {meta.get('link', '?')}, "
                   f"{source.label}", table=table)


def plan_section(source: Source) -> Section:
    """A collective plan: the chosen schedule and every candidate the model weighed, fastest first."""
    row, meta = source.result.rows[0], source.result.meta
    table = [{"algorithm": f"{row['algorithm']} (chosen)", "time": _cell("time_s", row["time_s"]),
              "busbw": _cell("busbw_bytes_per_s", row["busbw_bytes_per_s"]),
              "bottleneck": row.get("bottleneck") or "-"}]
    table += [{"algorithm": c["algorithm"], "time": _cell("time_s", c["time_s"]),
               "busbw": _cell("busbw_bytes_per_s", c["busbw_bytes_per_s"]), "bottleneck": ""}
              for c in sorted(meta.get("candidates") or [], key=lambda c: c["time_s"]) if c["algorithm"] != row["algorithm"]]
    return Section(f"Plan (predicted): {row['collective']} of {format_bytes(row['size_bytes'])} on "
                   f"{meta.get('system', '?')}, {len(meta.get('ranks') or [])} ranks", table=table)


def predict_section(sources: list[Source]) -> Section:
    """Predicted scaling as numbers (predicted, not measured): throughput, speedup and efficiency per series."""
    table = []
    for s in sources:
        for r in sorted(scaling_rows(s.result), key=lambda r: (str(r.get("variant", "")), r["world_size"])):
            series = " ".join(dict.fromkeys(str(r[k]) for k in SERIES_KEYS if r.get(k) is not None)) or s.label
            table.append({"series": series, "mode": r["mode"], "GPUs": r["world_size"],
                          "samples/s": f"{r['throughput_samples_per_s']:.0f}",
                          "speedup": _cell("speedup", r.get("speedup")),
                          "efficiency": "-" if r.get("efficiency") is None else f"{100 * r['efficiency']:.0f}%"})
    return Section("Predicted scaling (not measured)", table=table, note=PREDICTED_SCALING_NOTE)


def io_section(source: Source) -> Section:
    """`bench io`: storage, decoding and the GPUs' demand side by side in samples/s, and which one limits."""
    meta, columns = source.result.meta, ("readers", "time_s", "files_per_s", "read_bytes_per_s", "samples_per_s")
    table = [{"stage": r["stage"] + (" (PREDICTED)" if r.get("predicted") else ""),
              **{c: "-" if r.get(c) is None else f"{r[c]:,.3g}" if c == "time_s" else f"{r[c]:,.0f}" for c in columns}}
             for r in source.result.rows]
    return Section(f"Input pipeline of {meta.get('path')} ({source.label}): the limit is {meta.get('limit')}",
                   table=table)


def sections(sources: list[Source]) -> list[Section]:
    """Every section the results support, in reading order; kinds with no figure are listed as tables."""
    by_kind = defaultdict(list)
    for s in sources:
        by_kind[s.result.kind].append(s)
    out = []
    topo = topology_of(sources)
    if topo is not None:
        out.append(topology_section(topo))
    if by_kind["bench-p2p"]:
        out.append(p2p_section(by_kind["bench-p2p"], topo))
    if by_kind["bench-pairs"]:
        out += [pairs_section(s) for s in by_kind["bench-pairs"]]
    # a one-rank "collective" exchanges nothing: its busbw is zero or meaningless, so it draws no curve
    collectives = [s for s in by_kind["bench-collective"] if s.result.meta.get("world_size") != 1]
    # a prediction for another system than the measured one goes beside the measured charts, not on them
    here = [s for s in by_kind["sim"] if not collectives or topo is None or s.result.meta.get("system") == topo.name]
    if collectives or here:
        out.append(collective_section(collectives, here, topo))
    elsewhere = defaultdict(list)
    for s in by_kind["sim"]:
        if s not in here:
            elsewhere[str(s.result.meta.get("system", "?"))].append(s)
    for system, sims in sorted(elsewhere.items()):
        out.append(collective_section([], sims, None, system))
    for s in by_kind["bench-host-copy"]:
        out.append(host_copy_section(s))
    for s in by_kind["train"]:
        if s.result.meta.get("profile"):
            out.append(profile_section(s))
        trace = ((s.result.meta.get("config") or {}).get("logging") or {}).get("trace")
        if trace:  # `train --trace`: the timeline of a few steps, for a trace viewer
            out.append(Section(f"Timeline ({s.label})", table=[{"Chrome trace": trace,
                                                                 "open with": "https://ui.perfetto.dev or chrome://tracing"}]))
    runs_trained = [s for s in by_kind["train"] if not s.result.meta.get("profile")]
    if runs_trained:
        out.append(train_section(runs_trained))
        if any((s.result.meta.get("summary") or {}).get("comm_by_dimension") for s in runs_trained):
            out.append(dimension_section(runs_trained))
    runs = train_runs_as_scale(by_kind["train"])
    if by_kind["scale"] or by_kind["predict"] or runs:
        out.append(scaling_section(by_kind["scale"] + by_kind["predict"] + ([runs] if runs else [])))
    if by_kind["predict"]:
        out.append(predict_section(by_kind["predict"]))
    for s in by_kind["plan"]:
        out.append(plan_section(s))
    for s in by_kind["place"]:
        out.append(place_section(s))
    for s in by_kind["cluster"]:
        out.append(cluster_section(s))
    for s in by_kind["validate"]:
        out.append(validate_section(s))
    for s in by_kind["bench-io"]:
        out.append(io_section(s))
    for s in by_kind["doctor"]:
        out.append(Section("Doctor: driver, links, shared memory, NCCL knobs, network, versions", table=s.result.rows))
    return out
