"""NCCL's environment as the model's input: the settings users change NCCL's behaviour with (``--nccl-env
KEY=VALUE``), parsed and checked once, and what each one does to the model.

What each setting changes, after NCCL's source (2.28) and its environment-variable documentation:
- NCCL_MAX_NCHANNELS / NCCL_MIN_NCHANNELS: the channels (thread blocks) a communicator runs, clamped after the
  search has doubled them (connect.cc ncclTopoPostset). NCCL's tuning keeps the search graph's bandwidth, so its
  choice does not move; a run on fewer blocks than the graph's channels moves what each block does
  (`runtime.block_link_gbps`) until the links are the limit.
- NCCL_P2P_DISABLE=1, NCCL_P2P_LEVEL=LOC|NVL|PIX|PXB|PHB|SYS: GPU pairs whose path is farther than the level
  lose the P2P transport; paths.cc then routes them through the CPU next to the receiver (the SHM transport:
  the sender's GPU writes into host memory on the receiver's side, the receiver's reads it, each over its own
  PCIe links, the host's memory taking each byte twice); with NCCL_SHM_DISABLE=1 as well, through the network
  (the NET transport and the node's NIC).
- NCCL_SHM_DISABLE=1: no SHM transport (matters where P2P is not possible).
- NCCL_NET=Socket or NCCL_IB_DISABLE=1: the socket transport between nodes: no GPUDirect RDMA (data staged in
  host memory), and a NIC carries what its streams move: NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD streams
  (default 1 x 1), each about a quarter of a 100 Gb/s port (NCCL's documentation: "for generic 100G networks,
  this value can be manually set to 4" threads).
- NCCL_ALGO, NCCL_PROTO (a name, a comma list, or ``^`` and a list to exclude), NCCL_NVLS_ENABLE.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from meshscale.errors import MeshscaleError
from meshscale.units import is_digits

# path types nearest first, as NCCL_P2P_LEVEL names them (LOC: P2P nowhere; NVL: NVLink only)
P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
_P2P_LEVEL_ALIASES = {"0": "LOC", "1": "PIX", "2": "PXB", "3": "PHB", "4": "SYS", "5": "SYS", "NODE": "PHB"}
SOCKET_STREAM_GBPS = 100 / 8 / 4  # GB/s of one socket stream: 4 threads fill a generic 100 Gb/s port (NCCL docs)
MAX_SOCKET_STREAMS = 64  # NCCL: NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD may not exceed 64
MAX_CHANNELS = 64  # NCCL's MAXCHANNELS
KEYS = ("NCCL_MAX_NCHANNELS", "NCCL_MIN_NCHANNELS", "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SHM_DISABLE",
        "NCCL_NET", "NCCL_IB_DISABLE", "NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD", "NCCL_ALGO", "NCCL_PROTO",
        "NCCL_NVLS_ENABLE")


@dataclass(frozen=True)
class NcclEnv:
    """NCCL's environment as the model reads it; ``settings`` is what was given, in order, as KEY=VALUE."""

    max_channels: int | None = None
    min_channels: int | None = None
    p2p_level: str | None = None          # one of P2P_LEVELS; None: NCCL's default (P2P wherever it works)
    shm: bool = True
    socket: bool = False                  # the socket transport between nodes (NCCL_NET=Socket, NCCL_IB_DISABLE=1)
    socket_streams: int = 1               # NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD
    algos: frozenset[str] | None = None   # the algorithms NCCL may pick (None: all)
    protos: frozenset[str] | None = None
    nvls: bool | None = None
    settings: tuple[str, ...] = field(default=(), compare=False)

    def p2p_allowed(self, path_type: str) -> bool:
        """Whether the P2P transport joins two GPUs whose path is of ``path_type`` (NVL, PIX, PXB, PHB, SYS)."""
        if self.p2p_level is None:
            return True
        return P2P_LEVELS.index(path_type) <= P2P_LEVELS.index(self.p2p_level) and self.p2p_level != "LOC"

    @property
    def search_key(self) -> tuple:
        """What changes the graphs NCCL's search finds (the transports); the channel counts are applied after it."""
        return self.p2p_level, self.shm, self.socket, self.socket_streams

    @property
    def system_key(self) -> tuple:
        """What changes what NCCL derives from the topology (its graphs, transports, channels)."""
        return self.p2p_level, self.shm, self.socket, self.socket_streams, self.max_channels, self.min_channels

    def channels(self, natural: int) -> int:
        """The channels a communicator runs when NCCL's search gives it ``natural``: NCCL_MAX_NCHANNELS first,
        then NCCL_MIN_NCHANNELS (connect.cc: "combining max, then min ... then duplicate them")."""
        n = natural if self.max_channels is None else min(natural, self.max_channels)
        if self.min_channels is not None:
            n = max(n, self.min_channels)
        return max(1, min(n, MAX_CHANNELS))

    def socket_gbps(self, port_gbps: float) -> float:
        """GB/s one NIC carries over the socket transport: its streams, at most the port."""
        return min(port_gbps, self.socket_streams * SOCKET_STREAM_GBPS)

    def describe(self) -> str:
        return " ".join(self.settings) if self.settings else "NCCL defaults"


DEFAULT_ENV = NcclEnv()


def _bool(key: str, value: str) -> bool:
    if value in ("0", "1"):
        return value == "1"
    raise MeshscaleError(f"{key}={value}: use 0 or 1")


def _count(key: str, value: str, hi: int) -> int:
    if not is_digits(value) or not 1 <= int(value) <= hi:
        raise MeshscaleError(f"{key}={value}: use a whole number from 1 to {hi}")
    return int(value)


def _names(key: str, value: str, normalize) -> frozenset[str]:
    """NCCL_ALGO / NCCL_PROTO: a name, a comma list, or ``^`` and a list to leave out."""
    exclude = value.startswith("^")
    picked = frozenset(normalize(x) for x in value.lstrip("^").split(",") if x.strip())
    if not picked:
        raise MeshscaleError(f"{key}={value}: name at least one")
    return picked if not exclude else frozenset({"*exclude*", *picked})


def parse_nccl_env(pairs: list[str] | tuple[str, ...] | None) -> NcclEnv:
    """The `NcclEnv` of ``KEY=VALUE`` strings; a one-line `MeshscaleError` naming the accepted keys for an
    unknown key, and the accepted values for a bad value."""
    from meshscale.simulate.nccl.tables import ALGORITHMS, PROTOCOLS, normalize_algo, normalize_proto

    if not pairs:
        return DEFAULT_ENV
    fields: dict = {}
    seen: dict[str, str] = {}
    threads = socks = 1
    for pair in pairs:
        key, eq, value = str(pair).partition("=")
        key, value = key.strip().upper(), value.strip()
        if not eq or key not in KEYS:
            raise MeshscaleError(f"--nccl-env {pair!r}: give KEY=VALUE with KEY one of {', '.join(KEYS)}")
        if key in seen:
            raise MeshscaleError(f"--nccl-env {key} given twice ({seen[key]}, {value}); give it once")
        seen[key] = value
        if key == "NCCL_MAX_NCHANNELS":
            fields["max_channels"] = _count(key, value, MAX_CHANNELS)
        elif key == "NCCL_MIN_NCHANNELS":
            fields["min_channels"] = _count(key, value, MAX_CHANNELS)
        elif key == "NCCL_P2P_DISABLE":
            if _bool(key, value):
                fields["p2p_level"] = "LOC"
        elif key == "NCCL_P2P_LEVEL":
            level = _P2P_LEVEL_ALIASES.get(value.upper(), value.upper())
            if level not in P2P_LEVELS:
                raise MeshscaleError(f"{key}={value}: use one of {', '.join(P2P_LEVELS)}")
            fields.setdefault("p2p_level", level)  # NCCL_P2P_DISABLE=1 wins over a level
        elif key == "NCCL_SHM_DISABLE":
            fields["shm"] = not _bool(key, value)
        elif key == "NCCL_NET":
            if value.lower() not in ("ib", "socket"):
                raise MeshscaleError(f"{key}={value}: use IB or Socket")
            fields["socket"] = fields.get("socket", False) or value.lower() == "socket"
        elif key == "NCCL_IB_DISABLE":
            fields["socket"] = fields.get("socket", False) or _bool(key, value)
        elif key == "NCCL_SOCKET_NTHREADS":
            threads = _count(key, value, 16)
        elif key == "NCCL_NSOCKS_PERTHREAD":
            socks = _count(key, value, MAX_SOCKET_STREAMS)
        elif key == "NCCL_ALGO":
            fields["algos"] = _names(key, value, normalize_algo)
        elif key == "NCCL_PROTO":
            fields["protos"] = _names(key, value, normalize_proto)
        elif key == "NCCL_NVLS_ENABLE":
            fields["nvls"] = _bool(key, value)
    if threads * socks > MAX_SOCKET_STREAMS:
        raise MeshscaleError(f"NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD = {threads * socks}: NCCL allows at most "
                             f"{MAX_SOCKET_STREAMS}")
    env = NcclEnv(**fields, socket_streams=threads * socks, settings=tuple(f"{k}={v}" for k, v in seen.items()))
    for name, allowed, known in (("NCCL_ALGO", env.algos, ALGORITHMS), ("NCCL_PROTO", env.protos, PROTOCOLS)):
        if allowed is not None and not [x for x in known if allows(allowed, x)]:
            raise MeshscaleError(f"{name}={seen[name]} leaves nothing to run")
    return env


def allows(allowed: frozenset[str] | None, name: str) -> bool:
    """Whether an NCCL_ALGO / NCCL_PROTO set lets ``name`` run."""
    if allowed is None:
        return True
    return (name not in allowed) if "*exclude*" in allowed else name in allowed


def with_forced(env: NcclEnv, algo: str | None = None, proto: str | None = None, nvls: bool | None = None) -> NcclEnv:
    """``env`` with the command line's --nccl-algo / --proto / --nvls folded in (one setting given two ways is
    an error)."""
    from dataclasses import replace

    from meshscale.simulate.nccl.tables import normalize_algo, normalize_proto

    for given, name, current in ((algo, "NCCL_ALGO", env.algos), (proto, "NCCL_PROTO", env.protos),
                                 (nvls, "NCCL_NVLS_ENABLE", env.nvls)):
        if given is not None and current is not None:
            raise MeshscaleError(f"{name} given twice (an option and --nccl-env); give it once")
    out = env
    if algo is not None:
        out = replace(out, algos=frozenset({normalize_algo(algo)}))
    if proto is not None:
        out = replace(out, protos=frozenset({normalize_proto(proto)}))
    if nvls is not None:
        out = replace(out, nvls=nvls)
    return out


@dataclass(frozen=True)
class NcclSettings:
    """NCCL's description a command was given, beside its environment: the version whose model to use
    (None: 2.28), the algorithm, protocol and NVLS forced as --nccl-algo / --proto / --nvls force them (None:
    NCCL's own choice) and the GPUs one host thread drives (nccl-tests -g)."""

    env: NcclEnv = DEFAULT_ENV
    version: str | None = None
    algo: str | None = None
    proto: str | None = None
    nvls: bool | None = None
    gpus_per_thread: int = 1

    def given(self) -> dict:
        """What was given, by the options' names (nccl_algo, proto, nccl_version, nvls, nccl_env); the rest stays
        the model's default."""
        named = {"nccl_algo": self.algo, "proto": self.proto, "nccl_version": self.version, "nvls": self.nvls,
                 "nccl_env": self.env if self.env.settings else None}
        return {k: v for k, v in named.items() if v is not None}


def nccl_settings(nccl_algo: str | None = None, proto: str | None = None, nccl_version: str | None = None,
                  nvls: bool | None = None, nccl_env: list[str] | None = None) -> NcclSettings:
    """NCCL's settings from the command line's options; ``nccl_env``: the ``--nccl-env KEY=VALUE`` strings."""
    return NcclSettings(parse_nccl_env(nccl_env) if nccl_env else DEFAULT_ENV, nccl_version, nccl_algo, proto, nvls)
