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
- NCCL_NET=Socket or NCCL_IB_DISABLE=1: the socket transport (NET/Socket) wherever NCCL goes through the network,
  as it does by itself where the NICs do no RDMA (plain Ethernet); NCCL_NET=IB: the IB transport, also on an
  Ethernet NIC (RoCE). NCCL_SOCKET_NTHREADS (0-16) and NCCL_NSOCKS_PERTHREAD: the helper threads and sockets of
  each connection (unset: NCCL's own choice by the NIC's vendor; `nccl.net_socket` prices them).
- NCCL_ALGO, NCCL_PROTO (a name, a comma list, or ``^`` and a list to exclude), NCCL_NVLS_ENABLE.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from meshscale.errors import MeshscaleError
from meshscale.units import is_digits

# path types nearest first, as NCCL_P2P_LEVEL names them (LOC: P2P nowhere; NVL: NVLink only)
P2P_LEVELS = ("LOC", "NVL", "PIX", "PXB", "PHB", "SYS")
_P2P_LEVEL_ALIASES = {"0": "LOC", "1": "PIX", "2": "PXB", "3": "PHB", "4": "SYS", "5": "SYS", "NODE": "PHB"}
# net_socket.cc: NCCL_SOCKET_NTHREADS above MAX_THREADS is set to 16 (a WARN); threads x sockets per thread above
# MAX_SOCKETS lowers the sockets per thread to 64 / threads. Either is refused here: the value would not count.
MAX_SOCKET_THREADS = 16
MAX_SOCKETS = 64
MAX_CHANNELS = 64  # NCCL's MAXCHANNELS
# several settings in one --nccl-env value: split before each KEY= (NCCL_ALGO's own lists keep their commas)
_NEXT_SETTING = re.compile(r",\s*(?=[Nn][Cc][Cc][Ll]_[A-Za-z0-9_]*=)")
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
    net: str | None = None                # NCCL_NET: "ib" or "socket"; None: IB where the NIC does RDMA
    ib_disable: bool = False              # NCCL_IB_DISABLE=1: the socket transport
    socket_threads: int | None = None     # NCCL_SOCKET_NTHREADS; None: NCCL's choice (net_socket.py)
    socks_per_thread: int | None = None   # NCCL_NSOCKS_PERTHREAD; None: NCCL's choice
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
    def socket_forced(self) -> bool:
        """The socket transport wherever NCCL uses the network (NCCL_NET=Socket, NCCL_IB_DISABLE=1)."""
        return self.net == "socket" or self.ib_disable

    def uses_socket(self, rdma: bool) -> bool:
        """Whether NCCL goes through a NIC by the socket transport: forced, or the NIC does no RDMA and
        NCCL_NET=IB does not say it does (RoCE)."""
        return self.socket_forced or (not rdma and self.net != "ib")

    @property
    def search_key(self) -> tuple:
        """What changes the graphs NCCL's search finds (the transports); the channel counts are applied after it."""
        return self.p2p_level, self.shm, self.net, self.ib_disable

    @property
    def system_key(self) -> tuple:
        """What changes what NCCL derives from the topology (its graphs, transports, channels, sockets)."""
        return (*self.search_key, self.socket_threads, self.socks_per_thread, self.max_channels, self.min_channels)

    def channels(self, natural: int) -> int:
        """The channels a communicator runs when NCCL's search gives it ``natural``: NCCL_MAX_NCHANNELS first,
        then NCCL_MIN_NCHANNELS (connect.cc: "combining max, then min ... then duplicate them")."""
        n = natural if self.max_channels is None else min(natural, self.max_channels)
        if self.min_channels is not None:
            n = max(n, self.min_channels)
        return max(1, min(n, MAX_CHANNELS))

    def describe(self) -> str:
        return " ".join(self.settings) if self.settings else "NCCL defaults"


DEFAULT_ENV = NcclEnv()


def _bool(key: str, value: str) -> bool:
    if value in ("0", "1"):
        return value == "1"
    raise MeshscaleError(f"{key}={value}: use 0 or 1")


def _count(key: str, value: str, hi: int, lo: int = 1, why: str = "") -> int:
    if not is_digits(value) or not lo <= int(value) <= hi:
        raise MeshscaleError(f"{key}={value}: use a whole number from {lo} to {hi}{why}")
    return int(value)


def split_settings(pairs) -> list[str]:
    """The KEY=VALUE settings of ``--nccl-env`` values, each given alone or several joined by commas
    (NCCL_P2P_DISABLE=1,NCCL_SHM_DISABLE=1)."""
    return [part for pair in pairs for part in _NEXT_SETTING.split(str(pair))]


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
    for pair in split_settings(pairs):
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
        else:
            fields.update(_other_setting(key, value, normalize_algo, normalize_proto))
    _check_sockets(fields, seen)
    env = NcclEnv(**fields, settings=tuple(f"{k}={v}" for k, v in seen.items()))
    for name, allowed, known in (("NCCL_ALGO", env.algos, ALGORITHMS), ("NCCL_PROTO", env.protos, PROTOCOLS)):
        if allowed is not None and not [x for x in known if allows(allowed, x)]:
            raise MeshscaleError(f"{name}={seen[name]} leaves nothing to run")
    return env


def _other_setting(key: str, value: str, normalize_algo, normalize_proto) -> dict:
    """The `NcclEnv` fields of one setting of the network, the sockets, the algorithms or NVLS."""
    if key == "NCCL_NET":
        if value.lower() not in ("ib", "socket"):
            raise MeshscaleError(f"{key}={value}: use IB or Socket")
        return {"net": value.lower()}
    if key == "NCCL_IB_DISABLE":
        return {"ib_disable": _bool(key, value)}
    if key == "NCCL_SOCKET_NTHREADS":  # 0: no helper thread (the proxy thread does the socket calls)
        return {"socket_threads": _count(key, value, MAX_SOCKET_THREADS, 0, " (NCCL sets larger values to 16)")}
    if key == "NCCL_NSOCKS_PERTHREAD":
        return {"socks_per_thread": _count(key, value, MAX_SOCKETS, 0)}
    if key == "NCCL_ALGO":
        return {"algos": _names(key, value, normalize_algo)}
    if key == "NCCL_PROTO":
        return {"protos": _names(key, value, normalize_proto)}
    return {"nvls": _bool(key, value)}  # NCCL_NVLS_ENABLE


def _check_sockets(fields: dict, seen: dict[str, str]) -> None:
    """NCCL_NET=IB beside NCCL_IB_DISABLE=1 leaves NCCL no network; threads x sockets per thread above 64 are
    lowered by NCCL (net_socket.cc), so refused (one set alone is checked against NCCL's default of the other
    where the NIC is known: `nccl.net_socket.socket_setup`)."""
    if fields.get("net") == "ib" and fields.get("ib_disable"):
        raise MeshscaleError("NCCL_NET=IB with NCCL_IB_DISABLE=1 leaves NCCL no network; give one of them")
    threads, socks = fields.get("socket_threads"), fields.get("socks_per_thread")
    if threads is not None and socks is not None and threads * socks > MAX_SOCKETS:
        raise MeshscaleError(f"NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD = {threads * socks}: NCCL allows at most "
                             f"{MAX_SOCKETS} (it would lower NCCL_NSOCKS_PERTHREAD to {MAX_SOCKETS // threads})")


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
