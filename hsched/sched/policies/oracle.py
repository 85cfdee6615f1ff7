"""The clairvoyant reference: shortest remaining time first, reading what no real scheduler knows."""

from __future__ import annotations

import math

from hsched.sched.policies.base import (
    OraclePolicy,
    fastest_types,
)
from hsched.sched.view import OracleInput, Plan, Want


class SrtfOracle(OraclePolicy):
    """Shortest remaining time first, clairvoyant (reference only): reads each job's remaining time on its
    fastest type, which no real scheduler knows; shortest first, each on its fastest free type. Preemptive.
    """

    name = "srtf-oracle"

    def plan(self, inp: OracleInput) -> Plan:
        base = inp.base
        ordered = sorted(base.jobs, key=lambda j: (inp.remaining_s.get(j.id, math.inf), j.arrival_s, j.id))
        return Plan(tuple(Want(j.id, fastest_types(j, base)) for j in ordered), preempt=True, strict=False)
