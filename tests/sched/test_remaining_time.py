"""Remaining time from progress totals (issue 33, item 4): the `hsched` policy ranks a job whose progress reported a
total by the time left (shortest first, as SRTF), and every other job by the service it attained (least first, as
LAS), in GPU-seconds either way; the live round hands it the waiting jobs' figures from their last attempt
(`FleetView.left`), normalised to their fastest GPU type, as the simulator does."""

from __future__ import annotations

from dataclasses import replace

from hsched.model import JobState
from hsched.sched.live import Launch, gpu_type_of, schedule
from hsched.sched.policies.hsched import Hsched
from hsched.sched.round import build_input
from hsched.sched.view import JobView, ServerView
from tests.sched.handmade import model
from tests.sched.test_lab_round import job, node, view

A100 = gpu_type_of("NVIDIA A100-SXM4-80GB")


def _order(forecast: dict[int, float]) -> list[int]:
    jobs = [JobView(1, "A", 1, 0.0, service_s=600.0), JobView(2, "A", 1, 1.0, service_s=300.0),
            JobView(3, "A", 2, 2.0, service_s=100.0), JobView(4, "A", 1, 3.0)]
    servers = [ServerView("f", "fast", ("f0", "f1")), ServerView("s", "slow", ("s0", "s1"))]
    inp = build_input(10_000.0, jobs, servers, model(), forecast_s=forecast)
    return [j.id for j in Hsched().order(inp)]


def test_least_attained_service_without_totals_and_shortest_remaining_with_them() -> None:
    # nobody reported a total: least GPU-seconds attained first (job 3's 2 GPUs x 100 s = 200 < 300 < 600)
    assert _order({}) == [4, 3, 2, 1]
    # job 1 reported that 100 s are left: it goes ahead of the jobs that attained more than that
    assert _order({1: 100.0}) == [4, 1, 3, 2]
    # a gang counts its GPUs: job 3's 2 x 60 s left is 120 GPU-seconds, behind job 1's 100
    assert _order({1: 100.0, 3: 60.0}) == [4, 1, 3, 2]
    # a job never started has attained nothing: it runs first, and its progress tells from then on
    assert _order({1: 1.0, 2: 1.0, 3: 1.0})[0] == 4


def test_the_live_round_starts_the_waiting_job_its_progress_says_is_nearly_done() -> None:
    n = node("n1", gpus=1)
    near, other = replace(job(1, t=0.0), restarts=1), replace(job(2, t=1.0), restarts=1)  # both ran before
    attained = {1: 600.0, 2: 300.0}
    # without what its progress said, the job that attained less starts (least attained service)
    (d,) = [d for d in schedule(view([n], policy="hsched", attained=attained), [near, other], 700.0)
            if isinstance(d, Launch)]
    assert d.job_id == 2
    # its last attempt reported 100 s left on an A100: it starts first
    (d,) = [d for d in schedule(view([n], policy="hsched", attained=attained, left={1: (100.0, A100)}),
                                [near, other], 700.0) if isinstance(d, Launch)]
    assert d.job_id == 1
    assert near.state is JobState.PENDING
