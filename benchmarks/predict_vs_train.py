"""Measured (`train --json`) against predicted (`predict --json`) samples/s for what
benchmarks/predict_vs_train_gpu.sh leaves in a folder: the steady prediction against `train --no-timing` (the
throughput window, no sync inside it: the figure the 20% target is held against) and against `train`'s timed
run (each step's events read once the next step is queued: no sync either), with the step a loop synced every
step would take beside them; each with its error and where its compute came from.

  python benchmarks/predict_vs_train.py OUTDIR                       the table, from OUTDIR/<model>.json
  python benchmarks/predict_vs_train.py --pack MODEL WORKDIR OUT     one model's result files into one JSON
  python benchmarks/predict_vs_train.py --profile-of MODEL DIR OUT   MODEL's profile from DIR (a packed
                                                                     <model>.json or profile-<model>.json)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

MODELS = ("resnet50", "gpt-small", "llama-1b")
# result files of one model in the work folder, by their key in the packed JSON
PARTS = {"train_timed": "train-{}.json", "train_untimed": "untimed-{}.json", "profile": "profile-{}.json",
         "predict_datasheet": "predict-{}.json", "predict_other_gpu": "predict-{}-calibrated.json",
         "predict_own_profile": "predict-{}-self.json"}
PREDICTIONS = (("datasheet", "predict_datasheet"), ("other GPU", "predict_other_gpu"),
               ("own profile", "predict_own_profile"))


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def pack(model: str, work: Path, out: Path) -> None:
    packed = {"model": model}
    for key, pattern in PARTS.items():
        found = _load(work / pattern.format(model))
        if found is not None:
            packed[key] = found
    out.write_text(json.dumps(packed, indent=1))


def profile_of(model: str, folder: Path, out: Path) -> int:
    """Write ``model``'s profile from ``folder`` to ``out``; 1 (nothing written) where there is none."""
    found = _load(folder / f"profile-{model}.json") or (_load(folder / f"{model}.json") or {}).get("profile")
    if not found:
        print(f"no profile of {model} in {folder}", file=sys.stderr)
        return 1
    out.write_text(json.dumps(found))
    return 0


def _measured(result: dict | None) -> float | None:
    return result["meta"]["summary"]["samples_per_s"] if result else None


def _cell(predicted: float | None, measured: float | None) -> tuple[str, str]:
    shown = f"{measured:,.1f}" if measured else "-"
    error = f"{predicted / measured - 1:+.1%}" if predicted and measured else "-"
    return shown, error


def table(folder: Path) -> None:
    print(f"{'model':<10} {'prediction':<12} {'steady/s':>9} {'no-timing':>10} {'error':>7}   "
          f"{'synced/s':>9} {'timed':>9} {'error':>7}  compute from")
    for model in MODELS:
        packed = _load(folder / f"{model}.json")
        if not packed:
            continue
        untimed, timed = _measured(packed.get("train_untimed")), _measured(packed.get("train_timed"))
        for tag, key in PREDICTIONS:
            pred = packed.get(key)
            if not pred:
                continue
            row = pred["rows"][0]
            steady, synced = row["throughput_samples_per_s"], row.get("synced_throughput_samples_per_s")
            u, ue = _cell(steady, untimed)
            t, te = _cell(steady, timed)
            print(f"{model:<10} {tag:<12} {steady:>9,.1f} {u:>10} {ue:>7}   {synced or 0:>9,.1f} {t:>9} {te:>7}  "
                  f"{row['compute_source']}")
    print("error = predicted / measured - 1. steady: the step with the host running ahead (against `train "
          "--no-timing` and the timed run); synced: a loop that waits for the device every step (shown, not compared)")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--pack"] and len(argv) == 4:
        pack(argv[1], Path(argv[2]), Path(argv[3]))
        return 0
    if argv[:1] == ["--profile-of"] and len(argv) == 4:
        return profile_of(argv[1], Path(argv[2]), Path(argv[3]))
    table(Path(argv[0] if argv else "."))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
