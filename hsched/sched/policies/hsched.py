"""`hsched`: the team's own non-clairvoyant default, the policy the live controller runs."""

from __future__ import annotations

import heapq
import math
import operator
from collections.abc import Callable, Iterator, Mapping
from typing import Final, NamedTuple, TypeVar, cast

from hsched.model import DEFAULT_QOS
from hsched.sched.policies.base import Policy, select_by_capacity, view_at, wants_from_assignment
from hsched.sched.policies.keys import Key as _Key
from hsched.sched.policies.keys import waiting_by_user, waiting_sorted
from hsched.sched.policies.types import assign_types
from hsched.sched.priority import PriorityWeights, UserShare, age_factor, charged_factor, size_factor
from hsched.sched.view import QOS_RANK, JobPhase, JobView, Plan, PolicyInput, qos_rank

_VIEW = operator.itemgetter(7)
_USER = operator.attrgetter("user")
_LAST = "hsched.order.last"
# JobView's fields by position, for the order's pass over every job each round: a NamedTuple's field read by name is a
# generic attribute lookup (policies.base.view_getter), an index a tuple's own (literals, so the types check field by
# field; `view_at` checks them against the view's own at import)
_ID: Final = 0
_GPUS: Final = 2
_ARRIVAL: Final = 3
_PHASE: Final = 4
_QOS: Final = 5
_PRIORITY: Final = 6
_RUN_START: Final = 10
_SERVICE: Final = 12
view_at(id=_ID, gpus=_GPUS, arrival_s=_ARRIVAL, phase=_PHASE, qos=_QOS, priority=_PRIORITY, run_start_s=_RUN_START,
        service_s=_SERVICE)
_SHARES = "hsched.shares.last"
T = TypeVar("T")


MOVE_MARGIN = 2.0
"""A restart must be expected to save this many times its cost (a margin for the prediction's error): moves, and
elastic resizes (hsched.sched.elastic), which use the same three functions."""


def expected_remaining_s(forecast_s: float | None, run_s: float, round_s: float) -> float:
    """A running job's expected remaining time: the prediction where there is one; else, without durations, the time
    already run (heavy-tailed job sizes: the longer a job has run, the longer it is likely to keep running), at least
    one round."""
    return forecast_s if forecast_s is not None else max(run_s, round_s)


def speedup_gain(remaining_s: float, cur: float, new: float) -> float:
    """Seconds saved by going from speed `cur` to `new` (any unit, the same for both) with `remaining_s` to run at
    `cur`; 0 when `new` is not faster."""
    if new <= cur or new <= 0:
        return 0.0
    return remaining_s * (1.0 - cur / new)


def gain_pays(gain_s: float, cost_s: float) -> bool:
    """Whether a checkpoint and restart costing `cost_s` is worth an expected saving of `gain_s`."""
    return cost_s <= 0 or gain_s > MOVE_MARGIN * cost_s


class _Users(NamedTuple):
    """Fair share's view of the round's users (`Hsched.shares`): each user's decayed GPU-seconds, normalised share
    and GPUs held now; the lab's decayed GPU-seconds; the jobs whose priority an admin set; the weights."""

    decayed: dict[str, float]
    norm: dict[str, float]
    held: dict[str, int]
    lab_decayed_s: float
    admin_jobs: frozenset[int]
    weights: PriorityWeights


def _per_input(inp: PolicyInput, key: str, make: Callable[[PolicyInput], T]) -> T:
    """`make(inp)`, made once for one round's input and kept in its cache under `key` (the next round's input, another
    object, makes it again)."""
    last = inp.cache.get(key)
    if isinstance(last, tuple) and last[0] is inp:
        return cast(T, last[1])
    got = make(inp)
    inp.cache[key] = (inp, got)
    return got


class _Order:
    """The round's order between users, made only as far as it is read. Fair share's interleave is a merge job by
    job (`Hsched._between_users`), and a live round reads only its head: the plan's selection (the fleet's GPUs'
    worth) and the reservation's head (the first waiting job the plan does not start). With 2,000 waiting jobs on 512
    GPUs, merging the whole queue was ~4 ms of a churning live round in which the first few hundred decided
    everything (issue 33). `all` makes the rest."""

    __slots__ = ("_more", "done")

    def __init__(self, more: Iterator[JobView]) -> None:
        self.done: list[JobView] = []
        self._more = more

    def __iter__(self) -> Iterator[JobView]:
        done, more = self.done, self._more
        i = 0
        while True:
            if i < len(done):
                yield done[i]
            else:
                j = next(more, None)  # (a view is never None)
                if j is None:
                    return
                done.append(j)
                yield j
            i += 1

    def all(self) -> list[JobView]:
        self.done.extend(self._more)
        return self.done


class Hsched(Policy):
    """QoS class first (prod, normal, scavenger); inside a class, whose job runs next between users by a
    multifactor priority (Slurm's: the user's fair-share factor, the job's age and size, weighed by the settings'
    `[priority]`), and which of a user's jobs by their own priority, then least work counted in GPU-seconds: the
    remaining time its progress reports where it reports a total (shortest remaining first), else the service it
    attained (a gang's GPUs times its normalised seconds, so short and small jobs finish fast without knowing
    durations; `keys.work`); a running job keeps its GPUs for a quantum (1.5 h, longer with a checkpoint cost) before a
    less-served job may take them. The chosen jobs get GPU types by relative speed (a job goes where its
    throughput relative to the other types is highest), move to faster GPUs when they free up and the move pays
    for its checkpoint, and gangs are packed onto one server where possible. Jobs that do not fit are skipped, not
    waited for (backfill).
    """

    name = "hsched"
    time_sharing = True
    quantum_s = 5400.0
    """How long a (re)started job keeps its GPUs before a less-served job may take them."""
    quantum_per_checkpoint_s = 12.0
    """...and at least this many times the checkpoint cost, so a stop costs at most ~1/12 of the run it ends."""

    def min_run_s(self, inp: PolicyInput) -> float:
        # Why a quantum and not one round: least attained service alone re-sorts near-equal jobs every round,
        # so on Gavel's gang trace 0e4a51 it stopped a job ~350,000 times (every stop a checkpoint and restore
        # in real life). With 1.5 h the ranking changes hands ~30,000 times and the mean JCT is lower, not
        # higher: jobs there run for days, and a 1.5 h slice still time-shares them (bench_sim.py --gang).
        quantum = self.quantum_s if inp.quantum_s is None else inp.quantum_s
        return max(quantum, inp.round_s, self.quantum_per_checkpoint_s * inp.checkpoint_cost_s)

    def hold_s(self, inp: PolicyInput) -> float:
        """How long a GPU handed out in this selection is likely held (what fair share counts it as, `order`): the
        lab's typical run length (`UserShare.hold_s`: the controller's ledger of ended runs, the simulator's
        replay so far), at least one round (`round_s`; one round before any run ended).

        Why the runs' own length and not a constant: the count must be near what a start really adds. One round
        (6 min) against 1000-s jobs let the user ahead by a hair take both GPUs of a round and the other user both
        of the next (shares 2:1 split 1.7:1 over a flood); the quantum (1.5 h) let the selection outweigh the
        history (1.5:1). At the runs' own length the split is 2:1 within a job (tests/fairshare)."""
        typical = max((v.hold_s for v in inp.user_usage.values() if isinstance(v, UserShare)), default=0.0)
        return max(inp.round_s, typical)

    @staticmethod
    def shares(inp: PolicyInput) -> _Users | None:
        """Fair share's view of the round's users, from `inp.user_usage` (the controller's and the simulator's
        `UserShare`s; plain floats, a view built by hand: decayed GPU-seconds with equal shares); None with fewer
        than two users (nobody to share with: the order is the user's own)."""
        usage = inp.user_usage
        if len(usage) < 2:
            return None  # (before the users are gathered: a one-user replay asks this every round)
        # (the order, `over_share` and `waiting_order` each ask it of one round's input: ~0.6 ms each time at 2,500
        # jobs)
        return _per_input(inp, _SHARES, Hsched._shares)

    @staticmethod
    def _shares(inp: PolicyInput) -> _Users | None:
        usage = inp.user_usage
        # (sorted: sums in one order, so equal usage ties the same way whatever the hash seed)
        users = sorted(set(usage).union(map(_USER, inp.jobs)))
        if len(users) < 2:
            return None
        decayed: dict[str, float] = {}
        norm: dict[str, float] = {}
        admin: set[int] = set()
        lab = 0.0
        weights = None
        for u in users:
            v = usage.get(u, 0.0)
            if isinstance(v, UserShare):
                decayed[u], norm[u], lab = v.decayed_s, v.norm_share, max(lab, v.lab_decayed_s)
                admin.update(v.admin_jobs)
                weights = v.weights
            else:
                decayed[u], norm[u] = float(v), 1.0 / len(users)
        lab = max(lab, sum(decayed.values()))
        held: dict[str, int] = dict.fromkeys(users, 0)
        running = JobPhase.RUNNING
        for j in [v for v in inp.jobs if v.phase is running]:
            held[j.user] += j.gpus
        return _Users(decayed, norm, held, lab, frozenset(admin), weights or PriorityWeights())

    def over_share(self, inp: PolicyInput) -> frozenset[str]:
        """The users fair share serves after the others, as a flag the live round's reservation key can hold: those
        whose fair-share factor at the start of the selection is below the best one's. (The order itself
        interleaves users job by job: `order`.)"""
        users = self.shares(inp)
        if users is None:
            return frozenset()
        fleet, period = sum(inp.capacity.values()), self.hold_s(inp)
        fs = {u: charged_factor(users.decayed[u], period * users.held[u], users.norm[u], users.lab_decayed_s,
                                period * fleet) for u in users.decayed}
        best = max(fs.values())
        return frozenset(u for u, f in fs.items() if f < best)

    def waiting_order(self, inp: PolicyInput) -> Iterator[int] | None:
        """`order`'s waiting jobs when users share the fleet: between users by the multifactor priority, interleaved
        job by job, so no single key (QoS, priority, a flag per user, submit time) can stand for it; the live round's
        reservation takes its head from here (hsched.sched.stages.plan). One user: None (the round's own key, QoS,
        priority and attained service, is this order's). The order the plan just made is read on, not made again,
        and only as far as the caller reads."""
        if self.shares(inp) is None:
            return None
        running = JobPhase.RUNNING
        return (j.id for j in self._ordered(inp) if j.phase is not running)

    def order(self, inp: PolicyInput) -> list[JobView]:
        got = self._ordered(inp)
        return got if isinstance(got, list) else got.all()

    def _ordered(self, inp: PolicyInput) -> list[JobView] | _Order:
        """`order`, whole with one user; between users made as far as it is read (`_Order`). One round's input
        is ordered once: the plan, `waiting_order` and `order` read the same."""
        return _per_input(inp, _LAST, self._make_order)

    def _make_order(self, inp: PolicyInput) -> list[JobView] | _Order:
        users = self.shares(inp)
        admin = users.admin_jobs if users is not None else frozenset[int]()
        min_run = self.min_run_s(inp)
        now = inp.now
        running = JobPhase.RUNNING
        ranks, normal = QOS_RANK, qos_rank(DEFAULT_QOS)
        jobs = inp.jobs
        forecast = inp.forecast_s
        waiting = [j for j in jobs if j[_PHASE] is not running]
        # GPU-seconds (`keys.work`, inline: remaining where known, else attained): a gang of 8 that ran an hour has had
        # as much as 8 single jobs that ran one (Tiresias's two-dimensional LAS); on the gang trace this ranks far
        # better than seconds alone (las-hetero's), and on single-GPU traces the two are the same. The user's
        # priority orders their jobs inside their QoS class, before attained service (the fourth: not fresh from a
        # (re)start within the quantum). (A comprehension: a loop with appends was a sixth of a simulated round's
        # order, where a few dozen jobs run. The views' fields by position: `_QOS`'s comment.)
        fget, rget = forecast.get, ranks.get
        run_keys: list[_Key] = [
            (rget(j[_QOS], normal), -j[_PRIORITY] if j[_ID] in admin else 0, -j[_PRIORITY],
             (start := j[_RUN_START]) is None or not (now - start < min_run),
             j[_GPUS] * (j[_SERVICE] if (left := fget(j[_ID])) is None else left), j[_ARRIVAL], j[_ID], j)
            for j in jobs if j[_PHASE] is running] if admin else [
            # (nobody's priority set by an admin, the usual case: the same keys without that test, every round)
            (rget(j[_QOS], normal), 0, -j[_PRIORITY], (start := j[_RUN_START]) is None or not (now - start < min_run),
             j[_GPUS] * (j[_SERVICE] if (left := fget(j[_ID])) is None else left), j[_ARRIVAL], j[_ID], j)
            for j in jobs if j[_PHASE] is running]
        if users is not None:
            return _Order(self._between_users(inp, users, run_keys, waiting_by_user(inp, waiting, admin)))
        keyed = list(waiting_sorted(inp, waiting, admin))
        keyed += run_keys
        # (a sorted run and the running jobs' keys: the sort merges. Ids are unique: two keys never tie up to the
        # view, which is there to be handed back)
        keyed.sort()
        return list(map(_VIEW, keyed))

    def _between_users(self, inp: PolicyInput, users: _Users, run_keys: list[_Key],
                       waiting: Mapping[int, Mapping[str, list[_Key]]]) -> Iterator[JobView]:
        """Interleave the users' own orders (their keys, sorted) class by class: the next job is the head of the user
        whose head has the highest multifactor priority (an admin's priority first), and every job taken counts
        its GPUs as its user's usage for as long as a run is likely to hold them (`hold_s`), so the factor reacts
        within the selection (Slurm's only moves as usage accrues): with equal shares and equal jobs the starts
        alternate from the first one on. Inside a class the running jobs still within their quantum come first
        (fair share, like attained service, takes GPUs only from a job that had its quantum). Only the taken user's
        priority changes (the lab's total is fixed for the selection: `charged_factor`): one heap of user heads.
        `waiting`: the waiting jobs' keys by class and user, sorted (`keys.waiting_by_user`, kept round to round)."""
        fleet = sum(inp.capacity.values())
        period = self.hold_s(inp)
        w = users.weights
        wfs, wage, wsize, max_age = w.fairshare, w.age, w.size, w.max_age_s
        now = inp.now
        decayed, norm = users.decayed, users.norm
        total = users.lab_decayed_s + period * fleet
        charged = dict.fromkeys(users.decayed, 0.0)
        pow2 = math.pow
        # the running jobs by class, in two parts (within their quantum, the rest), then by user, each sorted
        running: dict[int, tuple[dict[str, list[_Key]], dict[str, list[_Key]]]] = {}
        for k in sorted(run_keys):
            parts = running.get(k[0])
            if parts is None:
                parts = running[k[0]] = ({}, {})
            parts[1 if k[3] else 0].setdefault(k[7].user, []).append(k)
        for rank in sorted(running.keys() | waiting.keys()):
            # one QoS class, in two parts (running within their quantum, the rest): each user's jobs in their order
            # (a key is the job's own: ties between users are broken by it)
            fresh, run_rest = running.get(rank, ({}, {}))
            rest = dict(waiting.get(rank, {}))
            for u, ks in run_rest.items():
                more = rest.get(u)
                rest[u] = sorted(ks + more) if more else ks
            for queues in (fresh, rest):
                if len(queues) <= 1:
                    for q in queues.values():
                        for k in q:
                            j = k[7]
                            yield j
                            charged[j.user] = charged.get(j.user, 0.0) + period * j.gpus
                    continue
                pos = dict.fromkeys(queues, 0)
                heap = [self._entry(q[0], u, decayed, norm, charged, total, now, fleet, w) for u, q in queues.items()]
                heapq.heapify(heap)
                replace, pop = heapq.heapreplace, heapq.heappop
                while heap:
                    k, u = heap[0][3], heap[0][4]
                    j = k[7]
                    yield j
                    c = charged[u] = charged.get(u, 0.0) + period * j.gpus
                    q = queues[u]
                    nxt = pos[u] = pos[u] + 1
                    if nxt >= len(q):
                        pop(heap)
                        continue
                    # the user's next head (`_entry`, inline: this is the loop over the whole queue)
                    k = q[nxt]
                    j = k[7]
                    share = norm.get(u, 0.0)
                    use = (decayed.get(u, 0.0) + c) / total if total > 0 else 0.0
                    waited = now - j.arrival_s - j.run_s
                    age = 1.0 if max_age <= 0 else min(1.0, waited / max_age) if waited > 0 else 0.0
                    prio = (wfs * pow2(2.0, -use / share) if share > 0 else 0.0) + wage * age + (
                        wsize * min(1.0, j.gpus / fleet) if fleet > 0 else 0.0)
                    replace(heap, (k[1], -prio, use / share if share > 0 else math.inf, k, u))

    @staticmethod
    def _entry(k: _Key, u: str, decayed: Mapping[str, float], norm: Mapping[str, float],
               charged: Mapping[str, float], total: float, now: float, fleet: int, w: PriorityWeights,
               ) -> tuple[int, float, float, _Key, str]:
        """User `u`'s head (key `k`) as the merge compares heads: an admin's priority first, then the multifactor
        priority (highest first), then usage per share (where factors underflow to 0 deep in a long queue), then the
        job's own key."""
        j = k[7]
        share = norm.get(u, 0.0)
        use = (decayed.get(u, 0.0) + charged.get(u, 0.0)) / total if total > 0 else 0.0
        fs = charged_factor(decayed.get(u, 0.0), charged.get(u, 0.0), share, total, 0.0)
        prio = w.fairshare * fs + w.age * age_factor(now - j.arrival_s - j.run_s, w.max_age_s) + w.size * size_factor(
            j.gpus, fleet)
        return (k[1], -prio, use / share if share > 0 else math.inf, k, u)

    def move_gain(self, j: JobView, new_type: str, inp: PolicyInput) -> tuple[float, float]:
        """(seconds a move of running job `j` to `new_type` is expected to save, what its checkpoint and restore
        cost): the gain is its expected remaining time times the speed it stops wasting.

        Expected remaining time: the prediction where there is one (`inp.forecast_s`: the live controller's,
        from progress or history, the simulator's from progress totals; seconds on the job's fastest type); else,
        without durations, the time already run (heavy-tailed job sizes: the longer a job has run, the longer it
        is likely to keep running), at least one round.
        """
        cost = inp.checkpoint_costs.get(j.id, inp.checkpoint_cost_s)
        if j.gpu_type is None:
            return float("inf"), cost
        rel = inp.throughput.rel_speeds(j.job_type, j.gpus, inp.gpu_types)
        cur, new = rel.get(j.gpu_type, 0.0), rel.get(new_type, 0.0)
        hint = inp.forecast_s.get(j.id)
        # (a forecast is seconds on the job's fastest type: where it runs now, they take 1/cur as long)
        left = hint / cur if hint is not None and cur > 0 else None
        return speedup_gain(expected_remaining_s(left, j.run_s, inp.round_s), cur, new), cost

    def move_pays(self, j: JobView, new_type: str, inp: PolicyInput) -> bool:
        """Whether leaving the current type for `new_type` is worth a checkpoint and restore: the expected gain
        over twice the cost (a margin for the prediction's error)."""
        gain, cost = self.move_gain(j, new_type, inp)
        # (free moves are the assignment's to decide, whatever they gain)
        return gain_pays(gain, cost)

    def _up_unpaid(self, j: JobView, new_type: str | None, inp: PolicyInput) -> bool:
        """Whether running job `j` should stay on its type rather than go to `new_type`: it is not assigned one
        (None), or `new_type` is faster for it and the move does not pay (`move_pays`)."""
        if new_type is None:
            return True
        rel = inp.throughput.rel_speeds(j.job_type, j.gpus, inp.gpu_types)
        assert j.gpu_type is not None
        return rel.get(new_type, 0.0) > rel.get(j.gpu_type, 0.0) and not self.move_pays(j, new_type, inp)

    def plan(self, inp: PolicyInput) -> Plan:
        ordered = self._ordered(inp)
        # (between users, an iterator: the selection reads the order only as far as the fleet's GPUs go; its loop
        # takes the same jobs as its shortcuts for whole lists)
        chosen = select_by_capacity(ordered if isinstance(ordered, list) else iter(ordered), inp.capacity, inp)
        assigned = assign_types(chosen, inp.capacity, inp)
        if inp.checkpoint_cost_s > 0 or inp.checkpoint_costs:
            # Only a move up (to a type faster for the job) is the job's own to pay for. A move down is the
            # assignment handing the job's faster GPU to one that gains more there (a newcomer, which pays no
            # checkpoint, or a running job whose own move up pays): pinning the job that steps down pushed
            # that one onto the slow type instead, every round (ed69ec, 16:16:16, 30 s checkpoints: 3.6 % worse
            # avg JCT than las-hetero, which moves freely; tests/sim/test_checkpoint_policy.py).
            pinned = {
                j.id: j.gpu_type
                for j in chosen
                if j.running and j.gpu_type is not None and assigned.get(j.id) != j.gpu_type
                and self._up_unpaid(j, assigned.get(j.id), inp)
            }
            if pinned:
                pinned |= {j.id: j.gpu_type for j in chosen
                           if j.running and j.gpu_type is not None and assigned.get(j.id) == j.gpu_type}
                assigned = assign_types(chosen, inp.capacity, inp, pinned=pinned)
        # the chosen jobs are those assigned a type, in the order: wants over them are the wants over all
        return Plan(wants_from_assignment(chosen, assigned, inp), preempt=True, strict=False)
