"""What the controller can say about the future: a running job's predicted end, when a job would start
(`hsched submit --test-only`, sbatch's), from hsched.predict's rules and what it learnt (learning.py)."""

from __future__ import annotations

from typing import Any

from hsched.constraints import node_labels
from hsched.controller import learning
from hsched.controller.core import Controller
from hsched.controller.jobcache import job_cache
from hsched.controller.launching import still_dirty
from hsched.model import Job, JobSpec, JobState, NodeState
from hsched.predict import Ahead, Holding, earliest_start, remaining
from hsched.serialize import iso, job_kind


async def predicted_end(ctl: Controller, job: Job, now: float) -> tuple[float | None, str]:
    """When a running job is predicted to end, and from what: its progress, its kind's history, or its time
    limit (the latest it may run); (None, "") when nothing says."""
    # (the attempt's start as the wall clock shows it now: counted on the monotonic timeline, so a step of the wall
    # clock moves the predicted end with it rather than adding the step to the job's running time)
    started = ctl.timeline.wall(ctl.attempt_started(job))
    elapsed = max(0.0, now - started) if started is not None else 0.0
    p = learning.progress_of(ctl, job.id, job.restarts + 1)
    exp = await learning.expected(ctl, job)
    left = remaining(elapsed, exp, p.get("step") if p else None, p.get("total") if p else None,
                     p.get("steps_per_s") if p else None)
    if left is not None:
        src = "progress" if p and p.get("total") is not None and p.get("steps_per_s") else "history"
        end = now + left
        if job.spec.time_limit_s is not None and started is not None:
            end = min(end, started + job.spec.time_limit_s)
        return end, src
    if job.spec.time_limit_s is not None and started is not None:
        return started + job.spec.time_limit_s, "time limit"
    return None, ""


async def test_only(ctl: Controller, spec: JobSpec, user: str) -> dict[str, Any]:
    """When and where a job of `spec` submitted now by `user` would start, without queueing it: the fleet's
    free GPUs now, the running jobs ending when predicted, and the jobs ahead of it in the queue (by QoS
    class and priority, then submit time: the order without a policy) running for their expected durations."""
    from hsched.sched.live import constraint_of, eligible_devices, unsatisfiable
    from hsched.sched.view import QOS_RANK, qos_rank

    now = ctl.clock.time()
    jobs = await ctl.db(job_cache(ctl).read, ctl.store)
    res = spec.resources
    up = [rt.node for rt in ctl.nodes.values() if rt.node.state is NodeState.UP]
    labels = {rt.name: node_labels(rt.name, rt.config.labels, res.constraint) for rt in ctl.nodes.values()}
    why = unsatisfiable(res, up, labels=labels, aliases=ctl.settings.gpu_aliases)
    probe = Job(id=0, spec=spec, user=user, state=JobState.PENDING, reason="", submit_time=now)
    expected = await learning.expected(ctl, probe)
    base: dict[str, Any] = {"expected_duration_s": expected, "kind": job_kind(probe)}
    if why is not None:
        return {**base, "start_time": None, "start_in_s": None, "now": False, "nodes": [], "waits_for": [],
                "reason": why}
    constraint = constraint_of(res)
    usable = [n.name for n in up if (constraint is None or constraint.satisfied_by(labels.get(n.name, frozenset())))
              and len(eligible_devices(n, res)) >= max(1, res.gpus)]
    busy = {u for j in jobs.active for p in j.placement for u in p.devices}
    busy |= {u for rt in ctl.nodes.values() for u in rt.foreign} | set(await still_dirty(ctl))
    free = {n.name: sum(1 for d in n.devices if d.uuid not in busy) for n in up}
    running = []
    for j in jobs.active:
        end, _src = await predicted_end(ctl, j, now) if j.state is JobState.RUNNING else (None, "")
        if j.state is not JobState.RUNNING and j.spec.time_limit_s is not None:
            end = now + j.spec.time_limit_s  # launching: it has not started; its limit bounds it
        held: dict[str, int] = {}
        for p in j.placement:
            held[p.node] = held.get(p.node, 0) + len(p.devices)
        running.append(Holding(j.id, held, end))
    rank = QOS_RANK.get(spec.qos, qos_rank("normal"))
    mine = (rank, -spec.priority)
    ahead = []
    for j in sorted(jobs.queued, key=lambda j: (QOS_RANK.get(j.spec.qos, rank), -j.spec.priority, j.submit_time)):
        if (QOS_RANK.get(j.spec.qos, rank), -j.spec.priority) > mine or j.spec.resources.gpus == 0:
            continue
        dur = await learning.expected(ctl, j)
        if dur is None and j.spec.time_limit_s is not None:
            dur = j.spec.time_limit_s
        ahead.append(Ahead(j.id, j.spec.resources.gpus, j.spec.resources.nodes, dur))
    guess = earliest_start(now, free, running, ahead, res.gpus, res.nodes, usable=usable)
    if guess.start_s is None:
        reason = ("cannot tell: it waits for job(s) " + ", ".join(map(str, guess.waits_for))
                  + " whose end nobody can predict (no progress, history or time limit)")
        return {**base, "start_time": None, "start_in_s": None, "now": False, "nodes": usable,
                "waits_for": list(guess.waits_for), "reason": reason}
    at_once = guess.start_s <= now
    reason = ("it would start now" if at_once else
              "it would start when job(s) " + ", ".join(map(str, guess.waits_for[-3:])) + " end")
    return {**base, "start_time": iso(guess.start_s), "start_in_s": max(0.0, guess.start_s - now), "now": at_once,
            "nodes": usable, "waits_for": list(guess.waits_for), "reason": reason}


STARTS_MAX = 500
"""`queue --start` predicts the first this many waiting jobs (the timeline grows as their square)."""


async def predicted_starts(ctl: Controller) -> dict[int, str | None]:
    """squeue --start: the predicted start of each waiting job (ISO time, None where it cannot be told), on one
    timeline: free GPUs now, running jobs ending when predicted, the waiting ones in QoS, priority and submit
    order running for their expected durations (else their time limits)."""
    from hsched.predict import starts
    from hsched.sched.live import constraint_of, eligible_devices, order

    now = ctl.clock.time()
    jobs = await ctl.db(job_cache(ctl).read, ctl.store)
    up = [rt.node for rt in ctl.nodes.values() if rt.node.state is NodeState.UP]
    labels = {rt.name: node_labels(rt.name, rt.config.labels) for rt in ctl.nodes.values()}
    busy = {u for j in jobs.active for p in j.placement for u in p.devices}
    busy |= {u for rt in ctl.nodes.values() for u in rt.foreign} | set(await still_dirty(ctl))
    free = {n.name: sum(1 for d in n.devices if d.uuid not in busy) for n in up}
    running = []
    for j in jobs.active:
        end = (await predicted_end(ctl, j, now))[0] if j.state is JobState.RUNNING else None
        held: dict[str, int] = {}
        for p in j.placement:
            held[p.node] = held.get(p.node, 0) + len(p.devices)
        running.append(Holding(j.id, held, end))
    queue, usable = [], {}
    for j in order([j for j in jobs.queued if j.spec.resources.gpus > 0])[:STARTS_MAX]:
        res = j.spec.resources
        dur = await learning.expected(ctl, j)
        queue.append(Ahead(j.id, res.gpus, res.nodes, dur if dur is not None else j.spec.time_limit_s))
        c = constraint_of(res)
        usable[j.id] = [n.name for n in up if (c is None or c.satisfied_by(labels.get(n.name, frozenset())))
                        and len(eligible_devices(n, res)) >= res.gpus]
    got = starts(now, free, running, queue, usable)
    return {jid: iso(t) for jid, t in got.items()}
