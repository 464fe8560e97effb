"""A tree all-reduce inside one node is a chain whose Simple chunks are forwarded whole: the first chunk's trip
up and down the chain (its pipeline fill) costs chunk times on top of the chunks each channel moves."""
import pytest

from meshscale.simulate import nccl
from meshscale.simulate.nccl import runtime, tuning
from meshscale.topology import load_system

VERSION = "2.28.9"


def _system(n):
    topo = load_system("hgx-h200")  # NVSwitch: NCCL's tree inside the node is a chain
    return nccl.analyse(topo, list(range(n)), VERSION), nccl.constants(VERSION)


def _per_byte_us(s, c, proto, nbytes):
    """Predicted time per byte once the launch and NCCL's latency are set aside: the bytes' own pace and the fill."""
    total_us, _ = runtime.predicted_us(s, c, "all_reduce", "tree", proto, nbytes, 1.0)
    entry = tuning.tuning_table(s, c).entries[("all_reduce", "tree", proto)]
    return (total_us - runtime.launch_overhead_us(proto) - entry.latency_us) / nbytes


@pytest.mark.parametrize("n, chunks, fill", [
    (2, 1, 1.0), (2, 64, 1.0),      # the leaf sends, the root reduces and sends back: one chunk behind
    (4, 1, 2.0), (4, 64, 1.5),      # a middle GPU waits 2 hops, sends up and down, then 1 hop to the leaf
])
def test_chain_fill_is_the_hops_up_and_down_over_the_busiest_port(n, chunks, fill):
    """Worked by hand from runTreeSplit's schedule: an independent count of the chunk times."""
    assert runtime.chain_fill_chunks(n, chunks) == pytest.approx(fill)


def test_the_fill_grows_with_the_chain_and_not_with_the_chunks():
    for chunks in (1, 2, 64, 1024):
        fills = [runtime.chain_fill_chunks(n, chunks) for n in (2, 4, 8, 16)]
        assert all(0 < a < b for a, b in zip(fills, fills[1:]))
        assert runtime.chain_fill_chunks(8, chunks) <= runtime.chain_fill_chunks(8, 1) + 1e-9


@pytest.mark.parametrize("n", [4, 8])
def test_mid_size_tree_simple_pays_the_fill_per_chunk(n):
    """One chunk per channel: the fill dominates; 64 chunks: it is spread over them."""
    s, c = _system(n)
    chunk = c["tree_simple_chunk_bytes"]
    channels = runtime.channels_used(s, c, "tree", "Simple", 64 * chunk)
    one = _per_byte_us(s, c, "Simple", channels * chunk)
    many = _per_byte_us(s, c, "Simple", 64 * channels * chunk)
    assert one > 2.5 * many


def test_two_gpus_fill_less_than_four():
    two, c = _system(2)
    four, _ = _system(4)
    steady = {}
    for s in (two, four):
        steady[s.n_ranks] = _per_byte_us(s, c, "Simple", 16 << 20) / _per_byte_us(s, c, "Simple", 4 << 30) - 1
    assert 0 < steady[2] < steady[4]


@pytest.mark.parametrize("proto", ["LL", "LL128"])
def test_flagged_lines_have_no_chunk_fill(proto):
    """LL and LL128 carry a flag in every line: a GPU forwards a line as it lands, only Simple waits for a chunk:
    their pace per byte is the same at 16 MiB as at 1 GiB."""
    s, c = _system(4)
    assert runtime.tree_fill_bytes(s, c, proto, 16 << 20, 24) == 0.0
    assert runtime.tree_fill_bytes(s, c, "Simple", 16 << 20, 24) > 0.0
    assert _per_byte_us(s, c, proto, 16 << 20) == pytest.approx(_per_byte_us(s, c, proto, 1 << 30))


def test_nccls_choice_keeps_its_tree_correction():
    """The fill replaces the size correction in the predicted time only: NCCL's estimate still slows the tree
    where its correction table is below 1 (mid sizes) and not where it is 1 (large calls)."""
    s, c = _system(4)
    entry = tuning.tuning_table(s, c).entries[("all_reduce", "tree", "Simple")]

    def slowdown(nbytes):
        return tuning.nccl_time_us(s, c, "all_reduce", "tree", "Simple", nbytes) - (
            entry.latency_us + nbytes / (1000 * entry.bandwidth_gbps))

    assert slowdown(1 << 20) > 0
    assert slowdown(1 << 30) == pytest.approx(0.0, abs=1e-6)
