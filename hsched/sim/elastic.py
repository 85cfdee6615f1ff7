"""The simulator's elastic jobs (`hsched sim --elastic F`): every job may run between 1 GPU and F times its trace size.

The decision is the scheduling core's (`hsched.sched.elastic.plan_resizes`), the one the live controller calls; this
module gives it what the simulator knows: each job's throughput at each size on each GPU type, and where a resized
job's devices go.

Per-size throughput: Gavel's table (`simulation_throughputs.json`) measures most job types at 1, 2, 4 and 8 GPUs
(A3C, CycleGAN and the recommendation models at 1 GPU alone). A size the table has for the job type is its rate (the
"unconsolidated" rate when the gang spans servers, as for rigid jobs); the job's trace size is its rigid rate as the
simulator always ran it; any other size comes from `hsched.sched.elastic.rate_at` over those: per-GPU rate
interpolated between the nearest measured sizes, never above the faster of the two, and above the largest measured
size that size's rate (no speed-up the table never measured: a job measured at 1 GPU alone never grows).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from hsched.model import Placement
from hsched.sched.elastic import rate_at
from hsched.sched.throughput import ThroughputModel
from hsched.sched.view import ServerView

MAX_MEASURED = 64
"""The largest GPU count looked up in the table (Gavel's stops at 8)."""


@dataclass(slots=True)
class ElasticRates:
    """Per-size throughputs of the trace's jobs, memoised (the simulator asks the same ones every round)."""

    model: ThroughputModel
    factor: float
    _known: dict[tuple[str, str, int], tuple[tuple[int, float], ...]] = field(default_factory=dict)

    def max_size(self, base: int) -> int:
        """The largest size a job of trace size `base` may run at: F times it (at least its own size)."""
        return max(base, int(self.factor * base))

    def rates(self, job_type: str, gpu_type: str, base: int) -> tuple[tuple[int, float], ...]:
        """(size, rate) pairs known for this job on `gpu_type`: the table's measured sizes and its trace size."""
        key = (job_type, gpu_type, base)
        out = self._known.get(key)
        if out is None:
            sizes = {s for s in _powers(MAX_MEASURED) if self.model.measured(job_type, s)} | {base}
            pairs = ((s, self.model.rate(job_type, s, gpu_type)) for s in sorted(sizes))
            out = self._known[key] = tuple((s, r) for s, r in pairs if r)
        return out

    def rate(self, job_type: str, size: int, gpu_type: str, base: int, spans: bool = False) -> float | None:
        """The gang's rate at `size` on `gpu_type` (see the module docstring)."""
        if size == base or self.model.measured(job_type, size):
            r = self.model.rate(job_type, size, gpu_type, spans=spans)
            if r is not None:
                return r
        return rate_at(self.rates(job_type, gpu_type, base), size)


def _powers(top: int) -> Iterable[int]:
    p = 1
    while p <= top:
        yield p
        p *= 2


def shrink_placement(placement: Sequence[Placement], size: int) -> tuple[Placement, ...]:
    """The devices a job keeps when it shrinks to `size`: those on the servers where it has most, so that what is
    left spans as few servers as it can."""
    out: list[Placement] = []
    left = size
    for p in sorted(placement, key=lambda p: (-len(p.devices), p.node)):
        if left <= 0:
            break
        keep = p.devices[:left]
        out.append(Placement(p.node, keep))
        left -= len(keep)
    return tuple(sorted(out, key=lambda p: p.node))


def grow_placement(placement: Sequence[Placement], extra: int, gpu_type: str, servers: Sequence[ServerView],
                   free_on: Mapping[str, Sequence[str]]) -> tuple[Placement, ...] | None:
    """The job's devices and `extra` free ones of its type: first on the servers it is on, then on the server with the
    most free (one that holds all the extra alone if any); None when the type has not that many free."""
    mine = {p.node: list(p.devices) for p in placement}
    left = extra
    candidates = [sv for sv in servers if sv.gpu_type == gpu_type and free_on.get(sv.name)]
    order = sorted(candidates, key=lambda sv: (sv.name not in mine, len(free_on[sv.name]) < left,
                                               -len(free_on[sv.name]), sv.name))
    for sv in order:
        if left <= 0:
            break
        take = list(free_on[sv.name][:left])
        mine.setdefault(sv.name, []).extend(take)
        left -= len(take)
    if left > 0:
        return None
    return tuple(Placement(n, tuple(d)) for n, d in sorted(mine.items()))
