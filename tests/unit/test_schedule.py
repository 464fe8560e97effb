"""The schedule format: symbolic validation catches broken schedules, JSON round trip, dependencies, layout."""
import pytest

from meshscale.collectives.algorithms import build
from meshscale.collectives.schedule import (Schedule, Step, Transfer, dependencies, describe, dumps, from_dict,
                                            input_spans, loads, make_chunks, output_spans, to_dict, validate)
from meshscale.errors import MeshscaleError


def ring_all_reduce(n=4, nbytes=64):
    return build("ring", "all_reduce", list(range(n)), nbytes)


def test_valid_ring_and_json_round_trip():
    s = ring_all_reduce()
    validate(s)
    again = loads(dumps(s))
    assert again == s and to_dict(again) == to_dict(s)
    assert "ring all_reduce" in describe(s)


@pytest.mark.parametrize("breakage, message", [
    (lambda s: s.steps.pop(), "rank"),                                            # missing last all-gather step
    (lambda s: setattr(s.steps[0].transfers[0], "op", "copy"), "rank"),          # a copy loses a contribution
    (lambda s: s.steps[1].transfers.append(Transfer(**{**vars(s.steps[0].transfers[0])})), "twice"),
    (lambda s: setattr(s.steps[0].transfers[0], "nbytes", 3), "bytes"),
    (lambda s: setattr(s.steps[0].transfers[0], "dst", s.steps[0].transfers[0].src), "different"),
    (lambda s: setattr(s.chunks[1], "offset_bytes", 0), "layout"),
    (lambda s: setattr(s.steps[0].transfers[0], "channel", 5), "channel"),
])
def test_broken_schedules_fail(breakage, message):
    s = ring_all_reduce()
    breakage(s)
    with pytest.raises(MeshscaleError, match=message):
        validate(s)


def test_copy_race_and_garbage_send():
    chunks = make_chunks("broadcast", 3, 12)
    race = Schedule("broadcast", "x", [0, 1, 2], 12, chunks, [Step([Transfer(0, 2, 0, 12), Transfer(1, 2, 0, 12)])], root=0)
    with pytest.raises(MeshscaleError, match="rank 1 sends chunk 0 before"):
        validate(race)
    ok = Schedule("broadcast", "x", [0, 1, 2], 12, chunks, [Step([Transfer(0, 1, 0, 12), Transfer(0, 2, 0, 12)])], root=0)
    validate(ok)
    wrong_root = Schedule("broadcast", "x", [0, 1, 2], 12, chunks, ok.steps, root=1)
    with pytest.raises(MeshscaleError, match="sends chunk 0 before"):
        validate(wrong_root)


def test_dependencies_follow_data():
    s = ring_all_reduce(3, 48)
    flat = s.transfers()
    deps = dependencies(s)
    assert len(deps) == len(flat)
    assert all(d == [] for (k, _), d in zip(flat, deps) if k == 0)
    for i, ((k, t), d) in enumerate(zip(flat, deps)):
        assert all(j < i and flat[j][0] < k for j in d)
        if k > 0:  # in a ring every later transfer sends data that arrived in an earlier step
            assert any(flat[j][1].dst == t.src and flat[j][1].chunk == t.chunk for j in d)


def test_spans_and_layout():
    s = build("direct", "all_to_all", [0, 1, 2], 48)
    assert len(s.chunks) == 9 and all(c.nbytes == 16 for c in s.chunks)
    assert input_spans(s, 1) == [(48, 48)]
    assert output_spans(s, 1) == [(16, 16), (64, 16), (112, 16)]
    g = build("ring", "all_gather", [0, 1, 2, 3], 64)
    assert input_spans(g, 2) == [(32, 16)] and output_spans(g, 2) == [(0, 64)]


def test_bad_documents_and_sizes():
    with pytest.raises(MeshscaleError, match="not a meshscale schedule"):
        from_dict({"collective": "all_reduce"})
    with pytest.raises(MeshscaleError, match="not JSON"):
        loads("{")
    with pytest.raises(MeshscaleError, match="split"):
        make_chunks("all_gather", 3, 64)
    with pytest.raises(MeshscaleError, match="cannot split"):
        make_chunks("all_reduce", 4, 8, pieces=4)
