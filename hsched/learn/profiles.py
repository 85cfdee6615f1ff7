"""What kind of work a run does on its GPUs (issue 14, item 3), as pure functions of its usage tallies
(hsched.learn.efficiency.RunTally): `compute-bound`, `memory-bound`, `communication-bound`, `input-bound`, `idle`, or
`unknown` when the samples do not say.

The readings are what NVML and nvidia-smi give, not a profiler's: `utilization_gpu` is the share of time some
kernel ran (not how many SMs it kept busy), `utilization_memory` the share of time device memory was read or
written, and the NVLink and PCIe figures the bytes that crossed the GPU's links. So a profile is a coarse hint
for people and for placement, never a measurement of a kernel. A figure no sample carried (a GPU tool that
does not report NVLink traffic, a node that lists no processes) is unknown, and a rule that needs it does not
fire: the profile then says what it could not see rather than guess.

Simulated devices (hsched.simulated) make their readings up, following the job's declared nature
(`HSCHED_SIM_NATURE`); a profile built on them says `simulated`, so nobody mistakes it for a measurement.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# the tallies live below both this module and hsched.learn.efficiency (which reads profiles): no loop either way
from hsched.learn.tallies import IDLE_UTIL_PCT, RunTally, samples_of


class Profile(enum.StrEnum):
    COMPUTE = "compute-bound"
    MEMORY = "memory-bound"
    COMMUNICATION = "communication-bound"
    INPUT = "input-bound"
    IDLE = "idle"
    UNKNOWN = "unknown"


SIM_NATURE_ENV = "HSCHED_SIM_NATURE"
"""A job's spec may declare the nature its simulated GPUs' readings follow (any profile but `unknown`)."""

__all__ = ["IDLE_UTIL_PCT", "Characterization", "Profile", "Signals", "characterize", "classify", "signals"]
IDLE_AFTER_S = 30 * 60.0
"""settings `idle_after_s` unless set: long enough that loading a dataset or compiling a model at the start,
or a long evaluation on the CPU, is not flagged; short enough that an admin hears of a forgotten job the same
morning."""
COMPUTE_BOUND_PCT = 70.0
"""Kernels running at least this share of the time: the GPU is the bottleneck (typical training loops that
keep their GPU fed read 80-100 %)."""
MEMORY_BOUND_PCT = 50.0
"""Device memory busy at least this share of the time: a GEMM-heavy loop reads 20-40 %, while elementwise
kernels, embedding lookups and attention at long sequence lengths keep memory busy most of the time."""
INPUT_GPU_MAX_PCT = 40.0
"""Below this the GPU waits more than it works; with the host busy (INPUT_CPU_MIN_CORES) it waits for input."""
INPUT_CPU_MIN_CORES = 1.0
"""The job's GPU processes keep at least one core busy on average: the host is working (decoding, augmenting,
copying) while the GPU waits. Only the GPU processes are sampled (not data loader workers), so this is a floor."""
NVLINK_BUSY_MIB_S = 20 * 1024.0
"""Mean NVLink traffic per GPU (sent + received) at or above this is communication-bound: 20 GiB/s is a few
percent of an A100's or H100's links but sustained over a whole run only by jobs that all-reduce or shard
continuously; a data-parallel job with a small model stays well below."""
PCIE_BUSY_MIB_S = 4 * 1024.0
"""Mean PCIe traffic per GPU (sent + received) at or above this is communication-bound: about a third of what
a PCIe 3.0 x16 link carries in practice, far above what feeding batches of images or tokens needs."""
MIN_SAMPLES = 5
"""Fewer GPU readings than this (a run seconds old) say nothing yet."""


@dataclass(frozen=True, slots=True)
class Signals:
    """What the classifier reads, from one or more tallies (a run's nodes); None where no sample carried it."""

    gpu_util: float | None
    """Mean `utilization_gpu` % over every reading of every GPU held."""
    memory_util: float | None
    """Mean `utilization_memory` % (memory bandwidth)."""
    nvlink_mib_s: float | None
    """Mean NVLink traffic per GPU, sent + received."""
    pcie_mib_s: float | None
    """Mean PCIe traffic per GPU, sent + received."""
    cpu_cores: float | None
    """Mean cores the job's GPU processes kept busy, summed over its nodes."""
    samples: int
    """Node samples folded in (hsched.learn.tallies.samples_of): the count `hsched eff` shows beside the profile."""
    gpu_readings: int
    """GPU readings with a utilization (the most of any one GPU): too few say nothing yet."""
    span_s: float
    """From the first sample to the last."""
    idle_for_s: float | None
    """How long every GPU read has been idle, up to `now` (None: busy at the last reading, or none read)."""
    simulated: bool
    """Some of the readings were made up (simulated devices)."""

    def to_dict(self) -> dict[str, Any]:
        return {"gpu_util": _r(self.gpu_util), "memory_util": _r(self.memory_util),
                "nvlink_mib_s": _r(self.nvlink_mib_s), "pcie_mib_s": _r(self.pcie_mib_s),
                "cpu_cores": _r(self.cpu_cores, 2), "samples": self.samples,
                "gpu_readings": self.gpu_readings, "span_s": round(self.span_s, 1),
                "idle_for_s": _r(self.idle_for_s), "simulated": self.simulated}


@dataclass(frozen=True, slots=True)
class Characterization:
    profile: Profile
    reason: str
    """Why, in figures ("GPU busy 93%, memory bandwidth 31%; interconnect not reported")."""
    signals: Signals

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile.value, "reason": self.reason, **self.signals.to_dict()}


def _r(v: float | None, digits: int = 1) -> float | None:
    return None if v is None else round(v, digits)


def signals(tallies: Iterable[RunTally], now: float | None = None) -> Signals:
    """The signals of `tallies` together (one attempt's nodes, usually). `now`: the time idleness runs up to
    (a live job); None: up to the last sample (an ended run)."""
    util_sum = mem_sum = nv_sum = pcie_sum = 0.0
    util_n = mem_n = nv_n = pcie_n = 0
    cores: float | None = None
    readings = 0
    tallies = list(tallies)
    first: float | None = None
    last: float | None = None
    idle_since: float | None = None
    any_read, all_idle = False, True
    simulated = False
    for t in tallies:
        simulated |= t.simulated
        for d in t.devices.values():
            util_sum, util_n = util_sum + d.util_sum, util_n + d.util_samples
            mem_sum, mem_n = mem_sum + d.mem_util_sum, mem_n + d.mem_util_samples
            nv_sum, nv_n = nv_sum + d.nvlink_sum, nv_n + d.nvlink_samples
            pcie_sum, pcie_n = pcie_sum + d.pcie_sum, pcie_n + d.pcie_samples
            readings = max(readings, d.util_samples)
        if t.cpu_covered_s > 0:
            cores = (cores or 0.0) + t.cpu_s / t.cpu_covered_s
        if t.first_t is not None:
            first = t.first_t if first is None else min(first, t.first_t)
        if t.last_t is not None:
            last = t.last_t if last is None else max(last, t.last_t)
        if any(d.util_samples for d in t.devices.values()):
            any_read = True
            if t.idle_since is None:
                all_idle = False
            else:
                # a gang is idle since its last node went idle
                idle_since = t.idle_since if idle_since is None else max(idle_since, t.idle_since)
    until = now if now is not None else last
    idle_for = (max(0.0, until - idle_since) if any_read and all_idle and idle_since is not None
                and until is not None else None)
    return Signals(util_sum / util_n if util_n else None, mem_sum / mem_n if mem_n else None,
                   nv_sum / nv_n if nv_n else None, pcie_sum / pcie_n if pcie_n else None, cores,
                   samples_of(tallies), readings,
                   (last - first) if first is not None and last is not None else 0.0, idle_for, simulated)


def _duration(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def classify(s: Signals, idle_after_s: float = IDLE_AFTER_S) -> Characterization:
    """The profile the signals show. Rules in order (the first that holds wins):

    1. idle: every GPU under IDLE_UTIL_PCT for `idle_after_s` (now, or over a whole run that long);
    2. communication-bound: NVLink or PCIe traffic at or over its threshold (checked before the GPU's own
       figures: collective kernels keep `utilization_gpu` high while they wait on the links);
    3. input-bound: the GPU busy under INPUT_GPU_MAX_PCT while the job's processes keep a core busy;
    4. memory-bound: memory bandwidth busy at least MEMORY_BOUND_PCT;
    5. compute-bound: kernels running at least COMPUTE_BOUND_PCT;
    6. unknown: too few readings, or no bottleneck stands out (said with the figures).
    """

    def c(p: Profile, why: str) -> Characterization:
        return Characterization(p, why + (" (simulated readings)" if s.simulated else ""), s)

    if s.gpu_util is None:
        return c(Profile.UNKNOWN, f"no GPU readings in {s.samples} samples")
    if s.gpu_readings < MIN_SAMPLES:
        return c(Profile.UNKNOWN, f"too few GPU readings yet ({s.gpu_readings} in {s.samples} samples)")
    if s.idle_for_s is not None and s.idle_for_s >= idle_after_s:
        return c(Profile.IDLE, f"every GPU under {IDLE_UTIL_PCT:g}% for {_duration(s.idle_for_s)}")
    cpu_busy = s.cpu_cores is not None and s.cpu_cores >= INPUT_CPU_MIN_CORES
    if s.gpu_util < IDLE_UTIL_PCT and not cpu_busy and s.span_s >= idle_after_s:
        return c(Profile.IDLE, f"GPU busy {s.gpu_util:.1f}% over {_duration(s.span_s)}")
    figures = _figures(s)
    if s.nvlink_mib_s is not None and s.nvlink_mib_s >= NVLINK_BUSY_MIB_S:
        return c(Profile.COMMUNICATION, f"NVLink {_rate(s.nvlink_mib_s)} per GPU; {figures}")
    if s.pcie_mib_s is not None and s.pcie_mib_s >= PCIE_BUSY_MIB_S:
        return c(Profile.COMMUNICATION, f"PCIe {_rate(s.pcie_mib_s)} per GPU; {figures}")
    if s.gpu_util < INPUT_GPU_MAX_PCT and cpu_busy:
        return c(Profile.INPUT, f"GPU waits while its processes keep the host busy: {figures}")
    if s.memory_util is not None and s.memory_util >= MEMORY_BOUND_PCT:
        return c(Profile.MEMORY, figures)
    if s.gpu_util >= COMPUTE_BOUND_PCT:
        return c(Profile.COMPUTE, figures)
    if s.idle_for_s is not None:
        return c(Profile.UNKNOWN, f"GPUs idle for {_duration(s.idle_for_s)} so far (idle after "
                                  f"{_duration(idle_after_s)}); {figures}")
    return c(Profile.UNKNOWN, f"no bottleneck stands out: {figures}")


def characterize(tallies: Iterable[RunTally], now: float | None = None,
                 idle_after_s: float = IDLE_AFTER_S) -> Characterization:
    return classify(signals(tallies, now), idle_after_s)


def _rate(mib_s: float) -> str:
    return f"{mib_s / 1024:.1f} GiB/s" if mib_s >= 1024 else f"{mib_s:.0f} MiB/s"


def _figures(s: Signals) -> str:
    parts = [f"GPU busy {s.gpu_util:.0f}%"]
    parts.append("memory bandwidth " + ("not reported" if s.memory_util is None else f"{s.memory_util:.0f}%"))
    if s.nvlink_mib_s is None and s.pcie_mib_s is None:
        parts.append("interconnect unknown")
    else:
        if s.nvlink_mib_s is not None:
            parts.append(f"NVLink {_rate(s.nvlink_mib_s)}")
        if s.pcie_mib_s is not None:
            parts.append(f"PCIe {_rate(s.pcie_mib_s)}")
    parts.append("host CPU not sampled" if s.cpu_cores is None else f"{s.cpu_cores:.2f} cores")
    return ", ".join(parts)


def most_common(profiles: Iterable[Profile]) -> tuple[Profile | None, dict[str, int]]:
    """The most frequent known profile (ties: the order of Profile) and the count of each, unknown included."""
    counts: dict[str, int] = {}
    for seen in profiles:
        counts[seen.value] = counts.get(seen.value, 0) + 1
    best: Profile | None = None
    for p in Profile:  # the first of the most frequent, in Profile's order
        if p is not Profile.UNKNOWN and counts.get(p.value, 0) > (counts[best.value] if best else 0):
            best = p
    return best, counts


def profile_line(p: Mapping[str, Any] | None) -> str:
    """`compute-bound: GPU busy 93%, memory bandwidth 31%, interconnect unknown, 0.60 cores` from a profile as
    the controller sends it (Characterization.to_dict, with `flagged`), `idle (flagged): ...` for a running job
    flagged idle; `-` with none (`hsched show` and `hsched eff`)."""
    if not p:
        return "- (no GPU readings)"
    return f"{p.get('profile')}{' (flagged)' if p.get('flagged') else ''}: {p.get('reason') or ''}"


def sim_nature(env: Iterable[tuple[str, str]] | Mapping[str, str]) -> Profile | None:
    """The nature a job declares for its simulated readings (`HSCHED_SIM_NATURE` in its spec's environment);
    None: none declared, or not one of the profiles (then the readings are the plain busy ones)."""
    items = env.items() if isinstance(env, Mapping) else env
    for k, v in items:
        if k == SIM_NATURE_ENV:
            try:
                p = Profile(v.strip().lower())
            except ValueError:
                return None
            return None if p is Profile.UNKNOWN else p
    return None
