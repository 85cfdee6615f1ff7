"""First in, first out: Gavel's FIFO (heterogeneity-unaware) and its type-aware variant."""

from __future__ import annotations

from hsched.sched.policies.base import (
    Policy,
    fastest_types,
)
from hsched.sched.view import JobView, Plan, PolicyInput, Want


def _arrival_key(j: JobView) -> tuple[float, int]:
    return (j.arrival_s, j.id)


class Fifo(Policy):
    """First in, first out, heterogeneity-unaware: jobs start in arrival order, each on a GPU type picked at
    random (reproducibly, from the job id) among those with room, as Gavel's FIFO does; the head of the
    queue blocks the rest; no preemption.
    """

    name = "fifo"

    def plan(self, inp: PolicyInput) -> Plan:
        pending = sorted((j for j in inp.jobs if not j.running), key=_arrival_key)
        return Plan(tuple(Want(j.id) for j in pending), preempt=False, strict=True)


class FifoHetero(Policy):
    """FIFO that knows GPU types: jobs start in arrival order, each on the fastest GPU type (for that job)
    that has room; the head of the queue blocks the rest; no preemption.
    """

    name = "fifo-hetero"

    def plan(self, inp: PolicyInput) -> Plan:
        pending = sorted((j for j in inp.jobs if not j.running), key=_arrival_key)
        return Plan(tuple(Want(j.id, fastest_types(j, inp)) for j in pending), preempt=False, strict=True)
