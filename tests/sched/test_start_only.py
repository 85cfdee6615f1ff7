"""Start-only rounds: the simulator's cheap round for arrivals when nobody was waiting (waiting jobs and free
GPUs only; no preemption, no moves, and no job jumps a more important one that does not fit)."""

from __future__ import annotations

import pytest

from hsched.sched import JobPhase, JobView, build_input, make_policy, schedule_round
from hsched.sim.cluster import parse_cluster
from tests.sched.handmade import model


@pytest.mark.parametrize("policy", ["hsched", "las-hetero", "ftf", "las"])
def test_a_start_only_round_does_not_backfill_past_a_job_that_does_not_fit(policy):
    # two free fast GPUs; job0 (a 4-GPU gang, first in every order: earliest, least served) cannot start
    free = parse_cluster("fast:2", 2)
    jobs = [JobView(0, "G", 4, 0.0), JobView(1, "A", 1, 5.0)]
    strict = schedule_round(make_policy(policy), build_input(10.0, jobs, free, model(), starts_only=True), free)
    assert strict.starts == ()
    # a full round backfills job1 onto the free GPUs
    full = schedule_round(make_policy(policy), build_input(10.0, jobs, free, model()), free)
    assert [s.job_id for s in full.starts] == [1]


def test_a_start_only_round_starts_in_order_on_the_free_devices():
    free = parse_cluster("fast:2,slow:1", 4)
    jobs = [JobView(0, "A", 1, 0.0), JobView(1, "A", 1, 1.0), JobView(2, "A", 1, 2.0)]
    d = schedule_round(make_policy("hsched"), build_input(10.0, jobs, free, model(), starts_only=True), free)
    assert d.preempt == ()
    assert sorted(s.job_id for s in d.starts) == [0, 1, 2]
    assert {s.gpu_type for s in d.starts} == {"fast", "slow"}
    assert all(not s.migrate for s in d.starts)
    assert all(j.phase is JobPhase.PENDING for j in jobs)
