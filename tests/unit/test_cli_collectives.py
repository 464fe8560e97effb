"""`meshscale plan` and `meshscale sim`: output, files, and one-line errors with exit code 2."""
import json

import pytest

from meshscale.results import load_result


def test_plan_explains_the_choice(cli, tmp_path):
    svg, js, sched = tmp_path / "plan.svg", tmp_path / "plan.json", tmp_path / "schedule.json"
    run = cli("plan", "all_reduce", "--system", "dgx1-p100", "--devices", "0,1,2,3,7",
              "--bytes", "64M", "--svg", str(svg), "--json", str(js), "--schedule", str(sched))
    code, out = run.exit_code, run.stdout
    assert code == 0
    for word in ("algorithm:", "predicted:", "busbw", "bottleneck:", "bound:", "candidates"):
        assert word in out
    assert svg.read_text().lstrip().startswith("<?xml") and "channel 0" in svg.read_text()
    result = load_result(js)
    assert result.kind == "plan" and result.predicted and result.rows[0]["busbw_bytes_per_s"] > 0
    assert json.loads(sched.read_text())["collective"] == "all_reduce"


def test_sim_sweep_rows_match_bench_keys(cli, tmp_path):
    js = tmp_path / "sim.json"
    run = cli("sim", "all_gather", "--system", "dgx1-v100", "--devices", "0,1,2,3",
              "--min-bytes", "1K", "--max-bytes", "1M", "--factor", "32", "--json", str(js))
    code, out = run.exit_code, run.stdout
    assert code == 0 and "busbw" in out
    result = load_result(js)
    assert result.kind == "sim" and result.predicted
    assert [r["size_bytes"] for r in result.rows] == [1024, 32768, 1048576]
    for key in ("collective", "size_bytes", "time_s", "algbw_bytes_per_s", "busbw_bytes_per_s", "algorithm"):
        assert all(key in r for r in result.rows)
    busbw = [r["busbw_bytes_per_s"] for r in result.rows]
    assert busbw == sorted(busbw)  # bigger messages amortize latency


@pytest.mark.parametrize("args, message", [
    (["plan", "all_reduce", "--system", "dgx1-p100", "--devices", "0,1,9"], "no gpu 9"),
    (["plan", "all_reduce", "--system", "dgx1-p100", "--devices", "0,1,1"], "repeat"),
    (["plan", "all_gather", "--system", "dgx1-p100", "--devices", "0,1,2", "--bytes", "10"], "split"),
    (["plan", "all_reduce", "--system", "dgx1-p100", "--algo", "two_shot", "--bytes", "1M"], "switch"),
    (["plan", "all_to_all", "--system", "dgx1-p100", "--algo", "tree_packing", "--bytes", "1M"], "cannot do"),
    (["plan", "allreduce", "--system", "dgx1-p100"], "unknown collective"),
    (["plan", "all_reduce", "--system", "dgx1-p100", "--devices", "a,b"], "--devices"),
    (["plan", "all_reduce", "--system", "dgx1-p100", "--gpus", "9"], "--gpus 9: dgx1-p100 has 8 GPUs"),
    (["sim", "all_reduce", "--system", "dgx1-p100", "--gpus", "1"], "pick 2 to 8"),
    (["plan", "all_reduce", "--system", "dgx1-p100", "--gpus", "2", "--devices", "0,1"], "not both"),
    (["sim", "all_reduce", "--system", "dgx1-p100", "--min-bytes", "2M", "--max-bytes", "1M"], "no sweep"),
    (["plan", "all_reduce", "--system", "dgx1-p100", "--p2p", "/nonexistent/p2p.json"], "cannot read"),
    # one --algo vocabulary: nccl, auto or a schedule; plan names the schedule (NCCL's pick is always beside it)
    (["sim", "all_reduce", "--system", "dgx1-p100", "--algo", "fastest"], "unknown --algo 'fastest'; use one of nccl, auto, ring"),
    (["plan", "all_reduce", "--system", "dgx1-p100", "--algo", "nccl"], "unknown --algo 'nccl'; use one of auto, ring"),
    (["sim", "all_reduce", "--system", "dgx1-p100", "--algo", "ring", "--nccl-algo", "tree"], "go with --algo nccl"),
])
def test_bad_input_is_one_line_and_exit_2(cli, args, message):
    run = cli(*args)
    code, err = run.exit_code, run.stderr
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("meshscale: error:") and message in lines[0], err


def test_gpus_counts_the_first_devices(cli, tmp_path):
    first, listed = tmp_path / "first.json", tmp_path / "listed.json"
    args = ("sim", "all_reduce", "--system", "dgx1-p100", "--min-bytes", "1M", "--max-bytes", "1M")
    assert cli(*args, "--gpus", "4", "--json", str(first)).exit_code == 0
    assert cli(*args, "--devices", "0,1,2,3", "--json", str(listed)).exit_code == 0
    assert load_result(first).rows == load_result(listed).rows
    run = cli("plan", "all_reduce", "--system", "dgx1-p100", "--gpus", "3", "--bytes", "1M")
    assert run.exit_code == 0 and "dgx1-p100 devices [0, 1, 2]" in run.stdout


def test_plan_calibrated_from_p2p(cli, tmp_path):
    from meshscale.results import Result
    rows = [{"src": f"gpu{a}", "dst": f"gpu{b}", "mode": "unidirectional", "bandwidth_bytes_per_s": 5e9, "latency_s": None}
            for a in range(4) for b in range(4) if a != b]
    p2p = Result("bench-p2p", rows).save(tmp_path / "p2p.json")
    args = ("plan", "broadcast", "--system", "pcie-4gpu", "--bytes", "64M")
    default = cli(*args).stdout
    run = cli(*args, "--p2p", str(p2p))
    code, calibrated = run.exit_code, run.stdout
    assert code == 0 and "calibrated from bench p2p" in calibrated

    def busbw(text):
        line = next(l for l in text.splitlines() if l.startswith("predicted:"))
        return float(line.split("busbw")[1].split("GB/s")[0])
    assert busbw(calibrated) < 0.6 * busbw(default)  # 5 GB/s measured instead of ~11 assumed


@pytest.mark.parametrize("system, args", [("dgx1-p100", ("broadcast", "--bytes", "1G")),
                                          ("hgx-h100", ("all_reduce", "--bytes", "1G")),
                                          ("dgx1-p100", ("all_reduce", "--devices", "0,1,2,3,7", "--bytes", "256M"))])
def test_plan_says_one_thing_and_explains_a_bound_it_passes(cli, system, args):
    """One headline, the faster of NCCL's choice and meshscale's schedule; the other explained on the next line;
    a headline above the links' bound says why on the bound's line."""
    run = cli("plan", args[0], "--system", system, *args[1:])
    assert run.exit_code == 0, run.output
    lines = run.stdout.splitlines()
    assert sum(l.startswith("predicted:") for l in lines) == 1
    headline = next(l for l in lines if l.startswith("predicted:"))
    versus = next(l for l in lines if l.startswith("versus:"))
    busbw = float(headline.split("busbw")[1].split("GB/s")[0])
    other = float(versus.split("busbw")[1].split("GB/s")[0])
    assert busbw >= other  # the faster one first
    bound = next(l for l in lines if l.startswith("bound:"))
    limit = float(bound.split("<=")[1].split("GB/s")[0])
    if busbw > limit * 1.001:
        assert "above the bound:" in bound


def test_sim_rows_above_their_bound_say_why(cli, tmp_path):
    from meshscale.results import load_result
    out = tmp_path / "sim.json"
    assert cli("sim", "all_reduce", "--system", "hgx-h100", "-b", "1G", "-e", "1G", "--json", str(out)).exit_code == 0
    for row in load_result(out).rows:
        if row["bound_busbw_bytes_per_s"] and row["busbw_bytes_per_s"] > row["bound_busbw_bytes_per_s"] * 1.001:
            assert "above the bound" in row["algorithm"]
