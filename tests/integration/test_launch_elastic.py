"""`meshscale launch`: torchrun's own agent in meshscale's process. A rank that is killed, stopped or raises ends
the run with one line per failed rank (rank, host, cause), neither a traceback nor torchrun's error block, exit
code 2 and no stray file; a normal run exits 0; the stores of --standalone listen on 127.0.0.1 only.

Faults are injected in the ranks by tests/fixtures/launch_faults/sitecustomize.py on PYTHONPATH: rank 1's second
backward pass raises, or sends itself SIGKILL or SIGSTOP."""
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

# every test starts torchrun and its ranks as fresh interpreters: 5-15 s each on 2 cores
pytestmark = pytest.mark.slow

SRC = Path(__file__).resolve().parents[2] / "src"
RUN_TIMEOUT_S = 120
HOOKS = Path(__file__).resolve().parents[1] / "fixtures" / "launch_faults"  # sitecustomize.py: the faults
# --cpus: Gloo ranks on a GPU machine too
TRAIN = ("train", "--model", "small-cnn", "--steps", "6", "--batch", "4", "--timing-warmup", "1", "--timeout-s", "3",
         "--cpus", "2")


def _listening(pid: int | str = "self") -> set[tuple[str, int]]:
    """(address, port) of every TCP socket process ``pid`` listens on, from /proc (IPv4 and IPv6)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            cells = line.split()
            if cells[3] == "0A" and cells[9] in inodes:  # 0A: LISTEN
                address, port = cells[1].split(":")
                raw = bytes.fromhex(address)
                # /proc prints each 32-bit word in host (little-endian) order
                packed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
                found.add((socket.inet_ntop(family, packed), int(port, 16)))
    return found


def _loopback_only(sockets: set[tuple[str, int]]) -> bool:
    return all(address in ("127.0.0.1", "::1", "::ffff:127.0.0.1") for address, _ in sockets)


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def _launch(tmp_path: Path, fault: str | None = None, watch_sockets: bool = False, terminate: str | None = None,
            options=(), fault_attempts: str | None = None):
    """`meshscale launch --standalone --nproc-per-node 2 -- train ...` in its own session (killed on
    timeout), from an empty folder and with its own TMPDIR: (process result, the addresses its agent listened on).
    ``terminate``: that signal (SIGTERM, SIGKILL) to the launcher once both ranks run; the ranks must be gone
    within seconds after it."""
    work, tmp = tmp_path / "work", tmp_path / "tmp"
    for folder in (work, tmp):
        folder.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HOOKS), str(SRC), os.environ.get("PYTHONPATH", "")]),
               TMPDIR=str(tmp), OMP_NUM_THREADS="1")
    env.pop("LOGLEVEL", None)
    if fault:
        env["MESHSCALE_TEST_FAULT"] = fault
    if fault_attempts is not None:
        env["MESHSCALE_TEST_FAULT_ATTEMPTS"] = fault_attempts
    cmd = [sys.executable, "-m", "meshscale", "launch", "--standalone", "--nproc-per-node", "2", *options, "--", *TRAIN]
    proc = subprocess.Popen(cmd, cwd=work, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    seen: set[tuple[str, int]] = set()
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while terminate and len(ranks) < 2 and proc.poll() is None and time.monotonic() < deadline:
            ranks = _children(proc.pid)
            time.sleep(0.2)
        if terminate:
            time.sleep(2)  # the ranks under way
            proc.send_signal(getattr(signal, terminate))
        while watch_sockets and proc.poll() is None and time.monotonic() < deadline:
            for pid in [proc.pid, *_children(proc.pid)]:  # the agent and its ranks
                try:
                    seen |= _listening(pid)
                except OSError:  # the process ended between the two reads
                    pass
            time.sleep(0.2)
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:  # no orphans: the agent and its ranks share the session
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    end = time.monotonic() + 10
    while [pid for pid in ranks if _alive(pid)] and time.monotonic() < end:
        time.sleep(0.2)
    assert not [pid for pid in ranks if _alive(pid)], "ranks outlived the launcher"
    # torch's compile cache (torchinductor_USER) is kept across runs by design; anything else is a stray file,
    # but for the error files' folder of a launcher killed outright, which the next run removes
    left = [p for p in [*work.iterdir(), *tmp.iterdir()] if not p.name.startswith("torchinductor_")]
    assert not left or terminate == "SIGKILL" and [p.name.split("-")[:3] for p in left] == [
        ["meshscale", "launch", str(proc.pid)]], left
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err), seen


def _failure_lines(result) -> list[str]:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "ChildFailedError" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert all(line.startswith("meshscale: error: rank ") for line in lines), lines
    assert len(lines) == 2, lines  # one per failed rank of this node, nothing else
    host = os.uname().nodename
    assert all(f" on {host}: " in line for line in lines), lines
    return lines


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_a_normal_run_exits_0_and_nothing_of_it_listens_beyond_loopback(tmp_path):
    """The agent's two stores and the ranks' Gloo sockets: 127.0.0.1 only."""
    result, listening = _launch(tmp_path, watch_sockets=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "samples/s" in result.stdout or "throughput" in result.stdout.lower(), result.stdout[-2000:]
    assert result.stderr.strip() == "", result.stderr[-3000:]
    assert listening and _loopback_only(listening), listening


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_a_killed_rank_is_named_with_its_signal(tmp_path):
    first, second = _failure_lines(_launch(tmp_path, fault="SIGKILL")[0])
    assert first.startswith("meshscale: error: rank 1 (local 1) on ") and "killed by SIGKILL" in first, first
    assert second.startswith("meshscale: error: rank 0 (local 0) on "), second
    # the agent stops the survivor, or the survivor saw its peer go first and said so
    assert "after rank 1 failed" in second or "rank 1 on" in second, second


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_a_rank_that_raises_is_named_with_its_own_error(tmp_path):
    first, second = _failure_lines(_launch(tmp_path, fault="raise")[0])
    assert first.startswith("meshscale: error: rank 1 (local 1) on ") and "exit code 2" in first, first
    assert "injected fault in backward" in first, first
    assert "rank 0 (local 0)" in second, second


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_a_stopped_rank_is_named_by_the_peer_that_timed_out(tmp_path):
    start = time.monotonic()
    first, second = _failure_lines(_launch(tmp_path, fault="SIGSTOP")[0])
    assert first.startswith("meshscale: error: rank 0 (local 0) on ") and "exit code 2" in first, first
    assert "rank 1 on" in first and "died, stopped or hung" in first, first  # the peer names the silent rank
    # the launcher continues the stopped rank so that it takes the agent's SIGTERM (torch alone waits 30 s)
    assert "rank 1 (local 1)" in second and "ended by SIGTERM after rank 0 failed" in second, second
    assert time.monotonic() - start < 60


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_a_restart_after_a_failure_finishes_the_run_and_the_failure_is_still_told(tmp_path):
    """torchrun's own restart (--max-restarts): rank 1 fails in the first attempt only; the second finishes. The
    agent keeps its store across attempts, so the ranks' keys must not leak from one attempt into the next."""
    result, _ = _launch(tmp_path, fault="raise", fault_attempts="0", options=("--max-restarts", "1"))
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    # before the last attempt the agent restarts and reports nothing: the rank says it itself
    assert len(lines) == 1 and lines[0].startswith("meshscale: error: rank 1 on ") and "injected fault" in lines[0], \
        lines


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_sigterm_to_the_launcher_stops_every_rank_with_one_line(tmp_path):
    result, _ = _launch(tmp_path, terminate="SIGTERM")
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.splitlines() == ["meshscale: error: launch: stopped by SIGTERM; every rank was stopped"], \
        result.stderr[-3000:]


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_the_ranks_of_a_killed_launcher_die_with_it(tmp_path):
    """SIGKILL to the agent: nothing can print, but no rank is left running without it (checked in _launch)."""
    result, _ = _launch(tmp_path, terminate="SIGKILL")
    assert result.returncode == -signal.SIGKILL
    # what the killed launcher left in its TMPDIR, the next launch removes (even one refused at once)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
               TMPDIR=str(tmp_path / "tmp"))
    again = subprocess.run([sys.executable, "-m", "meshscale", "launch", "--standalone", "--", "nosuch"], env=env,
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "not a meshscale command" in again.stderr, again.stderr
    assert [p.name for p in (tmp_path / "tmp").iterdir() if not p.name.startswith("torchinductor_")] == []


@pytest.mark.timeout(RUN_TIMEOUT_S + 30)
def test_two_nodes_each_name_their_own_failed_rank_in_one_line(tmp_path):
    """Two launchers on this machine act as hosts (MESHSCALE_HOSTNAME): rank 1 is killed; its node names it, the
    other node names its rank 0, which names rank 1 and its host."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HOOKS), str(SRC), os.environ.get("PYTHONPATH", "")]),
               TMPDIR=str(tmp_path), OMP_NUM_THREADS="1", MESHSCALE_TEST_FAULT="SIGKILL")
    procs = [subprocess.Popen([sys.executable, "-m", "meshscale", "launch", "--nnodes", "2", "--nproc-per-node", "1",
                               "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two",
                               "--", *TRAIN], env=dict(env, MESHSCALE_HOSTNAME=f"host{n}"), cwd=tmp_path, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True) for n in (0, 1)]
    errors = []
    try:
        for p in procs:
            errors.append(p.communicate(timeout=RUN_TIMEOUT_S)[1])
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert [p.returncode for p in procs] == [2, 2], errors
    lines = [e.strip().splitlines() for e in errors]
    assert all(len(node) == 1 for node in lines), lines  # one line per node: each node has one failed rank
    killed = next((node[0] for node in lines if "rank 1 (local 0)" in node[0]), lines)
    survivor = next(node[0] for node in lines if node[0] != killed)
    killed_host = killed.split(" on ", 1)[1].split(":")[0]
    assert "killed by SIGKILL" in killed and killed_host in ("host0", "host1"), killed
    # the survivor's rank names the killed one, or, when the killed node's launcher served the rendezvous and
    # ended first, the survivor's launcher says the rendezvous was lost
    assert (f"rank 0 (local 0) on " in survivor and f"rank 1 on {killed_host} died, stopped or hung" in survivor
            or "launch: rendezvous c10d" in survivor and ("was lost" in survivor or "was closed" in survivor)), survivor
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith("torchinductor_")] == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["nobody joins", "no such host"])
def test_a_rendezvous_that_fails_is_one_line(tmp_path, case):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint, expected = {"nobody joins": (f"127.0.0.1:{port}", "fewer than 2 nodes joined within 2 s"),
                          "no such host": ("no.such.host.invalid:29500", "cannot resolve 'no.such.host.invalid'")}[case]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
               TMPDIR=str(tmp_path))
    env.pop("TORCH_CPP_LOG_LEVEL", None)
    result = subprocess.run([sys.executable, "-m", "meshscale", "launch", "--nnodes", "2", "--rdzv-backend", "c10d",
                             "--rdzv-endpoint", endpoint, "--rdzv-id", "lonely", "--rdzv-conf",
                             "join_timeout=2,read_timeout=2", "--", *TRAIN], env=env, cwd=tmp_path, text=True,
                            capture_output=True, timeout=50)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    # a host that does not resolve is refused before the agent starts; one that does, by the rendezvous itself
    where = "launch: --rdzv-endpoint" if case == "no such host" else "launch: rendezvous c10d"
    assert len(lines) == 1 and where in lines[0] and expected in lines[0], lines
    assert not list(tmp_path.iterdir())


@pytest.mark.timeout(60)
def test_the_loopback_rendezvous_listens_on_loopback_where_torchs_c10d_listens_everywhere():
    """Both stores of the loopback rendezvous (its own and the one served to the ranks) on 127.0.0.1; torch's
    c10d store, made from the same parameters, on every interface (so the check can fail)."""
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

    from meshscale.execute.elastic import LOOPBACK_BACKEND, _register_loopback_backend

    _register_loopback_backend()
    before = _listening()
    ours = get_rendezvous_handler(RendezvousParameters(LOOPBACK_BACKEND, "127.0.0.1:0", "ours", 1, 1,
                                                       local_addr="127.0.0.1"))
    try:
        info = ours.next_rendezvous()
        assert info.bootstrap_store_info.master_addr == "127.0.0.1"
        opened = _listening() - before
        assert len(opened) >= 1 and _loopback_only(opened), opened
    finally:
        ours.shutdown()
    before = _listening()
    torchs = get_rendezvous_handler(RendezvousParameters("c10d", "127.0.0.1:0", "torchs", 1, 1, is_host=True))
    try:
        assert not _loopback_only(_listening() - before)
    finally:
        torchs.shutdown()
