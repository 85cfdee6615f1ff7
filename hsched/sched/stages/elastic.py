"""Elastic jobs in the live round (issue 31): grow a job into GPUs that would idle, shrink it for jobs that wait.

An elastic job asks a range (`--gpus 2-8`: `Resources.gpus` is its MIN, `gpus_max` its MAX). This stage runs last,
after backfill, over what the round decided:

* **start bigger**: an elastic job the round starts, when no job needing GPUs is left waiting, starts with as many
  of its node's free GPUs as its MAX allows (no restart is paid: it was not running);
* **grow and shrink**: the running elastic jobs that proved they checkpoint (the same proof moves require) or
  resize in place (`FleetView.resize_cost`: what a resize costs each), one node each, are handed with the free GPUs
  of each node (a pool) and the jobs left waiting (in the order the round served them) to the policy,
  `hsched.sched.elastic.plan_resizes` (the simulator's own): waiting jobs first (shrinks, never below MIN, that let
  one start), then growth into GPUs nobody waiting can use when the expected saving pays for the restart by the
  moves' rule. A grow also waits out the moves' quantum
  (`move_min_run_s`) since the job's last start; a shrink does not (waiting jobs come first).

An elastic gang (`--nodes MIN-MAX`) is resized by the same policy counted in whole nodes (`_gang_resizes`).

A resize is a `Resize`, a `Move` with a size: the controller stops the job with its checkpoint signal, holds the
new devices for it (the best of its own when shrinking, of its own and the free ones when growing: the topology
engine chooses) and starts it there again when it is requeued (hsched.controller.resizing), with the new size in its
environment.

Throughput per size is measured (`FleetView.scaling`: the job's kind's learned steps per second at each GPU count on
its GPU type, hsched.learn.kinds via hsched.controller.resizing); a size nothing measured gets the prior
`rate(n) = rate(m) * (n / m) ** SCALING_PRIOR` from the nearest measured size m (none measured: `n ** SCALING_PRIOR`),
and the event says `"scaling": "prior"`. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from hsched.model import Job, Placement
from hsched.sched import elastic as policy
from hsched.sched.fleet import Launch, Move, Running, Wait
from hsched.sched.stages.work import Work
from hsched.sched.state import PREEMPTING, PRIORITY, RESOURCES
from hsched.sched.view import Preempt

SCALING_PRIOR = 1.0
"""A size nothing measured runs at (n / m) ** SCALING_PRIOR times the nearest measured size m: linear, the per-GPU
rate measured kept. Optimistic on purpose: a size is tried once and then measured (its run's progress reports are
learnt), where a pessimistic prior would never try it; the policy compares per-GPU gains, so a sub-linear prior would
also grow a job a power of two at a time, a restart each."""
IN_PLACE_COST_S = 5.0
"""What a resize in place (`--resize-signal`) is taken to cost the job: no restart, its workers' new rendezvous."""


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
    unit: str = "GPUs"
    """What `size` and `was` count: GPUs per node (one node), or "nodes" (an elastic gang, `--nodes MIN-MAX`)."""


def rate_at(scaling: Mapping[int, float], n: int) -> tuple[float, bool]:
    """Steps per second at `n` GPUs, and whether measured: the table's figure, else the prior from the nearest
    measured size (none: relative `n ** SCALING_PRIOR`)."""
    if n in scaling:
        return scaling[n], True
    if not scaling:
        return float(n) ** SCALING_PRIOR, False
    m = min(scaling, key=lambda k: (abs(math.log(k / n)), -k))
    return scaling[m] * (n / m) ** SCALING_PRIOR, False


def elastic_stage(w: Work) -> None:
    """Start elastic jobs bigger, then grow and shrink the running ones by the policy (module doc)."""
    fleet = w.st.fleet
    # cheap when no job is elastic (a busy round decides 2,000 jobs): the running elastic ones are in `scaling`; else
    # only the round's starts are looked at, and the queue only for them
    if not fleet.scaling:
        if not fleet.resize_cost:
            return  # no elastic job runs, and none that waits could give GPUs back: none starts bigger
        started = {d.job_id for d in w.decisions if type(d) is Launch}
        if not started:
            return
        jobs = {j.id: j for j in w.jobs if j.id in started and j.spec.resources.gpus_max}
        if not jobs:
            return
    else:
        jobs = {j.id: j for j in w.jobs}
    waiting = _waiting(w, jobs if fleet.scaling else {j.id: j for j in w.jobs})
    if not waiting:
        _start_bigger(w, jobs)
    else:
        _start_smaller(w, jobs, waiting)
    if fleet.scaling:
        w.decisions.extend(_resizes(w, waiting))
        w.decisions.extend(_gang_resizes(w, waiting))


WAITS_FOR_GPUS = frozenset({RESOURCES, PRIORITY, PREEMPTING})
"""The waits GPUs freed by a shrink can end (not a QoS cap, a missing node or user, data: those wait for other
things)."""


def _waiting(w: Work, jobs: Mapping[int, Job]) -> list[Job]:
    """The jobs left waiting for GPUs (whole ones), in the order the round served them."""
    out = []
    for d in w.decisions:
        if type(d) is Wait and d.reason in WAITS_FOR_GPUS and (j := jobs.get(d.job_id)) is not None:
            res = j.spec.resources
            if res.gpus > 0 and not res.shared:
                out.append(j)
    return out


def _start_smaller(w: Work, jobs: Mapping[int, Job], waiting: Sequence[Job]) -> None:
    """An elastic job restarting on the devices a grow held for it, while jobs that need GPUs wait: it starts at the
    largest allowed size that leaves them what they need on its node (not below MIN). Starting smaller costs nothing
    now; starting big and shrinking next round would cost a restart."""
    st = w.st
    for k, d in enumerate(w.decisions):
        if not isinstance(d, Launch) or d.job_id not in st.fleet.held or len(d.placements) != 1:
            continue
        job = jobs.get(d.job_id)
        if job is None or not job.spec.resources.gpus_max:
            continue
        res, p = job.spec.resources, d.placements[0]
        node = st.by_name.get(p.node)
        if node is None or len(p.devices) <= res.gpus:
            continue
        need = sum(j.spec.resources.gpus for j in waiting
                   if j.spec.resources.nodes == 1 and any(n.name == p.node for n in st.nodes_for(j)))
        top = res.gpus_max or res.gpus
        fits = [n for n in policy.allowed_sizes(res.gpus, top) if n <= max(res.gpus, len(p.devices) - need)]
        size = max(fits, default=res.gpus)
        if need <= 0 or size >= len(p.devices):
            continue
        chosen = st.choose(node, list(p.devices), replace(res, gpus=size))
        if chosen is None:
            continue
        freed = [u for u in p.devices if u not in chosen.devices]
        st.busy.difference_update(freed)
        st.free[p.node] += len(freed)
        st.version += 1
        w.decisions[k] = Launch(d.job_id, (replace(p, devices=chosen.devices, cpus=chosen.cpus or p.cpus,
                                                   explanation=f"elastic: {size} of {res.gpus}-{res.gpus_max} GPUs "
                                                               f"(jobs wait for the others)"),))


def _resizes(w: Work, waiting: Sequence[Job]) -> list[Resize]:
    """The policy's resizes (hsched.sched.elastic.plan_resizes) of the running elastic jobs that may be resized, each
    node a pool; as `Resize` decisions with the devices chosen here."""
    st, fleet = w.st, w.st.fleet
    stopping = {d.job_id for d in w.decisions if isinstance(d, Move)}
    stopping.update(v for d in w.decisions if isinstance(d, Preempt) for v in d.victims)
    running = {r.id: r for r in fleet.running if r.id in fleet.resize_cost and r.id not in stopping
               and len(r.job.placement) == 1 and r.job.spec.resources.gpus_max
               and st.by_name.get(r.job.placement[0].node) is not None}
    if not running:
        return []
    busy = st.busy_reserved()
    free = {n.name: sum(1 for d in n.devices if d.uuid not in busy) for n in st.up}
    ejobs = []
    priors: dict[int, bool] = {}
    for r in running.values():
        res, p = r.job.spec.resources, r.job.placement[0]
        assert res.gpus_max is not None
        rates, measured = _rates(fleet.scaling[r.id], res.gpus, res.gpus_max, len(p.devices))
        priors[r.id] = measured
        end = fleet.ends.get(r.id)
        ejobs.append(policy.ElasticJob(
            r.id, len(p.devices), res.gpus, res.gpus_max, rates,
            run_s=max(0.0, st.now - r.started) + fleet.attained.get(r.id, 0.0),
            checkpoint_cost_s=fleet.resize_cost[r.id],
            proven_checkpoint=True, pool=p.node, user=r.job.user,
            remaining_s=None if end is None or math.isinf(end) else max(0.0, end - st.now)))
    wait = [policy.Waiting(j.id, j.spec.resources.gpus, tuple(n.name for n in st.nodes_for(j)), j.user)
            for j in waiting if j.spec.resources.nodes == 1]
    held: dict[str, int] = {}
    for r in fleet.running:
        held[r.job.user] = held.get(r.job.user, 0) + len(r.devices)
    fair = policy.fair_gpus(dict.fromkeys({*held, *(j.user for j in waiting)}, 0.0),
                            sum(len(n.devices) for n in st.up)) if waiting else None
    out: list[Resize] = []
    for rz in policy.plan_resizes(ejobs, free, wait, fair=fair, held=held):
        r = running[rz.job_id]
        if rz.direction is policy.Direction.GROW and st.now - r.started < fleet.move_min_run_s:
            continue  # (a grow waits out the moves' quantum: no restart every round)
        d = _decision(w, r, rz, priors[r.id])
        if d is not None:
            out.append(d)
    return out


def _gang_resizes(w: Work, waiting: Sequence[Job]) -> list[Resize]:
    """Elastic gangs (`--nodes MIN-MAX`, GPUs per node fixed) that proved they checkpoint, by the same policy counted
    in nodes: each gang its own pool, whose free units are the nodes not its own where its per-node share fits now,
    and whose waiting units are the GPUs of the waiting one-node jobs one of its nodes would start, a node's worth a
    unit. A grow adds whole free nodes; a shrink gives back its last nodes (never its first: the rendezvous host)."""
    st, fleet = w.st, w.st.fleet
    stopping = {d.job_id for d in w.decisions if isinstance(d, Move)}
    stopping.update(v for d in w.decisions if isinstance(d, Preempt) for v in d.victims)
    gangs = [r for r in fleet.running if r.id in fleet.resize_cost and r.id not in stopping
             and r.job.spec.resources.nodes_max and r.job.spec.resources.nodes_max > r.job.spec.resources.nodes
             and r.job.spec.resize_signal is None and r.job.placement
             and all(p.node in st.by_name for p in r.job.placement)]
    out: list[Resize] = []
    for r in sorted(gangs, key=lambda r: r.id):
        job, res = r.job, r.job.spec.resources
        assert res.nodes_max is not None
        g = max(1, res.gpus)
        mine = {p.node for p in job.placement}
        busy = st.busy_reserved()
        free_nodes = [(n, got) for n in st.nodes_for(job) if n.name not in mine
                      and (got := st.fit(n, res, busy)) is not None]
        pool = f"gang {job.id}"
        units: list[policy.Waiting] = []
        demand, first = 0, None
        own = {u for p in job.placement[1:] for u in p.devices}
        for j in waiting:
            jr = j.spec.resources
            if jr.nodes != 1 or not any(st.fit(st.by_name[p.node], jr, busy, freed=own) is not None
                                        for p in job.placement[1:]):
                continue
            first = j.id if first is None else first
            demand += jr.gpus
            while demand >= g:
                units.append(policy.Waiting(first if first is not None else j.id, 1, (pool,), j.user))
                demand, first = demand - g, None
        if demand > 0 and first is not None:
            units.append(policy.Waiting(first, 1, (pool,), job.user))
        scaling = fleet.scaling[job.id]
        nodes_now = len(job.placement)
        sizes = set(policy.allowed_sizes(res.nodes, res.nodes_max)) | {nodes_now}
        rates = tuple(sorted((n, rate_at(scaling, n * g)[0]) for n in sizes))
        end = fleet.ends.get(job.id)
        ej = policy.ElasticJob(job.id, nodes_now, res.nodes, res.nodes_max, rates,
                               run_s=max(0.0, st.now - r.started) + fleet.attained.get(job.id, 0.0),
                               checkpoint_cost_s=fleet.resize_cost[job.id], proven_checkpoint=True, pool=pool,
                               user=job.user,
                               remaining_s=None if end is None or math.isinf(end) else max(0.0, end - st.now))
        for rz in policy.plan_resizes([ej], {pool: len(free_nodes)}, units):
            grow = rz.direction is policy.Direction.GROW
            if grow and st.now - r.started < fleet.move_min_run_s:
                continue
            if grow:
                added = [got for _n, got in free_nodes[:rz.new - rz.old]]
                placements = (*job.placement, *added)
                st.hold(u for p in added for u in p.devices)
            else:
                placements = job.placement[:rz.new]
            rate_was, m0 = rate_at(scaling, rz.old * g)
            rate_now, m1 = rate_at(scaling, rz.new * g)
            out.append(Resize(job.id, tuple(placements), f"{rz.old} nodes", f"{rz.new} nodes",
                              rz.gain_s if grow else -rz.gain_s, rz.cost_s,
                              rz.reason.replace(" GPUs", " nodes").replace("GPU(s)", "node(s)"), size=rz.new,
                              was=rz.old, grow=grow, rate_was=rate_was, rate_now=rate_now, measured=m0 and m1,
                              for_jobs=() if rz.for_job is None else (rz.for_job,), unit="nodes"))
    return out


def _rates(measured: Mapping[int, float], lo: int, hi: int, now_size: int
           ) -> tuple[tuple[tuple[int, float], ...], bool]:
    """The (size, steps/s) the policy gets: the measured ones, and for every allowed size not measured the prior
    (`rate_at` here: SCALING_PRIOR from the nearest measured size); and whether every figure is measured."""
    sizes = set(policy.allowed_sizes(lo, hi)) | {now_size}
    out = dict(measured)
    for n in sizes:
        if n not in out:
            out[n] = rate_at(measured, n)[0]
    return tuple(sorted(out.items())), all(n in measured for n in sizes)


def _decision(w: Work, r: Running, rz: policy.Resize, all_measured: bool) -> Resize | None:
    """The policy's resize as a `Resize` on devices: a grow takes the best `new` of its own and the free ones (the
    topology engine), a shrink keeps the best `new` of its own."""
    st, fleet = w.st, w.st.fleet
    job, res, p = r.job, r.job.spec.resources, r.job.placement[0]
    node = st.by_name[p.node]
    if rz.direction is policy.Direction.GROW:
        busy = st.busy_reserved()
        among = [*p.devices, *(u for u in st.eligible(node, res) if u not in busy)]
    else:
        among = list(p.devices)
    chosen = st.choose(node, among, replace(res, gpus=rz.new))
    if chosen is None or len(chosen.devices) != rz.new:
        return None
    st.hold(chosen.devices)
    scaling = fleet.scaling.get(job.id, {})
    rate_was, m0 = rate_at(scaling, rz.old)
    rate_now, m1 = rate_at(scaling, rz.new)
    placement = Placement(p.node, tuple(chosen.devices), explanation=f"elastic: {rz.new} of {res.gpus}-"
                          f"{res.gpus_max} GPUs", cpus=tuple(chosen.cpus or p.cpus))
    why = f"{rz.reason} (on {p.node})"
    gain = rz.gain_s if rz.direction is policy.Direction.GROW else -rz.gain_s
    return Resize(job.id, (placement,), f"{rz.old} GPUs", f"{rz.new} GPUs", gain, rz.cost_s, why, size=rz.new,
                  was=rz.old, grow=rz.direction is policy.Direction.GROW, rate_was=rate_was, rate_now=rate_now,
                  measured=m0 and m1, for_jobs=() if rz.for_job is None else (rz.for_job,))


def _start_bigger(w: Work, jobs: Mapping[int, Job]) -> None:
    """An elastic job starting while nobody waits for GPUs takes its node's free ones up to its MAX, when it can give
    them back (`FleetView.resize_cost`: it proved it checkpoints, or resizes in place); else it starts at MIN and
    grows once it has proved it."""
    st, fleet = w.st, w.st.fleet
    for k, d in enumerate(w.decisions):
        if (not isinstance(d, Launch) or d.job_id in fleet.held or len(d.placements) != 1
                or d.job_id not in fleet.resize_cost):
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
