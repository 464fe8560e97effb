"""Every collective record is checked here for what the rest of meshscale relies on, so a new record is tested
by being added: names resolve, nccl-tests' busbw factor, spans and states that agree, in-place views that
exist, a torch call and an NCCL form that exist, and one zero-time rule for algbw."""
import math

import pytest

from meshscale.collectives.algorithms import ALGORITHMS, build
from meshscale.collectives.bounds import PATTERNS
from meshscale.collectives.kinds import KINDS, NAMES, SCHEDULABLE, algbw, direct_peers, kind
from meshscale.collectives.schedule import initial_state, input_spans, output_spans, required_state, unit_of
from meshscale.errors import MeshscaleError
from meshscale.execute.torch_collectives import CALLS

# nccl-tests' busbw factors (src/*.cu, doc/PERFORMANCE.md), by its binary names
NCCL_TESTS_FACTORS = {
    "all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n, "alltoall": lambda n: (n - 1) / n, "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0, "reduce": lambda n: 1.0, "sendrecv": lambda n: 1.0,
    "alltoallv": lambda n: (n - 1) / n,  # AlltoAllvGetBw, of the busiest rank's bytes
}
RANKS = range(1, 7)


def _roots(k, n):
    return range(n) if k.rooted else [0]


@pytest.mark.parametrize("k", KINDS, ids=NAMES)
def test_names_resolve(k):
    for spelling in (k.name, *k.aliases):
        assert kind(spelling) is k
        assert kind(spelling.upper().replace("_", "-")) is k
    assert len({s for x in KINDS for s in (x.name, *x.aliases)}) == sum(1 + len(x.aliases) for x in KINDS)


def test_unknown_name_is_one_line_listing_the_known_ones():
    with pytest.raises(MeshscaleError) as info:
        kind("allreduce2")
    assert "\n" not in str(info.value) and all(name in str(info.value) for name in NAMES)


@pytest.mark.parametrize("k", KINDS, ids=NAMES)
def test_busbw_factor_is_nccl_tests(k):
    reference = [NCCL_TESTS_FACTORS[s] for s in (k.name, *k.aliases) if s in NCCL_TESTS_FACTORS]
    assert reference, f"{k.name}: add nccl-tests' busbw factor to this test"
    for n in RANKS:
        assert k.busbw_factor(n) == pytest.approx(reference[0](n))
        alg, bus = k.algbw_busbw(1e9, 0.5, n)
        assert alg == 2e9 and bus == pytest.approx(2e9 * reference[0](n))


def test_algbw_is_zero_without_a_positive_finite_time():
    assert [algbw(100, t) for t in (0.0, -1.0, math.inf)] == [0.0, 0.0, 0.0]
    assert kind("all_reduce").algbw_busbw(100, 0.0, 4) == (0.0, 0.0)


@pytest.mark.parametrize("k", KINDS, ids=NAMES)
def test_units_and_sources_are_consistent(k):
    for n in RANKS:
        assert k.buffer_bytes(n, 8 * n) == k.units(n) * k.unit_bytes(n, 8 * n)
        assert k.count(8 * n, n, 4) == (2 if k.segmented else 2 * n)
        for root in _roots(k, n):
            outs = set()
            for r in range(n):
                for units in (k.input_units(r, n, root), k.output_units(r, n, root)):
                    assert len(set(units)) == len(units) and all(0 <= u < k.units(n) for u in units)
                outs |= set(k.output_units(r, n, root))
            sources = k.sources(n, root)
            assert outs and outs <= set(sources), "every output unit needs a source"
            many = [u for u in outs if len(sources[u]) > 1]
            assert bool(many) == (k.reducing and n > 1)
            assert all(sources[u] == frozenset(range(n)) for u in many)  # a reduction is over every rank
    if k.rooted:
        assert any(k.output_units(r, 3, 0) != k.output_units(r, 3, 1) or k.input_units(r, 3, 0) != k.input_units(r, 3, 1)
                   for r in range(3))
        assert k.from_root == (not k.input_units(1, 3, 0))


@pytest.mark.parametrize("k", KINDS, ids=NAMES)
def test_in_place_views_exist(k):
    """In place, the smaller side must be a contiguous run of the larger side's units (bench.cases relies on it)."""
    if "in" not in k.places:
        return
    for n in RANKS:
        for root in _roots(k, n):
            for r in range(n):
                ins, outs = k.input_units(r, n, root), k.output_units(r, n, root)
                whole, part = (ins, outs) if len(ins) >= len(outs) else (outs, ins)
                assert whole == list(range(whole[0], whole[0] + len(whole)))
                assert not part or part == whole[whole.index(part[0]):whole.index(part[0]) + len(part)]


@pytest.mark.parametrize("k", KINDS, ids=NAMES)
def test_execution_forms_exist(k):
    assert k.torch_call in CALLS and k.bound in PATTERNS
    assert k.min_ranks >= 1 and set(k.places) <= {"out", "in"} and k.places
    if k.nccl_function is None:
        assert not k.reducing, "a reduction needs an NCCL call: sends and receives cannot reduce"
    if k.reducing:
        with pytest.raises(MeshscaleError):
            direct_peers(k, 0, 2, 0)
        return
    for n in range(k.min_ranks, 6):  # the group of sends and receives delivers every output unit from its source
        for root in _roots(k, n):
            sent = {}
            for r in range(n):
                for peer, send_at, _ in direct_peers(k, r, n, root):
                    if send_at is not None:
                        sent[(r, peer)] = k.input_units(r, n, root)[send_at]
            for r in range(n):
                got = {recv_at: sent.pop((peer, r)) for peer, _, recv_at in direct_peers(k, r, n, root)
                       if recv_at is not None}
                assert [got[i] for i in range(len(got))] == k.output_units(r, n, root)
            assert not sent


@pytest.mark.parametrize("name", SCHEDULABLE)
def test_schedules_start_and_end_as_the_record_says(name):
    k = kind(name)
    algorithms = [a for a, algo in ALGORITHMS.items() if name in algo.collectives and a in ("ring", "direct")]
    assert algorithms, f"{name}: no ring or direct schedule; every schedulable collective needs one"
    for n in range(1, 6):
        for root in _roots(k, n):
            s = build(algorithms[0], name, list(range(n)), 16 * n, root=root, pieces=2)
            start, need = initial_state(s), required_state(s)
            for r in range(n):
                ins, outs = set(k.input_units(r, n, root)), set(k.output_units(r, n, root))
                for ch in s.chunks:
                    assert start[r][ch.id] == (frozenset({r}) if unit_of(s, ch) in ins else frozenset())
                    assert ((r, ch.id) in need) == (unit_of(s, ch) in outs)
                assert sum(b for _, b in input_spans(s, r)) == len(ins) * k.unit_bytes(n, 16 * n)
                assert sum(b for _, b in output_spans(s, r)) == len(outs) * k.unit_bytes(n, 16 * n)


def test_bench_only_collectives_have_no_schedule():
    for k in KINDS:
        if not k.schedulable:
            with pytest.raises(MeshscaleError, match="no meshscale schedule"):
                build("direct", k.name, [0, 1], 64)
