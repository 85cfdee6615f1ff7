"""A run ended: record it, and when it was its attempt's last, settle the job (hsched.lifecycle.settle).

A job's attempt may have several runs (the ranks of a gang). When one rank fails the others are stopped
(stopping.py); when the attempt's last run has ended the job's state follows from why it stopped and the
exit codes, in the same transaction as that last run's end.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from hsched.controller.checkpoints import path_on
from hsched.controller.core import Controller
from hsched.controller.stopping import begin_stop
from hsched.errors import ExecutorError
from hsched.lifecycle import StopReason, ended_run_state, failed, settle
from hsched.model import EndReason, Job, JobState, Run, RunState

log = logging.getLogger("hsched.ending")


async def run_ended(ctl: Controller, job: Job, run: Run, now: float, *, exit_code: int | None, lost: bool) -> None:
    """Record one run's end; if it was the attempt's last, settle the job. Call with ctl.lock held."""
    runs = await ctl.db(ctl.store.attempt_runs, job.id, run.attempt)
    others_live = [r for r in runs if r.id != run.id and r.state.is_live()]
    rank = f" rank {run.rank}" if run.world > 1 else ""
    what = "lost: the process is gone and left no exit code" if lost else f"exited with code {exit_code}"
    reason = EndReason.LOST.value if lost else ""
    ck = ctl.settings.checkpoint_exit_code
    if others_live:
        await ctl.db(ctl.store.end_run, run, now, run_state=ended_run_state(exit_code, lost), exit_code=exit_code,
                     reason=reason, job_fields=None, event=("rank_ended", f"run{rank} {what}"))
        if failed(exit_code, lost, ck) and job.state in (JobState.RUNNING, JobState.LAUNCHING):
            await begin_stop(ctl, job, StopReason.RANK_FAILED,
                             f"rank {run.rank} {what}: stopping the other {len(others_live)} rank(s)")
        return
    # in the order they ended: a gang's first failure is its cause, the rest were stopped because of it
    before = sorted((r for r in runs if r.id != run.id), key=lambda r: r.end_time or 0.0)
    ended = [(r.exit_code, r.state is RunState.LOST) for r in before] + [(exit_code, lost)]
    outcome = settle(job, ended, ck)
    message = outcome.message
    data = None
    if outcome.reason is EndReason.PREEMPTED:
        data = await preemption_cost(ctl, job, runs, now)
        message += (f"; GPUs free {data['time_to_free_s']:.1f} s after the decision"
                    + (f", {data['lost_gpu_s']:.0f} GPU-s of work since the last checkpoint lost"
                       if data["lost_gpu_s"] is not None else ""))
    await ctl.db(ctl.store.end_run, run, now, run_state=outcome.run_state(exit_code, lost), exit_code=exit_code,
                 reason=reason, job_fields=outcome.job_fields(job, now), event=(outcome.event, message),
                 event_data=data)
    ctl.forget(job.id)


async def preemption_cost(ctl: Controller, job: Job, runs: list[Run], now: float) -> dict[str, Any]:
    """What a preemption cost: time from the decision to GPUs free, and GPU-seconds of work done since the
    job's last checkpoint (the newest file in its checkpoint folder; the whole run if it never wrote one)."""
    plan = ctl.stops.get(job.id)
    decided = plan.decided_at if plan is not None else now
    gpus = sum(len(r.devices) for r in runs) or 1
    start = min((r.start_time for r in runs if r.start_time is not None), default=decided)
    newest: float | None = None
    rt = ctl.nodes.get(runs[0].node) if runs else None
    try:
        if rt is not None:
            path = await path_on(ctl, rt, job.id)
            async with asyncio.timeout(10):
                newest = await rt.executor.newest_mtime(path)
    except (ExecutorError, TimeoutError) as e:
        log.info("job %s: cannot read its checkpoint's age: %s", job.id, e)
    last_ck = max(start, newest) if newest is not None else start
    lost = max(0.0, now - last_ck) * gpus
    return {"time_to_free_s": round(now - decided, 3), "lost_gpu_s": round(lost, 1),
            "last_checkpoint": newest, "gpus": gpus}
