"""Simulated devices: a lab of made-up GPUs on this machine, for the demo, tests and the dashboard.

Below both the controller and the executors: the controller hands out these UUIDs, the executors report
them in their monitoring samples, and neither may import the other.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Collection, Sequence
from dataclasses import replace
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




def simulated_telemetry(devices: Sequence[Device], busy: Collection[str], now: float) -> tuple[Device, ...]:
    """Plausible readings for simulated devices, so the lab demo and the dashboard look like a lab: busy
    (held by a job: `busy` UUIDs) or idle. Real devices among them are returned untouched."""
    out = []
    for d in devices:
        if not d.simulated:
            out.append(d)
            continue
        phase = now / 7.0 + d.index
        if d.uuid in busy:
            util = round(78 + 18 * math.sin(phase) * math.sin(phase / 3.1), 1)
            mem = int((d.memory_total_mib or 0) * (0.62 + 0.1 * math.sin(phase / 5.0)))
            temp, power = round(52 + util / 4, 1), round(90 + util * 4.2, 1)
        else:
            util, mem, temp, power = 0.0, 0, 33.0, 62.0
        out.append(replace(d, utilization_gpu=util, memory_used_mib=mem, temperature_c=temp, power_w=power))
    return tuple(out)
