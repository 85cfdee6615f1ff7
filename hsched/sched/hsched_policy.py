"""`hsched`: the team's own non-clairvoyant default, the policy the live controller runs."""

from __future__ import annotations

import operator
from typing import NamedTuple

from hsched.model import DEFAULT_QOS
from hsched.sched.policy import Policy, hetero_assign, select_by_capacity, wants_from_assignment
from hsched.sched.view import QOS_RANK, JobPhase, JobView, Plan, PolicyInput, qos_rank

_Key = tuple[int, int, bool, bool, float, float, int, JobView]
"""A job's place in `Hsched.order`: QoS rank, -priority, over its fair share, not fresh from a (re)start, GPU-seconds
attained, arrival, id; then the view itself."""
_VIEW = operator.itemgetter(7)
_MEMO = "hsched.order"


class _Memo(NamedTuple):
    """The last `Hsched.order`'s waiting jobs: their views, the users over their fair share, their keys by id and their
    keys sorted. Kept in the caller's `PolicyInput.cache` (a policy object is made afresh each live round), swapped
    whole: a key holds its view, which tells whether it is still the job's. At 2,000 waiting jobs, keys made afresh
    and sorted took 4.3 ms of a 21 ms live round (bench_live.py)."""

    waiting: list[JobView]
    over: frozenset[str]
    keys: dict[int, _Key]
    ordered: list[_Key]


class Hsched(Policy):
    """QoS class first (prod, normal, scavenger), then fair share between users, then least attained service
    counted in GPU-seconds (a gang's GPUs times its normalised seconds, so short and small jobs finish fast
    without knowing durations); a running job keeps its GPUs for a quantum (1.5 h, longer with a checkpoint
    cost) before a less-served job may take them. The chosen jobs get GPU types by relative speed (a job goes
    where its throughput relative to the other types is highest), move to faster GPUs when they free up and
    the move pays for its checkpoint, and gangs are packed onto one server where possible. Jobs that do not
    fit are skipped, not waited for (backfill).
    """

    name = "hsched"
    time_sharing = True
    quantum_s = 5400.0
    """How long a (re)started job keeps its GPUs before a less-served job may take them."""
    quantum_per_checkpoint_s = 12.0
    """...and at least this many times the checkpoint cost, so a stop costs at most ~1/12 of the run it ends."""
    fair_share_slack = 1.5
    """A user whose decayed usage is above this multiple of the mean is served after the others."""

    def min_run_s(self, inp: PolicyInput) -> float:
        # Why a quantum and not one round: least attained service alone re-sorts near-equal jobs every round,
        # so on Gavel's gang trace 0e4a51 it stopped a job ~350,000 times (every stop a checkpoint and restore
        # in real life). With 1.5 h the ranking changes hands ~30,000 times and the mean JCT is lower, not
        # higher: jobs there run for days, and a 1.5 h slice still time-shares them (bench_sim.py --gang).
        quantum = self.quantum_s if inp.quantum_s is None else inp.quantum_s
        return max(quantum, inp.round_s, self.quantum_per_checkpoint_s * inp.checkpoint_cost_s)

    def over_share(self, inp: PolicyInput) -> frozenset[str]:
        """The users fair share serves after the others: usage above `fair_share_slack` times the mean. (The live
        round reads it too, to find the most important waiting job it reserves GPUs for.)"""
        usage = inp.user_usage
        mean = sum(usage.values()) / len(usage) if usage else 0.0
        heavy = self.fair_share_slack * mean
        return frozenset(u for u, v in usage.items() if v > heavy) if mean > 0 else frozenset[str]()

    def order(self, inp: PolicyInput) -> list[JobView]:
        # fair share's "served after the others", once per user rather than once per job
        over = self.over_share(inp)
        min_run = self.min_run_s(inp)
        now = inp.now
        running = JobPhase.RUNNING
        ranks, normal = QOS_RANK, qos_rank(DEFAULT_QOS)
        jobs = inp.jobs
        waiting = [j for j in jobs if j.phase is not running]
        memo = inp.cache.get(_MEMO)
        last_waiting, last_over, last, last_sorted = memo if isinstance(memo, _Memo) else _Memo([], frozenset(), {}, [])
        if over == last_over and len(waiting) == len(last_waiting) and all(map(operator.is_, waiting, last_waiting)):
            # the very same waiting views as last time, and the same fair share flags: the same keys, sorted
            # already (the live controller's usual round: 2,000 waiting jobs that did not change)
            waiting_sorted = last_sorted
        else:
            # a waiting job's key is its view's and its user's fair share flag alone: the last round's, while both
            # are (the live controller and the simulator keep a waiting job's very view from round to round)
            kept: dict[int, _Key] = {}
            for j in waiting:
                hit = last.get(j.id)
                if hit is None or hit[7] is not j or hit[2] is not (j.user in over):
                    hit = (ranks.get(j.qos, normal), -j.priority, j.user in over, True, j.gpus * j.service_s,
                           j.arrival_s, j.id, j)
                kept[j.id] = hit
            # (only this round's waiting jobs are kept: ended and started ones do not pile up)
            waiting_sorted = sorted(kept.values())
            inp.cache[_MEMO] = _Memo(waiting, over, kept, waiting_sorted)
        keyed = list(waiting_sorted)
        append = keyed.append
        last_qos: str | None = None  # (jobs of one class in a row: their rank looked up once)
        rank = normal
        for j in jobs:
            if j.phase is running:
                start = j.run_start_s
                qos = j.qos
                if qos is not last_qos:
                    last_qos, rank = qos, ranks.get(qos, normal)
                # GPU-seconds attained: a gang of 8 that ran an hour has had as much as 8 single jobs that ran one
                # (Tiresias's two-dimensional LAS); on the gang trace this ranks far better than seconds alone
                # (las-hetero's), and on single-GPU traces the two are the same
                # the user's priority orders jobs inside their QoS class, before fair share and attained service
                # (the fourth: not fresh from a (re)start within the quantum)
                append((rank, -j.priority, j.user in over, start is None or not (now - start < min_run),
                        j.gpus * j.service_s, j.arrival_s, j.id, j))
        # (a sorted run and the running jobs' keys: the sort merges. Ids are unique: two keys never tie up to the
        # view, which is there to be handed back)
        keyed.sort()
        return list(map(_VIEW, keyed))

    def move_gain(self, j: JobView, new_type: str, inp: PolicyInput) -> tuple[float, float]:
        """(seconds a move of running job `j` to `new_type` is expected to save, what its checkpoint and restore
        cost): the gain is its expected remaining time times the speed it stops wasting.

        Expected remaining time: the prediction where there is one (`inp.forecast_s`: the live controller's,
        from progress or history); else, without durations, the time already run (heavy-tailed job sizes: the
        longer a job has run, the longer it is likely to keep running), at least one round.
        """
        cost = inp.checkpoint_costs.get(j.id, inp.checkpoint_cost_s)
        if j.gpu_type is None:
            return float("inf"), cost
        rel = inp.throughput.rel_speeds(j.job_type, j.gpus, inp.gpu_types)
        cur, new = rel.get(j.gpu_type, 0.0), rel.get(new_type, 0.0)
        if new <= cur or new <= 0:
            return 0.0, cost
        hint = inp.forecast_s.get(j.id)
        remaining = hint if hint is not None else max(j.run_s, inp.round_s)
        return remaining * (1.0 - cur / new), cost

    def move_pays(self, j: JobView, new_type: str, inp: PolicyInput) -> bool:
        """Whether leaving the current type for `new_type` is worth a checkpoint and restore: the expected gain
        over twice the cost (a margin for the prediction's error)."""
        gain, cost = self.move_gain(j, new_type, inp)
        # (free moves are the assignment's to decide, whatever they gain)
        return cost <= 0 or gain > 2.0 * cost

    def _up_unpaid(self, j: JobView, new_type: str | None, inp: PolicyInput) -> bool:
        """Whether running job `j` should stay on its type rather than go to `new_type`: it is not assigned one
        (None), or `new_type` is faster for it and the move does not pay (`move_pays`)."""
        if new_type is None:
            return True
        rel = inp.throughput.rel_speeds(j.job_type, j.gpus, inp.gpu_types)
        assert j.gpu_type is not None
        return rel.get(new_type, 0.0) > rel.get(j.gpu_type, 0.0) and not self.move_pays(j, new_type, inp)

    def plan(self, inp: PolicyInput) -> Plan:
        ordered = self.order(inp)
        chosen = select_by_capacity(ordered, inp.capacity, inp)
        assigned = hetero_assign(chosen, inp.capacity, inp)
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
                assigned = hetero_assign(chosen, inp.capacity, inp, pinned=pinned)
        # the chosen jobs are those assigned a type, in the order: wants over them are the wants over all
        return Plan(wants_from_assignment(chosen, assigned, inp), preempt=True, strict=False)
