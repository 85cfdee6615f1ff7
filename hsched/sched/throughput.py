"""Throughput knowledge: how fast a job of type T at scale s runs on each GPU type.

The table is Gavel's `simulation_throughputs.json` shape (steps per second, per GPU type, per (job type,
scale)); live mode can build the same table from the model list and measured history. Jobs the table does
not know fall back to a prior: one relative speed per GPU type (measured from the table itself where it has
that type, else a rough built-in figure for common models), so an unknown job still prefers faster GPUs.

A job type the table knows at one GPU but not at the job's GPU count (Gavel's table measures 19 of its 26
types at 2, 4 and 8 GPUs; A3C, CycleGAN and the recommendation models only alone) gets its one-GPU rate times
the table's own scaling prior for that count and GPU type: the geometric mean, over the job types measured at
both, of rate(s GPUs) / rate(1 GPU). Counts the table never measured scale from the largest measured count,
linearly. `measured(job_type, gpus)` says which jobs run on such an estimate, so a simulation reports them.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Iterable, Mapping

# Rough training speed relative to a V100, for GPU types no table has measured. Matched by case-insensitive
# substring of the device model, longest key first, so "a100" does not match "a10".
BUILTIN_SPEED_PRIOR: Mapping[str, float] = {
    "b200": 5.0, "h200": 3.4, "h100": 3.0, "gh200": 3.2, "mi300": 2.8, "a100": 2.0, "mi250": 1.6,
    "l40s": 1.6, "l40": 1.3, "a6000": 1.2, "4090": 1.3, "3090": 0.9, "a40": 1.0, "a30": 0.9, "v100": 1.0,
    "a10": 0.7, "l4": 0.6, "t4": 0.45, "p100": 0.6, "titan": 0.7, "2080": 0.6, "p40": 0.5, "k80": 0.25,
}

Key = tuple[str, int]


def prior_match(gpu_type: str, prior: Mapping[str, float]) -> float | None:
    """The prior's speed for `gpu_type`: its own key, else the longest key inside it; None when none matches."""
    low = gpu_type.lower()
    if low in prior:
        return prior[low]
    for name in sorted(prior, key=len, reverse=True):
        if name in low:
            return prior[name]
    return None


def _prior_lookup(gpu_type: str, prior: Mapping[str, float]) -> float:
    found = prior_match(gpu_type, prior)
    return 1.0 if found is None else found


class ThroughputModel:
    """Per (job type, scale, GPU type) throughput, with a prior for what the table lacks.

    Pure and deterministic; results are memoised because the simulator asks the same questions every round.

    Args:
        table: gpu_type -> {(job_type, scale): rate} for jobs packed on one server.
        spanned: the same for a gang spread over servers (Gavel's `*_unconsolidated`); missing entries fall
            back to the consolidated rate.
        prior: relative speed per GPU type for unknown jobs (defaults to measured-from-table or built-in).
        reference_type: when set, a job type absent from the table runs at prior[t] / prior[reference] work
            units per second (traces that give durations in seconds on some reference GPU). When None, such a
            job has no rate, and the simulator reports it as unschedulable.
    """

    def __init__(
        self,
        table: Mapping[str, Mapping[Key, float]] | None = None,
        spanned: Mapping[str, Mapping[Key, float]] | None = None,
        prior: Mapping[str, float] | None = None,
        reference_type: str | None = None,
        estimated: Iterable[str] = (),
    ) -> None:
        self._explicit = {k.lower(): v for k, v in (prior or {}).items()}
        # GPU types the table lacks whose rates for the table's jobs are estimated from their prior speed
        # (`with_speeds`): without it such a type runs none of the table's jobs
        self._estimated = frozenset(t.lower() for t in estimated)
        self._table = {t.lower(): dict(v) for t, v in (table or {}).items()}
        self._spanned = {t.lower(): dict(v) for t, v in (spanned or {}).items()}
        self._known_types: set[str] = {k[0] for v in self._table.values() for k in v}
        self._keys: set[Key] = {k for v in self._table.values() for k in v}
        self._scaling = self._measured_scaling()
        measured = self._measured_prior()
        self._prior = {**BUILTIN_SPEED_PRIOR, **measured, **{k.lower(): v for k, v in (prior or {}).items()}}
        self.reference_type = reference_type.lower() if reference_type else None
        self._rate_cache: dict[tuple[str, int, str, bool], float | None] = {}
        self._rel_cache: dict[tuple[str, int, tuple[str, ...]], dict[str, float]] = {}
        self._fastest_cache: dict[tuple[str, int, tuple[str, ...], tuple[str, ...]], tuple[str, ...]] = {}

    @classmethod
    def from_gavel_json(cls, data: Mapping[str, Mapping[str, Mapping[str, object]]]) -> ThroughputModel:
        """Build from Gavel's JSON: {"v100": {"('ResNet-50 (batch size 64)', 1)": {"null": 4.39, ...}}}."""
        table: dict[str, dict[Key, float]] = {}
        spanned: dict[str, dict[Key, float]] = {}
        for gpu_type, entries in data.items():
            target = table
            name = gpu_type
            if gpu_type.endswith("_unconsolidated"):
                target, name = spanned, gpu_type.removesuffix("_unconsolidated")
            rates = target.setdefault(name, {})
            for raw_key, val in entries.items():
                key = parse_gavel_key(raw_key)
                alone = val.get("null") if isinstance(val, Mapping) else val
                if key is not None and isinstance(alone, int | float) and alone > 0:
                    rates[key] = float(alone)
        return cls(table, spanned)

    def _measured_prior(self) -> dict[str, float]:
        """Geometric-mean speed of each table type relative to V100 (or the first type), single-GPU jobs."""
        if not self._table:
            return {}
        base = "v100" if "v100" in self._table else sorted(self._table)[0]
        base_speed = BUILTIN_SPEED_PRIOR.get(base, 1.0)
        out: dict[str, float] = {}
        for t, rates in self._table.items():
            logs = [math.log(r / self._table[base][k]) for k, r in rates.items()
                    if k[1] == 1 and self._table[base].get(k)]
            if logs:
                out[t] = base_speed * math.exp(sum(logs) / len(logs))
        return out

    def _measured_scaling(self) -> dict[str, dict[int, float]]:
        """Per GPU type and GPU count s > 1: geometric mean of rate(T, s) / rate(T, 1) over the job types T the
        table measured at both (the "prior by GPU count")."""
        out: dict[str, dict[int, float]] = {}
        for t, rates in self._table.items():
            logs: dict[int, list[float]] = {}
            for (jt, scale), r in rates.items():
                one = rates.get((jt, 1))
                if scale > 1 and one:
                    logs.setdefault(scale, []).append(math.log(r / one))
            out[t] = {s: math.exp(sum(v) / len(v)) for s, v in logs.items()}
        return out

    def _scaled(self, job_type: str, gpus: int, gpu_type: str) -> float | None:
        """The one-GPU rate of a known job type times the scaling prior for `gpus` on `gpu_type`, or None."""
        one = self._table.get(gpu_type, {}).get((job_type, 1))
        if one is None or gpus < 1:
            return None
        if gpus == 1:
            return one
        factors = self._scaling.get(gpu_type, {})
        if gpus in factors:
            return one * factors[gpus]
        below = [s for s in factors if s < gpus]
        if not below:
            return one * gpus  # nothing measured to go by: linear
        s0 = max(below)
        return one * factors[s0] * gpus / s0

    def measured(self, job_type: str, gpus: int) -> bool:
        """True when the table has this (job type, GPU count) itself; False when its rate is an estimate (the
        scaling prior, or the per-type prior for a job type the table does not know)."""
        return (job_type, gpus) in self._keys

    @property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(self._table)

    def known_keys(self) -> tuple[Key, ...]:
        """Every (job type, scale) the table has a rate for on some GPU type, sorted."""
        return tuple(sorted({k for v in self._table.values() for k in v}))

    def knows(self, job_type: str) -> bool:
        return job_type in self._known_types

    def prior_speed(self, gpu_type: str) -> float:
        return _prior_lookup(gpu_type, self._prior)

    def has_speed(self, gpu_type: str) -> bool:
        """Whether anything says how fast `gpu_type` is: the table, or a prior entry (given or built in)."""
        return gpu_type.lower() in self._table or prior_match(gpu_type, self._prior) is not None

    def with_speeds(self, speeds: Mapping[str, float]) -> ThroughputModel:
        """This model with `speeds` (relative to a V100 = 1.0) as the prior of those GPU types, and the table's
        jobs running on a type the table lacks at their table rates scaled by prior speed (`rate`)."""
        extra = {k.lower(): v for k, v in speeds.items()}
        return ThroughputModel(self._table, self._spanned, {**self._explicit, **extra}, self.reference_type,
                               self._estimated | {t for t in extra if t not in self._table})

    def order_types(self, gpu_types: Iterable[str]) -> tuple[str, ...]:
        """Fastest first by the prior; ties by name so the order is deterministic."""
        return tuple(sorted(set(gpu_types), key=lambda t: (-self.prior_speed(t), t)))

    def rate(self, job_type: str, gpus: int, gpu_type: str, spans: bool = False) -> float | None:
        """Work units per second for the whole gang, or None when this job cannot run on this type."""
        key = (job_type, gpus, gpu_type, spans)
        try:
            return self._rate_cache[key]
        except KeyError:
            pass
        t = gpu_type.lower()
        out: float | None
        if job_type in self._known_types:
            out = self._table.get(t, {}).get((job_type, gpus))
            if out is None and t in self._estimated:
                out = self._by_prior(job_type, gpus, t)
            elif out is None and (job_type, gpus) not in self._keys:
                # a count the table never measured for this job type (on any GPU type): the scaling prior
                out = self._scaled(job_type, gpus, t)
            if spans and out is not None:
                out = self._spanned.get(t, {}).get((job_type, gpus), out)
        elif self.reference_type is not None:
            out = self.prior_speed(t) / self.prior_speed(self.reference_type)
        else:
            out = None
        self._rate_cache[key] = out
        return out

    def _by_prior(self, job_type: str, gpus: int, gpu_type: str) -> float | None:
        """A table job on a type the table lacks: the geometric mean over the table's types of its rate there x
        prior(gpu_type) / prior(that type), so a type given as 0.5 runs each job at half its V100 rate."""
        logs = []
        for tt, rates in self._table.items():
            r = rates.get((job_type, gpus))
            if r is None and (job_type, gpus) not in self._keys:
                r = self._scaled(job_type, gpus, tt)
            if r:
                logs.append(math.log(r * self.prior_speed(gpu_type) / self.prior_speed(tt)))
        return math.exp(sum(logs) / len(logs)) if logs else None

    def rel_speeds(self, job_type: str, gpus: int, gpu_types: tuple[str, ...]) -> dict[str, float]:
        """Speed on each type relative to this job's fastest type (1.0); 0.0 where it cannot run.

        Unknown jobs use the prior, so a policy always has a preference even without measurements.
        """
        key = (job_type, gpus, gpu_types)
        hit = self._rel_cache.get(key)
        if hit is not None:
            return hit
        raw: dict[str, float] = {}
        for t in gpu_types:
            r = self.rate(job_type, gpus, t) if job_type in self._known_types else self.prior_speed(t)
            raw[t] = r or 0.0
        top = max(raw.values(), default=0.0)
        out = {t: (r / top if top > 0 else 0.0) for t, r in raw.items()}
        self._rel_cache[key] = out
        return out

    def fastest_types(self, job_type: str, gpus: int, gpu_types: tuple[str, ...],
                      allowed: tuple[str, ...] = ()) -> tuple[str, ...]:
        """The runnable types among `gpu_types` (and `allowed`, when not empty), fastest for this job first.

        Ties keep `gpu_types`' order. Memoised: policies ask this for every job every round.
        """
        key = (job_type, gpus, gpu_types, allowed)
        hit = self._fastest_cache.get(key)
        if hit is not None:
            return hit
        rel = self.rel_speeds(job_type, gpus, gpu_types)
        types = [t for t in gpu_types if rel.get(t, 0.0) > 0 and (not allowed or t in allowed)]
        out = tuple(sorted(types, key=lambda t: -rel[t]))
        self._fastest_cache[key] = out
        return out

    def fastest_rate(self, job_type: str, gpus: int, gpu_types: Iterable[str]) -> float | None:
        rates = [r for t in gpu_types if (r := self.rate(job_type, gpus, t)) is not None]
        return max(rates) if rates else None


def parse_gavel_key(raw: str) -> Key | None:
    """"('ResNet-50 (batch size 64)', 1)" -> ("ResNet-50 (batch size 64)", 1); None for "null" or junk.

    ast.literal_eval reads Python literals only (never runs code), so a key from an input file is safe to parse
    this way, quotes and parentheses inside names included."""
    try:
        value = ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if (isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], str) and value[0]
            and isinstance(value[1], int) and not isinstance(value[1], bool)):
        return value[0], value[1]
    return None
