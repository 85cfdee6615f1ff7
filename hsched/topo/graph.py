"""The topology as a networkx graph: machine > NUMA nodes > host bridges > PCIe switches > GPUs and NICs,
plus one "peer" edge per device pair carrying the tool's link kind.

The PCIe tree is inferred from the matrix, since `topo -m` does not print it: devices whose pair is PIX share
a switch, PXB pairs share a switch tree, PHB pairs share a host bridge (union-find at each level, strongest
first). NVLink and XGMI pairs say nothing about the PCIe path (a pair can be NV2 and SYS in PCIe terms), so
they only become peer edges, and each set of GPUs joined through them (an NVLink or XGMI domain: a connected
component of the fabric pairs) becomes a node of its own (`nvlink0`, `xgmi0`) with a "domain" edge to each
member and, as attributes, its link kinds and its largest all-to-all set (`hsched.topo.cliques`, the search
placement uses). Every edge has `kind`, `relation` ("tree", "peer" or "domain") and `bandwidth_gbps` (from the
table in `hsched.topo.links`).

`topology_tree` reads the graph as the tree that `topo show` prints (`tree_lines`) and the dashboard draws
(`hsched.tui.topology_view`): one graph, so the two cannot disagree.

networkx is imported here and only here, so the rest of hsched.topo stays cheap to import.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hsched.topo.cliques import largest_clique
from hsched.topo.links import LinkClass, PcieLink, estimate_bandwidth_gbps, link_class, link_strength
from hsched.topo.place import format_device_range
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

    # NUMA placement of every member
    devices = {d.name: d.numa_node for d in topology.devices}
    nics = {n.name for n in topology.nics}
    numa_of: dict[str, int | None] = dict(devices)
    numa_of.update({n.name: n.numa_node for n in topology.nics})
    for lk in topology.links:
        # a NIC whose NUMA node the source did not say takes that of a GPU on its socket (PIX..NODE), as the
        # nvidia-smi parser does: the dashboard's nodes carry NICs only as link ends
        nic, gpu = (lk.a, lk.b) if lk.b in devices else (lk.b, lk.a)
        if nic in nics and gpu in devices and numa_of.get(nic) is None and lk.kind in ("PIX", "PXB", "PHB", "NODE"):
            numa_of[nic] = devices[gpu]
    numa_ids = sorted({v for v in numa_of.values() if v is not None} | {n.id for n in topology.numa})
    for i in numa_ids:
        g.add_node(f"numa{i}", type="numa", id=i)
        g.add_edge(name, f"numa{i}", kind="SYS", relation="tree", bandwidth_gbps=None)

    # infer the PCIe tree, strongest level first
    parent: dict[str, str] = {}
    levels = ((LinkClass.PIX, "switch", "PIX"), (LinkClass.PXB, "bridge", "PXB"), (LinkClass.PHB, "hostbridge", "PHB"))
    current = {m: m for m in members}  # member -> the tree node that currently stands for it
    count: dict[str, int] = {}  # numbered in order per label (switch0, switch1, ...), not by union-find group
    for level, label, kind in levels:
        uf = _UnionFind(members)
        for lk in topology.links:
            cls = link_class(lk.kind)
            if cls != LinkClass.FABRIC and cls >= level and lk.a in current and lk.b in current:
                uf.union(lk.a, lk.b)
        for grp in uf.groups():
            tops = sorted({current[m] for m in grp})
            if len(tops) < 2:
                continue  # nothing new joins at this level
            node = f"{label}{count.get(label, 0)}"
            count[label] = count.get(label, 0) + 1
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
    _add_fabric_domains(g, topology)
    return g


def _add_fabric_domains(g: nx.Graph, topology: Topology) -> None:
    """One node per NVLink/XGMI domain: the devices reachable from each other through fabric pairs."""
    devices = [d.name for d in sorted(topology.devices, key=lambda d: (d.index, d.name))]
    adj: dict[str, set[str]] = {d: set() for d in devices}
    for lk in topology.links:
        if link_class(lk.kind) == LinkClass.FABRIC and lk.a in adj and lk.b in adj and lk.a != lk.b:
            adj[lk.a].add(lk.b)
            adj[lk.b].add(lk.a)
    seen: set[str] = set()
    count: dict[str, int] = {}
    for start in devices:
        if start in seen or not adj[start]:
            continue
        comp, todo = {start}, [start]
        while todo:
            for v in adj[todo.pop()] - comp:
                comp.add(v)
                todo.append(v)
        seen |= comp
        members = [d for d in devices if d in comp]
        found = {lk.kind for lk in topology.links
                 if lk.a in comp and lk.b in comp and link_class(lk.kind) == LinkClass.FABRIC}
        ordered = sorted(found, key=lambda k: link_strength(k), reverse=True)
        family = "xgmi" if any(k.upper().startswith("XGMI") for k in ordered) else "nvlink"
        node = f"{family}{count.get(family, 0)}"
        count[family] = count.get(family, 0) + 1
        clique = largest_clique(members, adj)
        g.add_node(node, type=family, members=tuple(members), kinds=tuple(ordered), clique=clique)
        for m in members:
            g.add_edge(node, m, kind=family.upper(), relation="domain", bandwidth_gbps=None)


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


@dataclass(frozen=True, slots=True)
class TreeNode:
    """One node of the topology tree: a graph node's name, its `type` (machine, numa, hostbridge, bridge,
    switch, gpu, mig-gpu, nic, nvlink, xgmi) and its children, in the order they are shown."""

    name: str
    type: str
    children: tuple[TreeNode, ...] = ()


def topology_tree(g: nx.Graph) -> TreeNode:
    """The graph's tree from its machine node: the PCIe tree (machine > NUMA > bridges > switches > GPUs and
    NICs, MIG instances under their GPU), then one leaf per NVLink/XGMI domain (its members are in the tree
    already; `domain_label` says who they are)."""
    root = next((n for n, t in g.nodes(data="type") if t == "machine"), MACHINE)
    tree_edges = [(u, v) for u, v, rel in g.edges(data="relation") if rel == "tree"]
    kids: dict[str, list[str]] = {}
    for u, v in tree_edges:
        kids.setdefault(u, []).append(v)
        kids.setdefault(v, []).append(u)

    def walk(n: str, seen: set[str]) -> TreeNode:
        seen.add(n)
        below = sorted((c for c in kids.get(n, ()) if c not in seen), key=_natural_key)
        return TreeNode(n, str(g.nodes[n].get("type", "")), tuple(walk(c, seen) for c in below))

    top = walk(root, set())
    domains = sorted((n for n, t in g.nodes(data="type") if t in ("nvlink", "xgmi")), key=_natural_key)
    return TreeNode(top.name, top.type, top.children + tuple(TreeNode(d, str(g.nodes[d]["type"])) for d in domains))


def domain_label(g: nx.Graph, node: str) -> str:
    """`nvlink0: GPU0-7 (NV18, all pairs)`, or with the largest all-to-all set when not every pair is linked:
    `nvlink0: GPU0-7 (NV2/NV1, all pairs within GPU0-3)` (what `--interconnect nvlink` can get at most)."""
    data = g.nodes[node]
    members, clique = list(data["members"]), list(data["clique"])
    kinds = "/".join(data["kinds"])
    reach = "all pairs" if len(clique) == len(members) else f"all pairs within {format_device_range(clique)}"
    return f"{node}: {format_device_range(members)} ({kinds}, {reach})"


def tree_lines(topology: Topology) -> list[str]:
    """The inferred tree as indented text lines (machine > NUMA > bridges > switches > GPU/NIC, then the
    NVLink domains): `topology_tree` of `build_graph`, as the dashboard draws it."""
    g = build_graph(topology)
    root = topology_tree(g)
    if not root.children:
        return [MACHINE] + [f"  {d.name}" for d in topology.devices]
    lines: list[str] = []

    def label(n: TreeNode) -> str:
        data = g.nodes[n.name]
        if n.type == "nic" and data.get("device") and data["device"] != n.name:
            return f"{n.name} ({data['device']})"
        if n.type in ("gpu", "mig-gpu") and data.get("model"):
            return f"{n.name} ({data['model']})"
        if n.type in ("nvlink", "xgmi"):
            return domain_label(g, n.name)
        return n.name

    def walk(n: TreeNode, depth: int) -> None:
        lines.append("  " * depth + label(n))
        for c in n.children:
            walk(c, depth + 1)

    walk(root, 0)
    return lines


def _natural_key(s: str) -> tuple[str, int]:
    head = s.rstrip("0123456789")
    tail = s[len(head) :]
    return (head, int(tail) if tail else -1)
