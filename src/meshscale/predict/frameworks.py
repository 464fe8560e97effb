"""How a training framework exchanges gradients: which all-reduce calls it makes per step, whether they overlap
the backward pass, what travels on the wire, and which NCCL runs them. These are descriptions of the framework,
each with its source, so a prediction for a framework's setting is described, not fitted.

- ddp: PyTorch DistributedDataParallel. Gradients fill buckets in reverse order of the parameters (a 1 MiB
  first bucket, then ``bucket_cap_mb`` = 25 MiB); each bucket is all-reduced as soon as it is full, overlapped
  with the rest of backward. The wire carries the gradients' dtype (fp32 parameters under autocast: fp32).
- horovod: tensor fusion: ready gradients are packed into 64 MiB fusion buffers (HOROVOD_FUSION_THRESHOLD),
  each all-reduced while backward goes on. `meshscale train --mode allreduce` does the same (--fusion-mb 64).
- cntk-2016: CNTK's SimpleDistGradAggregator, called by the SGD loop after the whole backward pass: gradient
  matrices of at most 32 KiB (DEFAULT_PACK_THRESHOLD_SIZE_IN_KB) are copied into one contiguous buffer, and
  NcclComm::AllReduce issues one ncclAllReduce per remaining matrix and one for the packed buffer, in fp32
  (the DGX-1 whitepaper's runs: gradbits=32), on NCCL 1.6.1 (rings only), then waits for them all.
"""
from __future__ import annotations

from dataclasses import dataclass

from meshscale.errors import MeshscaleError, check_choice

WIRE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
MODES = ("ddp", "allreduce", "ps-sync")  # `meshscale train`'s modes that this model times


def check_mode(mode: str) -> None:
    """A one-line error for a mode this model cannot time."""
    if mode == "ps-async":
        raise MeshscaleError("--mode ps-async is not modelled (its steps run on stale parameters without waiting "
                             "for the exchange); predict --mode ps-sync as the bound")
    check_choice(mode, MODES, "mode")


@dataclass(frozen=True)
class Framework:
    """One framework's gradient exchange. ``bucket_bytes`` > 0: fused buckets of that size (the first one
    ``first_bucket_bytes``); 0: one all-reduce per gradient tensor, tensors of at most ``pack_bytes`` packed
    into one extra buffer."""

    name: str
    overlap: bool                 # buckets start while backward still runs
    bucket_bytes: int
    first_bucket_bytes: int
    pack_bytes: int
    wire: str                     # what each gradient value travels as (WIRE_BYTES)
    nccl_version: str | None      # None: the NCCL the collective model assumes by default
    mode: str                     # the `meshscale train --mode` that exchanges this way ("" if none does)
    source: str

    def exchange_sizes(self, tensor_params: list[int], wire: str | None = None) -> list[float]:
        """Bytes of each all-reduce of one step, in the order they are issued (gradients become ready from the
        last layer back, so buckets fill in reverse order of ``tensor_params``)."""
        value_bytes = WIRE_BYTES[wire or self.wire]
        sizes = [n * value_bytes for n in reversed(tensor_params)]
        if self.bucket_bytes:
            return buckets(sum(sizes), self.first_bucket_bytes, self.bucket_bytes)
        packed = sum(s for s in sizes if s <= self.pack_bytes)
        return [float(s) for s in sizes if s > self.pack_bytes] + ([float(packed)] if packed else [])


def buckets(total_bytes: float, first_bytes: int, cap_bytes: int) -> list[float]:
    """Fused bucket sizes in the order backward fills them: a first one of ``first_bytes``, then full ones of
    ``cap_bytes``, then the rest."""
    out, left, size = [], float(total_bytes), first_bytes
    while left > 0:
        out.append(min(size, left))
        left -= out[-1]
        size = cap_bytes
    return out


FRAMEWORKS = {
    "ddp": Framework("ddp", True, 25 << 20, 1 << 20, 0, "fp32", None, "ddp",
                     "PyTorch DistributedDataParallel (torch.nn.parallel.DistributedDataParallel: bucket_cap_mb=25, "
                     "first bucket 1 MiB; https://pytorch.org/docs/stable/notes/ddp.html)"),
    "horovod": Framework("horovod", True, 64 << 20, 64 << 20, 0, "fp32", None, "allreduce",
                         "Horovod tensor fusion (HOROVOD_FUSION_THRESHOLD 64 MiB; "
                         "https://horovod.readthedocs.io/en/stable/tensor-fusion_include.html)"),
    "cntk-2016": Framework("cntk-2016", False, 0, 0, 32 << 10, "fp32", "1.6", "",
                           "Microsoft CNTK, Source/SGDLib/SimpleDistGradAggregator.h and Source/Math/NcclComm.h "
                           "(https://github.com/microsoft/CNTK); NVIDIA DGX-1 System Architecture whitepaper, figures 5 "
                           "and 6: DGX container 16.12, NCCL 1.6.1, gradbits=32"),
}
MODE_FRAMEWORK = {f.mode: name for name, f in FRAMEWORKS.items() if f.mode}  # ddp -> ddp, allreduce -> horovod



def resolve_framework(mode: str | None, framework: str | None) -> tuple[str, Framework | None]:
    """(train mode, framework) from --mode and --framework: the framework defaults from the mode (ddp -> ddp,
    allreduce -> horovod); a framework given alone names its own exchange; a mode whose exchange another
    framework contradicts, or a parameter server with a framework, is a one-line error. ps-sync has no
    all-reduce framework (None)."""
    if framework is not None:
        check_choice(framework, FRAMEWORKS, "framework")
    if mode == "ps-sync":
        if framework is not None:
            raise MeshscaleError(f"--mode ps-sync exchanges through a parameter server; --framework {framework} "
                                 "describes an all-reduce: give one of them")
        return mode, None
    if framework is None:
        mode = mode or "ddp"
        check_mode(mode)
        return mode, FRAMEWORKS[MODE_FRAMEWORK[mode]]
    chosen = FRAMEWORKS[framework]
    if mode is not None and MODE_FRAMEWORK.get(mode) != framework:
        raise MeshscaleError(f"--mode {mode} exchanges as --framework {MODE_FRAMEWORK.get(mode, '?')}, not "
                             f"{framework}; give --framework alone to predict {framework}")
    return chosen.mode or "allreduce", chosen
