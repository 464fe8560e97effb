"""Command-line options declared once, beside the field they fill: `option` makes a dataclass field that is also
an option (its flags, help, the range the CLI enforces before anything starts, and how its text is parsed), and
`option_fields` lists a dataclass's options, nested groups included. `meshscale train`, `scale` (TrainConfig) and
`predict` (PredictRequest) are built from these declarations (`cli.declared`)."""
from __future__ import annotations

import sys
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Callable, Iterator

from meshscale.validation import Check


def option(default: Any, *flags: str, help: str = "", train_only: bool = False, check: Check | None = None,
           parse: Callable[[Any], Any] | None = None, cli_type: Any = None) -> Any:
    """A dataclass field that is also the command-line option ``flags`` (``train_only``: not offered by scale;
    ``check(value, flag)``: the range the CLI enforces before anything starts; ``parse``: the field's value from
    the option's (``cli_type``, the type the command line gives, when it differs from the field's))."""
    return field(default=default, metadata={"flags": flags, "help": help, "train_only": train_only, "check": check,
                                            "parse": parse, "cli_type": cli_type})


@dataclass(frozen=True)
class OptionField:
    """One command-line option of a dataclass: where its value goes (``path``), its type and declaration."""

    path: tuple[str, ...]            # e.g. ("ddp", "bucket_cap_mb")
    type: Any
    default: Any
    flags: tuple[str, ...]
    help: str
    train_only: bool
    check: Check | None = None
    parse: Callable[[Any], Any] | None = None

    @property
    def name(self) -> str:
        return "_".join(self.path)


def _hint(cls: type, name: str, annotation: Any) -> Any:
    """A field's annotation evaluated in its class's module; None where it names what the module imports only
    for type checking (a field that is no option, whose type the command line never needs)."""
    if not isinstance(annotation, str):
        return annotation
    module = sys.modules[cls.__module__].__dict__
    try:
        return eval(annotation, {**vars(typing), **module})  # noqa: S307 - the class's own annotation text
    except NameError:
        return None


def option_fields(cls: type, prefix: tuple[str, ...] = ()) -> Iterator[OptionField]:
    """Every field of ``cls`` declared with `option`, nested groups included, in declaration order."""
    for f in fields(cls):
        hint = f.metadata.get("cli_type") or _hint(cls, f.name, f.type)
        if hint is not None and is_dataclass(hint):
            yield from option_fields(hint, prefix + (f.name,))
        elif "flags" in f.metadata:
            yield OptionField(prefix + (f.name,), hint, f.default, f.metadata["flags"], f.metadata["help"],
                              f.metadata["train_only"], f.metadata.get("check"), f.metadata.get("parse"))


@dataclass(frozen=True)
class Declared:
    """An option two commands share, with one meaning: its flags, help and check, declared once here
    (`meshscale train` and `meshscale predict` both take a batch, a layout's degrees, a precision ...)."""

    flags: tuple[str, ...]
    help: str
    check: Check | None = None

    def field(self, default: Any, also: str = "") -> Any:
        """The dataclass field of this option, at ``default`` (``also``: what this command adds to the help)."""
        return option(default, *self.flags, help=self.help + (f"; {also}" if also else ""), check=self.check)


def _range(lo: int, hi: int) -> Check:
    from meshscale.validation import Range
    return Range(lo, hi, integer=True, optional=True)


_DEGREE = _range(1, 1 << 20)
# The models train and predict know by name: meshscale.models.registry.MODELS, then the transformer presets
# (models/presets.yaml). Kept here because help is built without importing the models; a test holds them equal.
MODEL_NAMES = ("resnet50", "resnet18", "small-cnn", "gpt-tiny", "gpt-small", "gpt-medium")
PRESET_NAMES = ("llama-tiny", "llama-1b", "llama3-8b", "llama3-70b", "llama3-405b", "llama2-7b", "llama2-13b",
                "llama2-70b", "gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt3-175b", "moe-tiny",
                "mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "gpt-oss-120b",
                "gpt-oss-20b")
MODEL = Declared(("--model",), f"what trains: {', '.join(MODEL_NAMES)}, a transformer preset "
                 f"({', '.join(PRESET_NAMES)}) or a Hugging Face config.json")
BATCH = Declared(("--batch",), "samples per data-parallel rank per step (images; sequences for transformers)",
                 _range(1, 1 << 16))
PRECISION = Declared(("--precision",), "fp32, bf16 (autocast), fp16 (autocast + loss scaling) or fp8 (torchao's "
                     "float8 linears, the rest in bf16; GPUs with fp8 tensor cores)")
FP8_RECIPE = Declared(("--fp8-recipe",), "--precision fp8's scaling (torchao float8): tensorwise (one scale per "
                      "tensor, float8 all-gather under FSDP) or rowwise (one per row, extra casts)")
EP = Declared(("--ep",), "transformers with experts: expert-parallel degree (borrows the data-parallel ranks; "
              "divides the experts)", _DEGREE)
MODE = Declared(("--mode",), "how replicas exchange gradients: ddp, allreduce (fused buckets, as Horovod), ps-sync "
                "or ps-async (parameter servers)")
CHANNELS_LAST = Declared(("--channels-last",), "channels-last memory format (images)")
CUDA_GRAPH = Declared(("--cuda-graph",), "the whole step (forward, backward, all-reduce, optimizer) as one CUDA "
                      "graph (GPUs; ddp/allreduce)")
DP = Declared(("--dp",), "replicated data-parallel degree (for transformers FSDP2's hybrid mode)", _DEGREE)
FSDP = Declared(("--fsdp",), "transformers: sharded data-parallel degree (FSDP2)", _DEGREE)
TP = Declared(("--tp",), "transformers: tensor (and sequence) parallel degree", _DEGREE)
PP = Declared(("--pp",), "transformers: pipeline stages", _DEGREE)
CP = Declared(("--cp",), "transformers: context-parallel degree (the sequence split)", _DEGREE)
PP_SCHEDULE = Declared(("--pp-schedule",), "gpipe, 1f1b or interleaved-1f1b")
MICRO_BATCHES = Declared(("--micro-batches",), "pipeline micro-batches per step (>= --pp; default: the pipeline's "
                         "stages)", _DEGREE)
CHECKPOINTING = Declared(("--activation-checkpointing",), "none, selective (keep matmul and attention outputs, "
                         "recompute the rest) or full (recompute each layer)")
SEQ_LEN = Declared(("--seq-len",), "transformers: tokens per sequence (default: the model's positions, at most "
                   "2048)", _range(2, 1 << 22))
