"""NCCL's environment, measured against the model: all_reduce on 2 GPUs of this machine, NCCL called directly
(`meshscale bench collective --impl nccl`), under each setting `--nccl-env` models, beside what `sim --nccl-env`
predicts on this machine's topology. Prints per setting and size the measured and predicted busbw and the error.

  PYTHONPATH=src python benchmarks/nccl_env_check.py OUTDIR            # on a GPU machine (2+ GPUs)
  PYTHONPATH=src python benchmarks/nccl_env_check.py OUTDIR --dry-run  # anywhere: the predictions on hgx-h200 only
"""
import os
import subprocess
import sys
from pathlib import Path

SETTINGS = [
    [],
    ["NCCL_MAX_NCHANNELS=1"], ["NCCL_MAX_NCHANNELS=2"], ["NCCL_MAX_NCHANNELS=4"], ["NCCL_MAX_NCHANNELS=8"],
    ["NCCL_MIN_NCHANNELS=32"],
    ["NCCL_P2P_DISABLE=1"], ["NCCL_P2P_LEVEL=LOC"],
    ["NCCL_P2P_DISABLE=1", "NCCL_SHM_DISABLE=1"],
    ["NCCL_P2P_DISABLE=1", "NCCL_SHM_DISABLE=1", "NCCL_NET=Socket"],
    ["NCCL_ALGO=Tree"], ["NCCL_PROTO=LL128"], ["NCCL_PROTO=LL"],
]
SIZES = "-b 16M -e 1G -f 4".split()


def main() -> int:
    from meshscale.results import load_result
    from meshscale.simulate.cost import Call
    from meshscale.simulate.fabric import Fabric
    from meshscale.simulate.nccl_env import NcclSettings
    from meshscale.simulate.nccl_env import parse_nccl_env
    from meshscale.topology import load_system

    out = Path(sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else "/tmp/nccl-env")
    dry = "--dry-run" in sys.argv
    out.mkdir(parents=True, exist_ok=True)
    if dry:
        topo = load_system("hgx-h200")
    else:
        from meshscale.topology.discover import discover
        topo = discover().topology
    ranks = [topo.nodes[d].index for d in topo.devices()][:2]
    print(f"{'setting':58} {'size':>6} {'measured':>9} {'predicted':>9} {'error':>7}  NCCL's pick (model)")
    for settings in SETTINGS:
        name = "-".join(s.replace("NCCL_", "").replace("=", "") for s in settings) or "default"
        measured = {}
        if not dry:
            path = out / f"{name}.json"
            env = dict(os.environ, **dict(s.split("=", 1) for s in settings))
            done = subprocess.run([sys.executable, "-m", "meshscale", "bench", "collective", "all_reduce", "--impl", "nccl",
                                   "-g", "2", *SIZES, "--json", str(path)], env=env, capture_output=True, text=True,
                                  timeout=300)
            if done.returncode:
                print(f"{' '.join(settings) or 'defaults':58} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
                continue
            measured = {r["size_bytes"]: r["busbw_bytes_per_s"] for r in load_result(path).rows if not r.get("inplace")}
        for size in (16 << 20, 64 << 20, 256 << 20, 1 << 30):
            p = Fabric(topo, nccl=NcclSettings(env=parse_nccl_env(settings))).cost(Call("all_reduce", size, tuple(ranks)))
            m = measured.get(size)
            error = f"{p.busbw_bytes_per_s / m - 1:+7.1%}" if m else "      -"
            print(f"{' '.join(settings) or 'defaults':58} {size >> 20:5}M {m / 1e9 if m else float('nan'):9.1f} "
                  f"{p.busbw_bytes_per_s / 1e9:9.1f} {error}  {p.detail}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
