"""Topology view: one node's link matrix as nvidia-smi users read it, and its node > NUMA > switch > GPU tree.

The matrix and tree change only when the node, its links, its owners or the highlighted job change, so they are
redrawn on that signature, not on every frame.
"""

from __future__ import annotations

from typing import Any

from hsched.tui.fmt import LINK_COLOR, link_color, node_state_text
from hsched.tui.model import DeviceView, Frame, JobView, NodeView
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import Static, Tree


def switch_groups(node: NodeView) -> dict[str, str]:
    """uuid -> the switch it hangs off: NVSwitch when every pair is NVLinked, else PCIe switches found as
    groups of devices joined by PIX/PXB links (the ones that share a switch)."""
    uuids = [d.uuid for d in node.devices]
    kinds = {frozenset((lk.a, lk.b)): lk.kind for lk in node.links}
    pairs = [frozenset((a, b)) for i, a in enumerate(uuids) for b in uuids[i + 1:]]
    if pairs and all(kinds.get(p, "").startswith("NV") for p in pairs):
        return dict.fromkeys(uuids, "NVSwitch")
    parent = {u: u for u in uuids}

    def find(u: str) -> str:
        while parent[u] != u:
            u = parent[u]
        return u

    for p, kind in kinds.items():
        if kind in ("PIX", "PXB") and len(p) == 2 and p <= set(uuids):
            a, b = sorted(p)
            parent[find(a)] = find(b)
    roots: dict[str, int] = {}
    out: dict[str, str] = {}
    for u in uuids:
        r = find(u)
        members = [v for v in uuids if find(v) == r]
        if len(members) < 2:
            out[u] = "PCIe (root)"
        else:
            out[u] = f"PCIe switch {roots.setdefault(r, len(roots))}"
    return out


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
        self.highlight: JobView | None = None
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

    def show(self, node: str | None = None, job: JobView | None = None) -> None:
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
        groups = switch_groups(node)
        by_numa: dict[str, dict[str, list[DeviceView]]] = {}
        for d in node.devices:
            numa = "NUMA ?" if d.numa_node is None else f"NUMA {d.numa_node}"
            by_numa.setdefault(numa, {}).setdefault(groups.get(d.uuid, "PCIe"), []).append(d)
        for numa, switches in by_numa.items():
            n = tree.root.add(numa, expand=True)
            for switch, devs in switches.items():
                s = n.add(switch, expand=True)
                for d in devs:
                    label = Text(f"GPU{d.index} {d.model}" + (f"  job {d.job}" if d.job is not None else ""),
                                 style="bold reverse" if d.uuid in hl else "")
                    s.add_leaf(label)
        tree.root.expand()
