"""What users ask of the controller: submit, cancel, preempt, checkpoint, hold/release, priority, requeue.

Each command reads and writes its job under the controller's lock (no round sees half of it), records the
change durably with its event before answering, then wakes the scheduling loop.
"""

from __future__ import annotations

import json
from dataclasses import replace

from hsched.controller.core import Controller
from hsched.controller.stopping import begin_stop, send
from hsched.errors import HschedError, UserError
from hsched.lifecycle import StopReason
from hsched.model import EndReason, Job, JobSpec, JobState
from hsched.sched.limits import QosLimits, never_within
from hsched.sched.live import unsatisfiable
from hsched.serialize import spec_to_dict
from hsched.spec.constraints import node_labels
from hsched.spec.dependencies import named_jobs, named_tasks


async def _changed(ctl: Controller) -> None:
    ctl.poke()
    await ctl.notify()


async def submit(ctl: Controller, spec: JobSpec, user: str, submit_env: dict[str, str] | None) -> Job:
    return (await submit_many(ctl, [spec], user, submit_env))[0]


async def submit_many(ctl: Controller, specs: list[JobSpec], user: str, submit_env: dict[str, str] | None,
                      *, numbered: bool = False) -> list[Job]:
    """Queue `specs` (each a job or an array) in one transaction, the submitter's environment kept with them:
    all of them, or none when one is refused (a UserError; `numbered`: its lines say `jobs[i]: ` first)."""
    notes: list[tuple[int, str, str]] = []
    for i, spec in enumerate(specs):
        try:
            waiting = _admissible(ctl, spec)
        except UserError as e:
            raise _numbered(e, i) if numbered else e from None
        if waiting is not None:
            notes.append((i, "waiting", waiting))
    async with ctl.lock:
        for i, spec in enumerate(specs):
            for jid in sorted(named_jobs(spec.dependency)):
                if await ctl.db(ctl.store.get_job, jid) is None:
                    # as sbatch: "Job dependency problem", refused now rather than a job that waits for nothing
                    missing = UserError(f"dependency: job {jid} does not exist; check the id (hsched queue --all)")
                    raise _numbered(missing, i) if numbered else missing
            for array_id, index in sorted(named_tasks(spec.dependency)):
                if not any(t.array_task == index for t in await ctl.db(ctl.store.array_tasks, array_id)):
                    missing = UserError(f"dependency: job {array_id}_{index} does not exist (no such array task); "
                                        "check the id (hsched queue --all)")
                    raise _numbered(missing, i) if numbered else missing
        jobs = await ctl.db(ctl.store.submit_many, specs, user, ctl.clock.time(), submit_env, notes)
    await _changed(ctl)
    return jobs


def _numbered(e: UserError, i: int) -> UserError:
    return UserError(f"jobs[{i}]: {e}", problems=[f"jobs[{i}]: {p}" for p in e.problems])


def _admissible(ctl: Controller, spec: JobSpec) -> str | None:
    """Raise a UserError for a job this fleet can never run; else None, or (while the nodes that could run it
    are still unknown) the "waiting" event's message."""
    if spec.qos not in ctl.settings.qos:
        raise UserError(f"qos: expected one of {', '.join(ctl.settings.qos)}, found {spec.qos!r}")
    # whatever their state now, nodes whose devices we know decide whether a request can ever run; while
    # some node was never reached, it may be the one that can, so the job waits instead of being refused
    known = [rt.node for rt in ctl.nodes.values() if rt.last_ok is not None or rt.config.simulate]
    unknown = sorted(rt.name for rt in ctl.nodes.values() if rt.last_ok is None and not rt.config.simulate)
    # (a heterogeneous job: all its components' GPUs together)
    total = replace(spec.resources, gpus=sum(c.resources.gpus * c.resources.nodes for c in spec.components), nodes=1)
    limit = never_within(total if spec.components else spec.resources, spec.qos, QosLimits.from_qos(ctl.settings.qos))
    if limit is not None:
        raise UserError(f"job request exceeds its QoS class's limits: {limit}")
    # labels are the fleet file's, known before any probe: a constraint no node has is refused here
    labels = {rt.name: node_labels(rt.name, rt.config.labels, spec.resources.constraint) for rt in ctl.nodes.values()}
    why = unsatisfiable(spec.resources, known, labels=labels, aliases=ctl.settings.gpu_aliases)
    for i, c in enumerate(spec.components):  # a heterogeneous job: each component's request (its own labels)
        cl = {rt.name: node_labels(rt.name, rt.config.labels, c.resources.constraint) for rt in ctl.nodes.values()}
        got = unsatisfiable(c.resources, known, labels=cl, aliases=ctl.settings.gpu_aliases)
        why = why or (f"component {i} ({c.label}): {got}" if got is not None else None)
    if why is not None and not unknown:
        raise UserError(f"job request cannot be satisfied by this fleet ({ctl.fleet_cfg.source}): {why}")
    if why is not None:
        return f"no node reached so far can run it ({why}); waiting for {', '.join(unknown)}"
    return None


async def cancel(ctl: Controller, job_id: int) -> Job:
    now = ctl.clock.time()
    async with ctl.lock:
        job = await ctl.get(job_id)
        if job.state.is_terminal():
            # as scancel: an ended job is not cancelled again, and saying so is a failure, not a success
            raise HschedError(f"job {job_id} has already ended ({job.state.value}); nothing to cancel")
        if job.state is JobState.COMPLETING and job.reason == StopReason.CANCELLED:
            return job  # a cancel already under way
        if job.state is JobState.PENDING:
            job = await ctl.db(ctl.store.set_job, job_id, now, state=JobState.CANCELLED,
                               reason=EndReason.CANCELLED.value, end_time=now,
                               event=("cancelled", "cancelled while pending"))
        else:
            ctl.stops.pop(job_id, None)
            after = ctl.settings.kill_after_s
            job = await begin_stop(ctl, job, StopReason.CANCELLED,
                                   f"cancel requested: SIGTERM, then SIGKILL after {after:g} s")
    await _changed(ctl)
    return job


async def _running(ctl: Controller, job_id: int, what: str) -> Job:
    """The job, which must be running to `what`; else a UserError saying what state it is in."""
    job = await ctl.get(job_id)
    if job.state is not JobState.RUNNING:
        raise UserError(f"job {job_id} is {job.state.value}; only running jobs can {what}")
    return job


async def preempt(ctl: Controller, job_id: int) -> Job:
    """Preempt now: the checkpoint signal, the grace period, escalation; then back to PENDING."""
    async with ctl.lock:
        job = await _running(ctl, job_id, "be preempted")
        ck = job.spec.checkpoint_signal
        job = await begin_stop(ctl, job, StopReason.PREEMPTED,
                               f"preempted by the user: SIG{ck.signal}, {ck.grace_s:g} s to checkpoint")
    await _changed(ctl)
    return job


async def checkpoint(ctl: Controller, job_id: int) -> Job:
    """Send the job's checkpoint signal without stopping it."""
    async with ctl.lock:
        job = await _running(ctl, job_id, "checkpoint")
        ck = job.spec.checkpoint_signal
        if ck.signal in ("TERM", "INT", "HUP", "QUIT"):
            # the run would take it as "stop", not "checkpoint and go on"
            raise UserError(f"job {job_id}'s checkpoint signal is SIG{ck.signal}, which stops it; to checkpoint "
                            "without stopping, submit it with --checkpoint-signal USR1@60 (or `hsched preempt` it)")
        sent = await send(ctl, job_id, ck.signal, all_processes=not ck.batch_only, batch_only=ck.batch_only,
                          purpose="checkpoint")
        if not sent:
            raise HschedError(f"job {job_id}: no process handles SIG{ck.signal}; nothing was sent")
        await ctl.event("checkpoint", f"SIG{ck.signal} sent to the processes that handle it (checkpoint, keep "
                        "running)", job_id=job_id)
    await ctl.notify()
    return job


async def hold(ctl: Controller, job_ids: list[int], held: bool) -> list[Job]:
    """Hold pending jobs (they will not start) or release them, all at once: no scheduling round sees only
    some of them released."""
    async with ctl.lock:
        jobs = [await _hold_one(ctl, i, held) for i in job_ids]
    await _changed(ctl)
    return jobs


async def _hold_one(ctl: Controller, job_id: int, held: bool) -> Job:
    job = await ctl.get(job_id)
    if job.state is not JobState.PENDING:
        raise UserError(f"job {job_id} is {job.state.value}; only pending jobs can be held or released")
    if job.spec.hold == held:
        return job
    spec = replace(job.spec, hold=held)
    return await ctl.db(ctl.store.set_job, job_id, ctl.clock.time(), spec=json.dumps(spec_to_dict(spec)),
                        reason=(EndReason.HELD if held else EndReason.PRIORITY).value,
                        event=("held" if held else "released", "held by the user" if held else "released"))


async def set_priority(ctl: Controller, job_id: int, priority: int, qos: str | None = None, *, by: str = "",
                       admin: bool = False) -> Job:
    """`by`: who sets it (recorded in the spec); `admin`: they are a lab admin, so the priority orders the job
    across users (a member's orders only their own jobs)."""
    now = ctl.clock.time()
    if qos is not None and qos not in ctl.settings.qos:
        raise UserError(f"--qos: expected one of {', '.join(ctl.settings.qos)}, found {qos!r}")
    async with ctl.lock:
        job = await ctl.get(job_id)
        if job.state.is_terminal():
            raise UserError(f"job {job_id} has ended ({job.state.value}); its priority no longer matters")
        spec = replace(job.spec, priority=priority, qos=qos or job.spec.qos, priority_by=by, priority_admin=admin)
        who = f" by {by}" + (" (admin: it orders the job across users)" if admin else "") if by else ""
        job = await ctl.db(ctl.store.set_job, job_id, now, spec=json.dumps(spec_to_dict(spec)),
                           priority=priority, qos=spec.qos,
                           event=("priority", f"priority set to {priority} in {spec.qos}{who}"))
    await _changed(ctl)
    return job


async def requeue(ctl: Controller, job_id: int) -> Job:
    """An ended job goes back to PENDING under the same id (Slurm's scontrol requeue)."""
    now = ctl.clock.time()
    async with ctl.lock:
        job = await ctl.get(job_id)
        if not job.state.is_terminal():
            raise UserError(f"job {job_id} is {job.state.value}; only ended jobs can be requeued "
                            "(use `hsched cancel` first)")
        job = await ctl.db(ctl.store.set_job, job_id, now, state=JobState.PENDING, reason=EndReason.PRIORITY.value,
                           end_time=None, exit_code=None, placement=(), restarts=job.restarts + 1,
                           event=("requeued", f"requeued by the user after {job.state.value}"))
    await _changed(ctl)
    return job
