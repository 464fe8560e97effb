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


def _data_us(s, c, proto, nbytes):
    """Predicted time less the launch and NCCL's latency: what the bytes (and the fill) take."""
    total_us, channels = runtime.predicted_us(s, c, "all_reduce", "tree", proto, nbytes, 1.0)
    fixed_us = runtime.launch_overhead_us(proto) + tuning.latency_us(s, c, "all_reduce", "tree", proto)
    return total_us - fixed_us, channels


@pytest.mark.parametrize("n, chunks, fill", [
    (2, 1, 1.0), (2, 64, 1.0),      # the leaf sends, the root reduces and sends back: one chunk behind
    (4, 1, 2.0), (4, 64, 1.5),      # a middle GPU waits 2 hops, sends up and down, then 1 hop to the leaf
    (8, 1, 6.0), (8, 64, 5.5),
])
def test_chain_fill_is_the_hops_up_and_down_over_the_busiest_port(n, chunks, fill):
    assert runtime.chain_fill_chunks(n, chunks) == pytest.approx(fill)


@pytest.mark.parametrize("n", [4, 8])
def test_mid_size_tree_simple_pays_the_fill_per_chunk(n):
    s, c = _system(n)
    chunk = c["tree_simple_chunk_bytes"]
    channels = runtime.channels_used(s, c, "tree", "Simple", 64 * chunk)
    one_us, nc1 = _data_us(s, c, "Simple", channels * chunk)
    many_us, nc64 = _data_us(s, c, "Simple", 64 * channels * chunk)
    assert nc1 == nc64 == channels
    per_chunk_one, per_chunk_many = one_us / 1, many_us / 64
    expected = (1 + runtime.chain_fill_chunks(n, 1)) / (1 + runtime.chain_fill_chunks(n, 64) / 64)
    assert per_chunk_one / per_chunk_many == pytest.approx(expected, rel=1e-6)
    assert per_chunk_one > 2.5 * per_chunk_many  # one chunk per channel: the fill dominates


def test_two_gpus_fill_less_than_four():
    chunk_counts = (1, 2, 64)
    for chunks in chunk_counts:
        assert runtime.chain_fill_chunks(2, chunks) < runtime.chain_fill_chunks(4, chunks)
    two, c = _system(2)
    four, _ = _system(4)
    nbytes = 16 << 20
    steady = {}
    for s in (two, four):
        data_us, nc = _data_us(s, c, "Simple", nbytes)
        steady_us = nbytes / (1000 * runtime.chain_gbps(s, c, "Simple", nc / runtime.comm_channels(s, c, "tree")))
        steady[s.n_ranks] = data_us / steady_us - 1  # the fill, as a share of the steady time
    assert 0 < steady[2] < steady[4]


@pytest.mark.parametrize("proto", ["LL", "LL128"])
def test_flagged_lines_have_no_chunk_fill(proto):
    """LL and LL128 carry a flag in every line: a GPU forwards a line as it lands, only Simple waits for a chunk."""
    s, c = _system(4)
    assert runtime.tree_fill_bytes(s, c, proto, 16 << 20, 24) == 0.0
    assert runtime.tree_fill_bytes(s, c, "Simple", 16 << 20, 24) > 0.0
    data_us, nc = _data_us(s, c, proto, 16 << 20)
    share = nc / runtime.comm_channels(s, c, "tree")
    assert data_us == pytest.approx((16 << 20) / (1000 * runtime.chain_gbps(s, c, proto, share)))


def test_nccls_choice_keeps_its_tree_correction():
    """The fill replaces the size correction in the predicted time only: NCCL's estimate still applies it."""
    s, c = _system(4)
    nbytes = 1 << 20
    log_size = (nbytes >> 6).bit_length() - 1
    factor = c["tree_correction"]["Simple"][log_size]
    assert factor < 1
    bw = tuning.bus_bandwidth(s, c, "all_reduce", "tree", "Simple")
    lat = tuning.latency_us(s, c, "all_reduce", "tree", "Simple")
    assert tuning.nccl_time_us(s, c, "all_reduce", "tree", "Simple", nbytes) == pytest.approx(
        lat + nbytes / (1000 * bw * factor))
