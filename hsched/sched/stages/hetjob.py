"""Heterogeneous jobs (sbatch's hetjobs, `JobSpec.components`): every component placed with its own request in the
same round, all or none, a gang across GPU types and nodes.

The stage runs first in the round, before the policy's plan (which plans one request per job), in the queue's
order; a hetjob waits, as squeue's Priority, while a job of a class that may preempt its class waits (it would be
started and then preempted). Each component is placed as an ordinary job of its resources would be
(`Round.start_now`: the fragmentation-aware best fit, eligibility, locality) and taken in the ledger before the
next is placed, so two components share a node only where its devices, CPUs and memory allow both. When one
component finds no room the ledger is put back as it was and the job waits, its reason naming that component. The
launch's placements are the components' in order (hsched.model.component_placements splits them again). Hetjobs
neither preempt nor claim released devices; they are preempted, requeued and ended as one job, as gangs are. Pure:
no I/O.
"""

from __future__ import annotations

import operator
from dataclasses import replace

from hsched.model import Component, Job, Placement
from hsched.sched.fleet import Decision, Launch, order
from hsched.sched.stages.backfill import Round
from hsched.sched.stages.eligibility import resolved
from hsched.sched.stages.work import Work
from hsched.sched.state import PRIORITY

_COMPONENTS = operator.attrgetter("spec.components")
"""A job's components (none: an ordinary job), looked up for the whole queue at C speed."""


def hetjob_stage(w: Work) -> None:
    """Place the heterogeneous jobs of the queue (all components or none) and take them out of it."""
    if not w.st.fleet.queue_apart or not any(map(_COMPONENTS, w.queue)):
        return
    het = order([j for j in w.queue if j.spec.components])
    w.queue = [j for j in w.queue if not j.spec.components]
    # (placed before the plan, a hetjob would take GPUs that a waiting job of a class allowed to preempt its class
    # then takes back by preemption a round later: it waits instead, as squeue's Priority)
    rule = w.st.fleet.rule
    waiting = {j.spec.qos for j in w.queue}
    for job in het:
        if any(rule.may_preempt(q, job.spec.qos) for q in waiting):
            w.decisions.append(w.st.wait(job.id, PRIORITY))
            continue
        w.decisions.append(place_hetjob(w.st, job))


def as_component(job: Job, c: Component) -> Job:
    """The job as the round sees one component of it: the component's resources and command."""
    return replace(job, spec=replace(job.spec, resources=c.resources, command=c.command, components=()))


def what(i: int, c: Component) -> str:
    """'component 1 (train.py: 2 x h100 GPUs)': a component as a wait reason names it."""
    r = c.resources
    kind = f" x {'|'.join(r.gpu_types)}" if r.gpu_types else ""
    gpus = f"{r.gpus}{kind} GPU(s)" if r.gpus else "CPU only"
    nodes = f" on {r.nodes} nodes" if r.nodes > 1 else ""
    return f"component {i} ({c.label}: {gpus}{nodes})"


def place_hetjob(st: Round, job: Job) -> Decision:
    """Launch `job` with every component placed (committed to the ledger), or Wait with the first component that
    does not fit named (the ledger as it was)."""
    capped = st.tally.blocked(job)
    if capped is not None:
        return st.wait(job.id, capped)
    saved = (set(st.busy), dict(st.free), dict(st.cpus_used), dict(st.memory_used), dict(st.started))
    placements: list[Placement] = []
    for i, c in enumerate(job.spec.components):
        part = as_component(job, c)
        if st.fleet.gpu_aliases:
            part = resolved(part, st.fleet.gpu_aliases)  # (the round resolved the job's own: component 0's)
        got = st.start_now(part)
        if got is None or not st.take(part, got):
            # put the ledger back: what earlier components took in this try is free again
            st.busy, st.free, st.cpus_used, st.memory_used, st.started = saved
            st.version += 1
            return st.wait(job.id, f"Resources: {what(i, c)} does not fit now")
        placements.extend(got)
    st.tally.add(job)
    return Launch(job.id, tuple(placements))
