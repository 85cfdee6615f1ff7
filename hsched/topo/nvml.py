"""Turn `nvml_probe.probe_nvml`'s raw dict into the same Topology the `topo -m` parser produces.

* NV#: count a GPU's active links per remote PCI bus id. A remote that is an NVSwitch (remote type
  "switch", or a bus id that is no GPU of this node and of unknown type: in VMs the switch is often
  invisible, NCCL issue #1182) puts the GPU on the fabric with all its switch links; every pair of fabric
  GPUs is then NV<min(links of the two)> - what `topo -m` prints, a degraded GPU showing the lower number.
* Otherwise the PCIe level from nvmlDeviceGetTopologyCommonAncestor: SINGLE(10) PIX, MULTIPLE(20) PXB,
  HOSTBRIDGE(30) PHB, NODE(40) NODE, SYSTEM(50) SYS; INTERNAL(0, two GPUs on one board) ranks as PIX.
* NUMA node: the memory affinity (the NUMA Affinity column); nvmlDeviceGetNumaNodeId is the GPU's own
  memory node on coherent (Grace) systems and is kept apart as `gpu_numa_id`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from hsched.topo.topology import TopoDevice, TopoLink, Topology, TopologyParseError

ANCESTOR_KINDS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def topology_from_nvml(raw: dict[str, Any]) -> Topology:
    if not isinstance(raw, dict) or not isinstance(raw.get("devices"), list):
        raise TopologyParseError("NVML probe result has no 'devices' list", source="nvml")
    warnings: list[str] = []
    devices: list[TopoDevice] = []
    ok = [d for d in raw["devices"] if isinstance(d, dict) and "error" not in d]
    for d in raw["devices"]:
        if d not in ok:
            warnings.append(f"GPU{d.get('index')}: {d.get('error', 'unreadable')}")
    for d in ok:
        aff = d.get("numa_affinity") or []
        total = d.get("memory_total")
        devices.append(
            TopoDevice(
                name=f"GPU{d['index']}",
                index=int(d["index"]),
                uuid=d.get("uuid"),
                model=d.get("name"),
                pci_bus_id=d.get("pci_bus_id"),
                numa_node=aff[0] if aff else None,
                numa_nodes=tuple(aff),
                cpu_affinity=tuple(d.get("cpu_affinity") or ()),
                gpu_numa_id=d.get("numa_node_id"),
                memory_mib=int(total) // (1 << 20) if isinstance(total, int) else None,
                compute_capability=d.get("compute_capability"),
            )
        )
    by_bus = {d.get("pci_bus_id"): int(d["index"]) for d in ok if d.get("pci_bus_id")}

    direct: dict[int, Counter[int]] = {}
    fabric: dict[int, int] = {}
    for d in ok:
        i = int(d["index"])
        peers: Counter[int] = Counter()
        switch_links = 0
        for lk in d.get("nvlinks") or []:
            if not lk.get("active"):
                continue
            bus, rtype = lk.get("remote_bus_id"), lk.get("remote_type")
            if rtype == "switch" or (bus not in by_bus and rtype in (None, "unknown") and bus is not None):
                switch_links += 1
            elif bus in by_bus:
                peers[by_bus[bus]] += 1
        direct[i] = peers
        if switch_links:
            fabric[i] = switch_links

    anc = {(int(p["a"]), int(p["b"])): p.get("common_ancestor") for p in raw.get("pairs") or []}
    links: list[TopoLink] = []
    idx = sorted(int(d["index"]) for d in ok)
    for x, i in enumerate(idx):
        for j in idx[x + 1 :]:
            n = 0
            if i in fabric and j in fabric:
                n = min(fabric[i], fabric[j])
            else:
                # both ends report the same links; take the larger count in case one side could not say
                n = max(direct[i][j], direct[j][i])
            if n:
                links.append(TopoLink(f"GPU{i}", f"GPU{j}", f"NV{n}"))
                continue
            level = anc.get((i, j), anc.get((j, i)))
            if level is None:
                warnings.append(f"GPU{i}-GPU{j}: no NVLink and no PCIe level: link unknown")
                continue
            kind = ANCESTOR_KINDS.get(int(level))
            if kind is None:
                warnings.append(f"GPU{i}-GPU{j}: unknown topology level {level}")
                continue
            links.append(TopoLink(f"GPU{i}", f"GPU{j}", kind))
    return Topology(
        devices=tuple(devices),
        links=tuple(links),
        partial=len(ok) < len(raw["devices"]),
        warnings=tuple(warnings),
        source_format="nvml",
    )
