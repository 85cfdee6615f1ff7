"""Simulated devices look like their model (issue 19): power within the board's limit, CPUs from the node."""

from __future__ import annotations

import pytest

from hsched.config import SimulatedDevices
from hsched.simulated import simulated_devices, simulated_telemetry
from tests.conftest import FIXTURES


@pytest.mark.parametrize(("model", "tdp"), [("NVIDIA L4", 72), ("NVIDIA A100-PCIE-40GB", 250),
                                            ("NVIDIA H100 80GB HBM3", 700), ("Some Future GPU", 300)])
def test_power_follows_the_models_board_power(model: str, tdp: float) -> None:
    devices, _ = simulated_devices("n", SimulatedDevices(model, 4))
    busy = {devices[0].uuid, devices[1].uuid}
    for t in range(0, 600, 7):
        readings = simulated_telemetry(devices, busy, float(t))
        for d in readings:
            assert d.power_w is not None and 0 < d.power_w <= tdp
            assert d.temperature_c is not None and 25 < d.temperature_c < 85
        idle, working = readings[3], readings[0]
        assert idle.power_w is not None and working.power_w is not None and idle.power_w < working.power_w


def test_a_small_card_and_a_big_one_differ() -> None:
    small, _ = simulated_devices("s", SimulatedDevices("NVIDIA L4", 1))
    big, _ = simulated_devices("b", SimulatedDevices("NVIDIA H100 80GB HBM3", 1))
    s = simulated_telemetry(small, {small[0].uuid}, 100.0)[0]
    b = simulated_telemetry(big, {big[0].uuid}, 100.0)[0]
    assert s.power_w is not None and b.power_w is not None and b.power_w > 5 * s.power_w


@pytest.mark.parametrize("topology", ["nvswitch", None])
def test_cpu_affinity_covers_the_nodes_declared_cpus(topology: str | None) -> None:
    sim = SimulatedDevices("NVIDIA H100 80GB HBM3", 8, topology=topology, numa_nodes=2, cpus=112)
    devices, _ = simulated_devices("dgx-h100", sim)
    cpus = set().union(*(set(d.cpu_affinity) for d in devices))
    assert cpus == set(range(112))
    # each GPU is local to its own NUMA node's half
    assert {len(d.cpu_affinity) for d in devices} == {56}
    assert set(devices[0].cpu_affinity).isdisjoint(devices[7].cpu_affinity)


def test_a_captured_topology_without_cpus_gets_the_nodes_declared_cpus() -> None:
    # amd-smi topology names no NUMA node and no CPU: the node's 192 declared CPUs, split over its 2 NUMA nodes
    amd = str(FIXTURES / "topo" / "amd-smi-topology__mi300x-8gpu.txt")
    devices, links = simulated_devices("mi300x", SimulatedDevices("AMD Instinct MI300X", 8, topology=amd, numa_nodes=2,
                                                                  cpus=192))
    assert links and [d.numa_node for d in devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert set().union(*(set(d.cpu_affinity) for d in devices)) == set(range(192))
    assert devices[0].cpu_affinity == tuple(range(96)) and devices[7].cpu_affinity == tuple(range(96, 192))
    # rocm-smi --showtoponuma names 8 NUMA nodes (NPS4) but no CPUs: each GPU gets its own node's 24
    nps4 = str(FIXTURES / "topo" / "rocm-smi-showtoponuma__mi210-x8-nps4.txt")
    devices, _ = simulated_devices("mi210", SimulatedDevices("AMD Instinct MI210", 8, topology=nps4, numa_nodes=2,
                                                             cpus=192))
    assert [(d.numa_node, d.cpu_affinity[0], len(d.cpu_affinity)) for d in devices[:4]] == [
        (3, 72, 24), (2, 48, 24), (1, 24, 24), (0, 0, 24)]
    # a capture that names the CPUs keeps them
    h100 = str(FIXTURES / "topo" / "nvidia-smi-topo__h100-sxm-8gpu-nv18-2numa-narrow.txt")
    devices, _ = simulated_devices("h", SimulatedDevices("NVIDIA H100 80GB HBM3", 8, topology=h100, numa_nodes=2,
                                                         cpus=192))
    assert devices[0].cpu_affinity == tuple(range(52))


def test_a_captured_topology_saved_in_utf16_is_read(tmp_path) -> None:
    # PowerShell 5's `nvidia-smi topo -m > topo.txt` writes UTF-16: read as `hsched topo parse` reads it
    text = (FIXTURES / "topo" / "nvidia-smi-topo__h100-sxm-8gpu-nv18-2numa-narrow.txt").read_text()
    f = tmp_path / "topo.txt"
    f.write_bytes(text.encode("utf-16"))
    devices, links = simulated_devices("h", SimulatedDevices("NVIDIA H100 80GB HBM3", 8, topology=str(f)))
    assert len(devices) == 8 and {lk.kind for lk in links} == {"NV18"}
