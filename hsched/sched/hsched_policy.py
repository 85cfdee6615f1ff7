"""`hsched`: the team's own non-clairvoyant default, the policy the live controller runs."""

from __future__ import annotations

import math
from collections.abc import Callable

from hsched.model import DEFAULT_QOS
from hsched.sched.policy import Policy, hetero_assign, select_by_capacity, wants_from_assignment
from hsched.sched.view import QOS_RANK, JobPhase, JobView, Plan, PolicyInput, qos_rank


class Hsched(Policy):
    """QoS class first (prod, normal, scavenger), then fair share between users, then discretised least
    attained service (normalised GPU-seconds, so short jobs finish fast without knowing durations), FIFO
    inside a service band, with a starvation guard. The chosen jobs get GPU types by relative speed (a job
    goes where its throughput relative to the other types is highest), move to faster GPUs when they free
    up and the move pays for its checkpoint, and gangs are packed onto one server where possible. Jobs that
    do not fit are skipped, not waited for (backfill); running jobs are preempted only by a better band and
    only after a minimum run, so checkpoint costs are not paid for churn.
    """

    name = "hsched"
    time_sharing = True
    first_band_gpu_s = 3600.0
    band_growth = 2.0
    starve_factor = 8.0
    fair_share_slack = 1.5
    """A user whose decayed usage is above this multiple of the mean is served after the others."""

    def band(self, j: JobView, now: float, cost: float = 0.0) -> int:
        return self._band_of(now, cost)(j)

    def _band_of(self, now: float, cost: float) -> Callable[[JobView], int]:
        """`band` for one round, as a plain function: the sort calls it once per job per round."""
        # With a checkpoint cost, hysteresis: a promoted job keeps the top band while it runs until its wait
        # is down to half the trigger ratio, so it pays for one restore per real slice. Without a cost,
        # starved jobs may trade GPUs every round: that is free time-sharing, and it measured better.
        starve = self.starve_factor
        starve_running = starve * (0.5 if cost > 0 else 1.0)
        first, growth, log, running = self.first_band_gpu_s, self.band_growth, math.log, JobPhase.RUNNING

        def band(j: JobView) -> int:
            run_s = j.run_s
            if run_s > 0 and now - j.arrival_s - run_s >= (starve_running if j.phase is running else starve) * run_s:
                return 0
            attained = j.gpus * j.service_s
            if attained < first:
                return 0
            return 1 + int(log(attained / first, growth))

        return band

    def min_run_s(self, inp: PolicyInput) -> float:
        return max(inp.round_s, 4.0 * inp.checkpoint_cost_s)

    def order(self, inp: PolicyInput) -> list[JobView]:
        usage = inp.user_usage
        mean = sum(usage.values()) / len(usage) if usage else 0.0
        heavy = self.fair_share_slack * mean
        min_run = self.min_run_s(inp)
        now, band = inp.now, self._band_of(inp.now, inp.checkpoint_cost_s)
        running = JobPhase.RUNNING
        ranks, normal = QOS_RANK, qos_rank(DEFAULT_QOS)

        def key(j: JobView) -> tuple[int, int, int, int, int, float, int]:
            over = 1 if mean > 0 and usage.get(j.user, 0.0) > heavy else 0
            start = j.run_start_s
            fresh = start is not None and j.phase is running and now - start < min_run
            # the user's priority orders jobs inside their QoS class, before fair share and service bands
            return (ranks.get(j.qos, normal), -j.priority, over, 0 if fresh else 1, band(j), j.arrival_s,
                    j.id)

        return sorted(inp.jobs, key=key)

    def move_pays(self, j: JobView, new_type: str, inp: PolicyInput) -> bool:
        """Whether leaving the current type for `new_type` is worth a checkpoint and restore.

        Without durations, expected remaining time is taken as the time already run (heavy-tailed job
        sizes: the longer a job has run, the longer it is likely to keep running), at least one round.
        """
        if j.gpu_type is None or inp.checkpoint_cost_s <= 0:
            return True
        rel = inp.throughput.rel_speeds(j.job_type, j.gpus, inp.gpu_types)
        cur, new = rel.get(j.gpu_type, 0.0), rel.get(new_type, 0.0)
        if new <= cur or new <= 0:
            return False
        remaining = max(j.run_s, inp.round_s)
        return remaining * (1.0 - cur / new) > 2.0 * inp.checkpoint_cost_s

    def plan(self, inp: PolicyInput) -> Plan:
        ordered = self.order(inp)
        chosen = select_by_capacity(ordered, inp.capacity, inp)
        assigned = hetero_assign(chosen, inp.capacity, inp)
        if inp.checkpoint_cost_s > 0:
            pinned = {
                j.id: j.gpu_type
                for j in chosen
                if j.running and j.gpu_type is not None and assigned.get(j.id) != j.gpu_type
                and not self.move_pays(j, assigned.get(j.id, j.gpu_type), inp)
            }
            if pinned:
                pinned |= {j.id: j.gpu_type for j in chosen
                           if j.running and j.gpu_type is not None and assigned.get(j.id) == j.gpu_type}
                assigned = hetero_assign(chosen, inp.capacity, inp, pinned=pinned)
        return Plan(wants_from_assignment(ordered, assigned, inp), preempt=True, strict=False)
