"""Old spellings: every entry of the CLI's table ends with exit 2 and one line naming the new spelling; the new
spellings pass untouched."""
import sys

import pytest

from meshscale import cli


def _example(key):
    """A command line that uses the old spelling of ``key``."""
    *command, spelling = key
    option, pattern, also = cli._parse_spelling(spelling)
    value = {None: ["1"], "!N": [], "*,*": ["0,1,3"]}.get(pattern, [pattern])
    return [*command, *([also] if also else []), option, *value]


@pytest.mark.parametrize("key", sorted(cli.RENAMED), ids=" ".join)
def test_old_spelling_is_one_line_and_exit_2(monkeypatch, capsys, key):
    argv = _example(key)
    monkeypatch.setattr(sys, "argv", ["meshscale", *argv])
    with pytest.raises(SystemExit) as info:
        cli.main()
    out = capsys.readouterr()
    assert info.value.code == 2 and out.out == ""
    lines = out.err.strip().splitlines()
    option = cli._parse_spelling(key[-1])[0]
    assert len(lines) == 1 and lines[0].startswith(f"meshscale {' '.join(key[:-1])}: {option}"), out.err
    assert " is now " in lines[0] or " removed" in lines[0]


@pytest.mark.parametrize("argv, hint", [
    (["plan", "all_reduce", "--gpus", "0,1,3"], "meshscale plan: --gpus 0,1,3 is now --devices 0,1,3"),
    (["sim", "all_reduce", "-g", "0,1"], "meshscale sim: -g is now --devices"),
    (["bench", "p2p", "-s16M"], "meshscale bench p2p: -s is now --size"),
    (["topo", "--format", "json", "-f", "svg"], "meshscale topo: -f is now --format"),
    (["predict", "--algorithm=ps"], "meshscale predict: --algorithm ps is now --mode ps-sync"),
    (["predict", "--algorithm", "hierarchical"], "meshscale predict: --algorithm is now --algo"),
    (["predict", "--batch", "64", "--strong"], "meshscale predict: --batch with --strong is now --global-batch"),
    (["predict", "--no-overlap"], "meshscale predict: --no-overlap is now --framework cntk-2016"),
    (["predict", "--comm-scale", "2.95"], "meshscale predict: --comm-scale removed: a free multiplier"),
    (["bench", "collective", "--cuda-graph", "--cpus", "2"], "meshscale bench collective: --cuda-graph is now"),
    (["doctor", "-o", "d.json"], "meshscale doctor: -o is now --json"),
])
def test_hint_names_what_was_typed(argv, hint):
    assert cli.renamed_hint(argv).startswith(hint)


@pytest.mark.parametrize("argv", [
    ["plan", "all_reduce", "--devices", "0,1,3", "--algo", "ring", "--bytes", "1M"],
    ["plan", "all_reduce", "--gpus", "4"],
    ["sim", "all_reduce", "-b", "1K", "-e", "1M", "-f", "4"],
    ["bench", "collective", "-g", "2", "-a", "1", "-c", "0", "-G", "1", "-o", "max", "--timeout-s", "9"],
    ["bench", "collective", "--cuda-graph", "1", "--no-check"],
    ["bench", "p2p", "--size", "16M", "-n", "3"],
    ["topo", "--system", "dgx1-p100", "--format", "json", "--output", "t.json"],
    ["predict", "--algo", "hierarchical", "--mode", "ps-sync", "--batch", "8", "--system", "dgx1-p100"],
    ["predict", "--strong", "--global-batch", "64", "--framework", "cntk-2016", "--wire", "fp32"],
    ["report", "r.json", "--output", "out"],
    ["doctor", "--json", "d.json"],
    ["tour", "--output", "t", "--timeout-s", "60"],
    ["compare", "a.json", "b.json", "-t", "5"],
])
def test_new_spellings_pass(argv):
    assert cli.renamed_hint(argv) is None


def test_a_removed_spelling_says_why_and_other_tables_plug_in():
    table = {("train", "--gone"): "removed: nothing reads it", ("scale", "-b"): "--batch"}
    assert cli.renamed_hint(["train", "--gone"], table) == "meshscale train: --gone removed: nothing reads it"
    assert cli.renamed_hint(["scale", "-b", "8"], table) == "meshscale scale: -b is now --batch"
    assert cli.renamed_hint(["train", "--", "--gone"], table) is None  # after --, words are arguments
