"""How a training framework exchanges gradients: which all-reduce calls it makes per step, whether they overlap
the backward pass, what travels on the wire, and which NCCL runs them. These are descriptions of the framework,
each with its source, so a prediction for a framework's setting is described, not fitted.

- ddp: PyTorch DistributedDataParallel. After the first step DDP rebuilds its buckets in the order the
  gradients became ready (whole tensors; a bucket closes once it holds at least its limit: 1 MiB for the first,
  then ``bucket_cap_mb`` = 25 MiB, so a tensor over the limit closes the bucket it joins); each bucket is
  all-reduced, in order, once all its gradients are complete, overlapped with the rest of backward. The wire
  carries the gradients' dtype (fp32 parameters under autocast: fp32).
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
from meshscale.predict.gradient_tensors import GradientTensor

WIRE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
PREDICTED_MODES = ("ddp", "allreduce", "ps-sync")  # `meshscale train`'s modes that this model times


def check_mode(mode: str) -> None:
    """A one-line error for a mode this model cannot time."""
    if mode == "ps-async":
        raise MeshscaleError("--mode ps-async is not modelled (its steps run on stale parameters without waiting "
                             "for the exchange); predict --mode ps-sync as the bound")
    check_choice(mode, PREDICTED_MODES, "mode")


@dataclass(frozen=True)
class Bucket:
    """One all-reduce of a step: ``nbytes`` of gradients, startable once ``ready_share`` of backward is done."""

    nbytes: float
    ready_share: float


@dataclass(frozen=True)
class Framework:
    """One framework's gradient exchange. ``bucket_bytes`` > 0: fused buckets of that size (the first one
    ``first_bucket_bytes``), of whole tensors when ``whole_tensors`` and the tensors are known (else cut at the
    byte); 0: one all-reduce per gradient tensor, tensors of at most ``pack_bytes`` packed into one extra buffer."""

    name: str
    overlap: bool                 # buckets start while backward still runs
    bucket_bytes: int
    first_bucket_bytes: int
    pack_bytes: int
    wire: str                     # what each gradient value travels as (WIRE_BYTES)
    nccl_version: str | None      # None: the NCCL the collective model assumes by default
    mode: str                     # the `meshscale train --mode` that exchanges this way ("" if none does)
    source: str
    whole_tensors: bool = False

    def exchange(self, tensors: list[GradientTensor], wire: str | None = None) -> list[Bucket]:
        """The all-reduces of one step in the order they are issued, each with the share of backward after
        which it can start: with overlap, when all its gradients are complete (``ready_order``); without,
        after backward."""
        value_bytes = WIRE_BYTES[wire or self.wire]
        if not self.overlap:
            return [Bucket(s, 1.0) for s in self.unbucketed_sizes([t.elements * value_bytes for t in reversed(tensors)])]
        ordered = ready_order(tensors)
        sizes = [t.elements * value_bytes for t in ordered]
        if not self.bucket_bytes:
            chunks = self.unbucketed_sizes(sizes)
        elif self.whole_tensors and all(t.ready_share is not None for t in tensors):
            chunks = whole_tensor_buckets(sizes, self.first_bucket_bytes, self.bucket_bytes)
        else:
            chunks = buckets(sum(sizes), self.first_bucket_bytes, self.bucket_bytes)
        return [Bucket(nbytes, share) for nbytes, share in zip(chunks, ready_shares(ordered, sizes, chunks))]

    def unbucketed_sizes(self, sizes: list[float]) -> list[float]:
        """One all-reduce per tensor over ``pack_bytes``, and one for the small ones packed together."""
        packed = sum(s for s in sizes if s <= self.pack_bytes)
        return [float(s) for s in sizes if s > self.pack_bytes] + ([float(packed)] if packed else [])


def ready_order(tensors: list[GradientTensor]) -> list[GradientTensor]:
    """Gradients in the order backward completes them: by their ready share when every one is known (ties:
    later parameters first), else in reverse parameter order (the last layers first)."""
    backwards = list(reversed(tensors))
    if any(t.ready_share is None for t in tensors):
        return backwards
    return sorted(backwards, key=lambda t: t.ready_share)


def ready_shares(ordered: list[GradientTensor], sizes: list[float], chunks: list[float]) -> list[float]:
    """When each chunk (consecutive bytes of ``ordered``, whose tensors are ``sizes`` bytes) can start: when
    its last tensor is complete; for gradients of unknown readiness, when backward has done the chunk's share
    of all the bytes (a byte-proportional guess)."""
    total, known = sum(sizes), all(t.ready_share is not None for t in ordered)
    out, end, tensor, tensor_end = [], 0.0, 0, sizes[0] if sizes else 0.0
    for nbytes in chunks:
        end += nbytes
        while tensor < len(sizes) - 1 and tensor_end < end * (1 - 1e-12):
            tensor += 1
            tensor_end += sizes[tensor]
        out.append(ordered[tensor].ready_share if known else min(1.0, end / total))
    return out


def whole_tensor_buckets(sizes: list[float], first_bytes: int, cap_bytes: int) -> list[float]:
    """DDP's buckets of whole tensors in order: a bucket closes once it holds at least its limit (``first_bytes``
    for the first, ``cap_bytes`` after), so a tensor over the limit closes the bucket it joins."""
    out, open_bytes, limit = [], 0.0, first_bytes
    for nbytes in sizes:
        open_bytes += nbytes
        if open_bytes >= limit:
            out.append(open_bytes)
            open_bytes, limit = 0.0, cap_bytes
    return out + ([open_bytes] if open_bytes else [])


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
                     "first bucket 1 MiB, buckets rebuilt in gradient-ready order after the first step; "
                     "https://pytorch.org/docs/stable/notes/ddp.html)", whole_tensors=True),
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
