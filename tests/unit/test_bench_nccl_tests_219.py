"""What nccl-tests 2.19 added, as `bench collective` does it: -I's per-iteration summary against numpy, alltoallv's
blocks (nccl-tests' generated pattern) and their exchange against an in-process oracle, -J's document in the shape
nccl-tests' tools read, and the flags torch.distributed cannot do refused by name (one line, exit 2)."""
import random

import numpy as np
import pytest
import torch

from meshscale.bench.cases import ALLTOALLV_ALIGN_BYTES, alltoallv_bytes, alltoallv_shape, count_wrong, make_case
from meshscale.bench.harness import iteration_stats, per_iteration
from meshscale.bench.nccl_json import nccl_tests_document
from meshscale.results import measured


def test_per_iteration_summary_matches_numpy():
    rng = random.Random(219)
    for _ in range(200):
        times = [rng.lognormvariate(-9, 0.5) for _ in range(rng.randint(1, 150))]
        skip = rng.randint(0, len(times) - 1)
        got, xs = iteration_stats(times, skip), np.array(times[skip:])
        assert got["iter_min_s"] == xs.min() and got["iter_max_s"] == xs.max()
        assert got["iter_mean_s"] == pytest.approx(xs.mean()) and got["iter_stdev_s"] == pytest.approx(xs.std())
        assert got["iter_p50_s"] == np.sort(xs)[len(xs) // 2]  # nccl-tests' p50: the upper middle
        for p in (95, 99):  # nearest rank
            assert got[f"iter_p{p}_s"] == np.percentile(xs, p, method="inverted_cdf")
        assert got["iter_cv_pct"] == pytest.approx(100 * xs.std() / xs.mean())


def test_each_call_is_its_slowest_ranks():
    ranks = [[1.0, 5.0, 2.0], [3.0, 1.0, 2.5]]
    got = per_iteration(ranks, skip=1)
    assert got["iter_times_s"] == [3.0, 5.0, 2.5] and got["iter_min_s"] == 2.5 and got["rank_iter_times_s"] == ranks


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 13])
def test_alltoallv_blocks_follow_nccl_tests_pattern(n):
    rng = random.Random(n)
    for _ in range(30):
        elem = rng.choice([1, 2, 4, 8])
        count, total = alltoallv_shape(rng.randint(16 * n, 1 << 22), n, elem)
        assert total == count * n * elem and (count * elem) % ALLTOALLV_ALIGN_BYTES == 0
        spread = rng.choice([0.0, 1.0, rng.random()])
        sent = [[alltoallv_bytes(s, d, n, total, spread) for d in range(n)] for s in range(n)]
        assert all(b % ALLTOALLV_ALIGN_BYTES == 0 and b >= 0 for row in sent for b in row)
        # a function of the distance alone: every rank sends and receives the same total, never more than asked
        assert len({sum(row) for row in sent} | {sum(col) for col in zip(*sent)}) == 1 and sum(sent[0]) <= total
        if spread == 0.0:
            assert len({b for row in sent for b in row}) == 1
        if spread == 1.0 and n > 1:
            assert all(sent[s][s] == 0 for s in range(n))
            assert sent[0] == sorted(sent[0])  # farther peers (in rank order after the sender) get more


@pytest.mark.parametrize("n", [2, 3, 5])
def test_alltoallv_buffers_exchanged_by_an_oracle_pass_the_check(n):
    cpu = torch.device("cpu")
    cases = [make_case("all_to_allv", 1024 * n, "bfloat16", "sum", 0, False, r, n, cpu, spread=0.7) for r in range(n)]
    for c in cases:
        c.reset()
    chunks = [list(c.inp.split(c.send_counts)) for c in cases]  # what each sender puts in each receiver's block
    for r, c in enumerate(cases):
        c.out.copy_(torch.cat([chunks[s][r] for s in range(n)]))
        assert count_wrong(c, "sum", n) == 0
        assert c.recv_counts == [cases[s].send_counts[r] for s in range(n)]
    if n > 2:  # blocks in the wrong order are caught
        c = cases[0]
        c.out.copy_(torch.cat([chunks[s][0] for s in reversed(range(n))]))
        assert count_wrong(c, "sum", n) > 0


def test_nccl_tests_json_has_the_fields_its_tools_read():
    rows = [{"collective": "all_gather", "size_bytes": 1024, "count": 128, "dtype": "float32", "redop": "none",
             "root": -1, "inplace": place, "time_s": 1e-4, "algbw_bytes_per_s": 1e7, "busbw_bytes_per_s": 5e6,
             "wrong": 0, **per_iteration([[1e-4, 2e-4], [3e-4, 1e-4]])} for place in (False, True)]
    result = measured("bench-collective", rows, spec={"sizes_bytes": [1024], "iters": 2, "per_iter": True},
                      world_size=2, backend="gloo")
    doc = nccl_tests_document(result, ["meshscale", "bench"], 0.0)
    assert doc["version"] == 3 and len(doc["results"]) == 1 and len(doc["config"]["devices"]) == 2
    entry = doc["results"][0]
    assert (entry["size"], entry["count"], entry["type"], entry["root"]) == (1024, 128, "float", "    -1")
    assert entry["out_of_place"] == {"time": pytest.approx(100.0), "alg_bw": pytest.approx(0.01),
                                     "bus_bw": pytest.approx(0.005), "nwrong": 0}
    per_iter = entry["in_place_per_iter"]
    assert per_iter["times_us"] == pytest.approx([300.0, 200.0]) and per_iter["max_us"] == pytest.approx(300.0)
    assert per_iter["per_process_max_times_us"] == [pytest.approx([100.0, 200.0]), pytest.approx([300.0, 100.0])]
    assert doc["out_of_bounds"] == {"count": 0, "okay": True}


@pytest.mark.parametrize("args, says", [
    (["-t", "2"], "one rank per process"),
    (["-R", "1"], "needs GPUs"),
    (["-R", "2"], "symmetric"),
    (["-K", "2"], "give -I 1"),
    (["-I", "1", "-K", "20"], "fewer than --iters"),
    (["all_reduce", "--spread", "0.5"], "add all_to_allv"),
    (["all_to_allv", "--impl", "meshscale"], "--impl native"),
    (["all_to_allv", "-b", "16", "-e", "16"], "per peer"),
    (["-J", "{tmp}/out.txt"], ".json"),
])
def test_what_torch_distributed_cannot_do_is_refused_by_name(cli, args, says, tmp_path):
    run = cli("bench", "collective", *(a.format(tmp=tmp_path) for a in args), "--cpus", "2")
    assert run.exit_code == 2 and says in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr
