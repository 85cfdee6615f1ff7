"""Parsers for AMD tool output: `rocm-smi --showtopo` / `--showtoponuma` / `-a` / the concise table / `--json`,
`amd-smi topology` (text, both JSON layouts), `amd-smi xgmi`, `amd-smi list` and `amd-smi static` (text and JSON).

AMD pairs are ranked by link type and weight, not by hops (rocm-smi says 1 hop for any XGMI pair).
amd-smi keys its tables by BDF; hsched names the devices GPU0..n in that (bus) order and keeps the BDF.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hsched.topo.inventory import GpuInfo, Inventory
from hsched.topo.parse_nvidia import strip_ansi
from hsched.topo.topology import (
    TopoDevice,
    TopoLink,
    Topology,
    TopologyParseError,
    normalize_bus_id,
)

_BDF = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]"
_BDF_RE = re.compile(rf"^{_BDF}$")
_GPU_KV = re.compile(r"^GPU\[(\d+)\]\s*:\s*(.*)$")
_TRUNC = ("[output truncated]", "[...]")


def _lines(text: str) -> list[str]:
    return strip_ansi(text).replace("\r\n", "\n").split("\n")


def _truncated(text: str) -> bool:
    return any(t in text for t in _TRUNC)


# ---- rocm-smi  ------


def _rocm_sections(lines: list[str]) -> list[tuple[str, int, list[tuple[int, str]]]]:
    """Split on `==== Title ====` banners -> (title, line number, [(line number, line), ...])."""
    out: list[tuple[str, int, list[tuple[int, str]]]] = []
    for off, line in enumerate(lines, start=1):
        m = re.match(r"^=+\s*(.*?)\s*=+\s*$", line)
        if m:
            out.append((m.group(1), off, []))
        elif out and line.strip():
            out[-1][2].append((off, line))
    return out


def _matrix(rows: list[tuple[int, str]], source: str | None) -> tuple[list[str], dict[str, list[str]]]:
    if not rows:
        raise TopologyParseError("empty matrix section", source=source)
    heads = rows[0][1].split()
    body: dict[str, list[str]] = {}
    for off, line in rows[1:]:
        toks = line.split()
        if toks[0] not in heads or len(toks) != len(heads) + 1:
            raise TopologyParseError(
                f"row {toks[0]!r} does not fit the {len(heads)}-column header", source=source, line=off
            )
        body[toks[0]] = toks[1:]
    return heads, body


def parse_rocm_showtopo(text: str, source: str | None = None) -> Topology:
    """`rocm-smi --showtopo` (weight, hops, link type, NUMA) or `--showtoponuma` (NUMA only) -> Topology."""
    sections = _rocm_sections(_lines(text))
    weights: dict[str, list[str]] = {}
    hops: dict[str, list[str]] = {}
    types: dict[str, list[str]] = {}
    heads: list[str] = []
    numa: dict[int, int] = {}
    for title, _off, rows in sections:
        t = title.lower()
        if t.startswith("weight between"):
            heads, weights = _matrix(rows, source)
        elif t.startswith("hops between"):
            heads, hops = _matrix(rows, source)
        elif t.startswith("link type between"):
            heads, types = _matrix(rows, source)
        elif t.startswith("numa nodes"):
            for off, line in rows:
                m = _GPU_KV.match(line.strip())
                if not m:
                    continue
                mm = re.match(r"\(Topology\) Numa Node:\s*(-?\d+)", m.group(2))
                if mm:
                    numa[int(m.group(1))] = int(mm.group(1))
                elif "Numa" not in m.group(2):
                    raise TopologyParseError(f"unexpected line {line.strip()!r}", source=source, line=off)
    if not heads and not numa:
        raise TopologyParseError("no topology or NUMA section found: not rocm-smi --showtopo output?", source=source)
    if not heads:
        heads = [f"GPU{i}" for i in sorted(numa)]
    devices = []
    for h in heads:
        node = numa.get(int(h[3:]))
        if node is not None and node < 0:
            node = None  # rocm-smi prints -1 when the kernel has no NUMA information
        devices.append(
            TopoDevice(name=h, index=int(h[3:]), numa_node=node, numa_nodes=(node,) if node is not None else ())
        )
    links: list[TopoLink] = []
    warnings: list[str] = []
    for i, a in enumerate(heads):
        for j in range(i + 1, len(heads)):
            b = heads[j]
            blank: list[str | None] = [None] * len(heads)
            kind = types.get(a, blank)[j] or (types.get(b) or blank)[i]
            if kind is None:
                continue
            w = weights.get(a, [None] * len(heads))[j]
            hp = hops.get(a, [None] * len(heads))[j]
            links.append(
                TopoLink(
                    a,
                    b,
                    kind.upper(),
                    weight=int(w) if w and w.isdigit() else None,
                    hops=int(hp) if hp and hp.isdigit() else None,
                )
            )
    if not links:
        warnings.append("no link-type table: NUMA placement only, links unknown")
    fmt = "rocm-smi --showtopo" if types else "rocm-smi --showtoponuma"
    partial = bool(types) and len(types) < len(heads)
    if partial:
        warnings.append("link-type table has fewer rows than GPUs")
    return Topology(
        devices=tuple(devices),
        links=tuple(links),
        partial=partial or _truncated(text),
        warnings=tuple(warnings),
        source_format=fmt,
    )


def parse_rocm_kv(text: str, source: str | None = None) -> Inventory:
    """`rocm-smi -a` / `--showallinfo` style `GPU[n] : key: value` lines -> Inventory."""
    per: dict[int, dict[str, str]] = {}
    for line in _lines(text):
        m = _GPU_KV.match(line.strip())
        if not m:
            continue
        kv = m.group(2)
        if ":" not in kv:
            continue
        k, v = kv.split(":", 1)
        per.setdefault(int(m.group(1)), {}).setdefault(k.strip(), v.strip())
    if not per:
        raise TopologyParseError("no 'GPU[n] : key: value' lines found", source=source)
    gpus = []
    for i in sorted(per):
        kv = per[i]
        name = kv.get("Card series") or kv.get("Card Series") or kv.get("Card model")
        bus = kv.get("PCI Bus")
        total = kv.get("VRAM Total Memory (B)")
        temp = kv.get("Temperature (Sensor junction) (C)") or kv.get("Temperature (Sensor edge) (C)")
        power = next((v for k, v in kv.items() if "Package Power" in k and k.startswith(("Current", "Average"))), None)
        numa = kv.get("(Topology) Numa Node")
        gpus.append(
            GpuInfo(
                index=i,
                name=name,
                uuid=kv.get("Unique ID"),
                pci_bus_id=normalize_bus_id(bus) if bus else None,
                memory_total_mib=int(total) // (1024 * 1024) if total and total.isdigit() else None,
                temperature_c=_f(temp),
                power_w=_f(power),
                utilization_gpu=_f(kv.get("GPU use (%)")),
                numa_node=int(numa) if numa and numa.lstrip("-").isdigit() and int(numa) >= 0 else None,
            )
        )
    return Inventory(gpus=tuple(gpus), source_format="rocm-smi -a", partial=_truncated(text))


def _f(v: str | None) -> float | None:
    if v is None:
        return None
    m = re.match(r"^\s*(-?\d+(?:\.\d+)?)", v)
    return float(m.group(1)) if m else None


def parse_rocm_concise(text: str, source: str | None = None) -> Inventory:
    """Plain `rocm-smi` (Concise Info): index, model (second line), temperature, power, VRAM%, GPU%."""
    lines = _lines(text)
    gpus: list[GpuInfo] = []
    for i, line in enumerate(lines):
        m = re.match(r"^(\d+)\s+(?:\d+\s+)?(?:0x[0-9a-fA-F]+\s+)?\[0x[0-9a-fA-F]+\s*:\s*0x[0-9a-fA-F]+\]\s+(.*)$", line)
        if not m:
            continue
        cells = m.group(2).split()
        name = None
        if i + 1 < len(lines) and lines[i + 1].startswith(" ") and lines[i + 1].strip():
            name = lines[i + 1].strip()
        pcts = [c for c in cells if c.endswith("%")]
        gpus.append(
            GpuInfo(
                index=int(m.group(1)),
                name=name,
                temperature_c=_f(cells[0]) if cells else None,
                power_w=_f(cells[1]) if len(cells) > 1 else None,
                utilization_gpu=_f(pcts[-1]) if pcts else None,
            )
        )
    if not gpus:
        raise TopologyParseError("no device rows in the rocm-smi table", source=source)
    return Inventory(gpus=tuple(gpus), source_format="rocm-smi")


# ---- amd-smi topology (text)  ------


def _amd_tables(text: str, source: str | None) -> dict[str, tuple[list[str], dict[str, list[str]]]]:
    tables: dict[str, tuple[list[str], dict[str, list[str]]]] = {}
    lines = _lines(text)
    i = 0
    while i < len(lines):
        m = re.match(r"^([A-Z][A-Z /-]*?) TABLE:\s*$", lines[i].strip())
        if not m:
            i += 1
            continue
        title = m.group(1)
        heads = lines[i + 1].split() if i + 1 < len(lines) else []
        if not heads or not all(_BDF_RE.match(h) for h in heads):
            raise TopologyParseError(f"{title} TABLE: header is not a list of BDFs", source=source, line=i + 2)
        body: dict[str, list[str]] = {}
        j = i + 2
        while j < len(lines) and lines[j].strip():
            toks = lines[j].split()
            if not _BDF_RE.match(toks[0]) or len(toks) != len(heads) + 1:
                if toks[0].endswith(":") or "TABLE" in lines[j] or toks[0] == "Legend:":
                    break
                raise TopologyParseError(
                    f"{title} TABLE: row does not fit the {len(heads)}-column header",
                    source=source,
                    line=j + 1,
                )
            body[toks[0]] = toks[1:]
            j += 1
        tables[title] = (heads, body)
        i = j
    return tables


def parse_amd_smi_topology(text: str, source: str | None = None) -> Topology:
    """`amd-smi topology` text (ACCESS/WEIGHT/HOPS/LINK TYPE/NUMA BW tables, or the -cndz tables)."""
    tables = _amd_tables(text, source)
    if not tables:
        raise TopologyParseError("no '... TABLE:' blocks found: not amd-smi topology output?", source=source)
    heads = next(iter(tables.values()))[0]
    names = {h: f"GPU{i}" for i, h in enumerate(heads)}
    devices = tuple(TopoDevice(name=names[h], index=i, pci_bus_id=normalize_bus_id(h)) for i, h in enumerate(heads))
    types = tables.get("LINK TYPE", (heads, {}))[1]
    weights = tables.get("WEIGHT", (heads, {}))[1]
    hops = tables.get("HOPS", (heads, {}))[1]
    bw = tables.get("NUMA BW", (heads, {}))[1]
    warnings: list[str] = []
    partial = False
    links: list[TopoLink] = []
    for i, a in enumerate(heads):
        for j in range(i + 1, len(heads)):
            b = heads[j]
            row = types.get(a)
            if row is None:
                continue
            kind = row[j].upper()
            w = weights.get(a, [None] * len(heads))[j]
            hp = hops.get(a, [None] * len(heads))[j]
            bwv = bw.get(a, [None] * len(heads))[j]
            gbps = None
            if bwv and re.match(r"^\d+-\d+$", bwv):
                gbps = int(bwv.split("-")[1]) / 1000.0  # MB/s max -> GB/s
            links.append(
                TopoLink(
                    names[a],
                    names[b],
                    kind,
                    weight=int(w) if w and w.isdigit() else None,
                    hops=int(hp) if hp and hp.isdigit() else None,
                    bandwidth_gbps=gbps,
                )
            )
    if not types:
        partial = True
        warnings.append("no LINK TYPE table (e.g. `topology -cndz`): devices only, links unknown")
    elif len(types) < len(heads):
        partial = True
        warnings.append("LINK TYPE table has fewer rows than devices")
    return Topology(
        devices=devices,
        links=tuple(links),
        partial=partial,
        warnings=tuple(warnings),
        source_format="amd-smi topology",
    )


def parse_amd_smi_xgmi(text: str, source: str | None = None) -> Topology:
    """`amd-smi xgmi` LINK METRIC TABLE: per-GPU BDF, bit rate, max bandwidth and link type.

    The table gives one link type per GPU, not per pair; when every GPU reports XGMI and lists every other
    GPU as a peer (all-to-all hives such as MI300X), every pair is an XGMI link at the per-peer rate.
    """
    rows: list[tuple[int, str, str, float | None, str]] = []
    for off, line in enumerate(_lines(text), start=1):
        m = re.match(rf"^GPU(\d+)\s+({_BDF})\s+(.*?)\s+(\S+)\s*$", line.strip())
        if m:
            rates = re.findall(r"(\d+(?:\.\d+)?)\s*Gb/s", m.group(3))
            max_gbps = float(rates[-1]) / 8 if rates else None
            rows.append((int(m.group(1)), m.group(2), m.group(3), max_gbps, m.group(4).upper()))
        elif line.startswith("GPU"):
            raise TopologyParseError("GPU row of the LINK METRIC TABLE is damaged", source=source, line=off)
    if not rows:
        raise TopologyParseError("no GPU rows in the LINK METRIC TABLE", source=source)
    devices = tuple(TopoDevice(name=f"GPU{i}", index=i, pci_bus_id=normalize_bus_id(b)) for i, b, *_ in rows)
    links: list[TopoLink] = []
    warnings: list[str] = []
    if all(r[4] == "XGMI" for r in rows):
        for x in range(len(rows)):
            for y in range(x + 1, len(rows)):
                links.append(
                    TopoLink(
                        f"GPU{rows[x][0]}",
                        f"GPU{rows[y][0]}",
                        "XGMI",
                        weight=15,
                        hops=1,
                        bandwidth_gbps=rows[x][3],
                    )
                )
        warnings.append("pair links inferred from per-GPU link_type (all XGMI): an all-to-all hive")
    else:
        warnings.append("mixed link types per GPU: pair links unknown")
    return Topology(
        devices=devices,
        links=tuple(links),
        partial=not links,
        warnings=tuple(warnings),
        source_format="amd-smi xgmi",
    )


# ---- amd-smi topology --json  ------


def parse_amd_smi_topology_json(text: str, source: str | None = None) -> Topology:
    """Both JSON layouts: old per-GPU `{"gpu": 0, "link_type": {"gpu_1": "XGMI"}, "weight": {...}}` and new
    `{"gpu": 0, "bdf": ..., "links": [{"gpu": 1, "link_type": "XGMI", "weight": 15, "num_hops": 1}]}`;
    ROCm 7 may wrap the list in an object (`{"gpu_data": [...]}`)."""
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as e:
        raise TopologyParseError(f"invalid JSON ({e.msg})", source=source, line=e.lineno) from None
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        if len(lists) != 1:
            raise TopologyParseError("JSON object without a single list of GPUs", source=source)
        data = lists[0]
    if not isinstance(data, list) or not all(isinstance(g, dict) and "gpu" in g for g in data):
        raise TopologyParseError("expected a JSON list of per-GPU objects with a 'gpu' key", source=source)
    n = len(data)
    devices = []
    pairs: dict[tuple[int, int], TopoLink] = {}
    for g in data:
        i = int(g["gpu"])
        bdf = g.get("bdf")
        devices.append(TopoDevice(name=f"GPU{i}", index=i, pci_bus_id=normalize_bus_id(bdf) if bdf else None))
        peers: list[tuple[int, dict[str, Any]]] = []
        if isinstance(g.get("links"), list):
            for lk in g["links"]:
                peers.append(
                    (
                        int(lk.get("gpu", -1)),
                        {
                            "type": lk.get("link_type"),
                            "weight": lk.get("weight"),
                            "hops": lk.get("num_hops", lk.get("hops")),
                        },
                    )
                )
        elif isinstance(g.get("link_type"), dict):
            for key, kind in g["link_type"].items():
                m = re.match(r"^gpu_(\d+)$", key)
                if not m:
                    continue
                j = int(m.group(1))
                peers.append(
                    (
                        j,
                        {
                            "type": kind,
                            "weight": (g.get("weight") or {}).get(key),
                            "hops": (g.get("hops") or {}).get(key),
                        },
                    )
                )
        for j, info in peers:
            kind = str(info["type"] or "").upper()
            if j == i or kind in ("SELF", "", "N/A"):
                continue
            key = (min(i, j), max(i, j))
            w = info["weight"]
            hp = info["hops"]
            pairs.setdefault(
                key,
                TopoLink(
                    f"GPU{key[0]}",
                    f"GPU{key[1]}",
                    kind,
                    weight=int(w) if isinstance(w, int) else None,
                    hops=int(hp) if isinstance(hp, int) else None,
                ),
            )
    expected = n * (n - 1) // 2
    warnings = () if len(pairs) == expected else (f"{len(pairs)} of {expected} pairs described",)
    return Topology(
        devices=tuple(sorted(devices, key=lambda d: d.index)),
        links=tuple(pairs.values()),
        partial=bool(warnings),
        warnings=warnings,
        source_format="amd-smi topology --json",
    )


# ---- amd-smi list / static  ------


def parse_amd_smi_list(text: str, source: str | None = None) -> Inventory:
    """`amd-smi list` and `amd-smi static` (ASIC/BUS/VRAM blocks) -> Inventory."""
    gpus: list[dict[str, str]] = []
    for line in _lines(text):
        m = re.match(r"^GPU:\s*(\d+)\s*$", line)
        if m:
            gpus.append({"index": m.group(1)})
            continue
        kv = re.match(r"^\s+([A-Z_ ]+?):\s*(.+)$", line, re.IGNORECASE)
        if kv and gpus:
            gpus[-1].setdefault(kv.group(1).strip().upper(), kv.group(2).strip())
    if not gpus:
        raise TopologyParseError("no 'GPU: n' block found: not amd-smi list/static output?", source=source)
    out = []
    for g in gpus:
        bdf = g.get("BDF")
        size = g.get("SIZE")
        out.append(
            GpuInfo(
                index=int(g["index"]),
                name=g.get("MARKET_NAME"),
                uuid=g.get("UUID"),
                pci_bus_id=normalize_bus_id(bdf) if bdf else None,
                gfx_target=g.get("TARGET_GRAPHICS_VERSION"),
                memory_total_mib=int(_f(size) or 0) or None if size else None,
                pcie_width_max=int(g["MAX_PCIE_WIDTH"]) if g.get("MAX_PCIE_WIDTH", "").isdigit() else None,
            )
        )
    trunc = _truncated(text)
    return Inventory(
        gpus=tuple(out),
        partial=trunc,
        warnings=("capture truncated at the source: more GPUs may exist",) if trunc else (),
        source_format="amd-smi list/static",
    )


def _known(v: Any) -> str | None:
    return v if isinstance(v, str) and v.strip() and v.strip().upper() != "N/A" else None


def parse_amd_smi_json_fragment(text: str, source: str | None = None) -> Inventory:
    """`amd-smi static --json` (list of GPUs, or one GPU's `vram` object selected with jq)."""
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as e:
        raise TopologyParseError(f"invalid JSON ({e.msg})", source=source, line=e.lineno) from None
    if isinstance(data, dict) and "gpu_data" in data:
        data = data["gpu_data"]
    items = data if isinstance(data, list) else [data]
    gpus = []
    fragment = False
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise TopologyParseError("expected JSON objects", source=source)
        vram = item.get("vram", item) if "vram" in item else item
        if "vram" not in item and "bdf" not in item:
            fragment = True  # one GPU's `vram` object picked out with jq
        size = vram.get("size") if isinstance(vram, dict) else None
        mib = None
        if isinstance(size, dict) and isinstance(size.get("value"), int | float):
            # amd-smi says "MB" and means MiB (196592 on a 192 GiB MI300X); some releases give bytes ("B")
            unit = str(size.get("unit", "MB")).upper()
            scale = {"GB": 1024.0, "GIB": 1024.0, "B": 1 / (1 << 20), "KB": 1 / 1024}.get(unit, 1.0)
            mib = int(size["value"] * scale)
        asic = item.get("asic", {}) if isinstance(item.get("asic"), dict) else {}
        bus = item.get("bus", {}) if isinstance(item.get("bus"), dict) else {}
        numa = item.get("numa", {}) if isinstance(item.get("numa"), dict) else {}
        bdf = bus.get("bdf") or item.get("bdf")  # `static` nests it under bus, `list --json` does not
        width = bus.get("max_pcie_width")
        node = numa.get("node")
        gpus.append(
            GpuInfo(
                index=int(item.get("gpu", i)),
                name=_known(asic.get("market_name")),
                uuid=_known(item.get("uuid")),
                pci_bus_id=normalize_bus_id(bdf) if isinstance(bdf, str) and _BDF_RE.match(bdf.strip()) else None,
                gfx_target=_known(asic.get("target_graphics_version")),
                memory_total_mib=mib,
                pcie_width_max=width if isinstance(width, int) else None,
                numa_node=node if isinstance(node, int) and node >= 0 else None,
            )
        )
    warnings = ("a fragment of one GPU's static info (VRAM only)",) if fragment else ()
    # `amd-smi list --json` is the same list with only gpu, bdf, uuid (and kfd/partition ids) per GPU
    listing = all(isinstance(it, dict) and "bdf" in it and "asic" not in it for it in items)
    return Inventory(gpus=tuple(gpus), partial=fragment, warnings=warnings,
                     source_format="amd-smi list --json" if listing else "amd-smi static --json")


# ---- rocm-smi --json  ------

_ROCM_PAIR = re.compile(
    r"^\(Topology\) (Link type|Weight|Hops) between (?:DRM devices|two GPUs) (\d+) and (\d+)$", re.IGNORECASE
)
_ROCM_NAME_KEYS = ("Card Series", "Card series", "Device Name", "Card Model", "Card model", "Card SKU")


def parse_rocm_json(text: str, source: str | None = None) -> Topology | Inventory:
    """`rocm-smi --json` with any --show* options: `{"card0": {...}, "card1": {...}, "system": {...}}`. With the
    topology keys of `--showtopo --json` (in "system": "(Topology) Link type between DRM devices 0 and 1": "XGMI",
    its Weight and Hops; per card "(Topology) Numa Node") a Topology; otherwise each card's name, bus, UUID,
    VRAM and gfx target as an Inventory."""
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as e:
        raise TopologyParseError(f"invalid JSON ({e.msg})", source=source, line=e.lineno) from None
    cards = {int(k[4:]): v for k, v in data.items() if re.fullmatch(r"card\d+", k) and isinstance(v, dict)}
    if not cards:
        raise TopologyParseError('no "cardN" objects: not rocm-smi --json output?', source=source)
    system = data.get("system") if isinstance(data.get("system"), dict) else {}
    pairs: dict[tuple[int, int], dict[str, str]] = {}
    for key, value in system.items():
        m = _ROCM_PAIR.match(key)
        if m:
            a, b = sorted((int(m.group(2)), int(m.group(3))))
            pairs.setdefault((a, b), {}).setdefault(m.group(1).lower(), str(value))

    def numa_of(card: dict[str, Any]) -> int | None:
        v = str(card.get("(Topology) Numa Node", ""))
        return int(v) if v.isdigit() else None  # -1: the kernel has no NUMA information

    if any("link type" in info for info in pairs.values()):
        devices = tuple(TopoDevice(name=f"GPU{i}", index=i, numa_node=numa_of(c),
                                   numa_nodes=(n,) if (n := numa_of(c)) is not None else ())
                        for i, c in sorted(cards.items()))
        links = []
        for (a, b), info in sorted(pairs.items()):
            kind = info.get("link type", "").upper()
            if a == b or a not in cards or b not in cards or kind in ("", "N/A", "SELF"):
                continue
            w, hp = info.get("weight", ""), info.get("hops", "")
            links.append(TopoLink(f"GPU{a}", f"GPU{b}", kind, weight=int(w) if w.isdigit() else None,
                                  hops=int(hp) if hp.isdigit() else None))
        n = len(cards)
        warnings = () if len(links) == n * (n - 1) // 2 else (f"{len(links)} of {n * (n - 1) // 2} pairs described",)
        return Topology(devices=devices, links=tuple(links), partial=bool(warnings), warnings=warnings,
                        source_format="rocm-smi --showtopo --json")
    gpus = []
    for i, c in sorted(cards.items()):
        vram = str(c.get("VRAM Total Memory (B)", ""))
        bus = str(c.get("PCI Bus", ""))
        uid = _known(c.get("Unique ID"))
        gpus.append(GpuInfo(
            index=i,
            name=next((str(c[k]) for k in _ROCM_NAME_KEYS if _known(c.get(k))), None),
            uuid=uid,
            pci_bus_id=normalize_bus_id(bus) if _BDF_RE.match(bus) else None,
            memory_total_mib=int(vram) // (1 << 20) if vram.isdigit() else None,
            numa_node=numa_of(c),
            gfx_target=_known(c.get("GFX Version")),
        ))
    return Inventory(gpus=tuple(gpus), source_format="rocm-smi --json")
