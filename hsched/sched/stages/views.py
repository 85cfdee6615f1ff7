"""The live jobs as the scheduling core sees them (`JobView`, hsched.sched.view): running ones with their attained
service, waiting ones with the GPU types they may use; kept from round to round in the caller's `RoundCache` while the
very same job objects come back (the controller keeps unchanged jobs). Pure: no I/O."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping, Sequence

from hsched.model import Job
from hsched.sched.cache import RoundCache, ViewCache
from hsched.sched.fleet import NONE, Running
from hsched.sched.view import JobPhase, JobView
from hsched.spec.jobkind import kind_of

ARRIVAL = operator.itemgetter(3, 0)
"""A JobView's (arrival_s, id), as a C-level sort key (a round sorts every active job by it)."""
_make_view = JobView._make
JOB_ID = operator.itemgetter(0)
"""A JobView's id."""
MODEL_MEMORY = operator.attrgetter("model", "memory_total_mib")
USER = operator.attrgetter("user")


def running_view(r: Running, types_of: Mapping[str, str], now: float, movable: Mapping[int, float] = NONE,
                  attained: Mapping[int, float] = NONE) -> JobView:
    job = r.job
    res = job.spec.resources
    node = job.placement[0].node if job.placement else ""
    # attained service: this attempt's running time and its earlier attempts' (least attained service must not
    # forget what a job that was stopped and restarted had already had)
    run_s = max(0.0, now - r.started) + attained.get(job.id, 0.0)
    placement = job.placement
    gpus = (len(placement[0].devices) if len(placement) == 1 else sum(len(p.devices) for p in placement)) or max(
        1, res.gpus * res.nodes)
    # _make, positional: a round makes one per running job, and the NamedTuple's own __new__ costs twice as much
    return _make_view((job.id, kind_of(job.spec.kind, job.spec.command), gpus, job.submit_time, JobPhase.RUNNING,
                       job.spec.qos, job.spec.priority, job.user, types_of.get(node), placement, r.started, run_s,
                       run_s, job.restarts, job.spec.time_limit_s, res.nodes, (), job.id in movable))


_new_tuple = tuple.__new__


def running_views(running: Iterable[Running], types_of: Mapping[str, str], now: float, cache: RoundCache,
                  movable: Mapping[int, float] = NONE, attained: Mapping[int, float] = NONE) -> list[JobView]:
    """`running_view` of each running job that has a placement: the same views, but a job seen in the last round
    (the very Running: the controller keeps it while its job and start are unchanged) on a node of the same GPU
    type is joined from its kept parts (512 running jobs: 1.3 ms a round down to 0.3)."""
    last: dict[int, tuple[Running, str | None, tuple[object, ...], tuple[object, ...], bool, float]] = cache.run_parts
    kept: dict[int, tuple[Running, str | None, tuple[object, ...], tuple[object, ...], bool, float]] = {}
    out = []
    for r in running:
        job = r.job
        if not job.placement:
            continue
        hit = last.get(job.id)
        t = types_of.get(job.placement[0].node)
        jid = job.id
        before = attained.get(jid, 0.0) if attained else 0.0
        if hit is None or hit[0] is not r or hit[1] != t or hit[4] is not (jid in movable) or hit[5] != before:
            v = running_view(r, types_of, now, movable, attained)
            hit = (r, t, v[:11], v[13:], jid in movable, before)
        else:
            run_s = max(0.0, now - r.started) + before
            v = _new_tuple(JobView, (*hit[2], run_s, run_s, *hit[3]))
        kept[job.id] = hit
        out.append(v)
    cache.run_parts = kept
    return out


def victim_views(running: Iterable[Running], now: float, cache: RoundCache) -> list[JobView]:
    """`running_view(r, {}, now)` of every running job (QoS preemption's views: no GPU types, nothing movable or
    attained): a job seen in the last round (the very Running) joined from its kept parts, as `running_views` does (512
    views made afresh were ~0.5 ms of a churning round that may preempt, issue 33)."""
    last = cache.victim_parts
    kept: dict[int, tuple[Running, tuple[object, ...], tuple[object, ...]]] = {}
    out = []
    for r in running:
        hit = last.get(r.job.id)
        if hit is None or hit[0] is not r:
            v = running_view(r, {}, now)
            hit = (r, v[:11], v[13:])
        else:
            run_s = max(0.0, now - r.started) + 0.0  # (as running_view's, with nothing attained before)
            v = _new_tuple(JobView, (*hit[1], run_s, run_s, *hit[2]))
        kept[r.job.id] = hit
        out.append(v)
    cache.victim_parts = kept
    return out


def pending_view(job: Job, allowed: tuple[str, ...] = (), attained: float = 0.0) -> JobView:
    res = job.spec.resources
    spec = job.spec
    # (as running_view's) the job's kind is the throughput model's job type: what the controller learnt of its
    # speed, if anything; `attained`: what its earlier attempts ran
    return _make_view((job.id, kind_of(spec.kind, spec.command), max(1, res.gpus * res.nodes), job.submit_time,
                       JobPhase.PENDING, spec.qos, spec.priority, job.user, None, (), None, attained, attained,
                       job.restarts, spec.time_limit_s, res.nodes, allowed, False))


def pending_views(pending: Sequence[Job], allowed: Callable[[Job], tuple[str, ...]],
                  fleet: tuple[object, ...], cache: RoundCache, attained: Mapping[int, float] = NONE) -> list[JobView]:
    """The waiting jobs' views. A waiting job's view is the same from round to round while the job is (the very
    object: the controller keeps unchanged jobs) and the fleet is (`fleet`: what a job's allowed GPU types depend on:
    each typed node's name, type, labels, absent users and device models and memory)."""
    last_fleet, last, last_pending, last_out = cache.views
    same_fleet = fleet == last_fleet
    if same_fleet and len(pending) == len(last_pending) and all(map(operator.is_, pending, last_pending)):
        return list(last_out)  # the very same jobs as last round (a busy queue's usual round): the same views
    kept: ViewCache = {}
    out = []
    for j in pending:
        hit = last.get(j.id)
        if hit is None or hit[0] is not j or not same_fleet:
            types = allowed(j)
            if hit is None or hit[0] is not j or hit[1] != types:
                hit = (j, types, pending_view(j, types, attained.get(j.id, 0.0) if j.restarts else 0.0))
        kept[j.id] = hit
        out.append(hit[2])
    # only this round's jobs are kept: ended jobs do not pile up
    cache.views = (fleet, kept, tuple(pending), out)
    return list(out)

