"""The topology view shows a MIG-mode GPU's instances under it (issue 15, item 5): GPU0 > GPU0.0, GPU0.1 ..., where
the GPU sits (its NUMA node), though the GPU itself is no device."""

from __future__ import annotations

from dataclasses import replace

from hsched.model import Node, NodeState
from hsched.topo.graph import build_graph, tree_lines
from hsched.topo.inventory import Inventory
from hsched.topo.parse import read_capture
from hsched.topo.place import topology_of_node
from tests.conftest import FIXTURES


def test_instances_hang_under_their_gpu_in_its_numa_node() -> None:
    inv = read_capture(FIXTURES / "topo-written" / "nvidia-smi-L__a100-80gb-x2-mig.txt")
    assert isinstance(inv, Inventory)
    devices = tuple(replace(d, numa_node=1 if d.index == 1 else 0) for d in inv.devices())
    topo = topology_of_node(Node(name="n", executor="local", state=NodeState.UP, devices=devices))
    assert tree_lines(topo) == [
        "machine",
        "  numa0",
        "    GPU0 (NVIDIA A100-SXM4-80GB)",
        "      GPU0.0 (NVIDIA A100-SXM4-80GB MIG 3g.40gb)",
        "      GPU0.1 (NVIDIA A100-SXM4-80GB MIG 2g.20gb)",
        "      GPU0.2 (NVIDIA A100-SXM4-80GB MIG 1g.10gb)",
        "  numa1",
        "    GPU1 (NVIDIA A100-SXM4-80GB)",
    ]
    g = build_graph(topo)
    # the GPU is a node of the tree, not a device: placement's devices stay the instances and GPU1
    assert g.nodes["GPU0"]["type"] == "mig-gpu" and g.edges["GPU0", "GPU0.1"]["kind"] == "MIG"
    assert sorted(n for n, t in g.nodes(data="type") if t == "gpu") == ["GPU0.0", "GPU0.1", "GPU0.2", "GPU1"]
