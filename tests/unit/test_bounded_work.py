"""Work bounded by stated limits, and the shortcuts that keep it bounded equal to the long way: the optimizer's
launch count and the synced step's timeline in closed form against the loops they replace, the missing ranks
of an NCCL log as runs against the set difference, `launch`'s sizes against the machine, number options read
strictly, and MIG profiles as the GPU offers them."""
from __future__ import annotations

import random
from math import ceil

import pytest

from meshscale.errors import MeshscaleError


def _launches_one_by_one(numels, depth, scalar_list=False):
    """multi_tensor_apply's packing, a chunk at a time (the loop `foreach_launches` shortens)."""
    from meshscale.predict.training.workload import FOREACH_CHUNK, FOREACH_MAX_BLOCKS, FOREACH_MAX_TENSORS
    max_tensors = FOREACH_MAX_TENSORS[depth, scalar_list]
    launched = blocks = tensors = 0
    for numel in numels:
        if numel <= 0:
            continue
        tensors += 1
        left = ceil(numel / FOREACH_CHUNK)
        while left:
            take = min(left, FOREACH_MAX_BLOCKS - blocks)
            blocks, left = blocks + take, left - take
            if blocks == FOREACH_MAX_BLOCKS or (not left and tensors == max_tensors):
                launched, blocks = launched + 1, 0
                tensors = 1 if left else 0
    return launched + (1 if blocks else 0)


def test_optimizer_launches_in_closed_form_equal_the_chunk_loop():
    from meshscale.predict.training.workload import FOREACH_CHUNK, FOREACH_MAX_BLOCKS, FOREACH_MAX_TENSORS, foreach_launches
    rng = random.Random(0)
    full = FOREACH_CHUNK * FOREACH_MAX_BLOCKS
    for _ in range(400):
        numels = [rng.choice([0, 1, rng.randint(1, 10 ** 5), rng.randint(1, 10 ** 9), full * rng.randint(1, 4),
                              full * rng.randint(1, 4) + rng.choice([-1, 1])]) for _ in range(rng.randint(0, 40))]
        for depth, scalar_list in FOREACH_MAX_TENSORS:
            assert foreach_launches(numels, depth, scalar_list) == _launches_one_by_one(numels, depth, scalar_list)
    huge = [131072 * 524288] * 20_000      # a config at the limits: as fast as a small one
    depth, scalar_list = next(iter(FOREACH_MAX_TENSORS))
    chunks = len(huge) * ceil(huge[0] / FOREACH_CHUNK)   # few tensors, many blocks: blocks fill every launch
    assert foreach_launches(huge, depth, scalar_list) == ceil(chunks / FOREACH_MAX_BLOCKS)


def test_the_synced_timeline_in_closed_form_equals_issuing_every_kernel():
    from meshscale.predict.training.step import _repeated, _then, timeline_ends, timeline_map
    rng = random.Random(1)
    for _ in range(300):
        blocks = [([(rng.uniform(0, 2), rng.choice([0.0, rng.uniform(0, 3)])) for _ in range(rng.randint(0, 5))],
                   rng.randint(0, 4)) for _ in range(rng.randint(0, 4))]
        outer = rng.randint(1, 5)
        host = gpu = busy = 0.0
        for _ in range(outer):  # the micro-batches, then one more block: kernel by kernel
            for times, repeat in blocks:
                for _ in range(repeat):
                    for issue_s, run_s in times:
                        host += issue_s
                        gpu = max(gpu, host) + run_s
                        busy += run_s
        tail = [(rng.uniform(0, 2), rng.uniform(0, 2))]
        for issue_s, run_s in tail:
            host, gpu, busy = host + issue_s, max(gpu, host + issue_s) + run_s, busy + run_s
        got = timeline_ends(_then(_repeated(timeline_map(blocks), outer), timeline_map([(tail, 1)])))
        assert got == pytest.approx((host, busy, gpu), rel=1e-9, abs=1e-9)


def test_missing_ranks_as_runs_equal_the_set_difference():
    from meshscale.report.why_hung import _missing, ranks_text
    rng = random.Random(2)
    for _ in range(300):
        n = rng.randint(1, 60)
        done = set(rng.sample(range(n), rng.randint(0, n)))
        runs = _missing(n, done)
        assert sorted(r for a, b in runs for r in range(a, b + 1)) == sorted(set(range(n)) - done)
        assert all(b + 1 < c for (_, b), (c, _) in zip(runs, runs[1:]))  # runs apart, in order
    assert ranks_text(_missing(1 << 20, {0})) == "1-1048575"
    assert ranks_text([(k, k) for k in range(0, 40, 2)]).endswith("and 12 more runs")


def test_launch_sizes_are_checked_against_the_machine():
    from types import SimpleNamespace

    from meshscale.execute.elastic import MAX_RESTARTS, _check_sizes, local_rank_limit

    def refuse(message):
        raise MeshscaleError(message)

    most, why = local_rank_limit()
    assert most >= 1 and why
    for nproc, nodes, restarts, ok in [("1", (1, 1), 0, True), (str(most), (1, 2), MAX_RESTARTS, True),
                                       (str(most + 1), (1, 1), 0, False), ("1000000", (1, 1), 0, False),
                                       (" 2", (1, 1), 0, False), ("٢", (1, 1), 0, False), ("0", (1, 1), 0, False),
                                       ("cpu", (1, 1), 0, True), ("1", (0, 1), 0, False), ("1", (3, 2), 0, False),
                                       ("1", (1, 10 ** 6), 0, False), ("1", (1, 1), MAX_RESTARTS + 1, False)]:
        args = SimpleNamespace(nproc_per_node=nproc, nnodes=f"{nodes[0]}:{nodes[1]}", max_restarts=restarts)
        if ok:
            _check_sizes(args, nodes, refuse)
            assert 1 <= int(args.nproc_per_node) <= most
        else:
            with pytest.raises(MeshscaleError):
                _check_sizes(args, nodes, refuse)


@pytest.mark.parametrize("value", [" 2", "2 ", "٢", "1_0", "+-2", "0x2", "²"])
def test_number_options_are_read_strictly(cli, value):
    result = cli("doctor", "--level", value)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "--level" in result.stderr


def test_mig_profiles_are_the_gpus_own():
    from meshscale.topology.partitions import mig_profile, mig_profiles, parse_partition, profile_names
    for model in ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA H200"):
        profiles = mig_profiles(model)
        names = profile_names(profiles)
        assert [n for n in names if n.endswith("+me")] == [f"{p.name}+me" for p in profiles
                                                           if p.sm_slices == p.memory_slices == 1]
        for name in names:
            assert parse_partition(name, model).name == name
        for bad in (f" {names[0]}", names[0].upper(), f"{names[-1]}+me", f"{names[0]}+me+me", "9g.99gb", ""):
            with pytest.raises(MeshscaleError, match="profiles are"):
                mig_profile(bad, model, "--partition")
