"""Preemption: QoS classes that may stop others (`PreemptRule.qos_preempts`) claim the devices of running jobs, chosen
by `hsched.sched.preempt.Victims` exactly as the simulator chooses them; and devices being released (a preemption or
cancel under way) are claimed by the next job that fits them. Gangs never preempt. Pure: no I/O."""

from __future__ import annotations

from hsched.model import Interconnect, Job, Node, Resources
from hsched.sched.cache import RoundCache
from hsched.sched.fleet import Decision, DeviceChooser, FleetView, Running, Wait
from hsched.sched.preempt import Victims
from hsched.sched.stages.sharing import Sharing
from hsched.sched.stages.views import pending_view, victim_views
from hsched.sched.state import PREEMPTING


class Preempting(Sharing):
    """The round with QoS preemption: the running jobs QoS may preempt, indexed once on first need."""

    def __init__(self, fleet: FleetView, choose: DeviceChooser, now: float, cache: RoundCache | None = None) -> None:
        super().__init__(fleet, choose, now, cache)
        self._victims: Victims | None = None
        # the classes QoS could preempt at all this round: a waiting job whose class preempts none of them
        # never searches for victims
        self.victim_classes = frozenset(r.job.spec.qos for r in fleet.running if len(r.job.placement) == 1)
        self._choosable = (-1, frozenset[str]())
        self._by_id: dict[int, Running] | None = None
        self._shared: dict[str, frozenset[int]] | None = None

    def victims(self) -> Victims:
        """The round's QoS victims, indexed once, on first need."""
        if self._victims is None:
            self._victims = Victims(self.fleet.rule, victim_views(self.fleet.running, self.now, self.cache),
                                    shared=self._shares())
        return self._victims

    def _node_stamp(self, name: str) -> tuple[int | None, int, int]:
        """What the round placed on a server so far: its devices' free count (the round's busy devices only grow,
        `hold`), CPUs and host memory promised; `fit`'s answer there depends on nothing else the round changes."""
        return self.free.get(name), self.cpus_used.get(name, 0), self.memory_used.get(name, 0)

    def room(self, node: Node, res: Resources, busy: set[str], freed: frozenset[str]) -> bool:
        """`fit(node, res, busy, freed=freed) is not None` for a request without device constraints, by counting:
        the same CPU and host memory checks, then enough eligible devices free or freed."""
        used = self.cpus_used.get(node.name, 0)
        if res.cpus is not None and node.cpus is not None and used + res.cpus > node.cpus:
            return False
        if res.memory_mib and node.memory_total_mib is not None and (
                self.memory_used.get(node.name, 0) + res.memory_mib > node.memory_total_mib):
            return False
        free = sum(1 for u in self.eligible(node, res) if u not in busy or u in freed)
        return free >= res.gpus

    def forced(self, node: Node, res: Resources, busy: set[str], freed: frozenset[str]) -> tuple[str, ...] | None:
        """The devices `fit(node, res, busy, freed=freed)` would claim for a request without device constraints
        when it has no choice: exactly as many eligible devices free or freed as it asks (the usual claim of a storm:
        a full server, its fewest victims); None otherwise (ask `fit`). The topology engine, asked only to pick all of
        them, was ~40% of a storm's round (issue 33)."""
        if not res.gpus or not self.room(node, res, busy, freed):
            return None
        free = tuple(u for u in self.eligible(node, res) if u not in busy or u in freed)
        return free if len(free) == res.gpus else None

    def _shares(self) -> dict[str, frozenset[int]]:
        """`sharing()`, once a round: the running jobs do not change in a round (it was asked once per preemption)."""
        if self._shared is None:
            self._shared = self.sharing()
        return self._shared

    def _running_by_id(self) -> dict[int, Running]:
        if self._by_id is None:
            self._by_id = {r.id: r for r in self.fleet.running}
        return self._by_id

    def choosable(self) -> frozenset[str]:
        """The QoS classes of the running jobs still free to be chosen as victims."""
        if not self.victim_classes:
            return self.victim_classes
        version, classes = self._choosable
        if version != self.version:
            classes = self.victims().classes()
            self._choosable = (self.version, classes)
        return classes


    def claim_releasing(self, job: Job, nodes: list[Node], exempt: bool) -> Decision | None:
        """Devices being released (preemption or cancel under way) may be this job's soon (not those reserved for
        the head, unless it ends before the head starts): it claims them and waits for them (`Preempting`)."""
        res = job.spec.resources
        if res.nodes != 1 or not self.releasing or self.missed(key := ("releasing", res, self.nodes_key(job), exempt)):
            return None
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
                return Wait(job.id, PREEMPTING)
        self.miss(key)
        return None

    def preempt_for(self, job: Job, nodes: list[Node]) -> Decision | None:
        """QoS preemption: the victims `Victims` chooses for the job on one of `nodes`, claimed (a
        `Preempt`), or None."""
        res: Resources = job.spec.resources
        allowed = self.fleet.rule.qos_preempts.get(job.spec.qos)
        if (res.nodes != 1 or not allowed or allowed.isdisjoint(self.victim_classes)
                or allowed.isdisjoint(self.choosable())
                or self.missed(qkey := ("qos", res, self.nodes_key(job), job.spec.qos))):
            return None
        busy = self.busy

        # a request the topology engine cannot refuse once enough devices are free (no GPU type, memory or NVLink
        # constraint, not on a host group): the victim search counts devices and asks the engine only for the
        # winner's claim below (the engine was 60% of a storm's round, for answers the count gives)
        plain = (not res.gpu_types and not res.gpu_memory_mib and res.interconnect is Interconnect.ANY)

        def fits(name: str, freed: frozenset[str]) -> bool:
            node = self.by_name[name]
            if plain and self.hosts(node) is None:
                return self.room(node, res, busy, freed)
            return self.fit(node, res, busy, freed=freed) is not None

        # (a server's answer holds for the next job of this shape until the round places or preempts there)
        chosen = self.victims().choose(pending_view(job), [n.name for n in nodes], fits, shape=qkey,
                                       stamp=self._node_stamp)
        if chosen is not None:
            shares = self._shares()
            by_id = self._running_by_id()
            freed = frozenset(u for vid in chosen.victims for u in by_id[vid].devices
                              if u not in shares or shares[u] <= set(chosen.victims))
            node = self.by_name[chosen.node]
            devices = self.forced(node, res, busy, freed) if plain and self.hosts(node) is None else None
            if devices is None:
                claim = self.fit(node, res, busy, freed=freed)
                devices = claim.devices if claim is not None else ()
            self.hold(devices)  # the victims are taken, in any case
            self.blocked_ahead = True
            self.tally.add(job)  # its start is decided: the next job of its user counts it
            return chosen
        self.miss(qkey)
        return None
