"""The live round's data rule (issue 15), pure: a job waits for a node holding its data only while that node is
predicted to free before the copy elsewhere would end, counting the time it already waited (a holder whose predicted
free time keeps slipping never makes it wait longer than copying at once); a holder one job waits for is held for it
(others may take its free GPUs only if that job's predicted start stays); the next job in line does not wait for
that holder too."""

from __future__ import annotations

import pytest

from hsched.model import Device, Job, JobSpec, JobState, Node, NodeState, Placement, Resources
from hsched.sched.live import FleetView, Launch, Running, Wait, schedule

GIB = 1 << 30
COPY_S = 5 * GIB / 12.5e6  # 429.5 s at 100 Mbit/s
POLICIES = (None, "hsched")


def node(name: str, gpus: int = 2) -> Node:
    return Node(name, "ssh", NodeState.UP, cpus=16, memory_total_mib=64000,
                devices=tuple(Device(f"GPU-{name}-{i}", i, "NVIDIA A100-SXM4-80GB") for i in range(gpus)))


def job(jid: int, gpus: int = 1, data: tuple[str, ...] = (), limit: float | None = None) -> Job:
    spec = JobSpec(command=("x",), resources=Resources(gpus=gpus), data=data, time_limit_s=limit)
    return Job(jid, spec, "alice", JobState.PENDING, "", float(jid))


def running(jid: int, where: str, devices: tuple[str, ...]) -> Running:
    j = Job(jid, JobSpec(command=("x",), resources=Resources(gpus=len(devices))), "bob", JobState.RUNNING, "", 0.0,
            start_time=0.0, placement=(Placement(where, devices),))
    return Running(j, 0.0)


def view(nodes: tuple[Node, ...], runs: tuple[Running, ...], ends: dict[int, float], policy: str | None,
         waited: dict[int, float] | None = None) -> FleetView:
    busy = frozenset(u for r in runs for u in r.devices)
    return FleetView(nodes, busy, {}, running=runs, policy=policy, ends=ends,
                     data_at={"imagenet": frozenset({"a"})}, data_bytes={"imagenet": 5 * GIB}, default_bps=12.5e6,
                     data_waited=waited or {})


@pytest.mark.parametrize("policy", POLICIES)
def test_the_wait_is_bounded_by_the_copy(policy: str | None) -> None:
    nodes = (node("a", 1), node("b", 1))
    runs = (running(9, "a", ("GPU-a-0",)),)
    fresh = {d.job_id: d for d in schedule(view(nodes, runs, {9: 300.0}, policy), [job(1, data=("imagenet",))], 0.0)}
    assert isinstance(fresh[1], Wait) and fresh[1].reason.startswith("Data (waiting for a"), fresh
    # it waited 200 s already and a still frees only in 300 s: 500 s > 429.5 s of copy, so it copies now
    late = schedule(view(nodes, runs, {9: 300.0}, policy, {1: 200.0}), [job(1, data=("imagenet",))], 0.0)
    d = {x.job_id: x for x in late}[1]
    assert isinstance(d, Launch) and [p.node for p in d.placements] == ["b"], late


@pytest.mark.parametrize("policy", POLICIES)
def test_a_held_holder_is_not_given_to_a_job_that_would_push_the_wait_back(policy: str | None) -> None:
    """a: one GPU busy for 300 s, one free; the 2-GPU data job waits for a (300 s < 429.5 s). A one-GPU job with no
    time limit may not take a's free GPU (then a would never have room): it goes to b; one with a 200 s limit may."""
    nodes = (node("a"), node("b"))
    runs = (running(9, "a", ("GPU-a-0",)),)
    got = {d.job_id: d for d in schedule(view(nodes, runs, {9: 300.0}, policy),
                                         [job(1, gpus=2, data=("imagenet",)), job(2)], 0.0)}
    assert isinstance(got[1], Wait) and got[1].reason.startswith("Data (waiting for a"), got
    assert isinstance(got[2], Launch) and [p.node for p in got[2].placements] == ["b"], got
    got = {d.job_id: d for d in schedule(view((node("a"), node("b", 0)), runs, {9: 300.0}, policy),
                                         [job(1, gpus=2, data=("imagenet",)), job(2, limit=200.0)], 0.0)}
    assert isinstance(got[1], Wait), got
    assert isinstance(got[2], Launch) and [p.node for p in got[2].placements] == ["a"], got


@pytest.mark.parametrize("policy", POLICIES)
def test_the_next_job_does_not_wait_for_a_holder_held_for_another(policy: str | None) -> None:
    nodes = (node("a", 1), node("b", 1), node("c", 1))
    runs = (running(9, "a", ("GPU-a-0",)),)
    got = {d.job_id: d for d in schedule(view(nodes, runs, {9: 300.0}, policy),
                                         [job(1, data=("imagenet",)), job(2, data=("imagenet",))], 0.0)}
    waits = [i for i, d in got.items() if isinstance(d, Wait)]
    launched = [i for i, d in got.items() if isinstance(d, Launch)]
    assert len(waits) == 1 and len(launched) == 1, got
    assert got[waits[0]].reason.startswith("Data (waiting for a")


def test_prefetch_goes_where_the_job_will_start_not_where_a_job_ahead_will() -> None:
    """a (holding the data) is busy for 2 h, b frees in 10 min: a data job alone is prefetched to b; behind a job that
    will take b first, it is not (that copy would be wasted), and a one-GPU job ahead on a two-GPU b leaves room."""
    from hsched.sched.live import prefetch_targets

    runs = (running(8, "a", ("GPU-a-0",)), running(9, "b", ("GPU-b-0",)))
    ends = {8: 7200.0, 9: 600.0}
    fleet = view((node("a", 1), node("b", 1)), runs, ends, None)
    alone = prefetch_targets(fleet, [job(2, data=("imagenet",))], 0.0, 900.0)
    assert alone == [(2, "b", ("imagenet",))]
    assert prefetch_targets(fleet, [job(1), job(2, data=("imagenet",))], 0.0, 900.0) == []
    runs2 = (running(8, "a", ("GPU-a-0",)), running(9, "b", ("GPU-b-0", "GPU-b-1")))
    roomy = view((node("a", 1), node("b", 2)), runs2, ends, None)
    assert prefetch_targets(roomy, [job(1), job(2, data=("imagenet",))], 0.0, 900.0) == [(2, "b", ("imagenet",))]
    # not soon: b frees only past the horizon plus the copy
    late = view((node("a", 1), node("b", 1)), runs, {8: 7200.0, 9: 5000.0}, None)
    assert prefetch_targets(late, [job(2, data=("imagenet",))], 0.0, 900.0) == []


def test_prefetch_follows_the_order_the_round_served() -> None:
    """Who is ahead is the policy's order when the round hands it over (`served`), not QoS/priority/submit order."""
    from dataclasses import replace

    from hsched.sched.live import prefetch_targets

    runs = (running(8, "a", ("GPU-a-0",)), running(9, "b", ("GPU-b-0",)))
    fleet = view((node("a", 1), node("b", 1)), runs, {8: 7200.0, 9: 600.0}, None)
    first = job(1)
    urgent = replace(first, spec=replace(first.spec, priority=10))
    queue = [job(2, data=("imagenet",)), urgent]
    assert prefetch_targets(fleet, queue, 0.0, 900.0) == []  # by priority the other job takes b first
    assert prefetch_targets(fleet, queue, 0.0, 900.0, served=True) == [(2, "b", ("imagenet",))]
