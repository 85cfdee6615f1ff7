"""A Slurm-backed pool in the simulator (issue #17): one group of GPUs that Slurm, not hsched, starts jobs on.

`--slurm-pool v100:32:60` adds 32 V100s that hsched's policy sees as one server (a Slurm node group appears in
`hsched nodes` as one node whose GPUs are its partition's): the round hands jobs over to it as to any server. A job
handed over reaches Slurm's queue `queue_wait_s` later (sbatch, slurmctld's scheduling cycle), and Slurm starts it
on nodes of its own choosing with FIFO plus EASY backfill (`SlurmQueue`): in submit order, and when the first job
in the queue does not fit, it gets a reservation at the earliest time enough GPUs are expected to free (from the
running jobs' estimates), and later jobs start now only if they end (by their estimate) before it or leave the
GPUs it reserved untouched. A gang that fits one Slurm node goes on one (best fit); a bigger one takes whole free
nodes.

hsched counts a handed-over job's GPUs as taken from the moment it hands it over (so it never hands over more
than the pool has, as live), and does not time-share it: the job runs there to its end (a new sbatch would queue
again). The queue in Slurm comes from the submit latency and from fragmentation: GPUs free in hsched's count but
not on one Slurm node.

Estimates: a job's time limit where the trace has one, else its true running time there (as Slurm users who know
their jobs; backfill then never breaks a reservation).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hsched.errors import UserError
from hsched.sched.soonest import soonest_fit
from hsched.sched.view import ServerView
from hsched.sim.bounds import MAX_CLUSTER_GPUS, MAX_GPUS_PER_NODE, MAX_SPAN_S

POOL_NAME = "slurm"


@dataclass(frozen=True, slots=True)
class SlurmPoolSpec:
    """`--slurm-pool TYPE:N[:QUEUE_WAIT_S[:GPUS_PER_NODE]]`."""

    gpu_type: str
    gpus: int
    queue_wait_s: float = 0.0
    gpus_per_node: int = 8
    name: str = POOL_NAME

    def server(self) -> ServerView:
        """The pool as hsched's round sees it: one server of all its GPUs."""
        return ServerView(self.name, self.gpu_type, tuple(f"{self.name}/{i}" for i in range(self.gpus)), "nvlink")

    def node_sizes(self) -> tuple[int, ...]:
        """Slurm's nodes: `gpus_per_node` GPUs each, the last one smaller when N is not a multiple."""
        full, rest = divmod(self.gpus, self.gpus_per_node)
        return (self.gpus_per_node,) * full + ((rest,) if rest else ())


def parse_slurm_pool(spec: str, gpus_per_node: int) -> SlurmPoolSpec:
    """'v100:32', 'v100:32:60' or 'v100:32:60:8' (GPU type, GPUs, submit latency in s, GPUs per Slurm node)."""
    parts = [p.strip() for p in spec.split(":")]
    bad = (f"--slurm-pool {spec!r}: expected TYPE:N[:QUEUE_WAIT_S[:GPUS_PER_NODE]], such as v100:32:60 (32 V100s, "
           f"60 s from hand-over to Slurm's queue)")
    if not 2 <= len(parts) <= 4 or not parts[0]:
        raise UserError(bad)
    try:
        gpus = int(parts[1]) if len(parts[1]) <= 20 else MAX_CLUSTER_GPUS + 1
        wait = float(parts[2]) if len(parts) > 2 and parts[2] else 0.0
        gpn = int(parts[3]) if len(parts) > 3 and parts[3] else gpus_per_node
    except ValueError:
        raise UserError(bad) from None
    if (not 1 <= gpus <= MAX_CLUSTER_GPUS or not 1 <= gpn <= MAX_GPUS_PER_NODE or not 0 <= wait <= MAX_SPAN_S):
        raise UserError(f"--slurm-pool {spec!r}: need N >= 1 GPUs (at most {MAX_CLUSTER_GPUS:,}), QUEUE_WAIT_S >= 0 "
                        f"(finite seconds) and GPUS_PER_NODE >= 1 (at most {MAX_GPUS_PER_NODE})")
    return SlurmPoolSpec(parts[0].lower(), gpus, wait, gpn)


Alloc = tuple[tuple[int, int], ...]
"""(Slurm node index, GPUs there) for each node a job got."""


@dataclass(frozen=True, slots=True)
class Queued:
    job_id: int
    gpus: int
    submit_at: float
    """When it reaches Slurm's queue (hand-over plus the submit latency)."""
    estimate_s: float
    seq: int


class SlurmQueue:
    """Slurm's side of the pool: its nodes, its queue, FIFO plus EASY backfill. Pure: no clock but `now`."""

    def __init__(self, spec: SlurmPoolSpec) -> None:
        self.spec = spec
        self.size = spec.node_sizes()
        self.free = list(self.size)
        self.queue: list[Queued] = []
        self.running: dict[int, tuple[Alloc, float]] = {}
        """Job id -> its nodes, and when it is expected to end."""
        self._seq = 0
        self.started = 0
        self.backfilled = 0
        """Jobs started past a blocked, earlier one."""

    def submit(self, job_id: int, gpus: int, at: float, estimate_s: float) -> None:
        if gpus > sum(self.size):
            raise ValueError(f"job {job_id}: {gpus} GPUs, more than the pool's {sum(self.size)}")
        self.queue.append(Queued(job_id, gpus, at, estimate_s, self._seq))
        self._seq += 1

    def next_submit(self, now: float) -> float:
        """The next time a handed-over job reaches the queue, after `now` (inf when none is on its way)."""
        return min((q.submit_at for q in self.queue if q.submit_at > now), default=math.inf)

    def release(self, job_id: int) -> None:
        alloc, _ = self.running.pop(job_id)
        for i, g in alloc:
            self.free[i] += g

    def cancel(self, job_id: int) -> None:
        """The job leaves the pool (its end, or a stop): its nodes free, or its place in the queue goes."""
        if job_id in self.running:
            self.release(job_id)
        else:
            self.queue = [q for q in self.queue if q.job_id != job_id]

    def fit(self, gpus: int, free: list[int]) -> Alloc | None:
        """Where `gpus` GPUs go on `free`: one node, best fit (fewest free that hold it, then the first); a gang
        bigger than any node takes whole free nodes, the biggest first. None when it does not fit."""
        if gpus <= max(self.size):
            best = min((f, i) for i, f in enumerate(free) if f >= gpus) if any(f >= gpus for f in free) else None
            return None if best is None else ((best[1], gpus),)
        whole = sorted((i for i, f in enumerate(free) if f == self.size[i]), key=lambda i: (-self.size[i], i))
        out: list[tuple[int, int]] = []
        need = gpus
        for i in whole:
            take = min(need, self.size[i])
            out.append((i, take))
            need -= take
            if need == 0:
                return tuple(out)
        return None

    def schedule(self, now: float) -> list[tuple[int, Alloc]]:
        """One scheduling pass at `now`: the jobs that start, with their nodes (FIFO, then EASY backfill)."""
        eligible = sorted((q for q in self.queue if q.submit_at <= now), key=lambda q: (q.submit_at, q.seq))
        started: list[tuple[int, Alloc]] = []
        shadow: float | None = None  # the blocked head's reserved start
        proj: list[int] = []  # free GPUs per node expected at `shadow`, less what long backfilled jobs keep
        reserved: dict[int, int] = {}  # GPUs per node the head will take at `shadow`
        for q in eligible:
            alloc = self.fit(q.gpus, self.free)
            if shadow is None:
                if alloc is not None:
                    self._start(q, alloc, now, started)
                    continue
                shadow, proj, reserved = self._reserve(q, now)
                continue
            if alloc is None:
                continue
            end = now + q.estimate_s
            if end <= shadow and not math.isinf(end):
                self._start(q, alloc, now, started)
                self.backfilled += 1
            elif all(proj[i] - g >= reserved.get(i, 0) for i, g in alloc):
                for i, g in alloc:
                    proj[i] -= g
                self._start(q, alloc, now, started)
                self.backfilled += 1
        return started

    def _start(self, q: Queued, alloc: Alloc, now: float, started: list[tuple[int, Alloc]]) -> None:
        for i, g in alloc:
            self.free[i] -= g
        self.running[q.job_id] = (alloc, now + q.estimate_s)
        self.queue.remove(q)
        self.started += 1
        started.append((q.job_id, alloc))

    def _reserve(self, head: Queued, now: float) -> tuple[float, list[int], dict[int, int]]:
        """The head's reservation: when it can start by the running jobs' expected ends, the free GPUs per node
        then, and the GPUs per node it will take. Unknown ends (inf) reserve nothing a short job could use."""
        # (an end already past counts as now: the search takes its releases in time order)
        releases: list[tuple[float, Alloc]] = [(now, ())]
        releases += [(max(now, end), alloc)
                     for _, (alloc, end) in sorted(self.running.items(), key=lambda kv: (kv[1][1], kv[0]))]
        proj = list(self.free)
        applied = 0

        def fits(n: int) -> tuple[list[int], Alloc] | None:
            # (asked of ever longer prefixes: only the new releases are added)
            nonlocal applied
            for _end, alloc in releases[applied:n]:
                for i, g in alloc:
                    proj[i] += g
            applied = n
            where = self.fit(head.gpus, proj)
            return None if where is None else (list(proj), where)

        # the live round's search (hsched.sched.stages.reservation.soonest_fit); all the jobs that end at the
        # head's start count as freed then
        hit = soonest_fit(releases, fits)
        if hit is None or math.isinf(hit[0]):
            # the head's start is unknown (a running job has no estimate): a job with a known end may go ahead,
            # one without may not (it could hold the head's GPUs for ever)
            return math.inf, [0] * len(proj), {i: self.size[i] for i in range(len(proj))}
        shadow, (at_shadow, where) = hit
        return shadow, at_shadow, dict(where)
