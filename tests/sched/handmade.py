"""Tiny hand-made traces for policy tests: two GPU types, rates chosen so every answer is checkable by hand."""

from __future__ import annotations

from hsched.sched.throughput import ThroughputModel
from hsched.sim.trace import Trace, TraceJob

# "fast" runs everything at 2 work/s; on "slow", A keeps half its speed and B only a quarter.
TABLE = {
    "fast": {("A", 1): 2.0, ("B", 1): 2.0, ("G", 2): 4.0, ("G", 4): 4.0},
    "slow": {("A", 1): 1.0, ("B", 1): 0.5, ("G", 2): 2.0, ("G", 4): 2.0},
}


def model() -> ThroughputModel:
    # prior: fast before slow, so type order is deterministic
    return ThroughputModel(TABLE, prior={"fast": 2.0, "slow": 1.0})


def trace(*jobs: tuple) -> Trace:
    """jobs: (job_type, gpus, arrival_s, work[, time_limit_s])."""
    out = []
    for i, j in enumerate(jobs):
        limit = j[4] if len(j) > 4 else None
        out.append(TraceJob(i, j[0], j[1], j[2], j[3], name=f"j{i}", time_limit_s=limit))
    return Trace(tuple(out), model(), "hand-made", "steps")
