"""What a file or another process can make meshscale do: a checkpoint runs no code, the rendezvous listens on
loopback only, a name in a file never picks a path outside the output directory; and the faults that must be
blamed on their cause: a stopped rank, SIGTERM and SIGKILL to the main process."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from meshscale.errors import MeshscaleError
from meshscale.execute import WorkerError, launch
from meshscale.execute.launcher import serving_store
from meshscale.topology import dumps, load_system
from meshscale.topology.draw import MAX_STEM_CHARS, file_stem
from meshscale.train import checkpoint

pytestmark = pytest.mark.timeout(120)


# ---- checkpoints --------------------------------------------------------------------------------------------
class _Payload:
    """Unpickling this creates ``marker``: what a crafted checkpoint would do with a shell command."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _crafted_checkpoint(directory: Path, marker: Path, world: int = 2) -> Path:
    """A checkpoint directory whose every rank file would run ``touch marker`` when unpickled."""
    folder = directory / "step-00000004"
    folder.mkdir(parents=True)
    for rank in range(world):
        torch.save({"model": _Payload(marker), "exchange": {}, "scaler": None, "rng": {}}, folder / f"rank{rank}.pt")
        (folder / f"rank{rank}.json").write_text(json.dumps({"step": 4, "world": world, "rng": {}}))
    (directory / "latest").write_text("4\n")
    return folder / "rank0.pt"


def test_a_crafted_checkpoint_runs_no_code(tmp_path):
    marker = tmp_path / "pwned"
    path = _crafted_checkpoint(tmp_path / "ckpt", marker)
    with pytest.raises(MeshscaleError, match="nothing in it was run") as err:
        checkpoint.load(tmp_path / "ckpt", 0, 2)
    assert "\n" not in str(err.value)
    assert not marker.exists()
    torch.load(path, weights_only=False)  # the payload is live: the unsafe loader runs it
    assert marker.exists()


def test_resume_from_a_crafted_checkpoint_is_one_line_exit_2(tmp_path, cli):
    marker = tmp_path / "pwned"
    _crafted_checkpoint(tmp_path / "ckpt", marker)
    done = cli("train", "--model", "gpt-tiny", "--cpus", "2", "--batch", "2", "--steps", "6",
               "--checkpoint-dir", tmp_path / "ckpt", "--resume", "--timeout-s", "30")
    assert done.exit_code == 2, done.output
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("meshscale: error:"), done.stderr
    assert "nothing in it was run" in lines[0]
    assert not marker.exists()


# ---- the rendezvous listens on loopback only ------------------------------------------------------------------
_LOOPBACK = {"/proc/net/tcp": "0100007F", "/proc/net/tcp6": "00000000000000000000000001000000"}


def listening(pids) -> list[tuple[str, str, int]]:
    """(table, address in /proc hex, port) of every listening TCP socket the processes ``pids`` hold."""
    inodes = set()
    for pid in pids:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[len("socket:["):-1])
    found = []
    for table in _LOOPBACK:
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                address, port = fields[1].split(":")
                found.append((table, address, int(port, 16)))
    return found


def _loopback_only(found) -> bool:
    # IPv4 loopback is 127.0.0.0/8: the first octet is the last byte of the little-endian hex
    return all(address.endswith("7F") if table.endswith("tcp") else address == _LOOPBACK[table]
               for table, address, _ in found)


def _listeners_of_the_run(ctx, parent_pid):
    dist.barrier()  # every rank's Gloo pairs are up
    found = listening([parent_pid, os.getpid()])
    dist.barrier()
    return ctx.store.port, found


def test_a_cpu_run_listens_on_loopback_only():
    out = launch(_listeners_of_the_run, 2, (os.getpid(),), timeout_s=30)
    for store_port, found in out:
        assert store_port in {port for _, _, port in found}  # the parent's store is among what was seen
        assert found and _loopback_only(found), found


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_a_served_store_listens_where_it_is_told(host):
    try:
        store = serving_store(host, 0, 1, 5.0)
    except MeshscaleError:
        if host == "::1" and not socket.has_ipv6:
            pytest.skip("no IPv6 here")
        raise
    found = [f for f in listening([os.getpid()]) if f[2] == store.port]
    assert found and _loopback_only(found), found
    client = dist.TCPStore(host, store.port, 1, is_master=False)
    client.set("k", "v")
    assert store.get("k") == b"v"


# ---- names from files never choose a path ---------------------------------------------------------------------
def test_a_traversal_name_writes_nothing_outside_the_output_directory(tmp_path, cli, monkeypatch):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    system = json.loads(dumps(load_system("pcie-4gpu")))
    system["name"] = "../../escaped/.x"
    (work / "evil.json").write_text(json.dumps(system))
    monkeypatch.chdir(work)
    before = set(tmp_path.rglob("*"))
    result = cli("topo", "--system", "evil.json", "--format", "svg")
    written = set(tmp_path.rglob("*")) - before
    assert all(work in p.parents for p in written), written
    assert not (tmp_path / "escaped").exists()
    if result.exit_code == 0:  # drawn under a safe name (else refused as bad input: one line, exit 2)
        assert [p.name for p in written] == ["escaped_.x.svg"]
    else:
        assert result.exit_code == 2 and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("name", ["../../somewhere/x", "..", ".hidden", "/etc/passwd", "a\\..\\b", "~root/.ssh",
                                  "x" * 500, "", "dgx-h100"])
def test_a_file_stem_is_one_plain_name(name):
    stem = file_stem(name)
    assert stem and len(stem) <= MAX_STEM_CHARS and not stem.startswith(".")
    assert "/" not in stem and "\\" not in stem and ".." not in stem
    assert Path(stem).name == stem and Path(stem).resolve().parent == Path.cwd().resolve()
    if name == "dgx-h100":
        assert stem == name  # ordinary names stay as they are


# ---- fault causes -------------------------------------------------------------------------------------------------
def _one_rank_stops(ctx):
    ctx.phase("all_reduce of 4 elements")
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    t = torch.ones(4)
    dist.all_reduce(t)
    return True


def test_a_stopped_rank_is_blamed_not_the_one_that_waited():
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"^rank 1 was stopped .* during all_reduce of 4 elements"):
        launch(_one_rank_stops, 2, timeout_s=2)
    assert time.monotonic() - start < 12


def _ranks(pid: int) -> list[int]:
    """The rank processes of a meshscale run: the grandchildren of its main process (under the fork server)."""
    parents = {}  # pid -> parent pid, from /proc/*/stat (the `children` file needs a kernel option)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue

    def children(p):
        return [c for c, parent in parents.items() if parent == p]
    return [g for c in children(pid) for g in children(c)]


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _start_bench(world: int = 2):
    """A long CPU `bench collective` as a real process, once its ranks run; returns (process, rank pids)."""
    script = "import sys; from meshscale.cli import main; sys.argv[0] = 'meshscale'; main()"
    proc = subprocess.Popen([sys.executable, "-c", script, "bench", "collective", "all_reduce", "--cpus", str(world),
                             "-b", "1K", "-e", "1K", "-n", "1000000", "-w", "0", "--timeout-s", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    end = time.monotonic() + 60
    while len(_ranks(proc.pid)) < world and time.monotonic() < end and proc.poll() is None:
        time.sleep(0.1)
    ranks = _ranks(proc.pid)
    assert len(ranks) == world, proc.poll()
    time.sleep(1.0)  # into the timed loop
    return proc, ranks


@pytest.fixture
def bench_run():
    started = []

    def start():
        started.append(_start_bench())
        return started[-1]

    yield start
    for proc, ranks in started:  # leave nothing behind, whatever the test found
        for pid in [proc.pid, *ranks]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.communicate(timeout=10)


def _gone_within(pids, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while any(_alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.05)
    return not any(_alive(p) for p in pids)


@pytest.mark.slow  # the command as a process of its own
def test_sigterm_to_the_main_process_is_one_line_like_ctrl_c(bench_run):
    proc, ranks = bench_run()
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=20)
    assert proc.returncode not in (0, None)
    assert stderr.strip().splitlines() == ["meshscale: error: interrupted (SIGTERM); all ranks stopped"], stderr
    assert _gone_within(ranks, 3)


@pytest.mark.slow  # the command as a process of its own
def test_ranks_die_with_a_killed_main_process(bench_run):
    proc, ranks = bench_run()
    proc.kill()
    assert _gone_within(ranks, 3)
