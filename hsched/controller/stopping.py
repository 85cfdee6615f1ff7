"""Stopping runs on purpose: cancel, preemption, time limits and gang teardown, with escalation.

The plans themselves are pure (hsched.lifecycle); this stage records a stop durably, then sends each step's
signal when the controller's clock reaches it. Every step's time, and every time limit, is counted on the
controller's monotonic timeline (Controller.timeline): a step of the wall clock neither hurries nor holds up a stop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from hsched.controller.core import Controller
from hsched.errors import ExecutorError
from hsched.lifecycle import StopReason, plan_for, resumed_plan
from hsched.model import Job, JobState

log = logging.getLogger("hsched.stopping")


async def begin_stop(ctl: Controller, job: Job, reason: StopReason, message: str) -> Job:
    """Record the stop durably, then send its first signal. Call with ctl.lock held."""
    now = ctl.clock.time()
    job = await ctl.db(ctl.store.set_job, job.id, now, state=reason.state, reason=reason.value,
                       event=(reason.event, message))
    ctl.stops[job.id] = plan_for(job, reason, ctl.timeline.now(), ctl.settings.kill_after_s)
    await advance(ctl, job.id)
    return job


async def advance(ctl: Controller, job_id: int) -> None:
    """Send every step of the job's plan whose time has come (on the controller's timeline)."""
    plan = ctl.stops.get(job_id)
    if plan is None:
        return
    due, ctl.stops[job_id] = plan.due(ctl.timeline.now())
    now = ctl.clock.time()
    for step in due:
        sent = await send(ctl, job_id, step.signal, all_processes=step.all_processes, batch_only=step.batch_only,
                          purpose=plan.reason.value)
        if sent:
            whom = (" to the batch shell only" if step.batch_only
                    else " to every process of the run" if step.all_processes else "")
            await ctl.db(ctl.store.add_event, now, "signal", f"SIG{step.signal} sent{whom}", job_id=job_id)


async def send(ctl: Controller, job_id: int, sig: str, *, all_processes: bool, batch_only: bool,
               purpose: str) -> bool:
    """Send a signal to every live run (rank) of the job; True if any run received it. A node that does not
    answer is skipped (the plan's next step, or the lease, deals with it). `purpose` (a StopReason's value,
    "warning" or "checkpoint") is recorded on the node, where the job can read why it got the signal."""
    sent = False
    for run in await ctl.db(ctl.state.live_runs.of_job, ctl.store, job_id):
        if run.handle is None:
            continue
        rt = ctl.nodes.get(run.node)
        if rt is None:
            continue
        try:
            async with asyncio.timeout(30):
                sent |= await rt.executor.signal(run.handle, sig, all_processes=all_processes and not batch_only,
                                                 batch_only=batch_only, purpose=purpose)
        except (ExecutorError, TimeoutError) as e:
            log.warning("job %s: cannot send SIG%s on %s: %s", job_id, sig, run.node, e)
    return sent


async def tick(ctl: Controller) -> None:
    """Advance every plan; rebuild plans lost with a previous controller."""
    stopping = await ctl.db(ctl.store.jobs, states=[JobState.PREEMPTING, JobState.COMPLETING])
    for job in stopping:
        if job.id not in ctl.stops:
            ctl.stops[job.id] = resumed_plan(job, ctl.timeline.now(), ctl.settings.kill_after_s)
        await advance(ctl, job.id)


async def check_time_limits(ctl: Controller, jobs: Sequence[Job]) -> None:
    """Warn before a job's time limit (sbatch's --signal), then stop it as a TIMEOUT (`jobs`: any jobs; those not
    running are passed over)."""
    at = ctl.timeline.now()
    for job in jobs:
        limit = job.spec.time_limit_s
        if limit is None or job.state is not JobState.RUNNING:
            continue
        # counted on the monotonic timeline from the attempt's start (a run adopted from a previous controller:
        # its recorded start, converted once): the wall clock stepped forward kills no job early, nor back late
        elapsed = at - ctl.attempt_started(job)
        warn = job.spec.warn_signal
        if warn is not None and elapsed >= limit - warn.grace_s and job.id not in ctl.warned:
            ctl.warned.add(job.id)
            await send(ctl, job.id, warn.signal, all_processes=not warn.batch_only, batch_only=warn.batch_only,
                       purpose="warning")
            whom = "the batch shell" if warn.batch_only else "every process of the run"
            await ctl.db(ctl.store.add_event, ctl.clock.time(), "warning",
                         f"SIG{warn.signal} sent to {whom} {warn.grace_s:g} s before the time limit", job_id=job.id)
        if elapsed >= limit:
            await begin_stop(ctl, job, StopReason.TIMEOUT, f"time limit of {limit:g} s reached")
