"""Link kinds as the tools spell them, how hsched ranks them, and what bandwidth each is worth.

The order is NVIDIA's own (NVML's `nvmlGpuTopologyLevel_t` and the `nvidia-smi topo -m` legend):
X < NV# (more links is better) < PIX < PXB < PHB < NODE < SYS. AMD fabrics are ranked by link type first
and the driver's `weight` second, never by `hops`: rocm-smi reports 1 hop for *any* XGMI pair, even one that
is not directly wired (ROCm/rocm-systems #5763), while the weight grows by 15 per XGMI hop.

Bandwidth table (per link, per direction, GB/s) - sources are listed in shared/topo/README.md:

    NVLink 1 (P100)        20    4 links per GPU
    NVLink 2 (V100)        25    6
    NVLink 3 (A100)        25   12
    NVLink 4 (H100/H200)   25   18
    NVLink 5 (B200/GB200)  50   18
    PCIe gen3 x16       15.75   (8 GT/s, 128b/130b: ~0.985 GB/s per lane)
    PCIe gen4 x16        31.5
    PCIe gen5 x16          63
    XGMI MI250(X)          50   per x16 link
    XGMI MI300X            64   per peer

A pair's first-order weight is `links x per-link rate` for NV#, the slower PCIe end for PIX/PXB, and a fixed
discount for paths through host bridges and the socket interconnect (P2P there is often disabled or slow).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class LinkClass(enum.IntEnum):
    """Coarse class of a connection; a larger value is a *stronger* (closer) link."""

    UNKNOWN = 0
    SYS = 1
    NODE = 2
    PHB = 3
    PXB = 4
    PIX = 5
    FABRIC = 6
    """NVLink (NV#) or AMD XGMI: the accelerator fabric, independent of the PCIe path."""
    SELF = 7


_NV_RE = re.compile(r"^NV(\d+)$")
_PCIE_CLASSES = {
    "SYS": LinkClass.SYS,
    "SOC": LinkClass.SYS,  # K80-era drivers: "socket-level link (e.g. QPI)", no NODE level existed
    "NODE": LinkClass.NODE,
    "PHB": LinkClass.PHB,
    "PXB": LinkClass.PXB,
    "PIX": LinkClass.PIX,
    "X": LinkClass.SELF,
    "SELF": LinkClass.SELF,
}
#: Every matrix cell `nvidia-smi topo -m` may print (NV# is matched by pattern).
PCIE_KINDS = ("PIX", "PXB", "PHB", "NODE", "SYS")


def normalize_kind(kind: str) -> str:
    """Spell a kind the way current tools do: `SOC` -> `SYS`, `xgmi` -> `XGMI`, `PCIE` stays `PCIE`."""
    k = kind.strip().upper()
    if k == "SOC":
        return "SYS"
    return k


def is_valid_kind(kind: str) -> bool:
    k = kind.strip().upper()
    return bool(_NV_RE.match(k)) or k in _PCIE_CLASSES or k in ("XGMI", "PCIE")


def nvlink_count(kind: str) -> int:
    """Number of NVLink links a kind stands for (NV12 -> 12); 0 for anything that is not NV#."""
    m = _NV_RE.match(kind.strip().upper())
    return int(m.group(1)) if m else 0


def link_class(kind: str) -> LinkClass:
    k = kind.strip().upper()
    if _NV_RE.match(k) or k == "XGMI":
        return LinkClass.FABRIC
    if k == "PCIE":
        # AMD tools only say "PCIE"; without the NVIDIA-style path detail it ranks like a host-bridge path,
        # and the weight (see `link_strength`) orders PCIe pairs among themselves.
        return LinkClass.PHB
    return _PCIE_CLASSES.get(k, LinkClass.UNKNOWN)


def link_strength(kind: str | None, weight: int | None = None, links: int | None = None) -> tuple[int, int]:
    """A sortable strength: larger is better. Compares class first, then links (NV#) or -weight (AMD).

    NV18 > NV12 > NV2 > NV1 > PIX > PXB > PHB > NODE > SYS > unknown. For XGMI/PCIE, a lower weight
    (fewer hops through the fabric) is stronger; when the weight is unknown the link count decides.
    """
    if kind is None:
        return (int(LinkClass.UNKNOWN), 0)
    cls = link_class(kind)
    n = nvlink_count(kind)
    if n:
        return (int(cls), n)
    if weight is not None and kind.strip().upper() in ("XGMI", "PCIE"):
        return (int(cls), -weight)
    return (int(cls), links or 0)


def fabric_links(kind: str | None, links: int | None = None) -> int:
    """Links counted by objective (b): the NV# count, or XGMI links (1 per direct XGMI pair if unknown)."""
    if kind is None:
        return 0
    n = nvlink_count(kind)
    if n:
        return n
    if kind.strip().upper() == "XGMI":
        return links if links else 1
    return 0


class NvlinkGen(enum.IntEnum):
    NVLINK1 = 1
    NVLINK2 = 2
    NVLINK3 = 3
    NVLINK4 = 4
    NVLINK5 = 5


#: Per-link, per-direction GB/s for each NVLink generation (table in the module docstring).
NVLINK_GBPS_PER_LINK: dict[NvlinkGen, float] = {
    NvlinkGen.NVLINK1: 20.0,
    NvlinkGen.NVLINK2: 25.0,
    NvlinkGen.NVLINK3: 25.0,
    NvlinkGen.NVLINK4: 25.0,
    NvlinkGen.NVLINK5: 50.0,
}

#: Per-lane, per-direction GB/s for each PCIe generation (after line coding).
PCIE_GBPS_PER_LANE: dict[int, float] = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}

#: Fraction of the PCIe link rate a P2P copy gets on each path class. Host-bridge and cross-socket paths are
#: where P2P is often disabled or bounced through system memory; these are first-order guesses, not specs.
_PCIE_PATH_FACTOR: dict[LinkClass, float] = {
    LinkClass.PIX: 1.0,
    LinkClass.PXB: 0.95,
    LinkClass.PHB: 0.8,
    LinkClass.NODE: 0.6,
    LinkClass.SYS: 0.4,
}

#: Per-peer XGMI GB/s per direction.
XGMI_GBPS = {"mi300": 64.0, "mi325": 64.0, "mi250": 50.0, "mi210": 50.0, "default": 50.0}


@dataclass(frozen=True, slots=True)
class PcieLink:
    gen: int = 4
    width: int = 16

    @property
    def gbps(self) -> float:
        return round(PCIE_GBPS_PER_LANE.get(self.gen, PCIE_GBPS_PER_LANE[4]) * self.width, 2)


def nvlink_generation(model: str | None, links: int = 0) -> NvlinkGen:
    """Guess the NVLink generation from a model name, else from the link count (18 -> gen 4, 12 -> gen 3)."""
    low = (model or "").lower()
    for needle, gen in (
        ("b200", NvlinkGen.NVLINK5),
        ("gb200", NvlinkGen.NVLINK5),
        ("b100", NvlinkGen.NVLINK5),
        ("h100", NvlinkGen.NVLINK4),
        ("h200", NvlinkGen.NVLINK4),
        ("gh200", NvlinkGen.NVLINK4),
        ("h800", NvlinkGen.NVLINK4),
        ("a100", NvlinkGen.NVLINK3),
        ("a800", NvlinkGen.NVLINK3),
        ("a40", NvlinkGen.NVLINK3),
        ("a6000", NvlinkGen.NVLINK3),
        ("3090", NvlinkGen.NVLINK3),
        ("v100", NvlinkGen.NVLINK2),
        ("p100", NvlinkGen.NVLINK1),
    ):
        if needle in low:
            return gen
    if links >= 18:
        return NvlinkGen.NVLINK4
    if links >= 7:
        return NvlinkGen.NVLINK3
    return NvlinkGen.NVLINK2


def estimate_bandwidth_gbps(
    kind: str | None, *, model: str | None = None, pcie: PcieLink | None = None, weight: int | None = None
) -> float | None:
    """First-order per-direction GB/s for one pair, from the table in this module's docstring."""
    if kind is None:
        return None
    k = normalize_kind(kind)
    n = nvlink_count(k)
    if n:
        return n * NVLINK_GBPS_PER_LINK[nvlink_generation(model, n)]
    if k == "XGMI":
        low = (model or "").lower()
        rate = next((v for key, v in XGMI_GBPS.items() if key in low), XGMI_GBPS["default"])
        # weight 15 = one direct hop; a two-hop XGMI route shares links, so halve per extra hop
        hops = max(1, (weight or 15) // 15)
        return rate / hops
    cls = link_class(k)
    if cls == LinkClass.SELF:
        return None
    base = (pcie or PcieLink()).gbps
    if k == "PCIE":
        return round(base * 0.8, 2)
    factor = _PCIE_PATH_FACTOR.get(cls)
    return round(base * factor, 2) if factor is not None else None
