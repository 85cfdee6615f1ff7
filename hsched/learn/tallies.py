"""Usage tallies: what a run's monitoring samples said, folded as they come into one small record per attempt
and node (hsched.controller.usage keeps them, the store keeps them once the attempt is over). Pure data and
the folds; hsched.learn.efficiency reads them into `hsched eff`'s figures, hsched.learn.profiles into a run's profile.

A tally holds, for one attempt of one job on one node:

- per GPU the job held there: how many samples read it, the sum of their utilization (for the mean) and the
  peak memory used, next to the GPU's total, and the sums profiles classify by (memory bandwidth, NVLink and
  PCIe traffic where the GPU tool gives them) and when every GPU went idle;
- the CPU-seconds of the run's GPU processes (each sample's `cpu_percent` is their use since the node's last
  sample, so it covers the time since then), the seconds those readings cover, and the peak of the resident
  memory those processes held together: the processes the GPU tool lists, so a floor;
- per run (rank) on the node, what its cgroup says (hsched/node/cgroupstats.py): CPU-seconds since it started
  and its memory peak, read every few samples while it runs and once more at its end (`final`);
- `samples`: the node samples that read any of it, the one count `hsched eff` and the profile both show.

Simulated devices get made-up GPU readings (`simulated`), read by profiles and never as measured figures; a
simulated node's runs are real processes, so their cgroup readings are real.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

IDLE_UTIL_PCT = 5.0
"""A GPU busy less than this share of the time does nothing useful: a process that merely holds a context
(a notebook left open, a job stuck on a lock) reads 0-2 %, anything that computes reads far more."""

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
    """Sum of `utilization_memory` (memory bandwidth %) over the samples that carried it (hsched.learn.profiles)."""
    mem_util_samples: int = 0
    nvlink_sum: float = 0.0
    """Sum of NVLink traffic (MiB/s, sent + received) over the samples that carried it."""
    nvlink_samples: int = 0
    pcie_sum: float = 0.0
    """Sum of PCIe traffic (MiB/s, sent + received) over the samples that carried it."""
    pcie_samples: int = 0


@dataclass(slots=True)
class UsageTally:
    """What one run's cgroup (or its processes' accounting) said, hsched/node/cgroupstats.py: cumulative CPU
    time and the memory peak, so the latest reading is the whole run's so far (mutable as DeviceTally)."""

    cpu_s: float | None = None
    memory_peak_mib: float | None = None
    readings: int = 0
    source: str | None = None
    """"cgroup", or "processes" where the node gave the run no cgroup."""
    first_t: float | None = None
    """When its first reading came (the controller's clock)."""
    last_t: float | None = None
    """When its latest reading while it ran came: a running job's figures cover its run up to then."""
    final: bool = False
    """The run's last reading, taken when none of its processes was left, is in."""

    def to_dict(self) -> dict[str, Any]:
        return {"cpu_s": self.cpu_s, "memory_peak_mib": self.memory_peak_mib, "readings": self.readings,
                "source": self.source, "first_t": self.first_t, "last_t": self.last_t, "final": self.final}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> UsageTally:
        return cls(_num(d.get("cpu_s")), _num(d.get("memory_peak_mib")), int(d.get("readings") or 0),
                   d.get("source") if isinstance(d.get("source"), str) else None, _num(d.get("first_t")),
                   _num(d.get("last_t")), d.get("final") is True)


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
    """The first of the latest unbroken samples in which every GPU read was idle (IDLE_UTIL_PCT);
    None while the last reading was busy, or before any."""
    simulated: bool = False
    """Its GPU readings were made up for simulated devices (hsched.simulated): profiles read them, `eff`'s
    figures never do."""
    samples: int = 0
    """Node samples that read any of it (its GPUs, its processes, its cgroup), each counted once."""
    counted_t: float | None = None
    """The time of the last sample counted in `samples` (a sample folds GPUs and cgroups separately)."""
    usage: dict[str, UsageTally] = field(default_factory=dict)
    """Run folder name (one per rank on the node) -> what its cgroup said."""

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
                "idle_since": self.idle_since, "simulated": self.simulated, "samples": self.samples,
                "counted_t": self.counted_t,
                "usage": {k: u.to_dict() for k, u in self.usage.items()}}

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
        # a row kept before the count existed: its most-read GPU's or its process listings' count
        t.samples = int(d.get("samples") or max([t.process_samples, *(x.samples for x in t.devices.values())]))
        t.counted_t = _num(d.get("counted_t"))
        t.usage = {str(k): UsageTally.from_dict(v) for k, v in (d.get("usage") or {}).items() if isinstance(v, dict)}
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
        _counted(tally, t)
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
    _counted(tally, t)
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




def _counted(tally: RunTally, t: float) -> None:
    """The sample of time `t` read something of the tally: counted once however many folds and GPUs it makes."""
    if tally.counted_t != t:
        tally.samples += 1
        tally.counted_t = t


def fold_usage(tally: RunTally, t: float, run: str, reading: Mapping[str, Any]) -> None:
    """Fold one reading of run `run`'s cgroup (hsched/node/cgroupstats.py: cpu_s, memory_peak_mib, source,
    final) at time `t`. Its figures are cumulative: the highest seen is the run's so far, and a reading that
    came late (after the final one) changes nothing."""
    u = tally.usage.get(run)
    if u is None:
        u = tally.usage[run] = UsageTally(first_t=t)
    final = reading.get("final") is True
    cpu, peak = _num(reading.get("cpu_s")), _num(reading.get("memory_peak_mib"))
    if cpu is None and peak is None:
        return
    if not final:
        tally.first_t = t if tally.first_t is None else tally.first_t
        tally.last_t = t if tally.last_t is None else max(tally.last_t, t)
        _counted(tally, t)  # the end's reading is no sample of the stream: it comes with the exit record
    if u.final and not final:
        return
    if not final:
        u.last_t = t
    if cpu is not None:
        u.cpu_s = cpu if u.cpu_s is None else max(u.cpu_s, cpu)
    if peak is not None:
        u.memory_peak_mib = peak if u.memory_peak_mib is None else max(u.memory_peak_mib, peak)
    u.readings += 1
    u.final = u.final or final
    source = reading.get("source")
    if isinstance(source, str):
        u.source = source


def samples_of(tallies: Iterable[RunTally]) -> int:
    """The one sample count of these tallies: per attempt, its most-sampled node's (a gang's nodes are sampled
    side by side), summed over the attempts."""
    per_attempt: dict[int, int] = {}
    for t in tallies:
        per_attempt[t.attempt] = max(per_attempt.get(t.attempt, 0), t.samples)
    return sum(per_attempt.values())
