"""What `meshscale predict` asks, declared once: `PredictRequest`, whose fields are predict's options (their flags,
help and checks, `meshscale.options.option`). The CLI is built from it; the predictor (`predict.request`) answers
it; `validate --training` states each corpus run as one. Light to import: the command's help needs it."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

from meshscale.options import (BATCH, CHANNELS_LAST, CHECKPOINTING, CP, CUDA_GRAPH, DP, EP, FP8_RECIPE, FSDP,
                               MICRO_BATCHES, MODE, MODEL, PP, PP_SCHEDULE, PRECISION, SEQ_LEN, TP, option)
from meshscale.topology.fabric import PLACEMENT_HELP
from meshscale.topology.limits import CLUSTER_RANGES
from meshscale.validation import Range, count_list, word

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


_COUNTS = counts_check(1, 1 << 20)


@dataclass(frozen=True, kw_only=True)
class PredictRequest:
    """A prediction as the command line (or a corpus row) states it: what trains, in which layout, where, how
    its replicas exchange gradients, and what calibrates it. Each option is declared here, once."""

    model: Optional[str] = MODEL.field(None, "on devices without a datasheet (CPU workers) with its measured "
                                                 "--profile")
    system: str = option("dgx1-p100", "--system", "-s", help="catalog system or file (a node for --nodes), or a "
                         "cluster file")
    gpus: Optional[tuple[int, ...]] = option(None, "--gpus", help="GPU count; a list (1,2,4,8) sweeps (default: "
                                             "powers of two up to one node); beyond one node, whole nodes", check=_COUNTS,
                                             parse=_counts, cli_type=str)
    nodes: Optional[tuple[int, ...]] = option(None, "--nodes", help="node count of a cluster; a list sweeps",
                                              check=_COUNTS, parse=_counts, cli_type=str)
    gpu: Optional[str] = option(None, "--gpu", help="the GPU as sold, in place of the system's: a SKU ('H100 SXM', "
                                "'H100 96GB HBM2e' (capped at 500 W), 'H800 SXM', 'A100 40GB PCIe', 'V100 32GB "
                                "SXM2', ...) or its NVML name ('NVIDIA H100 80GB HBM3'): its datasheet (rates, "
                                "memory, power limit) prices the kernels")
    link: Optional[str] = option(None, "--link", help="cluster network: edr, hdr, ndr, 10gbe, ... or a stated "
                                 "rate such as 25GB/s,5us (default: the node's own NICs')")
    nics: Optional[int] = option(None, "--nics", help="ports per node (default: the node's own NICs)",
                                 check=CLUSTER_RANGES["nics"])
    gpudirect: Optional[bool] = option(None, "--gpudirect/--no-gpudirect", help="GPUDirect RDMA across nodes "
                                       "(default on)")
    network: Optional[str] = option(None, "--network", help="cluster network: fat-tree (default) or rail")
    oversubscription: Optional[float] = option(None, "--oversubscription", help="leaf down-links per up-link, k "
                                               "for k:1 (default 1)", check=CLUSTER_RANGES["oversubscription"])
    placement: Optional[str] = option(None, "--placement", help=PLACEMENT_HELP)
    batch: Optional[int] = BATCH.field(None, f"default {IMAGE_BATCH} images, {SEQUENCE_BATCH} sequence")
    global_batch: Optional[int] = option(None, "--global-batch", help="samples per step over all ranks: strong "
                                         "scaling over the sweep, or what --search splits",
                                         check=Range(1, 1 << 24, integer=True, optional=True))
    seq_len: Optional[int] = SEQ_LEN.field(None)
    precision: Optional[str] = PRECISION.field(None, "or tf32; default: the --profile's, else fp32 as train's. "
                                               "fp32 is PyTorch's default: matmuls in true FP32 unless "
                                               "torch.backends.cuda.matmul.allow_tf32 or "
                                               "set_float32_matmul_precision('high') is set, convolutions in TF32; "
                                               "tf32: fp32 tensors, matmuls on the TF32 tensor cores (what "
                                               "frameworks set for fp32 training)")
    checkpointing: str = CHECKPOINTING.field("none")
    channels_last: bool = CHANNELS_LAST.field(False)
    cuda_graph: bool = CUDA_GRAPH.field(False, "no host cost per op")
    attention: str = option("sdpa", "--attention", help="the attention kernel: sdpa (what PyTorch's SDPA picks: "
                            "cuDNN's on Hopper and later, else FlashAttention-2), flash, cudnn, or triton")
    dp: Optional[int] = DP.field(None)
    fsdp: Optional[int] = FSDP.field(None, "default: what the others leave")
    tp: Optional[int] = TP.field(None)
    pp: Optional[int] = PP.field(None)
    cp: Optional[int] = CP.field(None)
    ep: Optional[int] = EP.field(None)
    moe_imbalance: Optional[float] = option(None, "--moe-imbalance", help="with --ep: the busiest expert-parallel "
                                            "rank's routed tokens over the mean (default 1.0, balanced)",
                                            check=Range(1, 1000, optional=True))
    fp8_recipe: Optional[str] = FP8_RECIPE.field(None, "default tensorwise")
    pp_schedule: str = PP_SCHEDULE.field("1f1b")
    cp_attention: Optional[str] = option(None, "--cp-attention", help="context parallelism's attention: masked "
                                         "(meshscale train: K/V all-gathered, one masked SDPA), allgather or "
                                         "alltoall (torch's context_parallel ring, as torchtitan's rotate "
                                         "methods), p2p (Transformer Engine's ring; megatron's); default: the "
                                         "framework's")
    micro_batches: Optional[int] = MICRO_BATCHES.field(None)
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
    mode: Optional[str] = MODE.field(None, "predicted: ddp (default), allreduce and ps-sync")
    framework: Optional[str] = option(None, "--framework", help="the software that runs the step: eager "
                                      "(PyTorch eager: meshscale train, torchtitan; the default), compile "
                                      "(torch.compile per block: fused element-wise chains, fewer launches), "
                                      "megatron (Megatron-Core with Transformer Engine: fused kernels, TP comm "
                                      "overlap, distributed optimizer over --fsdp), zero1/zero2/zero3 (DeepSpeed "
                                      "ZeRO over --fsdp); whole replicas: ddp, horovod or cntk-2016 (their "
                                      "gradient exchange; default: the mode's)")
    wire: Optional[str] = option(None, "--wire", help="gradients on the wire: fp32, bf16 or fp16 (default: the "
                                 "framework's)")
    compare: Optional[str] = option(None, "--compare", help="sweep variants: algorithms | modes | frameworks | "
                                    "links | nvlink-pcie | SYS1,SYS2,...")
    measured: Optional[Path] = option(None, "--from", help="a measured `scale` result to predict beside")
    partition: Optional[str] = option(None, "--partition", help="train on slices of the GPUs: a MIG profile "
                                      "(3g.40gb) or a time-sliced share (1/4); --gpus counts slices", check=word)
    # how the framework that ran a corpus row built its step, beyond the options (None: meshscale train's)
    shape: Optional[TransformerConfig] = None
    autocast: Optional[bool] = None
    sharding: Optional[str] = None
    selective_policy: str = "matmuls"
    rotary: str = "pairs"
    stages_per_rank: Optional[int] = None   # interleaved 1F1B's virtual stages per rank (default 2)
    memory_recipe: str = "meshscale"   # how it holds memory (models/memory.RECIPES)

    @property
    def weak(self) -> bool:
        return self.global_batch is None or self.search

    @property
    def degrees(self) -> tuple[tuple[str, int], ...]:
        """The parallel degrees given, by name."""
        return tuple((k, getattr(self, k)) for k in ("dp", "fsdp", "tp", "pp", "cp") if getattr(self, k) is not None)


