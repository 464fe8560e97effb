"""Training data: synthetic (made on the device), a folder of images (ImageFolder layout), a token file, and
scikit-learn's digits (tests). Nothing is downloaded. The data sets read from files are `execute.datasets`'s,
shared with `bench io`.

Batches are a pure function of (seed, step): the global batch of step s is a fixed slice of epoch s's shuffled
order, and rank r takes its share of it. So N ranks see exactly the samples 1 rank sees, and the data position
to checkpoint is just the step number."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from meshscale.errors import MeshscaleError
from meshscale.execute.datasets import Dataset, image_folder, token_file


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
    if not spec.strip():
        raise MeshscaleError("--data: an empty path; give synthetic, digits, a folder of images or a token file")
    path = Path(spec)
    if input_kind == "tokens":
        return token_file(path, sample_shape[0], num_classes)
    if path.is_file():
        raise MeshscaleError(f"{path} is a file, but an image model needs a folder of images (ImageFolder layout)")
    return image_folder(path, tuple(sample_shape[1:]))
