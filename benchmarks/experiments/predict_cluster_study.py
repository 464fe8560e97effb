"""Cluster study: ResNet-50 (32 images per GPU) and GPT-2 small (4 sequences of 1024 tokens per GPU), weak scaling, from 1 to 124 DGX-1 (P100)
nodes, 4x EDR InfiniBand vs 2x 10 GbE, ring vs hierarchical all-reduce, DDP overlap. Writes a Markdown table and
a plot. Run: python benchmarks/experiments/predict_cluster_study.py docs/results"""
import sys
from pathlib import Path

from meshscale.plots import rows_scaling_chart, save
from meshscale.predict.scaling import Job, predict_cluster, profile_for
from meshscale.topology import load_system
from meshscale.topology.cluster import ClusterSpec
from meshscale.models.registry import get_model

NODES = [1, 2, 4, 8, 16, 32, 64, 124]
out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
lines = ["| model | network | all-reduce | " + " | ".join(f"{n} nodes" for n in NODES) + " | stops scaling |",
         "|---|---|---|" + "---|" * len(NODES) + "---|"]
for name, batch in (("resnet50", 32), ("gpt-small", 4)):
    spec = get_model(name)
    rows = []
    for link, nics in (("edr", 4), ("10gbe", 2)):
        for algorithm in ("ring", "hierarchical"):
            job = Job(name, spec.params, profile_for(load_system("dgx1-p100"), None, spec.flops_per_sample), batch,
                      algorithm=algorithm)
            got = predict_cluster(job, ClusterSpec("dgx1-p100", 1, nics, link), NODES)
            variant = f"{link} {algorithm}"
            rows += [dict(r, variant=variant) for r in got]
            # "stops scaling": the first count where doubling the nodes adds under half of ideal throughput
            stop = next((f"{b['nodes']} nodes" for a, b in zip(got, got[1:])
                         if (b["throughput_samples_per_s"] / a["throughput_samples_per_s"] - 1)
                         < 0.5 * (b["nodes"] / a["nodes"] - 1)), "scales to 124")
            cells = " | ".join(f"{r['throughput_samples_per_s']:,.0f} ({r['efficiency']:.0%})" for r in got)
            lines.append(f"| {name} | {link} x{nics} | {algorithm} | {cells} | {stop} |")
    save(rows_scaling_chart(rows, f"{name} on DGX-1 P100 clusters, {batch}/GPU weak", predicted=True),
         out / f"cluster-study-{name}.png")
(out / "cluster-study-table.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
