"""Fragmentation (issue 14, item 6): one-GPU jobs leave large NVLink domains whole for the jobs that need them.

The demo lab's shape (examples/lab/fleet.toml: an 8-GPU NVSwitch H100 box, a 4-GPU PCIe A100 box, two 2-GPU
workstations). Before, a one-GPU job went to the NVLink server first (best_fit_key ranks NVLink first for every
job) and backfill took nodes in fleet order, so four of them landed on the 8-GPU box while eight GPUs sat idle
elsewhere, and an 8-GPU job then waited. Pure: hsched.sched.live.schedule, one round per arrival."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from hsched.config import SimulatedDevices
from hsched.model import Job, JobSpec, JobState, Node, NodeState, Resources
from hsched.sched.live import FleetView, Launch, Running, Wait, schedule
from hsched.simulated import simulated_devices

DEMO = (("dgx-h100", "NVIDIA H100 80GB HBM3", 8, "nvswitch"), ("a100-box", "NVIDIA A100-PCIE-40GB", 4, "pcie"),
        ("ws-4090", "NVIDIA GeForce RTX 4090", 2, "pcie"), ("ws-l40s", "NVIDIA L40S", 2, "pcie"))
"""The demo lab's nodes: name, model, GPUs, topology."""


def nodes(shape: Sequence[tuple[str, str, int, str]] = DEMO) -> list[Node]:
    out = []
    for name, model, count, topology in shape:
        devices, links = simulated_devices(name, SimulatedDevices(model=model, count=count, topology=topology))
        out.append(Node(name, "fake", NodeState.UP, cpus=112, devices=devices, links=links))
    return out


def job(i: int, gpus: int = 1, limit: float | None = None) -> Job:
    return Job(i, JobSpec(command=("train.py",), resources=Resources(gpus=gpus), time_limit_s=limit), "alice",
               JobState.PENDING, "", float(i))


def view(fleet: Sequence[Node], runs: Sequence[Running], policy: str | None,
         ends: dict[int, float] | None = None) -> FleetView:
    return FleetView(tuple(fleet), frozenset(u for r in runs for u in r.devices), {}, tuple(runs), policy=policy,
                     ends=ends or {})


def land(fleet: Sequence[Node], n: int, policy: str | None) -> list[Running]:
    """`n` one-GPU jobs arriving one by one, each in a round of its own, all still running."""
    runs: list[Running] = []
    for i in range(1, n + 1):
        d = schedule(view(fleet, runs, policy), [job(i)], float(i))[0]
        assert isinstance(d, Launch)
        runs.append(Running(replace(job(i), state=JobState.RUNNING, placement=d.placements), float(i)))
    return runs


def eight_gpu_starts(fleet: Sequence[Node], n: int, policy: str | None) -> int:
    """How many 8-GPU jobs (NVLink or not: one node) start at once after `n` one-GPU jobs landed."""
    runs = land(fleet, n, policy)
    queue = [job(100 + k, gpus=8) for k in range(2)]
    return sum(isinstance(d, Launch) for d in schedule(view(fleet, runs, policy), queue, 100.0))


def test_one_gpu_jobs_fill_the_small_nodes_before_the_nvswitch_box_without_a_policy() -> None:
    fleet = nodes()
    runs = land(fleet, 4, None)
    # best fit: the 2-GPU workstations first (before: all four on dgx-h100, the first node of the fleet file)
    assert sorted(p.node for r in runs for p in r.job.placement) == ["ws-4090"] * 2 + ["ws-l40s"] * 2
    assert eight_gpu_starts(fleet, 4, None) == 1
    # eight land outside it; the ninth has nowhere else to go
    assert eight_gpu_starts(fleet, 8, None) == 1
    assert eight_gpu_starts(fleet, 9, None) == 0


def test_within_the_policys_gpu_type_a_one_gpu_job_leaves_the_nvswitch_box_whole() -> None:
    # the hsched policy picks the GPU type (H100, the fastest, for every job here); among H100 nodes a one-GPU job
    # now takes the PCIe box before the NVSwitch one (before: NVLink servers first, for every job)
    shape = (("dgx-h100", "NVIDIA H100 80GB HBM3", 8, "nvswitch"), ("h100-pcie", "NVIDIA H100 80GB HBM3", 4, "pcie"))
    fleet = nodes(shape)
    runs = land(fleet, 4, "hsched")
    assert {p.node for r in runs for p in r.job.placement} == {"h100-pcie"}
    assert eight_gpu_starts(fleet, 4, "hsched") == 1
    # a gang still goes to NVLink first
    d = schedule(view(fleet, [], "hsched"), [job(1, gpus=2)], 0.0)[0]
    assert isinstance(d, Launch) and d.placements[0].node == "dgx-h100"


@pytest.mark.parametrize("policy", ("hsched", None))
def test_a_waiting_8_gpu_job_keeps_the_stream_of_one_gpu_jobs_off_its_box(policy: str | None) -> None:
    # four one-GPU jobs on the NVSwitch box end at 1,000 s; the 8-GPU job waits for them with the box reserved,
    # so one-GPU jobs that arrive later go elsewhere (before, under hsched: onto the box's free four, and the
    # 8-GPU job waited as long as the stream went on)
    fleet = nodes()
    box = fleet[0]
    runs = [Running(replace(job(i, limit=1000.0), state=JobState.RUNNING, placement=(
        replace(p, node=box.name),)), 0.0) for i, p in enumerate(
        (_placement(box, k) for k in range(4)), start=1)]
    ends = {r.id: 1000.0 for r in runs}
    queue = [job(50, gpus=8)] + [job(60 + k) for k in range(8)] + [job(80, limit=600.0)]
    got = {d.job_id: d for d in schedule(view(fleet, runs, policy, ends), queue, 100.0)}
    gang = got[50]
    assert isinstance(gang, Wait) and gang.reason.startswith("Resources (reserved on dgx-h100 from ")
    on_box = [i for i, d in got.items() if isinstance(d, Launch) and d.placements[0].node == box.name]
    # only the job whose time limit ends it (at 700 s) before the reservation (1,000 s) may use the box
    assert set(on_box) <= {80}
    assert sum(isinstance(d, Launch) for d in got.values()) == 9  # the other 8 GPUs, and the short job


def _placement(node: Node, k: int):  # type: ignore[no-untyped-def]
    from hsched.model import Placement

    return Placement(node.name, (node.devices[k].uuid,))


if __name__ == "__main__":
    # the figure: 8-GPU jobs that can start after N one-GPU jobs landed, in the demo lab
    for policy in (None, "hsched"):
        print(policy or "no policy", [eight_gpu_starts(nodes(), n, policy) for n in range(0, 13)])
