"""The model registry: every trainable model by name, what it eats, its parameters and its FLOPs, without torch
(`predict` reads it; `train/builders.py` builds the module of an entry, keyed by its family).

Parameters and FLOPs come from one function per family: a transformer's `TransformerConfig` methods,
`resnet_size` for the torchvision ResNets, `small_cnn_size` for the small CNN."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from meshscale.errors import MeshscaleError
from meshscale.models.images import (CNN_WIDTHS, resnet_macs, resnet_params, small_cnn_layers,
                                     small_cnn_tensor_numels)
from meshscale.models.transformer import TransformerConfig, is_transformer_model, load_model_config, preset, preset_names

FAMILIES = ("resnet", "cnn", "transformer")
DEFAULT_SEQ_LEN = 2048  # a transformer's sequence when --seq-len is not given: the model's positions, at most this


@dataclass(frozen=True)
class ModelSpec:
    """One trainable model: its family says how train builds it (`train/builders.py`)."""

    name: str
    family: str                     # resnet | cnn | transformer
    input_kind: str                 # "image" (C, H, W) -> class, or "tokens" (seq,) -> next tokens
    input_shape: tuple[int, ...]    # default per-sample input shape
    num_classes: int                # classes for images, vocabulary size for tokens
    params: int
    flops_per_sample: float         # forward + backward, at input_shape
    description: str = ""
    optimizer: str = "sgd"          # default optimizer and learning rate per 256 samples (scaled linearly)
    base_lr: float = 0.1
    transformer: TransformerConfig | None = None  # the shape of a transformer (family "transformer")


# ---- images: one size function per family ---------------------------------------------------------------
def resnet_size(name: str, in_channels: int, height: int, width: int, num_classes: int) -> tuple[int, float]:
    """(parameters, forward + backward FLOPs per sample) of a torchvision ResNet, from its blocks
    (`images.resnet_blocks`): the head follows the classes, the convolutions' FLOPs the pixel count; x2
    multiply-adds to FLOPs (as the transformer count does), x3 forward + backward."""
    depth = int(name.removeprefix("resnet"))
    macs = resnet_macs(depth, 224, num_classes) * (height * width) / (224 * 224)
    return resnet_params(depth, num_classes), 3 * 2 * macs


def small_cnn_size(name: str, in_channels: int, height: int, width: int, num_classes: int) -> tuple[int, float]:
    """(parameters, forward + backward FLOPs per sample) of the small CNN (`images.small_cnn_layers`): conv-relu
    x2, 2x2 max-pool, conv-relu, global average pool, linear; FLOPs are 3 x (2 x multiply-accumulates of the
    convolutions and the head)."""
    layers = small_cnn_layers(channels=in_channels)
    pixels = (height * width, height * width, (height // 2) * (width // 2))
    macs = sum(c_in * c_out * 9 * n for (c_in, c_out, _), n in zip(layers, pixels)) + CNN_WIDTHS[-1] * num_classes
    return sum(small_cnn_tensor_numels(num_classes, in_channels)), 3.0 * 2.0 * macs


_IMAGE_SIZES: dict[str, Callable[[str, int, int, int, int], tuple[int, float]]] = {
    "resnet": resnet_size, "cnn": small_cnn_size}


def _image_model(name: str, family: str, shape: tuple[int, int, int], classes: int, description: str,
                 optimizer: str = "sgd", base_lr: float = 0.1) -> ModelSpec:
    params, flops = _IMAGE_SIZES[family](name, *shape, classes)
    return ModelSpec(name, family, "image", shape, classes, params, flops, description, optimizer, base_lr)


def image_spec(spec: ModelSpec, in_channels: int, height: int, width: int, num_classes: int) -> ModelSpec:
    """The same model adapted to other images (e.g. 1x8x8 digits): shape, classes, parameters and FLOPs follow."""
    if spec.input_kind != "image":
        raise MeshscaleError(f"model {spec.name} takes tokens, not images; use small-cnn or a resnet")
    return _image_model(spec.name, spec.family, (in_channels, height, width), num_classes, spec.description,
                        spec.optimizer, spec.base_lr)


# ---- transformers ------------------------------------------------------------------------------------------
def transformer_model(cfg: TransformerConfig, seq_len: int | None = None, description: str | None = None) -> ModelSpec:
    """A transformer shape as a trainable model at ``seq_len`` tokens per sequence; FLOPs per sample as MFU
    counts them (`TransformerConfig.training_flops_per_token`)."""
    seq = seq_len or min(cfg.max_seq_len, DEFAULT_SEQ_LEN)
    return ModelSpec(cfg.name, "transformer", "tokens", (seq,), cfg.vocab_size, cfg.params(),
                     cfg.training_flops_per_token(seq) * seq, cfg.source if description is None else description,
                     optimizer="adamw", base_lr=3e-4, transformer=cfg)


# train's GPT-2 shapes, trained by the data-parallel modes (the presets gpt2-* train under a layout)
_GPT_TINY = TransformerConfig(name="gpt-tiny", layers=2, d_model=64, heads=2, kv_heads=2, ffn_dim=256, vocab_size=256,
                              max_seq_len=32, style="gpt2", tie_embeddings=True,
                              source="meshscale's own CPU test shape (not a published model)")


def _gpt(name: str, cfg: TransformerConfig, description: str) -> ModelSpec:
    return transformer_model(replace(cfg, name=name), cfg.max_seq_len, description)


MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in [
    _image_model("resnet50", "resnet", (3, 224, 224), 1000, "ResNet-50 (torchvision), the whitepaper's benchmark"),
    _image_model("resnet18", "resnet", (3, 224, 224), 1000, "ResNet-18 (torchvision)"),
    _image_model("small-cnn", "cnn", (3, 32, 32), 10, "3-conv CNN, trains in seconds on a CPU; any image size",
                 optimizer="adamw", base_lr=0.024),  # no norm layers: adam
    _gpt("gpt-tiny", _GPT_TINY, "GPT, 2 layers, d=64, vocab 256, 32 tokens: CPU tests"),
    _gpt("gpt-small", preset("gpt2-small"), "GPT-2 small (124M), 1024 tokens"),
    _gpt("gpt-medium", preset("gpt2-medium"), "GPT-2 medium (350M), 1024 tokens"),
]}


def get_model(name: str, seq_len: int | None = None) -> ModelSpec:
    """The registry entry for ``name`` (or a transformer preset / config.json at ``seq_len``); a clear error
    listing the known names otherwise."""
    if is_transformer_model(name):
        return transformer_model(load_model_config(name), seq_len)
    try:
        return MODELS[name]
    except KeyError:
        import difflib
        known = [*MODELS, *preset_names()]
        close = difflib.get_close_matches(name, known, n=1)
        raise MeshscaleError(f"unknown model {name!r}" + (f" (did you mean {close[0]}?)" if close else "")
                             + f"; choose one of {', '.join(known)}, or a config.json file") from None
