"""The round's placement counts a kept job's devices on its own node only: a device's name is its node's (an AMD GPU
with no UUID is named by its PCI address, hsched.node.amd, the same on two alike machines)."""

from __future__ import annotations

from hsched.model import Placement
from hsched.sched import JobPhase, JobView, ServerView, build_input, make_policy, schedule_round
from tests.sched.handmade import model

SAME = ("AMD-0000:03:00.0", "AMD-0000:43:00.0")  # what hsched.node.amd names two GPUs with no UUID, on each machine


def test_a_kept_job_holds_the_devices_of_its_own_node_not_their_namesakes_elsewhere() -> None:
    servers = [ServerView("a", "fast", SAME), ServerView("b", "fast", SAME)]
    kept = JobView(0, "G", 2, 0.0, JobPhase.RUNNING, gpu_type="fast", placement=(Placement("a", SAME),),
                   run_start_s=0.0)
    new = JobView(1, "G", 2, 1.0)
    for policy in ("fifo", "hsched"):
        d = schedule_round(make_policy(policy), build_input(10.0, [kept, new], servers, model()), servers)
        assert d.preempt == ()
        assert [(s.job_id, s.placement) for s in d.starts] == [(1, (Placement("b", SAME),))], policy
