"""The model registry: adding a model is one `ModelSpec` entry in MODELS.

Each entry says how to build the model, what it eats (images (C, H, W) with classes, or token sequences),
how many parameters it has and its forward + backward FLOPs per sample (the predictor reads both)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch.nn as nn

from meshscale.errors import MeshscaleError
from meshscale.train.cnn import small_cnn, small_cnn_flops, small_cnn_params
from meshscale.train.gpt_config import GPTConfig, gpt_flops, gpt_params


@dataclass
class ModelSpec:
    """One trainable model: ``build(**overrides)`` makes a fresh ``nn.Module``."""

    name: str
    builder: Callable[..., nn.Module]
    input_kind: str                 # "image" (C, H, W) -> class, or "tokens" (seq,) -> next tokens
    input_shape: tuple[int, ...]    # default per-sample input shape
    num_classes: int                # classes for images, vocabulary size for tokens
    params: int
    flops_per_sample: float         # forward + backward, at input_shape
    description: str = ""
    build_kwargs: dict = field(default_factory=dict)
    optimizer: str = "sgd"          # default optimizer and learning rate per 256 samples (scaled linearly)
    base_lr: float = 0.1

    def build(self, **overrides) -> nn.Module:
        """A freshly initialised model (the caller seeds torch for reproducible weights)."""
        return self.builder(**{**self.build_kwargs, **overrides})


def _torchvision_model(name: str) -> Callable[..., nn.Module]:
    def build(num_classes: int = 1000, in_channels: int = 3) -> nn.Module:
        try:
            import torchvision
        except Exception as exc:  # on a CPU-only torch the CUDA torchvision fails at import (operator nms)
            raise MeshscaleError(f"model {name} needs a working torchvision ({type(exc).__name__}: "
                                 f"{str(exc).splitlines()[0][:120]}); install the torchvision matching your torch, "
                                 "or use small-cnn / gpt-tiny") from None
        if in_channels != 3:
            raise MeshscaleError(f"model {name} takes 3-channel images, got {in_channels}; use small-cnn")
        return getattr(torchvision.models, name)(num_classes=num_classes)
    return build


_GPT = {
    "gpt-tiny": GPTConfig(n_layer=2, n_head=2, d_model=64, vocab_size=256, seq_len=32),
    "gpt-small": GPTConfig(n_layer=12, n_head=12, d_model=768, vocab_size=50257, seq_len=1024),
    "gpt-medium": GPTConfig(n_layer=24, n_head=16, d_model=1024, vocab_size=50257, seq_len=1024),
}


def _gpt(cfg: GPTConfig) -> nn.Module:
    from meshscale.train.gpt import GPT  # the registry is read by predictions that never build a model
    return GPT(cfg)


def _gpt_spec(name: str, cfg: GPTConfig, text: str) -> ModelSpec:
    return ModelSpec(name, _gpt, "tokens", (cfg.seq_len,), cfg.vocab_size, gpt_params(cfg), gpt_flops(cfg), text,
                     build_kwargs={"cfg": cfg}, optimizer="adamw", base_lr=3e-4)


MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in [
    # ResNets: the usually quoted "4.1 / 1.8 GFLOPs" at 224x224 are multiply-adds; x2 for FLOPs (as the GPT
    # formula counts them), x3 for forward + backward.
    ModelSpec("resnet50", _torchvision_model("resnet50"), "image", (3, 224, 224), 1000, 25_557_032, 3 * 2 * 4.1e9,
              "ResNet-50 (torchvision), the whitepaper's benchmark"),
    ModelSpec("resnet18", _torchvision_model("resnet18"), "image", (3, 224, 224), 1000, 11_689_512, 3 * 2 * 1.8e9,
              "ResNet-18 (torchvision)"),
    ModelSpec("small-cnn", small_cnn, "image", (3, 32, 32), 10, small_cnn_params(3, 10), small_cnn_flops(3, 32, 32),
              "3-conv CNN, trains in seconds on a CPU; any image size",
              {"in_channels": 3, "num_classes": 10}, optimizer="adamw", base_lr=0.024),  # no norm layers: adam
    _gpt_spec("gpt-tiny", _GPT["gpt-tiny"], "GPT, 2 layers, d=64, vocab 256, 32 tokens: CPU tests"),
    _gpt_spec("gpt-small", _GPT["gpt-small"], "GPT-2 small (124M), 1024 tokens"),
    _gpt_spec("gpt-medium", _GPT["gpt-medium"], "GPT-2 medium (350M), 1024 tokens"),
]}


def _transformer(model_cfg, seq_len: int) -> nn.Module:
    from meshscale.train.transformer import Transformer
    return Transformer(model_cfg, seq_len)


DEFAULT_SEQ_LEN = 2048  # a transformer's sequence when --seq-len is not given: the model's positions, at most this


def transformer_spec(name: str, seq_len: int | None = None) -> ModelSpec:
    """A transformer preset or config.json as a trainable model at ``seq_len`` tokens per sequence; FLOPs per
    sample as MFU counts them (`TransformerConfig.training_flops_per_token`)."""
    from meshscale.models.transformer import load_model_config
    model_cfg = load_model_config(name)
    seq = seq_len or min(model_cfg.max_seq_len, DEFAULT_SEQ_LEN)
    return ModelSpec(model_cfg.name, _transformer, "tokens", (seq,), model_cfg.vocab_size, model_cfg.params(),
                     model_cfg.training_flops_per_token(seq) * seq, model_cfg.source,
                     {"model_cfg": model_cfg, "seq_len": seq}, optimizer="adamw", base_lr=3e-4)


def get_model(name: str, seq_len: int | None = None) -> ModelSpec:
    """The registry entry for ``name`` (or a transformer preset / config.json at ``seq_len``); a clear error
    listing the known names otherwise."""
    from meshscale.models.transformer import is_transformer_model, preset_names
    if is_transformer_model(name):
        return transformer_spec(name, seq_len)
    try:
        return MODELS[name]
    except KeyError:
        raise MeshscaleError(f"unknown model {name!r}; choose one of {', '.join([*MODELS, *preset_names()])}, "
                             "or a config.json file") from None


def image_spec(spec: ModelSpec, in_channels: int, height: int, width: int, num_classes: int) -> ModelSpec:
    """The same model adapted to other images (e.g. 1x8x8 digits): shape, classes and FLOPs follow."""
    if spec.input_kind != "image":
        raise MeshscaleError(f"model {spec.name} takes tokens, not images; use small-cnn or a resnet")
    kwargs = {**spec.build_kwargs, "in_channels": in_channels, "num_classes": num_classes}
    if spec.builder is small_cnn:
        params, flops = small_cnn_params(in_channels, num_classes), small_cnn_flops(in_channels, height, width, num_classes)
    else:  # torchvision ResNets: FLOPs scale with the pixel count, the head with the classes
        params = spec.params
        flops = spec.flops_per_sample * (height * width) / (spec.input_shape[1] * spec.input_shape[2])
    return ModelSpec(spec.name, spec.builder, "image", (in_channels, height, width), num_classes, params, flops,
                     spec.description, kwargs, spec.optimizer, spec.base_lr)
