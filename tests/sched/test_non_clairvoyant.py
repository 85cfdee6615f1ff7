"""Non-clairvoyance is structural: the policy's job view has no field for remaining work or duration."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import pytest

from hsched.sched import JobView, Plan, Policy, PolicyInput, build_input, make_policy, policy_names, schedule_round
from hsched.sched.policies.base import OraclePolicy
from hsched.sched.registry import register
from hsched.sched.view import OracleInput
from hsched.sim.cluster import parse_cluster
from hsched.sim.engine import simulate
from tests.sched.handmade import trace

BANNED = ("remaining", "duration", "work", "steps", "finish", "end", "length", "size")


@pytest.mark.parametrize("cls", [JobView, PolicyInput])
def test_views_have_no_duration_field(cls):
    # JobView is a NamedTuple (speed), PolicyInput a dataclass
    names = list(cls._fields) if hasattr(cls, "_fields") else [f.name for f in dataclasses.fields(cls)]
    leaks = [n for n in names if any(b in n for b in BANNED)]
    assert leaks == []


def test_job_view_is_slotted_so_nothing_can_be_smuggled_in():
    v = JobView(0, "A", 1, 0.0)
    with pytest.raises((AttributeError, TypeError)):
        v.remaining_s = 1.0  # type: ignore[attr-defined]


class Spy(Policy):
    name: ClassVar[str] = "spy"
    time_sharing = True

    def __init__(self) -> None:
        self.seen: list[object] = []

    def plan(self, inp: PolicyInput) -> Plan:
        self.seen.append(inp)
        return make_policy("hsched").plan(inp)


def test_a_non_oracle_policy_never_receives_the_oracle_input():
    spy = Spy()
    simulate(trace(("A", 1, 0.0, 10.0), ("B", 1, 1.0, 2.0)), parse_cluster("fast:1,slow:1", 4), spy)
    assert spy.seen
    assert all(type(x) is PolicyInput for x in spy.seen)
    assert all(type(j) is JobView for x in spy.seen for j in x.jobs)  # type: ignore[attr-defined]


def test_only_oracle_policies_are_clairvoyant():
    for name in policy_names():
        assert make_policy(name).clairvoyant == name.endswith("-oracle")
    with pytest.raises(TypeError):
        @register
        class Cheat(OraclePolicy):  # clairvoyant but not named *-oracle
            name = "cheat"

            def plan(self, inp: OracleInput) -> Plan:
                return Plan(())


def test_oracle_policy_needs_the_remaining_times():
    servers = parse_cluster("fast:1", 4)
    inp = build_input(0.0, (JobView(0, "A", 1, 0.0),), servers, trace().throughput)
    with pytest.raises(ValueError, match="clairvoyant"):
        schedule_round(make_policy("srtf-oracle"), inp, servers)
