"""Which GPU type each job the policy chose gets, weighing the speed it loses by its remaining time
(`assign_types`, the `hsched` policy's; issue 33). Pure: the caller's `PolicyInput.cache` keeps its figures."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from hsched.sched.policies.base import hetero_assign
from hsched.sched.view import JobView, PolicyInput

_TYPES = "hsched.assign_types"


class _TypesMemo(NamedTuple):
    """`assign_types`'s figures kept from round to round in the caller's `PolicyInput.cache` (for one throughput
    model and one list of GPU types): each (kind, size, allowed types) as a small integer, and per level (a slow
    type, the faster ones with room) each such profile's share of speed lost there."""

    model: object
    types: tuple[str, ...]
    profiles: dict[tuple[str, int, tuple[str, ...]], int]
    keys: list[tuple[str, int, tuple[str, ...]]]
    levels: dict[tuple[str, tuple[str, ...]], dict[int, float | None]]


TIME_WEIGHT = -0.3
"""How a job's remaining time weighs in which GPU type it gets (`assign_types`): the share of speed it loses on the
slower type, times its remaining seconds to this power (0: hetero_assign's answer, decision for decision)."""


def assign_types(selected: Sequence[JobView], capacity: Mapping[str, int], inp: PolicyInput,
                 pinned: Mapping[int, str] | None = None) -> dict[int, str]:
    """A GPU type for each selected job, filling the types slowest first (as hetero_assign, Gavel's insight): the
    slowest type takes, of the jobs the faster types cannot hold, those that lose least there, counted as
    (best speed above / speed here - 1) x remaining ** TIME_WEIGHT, where remaining is the job's remaining seconds
    (`PolicyInput.forecast_s`), else the service it attained, at least one second; among equals the job already
    there, then the first in the order. `pinned` jobs keep their type and use its capacity first. Where no job has
    a remaining time, hetero_assign's answer.

    Why remaining time: hetero_assign weighs the speed lost alone. A job near its end gains its whole remaining run
    from a fast GPU, a job with weeks to go only a slice of it for now, and on a fast GPU the short one ends and
    frees it sooner: SRPT on the fastest machine (Gonzalez 1977). A small weight keeps the speed lost first (x
    R^-0.3: ten times the remaining time halves a job's claim); a weight of +1 (long jobs to the fast types, the
    seconds lost minimised now) was far worse (ed69ec 16:16:16 1.27x the bound), -1 better but less (1.139x).
    Measured with `hsched sim` (seed 0; hetero_assign -> this): ed69ec 16:16:16 avg JCT over the lower bound
    1.156 -> 1.131; 8:8:8 1.872 -> 1.836, at 600 s checkpoints 1.925 -> 1.892; 0e4a51 16:16:16 against las-hetero
    0.458 -> 0.465, at 60 s 0.345 -> 0.349; 2,000 synthetic jobs (seed 7, 0.75/h, 16:16:16) 93,014 -> 83,163 s
    (las-hetero 92,433)."""
    if not inp.forecast_s:
        # nothing is known of remaining time (no job reports a total): hetero_assign, as before issue 33 (a lab whose
        # jobs report none sees no change: tests/sim/test_decisions_pinned.py NO_TOTALS)
        return hetero_assign(selected, capacity, inp, pinned)
    caps = dict(capacity)
    out: dict[int, str] = {}
    if pinned:
        for j in selected:
            t = pinned.get(j.id)
            if t is not None and j.id not in out:
                out[j.id] = t
                caps[t] = caps.get(t, 0) - j.gpus
    todo = [j for j in selected if j.id not in out] if out else list(selected)
    all_types = inp.gpu_types
    model = inp.throughput
    memo = inp.cache.get(_TYPES)
    if not isinstance(memo, _TypesMemo) or memo.model is not model or memo.types != all_types:
        memo = _TypesMemo(model, all_types, {}, [], {})
        inp.cache[_TYPES] = memo
    profiles, keys, levels = memo.profiles, memo.keys, memo.levels
    forecast = inp.forecast_s
    pids: list[int] = []
    weights: list[float] = []
    for j in todo:
        key = (j.job_type, j.gpus, j.gpu_types)
        pid = profiles.get(key)
        if pid is None:
            pid = profiles[key] = len(keys)
            keys.append(key)
        pids.append(pid)
        left = forecast.get(j.id)
        weights.append(max(1.0, j.service_s if left is None else left) ** TIME_WEIGHT)
    types = [t for t in all_types if caps.get(t, 0) > 0]  # fastest first
    pending = list(range(len(todo)))
    left_gpus = sum(j.gpus for j in todo)
    while pending and types:
        slow, faster = types[-1], types[:-1]
        cap = caps[slow]
        # each profile's share of speed lost here, against the best of the faster types with room (the last rounds'
        # figures: they depend only on the model, the profile and the types)
        level = levels.get((slow, tuple(faster)))
        if level is None:
            level = levels[(slow, tuple(faster))] = {}
        for pid in set(pids[i] for i in pending).difference(level):
            job_type, gpus, allowed = keys[pid]
            rel = model.rel_speeds(job_type, gpus, all_types)
            here = rel.get(slow, 0.0) if not allowed or slow in allowed else 0.0
            best = max((rel.get(t, 0.0) for t in faster if not allowed or t in allowed), default=0.0)
            # None: it cannot run here; -1: it runs nowhere faster (here it goes); < 0: it is faster here
            level[pid] = None if here <= 0 else -1.0 if best <= 0 else best / here - 1.0
        if not faster:
            for i in pending:
                j = todo[i]
                if j.gpus <= cap and level[pids[i]] is not None:
                    out[j.id] = slow
                    cap -= j.gpus
            caps[slow] = cap
            break
        need = left_gpus - sum(max(0, caps[t]) for t in faster)
        costs: list[tuple[float, bool, int]] = []
        for i in pending:
            lost = level[pids[i]]
            # (among equals the job already there stays: equal jobs do not swap places every round)
            if lost is None:
                continue
            if lost == -1.0:
                costs.append((-1.0, todo[i].gpu_type != slow, i))
            elif need > 0 or lost < 0:
                # (with room above for all, only the jobs that must or would rather be here: nothing else sorted)
                costs.append((weights[i] * lost, todo[i].gpu_type != slow, i))
        costs.sort()
        taken: set[int] = set()
        for c, _moved, i in costs:
            if c >= 0 and need <= 0:
                break
            j = todo[i]
            if j.gpus <= cap:
                out[j.id] = slow
                cap -= j.gpus
                need -= j.gpus
                left_gpus -= j.gpus
                taken.add(i)
        caps[slow] = cap
        if taken:
            pending = [i for i in pending if i not in taken]
        types = faster
    return out
