"""Watching runs: ask each node about its live runs, record what ended, decide the job's next state.

A job's attempt may have several runs (the ranks of a gang). When one rank fails the others are stopped
(stopping.py); when the attempt's last run has ended the job's state follows from why it stopped and the
exit codes, in the same transaction as that last run's end.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from hsched.controller.stopping import StopReason, begin_stop
from hsched.errors import ExecutorError
from hsched.executors.base import StatusQuery
from hsched.model import Job, JobState, NodeState, Run, RunReport, RunStatus

if TYPE_CHECKING:
    from hsched.controller.core import Controller
    from hsched.controller.fleet import NodeRuntime

log = logging.getLogger("hsched.watch")

LIVE = ("RUNNING", "LAUNCHING", "STOPPING")


async def watch_runs(ctl: Controller) -> bool:
    runs = [r for r in await ctl.db(ctl.store.live_runs) if r.id not in ctl.launching]
    if not runs:
        return False
    by_node: dict[str, list[Run]] = {}
    now = time.time()
    for r in runs:
        rt = ctl.nodes.get(r.node)
        if rt is not None and not answering(ctl, rt, now):
            continue  # its runs go on there; the lease decides when to give up on them
        by_node.setdefault(r.node, []).append(r)

    async def one_node(node: str, node_runs: list[Run]) -> list[tuple[NodeRuntime, Run, RunReport]]:
        rt = ctl.nodes.get(node)
        if rt is None:
            return []
        try:
            async with asyncio.timeout(15):
                reports = await rt.executor.status([StatusQuery(r.run_dir, r.handle) for r in node_runs])
        except (ExecutorError, TimeoutError) as e:
            log.warning("status from %s failed: %s", node, e)
            return []
        return [(rt, run, rep) for run, rep in zip(node_runs, reports, strict=True)]

    # one node's slowness must not hold up the others
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(one_node(n, rs)) for n, rs in by_node.items()]
    changed = False
    for t in tasks:
        for rt, run, rep in t.result():
            changed |= await on_report(ctl, rt, run, rep)
    return changed


def answering(ctl: Controller, rt: NodeRuntime, now: float) -> bool:
    """Worth asking: not known to be away, and (for monitored nodes) heard from a moment ago. A silent network
    cut must not stall the round on a status call that cannot be answered."""
    from hsched.controller.health import heartbeat

    if rt.node.state in (NodeState.UNREACHABLE, NodeState.DOWN):
        return False
    beat = heartbeat(rt, now)
    return beat is not None and now - beat <= 2 * ctl.settings.monitor_interval_s + 2.0


async def on_report(ctl: Controller, rt: NodeRuntime, run: Run, rep: RunReport) -> bool:
    now = time.time()
    async with ctl.lock:
        job = await ctl.db(ctl.store.get_job, run.job_id)
        if job is None:
            return False
        if rep.status is RunStatus.RUNNING:
            if run.state == "LAUNCHING" and rep.handle is not None:
                # adopted after a restart: the launch happened, its reply was lost with the old controller
                await ctl.db(ctl.store.run_launched, run, rep.handle, now)
                return True
            return False
        if rep.status is RunStatus.NOT_STARTED and run.state == "LAUNCHING":
            if job.state is JobState.LAUNCHING:
                # recorded but never launched (the controller died in between): launch it now, once
                ctl.spawn_launch(job, run)
                return False
        lost = rep.status is not RunStatus.EXITED
        await run_ended(ctl, job, run, now, exit_code=None if lost else rep.exit_code, lost=lost)
        return True


def _failed(code: int | None, lost: bool, ctl: Controller) -> bool:
    return lost or (code not in (0, ctl.settings.checkpoint_exit_code))


async def run_ended(ctl: Controller, job: Job, run: Run, now: float, *, exit_code: int | None, lost: bool) -> None:
    """Record one run's end; if it was the attempt's last, settle the job. Call with ctl.lock held."""
    runs = await ctl.db(ctl.store.attempt_runs, job.id, run.attempt)
    others_live = [r for r in runs if r.id != run.id and r.state in LIVE]
    run_state = "LOST" if lost else ("COMPLETED" if exit_code == 0 else "EXITED")
    rank = f" rank {run.rank}" if run.world > 1 else ""
    what = "lost: the process is gone and left no exit code" if lost else f"exited with code {exit_code}"
    if others_live:
        await ctl.db(ctl.store.end_run, run, now, run_state=run_state, exit_code=exit_code,
                     reason="lost" if lost else "", job_fields=None, event=("rank_ended", f"run{rank} {what}"))
        if _failed(exit_code, lost, ctl) and job.state in (JobState.RUNNING, JobState.LAUNCHING):
            await begin_stop(ctl, job, StopReason.RANK_FAILED,
                             f"rank {run.rank} {what}: stopping the other {len(others_live)} rank(s)")
        return
    # in the order they ended: a gang's first failure is its cause, the rest were stopped because of it
    before = sorted((r for r in runs if r.id != run.id), key=lambda r: r.end_time or 0.0)
    ended = [(r.exit_code, r.state == "LOST") for r in before] + [(exit_code, lost)]
    fields, ev = settle(ctl, job, now, ended)
    # the run's own record says why it ended, as the job's does (`hsched show` lists runs)
    why = str(fields.get("reason") or "")
    run_state = {"preempted": "PREEMPTED", "checkpointed": "CHECKPOINTED", "cancelled": "CANCELLED",
                 "timeout": "TIMEOUT"}.get(why, run_state)
    data = None
    if ev[0] == "preempted":
        data = await preemption_cost(ctl, job, runs, now)
        ev = (ev[0], f"{ev[1]}; GPUs free {data['time_to_free_s']:.1f} s after the decision"
              + (f", {data['lost_gpu_s']:.0f} GPU-s of work since the last checkpoint lost"
                 if data["lost_gpu_s"] is not None else ""))
    await ctl.db(ctl.store.end_run, run, now, run_state=run_state, exit_code=exit_code,
                 reason="lost" if lost else "", job_fields=fields, event=ev, event_data=data)
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
            from hsched.controller.checkpoints import path_on

            path = await path_on(ctl, rt, job.id)
            async with asyncio.timeout(10):
                newest = await rt.executor.newest_mtime(path)  # type: ignore[attr-defined]
    except (ExecutorError, TimeoutError, AttributeError) as e:
        log.info("job %s: cannot read its checkpoint's age: %s", job.id, e)
    last_ck = max(start, newest) if newest is not None else start
    lost = max(0.0, now - last_ck) * gpus
    return {"time_to_free_s": round(now - decided, 3), "lost_gpu_s": round(lost, 1),
            "last_checkpoint": newest, "gpus": gpus}


def settle(ctl: Controller, job: Job, now: float,
           ended: list[tuple[int | None, bool]]) -> tuple[dict[str, Any], tuple[str, str]]:
    """The job's next state from why it was stopping and how its runs ended."""
    codes = [c for c, _ in ended]
    any_lost = any(lost for _, lost in ended)
    ck = ctl.settings.checkpoint_exit_code
    bad = [c for c, lost in ended if not lost and c not in (0, ck)]
    code = bad[0] if bad else next((c for c in codes if c is not None), None)
    requeue = {"state": JobState.PENDING, "restarts": job.restarts + 1, "exit_code": code, "placement": (),
               "end_time": None}
    stopping = job.reason if job.state in (JobState.PREEMPTING, JobState.COMPLETING) else ""
    if stopping == StopReason.CANCELLED:
        return ({"state": JobState.CANCELLED, "reason": "cancelled", "end_time": now, "exit_code": code},
                ("ended", f"cancelled (exit code {code})"))
    if stopping == StopReason.TIMEOUT:
        return ({"state": JobState.TIMEOUT, "reason": "timeout", "end_time": now, "exit_code": code},
                ("ended", f"time limit reached (exit code {code})"))
    if stopping == StopReason.PREEMPTED:
        if all(c == 0 for c in codes) and not any_lost:
            return ({"state": JobState.COMPLETED, "reason": "completed", "end_time": now, "exit_code": 0},
                    ("ended", "completed while being preempted"))
        return ({**requeue, "reason": "preempted"},
                ("preempted", f"preempted (exit code {code}); requeued, restarts {job.restarts + 1}"))
    if bad:
        reason = "rank_failed" if stopping == StopReason.RANK_FAILED else (
            "signaled" if bad[0] >= 128 else "nonzero_exit")
        return ({"state": JobState.FAILED, "reason": reason, "end_time": now, "exit_code": bad[0]},
                ("ended", f"failed (exit code {bad[0]})"))
    if any_lost:
        return ({"state": JobState.LOST, "reason": "lost", "end_time": now, "exit_code": None},
                ("lost", "run lost: the process is gone and left no exit code"))
    if ck in codes:
        return ({**requeue, "reason": "checkpointed"},
                ("requeued", f"exited with the checkpoint code {ck}: requeued, restarts {job.restarts + 1}"))
    return ({"state": JobState.COMPLETED, "reason": "completed", "end_time": now, "exit_code": 0},
            ("ended", "completed (exit code 0)"))
