"""What inventory-style captures yield: per-GPU facts (nvidia-smi -q / --query-gpu / the plain table,
rocm-smi, amd-smi list/static), host NUMA layout (numactl -H, lscpu), P2P matrices and NVLink status.

Every field a tool did not print is None (an unreadable metric is a value, not an exception).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hsched.topo.topology import NumaNode, format_cpulist


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

    def to_json(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__slots__}


@dataclass(frozen=True, slots=True)
class Inventory:
    gpus: tuple[GpuInfo, ...] = ()
    partial: bool = False
    warnings: tuple[str, ...] = ()
    source_format: str = ""
    driver_version: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.source_format,
            "driver_version": self.driver_version,
            "gpus": [g.to_json() for g in self.gpus],
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
