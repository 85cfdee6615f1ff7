"""Watching runs: ask each node about its live runs, record what ended, relaunch what was never started."""

from __future__ import annotations

import asyncio
import logging

from hsched.controller import usage
from hsched.controller.core import Controller
from hsched.controller.ending import run_ended, run_taken
from hsched.controller.fleet import NodeRuntime
from hsched.controller.launching import spawn_launch
from hsched.controller.state import RunGroup
from hsched.controller.store import Store
from hsched.errors import ExecutorError
from hsched.executors.base import StatusQuery
from hsched.model import EndReason, Job, JobState, NodeState, Run, RunReport, RunState, RunStatus

log = logging.getLogger("hsched.watch")


async def watch_runs(ctl: Controller) -> bool:
    # (the runs grouped by node with their queries on the store's thread, each node's made again only when its runs
    # changed; issue 33)
    live, groups = await ctl.db(ctl.state.live_runs.read_grouped, ctl.store)
    being_launched = ctl.launching
    if being_launched and any(r.id in being_launched for r in live):
        # (a run being launched is not asked about: the groups without it, in the order of their first run left)
        regrouped: dict[str, list[Run]] = {}
        for r in live:
            if r.id not in being_launched:
                regrouped.setdefault(r.node, []).append(r)
        groups = {n: RunGroup(tuple(rs), tuple(StatusQuery(r.run_dir, r.handle) for r in rs))
                  for n, rs in regrouped.items()}
    if not groups:
        return False
    now = ctl.clock.monotonic()
    by_node: dict[str, RunGroup] = {}
    for node, group in groups.items():
        rt = ctl.nodes.get(node)
        if rt is None or answering(ctl, rt, now):
            by_node[node] = group
        # (else its runs go on there; the lease decides when to give up on them)

    async def one_node(node: str, group: RunGroup) -> tuple[NodeRuntime | None, tuple[Run, ...], list[RunReport]]:
        rt = ctl.nodes.get(node)
        if rt is None:
            return None, (), []
        try:
            reports = await rt.executor.status(list(group.queries))
        except (ExecutorError, TimeoutError) as e:
            log.warning("status from %s failed: %s", node, e)
            return None, (), []
        if len(reports) != len(group.runs):
            raise ValueError(f"status from {node}: {len(reports)} reports for {len(group.runs)} runs")
        return rt, group.runs, reports

    # one node's slowness must not hold up the others: each node asked in a task of its own, all within one
    # STATUS_TIMEOUT_S (they start together: one deadline is each node's; a TaskGroup and a timeout per node were
    # ~0.4 ms of the event loop a poll on 64 nodes, issue 33)
    tasks = {asyncio.create_task(one_node(n, g)): n for n, g in by_node.items()}
    late: set[asyncio.Task[tuple[NodeRuntime | None, tuple[Run, ...], list[RunReport]]]] = set()
    try:
        if tasks:  # (none when no node with runs answers)
            _done, late = await asyncio.wait(tasks, timeout=STATUS_TIMEOUT_S)
    finally:
        for t in tasks:
            t.cancel()  # (done ones ignore it; on our own cancellation, none is left behind)
    for t in late:
        log.warning("status from %s failed: %s", tasks[t], f"no answer in {STATUS_TIMEOUT_S:g} s")
    changed = False
    running, launching = RunStatus.RUNNING, RunState.LAUNCHING
    starts = ctl.attempt_start
    # (every answer first: a node's unexpected error fails the watch before any report is acted on, each error
    # retrieved)
    answered = [t for t in tasks if t not in late]
    errors = [e for t in answered if (e := t.exception()) is not None]
    if errors:
        raise errors[0]
    for t in answered:
        rt, node_runs, reports = t.result()
        if rt is None:
            continue
        for run, rep in zip(node_runs, reports, strict=True):
            if rep.status is running and run.state is not launching:
                # on_report's common case, inline: a coroutine per running run each poll was ~2 ms on the loop;
                # and note_start's own common case (a run started and known: nothing to note), without a call
                if run.rank == 0 and (rep.queued or rep.started_at is not None
                                      or (run.job_id not in starts and run.start_time is not None)):
                    note_start(ctl, run, rep)
                continue
            changed |= await on_report(ctl, rt, run, rep)
    return changed


STATUS_TIMEOUT_S = 15.0
"""How long the watch waits for a node's answer about its runs: a node that does not answer by then is asked
again next poll (its runs go on; the lease decides when to give up on them)."""


def answering(ctl: Controller, rt: NodeRuntime, now: float) -> bool:
    """Worth asking: not known to be away, and (for monitored nodes) heard from a moment ago. A silent network
    cut must not stall the round on a status call that cannot be answered. `now`: the monotonic clock, as the
    heartbeat's."""
    if rt.node.state in (NodeState.UNREACHABLE, NodeState.DOWN):
        return False
    beat = rt.heartbeat(now)
    return beat is not None and now - beat <= 2 * ctl.settings.monitor_interval_s + 2.0


TAKEN_CAUSES = frozenset({EndReason.NODE_LOST, EndReason.PREEMPTED})
"""A lost run's causes that are no fault of the run: requeued without using a retry."""


def note_start(ctl: Controller, run: Run, rep: RunReport) -> None:
    """The attempt's time limit counts from when its node really started it: a run still waiting in its node's
    own queue (a Slurm job pending) has not started, so its clock starts again at every report until it has;
    a node that says when it started it (Slurm's StartTime) is believed, within [launch, now]. On the controller's
    timeline: the node's StartTime (its wall clock) is converted once, at the first report that carries it, so a
    step of either wall clock afterwards moves no time limit."""
    if run.rank != 0:
        return
    if run.job_id not in ctl.attempt_start and run.start_time is not None and not rep.queued:
        # a run a previous controller launched, adopted: its attempt's clock from its own recorded start (the
        # job's start_time is its first attempt's), converted once onto the timeline
        ctl.attempt_start[run.job_id] = ctl.timeline.since(run.start_time)
    if not (rep.queued or rep.started_at is not None):
        return
    if rep.queued:
        ctl.attempt_start[run.job_id] = ctl.timeline.now()
        ctl.start_reported.discard(run.job_id)
    elif rep.started_at is not None and run.job_id not in ctl.start_reported:
        since = ctl.timeline.since
        launched = since(run.start_time) if run.start_time is not None else None
        started = since(rep.started_at)
        ctl.attempt_start[run.job_id] = started if launched is None else max(launched, started)
        ctl.start_reported.add(run.job_id)


async def on_report(ctl: Controller, rt: NodeRuntime, run: Run, rep: RunReport) -> bool:
    if rep.status is RunStatus.RUNNING:
        note_start(ctl, run, rep)
    if rep.status is RunStatus.RUNNING and run.state is not RunState.LAUNCHING:
        # the common case, every poll for every running run: nothing to record, so no lock and no store reads
        # (with 512 runs going, reading each run and job again cost ~270 ms of CPU a poll)
        return False
    now = ctl.clock.time()
    async with ctl.lock:
        # the report answers a question asked before the lock: the run may have been settled meanwhile (given up
        # past its node's lease and its job requeued, or ended by another report); a stale answer changes nothing
        # (the run, its job and its attempt's runs in one call on the store's thread: each call is ~70 us of the
        # event loop's CPU)
        current, job, attempt = await ctl.db(_run_and_job, ctl.store, run.id, run.job_id, run.attempt)
        if current is None or not current.state.is_live() or current.state is not run.state:
            return False
        if job is None:
            return False
        if rep.status is RunStatus.RUNNING:
            if run.state is RunState.LAUNCHING and rep.handle is not None:
                # adopted after a restart: the launch happened, its reply was lost with the old controller
                await ctl.db(ctl.store.run_launched, run, rep.handle, now)
                return True
            return False
        if rep.status is RunStatus.NOT_STARTED and run.state is RunState.LAUNCHING:
            if job.state is JobState.LAUNCHING:
                # recorded but never launched (the controller died in between): launch it now, once
                spawn_launch(ctl, job, run)
                return False
        lost = rep.status is not RunStatus.EXITED
        if lost and rep.cause is not None and rep.cause in TAKEN_CAUSES:
            await run_taken(ctl, job, run, now, rep.cause, rep.end_time, runs=attempt)
            return True
        if rep.usage is not None:  # what the run used, by its exit record: in its tally before the end is kept
            usage.final_usage(ctl, run.job_id, run.attempt, run.node, run.rank, rep.usage, now)
        await run_ended(ctl, job, run, now, exit_code=None if lost else rep.exit_code, lost=lost,
                        ended_at=rep.end_time, oom=rep.oom, gpu_left=rep.gpu_left, gpu_oom=rep.gpu_oom,
                        runs=attempt)
        return True


def _run_and_job(store: Store, run_id: int, job_id: int, attempt: int) -> tuple[Run | None, Job | None, list[Run]]:
    """The run, its job and its attempt's runs as the store has them now (on the store's thread)."""
    return store.get_run(run_id), store.get_job(job_id), store.attempt_runs(job_id, attempt)
