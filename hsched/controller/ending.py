"""A run ended: record it, and when it was its attempt's last, settle the job (hsched.lifecycle.settle).

A job's attempt may have several runs (the ranks of a gang). When one rank fails the others are stopped
(stopping.py); when the attempt's last run has ended the job's state follows from why it stopped and the
exit codes, in the same transaction as that last run's end.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace
from typing import Any

from hsched.config import Settings
from hsched.controller import hetjobs, learning, moves
from hsched.controller.checkpoints import path_on
from hsched.controller.core import Controller
from hsched.controller.stopping import begin_stop
from hsched.controller.store import Store
from hsched.controller.visible import LOG_LINE
from hsched.errors import ExecutorError
from hsched.lifecycle import EndRules, StopReason, ended_run_state, failed, settle, taken
from hsched.model import EndReason, GpuHolder, Job, JobState, Run, RunState
from hsched.serialize import spec_to_dict
from hsched.spec.constraints import node_labels

log = logging.getLogger("hsched.ending")


def end_rules(settings: Settings) -> EndRules:
    return EndRules(checkpoint_exit_code=settings.checkpoint_exit_code, retries=settings.retries,
                    fatal_exit_codes=frozenset(settings.fatal_exit_codes), max_restarts=settings.max_restarts,
                    backoff_s=settings.retry_backoff_s, backoff_max_s=settings.retry_backoff_max_s)


def true_end(run: Run, reported: float | None, now: float) -> float:
    """When the run ended: the node's exit record, not the moment the controller noticed (which may be after a
    downtime). Clamped to [start, now], so a node whose clock runs ahead or behind cannot put an end in the
    future or before the start."""
    if reported is None:
        return now
    return max(run.start_time or reported, min(reported, now))


async def run_ended(ctl: Controller, job: Job, run: Run, now: float, *, exit_code: int | None, lost: bool,
                    ended_at: float | None = None, oom: bool = False, gpu_left: tuple[GpuHolder, ...] = (),
                    gpu_oom: str | None = None, runs: list[Run] | None = None) -> None:
    """Record one run's end; if it was the attempt's last, settle the job. Call with ctl.lock held.
    `ended_at`: the node's record of when it ended (else `now`); `oom`: the kernel killed it for memory;
    `gpu_left`: processes still on its GPUs after all of the run's were gone (those GPUs become dirty);
    `gpu_oom`: the line of its log that says a GPU ran out of memory. That line is the job's private output
    (a 0600 file of its user): it is kept in the events' figures under LOG_LINE, never in their messages, so
    that `hsched events`/`show` give it to the job's owner and admins only (hsched.controller.visible). `runs`: the
    attempt's runs as the store has them now, when the caller read them already (under the same lock)."""
    end = true_end(run, ended_at, now)
    # (a shared GPU's other runs and its MPS server are not this run's leftovers: the node helper leaves them out)
    if gpu_left:
        await mark_dirty(ctl, job, run, gpu_left, now)
    if runs is None:
        runs = await ctl.db(ctl.store.attempt_runs, job.id, run.attempt)
    others_live = [r for r in runs if r.id != run.id and r.state.is_live()]
    rank = f" rank {run.rank}" if run.world > 1 else ""
    if job.spec.components:
        rank = f" of {hetjobs.name(job.spec, run.rank)}"  # a heterogeneous job: the component named
    what = "lost: the process is gone and left no exit code" if lost else f"exited with code {exit_code}"
    if oom:
        what += " (out of memory: killed by the kernel)"
    elif gpu_oom and not lost:
        what += " (out of GPU memory)"
    private: dict[str, Any] | None = {LOG_LINE: gpu_oom} if gpu_oom and not lost and not oom else None
    reason = (EndReason.LOST.value if lost else EndReason.OOM.value if oom
              else EndReason.GPU_OOM.value if gpu_oom else "")
    ck = ctl.settings.checkpoint_exit_code
    if others_live:
        if (job.spec.components and not reason and failed(exit_code, lost, ck)
                and job.state in (JobState.RUNNING, JobState.LAUNCHING)):
            reason = EndReason.NONZERO_EXIT.value  # the component whose failure ends the others (named at the end)
        await ctl.db(ctl.store.end_run, run, now, run_state=ended_run_state(exit_code, lost), exit_code=exit_code,
                     reason=reason, job_fields=None, event=("rank_ended", f"run{rank} {what}"),
                     event_data=private, ended_at=end)
        if failed(exit_code, lost, ck) and job.state in (JobState.RUNNING, JobState.LAUNCHING):
            await begin_stop(ctl, job, StopReason.RANK_FAILED,
                             f"rank {run.rank} {what}: stopping the other {len(others_live)} rank(s)"
                             if not job.spec.components else
                             f"{hetjobs.name(job.spec, run.rank)} {what}: stopping the other components' "
                             f"{len(others_live)} run(s)")
        return
    # in the order they ended: a gang's first failure is its cause, the rest were stopped because of it
    before = sorted((r for r in runs if r.id != run.id), key=lambda r: r.end_time or 0.0)
    ended = [(r.exit_code, r.state is RunState.LOST) for r in before] + [(exit_code, lost)]
    oom_any = oom or any(r.reason == EndReason.OOM for r in before)
    gpu_oom_any = bool(gpu_oom) or any(r.reason == EndReason.GPU_OOM for r in before)
    outcome = settle(job, ended, end_rules(ctl.settings), end, oom=oom_any, gpu_oom=gpu_oom_any and not oom_any)
    message = outcome.message
    if job.spec.components and outcome.state in (JobState.FAILED, JobState.PENDING):
        # a heterogeneous job's end names the component whose failure ended it (the first to fail)
        cause = next((r for r in before if r.reason), None) or next(
            (r for r in [*before, run] if failed(r.exit_code if r is not run else exit_code,
                                                 (r.state is RunState.LOST) if r is not run else lost, ck)), None)
        if cause is not None:
            code = cause.exit_code if cause is not run else exit_code
            message = (f"{hetjobs.name(job.spec, cause.rank)} "
                       f"{'was lost' if code is None else f'exited with code {code}'}; {message}")
    data: dict[str, Any] = {"end_time": end}
    if gpu_oom and outcome.reason in (EndReason.GPU_OOM, EndReason.RETRY_BACKOFF):
        data[LOG_LINE] = gpu_oom
    if outcome.begin_time is not None:
        data["begin_time"] = outcome.begin_time
    if outcome.reason is EndReason.PREEMPTED:
        data.update(await preemption_cost(ctl, job, runs, now))
        message += (f"; GPUs free {data['time_to_free_s']:.1f} s after the decision"
                    + (f", {data['lost_gpu_s']:.0f} GPU-s of work since the last checkpoint lost"
                       if data["lost_gpu_s"] is not None else ""))
    # (a completed job's runs and their stored usage read in the same call, after its end: one store round trip of
    # the event loop fewer)
    completed = outcome.state is JobState.COMPLETED
    afterwards = await ctl.db(_end_run, ctl.store, job.id if completed else None, run, now,
                              run_state=outcome.run_state(exit_code, lost), exit_code=exit_code, reason=reason,
                              job_fields=outcome.job_fields(job, end), event=(outcome.event, message),
                              event_data=data, ended_at=end)
    ctl.forget(job.id)
    if outcome.begin_time is not None:
        # the backoff on the monotonic timeline from now on (Controller.retry_at): what is left of it as the wall
        # clock says at this moment, converted once
        ctl.not_before[job.id] = (outcome.begin_time,
                                  ctl.timeline.now() + max(0.0, min(outcome.begin_time - now,
                                                                    ctl.settings.retry_backoff_max_s)))
    # a checkpoint exit proves the job checkpoints: the policy may move it from now on (hsched.controller.moves)
    moves.note_ended(ctl, job, [c for c, _lost in ended], data)
    if outcome.state.is_terminal():
        moves.forget(ctl, job.id)
    if gpu_oom_any and outcome.reason is EndReason.RETRY_BACKOFF:
        await more_gpu_memory(ctl, job, [*before, run], now)
    if completed and afterwards is not None:
        # its running time, all attempts (rank 0's runs), for what the next jobs of its kind are expected to take
        every, stored = afterwards
        running = sum(max(0.0, (r.end_time or end) - r.start_time) for r in every
                      if r.rank == 0 and r.start_time is not None)
        ctl.spawn(learning.note_end(ctl, job, running, end, await memory_peaks(ctl, job, stored)))


async def run_taken(ctl: Controller, job: Job, run: Run, now: float, cause: EndReason,
                    ended_at: float | None = None, runs: list[Run] | None = None) -> None:
    """The node ended the run itself, through no fault of the run (`cause`: NODE_LOST, its node failed under it;
    PREEMPTED, the node's own scheduler preempted it: a Slurm group's NODE_FAIL and PREEMPTED). The job is
    requeued without using a retry, as when a node stays away past its lease; a gang's other ranks are stopped
    first, to requeue it whole. Nothing is left to kill (the node has ended it). Call with ctl.lock held."""
    end = true_end(run, ended_at, now)
    what = (f"preempted by {run.node}'s own scheduler" if cause is EndReason.PREEMPTED
            else f"its node failed under it ({run.node})")
    state = RunState.PREEMPTED if cause is EndReason.PREEMPTED else RunState.LOST
    if runs is None:
        runs = await ctl.db(ctl.store.attempt_runs, job.id, run.attempt)
    others_live = [r for r in runs if r.id != run.id and r.state.is_live()]
    if others_live:
        await ctl.db(ctl.store.end_run, run, now, run_state=state, exit_code=None, reason=cause.value,
                     job_fields=None, event=("rank_ended", f"rank {run.rank}: {what}"), ended_at=end)
        if job.state in (JobState.RUNNING, JobState.LAUNCHING):
            await begin_stop(ctl, job, StopReason.PREEMPTED,
                             f"rank {run.rank} {what}: stopping the other {len(others_live)} rank(s) to requeue")
        return
    outcome = taken(job, cause, what)
    await ctl.db(ctl.store.end_run, run, now, run_state=state if outcome.requeued else outcome.run_state(None, True),
                 exit_code=None, reason=cause.value, job_fields=outcome.job_fields(job, end),
                 event=(outcome.event, outcome.message), ended_at=end)
    ctl.forget(job.id)


def _end_run(store: Store, completed: int | None, run: Run, now: float, **fields: Any
             ) -> tuple[list[Run], list[dict[str, Any]]] | None:
    """`Store.end_run`, then for a completed job (`completed`: its id) its runs and their stored usage."""
    store.end_run(run, now, **fields)
    return (store.runs(completed), store.run_usage(completed)) if completed is not None else None


async def memory_peaks(ctl: Controller, job: Job, stored: list[dict[str, Any]] | None = None
                       ) -> tuple[int | None, int | None]:
    """The job's GPU and host memory peaks (MiB) from the samples folded while it ran (hsched.learn.efficiency);
    `stored`: its runs' stored usage (`Store.run_usage`), when read already."""
    from hsched.controller.usage import tallies_of
    from hsched.learn.efficiency import figures

    if stored is None:
        stored = await ctl.db(ctl.store.run_usage, job.id)
    f = figures(tallies_of(ctl, job.id, stored))
    peak = max((g.memory_peak_mib for g in f.gpus if g.memory_peak_mib is not None), default=None)
    return peak, f.host_memory_peak_mib


async def more_gpu_memory(ctl: Controller, job: Job, runs: list[Run], now: float) -> None:
    """A job that ran out of GPU memory is retried on GPUs with more memory than the smallest it had, when the
    fleet has such GPUs (its request is raised, and says so); else on what there is, as before."""
    held = {u for r in runs for u in r.devices}
    sizes = [d.memory_total_mib for rt in ctl.nodes.values() for d in rt.node.devices if d.memory_total_mib]
    had = [d.memory_total_mib for r in runs if (rt := ctl.nodes.get(r.node)) is not None
           for d in rt.node.devices if d.uuid in held and d.memory_total_mib]
    if not had:
        return
    want = min(had) + 1
    res = job.spec.resources
    if res.gpu_memory_mib is not None and res.gpu_memory_mib >= want:
        return
    raised = replace(res, gpu_memory_mib=want)
    # the submit's own check, with the raised request: a bigger GPU the job may not use (another model than its
    # --gpu-type, a node its constraint excludes, too few on one node) would leave it waiting for ever
    from hsched.sched.live import unsatisfiable

    known = [rt.node for rt in ctl.nodes.values() if rt.last_ok is not None or rt.config.simulate]
    labels = {rt.name: node_labels(rt.name, rt.config.labels, raised.constraint) for rt in ctl.nodes.values()}
    why = None if not any(s >= want for s in sizes) else unsatisfiable(raised, known, labels=labels,
                                                                       aliases=ctl.settings.gpu_aliases)
    if not any(s >= want for s in sizes) or why is not None:
        where = "the fleet" if why is None else "the GPUs this job may use"
        await ctl.db(ctl.store.add_event, now, "gpu_oom",
                     f"out of GPU memory on {min(had) / 1024:.0f} GiB GPUs; no GPU of {where} has more: the retry "
                     "runs on the same size", job_id=job.id)
        return
    spec = replace(job.spec, resources=raised)
    await ctl.db(ctl.store.set_job, job.id, now, spec=json.dumps(spec_to_dict(spec)),
                 event=("gpu_oom", f"out of GPU memory on {min(had) / 1024:.0f} GiB GPUs: its retry asks for more "
                                   f"than that (--gpu-memory raised to {want} MiB)"),
                 event_data={"had_mib": min(had), "asks_mib": want})
    ctl.forget(job.id)


async def mark_dirty(ctl: Controller, job: Job, run: Run, holders: tuple[GpuHolder, ...], now: float) -> None:
    """GPUs of an ended run that a process outside it still uses: not handed out again until that process is
    gone (hsched does not kill what it did not start; a person or the process's owner must)."""
    by_uuid: dict[str, list[GpuHolder]] = {}
    for h in holders:
        by_uuid.setdefault(h.uuid, []).append(h)
    for uuid, hs in by_uuid.items():
        who = ", ".join(f"pid {h.pid}" + (f" ({h.name})" if h.name else "") for h in hs)
        msg = (f"GPU {uuid} on {run.node} is still used by {who} after job {job.id}'s run ended: "
               "not scheduled until that process is gone")
        log.warning("%s", msg)
        await ctl.db(ctl.store.mark_dirty, run.node, uuid, [h.pid for h in hs], msg, now, job.id)


async def preemption_cost(ctl: Controller, job: Job, runs: list[Run], now: float) -> dict[str, Any]:
    """What a preemption cost: time from the decision to GPUs free, and GPU-seconds of work done since the
    job's last checkpoint (the newest file in its checkpoint folder; the whole run if it never wrote one)."""
    plan = ctl.stops.get(job.id)
    # (the decision's time is on the controller's timeline, as the stop plan's steps)
    at = ctl.timeline.now()
    decided = plan.decided_at if plan is not None else at
    gpus = sum(len(r.devices) for r in runs) or 1
    start = min((r.start_time for r in runs if r.start_time is not None), default=ctl.timeline.wall(decided))
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
    return {"time_to_free_s": round(at - decided, 3), "lost_gpu_s": round(lost, 1),
            "last_checkpoint": newest, "gpus": gpus}
