"""Predictions: how long a job will run, when a running one will end, when a waiting one would start.

* **Remaining time of a running job**: from its progress when it reports a `total` (steps left over its
  current speed); else from its kind's history: the expected duration minus what it has run (none once it
  has run longer than that: the history has nothing to say about it any more).
* **Expected duration of a job**: the median of the last HISTORY runs of the same kind by the same user
  (at least TRUST of them), else of the kind by anyone, else none (Helios's and QSSF's observation: a user's
  repeated jobs of one kind take about as long as the last ones did). Durations are running time (all the
  job's attempts), of jobs that completed.
* **Earliest start of a waiting job** (`submit --test-only`): a timeline of the fleet's free GPUs per node, the
  running jobs ending at their predicted ends and the jobs ahead of it in the queue starting where they fit
  and running for their expected durations (a job ahead whose duration nobody knows blocks what it holds for
  good: "unknown"). The first moment the job fits is its predicted start.

Pure: no I/O. hsched.controller.learning keeps the history and records how wrong the predictions were.
"""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

HISTORY = 10
"""The last runs a prediction looks at: recent enough to follow a kind that changes."""
TRUST = 2
"""Fewer runs than this of a (user, kind) and the kind's runs by anyone are used instead."""


def expected_duration(mine: Sequence[float], everyone: Sequence[float]) -> float | None:
    """Median running time of the user's last runs of the kind, else everyone's, else None."""
    for history in (mine, everyone):
        recent = list(history)[-HISTORY:]
        if len(recent) >= TRUST:
            return float(statistics.median(recent))
    return None


def remaining(elapsed_s: float, expected_s: float | None, step: float | None = None, total: float | None = None,
              steps_per_s: float | None = None) -> float | None:
    """Seconds a running job still needs: from its progress when it can tell, else from its expected
    duration; None when neither can."""
    if step is not None and total is not None and steps_per_s and total >= step:
        return (total - step) / steps_per_s
    if expected_s is not None and expected_s >= elapsed_s:
        return expected_s - elapsed_s
    return None


@dataclass(frozen=True, slots=True)
class Holding:
    """A running job in the timeline: what it holds, until when (None: nobody knows)."""

    job_id: int
    gpus_by_node: Mapping[str, int]
    end_s: float | None


@dataclass(frozen=True, slots=True)
class Ahead:
    """A waiting job served before the one asked about: GPUs per node (one node unless `nodes` > 1) and how
    long it would run (None: unknown)."""

    job_id: int
    gpus: int
    nodes: int
    duration_s: float | None


@dataclass(frozen=True, slots=True)
class StartGuess:
    start_s: float | None
    """When it would start (None: not predictable: something it waits for has no predicted end)."""
    waits_for: tuple[int, ...]
    """The jobs whose ends (or starts) decide it: what to say to the user."""


def _fit(free: Mapping[str, int], gpus: int, nodes: int) -> dict[str, int] | None:
    """Where `nodes` nodes of `gpus` free GPUs each are (the fullest first, as best-fit), or None."""
    fits = sorted((n for n, f in free.items() if f >= gpus), key=lambda n: (free[n], n))
    if len(fits) < nodes:
        return None
    return {n: gpus for n in fits[:nodes]}


def earliest_start(now: float, free: Mapping[str, int], running: Sequence[Holding], ahead: Sequence[Ahead],
                   gpus: int, nodes: int = 1, *, usable: Sequence[str] | None = None) -> StartGuess:
    """When a job of `gpus` GPUs on each of `nodes` nodes would start (see the module docstring). `free`:
    free GPUs per node now; `usable`: the nodes it may run on (None: all)."""
    state = dict(free)
    ok = set(usable) if usable is not None else None
    ends: list[tuple[float, int, dict[str, int]]] = []
    blocked: list[int] = []
    for h in running:
        if h.end_s is None:
            blocked.append(h.job_id)
        else:
            heapq.heappush(ends, (max(now, h.end_s), h.job_id, dict(h.gpus_by_node)))
    queue = list(ahead)
    t = now
    decided: list[int] = []
    while True:
        # the jobs ahead start, in order, where they fit now (a job that does not fit waits; later ones may
        # still start: the round skips what does not fit)
        still: list[Ahead] = []
        for a in queue:
            where = _fit(state, a.gpus, a.nodes)
            if where is None:
                still.append(a)
                continue
            for n, g in where.items():
                state[n] -= g
            if a.duration_s is None:
                blocked.append(a.job_id)
            else:
                heapq.heappush(ends, (t + a.duration_s, a.job_id, where))
        queue = still
        mine = {n: f for n, f in state.items() if ok is None or n in ok}
        if _fit(mine, gpus, nodes) is not None:
            return StartGuess(t, tuple(decided))
        if not ends:
            return StartGuess(None, tuple(blocked + [a.job_id for a in queue]))
        t, jid, held = heapq.heappop(ends)
        decided.append(jid)
        for n, g in held.items():
            state[n] = state.get(n, 0) + g
        # every end at the same moment frees its GPUs before anyone starts
        while ends and ends[0][0] <= t:
            _t, jid, held = heapq.heappop(ends)
            decided.append(jid)
            for n, g in held.items():
                state[n] = state.get(n, 0) + g


def starts(now: float, free: Mapping[str, int], running: Sequence[Holding], queue: Sequence[Ahead],
           usable: Mapping[int, Sequence[str]] | None = None) -> dict[int, float | None]:
    """When each waiting job of `queue` (in the order they are served) would start on one timeline (squeue
    --start): jobs start in order where they fit, run for their expected durations (one without blocks what it
    holds for good), running jobs end when predicted; None for a job that never fits on it. `usable`: job id ->
    the nodes it may run on (a job not there: any)."""
    state = dict(free)
    ends: list[tuple[float, int, dict[str, int]]] = []
    for h in running:
        if h.end_s is not None:
            heapq.heappush(ends, (max(now, h.end_s), h.job_id, dict(h.gpus_by_node)))
    waiting = list(queue)
    out: dict[int, float | None] = {}
    t = now
    while waiting:
        still = []
        for a in waiting:
            ok = set(usable[a.job_id]) if usable is not None and a.job_id in usable else None
            where = _fit({n: f for n, f in state.items() if ok is None or n in ok}, a.gpus, a.nodes)
            if where is None:
                still.append(a)
                continue
            out[a.job_id] = t
            for n, g in where.items():
                state[n] -= g
            if a.duration_s is not None:
                heapq.heappush(ends, (t + a.duration_s, a.job_id, where))
        waiting = still
        if not waiting or not ends:
            break
        t = ends[0][0]
        while ends and ends[0][0] <= t:
            _t, _jid, held = heapq.heappop(ends)
            for n, g in held.items():
                state[n] = state.get(n, 0) + g
    for a in waiting:
        out[a.job_id] = None
    return out
