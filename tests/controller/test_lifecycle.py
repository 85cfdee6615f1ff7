"""hsched.lifecycle: stop plans and how a job settles, as pure functions (no controller, no clock)."""

from __future__ import annotations

import pytest

from hsched.lifecycle import Step, StopReason, node_lost, plan_for, resumed_plan, settle
from hsched.model import CheckpointSignal, EndReason, Job, JobSpec, JobState, RunState

CK = 85


def job(state: JobState = JobState.RUNNING, reason: str = "", signal: str = "USR1@60", restarts: int = 0) -> Job:
    sig, grace = signal.split("@")
    spec = JobSpec(command=("x",), checkpoint_signal=CheckpointSignal(sig, float(grace)))
    return Job(id=1, spec=spec, user="u", state=state, reason=reason, submit_time=0.0, restarts=restarts)


def test_preemption_plan_is_checkpoint_signal_grace_term_then_kill_everything() -> None:
    plan = plan_for(job(), StopReason.PREEMPTED, 100.0, kill_after_s=10.0)
    assert plan.steps == (Step(100.0, "USR1", False), Step(160.0, "TERM", False), Step(161.0, "KILL", True))
    assert StopReason.PREEMPTED.state is JobState.PREEMPTING and StopReason.TIMEOUT.state is JobState.COMPLETING


def test_a_term_checkpoint_signal_goes_straight_to_kill_after_grace() -> None:
    plan = plan_for(job(signal="TERM@30"), StopReason.TIMEOUT, 0.0, kill_after_s=10.0)
    assert plan.steps == (Step(0.0, "TERM", False), Step(30.0, "KILL", True))


def test_cancel_and_rank_failure_plans() -> None:
    assert plan_for(job(), StopReason.CANCELLED, 0.0, 7.0).steps == (Step(0.0, "TERM", False),
                                                                      Step(7.0, "KILL", True))
    assert plan_for(job(), StopReason.RANK_FAILED, 0.0, 7.0).steps == (Step(0.0, "TERM", False),
                                                                        Step(2.0, "KILL", True))


def test_due_takes_the_steps_whose_time_has_come_in_order() -> None:
    plan = plan_for(job(), StopReason.PREEMPTED, 0.0, 10.0)
    due, rest = plan.due(59.9)
    assert [s.signal for s in due] == ["USR1"] and len(rest.steps) == 2
    due, rest = rest.due(61.0)
    assert [s.signal for s in due] == ["TERM", "KILL"] and rest.steps == ()
    assert rest.decided_at == 0.0


def test_a_resumed_plan_skips_the_first_signal_and_hurries() -> None:
    plan = resumed_plan(job(JobState.PREEMPTING, "preempted"), 500.0, 10.0)
    assert plan.steps == (Step(500.0, "TERM", False), Step(500.0, "KILL", True))
    assert resumed_plan(job(JobState.COMPLETING, "gibberish"), 1.0, 10.0).reason is StopReason.CANCELLED


@pytest.mark.parametrize(("state", "reason", "ended", "expect"), [
    (JobState.RUNNING, "", [(0, False)], (JobState.COMPLETED, EndReason.COMPLETED, 0)),
    (JobState.RUNNING, "", [(1, False)], (JobState.FAILED, EndReason.NONZERO_EXIT, 1)),
    (JobState.RUNNING, "", [(137, False)], (JobState.FAILED, EndReason.SIGNALED, 137)),
    (JobState.RUNNING, "", [(None, True)], (JobState.LOST, EndReason.LOST, None)),
    (JobState.RUNNING, "", [(CK, False)], (JobState.PENDING, EndReason.CHECKPOINTED, CK)),
    (JobState.COMPLETING, "cancelled", [(143, False)], (JobState.CANCELLED, EndReason.CANCELLED, 143)),
    (JobState.COMPLETING, "timeout", [(143, False)], (JobState.TIMEOUT, EndReason.TIMEOUT, 143)),
    (JobState.PREEMPTING, "preempted", [(CK, False)], (JobState.PENDING, EndReason.PREEMPTED, CK)),
    (JobState.PREEMPTING, "preempted", [(0, False)], (JobState.COMPLETED, EndReason.COMPLETED, 0)),
    # a gang: the first failure is the cause, the ranks stopped because of it come after
    (JobState.COMPLETING, "rank_failed", [(3, False), (143, False)], (JobState.FAILED, EndReason.RANK_FAILED, 3)),
])
def test_settle(state: JobState, reason: str, ended: list[tuple[int | None, bool]],
                expect: tuple[JobState, EndReason, int | None]) -> None:
    out = settle(job(state, reason), ended, CK)
    assert (out.state, out.reason, out.exit_code) == expect


def test_a_requeue_clears_placement_and_counts_a_restart() -> None:
    out = settle(job(JobState.PREEMPTING, "preempted", restarts=2), [(CK, False)], CK)
    fields = out.job_fields(job(restarts=2), now=50.0)
    assert fields["restarts"] == 3 and fields["placement"] == () and fields["end_time"] is None
    assert out.run_state(CK, False) is RunState.PREEMPTED
    done = settle(job(), [(0, False)], CK)
    assert done.job_fields(job(), 50.0)["end_time"] == 50.0 and done.run_state(0, False) is RunState.COMPLETED


def test_a_node_lost_past_its_lease_requeues_a_running_job() -> None:
    assert node_lost(job(JobState.RUNNING)).state is JobState.PENDING
    assert node_lost(job(JobState.RUNNING)).reason is EndReason.NODE_LOST
    assert node_lost(job(JobState.COMPLETING, "cancelled")).state is JobState.CANCELLED
