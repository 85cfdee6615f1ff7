"""Simulated devices: a lab of made-up GPUs on this machine, for the demo, tests and the dashboard.

Below both the controller and the executors: the controller hands out these UUIDs, the executors report
them in their monitoring samples, and neither may import the other.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hsched.config import SimulatedDevices
from hsched.errors import UserError
from hsched.learn.profiles import Profile
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
    if not sim.topology or not all(numa_of.get(i) is not None for i in range(sim.count)):
        # no capture, or one without NUMA nodes (amd-smi topology): spread the GPUs over the declared NUMA nodes
        per = max(1, -(-sim.count // max(1, sim.numa_nodes)))
        numa_of = {i: min(i // per, sim.numa_nodes - 1) for i in range(sim.count)}
    if sim.cpus and not all(affinity.get(i) for i in range(sim.count)):
        # the node's declared cores, split evenly between its NUMA nodes (a capture's, where it names more: an
        # NPS4 box); a GPU whose capture says nothing of its CPUs is local to its NUMA node's share
        nodes = max(sim.numa_nodes, 1 + max((n for n in numa_of.values() if n is not None), default=0))
        share = max(1, sim.cpus // nodes)
        affinity = {i: affinity.get(i) or tuple(range(n * share, (n + 1) * share))
                    for i, n in numa_of.items() if n is not None}
    memory = sim.memory_mib
    if memory is None:
        # the model's own size (an A100-SXM4-80GB has 80 GB) rather than an unknown
        from hsched.topo.models import lookup_model

        known = lookup_model(sim.model)
        memory = known.memory_mib if known is not None else None
    devices = tuple(
        Device(uuid=uuids[i], index=i, model=sim.model, memory_total_mib=memory, memory_used_mib=0,
               utilization_gpu=0.0, numa_node=numa_of.get(i), simulated=True, cpu_affinity=affinity.get(i, ()))
        for i in range(sim.count)
    )
    return devices, links


def _load_topology(sim: SimulatedDevices) -> Any:
    from hsched.topo.parse import read_topology_file
    from hsched.topo.synthetic import synthetic_topology

    assert sim.topology is not None
    if "/" in sim.topology or sim.topology.endswith(".txt"):
        # as `hsched topo parse` reads it: a UTF-16 capture from Windows, a '#' header, one-line errors
        return read_topology_file(sim.topology)
    # the node's declared cores, not a made-up count: a 112-core box's GPUs are local to all 112 of them
    per_numa = sim.cpus // max(1, sim.numa_nodes) if sim.cpus else None
    return synthetic_topology(sim.topology, sim.count, model=sim.model, numa_nodes=sim.numa_nodes,
                              memory_mib=sim.memory_mib, cores_per_numa=per_numa or None)




@dataclass(frozen=True, slots=True)
class _Nature:
    """How a simulated GPU reads while a job of a declared nature (hsched.learn.profiles.SIM_NATURE_ENV) holds it."""

    util: float
    """Mean utilization_gpu %, swinging by `swing` either way."""
    swing: float
    mem_util: float
    """utilization_memory % (memory bandwidth)."""
    nvlink_mib_s: float
    """Each way, on a GPU with NVLink peers (elsewhere the same traffic crosses PCIe)."""
    pcie_mib_s: float
    """Each way."""
    cpu_percent: float
    """Of the job's process on each of its GPUs."""
    memory_share: float
    """Of the GPU's memory in use."""


# each far on the right side of hsched.learn.profiles' thresholds, so a declared nature is what the profile finds
_NATURES: dict[Profile, _Nature] = {
    Profile.COMPUTE: _Nature(94.0, 4.0, 32.0, 300.0, 150.0, 60.0, 0.70),
    Profile.MEMORY: _Nature(86.0, 6.0, 80.0, 300.0, 150.0, 60.0, 0.85),
    Profile.COMMUNICATION: _Nature(78.0, 8.0, 25.0, 30 * 1024.0, 300.0, 45.0, 0.60),
    Profile.INPUT: _Nature(18.0, 8.0, 6.0, 50.0, 900.0, 320.0, 0.40),
    Profile.IDLE: _Nature(0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.30),  # a model loaded, nothing computed
}


def _wave(phase: float) -> float:
    return math.sin(phase) * math.sin(phase / 3.1)


def simulated_telemetry(devices: Sequence[Device], busy: Collection[str], now: float,
                        natures: Mapping[str, Profile] | None = None) -> tuple[Device, ...]:
    """Plausible readings for simulated devices, so the lab demo and the dashboard look like a lab: busy
    (held by a job: `busy` UUIDs) or idle; a busy GPU whose job declared a nature (`natures`: UUID -> the
    job's hsched.learn.profiles.sim_nature) reads as that nature does. Power follows the model's board power (a 72 W
    L4 never draws 490 W), temperature the power; real devices among them are returned untouched."""
    from hsched.topo.models import lookup_model

    out = []
    tdp_of: dict[str, float] = {}
    for d in devices:
        if not d.simulated:
            out.append(d)
            continue
        if d.model not in tdp_of:
            known = lookup_model(d.model)
            tdp_of[d.model] = (known.tdp_w if known is not None and known.tdp_w else None) or 300.0
        tdp = tdp_of[d.model]
        phase = now / 7.0 + d.index
        idle_w = round(0.12 * tdp, 1)
        nature = _NATURES.get(natures[d.uuid]) if natures and d.uuid in natures else None
        if d.uuid in busy and nature is not None:
            util = round(min(100.0, max(0.0, nature.util + nature.swing * _wave(phase))), 1)
            mem = int((d.memory_total_mib or 0) * (nature.memory_share + 0.02 * math.sin(phase / 5.0)))
            power = round(idle_w + (0.92 * tdp - idle_w) * util / 100.0, 1)
        elif d.uuid in busy:
            util = round(78 + 18 * _wave(phase), 1)
            mem = int((d.memory_total_mib or 0) * (0.62 + 0.1 * math.sin(phase / 5.0)))
            power = round(idle_w + (0.92 * tdp - idle_w) * util / 100.0, 1)
        else:
            util, mem, power = 0.0, 0, idle_w
        temp = round(31.0 + 45.0 * power / tdp, 1)
        out.append(replace(d, utilization_gpu=util, memory_used_mib=mem, temperature_c=temp, power_w=power))
    return tuple(out)


def simulated_extras(d: Device, nature: Profile | None, nvlinked: bool, now: float) -> dict[str, float]:
    """The readings NVML gives beyond simulated_telemetry's for a simulated GPU a job of `nature` holds
    (memory bandwidth %, NVLink and PCIe MiB/s each way; `nvlinked`: the GPU has NVLink peers). No nature
    declared: none (a GPU tool that does not report them), so a profile says they are unknown."""
    n = _NATURES.get(nature) if nature is not None else None
    if n is None:
        return {}
    wobble = 1.0 + 0.05 * math.sin(now / 7.0 + d.index)
    # a communication-bound job's traffic goes over NVLink where the GPU has peers, else over PCIe
    nvlink = n.nvlink_mib_s if nvlinked else 0.0
    pcie = n.pcie_mib_s if nvlinked or nature is not Profile.COMMUNICATION else n.nvlink_mib_s / 4
    out = {"utilization_memory": round(n.mem_util * wobble, 1),
           "pcie_tx_mib_s": round(pcie * wobble, 1), "pcie_rx_mib_s": round(pcie * wobble, 1)}
    if nvlinked:
        out |= {"nvlink_tx_mib_s": round(nvlink * wobble, 1), "nvlink_rx_mib_s": round(nvlink * wobble, 1)}
    return out


def simulated_processes(nature: Profile | None, uuids: Sequence[str], now: float) -> list[dict[str, Any]] | None:
    """The job's processes as a GPU tool would list them on its simulated GPUs (one per GPU, with CPU % and
    resident memory as hsched.node.usage gives them); None without a declared nature (processes not listed)."""
    n = _NATURES.get(nature) if nature is not None else None
    if n is None:
        return None
    return [{"pid": -(i + 1), "uuid": u, "cpu_percent": round(n.cpu_percent * (1.0 + 0.05 * math.sin(now + i)), 1),
             "rss_mib": 4096} for i, u in enumerate(uuids)]
