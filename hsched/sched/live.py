"""The live controller's scheduling seam: a pure function from (fleet, queue, now) to decisions.

    decisions = schedule(fleet_view, pending_jobs, now)     # Launch | Wait | Preempt, in the order served

One round, in this order:

1. With a policy (the settings' `policy`, by default `hsched`), the scheduling core's round over the live
   fleet, the simulator's very code: nodes become servers by the one conversion (hsched.sched.servers), jobs
   become JobViews, the policy plans, and `apply_rule` applies the plan under the preemption rule. Live jobs
   do not checkpoint (hsched.sched.preempt says why), so the rule keeps every running job where it is.
   Devices are chosen by `LivePlacer`: the simulator's best-fit server choice with the real constraints
   (GPU models and memory, NVLink, CPUs) and the topology engine inside the server.
   Without a policy: QoS class, then priority, then submit order.
2. Every job still waiting, in that order: a gap it fits (backfill; the node holding its checkpoint first),
   devices being released that it can have soon, or QoS preemption of less important running jobs, chosen by
   `hsched.sched.preempt.Victims` exactly as the simulator chooses them. Gangs (nodes > 1) are all or nothing
   and never preempt.

Throughout, a job sees only the nodes it may use: their labels satisfy its `--constraint`
(hsched.constraints), and its user exists there (`FleetView.absent_users`, lab mode). A job whose start would
go over a QoS cap (hsched.sched.limits) neither starts nor preempts; it waits with the cap's name. Fair share
reads `FleetView.user_usage` (decayed GPU-seconds per share, from the store: hsched.fairshare); `--gpu-type`
names that settings alias (`[gpu_models.aliases]`) are read as the models they stand for.

Cost (issue 18): a round is linear in the queue plus the fleet, not their product. `_RoundState` indexes the
round once (nodes per constraint and user, eligible devices per request shape and node, free devices per node,
the running jobs QoS may preempt); a search that failed is not repeated for an equal request until devices, CPUs or
victims change hands; while no device is free or being released, a waiting job that may preempt no class that runs
costs a lookup. Between rounds, the views of waiting jobs and their waits are kept (module globals, swapped whole
each round) for as long as the very same Job objects come back (the controller keeps unchanged jobs).

Pure: no I/O.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from hsched.constraints import Constraint, parse_constraint
from hsched.kinds import kind_of
from hsched.model import DEFAULT_QOS, EndReason, Interconnect, Job, Node, NodeState, Placement, Resources
from hsched.sched.limits import QosLimits, Tally
from hsched.sched.locality import choose_wait, copy_seconds, leaves_room
from hsched.sched.placement import fragmentation_key
from hsched.sched.policy import AnyPolicy
from hsched.sched.preempt import PreemptRule, Victims
from hsched.sched.registry import make_policy
from hsched.sched.round import apply_rule, build_input, make_plan
from hsched.sched.servers import server_link, server_of
from hsched.sched.throughput import ThroughputModel
from hsched.sched.view import QOS_RANK, JobPhase, JobView, PolicyInput, Preempt, RoundDecision, ServerView, qos_rank
from hsched.topo.models import DEFAULT_CATALOG, lookup_model
from hsched.topo.place import place_on_node

__all__ = [
    "Chosen",
    "Decision",
    "DeviceChooser",
    "FleetView",
    "Launch",
    "LivePlacer",
    "Move",
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


_NONE: Mapping[int, float] = {}
"""No figures (a default that is never written to)."""
_NO_DEVICES: Mapping[str, float] = {}


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
    share (hsched.fairshare.policy_usage). None (a view built by hand): the running jobs' GPU-seconds."""
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
    throughput: ThroughputModel | None = None
    """What the controller learnt of the jobs' kinds (hsched.kinds.learned_model); None: the accelerator
    table's prior alone (catalog_throughput)."""
    ends: Mapping[int, float] = field(default_factory=dict)
    """Running job id -> when it is predicted to end (the controller's clock: its progress, its kind's history or
    its time limit; hsched.controller.learning.predicted_ends). A job not here has no known end: it counts as never
    ending when the round reserves GPUs for the first blocked job (`_RoundState.reserve`)."""
    movable: Mapping[int, float] = field(default_factory=dict)
    """Running job id -> what a checkpoint and restart costs it (seconds): the jobs that proved they checkpoint
    (hsched.controller.moves). Only these may be moved to faster GPUs or time-shared away; none without a policy."""
    move_min_run_s: float = 1800.0
    """A job (re)started less than this long ago is not moved or time-shared away (settings `move_min_run_s`)."""
    held: Mapping[int, tuple[Placement, ...]] = field(default_factory=dict)
    """Job id -> the devices a move promised it: nobody else's while it stops, and where it starts again."""
    attained: Mapping[int, float] = field(default_factory=dict)
    """Job id -> seconds its earlier attempts ran (its attained service before this attempt, for the least-attained
    rule: a job stopped and requeued does not jump back to the front). A job not here has none."""
    memory_used: Mapping[str, int] = field(default_factory=dict)
    """Host memory (MiB, `--mem`) promised to active runs, per node: reserved as CPUs are."""
    shared_use: Mapping[str, int] = field(default_factory=dict)
    """Device UUID -> GPU memory (MiB) promised to the shared jobs on it (`--shared`): more of them go there while
    their memory fits; no exclusive job does (the device is busy)."""
    data_at: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Dataset -> the nodes holding it, ready (declared, found by a scan, or copied: hsched.controller.data). A
    dataset not here (a shared mount, a name nobody declared) costs nothing anywhere."""
    data_bytes: Mapping[str, int] = field(default_factory=dict)
    """Dataset -> its size in bytes: what a copy of it moves."""
    data_copying: Mapping[tuple[str, str], int] = field(default_factory=dict)
    """(dataset, node) -> the bytes a copy under way there (a prefetch) still has to move."""
    link_bps: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """(source node, target node) -> how fast copies between them went (bytes/s, measured)."""
    default_bps: float = 125e6
    """Copy speed between two nodes no copy was measured between yet (settings `data_link_mbps`)."""
    data_waited: Mapping[int, float] = field(default_factory=dict)
    """Job id -> seconds it has waited for a node holding its data so far (since the first round that made it wait):
    its whole wait is bounded by its copy (`choose_wait`)."""


@dataclass(frozen=True, slots=True)
class Launch:
    """Launch the job now on these devices (one placement per node of a gang)."""

    job_id: int
    placements: tuple[Placement, ...]


@dataclass(frozen=True, slots=True)
class Wait:
    job_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class Move:
    """Move a running job that checkpoints to faster GPUs: stop it (checkpoint signal, grace, escalation), hold
    `placements` for it meanwhile, and start it there again."""

    job_id: int
    placements: tuple[Placement, ...]
    from_type: str
    to_type: str
    gain_s: float
    """Seconds it is expected to save (its predicted remaining time times the speed it stops wasting)."""
    cost_s: float
    """What its checkpoint and restart cost (measured, or the settings' `move_cost_s`)."""
    why: str


Decision = Launch | Wait | Preempt | Move
"""`Preempt` (hsched.sched.view): stop its victims (checkpoint signal, grace, escalation) so the job can
start on their devices in a later round. `Move`: stop a running job and start it again on faster GPUs."""


@dataclass(frozen=True, slots=True)
class Chosen:
    devices: tuple[str, ...]
    explanation: str
    cpus: tuple[int, ...] = ()


DeviceChooser = Callable[[Node, Sequence[str], Resources], Chosen | None]
"""Pick devices for a request among a node's free ones, or None."""


_POLICY_CACHE: dict[str, object] = {}
"""What the live policy keeps between rounds (PolicyInput.cache). TODO(issue 28): the caller's, passed in."""

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
        return (f"no GPU has {_gpu_size(res.gpu_memory_mib)} of memory (largest: {_gpu_size(max(gpu_mem))}); "
                "lower --gpu-memory")
    # a gang's nodes are distinct nodes of the fleet, or Slurm nodes of one Slurm node group (never both: one
    # sbatch starts all its ranks); a group's share of any job is on one of its Slurm nodes
    groups = [n for n in nodes if n.executor == "slurm"] if res.nodes > 1 else []
    room = max([len(nodes) - len(groups), *(_slurm_node_count(g) for g in groups)])
    if res.nodes > room:
        if not groups:
            return f"needs {res.nodes} nodes but {fleet} has {len(nodes)}; lower --nodes or add nodes"
        return (f"needs {res.nodes} nodes but {fleet} has {room} that one job may use (its nodes are all on one "
                "Slurm node group or all elsewhere); lower --nodes or add nodes")
    fitting = []
    best = 0
    in_groups: list[str] = []
    for n in nodes:
        elig = eligible_devices(n, res)
        hosts = _slurm_hosts(n)
        # a Slurm group: each of its Slurm nodes is what a node's share of a job must fit on
        parts = [elig] if hosts is None else list(_per_slurm_node(elig, hosts).values()) or [[]]
        best = max(best, *map(len, parts))
        if res.cpus is not None and n.cpus is not None and res.cpus > n.cpus:
            continue
        if res.memory_mib is not None and n.memory_total_mib is not None and res.memory_mib > n.memory_total_mib:
            continue
        # the topology engine's own search (a clique of the NVLink graph): a job it could never place on the
        # empty node is refused now rather than left waiting for ever
        ok = [part for part in parts if len(part) >= res.gpus and not (
            res.interconnect is Interconnect.NVLINK and res.gpus > 1
            and place_on_node(n, res.gpus, part, Resources(gpus=res.gpus, interconnect=res.interconnect)) is None)]
        if not ok:
            continue
        if hosts is not None and res.nodes > 1:
            if len(ok) >= res.nodes:
                return None  # the whole gang fits the group's Slurm nodes
            in_groups.append(f"{len(ok)} of Slurm group {n.name}'s")
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
        also = f" (and {', '.join(in_groups)} nodes: one job's nodes are all on one group)" if in_groups else ""
        return (f"needs {res.nodes} nodes each with {what}, but only {len(fitting)} node(s) of {fleet} qualify"
                f"{also}; lower --nodes/--gpus or add nodes")
    return (f"needs {what} on one node, but no node of {fleet} has that (the most any node offers is {best}); "
            "lower --gpus, change --gpu-type or add a node")


def _size(mib: int) -> str:
    """MiB as people write sizes: 10T, 512G, 750M."""
    for unit, mult in (("T", 1024 * 1024), ("G", 1024)):
        if mib >= mult:
            value = mib / mult
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{mib}M"


def _gpu_size(mib: int) -> str:
    """MiB as GPU vendors write sizes, in the decimal units `--gpu-memory` is read in (config.parse_gpu_memory_mib:
    80G is 80 * 10^9 bytes): 85.5 GB, 1.1 TB. An H100 80GB's 81,559 MiB is 85.5 GB; in binary units with a bare G
    (79.6G) it read as if an 80G request could not fit it."""
    size = mib * 2**20
    for unit, mult in (("TB", 10**12), ("GB", 10**9)):
        if size >= mult:
            return f"{size / mult:.1f}".removesuffix(".0") + f" {unit}"
    return f"{size / 10**6:.0f} MB"


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
    rank, normal = QOS_RANK.get, qos_rank(DEFAULT_QOS)  # qos_rank, inline: the key runs once per waiting job
    return sorted(queue, key=lambda j: (rank(j.spec.qos, normal), -j.spec.priority, j.submit_time, j.id))


@functools.lru_cache(maxsize=256)
def gpu_type_of(model: str) -> str:
    """The core's GPU type for a device model: the accelerator table's key ("h100", "a100"...) or the model.
    Cached: a round names every node's type, and the table's pattern search costs ~80 us a model."""
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
    decisions: list[Decision] = []
    if fleet.held:
        fleet, queue, decisions = _held_starts(fleet, queue)
    st = _RoundState(fleet, chooser or default_chooser(), now)
    if any(j.spec.resources.shared for j in queue):
        # shared jobs (a fraction of one GPU each) are packed first, apart from the policy: it plans whole GPUs
        decisions += st.place_shared(order([j for j in queue if j.spec.resources.shared]))
        queue = [j for j in queue if not j.spec.resources.shared]
    core_waiting: dict[int, str] = {}
    by_id = {j.id: j for j in queue}
    if fleet.policy:
        # a job over a QoS cap, or with no node it may use, is not the policy's to plan: it would hold capacity
        # in the plan that it cannot use; it waits (with its reason) below
        capped: set[int] = set()
        nowhere: set[int] = set()
        gpu_jobs: list[Job] = []
        blocked, nodes_for, limited = st.tally.blocked, st.nodes_for, bool(fleet.limits)
        if not limited and not st.absent_anywhere:
            # the usual case, in one pass over the queue: a job's nodes are its constraint's
            by_constraint: dict[str, bool] = {}
            for j in queue:
                res = j.spec.resources
                some = by_constraint.get(res.constraint)
                if some is None:
                    some = by_constraint[res.constraint] = bool(nodes_for(j))
                if not some:
                    nowhere.add(j.id)
                elif res.gpus > 0:
                    gpu_jobs.append(j)
        else:
            for j in queue:
                if limited and blocked(j) is not None:
                    capped.add(j.id)
                elif not nodes_for(j):
                    nowhere.add(j.id)
                elif j.spec.resources.gpus > 0:
                    gpu_jobs.append(j)
        starts, core_waiting, served, over, moved = _core_round(fleet.policy, gpu_jobs, st, now, by_id,
                                                                fleet.throughput)
        for d in moved:
            # moves and time-sharing stops first: their devices are taken (a move's new ones) or theirs to claim
            st.hold(u for p in (d.placements if isinstance(d, Move) else ()) for u in p.devices)
            decisions.append(d)
        # EASY backfill (issue 14, item 4): the most important job the plan does not start gets GPUs reserved
        # where it can start soonest; the plan's starts of jobs behind it keep off those GPUs unless they end
        # (by their time limit) before it starts. Without it a gang of 8 waited for ever behind a stream of
        # one-GPU jobs, each fitting the GPUs the previous ones left (the policy skips what does not fit).
        started_ids = {i for i, _ in starts}
        keys = _order_keys(gpu_jobs, over, fleet.attained)
        head_key = (min(keys.values(), default=None) if not started_ids else  # (a busy round starts nothing)
                    min((k for i, k in keys.items() if i not in started_ids), default=None))
        head = by_id[head_key[-1]] if head_key is not None else None  # (a key ends with its job's id)
        behind: list[tuple[Job, tuple[Placement, ...]]] = []
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
                continue  # on the head's reserved GPUs: backfill (below) looks for others
            if st.tally.blocked(job) is None and st.take(job, placements):
                st.tally.add(job)
                decisions.append(Launch(job.id, placements))
        started = {d.job_id for d in decisions}
        core_waiting.update({i: _RESOURCES for i in nowhere})
        rest = [by_id[i] for i in served if i not in started]
        if capped or nowhere or len(gpu_jobs) + len(capped) + len(nowhere) < len(queue):
            # those the policy did not plan: capped, with no node, CPU only (sorted only when there are some)
            ordered = order(queue)
            rest += [j for j in ordered if j.spec.resources.gpus > 0 and (j.id in capped or j.id in nowhere)]
            rest += [j for j in ordered if j.spec.resources.gpus == 0]
    else:
        rest = order(queue)
    decisions.extend(st.settle_all(rest, core_waiting))
    global _WAITS
    _WAITS = st.waits
    st.keep_where()
    return decisions


def _held_starts(fleet: FleetView, queue: Sequence[Job]) -> tuple[FleetView, list[Job], list[Decision]]:
    """A job a move promised devices to (`FleetView.held`) starts there as soon as it waits again and they are free;
    until then nobody else is given them. Returns the fleet with the held devices busy, the queue without the jobs
    started, and their launches."""
    up = {n.name for n in fleet.nodes if n.state is NodeState.UP}
    cpus = dict(fleet.cpus_used)
    mems = dict(fleet.memory_used)
    rest: list[Job] = []
    out: list[Decision] = []
    for j in queue:
        ps = fleet.held.get(j.id)
        if ps is not None and all(p.node in up and fleet.busy.isdisjoint(p.devices) for p in ps):
            out.append(Launch(j.id, ps))
            res = j.spec.resources
            for p in ps:
                if res.cpus:
                    cpus[p.node] = cpus.get(p.node, 0) + res.cpus
                if res.memory_mib:
                    mems[p.node] = mems.get(p.node, 0) + res.memory_mib
        else:
            rest.append(j)
    held = frozenset(u for ps in fleet.held.values() for p in ps for u in p.devices)
    return replace(fleet, busy=fleet.busy | held, cpus_used=cpus, memory_used=mems), rest, out


def _order_key(job: Job, over: frozenset[str] = frozenset(), attained: float = 0.0) -> OrderKey:
    """Which waiting job is the most important (the one the round reserves GPUs for): `order`'s key, with the
    `hsched` policy's fair share (`over`: the users it serves after the others) after QoS and priority, then the
    GPU-seconds its earlier attempts attained, as that policy orders waiting jobs."""
    res = job.spec.resources
    return (QOS_RANK.get(job.spec.qos, _NORMAL), -job.spec.priority, job.user in over,
            max(1, res.gpus * res.nodes) * attained, job.submit_time, job.id)


_NORMAL = qos_rank(DEFAULT_QOS)
OrderKey = tuple[int, int, bool, float, float, int]

_KEYS: dict[int, tuple[Job, bool, OrderKey]] = {}
"""The last round's `_order_key` of each waiting job, by id, with the job and its fair share flag it was made of."""
_KEYS_OUT: tuple[tuple[Job, ...], frozenset[str], dict[int, OrderKey]] = ((), frozenset(), {})
"""The last round's waiting jobs, fair share flags and keys by id (handed back whole while the jobs are the same)."""


def _order_keys(jobs: Sequence[Job], over: frozenset[str], attained: Mapping[int, float] = _NONE
                ) -> dict[int, OrderKey]:
    """`_order_key` of the round's waiting jobs by id, kept from round to round while a job (the very object) and
    its user's fair share flag are the same: finding the head is a pass over 2,000 waiting jobs every round."""
    global _KEYS, _KEYS_OUT
    last_jobs, last_over, last_out = _KEYS_OUT
    if over == last_over and len(jobs) == len(last_jobs) and all(map(operator.is_, jobs, last_jobs)):
        return last_out  # the very same waiting jobs as last round (a busy queue's usual round)
    last, kept, out = _KEYS, {}, {}
    for j in jobs:
        flag = j.user in over
        hit = last.get(j.id)
        if hit is None or hit[0] is not j or hit[1] is not flag:
            hit = (j, flag, _order_key(j, over, attained.get(j.id, 0.0) if j.restarts else 0.0))
        kept[j.id] = hit
        out[j.id] = hit[2]
    _KEYS, _KEYS_OUT = kept, (tuple(jobs), over, out)
    return out


def _minute(t: float) -> str:
    """A time as the reservation's reason gives it: ISO 8601 UTC to the minute, rounded up (a reason that changed
    every round would be written every round)."""
    return datetime.fromtimestamp(math.ceil(t / 60.0) * 60.0, UTC).strftime("%Y-%m-%dT%H:%MZ")


_RESERVED: tuple[object, tuple[float, frozenset[str], str] | None] = ((), None)
"""The last round's reservation: what it was made of, and (its time, its devices, the head's reason); one global,
swapped whole (two controllers in one process, in tests, at worst miss)."""

_WHERE: tuple[tuple[object, ...], dict[int, tuple[Job, frozenset[str]]]] = ((), {})
"""The last round's `_RoundState.where` per waiting job, and what it was made of; one global, swapped whole."""
_WAITS: dict[int, Wait] = {}
"""The last round's waits by job id (`_RoundState.wait`); only the last round's, so ended jobs do not pile up."""


# ---------------------------------------------------------------- the core's round over the live fleet

Fit = Callable[[Node, Job, Sequence[str], Collection[str]], Placement | None]
"""Place `job` on `node` using only the given free devices (and the busy ones of the last argument), or None."""


class LivePlacer:
    """The simulator's server choice (best fit, NVLink first) with real constraints and topology inside."""

    def __init__(self, nodes: Mapping[str, Node], jobs: Mapping[int, Job], fit: Fit,
                 prefer: Mapping[int, str] | None = None, labels: Mapping[str, frozenset[str]] | None = None,
                 moving: Mapping[int, Job] | None = None, busy: Collection[str] = (),
                 stoppable: Collection[str] = ()) -> None:
        self.nodes = nodes
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
        out: list[Placement] = []
        for s in ranked:
            p = self.fit(self.nodes[s.name], j, free.get(s.name, ()), stoppable)
            if p is not None:
                out.append(p)
                if len(out) == need:
                    return tuple(out)
        return None


_ARRIVAL = operator.itemgetter(3, 0)
"""A JobView's (arrival_s, id), as a C-level sort key (a round sorts every active job by it)."""
_make_view = JobView._make
_ID = operator.itemgetter(0)
"""A JobView's id."""
_MODEL_MEMORY = operator.attrgetter("model", "memory_total_mib")
_USER = operator.attrgetter("user")


def _running_view(r: Running, types_of: Mapping[str, str], now: float, movable: Mapping[int, float] = _NONE,
                  attained: Mapping[int, float] = _NONE) -> JobView:
    job = r.job
    res = job.spec.resources
    node = job.placement[0].node if job.placement else ""
    # attained service: this attempt's running time and its earlier attempts' (least attained service must not
    # forget what a job that was stopped and restarted had already had)
    run_s = max(0.0, now - r.started) + attained.get(job.id, 0.0)
    placement = job.placement
    gpus = (len(placement[0].devices) if len(placement) == 1 else sum(len(p.devices) for p in placement)) or max(
        1, res.gpus * res.nodes)
    # _make, positional: a round makes one per running job, and the NamedTuple's own __new__ costs twice as much
    return _make_view((job.id, kind_of(job.spec.kind, job.spec.command), gpus, job.submit_time, JobPhase.RUNNING,
                       job.spec.qos, job.spec.priority, job.user, types_of.get(node), placement, r.started, run_s,
                       run_s, job.restarts, job.spec.time_limit_s, res.nodes, (), job.id in movable))


_RUN_PARTS: dict[int, tuple[Running, str | None, tuple[object, ...], tuple[object, ...], bool, float]] = {}
"""The last round's running views in parts, by job id: (the Running, its node's GPU type, the fields before
run_s, those after service_s, whether it was movable, its earlier attempts' service). Only run_s and service_s
move from round to round; one global, swapped whole."""
_new_tuple = tuple.__new__


def _running_views(running: Iterable[Running], types_of: Mapping[str, str], now: float,
                   movable: Mapping[int, float] = _NONE, attained: Mapping[int, float] = _NONE) -> list[JobView]:
    """`_running_view` of each running job that has a placement: the same views, but a job seen in the last round
    (the very Running: the controller keeps it while its job and start are unchanged) on a node of the same GPU
    type is joined from its kept parts (512 running jobs: 1.3 ms a round down to 0.3)."""
    global _RUN_PARTS
    last, kept = _RUN_PARTS, {}
    out = []
    for r in running:
        job = r.job
        if not job.placement:
            continue
        hit = last.get(job.id)
        t = types_of.get(job.placement[0].node)
        jid = job.id
        before = attained.get(jid, 0.0) if attained else 0.0
        if hit is None or hit[0] is not r or hit[1] != t or hit[4] is not (jid in movable) or hit[5] != before:
            v = _running_view(r, types_of, now, movable, attained)
            hit = (r, t, v[:11], v[13:], jid in movable, before)
        else:
            run_s = max(0.0, now - r.started) + before
            v = _new_tuple(JobView, (*hit[2], run_s, run_s, *hit[3]))
        kept[job.id] = hit
        out.append(v)
    _RUN_PARTS = kept
    return out


def _pending_view(job: Job, allowed: tuple[str, ...] = (), attained: float = 0.0) -> JobView:
    res = job.spec.resources
    spec = job.spec
    # (as _running_view's) the job's kind is the throughput model's job type: what the controller learnt of its
    # speed, if anything; `attained`: what its earlier attempts ran
    return _make_view((job.id, kind_of(spec.kind, spec.command), max(1, res.gpus * res.nodes), job.submit_time,
                       JobPhase.PENDING, spec.qos, spec.priority, job.user, None, (), None, attained, attained,
                       job.restarts, spec.time_limit_s, res.nodes, allowed, False))



ViewCache = dict[int, tuple[Job, tuple[str, ...], JobView]]
"""Job id -> (the Job, its allowed GPU types, its view)."""

_VIEWS: tuple[tuple[object, ...], ViewCache, Sequence[Job], list[JobView]] = ((), {}, (), [])
"""The last round's fleet (what a job's allowed GPU types depend on: each typed node's name, type, labels, absent
users and device models and memory), its waiting jobs' views, and its waiting jobs and their views in order. A
waiting job's view is the same from round to round while the job is (the very object: the controller keeps unchanged
jobs) and the fleet is; one global, swapped whole, so two controllers in one process (tests) at worst miss."""


def _pending_views(pending: Sequence[Job], allowed: Callable[[Job], tuple[str, ...]],
                   fleet: tuple[object, ...], attained: Mapping[int, float] = _NONE) -> list[JobView]:
    global _VIEWS
    last_fleet, last, last_pending, last_out = _VIEWS
    same_fleet = fleet == last_fleet
    if same_fleet and len(pending) == len(last_pending) and all(map(operator.is_, pending, last_pending)):
        return list(last_out)  # the very same jobs as last round (a busy queue's usual round): the same views
    kept: ViewCache = {}
    out = []
    for j in pending:
        hit = last.get(j.id)
        if hit is None or hit[0] is not j or not same_fleet:
            types = allowed(j)
            if hit is None or hit[0] is not j or hit[1] != types:
                hit = (j, types, _pending_view(j, types, attained.get(j.id, 0.0) if j.restarts else 0.0))
        kept[j.id] = hit
        out.append(hit[2])
    # only this round's jobs are kept: ended jobs do not pile up
    _VIEWS = (fleet, kept, tuple(pending), out)
    return list(out)


def _core_round(policy_name: str, pending: Sequence[Job], st: _RoundState, now: float, queued: Mapping[int, Job],
                throughput: ThroughputModel | None = None,
                ) -> tuple[list[tuple[int, tuple[Placement, ...]]], dict[int, str], list[int], frozenset[str],
                           list[Move | Preempt]]:
    """The core's round over the live fleet: (starts of pending jobs, why they wait (running jobs may be there
    too: they never wait), pending job ids in the order the policy serves them, wanted first). `queued`: the
    round's waiting jobs by id, `pending` among them (a job the round plans is running or in `queued`); the
    users the `hsched` policy's fair share serves after the others (none under another policy); and the moves of
    running jobs and time-sharing stops the plan makes (`_moves`: only of jobs in `FleetView.movable`)."""
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
    users = {r.job.user for r in fleet.running}.union(map(_USER, pending))
    usage = {u: base.get(u, 0.0) for u in users}

    # a job's allowed GPU types depend on its nodes and its request's models and memory: once per such shape
    allowed_of: dict[tuple[NodesKey, tuple[str, ...], int | None], tuple[str, ...]] = {}

    def allowed(job: Job) -> tuple[str, ...]:
        res = job.spec.resources
        key = (st.nodes_key(job), res.gpu_types, res.gpu_memory_mib)
        got = allowed_of.get(key)
        if got is None:
            mine = {n.name for n in st.nodes_for(job)}
            got = allowed_of[key] = tuple(sorted({types_of[n.name] for n in typed
                                                  if n.name in mine and st.eligible(n, res)}))
        return got

    movable = fleet.movable
    views = _running_views(running, types_of, now, movable, fleet.attained)
    labels, absent = fleet.labels, fleet.absent_users
    signature = tuple((n.name, types_of[n.name], labels.get(n.name), absent.get(n.name),
                       tuple(map(_MODEL_MEMORY, n.devices))) for n in typed)
    views += _pending_views(pending, allowed, signature, fleet.attained)
    forecast = {i: max(0.0, end - now) for i, end in fleet.ends.items() if i in movable} if movable else None
    inp = build_input(now, sorted(views, key=_ARRIVAL), servers,
                      throughput or catalog_throughput(), user_usage=usage if len(usage) > 1 else {},
                      checkpoint_costs=movable, forecast_s=forecast,
                      quantum_s=fleet.move_min_run_s if movable else None, cache=_POLICY_CACHE)
    plan = make_plan(policy, inp)
    # (the placer places the waiting jobs it knows, and the running ones that may move, on devices free now)
    moving = {r.id: r.job for r in fleet.running if r.id in movable} if movable else {}
    placer = LivePlacer({n.name: n for n in typed}, queued, st.fit_free, fleet.prefer, fleet.labels, moving,
                        st.busy, frozenset(u for j in moving.values() for p in j.placement for u in p.devices))
    # only the jobs that proved they checkpoint (`movable`) may be stopped by the plan, once they have run
    # `move_min_run_s`; the rule keeps every other running job in place
    rule = replace(fleet.rule, time_sharing=bool(movable), min_run_s=fleet.move_min_run_s)
    decision = apply_rule(plan, inp, servers, placer, rule)
    moved = _moves(decision, inp, policy, queued, st) if movable else []
    # (a job id the plan names is a running job's or in `queued`, so `queued` tells waiting ones apart)
    wanted = [w.job_id for w in plan.wants if w.job_id in queued]
    # the others by submit time: the order `inp.jobs` already has (a view's arrival is its job's submit time)
    others = {j.id for j in pending}.difference(wanted)
    rest = [i for i in map(_ID, inp.jobs) if i in others]
    over = policy.over_share(inp)
    taken = {d.job_id for d in moved}
    waiting = dict(decision.waiting)
    starts = []
    for start in decision.starts:
        if start.job_id not in queued or start.job_id in taken:
            continue
        if not st.busy.isdisjoint(u for p in start.placement for u in p.devices):
            waiting[start.job_id] = _RESOURCES  # on devices a moving job still holds: its turn comes when they free
            continue
        starts.append((start.job_id, start.placement))
    return starts, waiting, wanted + rest, over, moved


def _moves(decision: RoundDecision, inp: PolicyInput, policy: AnyPolicy, queued: Mapping[int, Job],
           st: _RoundState) -> list[Move | Preempt]:
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
                why = (f"moving from {old} to {s.gpu_type} on {nodes}: expected to save {_secs(gain)} for a "
                       f"checkpoint and restart of {_secs(cost)}")
            else:
                # a move down: the assignment gives its GPUs to jobs that gain more there (the simulator's policy
                # does so at a checkpoint cost too: tests/sim/test_checkpoint_policy.py)
                mine = {u for p in v.placement for u in p.devices}
                takers = sorted(t.job_id for t in decision.starts if t.job_id != v.id
                                and not mine.isdisjoint(u for p in t.placement for u in p.devices))
                to = (f"job {takers[0]}" if len(takers) == 1 else f"jobs {', '.join(map(str, takers))}" if takers
                      else "the jobs it makes room for")
                why = (f"moving from {old} to {s.gpu_type} on {nodes}: its {old} GPUs go to {to}, which gain more "
                       f"there; a checkpoint and restart of {_secs(cost)}")
            out.append(Move(v.id, s.placement, old, s.gpu_type, gain, cost, why))
            continue
        if s.job_id not in queued or queued[s.job_id].reason == _PREEMPTING:
            continue  # (a job already waiting for the GPUs of jobs it stopped does not stop more)
        victims = sorted({stopped[u] for p in s.placement for u in p.devices if u in stopped})
        if not victims or len(s.placement) != 1:
            continue
        names = ", ".join(f"{i} ({views[i].service_s / 3600:.1f} h)" for i in victims)
        out.append(Preempt(v.id, tuple(victims), s.placement[0].node,
                           f"time-sharing in {v.qos}: job {v.id} has had {v.service_s / 3600:.1f} h of service, "
                           f"less than job(s) {names}: they checkpoint and wait"))
    if any(isinstance(d, Preempt) for d in out):
        st.victims().taken.update(i for d in out if isinstance(d, Preempt) for i in d.victims)
    return out


def _secs(s: float) -> str:
    if s == math.inf:
        return "an unknown time"
    return f"{s / 60:.0f} min" if s >= 120 else f"{s:.0f} s"


# ---------------------------------------------------------------- backfill, releasing devices, QoS preemption

_PREEMPTING, _PRIORITY, _RESOURCES = EndReason.PREEMPTING.value, EndReason.PRIORITY.value, EndReason.RESOURCES.value

NodesKey = tuple[str, str]
"""What decides which nodes a job may use: its constraint's text, and its user where that user is absent from
some node ("" otherwise: every such user sees the same nodes)."""


class _RoundState:
    """Devices and CPUs handed out so far in this round, and the fallbacks for a job that did not start.

    Indexed once per round, so that a round costs about the queue plus the fleet, not their product: the nodes
    each (constraint, user) may use, the devices each request shape may use on each node, free devices per node,
    the running jobs QoS may preempt. A search that found nothing for one request finds nothing for the next
    job asking the same (equal `Resources`, same nodes) until devices, CPUs or victims change hands: `version`
    counts those changes and `_missed` remembers the version each search last failed at. A full fleet with 2,000
    waiting jobs thus costs a few searches per request shape.
    """

    def __init__(self, fleet: FleetView, choose: DeviceChooser, now: float) -> None:
        self.fleet = fleet
        self.choose = choose
        self.now = now
        self.busy = set(fleet.busy)
        self.cpus_used = dict(fleet.cpus_used)
        self.memory_used = dict(fleet.memory_used)
        self._shared_use = dict(fleet.shared_use)
        self.releasing = set(fleet.releasing)
        self.up = [n for n in fleet.nodes if n.state is NodeState.UP]
        self.by_name = {n.name: n for n in self.up}
        self.blocked_ahead = False
        self._wanted: set[str] = set()
        """The up nodes the jobs that waited so far in this round could use: a job that wants none of them waits for
        resources, not behind them (`why`)."""
        self._where: dict[tuple[object, ...], frozenset[str]] = {}
        # the last round's `where` per job, while the nodes' names, states, devices and labels and the absent users
        # are the same objects' (a fleet view is rebuilt each round, but from the very nodes while none changed)
        self._where_sig = (fleet.nodes, fleet.labels, fleet.absent_users)
        last_sig, last_where = _WHERE
        same = (len(last_sig) == 3 and isinstance(nodes := last_sig[0], tuple) and len(nodes) == len(fleet.nodes)
                and all(map(operator.is_, nodes, fleet.nodes))
                and last_sig[1] == fleet.labels and last_sig[2] == fleet.absent_users)
        self._where_last = last_where if same else {}
        self._where_kept: dict[int, tuple[Job, frozenset[str]]] = {}
        self._added: set[int] = set()
        self._behind: set[int] = set()
        self._victims: Victims | None = None
        holders = fleet.holders if fleet.holders is not None else tuple(r.job for r in fleet.running)
        self.tally = Tally(fleet.limits, holders)
        self.version = 0
        """Bumped whenever devices, CPUs or victims are handed out: a failed search stays failed until then."""
        self._node_of = {d.uuid: n.name for n in self.up for d in n.devices}
        self._free = {n.name: sum(1 for d in n.devices if d.uuid not in self.busy) for n in self.up}
        self._max_free = (-1, 0)
        self.absent_anywhere = frozenset().union(*fleet.absent_users.values()) if fleet.absent_users else frozenset()
        """The users absent from some node (lab mode): only their jobs see fewer nodes than their constraint's."""
        self._constraints: dict[str, Constraint | None] = {}
        self._nodes: dict[NodesKey, list[Node]] = {}
        self._by_constraint: dict[str, list[Node]] = {}
        self._ranked: dict[NodesKey, list[Node]] = {}
        self._eligible: dict[tuple[str, tuple[str, ...], int | None], tuple[str, ...]] = {}
        self._missed: dict[tuple[object, ...], int] = {}
        self._placed: dict[tuple[str, Resources, tuple[str, ...], int, int], Placement | None] = {}
        # the classes QoS could preempt at all this round: a waiting job whose class preempts none of them
        # never searches for victims
        self._victim_classes = frozenset(r.job.spec.qos for r in fleet.running if len(r.job.placement) == 1)
        self._choosable = (-1, frozenset[str]())
        # no QoS caps and no absent users: a job's only ways to go are free devices, released ones and victims
        self._plain = not fleet.limits and not self.absent_anywhere
        self._last_waits = _WAITS
        self.waits: dict[int, Wait] = {}
        """This round's waits, by job: the next round's `_last_waits`."""
        self._quiet = (-1, False)
        self.head: int | None = None
        """The job the round reserves GPUs for: the most important one that cannot start now (EASY backfill)."""
        self.reserved: frozenset[str] = frozenset()
        """Its devices: where it starts at `shadow`. Other jobs use them only if they end before (`exempt`)."""
        self.shadow = math.inf
        """When the head is expected to start (inf: a job holding its GPUs has no predicted end)."""
        self.head_reason = ""
        self._reserving = fleet.policy is None
        """Whether the first job that waits becomes the head (without a policy: `schedule` picks it otherwise)."""
        self._started: dict[str, float] = {}
        """Devices of the jobs started this round -> when they end (their time limit; inf without one)."""
        self._busy_reserved: tuple[int, set[str]] = (-1, set())
        self._links: dict[str, str] = {}
        self._copy_s: dict[tuple[tuple[str, ...], str], float] = {}
        self._running_on: dict[str, list[tuple[float, frozenset[str]]]] | None = None
        self.data_waits: dict[int, str] = {}
        """Jobs that wait for a node holding their data (`data_ok`), and why, as `why` says it."""
        self._data_wait_node: dict[int, str] = {}
        """Job id -> the node holding its data it waits for (its reservation goes there if it is the head)."""
        self._data_held: dict[str, tuple[Job, float]] = {}
        """Node -> the job waiting for it (first in line) and when it is predicted to have room for that job (seconds
        from now): others may take its free devices only if that stays so (`take`, EASY backfill's rule)."""

    # ------------------------------------------------------------------ indexes

    def constraint(self, res: Resources) -> Constraint | None:
        text = res.constraint
        if text not in self._constraints:
            self._constraints[text] = constraint_of(res)
        return self._constraints[text]

    def labelled(self, node: str, job: Job) -> bool:
        """The node's labels satisfy the job's --constraint (any node does without one)."""
        c = self.constraint(job.spec.resources)
        return c is None or c.satisfied_by(self.fleet.labels.get(node, frozenset()))

    def absent(self, node: str, job: Job) -> bool:
        """The job's user does not exist on the node (lab mode)."""
        return job.user in self.fleet.absent_users.get(node, frozenset())

    def nodes_key(self, job: Job) -> NodesKey:
        user = job.user if job.user in self.absent_anywhere else ""
        return (job.spec.resources.constraint, user)

    def nodes_for(self, job: Job) -> list[Node]:
        """The up nodes the job may use: labelled as its constraint asks, its user present there."""
        if not self.absent_anywhere:  # (the usual case, once per waiting job: no key to build)
            got = self._by_constraint.get(job.spec.resources.constraint)
            if got is not None:
                return got
        key = self.nodes_key(job)
        got = self._nodes.get(key)
        if got is None:
            got = self._nodes[key] = [n for n in self.up
                                      if self.labelled(n.name, job) and not self.absent(n.name, job)]
            if not self.absent_anywhere:
                self._by_constraint[key[0]] = got
        return got

    def ranked(self, job: Job) -> list[Node]:
        """`nodes_for`, the node holding the job's checkpoint first, then the plainest nodes (fewest labels:
        special ones stay for who needs them), in fleet order among equals."""
        key = self.nodes_key(job)
        got = self._ranked.get(key)
        if got is None:
            labels = self.fleet.labels
            got = self._ranked[key] = sorted(self.nodes_for(job), key=lambda n: len(labels.get(n.name, ())))
        home = self.fleet.prefer.get(job.id)
        if home is not None and any(n.name == home for n in got):
            return [n for n in got if n.name == home] + [n for n in got if n.name != home]
        return got

    def eligible(self, node: Node, res: Resources) -> tuple[str, ...]:
        """`eligible_devices`, once per node and request shape (GPU types, GPU memory) in a round."""
        key = (node.name, res.gpu_types, res.gpu_memory_mib)
        got = self._eligible.get(key)
        if got is None:
            got = self._eligible[key] = tuple(eligible_devices(node, res))
        return got

    def quiet(self) -> bool:
        """No device is free on any node and none is being released: no job that needs GPUs can start or claim
        any now (the usual state of a busy fleet, where settling 2,000 waiting jobs should cost 2,000 lookups)."""
        version, value = self._quiet
        if version != self.version:
            value = self.max_free() == 0 and not self.releasing
            self._quiet = (self.version, value)
        return value

    def max_free(self) -> int:
        """The most devices free on one up node now."""
        version, value = self._max_free
        if version != self.version:
            value = max(self._free.values(), default=0)
            self._max_free = (self.version, value)
        return value

    # ------------------------------------------------------------------ handing out

    def hold(self, devices: Iterable[str]) -> None:
        """These devices are taken (by a start or a claim) from now on in this round."""
        for u in devices:
            if u not in self.busy:
                self.busy.add(u)
                node = self._node_of.get(u)
                if node is not None:
                    self._free[node] -= 1
        self.version += 1

    def fit(self, node: Node, res: Resources, busy: Collection[str], among: Collection[str] | None = None,
            freed: Collection[str] = ()) -> Placement | None:
        """The request on `node`, on devices not in `busy` or in `freed` (and in `among`, when given), or None.

        The device choice (the topology engine: the costly part) is asked once per node, request and free set in a
        round: QoS preemption asks the same question of every node for every waiting job of a shape.

        On a Slurm node group (`_slurm_hosts`) a node's share of a job is on one Slurm node of the group (sbatch's
        `--gpus-per-node` is per Slurm node: GPUs of two of them would never start), and a gang is placed there
        only whole (`start_now`, `_gang_on_group`): one share of a gang is never placed on a group here, so a gang
        never spans a group and another node (one sbatch starts all its ranks)."""
        hosts = _slurm_hosts(node)
        if hosts is not None and res.nodes > 1:
            return None
        used = self.cpus_used.get(node.name, 0)
        if res.cpus is not None and node.cpus is not None and used + res.cpus > node.cpus:
            return None
        mem_used = self.memory_used.get(node.name, 0) if res.memory_mib else 0
        if res.memory_mib and node.memory_total_mib is not None and mem_used + res.memory_mib > node.memory_total_mib:
            return None  # host memory is promised like CPUs: two 200G jobs do not share a 256G node
        elig = self.eligible(node, res)
        if freed:
            free = [u for u in elig if (u not in busy or u in freed) and (among is None or u in among)]
        elif among is None:
            free = [u for u in elig if u not in busy]
        else:
            free = [u for u in elig if u in among and u not in busy]
        if len(free) < res.gpus:
            return None
        if res.gpus == 0:
            return Placement(node=node.name, devices=(), explanation="CPU only")
        for part in ((free,) if hosts is None else _by_slurm_node(free, hosts, res.gpus)):
            key = (node.name, res, tuple(part), used, mem_used)
            if key in self._placed:
                placed = self._placed[key]
            else:
                chosen = self.choose(node, part, res)
                placed = None if chosen is None else Placement(node=node.name, devices=chosen.devices,
                                                               explanation=chosen.explanation, cpus=chosen.cpus)
                self._placed[key] = placed
            if placed is not None:
                return placed
        return None

    def fit_free(self, node: Node, job: Job, free: Sequence[str], stoppable: Collection[str] = ()) -> Placement | None:
        """`job` on `node`, using only the given free devices (the core's placer asks this); `stoppable`: busy
        devices among them it may have as well (those of running jobs the plan may time-share away)."""
        if not self.labelled(node.name, job) or self.absent(node.name, job):
            return None
        return self.fit(node, job.spec.resources, self.busy, frozenset(free), freed=stoppable)

    def take(self, job: Job, placements: Sequence[Placement]) -> bool:
        res = job.spec.resources
        if job.spec.data and self.fleet.data_at and not self.data_ok(job, placements):
            return False
        if self._data_held and not self._leaves_data_room(job, placements):
            return False
        for p in placements:
            node = self.by_name.get(p.node)
            if node is None or any(u in self.busy for u in p.devices):
                return False
            if res.cpus and node.cpus is not None and self.cpus_used.get(p.node, 0) + res.cpus > node.cpus:
                return False
            if (res.memory_mib and node.memory_total_mib is not None
                    and self.memory_used.get(p.node, 0) + res.memory_mib > node.memory_total_mib):
                return False
        limit = job.spec.time_limit_s
        end = self.now + limit if limit is not None else math.inf
        for p in placements:
            self.hold(p.devices)
            self._started.update(dict.fromkeys(p.devices, end))
            if res.cpus:
                self.cpus_used[p.node] = self.cpus_used.get(p.node, 0) + res.cpus
            if res.memory_mib:
                self.memory_used[p.node] = self.memory_used.get(p.node, 0) + res.memory_mib
        if job.id == self.head:
            # the head starts after all (on devices free now): its reservation is over
            self.reserved, self.shadow, self.head = frozenset(), math.inf, None
            self.version += 1
        return True

    # ------------------------------------------------------------------ data locality (issue 15, item 1)

    def data_copy_s(self, job: Job, node: str) -> float:
        """Seconds to bring the job's datasets to `node` (the modelled copy: each dataset the node lacks, from its
        fastest up holder, by the measured link speed; what a copy under way still has to move): 0 when all are
        there, inf when one is on no node that is up."""
        key = (job.spec.data, node)
        got = self._copy_s.get(key)
        if got is None:
            fleet, total = self.fleet, 0.0
            for name in job.spec.data:
                at = fleet.data_at.get(name)
                if at is None or node in at:
                    continue  # a shared mount (not tracked), or here already
                sources = [s for s in at if s in self.by_name]
                if not sources:
                    total = math.inf
                    break
                need = fleet.data_copying.get((name, node), fleet.data_bytes.get(name, 0))
                bps = max(fleet.link_bps.get((s, node), fleet.default_bps) for s in sources)
                total += copy_seconds(need, bps)
            got = self._copy_s[key] = total
        return got

    def data_ok(self, job: Job, placements: Sequence[Placement]) -> bool:
        """Whether the job may start on `placements` as far as its data goes: all of it is there, or no node holding
        it is predicted to have room for the job before the copy would be done (hsched.sched.locality.choose_wait:
        then waiting moves no bytes for the same start). Else it waits, and `data_waits` says for which node."""
        copy_s = max(self.data_copy_s(job, p.node) for p in placements)
        if copy_s == 0.0:
            return True
        names = ", ".join(job.spec.data)
        if math.isinf(copy_s):
            lost = [d for d in job.spec.data if not any(s in self.by_name for s in self.fleet.data_at.get(d, {""}))]
            self.data_waits[job.id] = (f"Data ({', '.join(lost) or names} is on no node that is up; "
                                       "`hsched data scan` looks for it)")
            return False
        if job.spec.resources.nodes != 1:
            return True  # a gang's nodes copy in parallel: no single node to wait for
        best: tuple[float, str] | None = None
        held = self._data_held
        for node in self.nodes_for(job):
            # (first in line: a holder another job already waits for is not waited for again this round)
            if self.data_copy_s(job, node.name) == 0.0 and (node.name not in held or held[node.name][0] is job):
                free_in = self.free_in(node, job)
                if free_in is not None and (best is None or free_in < best[0]):
                    best = (free_in, node.name)
        # the whole wait is bounded by the copy: a holder whose predicted free time keeps slipping (taken by others,
        # runs longer than predicted) never makes the job wait longer than copying at once would have
        if best is not None and choose_wait(copy_s, best[0], self.fleet.data_waited.get(job.id, 0.0)):
            self.data_waits[job.id] = (f"Data (waiting for {best[1]}, which holds {names}: free in ~{_secs(best[0])}; "
                                       f"a copy would take ~{_secs(copy_s)})")
            held[best[1]] = (job, best[0])
            self._data_wait_node[job.id] = best[1]
            return False
        return True

    def _leaves_data_room(self, job: Job, placements: Sequence[Placement]) -> bool:
        """`job` may take devices on a node held for a job waiting for its data only if that job is still predicted
        to have room there by when it was promised (its devices counted busy until the end of `job`'s time limit)."""
        limit = job.spec.time_limit_s
        end = self.now + limit if limit is not None else math.inf
        for p in placements:
            got = self._data_held.get(p.node)
            if got is None or got[0] is job:
                continue
            waiting, promised = got
            after = self.free_in(self.by_name[p.node], waiting, dict.fromkeys(p.devices, end))
            if not leaves_room(after, promised):
                return False
        return True

    def free_in(self, node: Node, job: Job, extra: Mapping[str, float] = _NO_DEVICES) -> float | None:
        """Seconds until `node` is predicted to have room for the job's GPUs: 0 when it fits now; else when enough of
        its eligible devices free, by the running jobs' predicted ends (devices being released: now; the round's
        starts: their time limits; `extra`: devices taken too, until when). None when never known (too small, or
        held by jobs with no predicted end)."""
        res = job.spec.resources
        busy = self.busy_reserved() | extra.keys() if extra else self.busy_reserved()
        if self.fit(node, res, busy) is not None:
            return 0.0
        elig = self.eligible(node, res)
        if len(elig) < res.gpus or not res.gpus:
            return None
        at = {u: end for end, devs in self._running_by_node().get(node.name, ()) for u in devs}
        at.update(self._started)
        at.update(dict.fromkeys(self.releasing, self.now))
        at.update(extra)
        when = sorted(at.get(u, math.inf) if u in self.busy or u in extra else self.now for u in elig)
        t = when[res.gpus - 1]
        return None if math.isinf(t) else max(0.0, t - self.now)

    def _running_by_node(self) -> dict[str, list[tuple[float, frozenset[str]]]]:
        """Node -> (predicted end, devices) of each running job there, made once per round on first need."""
        if self._running_on is None:
            by_node: dict[str, list[tuple[float, frozenset[str]]]] = {}
            ends = self.fleet.ends
            for r in self.fleet.running:
                for p in r.job.placement:
                    by_node.setdefault(p.node, []).append((ends.get(r.id, math.inf), frozenset(p.devices)))
            self._running_on = by_node
        return self._running_on

    def soonest_devices(self, node: Node, job: Job, extra: Mapping[str, float] = _NO_DEVICES) -> list[str]:
        """The job's GPU count of the node's eligible devices that free first (free ones now; `extra`: taken until
        then): where a forecast puts it (`prefetch_targets`)."""
        res = job.spec.resources
        at = {u: end for end, devs in self._running_by_node().get(node.name, ()) for u in devs}
        at.update(self._started)
        at.update(dict.fromkeys(self.releasing, self.now))
        at.update(extra)

        def when(u: str) -> float:
            return at.get(u, math.inf) if u in self.busy or u in extra else self.now

        return sorted(self.eligible(node, res), key=when)[:res.gpus]

    def missed(self, key: tuple[object, ...]) -> bool:
        """This search failed already, and nothing changed hands since."""
        return self._missed.get(key) == self.version

    def victims(self) -> Victims:
        """The round's QoS victims, indexed once, on first need."""
        if self._victims is None:
            self._victims = Victims(self.fleet.rule, [_running_view(r, {}, self.now) for r in self.fleet.running],
                                    shared=self.sharing())
        return self._victims

    def choosable(self) -> frozenset[str]:
        """The QoS classes of the running jobs still free to be chosen as victims."""
        if not self._victim_classes:
            return self._victim_classes
        version, classes = self._choosable
        if version != self.version:
            classes = self.victims().classes()
            self._choosable = (self.version, classes)
        return classes

    # ------------------------------------------------------------------ one job

    def start_now(self, job: Job) -> tuple[Placement, ...] | None:
        """Placements for the job on free devices now (one per node of a gang), or None."""
        res = job.spec.resources
        if res.nodes >= 1 and res.gpus > self.max_free():
            return None  # no node has that many devices free: nothing to search
        exempt = self.exempt(job)
        # whether enough nodes fit does not depend on the order they are tried in, only which ones are chosen
        # (with nodes held for jobs waiting for their data, what a job may take there depends on its time limit)
        key = ("now", res, self.nodes_key(job), exempt, job.spec.time_limit_s if self._data_held else None)
        if self.missed(key):
            return None
        placements: list[Placement] = []
        free = self._free
        busy = self.busy if exempt else self.busy_reserved()
        if res.gpus:
            nodes = [n for n in self.ranked(job) if free[n.name] >= res.gpus]
            if len(nodes) > 1:
                # fragmentation-aware best fit (issue 14, item 6): a single GPU where it breaks no large NVLink
                # domain, a gang on NVLink (fragmentation_key); the node holding its checkpoint still first, and
                # `ranked`'s order (fewest labels, fleet order) among equals (the sort is stable)
                home = self.fleet.prefer.get(job.id)
                link, g = self.link_of, res.gpus
                off = res.offload
                nodes.sort(key=lambda n: (n.name != home, -host_memory_per_gpu(n) if off else 0.0,
                                          fragmentation_key(link(n), len(n.devices), free[n.name], g)))
        else:
            nodes = self.ranked(job)
        # a gang goes whole to one Slurm node group (each share on another of its Slurm nodes), or to distinct
        # other nodes, never to both: the first node in order that is a group and takes it whole wins; a group
        # met once other nodes were chosen is tried only if those fall short
        later: list[Node] = []
        for node in nodes:
            if len(placements) == res.nodes:
                break
            if res.nodes > 1 and node.executor == "slurm":
                if placements:
                    later.append(node)
                    continue
                whole = _gang_on_group(self, node, res, busy)
                if whole is not None:
                    return whole
                continue
            p = self.fit(node, res, busy)
            if p is not None and (not self._data_held or self._leaves_data_room(job, (p,))):
                placements.append(p)
        if len(placements) == res.nodes:
            return tuple(placements)
        for node in later:
            whole = _gang_on_group(self, node, res, busy)
            if whole is not None:
                return whole
        self._missed[key] = self.version
        return None

    def sharing(self) -> dict[str, frozenset[int]]:
        """Device UUID -> the running shared jobs on it (a shared GPU is free only when all of them stop)."""
        got: dict[str, set[int]] = {}
        for r in self.fleet.running:
            if r.job.spec.resources.shared:
                for u in r.devices:
                    got.setdefault(u, set()).add(r.id)
        return {u: frozenset(ids) for u, ids in got.items()}

    def place_shared(self, jobs: Iterable[Job]) -> list[Decision]:
        """Shared jobs (`--shared`: `gpu_memory_mib` of one GPU each), in order: each goes to the GPU already shared
        whose promised memory it fills best (packing: a GPU's last room first), else to a free GPU on the node with
        the fewest free (whole GPUs stay together for exclusive jobs), else it waits. A GPU holding shared jobs is
        busy for exclusive ones."""
        out: list[Decision] = []
        use = self._shared_use
        # one user per shared GPU: CUDA MPS serves one user's clients at a time on a GPU (a second user's would
        # wait behind the first's, whatever memory is left)
        owner = {u: r.job.user for r in self.fleet.running if r.job.spec.resources.shared for u in r.devices}
        for job in jobs:
            res = job.spec.resources
            need = res.gpu_memory_mib or 0
            capped = self.tally.blocked(job)
            if capped is not None:
                out.append(Wait(job.id, capped))
                continue
            best: tuple[tuple[int, int, str, str], Node, str, int] | None = None
            for node in self.nodes_for(job):
                if res.cpus and node.cpus is not None and self.cpus_used.get(node.name, 0) + res.cpus > node.cpus:
                    continue
                if (res.memory_mib and node.memory_total_mib is not None
                        and self.memory_used.get(node.name, 0) + res.memory_mib > node.memory_total_mib):
                    continue
                free_here = self._free.get(node.name, 0)
                for d in node.devices:
                    if d.uuid not in self.eligible(node, res) or d.memory_total_mib is None:
                        continue
                    used = use.get(d.uuid)
                    if used is not None:
                        if (used + need > d.memory_total_mib or d.uuid in self.releasing
                                or owner.get(d.uuid, job.user) != job.user):
                            continue
                        key = (0, -(used + need), node.name, d.uuid)  # the fullest that still fits
                    elif d.uuid not in self.busy:
                        key = (1, free_here, node.name, d.uuid)
                    else:
                        continue
                    if best is None or key < best[0]:
                        best = (key, node, d.uuid, d.memory_total_mib)
            if best is None:
                out.append(self.wait(job.id, self.why(job, None)))
                continue
            _key, node, uuid, total = best
            now_used = use.get(uuid, 0) + need
            idx = next((d.index for d in node.devices if d.uuid == uuid), 0)
            placement = Placement(node.name, (uuid,), f"GPU{idx} shared: {_gpu_size(now_used)} of "
                                                      f"{_gpu_size(total)} promised to shared jobs")
            if uuid not in use:
                self.hold((uuid,))
            use[uuid] = now_used
            owner[uuid] = job.user
            if res.cpus:
                self.cpus_used[node.name] = self.cpus_used.get(node.name, 0) + res.cpus
            if res.memory_mib:
                self.memory_used[node.name] = self.memory_used.get(node.name, 0) + res.memory_mib
            self.tally.add(job)
            out.append(Launch(job.id, (placement,)))
        return out

    def settle_all(self, jobs: Iterable[Job], reasons: Mapping[int, str]) -> list[Decision]:
        """`settle` each job in turn. While nothing is free or being released (`quiet`), a job that needs GPUs and
        may preempt no class that runs just waits: `settle` would reach the same Wait through every search, and a
        busy fleet's queue is mostly such jobs."""
        out: list[Decision] = []
        append = out.append
        plain, preempts, classes = self._plain, self.fleet.rule.qos_preempts, self._victim_classes
        last, waits = self._last_waits, self.waits
        # whether a class may preempt one that runs, once per class
        idle = {q: not allowed or allowed.isdisjoint(classes) for q, allowed in preempts.items()}
        version, quiet = -1, False
        for job in jobs:
            res = job.spec.resources
            if plain and res.gpus and res.nodes >= 1:
                if version != self.version:
                    version, quiet = self.version, self.quiet()
                if quiet and idle.get(job.spec.qos, True):
                    jid = job.id
                    if self._reserving:
                        self.reserve(job)
                    why = self.why(job, reasons.get(jid))
                    # (`wait`, inline: this is the loop over most of a busy queue)
                    w = last.get(jid)
                    if w is None or w.reason != why:
                        w = Wait(jid, why)
                    waits[jid] = w
                    append(w)
                    continue
            append(self.settle(job, reasons.get(job.id)))
        return out

    def settle(self, job: Job, reason: str | None) -> Decision:
        res = job.spec.resources
        fleet = self.fleet
        capped = self.tally.blocked(job)
        if capped is not None:
            # over a QoS cap: it neither starts nor preempts, and holds up no one behind it
            return Wait(job.id, capped)
        placements = self.start_now(job)
        if placements is not None and self.take(job, placements):
            self.tally.add(job)
            return Launch(job.id, placements)
        nodes = self.nodes_for(job)
        exempt = self.exempt(job)
        if (res.nodes == 1 and self.releasing
                and not self.missed(key := ("releasing", res, self.nodes_key(job), exempt))):
            # devices being released (preemption or cancel under way) may be this job's soon (not those reserved
            # for the head, unless it ends before the head starts)
            soon = self.busy - self.releasing
            if not exempt:
                soon |= self.reserved
            for n in nodes:
                claim = self.fit(n, res, soon)
                if claim is not None:
                    self.hold(claim.devices)
                    self.releasing.difference_update(claim.devices)
                    self.blocked_ahead = True
                    self.tally.add(job)
                    return Wait(job.id, _PREEMPTING)
            self._missed[key] = self.version
        allowed = fleet.rule.qos_preempts.get(job.spec.qos)
        if (res.nodes == 1 and allowed and not allowed.isdisjoint(self._victim_classes)
                and not allowed.isdisjoint(self.choosable())
                and not self.missed(qkey := ("qos", res, self.nodes_key(job), job.spec.qos))):
            busy = self.busy

            def fits(name: str, freed: frozenset[str]) -> bool:
                return self.fit(self.by_name[name], res, busy, freed=freed) is not None

            chosen = self.victims().choose(_pending_view(job), [n.name for n in nodes], fits)
            if chosen is not None:
                shares = self.sharing()
                freed = frozenset(u for r in fleet.running if r.id in chosen.victims for u in r.devices
                                  if u not in shares or shares[u] <= set(chosen.victims))
                claim = self.fit(self.by_name[chosen.node], res, busy, freed=freed)
                self.hold(claim.devices if claim is not None else ())  # the victims are taken, in any case
                self.blocked_ahead = True
                self.tally.add(job)  # its start is decided: the next job of its user counts it
                return chosen
            self._missed[qkey] = self.version
        missing = self.missing_user(job)
        if missing is not None:
            return Wait(job.id, missing)
        if self._reserving and res.gpus:
            self.reserve(job)  # without a policy: the first job that waits is the most important one
        return self.wait(job.id, self.why(job, reason))

    def why(self, job: Job, reason: str | None) -> str:
        """Why a job that cannot start waits, as squeue says it, and count it as waiting ahead of the rest:
        the head's reservation; `ReqNodeNotAvail` when only nodes that are not up could ever hold it; `Priority`
        only when a job served before it waits for some of the same nodes (else `Resources`: nobody is ahead of
        it for what it needs); `reason`: the policy's (Resources or Priority), else Priority after any wait."""
        where = self.where(job)
        if not where and (down := self.unavailable(job)):
            why = f"ReqNodeNotAvail, UnavailableNodes:{','.join(down)}"
        elif job.id in self.data_waits:
            why = self.data_waits[job.id]
        elif job.id == self.head:
            why = self.head_reason
        else:
            why = reason or (_PRIORITY if self.blocked_ahead else _RESOURCES)
            if why == _PRIORITY and id(where) not in self._behind:
                if self._wanted.isdisjoint(where):
                    why = _RESOURCES
                else:
                    self._behind.add(id(where))  # (`_wanted` only grows: it stays behind someone)
        self.blocked_ahead = True
        if id(where) not in self._added:
            # (a shape's node set is one object for the round: added once, not once per waiting job)
            self._added.add(id(where))
            self._wanted.update(where)
        return why

    def where(self, job: Job) -> frozenset[str]:
        """The up nodes that could ever hold the job's request (labels, user, GPU models and memory, counts):
        the last round's answer while the job (the very object) and the nodes are the same (a round asks it of
        every waiting job: 2,000 keys made afresh cost ~3 ms)."""
        hit = self._where_last.get(job.id)
        if hit is not None and hit[0] is job:
            self._where_kept[job.id] = hit
            return hit[1]
        res = job.spec.resources
        key = (self.nodes_key(job), res.gpu_types, res.gpu_memory_mib, res.gpus, res.cpus, res.memory_mib)
        got = self._where.get(key)
        if got is None:
            got = self._where[key] = frozenset(n.name for n in self.nodes_for(job)
                                               if len(self.eligible(n, res)) >= res.gpus and _could_hold(n, res))
        self._where_kept[job.id] = (job, got)
        return got

    def keep_where(self) -> None:
        """This round's `where` answers for the next round (only the jobs asked this round: ended ones do not
        pile up)."""
        global _WHERE
        _WHERE = (self._where_sig, self._where_kept)

    def unavailable(self, job: Job) -> list[str]:
        """The nodes that are not up (down, drained, unreachable) but could hold the job, when no up one could."""
        c = self.constraint(job.spec.resources)
        labels, absent, res = self.fleet.labels, self.fleet.absent_users, job.spec.resources
        return sorted(n.name for n in self.fleet.nodes
                      if n.state is not NodeState.UP and (c is None or c.satisfied_by(labels.get(n.name, frozenset())))
                      and job.user not in absent.get(n.name, frozenset()) and _could_hold(n, res))

    # ------------------------------------------------------------------ the head's reservation (EASY backfill)

    def link_of(self, node: Node) -> str:
        got = self._links.get(node.name)
        if got is None:
            got = self._links[node.name] = server_link(node)
        return got

    def exempt(self, job: Job) -> bool:
        """The job may use the head's reserved devices: there are none, it is the head, or its time limit ends it
        before the head is expected to start. An unknown start (inf) exempts nobody: the GPUs a gang waits for
        stay its own as they free, so it cannot starve."""
        if not self.reserved or job.id == self.head:
            return True
        limit = job.spec.time_limit_s
        return limit is not None and self.shadow < math.inf and self.now + limit <= self.shadow

    def busy_reserved(self) -> set[str]:
        """Busy devices and the head's reserved ones: what a job that is not `exempt` may not use."""
        version, got = self._busy_reserved
        if version != self.version:
            got = self.busy | self.reserved
            self._busy_reserved = (self.version, got)
        return got

    def reserve(self, job: Job) -> None:
        """Make `job` the head: reserve the devices where it can start soonest, by the running jobs' predicted ends
        (`FleetView.ends`; unknown: never), devices being released counting as free now and the round's starts
        ending at their time limits. Ties go to the node the fragmentation-aware best fit prefers. A job that no
        node could ever hold reserves nothing."""
        self._reserving = False
        self.head = job.id
        self.head_reason = _RESOURCES
        global _RESERVED
        # the last round's reservation, while what it was made of is the same (a busy queue's usual round: the
        # same head, running jobs, busy devices and predicted ends; searching the nodes again costs ~5 ms)
        sig = (job, self.fleet.nodes, self.fleet.running, frozenset(self.busy), frozenset(self.releasing),
               dict(self._started), dict(self.fleet.ends), self.fleet.labels, self.fleet.absent_users)
        last_sig, last = _RESERVED
        if last is not None and last_sig == sig and last[0] > self.now:
            self.shadow, self.reserved, self.head_reason = last
            self.version += 1
            return
        _RESERVED = (sig, None)
        res = job.spec.resources
        now, busy, g = self.now, self.busy, res.gpus
        ends, inf = self.fleet.ends, math.inf
        at: dict[str, float] = {}
        for r in self.fleet.running:
            at.update(dict.fromkeys(r.devices, ends.get(r.id, inf)))
        at.update(self._started)
        at.update(dict.fromkeys(self.releasing, now))
        free = self._free
        found: list[tuple[float, tuple[int, int, int], int, Placement]] = []
        best: tuple[float, tuple[int, int, int]] = (inf, (inf, inf, inf))  # type: ignore[assignment]
        one = res.nodes == 1
        candidates = self.nodes_for(job)
        waits_for = self._data_wait_node.get(job.id)
        if waits_for is not None:
            # a head waiting for a node holding its data is reserved for there, where it chose to start
            candidates = [n for n in candidates if n.name == waits_for]
        for idx, node in enumerate(candidates):
            elig = self.eligible(node, res)
            if len(elig) < g:
                continue
            when = sorted((at.get(u, inf) if u in busy else now, u) for u in elig)
            frag = fragmentation_key(self.link_of(node), len(node.devices), free[node.name], g)
            for k in range(g - 1, len(when)):
                t = when[k][0]
                if one and (t, frag) >= best:
                    break  # (one node: no better than one found already, and the topology engine costs)
                if k + 1 < len(when) and when[k + 1][0] <= t:
                    continue  # all the devices that free at t together
                p = self.fit(node, res, (), among=frozenset(u for _t, u in when[:k + 1]))
                if p is not None:
                    found.append((t, frag, idx, p))
                    best = min(best, (t, frag))
                    break
        found.sort(key=lambda f: f[:3])
        chosen = found[:res.nodes]
        placed = [f[3] for f in chosen] if len(found) >= res.nodes else []
        shadow = max((f[0] for f in chosen), default=inf) if placed else inf
        if res.nodes > 1:
            # a gang may also go whole to one Slurm node group (a share on each of N of its Slurm nodes): the
            # earliest time one takes it, if sooner (without this a gang only a group can hold was never reserved
            # for, and a stream of smaller jobs could keep it waiting for ever)
            for node in self.nodes_for(job):
                if node.executor != "slurm":
                    continue
                when_of = {u: at.get(u, inf) if u in busy else now for u in self.eligible(node, res)}
                for t in sorted(set(when_of.values())):
                    if t >= shadow or t == inf:
                        break
                    whole = _gang_on_group(self, node, res, frozenset(u for u, w in when_of.items() if w > t))
                    if whole is not None:
                        shadow, placed = t, list(whole)
                        break
        if not placed:
            return
        self.shadow = shadow
        self.reserved = frozenset(u for p in placed for u in p.devices)
        self.version += 1
        if self.shadow < inf:
            # (with no known start it says Resources, as squeue does for the job a reservation is for)
            nodes = ", ".join(dict.fromkeys(p.node for p in placed))
            self.head_reason = f"{_RESOURCES} (reserved on {nodes} from {_minute(self.shadow)})"
        _RESERVED = (sig, (self.shadow, self.reserved, self.head_reason))

    def wait(self, job_id: int, reason: str) -> Wait:
        """Wait(job_id, reason): last round's when it said the same (most waiting jobs wait for the same reason
        round after round, and a frozen dataclass costs a microsecond to make)."""
        w = self._last_waits.get(job_id)
        if w is None or w.reason != reason:
            w = Wait(job_id, reason)
        self.waits[job_id] = w
        return w

    def missing_user(self, job: Job) -> str | None:
        """"user X does not exist on node N" when that is why the job cannot start: it would start now on nodes
        where only its user is missing, or only such nodes could ever hold it. Else None (the usual reason)."""
        if job.user not in self.absent_anywhere:
            return None
        res = job.spec.resources
        lacking = [n for n in self.up if self.absent(n.name, job) and self.labelled(n.name, job)]
        if not lacking:
            return None
        mine = self.nodes_for(job)
        now_mine = sum(1 for n in mine if self.fit(n, res, self.busy) is not None)
        now_lacking = [n.name for n in lacking if self.fit(n, res, self.busy) is not None]
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


def host_memory_per_gpu(node: Node) -> float:
    """The node's host memory per GPU (MiB), what a job that offloads (`--offload`) prefers more of; 0 unknown."""
    if node.memory_total_mib is None:
        return 0.0
    return node.memory_total_mib / max(1, len(node.devices))


def _could_hold(node: Node, res: Resources) -> bool:
    """The node could run the request when empty (its GPUs, CPUs and memory; links are not asked)."""
    if len(eligible_devices(node, res)) < res.gpus:
        return False
    if res.cpus is not None and node.cpus is not None and res.cpus > node.cpus:
        return False
    return res.memory_mib is None or node.memory_total_mib is None or res.memory_mib <= node.memory_total_mib


# ---------------------------------------------------------------- Slurm node groups (issue 17)

_HOSTS: dict[str, tuple[tuple[object, ...], dict[str, str]]] = {}
"""Group name -> (its devices, the very tuple; device UUID -> Slurm node): `_slurm_hosts`, once per probe."""


def _slurm_hosts(node: Node) -> Mapping[str, str] | None:
    """Device UUID -> the Slurm node it is on, when `node` is a Slurm node group (`executor = "slurm"`:
    executors/slurm.py names its devices `slurm-<group>-<slurm node>-gpu<index>`); None for any other node. A
    device not named so is on an unknown Slurm node of its own ("")."""
    if node.executor != "slurm":
        return None
    hit = _HOSTS.get(node.name)
    if hit is not None and hit[0] is node.devices:
        return hit[1]
    prefix = f"slurm-{node.name}-"
    hosts: dict[str, str] = {}
    for d in node.devices:
        host, sep, index = d.uuid.removeprefix(prefix).rpartition("-gpu")
        hosts[d.uuid] = host if d.uuid.startswith(prefix) and sep and host and index.isdigit() else ""
    if len(_HOSTS) > 256:
        _HOSTS.clear()  # (groups renamed over a long life: never more than the fleet's)
    _HOSTS[node.name] = (node.devices, hosts)
    return hosts


def _per_slurm_node(devices: Iterable[str], hosts: Mapping[str, str]) -> dict[str, list[str]]:
    """`devices` by the Slurm node they are on, in the order given."""
    out: dict[str, list[str]] = {}
    for u in devices:
        out.setdefault(hosts.get(u, ""), []).append(u)
    return out


def _by_slurm_node(free: Sequence[str], hosts: Mapping[str, str], need: int) -> list[list[str]]:
    """The free devices of each Slurm node with at least `need` of them, best fit first (the fewest free: a
    Slurm node left whole stays for a larger job), then by name."""
    parts = _per_slurm_node(free, hosts)
    return [parts[h] for h in sorted((h for h, p in parts.items() if len(p) >= need), key=lambda h: (len(parts[h]), h))]


def _slurm_node_count(node: Node) -> int:
    """How many Slurm nodes of a group hsched knows (those with GPUs; at least one)."""
    hosts = _slurm_hosts(node)
    return max(1, len(set(hosts.values()))) if hosts else 1


def _gang_on_group(st: _RoundState, node: Node, res: Resources, busy: Collection[str]) -> tuple[Placement, ...] | None:
    """A gang whole on one Slurm node group: `res.nodes` placements on the group, each on another of its Slurm
    nodes (what `sbatch --nodes=N --gpus-per-node=G` asks Slurm for; Slurm still picks which), or None. CPUs and
    memory count once per share, as on distinct nodes."""
    n = res.nodes
    if res.cpus and node.cpus is not None and st.cpus_used.get(node.name, 0) + n * res.cpus > node.cpus:
        return None
    if (res.memory_mib and node.memory_total_mib is not None
            and st.memory_used.get(node.name, 0) + n * res.memory_mib > node.memory_total_mib):
        return None
    share = replace(res, nodes=1)
    if res.gpus == 0:
        p = st.fit(node, share, busy)
        return None if p is None else (p,) * n
    hosts = _slurm_hosts(node) or {}
    free = [u for u in st.eligible(node, res) if u not in busy]
    out: list[Placement] = []
    for part in _by_slurm_node(free, hosts, res.gpus):
        p = st.fit(node, share, busy, among=frozenset(part))
        if p is not None:
            out.append(p)
            if len(out) == n:
                return tuple(out)
    return None


PREFETCH_JOBS = 8
"""How many waiting jobs with data, in queue order, a round looks ahead for (the ones that start next)."""
PREFETCH_LOOKAHEAD = 64
"""How many waiting jobs, in queue order, are given the GPUs they would take first, before the jobs with data behind
them are: a copy to a node a job ahead of it will take is a copy wasted."""


def prefetch_targets(fleet: FleetView, queue: Sequence[Job], now: float, horizon_s: float,
                     skip: Collection[int] = (), *, served: bool = False) -> list[tuple[int, str, tuple[str, ...]]]:
    """(job, node, datasets to copy there) for the first PREFETCH_JOBS waiting jobs with data (queue order): the node
    where each could compute soonest (predicted free time, or the copy's end when that is later: a copy started now
    runs while the job waits) when it lacks the data and the job is predicted to start there within `horizon_s` plus
    the copy's own time (a long copy starts earlier). Not when waiting for a node that holds the data is as good
    (`choose_wait`): that node is where it goes. The waiting jobs ahead of it (up to PREFETCH_LOOKAHEAD) are given
    first the devices they would take soonest, held for as long as nobody knows (their durations are not known
    here): a node a job ahead will take is not where this one starts. `served`: `queue` is in the order the round
    served it (the policy's: fair share, attained service), else it is put in QoS, priority and submit order. Pure:
    the controller starts the copies (hsched.controller.data)."""
    if not fleet.data_at:
        return []
    st = _RoundState(fleet, default_chooser(), now)
    out: list[tuple[int, str, tuple[str, ...]]] = []
    taken: dict[str, float] = {}
    """Devices the jobs ahead are predicted to take (held for ever, as far as this forecast knows)."""
    looked = 0
    ahead = [j for j in queue if j.id not in skip]
    for n, job in enumerate(ahead if served else order(ahead)):
        if looked >= PREFETCH_JOBS or n >= PREFETCH_LOOKAHEAD:
            break
        res = job.spec.resources
        if res.nodes != 1 or not res.gpus or res.shared:
            continue
        data = bool(job.spec.data)
        best: tuple[float, float, str] | None = None
        holder: float | None = None
        for node in st.nodes_for(job):
            eta = st.free_in(node, job, taken)
            if eta is None:
                continue
            c = st.data_copy_s(job, node.name) if data else 0.0
            if c == 0.0:
                holder = eta if holder is None else min(holder, eta)
            if math.isinf(c):
                continue
            cand = (max(eta, c), c, node.name)
            if best is None or cand < best:
                best = cand
        if best is None:
            continue
        _start_s, copy_s, node_name = best
        node = st.by_name[node_name]
        eta = st.free_in(node, job, taken) or 0.0
        # the devices it would take there, first to free: the jobs behind it do not count on them
        taken.update(dict.fromkeys(st.soonest_devices(node, job, taken), math.inf))
        if not data:
            continue
        looked += 1
        if copy_s == 0.0 or choose_wait(copy_s, holder) or eta > horizon_s + copy_s:
            continue  # its data is where it starts soonest, or waiting for a holder is as good, or not soon
        at = fleet.data_at
        lacking = tuple(d for d in job.spec.data if d in at and node_name not in at[d])
        if lacking:
            out.append((job.id, node_name, lacking))
    return out
