"""Eligibility: which nodes and devices a job may use at all, and why none could ever hold it.

A node is the job's when its labels satisfy the job's `--constraint` (hsched.spec.constraints) and its user exists there
(`FleetView.absent_users`, lab mode); a device when its model is one the request names (`--gpu-type`, settings
aliases resolved) and its memory is enough. `unsatisfiable` refuses at submit time what no node of the fleet could
ever run, naming the resource and the fix. `Eligible` is the round's index of these answers (once per constraint,
user and request shape), filling the ledger's hooks (`nodes_for`, `eligible`). Pure: no I/O.
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from hsched.model import DEVICE_FIXED, Interconnect, Job, Node, NodeState, Placement, Resources, workload_of
from hsched.sched.cache import RoundCache
from hsched.sched.fleet import DeviceChooser, FleetView, gpu_size, size_text
from hsched.sched.state import PRIORITY, RESOURCES, RoundState, hosts_of, per_host
from hsched.spec.constraints import Constraint, parse_constraint
from hsched.topo.models import lookup_model
from hsched.topo.place import place_on_node

NodesKey = tuple[str, str]
"""What decides which nodes a job may use: its constraint's text, and its user where that user is absent from
some node ("" otherwise: every such user sees the same nodes)."""


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


def resolved(job: Job, aliases: Mapping[str, Sequence[str]]) -> Job:
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
        return (f"no node has {size_text(res.memory_mib)} of memory (largest: {size_text(max(mems))}); "
                "lower --mem")
    cpus = [n.cpus for n in nodes if n.cpus is not None]
    if res.cpus is not None and cpus and res.cpus > max(cpus):
        return f"no node has {res.cpus} CPUs (largest: {max(cpus)}); lower --cpus"
    gpu_mem = [d.memory_total_mib for n in nodes for d in n.devices if d.memory_total_mib is not None]
    if res.gpu_memory_mib is not None and gpu_mem and res.gpu_memory_mib > max(gpu_mem):
        return (f"no GPU has {gpu_size(res.gpu_memory_mib)} of memory (largest: {gpu_size(max(gpu_mem))}); "
                "lower --gpu-memory")
    # a gang's nodes are distinct nodes of the fleet, or Slurm nodes of one Slurm node group (never both: one
    # sbatch starts all its ranks); a group's share of any job is on one of its Slurm nodes
    groups = [n for n in nodes if n.executor == "slurm"] if res.nodes > 1 else []
    room = max([len(nodes) - len(groups), *(host_count(g) for g in groups)])
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
        hosts = hosts_of(n)
        # a Slurm group: each of its Slurm nodes is what a node's share of a job must fit on
        parts = [elig] if hosts is None else list(per_host(elig, hosts).values()) or [[]]
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


def inference_speed(model: str) -> float:
    """A GPU model's relative inference throughput (hsched.topo.models; V100 = 1); an unknown model counts as fast
    (1000), so a known slow GPU is preferred to it for inference."""
    m = lookup_model(model)
    return m.inference if m is not None else 1000.0


def slowest_for_inference(types: tuple[str, ...]) -> tuple[str, ...]:
    """Of the GPU types a job may use, those slowest for inference (issue 30): what the plan offers an inference job
    first, leaving the fastest GPUs to training; a job the plan cannot start there is placed by backfill, on the
    slowest adequate node that has room (`Eligible.for_inference`)."""
    if len(types) < 2:
        return types
    low = min(map(inference_speed, types))
    return tuple(t for t in types if inference_speed(t) == low)


def host_memory_per_gpu(node: Node) -> float:
    """The node's host memory per GPU (MiB), what a job that offloads (`--offload`) prefers more of; 0 unknown."""
    if node.memory_total_mib is None:
        return 0.0
    return node.memory_total_mib / max(1, len(node.devices))


def could_hold(node: Node, res: Resources) -> bool:
    """The node could run the request when empty (its GPUs, CPUs and memory; links are not asked)."""
    if len(eligible_devices(node, res)) < res.gpus:
        return False
    if res.cpus is not None and node.cpus is not None and res.cpus > node.cpus:
        return False
    return res.memory_mib is None or node.memory_total_mib is None or res.memory_mib <= node.memory_total_mib


def host_count(node: Node) -> int:
    """How many hosts (Slurm nodes) of a group hsched knows (those with GPUs; at least one)."""
    hosts = hosts_of(node)
    return max(1, len(set(hosts.values()))) if hosts else 1


def fixed(nodes: Sequence[Node]) -> tuple[object, ...]:
    """What `where` and `eligible` answers depend on of the nodes: not a node's message, nor its devices' readings
    (`DEVICE_FIXED`), which a heartbeat renews every few seconds."""
    return tuple((n.name, n.executor, n.state, n.cpus, n.memory_total_mib, n.host, tuple(map(DEVICE_FIXED, n.devices)))
                 for n in nodes)


class Eligible(RoundState):
    """The round's index of who may use what: the nodes each (constraint, user) may use, the devices each request
    shape may use on each node; and the waiting reasons that follow from it (a missing user, nodes not up)."""

    def __init__(self, fleet: FleetView, choose: DeviceChooser, now: float, cache: RoundCache | None = None) -> None:
        super().__init__(fleet, choose, now, cache)
        self.absent_anywhere = frozenset().union(*fleet.absent_users.values()) if fleet.absent_users else frozenset()
        """The users absent from some node (lab mode): only their jobs see fewer nodes than their constraint's."""
        self._constraints: dict[str, Constraint | None] = {}
        self._nodes: dict[NodesKey, list[Node]] = {}
        self._by_constraint: dict[str, list[Node]] = {}
        self._ranked: dict[NodesKey, list[Node]] = {}
        self._for_inference: dict[tuple[NodesKey, tuple[str, ...], int | None], list[Node]] = {}
        self._eligible: dict[tuple[str, tuple[str, ...], int | None], tuple[str, ...]] = {}
        # the last round's `where` per job, while the nodes' names, states, devices and labels and the absent users
        # are the same objects' (a fleet view is rebuilt each round, but from the very nodes while none changed),
        # or the same as `where` sees them (`fixed`: the live controller's nodes are new each round, their devices
        # with a heartbeat's new readings: without this, a churning queue's 2,000 waiting jobs made their keys
        # afresh every round)
        self._fixed: tuple[object, ...] | None = None
        last_sig, last_where = self.cache.where
        same = (len(last_sig) == 4 and isinstance(nodes := last_sig[0], tuple) and len(nodes) == len(fleet.nodes)
                and last_sig[2] == fleet.labels and last_sig[3] == fleet.absent_users
                and (all(map(operator.is_, nodes, fleet.nodes))
                     or (last_sig[1] if last_sig[1] is not None else fixed(nodes)) == self.nodes_fixed()))
        self._where_last = last_where if same else {}
        # (and its eligible devices per node and request shape: they depend on the nodes' devices alone; 175 a round
        # made afresh were ~0.4 ms of a churning round, issue 33)
        self._eligible = dict(self.cache.eligible) if same else {}
        # (and its answers per request shape: a churning round's arrivals are of shapes asked before, and each shape
        # made afresh looked through every node, ~0.15 ms each on 64)
        self._where = dict(self.cache.where_shapes) if same else {}
        self._where_kept: dict[int, tuple[Job, frozenset[str]]] = {}
        self.blocked_ahead = False
        """A job served earlier in this round waits: the ones after it wait behind it (`why`)."""
        self._wanted: set[str] = set()
        """The up nodes the jobs that waited so far in this round could use: a job that wants none of them waits for
        resources, not behind them (`why`)."""
        self._added: set[int] = set()
        self._behind: set[int] = set()
        self._covered: set[int] = set()
        """The `where` objects (by id) all of whose nodes `_wanted` holds (`behind`)."""

    def nodes_fixed(self) -> tuple[object, ...]:
        """`fixed(fleet.nodes)`, made once a round."""
        if self._fixed is None:
            self._fixed = fixed(self.fleet.nodes)
        return self._fixed

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
        if workload_of(job.spec) == "inference":
            got = self.for_inference(job, got)
        home = self.fleet.prefer.get(job.id)
        if home is not None and any(n.name == home for n in got):
            return [n for n in got if n.name == home] + [n for n in got if n.name != home]
        return got

    def for_inference(self, job: Job, nodes: list[Node]) -> list[Node]:
        """Issue 30: an inference job (a service's replica) takes the slowest adequate GPUs first, so that the
        fastest stay for training: `nodes` ordered by the inference speed (hsched.topo.models) of the slowest
        device on each that fits the request (its GPU types and memory); nodes with none that fits last; the order
        before kept among equals."""
        res = job.spec.resources
        key = (self.nodes_key(job), res.gpu_types, res.gpu_memory_mib)
        got = self._for_inference.get(key)
        if got is None:
            def speed(n: Node) -> float:
                fits = set(self.eligible(n, res))
                speeds = [inference_speed(d.model) for d in n.devices if d.uuid in fits]
                return min(speeds) if speeds else float("inf")

            got = self._for_inference[key] = sorted(nodes, key=speed)
        return got

    def eligible(self, node: Node, res: Resources) -> tuple[str, ...]:
        """`eligible_devices`, once per node and request shape (GPU types, GPU memory) in a round."""
        key = (node.name, res.gpu_types, res.gpu_memory_mib)
        got = self._eligible.get(key)
        if got is None:
            got = self._eligible[key] = tuple(eligible_devices(node, res))
        return got

    def fit_free(self, node: Node, job: Job, free: Sequence[str], stoppable: Collection[str] = ()) -> Placement | None:
        """`job` on `node`, using only the given free devices (the core's placer asks this); `stoppable`: busy
        devices among them it may have as well (those of running jobs the plan may time-share away)."""
        if not self.labelled(node.name, job) or self.absent(node.name, job):
            return None
        return self.fit(node, job.spec.resources, self.busy, frozenset(free), freed=stoppable)

    def why(self, job: Job, reason: str | None) -> str:
        """Why a job that cannot start waits, as squeue says it, and count it as waiting ahead of the rest:
        the head's reservation; `ReqNodeNotAvail` when only nodes that are not up could ever hold it; `Priority`
        only when a job served before it waits for some of the same nodes (else `Resources`: nobody is ahead of
        it for what it needs); `reason`: the policy's (Resources or Priority), else Priority after any wait."""
        where = self.where(job)
        if not where and (down := self.unavailable(job)):
            why = f"ReqNodeNotAvail, UnavailableNodes:{','.join(down)}"
        elif job.id in self.wait_reasons:
            why = self.wait_reasons[job.id]
        elif job.id == self.head:
            why = self.head_reason
        else:
            why = reason or (PRIORITY if self.blocked_ahead else RESOURCES)
            if why == PRIORITY and id(where) not in self._behind:
                if self._wanted.isdisjoint(where):
                    why = RESOURCES
                else:
                    self._behind.add(id(where))  # (`_wanted` only grows: it stays behind someone)
        self.blocked_ahead = True
        if id(where) not in self._added:
            # (a shape's node set is one object for the round: added once, not once per waiting job)
            self._added.add(id(where))
            self._wanted.update(where)
        return why

    def behind(self, job: Job, reason: str | None) -> str | None:
        """`why`, in fewer steps, for a job in the tail of a busy queue; None where those steps do not hold (`why`
        then). Once a job served earlier waits (`blocked_ahead`) and the nodes this job could ever use (the last
        round's `where`, this very job's) are all among those wanted by the jobs that waited so far, `why`'s answer
        is the job's own wait reason (locality's), else the policy's `reason`, else Priority; and it changes nothing
        but the `where` it keeps for the next round. (`why` over a churning round's 2,000 waiting jobs was ~3.5 ms,
        issue 33.) Not the head: its reason is the reservation's."""
        if not self.blocked_ahead:
            return None
        jid = job.id
        hit = self._where_last.get(jid)
        if hit is None or hit[0] is not job or jid == self.head:
            return None
        where = hit[1]
        if id(where) not in self._covered:
            if not where or not self._wanted.issuperset(where):
                return None
            # (`_wanted` only grows, and a shape's node set is one object for the round: covered once, covered for
            # the rest of it)
            self._covered.add(id(where))
        self._where_kept[jid] = hit
        own = self.wait_reasons.get(jid)
        return own if own is not None else reason or PRIORITY

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
                                               if len(self.eligible(n, res)) >= res.gpus and could_hold(n, res))
        self._where_kept[job.id] = (job, got)
        return got

    def keep_where(self) -> None:
        """This round's `where` answers for the next round (only the jobs asked this round: ended ones do not
        pile up)."""
        # (with the nodes as `fixed` saw them, when it was asked: the next round compares with that, not made again)
        self.cache.where = ((self.fleet.nodes, self._fixed, self.fleet.labels, self.fleet.absent_users),
                            self._where_kept)
        self.cache.eligible = self._eligible
        self.cache.where_shapes = self._where

    def unavailable(self, job: Job) -> list[str]:
        """The nodes that are not up (down, drained, unreachable) but could hold the job, when no up one could."""
        c = self.constraint(job.spec.resources)
        labels, absent, res = self.fleet.labels, self.fleet.absent_users, job.spec.resources
        return sorted(n.name for n in self.fleet.nodes
                      if n.state is not NodeState.UP and (c is None or c.satisfied_by(labels.get(n.name, frozenset())))
                      and job.user not in absent.get(n.name, frozenset()) and could_hold(n, res))

    # ------------------------------------------------------------------ the head's reservation (EASY backfill)


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
            ever_mine = sum(1 for n in mine if could_hold(n, res))
            ever_lacking = [n.name for n in lacking if could_hold(n, res)]
            if not ever_lacking or ever_mine >= res.nodes or ever_mine + len(ever_lacking) < res.nodes:
                return None
            names = ever_lacking
        where = f"node {names[0]}" if len(names) == 1 else f"nodes {', '.join(names)}"
        return f"user {job.user} does not exist on {where}"

