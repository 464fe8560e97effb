"""Time `meshscale --version`, `-h` and the commands that run no GPU work, as a user starts them (a new process
each time; target: --version and -h under 0.5 s). Run: PYTHONPATH=src python benchmarks/cli_startup.py"""
import statistics
import subprocess
import sys
import time

COMMANDS = [["--version"], ["-h"], ["sim", "-h"], ["systems"], ["topo", "--system", "dgx1-v100"],
            ["sim", "all_reduce", "-s", "dgx1-v100", "-e", "1M"], ["predict", "-s", "dgx1-v100", "--model", "resnet50"]]
RUNS = 5

for args in COMMANDS:
    times_s = []
    for _ in range(RUNS):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "meshscale", *args], capture_output=True, check=True, timeout=60)
        times_s.append(time.perf_counter() - start)
    target = " (target 0.5 s)" if args in (["--version"], ["-h"]) else ""
    print(f"meshscale {' '.join(args):<50} median {statistics.median(times_s):.2f} s over {RUNS}{target}")
