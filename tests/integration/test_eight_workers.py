"""The 8-GPU paths on 8 CPU workers over Gloo: the DGX-1-sized rank count works end to end."""
import pytest

from meshscale.bench.collective import CollectiveSpec, bench_collectives
from meshscale.collectives.kinds import kind
from meshscale.execute.world import World


@pytest.mark.slow  # eight ranks on two cores
def test_collectives_on_eight_workers_are_exact():
    spec = CollectiveSpec(collectives=["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all"],
                          sizes_bytes=[8 * 1024], dtypes=("int32",), warmup_iters=1, iters=2)
    result = bench_collectives(spec, World(8, "gloo"), timeout_s=60)
    assert result.meta["world_size"] == 8
    assert {r["collective"] for r in result.rows} == set(spec.collectives)
    for row in result.rows:
        assert row["wrong"] == 0, row
        assert row["busbw_bytes_per_s"] == row["algbw_bytes_per_s"] * kind(row["collective"]).busbw_factor(8)
