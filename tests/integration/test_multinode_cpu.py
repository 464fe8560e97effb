"""Two torchrun agents on this machine act as two hosts (MESHSCALE_HOSTNAME tells them apart): `bench
collective` over Gloo joins the hosts' topologies and prints a bound and a prediction beside every row."""
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

# two torchrun agents and their ranks, fresh interpreters: 7-13 s each on 2 cores
pytestmark = pytest.mark.slow

SRC = Path(__file__).resolve().parents[2] / "src"


def _two_free_ports() -> int:
    """A port p with p + 1 free too (torchrun's store takes p, meshscale's rank store p + 1)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            return port
        except OSError:
            continue
    pytest.skip("no two adjacent free ports")


def _agents(args: list[str], timeout_s: float = 60, procs_per_node=(1, 1)) -> list[subprocess.CompletedProcess]:
    """One torchrun agent per host (node rank 0 and 1), each in its own session, all killed on timeout."""
    port = _two_free_ports()
    env = dict(os.environ, PYTHONPATH=f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", OMP_NUM_THREADS="1")
    procs = []
    for node_rank in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node",
               str(procs_per_node[node_rank]), "--node-rank", str(node_rank), "--master-addr", "127.0.0.1", "--master-port", str(port),
               "-m", "meshscale", *args]
        procs.append(subprocess.Popen(cmd, env=dict(env, MESHSCALE_HOSTNAME=f"host{node_rank}"), text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True))
    done = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout_s)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:  # no orphans: the agents and their workers share each agent's session
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return done


def test_two_hosts_join_and_every_row_has_a_bound_and_a_prediction():
    node0, node1 = _agents(["bench", "collective", "all_reduce", "-b", "1K", "-e", "64K", "-f", "8", "--cpus", "1", "--format", "table",
                            "--iters", "5", "--warmup-iters", "1"])
    assert node0.returncode == 0 and node1.returncode == 0, node0.stderr[-3000:] + node1.stderr[-3000:]
    out = node0.stdout
    assert "2 ranks over gloo on 2 hosts (host0, host1)" in out, out
    rows = [line for line in out.splitlines() if re.match(r"^[│|]\s+\d+\s+[│|]", line)]
    assert [int(r.split("│")[1]) for r in rows] == [1024, 8192, 65536], out
    for row in rows:
        cells = [c.strip() for c in row.strip("│ ").split("│")]
        bound, predicted_us, predicted_busbw = float(cells[-4]), float(cells[-2]), float(cells[-1])
        assert bound > 0 and predicted_us > 0 and predicted_busbw > 0, row
    assert "predicted" in out and "bound" in out
    assert "host0" not in node1.stdout  # only rank 0 prints the table


def test_hosts_that_disagree_stop_every_rank_with_one_line():
    node0, node1 = _agents(["bench", "collective", "all_reduce", "-b", "1K", "-e", "1K", "--cpus", "1"],
                           procs_per_node=(1, 2))
    assert node0.returncode != 0 and node1.returncode != 0
    errors = [line for line in (node0.stderr + node1.stderr).splitlines() if line.startswith("meshscale: error:")]
    assert len(errors) == 3  # every rank, one line each
    assert all("hosts disagree: host0 has 1x CPU process (Gloo), host1 has 2x" in e for e in errors), errors
    assert "exitcode  : 2" in node1.stderr  # the CLI's exit status for bad input


def test_one_host_rows_carry_a_prediction_and_the_table_shows_it():
    from rich.console import Console

    from meshscale.bench.collective import CollectiveSpec, bench_collectives
    from meshscale.bench.tables import collective_tables
    from meshscale.execute.world import World

    spec = CollectiveSpec(collectives=["all_reduce", "all_gather"], sizes_bytes=[1024, 65536], warmup_iters=0, iters=2)
    result = bench_collectives(spec, World(2, "gloo"), timeout_s=30)
    assert all(r["predicted_time_s"] > 0 and r["predicted_busbw_bytes_per_s"] > 0 for r in result.rows)
    small, large = (next(r for r in result.rows if r["collective"] == "all_reduce" and r["size_bytes"] == n)
                    for n in (1024, 65536))
    assert large["predicted_time_s"] > small["predicted_time_s"]
    console = Console(width=250, record=True)
    for table in collective_tables(result):
        console.print(table)
    text = console.export_text()
    assert text.count("predicted") >= 4 and f"{small['predicted_time_s'] * 1e6:.2f}" in text


def test_p2p_across_two_hosts_records_the_joined_topology(tmp_path):
    from meshscale.results import load_result

    out = tmp_path / "p2p.json"
    node0, node1 = _agents(["bench", "p2p", "--cpus", "1", "--size", "4K", "--iters", "2", "--warmup-iters", "0",
                            "--latency-iters", "2", "--json", str(out)])
    assert node0.returncode == 0 and node1.returncode == 0, node0.stderr[-3000:] + node1.stderr[-3000:]
    result = load_result(out)
    assert {(r["src"], r["dst"]) for r in result.rows if r["mode"] == "unidirectional"} == {("worker0", "worker1"),
                                                                                            ("worker1", "worker0")}
    topology = result.meta["topology"]
    assert topology is not None and topology["attrs"]["hosts"] == ["host0", "host1"], topology and topology["attrs"]


def test_scale_under_torchrun_sweeps_inside_the_world_and_predicts_on_the_joined_hosts(tmp_path):
    from meshscale.results import load_result

    out = tmp_path / "scale.json"
    node0, node1 = _agents(["scale", "--weak", "--batch", "8", "--model", "small-cnn", "--steps", "4", "--timing-warmup", "1",
                            "--cpus", "1,2", "--timeout-s", "30", "--json", str(out)])
    assert node0.returncode == 0 and node1.returncode == 0, node0.stderr[-3000:] + node1.stderr[-3000:]
    text = node0.stdout
    assert "weak scaling on 2 hosts (host0, host1)" in text and "PREDICTED/s" in text, text
    assert "PREDICTED on 2 hosts (host0, host1)" in text and "CPU/Gloo model" in text, text
    result = load_result(out)
    assert result.meta["topology"]["attrs"]["hosts"] == ["host0", "host1"]
    assert [r["world_size"] for r in result.rows] == [1, 2]  # a sweep inside torchrun's 2 ranks
    lines = text.splitlines()
    for row in result.rows:  # each table row shows its measured figure and, beside it, the predicted one
        cells = [f"{row[k]:,.1f}" for k in ("throughput_samples_per_s", "predicted_samples_per_s")]
        assert row["predicted_samples_per_s"] > 0, row
        assert any(line.strip("│ ").startswith(f"{row['world_size']} ") and all(c in line for c in cells)
                   for line in lines), (cells, text)
    assert "samples/s" not in node1.stdout  # only rank 0 prints
