"""Parsers for the host's NUMA layout: `numactl --hardware` and `lscpu`."""

from __future__ import annotations

import re

from hsched.topo.inventory import HostNuma
from hsched.topo.parse_nvidia import strip_ansi
from hsched.topo.topology import NumaNode, TopologyParseError, parse_cpulist


def parse_numactl(text: str, source: str | None = None) -> HostNuma:
    """`numactl --hardware` -> HostNuma (CPUs, size, free and distances per node)."""
    lines = strip_ansi(text).split("\n")
    available: int | None = None
    cpus: dict[int, tuple[int, ...]] = {}
    size: dict[int, int] = {}
    free: dict[int, int] = {}
    dist: dict[int, tuple[int, ...]] = {}
    in_dist = False
    for off, line in enumerate(lines, start=1):
        s = line.strip()
        if not s:
            continue
        if m := re.match(r"^available:\s*(\d+) nodes?", s):
            available = int(m.group(1))
        elif m := re.match(r"^node (\d+) cpus:(.*)$", s):
            try:
                cpus[int(m.group(1))] = tuple(sorted(int(c) for c in m.group(2).split()))
            except ValueError:
                raise TopologyParseError("CPU list is not numbers", source=source, line=off) from None
        elif m := re.match(r"^node (\d+) size:\s*(\d+) MB$", s):
            size[int(m.group(1))] = int(m.group(2))
        elif m := re.match(r"^node (\d+) free:\s*(\d+) MB$", s):
            free[int(m.group(1))] = int(m.group(2))
        elif s.startswith("node distances"):
            in_dist = True
        elif in_dist and (m := re.match(r"^(\d+):\s+(.*)$", s)):
            dist[int(m.group(1))] = tuple(int(x) for x in m.group(2).split())
    if available is None and not cpus:
        raise TopologyParseError("no 'available: N nodes' line: not numactl --hardware output?", source=source)
    ids = sorted(set(cpus) | set(size))
    warnings: list[str] = []
    if available is not None and len(ids) != available:
        warnings.append(f"header says {available} nodes, {len(ids)} described")
    nodes = tuple(
        NumaNode(
            id=i,
            cpus=cpus.get(i, ()),
            memory_mib=size.get(i),
            free_mib=free.get(i),
            distances=dist.get(i, ()),
        )
        for i in ids
    )
    return HostNuma(
        nodes=nodes,
        cpus=sum(len(n.cpus) for n in nodes),
        partial=bool(warnings),
        warnings=tuple(warnings),
        source_format="numactl --hardware",
    )


def parse_lscpu(text: str, source: str | None = None) -> HostNuma:
    """`lscpu` (full or just the socket/NUMA lines) -> HostNuma."""
    kv: dict[str, str] = {}
    for line in strip_ansi(text).split("\n"):
        if ":" in line:
            k, v = line.split(":", 1)
            kv[k.strip()] = v.strip()
    if not any(k.startswith(("NUMA node", "Socket(s)", "CPU(s)")) for k in kv):
        raise TopologyParseError("no 'NUMA node(s)' / 'Socket(s)' / 'CPU(s)' lines: not lscpu output?", source=source)
    nodes: list[NumaNode] = []
    for k, v in kv.items():
        m = re.match(r"^NUMA node(\d+) CPU\(s\)$", k)
        if m:
            try:
                nodes.append(NumaNode(id=int(m.group(1)), cpus=parse_cpulist(v)))
            except ValueError:
                raise TopologyParseError(f"{k}: {v!r} is not a CPU list", source=source) from None
    nodes.sort(key=lambda n: n.id)

    def num(key: str) -> int | None:
        v = kv.get(key)
        return int(v) if v and v.isdigit() else None

    warnings: list[str] = []
    declared = num("NUMA node(s)")
    if declared is not None and declared != len(nodes):
        warnings.append(f"'NUMA node(s): {declared}' but {len(nodes)} node CPU lists")
    return HostNuma(
        nodes=tuple(nodes),
        sockets=num("Socket(s)"),
        cores_per_socket=num("Core(s) per socket"),
        threads_per_core=num("Thread(s) per core"),
        cpus=num("CPU(s)"),
        model_name=kv.get("Model name"),
        partial=bool(warnings),
        warnings=tuple(warnings),
        source_format="lscpu",
    )
