"""`meshscale validate --emulated`: the emulated two-node runs and sweeps as a corpus, its bounds over the whole of
it, the command, and bad corpus files."""
import json

import pytest

from meshscale.predict import validate_emulated as emulated
from meshscale.predict.validate_emulated import corpus_path, load_emulated_corpus, validate_emulated
from meshscale.results import load_result

CORPUS = corpus_path()
DATA = CORPUS.parent


@pytest.fixture(scope="module")
def shipped():
    return validate_emulated()


def test_the_whole_corpus_meets_its_bounds(shipped):
    """The bounds of docs/validate.md: per family geomean |error| within 15% (the README's target for every point
    of these runs), no row more than 2x off (`validate`'s bound for the collectives corpus)."""
    summary = shipped.meta["summary"]
    bounds = emulated.EMULATED.bounds
    assert bounds.group("training") == 0.15 and bounds.worst_times_off == 2.0
    _, points = load_emulated_corpus()
    assert {p.family for p in points} == set(emulated.FAMILIES) == set(summary["groups"])
    report = {name: (round(f["geomean_abs_error"], 3), round(f["worst_times_off"], 2))
              for name, f in summary["groups"].items()}
    for name, family in summary["groups"].items():
        assert family["geomean_abs_error"] <= bounds.group(name), report
        assert family["worst_times_off"] <= bounds.worst_times_off, report
    assert summary["passed"]


def test_rows_are_what_the_files_hold(shipped):
    """One row per run, per size of a sweep and per size of a median; each measured figure read from its file."""
    _, points = load_emulated_corpus()
    sizes = sum(len(load_result(p.bench).rows) for p in points if p.family == "all_reduce")
    medians = sum(len({r["size_bytes"] for r in load_result(p.sweeps[0]).rows}) for p in points
                  if p.family == "all_reduce_median")
    runs = sum(p.family in ("training", "scale") for p in points)
    assert len(shipped.rows) == runs + sizes + medians
    first = next(p for p in points if p.family == "training")
    row = shipped.rows[0]
    assert row["measured"] == load_result(first.measured).meta["summary"]["samples_per_s"]
    assert row["error"] == pytest.approx(row["predicted"] / row["measured"] - 1)
    assert all(r["source"].startswith("docs/results/emulated-two-node.md") for r in shipped.rows)


def test_a_scale_runs_own_one_worker_row_is_its_compute():
    """`predict --from RUN --profile RUN`: the run's 1-worker row is the profile, so it is predicted as measured."""
    from meshscale.predict import PredictRequest, predict_rows
    _, points = load_emulated_corpus()
    p = next(p for p in points if p.family == "scale")
    rows, _, _ = predict_rows(PredictRequest(model=p.model, system=str(DATA / "node-h200-1gpu.json"), nodes=(1, 2),
                                             link="10gbe", nics=1, batch=p.batch, profile=p.profile,
                                             measured=p.measured))
    one = next(r for r in rows if r["world_size"] == 1)
    assert one["predicted_samples_per_s"] == pytest.approx(one["measured_samples_per_s"])


def _corpus(tmp_path, text: str):
    path = tmp_path / "corpus.yaml"
    path.write_text(f"node: {DATA / 'node-h200-1gpu.json'}\n" + text)
    return path


def test_cli_prints_each_family_saves_json_and_fails_outside_the_bounds(cli, tmp_path):
    ok = _corpus(tmp_path, f"all_reduce:\n  - {{sweep: {DATA / 'cycles/allreduce.json'}, source: a test}}\n")
    out = tmp_path / "v.json"
    done = cli("validate", "--emulated", "--corpus", ok, "--json", out)
    assert done.exit_code == 0, done.output
    assert "all_reduce" in done.stdout and "within bounds" in done.stdout
    saved = json.loads(out.read_text())
    assert saved["kind"] == "validate" and saved["meta"]["emulated"] and saved["meta"]["summary"]["passed"]
    # ResNet-50's run predicted with GPT-small's profile: far off, so the family is outside its bounds
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    bad = _corpus(wrong, "training:\n  - {model: gpt-small, batch: 16, "
                         f"profile: {DATA / 'gpt-small-profile.json'}, bench: {DATA / 'allreduce.json'}, "
                         f"measured: {DATA / 'resnet50-2nodes.json'}, source: a test}}\n")
    done = cli("validate", "--emulated", "--corpus", bad)
    assert done.exit_code == 1 and "outside the bounds" in done.stdout


@pytest.mark.parametrize("text, message", [
    ("trainnig: []\n", "unknown key(s) trainnig"),
    ("all_reduce:\n  - {sweep: no-such.json, source: x}\n", "all_reduce entry 1: no file no-such.json"),
    ("training:\n  - {model: resnet50, source: x}\n", "training entry 1: missing or malformed field"),
    (f"all_reduce_median:\n  - {{sweeps: {DATA / 'scale-g'}, source: x}}\n", "a median needs two or more"),
    ("all_reduce: []\n", "no points"),
    (f"training:\n  - {{model: resnet50, batch: 64, profile: {DATA / 'resnet50-profile.json'}, bench: {DATA / 'allreduce.json'}, "
     f"measured: {DATA / 'allreduce.json'}, source: x}}\n", "a file lacks a field"),  # a sweep is no training run
])
def test_a_bad_corpus_is_one_line(cli, tmp_path, text, message):
    done = cli("validate", "--emulated", "--corpus", _corpus(tmp_path, text))
    assert done.exit_code == 2 and "Traceback" not in done.output
    assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr, done.stderr


def test_one_corpus_at_a_time(cli):
    for args in (("--emulated", "--training"), ("--emulated", "--system", "hgx-h200")):
        done = cli("validate", *args)
        assert done.exit_code == 2 and "go one at a time" in done.stderr
