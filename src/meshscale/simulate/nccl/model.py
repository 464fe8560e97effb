"""One prediction: NCCL's choice for a call (`tuning`) and the time a run takes (`runtime`, `p2p`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from meshscale.collectives.kinds import kind
from meshscale.errors import MeshscaleError
from meshscale.simulate.nccl.p2p import p2p_us
from meshscale.simulate.nccl.runtime import call_floor_us, host_bound_s, host_launch_s, predicted_us
from meshscale.simulate.nccl.search import System, analyse
from meshscale.simulate.nccl.tables import P2P, P2P_COLLECTIVES, constants
from meshscale.simulate.nccl.tuning import NVLS_ALGOS, estimate_us, tuning_table
from meshscale.simulate.nccl_env import DEFAULT_ENV, NcclEnv, allows, with_forced
from meshscale.topology import Topology


@dataclass
class Estimate:
    """One algorithm x protocol: NCCL's own estimate and the predicted time."""

    algo: str
    proto: str
    nccl_time_s: float
    time_s: float
    channels: int


@dataclass
class NcclPrediction:
    """NCCL's choice for one collective and the predicted time; ``candidates`` fastest (by NCCL) first."""

    collective: str
    ranks: list[int]
    nbytes: int
    algo: str
    proto: str
    channels: int
    time_s: float
    nccl_time_s: float
    family: str
    system: System
    candidates: list[Estimate] = field(default_factory=list)
    host_bound: bool = False

    @property
    def detail(self) -> str:
        if self.algo == P2P:
            text = f"nccl p2p/Simple, {self.channels} channels"
        else:
            text = f"nccl {self.algo}/{self.proto}, {self.channels} channels"
        sock = self.system.socket if self.system.n_nodes > 1 else None
        if sock is not None:  # what NCCL's socket transport ran with, and whose TCP figures priced it
            text += (f", TCP sockets {sock.setup.threads}x{sock.setup.socks_per_thread} "
                     f"({'measured' if sock.host.source.startswith('measured') else 'published'} TCP rates)")
        return text + (" (host launch bound)" if self.host_bound else "")


def predict(topo: Topology, collective: str, ranks: list[int], nbytes: int, *, nccl_version: str | None = None,
            nccl_algo: str | None = None, proto: str | None = None, nvls: bool | None = None, root: int = 0,
            gpus_per_thread: int = 1, bandwidth_scale: float = 1.0, env: NcclEnv | None = None) -> NcclPrediction:
    """NCCL's choice and the predicted time of ``collective`` of ``nbytes`` (the nccl-tests size) over ``ranks``.
    ``nccl_algo`` / ``proto`` force them as NCCL_ALGO / NCCL_PROTO do; ``nvls`` False turns NVLink SHARP off
    (NCCL_NVLS_ENABLE=0; default: on where the switches multicast); ``gpus_per_thread`` is how many GPUs one
    host thread drives (nccl-tests -g); ``bandwidth_scale`` scales every bandwidth (a calibration); ``env``:
    NCCL's environment (`nccl_env.NcclEnv`: channels, transports, NCCL_ALGO / NCCL_PROTO / NCCL_NVLS_ENABLE)."""
    collective = kind(collective).name
    c = constants(nccl_version)
    env = with_forced(env or DEFAULT_ENV, nccl_algo, proto, nvls)
    s = analyse(topo, list(ranks), nccl_version, env)
    nbytes = int(nbytes)
    if len(ranks) < 2:
        return NcclPrediction(collective, list(ranks), nbytes, "none", "-", 0,
                              host_bound_s(0.0, gpus_per_thread, nccl_version),
                              0.0, c["family"], s)
    if collective in P2P_COLLECTIVES:
        t, nc = p2p_us(topo, s, c, collective, list(ranks), nbytes, root, bandwidth_scale)
        chosen = Estimate(P2P, "Simple", t * 1e-6, t * 1e-6, nc)
        candidates = [chosen]
    else:
        candidates = []
        for a, p, entry in tuning_table(s, c).offered(collective):
            if not (allows(env.algos, a) and allows(env.protos, p)) or (a in NVLS_ALGOS and env.nvls is False):
                continue
            est = estimate_us(s, c, collective, a, p, entry, nbytes)
            t, nc = predicted_us(s, c, collective, a, p, nbytes, bandwidth_scale)
            candidates.append(Estimate(a, p, est * 1e-6, t * 1e-6, nc))
        if not candidates:
            what = " ".join(x for x in env.settings if x.startswith(("NCCL_ALGO", "NCCL_PROTO"))) or \
                "/".join(x for x in (nccl_algo, proto) if x) or "any algorithm"
            raise MeshscaleError(f"NCCL {c['family']} cannot run {collective} with {what} on {topo.name} "
                                 f"devices {list(ranks)} (the hardware or the version does not offer it)")
        candidates.sort(key=lambda e: e.nccl_time_s)
        chosen = candidates[0]
    floor_s = call_floor_us(s, c, collective, (chosen.algo, chosen.proto)) * 1e-6
    device_s = chosen.time_s if chosen.algo == P2P else max(chosen.time_s, floor_s)
    time_s = host_bound_s(device_s, gpus_per_thread, nccl_version)
    return NcclPrediction(collective, list(ranks), nbytes, chosen.algo, chosen.proto, chosen.channels, time_s,
                          chosen.nccl_time_s, c["family"], s, candidates,
                          host_bound=max(1, gpus_per_thread) * host_launch_s(nccl_version) > device_s)
