"""The live round as it was before issue 18 made it linear (hsched.sched.live at ff9116f, with the QoS victim
choice of hsched.sched.preempt of the same commit), kept verbatim as the reference the equivalence tests compare
the indexed round with: the same decisions, in the same order, on seeded random fleets and queues.

Not used by hsched itself. Slow on purpose (a scan per job, node and running job): keep the workloads small.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from hsched.model import EndReason, Interconnect, Job, Node, NodeState, Placement, Resources
from hsched.sched.limits import QosLimits, Tally
from hsched.sched.placement import fragmentation_key
from hsched.sched.preempt import Fits, PreemptRule
from hsched.sched.registry import make_policy
from hsched.sched.round import apply_rule, build_input, make_plan
from hsched.sched.servers import server_link, server_of
from hsched.sched.throughput import ThroughputModel
from hsched.sched.view import JobPhase, JobView, Preempt, ServerView, qos_rank
from hsched.spec.constraints import Constraint, parse_constraint
from hsched.topo.models import DEFAULT_CATALOG, lookup_model
from hsched.topo.place import place_on_node

__all__ = [
    "Chosen",
    "Decision",
    "DeviceChooser",
    "FleetView",
    "Launch",
    "LivePlacer",
    "Preempt",
    "PreemptRule",
    "Running",
    "Wait",
    "catalog_throughput",
    "default_chooser",
    "eligible_devices",
    "gpu_type_of",
    "order",
    "resolve_gpu_types",
    "schedule",
    "topology_chooser",
    "unsatisfiable",
]


@dataclass(frozen=True, slots=True)
class Running:
    """A running job as the scheduler may see it: its request and how long it has run, never its remaining
    work or duration."""

    job: Job
    started: float
    """When its current attempt started."""

    @property
    def id(self) -> int:
        return self.job.id

    @property
    def devices(self) -> frozenset[str]:
        return frozenset(u for p in self.job.placement for u in p.devices)


@dataclass(frozen=True, slots=True)
class FleetView:
    nodes: tuple[Node, ...]
    busy: frozenset[str]
    """UUIDs of devices held by active runs."""
    cpus_used: Mapping[str, int]
    """CPUs promised to active runs, per node."""
    running: tuple[Running, ...] = ()
    """Jobs that hold devices and could be preempted (RUNNING only, not already stopping); the policy also
    reads them for fair share and attained service."""
    releasing: frozenset[str] = frozenset()
    """Devices of jobs being preempted or cancelled: busy now, free soon."""
    rule: PreemptRule = field(default_factory=PreemptRule)
    """Who may preempt whom (`PreemptRule.from_qos(settings.qos)`); by default nobody."""
    policy: str | None = None
    """A scheduling-core policy (hsched.sched) deciding order and GPU types; None: QoS/priority/FIFO."""
    prefer: Mapping[int, str] = field(default_factory=dict)
    """Job id -> the node holding its checkpoint: tried first, so a resumed job avoids the copy when it can."""
    user_usage: Mapping[str, float] | None = None
    """Fair share's usage per user: decayed GPU-seconds of the store's runs, running ones up to now, per equal
    share (hsched.learn.fairshare.policy_usage). None (a view built by hand): the running jobs' GPU-seconds."""
    labels: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Node name -> its labels (the fleet file's `[[node]] labels`), what `--constraint` is matched against."""
    absent_users: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Node name -> users that do not exist on that node (lab mode): their jobs are never placed there."""
    gpu_aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Settings' `[gpu_models.aliases]`: a `--gpu-type` name -> the model names it stands for."""
    limits: Mapping[str, QosLimits] = field(default_factory=dict)
    """QoS class -> its caps (`QosLimits.from_qos(settings.qos)`); a class not here has none."""
    holders: tuple[Job, ...] | None = None
    """Every job holding devices (launching, running, being stopped): what the caps count. None: `running`."""
    ends: Mapping[int, float] = field(default_factory=dict)
    """(issue 14) Running job id -> its predicted end; the reservation below is the naive twin of live.py's."""


@dataclass(frozen=True, slots=True)
class Launch:
    """Launch the job now on these devices (one placement per node of a gang)."""

    job_id: int
    placements: tuple[Placement, ...]


@dataclass(frozen=True, slots=True)
class Wait:
    job_id: int
    reason: str


Decision = Launch | Wait | Preempt
"""`Preempt` (hsched.sched.view): stop its victims (checkpoint signal, grace, escalation) so the job can
start on their devices in a later round."""


@dataclass(frozen=True, slots=True)
class Chosen:
    devices: tuple[str, ...]
    explanation: str
    cpus: tuple[int, ...] = ()


DeviceChooser = Callable[[Node, Sequence[str], Resources], Chosen | None]
"""Pick devices for a request among a node's free ones, or None."""


def resolve_gpu_types(types: Sequence[str], aliases: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """`--gpu-type` names with settings aliases replaced by the models they stand for (case-insensitive);
    other names stay, matched as substrings of the model as always."""
    if not aliases or not types:
        return tuple(types)
    low = {k.lower(): v for k, v in aliases.items()}
    out: list[str] = []
    for t in types:
        out.extend(low.get(t.lower(), (t,)))
    return tuple(dict.fromkeys(out))


def _resolved(job: Job, aliases: Mapping[str, Sequence[str]]) -> Job:
    """The job with its GPU types resolved: the placement engine matches models by the names it is given."""
    res = job.spec.resources
    types = resolve_gpu_types(res.gpu_types, aliases)
    if types == res.gpu_types:
        return job
    return replace(job, spec=replace(job.spec, resources=replace(res, gpu_types=types)))


def constraint_of(res: Resources) -> Constraint | None:
    """The request's parsed constraint, None without one; one that does not parse (a spec stored before it was
    checked) matches no label set."""
    if not res.constraint:
        return None
    try:
        return parse_constraint(res.constraint)
    except ValueError:
        return Constraint((), res.constraint)


def eligible_devices(node: Node, res: Resources) -> list[str]:
    """Devices of the node the request could use at all, ignoring whether they are busy."""
    out = []
    for d in node.devices:
        if not res.matches_model(d.model):
            continue
        need = res.gpu_memory_mib
        if need is not None and d.memory_total_mib is not None and d.memory_total_mib < need:
            continue
        out.append(d.uuid)
    return out


def unsatisfiable(res: Resources, nodes: Sequence[Node], *, labels: Mapping[str, frozenset[str]] | None = None,
                  aliases: Mapping[str, Sequence[str]] | None = None) -> str | None:
    """Why no node of the fleet could ever run this request (even empty), or None if some could. `labels`: each
    node's labels, for `--constraint` (none without); `aliases`: settings' GPU model aliases."""
    if not nodes:
        return "the fleet has no nodes; add one to the fleet file"
    if aliases:
        res = replace(res, gpu_types=resolve_gpu_types(res.gpu_types, aliases))
    fleet = "the fleet"
    constraint = constraint_of(res)
    if constraint is not None:
        lab = labels or {}
        matching = [n for n in nodes if constraint.satisfied_by(lab.get(n.name, frozenset()))]
        if not matching:
            known = sorted(set().union(*lab.values())) if lab else []
            have = f"labels in this fleet: {', '.join(known)}" if known else "no node of this fleet has labels"
            return (f"no node has the labels of --constraint {res.constraint!r} ({have}); change --constraint "
                    "or add labels to the nodes in the fleet file")
        nodes = matching
        fleet = f"the nodes matching --constraint {res.constraint!r}"
    # a request larger than every node in one resource says which, with the largest there is
    mems = [n.memory_total_mib for n in nodes if n.memory_total_mib is not None]
    if res.memory_mib is not None and mems and res.memory_mib > max(mems):
        return (f"no node has {_size(res.memory_mib)} of memory (largest: {_size(max(mems))}); "
                "lower --mem")
    cpus = [n.cpus for n in nodes if n.cpus is not None]
    if res.cpus is not None and cpus and res.cpus > max(cpus):
        return f"no node has {res.cpus} CPUs (largest: {max(cpus)}); lower --cpus"
    gpu_mem = [d.memory_total_mib for n in nodes for d in n.devices if d.memory_total_mib is not None]
    if res.gpu_memory_mib is not None and gpu_mem and res.gpu_memory_mib > max(gpu_mem):
        return (f"no GPU has {_size(res.gpu_memory_mib)} of memory (largest: {_size(max(gpu_mem))}); "
                "lower --gpu-memory")
    if res.nodes > len(nodes):
        return f"needs {res.nodes} nodes but {fleet} has {len(nodes)}; lower --nodes or add nodes"
    fitting = []
    best = 0
    for n in nodes:
        elig = eligible_devices(n, res)
        best = max(best, len(elig))
        if len(elig) < res.gpus:
            continue
        if res.cpus is not None and n.cpus is not None and res.cpus > n.cpus:
            continue
        if res.memory_mib is not None and n.memory_total_mib is not None and res.memory_mib > n.memory_total_mib:
            continue
        # the topology engine's own search (a clique of the NVLink graph): a job it could never place on the
        # empty node is refused now rather than left waiting for ever
        if (res.interconnect is Interconnect.NVLINK and res.gpus > 1
                and place_on_node(n, res.gpus, elig, Resources(gpus=res.gpus, interconnect=res.interconnect)) is None):
            continue
        fitting.append(n.name)
    if len(fitting) >= res.nodes:
        return None
    what = f"{res.gpus} GPU(s)" + (f" of type {'/'.join(res.gpu_types)}" if res.gpu_types else "")
    if res.gpu_memory_mib:
        what += f" with >= {res.gpu_memory_mib} MiB"
    if res.interconnect is Interconnect.NVLINK:
        what += " all NVLinked"
    if res.cpus:
        what += f", {res.cpus} CPUs"
    if res.nodes > 1:
        return (f"needs {res.nodes} nodes each with {what}, but only {len(fitting)} node(s) of {fleet} qualify; "
                "lower --nodes/--gpus or add nodes")
    return (f"needs {what} on one node, but no node of {fleet} has that (the most any node offers is {best}); "
            "lower --gpus, change --gpu-type or add a node")


def _size(mib: int) -> str:
    """MiB as people write sizes: 10T, 512G, 750M."""
    for unit, mult in (("T", 1024 * 1024), ("G", 1024)):
        if mib >= mult:
            value = mib / mult
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{mib}M"


def topology_chooser(node: Node, free: Sequence[str], res: Resources) -> Chosen | None:
    """The topology placement engine: strongest weakest link, most NVLinks, fewest NUMA nodes, least
    fragmentation; exact up to 16 devices; CPU cores from the NUMA nodes local to the chosen devices."""
    result = place_on_node(node, res.gpus, free, res)
    if result is None:
        return None
    return Chosen(tuple(result.devices), result.explanation, tuple(result.cpus))


def default_chooser() -> DeviceChooser:
    return topology_chooser


def order(queue: Sequence[Job]) -> list[Job]:
    """Without a policy: QoS class, then priority, then submit order."""
    return sorted(queue, key=lambda j: (qos_rank(j.spec.qos), -j.spec.priority, j.submit_time, j.id))


def gpu_type_of(model: str) -> str:
    """The core's GPU type for a device model: the accelerator table's key ("h100", "a100"...) or the model."""
    known = lookup_model(model)
    return known.key if known is not None else model.lower()


def catalog_throughput() -> ThroughputModel:
    """Unknown live jobs run at the accelerator table's relative training speed of each GPU type."""
    return ThroughputModel(prior={m.key.lower(): m.train for m in DEFAULT_CATALOG.models})


def schedule(fleet: FleetView, queue: Sequence[Job], now: float,
             chooser: DeviceChooser | None = None) -> list[Decision]:
    """One live round (see the module docstring): a decision for every job of `queue`, in the order the round
    served them."""
    if fleet.gpu_aliases:
        queue = [_resolved(j, fleet.gpu_aliases) for j in queue]
    st = _RoundState(fleet, chooser or default_chooser(), now)
    decisions: list[Decision] = []
    core_waiting: dict[int, str] = {}
    by_id = {j.id: j for j in queue}
    if fleet.policy:
        # a job over a QoS cap, or with no node it may use, is not the policy's to plan: it would hold capacity
        # in the plan that it cannot use; it waits (with its reason) below
        capped = {j.id for j in queue if st.tally.blocked(j) is not None}
        nowhere = {j.id for j in queue if j.id not in capped and not st.nodes_for(j)}
        gpu_jobs = [j for j in queue if j.spec.resources.gpus > 0 and j.id not in capped and j.id not in nowhere]
        starts, core_waiting, served, over = _core_round(fleet.policy, gpu_jobs, st, now)
        # (issue 14) the most important job not started gets a reservation; starts behind it keep off it
        started_ids = {i for i, _ in starts}
        def _key(j: Job) -> tuple[int, int, bool, float, int]:
            return (qos_rank(j.spec.qos), -j.spec.priority, j.user in over, j.submit_time, j.id)
        blocked = sorted((j for j in gpu_jobs if j.id not in started_ids), key=_key)
        head = blocked[0] if blocked else None
        for job_id, placements in starts:
            job = by_id[job_id]
            if head is not None and _key(job) > _key(head):
                continue
            # the plan's starts are counted one by one: two jobs of one user may each fit a cap, not both
            if st.tally.blocked(job) is None and st.take(job, placements):
                st.tally.add(job)
                decisions.append(Launch(job_id, placements))
        if head is not None:
            st.reserve(head)
            for job_id, placements in starts:
                job = by_id[job_id]
                if _key(job) < _key(head):
                    continue
                if not st.exempt(job) and any(set(p.devices) & st.reserved for p in placements):
                    continue
                if st.tally.blocked(job) is None and st.take(job, placements):
                    st.tally.add(job)
                    decisions.append(Launch(job_id, placements))
        started = {d.job_id for d in decisions}
        core_waiting.update({i: _RESOURCES for i in nowhere})
        left_out = [j for j in order(queue) if j.spec.resources.gpus > 0 and (j.id in capped or j.id in nowhere)]
        cpu_jobs = [j for j in order(queue) if j.spec.resources.gpus == 0]
        rest = [by_id[i] for i in served if i not in started] + left_out + cpu_jobs
    else:
        st.reserving = True
        rest = order(queue)
    for job in rest:
        decisions.append(st.settle(job, core_waiting.get(job.id)))
    return decisions


# ---------------------------------------------------------------- the core's round over the live fleet

Fit = Callable[[Node, Job, Sequence[str]], Placement | None]
"""Place `job` on `node` using only the given free devices, or None."""


class LivePlacer:
    """The simulator's server choice (best fit, NVLink first) with real constraints and topology inside."""

    def __init__(self, nodes: Mapping[str, Node], jobs: Mapping[int, Job], fit: Fit,
                 prefer: Mapping[int, str] | None = None, labels: Mapping[str, frozenset[str]] | None = None) -> None:
        self.nodes = nodes
        self.jobs = jobs
        self.fit = fit
        self.prefer = prefer or {}
        self.labels = labels or {}

    def place(self, gpus: int, servers: Sequence[ServerView], free: Mapping[str, Sequence[str]],
              max_servers: int | None, job: JobView | None = None) -> tuple[Placement, ...] | None:
        if job is None or job.id not in self.jobs:
            return None  # a running job: live jobs are never moved
        j = self.jobs[job.id]
        home = self.prefer.get(j.id)
        # the node holding the job's checkpoint first (no copy), then the simulator's best fit; among equals the
        # node with the fewest labels (before the name), so a job that needs no special node leaves those to jobs
        # that do
        def key(s: ServerView) -> tuple[bool, tuple[int, int, int], int, str]:
            frag = fragmentation_key(s.link, len(self.nodes[s.name].devices), len(free.get(s.name, ())),
                                     j.spec.resources.gpus)
            return (s.name != home, frag, len(self.labels.get(s.name, ())), s.name)

        ranked = sorted(servers, key=key)
        need = j.spec.resources.nodes
        out: list[Placement] = []
        for s in ranked:
            p = self.fit(self.nodes[s.name], j, free.get(s.name, ()))
            if p is not None:
                out.append(p)
                if len(out) == need:
                    return tuple(out)
        return None


def _running_view(r: Running, types_of: Mapping[str, str], now: float) -> JobView:
    job = r.job
    res = job.spec.resources
    node = job.placement[0].node if job.placement else ""
    run_s = max(0.0, now - r.started)
    gpus = sum(len(p.devices) for p in job.placement) or max(1, res.gpus * res.nodes)
    return JobView(job.id, "", gpus, job.submit_time, JobPhase.RUNNING, job.spec.qos, job.spec.priority, job.user,
                   types_of.get(node), job.placement, r.started, run_s, run_s, job.restarts, job.spec.time_limit_s,
                   res.nodes, (), checkpointable=False)


def _pending_view(job: Job, allowed: tuple[str, ...] = ()) -> JobView:
    res = job.spec.resources
    return JobView(job.id, "", max(1, res.gpus * res.nodes), job.submit_time, qos=job.spec.qos,
                   priority=job.spec.priority, user=job.user, restarts=job.restarts,
                   time_limit_s=job.spec.time_limit_s, max_servers=res.nodes, gpu_types=allowed,
                   checkpointable=False)


def _core_round(policy_name: str, pending: Sequence[Job], st: _RoundState, now: float,
                throughput: ThroughputModel | None = None,
                ) -> tuple[list[tuple[int, tuple[Placement, ...]]], dict[int, str], list[int],
                           frozenset[str]]:
    """The core's round over the live fleet: (starts of pending jobs, why the others wait, pending job ids in
    the order the policy serves them, wanted first)."""
    fleet = st.fleet
    policy = make_policy(policy_name)
    if policy.clairvoyant:
        raise ValueError(f"policy {policy_name!r} needs job durations, which a live fleet does not know")
    # devices held by jobs that are not running (launching, stopping): no one may be given them this round
    held_by_running = {u for r in fleet.running for u in r.devices}
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
    users = {r.job.user for r in fleet.running} | {j.user for j in pending}
    usage = {u: base.get(u, 0.0) for u in users}

    def allowed(job: Job) -> tuple[str, ...]:
        res = job.spec.resources
        mine = {n.name for n in st.nodes_for(job)}
        return tuple(sorted({types_of[n.name] for n in typed if n.name in mine and any(
            res.matches_model(d.model) and (res.gpu_memory_mib is None or d.memory_total_mib is None
                                            or d.memory_total_mib >= res.gpu_memory_mib)
            for d in n.devices)}))

    views = [_running_view(r, types_of, now) for r in fleet.running if r.job.placement]
    views += [_pending_view(j, allowed(j)) for j in pending]
    inp = build_input(now, sorted(views, key=lambda v: (v.arrival_s, v.id)), servers,
                      throughput or catalog_throughput(), user_usage=usage if len(usage) > 1 else {})
    plan = make_plan(policy, inp)
    placer = LivePlacer({n.name: n for n in typed}, {j.id: j for j in pending}, st.fit_free, fleet.prefer,
                        fleet.labels)
    # live jobs do not checkpoint: the rule keeps every running job in place, so nothing here is stopped
    decision = apply_rule(plan, inp, servers, placer, fleet.rule)
    pending_ids = {j.id for j in pending}
    wanted = [w.job_id for w in plan.wants if w.job_id in pending_ids]
    chosen = set(wanted)
    # (changed since, on purpose, in issue 33: the others by QoS class and priority before submit time, as the round
    # serves them now; by submit time alone a requeued scavenger job backfilled ahead of the normal job that had just
    # preempted it, round after round)
    rest = [j.id for j in sorted(pending, key=lambda j: (qos_rank(j.spec.qos), -j.spec.priority, j.submit_time, j.id))
            if j.id not in chosen]
    return ([(s.job_id, s.placement) for s in decision.starts if s.job_id in pending_ids],
            {k: v for k, v in decision.waiting.items() if k in pending_ids},
            wanted + rest, policy.over_share(inp))


# ---------------------------------------------------------------- backfill, releasing devices, QoS preemption

_PREEMPTING, _PRIORITY, _RESOURCES = EndReason.PREEMPTING.value, EndReason.PRIORITY.value, EndReason.RESOURCES.value


def _fit(node: Node, res: Resources, busy: set[str] | frozenset[str], cpus_used: Mapping[str, int],
         choose: DeviceChooser) -> Placement | None:
    if res.cpus is not None and node.cpus is not None and cpus_used.get(node.name, 0) + res.cpus > node.cpus:
        return None
    free = [u for u in eligible_devices(node, res) if u not in busy]
    if len(free) < res.gpus:
        return None
    if res.gpus == 0:
        return Placement(node=node.name, devices=(), explanation="CPU only")
    chosen = choose(node, free, res)
    if chosen is None:
        return None
    return Placement(node=node.name, devices=chosen.devices, explanation=chosen.explanation, cpus=chosen.cpus)


class _RoundState:
    """Devices and CPUs handed out so far in this round, and the fallbacks for a job that did not start."""

    def __init__(self, fleet: FleetView, choose: DeviceChooser, now: float) -> None:
        self.fleet = fleet
        self.choose = choose
        self.now = now
        self.busy = set(fleet.busy)
        self.cpus_used = dict(fleet.cpus_used)
        self.releasing = set(fleet.releasing)
        self.up = [n for n in fleet.nodes if n.state is NodeState.UP]
        self.by_name = {n.name: n for n in self.up}
        self.blocked_ahead = False
        self._victims: Victims | None = None
        holders = fleet.holders if fleet.holders is not None else tuple(r.job for r in fleet.running)
        self.tally = Tally(fleet.limits, holders)
        self._nodes_for: dict[int, list[Node]] = {}
        self.head: int | None = None
        self.reserved: set[str] = set()
        self.shadow = math.inf
        self.head_reason = _RESOURCES
        self.reserving = False
        self.started: dict[str, float] = {}

    def exempt(self, job: Job) -> bool:
        if not self.reserved or job.id == self.head:
            return True
        limit = job.spec.time_limit_s
        return limit is not None and self.shadow < math.inf and self.now + limit <= self.shadow

    def frag(self, node: Node, gpus: int) -> tuple[int, int, int]:
        free = sum(1 for d in node.devices if d.uuid not in self.busy)
        return fragmentation_key(server_link(node), len(node.devices), free, gpus)

    def reserve(self, job: Job) -> None:
        """Naively: each node, each time devices free (running jobs' ends, releasing now, started at limits)."""
        self.reserving = False
        self.head = job.id
        res = job.spec.resources
        at: dict[str, float] = {}
        for r in self.fleet.running:
            for u in r.devices:
                at[u] = self.fleet.ends.get(r.id, math.inf)
        at.update(self.started)
        for u in self.releasing:
            at[u] = self.now
        found = []
        for idx, node in enumerate(self.nodes_for(job)):
            elig = eligible_devices(node, res)
            times = sorted({at.get(u, math.inf) if u in self.busy else self.now for u in elig})
            for t in times:
                avail = {u for u in elig if (at.get(u, math.inf) if u in self.busy else self.now) <= t}
                if len(avail) < res.gpus:
                    continue
                p = _fit(node, res, {d.uuid for d in node.devices} - avail, self.cpus_used, self.choose)
                if p is not None:
                    found.append((t, self.frag(node, res.gpus), idx, p))
                    break
        if len(found) < res.nodes:
            return
        found.sort(key=lambda f: f[:3])
        chosen = found[:res.nodes]
        self.shadow = max(f[0] for f in chosen)
        self.reserved = {u for f in chosen for u in f[3].devices}
        if self.shadow < math.inf:
            from hsched.sched.live import _minute
            self.head_reason = (f"{_RESOURCES} (reserved on {', '.join(f[3].node for f in chosen)} from "
                                f"{_minute(self.shadow)})")

    def labelled(self, node: str, job: Job) -> bool:
        """The node's labels satisfy the job's --constraint (any node does without one)."""
        c = constraint_of(job.spec.resources)
        return c is None or c.satisfied_by(self.fleet.labels.get(node, frozenset()))

    def absent(self, node: str, job: Job) -> bool:
        """The job's user does not exist on the node (lab mode)."""
        return job.user in self.fleet.absent_users.get(node, frozenset())

    def nodes_for(self, job: Job) -> list[Node]:
        """The up nodes the job may use: labelled as its constraint asks, its user present there."""
        got = self._nodes_for.get(job.id)
        if got is None:
            got = self._nodes_for[job.id] = [n for n in self.up
                                             if self.labelled(n.name, job) and not self.absent(n.name, job)]
        return got

    def fit_free(self, node: Node, job: Job, free: Sequence[str]) -> Placement | None:
        """`job` on `node`, using only the given free devices (the core's placer asks this)."""
        if not self.labelled(node.name, job) or self.absent(node.name, job):
            return None
        others = {d.uuid for d in node.devices} - set(free)
        return _fit(node, job.spec.resources, self.busy | others, self.cpus_used, self.choose)

    def take(self, job: Job, placements: Sequence[Placement]) -> bool:
        res = job.spec.resources
        for p in placements:
            node = self.by_name.get(p.node)
            if node is None or any(u in self.busy for u in p.devices):
                return False
            if res.cpus and node.cpus is not None and self.cpus_used.get(p.node, 0) + res.cpus > node.cpus:
                return False
        for p in placements:
            self.busy.update(p.devices)
            for u in p.devices:
                limit = job.spec.time_limit_s
                self.started[u] = self.now + limit if limit is not None else math.inf
            if res.cpus:
                self.cpus_used[p.node] = self.cpus_used.get(p.node, 0) + res.cpus
        if job.id == self.head:
            self.head, self.reserved, self.shadow = None, set(), math.inf
        return True

    def victims(self) -> Victims:
        """The round's QoS victims, indexed once, on first need."""
        if self._victims is None:
            self._victims = Victims(self.fleet.rule, [_running_view(r, {}, self.now) for r in self.fleet.running])
        return self._victims

    def settle(self, job: Job, reason: str | None) -> Decision:
        res = job.spec.resources
        fleet, choose = self.fleet, self.choose
        capped = self.tally.blocked(job)
        if capped is not None:
            # over a QoS cap: it neither starts nor preempts, and holds up no one behind it
            return Wait(job.id, capped)
        nodes = self.nodes_for(job)
        placements: list[Placement] = []
        home = fleet.prefer.get(job.id)
        # the checkpoint's node first, then the plainest nodes (fewest labels: special ones stay for who needs them)
        ranked = sorted(nodes, key=lambda n: (n.name != home, len(fleet.labels.get(n.name, ()))))
        if res.gpus:
            # (issue 14) fragmentation-aware best fit among the nodes with room
            ranked = sorted((n for n in ranked if sum(1 for d in n.devices if d.uuid not in self.busy) >= res.gpus),
                            key=lambda n: (n.name != home, self.frag(n, res.gpus)))
        exempt = self.exempt(job)
        busy_now = self.busy if exempt else self.busy | self.reserved
        for node in ranked:
            if len(placements) == res.nodes:
                break
            p = _fit(node, res, busy_now, self.cpus_used, choose)
            if p is not None:
                placements.append(p)
        if len(placements) == res.nodes and self.take(job, placements):
            self.tally.add(job)
            return Launch(job.id, tuple(placements))
        if res.nodes == 1 and self.releasing:
            # devices being released (preemption or cancel under way) may be this job's soon
            for n in nodes:
                claim = _fit(n, res, (self.busy - self.releasing) | (set() if exempt else self.reserved),
                             self.cpus_used, choose)
                if claim is not None:
                    self.busy.update(claim.devices)
                    self.releasing.difference_update(claim.devices)
                    self.blocked_ahead = True
                    self.tally.add(job)
                    return Wait(job.id, _PREEMPTING)
        if res.nodes == 1 and fleet.rule.qos_preempts.get(job.spec.qos):
            busy, cpus_used = self.busy, self.cpus_used

            def fits(name: str, freed: frozenset[str]) -> bool:
                return _fit(self.by_name[name], res, busy - freed, cpus_used, choose) is not None

            chosen = self.victims().choose(_pending_view(job), [n.name for n in nodes], fits)
            if chosen is not None:
                freed = frozenset(u for r in fleet.running if r.id in chosen.victims for u in r.devices)
                claim = _fit(self.by_name[chosen.node], res, busy - freed, cpus_used, choose)
                if claim is not None:
                    busy.update(claim.devices)
                self.blocked_ahead = True
                self.tally.add(job)  # its start is decided: the next job of its user counts it
                return chosen
        missing = self.missing_user(job)
        if missing is not None:
            return Wait(job.id, missing)
        if self.reserving and res.gpus:
            self.reserve(job)
        why = self.head_reason if job.id == self.head else reason or (
            _PRIORITY if self.blocked_ahead else _RESOURCES)
        self.blocked_ahead = True
        return Wait(job.id, why)

    def missing_user(self, job: Job) -> str | None:
        """"user X does not exist on node N" when that is why the job cannot start: it would start now on nodes
        where only its user is missing, or only such nodes could ever hold it. Else None (the usual reason)."""
        res = job.spec.resources
        lacking = [n for n in self.up if self.absent(n.name, job) and self.labelled(n.name, job)]
        if not lacking:
            return None
        mine = self.nodes_for(job)
        now_mine = sum(1 for n in mine if _fit(n, res, self.busy, self.cpus_used, self.choose) is not None)
        now_lacking = [n.name for n in lacking if _fit(n, res, self.busy, self.cpus_used, self.choose) is not None]
        if now_lacking and now_mine + len(now_lacking) >= res.nodes:
            names = now_lacking
        else:
            ever_mine = sum(1 for n in mine if _could_hold(n, res))
            ever_lacking = [n.name for n in lacking if _could_hold(n, res)]
            if not ever_lacking or ever_mine >= res.nodes or ever_mine + len(ever_lacking) < res.nodes:
                return None
            names = ever_lacking
        where = f"node {names[0]}" if len(names) == 1 else f"nodes {', '.join(names)}"
        return f"user {job.user} does not exist on {where}"


def _could_hold(node: Node, res: Resources) -> bool:
    """The node could run the request when empty (its GPUs, CPUs and memory; links are not asked)."""
    if len(eligible_devices(node, res)) < res.gpus:
        return False
    if res.cpus is not None and node.cpus is not None and res.cpus > node.cpus:
        return False
    return res.memory_mib is None or node.memory_total_mib is None or res.memory_mib <= node.memory_total_mib


# ---------------------------------------------------------------- hsched.sched.preempt's victim choice, as it was


def least_important(v: JobView) -> tuple[int, int, float]:
    """Sort key, least important first: lowest class, lowest priority, most recently started."""
    return (-qos_rank(v.qos), v.priority, -(v.run_start_s or 0.0))


class Victims:
    """One round's QoS preemption: the running jobs it may stop, indexed by server, least important first.

    Built once per round from the running jobs that hold one server each (a gang spread over servers is
    never a victim: stopping it frees devices on several). `choose` is called for each waiting job in the
    order the round serves them; victims chosen for one job are not offered to the next.
    """

    __slots__ = ("by_node", "rule", "taken")

    def __init__(self, rule: PreemptRule, running: Iterable[JobView]) -> None:
        self.rule = rule
        targets = frozenset().union(*rule.qos_preempts.values()) if rule.qos_preempts else frozenset()
        by_node: dict[str, list[JobView]] = {}
        for j in running:
            if j.qos in targets and len(j.placement) == 1:
                by_node.setdefault(j.placement[0].node, []).append(j)
        for lst in by_node.values():
            lst.sort(key=least_important)
        self.by_node = by_node
        self.taken: set[int] = set()

    def classes(self) -> frozenset[str]:
        """The QoS classes of the jobs that may still be chosen."""
        return frozenset(v.qos for lst in self.by_node.values() for v in lst if v.id not in self.taken)

    def choose(self, job: JobView, nodes: Iterable[str], fits: Fits) -> Preempt | None:
        """The best server's victims for `job`, marked taken; None when no server would do.

        `nodes`: the servers `job` may run on, in the caller's order of preference (the first of equals wins).
        `fits(node, freed)`: whether `job` fits `node` once `freed` (devices of victims there) are free.
        """
        allowed = self.rule.qos_preempts.get(job.qos)
        if not allowed:
            return None
        best: tuple[tuple[int, int], str, list[JobView]] | None = None
        for node in nodes:
            lst = self.by_node.get(node)
            if not lst:
                continue
            cands = [v for v in lst if v.qos in allowed and v.id not in self.taken]
            chosen = _fewest(cands, node, fits) if cands else None
            if chosen is None:
                continue
            key = (len(chosen), sum(len(v.placement[0].devices) for v in chosen))
            if best is None or key < best[0]:
                best = (key, node, chosen)
        if best is None:
            return None
        _, node, chosen = best
        self.taken.update(v.id for v in chosen)
        names = ", ".join(f"{v.id} ({v.qos})" for v in chosen)
        return Preempt(job.id, tuple(v.id for v in chosen), node,
                       f"job {job.id} ({job.qos}) needs {node}: preempting {names}")


def _devices(jobs: Iterable[JobView]) -> frozenset[str]:
    return frozenset(d for v in jobs for d in v.placement[0].devices)


def _fewest(cands: list[JobView], node: str, fits: Fits) -> list[JobView] | None:
    """Victims on one server, least important first until the job fits; then drop any it does not need."""
    chosen: list[JobView] = []
    for v in cands:
        chosen.append(v)
        if fits(node, _devices(chosen)):
            break
    else:
        return None
    # the search added them greedily: one taken early may be unnecessary once a bigger one joined
    for v in list(chosen):
        rest = [x for x in chosen if x is not v]
        if rest and fits(node, _devices(rest)):
            chosen = rest
    return chosen
