"""What the controller learns about job kinds (hsched.spec.jobkind): how fast each kind runs on each GPU type.

Speeds are learned from the jobs' own progress reports (hsched.progress): steps per second per (kind, GPU
type, GPU count, placement class). The classes are how the GPUs talk: `single` (one GPU), `nvlink` (all
pairs on NVLink or an NVSwitch), `pcie` (some pair through PCIe or the CPU) and `spanning` (more than one
node). A speed is a moving average over the last runs (each run counts 1/n up to n = RUNS_KEPT, then 1/5,
so a kind that changes is followed). The live policy reads the learned table as a throughput model
(hsched.sched.throughput, the simulator's own), completed for the GPU types a kind has not run on yet by
the accelerator table's prior: measured speed x prior(type) / prior(measured type).

Pure: no I/O. The store keeps the table; hsched.controller.progress feeds it.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hsched.sched.throughput import ThroughputModel

# re-exported for hsched.sched.live until it imports hsched.spec.jobkind itself (issue 28: the core imports no learning)
from hsched.spec.jobkind import kind_of as kind_of

RUNS_KEPT = 5
"""The moving average's memory: a new run counts at least 1/RUNS_KEPT."""
MIN_WINDOW_S = 5.0
"""A run's speed counts once its reports span this long (start-up is not a speed)."""


class PlacementClass(enum.StrEnum):
    SINGLE = "single"
    NVLINK = "nvlink"
    PCIE = "pcie"
    SPANNING = "spanning"


def placement_class(gpus_by_node: Sequence[Sequence[str]], nvlinked: Iterable[tuple[str, str]]) -> PlacementClass:
    """How a placement's GPUs talk: more than one node, one GPU, all pairs on NVLink, or not."""
    nodes = [tuple(g) for g in gpus_by_node if g]
    if len(nodes) > 1:
        return PlacementClass.SPANNING
    devices = nodes[0] if nodes else ()
    if len(devices) <= 1:
        return PlacementClass.SINGLE
    linked = {frozenset(p) for p in nvlinked}
    pairs = [frozenset((a, b)) for k, a in enumerate(devices) for b in devices[k + 1:]]
    return PlacementClass.NVLINK if all(p in linked for p in pairs) else PlacementClass.PCIE


# ------------------------------------------------------------------------------------------------ speeds


@dataclass(frozen=True, slots=True)
class KindRate:
    """What the controller learnt: steps per second of `kind` on `gpus` GPUs of `gpu_type`, placed `klass`."""

    kind: str
    gpu_type: str
    gpus: int
    klass: PlacementClass
    steps_per_s: float
    runs: int
    updated: float


def averaged(old: float | None, runs: int, new: float) -> float:
    """The moving average after one more run measured at `new` (`runs` runs before it)."""
    if old is None or runs <= 0:
        return new
    w = 1.0 / min(runs + 1, RUNS_KEPT)
    return old + (new - old) * w


def run_speed(first: tuple[float, float], last: tuple[float, float]) -> float | None:
    """Steps per second between two reports (time, step), once they span MIN_WINDOW_S; None before."""
    (t0, s0), (t1, s1) = first, last
    if t1 - t0 < MIN_WINDOW_S or s1 <= s0:
        return None
    return (s1 - s0) / (t1 - t0)


def catalog_prior() -> dict[str, float]:
    """The accelerator table's relative training speed of each GPU type (what the live policy knows of a
    job it has never seen run)."""
    from hsched.topo.models import DEFAULT_CATALOG

    return {m.key.lower(): m.train for m in DEFAULT_CATALOG.models}


def learned_model(rates: Iterable[KindRate], gpu_types: Iterable[str],
                  prior: Mapping[str, float] | None = None,
                  completion: Mapping[str, float] | None = None) -> ThroughputModel:
    """The learned speeds as a throughput model for the policy. A (kind, GPU count) measured on some GPU
    types gets, on the others of `gpu_types`, the geometric mean over its measured types of
    speed x completion(type) / completion(measured type), `completion` defaulting to `prior`, which is what a
    kind nothing measured runs by. Spanning placements are the model's "spanned" table; the others (single,
    NVLink, PCIe) its table, averaged by runs."""
    base = ThroughputModel(prior=completion if completion is not None else prior)  # its prior lookup alone
    table: dict[str, dict[tuple[str, int], float]] = {}
    spanned: dict[str, dict[tuple[str, int], float]] = {}
    weights: dict[tuple[bool, str, str, int], tuple[float, int]] = {}
    for r in rates:
        if r.steps_per_s <= 0 or r.runs <= 0:
            continue
        wkey = (r.klass is PlacementClass.SPANNING, r.gpu_type, r.kind, r.gpus)
        total, n = weights.get(wkey, (0.0, 0))
        weights[wkey] = (total + r.steps_per_s * r.runs, n + r.runs)
    for (span, gpu_type, kind, gpus), (total, n) in weights.items():
        (spanned if span else table).setdefault(gpu_type, {})[(kind, gpus)] = total / n
    types = sorted(set(gpu_types) | set(table) | set(spanned))
    for target in (table, spanned):
        measured: dict[tuple[str, int], dict[str, float]] = {}
        for t, entries in target.items():
            for key, rate in entries.items():
                measured.setdefault(key, {})[t] = rate
        for key, by_type in measured.items():
            for t in types:
                if t in by_type:
                    continue
                logs = [math.log(rate * base.prior_speed(t) / base.prior_speed(m)) for m, rate in by_type.items()]
                target.setdefault(t, {})[key] = math.exp(sum(logs) / len(logs))
    return ThroughputModel(table, spanned, prior=prior)


# ---------------------------------------------- what the live policy and the simulator's --learned read
# (moved here from hsched/sim/knowledge.py, where they were written for the simulator: the live controller needs
# the very same)


class PriorFallbackModel(ThroughputModel):
    """A learned model that never says "cannot run": a (job type, GPU count) nothing measured (a job type seen
    only as a gang of another size, say) runs at the prior's relative speed of each GPU type.

    Why: `ThroughputModel.rate` is None for a job type it knows at no GPU count it can scale from (a learned
    table knows a type only at the counts that ran), and a policy never places a job whose rate is None on
    every type: with learned speeds, a 1-GPU job of a type only seen at 4 GPUs would wait for ever. The
    simulator's truth (the trace's table) still decides what can really run."""

    def rate(self, job_type: str, gpus: int, gpu_type: str, spans: bool = False) -> float | None:
        out = super().rate(job_type, gpus, gpu_type, spans)
        return out if out is not None else self.prior_speed(gpu_type)

    def rel_speeds(self, job_type: str, gpus: int, gpu_types: tuple[str, ...]) -> dict[str, float]:
        key = (job_type, gpus, gpu_types)
        hit = self._rel_cache.get(key)
        if hit is not None:
            return hit
        # a known job type's speeds through `rate` (with the fallback above); an unknown one's from the prior
        raw = {t: self.rate(job_type, gpus, t) or 0.0 for t in gpu_types}
        top = max(raw.values(), default=0.0)
        out = {t: (r / top if top > 0 else 0.0) for t, r in raw.items()}
        self._rel_cache[key] = out
        return out


def _fallback(model: ThroughputModel) -> PriorFallbackModel:
    """`model`, as a PriorFallbackModel (same tables, same prior; fresh caches)."""
    out = PriorFallbackModel.__new__(PriorFallbackModel)
    out.__dict__.update(model.__dict__)
    out._rate_cache, out._rel_cache, out._fastest_cache = {}, {}, {}
    return out


def measured_prior(rates: Iterable[KindRate], prior: Mapping[str, float], gpu_types: Iterable[str]) -> dict[str, float]:
    """`prior` with each GPU type's relative speed re-estimated from the learned speeds: the reference type (the
    fastest of `gpu_types` by `prior`) keeps its speed; another type's is the geometric mean, over the (kind,
    GPU count) measured on both it and the reference (spanning placements apart), of speed(type) /
    speed(reference). A type never measured together with the reference keeps its prior speed. (Counting the
    prior's own ratio as one more kind, so that a single odd kind swings it less, measured worse on ed69ec:
    8+8+8 at 3.1% over the oracle instead of 0.5%.)

    Why: `learned_model` completes a kind's speed on the types it has not run on from the prior's ratios, and
    the accelerator table's are a rough, model-independent figure (P100 0.55 and K80 0.2 of a V100, where
    Gavel's measured table has 0.94 and 0.30 on geometric mean): on ed69ec 8+8+8 that alone cost 4.7% of
    average JCT against the table oracle (0.5% with this; bench_sim.py --learned)."""
    out = {k.lower(): v for k, v in prior.items()}
    types = sorted(set(gpu_types))
    if not types:
        return out
    lookup = ThroughputModel(prior=prior)  # each type's prior speed, matched as the policy's model matches it
    speed = {t: lookup.prior_speed(t) for t in types}
    ref = max(types, key=lambda t: (speed[t], t))
    by_key: dict[tuple[str, int], dict[str, float]] = {}
    for r in rates:
        if r.klass is not PlacementClass.SPANNING and r.steps_per_s > 0:
            by_key.setdefault((r.kind, r.gpus), {})[r.gpu_type] = r.steps_per_s  # (one class per type suffices)
    for t in types:
        if t == ref:
            continue
        logs = [math.log(v[t] / v[ref]) for v in by_key.values() if t in v and ref in v]
        if logs:
            out[t.lower()] = speed[ref] * math.exp(sum(logs) / len(logs))
    return out
