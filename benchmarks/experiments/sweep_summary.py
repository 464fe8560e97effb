"""busbw (GB/s) of every all_reduce sweep (allreduce*.json) in the given folders, one line per sweep, size order.
   python3 benchmarks/experiments/sweep_summary.py DIR [DIR ...]"""
import json, sys, glob, os
for d in sys.argv[1:]:
    for f in sorted(glob.glob(os.path.join(d, "allreduce*.json"))):
        rows = json.load(open(f))["rows"]
        print(os.path.basename(d), os.path.basename(f), " ".join(f"{r['busbw_bytes_per_s']/1e9:.2f}" for r in rows))
