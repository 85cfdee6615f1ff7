"""Job efficiency (seff's role), as pure functions: the report `hsched eff` prints from a job's runs and the
usage tallies its monitoring samples were folded into (hsched.learn.tallies).

CPU and memory efficiency are seff's: CPU time used / (cores allocated x elapsed), and memory peak / memory
requested, per attempt and for the whole job, from each run's cgroup (hsched/node/cgroupstats.py: every process
of the run, read while it runs and once more at its end). Cores allocated are the job's --cpus, else its share
of the node's cores (the share of the node's GPUs it held; all of them on a node without GPUs); memory requested
its --mem, else its share of the node's memory likewise. A node that gave a run no cgroup reads its processes'
accounting instead (said as the figure's `source`); one that gave nothing leaves the older floor: the CPU and
resident memory of the processes the GPU tool lists (`gpu processes`).

A figure no sample carried (a node without a GPU tool, a tally lost with a controller restart before the run
ended) is None, shown as "no samples", never 0. Simulated GPUs' readings are made up: their figures stay None
and say so, though their samples are counted (the same count the profile shows).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hsched.learn.tallies import GAP_S, IDLE_UTIL_PCT, DeviceTally, RunTally, UsageTally, fold, fold_usage, samples_of
from hsched.model import Job, Run
from hsched.serialize import iso

__all__ = [
    "GAP_S",
    "IDLE_UTIL_PCT",
    "Allocation",
    "DeviceTally",
    "Figures",
    "GpuFigures",
    "RunTally",
    "UsageTally",
    "allocation",
    "figures",
    "figures_to_dict",
    "fold",
    "fold_usage",
    "report",
    "samples_of",
]

# ------------------------------------------------------------------------------------------------- report


@dataclass(frozen=True, slots=True)
class GpuFigures:
    uuid: str
    node: str
    utilization_mean: float | None
    """Mean utilization %, None: no sample read it."""
    memory_peak_mib: int | None
    memory_total_mib: int | None
    samples: int


@dataclass(frozen=True, slots=True)
class Figures:
    """What the samples say about one run (or the whole job): each figure None where no sample carried it."""

    gpus: tuple[GpuFigures, ...]
    utilization_mean: float | None
    """Over every sample of every GPU held (an idle GPU pulls it down, as it should)."""
    cpu_s: float | None
    """CPU-seconds: the runs' cgroups' (or process accounting's) where any was read, else the GPU processes'."""
    cpu_covered_s: float
    """The seconds the GPU processes' CPU readings cover (0 with a cgroup's figure: it covers the whole run)."""
    host_memory_peak_mib: int | None
    """The most memory the runs held at once on their nodes (a gang's nodes and ranks are summed): the cgroups'
    peak where read, else the GPU processes' resident memory."""
    samples: int
    """Node samples folded in (hsched.learn.tallies.samples_of: the count the profile shows)."""
    source: str | None = None
    """Where cpu_s and host_memory_peak_mib come from: "cgroup", "processes" (the run's process accounting, no
    cgroup), "gpu processes" (the GPU tool's process list, a floor), None (nothing)."""
    simulated: bool = False
    """Some GPU readings were made up (simulated GPUs): left out of the GPU figures, counted in `samples`."""
    final: bool = False
    """Every run's last reading (at its end) is in: the figures are the whole run's."""

    def busiest(self) -> GpuFigures | None:
        read = [g for g in self.gpus if g.utilization_mean is not None]
        return max(read, key=lambda g: (g.utilization_mean or 0.0, g.uuid)) if read else None

    def idlest(self) -> GpuFigures | None:
        read = [g for g in self.gpus if g.utilization_mean is not None]
        return min(read, key=lambda g: (g.utilization_mean or 0.0, g.uuid)) if read else None

    def memory_peak(self) -> GpuFigures | None:
        """The GPU that came nearest to its total (by share where the total is known, else by MiB)."""
        read = [g for g in self.gpus if g.memory_peak_mib is not None]
        if not read:
            return None
        return max(read, key=lambda g: ((g.memory_peak_mib or 0) / g.memory_total_mib if g.memory_total_mib
                                        else 0.0, g.memory_peak_mib or 0, g.uuid))


def _usage_of(tallies: Sequence[RunTally]) -> tuple[float | None, float | None, str | None, bool]:
    """(CPU-seconds, memory peak MiB, source, all final) of the runs' cgroup readings: CPU summed over every run;
    the peak per attempt summed over its nodes and ranks (a floor of what they held at once is their sum only
    if they peaked together: an upper bound, as Slurm's per-node sum), the highest attempt's."""
    cpu: float | None = None
    peaks: dict[int, float] = {}
    sources: set[str] = set()
    final = True
    for t in tallies:
        for u in t.usage.values():
            if u.cpu_s is not None:
                cpu = (cpu or 0.0) + u.cpu_s
            if u.memory_peak_mib is not None:
                peaks[t.attempt] = peaks.get(t.attempt, 0.0) + u.memory_peak_mib
            if u.source:
                sources.add(u.source)
            final = final and u.final
    if cpu is None and not peaks:
        return None, None, None, False
    # one run without a cgroup makes the whole a process-accounting figure
    source = "processes" if "processes" in sources else "cgroup"
    return cpu, max(peaks.values()) if peaks else None, source, final


def figures(tallies: Iterable[RunTally]) -> Figures:
    """The figures of these tallies together (one run's nodes, or every run of a job). Simulated GPU readings are
    left out of the GPU figures (made up, not sampled), and counted in `samples`."""
    tallies = list(tallies)
    measured = [t for t in tallies if not t.simulated]
    devs: dict[tuple[str, str], list[DeviceTally]] = {}
    cpu_s = 0.0
    covered = 0.0
    peaks: dict[int, int] = {}  # attempt -> summed per-node host memory peaks of the GPU processes
    for t in measured:
        for uuid, d in t.devices.items():
            devs.setdefault((t.node, uuid), []).append(d)
        cpu_s += t.cpu_s
        covered += t.cpu_covered_s
        if t.host_memory_peak_mib is not None:
            peaks[t.attempt] = peaks.get(t.attempt, 0) + t.host_memory_peak_mib
    gpus = []
    util_sum, util_n = 0.0, 0
    for (node, uuid), ds in sorted(devs.items()):
        n = sum(d.util_samples for d in ds)
        s = sum(d.util_sum for d in ds)
        util_sum, util_n = util_sum + s, util_n + n
        peak = None
        for d in ds:
            if d.memory_peak_mib is not None:
                peak = d.memory_peak_mib if peak is None else max(peak, d.memory_peak_mib)
        total = next((d.memory_total_mib for d in ds if d.memory_total_mib is not None), None)
        gpus.append(GpuFigures(uuid, node, s / n if n else None, peak, total, sum(d.samples for d in ds)))
    run_cpu, run_peak, source, final = _usage_of(tallies)
    gpu_procs = covered > 0 or bool(peaks)
    if source is None and gpu_procs:
        source = "gpu processes"
    return Figures(tuple(gpus), util_sum / util_n if util_n else None,
                   run_cpu if run_cpu is not None else cpu_s if covered > 0 else None,
                   0.0 if run_cpu is not None else covered,
                   round(run_peak) if run_peak is not None else max(peaks.values()) if peaks else None,
                   samples_of(tallies), source, any(t.simulated for t in tallies), final)


@dataclass(frozen=True, slots=True)
class Allocation:
    """What a job held over some time: the denominators of its CPU and memory efficiency."""

    core_s: float | None
    """Cores allocated x elapsed seconds, summed over its nodes (and attempts)."""
    cores: int | None
    """Cores allocated (summed over the nodes of one attempt; the largest attempt's for a whole job)."""
    cores_from: str
    """"asked" (--cpus), "node share" (its share of the node's cores), "" (unknown)."""
    memory_mib: float | None
    memory_from: str
    elapsed_s: float


NodeFacts = tuple[int | None, int | None, int]
"""A node's (cores, memory MiB, GPUs), as the fleet knows it."""


def allocation(job: Job, held: Mapping[str, int], elapsed_s: float, nodes: Mapping[str, NodeFacts]) -> Allocation:
    """The allocation of one attempt of `job` that held `held` (node -> GPUs there) for `elapsed_s`: --cpus and
    --mem per node where asked, else the node's share, the share of its GPUs held (the whole node without GPUs).
    None where neither is known (a node gone from the fleet, a job that asked nothing)."""
    res = job.spec.resources
    cores_total: int | None = 0
    mem_total: float | None = 0.0
    for node, gpus in held.items():
        n_cores, n_mem, n_gpus = nodes.get(node, (None, None, 0))
        share = gpus / n_gpus if n_gpus and gpus else 1.0
        c = res.cpus if res.cpus else (max(1, round(n_cores * share)) if n_cores else None)
        m = float(res.memory_mib) if res.memory_mib else (n_mem * share if n_mem else None)
        cores_total = None if c is None or cores_total is None else cores_total + c
        mem_total = None if m is None or mem_total is None else mem_total + m
    if not held:
        cores_total = mem_total = None
    return Allocation(None if cores_total is None else cores_total * elapsed_s, cores_total,
                      "asked" if res.cpus else "node share" if cores_total is not None else "",
                      mem_total, "asked" if res.memory_mib else "node share" if mem_total is not None else "",
                      elapsed_s)


def figures_to_dict(f: Figures, cpus: int | None, memory_mib: int | None,
                    alloc: Allocation | None = None) -> dict[str, Any]:
    """The JSON of `hsched eff --json` for one set of figures; `alloc`: what was allocated over the time they
    cover (the denominators of CPU and memory efficiency); without it (or for the GPU processes' floor),
    `cpus` and `memory_mib`: what the job asked for on each node (None: nothing asked)."""

    def gpu(g: GpuFigures | None) -> dict[str, Any] | None:
        return None if g is None else {"uuid": g.uuid, "node": g.node, "mean": _r(g.utilization_mean)}

    peak = f.memory_peak()
    cpu: dict[str, Any] | None = None
    host: dict[str, Any] | None = None
    whole_run = f.source in ("cgroup", "processes")
    if f.cpu_s is not None and whole_run and alloc is not None:
        cores = f.cpu_s / alloc.elapsed_s if alloc.elapsed_s > 0 else None
        cpu = {"used_s": _r(f.cpu_s), "covered_s": _r(alloc.elapsed_s), "cores_mean": _r(cores, 2),
               "cpus": alloc.cores, "cpus_from": alloc.cores_from, "core_s": _r(alloc.core_s),
               "efficiency": _r(f.cpu_s / alloc.core_s, 4) if alloc.core_s else None, "source": f.source}
    elif f.cpu_s is not None and f.cpu_covered_s > 0:
        cores = f.cpu_s / f.cpu_covered_s
        cpu = {"used_s": _r(f.cpu_s), "covered_s": _r(f.cpu_covered_s), "cores_mean": _r(cores, 2),
               "cpus": cpus, "cpus_from": "asked" if cpus else "", "efficiency": _r(cores / cpus, 4) if cpus else None,
               "source": f.source}
    if f.host_memory_peak_mib is not None:
        asked = (alloc.memory_mib, alloc.memory_from) if whole_run and alloc is not None else (
            memory_mib, "asked" if memory_mib else "")
        host = {"peak_mib": f.host_memory_peak_mib, "requested_mib": round(asked[0]) if asked[0] else None,
                "requested_from": asked[1], "ratio": _r(f.host_memory_peak_mib / asked[0], 4) if asked[0] else None,
                "source": f.source}
    return {
        "samples": f.samples,
        "simulated": f.simulated,
        "final": f.final,
        "gpu_utilization": None if f.utilization_mean is None else {
            "mean": _r(f.utilization_mean), "busiest": gpu(f.busiest()), "idlest": gpu(f.idlest())},
        "gpu_memory": None if peak is None else {
            "peak_mib": peak.memory_peak_mib, "total_mib": peak.memory_total_mib, "uuid": peak.uuid,
            "ratio": _r(peak.memory_peak_mib / peak.memory_total_mib, 4)
            if peak.memory_peak_mib is not None and peak.memory_total_mib else None},
        "cpu": cpu,
        "host_memory": host,
        "devices": [{"uuid": g.uuid, "node": g.node, "utilization_mean": _r(g.utilization_mean),
                  "memory_peak_mib": g.memory_peak_mib, "memory_total_mib": g.memory_total_mib,
                  "samples": g.samples} for g in f.gpus],
    }


def _r(v: float | None, digits: int = 1) -> float | None:
    return None if v is None else round(v, digits)


def report(job: Job, runs: Sequence[Run], tallies: Sequence[RunTally], now: float,
           idle_after_s: float | None = None, flagged: Collection[int] = (),
           nodes: Mapping[str, NodeFacts] | None = None) -> dict[str, Any]:
    """`hsched eff`'s fields for `job`: each attempt's state, exit code, elapsed time, GPUs and GPU-hours with
    its figures and profile (hsched.learn.profiles; `flagged`: the attempts flagged idle now), and the whole job's (its
    profile: the last attempt's). A running attempt counts up to `now`. `nodes`: the fleet's node facts, for the
    share of a node a job that asked no --cpus or --mem held."""
    from hsched.learn.profiles import IDLE_AFTER_S, characterize

    res = job.spec.resources
    nodes = nodes or {}
    profile: dict[str, Any] | None = None
    attempts: dict[int, list[Run]] = {}
    for r in runs:
        attempts.setdefault(r.attempt, []).append(r)
    out_runs = []
    elapsed_total = gpu_s_total = core_s_total = covered_total = 0.0
    core_s_known = True
    best_mem: tuple[float, Allocation] | None = None
    for attempt, ranks in sorted(attempts.items()):
        starts = [r.start_time for r in ranks if r.start_time is not None]
        ended = all(r.end_time is not None for r in ranks)
        start = min(starts) if starts else None
        end = max(r.end_time for r in ranks if r.end_time is not None) if ended and ranks else None
        if start is not None and end is not None:
            end = max(start, end)  # a last guard: an end is never before its start (hsched.controller.ending)
        elapsed = max(0.0, (end if end is not None else now) - start) if start is not None else 0.0
        # ranks on one node share its GPUs (--tasks-per-node): each GPU counts once
        held = {(r.node, u) for r in ranks for u in r.devices}
        gpu_s = elapsed * len(held)
        elapsed_total += elapsed
        gpu_s_total += gpu_s
        per_node = {r.node: 0 for r in ranks}
        for node, _u in held:
            per_node[node] += 1
        mine = [t for t in tallies if t.attempt == attempt]
        # a running attempt's cgroup figures are as of their latest reading (every few seconds): its efficiency
        # is over the time up to then, not up to `now`
        read_t = max((u.last_t for t in mine for u in t.usage.values() if u.last_t is not None), default=None)
        covered = (elapsed if ended or read_t is None or start is None
                   else min(elapsed, max(0.0, read_t - start)))
        alloc = allocation(job, per_node, covered, nodes)
        covered_total += covered
        if alloc.core_s is None:
            core_s_known = False
        else:
            core_s_total += alloc.core_s
        lead = min(ranks, key=lambda r: (r.rank, r.id))
        failed = [r for r in ranks if r.exit_code not in (None, 0)]
        fig = figures(mine)
        if fig.host_memory_peak_mib is not None and alloc.memory_mib and (
                best_mem is None or fig.host_memory_peak_mib > best_mem[0]):
            best_mem = (fig.host_memory_peak_mib, alloc)  # the job's peak is its highest attempt's
        profile = characterize(mine, None if ended else now,
                               IDLE_AFTER_S if idle_after_s is None else idle_after_s).to_dict()
        profile["flagged"] = attempt in flagged
        out_runs.append({
            "attempt": attempt, "nodes": sorted({r.node for r in ranks}), "ranks": len(ranks),
            "state": str(lead.state), "reason": lead.reason,
            "exit_code": failed[0].exit_code if failed else lead.exit_code,
            "start_time": iso(start), "end_time": iso(end), "elapsed_s": round(elapsed, 1), "ended": ended,
            "gpus": len(held), "gpu_hours": round(gpu_s / 3600, 4),
            **figures_to_dict(fig, res.cpus, res.memory_mib, alloc), "profile": profile})
    # the whole job: CPU over every attempt's allocation, memory against the allocation of its highest attempt
    whole = Allocation(core_s_total if core_s_known and attempts else None,
                       max((r["cpu"]["cpus"] for r in out_runs if r["cpu"] and r["cpu"].get("cpus")), default=None),
                       out_runs[-1]["cpu"]["cpus_from"] if out_runs and out_runs[-1]["cpu"] else "",
                       best_mem[1].memory_mib if best_mem else None, best_mem[1].memory_from if best_mem else "",
                       covered_total)
    return {"elapsed_s": round(elapsed_total, 1), "gpu_hours": round(gpu_s_total / 3600, 4),
            "cpus": res.cpus, "memory_mib": res.memory_mib, "runs": out_runs, "profile": profile,
            **figures_to_dict(figures(tallies), res.cpus, res.memory_mib, whole)}
