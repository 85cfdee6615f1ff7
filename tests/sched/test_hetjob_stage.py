"""The round's hetjob stage (hsched.sched.stages.hetjob): every component of a heterogeneous job placed with its own
request in one round, committed all or none; a component shares a node with another only where room allows."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hsched.model import Component, Device, Job, JobSpec, JobState, Node, NodeState, Resources, component_placements
from hsched.sched.live import FleetView, Launch, Wait, schedule
from hsched.sched.preempt import PreemptRule


def _node(name: str, model: str, gpus: int, cpus: int = 8) -> Node:
    return Node(name, "local", NodeState.UP, cpus=cpus,
                devices=tuple(Device(f"{name}{i}", i, model) for i in range(gpus)))


FLEET = (_node("l", "NVIDIA L40S", 1), _node("h", "NVIDIA H100 80GB HBM3", 2))
PIPE = (Component(("prep.py",), Resources(gpus=1, gpu_types=("l40s",))),
        Component(("train.py",), Resources(gpus=2, gpu_types=("h100",))),
        Component(("fuse.py",), Resources(cpus=4)))


def _het(job_id: int, comps: tuple[Component, ...] = PIPE) -> Job:
    spec = JobSpec(command=comps[0].command, resources=comps[0].resources, components=comps)
    return Job(job_id, spec, "alice", JobState.PENDING, "", float(job_id))


def _job(job_id: int, gpus: int, types: tuple[str, ...] = (), cpus: int | None = None) -> Job:
    spec = JobSpec(command=("x",), resources=Resources(gpus=gpus, gpu_types=types, cpus=cpus))
    return Job(job_id, spec, "alice", JobState.PENDING, "", float(job_id))


@pytest.mark.parametrize("policy", [None, "hsched"])
def test_every_component_is_placed_with_its_own_request(policy: str | None) -> None:
    [d] = schedule(FleetView(FLEET, frozenset(), {}, policy=policy), [_het(1)], 0.0)
    assert isinstance(d, Launch)
    job = _het(1)
    per = component_placements(job.spec, d.placements)
    assert [p.node for ps in per for p in ps][:2] == ["l", "h"]
    assert len(per[1][0].devices) == 2 and per[2][0].devices == ()


@pytest.mark.parametrize("policy", [None, "hsched"])
def test_one_component_that_cannot_fit_starts_none_and_frees_what_the_others_took(policy: str | None) -> None:
    # one H100 busy: train.py (2 x h100) cannot start; prep.py's L40S must stay free for the job behind it
    view = FleetView(FLEET, frozenset({"h0"}), {}, policy=policy)
    got = {d.job_id: d for d in schedule(view, [_het(1), _job(2, 1, ("l40s",))], 10.0)}
    assert isinstance(got[1], Wait) and "component 1 (train.py: 2 x h100 GPU(s))" in got[1].reason
    assert isinstance(got[2], Launch) and got[2].placements[0].devices == ("l0",)


def test_components_share_a_node_only_where_its_cpus_allow() -> None:
    node = _node("n", "NVIDIA H100 80GB HBM3", 4, cpus=8)
    comps = (Component(("a.py",), Resources(gpus=2, cpus=4)), Component(("b.py",), Resources(gpus=2, cpus=4)))
    [d] = schedule(FleetView((node,), frozenset(), {}), [_het(1, comps)], 0.0)
    assert isinstance(d, Launch) and [p.node for p in d.placements] == ["n", "n"]
    assert not set(d.placements[0].devices) & set(d.placements[1].devices)
    greedy = (comps[0], Component(("b.py",), Resources(gpus=2, cpus=5)))  # 4 + 5 CPUs > 8
    [w] = schedule(FleetView((node,), frozenset(), {}), [_het(2, greedy)], 0.0)
    assert isinstance(w, Wait) and "component 1 (b.py" in w.reason


def test_a_hetjob_waits_while_a_job_that_may_preempt_it_waits() -> None:
    rule = PreemptRule({"normal": frozenset({"scavenger"})})
    low = replace(_het(1), spec=replace(_het(1).spec, qos="scavenger"))
    blocked = _job(2, 4, ("h100",))  # waits (no node has 4 H100s) and may preempt scavenger jobs
    got = {d.job_id: d for d in schedule(FleetView(FLEET, frozenset(), {}, rule=rule), [low, blocked], 0.0)}
    assert isinstance(got[1], Wait) and got[1].reason == "Priority"
    # alone, or beside jobs that may not preempt it, it starts
    [alone] = schedule(FleetView(FLEET, frozenset(), {}, rule=rule), [low], 0.0)
    assert isinstance(alone, Launch)
