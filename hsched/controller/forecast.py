"""What the controller can say about the future: a running job's predicted end, and when and where waiting jobs
would start (`hsched submit --test-only`, sbatch's; `hsched queue --start`, squeue's).

Starts are predicted by the controller's own round (issue 29, item 5), never by rules of their own: the very
snapshot the next real round would decide over (`launching.round_input`: the fleet as a `FleetView`, the jobs it
may start) is copied and stepped forward through time by `hsched.sched.live.schedule`, the function the real round
calls. At each step the jobs the round launches take their devices and are predicted to end after their expected
duration (their kind's history, capped by their time limit); running jobs end when predicted (`FleetView.ends`:
progress, history, time limit); a preempted job's devices are free after its grace period and it waits again; and
the next step is the next predicted end. Reservations (EASY backfill), constraints, interconnect, QoS caps, GPU
sharing and preemption are thus the round's own. A job the round still has not started when no end is predicted
any more (a running job nothing predicts holds what it needs) is said to start "not before" the last moment the
forecast reached.

Cost: at most MAX_STEPS rounds over at most HORIZON_S, each computed in the round's own thread (never on the event
loop), one at a time with the real rounds so those go on in between.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from hsched.controller import learning
from hsched.controller.core import Controller
from hsched.controller.jobcache import job_cache
from hsched.controller.launching import RoundInput, off_loop, round_input
from hsched.controller.shares import round_usage
from hsched.learn.predict import remaining
from hsched.model import Job, JobSpec, JobState, NodeState, Placement
from hsched.sched.live import FleetView, Launch, Preempt, Running, Wait, schedule, unsatisfiable
from hsched.serialize import iso, job_kind
from hsched.spec.arrays import within_limits
from hsched.spec.constraints import node_labels

HORIZON_S = 14 * 24 * 3600.0
"""How far ahead starts are predicted (two weeks): a job the round has not started by then starts "not before"."""
MAX_STEPS = 200
"""The most rounds one forecast simulates (one per predicted end). A round over a small fleet costs ~1 ms, over
2,000 waiting jobs on 512 GPUs ~20 ms (tests/bench/bench_live.py): a forecast costs at most ~4 s of the round's
thread, in steps that real rounds run between. Jobs still waiting after the last step start "not before" it."""
SETTLE_S = 1.0
"""A predicted end already past (a job being stopped at its time limit) counts as this long after the step that
saw it: the next round frees its devices, as the controller's does once the run has gone."""


async def predicted_end(ctl: Controller, job: Job, now: float) -> tuple[float | None, str]:
    """When a running job is predicted to end, and from what: its progress, its kind's history, or its time
    limit (the latest it may run); (None, "") when nothing says."""
    # (the attempt's start as the wall clock shows it now: counted on the monotonic timeline, so a step of the wall
    # clock moves the predicted end with it rather than adding the step to the job's running time)
    started = ctl.timeline.wall(ctl.attempt_started(job))
    elapsed = max(0.0, now - started) if started is not None else 0.0
    p = learning.progress_of(ctl, job.id, job.restarts + 1)
    exp = await learning.expected(ctl, job)
    left = remaining(elapsed, exp, p.get("step") if p else None, p.get("total") if p else None,
                     p.get("steps_per_s") if p else None)
    if left is None and exp is not None and started is not None and elapsed - exp <= learning.OVERRUN_SHARE * exp:
        left = learning.SOON_S  # a little past its kind's usual time: any moment now (as the round's predicted_ends)
    if left is not None:
        src = "progress" if p and p.get("total") is not None and p.get("steps_per_s") else "history"
        end = now + left
        if job.spec.time_limit_s is not None and started is not None:
            end = min(end, started + job.spec.time_limit_s)
        return end, src
    if job.spec.time_limit_s is not None and started is not None:
        return started + job.spec.time_limit_s, "time limit"
    return None, ""


# ------------------------------------------------------------------------------------------- the forecast


@dataclass(frozen=True, slots=True)
class Start:
    """A waiting job's predicted start, on the controller's timeline."""

    job_id: int
    at: float | None
    """When the round starts it in the forecast; None: not within the forecast (see `not_before`)."""
    placements: tuple[Placement, ...] = ()
    """Where: the devices the round gave it."""
    waits_for: tuple[int, ...] = ()
    """The jobs whose ends free what it starts on (at), or whose ends nothing predicts (not_before)."""
    not_before: float | None = None
    """When it was not started by the end of the forecast: it starts no earlier than this."""
    why: str = ""
    """The round's last reason for its wait ("Resources (reserved on a from ...)", a QoS cap...), "" if started at
    once; for a job the forecast does not follow (a dependency), its reason now."""


@dataclass(slots=True)
class Future:
    """The state a forecast steps forward: a copy of the round's snapshot, changed only here (pure, no I/O; not
    frozen: a step changes it in place, and nothing else holds it).

    `step()` runs one round at `t` and moves `t` to the next predicted end; `done` once no end is predicted, the
    horizon is reached or MAX_STEPS rounds ran."""

    view: FleetView
    at: float
    """The snapshot's moment (timeline)."""
    pending: dict[int, Job]
    """The waiting jobs the round may start, in the order the round gets them."""
    durations: dict[int, float | None]
    """Waiting job id -> how long it runs once started (expected, capped by its limit); None: unknown (never ends)."""
    later: dict[int, tuple[float, Job]] = field(default_factory=dict)
    """Jobs that may start only from a moment on (a retry's backoff): id -> (that moment, the job)."""
    horizon_s: float = HORIZON_S
    max_steps: int = MAX_STEPS
    t: float = 0.0
    steps: int = 0
    done: bool = False
    starts: dict[int, tuple[float, tuple[Placement, ...], tuple[int, ...]]] = field(default_factory=dict)
    why: dict[int, str] = field(default_factory=dict)
    running: dict[int, Running] = field(default_factory=dict)
    holders: dict[int, Job] = field(default_factory=dict)
    ends: dict[int, float] = field(default_factory=dict)
    stopping: dict[int, float] = field(default_factory=dict)
    """Jobs being stopped (preempted, completing) -> when their devices are free."""
    requeue: dict[int, Job] = field(default_factory=dict)
    """Preempted jobs -> the job as it waits again once stopped."""
    busy: set[str] = field(default_factory=set)
    releasing: set[str] = field(default_factory=set)
    cpus_used: dict[str, int] = field(default_factory=dict)
    memory_used: dict[str, int] = field(default_factory=dict)
    shared_use: dict[str, int] = field(default_factory=dict)
    freed_by: dict[str, int] = field(default_factory=dict)
    """Device -> the job whose end freed it last in the forecast."""
    arrays: bool = False
    predicted: list[int] = field(default_factory=list)
    """The waiting jobs whose starts are asked for (in the round's order as given)."""

    @classmethod
    def of(cls, view: FleetView, pending: list[Job], at: float, durations: dict[int, float | None],
           later: dict[int, tuple[float, Job]] | None = None, *, horizon_s: float = HORIZON_S,
           max_steps: int = MAX_STEPS) -> Future:
        """The forecast of a round's snapshot (`view`, `pending` at `at`): the jobs holding devices that are not
        running (launching) count as running from `at` for their `durations` (unknown: never ending); those being
        stopped (their devices releasing) as free after their grace period."""
        holders = view.holders if view.holders is not None else tuple(r.job for r in view.running)
        # moves (a running job that checkpoints, to faster GPUs) are not followed: each is worth its checkpoint
        # only by a margin the forecast cannot see; the jobs stay where they are
        f = cls(view=replace(view, movable={}), at=at, pending={j.id: j for j in pending}, durations=durations,
                later=dict(later or {}), horizon_s=horizon_s, max_steps=max_steps, t=at)
        f.running = {r.id: r for r in view.running}
        f.holders = {j.id: j for j in holders}
        f.ends = {i: e for i, e in view.ends.items() if i in f.running}
        f.busy, f.releasing = set(view.busy), set(view.releasing)
        f.cpus_used, f.memory_used = dict(view.cpus_used), dict(view.memory_used)
        f.shared_use = dict(view.shared_use)
        for j in holders:
            if j.id in f.running:
                continue
            devices = {u for p in j.placement for u in p.devices}
            if j.state in (JobState.PREEMPTING, JobState.COMPLETING) or devices & f.releasing:
                grace = j.spec.checkpoint_signal.grace_s if j.state is JobState.PREEMPTING else 0.0
                f.stopping[j.id] = at + grace
            else:
                # launching: running from now on
                run = replace(j, state=JobState.RUNNING)
                f.running[j.id] = Running(run, at)
                f.holders[j.id] = run
                dur = durations.get(j.id)
                if dur is not None:
                    f.ends[j.id] = at + dur
        f.arrays = any(j.spec.array is not None and j.spec.array.max_running for j in pending)
        return f

    # ------------------------------------------------------------------ one step

    def step(self) -> None:
        """One round at `t` (what the controller's round would decide then), then on to the next predicted end."""
        t = self.t
        for jid in [i for i, e in self.ends.items() if e <= t]:
            self._end(jid, t)
        for jid in [i for i, e in self.stopping.items() if e <= t]:
            self._end(jid, t)
            back = self.requeue.pop(jid, None)
            if back is not None:
                self.pending[jid] = back
        for jid in [i for i, (e, _j) in self.later.items() if e <= t]:
            self.pending[jid] = self.later.pop(jid)[1]
        queue = list(self.pending.values())
        if self.arrays:
            queue = within_limits(queue, self.holders.values())
        view = replace(self.view, busy=frozenset(self.busy), releasing=frozenset(self.releasing),
                       running=tuple(self.running.values()), holders=tuple(self.holders.values()),
                       ends=dict(self.ends), cpus_used=dict(self.cpus_used), memory_used=dict(self.memory_used),
                       shared_use=dict(self.shared_use))
        for d in schedule(view, queue, t) if queue else ():
            if isinstance(d, Launch):
                self._start(self.pending.pop(d.job_id), d.placements, t)
            elif isinstance(d, Preempt):
                self.why[d.job_id] = f"preempting job(s) {', '.join(map(str, d.victims))} ({d.why})"
                for v in d.victims:
                    self._preempt(v, t)
            elif isinstance(d, Wait):
                self.why[d.job_id] = d.reason
        self.steps += 1
        nxt = min((*self.ends.values(), *self.stopping.values(), *(e for e, _j in self.later.values())),
                  default=math.inf)
        if not (self.pending or self.later) or nxt == math.inf:
            self.done = True
            return
        self.t = max(nxt, t + SETTLE_S)
        if self.steps >= self.max_steps or self.t > self.at + self.horizon_s:
            self.done = True

    def _start(self, job: Job, placements: tuple[Placement, ...], t: float) -> None:
        devices = [u for p in placements for u in p.devices]
        waited = tuple(dict.fromkeys(self.freed_by[u] for u in devices if u in self.freed_by)) if t > self.at else ()
        self.starts[job.id] = (t, placements, waited)
        run = replace(job, state=JobState.RUNNING, placement=placements)
        self.running[job.id] = Running(run, t)
        self.holders[job.id] = run
        dur = self.durations.get(job.id)
        if dur is not None:
            self.ends[job.id] = t + dur
        self.busy.update(devices)
        self._count(run, +1)

    def _preempt(self, jid: int, t: float) -> None:
        r = self.running.pop(jid, None)
        if r is None:
            return
        job = r.job
        self.stopping[jid] = t + job.spec.checkpoint_signal.grace_s
        end = self.ends.pop(jid, None)
        self.releasing.update(r.devices)
        self.holders[jid] = replace(job, state=JobState.PREEMPTING)
        # it waits again once stopped, for what it had left (unknown: still unknown)
        self.durations[jid] = max(0.0, end - t) if end is not None else None
        self.requeue[jid] = replace(job, state=JobState.PENDING, placement=(), restarts=job.restarts + 1)

    def _end(self, jid: int, t: float) -> None:
        job = self.holders.pop(jid, None)
        self.running.pop(jid, None)
        self.ends.pop(jid, None)
        self.stopping.pop(jid, None)
        if job is None:
            return
        for p in job.placement:
            for u in p.devices:
                self.busy.discard(u)
                self.releasing.discard(u)
                self.freed_by[u] = jid
        self._count(job, -1)

    def _count(self, job: Job, sign: int) -> None:
        """What the job promises on each node (CPUs, host memory, shared GPU memory), added or given back."""
        res = job.spec.resources
        for p in job.placement:
            if res.cpus:
                self.cpus_used[p.node] = self.cpus_used.get(p.node, 0) + sign * res.cpus
            if res.memory_mib:
                self.memory_used[p.node] = self.memory_used.get(p.node, 0) + sign * res.memory_mib
            if res.shared:
                for u in p.devices:
                    self.shared_use[u] = self.shared_use.get(u, 0) + sign * (res.gpu_memory_mib or 0)

    # ------------------------------------------------------------------ the answer

    def result(self, jid: int) -> Start:
        got = self.starts.get(jid)
        if got is not None:
            return Start(jid, got[0], got[1], got[2], why=self.why.get(jid, "") if got[0] > self.at else "")
        # not started by the last round: `t` is that round's moment when no end is predicted after it, else the next
        # predicted end, which the step cap or the horizon kept the forecast from; nothing changes before it
        endless = tuple(i for i in self.running if i not in self.ends)
        return Start(jid, None, waits_for=endless, not_before=self.t, why=self.why.get(jid, ""))


async def _durations(ctl: Controller, jobs: list[Job]) -> dict[int, float | None]:
    """How long each job runs once started: its kind's expected duration, capped by its time limit (else that)."""
    out: dict[int, float | None] = {}
    for j in jobs:
        exp = await learning.expected(ctl, j)
        limit = j.spec.time_limit_s
        out[j.id] = min(exp, limit) if exp is not None and limit is not None else exp if exp is not None else limit
    return out


async def forecast(ctl: Controller, probe: Job | None = None) -> tuple[RoundInput | None, Future | None,
                                                                          dict[int, str]]:
    """Step the round's snapshot forward (see the module's docstring): (the snapshot, the finished forecast, the
    queued jobs it does not follow with their reasons now: those waiting for a dependency). `probe`: a job that
    is not queued (submit --test-only), added to the waiting ones. (None, None, ...) when nothing waits."""
    jobs = await ctl.db(job_cache(ctl).read, ctl.store)
    for j in jobs.active:
        # the running jobs' kinds' histories read (predicted_ends reads only those already read)
        await learning.history_of(ctl, job_kind(j))
    async with ctl.lock:
        inp = await round_input(ctl, always=probe is not None)
    if inp is None:
        return None, None, {}
    view = inp.view
    pending = list(inp.pending)
    taken = {j.id for j in pending}
    later: dict[int, tuple[float, Job]] = {}
    aside: dict[int, str] = {}
    jobs = await ctl.db(job_cache(ctl).read, ctl.store)
    for j in jobs.queued:
        if j.id in taken:
            continue
        t = ctl.retry_at(j)
        if t is not None and t > inp.at:
            later[j.id] = (t, j)  # a retry: it may start once its backoff is over
        elif j.spec.array is not None and j.spec.array.max_running and not j.spec.dependency:
            pending.append(j)  # held by its array's %N: the forecast applies the limit at each step
        else:
            aside[j.id] = j.reason or "Dependency"
    if probe is not None:
        pending.append(probe)
        if view.user_usage is not None and probe.user not in view.user_usage:
            # fair share for a user with nothing queued: as the round would count them once they submit
            users = frozenset(view.user_usage) | {probe.user}
            view = replace(view, user_usage=await round_usage(ctl, inp.now, users))
    durations = await _durations(ctl, [*pending, *(j for _t, j in later.values()),
                                       *(j for j in inp.active.values() if j.state is not JobState.RUNNING)])
    future = Future.of(view, pending, inp.at, durations, later, horizon_s=HORIZON_S, max_steps=MAX_STEPS)
    future.predicted = [*(j.id for j in pending), *later]
    while not future.done:
        # each step in the round's thread, as a round: the event loop answers requests meanwhile, and real rounds
        # (queued on the same thread) run between steps
        await off_loop(future.step)
    return inp, future, aside


def _wall(inp: RoundInput, t: float | None) -> float | None:
    return None if t is None else inp.now + (t - inp.at)


def _nodes(placements: tuple[Placement, ...]) -> list[str]:
    return list(dict.fromkeys(p.node for p in placements))


def _waits_text(ids: tuple[int, ...]) -> str:
    shown = ", ".join(map(str, ids[:3])) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
    return f"job(s) {shown}"


def describe(inp: RoundInput, s: Start) -> dict[str, Any]:
    """A predicted start as `--test-only` and `queue --start --json` give it (ISO times)."""
    start = _wall(inp, s.at)
    if s.at is not None:
        at_once = s.at <= inp.at
        reason = ("it would start now" if at_once else
                  f"it would start when {_waits_text(s.waits_for)} end" if s.waits_for else
                  "it would start then")
        return {"start_time": iso(start), "start_in_s": max(0.0, s.at - inp.at), "now": at_once,
                "nodes": _nodes(s.placements),
                "placements": [{"node": p.node, "devices": list(p.devices)} for p in s.placements],
                "waits_for": list(s.waits_for), "not_before": None, "why": s.why, "reason": reason}
    not_before = _wall(inp, s.not_before)
    if s.waits_for:
        reason = (f"cannot tell: it waits for {_waits_text(s.waits_for)}, whose end nobody can predict (no progress, "
                  f"history or time limit); not before {iso(not_before)}")
    else:
        reason = f"not before {iso(not_before)}"
    if s.why:
        reason += f" (the round says: {s.why})"
    return {"start_time": None, "start_in_s": None, "now": False, "nodes": [], "placements": [],
            "waits_for": list(s.waits_for), "not_before": iso(not_before), "why": s.why, "reason": reason}


def _about(inp: RoundInput, future: Future) -> dict[str, Any]:
    return {"steps": future.steps, "max_steps": future.max_steps, "horizon_s": future.horizon_s,
            "reached": iso(_wall(inp, future.t))}


async def test_only(ctl: Controller, spec: JobSpec, user: str) -> dict[str, Any]:
    """When and where a job of `spec` submitted now by `user` would start, without queueing it: the controller's
    round stepped forward with the job added (see the module's docstring)."""
    now = ctl.clock.time()
    up = [rt.node for rt in ctl.nodes.values() if rt.node.state is NodeState.UP]
    labels = {rt.name: node_labels(rt.name, rt.config.labels, spec.resources.constraint) for rt in ctl.nodes.values()}
    why = unsatisfiable(spec.resources, up, labels=labels, aliases=ctl.settings.gpu_aliases)
    jobs = await ctl.db(job_cache(ctl).read, ctl.store)
    # (an id after every job's: among equals the round serves it last, as it would a job submitted now)
    last_id = max((j.id for j in (*jobs.queued, *jobs.active)), default=0)
    probe = Job(id=last_id + 1, spec=spec, user=user,
                state=JobState.PENDING, reason="", submit_time=now)
    expected = await learning.expected(ctl, probe)
    base: dict[str, Any] = {"expected_duration_s": expected, "kind": job_kind(probe)}
    if why is not None:
        return {**base, "start_time": None, "start_in_s": None, "now": False, "nodes": [], "placements": [],
                "waits_for": [], "not_before": None, "why": why, "reason": why}
    inp, future, _aside = await forecast(ctl, probe)
    assert inp is not None and future is not None  # (always a snapshot with a probe)
    return {**base, **describe(inp, future.result(probe.id)), "forecast": _about(inp, future)}


async def predicted_starts(ctl: Controller) -> dict[int, dict[str, Any]]:
    """squeue --start: each waiting job's predicted start, node(s) and reason (`describe`), from one forecast."""
    inp, future, aside = await forecast(ctl)
    if inp is None or future is None:
        return {}
    out = {jid: describe(inp, future.result(jid)) for jid in future.predicted}
    for jid, reason in aside.items():
        out[jid] = {"start_time": None, "start_in_s": None, "now": False, "nodes": [], "placements": [],
                    "waits_for": [], "not_before": None, "why": reason,
                    "reason": f"not predicted: it waits for {reason}"}
    return out
