"""A round's grants at C speed where the plan's first choices all fit (`first_choices`; hsched.sched.round's loop
decides otherwise)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from operator import attrgetter, itemgetter

from hsched.sched.view import JobView, Want

_WANT_ID, _WANT_TYPES, _FIRST = itemgetter(0), itemgetter(1), itemgetter(0)
_ALLOWED, _SIZE = attrgetter("gpu_types"), attrgetter("gpus")


def first_choices(wants: Sequence[Want], jobs: Mapping[int, JobView], fixed: set[int],
                   caps: dict[str, int]) -> dict[int, str] | None:
    """The grants of `_apply_plan`'s loop when every wanted job gets the first type it names (the usual full round: a
    heterogeneity-aware plan names the type its assignment gave, and gave no type more jobs than it holds), worked
    out at C speed: each wanted job there, once, not fixed, free to use any type, and each type named first by jobs
    that need no more GPUs than it has. Then no job finds its first type full (those before it that took the type
    named it first too), so the loop would grant each its first type, in order, and nothing else. `caps` loses
    what they take. None: not so; the loop decides."""
    if not wants or not all(map(_WANT_TYPES, wants)):
        return None
    ids = list(map(_WANT_ID, wants))
    if not all(map(jobs.__contains__, ids)) or len(set(ids)) < len(ids) or (fixed and not fixed.isdisjoint(ids)):
        return None
    views = list(map(jobs.__getitem__, ids))
    if any(map(_ALLOWED, views)):
        return None
    firsts = list(map(_FIRST, map(_WANT_TYPES, wants)))
    sizes = list(map(_SIZE, views))
    if sizes.count(1) == len(sizes):
        demand: dict[str, int] = Counter(firsts)
    else:
        demand = {}
        for t, g in zip(firsts, sizes, strict=True):
            demand[t] = demand.get(t, 0) + g
    for t, d in demand.items():
        if d > caps.get(t, 0):
            return None
    for t, d in demand.items():
        caps[t] -= d
    return dict(zip(ids, firsts, strict=True))
