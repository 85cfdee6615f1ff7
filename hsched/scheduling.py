"""The scheduling seam: a pure function from (fleet, queue, now) to decisions.

For now: QoS class, then priority, then submit order; first fit, with the best-connected devices of a
node chosen by the topology placement engine when it knows the node's links. The scheduling-core package
(hsched.sched) plugs in behind the same signature.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from hsched.live_policy import Running, core_round
from hsched.model import Interconnect, Job, Node, NodeState, Placement, Resources

QOS_RANK = {"prod": 0, "normal": 1, "scavenger": 2}


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
    preempts: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """QoS class -> the classes it may preempt."""
    policy: str | None = None
    """A scheduling-core policy (hsched.sched) deciding order and GPU types; None: QoS/priority/FIFO."""
    prefer: Mapping[int, str] = field(default_factory=dict)
    """Job id -> the node holding its checkpoint: tried first, so a resumed job avoids the copy when it can."""


@dataclass(frozen=True, slots=True)
class Start:
    job_id: int
    placements: tuple[Placement, ...]


@dataclass(frozen=True, slots=True)
class Wait:
    job_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class Preempt:
    """Stop these running jobs (checkpoint signal, grace, escalation) so `job_id` can start."""

    job_id: int
    victims: tuple[int, ...]
    node: str
    why: str


Decision = Start | Wait | Preempt
DeviceChooser = Callable[[Node, Sequence[str], Resources], "Chosen | None"]


@dataclass(frozen=True, slots=True)
class Chosen:
    devices: tuple[str, ...]
    explanation: str
    cpus: tuple[int, ...] = ()


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


def _has_nvlink_set(node: Node, uuids: Sequence[str], k: int) -> bool:
    """Some k of these devices are pairwise NVLinked (a clique in the NV# graph)."""
    if k <= 1:
        return True
    nv = {(lk.a, lk.b) for lk in node.links if lk.kind.upper().startswith(("NV", "XGMI"))}
    adj = {u: {b for a, b in nv if a == u} | {a for a, b in nv if b == u} for u in uuids}

    def grow(clique: list[str], cands: list[str]) -> bool:
        if len(clique) == k:
            return True
        for i, c in enumerate(cands):
            if all(c in adj[x] for x in clique) and grow([*clique, c], cands[i + 1:]):
                return True
        return False

    return grow([], list(uuids))


def unsatisfiable(res: Resources, nodes: Sequence[Node]) -> str | None:
    """Why no node of the fleet could ever run this request (even empty), or None if some could."""
    if not nodes:
        return "the fleet has no nodes; add one to the fleet file"
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
        if res.interconnect is Interconnect.NVLINK and not _has_nvlink_set(n, elig, res.gpus):
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
        return (f"needs {res.nodes} nodes each with {what}, but only {len(fitting)} node(s) of the fleet qualify; "
                "lower --nodes/--gpus or add nodes")
    return (f"needs {what} on one node, but no node of the fleet has that (the most any node offers is {best}); "
            "lower --gpus, change --gpu-type or add a node")


def topology_chooser(node: Node, free: Sequence[str], res: Resources) -> Chosen | None:
    """The topology placement engine: strongest weakest link, most NVLinks, fewest NUMA nodes, least
    fragmentation; exact up to 16 devices; CPU cores from the NUMA nodes local to the chosen devices."""
    from hsched.topo.place import place_on_node

    result = place_on_node(node, res.gpus, free, res)
    if result is None:
        return None
    return Chosen(tuple(result.devices), result.explanation, tuple(result.cpus))


def default_chooser() -> DeviceChooser:
    return topology_chooser


def order(queue: Sequence[Job]) -> list[Job]:
    return sorted(queue, key=lambda j: (QOS_RANK.get(j.spec.qos, 1), -j.spec.priority, j.submit_time, j.id))


def _fit(node: Node, res: Resources, busy: set[str], cpus_used: Mapping[str, int],
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


def _victims(job: Job, node: Node, fleet: FleetView, busy: set[str], cpus_used: Mapping[str, int],
             choose: DeviceChooser, taken: set[int]) -> list[Running] | None:
    """The fewest, least important running jobs on `node` whose devices would let `job` start there."""
    allowed = fleet.preempts.get(job.spec.qos, frozenset())
    cands = [r for r in fleet.running
             if r.qos in allowed and r.id not in taken and any(p.node == node.name for p in r.placements)
             and len(r.placements) == 1]
    # least important first: lowest class, lowest priority, most recently started (least work lost)
    cands.sort(key=lambda r: (-QOS_RANK.get(r.qos, 1), r.priority, -r.started))
    chosen: list[Running] = []
    freed: set[str] = set()
    for r in cands:
        chosen.append(r)
        freed.update(r.devices)
        if _fit(node, job.spec.resources, busy - freed, cpus_used, choose) is not None:
            break
    else:
        return None
    # drop victims that turned out unnecessary (the search added them greedily)
    for r in list(chosen):
        rest = [x for x in chosen if x is not r]
        rest_freed = {u for x in rest for u in x.devices}
        if rest and _fit(node, job.spec.resources, busy - rest_freed, cpus_used, choose) is not None:
            chosen = rest
    return chosen


def schedule(fleet: FleetView, queue: Sequence[Job], now: float,
             chooser: DeviceChooser | None = None) -> list[Decision]:
    """One live round. With a policy (the default), the scheduling core's round decides which pending GPU
    jobs start and on which servers (the simulator's very code); without, QoS class, priority and submit
    order with first fit. Then, for every job still waiting, in the same order: a gap it fits (backfill),
    devices being released to it, or QoS preemption of less important running jobs. Gangs (nodes > 1) are
    all-or-nothing; devices inside a node are chosen by the topology engine.
    """
    choose = chooser or default_chooser()
    st = _RoundState(fleet, choose)
    decisions: list[Decision] = []
    core_waiting: Mapping[int, str] = {}
    by_id = {j.id: j for j in queue}
    if fleet.policy:
        gpu_jobs = [j for j in queue if j.spec.resources.gpus > 0]
        held_by_running = {u for r in fleet.running for u in r.devices}

        def fit(node: Node, job: Job, free: Sequence[str]) -> Placement | None:
            others = {d.uuid for d in node.devices} - set(free)
            return _fit(node, job.spec.resources, st.busy | others, st.cpus_used, choose)

        core = core_round(fleet.policy, fleet.nodes, gpu_jobs, fleet.running,
                          frozenset(st.busy - held_by_running), fit, now, prefer=fleet.prefer)
        for job_id, placements in core.starts:
            if st.take(by_id[job_id], placements):
                decisions.append(Start(job_id, placements))
        core_waiting = core.waiting
        started = {d.job_id for d in decisions}
        cpu_jobs = [j for j in order(queue) if j.spec.resources.gpus == 0]
        rest = [by_id[i] for i in core.order if i not in started] + cpu_jobs
    else:
        rest = order(queue)
    for job in rest:
        decisions.append(st.settle(job, core_waiting.get(job.id)))
    return decisions


class _RoundState:
    """Devices and CPUs handed out so far in this round, and the fallbacks for a job that did not start."""

    def __init__(self, fleet: FleetView, choose: DeviceChooser) -> None:
        self.fleet = fleet
        self.choose = choose
        self.busy = set(fleet.busy)
        self.cpus_used = dict(fleet.cpus_used)
        self.releasing = set(fleet.releasing)
        self.up = [n for n in fleet.nodes if n.state is NodeState.UP]
        self.taken: set[int] = set()
        self.blocked_ahead = False

    def take(self, job: Job, placements: Sequence[Placement]) -> bool:
        res = job.spec.resources
        for p in placements:
            node = next((n for n in self.up if n.name == p.node), None)
            if node is None or any(u in self.busy for u in p.devices):
                return False
            if res.cpus and node.cpus is not None and self.cpus_used.get(p.node, 0) + res.cpus > node.cpus:
                return False
        for p in placements:
            self.busy.update(p.devices)
            if res.cpus:
                self.cpus_used[p.node] = self.cpus_used.get(p.node, 0) + res.cpus
        return True

    def settle(self, job: Job, reason: str | None) -> Decision:
        res = job.spec.resources
        fleet, choose = self.fleet, self.choose
        placements: list[Placement] = []
        home = self.fleet.prefer.get(job.id)
        for node in sorted(self.up, key=lambda n: n.name != home):
            if len(placements) == res.nodes:
                break
            p = _fit(node, res, self.busy, self.cpus_used, choose)
            if p is not None:
                placements.append(p)
        if len(placements) == res.nodes and self.take(job, placements):
            return Start(job.id, tuple(placements))
        if res.nodes == 1 and self.releasing:
            # devices being released (preemption or cancel under way) may be this job's soon
            for n in self.up:
                claim = _fit(n, res, self.busy - self.releasing, self.cpus_used, choose)
                if claim is not None:
                    self.busy.update(claim.devices)
                    self.releasing.difference_update(claim.devices)
                    self.blocked_ahead = True
                    return Wait(job.id, "Preempting")
        if res.nodes == 1 and fleet.preempts.get(job.spec.qos):
            best: tuple[int, int, Node, list[Running]] | None = None
            for node in self.up:
                victims = _victims(job, node, fleet, self.busy, self.cpus_used, choose, self.taken)
                if victims is not None:
                    key = (len(victims), sum(len(v.devices) for v in victims))
                    if best is None or key < best[:2]:
                        best = (*key, node, victims)
            if best is not None:
                _, _, node, victims = best
                self.taken.update(v.id for v in victims)
                freed = {u for v in victims for u in v.devices}
                claim = _fit(node, res, self.busy - freed, self.cpus_used, choose)
                if claim is not None:
                    self.busy.update(claim.devices)
                names = ", ".join(f"{v.id} ({v.qos})" for v in victims)
                self.blocked_ahead = True
                return Preempt(job.id, tuple(v.id for v in victims), node.name,
                               f"job {job.id} ({job.spec.qos}) needs {node.name}: preempting {names}")
        why = reason or ("Priority" if self.blocked_ahead else "Resources")
        self.blocked_ahead = True
        return Wait(job.id, why)
