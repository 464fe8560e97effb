"""The files of a data set, found and checked without reading them: a folder of images in the ImageFolder layout
(`walk_images`) and the header of a token file (`token_layout`). `bench io` and training both start here, so
one set of limits holds for both, and bad input is one line before any file is read.

The walk is bounded: at most `MAX_DATASET_ENTRIES` entries looked at, `MAX_DATASET_FILES` images,
`MAX_CLASSES` class folders and `MAX_DATASET_DEPTH` folders deep, within a time budget. It never leaves the data
set: a symbolic link is followed only when its target lies inside the data set's own folder (so never into /proc,
/sys or /dev, and a class folder linked to / is refused), every folder is entered once (a link back up cannot
loop), and an image that is not a regular file (a pipe, a device, a socket) is refused unopened. A sparse file
(most of it holes: a 100 GB file of nothing) is no data set's and is refused too.

A .npy header is parsed here by a small grammar (magic, version, a header of at most numpy's own 10,000 bytes
holding the three keys descr, fortran_order and shape), never by numpy's loader, which evaluates the header
with Python's tokenizer and may unpickle.
"""
from __future__ import annotations

import os
import re
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from meshscale.errors import MeshscaleError, one_line
from meshscale.units import is_digits

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".ppm", ".tif", ".tiff")
TOKEN_SUFFIXES = (".npy", ".bin")
# ImageNet-1k's training set (the largest ImageFolder data set in common use) has 1,281,167 images in 1,000
# classes; ImageNet-21k has 21,841 classes. The limits leave room above both and keep the walk's list of
# paths under a few hundred MB.
MAX_DATASET_FILES = 2_000_000
MAX_DATASET_ENTRIES = 4_000_000      # entries of any kind looked at (other files and folders too)
MAX_CLASSES = 100_000
MAX_DATASET_DEPTH = 32               # folders below a class folder: ImageFolder data sets nest one or two
# What a walk may take: a local SSD lists ImageNet-1k in a few seconds; a tree that takes longer is not one data
# set (a whole file system) or sits on storage too slow to benchmark a training input pipeline from.
WALK_BUDGET_S = 10.0
SYSTEM_FOLDERS = ("/proc", "/sys", "/dev")
# A file counts as sparse when under half its bytes are stored and a hole starts before its end
# (lseek SEEK_HOLE); files of at least this size are checked.
SPARSE_CHECK_BYTES = 1 << 20
NPY_MAGIC = b"\x93NUMPY"
MAX_NPY_HEADER_BYTES = 10_000        # numpy.lib.format's own max_header_size
_NPY_DESCR = re.compile(r"[<>|=]?([iu])([1248])")
_NPY_ITEM = re.compile(r"\s*['\"](descr|fortran_order|shape)['\"]\s*:\s*('[^'\\]{0,64}'|\"[^\"\\]{0,64}\"|True|False|"
                       r"\(\s*(?:[0-9]{1,20}\s*(?:,\s*[0-9]{1,20}\s*)*,?\s*)?\))\s*(,|$)")


@dataclass(frozen=True)
class ImageTree:
    """The images of a folder in the ImageFolder layout: class names (sorted) and (path, class, bytes) per image,
    in class then path order."""

    root: Path
    classes: tuple[str, ...]
    files: tuple[tuple[str, int, int], ...]

    @property
    def total_bytes(self) -> int:
        return sum(size for _, _, size in self.files)


@dataclass(frozen=True)
class TokenLayout:
    """Where a token file's ids are: their dtype (numpy's name), count and byte offset."""

    path: Path
    dtype: str
    count: int
    offset: int
    file_bytes: int

    @property
    def itemsize(self) -> int:
        return int(self.dtype[-1])


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _in_system_folder(path: str) -> bool:
    return any(_inside(path, folder) for folder in SYSTEM_FOLDERS)


def data_root(path: str | Path, what: str) -> str:
    """``path`` resolved, if it can be a data set: not empty, existing, not / or a system folder."""
    text = str(path)
    if not text.strip():
        raise MeshscaleError(f"{what}: an empty path; give a folder of images (<class>/<image>) or a token file")
    if "\x00" in text:
        raise MeshscaleError(f"{what}: a path with a NUL character")
    real = os.path.realpath(text)
    if not os.path.exists(real):
        raise MeshscaleError(f"{one_line(text)} does not exist; give a folder of images (<class>/<image>) or a "
                             "token file")
    if real == os.sep or _in_system_folder(real):
        raise MeshscaleError(f"{one_line(text)}: {real} is a system folder, not a data set; give the data set's own "
                             "folder")
    if not os.access(real, os.R_OK):
        raise MeshscaleError(f"{one_line(text)} is not readable")
    return real


class _Walk:
    """The state of one bounded walk: what it has seen and what it may still spend."""

    def __init__(self, root: str, budget_s: float):
        self.root, self.budget_s = root, budget_s
        self.deadline = time.monotonic() + budget_s
        self.entries = 0
        self.seen: set[tuple[int, int]] = set()
        self.files: list[tuple[str, int, int]] = []

    def count(self) -> None:
        self.entries += 1
        if self.entries > MAX_DATASET_ENTRIES:
            raise MeshscaleError(f"{self.root}: more than {MAX_DATASET_ENTRIES:,} files and folders; a data set "
                                 f"holds at most {MAX_DATASET_FILES:,} images (meshscale's limit, above "
                                 "ImageNet-1k's 1.28 million); give one data set's folder")
        if self.entries % 512 == 0 and time.monotonic() > self.deadline:
            raise MeshscaleError(f"{self.root}: listing the data set took over {self.budget_s:g} s "
                                 f"({self.entries:,} entries so far, the walk's budget); give one data set's "
                                 "folder on local storage")

    def target(self, path: str) -> str:
        """Where a link at ``path`` leads, if inside the data set; one line otherwise."""
        real = os.path.realpath(path)
        if not _inside(real, self.root) or _in_system_folder(real):
            raise MeshscaleError(f"{one_line(path)}: a link out of the data set (to {one_line(real)}); meshscale "
                                 f"reads only files inside {self.root}: copy the files in, or give the folder the "
                                 "links point into")
        return real


def _kind(mode: int) -> str:
    return ("a named pipe" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file")


def check_not_sparse(path: str, info: os.stat_result) -> None:
    """Refuse a file whose bytes are mostly holes (stored blocks under half its size and a hole before its end)."""
    if info.st_size < SPARSE_CHECK_BYTES or getattr(info, "st_blocks", info.st_size) * 512 >= info.st_size // 2:
        return
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return
    try:
        hole = os.lseek(fd, 0, os.SEEK_HOLE) if hasattr(os, "SEEK_HOLE") else info.st_size
    except OSError:  # a file system that cannot tell
        hole = info.st_size
    finally:
        os.close(fd)
    if hole < info.st_size:
        raise MeshscaleError(f"{one_line(path)}: a sparse file ({info.st_size:,} bytes, "
                             f"{info.st_blocks * 512:,} of them stored): mostly holes, no data set's file; give "
                             "the data itself")


def _image(walk: _Walk, path: str, klass: int) -> None:
    """Record the image at ``path`` (links already resolved inside the data set) after checking it."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise MeshscaleError(f"{one_line(path)}: cannot read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        if stat.S_ISDIR(info.st_mode):
            return
        raise MeshscaleError(f"{one_line(path)}: is {_kind(info.st_mode)}, not an image file; meshscale opens "
                             "regular files only")
    check_not_sparse(path, info)
    if len(walk.files) >= MAX_DATASET_FILES:
        raise MeshscaleError(f"{walk.root}: more than {MAX_DATASET_FILES:,} images (meshscale's limit, above "
                             "ImageNet-1k's 1.28 million); give a smaller data set")
    walk.files.append((path, klass, info.st_size))


def _listing(walk: _Walk, folder: str) -> list[os.DirEntry]:
    """A folder's entries in name order, each counted against the walk's limits as it is read."""
    entries = []
    try:
        with os.scandir(folder) as listing:
            for entry in listing:
                walk.count()
                entries.append(entry)
    except OSError as exc:
        raise MeshscaleError(f"{one_line(folder)}: cannot list ({exc.strerror or exc})") from None
    return sorted(entries, key=lambda e: e.name)


def _is_dir(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()  # follows a link: only a stat, nothing opened
    except OSError:  # a link loop
        return False


def _walk_class(walk: _Walk, folder: str, klass: int) -> None:
    """Every image under one class folder, depth first in name order, each folder once."""
    stack = [(folder, 0)]
    while stack:
        current, depth = stack.pop()
        try:
            info = os.stat(current)
        except OSError as exc:
            raise MeshscaleError(f"{one_line(current)}: cannot read ({exc.strerror or exc})") from None
        if (info.st_dev, info.st_ino) in walk.seen:
            continue
        walk.seen.add((info.st_dev, info.st_ino))
        below = []
        for entry in _listing(walk, current):
            if _is_dir(entry):
                below.append(walk.target(entry.path) if entry.is_symlink() else entry.path)
            elif os.path.splitext(entry.name)[1].lower() in IMAGE_SUFFIXES:
                _image(walk, walk.target(entry.path) if entry.is_symlink() else entry.path, klass)
        if below and depth + 1 > MAX_DATASET_DEPTH:
            raise MeshscaleError(f"{one_line(current)}: folders nest more than {MAX_DATASET_DEPTH} deep below a "
                                 "class folder; an ImageFolder data set is <class>/<image>")
        stack += [(p, depth + 1) for p in reversed(below)]


def walk_images(path: str | Path, budget_s: float = WALK_BUDGET_S, what: str = "data folder") -> ImageTree:
    """The images of the ImageFolder data set at ``path`` (``<class>/<image>``, deeper folders within a class
    allowed), within this module's limits; one line for anything outside them."""
    root = data_root(path, what)
    if not os.path.isdir(root):
        raise MeshscaleError(f"{one_line(str(path))} is not a folder; give a folder with one sub-folder per class")
    walk = _Walk(root, budget_s)
    classes = []
    for entry in _listing(walk, root):
        if _is_dir(entry):
            classes.append((entry.name, walk.target(entry.path) if entry.is_symlink() else entry.path))
            if len(classes) > MAX_CLASSES:
                raise MeshscaleError(f"{root}: more than {MAX_CLASSES:,} class folders (meshscale's limit, above "
                                     "ImageNet-21k's 21,841 classes); give one data set's folder")
    walk.seen.add((os.stat(root).st_dev, os.stat(root).st_ino))
    for klass, (_, folder) in enumerate(classes):
        _walk_class(walk, folder, klass)
    if not walk.files:
        raise MeshscaleError(f"no images in {root}: expected {root}/<class>/<image> files ({', '.join(IMAGE_SUFFIXES)})")
    return ImageTree(Path(root), tuple(name for name, _ in classes), tuple(walk.files))


# ---- token files -------------------------------------------------------------------------------------------

def token_layout(path: str | Path, what: str = "token file") -> TokenLayout:
    """The ids of a token file: a ``.npy`` array of integers (its header parsed here) or raw uint16 (nanoGPT's
    ``.bin``); one line for anything else."""
    from meshscale.safe_io import input_file

    real = data_root(path, what)
    shown = one_line(str(path))
    suffix = Path(str(path)).suffix.lower() or Path(real).suffix.lower()  # a link may name a blob
    if suffix not in TOKEN_SUFFIXES:
        raise MeshscaleError(f"{what} {shown}: not a token file; use a .npy array of integer ids or a uint16 .bin "
                             "file (nanoGPT's)")
    info = os.stat(input_file(real, f"{what} (.npy or .bin of token ids)"))
    check_not_sparse(real, info)
    if suffix == ".bin":
        if info.st_size == 0 or info.st_size % 2:
            raise MeshscaleError(f"{what} {shown}: {info.st_size} bytes is not a whole number of uint16 token ids")
        return TokenLayout(Path(real), "<u2", info.st_size // 2, 0, info.st_size)
    dtype, count, offset = _npy_header(real, shown, what)
    if offset + count * int(dtype[-1]) > info.st_size:
        raise MeshscaleError(f"{what} {shown}: the header says {count:,} ids of {dtype} but the file holds "
                             f"{info.st_size:,} bytes: truncated")
    return TokenLayout(Path(real), dtype, count, offset, info.st_size)


def _npy_header(path: str, shown: str, what: str) -> tuple[str, int, int]:
    """(dtype, count, data offset) from a .npy header, by numpy's format (numpy/lib/format.py): magic, major and
    minor version, the header's length (2 bytes in version 1, 4 in 2 and 3), then a dict literal."""
    def bad(why: str) -> MeshscaleError:
        return MeshscaleError(f"{what} {shown}: not a readable .npy array of token ids ({why})")

    with open(path, "rb") as f:
        head = f.read(12)
        if len(head) < 10 or not head.startswith(NPY_MAGIC):
            raise bad("no .npy magic at its start")
        major = head[6]
        if major not in (1, 2, 3):
            raise bad(f"format version {major}; numpy writes 1 to 3")
        size_bytes = 2 if major == 1 else 4
        if len(head) < 8 + size_bytes:
            raise bad("truncated header")
        header_len = int.from_bytes(head[8:8 + size_bytes], "little")
        offset = 8 + size_bytes + header_len
        if header_len > MAX_NPY_HEADER_BYTES:
            raise bad(f"a header of {header_len:,} bytes, above numpy's {MAX_NPY_HEADER_BYTES:,}")
        f.seek(8 + size_bytes)
        raw = f.read(header_len)
    if len(raw) < header_len:
        raise bad("truncated header")
    try:
        text = raw.decode("utf-8" if major == 3 else "latin1")
    except UnicodeDecodeError:
        raise bad("a header that is not text") from None
    fields = _npy_fields(text.strip(), bad)
    descr = fields.get("descr", "").strip("'\"")
    if set(fields) != {"descr", "fortran_order", "shape"}:
        raise bad("a header without descr, fortran_order and shape")
    kind = _NPY_DESCR.fullmatch(descr)
    if kind is None:
        raise MeshscaleError(f"{what} {shown}: holds an array of {one_line(descr)[:40]!r}; give a flat array of "
                             "integer token ids")
    if not fields["shape"].startswith("("):
        raise bad("shape is not a tuple")
    dims = [d for d in re.split(r"[\s,()]+", fields["shape"]) if d]
    if len(dims) != 1 or not is_digits(dims[0]):
        raise MeshscaleError(f"{what} {shown}: holds a {len(dims)}-d array; give a flat array of integer token ids")
    order = ">" if descr.startswith(">") else "<"  # '=' (native) and '|' (one byte) on little-endian hosts
    return f"{order}{kind.group(1)}{kind.group(2)}", int(dims[0]), offset


def _npy_fields(text: str, bad) -> dict[str, str]:
    """The header's dict literal as {key: value text}, each value a string, a boolean or a tuple of integers."""
    if not (text.startswith("{") and text.endswith("}")):
        raise bad("a header that is not a dict")
    body, fields, at = text[1:-1].strip(), {}, 0
    while at < len(body):
        item = _NPY_ITEM.match(body, at)
        if item is None:
            raise bad("a header that is not descr, fortran_order and shape")
        if item.group(1) in fields:
            raise bad(f"{item.group(1)} given twice")
        fields[item.group(1)] = item.group(2)
        at = item.end()
    if fields.get("fortran_order", "False") not in ("True", "False"):
        raise bad("fortran_order is not True or False")
    return fields
