"""Which GPU type each job the policy chose gets, weighing the speed it loses by its remaining time
(`assign_types`, the `hsched` policy's; issue 33). Pure: the caller's `PolicyInput.cache` keeps its figures."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from itertools import repeat
from operator import itemgetter, mul, ne
from typing import NamedTuple, cast

from hsched.sched.policies.base import hetero_assign, memo_for, view_getter
from hsched.sched.view import JobView, PolicyInput

_TYPES = "hsched.assign_types"
_PROFILE = view_getter("job_type", "gpus", "gpu_types")
_THIRD = itemgetter(2)
_ID, _GPUS, _TYPE_NOW, _SERVICE = (view_getter("id"), view_getter("gpus"), view_getter("gpu_type"),
                                   view_getter("service_s"))


class _TypesMemo(NamedTuple):
    """`assign_types`'s figures kept from round to round in the caller's `PolicyInput.cache` (for one throughput
    model and one list of GPU types): each (kind, size, allowed types) as a small integer, and per level (a slow
    type, the faster ones with room) each such profile's share of speed lost there."""

    model: object
    types: tuple[str, ...]
    profiles: dict[tuple[str, int, tuple[str, ...]], int]
    keys: list[tuple[str, int, tuple[str, ...]]]
    levels: dict[tuple[str, tuple[str, ...]], dict[int, float | None]]


def _new_types_memo(model: object, types: tuple[str, ...]) -> _TypesMemo:
    return _TypesMemo(model, types, {}, [], {})


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
    memo = cast("_TypesMemo", memo_for(inp.cache, _TYPES, model, all_types, _new_types_memo))
    profiles, keys, levels = memo.profiles, memo.keys, memo.levels
    # the jobs' fields as lists, read at C speed, once (the loops below read them by position)
    kinds = list(map(_PROFILE, todo))
    pids = list(map(profiles.get, kinds))
    if None in pids:
        for i, key in enumerate(kinds):
            if pids[i] is None:
                pid = profiles.get(key)
                if pid is None:
                    pid = profiles[key] = len(keys)
                    keys.append(key)
                pids[i] = pid
    pid_of = cast("list[int]", pids)
    ids = list(map(_ID, todo))
    sizes = list(map(_GPUS, todo))
    on = list(map(_TYPE_NOW, todo))
    # remaining seconds (else the service attained), at least one, ** TIME_WEIGHT (`x if x > 1.0 else 1.0` is
    # max(1.0, x), NaN included, without a call)
    power = TIME_WEIGHT
    weights = [(x if x > 1.0 else 1.0) ** power for x in map(inp.forecast_s.get, ids, map(_SERVICE, todo))]
    ones = sizes.count(1) == len(sizes)  # (one GPU each, Gavel's single-GPU traces: each level's walk is counted)
    types = [t for t in all_types if caps.get(t, 0) > 0]  # fastest first
    pending = list(range(len(todo)))
    left_gpus = sum(sizes)
    while pending and types:
        slow, faster = types[-1], types[:-1]
        cap = caps[slow]
        # each profile's share of speed lost here, against the best of the faster types with room (the last rounds'
        # figures: they depend only on the model, the profile and the types, so they are worked out for every profile
        # seen, once)
        level_key = (slow, tuple(faster))
        level = levels.get(level_key)
        if level is None:
            level = levels[level_key] = {}
        if len(level) < len(keys):
            for pid in range(len(keys)):
                if pid in level:
                    continue
                job_type, gpus, allowed = keys[pid]
                rel = model.rel_speeds(job_type, gpus, all_types)
                here = rel.get(slow, 0.0) if not allowed or slow in allowed else 0.0
                best = max((rel.get(t, 0.0) for t in faster if not allowed or t in allowed), default=0.0)
                # None: it cannot run here; -1: it runs nowhere faster (here it goes); < 0: it is faster here
                level[pid] = None if here <= 0 else -1.0 if best <= 0 else best / here - 1.0
        # (every job still pending, as at the first level: the lists read whole, at C speed)
        full = len(pending) == len(todo)
        lost_at = list(map(level.__getitem__, pid_of)) if full else [level[pid_of[i]] for i in pending]
        runs_all = ones and None not in (values := set(lost_at))
        if not faster and runs_all:
            # one GPU each, all of them can run here: the loop below takes the first `cap` in order
            for i in pending[:cap]:  # (a loop: dict.update of a zip goes through a pair at a time, twice as long)
                out[ids[i]] = slow
            caps[slow] = cap - min(cap, len(pending))
            break
        if not faster:
            for i, lost in zip(pending, lost_at, strict=True):
                g = sizes[i]
                if g <= cap and lost is not None:
                    out[ids[i]] = slow
                    cap -= g
            caps[slow] = cap
            break
        room_above = 0
        for t in faster:
            if caps[t] > 0:
                room_above += caps[t]
        need = left_gpus - room_above
        if runs_all and need > 0 and -1.0 not in values:
            # One GPU each, every one can run here and somewhere faster, and some must come here: every job's cost
            # is weighed (the loop below, at C speed), and the walk takes the first m of them: it stops when the type
            # is full, or at the first cost >= 0 once `need` jobs were taken (those below 0 are taken whatever the
            # need: faster here)
            ranked = sorted(
                zip(map(mul, weights, lost_at), map(ne, on, repeat(slow)), pending, strict=True) if full
                else [(weights[i] * lost, on[i] != slow, i) for i, lost in zip(pending, lost_at, strict=True)])
            m = max(0, min(cap, len(ranked), max(need, bisect_left(ranked, (0.0,)))))
            took = list(map(_THIRD, ranked[:m]))
            for i in took:
                out[ids[i]] = slow
            caps[slow] = cap - m
            left_gpus -= m
            if took:
                gone = set(took)
                pending = [i for i in pending if i not in gone]
            types = faster
            continue
        costs: list[tuple[float, bool, int]] = []
        append = costs.append
        for i, lost in zip(pending, lost_at, strict=True):
            # (among equals the job already there stays: equal jobs do not swap places every round)
            if lost is None:
                continue
            if lost == -1.0:
                append((-1.0, on[i] != slow, i))
            elif need > 0 or lost < 0:
                # (with room above for all, only the jobs that must or would rather be here: nothing else sorted)
                append((weights[i] * lost, on[i] != slow, i))
        costs.sort()
        taken: set[int] = set()
        for c, _moved, i in costs:
            if c >= 0 and need <= 0:
                break
            g = sizes[i]
            if g <= cap:
                out[ids[i]] = slow
                cap -= g
                need -= g
                left_gpus -= g
                taken.add(i)
        caps[slow] = cap
        if taken:
            pending = [i for i in pending if i not in taken]
        types = faster
    return out
