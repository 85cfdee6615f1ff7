"""An inference service in the simulator (`hsched sim --service TRACE.csv`), beside the training trace.

The service replays a request trace (the Azure LLM inference trace's form: TIMESTAMP, ContextTokens,
GeneratedTokens; hsched.sched.servicetime) against replicas that the simulator's own machinery places: each
replica is a job of the service's class (`prod` by default) and of `gpus_per_replica` GPUs, which the round
starts on free GPUs or, by the QoS rule, on GPUs it preempts from lower classes (a checkpointable training
job is stopped and resumes later at the simulator's checkpoint cost, as any QoS preemption). A replica never
ends by itself: the autoscaler adds replicas and removes them.

Every `interval_s` (1 s by default) the service computes a `Sample` from its exact request queue (requests in
flight time-averaged over the interval, arrivals, the p99 of the requests that finished in it, replicas
ready), and runs `hsched.sched.autoscale.decide` on the recent samples, the very function the live
controller's service manager runs on its router's samples. Then:

- more replicas wanted: new replica jobs arrive (the round places them); a replica takes traffic
  `cold_start_s` after it started (launch to ready);
- fewer: replicas never started or still starting are cancelled first, then the ready ones with the fewest
  requests in flight are drained (no new request) and give their GPUs back once their last request is done
  (no request is cut off);
- static (`static` replicas): the same number throughout, the baseline to compare against.

Requests go to the ready replica with the fewest outstanding requests (as the live router does), where they
are served by the stand-in's model (continuous batching, FIFO beyond the batch; servicetime.ReplicaQueue) at
the replica's GPU type's relative speed. While no replica is ready a request waits (the live router answers
503 with Retry-After and its clients retry) and is sent as soon as one is; its latency counts the wait. A
replica stopped under it (preempted) sends its requests back to that wait, from the start.

The request trace starts `start_s` after the simulation (by default one cold start: the service's first
replicas, launched at 0, are ready when its first request comes, as a live service is started before its
load). The report: requests, SLO attainment (within the p99 target), latency percentiles, service
GPU-hours, the replica count over time, scale-ups and -downs; the engine adds the training figures.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hsched.sched.autoscale import Sample, ScaleMemo, ScalePolicy, decide
from hsched.sched.servicetime import ReplicaQueue, Request, ServiceModel, relative_speed, service_time_s, slowdown
from hsched.sched.throughput import ThroughputModel
from hsched.sim.trace import TraceJob

REPLICA_ID_BASE = 1_000_000_000
"""Replica jobs' ids start here, above any trace's (the engine keys jobs by id)."""
JOB_TYPE = "inference replica"
TIMELINE_MAX = 400
"""At most this many replica-count changes are kept in the report (the first ones)."""


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    requests: tuple[Request, ...]
    """The request trace, already sped up and scaled (servicetime.compress)."""
    policy: ScalePolicy
    name: str = "service"
    gpus_per_replica: int = 1
    qos: str = "prod"
    cold_start_s: float = 20.0
    interval_s: float = 1.0
    static: int | None = None
    """A fixed number of replicas (no autoscaling): the baseline."""
    model: ServiceModel = field(default_factory=ServiceModel)
    start_s: float | None = None
    """When the first request arrives (None: one cold start after 0)."""
    speedup: float = 1.0
    """The trace's speed-up (for the peak-minute figures: a trace minute is 60 / speedup s here)."""
    source: str = ""
    initial: int | None = None
    """Replicas launched at 0, before the first request (Ray Serve's initial_replicas, Knative's initial-scale);
    None: min_replicas (at least 1). The autoscaler takes over from the first tick on."""


class _Replica:
    __slots__ = (
        "asked_at", "draining", "gpu_type", "id", "inflight", "queue", "ready", "ready_at", "speed", "started",
    )

    def __init__(self, rid: int, asked_at: float, model: ServiceModel) -> None:
        self.id = rid
        self.asked_at = asked_at
        self.started: float | None = None  # run start of its current run (None: waiting for GPUs)
        self.ready_at: float | None = None
        self.ready = False  # taking traffic
        self.draining = False
        self.gpu_type = ""
        self.speed = 1.0  # its GPU type's relative inference speed
        self.queue = ReplicaQueue(model)
        self.inflight: set[int] = set()  # request indices routed to it, not finished


class ServiceModelAware(ThroughputModel):
    """The trace's throughput model, plus a rate for replica jobs on every GPU type (their work is infinite:
    the rate only has to exist for the round to place them; their speed is the service's own model)."""

    def __init__(self, base: ThroughputModel) -> None:
        # a copy of base's state (no __init__ call: it would measure the table again); its caches its own
        self.__dict__.update({k: dict(v) if k.endswith("_cache") else v for k, v in base.__dict__.items()})

    def rate(self, job_type: str, gpus: int, gpu_type: str, spans: bool = False) -> float | None:
        if job_type == JOB_TYPE:
            return float(gpus) * relative_speed(gpu_type)
        return super().rate(job_type, gpus, gpu_type, spans)


class ServiceSim:
    """The service's side of a simulation: the engine calls `tick` at `next_tick` (and reads `done`)."""

    def __init__(self, cfg: ServiceConfig) -> None:
        problems = cfg.policy.problems() + cfg.model.problems()
        if cfg.gpus_per_replica < 1:
            problems.append(f"GPUs per replica {cfg.gpus_per_replica} must be >= 1")
        if not cfg.interval_s > 0 or cfg.cold_start_s < 0:
            problems.append("the interval must be > 0 s and the cold start >= 0 s")
        if cfg.static is not None and cfg.static < 1:
            problems.append(f"static replicas {cfg.static} must be >= 1")
        if not cfg.requests:
            problems.append("no requests in the service trace")
        if cfg.initial is not None and not cfg.policy.min_replicas <= cfg.initial <= cfg.policy.max_replicas:
            problems.append(
                f"initial replicas {cfg.initial} outside [{cfg.policy.min_replicas}, {cfg.policy.max_replicas}]"
            )
        if problems:
            raise ValueError("; ".join(problems))
        self.cfg = cfg
        self.start_s = cfg.cold_start_s if cfg.start_s is None else cfg.start_s
        self.arrival = [r.arrival_s + self.start_s for r in cfg.requests]
        self.t = 0.0
        self.next_tick = 0.0
        self.finished_at: float | None = None
        self.replicas: dict[int, _Replica] = {}  # not removed yet (running, starting, waiting or draining)
        self.next_id = REPLICA_ID_BASE
        self.memo = ScaleMemo()
        self.samples: deque[Sample] = deque()
        self.front: deque[int] = deque()  # requests waiting for a ready replica
        self.next_req = 0
        self.outstanding = 0
        self.latency: list[float] = [math.nan] * len(cfg.requests)
        # this interval's measurements
        self.area = 0.0
        self.arrived = 0
        self.done_lat: list[float] = []
        # the report's counters
        self.gpu_s = 0.0
        self.held_area = 0.0  # replica-seconds held (GPUs taken), for the time-averaged count
        self.scale_ups = self.scale_downs = 0
        self.replica_preemptions = 0
        self.requeued = 0
        self.peak_wanted = 0
        self.timeline: list[tuple[float, int, int]] = []  # (t, wanted, ready) at each change
        self.reasons: list[tuple[float, str]] = []
        self.last_held_t = 0.0

    # ------------------------------------------------------------------ the engine's side

    @property
    def done(self) -> bool:
        return self.finished_at is not None and not self.replicas

    def is_replica(self, job_id: int) -> bool:
        return job_id >= REPLICA_ID_BASE

    def tick(self, now: float, running: Mapping[int, tuple[float, str]]) -> tuple[list[TraceJob], list[int]]:
        """Bring the service to `now`. running: replica job id -> (its run's start, GPU type), for the replicas
        running now. Returns (replica jobs to add, replica job ids to remove now)."""
        self._held(now)
        self._observe(now, running)
        self._advance(now)
        remove = [r.id for r in self.replicas.values() if r.draining and not r.inflight]
        for rid in remove:
            self._drop(rid, now)
        add: list[TraceJob] = []
        if self.next_req >= len(self.arrival) and self.outstanding == 0:
            # the trace is over: every replica goes
            if self.finished_at is None:
                self.finished_at = now
                self._note(now, f"trace over -> 0 replicas ({len(self.cfg.requests)} requests served)")
            for rid in list(self.replicas):
                remove.append(rid)
                self._drop(rid, now)
            self._timeline(now)
            self.next_tick = math.inf
            return add, remove
        self._sample(now)
        cfg = self.cfg
        current = sum(1 for r in self.replicas.values() if not r.draining)
        if cfg.static is not None:
            wanted, reason = cfg.static, f"static {cfg.static} replicas"
        elif now == 0.0 and not self.replicas and self.next_req == 0:
            lo, hi = cfg.policy.min_replicas, cfg.policy.max_replicas
            wanted = max(lo, min(hi, cfg.initial if cfg.initial is not None else max(1, lo)))
            reason = f"launch: {wanted} initial replicas"
        else:
            d = decide(self.cfg.policy, list(self.samples), now, current, self.memo, self.cfg.cold_start_s)
            self.memo = d.memo
            wanted, reason = d.wanted, d.reason
        self.peak_wanted = max(self.peak_wanted, wanted)
        if wanted > current:
            if now > 0:  # (the first replicas are the launch, not a scale-up)
                self.scale_ups += 1
            for _ in range(wanted - current):
                add.append(self._new_replica(now))
            self._note(now, reason)
        elif wanted < current:
            self.scale_downs += 1
            remove.extend(self._shrink(current - wanted, now))
            self._note(now, reason)
        self._timeline(now)
        self.next_tick = now + self.cfg.interval_s
        return add, remove

    # ------------------------------------------------------------------ replicas

    def _new_replica(self, now: float) -> TraceJob:
        rid = self.next_id
        self.next_id += 1
        self.replicas[rid] = _Replica(rid, now, self.cfg.model)
        return TraceJob(
            id=rid,
            job_type=JOB_TYPE,
            gpus=self.cfg.gpus_per_replica,
            arrival_s=now,
            work=math.inf,
            name=f"{self.cfg.name}/{rid - REPLICA_ID_BASE}",
            qos=self.cfg.qos,
            checkpointable=False,
        )

    def _shrink(self, n: int, now: float) -> list[int]:
        """Cancel the replicas not ready yet (waiting for GPUs first, then starting), then drain the ready ones
        with the fewest requests in flight; returns those to remove at once."""
        live = [r for r in self.replicas.values() if not r.draining]
        order = sorted(live, key=lambda r: (r.ready, r.started is not None, len(r.inflight), -r.id))
        out: list[int] = []
        for r in order[:n]:
            if not r.ready or not r.inflight:
                out.append(r.id)
                self._drop(r.id, now)
            else:
                r.draining = True
        return out

    def _drop(self, rid: int, now: float) -> None:
        r = self.replicas.pop(rid)
        if r.started is not None:
            self.gpu_s += (now - r.started) * self.cfg.gpus_per_replica
        for q in sorted(r.inflight):  # (none: a replica goes drained or never ready; kept safe) back to the wait
            self.front.append(q)
            self.requeued += 1

    def _observe(self, now: float, running: Mapping[int, tuple[float, str]]) -> None:
        """Which replicas the engine started (their start is exact) or stopped since the last tick."""
        for r in self.replicas.values():
            got = running.get(r.id)
            if got is not None and r.started is None:
                r.started, r.gpu_type = got
                r.speed = relative_speed(r.gpu_type)
                r.ready_at = r.started + self.cfg.cold_start_s
                r.queue = ReplicaQueue(self.cfg.model, t=max(self.t, r.started))
            elif r.started is not None and (got is None or got[0] != r.started):
                # preempted (a higher class took its GPUs): its GPU time ends, its requests wait again
                self.replica_preemptions += 1
                # it stopped at some instant since the last tick, before any new start: counted to that bound
                self.gpu_s += ((now if got is None else got[0]) - r.started) * self.cfg.gpus_per_replica
                self.outstanding_requeue(r)
                r.started = r.ready_at = None
                r.ready = False
                r.queue = ReplicaQueue(self.cfg.model)
                if got is not None:  # and started again since: a new cold start from its new start
                    r.started, r.gpu_type = got
                    r.speed = relative_speed(r.gpu_type)
                    r.ready_at = r.started + self.cfg.cold_start_s
                    r.queue = ReplicaQueue(self.cfg.model, t=max(self.t, r.started))

    def outstanding_requeue(self, r: _Replica) -> None:
        for q in sorted(r.inflight):
            self.front.appendleft(q)
            self.requeued += 1
        r.inflight.clear()

    # ------------------------------------------------------------------ requests, exactly

    def _advance(self, now: float) -> None:
        """Requests from self.t to now: arrivals, replicas becoming ready, completions, in time order."""
        while self.front and self._ready():  # (requests a stopped replica gave back)
            self._route(self.front.popleft(), self.t)
        while True:
            ta = self.arrival[self.next_req] if self.next_req < len(self.arrival) else math.inf
            tc = math.inf
            tr = math.inf
            for r in self.replicas.values():
                if r.ready:
                    nf = r.queue.next_finish()
                    if nf is not None and nf < tc:
                        tc = nf
                elif r.ready_at is not None and r.ready_at < tr:
                    tr = max(r.ready_at, self.t)
            e = min(ta, tc, tr)
            if e > now:
                break
            self._to(e)
            if tr <= e:
                for r in self.replicas.values():
                    if not r.ready and r.ready_at is not None and r.ready_at <= e:
                        r.ready = True
                        r.queue.t = max(r.queue.t, e)
                while self.front and self._ready():
                    self._route(self.front.popleft(), e)
            while self.next_req < len(self.arrival) and self.arrival[self.next_req] <= e:
                q = self.next_req
                self.next_req += 1
                self.arrived += 1
                self.outstanding += 1
                if self.front or not self._ready():
                    self.front.append(q)  # FIFO behind the earlier ones
                    while self.front and self._ready():
                        self._route(self.front.popleft(), e)
                else:
                    self._route(q, e)
        self._to(now)

    def _ready(self) -> list[_Replica]:
        return [r for r in self.replicas.values() if r.ready and not r.draining]

    def _route(self, q: int, t: float) -> None:
        """To the ready replica with the fewest outstanding requests (ties: the oldest)."""
        r = min(self._ready(), key=lambda x: (len(x.inflight), x.id))
        req = self.cfg.requests[q]
        work = service_time_s(req.context_tokens, req.generated_tokens, self.cfg.model, r.speed)
        for k, tf in r.queue.arrive(t, q, work):
            self._finish(r, k, tf)  # pragma: no cover - the loop advanced every replica to t already
        r.inflight.add(q)

    def _to(self, t: float) -> None:
        if t > self.t:
            self.area += self.outstanding * (t - self.t)
        for r in self.replicas.values():
            if r.ready:
                for k, tf in r.queue.advance(t):
                    self._finish(r, k, tf)
        self.t = max(self.t, t)

    def _finish(self, r: _Replica, q: int, tf: float) -> None:
        r.inflight.discard(q)
        lat = tf - self.arrival[q]
        self.latency[q] = lat
        self.done_lat.append(lat)
        self.outstanding -= 1

    # ------------------------------------------------------------------ measurements

    def _sample(self, now: float) -> None:
        dt = self.cfg.interval_s
        lat = sorted(self.done_lat)
        p99 = lat[min(len(lat) - 1, math.ceil(0.99 * len(lat)) - 1)] if lat else None
        s = Sample(t=now, dt=dt, concurrency=self.area / dt, arrivals=self.arrived, p99_s=p99, ready=len(self._ready()))
        self.area, self.arrived, self.done_lat = 0.0, 0, []
        self.samples.append(s)
        keep = self.cfg.policy.stable_window_s + 2 * dt
        while self.samples and self.samples[0].t < now - keep:
            self.samples.popleft()

    def _held(self, now: float) -> None:
        held = sum(1 for r in self.replicas.values() if r.started is not None)
        self.held_area += held * max(0.0, now - self.last_held_t)
        self.last_held_t = now

    def _timeline(self, now: float) -> None:
        wanted = sum(1 for r in self.replicas.values() if not r.draining)
        ready = len(self._ready())
        if (not self.timeline or self.timeline[-1][1:] != (wanted, ready)) and len(self.timeline) < TIMELINE_MAX:
            self.timeline.append((round(now, 3), wanted, ready))

    def _note(self, now: float, reason: str) -> None:
        if len(self.reasons) < TIMELINE_MAX:
            self.reasons.append((round(now, 3), reason))

    # ------------------------------------------------------------------ the report

    def _full_minutes(self) -> list[float]:
        """Each full trace minute's offered work (alone-seconds on the reference GPU); the last, partial minute
        is left out."""
        cfg = self.cfg
        width = 60.0 / cfg.speedup
        work: dict[int, float] = {}
        for r in cfg.requests:
            k = int(r.arrival_s // width)
            work[k] = work.get(k, 0.0) + service_time_s(r.context_tokens, r.generated_tokens, cfg.model)
        minutes = [work.get(k, 0.0) for k in range(max(work) + 1)]
        return minutes[:-1] or minutes

    def _replicas_for(self, work: float) -> int:
        """Replicas a minute of `work` needs: its offered load at the target concurrency's batch slowdown, over
        the target concurrency per replica."""
        cfg = self.cfg
        target = cfg.policy.target_concurrency
        slow = slowdown(cfg.model, max(1, round(target)))
        return max(1, math.ceil(work / (60.0 / cfg.speedup) * slow / target - 1e-9))

    def provisioning(self) -> tuple[int, int]:
        """Replicas a static service needs for the trace's peak minute and for its median minute."""
        full = sorted(self._full_minutes())
        return self._replicas_for(full[-1]), self._replicas_for(full[len(full) // 2])

    def per_minute_floor(self) -> float:
        """Mean replicas of an oracle that provisions every full trace minute for its own offered work by the rule
        of `provisioning` (no cold start, no window, no margin): a floor for any autoscaler at the same load per
        replica. Its ratio to the peak figure bounds the service's GPU-hours against the static peak's."""
        full = self._full_minutes()
        return sum(self._replicas_for(w) for w in full) / len(full)

    def summary(self, end_s: float) -> dict[str, Any]:
        cfg = self.cfg
        self._held(end_s)
        lat = sorted(x for x in self.latency if not math.isnan(x))
        n = len(cfg.requests)

        def pct(p: float) -> float | None:
            return lat[min(len(lat) - 1, max(0, math.ceil(p * len(lat)) - 1))] if lat else None

        within = sum(1 for x in lat if x <= cfg.policy.slo_p99_s + 1e-9)
        span = self.finished_at if self.finished_at is not None else end_s
        peak, median = self.provisioning()
        ready_counts = [w for _, _, w in self.timeline]
        return {
            "service": cfg.name,
            "service_trace": cfg.source,
            "service_mode": f"static {cfg.static}" if cfg.static is not None else "autoscale",
            "service_replicas": f"{cfg.policy.min_replicas}-{cfg.policy.max_replicas}",
            "service_gpus_per_replica": cfg.gpus_per_replica,
            "service_qos": cfg.qos,
            "service_speedup": cfg.speedup,
            "service_cold_start_s": cfg.cold_start_s,
            "service_target_concurrency": cfg.policy.target_concurrency,
            "slo_p99_s": cfg.policy.slo_p99_s,
            "requests": n,
            "requests_finished": len(lat),
            "requests_failed": n - len(lat),
            "requests_requeued": self.requeued,
            "slo_attainment": within / n if n else None,
            "latency_p50_s": pct(0.50),
            "latency_p99_s": pct(0.99),
            "latency_max_s": lat[-1] if lat else None,
            "service_gpu_hours": self.gpu_s / 3600.0,
            "service_span_s": span,
            "replicas_mean": self.held_area / span if span > 0 else 0.0,
            "replicas_ready_max": max(ready_counts, default=0),
            "replicas_wanted_max": self.peak_wanted,
            "scale_ups": self.scale_ups,
            "scale_downs": self.scale_downs,
            "replica_preemptions": self.replica_preemptions,
            "static_peak_replicas": peak,
            "static_median_replicas": median,
            "per_minute_floor_replicas": self.per_minute_floor(),
            "static_peak_gpu_hours": peak * cfg.gpus_per_replica * (span - 0.0) / 3600.0,
            "replica_timeline": [list(x) for x in self.timeline],
            "scale_reasons": [list(x) for x in self.reasons[:50]],
        }


# ---------------------------------------------------------------------- `hsched sim --service` options


def parse_seconds(text: str, option: str) -> float:
    """A duration ("20s", "500ms", "2m", or "1.5" seconds) -> seconds; ValueError names the option."""
    t = text.strip().lower()
    scale = 1.0
    for suffix, mult in (("ms", 0.001), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if t.endswith(suffix):
            t, scale = t[: -len(suffix)], mult
            break
    try:
        v = float(t) * scale
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{option} {text!r}: expected a duration such as 20s, 500ms or 2m")
    return v


def parse_replicas(text: str) -> tuple[int, int]:
    """The replica bounds "MIN-MAX" (or "N": MIN = MAX = N) -> (min, max)."""
    lo, sep, hi = text.strip().partition("-")
    try:
        a = int(lo)
        b = int(hi) if sep else a
    except ValueError:
        a = b = -1
    if a < 0 or b < max(1, a):
        raise ValueError(
            f"--service-replicas {text!r}: expected MIN-MAX with 0 <= MIN <= MAX and MAX >= 1, such as 1-8"
        )
    return a, b


def parse_slo(text: str) -> float:
    """The objective "p99=500ms" -> 0.5 (the p99 in seconds)."""
    key, sep, val = text.strip().partition("=")
    if not sep or key.strip().lower() != "p99":
        raise ValueError(f"--service-slo {text!r}: expected p99=DURATION, such as p99=1500ms")
    v = parse_seconds(val, "--service-slo")
    if v <= 0:
        raise ValueError(f"--service-slo {text!r}: the p99 target must be > 0")
    return v


def service_from_options(
    text: str,
    source: str,
    *,
    speedup: float = 10.0,
    scale: float = 1.0,
    replicas: str = "1-8",
    gpus_per_replica: int = 1,
    slo: str = "p99=1500ms",
    target_concurrency: float = 8.0,
    qos: str = "prod",
    static: int | None = None,
    cold_start: str = "20s",
    interval: str = "1s",
    stable_window: str = "60s",
    initial: int | None = None,
    qos_names: Sequence[str] = ("prod", "normal", "scavenger"),
) -> ServiceSim:
    """The service of `hsched sim --service FILE ...` from the options' texts; ValueError names the option."""
    from hsched.sched.servicetime import compress, load_trace

    if not (math.isfinite(speedup) and speedup > 0):
        raise ValueError(f"--service-speedup {speedup:g}: expected a number > 0, such as 10")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"--service-scale {scale:g}: expected a number > 0, such as 1.0")
    if not (math.isfinite(target_concurrency) and target_concurrency > 0):
        raise ValueError(f"--service-target-concurrency {target_concurrency:g}: expected a number > 0, such as 6")
    if gpus_per_replica < 1:
        raise ValueError(f"--service-gpus-per-replica {gpus_per_replica}: expected at least 1")
    if qos not in qos_names:
        raise ValueError(f"--service-qos {qos!r}: expected one of {', '.join(qos_names)}")
    if static is not None and static < 1:
        raise ValueError(f"--service-static {static}: expected at least 1 replica")
    lo, hi = parse_replicas(replicas)
    if initial is not None and not lo <= initial <= hi:
        raise ValueError(f"--service-initial {initial}: expected a number within --service-replicas {replicas}")
    step = parse_seconds(interval, "--service-interval")
    if step <= 0:
        raise ValueError(f"--service-interval {interval!r}: expected a duration > 0, such as 1s")
    window = parse_seconds(stable_window, "--service-stable-window")
    if window < step:
        raise ValueError(f"--service-stable-window {stable_window!r}: expected at least the interval ({step:g} s)")
    requests = compress(load_trace(text, source), speedup, scale)
    if static is not None:
        lo = hi = static
    policy = ScalePolicy.for_window(lo, hi, target_concurrency, parse_slo(slo), stable_window_s=window, interval_s=step)
    cfg = ServiceConfig(
        requests=requests,
        policy=policy,
        name=source.rsplit("/", 1)[-1].removesuffix(".csv") or "service",
        gpus_per_replica=gpus_per_replica,
        qos=qos,
        cold_start_s=parse_seconds(cold_start, "--service-cold-start"),
        interval_s=step,
        static=static,
        speedup=speedup,
        source=source,
        initial=initial,
    )
    return ServiceSim(cfg)


def describe(figures: Mapping[str, Any]) -> list[str]:
    """The service's report as text lines (`hsched sim --service` without --json)."""
    f = dict(figures)

    def sec(key: str) -> str:
        v = f.get(key)
        return "-" if v is None else f"{float(v):.3f} s"

    att = f.get("slo_attainment")
    return [
        f"service {f['service']} ({f['service_mode']}, replicas {f['service_replicas']} x "
        f"{f['service_gpus_per_replica']} GPU, qos {f['service_qos']}, {f['service_speedup']:g}x, cold start "
        f"{f['service_cold_start_s']:g} s, target concurrency {f['service_target_concurrency']:g})",
        f"  requests {f['requests']}, failed {f['requests_failed']}, requeued {f['requests_requeued']}; "
        f"SLO p99 {f['slo_p99_s']:g} s attained by {'-' if att is None else f'{100 * float(att):.2f}%'}"
        f" of requests",
        f"  latency p50 {sec('latency_p50_s')}, p99 {sec('latency_p99_s')}, max {sec('latency_max_s')}",
        f"  service GPU-hours {float(f['service_gpu_hours']):.3f} over {float(f['service_span_s']):.0f} s "
        f"(replicas: mean {float(f['replicas_mean']):.2f}, max ready {f['replicas_ready_max']}); "
        f"static for the peak minute: {f['static_peak_replicas']} replicas = "
        f"{float(f['static_peak_gpu_hours']):.3f} GPU-hours; median minute: {f['static_median_replicas']}; each "
        f"minute for itself (a floor): {float(f.get('per_minute_floor_replicas', 0.0)):.2f} on average",
        f"  scale-ups {f['scale_ups']}, scale-downs {f['scale_downs']}, replicas preempted "
        f"{f['replica_preemptions']}; training GPU-hours {float(f['training_gpu_hours']):.2f} in all, "
        f"{float(f.get('training_gpu_hours_during_service', 0.0)):.3f} while the service ran",
    ]
