"""Time one prediction for a 124-node x 8-GPU DGX-1 cluster (target: under 5 s). Run: python benchmarks/predict_speed.py"""
import time

from meshscale.predict import PredictRequest, predict_rows

for name in ("resnet50", "gpt-small"):
    start = time.perf_counter()
    for nccl_algo in ("ring", "tree"):
        rows, _, _ = predict_rows(PredictRequest(model=name, system="dgx1-p100", nodes=(124,), link="edr", nics=4,
                                                 batch=32, nccl_algo=nccl_algo))
    took = time.perf_counter() - start
    print(f"{name}: 124 x 8 GPUs, ring + tree: {took:.3f} s ({rows[-1]['throughput_samples_per_s']:,.0f} samples/s)")
