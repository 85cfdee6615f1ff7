"""Data locality (issue 15): a job that names datasets starts where its data is, or waits for a node holding it
when that is as good as copying (hsched.sched.locality.choose_wait), and the copies that put waiting jobs' data
where they are predicted to start (`prefetch_targets`: the one rule, live and in the simulator). Pure: no I/O; the
controller (hsched.controller.data) and the simulator (hsched.sim.data) move the bytes."""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Protocol, TypeVar, cast

from hsched.model import Job, Node, Placement
from hsched.sched.cache import RoundCache
from hsched.sched.fleet import NO_DEVICES, DeviceChooser, FleetView, default_chooser, order, secs
from hsched.sched.locality import choose_wait, copy_seconds, leaves_room
from hsched.sched.stages.eligibility import Eligible


class Local(Eligible):
    """The round with data locality: a start on a node lacking the job's data passes `data_ok`, and a start on a
    node held for a job waiting for its data leaves that job its promised room (`leaves_data_room`); both are
    the ledger's `start_ok`."""

    def __init__(self, fleet: FleetView, choose: DeviceChooser, now: float, cache: RoundCache | None = None) -> None:
        super().__init__(fleet, choose, now, cache)
        self._copy_s: dict[tuple[tuple[str, ...], str], float] = {}
        self._running_on: dict[str, list[tuple[float, frozenset[str]]]] | None = None
        self.data_wait_node: dict[int, str] = {}
        """Job id -> the node holding its data it waits for (its reservation goes there if it is the head)."""
        self.data_held: dict[str, tuple[Job, float]] = {}
        """Node -> the job waiting for it (first in line) and when it is predicted to have room for that job (seconds
        from now): others may take its free devices only if that stays so (EASY backfill's rule)."""

    def start_ok(self, job: Job, placements: Sequence[Placement]) -> bool:
        if job.spec.data and self.fleet.data_at and not self.data_ok(job, placements):
            return False
        if self.data_held and not self.leaves_data_room(job, placements):
            return False
        return super().start_ok(job, placements)

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
            self.wait_reasons[job.id] = (f"Data ({', '.join(lost) or names} is on no node that is up; "
                                       "`hsched data scan` looks for it)")
            return False
        if job.spec.resources.nodes != 1:
            return True  # a gang's nodes copy in parallel: no single node to wait for
        best: tuple[float, str] | None = None
        held = self.data_held
        for node in self.nodes_for(job):
            # (first in line: a holder another job already waits for is not waited for again this round)
            if self.data_copy_s(job, node.name) == 0.0 and (node.name not in held or held[node.name][0] is job):
                free_in = self.free_in(node, job)
                if free_in is not None and (best is None or free_in < best[0]):
                    best = (free_in, node.name)
        # the whole wait is bounded by the copy: a holder whose predicted free time keeps slipping (taken by others,
        # runs longer than predicted) never makes the job wait longer than copying at once would have
        if best is not None and choose_wait(copy_s, best[0], self.fleet.data_waited.get(job.id, 0.0)):
            self.wait_reasons[job.id] = (f"Data (waiting for {best[1]}, which holds {names}: free in ~{secs(best[0])}; "
                                       f"a copy would take ~{secs(copy_s)})")
            held[best[1]] = (job, best[0])
            self.data_wait_node[job.id] = best[1]
            return False
        return True

    def leaves_data_room(self, job: Job, placements: Sequence[Placement]) -> bool:
        """`job` may take devices on a node held for a job waiting for its data only if that job is still predicted
        to have room there by when it was promised (its devices counted busy until the end of `job`'s time limit)."""
        limit = job.spec.time_limit_s
        end = self.now + limit if limit is not None else math.inf
        for p in placements:
            got = self.data_held.get(p.node)
            if got is None or got[0] is job:
                continue
            waiting, promised = got
            after = self.free_in(self.by_name[p.node], waiting, dict.fromkeys(p.devices, end))
            if not leaves_room(after, promised):
                return False
        return True

    def free_in(self, node: Node, job: Job, extra: Mapping[str, float] = NO_DEVICES) -> float | None:
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
        at.update(self.started)
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

    def soonest_devices(self, node: Node, job: Job, extra: Mapping[str, float] = NO_DEVICES) -> list[str]:
        """The job's GPU count of the node's eligible devices that free first (free ones now; `extra`: taken until
        then): where a forecast puts it (`prefetch_targets`)."""
        res = job.spec.resources
        at = {u: end for end, devs in self._running_by_node().get(node.name, ()) for u in devs}
        at.update(self.started)
        at.update(dict.fromkeys(self.releasing, self.now))
        at.update(extra)

        def when(u: str) -> float:
            return at.get(u, math.inf) if u in self.busy or u in extra else self.now

        return sorted(self.eligible(node, res), key=when)[:res.gpus]


PREFETCH_JOBS = 8
"""How many waiting jobs with data, in queue order, a round looks ahead for (the ones that start next)."""
PREFETCH_LOOKAHEAD = 64
"""How many waiting jobs, in queue order, are given the GPUs they would take first, before the jobs with data behind
them are: a copy to a node a job ahead of it will take is a copy wasted."""


J = TypeVar("J")
J_in = TypeVar("J_in", contravariant=True)


class PrefetchView(Protocol[J_in]):
    """What the prefetch rule asks of a fleet, live (`prefetch_targets`) or simulated (hsched.sim.data)."""

    def nodes(self, job: J_in) -> Sequence[str]:
        """The nodes the job could run on whole, in fleet order; none for a job the rule does not look at."""
        ...

    def free_in(self, job: J_in, node: str) -> float | None:
        """Seconds until the node has room for the job, the devices the jobs ahead took counting as taken; None:
        never known."""
        ...

    def copy_s(self, job: J_in, node: str) -> float:
        """Seconds to bring the job's data to the node: 0 when it is there (or the job names none), inf when no
        holder is up."""
        ...

    def has_data(self, job: J_in) -> bool:
        ...

    def take(self, job: J_in, node: str) -> None:
        """The job is predicted to take the node's devices that free first: the jobs behind do not count on them."""
        ...

    def lacking(self, job: J_in, node: str) -> tuple[object, ...]:
        """What to copy to the node for the job (none: nothing to start)."""
        ...


def prefetch_rule(view: PrefetchView[J], queue: Iterable[J], horizon_s: float
                  ) -> list[tuple[J, str, tuple[object, ...]]]:
    """The one prefetch rule, live and simulated: (job, node, what to copy there) for the first PREFETCH_JOBS waiting
    jobs with data among the first PREFETCH_LOOKAHEAD of `queue` (in the order they are served).

    Each job in turn goes where it could compute soonest, (max(free in, copy), copy, name) smallest (a copy started
    now runs while the job waits), and takes the devices there that free first, for ever as far as this forecast
    knows, so a node a job ahead will take is not where the next one starts. A job with data gets a copy there unless
    that node holds it, waiting for a holder is as good (`choose_wait`: that node is where it goes), or it is not
    predicted to have room there within `horizon_s` plus the copy's own time (a long copy starts earlier)."""
    out: list[tuple[J, str, tuple[object, ...]]] = []
    looked = 0
    for n, job in enumerate(queue):
        if looked >= PREFETCH_JOBS or n >= PREFETCH_LOOKAHEAD:
            break
        best: tuple[float, float, str] | None = None
        holder: float | None = None
        for node in view.nodes(job):
            eta = view.free_in(job, node)
            if eta is None:
                continue
            c = view.copy_s(job, node)
            if c == 0.0:
                holder = eta if holder is None else min(holder, eta)
            if math.isinf(c):
                continue
            cand = (max(eta, c), c, node)
            if best is None or cand < best:
                best = cand
        if best is None:
            continue
        _start_s, copy_s, name = best
        eta = view.free_in(job, name) or 0.0
        view.take(job, name)
        if not view.has_data(job):
            continue
        looked += 1
        if copy_s == 0.0 or choose_wait(copy_s, holder) or eta > horizon_s + copy_s:
            continue  # its data is where it starts soonest, or waiting for a holder is as good, or not soon
        what = view.lacking(job, name)
        if what:
            out.append((job, name, what))
    return out


class _LiveFleet:
    """`PrefetchView` over the live fleet: the round's own forecast (`Local.free_in`, `data_copy_s`)."""

    def __init__(self, st: Local) -> None:
        self.st = st
        self.taken: dict[str, float] = {}
        """Devices the jobs ahead are predicted to take (held for ever, as far as this forecast knows)."""

    def nodes(self, job: Job) -> Sequence[str]:
        res = job.spec.resources
        if res.nodes != 1 or not res.gpus or res.shared:
            return ()
        return [n.name for n in self.st.nodes_for(job)]

    def free_in(self, job: Job, node: str) -> float | None:
        return self.st.free_in(self.st.by_name[node], job, self.taken)

    def copy_s(self, job: Job, node: str) -> float:
        return self.st.data_copy_s(job, node) if job.spec.data else 0.0

    def has_data(self, job: Job) -> bool:
        return bool(job.spec.data)

    def take(self, job: Job, node: str) -> None:
        self.taken.update(dict.fromkeys(self.st.soonest_devices(self.st.by_name[node], job, self.taken), math.inf))

    def lacking(self, job: Job, node: str) -> tuple[str, ...]:
        at = self.st.fleet.data_at
        return tuple(d for d in job.spec.data if d in at and node not in at[d])


def prefetch_targets(fleet: FleetView, queue: Sequence[Job], now: float, horizon_s: float,
                     skip: Collection[int] = (), *, served: bool = False) -> list[tuple[int, str, tuple[str, ...]]]:
    """(job, node, datasets to copy there): `prefetch_rule` over the live fleet, for the waiting jobs of `queue` but
    those in `skip` (one-node GPU jobs only, not shared ones). `served`: `queue` is in the order the round served it
    (the policy's: fair share, attained service), else it is put in QoS, priority and submit order. Pure: the
    controller starts the copies (hsched.controller.data)."""
    if not fleet.data_at:
        return []
    view = _LiveFleet(Local(fleet, default_chooser(), now))
    ahead = [j for j in queue if j.id not in skip]
    return [(job.id, node, cast("tuple[str, ...]", what))
            for job, node, what in prefetch_rule(view, ahead if served else order(ahead), horizon_s)]
