"""What one round reads and what it decides: the fleet as the round sees it (`FleetView`, `Running`), its decisions
(`Launch`, `Wait`, `Move`, and `Preempt` from hsched.sched.view), the device choosers, the order without a policy, and
the few helpers every stage words its reasons with. Pure: no I/O, no state."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import MappingProxyType

from hsched.model import DEFAULT_QOS, Job, Node, Placement, Resources
from hsched.sched.limits import QosLimits
from hsched.sched.preempt import PreemptRule
from hsched.sched.throughput import ThroughputModel
from hsched.sched.view import QOS_RANK, Preempt, qos_rank
from hsched.topo.fabric import Fabric
from hsched.topo.models import DEFAULT_CATALOG, lookup_model
from hsched.topo.place import place_on_node

NONE: Mapping[int, float] = MappingProxyType({})
"""No figures (a default that is never written to)."""
NO_DEVICES: Mapping[str, float] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Running:
    """A running job as the scheduler may see it: its request and how long it has run, never its remaining
    work or duration."""

    job: Job
    started: float
    """When its current attempt started."""

    @property
    def id(self) -> int:
        return self.job.id

    @property
    def devices(self) -> frozenset[str]:
        return frozenset(u for p in self.job.placement for u in p.devices)


@dataclass(frozen=True, slots=True)
class FleetView:
    nodes: tuple[Node, ...]
    busy: frozenset[str]
    """UUIDs of devices held by active runs."""
    cpus_used: Mapping[str, int]
    """CPUs promised to active runs, per node."""
    running: tuple[Running, ...] = ()
    """Jobs that hold devices and could be preempted (RUNNING only, not already stopping); the policy also
    reads them for fair share and attained service."""
    releasing: frozenset[str] = frozenset()
    """Devices of jobs being preempted or cancelled: busy now, free soon."""
    rule: PreemptRule = field(default_factory=PreemptRule)
    """Who may preempt whom (`PreemptRule.from_qos(settings.qos)`); by default nobody."""
    policy: str | None = None
    """A scheduling-core policy (hsched.sched) deciding order and GPU types; None: QoS/priority/FIFO."""
    prefer: Mapping[int, str] = field(default_factory=dict)
    """Job id -> the node holding its checkpoint: tried first, so a resumed job avoids the copy when it can."""
    user_usage: Mapping[str, float] | None = None
    """Fair share's usage per user: decayed GPU-seconds of the store's runs, running ones up to now, per equal
    share (hsched.learn.fairshare.policy_usage). None (a view built by hand): the running jobs' GPU-seconds."""
    labels: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Node name -> its labels (the fleet file's `[[node]] labels`), what `--constraint` is matched against."""
    absent_users: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Node name -> users that do not exist on that node (lab mode): their jobs are never placed there."""
    gpu_aliases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Settings' `[gpu_models.aliases]`: a `--gpu-type` name -> the model names it stands for."""
    limits: Mapping[str, QosLimits] = field(default_factory=dict)
    """QoS class -> its caps (`QosLimits.from_qos(settings.qos)`); a class not here has none."""
    holders: tuple[Job, ...] | None = None
    """Every job holding devices (launching, running, being stopped): what the caps count. None: `running`."""
    queue_apart: bool = True
    """The queue may hold shared or heterogeneous jobs (the sharing and hetjob stages look through it); False: the
    caller knows it holds none (the controller's job cache keeps count), and those stages skip the look: ~0.3 ms of a
    round over 2,000 waiting jobs."""
    throughput: ThroughputModel | None = None
    """What the controller learnt of the jobs' kinds (hsched.learn.kinds.learned_model); None: the accelerator
    table's prior alone (catalog_throughput)."""
    ends: Mapping[int, float] = field(default_factory=dict)
    """Running job id -> when it is predicted to end (the controller's clock: its progress, its kind's history or
    its time limit; hsched.controller.learning.predicted_ends). A job not here has no known end: it counts as never
    ending when the round reserves GPUs for the first blocked job (hsched.sched.stages.reservation)."""
    movable: Mapping[int, float] = field(default_factory=dict)
    """Running job id -> what a checkpoint and restart costs it (seconds): the jobs that proved they checkpoint
    (hsched.controller.moves). Only these may be moved to faster GPUs or time-shared away; none without a policy."""
    move_min_run_s: float = 1800.0
    """A job (re)started less than this long ago is not moved or time-shared away (settings `move_min_run_s`)."""
    held: Mapping[int, tuple[Placement, ...]] = field(default_factory=dict)
    """Job id -> the devices a move promised it: nobody else's while it stops, and where it starts again."""
    attained: Mapping[int, float] = field(default_factory=dict)
    """Job id -> seconds its earlier attempts ran (its attained service before this attempt, for the least-attained
    rule: a job stopped and requeued does not jump back to the front). A job not here has none."""
    left: Mapping[int, tuple[float, str]] = field(default_factory=dict)
    """Waiting job id -> (the seconds its last attempt's progress said were left: steps to its reported total over
    the speed it measured, the GPU type it measured them on; hsched.controller.learning.waiting_left): with the
    running jobs' predicted ends, the policy's remaining-time estimates (`PolicyInput.forecast_s`, which the plan
    stage normalises to the job's fastest type). A job not here reported no total."""
    memory_used: Mapping[str, int] = field(default_factory=dict)
    """Host memory (MiB, `--mem`) promised to active runs, per node: reserved as CPUs are."""
    shared_use: Mapping[str, int] = field(default_factory=dict)
    """Device UUID -> GPU memory (MiB) promised to the shared jobs on it (`--shared`): more of them go there while
    their memory fits; no exclusive job does (the device is busy)."""
    data_at: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Dataset -> the nodes holding it, ready (declared, found by a scan, or copied: hsched.controller.data). A
    dataset not here (a shared mount, a name nobody declared) costs nothing anywhere."""
    data_bytes: Mapping[str, int] = field(default_factory=dict)
    """Dataset -> its size in bytes: what a copy of it moves."""
    data_copying: Mapping[tuple[str, str], int] = field(default_factory=dict)
    """(dataset, node) -> the bytes a copy under way there (a prefetch) still has to move."""
    link_bps: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """(source node, target node) -> how fast copies between them went (bytes/s, measured)."""
    default_bps: float = 125e6
    """Copy speed between two nodes no copy was measured between yet (settings `data_link_mbps`)."""
    data_waited: Mapping[int, float] = field(default_factory=dict)
    """Job id -> seconds it has waited for a node holding its data so far (since the first round that made it wait):
    its whole wait is bounded by its copy (`choose_wait`)."""
    fabric: Fabric = field(default_factory=Fabric)
    """The fleet's switch layout (hsched.topo.fabric): a gang across nodes is placed by it and the nodes' NICs."""
    scaling: Mapping[int, Mapping[int, float]] = field(default_factory=dict)
    """Running elastic job id -> its kind's measured steps per second at each GPU count on its GPU type (hsched.learn;
    empty: nothing measured yet). Every running elastic job that may be resized is here
    (hsched.sched.stages.elastic)."""
    resize_cost: Mapping[int, float] = field(default_factory=dict)
    """Elastic job id (running, or waiting to start) -> what a resize costs it (seconds): its checkpoint and restart,
    measured as a move's (the jobs that proved they checkpoint, gangs too), or a resize in place's. Only these are
    resized, or start bigger than their MIN."""
    policy_round_s: float = 360.0
    """The round length the policy is told (settings `policy_round_s`; PolicyInput.round_s): the simulator's round."""
    running_left: Mapping[int, tuple[float, float, str]] = field(default_factory=dict)
    """Running job id -> (when its current attempt last reported, on the controller's clock; the seconds its progress
    said were left then: steps to its reported total over its measured speed, else its kind's learned one; the GPU
    type it runs on; hsched.controller.learning.running_left): the policy's remaining time for a running job that
    may be time-shared or moved, counted down since, as the simulator's. A job not here: its predicted end (`ends`)."""


@dataclass(frozen=True, slots=True)
class Launch:
    """Launch the job now on these devices (one placement per node of a gang)."""

    job_id: int
    placements: tuple[Placement, ...]


@dataclass(frozen=True, slots=True)
class Wait:
    job_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class Move:
    """Move a running job that checkpoints to faster GPUs: stop it (checkpoint signal, grace, escalation), hold
    `placements` for it meanwhile, and start it there again."""

    job_id: int
    placements: tuple[Placement, ...]
    from_type: str
    to_type: str
    gain_s: float
    """Seconds it is expected to save (its predicted remaining time times the speed it stops wasting)."""
    cost_s: float
    """What its checkpoint and restart cost (measured, or the settings' `move_cost_s`)."""
    why: str


Decision = Launch | Wait | Preempt | Move
"""`Preempt` (hsched.sched.view): stop its victims (checkpoint signal, grace, escalation) so the job can
start on their devices in a later round. `Move`: stop a running job and start it again on faster GPUs."""


@dataclass(frozen=True, slots=True)
class Chosen:
    devices: tuple[str, ...]
    explanation: str
    cpus: tuple[int, ...] = ()


DeviceChooser = Callable[[Node, Sequence[str], Resources], Chosen | None]
"""Pick devices for a request among a node's free ones, or None."""


def size_text(mib: int) -> str:
    """MiB as people write sizes: 10T, 512G, 750M."""
    for unit, mult in (("T", 1024 * 1024), ("G", 1024)):
        if mib >= mult:
            value = mib / mult
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{mib}M"


def gpu_size(mib: int) -> str:
    """MiB as GPU vendors write sizes, in the decimal units `--gpu-memory` is read in (config.parse_gpu_memory_mib:
    80G is 80 * 10^9 bytes): 85.5 GB, 1.1 TB. An H100 80GB's 81,559 MiB is 85.5 GB; in binary units with a bare G
    (79.6G) it read as if an 80G request could not fit it."""
    size = mib * 2**20
    for unit, mult in (("TB", 10**12), ("GB", 10**9)):
        if size >= mult:
            return f"{size / mult:.1f}".removesuffix(".0") + f" {unit}"
    return f"{size / 10**6:.0f} MB"


def topology_chooser(node: Node, free: Sequence[str], res: Resources) -> Chosen | None:
    """The topology placement engine: strongest weakest link, most NVLinks, fewest NUMA nodes, least
    fragmentation; exact up to 16 devices; CPU cores from the NUMA nodes local to the chosen devices."""
    result = place_on_node(node, res.gpus, free, res)
    if result is None:
        return None
    return Chosen(tuple(result.devices), result.explanation, tuple(result.cpus))


def default_chooser() -> DeviceChooser:
    return topology_chooser


def order(queue: Sequence[Job]) -> list[Job]:
    """Without a policy: QoS class, then priority, then submit order."""
    rank, normal = QOS_RANK.get, qos_rank(DEFAULT_QOS)  # qos_rank, inline: the key runs once per waiting job
    return sorted(queue, key=lambda j: (rank(j.spec.qos, normal), -j.spec.priority, j.submit_time, j.id))


@functools.lru_cache(maxsize=256)
def gpu_type_of(model: str) -> str:
    """The core's GPU type for a device model: the accelerator table's key ("h100", "a100"...) or the model.
    Cached: a round names every node's type, and the table's pattern search costs ~80 us a model."""
    known = lookup_model(model)
    return known.key if known is not None else model.lower()


def catalog_throughput() -> ThroughputModel:
    """Unknown live jobs run at the accelerator table's relative training speed of each GPU type."""
    return ThroughputModel(prior={m.key.lower(): m.train for m in DEFAULT_CATALOG.models})


def minute(t: float) -> str:
    """A time as the reservation's reason gives it: ISO 8601 UTC to the minute, rounded up (a reason that changed
    every round would be written every round)."""
    return datetime.fromtimestamp(math.ceil(t / 60.0) * 60.0, UTC).strftime("%Y-%m-%dT%H:%MZ")


def secs(s: float) -> str:
    if s == math.inf:
        return "an unknown time"
    return f"{s / 60:.0f} min" if s >= 120 else f"{s:.0f} s"

