"""Simulated topologies for fake fleets and tests: no captured file needed.

Kinds (`synthetic_topology(kind, count)`):

* ``nvswitch``: every pair NV<links> through an NVSwitch fabric: NV18 (H100/H200, the default), NV12 (A100),
  NV6 (V100, DGX-2), chosen from `model`; GPUs split evenly over the NUMA nodes.
* ``nvlink-pairs``: GPUs bridged in pairs (NV4, as RTX A6000/3090 or H100 NVL bridges); every other pair is
  NODE inside a NUMA node and SYS across.
* ``pcie``: two GPUs per PCIe switch (PIX), NODE between switches of one NUMA node, SYS across.
* ``dgx1``: the 8-GPU V100 hybrid cube-mesh (NV1/NV2, SYS between the two quads' non-neighbours).
* ``none``: devices only, no links (a node whose topology is unknown).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace

from hsched.errors import UserError
from hsched.model import Link
from hsched.topo.links import estimate_bandwidth_gbps
from hsched.topo.topology import NumaNode, TopoDevice, TopoLink, Topology, TopoNic

KINDS = ("nvswitch", "nvlink-pairs", "pcie", "dgx1", "none")

# DGX-1 hybrid cube-mesh, as in the msccl-tools capture (upper triangle; missing pairs are SYS).
_DGX1 = {
    (0, 1): "NV1",
    (0, 2): "NV1",
    (0, 3): "NV2",
    (0, 4): "NV2",
    (1, 2): "NV2",
    (1, 3): "NV1",
    (1, 5): "NV2",
    (2, 3): "NV2",
    (2, 6): "NV1",
    (3, 7): "NV1",
    (4, 5): "NV1",
    (4, 6): "NV1",
    (4, 7): "NV2",
    (5, 6): "NV2",
    (5, 7): "NV1",
    (6, 7): "NV2",
}


def _nvswitch_links(model: str | None) -> int:
    low = (model or "").lower()
    if "a100" in low or "a800" in low:
        return 12
    if "v100" in low:
        return 6
    return 18


def synthetic_topology(
    kind: str,
    count: int,
    *,
    model: str | None = None,
    numa_nodes: int | None = None,
    cores_per_numa: int | None = None,
    nics: bool = False,
    memory_mib: int | None = None,
) -> Topology:
    """A plausible `Topology` of `count` devices wired as `kind` (see the module docstring)."""
    if kind not in KINDS:
        raise UserError(f"unknown simulated topology {kind!r}; known: {', '.join(KINDS)}")
    if count < 1:
        raise UserError(f"simulated topology needs at least one device (got {count})")
    if kind == "dgx1" and count != 8:
        raise UserError("the dgx1 topology has exactly 8 GPUs")
    nn = numa_nodes or (2 if count >= 4 else 1)
    nn = max(1, min(nn, count))
    per_numa = -(-count // nn)
    cores = cores_per_numa or max(8, 6 * per_numa)
    numa = tuple(NumaNode(id=i, cpus=tuple(range(i * cores, (i + 1) * cores))) for i in range(nn))
    devices = tuple(
        TopoDevice(
            name=f"GPU{i}",
            index=i,
            model=model,
            numa_node=i // per_numa,
            numa_nodes=(i // per_numa,),
            cpu_affinity=numa[i // per_numa].cpus,
            memory_mib=memory_mib,
        )
        for i in range(count)
    )

    def pcie_kind(i: int, j: int) -> str:
        if devices[i].numa_node != devices[j].numa_node:
            return "SYS"
        return "PIX" if i // 2 == j // 2 else "NODE"

    links: list[TopoLink] = []
    if kind != "none":
        for i, j in itertools.combinations(range(count), 2):
            if kind == "nvswitch":
                k = f"NV{_nvswitch_links(model)}"
            elif kind == "nvlink-pairs":
                k = "NV4" if i // 2 == j // 2 else ("NODE" if devices[i].numa_node == devices[j].numa_node else "SYS")
            elif kind == "dgx1":
                k = _DGX1.get((i, j), "SYS")
            else:
                k = pcie_kind(i, j)
            links.append(TopoLink(f"GPU{i}", f"GPU{j}", k))
    nic_list: list[TopoNic] = []
    if nics:
        # one NIC per PCIe switch (two GPUs), as on HGX boards
        for s in range(-(-count // 2)):
            name = f"NIC{s}"
            node = devices[2 * s].numa_node
            nic_list.append(TopoNic(name=name, device=f"mlx5_{s}", numa_node=node))
            for i in range(count):
                k = "PIX" if i // 2 == s else ("NODE" if devices[i].numa_node == node else "SYS")
                links.append(TopoLink(f"GPU{i}", name, k))
    links = [replace(lk, bandwidth_gbps=estimate_bandwidth_gbps(lk.kind, model=model)) for lk in links]
    return Topology(
        devices=devices, nics=tuple(nic_list), links=tuple(links), numa=numa, source_format=f"synthetic:{kind}"
    )


def topology_to_links(topology: Topology, uuids: Sequence[str]) -> tuple[Link, ...]:
    """The device-device links of `topology` as `hsched.model.Link`s between `uuids` (given in index order)."""
    devs = sorted(topology.devices, key=lambda d: d.index)
    if len(uuids) != len(devs):
        raise UserError(f"topology has {len(devs)} devices but {len(uuids)} UUIDs were given")
    uuid_of = {d.name: u for d, u in zip(devs, uuids, strict=True)}
    model = {d.name: d.model for d in devs}
    return tuple(
        Link(
            a=uuid_of[lk.a],
            b=uuid_of[lk.b],
            kind=lk.kind,
            bandwidth_gbps=lk.bandwidth_gbps or estimate_bandwidth_gbps(lk.kind, model=model[lk.a], weight=lk.weight),
        )
        for lk in topology.device_links()
    )


def numa_of_devices(topology: Topology) -> dict[int, int | None]:
    """Device index -> NUMA node, for filling `hsched.model.Device.numa_node` of simulated devices."""
    return {d.index: d.numa_node for d in topology.devices}
