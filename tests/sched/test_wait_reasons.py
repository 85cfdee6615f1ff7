"""Pending reasons that say the real cause (issue 16, item 6), as squeue's: `Priority` only when a job served
before it waits for some of the same nodes, else `Resources`; `ReqNodeNotAvail, UnavailableNodes:...` when only
nodes that are not up could ever hold it."""

from __future__ import annotations

import random

import pytest

from hsched.config import SimulatedDevices
from hsched.model import Job, JobSpec, JobState, Node, NodeState, Placement, Resources
from hsched.sched.cache import RoundCache
from hsched.sched.fleet import default_chooser
from hsched.sched.live import FleetView, Running, Wait, schedule
from hsched.sched.stages.backfill import Round
from hsched.sched.state import PRIORITY, RESOURCES
from hsched.simulated import simulated_devices
from tests.sched.test_live_linear import random_case


def node(name: str, model: str, state: NodeState = NodeState.UP) -> Node:
    devices, links = simulated_devices(name, SimulatedDevices(model=model, count=1, topology="pcie"))
    return Node(name, "fake", state, cpus=16, memory_total_mib=64 * 1024, devices=devices, links=links)


def job(jid: int, gpu_type: str, state: JobState = JobState.PENDING, where: Node | None = None) -> Job:
    spec = JobSpec(command=("x",), resources=Resources(gpus=1, gpu_types=(gpu_type,)))
    placement = (Placement(where.name, (where.devices[0].uuid,)),) if where else ()
    return Job(jid, spec, "alice", state, "", float(jid), start_time=0.0 if where else None, placement=placement)


def reasons(fleet: FleetView, queue: list[Job]) -> dict[int, str]:
    return {d.job_id: d.reason for d in schedule(fleet, queue, 100.0) if isinstance(d, Wait)}


def test_priority_only_behind_a_job_that_waits_for_the_same_nodes() -> None:
    h, a = node("h", "NVIDIA H100 80GB HBM3"), node("a", "NVIDIA A100-SXM4-80GB")
    running = (job(1, "H100", JobState.RUNNING, h), job(2, "A100", JobState.RUNNING, a))
    for policy in (None, "hsched"):
        fleet = FleetView((h, a), frozenset(d.uuid for n in (h, a) for d in n.devices), {},
                          running=tuple(Running(r, 0.0) for r in running), policy=policy)
        got = reasons(fleet, [job(10, "H100"), job(11, "A100"), job(12, "A100")])
        # the H100 job waits for the H100 alone; the first A100 job is behind nobody who wants the A100
        assert got[10].startswith("Resources") and got[11] == "Resources", (policy, got)
        assert got[12] == "Priority", (policy, got)  # behind job 11, for the same node


def test_a_job_only_nodes_that_are_not_up_could_hold_says_so() -> None:
    h = node("h", "NVIDIA H100 80GB HBM3", NodeState.DOWN)
    d = node("d", "NVIDIA H100 80GB HBM3", NodeState.DRAINED)
    a = node("a", "NVIDIA A100-SXM4-80GB")
    fleet = FleetView((h, d, a), frozenset(), {}, policy="hsched")
    got = reasons(fleet, [job(10, "H100")])
    assert got == {10: "ReqNodeNotAvail, UnavailableNodes:d,h"}


def test_a_shapes_kept_nodes_are_asked_again_once_the_nodes_change() -> None:
    """`where` keeps its answer per request shape from round to round while the nodes are the same (an arriving job
    is of a shape asked before); once a node is down, a newcomer of that shape is asked about the nodes as they are."""
    h, a = node("h", "NVIDIA H100 80GB HBM3"), node("a", "NVIDIA A100-SXM4-80GB")
    busy = frozenset(d.uuid for n in (h, a) for d in n.devices)
    running = (Running(job(1, "H100", JobState.RUNNING, h), 0.0), Running(job(2, "A100", JobState.RUNNING, a), 0.0))
    cache = RoundCache()
    first = FleetView((h, a), busy, {}, running=running, policy="hsched")
    waits = {d.job_id: d.reason for d in schedule(first, [job(10, "H100")], 100.0, cache=cache) if isinstance(d, Wait)}
    assert waits[10].startswith("Resources") and cache.where_shapes
    down = FleetView((node("h", "NVIDIA H100 80GB HBM3", NodeState.DOWN), a), busy, {}, running=running[1:],
                     policy="hsched")
    again = {d.job_id: d.reason for d in schedule(down, [job(10, "H100"), job(11, "H100")], 101.0, cache=cache)
             if isinstance(d, Wait)}
    assert again == {10: "ReqNodeNotAvail, UnavailableNodes:h", 11: "ReqNodeNotAvail, UnavailableNodes:h"}


@pytest.mark.parametrize("seed", range(0, 300, 3))
def test_the_short_way_to_a_reason_agrees_with_the_long_one(seed: int) -> None:
    """`Eligible.behind` (most of a busy queue's waits, from the last round's kept `where`) answers what `why` answers
    for the same job at the same point of the round, or leaves it to `why`: on random fleets and queues (constraints,
    nodes down, several users), with wait reasons of a job's own (data), a head, and the policy's reasons. Each job is
    asked `behind` and then `why`, as the round asks them; `why` after an answer of `behind` changes nothing."""
    rng = random.Random(seed)
    view, queue, now = random_case(seed, pending=40)
    cache = RoundCache()
    schedule(view, queue, now, cache=cache)  # (the last round: its `where` answers are kept)
    st = Round(view, default_chooser(), now, cache)
    st.head = rng.choice(queue).id if queue and rng.random() < 0.5 else None
    answered = 0
    for j in queue:
        if rng.random() < 0.1:
            st.wait_reasons[j.id] = f"Data (waiting for {rng.choice('ab')})"
        reason = rng.choice((None, None, RESOURCES, PRIORITY))
        short = st.behind(j, reason)
        long = st.why(j, reason)
        if short is not None:
            answered += 1
            assert short == long, (seed, j.id)
    if seed == 0:
        assert answered, "the short way answered nobody: nothing was checked"


def test_the_last_rounds_where_is_kept_across_a_heartbeats_new_readings() -> None:
    """A heartbeat gives every node new devices with new readings (utilization, memory used): the last round's `where`
    answers and eligible devices are kept across that (the live controller's every round), and dropped when what a
    device is changes (its model here)."""
    from dataclasses import replace

    view, queue, now = random_case(3, pending=40)
    cache = RoundCache()
    first = schedule(view, queue, now, cache=cache)
    read = tuple(replace(n, devices=tuple(replace(d, utilization_gpu=55.0, memory_used_mib=777) for d in n.devices))
                 for n in view.nodes)
    again = replace(view, nodes=read)
    assert Round(again, default_chooser(), now, cache)._where_last, "a heartbeat's readings dropped the kept answers"
    assert schedule(again, queue, now, cache=cache) == first
    other = replace(view, nodes=tuple(replace(n, devices=tuple(replace(d, model="Tesla K80") for d in n.devices))
                                      for n in view.nodes))
    assert not Round(other, default_chooser(), now, cache)._where_last
