"""Finish-time fairness (Themis, as Gavel runs it): the job furthest behind its fair finish time first."""

from __future__ import annotations

import math

from hsched.sched.policies.las import HeteroFair
from hsched.sched.view import JobView, PolicyInput


class FinishTimeFairness(HeteroFair):
    """Themis finish-time fairness, non-clairvoyant: a job's rho is its time in the system over the time an
    exclusive 1/N share of the cluster would have needed for the progress it has made; the highest rho runs
    first (new jobs have infinite rho), then types are given by efficiency as in las-hetero. Preemptive.
    """

    name = "ftf"

    def order(self, inp: PolicyInput) -> list[JobView]:
        total = max(1, sum(inp.capacity.values()))
        n = max(1, len(inp.jobs))

        def rho(j: JobView) -> float:
            share = min(1.0, total / (n * j.gpus))
            if j.service_s <= 0:
                return math.inf
            return (inp.now - j.arrival_s) * share / j.service_s

        return sorted(inp.jobs, key=lambda j: (-rho(j), j.arrival_s, j.id))
