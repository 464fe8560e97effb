"""bench collective over Gloo: every collective correct on 2 and 4 ranks, nccl-tests busbw factors, the JSON
file, a rank killed mid-sweep, and bad input (one line, exit 2). One launch runs a whole mini-sweep."""
import json
import os
import time

import pytest
import torch

from meshscale.bench.collective import CollectiveSpec, bench_collectives, rank_sweep
from meshscale.collectives.kinds import KINDS, NAMES as COLLECTIVES, SCHEDULABLE, kind
from meshscale.execute import WorkerError, launch
from meshscale.execute.world import World
from meshscale.results import load_result

SIZES = [64, 4096]  # bytes; divisible by 4 ranks x 4 bytes
REDUCING = [k.name for k in KINDS if k.reducing]


def _sweeps(ctx, specs):
    return [rank_sweep(ctx, spec) for spec in specs]


def _specs():
    specs = [CollectiveSpec(collectives=list(COLLECTIVES), sizes_bytes=SIZES, dtypes=(dtype,), ops=("sum",), root=1,
                            places=("out", "in"), warmup_iters=1, iters=2)
             for dtype in ("float32", "float16", "bfloat16", "int32")]
    specs += [CollectiveSpec(collectives=REDUCING, sizes_bytes=SIZES[:1], dtypes=("bfloat16",), ops=(op,), root=0,
                             places=("out", "in"), warmup_iters=0, iters=1)
              for op in ("prod", "min", "max")]  # avg: NCCL only (the GPU test)
    specs.append(CollectiveSpec(collectives=list(SCHEDULABLE), sizes_bytes=SIZES[:1], dtypes=("float32",), ops=("sum",), root=1,
                                places=("out", "in"), warmup_iters=0, iters=1, impl="meshscale"))
    specs.append(CollectiveSpec(collectives=["all_reduce"], sizes_bytes=SIZES[:1], dtypes=("int32",), ops=("sum",), root=0,
                                places=("in",), warmup_iters=0, iters=1, impl="meshscale", algo="halving_doubling"))
    return specs


@pytest.mark.parametrize("world", [2, 4])
def test_every_collective_is_correct_and_uses_the_nccl_tests_factor(world):
    specs = _specs()
    results = launch(_sweeps, world, (specs,), timeout_s=60)
    assert all(r == results[0] for r in results[1:])  # every rank returns the same rows (times are gathered)
    rows = [row for sweep in results[0] for row in sweep]
    seen = {(r["collective"], r["dtype"], r["redop"]) for r in rows}
    assert {c for c, _, _ in seen} == set(COLLECTIVES)
    assert len(rows) == sum(len(s.sizes_bytes) for s in specs for _ in s.collectives) + \
        sum(len(s.sizes_bytes) for s in specs for c in s.collectives if c in ("all_gather", "reduce_scatter"))
    for row in rows:
        assert row["wrong"] == 0, row
        assert len(row["rank_times_s"]) == world  # nccl-tests' default --average 1: the mean over ranks
        assert row["time_s"] == pytest.approx(sum(row["rank_times_s"]) / world, rel=1e-12)
        assert row["algbw_bytes_per_s"] == pytest.approx(row["size_bytes"] / row["time_s"])
        factor = kind(row["collective"]).busbw_factor(world)
        assert row["busbw_bytes_per_s"] == pytest.approx(row["algbw_bytes_per_s"] * factor)


class _DiesAt:
    """A RankContext stand-in whose rank 1 dies when it starts the named operation."""

    def __init__(self, ctx, target):
        self._ctx, self._target = ctx, target

    def __getattr__(self, name):
        return getattr(self._ctx, name)

    def phase(self, text):
        self._ctx.phase(text)
        if self._ctx.rank == 1 and text.startswith(self._target):
            os._exit(9)


def _dies_mid_sweep(ctx, spec):
    return rank_sweep(_DiesAt(ctx, "all_gather 4K"), spec)


def test_rank_killed_mid_sweep_is_named_and_nobody_hangs():
    spec = CollectiveSpec(collectives=["all_reduce", "all_gather"], sizes_bytes=[1024, 4096, 16384], iters=2,
                          warmup_iters=1)
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"rank 1 died \(exit code 9\) during all_gather 4K out-of-place"):
        launch(_dies_mid_sweep, 3, (spec,), timeout_s=15)
    assert time.monotonic() - start < 15


def test_cli_json_result_schema(tmp_path, cli):
    out = tmp_path / "ar.json"
    run = cli("bench", "collective", "all_reduce", "all_to_all", "--cpus", "2",
              "-b", "1K", "-e", "2K", "-n", "2", "-w", "1", "--json", str(out))
    assert run.exit_code == 0
    printed = run.stdout
    assert "all_reduce" in printed and "busbw" in printed and "wrote" in printed
    result = load_result(out)
    assert result.kind == "bench-collective" and not result.predicted
    keys = {"collective", "size_bytes", "count", "dtype", "redop", "root", "inplace", "time_s", "algbw_bytes_per_s",
            "busbw_bytes_per_s", "wrong", "bound_busbw_bytes_per_s"}
    assert len(result.rows) == 4 and all(keys <= set(r) for r in result.rows)
    assert {r["size_bytes"] for r in result.rows} == {1024, 2048}
    assert result.meta["world_size"] == 2 and result.meta["backend"] == "gloo"
    assert result.meta["topology"]["name"] == "cpu-host"
    assert all(r["bound_busbw_bytes_per_s"] > 0 for r in result.rows)
    assert result.software["torch"] and "hostname" in result.machine
    json.loads(out.read_text())  # plain JSON, no NaN tricks


def test_cli_per_iteration_timing_alltoallv_and_nccl_tests_json(tmp_path, cli):
    """nccl-tests 2.19's -I (with -K), alltoallv and -J in one run over Gloo."""
    out, nt = tmp_path / "ar.json", tmp_path / "nccl-tests.json"
    run = cli("bench", "collective", "all_reduce", "all_to_allv", "--cpus", "2", "-b", "1K", "-e", "4K", "-n", "5",
              "-w", "1", "-I", "1", "-K", "1", "--format", "table", "--json", str(out), "-J", str(nt))
    assert run.exit_code == 0, run.stderr
    assert "i_p99(us)" in run.stdout and "i_cv%" in run.stdout and "i_min" in run.stderr  # table; nccl-tests' lines
    rows = load_result(out).rows
    assert {r["collective"] for r in rows} == {"all_reduce", "all_to_allv"} and len(rows) == 6
    for row in rows:  # each call's time is its slowest rank's; the summary leaves out the first call (-K 1)
        assert row["iter_times_s"] == [max(t) for t in zip(*row["rank_iter_times_s"])]
        assert row["iter_min_s"] == min(row["iter_times_s"][1:]) and row["iter_max_s"] == max(row["iter_times_s"][1:])
        assert row["iter_min_s"] <= row["iter_p50_s"] <= row["iter_p99_s"] == row["iter_max_s"]  # p99 of 4 calls
        assert row["wrong"] == 0
    doc = json.loads(nt.read_text())
    assert doc["version"] == 3 and doc["config"]["per_iter_skip"] == 1
    entry = next(e for e in doc["results"] if e["experiment_name"] == "all_to_allv")
    assert entry["in_place"] is None and entry["out_of_place"]["nwrong"] == 0
    per_iter = entry["out_of_place_per_iter"]
    assert per_iter["times_us"] == [max(t) for t in zip(*per_iter["per_process_max_times_us"])]
    plain = cli("bench", "collective", "all_reduce", "--cpus", "2", "-b", "1K", "-e", "1K", "-n", "2", "-w", "0",
                "--json", str(tmp_path / "plain.json"))
    assert plain.exit_code == 0 and "i_max" not in plain.stdout
    assert "iter_times_s" not in load_result(tmp_path / "plain.json").rows[0]


def test_cli_cycles_report_the_median_cycle_and_print_each(tmp_path, cli):
    out = tmp_path / "ar.json"
    run = cli("bench", "collective", "all_reduce", "all_gather", "--cpus", "2", "-b", "1K", "-e", "2K", "-n", "2",
              "-w", "0", "-N", "3", "--format", "table", "--json", str(out))
    assert run.exit_code == 0, run.stderr
    assert all(f"# cycle {k} of 3" in run.stderr for k in (1, 2, 3)) and "median of 3 cycles" in run.stdout
    rows = load_result(out).rows
    assert len(rows) == 2 + 4  # one row per (collective, size, place), not per cycle
    for row in rows:
        assert len(row["cycle_times_s"]) == 3 and "cycle" not in row
        assert row["time_s"] == sorted(row["cycle_times_s"])[1]
        assert row["algbw_bytes_per_s"] == pytest.approx(row["size_bytes"] / row["time_s"])
        assert row["wrong"] == 0
    assert cli("bench", "collective", "all_reduce", "--cpus", "2", "-N", "0").exit_code == 2


@pytest.mark.gpu
@pytest.mark.parametrize("impl", ["native", "nccl"])
@pytest.mark.parametrize("cuda_graph", [False, True])
def test_gpu_sweep_is_correct(cuda_graph, impl):
    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip("needs 2 GPUs")
    collectives = [c for c in COLLECTIVES if impl == "native" or not kind(c).variable] if not cuda_graph else \
        ["all_reduce", "all_gather", "reduce_scatter", "broadcast"]
    spec = CollectiveSpec(collectives=collectives, sizes_bytes=[n * 1024, n * (1 << 20)], dtypes=("bfloat16",),
                          ops=("avg",) if not cuda_graph else ("sum",), root=0, places=("out", "in"), warmup_iters=2, iters=5,
                          cuda_graph=cuda_graph, impl=impl, per_iter=cuda_graph,
                          cycles=2 if cuda_graph else 1)
    result = bench_collectives(spec, World(n, "nccl"), timeout_s=60)
    assert {r["collective"] for r in result.rows} == set(collectives)
    assert all(r["wrong"] == 0 for r in result.rows)
    for r in result.rows if cuda_graph else ():  # each call timed by events between the replays, two cycles
        assert 0 < r["iter_p50_s"] <= r["iter_max_s"] and min(r["cycle_times_s"]) <= r["iter_max_s"] * 1.001
        assert len(r["cycle_times_s"]) == 2 and r["time_s"] == pytest.approx(sum(r["cycle_times_s"]) / 2)
    assert all(r["bound_busbw_bytes_per_s"] for r in result.rows if not kind(r["collective"]).variable)


@pytest.mark.gpu
def test_gpu_registered_buffers_are_correct():
    """-R 1: every size's buffers from NCCL's allocator, registered with torch's communicator."""
    n = torch.cuda.device_count()
    if n < 2:
        pytest.skip("needs 2 GPUs")
    spec = CollectiveSpec(collectives=["all_reduce", "all_gather", "reduce_scatter", "all_to_allv"],
                          sizes_bytes=[n * 1024, n * (1 << 20)], dtypes=("bfloat16",), warmup_iters=2, iters=5,
                          register=1, per_iter=True)
    result = bench_collectives(spec, World(n, "nccl"), timeout_s=60)
    assert all(r["wrong"] == 0 for r in result.rows) and len(result.rows) == 2 * (1 + 2 + 2 + 1)
