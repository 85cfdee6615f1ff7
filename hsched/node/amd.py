"""AMD GPU discovery for the probe and the monitoring stream: amd-smi first, else rocm-smi; each tool's JSON form
first and its text form where the installed release has no JSON for it. Standard library only (Python 3.8).

The helper reads here only what a device list needs (index, identity, model, memory, utilization, NUMA node);
the topology text (`amd-smi topology` / `xgmi`, `rocm-smi --showtopo` / `--showtoponuma`, their JSON forms) goes
to the controller as the tool printed it, where hsched/topo/parse_amd.py reads it into links, as
`nvidia-smi topo -m` does for NVIDIA nodes (one parser for live nodes and captures).

ROCm selects devices by the index amd-smi and rocm-smi print (ROCR_VISIBLE_DEVICES; see
hsched/controller/launching.py), so a device's `index` here is the tool's own `gpu`/`GPU[n]` number, never a
re-numbering."""

import functools
import json
import re
import shutil
import socket

from .children import run_bounded

AMD_SOURCES = ("amd-smi", "rocm-smi")


def amd_tools():
    return [t for t in AMD_SOURCES if shutil.which(t)]


_FAILED = []  # type: list
"""Why each command of the probe under way failed (a release without it, a driver that is not loaded, a hang):
what the probe says when no form found a GPU. Reset by probe_amd; one probe at a time in a helper process."""


def _run(argv, timeout_s):
    """stdout of argv when it answered 0 in time, else None (a release without that command or option)."""
    exe = shutil.which(argv[0])
    if not exe:
        return None
    r = run_bounded([exe, *argv[1:]], timeout_s, argv[0], new_session=False)
    if r["error"] is not None:
        _FAILED.append(r["error"])
        return None
    if r["rc"] != 0:
        _FAILED.append("%s failed (exit status %s): %s" % (" ".join(argv), r["rc"],
                                                           (r["err"] or "no message").splitlines()[-1][:200]))
        return None
    text = r["out"].decode("utf-8", "replace")
    return text if text.strip() else None


def _json(text):
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def _gpu_list(data):
    """amd-smi's JSON is a list of per-GPU objects; ROCm 7 wraps it as {"gpu_data": [...]}."""
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        data = lists[0] if len(lists) == 1 else None
    return [g for g in data if isinstance(g, dict)] if isinstance(data, list) else None


def _known(v):
    return v.strip() if isinstance(v, str) and v.strip() and v.strip().upper() != "N/A" else None


def _num(v):
    """A number from amd-smi's {"value": x, "unit": u}, a bare number, or "12 %"; None for N/A."""
    if isinstance(v, dict):
        v = v.get("value")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v)
    m = re.match(r"^\s*(-?\d+(?:\.\d+)?)", v) if isinstance(v, str) else None
    return float(m.group(1)) if m else None


def _mib(size):
    """amd-smi's vram size: "MB" meaning MiB (196592 on a 192 GiB MI300X); some releases give bytes or GB."""
    value = _num(size)
    if value is None:
        return None
    unit = str(size.get("unit", "MB")).upper() if isinstance(size, dict) else "MB"
    scale = {"GB": 1024.0, "GIB": 1024.0, "B": 1.0 / (1 << 20), "KB": 1.0 / 1024}.get(unit, 1.0)
    return int(value * scale)


def bus_id(bdf):
    """amd-smi's "0000:0c:00.0" as nvidia-smi spells a bus id ("00000000:0C:00.0")."""
    if not isinstance(bdf, str) or not re.match(r"^[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$", bdf):
        return None
    dom, rest = bdf.split(":", 1)
    return "%08X:%s" % (int(dom, 16), rest.upper())


@functools.lru_cache(maxsize=None)
def _host():
    """This machine's name, read once."""
    return socket.gethostname() or "localhost"


def _uuid(index, uid, bdf):
    """A device's identity: the tool's UUID, else its PCI address, else its index (an SR-IOV guest's rocm-smi
    may give neither; rocm-smi on an MI210 gave no Unique ID). Prefixed "AMD-" so it is never taken for an NVIDIA
    UUID. The controller knows a device by this name across its fleet (who holds it, what it reads), and two alike
    machines have the same PCI addresses and indices, so those carry this machine's name: "AMD-<host>-GPU0"."""
    if uid:
        return "AMD-" + uid if not uid.upper().startswith("AMD-") else uid
    if bdf:
        return "AMD-%s-%s" % (_host(), bdf.lower())
    return "AMD-%s-GPU%d" % (_host(), index)


# ---- amd-smi  ------

def _amd_smi_devices(timeout_s):
    static = _gpu_list(_json(_run(["amd-smi", "static", "--json"], timeout_s)))
    devices = []
    if static:
        for i, g in enumerate(static):
            asic = g.get("asic") if isinstance(g.get("asic"), dict) else {}
            bus = g.get("bus") if isinstance(g.get("bus"), dict) else {}
            numa = g.get("numa") if isinstance(g.get("numa"), dict) else {}
            vram = g.get("vram") if isinstance(g.get("vram"), dict) else {}
            index = g.get("gpu", i) if isinstance(g.get("gpu", i), int) else i
            bdf = _known(bus.get("bdf") or g.get("bdf"))
            node = numa.get("node")
            devices.append({
                "index": index, "uuid": _uuid(index, _known(g.get("uuid")), bdf),
                "name": _known(asic.get("market_name")) or "AMD GPU", "pci_bus_id": bus_id(bdf),
                "memory_total_mib": _mib(vram.get("size")), "gfx_target": _known(asic.get("target_graphics_version")),
                "numa_node": node if isinstance(node, int) and node >= 0 else None,
            })
    else:
        # releases without `static --json`: the text listing's GPU / BDF / UUID / MARKET_NAME
        text = _run(["amd-smi", "static"], timeout_s) or _run(["amd-smi", "list"], timeout_s)
        for block in re.split(r"(?m)^GPU:\s*", text or "")[1:]:
            m = re.match(r"(\d+)", block)
            if not m:
                continue
            kv = dict((k.strip().upper(), v.strip()) for k, v in re.findall(r"(?m)^\s+([A-Z_ ]+?):\s*(\S.*)$", block))
            index = int(m.group(1))
            bdf = _known(kv.get("BDF"))
            devices.append({"index": index, "uuid": _uuid(index, _known(kv.get("UUID")), bdf),
                            "name": _known(kv.get("MARKET_NAME")) or "AMD GPU", "pci_bus_id": bus_id(bdf)})
    return devices


def _amd_smi_metrics(timeout_s):
    """index -> {"utilization_gpu", "memory_used_mib", "temperature_c", "power_w"} from `amd-smi metric --json`."""
    out = {}
    for i, g in enumerate(_gpu_list(_json(_run(["amd-smi", "metric", "--json"], timeout_s))) or []):
        usage = g.get("usage") if isinstance(g.get("usage"), dict) else {}
        mem = g.get("mem_usage") if isinstance(g.get("mem_usage"), dict) else {}
        temp = g.get("temperature") if isinstance(g.get("temperature"), dict) else {}
        power = g.get("power") if isinstance(g.get("power"), dict) else {}
        used = mem.get("used_vram")
        out[g.get("gpu", i)] = {
            "utilization_gpu": _num(usage.get("gfx_activity")),
            "memory_used_mib": _mib(used) if used is not None else None,
            "temperature_c": _num(temp.get("hotspot") or temp.get("edge")),
            "power_w": _num(power.get("socket_power") or power.get("average_socket_power")),
        }
    return out


def _amd_smi_topology(timeout_s):
    """(text, format) of the first topology form this amd-smi prints: the pair tables, else the XGMI table."""
    for argv, fmt in ((["amd-smi", "topology", "--json"], "amd-smi topology --json"),
                      (["amd-smi", "topology"], "amd-smi topology"),
                      (["amd-smi", "xgmi"], "amd-smi xgmi")):
        text = _run(argv, timeout_s)
        if text is not None and (fmt != "amd-smi topology --json" or _json(text) is not None):
            return text, fmt
    return None, None


# ---- rocm-smi  ------

_ROCM_INVENTORY = ["rocm-smi", "--showproductname", "--showbus", "--showuniqueid", "--showmeminfo", "vram", "--json"]
_GPU_KV = re.compile(r"^GPU\[(\d+)\]\s*:\s*(.*?)\s*:\s*(.*)$")


def _rocm_card_devices(cards):
    devices = []
    for index in sorted(cards):
        c = cards[index]
        name = next((_known(c.get(k)) for k in ("Card Series", "Card series", "Device Name", "Card Model",
                                                "Card model") if _known(c.get(k))), None)
        total, used = _num(c.get("VRAM Total Memory (B)")), _num(c.get("VRAM Total Used Memory (B)"))
        numa = _num(c.get("(Topology) Numa Node"))
        bdf = _known(c.get("PCI Bus"))
        uid = _known(c.get("Unique ID"))
        devices.append({
            "index": index, "uuid": _uuid(index, uid, bdf), "name": name or "AMD GPU", "pci_bus_id": bus_id(bdf),
            "memory_total_mib": int(total) // (1 << 20) if total is not None else None,
            "memory_used_mib": int(used) // (1 << 20) if used is not None else None,
            "utilization_gpu": _num(c.get("GPU use (%)")),
            "temperature_c": _num(c.get("Temperature (Sensor junction) (C)") or c.get("Temperature (Sensor edge) (C)")),
            "numa_node": int(numa) if numa is not None and numa >= 0 else None,
        })
    return devices


def _rocm_concise(text):
    """Plain `rocm-smi` (Concise Info): index, model (the line below), temperature, power, GPU% (the last %)."""
    cards = {}
    lines = (text or "").splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(\d+)\s+(?:\d+\s+)?(?:0x[0-9a-fA-F]+\s+)?\[0x[0-9a-fA-F]+\s*:\s*0x[0-9a-fA-F]+\]\s+(.*)$", line)
        if not m:
            continue
        cells = m.group(2).split()
        pcts = [c for c in cells if c.endswith("%")]
        below = lines[i + 1] if i + 1 < len(lines) else ""
        cards[int(m.group(1))] = {
            "Card Series": below.strip() if below.startswith(" ") else None,
            "GPU use (%)": pcts[-1] if pcts else None,
            "Temperature (Sensor junction) (C)": cells[0] if cells else None,
        }
    return cards


def _rocm_kv(text):
    """`GPU[n] : key: value` lines (`rocm-smi -a`, `--showtoponuma`, the --show* text forms) -> n -> {key: value}."""
    cards = {}
    for line in (text or "").splitlines():
        m = _GPU_KV.match(line.strip())
        if m:
            cards.setdefault(int(m.group(1)), {}).setdefault(m.group(2).strip(), m.group(3).strip())
    return cards


def _cards(text):
    """rocm-smi --json's {"card0": {...}, ...} -> index -> fields; {} for anything else."""
    data = _json(text)
    if not isinstance(data, dict):
        return {}
    return dict((int(k[4:]), v) for k, v in data.items() if re.match(r"^card\d+$", k) and isinstance(v, dict))


def _merge(cards, more):
    for index, kv in more.items():
        cards.setdefault(index, {}).update((k, v) for k, v in kv.items() if v not in (None, ""))


def _rocm_smi(timeout_s, topology=True):
    """(devices, topology text, its format). Each part in its JSON form first (rocm-smi >= 5), else its text:
    the inventory (--showproductname --showbus --showuniqueid --showmeminfo vram), the use (--showuse), the
    topology (--showtopo, else --showtoponuma: NUMA only)."""
    cards = _cards(_run(_ROCM_INVENTORY, timeout_s))
    if cards:
        _merge(cards, _cards(_run(["rocm-smi", "--showuse", "--json"], timeout_s)))
    else:
        # text forms: the concise table for every GPU, then whatever --show* text this release prints over it
        cards = _rocm_concise(_run(["rocm-smi"], timeout_s))
        answered = False
        for argv in (["rocm-smi", "--showproductname"], ["rocm-smi", "--showmeminfo", "vram"],
                     ["rocm-smi", "--showbus"], ["rocm-smi", "--showuniqueid"]):
            kv = _rocm_kv(_run(argv, timeout_s))
            answered = answered or bool(kv)
            _merge(cards, kv)
        if not answered:
            _merge(cards, _rocm_kv(_run(["rocm-smi", "-a"], timeout_s)))  # a release with no --show* alone
    topo, fmt = None, None
    if topology:
        for argv, form in ((["rocm-smi", "--showtopo", "--json"], "rocm-smi --json"),
                           (["rocm-smi", "--showtopo"], "rocm-smi --showtopo"),
                           (["rocm-smi", "--showtoponuma"], "rocm-smi --showtoponuma")):
            text = _run(argv, timeout_s)
            found = _cards(text) if form == "rocm-smi --json" else _rocm_kv(text)
            if text is not None and found:
                topo, fmt = text, form
                for index, kv in found.items():
                    if "(Topology) Numa Node" in kv:
                        cards.setdefault(index, {})["(Topology) Numa Node"] = kv["(Topology) Numa Node"]
                break
    return _rocm_card_devices(cards), topo, fmt


def probe_amd(timeout_s=60.0, topology=True):
    """{"source": "amd-smi" | "rocm-smi", "vendor": "amd", "devices": [...], "topo_text", "topo_format"}; None
    when neither tool is here or they answer and find no GPU; {"source": None, "devices": [], "error"} when they
    are here and every command they were asked failed (a broken driver is the node's problem, as for nvidia-smi)."""
    del _FAILED[:]
    if shutil.which("amd-smi"):
        devices = _amd_smi_devices(timeout_s)
        if devices:
            metrics = _amd_smi_metrics(timeout_s)
            for d in devices:
                d.update((k, v) for k, v in metrics.get(d["index"], {}).items() if v is not None)
            text, fmt = _amd_smi_topology(timeout_s) if topology else (None, None)
            return {"source": "amd-smi", "vendor": "amd", "devices": devices, "topo_text": text, "topo_format": fmt}
    if shutil.which("rocm-smi"):
        devices, text, fmt = _rocm_smi(timeout_s, topology)
        if devices:
            return {"source": "rocm-smi", "vendor": "amd", "devices": devices, "topo_text": text, "topo_format": fmt}
    if _FAILED and amd_tools():
        return {"source": None, "devices": [], "error": "AMD GPU probe failed: " + _FAILED[0]}
    return None
