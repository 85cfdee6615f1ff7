"""hsched.lifecycle: stop plans and how a job settles, as pure functions (no controller, no clock)."""

from __future__ import annotations

import pytest

from hsched.config import parse_checkpoint_signal
from hsched.lifecycle import EndRules, Step, StopReason, node_lost, plan_for, resumed_plan, settle, taken
from hsched.model import EndReason, Job, JobSpec, JobState, RunState

CK = 85
RULES = EndRules(checkpoint_exit_code=CK)


def job(state: JobState = JobState.RUNNING, reason: str = "", signal: str = "USR1@60", restarts: int = 0,
        retries: int | None = None, failures: int = 0, checkpoints: int = 0) -> Job:
    spec = JobSpec(command=("x",), checkpoint_signal=parse_checkpoint_signal(signal), retries=retries)
    return Job(id=1, spec=spec, user="u", state=state, reason=reason, submit_time=0.0, restarts=restarts,
               failures=failures, checkpoints=checkpoints)


def test_preemption_plan_is_checkpoint_signal_grace_term_then_kill_everything() -> None:
    # every signal reaches every process of the run: a trainer behind `bash -c` gets the checkpoint signal too
    plan = plan_for(job(), StopReason.PREEMPTED, 100.0, kill_after_s=10.0)
    assert plan.steps == (Step(100.0, "USR1"), Step(160.0, "TERM"), Step(161.0, "KILL"))
    assert all(s.all_processes and not s.batch_only for s in plan.steps)
    assert StopReason.PREEMPTED.state is JobState.PREEMPTING and StopReason.TIMEOUT.state is JobState.COMPLETING


def test_a_batch_only_checkpoint_signal_goes_to_the_batch_shell_alone_and_the_escalation_to_all() -> None:
    plan = plan_for(job(signal="B:USR1@60"), StopReason.PREEMPTED, 0.0, kill_after_s=10.0)
    assert plan.steps == (Step(0.0, "USR1", False, True), Step(60.0, "TERM"), Step(61.0, "KILL"))
    # a restarted controller keeps it that way
    resumed = resumed_plan(job(JobState.PREEMPTING, "preempted", signal="B:USR1@60"), 5.0, 10.0)
    assert resumed.steps == (Step(5.0, "TERM"), Step(5.0, "KILL"))


def test_a_term_checkpoint_signal_goes_straight_to_kill_after_grace() -> None:
    plan = plan_for(job(signal="TERM@30"), StopReason.TIMEOUT, 0.0, kill_after_s=10.0)
    assert plan.steps == (Step(0.0, "TERM"), Step(30.0, "KILL"))


def test_cancel_and_rank_failure_plans() -> None:
    assert plan_for(job(), StopReason.CANCELLED, 0.0, 7.0).steps == (Step(0.0, "TERM"), Step(7.0, "KILL"))
    assert plan_for(job(), StopReason.RANK_FAILED, 0.0, 7.0).steps == (Step(0.0, "TERM"), Step(2.0, "KILL"))


def test_due_takes_the_steps_whose_time_has_come_in_order() -> None:
    plan = plan_for(job(), StopReason.PREEMPTED, 0.0, 10.0)
    due, rest = plan.due(59.9)
    assert [s.signal for s in due] == ["USR1"] and len(rest.steps) == 2
    due, rest = rest.due(61.0)
    assert [s.signal for s in due] == ["TERM", "KILL"] and rest.steps == ()
    assert rest.decided_at == 0.0


def test_a_resumed_plan_skips_the_first_signal_and_hurries() -> None:
    plan = resumed_plan(job(JobState.PREEMPTING, "preempted"), 500.0, 10.0)
    assert plan.steps == (Step(500.0, "TERM"), Step(500.0, "KILL"))
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
    out = settle(job(state, reason), ended, RULES)
    assert (out.state, out.reason, out.exit_code) == expect


def test_a_requeue_clears_placement_and_counts_a_restart() -> None:
    out = settle(job(JobState.PREEMPTING, "preempted", restarts=2), [(CK, False)], RULES)
    fields = out.job_fields(job(restarts=2), now=50.0)
    assert fields["restarts"] == 3 and fields["placement"] == () and fields["end_time"] is None
    assert out.run_state(CK, False) is RunState.PREEMPTED
    done = settle(job(), [(0, False)], RULES)
    assert done.job_fields(job(), 50.0)["end_time"] == 50.0 and done.run_state(0, False) is RunState.COMPLETED


def test_a_node_lost_past_its_lease_requeues_a_running_job() -> None:
    assert node_lost(job(JobState.RUNNING)).state is JobState.PENDING
    assert node_lost(job(JobState.RUNNING)).reason is EndReason.NODE_LOST
    assert node_lost(job(JobState.COMPLETING, "cancelled")).state is JobState.CANCELLED


def test_a_run_its_node_took_away_requeues_the_job_without_using_a_retry() -> None:
    # a Slurm group's PREEMPTED and NODE_FAIL: no fault of the run, so no retry is used, none is given back
    out = taken(job(JobState.RUNNING, retries=0), EndReason.PREEMPTED, "preempted by cluster's own scheduler")
    assert (out.state, out.reason, out.event, out.failures) == (JobState.PENDING, EndReason.PREEMPTED, "preempted", 0)
    assert out.message == "preempted by cluster's own scheduler: requeued, restarts 1"
    j = job(JobState.RUNNING, retries=2, failures=1, checkpoints=2, restarts=3)
    out = taken(j, EndReason.NODE_LOST, "its node failed under it (cluster)")
    assert (out.state, out.reason, out.event) == (JobState.PENDING, EndReason.NODE_LOST, "node_lost")
    fields = out.job_fields(j, 10.0)
    assert (fields["failures"], fields["checkpoints"], fields["restarts"]) == (1, 2, 4)
    # a stop under way settles as it would have
    assert taken(job(JobState.COMPLETING, "cancelled"), EndReason.NODE_LOST, "x").state is JobState.CANCELLED
    assert taken(job(JobState.COMPLETING, "timeout"), EndReason.PREEMPTED, "x").state is JobState.TIMEOUT


def test_a_failure_is_retried_with_a_doubling_backoff_until_the_budget_is_spent() -> None:
    rules = EndRules(checkpoint_exit_code=CK, retries=0, backoff_s=10.0, backoff_max_s=360.0)
    waits = []
    j = job(retries=3)
    for _ in range(3):
        out = settle(j, [(1, False)], rules, now=1000.0)
        assert (out.state, out.reason, out.event) == (JobState.PENDING, EndReason.RETRY_BACKOFF, "retry")
        assert out.exit_code == 1 and out.failures == j.failures + 1
        assert out.begin_time is not None
        waits.append(out.begin_time - 1000.0)
        fields = out.job_fields(j, 1000.0)
        assert fields["begin_time"] == out.begin_time and fields["failures"] == out.failures
        j = job(retries=3, failures=out.failures, restarts=j.restarts + 1)
    assert waits == [10.0, 20.0, 40.0]
    last = settle(j, [(1, False)], rules, now=2000.0)
    assert (last.state, last.reason, last.exit_code) == (JobState.FAILED, EndReason.NONZERO_EXIT, 1)
    assert "no retries left (3 used)" in last.message
    assert EndRules(backoff_s=10.0, backoff_max_s=360.0).backoff(10) == 360.0


def test_the_settings_default_applies_unless_the_job_says_and_zero_means_never() -> None:
    rules = EndRules(checkpoint_exit_code=CK, retries=2)
    assert settle(job(), [(1, False)], rules).state is JobState.PENDING
    assert settle(job(retries=0), [(1, False)], rules).state is JobState.FAILED


def test_a_fatal_exit_code_fails_at_once_whatever_the_budget() -> None:
    out = settle(job(retries=5), [(127, False)], RULES)
    assert (out.state, out.exit_code) == (JobState.FAILED, 127) and "fatal" in out.message


def test_a_lost_run_uses_the_same_budget() -> None:
    out = settle(job(retries=1), [(None, True)], RULES, now=50.0)
    assert (out.state, out.reason, out.begin_time) == (JobState.PENDING, EndReason.RETRY_BACKOFF, 60.0)
    spent = settle(job(retries=1, failures=1), [(None, True)], RULES)
    assert (spent.state, spent.reason, spent.exit_code) == (JobState.LOST, EndReason.LOST, None)


def test_preemption_node_loss_and_checkpoint_exits_do_not_use_retries() -> None:
    pre = settle(job(JobState.PREEMPTING, "preempted", retries=1), [(143, False)], RULES)
    assert pre.state is JobState.PENDING and pre.failures == 0
    ck = settle(job(retries=1), [(CK, False)], RULES)
    assert ck.state is JobState.PENDING and ck.failures == 0 and ck.checkpoints == 1
    assert node_lost(job(JobState.RUNNING, retries=1)).failures == 0
    # and a node lost keeps what was used before: it gave back neither retries nor checkpoint exits
    kept = node_lost(job(JobState.RUNNING, retries=3, failures=2, checkpoints=1))
    assert (kept.failures, kept.checkpoints) == (2, 1)


def test_a_job_that_keeps_checkpointing_on_its_own_ends_at_max_restarts() -> None:
    rules = EndRules(checkpoint_exit_code=CK, max_restarts=3)
    assert settle(job(checkpoints=2), [(CK, False)], rules).state is JobState.PENDING
    out = settle(job(checkpoints=3), [(CK, False)], rules)
    assert (out.state, out.reason, out.exit_code) == (JobState.FAILED, EndReason.MAX_RESTARTS, CK)
    # checkpoints asked for by a preemption are hsched's doing, not the job's: they never count
    assert settle(job(JobState.PREEMPTING, "preempted", checkpoints=3), [(CK, False)], rules).state \
        is JobState.PENDING


def test_an_out_of_memory_kill_is_reported_as_oom() -> None:
    out = settle(job(), [(137, False)], RULES, oom=True)
    assert (out.state, out.reason, out.exit_code) == (JobState.FAILED, EndReason.OOM, 137)
    assert "out of memory" in out.message


def test_b_prefix_round_trips_through_the_store_format() -> None:
    from hsched.serialize import spec_from_dict, spec_to_dict

    spec = JobSpec(command=("x",), checkpoint_signal=parse_checkpoint_signal("B:USR1@60"), retries=2)
    back = spec_from_dict(spec_to_dict(spec))
    assert back.checkpoint_signal.batch_only and back.checkpoint_signal.grace_s == 60.0 and back.retries == 2
    assert str(back.checkpoint_signal) == "B:USR1@60"
