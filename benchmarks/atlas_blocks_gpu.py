"""Measure the kernel atlas's compiled blocks alone (`meshscale.train.blocks`) into a copy of the shipped H100
atlas, its other figures kept, and print each block beside the bytes the step model counts for it.

  PYTHONPATH=src:/tmp/ao python3 benchmarks/atlas_blocks_gpu.py OUT.json [ATLAS.json]

(`meshscale bench kernels --output FILE` measures the whole atlas, these blocks included.)"""
import sys
import time
from dataclasses import replace

import torch

from meshscale.train.blocks import measure_blocks
from meshscale.models.atlas import load_atlas
from meshscale.predict.training.step import compiled_block_bytes


def main() -> None:
    out = sys.argv[1]
    atlas = load_atlas(sys.argv[2] if len(sys.argv) > 2 else "src/meshscale/models/atlas/h100-sxm-80gb.json")
    t0 = time.time()
    print(torch.cuda.get_device_name(0), torch.__version__, flush=True)
    blocks = measure_blocks(torch.device("cuda", 0), progress=lambda w: print(w, flush=True))
    with open(out, "w") as f:
        f.write(replace(atlas, blocks=tuple(blocks)).to_json())
    rate = atlas.memory_bandwidth_bytes_per_s * atlas.stream_fraction
    for p in blocks:
        nbytes = compiled_block_bytes(p)
        print(f"{p.style:8s} {p.precision:15s} {'c' if p.compiled else 'e'} d{p.d_model} kv{p.kv_heads} "
              f"b{p.batch}x{p.seq_len}: elementwise {p.elementwise_s * 1e3:7.2f} ms ({p.elementwise_kernels} kernels) "
              f"matmul {p.matmul_s * 1e3:7.2f} attention {p.attention_s * 1e3:6.2f} | model bytes "
              f"{nbytes / 1e9:6.2f} GB -> {nbytes / rate * 1e3:6.2f} ms, ratio {p.elementwise_s * rate / nbytes:5.2f}",
              flush=True)
    print(f"total {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
