"""The topology model every parser, NVML discovery and the synthetic generator produce.

Frozen data only. A `Topology` is one machine: its accelerators, its NICs, the pairwise links between them,
and (when known) its NUMA nodes. `partial=True` means the source was cut or damaged and `warnings` say what
is missing; consumers must not treat missing links as weak links.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from hsched.errors import UserError
from hsched.topo.links import (
    LinkClass,
    estimate_bandwidth_gbps,
    fabric_links,
    link_class,
    link_strength,
    normalize_kind,
)


class TopologyParseError(UserError):
    """A capture could not be read. The message names the file (when known), the line and the problem."""

    def __init__(self, problem: str, *, source: str | None = None, line: int | None = None) -> None:
        where = source or "<input>"
        if line is not None:
            where = f"{where}, line {line}"
        super().__init__(f"{where}: {problem}")
        self.source = source
        self.line = line
        self.problem = problem


@dataclass(frozen=True, slots=True)
class NumaNode:
    id: int
    cpus: tuple[int, ...] = ()
    memory_mib: int | None = None
    free_mib: int | None = None
    distances: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TopoDevice:
    """One accelerator as the topology sees it. `name` is the column head (GPU0) or GPU<i> for amd-smi."""

    name: str
    index: int
    uuid: str | None = None
    model: str | None = None
    pci_bus_id: str | None = None
    numa_node: int | None = None
    """The NUMA node of the PCIe attachment (first of `numa_nodes` on Grace, where the column is a list)."""
    numa_nodes: tuple[int, ...] = ()
    cpu_affinity: tuple[int, ...] = ()
    gpu_numa_id: int | None = None
    """NUMA node that *is* the GPU's memory (coherent Grace systems only); not for CPU binding."""
    memory_mib: int | None = None
    compute_capability: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "index": self.index,
            "uuid": self.uuid,
            "model": self.model,
            "pci_bus_id": self.pci_bus_id,
            "numa_node": self.numa_node,
            "numa_nodes": list(self.numa_nodes),
            "cpu_affinity": list(self.cpu_affinity),
            "cpulist": format_cpulist(self.cpu_affinity),
            "gpu_numa_id": self.gpu_numa_id,
        }


@dataclass(frozen=True, slots=True)
class TopoNic:
    name: str
    """Column head: NIC0 (new drivers) or mlx5_0 (old drivers)."""
    device: str | None = None
    """The RDMA device name from the `NIC Legend:` block (mlx5_10), or the head itself on old drivers."""
    numa_node: int | None = None

    @property
    def label(self) -> str:
        return self.device or self.name

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "device": self.device, "numa_node": self.numa_node}


@dataclass(frozen=True, slots=True)
class TopoLink:
    """One unordered pair. `kind` is spelled as the tools spell it (NV12, PIX, SYS, XGMI, PCIE)."""

    a: str
    b: str
    kind: str
    weight: int | None = None
    """AMD link weight (15 per XGMI hop; 20-72 for PCIe paths)."""
    hops: int | None = None
    links: int | None = None
    """Fabric links in this pair when the tool says (XGMI); NV# carries it in the kind."""
    bandwidth_gbps: float | None = None

    @property
    def link_class(self) -> LinkClass:
        return link_class(self.kind)

    @property
    def strength(self) -> tuple[int, int]:
        return link_strength(self.kind, self.weight, self.links)

    @property
    def fabric_links(self) -> int:
        return fabric_links(self.kind, self.links)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"a": self.a, "b": self.b, "kind": self.kind}
        if self.weight is not None:
            out["weight"] = self.weight
        if self.hops is not None:
            out["hops"] = self.hops
        if self.bandwidth_gbps is not None:
            out["bandwidth_gbps"] = self.bandwidth_gbps
        return out


@dataclass(frozen=True, slots=True)
class Topology:
    devices: tuple[TopoDevice, ...] = ()
    nics: tuple[TopoNic, ...] = ()
    links: tuple[TopoLink, ...] = ()
    """Device-device and device-NIC pairs (NIC-NIC pairs are dropped: nothing places on them)."""
    numa: tuple[NumaNode, ...] = ()
    partial: bool = False
    warnings: tuple[str, ...] = ()
    source_format: str = ""

    def device(self, name: str) -> TopoDevice | None:
        return next((d for d in self.devices if d.name == name), None)

    def link_map(self) -> dict[frozenset[str], TopoLink]:
        return {frozenset((lk.a, lk.b)): lk for lk in self.links}

    def link(self, a: str, b: str) -> TopoLink | None:
        return next((lk for lk in self.links if {lk.a, lk.b} == {a, b}), None)

    def device_links(self) -> tuple[TopoLink, ...]:
        names = {d.name for d in self.devices}
        return tuple(lk for lk in self.links if lk.a in names and lk.b in names)

    def with_bandwidth(self) -> Topology:
        """Fill `bandwidth_gbps` on every link that lacks one, from the documented table."""
        models = {d.name: d.model for d in self.devices}
        links = tuple(
            lk
            if lk.bandwidth_gbps is not None
            else replace(lk, bandwidth_gbps=estimate_bandwidth_gbps(lk.kind, model=models.get(lk.a), weight=lk.weight))
            for lk in self.links
        )
        return replace(self, links=links)

    def to_json(self) -> dict[str, Any]:
        return {
            "devices": [d.to_json() for d in self.devices],
            "nics": [n.to_json() for n in self.nics],
            "links": [lk.to_json() for lk in self.links],
            "numa": [{"id": n.id, "cpus": format_cpulist(n.cpus), "memory_mib": n.memory_mib} for n in self.numa],
            "partial": self.partial,
            "warnings": list(self.warnings),
            "format": self.source_format,
        }


# ---- small shared helpers  ------

_CPULIST_RE = re.compile(r"^\d+(-\d+)?(:\d+)?$")


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Linux cpulist syntax (`0-55,112-167`, `6,14,22,30`, `0-15:2`) -> sorted unique ints.

    Raises ValueError on anything else, so callers can report the line.
    """
    text = text.strip()
    if not text or text.upper() == "N/A":
        return ()
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not _CPULIST_RE.match(part):
            raise ValueError(f"not a CPU list: {text!r}")
        stride = 1
        if ":" in part:
            part, s = part.split(":")
            stride = int(s)
        if "-" in part:
            lo, hi = (int(x) for x in part.split("-"))
            if hi < lo:
                raise ValueError(f"not a CPU list: {text!r}")
            out.update(range(lo, hi + 1, stride))
        else:
            out.add(int(part))
    return tuple(sorted(out))


def format_cpulist(cpus: Iterable[int]) -> str:
    """Ints -> the compact cpulist form (`0-3,8`)."""
    ordered = sorted(set(cpus))
    if not ordered:
        return ""
    parts: list[str] = []
    start = prev = ordered[0]
    for c in ordered[1:]:
        if c == prev + 1:
            prev = c
            continue
        parts.append(f"{start}-{prev}" if prev != start else str(start))
        start = prev = c
    parts.append(f"{start}-{prev}" if prev != start else str(start))
    return ",".join(parts)


def normalize_bus_id(bus_id: str) -> str:
    """`00000000:1B:00.0` or `0000:1b:00.0` -> `0000:1b:00.0` (lower case, 4-digit domain) to join sources."""
    s = bus_id.strip().lower()
    m = re.match(r"^(?:([0-9a-f]+):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$", s)
    if not m:
        return s
    domain = int(m.group(1) or "0", 16)
    return f"{domain:04x}:{int(m.group(2), 16):02x}:{int(m.group(3), 16):02x}.{m.group(4)}"


def make_links(pairs: Mapping[tuple[str, str], str]) -> tuple[TopoLink, ...]:
    return tuple(TopoLink(a, b, normalize_kind(k)) for (a, b), k in pairs.items())
