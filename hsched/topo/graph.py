"""The topology as a networkx graph: machine > NUMA nodes > host bridges > PCIe switches > GPUs and NICs,
plus one "peer" edge per device pair carrying the tool's link kind.

The PCIe tree is inferred from the matrix, since `topo -m` does not print it: devices whose pair is PIX share
a switch, PXB pairs share a switch tree, PHB pairs share a host bridge (union-find at each level, strongest
first). NVLink and XGMI pairs say nothing about the PCIe path (a pair can be NV2 and SYS in PCIe terms), so
they only become peer edges. Every edge has `kind`, `relation` ("tree" or "peer") and `bandwidth_gbps`
(from the table in `hsched.topo.links`).

networkx is imported here and only here, so the rest of hsched.topo stays cheap to import.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from hsched.topo.links import LinkClass, PcieLink, estimate_bandwidth_gbps, link_class
from hsched.topo.topology import Topology

if TYPE_CHECKING:
    import networkx as nx

MACHINE = "machine"


class _UnionFind:
    def __init__(self, items: Iterable[str]) -> None:
        self.parent = {x: x for x in items}

    def find(self, x: str) -> str:
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)

    def groups(self) -> list[list[str]]:
        out: dict[str, list[str]] = {}
        for x in self.parent:
            out.setdefault(self.find(x), []).append(x)
        return sorted(out.values(), key=lambda g: min(g))


def build_graph(topology: Topology, *, name: str = MACHINE, pcie: PcieLink | None = None) -> nx.Graph:
    """A networkx Graph of the machine (see the module docstring for nodes and edge attributes)."""
    import networkx as nx

    pcie = pcie or PcieLink()
    g = nx.Graph(name=name, partial=topology.partial)
    g.add_node(name, type="machine")
    members = [d.name for d in topology.devices] + [n.name for n in topology.nics]
    for d in topology.devices:
        g.add_node(d.name, type="gpu", index=d.index, numa_node=d.numa_node, model=d.model, uuid=d.uuid)
    for n in topology.nics:
        g.add_node(n.name, type="nic", device=n.device, numa_node=n.numa_node)

    # NUMA placement of every member; NICs inherit the NUMA node of the GPUs they are PIX/PXB/PHB to
    numa_of: dict[str, int | None] = {d.name: d.numa_node for d in topology.devices}
    numa_of.update({n.name: n.numa_node for n in topology.nics})
    numa_ids = sorted({v for v in numa_of.values() if v is not None} | {n.id for n in topology.numa})
    for i in numa_ids:
        g.add_node(f"numa{i}", type="numa", id=i)
        g.add_edge(name, f"numa{i}", kind="SYS", relation="tree", bandwidth_gbps=None)

    # infer the PCIe tree, strongest level first
    parent: dict[str, str] = {}
    levels = ((LinkClass.PIX, "switch", "PIX"), (LinkClass.PXB, "bridge", "PXB"), (LinkClass.PHB, "hostbridge", "PHB"))
    current = {m: m for m in members}  # member -> the tree node that currently stands for it
    for level, label, kind in levels:
        uf = _UnionFind(members)
        for lk in topology.links:
            cls = link_class(lk.kind)
            if cls != LinkClass.FABRIC and cls >= level and lk.a in current and lk.b in current:
                uf.union(lk.a, lk.b)
        for i, grp in enumerate(uf.groups()):
            tops = sorted({current[m] for m in grp})
            if len(tops) < 2:
                continue  # nothing new joins at this level
            node = f"{label}{i}"
            g.add_node(node, type=label)
            for t in tops:
                g.add_edge(node, t, kind=kind, relation="tree", bandwidth_gbps=pcie.gbps)
                parent[t] = node
            for m in grp:
                current[m] = node
    # hang each top-level PCIe node (or lone device) under its NUMA node, else under the machine
    for top in sorted(set(current.values())):
        if top in parent:
            continue
        leaves = [m for m, t in current.items() if t == top]
        nodes = {numa_of.get(m) for m in leaves} - {None}
        target = f"numa{next(iter(nodes))}" if len(nodes) == 1 else name
        g.add_edge(target, top, kind="NODE" if target != name else "SYS", relation="tree", bandwidth_gbps=pcie.gbps)

    _hang_mig_instances(g, topology)
    models = {d.name: d.model for d in topology.devices}
    for lk in topology.links:
        g.add_edge(
            lk.a,
            lk.b,
            kind=lk.kind,
            relation="peer",
            weight=lk.weight,
            bandwidth_gbps=lk.bandwidth_gbps
            or estimate_bandwidth_gbps(lk.kind, model=models.get(lk.a), pcie=pcie, weight=lk.weight),
        )
    return g


def _hang_mig_instances(g: nx.Graph, topology: Topology) -> None:
    """A MIG instance (GPU0.1: hsched.topo.place.topology_of_node's name for slot 1 of GPU 0) hangs under its GPU,
    which takes the instances' place in the tree: the GPU is no device of its own in MIG mode, but where its slices
    sit (its NUMA node, its switch) is where it sits."""
    slices: dict[str, list[str]] = {}
    for d in topology.devices:
        gpu, dot, slot = d.name.partition(".")
        if dot and slot.isdigit() and gpu not in g:
            slices.setdefault(gpu, []).append(d.name)
    for gpu, names in slices.items():
        model = next((d.model for d in topology.devices if d.name == names[0]), None)
        g.add_node(gpu, type="mig-gpu", model=model.split(" MIG ")[0] if model else None)
        above: dict[str, dict[str, object]] = {}
        for n in names:
            for up in [u for u in g.neighbors(n) if g.edges[n, u].get("relation") == "tree"]:
                above[up] = dict(g.edges[n, up])
                g.remove_edge(n, up)
            g.add_edge(gpu, n, kind="MIG", relation="tree", bandwidth_gbps=None)
        for up, data in above.items():
            g.add_edge(up, gpu, **data)


def tree_lines(topology: Topology) -> list[str]:
    """The inferred tree as indented text lines (machine > NUMA > bridges > switches > GPU/NIC)."""
    g = build_graph(topology)
    tree_edges = [(u, v) for u, v, rel in g.edges(data="relation") if rel == "tree"]
    import networkx as nx

    t = nx.Graph(tree_edges)
    if MACHINE not in t:
        return [MACHINE] + [f"  {d.name}" for d in topology.devices]
    lines: list[str] = []

    def label(n: str) -> str:
        data = g.nodes[n]
        if data.get("type") == "nic" and data.get("device") and data["device"] != n:
            return f"{n} ({data['device']})"
        if data.get("type") in ("gpu", "mig-gpu") and data.get("model"):
            return f"{n} ({data['model']})"
        return n

    def walk(n: str, depth: int, seen: set[str]) -> None:
        seen.add(n)
        lines.append("  " * depth + label(n))
        kids = sorted((c for c in t.neighbors(n) if c not in seen), key=_natural_key)
        for c in kids:
            walk(c, depth + 1, seen)

    walk(MACHINE, 0, set())
    return lines


def _natural_key(s: str) -> tuple[str, int]:
    head = s.rstrip("0123456789")
    tail = s[len(head) :]
    return (head, int(tail) if tail else -1)
