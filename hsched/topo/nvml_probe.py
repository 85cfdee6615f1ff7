"""Raw NVML discovery: everything hsched wants to know about a node's NVIDIA GPUs, as a JSON-able dict.

This file is also run on remote nodes by the node helper (as a sibling file), so it is stdlib-only,
Python 3.8 compatible and imports nothing from hsched. The pynvml module is passed in (the real
`import pynvml` from nvidia-ml-py, or a fake in tests). Every call that the driver, the GPU or the
installed pynvml does not support yields None instead of an exception; the reason goes to "errors".

Shape (all sizes in bytes, power in watts):

    {"driver_version": str|None, "nvml_version": str|None, "cuda_driver_version": int|None,
     "devices": [{"index", "uuid", "name", "pci_bus_id", "memory_total", "memory_used",
                  "utilization_gpu", "temperature_c", "power_w", "compute_capability",
                  "numa_node_id", "numa_affinity": [int]|None, "cpu_affinity": [int]|None,
                  "mig_mode_current", "mig_mode_pending", "mig_devices": [...]|None,
                  "pcie_gen_max", "pcie_width_max", "fabric_clique",
                  "nvlinks": [{"link", "active", "remote_bus_id", "remote_type", "version"}]}],
     "pairs": [{"a": index, "b": index, "common_ancestor": int|None, "p2p_read": int|None,
                "p2p_nvlink": int|None}],
     "errors": [str]}
"""

from __future__ import annotations

import os
import re

# nvmlNvLinkDeviceType_t: NVML_NVLINK_DEVICE_TYPE_GPU=0, IBMNPU=1, SWITCH=2, UNKNOWN=0xFF
REMOTE_TYPES = {0: "gpu", 1: "ibmnpu", 2: "switch", 0xFF: "unknown"}
_MAX_LINKS_DEFAULT = 18


def _text(v):
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v


def normalize_bus_id(bus_id):
    """`00000000:1B:00.0` -> `0000:1b:00.0` (NVML prints an 8-digit domain; sysfs and AMD tools use 4)."""
    if bus_id is None:
        return None
    s = str(_text(bus_id)).strip().lower()
    m = re.match(r"^(?:([0-9a-f]+):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$", s)
    if not m:
        return s
    return "%04x:%02x:%02x.%s" % (int(m.group(1) or "0", 16), int(m.group(2), 16), int(m.group(3), 16), m.group(4))


def _bits(words, width=64):
    """NVML bitmasks (arrays of 64-bit words, bit i = CPU or node i) -> sorted list of ints."""
    out = []
    for w_i, word in enumerate(words or ()):
        word = int(word)
        b = 0
        while word:
            if word & 1:
                out.append(w_i * width + b)
            word >>= 1
            b += 1
    return out


class _Caller(object):
    def __init__(self, nvml):
        self.nvml = nvml
        self.errors = []
        self._error_types = tuple(t for t in (getattr(nvml, "NVMLError", None),) if isinstance(t, type))

    def __call__(self, what, name, *args, **kw):
        quiet = kw.get("quiet", False)
        fn = getattr(self.nvml, name, None)
        if fn is None:
            if not quiet:
                self.errors.append("%s: pynvml has no %s" % (what, name))
            return None
        try:
            return fn(*args)
        except self._error_types as e:  # unsupported / not found / GPU lost: a value, not a crash
            if not quiet:
                self.errors.append("%s: %s: %s" % (what, name, e))
            return None


def probe_nvml(pynvml, cpu_count=None, max_links=None, shutdown=True):
    """Discover every GPU NVML sees. `pynvml` is the module (real or fake); returns the dict above."""
    out = {
        "driver_version": None,
        "nvml_version": None,
        "cuda_driver_version": None,
        "devices": [],
        "pairs": [],
        "errors": [],
    }
    call = _Caller(pynvml)
    try:
        pynvml.nvmlInit()
    except Exception as e:  # no driver, no library: report, never raise
        out["errors"].append("nvmlInit: %s" % (e,))
        return out
    try:
        out["driver_version"] = _text(call("system", "nvmlSystemGetDriverVersion"))
        out["nvml_version"] = _text(call("system", "nvmlSystemGetNVMLVersion"))
        out["cuda_driver_version"] = call("system", "nvmlSystemGetCudaDriverVersion")
        count = call("system", "nvmlDeviceGetCount") or 0
        ncpu = cpu_count or os.cpu_count() or 64
        cpu_words = max(1, -(-ncpu // 64))
        links_max = max_links or getattr(pynvml, "NVML_NVLINK_MAX_LINKS", _MAX_LINKS_DEFAULT)
        handles = []
        for i in range(count):
            h = call("GPU%d" % i, "nvmlDeviceGetHandleByIndex", i)
            handles.append(h)
            if h is None:
                out["devices"].append({"index": i, "error": "no handle"})
                continue
            out["devices"].append(_probe_device(pynvml, call, h, i, cpu_words, links_max))
        for i in range(count):
            for j in range(i + 1, count):
                if handles[i] is None or handles[j] is None:
                    continue
                what = "GPU%d-GPU%d" % (i, j)
                anc = call(what, "nvmlDeviceGetTopologyCommonAncestor", handles[i], handles[j])
                read = call(
                    what,
                    "nvmlDeviceGetP2PStatus",
                    handles[i],
                    handles[j],
                    getattr(pynvml, "NVML_P2P_CAPS_INDEX_READ", 0),
                )
                nvl = call(
                    what,
                    "nvmlDeviceGetP2PStatus",
                    handles[i],
                    handles[j],
                    getattr(pynvml, "NVML_P2P_CAPS_INDEX_NVLINK", 2),
                )
                out["pairs"].append(
                    {
                        "a": i,
                        "b": j,
                        "common_ancestor": None if anc is None else int(anc),
                        "p2p_read": read,
                        "p2p_nvlink": nvl,
                    }
                )
    finally:
        if shutdown:
            try:
                pynvml.nvmlShutdown()
            except Exception:  # shutting down; nothing useful to do
                pass
    out["errors"] = call.errors + out["errors"]
    return out


def _probe_device(nvml, call, h, i, cpu_words, links_max):
    what = "GPU%d" % i
    dev = {"index": i}
    idx = call(what, "nvmlDeviceGetIndex", h)
    dev["index"] = i if idx is None else int(idx)
    dev["uuid"] = _text(call(what, "nvmlDeviceGetUUID", h))
    dev["name"] = _text(call(what, "nvmlDeviceGetName", h))
    pci = call(what, "nvmlDeviceGetPciInfo", h)
    dev["pci_bus_id"] = normalize_bus_id(getattr(pci, "busId", None)) if pci is not None else None
    mem = call(what, "nvmlDeviceGetMemoryInfo", h)
    dev["memory_total"] = getattr(mem, "total", None)
    dev["memory_used"] = getattr(mem, "used", None)
    util = call(what, "nvmlDeviceGetUtilizationRates", h)
    dev["utilization_gpu"] = getattr(util, "gpu", None)
    dev["temperature_c"] = call(what, "nvmlDeviceGetTemperature", h, getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
    mw = call(what, "nvmlDeviceGetPowerUsage", h)
    dev["power_w"] = None if mw is None else mw / 1000.0
    cc = call(what, "nvmlDeviceGetCudaComputeCapability", h)
    dev["compute_capability"] = "%d.%d" % tuple(cc) if cc is not None else None
    dev["numa_node_id"] = call(what, "nvmlDeviceGetNumaNodeId", h)
    cpus = call(what, "nvmlDeviceGetCpuAffinity", h, cpu_words)
    dev["cpu_affinity"] = _bits(cpus) if cpus is not None else None
    mem_aff = call(what, "nvmlDeviceGetMemoryAffinity", h, 1, getattr(nvml, "NVML_AFFINITY_SCOPE_NODE", 0))
    dev["numa_affinity"] = _bits(mem_aff) if mem_aff is not None else None
    mig = call(what, "nvmlDeviceGetMigMode", h)
    dev["mig_mode_current"] = None if mig is None else bool(mig[0])
    dev["mig_mode_pending"] = None if mig is None else bool(mig[1])
    dev["mig_devices"] = _mig_devices(call, h, what) if dev["mig_mode_current"] else None
    dev["pcie_gen_max"] = call(what, "nvmlDeviceGetMaxPcieLinkGeneration", h)
    dev["pcie_width_max"] = call(what, "nvmlDeviceGetMaxPcieLinkWidth", h)
    fabric = None
    if getattr(nvml, "nvmlDeviceGetGpuFabricInfo", None) is not None:
        fabric = call(what, "nvmlDeviceGetGpuFabricInfo", h)
    dev["fabric_clique"] = getattr(fabric, "cliqueId", None) if fabric is not None else None
    links = []
    for link in range(links_max):
        # only link 0's failure is worth reporting; later ones just mark the end of the links
        state = call(what, "nvmlDeviceGetNvLinkState", h, link, quiet=link > 0)
        if state is None:
            # past the last link (InvalidArgument / NotSupported) or no NVLink at all
            continue
        entry = {"link": link, "active": bool(state), "remote_bus_id": None, "remote_type": None, "version": None}
        if state:
            rp = call(what, "nvmlDeviceGetNvLinkRemotePciInfo", h, link)
            entry["remote_bus_id"] = normalize_bus_id(getattr(rp, "busId", None)) if rp is not None else None
            if getattr(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", None) is not None:
                rt = call(what, "nvmlDeviceGetNvLinkRemoteDeviceType", h, link)
                entry["remote_type"] = REMOTE_TYPES.get(rt, "unknown") if rt is not None else None
            entry["version"] = call(what, "nvmlDeviceGetNvLinkVersion", h, link)
        links.append(entry)
    dev["nvlinks"] = links  # empty for GPUs without NVLink
    return dev


def mig_profile(name, memory_total=None):
    """A MIG instance's profile ("1g.10gb") from its NVML name ("NVIDIA A100-SXM4-80GB MIG 1g.10gb"), or None."""
    if name:
        words = name.split()
        for k, w in enumerate(words[:-1]):
            if w == "MIG":
                return words[k + 1]
    return None


def _mig_devices(call, h, what):
    n = call(what, "nvmlDeviceGetMaxMigDeviceCount", h) or 0
    out = []
    for k in range(n):
        m = call(what, "nvmlDeviceGetMigDeviceHandleByIndex", h, k)
        if m is None:
            continue  # empty slot (NotFound)
        mem = call(what, "nvmlDeviceGetMemoryInfo", m)
        name = _text(call(what, "nvmlDeviceGetName", m))
        out.append(
            {
                "uuid": _text(call(what, "nvmlDeviceGetUUID", m)),
                "name": name,
                "profile": mig_profile(name, getattr(mem, "total", None)),
                "gpu_instance_id": call(what, "nvmlDeviceGetGpuInstanceId", m),
                "compute_instance_id": call(what, "nvmlDeviceGetComputeInstanceId", m),
                "memory_total": getattr(mem, "total", None),
            }
        )
    return out


if __name__ == "__main__":  # pragma: no cover - `python3 nvml_probe.py` on a GPU machine prints the dict
    import json

    try:
        import pynvml as _pynvml
    except ImportError:
        print(json.dumps({"devices": [], "errors": ["pynvml (nvidia-ml-py) is not installed"]}))
    else:
        print(json.dumps(probe_nvml(_pynvml), indent=2, default=str))
