"""Scheduling and launching: ask the pure scheduler for decisions, record them, then act on them.

A round has three steps, and holds the controller's lock only for the first and the last:

1. under the lock, a snapshot (`RoundInput`): the jobs it may start, the fleet as a frozen `FleetView`;
2. without the lock, the pure round (hsched.sched.live.schedule) in a worker thread, so that requests (`ping`,
   `queue`, `submit`, `cancel`) are answered while it computes;
3. under the lock again, each decision checked against what happened meanwhile (`still_valid`): one about a job
   that changed (cancelled, held, requeued), a node that went away or was drained, devices taken, or a victim
   that is no longer running as it was, is dropped and left to the next round; the rest are recorded.

Order matters for "never launch twice": the runs (one per rank, each with its run folder) are committed
as LAUNCHING before the executor is asked to start anything; the run folder is the node's launch lock.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import sys
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from hsched.config import beyond_limits
from hsched.controller import data, hetjobs, learning, moves, resizing
from hsched.controller.checkpoints import bring_along, is_shared, path_on, sees
from hsched.controller.core import Controller
from hsched.controller.ending import run_ended
from hsched.controller.fleet import NodeRuntime
from hsched.controller.jobcache import JobCache, Jobs, _changes, _jobs_now, job_cache  # noqa: F401  (re-exported)
from hsched.controller.metrics import note_round
from hsched.controller.shares import round_usage
from hsched.controller.state import ControllerState
from hsched.controller.stopping import begin_stop, send
from hsched.controller.store import no_room
from hsched.errors import ExecutorError
from hsched.executors.base import LaunchRequest
from hsched.lifecycle import Outcome, StopReason
from hsched.model import EndReason, Job, JobState, NodeState, Placement, Run, RunState
from hsched.sched.cache import RoundCache
from hsched.sched.limits import QosLimits
from hsched.sched.live import (
    Decision,
    FleetView,
    Launch,
    Move,
    Preempt,
    PreemptRule,
    Running,
    Wait,
    gpu_type_of,
    prefetch_targets,
    schedule,
)
from hsched.sched.stages.elastic import Resize
from hsched.sched.throughput import ThroughputModel
from hsched.serialize import job_kind
from hsched.spec import outfiles
from hsched.spec.arrays import within_limits
from hsched.spec.constraints import node_labels
from hsched.spec.dependencies import DepState, named_jobs, verdict
from hsched.topo.fabric import network_env

log = logging.getLogger("hsched.launch")
T = TypeVar("T")


async def run_round(ctl: Controller) -> bool:
    """One round: decisions from the pure scheduler, recorded, then launches and preemptions started."""
    started = time.perf_counter()
    preemptions = 0
    try:
        changed, preemptions = await _run_round(ctl)
    finally:
        note_round(ctl, time.perf_counter() - started, preemptions)
    return changed


@dataclass(frozen=True, slots=True)
class RoundInput:
    """What one round decides over, read under the controller's lock: an immutable snapshot, so the pure round can
    run in a worker thread while requests are answered and the state moves on."""

    now: float
    """Wall time: what the round records (runs' starts, reasons)."""
    at: float
    """The same moment on the controller's timeline (Controller.timeline): what the pure round decides on, as its
    running jobs' starts and predicted ends are counted there (a step of the wall clock moves none of them)."""
    view: FleetView
    pending: tuple[Job, ...]
    """The jobs the round may start, as the store had them (the very objects `JobCache` keeps for unchanged rows)."""
    active: Mapping[int, Job]
    """Every job holding devices, by id."""
    by_id: Mapping[int, Job]
    """The pending jobs by id."""
    mark: int
    """The store's change count when the jobs were read (`_changes`): still the same, no job changed since."""
    prefetch_horizon_s: float | None = None
    """Settings' `prefetch_horizon_s` when prefetch is on and some waiting job names datasets; else None."""
    cache: RoundCache | None = None
    """The controller's round cache (`Controller.round_cache`): what the last round kept for this one."""
    finish: Finish | None = None
    """What is left to count of `view` (`fleet_view_later`), in the round's thread; None: `view` is whole."""

    def whole(self) -> RoundInput:
        """This input with its view counted whole."""
        return self if self.finish is None else replace(self, view=self.finish(self.view), finish=None)


SWITCH_INTERVAL_S = 0.001
"""The interpreter's thread switch interval once a round has run (CPython's default is 5 ms): how long the event
loop may wait for the round's thread to hand over the GIL when a request comes in. At 5 ms a `ping` during a round
took 6 ms at the median (bench_live.py), at 1 ms 2 ms, for no measurable cost to the round."""


def _round_thread_started() -> None:
    sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))


_ROUNDS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hsched-round", initializer=_round_thread_started)
"""The thread the pure round runs in: off the event loop (a request is answered while a round computes), one
round at a time, and apart from the store's thread and asyncio's default pool (launches' file work)."""


async def off_loop(fn: Callable[[], T]) -> T:
    """`fn()` in the round's thread, as a round: off the event loop, and never at the same time as a round (the
    round's caches between rounds are module state: hsched.sched.live). For forecasts (hsched.controller.forecast)."""
    return await asyncio.get_running_loop().run_in_executor(_ROUNDS, fn)


def _compute(inp: RoundInput) -> tuple[list[Decision], list[tuple[int, str, tuple[str, ...]]], RoundInput,
                                       list[Decision]]:
    """The pure round, in the round's thread, with the cyclic garbage collector paused: a round makes ~10,000
    short-lived objects, and a collection in the middle of one would promote those alive at that moment towards the
    oldest generation, whose full collections (every minute or so, ~45 ms over a 2,000-job heap) then fell inside
    rounds. Paused, they are freed as the round drops them (reference counting); anything cyclic is collected after,
    as ever. Returns the input too, with its view counted whole (`RoundInput.finish`), and the decisions that act
    (`acting_of`)."""
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        inp = inp.whole()
        decisions = schedule(inp.view, inp.pending, inp.at, cache=inp.cache)
        targets: list[tuple[int, str, tuple[str, ...]]] = []
        if inp.view.data_at and inp.prefetch_horizon_s is not None:
            # the copies that put waiting jobs' data where they are predicted to start (issue 15, item 2)
            # the waiting jobs in the order the round served them (the policy's): who is ahead of whom
            waiting = [inp.by_id[d.job_id] for d in decisions if isinstance(d, Wait) and d.job_id in inp.by_id]
            targets = prefetch_targets(inp.view, waiting, inp.at, inp.prefetch_horizon_s, served=True)
        return decisions, targets, inp, acting_of(inp, decisions)
    finally:
        if paused:
            gc.enable()


async def _run_round(ctl: Controller) -> tuple[bool, int]:
    async with ctl.lock:
        inp = await round_input(ctl, later=True)
    if inp is None:
        return False, 0
    # the pure part, without the lock: submits, cancels and drains go on meanwhile; what they change is checked
    # below before anything is applied
    decisions, targets, whole, act = await asyncio.get_running_loop().run_in_executor(_ROUNDS, _compute, inp)
    inp = whole  # (its view counted whole)
    launches: list[tuple[Job, list[Run]]] = []
    async with ctl.lock:
        valid = await still_valid(ctl, inp, act)
        # the round's writes in order, each run of them between two decisions that act on the loop (a preemption, a
        # move) in one call on the store's thread: each call is ~70 us of the event loop's CPU (issue 33); the waits'
        # new reasons first, in one transaction (a storm or a fresh queue changes 2,000 at once: one commit each was
        # one fsync each), then the launches' runs and the failures, as the decisions come
        writes: list[tuple[Job | None, Callable[[], object]]] = []
        reasons = [(d.job_id, d.reason) for d in act if d.job_id in valid and isinstance(d, Wait)]
        if reasons:
            writes.append((None, functools.partial(ctl.store.set_reasons, reasons)))

        async def flush() -> None:
            if writes:
                # (in one transaction: one commit, not one per launch)
                done = await ctl.db(ctl.store.in_one, [w for _job, w in writes])
                launches.extend((job, runs) for (job, _w), runs in zip(writes, done, strict=True) if job is not None)
                writes.clear()

        # (over the decisions that act only: the others, 2,000 waits repeating their reasons, were three passes on
        # the event loop; issue 33)
        for d in act:
            if d.job_id not in valid:
                continue  # a wait with nothing new to say, or a decision that no longer holds
            if isinstance(d, Resize):
                await flush()
                await resizing.apply(ctl, inp.active[d.job_id], d)  # (an elastic job's: a move with a size)
                continue
            if isinstance(d, Move):
                await flush()
                await moves.apply(ctl, inp.active[d.job_id], d)
                continue
            job = inp.by_id[d.job_id]
            if isinstance(d, Wait):
                continue  # (its reason is written above)
            if isinstance(d, Preempt):
                # (the preemptor's reason with the writes before it, in their transaction)
                writes.append((None, functools.partial(ctl.store.set_job, job.id, inp.now,
                                                       reason=EndReason.PREEMPTING.value, event=("preempts", d.why))))
                await flush()
                if d.placements:  # (a time-sharing stop's devices: held for the job it makes room for)
                    moves.hold_for(ctl, job.id, d.placements, [inp.active[v] for v in d.victims])
                for victim_id in d.victims:
                    victim = inp.active[victim_id]
                    await begin_stop(ctl, victim, StopReason.PREEMPTED,
                                     f"preempted by job {job.id} ({job.spec.qos}): "
                                     f"SIG{victim.spec.checkpoint_signal.signal}, "
                                     f"{victim.spec.checkpoint_signal.grace_s:g} s to checkpoint")
                continue
            assert isinstance(d, Launch)
            over = beyond_limits(job.spec, ctl.settings)
            if over:
                # queued before the request bounds existed (or before an admin lowered them): ended with the reason,
                # never a million run rows made under the lock
                writes.append((None, functools.partial(
                    ctl.store.set_job, job.id, inp.now, state=JobState.FAILED, reason=EndReason.LAUNCH_FAILED.value,
                    end_time=inp.now,
                    event=("ended", f"failed: the job is over the controller's request bounds: {over[0]}"))))
                continue
            ranks = []
            tpn = job.spec.resources.tasks_per_node
            attempt = job.restarts + 1
            for node_rank, p in enumerate(d.placements):
                for local in range(tpn):
                    rank = node_rank * tpn + local
                    run_dir = str(ctl.run_folder(job, p.node) / f"{job.id}-{attempt}-r{rank}-{int(inp.now * 1000)}")
                    ranks.append((p, run_dir))
            if job.spec.components:
                ranks = hetjobs.run_ranks(ctl, job, d.placements, inp.now)  # each component's tasks per node
            writes.append((job, functools.partial(ctl.store.start_runs, job, ranks, inp.now, d.placements)))
        await flush()
    for job, runs in launches:
        ctl.attempt_start[job.id] = ctl.timeline.now()
        for run in runs:
            spawn_launch(ctl, job, run)
    if targets:
        data.prefetch(ctl, targets)
    if inp.view.data_at:
        data.note_waits(ctl, decisions, inp.at)
    # (over the valid ones only: a busy round decides 2,000 waits, and a union type made per test costs)
    stops = (Preempt, Move)
    return bool(decisions), sum(1 for d in act if d.job_id in valid and isinstance(d, stops))


async def round_input(ctl: Controller, *, always: bool = False, later: bool = False) -> RoundInput | None:
    """The round's snapshot: the jobs it may start (retries past their backoff, dependencies met, within their
    array's limit), the fleet as it stands, fair share usage, checkpoint homes. None when nothing waits (`always`:
    the snapshot even then, for a forecast: hsched.controller.forecast). Call with ctl.lock held; it records the
    reasons of jobs whose dependencies hold them. `later`: what the active jobs hold is left to count in the round's
    thread (`RoundInput.finish`, `RoundInput.whole`)."""
    now, at = ctl.clock.time(), ctl.timeline.now()
    jobs = await ctl.db(job_cache(ctl).read, ctl.store)
    pending = list(jobs.queued)
    active, users, pending_by_id = jobs.active, jobs.users, jobs.queued_by_id
    if jobs.special:
        # a retry waits out its backoff (its reason says BeginTime until then), on the monotonic timeline
        pending = [j for j in pending if (t := ctl.retry_at(j)) is None or t <= at]
        if len(ctl.not_before) > len(jobs.queued):
            queued = {j.id for j in jobs.queued}
            for jid in [i for i in ctl.not_before if i not in queued]:
                del ctl.not_before[jid]  # (started or ended: their backoffs do not pile up)
        pending = await _dependencies_met(ctl, pending, active, now)
        if any(j.spec.array is not None and j.spec.array.max_running for j in pending):
            pending = within_limits(pending, active)
        users = frozenset(j.user for j in (*pending, *active))
        pending_by_id = {j.id: j for j in pending}
    if (not pending and not always and not await moves.may_move(ctl, active, at)
            and not resizing.may_grow(ctl, active, at)):
        return None
    note_users(ctl, pending)
    # (the dirty GPUs read here, after `note_users`: a lab user's first job waits for the nodes' answer whether the
    # user exists there, which a node of the test kit gives at once, by this read)
    view, finish = fleet_view_later(ctl, active, await still_dirty(ctl))
    requeued = {i: j for i in jobs.requeued if (j := pending_by_id.get(i) or jobs.active_by_id.get(i)) is not None}
    movable, held, attained = await moves.round_fields(ctl, active, pending, at, requeued)
    if movable or held or attained:
        view = replace(view, movable=movable, held=held, attained=attained,
                       move_min_run_s=ctl.settings.move_min_run_s,
                       running_left=learning.running_left(ctl, movable) if movable else {})
    if not jobs.apart:
        view = replace(view, queue_apart=False)  # (no shared or heterogeneous job waits: their stages skip the look)
    if ctl.settings.policy_round_s != view.policy_round_s:
        view = replace(view, policy_round_s=ctl.settings.policy_round_s)  # (a time-compressed replay's: hsched.replay)
    # (the elastic ones alone, as the job cache keeps them: looking through 2,500 jobs for them was ~0.2 ms of the
    # event loop a poll, issue 33)
    elastic = sorted(jobs.elastic)
    scaling, resize_cost = await resizing.round_fields(
        ctl, [j for i in elastic if (j := jobs.active_by_id.get(i)) is not None],
        [j for i in elastic if (j := pending_by_id.get(i)) is not None])
    if resize_cost:
        # elastic jobs that may be resized, their measured scaling and costs, and the quantum a grow waits out
        view = replace(view, scaling=scaling, resize_cost=resize_cost, move_min_run_s=ctl.settings.move_min_run_s)
    if ctl.settings.policy:
        # fair share over the store's history (decayed GPU-seconds per share), for this round's users
        view = replace(view, user_usage=await _usage(ctl, now, users, jobs.changes, jobs.all))
    resumed = [j.id for j in pending if j.restarts > 0]
    prefer: dict[int, str] = {}
    if resumed:
        # a resumed job whose checkpoint sits on a node of its own goes back there when it can: no copy
        last = await ctl.db(ctl.store.last_nodes, resumed)
        prefer = {jid: node for jid, node in last.items()
                  if node in ctl.nodes and not is_shared(ctl.nodes[node], ctl.checkpoint_dir(jid))}
    horizon = None
    if ctl.fleet_cfg.datasets:
        await data.load(ctl)
        await data.resume(ctl)
        with_data = [j for j in pending if j.spec.data]
        if with_data:
            # placement weighs copying a job's datasets against waiting for a node holding them (issue 15); the
            # node holding most of them first (a dataset is most often bigger than a checkpoint)
            view = replace(view, **data.view_fields(ctl, at, with_data))
            prefer.update(data.prefer(ctl, with_data))
            horizon = ctl.settings.prefetch_horizon_s if ctl.settings.prefetch else None
    if prefer:
        view = replace(view, prefer=prefer)
    # the store's change count as the jobs were read: a write since (dependencies' reasons above, or anyone's while
    # the round computes) makes the checks read the jobs they act on again
    inp = RoundInput(now, at, view, tuple(pending), jobs.active_by_id, pending_by_id, jobs.changes, horizon,
                     ctl.round_cache, finish)
    return inp if later else inp.whole()


def rewrites(job: Job, d: Wait) -> bool:
    """The wait's reason is news for the job (a requeued job keeps saying why it was requeued until it waits
    for something else)."""
    kept = d.reason == EndReason.RESOURCES and job.reason in (EndReason.PREEMPTED, EndReason.CHECKPOINTED)
    return job.reason != d.reason and not kept


def acting_of(inp: RoundInput, decisions: Sequence[Decision]) -> list[Decision]:
    """The decisions that act: launches, preemptions, moves, and waits with a new reason (pure: in the round's
    thread, `_compute`)."""
    by_id = inp.by_id
    # (the reasons compared first: most waits repeat what the job already says)
    return [d for d in decisions if not isinstance(d, Wait)
            or (d.reason != by_id[d.job_id].reason and rewrites(by_id[d.job_id], d))]


async def still_valid(ctl: Controller, inp: RoundInput, acting: Sequence[Decision]) -> set[int]:
    """The jobs whose decisions act (`acting`: launches, preemptions, waits with a new reason) and still hold now,
    after the round computed without the lock (call with it held).

    A decision is about a job exactly as the round saw it: one whose row changed meanwhile (cancelled, held,
    re-prioritised, requeued, its reason set by someone else) is left to the next round, which sees it as it is.
    A launch also needs its nodes up and not drained, and its devices still free (not held by a job, not used by
    a process outside hsched); a preemption needs every victim still running as it was. While the store made no
    change since the snapshot (the usual case), no job can have changed and nothing is read again."""
    if not acting:
        return set()
    current: dict[int, Job | None] | None = None
    if await ctl.db(_changes, ctl.store) != inp.mark:
        ids = {d.job_id for d in acting} | {v for d in acting if isinstance(d, Preempt) for v in d.victims}
        current = await ctl.db(_jobs_now, ctl.store, ids)
    held: set[str] | None = None
    exclusive: set[str] | None = None
    valid: set[int] = set()
    for d in acting:
        # (a move is of a running job; every other decision of a waiting one)
        was = inp.active.get(d.job_id) if isinstance(d, Move) else inp.by_id[d.job_id]
        if current is not None and current[d.job_id] != was:
            continue
        if isinstance(d, Wait):
            valid.add(d.job_id)
            continue
        nodes = [p.node for p in d.placements] if isinstance(d, Launch | Move) else [d.node]
        if not all(_usable(ctl, n) for n in nodes):
            continue
        if isinstance(d, Preempt):
            if current is None or all(current[v] == inp.active.get(v) for v in d.victims):
                valid.add(d.job_id)
            continue
        if held is None:
            # only a round makes a job hold devices, and rounds run one at a time; but what the store says is
            # checked rather than assumed when it changed, and a process outside hsched may have appeared
            held = {u for rt in ctl.nodes.values() for u in rt.foreign}
            if current is not None:
                active = await ctl.db(ctl.store.jobs, states=[s for s in JobState if s.is_active()])
                held.update(u for j in active for p in j.placement for u in p.devices)
        devices = [u for p in d.placements for u in p.devices]
        if isinstance(d, Resize) and (was := inp.active.get(d.job_id)) is not None:
            devices = [u for u in devices if all(u not in p.devices for p in was.placement)]  # (its own GPUs)
        if isinstance(d, Launch) and inp.by_id[d.job_id].spec.resources.shared:
            # a shared job's GPU may hold other shared jobs (the round packed it so): only a process outside
            # hsched, or an exclusive job, makes it unusable
            if exclusive is None:
                exclusive = {u for j in inp.active.values() if not j.spec.resources.shared
                             for p in j.placement for u in p.devices}
                exclusive.update(u for rt in ctl.nodes.values() for u in rt.foreign)
            if exclusive.isdisjoint(devices):
                valid.add(d.job_id)
            continue
        if held.isdisjoint(devices):
            valid.add(d.job_id)
            held.update(devices)
    dropped = len(acting) - len(valid)
    if dropped:
        log.info("round: %d decision(s) no longer held when applied; the next round decides again", dropped)
    return valid


USAGE_REFRESH_S = 30.0
"""Fair share's usage is read again after this long on the controller's clock, and at once when a new user takes
part or the store changed (a run started or ended). Reading it costs ~10 ms with 512 runs going (each running run
is read again, to count it up to now); in between, running jobs' usage grows by at most this many seconds'
worth, against a half-life of days (Slurm recomputes its fair share every PriorityCalcPeriod, 5 minutes)."""

async def _usage(ctl: Controller, now: float, users: frozenset[str], mark: int, jobs: Sequence[Job] = ()
                 ) -> dict[str, float]:
    """`round_usage`, read again only when it may have moved (USAGE_REFRESH_S); `mark`: the store's change count
    (a priority an admin set, among `jobs`, is a change too)."""
    last = ctl.state.fair_usage
    if last is not None and last[1] == mark and last[2] == users and 0.0 <= now - last[0] < USAGE_REFRESH_S:
        return last[3]
    usage = await round_usage(ctl, now, users, jobs, mark)
    ctl.state.fair_usage = (now, mark, users, usage)
    return usage


def _usable(ctl: Controller, node: str) -> bool:
    """The node is up and not being drained: work may go there."""
    rt = ctl.nodes.get(node)
    return rt is not None and rt.node.state is NodeState.UP and ctl.admin.get(node) is not NodeState.DRAINED


def fleet_view(ctl: Controller, active: Sequence[Job], dirty: frozenset[str] = frozenset()) -> FleetView:
    """The fleet as the round sees it, counted now (see `fleet_view_later` for the round's own, counted in the round's
    thread)."""
    view, held = fleet_view_later(ctl, active, dirty)
    return held(view)


Finish = Callable[[FleetView], FleetView]
"""What is left of a fleet view to count (`fleet_view_later`): the view with it."""


def fleet_view_later(ctl: Controller, active: Sequence[Job], dirty: frozenset[str] = frozenset()
                     ) -> tuple[FleetView, Finish]:
    """The fleet view without what the active jobs hold and when the running ones are predicted to end, and what
    adds both: counting 512 running jobs' devices, CPUs and memory, and predicting their ends, took ~1.2 ms of the
    event loop every poll once jobs end and start (issue 33), so the round does it in its own thread (`_compute`),
    from what is taken here: the tuple of active jobs (immutable, as the job cache hands it out), a copy of the
    attempts' starts and what the predictions read (`learning.ends_input`). Call on the event loop."""
    busy = set(dirty)  # a GPU an ended run's leftover still uses waits until it is clean
    for rt in ctl.nodes.values():
        busy.update(rt.foreign)  # a GPU someone else is using is not free, whatever our records say
    # a node's labels (for --constraint) and the lab users that do not exist there (never placed there)
    labels = {rt.name: node_labels(rt.name, rt.config.labels) for rt in ctl.nodes.values()}
    absent = {rt.name: users for rt in ctl.nodes.values() if (users := rt.absent_users)}
    view = FleetView(nodes=tuple(ctl.node_list()), busy=frozenset(busy), cpus_used={}, memory_used={},
                     shared_use={}, running=(), releasing=frozenset(),
                     rule=PreemptRule.from_qos(ctl.settings.qos), policy=ctl.settings.policy,
                     labels=labels, absent_users=absent, gpu_aliases=ctl.settings.gpu_aliases,
                     fabric=ctl.fleet_cfg.fabric,
                     limits=QosLimits.from_qos(ctl.settings.qos), holders=tuple(active),
                     throughput=_learned(ctl),
                     # what requeued jobs' progress said was left: the policy ranks them by it (hsched's _work)
                     left=learning.waiting_left(ctl))
    jobs = tuple(active)
    running = JobState.RUNNING
    for j in jobs:
        if j.state is running and j.id not in ctl.attempt_start:
            ctl.attempt_started(j)  # (converted once, on the event loop: it records what it converts)
    starts = dict(ctl.attempt_start)
    # the running jobs' predicted ends: when the first blocked job's reserved GPUs free up
    ends = functools.partial(learning.ends_of, learning.ends_input(ctl, starts), jobs, ctl.timeline.now())
    # (what the active jobs hold, for the very tuple of jobs the job cache handed out: while no job changed a round
    # reads it, not 512 jobs' placements: ~2 ms; the attempts' start times too: a Slurm job still queued there
    # restarts its clock at every report)
    hit = ctl.state.held
    if hit is not None and hit[0] is active and hit[1] == starts and isinstance(active, tuple):
        return view, functools.partial(_with_held, held=hit[2], ends=ends)
    return view, functools.partial(_count_held, ctl.state, jobs, starts, active, ends=ends)


Held = tuple[frozenset[str], frozenset[str], dict[str, int], dict[str, int], dict[str, int], tuple[Running, ...]]
"""What the active jobs hold (`_held_by`)."""


def _with_held(view: FleetView, *, held: Held, ends: Callable[[], dict[int, float]]) -> FleetView:
    held_busy, releasing, cpus_used, memory_used, shared_use, running = held
    return replace(view, busy=view.busy | held_busy if view.busy else held_busy, cpus_used=cpus_used,
                   memory_used=memory_used, shared_use=shared_use, running=running, releasing=releasing, ends=ends())


def _count_held(state: ControllerState, jobs: tuple[Job, ...], starts: dict[int, float], active: Sequence[Job],
                view: FleetView, *, ends: Callable[[], dict[int, float]]) -> FleetView:
    """`view` with what `jobs` hold, counted (in the round's thread: nothing here is the event loop's but the
    caches `state.held` and `state.running`, which only rounds use, one at a time; a forecast's view counted on the
    loop meanwhile finds them stale, never wrong: each entry is checked against the very job and start)."""
    held = _held_by(state, jobs, starts)
    state.held = (active, starts, held)
    return _with_held(view, held=held, ends=ends)


def _held_by(state: ControllerState, active: Sequence[Job], starts: Mapping[int, float]) -> Held:
    """What the active jobs hold: their devices, those being released, CPUs, host memory and shared GPU memory per
    node or device, and the running ones (as the round sees them; `starts`: the attempts' starts, each running job's
    there)."""
    busy: set[str] = set()
    releasing: set[str] = set()
    cpus_used: dict[str, int] = {}
    memory_used: dict[str, int] = {}
    shared_use: dict[str, int] = {}
    running: list[Running] = []
    last, kept = state.running, {}
    for j in active:
        for k, p in enumerate(j.placement):
            busy.update(p.devices)
            if j.state in (JobState.PREEMPTING, JobState.COMPLETING):
                releasing.update(p.devices)
            res = j.spec.resources if not j.spec.components else hetjobs.share_resources(j.spec, k)
            if res.cpus:
                cpus_used[p.node] = cpus_used.get(p.node, 0) + res.cpus
            if res.memory_mib:
                # --mem is per node, as sbatch's: promised on each node of the job
                memory_used[p.node] = memory_used.get(p.node, 0) + res.memory_mib
            if j.spec.resources.shared:
                for u in p.devices:
                    shared_use[u] = shared_use.get(u, 0) + (j.spec.resources.gpu_memory_mib or 0)
        if j.state is JobState.RUNNING:
            started = starts[j.id]
            r = last.get(j.id)
            if r is None or r.job is not j or r.started != started:
                r = Running(j, started)
            running.append(r)
            kept[j.id] = r
    state.running = kept
    return frozenset(busy), frozenset(releasing), cpus_used, memory_used, shared_use, tuple(running)


def _learned(ctl: Controller) -> ThroughputModel | None:
    """The kinds' learned speeds for the policy (hsched.controller.learning), over the fleet's GPU types."""
    types = sorted({gpu_type_of(d.model) for rt in ctl.nodes.values() for d in rt.node.devices})
    return learning.throughput(ctl, ctl.clock.monotonic(), types)


async def _dependencies_met(ctl: Controller, pending: list[Job], active: Sequence[Job], now: float) -> list[Job]:
    """The pending jobs whose dependencies allow a start; the others get reason Dependency (or
    DependencyNeverSatisfied, or are cancelled with --kill-on-invalid-dep). Call with ctl.lock held."""
    with_deps = [j for j in pending if j.spec.dependency]
    if not with_deps:
        return pending
    named = {i for j in with_deps for i in named_jobs(j.spec.dependency)}
    others = {i: o for i in named if (o := await ctl.db(ctl.store.get_job, i)) is not None}
    tasks_of = {i: await ctl.db(ctl.store.array_tasks, i) for i, o in others.items() if o.array_id == i}
    running = {(j.user, j.name) for j in active if j.state is not JobState.PENDING}
    ready = []
    for job in pending:
        v = verdict(job, others, running, tasks_of)
        if v.state is DepState.SATISFIED:
            ready.append(job)
        elif v.state is DepState.NEVER and job.spec.kill_on_invalid_dep:
            await ctl.db(ctl.store.set_job, job.id, now, state=JobState.CANCELLED,
                         reason=EndReason.DEPENDENCY_NEVER.value, end_time=now,
                         event=("ended", f"cancelled: dependency can never be satisfied ({v.why})"))
        elif job.reason != v.state.value:
            event = ("dependency", f"dependency can never be satisfied: {v.why}") if v.state is DepState.NEVER \
                else None
            await ctl.db(ctl.store.set_job, job.id, now, reason=v.state.value, event=event)
    return ready


async def still_dirty(ctl: Controller) -> frozenset[str]:
    """Dirty GPUs (hsched.controller.store.dirty_devices) that are still dirty. A GPU is clean again when the node's
    monitoring shows none of the recorded processes on it any more; until the node's monitoring lists its GPU
    processes (after a controller restart, the first sample), the GPU stays dirty."""
    dirty = await ctl.db(ctl.store.dirty_devices)
    if not dirty:
        return frozenset()
    left: set[str] = set()
    now = ctl.clock.time()
    for uuid, (node, pids, _msg) in dirty.items():
        rt = ctl.nodes.get(node)
        if rt is None:
            await ctl.db(ctl.store.clear_dirty, uuid, f"GPU {uuid}: node {node} left the fleet", now)
            continue
        if rt.gpu_processes is None:
            left.add(uuid)
            continue
        procs = rt.gpu_processes.get(uuid, [])
        still = sorted(set(pids) & {int(p.get("pid", -1)) for p in procs})
        if still:
            left.add(uuid)
        else:
            await ctl.db(ctl.store.clear_dirty, uuid, f"GPU {uuid} on {node} is clean again: "
                         f"pid {', '.join(map(str, pids))} gone", now)
    return frozenset(left)


def job_env(ctl: Controller, job: Job, run: Run, placements: tuple[Placement, ...], *, checkpoint_dir: str,
            remote: bool, submit_env: dict[str, str] | None) -> dict[str, str]:
    """The run's environment. Local runs start from the submitter's (as sbatch's --export=ALL); a remote
    run gets the node's own login basics (the helper adds PATH, HOME, ...), never this machine's paths."""
    env: dict[str, str] = {} if remote else dict(submit_env or {})
    env.update(dict(job.spec.env))
    here = next((p for p in placements if p.node == run.node), Placement(run.node, run.devices))
    if job.spec.components:
        here = Placement(run.node, run.devices)  # a heterogeneous job: two components may share a node
    env.update({
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": ",".join(here.devices),
        "HSCHED_JOB_ID": str(job.id),
        "HSCHED_JOB_NAME": job.name,
        "HSCHED_RUN": str(run.attempt),
        "HSCHED_NODE": run.node,
        "HSCHED_CHECKPOINT_DIR": checkpoint_dir,
        "HSCHED_RESTART_COUNT": str(job.restarts),
        # what the job is (hsched.learn.kinds) and what it runs on: a trainer may log it, a test trainer's speed
        # may depend on it
        "HSCHED_KIND": job_kind(job),
        "HSCHED_GPU_MODEL": _model_of(ctl, run.node, here.devices),
        # what a batch script written for Slurm reads (sbatch sets these); hsched's own names above
        "SLURM_JOB_ID": str(job.id),
        "SLURM_JOB_NAME": job.name,
        "SLURM_RESTART_COUNT": str(job.restarts),
        "SLURM_PROCID": str(run.rank),
        "SLURM_NTASKS": str(run.world),
        "SLURM_LOCALID": str(run.rank % job.spec.resources.tasks_per_node),
        "SLURM_NODEID": str(run.rank // job.spec.resources.tasks_per_node),
        "SLURM_JOB_NUM_NODES": str(len(placements) or 1),
        # and what sbatch sets beside them, which scripts read (`cd $SLURM_SUBMIT_DIR` went to $HOME without it)
        "SLURM_JOBID": str(job.id),
        "SLURM_JOB_USER": job.user,
        "SLURM_NNODES": str(len(placements) or 1),
        "SLURM_JOB_NODELIST": ",".join(p.node for p in placements) or run.node,
        "SLURM_NODELIST": ",".join(p.node for p in placements) or run.node,
        "SLURM_GPUS_ON_NODE": str(len(here.devices)),
    })
    env.update(vendor_env(ctl, run.node, here.devices, env))
    if len(placements) > 1 and (rt := ctl.nodes.get(run.node)) is not None:
        # a gang across nodes: the NICs its placement chose (hsched.topo.fabric); what the job set itself wins
        given = dict(job.spec.env)
        net = network_env(rt.node, [d.index for u in here.devices if (d := rt.node.device(u)) is not None])
        env.update({k: v for k, v in net.items() if k not in given})
    # where `hsched submit` ran, as sbatch's (-D changes the working folder, not this); the working folder otherwise
    submit_dir = (submit_env or {}).get("PWD") or job.spec.workdir
    if submit_dir:
        env["SLURM_SUBMIT_DIR"] = submit_dir
    tasks_here = job.spec.ntasks or job.spec.resources.tasks_per_node
    if job.spec.resources.cpus:
        env["SLURM_CPUS_PER_TASK"] = str(max(1, job.spec.resources.cpus // max(1, tasks_here)))
    if job.spec.ntasks is not None:
        # sbatch --ntasks on one node: one batch shell for N tasks; the srun it defines starts them (hsched.spec.batch)
        env.update({"SLURM_NTASKS": str(job.spec.ntasks), "SLURM_NPROCS": str(job.spec.ntasks),
                    "HSCHED_SRUN_TASKS": str(job.spec.ntasks)})
    if job.array_id is not None and job.array_task is not None and job.spec.array is not None:
        idx = job.spec.array.indices
        env.update({
            "HSCHED_ARRAY_JOB_ID": str(job.array_id), "HSCHED_ARRAY_TASK_ID": str(job.array_task),
            "SLURM_ARRAY_JOB_ID": str(job.array_id), "SLURM_ARRAY_TASK_ID": str(job.array_task),
            "SLURM_ARRAY_TASK_COUNT": str(len(idx)), "SLURM_ARRAY_TASK_MIN": str(min(idx)),
            "SLURM_ARRAY_TASK_MAX": str(max(idx)),
        })
    if job.restarts > 0:
        env["HSCHED_RESUME"] = "1"
    else:
        env.pop("HSCHED_RESUME", None)
    if job.spec.resources.shared and here.devices:
        env.update(shared_gpu_env(ctl, run.node, here.devices[0], job.spec.resources.gpu_memory_mib or 0))
    env.update(size_env(job, run, placements, here))
    if job.spec.resize_signal is not None:
        # an elastic job that resizes in place reads its new devices here on its resize signal
        env["HSCHED_RESIZE_FILE"] = f"{checkpoint_dir.rstrip('/')}/{resizing.RESIZE_FILE}"
    tpn = job.spec.resources.tasks_per_node
    if run.world > 1 or job.spec.resources.nodes > 1:
        # torchrun's environment, so `torch.distributed.init_process_group("env://")` just works
        master = placements[0].node
        rt = ctl.nodes.get(master)
        master_addr = (rt.config.host if rt and rt.config.host else "127.0.0.1")
        env.update({
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port(job.id, run.attempt)),
            "WORLD_SIZE": str(run.world),
            "RANK": str(run.rank),
            "LOCAL_RANK": str(run.rank % tpn),
            "LOCAL_WORLD_SIZE": str(tpn),
            "NODE_RANK": str(run.rank // tpn),
            "GROUP_RANK": str(run.rank // tpn),
            "HSCHED_GANG_NODES": ",".join(p.node for p in placements),
        })
    if job.spec.components:
        env.update(hetjobs.component_env(ctl, job, run, placements))  # a heterogeneous job's component
    return env


def size_env(job: Job, run: Run, placements: tuple[Placement, ...], here: Placement) -> dict[str, str]:
    """The job's size: `HSCHED_GPUS` (its GPUs in all, on every node), `HSCHED_GPUS_ON_NODE`, `HSCHED_NNODES`; an
    elastic job (`--gpus MIN-MAX`) also `HSCHED_ELASTIC=1`, `HSCHED_GPUS_MIN`/`_MAX` (per node, as asked), torchrun's
    own variables (`PET_NPROC_PER_NODE` = this node's GPUs, `PET_NNODES`, `PET_NODE_RANK`), so `torchrun train.py`
    starts one worker per GPU at the new size after every resize, and on one node with one process the world its
    workers will have: `WORLD_SIZE` = its GPUs (a gang's torchrun block below sets the ranks' own)."""
    total = sum(len(p.devices) for p in placements) or len(here.devices)
    nodes = len(placements) or 1
    out = {"HSCHED_GPUS": str(total), "HSCHED_GPUS_ON_NODE": str(len(here.devices)), "HSCHED_NNODES": str(nodes)}
    res = job.spec.resources
    if res.elastic:
        out.update({"HSCHED_ELASTIC": "1", "HSCHED_GPUS_MIN": str(res.gpus),
                    "HSCHED_GPUS_MAX": str(res.gpus_max if res.gpus_max is not None else res.gpus),
                    "PET_NPROC_PER_NODE": str(max(1, len(here.devices))), "PET_NNODES": str(nodes),
                    "PET_NODE_RANK": str(run.rank // res.tasks_per_node)})
        if res.tasks_per_node == 1:
            out.update({"WORLD_SIZE": str(max(1, total)), "RANK": str(run.rank // res.tasks_per_node),
                        "LOCAL_WORLD_SIZE": str(max(1, len(here.devices)))})
    return out


MPS_BASE = "/tmp/hsched-mps"
"""Where each shared GPU's CUDA MPS control daemon keeps its pipes and logs, one folder per GPU (the node helper
starts the daemon where the node has `nvidia-cuda-mps-control`)."""


def shared_gpu_env(ctl: Controller, node: str, uuid: str, need_mib: int) -> dict[str, str]:
    """A shared job's CUDA MPS environment: its GPU's daemon (`HSCHED_SHARED_GPU` tells the node helper to make sure
    one runs), and its share of the GPU's compute as its share of the GPU's memory (at least 1%)."""
    rt = ctl.nodes.get(node)
    total = next((d.memory_total_mib for d in rt.node.devices if d.uuid == uuid), None) if rt else None
    pct = max(1, min(100, -(-100 * need_mib // total))) if total else 100
    return {"HSCHED_SHARED_GPU": uuid,
            "CUDA_MPS_PIPE_DIRECTORY": f"{MPS_BASE}/nvidia-mps-{uuid}",
            "CUDA_MPS_LOG_DIRECTORY": f"{MPS_BASE}/nvidia-mps-log-{uuid}",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(pct)}


def vendor_env(ctl: Controller, node: str, devices: tuple[str, ...], env: dict[str, str]) -> dict[str, str]:
    """An AMD node's device selection: ROCR_VISIBLE_DEVICES with the indices amd-smi/rocm-smi print (the ROCr
    runtime's own order; the UUIDs ROCr also takes are rocminfo's "GPU-<serial>", which neither tool prints in
    every release, and an SR-IOV guest's rocm-smi gives none), then HIP_VISIBLE_DEVICES 0..n-1: HIP numbers the
    devices ROCr left visible from 0, so the same physical indices there would select the wrong ones or none.
    CUDA_VISIBLE_DEVICES goes (HIP reads it as HIP_VISIBLE_DEVICES, and it names NVIDIA UUIDs). A discovery
    plugin's node: its `select_env` alone. {} on an NVIDIA node."""
    rt = ctl.nodes.get(node)
    gpus = rt.raw_probe.get("gpus") if rt is not None else None
    if not isinstance(gpus, dict) or gpus.get("vendor") not in ("amd", "plugin") or rt is None:
        return {}
    index = {d.uuid: d.index for d in rt.node.devices}
    picked = [str(index[u]) for u in devices if u in index]
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env.pop("CUDA_DEVICE_ORDER", None)
    if gpus.get("vendor") == "plugin":
        # the plugin's own variable, with what it said the runtime takes (docs/reference.md: discovery plugins)
        chosen = picked if gpus.get("select_by", "index") == "index" else [u for u in devices if u in index]
        return {str(gpus["select_env"]): ",".join(chosen)}
    return {"ROCR_VISIBLE_DEVICES": ",".join(picked), "HIP_VISIBLE_DEVICES": ",".join(map(str, range(len(picked))))}


def _model_of(ctl: Controller, node: str, devices: tuple[str, ...]) -> str:
    rt = ctl.nodes.get(node)
    mine = set(devices)
    models = sorted({d.model for d in rt.node.devices if d.uuid in mine}) if rt is not None else []
    return ",".join(models)


def master_port(job_id: int, attempt: int) -> int:
    """A port in 20000-39999 that differs between jobs and attempts (a restarted gang rebinds cleanly)."""
    return 20000 + zlib.crc32(f"{job_id}/{attempt}".encode()) % 20000


def spawn_launch(ctl: Controller, job: Job, run: Run) -> None:
    """Launch `run` in the background, once: a run whose launch is in flight is not launched again."""
    if run.id in ctl.launching:
        return
    ctl.launching.add(run.id)
    ctl.spawn(launch(ctl, job, run)).add_done_callback(lambda _t: ctl.launching.discard(run.id))


async def launch(ctl: Controller, job: Job, run: Run) -> None:
    rt = ctl.nodes.get(run.node)
    if rt is None:
        await launch_failed(ctl, job, run, f"node {run.node} is no longer in the fleet")
        return
    current = await ctl.db(ctl.store.get_job, job.id)
    if current is None:
        return
    remote = rt.config.executor != "local"
    # file work off the event loop
    try:
        await asyncio.to_thread(ctl.checkpoint_dir(job.id).mkdir, parents=True, exist_ok=True)
    except OSError as e:  # a full disk: said, and the job waits (launch_failed), never a launch left hanging
        await launch_failed(ctl, job, run, f"cannot make its checkpoint folder: {e.strerror or e}")
        return
    # an array's tasks share the environment saved once under the array's id
    submit_env = await asyncio.to_thread(ctl.load_env, job.array_id or job.id)
    try:
        # its datasets on its node first (a copy may take long: outside the launch slots and their timeout)
        data_env = await data.ensure(ctl, current, run)
    except data.DataUnavailable as e:
        await launch_failed(ctl, job, run, f"data: {e}")
        return
    try:
        async with ctl.launch_slots, asyncio.timeout(600):
            await bring_along(ctl, current, run)
            ckpt = await path_on(ctl, rt, job.id)
            env = job_env(ctl, current, run, current.placement, checkpoint_dir=ckpt, remote=remote,
                          submit_env=submit_env)
            env.update(data_env)
            workdir = job.spec.workdir
            comp = hetjobs.component_of(job.spec, run.rank)  # a heterogeneous job's: its own command and resources
            if comp is not None and comp.workdir is not None:
                workdir = comp.workdir
            if workdir is None:
                # where the user submitted from, if the node sees that folder; else the run folder
                pwd = (submit_env or {}).get("PWD")
                if pwd and sees(rt, Path(pwd)):
                    workdir = pwd
            # pin to the cores local to the GPUs, on real machines (a simulated node's cores are made up)
            here = next((p for p in current.placement if p.node == run.node), None)
            if comp is not None:
                here = hetjobs.placement_of(current, run)
            simulated = rt.config.simulate is not None
            cpus = () if simulated or here is None else here.cpus
            res = job.spec.resources if comp is None else comp.resources
            # --mem is per node (as sbatch's): the ranks on one node share it
            mem = -(-res.memory_mib // res.tasks_per_node) if res.memory_mib else None
            output, error = outfiles.for_run(current, run)
            req = LaunchRequest(run_dir=run.run_dir, command=job.spec.command if comp is None else comp.command,
                                env=env, workdir=workdir,
                                cpus=cpus, memory_mib=mem, cpu_limit=float(res.cpus) if res.cpus else None,
                                devices=() if simulated else run.devices,
                                checkpoint_exit_code=ctl.settings.checkpoint_exit_code,
                                stop_grace_s=job.spec.checkpoint_signal.grace_s,
                                # lab mode: the node's helper (root) runs it as its owner, by name
                                user=job.user if ctl.home.lab else None,
                                base_dir=str(ctl.home.root) if ctl.home.lab else None,
                                time_limit_s=backend_limit(ctl, job), output=output, error=error,
                                # sbatch empties its files at the start; a requeued run appends (never wipes
                                # the first attempt's output), and ranks sharing one file never empty it
                                truncate_output=(current.restarts == 0 and run.world == 1
                                                 and not current.spec.output_append))
            handle = await rt.executor.launch(req)
    except (ExecutorError, TimeoutError) as e:
        await launch_failed(ctl, job, run, str(e) or "launch timed out")
        return
    if run.rank == 0 and job.restarts == 0:
        await learning.note_start(ctl, job)
    async with ctl.lock:
        await ctl.db(ctl.store.run_launched, run, handle, ctl.clock.time())
        current = await ctl.db(ctl.store.get_job, job.id)
        if current is not None and current.state in (JobState.COMPLETING, JobState.PREEMPTING):
            # stopped while it was being launched
            await send(ctl, job.id, "TERM", all_processes=True, batch_only=False,
                       purpose=current.reason or "cancelled")
    await ctl.notify()


BACKEND_LIMIT_MARGIN_S = 60.0


def backend_limit(ctl: Controller, job: Job) -> float | None:
    """The job's time limit for a backend that enforces one itself (Slurm): past hsched's whole stop (the
    limit, the signal's grace, the kill delay) and a margin, so hsched's stop always comes first and the
    backend's only catches a job hsched lost sight of."""
    if job.spec.time_limit_s is None:
        return None
    return (job.spec.time_limit_s + job.spec.checkpoint_signal.grace_s + ctl.settings.kill_after_s
            + BACKEND_LIMIT_MARGIN_S)


USERS_RECHECK_S = 60.0
"""An account found absent on a node is asked about again after this long (accounts get created)."""
USERS_TIMEOUT_S = 15.0


def note_users(ctl: Controller, pending: list[Job]) -> None:
    """Lab mode: make sure every node is asked whether the pending jobs' users exist there. Until a node has
    answered for a user, it counts as lacking them (never a launch that would fail on a missing account); the
    asking runs in the background, never in the round, and the next round sees the answers."""
    if not ctl.home.lab:
        return
    wanted = {j.user for j in pending}
    now = ctl.clock.monotonic()
    for rt in ctl.nodes.values():
        ask = sorted(u for u in wanted if u not in rt.users or (
            rt.users[u] is False and now - rt.users_asked.get(u, now) >= USERS_RECHECK_S))
        if not ask or (rt.users_task is not None and not rt.users_task.done()):
            continue
        for u in ask:
            rt.users.setdefault(u, None)
        rt.users_task = ctl.spawn(_ask_users(ctl, rt, ask))


async def _ask_users(ctl: Controller, rt: NodeRuntime, names: list[str]) -> None:
    try:
        async with asyncio.timeout(USERS_TIMEOUT_S):
            present = await rt.executor.users(names)
    except (ExecutorError, TimeoutError) as e:
        log.info("%s: cannot ask which users exist there (%s); asking again next round", rt.name, e)
        for u in names:
            if rt.users.get(u) is None:
                rt.users.pop(u, None)
        return
    now = ctl.clock.monotonic()
    for u in names:
        rt.users[u] = bool(present.get(u))
        rt.users_asked[u] = now
        if not rt.users[u]:
            log.info("%s: user %s does not exist there; their jobs go elsewhere", rt.name, u)
    ctl.poke()


def disk_full(ctl: Controller) -> bool:
    """Whether the controller's own disks have no room for a run: its store's, its run and checkpoint folders'
    (each may be a file system of its own). Blocking."""
    return any(no_room(p) for p in (ctl.store.path.parent, ctl.home.runs, ctl.home.checkpoints))


async def launch_failed(ctl: Controller, job: Job, run: Run, why: str) -> None:
    log.warning("job %s: launch failed: %s", job.id, why)
    now = ctl.clock.time()
    async with ctl.lock:
        current = await ctl.db(ctl.store.get_job, job.id)
        if current is None:
            return
        full = await asyncio.to_thread(disk_full, ctl)
        await ctl.db(ctl.store.add_event, now, "launch_failed", f"rank {run.rank} on {run.node}: {why}"
                     + (f" (the disk holding {ctl.home.root} is full)" if full else ""), job_id=job.id, node=run.node)
        if full and run.world == 1 and current.state is JobState.LAUNCHING:
            # the controller's own disk (its store, run and checkpoint folders) is full: no fault of the job, which
            # never ran; it waits in the queue, its retries untouched, and is launched again once there is room
            # (issue 27: it was ended LOST)
            delay = ctl.settings.retry_backoff_s
            outcome = Outcome(JobState.PENDING, EndReason.RETRY_BACKOFF, None, "requeued",
                              f"not launched: the disk holding {ctl.home.root} is full; launched again in {delay:g} s "
                              "once there is room", failures=current.failures, checkpoints=current.checkpoints,
                              begin_time=now + delay)
            await ctl.db(ctl.store.end_run, run, now, run_state=RunState.LOST, exit_code=None,
                         reason=EndReason.LAUNCH_FAILED.value, job_fields=outcome.job_fields(current, now),
                         event=(outcome.event, outcome.message))
            ctl.forget(job.id)
        else:
            await run_ended(ctl, current, run, now, exit_code=None, lost=True)
    await ctl.notify()
