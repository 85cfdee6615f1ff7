"""The round's ledger and index: what is free, held and taken on each node in this round, and when it frees.

`RoundState` is what every stage of a round (hsched.sched.stages) reads and writes: devices, CPUs and host memory
handed out so far, devices being released, the head's reservation (EASY backfill: `reserved`, `shadow`), the
waits given. Its `fit` places one request on one node; what may be used is asked of the hooks the stages fill:

* `eligible(node, res)`: the devices a request may use at all (eligibility: GPU models and memory);
* `parts(node, free, need)`: how a node's free devices split into sets one share of a job must fit in (a Slurm
  node group: one set per Slurm node, `Device.host`);
* `start_ok(job, placements)`: what a start must pass besides room (locality: a job waiting for the node that holds
  its data, and the room promised to it);
* `nodes_for(job)` / `ranked(job)`: the nodes a job may use, in the order it tries them (eligibility: labels,
  users).

Indexed once per round, so that a round costs about the queue plus the fleet, not their product. A search that
found nothing for one request finds nothing for the next job asking the same until devices, CPUs or victims change
hands: `version` counts those changes and `missed` remembers the version each search last failed at.

Pure: no I/O; what it keeps between rounds is in the caller's `RoundCache`.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence

from hsched.model import EndReason, Job, Node, NodeState, Placement, Resources
from hsched.sched.cache import RoundCache
from hsched.sched.fleet import DeviceChooser, FleetView, Wait
from hsched.sched.limits import Tally
from hsched.sched.servers import server_link

PREEMPTING, PRIORITY, RESOURCES = EndReason.PREEMPTING.value, EndReason.PRIORITY.value, EndReason.RESOURCES.value

def hosts_of(node: Node) -> Mapping[str, str] | None:
    """Device UUID -> the host (a Slurm node) it sits on, when `node` is a group of hosts (`executor = "slurm"`);
    None for a node that is its own host. A device with no known host is on an unknown host of its own ("")."""
    if node.executor != "slurm":
        return None
    return {d.uuid: d.host or "" for d in node.devices}


def per_host(devices: Iterable[str], hosts: Mapping[str, str]) -> dict[str, list[str]]:
    """`devices` by the host they are on, in the order given."""
    out: dict[str, list[str]] = {}
    for u in devices:
        out.setdefault(hosts.get(u, ""), []).append(u)
    return out


def by_host(free: Sequence[str], hosts: Mapping[str, str], need: int) -> list[list[str]]:
    """The free devices of each host with at least `need` of them, best fit first (the fewest free: a host left
    whole stays for a larger job), then by name."""
    parts = per_host(free, hosts)
    return [parts[h] for h in sorted((h for h, p in parts.items() if len(p) >= need), key=lambda h: (len(parts[h]), h))]


class RoundState:
    """Devices, CPUs and memory handed out so far in this round (see the module docstring)."""

    def __init__(self, fleet: FleetView, choose: DeviceChooser, now: float, cache: RoundCache | None = None) -> None:
        self.fleet = fleet
        self.choose = choose
        self.now = now
        self.cache = cache if cache is not None else RoundCache()
        self.busy = set(fleet.busy)
        self.cpus_used = dict(fleet.cpus_used)
        self.memory_used = dict(fleet.memory_used)
        self.releasing = set(fleet.releasing)
        self.up = [n for n in fleet.nodes if n.state is NodeState.UP]
        self.by_name = {n.name: n for n in self.up}
        holders = fleet.holders if fleet.holders is not None else tuple(r.job for r in fleet.running)
        self.tally = Tally(fleet.limits, holders)
        """The QoS caps (hsched.sched.limits): what each user and class holds, counted as jobs start."""
        self.version = 0
        """Bumped whenever devices, CPUs or victims are handed out: a failed search stays failed until then."""
        self._node_of = {d.uuid: n.name for n in self.up for d in n.devices}
        self.free = {n.name: sum(1 for d in n.devices if d.uuid not in self.busy) for n in self.up}
        """Free devices per up node."""
        self._max_free = (-1, 0)
        self._max_open = (-1, 0)
        self._missed: dict[tuple[object, ...], int] = {}
        self._placed: dict[tuple[str, Resources, tuple[str, ...], int, int], Placement | None] = {}
        self._hosts: dict[str, Mapping[str, str] | None] = {}
        self._links: dict[str, str] = {}
        self._quiet = (-1, False)
        self.last_waits = self.cache.waits
        self.waits: dict[int, Wait] = {}
        """This round's waits, by job: the next round's `last_waits`."""
        self.wait_reasons: dict[int, str] = {}
        """Why a job waits, when a stage knows better than "Resources" (locality: for a node holding its data)."""
        self.head: int | None = None
        """The job the round reserves GPUs for: the most important one that cannot start now (EASY backfill)."""
        self.reserved: frozenset[str] = frozenset()
        """Its devices: where it starts at `shadow`. Other jobs use them only if they end before (`exempt`)."""
        self.shadow = math.inf
        """When the head is expected to start (inf: a job holding its GPUs has no predicted end)."""
        self.head_reason = ""
        self.started: dict[str, float] = {}
        """Devices of the jobs started this round -> when they end (their time limit; inf without one)."""
        self._busy_reserved: tuple[int, set[str]] = (-1, set())

    # ------------------------------------------------------------------ hooks the stages fill

    def eligible(self, node: Node, res: Resources) -> tuple[str, ...]:
        """The node's devices the request may use at all, busy or not (eligibility narrows it)."""
        return tuple(d.uuid for d in node.devices)

    def nodes_for(self, job: Job) -> list[Node]:
        """The up nodes the job may use (eligibility narrows it)."""
        return self.up

    def start_ok(self, job: Job, placements: Sequence[Placement]) -> bool:
        """What a start must pass besides room (`take`); a stage adds its rule by extending this. (A hook method, not
        a list of bound methods on the state: those would make every round's state a reference cycle, freed only by
        the cyclic collector, outside the round, at the cost of a collection of everything it indexed.)"""
        return True

    def hosts(self, node: Node) -> Mapping[str, str] | None:
        """`hosts_of(node)`, once per node in a round."""
        if node.name not in self._hosts:
            self._hosts[node.name] = hosts_of(node)
        return self._hosts[node.name]

    # ------------------------------------------------------------------ the ledger

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
            value = max(self.free.values(), default=0)
            self._max_free = (self.version, value)
        return value

    def max_open(self) -> int:
        """The most devices free on one up node outside the head's reservation: the most a job that is not `exempt`
        may be given on a node now (`max_free` while nothing free is reserved)."""
        version, value = self._max_open
        if version != self.version:
            value = self.max_free()
            if self.reserved and value:
                busy, node_of = self.busy, self._node_of
                held: dict[str, int] = {}
                for u in self.reserved:
                    if u not in busy and (n := node_of.get(u)) is not None:
                        held[n] = held.get(n, 0) + 1
                if held:
                    value = max(f - held.get(n, 0) for n, f in self.free.items())
            self._max_open = (self.version, value)
        return value

    def hold(self, devices: Iterable[str]) -> None:
        """These devices are taken (by a start or a claim) from now on in this round."""
        for u in devices:
            if u not in self.busy:
                self.busy.add(u)
                node = self._node_of.get(u)
                if node is not None:
                    self.free[node] -= 1
        self.version += 1

    def fit(self, node: Node, res: Resources, busy: Collection[str], among: Collection[str] | None = None,
            freed: Collection[str] = ()) -> Placement | None:
        """The request on `node`, on devices not in `busy` or in `freed` (and in `among`, when given), or None.

        The device choice (the topology engine: the costly part) is asked once per node, request and free set in a
        round: QoS preemption asks the same question of every node for every waiting job of a shape.

        On a node that groups hosts (`hosts`: a Slurm node group) a node's share of a job is on one host (sbatch's
        `--gpus-per-node` is per Slurm node: GPUs of two of them would never start), and a gang is placed there
        only whole (hsched.sched.stages.groups): one share of a gang is never placed on a group here, so a gang
        never spans a group and another node (one sbatch starts all its ranks)."""
        hosts = self.hosts(node)
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
        for part in ((free,) if hosts is None else by_host(free, hosts, res.gpus)):
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

    def take(self, job: Job, placements: Sequence[Placement]) -> bool:
        """Start `job` on `placements` in the ledger, if they are still free and every start check passes."""
        res = job.spec.resources
        if not self.start_ok(job, placements):
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
            self.started.update(dict.fromkeys(p.devices, end))
            if res.cpus:
                self.cpus_used[p.node] = self.cpus_used.get(p.node, 0) + res.cpus
            if res.memory_mib:
                self.memory_used[p.node] = self.memory_used.get(p.node, 0) + res.memory_mib
        if job.id == self.head:
            # the head starts after all (on devices free now): its reservation is over
            self.reserved, self.shadow, self.head = frozenset(), math.inf, None
            self.version += 1
        return True

    def missed(self, key: tuple[object, ...]) -> bool:
        """This search failed already, and nothing changed hands since."""
        return self._missed.get(key) == self.version

    def miss(self, key: tuple[object, ...]) -> None:
        """This search failed: it fails again until something changes hands."""
        self._missed[key] = self.version

    def link_of(self, node: Node) -> str:
        got = self._links.get(node.name)
        if got is None:
            got = self._links[node.name] = server_link(node)
        return got

    # ------------------------------------------------------------------ the head's reserved devices

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

    def wait(self, job_id: int, reason: str) -> Wait:
        """Wait(job_id, reason): last round's when it said the same (most waiting jobs wait for the same reason
        round after round, and a frozen dataclass costs a microsecond to make)."""
        w = self.last_waits.get(job_id)
        if w is None or w.reason != reason:
            w = Wait(job_id, reason)
        self.waits[job_id] = w
        return w

    def running_ends(self) -> dict[str, float]:
        """Device -> when it frees: the running jobs' predicted ends (`FleetView.ends`; unknown: never), the round's
        starts at their time limits, devices being released now."""
        ends, inf = self.fleet.ends, math.inf
        at: dict[str, float] = {}
        for r in self.fleet.running:
            end = ends.get(r.job.id, inf)
            for p in r.job.placement:  # (`r.devices`, without its frozenset)
                for u in p.devices:
                    at[u] = end
        at.update(self.started)
        at.update(dict.fromkeys(self.releasing, self.now))
        return at

