"""Elastic jobs in the live round (issue 31): grow a job into GPUs that would idle, shrink it for jobs that wait.

An elastic job asks a range (`--gpus 2-8`: `Resources.gpus` is its MIN, `gpus_max` its MAX). This stage runs last,
after backfill, over what the round decided:

* **start bigger**: an elastic job the round starts, when no job needing GPUs is left waiting, starts with as many
  of its node's free GPUs as its MAX allows (no restart is paid: it was not running);
* **grow**: a running elastic job that proved it checkpoints (`FleetView.movable`, the same proof moves require) and
  has run its `move_min_run_s`, when no job needing GPUs waits and its node has free GPUs, grows to the size the
  policy picks (`hsched.sched.elastic`, hK's pure policy, when present; else `want_size` below): only when the
  marginal throughput pays for the restart, by the moves' rule (gain >= 2 x its measured checkpoint-and-restart
  cost);
* **shrink**: a running elastic job above its MIN gives back, in the order the round served the waiting jobs, the
  GPUs each waiting job would start on (never below MIN); they start once it has stopped.

A resize is a `Resize`, a `Move` with a size: the controller stops the job with its checkpoint signal, holds the
new devices for it (the kept ones when shrinking, its own and the free ones when growing) and starts it there again
when it is requeued (hsched.controller.resizing), with the new size in its environment.

Throughput per size is measured (`FleetView.scaling`: the job's kind's learned steps per second at each GPU count,
hsched.learn.kinds); a size nothing measured gets the prior `rate(n) = rate(m) * (n / m) ** SCALING_PRIOR` from the
nearest measured size m (no size measured: `n ** SCALING_PRIOR`), stated in the event as `"prior"`. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from hsched.model import Job, Placement
from hsched.sched.fleet import Launch, Move, Running, Wait
from hsched.sched.stages.work import Work
from hsched.sched.view import Preempt

SCALING_PRIOR = 0.9
"""A size nothing measured runs at (n / m) ** 0.9 times the nearest measured size m: sub-linear, as data-parallel
training scales (Pollux's measured goodput curves flatten; 0.9 per doubling is a middling figure)."""
GAIN_OVER_COST = 2.0
"""A grow must save at least twice what its restart costs: the moves' rule (hsched.sched.policies.hsched)."""
MIN_SPEEDUP = 1.05
"""A grow that measured (or priced) less than 5% faster is not worth a restart whatever the remaining time."""


@dataclass(frozen=True, slots=True)
class Resize(Move):
    """Stop an elastic job (checkpoint signal, grace, escalation) and start it again at `size` GPUs per node on
    `placements` (a `Move` whose from/to are sizes)."""

    size: int
    was: int
    grow: bool
    rate_was: float
    """Steps per second at the old size (measured, or the prior)."""
    rate_now: float
    """... and at the new one."""
    measured: bool
    """Both rates measured (False: at least one is the prior)."""
    for_jobs: tuple[int, ...] = ()
    """A shrink: the waiting jobs it makes room for."""


def rate_at(scaling: Mapping[int, float], n: int) -> tuple[float, bool]:
    """Steps per second at `n` GPUs, and whether measured: the table's figure, else the prior from the nearest
    measured size (none: relative `n ** SCALING_PRIOR`)."""
    if n in scaling:
        return scaling[n], True
    if not scaling:
        return float(n) ** SCALING_PRIOR, False
    m = min(scaling, key=lambda k: (abs(math.log(k / n)), -k))
    return scaling[m] * (n / m) ** SCALING_PRIOR, False


def want_size(lo: int, hi: int, now_size: int, room: int, scaling: Mapping[int, float], remaining_s: float,
              cost_s: float) -> tuple[int, str] | None:
    """The size to grow to (and why), or None: the largest size up to `now_size + room` (within MAX) whose speedup
    saves at least GAIN_OVER_COST x `cost_s` of the `remaining_s` (inf: unknown, any speedup pays)."""
    rate0, _m = rate_at(scaling, now_size)
    best: tuple[int, str] | None = None
    for n in range(now_size + 1, min(hi, now_size + room) + 1):
        rate, _m = rate_at(scaling, n)
        if rate < rate0 * MIN_SPEEDUP:
            continue
        gain = math.inf if math.isinf(remaining_s) else remaining_s * (1 - rate0 / rate)
        if gain >= GAIN_OVER_COST * cost_s:
            g = "an unknown remaining time" if math.isinf(gain) else f"{gain:.0f} s"
            best = (n, f"{rate / rate0:.2f}x the steps/s saves {g} for a {cost_s:.0f} s restart")
    return best


def elastic_stage(w: Work) -> None:
    """Start elastic jobs bigger, grow the running ones into idle GPUs, shrink them for waiting jobs (module doc)."""
    fleet = w.st.fleet
    # (cheap when no job is elastic: the running ones are in `scaling`, and only the round's starts are looked at)
    if not fleet.scaling and not any(isinstance(d, Launch) for d in w.decisions):
        return
    jobs = {j.id: j for j in w.jobs}
    stopping = {d.job_id for d in w.decisions if isinstance(d, Move)}
    stopping.update(v for d in w.decisions if isinstance(d, Preempt) for v in d.victims)
    waiting = [jobs[d.job_id] for d in w.decisions if isinstance(d, Wait) and d.job_id in jobs
               and jobs[d.job_id].spec.resources.gpus > 0 and not jobs[d.job_id].spec.resources.shared]
    if not waiting:
        _start_bigger(w, jobs)
    running = [r for r in fleet.running if r.job.spec.resources.elastic and r.id in fleet.movable
               and r.id not in stopping and len(r.job.placement) == 1 and r.job.spec.resources.gpus_max]
    for r in sorted(running, key=lambda r: (len(r.devices), r.id)):
        d = _shrink(w, r, waiting) if waiting else _grow(w, r)
        if d is not None:
            w.decisions.append(d)


def _start_bigger(w: Work, jobs: Mapping[int, Job]) -> None:
    st, fleet = w.st, w.st.fleet
    for k, d in enumerate(w.decisions):
        if not isinstance(d, Launch) or d.job_id in fleet.held or len(d.placements) != 1:
            continue
        job = jobs.get(d.job_id)
        res = job.spec.resources if job is not None else None
        if job is None or res is None or not res.gpus_max or res.gpus_max <= len(d.placements[0].devices):
            continue
        p = d.placements[0]
        node = st.by_name.get(p.node)
        if node is None:
            continue
        extra = [u for u in st.eligible(node, res) if u not in st.busy_reserved()]
        size = min(res.gpus_max, len(p.devices) + len(extra))
        if size <= len(p.devices):
            continue
        chosen = st.choose(node, [*p.devices, *extra], replace(res, gpus=size))
        if chosen is None or not set(p.devices) <= set(chosen.devices):
            continue
        st.hold(chosen.devices)
        w.decisions[k] = Launch(d.job_id, (replace(p, devices=chosen.devices,
                                                   explanation=f"elastic: {size} of {res.gpus}-{res.gpus_max} GPUs "
                                                               f"(free, nobody waits); {p.explanation}".rstrip("; ")),))


def _grow(w: Work, r: Running) -> Resize | None:
    st, fleet = w.st, w.st.fleet
    job, res = r.job, r.job.spec.resources
    assert res.gpus_max is not None
    p = job.placement[0]
    node = st.by_name.get(p.node)
    now_size = len(p.devices)
    if node is None or now_size >= res.gpus_max or st.now - r.started < fleet.move_min_run_s:
        return None
    free = [u for u in st.eligible(node, res) if u not in st.busy_reserved()]
    if not free:
        return None
    scaling = fleet.scaling.get(job.id, {})
    end = fleet.ends.get(job.id)
    remaining = math.inf if end is None else max(0.0, end - st.now)
    cost = fleet.movable[job.id]
    got = want_size(res.gpus, res.gpus_max, now_size, len(free), scaling, remaining, cost)
    if got is None:
        return None
    size, why = got
    chosen = st.choose(node, [*p.devices, *free], replace(res, gpus=size))
    if chosen is None:
        return None
    st.hold(chosen.devices)
    return _resize(job, p, chosen.devices, chosen.cpus or p.cpus, now_size, size, scaling, remaining, cost,
                   f"grows {now_size} -> {size} GPUs into idle GPUs on {p.node}: {why}", ())


def _shrink(w: Work, r: Running, waiting: Sequence[Job]) -> Resize | None:
    st = w.st
    job, res = r.job, r.job.spec.resources
    p = job.placement[0]
    node = st.by_name.get(p.node)
    own = list(p.devices)
    surplus = len(own) - res.gpus
    if node is None or surplus <= 0:
        return None
    busy = set(st.busy)
    given: list[str] = []
    served: list[int] = []
    for j in waiting:
        jr = j.spec.resources
        if jr.nodes != 1 or jr.gpus > surplus - len(given) or node not in st.nodes_for(j):
            continue
        pool = [u for u in own if u not in given]
        got = st.fit(node, jr, busy, freed=pool)
        if got is None:
            continue
        mine = [u for u in got.devices if u in pool]
        if not mine or len(given) + len(mine) > surplus:
            continue  # it fits without this job's GPUs (it waits for another reason), or needs more than it spares
        given += mine
        busy.update(got.devices)
        served.append(j.id)
    if not given:
        return None
    kept = tuple(u for u in own if u not in given)
    scaling = w.st.fleet.scaling.get(job.id, {})
    end = w.st.fleet.ends.get(job.id)
    remaining = math.inf if end is None else max(0.0, end - st.now)
    st.hold(kept)  # (busy already: the job holds them)
    who = ", ".join(map(str, served))
    return _resize(job, p, kept, p.cpus, len(own), len(kept), scaling, remaining, w.st.fleet.movable[job.id],
                   f"shrinks {len(own)} -> {len(kept)} GPUs on {p.node} so that waiting job(s) {who} can start",
                   tuple(served))


def _resize(job: Job, p: Placement, devices: Sequence[str], cpus: Sequence[int], was: int, size: int,
            scaling: Mapping[int, float], remaining: float, cost: float, why: str, for_jobs: tuple[int, ...]
            ) -> Resize:
    rate_was, m0 = rate_at(scaling, was)
    rate_now, m1 = rate_at(scaling, size)
    # the gain: seconds of its remaining run saved (negative when shrinking: what it gives up for the others)
    gain = math.inf if math.isinf(remaining) and size > was else (
        -math.inf if math.isinf(remaining) else remaining * (1 - rate_was / rate_now))
    placement = Placement(p.node, tuple(devices), explanation=f"elastic: {size} of {job.spec.resources.gpus}-"
                          f"{job.spec.resources.gpus_max} GPUs", cpus=tuple(cpus))
    return Resize(job.id, (placement,), f"{was} GPUs", f"{size} GPUs", gain, cost, why, size=size, was=was,
                  grow=size > was, rate_was=rate_was, rate_now=rate_now, measured=m0 and m1, for_jobs=for_jobs)
