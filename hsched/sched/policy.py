"""The policy contract, the registry, and the helpers policies share.

A policy turns a `PolicyInput` into a `Plan` (wanted jobs in priority order, each with acceptable GPU types).
It never places devices and never sees durations: the round function (`hsched.sched.round`) does the
packing, gang by gang, all or nothing. A clairvoyant policy subclasses `OraclePolicy`, must be named
`*-oracle`, and receives an `OracleInput` instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import ClassVar

from hsched.sched.view import JobView, OracleInput, Plan, PolicyInput, Want


class Policy:
    """A non-clairvoyant policy. Subclasses set `name` and implement `plan`."""

    name: ClassVar[str] = ""
    clairvoyant: ClassVar[bool] = False
    time_sharing: ClassVar[bool] = False
    """True when the policy wants a round every quantum (priorities change as jobs run), not only on events."""

    def plan(self, inp: PolicyInput) -> Plan:
        raise NotImplementedError


class OraclePolicy:
    """A clairvoyant policy, for reference only: it reads remaining times, which no real scheduler has."""

    name: ClassVar[str] = ""
    clairvoyant: ClassVar[bool] = True
    time_sharing: ClassVar[bool] = False

    def plan(self, inp: OracleInput) -> Plan:
        raise NotImplementedError


AnyPolicy = Policy | OraclePolicy

_REGISTRY: dict[str, Callable[[], AnyPolicy]] = {}


def register(cls: type[Policy] | type[OraclePolicy]) -> type:
    """Class decorator: add a policy under its `name`. Clairvoyance and the `-oracle` suffix go together."""
    if cls.clairvoyant != cls.name.endswith("-oracle"):
        raise TypeError(f"policy {cls.name!r}: only policies named '*-oracle' may be clairvoyant")
    _REGISTRY[cls.name] = cls
    return cls


def policy_names() -> tuple[str, ...]:
    _load_builtin()
    return tuple(_REGISTRY)


def make_policy(name: str) -> AnyPolicy:
    """A fresh policy by name; KeyError lists the known names."""
    _load_builtin()
    try:
        return _REGISTRY[name]()
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; known: {', '.join(_REGISTRY)}") from None


def _load_builtin() -> None:
    # Imported lazily so that policy modules can import this one without a cycle.
    from hsched.sched import hsched_policy, policies  # noqa: F401


# ---------------------------------------------------------------- helpers shared by several policies


def fastest_types(job: JobView, inp: PolicyInput) -> tuple[str, ...]:
    """The job's allowed, runnable GPU types, fastest for this job first."""
    rel = inp.throughput.rel_speeds(job.job_type, job.gpus, inp.gpu_types)
    types = [t for t in inp.gpu_types if rel.get(t, 0.0) > 0 and job.allows(t)]
    return tuple(sorted(types, key=lambda t: -rel[t]))


def select_by_capacity(ordered: Iterable[JobView], capacity: Mapping[str, int], inp: PolicyInput) -> list[JobView]:
    """Jobs in priority order that fit the fleet's total GPU count, gangs whole; later small jobs fill gaps.

    Counting GPUs over all types is what lets a heterogeneity-aware assignment decide the types afterwards.
    """
    free = sum(capacity.values())
    biggest = max(capacity.values(), default=0)
    out: list[JobView] = []
    for j in ordered:
        if free <= 0:
            break
        # a gang must fit one GPU type (it runs on one type, as in Gavel's model)
        if j.gpus <= free and j.gpus <= biggest:
            out.append(j)
            free -= j.gpus
    return out


def hetero_assign(
    selected: Sequence[JobView],
    capacity: Mapping[str, int],
    inp: PolicyInput,
    pinned: Mapping[int, str] | None = None,
) -> dict[int, str]:
    """Give each selected job a GPU type so that total normalised throughput is high.

    Types are filled slowest first: the slowest type takes the jobs that keep the largest fraction of their
    best remaining speed there, and only as many GPUs as the faster types cannot hold. Repeating this up the
    list leaves the fastest GPUs to the jobs that gain most from them (Gavel's insight, greedily: no LP).
    Ties go to jobs already on that type, so equal jobs do not swap places each round, then to the
    least-served job, so long-running jobs hold the faster GPUs. `pinned` jobs keep
    their type and use its capacity first.
    """
    caps = dict(capacity)
    out: dict[int, str] = {}
    for jid, t in (pinned or {}).items():
        out[jid] = t
        caps[t] = caps.get(t, 0) - next((j.gpus for j in selected if j.id == jid), 0)
    todo = [j for j in selected if j.id not in out]
    rels = {j.id: inp.throughput.rel_speeds(j.job_type, j.gpus, inp.gpu_types) for j in todo}
    order = {j.id: i for i, j in enumerate(todo)}
    types = [t for t in inp.gpu_types if caps.get(t, 0) > 0]
    while todo and types:
        slow, faster = types[-1], types[:-1]
        room_above = sum(max(0, caps[t]) for t in faster)
        need = sum(j.gpus for j in todo) - room_above

        def keep_frac(j: JobView, slow: str = slow, faster: Sequence[str] = faster) -> float:
            rel = rels[j.id]
            if rel.get(slow, 0.0) <= 0 or not j.allows(slow):
                return -1.0
            best = max((rel.get(t, 0.0) for t in faster if j.allows(t)), default=0.0)
            return rel[slow] / best if best > 0 else 2.0  # 2.0: runs nowhere faster, must go here

        # among equals, the job already there stays, then the first in priority order (the least served)
        # takes the slow type: the most-served jobs are the likeliest to keep running (heavy tails), so
        # they gain most from the fast GPUs, and the longest job is what sets the makespan
        ranked = sorted(todo, key=lambda j: (-keep_frac(j), j.gpu_type != slow, order[j.id]))
        left: list[JobView] = []
        for j in ranked:
            frac = keep_frac(j)
            if (need > 0 or not faster or frac > 1.0) and j.gpus <= caps[slow] and frac >= 0:
                out[j.id] = slow
                caps[slow] -= j.gpus
                need -= j.gpus
            else:
                left.append(j)
        todo = sorted(left, key=lambda j: order[j.id])
        types.pop()
    return out


def wants_from_assignment(
    ordered: Iterable[JobView], assigned: Mapping[int, str], inp: PolicyInput
) -> tuple[Want, ...]:
    """Wants in priority order: assigned type first, then the job's other types as a fallback."""
    out = []
    for j in ordered:
        t = assigned.get(j.id)
        if t is None:
            continue
        rest = tuple(x for x in fastest_types(j, inp) if x != t)
        out.append(Want(j.id, (t, *rest)))
    return tuple(out)
