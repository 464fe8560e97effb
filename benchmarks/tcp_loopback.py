"""The host's TCP path as NCCL's socket transport uses it (src/transport/net_socket.cc), measured on loopback:
what one helper thread moves, what the kernel's loopback carries with many, one message's latency, and the
host's memory copy rate. Pure Python (sockets, threads; numpy for the copy rate where installed).

NCCL's arrangement, reproduced: a connection of T helper threads x k sockets per thread cuts each message into
tasks of at least 64 KiB (NCCL_SOCKET_MIN_TASKSIZE), one per socket, round-robin over the T x k sockets; socket
i is served by thread i mod T, which sends (or receives) its tasks one after another, so a thread's copies are
serial. TCP_NODELAY is set as NCCL sets it; the socket buffers are the kernel's defaults (NCCL leaves them).
Each sender thread has a receiver thread: the two sides of a connection copy on their own cores (send: user ->
kernel; receive: kernel -> user), as NCCL's send and receive helper threads do on the two ranks' processes.

    PYTHONPATH=src python3 benchmarks/tcp_loopback.py --out $OUT/tcp-loopback.json   # the GPU machine (~20 s)
    python3 benchmarks/tcp_loopback.py --out /tmp/tcp.json --seconds 10             # anywhere

Written JSON (kind "tcp-loopback"): the machine (CPU model, logical CPUs, kernel), every row (threads, sockets per
thread, message bytes, bytes moved, seconds, GB/s), a duplex row (one thread per end sending and receiving at
once, as NCCL's proxy thread does without helper threads), the one-way latency of an 8-byte ping-pong, the copy
rate, and ``summary``: ``per_core_gbps`` (one sender and one receiver thread, the best message size),
``loopback_gbps`` (the most any row moved) and ``latency_s``. Copy it into src/meshscale/simulate/tcp_hosts/
(named after the machine) and meshscale's socket model takes these figures, in place of its published default,
on systems whose CPU model is the one measured (`meshscale.simulate.nccl.net_socket.tcp_host`); ``--cpu-model``
files it under a catalog system's CPU where a VM's /proc/cpuinfo names it otherwise (``cpu_model_seen`` keeps
what the machine said).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import select
import socket
import sys
import threading
import time
from datetime import datetime, timezone

MIN_TASK_BYTES = 1 << 16  # NCCL_SOCKET_MIN_TASKSIZE's default (net_socket.cc)
THREADS = (1, 2, 4, 8)
SOCKS_PER_THREAD = (1, 2, 3, 4)
MESSAGES = tuple(64 << 10 << (2 * i) for i in range(6))  # 64 KiB, 256 KiB, ... 64 MiB


def _pairs(n: int) -> list[tuple[socket.socket, socket.socket]]:
    """``n`` connected TCP pairs over 127.0.0.1 (sender, receiver), TCP_NODELAY on both ends."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(n)
        out = []
        for _ in range(n):
            a = socket.create_connection(listener.getsockname())
            b, _addr = listener.accept()
            for s in (a, b):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            out.append((a, b))
    return out


def tasks_of(message: int, nsocks: int, messages: int) -> list[list[int]]:
    """Per socket, the task sizes NCCL cuts ``messages`` messages of ``message`` bytes into: tasks of
    max(64 KiB, message / nsocks), handed round-robin to the sockets, carrying on from message to message."""
    per_socket: list[list[int]] = [[] for _ in range(nsocks)]
    task = max(MIN_TASK_BYTES, math.ceil(message / nsocks))
    nxt = 0
    for _ in range(messages):
        done = 0
        while done < message:
            size = min(task, message - done)
            per_socket[nxt].append(size)
            nxt = (nxt + 1) % nsocks
            done += size
    return per_socket


def _send(socks: list, plan: list[list[int]], start: threading.Barrier) -> None:
    data = memoryview(bytearray(max((max(p) for p in plan if p), default=1)))
    order = _interleaved(plan)
    start.wait()
    for i, size in order:
        socks[i].sendall(data[:size])


def _recv(socks: list, plan: list[list[int]], start: threading.Barrier) -> None:
    buf = memoryview(bytearray(max((max(p) for p in plan if p), default=1)))
    order = _interleaved(plan)
    start.wait()
    for i, size in order:
        got = 0
        while got < size:
            n = socks[i].recv_into(buf[got:size], size - got, socket.MSG_WAITALL)
            if n == 0:
                raise ConnectionError("loopback peer closed")
            got += n


def _interleaved(plan: list[list[int]]) -> list[tuple[int, int]]:
    """A thread's tasks over its sockets in turn (its first socket's first task, the next socket's first...)."""
    out, depth = [], max((len(p) for p in plan), default=0)
    for j in range(depth):
        out += [(i, p[j]) for i, p in enumerate(plan) if j < len(p)]
    return out


def measure(threads: int, socks: int, message: int, messages: int) -> tuple[int, float]:
    """Bytes moved and seconds taken by ``messages`` messages over ``threads`` x ``socks`` sockets."""
    nsocks = threads * socks
    pairs = _pairs(nsocks)
    plan = tasks_of(message, nsocks, messages)
    start = threading.Barrier(2 * threads + 1)
    workers = []
    for t in range(threads):
        mine = list(range(t, nsocks, threads))  # socket i is served by thread i mod T
        sub = [plan[i] for i in mine]
        workers.append(threading.Thread(target=_send, args=([pairs[i][0] for i in mine], sub, start)))
        workers.append(threading.Thread(target=_recv, args=([pairs[i][1] for i in mine], sub, start)))
    seconds = _timed(workers, start, pairs)
    return message * messages, seconds


def _timed(workers: list[threading.Thread], start: threading.Barrier, pairs: list) -> float:
    """Start ``workers``, release them together at ``start``, wait for all; close ``pairs``. Seconds they ran."""
    for w in workers:
        w.start()
    start.wait()
    t0 = time.perf_counter()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - t0
    for a, b in pairs:
        a.close()
        b.close()
    return seconds


def duplex(message: int, messages: int) -> tuple[int, float]:
    """One thread per end, each sending to the other and receiving from it at once on one socket (NCCL's proxy
    thread without helper threads: a rank's sends and receives on one core). Bytes one direction moved, seconds."""
    (a, b), = _pairs(1)
    for s in (a, b):
        s.setblocking(False)
    start = threading.Barrier(3)

    def end(sock: socket.socket) -> None:
        out = memoryview(bytearray(message))
        buf = memoryview(bytearray(message))
        left_out = left_in = message * messages
        start.wait()
        while left_out or left_in:  # select waits without the interpreter's lock, as a spin would not
            readable, writable, _ = select.select([sock] if left_in else [], [sock] if left_out else [], [], 1.0)
            if writable:
                try:
                    left_out -= sock.send(out[:min(message, left_out)])
                except BlockingIOError:
                    pass
            if readable:
                try:
                    left_in -= sock.recv_into(buf, min(message, left_in))
                except BlockingIOError:
                    pass

    workers = [threading.Thread(target=end, args=(s,)) for s in (a, b)]
    seconds = _timed(workers, start, [(a, b)])
    return message * messages, seconds


def pingpong_one_way_s(seconds: float) -> float:
    """Half the round trip of an 8-byte message and its echo, the median over ``seconds`` of round trips."""
    (a, b), = _pairs(1)
    stop = threading.Event()

    def echo() -> None:
        buf = bytearray(8)
        while not stop.is_set():
            if b.recv_into(buf, 8, socket.MSG_WAITALL) == 0:
                return
            b.sendall(buf)

    t = threading.Thread(target=echo)
    t.start()
    msg, buf, trips = b"12345678", bytearray(8), []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(trips) < 20:
        t0 = time.perf_counter()
        a.sendall(msg)
        a.recv_into(buf, 8, socket.MSG_WAITALL)
        trips.append(time.perf_counter() - t0)
    stop.set()
    a.sendall(msg)
    t.join()
    a.close()
    b.close()
    trips.sort()
    return trips[len(trips) // 2] / 2


def copy_gbps(seconds: float) -> tuple[float, str]:
    """GB/s one thread copies 64 MiB from one buffer into another (numpy's copyto; a memoryview copy without
    numpy), the best of repeats over ``seconds``."""
    size = 64 << 20
    try:
        import numpy as np
        src, dst = np.ones(size, dtype=np.uint8), np.empty(size, dtype=np.uint8)
        copy, how = (lambda: np.copyto(dst, src)), f"numpy {np.__version__} copyto"
    except ImportError:
        src, dst = bytearray(b"\1") * size, memoryview(bytearray(size))
        copy, how = (lambda: dst.__setitem__(slice(None), src)), "memoryview copy"
    copy()
    best, end = float("inf"), time.perf_counter() + seconds
    while time.perf_counter() < end:
        t0 = time.perf_counter()
        copy()
        best = min(best, time.perf_counter() - t0)
    return size / best / 1e9, how


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run(seconds: float, cpu_as: str | None = None) -> dict:
    """Every row within about ``seconds`` in all: each row moves what its share of the time carries at the rate
    of a first quick row (at least one message)."""
    rate = measure(1, 1, 1 << 20, 32)
    rate_bps = rate[0] / rate[1]
    configs = [(t, k, m) for t in THREADS for k in SOCKS_PER_THREAD for m in MESSAGES]
    per_row = 0.75 * seconds / (len(configs) + 3)
    rows = []
    for t, k, m in configs:
        moved, took = measure(t, k, m, max(1, round(rate_bps * per_row / m)))
        rate_bps = moved / took  # the next row's count from this one's rate: neighbours run alike
        rows.append({"threads": t, "socks_per_thread": k, "message_bytes": m, "bytes": moved, "seconds": took,
                     "gbps": moved / took / 1e9})
    m = 1 << 20
    moved, took = duplex(m, max(1, round(rate_bps * per_row / m)))
    latency = pingpong_one_way_s(per_row)
    copy, how = copy_gbps(per_row)
    single = [r["gbps"] for r in rows if r["threads"] == 1 and r["socks_per_thread"] == 1]
    return {
        "kind": "tcp-loopback", "version": 1,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "cpu_model": cpu_as or cpu_model(), "cpu_model_seen": cpu_model(), "logical_cpus": os.cpu_count(),
        "kernel": platform.release(),
        "python": platform.python_version(), "command": " ".join(sys.argv),
        "min_task_bytes": MIN_TASK_BYTES, "rows": rows,
        "duplex": {"message_bytes": m, "bytes_each_way": moved, "seconds": took, "gbps_each_way": moved / took / 1e9},
        "pingpong_one_way_s": latency, "copy_gbps": copy, "copy_how": how,
        "summary": {"per_core_gbps": max(single), "loopback_gbps": max(r["gbps"] for r in rows),
                    "latency_s": latency},
    }


def table(result: dict) -> str:
    """The rows as a table: GB/s per threads x sockets per thread (columns: message sizes)."""
    sizes = sorted({r["message_bytes"] for r in result["rows"]})
    head = f"{'threads x socks':>16} " + " ".join(f"{s >> 10:>8}K" for s in sizes)
    lines = [f"TCP over loopback, GB/s (one direction) on {result['cpu_model']}, {result['logical_cpus']} CPUs", head]
    cells = {(r["threads"], r["socks_per_thread"], r["message_bytes"]): r["gbps"] for r in result["rows"]}
    for t in THREADS:
        for k in SOCKS_PER_THREAD:
            lines.append(f"{f'{t} x {k}':>16} " + " ".join(f"{cells.get((t, k, s), float('nan')):9.2f}" for s in sizes))
    d, s = result["duplex"], result["summary"]
    lines += [f"duplex (one thread per end sends and receives), 1 MiB: {d['gbps_each_way']:.2f} GB/s each way",
              f"ping-pong, 8 B: {result['pingpong_one_way_s'] * 1e6:.1f} us one way",
              f"copy ({result['copy_how']}), 64 MiB: {result['copy_gbps']:.2f} GB/s",
              f"summary: per core {s['per_core_gbps']:.2f} GB/s, loopback {s['loopback_gbps']:.2f} GB/s, "
              f"latency {s['latency_s'] * 1e6:.1f} us"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--seconds", type=float, default=15.0, help="time for all rows together (default 15)")
    parser.add_argument("--cpu-model", default=None, help="the CPU model to file the measurement under (default: "
                        "/proc/cpuinfo's): the catalog system's, e.g. 'Intel Xeon Platinum 8480C' for hgx-h200, "
                        "where a VM names its CPU otherwise")
    args = parser.parse_args(argv)
    if not 1 <= args.seconds <= 600:
        parser.error("--seconds: give 1 to 600")
    result = run(args.seconds, args.cpu_model)
    print(table(result))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
