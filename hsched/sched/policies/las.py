"""Least attained service: Tiresias's discretised LAS, and Gavel's heterogeneity-aware LAS (with the body it
shares with finish-time fairness)."""

from __future__ import annotations

import math
from itertools import compress, count, islice
from operator import eq, le, lt

from hsched.sched.policies.base import (
    Policy,
    hetero_assign,
    select_by_capacity,
    view_getter,
    wants_from_assignment,
)
from hsched.sched.view import JobView, Plan, PolicyInput, Want


class Las(Policy):
    """Tiresias-style discretised two-dimensional least-attained-service: a job's service is GPUs x seconds
    run; queues at 1 h, 4 h, 16 h ... of GPU time; the lowest queue runs first, FIFO inside a queue; a job
    that has waited `starve_factor` times as long as it has run is promoted to the top queue (starvation
    guard). Preemptive and heterogeneity-unaware (a job stays on its type, else takes a
    random type with room), re-evaluated every round.
    """

    name = "las"
    time_sharing = True
    reads_forecast = False
    first_threshold_gpu_s = 3600.0
    growth = 4.0
    starve_factor = 8.0

    def queue(self, j: JobView, now: float) -> int:
        waited = now - j.arrival_s - j.run_s
        # half the ratio while running: hysteresis, so a promoted job is not demoted after one round
        if j.run_s > 0 and waited >= self.starve_factor * (0.5 if j.running else 1.0) * j.run_s:
            return 0
        gpu_s = j.gpus * j.run_s
        if gpu_s < self.first_threshold_gpu_s:
            return 0
        return 1 + int(math.log(gpu_s / self.first_threshold_gpu_s, self.growth))

    def plan(self, inp: PolicyInput) -> Plan:
        ordered = sorted(inp.jobs, key=lambda j: (self.queue(j, inp.now), j.arrival_s, j.id))
        return Plan(tuple(Want(j.id) for j in ordered), preempt=True, strict=False)


class HeteroFair(Policy):
    """Shared body of las-hetero and ftf: pick jobs in fairness order, then give types by efficiency."""

    time_sharing = True
    reads_forecast = False  # (neither order reads remaining times)

    def order(self, inp: PolicyInput) -> list[JobView]:
        raise NotImplementedError

    def plan(self, inp: PolicyInput) -> Plan:
        ordered = self.order(inp)
        chosen = select_by_capacity(ordered, inp.capacity, inp)
        assigned = hetero_assign(chosen, inp.capacity, inp)
        # the chosen jobs are those assigned a type, in the order: wants over them are the wants over all
        return Plan(wants_from_assignment(chosen, assigned, inp), preempt=True, strict=False)


class LasHetero(HeteroFair):
    """Heterogeneity-aware least attained service (Gavel's max-min fairness over normalised throughput,
    realised round by round): jobs with the least service, counted in seconds on their fastest GPU type,
    run first; the chosen jobs get GPU types so that each goes where its speed relative to the other types
    is highest. Preemptive; 360 s rounds.
    """

    name = "las-hetero"

    def order(self, inp: PolicyInput) -> list[JobView]:
        jobs = inp.jobs
        arrivals = list(map(_ARRIVAL, jobs))
        if all(map(lt, arrivals, islice(arrivals, 1, None))) or _by_arrival(jobs, arrivals):
            # the jobs come in (arrival, id) order (the simulator's, as `PolicyInput.jobs` says): a stable sort by
            # service alone keeps that order among equals, which is the key's; a sort of floats runs at twice the
            # speed of one of tuples
            return sorted(jobs, key=_SERVICE)
        return sorted(jobs, key=_LAS_KEY)


_LAS_KEY = view_getter("service_s", "arrival_s", "id")
"""las-hetero's order: least normalised service, then arrival, then id (one C call a job, not a lambda)."""
_SERVICE, _ARRIVAL, _ID = view_getter("service_s"), view_getter("arrival_s"), view_getter("id")


def _by_arrival(jobs: tuple[JobView, ...], arrivals: list[float]) -> bool:
    """Whether the jobs are in (arrival, id) order, some arriving at one instant (the check above: none do): arrivals
    that never go down, and ids that go up where two arrive at once, read at those few positions alone. (Before, an
    (arrival, id) tuple for every job and their comparison: every round while two jobs that arrived together were
    active, 1 % of an ed69ec 8:8:8 replay.)"""
    if not all(map(le, arrivals, islice(arrivals, 1, None))):
        return False
    ties = compress(count(), map(eq, arrivals, islice(arrivals, 1, None)))
    return all(jobs[i].id < jobs[i + 1].id for i in ties)
