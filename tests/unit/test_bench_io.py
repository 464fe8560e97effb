"""`meshscale bench io` on a generated ImageFolder of tiny JPEGs and a token file: every byte is read once per
pass whatever the number of readers, decoding goes through the training data path, the verdict is the slowest
stage, and the cache rule applies only to a data set larger than memory."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from meshscale.bench import io
from meshscale.errors import MeshscaleError
from meshscale.results import Result

IMAGES_PER_CLASS, CLASSES = 60, 5  # 300 JPEGs


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    from PIL import Image
    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for c in range(CLASSES):
        (root / f"class{c}").mkdir()
        for i in range(IMAGES_PER_CLASS):
            side = int(rng.integers(8, 40))  # sizes vary: the byte count is the oracle, not a file count
            Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)).save(root / f"class{c}" / f"{i}.jpg")
    (root / "class0" / "notes.txt").write_text("not an image")
    return root


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    path = tmp_path_factory.mktemp("tokens") / "tokens.npy"
    np.save(path, np.random.default_rng(1).integers(0, 256, 50_000).astype(np.uint16))
    return path


def _bytes_on_disk(root) -> int:
    return sum(f.stat().st_size for f in root.rglob("*.jpg"))


@pytest.mark.parametrize("readers", [1, 3])
def test_each_pass_reads_every_image_byte_once(images, readers):
    data = io.scan(images)
    assert data.kind == "images" and data.samples == len(data.files) == CLASSES * IMAGES_PER_CLASS
    assert data.total_bytes == _bytes_on_disk(images)
    for evict_first in (True, False):
        rate = io.read_pass(data, readers, "x", timeout_s=60, evict_first=evict_first)
        assert rate.total_bytes == data.total_bytes and rate.files == data.samples and rate.readers == readers
        assert rate.bytes_per_s > 0


@pytest.mark.parametrize("readers", [1, 2, 3])
def test_a_token_file_split_into_byte_ranges_is_read_whole(tokens, readers):
    data = io.scan(tokens, seq_len=32)
    assert data.kind == "tokens" and data.total_bytes == os.path.getsize(tokens)
    assert data.samples == (50_000 - 1) // 32
    rate = io.read_pass(data, readers, "x", timeout_s=60)
    assert rate.total_bytes == data.total_bytes


def test_decoding_goes_through_the_training_data_path(images, tokens):
    data = io.scan(images)
    decoded = io.decode_rate(data, 2, (3, 16, 16), 10, timeout_s=60, max_samples=40)
    assert decoded.samples == 40 and decoded.samples_per_s > 0 and decoded.what == "3x16x16 float32"
    words = io.decode_rate(io.scan(tokens, 32), 2, (32,), 256, timeout_s=60)
    assert words.samples == (50_000 - 1) // 32


def _report(images, demand_per_s: float | None, memory_bytes: int | None = None):
    report = io.bench_io(io.IoSpec(images, readers=2, sample_shape=(3, 16, 16), max_decode_samples=60, timeout_s=60),
                         io.Demand(demand_per_s, "stated", True) if demand_per_s else None)
    if memory_bytes is not None:
        report.memory_bytes = memory_bytes
    return report


def test_the_limit_is_the_slowest_stage(images):
    report = _report(images, demand_per_s=1e12)  # no pipeline feeds that
    rates = report.rates()
    assert set(rates) == {"storage", "decoding", "GPUs"}
    assert report.limit == min(rates, key=rates.get) != "GPUs"
    slow = _report(images, demand_per_s=1e-3)
    assert slow.limit == "GPUs"
    assert any(line.startswith("limit: GPUs") for line in io.report_lines(slow))


def test_the_cache_rule_applies_only_beyond_memory(images):
    small = _report(images, demand_per_s=100.0)
    assert small.fits_in_memory and small.storage_rate is small.cached and not small.cache().needed
    big = _report(images, demand_per_s=100.0, memory_bytes=1000)
    cache = big.cache()
    assert not big.fits_in_memory and big.storage_rate is big.first
    assert cache.needed and cache.cache_bytes == big.data.total_bytes
    assert cache.read_bytes_per_s == pytest.approx(100.0 * big.data.bytes_per_sample)
    assert cache.dgx1_keeps_up and not cache.staged_on_dgx1
    assert any("local cache (DGX-1 whitepaper rule)" in line for line in io.report_lines(big))


def test_a_measured_train_result_is_the_demand(tmp_path):
    path = Result("train", [], False, {"summary": {"samples_per_s": 1234.5, "world_size": 2, "batch_per_rank": 8},
                                       "config": {"model": "small-cnn"}}).save(tmp_path / "t.json")
    demand = io.measured_demand(path)
    assert demand.samples_per_s == 1234.5 and not demand.predicted and "small-cnn" in demand.source
    with pytest.raises(MeshscaleError, match="prediction"):
        io.measured_demand(Result("predict", [{"world_size": 8, "throughput_samples_per_s": 1.0}], True).save(tmp_path / "p.json"))


def test_the_command_writes_a_result_with_the_verdict(cli, images, tmp_path):
    out = tmp_path / "io.json"
    r = cli("bench", "io", images, "--model", "small-cnn", "--system", "hgx-h100", "--gpus", "8", "--batch", "256",
            "--decode-samples", "40", "--json", out)
    assert r.exit_code == 0, r.output
    assert "GPUs (PREDICTED)" in r.stdout and "limit:" in r.stdout
    saved = json.loads(out.read_text())
    assert saved["kind"] == "bench-io" and saved["meta"]["limit"] in ("storage", "decoding", "GPUs")
    assert [row["stage"] for row in saved["rows"]] == ["read (first pass)", "read (cached pass)", "decode", "GPUs"]


@pytest.mark.parametrize("make, message", [
    (lambda p: p / "missing", "does not exist"),
    (lambda p: (p / "empty").mkdir() or p / "empty", "no images"),
    (lambda p: (p / "x.txt").write_text("x") and p / "x.txt", "not a token file"),
    (lambda p: np.save(p / "short.npy", np.arange(5, dtype=np.uint16)) or p / "short.npy", "fewer than one sequence"),
])
def test_bad_data_sets_are_one_line_and_exit_2(cli, tmp_path, make, message):
    r = cli("bench", "io", make(tmp_path), "--no-decode")
    assert r.exit_code == 2 and message in r.stderr and r.stderr.count("\n") == 1, r.output


def test_an_unreadable_path_is_refused(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads everything")
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0)
    try:
        with pytest.raises(MeshscaleError, match="not readable"):
            io.scan(folder)
    finally:
        folder.chmod(0o755)


def test_an_image_folder_for_a_token_model_is_refused(images):
    with pytest.raises(MeshscaleError, match="pick a model"):
        io.bench_io(io.IoSpec(images, sample_shape=(32,), decode=False))


def test_the_report_shows_the_rates_side_by_side(images, tmp_path):
    from meshscale.report.html import load_sources, render

    report = _report(images, demand_per_s=1e12)
    path = io.io_result(report).save(tmp_path / "io.json")
    page = render(load_sources([path]))
    assert f"the limit is {report.limit}" in page
    assert all(stage in page for stage in ("read (first pass)", "read (cached pass)", "decode", "GPUs (PREDICTED)"))


def _stuck(*_):
    import time
    time.sleep(60)


def test_a_stuck_reader_ends_at_the_timeout_and_is_killed():
    import time
    start = time.monotonic()
    with pytest.raises(MeshscaleError, match="longer than 0.5 s"):
        io._run(_stuck, [(), ()], 0.5, "the test pass")
    assert time.monotonic() - start < 10


def test_format_rate_gives_decimal_byte_units_and_counted_rates():
    from meshscale.units import format_rate
    for per_s in (512.0, 4.5e3, 262.4e6, 2e9, 3.2e12):
        number, unit = format_rate(per_s).split()
        factor = {"B/s": 1, "kB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12}[unit]
        assert 1 <= float(number) < 1000 or unit == "TB/s"
        assert float(number) * factor == pytest.approx(per_s, rel=0.01)  # decimal units, not binary
    assert format_rate(1234.5, "samples") == "1,234 samples/s"


def test_every_rate_bench_io_prints_carries_its_unit(images):
    import re
    from io import StringIO

    from rich.console import Console

    from meshscale.bench.tables import io_table
    report = _report(images, demand_per_s=100.0, memory_bytes=1000)  # every line: demand, limit, cache
    console = Console(width=200, record=True, file=StringIO())
    console.print(io_table(report))
    text = console.export_text() + "\n".join(io.report_lines(report))
    assert not re.search(r"\d[KMGT]/s", text)  # no unitless binary rate such as 262.4M/s
    assert re.search(r"\d (k|M|G)?B/s", text) and re.search(r"\d samples/s", text) and re.search(r"\d files/s", text)
    assert "GPU demand: 100 samples/s = " in text
