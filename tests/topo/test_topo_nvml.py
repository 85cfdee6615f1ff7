"""NVML discovery against a fake pynvml fed from captured data (the H100 SXM topo -m + nvidia-smi -q
captures, and the DGX-1 direct mesh), and the pure converter to a Topology."""

from __future__ import annotations

import ast
import itertools
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from captures import capture

from hsched.topo import nvml_probe
from hsched.topo.nvml import topology_from_nvml
from hsched.topo.parse import parse_capture, parse_topology
from hsched.topo.topology import TopologyParseError


class NVMLError(Exception):
    pass


class FakeNVML:
    """Just enough of pynvml's surface; unsupported calls raise NVMLError as the real one does."""

    NVMLError = NVMLError
    NVML_TEMPERATURE_GPU = 0
    NVML_P2P_CAPS_INDEX_READ = 0
    NVML_P2P_CAPS_INDEX_NVLINK = 2
    NVML_NVLINK_MAX_LINKS = 18
    NVML_AFFINITY_SCOPE_NODE = 0

    def __init__(
        self,
        gpus: list[dict],
        links: dict[int, list[tuple[str, int]]],
        ancestors: dict,
        *,
        fail_init: bool = False,
        cpus: int = 224,
    ) -> None:
        self.gpus, self.links, self.ancestors, self.fail_init, self.cpus = gpus, links, ancestors, fail_init, cpus
        self.shut = False

    def nvmlInit(self):
        if self.fail_init:
            raise NVMLError("Driver Not Loaded")

    def nvmlShutdown(self):
        self.shut = True

    def nvmlSystemGetDriverVersion(self):
        return b"565.57.01"

    def nvmlSystemGetCudaDriverVersion(self):
        return 12070

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        if self.gpus[i].get("lost"):
            raise NVMLError("GPU is lost")
        return i

    def nvmlDeviceGetIndex(self, h):
        return h

    def nvmlDeviceGetUUID(self, h):
        return self.gpus[h]["uuid"]

    def nvmlDeviceGetName(self, h):
        return self.gpus[h]["name"].encode()

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=self.gpus[h]["bus"].encode())

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=self.gpus[h]["mib"] << 20, used=1 << 20, free=0)

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=7, memory=0)

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 30

    def nvmlDeviceGetPowerUsage(self, h):
        return 100890  # milliwatts

    def nvmlDeviceGetCudaComputeCapability(self, h):
        return (9, 0)

    def nvmlDeviceGetNumaNodeId(self, h):
        raise NVMLError("Not Supported")  # x86: the GPU's memory is no NUMA node

    def nvmlDeviceGetCpuAffinity(self, h, words):
        mask = [0] * words
        for c in self.gpus[h]["cpus"]:
            mask[c // 64] |= 1 << (c % 64)
        return mask

    def nvmlDeviceGetMemoryAffinity(self, h, words, scope):
        return [1 << self.gpus[h]["numa"]]

    def nvmlDeviceGetMigMode(self, h):
        return [0, 0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return 5

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return 16

    def nvmlDeviceGetNvLinkState(self, h, link):
        peers = self.links.get(h, [])
        if link >= self.NVML_NVLINK_MAX_LINKS:
            raise NVMLError("Invalid Argument")
        if not peers:
            raise NVMLError("Not Supported")
        return 1 if link < len(peers) and peers[link][1] != -1 else 0

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return SimpleNamespace(busId=self.links[h][link][0])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        t = self.links[h][link][1]
        if t is None:
            raise NVMLError("Not Supported")
        return t

    def nvmlDeviceGetNvLinkVersion(self, h, link):
        return 6

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        return self.ancestors[(min(a, b), max(a, b))]

    def nvmlDeviceGetP2PStatus(self, a, b, idx):
        return 0


def h100_fake(degrade: int | None = None, switch_type: int | None = 2) -> FakeNVML:
    """8x H100 SXM from the nvidia-smi -q capture (names, UUIDs, bus ids, memory) and the topo -m capture
    (NUMA, CPU affinity); each GPU's 18 links go to four NVSwitches."""
    inv = parse_capture(capture("nvidia-smi-q__h100-sxm-x8.txt"))
    topo = parse_topology(capture("nvidia-smi-topo__h100-sxm-8gpu-11nic-ansi.txt"))
    gpus = [
        {
            "uuid": g.uuid,
            "name": g.name,
            "bus": g.pci_bus_id.upper(),
            "mib": g.memory_total_mib,
            "cpus": d.cpu_affinity,
            "numa": d.numa_node,
        }
        for g, d in zip(inv.gpus, topo.devices, strict=True)
    ]
    links = {i: [(f"00000008:0{link % 4}:00.0", switch_type) for link in range(18)] for i in range(8)}
    if degrade is not None:
        links[degrade] = [(b, t if n < 16 else -1) for n, (b, t) in enumerate(links[degrade])]
    anc = {(i, j): 40 if gpus[i]["numa"] == gpus[j]["numa"] else 50 for i, j in itertools.combinations(range(8), 2)}
    return FakeNVML(gpus, links, anc)


def test_probe_h100_sxm():
    fake = h100_fake()
    raw = nvml_probe.probe_nvml(fake, cpu_count=224)
    json.dumps(raw)  # JSON-able
    assert fake.shut and raw["driver_version"] == "565.57.01" and raw["nvml_version"] is None
    assert any("nvmlSystemGetNVMLVersion" in e for e in raw["errors"])
    d0 = raw["devices"][0]
    assert d0["uuid"] == "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1" and d0["name"] == "NVIDIA H100 80GB HBM3"
    assert d0["pci_bus_id"] == "0000:18:00.0" and d0["memory_total"] == 81559 << 20
    assert d0["power_w"] == pytest.approx(100.89) and d0["numa_node_id"] is None and d0["numa_affinity"] == [0]
    assert d0["cpu_affinity"][:2] == [0, 1] and len(d0["cpu_affinity"]) == 112 and d0["compute_capability"] == "9.0"
    assert d0["mig_mode_current"] is False and d0["mig_devices"] is None and d0["fabric_clique"] is None
    assert len(d0["nvlinks"]) == 18 and all(lk["remote_type"] == "switch" for lk in d0["nvlinks"])
    assert len(raw["pairs"]) == 28 and raw["pairs"][0]["common_ancestor"] == 40

    t = topology_from_nvml(raw)
    expected = parse_topology(capture("nvidia-smi-topo__h100-sxm-8gpu-11nic-ansi.txt"))
    assert {(lk.a, lk.b, lk.kind) for lk in t.links} == {(lk.a, lk.b, lk.kind) for lk in expected.device_links()}
    assert [d.numa_node for d in t.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert t.devices[0].cpu_affinity == expected.devices[0].cpu_affinity and t.devices[0].memory_mib == 81559


def test_degraded_gpu_and_invisible_switch():
    t = topology_from_nvml(nvml_probe.probe_nvml(h100_fake(degrade=3), cpu_count=224))
    assert t.link("GPU3", "GPU5").kind == "NV16" and t.link("GPU0", "GPU5").kind == "NV18"
    vm = topology_from_nvml(nvml_probe.probe_nvml(h100_fake(switch_type=None), cpu_count=224))
    assert {lk.kind for lk in vm.links} == {"NV18"}


def test_dgx1_direct_mesh_matches_topo_m():
    expected = parse_topology(capture("nvidia-smi-topo__dgx1-v100-4nic-oldlegend.txt"))
    buses = [f"00000000:{0x10 + i:02X}:00.0" for i in range(8)]
    links: dict[int, list] = {i: [] for i in range(8)}
    anc = {}
    for lk in expected.device_links():
        i, j = int(lk.a[3:]), int(lk.b[3:])
        if lk.kind.startswith("NV"):
            n = int(lk.kind[2:])
            links[i] += [(buses[j], 0)] * n
            links[j] += [(buses[i], 0)] * n
            anc[(i, j)] = 30
        else:
            anc[(i, j)] = 50
    gpus = [
        {
            "uuid": f"GPU-{i}",
            "name": "Tesla V100-SXM2-16GB",
            "bus": buses[i],
            "mib": 16160,
            "cpus": d.cpu_affinity,
            "numa": 0 if i < 4 else 1,
        }
        for i, d in enumerate(expected.devices)
    ]
    fake = FakeNVML(gpus, links, anc, cpus=80)
    t = topology_from_nvml(nvml_probe.probe_nvml(fake, cpu_count=80, max_links=6))
    assert {(lk.a, lk.b, lk.kind) for lk in t.links} == {(lk.a, lk.b, lk.kind) for lk in expected.device_links()}


def test_probe_survives_no_driver_and_lost_gpus():
    raw = nvml_probe.probe_nvml(FakeNVML([], {}, {}, fail_init=True))
    assert raw["devices"] == [] and "Driver Not Loaded" in raw["errors"][0]
    fake = h100_fake()
    fake.gpus[7]["lost"] = True
    raw = nvml_probe.probe_nvml(fake, cpu_count=224)
    t = topology_from_nvml(raw)
    assert len(t.devices) == 7 and t.partial and "GPU7" in t.warnings[0]
    # a PCIe-only GPU: NVLink "not supported" leaves an empty list and no NV links
    fake = h100_fake()
    fake.links = {}
    t = topology_from_nvml(nvml_probe.probe_nvml(fake, cpu_count=224))
    assert t.link("GPU0", "GPU1").kind == "NODE" and t.link("GPU0", "GPU4").kind == "SYS"
    with pytest.raises(TopologyParseError):
        topology_from_nvml({"nope": 1})


def test_nvml_probe_is_stdlib_only_and_python38():
    src = Path(nvml_probe.__file__).read_text()
    tree = ast.parse(src, feature_version=(3, 8))
    mods = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert mods <= {"__future__", "os", "re", "json", "pynvml"}
    assert "match " not in src and "removeprefix" not in src
