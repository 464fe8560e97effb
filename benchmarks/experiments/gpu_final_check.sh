#!/usr/bin/env bash
# The checks a session ends with on a multi-GPU kind: the GPU tests, then the tour and its verdicts beside
# nccl-tests (benchmarks/experiments/tour_verdicts.py). Usage on the device: bash benchmarks/experiments/gpu_final_check.sh REFERENCE.txt
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-/tmp/meshscale-out}"; mkdir -p "$OUT"
nvidia-smi -L
(time timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests) > "$OUT/pytest-gpu.txt" 2>&1
tail -12 "$OUT/pytest-gpu.txt"
(time timeout 200 python3 -m meshscale tour --output /tmp/tour) > "$OUT/tour.txt" 2>&1
tail -12 "$OUT/tour.txt"
python3 benchmarks/experiments/tour_verdicts.py /tmp/tour "$1" > "$OUT/tour-verdicts.txt" 2>&1; echo "tour_verdicts exit $?"
python3 benchmarks/experiments/tour_verdicts.py /tmp/tour "$1" --min-bytes 16M > "$OUT/tour-verdicts-16M-up.txt" 2>&1
cut -c1-160 "$OUT/tour-verdicts.txt"
tar czf "$OUT/tour.tgz" -C /tmp tour
