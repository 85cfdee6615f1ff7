"""Backfill and the fallbacks of a job the plan did not start: free devices now (the fragmentation-aware best fit,
the node holding its checkpoint first; off the head's reserved devices unless it ends before the head starts),
devices being released, QoS victims (hsched.sched.stages.preemption), else a Wait with its reason as squeue says it.
`Round` is the whole round's state: every stage's part of it. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hsched.model import Job, Node, Placement
from hsched.sched.cache import RoundCache
from hsched.sched.fleet import Decision, DeviceChooser, FleetView, Launch, Wait
from hsched.sched.placement import fragmentation_key
from hsched.sched.stages.eligibility import host_memory_per_gpu
from hsched.sched.stages.fabric import gang_on_fabric, on_fabric
from hsched.sched.stages.groups import gang_on_group
from hsched.sched.stages.reservation import Reserving


class Round(Reserving):
    """The round's state with every stage's part (the ledger and index, eligibility, locality, sharing, preemption,
    the reservation) and the backfill that settles each job the plan did not start."""

    def __init__(self, fleet: FleetView, choose: DeviceChooser, now: float, cache: RoundCache | None = None) -> None:
        super().__init__(fleet, choose, now, cache)
        # no QoS caps and no absent users: a job's only ways to go are free devices, released ones and victims
        self.plain = not fleet.limits and not self.absent_anywhere

    def start_now(self, job: Job) -> tuple[Placement, ...] | None:
        """Placements for the job on free devices now (one per node of a gang), or None."""
        res = job.spec.resources
        if res.nodes >= 1 and res.gpus > self.max_free():
            return None  # no node has that many devices free: nothing to search
        exempt = self.exempt(job)
        if not exempt and res.nodes >= 1 and res.gpus > self.max_open():
            # the free devices are the head's (EASY backfill holds them for it) and this job may not end before it
            # starts: a churning fleet's usual state, where the ~500 jobs settled before the fleet is quiet each
            # made a search key to find their search had failed
            return None
        # whether enough nodes fit does not depend on the order they are tried in, only which ones are chosen
        # (with nodes held for jobs waiting for their data, what a job may take there depends on its time limit)
        key = ("now", res, self.nodes_key(job), exempt, job.spec.time_limit_s if self.data_held else None)
        if self.missed(key):
            return None
        placements: list[Placement] = []
        free = self.free
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
        if res.nodes > 1 and on_fabric(self.fleet.fabric, nodes):
            # the network between nodes is known: the nodes of least modelled cost (hsched.sched.stages.fabric)
            eligible = self.eligible
            chosen = gang_on_fabric(
                self.fleet.fabric, res.nodes, res.gpus, nodes,
                lambda n, among: self.fit(n, res, busy, among),
                lambda n: [u for u in eligible(n, res) if u not in busy],
                (lambda p: self.leaves_data_room(job, (p,))) if self.data_held else None)
            if chosen is not None:
                return chosen
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
                whole = gang_on_group(self, node, res, busy)
                if whole is not None:
                    return whole
                continue
            p = self.fit(node, res, busy)
            if p is not None and (not self.data_held or self.leaves_data_room(job, (p,))):
                placements.append(p)
        if len(placements) == res.nodes:
            return tuple(placements)
        for node in later:
            whole = gang_on_group(self, node, res, busy)
            if whole is not None:
                return whole
        self.miss(key)
        return None


    def settle_all(self, jobs: Iterable[Job], reasons: Mapping[int, str]) -> list[Decision]:
        """`settle` each job in turn. While nothing is free or being released (`quiet`), a job that needs GPUs and
        may preempt no class that runs just waits: `settle` would reach the same Wait through every search, and a
        busy fleet's queue is mostly such jobs."""
        out: list[Decision] = []
        append = out.append
        preempts, classes = self.fleet.rule.qos_preempts, self.victim_classes
        # (no cap on the job's class and its user present everywhere: `settle`'s cap check and absent-user reason
        # find nothing; QoS caps on other classes, as the default settings have, leave this job's path plain)
        limits, absent = self.fleet.limits, self.absent_anywhere
        last, waits = self.last_waits, self.waits
        behind = self.behind
        # whether a class may preempt one that runs, once per class
        idle = {q: not allowed or allowed.isdisjoint(classes) for q, allowed in preempts.items()}
        version, quiet = -1, False
        chooses: frozenset[str] | None = None  # `choosable()` at this version, once asked
        for job in jobs:
            res = job.spec.resources
            if (res.gpus and res.nodes >= 1 and limits.get(job.spec.qos) is None
                    and (not absent or job.user not in absent)):
                if version != self.version:
                    version, quiet, chooses = self.version, self.quiet(), None
                qos = job.spec.qos
                releasing = bool(self.releasing)  # (quiet: nothing is)
                nobody = idle.get(qos, True)
                if not nobody and not releasing:
                    # it may preempt a class that runs: `preempt_for` still finds nobody while none of that class is
                    # free to be chosen (`choosable`, per version as there); the usual case of a busy queue
                    if chooses is None:
                        chooses = self.choosable()
                    nobody = preempts[qos].isdisjoint(chooses)
                if nobody and not releasing:
                    # Nothing is being released and the job may preempt nobody: `settle`'s claim of released
                    # devices and its QoS search find nothing, and (`plain`) no cap or absent user stops it, so it
                    # starts on free devices now or waits. Quiet (nothing free either): it waits. (A churning
                    # fleet with a GPU or two free, held for the head, is not quiet: its 2,000 waiting jobs took
                    # `settle`'s whole path, 40 % of the round.)
                    if not quiet:
                        placements = self.start_now(job)
                        if placements is not None and self.take(job, placements):
                            self.tally.add(job)
                            append(Launch(job.id, placements))
                            continue
                    jid = job.id
                    if self.reserving:
                        self.reserve(job)
                    reason = reasons.get(jid)
                    why = behind(job, reason)
                    if why is None:
                        why = self.why(job, reason)
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
        capped = self.tally.blocked(job)
        if capped is not None:
            # over a QoS cap: it neither starts nor preempts, and holds up no one behind it
            return Wait(job.id, capped)
        placements = self.start_now(job)
        if placements is not None and self.take(job, placements):
            self.tally.add(job)
            return Launch(job.id, placements)
        nodes = self.nodes_for(job)
        claimed = self.claim_releasing(job, nodes, self.exempt(job))
        if claimed is None:
            claimed = self.preempt_for(job, nodes)
        if claimed is not None:
            return claimed
        missing = self.missing_user(job)
        if missing is not None:
            return Wait(job.id, missing)
        if self.reserving and res.gpus:
            self.reserve(job)  # without a policy: the first job that waits is the most important one
        return self.wait(job.id, self.why(job, reason))

