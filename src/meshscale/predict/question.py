"""What `meshscale predict` asks, declared once: `PredictRequest`, whose fields are predict's options (their flags,
help and checks, `meshscale.options.option`). The CLI is built from it; the predictor (`predict.request`) answers
it; `validate --training` states each corpus run as one. Light to import: the command's help needs it."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

from meshscale.options import option
from meshscale.topology.limits import CLUSTER_RANGES
from meshscale.validation import Range, count_list

if TYPE_CHECKING:
    from meshscale.models.transformer import TransformerConfig
    from meshscale.simulate.nccl_env import NcclEnv

IMAGE_BATCH, SEQUENCE_BATCH = 64, 1   # --batch when not given: images, or sequences, per data-parallel rank


def counts_check(lo: int, hi: int):
    """A list of distinct counts, e.g. 1,2,4."""
    return lambda value, where: count_list(value, where, lo, hi)


def _counts(text: str) -> tuple[int, ...]:
    from meshscale.units import parse_ints
    return tuple(parse_ints(text, "--gpus/--nodes", minimum=1))


def _env(pairs: list[str]) -> NcclEnv | None:
    from meshscale.simulate.nccl_env import parse_nccl_env
    return parse_nccl_env(pairs) if pairs else None


_DEGREE = Range(1, 1 << 20, integer=True, optional=True)
_COUNTS = counts_check(1, 1 << 20)


@dataclass(frozen=True, kw_only=True)
class PredictRequest:
    """A prediction as the command line (or a corpus row) states it: what trains, in which layout, where, how
    its replicas exchange gradients, and what calibrates it. Each option is declared here, once."""

    model: Optional[str] = option(None, "--model", help="what trains: a ResNet (resnet18 ... resnet152), train's "
                                  "GPTs (gpt-small, gpt-medium), a transformer preset (llama-1b, llama3-8b, gpt3-175b, "
                                  "...) or a Hugging Face config.json; a model without per-layer kernels (small-cnn) "
                                  "with its measured --profile")
    system: str = option("dgx1-p100", "--system", "-s", help="catalog system or file (a node for --nodes), or a "
                         "cluster file")
    gpus: Optional[tuple[int, ...]] = option(None, "--gpus", help="GPU count; a list (1,2,4,8) sweeps (default "
                                             "1,2,4,8); beyond one node, whole nodes", check=_COUNTS,
                                             parse=_counts, cli_type=str)
    nodes: Optional[tuple[int, ...]] = option(None, "--nodes", help="node count of a cluster; a list sweeps",
                                              check=_COUNTS, parse=_counts, cli_type=str)
    gpu: Optional[str] = option(None, "--gpu", help="the GPU model in place of the system's (a SKU of the same "
                                "system, e.g. 'NVIDIA H100 80GB HBM3'): its datasheet prices the kernels")
    link: Optional[str] = option(None, "--link", help="cluster network: edr, hdr, ndr, 10gbe, ... or a stated "
                                 "rate such as 25GB/s,5us (default: the node's own NICs')")
    nics: Optional[int] = option(None, "--nics", help="ports per node (default: the node's own NICs)",
                                 check=CLUSTER_RANGES["nics"])
    gpudirect: Optional[bool] = option(None, "--gpudirect/--no-gpudirect", help="GPUDirect RDMA across nodes "
                                       "(default on)")
    network: Optional[str] = option(None, "--network", help="cluster network: fat-tree (default) or rail")
    oversubscription: Optional[float] = option(None, "--oversubscription", help="leaf down-links per up-link, k "
                                               "for k:1 (default 1)", check=CLUSTER_RANGES["oversubscription"])
    batch: Optional[int] = option(None, "--batch", help=f"samples per data-parallel rank per step (images; "
                                  f"sequences for transformers); default {IMAGE_BATCH} images, {SEQUENCE_BATCH} "
                                  "sequence", check=Range(1, 1 << 16, integer=True, optional=True))
    global_batch: Optional[int] = option(None, "--global-batch", help="samples per step over all ranks: strong "
                                         "scaling over the sweep, or what --search splits",
                                         check=Range(1, 1 << 24, integer=True, optional=True))
    seq_len: Optional[int] = option(None, "--seq-len", help="tokens per sequence (default: the model's, at most "
                                    "2048)", check=Range(1, 1 << 24, integer=True, optional=True))
    precision: Optional[str] = option(None, "--precision", help="fp32, bf16 or fp16, as train's (default: the "
                                      "--profile's, else fp32 as train's; PyTorch runs fp32 matmuls in true fp32, "
                                      "convolutions in TF32)")
    checkpointing: str = option("none", "--activation-checkpointing", help="none, selective or full")
    channels_last: bool = option(False, "--channels-last", help="images in channels-last memory format, as train's")
    cuda_graph: bool = option(False, "--cuda-graph", help="the step replayed as one CUDA graph, as train's: no "
                              "host cost per op")
    attention: str = option("sdpa", "--attention", help="the attention kernel: sdpa (what PyTorch's SDPA picks: "
                            "cuDNN's on Hopper and later, else FlashAttention-2), flash, cudnn, or triton")
    dp: Optional[int] = option(None, "--dp", help="replicated data-parallel degree", check=_DEGREE)
    fsdp: Optional[int] = option(None, "--fsdp", help="sharded data-parallel (FSDP2) degree (default: what the "
                                 "others leave, for transformers)", check=_DEGREE)
    tp: Optional[int] = option(None, "--tp", help="tensor-parallel degree", check=_DEGREE)
    pp: Optional[int] = option(None, "--pp", help="pipeline stages", check=_DEGREE)
    cp: Optional[int] = option(None, "--cp", help="context-parallel degree", check=_DEGREE)
    pp_schedule: str = option("1f1b", "--pp-schedule", help="gpipe, 1f1b or interleaved-1f1b")
    micro_batches: Optional[int] = option(None, "--micro-batches", help="micro-batches per step (default: the "
                                          "pipeline's stages)", check=_DEGREE)
    search: bool = option(False, "--search", help="rank every layout of the model on the GPUs at --global-batch")
    profile: Optional[Path] = option(None, "--profile", help="the job measured on one GPU (train "
                                     "--profile-batches --json): the replicas' step as measured, and it calibrates "
                                     "the kernels of layouts that split the model")
    p2p: Optional[Path] = option(None, "--p2p", help="calibrate the links from a `bench p2p --json` result")
    bench: Optional[Path] = option(None, "--bench", help="also fit them to a measured all_reduce (`bench "
                                   "collective --json`); with --nodes, the network")
    nccl_env: Optional[NcclEnv] = option(None, "--nccl-env", help="NCCL's environment as KEY=VALUE (repeatable), "
                                         "as sim's", parse=_env, cli_type=List[str])
    nccl_algo: Optional[str] = option(None, "--nccl-algo", help="NCCL's algorithm forced (NCCL_ALGO): ring, "
                                      "tree, ...; default NCCL's pick per size")
    mode: Optional[str] = option(None, "--mode", help="replicas' exchange as train --mode: ddp (default), "
                                 "allreduce (--framework horovod) or ps-sync (one parameter server)")
    framework: Optional[str] = option(None, "--framework", help="replicas' exchange: ddp, horovod or cntk-2016 "
                                      "(default: the mode's)")
    wire: Optional[str] = option(None, "--wire", help="gradients on the wire: fp32, bf16 or fp16 (default: the "
                                 "framework's)")
    compare: Optional[str] = option(None, "--compare", help="sweep variants: algorithms | modes | frameworks | "
                                    "links | nvlink-pcie | SYS1,SYS2,...")
    measured: Optional[Path] = option(None, "--from", help="a measured `scale` result to predict beside")
    partition: Optional[str] = option(None, "--partition", help="train on slices of the GPUs: a MIG profile "
                                      "(3g.40gb) or a time-sliced share (1/4); --gpus counts slices")
    # how the framework that ran a corpus row built its step, beyond the options (None: meshscale train's)
    shape: Optional[TransformerConfig] = None
    autocast: Optional[bool] = None
    sharding: Optional[str] = None
    selective_policy: str = "matmuls"
    rotary: str = "pairs"

    @property
    def weak(self) -> bool:
        return self.global_batch is None or self.search

    @property
    def degrees(self) -> tuple[tuple[str, int], ...]:
        """The parallel degrees given, by name."""
        return tuple((k, getattr(self, k)) for k in ("dp", "fsdp", "tp", "pp", "cp") if getattr(self, k) is not None)


