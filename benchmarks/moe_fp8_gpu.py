"""Expert parallelism and fp8 on the GPUs of one machine, each beside `meshscale predict` for the same job.

1. A small Mixtral-style mixture of experts (a config.json written here: 8 layers, d 1024, 8 experts of width
   2816, top 2) under `train --ep N --fsdp N` (ep borrows the fsdp ranks), bf16: tokens/s per GPU beside the
   prediction for the same layout, the ep all-to-all's bytes and seconds per step, the most loaded expert over the
   mean.
2. llama3-8b (llama-1b below 4 GPUs) under `--fsdp N`: bf16 against fp8 (torchao float8, `--fp8-recipe`
   tensorwise; `--recipes tensorwise,rowwise` adds rowwise), each with `--compile default` (torchtitan compiles
   its float8 runs; `--no-compile` to leave it out), the ratio fp8 / bf16 measured beside predicted.

Every process gets NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1. The GPU machine
reaches no package registry: torchao comes as a wheel in a carried folder (default .whl/, ignored by git), fetched
beforehand with `pip download torchao --no-deps -d .whl/`; it is installed with `pip install --no-deps --target`
into a scratch folder put on every process's PYTHONPATH (nothing when torchao already imports).

  PYTHONPATH=src python3 benchmarks/moe_fp8_gpu.py --out $OUT/moe_fp8         (about 4 minutes on 4 H100/H200)
  PYTHONPATH=src python3 benchmarks/moe_fp8_gpu.py --dry-run --out /tmp/mf    (CPU: 2 Gloo workers, tiny models)

Leaves in --out: each run's JSON and output, summary.json (every figure), and prints the comparisons."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
       "PYTHONUNBUFFERED": "1"}
# Mixtral's config.json keys, its shape scaled down to train in seconds on a few GPUs (about 0.65B parameters)
MOE_CONFIG = {"model_type": "mixtral", "num_hidden_layers": 8, "hidden_size": 1024, "num_attention_heads": 16,
              "num_key_value_heads": 8, "intermediate_size": 2816, "num_local_experts": 8,
              "num_experts_per_tok": 2, "vocab_size": 32000, "max_position_embeddings": 4096,
              "rope_theta": 1000000.0, "tie_word_embeddings": False}


def torchao_path(wheels: Path, scratch: Path) -> str | None:
    """A folder to put on PYTHONPATH for torchao: None when it imports already or no wheel is carried."""
    try:
        import torchao  # noqa: F401
        return None
    except ImportError:
        pass
    found = sorted(wheels.glob("torchao-*.whl"))
    if not found:
        print(f"no torchao wheel in {wheels}/ and none installed: the fp8 runs will be refused (carry one: "
              "pip download torchao --no-deps -d .whl/)", file=sys.stderr)
        return None
    target = scratch / "torchao"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(target),
                    str(found[-1])], check=True)
    return str(target)


def run(cmd: list[str], env: dict[str, str], timeout_s: float, log: Path) -> int:
    """``meshscale ARGS`` as a process, its output to ``log``; its exit status (124: out of time)."""
    start = time.time()
    with log.open("w") as out:
        try:
            code = subprocess.run([sys.executable, "-m", "meshscale", *cmd], env=env, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            code = 124
    print(f"  {' '.join(cmd[:3])} ... exit {code} in {time.time() - start:.0f} s ({log.name})", flush=True)
    if code:
        lines = log.read_text().strip().splitlines()
        print(f"    {lines[-1] if lines else ''}", flush=True)
    return code


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def train(name: str, args: list[str], out: Path, env: dict, timeout_s: float) -> dict | None:
    """A train run's summary (None if it failed)."""
    run(["train", *args, "--json", str(out / f"{name}.json")], env, timeout_s, out / f"{name}.txt")
    result = _load(out / f"{name}.json")
    return result["meta"]["summary"] if result else None


def predict(name: str, args: list[str], out: Path, env: dict) -> dict | None:
    """A prediction's first row (None if it failed)."""
    run(["predict", *args, "--json", str(out / f"{name}.json")], env, 120, out / f"{name}.txt")
    result = _load(out / f"{name}.json")
    return result["rows"][0] if result and result.get("rows") else None


def _ratio(a, b) -> float | None:
    return a / b if a and b else None


def _fmt(x, spec: str = ",.0f") -> str:
    return "-" if x is None else format(x, spec)


def moe_part(o: argparse.Namespace, world: list[str], n: int, env: dict, out: Path) -> dict:
    """Train the MoE under ep n over fsdp n beside its prediction."""
    model = o.moe_model or str(out / "moe-small.json")
    if not o.moe_model:
        Path(model).write_text(json.dumps(MOE_CONFIG))
    # no activation checkpointing: train recomputes a MoE block whole under selective, which predict does not price
    shared = ["--model", model, "--fsdp", str(n), "--ep", str(n), "--precision", o.precision_moe,
              "--batch", str(o.moe_batch), "--seq-len", str(o.seq_len), "--activation-checkpointing", "none"]
    measured = train("moe-train", [*world, *shared, "--steps", str(o.steps), "--timing-warmup", str(o.warmup)],
                     out, env, o.timeout_s)
    predicted = predict("moe-predict", [*shared, "--system", o.system, "--gpus", str(n)], out, env)
    rate = measured.get("tokens_per_s_per_rank") if measured else None
    moe = (measured or {}).get("moe") or {}
    row = {"model": model, "layout": f"fsdp{n} ep{n}", "measured_tokens_per_s_per_gpu": rate,
           "predicted_tokens_per_s_per_gpu": predicted and predicted.get("tokens_per_s_per_gpu"),
           "all_to_all_bytes": moe.get("all_to_all_bytes"), "all_to_all_s": moe.get("all_to_all_s"),
           "all_to_all_exposed_s": moe.get("all_to_all_exposed_s"),
           "expert_load_max_over_mean": moe.get("expert_load_max_over_mean"), "experts_gemm": moe.get("experts_gemm"),
           "predicted_exposed_all_to_all_s": predicted and predicted.get("exposed_expert_all-to-all_s")}
    row["measured_over_predicted"] = _ratio(rate, row["predicted_tokens_per_s_per_gpu"])
    print(f"MoE {row['layout']}: measured {_fmt(rate)} tokens/s/GPU, PREDICTED "
          f"{_fmt(row['predicted_tokens_per_s_per_gpu'])} (measured/predicted {_fmt(row['measured_over_predicted'], '.2f')}); "
          f"all-to-all {_fmt((row['all_to_all_bytes'] or 0) / 1e6, '.1f')} MB, "
          f"{_fmt((row['all_to_all_s'] or 0) * 1e3, '.2f')} ms/step on a rank; experts {row['experts_gemm']}, "
          f"max/mean load {_fmt(row['expert_load_max_over_mean'], '.2f')}", flush=True)
    return row


def dense_part(o: argparse.Namespace, world: list[str], n: int, env: dict, out: Path) -> dict:
    """The dense model in bf16 and in fp8 per recipe, measured and predicted, and their ratios to bf16."""
    shared = ["--model", o.dense_model, "--fsdp", str(n), "--batch", str(o.dense_batch), "--seq-len", str(o.seq_len),
              "--activation-checkpointing", o.checkpointing]
    compiled = [] if o.no_compile else ["--compile", "default"]
    runs = {"bf16": ["--precision", "bf16"]}
    runs.update({f"fp8-{r}": ["--precision", "fp8", "--fp8-recipe", r] for r in o.recipes.split(",") if r})
    rows = {}
    for name, precision in runs.items():
        measured = train(f"dense-{name}", [*world, *shared, *precision, *compiled, "--steps", str(o.steps),
                                           "--timing-warmup", str(o.warmup)], out, env, o.timeout_s)
        predicted = predict(f"dense-{name}-predict", [*shared, *precision, "--system", o.system, "--gpus", str(n)],
                            out, env)
        rows[name] = {"measured_tokens_per_s_per_gpu": measured.get("tokens_per_s_per_rank") if measured else None,
                      "mfu": measured.get("mfu") if measured else None,
                      "peak_allocated_bytes": measured.get("peak_allocated_bytes") if measured else None,
                      "predicted_tokens_per_s_per_gpu": predicted and predicted.get("tokens_per_s_per_gpu")}
    base = rows["bf16"]
    for name, r in rows.items():
        r["measured_over_bf16"] = _ratio(r["measured_tokens_per_s_per_gpu"], base["measured_tokens_per_s_per_gpu"])
        r["predicted_over_bf16"] = _ratio(r["predicted_tokens_per_s_per_gpu"], base["predicted_tokens_per_s_per_gpu"])
        r["measured_over_predicted"] = _ratio(r["measured_tokens_per_s_per_gpu"], r["predicted_tokens_per_s_per_gpu"])
        print(f"{o.dense_model} fsdp{n} {name}: measured {_fmt(r['measured_tokens_per_s_per_gpu'])} tokens/s/GPU "
              f"(x{_fmt(r['measured_over_bf16'], '.2f')} of bf16), PREDICTED {_fmt(r['predicted_tokens_per_s_per_gpu'])} "
              f"(x{_fmt(r['predicted_over_bf16'], '.2f')}); measured/predicted {_fmt(r['measured_over_predicted'], '.2f')}",
              flush=True)
    return {"model": o.dense_model, "layout": f"fsdp{n}", "compile": not o.no_compile, "runs": rows}


def _gpus() -> tuple[int, str]:
    import torch
    if not torch.cuda.is_available():
        return 0, ""
    return torch.cuda.device_count(), torch.cuda.get_device_name(0)


def _options() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/meshscale-out") + "/moe_fp8")
    p.add_argument("--wheels", default=".whl", help="folder holding a torchao wheel (carried to the GPU machine)")
    p.add_argument("--dry-run", action="store_true", help="CPU: 2 Gloo workers, moe-tiny and llama-tiny")
    p.add_argument("--moe-model", help="a MoE preset or config.json instead of the one written here")
    p.add_argument("--dense-model", help="default llama3-8b (llama-1b below 4 GPUs)")
    p.add_argument("--recipes", default="tensorwise", help="fp8 recipes to run, comma-separated")
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=6)
    p.add_argument("--timeout-s", type=float, default=200)
    return p.parse_args()


def main() -> int:
    o = _options()
    out = Path(o.out)
    out.mkdir(parents=True, exist_ok=True)
    n, gpu = _gpus()
    if o.dry_run or n == 0:
        n, world, o.system = 2, ["--cpus", "2"], "hgx-h100"
        o.moe_model, o.dense_model = o.moe_model or "moe-tiny", o.dense_model or "llama-tiny"
        o.seq_len, o.moe_batch, o.dense_batch, o.steps, o.warmup = 64, 2, 2, 4, 2
    else:
        world, o.system = ["--gpus", str(n)], "hgx-h200" if "H200" in gpu else "hgx-h100"
        o.dense_model = o.dense_model or ("llama3-8b" if n >= 4 else "llama-1b")
        o.seq_len, o.moe_batch, o.dense_batch = 2048, 4, 1
    o.precision_moe, o.checkpointing = "bf16", "selective"
    scratch = Path(tempfile.mkdtemp(prefix="moe_fp8_"))
    extra = torchao_path(Path(o.wheels), scratch)
    env = {**os.environ, **ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(__file__).resolve().parents[1] / "src"), extra,
                                                    env.get("PYTHONPATH")) if p)
    os.environ.update(ENV)
    print(f"{n} x {gpu or 'CPU worker'}; predicting on {o.system}; torchao from {extra or 'the environment'}",
          flush=True)
    summary = {"gpus": n, "gpu": gpu, "system": o.system, "moe": moe_part(o, world, n, env, out),
               "dense": dense_part(o, world, n, env, out)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"wrote {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
