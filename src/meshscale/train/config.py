"""What a training run is: plain dataclasses, one per concern, shared by the CLI, `meshscale scale` and the rank
workers. A field that is a command-line option says so once, here (`option`): its flag and help text; the CLI
builds `meshscale train` and `meshscale scale` from these declarations."""
from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Optional

from meshscale.options import (BATCH, CHANNELS_LAST, CHECKPOINTING, CP, CUDA_GRAPH, DP, EP, FP8_RECIPE, FSDP,
                               MICRO_BATCHES, MODEL,
                               MODE, PP, PP_SCHEDULE, PRECISION, SEQ_LEN, TP, OptionField, option)
from meshscale.options import option_fields as _option_fields
from meshscale.safe_io import check_output_file
from meshscale.validation import Range

if TYPE_CHECKING:
    from meshscale.models.layout import ParallelLayout

TRAIN_MODES = ("ddp", "allreduce", "ps-sync", "ps-async")


# the ranges of the options (a step, a sample, a megabyte: anything but a positive finite amount is a typo)
_POSITIVE = Range(0, 1e6, lo_open=True)
_STEPS = Range(1, 10_000_000, integer=True)
_STEPS_OR_ZERO = Range(0, 10_000_000, integer=True)
_BATCH = Range(1, 1 << 16, integer=True, optional=True)


@dataclass
class OptimizerOptions:
    """The optimizer and the large-batch recipe (Goyal et al.): lr = base_lr x global batch / ref_batch, warm-up."""

    name: Optional[str] = option(None, "--optimizer", help="sgd or adamw (default: the model's: sgd for resnets, "
                                 "adamw otherwise)")
    base_lr: Optional[float] = option(None, "--lr", help="base learning rate per --ref-batch samples (scaled "
                                      "linearly; default: the model's)", check=Range(0, 100, lo_open=True, optional=True))
    ref_batch: int = option(256, "--ref-batch", help="batch the base learning rate is for", check=_BATCH)
    warmup_steps: int = option(0, "--lr-warmup-steps", help="linear learning-rate warm-up (Goyal et al.)",
                               check=_STEPS_OR_ZERO)
    momentum: float = 0.9
    weight_decay: float = 5e-5


@dataclass
class DdpOptions:
    """torch DistributedDataParallel."""

    bucket_cap_mb: float = option(25.0, "--bucket-cap-mb", help="ddp: gradient bucket size", check=_POSITIVE)
    bucket_view: bool = option(False, "--bucket-view", help="ddp: gradient_as_bucket_view")
    static_graph: bool = option(False, "--static-graph", help="ddp: static_graph")


@dataclass
class AllreduceOptions:
    """Fused buckets all-reduced while backward runs (train/exchange.py)."""

    fusion_mb: float = option(64.0, "--fusion-mb", help="allreduce: fusion buffer size", check=_POSITIVE)
    compression: str = option("none", "--compression", help="allreduce: none, bf16 or fp16 on the wire")
    collective: str = option("native", "--collective", help="allreduce: native, or schedule[:ALGO] (meshscale "
                             "schedule executor, e.g. schedule:ring)")


@dataclass
class PsOptions:
    """The parameter server modes."""

    max_staleness: int = option(0, "--max-staleness", help="ps-async: parameters may be this many steps old",
                                check=Range(0, 10_000, integer=True))
    servers: int = option(0, "--ps-servers", help="ps-*: this many dedicated server ranks (the last ones; "
                          "default 0: sharded over all ranks)", check=Range(0, 1 << 16, integer=True))


@dataclass
class SpeedOptions:
    """Precision, memory format and compilation."""

    precision: str = PRECISION.field("fp32")
    fp8_recipe: Optional[str] = FP8_RECIPE.field(None, "default tensorwise")
    channels_last: bool = CHANNELS_LAST.field(False)
    compile: Optional[str] = option(None, "--compile", help="torch.compile mode: default, reduce-overhead "
                                    "(CUDA graphs), max-autotune")
    cuda_graph: bool = CUDA_GRAPH.field(False)


_DEGREE = Range(1, 1 << 16, integer=True)


@dataclass
class LayoutOptions:
    """How a transformer is split over the ranks (models/layout.py; transformer models only). Left at 1 with
    more than one rank, the ranks shard the model (fsdp = the world size)."""

    dp: int = DP.field(1)
    fsdp: int = FSDP.field(1)
    tp: int = TP.field(1)
    pp: int = PP.field(1)
    cp: int = CP.field(1)
    ep: int = EP.field(1)
    pp_schedule: str = PP_SCHEDULE.field("1f1b")
    micro_batches: Optional[int] = MICRO_BATCHES.field(None)
    checkpointing: str = CHECKPOINTING.field("none")
    seq_len: Optional[int] = SEQ_LEN.field(None)
    stages_per_rank: int = 2         # interleaved-1f1b: virtual stages per rank

    def parallel_layout(self) -> "ParallelLayout":
        from meshscale.models.layout import ParallelLayout, check_degrees
        check_degrees({"dp": self.dp, "fsdp": self.fsdp, "tp": self.tp, "pp": self.pp, "cp": self.cp})
        return ParallelLayout(dp=self.dp, fsdp=self.fsdp, tp=self.tp, pp=self.pp, cp=self.cp, ep=self.ep,
                              pp_schedule=self.pp_schedule, micro_batches=self.micro_batches or self.pp,
                              stages_per_rank=self.stages_per_rank)

    @property
    def given(self) -> bool:
        """Whether any degree was set (else a transformer run shards over all ranks)."""
        return any(n > 1 for n in (self.dp, self.fsdp, self.tp, self.pp, self.cp))   # ep borrows their ranks


@dataclass
class CheckpointOptions:
    dir: Optional[str] = option(None, "--checkpoint-dir", help="save checkpoints here", train_only=True)
    every: int = option(0, "--checkpoint-every", help="steps between checkpoints (0: at the end)", train_only=True,
                       check=_STEPS_OR_ZERO)
    resume: bool = option(False, "--resume", help="continue from the latest checkpoint in --checkpoint-dir",
                          train_only=True)


@dataclass
class LogOptions:
    """Where rank 0 writes its per-step rows."""

    jsonl: Optional[str] = option(None, "--log", help="JSONL file, one line per step", train_only=True)
    tensorboard: Optional[str] = option(None, "--tensorboard", help="TensorBoard log folder (if installed)",
                                        train_only=True)
    trace: Optional[str] = option(None, "--trace", help="Chrome trace (.json) of a few steps of rank 0: data, forward, "
                                  "backward, each collective, optimizer", train_only=True,
                                  check=lambda value, where: check_output_file(value, where, (".json",)))
    progress: bool = False           # rich progress bar on rank 0


@dataclass
class DebugOptions:
    """For the tests."""

    verify_sync: bool = False        # after every step, compare every rank's parameters with rank 0's
    return_params: bool = False      # rank 0 returns the final flat parameters
    fault_step: Optional[int] = None  # fault injection: the last rank exits abruptly at this step
    fp8_emulate: bool = False        # --precision fp8 by torchao's emulation of the fp8 GEMMs (on CPUs)


@dataclass
class TrainConfig:
    model: str = MODEL.field("small-cnn")
    data: str = option("synthetic", "--data", help="synthetic, digits (scikit-learn), a folder of images "
                       "(ImageFolder layout) or a token file (.npy/.bin)")
    eval_data: Optional[str] = option(None, "--eval", help="evaluate on this data at the end (e.g. digits-test)",
                                      train_only=True)
    image_size: Optional[int] = option(None, "--image-size", help="side of the images (default: the model's)",
                                      check=Range(4, 4096, integer=True, optional=True))
    mode: str = MODE.field("ddp")
    world: int = 1
    device: str = "cpu"              # cpu (Gloo) or cuda (NCCL)
    batch_per_rank: int = BATCH.field(32)
    steps: int = option(50, "--steps", help="training steps (in all, also when resuming)", check=_STEPS)
    timing_warmup: int = option(5, "--timing-warmup", help="steps left out of the throughput figure",
                               check=_STEPS_OR_ZERO)
    comm_breakdown_steps: int = option(2, "--comm-breakdown-steps", help="transformers: warm-up steps run under "
                                       "torch.profiler for each dimension's communication time, its exposed part "
                                       "and the pipeline bubble (0: none; needs --timing)", check=_STEPS_OR_ZERO)
    timing: bool = option(True, "--timing/--no-timing", help="per-step times and the compute / comm / data split, "
                          "from clock marks read once the next step is queued (--no-timing: no marks)")
    seed: int = option(0, "--seed", help="initial weights and data order", check=Range(0, 2**63 - 1, integer=True))
    deterministic: bool = option(False, "--deterministic", help="deterministic kernels (exact resume on GPUs)")
    timeout_s: float = option(300.0, "--timeout-s", help="seconds any collective may take before the run stops",
                              check=Range(0, 7 * 86400, lo_open=True))
    optimizer: OptimizerOptions = field(default_factory=OptimizerOptions)
    ddp: DdpOptions = field(default_factory=DdpOptions)
    allreduce: AllreduceOptions = field(default_factory=AllreduceOptions)
    ps: PsOptions = field(default_factory=PsOptions)
    speed: SpeedOptions = field(default_factory=SpeedOptions)
    layout: LayoutOptions = field(default_factory=LayoutOptions)
    checkpoint: CheckpointOptions = field(default_factory=CheckpointOptions)
    logging: LogOptions = field(default_factory=LogOptions)
    debug: DebugOptions = field(default_factory=DebugOptions)

    @property
    def workers(self) -> int:
        """Ranks that train (all but the dedicated parameter servers)."""
        return self.world - self.ps.servers

    @property
    def is_transformer(self) -> bool:
        """A transformer preset or config.json: trained under a parallel layout (train/parallel). The registry's
        GPT-2 shapes (gpt-tiny, gpt-small, gpt-medium) are transformers too, trained in the data-parallel modes."""
        from meshscale.models.transformer import is_transformer_model
        return is_transformer_model(self.model)

    @property
    def global_batch(self) -> int:
        if self.is_transformer:  # --batch is per data-parallel rank: tp, pp and cp ranks share their samples
            return self.batch_per_rank * self.layout.parallel_layout().data_parallel
        return self.batch_per_rank * self.workers


def option_fields(cls: type = None, prefix: tuple[str, ...] = ()) -> Iterator[OptionField]:
    """Every TrainConfig option (`meshscale.options.option_fields`)."""
    return _option_fields(cls or TrainConfig, prefix)


def config_from_options(values: dict[tuple[str, ...], Any], **top: Any) -> TrainConfig:
    """A TrainConfig from option values keyed by path (as `option_fields` gives them) and top-level keywords."""
    groups: dict[str, dict[str, Any]] = {}
    for path, value in values.items():
        if len(path) == 1:
            top[path[0]] = value
        else:
            groups.setdefault(path[0], {})[path[1]] = value
    hints = typing.get_type_hints(TrainConfig)
    return TrainConfig(**top, **{name: hints[name](**kw) for name, kw in groups.items()})
