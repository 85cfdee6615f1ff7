"""A job's life as pure functions: how a stop unfolds in time, and what a job becomes when its runs end.

Every stop is a short plan of signals in time:

    preempt     checkpoint signal (e.g. USR1) -> grace -> SIGTERM -> 1 s -> SIGKILL to every process
    timeout     same as preempt (the job may checkpoint), ending TIMEOUT
    cancel      SIGTERM -> kill_after_s -> SIGKILL to every process
    rank died   SIGTERM to the other ranks -> 2 s -> SIGKILL (no hung collectives)

The plan's *reason* is durable (the job's `reason`, written in the same transaction as its state change);
the timing lives in memory. A controller restarted mid-stop rebuilds the plan from the reason and sends
the next step at once (`resumed_plan`), so a stop is never forgotten, only at worst hurried.

No I/O and no clock of its own: the controller passes `now`, so these rules are tested in microseconds. A plan's
times are on the controller's monotonic timeline (hsched.clock.Timeline), never the wall clock's: a step of the wall
clock must neither send a SIGKILL before its grace nor hold it back an hour. What a job's fields record (`job_fields`'s
`now`, a retry's `begin_time`) is wall time.
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
    all_processes: bool = True
    """Every process of the run (its cgroup, process group and whatever escaped them): a trainer started by
    `bash -c` gets the checkpoint signal too, as with Slurm's scancel --signal."""
    batch_only: bool = False
    """Only the run's main process (sbatch's `--signal B:USR1@60`): the batch shell relays it itself."""


@dataclass(frozen=True, slots=True)
class StopPlan:
    reason: StopReason
    steps: tuple[Step, ...]
    """In time order; sent as their time comes."""
    decided_at: float = 0.0
    """When the stop was decided (for the time from a preemption decision to GPUs free), as its steps' times."""

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
        steps = [Step(now, ck.signal, not ck.batch_only, ck.batch_only)]
        if ck.signal != "TERM":
            steps.append(Step(now + ck.grace_s, "TERM"))
            steps.append(Step(now + ck.grace_s + KILL_AFTER_TERM_S, "KILL"))
        else:
            steps.append(Step(now + ck.grace_s, "KILL"))
    elif reason is StopReason.RANK_FAILED:
        steps = [Step(now, "TERM"), Step(now + GANG_KILL_S, "KILL")]
    else:
        steps = [Step(now, "TERM"), Step(now + kill_after_s, "KILL")]
    return StopPlan(reason=reason, steps=tuple(steps), decided_at=now)


def resumed_plan(job: Job, now: float, kill_after_s: float) -> StopPlan:
    """A stop found in the store by a controller that did not decide it: its first signal went out before
    the restart, so the escalation is sent at once. An unknown reason is treated as a cancel."""
    try:
        reason = StopReason(job.reason)
    except ValueError:
        reason = StopReason.CANCELLED
    plan = plan_for(job, reason, now, kill_after_s)
    rest = tuple(Step(now, s.signal, s.all_processes, s.batch_only) for s in plan.steps[1:])
    return StopPlan(reason, rest or plan.steps, now)


def failed(exit_code: int | None, lost: bool, checkpoint_exit_code: int) -> bool:
    """A run's end that dooms its attempt: lost, or an exit code that is neither success nor 'checkpointed'."""
    return lost or exit_code not in (0, checkpoint_exit_code)


@dataclass(frozen=True, slots=True)
class EndRules:
    """The settings that decide what a job becomes when its attempt ends (from hsched.config.Settings)."""

    checkpoint_exit_code: int = 85
    retries: int = 0
    """Retries of a job that does not say (`retries` in its spec)."""
    fatal_exit_codes: frozenset[int] = frozenset({126, 127})
    """Exit codes no retry can fix (126: not executable, 127: command not found): FAILED at once."""
    max_restarts: int = 3
    """Checkpoint exits the job may make on its own; one more and it ends FAILED (max_restarts)."""
    backoff_s: float = 10.0
    backoff_max_s: float = 360.0

    def retries_for(self, job: Job) -> int:
        return self.retries if job.spec.retries is None else job.spec.retries

    def backoff(self, failures: int) -> float:
        """Seconds before retry number `failures + 1`: 10, 20, 40 ... up to the cap (as Kubernetes' restarts)."""
        return min(self.backoff_max_s, self.backoff_s * 2.0 ** min(failures, 30))


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a job becomes when the last run of its attempt ends."""

    state: JobState
    reason: EndReason
    exit_code: int | None
    event: str
    """The event's kind (ended, preempted, requeued, retry, lost)."""
    message: str
    failures: int = 0
    """Retries used after this outcome."""
    checkpoints: int = 0
    """Checkpoint exits of its own after this outcome."""
    begin_time: float | None = None
    """A retry waits until then."""

    @property
    def requeued(self) -> bool:
        return self.state is JobState.PENDING

    def job_fields(self, job: Job, now: float) -> dict[str, Any]:
        """The job's columns to write, in the same transaction as its last run's end (`now`: when it ended)."""
        fields: dict[str, Any] = {"state": self.state, "reason": self.reason.value, "exit_code": self.exit_code,
                                  "failures": self.failures, "checkpoints": self.checkpoints}
        if self.requeued:
            fields.update(restarts=job.restarts + 1, placement=(), end_time=None, begin_time=self.begin_time)
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


def settle(job: Job, ended: list[tuple[int | None, bool]], rules: EndRules, now: float = 0.0, *,
           oom: bool = False, gpu_oom: bool = False) -> Outcome:
    """The job's next state from why it was stopping and how its runs ended.

    `ended`: (exit code, lost) of every run of the attempt, in the order they ended: a gang's first failure
    is its cause, the rest were stopped because of it. `now`: when the attempt ended (a retry's backoff
    counts from then). `oom`: the kernel's OOM killer killed a process of the attempt; `gpu_oom`: a run's log
    says a GPU ran out of memory.

    Retries: a failure (an exit code other than 0 and the checkpoint code, or a lost run) is retried while the
    job has retries left, after a backoff; a fatal exit code fails at once; preemption, node loss and
    checkpoint exits never use a retry. A job that checkpoints on its own more than `max_restarts` times
    fails with reason max_restarts (a job that exits 85 in a loop must not be requeued for ever).
    """
    codes = [c for c, _ in ended]
    any_lost = any(lost for _, lost in ended)
    ck = rules.checkpoint_exit_code
    bad = [c for c, lost in ended if not lost and c not in (0, ck)]
    code = bad[0] if bad else next((c for c in codes if c is not None), None)
    restarts = job.restarts + 1
    kept = {"failures": job.failures, "checkpoints": job.checkpoints}
    stopping = job.reason if job.state in (JobState.PREEMPTING, JobState.COMPLETING) else ""
    if stopping == StopReason.CANCELLED:
        return Outcome(JobState.CANCELLED, EndReason.CANCELLED, code, "ended", f"cancelled (exit code {code})",
                       **kept)
    if stopping == StopReason.TIMEOUT:
        return Outcome(JobState.TIMEOUT, EndReason.TIMEOUT, code, "ended", f"time limit reached (exit code {code})",
                       **kept)
    if stopping == StopReason.PREEMPTED:
        if all(c == 0 for c in codes) and not any_lost:
            return Outcome(JobState.COMPLETED, EndReason.COMPLETED, 0, "ended", "completed while being preempted",
                           **kept)
        return Outcome(JobState.PENDING, EndReason.PREEMPTED, code, "preempted",
                       f"preempted (exit code {code}); requeued, restarts {restarts}", **kept)
    if bad or any_lost:
        if bad:
            if oom:
                reason = EndReason.OOM
            elif gpu_oom:
                reason = EndReason.GPU_OOM
            elif stopping == StopReason.RANK_FAILED:
                reason = EndReason.RANK_FAILED
            else:
                reason = EndReason.SIGNALED if (bad[0] or 0) >= 128 else EndReason.NONZERO_EXIT
            state, what = JobState.FAILED, ("out of memory: killed by the kernel" if oom
                                            else f"out of GPU memory (exit code {bad[0]})" if gpu_oom
                                            else f"failed (exit code {bad[0]})")
        else:
            reason, state, what = EndReason.LOST, JobState.LOST, "run lost: the process is gone and left no exit code"
        budget = rules.retries_for(job)
        if bad and bad[0] in rules.fatal_exit_codes:
            return Outcome(state, reason, code, "ended",
                           f"{what}; exit code {bad[0]} is fatal (settings fatal_exit_codes): not retried", **kept)
        if job.failures < budget:
            delay = rules.backoff(job.failures)
            return Outcome(JobState.PENDING, EndReason.RETRY_BACKOFF, code, "retry",
                           f"{what}; retry {job.failures + 1} of {budget} in {delay:g} s",
                           failures=job.failures + 1, checkpoints=job.checkpoints, begin_time=now + delay)
        tail = f"; no retries left ({budget} used)" if budget else ""
        return Outcome(state, reason, code, "lost" if state is JobState.LOST else "ended", what + tail, **kept)
    if ck in codes:
        if job.checkpoints >= rules.max_restarts:
            return Outcome(JobState.FAILED, EndReason.MAX_RESTARTS, code, "ended",
                           f"exited with the checkpoint code {ck} for the {job.checkpoints + 1}th time: "
                           f"over max_restarts ({rules.max_restarts})", **kept)
        return Outcome(JobState.PENDING, EndReason.CHECKPOINTED, code, "requeued",
                       f"exited with the checkpoint code {ck}: requeued, restarts {restarts}",
                       failures=job.failures, checkpoints=job.checkpoints + 1)
    return Outcome(JobState.COMPLETED, EndReason.COMPLETED, 0, "ended", "completed (exit code 0)", **kept)


def taken(job: Job, cause: EndReason, what: str) -> Outcome:
    """A job whose run the node itself ended through no fault of the run (`cause`: NODE_LOST, its node failed;
    PREEMPTED, the node's own scheduler preempted it; `what` says so in words): requeued without using a retry
    if it was running, else settled as its stop would have been (a cancel stays a cancel)."""
    if job.state in (JobState.RUNNING, JobState.LAUNCHING, JobState.PREEMPTING):
        event = "preempted" if cause is EndReason.PREEMPTED else "node_lost"
        return Outcome(JobState.PENDING, cause, None, event, f"{what}: requeued, restarts {job.restarts + 1}",
                       failures=job.failures, checkpoints=job.checkpoints)
    return settle(job, [(None, True)], EndRules(retries=0))


def node_lost(job: Job) -> Outcome:
    """A job whose only run's node stayed away past its lease: requeued if it was running (the stale copy is
    killed if the node returns), else settled as a lost run."""
    if job.state in (JobState.RUNNING, JobState.LAUNCHING, JobState.PREEMPTING):
        # (the retries it used and its own checkpoint exits stay counted: a lost node gives none back)
        return Outcome(JobState.PENDING, EndReason.NODE_LOST, None, "node_lost", "requeued",
                       failures=job.failures, checkpoints=job.checkpoints)
    # a stop under way settles as it would have; otherwise lost for good (a stale copy has no retry to use)
    return settle(job, [(None, True)], EndRules(retries=0))
