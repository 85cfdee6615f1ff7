"""The node's network adapters from sysfs (issue 32): what `ibstat` prints of each RDMA device's ports (state, rate,
link layer) from /sys/class/infiniband, the plain Ethernet interfaces from /sys/class/net, and which GPUs are
PCIe-near each (they share a PCIe root port or switch: nvidia-smi's PIX/PXB, where GPUDirect RDMA reaches them
without crossing the CPU). Standard library only, Python 3.8: this runs on the node."""

import os
import re

_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")


def _read(path):
    try:
        with open(path) as f:
            return f.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _listdir(path):
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def _pci_path(sys_root, link):
    """The device's place in the PCI tree: its resolved sysfs path's parts from the `pciDDDD:BB` host bridge on."""
    try:
        real = os.path.realpath(link)
    except OSError:
        return None
    parts = real.split(os.sep)
    for i, p in enumerate(parts):
        if p.startswith("pci") and ":" in p:
            return parts[i:]
    return None


def _near(a, b):
    """Two devices are PCIe-near when their paths share the host bridge and at least the root port below it."""
    if not a or not b:
        return False
    common = 0
    for i in range(min(len(a), len(b)) - 1):
        if a[i] != b[i]:
            break
        common += 1
    return common >= 2


def _gpu_paths(sys_root, gpus):
    out = []
    for d in gpus:
        bid = (d.get("pci_bus_id") or "").lower()
        if not bid or d.get("index") is None:
            continue
        if len(bid.split(":")[0]) == 8:
            bid = bid[4:]  # nvidia-smi's 00000000:1B:00.0 -> sysfs's 0000:1b:00.0
        path = _pci_path(sys_root, os.path.join(sys_root, "bus", "pci", "devices", bid))
        if path:
            out.append((int(d["index"]), path))
    return out


def probe_nics(gpus, sys_root="/sys"):
    """The NICs as dicts (name, kind, rate_gbps, active, netdev, near): each RDMA device's first port, and each
    physical Ethernet interface that is no RDMA device's. `gpus`: the probe's GPU records (index, pci_bus_id)."""
    gpu_paths = _gpu_paths(sys_root, gpus)
    out = []
    rdma_netdevs = set()
    ib = os.path.join(sys_root, "class", "infiniband")
    for dev in _listdir(ib):
        ports = _listdir(os.path.join(ib, dev, "ports"))
        if not ports:
            continue
        port = os.path.join(ib, dev, "ports", ports[0])
        m = _RATE.match(_read(os.path.join(port, "rate")) or "")
        layer = (_read(os.path.join(port, "link_layer")) or "").lower()
        state = _read(os.path.join(port, "state")) or ""
        nets = _listdir(os.path.join(ib, dev, "device", "net"))
        rdma_netdevs.update(nets)
        path = _pci_path(sys_root, os.path.join(ib, dev, "device"))
        out.append({
            "name": dev,
            "kind": "roce" if layer == "ethernet" else "ib",
            "rate_gbps": float(m.group(1)) if m else 0.0,
            "active": "ACTIVE" in state.upper(),
            "netdev": nets[0] if nets else None,
            "near": sorted(i for i, p in gpu_paths if _near(path, p)),
        })
    net = os.path.join(sys_root, "class", "net")
    for iface in _listdir(net):
        base = os.path.join(net, iface)
        # physical interfaces only (a bridge, a veth, lo have no `device`); ARPHRD_ETHER (1), not IPoIB (32)
        if iface in rdma_netdevs or not os.path.exists(os.path.join(base, "device")) or \
                _read(os.path.join(base, "type")) != "1":
            continue
        speed = _read(os.path.join(base, "speed"))
        try:
            mbps = int(speed) if speed is not None else -1
        except ValueError:
            mbps = -1
        path = _pci_path(sys_root, os.path.join(base, "device"))
        out.append({
            "name": iface,
            "kind": "ethernet",
            "rate_gbps": mbps / 1000.0 if mbps > 0 else 0.0,
            "active": _read(os.path.join(base, "operstate")) == "up",
            "netdev": iface,
            "near": sorted(i for i, p in gpu_paths if _near(path, p)),
        })
    return out
