"""The data sets read from files, which a training run and `bench io` both read through: a folder of images
(ImageFolder layout) and a flat file of token ids, each a `Dataset` that fetches samples by index. Below both
bench and train, so the benchmark decodes through the training loop's own path without importing the trainer."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from meshscale.errors import MeshscaleError, one_line
from meshscale.execute.data_files import IMAGE_SUFFIXES, TOKEN_SUFFIXES, token_layout, walk_images  # noqa: F401


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
    """Images in ``root/<class>/<file>`` (the ImageFolder layout), loaded with PIL, resized, scaled to [0, 1].
    The folder is walked within `data_files`' limits; an image that cannot be decoded (a decompression bomb, a
    corrupt or truncated file) is one line naming it."""
    tree = walk_images(root)
    files = [(path, klass) for path, klass, _ in tree.files]

    def fetch(idx: np.ndarray):
        return torch.stack([load_image(files[i][0], size) for i in idx]), torch.tensor([files[i][1] for i in idx])

    return Dataset(f"images:{root}", len(files), fetch, "image", (3, *size), len(tree.classes))


def load_image(path: str, size: tuple[int, int]) -> torch.Tensor:
    """One image as a (3, H, W) float tensor in [0, 1]; images above PIL's decompression-bomb bound
    (Image.MAX_IMAGE_PIXELS, 89.5 million pixels) are refused from their header, before decoding."""
    import warnings

    from PIL import Image

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as im:  # the header only: a bomb is refused here, before decoding
                if size == (0, 0):
                    return torch.empty(0)
                a = np.asarray(im.convert("RGB").resize((size[1], size[0])), dtype=np.float32) / 255.0
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise MeshscaleError(f"{one_line(path)}: a decompression bomb ({one_line(str(exc))[:160]}); images are "
                             f"decoded up to PIL's {Image.MAX_IMAGE_PIXELS:,} pixels") from None
    except (OSError, SyntaxError, ValueError, EOFError, MemoryError, IndexError, TypeError) as exc:
        # what PIL's decoders raise on a corrupt, truncated or unknown file
        raise MeshscaleError(f"{one_line(path)}: not a readable image ({type(exc).__name__}: "
                             f"{one_line(str(exc))[:160]})") from None
    return torch.from_numpy(a).permute(2, 0, 1)


def check_image_headers(paths: list[str]) -> None:
    """Open each image's header (nothing decoded): a decompression bomb or a file PIL cannot read is one line
    before any pass starts."""
    for path in paths:
        load_image(path, (0, 0))


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
    """The token ids of ``path`` as a read-only memory map, from the header `data_files.token_layout` parsed
    (never numpy's loader: nothing is evaluated or unpickled); one line when they are not a flat array of
    integers."""
    layout = token_layout(path)
    if layout.count == 0:
        return np.zeros(0, dtype=np.dtype(layout.dtype))
    return np.memmap(layout.path, dtype=np.dtype(layout.dtype), mode="r", offset=layout.offset,
                     shape=(layout.count,))
