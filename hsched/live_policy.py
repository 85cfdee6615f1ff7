"""The live fleet through the scheduling core (hsched.sched): the same round function the simulator calls.

`core_round` turns the controller's nodes and jobs into the core's ServerViews and JobViews, asks the policy
(by default `hsched`: QoS, priority, fair share, least attained service, heterogeneity) for its plan, and
applies it with `apply_plan`, exactly as the simulator does, with two live differences:

* running jobs are never time-shared away (the plan is applied non-preemptively); taking GPUs from a
  running job is the QoS preemption rule's business (hsched.scheduling), with checkpoint signals;
* devices are chosen by `LivePlacer`: the simulator's best-fit server choice, then the topology engine
  for the devices inside the server, honouring GPU memory, models, NVLink and CPUs.

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from hsched.model import Job, Node, NodeState, Placement
from hsched.sched.placement import best_fit_key
from hsched.sched.policy import make_policy
from hsched.sched.round import apply_plan, build_input
from hsched.sched.throughput import ThroughputModel
from hsched.sched.view import JobPhase, JobView, Plan, ServerView

Fit = Callable[[Node, Job, Sequence[str]], Placement | None]
"""Place `job` on `node` using only the given free devices, or None."""


def gpu_type_of(model: str) -> str:
    """The core's GPU type for a device model: the accelerator table's key ("h100", "a100"...) or the model."""
    from hsched.topo.models import lookup_model

    known = lookup_model(model)
    return known.key if known is not None else model.lower()


def catalog_throughput() -> ThroughputModel:
    """Unknown live jobs run at the accelerator table's relative training speed of each GPU type."""
    from hsched.topo.models import DEFAULT_CATALOG

    return ThroughputModel(prior={m.key.lower(): m.train for m in DEFAULT_CATALOG.models})


def node_type(node: Node) -> str | None:
    return gpu_type_of(node.devices[0].model) if node.devices else None


@dataclass(frozen=True, slots=True)
class Running:
    """A running job as the scheduler may see it: its request and how long it has run, never its remaining
    work or duration."""

    job: Job
    started: float
    """When its current attempt started."""

    @property
    def id(self) -> int:
        return self.job.id

    @property
    def qos(self) -> str:
        return self.job.spec.qos

    @property
    def priority(self) -> int:
        return self.job.spec.priority

    @property
    def placements(self) -> tuple[Placement, ...]:
        return self.job.placement

    @property
    def devices(self) -> frozenset[str]:
        return frozenset(u for p in self.job.placement for u in p.devices)


@dataclass(frozen=True, slots=True)
class CoreDecision:
    starts: tuple[tuple[int, tuple[Placement, ...]], ...]
    waiting: Mapping[int, str]
    order: tuple[int, ...]
    """Pending job ids in the order the policy serves them (wanted first)."""


class LivePlacer:
    """The simulator's server choice (best fit, NVLink first) with real constraints and topology inside."""

    def __init__(self, nodes: Mapping[str, Node], jobs: Mapping[int, Job], fit: Fit,
                 prefer: Mapping[int, str] | None = None) -> None:
        self.nodes = nodes
        self.jobs = jobs
        self.fit = fit
        self.prefer = prefer or {}

    def place(self, gpus: int, servers: Sequence[ServerView], free: Mapping[str, Sequence[str]],
              max_servers: int | None, job: JobView | None = None) -> tuple[Placement, ...] | None:
        if job is None or job.id not in self.jobs:
            return None
        j = self.jobs[job.id]
        home = self.prefer.get(j.id)
        # the node holding the job's checkpoint first (no copy), then the simulator's best fit
        ranked = sorted(servers, key=lambda s: (s.name != home, best_fit_key(s, len(free.get(s.name, ())))))
        need = j.spec.resources.nodes
        out: list[Placement] = []
        for s in ranked:
            p = self.fit(self.nodes[s.name], j, free.get(s.name, ()))
            if p is not None:
                out.append(p)
                if len(out) == need:
                    return tuple(out)
        return None


def _view(job: Job, allowed: tuple[str, ...], types_of: Mapping[str, str], now: float,
          running: Running | None) -> JobView:
    res = job.spec.resources
    common = {"id": job.id, "job_type": "", "gpus": max(1, res.gpus * res.nodes), "arrival_s": job.submit_time,
              "qos": job.spec.qos, "priority": job.spec.priority, "user": job.user, "restarts": job.restarts,
              "time_limit_s": job.spec.time_limit_s, "max_servers": res.nodes, "gpu_types": allowed}
    if running is None:
        return JobView(**common)  # type: ignore[arg-type]
    node = job.placement[0].node if job.placement else ""
    run_s = max(0.0, now - running.started)
    gpus = sum(len(p.devices) for p in job.placement) or common["gpus"]
    return JobView(**{**common, "gpus": gpus}, phase=JobPhase.RUNNING, gpu_type=types_of.get(node),  # type: ignore[arg-type]
                   placement=job.placement, run_start_s=running.started, run_s=run_s, service_s=run_s)


def core_round(policy_name: str, nodes: Sequence[Node], pending: Sequence[Job], running: Sequence[Running],
               unavailable: frozenset[str], fit: Fit, now: float,
               throughput: ThroughputModel | None = None, prefer: Mapping[int, str] | None = None) -> CoreDecision:
    """One round of the core's policy over the live fleet. `unavailable`: devices held by jobs that are not
    in `running` (launching, stopping), which no one may be given this round."""
    policy = make_policy(policy_name)
    if policy.clairvoyant:
        raise ValueError(f"policy {policy_name!r} needs job durations, which a live fleet does not know")
    up = [n for n in nodes if n.state is NodeState.UP and n.devices]
    types_of = {n.name: t for n in up if (t := node_type(n)) is not None}
    servers = [ServerView(name=n.name, gpu_type=types_of[n.name],
                          devices=tuple(d.uuid for d in n.devices if d.uuid not in unavailable),
                          link="nvlink" if any(lk.kind.upper().startswith("NV") for lk in n.links) else "pcie")
               for n in up]
    usage: dict[str, float] = {}
    for r in running:
        usage[r.job.user] = usage.get(r.job.user, 0.0) + r.job.spec.resources.gpus * max(0.0, now - r.started)

    def allowed(job: Job) -> tuple[str, ...]:
        res = job.spec.resources
        return tuple(sorted({types_of[n.name] for n in up if any(
            res.matches_model(d.model) and (res.gpu_memory_mib is None or d.memory_total_mib is None
                                            or d.memory_total_mib >= res.gpu_memory_mib)
            for d in n.devices)}))

    views = [_view(r.job, (), types_of, now, r) for r in running if r.job.placement]
    views += [_view(j, allowed(j), types_of, now, None) for j in pending]
    model = throughput or catalog_throughput()
    inp = build_input(now, sorted(views, key=lambda v: (v.arrival_s, v.id)), servers, model,
                      user_usage=usage if len(usage) > 1 else {})
    plan = policy.plan(inp)  # type: ignore[arg-type]
    live_plan = Plan(plan.wants, preempt=False, strict=plan.strict)
    placer = LivePlacer({n.name: n for n in up}, {j.id: j for j in pending}, fit, prefer)
    decision = apply_plan(live_plan, inp, servers, placer)
    pending_ids = {j.id for j in pending}
    wanted = [w.job_id for w in plan.wants if w.job_id in pending_ids]
    rest = [j.id for j in sorted(pending, key=lambda j: (j.submit_time, j.id)) if j.id not in set(wanted)]
    return CoreDecision(
        starts=tuple((s.job_id, s.placement) for s in decision.starts if s.job_id in pending_ids),
        waiting={k: v for k, v in decision.waiting.items() if k in pending_ids},
        order=tuple(wanted + rest),
    )
