"""The DGX-1 whitepaper's figures 5 and 6 (ResNet-50, CNTK, FP32, NCCL 1.6.1, 8 x P100): DGX-1 (NVLink) vs an
8-GPU PCIe server, predicted from one single-GPU profile and one calibration per figure.

What is assumed, measured elsewhere, and fitted:
- profile (assumed): one P100 SXM2 runs ResNet-50 at 200 img/s at batch 64 (the figures' 1-GPU bar) and a
  step costs 30 ms + b x 4.53 ms (the fixed part stands for small-batch inefficiency: 121 img/s at batch 8);
  the PCIe server's P100 PCIe GPUs are slower by their FP32 rate (9.3 vs 10.6 TFLOP/s, from the catalog);
- link efficiencies of 2016 NCCL (from the whitepaper and a published NCCL article, not from the figures):
  NVLink rings "over 60 GB/s" of 80 -> 0.75; PCIe about 10 GB/s of 15.75 -> 0.63; across QPI "over 5 GB/s" of
  25.6 -> 0.2;
- exchange: CNTK 2016 all-reduces after backward (mode allreduce without overlap), ring, timed alpha-beta with
  NCCL 1.6's one ring per NVLink (the simulator's own ring choices would tie the figures to its version);
- fitted, per figure: ``comm_scale`` (one number) on that figure's two 8-GPU throughputs (NVLink and PCIe).
"""
from __future__ import annotations

from dataclasses import dataclass

from meshscale.predict.comm_fit import fit_comm_scale
from meshscale.predict.exchange_cost import Exchange, system_fabric
from meshscale.predict.profile import ComputeProfile, linear_profile
from meshscale.predict.scaling import profile_for
from meshscale.predict.step_time import per_rank_batch, predict_step
from meshscale.simulate.params import SimParams
from meshscale.topology import load_system

SYSTEMS = ("dgx1-p100", "pcie-8gpu-2socket")
MEASURED = {  # img/s on 8 GPUs: (NVLink, PCIe)
    "weak": (1513.0, 1096.0),    # figure 5: 64 images per GPU
    "strong": (863.0, 531.0),    # figure 6: 64 images in all
}
RESNET50_PARAMS = 25_557_032
FIXED_S = 0.030


def p100_profile() -> ComputeProfile:
    """The assumed single-P100 ResNet-50 profile: 200 img/s at batch 64, 30 ms fixed per step."""
    per_sample = (64 / 200 - FIXED_S) / 64
    return linear_profile(per_sample, FIXED_S, gpu_model="Tesla P100-SXM2-16GB", gpu_flops=10.6e12,
                          source="assumed P100 ResNet-50 profile (200 img/s at batch 64, 30 ms fixed)")


def nccl2016_params() -> SimParams:
    """Simulator parameters with link efficiencies from published 2016 NCCL measurements."""
    params = SimParams(source="published NCCL 1.6 figures")
    params.efficiency.update({"nvlink": 0.75, "pcie": 0.63, "qpi": 0.2})
    return params


@dataclass
class Figure:
    """One reproduced figure: the fitted comm_scale and the 8-GPU (NVLink, PCIe) throughputs."""

    mode: str
    comm_scale: float
    predicted: tuple[float, float]
    measured: tuple[float, float]

    @property
    def errors(self) -> tuple[float, float]:
        return tuple(p / m - 1 for p, m in zip(self.predicted, self.measured))

    @property
    def ratio(self) -> float:
        return self.predicted[0] / self.predicted[1]


def reproduce(mode: str, gpus: int = 8) -> Figure:
    """Fit comm_scale on figure 5 ("weak") or 6 ("strong") and return its prediction."""
    weak = mode == "weak"
    params = nccl2016_params()
    cases = []
    for name in SYSTEMS:
        topo = load_system(name)
        profile = profile_for(topo, p100_profile(), None)
        cases.append((profile, Exchange(system_fabric(topo, gpus), "ring", 1.0, params, intra="alpha-beta")))
    batch = per_rank_batch(gpus, 64, weak)

    def predict(scale: float) -> list[float]:
        out = []
        for profile, exchange in cases:
            exchange.comm_scale = scale
            out.append(predict_step(profile, exchange, RESNET50_PARAMS * 4, batch, "allreduce",
                                    overlap=False).throughput_samples_per_s)
        return out

    scale = fit_comm_scale(predict, list(MEASURED[mode]))
    return Figure(mode, scale, tuple(predict(scale)), MEASURED[mode])
