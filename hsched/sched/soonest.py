"""The one reservation search: the earliest time a head fits in what is released by then. The live round's head
(hsched.sched.stages.reservation), the simulator's Slurm pool (hsched.sim.slurm) and the `backfill` policy
(hsched.sched.policies.backfill) all reserve by it. A module of its own, importing nothing, so the policies below
the stages may use it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def soonest_fit(releases: Sequence[tuple[float, T]], fits: Callable[[int], R | None], *, least: int = 1,
                   stop: Callable[[float], bool] | None = None) -> tuple[float, R] | None:
    """The reservation's search, live and in the simulator's Slurm: the earliest time at which what is released by
    then (`releases`, in time order: free now at the time now, busy at its predicted end, inf when unknown) fits the
    head, with what `fits(n)` made of the first n releases; None when nothing does. All that is released at one time
    counts together; fewer than `least` releases never fit; `stop(t)`: no start at t or later is worth a search."""
    for k in range(max(1, least) - 1, len(releases)):
        t = releases[k][0]
        if stop is not None and stop(t):
            break
        if k + 1 < len(releases) and releases[k + 1][0] <= t:
            continue  # all that is released at t together
        got = fits(k + 1)
        if got is not None:
            return t, got
    return None
