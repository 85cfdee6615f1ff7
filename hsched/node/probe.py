"""`probe`: the machine's facts (CPUs, memory, NUMA nodes, boot id) and its GPUs: NVIDIA's from NVML (nvidia-ml-py's
pynvml, shipped beside the helper, and hsched/topo/nvml_probe.py), else nvidia-smi; AMD's from amd-smi, else
rocm-smi (amd.py), where those find none; the GPU discovery runs in a
child process with a hard time limit, so a hung driver costs a bounded wait."""

import json
import os
import re
import shutil
import subprocess
import sys

from .amd import amd_tools, probe_amd
from .children import child_setup, run_bounded
from .confine import ENTRY
from .nics import probe_nics
from .plugin import run_plugin
from .records import boot_id, read_text
from .version import HELPER_VERSION


def parse_cpulist(text):
    cpus = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            cpus.extend(range(int(a), int(b) + 1))
        else:
            cpus.append(int(part))
    return cpus


def numa_nodes():
    base = "/sys/devices/system/node"
    out = []
    try:
        names = sorted(n for n in os.listdir(base) if n.startswith("node") and n[4:].isdigit())
    except OSError:
        return out
    for n in names:
        mem_kib = None
        meminfo = read_text(os.path.join(base, n, "meminfo")) or ""
        for line in meminfo.splitlines():
            if "MemTotal:" in line:
                try:
                    mem_kib = int(line.split("MemTotal:")[1].split()[0])
                except (IndexError, ValueError):
                    pass
        out.append({
            "id": int(n[4:]),
            "cpus": parse_cpulist(read_text(os.path.join(base, n, "cpulist"))),
            "memory_mib": mem_kib // 1024 if mem_kib else None,
        })
    return out


def memory_total_mib():
    for line in (read_text("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return None


def pci_numa_node(bus_id):
    """NUMA node of a PCI device from sysfs ('00000000:1B:00.0' -> /sys/bus/pci/devices/0000:1b:00.0)."""
    if not bus_id:
        return None
    bid = bus_id.lower()
    if len(bid.split(":")[0]) == 8:
        bid = bid[4:]
    val = read_text("/sys/bus/pci/devices/%s/numa_node" % bid)
    try:
        n = int(val) if val is not None else None
    except ValueError:
        return None
    return n if n is not None and n >= 0 else None


def _nvml_probe():
    """hsched/topo/nvml_probe.py (stdlib only), loaded by path: beside this module in a node's bundle, in
    hsched/topo here. None where it is not."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    for path in (os.path.join(here, "nvml_probe.py"), os.path.join(os.path.dirname(here), "topo", "nvml_probe.py")):
        if os.path.isfile(path):
            try:
                spec = importlib.util.spec_from_file_location("hsched_nvml_probe", path)
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
                return mod
            except Exception:
                return None
    return None


def probe_nvml():
    try:
        import pynvml
    except Exception:
        return None
    nvml_probe = _nvml_probe()
    try:
        if nvml_probe is not None:
            raw = nvml_probe.probe_nvml(pynvml)
            raw["source"] = "nvml"
            for dev in raw.get("devices", []):
                aff = dev.get("numa_affinity") or []
                if dev.get("numa_node") is None:
                    dev["numa_node"] = aff[0] if len(aff) == 1 else pci_numa_node(dev.get("pci_bus_id"))
            return raw
        return None
    except Exception as e:  # no driver, no GPU: NVML raises on init
        return {"source": None, "error": str(e), "devices": []}


_QUERY = ("index,uuid,name,pci.bus_id,memory.total,memory.used,utilization.gpu,temperature.gpu,power.draw,"
          "mig.mode.current")
_L_GPU = re.compile(r"^GPU (\d+): .*\(UUID: (GPU-[^)\s]+)\)")
_L_MIG = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[^)\s]+)\)")


def mig_listing(text):
    """GPU index -> its MIG devices, from `nvidia-smi -L` (R470+: "  MIG 1g.10gb Device 0: (UUID: MIG-...)"):
    [{"uuid", "profile", "name"}] in slot order. The fallback's view of MIG when NVML is missing."""
    out, gpu = {}, None
    for line in text.splitlines():
        m = _L_GPU.match(line)
        if m:
            gpu = int(m.group(1))
            continue
        m = _L_MIG.match(line)
        if m and gpu is not None:
            out.setdefault(gpu, []).append({"uuid": m.group(3), "profile": m.group(1), "name": "MIG " + m.group(1)})
    return out


def probe_nvidia_smi():
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        # the parent's hard limit bounds this whole probe; nvidia-smi dies with us if we are killed for it
        out = subprocess.run([exe, "--query-gpu=" + _QUERY, "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=60, preexec_fn=child_setup(False))
    except (OSError, subprocess.TimeoutExpired) as e:
        return {"source": None, "error": str(e), "devices": []}
    if out.returncode != 0:
        return {"source": None, "error": (out.stderr or out.stdout).strip()[:500], "devices": []}

    def num(v, cast=float):
        v = v.strip()
        try:
            return cast(float(v)) if cast is int else cast(v)
        except ValueError:
            return None

    devices = []
    for line in out.stdout.splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) < 9:
            continue
        devices.append({
            "index": num(f[0], int), "uuid": f[1], "name": f[2], "pci_bus_id": f[3],
            "memory_total_mib": num(f[4], int), "memory_used_mib": num(f[5], int),
            "utilization_gpu": num(f[6]), "temperature_c": num(f[7]), "power_w": num(f[8]),
            "numa_node": pci_numa_node(f[3]),
            # "Enabled" on a GPU in MIG mode; "Disabled" or "[N/A]" (no MIG) otherwise
            "mig_mode_current": len(f) > 9 and f[9].lower() == "enabled",
        })
    if any(d["mig_mode_current"] for d in devices):
        # a GPU in MIG mode is its instances (the controller never hands it out whole): `-L` lists them
        try:
            listing = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=60,
                                     preexec_fn=child_setup(False))
            migs = mig_listing(listing.stdout) if listing.returncode == 0 else {}
        except (OSError, subprocess.TimeoutExpired):
            migs = {}
        for d in devices:
            if d["mig_mode_current"]:
                d["mig_devices"] = migs.get(d["index"], [])
    topo = None
    try:
        t = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=60,
                           preexec_fn=child_setup(False))
        if t.returncode == 0:
            topo = t.stdout
    except (OSError, subprocess.TimeoutExpired):
        pass
    return {"source": "nvidia-smi", "devices": devices, "topo_matrix": topo}


def probe_gpus():
    """GPU discovery in this process (what the `_probe_gpus` child runs): NVML, else nvidia-smi; where they
    find no GPU, AMD's amd-smi, else rocm-smi (hsched/node/amd.py)."""
    gpus = probe_nvml()
    if not gpus or not gpus.get("devices"):
        smi = probe_nvidia_smi()
        if smi is not None and (smi.get("devices") or not gpus):
            gpus = smi
    if not gpus or not gpus.get("devices"):
        amd = probe_amd()
        if amd is not None and (amd["devices"] or not (gpus and gpus.get("source"))):
            for dev in amd["devices"]:
                if dev.get("numa_node") is None:
                    dev["numa_node"] = pci_numa_node(dev.get("pci_bus_id"))
            gpus = amd
    return gpus or {"source": None, "devices": []}


def _gpu_tools():
    """Whether this machine has anything to discover GPUs with (no child process is started otherwise)."""
    if shutil.which("nvidia-smi") or amd_tools():
        return True
    try:
        import importlib.util

        return importlib.util.find_spec("pynvml") is not None
    except (ImportError, ValueError):
        return False


def probe_gpus_bounded(timeout_s):
    """GPU discovery in a child process killed after timeout_s: a hung driver or nvidia-smi costs a bounded
    wait and an error in the reply, never a probe that does not answer."""
    if not _gpu_tools():
        return {"source": None, "devices": []}
    r = run_bounded([sys.executable, ENTRY, "_probe_gpus"], timeout_s, "GPU probe")
    if r["error"] is None:
        try:
            gpus = json.loads(r["out"].decode("utf-8", "replace").strip().splitlines()[-1])
            if isinstance(gpus, dict):
                gpus.setdefault("source", None)
                gpus.setdefault("devices", [])
                return gpus
        except (ValueError, IndexError):
            pass
        r["error"] = "GPU probe failed (exit status %s): %s" % (r["rc"], r["err"] or "no output")
    return {"source": None, "devices": [], "error": r["error"]}


def probe(req):
    import platform
    import socket

    timeout_s = max(0.1, float(req.get("gpu_timeout_s") or 10.0))
    # a node with a discovery plugin is described by it alone (hsched/node/plugin.py)
    gpus = run_plugin(req["discover"], timeout_s) if isinstance(req.get("discover"), str) else \
        probe_gpus_bounded(timeout_s)
    try:
        # the network adapters and which GPUs are PCIe-near them (sysfs reads only: nothing can hang)
        nics = probe_nics([d for d in gpus.get("devices") or [] if isinstance(d, dict)])
    except Exception:  # a probe reports what it could: an odd sysfs costs the NICs, never the node
        nics = []
    return {
        "helper_version": HELPER_VERSION,
        "hostname": socket.gethostname(),
        "boot_id": boot_id(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "memory_total_mib": memory_total_mib(),
        "numa": numa_nodes(),
        "gpus": gpus,
        "nics": nics,
        "loadavg": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
