import pytest

from meshscale.errors import MeshscaleError
from meshscale.topology import links


def test_pcie_generations_match_the_published_figures():
    assert links.pcie_bandwidth(3, 16) == pytest.approx(15.754e9, rel=1e-4)
    assert links.pcie_bandwidth(2, 8) == pytest.approx(4e9)
    assert links.pcie_bandwidth(4, 16) == pytest.approx(31.5e9, rel=1e-3)
    assert links.pcie_bandwidth(5, 16) == pytest.approx(63.0e9, rel=1e-3)
    assert links.pcie_bandwidth(3, 1) == pytest.approx(984.6e6, rel=1e-4)


def test_nvlink_per_generation():
    assert links.nvlink_bandwidth(1, 4) == 80e9
    assert links.nvlink_bandwidth(2, 6) == 150e9
    assert links.nvlink_bandwidth(3, 12) == 300e9
    assert links.nvlink_bandwidth(4, 18) == 450e9


def test_infiniband_rates_use_64b66b():
    assert links.infiniband_bandwidth("edr", 4) * 8 == pytest.approx(100e9)
    assert links.infiniband_bandwidth("HDR", 4) * 8 == pytest.approx(200e9, rel=1e-3)
    assert links.infiniband_bandwidth("ndr", 4) * 8 == pytest.approx(400e9, rel=1e-3)
    assert links.infiniband_bandwidth("sdr", 4) * 8 == pytest.approx(8e9)  # 10 Gb/s signalling, 8b/10b


def test_ethernet():
    assert links.ethernet_bandwidth(10) == 1.25e9
    assert 2 * links.ethernet_bandwidth(10) * 8 * 2 == 40e9  # dual 10 GbE, both directions: 40 Gb/s


@pytest.mark.parametrize("call", [lambda: links.pcie_bandwidth(7, 16), lambda: links.pcie_bandwidth(3, 3),
                                  lambda: links.nvlink_bandwidth(9), lambda: links.infiniband_bandwidth("xdr9"),
                                  lambda: links.ethernet_bandwidth(0)])
def test_bad_parameters_are_refused(call):
    with pytest.raises(MeshscaleError):
        call()
