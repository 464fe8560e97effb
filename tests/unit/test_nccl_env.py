"""NCCL's environment as input (`--nccl-env`): each setting moves the prediction the way NCCL's mechanism does."""
import pytest

from meshscale.errors import MeshscaleError
from meshscale.simulate import nccl
from meshscale.simulate.cost import Call
from meshscale.simulate.fabric import Fabric
from meshscale.simulate.nccl_env import NcclSettings
from meshscale.simulate.nccl.net_socket import tcp_host
from meshscale.simulate.nccl_env import KEYS, parse_nccl_env
from meshscale.topology import load_system
from meshscale.topology.cluster import system_or_cluster

GIB = 1 << 30


@pytest.fixture(scope="module")
def h200():
    return load_system("hgx-h200")


def _busbw(topo, ranks, settings, nbytes=GIB, collective="all_reduce"):
    return Fabric(topo, nccl=NcclSettings(env=parse_nccl_env(settings))).cost(Call(collective, nbytes, tuple(ranks))).busbw_bytes_per_s


@pytest.mark.parametrize("pair, message", [
    ("NCCL_FOO=1", "NCCL_MAX_NCHANNELS"), ("NCCL_MAX_NCHANNELS", "KEY=VALUE"), ("NCCL_MAX_NCHANNELS=0", "1 to 64"),
    ("NCCL_P2P_DISABLE=yes", "0 or 1"), ("NCCL_P2P_LEVEL=FAR", "LOC"), ("NCCL_NET=RoCE", "IB or Socket"),
    ("NCCL_ALGO=Bogus", "unknown NCCL algorithm"), ("NCCL_PROTO=LL256", "unknown NCCL protocol")])
def test_bad_settings_are_one_line_errors(pair, message):
    with pytest.raises(MeshscaleError, match=message):
        parse_nccl_env([pair])


# digits str.isdigit() takes and int() refuses ('²', '①'), or reads though no one types them ('٣'); a number int()
# refuses for its length
NOT_ASCII_DIGITS = ["²", "①", "٣", "1²", "𝟙", "+2", "2.0", "9" * 5001]


@pytest.mark.parametrize("value", NOT_ASCII_DIGITS)
def test_a_count_of_other_than_ascii_digits_is_one_line(value):
    with pytest.raises(MeshscaleError, match="whole number from 1 to"):
        parse_nccl_env([f"NCCL_MAX_NCHANNELS={value}"])


def test_sim_refuses_a_superscript_channel_count_in_one_line(cli):
    bad = cli("sim", "all_reduce", "-s", "dgx1-v100", "--nccl-env", "NCCL_MAX_NCHANNELS=²")
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1 and bad.stderr.startswith("meshscale: error:")
    assert "NCCL_MAX_NCHANNELS" in bad.stderr


def test_a_key_given_twice_and_too_many_socket_streams_are_refused():
    with pytest.raises(MeshscaleError, match="twice"):
        parse_nccl_env(["NCCL_MAX_NCHANNELS=2", "NCCL_MAX_NCHANNELS=4"])
    with pytest.raises(MeshscaleError, match="at most 64"):
        parse_nccl_env(["NCCL_SOCKET_NTHREADS=16", "NCCL_NSOCKS_PERTHREAD=8"])


def test_every_key_is_accepted_and_echoed():
    values = {"NCCL_NET": "Socket", "NCCL_P2P_LEVEL": "NVL", "NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}
    settings = [f"{k}={values.get(k, '1')}" for k in KEYS]
    assert list(parse_nccl_env(settings).settings) == settings


def test_fewer_channels_slower_in_proportion_and_the_choice_stays(h200):
    """NCCL_MAX_NCHANNELS clamps the blocks a call runs on; where the links are not the limit the bandwidth
    follows the channels. NCCL's tuning reads the search graph, so its pick does not move."""
    rates = [_busbw(h200, [0, 1], [f"NCCL_MAX_NCHANNELS={k}"]) for k in (1, 2, 4, 8, 16, 64)]
    assert all(a < b for a, b in zip(rates, rates[1:]))
    assert rates[1] / rates[0] == pytest.approx(2, rel=0.1)
    assert rates[2] / rates[1] == pytest.approx(2, rel=0.1)
    assert rates[-1] == pytest.approx(_busbw(h200, [0, 1], []), rel=1e-9)  # above the graph's count: no change
    default = nccl.predict(h200, "all_reduce", list(range(8)), GIB)
    clamped = nccl.predict(h200, "all_reduce", list(range(8)), GIB, env=parse_nccl_env(["NCCL_MAX_NCHANNELS=2"]))
    assert (clamped.algo, clamped.proto) == (default.algo, default.proto)
    assert clamped.channels == 2


@pytest.mark.slow  # NCCL's search on several machines
def test_p2p_disabled_goes_through_host_memory_far_below_nvlink(h200):
    """No P2P: the SHM transport stages every hop through pinned host memory over each GPU's PCIe link, so the
    ring runs at most at that link's rate; NVLS (multicast needs P2P) is off."""
    nvlink = _busbw(h200, list(range(8)), [])
    staged = _busbw(h200, list(range(8)), ["NCCL_P2P_DISABLE=1"])
    assert staged < nvlink / 5
    s = nccl.analyse(h200, list(range(8)), env=parse_nccl_env(["NCCL_P2P_DISABLE=1"]))
    assert s.ring.path_type in ("PHB", "SYS") and not s.nvls
    pcie_gbps = max(l.bandwidth_bytes_per_s for l in h200.links if l.kind == "pcie") / 1e9
    assert staged / 1e9 <= pcie_gbps
    # a level that still allows NVLink changes nothing on an NVSwitch board
    assert _busbw(h200, list(range(8)), ["NCCL_P2P_LEVEL=NVL"]) == pytest.approx(nvlink)


def test_shm_disabled_too_sends_through_the_nic(h200):
    staged = _busbw(h200, [0, 1], ["NCCL_P2P_DISABLE=1"])
    net = _busbw(h200, [0, 1], ["NCCL_P2P_DISABLE=1", "NCCL_SHM_DISABLE=1"])
    socket = _busbw(h200, [0, 1], ["NCCL_P2P_DISABLE=1", "NCCL_SHM_DISABLE=1", "NCCL_NET=Socket"])
    # without helper threads each rank's proxy thread copies its sends and receives on one core
    assert socket < net and socket / 1e9 <= tcp_host("Intel Xeon Platinum 8480C").per_core_gbps / 2 * (1 + 1e-9)
    assert _busbw(h200, [0, 1], ["NCCL_SHM_DISABLE=1"]) == pytest.approx(_busbw(h200, [0, 1], []))  # P2P still wins
    assert staged < _busbw(h200, [0, 1], []) / 5


@pytest.mark.slow  # NCCL's search on several machines
def test_sockets_between_nodes_are_slower_and_grow_with_their_streams():
    cluster = system_or_cluster("hgx-h100", 2, "ndr", 8)
    ranks = [cluster.nodes[d].index for d in cluster.devices()]
    ib = _busbw(cluster, ranks, [])
    one = _busbw(cluster, ranks, ["NCCL_NET=Socket"])
    four = _busbw(cluster, ranks, ["NCCL_IB_DISABLE=1", "NCCL_SOCKET_NTHREADS=4"])
    assert one < four < ib
    # no helper thread: each of a node's 8 ranks copies on its proxy thread's one core, half each way
    assert one / 1e9 <= 8 * tcp_host("Intel Xeon Platinum 8480C").per_core_gbps / 2 * (1 + 1e-9)


def test_nccl_algo_and_proto_lists_and_exclusions(h200):
    ranks = list(range(8))
    forced = Fabric(h200, nccl=NcclSettings(env=parse_nccl_env(["NCCL_ALGO=Ring"]))).cost(Call("all_reduce", GIB, tuple(ranks)))
    assert forced.time_s == Fabric(h200, nccl=NcclSettings(algo="ring")).cost(Call("all_reduce", GIB, tuple(ranks))).time_s
    excluded = nccl.predict(h200, "all_reduce", ranks, GIB, env=parse_nccl_env(["NCCL_ALGO=^NVLS,NVLSTree"]))
    assert excluded.algo not in ("nvls", "nvls_tree")
    nvls_off = nccl.predict(h200, "all_reduce", ranks, GIB, env=parse_nccl_env(["NCCL_NVLS_ENABLE=0"]))
    assert nvls_off.algo != "nvls"
    with pytest.raises(MeshscaleError, match="twice"):
        nccl.predict(h200, "all_reduce", ranks, GIB, nccl_algo="ring", env=parse_nccl_env(["NCCL_ALGO=Tree"]))


def test_sim_echoes_the_settings_and_refuses_unknown_keys(cli):
    res = cli("sim", "all_reduce", "--system", "hgx-h200", "--devices", "0,1", "-b", "16M", "-e", "64M",
              "--nccl-env", "NCCL_MAX_NCHANNELS=2")
    assert res.exit_code == 0, res.output
    assert "NCCL_MAX_NCHANNELS=2" in res.output
    bad = cli("sim", "all_reduce", "--system", "hgx-h200", "--nccl-env", "NCCL_NOPE=1")
    assert bad.exit_code == 2
    assert "NCCL_MAX_NCHANNELS" in bad.output and "Traceback" not in bad.output


def test_predict_and_place_take_the_settings(cli, tmp_path):
    """--nccl-env reaches the training prediction (sockets between nodes: a slower exchange) and place (echoed)."""
    import json
    rates = {}
    for name, extra in (("ib", ()), ("socket", ("--nccl-env", "NCCL_NET=Socket"))):
        out = tmp_path / f"{name}.json"
        r = cli("predict", "--model", "gpt-small", "--system", "hgx-h100", "--nodes", "2", "--link", "ndr",
                "--nics", "8", "--batch", "16", "--json", str(out), *extra)
        assert r.exit_code == 0, r.output
        rates[name] = json.loads(out.read_text())["rows"][0]["throughput_samples_per_s"]
    assert rates["socket"] < rates["ib"]
    placed = cli("place", "--gpus", "2", "--system", "hgx-h200", "--nccl-env", "NCCL_P2P_DISABLE=1")
    assert placed.exit_code == 0 and "NCCL_P2P_DISABLE=1" in placed.stdout
