"""Remaining time from progress totals (issue 33, item 4): the `hsched` policy ranks a job whose progress reported a
total by the time left (shortest first, as SRTF), and every other job by the service it attained (least first, as
LAS), in GPU-seconds either way; the live round hands it the waiting jobs' figures from their last attempt
(`FleetView.left`), normalised to their fastest GPU type, as the simulator does."""

from __future__ import annotations

from dataclasses import replace

from hsched.model import JobState
from hsched.sched.live import Launch, gpu_type_of, schedule
from hsched.sched.policies.hsched import Hsched
from hsched.sched.policies.types import assign_types
from hsched.sched.round import build_input
from hsched.sched.view import JobPhase, JobView, ServerView
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


def _types(forecast: dict[int, float], kinds: str = "AA") -> dict[int, str]:
    # one fast and one slow GPU, two running jobs; which type does each get?
    jobs = [JobView(i + 1, k, 1, float(i), phase=JobPhase.RUNNING, gpu_type="slow" if i else "fast", run_start_s=0.0,
                    service_s=100.0 * (i + 1)) for i, k in enumerate(kinds)]
    servers = [ServerView("f", "fast", ("f0",)), ServerView("s", "slow", ("s0",))]
    inp = build_input(10_000.0, jobs, servers, model(), forecast_s=forecast)
    return assign_types(jobs, inp.capacity, inp)


def test_the_fast_gpu_goes_to_the_job_with_less_left_where_speed_lost_is_equal() -> None:
    # two jobs of a kind (half speed on the slow type): the one with less left gets the fast GPU (SRPT on the fastest
    # machine), wherever it runs now
    assert _types({1: 5_000.0, 2: 500.0}) == {1: "slow", 2: "fast"}
    assert _types({1: 500.0, 2: 5_000.0}) == {1: "fast", 2: "slow"}
    # nothing known of remaining time: hetero_assign's answer (equals stay where they are)
    assert _types({}) == {1: "fast", 2: "slow"}


def test_the_speed_lost_still_weighs_first() -> None:
    # B keeps a quarter of its speed on the slow type, A half: with ten times as much left, B still gets the fast GPU
    # (a claim of 3 x 10^-0.3 = 1.5 against A's 1); with a thousand times, A does (3 x 10^-0.9 = 0.38 < 1)
    assert _types({1: 100.0, 2: 1_000.0}, "AB") == {1: "slow", 2: "fast"}
    assert _types({1: 100.0, 2: 100_000.0}, "AB") == {1: "fast", 2: "slow"}
