"""The domain: nodes, devices, jobs, runs and their states, as frozen data.

Nothing here does I/O; the controller, the store, the scheduler and the simulator all speak these types.
State and end reason are separate fields (a job is COMPLETED/FAILED/...; *why* it left RUNNING is its
`reason`), as dstack's JobStatus/JobTerminationReason split them.
"""

from __future__ import annotations

import enum
import operator
import re
from dataclasses import dataclass, field

from hsched.indices import compress_indices

TYPE_CHECKING = False  # typing is left to the type checker: the CLI's quick paths import this module
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


class JobState(enum.StrEnum):
    """Where a job is in its life. Terminal states never change again."""

    PENDING = "PENDING"
    """Queued, waiting for resources (or held)."""
    LAUNCHING = "LAUNCHING"
    """Placed; its run is being started on the node."""
    RUNNING = "RUNNING"
    PREEMPTING = "PREEMPTING"
    """Asked to checkpoint and stop so a more important job can have its devices."""
    PREEMPTED = "PREEMPTED"
    """Stopped by preemption; goes back to PENDING at once (same id, restarts + 1)."""
    COMPLETING = "COMPLETING"
    """Cancel or time limit in progress: signals sent, waiting for the processes to go."""
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    NODE_FAIL = "NODE_FAIL"
    LOST = "LOST"
    """The controller could not find the run again (node rebooted, process gone without exit code)."""

    def is_terminal(self) -> bool:
        return self in _TERMINAL

    def is_active(self) -> bool:
        """Holds devices on a node."""
        return self in _ACTIVE


_TERMINAL = frozenset(
    {JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED, JobState.TIMEOUT, JobState.NODE_FAIL,
     JobState.LOST}
)
_ACTIVE = frozenset({JobState.LAUNCHING, JobState.RUNNING, JobState.PREEMPTING, JobState.COMPLETING})


class EndReason(enum.StrEnum):
    """Why a run (or a job) ended, or why a pending job waits."""

    NONE = ""
    COMPLETED = "completed"
    NONZERO_EXIT = "nonzero_exit"
    SIGNALED = "signaled"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    CHECKPOINTED = "checkpointed"
    TIMEOUT = "timeout"
    NODE_LOST = "node_lost"
    LOST = "lost"
    LAUNCH_FAILED = "launch_failed"
    RANK_FAILED = "rank_failed"
    """Another rank of the gang failed, so this one was stopped."""
    OOM = "oom"
    """The run went over its memory limit (`--mem`) and the kernel killed it."""
    GPU_OOM = "gpu_oom"
    """The run failed because a GPU ran out of memory (its log says so: CUDA out of memory)."""
    MAX_RESTARTS = "max_restarts"
    """The job checkpointed (or was requeued) more than `max_restarts` times."""
    RETRY_BACKOFF = "BeginTime"
    """A pending job waits out its retry backoff (squeue's BeginTime)."""
    DEPENDENCY = "Dependency"
    """Waits for the jobs it depends on (sbatch --dependency)."""
    DEPENDENCY_NEVER = "DependencyNeverSatisfied"
    """A dependency can never be satisfied (afterok on a job that failed)."""
    # reasons a pending job waits, as squeue shows them
    RESOURCES = "Resources"
    PRIORITY = "Priority"
    HELD = "JobHeldUser"
    UNSATISFIABLE = "Unsatisfiable"
    PREEMPTING = "Preempting"
    """Waits for devices that running jobs are giving up for it."""
    # QoS caps (settings [qos.NAME]), named as squeue names the limits a Slurm user knows
    QOS_MAX_JOBS_PER_USER = "QOSMaxJobsPerUserLimit"
    """The user already runs `max_jobs_per_user` jobs of this QoS class."""
    QOS_MAX_GPU_PER_USER = "QOSMaxGpuPerUserLimit"
    """Starting it would take the user over `max_gpus_per_user` GPUs of this QoS class."""
    QOS_GRP_GPU = "QOSGrpGpuLimit"
    """Starting it would take the whole class over `max_gpus` GPUs."""


class RunState(enum.StrEnum):
    """Where one run (one rank of one attempt) is. The first three hold devices; the rest are final, apart
    from FENCING (given up for lost while its node was away: to be killed there when it answers)."""

    LAUNCHING = "LAUNCHING"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    COMPLETED = "COMPLETED"
    EXITED = "EXITED"
    """Ended with a non-zero exit code."""
    LOST = "LOST"
    PREEMPTED = "PREEMPTED"
    CHECKPOINTED = "CHECKPOINTED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    FENCING = "FENCING"
    FENCED = "FENCED"

    def is_live(self) -> bool:
        """Holds devices on a node and is looked up on restart."""
        return self in LIVE_RUN_STATES


LIVE_RUN_STATES = frozenset({RunState.LAUNCHING, RunState.RUNNING, RunState.STOPPING})


class NodeState(enum.StrEnum):
    PROBING = "PROBING"
    """Its first probe has not answered yet: known by name only, nothing is placed there."""
    UP = "UP"
    UNHEALTHY = "UNHEALTHY"
    """Answers, but its probe timed out or failed (e.g. a hung nvidia-smi); nothing new is placed there."""
    UNREACHABLE = "UNREACHABLE"
    DOWN = "DOWN"
    DRAINED = "DRAINED"


class Interconnect(enum.StrEnum):
    ANY = "any"
    NVLINK = "nvlink"


QOS_CLASSES = ("prod", "normal", "scavenger")
DEFAULT_QOS = "normal"


@dataclass(frozen=True, slots=True)
class Device:
    """One accelerator, identified by UUID; index is the node-local (PCI bus) order."""

    uuid: str
    index: int
    model: str
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    utilization_gpu: float | None = None
    numa_node: int | None = None
    pci_bus_id: str | None = None
    compute_capability: str | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    simulated: bool = False
    cpu_affinity: tuple[int, ...] = ()
    """CPU cores local to the device (its NUMA node's), empty when unknown."""
    mig_parent: str | None = None
    """A MIG instance: the UUID of the GPU it is a slice of (that GPU, in MIG mode, is no device of its own)."""
    mig_profile: str | None = None
    """A MIG instance's profile, "1g.10gb": what `--gpu-type 1g.10gb` asks for."""
    host: str | None = None
    """The machine it sits in when its node groups several (a Slurm node group: the Slurm node); None: the node
    itself. One share of a job is placed on one host (hsched.sched.state.RoundState.fit)."""


DEVICE_FIXED = operator.attrgetter("uuid", "index", "model", "memory_total_mib", "numa_node", "pci_bus_id",
                                   "compute_capability", "simulated", "cpu_affinity", "mig_parent", "mig_profile",
                                   "host")
"""What a device is, without its readings (memory used, utilization, temperature, power): each heartbeat renews those,
with new device objects, so what the scheduler keeps from round to round about a node's devices is keyed on this."""


@dataclass(frozen=True, slots=True)
class Link:
    """A connection between two devices (by UUID) with an nvidia-smi legend kind (NV12, PIX, SYS, XGMI...)."""

    a: str
    b: str
    kind: str
    bandwidth_gbps: float | None = None


class NicKind(enum.StrEnum):
    """What a network adapter speaks: InfiniBand, RDMA over Converged Ethernet, or plain Ethernet (TCP sockets)."""

    IB = "ib"
    ROCE = "roce"
    ETHERNET = "ethernet"


@dataclass(frozen=True, slots=True)
class Nic:
    """One network adapter of a node, as the node probe (sysfs /sys/class/infiniband and /sys/class/net, like
    `ibstat`) or the fleet file reports it."""

    name: str
    """The RDMA device (`mlx5_0`, what NCCL_IB_HCA names) or, for plain Ethernet, the interface (`eth0`)."""
    kind: NicKind
    rate_gbps: float
    """Link rate in Gb/s (`ibstat`'s Rate: 400 for NDR; an Ethernet link's speed / 1000)."""
    active: bool = True
    """The port is up (ibstat "State: Active", an interface whose operstate is up)."""
    netdev: str | None = None
    """The network interface of an RDMA device (`ib0`, `ens1f0np0`): what NCCL_SOCKET_IFNAME names."""
    near: tuple[int, ...] = ()
    """Device indices of the GPUs PCIe-near this NIC (PIX/PXB in `nvidia-smi topo -m`): GPUDirect RDMA reaches
    them without crossing the CPU."""


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    executor: str
    state: NodeState
    cpus: int | None = None
    memory_total_mib: int | None = None
    numa_nodes: int | None = None
    devices: tuple[Device, ...] = ()
    links: tuple[Link, ...] = ()
    host: str | None = None
    message: str = ""
    nics: tuple[Nic, ...] = ()
    """Its network adapters (issue 32): what a gang across nodes is placed by (hsched.topo.fabric)."""

    def device(self, uuid: str) -> Device | None:
        return next((d for d in self.devices if d.uuid == uuid), None)


@dataclass(frozen=True, slots=True)
class Resources:
    """What a job asks for. `gpus` is per node; `nodes` > 1 makes an all-or-nothing gang."""

    gpus: int = 0
    gpu_types: tuple[str, ...] = ()
    gpu_memory_mib: int | None = None
    cpus: int | None = None
    memory_mib: int | None = None
    nodes: int = 1
    interconnect: Interconnect = Interconnect.ANY
    tasks_per_node: int = 1
    """Processes started per node, each with torchrun's RANK/LOCAL_RANK/WORLD_SIZE... (Slurm's ntasks-per-node)."""
    constraint: str = ""
    """Node labels the job needs, in sbatch's --constraint syntax ("nvme&ib", "a100|h100"; hsched.spec.constraints),
    normalised; empty: any node."""
    offload: bool = False
    """The job offloads to host memory (ZeRO-Offload, DeepSpeed): placement prefers nodes with more host memory
    per GPU (`--offload`)."""
    shared: bool = False
    """`--shared`: a fraction of one GPU, `gpu_memory_mib` of it (an inference server, a small eval): packed with
    other shared jobs on a GPU while their memory fits, under CUDA MPS where the node has it (hsched.sched.live)."""
    gpus_max: int | None = None
    """An elastic job (`--gpus MIN-MAX`): the most GPUs per node it may grow to; `gpus` is its least. None: rigid.
    hsched grows it into GPUs that would idle and shrinks it (never below `gpus`) for waiting jobs, by checkpoint
    and restart (hsched.sched.stages.elastic, hsched.controller.resizing)."""
    nodes_max: int | None = None
    """`--nodes MIN-MAX`: the most nodes an elastic gang may span; `nodes` is its least. None: rigid."""

    @property
    def elastic(self) -> bool:
        """The job may run at more than one size."""
        return (self.gpus_max is not None and self.gpus_max > self.gpus) or (
            self.nodes_max is not None and self.nodes_max > self.nodes)

    def matches_model(self, model: str) -> bool:
        """`--gpu-type a100` matches "NVIDIA A100-SXM4-80GB": case-insensitive substring. A MIG instance (its model
        says "MIG 1g.10gb") is matched only by a type that names a MIG profile, and such a type only by MIG
        instances: a whole-GPU request never gets a slice, nor a slice request a whole GPU."""
        mig = is_mig_model(model)
        if not self.gpu_types:
            return not mig
        low = model.lower()
        return any(t.lower() in low and bool(MIG_PROFILE.search(t)) == mig for t in self.gpu_types)


MIG_PROFILE = re.compile(r"\b\d+g\.\d+gb\b", re.IGNORECASE)
"""A MIG profile's name: 1g.10gb, 3g.40gb, 7g.80gb."""


def is_mig_model(model: str) -> bool:
    """A MIG instance's model, as hsched names it: the parent's name, " MIG ", the profile."""
    return " MIG " in model


@dataclass(frozen=True, slots=True)
class CheckpointSignal:
    """`USR1@60`: on preemption send SIGUSR1, allow 60 s, then escalate (SIGTERM, then SIGKILL)."""

    signal: str = "TERM"
    grace_s: float = 30.0
    batch_only: bool = False
    """`B:USR1@60` (sbatch): only the batch shell (the run's main process) gets it; else every process."""

    def __str__(self) -> str:
        return f"{'B:' if self.batch_only else ''}{self.signal}@{self.grace_s:g}"


class DepKind(enum.StrEnum):
    """sbatch's dependency types (hsched.spec.dependencies says what each means)."""

    AFTER = "after"
    AFTEROK = "afterok"
    AFTERNOTOK = "afternotok"
    AFTERANY = "afterany"
    SINGLETON = "singleton"


@dataclass(frozen=True, slots=True)
class Dependency:
    kind: DepKind
    job_ids: tuple[int, ...] = ()
    tasks: tuple[tuple[int, int], ...] = ()
    """Array tasks named on their own, `afterok:5_3`: (the array's id, the task's index)."""

    def __str__(self) -> str:
        return ":".join([self.kind.value, *map(str, self.job_ids), *(f"{a}_{t}" for a, t in self.tasks)])


@dataclass(frozen=True, slots=True)
class ArraySpec:
    """sbatch's `--array 0-99%8`: one task per index, at most `max_running` running at once."""

    indices: tuple[int, ...]
    max_running: int | None = None

    def __str__(self) -> str:
        return compress_indices(self.indices) + (f"%{self.max_running}" if self.max_running else "")


WORKLOADS = ("training", "inference", "preprocessing")
"""The workload classes a job or a service may say it is (`--workload`); "" is unknown."""


def workload_of(spec: JobSpec) -> str:
    """The job's workload class: the one it said, else "inference" for a service's replica, else "" (unknown)."""
    if spec.workload:
        return spec.workload
    return "inference" if spec.service else ""


@dataclass(frozen=True, slots=True)
class Component:
    """One component of a heterogeneous job (a Slurm hetjob's het group): what it runs and on what."""

    command: tuple[str, ...]
    resources: Resources = field(default_factory=Resources)
    env: tuple[tuple[str, str], ...] = ()
    """Its own variables, over the job's."""
    workdir: str | None = None
    """Its own working folder; None: the job's."""

    @property
    def label(self) -> str:
        """What names it in events: its program's file name ("train.py" of `python train.py`)."""
        # the script an interpreter runs (`python train.py`, `bash run.sh`), else the program itself (`sh -c '...'`
        # is "sh": a shell line is no name)
        words = [w for w in self.command[:3] if not w.startswith("-") and not any(c.isspace() for c in w)]
        prog = next((w for w in words if "." in w.rsplit("/", 1)[-1]), self.command[0] if self.command else "")
        return prog.rsplit("/", 1)[-1]


def component_ranks(spec: JobSpec) -> tuple[tuple[int, int, int], ...]:
    """A heterogeneous job's runs, in rank order: (component, rank within it, runs of it). Component i has nodes x
    tasks_per_node runs, after those of components 0..i-1 (its placements too, one per node, follow theirs)."""
    out: list[tuple[int, int, int]] = []
    for i, c in enumerate(spec.components):
        n = c.resources.nodes * c.resources.tasks_per_node
        out.extend((i, k, n) for k in range(n))
    return tuple(out)


def component_placements(spec: JobSpec, placement: tuple[Placement, ...]) -> tuple[tuple[Placement, ...], ...]:
    """A heterogeneous job's placement split by component (each component's `nodes` placements, in order)."""
    out: list[tuple[Placement, ...]] = []
    at = 0
    for c in spec.components:
        out.append(placement[at:at + c.resources.nodes])
        at += c.resources.nodes
    return tuple(out)


@dataclass(frozen=True, slots=True)
class JobSpec:
    command: tuple[str, ...]
    name: str = ""
    workdir: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    resources: Resources = field(default_factory=Resources)
    qos: str = DEFAULT_QOS
    priority: int = 0
    priority_by: str = ""
    """Who set `priority` (the submitter or whoever ran `hsched priority`); "": nobody did (0), or a row from before
    it was recorded."""
    priority_admin: bool = False
    """`priority_by` was a lab admin then: the priority orders this job across users (hsched.sched.policies.hsched);
    a member's orders only their own jobs."""
    checkpoint_signal: CheckpointSignal = field(default_factory=CheckpointSignal)
    time_limit_s: float | None = None
    warn_signal: CheckpointSignal | None = None
    """`--signal USR1@60`: sent that many seconds before the time limit (sbatch's --signal)."""
    hold: bool = False
    retries: int | None = None
    """How often a failed run (nonzero exit, lost) is retried; None: the settings' default."""
    dependency: tuple[Dependency, ...] = ()
    dependency_any: bool = False
    """Any one dependency suffices (sbatch's `?`); else all must be satisfied (`,`)."""
    kill_on_invalid_dep: bool = False
    """Cancel the job when a dependency can never be satisfied, rather than leave it waiting."""
    array: ArraySpec | None = None
    """`--array`: the submit makes one job per index (the tasks), sharing this spec."""
    kind: str = ""
    """`--kind`: what the job is, for what hsched learns of its speed (hsched.learn.kinds); "" derives it from the
    command."""
    output: str | None = None
    """`-o/--output`: the file pattern (hsched.spec.outfiles) the run's stdout (and stderr, without `error`) is also
    written to on its node, as the job's user; None: the run folder's log only."""
    error: str | None = None
    """`-e/--error`: the file pattern for stderr; None: stderr goes where stdout goes."""
    output_append: bool = False
    """`--open-mode=append`: never empty those files (by default the job's first start empties them; a requeued
    run appends either way)."""
    ntasks: int | None = None
    """`--ntasks N` on one node (sbatch's, with srun's meaning): the command runs once, with SLURM_NTASKS=N, and `srun
    CMD` in a batch shell script runs CMD N times (hsched.spec.batch); None: the job's tasks are its ranks
    (`resources.tasks_per_node`), each running the command."""
    data: tuple[str, ...] = ()
    """`--data`: the datasets (the fleet file's `[[dataset]]` names) the job reads: placement weighs copying them
    against waiting for a node that holds them, and the run finds each at `$HSCHED_DATA_<NAME>` (hsched.datasets)."""
    components: tuple[Component, ...] = ()
    """A heterogeneous job (sbatch's hetjob: `hsched submit A : B`, `#SBATCH hetjob`, `[[component]]`): its
    components 0.., each with its own command and resources, placed and started together or not at all and ended as
    one (hsched.sched.stages.hetjob); `command` and `resources` above are component 0's. Empty: one ordinary job."""
    service: str = ""
    """The service (`hsched serve start NAME`) this job is a replica of; "": none (hsched.controller.services)."""
    replica: int | None = None
    """Which replica of `service` it is (`$HSCHED_REPLICA`); None for a job that is no replica."""
    workload: str = ""
    """`--workload`: training, inference or preprocessing (WORKLOADS); "": not said (`workload_of` infers it: a
    service's replica is inference)."""
    resize_signal: str | None = None
    """`--resize-signal USR2`: an elastic job that resizes in place. A resize does not restart it: its new devices are
    written to `$HSCHED_RESIZE_FILE` and it gets this signal (hsched.controller.resizing). None: checkpoint and
    restart."""

    @property
    def dependency_text(self) -> str:
        return ("?" if self.dependency_any else ",").join(map(str, self.dependency))


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one node's share of a job runs."""

    node: str
    devices: tuple[str, ...]
    explanation: str = ""
    cpus: tuple[int, ...] = ()
    """CPU cores local to the devices, for pinning the job there."""


@dataclass(frozen=True, slots=True)
class Job:
    id: int
    spec: JobSpec
    user: str
    state: JobState
    reason: str
    submit_time: float
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    restarts: int = 0
    """Requeues of any kind (preempted, checkpointed, node lost, retried): the attempt number is this + 1."""
    placement: tuple[Placement, ...] = ()
    failures: int = 0
    """Retries used: runs that failed (nonzero exit, lost) and were retried."""
    checkpoints: int = 0
    """Times the job exited with the checkpoint code on its own (not asked to by a stop)."""
    begin_time: float | None = None
    """Not started before this time (a retry's backoff; squeue's BeginTime)."""
    array_id: int | None = None
    """For an array task: the array's id (its first task's job id, as Slurm's ArrayJobId)."""
    array_task: int | None = None
    """For an array task: its index (SLURM_ARRAY_TASK_ID)."""

    @property
    def display_id(self) -> str:
        """'12' or, for an array task, '12_3' (as squeue shows it)."""
        return f"{self.array_id}_{self.array_task}" if self.array_id is not None else str(self.id)

    def component_id(self, i: int) -> str:
        """'12+1': a heterogeneous job's component (as squeue shows a hetjob's)."""
        return f"{self.display_id}+{i}"

    @property
    def name(self) -> str:
        return self.spec.name or (self.spec.command[0].rsplit("/", 1)[-1] if self.spec.command else "")


@dataclass(frozen=True, slots=True)
class RunHandle:
    """How a launched run is found again: pid + process start time + boot id rule out pid reuse."""

    run_dir: str
    pid: int
    pgid: int
    start_ticks: int
    boot_id: str


class RunStatus(enum.StrEnum):
    RUNNING = "running"
    EXITED = "exited"
    LOST = "lost"
    NOT_STARTED = "not_started"


@dataclass(frozen=True, slots=True)
class RunReport:
    """What a node says about a run."""

    status: RunStatus
    exit_code: int | None = None
    signal: int | None = None
    handle: RunHandle | None = None
    end_time: float | None = None
    """The node's clock when the run ended (its exit record), not when anyone noticed."""
    oom: bool = False
    """The kernel's OOM killer killed a process of the run (its cgroup's memory limit)."""
    gpu_oom: str | None = None
    """The line of its log's tail that says a GPU ran out of memory (CUDA's, PyTorch's...), when it failed so."""
    gpu_left: tuple[GpuHolder, ...] = ()
    """Processes still using the run's GPUs after every process of the run was gone: not ours to kill."""
    queued: bool = False
    """RUNNING for hsched (handed to the node) but still waiting in the node's own queue (a Slurm job PENDING):
    not started, so its time limit does not count yet."""
    started_at: float | None = None
    """When the node really started the run, where that is after its launch (a Slurm job's StartTime, after its
    wait in Slurm's queue): its time limit counts from here. None: the launch was the start, or not started."""
    cause: EndReason | None = None
    """Why a LOST run is gone, where the node knows it was no fault of the run: NODE_LOST (its node failed under
    it: Slurm's NODE_FAIL) or PREEMPTED (the node's own scheduler took it: Slurm's preemption). The job is
    requeued without using a retry. None: lost, nobody knows why (a retry, as for a failure)."""
    usage: Mapping[str, Any] | None = None
    """An exited run's last reading of what it used (hsched/node/cgroupstats.py: cpu_s, memory_peak_mib, source),
    taken when none of its processes was left; None: the node gave none."""


@dataclass(frozen=True, slots=True)
class GpuHolder:
    """A process that holds a GPU (nvidia-smi --query-compute-apps)."""

    uuid: str
    pid: int
    name: str = ""


@dataclass(frozen=True, slots=True)
class Run:
    id: int
    job_id: int
    attempt: int
    node: str
    devices: tuple[str, ...]
    state: RunState
    run_dir: str
    handle: RunHandle | None = None
    start_time: float | None = None
    end_time: float | None = None
    exit_code: int | None = None
    reason: str = ""
    rank: int = 0
    world: int = 1
