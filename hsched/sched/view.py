"""What a policy may see, and what a round decides: frozen data, no I/O.

Non-clairvoyance is structural. `JobView` carries what a real scheduler knows about a job (its request, its
QoS, how long it has run and how much normalised service it has received) and nothing about how much work is
left or how long it will take: there is no such field to read. Only a clairvoyant policy (whose name ends in
`-oracle`) is handed an `OracleInput`, which adds a separate table of remaining times; the round builds that
table only for such policies.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import NamedTuple

from hsched.model import DEFAULT_QOS, Placement
from hsched.sched.throughput import ThroughputModel

# QoS classes in the order they are served, and the order QoS victims are spared in (the last first chosen);
# who may preempt whom is the settings' QoS table's to say (hsched.sched.preempt.PreemptRule).
QOS_RANK: Mapping[str, int] = {"prod": 0, "normal": 1, "scavenger": 2}


def qos_rank(qos: str) -> int:
    """Unknown classes rank with `normal`: a typo must not make a job jump the queue."""
    return QOS_RANK.get(qos, QOS_RANK[DEFAULT_QOS])


class JobPhase(enum.StrEnum):
    """The two states the scheduling core cares about; the controller maps its richer JobState onto them."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"


class JobView(NamedTuple):
    """One active job as a policy sees it. Deliberately no remaining work, duration or step count.

    A NamedTuple rather than a frozen dataclass (the rule for the domain elsewhere): it is as immutable, and a
    replay builds one per running job per round, about 10^8 for 100,000 jobs; a frozen dataclass's
    __init__ measured 1.8 us against 0.36 us here, a third of the simulator's time.

    Attributes:
        id: stable job id.
        job_type: key into the throughput table (e.g. "ResNet-50 (batch size 64)"); "" when unknown.
        gpus: GPUs the job needs, all at once (a gang).
        arrival_s: submit time, seconds on the scheduler's clock.
        phase: PENDING or RUNNING.
        gpu_type: the GPU type it runs on (RUNNING only).
        placement: where it runs (RUNNING only).
        run_start_s: when its current run started (RUNNING only).
        run_s: wall seconds it has held GPUs, over all runs.
        service_s: attained service in seconds-on-its-fastest-GPU-type (normalised progress).
        restarts: times it was preempted or migrated.
        time_limit_s: the user's declared limit, an estimate that backfill may use; None when not given.
        max_servers: 1 when the gang must sit on one server; None when it may span servers (slower).
        gpu_types: allowed GPU types; empty means any.
        checkpointable: the job resumes from a checkpoint when stopped, so the round may time-share it
            (stop it for an equal, or move it); trace jobs are, as in Gavel; live jobs are not (their spec
            has no way to say so). QoS preemption does not ask (hsched.sched.preempt).
    """

    id: int
    job_type: str
    gpus: int
    arrival_s: float
    phase: JobPhase = JobPhase.PENDING
    qos: str = DEFAULT_QOS
    priority: int = 0
    user: str = ""
    gpu_type: str | None = None
    placement: tuple[Placement, ...] = ()
    run_start_s: float | None = None
    run_s: float = 0.0
    service_s: float = 0.0
    restarts: int = 0
    time_limit_s: float | None = None
    max_servers: int | None = None
    gpu_types: tuple[str, ...] = ()
    checkpointable: bool = True

    @property
    def running(self) -> bool:
        return self.phase is JobPhase.RUNNING

    def allows(self, gpu_type: str) -> bool:
        return not self.gpu_types or gpu_type in self.gpu_types


@dataclass(frozen=True, slots=True)
class ServerView:
    """One server (node) of one GPU type. `link` is the weakest link inside it ("nvlink" or "pcie")."""

    name: str
    gpu_type: str
    devices: tuple[str, ...]
    link: str = "nvlink"


@dataclass(frozen=True, slots=True)
class PolicyInput:
    """Everything a non-clairvoyant policy is given for one round."""

    now: float
    jobs: tuple[JobView, ...]
    """Pending and running jobs, in arrival order."""
    capacity: Mapping[str, int]
    """GPUs per type on servers that are up."""
    gpu_types: tuple[str, ...]
    """The fleet's GPU types, fastest first (by the throughput model's prior)."""
    throughput: ThroughputModel
    checkpoint_cost_s: float = 0.0
    round_s: float = 360.0
    user_usage: Mapping[str, float] = field(default_factory=dict)
    """Decayed GPU-seconds per user, for fair share; empty when there is one user."""
    starts_only: bool = False
    """A start-only round (the simulator's, between quanta): `jobs` holds the waiting jobs alone and
    `capacity` the free GPUs; nothing may be preempted or moved. The round takes wanted jobs strictly in
    order (no backfill past a job that does not fit: it waits for the next full round, which may make room)."""
    checkpoint_costs: Mapping[int, float] = field(default_factory=dict)
    """Job id -> what a checkpoint and restart of that job costs (seconds), where measured (the live controller's
    jobs that proved they checkpoint); a job not here costs `checkpoint_cost_s`."""
    forecast_s: Mapping[int, float] = field(default_factory=dict)
    """Job id -> its predicted remaining seconds on its fastest GPU type (normalised as `JobView.service_s` is: the
    seconds left where it runs times its speed there relative to its fastest type), where something predicts it: a
    running job's from its progress or its kind's history (the live controller), a waiting job that ran before from
    the progress its last attempt reported with a total (steps left over the speed it measured); the simulator's
    trace jobs report a total (`SimConfig.progress_totals`). A prediction, not the truth: non-clairvoyant policies
    may read it."""
    quantum_s: float | None = None
    """How long a (re)started job keeps its GPUs before time-sharing may take them (the live settings'
    `move_min_run_s`); None: the policy's own."""
    cache: MutableMapping[str, object] = field(default_factory=dict, compare=False)
    """What policies keep from round to round, each under its own key: owned by the caller (the live controller,
    a simulation), so the scheduling core holds no state of its own. Empty: nothing kept."""


@dataclass(frozen=True, slots=True)
class OracleInput:
    """A clairvoyant policy's input: the ordinary one plus remaining seconds on each job's fastest type."""

    base: PolicyInput
    remaining_s: Mapping[int, float]


class Want(NamedTuple):
    """A job the policy wants running, with the GPU types it accepts, best first.

    Empty `types` means the policy is heterogeneity-unaware: the job stays on its current type if running,
    else it takes the type with the most GPUs left (as if picking any free GPU from one pool). A NamedTuple
    for the reason JobView is one: a plan holds one per active job, every round.
    """

    job_id: int
    types: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Plan:
    """A policy's answer: wanted jobs in priority order, and how the round may act on it.

    preempt: running jobs not granted GPUs may be stopped (time-sharing); else running jobs keep theirs.
    strict: stop at the first wanted job that does not fit (FIFO head-of-line blocking); else skip it.
    """

    wants: tuple[Want, ...]
    preempt: bool = False
    strict: bool = False


@dataclass(frozen=True, slots=True)
class Start:
    """Start (or, with `migrate`, move) a job: its GPU type and placement on one or more servers."""

    job_id: int
    gpu_type: str
    placement: tuple[Placement, ...]
    migrate: bool = False

    @property
    def spans(self) -> bool:
        return len(self.placement) > 1


@dataclass(frozen=True, slots=True)
class Preempt:
    """A QoS preemption: stop `victims` (running on `node`) so that the waiting job `job_id` can start there.

    Decided by `hsched.sched.preempt.Victims`, for the simulator and the live controller alike; `why` is
    the line the controller records in the job's events.
    """

    job_id: int
    victims: tuple[int, ...]
    node: str
    why: str
    placements: tuple[Placement, ...] = ()
    """A time-sharing stop's (the live round's plan, hsched.sched.stages.plan.moves): the devices the waiting job is
    to start on, held for it while the victims stop (as a move's new ones, `FleetView.held`). Without them the next
    rounds, 0.05 s later, planned with those devices busy and gave them to another job, and the waiting job stopped
    a second and third job for itself (issue 33: 77 of a replay's 117 time-sharing stops; the simulator's stop and
    start are one instant). () : a QoS preemption's, whose job waits for the victims' GPUs as any job does."""


@dataclass(frozen=True, slots=True)
class RoundDecision:
    """What the controller or simulator must do now. Stopping comes before starting."""

    preempt: tuple[int, ...] = ()
    """Every running job to stop: those the plan time-shares away and the victims of `preemptions`."""
    starts: tuple[Start, ...] = ()
    waiting: Mapping[int, str] = field(default_factory=dict)
    """Why each pending job that did not start waits (squeue-style reason)."""
    preemptions: tuple[Preempt, ...] = ()
    """The QoS preemptions among `preempt`: whose GPUs go to whom (the job starts in `starts`)."""
