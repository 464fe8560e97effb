"""Generate the data sets `meshscale bench io` is shown on: an ImageFolder of JPEGs and a token file.

    python benchmarks/make_io_datasets.py OUTDIR [--images 3000] [--classes 10] [--side 256] [--tokens 50000000]

OUTDIR/images/class<c>/<i>.jpg: smooth patterns with noise at JPEG quality 90, so the files compress like
photographs (about 27 KB at 256x256); OUTDIR/tokens.bin: uniform uint16 ids below GPT-2's vocabulary (nanoGPT's
layout). Seeded: the same files every time.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image


def make_images(root: Path, count: int, classes: int, side: int) -> None:
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:side, 0:side] / side
    for i in range(count):
        folder = root / f"class{i % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        f, p = rng.uniform(1, 6, 3), rng.uniform(0, 6.3, 3)
        img = np.stack([np.sin(f[k] * (x + y * (k + 1)) * 3 + p[k]) for k in range(3)], -1) * 100 + 128
        img += rng.normal(0, 12, img.shape)
        Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(folder / f"{i:05d}.jpg", quality=90)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--images", type=int, default=3000)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--side", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=50_000_000)
    args = ap.parse_args()
    make_images(args.out / "images", args.images, args.classes, args.side)
    np.random.default_rng(1).integers(0, 50257, args.tokens, dtype=np.uint16).tofile(args.out / "tokens.bin")
    print(f"wrote {args.images} JPEGs under {args.out / 'images'} and {args.tokens:,} tokens to {args.out / 'tokens.bin'}")


if __name__ == "__main__":
    main()
