"""`meshscale why-hung`: dumps from a real hang on Gloo ranks (one rank skips a collective), dumps written in the
documented format (NCCL's started/completed states, a mismatch), NCCL logs, and bad input (exit 2, one line)."""
from __future__ import annotations

import json
import os
import pickle
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from meshscale.execute.launcher import forkserver_context
from meshscale.report.why_hung import why_hung

HANG_TIMEOUT_S = 2


def _hang_rank(rank: int, port: int, out: str) -> None:
    """Two collectives together, then rank 0 enters an all_reduce that rank 1 skips; each dumps its trace."""
    os.environ["TORCH_FR_BUFFER_SIZE"] = "100"  # Flight Recorder records Gloo too when given a buffer
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
def test_a_real_gloo_hang_names_the_rank_and_the_collective(tmp_path, cli):
    store = dist.TCPStore("127.0.0.1", 0, 3, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    # from meshscale's fork server, not forked from here: a child of this process would inherit its Flight
    # Recorder buffer, with the entries of any collective an earlier test ran in it; the server runs none
    ctx = forkserver_context()
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
    assert report.nccl.incomplete_init == ["communicator 0xabc: ranks 1 never printed Init COMPLETE (1 of 2 did)"]
    assert "node2" in report.nccl.warnings[0] and "vendor err 129" in report.nccl.warnings[0]


@pytest.mark.parametrize("make, said", [
    (lambda d: d.mkdir(), "no Flight Recorder dump"),
    (lambda d: write_dumps(d, {0: [entry(1)]}, version="1.5"), "format 1.5"),
    (lambda d: write_dumps(d, {0: [{"collective_seq_id": 1}]}), "entries[0]: lacks profiling_name"),
    (lambda d: (write_dumps(d, {0: [entry(1)], 1: [entry(1)]}),
                (d / "nccl_trace_rank_1").write_bytes((d / "nccl_trace_rank_1").read_bytes()[:40])), "truncated"),
    (lambda d: (d.mkdir(), (d / "trace_0").write_bytes(pickle.dumps(Path("x")))), "which no Flight Recorder dump holds"),
])
def test_bad_dump_directories_are_one_line_and_exit_2(tmp_path, cli, make, said):
    make(tmp_path / "d")
    result = cli("why-hung", tmp_path / "d")
    assert result.exit_code == 2 and said in result.stderr and result.stderr.count("\n") == 1, result.stderr


def write_json(directory: Path, dump) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "trace_0.json").write_text(dump if isinstance(dump, str) else json.dumps(dump))
    return directory


def dump_with(**fields) -> dict:
    dump = {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0]"}},
            "entries": [entry(1)]}
    for key, value in fields.items():
        if key in dump:
            dump[key] = value
        else:
            dump["entries"][0][key] = value
    return dump


def seq_literal(literal: str) -> str:
    """A dump whose sequence id is ``literal`` as JSON text (what json.dumps would not write)."""
    return json.dumps(dump_with(collective_seq_id=12345)).replace("12345", literal)


HOSTILE_DUMPS = {  # each field of the typed reader given the wrong type or range: one line naming it
    "entries an int": (dump_with(entries=7), "entries"),
    "entries null": (dump_with(entries=None), "entries"),
    "an entry a string": (dump_with(entries=["x"]), "entries[0]"),
    "seq a string": (dump_with(collective_seq_id="3"), "collective_seq_id"),
    "seq NaN": (seq_literal("NaN"), "NaN"),
    "seq infinity": (seq_literal("1e999"), "collective_seq_id"),
    "seq a fraction": (seq_literal("2.5"), "collective_seq_id"),
    "seq a list": (dump_with(collective_seq_id=[1]), "collective_seq_id"),
    "seq negative": (dump_with(collective_seq_id=-1), "collective_seq_id"),
    "seq 2**70": (dump_with(collective_seq_id=2**70), "collective_seq_id"),
    "state unknown": (dump_with(state="done"), "state"),
    "sizes a dict": (dump_with(input_sizes={"a": 1}), "input_sizes"),
    "pg_config a list": (dump_with(pg_config=[1, 2]), "pg_config"),
    "a group a list": (dump_with(pg_config={"0": [0, 1]}), "pg_config"),
    "ranks huge": (dump_with(pg_config={"0": {"name": "0", "ranks": "[99999999999]"}}), "ranks"),
    "process group a dict": (dump_with(process_group={"a": 1}), "process_group"),
    "op a number": (dump_with(profiling_name=3), "profiling_name"),
    "version 5001 digits": (dump_with(version="9" * 5001), "version"),
    "version a number": (dump_with(version=2.1), "version"),
    "deep JSON": ('{"version": "2.10", "pg_config": {}, "entries": ' + "[" * 100000 + "]" * 100000 + "}",
                  "nested too deeply"),
    "a huge integer": ('{"version": "2.10", "pg_config": {}, "entries": [' + "9" * 5001 + "]}", "not valid JSON"),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("name", HOSTILE_DUMPS)
def test_hostile_dump_fields_are_one_line_naming_the_field(tmp_path, cli, name):
    dump, field_name = HOSTILE_DUMPS[name]
    started = time.process_time()  # CPU time: an unbounded read spends it, a loaded machine does not
    result = cli("why-hung", write_json(tmp_path / "d", dump))
    assert result.exit_code == 2 and field_name in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert time.process_time() - started < 15  # (a blocked read is pytest-timeout's)


def test_a_pickle_is_parsed_never_unpickled(tmp_path, cli, monkeypatch):
    """A pickle that would run code when unpickled is refused by its opcode, and pickle's loader never runs."""
    monkeypatch.setattr(pickle, "loads", None)
    monkeypatch.setattr(pickle, "Unpickler", None)
    d = tmp_path / "d"
    d.mkdir()
    (d / "trace_0").write_bytes(b"cos\nsystem\n(S'echo hi'\ntR.")
    result = cli("why-hung", d)
    assert result.exit_code == 2 and "opcode GLOBAL" in result.stderr and result.stderr.count("\n") == 1
    write_dumps(tmp_path / "ok", {0: [entry(1)], 1: [entry(1)]}, ranks="[0, 1]")
    assert why_hung(tmp_path / "ok").groups[0].waiting == [0, 1]


def test_a_self_referencing_pickle_is_one_line(tmp_path, cli):
    cyclic: list = []
    cyclic.append(cyclic)
    d = tmp_path / "d"
    d.mkdir()
    (d / "trace_0").write_bytes(pickle.dumps({"version": "2.10", "pg_config": {}, "entries": cyclic}))
    result = cli("why-hung", d)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "entries[0]: expected a mapping" in result.stderr  # the cycle meets the entry's type check


@pytest.mark.timeout(30)
@pytest.mark.parametrize("log, said", [
    ("/dev/zero", "a device"),
    ("fifo", "a named pipe"),
    ("huge", "1 to"),
])
def test_bad_nccl_logs_are_one_line_unread(tmp_path, cli, log, said):
    write_dumps(tmp_path / "d", {0: [entry(1)]}, ranks="[0]")
    if log == "fifo":
        log = tmp_path / "fifo"
        os.mkfifo(log)
    elif log == "huge":
        log = tmp_path / "huge.log"
        log.write_text("n:1:2 [0] NCCL INFO comm 0xabc rank 0 nranks 999999999999 cudaDev 0 - Init COMPLETE\n")
    started = time.process_time()  # CPU time: an unbounded read spends it, a loaded machine does not
    result = cli("why-hung", tmp_path / "d", "--nccl-log", log)
    assert result.exit_code == 2 and said in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert time.process_time() - started < 15  # (a blocked read is pytest-timeout's)


def test_text_from_the_files_is_printed_escaped(tmp_path, cli):
    """A terminal escape sequence (screen clear, window title) or rich markup in a dump or log prints as text."""
    evil = "nccl:all_reduce\x1b[2J\x1b]0;owned\x07[/bold]"
    write_dumps(tmp_path, {0: [entry(1, op=evil)], 1: [entry(1, op=evil)]}, ranks="[0, 1]")
    (tmp_path / "job.log").write_text("h:1:2 [0] NCCL WARN bad \x1b[31mred\x1b[0m\n")
    result = cli("why-hung", tmp_path)
    assert result.exit_code == 0, result.stderr
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    assert "\\x1b[2J" in result.stdout and "[/bold]" in result.stdout and "\\x1b[31mred" in result.stdout


def test_no_unpickling_comes_back():
    """Guard: dumps are parsed by opcode (report/fr_dump.py); nothing under src/ unpickles a file again."""
    src = Path(__file__).resolve().parents[2] / "src" / "meshscale"
    found = [str(p) for p in src.rglob("*.py") if any(
        word in p.read_text() for word in ("pickle.load", "pickle.Unpickler", "Unpickler("))]
    assert found == []
