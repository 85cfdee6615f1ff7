"""Parsers for NVIDIA tool output: `nvidia-smi topo -m|-mp|-p2p|-c`, `--query-gpu --format=csv`, `-q`, `-L` (with
its MIG devices), the plain `nvidia-smi` table (with its "MIG devices:" block, or that block alone) and
`nvidia-smi nvlink --status`. MIG devices are GpuInfo entries of their own, numbered and named as the controller
numbers them (hsched.topo.inventory.mig_index: GPU0.1 is index 101).

Rules that keep them honest (shared/topo/README.md, "Gotchas"):
* never index columns by position: read the header, key off symbols (NV#, PIX...) not legend text;
* accept TABs or runs of spaces; strip ANSI colour codes first; never `strip()` the whole text;
* a row whose cells do not fit the header is an error naming the line, not a guess.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import replace

from hsched.topo.inventory import GpuInfo, Inventory, NvlinkStatus, P2PMatrix, listing_order, mig_index
from hsched.topo.links import is_valid_kind, normalize_kind
from hsched.topo.topology import (
    TopoDevice,
    TopoLink,
    Topology,
    TopologyParseError,
    TopoNic,
    normalize_bus_id,
    parse_cpulist,
)

ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_AFFINITY_COLS = re.compile(r"CPU Affinity|NUMA Affinity|GPU NUMA ID")
_GPU_HEAD = re.compile(r"^GPU\d+$")
_P2P_CELLS = {"OK", "CNS", "GNS", "TNS", "NS", "DR", "U"}
_TRUNCATION_MARKERS = ("[output truncated]", "[...]", "...truncated")


def strip_ansi(text: str) -> str:
    return ANSI_RE.sub("", text)


def _lines(text: str) -> list[str]:
    return strip_ansi(text).replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _find_matrix_header(lines: list[str], source: str | None) -> int:
    """The header is the first line whose first token is a GPU head and whose second is not a cell.

    (A row's second token is a cell such as X or NV12; a header's is another head or a column name.)
    """
    for i, line in enumerate(lines):
        toks = line.split()
        if (
            toks
            and _GPU_HEAD.match(toks[0])
            and (len(toks) == 1 or (not is_valid_kind(toks[1]) and toks[1] not in _P2P_CELLS))
        ):
            return i
    raise TopologyParseError("no matrix header (a line starting with GPU0) found", source=source)


# ---- nvidia-smi topo -m / -mp  ------


def parse_topo_matrix(text: str, source: str | None = None) -> Topology:
    """`nvidia-smi topo -m` (or `-mp`) in any driver's dialect -> Topology.

    Rows that do not fit the header raise TopologyParseError naming the line; rows missing at the end
    (a truncated capture) give a partial Topology with the pairs that both remaining halves could confirm.
    """
    lines = _lines(text)
    hi = _find_matrix_header(lines, source)
    header = lines[hi]
    first_aff = _AFFINITY_COLS.search(header)
    head_part = header[: first_aff.start()] if first_aff else header
    heads = head_part.split()
    aff_cols = [m.group(0) for m in _AFFINITY_COLS.finditer(header)]
    tail = _AFFINITY_COLS.sub("", header[first_aff.start() :]) if first_aff else ""
    if tail.strip():
        raise TopologyParseError(f"unexpected header text {tail.strip()!r}", source=source, line=hi + 1)
    if len(set(heads)) != len(heads):
        raise TopologyParseError("duplicate column heads in the header", source=source, line=hi + 1)
    n = len(heads)
    col = {h: i for i, h in enumerate(heads)}

    cells: dict[str, list[str]] = {}
    affinity: dict[str, dict[str, str]] = {}
    warnings: list[str] = []
    partial = False
    lineno = hi + 1
    for off, line in enumerate(lines[hi + 1 :], start=hi + 2):
        lineno = off
        if not line.strip():
            break
        if line.strip().startswith("Legend") or any(m in line for m in _TRUNCATION_MARKERS):
            if any(m in line for m in _TRUNCATION_MARKERS):
                partial = True
                warnings.append(f"line {off}: capture marked as truncated")
            break
        toks = line.split()
        label = toks[0]
        if label not in col:
            raise TopologyParseError(f"row {label!r} is not a column of the header", source=source, line=off)
        if label in cells:
            raise TopologyParseError(f"row {label} appears twice", source=source, line=off)
        row = toks[1 : 1 + n]
        if len(row) < n:
            raise TopologyParseError(
                f"row {label} has {len(row)} matrix cells, the header has {n} columns",
                source=source,
                line=off,
            )
        for h, c in zip(heads, row, strict=True):
            if c == "X":
                if h != label:
                    raise TopologyParseError(
                        f"row {label}: 'X' under {h}, expected only under {label}", source=source, line=off
                    )
            elif not is_valid_kind(c) or c.upper() in ("XGMI", "PCIE", "SELF"):
                raise TopologyParseError(f"row {label}: {c!r} under {h} is not a link kind", source=source, line=off)
            elif h == label:
                raise TopologyParseError(
                    f"row {label}: expected 'X' on the diagonal, found {c!r}", source=source, line=off
                )
        rest = toks[1 + n :]
        is_gpu = bool(_GPU_HEAD.match(label))
        if rest and len(rest) != len(aff_cols):
            raise TopologyParseError(
                f"row {label} has {len(rest)} affinity cells, the header names {len(aff_cols)} "
                f"({', '.join(aff_cols) or 'none'})",
                source=source,
                line=off,
            )
        if is_gpu and aff_cols and not rest:
            warnings.append(f"line {off}: {label} has no affinity cells")
        cells[label] = row
        affinity[label] = dict(zip(aff_cols, rest, strict=False))
    if not cells:
        raise TopologyParseError("the matrix has a header but no rows", source=source, line=hi + 1)

    missing = [h for h in heads if h not in cells]
    if missing:
        partial = True
        warnings.append(f"rows missing (capture cut?): {', '.join(missing)}")

    nic_legend = _parse_nic_legend(lines[lineno - 1 :])

    def numa_list(value: str | None, label: str) -> tuple[int, ...]:
        if value is None or value.upper() == "N/A":
            return ()
        try:
            return parse_cpulist(value)
        except ValueError:
            raise TopologyParseError(f"{label}: bad NUMA Affinity {value!r}", source=source) from None

    devices: list[TopoDevice] = []
    nics: list[TopoNic] = []
    for h in heads:
        if _GPU_HEAD.match(h):
            aff = affinity.get(h, {})
            try:
                cpus = parse_cpulist(aff.get("CPU Affinity", ""))
            except ValueError:
                raise TopologyParseError(f"{h}: bad CPU Affinity {aff.get('CPU Affinity')!r}", source=source) from None
            nodes = numa_list(aff.get("NUMA Affinity"), h)
            gnid = aff.get("GPU NUMA ID")
            devices.append(
                TopoDevice(
                    name=h,
                    index=int(h[3:]),
                    numa_node=nodes[0] if nodes else None,
                    numa_nodes=nodes,
                    cpu_affinity=cpus,
                    gpu_numa_id=int(gnid) if gnid and gnid.isdigit() else None,
                )
            )
        else:
            nics.append(TopoNic(name=h, device=nic_legend.get(h, h if not h.startswith("NIC") else None)))

    links: list[TopoLink] = []
    gpu_set = {d.name for d in devices}
    for i, a in enumerate(heads):
        for b in heads[i + 1 :]:
            if a not in gpu_set and b not in gpu_set:
                continue  # NIC-NIC pairs: nothing is placed on them
            ab = cells[a][col[b]] if a in cells else None
            ba = cells[b][col[a]] if b in cells else None
            if ab is not None and ba is not None and normalize_kind(ab) != normalize_kind(ba):
                raise TopologyParseError(
                    f"{a}-{b} is {ab} but {b}-{a} is {ba}: the matrix is not symmetric", source=source
                )
            kind = ab if ab is not None else ba
            if kind is None:
                continue
            links.append(TopoLink(a, b, normalize_kind(kind)))
    # NICs take the NUMA node of GPUs on the same socket (PIX..NODE); the matrix has no NIC affinity cells
    by_name = {d.name: d for d in devices}
    nic_numa: dict[str, int | None] = {}
    for lk in links:
        nic, gpu = (lk.a, lk.b) if lk.a not in gpu_set else (lk.b, lk.a)
        if nic in gpu_set or lk.kind not in ("PIX", "PXB", "PHB", "NODE"):  # NODE: same NUMA node
            continue
        node = by_name[gpu].numa_node
        if node is not None:
            nic_numa.setdefault(nic, node)
    nics = [TopoNic(x.name, x.device, nic_numa.get(x.name)) for x in nics]
    fmt = "nvidia-smi topo -m"
    return Topology(
        devices=tuple(devices),
        nics=tuple(nics),
        links=tuple(links),
        partial=partial,
        warnings=tuple(warnings),
        source_format=fmt,
    )


def _parse_nic_legend(lines: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    in_legend = False
    for line in lines:
        s = line.strip()
        if s.startswith("NIC Legend"):
            in_legend = True
            continue
        if in_legend:
            m = re.match(r"^(NIC\d+)\s*:\s*(\S+)$", s)
            if m:
                out[m.group(1)] = m.group(2)
    return out


# ---- nvidia-smi topo -p2p  ------


def parse_p2p(text: str, source: str | None = None) -> P2PMatrix:
    lines = _lines(text)
    hi = _find_matrix_header(lines, source)
    heads = lines[hi].split()
    status: list[tuple[str, str, str]] = []
    seen: list[str] = []
    for off, line in enumerate(lines[hi + 1 :], start=hi + 2):
        if not line.strip() or line.strip().startswith("Legend"):
            break
        toks = line.split()
        if toks[0] not in heads or len(toks) != len(heads) + 1:
            raise TopologyParseError(
                f"row {toks[0]!r} does not fit the {len(heads)}-column header", source=source, line=off
            )
        for h, c in zip(heads, toks[1:], strict=True):
            if c == "X":
                continue
            if c not in _P2P_CELLS:
                raise TopologyParseError(f"{c!r} is not a P2P status", source=source, line=off)
            status.append((toks[0], h, c))
        seen.append(toks[0])
    missing = [h for h in heads if h not in seen]
    return P2PMatrix(
        devices=tuple(heads),
        status=tuple(status),
        partial=bool(missing),
        warnings=(f"rows missing: {', '.join(missing)}",) if missing else (),
    )


# ---- nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]  ------

# Header names as nvidia-smi prints them (canonical, not what was asked: gpu_bus_id -> pci.bus_id).
_CSV_FIELDS = {
    "index": "index",
    "name": "name",
    "gpu_name": "name",
    "uuid": "uuid",
    "gpu_uuid": "uuid",
    "pci.bus_id": "pci_bus_id",
    "gpu_bus_id": "pci_bus_id",
    "memory.total": "memory_total_mib",
    "memory.used": "memory_used_mib",
    "utilization.gpu": "utilization_gpu",
    "temperature.gpu": "temperature_c",
    "power.draw": "power_w",
    "mig.mode.current": "mig_current",
    "mig.mode.pending": "mig_pending",
    "pcie.link.gen.max": "pcie_gen_max",
    "pcie.link.width.max": "pcie_width_max",
}
_DEFAULT_NOHEADER_FIELDS = (
    "index",
    "uuid",
    "name",
    "pci.bus_id",
    "memory.total",
    "memory.used",
    "utilization.gpu",
    "temperature.gpu",
    "power.draw",
)


CSV_FIELD_NAME = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z0-9_]+)*(\s*\[[^\]]*\])?$")
"""A `--query-gpu` header cell: "memory.total [MiB]", "index", "clocks.max.sm [MHz]"."""
_ASK = "index,uuid,name,pci.bus_id,memory.total,mig.mode.current"


def _num(value: str) -> float | None:
    m = re.match(r"^\s*(-?\d+(?:\.\d+)?)", value)
    if not m or value.strip().upper().startswith(("N/A", "[N/A]", "[NOT SUPPORTED]")):
        return None
    return float(m.group(1))


def _bool_mode(value: str) -> bool | None:
    v = value.strip().rstrip("*").lower()
    return True if v == "enabled" else False if v == "disabled" else None


def parse_query_csv(text: str, source: str | None = None, fields: tuple[str, ...] | None = None) -> Inventory:
    """`nvidia-smi --query-gpu=F1,F2,... --format=csv[,noheader][,nounits]` -> Inventory.

    Split on commas, never on whitespace (model names contain spaces). With `noheader`, pass the
    `fields` asked for; the default is the field list hsched's node helper asks for.
    """
    rows = [r for r in csv.reader(io.StringIO(strip_ansi(text)), skipinitialspace=True)
            if any(c.strip() for c in r) and not r[0].lstrip().startswith("#")]  # a capture's own '#' header
    if not rows:
        raise TopologyParseError("empty CSV", source=source)
    first = [c.strip() for c in rows[0]]
    has_header = all(CSV_FIELD_NAME.match(c) for c in first)
    warnings: list[str] = []
    if has_header:
        names = [re.sub(r"\s*\[.*\]$", "", c) for c in first]
        if not any(n in _CSV_FIELDS for n in names):
            raise TopologyParseError(
                f"`--query-gpu` CSV of {', '.join(names)}: none of the fields hsched reads; capture "
                f"`nvidia-smi --query-gpu={_ASK} --format=csv`", source=source)
        if "index" not in names:
            warnings.append("no index column: GPUs numbered in row order")
        body = rows[1:]
        start = 2
    elif fields is None and len(first) != len(_DEFAULT_NOHEADER_FIELDS):
        # which field each column holds is known only from the header (or from hsched's own query)
        raise TopologyParseError(
            f"`--query-gpu` CSV without its header line (noheader), {len(first)} columns: which field each holds is "
            f"unknown; capture `nvidia-smi --query-gpu={_ASK} --format=csv` (no `noheader`)", source=source)
    else:
        names = list(fields or _DEFAULT_NOHEADER_FIELDS)
        body = rows
        start = 1
    gpus: list[GpuInfo] = []
    for off, row in enumerate(body, start=start):
        if len(row) != len(names):
            raise TopologyParseError(f"{len(row)} fields where the header has {len(names)}", source=source, line=off)
        vals: dict[str, object] = {}
        for name, raw in zip(names, row, strict=True):
            key = _CSV_FIELDS.get(name)
            raw = raw.strip()
            if key is None:
                continue
            if key in ("name", "uuid"):
                vals[key] = raw
            elif key == "pci_bus_id":
                vals[key] = normalize_bus_id(raw)
            elif key in ("mig_current", "mig_pending"):
                vals[key] = _bool_mode(raw)
            elif key == "index":
                n = _num(raw)
                if n is None:
                    raise TopologyParseError(f"index {raw!r} is not a number", source=source, line=off)
                vals[key] = int(n)
            else:
                n = _num(raw)
                vals[key] = (
                    int(n)
                    if key in ("memory_total_mib", "memory_used_mib", "pcie_gen_max", "pcie_width_max")
                    and n is not None
                    else n
                )
        idx = vals.pop("index", len(gpus))
        gpus.append(GpuInfo(index=int(str(idx)), **vals))  # type: ignore[arg-type]
    if not gpus:
        raise TopologyParseError("a `--query-gpu` CSV header and no GPU rows", source=source)
    return Inventory(gpus=tuple(gpus), warnings=tuple(warnings), source_format="nvidia-smi --query-gpu csv")


# ---- nvidia-smi -q  ------

_KV_RE = re.compile(r"^(\s*)([^:]+?)\s*:\s?(.*)$")


def parse_smi_q(text: str, source: str | None = None) -> Inventory:
    """`nvidia-smi -q` -> Inventory: model, UUID, bus id, memory, MIG mode, PCIe, utilization, power."""
    lines = _lines(text)
    blocks: list[tuple[str, int, dict[str, str]]] = []
    attached: int | None = None
    driver: str | None = None
    stack: list[tuple[int, str]] = []
    cur: dict[str, str] | None = None
    for off, line in enumerate(lines, start=1):
        if not line.strip() or line.strip().startswith("="):
            continue
        m_gpu = re.match(r"^GPU ([0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-7])\s*$", line)
        if m_gpu:
            cur = {}
            blocks.append((m_gpu.group(1), off, cur))
            stack = []
            continue
        indent = len(line) - len(line.lstrip(" "))
        m = _KV_RE.match(line)
        key = (m.group(2) if m else line).strip()
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if cur is None:
            if m and key == "Attached GPUs":
                attached = int(_num(m.group(3)) or 0)
            elif m and key == "Driver Version":
                driver = m.group(3).strip()
            continue
        path = "/".join([s for _, s in stack] + [key])
        if m:
            cur[path] = m.group(3).strip()
        else:
            stack.append((indent, key))
    if not blocks:
        raise TopologyParseError("no 'GPU <bus id>' block found: not nvidia-smi -q output?", source=source)
    gpus: list[GpuInfo] = []
    warnings: list[str] = []
    for i, (bus, off, kv) in enumerate(blocks):
        if "Product Name" not in kv:
            warnings.append(f"line {off}: GPU {bus} block is cut short")

        def get(*keys: str, kv: dict[str, str] = kv) -> str | None:
            for k in keys:
                v = kv.get(k)
                if v is not None and v.upper() != "N/A":
                    return v
            return None

        def num(*keys: str) -> float | None:
            v = get(*keys)
            return _num(v) if v is not None else None

        total = num("FB Memory Usage/Total")
        used = num("FB Memory Usage/Used")
        gen = num("PCI/GPU Link Info/PCIe Generation/Max")
        width = num("PCI/GPU Link Info/Link Width/Max")
        mig_cur = get("MIG Mode/Current")
        mig_pend = get("MIG Mode/Pending")
        clique = get("Fabric/CliqueId")
        gpus.append(
            GpuInfo(
                index=i,
                name=get("Product Name"),
                uuid=get("GPU UUID"),
                pci_bus_id=normalize_bus_id(get("PCI/Bus Id") or bus),
                memory_total_mib=int(total) if total is not None else None,
                memory_used_mib=int(used) if used is not None else None,
                utilization_gpu=num("Utilization/Gpu"),
                temperature_c=num("Temperature/GPU Current Temp"),
                power_w=num("GPU Power Readings/Power Draw", "Power Readings/Power Draw"),
                mig_current=_bool_mode(mig_cur) if mig_cur else None,
                mig_pending=_bool_mode(mig_pend) if mig_pend else None,
                pcie_gen_max=int(gen) if gen is not None else None,
                pcie_width_max=int(width) if width is not None else None,
                fabric_clique=clique,
            )
        )
    if attached is not None and attached != len(blocks):
        warnings.append(f"header says {attached} GPUs attached, {len(blocks)} GPU blocks found")
    return Inventory(
        gpus=tuple(gpus),
        partial=bool(warnings),
        warnings=tuple(warnings),
        source_format="nvidia-smi -q",
        driver_version=driver,
    )


# ---- plain nvidia-smi  ------

# the third cell is Persistence-M (On/Off) on Linux, Driver-Model (WDDM/TCC/MCDM) on Windows
_TABLE_ROW1 = re.compile(
    r"^\|\s+(\d+)\s+(.+?)\s+(On|Off|WDDM|TCC|MCDM)\s+\|\s+([0-9A-Fa-f]+:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d)"
)
_TABLE_ROW2 = re.compile(
    r"^\|\s*(\S+)\s+(\S+)\s+(\S+)\s+(\S+)\s*/\s*(\S+)\s+\|\s+(\d+)MiB\s*/\s*(\d+)MiB\s+\|\s+(\S+)\s+(\S+)\s+\|"
)


def parse_smi_table(text: str, source: str | None = None) -> Inventory:
    """The plain `nvidia-smi` box table (R470-R580 layouts) -> Inventory (model, bus, memory, util, MIG)."""
    lines = _lines(text)
    gpus: list[GpuInfo] = []
    driver = None
    i = 0
    while i < len(lines):
        line = lines[i]
        dm = re.search(r"Driver Version:\s*(\S+)", line)
        if dm:
            driver = dm.group(1)
        if line.startswith("|") and "Processes:" in line:
            break
        m1 = _TABLE_ROW1.match(line)
        if m1:
            m2 = _TABLE_ROW2.match(lines[i + 1]) if i + 1 < len(lines) else None
            if not m2:
                raise TopologyParseError(
                    f"GPU {m1.group(1)}: second row of its box is missing or damaged",
                    source=source,
                    line=i + 2,
                )
            mig: bool | None = None
            if i + 2 < len(lines) and lines[i + 2].startswith("|") and not lines[i + 2].startswith("+"):
                last = lines[i + 2].rstrip().rstrip("|").split("|")[-1].strip()
                mig = _bool_mode(last)
            gpus.append(
                GpuInfo(
                    index=int(m1.group(1)),
                    name=m1.group(2).strip(),
                    pci_bus_id=normalize_bus_id(m1.group(4)),
                    temperature_c=_num(m2.group(2)),
                    power_w=_num(m2.group(4)),
                    memory_used_mib=int(m2.group(6)),
                    memory_total_mib=int(m2.group(7)),
                    utilization_gpu=_num(m2.group(8)),
                    mig_current=mig,
                )
            )
            i += 2
        i += 1
    if not gpus:
        raise TopologyParseError("no GPU rows found in the nvidia-smi table", source=source)
    migs, _ = mig_table_rows(lines, source)
    names = {g.index: g.name for g in gpus}
    migs = [replace(m, name=f"{names[m.mig_parent]} MIG") if m.mig_parent in names else m for m in migs]
    warnings = ("the MIG devices table names no profile or UUID: `nvidia-smi -L` lists both",) if migs else ()
    return Inventory(gpus=tuple(sorted(gpus + migs, key=listing_order)), warnings=warnings, source_format="nvidia-smi",
                     driver_version=driver)


# ---- nvidia-smi nvlink --status / -e  ------


def parse_nvlink_status(text: str, source: str | None = None) -> NvlinkStatus:
    gpus: list[tuple[int, str, list[tuple[int, float | None]]]] = []
    warnings: list[str] = []
    for off, line in enumerate(_lines(text), start=1):
        mg = re.match(r"^GPU (\d+): (.+?)(?: \(UUID: .*\))?\s*$", line)
        if mg:
            gpus.append((int(mg.group(1)), mg.group(2), []))
            continue
        ml = re.match(r"^\s+Link (\d+): (.*)$", line)
        if ml and gpus:
            val = ml.group(2).strip()
            if "Errors" in val:
                continue  # the -e flavour; counts, not speeds
            speed = None if "inactive" in val else _num(val)
            if all(k != int(ml.group(1)) for k, _ in gpus[-1][2]):
                gpus[-1][2].append((int(ml.group(1)), speed))
        elif "[...]" in line:
            warnings.append(f"line {off}: output elided in the source")
    if not gpus:
        raise TopologyParseError("no 'GPU n:' line found", source=source)
    return NvlinkStatus(
        gpus=tuple((i, n, tuple(lk)) for i, n, lk in gpus), partial=bool(warnings), warnings=tuple(warnings)
    )


_L_GPU_RE = re.compile(r"^GPU (\d+): (.+?) \(UUID: (GPU-[0-9A-Fa-f-]+)\)\s*$")
# R470+: "  MIG 3g.40gb     Device  0: (UUID: MIG-<uuid>)"; R450: "  MIG 3g.20gb Device 0: (UUID: MIG-GPU-<uuid>/1/0)"
_L_MIG_RE = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[0-9A-Za-z/-]+)\)\s*$")


def parse_smi_list(text: str, source: str | None = None) -> Inventory:
    """`nvidia-smi -L` -> Inventory: index, model and UUID of every GPU; the MIG devices listed under a GPU are
    devices of their own (index mig_index(GPU, N) for `Device N`, their profile and MIG UUID, mig_parent the
    GPU), and that GPU has MIG on."""
    gpus: list[GpuInfo] = []
    migs: list[GpuInfo] = []
    for n, line in enumerate(strip_ansi(text).splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _L_GPU_RE.match(line)
        if m:
            gpus.append(GpuInfo(index=int(m.group(1)), name=m.group(2).strip(), uuid=m.group(3)))
            continue
        mm = _L_MIG_RE.match(line)
        if mm and not gpus:
            raise TopologyParseError(
                "MIG device lines without the `GPU N: ...` line they belong under: capture the whole "
                "`nvidia-smi -L` output", source=source, line=n)
        if mm:
            parent = gpus[-1].index
            migs.append(GpuInfo(index=mig_index(parent, int(mm.group(2))), name=f"{gpus[-1].name} MIG {mm.group(1)}",
                                uuid=mm.group(3), mig_parent=parent, mig_profile=mm.group(1)))
            continue
        raise TopologyParseError(f"not an `nvidia-smi -L` line: {line.strip()[:80]!r}", source=source, line=n)
    if not gpus:
        raise TopologyParseError("no GPU lines (GPU N: MODEL (UUID: GPU-...))", source=source)
    sliced = {g.mig_parent for g in migs}
    out = [replace(g, mig_current=True) if g.index in sliced else g for g in gpus]
    return Inventory(gpus=tuple(sorted(out + migs, key=listing_order)), source_format="nvidia-smi -L")


# ---- the "MIG devices:" table of plain nvidia-smi  ------

# "|  0    1   0   0  |             107MiB / 40192MiB    | 42      0 |  3   0    2    0    0 |"
_MIG_ROW = re.compile(
    r"^\|\s*(\d+)\s+(\d+|N/A)\s+(\d+|N/A)\s+(\d+)\s*\|\s*(\d+)MiB\s*/\s*(\d+)MiB\s*\|\s*(\d+|N/A)\b"
)


def _int_or_none(v: str) -> int | None:
    return int(v) if v.isdigit() else None


def mig_table_rows(lines: list[str], source: str | None) -> tuple[list[GpuInfo], bool]:
    """The MIG instances of a "MIG devices:" block (GPU, GI ID, CI ID, MIG Dev, memory, SMs) and whether the
    block was there. The table names neither profile nor UUID: those come from `nvidia-smi -L`."""
    start = next((i for i, ln in enumerate(lines) if re.match(r"^\|\s*MIG devices:", ln)), None)
    if start is None:
        return [], False
    out: list[GpuInfo] = []
    for off, line in enumerate(lines[start + 1 :], start=start + 2):
        if re.match(r"^\|\s*Processes:", line) or (not line.strip() and out):
            break
        m = _MIG_ROW.match(line)
        if m:
            gpu, slot = int(m.group(1)), int(m.group(4))
            out.append(GpuInfo(index=mig_index(gpu, slot), mig_parent=gpu, gpu_instance_id=_int_or_none(m.group(2)),
                               compute_instance_id=_int_or_none(m.group(3)), memory_used_mib=int(m.group(5)),
                               memory_total_mib=int(m.group(6)), sm_count=_int_or_none(m.group(7))))
        elif re.match(r"^\|\s*\d+\s+\d+\s+\d+\s+\d+\s*\|", line):
            raise TopologyParseError("a MIG devices row whose memory or SM cells do not read", source=source, line=off)
    return out, True


def parse_mig_table(text: str, source: str | None = None) -> Inventory:
    """The "MIG devices:" block of plain `nvidia-smi` on its own -> Inventory of MIG instances (their GPU by index
    only: the GPU rows were not captured)."""
    rows, found = mig_table_rows(_lines(text), source)
    if not found:
        raise TopologyParseError("no '| MIG devices:' line found", source=source)
    return Inventory(gpus=tuple(rows), source_format="nvidia-smi MIG devices",
                     warnings=("the MIG devices table names no profile or UUID: `nvidia-smi -L` lists both",))


# ---- nvidia-smi topo -c N  ------

_TOPO_C_RE = re.compile(r"^The GPUs that have an affinity with CPU (\d+) are:\s*(.*)$")


def parse_topo_cpu(text: str, source: str | None = None) -> Inventory:
    """`nvidia-smi topo -c N` (one or several, one after another) -> the GPUs each CPU asked about is local to.
    It holds no links and only the CPUs asked about: `nvidia-smi topo -m` gives every GPU's CPUs and links."""
    local: dict[int, list[int]] = {}
    cpu: int | None = None
    for n, line in enumerate(_lines(text), start=1):
        m = _TOPO_C_RE.match(line.strip())
        rest = line
        if m:
            cpu = int(m.group(1))
            rest = m.group(2)
        if cpu is None:
            continue
        # the indices follow on the next line ("0, 1"); accept "GPU 0" lines too
        for tok in re.split(r"[,\s]+", rest.strip()):
            if not tok or tok.upper() == "GPU":
                continue
            if not tok.isdigit():
                raise TopologyParseError(f"{tok!r} is not a GPU index", source=source, line=n)
            local.setdefault(int(tok), []).append(cpu)
    if cpu is None:
        raise TopologyParseError("no 'The GPUs that have an affinity with CPU N are:' line", source=source)
    return Inventory(
        gpus=tuple(GpuInfo(index=i, affine_cpus=tuple(sorted(set(c)))) for i, c in sorted(local.items())),
        partial=True,
        warnings=("`nvidia-smi topo -c` names only the CPUs asked about and no links: "
                  "capture `nvidia-smi topo -m` for every GPU's CPUs and links",),
        source_format="nvidia-smi topo -c",
    )
