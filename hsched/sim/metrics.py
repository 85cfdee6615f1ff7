"""Per-job records, the run summary, and the lower bounds every result is compared against.

JCT is completion minus arrival. Lower bounds (valid for any scheduler on the same fleet):
  * average JCT >= mean over jobs of the runtime on the job's fastest GPU type, and also >= the average
    JCT of preemptive SRPT on one machine as fast as the whole cluster (each job's size being GPUs x its
    fastest runtime, the machine doing `total GPUs` of that per second); the larger of the two is reported.
  * makespan >= the latest arrival plus fastest runtime, and >= for every arrival time a, a plus the work
    arriving at or after a divided by the cluster's capacity.
"""

from __future__ import annotations

import csv
import dataclasses
import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hsched.sim.trace import TraceJob


@dataclass(frozen=True, slots=True)
class JobRecord:
    id: int
    name: str
    job_type: str
    gpus: int
    arrival_s: float
    start_s: float
    end_s: float
    jct_s: float
    queue_s: float
    run_s: float
    restarts: int
    migrations: int
    last_gpu_type: str
    fastest_runtime_s: float
    ftf_rho: float
    overhead_s: float
    copy_s: float = 0.0
    """Seconds the job held its GPUs waiting for its data to be copied (hsched.sim.data), over all its starts."""
    pool: str = ""
    """The Slurm pool its last run was handed over to (hsched.sim.slurm); "" on the workstations."""
    slurm_wait_s: float = 0.0
    """Seconds from hand-over to Slurm's start, over its runs in the pool (submit latency and Slurm's queue)."""


@dataclass(frozen=True, slots=True)
class SimResult:
    summary: dict[str, Any]
    records: tuple[JobRecord, ...]
    busy: tuple[tuple[float, int], ...] = ()
    """GPUs held over time: (simulated second, GPUs held from then on), one entry per change."""

    def write_jobs_csv(self, path: Path) -> None:
        fields = [f.name for f in dataclasses.fields(JobRecord)]
        with path.open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(fields)
            for r in self.records:
                w.writerow([getattr(r, k) for k in fields])


def _pct(sorted_vals: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation, so the value is one a job actually had)."""
    if not sorted_vals:
        return 0.0
    k = max(0, min(len(sorted_vals) - 1, math.ceil(q / 100.0 * len(sorted_vals)) - 1))
    return sorted_vals[k]


def srpt_single_machine_avg_jct(arrivals: Sequence[float], sizes: Sequence[float]) -> float:
    """Average JCT of preemptive shortest-remaining-processing-time on one unit-speed machine."""
    n = len(arrivals)
    if n == 0:
        return 0.0
    order = sorted(range(n), key=lambda i: arrivals[i])
    heap: list[tuple[float, int]] = []
    t = 0.0
    total = 0.0
    k = 0
    while k < n or heap:
        if not heap:
            t = max(t, arrivals[order[k]])
        while k < n and arrivals[order[k]] <= t:
            i = order[k]
            heapq.heappush(heap, (sizes[i], i))
            k += 1
        rem, i = heapq.heappop(heap)
        next_arrival = arrivals[order[k]] if k < n else math.inf
        if t + rem <= next_arrival:
            t += rem
            total += t - arrivals[i]
        else:
            heapq.heappush(heap, (rem - (next_arrival - t), i))
            t = next_arrival
    return total / n


def lower_bounds(jobs: Sequence[TraceJob], fastest_rates: Sequence[float], total_gpus: int) -> tuple[float, float]:
    """(average-JCT bound, makespan bound) for the runnable jobs on a fleet of `total_gpus`."""
    if not jobs:
        return 0.0, 0.0
    fastest = [j.work / r for j, r in zip(jobs, fastest_rates, strict=True)]
    per_job = sum(fastest) / len(jobs)
    sizes = [f * j.gpus / total_gpus for f, j in zip(fastest, jobs, strict=True)]
    srpt = srpt_single_machine_avg_jct([j.arrival_s for j in jobs], sizes)
    last = max(j.arrival_s + f for j, f in zip(jobs, fastest, strict=True))
    by_arrival = sorted(zip((j.arrival_s for j in jobs), sizes, strict=True))
    tail = 0.0
    work_bound = 0.0
    for a, size in reversed(by_arrival):
        tail += size
        work_bound = max(work_bound, a + tail)
    return max(per_job, srpt), max(last, work_bound)


def summarize(
    records: Sequence[JobRecord],
    *,
    policy: str,
    trace: str,
    capacity: Mapping[str, int],
    unschedulable: Sequence[tuple[int, str, str]],
    unfinished: Sequence[int],
    rounds: int,
    preemptions: int,
    busy_gpu_s: float,
    lost_gpu_s: float,
    end_s: float,
    lower_bound_avg_jct_s: float,
    lower_bound_makespan_s: float,
    wall_s: float,
    busy: Sequence[tuple[float, int]] = (),
    prior_rate_jobs: int = 0,
) -> SimResult:
    """The summary `hsched sim --json` prints (field names are part of the CLI contract)."""
    jcts = sorted(r.jct_s for r in records)
    n = len(records)
    avg = sum(jcts) / n if n else 0.0
    makespan = max((r.end_s for r in records), default=0.0)
    total_gpus = sum(capacity.values())
    span = max(makespan, end_s)
    summary: dict[str, Any] = {
        "policy": policy,
        "trace": trace,
        "cluster": dict(capacity),
        "jobs": n,
        "unschedulable_jobs": len(unschedulable),
        "unschedulable": [{"id": i, "name": name, "reason": why} for i, name, why in unschedulable],
        "unfinished_jobs": len(unfinished),
        "prior_rate_jobs": prior_rate_jobs,
        "avg_jct_s": avg,
        "p50_jct_s": _pct(jcts, 50),
        "p95_jct_s": _pct(jcts, 95),
        "p99_jct_s": _pct(jcts, 99),
        "avg_queue_s": sum(r.queue_s for r in records) / n if n else 0.0,
        "makespan_s": makespan,
        "utilization": busy_gpu_s / (total_gpus * span) if span > 0 and total_gpus else 0.0,
        "preemptions": preemptions,
        "migrations": sum(r.migrations for r in records),
        "gpu_hours_lost": lost_gpu_s / 3600.0,
        "max_ftf_rho": max((r.ftf_rho for r in records), default=0.0),
        "avg_ftf_rho": sum(r.ftf_rho for r in records) / n if n else 0.0,
        "lower_bound_avg_jct_s": lower_bound_avg_jct_s,
        "lower_bound_makespan_s": lower_bound_makespan_s,
        "avg_jct_over_bound": avg / lower_bound_avg_jct_s if lower_bound_avg_jct_s > 0 else None,
        "makespan_over_bound": makespan / lower_bound_makespan_s if lower_bound_makespan_s > 0 else None,
        "rounds": rounds,
        "wall_s": wall_s,
    }
    return SimResult(summary, tuple(records), tuple(busy))
