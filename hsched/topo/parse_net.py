"""The network adapters as `ibstat` and `ibv_devinfo` print them, and which GPUs are PCIe-near each NIC from the NIC
columns of `nvidia-smi topo -m` (issue 32). The node probe reads the same facts from sysfs (hsched/node/nics.py);
these read captures (`hsched topo`, tests) and fill in what sysfs cannot say. Tolerant of partial output: ibstat
stops at the first device it cannot stat, and a capture may be cut short."""

from __future__ import annotations

import re

from hsched.model import Nic, NicKind
from hsched.topo.topology import Topology

NEAR_KINDS = frozenset({"PIX", "PXB"})
"""`nvidia-smi topo -m` cells for a GPU and NIC under one PCIe switch chain (no host bridge crossed): GPUDirect
RDMA's good case. PHB/NODE/SYS cross the CPU."""


def _kind(layer: str) -> NicKind:
    return NicKind.ROCE if layer.strip().lower() == "ethernet" else NicKind.IB


def parse_ibstat(text: str) -> list[Nic]:
    """`ibstat`: one NIC per CA's first port (name, state Active, Rate in Gb/s, Link layer: InfiniBand or
    Ethernet, the latter RoCE). A CA cut off before its port says nothing usable and is left out."""
    out: list[Nic] = []
    name: str | None = None
    port: dict[str, str] = {}
    in_port = False

    def flush() -> None:
        if name is not None and "rate" in port:
            try:
                rate = float(port["rate"])
            except ValueError:
                return
            out.append(Nic(name=name, kind=_kind(port.get("link layer", "InfiniBand")), rate_gbps=rate,
                           active=port.get("state", "").lower() == "active"))

    for raw in text.splitlines():
        line = raw.strip()
        m = re.match(r"^CA '([^']+)'$", line)
        if m:
            flush()
            name, port, in_port = m.group(1), {}, False
            continue
        if name is None:
            continue
        if re.match(r"^Port \d+:$", line):
            if in_port:  # a second port: the first is the one counted
                flush()
                name = None
                continue
            in_port = True
            continue
        if in_port and ":" in line:
            k, _, v = line.partition(":")
            port[k.strip().lower()] = v.strip()
    flush()
    return out


def parse_ibv_devinfo(text: str) -> list[Nic]:
    """`ibv_devinfo`: one NIC per hca_id's first port (state PORT_ACTIVE, link_layer). It prints no rate (that is
    `-v`'s active_width x active_speed): rate_gbps is 0 unless `-v`'s lines are there."""
    out: list[Nic] = []
    cur: dict[str, str] = {}

    def flush() -> None:
        if "hca_id" in cur and "state" in cur:
            out.append(Nic(name=cur["hca_id"], kind=_kind(cur.get("link_layer", "InfiniBand")),
                           rate_gbps=_verbose_rate(cur), active=cur["state"].startswith("PORT_ACTIVE")))

    ports = 0
    for raw in text.splitlines():
        line = raw.strip()
        k, sep, v = line.partition(":")
        if not sep:
            continue
        k, v = k.strip(), v.strip()
        if k == "hca_id":
            flush()
            cur, ports = {"hca_id": v}, 0
        elif k == "port":
            ports += 1
        elif ports == 1 and k in ("state", "link_layer", "active_width", "active_speed"):
            cur[k] = v
    flush()
    return out


def _verbose_rate(cur: dict[str, str]) -> float:
    """active_width "4X (2)" x active_speed "25.0 Gbps (32)" -> 100."""
    w = re.match(r"^(\d+)X", cur.get("active_width", ""))
    s = re.match(r"^([0-9.]+)\s*Gbps", cur.get("active_speed", ""))
    return float(w.group(1)) * float(s.group(1)) if w and s else 0.0


def nics_near(topo: Topology) -> dict[str, tuple[int, ...]]:
    """RDMA device name (the NIC legend's mlx5_N, or the column head on old drivers) -> the indices of the GPUs
    PCIe-near it (PIX/PXB), from a parsed `nvidia-smi topo -m`."""
    index = {d.name: d.index for d in topo.devices}
    name = {x.name: x.device or x.name for x in topo.nics}
    out: dict[str, list[int]] = {v: [] for v in name.values()}
    for lk in topo.links:
        for nic, gpu in ((lk.a, lk.b), (lk.b, lk.a)):
            if nic in name and gpu in index and lk.kind.upper() in NEAR_KINDS:
                out[name[nic]].append(index[gpu])
    return {k: tuple(sorted(set(v))) for k, v in out.items()}
