"""The scheduling core: pure policies and the scheduling round, shared by the controller and the simulator.

The simulator calls, once per event or quantum:

    inp = build_input(now, job_views, servers, throughput, checkpoint_cost_s=..., round_s=...)
    decision = schedule_round(make_policy("hsched"), inp, servers, rule=PreemptRule.from_qos(settings.qos))
    # decision.preempt: job ids to stop (checkpoint and requeue); decision.starts: jobs to launch or move

The live controller calls the same steps as one stage of its round (hsched.sched.pipeline `schedule`, re-exported
by hsched.sched.live), whose other stages add what only a live fleet has: real device constraints, caps, shared
GPUs, devices being released, CPU-only jobs.

No asyncio, sqlite, textual or networkx here: only frozen data in, frozen data out.

    view.py        what a policy sees and what a round decides (JobView, ServerView, Plan, Start, Preempt)
    policy.py      the policy contract and the helpers policies share
    policies.py    the reference policies;  hsched_policy.py: hsched's own
    registry.py    policies by name (make_policy, policy_names, register)
    throughput.py  how fast each job type runs on each GPU type
    placement.py   which devices a gang gets on servers of one type (PackingPlacer)
    preempt.py     every preemption: the time-sharing rule and QoS victims (PreemptRule, Victims)
    round.py       one round: plan, apply under the rule, QoS preemption (schedule_round)
    servers.py     a node as a server of one GPU type (the one conversion, live and simulated)
    fleet.py       what a live round reads and decides (FleetView, Running, Launch, Wait, Move)
    cache.py       RoundCache: what one live round keeps for the next, owned by the caller
    state.py       the live round's ledger and index (RoundState: free, held, taken devices; fit)
    stages/        the live round's stages: eligibility, caps, sharing, plan, reservation, backfill,
                   preemption, locality (the one prefetch rule), groups (Slurm node groups)
    pipeline.py    the live round: FleetView -> Launch / Wait / Preempt / Move decisions (schedule)
    live.py        the names the controller, CLI and tests import, re-exported
"""

from hsched.sched.placement import PackingPlacer, Placer
from hsched.sched.policies.base import OraclePolicy, Policy
from hsched.sched.preempt import PreemptRule, Victims
from hsched.sched.registry import make_policy, policy_names, register
from hsched.sched.round import apply_plan, apply_rule, build_input, schedule_round
from hsched.sched.throughput import ThroughputModel
from hsched.sched.view import (
    JobPhase,
    JobView,
    OracleInput,
    Plan,
    PolicyInput,
    Preempt,
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
    "Preempt",
    "PreemptRule",
    "RoundDecision",
    "ServerView",
    "Start",
    "ThroughputModel",
    "Victims",
    "Want",
    "apply_plan",
    "apply_rule",
    "build_input",
    "make_policy",
    "policy_names",
    "register",
    "schedule_round",
]
