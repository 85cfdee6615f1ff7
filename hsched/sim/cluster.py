"""Simulated fleets: the `--cluster v100:16,p100:16,k80:16 --gpus-per-node 4` short spec."""

from __future__ import annotations

import re
from pathlib import Path

from hsched.errors import UserError
from hsched.sched.view import ServerView


def parse_cluster(spec: str, gpus_per_node: int = 4, link: str = "nvlink") -> tuple[ServerView, ...]:
    """'v100:16,p100:16,k80:16' with 4 GPUs per node -> 12 servers named v100-0 ... k80-3.

    A type whose count is not a multiple of `gpus_per_node` gets a last, smaller server. Devices are named
    'server/index'. An optional '@pcie' after a count (v100:16@pcie) marks servers without NVLink.
    """
    if gpus_per_node < 1:
        raise UserError(f"--gpus-per-node {gpus_per_node}: must be at least 1")
    servers: list[ServerView] = []
    seen: set[str] = set()
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, count = part.partition(":")
        count, _, link_kind = count.partition("@")
        name = name.strip().lower()
        try:
            n = int(count)
        except ValueError:
            n = -1
        if not sep or not name or n < 0 or (link_kind and link_kind not in ("nvlink", "pcie")):
            raise UserError(f"--cluster {spec!r}: expected TYPE:COUNT[@nvlink|@pcie],... "
                            f"such as v100:16,p100:16,k80:16 (bad part {part!r})")
        if name in seen:
            raise UserError(f"--cluster {spec!r}: GPU type {name!r} given twice; give each type once")
        seen.add(name)
        i = 0
        while n > 0:
            k = min(n, gpus_per_node)
            sname = f"{name}-{i}"
            servers.append(ServerView(sname, name, tuple(f"{sname}/{d}" for d in range(k)), link_kind or link))
            n -= k
            i += 1
    if not servers:
        raise UserError(f"--cluster {spec!r}: no GPUs; give at least one TYPE:COUNT")
    return tuple(servers)


def describe(servers: tuple[ServerView, ...]) -> str:
    counts: dict[str, int] = {}
    for s in servers:
        counts[s.gpu_type] = counts.get(s.gpu_type, 0) + len(s.devices)
    return ",".join(f"{t}:{n}" for t, n in counts.items())


def servers_from_fleet(path: Path, known_types: tuple[str, ...]) -> tuple[ServerView, ...]:
    """Servers from a fleet file's `[node.simulate]` tables (hsched.config's loader).

    The GPU type is the throughput table's type named inside the device model ("NVIDIA V100-SXM2-16GB" ->
    "v100"), else the model itself, which the throughput prior matches by substring. A node's link is
    "nvlink" unless its captured topology shows no NV# link between GPUs.
    """
    from hsched.config import load_fleet

    fleet = load_fleet(path)
    servers: list[ServerView] = []
    for node in fleet.nodes:
        sim = node.simulate
        if sim is None:
            raise UserError(f"{path}: node {node.name!r} has no [node.simulate] table; the simulator needs "
                            f"simulated devices (model, count) on every node")
        low = sim.model.lower()
        gpu_type = next((t for t in sorted(known_types, key=len, reverse=True) if t in low), low)
        link = "nvlink"
        if sim.topology and Path(sim.topology).is_file():
            text = Path(sim.topology).read_text(errors="replace")
            if not re.search(r"\bNV\d+\b", text):
                link = "pcie"
        elif sim.topology and "pcie" in sim.topology.lower():
            link = "pcie"
        servers.append(ServerView(node.name, gpu_type, tuple(f"{node.name}/{i}" for i in range(sim.count)), link))
    if not servers:
        raise UserError(f"{path}: no nodes; add [[node]] tables with [node.simulate]")
    return tuple(servers)
