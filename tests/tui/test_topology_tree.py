"""The dashboard's topology tree is `hsched topo show`'s tree (issue 19): both read the one networkx graph of
hsched.topo.graph. Before, the dashboard grouped GPUs by a union-find of its own (PIX and PXB pairs merged into
one "PCIe switch", every all-NVLink node drawn as one "NVSwitch" under each NUMA node, NICs left out), so on a
DGX-1 it drew one flat group where `topo show` drew four switches under two host bridges."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from hsched.tui.model import DeviceView, Frame, LinkView, NodeView
from hsched.tui.topology_view import TopologyView
from textual.app import App, ComposeResult
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from hsched.model import Node, NodeState
from hsched.topo.graph import tree_lines
from hsched.topo.inventory import Inventory
from hsched.topo.parse import parse_topology, read_capture
from hsched.topo.place import topology_of_node
from hsched.topo.topology import Topology
from tests.conftest import FIXTURES
from tests.topo.captures import capture

# the dashboard names inner nodes for people; topo show prints the graph's names (numa0, switch0)
DASH_NAMES = {"NUMA": "numa", "PCIe switch": "switch", "PCIe bridge": "bridge", "host bridge": "hostbridge"}


def node_view(topo: Topology, name: str = "machine") -> NodeView:
    """The topology as the controller's snapshot gives it to the dashboard: devices by UUID, NICs by name."""
    uuid = {d.name: f"GPU-{name}-{d.index:02d}" for d in topo.devices}
    devices = tuple(DeviceView(uuid=uuid[d.name], index=d.index, model=d.model or "GPU", memory_total_mib=None,
                               memory_used_mib=None, utilization_gpu=None, numa_node=d.numa_node,
                               temperature_c=None, power_w=None, job=None) for d in topo.devices)
    links = tuple(LinkView(uuid.get(lk.a, lk.a), uuid.get(lk.b, lk.b), lk.kind) for lk in topo.links)
    return NodeView(name=name, state="UP", executor="local", cpus=None, memory_total_mib=None, numa_nodes=None,
                    message="", devices=devices, links=links)


class _One(App[None]):
    def __init__(self, node: NodeView) -> None:
        super().__init__()
        self.node = node
        self.view = TopologyView()

    def compose(self) -> ComposeResult:
        yield self.view


def dashboard_lines(node: NodeView) -> list[str]:
    """The dashboard's tree as `topo show` would print it: indented names."""
    lines: list[str] = []

    async def go() -> None:
        app = _One(node)
        async with app.run_test(size=(160, 60)) as pilot:
            app.view.apply(Frame(version=1, time="", jobs=(), nodes=(node,)))
            await pilot.pause()
            tree: Tree[str] = app.view.query_one("#topo-tree", Tree)

            def walk(n: TreeNode[str], depth: int) -> None:
                lines.append("  " * depth + _name(str(n.label)))
                for c in n.children:
                    walk(c, depth + 1)

            walk(tree.root, 0)

    asyncio.run(go())
    return lines


def _name(label: str) -> str:
    """"PCIe switch 3" -> switch3, "GPU0 NVIDIA H100 ...  job 1" -> GPU0; a domain line stays whole."""
    if ":" in label:
        return label
    for shown, name in DASH_NAMES.items():
        if label.startswith(shown + " "):
            return name + label[len(shown) + 1 :]
    return label.split(" ")[0]


def topo_show_lines(topo: Topology, name: str) -> list[str]:
    lines = tree_lines(topo)
    return [name] + [ln if ":" in ln else ln.split(" (")[0] for ln in lines[1:]]


@pytest.mark.parametrize("capture_name", [
    # PCIe switches holding GPU pairs and a NIC each, under two host bridges, NVLink (NV1/NV2) across them
    "nvidia-smi-topo__dgx1-v100-4nic-oldlegend.txt",
    # every GPU pair NV18 (one NVLink domain over two NUMA nodes), a switch per GPU with its NIC
    "nvidia-smi-topo__h100-sxm-8gpu-11nic-ansi.txt",
    # two GPUs NVLinked, no PCIe switch
    "nvidia-smi-topo__2gpu-nv2-workstation.txt",
])
def test_dashboard_tree_is_topo_shows_tree(capture_name: str) -> None:
    topo = parse_topology(capture(capture_name))
    assert dashboard_lines(node_view(topo, "box")) == topo_show_lines(topo, "box")


def test_dgx1_tree_shows_switches_bridges_and_the_nvlink_domain() -> None:
    topo = parse_topology(capture("nvidia-smi-topo__dgx1-v100-4nic-oldlegend.txt"))
    lines = dashboard_lines(node_view(topo, "dgx1"))
    assert lines[:5] == ["dgx1", "  hostbridge0", "    switch0", "      GPU0", "      GPU1"]
    # the hybrid cube mesh: all eight reach each other over NVLink, but only four are pairwise linked
    assert lines[-1] == "  nvlink0: GPU0-7 (NV2/NV1, all pairs within GPU0-3)"


def test_mig_instances_hang_under_their_gpu_in_both() -> None:
    inv = read_capture(FIXTURES / "topo-written" / "nvidia-smi-L__a100-80gb-x2-mig.txt")
    assert isinstance(inv, Inventory)
    devices = tuple(replace(d, numa_node=1 if d.index == 1 else 0) for d in inv.devices())
    topo = topology_of_node(Node(name="n", executor="local", state=NodeState.UP, devices=devices))
    lines = dashboard_lines(node_view(topo, "n"))
    assert lines == topo_show_lines(topo, "n")
    assert lines[:4] == ["n", "  numa0", "    GPU0", "      GPU0.0"]
