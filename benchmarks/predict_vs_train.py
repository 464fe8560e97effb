"""Print measured (`train --json`) against predicted (`predict --json`) samples/s for the results that
benchmarks/predict_vs_train_gpu.sh leaves in a folder, with each prediction's error and where its compute came
from.   python benchmarks/predict_vs_train.py OUTDIR"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def main(folder: str) -> None:
    out = Path(folder)
    print(f"{'model':<10} {'prediction':<12} {'measured/s':>11} {'predicted/s':>12} {'error':>8}  compute from")
    for name in ("resnet50", "gpt-small"):
        train = _load(out / f"train-{name}.json")
        measured = train["meta"]["summary"]["samples_per_s"] if train else None
        for tag, suffix in (("datasheet", ""), ("other GPU", "-calibrated"), ("own profile", "-self")):
            pred = _load(out / f"predict-{name}{suffix}.json")
            if not pred:
                continue
            row = pred["rows"][0]
            predicted = row["throughput_samples_per_s"]
            error = f"{predicted / measured - 1:+.1%}" if measured else "-"
            shown = f"{measured:,.1f}" if measured else "-"
            print(f"{name:<10} {tag:<12} {shown:>11} {predicted:>12,.1f} {error:>8}  {row['compute_source']}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
