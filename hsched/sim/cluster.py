"""Simulated fleets: the `--cluster v100:16,p100:16,k80:16 --gpus-per-node 4` short spec, or a fleet file.

Both become `hsched.model.Node` values first, then servers by the conversion the live controller uses
(`hsched.sched.servers.server_of`), so a simulated server is what the controller would make of that node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations
from pathlib import Path

from hsched.config import load_fleet
from hsched.errors import UserError
from hsched.model import Device, Link, Node, NodeState
from hsched.sched.servers import server_of
from hsched.sched.throughput import ThroughputModel, prior_match
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


def parse_speeds(text: str | None) -> dict[str, float]:
    """--speeds tenstorrent-n300=0.8,gaudi2=1.5: GPU type -> training speed relative to a V100 (1.0)."""
    out: dict[str, float] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        name, sep, rel = part.partition("=")
        name = name.strip().lower()
        try:
            speed = float(rel) if sep and name else -1.0
        except ValueError:
            speed = -1.0
        if not (0 < speed < 1e6):  # also refuses nan and inf
            raise UserError(f"--speeds {text!r}: expected TYPE=REL,... with REL a positive speed relative to a "
                            f"V100 (1.0), such as tenstorrent-n300=0.8 (bad part {part.strip()!r})")
        out[name] = speed
    return out


def fit_speeds(model: ThroughputModel, servers: Sequence[ServerView],
               speeds: Mapping[str, float]) -> tuple[ThroughputModel, dict[str, float]]:
    """The throughput model for this fleet, and the speeds it was given beyond its table and prior.

    A GPU type of the fleet is known by, in order: the trace's throughput table; `speeds` (--speeds); the
    prior's built-in figure for a model name inside it; the accelerator catalog's relative training speed. A
    type given a speed here (the last two or --speeds, where the table lacks it) runs the table's jobs at their
    table rates scaled by that speed (`ThroughputModel.with_speeds`) and other jobs at that speed. A type with
    none of these is refused: a silent 1.0 would make an unknown accelerator a V100."""
    from hsched.learn.kinds import catalog_prior

    types = sorted({s.gpu_type.lower() for s in servers})
    stray = sorted(set(speeds) - set(types))
    if stray:
        raise UserError(f"--speeds: no GPU type {stray[0]!r} in the simulated fleet (its types: {', '.join(types)})")
    used = dict(speeds)
    catalog = catalog_prior()
    for t in types:
        if t in used or model.has_speed(t):
            continue
        found = prior_match(t, catalog)
        if found is None:
            raise UserError(f"GPU type {t!r} has no speed: the trace's throughput table, the built-in prior and the "
                            f"accelerator catalog do not know it; give one with --speeds {t}=REL (relative to a "
                            f"V100 = 1.0)")
        used[t] = found
    return (model.with_speeds(used) if used else model), used
