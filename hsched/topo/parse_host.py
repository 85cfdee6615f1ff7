"""Parsers for the host's NUMA layout: `numactl --hardware`, `lscpu` (its key: value form, whole or in part, and
the per-CPU tables of `lscpu -e` and `lscpu -p`)."""

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
            if not all(x.isdigit() for x in m.group(2).split()):
                raise TopologyParseError(f"node {m.group(1)}'s distances are not numbers", source=source, line=off)
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
        if ":" in line and not line.lstrip().startswith("#"):
            # util-linux >= 2.38 indents its keys under section heads ("NUMA:", "Caches (sum of all):")
            k, v = line.split(":", 1)
            kv[k.strip()] = v.strip()
    if not any(k.startswith(LSCPU_KEYS) for k in kv):
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
    elif not nodes:
        warnings.append("no 'NUMA nodeN CPU(s)' lines: which CPUs belong to which NUMA node is unknown "
                        "(the whole `lscpu` output, or `numactl -H`, has them)")
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


LSCPU_KEYS = ("NUMA node", "Socket(s)", "CPU(s)", "On-line CPU(s) list", "Thread(s) per core", "Core(s) per socket",
              "Model name", "Architecture", "CPU op-mode(s)", "Vendor ID")
"""Keys only lscpu prints (any one marks a capture, even a few lines of one, as lscpu's)."""


def parse_lscpu_table(text: str, source: str | None = None) -> HostNuma:
    """`lscpu -e` (a header CPU NODE SOCKET CORE ..., one row per CPU) or `lscpu -p` (`# CPU,Core,Socket,Node,...`
    then comma-separated rows) -> HostNuma: each NUMA node's CPUs, the sockets. Without a NODE column (a machine
    with one node) there are no nodes to give."""
    lines = strip_ansi(text).replace("\r", "").split("\n")
    parsable = any(ln.startswith("# CPU,") for ln in lines)
    head_at = next((i for i, ln in enumerate(lines) if (ln.startswith("# CPU,") if parsable
                                                         else re.match(r"^\s*CPU\s+\S", ln))), None)
    if head_at is None:
        raise TopologyParseError("no header line (CPU NODE SOCKET ... or # CPU,Core,Socket,Node): "
                                 "not `lscpu -e` / `lscpu -p` output?", source=source)
    head = lines[head_at].lstrip("# ").strip()
    names = [h.strip().upper() for h in (head.split(",") if parsable else head.split())]
    col = {h: i for i, h in enumerate(names) if h}
    by_node: dict[int, list[int]] = {}
    sockets: set[int] = set()
    cpus = 0
    for off, line in enumerate(lines[head_at + 1 :], start=head_at + 2):
        if not line.strip() or line.startswith("#"):
            continue
        cells = [c.strip() for c in line.split(",")] if parsable else line.split()
        if len(cells) < len(col) or not cells[col["CPU"]].isdigit():
            raise TopologyParseError(f"row does not fit the header ({len(names)} columns)", source=source, line=off)
        cpus += 1
        cpu = int(cells[col["CPU"]])
        if "NODE" in col and cells[col["NODE"]].isdigit():
            by_node.setdefault(int(cells[col["NODE"]]), []).append(cpu)
        if "SOCKET" in col and cells[col["SOCKET"]].isdigit():
            sockets.add(int(cells[col["SOCKET"]]))
    if not cpus:
        raise TopologyParseError("no CPU rows under the header", source=source)
    warnings = () if by_node else ("no NODE column: which CPUs belong to which NUMA node is unknown",)
    return HostNuma(
        nodes=tuple(NumaNode(id=n, cpus=tuple(sorted(c))) for n, c in sorted(by_node.items())),
        sockets=len(sockets) or None,
        cpus=cpus,
        partial=not by_node,
        warnings=warnings,
        source_format="lscpu -p" if parsable else "lscpu -e",
    )
