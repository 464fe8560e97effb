#!/usr/bin/env bash
# `meshscale launch` (torchrun's agent in meshscale) on the device machine's torch (2.11 there, 2.13 on CPU
# machines): a normal run on the GPU over NCCL, then ranks that are killed, stopped or raise (2 Gloo ranks, the
# faults of tests/fixtures/launch_faults), a restart that recovers, and the listening sockets of a --standalone
# run. Each case prints its exit status and stderr: one line per failed rank, no traceback, no ChildFailedError.
#   bash benchmarks/launch_faults.sh OUTDIR        (DRY_RUN=1: print the commands only; runs on CPU too)
set -u
OUTDIR="${1:-/tmp/launch-faults}"
mkdir -p "$OUTDIR"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 OMP_NUM_THREADS=1
SRC="$PWD/src"
HOOKS="$PWD/tests/fixtures/launch_faults"
PY=${PYTHON:-python3}
TRAIN="train --model small-cnn --steps 6 --batch 4 --timing-warmup 1 --timeout-s 5"
run() {  # name, env assignments..., then the launch arguments
  local name=$1; shift
  echo "== $name: $*"
  [ -n "${DRY_RUN:-}" ] && return 0
  local start=$SECONDS
  env PYTHONPATH="$HOOKS:$SRC" "$@" > "$OUTDIR/$name.out" 2> "$OUTDIR/$name.err"
  local code=$?
  echo "exit $code after $((SECONDS - start)) s; stderr (${OUTDIR}/$name.err):"
  cut -c1-300 "$OUTDIR/$name.err"
  grep -c -e Traceback -e ChildFailedError "$OUTDIR/$name.err" | sed 's/^/tracebacks or ChildFailedError lines: /'
}
$PY -c "import torch; print('torch', torch.__version__, 'GPUs', torch.cuda.device_count())"
GPUS=$($PY -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
LAUNCH="$PY -m meshscale launch --standalone"
if [ "${GPUS:-0}" -ge 1 ]; then
  run gpu-normal $LAUNCH --nproc-per-node 1 -- $TRAIN --gpus 1
  run gpu-killed MESHSCALE_TEST_FAULT=SIGKILL $LAUNCH --nproc-per-node 2 -- $TRAIN --cpus 2
fi
run normal $LAUNCH --nproc-per-node 2 -- $TRAIN --cpus 2
run killed MESHSCALE_TEST_FAULT=SIGKILL $LAUNCH --nproc-per-node 2 -- $TRAIN --cpus 2
run stopped MESHSCALE_TEST_FAULT=SIGSTOP $LAUNCH --nproc-per-node 2 -- $TRAIN --cpus 2
run raises MESHSCALE_TEST_FAULT=raise $LAUNCH --nproc-per-node 2 -- $TRAIN --cpus 2
run restart MESHSCALE_TEST_FAULT=raise MESHSCALE_TEST_FAULT_ATTEMPTS=0 $LAUNCH --nproc-per-node 2 --max-restarts 1 -- $TRAIN --cpus 2
# the --standalone stores (and the ranks' Gloo sockets): listening on 127.0.0.1 only
if [ -z "${DRY_RUN:-}" ]; then
  env PYTHONPATH="$SRC" $LAUNCH --nproc-per-node 2 -- train --model small-cnn --steps 200 --batch 4 --cpus 2 \
    > "$OUTDIR/sockets.out" 2>&1 &
  sleep 20
  $PY - "$!" <<'EOF'
import sys
from pathlib import Path
pid = int(sys.argv[1])
agent = next((p for p in Path("/proc").glob("[0-9]*") if (p / "cmdline").exists()
              and b"launch\x00--standalone" in (p / "cmdline").read_bytes()), None)
if agent is None:
    sys.exit("no launcher found")
inodes, pids = set(), [int(agent.name)]
for task in (agent / "task").glob("*"):
    pids += [int(c) for c in (task / "children").read_text().split()]
for p in pids:
    for fd in Path(f"/proc/{p}/fd").iterdir():
        try:
            target = fd.readlink().name
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
for table in ("tcp", "tcp6"):
    for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
        cells = line.split()
        if cells[3] == "0A" and cells[9] in inodes:
            print(f"listening ({table}): {cells[1]}  (0100007F:... is 127.0.0.1; 00000000:... would be every interface)")
EOF
  kill "$!" 2>/dev/null; wait
fi
echo "left in TMPDIR: $(ls -d "${TMPDIR:-/tmp}"/meshscale-launch-* 2>/dev/null | wc -l) launch folders"
