"""`meshscale validate`: the shipped corpus of measurements, its checks, the error summary, the CLI, the script
that appends nccl-tests output to the corpus, the acceptance bounds of the collective model,
and the model's choices against those NCCL logged (`validate --choices`)."""
import csv
import importlib.util
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from meshscale.errors import MeshscaleError
from meshscale.predict import validate as validation
from meshscale.predict.corpus_check import CORPORA
from meshscale.predict.validate import CORPUS_COLUMNS, corpus_path, load_corpus, validate_corpus
from meshscale.results import Result
from meshscale.topology.shipped import system_names

ROOT = Path(__file__).resolve().parents[2]
CORPUS_DIR = corpus_path().parent
MULTINODE = ROOT / "tests" / "fixtures" / "collectives-multinode.csv"  # kept apart: validate checks one node


def _script():
    spec = importlib.util.spec_from_file_location("corpus_from_nccl_tests", ROOT / "scripts" / "corpus_from_nccl_tests.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(**cells) -> dict:
    base = {"system": "hgx-h200", "gpus": "2", "nodes": "1", "collective": "all_reduce", "size_bytes": "1024",
            "inplace": "0", "time_us": "10", "busbw_GBps": "", "dtype": "float32", "nccl_version": "2.28.9",
            "algo": "", "proto": "", "nvls": "off", "gpus_per_thread": "2", "source": "a test", "note": ""}
    return {**base, **cells}


def _write(path: Path, rows: list[dict]) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CORPUS_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


class FakeModel:
    """price_call stand-in: time = ``factor(size)`` x the time in ``truth``, and a record of every call with the
    NCCL settings its fabric was given."""

    def __init__(self, truth: dict[int, float], factor):
        self.truth, self.factor, self.calls = truth, factor, []

    def __call__(self, fabric, call):
        threads = {"gpus_per_thread": fabric.nccl.gpus_per_thread} if fabric.nccl.gpus_per_thread != 1 else {}
        self.calls.append({"collective": call.collective, "ranks": list(call.ranks), "nbytes": call.nbytes,
                           "algorithm": fabric.algo, **fabric.nccl.given(), **threads})
        return SimpleNamespace(time_s=self.truth[call.nbytes] * self.factor(call.nbytes), detail="fake")


# ---- the shipped corpus ---------------------------------------------------------------------------------
def test_shipped_corpus_loads_and_every_row_is_valid():
    rows = load_corpus()
    assert len(rows) >= 300
    assert {m.system for m in rows} <= set(system_names())
    assert {"hgx-h200", "hgx-h100", "dgx-a100"} <= {m.system for m in rows}
    assert all(m.time_s > 0 and m.nodes == 1 and m.source for m in rows)
    # the project's own runs: every collective nccl-tests ran, both placements, 2 and 4 GPUs
    own = [m for m in rows if m.source.startswith("benchmarks/reference/")]
    assert len(own) == 2 * 6 * 11 * 2
    assert {m.collective for m in own} == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"}
    assert all(m.nvls == "off" and m.nccl_version == "2.28.9" and m.gpus_per_thread == m.gpus for m in own)
    assert {m.size_class for m in rows} == {"below 1 MiB", "1 MiB and up"}


def test_every_source_is_listed_in_sources_md_and_repo_paths_exist():
    listed = (CORPUS_DIR / "SOURCES.md").read_text()
    for path in (corpus_path(), MULTINODE):
        with path.open() as f:
            sources = {r["source"] for r in csv.DictReader(f)}
        for source in sources:
            assert source in listed, source
            if not source.startswith("http"):
                assert (ROOT / source).exists(), source


def test_multinode_rows_live_apart_and_validate_refuses_them():
    path = MULTINODE
    rows = load_corpus(path, multi_node=True)
    assert rows and all(m.nodes > 1 for m in rows)
    with pytest.raises(MeshscaleError, match=r"collectives-multinode\.csv, row 1 .*multi-node"):
        load_corpus(path)


def test_shipped_rows_are_what_the_script_makes_of_the_reference_files(tmp_path):
    script = _script()
    shipped = [r for r in csv.DictReader(corpus_path().open()) if r["source"].startswith("benchmarks/reference/")]
    made = []
    for n in (2, 4):
        source = f"benchmarks/reference/nccl-tests-h200x{n}.txt"
        made += script.corpus_rows(script.parse((ROOT / source).read_text()), "hgx-h200", source,
                                   {"NCCL_NVLS_ENABLE": "0"})
    keys = ("gpus", "collective", "size_bytes", "inplace", "time_us", "busbw_GBps", "nccl_version", "nvls",
            "gpus_per_thread")
    assert [tuple(str(r[k]) for k in keys) for r in made] == [tuple(r[k] for k in keys) for r in shipped]


# ---- bad corpus rows: one line naming the file and the row, exit 2 --------------------------------------
@pytest.mark.parametrize("cells,message", [
    ({"system": "dgx-9000"}, "unknown system 'dgx-9000'"),
    ({"size_bytes": ""}, "missing size_bytes"),
    ({"time_us": "", "busbw_GBps": ""}, "missing time_us and busbw_GBps"),
    ({"time_us": "0"}, "time_us '0' must be positive"),
    ({"time_us": "", "busbw_GBps": "-3"}, "busbw_GBps '-3' must be positive"),
    ({"time_us": "fast"}, "time_us 'fast' is not a number"),
    ({"collective": "all_mix"}, "unknown collective 'all_mix'"),
    ({"gpus": "16"}, "gpus 16: 1 x hgx-h200 has only 8"),
    ({"inplace": "maybe"}, "inplace 'maybe' must be 0"),
    ({"proto": "LL256"}, "proto 'LL256' is not one of"),
    ({"gpus_per_thread": "0"}, "gpus_per_thread '0' must be positive"),
])
def test_bad_row_is_one_line_naming_file_and_row(cli, tmp_path, cells, message):
    corpus = _write(tmp_path / "bad.csv", [_row(), _row(**cells)])
    result = cli("validate", "--corpus", corpus)
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output
    assert f"{corpus}, row 2 (line 3): {message}" in lines[0]


def test_a_file_that_is_not_a_corpus_says_so(cli, tmp_path):
    other = tmp_path / "other.csv"
    other.write_text("size,time\n1024,3\n")
    result = cli("validate", "--corpus", other)
    assert result.exit_code == 2 and "not a corpus file" in result.stderr


# ---- the summary ------------------------------------------------------------------------------------------
def _small_corpus(tmp_path) -> Path:
    return _write(tmp_path / "corpus.csv", [
        _row(size_bytes="1024", time_us="10"),
        _row(size_bytes="1024", time_us="10", inplace="1"),  # same prediction as the row above: one call
        _row(size_bytes="4096", time_us="20", algo="ring", proto="LL", nvls=""),
        _row(size_bytes="2097152", time_us="100"),
        _row(system="dgx-a100", gpus="8", size_bytes="8388608", time_us="", busbw_GBps="175", nccl_version="",
             nvls="on", gpus_per_thread=""),
    ])


TRUTH = {1024: 10e-6, 4096: 20e-6, 2097152: 100e-6, 8388608: 8388608 * 1.75 / 175e9}


def test_summary_math_and_what_the_model_is_asked(tmp_path, monkeypatch):
    model = FakeModel(TRUTH, lambda n: {1024: 1.2, 4096: 1 / 1.1, 2097152: 1.05, 8388608: 0.9}[n])
    monkeypatch.setattr(validation, "price_call", model)
    result = validate_corpus(_small_corpus(tmp_path))
    assert result.kind == "validate" and result.predicted
    assert [round(r["error"], 6) for r in result.rows] == [0.2, 0.2, round(1 / 1.1 - 1, 6), 0.05, -0.1]
    busbw_row = result.rows[-1]
    assert busbw_row["basis"] == "busbw" and busbw_row["measured_time_s"] == pytest.approx(8388608 * 1.75 / 175e9)
    summary = result.meta["summary"]
    # below 1 MiB: |ln 1.2| twice and |ln 1/1.1|; 1 MiB and up: |ln 1.05| and |ln 0.9|
    small = math.exp((2 * math.log(1.2) + math.log(1.1)) / 3) - 1
    assert summary["groups"]["below 1 MiB"]["geomean_abs_error"] == pytest.approx(small)
    large = math.exp((math.log(1.05) + abs(math.log(0.9))) / 2) - 1
    assert summary["groups"]["1 MiB and up"]["geomean_abs_error"] == pytest.approx(large)
    assert summary["groups"]["below 1 MiB"]["passed"] and not summary["groups"]["1 MiB and up"]["passed"]
    assert summary["worst_times_off"] == pytest.approx(1.2) and summary["worst_row"] == 1
    assert not summary["passed"] and summary["unpredicted"] == 0
    assert {(s["system"], s["size_class"]) for s in summary["breakdown"]} == {
        ("hgx-h200", "below 1 MiB"), ("hgx-h200", "1 MiB and up"), ("dgx-a100", "1 MiB and up")}
    # one prediction per distinct row; NCCL's knobs only where the row records them
    assert len(model.calls) == 4
    first, forced, _, a100 = model.calls
    assert first == {"collective": "all_reduce", "ranks": [0, 1], "nbytes": 1024, "algorithm": "nccl",
                     "nccl_version": "2.28.9", "nvls": False, "gpus_per_thread": 2}
    assert forced["nccl_algo"] == "ring" and forced["proto"] == "LL" and "nvls" not in forced
    assert a100["ranks"] == list(range(8)) and a100.get("nccl_version") is None
    assert "nvls" not in a100 and "gpus_per_thread" not in a100


def test_within_bounds_passes_and_a_row_the_model_cannot_do_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(validation, "price_call", FakeModel(TRUTH, lambda n: 1.01))
    assert validate_corpus(_small_corpus(tmp_path)).meta["summary"]["passed"]

    def refuses(fabric, call):
        if call.nbytes == 4096:
            raise MeshscaleError("no algorithm applies")
        return SimpleNamespace(time_s=TRUTH[call.nbytes], detail="")
    monkeypatch.setattr(validation, "price_call", refuses)
    result = validate_corpus(_small_corpus(tmp_path))
    assert result.meta["summary"]["unpredicted"] == 1 and not result.meta["summary"]["passed"]
    assert result.rows[2]["ratio"] is None and result.rows[2]["problem"] == "no algorithm applies"


def test_worst_row_beyond_twice_fails_even_when_the_geomeans_pass(tmp_path, monkeypatch):
    rows = [_row(size_bytes=str(1 << 20), time_us="100")] * 40 + [_row(size_bytes=str(1 << 21), time_us="100")]
    corpus = _write(tmp_path / "c.csv", rows)
    monkeypatch.setattr(validation, "price_call",
                        FakeModel({1 << 20: 100e-6, 1 << 21: 100e-6}, lambda n: 1.0 if n == 1 << 20 else 2.1))
    summary = validate_corpus(corpus).meta["summary"]
    assert summary["groups"]["1 MiB and up"]["passed"] and summary["worst_times_off"] == pytest.approx(2.1)
    assert not summary["passed"]


# ---- the command -----------------------------------------------------------------------------------------
def test_cli_system_filter_json_and_exit_codes(cli, tmp_path, monkeypatch):
    corpus = _small_corpus(tmp_path)
    monkeypatch.setattr(validation, "price_call", FakeModel(TRUTH, lambda n: 1.01))
    out = tmp_path / "v.json"
    result = cli("validate", "--corpus", corpus, "--system", "dgx-a100", "--json", out)
    assert result.exit_code == 0, result.output
    assert "within bounds" in result.stdout and "exp(mean |ln(predicted / measured)|) - 1" in result.stdout
    saved = json.loads(out.read_text())
    assert saved["kind"] == "validate" and saved["predicted"] is True
    assert [r["system"] for r in saved["rows"]] == ["dgx-a100"]
    assert saved["meta"]["filters"] == {"system": "dgx-a100", "collective": None}
    assert saved["meta"]["summary"]["passed"] is True

    monkeypatch.setattr(validation, "price_call", FakeModel(TRUTH, lambda n: 1.5))
    result = cli("validate", "--corpus", corpus, "--collective", "all-reduce", "--all")
    assert result.exit_code == 1 and "outside the bounds" in result.stdout
    assert "every row of 5" in result.stdout

    result = cli("validate", "--corpus", corpus, "--system", "dgx1-v100")
    assert result.exit_code == 2 and "no corpus rows for system dgx1-v100" in result.stderr


def test_default_listing_is_the_worst_rows_only(cli, tmp_path, monkeypatch):
    rows = [_row(size_bytes=str(1024 * k), time_us="10") for k in range(1, 15)]
    corpus = _write(tmp_path / "c.csv", rows)
    truth = {1024 * k: 10e-6 for k in range(1, 15)}
    monkeypatch.setattr(validation, "price_call", FakeModel(truth, lambda n: 1 + n / 1024 / 100))
    result = cli("validate", "--corpus", corpus)
    assert "10 worst rows of 14" in result.stdout
    assert "+14.0%" in result.stdout and "+1.0%" not in result.stdout


# ---- the script that appends nccl-tests output ------------------------------------------------------------
OLD_FORMAT = """# nThread 1 nGpus 1 minBytes 262144 maxBytes 1048576 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#   Rank  0 Pid 1 on host device  0 [0x00] Tesla V100-SXM2-16GB
#   Rank  1 Pid 2 on host device  1 [0x00] Tesla V100-SXM2-16GB
#       size         count    type   redop     time   algbw   busbw  error     time   algbw   busbw  error
      262144         65536   float     sum    122.3    2.14    2.14    N/A    120.0    2.18    2.18    N/A
     1048576        262144   float     sum    349.1    3.00    3.00  0e+00    350.0    3.00    3.00  0e+00
"""


def test_script_reads_older_tables_and_appends_once(tmp_path):
    script = _script()
    measured = script.parse(OLD_FORMAT, collective="all_reduce")
    assert [(m["gpus"], m["size_bytes"], m["inplace"], m["time_us"]) for m in measured] == [
        (2, 262144, 0, "122.3"), (2, 262144, 1, "120.0"), (2, 1048576, 0, "349.1"), (2, 1048576, 1, "350.0")]
    assert script.nccl_version(22809) == "2.28.9" and script.nccl_version(2708) == "2.7.8"
    log = tmp_path / "run.txt"
    log.write_text(OLD_FORMAT)
    corpus = tmp_path / "corpus.csv"
    args = [str(log), "--system", "pcie-4gpu", "--source", "a test run", "--collective", "all_reduce",
            "--env", "NCCL_PROTO=Simple", "--env", "NCCL_ALGO=Ring", "--corpus", str(corpus)]
    assert script.main(args) == 0 and script.main(args) == 0  # the second run adds nothing
    rows = load_corpus(corpus)
    assert len(rows) == 4 and {(m.algo, m.proto, m.nvls, m.gpus_per_thread) for m in rows} == {("Ring", "Simple", "", 1)}
    assert script.main([str(log), "--system", "dgx-9000", "--source", "x", "--collective", "all_reduce",
                        "--corpus", str(tmp_path / "other.csv")]) == 2


# ---- the model's accuracy over the corpus --------------------------------------------------------------------
# The targets (CORPORA["collectives"].bounds): 8% from 1 MiB up, 25% below, no row past 2x. On 2026-11-22 (night): 7.97% over
# 649 rows from 1 MiB up (275 of them held out until predicted), 20.1% below, worst row 1.93x
# (`meshscale validate`). The margin from 1 MiB up is thin: a change that costs 0.2% there fails this test.


def test_model_accuracy_on_the_whole_corpus_meets_the_targets():
    summary = validate_corpus().meta["summary"]
    classes = summary["groups"]
    report = {name: c["geomean_abs_error"] for name, c in classes.items()}
    bounds = CORPORA["collectives"].bounds
    assert dict(bounds.groups) == {"1 MiB and up": 0.08, "below 1 MiB": 0.25} and bounds.worst_times_off == 2.0
    for name, bound in bounds.groups:
        assert classes[name]["geomean_abs_error"] <= bound, report
    assert summary["worst_times_off"] <= bounds.worst_times_off, (summary["worst_row"], summary["worst_times_off"])
    assert summary["passed"]


def test_one_run_against_its_prediction_and_its_report_section():
    from meshscale.report.figures import validate_section
    from meshscale.report.parts import Source
    from meshscale.predict.validate import validate_run
    measured = Result("bench-collective", [
        {"collective": "all_reduce", "size_bytes": 1024, "inplace": False, "time_s": 20e-6},
        {"collective": "all_reduce", "size_bytes": 1 << 30, "inplace": False, "time_s": 4e-3},
        {"collective": "all_gather", "size_bytes": 4096, "inplace": False, "time_s": 10e-6}],  # no prediction
        meta={"world_size": 4})
    predicted = Result("sim", [{"collective": "all_reduce", "size_bytes": 1024, "time_s": 10e-6, "algorithm": "nccl ring/LL"},
                               {"collective": "all_reduce", "size_bytes": 1 << 30, "time_s": 4.2e-3}],
                       True, {"system": "hgx-h200"})
    result = validate_run(measured, predicted)
    assert result.kind == "validate" and [r["size_class"] for r in result.rows] == ["below 1 MiB", "1 MiB and up"]
    summary = result.meta["summary"]
    assert summary["groups"]["below 1 MiB"]["geomean_abs_error"] == pytest.approx(1.0)  # 2x off
    assert summary["groups"]["1 MiB and up"]["geomean_abs_error"] == pytest.approx(0.05)
    assert not summary["passed"] and summary["worst_times_off"] == pytest.approx(2.0)
    table = validate_section(Source("validate", result)).table
    assert [r["within"] for r in table] == ["no", "yes", "yes"] and "this run" in validate_section(Source("v", result)).title
    with pytest.raises(MeshscaleError, match="no measured size"):
        validate_run(measured, Result("sim", [], True, {}))


def test_the_model_picks_nccls_logged_choice_at_every_size():
    """`validate --choices`' bound over its whole corpus: at every logged size, NCCL's algorithm and protocol."""
    from meshscale.predict.validate_choices import validate_choices
    result = validate_choices()
    summary = result.meta["summary"]
    assert set(summary["groups"]) == {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"}
    mismatched = [(r["collective"], r["size_bytes"]) for r in result.rows if not r["same"]]
    assert not mismatched and summary["passed"]


def test_choice_logs_are_read_as_nccl_tests_counts_them(tmp_path, cli):
    from meshscale.predict.validate_choices import validate_choices
    (tmp_path / "all_gather-choices.txt").write_text(
        "  3 AllReduce: 4096 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}\n"   # the harness's own check
        "  9 AllGather: 256 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}\n"    # 512 in all: below the sweep
        " 20 AllGather: 1048576 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={2..5}\n")
    rows = validate_choices(tmp_path).rows
    assert [(r["collective"], r["size_bytes"], r["logged_proto"], r["logged_channels"]) for r in rows] == [
        ("all_gather", 2 << 20, "simple", 4)]  # NCCL logs one rank's part of the gathered buffer
    (tmp_path / "all_gather-choices.txt").write_text("AllGather took a while\n")
    done = cli("validate", "--choices", "--corpus", tmp_path)
    assert done.exit_code == 2 and "all_gather-choices.txt, line 1: not an NCCL tuning line" in done.stderr
