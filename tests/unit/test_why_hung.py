"""`meshscale why-hung`: dumps from a real hang on Gloo ranks (one rank skips a collective), dumps written in the
documented format (NCCL's started/completed states, a mismatch), NCCL logs, and bad input (exit 2, one line)."""
from __future__ import annotations

import multiprocessing
import os
import pickle
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from meshscale.report.why_hung import why_hung

HANG_TIMEOUT_S = 2


def _hang_rank(rank: int, port: int, out: str) -> None:
    """Two collectives together, then rank 0 enters an all_reduce that rank 1 skips; each dumps its trace."""
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timedelta(seconds=30))
    t = torch.ones(8)
    dist.all_reduce(t)
    dist.broadcast(t, 0)
    if rank == 0:
        try:  # rank 1 never joins: this one times out (the others had the group's long timeout, for a busy machine)
            dist.all_reduce(t, async_op=True).wait(timeout=timedelta(seconds=HANG_TIMEOUT_S))
        except RuntimeError:
            pass
    Path(out, f"nccl_trace_rank_{rank}").write_bytes(torch._C._distributed_c10d._dump_fr_trace())
    store.set(f"dumped{rank}", "1")
    store.wait(["dumped0", "dumped1"])  # rank 1 stays alive (and silent) while rank 0 waits for it
    os._exit(0)


@pytest.mark.timeout(60)
def test_a_real_gloo_hang_names_the_rank_and_the_collective(tmp_path, monkeypatch, cli):
    monkeypatch.setenv("TORCH_FR_BUFFER_SIZE", "100")  # Flight Recorder records Gloo too when given a buffer
    store = dist.TCPStore("127.0.0.1", 0, 3, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    # spawned, not forked: a forked child inherits this process's Flight Recorder buffer, with the entries of any
    # collective an earlier test ran in it
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_hang_rank, args=(r, store.port, str(tmp_path))) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    for p in procs:
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    report = why_hung(tmp_path)
    (group,) = report.groups
    assert group.front.op == "gloo:all_reduce" and group.front.seq == 3
    assert group.waiting == [0] and group.behind == [1]
    assert group.progress[1].last_entered.op == "gloo:broadcast"
    result = cli("why-hung", tmp_path)
    assert result.exit_code == 0
    assert "rank(s) [1] never entered it" in result.stdout and "gloo:all_reduce" in result.stdout


def entry(seq, op="nccl:all_reduce", state="completed", sizes=((1024,),), group=("0", "default_pg"), p2p=False):
    return {"record_id": seq, "pg_id": 0, "process_group": group, "collective_seq_id": seq, "p2p_seq_id": 0,
            "op_id": seq, "profiling_name": op, "input_sizes": [list(s) for s in sizes], "output_sizes": [],
            "state": state, "is_p2p": p2p, "retired": state == "completed", "timeout_ms": 600000, "frames": []}


def write_dumps(directory: Path, per_rank: dict[int, list[dict]], ranks="[0, 1, 2, 3]", version="2.10"):
    directory.mkdir(parents=True, exist_ok=True)
    for rank, entries in per_rank.items():
        dump = {"version": version, "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}},
                "pg_status": {}, "comm_lib_version": "2.21.5", "entries": entries}
        (directory / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump))
    return directory


def test_nccl_states_name_the_rank_that_did_not_complete(tmp_path):
    done = [entry(1), entry(2, "nccl:all_gather")]
    dumps = {0: done + [entry(3, state="started")], 1: done + [entry(3, state="started")],
             2: done + [entry(3, state="completed")], 3: done + [entry(3, state="scheduled")]}
    (group,) = why_hung(write_dumps(tmp_path, dumps)).groups
    assert group.behind == [] and group.not_completed == [0, 1, 3]
    assert [p.last_completed_seq for p in group.progress] == [2, 2, 3, 2]


def test_a_rank_behind_and_a_missing_dump(tmp_path):
    dumps = {0: [entry(1), entry(2, state="started")], 1: [entry(1), entry(2, state="started")],
             2: [entry(1), entry(9, "nccl:send", p2p=True)]}
    report = why_hung(write_dumps(tmp_path, dumps))
    (group,) = report.groups
    assert group.waiting == [0, 1] and group.behind == [2] and group.no_dump == [3]
    text = "\n".join(report.lines())
    assert "rank(s) [2] never entered it" in text and "no dump from ranks [3]" in text


def test_a_size_mismatch_is_named(tmp_path):
    dumps = {0: [entry(1), entry(2, state="started")], 1: [entry(1), entry(2, state="started", sizes=((512,),))]}
    (group,) = why_hung(write_dumps(tmp_path, dumps, ranks="[0, 1]")).groups
    assert "#2 differs" in group.mismatch and "rank 1 nccl:all_reduce sizes [[512]]" in group.mismatch


def test_nccl_log_lines(tmp_path):
    write_dumps(tmp_path, {0: [entry(1)], 1: [entry(1)]}, ranks="[0, 1]")
    (tmp_path / "job.log").write_text(
        "node1:100:200 [0] NCCL INFO comm 0xabc rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 18000 commId 0x1 - Init COMPLETE\n"
        "node2:300:400 [1] NCCL WARN NET/IB : Got completion with error 12, opcode 0, len 0, vendor err 129\n")
    report = why_hung(tmp_path)
    assert report.nccl.incomplete_init == ["communicator 0xabc: ranks [1] never printed Init COMPLETE (1 of 2 did)"]
    assert "node2" in report.nccl.warnings[0] and "vendor err 129" in report.nccl.warnings[0]


@pytest.mark.parametrize("make, said", [
    (lambda d: d.mkdir(), "no Flight Recorder dump"),
    (lambda d: write_dumps(d, {0: [entry(1)]}, version="1.5"), "format 1.5"),
    (lambda d: write_dumps(d, {0: [{"collective_seq_id": 1}]}), "an entry lacks profiling_name"),
    (lambda d: (write_dumps(d, {0: [entry(1)], 1: [entry(1)]}),
                (d / "nccl_trace_rank_1").write_bytes((d / "nccl_trace_rank_1").read_bytes()[:40])), "truncated"),
    (lambda d: (d.mkdir(), (d / "trace_0").write_bytes(pickle.dumps(Path("x")))), "which no Flight Recorder dump does"),
])
def test_bad_dump_directories_are_one_line_and_exit_2(tmp_path, cli, make, said):
    make(tmp_path / "d")
    result = cli("why-hung", tmp_path / "d")
    assert result.exit_code == 2 and said in result.stderr and result.stderr.count("\n") == 1, result.stderr
