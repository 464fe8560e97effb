"""Time `meshscale validate` over the whole shipped corpus (target: under 30 s on a 2-core machine).

    python benchmarks/validate_speed.py [--algo nccl]

Prints the wall time of loading the corpus and predicting every row (identical predictions once), the row and
prediction counts, and the verdict against the bounds (which this benchmark does not judge)."""
import argparse
import time

from meshscale.predict.validate import load_corpus, validate

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--algo", default="nccl", help="the model validate runs (default: nccl)")
args = parser.parse_args()

start = time.perf_counter()
measurements = load_corpus()
loaded = time.perf_counter()
result = validate(measurements, args.algo)
took = time.perf_counter() - start
summary = result.meta["summary"]
distinct = len({(m.system, m.gpus, m.collective, m.size_bytes, m.nccl_version, m.algo, m.proto, m.nvls, m.gpus_per_thread)
                for m in measurements})
print(f"validate, model {args.algo}: {len(measurements)} rows ({distinct} distinct predictions) in {took:.2f} s "
      f"(corpus load {loaded - start:.2f} s); target under 30 s")
print(f"within bounds: {summary['passed']} ({summary['unpredicted']} rows not predicted)")
