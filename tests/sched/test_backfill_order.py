"""The jobs the policy's plan leaves to backfill are served by QoS class and priority before submit time (issue 33).
Served by submit time alone, a requeued scavenger job (its submit time kept) took the GPU its normal preemptor had
just freed, ahead of it; the preemptor stopped another scavenger job, whose GPU went the same way, round after round:
on bench_live.py's churning queue ~8 jobs a round were stopped and started again, for nothing."""

from __future__ import annotations

import pytest

from hsched.config import DEFAULT_QOS_TABLE, SimulatedDevices
from hsched.model import Job, JobSpec, JobState, Node, NodeState, Placement, Resources
from hsched.sched.live import FleetView, Launch, PreemptRule, Running, Wait, schedule
from hsched.simulated import simulated_devices


def node(name: str, gpus: int, labels: tuple[str, ...] = ()) -> Node:
    devices, links = simulated_devices(name, SimulatedDevices(model="NVIDIA A100-SXM4-80GB", count=gpus,
                                                              topology="pcie"))
    return Node(name, "fake", NodeState.UP, cpus=32, memory_total_mib=256 * 1024, devices=devices, links=links)


def waiting(jid: int, submit: float, gpus: int = 1, qos: str = "normal", constraint: str | None = None,
            reason: str = "") -> Job:
    return Job(jid, JobSpec(command=("x",), qos=qos, resources=Resources(gpus=gpus, constraint=constraint)), "ann",
               JobState.PENDING, reason, submit)


def running(jid: int, where: Node, devices: tuple[int, ...]) -> Running:
    j = Job(jid, JobSpec(command=("x",), resources=Resources(gpus=len(devices))), "ann", JobState.RUNNING, "", 0.0,
            start_time=0.0, placement=(Placement(where.name, tuple(where.devices[i].uuid for i in devices)),))
    return Running(j, 0.0)


@pytest.mark.parametrize("policy", ["hsched", None])
def test_a_normal_job_backfills_before_a_scavenger_job_submitted_earlier(policy: str | None) -> None:
    """a: one GPU free (its other runs long); b: busy (the only node job 3 may use); c: two GPUs that free soon,
    reserved for the head (job 1, two GPUs). The plan's selection is full of jobs it cannot place (1, 2, 4), so the
    free GPU on a is backfill's to give: to normal job 6, not to scavenger job 5, requeued, submitted before it."""
    a, b, c = node("a", 2), node("b", 1), node("c", 2)
    runs = (running(90, a, (0,)), running(91, b, (0,)), running(92, c, (0,)), running(93, c, (1,)))
    fleet = FleetView((a, b, c), frozenset(d for r in runs for d in r.devices), {}, running=runs, policy=policy,
                      rule=PreemptRule.from_qos(DEFAULT_QOS_TABLE), labels={"b": frozenset({"only-b"})},
                      ends={90: 90_000.0, 91: 90_000.0, 92: 600.0, 93: 600.0})
    queue = [waiting(1, 10.0, gpus=2), waiting(2, 20.0, constraint="only-b"), waiting(4, 30.0, gpus=2),
             waiting(5, 5.0, qos="scavenger", reason="preempted"), waiting(6, 300.0)]
    got = {d.job_id: d for d in schedule(fleet, queue, 100.0)}
    assert isinstance(got[6], Launch) and got[6].placements[0].node == "a", got
    assert isinstance(got[5], Wait), got
