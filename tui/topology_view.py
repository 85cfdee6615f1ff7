"""Topology view: one node's link matrix as nvidia-smi users read it, and its node > NUMA > switch > GPU tree.

The tree is the one `hsched topo show` prints: both read the node's networkx graph (hsched.topo.graph), so the
NUMA nodes, the PCIe bridges and switches inferred from the matrix, and the NVLink domains are the same in both.

The matrix and tree change only when the node, its links, its owners or the highlighted job change, so they are
redrawn on that signature, not on every frame.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hsched.tui.fmt import LINK_COLOR, link_color, node_state_text
from hsched.tui.model import Frame, JobRow, NodeView
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Static, Tree
from textual.widgets.tree import TreeNode as TreeNode_t

from hsched.topo.graph import TreeNode, build_graph, domain_label, topology_tree
from hsched.topo.inventory import MIG_INDEX
from hsched.topo.topology import TopoDevice, TopoLink, Topology, TopoNic

if TYPE_CHECKING:
    import networkx as nx


def node_topology(node: NodeView) -> Topology:
    """The node as a hsched.topo Topology (devices named GPU0, GPU0.1 for a MIG instance, as `topo show` names
    them; endpoints of links that are no device are its NICs), for the one topology graph."""
    names = {d.uuid: _device_name(d.index) for d in node.devices}
    devices = tuple(TopoDevice(name=names[d.uuid], index=d.index, uuid=d.uuid, model=d.model,
                               numa_node=d.numa_node) for d in node.devices)
    nics = sorted({x for lk in node.links for x in (lk.a, lk.b)} - set(names), key=_natural)
    links = tuple(TopoLink(names.get(lk.a, lk.a), names.get(lk.b, lk.b), lk.kind)
                  for lk in node.links if lk.a != lk.b)
    return Topology(devices=devices, nics=tuple(TopoNic(n) for n in nics), links=links, source_format="node")


def node_tree(node: NodeView) -> tuple[nx.Graph, TreeNode]:
    """The node's topology graph and its tree: the graph `topo show` reads (hsched.topo.graph), so both show the
    same NUMA nodes, PCIe switches and NVLink domains."""
    g = build_graph(node_topology(node), name=node.name)
    return g, topology_tree(g)


def _device_name(index: int) -> str:
    # a MIG instance's index encodes its GPU and slot (hsched.topo.inventory.mig_index)
    if index >= MIG_INDEX:
        return f"GPU{index // MIG_INDEX - 1}.{index % MIG_INDEX}"
    return f"GPU{index}"


def _natural(name: str) -> tuple[str, int]:
    head = name.rstrip("0123456789")
    return (head, int(name[len(head):]) if name[len(head):] else -1)


# how the dashboard names the tree's inner nodes (topo show prints the graph's own names: numa0, switch0)
_KIND_LABEL = {"numa": "NUMA", "switch": "PCIe switch", "bridge": "PCIe bridge", "hostbridge": "host bridge"}


class TopologyView(Vertical):
    DEFAULT_CSS = """
    TopologyView { height: 1fr; }
    TopologyView #topo-title { height: auto; padding: 0 1; }
    TopologyView #topo-body { height: 1fr; }
    TopologyView #topo-matrix-box { width: 2fr; padding: 0 1; overflow-x: auto; }
    TopologyView #topo-tree { width: 1fr; min-width: 30; }
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.node_name: str | None = None
        self.highlight: JobRow | None = None
        self.frame: Frame | None = None
        self._signature: object = None
        self.title = Static("", id="topo-title")
        self.matrix = Static("", id="topo-matrix")
        self.legend = Static(self._legend(), id="topo-legend")
        self.node_tree: Tree[str] = Tree("fleet", id="topo-tree")

    def compose(self) -> ComposeResult:
        yield self.title
        with Horizontal(id="topo-body"):
            with VerticalScroll(id="topo-matrix-box"):
                yield self.matrix
                yield self.legend
            yield self.node_tree

    def apply(self, frame: Frame) -> None:
        self.frame = frame
        if self.node_name is None or frame.node(self.node_name) is None:
            self.node_name = frame.nodes[0].name if frame.nodes else None
        if self.highlight is not None:
            self.highlight = frame.job(self.highlight.id) or self.highlight
        self._redraw()

    def show(self, node: str | None = None, job: JobRow | None = None) -> None:
        if job is not None:
            self.highlight = job
            node = node or (job.node.split(",")[0] if job.node else None)
        if node:
            self.node_name = node
        self._redraw()

    def step_node(self, delta: int) -> None:
        if self.frame is None or not self.frame.nodes:
            return
        names = [n.name for n in self.frame.nodes]
        i = names.index(self.node_name) if self.node_name in names else 0
        self.node_name = names[(i + delta) % len(names)]
        self._redraw()

    def _redraw(self) -> None:
        node = self.frame.node(self.node_name) if self.frame and self.node_name else None
        hl = self.highlight
        hl_devices = frozenset(hl.devices) if hl is not None else frozenset()
        signature = (node, hl.id if hl else None, hl_devices)
        if signature == self._signature:
            return
        self._signature = signature
        if node is None:
            self.title.update("no node")
            self.matrix.update("")
            return
        title = Text()
        title.append(f"{node.name} ", style="bold")
        title.append_text(node_state_text(node.state))
        title.append(f"  {len(node.devices)} devices, {node.numa_nodes or 1} NUMA  ([ and ] change node)")
        if hl is not None:
            title.append(f"  job {hl.id} ({hl.name}) ", style="reverse")
            title.append(" on this node" if any(d.uuid in hl_devices for d in node.devices) else " not here")
        self.title.update(title)
        self.matrix.update(self._matrix(node, hl_devices))
        self._tree(node, hl_devices)

    @staticmethod
    def _legend() -> Text:
        """nvidia-smi's legend, best link first, in the matrix's colours."""
        legend = Text("\nlinks, best first: ")
        for name, color in LINK_COLOR.items():
            if name != "X":
                legend.append(f" {name} ", style=color)
        return legend

    @staticmethod
    def _matrix(node: NodeView, hl: frozenset[str]) -> Table:
        devs = node.devices
        kinds = {frozenset((lk.a, lk.b)): lk.kind for lk in node.links}
        uuids = {d.uuid for d in devs}
        # endpoints that are not devices (NICs) get columns of their own, as in nvidia-smi's matrix
        others = sorted({x for lk in node.links for x in (lk.a, lk.b)} - uuids)
        table = Table(box=None, pad_edge=False, show_edge=False, header_style="bold", padding=(0, 1))
        table.add_column("")
        for d in devs:
            table.add_column(Text(f"GPU{d.index}", style="reverse" if d.uuid in hl else ""), justify="center",
                             no_wrap=True, min_width=4)
        for o in others:
            table.add_column(o, justify="center")
        table.add_column("NUMA", justify="center")
        table.add_column("JOB", justify="right")
        for d in devs:
            row: list[Text] = [Text(f"GPU{d.index}", style="bold reverse" if d.uuid in hl else "bold")]
            for e in devs:
                kind = "X" if e.uuid == d.uuid else kinds.get(frozenset((d.uuid, e.uuid)), "")
                style = link_color(kind)
                if d.uuid in hl and e.uuid in hl:
                    style += " reverse"
                row.append(Text(kind, style=style))
            for o in others:
                kind = kinds.get(frozenset((d.uuid, o)), "")
                row.append(Text(kind, style=link_color(kind)))
            row.append(Text("N/A" if d.numa_node is None else str(d.numa_node)))
            row.append(Text("" if d.job is None else str(d.job)))
            table.add_row(*row)
        return table

    def _tree(self, node: NodeView, hl: frozenset[str]) -> None:
        tree = self.node_tree
        tree.clear()
        tree.root.set_label(Text(node.name, style="bold"))
        g, top = node_tree(node)
        by_name = {_device_name(d.index): d for d in node.devices}

        def label(n: TreeNode) -> Text:
            d = by_name.get(n.name)
            if d is not None:
                return Text(f"{n.name} {d.model}" + (f"  job {d.job}" if d.job is not None else ""),
                            style="bold reverse" if d.uuid in hl else "")
            if n.type in ("nvlink", "xgmi"):
                return Text(domain_label(g, n.name), style=link_color(str(g.nodes[n.name]["kinds"][0])))
            if n.type == "mig-gpu":
                return Text(f"{n.name} {g.nodes[n.name].get('model') or ''}".rstrip())
            head = n.name.rstrip("0123456789")
            return Text(f"{_KIND_LABEL[head]} {n.name[len(head):]}" if head in _KIND_LABEL else n.name)

        def add(parent: TreeNode_t[str], n: TreeNode) -> None:
            if not n.children:
                parent.add_leaf(label(n))
                return
            branch = parent.add(label(n), expand=True)
            for c in n.children:
                add(branch, c)

        for c in top.children:
            add(tree.root, c)
        tree.root.expand()
