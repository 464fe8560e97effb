"""Slurm hand-offs: the topology.conf / topology.yaml meshscale writes for a sized cluster parses back (with a
parser written from Slurm's documented syntax) into the same leaves and spines the cluster was built with."""
from __future__ import annotations

import random

import pytest

from meshscale.errors import MeshscaleError
from meshscale.topology.cluster import build_cluster, cluster_spec, plan_cluster
from meshscale.topology.slurm import (MAX_NAME_CHARS, SlurmBlock, SlurmSwitch, SlurmTopology, check, check_name,
                                      compress_hostlist, expand_hostlist, node_names, parse_topology_conf,
                                      parse_topology_yaml, slurm_topology, topology_conf, topology_yaml)

# the examples of topology.conf(5), as Slurm documents them
MAN_PAGE_TREE = """
# Slurm's network topology configuration file for use with the topology/tree plugin
SwitchName=s0 Nodes=dev[0-5]
SwitchName=s1 Nodes=dev[6-11]
SwitchName=s2 Nodes=dev[12-17]
SwitchName=s3 Switches=s[0-2]
"""
MAN_PAGE_BLOCK = """
BlockName=block1 Nodes=node[1-32]
BlockName=block2 Nodes=node[33-64]
BlockName=block3 Nodes=node[65-96]
BlockName=block4 Nodes=node[97-128]
BlockSizes=30,120
"""


def _wiring(plan):
    """The oracle: level-1 switch of each node's NICs, and which switches each higher switch is cabled to, from the
    cluster topology meshscale builds (names as the cluster names them)."""
    hosts = node_names(plan.spec.nodes)
    leaves = {}
    for k, host in enumerate(hosts):
        for leaf in set(plan.leaves_of_node(k)):
            leaves.setdefault(f"leaf{leaf}", set()).add(host)
    up = {}
    cluster = build_cluster(plan)
    names = {1: "leaf", 2: "spine", 3: "core"}
    for link in cluster.links:
        a, b = cluster.nodes[link.a], cluster.nodes[link.b]
        if a.kind == b.kind == "net_switch":
            lo, hi = sorted((a, b), key=lambda n: n.attrs["level"])
            up.setdefault(names[hi.attrs["level"]] + hi.name.split("/")[1], set()).add(names[lo.attrs["level"]] + lo.name.split("/")[1])
    return leaves, up


@pytest.mark.parametrize("nodes", [124, 4, 400])
def test_topology_conf_parses_back_into_the_same_leaves_and_spines(tmp_path, nodes):
    plan = plan_cluster(cluster_spec("dgx1-p100", nodes))
    written = topology_conf(slurm_topology(plan, "tree"))
    parsed = parse_topology_conf(written)
    leaves, up = _wiring(plan)
    assert {k: set(v) for k, v in parsed.leaves().items()} == leaves
    assert {k: set(v) for k, v in parsed.parents().items()} == up
    assert len(parsed.leaves()) == plan.switches[0]
    if nodes == 124:  # the whitepaper's cluster: 31 leaves of 4 systems, 16 spines each cabled to every leaf
        assert len(up) == 16 and all(len(children) == 31 for children in up.values())
    assert parse_topology_yaml(topology_yaml(parsed)) == parsed


def test_blocks_are_the_nodes_of_one_leaf_and_round_trip():
    plan = plan_cluster(cluster_spec("dgx1-p100", 124))
    blocks = slurm_topology(plan, "block")
    assert blocks.block_sizes == (4,) and len(blocks.blocks) == 31
    leaves, _ = _wiring(plan)
    assert sorted(map(set, (b.nodes for b in blocks.blocks)), key=sorted) == sorted(leaves.values(), key=sorted)
    assert parse_topology_conf(topology_conf(blocks)) == blocks == parse_topology_yaml(topology_yaml(blocks))


def test_rail_groups_are_blocks_and_not_a_tree():
    plan = plan_cluster(cluster_spec("hgx-h100", 36, "edr", nics=8, network="rail"))  # 36-port EDR leaves: 2 groups of 18
    blocks = slurm_topology(plan, "block")
    assert [len(b.nodes) for b in blocks.blocks] == [plan.nodes_per_leaf] * plan.groups
    with pytest.raises(MeshscaleError, match="rail-optimized"):
        slurm_topology(plan, "tree")


def test_the_documented_examples_parse():
    tree = parse_topology_conf(MAN_PAGE_TREE)
    assert tree.leaves()["s1"] == tuple(f"dev{i}" for i in range(6, 12)) and tree.parents() == {"s3": ("s0", "s1", "s2")}
    block = parse_topology_conf(MAN_PAGE_BLOCK.replace("BlockName", "blockname"))  # keys are case-insensitive
    assert block.block_sizes == (30, 120) and len(block.blocks[3].nodes) == 32


@pytest.mark.parametrize("text, message", [
    ("SwitchName=s0 Nodes=a[1-2] Switches=s1\nSwitchName=s1 Nodes=b1", "both child switches and nodes"),
    ("SwitchName=s0 Nodes=a1\nSwitchName=s0 Nodes=a2", "defined twice"),
    ("SwitchName=s0 Switches=s[1-2]\nSwitchName=s1 Nodes=a1", "not a switch of the file"),
    ("SwitchName=s0 Nodes=a[1-2]\nSwitchName=s1 Nodes=a[2-3]", "two leaf switches"),
    ("BlockName=b0 Nodes=a[1-4]\nBlockName=b1 Nodes=a[5-6]\nBlockSizes=4", "fewer than the base block size"),
    ("BlockName=b0 Nodes=a[1-4]\nBlockSizes=4,12", "power of two"),
    ("SwitchName=s0 Nodes=a[1-2\n", "unbalanced"),
    ("SwitchName=s0 Nodes=a1\nBlockName=b0 Nodes=a1\nBlockSizes=1", "mixes"),
    ("Switch s0", "KEY=VALUE"),
])
def test_what_slurm_refuses_is_refused(text, message):
    with pytest.raises(MeshscaleError, match=message):
        parse_topology_conf(text)


def test_hostlists_round_trip():
    rng = random.Random(3)
    for _ in range(200):
        names = {f"{rng.choice(['node', 'gpu', 'leaf'])}{n:0{rng.choice([0, 3])}d}" for n in rng.sample(range(1500), 40)}
        assert sorted(expand_hostlist(compress_hostlist(sorted(names)))) == sorted(names)
    assert expand_hostlist("tux[0-3,12,18-20]") == ["tux0", "tux1", "tux2", "tux3", "tux12", "tux18", "tux19", "tux20"]


def test_a_name_slurm_cannot_take_is_refused():
    with pytest.raises(MeshscaleError, match="64 characters"):
        check(SlurmTopology("tree", (SlurmSwitch("s" * 65, ("a",)),)))
    with pytest.raises(MeshscaleError, match="two blocks"):
        check(SlurmTopology("block", blocks=(SlurmBlock("b0", ("a",)), SlurmBlock("b1", ("a",))), block_sizes=(1,)))


# what a hostile --slurm-nodes (or a name in a file read back) tries: a line of its own, a key, a comment, a hostlist
HOSTILE_NAMES = {"newline": "x\nSwitchName=evil Nodes=ALL", "cr": "x\rSwitchName=evil", "space": "node x",
                 "equals": "node=x", "hash": "node#x", "brackets": "node[1-2]", "comma": "a,b", "tab": "node\tx",
                 "unicode": "nöde", "line separator": "node\u2028x", "digit first": "1node", "empty": "",
                 "too long": "n" * (MAX_NAME_CHARS + 1), "not text": 7}


@pytest.mark.parametrize("name", HOSTILE_NAMES.values(), ids=HOSTILE_NAMES.keys())
def test_a_name_outside_slurms_hostlist_grammar_is_refused_in_one_line(name):
    with pytest.raises(MeshscaleError, match="a Slurm name is letters, digits") as info:
        check_name(name, "node")
    assert "\n" not in str(info.value) and "\r" not in str(info.value) and "\u2028" not in str(info.value)


@pytest.mark.parametrize("name", HOSTILE_NAMES.values(), ids=HOSTILE_NAMES.keys())
def test_every_name_of_a_topology_goes_through_the_grammar(name):
    plan = plan_cluster(cluster_spec("dgx1-p100", 8))
    with pytest.raises(MeshscaleError, match="a Slurm name is"):
        slurm_topology(plan, "tree", name)
    for bad in (SlurmTopology("tree", (SlurmSwitch(name, ("a1",)),)), SlurmTopology("tree", (SlurmSwitch("s0", (name,)),)),
                SlurmTopology("block", blocks=(SlurmBlock(name, ("a1",)),), block_sizes=(1,)),
                SlurmTopology("block", blocks=(SlurmBlock("b0", (name,)),), block_sizes=(1,))):
        with pytest.raises(MeshscaleError, match="a Slurm name is"):
            check(bad)


def test_a_hostile_prefix_writes_nothing(cli, tmp_path):
    out = tmp_path / "topology.conf"
    r = cli("cluster", "--system", "dgx1-p100", "--nodes", "8", "--slurm-topology", "tree", "--slurm-file", out,
            "--slurm-nodes", HOSTILE_NAMES["newline"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "--slurm-nodes" in r.stderr and not out.exists()


@pytest.mark.parametrize("prefix", ["gpu", "g-p_u.x", "n" * (MAX_NAME_CHARS - 3)])
def test_a_valid_prefix_names_every_node_and_nothing_else(prefix):
    plan = plan_cluster(cluster_spec("dgx1-p100", 124))
    for kind in ("tree", "block"):
        topo = slurm_topology(plan, kind, prefix)
        default = slurm_topology(plan, kind)
        renamed = topology_conf(default).replace("Nodes=node[", f"Nodes={prefix}[")
        assert topology_conf(topo) == renamed  # the prefix is the one change
        assert parse_topology_conf(topology_conf(topo)) == topo == parse_topology_yaml(topology_yaml(topo))


def test_notes_are_comments_of_one_line():
    topo = SlurmTopology("block", blocks=(SlurmBlock("b0", ("a1",)),), block_sizes=(1,),
                         notes=("x\nBlockName=evil Nodes=a1",))
    for text in (topology_conf(topo), topology_yaml(topo)):
        assert not any(line.startswith("BlockName=evil") for line in text.splitlines())
    assert parse_topology_conf(topology_conf(topo)) == topo == parse_topology_yaml(topology_yaml(topo))


def test_cluster_writes_the_file_and_refuses_what_slurm_cannot_express(cli, tmp_path):
    out = tmp_path / "topology.conf"
    r = cli("cluster", "--system", "dgx1-p100", "--nodes", "124", "--slurm-topology", "tree", "--slurm-file", out)
    assert r.exit_code == 0, r.output
    assert len(parse_topology_conf(out.read_text()).leaves()) == 31
    yaml_out = tmp_path / "topology.yaml"
    r = cli("cluster", "--system", "dgx1-p100", "--nodes", "124", "--slurm-topology", "block", "--slurm-file", yaml_out)
    assert r.exit_code == 0 and parse_topology_yaml(yaml_out.read_text()).block_sizes == (4,)
    bad = tmp_path / "bad.conf"
    r = cli("cluster", "--system", "dgx1-p100", "--nodes", "125", "--slurm-topology", "block", "--slurm-file", bad)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and not bad.exists() and r.stdout == ""
    r = cli("cluster", "--system", "dgx1-p100", "--nodes", "8", "--slurm-topology", "ring", "--slurm-file", bad)
    assert r.exit_code == 2 and "tree, block" in r.stderr


def test_gres_links_are_the_nvlinks_between_gpus_and_bind_each_task_to_its_gpu():
    from meshscale.topology import load_system, relation
    from meshscale.topology.slurm import gres_binding

    topo = load_system("dgx1-v100")
    binding = gres_binding(topo, [0, 3, 4, 7])
    matrix = {}
    for line in binding.gres_lines:
        fields = dict(word.split("=", 1) for word in line.split())
        matrix[int(fields["File"].removeprefix("/dev/nvidia"))] = [int(x) for x in fields["Links"].split(",")]
    for i, row in matrix.items():
        assert row[i] == -1
        for j, count in enumerate(row):
            if j != i:  # nvidia-smi's NV# count, 0 where no NVLink joins them
                r = relation(topo, i, j)
                assert count == (int(r[2:]) if r.startswith("NV") else 0)
    assert "--gpu-bind=map_gpu:0,3,4,7" in binding.srun_options and "--gres=gpu:4" in binding.srun_options
    numa = [topo.nodes[topo.device(i)].attrs["numa"] for i in (0, 3, 4, 7)]
    assert f"--cpu-bind=map_ldom:{','.join(map(str, numa))}" in binding.srun_options


def test_place_prints_the_slurm_binding_and_places_on_slices(cli):
    r = cli("place", "--system", "dgx1-p100", "--gpus", "2", "--free", "0,1,4", "--slurm")
    assert r.exit_code == 0, r.output
    assert "Name=gpu" in r.stdout and "srun --gres=gpu:2" in r.stdout
    r = cli("place", "--system", "dgx-a100-320gb", "--partition", "3g.20gb", "--gpus", "2", "--free", "0,1,2")
    assert r.exit_code == 0, r.output
    assert "MIG instance 3g.20gb" in r.stdout and "UUID" in r.stdout
    bad = cli("place", "--system", "dgx-a100-320gb", "--partition", "3g.40gb", "--gpus", "2")
    assert bad.exit_code == 2 and bad.stderr.count("\n") == 1


def test_the_handoff_script_writes_the_cluster_and_gres_files(tmp_path):
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    if not shutil.which("bash"):
        pytest.fail("bash is needed to test the Slurm script")
    root = Path(__file__).resolve().parents[2]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "meshscale").write_text(f"#!/bin/bash\nexec {sys.executable} -m meshscale \"$@\"\n")
    (bin_dir / "meshscale").chmod(0o755)
    # no nvidia-smi on this PATH: the script places on the catalog system's GPUs
    env = dict(os.environ, PATH=f"{bin_dir}:/usr/bin:/bin", CONF_DIR=str(tmp_path / "conf"), NODES="16", GPUS="8",
               PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(["bash", str(root / "scripts" / "slurm" / "handoff.sh")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(parse_topology_conf((tmp_path / "conf" / "topology.conf").read_text()).leaves()) == 4
    gres = (tmp_path / "conf" / "gres.conf").read_text().splitlines()
    assert len(gres) == 8 and all(line.startswith("Name=gpu ") and "Links=" in line for line in gres)
    assert (tmp_path / "conf" / "srun-binding.txt").read_text().startswith("srun --gres=gpu:8")
