"""The one validation framework (`meshscale.predict.corpus_check`): its error definition against a direct
computation, its summary against its bounds, and that every `validate` corpus goes through it."""
import inspect
import math
import random
from pathlib import Path

import pytest

from meshscale.errors import MeshscaleError
from meshscale.predict import corpus_check
from meshscale.predict.corpus_check import CORPORA, Bounds, Corpus, geomean_abs_error, summarize, times_off

SRC = Path(__file__).resolve().parents[2] / "src" / "meshscale"


def test_the_error_definition_is_the_direct_computation_on_random_ratios():
    rng = random.Random(40)
    for _ in range(200):
        ratios = [math.exp(rng.uniform(-1.5, 1.5)) for _ in range(rng.randint(1, 30))]
        logs = [math.log(r) for r in ratios]
        assert geomean_abs_error(ratios) == pytest.approx(math.exp(sum(abs(x) for x in logs) / len(logs)) - 1)
        worst = max(ratios, key=lambda r: abs(math.log(r)))
        assert max(times_off(r) for r in ratios) == pytest.approx(max(worst, 1 / worst))
        assert all(corpus_check.error(r) == pytest.approx(r - 1) for r in ratios)
    # a row 10% above and one 10% below (as a ratio) count alike
    assert geomean_abs_error([1.1, 1 / 1.1]) == pytest.approx(0.1)
    assert geomean_abs_error([]) is None


def _corpus(bounds: Bounds, **kw) -> Corpus:
    return Corpus("test", "--test", "x.csv", "row", "time", "group", bounds, **kw)


def test_the_summary_holds_each_bound():
    rows = [{"row": i + 1, "group": g, "ratio": r} for i, (g, r) in enumerate(
        [("a", 1.1), ("a", 0.9), ("b", 1.02), ("b", 1.7)])]
    whole = summarize(_corpus(Bounds()), rows)
    assert whole["passed"] and whole["rows"] == 4 and whole["worst_row"] == 4
    assert whole["geomean_abs_error"] == pytest.approx(geomean_abs_error(r["ratio"] for r in rows))
    assert whole["groups"]["b"]["geomean_abs_error"] == pytest.approx(geomean_abs_error([1.02, 1.7]))
    assert not summarize(_corpus(Bounds(worst_times_off=1.5)), rows)["passed"]
    assert not summarize(_corpus(Bounds(geomean_abs_error=0.1)), rows)["passed"]
    named = summarize(_corpus(Bounds(groups=(("a", 0.2), ("c", 0.1)))), rows)
    assert named["passed"] and named["groups"]["c"]["rows"] == 0   # a group bounded by name is reported empty
    assert not summarize(_corpus(Bounds(groups=(("*", 0.2),))), rows)["groups"]["b"]["passed"]
    unpredicted = summarize(_corpus(Bounds()), rows + [{"row": 5, "group": "a", "ratio": None}])
    assert unpredicted["unpredicted"] == 1 and not unpredicted["passed"]
    choices = [{"row": 1, "group": "a", "same": True}, {"row": 2, "group": "a", "same": False}]
    assert not summarize(_corpus(Bounds(agreement=True)), choices)["passed"]
    assert summarize(_corpus(Bounds(agreement=True)), choices[:1])["passed"]


def test_a_missing_corpus_is_one_error_for_every_corpus(tmp_path):
    for corpus in CORPORA.values():
        assert corpus.path().exists()   # the shipped one
        with pytest.raises(MeshscaleError, match=f"{tmp_path / 'nothing'}: no such"):
            corpus.path(tmp_path / "nothing")


def test_every_validate_flag_is_one_corpus_of_the_framework():
    from meshscale.cli.validate import COLUMNS, corpus_of, validate
    flags = {p.default.param_decls[0] for p in inspect.signature(validate).parameters.values()
             if p.annotation in (bool, "bool") and p.default.param_decls[0] != "--all"}
    assert flags == {c.flag for c in CORPORA.values() if c.flag}
    assert corpus_of({flag: False for flag in flags}) is CORPORA["collectives"]
    for flag in flags:
        assert corpus_of({f: f == flag for f in flags}).flag == flag
    assert set(COLUMNS) == set(CORPORA)


def test_each_validator_summarises_through_the_framework_only():
    """Guard: no validator counts errors or holds bounds of its own (they came back once as four copies)."""
    for path in ("predict/validate.py", "predict/validate_emulated.py", "predict/validate_choices.py",
                 "predict/training/validate.py"):
        text = (SRC / path).read_text()
        assert "validation_result(" in text, path
        for own in ("math.exp(", "BOUND =", "ERROR_DEFINITION =", "def _summary", "def _geomean"):
            assert own not in text, (path, own)


def test_the_publication_weighted_figure_is_the_geomean_of_each_publications_geomean_on_random_rows():
    """Each publication weighs the same: the bounded figure equals the geomean over publications of each
    publication's own geomean |error|, computed here directly; a large publication cannot outvote a small one."""
    rng = random.Random(41)
    corpus = _corpus(Bounds(geomean_abs_error=0.1), weight_by="group")
    for _ in range(100):
        rows = [{"row": i + 1, "group": rng.choice("abcde"), "ratio": math.exp(rng.uniform(-0.5, 0.5))}
                for i in range(rng.randint(1, 40))]
        per = {}
        for r in rows:
            per.setdefault(r["group"], []).append(r["ratio"])
        own = [geomean_abs_error(v) for v in per.values()]
        expected = math.prod(1 + g for g in own) ** (1 / len(own)) - 1
        summary = summarize(corpus, rows)
        assert summary["weighted_geomean_abs_error"] == pytest.approx(expected)
        assert summary["weighted_groups"] == len(per)
        assert summary["passed"] == (expected <= 0.1)
    # one exact publication of 50 rows and one 30% off of 1 row: the figure sits between, not at the large one's
    rows = [{"row": i, "group": "big", "ratio": 1.0} for i in range(50)] + [{"row": 51, "group": "small",
                                                                              "ratio": 1.3}]
    assert summarize(corpus, rows)["weighted_geomean_abs_error"] == pytest.approx(1.3 ** 0.5 - 1)
