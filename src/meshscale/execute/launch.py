"""Start N ranks of a function over torch.distributed, on GPUs (NCCL) or CPU processes (Gloo), and never hang.

The parent owns a TCPStore on a free port (no port races) and the child processes. Every process group has a
timeout. A rank that raises, dies or outlives the deadline makes the parent stop all the others and raise
`WorkerError` naming the rank and the operation it was in (each rank records its current phase in the store).
Under `torchrun` (RANK/WORLD_SIZE set) the function runs in the current process instead, on the env:// group.
"""
from __future__ import annotations

import gc
import multiprocessing as mp
import os
import queue
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from meshscale.errors import MeshscaleError

NCCL_SAFETY_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


_PEER_ERRORS = ("Connection closed by peer", "Connection reset by peer", "Read error", "Broken pipe")


class WorkerError(MeshscaleError):
    """A rank failed, died or timed out; the message names the rank and what it was doing."""


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


def in_torchrun() -> bool:
    """True when started by torchrun (or any launcher that sets RANK and WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ


def _die_with(owner_pid: int) -> None:
    """Exit this rank when the process that launched it is gone (killed, crashed): a daemon thread watches it.
    (PR_SET_PDEATHSIG would watch the fork server, not the launcher.)"""

    def watch() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(owner_pid, 0)
            except ProcessLookupError:
                os._exit(1)

    threading.Thread(target=watch, daemon=True, name="meshscale-watchdog").start()


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


def _child(fn: Callable, rank: int, world: int, backend: str, port: int, timeout_s: float, args: tuple,
           results: Any, owner_pid: int) -> None:
    _die_with(owner_pid)
    os.environ.update(NCCL_SAFETY_ENV)
    code = 0
    try:
        store = dist.TCPStore("127.0.0.1", port, world, is_master=False, timeout=timedelta(seconds=timeout_s))
        ctx = _init(rank, world, rank, backend, store, timeout_s)
        out = fn(ctx, *args)
        results.put(("ok", rank, out))
        del ctx
        _teardown()
    except BaseException as exc:  # report everything, including KeyboardInterrupt, then exit non-zero
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        results.put(("error", rank, last[:2000]))
        code = 1
    finally:
        # Leave without running atexit/finalizers that could block on a half-dead group.
        try:
            results.close()
            results.join_thread()
        finally:
            os._exit(code)


def launch(fn: Callable[..., Any], world_size: int, args: tuple = (), backend: str = "gloo",
           timeout_s: float = 60.0, deadline_s: float | None = None, start_method: str | None = None) -> list[Any]:
    """Run ``fn(ctx, *args)`` on ``world_size`` ranks and return the per-rank results in rank order.

    ``timeout_s`` bounds every collective (the process-group timeout); ``deadline_s`` bounds the whole run
    (default: no bound beyond the per-operation one). Under torchrun, runs this rank only and returns
    ``[result]``. Raises `WorkerError` if any rank fails."""
    if in_torchrun():
        return [_run_under_torchrun(fn, args, backend, timeout_s)]
    if world_size < 1:
        raise MeshscaleError(f"need at least one rank, got {world_size}")
    if backend == "nccl":
        if not torch.cuda.is_available() or torch.cuda.device_count() < world_size:
            have = torch.cuda.device_count() if torch.cuda.is_available() else 0
            raise MeshscaleError(f"asked for {world_size} GPUs but this machine has {have}")
        start_method = start_method or "spawn"  # CUDA cannot be used in a forked child
        os.environ.update(NCCL_SAFETY_ENV)
    ctx = mp.get_context(start_method or "forkserver")
    if ctx.get_start_method() == "forkserver":
        # Fork from a clean single-threaded server that already imported torch: fast (about 0.1 s a rank) and
        # free of the locks a threaded parent (TCPStore server, OpenMP) would pass to a plain fork.
        ctx.set_forkserver_preload(["torch", "torch.distributed", __name__])
    store = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=timeout_s))
    results = ctx.Queue()
    procs = [ctx.Process(target=_child, args=(fn, r, world_size, backend, store.port, timeout_s, args, results, os.getpid()),
                         daemon=True, name=f"meshscale-rank{r}") for r in range(world_size)]
    for p in procs:
        p.start()
    outputs: dict[int, Any] = {}
    errors: dict[int, str] = {}
    start = time.monotonic()
    failure: str | None = None
    try:
        while len(outputs) < world_size and not errors and failure is None:
            _collect(results, outputs, errors, 0.1)
            if any(p.exitcode is not None for r, p in enumerate(procs) if r not in outputs):
                _collect(results, outputs, errors, 0.5)  # a result may have raced with the exit
                _mark_dead(procs, outputs, errors)
            if deadline_s is not None and time.monotonic() - start > deadline_s and not errors:
                late = [r for r in range(world_size) if r not in outputs]
                failure = f"ranks {late} did not finish within {deadline_s:.0f} s (rank {late[0]} was in {_phase(store, late[0])})"
        if errors:
            _collect(results, outputs, errors, 0.5)  # let the other ranks report, to find the first cause
            _mark_dead(procs, outputs, errors)  # a peer's error may have arrived before a silent death was seen
            # The root cause: a rank that died without a word, else the first to raise something other than
            # the connection errors its peers then see.
            silent = [r for r, e in errors.items() if e.startswith("died")]
            own = [r for r, e in errors.items() if not any(m in e for m in _PEER_ERRORS)]
            r = (silent or own or list(errors))[0]
            what = errors[r] if r in silent else f"failed with {errors[r]}"
            failure = f"rank {r} {what} during {_phase(store, r)}"
            others = sorted(set(errors) - {r})
            if others:
                failure += f" (ranks {others} stopped too)"
    except KeyboardInterrupt:
        failure = "interrupted (Ctrl-C); all ranks stopped"
    finally:
        _stop(procs)
    if failure:
        raise WorkerError(failure)
    return [outputs[r] for r in range(world_size)]


def _mark_dead(procs: list, outputs: dict, errors: dict) -> None:
    """Record the ranks that exited without a word."""
    for r, p in enumerate(procs):
        if r not in outputs and r not in errors and p.exitcode is not None:
            code = p.exitcode
            errors[r] = f"died ({f'signal {-code}' if code < 0 else f'exit code {code}'})"


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
    for p in procs:
        if p.is_alive():
            p.terminate()
    end = time.monotonic() + 3
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(1)


def _run_under_torchrun(fn: Callable, args: tuple, backend: str, timeout_s: float) -> Any:
    os.environ.update(NCCL_SAFETY_ENV)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + 1, world, is_master=rank == 0,
                          timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
    ctx = _init(rank, world, local_rank, backend, store, timeout_s)
    try:
        return fn(ctx, *args)
    finally:
        del ctx
        _teardown()
