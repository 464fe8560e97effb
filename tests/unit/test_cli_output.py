"""Tables at 80 columns and into a pipe keep every figure whole: the run's figures appear intact in the text."""
import json
import re

import pytest

FIGURE = re.compile(r"-?\d[\d,]*(?:\.\d+)?%?")


def _figures(text: str) -> list[str]:
    return sorted(FIGURE.findall(text))


@pytest.fixture
def narrow(cli, monkeypatch):
    """`meshscale ARGS` at COLUMNS=80 with stdout captured (not a terminal)."""
    monkeypatch.setenv("COLUMNS", "80")
    return cli


@pytest.mark.parametrize("args", [("systems",), ("sim", "all_reduce", "-s", "dgx1-v100", "-b", "1K", "-e", "1G", "-f", "32"),
                                  ("predict", "-m", "resnet50", "--gpus", "1,2,4,8")])
def test_predicted_tables_at_80_columns_hold_the_same_figures_as_at_400(narrow, monkeypatch, args):
    at_80 = narrow(*args)
    assert at_80.exit_code == 0, at_80.output
    monkeypatch.setenv("COLUMNS", "400")
    at_400 = narrow(*args)
    assert _figures(at_80.stdout) == _figures(at_400.stdout)
    assert "…" not in at_80.stdout


def test_bench_rows_print_whole_at_80_columns(narrow, tmp_path):
    out = tmp_path / "bench.json"
    result = narrow("bench", "collective", "all_reduce", "--cpus", "2", "-b", "1K", "-e", "64K", "-f", "8",
                    "-n", "2", "-w", "1", "--json", out)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    for row in json.loads(out.read_text())["rows"]:
        time_us = f"{row['time_s'] * 1e6:.2f}"
        assert any(str(row["size_bytes"]) in line.split() and time_us in FIGURE.findall(line) for line in lines), \
            (row, result.stdout)


def test_scale_samples_per_s_whole_at_80_columns(narrow, tmp_path):
    out = tmp_path / "scale.json"
    result = narrow("scale", "--cpus", "1", "--weak", "--batch", "8", "-m", "small-cnn", "--steps", "2", "--timing-warmup", "1",
                    "--json", out)
    assert result.exit_code == 0, result.output
    for row in json.loads(out.read_text())["rows"]:
        figure = f"{row['throughput_samples_per_s']:,.1f}"
        assert result.stdout.count(figure) >= 2, (figure, result.stdout)  # the streamed line and the table


def test_csv_beside_json_holds_the_same_rows(cli, tmp_path):
    import csv
    result = cli("sim", "all_reduce", "-s", "dgx1-v100", "-b", "1K", "-e", "1M", "-f", "32",
                 "--json", tmp_path / "sim.json", "--csv", tmp_path / "sim.csv")
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "sim.json").read_text())["rows"]
    with open(tmp_path / "sim.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) == 3
    for row, line in zip(rows, table):
        assert int(line["size_bytes"]) == row["size_bytes"]
        assert float(line["time_s"]) == row["time_s"]
    assert f"wrote {tmp_path / 'sim.csv'}" in result.stdout


def test_save_csv_header_is_the_union_of_the_rows_keys(tmp_path):
    from meshscale.results import Result
    path = Result("scale", [{"a": 1, "times_s": [0.5, 0.25]}, {"a": 2, "b": None, "c": "x"}]).save_csv(tmp_path / "r.csv")
    assert path.read_text().splitlines() == ["a,times_s,b,c", '1,"[0.5, 0.25]",,', "2,,,x"]


@pytest.mark.parametrize("command", [("bench", "collective"), ("bench", "p2p"), ("sim",), ("scale",), ("predict",),
                                     ("validate",)])
def test_every_row_writing_command_offers_csv(cli, command):
    assert "--csv" in cli(*command, "--help").stdout


INTERNAL = re.compile(r"seed ?0\d\d|DOMAIN|\b[A-Z]+\.md\b|meshscale\.[a-z_]+\.[a-z_]+")


@pytest.mark.parametrize("args", [("systems",), ("cluster", "--nodes", "124"), ("predict", "-m", "resnet50"),
                                  ("topo", "--system", "pcie-4gpu")])
def test_sources_are_named_by_title_not_internal_labels(cli, args):
    out = cli(*args)
    assert out.exit_code == 0, out.output
    assert not INTERNAL.search(out.output), INTERNAL.search(out.output)
