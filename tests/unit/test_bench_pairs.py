"""`meshscale bench pairs`: the rounds hold every pair once, the statistic names a slowed worker (the test hook
MESHSCALE_SLOW_RANK), --bisect narrows to it, the result goes to JSON and the report, bad input is one line."""
from __future__ import annotations

import json
from itertools import combinations

import pytest

from meshscale.bench.pairs import outliers, round_robin, slow_rank_from_env
from meshscale.errors import MeshscaleError


@pytest.mark.parametrize("n", range(2, 12))
def test_rounds_meet_every_pair_once_in_linear_rounds(n):
    rounds = round_robin(n)
    met = [p for r in rounds for p in r]
    assert sorted(met) == list(combinations(range(n), 2))
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    for r in rounds:  # no worker twice in a round: the pairs of a round run at once
        ranks = [x for p in r for x in p]
        assert len(ranks) == len(set(ranks))


def rows_of(rates):
    return [{"rank_a": a, "rank_b": b, "p2p_bytes_per_s": v} for (a, b), v in rates.items()]


def test_the_statistic_names_the_worker_in_every_slow_pair():
    names = [f"w{i}" for i in range(6)]
    rates = {p: 10e9 * (0.9 + 0.02 * k) for k, p in enumerate(combinations(range(6), 2))}
    assert outliers(rows_of(rates), names).workers == []
    slowed = {p: v / 5 if 4 in p else v for p, v in rates.items()}
    found = outliers(rows_of(slowed), names)
    assert len(found.workers) == 1 and found.workers[0].startswith("w4 (")
    assert len(found.pairs) == 5 and all("w4" in p for p in found.pairs)
    one_link = {p: v / 5 if p == (1, 2) else v for p, v in rates.items()}  # a bad link, not a bad worker
    found = outliers(rows_of(one_link), names)
    assert found.workers == [] and found.pairs[0].startswith("w1-w2")


def test_slow_rank_hook_is_checked():
    assert slow_rank_from_env({"MESHSCALE_SLOW_RANK": "2:0.05"}).rank == 2
    assert slow_rank_from_env({}) is None
    with pytest.raises(MeshscaleError, match="RANK:SECONDS"):
        slow_rank_from_env({"MESHSCALE_SLOW_RANK": "two"})


@pytest.mark.slow  # rounds of pairs of CPU workers
@pytest.mark.timeout(120)
def test_a_slowed_worker_is_named_and_bisect_finds_it(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("MESHSCALE_SLOW_RANK", "2:0.02")
    out = tmp_path / "pairs.json"
    result = cli("bench", "pairs", "--cpus", 4, "--size", "64K", "--iters", 5, "--warmup-iters", 1, "--bisect",
                 "--json", out, "--timeout-s", 60)
    assert result.exit_code == 0, result.output
    assert "slow worker: worker2 (" in result.stdout
    saved = json.loads(out.read_text())
    assert saved["kind"] == "bench-pairs" and len(saved["rows"]) == 6
    assert [w.split()[0] for w in saved["meta"]["outlier_workers"]] == ["worker2"]
    assert saved["meta"]["bisect"][-1]["verdict"] == "[2] is slow"
    assert all(r["expected_bytes_per_s"] for r in saved["rows"])
    report = cli("report", out, "--output", tmp_path / "report")
    assert report.exit_code == 0 and "worker2" in (tmp_path / "report" / "index.html").read_text()


def test_one_worker_is_one_line_and_exit_2(cli):
    result = cli("bench", "pairs", "--cpus", 1)
    assert result.exit_code == 2 and "at least 2 workers" in result.stderr and result.stderr.count("\n") == 1


def test_a_slow_pair_and_a_slow_worker_name_their_link_and_nic():
    from meshscale.bench.pairs import outliers, pair_path
    from meshscale.topology.cluster import system_or_cluster

    cluster = system_or_cluster("hgx-h100", nodes=2, link="ndr", nics=8)
    assert pair_path(cluster, 0, 1) == "NV18"
    across = pair_path(cluster, 0, 9)
    assert across.startswith("NET via ") and across.count("/ib") == 2
    # workers 0 and 1 on node 0, 8 and 9 on node 1 (global device indices); worker 9 is slow everywhere
    ranks = [0, 1, 8, 9]
    rows = [{"rank_a": a, "rank_b": b, "p2p_bytes_per_s": (1e9 if 9 in (a, b) else 20e9),
             "path": pair_path(cluster, a, b)} for i, a in enumerate(ranks) for b in ranks[i + 1:]]
    found = outliers(rows, [f"w{r}" for r in range(10)])  # names by global rank; 2-7 take no part
    assert len(found.workers) == 1 and found.workers[0].startswith("w9") and "its NIC n1/ib" in found.workers[0]
    assert any(p.startswith("w8-w9 over NV18") for p in found.pairs)
    assert any(p.startswith("w0-w9 over NET via n0/ib") for p in found.pairs)
