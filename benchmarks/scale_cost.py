"""How the cost of a prediction grows with the cluster: `predict` (ResNet-50, hgx-h100 nodes, 8 NDR NICs each)
and `sim` (one all_reduce size) at 8 to 2,048 nodes (16,384 GPUs) and 12,500 nodes (100,000 GPUs, on 128-port
switches), each in a fresh process as a command runs. Targets: 16,384 GPUs under 10 s, 100k GPUs under 60 s on a
2-core machine; and `place` of 8 of a DGX-2's 16 GPUs (target under 5 s). Prints the seconds of the prediction (after the imports) and its ratio to 8 nodes, the seconds of
the whole process (imports included), and NCCL's pick.

Run: PYTHONPATH=src python benchmarks/scale_cost.py [--quick]   (--quick: up to 256 nodes)
"""
import subprocess
import sys
import time

PREDICT = """
import time
from meshscale.predict.scaling import Job, predict_cluster, profile_for
from meshscale.topology import load_system
from meshscale.topology.cluster import ClusterSpec
from meshscale.models.registry import get_model
spec = get_model("resnet50")
start = time.perf_counter()
job = Job("resnet50", spec.params, profile_for(load_system("hgx-h100"), None, spec.flops_per_sample, model="resnet50"), 64)
row = predict_cluster(job, ClusterSpec("hgx-h100", 1, 8, "ndr", radix={radix}), [{nodes}])[0]
print(f"{{time.perf_counter() - start:.2f}}", row["nccl_algo"], f"efficiency {{row['efficiency']:.1%}}")
"""
SIM = """
import time
from meshscale.simulate import predict_collective
from meshscale.topology.cluster import system_or_cluster
start = time.perf_counter()
topo = system_or_cluster("hgx-h100", {nodes}, "ndr", 8, radix={radix})
r = predict_collective(topo, "all_reduce", [topo.nodes[d].index for d in topo.devices()], 1 << 30)
print(f"{{time.perf_counter() - start:.2f}}", r.detail, f"busbw {{r.busbw_bytes_per_s / 1e9:.1f}} GB/s")
"""
PLACE = """
import time
from meshscale.simulate.placement import rank_placements
from meshscale.topology import load_system
start = time.perf_counter()
ranked = rank_placements(load_system("dgx2"), 8)
print(f"{{time.perf_counter() - start:.2f}}", f"{{len(ranked)}} subsets, best {{ranked[0].devices}}")
"""


def timed(code: str) -> tuple[float, float, str]:
    """(seconds of the whole process, seconds of the prediction after the imports, what it printed)."""
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    took = time.perf_counter() - start
    if out.returncode:
        return took, took, "failed: " + (out.stderr.strip().splitlines() or ["?"])[-1]
    inner, _, said = out.stdout.strip().partition(" ")
    return took, float(inner), said


def main() -> None:
    sizes = [8, 64, 256] if "--quick" in sys.argv else [8, 64, 256, 2048, 12500]
    for name, code in (("predict", PREDICT), ("sim", SIM)):
        base = None
        for nodes in sizes:
            radix = 128 if nodes > 8192 else None  # a three-level tree of 64-port switches holds 8,192 nodes
            took, inner, said = timed(code.format(nodes=nodes, radix=radix))
            base = base or inner
            print(f"{name:8} {nodes:6} nodes {nodes * 8:7} GPUs: prediction {inner:6.2f} s (x{inner / base:5.1f} of 8 "
                  f"nodes), process {took:6.2f} s  {said}", flush=True)
    took, inner, said = timed(PLACE)  # target: under 5 s
    print(f"place    dgx2, 8 of 16 GPUs: {inner:6.2f} s, process {took:6.2f} s  {said}")


if __name__ == "__main__":
    main()
