"""`meshscale bench collective` and `meshscale bench p2p`: measure the machine like nccl-tests and nvbandwidth.

Multi-node: run the same command under `meshscale launch` (torchrun's agent; a failed rank is one line) or
torchrun on every node, e.g.
  meshscale launch --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
      -- bench collective all_reduce -b 1M -e 1G
(Slurm: `srun --nodes 2 --ntasks-per-node 1 meshscale launch --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d
--rdzv-endpoint $(scontrol show hostnames $SLURM_NODELIST | head -1):29500 -- bench ...`; scripts/slurm/).
Only rank 0 prints and writes files.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import List, Optional

import typer

from meshscale.cli.output import print_tables, progress, write_result_files
from meshscale.cli.checks import (BATCH, COUNT, COUNT_OR_ZERO, CPU_COUNT, FACTOR, GPU_COUNT, ROOT, TIMEOUT_S, checked,
                                  output_file, size_bytes)
from meshscale.validation import Range
from meshscale.collectives.kinds import NAMES
from meshscale.errors import MeshscaleError

# nccl-tests' -G N captures all iterations in one graph and launches it N times; meshscale times one op per launch
_CUDA_GRAPH_HELP = ("0 off; N > 0: capture one operation in a CUDA graph and replay it once per iteration (GPUs), one "
                    "launch per op like a C loop; any N > 0 does the same")
PLACE_CHOICES = {"both": ("out", "in"), "out": ("out",), "in": ("in",)}

bench_app = typer.Typer(no_args_is_help=True, help="Measure collectives and point-to-point bandwidth on this machine.",
                        short_help="Measure collectives, bandwidth, worker pairs and storage")


def _is_rank0() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def bench_algo(algo: Optional[str], impl: str) -> Optional[str]:
    """The meshscale schedule ``--algo`` asks ``--impl meshscale`` to run (None: NCCL's own call, or ring): the
    one --algo vocabulary, refused in one line where the implementation cannot run it."""
    from meshscale.simulate.models import check_algo

    if algo is None:
        return None
    if (check_algo(algo) == "nccl") == (impl == "meshscale"):
        raise MeshscaleError(f"--algo {algo} with --impl {impl}: --algo nccl runs NCCL's own call (--impl native or "
                             "nccl); auto or a schedule name runs meshscale's schedule (--impl meshscale)")
    return None if algo == "nccl" else algo


@bench_app.command("collective", short_help="Sweep collective sizes like nccl-tests")
def collective(
    collectives: Optional[List[str]] = typer.Argument(None, help=f"{', '.join(NAMES)}, or all (the default: every one)"),
    min_bytes: str = typer.Option("1K", "--min-bytes", "-b", help="smallest size (8, 1K, 64M...)", callback=checked(size_bytes)),
    max_bytes: str = typer.Option("1M", "--max-bytes", "-e", help="largest size", callback=checked(size_bytes)),
    factor: int = typer.Option(2, "--factor", "-f", help="size multiplier between steps", callback=checked(FACTOR)),
    step_bytes: Optional[str] = typer.Option(None, "--step-bytes", "-i", help="sizes min, min+step, ... (nccl-tests' -i; instead of -f)", callback=checked(size_bytes)),
    dtype: str = typer.Option("float", "--dtype", "-d", help="nccl-tests' type names: float, half, bfloat16, double, int32, int64, uint8, several with commas, or all (float32, float16, float64 too)"),
    op: str = typer.Option("sum", "--op", "-o", help="sum, prod, min, max, avg, several with commas, or all (reducing collectives; all leaves out avg on CPU workers)"),
    root: int = typer.Option(0, "--root", "-r", help="root rank of broadcast, reduce, gather, scatter", callback=checked(ROOT)),
    place: str = typer.Option("both", "--place", help="both, out (out-of-place) or in (in-place)"),
    warmup_iters: int = typer.Option(5, "--warmup-iters", "-w", help="untimed calls before each size's timed ones", callback=checked(COUNT_OR_ZERO)),
    iters: int = typer.Option(20, "--iters", "-n", help="timed calls per size (their mean is the time)", callback=checked(COUNT)),
    cycles: int = typer.Option(1, "--cycles", "-N", help="run the whole sweep N times (nccl-tests' -N): each cycle's lines print, each size reports the median cycle", callback=checked(COUNT)),
    average: int = typer.Option(1, "--average", "-a", help="time reported: 0 rank 0, 1 mean (default), 2 min, 3 max over ranks (nccl-tests codes)", callback=checked(Range(0, 3, integer=True))),
    check: int = typer.Option(1, "--check", "-c", help="verify every size's result: 0 off, N > 0 on (each size is checked once; nccl-tests repeats the check N times)"),
    no_check: bool = typer.Option(False, "--no-check", help="the same as -c 0"),
    cuda_graph: int = typer.Option(0, "--cuda-graph", "-G", help=_CUDA_GRAPH_HELP),
    blocking: int = typer.Option(0, "--blocking", "-z", help="1: wait for each operation to finish and pass a barrier before the next (nccl-tests' -z)", callback=checked(Range(0, 1, integer=True))),
    cpu_time: int = typer.Option(0, "--report-cputime", "-C", help="1: report the host's time for the calls (launch to completion) instead of the GPU's (nccl-tests' -C; CPU workers always report the host's)", callback=checked(Range(0, 1, integer=True))),
    agg_iters: int = typer.Option(1, "--agg-iters", "-m", help="only 1: meshscale times one operation per call (nccl-tests' -m groups N in one NCCL group; torch.distributed has no grouped call for every collective)", callback=checked(Range(1, 1, integer=True))),
    gpus: Optional[int] = typer.Option(None, "--gpus", "-g", help="GPU count: ranks over NCCL, one process each (default: all GPUs); nccl-tests' -g counts GPUs per process, so its -g 8 in one process is meshscale's -g 8", callback=checked(GPU_COUNT)),
    cpus: Optional[int] = typer.Option(None, "--cpus", help="CPU worker ranks over Gloo (default when no GPU)", callback=checked(CPU_COUNT)),
    impl: str = typer.Option("native", "--impl", help="native (torch.distributed), nccl (NCCL called directly, like nccl-tests; GPUs) or meshscale (a meshscale schedule)"),
    algo: Optional[str] = typer.Option(None, "--algo", help="nccl: NCCL's own call (--impl native, torch.distributed's, or --impl nccl); auto: meshscale's fastest schedule, or a meshscale schedule name (with --impl meshscale; default ring)"),
    per_iter: int = typer.Option(0, "--per-iter-timing", "-I", help="1: also time each call (nccl-tests' -I): i_min, i_max, i_p99 and i_cv% of each call's slowest rank beside the mean (a stall the mean hides shows)", callback=checked(Range(0, 1, integer=True))),
    per_iter_skip: int = typer.Option(0, "--per-iter-skip", "-K", help="with -I 1: leading calls the per-iteration summary leaves out (nccl-tests' -K; the JSON keeps every call)", callback=checked(COUNT_OR_ZERO)),
    register: int = typer.Option(0, "--local-register", "-R", help="1: buffers from NCCL's allocator, registered with the communicator (nccl-tests' -R 1: torch's register_mem_pool; GPUs, --impl native); 2 (symmetric windows) is refused: torch.distributed has no call for it", callback=checked(Range(0, 2, integer=True))),
    spread: float = typer.Option(1.0, "--spread", help="all_to_allv: 0 even blocks to 1 distance-weighted (nccl-tests' NCCL_TESTS_ALLTOALLV_SPREAD, default 1)", callback=checked(Range(0, 1))),
    nthreads: int = typer.Option(1, "--nthreads", "-t", help="only 1 (nccl-tests' -t): torch.distributed runs one rank per process; give more ranks with --gpus"),
    parallel_init: int = typer.Option(0, "--parallel-init", "-p", help="0 or 1, the same here (nccl-tests' -p): every rank is a process of its own and sets up its communicator beside the others", callback=checked(Range(0, 1, integer=True))),
    timeout_s: float = typer.Option(120.0, "--timeout-s", "-T", help="per-operation timeout; a stuck or dead rank ends the run (nccl-tests' -T)", callback=checked(TIMEOUT_S)),
    fmt: str = typer.Option("text", "--format", help="text: nccl-tests' lines as each size finishes; table: a table per collective with the topology's bound and the prediction (the lines go to stderr as progress)"),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the result (meshscale JSON) here", callback=checked(output_file())),
    nccl_json: Optional[Path] = typer.Option(None, "--output-file", "-J", help="also write nccl-tests' JSON (its -J: version 3, what its tools/analyze_perf_json.py reads) here", callback=checked(output_file((".json",)))),
    csv_path: Optional[Path] = typer.Option(None, "--csv", help="write the rows as CSV here", callback=checked(output_file())),
) -> None:
    """Sweep collective sizes like nccl-tests: time, algbw, busbw, #wrong, and the topology's bound."""
    from meshscale.bench.collective import CollectiveSpec, parse_collectives, parse_dtypes, parse_ops
    from meshscale.units import sweep_sizes
    from meshscale.errors import check_choice
    from meshscale.execute.world import resolve_world

    check_choice(fmt, ("text", "table"), "format")
    algo = bench_algo(algo, impl)
    if nthreads != 1:
        raise MeshscaleError(f"-t {nthreads}: torch.distributed runs one rank per process, so ranks cannot share a "
                             "process as nccl-tests' threads do; give every rank a process: --gpus N (nccl-tests' "
                             "-t T -g G is --gpus T*G)")
    if place not in PLACE_CHOICES:
        raise MeshscaleError(f"--place {place!r}: use both, out or in")
    if check < 0 or cuda_graph < 0:
        raise MeshscaleError("--check and --cuda-graph take 0 (off) or a positive number (on)")
    world = resolve_world(gpus, cpus)
    if world.notice and _is_rank0():
        typer.echo(world.notice, err=True)
    spec = CollectiveSpec(collectives=parse_collectives(collectives or []),
                          sizes_bytes=sweep_sizes(min_bytes, max_bytes, factor, step_bytes), dtypes=parse_dtypes(dtype),
                          ops=parse_ops(op), root=root, blocking=blocking > 0, cpu_time=cpu_time > 0,
                          places=PLACE_CHOICES[place], warmup_iters=warmup_iters, iters=iters, average=average,
                          check=check > 0 and not no_check, cuda_graph=cuda_graph > 0, impl=impl, algo=algo,
                          per_iter=per_iter > 0, per_iter_skip=per_iter_skip, cycles=cycles, register=register,
                          spread=spread)
    _sweep_and_show(spec, world, fmt, timeout_s, json_path, csv_path, nccl_json)


def _sweep_and_show(spec, world, fmt: str, timeout_s: float, json_path: Optional[Path], csv_path: Optional[Path],
                    nccl_json: Optional[Path]) -> None:
    """Run the sweep, printing nccl-tests' lines as they come (the output in text format; progress on stderr for
    a table), then the closing lines and the files; exit 1 when any result was wrong."""
    import time

    from meshscale.bench.collective import SweepInterrupted, any_wrong, bench_collectives
    from meshscale.bench.nccl_json import write_nccl_tests_json
    from meshscale.bench.tables import RowStream, bound_lines, closing_lines, collective_tables, sweep_header
    from meshscale.cli.output import stream_width

    to_stderr = fmt == "table"
    stream = RowStream(spec.places, lambda line: typer.echo(line, err=to_stderr), spec.cycles,
                       stream_width(err=to_stderr), spec.per_iter) if _is_rank0() else None
    if stream:
        for line in sweep_header(spec, world.size, world.backend):
            typer.echo(line, err=to_stderr)
    started_s = time.time()
    try:
        result = bench_collectives(spec, world, timeout_s, on_row=stream.add if stream else None)
    except SweepInterrupted as stop:
        if _is_rank0():  # keep what was measured: the closing lines and the files, then the one-line error
            for line in closing_lines(stop.result):
                typer.echo(line)
            if stop.result.rows:
                write_result_files(stop.result, json_path, csv_path, " (interrupted)")
        raise
    if _is_rank0():
        if fmt == "table":
            print_tables(*collective_tables(result))
        for line in closing_lines(result) + (bound_lines(result) if fmt == "text" else []):
            typer.echo(line)
        write_result_files(result, json_path, csv_path)
        if nccl_json:
            typer.echo(f"wrote {write_nccl_tests_json(result, nccl_json, started_s)} (nccl-tests' JSON)")
    if any_wrong(result):
        typer.echo("meshscale: some results were wrong (see #wrong)", err=True)
        sys.exit(1)


@bench_app.command("p2p", short_help="Bandwidth and latency between every pair of devices")
def p2p(
    size: Optional[str] = typer.Option(None, "--size", help="bytes per copy (default 256M on GPUs, 16M on CPU workers)", callback=checked(size_bytes)),
    iters: int = typer.Option(10, "--iters", "-n", help="timed copies per pair", callback=checked(COUNT)),
    warmup_iters: int = typer.Option(2, "--warmup-iters", "-w", help="untimed copies before them", callback=checked(COUNT_OR_ZERO)),
    latency_iters: int = typer.Option(100, "--latency-iters", help="small copies whose median is the latency", callback=checked(COUNT)),
    gpus: Optional[int] = typer.Option(None, "--gpus", "-g", help="GPU count: the first N GPUs, every pair measured (default: all)", callback=checked(GPU_COUNT)),
    cpus: Optional[int] = typer.Option(None, "--cpus", help="CPU worker processes over Gloo (default when no GPU)", callback=checked(CPU_COUNT)),
    timeout_s: float = typer.Option(120.0, "--timeout-s", help="per-operation timeout for CPU workers", callback=checked(TIMEOUT_S)),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the result (meshscale JSON) here", callback=checked(output_file())),
    csv_path: Optional[Path] = typer.Option(None, "--csv", help="write the rows as CSV here", callback=checked(output_file())),
    plot: Optional[Path] = typer.Option(None, "--plot", help="write a heatmap image (PNG) here", callback=checked(output_file(plot=True))),
) -> None:
    """Bandwidth (one way, both ways, staged through the host) and latency between every pair of devices."""
    from meshscale import plots
    from meshscale.bench.p2p import P2PSpec, bench_p2p
    from meshscale.bench.tables import p2p_tables
    from meshscale.execute.world import resolve_world
    from meshscale.units import parse_bytes

    world = resolve_world(gpus, cpus)
    if world.notice and _is_rank0():
        typer.echo(world.notice, err=True)
    default = "256M" if world.backend == "nccl" else "16M"
    spec = P2PSpec(size_bytes=parse_bytes(size or default), iters=iters, warmup_iters=warmup_iters,
                   latency_iters=latency_iters)
    with progress(f"measuring every pair of {world.size} {'GPUs' if world.backend == 'nccl' else 'CPU workers'}: "
                  "one way, both ways, through the host, latency"):
        result = bench_p2p(spec, world, timeout_s)
    if not _is_rank0():
        return
    print_tables(*p2p_tables(result))
    write_result_files(result, json_path, csv_path)
    if plot:
        typer.echo(f"wrote {plots.save(plots.p2p_chart(result), plot)}")


@bench_app.command("io", short_help="Read and decode rates beside a training run's demand")
def io(
    path: str = typer.Argument(..., help="a folder of images (<class>/<image>, the ImageFolder layout) or a token file (.npy, uint16 .bin)"),
    readers: int = typer.Option(2, "--readers", help="reader (and decoder) processes", callback=checked(CPU_COUNT)),
    model: Optional[str] = typer.Option(None, "--model", help="the model trained on it: its input size, and with --system the predicted demand"),
    system: str = typer.Option("dgx1-p100", "--system", "-s", help="catalog system or file whose GPUs --model is predicted on"),
    gpus: int = typer.Option(8, "--gpus", help="GPU count: the GPUs of --system the run uses, one data-parallel rank each", callback=checked(GPU_COUNT)),
    batch: int = typer.Option(64, "--batch", help="samples per data-parallel rank per step (transformers: sequences)", callback=checked(BATCH)),
    from_result: Optional[Path] = typer.Option(None, "--from", help="a measured `train` or `scale` result: its samples/s is the demand"),
    decode_samples: int = typer.Option(2000, "--decode-samples", help="samples decoded to time decoding (spread over the set)", callback=checked(COUNT)),
    no_decode: bool = typer.Option(False, "--no-decode", help="time reading only"),
    timeout_s: float = typer.Option(600.0, "--timeout-s", help="longest any pass may take", callback=checked(TIMEOUT_S)),
    json_path: Optional[Path] = typer.Option(None, "--json", help="write the result (meshscale JSON) here", callback=checked(output_file())),
    csv_path: Optional[Path] = typer.Option(None, "--csv", help="write the rows as CSV here", callback=checked(output_file())),
) -> None:
    """Read and decode rates of a data set beside a training run's demand: is storage, decoding or the GPUs the limit?"""
    from meshscale.bench.io import IoSpec, bench_io, io_result, measured_demand, report_lines
    from meshscale.bench.tables import io_table

    shape, vocab = None, 1 << 16
    if model:
        from meshscale.models.registry import get_model
        spec = get_model(model)
        shape, vocab = spec.input_shape, spec.num_classes
    demand = measured_demand(from_result) if from_result else None
    if demand is None and model:
        demand = _predicted_demand(model, system, gpus, batch)
    report = bench_io(IoSpec(path, readers, shape, vocab, not no_decode, decode_samples, timeout_s), demand)
    print_tables(io_table(report))
    for line in report_lines(report):
        typer.echo(line)
    write_result_files(io_result(report), json_path, csv_path)


@bench_app.command("kernels", short_help="Measure the kernel atlas of this GPU for the step model")
def kernels(output: Path = typer.Option(..., "--output", help="where to write the atlas (JSON; meshscale ships "
                                        "its own in models/atlas/)", callback=checked(output_file((".json",))))) -> None:
    """Measure the kernel atlas on this GPU: matrix products over training's shapes, attention forward and backward,
    the memory-bound kernels, a kernel's floor, eager PyTorch's host cost per op (plain and DTensor), and one
    Llama block's element-wise kernels eager and torch.compile'd (bf16; float8 where torchao is installed). The
    step model prices GPUs of an atlas's family from it (`predict`)."""
    import torch

    from meshscale.bench.kernels import measure_atlas
    from meshscale.safe_io import atomic_write
    from meshscale.topology.nvml_discovery import model_facts

    if not torch.cuda.is_available():
        raise MeshscaleError("bench kernels measures a GPU's kernels, and this machine has none")
    name = torch.cuda.get_device_name()
    facts, known = model_facts(name)
    if not known or not facts.get("bf16_flops"):
        raise MeshscaleError(f"bench kernels: no datasheet for {name!r} in the GPU table (topology/gpu_models.yaml); "
                             "add its bf16 peak and memory bandwidth first")
    progress = lambda what: typer.echo(f"measuring {what}", err=True)  # noqa: E731
    atlas = measure_atlas(float(facts["bf16_flops"]), float(facts["memory_bandwidth_bytes_per_s"]),
                          "meshscale bench kernels", progress=progress)
    # the blocks run train's own transformer block (bench measures kernels, train builds models)
    from dataclasses import replace

    from meshscale.train.blocks import measure_blocks
    progress("transformer blocks, eager and compiled")
    atlas = replace(atlas, blocks=tuple(measure_blocks(torch.device("cuda", torch.cuda.current_device()), progress)))
    atomic_write(output, atlas.to_json())
    typer.echo(f"wrote {output}: {len(atlas.gemm)} matrix products, {len(atlas.attention)} attention points, "
               f"{len(atlas.blocks)} blocks on {name}")


def register(app: typer.Typer) -> None:
    """Add the `bench` sub-app to the meshscale app."""
    app.add_typer(bench_app, name="bench")


# the demand a prediction makes of storage: predicted here, in the CLI, since bench sits below predict
def _predicted_demand(model: str, system: str, gpus: int, batch: int) -> "Demand":
    """Samples/s `meshscale predict` gives for ``model`` on ``gpus`` GPUs of ``system`` at ``batch`` per GPU."""
    from meshscale.bench.io import Demand
    from meshscale.predict import PredictRequest, predict_rows

    rows, info, _ = predict_rows(PredictRequest(model=model, system=system, gpus=(gpus,), batch=batch))
    rate = float(rows[0]["throughput_samples_per_s"])
    return Demand(rate, f"PREDICTED: {model} on {gpus} GPU(s) of {system}, batch {batch} per GPU ({info.compute_source})",
                  True)
