"""What inventory-style captures yield: per-GPU facts (nvidia-smi -q / --query-gpu / the plain table,
rocm-smi, amd-smi list/static), host NUMA layout (numactl -H, lscpu), P2P matrices and NVLink status.

Every field a tool did not print is None (an unreadable metric is a value, not an exception).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from hsched.model import Device
from hsched.topo.topology import NumaNode, format_cpulist

MIG_INDEX = 100
"""A MIG instance's index is (its GPU's index + 1) * MIG_INDEX + its slot, as the controller numbers them
(hsched.controller.fleet.mig_devices), so GPU 0's slots are 100, 101... and never collide with a GPU's."""

_PROFILE_GB = re.compile(r"\d+g\.(\d+)gb(?:\+\w+)?")
"""A MIG profile's memory: "3g.40gb" (and "1g.10gb+me") is 40 GB."""


def profile_memory_mib(profile: str | None) -> int | None:
    """The memory (MiB) a MIG profile names, in the vendor's GB (where nothing measured it: `nvidia-smi -L`)."""
    m = _PROFILE_GB.fullmatch(profile or "")
    return int(m.group(1)) * 1000**3 // (1 << 20) if m else None


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    name: str | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    utilization_gpu: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    mig_current: bool | None = None
    mig_pending: bool | None = None
    pcie_gen_max: int | None = None
    pcie_width_max: int | None = None
    numa_node: int | None = None
    gfx_target: str | None = None
    fabric_clique: str | None = None
    mig_parent: int | None = None
    """A MIG instance: the index of the GPU it is a slice of (its own index is then mig_index(GPU, slot))."""
    mig_profile: str | None = None
    """A MIG instance's profile ("1g.10gb") where the capture names it (`nvidia-smi -L` does, the table does not)."""
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    sm_count: int | None = None
    """A MIG instance's multiprocessors (the MIG devices table's SM column: what tells a 3g from a 4g there)."""
    affine_cpus: tuple[int, ...] = ()
    """CPUs the capture says are local to this GPU; from `nvidia-smi topo -c N` only the CPUs asked about, so never
    the whole affinity."""

    @property
    def device_name(self) -> str:
        """GPU0, or GPU0.1 for slot 1 of GPU 0 in MIG mode: the names hsched's topology gives them."""
        if self.mig_parent is None:
            return f"GPU{self.index}"
        return f"GPU{self.mig_parent}.{self.index - (self.mig_parent + 1) * MIG_INDEX}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"device": self.device_name}
        for f in self.__slots__:
            v = getattr(self, f)
            out[f] = format_cpulist(v) if f == "affine_cpus" else v
        return out


def mig_index(gpu: int, slot: int) -> int:
    return (gpu + 1) * MIG_INDEX + slot


def device_name(d: Device) -> str:
    """GPU0, or GPU0.1 for a MIG instance: as hsched.topo.place.topology_of_node names a node's devices."""
    return f"GPU{d.index // MIG_INDEX - 1}.{d.index % MIG_INDEX}" if d.mig_parent else f"GPU{d.index}"


def listing_order(g: GpuInfo) -> tuple[int, bool, int]:
    """Each GPU followed by its MIG instances, as nvidia-smi -L lists them."""
    return (g.index if g.mig_parent is None else g.mig_parent, g.mig_parent is not None, g.index)


@dataclass(frozen=True, slots=True)
class Inventory:
    gpus: tuple[GpuInfo, ...] = ()
    partial: bool = False
    warnings: tuple[str, ...] = ()
    source_format: str = ""
    driver_version: str | None = None

    def devices(self) -> tuple[Device, ...]:
        """hsched's devices, shaped as the controller builds them from NVML (hsched.controller.fleet): a GPU in MIG
        mode is its instances (model "<GPU> MIG <profile>", mig_parent the GPU's UUID, the GPU's bus and NUMA
        node, their own memory), never a device itself, even with no instance made yet. A GPU or instance the
        capture gives no UUID for is left out: a device is its UUID (CUDA_VISIBLE_DEVICES takes it), never a
        made-up one."""
        by_index = {g.index: g for g in self.gpus if g.mig_parent is None}
        out: list[Device] = []
        for g in sorted(self.gpus, key=listing_order):
            if not g.uuid:
                continue
            if g.mig_parent is None:
                if g.mig_current:
                    continue  # its instances stand for it; with none, CUDA can run nothing on it at all
                out.append(Device(uuid=g.uuid, index=g.index, model=g.name or "unknown",
                                  memory_total_mib=g.memory_total_mib, memory_used_mib=g.memory_used_mib,
                                  utilization_gpu=g.utilization_gpu, numa_node=g.numa_node, pci_bus_id=g.pci_bus_id,
                                  temperature_c=g.temperature_c, power_w=g.power_w))
                continue
            parent = by_index.get(g.mig_parent)
            if parent is None or not parent.uuid:
                continue  # a slice is handed out under its GPU's UUID as mig_parent; unknown here
            profile = g.mig_profile or f"mig{g.index % MIG_INDEX}"
            out.append(Device(uuid=g.uuid, index=g.index, model=f"{parent.name or 'unknown'} MIG {profile}",
                              memory_total_mib=(g.memory_total_mib if g.memory_total_mib is not None
                                                else profile_memory_mib(profile)), numa_node=parent.numa_node,
                              pci_bus_id=parent.pci_bus_id, mig_parent=parent.uuid, mig_profile=profile))
        return tuple(out)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.source_format,
            "driver_version": self.driver_version,
            "gpus": [g.to_json() for g in self.gpus],
            # what hsched would hand out from this capture (a MIG-mode GPU as its instances; nothing without UUIDs)
            "devices": [{"name": device_name(d), **{f: getattr(d, f) for f in ("uuid", "index", "model",
                         "memory_total_mib", "pci_bus_id", "numa_node", "mig_parent", "mig_profile")}}
                        for d in self.devices()],
            "partial": self.partial,
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True, slots=True)
class HostNuma:
    nodes: tuple[NumaNode, ...] = ()
    sockets: int | None = None
    cores_per_socket: int | None = None
    threads_per_core: int | None = None
    cpus: int | None = None
    model_name: str | None = None
    partial: bool = False
    warnings: tuple[str, ...] = ()
    source_format: str = ""

    def cpu_nodes(self) -> tuple[NumaNode, ...]:
        """NUMA nodes that have CPUs (Grace exposes GPU memory as CPU-less nodes; never bind there)."""
        return tuple(n for n in self.nodes if n.cpus)

    def node_of_cpu(self, cpu: int) -> int | None:
        return next((n.id for n in self.nodes if cpu in n.cpus), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.source_format,
            "sockets": self.sockets,
            "cores_per_socket": self.cores_per_socket,
            "threads_per_core": self.threads_per_core,
            "cpus": self.cpus,
            "model_name": self.model_name,
            "nodes": [
                {
                    "id": n.id,
                    "cpus": format_cpulist(n.cpus),
                    "memory_mib": n.memory_mib,
                    "free_mib": n.free_mib,
                    "distances": list(n.distances),
                }
                for n in self.nodes
            ],
            "partial": self.partial,
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True, slots=True)
class P2PMatrix:
    """`nvidia-smi topo -p2p r|w|n|a|p`: OK, CNS, GNS, TNS, NS, DR, U per ordered pair."""

    devices: tuple[str, ...]
    status: tuple[tuple[str, str, str], ...]
    partial: bool = False
    warnings: tuple[str, ...] = ()
    source_format: str = "nvidia-smi topo -p2p"

    def get(self, a: str, b: str) -> str | None:
        return next((s for x, y, s in self.status if x == a and y == b), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.source_format,
            "devices": list(self.devices),
            "status": [{"a": a, "b": b, "status": s} for a, b, s in self.status],
            "partial": self.partial,
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True, slots=True)
class NvlinkStatus:
    """`nvidia-smi nvlink --status` / `-e`: per GPU, per link, speed in GB/s (None = inactive)."""

    gpus: tuple[tuple[int, str, tuple[tuple[int, float | None], ...]], ...]
    partial: bool = False
    warnings: tuple[str, ...] = ()
    source_format: str = "nvidia-smi nvlink"

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.source_format,
            "gpus": [
                {"index": i, "name": n, "links": [{"link": k, "gbps": v} for k, v in lk]} for i, n, lk in self.gpus
            ],
            "partial": self.partial,
            "warnings": list(self.warnings),
        }
