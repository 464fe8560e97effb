"""Training data: synthetic (made on the device), a folder of images (ImageFolder layout), a token file, and
scikit-learn's digits (tests). Nothing is downloaded.

Batches are a pure function of (seed, step): the global batch of step s is a fixed slice of epoch s's shuffled
order, and rank r takes its share of it. So N ranks see exactly the samples 1 rank sees, and the data position
to checkpoint is just the step number."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from meshscale.errors import MeshscaleError
from meshscale.safe_io import input_file

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm", ".tif", ".tiff")


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


def synthetic(input_kind: str, sample_shape: tuple[int, ...], num_classes: int) -> Dataset:
    """Random inputs for throughput runs (generated once, on the device, by `Batches`)."""
    def fetch(idx: np.ndarray):
        raise RuntimeError("synthetic data lives on the device: use Batches")
    return Dataset("synthetic", 1 << 30, fetch, input_kind, tuple(sample_shape), num_classes, synthetic=True)


def require_scikit_learn() -> None:
    """The digits data set comes from scikit-learn, an optional extra: say how to install it, in one line."""
    try:
        import sklearn.datasets  # noqa: F401
    except ImportError:
        raise MeshscaleError("the digits data set needs scikit-learn: pip install 'meshscale[digits]'") from None


def digits(split: str = "train", test_fraction: float = 0.2) -> Dataset:
    """scikit-learn's 8x8 digits (1,797 images, 10 classes), scaled to [0, 1]; a fixed train/test split."""
    require_scikit_learn()
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    order = np.random.default_rng(0).permutation(len(y))
    cut = int(len(y) * (1 - test_fraction))
    keep = torch.from_numpy(order[:cut] if split == "train" else order[cut:])
    x, y = x[keep], y[keep]
    return Dataset(f"digits-{split}", len(y), lambda idx: (x[idx], y[idx]), "image", (1, 8, 8), 10)


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


TOKEN_SUFFIXES = (".npy", ".bin")


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


class Batches:
    """The per-rank batch of each step, deterministic in (seed, step) and independent of the world size."""

    def __init__(self, data: Dataset, batch_per_rank: int, rank: int, world: int, seed: int, device: torch.device,
                 channels_last: bool = False, positions: torch.Tensor | None = None):
        self.data, self.b, self.rank, self.world, self.seed, self.device = data, batch_per_rank, rank, world, seed, device
        self.positions = positions  # context parallelism: the sequence positions this rank holds (None: all)
        # images in the model's memory format: the synthetic batch is converted once, not at every step
        self.memory_format = torch.channels_last if channels_last and data.input_kind == "image" else None
        self.global_batch = batch_per_rank * world
        if not data.synthetic and self.global_batch > data.n:
            raise MeshscaleError(f"global batch {self.global_batch} is larger than the {data.n} samples of {data.name}")
        self.steps_per_epoch = max(1, data.n // self.global_batch)
        self._order: tuple[int, np.ndarray] | None = None
        self._fixed = self._held(*self._synthetic_batch()) if data.synthetic else None

    def _synthetic_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        # sample i of the global batch depends only on (seed, i): N ranks hold exactly what 1 rank holds
        xs, ys = [], []
        for i in range(self.rank * self.b, (self.rank + 1) * self.b):
            g = torch.Generator(device="cpu").manual_seed(self.seed * 1_000_003 + i)
            if self.data.input_kind == "tokens":
                xs.append(torch.randint(self.data.num_classes, self.data.sample_shape, generator=g))
                ys.append(torch.randint(self.data.num_classes, self.data.sample_shape, generator=g))
            else:
                xs.append(torch.randn(self.data.sample_shape, generator=g))
                ys.append(torch.randint(self.data.num_classes, (), generator=g))
        return self._formatted(torch.stack(xs).to(self.device)), torch.stack(ys).to(self.device)

    def _formatted(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.memory_format is None else x.contiguous(memory_format=self.memory_format)

    def indices(self, step: int) -> np.ndarray:
        """This rank's sample indices at ``step``: epoch = step // steps_per_epoch, a seeded shuffle per epoch."""
        epoch, i = divmod(step, self.steps_per_epoch)
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, np.random.default_rng((self.seed, epoch)).permutation(self.data.n))
        start = i * self.global_batch + self.rank * self.b
        return self._order[1][start:start + self.b]

    def get(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of ``step`` on the device."""
        if self._fixed is not None:
            return self._fixed
        x, y = self.data.fetch(self.indices(step))
        nb = self.device.type == "cuda"
        return self._held(self._formatted(x.to(self.device, non_blocking=nb)), y.to(self.device, non_blocking=nb))

    def _held(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The part of the sequences this rank holds."""
        return (x, y) if self.positions is None else (x[:, self.positions], y[:, self.positions])


def open_data(spec: str, input_kind: str, sample_shape: tuple[int, ...], num_classes: int) -> Dataset:
    """``synthetic``, ``digits`` (``digits-test`` for the held-out split), a folder of images, or a token file."""
    if spec == "synthetic":
        return synthetic(input_kind, sample_shape, num_classes)
    if spec in ("digits", "digits-test"):
        if input_kind != "image":
            raise MeshscaleError("the digits data set is images; use an image model such as small-cnn")
        return digits("test" if spec == "digits-test" else "train")
    path = Path(spec)
    if input_kind == "tokens":
        return token_file(path, sample_shape[0], num_classes)
    if path.is_file():
        raise MeshscaleError(f"{path} is a file, but an image model needs a folder of images (ImageFolder layout)")
    return image_folder(path, tuple(sample_shape[1:]))
