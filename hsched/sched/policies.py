"""The reference policies hsched is measured against. Each docstring's first paragraph is its README line."""

from __future__ import annotations

import math

from hsched.sched.policy import (
    OraclePolicy,
    Policy,
    fastest_types,
    hetero_assign,
    select_by_capacity,
    wants_from_assignment,
)
from hsched.sched.view import JobView, OracleInput, Plan, PolicyInput, Want, qos_rank


def _arrival_key(j: JobView) -> tuple[float, int]:
    return (j.arrival_s, j.id)


class Fifo(Policy):
    """First in, first out, heterogeneity-unaware: jobs start in arrival order, each on a GPU type picked at
    random (reproducibly, from the job id) among those with room, as Gavel's FIFO does; the head of the
    queue blocks the rest; no preemption.
    """

    name = "fifo"

    def plan(self, inp: PolicyInput) -> Plan:
        pending = sorted((j for j in inp.jobs if not j.running), key=_arrival_key)
        return Plan(tuple(Want(j.id) for j in pending), preempt=False, strict=True)


class FifoHetero(Policy):
    """FIFO that knows GPU types: jobs start in arrival order, each on the fastest GPU type (for that job)
    that has room; the head of the queue blocks the rest; no preemption.
    """

    name = "fifo-hetero"

    def plan(self, inp: PolicyInput) -> Plan:
        pending = sorted((j for j in inp.jobs if not j.running), key=_arrival_key)
        return Plan(tuple(Want(j.id, fastest_types(j, inp)) for j in pending), preempt=False, strict=True)


class Las(Policy):
    """Tiresias-style discretised two-dimensional least-attained-service: a job's service is GPUs x seconds
    run; queues at 1 h, 4 h, 16 h ... of GPU time; the lowest queue runs first, FIFO inside a queue; a job
    that has waited `starve_factor` times as long as it has run is promoted to the top queue (starvation
    guard). Preemptive and heterogeneity-unaware (a job stays on its type, else takes a
    random type with room), re-evaluated every round.
    """

    name = "las"
    time_sharing = True
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


class _HeteroFair(Policy):
    """Shared body of las-hetero and ftf: pick jobs in fairness order, then give types by efficiency."""

    time_sharing = True

    def order(self, inp: PolicyInput) -> list[JobView]:
        raise NotImplementedError

    def plan(self, inp: PolicyInput) -> Plan:
        ordered = self.order(inp)
        chosen = select_by_capacity(ordered, inp.capacity, inp)
        assigned = hetero_assign(chosen, inp.capacity, inp)
        # the chosen jobs are those assigned a type, in the order: wants over them are the wants over all
        return Plan(wants_from_assignment(chosen, assigned, inp), preempt=True, strict=False)


class LasHetero(_HeteroFair):
    """Heterogeneity-aware least attained service (Gavel's max-min fairness over normalised throughput,
    realised round by round): jobs with the least service, counted in seconds on their fastest GPU type,
    run first; the chosen jobs get GPU types so that each goes where its speed relative to the other types
    is highest. Preemptive; 360 s rounds.
    """

    name = "las-hetero"

    def order(self, inp: PolicyInput) -> list[JobView]:
        return sorted(inp.jobs, key=lambda j: (j.service_s, j.arrival_s, j.id))


class FinishTimeFairness(_HeteroFair):
    """Themis finish-time fairness, non-clairvoyant: a job's rho is its time in the system over the time an
    exclusive 1/N share of the cluster would have needed for the progress it has made; the highest rho runs
    first (new jobs have infinite rho), then types are given by efficiency as in las-hetero. Preemptive.
    """

    name = "ftf"

    def order(self, inp: PolicyInput) -> list[JobView]:
        total = max(1, sum(inp.capacity.values()))
        n = max(1, len(inp.jobs))

        def rho(j: JobView) -> float:
            share = min(1.0, total / (n * j.gpus))
            if j.service_s <= 0:
                return math.inf
            return (inp.now - j.arrival_s) * share / j.service_s

        return sorted(inp.jobs, key=lambda j: (-rho(j), j.arrival_s, j.id))


class SrtfOracle(OraclePolicy):
    """Shortest remaining time first, clairvoyant (reference only): reads each job's remaining time on its
    fastest type, which no real scheduler knows; shortest first, each on its fastest free type. Preemptive.
    """

    name = "srtf-oracle"

    def plan(self, inp: OracleInput) -> Plan:
        base = inp.base
        ordered = sorted(base.jobs, key=lambda j: (inp.remaining_s.get(j.id, math.inf), j.arrival_s, j.id))
        return Plan(tuple(Want(j.id, fastest_types(j, base)) for j in ordered), preempt=True, strict=False)


class Backfill(Policy):
    """Priority order (QoS class, then priority, then arrival) with EASY backfilling: the first job that
    does not fit gets a reservation on the GPU type where it can start soonest (from running jobs' declared
    time limits); later jobs may start now if they leave that reservation intact: they use other types, end
    (by their own limit) before it, or use only GPUs it does not need. Unknown limits never count as short.
    No preemption.
    """

    name = "backfill"

    def plan(self, inp: PolicyInput) -> Plan:
        queue = sorted(
            (j for j in inp.jobs if not j.running),
            key=lambda j: (qos_rank(j.qos), -j.priority, j.arrival_s, j.id),
        )
        free = dict(inp.capacity)
        ends: dict[str, list[tuple[float, int]]] = {t: [] for t in inp.capacity}
        for j in inp.jobs:
            if j.running and j.gpu_type is not None:
                free[j.gpu_type] = free.get(j.gpu_type, 0) - j.gpus
                end = math.inf
                if j.time_limit_s is not None and j.run_start_s is not None:
                    end = j.run_start_s + j.time_limit_s
                ends.setdefault(j.gpu_type, []).append((end, j.gpus))
        wants: list[Want] = []
        reserved: str | None = None
        shadow = math.inf
        extra = 0
        for j in queue:
            types = fastest_types(j, inp)
            fit = next((t for t in types if free.get(t, 0) >= j.gpus and t != reserved), None)
            if fit is None and reserved is not None and free.get(reserved, 0) >= j.gpus and reserved in types:
                short = j.time_limit_s is not None and inp.now + j.time_limit_s <= shadow
                if short or j.gpus <= extra:
                    fit = reserved
                    if not short:
                        extra -= j.gpus
            if fit is not None:
                wants.append(Want(j.id, (fit,)))
                free[fit] -= j.gpus
                if fit in ends:
                    end = inp.now + j.time_limit_s if j.time_limit_s is not None else math.inf
                    ends[fit].append((end, j.gpus))
                continue
            if reserved is None and types:
                reserved, shadow, extra = _reservation(j, types, free, ends, inp)
        return Plan(tuple(wants), preempt=False, strict=False)


def _reservation(
    head: JobView,
    types: tuple[str, ...],
    free: dict[str, int],
    ends: dict[str, list[tuple[float, int]]],
    inp: PolicyInput,
) -> tuple[str | None, float, int]:
    """The type where `head` can start soonest, that time (inf if unknown), and GPUs it leaves spare then."""
    best: tuple[float, int, str] | None = None
    best_extra = 0
    for t in types:
        if inp.capacity.get(t, 0) < head.gpus:
            continue
        avail = free.get(t, 0)
        when = math.inf
        for end, g in sorted(ends.get(t, [])):
            if avail >= head.gpus:
                break
            if math.isinf(end):
                break
            avail += g
            when = end
        if avail < head.gpus:
            when = math.inf
        elif free.get(t, 0) >= head.gpus:
            when = inp.now
        extra = max(0, avail - head.gpus) if not math.isinf(when) else 0
        # soonest start; with none known, the type that is closest to having room
        key = (when, -free.get(t, 0), t)
        if best is None or key < best:
            best, best_extra = key, extra
    if best is None:
        return None, math.inf, 0
    return best[2], best[0], best_extra
