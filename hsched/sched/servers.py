"""A node as the scheduling core sees it: one server of one GPU type. The one conversion, used by the live
controller (hsched.sched.live) and the simulator (hsched.sim.cluster) alike.

The GPU type is the caller's naming of the device model (the live controller names it by the accelerator
table, the simulator by its throughput table), the only thing the two sides legitimately see differently.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from hsched.model import Node, NodeState
from hsched.sched.view import ServerView
from hsched.topo.links import LinkClass, link_class


def server_link(node: Node) -> str:
    """"pcie" when two or more devices and no two of them joined by NVLink (or AMD's XGMI), else "nvlink".

    A node with one device has no slow link inside: it ranks with the NVLink servers of its type, so that
    a one-GPU job takes it rather than breaking up a bigger NVLink server.
    """
    if len(node.devices) < 2:
        return "nvlink"
    return "nvlink" if any(link_class(lk.kind) is LinkClass.FABRIC for lk in node.links) else "pcie"


def server_of(node: Node, type_of: Callable[[str], str], unavailable: Collection[str] = ()) -> ServerView | None:
    """The server `node` is to the core, or None when it is not up or has no devices.

    Its type is `type_of` of its first device's model (a node's GPUs are of one type), its devices those not
    in `unavailable` (held by jobs the round does not see, such as ones being launched), in the node's order.
    """
    if node.state is not NodeState.UP or not node.devices:
        return None
    devices = tuple(d.uuid for d in node.devices if d.uuid not in unavailable) if unavailable else tuple(
        d.uuid for d in node.devices)
    return ServerView(node.name, type_of(node.devices[0].model), devices, server_link(node))
