"""Topology: parsers for real tool output, the topology graph, and device placement (pure code).

The public surface (everything else lives in private-by-convention modules and may move):

    read_topology_file(path) -> Topology          parse_topology(text, source) -> Topology
    parse_capture(text, source) -> Topology | Inventory | HostNuma | P2PMatrix | NvlinkStatus
    place(topology, k, busy, constraints) -> PlacementResult          (names such as GPU0)
    place_on_node(node, k, free_uuids, resources) -> PlacementResult | None   (UUIDs; the controller's call)
    synthetic_topology(kind, count, model=...) -> Topology   topology_to_links(topology, uuids) -> tuple[Link]
    topology_from_nvml(raw) -> Topology          (raw from hsched/topo/nvml_probe.py's probe_nvml(pynvml))
    lookup_model(model) -> AcceleratorModel | None,  DEFAULT_CATALOG.with_overrides({...}) -> Catalog
    build_graph(topology) -> networkx.Graph      (lazy: importing hsched.topo does not import networkx)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hsched.topo.inventory import GpuInfo, HostNuma, Inventory
from hsched.topo.links import LinkClass, estimate_bandwidth_gbps, link_strength
from hsched.topo.models import DEFAULT_CATALOG, AcceleratorModel, Catalog, lookup_model
from hsched.topo.nvml import topology_from_nvml
from hsched.topo.parse import parse_capture, parse_topology, read_capture, read_topology_file
from hsched.topo.place import (
    Constraints,
    NoPlacement,
    PlacementResult,
    place,
    place_on_node,
    topology_of_node,
    why_not_on_node,
)
from hsched.topo.synthetic import synthetic_topology, topology_to_links
from hsched.topo.topology import TopoDevice, TopoLink, Topology, TopologyParseError, TopoNic

if TYPE_CHECKING:
    import networkx as nx

__all__ = [
    "DEFAULT_CATALOG",
    "AcceleratorModel",
    "Catalog",
    "Constraints",
    "GpuInfo",
    "HostNuma",
    "Inventory",
    "LinkClass",
    "NoPlacement",
    "PlacementResult",
    "TopoDevice",
    "TopoLink",
    "TopoNic",
    "Topology",
    "TopologyParseError",
    "build_graph",
    "estimate_bandwidth_gbps",
    "link_strength",
    "lookup_model",
    "parse_capture",
    "parse_topology",
    "place",
    "place_on_node",
    "read_capture",
    "read_topology_file",
    "synthetic_topology",
    "topology_from_nvml",
    "topology_of_node",
    "topology_to_links",
    "why_not_on_node",
]


def build_graph(topology: Topology, **kw: Any) -> nx.Graph:
    """See `hsched.topo.graph.build_graph` (imported on first use: networkx is heavy)."""
    from hsched.topo.graph import build_graph as _build

    return _build(topology, **kw)
