"""Simulated fleets: the `--cluster v100:16,p100:16,k80:16 --gpus-per-node 4` short spec, or a fleet file.

Both become `hsched.model.Node` values first, then servers by the conversion the live controller uses
(`hsched.sched.servers.server_of`), so a simulated server is what the controller would make of that node.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from pathlib import Path

from hsched.config import load_fleet
from hsched.errors import UserError
from hsched.model import Device, Link, Node, NodeState
from hsched.sched.servers import server_of
from hsched.sched.view import ServerView
from hsched.sim.bounds import MAX_CLUSTER_GPUS, MAX_GPUS_PER_NODE
from hsched.simulated import simulated_devices


def cluster_nodes(spec: str, gpus_per_node: int = 4, link: str = "nvlink") -> tuple[Node, ...]:
    """'v100:16,p100:16,k80:16' with 4 GPUs per node -> 12 nodes named v100-0 ... k80-3, all up.

    A type whose count is not a multiple of `gpus_per_node` gets a last, smaller node. Devices are named
    'node/index', their model is the type. An optional '@pcie' after a count (v100:16@pcie) makes nodes
    whose devices are joined by PCIe only; otherwise every pair is NVLinked.
    """
    if not 1 <= gpus_per_node <= MAX_GPUS_PER_NODE:
        raise UserError(f"--gpus-per-node {gpus_per_node}: expected 1 to {MAX_GPUS_PER_NODE} GPUs per server")
    nodes: list[Node] = []
    seen: set[str] = set()
    total = 0
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, count = part.partition(":")
        count, _, link_kind = count.partition("@")
        name = name.strip().lower()
        count = count.strip()
        n = int(count) if count.isascii() and count.isdigit() and len(count) <= 20 else -1
        if not sep or not name or n < 0 or (link_kind and link_kind not in ("nvlink", "pcie")):
            raise UserError(f"--cluster {spec!r}: expected TYPE:COUNT[@nvlink|@pcie],... "
                            f"such as v100:16,p100:16,k80:16 (bad part {part!r})")
        if name in seen:
            raise UserError(f"--cluster {spec!r}: GPU type {name!r} given twice; give each type once")
        seen.add(name)
        # counted before a server is built: v100:1000000000 is refused at once, not after a billion devices
        total += n
        if total > MAX_CLUSTER_GPUS:
            raise UserError(f"--cluster {spec!r}: {total:,} GPUs; the simulator takes up to {MAX_CLUSTER_GPUS:,} "
                            f"in all")
        kind = "NV1" if (link_kind or link) == "nvlink" else "PIX"
        i = 0
        while n > 0:
            k = min(n, gpus_per_node)
            nname = f"{name}-{i}"
            devices = tuple(Device(f"{nname}/{d}", d, name, simulated=True) for d in range(k))
            links = tuple(Link(a.uuid, b.uuid, kind) for a, b in combinations(devices, 2))
            nodes.append(Node(nname, "simulated", NodeState.UP, devices=devices, links=links))
            n -= k
            i += 1
    if not nodes:
        raise UserError(f"--cluster {spec!r}: no GPUs; give at least one TYPE:COUNT")
    return tuple(nodes)


def _servers(nodes: Sequence[Node], known_types: Sequence[str] = ()) -> tuple[ServerView, ...]:
    """The one conversion, with the simulator's naming of GPU types: the throughput table's type named
    inside the device model ("NVIDIA V100-SXM2-16GB" -> "v100"), else the model, which the throughput
    prior matches by substring."""
    longest_first = sorted(known_types, key=len, reverse=True)

    def type_of(model: str) -> str:
        low = model.lower()
        return next((t for t in longest_first if t in low), low)

    return tuple(s for n in nodes if (s := server_of(n, type_of)) is not None)


def parse_cluster(spec: str, gpus_per_node: int = 4, link: str = "nvlink") -> tuple[ServerView, ...]:
    """The servers of `cluster_nodes(spec, gpus_per_node, link)`: v100-0 ... k80-3, of types v100 ... k80."""
    return _servers(cluster_nodes(spec, gpus_per_node, link))


def describe(servers: tuple[ServerView, ...]) -> str:
    counts: dict[str, int] = {}
    for s in servers:
        counts[s.gpu_type] = counts.get(s.gpu_type, 0) + len(s.devices)
    return ",".join(f"{t}:{n}" for t, n in counts.items())


def servers_from_fleet(path: Path, known_types: tuple[str, ...]) -> tuple[ServerView, ...]:
    """Servers from a fleet file's `[node.simulate]` tables, built as the controller builds those nodes
    (devices and links from the captured or synthetic topology; a node without one has no known NVLink)."""
    fleet = load_fleet(path)
    nodes: list[Node] = []
    total = 0
    for nc in fleet.nodes:
        sim = nc.simulate
        if sim is None:
            raise UserError(f"{path}: node {nc.name!r} has no [node.simulate] table; the simulator needs "
                            f"simulated devices (model, count) on every node")
        # counted before its devices are made, as for --cluster
        total += sim.count
        if sim.count > MAX_GPUS_PER_NODE or total > MAX_CLUSTER_GPUS:
            raise UserError(f"{path}: node {nc.name!r}: simulate.count = {sim.count:,}; the simulator takes up to "
                            f"{MAX_GPUS_PER_NODE} GPUs a node and {MAX_CLUSTER_GPUS:,} in all")
        devices, links = simulated_devices(nc.name, sim)
        nodes.append(Node(nc.name, nc.executor, NodeState.UP, devices=devices, links=links))
    if not nodes:
        raise UserError(f"{path}: no nodes; add [[node]] tables with [node.simulate]")
    return _servers(nodes, known_types)
