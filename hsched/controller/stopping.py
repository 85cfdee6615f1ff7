"""Stopping runs on purpose: cancel, preemption, time limits and gang teardown, with escalation.

Every stop is a short plan of signals in time:

    preempt     checkpoint signal (e.g. USR1) -> grace -> SIGTERM -> 1 s -> SIGKILL to every process
    timeout     same as preempt (the job may checkpoint), ending TIMEOUT
    cancel      SIGTERM -> kill_after_s -> SIGKILL to every process
    rank died   SIGTERM to the other ranks -> 2 s -> SIGKILL (no hung collectives)

The plan's *reason* is durable (the job's `reason`, written in the same transaction as its state change);
the timing lives in memory. A controller restarted mid-stop rebuilds the plan from the reason and sends
the next step at once, so a stop is never forgotten, only at worst hurried.
"""

from __future__ import annotations

import enum
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hsched.model import Job, JobState

if TYPE_CHECKING:
    from hsched.controller.core import Controller

log = logging.getLogger("hsched.stopping")

KILL_AFTER_TERM_S = 1.0
"""After the grace period's SIGTERM, how long before SIGKILL (preemption and timeouts)."""
GANG_KILL_S = 2.0


class StopReason(enum.StrEnum):
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    TIMEOUT = "timeout"
    RANK_FAILED = "rank_failed"


STOP_STATE = {
    StopReason.CANCELLED: JobState.COMPLETING,
    StopReason.PREEMPTED: JobState.PREEMPTING,
    StopReason.TIMEOUT: JobState.COMPLETING,
    StopReason.RANK_FAILED: JobState.COMPLETING,
}


STOP_EVENT = {
    StopReason.CANCELLED: "cancel",
    StopReason.PREEMPTED: "preempting",
    StopReason.TIMEOUT: "timeout",
    StopReason.RANK_FAILED: "rank_failed",
}


@dataclass(slots=True)
class StopPlan:
    reason: StopReason
    steps: list[tuple[float, str, bool]]
    """(when, signal, all_processes), in order; sent as their time comes."""
    decided_at: float = 0.0
    """When the stop was decided (for the time from a preemption decision to GPUs free)."""


def plan_for(job: Job, reason: StopReason, now: float, kill_after_s: float) -> StopPlan:
    ck = job.spec.checkpoint_signal
    if reason in (StopReason.PREEMPTED, StopReason.TIMEOUT):
        steps = [(now, ck.signal, False)]
        if ck.signal != "TERM":
            steps.append((now + ck.grace_s, "TERM", False))
            steps.append((now + ck.grace_s + KILL_AFTER_TERM_S, "KILL", True))
        else:
            steps.append((now + ck.grace_s, "KILL", True))
    elif reason is StopReason.RANK_FAILED:
        steps = [(now, "TERM", False), (now + GANG_KILL_S, "KILL", True)]
    else:
        steps = [(now, "TERM", False), (now + kill_after_s, "KILL", True)]
    return StopPlan(reason=reason, steps=steps, decided_at=now)


async def begin_stop(ctl: Controller, job: Job, reason: StopReason, message: str) -> Job:
    """Record the stop durably, then send its first signal. Call with ctl.lock held."""
    now = time.time()
    job = await ctl.db(ctl.store.set_job, job.id, now, state=STOP_STATE[reason], reason=reason.value,
                       event=(STOP_EVENT[reason], message))
    ctl.stops[job.id] = plan_for(job, reason, now, ctl.settings.kill_after_s)
    await advance(ctl, job.id, now)
    return job


async def advance(ctl: Controller, job_id: int, now: float) -> None:
    """Send every step of the job's plan whose time has come."""
    plan = ctl.stops.get(job_id)
    if plan is None:
        return
    while plan.steps and plan.steps[0][0] <= now:
        _, sig, everything = plan.steps.pop(0)
        sent = await ctl.signal_job(job_id, sig, all_processes=everything)
        if sent:
            await ctl.db(ctl.store.add_event, now, "signal",
                         f"SIG{sig} sent" + (" to every process of the run" if everything else ""), job_id=job_id)


async def tick(ctl: Controller) -> None:
    """Advance every plan; rebuild plans lost with a previous controller."""
    now = time.time()
    stopping = await ctl.db(ctl.store.jobs, states=[JobState.PREEMPTING, JobState.COMPLETING])
    for job in stopping:
        if job.id not in ctl.stops:
            try:
                reason = StopReason(job.reason)
            except ValueError:
                reason = StopReason.CANCELLED
            plan = plan_for(job, reason, now, ctl.settings.kill_after_s)
            # the first signal went out before the restart; hurry on from the escalation
            plan.steps = [(now, s, a) for (_, s, a) in plan.steps[1:]] or plan.steps
            ctl.stops[job.id] = plan
        await advance(ctl, job.id, now)


async def check_time_limits(ctl: Controller, running: list[Job]) -> None:
    """Warn before a job's time limit (sbatch's --signal), then stop it as a TIMEOUT."""
    now = time.time()
    for job in running:
        limit = job.spec.time_limit_s
        if limit is None or job.state is not JobState.RUNNING:
            continue
        started = ctl.attempt_start.get(job.id) or job.start_time or now
        elapsed = now - started
        warn = job.spec.warn_signal
        if warn is not None and elapsed >= limit - warn.grace_s and job.id not in ctl.warned:
            ctl.warned.add(job.id)
            await ctl.signal_job(job.id, warn.signal)
            await ctl.db(ctl.store.add_event, now, "warning",
                         f"SIG{warn.signal} sent {warn.grace_s:g} s before the time limit", job_id=job.id)
        if elapsed >= limit:
            await begin_stop(ctl, job, StopReason.TIMEOUT, f"time limit of {limit:g} s reached")
