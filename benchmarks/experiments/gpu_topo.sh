#!/usr/bin/env bash
# meshscale topo on a GPU machine: this machine's topology as matrix, JSON, SVG and PNG, written into "$OUT",
# next to nvidia-smi's own view, and a check that every GPU-GPU cell of our matrix equals nvidia-smi topo -m.
# Expected on 2x H200 (NVLink 4 through NVSwitch): NV18 between every pair, 18 links per GPU.
#   OUT=/some/dir bash benchmarks/experiments/gpu_topo.sh      (MESHSCALE / PYTHON override the commands)
set -euo pipefail
OUT="${OUT:-docs/results/gpu-topo}"
MESHSCALE="${MESHSCALE:-meshscale}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT"

nvidia-smi topo -m > "$OUT/nvidia-smi-topo-m.txt" 2>&1 || true
nvidia-smi nvlink -s > "$OUT/nvidia-smi-nvlink-s.txt" 2>&1 || true
$MESHSCALE topo | tee "$OUT/topo-matrix.txt"
$MESHSCALE topo --format json -o "$OUT/topo.json"
$MESHSCALE topo --format svg -o "$OUT/topo.svg"
$MESHSCALE topo --format png -o "$OUT/topo.png"

"$PYTHON" - "$OUT" <<'PY' | tee "$OUT/check.txt"
import re, sys
from pathlib import Path
from meshscale.topology import load, relation
out = Path(sys.argv[1])
topo = load(out / "topo.json")
gpus = topo.gpus()
print(f"{len(gpus)} GPUs; NVLinks per GPU: {[topo.nvlink_count(g) for g in gpus]}; "
      f"NVSwitches: {len(topo.nodes_of('nvswitch'))}; unsupported NVML calls: {topo.attrs.get('nvml_unsupported')}")
smi = [l.split() for l in (out / "nvidia-smi-topo-m.txt").read_text().splitlines() if re.match(r"\s*GPU\d+\s", l)]
bad = 0
for row in smi:
    i = int(row[0][3:])
    for j, cell in enumerate(row[1:1 + len(smi)]):
        ours = relation(topo, i, j)
        if ours != cell:
            bad += 1
            print(f"MISMATCH GPU{i}-GPU{j}: meshscale {ours}, nvidia-smi {cell}")
print(f"compared {len(smi) ** 2} GPU cells with nvidia-smi topo -m: {bad} mismatches")
sys.exit(1 if bad or not smi else 0)
PY
