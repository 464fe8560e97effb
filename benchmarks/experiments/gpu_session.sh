#!/usr/bin/env bash
# One device call runs several stages and packs every output into "$OUT/results.tgz" (the device tool returns
# at most 8 files). Usage on the GPU machine, from the checkout:
#   STAGES="topo bench mvn gputests" bash benchmarks/experiments/gpu_session.sh
# Stages: topo (benchmarks/experiments/gpu_topo.sh), bench (bench_vs_nccl_tests.py), mvn (meshscale_vs_nccl.py),
# gputests (pytest -m gpu), train (train_scaling.sh), profile (single-GPU ResNet-50 profile), predict
# (prediction of this machine from profile + p2p, then compare with the measured scale run), tour, benchnccl
# (bench_vs_nccl_tests.py --impl nccl), paths (small_message_paths.py), cloop (nccl_c_loop.cu), skew (start_skew.py), smallnccl (1K-1M,
# three --impl nccl runs and one native beside the C loop and the reference).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT="${OUT:-/tmp/meshscale-out}"
RES=/tmp/meshscale-results
mkdir -p "$RES" "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHON=python3
meshscale() { python3 -m meshscale "$@"; }
export -f meshscale
GPUS_N=$(python3 -c 'import torch; print(torch.cuda.device_count())')
ALL=$(python3 -c "print(','.join(str(2**i) for i in range(8) if 2**i <= $GPUS_N))")
stage() { echo "=== stage $1 ($(date +%T))"; }
# Each stage gets at most STAGE_TIMEOUT seconds so that the archive is always written before the call's limit.
STAGE_TIMEOUT="${STAGE_TIMEOUT:-500}"
for s in ${STAGES:-topo bench mvn gputests}; do
  stage "$s"
  case "$s" in
    topo)     OUT="$RES/topo" MESHSCALE=meshscale bash benchmarks/experiments/gpu_topo.sh 2>&1 | tail -8 ;;
    bench)    python3 benchmarks/bench_vs_nccl_tests.py "$RES/bench" 2>&1 | tail -60 ;;
    mvn)      python3 benchmarks/experiments/meshscale_vs_nccl.py "$RES/mvn" 2>&1 | tail -30 ;;
    gputests) timeout "$STAGE_TIMEOUT" python3 -m pytest -q -m gpu -p no:cacheprovider ${GPUTEST_K:+-k "$GPUTEST_K"} tests 2>&1 | tail -25 ;;
    benchnccl) # the sweep with NCCL called directly (--impl nccl), as nccl-tests calls it; with the cloop stage
              # first, small-messages.md sets it beside the C loop of the same call and the reference
              timeout "$STAGE_TIMEOUT" python3 benchmarks/bench_vs_nccl_tests.py "$RES/bench-nccl" --impl nccl --no-p2p 2>&1 | tail -75
              [ -f "$RES/nccl-c-loop.txt" ] && python3 benchmarks/experiments/small_message_table.py --c-loop "$RES/nccl-c-loop.txt" \
                --bench "impl nccl=$RES/bench-nccl/bench-collective.json" > "$RES/bench-nccl/small-messages.md" ;;
    smallnccl) # small messages (1K-1M), three --impl nccl sweeps and one native, set beside the reference and the C
              # loop of the same call (run the cloop stage first): small-messages.md takes the median of the runs
              for i in 1 2 3; do timeout 150 python3 benchmarks/bench_vs_nccl_tests.py "$RES/small/nccl-$i" --impl nccl --no-p2p --max-bytes 1M 2>&1 | tail -2; done
              timeout 150 python3 benchmarks/bench_vs_nccl_tests.py "$RES/small/native" --no-p2p --max-bytes 1M 2>&1 | tail -2
              python3 benchmarks/experiments/small_message_table.py $([ -f "$RES/nccl-c-loop.txt" ] && echo --c-loop "$RES/nccl-c-loop.txt") \
                --bench "impl nccl=$RES/small/nccl-1/bench-collective.json,$RES/small/nccl-2/bench-collective.json,$RES/small/nccl-3/bench-collective.json" \
                --bench "native=$RES/small/native/bench-collective.json" | tee "$RES/small-messages.md" ;;
    cloop)    # NCCL from a C loop in both nccl-tests launch configurations (one thread for all GPUs / one process each)
              NCCL_LIB=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))")
              nvcc -O2 -o /tmp/nccl_c_loop benchmarks/experiments/nccl_c_loop.cu -L"$NCCL_LIB" -l:libnccl.so.2 -Xlinker -rpath="$NCCL_LIB" \
                && for m in threads procs; do timeout 60 /tmp/nccl_c_loop $m "$GPUS_N"; done 2>&1 | tee "$RES/nccl-c-loop.txt" ;;
    skew)     timeout 120 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/experiments/start_skew.py 2>&1 \
                | grep -v "^W\|^\*\|OMP_NUM" | tee "$RES/start-skew.txt" ;;
    launchab) # the same small all_reduce sweep under torchrun and under meshscale's own launcher, with several warm-up and
              # iteration counts (the JSON keeps every rank's time)
              args="bench collective all_reduce --impl nccl -b 1K -e 16K -f 4 -a 1"
              for wn in "-w 5 -n 20" "-w 20 -n 20" "-w 5 -n 200"; do
                echo "--- torchrun $wn"; timeout 90 python3 -m torch.distributed.run --standalone --nproc-per-node 2 -m meshscale $args $wn 2>&1 | grep -E "^│ +[0-9]+ " | cut -c1-62
                echo "--- launcher $wn"; timeout 90 python3 -m meshscale $args $wn --gpus 2 2>&1 | grep -E "^│ +[0-9]+ " | cut -c1-62
              done ;;
    cinpy)    # the same ncclAllReduce launched from Python and from a C loop inside the same torch process
              NCCL_LIB=$(python3 -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'lib'))")
              gcc -O2 -shared -fPIC -o /tmp/libnccl_loop.so benchmarks/experiments/nccl_loop_lib.c -L"$NCCL_LIB" -l:libnccl.so.2 -Wl,-rpath="$NCCL_LIB" \
                && timeout 120 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/experiments/python_vs_c_launch.py \
                /tmp/libnccl_loop.so 2>&1 | grep -v "^W\|^\*\|OMP_NUM" | tee "$RES/python-vs-c-launch.txt" ;;
    paths)    timeout 120 python3 -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/small_message_paths.py 2>&1 \
                | grep -v "^W\|^\*" | tee "$RES/small-message-paths.txt" ;;
    train)    SECTIONS="${SECTIONS:-plain ddp allreduce fast}" GPUS="$ALL" MESHSCALE=meshscale timeout "$STAGE_TIMEOUT" bash benchmarks/experiments/train_scaling.sh "$RES/train" 2>&1 | grep -v "^ *$" | tail -40 ;;
    smallgraph) timeout "$STAGE_TIMEOUT" python3 benchmarks/bench_vs_nccl_tests.py "$RES/bench-graph" --cuda-graph --max-bytes 4M 2>&1 | grep -E "all_reduce|broadcast|reference" | tail -20 ;;
    profile)  meshscale train --gpus 1 --model resnet50 --precision bf16 --profile-batches 32,64,128,256 --steps 20 --timing-warmup 8 --json "$RES/profile.json" 2>&1 | tail -8 ;;
    tour)     meshscale tour --output "$RES/tour" 2>&1 | tail -30 ;;
    small)    # small-message time in eager mode: default torch knobs vs the per-op bookkeeping switched off
              for knobs in "" "TORCH_NCCL_TRACE_BUFFER_SIZE=0 TORCH_NCCL_ENABLE_MONITORING=0 TORCH_NCCL_AVOID_RECORD_STREAMS=1"; do
                echo "--- knobs: ${knobs:-default}, 20 warm-up + 100 timed"
                env $knobs timeout 120 python3 -m meshscale bench collective all_reduce broadcast all_gather -b 1K -e 1M -f 4 -a 1 \
                  -w 20 -n 100 --json "$RES/small-${knobs:+knobs}.json" 2>&1 | tail -32 | cut -c1-120
              done ;;
    *)        echo "unknown stage $s" ;;
  esac
done
tar czf "$OUT/results.tgz" -C "$RES" .
ls -la "$OUT"
