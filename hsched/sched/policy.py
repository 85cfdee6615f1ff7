"""The policy contract, the registry, and the helpers policies share.

A policy turns a `PolicyInput` into a `Plan` (wanted jobs in priority order, each with acceptable GPU types).
It never places devices and never sees durations: the round function (`hsched.sched.round`) does the
packing, gang by gang, all or nothing. A clairvoyant policy subclasses `OraclePolicy`, must be named
`*-oracle`, and receives an `OracleInput` instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import chain
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
    return inp.throughput.fastest_types(job.job_type, job.gpus, inp.gpu_types, job.gpu_types)


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
    if pinned:
        gpus_of: dict[int, int] = {}
        for j in selected:
            gpus_of.setdefault(j.id, j.gpus)
        for jid, t in pinned.items():
            out[jid] = t
            caps[t] = caps.get(t, 0) - gpus_of.get(jid, 0)
    # `todo` stays in priority order (its index is the last tie-break); each job's speeds are looked up once
    todo = [(i, j) for i, j in enumerate(j for j in selected if j.id not in out)]
    model, all_types = inp.throughput, inp.gpu_types
    profile: dict[tuple[str, int, tuple[str, ...]], dict[str, float]] = {}
    rels: list[dict[str, float]] = []
    for _, j in todo:
        pk = (j.job_type, j.gpus, j.gpu_types)
        rel = profile.get(pk)
        if rel is None:
            full = model.rel_speeds(j.job_type, j.gpus, all_types)
            # a type the job may not use counts as one it cannot run on
            rel = profile[pk] = {t: (r if not j.gpu_types or t in j.gpu_types else 0.0) for t, r in full.items()}
        rels.append(rel)
    types = [t for t in all_types if caps.get(t, 0) > 0]
    while todo and types:
        slow, faster = types[-1], types[:-1]
        room_above = sum(max(0, caps[t]) for t in faster)
        need = sum(j.gpus for _, j in todo) - room_above
        # keep_frac: the fraction of its best speed on a faster type that the job keeps on the slow type;
        # -1 where it cannot run on the slow type, 2.0 where it runs nowhere faster (it must go here)
        # ranked by (-keep_frac, not already on the slow type, priority order): bucketed by fraction, since
        # jobs share a few speed profiles, and `todo` is already in priority order inside each bucket
        fracs: dict[int, float] = {}
        for rel in profile.values():
            here = rel.get(slow, 0.0)
            if here <= 0:
                fracs[id(rel)] = -1.0
            else:
                best = max((rel.get(t, 0.0) for t in faster), default=0.0)
                fracs[id(rel)] = here / best if best > 0 else 2.0
        if need <= 0 and faster and max(fracs.values()) <= 1.0:
            types.pop()  # the faster types hold everyone, and nobody must run here: nobody goes here
            continue
        buckets: dict[float, tuple[list[tuple[int, JobView]], list[tuple[int, JobView]]]] = {}
        for ij in todo:
            frac = fracs[id(rels[ij[0]])]
            bucket = buckets.get(frac)
            if bucket is None:
                bucket = buckets[frac] = ([], [])
            bucket[ij[1].gpu_type != slow].append(ij)
        # among equals, the job already there stays, then the first in priority order (the least served)
        # takes the slow type: the most-served jobs are the likeliest to keep running (heavy tails), so
        # they gain most from the fast GPUs, and the longest job is what sets the makespan
        cap = caps[slow]
        placed: set[int] = set()
        for frac in sorted(buckets, reverse=True):
            if frac < 0 or (need <= 0 and faster and frac <= 1.0):
                break  # the rest rank lower: none of them goes here
            for i, j in chain(*buckets[frac]):
                if need <= 0 and faster and frac <= 1.0:
                    break
                if j.gpus <= cap:
                    out[j.id] = slow
                    cap -= j.gpus
                    need -= j.gpus
                    placed.add(i)
        caps[slow] = cap
        if placed:
            todo = [(i, j) for i, j in todo if i not in placed]
        types.pop()
    return out


def wants_from_assignment(
    ordered: Iterable[JobView], assigned: Mapping[int, str], inp: PolicyInput
) -> tuple[Want, ...]:
    """Wants in priority order: assigned type first, then the job's other types as a fallback."""
    out = []
    model, all_types = inp.throughput, inp.gpu_types
    prefs: dict[tuple[str, int, tuple[str, ...], str], tuple[str, ...]] = {}
    for j in ordered:
        t = assigned.get(j.id)
        if t is None:
            continue
        key = (j.job_type, j.gpus, j.gpu_types, t)
        types = prefs.get(key)
        if types is None:
            ft = model.fastest_types(j.job_type, j.gpus, all_types, j.gpu_types)
            types = prefs[key] = (t, *(x for x in ft if x != t))
        out.append(Want(j.id, types))
    return tuple(out)
