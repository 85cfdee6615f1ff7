"""Simulated devices look like their model (issue 19): power within the board's limit, CPUs from the node."""

from __future__ import annotations

import pytest

from hsched.config import SimulatedDevices
from hsched.simulated import simulated_devices, simulated_telemetry


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
