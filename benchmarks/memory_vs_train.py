"""Peak memory per GPU, measured against predicted: `meshscale train` on this machine's GPUs (PyTorch's caching
allocator: torch.cuda.max_memory_allocated / max_memory_reserved of the fullest rank, the model's build and the
steps apart, and the device memory used outside the allocator at the end: the CUDA context and NCCL's buffers)
beside `meshscale predict` for the same job (models/memory.py: the allocated peak, the steps' own, the reserved
peak, the context and NCCL). llama-1b (batch 2 per data-parallel rank) and llama3-8b (batch 1), seq 2048, bf16,
no checkpointing, under fsdp N, tp 2 x fsdp N/2, fsdp N/2 x pp 2 (1F1B, 4 micro-batches of one sequence; not
llama-1b, whose tied head `train` refuses to split over stages) and cp 2 x fsdp N/2; three steps each (the
optimizer's state exists from the first, the second is the steady one).
Every process runs with NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1, and predict
is told NVLS is off.

  PYTHONPATH=src python3 benchmarks/memory_vs_train.py --out $OUT/memory        every job on every GPU here
  PYTHONPATH=src python3 benchmarks/memory_vs_train.py --out DIR --models llama-1b --layouts fsdp,pp
  PYTHONPATH=src python3 benchmarks/memory_vs_train.py --out DIR --dry-run --gpus 4   (no GPU: predictions only)
  python3 benchmarks/memory_vs_train.py --table DIR                              the table again from DIR

Leaves DIR/memory_vs_train.json (a row per job: measured, predicted, their ratios; the train and predict results
whole), DIR/summary.txt (the table) and DIR/log.txt. Every run ends within BUDGET_S of the first's start; those
left are listed as not run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

GIB = float(1 << 30)
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
BATCH = {"llama3-8b": 1, "llama-1b": 2}    # sequences per data-parallel rank (the larger model first)
TIED = ("llama-1b",)                       # head tied to the embedding: train runs no pipeline of it
SEQ_LEN = 2048
MICRO_BATCHES = 4                          # the pipeline's, of one sequence each
LAYOUTS = ("fsdp", "tp", "pp", "cp")
BUDGET_S = 225                             # every run ends by then (the whole call stays under 4 minutes)
MIN_RUN_S = 25                             # a run needs at least this much of the budget left to start
TARGET = 0.10                              # predicted within 10% of the allocator's peak


@dataclass(frozen=True)
class Job:
    model: str
    layout: str                # fsdp | tp | pp | cp
    degrees: tuple[tuple[str, int], ...]
    batch: int
    micro_batches: int = 1

    @property
    def name(self) -> str:
        return f"{self.model} {' x '.join(f'{k}{v}' for k, v in self.degrees)}"

    @property
    def slug(self) -> str:
        return f"{self.model}-{'-'.join(f'{k}{v}' for k, v in self.degrees)}"

    def options(self) -> list[str]:
        """What train and predict are both given."""
        out = [f"--{k}={v}" for k, v in self.degrees]
        if self.micro_batches > 1:
            out.append(f"--micro-batches={self.micro_batches}")
        return out + ["--model", self.model, f"--batch={self.batch}", f"--seq-len={SEQ_LEN}", "--precision=bf16",
                      "--activation-checkpointing=none"]


def jobs(models: list[str], layouts: list[str], gpus: int) -> list[Job]:
    """The jobs on ``gpus`` GPUs (two at least: each layout but fsdp splits them in two)."""
    half = gpus // 2
    shapes = {"fsdp": ((("fsdp", gpus),), 1), "tp": ((("tp", 2), ("fsdp", half)), 1),
              "pp": ((("fsdp", half), ("pp", 2)), MICRO_BATCHES), "cp": ((("cp", 2), ("fsdp", half)), 1)}
    out = []
    for model in models:
        for layout in layouts:
            if layout == "pp" and model in TIED:
                continue
            degrees, micro = shapes[layout]
            degrees = tuple((k, v) for k, v in degrees if v > 1) or (("fsdp", 1),)
            out.append(Job(model, layout, degrees, micro if micro > 1 else BATCH[model], micro))
    return out


def predict_command(job: Job, gpus: int, system: str, path: Path) -> list[str]:
    return [sys.executable, "-m", "meshscale", "predict", *job.options(), "--system", system, f"--gpus={gpus}",
            "--nccl-env", "NCCL_NVLS_ENABLE=0", "--json", str(path)]


def train_command(job: Job, gpus: int, path: Path) -> list[str]:
    return [sys.executable, "-m", "meshscale", "train", *job.options(), f"--gpus={gpus}", "--steps=3",
            "--timing-warmup=1", "--no-timing", "--comm-breakdown-steps=0", "--json", str(path)]


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _ratio(predicted: float | None, measured: float | None) -> float | None:
    return predicted / measured if predicted and measured else None


def compare(job: Job, train: dict | None, predict: dict | None) -> dict:
    """One job's row: measured (train's summary), predicted (predict's row) and predicted / measured."""
    s = (train or {}).get("meta", {}).get("summary", {})
    p = ((predict or {}).get("rows") or [{}])[0]
    row = {"job": job.name, "model": job.model, "layout": job.layout, **asdict(job),
           "measured": {k: s.get(k) for k in ("peak_allocated_bytes", "peak_reserved_bytes",
                                              "build_peak_allocated_bytes", "step_peak_allocated_bytes",
                                              "step_peak_reserved_bytes", "end_outside_allocator_bytes")},
           "predicted": {k: p.get(k) for k in ("memory_allocated_bytes", "memory_reserved_bytes",
                                               "memory_build_allocated_bytes", "memory_step_allocated_bytes",
                                               "memory_outside_allocator_bytes", "memory_peak_bytes",
                                               "memory_peak_moment", "fits", "memory_margin_bytes")}}
    m, q = row["measured"], row["predicted"]
    row["ratio"] = {"allocated": _ratio(q["memory_allocated_bytes"], m["peak_allocated_bytes"]),
                    "steps_allocated": _ratio(q["memory_step_allocated_bytes"], m["step_peak_allocated_bytes"]),
                    "reserved": _ratio(q["memory_reserved_bytes"], m["peak_reserved_bytes"]),
                    "outside": _ratio(q["memory_outside_allocator_bytes"], m["end_outside_allocator_bytes"])}
    return row


def _cell(measured: float | None, predicted: float | None, ratio: float | None) -> str:
    if measured is None and predicted is None:
        return "-"
    text = f"{(measured or 0) / GIB:5.1f} / {(predicted or 0) / GIB:5.1f}"
    return text + (f" ({ratio:.2f}{'' if abs(ratio - 1) <= TARGET else ' !'})" if ratio else "")


def table(rows: list[dict]) -> str:
    """measured / predicted GiB (predicted / measured; ! beyond 10%) per job."""
    lines = [f"{'job':<28} {'allocated (run)':>24} {'allocated (steps)':>24} {'reserved':>24} {'outside':>22}  peak at",
             f"{'':<28} {'measured / PREDICTED':>24} {'':>24} {'':>24} {'':>22}"]
    for r in rows:
        m, q, x = r["measured"], r["predicted"], r["ratio"]
        lines.append(f"{r['job']:<28} {_cell(m['peak_allocated_bytes'], q['memory_allocated_bytes'], x['allocated']):>24} "
                     f"{_cell(m['step_peak_allocated_bytes'], q['memory_step_allocated_bytes'], x['steps_allocated']):>24} "
                     f"{_cell(m['peak_reserved_bytes'], q['memory_reserved_bytes'], x['reserved']):>24} "
                     f"{_cell(m['end_outside_allocator_bytes'], q['memory_outside_allocator_bytes'], x['outside']):>22}"
                     f"  {q.get('memory_peak_moment') or '-'}" + (f"  ({r['error']})" if r.get("error") else ""))
    within = [abs(r["ratio"]["allocated"] - 1) <= TARGET for r in rows if r["ratio"]["allocated"]]
    lines.append(f"allocated peak within {TARGET:.0%} of the allocator's for {sum(within)} of {len(within)} jobs "
                 "measured. GiB, measured / PREDICTED (PREDICTED / measured); outside: the device's memory used beside "
                 "the allocator's segments at the end (CUDA context, NCCL) against the context and NCCL predicted")
    return "\n".join(lines)


def _system() -> tuple[str, int]:
    """The catalog system to predict on (by the GPU's name) and the GPUs here."""
    import torch
    if not torch.cuda.is_available():
        return "hgx-h100", 0
    return ("hgx-h200" if "H200" in torch.cuda.get_device_name(0) else "hgx-h100"), torch.cuda.device_count()


def run_all(todo: list[Job], gpus: int, system: str, out: Path, dry_run: bool) -> list[dict]:
    """Every job's predictions in the background, its training runs one after another."""
    env = {**os.environ, **NVLS_OFF}
    work = out / "runs"
    work.mkdir(parents=True, exist_ok=True)
    log = (out / "log.txt").open("a")
    predicts = {j.slug: subprocess.Popen(predict_command(j, gpus, system, work / f"predict-{j.slug}.json"), env=env,
                                         stdout=log, stderr=subprocess.STDOUT) for j in todo}
    start, errors = time.monotonic(), {}
    for j in [] if dry_run else todo:
        left = BUDGET_S - (time.monotonic() - start)
        if left < MIN_RUN_S:
            errors[j.slug] = "not run: past the time budget"
            continue
        log.write(f"== train {j.name}: {' '.join(train_command(j, gpus, work / 'x'))}\n")
        log.flush()
        try:
            done = subprocess.run(train_command(j, gpus, work / f"train-{j.slug}.json"), env=env, stdout=log,
                                  stderr=subprocess.STDOUT, timeout=left)
            if done.returncode:
                errors[j.slug] = f"train exit {done.returncode}"
        except subprocess.TimeoutExpired:
            errors[j.slug] = f"train stopped at the time budget ({left:.0f} s)"
    rows = []
    for j in todo:
        if predicts[j.slug].wait():
            errors.setdefault(j.slug, "predict failed")
        row = compare(j, _load(work / f"train-{j.slug}.json"), _load(work / f"predict-{j.slug}.json"))
        rows.append({**row, "error": errors.get(j.slug)})
    log.close()
    return rows


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "memory_vs_train")))
    ap.add_argument("--models", default=",".join(BATCH))
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--gpus", type=int, default=None, help="GPUs to train on (default: all here)")
    ap.add_argument("--dry-run", action="store_true", help="predictions only (no GPU needed)")
    ap.add_argument("--table", type=Path, default=None, help="print the table of a finished DIR again")
    args = ap.parse_args(argv)
    if args.table is not None:
        print(table(json.loads((args.table / "memory_vs_train.json").read_text())["rows"]))
        return 0
    models, layouts = args.models.split(","), args.layouts.split(",")
    bad = [m for m in models if m not in BATCH] + [x for x in layouts if x not in LAYOUTS]
    system, here = _system()
    gpus = args.gpus or here
    if bad or gpus < 2 or (not args.dry_run and gpus > here):
        print(f"memory_vs_train: models {', '.join(BATCH)}, layouts {', '.join(LAYOUTS)}, on 2 or more GPUs "
              f"(here: {here}; --dry-run --gpus N predicts without them)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    rows = run_all(jobs(models, layouts, gpus), gpus, system, args.out, args.dry_run)
    text = table(rows)
    print(text)
    (args.out / "summary.txt").write_text(text + "\n")
    (args.out / "memory_vs_train.json").write_text(json.dumps({"system": system, "gpus": gpus, "env": NVLS_OFF,
                                                               "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
