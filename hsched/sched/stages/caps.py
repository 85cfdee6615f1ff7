"""Caps (QoS limits, hsched.sched.limits): a job whose start would go over a cap of its QoS class neither starts nor
preempts; it waits with the cap's name. Before the policy plans, the queue is split here: jobs over a cap and jobs no
node may take (eligibility) are not the policy's to plan (they would hold capacity in the plan that they cannot use);
they wait with their reason after it. Each start is counted as it is decided (`Tally.add`), so two jobs of one user
may each fit a cap, not both. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Sequence

from hsched.model import Job
from hsched.sched.stages.eligibility import Eligible


def plannable(st: Eligible, queue: Sequence[Job]) -> tuple[set[int], set[int], list[Job]]:
    """(jobs over a cap, jobs with no node they may use, the GPU jobs the policy plans), in one pass over `queue`."""
    capped: set[int] = set()
    nowhere: set[int] = set()
    gpu_jobs: list[Job] = []
    blocked, nodes_for, limited = st.tally.blocked, st.nodes_for, bool(st.fleet.limits)
    if not limited and not st.absent_anywhere:
        # the usual case: a job's nodes are its constraint's, asked once per constraint
        by_constraint: dict[str, bool] = {}
        for j in queue:
            res = j.spec.resources
            some = by_constraint.get(res.constraint)
            if some is None:
                some = by_constraint[res.constraint] = bool(nodes_for(j))
            if not some:
                nowhere.add(j.id)
            elif res.gpus > 0:
                gpu_jobs.append(j)
    else:
        for j in queue:
            if limited and blocked(j) is not None:
                capped.add(j.id)
            elif not nodes_for(j):
                nowhere.add(j.id)
            elif j.spec.resources.gpus > 0:
                gpu_jobs.append(j)
    return capped, nowhere, gpu_jobs
