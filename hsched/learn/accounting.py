"""Accounting (sacct's role), as pure functions: which jobs a time window holds, and GPU-hours by user and by
GPU model from the runs' placements and durations.

A job is in the window [since, until] when it was submitted before `until` and had not ended before
`since` (sacct's default: jobs eligible or running in the window). A run's GPU-time is its devices times its
duration, clipped to the window; a run still going counts up to `now`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hsched.model import Job, Run


def in_window(job: Job, since: float | None, until: float | None) -> bool:
    if until is not None and job.submit_time > until:
        return False
    return not (since is not None and job.end_time is not None and job.end_time < since)


def run_gpu_seconds(run: Run, since: float | None, until: float | None, now: float) -> float:
    if run.start_time is None:
        return 0.0
    start = max(run.start_time, since) if since is not None else run.start_time
    end = run.end_time if run.end_time is not None else now
    if until is not None:
        end = min(end, until)
    return max(0.0, end - start) * len(run.devices)


@dataclass(frozen=True, slots=True)
class Usage:
    by_user: tuple[tuple[str, float], ...]
    """(user, GPU-hours), most first."""
    by_model: tuple[tuple[str, float], ...]
    """(GPU model, GPU-hours), most first."""
    total_gpu_hours: float


def usage(jobs: Sequence[Job], runs: Mapping[int, Sequence[Run]], model_of: Mapping[str, str],
          since: float | None, until: float | None, now: float) -> Usage:
    """GPU-hours in the window by user and by GPU model (`model_of`: device UUID -> model; a device no
    longer in the fleet counts as "unknown")."""
    users: dict[str, float] = {}
    models: dict[str, float] = {}
    for job in jobs:
        for run in runs.get(job.id, ()):
            secs = run_gpu_seconds(run, since, until, now)
            if secs <= 0:
                continue
            users[job.user] = users.get(job.user, 0.0) + secs / 3600
            per_device = secs / 3600 / max(1, len(run.devices))
            for uuid in run.devices:
                m = model_of.get(uuid, "unknown")
                models[m] = models.get(m, 0.0) + per_device
    total = sum(users.values())
    return Usage(tuple(sorted(users.items(), key=lambda kv: -kv[1])),
                 tuple(sorted(models.items(), key=lambda kv: -kv[1])), total)
