"""The host memory tier (issue 15, item 6): `--mem` is promised per node as CPUs are (two 200G jobs never share a
256G node), and a job that offloads to host memory (`--offload`) goes where each GPU has the most of it."""

from __future__ import annotations

from hsched.config import SimulatedDevices, job_spec_from_table
from hsched.model import Job, JobSpec, JobState, Node, Placement, Resources
from hsched.sched.live import FleetView, Launch, Running, Wait, schedule
from hsched.serialize import spec_from_dict, spec_to_dict
from hsched.simulated import simulated_devices

GIB = 1024


def node(name: str, gpus: int, memory_gib: int) -> Node:
    devices, links = simulated_devices(name, SimulatedDevices(model="NVIDIA A100-SXM4-80GB", count=gpus,
                                                              topology="pcie" if gpus > 1 else None))
    from hsched.model import NodeState

    return Node(name, "fake", NodeState.UP, cpus=64, memory_total_mib=memory_gib * GIB, devices=devices, links=links)


def job(jid: int, *, memory_gib: int | None = None, offload: bool = False, state: JobState = JobState.PENDING,
        where: Placement | None = None) -> Job:
    res = Resources(gpus=1, memory_mib=memory_gib * GIB if memory_gib else None, offload=offload)
    return Job(jid, JobSpec(command=("x",), resources=res), "alice", state, "", float(jid),
               start_time=0.0 if where else None, placement=(where,) if where else ())


def test_host_memory_is_promised_like_cpus() -> None:
    n = node("n", 4, 256)
    for policy in (None, "hsched"):
        got = schedule(FleetView((n,), frozenset(), {}, policy=policy),
                       [job(1, memory_gib=200), job(2, memory_gib=200), job(3, memory_gib=40)], 0.0)
        started = {d.job_id for d in got if isinstance(d, Launch)}
        assert started == {1, 3}, (policy, got)  # 200 + 40 fit 256 GiB; a second 200 does not
        assert any(isinstance(d, Wait) and d.job_id == 2 for d in got)
    # and what running jobs hold counts
    running = job(9, memory_gib=200, state=JobState.RUNNING, where=Placement("n", (n.devices[0].uuid,)))
    fleet = FleetView((n,), frozenset({n.devices[0].uuid}), {}, memory_used={"n": 200 * GIB},
                      running=(Running(running, 0.0),), policy="hsched")
    got = schedule(fleet, [job(2, memory_gib=100)], 0.0)
    assert [type(d) for d in got] == [Wait]


def test_a_job_that_offloads_goes_where_each_gpu_has_the_most_host_memory() -> None:
    lean, rich = node("lean", 8, 256), node("rich", 8, 2048)
    for policy in (None, "hsched"):
        fleet = FleetView((lean, rich), frozenset(), {}, policy=policy)
        (plain,) = [d for d in schedule(fleet, [job(1)], 0.0) if isinstance(d, Launch)]
        (off,) = [d for d in schedule(fleet, [job(2, offload=True)], 0.0) if isinstance(d, Launch)]
        assert off.placements[0].node == "rich", (policy, off)
        assert plain.placements[0].node == "lean", (policy, plain)  # (fleet order among equals otherwise)


def test_offload_in_a_spec_survives_the_store() -> None:
    spec = job_spec_from_table({"command": ["x"], "resources": {"gpus": 1, "offload": True, "memory": "512G"}}, "<t>")
    assert spec.resources.offload and spec_from_dict(spec_to_dict(spec)).resources.offload
    assert not spec_from_dict(spec_to_dict(JobSpec(command=("x",)))).resources.offload
