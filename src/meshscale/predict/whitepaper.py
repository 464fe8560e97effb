"""The DGX-1 whitepaper's figures 5 and 6 (ResNet-50, CNTK, FP32, NCCL 1.6.1, 8 x P100): DGX-1 (NVLink) vs an
8-GPU PCIe server, predicted by the same model as `meshscale predict --model resnet50 --compare nvlink-pcie
--framework cntk-2016`, with nothing fitted to the figures. The setting is described:
- compute: the documented P100 ResNet-50 profile (200 img/s at batch 64, the figures' one-GPU bar; the fixed
  per-step cost from TensorFlow's published P100 benchmarks), the PCIe server's P100 PCIe slower by the FP32
  rates at the base clocks, the clock each holds under its power cap at full load (1328 vs 1126 MHz;
  `meshscale.predict.profile.sustained_ratio`);
- exchange: CNTK 2016 (`meshscale.predict.frameworks`): after backward, one fp32 all-reduce per gradient
  matrix over 32 KiB and one for the packed rest, on NCCL 1.6 at its published link rates, timed by the
  collective model on each system's topology.
"""
from __future__ import annotations

from dataclasses import dataclass

from meshscale.predict.question import PredictRequest
from meshscale.predict.sweep import predict_rows

SYSTEMS = ("dgx1-p100", "pcie-8gpu-2socket")
MEASURED = {  # img/s on 8 GPUs: (NVLink, PCIe)
    "weak": (1513.0, 1096.0),    # figure 5: 64 images per GPU
    "strong": (863.0, 531.0),    # figure 6: 64 images in all
}
FRAMEWORK = "cntk-2016"


@dataclass
class Figure:
    """One reproduced figure: the 8-GPU (NVLink, PCIe) throughputs predicted and measured, and the per-step
    compute, exchange and exposed exchange seconds behind the prediction."""

    mode: str
    predicted: tuple[float, float]
    measured: tuple[float, float]
    compute_s: tuple[float, float]
    exchange_s: tuple[float, float]
    exposed_s: tuple[float, float]

    @property
    def errors(self) -> tuple[float, float]:
        return tuple(p / m - 1 for p, m in zip(self.predicted, self.measured))

    @property
    def ratio(self) -> float:
        return self.predicted[0] / self.predicted[1]

    @property
    def measured_ratio(self) -> float:
        return self.measured[0] / self.measured[1]


def reproduce(mode: str, gpus: int = 8) -> Figure:
    """Figure 5 ("weak") or 6 ("strong") on ``gpus`` GPUs of each system, as `meshscale predict` prints it."""
    weak = mode == "weak"
    rows, _, _ = predict_rows(PredictRequest(model="resnet50", gpus=(gpus,), batch=64,
                                             global_batch=None if weak else 64, framework=FRAMEWORK,
                                             compare="nvlink-pcie"))
    by_system = {r["variant"]: r for r in rows}
    pick = lambda key: tuple(by_system[s][key] for s in SYSTEMS)  # noqa: E731
    return Figure(mode, pick("throughput_samples_per_s"), MEASURED[mode], pick("compute_s"), pick("comm_s"),
                  pick("comm_exposed_s"))
