"""The data sets read from files, which a training run and `bench io` both read through: a folder of images
(ImageFolder layout) and a flat file of token ids, each a `Dataset` that fetches samples by index. Below both
bench and train, so the benchmark decodes through the training loop's own path without importing the trainer."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from meshscale.errors import MeshscaleError
from meshscale.safe_io import input_file

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm", ".tif", ".tiff")
TOKEN_SUFFIXES = (".npy", ".bin")


@dataclass
class Dataset:
    """``n`` samples; ``fetch(indices)`` returns (inputs, targets) CPU tensors. ``synthetic`` data has one
    fixed batch that lives on the device."""

    name: str
    n: int
    fetch: Callable[[np.ndarray], tuple[torch.Tensor, torch.Tensor]]
    input_kind: str                  # "image" or "tokens"
    sample_shape: tuple[int, ...]    # (C, H, W) or (seq,)
    num_classes: int                 # classes, or vocabulary size
    synthetic: bool = False


def image_folder(root: str | Path, size: tuple[int, int] = (224, 224)) -> Dataset:
    """Images in ``root/<class>/<file>`` (the ImageFolder layout), loaded with PIL, resized, scaled to [0, 1]."""
    root = Path(root)
    if not root.is_dir():
        raise MeshscaleError(f"data folder {root} does not exist; give a folder with one sub-folder per class, or --data synthetic")
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    files = [(f, c) for c, name in enumerate(classes) for f in sorted((root / name).rglob("*"))
             if f.suffix.lower() in IMAGE_SUFFIXES]
    if not files:
        raise MeshscaleError(f"no images in {root}: expected {root}/<class>/<image> files ({', '.join(IMAGE_SUFFIXES)})")
    from PIL import Image

    def load(path: Path) -> torch.Tensor:
        with Image.open(path) as im:
            a = np.asarray(im.convert("RGB").resize((size[1], size[0])), dtype=np.float32) / 255.0
        return torch.from_numpy(a).permute(2, 0, 1)

    def fetch(idx: np.ndarray):
        return torch.stack([load(files[i][0]) for i in idx]), torch.tensor([files[i][1] for i in idx])

    return Dataset(f"images:{root}", len(files), fetch, "image", (3, *size), len(classes))


def token_file(path: str | Path, seq_len: int, vocab_size: int) -> Dataset:
    """A flat file of token ids: ``.npy`` (any integer dtype) or raw ``uint16`` (nanoGPT's ``.bin``). Sample i
    is the window ``[i*seq, (i+1)*seq]``; the target is the input shifted by one token."""
    tokens = _token_ids(Path(path))
    n = (len(tokens) - 1) // seq_len
    if n < 1:
        raise MeshscaleError(f"token file {path} holds {len(tokens)} tokens, fewer than one sequence of {seq_len + 1}")
    low, top = int(tokens.min()), int(tokens.max())
    if low < 0:
        raise MeshscaleError(f"token file {path} has id {low}; token ids are whole numbers from 0")
    if top >= vocab_size:
        raise MeshscaleError(f"token file {path} has id {top} but the model's vocabulary is {vocab_size}; pick a bigger model")

    def fetch(idx: np.ndarray):
        w = torch.from_numpy(np.stack([np.asarray(tokens[i * seq_len: i * seq_len + seq_len + 1], dtype=np.int64) for i in idx]))
        return w[:, :-1], w[:, 1:]

    return Dataset(f"tokens:{path}", n, fetch, "tokens", (seq_len,), vocab_size)


def _token_ids(path: Path) -> np.ndarray:
    """The token ids of ``path`` as a read-only memory map, refused in one line when they are not a flat array
    of integers: a .npy of another dtype (floats, objects: loading never unpickles), a corrupt header, a .bin
    of an odd or zero length, a file of another kind."""
    if path.suffix.lower() not in TOKEN_SUFFIXES:
        raise MeshscaleError(f"token file {path}: use a .npy array of integer ids or a uint16 .bin file "
                             "(nanoGPT's); other files are not token files")
    size = input_file(path, "token file (.npy or .bin of token ids)").stat().st_size
    if path.suffix.lower() == ".bin":
        if size == 0 or size % 2:
            raise MeshscaleError(f"token file {path}: {size} bytes is not a whole number of uint16 token ids")
        return np.memmap(path, dtype=np.uint16, mode="r")
    try:
        tokens = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as exc:  # numpy parses the header with ast and tokenize: any of their errors
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
        raise MeshscaleError(f"token file {path}: not a readable .npy array of token ids ({first})") from None
    if not isinstance(tokens, np.ndarray) or tokens.dtype.kind not in "iu" or tokens.ndim != 1:
        what = f"a {tokens.ndim}-d array of {tokens.dtype}" if isinstance(tokens, np.ndarray) else "not an array"
        raise MeshscaleError(f"token file {path}: holds {what}; give a flat array of integer token ids")
    return tokens
