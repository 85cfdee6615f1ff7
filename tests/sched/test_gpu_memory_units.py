"""A GPU memory refusal speaks the units `--gpu-memory` is read in (issue 15): vendors' decimal GB, so the largest
GPU of an H100 80GB fleet reads 85.5 GB, not "79.6G" beside a refused 80G that in fact fits it."""

from __future__ import annotations

import pytest

from hsched.config import SimulatedDevices, parse_gpu_memory_mib
from hsched.model import Node, NodeState, Resources
from hsched.sched.live import unsatisfiable
from hsched.simulated import simulated_devices

H100 = "NVIDIA H100 80GB HBM3"


def _fleet() -> list[Node]:
    devices, links = simulated_devices("n0", SimulatedDevices(model=H100, count=8, topology="nvswitch"))
    return [Node("n0", "fake", NodeState.UP, cpus=64, memory_total_mib=1 << 20, devices=devices, links=links)]


def test_the_fleet_is_what_the_message_says() -> None:
    # (the message below is only as good as this: an H100 80GB holds 81,559 MiB, as nvidia-smi reports)
    assert {d.memory_total_mib for n in _fleet() for d in n.devices} == {81559}


@pytest.mark.parametrize(("asked", "says"), [
    ("100G", "no GPU has 100 GB of memory (largest: 85.5 GB); lower --gpu-memory"),
    ("80GiB", "no GPU has 85.9 GB of memory (largest: 85.5 GB); lower --gpu-memory"),
    ("2T", "no GPU has 2 TB of memory (largest: 85.5 GB); lower --gpu-memory"),
])
def test_a_gpu_memory_refusal_speaks_decimal_gb_as_requests_are_read(asked: str, says: str) -> None:
    why = unsatisfiable(Resources(gpus=1, gpu_memory_mib=parse_gpu_memory_mib(asked)), _fleet())
    assert why == says


@pytest.mark.parametrize("asked", ["80G", "80GB", "85G", "79GiB"])
def test_what_the_largest_gpu_is_said_to_hold_fits(asked: str) -> None:
    # whatever is no more than the "largest" the message names is not refused for memory
    assert unsatisfiable(Resources(gpus=1, gpu_memory_mib=parse_gpu_memory_mib(asked)), _fleet()) is None
