"""The policy's plan over the live fleet: the simulator's very code (hsched.sched.round). Nodes become servers by the
one conversion (hsched.sched.servers), jobs become JobViews (hsched.sched.stages.views), the policy plans, and
`apply_rule` applies the plan under the preemption rule. Devices are chosen by `LivePlacer`: the simulator's best-fit
server choice with the real constraints (the round's `fit_free`). Running jobs that proved they checkpoint may be
moved to faster GPUs or time-shared away (`moves`), at the gain and cost the policy's `move_gain` hook says. Pure."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import replace

from hsched.model import DEFAULT_QOS, Job, Node, Placement, workload_of
from hsched.sched.fleet import FleetView, Launch, Move, catalog_throughput, gpu_type_of, order, secs
from hsched.sched.placement import fragmentation_key
from hsched.sched.policies.base import AnyPolicy
from hsched.sched.registry import make_policy
from hsched.sched.round import apply_rule, build_input, make_plan
from hsched.sched.servers import server_of
from hsched.sched.stages.backfill import Round
from hsched.sched.stages.caps import plannable
from hsched.sched.stages.eligibility import NodesKey, host_memory_per_gpu, slowest_for_inference
from hsched.sched.stages.fabric import gang_on_fabric, on_fabric
from hsched.sched.stages.reservation import order_keys
from hsched.sched.stages.views import ARRIVAL, JOB_ID, MODEL_MEMORY, USER, pending_views, running_views
from hsched.sched.stages.work import Work
from hsched.sched.state import PREEMPTING, RESOURCES
from hsched.sched.throughput import ThroughputModel
from hsched.sched.view import QOS_RANK, JobView, PolicyInput, Preempt, RoundDecision, ServerView, qos_rank
from hsched.topo.fabric import Fabric

Fit = Callable[[Node, Job, Sequence[str], Collection[str]], Placement | None]
"""Place `job` on `node` using only the given free devices (and the busy ones of the last argument), or None."""


class LivePlacer:
    """The simulator's server choice (best fit, NVLink first) with real constraints and topology inside."""

    def __init__(self, nodes: Mapping[str, Node], jobs: Mapping[int, Job], fit: Fit,
                 prefer: Mapping[int, str] | None = None, labels: Mapping[str, frozenset[str]] | None = None,
                 moving: Mapping[int, Job] | None = None, busy: Collection[str] = (),
                 stoppable: Collection[str] = (), fabric: Fabric | None = None) -> None:
        self.nodes = nodes
        self.fabric = fabric or Fabric()
        """The switch layout: with it or the nodes' NICs, a gang's nodes are those of least modelled cost."""
        self.jobs = jobs
        self.fit = fit
        self.prefer = prefer or {}
        self.labels = labels or {}
        self.moving = moving or {}
        """Running jobs that may move (they checkpoint): placed only on devices free now (`busy` are not)."""
        self.busy = busy
        self.stoppable = stoppable
        """The devices of those jobs: a waiting job may be placed on them (the plan time-shares them away)."""

    def place(self, gpus: int, servers: Sequence[ServerView], free: Mapping[str, Sequence[str]],
              max_servers: int | None, job: JobView | None = None) -> tuple[Placement, ...] | None:
        if job is None:
            return None
        j = self.jobs.get(job.id)
        stoppable = self.stoppable
        if j is None:
            stoppable = ()
            j = self.moving.get(job.id)
            if j is None:
                return None  # a running job that does not checkpoint: never moved
            # a move goes to GPUs free now, never onto those of a job stopped this round (it would wait for them,
            # and a move is worth its checkpoint only if it starts at once)
            busy = self.busy
            free = {name: [u for u in devs if u not in busy] for name, devs in free.items()}
        home = self.prefer.get(j.id)
        gpus_each = j.spec.resources.gpus
        # the node holding the job's checkpoint first (no copy), then the fragmentation-aware best fit (a gang on
        # NVLink, a single GPU where it breaks no large NVLink domain: hsched.sched.placement.fragmentation_key);
        # among equals the node with the fewest labels (before the name), so a job that needs no special node
        # leaves those to jobs that do
        off = j.spec.resources.offload

        def key(s: ServerView) -> tuple[bool, float, tuple[int, int, int], int, str]:
            node = self.nodes[s.name]
            frag = fragmentation_key(s.link, len(node.devices), len(free.get(s.name, ())), gpus_each)
            # a job that offloads to host memory goes where each GPU has the most of it (issue 15, item 6)
            return (s.name != home, -host_memory_per_gpu(node) if off else 0.0, frag,
                    len(self.labels.get(s.name, ())), s.name)

        ranked = sorted(servers, key=key)
        need = j.spec.resources.nodes
        if need > 1 and on_fabric(self.fabric, nodes := [self.nodes[s.name] for s in ranked]):
            job_ = j

            def share(node: Node, among: Collection[str] | None) -> Placement | None:
                return self.fit(node, job_, free.get(node.name, ()) if among is None else list(among), stoppable)

            return gang_on_fabric(self.fabric, need, gpus_each, nodes, share,
                                  lambda node: list(free.get(node.name, ())))
        out: list[Placement] = []
        for s in ranked:
            p = self.fit(self.nodes[s.name], j, free.get(s.name, ()), stoppable)
            if p is not None:
                out.append(p)
                if len(out) == need:
                    return tuple(out)
        return None


def remaining_times(views: Sequence[JobView], fleet: FleetView, movable: Mapping[int, float], now: float,
                    model: ThroughputModel, gpu_types: tuple[str, ...]) -> dict[int, float]:
    """`PolicyInput.forecast_s`: remaining seconds on each job's fastest type, where known: the running jobs that may
    be time-shared or moved (the work its progress says is left, over its speed, counted down since its last report:
    `FleetView.running_left`; else its predicted end), and the waiting ones whose last attempt reported progress with
    a total (`FleetView.left`). A running job's seconds where it runs, times its speed there relative to its fastest
    type, as attained service is counted. The simulator gives the policy the same figure from the same things (its
    jobs' work left over their speed, hsched.sim.engine._ProgressLeft): a running job ranked by a predicted end from
    history and a waiting one by its progress swapped places every quantum (issue 33)."""
    out: dict[int, float] = {}
    ends, left, running_left = fleet.ends, fleet.left, fleet.running_left
    for v in views:
        if v.gpu_type is not None:
            if v.id not in movable:
                continue
            hit_r = running_left.get(v.id)
            if hit_r is not None:
                rel = model.rel_speeds(v.job_type, v.gpus, gpu_types).get(hit_r[2]) or 1.0
                out[v.id] = max(0.0, hit_r[1] - max(0.0, now - hit_r[0])) * rel
                continue
            end = ends.get(v.id)
            if end is not None:
                rel = model.rel_speeds(v.job_type, v.gpus, gpu_types).get(v.gpu_type) or 1.0
                out[v.id] = max(0.0, end - now) * rel
        elif (hit := left.get(v.id)) is not None:
            rel = model.rel_speeds(v.job_type, v.gpus, gpu_types).get(hit[1]) or 1.0
            out[v.id] = hit[0] * rel
    return out


_CLASS = operator.attrgetter("qos", "priority")
"""A waiting job's view's (QoS class, priority): the order backfill serves the jobs the plan leaves (`core_round`)."""


def core_round(policy_name: str, pending: Sequence[Job], st: Round, now: float, queued: Mapping[int, Job],
               throughput: ThroughputModel | None = None,
                ) -> tuple[list[tuple[int, tuple[Placement, ...]]], dict[int, str], list[int], frozenset[str],
                           list[Move | Preempt], Iterable[int] | None]:
    """The core's round over the live fleet: (starts of pending jobs, why they wait (running jobs may be there
    too: they never wait), pending job ids in the order the policy serves them, wanted first). `queued`: the
    round's waiting jobs by id, `pending` among them (a job the round plans is running or in `queued`); the
    users the `hsched` policy's fair share serves after the others (none under another policy); and the moves of
    running jobs and time-sharing stops the plan makes (`moves`: only of jobs in `FleetView.movable`); the policy's
    order of the waiting jobs where it has one of its own (`waiting_order`: the reservation's head comes from it).
    """
    fleet = st.fleet
    policy = make_policy(policy_name)
    if policy.clairvoyant:
        raise ValueError(f"policy {policy_name!r} needs job durations, which a live fleet does not know")
    # devices held by jobs that are not running (launching, stopping): no one may be given them this round; nor
    # are GPUs shared jobs hold (the policy plans whole GPUs: several jobs on one device are not its to plan)
    running = tuple(r for r in fleet.running if not r.job.spec.resources.shared) if fleet.shared_use else fleet.running
    held_by_running = {u for r in running for p in r.job.placement for u in p.devices}
    unavailable = frozenset(st.busy - held_by_running)
    servers = [s for n in st.up if (s := server_of(n, gpu_type_of, unavailable)) is not None]
    types_of = {s.name: s.gpu_type for s in servers}
    typed = [n for n in st.up if n.name in types_of]
    base = fleet.user_usage
    if base is None:
        # no history handed in (a view built by hand): the running jobs' GPU-seconds so far
        running_use: dict[str, float] = {}
        for r in fleet.running:
            running_use[r.job.user] = (running_use.get(r.job.user, 0.0)
                                       + r.job.spec.resources.gpus * max(0.0, now - r.started))
        base = running_use
    # fair share among the people in this round: a user who waits with nothing running counts (at their
    # usage, maybe none), or the first user would have no one to be compared with
    users = {r.job.user for r in fleet.running}.union(map(USER, pending))
    usage = {u: base.get(u, 0.0) for u in users}

    # a job's allowed GPU types depend on its nodes and its request's models and memory: once per such shape
    allowed_of: dict[tuple[NodesKey, tuple[str, ...], int | None, bool], tuple[str, ...]] = {}

    def allowed(job: Job) -> tuple[str, ...]:
        res = job.spec.resources
        key = (st.nodes_key(job), res.gpu_types, res.gpu_memory_mib, workload_of(job.spec) == "inference")
        got = allowed_of.get(key)
        if got is None:
            mine = {n.name for n in st.nodes_for(job)}
            got = allowed_of[key] = tuple(sorted({types_of[n.name] for n in typed
                                                  if n.name in mine and st.eligible(n, res)}))
            if key[3]:  # issue 30: the plan offers an inference job the slowest adequate type (backfill the rest)
                got = allowed_of[key] = slowest_for_inference(got)
        return got

    movable = fleet.movable
    views = running_views(running, types_of, now, st.cache, movable, fleet.attained)
    labels, absent = fleet.labels, fleet.absent_users
    signature = tuple((n.name, types_of[n.name], labels.get(n.name), absent.get(n.name),
                       tuple(map(MODEL_MEMORY, n.devices))) for n in typed)
    views += pending_views(pending, allowed, signature, st.cache, fleet.attained)
    model = throughput or catalog_throughput()
    inp = build_input(now, sorted(views, key=ARRIVAL), servers,
                      model, user_usage=usage if len(usage) > 1 else {},
                      checkpoint_costs=movable, forecast_s=None, round_s=fleet.policy_round_s,
                      quantum_s=fleet.move_min_run_s if movable else None, cache=st.cache.policy)
    if movable or fleet.left:
        inp = replace(inp, forecast_s=remaining_times(views, fleet, movable, now, model, inp.gpu_types))
    plan = make_plan(policy, inp)
    # (the placer places the waiting jobs it knows, and the running ones that may move, on devices free now)
    moving = {r.id: r.job for r in fleet.running if r.id in movable} if movable else {}
    placer = LivePlacer({n.name: n for n in typed}, queued, st.fit_free, fleet.prefer, fleet.labels, moving,
                        st.busy, frozenset(u for j in moving.values() for p in j.placement for u in p.devices),
                        fabric=fleet.fabric)
    # only the jobs that proved they checkpoint (`movable`) may be stopped by the plan, once they have run
    # `move_min_run_s`; the rule keeps every other running job in place
    rule = replace(fleet.rule, time_sharing=bool(movable), min_run_s=fleet.move_min_run_s)
    decision = apply_rule(plan, inp, servers, placer, rule)
    moved = moves(decision, inp, policy, queued, st) if movable else []
    # (a job id the plan names is a running job's or in `queued`, so `queued` tells waiting ones apart)
    wanted = [w.job_id for w in plan.wants if w.job_id in queued]
    # the others by QoS class and priority, then submit time (the order `inp.jobs` already has: a view's arrival is
    # its job's submit time; the sort is stable), as a round without a policy serves them (`order`). By submit time
    # alone, a requeued scavenger job (its submit time kept) backfilled the GPU its normal preemptor had just freed,
    # ahead of it; the preemptor stopped another, whose GPU went the same way, every round: on a churning queue the
    # same jobs were stopped and started again round after round, and the rounds grew costlier as the loop grew
    others = {j.id for j in pending}.difference(wanted)
    left = [v for v in inp.jobs if v.id in others]
    classes = list(map(_CLASS, left))
    kinds = set(classes)
    if len(kinds) > 1:
        # (a few (class, priority) pairs: each one's jobs in submit order, the pairs in order. A sort by a key per
        # job was ~0.65 ms of a churning round with 2,000 waiting, this ~0.27)
        # (by rank, not by name: classes that rank alike, an unknown one with `normal`, keep their submit order
        # between them, as a stable sort by rank would)
        normal = qos_rank(DEFAULT_QOS)
        rank_of = {c: (QOS_RANK.get(c[0], normal), -c[1]) for c in kinds}
        buckets: dict[tuple[int, int], list[JobView]] = {r: [] for r in sorted(set(rank_of.values()))}
        for v, c in zip(left, classes, strict=True):
            buckets[rank_of[c]].append(v)
        left = [v for bucket in buckets.values() for v in bucket]
    rest = list(map(JOB_ID, left))
    over = policy.over_share(inp)
    taken = {d.job_id for d in moved}
    waiting = dict(decision.waiting)
    starts = []
    for start in decision.starts:
        if start.job_id not in queued or start.job_id in taken:
            continue
        if not st.busy.isdisjoint(u for p in start.placement for u in p.devices):
            waiting[start.job_id] = RESOURCES  # on devices a moving job still holds: its turn comes when they free
            continue
        starts.append((start.job_id, start.placement))
    return starts, waiting, wanted + rest, over, moved, policy.waiting_order(inp)


def spare_the_head(st: Round, head: Job, starts: Sequence[tuple[int, tuple[Placement, ...], bool]],
                   by_id: Mapping[int, Job]) -> list[tuple[int, tuple[Placement, ...]]]:
    """The plan's starts, one of those before the head (the third item) moved to other devices when that lets the
    head start now as well. Why: the plan places its starts in the policy's order by best fit, and with fair share
    interleaving users a start of one user can take the one device the head (another user's job) could use, on a
    node where that user has no account, leaving the other node free (tests/sched/test_lab_round.py): both start
    when the earlier one goes to the other node. Nothing moves when the head would not fit even without them."""
    out = [(i, p) for i, p, _before in starts]
    if st.start_now(head) is None:
        return out

    def fit(job: Job, off: frozenset[str]) -> tuple[Placement, ...] | None:
        # a placement now, off `off` as well as the busy devices (as reserved ones: `exempt` spares nobody)
        saved = st.reserved, st.shadow, st.head
        st.reserved, st.shadow, st.head = off, math.inf, None
        st.version += 1
        try:
            return st.start_now(job)
        finally:
            st.reserved, st.shadow, st.head = saved
            st.version += 1

    devices = [frozenset(u for p in ps for u in p.devices) for _i, ps, _b in starts]
    for n in reversed(range(len(starts))):  # the least important of them first
        job_id, _placements, before = starts[n]
        if not before:
            continue
        rest = frozenset().union(*(d for k, d in enumerate(devices) if k != n))
        room = fit(head, rest)
        if room is None or devices[n].isdisjoint(u for p in room for u in p.devices):
            continue  # the head does not fit on this start's devices, or fits beside it anyway
        alt = fit(by_id[job_id], rest | {u for p in room for u in p.devices})
        if alt is not None:
            out[n] = (job_id, alt)
            break
    return out


def moves(decision: RoundDecision, inp: PolicyInput, policy: AnyPolicy, queued: Mapping[int, Job],
          st: Round) -> list[Move | Preempt]:
    """The plan's moves of running jobs (to free devices of a faster type: a `Move`), and its time-sharing stops:
    a waiting job placed on the devices of running jobs the plan stops (equals of its QoS class that have had more
    service) claims them by a `Preempt` of those jobs, as a QoS preemption does. A stopped job nobody claims keeps
    running (the rule's `displaced` already ensures there is a claimant; this is the live translation)."""
    views = {j.id: j for j in inp.jobs}
    stopped = {u: vid for vid in decision.preempt for p in views[vid].placement for u in p.devices}
    out: list[Move | Preempt] = []
    for s in decision.starts:
        v = views[s.job_id]
        if s.migrate:
            old = v.gpu_type or "?"
            gain, cost = policy.move_gain(v, s.gpu_type, inp)
            nodes = ", ".join(p.node for p in s.placement)
            if gain > 0:
                why = (f"moving from {old} to {s.gpu_type} on {nodes}: expected to save {secs(gain)} for a "
                       f"checkpoint and restart of {secs(cost)}")
            else:
                # a move down: the assignment gives its GPUs to jobs that gain more there (the simulator's policy
                # does so at a checkpoint cost too: tests/sim/test_checkpoint_policy.py)
                mine = {u for p in v.placement for u in p.devices}
                takers = sorted(t.job_id for t in decision.starts if t.job_id != v.id
                                and not mine.isdisjoint(u for p in t.placement for u in p.devices))
                to = (f"job {takers[0]}" if len(takers) == 1 else f"jobs {', '.join(map(str, takers))}" if takers
                      else "the jobs it makes room for")
                why = (f"moving from {old} to {s.gpu_type} on {nodes}: its {old} GPUs go to {to}, which gain more "
                       f"there; a checkpoint and restart of {secs(cost)}")
            out.append(Move(v.id, s.placement, old, s.gpu_type, gain, cost, why))
            continue
        if s.job_id not in queued or queued[s.job_id].reason == PREEMPTING:
            continue  # (a job already waiting for the GPUs of jobs it stopped does not stop more)
        victims = sorted({stopped[u] for p in s.placement for u in p.devices if u in stopped})
        if not victims or len(s.placement) != 1:
            continue
        names = ", ".join(f"{i} ({views[i].service_s / 3600:.1f} h)" for i in victims)
        out.append(Preempt(v.id, tuple(victims), s.placement[0].node,
                           f"time-sharing in {v.qos}: job {v.id} has had {v.service_s / 3600:.1f} h of service, "
                           f"less than job(s) {names}: they checkpoint and wait", s.placement))
    if any(isinstance(d, Preempt) for d in out):
        st.victims().taken.update(i for d in out if isinstance(d, Preempt) for i in d.victims)
    return out


def plan_stage(w: Work) -> None:
    """With a policy: the plan's starts and moves; the one reservation for the most important job it does not start
    (EASY backfill, issue 14, item 4: the plan's starts of jobs behind it keep off its GPUs unless they end, by
    their time limit, before it starts); and the order in which the rest is settled."""
    st = w.st
    fleet = st.fleet
    if not fleet.policy:
        return
    queue = w.queue
    by_id = {j.id: j for j in queue}
    capped, nowhere, gpu_jobs = plannable(st, queue)
    starts, reasons, served, over, moved, ranked = core_round(fleet.policy, gpu_jobs, st, st.now, by_id,
                                                              fleet.throughput)
    decisions = w.decisions
    for d in moved:
        # moves and time-sharing stops first: their devices are taken (a move's new ones) or theirs to claim
        st.hold(u for p in (d.placements if isinstance(d, Move) else ()) for u in p.devices)
        decisions.append(d)
    started_ids = {i for i, _ in starts}
    head_key = None
    if ranked is None:
        # (the policy's key: what a requeued job's progress said was left, where it said, else what it attained)
        work = {**fleet.attained, **{i: left for i, (left, _type) in fleet.left.items()}} if fleet.left else \
            fleet.attained
        keys = order_keys(gpu_jobs, over, st.cache, work)
    else:
        # the policy's own order between users (fair share interleaves them job by job: no key of a job's own can
        # say it), so a start the policy made for the user whose turn it is is never dropped as backfill. Read only
        # up to the head, the first job it does not start: a key is only ever compared with the head's, and every
        # job after the head, in the order or not in it, is behind it (the order is made as far as it is read:
        # the rest of 2,000 waiting jobs is never merged, issue 33)
        keys = {}
        for n, i in enumerate(ranked):
            keys[i] = (n, 0, False, 0.0, 0.0, i)
            if i not in started_ids:
                head_key = keys[i]
                break
        if head_key is None:
            # (every job in the order starts: the head is the first of the others by id, behind them all)
            far = len(keys)
            keys.update({j.id: (far, 0, False, 0.0, 0.0, j.id) for j in gpu_jobs if j.id not in keys})
        else:
            far = head_key[0] + 1
            keys.update({i: (far, 0, False, 0.0, 0.0, i) for i in started_ids if i not in keys})
    if head_key is None:
        head_key = (min(keys.values(), default=None) if not started_ids else  # (a busy round starts nothing)
                    min((k for i, k in keys.items() if i not in started_ids), default=None))
    head = by_id[head_key[-1]] if head_key is not None else None  # (a key ends with its job's id)
    behind: list[tuple[Job, tuple[Placement, ...]]] = []
    if ranked is not None and head is not None and head_key is not None:
        starts = spare_the_head(st, head, [(i, p, keys[i] < head_key) for i, p in starts], by_id)
    for job_id, placements in starts:
        job = by_id[job_id]
        if head_key is not None and keys[job_id] > head_key:
            behind.append((job, placements))
            continue
        # the plan's starts are counted one by one: two jobs of one user may each fit a cap, not both
        if st.tally.blocked(job) is None and st.take(job, placements):
            st.tally.add(job)
            decisions.append(Launch(job_id, placements))
    if head is not None:
        st.reserve(head)
    for job, placements in behind:
        if not st.exempt(job) and any(not st.reserved.isdisjoint(p.devices) for p in placements):
            continue  # on the head's reserved GPUs: backfill looks for others
        if st.tally.blocked(job) is None and st.take(job, placements):
            st.tally.add(job)
            decisions.append(Launch(job.id, placements))
    started = {d.job_id for d in decisions}
    reasons.update({i: RESOURCES for i in nowhere})
    rest = [by_id[i] for i in served if i not in started]
    if capped or nowhere or len(gpu_jobs) + len(capped) + len(nowhere) < len(queue):
        # those the policy did not plan: capped, with no node, CPU only (sorted only when there are some)
        ordered = order(queue)
        rest += [j for j in ordered if j.spec.resources.gpus > 0 and (j.id in capped or j.id in nowhere)]
        rest += [j for j in ordered if j.spec.resources.gpus == 0]
    w.reasons.update(reasons)
    w.served = rest
