"""Job efficiency (seff's role), as pure functions: monitoring samples folded into one tally per run and node,
and the report `hsched eff` prints from the tallies and the job's runs.

A tally holds, for one attempt of one job on one node:

- per GPU the job held there: how many samples read it, the sum of their utilization (for the mean) and the
  peak memory used, next to the GPU's total;
- the CPU-seconds of the run's GPU processes (each sample's `cpu_percent` is their use since the node's last
  sample, so it covers the time since then) and the seconds those readings cover;
- the peak of the resident memory those processes held together.

The processes are those the node's GPU tool lists (NVML, nvidia-smi), so a job's CPU-only children (data
loader workers) are not in the CPU and host memory figures: they are a floor, said so in the report. A figure
no sample carried (a node without a GPU tool, simulated GPUs, a tally lost with a controller restart before
the run ended) is None, shown as "no samples", never 0.

The tallies also sum what hsched.profiles classifies a run by: memory-bandwidth utilization, NVLink and PCIe
traffic where the GPU tool gives them, and when every GPU went idle. Simulated devices get tallies of their
own (`simulated`), read by profiles and never by the figures here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hsched.model import Job, Run
from hsched.serialize import iso

GAP_S = 30.0
"""A CPU reading covering more than this since the node's previous sample (the stream broke, a node was away)
is not counted: `cpu_percent` is then an average over a span the tally cannot vouch for."""


@dataclass(slots=True)
class DeviceTally:
    """One GPU's figures over a run. Mutable on purpose: it is folded into at every sample (at 1 Hz, a new frozen
    value per GPU per sample would be garbage for nothing); reports read it through `Report`, which is frozen."""

    memory_total_mib: int | None = None
    samples: int = 0
    util_sum: float = 0.0
    util_samples: int = 0
    memory_peak_mib: int | None = None
    mem_util_sum: float = 0.0
    """Sum of `utilization_memory` (memory bandwidth %) over the samples that carried it (hsched.profiles)."""
    mem_util_samples: int = 0
    nvlink_sum: float = 0.0
    """Sum of NVLink traffic (MiB/s, sent + received) over the samples that carried it."""
    nvlink_samples: int = 0
    pcie_sum: float = 0.0
    """Sum of PCIe traffic (MiB/s, sent + received) over the samples that carried it."""
    pcie_samples: int = 0


@dataclass(slots=True)
class RunTally:
    """One attempt of one job on one node (mutable for the same reason as DeviceTally)."""

    job_id: int
    attempt: int
    node: str
    devices: dict[str, DeviceTally] = field(default_factory=dict)
    first_t: float | None = None
    last_t: float | None = None
    cpu_s: float = 0.0
    cpu_covered_s: float = 0.0
    process_samples: int = 0
    host_memory_peak_mib: int | None = None
    last_process_t: float | None = None
    """When the last sample listing the processes came: the start of the span the next CPU readings cover."""
    idle_since: float | None = None
    """The first of the latest unbroken samples in which every GPU read was idle (hsched.profiles.IDLE_UTIL_PCT);
    None while the last reading was busy, or before any."""
    simulated: bool = False
    """Its readings were made up for simulated devices (hsched.simulated): profiles read them, `eff`'s figures
    never do."""

    def to_dict(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "attempt": self.attempt, "node": self.node,
                "devices": {u: {"memory_total_mib": d.memory_total_mib, "samples": d.samples,
                                "util_sum": d.util_sum, "util_samples": d.util_samples,
                                "memory_peak_mib": d.memory_peak_mib, "mem_util_sum": d.mem_util_sum,
                                "mem_util_samples": d.mem_util_samples, "nvlink_sum": d.nvlink_sum,
                                "nvlink_samples": d.nvlink_samples, "pcie_sum": d.pcie_sum,
                                "pcie_samples": d.pcie_samples} for u, d in self.devices.items()},
                "first_t": self.first_t, "last_t": self.last_t, "cpu_s": self.cpu_s,
                "cpu_covered_s": self.cpu_covered_s, "process_samples": self.process_samples,
                "host_memory_peak_mib": self.host_memory_peak_mib, "last_process_t": self.last_process_t,
                "idle_since": self.idle_since, "simulated": self.simulated}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunTally:
        t = cls(int(d["job_id"]), int(d["attempt"]), str(d["node"]))
        for uuid, v in (d.get("devices") or {}).items():
            # rows kept before a field existed lack it: read as no sample carried it
            t.devices[uuid] = DeviceTally(v.get("memory_total_mib"), int(v.get("samples") or 0),
                                          float(v.get("util_sum") or 0.0), int(v.get("util_samples") or 0),
                                          v.get("memory_peak_mib"), float(v.get("mem_util_sum") or 0.0),
                                          int(v.get("mem_util_samples") or 0), float(v.get("nvlink_sum") or 0.0),
                                          int(v.get("nvlink_samples") or 0), float(v.get("pcie_sum") or 0.0),
                                          int(v.get("pcie_samples") or 0))
        t.first_t, t.last_t = d.get("first_t"), d.get("last_t")
        t.cpu_s, t.cpu_covered_s = float(d.get("cpu_s") or 0.0), float(d.get("cpu_covered_s") or 0.0)
        t.process_samples = int(d.get("process_samples") or 0)
        t.host_memory_peak_mib = d.get("host_memory_peak_mib")
        t.last_process_t = d.get("last_process_t")
        t.idle_since = d.get("idle_since")
        t.simulated = bool(d.get("simulated"))
        return t


def _max(a: int | None, b: int | float | None) -> int | None:
    if b is None:
        return a
    return int(b) if a is None else max(a, int(b))


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _traffic(r: Mapping[str, Any], prefix: str) -> float | None:
    """Sent + received MiB/s on one kind of link (`nvlink`, `pcie`); either alone when only it was read."""
    tx, rx = _num(r.get(f"{prefix}_tx_mib_s")), _num(r.get(f"{prefix}_rx_mib_s"))
    return None if tx is None and rx is None else (tx or 0.0) + (rx or 0.0)


def fold(tally: RunTally, t: float, readings: Mapping[str, Mapping[str, Any]], totals: Mapping[str, int | None],
         processes: Sequence[Mapping[str, Any]] | None) -> None:
    """Fold one node sample at time `t` into `tally`. `readings`: the sample's reading of each GPU the run holds
    ({"utilization_gpu", "memory_used_mib", and where the GPU tool gives them "utilization_memory",
    "nvlink_tx_mib_s", "nvlink_rx_mib_s", "pcie_tx_mib_s", "pcie_rx_mib_s"}; a GPU missing from it was not read);
    `totals`: each held GPU's memory; `processes`: the run's GPU processes in the sample (None: the sample lists
    no processes at all)."""
    from hsched.profiles import IDLE_UTIL_PCT

    tally.first_t = t if tally.first_t is None else tally.first_t
    tally.last_t = t
    utils: list[float] = []
    for uuid, total in totals.items():
        dev = tally.devices.get(uuid)
        if dev is None:
            dev = tally.devices[uuid] = DeviceTally(memory_total_mib=total)
        r = readings.get(uuid)
        if r is None:
            continue
        dev.samples += 1
        util = _num(r.get("utilization_gpu"))
        if util is not None:
            dev.util_sum += util
            dev.util_samples += 1
            utils.append(util)
        used = r.get("memory_used_mib")
        if isinstance(used, int | float) and not isinstance(used, bool):
            dev.memory_peak_mib = _max(dev.memory_peak_mib, used)
        mem_util = _num(r.get("utilization_memory"))
        if mem_util is not None:
            dev.mem_util_sum += mem_util
            dev.mem_util_samples += 1
        nvlink, pcie = _traffic(r, "nvlink"), _traffic(r, "pcie")
        if nvlink is not None:
            dev.nvlink_sum += nvlink
            dev.nvlink_samples += 1
        if pcie is not None:
            dev.pcie_sum += pcie
            dev.pcie_samples += 1
    if utils:  # a sample that read none of the GPUs neither starts nor ends an idle spell
        if max(utils) >= IDLE_UTIL_PCT:
            tally.idle_since = None
        elif tally.idle_since is None:
            tally.idle_since = t
    if processes is None:
        return
    by_pid = {p.get("pid"): p for p in processes}  # a process on two GPUs is listed once per GPU
    tally.process_samples += 1
    rss = [p.get("rss_mib") for p in by_pid.values()]
    if any(isinstance(r, int | float) for r in rss):
        tally.host_memory_peak_mib = _max(tally.host_memory_peak_mib,
                                          sum(r for r in rss if isinstance(r, int | float)))
    cpu = [p.get("cpu_percent") for p in by_pid.values()]
    prev, tally.last_process_t = tally.last_process_t, t
    if prev is None or not 0 < t - prev <= GAP_S:
        return
    known = [c for c in cpu if isinstance(c, int | float) and not isinstance(c, bool)]
    if known:  # a process's first sample has no CPU % yet: that span is not covered
        tally.cpu_s += sum(known) / 100.0 * (t - prev)
        tally.cpu_covered_s += t - prev


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
    cpu_covered_s: float
    host_memory_peak_mib: int | None
    """The highest the run's processes held at once on one node (a gang's nodes are summed)."""
    samples: int
    """Node samples folded in (a sample read any of the GPUs or listed the processes)."""

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


def figures(tallies: Iterable[RunTally]) -> Figures:
    """The figures of these tallies together (one run's nodes, or every run of a job). Simulated tallies are left
    out: their readings were made up, not sampled."""
    tallies = [t for t in tallies if not t.simulated]
    devs: dict[tuple[str, str], list[DeviceTally]] = {}
    cpu_s = 0.0
    covered = 0.0
    peaks: dict[int, int] = {}  # attempt -> summed per-node host memory peaks
    samples = 0
    for t in tallies:
        for uuid, d in t.devices.items():
            devs.setdefault((t.node, uuid), []).append(d)
        cpu_s += t.cpu_s
        covered += t.cpu_covered_s
        if t.host_memory_peak_mib is not None:
            peaks[t.attempt] = peaks.get(t.attempt, 0) + t.host_memory_peak_mib
        samples += max(max((d.samples for d in t.devices.values()), default=0), t.process_samples)
    gpus = []
    util_sum, util_n = 0.0, 0
    for (node, uuid), ds in sorted(devs.items()):
        n = sum(d.util_samples for d in ds)
        s = sum(d.util_sum for d in ds)
        util_sum, util_n = util_sum + s, util_n + n
        peak = None
        for d in ds:
            peak = _max(peak, d.memory_peak_mib)
        total = next((d.memory_total_mib for d in ds if d.memory_total_mib is not None), None)
        gpus.append(GpuFigures(uuid, node, s / n if n else None, peak, total, sum(d.samples for d in ds)))
    return Figures(tuple(gpus), util_sum / util_n if util_n else None,
                   cpu_s if covered > 0 else None, covered, max(peaks.values()) if peaks else None, samples)


def figures_to_dict(f: Figures, cpus: int | None, memory_mib: int | None) -> dict[str, Any]:
    """The JSON of `hsched eff --json` for one set of figures; `cpus` and `memory_mib`: what the job asked for
    on each node (None: nothing asked), the denominators of CPU efficiency and of the memory share."""

    def gpu(g: GpuFigures | None) -> dict[str, Any] | None:
        return None if g is None else {"uuid": g.uuid, "node": g.node, "mean": _r(g.utilization_mean)}

    peak = f.memory_peak()
    cores = f.cpu_s / f.cpu_covered_s if f.cpu_s is not None and f.cpu_covered_s > 0 else None
    return {
        "samples": f.samples,
        "gpu_utilization": None if f.utilization_mean is None else {
            "mean": _r(f.utilization_mean), "busiest": gpu(f.busiest()), "idlest": gpu(f.idlest())},
        "gpu_memory": None if peak is None else {
            "peak_mib": peak.memory_peak_mib, "total_mib": peak.memory_total_mib, "uuid": peak.uuid,
            "ratio": _r(peak.memory_peak_mib / peak.memory_total_mib, 4)
            if peak.memory_peak_mib is not None and peak.memory_total_mib else None},
        "cpu": None if cores is None else {
            "used_s": _r(f.cpu_s), "covered_s": _r(f.cpu_covered_s), "cores_mean": _r(cores, 2),
            "cpus": cpus, "efficiency": _r(cores / cpus, 4) if cpus else None},
        "host_memory": None if f.host_memory_peak_mib is None else {
            "peak_mib": f.host_memory_peak_mib, "requested_mib": memory_mib,
            "ratio": _r(f.host_memory_peak_mib / memory_mib, 4) if memory_mib else None},
        "devices": [{"uuid": g.uuid, "node": g.node, "utilization_mean": _r(g.utilization_mean),
                  "memory_peak_mib": g.memory_peak_mib, "memory_total_mib": g.memory_total_mib,
                  "samples": g.samples} for g in f.gpus],
    }


def _r(v: float | None, digits: int = 1) -> float | None:
    return None if v is None else round(v, digits)


def report(job: Job, runs: Sequence[Run], tallies: Sequence[RunTally], now: float,
           idle_after_s: float | None = None, flagged: Collection[int] = ()) -> dict[str, Any]:
    """`hsched eff`'s fields for `job`: each attempt's state, exit code, elapsed time, GPUs and GPU-hours with
    its figures and profile (hsched.profiles; `flagged`: the attempts flagged idle now), and the whole job's (its
    profile: the last attempt's). A running attempt counts up to `now`."""
    from hsched.profiles import IDLE_AFTER_S, characterize

    res = job.spec.resources
    profile: dict[str, Any] | None = None
    attempts: dict[int, list[Run]] = {}
    for r in runs:
        attempts.setdefault(r.attempt, []).append(r)
    out_runs = []
    elapsed_total = gpu_s_total = 0.0
    for attempt, ranks in sorted(attempts.items()):
        starts = [r.start_time for r in ranks if r.start_time is not None]
        ended = all(r.end_time is not None for r in ranks)
        start = min(starts) if starts else None
        end = max(r.end_time for r in ranks if r.end_time is not None) if ended and ranks else None
        elapsed = max(0.0, (end if end is not None else now) - start) if start is not None else 0.0
        # ranks on one node share its GPUs (--tasks-per-node): each GPU counts once
        held = {(r.node, u) for r in ranks for u in r.devices}
        gpu_s = elapsed * len(held)
        elapsed_total += elapsed
        gpu_s_total += gpu_s
        lead = min(ranks, key=lambda r: (r.rank, r.id))
        failed = [r for r in ranks if r.exit_code not in (None, 0)]
        mine = [t for t in tallies if t.attempt == attempt]
        profile = characterize(mine, None if ended else now,
                               IDLE_AFTER_S if idle_after_s is None else idle_after_s).to_dict()
        profile["flagged"] = attempt in flagged
        out_runs.append({
            "attempt": attempt, "nodes": sorted({r.node for r in ranks}), "ranks": len(ranks),
            "state": str(lead.state), "reason": lead.reason,
            "exit_code": failed[0].exit_code if failed else lead.exit_code,
            "start_time": iso(start), "end_time": iso(end), "elapsed_s": round(elapsed, 1),
            "gpus": len(held), "gpu_hours": round(gpu_s / 3600, 4),
            **figures_to_dict(figures(mine), res.cpus, res.memory_mib), "profile": profile})
    return {"elapsed_s": round(elapsed_total, 1), "gpu_hours": round(gpu_s_total / 3600, 4),
            "cpus": res.cpus, "memory_mib": res.memory_mib, "runs": out_runs, "profile": profile,
            **figures_to_dict(figures(tallies), res.cpus, res.memory_mib)}
