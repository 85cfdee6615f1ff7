"""The discrete-event simulator: a simulated clock driving the very round function the controller calls.

Events are arrivals, completions and, for time-sharing policies, the end of a round (quantum) while jobs
wait. Between events every running job progresses at its throughput on its GPU type (lower when a gang
spans servers or sits on a server without NVLink). A job that is preempted or moved pays the checkpoint
cost when it resumes: it holds its GPUs for that many seconds without progress. The simulator alone knows
each job's remaining work; policies get `JobView`s built from what a real controller could observe.

Who may be stopped is the preemption rule's to say (`SimConfig.preempt`, hsched.sched.preempt), the very
rule the live controller runs; by default the controller's default QoS table. A job that cannot checkpoint
(`TraceJob.checkpointable`) is never time-shared, and a QoS preemption makes it start over: the work it
loses counts in `gpu_hours_lost`, with the checkpoint costs of the others.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace

from hsched.config import Settings
from hsched.learn.fairshare import shared_usage
from hsched.learn.kinds import MIN_WINDOW_S, PlacementClass
from hsched.model import Placement
from hsched.sched.elastic import Direction, ElasticJob, fair_gpus, plan_resizes
from hsched.sched.elastic import Waiting as ElasticWaiting
from hsched.sched.locality import Locality
from hsched.sched.placement import PackingPlacer, Placer
from hsched.sched.policies.base import AnyPolicy
from hsched.sched.preempt import PreemptRule
from hsched.sched.round import build_input, schedule_round
from hsched.sched.view import JobPhase, JobView, PolicyInput, RoundDecision, ServerView, Start, qos_rank
from hsched.sim.data import (
    PREFETCH_LOOKAHEAD,
    DataModel,
    DataState,
    LocalityPlacer,
    Waiting,
    prefetch_copies,
)
from hsched.sim.elastic import ElasticRates, grow_placement, shrink_placement
from hsched.sim.fabric import SimFabric
from hsched.sim.knowledge import Learner, Predictor
from hsched.sim.live import LiveInput, LiveRounds
from hsched.sim.metrics import JobRecord, SimResult, lower_bounds, summarize
from hsched.sim.service import ServiceModelAware, ServiceSim
from hsched.sim.slurm import Alloc, SlurmPoolSpec, SlurmQueue
from hsched.sim.trace import Trace, TraceJob, too_long

LIVE_PASSES = 8
"""Live rounds at one instant at most: a QoS preemption stops its victims and the job that asked starts on their
devices in the next round (as live), which runs at once; a bound, so a round that preempts for ever cannot stall."""


@dataclass(frozen=True, slots=True)
class SimCosts:
    """Settable costs. All neutral by default, for like-for-like comparisons with published simulators.

    checkpoint_s: seconds a preempted or moved job holds its new GPUs without progress when it resumes
        (checkpoint plus restore).
    span_factor: throughput multiplier for a gang spread over servers, on top of the table's own
        "unconsolidated" rate where it has one.
    pcie_factor: throughput multiplier for a multi-GPU gang on a server whose GPUs lack NVLink.
    """

    checkpoint_s: float = 0.0
    span_factor: float = 1.0
    pcie_factor: float = 1.0
    fabric: SimFabric | None = None
    """The network between servers (hsched.sim.fabric): a gang spanning them runs at its `speed`; None: no network
    modelled (the default figures)."""


def default_rule(settings: Settings | None = None, *, time_sharing: bool = True) -> PreemptRule:
    """The live controller's preemption rule: its settings' QoS table (by default, the default settings')."""
    return PreemptRule.from_qos((settings or Settings()).qos, time_sharing=time_sharing)


@dataclass(frozen=True, slots=True)
class SimConfig:
    round_s: float = 360.0
    costs: SimCosts = field(default_factory=SimCosts)
    max_time_s: float | None = None
    """Stop the clock here (jobs still active are reported unfinished)."""
    preempt: PreemptRule = field(default_factory=default_rule)
    """Who may stop whom: the live controller's rule and, by default, its default QoS table."""
    round_mode: str = "event"
    """"event": a round on arrivals and completions (and every round_s for time-sharing), as the controller
    does. "gavel": rounds only every round_s (and when an idle cluster sees an arrival), as Gavel's simulator:
    a job waits for the next boundary and GPUs freed mid-round stay idle until it. The policies that have a
    Gavel counterpart are replayed by `hsched.sim.gavel` instead; this mode gives every other policy Gavel's
    timing, so a gap can be split into timing and allocation. "live": the event mode's timing, but each round is the
    live controller's own pipeline (hsched.sched.pipeline.schedule, via hsched.sim.live) over the simulated servers
    as nodes: caps, constraints, shared GPUs, the reservation and moves as they run live (`live` gives the labels and
    caps); the quantum's time-sharing is not the live round's, so none."""
    live: LiveInput | None = None
    """With round_mode "live": node labels, QoS caps and move_min_run_s (hsched.sim.live.LiveInput); None: none."""
    learned: bool = False
    """The policy's throughput model is learned as the trace unfolds (hsched.sim.knowledge.Learner), starting
    from `prior` alone, instead of being the trace's table. Jobs still progress at the table's (true) rates."""
    prior: Mapping[str, float] | None = None
    """With `learned`: relative speed per GPU type to start from (default: the accelerator table's)."""
    refine_prior: bool = False
    """With `learned`: re-estimate the prior's GPU-type speeds from the measured ones (knowledge.measured_prior);
    False, the prior stays the accelerator table's, as in the live controller."""
    predict: bool = False
    """Policies that need durations get predictions from the jobs completed so far (hsched.sim.knowledge
    .Predictor): clairvoyant policies' remaining times, and every view's time limit (backfill's estimate)."""
    data: DataModel | None = None
    """Jobs read datasets that live on servers (hsched.sim.data): a start where the data is not pays its copy."""
    locality: Locality = Locality.AWARE
    """With `data`: AWARE places jobs by their data (and may wait for a busy holder), IGNORE places as without
    data. A holder's free time is predicted from the running jobs' true ends, or with `predict` as predicted."""
    prefetch_s: float | None = None
    """With `data`: after each round, copy data ahead to where the first waiting jobs are predicted to start within
    this horizon (seconds, plus the copy's time), as the live controller's prefetch (settings prefetch_horizon_s;
    hsched.sim.data.prefetch_copies). None: no prefetch."""
    shares: Mapping[str, float] = field(default_factory=dict)
    """Fair share between the trace's users (its user column): user -> shares (`hsched sim --shares alice=2,bob=1`);
    a user not named holds 1."""
    progress_totals: bool = True
    """The trace's jobs report their progress with a total (Gavel's run a fixed number of steps; a live job does with
    `hsched.progress.report(step=..., total=...)`): once a job has run, the policy is told its remaining time, the
    work left over the speed it last ran at (`PolicyInput.forecast_s`, as the live controller predicts it from such
    reports). False: no job reports a total; nothing is known of remaining time."""
    slurm_pool: SlurmPoolSpec | None = None
    """One more server, a Slurm-backed pool (hsched.sim.slurm): the round hands jobs over to it, and Slurm's FIFO
    with EASY backfill starts them there, after the pool's submit latency; they run there to their end."""
    elastic: float | None = None
    """`--elastic F`: every job that checkpoints is elastic between 1 GPU and F times its trace size, resized around
    each round by hsched.sched.elastic.plan_resizes (hsched.sim.elastic: per-size throughputs, devices); a resize
    costs the checkpoint cost, as a move. None: every job keeps its trace size."""


class _ProgressLeft(Mapping[int, float]):
    """`PolicyInput.forecast_s` of a round at time `t`: each job that ran's work left over its fastest rate, worked
    out when the policy asks for it, not for every active job every round (a policy reads it for the jobs whose
    key changed: the running ones, mostly; at 100,000 jobs the whole dictionary was 10 % of the replay). The jobs
    do not change during a round, so a value read is the one the dictionary held; a round's input does not
    outlive the round."""

    __slots__ = ("_active", "_t")

    def __init__(self, active: Mapping[int, _Job], t: float) -> None:
        self._active = active
        self._t = t

    def get(self, jid: int, default: float | None = None) -> float | None:  # type: ignore[override]
        j = self._active.get(jid)
        left = None if j is None else _left_s(j, self._t)
        return default if left is None else left

    def __getitem__(self, jid: int) -> float:
        v = self.get(jid)
        if v is None:
            raise KeyError(jid)
        return v

    def __iter__(self) -> Iterator[int]:
        return (jid for jid, j in self._active.items() if j.rate > 0 or j.last_rate > 0)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __bool__(self) -> bool:
        return True  # (an empty one answers as {} does: `build_input`'s `forecast_s or {}` need not count it)


def _left_s(j: _Job, t: float) -> float | None:
    """A job's work left at `t` as its progress reports it, in seconds on its fastest type; None for a job that has
    not run (no rate, now or last): `PolicyInput.forecast_s`'s figure, lazily (`_ProgressLeft`) or as a dict."""
    if not (j.rate > 0 or j.last_rate > 0):
        return None
    b = j.busy_until
    return (j.remaining - (j.rate * (t - b) if t > b else 0.0)) / j.fastest_rate


class _LeftNow(dict[int, float]):
    """The simulator's forecasts as a dict (`eager_left`), true even when empty, as `_ProgressLeft` is: a policy that
    asks whether any job has one (`assign_types`) is answered alike."""

    __slots__ = ()

    def __bool__(self) -> bool:
        return True


class _Job:
    """Mutable simulator-side state of one job (never handed to a policy)."""

    __slots__ = (
        "allowed", "arrived", "base_tj", "busy_until", "copy_s", "end", "fastest_rate", "finish_at", "first_start",
        "gpu_type", "in_pool", "klass", "last_rate", "last_type", "measured", "migrations", "overhead_s", "placement",
        "pool_overhead", "pool_wait_s", "predicted", "rate", "rel", "remaining", "resizes", "restarts", "run_buf",
        "run_head", "run_s", "run_start", "run_tail", "service_s", "span_servers", "tj", "version", "view",
    )

    def __init__(self, tj: TraceJob, fastest_rate: float) -> None:
        self.tj = tj
        self.base_tj = tj  # elastic: the job at its trace size (tj: at its current size)
        self.resizes = 0
        self.remaining = tj.work
        self.fastest_rate = fastest_rate
        self.gpu_type: str | None = None
        self.last_type = ""
        self.placement: tuple[Placement, ...] = ()
        self.rate = 0.0
        self.last_rate = 0.0  # the rate of its last run, after it stopped: what its progress reports measured
        self.rel = 0.0  # rate / fastest_rate on the current placement
        self.run_start = 0.0
        self.busy_until = 0.0
        self.finish_at = math.inf
        self.first_start: float | None = None
        self.end: float | None = None
        self.run_s = 0.0
        self.service_s = 0.0
        self.restarts = 0
        self.migrations = 0
        self.overhead_s = 0.0
        self.copy_s = 0.0  # seconds held waiting for data copies, over all starts
        self.in_pool = False  # its current (or last) run was handed over to the Slurm pool
        self.pool_overhead = 0.0  # the restore its Slurm start still owes
        self.pool_wait_s = 0.0  # from hand-over to Slurm's start, over all its runs there
        self.span_servers = 0
        self.version = 0
        self.arrived = 0.0  # integral of active-job count at arrival (for the FTF metric)
        self.view: JobView | None = None
        # a running job's view is run_head + (run_s, service_s) + run_tail: only the middle moves with time
        self.run_head: tuple[object, ...] = ()
        self.run_tail: tuple[object, ...] = ()
        self.run_buf: list[object] | None = None  # run_head, its two figures, run_tail: made at its first round
        # learned mode: the GPU types the job can run on when not all (the view's gpu_types: the table's truth
        # that a job cannot run somewhere is a fact of the fleet, not a speed to learn), the current stint's
        # placement class, and whether its speed has joined the learned table
        self.allowed: tuple[str, ...] = ()
        self.klass = PlacementClass.SINGLE
        self.measured = True
        self.predicted: float | None = None  # predict mode: expected running time at its first start


class Simulator:
    """Replays a trace on a set of servers under one policy.

    Args:
        trace: jobs and the throughput model.
        servers: the simulated fleet (`parse_cluster`).
        policy: from `make_policy`.
        config: round length and costs.
        placer: device chooser; default consolidating best fit.
        progress: called now and then with (jobs finished, jobs total) for a progress bar.
        service: an inference service beside the trace (hsched.sim.service): its replicas are jobs of its class
            that it adds and removes at its ticks; its figures are in the summary's `service` entry.
    """

    def __init__(
        self,
        trace: Trace,
        servers: tuple[ServerView, ...],
        policy: AnyPolicy,
        config: SimConfig | None = None,
        placer: Placer | None = None,
        progress: Callable[[int, int], None] | None = None,
        service: ServiceSim | None = None,
    ) -> None:
        self.trace = trace
        self.config = config or SimConfig()
        self.service = service
        if service is not None:
            cfg0 = self.config
            if cfg0.round_mode != "event" or cfg0.learned or cfg0.data is not None or cfg0.slurm_pool is not None:
                raise ValueError("an inference service is simulated with the event round mode, without --learned, "
                                 "--data-model or --slurm-pool (not modelled together yet)")
        pool = self.config.slurm_pool
        if pool is not None:
            if any(s.name == pool.name for s in servers):
                raise ValueError(f"a server is named {pool.name!r}, the Slurm pool's name")
            if self.config.data is not None:
                raise ValueError("the Slurm pool does not model data locality yet: give data or a pool, not both")
            servers = (*servers, pool.server())
        self.servers = servers
        self.policy = policy
        self.placer = placer
        self.progress = progress
        self.model = trace.throughput if service is None else ServiceModelAware(trace.throughput)
        self.capacity: dict[str, int] = {}
        for s in servers:
            self.capacity[s.gpu_type] = self.capacity.get(s.gpu_type, 0) + len(s.devices)
        self.total_gpus = sum(self.capacity.values())
        self.server_link = {s.name: s.link for s in servers}
        self.types = self.model.order_types(self.capacity)
        self.learner: Learner | None = None
        """With SimConfig.learned: what the policy learnt (its table and model), after `run`."""
        self.predictor: Predictor | None = None
        self.data: DataState | None = None
        """With SimConfig.data: the copies made and their counters, after `run`."""
        self.slurm: SlurmQueue | None = None
        """With SimConfig.slurm_pool: Slurm's side of the pool, after `run`."""
        self.live: LiveRounds | None = None
        """With round_mode "live": the live rounds and their log of starts, after `run`."""

    # ------------------------------------------------------------------ feasibility

    def classify(self) -> tuple[list[_Job], list[tuple[TraceJob, str]]]:
        """Split the trace into jobs this fleet can run and jobs it never can (with the reason)."""
        biggest = {t: n for t, n in self.capacity.items()}
        ok: list[_Job] = []
        bad: list[tuple[TraceJob, str]] = []
        for tj in self.trace.jobs:
            rates = [self._best_rate(tj, t) for t in self.types if biggest[t] >= tj.gpus]
            known = [r for r in rates if r]
            if not known:
                if all(self.model.rate(tj.job_type, tj.gpus, t) is None for t in self.types):
                    reason = f"no throughput for ({tj.job_type!r}, {tj.gpus}) on any GPU type"
                else:
                    reason = f"needs {tj.gpus} GPUs of one type; the largest type has {max(biggest.values())}"
                bad.append((tj, reason))
                continue
            too_long(self.trace, tj, max(known))
            ok.append(_Job(tj, max(known)))
        return ok, bad

    def _best_rate(self, tj: TraceJob, gpu_type: str) -> float | None:
        r = self.model.rate(tj.job_type, tj.gpus, gpu_type)
        if r is None:
            return None
        spans = self.model.rate(tj.job_type, tj.gpus, gpu_type, spans=True)
        return max(r, spans or 0.0)

    # ------------------------------------------------------------------ the run

    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        jobs, bad = self.classify()
        cfg = self.config
        arrivals = sorted(jobs, key=lambda j: (j.tj.arrival_s, j.tj.id))
        active: dict[int, _Job] = {}
        running: dict[int, _Job] = {}
        heap: list[tuple[float, int, int]] = []
        done: list[_Job] = []
        now = 0.0
        ai = 0
        last_round = -math.inf
        moves_due = False  # a completion freed GPUs while nobody waited: running jobs may move next round
        unstuck_at = -math.inf  # when holds for jobs waiting for data were dropped to end a stall (once an instant)
        rounds = preemptions = 0
        busy_gpu_s = 0.0
        policy_cache: dict[str, object] = {}  # what the policy keeps between rounds: this run's alone
        # ...and between start-only rounds, apart: their few newcomers on the free servers would replace the last full
        # round's memos (the order's waiting keys, the last assignment and wants), which the next full round then
        # made again for every waiting job (every memo is exact: the same decisions either way)
        starts_cache: dict[str, object] = {}
        lost_gpu_s = 0.0
        held = 0  # GPUs held now
        busy: list[tuple[float, int]] = [(0.0, 0)]  # (time, GPUs held from then on), at each change
        active_integral = 0.0
        usage: dict[str, float] = {}
        ended_runs = [0.0, 0]  # seconds and count of the runs that ended (fair share: `fair`)
        users = {j.tj.user for j in jobs}
        shared_users = len(users) > 1  # (fair share's usage is counted)
        model_rate = self.model.rate
        oracle = self.policy.clairvoyant
        time_sharing = self.policy.time_sharing
        rule = cfg.preempt
        classes = {j.tj.qos for j in jobs}
        svc = self.service
        if svc is not None:
            classes.add(svc.cfg.qos)
        if not any(rule.may_preempt(a, b) for a in classes for b in classes):
            # no class of this trace may preempt another (a one-class trace, as Gavel's are): the round's QoS
            # step could never find a victim, so it is not asked to look, every round
            rule = replace(rule, qos_preempts={})
        preempting = {c for c, victims in rule.qos_preempts.items() if victims}
        total = len(jobs)
        tick = max(1, total // 100)
        # free devices per server, in device order, and each server's view of its free devices (rebuilt when
        # it changes): the input of a start-only round
        free_on = {sv.name: list(sv.devices) for sv in self.servers}
        position = {d: i for sv in self.servers for i, d in enumerate(sv.devices)}
        free_view = {sv.name: sv for sv in self.servers}
        changed: set[str] = set()
        # What the policy knows: by default the trace's table and (clairvoyant policies) true remaining work; with
        # cfg.learned a model learnt from the stints that ran (hsched.sim.knowledge.Learner), with cfg.predict
        # durations predicted from the jobs completed so far. Progress always runs at the table's true rates.
        learner = self.learner = Learner(self.capacity, cfg.prior, cfg.refine_prior) if cfg.learned else None
        predictor = self.predictor = Predictor() if cfg.predict else None
        pmodel = learner.model() if learner is not None else self.model
        maturing: list[tuple[float, int, int]] = []  # (when a stint's speed is measured, job id, its version)
        if learner is not None:
            for job in jobs:
                ok = tuple(t for t in self.types if self._best_rate(job.tj, t))
                if len(ok) < len(self.types):
                    job.allowed = ok
        if cfg.elastic is not None:
            if not 1.0 <= cfg.elastic <= 64.0:
                raise ValueError(f"elastic factor {cfg.elastic!r}: expected 1 to 64 (times each job's trace size)")
            if cfg.round_mode != "event" or cfg.data is not None or cfg.slurm_pool is not None or learner is not None:
                raise ValueError("elastic jobs are simulated in the event round mode, without a data model, a Slurm "
                                 "pool or learned throughputs")
        # The live round mode: the controller's pipeline decides, over the servers as live nodes (hsched.sim.live)
        live: LiveRounds | None = None
        live_allowed: dict[int, tuple[str, ...]] = {}  # job id -> the GPU types its table has a speed for, if not all
        shared_on: dict[str, int] = {}  # live: a shared GPU -> how many jobs run on it
        shared_since: dict[str, float] = {}  # live: a shared GPU -> since when it has had one
        if cfg.round_mode == "live":
            if oracle:
                raise ValueError(f"policy {self.policy.name!r} needs job durations, which the live round does not know")
            if cfg.data is not None or cfg.slurm_pool is not None:
                raise ValueError("the live round mode does not model data locality or a Slurm pool yet")
            live = self.live = LiveRounds(self.servers, cfg.live or LiveInput({}, {}), rule, self.policy.name,
                                          pmodel, cfg.costs.checkpoint_s)
            time_sharing = False  # the live round moves jobs (after move_min_run_s); it has no quantum
            for job in jobs:
                ok = tuple(t for t in self.types if self._best_rate(job.tj, t))
                if len(ok) < len(self.types):
                    live_allowed[job.tj.id] = ok

        totals = cfg.progress_totals and not oracle

        # For a policy that reads every running job's forecast each round (`reads_forecast`: hsched's order and
        # assignment, twice a job), the answers as a dict, read at C speed: a waiting job's, fixed while it waits, set
        # when its pending view is made (`pending_view`: after every stop, before the next full round), a running job's
        # each full round (`progress_left`). The same figures as `_ProgressLeft`'s, which the other policies get.
        eager_left = totals and getattr(self.policy, "reads_forecast", True)  # (a policy not of PolicyHooks: True)
        left_now = _LeftNow()

        def progress_left(t: float) -> Mapping[int, float]:
            """What the jobs that ran have reported (`cfg.progress_totals`): their work left, in seconds on their
            fastest type (`PolicyInput.forecast_s`), read when asked (`_ProgressLeft`), or (`eager_left`) as a dict."""
            if not eager_left:
                return _ProgressLeft(active, t)
            for jid, r in running.items():
                # (`_left_s`, inline: once per running job per round; a running job has a rate, always)
                if r.rate > 0 or r.last_rate > 0:
                    b = r.busy_until
                    left_now[jid] = (r.remaining - (r.rate * (t - b) if t > b else 0.0)) / r.fastest_rate
            return left_now

        def live_decide(t: float) -> tuple[RoundDecision, bool]:
            assert live is not None
            live.throughput = pmodel
            pending = [(j.tj, live_allowed.get(jid, ()), j.restarts) for jid, j in active.items() if j.gpu_type is None]
            ends = {jid: (r.finish_at if predictor is None else t + rest(r, r.run_s + (t - r.run_start)))
                    for jid, r in running.items()}
            attained = {jid: j.run_s for jid, j in active.items() if j.run_s > 0}
            left = {jid: (j.remaining / j.last_rate, j.last_type) for jid, j in active.items()
                    if j.gpu_type is None and j.last_rate > 0} if totals else {}
            return live.decide(t, pending, ends, attained, fair(t), left)

        # Data locality (cfg.data): the copies, and under AWARE a placer that reads them and the running jobs'
        # predicted ends (on_server: per server, running job id -> the GPUs it holds there)
        data = self.data = DataState(cfg.data) if cfg.data is not None else None
        on_server: dict[str, dict[int, int]] = {sv.name: {} for sv in self.servers}
        placer: Placer | None = self.placer
        aware: LocalityPlacer | None = None
        if data is not None:

            def free_in(server: str, gpus: int, free_now: int) -> float | None:
                """When `server` is predicted to have `gpus` free: its running jobs' ends, soonest first (their
                true ends, the oracle's knowledge as the throughput table is; with cfg.predict, predicted)."""
                need = gpus - free_now
                if need <= 0:
                    return 0.0
                ends: list[tuple[float, int]] = []
                for jid, n in on_server[server].items():
                    r = running[jid]
                    end = r.finish_at if predictor is None else now + rest(r, r.run_s + (now - r.run_start))
                    ends.append((end, n))
                ends.sort()
                for end, n in ends:
                    need -= n
                    if need <= 0:
                        return max(0.0, end - now)
                return None

        if data is not None and cfg.locality is Locality.AWARE:
            placer = aware = LocalityPlacer(data, self.servers, free_in, lambda name: len(free_on[name]), lambda: now,
                                            self.placer or PackingPlacer())

        # Prefetch (cfg.prefetch_s): the jobs in the live queue order, running ones too (they may wait again),
        # finished ones dropped as met. Kept sorted as jobs arrive, so that a round reads the running jobs ahead and
        # the first waiting ones (PREFETCH_LOOKAHEAD at most), not the whole queue.
        prefetching = data is not None and cfg.prefetch_s is not None
        queue_order: list[tuple[tuple[int, int, float, int], Waiting]] = []
        capacity = {sv.name: len(sv.devices) for sv in self.servers}

        def enqueue(j: _Job) -> None:
            tj = j.tj
            assert data is not None
            names = tuple(sv.name for sv in self.servers
                          if len(sv.devices) >= tj.gpus and self.model.rate(tj.job_type, tj.gpus, sv.gpu_type))
            bisect.insort(queue_order, ((qos_rank(tj.qos), -tj.priority, tj.arrival_s, tj.id),
                                        Waiting(tj.id, tj.gpus, names)))

        def prefetch(t: float) -> None:
            """After a round: start the copies the live rule asks for (all at once, in the background)."""
            if data is None or cfg.prefetch_s is None:
                return
            first: list[Waiting] = []
            gone: list[int] = []
            for i, (_key, w) in enumerate(queue_order):
                j = active.get(w.job_id)
                if j is None:
                    gone.append(i)
                elif j.gpu_type is None:
                    first.append(w)
                    if len(first) == PREFETCH_LOOKAHEAD:
                        break
            for i in reversed(gone):
                del queue_order[i]
            known: dict[tuple[str, int], float | None] = {}

            def soonest(name: str, gpus: int) -> float | None:
                key = (name, gpus)
                if key not in known:
                    known[key] = free_in(name, gpus, len(free_on[name])) if gpus <= capacity[name] else None
                return known[key]

            for _jid, name, ds in prefetch_copies(data, first, soonest, t, cfg.prefetch_s):
                data.prefetch(ds, name, t)

        def data_round(decision: RoundDecision, inp: PolicyInput, servers: tuple[ServerView, ...],
                       remaining: dict[int, float] | None) -> RoundDecision:
            """Under AWARE, a job that chose to wait for a busy holder of its data takes no part in the round: the
            round runs again without it (until nobody new chooses to wait), so the GPUs the policy counted for it go
            to the jobs behind it, as the live round's devices stay free for the next jobs when `take` refuses a
            start for its data. (Without this, a waiting job kept its share of GPUs idle every round it waited.)"""
            if aware is None:
                return decision
            out: set[int] = set()
            while aware.round_waiters - out:
                out |= aware.round_waiters
                aware.round_waiters.clear()
                inp = replace(inp, jobs=tuple(v for v in inp.jobs if v.id not in out))
                decision = schedule_round(self.policy, inp, servers, remaining_s=remaining, placer=placer, rule=rule,
                                          reasons=False)
            return decision

        # The Slurm pool (cfg.slurm_pool): Slurm's side of it; the round sees it as one more server
        pool = cfg.slurm_pool
        slurm = self.slurm = SlurmQueue(pool) if pool is not None else None

        def slurm_started(j: _Job, alloc: Alloc, t: float) -> None:
            """Slurm starts a job handed over: it progresses from now (after its restore), on Slurm's nodes."""
            if len(alloc) > 1:  # a gang over Slurm nodes runs at the table's spanning rate
                spanning = self.model.rate(j.tj.job_type, j.tj.gpus, j.gpu_type or "", spans=True)
                if spanning:
                    j.rate = spanning * cfg.costs.span_factor
                    if learner is None:
                        j.rel = j.rate / j.fastest_rate
            j.pool_wait_s += t - j.run_start
            j.busy_until = t + j.pool_overhead
            j.finish_at = j.busy_until + j.remaining / j.rate
            j.version += 1
            heapq.heappush(heap, (j.finish_at, j.tj.id, j.version))

        def pool_tick(t: float) -> None:
            assert slurm is not None
            for jid, alloc in slurm.schedule(t):
                slurm_started(running[jid], alloc, t)

        def measure(j: _Job, t: float) -> None:
            """The stint's speed joins the learned table: the live controller's measure of a run is its steps
            between its first and last progress reports, which a restore (busy_until) precedes; here the rate
            is constant over a stint, so that measure is the true rate of the placement."""
            assert learner is not None and j.gpu_type is not None
            learner.observe(j.tj.job_type, j.gpu_type, j.tj.gpus, j.klass, j.rate, t)
            j.measured = True

        def learn(t: float) -> None:
            """Before a round: the stints that have run long enough are measured, and the policy's model is
            rebuilt if anything was learned since the last round (never more than once a round)."""
            nonlocal pmodel
            assert learner is not None
            while maturing and maturing[0][0] <= t + 1e-9:
                _, jid, ver = heapq.heappop(maturing)
                j = running.get(jid)
                if j is not None and j.version == ver and not j.measured:
                    measure(j, t)
            pmodel = learner.model()

        def rest(j: _Job, elapsed: float) -> float:
            """Predict mode: the running time still expected of `j` after `elapsed` seconds of it."""
            assert predictor is not None
            return predictor.remaining(elapsed, predictor.expected(j.tj.job_type, j.tj.user))

        def capped(j: _Job, estimate: float) -> float:
            limit = j.tj.time_limit_s
            return estimate if limit is None else min(estimate, limit)

        def stop(j: _Job, t: float) -> None:
            nonlocal busy_gpu_s, held
            # (`x if x > 0.0 else 0.0` is max(0.0, x), NaN and -0.0 included, without a call: stop runs once per stop)
            b = j.busy_until
            progressed = t - b if t > b else 0.0
            if not j.measured and progressed >= MIN_WINDOW_S:
                measure(j, t)  # a stint that ended (moved, preempted, done) before a round measured it
            left = j.remaining - j.rate * progressed
            j.remaining = left if left > 0.0 else 0.0
            j.service_s += j.rel * progressed
            run = t - j.run_start
            j.run_s += run
            if j.tj.shared and live is not None:
                for p in j.placement:
                    for u in p.devices:  # a shared GPU is busy while any of its jobs runs: counted once
                        shared_on[u] -= 1
                        if not shared_on[u]:
                            del shared_on[u]
                            busy_gpu_s += t - shared_since.pop(u)
                            held -= 1
            else:
                busy_gpu_s += run * j.tj.gpus
                held -= j.tj.gpus
            if j.in_pool:
                assert slurm is not None
                slurm.cancel(j.tj.id)
            if data is not None:
                for p in j.placement:
                    del on_server[p.node][j.tj.id]
                ds = data.dataset(j.tj.id)
                if ds is not None:
                    data.release(ds, [p.node for p in j.placement], t)
            if shared_users:
                usage[j.tj.user] = usage.get(j.tj.user, 0.0) + run * j.tj.gpus
                ended_runs[0] += run  # (their typical length: what fair share counts a start as)
                ended_runs[1] += 1
            for p in j.placement:
                free = free_on[p.node]  # (kept in device order: each device back in its place)
                for u in p.devices:
                    if u not in shared_on:  # (a shared GPU frees with its last job)
                        bisect.insort(free, u, key=position.__getitem__)
                changed.add(p.node)
            j.version += 1
            j.last_rate = j.rate
            j.gpu_type, j.placement, j.rate, j.rel, j.finish_at = None, (), 0.0, 0.0, math.inf
            j.view = None
            del running[j.tj.id]
            if live is not None:
                live.stopped(j.tj.id)

        def began(j: _Job, t: float) -> None:
            """A (re)start's bookkeeping, `start`'s and `start_plain`'s: its first start (and its predicted figure
            then), and a new version, which leaves its ends in the heap and its view stale."""
            if j.first_start is None:
                j.first_start = t
                if predictor is not None:
                    j.predicted = predictor.expected(j.tj.job_type, j.tj.user)
            j.version += 1
            j.view = None

        def start(j: _Job, s: Start, t: float, recharge: bool = True) -> None:
            nonlocal lost_gpu_s, held
            spans = len(s.placement) > 1  # (`Start.spans`, without its call)
            if erates is not None:
                # elastic: the job runs at the size of its placement (a resize, or a move at its current size)
                size = sum(len(p.devices) for p in s.placement)
                if size != j.tj.gpus:
                    j.tj = replace(j.base_tj, gpus=size)
                rate = erates.rate(j.tj.job_type, size, s.gpu_type, j.base_tj.gpus, spans=spans)
            else:
                rate = model_rate(j.tj.job_type, j.tj.gpus, s.gpu_type, spans)
            tj = j.tj  # (after an elastic resize: the job at its new size)
            if not rate:
                raise RuntimeError(f"policy put job {tj.id} on {s.gpu_type}, where it cannot run")
            costs = cfg.costs
            if spans:
                rate *= costs.span_factor
                if costs.fabric is not None:
                    rate *= costs.fabric.speed([p.node for p in s.placement])
            if tj.gpus > 1 and any(self.server_link.get(p.node) == "pcie" for p in s.placement):
                rate *= costs.pcie_factor
            # a job that starts over restores nothing
            overhead = costs.checkpoint_s if j.run_s > 0 and tj.checkpointable else 0.0
            if recharge:  # (not again for a job resized at the instant it was restored: one restore, counted once)
                j.overhead_s += overhead
                lost_gpu_s += overhead * tj.gpus
            copy = 0.0  # the data is copied before the checkpoint is restored: the two add up
            if data is not None:
                for p in s.placement:
                    on_server[p.node][tj.id] = len(p.devices)
                ds = data.dataset(tj.id)
                if aware is not None:
                    aware.started(tj.id, [p.node for p in s.placement], t)
                if ds is not None:
                    copy = data.acquire(ds, [p.node for p in s.placement], tj.gpus, t)
                    j.copy_s += copy
            j.gpu_type, j.placement, j.rate, j.rel = s.gpu_type, s.placement, rate, rate / (
                j.fastest_rate if tj is j.base_tj else elastic_fastest(j))
            j.span_servers = len(s.placement)
            j.last_type = s.gpu_type
            j.run_start = t
            j.busy_until = t + copy + overhead
            j.finish_at = j.busy_until + j.remaining / rate
            began(j, t)
            if learner is not None:
                link = any(self.server_link.get(p.node) == "pcie" for p in s.placement)
                j.klass = (PlacementClass.SPANNING if spans else PlacementClass.SINGLE if tj.gpus == 1
                           else PlacementClass.PCIE if link else PlacementClass.NVLINK)
                j.measured = False
                heapq.heappush(maturing, (j.busy_until + MIN_WINDOW_S, tj.id, j.version))
                # normalised service as the policy can count it: by its own model's speeds, not the table's
                mine = pmodel.rate(tj.job_type, tj.gpus, s.gpu_type, spans=spans) or 0.0
                best = pmodel.fastest_rate(tj.job_type, tj.gpus, self.types)
                j.rel = mine / best if best else 0.0
            j.run_head = (tj.id, tj.job_type, tj.gpus, tj.arrival_s, JobPhase.RUNNING, tj.qos, tj.priority,
                          tj.user, j.gpu_type, j.placement, t)
            j.run_tail = (j.restarts, tj.time_limit_s, tj.max_servers, j.allowed, tj.checkpointable)
            j.run_buf = None
            j.in_pool = pool is not None and s.placement[0].node == pool.name
            if j.in_pool:
                # handed over: Slurm's queue has it after the submit latency and starts it when its backfill says
                # (slurm_started); until then it holds its GPUs in hsched's count and makes no progress. Slurm
                # estimates its run by its time limit, else by its true running time there.
                assert slurm is not None and pool is not None
                estimate = tj.time_limit_s if tj.time_limit_s is not None else overhead + j.remaining / rate
                slurm.submit(tj.id, tj.gpus, t + pool.queue_wait_s, estimate)
                j.pool_overhead = overhead
                j.busy_until = j.finish_at = math.inf
                # hsched does not time-share a job it handed over (a new sbatch would queue again): pinned
                j.run_tail = (*j.run_tail[:4], False)
            for p in s.placement:
                free = free_on[p.node]
                for d in p.devices:
                    if d in free:  # (a shared GPU another shared job holds is not in the list)
                        free.remove(d)
                changed.add(p.node)
            if tj.shared and live is not None:
                for p in s.placement:
                    for u in p.devices:
                        if u not in shared_on:
                            shared_on[u] = 0
                            shared_since[u] = t
                            held += 1
                        shared_on[u] += 1
            else:
                held += tj.gpus
            running[tj.id] = j
            if live is not None:
                live.started(tj, live_allowed.get(tj.id, ()), j.restarts, s.placement, t)
            if not j.in_pool:
                heapq.heappush(heap, (j.finish_at, tj.id, j.version))

        # `stop` and `start` of a replay without the modes that add to them (elastic sizes, data, a learned model, a
        # Slurm pool, the live round, a fabric; `plain` below): the same steps, the others' left out, once per stop
        # and start (ed69ec 8:8:8 las-hetero moves 5.6 jobs a round)
        span_factor, pcie_factor, checkpoint_s = cfg.costs.span_factor, cfg.costs.pcie_factor, cfg.costs.checkpoint_s
        server_link = self.server_link
        running_phase = JobPhase.RUNNING
        heappush = heapq.heappush
        insort = bisect.insort
        device_at = position.__getitem__

        def stop_plain(j: _Job, t: float) -> None:
            nonlocal busy_gpu_s, held
            b = j.busy_until
            progressed = t - b if t > b else 0.0
            left = j.remaining - j.rate * progressed
            j.remaining = left if left > 0.0 else 0.0
            j.service_s += j.rel * progressed
            run = t - j.run_start
            j.run_s += run
            tj = j.tj
            gpus = tj.gpus
            busy_gpu_s += run * gpus
            held -= gpus
            if shared_users:
                usage[tj.user] = usage.get(tj.user, 0.0) + run * gpus
                ended_runs[0] += run
                ended_runs[1] += 1
            for p in j.placement:
                free = free_on[p.node]
                for u in p.devices:
                    insort(free, u, key=device_at)
                changed.add(p.node)
            j.version += 1
            j.last_rate = j.rate
            j.gpu_type, j.placement, j.rate, j.rel, j.finish_at = None, (), 0.0, 0.0, math.inf
            j.view = None
            del running[tj.id]

        def start_plain(j: _Job, s: Start, t: float) -> None:
            nonlocal lost_gpu_s, held
            tj = j.tj
            placement, gpu_type = s.placement, s.gpu_type
            spans = len(placement) > 1
            rate = model_rate(tj.job_type, tj.gpus, gpu_type, spans)
            if not rate:
                raise RuntimeError(f"policy put job {tj.id} on {gpu_type}, where it cannot run")
            gpus = tj.gpus
            if spans:
                rate *= span_factor
            if gpus > 1 and any(server_link.get(p.node) == "pcie" for p in placement):
                rate *= pcie_factor
            overhead = checkpoint_s if j.run_s > 0 and tj.checkpointable else 0.0
            if overhead:  # (adding 0.0 changes neither sum)
                j.overhead_s += overhead
                lost_gpu_s += overhead * gpus
            j.gpu_type, j.placement, j.rate, j.rel = gpu_type, placement, rate, rate / j.fastest_rate
            j.span_servers = len(placement)
            j.last_type = gpu_type
            j.run_start = t
            busy = j.busy_until = t + overhead
            j.finish_at = finish = busy + j.remaining / rate
            began(j, t)
            j.run_head = (tj.id, tj.job_type, gpus, tj.arrival_s, running_phase, tj.qos, tj.priority, tj.user,
                          gpu_type, placement, t)
            j.run_tail = (j.restarts, tj.time_limit_s, tj.max_servers, j.allowed, tj.checkpointable)
            j.run_buf = None
            j.in_pool = False
            for p in placement:
                free = free_on[p.node]
                for d in p.devices:
                    if d in free:
                        free.remove(d)
                changed.add(p.node)
            held += gpus
            running[tj.id] = j
            heappush(heap, (finish, tj.id, j.version))

        def fair(t: float) -> Mapping[str, float] | None:
            """Fair share's usage now: ended runs', and the running jobs' so far (as the live ledger counts)."""
            if len(users) < 2:
                return None
            return shared_usage(usage, cfg.shares, users, ((r.tj.user, r.tj.gpus * (t - r.run_start))
                                                          for r in running.values()),
                                hold_s=ended_runs[0] / ended_runs[1] if ended_runs[1] else 0.0)

        # ---- elastic jobs (cfg.elastic): the core's grow/shrink plan around each round, applied at once
        # (by_left: the policy ranks waiting jobs by remaining time, hsched's with progress totals; others, such as
        # las-hetero, re-sort by attained service every round, and unlimited shrinks for that order churned:
        # las-hetero elastic on 0e4a51 3,738,041 s avg JCT against 2,121,328 s rigid)
        by_left = totals and self.policy.name == "hsched"
        erates = ElasticRates(self.model, cfg.elastic) if cfg.elastic is not None else None
        resizes = {Direction.GROW: 0, Direction.SHRINK: 0}
        pools_of: dict[int, tuple[str, ...]] = {}  # job id -> the GPU types it can start on at its trace size
        fastest_at: dict[tuple[str, int, int], float] = {}

        def elastic_fastest(j: _Job) -> float:
            """A resized job's fastest rate at its current size over the fleet's types (its normalised service)."""
            assert erates is not None
            key = (j.tj.job_type, j.tj.gpus, j.base_tj.gpus)
            if key not in fastest_at:
                fastest_at[key] = max((erates.rate(key[0], key[1], t, key[2]) or 0.0 for t in self.types),
                                      default=0.0) or j.fastest_rate
            return fastest_at[key]

        def resize(t: float, pending: list[_Job] | None = None, grow: bool = True) -> None:
            """Ask hsched.sched.elastic.plan_resizes about the running jobs, the free GPUs of each GPU type and the
            waiting jobs (`pending`, else every job not running) in hsched's order (`by_left`), else by least attained
            service, and apply its
            resizes (shrinks first: grows may take what they free): each a stop and a start at the new size, which
            pays the checkpoint cost as a move does.

            A job grows on its own server alone (`grow_room`: the GPUs free there), because a gang spread over servers
            runs at the table's much lower unconsolidated rate; a shrink keeps its devices on the servers where it
            has most. (Pools by server instead, so that a waiting job counts only where it fits whole, lost: 1.85 M s
            avg JCT on 0e4a51 against 1.64 M s with the rule's threshold at 1/2, fewer shrinks letting waiting jobs
            start; docs/scheduling.md.)"""
            assert erates is not None
            free: dict[str, int] = {}
            for sv in self.servers:
                if pool is None or sv.name != pool.name:
                    free[sv.gpu_type] = free.get(sv.gpu_type, 0) + len(free_on[sv.name])
            waiting_jobs = pending if pending is not None else [w for w in active.values() if w.gpu_type is None]
            # by_left: in hsched's order (hsched.sched.policies.keys `work`): GPUs times the remaining time its
            # progress reported (`cfg.progress_totals`: work left over its fastest rate, as `progress_left`), else the
            # service it attained. (By attained service alone, as before remaining times: 750,373 s avg JCT on
            # 0e4a51 against 709,003 s; docs/scheduling.md.)
            waiting_jobs.sort(key=lambda w: (qos_rank(w.tj.qos), -w.tj.priority, w.tj.gpus * (
                w.remaining / w.fastest_rate if by_left and w.last_rate > 0 else w.service_s), w.tj.arrival_s, w.tj.id))
            waiting = []
            for w in waiting_jobs:
                if w.tj.id not in pools_of:
                    pools_of[w.tj.id] = tuple(x for x in self.types if self.capacity[x] >= w.base_tj.gpus
                                              and self._best_rate(w.base_tj, x))
                waiting.append(ElasticWaiting(w.tj.id, w.tj.gpus, pools_of[w.tj.id], w.tj.user))
            ejobs = [ElasticJob(r.tj.id, r.tj.gpus, 1, erates.max_size(r.base_tj.gpus),
                                erates.rates(r.tj.job_type, r.gpu_type, r.base_tj.gpus), r.run_s + (t - r.run_start),
                                cfg.costs.checkpoint_s, r.tj.checkpointable, pool=r.gpu_type, user=r.tj.user,
                                base_size=r.base_tj.gpus, grow_room=len(free_on[home(r)]))
                     for r in running.values() if r.gpu_type is not None and not r.in_pool]
            share: dict[str, float] | None = None
            holding: dict[str, int] | None = None
            if len(users) > 1:
                share = fair_gpus(fair(t) or {}, self.total_gpus)
                holding = {}
                for r in running.values():
                    holding[r.tj.user] = holding.get(r.tj.user, 0) + r.tj.gpus
            # shrinks below the asked size: with remaining times, down to MIN whenever a waiting job needs the GPUs
            # (the waiting jobs come in remaining-time order; 0e4a51: 709,003 s avg JCT at the rule's default
            # threshold, 634,232 s at 1.5, 628,163 s at 2, 619,849 s unlimited; seed 1 alike; docs/scheduling.md)
            plan = plan_resizes(ejobs, free, waiting, round_s=cfg.round_s, fair=share, held=holding, grow=grow,
                                shrink_loss=math.inf if by_left else 1.0)
            for rz in sorted(plan, key=lambda z: (z.direction is Direction.GROW, z.job_id)):
                j = running[rz.job_id]
                gpu_type = j.gpu_type
                assert gpu_type is not None
                if rz.direction is Direction.SHRINK:
                    placement: tuple[Placement, ...] | None = shrink_placement(j.placement, rz.new)
                else:
                    placement = grow_placement(j.placement, rz.new - rz.old, gpu_type,
                                               [sv for sv in self.servers if sv.name == home(j)], free_on)
                if placement is None:
                    continue
                again = j.run_start == t and j.run_s > 0  # restored at this instant: still the one restore
                since = j.run_head[10]
                stop(j, t)
                # the same attained GPU-seconds (gpus x normalised seconds, what least-attained-service orders by) at
                # the new size: a shrunk job must not look barely served, nor a grown one served twice
                j.service_s *= rz.old / rz.new
                j.resizes += 1
                resizes[rz.direction] += 1
                start(j, Start(j.tj.id, gpu_type, placement), t, recharge=not again)
                # the policy sees the run as it was: a resize is no fresh start, which would renew its quantum
                j.run_head = (*j.run_head[:10], since)
                j.run_buf = None

        def home(j: _Job) -> str:
            """The server a running job has most of its devices on: where it grows."""
            return max(j.placement, key=lambda p: (len(p.devices), p.node)).node

        def pending_view(j: _Job) -> JobView:
            """Built once per wait: a pending job's view does not change while it waits."""
            tj = j.tj
            limit = tj.time_limit_s if predictor is None else capped(j, rest(j, j.run_s))
            # (every field in order: the tuple made directly, not by the NamedTuple's generated __new__; once a stop)
            j.view = tuple.__new__(JobView, (tj.id, tj.job_type, tj.gpus, tj.arrival_s, JobPhase.PENDING, tj.qos,
                                             tj.priority, tj.user, None, (), None, j.run_s, j.service_s, j.restarts,
                                             limit, tj.max_servers, j.allowed, tj.checkpointable))
            if eager_left:
                # its forecast while it waits (fixed: a job that does not run makes no progress)
                left = _left_s(j, now)
                if left is not None:
                    left_now[tj.id] = left
                else:
                    left_now.pop(tj.id, None)
            return j.view

        def predicted_view(j: _Job, t: float) -> JobView:
            """Predict mode: a job's view whose time limit is its predicted running time (backfill's estimate;
            for a running job, the current run's so far plus what is still expected of it)."""
            if j.gpu_type is None:
                v = j.view
                if v is None or v.time_limit_s != capped(j, rest(j, j.run_s)):
                    v = pending_view(j)  # a completion changed its prediction
                return v
            ran = t - j.run_start
            limit = capped(j, ran + rest(j, j.run_s + ran))
            return new_view(JobView, (*j.run_head, j.run_s + ran, j.service_s + j.rel * max(0.0, t - j.busy_until),
                                      j.restarts, limit, *j.run_tail[2:]))

        def note_busy(t: float) -> None:
            if busy[-1][1] == held:
                return
            if busy[-1][0] == t:  # several changes at one instant: keep the last
                busy.pop()
                if busy and busy[-1][1] == held:
                    return
            busy.append((t, held))

        def free_servers() -> tuple[ServerView, ...]:
            for name in changed:
                sv = free_view[name]
                free_view[name] = ServerView(name, sv.gpu_type, tuple(free_on[name]), sv.link)
            changed.clear()
            return tuple(sv for sv in free_view.values() if sv.devices)

        def apply(decision: RoundDecision, t: float) -> None:
            """A round's decision: its stops first, then its starts (a running job's is a move)."""
            nonlocal preemptions, lost_gpu_s
            for jid in decision.preempt:
                j = active[jid]
                if j.gpu_type is not None:
                    run_start = j.run_start
                    halt(j, t)
                    j.restarts += 1
                    preemptions += 1
                    if not j.tj.checkpointable:
                        # only a QoS preemption stops such a job: it starts over, and its run is lost
                        lost_gpu_s += (t - run_start) * j.tj.gpus
                        j.remaining = j.tj.work
                    if j.tj is not j.base_tj:  # elastic: a stopped job waits, and starts again, at its trace size
                        j.service_s *= j.tj.gpus / j.base_tj.gpus  # (its attained GPU-seconds unchanged)
                        j.tj = j.base_tj
            # every move's stop before any start: two jobs that swap devices (or a chain of moves) must not hand a
            # device back to the free list after the other took it (before, the stop of the second returned the
            # device the first had just started on: the free view of start-only rounds went stale, and a later
            # newcomer was started on a busy GPU, two jobs on one device)
            for s in decision.starts:
                j = active[s.job_id]
                if j.gpu_type is not None:
                    halt(j, t)
                    j.restarts += 1
                    j.migrations += 1
            for s in decision.starts:
                begin(active[s.job_id], s, t)

        new_view = tuple.__new__  # JobView is a NamedTuple: a running job's view is three tuples joined
        if cfg.round_mode not in ("event", "gavel", "live"):
            raise ValueError(f"round_mode {cfg.round_mode!r}: expected 'event', 'gavel' or 'live'")
        boundaries = cfg.round_mode == "gavel"
        plain = (erates is None and data is None and learner is None and pool is None and live is None
                 and cfg.costs.fabric is None)
        halt: Callable[[_Job, float], None] = stop_plain if plain else stop
        begin: Callable[[_Job, Start, float], None] = start_plain if plain else start

        stale_bound = 64  # (stale heap entries tolerated beyond twice the running jobs: compacted past it)
        while ai < len(arrivals) or active or (svc is not None and not svc.done):
            t_arr = arrivals[ai].tj.arrival_s if ai < len(arrivals) else math.inf
            t_done = math.inf
            if len(heap) > stale_bound + 2 * len(running):
                # The stale ends (a job stopped or moved since: preempted ones lie deep in the heap, ends far ahead)
                # dropped all at once: they piled up to ~6,000 entries around ~24 live ones on ed69ec 8:8:8 under
                # las-hetero, and every push and pop went through a heap that deep. The live entries' order is
                # theirs alone ((end, id, version) are unique), so the ends come out as before.
                heap[:] = [e for e in heap if (r := running.get(e[1])) is not None and r.version == e[2]]
                heapq.heapify(heap)
            while heap:  # the first end still due: stale ones (the job stopped or moved since) are dropped
                top = heap[0]
                due = running.get(top[1])
                if due is not None and due.version == top[2]:
                    t_done = top[0]
                    break
                heapq.heappop(heap)
            t_q = math.inf
            if moves_due or (time_sharing and len(running) < len(active)) or (boundaries and active):
                t_q = last_round + cfg.round_s
            t_pool = slurm.next_submit(now) if slurm is not None else math.inf
            t_svc = svc.next_tick if svc is not None else math.inf
            t = min(t_arr, t_done, t_q, t_pool, t_svc)
            if math.isinf(t):
                break  # only jobs that can never start are left; the policy keeps refusing them
            if cfg.max_time_s is not None and t > cfg.max_time_s:
                now = cfg.max_time_s
                break
            t = max(t, now)
            active_integral += len(active) * (t - now)
            now = t
            event = arrived = False
            while heap and heap[0][0] <= now + 1e-9:
                _, jid, ver = heapq.heappop(heap)
                j = running.get(jid)
                if j is None or j.version != ver:
                    continue
                halt(j, now)
                j.remaining = 0.0
                j.end = now
                if predictor is not None:
                    predictor.done(j.tj.job_type, j.tj.user, j.run_s, j.predicted)
                j.arrived = active_integral - j.arrived
                del active[jid]
                left_now.pop(jid, None)
                done.append(j)
                event = True
                if self.progress and len(done) % tick == 0:
                    self.progress(len(done), total)
            if slurm is not None:
                pool_tick(now)  # Slurm's own cycle: jobs that reached its queue, GPUs its jobs freed
            queue_before = len(active) - len(running)  # jobs waiting before this instant's arrivals
            idle_before = not running
            newcomers: list[_Job] = []
            while ai < len(arrivals) and arrivals[ai].tj.arrival_s <= now:
                j = arrivals[ai]
                j.arrived = active_integral
                active[j.tj.id] = j
                newcomers.append(j)
                if prefetching:
                    enqueue(j)
                ai += 1
                event = arrived = True
            if svc is not None and svc.next_tick <= now + 1e-9:
                # the service's tick: its requests up to now, then the autoscaler's replicas added and removed
                reps = {jid: (r.run_start, r.gpu_type or "") for jid, r in running.items() if svc.is_replica(jid)}
                added, removed = svc.tick(now, reps)
                for jid in removed:
                    r = active.pop(jid)
                    left_now.pop(jid, None)
                    if r.gpu_type is not None:
                        stop(r, now)
                    event = True
                for tj in added:
                    r = _Job(tj, 1.0)
                    r.arrived = active_integral
                    active[tj.id] = r
                    newcomers.append(r)
                    event = arrived = True
            note_busy(now)
            if boundaries:
                if not active:
                    continue
                if now < t_q and not idle_before and running:
                    continue  # mid-round: arrivals wait for the boundary, freed GPUs stay idle until then
            elif not event and now < t_q:
                continue
            if event and not arrived and len(running) == len(active) and active and now < t_q:
                # Nobody waits for the GPUs this completion freed; the only use of a round now would be to
                # move running jobs onto them. That waits for the next round (an arrival, or the quantum),
                # as Gavel's rounds do, so a burst of completions costs one round, not one each.
                moves_due = True
                continue
            if not active:
                moves_due = False
                continue
            if (not boundaries and arrived and not queue_before and time_sharing and not oracle
                    and now < last_round + cfg.round_s
                    and not (preempting and any(j.tj.qos in preempting for j in newcomers))):
                # Nobody was waiting: the newcomers only need free GPUs. A start-only round, over them and the
                # free devices alone, starts them now; moves they might allow wait for the quantum's full round
                # (as in Gavel, where everything waits for the next round), which this makes due. With a
                # queue, every event calls a full round: who waits for what is a question for all the jobs;
                # so does a newcomer whose class may preempt, which the live controller serves at once.
                moves_due = True
                if erates is not None:
                    resize(now, list(newcomers))  # (shrinks that let the newcomers start, grows past them)
                if held >= self.total_gpus:
                    continue
                free = free_servers()
                if learner is not None:
                    learn(now)
                inp = build_input(now, [pending_view(j) for j in newcomers], free, pmodel,
                                  checkpoint_cost_s=cfg.costs.checkpoint_s, round_s=cfg.round_s,
                                  user_usage=fair(now), starts_only=True,
                                  cache=starts_cache)
                if aware is not None:
                    aware.round_waiters.clear()
                decision = data_round(schedule_round(self.policy, inp, free, placer=placer, rule=rule,
                                                     reasons=False), inp, free, None)
                rounds += 1
                for s in decision.starts:
                    begin(active[s.job_id], s, now)
                prefetch(now)
                if slurm is not None:
                    pool_tick(now)
                note_busy(now)
                continue
            if learner is not None:
                learn(now)
            if live is not None:
                again, passes = True, 0
                while again and passes < LIVE_PASSES:
                    decision, again = live_decide(now)
                    passes += 1
                    rounds += 1
                    apply(decision, now)
                last_round = now
                moves_due = False
                note_busy(now)
                if not running and ai == len(arrivals) and (svc is None or svc.done):
                    break  # nothing runs, nothing will arrive, and the round starts nothing: stuck for good
                continue
            if erates is not None:
                resize(now, grow=False)  # before the round: shrinks that let waiting jobs start
            # (the hot loop of a replay at scale: a conditional instead of max(0.0, ...), the same floats, took
            # 40 % less time)
            # (a running job's view is its run's fields with its two figures of now: copied from the run's own list,
            # `run_buf`, where the two are set; the former two tuple concatenations a view made 13 % more instructions)
            # (with `eager_left`, the running jobs' forecasts are worked out in the same pass, not in `progress_left`'s
            # second loop over them: the same figures, one loop a round fewer)
            forecast: Mapping[int, float] | None = None
            if predictor is None:
                views: list[JobView] = []
                append = views.append
                for jid, j in active.items():
                    if j.gpu_type is not None:
                        b = j.run_buf
                        if b is None:
                            b = j.run_buf = [*j.run_head, 0.0, 0.0, *j.run_tail]
                        b[11] = j.run_s + (now - j.run_start)
                        bu = j.busy_until
                        # (the seconds it progressed since its restore, once for both figures: a rate times 0.0 adds
                        # 0.0, as the former `... if now > bu else 0.0` of each did; rates are finite)
                        dt = now - bu if now > bu else 0.0
                        b[12] = j.service_s + j.rel * dt
                        append(new_view(JobView, b))
                        if eager_left and (j.rate > 0 or j.last_rate > 0):
                            left_now[jid] = (j.remaining - j.rate * dt) / j.fastest_rate
                    else:
                        append(j.view or pending_view(j))
                if eager_left:
                    forecast = left_now
            else:
                views = [predicted_view(j, now) for j in active.values()]
            if totals and forecast is None:
                forecast = progress_left(now)
            inp = build_input(
                now, views, self.servers, pmodel,
                checkpoint_cost_s=cfg.costs.checkpoint_s, round_s=cfg.round_s,
                user_usage=fair(now), cache=policy_cache, forecast_s=forecast,
            )
            remaining = None
            if oracle and predictor is not None:
                # what a real scheduler could hand a clairvoyant policy: predicted, not true, remaining time
                remaining = {j.tj.id: rest(j, j.run_s + (now - j.run_start if j.gpu_type is not None else 0.0))
                             for j in active.values()}
            elif oracle:
                remaining = {
                    j.tj.id: (j.remaining - (j.rate * max(0.0, now - j.busy_until) if j.gpu_type else 0.0))
                    / j.fastest_rate
                    for j in active.values()
                }
            if aware is not None:
                aware.round_waiters.clear()
            # (`free_on`: the devices no running job holds, each server's in its order, which a plain replay's round
            # reads instead of every kept job's devices; the other modes hold or share devices in ways of their own)
            decision = data_round(schedule_round(self.policy, inp, self.servers, remaining_s=remaining, placer=placer,
                                                 rule=rule, reasons=False, free_now=free_on if plain else None),
                                  inp, self.servers, remaining)
            rounds += 1
            last_round = now
            moves_due = False
            apply(decision, now)
            if erates is not None:
                resize(now)  # after the round: grows into the GPUs it left idle
            prefetch(now)
            if slurm is not None:
                pool_tick(now)
            note_busy(now)
            if not running and ai == len(arrivals) and (svc is None or math.isinf(svc.next_tick)):
                if aware is not None and aware.reserved and unstuck_at != now:
                    # A job refused a server held for a job waiting for its data, which the policy never offered
                    # it (a blocked head ahead of it): with nothing running no event comes to lapse the hold, and
                    # the replay ended with jobs never run. The holders are free: drop the holds, round again now.
                    aware.reserved.clear()
                    unstuck_at = now
                    moves_due = True
                    last_round = now - cfg.round_s
                    continue
                break  # nothing runs, nothing will arrive, and the policy starts nothing: stuck for good

        for j in list(running.values()):
            stop(j, now)
        records = [self._record(j) for j in done]
        unfinished = sorted(j.tj.id for j in active.values())
        lb_avg, lb_makespan = lower_bounds([j.tj for j in jobs], [j.fastest_rate for j in jobs], self.total_gpus)
        result = summarize(
            records,
            policy=self.policy.name,
            trace=self.trace.source,
            capacity=self.capacity,
            unschedulable=[(tj.id, tj.name, reason) for tj, reason in bad],
            unfinished=unfinished,
            rounds=rounds,
            preemptions=preemptions,
            busy_gpu_s=busy_gpu_s,
            lost_gpu_s=lost_gpu_s,
            end_s=now,
            lower_bound_avg_jct_s=lb_avg,
            lower_bound_makespan_s=lb_makespan,
            wall_s=time.perf_counter() - wall0,
            busy=busy,
            prior_rate_jobs=sum(not self.model.measured(j.tj.job_type, j.tj.gpus) for j in jobs),
        )
        summary = result.summary
        summary["throughputs"] = "learned" if learner is not None else "table"
        summary["durations"] = "predicted" if predictor is not None else "true"
        summary["remaining"] = "progress totals" if totals else "unknown"  # what the policy was told of it
        if learner is not None:
            summary["learned_rates"] = len(learner.rates)
            summary["model_rebuilds"] = learner.rebuilds
        if predictor is not None:
            summary["prediction_mean_abs_error"] = predictor.mean_abs_error
        if data is not None:
            summary["locality"] = cfg.locality.value
            summary["data_prefetch_horizon_s"] = cfg.prefetch_s
            summary.update(data.summary())
        if slurm is not None and pool is not None:
            summary.update(_pool_summary(pool, slurm, records))
        summary["gpu_hours"] = busy_gpu_s / 3600.0
        if erates is not None:
            summary["elastic_factor"] = cfg.elastic
            summary["grows"] = resizes[Direction.GROW]
            summary["shrinks"] = resizes[Direction.SHRINK]
            summary["resizes"] = resizes[Direction.GROW] + resizes[Direction.SHRINK]
        if svc is not None:
            figures = svc.summary(now)
            gpu_s = float(figures["service_gpu_hours"]) * 3600.0
            figures["training_gpu_hours"] = max(0.0, busy_gpu_s - gpu_s) / 3600.0
            # while the service ran: every GPU held (the busy steps) less the service's own
            span = float(figures["service_span_s"])
            held_s = sum(n * (min(span, b) - a) for (a, n), (b, _) in zip(busy, [*busy[1:], (span, 0)], strict=True)
                         if a < span)
            figures["training_gpu_hours_during_service"] = max(0.0, held_s - gpu_s) / 3600.0
            summary["service"] = figures
        return result

    def _record(self, j: _Job) -> JobRecord:
        tj = j.base_tj
        assert j.end is not None and j.first_start is not None
        jct = j.end - tj.arrival_s
        fastest = tj.work / j.fastest_rate
        # Themis's rho: JCT over the time an exclusive 1/N share of the cluster would take, N being the
        # time-averaged number of jobs in the system during this job's life.
        n_avg = j.arrived / jct if jct > 0 else 1.0
        rel = self.model.rel_speeds(tj.job_type, tj.gpus, self.types)
        avg_rel = sum(rel.get(t, 0.0) * n for t, n in self.capacity.items()) / self.total_gpus
        share = min(1.0, self.total_gpus / (max(1.0, n_avg) * tj.gpus))
        t_iso = fastest / max(1e-12, avg_rel * share)
        return JobRecord(
            id=tj.id, name=tj.name, job_type=tj.job_type, gpus=tj.gpus, arrival_s=tj.arrival_s,
            start_s=j.first_start, end_s=j.end, jct_s=jct, queue_s=jct - j.run_s, run_s=j.run_s,
            restarts=j.restarts, migrations=j.migrations, last_gpu_type=j.last_type,
            fastest_runtime_s=fastest, ftf_rho=jct / t_iso, overhead_s=j.overhead_s, copy_s=j.copy_s,
            pool=self.config.slurm_pool.name if j.in_pool and self.config.slurm_pool is not None else "",
            slurm_wait_s=j.pool_wait_s,
        )


def _pool_summary(pool: SlurmPoolSpec, slurm: SlurmQueue, records: list[JobRecord]) -> dict[str, object]:
    """Per pool: jobs whose last run was in the Slurm pool, and the others (on the workstations)."""
    there = [r for r in records if r.pool]
    here = [r for r in records if not r.pool]

    def avg(xs: list[float]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    return {
        "slurm_pool": f"{pool.gpu_type}:{pool.gpus}:{pool.queue_wait_s:g}:{pool.gpus_per_node}",
        "pool_jobs": len(there),
        "pool_avg_jct_s": avg([r.jct_s for r in there]),
        "workstation_jobs": len(here),
        "workstation_avg_jct_s": avg([r.jct_s for r in here]),
        "slurm_avg_wait_s": avg([r.slurm_wait_s for r in there]),
        "slurm_started": slurm.started,
        "slurm_backfilled": slurm.backfilled,
    }


def simulate(trace: Trace, servers: tuple[ServerView, ...], policy: AnyPolicy,
             config: SimConfig | None = None, **kw: object) -> SimResult:
    """Convenience wrapper: `Simulator(trace, servers, policy, config).run()`."""
    return Simulator(trace, servers, policy, config, **kw).run()  # type: ignore[arg-type]
