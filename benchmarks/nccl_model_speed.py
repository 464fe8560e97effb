"""Time NCCL's cost model on a 124-node x 8-GPU DGX-1 cluster (target: a prediction in under 5 s) and on one
node. Run: python benchmarks/nccl_model_speed.py"""
import time

from meshscale.simulate.cost import Call
from meshscale.simulate.fabric import Fabric
from meshscale.topology import load_system
from meshscale.topology.cluster import ClusterSpec, build_cluster, plan_cluster

start = time.perf_counter()
cluster = build_cluster(plan_cluster(ClusterSpec("dgx1-p100", 124, 4, "edr")))
built = time.perf_counter()
ranks = [cluster.nodes[d].index for d in cluster.devices()]
r = Fabric(cluster).cost(Call("all_reduce", 100 << 20, tuple(ranks)))
done = time.perf_counter()
print(f"124 x 8 DGX-1 cluster: build {built - start:.2f} s; all_reduce of 100 MiB over {len(ranks)} ranks predicted "
      f"in {done - built:.2f} s: {r.time_s * 1e3:.2f} ms, busbw {r.busbw_bytes_per_s / 1e9:.1f} GB/s ({r.detail})")
node = load_system("hgx-h100")
start = time.perf_counter()
for size in (1 << k for k in range(10, 31)):
    Fabric(node).cost(Call("all_reduce", size, tuple(list(range(8)))))
print(f"hgx-h100 all_reduce sweep 1K..1G (21 sizes): {time.perf_counter() - start:.3f} s")
