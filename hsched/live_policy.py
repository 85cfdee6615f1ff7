"""The bridge from the live fleet to the scheduling core's policies (hsched.sched): same code, live data.

The policy (by default `hsched`: QoS, fair share, least attained service, heterogeneity) decides the order in
which pending jobs are considered and, for each, the GPU types it should run on, best first. The live
scheduler (hsched.scheduling) then places them on real devices with the topology engine and applies the
QoS preemption rules. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hsched.model import Job, Node, NodeState
from hsched.sched.policy import make_policy
from hsched.sched.round import build_input
from hsched.sched.throughput import ThroughputModel
from hsched.sched.view import JobPhase, JobView, ServerView


def gpu_type_of(model: str) -> str:
    """The core's GPU type for a device model: the accelerator table's key ("h100", "a100"...) or the model."""
    from hsched.topo.models import lookup_model

    known = lookup_model(model)
    return known.key if known is not None else model.lower()


def node_type(node: Node) -> str | None:
    return gpu_type_of(node.devices[0].model) if node.devices else None


@dataclass(frozen=True, slots=True)
class Running:
    job: Job
    started: float
    """When its current attempt started."""


@dataclass(frozen=True, slots=True)
class Preference:
    """A pending job in the order the policy serves it, and the GPU types it should run on, best first."""

    job: Job
    types: tuple[str, ...]
    wanted: bool
    """False when the policy would not run it this round (it may still fill a gap nobody else can use)."""


def _view(job: Job, nodes: Sequence[Node], types_of: Mapping[str, str], now: float,
          running: Running | None) -> JobView:
    res = job.spec.resources
    allowed = tuple(sorted({types_of[n.name] for n in nodes if n.name in types_of
                            and any(res.matches_model(d.model) for d in n.devices)}))
    if running is None:
        return JobView(id=job.id, job_type="", gpus=max(1, res.gpus * res.nodes), arrival_s=job.submit_time,
                       qos=job.spec.qos, priority=job.spec.priority, user=job.user, restarts=job.restarts,
                       time_limit_s=job.spec.time_limit_s, max_servers=res.nodes, gpu_types=allowed)
    node = job.placement[0].node if job.placement else ""
    run_s = max(0.0, now - running.started)
    return JobView(id=job.id, job_type="", gpus=max(1, res.gpus * res.nodes), arrival_s=job.submit_time,
                   phase=JobPhase.RUNNING, qos=job.spec.qos, priority=job.spec.priority, user=job.user,
                   gpu_type=types_of.get(node), placement=job.placement, run_start_s=running.started,
                   run_s=run_s, service_s=run_s, restarts=job.restarts, time_limit_s=job.spec.time_limit_s,
                   max_servers=res.nodes, gpu_types=allowed)


def preferences(policy_name: str, nodes: Sequence[Node], pending: Sequence[Job], running: Sequence[Running],
                now: float, throughput: ThroughputModel | None = None) -> list[Preference]:
    """Ask the policy for this round's order and GPU types. Clairvoyant policies are refused: live jobs
    have no known duration."""
    policy = make_policy(policy_name)
    if policy.clairvoyant:
        raise ValueError(f"policy {policy_name!r} needs job durations, which a live fleet does not know")
    up = [n for n in nodes if n.state is NodeState.UP and n.devices]
    types_of = {n.name: t for n in up if (t := node_type(n)) is not None}
    servers = [ServerView(name=n.name, gpu_type=types_of[n.name], devices=tuple(d.uuid for d in n.devices),
                          link="nvlink" if any(lk.kind.upper().startswith("NV") for lk in n.links) else "pcie")
               for n in up]
    usage: dict[str, float] = {}
    for r in running:
        usage[r.job.user] = usage.get(r.job.user, 0.0) + r.job.spec.resources.gpus * max(0.0, now - r.started)
    views = [_view(r.job, up, types_of, now, r) for r in running if r.job.spec.resources.gpus > 0]
    gpu_pending = [j for j in pending if j.spec.resources.gpus > 0]
    views += [_view(j, up, types_of, now, None) for j in gpu_pending]
    model = throughput or ThroughputModel()
    inp = build_input(now, sorted(views, key=lambda v: (v.arrival_s, v.id)), servers, model,
                      user_usage=usage if len(usage) > 1 else {})
    plan = policy.plan(inp)  # type: ignore[arg-type]
    by_id = {j.id: j for j in pending}
    out: list[Preference] = []
    seen: set[int] = set()
    for want in plan.wants:
        job = by_id.get(want.job_id)
        if job is not None:
            out.append(Preference(job, want.types, True))
            seen.add(job.id)
    # CPU-only jobs and jobs the policy left out this round come after, in QoS/priority/arrival order
    from hsched.scheduling import order

    out += [Preference(j, (), j.spec.resources.gpus == 0) for j in order([j for j in pending if j.id not in seen])]
    return out
