"""The scheduling core: pure policies and the scheduling round, shared by the controller and the simulator.

The live controller calls, once per event or quantum:

    inp = build_input(now, job_views, servers, throughput, checkpoint_cost_s=..., round_s=...)
    decision = schedule_round(make_policy("hsched"), inp, servers)
    # decision.preempt: job ids to checkpoint and requeue; decision.starts: jobs to launch or move

No asyncio, sqlite, textual or networkx here: only frozen data in, frozen data out.
"""

from hsched.sched.placement import PackingPlacer, Placer
from hsched.sched.policy import OraclePolicy, Policy, make_policy, policy_names, register
from hsched.sched.round import apply_plan, build_input, schedule_round
from hsched.sched.throughput import ThroughputModel
from hsched.sched.view import (
    JobPhase,
    JobView,
    OracleInput,
    Plan,
    PolicyInput,
    RoundDecision,
    ServerView,
    Start,
    Want,
)

__all__ = [
    "JobPhase",
    "JobView",
    "OracleInput",
    "OraclePolicy",
    "PackingPlacer",
    "Placer",
    "Plan",
    "Policy",
    "PolicyInput",
    "RoundDecision",
    "ServerView",
    "Start",
    "ThroughputModel",
    "Want",
    "apply_plan",
    "build_input",
    "make_policy",
    "policy_names",
    "register",
    "schedule_round",
]
