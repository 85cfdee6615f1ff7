"""Issue 27, point 6: a step of the wall clock changes no decision.

The whole controller in-process (hsched.testing.Lab) on a fake clock whose wall clock is stepped alone
(`FakeClock.step_wall`), as an administrator's `date -s`, an NTP step or a VM resumed hours later step a real
one. Before the fix, +2 h declared every node past its lease (its job requeued, the running copy killed and
started again) and fired a 2-minute limit at once; -1 h held a 10 s retry for an hour and a limit for an hour
more. Every decision is now counted on the monotonic clock: the limit fires at 120 s of it, the retry after
10 s of it, whichever way the wall clock went.

Each step is made between two monitoring samples and met first by the health check, as in the daemon (its
health loop runs every 0.5 s; samples come every `monitor_interval_s`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest

from hsched.clock import Timeline
from hsched.config import Settings
from hsched.controller import commands
from hsched.controller.health import check_health
from hsched.controller.loops import one_round
from hsched.model import EndReason, Job, JobState, NodeState, RunState
from hsched.testing import FakeClock, Lab

HOUR = 3600.0
LIMIT_S = 120.0
SETTINGS = Settings(heartbeat_timeout_s=15.0, lease_s=60.0, retry_backoff_s=10.0, kill_after_s=10.0)


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


async def step_between_samples(lab: Lab, seconds: float) -> None:
    """Step the wall clock, then let the controller's loops see it before any node sends a sample: the health
    check (leases, heartbeats), then a scheduling round (limits, stops, retries), as the daemon runs them."""
    lab.clock.step_wall(seconds)
    await check_health(lab.ctl)
    await one_round(lab.ctl)
    await lab.settle_tasks()


async def assert_untouched(lab: Lab, job_id: int) -> None:
    """No node lost, the job still running its first attempt, on its first and only run, never signalled."""
    for name, rt in lab.ctl.nodes.items():
        assert rt.node.state is NodeState.UP, f"{name}: {rt.node.state} ({rt.node.message})"
    job = await lab.job(job_id)
    assert (job.state, job.restarts) == (JobState.RUNNING, 0), (job.state, job.reason)
    runs = await lab.runs(job_id)
    assert [r.state for r in runs] == [RunState.RUNNING]
    assert [f.signals for f in await lab.fake_runs(job_id)] == [[]]
    assert "node_lost" not in await lab.events(job_id)


async def limit_fires_at_120_s(lab: Lab, job_id: int, elapsed: float) -> None:
    """From `elapsed` monotonic seconds into the job's attempt: nothing until 120 s, the stop at 120 s."""
    while elapsed + 10.0 < LIMIT_S:
        await lab.advance(10.0)
        elapsed += 10.0
        await assert_untouched(lab, job_id)
    await lab.advance(LIMIT_S - 0.1 - elapsed)
    await assert_untouched(lab, job_id)  # 119.9 s: not yet
    await lab.advance(0.1)  # 120 s: the round at the limit stops it
    job = await lab.job(job_id)
    assert (job.state, job.reason) == (JobState.COMPLETING, EndReason.TIMEOUT)
    [fake] = await lab.fake_runs(job_id)
    assert fake.signals == ["USR1"]  # its checkpoint signal: the stop of a time limit, and nothing else



async def started_with_limit(lab: Lab) -> Job:
    """A 4-GPU job with the LIMIT_S time limit, started by one round."""
    job = await lab.submit("python", "train.py", gpus=4, time_limit_s=LIMIT_S, checkpoint_signal="USR1@30")
    await lab.round()
    return job


@pytest.mark.parametrize("step_s", [2 * HOUR, -HOUR], ids=["plus-2h", "minus-1h"])
def test_a_running_job_with_a_limit_is_neither_lost_nor_killed_nor_timed_out_by_a_step(tmp_path: Path,
                                                                                       step_s: float) -> None:
    async def scenario() -> None:
        async with Lab.open(tmp_path, settings=SETTINGS) as lab:
            job = await started_with_limit(lab)
            await assert_untouched(lab, job.id)
            await lab.advance(64.0)  # the step came 64 s into the job
            await step_between_samples(lab, step_s)
            await assert_untouched(lab, job.id)
            # the nodes' next samples: still nothing lost, nothing killed, nothing started again
            await lab.round()
            await assert_untouched(lab, job.id)
            await limit_fires_at_120_s(lab, job.id, 64.0)

    run(scenario)


@pytest.mark.parametrize("step_s", [-HOUR, 2 * HOUR], ids=["minus-1h", "plus-2h"])
def test_a_retry_waits_its_backoff_on_the_monotonic_clock(tmp_path: Path, step_s: float) -> None:
    async def scenario() -> None:
        async with Lab.open(tmp_path, settings=SETTINGS) as lab:
            job = await lab.submit("python", "train.py", gpus=1, retries=1)
            await lab.round()
            await lab.finish(job.id, 1)
            await lab.round()  # failed: retry 1 of 1 in 10 s
            failed = await lab.job(job.id)
            assert (failed.state, failed.reason) == (JobState.PENDING, EndReason.RETRY_BACKOFF)
            await step_between_samples(lab, step_s)
            assert len(await lab.runs(job.id)) == 1  # a step forward releases it no earlier
            await lab.advance(9.9)
            assert (await lab.job(job.id)).state is JobState.PENDING
            assert len(await lab.runs(job.id)) == 1
            await lab.advance(0.1)  # 10 s of the monotonic clock: the retry starts (not an hour later)
            again = await lab.job(job.id)
            assert (again.state, again.restarts) == (JobState.RUNNING, 1)
            assert len(await lab.runs(job.id)) == 2

    run(scenario)


@pytest.mark.parametrize("step_s", [2 * HOUR, -HOUR], ids=["plus-2h", "minus-1h"])
def test_a_stops_escalation_keeps_its_grace_across_a_step(tmp_path: Path, step_s: float) -> None:
    """A cancel's SIGTERM -> kill_after_s -> SIGKILL: +2 h must not send the KILL at once, -1 h not an hour late."""

    async def scenario() -> None:
        async with Lab.open(tmp_path, settings=SETTINGS) as lab:
            job = await lab.submit("python", "train.py")
            await lab.round()
            for ex in lab.executors.values():
                ex.exit_on_signal = {"KILL": 137}  # the job ignores SIGTERM
            await commands.cancel(lab.ctl, job.id)
            [fake] = await lab.fake_runs(job.id)
            assert fake.signals == ["TERM"]
            await step_between_samples(lab, step_s)
            await lab.advance(9.9)
            assert fake.signals == ["TERM"]
            await lab.advance(0.1)
            assert fake.signals == ["TERM", "KILL"]
            await lab.round()
            assert (await lab.job(job.id)).state is JobState.CANCELLED

    run(scenario)


@pytest.mark.parametrize("step_s", [2 * HOUR, -HOUR], ids=["plus-2h", "minus-1h"])
def test_a_restarted_controller_counts_an_adopted_jobs_limit_from_its_recorded_start(tmp_path: Path,
                                                                                       step_s: float) -> None:
    """The limit survives a controller restart (counted from the run's recorded start, a wall time) and the step
    that comes after the new controller took the job over moves it no more than it would have moved the first."""

    async def scenario() -> None:
        clock = FakeClock()
        async with Lab.open(tmp_path, settings=SETTINGS, clock=clock) as lab:
            job = await started_with_limit(lab)
            await lab.advance(40.0)
            runs = {n: ex.runs for n, ex in lab.executors.items()}
        # the next controller, 20 s later, finds the run on its node (the fake nodes' records carried over)
        clock.advance(20.0)
        async with Lab.open(tmp_path, settings=SETTINGS, clock=clock) as lab:
            for n, ex in lab.executors.items():
                ex.runs.update(runs[n])
            await lab.round()  # adopted: its recorded start converted once onto the monotonic clock
            await assert_untouched(lab, job.id)
            await step_between_samples(lab, step_s)
            await assert_untouched(lab, job.id)
            await limit_fires_at_120_s(lab, job.id, 60.0)

    run(scenario)


def test_a_retry_recorded_before_a_restart_waits_what_is_left_of_it(tmp_path: Path) -> None:
    """A retry's not-before time read back by a restarted controller is converted once: the wall clock stepped
    back an hour afterwards holds it no longer than its backoff."""

    async def scenario() -> None:
        clock = FakeClock()
        async with Lab.open(tmp_path, settings=SETTINGS, clock=clock) as lab:
            job = await lab.submit("python", "train.py", gpus=1, retries=1)
            await lab.round()
            await lab.finish(job.id, 1)
            await lab.round()  # retry in 10 s
            await lab.advance(4.0)
        async with Lab.open(tmp_path, settings=SETTINGS, clock=clock) as lab:
            await lab.round()  # read back: 6 s left
            assert (await lab.job(job.id)).state is JobState.PENDING
            await step_between_samples(lab, -HOUR)
            await lab.advance(5.9)
            assert (await lab.job(job.id)).state is JobState.PENDING
            await lab.advance(0.1)
            assert (await lab.job(job.id)).state is JobState.RUNNING

    run(scenario)


def test_the_timeline_converts_recorded_wall_times_once_and_ignores_later_steps() -> None:
    clock = FakeClock()
    line = Timeline(clock)
    wall0, at0 = clock.time(), line.now()
    assert at0 == wall0  # it starts where the wall clock is
    started = line.since(wall0 - 30.0)  # a run recorded 30 s ago
    retry = line.until(wall0 + 10.0, at_most=360.0)  # a retry recorded for 10 s from now
    ahead = line.since(wall0 + 50.0)  # a start recorded ahead of the wall clock (before a step back): now
    clock.step_wall(2 * HOUR)
    assert line.now() == at0  # the wall clock's step moves nothing on the timeline
    clock.advance(5.0)
    assert line.now() - started == 35.0 and retry - line.now() == 5.0 and line.now() - ahead == 5.0
    # recorded far ahead (the wall clock stepped back an hour since): never more than the bound
    assert line.until(clock.time() + HOUR, at_most=360.0) - line.now() == 360.0
    # shown as the wall clock shows it now
    assert line.wall(line.now()) == clock.time() and line.wall(started) == clock.time() - 35.0


def test_a_restarted_controller_counts_a_requeued_jobs_limit_from_its_current_attempts_start(tmp_path: Path) -> None:
    """Limits count per attempt: a job requeued by a checkpoint exit and adopted by a restarted controller has its
    second attempt's 120 s, counted from that attempt's recorded start (the job's own start_time is its first's)."""

    async def scenario() -> None:
        clock = FakeClock()
        async with Lab.open(tmp_path, settings=SETTINGS, clock=clock) as lab:
            job = await started_with_limit(lab)
            await lab.advance(50.0)
            await lab.finish(job.id, 85)  # a checkpoint exit: requeued, started again in the same round
            await lab.round()
            assert (await lab.job(job.id)).restarts == 1
            await lab.advance(40.0)
            runs = {n: ex.runs for n, ex in lab.executors.items()}
        clock.advance(20.0)  # the second attempt is 60 s old when the next controller takes it over
        async with Lab.open(tmp_path, settings=SETTINGS, clock=clock) as lab:
            for n, ex in lab.executors.items():
                ex.runs.update(runs[n])
            await lab.round()
            await step_between_samples(lab, 2 * HOUR)
            await lab.advance(59.9)
            now = await lab.job(job.id)
            assert (now.state, now.restarts) == (JobState.RUNNING, 1)
            await lab.advance(0.1)
            now = await lab.job(job.id)
            assert (now.state, now.reason) == (JobState.COMPLETING, EndReason.TIMEOUT)

    run(scenario)
