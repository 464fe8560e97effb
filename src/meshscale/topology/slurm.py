"""A sized cluster handed to Slurm: `topology.conf` / `topology.yaml` for its topology/tree and topology/block
plugins, and the parser that reads them back.

The syntax is Slurm's documented one (topology.conf(5), topology.yaml(5)): one ``SwitchName=`` line per switch
with either ``Nodes=`` (a leaf) or ``Switches=`` (its children), never both; one ``BlockName= Nodes=`` line per
block and one ``BlockSizes=`` line; names in Slurm's hostlist expressions (``node[001-004,009]``). The same rules
Slurm's topology plugins enforce are checked here on what is written and on what is read: unique switch names of
at most 64 characters, children that exist, no node on two leaf switches, every block at least the base block size,
each larger block size a power-of-two multiple of the one before.

Tree: the leaves are the cluster's level-1 switches with the nodes whose NICs they hold; every higher switch lists
the switches it is wired to (in a fat tree every spine lists every leaf it links to, as cabled). Block: a block is
a set of nodes one switch hop apart: a leaf's nodes (a rail group's on a rail network). A cluster of NVL72 racks
is the other way round: Slurm's nodes are a rack's compute trays (its ``hosts``, one OS each), and the block is the
rack, its NVLink domain (Slurm's topology/block plugin was made for it: a job of up to 18 trays kept in one rack);
larger blocks are consecutive racks under one rail group, each size a power-of-two multiple of the rack's.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from meshscale.errors import MeshscaleError, one_line
from meshscale.units import is_digits

KINDS = ("tree", "block")
MAX_NAME_CHARS = 64  # Slurm's HOST_NAME_MAX check on SwitchName
# a name in Slurm's hostlist syntax holds none of its separators (',', '[', ']', '=', blanks, '#'): nothing a name
# carries can add a key, a name or a line to the file it is written into
NAME_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9._-]*")
NAME_RULE = (f"letters, digits, '-', '_' and '.', starting with a letter, at most {MAX_NAME_CHARS} characters "
             "(a name in Slurm's hostlist syntax)")
LEVEL_NAMES = {1: "leaf", 2: "spine", 3: "core"}


@dataclass(frozen=True)
class SlurmSwitch:
    name: str
    nodes: tuple[str, ...] = ()       # a leaf switch's nodes
    switches: tuple[str, ...] = ()    # a higher switch's children


@dataclass(frozen=True)
class SlurmBlock:
    name: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class SlurmTopology:
    """What one of Slurm's topology files says: switches (tree) or blocks and their sizes (block)."""

    kind: str
    switches: tuple[SlurmSwitch, ...] = ()
    blocks: tuple[SlurmBlock, ...] = ()
    block_sizes: tuple[int, ...] = ()
    notes: tuple[str, ...] = field(default=(), compare=False)

    def leaves(self) -> dict[str, tuple[str, ...]]:
        return {s.name: s.nodes for s in self.switches if s.nodes}

    def parents(self) -> dict[str, tuple[str, ...]]:
        return {s.name: s.switches for s in self.switches if s.switches}


# ---- names and hostlists -----------------------------------------------------------------------------------------

def check_name(name, what: str) -> str:
    """``name`` if Slurm's hostlist syntax takes it as a switch, block or node name (or a node-name prefix);
    else the one-line error naming the rule. Every name written into a topology file, or read from one, passes
    here."""
    if not isinstance(name, str) or len(name) > MAX_NAME_CHARS or not NAME_PATTERN.fullmatch(name):
        shown = repr(name)  # escapes what would break the line
        shown = shown if len(shown) <= 2 * MAX_NAME_CHARS else f"{shown[:2 * MAX_NAME_CHARS]}..."
        raise MeshscaleError(f"{what} {shown}: a Slurm name is {NAME_RULE}")
    return name


def expand_hostlist(text: str) -> list[str]:
    """``node[01-03,07],gpu5`` -> node01 node02 node03 node07 gpu5 (Slurm's hostlist expression)."""
    names: list[str] = []
    for part in _top_level_parts(text.strip(), text):
        m = re.fullmatch(r"([^\[\]]*)\[([^\]]*)\]([^\[\]]*)", part)
        if not m:
            if "[" in part or "]" in part:
                raise MeshscaleError(f"hostlist {text!r}: unbalanced brackets in {part!r}")
            names.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            if not is_digits(lo) or (hi and not is_digits(hi)):
                raise MeshscaleError(f"hostlist {text!r}: {r!r} is not a number or a range a-b")
            width = len(lo) if lo.startswith("0") else 0
            for i in range(int(lo), int(hi or lo) + 1):
                names.append(f"{prefix}{i:0{width}d}{suffix}")
    return names


def _top_level_parts(text: str, whole: str) -> list[str]:
    """``text`` split at the commas outside brackets; an error for brackets that do not pair."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if depth not in (0, 1):
            raise MeshscaleError(f"hostlist {whole!r}: unbalanced brackets")
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise MeshscaleError(f"hostlist {whole!r}: unbalanced brackets")
    return [p for p in parts + [text[start:]] if p]


def compress_hostlist(names: list[str] | tuple[str, ...]) -> str:
    """The shortest hostlist expression for names of the form prefix + number; other names listed as they are.
    Numbers without leading zeros share one bracket whatever their length (leaf[0-30]); zero-padded ones, and
    numbers of the same length, share one per width (node[000-123])."""
    digits: dict[str, list[str]] = {}
    plain: list[str] = []
    for name in names:
        m = re.fullmatch(r"(.*?)(\d+)", name)
        if m:
            digits.setdefault(m.group(1), []).append(m.group(2))
        else:
            plain.append(name)
    parts = []
    for prefix, found in digits.items():
        padded = {len(d) for d in found if str(int(d)) != d}
        groups: dict[int, set[int]] = {}
        for d in found:
            groups.setdefault(len(d) if len(d) in padded else 0, set()).add(int(d))
        for width, numbers in groups.items():
            numbers = sorted(numbers)
            runs, start = [], numbers[0]
            for a, b in zip(numbers, numbers[1:] + [None]):
                if b != a + 1:
                    runs.append(f"{start:0{width}d}" + (f"-{a:0{width}d}" if a != start else ""))
                    start = b
            parts.append(f"{prefix}{runs[0]}" if len(numbers) == 1 else f"{prefix}[{','.join(runs)}]")
    return ",".join(parts + plain)


# ---- from a cluster plan --------------------------------------------------------------------------------------

def node_names(count: int, prefix: str = "node") -> list[str]:
    width = max(3, len(str(count - 1)))
    return [f"{prefix}{k:0{width}d}" for k in range(count)]


def slurm_topology(plan, kind: str, node_prefix: str = "node") -> SlurmTopology:
    """The Slurm topology of ``plan`` (a sized `ClusterPlan`), as the ``kind`` plugin takes it; a one-line error
    where that plugin cannot express the network."""
    from meshscale.errors import check_choice
    from meshscale.topology.cluster import build_cluster

    check_choice(kind, KINDS, "Slurm topology")
    check_name(node_prefix, "the node-name prefix (--slurm-nodes)")
    per_node = hosts_per_node(plan.node_topology)
    hosts = node_names(plan.spec.nodes * per_node, node_prefix)
    on_leaf: dict[int, list[str]] = {}
    for k in range(plan.spec.nodes):
        for leaf in sorted(set(plan.leaves_of_node(k))):
            on_leaf.setdefault(leaf, []).extend(hosts[k * per_node:(k + 1) * per_node])
    if kind == "block":
        return _rack_blocks(plan, hosts, per_node) if per_node > 1 else _blocks(plan, hosts)
    if plan.rails:
        raise MeshscaleError("--slurm-topology tree: a rail-optimized network puts every node on one leaf per rail, "
                             "and topology/tree takes a node on one leaf switch (Slurm warns of nodes on several); "
                             f"use --slurm-topology block (a {'rack' if per_node > 1 else 'rail group'} is a block)")
    switches = [SlurmSwitch(f"leaf{leaf}", tuple(nodes)) for leaf, nodes in sorted(on_leaf.items())]
    if plan.levels > 1:
        cluster = build_cluster(plan)
        children: dict[str, set[str]] = {}
        for link in cluster.links:
            ends = sorted((link.a, link.b), key=lambda n: -cluster.nodes[n].attrs.get("level", 0))
            upper, lower = (cluster.nodes[n] for n in ends)
            if upper.kind == lower.kind == "net_switch" and upper.attrs["level"] == lower.attrs["level"] + 1:
                children.setdefault(_switch_name(upper), set()).add(_switch_name(lower))
        order = lambda name: (name.rstrip("0123456789"), int(re.sub(r"\D", "", name)))  # noqa: E731
        switches += [SlurmSwitch(name, switches=tuple(sorted(kids, key=order))) for name, kids in sorted(children.items(), key=lambda kv: (
            -len(kv[0]), order(kv[0])))]
    topo = SlurmTopology("tree", tuple(switches), notes=(f"{plan.spec.nodes} x {plan.spec.node}, {plan.layout()}",))
    check(topo)
    return topo


def hosts_per_node(topology) -> int:
    """Slurm nodes (hosts, one OS each) in one node of a cluster: an NVL72 rack's 18 compute trays (its
    ``attrs.hosts``), else 1."""
    hosts = topology.attrs.get("hosts", 1)
    return hosts if isinstance(hosts, int) and not isinstance(hosts, bool) and hosts > 1 else 1


def _rack_blocks(plan, hosts: list[str], per_node: int) -> SlurmTopology:
    """One block per rack (its compute trays: one NVLink domain); larger blocks of consecutive racks, each size a
    power-of-two multiple of a rack's, up to the racks of one rail group (leaf), which are one switch hop apart."""
    racks = plan.spec.nodes
    blocks = tuple(SlurmBlock(f"rack{k}", tuple(hosts[k * per_node:(k + 1) * per_node])) for k in range(racks))
    sizes, together = [per_node], min(racks, plan.nodes_per_leaf)
    while sizes[-1] * 2 <= together * per_node:
        sizes.append(sizes[-1] * 2)
    domain = plan.node_topology.attrs.get("nvlink_domain_gpus") or len(plan.node_topology.devices())
    topo = SlurmTopology("block", blocks=blocks, block_sizes=tuple(sizes),
                         notes=(f"{racks} x {plan.spec.node}, {plan.layout()}; a block is one rack: {per_node} "
                                f"compute trays, one NVLink domain of {domain} GPUs",))
    check(topo)
    return topo


def _switch_name(node) -> str:
    level = node.attrs["level"]
    return f"{LEVEL_NAMES.get(level, f'level{level}-')}{node.name.split('/')[1]}"


def _blocks(plan, hosts: list[str]) -> SlurmTopology:
    """Blocks of nodes one switch hop apart: a leaf's nodes, a rail group's on a rail network."""
    per = plan.nodes_per_leaf
    blocks = tuple(SlurmBlock(f"block{g}", tuple(hosts[g * per:(g + 1) * per])) for g in range(plan.groups))
    short = [b for b in blocks if len(b.nodes) < per]
    if short and len(blocks) > 1:
        raise MeshscaleError(f"--slurm-topology block: {short[0].name} would hold {len(short[0].nodes)} node(s), fewer "
                             f"than the {per} of the others, and Slurm takes no block smaller than the base block size; "
                             f"size the cluster in whole leaves (--nodes {plan.groups * per} or "
                             f"{(plan.groups - 1) * per})" + ("" if plan.rails else " or use --slurm-topology tree"))
    sizes = [len(blocks[0].nodes)]
    if plan.levels == 3 and not plan.rails:  # a pod of leaves is the next block, if Slurm can take its size
        pod = plan.ports_used // 2 * per
        if pod > sizes[0] and pod % sizes[0] == 0 and (pod // sizes[0]).bit_count() == 1 and pod <= len(hosts):
            sizes.append(pod)
    topo = SlurmTopology("block", blocks=blocks, block_sizes=tuple(sizes),
                         notes=(f"{plan.spec.nodes} x {plan.spec.node}, {plan.layout()}; a block is the nodes of one "
                                f"{'rail group' if plan.rails else 'leaf switch'}",))
    check(topo)
    return topo


# ---- Slurm's rules --------------------------------------------------------------------------------------------

def check(topo: SlurmTopology) -> SlurmTopology:
    """The rules Slurm's topology plugins enforce (a one-line error naming the first one broken)."""
    for part in (*topo.switches, *topo.blocks):
        check_name(part.name, "switch" if isinstance(part, SlurmSwitch) else "block")
        for node in part.nodes:
            check_name(node, f"node of {part.name}")
    if topo.kind == "tree":
        if not topo.switches:
            raise MeshscaleError("a topology/tree file needs at least one SwitchName line")
        seen = set()
        for s in topo.switches:
            if s.name in seen:
                raise MeshscaleError(f"switch {s.name} is defined twice")
            seen.add(s.name)
            if s.nodes and s.switches:
                raise MeshscaleError(f"switch {s.name} has both child switches and nodes")
        for s in topo.switches:
            missing = [c for c in s.switches if c not in seen or c == s.name]
            if missing:
                raise MeshscaleError(f"switch {s.name} has child {missing[0]}, which is not a switch of the file")
        homes: dict[str, str] = {}
        for leaf, nodes in topo.leaves().items():
            for node in nodes:
                if node in homes:
                    raise MeshscaleError(f"node {node} is on two leaf switches ({homes[node]} and {leaf})")
                homes[node] = leaf
        return topo
    if topo.kind != "block":
        raise MeshscaleError(f"unknown Slurm topology {topo.kind!r}; use tree or block")
    if not topo.blocks or not topo.block_sizes:
        raise MeshscaleError("a topology/block file needs BlockName lines and BlockSizes")
    base = topo.block_sizes[0]
    for a, b in zip(topo.block_sizes, topo.block_sizes[1:]):
        if b <= a or b % a or (b // a).bit_count() != 1:
            raise MeshscaleError(f"BlockSizes {','.join(map(str, topo.block_sizes))}: each size must be a power of two "
                                 "times the one before")
    small = next((b for b in topo.blocks if len(b.nodes) < base), None)
    if small:
        raise MeshscaleError(f"block {small.name} has {len(small.nodes)} nodes, fewer than the base block size {base}")
    seen_nodes: dict[str, str] = {}
    for b in topo.blocks:
        for node in b.nodes:
            if node in seen_nodes:
                raise MeshscaleError(f"node {node} is in two blocks ({seen_nodes[node]} and {b.name})")
            seen_nodes[node] = b.name
    return topo


# ---- writing and reading ---------------------------------------------------------------------------------------

def topology_conf(topo: SlurmTopology) -> str:
    """``topo`` in topology.conf syntax."""
    lines = [f"# Slurm topology/{topo.kind} configuration written by meshscale"] + [f"# {one_line(n)}" for n in topo.notes]
    if topo.kind == "tree":
        lines += [f"SwitchName={s.name} " + (f"Nodes={compress_hostlist(s.nodes)}" if s.nodes
                                             else f"Switches={compress_hostlist(s.switches)}") for s in topo.switches]
    else:
        lines += [f"BlockName={b.name} Nodes={compress_hostlist(b.nodes)}" for b in topo.blocks]
        lines.append(f"BlockSizes={','.join(map(str, topo.block_sizes))}")
    return "\n".join(lines) + "\n"


def topology_yaml(topo: SlurmTopology, name: str = "meshscale") -> str:
    """``topo`` as one topology of a topology.yaml (the cluster default)."""
    import yaml
    if topo.kind == "tree":
        body = {"tree": {"switches": [{"switch": s.name, **({"nodes": compress_hostlist(s.nodes)} if s.nodes else
                                                            {"children": compress_hostlist(s.switches)})}
                                      for s in topo.switches]}}
    else:
        body = {"block": {"block_sizes": list(topo.block_sizes),
                          "blocks": [{"block": b.name, "nodes": compress_hostlist(b.nodes)} for b in topo.blocks]}}
    head = "".join(f"# {one_line(n)}\n" for n in (f"Slurm topology/{topo.kind} configuration written by meshscale",
                                                   *topo.notes))
    return head + yaml.safe_dump([{"topology": name, "cluster_default": True, **body}], sort_keys=False)


def parse_topology_conf(text: str) -> SlurmTopology:
    """A topology.conf as Slurm reads it: ``#`` comments, case-insensitive keys, hostlist expressions."""
    switches, blocks, sizes = [], [], ()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = {}
        for word in line.split():
            key, eq, value = word.partition("=")
            if not eq:
                raise MeshscaleError(f"topology.conf line {number}: {word!r} is not KEY=VALUE")
            fields[key.lower()] = value
        if "switchname" in fields:
            unknown = set(fields) - {"switchname", "nodes", "switches", "linkspeed"}
            if unknown:
                raise MeshscaleError(f"topology.conf line {number}: unknown key(s) {', '.join(sorted(unknown))}")
            switches.append(SlurmSwitch(fields["switchname"], tuple(expand_hostlist(fields.get("nodes", ""))),
                                        tuple(expand_hostlist(fields.get("switches", "")))))
        elif "blockname" in fields:
            blocks.append(SlurmBlock(fields["blockname"], tuple(expand_hostlist(fields.get("nodes", "")))))
        elif "blocksizes" in fields:
            try:
                sizes = tuple(int(x) for x in fields["blocksizes"].split(","))
            except ValueError:
                raise MeshscaleError(f"topology.conf line {number}: BlockSizes takes whole numbers") from None
        else:
            raise MeshscaleError(f"topology.conf line {number}: expected SwitchName, BlockName or BlockSizes")
    if switches and (blocks or sizes):
        raise MeshscaleError("topology.conf mixes switches (topology/tree) and blocks (topology/block)")
    return check(SlurmTopology("tree", tuple(switches)) if switches else SlurmTopology("block", (), tuple(blocks), sizes))


def parse_topology_yaml(text: str) -> SlurmTopology:
    """The cluster-default topology of a topology.yaml (its tree or block part)."""
    import yaml
    data = yaml.safe_load(text)
    if not isinstance(data, list) or not data:
        raise MeshscaleError("topology.yaml: expected a list of topologies")
    topo = next((t for t in data if t.get("cluster_default")), data[0])
    if "tree" in topo:
        return check(SlurmTopology("tree", tuple(SlurmSwitch(s["switch"], tuple(expand_hostlist(s.get("nodes", ""))),
                                                             tuple(expand_hostlist(s.get("children", ""))))
                                               for s in topo["tree"]["switches"])))
    if "block" in topo:
        b = topo["block"]
        return check(SlurmTopology("block", (), tuple(SlurmBlock(x["block"], tuple(expand_hostlist(x["nodes"])))
                                                      for x in b["blocks"]), tuple(int(s) for s in b["block_sizes"])))
    raise MeshscaleError("topology.yaml: the topology has neither tree nor block")


def write_topology(topo: SlurmTopology, path) -> "Path":
    """Write ``topo`` to ``path``: topology.yaml syntax for a .yaml/.yml file, topology.conf syntax otherwise."""
    from pathlib import Path

    from meshscale.safe_io import atomic_write
    path = Path(path)
    text = topology_yaml(topo) if path.suffix in (".yaml", ".yml") else topology_conf(topo)
    return atomic_write(path, text)


# ---- a job's GPUs on one node ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SlurmBinding:
    """The chosen GPUs as Slurm takes them: gres.conf lines (device file, cores near it, NVLinks to every GPU of
    the node) and the srun options that bind one task to each GPU and to the CPU socket (NUMA domain) beside it."""

    gres_lines: tuple[str, ...]
    srun_options: tuple[str, ...]
    notes: tuple[str, ...] = ()


def gres_binding(topo, devices: list[int]) -> SlurmBinding:
    """gres.conf(5) lines for ``devices`` of ``topo``: ``File=/dev/nvidiaN``, ``Cores=`` (the GPU's CPU affinity,
    where discovery knows it) and ``Links=`` (NVLinks to device 0, 1, ... of the node; -1 for itself, 0 for none,
    as nvidia-smi counts them through NVSwitches too); and srun's ``--gres=gpu:K --ntasks-per-node=K
    --gpu-bind=map_gpu:... --cpu-bind=map_ldom:...`` (one task per GPU, each on its GPU's NUMA domain)."""
    from meshscale.topology.queries import relation

    every = topo.device_indices()
    lines, domains, notes = [], [], []
    for i in devices:
        attrs = topo.nodes[topo.device(i)].attrs
        links = ",".join("-1" if j == i else (lambda r: r[2:] if r.startswith("NV") else "0")(relation(topo, i, j))
                         for j in every)
        cores = f" Cores={attrs['cpu_affinity']}" if attrs.get("cpu_affinity") else ""
        kind = re.sub(r"[^A-Za-z0-9]+", "_", str(attrs.get("model", "gpu")).replace("NVIDIA ", "")).strip("_").lower()
        lines.append(f"Name=gpu Type={kind} File=/dev/nvidia{i}{cores} Links={links}")
        domains.append(attrs.get("numa"))
    if not any(attrs.get("cpu_affinity") for attrs in (topo.nodes[topo.device(i)].attrs for i in devices)):
        notes.append("the system file gives no CPU affinity per GPU: gres.conf has no Cores= (discovery on the node "
                     "gives them)")
    options = [f"--gres=gpu:{len(devices)}", f"--ntasks-per-node={len(devices)}",
               f"--gpu-bind=map_gpu:{','.join(map(str, devices))}"]
    if all(d is not None for d in domains):
        options.append(f"--cpu-bind=map_ldom:{','.join(map(str, domains))}")
    else:
        notes.append("no NUMA node known for every chosen GPU: no --cpu-bind")
    return SlurmBinding(tuple(lines), tuple(options), tuple(notes))
