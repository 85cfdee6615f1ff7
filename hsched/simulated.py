"""Simulated devices: a lab of made-up GPUs on this machine, for the demo, tests and the dashboard.

Below both the controller and the executors: the controller hands out these UUIDs, the executors report
them in their monitoring samples, and neither may import the other.
"""

from __future__ import annotations

import uuid
from typing import Any

from hsched.config import SimulatedDevices
from hsched.errors import UserError
from hsched.model import Device, Link

_SIM_NS = uuid.UUID("6f1c1f40-3a4b-4e39-9a51-6c2f0a3a9d11")


def simulated_uuid(node: str, index: int) -> str:
    """Stable per (node, index), shaped like NVIDIA's: GPU-xxxxxxxx-xxxx-..."""
    return f"GPU-{uuid.uuid5(_SIM_NS, f'{node}/{index}')}"


def simulated_devices(node: str, sim: SimulatedDevices) -> tuple[tuple[Device, ...], tuple[Link, ...]]:
    """Devices and links of a simulated node; topology from a captured matrix or a synthetic kind."""
    from hsched.topo.synthetic import topology_to_links

    links: tuple[Link, ...] = ()
    numa_of: dict[int, int | None] = {}
    affinity: dict[int, tuple[int, ...]] = {}
    uuids = [simulated_uuid(node, i) for i in range(sim.count)]
    if sim.topology:
        topo = _load_topology(sim)
        ordered = sorted(topo.devices, key=lambda d: d.index)
        if len(ordered) != sim.count:
            raise UserError(f"node {node}: simulate.topology {sim.topology!r} has {len(ordered)} GPUs but "
                            f"simulate.count is {sim.count}; make them agree")
        links = topology_to_links(topo, uuids)
        numa_of = {i: d.numa_node for i, d in enumerate(ordered)}
        affinity = {i: tuple(d.cpu_affinity) for i, d in enumerate(ordered)}
    else:
        per = max(1, -(-sim.count // max(1, sim.numa_nodes)))
        numa_of = {i: min(i // per, sim.numa_nodes - 1) for i in range(sim.count)}
    devices = tuple(
        Device(uuid=uuids[i], index=i, model=sim.model, memory_total_mib=sim.memory_mib, memory_used_mib=0,
               utilization_gpu=0.0, numa_node=numa_of.get(i), simulated=True, cpu_affinity=affinity.get(i, ()))
        for i in range(sim.count)
    )
    return devices, links


def _load_topology(sim: SimulatedDevices) -> Any:
    from pathlib import Path

    from hsched.topo.parse import parse_topology
    from hsched.topo.synthetic import synthetic_topology

    assert sim.topology is not None
    if "/" in sim.topology or sim.topology.endswith(".txt"):
        text = Path(sim.topology).read_text(errors="replace")
        return parse_topology(text, source=sim.topology)
    return synthetic_topology(sim.topology, sim.count, model=sim.model, numa_nodes=sim.numa_nodes,
                              memory_mib=sim.memory_mib)


