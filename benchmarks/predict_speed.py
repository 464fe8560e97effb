"""Time one prediction for a 124-node x 8-GPU DGX-1 cluster (target: under 5 s). Run: python benchmarks/predict_speed.py"""
import time

from meshscale.predict.scaling import Job, predict_cluster, profile_for
from meshscale.topology import load_system
from meshscale.topology.cluster import ClusterSpec
from meshscale.models.registry import get_model

for name in ("resnet50", "gpt-small"):
    spec = get_model(name)
    start = time.perf_counter()
    job = Job(name, spec.params, profile_for(load_system("dgx1-p100"), None, spec.flops_per_sample), 32)
    for algorithm in ("ring", "hierarchical"):
        job.algorithm = algorithm
        rows = predict_cluster(job, ClusterSpec("dgx1-p100", 1, 4, "edr"), [124])
    took = time.perf_counter() - start
    print(f"{name}: 124 x 8 GPUs, ring + hierarchical: {took:.3f} s ({rows[-1]['throughput_samples_per_s']:,.0f} samples/s)")
