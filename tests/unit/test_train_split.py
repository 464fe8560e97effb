"""`train`'s step figure and its split come from the same steps, and the split adds up to that figure: the
profiled steps' breakdown on random timelines, the median timed step's split on random rows, and the table that
prints them."""
import random
import re
from dataclasses import asdict

import pytest

from meshscale.models.layout import ParallelLayout
from meshscale.train.parallel.breakdown import DATA_LABEL, breakdown, mean_breakdown
from meshscale.train.runner import SPLIT_PARTS, SPLIT_STEP, breakdown_summary, median_step_split

MAIN, GLOO = 100, 101


def _op(name, start_ms, end_ms, tid=MAIN, cat="cpu_op"):
    return {"name": name, "cat": cat, "pid": MAIN, "tid": tid, "start_s": start_ms / 1e3, "end_s": end_ms / 1e3}


def _random_timeline(rng: random.Random, window_ms: float):
    """Operators, data ranges, waits and Gloo collectives at random, some of them reaching past the window."""
    def span():
        start = rng.uniform(-5, window_ms)
        return start, start + rng.uniform(0.1, window_ms / 3)
    events, entries = [], []
    for _ in range(rng.randint(0, 12)):
        events.append(_op(rng.choice(["aten::mm", "aten::linear", "_c10d_functional::wait_tensor"]), *span()))
    for _ in range(rng.randint(0, 2)):
        events.append(_op(DATA_LABEL, *span(), cat="user_annotation"))
    for _ in range(rng.randint(0, 5)):
        start, end = span()
        kind = rng.choice(["all_gather", "reduce_scatter"])
        events.append(_op(f"gloo:{kind}", start, end, GLOO, "user_annotation"))
        entries.append({"process_group": ["1", rng.choice(["mesh_tp", "mesh_fsdp"])],
                        "time_created_ns": int((start - 0.5) * 1e6), "profiling_name": f"gloo:{kind}"})
    return events, entries


def test_the_profiled_split_adds_up_to_its_step_time():
    rng = random.Random(43)
    for _ in range(300):
        window_ms, steps = rng.uniform(5, 50), rng.randint(1, 3)
        events, entries = _random_timeline(rng, window_ms)
        b = breakdown(events, entries, ParallelLayout(tp=2, fsdp=2), (0.0, window_ms / 1e3), steps)
        parts = (b.data_s, b.compute_s, b.exposed_comm_s, b.idle_s)
        assert all(p >= 0 for p in parts)
        assert sum(parts) == pytest.approx(b.step_time_s, rel=1e-9, abs=1e-12)


def test_the_summary_split_of_several_ranks_adds_up_to_the_step_it_sits_beside():
    rng = random.Random(7)
    for _ in range(50):
        window_ms = rng.uniform(5, 50)
        ranks = [breakdown(*_random_timeline(rng, window_ms), ParallelLayout(tp=2, fsdp=2), (0.0, window_ms / 1e3), 2)
                 for _ in range(rng.randint(1, 4))]
        s = breakdown_summary({}, [asdict(b) for b in ranks])
        assert sum(s[k] for k in SPLIT_PARTS) == pytest.approx(s[SPLIT_STEP], rel=1e-9)
        assert s["comm_share"] == pytest.approx(s["comm_s"] / s[SPLIT_STEP])
        assert mean_breakdown([asdict(b) for b in ranks])["step_time_s"] == s[SPLIT_STEP]


def test_the_timed_split_is_the_median_steps_own():
    rng = random.Random(11)
    for _ in range(200):
        rows = []
        for _ in range(rng.randint(1, 9)):
            data, compute = rng.uniform(0, 0.01), rng.uniform(0.01, 0.2)
            comm = None if rng.random() < 0.2 else rng.uniform(0, 0.1)
            rows.append({"data_s": data, "compute_s": compute, "comm_s": comm,
                         "step_time_s": data + compute + (comm or 0) + rng.uniform(0, 0.02)})
        s = median_step_split(rows)
        assert s["step_time_s"] == s[SPLIT_STEP] == sorted(r["step_time_s"] for r in rows)[(len(rows) - 1) // 2]
        assert sum(s[k] or 0 for k in SPLIT_PARTS) == pytest.approx(s["step_time_s"], rel=1e-12)
        assert s["compute_s"] in [r["compute_s"] for r in rows if r["step_time_s"] == s["step_time_s"]]


def test_the_train_table_puts_the_split_under_the_step_it_adds_up_to(cli):
    from types import SimpleNamespace

    from rich.console import Console

    from meshscale.cli.train import _summary_table
    summary = {"global_batch": 8, "samples_per_s": 10.0, "timed_steps": 1, "step_time_s": 0.580,
               "split_step_time_s": 0.266, "split_steps": 2, "split_from": "2 profiled warm-up steps",
               "data_s": 0.001, "compute_s": 0.200, "comm_s": 0.050, "idle_s": 0.015, "comm_share": 0.050 / 0.266,
               "memory_needed_bytes": 0.34 * (1 << 30), "memory_allowance_bytes": None, "layout": "tp2 fsdp2"}
    console = Console(width=200, record=True)
    console.print(_summary_table(SimpleNamespace(model="llama-tiny", mode="ddp", world=4, device="cpu"), summary))
    text = console.export_text()
    lines = [line for line in text.splitlines() if "ms" in line or "comm share" in line]
    assert "580.0" in lines[0] and "266.0" in lines[1] and "2 profiled warm-up steps" in lines[1]
    shown = [float(re.findall(r"[0-9.]+", line)[-1]) for line in lines[2:6]]
    assert sum(shown) == pytest.approx(266.0, abs=0.1)
    assert "19%" in text and "allowance" not in text
