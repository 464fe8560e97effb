"""The step's time split from a profile: span arithmetic against a brute-force oracle, communication attributed to
the dimension whose group ran it, and exposed time as the part no compute covers."""
import random

import pytest

from meshscale.models.layout import ParallelLayout
from meshscale.train.parallel.breakdown import DATA_LABEL, breakdown, length, mean_breakdown, minus, union

MAIN, GLOO = 100, 101  # the main thread (its id is the process id) and a Gloo worker thread


def _grid(spans):
    return {t for a, b in spans for t in range(a, b)}


def test_span_arithmetic_matches_counting_unit_cells():
    rng = random.Random(7)
    for _ in range(200):
        a = [(s, s + rng.randint(1, 30)) for s in (rng.randint(0, 150) for _ in range(rng.randint(0, 6)))]
        b = [(s, s + rng.randint(1, 30)) for s in (rng.randint(0, 150) for _ in range(rng.randint(0, 6)))]
        assert length(a) == len(_grid(a))
        assert length(minus(a, b)) == len(_grid(a) - _grid(b))
        assert all(x[1] < y[0] for x, y in zip(union(a), union(a)[1:]))  # disjoint, ordered


def _op(name, start_ms, end_ms, tid=MAIN, cat="cpu_op"):
    return {"name": name, "cat": cat, "pid": MAIN, "tid": tid, "start_s": start_ms / 1e3, "end_s": end_ms / 1e3}


def _entry(group, created_ms, name="gloo:all_gather"):
    return {"process_group": ["1", group], "time_created_ns": int(created_ms * 1e6), "profiling_name": name}


def test_exposed_time_is_the_communication_no_compute_covers():
    # one step of 20 ms: data 0-1, compute 1-10 and 14-18, a wait 10-14 inside an operator that spans 9-15
    events = [_op(DATA_LABEL, 0, 1, cat="user_annotation"), _op("aten::to", 0, 1),
              _op("aten::mm", 1, 10), _op("aten::linear", 9, 15), _op("_c10d_functional::wait_tensor", 10, 14),
              _op("aten::mm", 14, 18),
              # tp's all-gather runs 8-13 on a Gloo thread; fsdp's reduce-scatter 17-20
              _op("gloo:all_gather", 8, 13, GLOO, "user_annotation"),
              _op("gloo:reduce_scatter", 17, 20, GLOO, "user_annotation")]
    entries = [_entry("mesh_tp", 7.5), _entry("mesh_fsdp", 16.9, "gloo:reduce_scatter"),
               _entry("meshscale_loss", 19, "gloo:all_reduce")]  # no event: nothing to attribute
    b = breakdown(events, entries, ParallelLayout(tp=2, fsdp=2), (0.0, 0.020), steps=1)
    tp, fsdp = b.dimensions["tp"], b.dimensions["fsdp"]
    assert (tp.busy_s, tp.exposed_s) == pytest.approx((0.005, 0.003))      # 10-13 not computing
    assert (fsdp.busy_s, fsdp.exposed_s) == pytest.approx((0.003, 0.002))  # 18-20
    assert (b.data_s, b.compute_s) == pytest.approx((0.001, 0.013))          # 1-10, 14-18
    assert b.exposed_comm_s == pytest.approx(0.005)
    assert b.idle_s == pytest.approx(0.020 - 0.001 - 0.013 - 0.005)         # 13-14
    assert b.bubble_s is None


def test_collectives_of_one_kind_are_matched_in_order_of_issue():
    # two all-gathers, fsdp's issued first, tp's second: the first to start is fsdp's
    events = [_op("gloo:all_gather", 2, 4, GLOO, "user_annotation"), _op("gloo:all_gather", 5, 9, GLOO + 1,
                                                                          "user_annotation")]
    b = breakdown(events, [_entry("mesh_tp", 1.5), _entry("mesh_fsdp", 1)], ParallelLayout(tp=2, fsdp=2),
                  (0.0, 0.010), steps=2)
    assert b.dimensions["fsdp"].busy_s == pytest.approx(0.001)  # 2 ms over 2 steps
    assert b.dimensions["tp"].busy_s == pytest.approx(0.002)


def test_pipeline_receives_are_the_bubble():
    events = [_op("aten::mm", 0, 4), _op("gloo:recv", 4, 9, MAIN, "user_annotation"), _op("aten::mm", 9, 10),
              _op("gloo:send", 10, 11, MAIN, "user_annotation")]
    b = breakdown(events, [], ParallelLayout(pp=2, micro_batches=2), (0.0, 0.011), steps=1)
    assert b.bubble_s == pytest.approx(0.005)
    assert (b.dimensions["pp"].busy_s, b.dimensions["pp"].exposed_s) == pytest.approx((0.006, 0.006))


def test_one_rank_dimensions_have_no_communication():
    events = [_op("aten::mm", 0, 4), _op("gloo:all_gather", 1, 2, GLOO, "user_annotation")]
    b = breakdown(events, [_entry("mesh_fsdp", 0.5)], ParallelLayout(), (0.0, 0.004), steps=1)
    assert b.dimensions == {} and b.exposed_comm_s == 0


def test_gpu_compute_is_the_kernels_that_are_not_nccl():
    kernels = [_op("ampere_bf16_gemm", 0, 6, 7, "kernel"), _op("ncclDevKernel_AllGather_RING_LL", 4, 9, 8, "kernel")]
    b = breakdown(kernels, [_entry("mesh_fsdp", 0, "nccl:all_gather_into_tensor_coalesced")],
                  ParallelLayout(fsdp=2), (0.0, 0.010), steps=1)
    assert (b.dimensions["fsdp"].busy_s, b.dimensions["fsdp"].exposed_s) == pytest.approx((0.005, 0.003))
    assert b.compute_s == pytest.approx(0.006)


def test_ranks_are_averaged_per_dimension():
    one = {"steps": 2, "step_time_s": 1.0, "data_s": 0.0, "compute_s": 0.5, "exposed_comm_s": 0.2, "idle_s": 0.3,
           "bubble_s": None, "dimensions": {"tp": {"busy_s": 0.4, "exposed_s": 0.2}}}
    two = {**one, "step_time_s": 3.0, "dimensions": {"tp": {"busy_s": 0.2, "exposed_s": 0.0}}}
    m = mean_breakdown([one, two, None])
    assert m["step_time_s"] == 2.0 and m["bubble_s"] is None
    assert m["dimensions"]["tp"] == pytest.approx({"busy_s": 0.3, "exposed_s": 0.1})
    assert mean_breakdown([None]) is None


def test_a_batch_of_sends_and_receives_on_nccl_is_the_pipelines_and_its_bubble():
    kernels = [_op("ampere_bf16_gemm", 0, 4, 7, "kernel"), _op("ncclDevKernel_SendRecv", 3, 8, 9, "kernel")]
    b = breakdown(kernels, [_entry("mesh_pp", 2.5, "nccl:coalesced")], ParallelLayout(pp=2, micro_batches=2),
                  (0.0, 0.010), steps=1)
    assert (b.dimensions["pp"].busy_s, b.bubble_s) == pytest.approx((0.005, 0.004))
