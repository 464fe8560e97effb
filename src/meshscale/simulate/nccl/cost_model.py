"""NCCL's model behind the cost interface (`simulate.cost`): what NCCL would pick for a `Call` and how long it
takes, in NCCL's environment and settings, its bandwidths scaled by a calibration of the links."""
from __future__ import annotations

from dataclasses import dataclass

from meshscale.collectives.kinds import kind
from meshscale.simulate.cost import Call, Prediction
from meshscale.simulate.nccl.model import predict
from meshscale.simulate.nccl.search import analyse
from meshscale.simulate.nccl_env import DEFAULT_ENV, NcclEnv, NcclSettings
from meshscale.simulate.params import DEFAULT_EFFICIENCY, SimParams
from meshscale.topology import Topology


@dataclass(frozen=True)
class NcclCostModel:
    """NCCL's model of the NCCL ``version`` (default 2.28) in ``env``, bandwidths scaled by ``params``' calibration,
    NCCL's own pick or the algorithm ``algo`` (protocol ``proto``, NVLS ``nvls``) forced as --nccl-algo forces it;
    ``gpus_per_thread``: GPUs one host thread drives (nccl-tests -g)."""

    env: NcclEnv = DEFAULT_ENV
    version: str | None = None
    params: SimParams | None = None
    algo: str | None = None
    proto: str | None = None
    nvls: bool | None = None
    gpus_per_thread: int = 1

    @classmethod
    def of(cls, settings: NcclSettings, params: SimParams | None = None) -> NcclCostModel:
        """The model of a command's NCCL settings."""
        return cls(settings.env, settings.version, params, settings.algo, settings.proto, settings.nvls,
                   settings.gpus_per_thread)

    def bandwidth_scale(self, fabric: Topology, ranks: list[int]) -> float:
        """The calibration's link efficiency over the default one, for the link kind NCCL's rings use (1: none)."""
        if self.params is None:
            return 1.0
        link = analyse(fabric, ranks, self.version).ring.link
        kind_name = "nvlink" if link == "nvlink" else "pcie"
        return self.params.efficiency_of(kind_name) / DEFAULT_EFFICIENCY[kind_name]

    def predict(self, call: Call, fabric: Topology) -> Prediction:
        ranks, nbytes = list(call.ranks), call.sized_bytes
        p = predict(fabric, call.collective, ranks, nbytes, nccl_version=self.version, nccl_algo=self.algo,
                    proto=self.proto, nvls=self.nvls, root=call.root, gpus_per_thread=self.gpus_per_thread,
                    bandwidth_scale=self.bandwidth_scale(fabric, ranks), env=self.env)
        alg, bus = kind(p.collective).algbw_busbw(nbytes, p.time_s, len(ranks))
        return Prediction(call, p.time_s, alg, bus, p.detail.removeprefix("nccl "), "nccl", self.env.settings,
                          p.channels or 0)
