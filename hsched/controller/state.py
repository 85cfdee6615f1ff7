"""What the controller keeps between rounds, as one typed structure (`ControllerState`) made in one place
(`Controller.__init__`), so the controller's constructor shows all it holds.

The feature modules (job cache, usage, moves, metrics, data, learning, the launcher's caches) used to keep their
part in side tables keyed by controller; their data classes live here, below every feature module (this module
imports no controller module), and each module reaches its part through `ctl.state`.
"""

from __future__ import annotations

import asyncio
import operator
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from hsched.controller.store import Store, job_from_row, run_from_row
from hsched.datasets import DataPlace
from hsched.executors.base import StatusQuery
from hsched.learn.efficiency import RunTally
from hsched.learn.kinds import KindRate, run_speed
from hsched.model import Job, JobState, Placement, Run

if TYPE_CHECKING:
    from hsched.sched.live import Running
    from hsched.sched.throughput import ThroughputModel


@dataclass(frozen=True, slots=True)
class Jobs:
    """The store's jobs that have not ended, as one read saw them (`JobCache.read`), split and indexed once."""

    changes: int
    """The store's change count at the read (`_changes`)."""
    all: tuple[Job, ...]
    """Every job not ended, by id."""
    queued: tuple[Job, ...]
    """The pending jobs not held."""
    active: tuple[Job, ...]
    """The jobs holding devices."""
    queued_by_id: Mapping[int, Job]
    active_by_id: Mapping[int, Job]
    users: frozenset[str]
    """The users of the queued and active jobs."""
    special: bool
    """Some queued job has a begin time (a retry's backoff), a dependency or an array's %N: the round must look at
    each; else every queued job may start."""
    elastic: frozenset[int] = frozenset()
    """The queued and active jobs that are elastic (`is_elastic`): the round's resizing looks at these alone."""
    requeued: frozenset[int] = frozenset()
    """The queued and active jobs that ran before (`restarts`): the round's attained service looks at these alone."""
    apart: bool = True
    """Some queued job is shared (`--shared`) or heterogeneous (components): the round's stages for those look through
    the queue (`FleetView.queue_apart`); else they have nothing to do."""

    @classmethod
    def of(cls, changes: int, jobs: tuple[Job, ...]) -> Jobs:
        pending, holding = JobState.PENDING, frozenset(s for s in JobState if s.is_active())
        queued = tuple(j for j in jobs if j.state is pending and not j.spec.hold)
        active = tuple(j for j in jobs if j.state in holding)
        special = any(j.begin_time is not None or j.spec.dependency
                      or (j.spec.array is not None and j.spec.array.max_running) for j in queued)
        return cls(changes, jobs, queued, active, {j.id: j for j in queued}, {j.id: j for j in active},
                   frozenset(j.user for j in (*queued, *active)), special,
                   frozenset(j.id for j in (*queued, *active) if is_elastic(j)),
                   frozenset(j.id for j in (*queued, *active) if j.restarts), any(map(is_apart, queued)))


def is_apart(job: Job) -> bool:
    """A shared or heterogeneous job: the round places those in stages of their own (`Jobs.apart`)."""
    return job.spec.resources.shared or bool(job.spec.components)


def is_elastic(job: Job) -> bool:
    """An elastic job (`--gpus MIN-MAX` or `--nodes MIN-MAX`) that may be resized (hsched.controller.resizing)."""
    res = job.spec.resources
    return (res.gpus_max is not None or res.nodes_max is not None) and bool(res.elastic)


_CHANGED = (
    "CREATE TEMP TABLE IF NOT EXISTS hsched_changed_jobs (id INTEGER PRIMARY KEY)",
    "CREATE TEMP TRIGGER IF NOT EXISTS hsched_jobs_inserted AFTER INSERT ON jobs BEGIN "
    "INSERT OR IGNORE INTO hsched_changed_jobs VALUES (NEW.id); END",
    "CREATE TEMP TRIGGER IF NOT EXISTS hsched_jobs_updated AFTER UPDATE ON jobs BEGIN "
    "INSERT OR IGNORE INTO hsched_changed_jobs VALUES (NEW.id); END",
    "CREATE TEMP TRIGGER IF NOT EXISTS hsched_jobs_deleted AFTER DELETE ON jobs BEGIN "
    "INSERT OR IGNORE INTO hsched_changed_jobs VALUES (OLD.id); END",
)
"""What `JobCache` notes on the store's connection: the ids of job rows written since its last read (TEMP: on that
connection only, never in the file)."""


_SECOND = operator.itemgetter(1)
"""(row, object) -> the object (`map` over 2,500 kept rows at C speed: a generator was ~1 ms a churn poll)."""


class JobCache:
    """The store's jobs that have not ended, as Job objects, kept from one read to the next.

    Decoding 2,000 pending jobs afresh costs ~150 ms of CPU (each spec is JSON), fetching them as rows ~17 ms. So
    the cache reads nothing while the store's connection has made no change since the last read (sqlite's
    `total_changes`: every write of the controller goes through that one connection, on its one thread), and
    otherwise reads only the rows written since (issue 33: 2 ends and 2 arrivals a poll made every poll fetch all
    2,000 rows again): a TEMP trigger on that connection notes each job row inserted, updated or deleted
    (`_CHANGED`), and the read fetches those ids alone. An unchanged row gives the very Job object it gave before,
    so `is` tells the round's checks that a job is as the round saw it. Each read hands out an immutable `Jobs`: a
    later read (the health loop's, say) never changes what a round is looking at.
    """

    __slots__ = ("active", "apart", "conn", "elastic", "last", "queued", "requeued", "rows", "special", "unsorted",
                 "users")

    def __init__(self) -> None:
        self.last = Jobs.of(-1, ())
        self.rows: dict[int, tuple[tuple[object, ...], Job]] = {}
        """Job id -> (its row, its Job), the jobs not ended, by id."""
        self.conn: object = None
        """The connection the trigger was made on (a store reopened is read whole again)."""
        # `Jobs`' parts, kept up to date job by job as rows change (splitting 2,500 jobs afresh after every write was
        # ~0.5 ms a read on the store's thread, issue 33)
        self.queued: dict[int, Job] = {}
        self.active: dict[int, Job] = {}
        self.special: set[int] = set()
        self.apart: set[int] = set()
        """The queued jobs that are shared or heterogeneous (`is_apart`)."""
        self.requeued: set[int] = set()
        """The queued and active jobs that ran before (`Job.restarts`)."""
        """The queued jobs that are `Jobs.special`."""
        self.elastic: set[int] = set()
        """The queued and active jobs that are elastic (`is_elastic`)."""
        self.users: dict[str, int] = {}
        """User -> how many of their jobs are queued or active."""
        self.unsorted = [False, False]
        """Whether `queued`, `active` took a job out of id order since `last`."""

    def read(self, store: Store) -> Jobs:
        """The jobs not ended, now. Blocking: call it on the store's thread (`ctl.db`)."""
        db = store.db
        changes = db.total_changes
        if changes == self.last.changes and self.conn is db:
            return self.last
        if self.conn is not db:
            # first read (or a new connection): note changes from here on, then read every row once
            for statement in _CHANGED:
                db.execute(statement)
            db.execute("DELETE FROM temp.hsched_changed_jobs")
            self.conn = db
            seen, self.rows = self.rows, {}
            self.queued, self.active, self.special, self.users, self.elastic = {}, {}, set(), {}, set()
            self.apart, self.requeued = set(), set()
            touched = [False, False]
            for r in store.job_rows(active_only=True):
                self._keep(r, seen.get(r["id"]), touched, whole=True)
            self.last = self._jobs(db.total_changes, True, True)
            return self.last
        ids = [i for (i,) in db.execute("SELECT id FROM temp.hsched_changed_jobs")]
        if not ids:
            # (another cache's own writes moved the mark: nothing of ours changed, and the same tuples go on)
            self.last = replace(self.last, changes=db.total_changes)
            return self.last
        db.execute("DELETE FROM temp.hsched_changed_jobs")
        got = {r["id"]: r for r in store.job_rows_by_id(ids)}
        rows = self.rows
        tail = next(reversed(rows), 0)
        unsorted = False
        touched = [False, False]
        for jid in ids:
            row = got.get(jid)
            kept = rows.get(jid)
            if row is None or JobState(row["state"]).is_terminal():
                if kept is not None:
                    self._move(kept[1], None, touched)
                rows.pop(jid, None)
                continue
            unsorted |= kept is None and jid < tail  # (an update keeps its place; a new id goes last)
            self._keep(row, kept, touched)
        if unsorted:
            self.rows = dict(sorted(rows.items()))
        # (the temp table's own writes counted too: the mark is taken after them)
        self.last = self._jobs(db.total_changes, *touched)
        return self.last

    def _jobs(self, changes: int, queued: bool, active: bool) -> Jobs:
        """`Jobs` from the parts kept (`queued`/`active`: those changed since `last`; unchanged ones hand out the
        same tuples and maps again)."""
        last = self.last
        queued_by_id: Mapping[int, Job]
        active_by_id: Mapping[int, Job]
        if queued:
            q = self.queued
            if self.unsorted[0]:
                self.queued = q = dict(sorted(q.items()))  # (a requeued job goes back to its place by id)
            queued_t, queued_by_id = tuple(q.values()), dict(q)
        else:
            queued_t, queued_by_id = last.queued, last.queued_by_id
        if active:
            a = self.active
            if self.unsorted[1]:
                self.active = a = dict(sorted(a.items()))
            active_t, active_by_id = tuple(a.values()), dict(a)
        else:
            active_t, active_by_id = last.active, last.active_by_id
        self.unsorted = [False, False]
        return Jobs(changes, tuple(map(_SECOND, self.rows.values())), queued_t, active_t, queued_by_id,
                    active_by_id, frozenset(self.users), bool(self.special),
                    frozenset(self.elastic) if self.elastic else frozenset(), frozenset(self.requeued),
                    bool(self.apart))

    def _keep(self, r: sqlite3.Row, kept: tuple[tuple[object, ...], Job] | None, touched: list[bool], *,
              whole: bool = False) -> None:
        """The row's job kept (the very Job while its row is unchanged), and moved in the parts (`whole`: parts made
        afresh, `kept` in none of them)."""
        key = tuple(r)
        if kept is not None and kept[0] == key:
            new = kept
        else:
            # an update of a job's state, reason or placement keeps its spec: decoding the spec's JSON again was most
            # of a changed row's cost (a churn poll changes ~8)
            spec = None
            if kept is not None:
                at = r.keys().index("spec")
                spec = kept[1].spec if kept[0][at] == key[at] else None
            new = (key, job_from_row(r, spec))
        self.rows[r["id"]] = new
        if whole:
            self._move(None, new[1], touched)
        elif kept is None or new[1] is not kept[1]:
            self._move(kept[1] if kept is not None else None, new[1], touched)

    def _part(self, j: Job | None) -> int:
        """Where `Jobs.of` puts `j`: 0 queued, 1 active, -1 neither."""
        if j is None:
            return -1
        if j.state is JobState.PENDING:
            return -1 if j.spec.hold else 0
        return 1 if j.state.is_active() else -1

    def _move(self, old: Job | None, new: Job | None, touched: list[bool]) -> None:
        """The parts with `old` (the job as last kept, None: new) replaced by `new` (None: gone); `touched[k]` set
        when part k changed."""
        was, now = self._part(old), self._part(new)
        parts = (self.queued, self.active)
        if was >= 0 and old is not None:
            touched[was] = True
            if now != was:
                del parts[was][old.id]
                self.special.discard(old.id)
                self.elastic.discard(old.id)
                self.apart.discard(old.id)
                self.requeued.discard(old.id)
                n = self.users[old.user] - 1
                if n:
                    self.users[old.user] = n
                else:
                    del self.users[old.user]
        if now >= 0 and new is not None:
            touched[now] = True
            part = parts[now]
            if now != was:
                self.unsorted[now] |= bool(part) and new.id < next(reversed(part))
                self.users[new.user] = self.users.get(new.user, 0) + 1
            part[new.id] = new  # (an update in place keeps its place)
            if is_elastic(new):
                self.elastic.add(new.id)
            else:
                self.elastic.discard(new.id)
            if new.restarts:
                self.requeued.add(new.id)
            else:
                self.requeued.discard(new.id)
            if now == 0 and (new.begin_time is not None or new.spec.dependency
                             or (new.spec.array is not None and new.spec.array.max_running)):
                self.special.add(new.id)
            else:
                self.special.discard(new.id)
            if now == 0 and is_apart(new):
                self.apart.add(new.id)
            else:
                self.apart.discard(new.id)


class LiveRuns:
    """The store's live runs, kept from one read to the next as `JobCache` keeps jobs (issue 33): nothing read while
    the store made no change, and after a change only the runs written since (`Store.runs_changed`) fetched and decoded
    (512 runs decoded afresh were ~6 ms a read, twice a poll: the watch's and the stops'; fetching them all again
    after every end still ~2 ms a read)."""

    __slots__ = ("changes", "conn", "groups", "nodes", "rows", "runs")

    def __init__(self) -> None:
        self.changes = -1
        self.conn: object = None
        """The store the notes are asked of (a store reopened is read whole again)."""
        self.rows: dict[int, tuple[tuple[object, ...], Run]] = {}
        """Run id -> (its row, its Run), the live runs, by id."""
        self.runs: tuple[Run, ...] = ()
        self.nodes: dict[str, dict[int, Run]] = {}
        """Node -> its live runs by id."""
        self.groups: dict[str, RunGroup] = {}
        """Node -> its live runs and their status queries (`read_grouped`), made again only for a node whose runs
        changed."""

    def read(self, store: Store) -> list[Run]:
        """The live runs, by id. Blocking: call it on the store's thread (`ctl.db`)."""
        self._read(store)
        return list(self.runs)

    def of_job(self, store: Store, job_id: int) -> list[Run]:
        """The job's live runs, by id (found on the store's thread: a stop's signal looked through 512 runs on the
        event loop). Blocking: call it on the store's thread (`ctl.db`)."""
        self._read(store)
        return [r for r in self.runs if r.job_id == job_id]

    def read_grouped(self, store: Store) -> tuple[list[Run], dict[str, RunGroup]]:
        """The live runs, by id, and grouped by node, the nodes in the order of their first run (the watch's
        question to each node: grouping 512 runs and making their queries afresh every poll was ~0.5 ms of the
        event loop, issue 33). Blocking: call it on the store's thread (`ctl.db`)."""
        self._read(store)
        groups = self.groups
        return list(self.runs), dict(sorted(groups.items(), key=lambda g: g[1].runs[0].id))

    def _read(self, store: Store) -> None:
        if store.db.total_changes == self.changes and self.conn is store:
            return
        changed: set[str] = set()
        if self.conn is not store:
            store.runs_changed("live")  # (notes from here on)
            self.conn = store
            seen, self.rows, self.nodes, self.groups = self.rows, {}, {}, {}
            for r in store.live_run_rows():
                self._keep(r, seen.get(r["id"]), changed)
        elif ids := store.runs_changed("live"):
            got = {r["id"]: r for r in store.run_rows_by_id(sorted(ids), live_only=True)}
            rows = self.rows
            tail = next(reversed(rows), 0)
            unsorted = False
            for rid in sorted(ids):
                row = got.get(rid)
                if row is None:
                    gone = rows.pop(rid, None)
                    if gone is not None:
                        del self.nodes[gone[1].node][rid]
                        changed.add(gone[1].node)
                    continue
                unsorted |= rid not in rows and rid < tail
                self._keep(row, rows.get(rid), changed)
            if unsorted:
                self.rows = dict(sorted(rows.items()))
        for node in changed:
            on = self.nodes.get(node)
            if not on:
                self.nodes.pop(node, None)
                self.groups.pop(node, None)
                continue
            runs = tuple(on[i] for i in sorted(on))  # (a node's few runs, by id)
            self.groups[node] = RunGroup(runs, tuple(StatusQuery(r.run_dir, r.handle) for r in runs))
        self.runs = tuple(map(_SECOND, self.rows.values()))
        self.changes = store.db.total_changes  # (after the notes' trim, if any)

    def _keep(self, r: sqlite3.Row, kept: tuple[tuple[object, ...], Run] | None, changed: set[str]) -> None:
        key = tuple(r)
        if kept is not None and kept[0] == key:
            self.rows[r["id"]] = kept
            return
        run = run_from_row(r)
        self.rows[run.id] = (key, run)
        if kept is not None and kept[1].node != run.node:
            del self.nodes[kept[1].node][run.id]
            changed.add(kept[1].node)
        self.nodes.setdefault(run.node, {})[run.id] = run
        changed.add(run.node)


@dataclass(frozen=True, slots=True)
class RunGroup:
    """One node's live runs, by id, and the status query of each (`LiveRuns.read_grouped`)."""

    runs: tuple[Run, ...]
    queries: tuple[StatusQuery, ...]


@dataclass(slots=True)
class Usage:
    """The controller's live tallies (one per controller: a test process may hold several)."""

    tallies: dict[tuple[int, int, str], RunTally] = field(default_factory=dict)
    """(job id, attempt, node) -> its tally, while the job holds GPUs."""
    by_job: dict[int, dict[tuple[int, str], RunTally]] = field(default_factory=dict)
    """The same, by job id: job -> (attempt, node) -> tally (a job's own, as an end reads them, without a pass over
    every running job's: `hsched.controller.usage.tallies_of`)."""
    jobs: Jobs | None = None
    held: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)
    """From `jobs`: node -> GPU UUID -> (job id, attempt) of the job holding it."""
    idle: dict[tuple[int, int], float] = field(default_factory=dict)
    """(job id, attempt) -> since when its GPUs have been idle, for the running attempts flagged idle."""
    idle_checked: float | None = None
    """When check_idle last looked (it looks every IDLE_CHECK_S), on the monotonic clock: a wall clock stepped back
    an hour must not stop it looking for the hour."""


@dataclass(slots=True)
class Moves:
    """One controller's record of the jobs that checkpoint, their measured costs and the devices held for moves."""

    proven: set[int] | None = None
    """Jobs that proved they checkpoint (None: not read from the store yet)."""
    stop_s: dict[int, float] = field(default_factory=dict)
    """Job id -> its longest measured time from a stop's decision to its GPUs free."""
    restore_s: dict[int, float] = field(default_factory=dict)
    """Job id -> its measured time from a restart to its first progress report."""
    held: dict[int, tuple[tuple[Placement, ...], float]] = field(default_factory=dict)
    """Job id -> (the devices its move promised it, until when on the controller's clock)."""
    attained: dict[int, tuple[int, float]] = field(default_factory=dict)
    """Job id -> (its restarts when read, the seconds its ended attempts ran)."""
    held_read: bool = False
    """Whether the holds of moves a previous controller made were read back from the store (their `move` events)."""


ROUND_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True, slots=True)
class GpuSample:
    node: str
    uuid: str
    index: int
    model: str
    utilization: float | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    power_w: float | None
    temperature_c: float | None
    job: int | None
    user: str | None = None
    qos: str | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    taken: float
    gpus: tuple[GpuSample, ...]
    nodes: tuple[tuple[str, str], ...]
    """(node, state)."""
    jobs: tuple[tuple[str, str, int], ...]
    """(state, qos, count)."""
    pending_wait_s: tuple[tuple[str, float], ...]
    """(qos, oldest pending job's wait in seconds)."""


@dataclass
class Recorder:
    """What happens between scrapes: round latencies (a histogram) and preemptions."""

    buckets: list[int] = field(default_factory=lambda: [0] * (len(ROUND_BUCKETS_S) + 1))
    round_sum_s: float = 0.0
    rounds: int = 0
    preemptions: int = 0
    moves: int = 0
    """Running jobs the policy moved to faster GPUs (hsched.controller.moves; each is a preemption too)."""
    data_copies: dict[str, int] = field(default_factory=dict)
    """Dataset copies ended, by outcome ("copied", "failed"; hsched.controller.data)."""
    data_bytes: int = 0
    """Bytes dataset copies moved (resumed bytes not counted again)."""
    data_copy_s: float = 0.0
    """Seconds dataset copies took, those that ended well."""
    snapshot: Snapshot | None = None

    def observe_round(self, seconds: float) -> None:
        for n, bound in enumerate(ROUND_BUCKETS_S):
            if seconds <= bound:
                self.buckets[n] += 1
                break
        else:
            self.buckets[-1] += 1
        self.round_sum_s += seconds
        self.rounds += 1


@dataclass(slots=True)
class Transfer:
    """A copy under way."""

    dataset: str
    node: str
    source: str
    path: str
    total: int
    done: int = 0
    started: float = 0.0
    job_id: int | None = None
    why: str = "start"
    """"start" (a run waits for it) or "prefetch"."""
    task: asyncio.Task[DataPlace] | None = None


@dataclass(slots=True)
class DataState:
    places: dict[tuple[str, str], DataPlace] = field(default_factory=dict)
    links: dict[tuple[str, str], float] = field(default_factory=dict)
    transfers: dict[tuple[str, str], Transfer] = field(default_factory=dict)
    loaded: bool = False
    resumed: bool = False
    waiting_since: dict[int, float] = field(default_factory=dict)
    """Job id -> when a round first made it wait for a node holding its data: its whole wait is bounded by its copy
    (hsched.sched.locality.choose_wait); forgotten when it starts or leaves the queue."""


RateKey = tuple[str, str, int, str]
"""(kind, GPU type, GPU count, placement class)."""


@dataclass(slots=True)
class RunProgress:
    """One attempt's progress as its reports said (rank 0's), and where it ran."""

    job_id: int
    attempt: int
    key: RateKey
    first: tuple[float, float] | None = None
    """(time, step) of the first report."""
    last: tuple[float, float] | None = None
    total: float | None = None
    loss: float | None = None
    reports: int = 0

    @property
    def steps_per_s(self) -> float | None:
        return run_speed(self.first, self.last) if self.first and self.last else None

    def to_dict(self) -> dict[str, Any]:
        step = self.last[1] if self.last else None
        speed = self.steps_per_s
        eta = ((self.total - step) / speed if self.total is not None and step is not None and speed
               and self.total >= step else None)
        return {"attempt": self.attempt, "kind": self.key[0], "gpu_type": self.key[1], "gpus": self.key[2],
                "class": self.key[3], "step": step, "total": self.total, "loss": self.loss,
                "steps_per_s": speed, "remaining_s": eta, "reports": self.reports,
                "first": list(self.first) if self.first else None, "last": list(self.last) if self.last else None}


@dataclass(slots=True)
class Learning:
    """The controller's learning: live runs' progress and the kinds' speeds (one per controller)."""

    runs: dict[tuple[int, int], RunProgress] = field(default_factory=dict)
    rates: dict[RateKey, KindRate] | None = None
    """The store's table, read once (None: not yet)."""
    jobs: Jobs | None = None
    model: ThroughputModel | None = None
    model_at: float = float("-inf")
    history: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    """Kind -> (user, running time) of its last completed jobs, oldest first (read from the store per kind)."""
    predicted: dict[int, float | None] = field(default_factory=dict)
    """Job id -> the duration predicted when it first started (to measure the prediction when it completes)."""
    left: dict[int, tuple[float, str]] = field(default_factory=dict)
    """Job id -> (seconds its last ended attempt's progress said were left, the GPU type it ran on), for the jobs
    that reported a total and are active (the round's `FleetView.left`); kept in memory only: after a restart a
    requeued job is ranked by its attained service until it reports again."""


@dataclass(slots=True)
class End:
    """A running job's prediction, kept while the Job (the very object: the job cache keeps unchanged ones) and its
    last report are unchanged (`key`), its figure from history while its kind's history is (`history`): deriving a
    kind from a command alone cost 26 ms a round over 512 running jobs."""

    job: Job
    kind: str
    key: tuple[object, ...]
    by_progress: float | None
    by_history: float | None
    history: tuple[int, int] | None
    """The id and length of the kind's history `by_history` was made from; None: not made yet."""


@dataclass(slots=True)
class ControllerState:
    """Everything the controller's feature modules keep between rounds (one per controller: tests run several in
    one process)."""

    jobs: JobCache = field(default_factory=JobCache)
    live_runs: LiveRuns = field(default_factory=LiveRuns)
    """The store's jobs that have not ended (hsched.controller.jobcache)."""
    usage: Usage = field(default_factory=Usage)
    """Live GPU tallies and idle flags (hsched.controller.usage)."""
    moves: Moves = field(default_factory=Moves)
    """Jobs that checkpoint, their costs, devices held for moves (hsched.controller.moves)."""
    metrics: Recorder = field(default_factory=Recorder)
    """Round latencies, preemptions, copies between scrapes (hsched.controller.metrics)."""
    data: DataState = field(default_factory=DataState)
    """Dataset places, link speeds, copies under way (hsched.controller.data)."""
    learning: Learning = field(default_factory=Learning)
    """Runs' progress and the kinds' speeds (hsched.controller.learning)."""
    ends: dict[int, End] = field(default_factory=dict)
    """Job id -> its last predicted end (hsched.controller.learning.predicted_ends)."""
    fair_usage: tuple[float, int, frozenset[str], dict[str, float]] | None = None
    """Fair share's usage as last read: (when, the store's change count, the users, usage per user)."""
    held: tuple[object, dict[int, float], tuple[Any, ...]] | None = None
    """What the active jobs hold, for the very tuple of jobs the job cache handed out (hsched.controller.launching)."""
    running: dict[int, Running] = field(default_factory=dict)
    """The last round's running jobs by id: the same Running while its job (the very object) and start are."""
    services: Any = None
    """The service manager (hsched.controller.services.manager makes it; typed there: it imports this module)."""
