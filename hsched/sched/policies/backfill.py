"""EASY backfilling over priority order, as a policy of the core (the simulator's baseline)."""

from __future__ import annotations

import math

from hsched.sched.policies.base import (
    Policy,
    fastest_types,
)
from hsched.sched.soonest import soonest_fit
from hsched.sched.view import JobView, Plan, PolicyInput, Want, qos_rank


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
    """The type where `head` can start soonest, that time (inf if unknown), and GPUs it leaves spare then: per type,
    the one reservation search (`soonest_fit`) over what is free now and what each running job frees at its end."""
    best: tuple[float, int, str] | None = None
    best_extra = 0
    for t in types:
        if inp.capacity.get(t, 0) < head.gpus:
            continue
        releases = [(inp.now, free.get(t, 0)), *sorted(ends.get(t, []))]

        def fits(n: int, releases: list[tuple[float, int]] = releases) -> int | None:
            got = sum(g for _end, g in releases[:n])
            return got - head.gpus if got >= head.gpus else None

        found = soonest_fit(releases, fits, stop=math.isinf)
        when, extra = found if found is not None else (math.inf, 0)
        # soonest start; with none known, the type that is closest to having room
        key = (when, -free.get(t, 0), t)
        if best is None or key < best:
            best, best_extra = key, extra
    if best is None:
        return None, math.inf, 0
    return best[2], best[0], best_extra
