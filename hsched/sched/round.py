"""One scheduling round: the function the live controller and the simulator both call.

    decision = schedule_round(policy, inp, servers, rule=rule)

The policy orders the jobs and names acceptable GPU types; this module grants GPUs gang by gang (all or
nothing, counted per type), keeps running jobs where they are when the policy still wants them on that
type, and asks the placer for devices. Which running jobs may be stopped is `hsched.sched.preempt`'s to say:
`apply_rule` applies a preemptive plan only as far as the time-sharing rule allows, and `schedule_round`
then lets waiting jobs preempt by QoS class (the live controller calls the same two steps, with its own
backfill between them: hsched.sched.pipeline).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import replace
from typing import Final, cast

from hsched.model import EndReason, Placement
from hsched.sched.frozen import slot_setters
from hsched.sched.placement import PackingPlacer, Placer, place_granted
from hsched.sched.policies.base import AnyPolicy, view_at
from hsched.sched.preempt import PreemptRule, Victims, displaced, protected
from hsched.sched.throughput import ThroughputModel
from hsched.sched.view import (
    JobPhase,
    JobView,
    OracleInput,
    Plan,
    PolicyInput,
    Preempt,
    RoundDecision,
    ServerView,
    Start,
)

_DEFAULT_PLACER = PackingPlacer()
# JobView's fields by position, for the loops over the wants and every job each round: a NamedTuple's field read by
# name is a generic attribute lookup (policies.base.view_getter), an index a tuple's own (literals, so the types check
# field by field; `view_at` checks them against the view's own at import)
_JID: Final = 0
_GPUS: Final = 2
_PHASE: Final = 4
_GTYPE: Final = 8
_PLACED: Final = 9
_GTYPES: Final = 16
view_at(id=_JID, gpus=_GPUS, phase=_PHASE, gpu_type=_GTYPE, placement=_PLACED, gpu_types=_GTYPES)
_new = object.__new__
_D_PREEMPT, _D_STARTS, _D_WAITING, _D_QOS = slot_setters(RoundDecision, "preempt", "starts", "waiting", "preemptions")


def _decision(preempt: tuple[int, ...], starts: tuple[Start, ...], waiting: dict[int, str]) -> RoundDecision:
    """`RoundDecision(preempt, starts, waiting)`, its slots set directly (hsched.sched.frozen)."""
    d = _new(RoundDecision)
    _D_PREEMPT(d, preempt)
    _D_STARTS(d, starts)
    _D_WAITING(d, waiting)
    _D_QOS(d, ())
    return d


def build_input(
    now: float,
    jobs: Iterable[JobView],
    servers: Sequence[ServerView],
    throughput: ThroughputModel,
    *,
    checkpoint_cost_s: float = 0.0,
    round_s: float = 360.0,
    user_usage: Mapping[str, float] | None = None,
    starts_only: bool = False,
    checkpoint_costs: Mapping[int, float] | None = None,
    forecast_s: Mapping[int, float] | None = None,
    quantum_s: float | None = None,
    cache: MutableMapping[str, object] | None = None,
) -> PolicyInput:
    """Assemble a PolicyInput: capacity per GPU type from the servers, types ordered fastest first."""
    if cache is None:
        cache = {}
    capacity, gpu_types = _fleet(servers, throughput, cache)
    # (PolicyInput(...) with its slots set directly: hsched.sched.frozen)
    inp = _new(PolicyInput)
    _I_NOW(inp, now)
    _I_JOBS(inp, tuple(jobs))
    _I_CAPACITY(inp, capacity)
    _I_TYPES(inp, gpu_types)
    _I_MODEL(inp, throughput)
    _I_COST(inp, checkpoint_cost_s)
    _I_ROUND(inp, round_s)
    _I_USAGE(inp, dict(user_usage or {}))
    _I_STARTS(inp, starts_only)
    _I_COSTS(inp, checkpoint_costs or {})
    _I_FORECAST(inp, forecast_s or {})
    _I_QUANTUM(inp, quantum_s)
    _I_CACHE(inp, cache)
    return inp


(_I_NOW, _I_JOBS, _I_CAPACITY, _I_TYPES, _I_MODEL, _I_COST, _I_ROUND, _I_USAGE, _I_STARTS, _I_COSTS, _I_FORECAST,
 _I_QUANTUM, _I_CACHE) = slot_setters(PolicyInput, "now", "jobs", "capacity", "gpu_types", "throughput",
                                      "checkpoint_cost_s", "round_s", "user_usage", "starts_only", "checkpoint_costs",
                                      "forecast_s", "quantum_s", "cache")


FleetMemo = tuple[Sequence[ServerView], ThroughputModel, dict[str, int], tuple[str, ...]]
_FLEET, _FREE, _ORDERS = "round.fleet", "round.free", "round.orders"
"""The caller's cache keys (PolicyInput.cache) of the last whole fleet's and the last free servers' `_fleet`, and of
the GPU types' orders by the types present."""


def _fleet(servers: Sequence[ServerView], throughput: ThroughputModel, cache: MutableMapping[str, object]
           ) -> tuple[dict[str, int], tuple[str, ...]]:
    """Capacity per GPU type and the types fastest first. The simulator hands the same tuple of servers to every full
    round: that fleet's answer is kept in the caller's `cache`. (Its start-only rounds, in between, hand tuples of the
    free servers, new each time: they are kept apart, so they do not push the whole fleet out; that alone missed 60%
    of the time on bench_sim.py --scale.)"""
    last_fleet = cast("FleetMemo | None", cache.get(_FLEET))
    for last in (last_fleet, cast("FleetMemo | None", cache.get(_FREE))):
        if last is not None and last[0] is servers and last[1] is throughput and isinstance(servers, tuple):
            return dict(last[2]), last[3]
    capacity: dict[str, int] = {}
    for s in servers:
        capacity[s.gpu_type] = capacity.get(s.gpu_type, 0) + len(s.devices)
    # the types' order depends on the model and which types there are alone: kept per list of types, for the free
    # servers' new tuple every start-only round (a sort by the prior's speeds each time, 652 times on ed69ec 16:16:16)
    orders = cast("tuple[ThroughputModel, dict[tuple[str, ...], tuple[str, ...]]] | None", cache.get(_ORDERS))
    if orders is None or orders[0] is not throughput:
        orders = cache[_ORDERS] = (throughput, {})
    present = tuple(capacity)
    gpu_types = orders[1].get(present)
    if gpu_types is None:
        gpu_types = orders[1][present] = throughput.order_types(capacity)
    entry = (servers, throughput, dict(capacity), gpu_types)
    if last_fleet is None or len(servers) >= len(last_fleet[0]):
        cache[_FLEET] = entry
    else:
        cache[_FREE] = entry
    return capacity, gpu_types


_NO_QOS = PreemptRule()


def schedule_round(
    policy: AnyPolicy,
    inp: PolicyInput,
    servers: Sequence[ServerView],
    *,
    remaining_s: Mapping[int, float] | None = None,
    placer: Placer | None = None,
    rule: PreemptRule | None = None,
    reasons: bool = True,
    free_now: Mapping[str, Sequence[str]] | None = None,
) -> RoundDecision:
    """Run one round: the policy's plan under the time-sharing rule, then QoS preemption for those left waiting.

    Args:
        policy: from `make_policy(name)`.
        inp: what the policy may see (`build_input`).
        servers: the servers that are up; their devices are all the GPUs there are.
        remaining_s: remaining seconds per job on its fastest type; read only by clairvoyant (`*-oracle`)
            policies and required for them. A non-clairvoyant policy never receives it.
        placer: chooses devices for a gang on one GPU type (default: consolidating best fit).
        rule: who may stop whom (default: time-sharing of jobs that checkpoint, no QoS preemption); the
            controller and the simulator pass the settings' QoS table.
        reasons: False: `RoundDecision.waiting` stays empty unless QoS preemption reads it (the simulator, which
            never reports why a job waits: naming a reason for each waiting job was a pass over them every round).
        free_now: each server's devices that no running job holds now, in its order, where the caller keeps them (the
            simulator: a round then reads the devices of the jobs it stops or moves, not of every job it keeps).

    Returns:
        Which running jobs to stop, which jobs to start or move (with devices), and why the rest wait.
    """
    plan = make_plan(policy, inp, remaining_s)
    placer = placer or _DEFAULT_PLACER
    rule = rule or _NO_QOS
    decision = apply_rule(plan, inp, servers, placer, rule, reasons=reasons or bool(rule.qos_preempts),
                          free_now=free_now)
    if inp.starts_only or not rule.qos_preempts or not decision.waiting:
        return decision
    return qos_preemption(decision, plan, inp, servers, placer, rule)


def make_plan(policy: AnyPolicy, inp: PolicyInput, remaining_s: Mapping[int, float] | None = None) -> Plan:
    """The policy's plan for this round; a start-only round's is never preemptive and always strict."""
    if policy.clairvoyant:
        if remaining_s is None:
            raise ValueError(f"policy {policy.name!r} is clairvoyant and needs remaining_s")
        plan = policy.plan(OracleInput(inp, remaining_s))  # type: ignore[arg-type]
    else:
        plan = policy.plan(inp)  # type: ignore[arg-type]
    if inp.starts_only:
        plan = Plan(plan.wants, preempt=False, strict=True)
    return plan


def apply_rule(plan: Plan, inp: PolicyInput, servers: Sequence[ServerView], placer: Placer,
               rule: PreemptRule, *, reasons: bool = True,
               free_now: Mapping[str, Sequence[str]] | None = None) -> RoundDecision:
    """`apply_plan`, stopping only the running jobs the time-sharing rule lets the plan stop.

    Jobs that may not be time-shared stay where they are from the start. A job the plan stops for nobody, or
    for a job of another class, is put back and the plan applied again; a waiting job that took the GPUs of
    a job of another class leaves the plan (QoS preemption may still serve it) and waits for resources.
    Every pass keeps at least one more running job in place, so this ends. (`reasons`, `free_now`: as
    `schedule_round`'s.)
    """
    jobs = {j[_JID]: j for j in inp.jobs}  # (a comprehension: a quarter faster than dict(zip(map(...))) here)
    if not plan.preempt:
        return _apply_plan(plan, inp, servers, placer, (), jobs, reasons, free_now)
    fixed = protected(rule, inp.jobs, inp.now)
    decision = _apply_plan(plan, inp, servers, placer, fixed, jobs, reasons, free_now)
    if not decision.preempt:
        return decision
    refused: set[int] = set()
    while True:
        keep, took = displaced(decision, jobs)
        if not keep:
            break
        # a running job that moved onto an unequal's GPUs stays put instead; a waiting one leaves the plan
        fixed = fixed | keep | {t for t in took if jobs[t].running}
        out = {t for t in took if not jobs[t].running}
        if out:
            refused |= out
            plan = Plan(tuple(w for w in plan.wants if w.job_id not in out), plan.preempt, plan.strict)
        decision = _apply_plan(plan, inp, servers, placer, fixed, jobs, reasons, free_now)
    if refused and reasons:
        waiting = {jid: _RESOURCES if jid in refused else why for jid, why in decision.waiting.items()}
        decision = replace(decision, waiting=waiting)
    return decision


def qos_preemption(decision: RoundDecision, plan: Plan, inp: PolicyInput, servers: Sequence[ServerView],
                   placer: Placer, rule: PreemptRule) -> RoundDecision:
    """The simulator's QoS step after `apply_rule`: each waiting job whose class may preempt a class that
    runs here (in the order the plan serves them, then by arrival) starts on free devices if it fits, else
    preempts the victims `Victims` chooses and starts in their place. The victims' devices it does not use
    stay out of this round, as the live controller's do while they are released."""
    waiting = decision.waiting
    running = JobPhase.RUNNING
    wanted_classes = {j.qos for j in inp.jobs if j.phase is not running and j.id in waiting}
    targets = frozenset().union(*(rule.qos_preempts.get(c, frozenset()) for c in wanted_classes))
    if not targets:
        return decision
    stopped = set(decision.preempt)
    stopped.update(s.job_id for s in decision.starts if s.migrate)
    kept = [j for j in inp.jobs if j.phase is running and j.id not in stopped]
    if not any(j.qos in targets for j in kept):
        return decision
    victims = Victims(rule, kept)
    present = victims.classes()
    jobs = {j.id: j for j in inp.jobs}
    rank = {w.job_id: i for i, w in enumerate(plan.wants)}
    order = sorted(waiting, key=lambda jid: (0, rank[jid]) if jid in rank else (1, 0))
    # free devices after this round's starts; a server's devices stay in its own order (the placer's)
    used = {d for j in kept for p in j.placement for d in p.devices}
    used.update(d for s in decision.starts for p in s.placement for d in p.devices)
    free: dict[str, list[str]] = {s.name: [d for d in s.devices if d not in used] for s in servers}
    by_name = {s.name: s for s in servers}
    preempt = list(decision.preempt)
    starts = list(decision.starts)
    preemptions: list[Preempt] = []
    left = dict(waiting)
    for jid in order:
        w = jobs[jid]
        if not rule.qos_preempts.get(w.qos, frozenset()) & present:
            continue
        types = inp.throughput.fastest_types(w.job_type, w.gpus, inp.gpu_types, w.gpu_types)
        start = _fit_free(w, types, servers, free, placer)
        if start is None:
            nodes = [s.name for t in types for s in servers if s.gpu_type == t]

            def fits(node: str, freed: frozenset[str], w: JobView = w) -> bool:
                return _place_one(w, by_name[node], free[node], freed, placer) is not None

            chosen = victims.choose(w, nodes, fits)
            if chosen is None:
                continue
            srv = by_name[chosen.node]
            freed = frozenset(d for v in chosen.victims for p in jobs[v].placement for d in p.devices)
            where = _place_one(w, srv, free[srv.name], freed, placer)
            assert where is not None  # `choose` just asked the same question
            start = Start(w.id, srv.gpu_type, where)
            preempt.extend(chosen.victims)
            preemptions.append(chosen)
            present = victims.classes()
        for p in start.placement:
            taken = set(p.devices)
            free[p.node] = [d for d in free[p.node] if d not in taken]
        starts.append(start)
        del left[jid]
    if len(left) == len(waiting):
        return decision
    return RoundDecision(preempt=tuple(preempt), starts=tuple(starts), waiting=left,
                         preemptions=tuple(preemptions))


def _fit_free(job: JobView, types: Sequence[str], servers: Sequence[ServerView], free: Mapping[str, list[str]],
              placer: Placer) -> Start | None:
    """`job` on free devices of its fastest type that has room, or None."""
    for t in types:
        of_type = [s for s in servers if s.gpu_type == t]
        where = placer.place(job.gpus, of_type, free, job.max_servers, job=job)
        if where is not None:
            return Start(job.id, t, where)
    return None


def _place_one(job: JobView, server: ServerView, free: Sequence[str], freed: frozenset[str],
               placer: Placer) -> tuple[Placement, ...] | None:
    """`job` on one server, on its free devices and `freed`, in the server's device order."""
    avail = [d for d in server.devices if d in freed or d in free] if freed else list(free)
    return placer.place(job.gpus, (server,), {server.name: avail}, 1, job=job)


def _choose_type(job: JobView, types: tuple[str, ...], caps: Mapping[str, int], inp: PolicyInput,
                 _runnable: dict[tuple[str, int, tuple[str, ...]], tuple[str, ...]] | None = None) -> str | None:
    """The type to grant `job` under a want of these `types`, or None. `_runnable`: a round's memo of runnable types
    per kind."""
    if types:
        allowed = job.gpu_types
        for t in types:
            if caps.get(t, 0) >= job.gpus and (not allowed or t in allowed):
                return t
        return None
    # Heterogeneity-unaware: stay put, else any type with room, picked pseudo-randomly but reproducibly from
    # the job id (Gavel's base FIFO picks a random available worker type; a blind scheduler sees one pool).
    if job.gpu_type is not None and caps.get(job.gpu_type, 0) >= job.gpus:
        return job.gpu_type
    key = (job.job_type, job.gpus, job.gpu_types)
    runnable = _runnable.get(key) if _runnable is not None else None
    if runnable is None:
        rel = inp.throughput.rel_speeds(job.job_type, job.gpus, inp.gpu_types)
        runnable = tuple(t for t in inp.gpu_types if rel.get(t, 0.0) > 0 and job.allows(t))
        if _runnable is not None:
            _runnable[key] = runnable
    room = [t for t in runnable if caps.get(t, 0) >= job.gpus]
    if not room:
        return None
    return room[_mix(job.id) % len(room)]


def _mix(n: int) -> int:
    """A fixed integer hash (splitmix64 finaliser): Python's hash() of ints is the identity."""
    z = (n + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return z ^ (z >> 31)


# why a job that did not start waits (squeue's reasons)
_RESOURCES, _PRIORITY = EndReason.RESOURCES.value, EndReason.PRIORITY.value


def apply_plan(plan: Plan, inp: PolicyInput, servers: Sequence[ServerView], placer: Placer,
               hold: Iterable[int] = ()) -> RoundDecision:
    """Turn a policy's plan into stops, starts and moves with concrete devices. Running jobs in `hold` (all
    of them when the plan is not preemptive) stay where they are, whatever the plan says."""
    return _apply_plan(plan, inp, servers, placer, hold, {j.id: j for j in inp.jobs})


def _apply_plan(plan: Plan, inp: PolicyInput, servers: Sequence[ServerView], placer: Placer, hold: Iterable[int],
                jobs: Mapping[int, JobView], reasons: bool = True,
                free_now: Mapping[str, Sequence[str]] | None = None) -> RoundDecision:
    caps = dict(inp.capacity)
    fixed: set[int] = set()
    running = JobPhase.RUNNING
    pinned = hold if isinstance(hold, (set, frozenset)) else frozenset(hold)
    if not plan.preempt or pinned:
        every = not plan.preempt
        # (the pinned jobs alone when they are fewer than all: the live round pins its 512 running jobs among 2,500)
        for r in (inp.jobs if every or len(pinned) >= len(jobs) else filter(None, map(jobs.get, pinned))):
            if r.phase is running and (every or r.id in pinned):
                # one on a server that is not up (no type) holds nothing the round hands out, but stays
                if r.gpu_type is not None:
                    caps[r.gpu_type] = caps.get(r.gpu_type, 0) - r.gpus
                fixed.add(r.id)
    granted: dict[int, str] = {}
    runnable: dict[tuple[str, int, tuple[str, ...]], tuple[str, ...]] = {}
    get: Callable[[int], JobView | None] = jobs.get
    seen = len(plan.wants)  # wants looked at; a strict plan stops at the first that does not fit
    repeated = False
    strict = plan.strict
    # the starts and moves, in the plan's order (granted's): every granted job but a running one granted its own type
    # (a fixed job is never granted)
    to_place: list[tuple[JobView, str]] = []
    for n, (jid, wtypes) in enumerate(plan.wants):  # (a Want is a (job id, types) tuple)
        j = get(jid)
        if j is None or jid in granted or jid in fixed:
            if j is not None and jid in granted:
                repeated = True  # (wanted twice: `place_granted` then ranks it by its last want, as it always did)
            continue
        g = j[_GPUS]
        if wtypes and not j[_GTYPES]:
            # the usual grant, inline: the first type the plan names has room (else `_choose_type` looks on)
            x = wtypes[0]
            room = caps.get(x, 0)
            if room >= g:
                caps[x] = room - g
                granted[jid] = x
                if j[_PHASE] is not running or x != j[_GTYPE]:
                    to_place.append((j, x))
                continue
        t = _choose_type(j, wtypes, caps, inp, runnable)
        if t is None:
            if strict:
                seen = n + 1
                break
            continue
        caps[t] -= g
        granted[jid] = t
        if j.phase is not running or t != j.gpu_type:
            to_place.append((j, t))

    preempt: list[int] = []
    keep: list[JobView] = []
    if free_now is None:
        granted_get = granted.get
        for j in inp.jobs:
            if j[_PHASE] is running:
                jid = j[_JID]
                t = granted_get(jid)
                if t == j[_GTYPE] or jid in fixed:
                    keep.append(j)
                elif t is None:
                    preempt.append(jid)
                # (else a move: placed below, with the starts)
    else:
        # the same stops; the kept jobs are not listed, as the placement reads the free devices (a job granted nothing
        # stays where it is only where it holds no type, `t == j[_GTYPE]` above with both None)
        for j in inp.jobs:
            if j[_PHASE] is running and (jid := j[_JID]) not in granted and j[_GTYPE] is not None and jid not in fixed:
                preempt.append(jid)
    starts: list[Start] = []
    unplaced: set[int] = set()
    if to_place:  # free devices are needed only to place someone
        starts, unplaced = place_granted(to_place, keep, plan, servers, placer, preempt, repeated, free_now, jobs)
    waiting: dict[int, str] = {}
    if reasons:
        # a job the plan wanted (and looked at) waits for resources, or if granted GPUs no server could hold; one it
        # did not want waits for its turn
        considered = {wid for wid, _types in plan.wants[:seen]}
        waiting = {j.id: _RESOURCES if j.id in considered or j.id in unplaced else _PRIORITY for j in inp.jobs
                   if (j.phase is not running and j.id not in granted) or j.id in unplaced}
    return _decision(tuple(preempt), tuple(starts), waiting)
