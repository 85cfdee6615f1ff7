"""One scheduling round: the function the live controller and the simulator both call.

    decision = schedule_round(policy, inp, servers)

The policy orders the jobs and names acceptable GPU types; this function grants GPUs gang by gang (all or
nothing, counted per type), keeps running jobs where they are when the policy still wants them on that
type, preempts the running jobs a preemptive plan leaves out, and asks the placer for devices.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from hsched.model import EndReason
from hsched.sched.placement import PackingPlacer, Placer
from hsched.sched.policy import AnyPolicy
from hsched.sched.throughput import ThroughputModel
from hsched.sched.view import JobPhase, JobView, OracleInput, Plan, PolicyInput, RoundDecision, ServerView, Start, Want

_DEFAULT_PLACER = PackingPlacer()


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
) -> PolicyInput:
    """Assemble a PolicyInput: capacity per GPU type from the servers, types ordered fastest first."""
    capacity, gpu_types = _fleet(servers, throughput)
    return PolicyInput(
        now=now,
        jobs=tuple(jobs),
        capacity=capacity,
        gpu_types=gpu_types,
        throughput=throughput,
        checkpoint_cost_s=checkpoint_cost_s,
        round_s=round_s,
        user_usage=dict(user_usage or {}),
        starts_only=starts_only,
    )


# The simulator hands the same tuple of servers every round: remember the last fleet's capacity and type order.
_last_fleet: tuple[Sequence[ServerView], ThroughputModel, dict[str, int], tuple[str, ...]] | None = None


def _fleet(servers: Sequence[ServerView], throughput: ThroughputModel) -> tuple[dict[str, int], tuple[str, ...]]:
    global _last_fleet
    last = _last_fleet
    if last is not None and last[0] is servers and last[1] is throughput and isinstance(servers, tuple):
        return dict(last[2]), last[3]
    capacity: dict[str, int] = {}
    for s in servers:
        capacity[s.gpu_type] = capacity.get(s.gpu_type, 0) + len(s.devices)
    gpu_types = throughput.order_types(capacity)
    _last_fleet = (servers, throughput, dict(capacity), gpu_types)
    return capacity, gpu_types


def schedule_round(
    policy: AnyPolicy,
    inp: PolicyInput,
    servers: Sequence[ServerView],
    *,
    remaining_s: Mapping[int, float] | None = None,
    placer: Placer | None = None,
) -> RoundDecision:
    """Run one round.

    Args:
        policy: from `make_policy(name)`.
        inp: what the policy may see (`build_input`).
        servers: the servers that are up; their devices are all the GPUs there are.
        remaining_s: remaining seconds per job on its fastest type; read only by clairvoyant (`*-oracle`)
            policies and required for them. A non-clairvoyant policy never receives it.
        placer: chooses devices for a gang on one GPU type (default: consolidating best fit).

    Returns:
        Which running jobs to stop, which jobs to start or move (with devices), and why the rest wait.
    """
    if policy.clairvoyant:
        if remaining_s is None:
            raise ValueError(f"policy {policy.name!r} is clairvoyant and needs remaining_s")
        plan = policy.plan(OracleInput(inp, remaining_s))  # type: ignore[arg-type]
    else:
        plan = policy.plan(inp)  # type: ignore[arg-type]
    if inp.starts_only:
        plan = Plan(plan.wants, preempt=False, strict=True)
    return apply_plan(plan, inp, servers, placer or _DEFAULT_PLACER)


def _choose_type(job: JobView, want: Want, caps: Mapping[str, int], inp: PolicyInput,
                 _runnable: dict[tuple[str, int, tuple[str, ...]], tuple[str, ...]] | None = None) -> str | None:
    """The type to grant `job` under `want`, or None. `_runnable`: a round's memo of runnable types per kind."""
    if want.types:
        allowed = job.gpu_types
        for t in want.types:
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


def apply_plan(plan: Plan, inp: PolicyInput, servers: Sequence[ServerView], placer: Placer) -> RoundDecision:
    """Turn a policy's plan into stops, starts and moves with concrete devices."""
    jobs = {j.id: j for j in inp.jobs}
    caps = dict(inp.capacity)
    fixed: set[int] = set()
    running = JobPhase.RUNNING
    if not plan.preempt:
        for j in inp.jobs:
            if j.phase is running and j.gpu_type is not None:
                caps[j.gpu_type] = caps.get(j.gpu_type, 0) - j.gpus
                fixed.add(j.id)
    granted: dict[int, str] = {}
    runnable: dict[tuple[str, int, tuple[str, ...]], tuple[str, ...]] = {}
    get = jobs.get
    seen = len(plan.wants)  # wants looked at; a strict plan stops at the first that does not fit
    for n, w in enumerate(plan.wants):
        jid = w.job_id
        j = get(jid)
        if j is None or jid in fixed or jid in granted:
            continue
        if w.types:  # the common case of _choose_type, inline: the first acceptable type with room
            t = None
            allowed, g = j.gpu_types, j.gpus
            for x in w.types:
                if caps.get(x, 0) >= g and (not allowed or x in allowed):
                    t = x
                    break
        else:
            t = _choose_type(j, w, caps, inp, runnable)
        if t is None:
            if plan.strict:
                seen = n + 1
                break
            continue
        caps[t] -= j.gpus
        granted[jid] = t

    preempt: list[int] = []
    keep: list[JobView] = []
    to_place: list[tuple[JobView, str]] = []
    waits: list[int] = []
    for j in inp.jobs:
        t = granted.get(j.id)
        if j.phase is running:
            if t == j.gpu_type or j.id in fixed:
                keep.append(j)
            elif t is not None:
                to_place.append((j, t))
            else:
                preempt.append(j.id)
        elif t is not None:
            to_place.append((j, t))
        else:
            waits.append(j.id)
    # a job the plan wanted (and looked at) waits for resources; one it did not want waits for its turn
    considered = {w.job_id for w in plan.wants[:seen]} if waits else set()
    waiting = {jid: _RESOURCES if jid in considered else _PRIORITY for jid in waits}

    starts: list[Start] = []
    if to_place:  # free devices are needed only to place someone
        starts, unplaced = _place(to_place, keep, plan, servers, placer, preempt)
        if unplaced:
            # a job granted GPUs that no server could hold waits for resources, in the jobs' order
            waiting = {j.id: _RESOURCES if j.id in unplaced else waiting[j.id]
                       for j in inp.jobs if j.id in waiting or j.id in unplaced}
    return RoundDecision(preempt=tuple(preempt), starts=tuple(starts), waiting=waiting)


def _place(
    to_place: list[tuple[JobView, str]],
    keep: list[JobView],
    plan: Plan,
    servers: Sequence[ServerView],
    placer: Placer,
    preempt: list[int],
) -> tuple[list[Start], set[int]]:
    """Devices for the granted jobs around the kept ones; a running job that cannot be placed is preempted."""
    needed = {t for _, t in to_place}
    by_type: dict[str, list[ServerView]] = {}
    for s in servers:
        if s.gpu_type in needed:
            by_type.setdefault(s.gpu_type, []).append(s)
    # free devices only on the servers of the types being placed: the rest are never looked at
    mine = {s.name for ss in by_type.values() for s in ss}
    used = {d for j in keep for p in j.placement if p.node in mine for d in p.devices}
    free: dict[str, list[str]] = {s.name: [d for d in s.devices if d not in used]
                                  for ss in by_type.values() for s in ss}
    rank = {w.job_id: i for i, w in enumerate(plan.wants)}
    # big gangs first so that small jobs do not fragment the servers they need
    to_place.sort(key=lambda jt: (-jt[0].gpus, rank.get(jt[0].id, 0)))
    starts: list[Start] = []
    unplaced: set[int] = set()
    for j, t in to_place:
        where = placer.place(j.gpus, by_type.get(t, []), free, j.max_servers, job=j)
        if where is None:
            unplaced.add(j.id)
            if j.running:
                preempt.append(j.id)
            continue
        for p in where:
            taken = set(p.devices)
            free[p.node] = [d for d in free[p.node] if d not in taken]
        starts.append(Start(j.id, t, where, migrate=j.running))
    starts.sort(key=lambda s: rank.get(s.job_id, 0))
    return starts, unplaced
