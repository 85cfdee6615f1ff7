"""The front door: recognise which tool printed a capture and hand it to the right parser.

`parse_capture` returns whatever the capture holds (a Topology, an Inventory, HostNuma, a P2P matrix or
NVLink status); `parse_topology` insists on a Topology; `read_topology_file` adds the file name to every
error and turns I/O problems into one-line TopologyParseErrors.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from hsched.topo import parse_amd, parse_host, parse_nvidia
from hsched.topo.inventory import HostNuma, Inventory, NvlinkStatus, P2PMatrix
from hsched.topo.topology import Topology, TopologyParseError

Capture = Topology | Inventory | HostNuma | P2PMatrix | NvlinkStatus

_P2P_CELL_RE = re.compile(r"^\s*GPU\d+\s+(X|OK|CNS|GNS|TNS|NS|DR|U)\s", re.MULTILINE)
_PARSERS: dict[str, Callable[[str, str | None], Capture]] = {
    "nvidia-smi topo -m": parse_nvidia.parse_topo_matrix,
    "nvidia-smi topo -p2p": parse_nvidia.parse_p2p,
    "nvidia-smi -q": parse_nvidia.parse_smi_q,
    "nvidia-smi": parse_nvidia.parse_smi_table,
    "nvidia-smi -L": parse_nvidia.parse_smi_list,
    "nvidia-smi MIG devices": parse_nvidia.parse_mig_table,
    "nvidia-smi topo -c": parse_nvidia.parse_topo_cpu,
    "nvidia-smi --query-gpu csv": parse_nvidia.parse_query_csv,
    "nvidia-smi nvlink": parse_nvidia.parse_nvlink_status,
    "rocm-smi --showtopo": parse_amd.parse_rocm_showtopo,
    "rocm-smi": parse_amd.parse_rocm_concise,
    "rocm-smi -a": parse_amd.parse_rocm_kv,
    "rocm-smi --json": parse_amd.parse_rocm_json,
    "amd-smi topology": parse_amd.parse_amd_smi_topology,
    "amd-smi topology --json": parse_amd.parse_amd_smi_topology_json,
    "amd-smi xgmi": parse_amd.parse_amd_smi_xgmi,
    "amd-smi list/static": parse_amd.parse_amd_smi_list,
    "amd-smi static --json": parse_amd.parse_amd_smi_json_fragment,
    "numactl --hardware": parse_host.parse_numactl,
    "lscpu": parse_host.parse_lscpu,
    "lscpu -e": parse_host.parse_lscpu_table,
    "lscpu -p": parse_host.parse_lscpu_table,
}

# Captures recognised but holding no devices hsched can read: each refused with what it is and what to capture.
_REFUSALS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^\|\s*GPU instance profiles:", re.MULTILINE),
     "`nvidia-smi mig -lgip` output (the GPU instance profiles a GPU could have, not the devices it has)"),
    (re.compile(r"^\|\s*GPU instances:", re.MULTILINE),
     "`nvidia-smi mig -lgi` output (GPU instances without the MIG device UUIDs CUDA needs)"),
    (re.compile(r"^\|\s*Compute instance profiles:", re.MULTILINE),
     "`nvidia-smi mig -lcip` output (compute instance profiles, not devices)"),
    (re.compile(r"^\|\s*Compute instances:", re.MULTILINE),
     "`nvidia-smi mig -lci` output (compute instances without the MIG device UUIDs CUDA needs)"),
    (re.compile(r"^No devices were found\s*$", re.MULTILINE),
     "nvidia-smi output from a machine where it found no GPU ('No devices were found')"),
    (re.compile(r"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"),
     "nvidia-smi's error that it could not reach the NVIDIA driver (no GPU listed)"),
)
_INSTEAD = "capture `nvidia-smi -L` (MIG devices with their UUIDs) or `nvidia-smi topo -m` on a machine whose GPUs work"
FORMATS = tuple(_PARSERS)


def strip_header(text: str) -> str:
    """Without the `# ...` lines a capture may begin with (where and how it was taken): no tool prints them
    before its output, and a JSON document cannot start with them."""
    lines = text.splitlines(keepends=True)
    n = 0
    while n < len(lines) and (lines[n].lstrip().startswith("#") or not lines[n].strip()):
        n += 1
    return "".join(lines[n:]) if n else text


def detect_format(text: str) -> str | None:
    """Name of the tool output `text` looks like, or None."""
    if re.search(r"^# The following is the parsable format|^# CPU,", text, re.MULTILINE):
        return "lscpu -p"  # its own '#' lines say what it is, before a header would be stripped
    t = parse_nvidia.strip_ansi(strip_header(text))
    s = t.strip()
    if not s:
        return None
    if s[0] in "[{":
        if re.match(r'\{\s*"card\d+"\s*:', s):
            return "rocm-smi --json"
        return "amd-smi topology --json" if re.search(r'"(link_type|links)"', s) else "amd-smi static --json"
    if "LINK METRIC TABLE" in t:
        return "amd-smi xgmi"
    if re.search(r"^[A-Z][A-Z /-]* TABLE:\s*$", t, re.MULTILINE):
        return "amd-smi topology"
    if "NVSMI LOG" in t or re.search(r"^GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d\s*$", t, re.MULTILINE):
        return "nvidia-smi -q"
    if "NVIDIA-SMI" in t and "|" in t:
        return "nvidia-smi"
    if re.search(r"^\|\s*MIG devices:", t, re.MULTILINE):
        return "nvidia-smi MIG devices"
    if "ROCm System Management Interface" in t or re.search(r"^GPU\[\d+\]\s*:", t, re.MULTILINE):
        if "Concise Info" in t:
            return "rocm-smi"
        if re.search(r"between two GPUs", t) or (
            "Numa Node" in t and not re.search(r"Card series|Unique ID|PCI Bus", t)
        ):
            return "rocm-smi --showtopo"
        return "rocm-smi -a"
    if re.search(r"^available:\s*\d+ nodes", t, re.MULTILINE) or re.search(r"^node \d+ cpus:", t, re.MULTILINE):
        return "numactl --hardware"
    if re.search(r"^\s*CPU\s+(NODE\s+)?SOCKET\s+CORE\b", t, re.MULTILINE):
        return "lscpu -e"
    if re.search(rf"^\s*({'|'.join(re.escape(k) for k in parse_host.LSCPU_KEYS)})[^:]*:", t, re.MULTILINE):
        return "lscpu"
    if re.search(r"^GPU:\s*\d+\s*$", t, re.MULTILINE):
        return "amd-smi list/static"
    if re.search(r"^(GPU \d+: .+ \(UUID: GPU-[0-9A-Fa-f-]+\)|\s+MIG \S+\s+Device\s+\d+: \(UUID: MIG-\S+\))\s*$",
                 t, re.MULTILINE) and not re.search(r"^\s+Link \d+:", t, re.MULTILINE):
        return "nvidia-smi -L"
    if re.search(r"^GPU \d+: .+$", t, re.MULTILINE) and re.search(r"^\s+Link \d+:", t, re.MULTILINE):
        return "nvidia-smi nvlink"
    if re.search(r"^\s*GPU0\b", t, re.MULTILINE):
        cells = _P2P_CELL_RE.findall(t)
        if any(c not in ("X",) for c in cells) and not re.search(r"\b(NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)\b", t):
            return "nvidia-smi topo -p2p"
        return "nvidia-smi topo -m"
    if re.search(r"^The GPUs that have an affinity with CPU \d+ are:", t, re.MULTILINE):
        return "nvidia-smi topo -c"
    first = s.splitlines()[0]
    cells = [c.strip() for c in first.split(",")]
    if "," in first and (
        all(parse_nvidia.CSV_FIELD_NAME.match(c) for c in cells)
        or re.match(r"^\d+,", first)
        or re.match(r"^(NVIDIA|Tesla|Quadro|GeForce|TITAN|GRID)\b[^,]*,", first)
    ):
        return "nvidia-smi --query-gpu csv"
    return None


def parse_capture(text: str, source: str | None = None, fmt: str | None = None) -> Capture:
    """Parse any supported capture. Raises TopologyParseError (a UserError) with the source and line."""
    fmt = fmt or detect_format(text)
    if fmt is not None and fmt.endswith("--json"):
        text = strip_header(text)
    if fmt is None:
        body = parse_nvidia.strip_ansi(strip_header(text))
        for pattern, what in _REFUSALS:
            if pattern.search(body):
                raise TopologyParseError(f"this is {what}: {_INSTEAD}", source=source)
        raise TopologyParseError(
            "unrecognised input: expected nvidia-smi topo -m, -L, -q, the nvidia-smi table, --query-gpu csv, "
            "rocm-smi, amd-smi topology/static, numactl -H or lscpu output",
            source=source,
        )
    if fmt not in _PARSERS:
        raise TopologyParseError(f"unknown format {fmt!r}; known: {', '.join(FORMATS)}", source=source)
    return _PARSERS[fmt](text, source)


def parse_topology(text: str, source: str | None = None) -> Topology:
    """Parse a capture that describes links (topo -m, rocm-smi --showtopo, amd-smi topology ...)."""
    result = parse_capture(text, source)
    if not isinstance(result, Topology):
        raise TopologyParseError(
            f"this is {getattr(result, 'source_format', 'other')} output, which has no device links; "
            "give `nvidia-smi topo -m`, `rocm-smi --showtopo` or `amd-smi topology` output",
            source=source,
        )
    return result


def read_text(path: str | Path) -> str:
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise TopologyParseError("no such file", source=str(path)) from None
    except IsADirectoryError:
        raise TopologyParseError("is a directory, not a file", source=str(path)) from None
    except OSError as e:
        raise TopologyParseError(f"cannot read ({e.strerror})", source=str(path)) from None
    # PowerShell 5's `nvidia-smi -L > gpus.txt` writes UTF-16 with a byte-order mark; Notepad may add a UTF-8 one
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16", errors="replace")
    if b"\x00" in data[:4096]:
        raise TopologyParseError("binary file, not tool output", source=str(path))
    return data.decode("utf-8-sig", errors="replace")


def read_capture(path: str | Path) -> Capture:
    return parse_capture(read_text(path), str(path))


def read_topology_file(path: str | Path) -> Topology:
    """Read a captured `nvidia-smi topo -m` (or AMD equivalent) file, e.g. a fleet's `simulate.topology`."""
    return parse_topology(read_text(path), str(path))
