"""Start N ranks of a function over torch.distributed, on GPUs (NCCL) or CPU processes (Gloo), and never hang.

The parent owns a TCPStore on a free loopback port (no port races, nothing reachable from other machines) and the
child processes. Every process group has a timeout. A rank that raises, dies, stops or outlives the deadline makes
the parent stop all the others and raise `WorkerError` naming that rank and the operation it was in (each rank
records its current phase in the store). SIGTERM to the parent stops the run like Ctrl-C; ranks die with the
parent. Under `torchrun` (RANK/WORLD_SIZE set) the function runs in the current process instead, on the store of
the launcher's rendezvous endpoint.
"""
from __future__ import annotations

import ctypes
import gc
import multiprocessing as mp
import os
import queue
import select
import signal
import socket
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist

from meshscale.errors import Interrupted, MeshscaleError, WorkerError  # noqa: F401 (raised here, imported from here)
from meshscale.execute.world import Launcher, in_torchrun, launcher, oversubscription  # noqa: F401 (in_torchrun: imported from here)
from meshscale.safe_io import process_alive
from meshscale.topology.multinode import hostname

NCCL_SAFETY_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


# What a rank sees when a peer is gone or never answers: a consequence, not a cause.
_PEER_ERRORS = ("Connection closed by peer", "Connection reset by peer", "Read error", "Broken pipe")
_WAIT_ERRORS = ("timed out", "timeout")
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


@dataclass
class RankContext:
    """What a worker function receives: its rank, the world, its device and a way to say what it is doing."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device
    store: Any

    def phase(self, text: str) -> None:
        """Record what this rank is doing now, so a failure report can name the operation."""
        self.store.set(f"meshscale/phase/{self.rank}", text)

    def barrier(self) -> None:
        if self.backend == "nccl":
            dist.barrier(device_ids=[self.device.index])
        else:
            dist.barrier()


def resolve_host(host: str, port: int, timeout_s: float = 10.0, what: str = "") -> None:
    """A one-line error when MASTER_ADDR (or ``what``) does not resolve (within ``timeout_s``: a name server may
    not answer)."""
    what = what or f"MASTER_ADDR={host}"
    outcome: list[BaseException | None] = []

    def lookup() -> None:
        try:
            socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            outcome.append(None)
        except (OSError, UnicodeError) as exc:
            outcome.append(exc)

    thread = threading.Thread(target=lookup, daemon=True, name="meshscale-resolve")
    thread.start()
    thread.join(timeout_s)
    if not outcome:
        raise MeshscaleError(f"{what}: no answer from the name service within {timeout_s:.0f} s")
    if outcome[0] is not None:
        why = getattr(outcome[0], "strerror", None) or str(outcome[0])
        raise MeshscaleError(f"{what}: cannot resolve {host!r} ({why}); give the rendezvous host's name or address")


def _die_with(owner_pid: int) -> None:
    """Exit this rank as soon as the process that launched it is gone (killed, crashed), even before its
    parent reaps it.

    A daemon thread waits on a pidfd of the launcher (readable once it has exited), or polls it where there is
    none. A rank that the launcher started itself also has the kernel kill it with its parent (PR_SET_PDEATHSIG);
    a rank of the fork server does not: the fork server outlives the launcher as long as ranks hold its pipe."""
    if sys.platform.startswith("linux") and os.getppid() == owner_pid:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass
    try:
        pidfd: int | None = os.pidfd_open(owner_pid)
    except (AttributeError, OSError):
        pidfd = None

    def watch() -> None:
        if pidfd is not None:
            select.select([pidfd], [], [])
        else:
            while not _exited(owner_pid):
                time.sleep(0.2)
        os._exit(1)

    if pidfd is None and _exited(owner_pid):
        os._exit(1)
    threading.Thread(target=watch, daemon=True, name="meshscale-watchdog").start()


def proc_state(pid: int) -> str | None:
    """The state letter of a process in /proc (R, S, T, Z...), or None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _exited(pid: int) -> bool:
    """True when the process is gone or a zombie (exited, not yet reaped)."""
    return not process_alive(pid) or proc_state(pid) == "Z"


def loopback_interface() -> str:
    """The loopback interface's name ("lo" on Linux, "lo0" on macOS)."""
    try:
        return next((name for _, name in socket.if_nameindex() if name.startswith("lo")), "lo")
    except OSError:
        return "lo"


def serving_store(host: str, port: int, world: int, timeout_s: float) -> dist.TCPStore:
    """A TCPStore server listening on ``host`` only (port 0: a free one).

    torch's TCPStore binds every interface whatever host it is given, so the listening socket is made and bound
    here and handed over (the store then owns it). Older torch without that for its libuv server falls back to
    the classic server."""
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    errors: list[str] = []
    for use_libuv in (True, False):
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(1024)
        except OSError as exc:
            sock.close()
            raise MeshscaleError(f"cannot listen on {host}:{port} for the rendezvous ({exc.strerror})") from None
        bound_port = sock.getsockname()[1]
        fd = sock.detach()
        try:
            return dist.TCPStore(host, bound_port, world, is_master=True, wait_for_workers=False,
                                 timeout=timedelta(seconds=timeout_s), master_listen_fd=fd, use_libuv=use_libuv)
        except (RuntimeError, ValueError, TypeError) as exc:
            errors.append(str(exc).splitlines()[0])
            _close_if_listening_on(fd, bound_port)
    raise MeshscaleError(f"cannot start the rendezvous store on {host}: {'; '.join(errors)}")


def _close_if_listening_on(fd: int, port: int) -> None:
    """Close ``fd`` unless a failed store has closed it already (the number may belong to another file now)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return
    try:
        ours = sock.getsockname()[1] == port
    except (OSError, IndexError, TypeError):
        ours = False
    if ours:
        sock.close()
    else:
        sock.detach()


def _local_store(world: int, timeout_s: float) -> dist.TCPStore:
    """The parent's store for ranks on this machine: IPv4 loopback, else IPv6 loopback."""
    try:
        return serving_store("127.0.0.1", 0, world, timeout_s)
    except MeshscaleError:
        return serving_store("::1", 0, world, timeout_s)


def _init(rank: int, world: int, local_rank: int, backend: str, store: Any, timeout_s: float) -> RankContext:
    torch.set_num_threads(1)  # one thread per rank: N ranks of N threads oversubscribe the cores many times over
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", store=store, rank=rank, world_size=world,
                                timeout=timedelta(seconds=timeout_s), device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
    return RankContext(rank, world, local_rank, backend, device, store)


def _teardown() -> None:
    # Free DDP reducers and other holders of the group first: destroying a group a live reducer holds can deadlock.
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()


def _child(fn: Callable, rank: int, world: int, backend: str, host: str, port: int, timeout_s: float, args: tuple,
           results: Any, owner_pid: int, env: dict[str, str] | None = None) -> None:
    _die_with(owner_pid)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the parent's stop request ends a rank quietly
    os.environ.update(NCCL_SAFETY_ENV)
    os.environ.update(env or {})
    os.environ["GLOO_SOCKET_IFNAME"] = loopback_interface()  # every rank is on this machine: Gloo listens on loopback
    code = 0
    try:
        store = dist.TCPStore(host, port, world, is_master=False, timeout=timedelta(seconds=timeout_s))
        ctx = _init(rank, world, rank, backend, store, timeout_s)
        out = fn(ctx, *args)
        results.put(("ok", rank, out))
        del ctx
        _teardown()
    except BaseException as exc:  # report everything, including KeyboardInterrupt, then exit non-zero
        last = str(exc) if isinstance(exc, MeshscaleError) else traceback.format_exception_only(type(exc), exc)[-1].strip()
        results.put(("error", rank, last[:2000]))
        code = 1
    finally:
        # Leave without running atexit/finalizers that could block on a half-dead group.
        try:
            results.close()
            results.join_thread()
        finally:
            os._exit(code)


def forkserver_context() -> Any:
    """The multiprocessing context CPU ranks start from: a fork server, one per process (the first start of it
    sets what it preloads; later launches reuse it).

    Fork from a clean single-threaded server that already imported torch: fast (about 0.1 s a rank) and free of
    the locks a threaded parent (TCPStore server, OpenMP) would pass to a plain fork. torch._dynamo too (it starts
    no thread): every optimizer imports it when made (torch 2.13), 1.5 s of CPU per rank that the ranks of a
    training run on a 2-core host paid side by side at every launch (a 2-rank small-CNN run of 8 steps: 11.9 s of
    its rank's 14.7 under load, 2.6 s once preloaded); a run without an optimizer pays it once, when the server
    starts. Anything else that starts processes of ranks (a test) takes the same server from here."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", __name__])
    return ctx


def launch(fn: Callable[..., Any], world_size: int, args: tuple = (), backend: str = "gloo",
           timeout_s: float = 60.0, deadline_s: float | None = None, start_method: str | None = None,
           env: dict[str, str] | None = None) -> list[Any]:
    """Run ``fn(ctx, *args)`` on ``world_size`` ranks and return the per-rank results in rank order.

    ``timeout_s`` bounds every collective (the process-group timeout); ``deadline_s`` bounds the whole run
    (default: no bound beyond the per-operation one); ``env``: variables each rank sets before its process group
    starts. Under torchrun, runs this rank only and returns ``[result]``. Raises `WorkerError` if any rank fails."""
    if in_torchrun():
        return [_run_under_torchrun(fn, args, backend, timeout_s, env)]
    if world_size < 1:
        raise MeshscaleError(f"need at least one rank, got {world_size}")
    if backend == "nccl":
        if not torch.cuda.is_available() or torch.cuda.device_count() < world_size:
            have = torch.cuda.device_count() if torch.cuda.is_available() else 0
            raise MeshscaleError(f"asked for {world_size} GPUs but this machine has {have}")
        start_method = start_method or "spawn"  # CUDA cannot be used in a forked child
        os.environ.update(NCCL_SAFETY_ENV)
    _warn_once(oversubscription(world_size, backend))
    ctx = forkserver_context() if start_method in (None, "forkserver") else mp.get_context(start_method)
    store = _local_store(world_size + 1, timeout_s)
    host = store.host
    results = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(fn, r, world_size, backend, host, store.port, timeout_s, args, results,
                                              os.getpid(), env),
                         daemon=True, name=f"meshscale-rank{r}") for r in range(world_size)]
    outputs: dict[int, Any] = {}
    errors: dict[int, str] = {}
    start = time.monotonic()
    failure: str | None = None
    interrupted = False
    try:
        with _sigterm_as_interrupt():
            for p in procs:
                p.start()
            while len(outputs) < world_size and not errors and failure is None:
                _collect(results, outputs, errors, 0.1)
                if any(p.exitcode is not None for r, p in enumerate(procs) if r not in outputs):
                    _collect(results, outputs, errors, 0.5)  # a result may have raced with the exit
                    _mark_dead(procs, outputs, errors)
                if deadline_s is not None and time.monotonic() - start > deadline_s and not errors:
                    late = [r for r in range(world_size) if r not in outputs]
                    late.sort(key=lambda r: not _is_stopped(procs[r]))  # a stopped rank holds up the others
                    how = f" {_STOPPED}," if _is_stopped(procs[late[0]]) else ""
                    failure = (f"ranks {late} did not finish within {deadline_s:.0f} s "
                               f"(rank {late[0]}{how} was in {_phase(store, late[0])})")
            if errors:
                _collect(results, outputs, errors, 0.5)  # let the other ranks report, to find the first cause
                _mark_dead(procs, outputs, errors)  # a peer's error may have arrived before a silent death was seen
                r, what = _cause(procs, outputs, errors)
                failure = f"rank {r} {what} during {_phase(store, r)}"
                others = sorted(set(errors) - {r})
                if others:
                    failure += f" (ranks {others} failed in turn)"
    except KeyboardInterrupt:
        failure, interrupted = "interrupted (Ctrl-C); all ranks stopped", True
    except _Terminated:
        failure, interrupted = "interrupted (SIGTERM); all ranks stopped", True
    finally:
        _stop(procs)
    if failure:
        raise (Interrupted if interrupted else WorkerError)(failure)
    return [outputs[r] for r in range(world_size)]


_STOPPED = "was stopped (SIGSTOP or a debugger)"
_WARNED: set[str] = set()  # a sweep or a repeated benchmark launches many times: each warning once per process


def _warn_once(line: str) -> None:
    """Every command's ranks start here, after the command checked its input: a warning printed here never
    stands before a bad-input error (one line, exit 2)."""
    if line and line not in _WARNED:
        _WARNED.add(line)
        print(line, file=sys.stderr, flush=True)


def _cause(procs: list, outputs: dict, errors: dict) -> tuple[int, str]:
    """The rank that caused a failure and what happened to it.

    In order: a rank stopped by a signal (its peers time out waiting for it); a rank that died without a word;
    the first to raise something other than what its peers then see (connection errors, timeouts); a rank
    still running without a word while the others timed out waiting for it; else the first error."""
    stopped = [r for r, p in enumerate(procs) if r not in outputs and _is_stopped(p)]
    if stopped:
        return stopped[0], _STOPPED
    silent = [r for r, e in errors.items() if e.startswith("died")]
    if silent:
        return silent[0], errors[silent[0]]
    own = [r for r, e in errors.items() if not _is_consequence(e)]
    if own:
        return own[0], f"failed with {errors[own[0]]}"
    stuck = [r for r, p in enumerate(procs) if r not in outputs and r not in errors and p.is_alive()]
    if stuck:
        return stuck[0], "stopped making progress (its peers timed out waiting for it)"
    first = next(iter(errors))
    return first, f"failed with {errors[first]}"


def _is_consequence(error: str) -> bool:
    """True for the errors a rank sees when a peer is gone or never answers."""
    return any(m in error for m in _PEER_ERRORS) or any(m in error.lower() for m in _WAIT_ERRORS)


def _is_stopped(proc: Any) -> bool:
    """True when the process is stopped by a signal (SIGSTOP, SIGTSTP) or a tracer: state T or t in /proc."""
    return proc.pid is not None and proc_state(proc.pid) in ("T", "t")


class _Terminated(BaseException):
    """SIGTERM reached the parent while ranks ran."""


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """Within this block SIGTERM stops the run like Ctrl-C (only the main thread can take signals)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one stop is enough; a second must not cut it short
        raise _Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _mark_dead(procs: list, outputs: dict, errors: dict) -> None:
    """Record the ranks that exited without a word."""
    for r, p in enumerate(procs):
        if r not in outputs and r not in errors and p.exitcode is not None:
            code = p.exitcode
            errors[r] = f"died ({signal_name(-code) if code < 0 else f'exit code {code}'})"


def _collect(results: Any, outputs: dict, errors: dict, wait_s: float) -> None:
    """Move every message that arrives within ``wait_s`` into outputs or errors."""
    end = time.monotonic() + wait_s
    while True:
        try:
            status, rank, payload = results.get(timeout=max(0.0, end - time.monotonic()))
        except queue.Empty:
            return
        (outputs if status == "ok" else errors)[rank] = payload


def _phase(store: Any, rank: int) -> str:
    try:
        store.set_timeout(timedelta(seconds=1))
        key = f"meshscale/phase/{rank}"
        return store.get(key).decode() if store.check([key]) else "start-up"
    except Exception:
        return "an unknown step"


def _stop(procs: list) -> None:
    """Terminate what is still running, then kill what ignores it, then reap."""
    procs = [p for p in procs if p.pid is not None]  # a failed start leaves the later ones unstarted
    for p in procs:
        if p.is_alive():
            p.terminate()
            if _is_stopped(p):
                os.kill(p.pid, signal.SIGCONT)  # a stopped process takes SIGTERM only once it runs again
    end = time.monotonic() + 3
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(1)


def _run_under_torchrun(fn: Callable, args: tuple, backend: str, timeout_s: float,
                        env: dict[str, str] | None = None) -> Any:
    os.environ.update(NCCL_SAFETY_ENV)
    os.environ.update(env or {})
    env = launcher()
    assert env is not None  # launch() came here because in_torchrun()
    if os.environ.get("TORCHELASTIC_RUN_ID"):  # started by torchrun's agent: a rank it no longer watches is an orphan
        _die_with(os.getppid())
    resolve_host(env.master_addr, env.master_port)
    store = _launcher_store(env, timeout_s)
    try:
        ctx = _init(env.rank, env.world_size, env.local_rank, backend, store, timeout_s)
    except (RuntimeError, ValueError) as exc:  # torch's Dist*Error are RuntimeErrors
        raise WorkerError(f"rank {env.rank} on {hostname()}: joining the process group failed "
                          f"({first_line(exc)})") from None
    host = hostname()
    _store_quietly(lambda: store.set(f"meshscale/host/{env.rank}", host))
    try:
        return fn(ctx, *args)
    except MeshscaleError:
        raise
    except (RuntimeError, ValueError, OSError) as exc:  # what a rank sees when a peer dies, stops or times out
        raise WorkerError(_torchrun_failure(store, env, host, exc, timeout_s)) from None
    finally:
        del ctx
        _teardown()


def _store_quietly(op: Callable[[], Any]) -> Any:
    """A store operation that may fail (the store's host is gone): its value, or None."""
    try:
        with _native_logs_silenced():
            return op()
    except Exception:
        return None


def _torchrun_failure(store: Any, env: Launcher, host: str, exc: BaseException, timeout_s: float) -> str:
    """One line naming the cause of a failed torchrun rank: the ranks that said nothing (died or stopped) with
    their host and last phase, else this rank's own error. Each failing rank records its error in the store and
    waits a moment for its peers to record theirs."""
    own = first_line(exc)
    _store_quietly(lambda: store.set_timeout(timedelta(seconds=2)))
    if _store_quietly(lambda: store.set(f"meshscale/failed/{env.rank}", own) or True) is None:
        return (f"rank {env.rank} on {host} stopped: the rendezvous store at {env.master_addr}:{env.master_port} is "
                f"gone (the launcher's agent or rank 0 died); seen here as: {own[:160]}")
    where = f"rank {env.rank} on {host} stopped during {_phase(store, env.rank)}"
    if not _is_consequence(own):  # this rank's own failure, not what it saw of a peer's: it is the cause
        return f"{where}: {own}"
    time.sleep(min(2.0, timeout_s))  # the peers' errors arrive within their own timeout of the same collective
    silent = [r for r in range(env.world_size)
              if r != env.rank and not _store_quietly(lambda r=r: store.check([f"meshscale/failed/{r}"]))]
    if not silent:
        return f"{where}: {own}"
    r = silent[0]
    their_host = _store_quietly(lambda: store.get(f"meshscale/host/{r}").decode()) or "an unknown host"
    more = f" (also silent: ranks {silent[1:]})" if silent[1:] else ""
    return (f"{where}: rank {r} on {their_host} died, stopped or hung in {_phase(store, r)} (no error from it){more}; "
            f"seen here as: {own[:160]}")


@contextmanager
def _native_logs_silenced() -> Iterator[None]:
    """File descriptor 2 goes to /dev/null within the block (torch's C++ logging writes there directly)."""
    try:
        saved = os.dup(2)
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:  # no descriptors left: keep the logs rather than fail
        yield
        return
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def signal_name(number: int) -> str:
    """SIGKILL for 9; "signal N" for a number the platform does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:300]


def _launcher_store(env: Launcher, timeout_s: float) -> Any:
    """The store at the launcher's rendezvous endpoint (MASTER_ADDR:MASTER_PORT), under a prefix per attempt.

    torchrun's agent serves it (TORCHELASTIC_USE_AGENT_STORE): every rank is a client. The agent keeps serving
    the same store when it restarts the ranks (--max-restarts), so each attempt (TORCHELASTIC_RESTART_COUNT) has
    its own keys: the last attempt's Gloo addresses and failure records would mislead the next. Otherwise rank 0
    serves it, listening on MASTER_ADDR only, as the endpoint says. No answer within ``timeout_s`` is one line."""
    host, port = env.master_addr, env.master_port
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if env.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return dist.PrefixStore(f"meshscale/attempt_{attempt}", serving_store(host, port, env.world_size, timeout_s))
    try:
        with _native_logs_silenced():  # c10d logs every retry; the one line below says it all
            client = dist.TCPStore(host, port, env.world_size, is_master=False, timeout=timedelta(seconds=timeout_s))
        return dist.PrefixStore(f"meshscale/attempt_{attempt}", client)
    except (RuntimeError, ValueError) as exc:
        raise WorkerError(f"rank {env.rank} on {hostname()}: no rendezvous store answered at "
                          f"{host}:{port} within {timeout_s:.0f} s ({first_line(exc)}); start rank 0 or torchrun "
                          "there first") from None
