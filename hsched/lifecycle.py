"""A job's life as pure functions: how a stop unfolds in time, and what a job becomes when its runs end.

Every stop is a short plan of signals in time:

    preempt     checkpoint signal (e.g. USR1) -> grace -> SIGTERM -> 1 s -> SIGKILL to every process
    timeout     same as preempt (the job may checkpoint), ending TIMEOUT
    cancel      SIGTERM -> kill_after_s -> SIGKILL to every process
    rank died   SIGTERM to the other ranks -> 2 s -> SIGKILL (no hung collectives)

The plan's *reason* is durable (the job's `reason`, written in the same transaction as its state change);
the timing lives in memory. A controller restarted mid-stop rebuilds the plan from the reason and sends
the next step at once (`resumed_plan`), so a stop is never forgotten, only at worst hurried.

No I/O and no clock of its own: the controller passes `now`, so these rules are tested in microseconds.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from hsched.model import EndReason, Job, JobState, RunState

KILL_AFTER_TERM_S = 1.0
"""After the grace period's SIGTERM, how long before SIGKILL (preemption and timeouts)."""
GANG_KILL_S = 2.0
"""After a rank failed, how long the other ranks get between SIGTERM and SIGKILL."""


class StopReason(enum.StrEnum):
    """Why the controller stops a running job on purpose; the value is the job's durable `reason`."""

    CANCELLED = EndReason.CANCELLED.value
    PREEMPTED = EndReason.PREEMPTED.value
    TIMEOUT = EndReason.TIMEOUT.value
    RANK_FAILED = EndReason.RANK_FAILED.value

    @property
    def state(self) -> JobState:
        """The job's state while the stop is under way."""
        return JobState.PREEMPTING if self is StopReason.PREEMPTED else JobState.COMPLETING

    @property
    def event(self) -> str:
        """The kind of the event that records the decision."""
        return _STOP_EVENT[self]


_STOP_EVENT = {
    StopReason.CANCELLED: "cancel",
    StopReason.PREEMPTED: "preempting",
    StopReason.TIMEOUT: "timeout",
    StopReason.RANK_FAILED: "rank_failed",
}


@dataclass(frozen=True, slots=True)
class Step:
    at: float
    signal: str
    all_processes: bool
    """True: every process of the run (the process group and whatever escaped it), not just its leader."""


@dataclass(frozen=True, slots=True)
class StopPlan:
    reason: StopReason
    steps: tuple[Step, ...]
    """In time order; sent as their time comes."""
    decided_at: float = 0.0
    """When the stop was decided (for the time from a preemption decision to GPUs free)."""

    def due(self, now: float) -> tuple[tuple[Step, ...], StopPlan]:
        """The steps whose time has come, and the plan of what is left."""
        n = 0
        while n < len(self.steps) and self.steps[n].at <= now:
            n += 1
        return self.steps[:n], StopPlan(self.reason, self.steps[n:], self.decided_at)


def plan_for(job: Job, reason: StopReason, now: float, kill_after_s: float) -> StopPlan:
    """The signals that stop `job` for `reason`, starting `now`."""
    ck = job.spec.checkpoint_signal
    if reason in (StopReason.PREEMPTED, StopReason.TIMEOUT):
        steps = [Step(now, ck.signal, False)]
        if ck.signal != "TERM":
            steps.append(Step(now + ck.grace_s, "TERM", False))
            steps.append(Step(now + ck.grace_s + KILL_AFTER_TERM_S, "KILL", True))
        else:
            steps.append(Step(now + ck.grace_s, "KILL", True))
    elif reason is StopReason.RANK_FAILED:
        steps = [Step(now, "TERM", False), Step(now + GANG_KILL_S, "KILL", True)]
    else:
        steps = [Step(now, "TERM", False), Step(now + kill_after_s, "KILL", True)]
    return StopPlan(reason=reason, steps=tuple(steps), decided_at=now)


def resumed_plan(job: Job, now: float, kill_after_s: float) -> StopPlan:
    """A stop found in the store by a controller that did not decide it: its first signal went out before
    the restart, so the escalation is sent at once. An unknown reason is treated as a cancel."""
    try:
        reason = StopReason(job.reason)
    except ValueError:
        reason = StopReason.CANCELLED
    plan = plan_for(job, reason, now, kill_after_s)
    rest = tuple(Step(now, s.signal, s.all_processes) for s in plan.steps[1:])
    return StopPlan(reason, rest or plan.steps, now)


def failed(exit_code: int | None, lost: bool, checkpoint_exit_code: int) -> bool:
    """A run's end that dooms its attempt: lost, or an exit code that is neither success nor 'checkpointed'."""
    return lost or exit_code not in (0, checkpoint_exit_code)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a job becomes when the last run of its attempt ends."""

    state: JobState
    reason: EndReason
    exit_code: int | None
    event: str
    """The event's kind (ended, preempted, requeued, lost)."""
    message: str

    @property
    def requeued(self) -> bool:
        return self.state is JobState.PENDING

    def job_fields(self, job: Job, now: float) -> dict[str, Any]:
        """The job's columns to write, in the same transaction as its last run's end."""
        fields: dict[str, Any] = {"state": self.state, "reason": self.reason.value, "exit_code": self.exit_code}
        if self.requeued:
            fields.update(restarts=job.restarts + 1, placement=(), end_time=None)
        else:
            fields["end_time"] = now
        return fields

    def run_state(self, exit_code: int | None, lost: bool) -> RunState:
        """The ending run's own record says why it ended, as the job's does (`hsched show` lists runs)."""
        by_reason = _RUN_STATE_OF.get(self.reason)
        if by_reason is not None:
            return by_reason
        return ended_run_state(exit_code, lost)


_RUN_STATE_OF = {
    EndReason.PREEMPTED: RunState.PREEMPTED,
    EndReason.CHECKPOINTED: RunState.CHECKPOINTED,
    EndReason.CANCELLED: RunState.CANCELLED,
    EndReason.TIMEOUT: RunState.TIMEOUT,
}


def ended_run_state(exit_code: int | None, lost: bool) -> RunState:
    """A run's final state from how it ended alone."""
    if lost:
        return RunState.LOST
    return RunState.COMPLETED if exit_code == 0 else RunState.EXITED


def settle(job: Job, ended: list[tuple[int | None, bool]], checkpoint_exit_code: int) -> Outcome:
    """The job's next state from why it was stopping and how its runs ended.

    `ended`: (exit code, lost) of every run of the attempt, in the order they ended: a gang's first failure
    is its cause, the rest were stopped because of it.
    """
    codes = [c for c, _ in ended]
    any_lost = any(lost for _, lost in ended)
    ck = checkpoint_exit_code
    bad = [c for c, lost in ended if not lost and c not in (0, ck)]
    code = bad[0] if bad else next((c for c in codes if c is not None), None)
    restarts = job.restarts + 1
    stopping = job.reason if job.state in (JobState.PREEMPTING, JobState.COMPLETING) else ""
    if stopping == StopReason.CANCELLED:
        return Outcome(JobState.CANCELLED, EndReason.CANCELLED, code, "ended", f"cancelled (exit code {code})")
    if stopping == StopReason.TIMEOUT:
        return Outcome(JobState.TIMEOUT, EndReason.TIMEOUT, code, "ended", f"time limit reached (exit code {code})")
    if stopping == StopReason.PREEMPTED:
        if all(c == 0 for c in codes) and not any_lost:
            return Outcome(JobState.COMPLETED, EndReason.COMPLETED, 0, "ended", "completed while being preempted")
        return Outcome(JobState.PENDING, EndReason.PREEMPTED, code, "preempted",
                       f"preempted (exit code {code}); requeued, restarts {restarts}")
    if bad:
        if stopping == StopReason.RANK_FAILED:
            reason = EndReason.RANK_FAILED
        else:
            reason = EndReason.SIGNALED if (bad[0] or 0) >= 128 else EndReason.NONZERO_EXIT
        return Outcome(JobState.FAILED, reason, bad[0], "ended", f"failed (exit code {bad[0]})")
    if any_lost:
        return Outcome(JobState.LOST, EndReason.LOST, None, "lost",
                       "run lost: the process is gone and left no exit code")
    if ck in codes:
        return Outcome(JobState.PENDING, EndReason.CHECKPOINTED, code, "requeued",
                       f"exited with the checkpoint code {ck}: requeued, restarts {restarts}")
    return Outcome(JobState.COMPLETED, EndReason.COMPLETED, 0, "ended", "completed (exit code 0)")


def node_lost(job: Job) -> Outcome:
    """A job whose only run's node stayed away past its lease: requeued if it was running (the stale copy is
    killed if the node returns), else settled as a lost run."""
    if job.state in (JobState.RUNNING, JobState.LAUNCHING, JobState.PREEMPTING):
        return Outcome(JobState.PENDING, EndReason.NODE_LOST, None, "node_lost", "requeued")
    return settle(job, [(None, True)], checkpoint_exit_code=-1)  # a lost run has no exit code to compare
