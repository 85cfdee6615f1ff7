"""One live round as a pipeline of stages over one state: a pure function from (fleet, queue, now) to decisions.

    decisions = schedule(fleet_view, pending_jobs, now, cache=round_cache)   # Launch | Wait | Preempt | Move

The state is `Round` (hsched.sched.stages.backfill): the ledger and index (hsched.sched.state) with each stage's part.
The stages run in order over a `Work` (the jobs left, the decisions so far, the policy's reasons):

1. `held`: a job a move promised devices to starts there as soon as they are free (before the state is built: the
   promised devices are busy for everyone else);
1b. `hetjob`: heterogeneous jobs (sbatch's hetjobs), every component placed or none (hsched.sched.stages.hetjob);
2. `sharing`: shared jobs (`--shared`, a fraction of one GPU each) are packed first, apart from the policy;
3. `plan`: with a policy (settings' `policy`, by default `hsched`), the scheduling core's plan over the live fleet,
   the simulator's very code, with moves; caps and eligibility keep out of it the jobs it could not start; the one
   reservation (EASY backfill) is made for the most important job the plan does not start;
4. `backfill`: every job still waiting, in the order served: a gap it fits, devices being released, QoS preemption
   (hsched.sched.stages.preemption), else a Wait with its reason.
5. `elastic`: elastic jobs (`--gpus MIN-MAX`) started bigger when nobody waits, grown into idle GPUs, shrunk for
   waiting jobs (hsched.sched.stages.elastic: `Resize`, a `Move` with a size).

What the round keeps for the next one is in the caller's `RoundCache` (hsched.sched.cache); none given, a fresh one.
A new capability is a new stage here, or a hook or start check of the state. Pure: no I/O.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import replace

from hsched.model import Job, NodeState
from hsched.sched.cache import RoundCache
from hsched.sched.fleet import Decision, DeviceChooser, FleetView, Launch, default_chooser, order
from hsched.sched.stages.backfill import Round
from hsched.sched.stages.elastic import elastic_stage
from hsched.sched.stages.eligibility import resolved
from hsched.sched.stages.hetjob import hetjob_stage
from hsched.sched.stages.plan import plan_stage
from hsched.sched.stages.work import Stage, Work

_SHARED = operator.attrgetter("spec.resources.shared")
"""A job's `--shared` (looked up for the whole queue at C speed: a generator was ~0.1 ms a round)."""


def sharing_stage(w: Work) -> None:
    """Shared jobs are packed first, apart from the policy: it plans whole GPUs."""
    if w.st.fleet.queue_apart and any(map(_SHARED, w.queue)):
        w.decisions += w.st.place_shared(order([j for j in w.queue if j.spec.resources.shared]))
        w.queue = [j for j in w.queue if not j.spec.resources.shared]


def backfill_stage(w: Work) -> None:
    """Every job still waiting, in the order served: backfill, released devices, QoS preemption, else a Wait."""
    jobs = w.served if w.served is not None else order(w.queue)
    w.decisions.extend(w.st.settle_all(jobs, w.reasons))
    w.queue = []


STAGES: tuple[Stage, ...] = (hetjob_stage, sharing_stage, plan_stage, backfill_stage, elastic_stage)
"""The live round's stages, in order (the held starts come first, before the state is built)."""


def schedule(fleet: FleetView, queue: Sequence[Job], now: float, chooser: DeviceChooser | None = None, *,
             cache: RoundCache | None = None, stages: Sequence[Stage] = STAGES) -> list[Decision]:
    """One live round (see the module docstring): a decision for every job of `queue`, in the order the round
    served them. `cache`: the caller's, kept from round to round (none: a fresh one, the same decisions)."""
    if cache is None:
        cache = RoundCache()
    if fleet.gpu_aliases:
        queue = [resolved(j, fleet.gpu_aliases) for j in queue]
    decisions: list[Decision] = []
    whole = queue  # (the held starts' jobs too: the elastic stage may start one smaller)
    if fleet.held:
        fleet, queue, decisions = held_starts(fleet, queue)
    st = Round(fleet, chooser or default_chooser(), now, cache)
    w = Work(st, list(queue), decisions, jobs=whole)
    for stage in stages:
        stage(w)
    cache.waits = st.waits
    st.keep_where()
    return w.decisions


def held_starts(fleet: FleetView, queue: Sequence[Job]) -> tuple[FleetView, list[Job], list[Decision]]:
    """A job a move promised devices to (`FleetView.held`) starts there as soon as it waits again and they are free;
    until then nobody else is given them. Returns the fleet with the held devices busy, the queue without the jobs
    started, and their launches."""
    up = {n.name for n in fleet.nodes if n.state is NodeState.UP}
    cpus = dict(fleet.cpus_used)
    mems = dict(fleet.memory_used)
    rest: list[Job] = []
    out: list[Decision] = []
    for j in queue:
        ps = fleet.held.get(j.id)
        if ps is not None and all(p.node in up and fleet.busy.isdisjoint(p.devices) for p in ps):
            out.append(Launch(j.id, ps))
            res = j.spec.resources
            for p in ps:
                if res.cpus:
                    cpus[p.node] = cpus.get(p.node, 0) + res.cpus
                if res.memory_mib:
                    mems[p.node] = mems.get(p.node, 0) + res.memory_mib
        else:
            rest.append(j)
    held = frozenset(u for ps in fleet.held.values() for p in ps for u in p.devices)
    return replace(fleet, busy=fleet.busy | held, cpus_used=cpus, memory_used=mems), rest, out
