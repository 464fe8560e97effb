"""`meshscale bench io`: does the input pipeline keep the GPUs fed? Three rates side by side, in samples/s:

- storage: N reader processes read every file of the data set (a folder of images, one file a sample, or a
  token file split into N byte ranges), once after asking the kernel to drop the files from its page cache
  (the first pass: what the disk or network file system gives) and once more (the cached pass);
- decoding: N processes turn files into training samples through the training loop's own data path
  (`meshscale.execute.datasets`: PIL decode and resize for images, windows of ids for tokens);
- the GPUs: samples/s of a training run, predicted (`--model --system --gpus --batch`) or measured (a `train`
  result), times bytes per sample.

The smallest is the limit. For a data set larger than memory the page cache cannot serve later epochs, and the
DGX-1 whitepaper's rule applies: cache the whole working set on local SSDs whose streaming rate covers the GPUs'
demand (DGX-1: 4x 1.92 TB SAS SSD in RAID 0, 7.6 TB, 2 GB/s); a larger working set is staged through that cache
in the background during each epoch, so the source must then deliver the demand itself.
"""
from __future__ import annotations

import math
import os
import signal
import stat
import time
from dataclasses import asdict, dataclass, field
from multiprocessing import TimeoutError, get_context
from pathlib import Path

from meshscale.errors import MeshscaleError, one_line

READ_CHUNK_BYTES = 8 << 20   # one read call: large enough that the call overhead is negligible
DECODE_BATCH = 16            # samples fetched per call, like a data-loader worker's batch
# DGX-1 whitepaper (seed 000, section 2): 4x 1.92 TB SAS SSD as RAID 0, 7.6 TB, 2 GB/s streaming reads
DGX1_CACHE_BYTES = 4 * 1.92e12
DGX1_CACHE_READ_BYTES_PER_S = 2.0e9


@dataclass(frozen=True)
class DataFiles:
    """A data set as found on disk: its files, their total size, and what one training sample costs to read."""

    root: Path
    kind: str                    # "images" (one file a sample, ImageFolder layout) or "tokens" (one file)
    files: tuple[str, ...]
    total_bytes: int
    samples: int
    bytes_per_sample: float
    classes: int = 0


@dataclass(frozen=True)
class PassRate:
    """One read pass over the data set by ``readers`` processes."""

    label: str
    files: int
    total_bytes: int
    seconds: float
    readers: int
    evicted: bool = False        # the kernel was asked to drop the files from its cache first

    @property
    def files_per_s(self) -> float:
        return self.files / self.seconds

    @property
    def bytes_per_s(self) -> float:
        return self.total_bytes / self.seconds


@dataclass(frozen=True)
class DecodeRate:
    samples: int
    seconds: float
    readers: int
    what: str                    # what one sample became, e.g. "3x224x224 float32"

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.seconds


@dataclass(frozen=True)
class Demand:
    """What a training run consumes: samples/s and where the figure comes from."""

    samples_per_s: float
    source: str
    predicted: bool


@dataclass(frozen=True)
class CacheAdvice:
    """The local cache the DGX-1 whitepaper's rule implies for a data set larger than memory."""

    needed: bool                 # the data set does not fit in memory (the page cache cannot hold it)
    cache_bytes: float           # the whole working set
    read_bytes_per_s: float      # the cache's streaming rate must cover the GPUs' demand
    staged_on_dgx1: bool         # larger than a DGX-1's 7.6 TB: staged through it during each epoch
    dgx1_keeps_up: bool          # a DGX-1's 2 GB/s covers the demand


@dataclass
class IoReport:
    data: DataFiles
    memory_bytes: int
    first: PassRate
    cached: PassRate
    decode: DecodeRate | None
    demand: Demand | None
    notes: list[str] = field(default_factory=list)

    def storage_samples_per_s(self, rate: PassRate) -> float:
        return rate.total_bytes / self.data.bytes_per_sample / rate.seconds

    @property
    def fits_in_memory(self) -> bool:
        return self.data.total_bytes < self.memory_bytes

    @property
    def storage_rate(self) -> PassRate:
        """The pass that every epoch after the first sees: the cached one while the page cache holds the set."""
        return self.cached if self.fits_in_memory else self.first

    def rates(self) -> dict[str, float]:
        """samples/s of each stage that was measured or stated: storage, decoding, GPUs."""
        out = {"storage": self.storage_samples_per_s(self.storage_rate)}
        if self.decode:
            out["decoding"] = self.decode.samples_per_s
        if self.demand:
            out["GPUs"] = self.demand.samples_per_s
        return out

    @property
    def limit(self) -> str:
        rates = self.rates()
        return min(rates, key=rates.get)

    def cache(self) -> CacheAdvice | None:
        if self.demand is None:
            return None
        need = self.demand.samples_per_s * self.data.bytes_per_sample
        return CacheAdvice(not self.fits_in_memory, float(self.data.total_bytes), need,
                           self.data.total_bytes > DGX1_CACHE_BYTES, need <= DGX1_CACHE_READ_BYTES_PER_S)


# ---- the data set ---------------------------------------------------------------------------------------

def scan(path: str | Path, seq_len: int = 1024, budget_s: float | None = None) -> DataFiles:
    """The data set at ``path``: a folder of images in the ImageFolder layout, or a token file (.npy or uint16
    .bin, read in windows of ``seq_len`` + 1 ids). Found within `execute.data_files`' limits (files, classes,
    depth, links kept inside the data set, the walk's time: at most ``budget_s`` when given)."""
    from meshscale.execute.data_files import WALK_BUDGET_S, data_root, token_layout, walk_images

    root = Path(data_root(path, "bench io"))
    if not root.is_dir():
        layout = token_layout(path)
        tokens = layout.count
        if tokens <= seq_len:
            raise MeshscaleError(f"token file {path} holds {tokens} tokens, fewer than one sequence of {seq_len + 1}")
        samples = (tokens - 1) // seq_len
        return DataFiles(Path(path), "tokens", (str(layout.path),), layout.file_bytes, samples,
                         layout.file_bytes / samples)
    tree = walk_images(root, min(WALK_BUDGET_S, budget_s or WALK_BUDGET_S), "bench io")
    total = tree.total_bytes
    files = tuple(f for f, _, _ in tree.files)
    return DataFiles(tree.root, "images", files, total, len(files), total / len(files), len(tree.classes))


def memory_bytes() -> int:
    """This machine's physical memory (the most the page cache can ever hold)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# ---- reading ----------------------------------------------------------------------------------------------

def _open_regular(path: str) -> int:
    """A descriptor of the regular file ``path``, opened without blocking (a pipe swapped in since the walk is
    refused, never waited on)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise MeshscaleError(f"{path}: no longer a regular file; meshscale reads regular files only")
    os.set_blocking(fd, True)
    return fd


def evict(files: tuple[str, ...]) -> bool:
    """Ask the kernel to drop ``files`` from its page cache (clean pages go; no root needed). False where the
    platform has no posix_fadvise."""
    if not hasattr(os, "posix_fadvise"):
        return False
    for f in files:
        fd = _open_regular(f)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def _read_share(pieces: list[tuple[str, int, int]]) -> tuple[float, float, int]:
    """Read each (path, offset, length) piece (-1: to the end); (start, end, bytes) on the monotonic clock."""
    start = time.monotonic()
    done = 0
    for path, offset, length in pieces:
        with os.fdopen(_open_regular(path), "rb", buffering=0) as f:
            f.seek(offset)
            left = length
            while left != 0:
                chunk = f.read(READ_CHUNK_BYTES if left < 0 else min(left, READ_CHUNK_BYTES))
                if not chunk:
                    break
                done += len(chunk)
                left -= len(chunk) if left > 0 else 0
    return start, time.monotonic(), done


def _shares(data: DataFiles, readers: int) -> list[list[tuple[str, int, int]]]:
    """Each reader's pieces: every N-th file of a folder, or one of N byte ranges of a token file."""
    if data.kind == "images":
        return [[(str(f), 0, -1) for f in data.files[r::readers]] for r in range(readers)]
    step = -(-data.total_bytes // readers)
    return [[(str(data.files[0]), r * step, min(step, data.total_bytes - r * step))]
            for r in range(readers) if r * step < data.total_bytes]


def _one_thread() -> None:
    # the command's SIGTERM clean-up handler is Python: a child stuck in C would never run it, and terminate()
    # at the deadline could not end it
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        pass


def _run(work, shares: list[tuple], timeout_s: float, what: str) -> list:
    """``work(*share)`` for every share, one process each, within ``timeout_s`` in all; the processes are killed
    when it ends, so a stuck read cannot outlive the command. forkserver: the children are forked from a clean
    single-threaded server (a plain fork of this threaded process can inherit a lock some thread held and hang);
    they run one thread each."""
    context = get_context("forkserver")
    context.set_forkserver_preload(["torch", __name__])  # the server imports them once, each child has them
    pool = context.Pool(len(shares), initializer=_one_thread)
    try:
        pending = [pool.apply_async(work, share) for share in shares]
        deadline = time.monotonic() + timeout_s
        return [p.get(timeout=max(0.0, deadline - time.monotonic())) for p in pending]
    except TimeoutError:
        raise MeshscaleError(f"{what} took longer than {timeout_s:g} s; raise --timeout-s or read a smaller data set") from None
    except MeshscaleError:  # a worker's own one line (an image it could not decode, a file swapped)
        raise
    except Exception as exc:  # whatever else a worker met (the file system, memory): one line
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise MeshscaleError(f"{what} failed: {type(exc).__name__}: {one_line(first)}") from None
    finally:
        pool.terminate()
        pool.join()


def read_pass(data: DataFiles, readers: int, label: str, timeout_s: float, evict_first: bool = False) -> PassRate:
    """Read the whole data set once with ``readers`` processes; the pass lasts from the first reader's start to
    the last one's end (process start-up excluded)."""
    evicted = evict(data.files) if evict_first else False
    shares = _shares(data, readers)
    spans = _run(_read_share, [(s,) for s in shares], timeout_s, f"the {label} pass")
    seconds = max(e for _, e, _ in spans) - min(s for s, _, _ in spans)
    return PassRate(label, len(data.files), sum(b for _, _, b in spans), max(seconds, 1e-9), len(shares), evicted)


# ---- decoding ---------------------------------------------------------------------------------------------

def _decode_share(root: str, kind: str, indices: list[int], sample_shape: tuple[int, ...],
                  vocab: int) -> tuple[float, float, int]:
    """Turn ``indices`` into training samples through the training loop's own data path."""
    import numpy as np

    from meshscale.execute.datasets import image_folder, token_file

    data = (image_folder(root, tuple(sample_shape[1:])) if kind == "images"
            else token_file(root, sample_shape[0], vocab))
    start = time.monotonic()
    for k in range(0, len(indices), DECODE_BATCH):
        data.fetch(np.asarray(indices[k:k + DECODE_BATCH]))
    return start, time.monotonic(), len(indices)


def _decode_indices(data: DataFiles, max_samples: int | None) -> list[int]:
    """The samples decoding times: the first ``max_samples`` spread evenly over the set."""
    n = data.samples if max_samples is None else min(max_samples, data.samples)
    stride = data.samples / n
    return [int(i * stride) for i in range(n)]


def decode_rate(data: DataFiles, readers: int, sample_shape: tuple[int, ...], vocab: int, timeout_s: float,
                max_samples: int | None = None) -> DecodeRate:
    """Samples/s that ``readers`` processes make out of the files (the first ``max_samples``, spread evenly)."""
    chosen = _decode_indices(data, max_samples)
    n = len(chosen)
    shares = [chosen[r::readers] for r in range(readers) if chosen[r::readers]]
    spans = _run(_decode_share, [(str(data.root), data.kind, s, tuple(sample_shape), vocab) for s in shares],
                 timeout_s, "decoding")
    seconds = max(e for _, e, _ in spans) - min(s for s, _, _ in spans)
    what = "x".join(map(str, sample_shape)) + (" float32" if data.kind == "images" else " token ids")
    return DecodeRate(n, max(seconds, 1e-9), len(shares), what)


# ---- demand -------------------------------------------------------------------------------------------------

def measured_demand(path: str | Path) -> Demand:
    """Samples/s of a measured run: a `train` result (its summary) or a `scale` result (its largest world)."""
    from meshscale.results import load_result

    result = load_result(path)
    if result.predicted:
        raise MeshscaleError(f"{path} is a prediction; give a measured `train` or `scale` result (or use --model)")
    if result.kind == "train" and (result.meta.get("summary") or {}).get("samples_per_s"):
        s = result.meta["summary"]
        config = result.meta.get("config") or {}
        return Demand(float(s["samples_per_s"]), f"measured: {config.get('model', '?')} on {s.get('world_size', '?')} "
                      f"worker(s), batch {s.get('batch_per_rank', '?')} per worker ({Path(path).name})", False)
    if result.kind == "scale" and result.rows:
        row = max(result.rows, key=lambda r: r["world_size"])
        return Demand(float(row["throughput_samples_per_s"]), f"measured: {result.meta.get('model', '?')} on "
                      f"{row['world_size']} worker(s) ({Path(path).name})", False)
    raise MeshscaleError(f"{path}: kind {result.kind!r} has no measured samples/s; give a `meshscale train --json` "
                         "or `meshscale scale --json` result")


# ---- the whole benchmark --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class IoSpec:
    path: str | Path
    readers: int = 2
    sample_shape: tuple[int, ...] | None = None   # None: 3x224x224 images, 1024-id token windows
    vocab: int = 1 << 16
    decode: bool = True
    max_decode_samples: int | None = 2000
    timeout_s: float = 600.0


def bench_io(spec: IoSpec, demand: Demand | None = None) -> IoReport:
    """Both read passes, the decode rate, and the report that sets them beside ``demand``."""
    seq_len = spec.sample_shape[0] if spec.sample_shape and len(spec.sample_shape) == 1 else 1024
    data = scan(spec.path, seq_len, spec.timeout_s)
    shape = spec.sample_shape or ((3, 224, 224) if data.kind == "images" else (seq_len,))
    if (len(shape) == 1) != (data.kind == "tokens"):
        raise MeshscaleError(f"{data.root} holds {data.kind} but the model takes "
                             f"{'tokens' if len(shape) == 1 else 'images'}; pick a model of the data set's kind")
    from meshscale.execute.datasets import check_image_headers  # imported once here: the decoders start without it

    if data.kind == "images" and spec.decode:  # the images decoding will open, checked before the passes
        check_image_headers([data.files[i] for i in _decode_indices(data, spec.max_decode_samples)])

    first = read_pass(data, spec.readers, "first", spec.timeout_s, evict_first=True)
    cached = read_pass(data, spec.readers, "cached", spec.timeout_s)
    decode = (decode_rate(data, spec.readers, shape, spec.vocab, spec.timeout_s, spec.max_decode_samples)
              if spec.decode else None)
    notes = []
    if not first.evicted:
        notes.append("this platform cannot drop files from the page cache: the first pass may be a cached one")
    return IoReport(data, memory_bytes(), first, cached, decode, demand, notes)


def io_result(report: IoReport):
    """The report as a measured Result of kind bench-io: one row per stage, the verdict in meta."""
    from meshscale.results import measured

    d = report.data
    rows = [{"stage": f"read ({p.label} pass)", "readers": p.readers, "files": p.files, "total_bytes": p.total_bytes,
             "time_s": p.seconds, "files_per_s": p.files_per_s, "read_bytes_per_s": p.bytes_per_s,
             "samples_per_s": report.storage_samples_per_s(p)} for p in (report.first, report.cached)]
    if report.decode:
        rows.append({"stage": "decode", "readers": report.decode.readers, "count": report.decode.samples,
                     "time_s": report.decode.seconds, "samples_per_s": report.decode.samples_per_s})
    if report.demand:
        rows.append({"stage": "GPUs", "samples_per_s": report.demand.samples_per_s, "predicted": report.demand.predicted,
                     "read_bytes_per_s": report.demand.samples_per_s * d.bytes_per_sample})
    cache = report.cache()
    return measured("bench-io", rows, path=str(d.root), data_kind=d.kind, samples=d.samples, dataset_bytes=d.total_bytes,
                    bytes_per_sample=d.bytes_per_sample, memory_bytes=report.memory_bytes, limit=report.limit,
                    demand_source=report.demand.source if report.demand else None,
                    cache=None if cache is None else asdict(cache), notes=report.notes)


def report_lines(report: IoReport) -> list[str]:
    """The verdict in words: which stage limits, by how much, and the cache the data set needs."""
    from meshscale.units import format_bytes, format_rate

    d = report.data
    rates = report.rates()
    where = "in" if report.fits_in_memory else "larger than"
    lines = [f"data set: {d.samples:,} samples in {len(d.files):,} file(s), {format_bytes(d.total_bytes)} "
             f"({format_bytes(d.bytes_per_sample)} per sample), {where} this machine's memory "
             f"({format_bytes(report.memory_bytes)}): later epochs read from "
             f"{'the page cache (cached pass)' if report.fits_in_memory else 'storage (first pass)'}"]
    if report.demand:
        lines.append(f"GPU demand: {format_rate(report.demand.samples_per_s, 'samples')} = "
                     f"{format_rate(report.demand.samples_per_s * d.bytes_per_sample)} ({report.demand.source})")
    limit = report.limit
    if len(rates) > 1:
        others = sorted((v, k) for k, v in rates.items() if k != limit)
        lines.append(f"limit: {limit} ({format_rate(rates[limit], 'samples')}; next {others[0][1]} at "
                     f"{format_rate(others[0][0], 'samples')}, {others[0][0] / rates[limit]:.1f}x)")
        if limit != "GPUs" and report.demand:
            lines.append(f"  the GPUs would wait for data: {limit} delivers {rates[limit] / rates['GPUs']:.0%} "
                         f"of the demand")
        if limit == "decoding" and report.demand:  # decoding is per-core work: it scales with the processes
            per_process = report.decode.samples_per_s / report.decode.readers
            lines.append(f"  at {format_rate(per_process, 'samples')} per decoding process, the demand needs "
                         f"{math.ceil(rates['GPUs'] / per_process)} processes (cores) decoding")
    cache = report.cache()
    if cache and cache.needed:
        staged = ("larger than a DGX-1's 7.6 TB SSD cache: staged through it during each epoch, so the source itself "
                  "must deliver" if cache.staged_on_dgx1 else "it fits a DGX-1's 7.6 TB SSD cache, which must stream")
        lines.append(f"local cache (DGX-1 whitepaper rule): the whole working set, {format_bytes(cache.cache_bytes)}, "
                     f"on local SSD reading at least {format_rate(cache.read_bytes_per_s)}; {staged} "
                     f"{format_rate(cache.read_bytes_per_s)} ({'within' if cache.dgx1_keeps_up else 'beyond'} "
                     f"the DGX-1's {format_rate(DGX1_CACHE_READ_BYTES_PER_S)})")
    elif cache:
        lines.append("local cache: none needed, the data set fits in memory (the page cache serves every epoch "
                     "after the first)")
    return lines + [f"note: {n}" for n in report.notes]
