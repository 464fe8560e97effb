"""How long `meshscale predict --search` takes to rank every layout of Llama 3.1 405B on 16,384 GPUs of
hgx-h100 (2,048 nodes, 8 x NDR per node) at a global batch of 2,048 sequences of 8,192 tokens. The bound: under
60 s on a 2-core machine.   PYTHONPATH=src python benchmarks/predict_training_search_speed.py"""
from __future__ import annotations

import time

from meshscale.predict.question import PredictRequest
from meshscale.predict.request import predict_training

BOUND_S = 60.0


def main() -> None:
    start = time.perf_counter()
    found, _ = predict_training(PredictRequest(model="llama3-405b", system="hgx-h100", gpus=(16384,), seq_len=8192, precision="bf16",
                                                global_batch=2048, search=True))
    took = time.perf_counter() - start
    fits = [p for p in found if p.fits]
    print(f"{len(found)} layouts ranked ({len(fits)} fit) in {took:.1f} s (bound {BOUND_S:.0f} s): "
          + ("ok" if took < BOUND_S else "TOO SLOW"))
    for p in fits[:5]:
        print(f"  {p.job.layout.describe():60s} {p.job.checkpointing:9s} {p.tokens_per_s_per_gpu:8,.0f} tokens/s/GPU "
              f"MFU {p.mfu:.1%}  {p.memory.total_bytes / 2**30:5.1f} GiB  {p.why()}")


if __name__ == "__main__":
    main()
