"""The simulator's live round mode (`SimConfig(round_mode="live")`, `hsched sim --round-mode live`): each round is the
live controller's own pipeline (hsched.sched.pipeline.schedule) over a `FleetView` of the simulated servers, so the
caps, constraints, shared GPUs, reservation and moves a replay measures are the ones that run live.

What the default rounds never see comes from the trace's optional columns (qos, constraint, shared, gpu_memory_mib:
hsched.sim.trace) and the simulator's options (node labels: `--labels`; QoS caps: `--settings`). The engine
(hsched.sim.engine) keeps the clock, the progress and the metrics; this module only turns its state into the
round's input and the round's decisions into starts and stops. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

from hsched.errors import UserError
from hsched.model import Device, Job, JobSpec, JobState, Link, Node, NodeState, Placement, Resources
from hsched.sched.cache import RoundCache
from hsched.sched.fleet import FleetView, Launch, Move, Running, Wait
from hsched.sched.limits import QosLimits
from hsched.sched.pipeline import schedule
from hsched.sched.preempt import PreemptRule
from hsched.sched.throughput import ThroughputModel
from hsched.sched.view import Preempt, RoundDecision, ServerView, Start
from hsched.sim.trace import TraceJob
from hsched.spec.constraints import node_labels
from hsched.topo.models import lookup_model

COMMAND = ("simulated",)
"""The command of every simulated job (the round never reads it; a JobSpec needs one)."""


def sim_nodes(servers: Sequence[ServerView], memory_mib: Mapping[str, int] | None = None) -> tuple[Node, ...]:
    """The live fleet's nodes for the simulated servers: one Node per server, one Device per GPU of the server's type
    (its model is the type, so the round names the type as the trace's table does), NVLinked unless the server is
    PCIe-only. A device's memory: `memory_mib` for its type, else the accelerator table's (what shared GPUs and
    `--gpu-memory` requests are matched against), else unknown."""
    out = []
    for sv in servers:
        known = lookup_model(sv.gpu_type)
        mem = (memory_mib or {}).get(sv.gpu_type, known.memory_mib if known is not None else None)
        devices = tuple(Device(u, i, sv.gpu_type, memory_total_mib=mem, simulated=True)
                        for i, u in enumerate(sv.devices))
        kind = "PIX" if sv.link == "pcie" else "NV1"
        links = tuple(Link(a.uuid, b.uuid, kind) for a, b in combinations(devices, 2))
        out.append(Node(sv.name, "simulated", NodeState.UP, devices=devices, links=links))
    return tuple(out)


def parse_labels(spec: str, names: Iterable[str]) -> dict[str, frozenset[str]]:
    """`--labels v100=fast,k80-1=old+slow`: every node whose name starts with the prefix gets those labels (`+`
    between several). A prefix no node has is refused: a typo would leave every constrained job waiting for ever."""
    names = tuple(names)
    out: dict[str, set[str]] = {}
    for part in spec.split(","):
        if not part.strip():
            continue
        prefix, sep, labels = part.partition("=")
        prefix = prefix.strip()
        words = [w.strip() for w in labels.split("+") if w.strip()]
        if not sep or not prefix or not words:
            raise UserError(f"--labels {spec!r}: expected NODE_PREFIX=LABEL[+LABEL],... such as v100=fast,k80-1=old "
                            f"(bad part {part!r})")
        hit = [n for n in names if n.startswith(prefix)]
        if not hit:
            raise UserError(f"--labels {spec!r}: no node's name starts with {prefix!r} (nodes: "
                            f"{', '.join(names[:6])}{' ...' if len(names) > 6 else ''})")
        for n in hit:
            out.setdefault(n, set()).update(words)
    return {n: frozenset(v) for n, v in out.items()}


@dataclass(frozen=True, slots=True)
class LiveInput:
    """What the live round reads that the default rounds do not: node labels (node name -> labels, matched by
    `--constraint`), the QoS caps, and how long a job runs before the round may move it (settings
    `move_min_run_s`)."""

    labels: Mapping[str, frozenset[str]]
    limits: Mapping[str, QosLimits]
    move_min_run_s: float = 1800.0


def job_of(tj: TraceJob, allowed: tuple[str, ...], node_gpus: int, restarts: int = 0,
           placement: tuple[Placement, ...] = ()) -> Job:
    """The live Job for a trace job: its GPUs (a gang larger than a server asks for whole servers, as `--nodes N`),
    the GPU types the table has a speed for (`allowed`, empty: any), its QoS, constraint and shared-GPU request;
    RUNNING with a placement, else PENDING."""
    gpus, nodes = tj.gpus, 1
    if gpus > node_gpus and not tj.shared:
        nodes = math.ceil(gpus / node_gpus)
        if gpus % nodes == 0:
            gpus //= nodes
        else:
            nodes = 1  # no equal split: asks for more GPUs than a server has, and waits (as live)
    res = Resources(gpus=gpus, gpu_types=allowed, gpu_memory_mib=tj.gpu_memory_mib, nodes=nodes,
                    constraint=tj.constraint, shared=tj.shared)
    spec = JobSpec(COMMAND, name=tj.name, resources=res, qos=tj.qos, priority=tj.priority,
                   time_limit_s=tj.time_limit_s, kind=tj.job_type)
    state = JobState.RUNNING if placement else JobState.PENDING
    return Job(tj.id, spec, tj.user or "sim", state, "", tj.arrival_s, restarts=restarts, placement=placement)


class LiveRounds:
    """The live round over the simulated fleet. The engine tells it what starts and stops (`started`, `stopped`);
    `decide` builds the FleetView the controller would build and runs the pipeline. Job and Running objects are kept
    while unchanged, as the controller keeps them, so the round's caches work as they do live."""

    def __init__(self, servers: Sequence[ServerView], live: LiveInput, rule: PreemptRule, policy: str,
                 throughput: ThroughputModel, checkpoint_s: float) -> None:
        self.nodes = sim_nodes(servers)
        self.type_of = {sv.name: sv.gpu_type for sv in servers}
        self.node_gpus = max((len(sv.devices) for sv in servers), default=1)
        self.labels = {n.name: node_labels(n.name, live.labels.get(n.name, ())) for n in self.nodes}
        self.live = live
        # the live controller's rule: its QoS table; time-sharing is the pipeline's to allow (moves of jobs that
        # checkpoint, after move_min_run_s), never the simulator's quantum
        self.rule = rule
        self.policy = policy
        self.throughput = throughput
        self.checkpoint_s = checkpoint_s
        self.cache = RoundCache()
        self.waiting: dict[int, Job] = {}
        self.running: dict[int, Running] = {}
        self.can_move: dict[int, float] = {}
        """Running jobs that checkpoint (the trace's `checkpointable`, not shared) -> what a move costs them."""
        self.log: list[tuple[float, int, tuple[Placement, ...]]] = []
        """Every start: (time, job id, placements), in order (what a test compares with the live round's)."""

    def started(self, tj: TraceJob, allowed: tuple[str, ...], restarts: int, placement: tuple[Placement, ...],
                t: float) -> None:
        self.waiting.pop(tj.id, None)
        self.running[tj.id] = Running(job_of(tj, allowed, self.node_gpus, restarts, placement), t)
        if tj.checkpointable and not tj.shared:
            self.can_move[tj.id] = self.checkpoint_s
        self.log.append((t, tj.id, placement))

    def stopped(self, job_id: int) -> None:
        self.running.pop(job_id, None)
        self.can_move.pop(job_id, None)

    def fleet(self, ends: Mapping[int, float], attained: Mapping[int, float], usage: Mapping[str, float] | None,
              movable: Mapping[int, float], left: Mapping[int, tuple[float, str]] | None = None) -> FleetView:
        busy: set[str] = set()
        shared_use: dict[str, int] = {}
        for r in self.running.values():
            res = r.job.spec.resources
            for p in r.job.placement:
                busy.update(p.devices)
                if res.shared:
                    for u in p.devices:
                        shared_use[u] = shared_use.get(u, 0) + (res.gpu_memory_mib or 0)
        return FleetView(nodes=self.nodes, busy=frozenset(busy), cpus_used={}, running=tuple(self.running.values()),
                         rule=self.rule, policy=self.policy, user_usage=usage, labels=self.labels,
                         limits=self.live.limits, throughput=self.throughput, ends=ends, movable=movable,
                         move_min_run_s=self.live.move_min_run_s, attained=attained, shared_use=shared_use,
                         left=left or {})

    def decide(self, now: float, pending: Sequence[tuple[TraceJob, tuple[str, ...], int]],
               ends: Mapping[int, float], attained: Mapping[int, float], usage: Mapping[str, float] | None,
               left: Mapping[int, tuple[float, str]] | None = None) -> tuple[RoundDecision, bool]:
        """One live round: the engine's decision (stops first, then starts: launches, and moves as migrations,
        their checkpoint paid on resume) and whether to round again at once (a QoS preemption stopped its victims:
        the job that asked starts on their devices in the next round, as live)."""
        queue = []
        for tj, allowed, restarts in pending:
            j = self.waiting.get(tj.id)
            if j is None or j.restarts != restarts:
                j = self.waiting[tj.id] = job_of(tj, allowed, self.node_gpus, restarts)
            queue.append(j)
        decisions = schedule(self.fleet(ends, attained, usage, self.can_move, left), queue, now, cache=self.cache)
        stops: list[int] = []
        starts: list[Start] = []
        again = False
        for d in decisions:
            if isinstance(d, Launch):
                starts.append(Start(d.job_id, self.type_of[d.placements[0].node], d.placements))
            elif isinstance(d, Move):
                starts.append(Start(d.job_id, self.type_of[d.placements[0].node], d.placements, migrate=True))
            elif isinstance(d, Preempt):
                stops.extend(v for v in d.victims if v in self.running)
                again = again or bool(d.victims)
            else:
                assert isinstance(d, Wait)
        return RoundDecision(preempt=tuple(stops), starts=tuple(starts)), again
