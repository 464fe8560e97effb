"""NCCL's socket transport (NET/Socket) by mechanism: the helper threads and sockets of a connection, how a
message is cut over them, and what the host's TCP path moves.

From NCCL's source (NVIDIA/nccl v2.28.9; the same in v2.30.7):
- ``src/transport/net_socket.cc`` ncclNetSocketGetNsockNthread: NCCL_SOCKET_NTHREADS and NCCL_NSOCKS_PERTHREAD
  unset (-2) are chosen by the NIC's PCI vendor: AWS (0x1d0f) 2 threads x 8 sockets, GCP (0x1ae0) 4 x 1, any
  other 0 x 1 ("we only use the main thread and do not spawn extra threads"). With no socket (threads or sockets
  0) a message goes over the connection's control socket, moved by the rank's proxy thread (ncclNetSocketTest),
  which progresses every send and receive of its rank: one core copies the rank's traffic both ways. Otherwise
  ncclNetSocketTest cuts a message into tasks of max(NCCL_SOCKET_MIN_TASKSIZE = 64 KiB, size / sockets), handed
  round-robin to the sockets (socket i served by helper thread i mod threads); each connection (a send and a
  receive comm per channel and peer) starts threads of its own, and a thread copies its sockets' tasks one after
  another (persistentSocketThread). Properties: ptrSupport NCCL_PTR_HOST (no GPUDirect RDMA: the GPU's SMs
  write the send buffer in pinned host memory and read the receive buffer there, over PCIe), maxRecvs 1, speed
  from /sys/class/net/<if>/speed (10 Gb/s when unknown), which NCCL's search and tuning read as for any NIC.
- ``src/transport/net.cc`` sendProxyProgress: one isend per slice of a step buffer (NCCL_BUFFSIZE / NCCL_STEPS),
  at most NCCL_STEPS / sliceSteps of them in flight per connection (``src/include/collectives.h``,
  ``src/init.cc`` DEFAULT_*_BUFFSIZE).
- ``src/graph/paths.cc`` / ``src/init.cc``: GPUs that reach each other by neither P2P nor SHM are cut into
  separate systems (ncclTopoTrimSystem), and init.cc counts a node per ring's first rank: each such group is a
  node of its own to NCCL's tuning, across the network even on one host (`search.nccl_nodes`).

The kernel's TCP path: every byte is copied by a CPU core (send: user to kernel; receive: kernel to user), so a
thread moves at most one core's TCP copy rate, threads add up to the host's cores, and on one host (loopback)
the copies pass through host memory. Those rates are the machine's (`TcpHost`): measured by
``benchmarks/tcp_loopback.py``, a published figure until then (the data file's ``tcp_host``).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

from meshscale.errors import MeshscaleError
from meshscale.simulate.nccl.tables import data_file
from meshscale.simulate.nccl_env import MAX_SOCKETS, NcclEnv

MIN_TASK_BYTES = 1 << 16  # NCCL_SOCKET_MIN_TASKSIZE: a message is cut into tasks of at least 64 KiB
# NCCL_SOCKET_NTHREADS / NCCL_NSOCKS_PERTHREAD NCCL chooses by the NIC's PCI vendor (net_socket.cc)
VENDOR_DEFAULTS = {"0x1d0f": (2, 8, "AWS"), "0x1ae0": (4, 1, "GCP")}
GENERIC_DEFAULT = (0, 1)
UNKNOWN_SPEED_GBPS = 10 / 8  # net_socket.cc: an interface whose speed sysfs does not tell is taken as 10 Gb/s
NCCL_STEPS = 8  # src/include/device.h: slots of a connection's buffer
# src/init.cc DEFAULT_LL_BUFFSIZE (8 lines x 512 threads x 8 steps x 16 B), DEFAULT_LL128_BUFFSIZE (120 x 640 x
# 8 x 8 B), DEFAULT_BUFFSIZE (4 MiB): a connection's buffer per protocol, NCCL_STEPS slots of it
BUFFER_BYTES = {"LL": 8 * 512 * NCCL_STEPS * 16, "LL128": 120 * 640 * NCCL_STEPS * 8, "Simple": 1 << 22}
# src/include/collectives.h *_SLICESTEPS: steps one isend carries
SLICE_STEPS = {"all_reduce": 2, "all_gather": 2, "reduce_scatter": 2, "broadcast": 1, "reduce": 1}
# the share of a protocol's bytes on the wire that is data: LL 8 of each 16 B line, LL128 120 of 128 B
WIRE_DATA_SHARE = {"LL": 0.5, "LL128": 120 / 128, "Simple": 1.0}
MEASURED_DIR = "tcp_hosts"  # simulate/tcp_hosts/*.json: benchmarks/tcp_loopback.py's results


@dataclass(frozen=True)
class SocketSetup:
    """A connection's helper threads and sockets per thread as NCCL settles them, and where they came from."""

    threads: int
    socks_per_thread: int
    source: str

    @property
    def sockets(self) -> int:
        """Data sockets of a connection; 0: the proxy thread moves the data over the control socket."""
        return self.threads * self.socks_per_thread

    def engaged_threads(self, message_bytes: float, slice_steps: int = 2) -> int:
        """Helper threads one connection keeps busy with messages of ``message_bytes``: each is cut into tasks
        of at least 64 KiB, one per socket, and NCCL_STEPS / sliceSteps messages are in flight."""
        if self.sockets == 0:
            return 0
        tasks = min(self.sockets, max(1, math.ceil(message_bytes / MIN_TASK_BYTES)))
        return min(self.threads, tasks * max(1, NCCL_STEPS // max(1, slice_steps)))


def socket_setup(env: NcclEnv, vendor: str | None = None) -> SocketSetup:
    """The threads and sockets per thread NCCL runs a connection with: NCCL_SOCKET_NTHREADS and
    NCCL_NSOCKS_PERTHREAD where set, NCCL's choice for the NIC's PCI ``vendor`` for the others. A product above
    64 (which NCCL would lower) is refused in one line."""
    auto_threads, auto_socks, name = VENDOR_DEFAULTS.get(str(vendor or "").lower(), (*GENERIC_DEFAULT, "generic"))
    threads = auto_threads if env.socket_threads is None else env.socket_threads
    socks = auto_socks if env.socks_per_thread is None else env.socks_per_thread
    if threads * socks > MAX_SOCKETS:
        raise MeshscaleError(f"NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD = {threads} x {socks} with NCCL's "
                             f"default for a {name} NIC: NCCL allows at most {MAX_SOCKETS}; set the other too")
    if env.socks_per_thread is not None and threads == 0:  # no helper thread: the sockets are never opened
        raise MeshscaleError(f"NCCL_NSOCKS_PERTHREAD={env.socks_per_thread} with no helper thread (NCCL_SOCKET_NTHREADS"
                             f"={threads}{' as set' if env.socket_threads is not None else ', the default for a ' + name + ' NIC'})"
                             " changes nothing: NCCL moves the data on the proxy thread; set NCCL_SOCKET_NTHREADS too")
    given = [k for k, v in (("NCCL_SOCKET_NTHREADS", env.socket_threads),
                            ("NCCL_NSOCKS_PERTHREAD", env.socks_per_thread)) if v is not None]
    source = " and ".join(given) + " as set" if len(given) == 2 else \
        f"NCCL's default for a {name} NIC" + (f", {given[0]} as set" if given else "")
    return SocketSetup(threads, socks, source)


@dataclass(frozen=True)
class TcpHost:
    """The host's TCP path: GB/s one core copies through the kernel's TCP stack (one side of a flow), GB/s the
    loopback carries in all (0: its CPUs' memory over ``loopback_passes``), one message's latency beyond NCCL's
    own, and where the figures come from."""

    per_core_gbps: float
    loopback_gbps: float
    latency_s: float
    source: str
    loopback_passes: float = 4.0

    def loopback_of(self, memory_gbps: float) -> float:
        """GB/s the host's loopback carries, all flows together: measured, or its memory over the passes."""
        return self.loopback_gbps or (memory_gbps / self.loopback_passes if memory_gbps else math.inf)


def _cpu_key(model: str) -> str:
    """A CPU model name without its maker's marks and clock ("Intel(R) Xeon(R) Platinum 8480C" and "Intel Xeon
    Platinum 8480C" alike)."""
    text = re.sub(r"\((r|tm)\)|@.*$|\bcpu\b|\bprocessor\b|[0-9-]+-core", " ", str(model).lower())
    return " ".join(text.split())


@lru_cache(maxsize=1)
def measured_hosts() -> tuple[dict, ...]:
    """The `benchmarks/tcp_loopback.py` results shipped in simulate/tcp_hosts/ (kind "tcp-loopback")."""
    folder = resources.files("meshscale.simulate").joinpath(MEASURED_DIR)
    if not folder.is_dir():
        return ()
    out = []
    for entry in sorted(folder.iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".json"):
            data = json.loads(entry.read_text())
            if data.get("kind") == "tcp-loopback" and data.get("summary"):
                out.append(dict(data, file=entry.name))
    return tuple(out)


def tcp_host(cpu_model: str) -> TcpHost:
    """The TCP path of a host with CPUs ``cpu_model``: the newest measurement of that CPU model, else the
    published default (the data file's ``tcp_host``)."""
    key = _cpu_key(cpu_model)
    mine = [m for m in measured_hosts() if key and _cpu_key(m.get("cpu_model", "")) == key]
    default = data_file()["tcp_host"]
    if mine:
        m = max(mine, key=lambda x: x.get("date", ""))
        s = m["summary"]
        return TcpHost(float(s["per_core_gbps"]), float(s["loopback_gbps"]), float(s.get("latency_s", 0.0)),
                       f"measured: {m['file']} ({m.get('cpu_model')}, {m.get('date', '?')})")
    return TcpHost(float(default["per_core_gbps"]), 0.0, float(default["latency_s"]), str(default["source"]),
                   float(default["loopback_passes"]))


@dataclass(frozen=True)
class SocketRun:
    """What a node of NCCL's moves over the socket transport: its connections (a send and a receive comm per
    network channel), the GPUs whose proxy threads carry them, the host cores they share, the path's own rate
    (on one host: its share of the loopback and its GPUs' staging over PCIe; 0 between hosts, where the NICs'
    rate is NCCL's ``inter_gbps``), and the host's TCP path."""

    setup: SocketSetup
    host: TcpHost
    connections: int
    ranks: int
    cores: float
    link_gbps: float
    loopback: bool

    def node_gbps(self, message_bytes: float, connections: int | None = None, slice_steps: int = 2) -> float:
        """GB/s each way the node copies through the kernel with messages of ``message_bytes`` over
        ``connections`` each way (default: its network channels'): without sockets each of its ranks' proxy
        threads copies its sends and its receives on one core (half the core's rate each way); with sockets each
        connection's engaged helper threads copy on a core each (half of them send, half receive), as many at
        once as the cores allow."""
        conns = max(1, connections or self.connections)
        if self.setup.sockets == 0:
            busy = min(self.ranks, 2 * conns)
        else:
            busy = 2 * conns * self.setup.engaged_threads(message_bytes, slice_steps)
        cores = min(busy, self.cores) if self.cores else busy
        copy = cores * self.host.per_core_gbps / 2
        return min(copy, self.link_gbps) if self.link_gbps else copy
