"""The controller's service manager (issue 30): each service's router, its autoscaler and its replicas.

A service (hsched.spec.service; `hsched serve start`) is a row of the store; its replicas are jobs of its owner
(JobSpec.service/replica, env HSCHED_SERVICE, HSCHED_REPLICA, HSCHED_PORT), so the scheduling round places them,
preempts lower QoS classes for them and launches them exactly as any job. Per service one Router
(hsched.serve.router) listens on the service's address. Every TICK_S the manager, for each service:

1. follows its replica jobs: a RUNNING one is probed (hsched.serve.readiness) until ready, then takes traffic
   (`router.add_ready`) and its cold start (launch to ready) is recorded; one whose job ended unasked leaves the
   router and is replaced; one requeued (preempted) leaves the router until it runs again;
2. takes the router's sample of the last interval, keeps a window of them, and asks the autoscaler
   (hsched.sched.autoscale.decide, pure) how many replicas it wants, with the service's measured cold start;
3. reconciles: too few replicas, new replica jobs are submitted; too many, the newest/least loaded is drained
   (no request cut) and only then its job cancelled, which pokes the round so its GPUs go back to the queue at once.

A restarted controller reads its services from the store and adopts their replica jobs (those not ended), probing
the running ones again. `serve stop` drains every replica, then stops it; the service ends STOPPED.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import socket
import statistics
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from hsched.controller import commands
from hsched.controller.core import Controller
from hsched.controller.launching import job_cache
from hsched.controller.metrics import ServiceReading, watch_services
from hsched.errors import HschedError, PermissionDenied, UserError
from hsched.model import Job, JobState
from hsched.serialize import iso
from hsched.spec.service import ServiceRecord, ServiceSpec, ServiceState, parse_replicas

log = logging.getLogger("hsched.controller.services")

TICK_S = 1.0
"""How often each service is sampled, decided and reconciled."""
PROBE_TIMEOUT_S = 1.0
"""One readiness probe's limit (a replica still loading its model answers nothing: probed again next tick)."""
DRAIN_TIMEOUT_S = 120.0
"""The longest a replica being scaled down may finish its requests in flight before it is stopped anyway."""
COLD_STARTS_KEPT = 20
ROUTER_HOST = "127.0.0.1"
"""Where a service's router listens (its address's host)."""


class Phase(enum.StrEnum):
    STARTING = "starting"
    """Its job waits, launches, or runs but is not ready yet: no traffic."""
    READY = "ready"
    """Takes traffic."""
    DRAINING = "draining"
    """Being scaled down (or the service stops): no new requests; stopped once those in flight end."""


@dataclass(frozen=True, slots=True)
class Replica:
    index: int
    job_id: int
    port: int
    phase: Phase = Phase.STARTING
    url: str | None = None
    """Where the router reaches it (http://HOST:PORT), once its job runs."""
    node: str | None = None
    cold_start_s: float | None = None
    adopted: bool = False
    """Found running by a restarted controller: its launch-to-ready is not a cold start measured here."""


class RouterLike(Protocol):
    """What the manager asks of a router (hsched.serve.router.Router; tests give a stand-in)."""

    async def start(self) -> None: ...
    @property
    def address(self) -> tuple[str, int]: ...
    def add_ready(self, replica: str, base_url: str) -> None: ...
    async def drain(self, replica: str, timeout_s: float) -> int: ...
    def remove(self, replica: str) -> None: ...
    def sample(self) -> Any: ...
    def stats(self) -> Any: ...
    async def close(self) -> None: ...


MakeRouter = Callable[[str, str, int, Callable[[], float], float], RouterLike]
"""(name, host, port, clock, the latency target in seconds) -> a router, not started."""
Probe = Callable[[str, str | None], Awaitable[bool]]
Decide = Callable[..., Any]


def _real_router(name: str, host: str, port: int, clock: Callable[[], float], slo_s: float) -> RouterLike:
    from hsched.serve.router import Router

    return Router(name, host=host, port=port, clock=clock, slo_s=slo_s)


async def _real_probe(url: str, path: str | None) -> bool:
    from hsched.serve.readiness import ready

    return await ready(url, path, timeout_s=PROBE_TIMEOUT_S)


def _real_decide(*args: Any, **kwargs: Any) -> Any:
    from hsched.sched.autoscale import decide

    return decide(*args, **kwargs)


@dataclass(slots=True)
class ServiceRuntime:
    """One service as the manager runs it: what it was told (`record`), its router, its replicas, its samples."""

    record: ServiceRecord
    router: RouterLike
    memo: Any
    samples: deque[Any] = field(default_factory=deque)
    replicas: dict[int, Replica] = field(default_factory=dict)
    cold_starts: deque[float] = field(default_factory=lambda: deque(maxlen=COLD_STARTS_KEPT))
    last_reason: str = ""
    drains: dict[int, asyncio.Task[None]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.record.spec.name

    def rid(self, index: int) -> str:
        return f"{self.name}-{index}"

    def cold_start_s(self) -> float:
        return statistics.median(self.cold_starts) if self.cold_starts else 0.0

    def live(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.phase is not Phase.DRAINING]


class ServiceManager:
    """Every service of one controller (ctl.state.services); see the module's docstring."""

    def __init__(self, ctl: Controller, *, make_router: MakeRouter = _real_router, probe: Probe = _real_probe,
                 decide: Decide = _real_decide, host: str = ROUTER_HOST) -> None:
        self.ctl = ctl
        self.make_router = make_router
        self.probe = probe
        self.decide = decide
        self.host = host
        self.services: dict[str, ServiceRuntime] = {}
        self.ports: set[int] = set()
        """Ports handed to replicas (a replica's HSCHED_PORT), so two are never given the same."""
        self.loaded = False
        self.lock = asyncio.Lock()
        """One change at a time to the services (a tick, a start, a scale, a stop)."""
        watch_services(ctl, self.readings)  # the metrics scrape shows each service (hsched.controller.metrics)

    def readings(self) -> list[ServiceReading]:
        return [ServiceReading(name, rt.router.stats(), rt.record.wanted) for name, rt in sorted(self.services.items())]

    # ------------------------------------------------------------------------------------------ loading

    async def load(self) -> None:
        """The store's services, their routers started and their replica jobs adopted (once)."""
        if self.loaded:
            return
        self.loaded = True
        records = await self.ctl.db(self.ctl.store.services)
        jobs = await self._active()
        for rec in records:
            try:
                rt = await self._open(rec)
            except (OSError, HschedError) as e:
                log.error("service %s: its router did not start: %s", rec.spec.name, e)
                await self._event(rec.spec.name, "service", f"router did not start: {e}")
                continue
            for job in jobs:
                if job.spec.service == rec.spec.name and job.spec.replica is not None:
                    port = _port_of(job)
                    rt.replicas[job.spec.replica] = Replica(job.spec.replica, job.id, port, adopted=True)
                    self.ports.add(port)
            if rt.replicas:
                await self._event(rec.spec.name, "service", f"adopted {len(rt.replicas)} replica job(s): "
                                  + ", ".join(str(r.job_id) for r in rt.replicas.values()))

    async def _open(self, rec: ServiceRecord, *, strict: bool = False) -> ServiceRuntime:
        """Start the service's router on its port; `strict` (a new service): a port taken is an error, else (a restart)
        another port is taken and said in an event."""
        router = self.make_router(rec.spec.name, self.host, rec.spec.port, self.ctl.clock.monotonic,
                                  rec.spec.slo_p99_s)
        try:
            await router.start()
        except OSError:
            if rec.spec.port == 0 or strict:
                raise
            # the port it had is taken now: a new one, said in an event (the address changes)
            router = self.make_router(rec.spec.name, self.host, 0, self.ctl.clock.monotonic, rec.spec.slo_p99_s)
            await router.start()
            await self._event(rec.spec.name, "service", f"port {rec.spec.port} is taken: listening on "
                              f"{router.address[1]} now")
        port = router.address[1]
        if port != rec.spec.port:
            # the address is kept: a restarted controller listens on the same one
            rec = await self.ctl.db(self.ctl.store.set_service, rec.spec.name, self.ctl.clock.time(),
                                    spec=replace(rec.spec, port=port))
        rt = ServiceRuntime(rec, router, _memo())
        self.services[rec.spec.name] = rt
        if hasattr(router, "on_unready"):
            # a replica that refused a connection is probed again before it takes traffic again
            router.on_unready = lambda rid: _unready(rt, rid)
        return rt

    async def _active(self) -> list[Job]:
        return list((await self.ctl.db(job_cache(self.ctl).read, self.ctl.store)).all)

    async def _event(self, name: str, kind: str, message: str, job_id: int | None = None,
                     **data: Any) -> None:
        await self.ctl.event(kind, f"service {name}: {message}", job_id=job_id, data={"service": name, **data})

    # ------------------------------------------------------------------------------------------ the tick

    async def tick(self) -> None:
        """One beat for every service: follow replicas, sample, decide, reconcile."""
        await self.load()
        async with self.lock:
            jobs = {j.id: j for j in await self._active()}
            for rt in list(self.services.values()):
                await self._follow(rt, jobs)
                if rt.record.state is ServiceState.STOPPING:
                    await self._stopping(rt)
                    continue
                await self._decide(rt)
                await self._reconcile(rt)

    async def _follow(self, rt: ServiceRuntime, jobs: Mapping[int, Job]) -> None:
        probes: list[tuple[Replica, str]] = []
        for r in list(rt.replicas.values()):
            job = jobs.get(r.job_id)
            if job is None:
                if r.phase is not Phase.DRAINING:
                    rt.router.remove(rt.rid(r.index))
                    del rt.replicas[r.index]
                    self.ports.discard(r.port)
                    ended = await self.ctl.get(r.job_id)
                    await self._event(rt.name, "service_replica", f"replica {r.index} (job {r.job_id}) ended "
                                      f"unasked ({ended.state.value}{': ' + ended.reason if ended.reason else ''});"
                                      " replacing it", job_id=r.job_id, replica=r.index, replaced=True)
                continue
            if r.phase is Phase.DRAINING:
                continue
            if job.state is not JobState.RUNNING:
                if r.phase is Phase.READY:
                    # preempted (requeued) or being stopped by someone else: no traffic until it runs again
                    rt.router.remove(rt.rid(r.index))
                    rt.replicas[r.index] = replace(r, phase=Phase.STARTING, url=None, adopted=False)
                    await self._event(rt.name, "service_replica", f"replica {r.index} (job {r.job_id}) left "
                                      f"the router: its job is {job.state.value}", job_id=r.job_id,
                                      replica=r.index)
                continue
            if r.phase is Phase.STARTING:
                node = job.placement[0].node if job.placement else None
                url = r.url or (f"http://{self._host_of(node)}:{r.port}" if node else None)
                if url is not None:
                    rt.replicas[r.index] = r = replace(r, url=url, node=node)
                    probes.append((r, url))
        if not probes:
            return
        results = await asyncio.gather(*(self._probe(url, rt.record.spec.ready_path) for _, url in probes))
        now = self.ctl.clock.time()
        for (r, url), ok in zip(probes, results, strict=True):
            if not ok or rt.replicas.get(r.index) != r:
                continue
            launched = None if r.adopted else await self._launched(jobs[r.job_id])
            cold = None if launched is None else max(0.0, now - launched)
            rt.replicas[r.index] = replace(r, phase=Phase.READY, cold_start_s=cold)
            rt.router.add_ready(rt.rid(r.index), url)
            if cold is not None:
                rt.cold_starts.append(cold)
            said = f"cold start {cold:.1f} s" if cold is not None else "adopted"
            await self._event(rt.name, "service_replica", f"replica {r.index} (job {r.job_id}) ready on {r.node} "
                              f"({said})", job_id=r.job_id, replica=r.index, cold_start_s=cold)

    async def _launched(self, job: Job) -> float | None:
        """When the job's current attempt started (its latest run's start; a requeued replica's first start is not
        its cold start's)."""
        runs = await self.ctl.db(self.ctl.store.runs, job.id)
        starts = [r.start_time for r in runs if r.start_time is not None]
        return max(starts) if starts else job.start_time

    async def _probe(self, url: str, path: str | None) -> bool:
        try:
            return await self.probe(url, path)
        except (OSError, TimeoutError, HschedError):
            return False

    def _host_of(self, node: str) -> str:
        """Where the router reaches a replica on `node`: this machine for a local node, else the node's host."""
        rt = self.ctl.nodes.get(node)
        if rt is None or rt.config.executor in ("local", "fake"):
            return "127.0.0.1"
        return rt.config.host or node

    async def _decide(self, rt: ServiceRuntime) -> None:
        from hsched.sched.autoscale import ScalePolicy

        spec = rt.record.spec
        now = self.ctl.clock.monotonic()
        rt.samples.append(rt.router.sample())
        policy = ScalePolicy.for_window(spec.min_replicas, spec.max_replicas, spec.target_concurrency,
                                        spec.slo_p99_s, stable_window_s=spec.stable_window_s, interval_s=TICK_S)
        keep = max(policy.stable_window_s, policy.panic_window_s) + 2 * TICK_S
        while rt.samples and now - rt.samples[0].t > keep:
            rt.samples.popleft()
        current = rt.record.wanted
        decision = self.decide(policy, list(rt.samples), now, current, rt.memo, cold_start_s=rt.cold_start_s())
        rt.memo = decision.memo
        wanted = min(spec.max_replicas, max(spec.min_replicas, decision.wanted))
        rt.last_reason = decision.reason
        if wanted != current:
            way = "up" if wanted > current else "down"
            rt.record = await self.ctl.db(
                self.ctl.store.set_service, spec.name, self.ctl.clock.time(), wanted=wanted,
                event=("service_scale", f"service {spec.name}: scale {way} {current} -> {wanted}: {decision.reason}",
                       {"from": current, "to": wanted, "reason": decision.reason}))

    async def _reconcile(self, rt: ServiceRuntime) -> None:
        live = rt.live()
        wanted = rt.record.wanted
        if len(live) < wanted:
            await self._add(rt, wanted - len(live))
        elif len(live) > wanted:
            for r in self._victims(rt, len(live) - wanted):
                self._drain(rt, r, f"scaled down to {wanted}")

    def _victims(self, rt: ServiceRuntime, n: int) -> list[Replica]:
        """Which replicas go first: those not ready (nothing in flight; the newest first), then the ready ones with
        the fewest requests in flight, the newest first."""
        outstanding = _outstanding(rt.router)
        order = sorted(rt.live(), key=lambda r: (r.phase is Phase.READY, outstanding.get(rt.rid(r.index), 0),
                                                 -r.job_id))
        return order[:n]

    async def _add(self, rt: ServiceRuntime, n: int) -> None:
        rec = rt.record
        specs = []
        used = set(rt.replicas)
        index = 0
        for _ in range(n):
            while index in used:
                index += 1
            used.add(index)
            port = self._free_port()
            env = dict(rec.spec.replica.env)
            env.update({"HSCHED_SERVICE": rec.spec.name, "HSCHED_REPLICA": str(index), "HSCHED_PORT": str(port)})
            specs.append((index, port, replace(rec.spec.replica, name=f"{rec.spec.name}-{index}",
                                               env=tuple(sorted(env.items())), service=rec.spec.name, replica=index,
                                               workload=rec.spec.replica.workload or "inference", retries=0)))
        environ = await self.ctl.db(self.ctl.store.service_environ, rec.spec.name)
        try:
            jobs = await commands.submit_many(self.ctl, [s for _, _, s in specs], rec.user, environ)
        except HschedError as e:
            for _, port, _ in specs:
                self.ports.discard(port)
            await self._event(rec.spec.name, "service", f"could not add a replica: {e}")
            return
        for (index, port, _), job in zip(specs, jobs, strict=True):
            rt.replicas[index] = Replica(index, job.id, port)
        await self._event(rec.spec.name, "service_replica", "replica job(s) submitted: "
                          + ", ".join(f"{i} (job {j.id})" for (i, _, _), j in zip(specs, jobs, strict=True)))

    def _free_port(self) -> int:
        """A port free on this machine now, not handed to another replica (a remote node's port is checked by the
        readiness probe: a replica that cannot bind it never becomes ready and is replaced when it exits)."""
        for _ in range(100):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("", 0))
                port = int(s.getsockname()[1])
            if port not in self.ports:
                self.ports.add(port)
                return port
        raise HschedError("no free port for a replica")

    def _drain(self, rt: ServiceRuntime, r: Replica, why: str) -> None:
        rt.replicas[r.index] = replace(r, phase=Phase.DRAINING)
        rt.drains[r.index] = self.ctl.spawn(self._drain_then_stop(rt, r, why))

    async def _drain_then_stop(self, rt: ServiceRuntime, r: Replica, why: str) -> None:
        cut = 0
        try:
            if r.phase is Phase.READY:
                cut = await rt.router.drain(rt.rid(r.index), DRAIN_TIMEOUT_S)
            rt.router.remove(rt.rid(r.index))
            with contextlib.suppress(HschedError):
                await commands.cancel(self.ctl, r.job_id)  # pokes the round: its GPUs go back to the queue now
            said = f", {cut} request(s) cut at the {DRAIN_TIMEOUT_S:g} s drain limit" if cut else ""
            await self._event(rt.name, "service_replica", f"replica {r.index} (job {r.job_id}) drained and "
                              f"stopped ({why}){said}", job_id=r.job_id, replica=r.index, cut=cut)
        finally:
            rt.drains.pop(r.index, None)
            if rt.replicas.get(r.index, r).job_id == r.job_id:
                rt.replicas.pop(r.index, None)
            self.ports.discard(r.port)

    async def _stopping(self, rt: ServiceRuntime) -> None:
        for r in rt.live():
            self._drain(rt, r, "the service stops")
        if rt.replicas or rt.drains:
            return
        rt.record = await self.ctl.db(self.ctl.store.set_service, rt.name, self.ctl.clock.time(),
                                      state=ServiceState.STOPPED, wanted=0,
                                      event=("service", f"service {rt.name}: stopped", None))
        del self.services[rt.name]
        with contextlib.suppress(Exception):  # a router that fails to close is gone all the same
            await rt.router.close()

    # ------------------------------------------------------------------------------------------ requests

    async def start_service(self, spec: ServiceSpec, user: str, environ: dict[str, str] | None) -> dict[str, Any]:
        await self.load()
        waiting = commands._admissible(self.ctl, spec.replica)  # an impossible replica is refused now
        async with self.lock:
            rec = await self.ctl.db(self.ctl.store.add_service, spec, user, self.ctl.clock.time(), environ)
            try:
                rt = await self._open(rec, strict=True)
            except OSError as e:
                await self.ctl.db(self.ctl.store.set_service, spec.name, self.ctl.clock.time(),
                                  state=ServiceState.STOPPED, wanted=0,
                                  event=("service", f"service {spec.name}: its router could not listen: {e}", None))
                raise UserError(f"--port {spec.port}: the service's router cannot listen there ({e}); choose "
                                "another port or leave --port out") from None
            await self._reconcile(rt)  # its first replicas are queued now, not at the next tick
        out = self.report(rt)
        if waiting:
            out["note"] = waiting
        return out

    async def scale(self, name: str, lo: int, hi: int) -> dict[str, Any]:
        await self.load()
        async with self.lock:
            rt = self._get(name)
            spec = replace(rt.record.spec, min_replicas=lo, max_replicas=hi)
            wanted = min(hi, max(lo, rt.record.wanted))
            rt.record = await self.ctl.db(
                self.ctl.store.set_service, name, self.ctl.clock.time(), spec=spec, wanted=wanted,
                event=("service_scale", f"service {name}: replicas set to {lo}-{hi} (wanted {wanted})",
                       {"min": lo, "max": hi, "to": wanted}))
            await self._reconcile(rt)
            return self.report(rt)

    async def stop(self, name: str) -> dict[str, Any]:
        await self.load()
        async with self.lock:
            rt = self._get(name)
            if rt.record.state is not ServiceState.STOPPING:
                rt.record = await self.ctl.db(self.ctl.store.set_service, name, self.ctl.clock.time(),
                                              state=ServiceState.STOPPING,
                                              event=("service", f"service {name}: stopping: draining its replicas",
                                                     None))
            out = self.report(rt)
            await self._stopping(rt)
            return out

    def _get(self, name: str) -> ServiceRuntime:
        rt = self.services.get(name)
        if rt is None:
            raise UserError(f"no service {name!r} runs; `hsched serve list` lists them")
        return rt

    async def close(self) -> None:
        """The routers stop listening (the replicas' jobs go on: a restarted controller adopts them)."""
        for task in [t for rt in self.services.values() for t in rt.drains.values()]:
            task.cancel()
        for rt in self.services.values():
            with contextlib.suppress(Exception):
                await rt.router.close()

    # ------------------------------------------------------------------------------------------ reports

    def report(self, rt: ServiceRuntime) -> dict[str, Any]:
        """What `serve show --json` prints of a service (and `serve list`, `daemon status`'s `services`)."""
        spec, rec = rt.record.spec, rt.record
        host, port = rt.router.address
        phases = [r.phase for r in rt.replicas.values()]
        res = spec.replica.resources
        recent = [s for s in rt.samples if s.t >= self.ctl.clock.monotonic() - 10.0]
        span = sum(s.dt for s in recent)
        p99s = [s.p99_s for s in recent if s.p99_s is not None]
        stats = _stats(rt.router, spec.slo_p99_s)
        return {
            "name": spec.name, "user": rec.user, "state": rec.state.value,
            "address": f"http://{host}:{port}",
            "replicas": {"min": spec.min_replicas, "max": spec.max_replicas, "wanted": rec.wanted,
                         "ready": phases.count(Phase.READY), "starting": phases.count(Phase.STARTING),
                         "draining": phases.count(Phase.DRAINING)},
            "gpus_per_replica": res.gpus, "gpu_types": list(res.gpu_types), "gpu_memory_mib": res.gpu_memory_mib,
            "shared": res.shared, "qos": spec.replica.qos, "command": list(spec.replica.command),
            "slo_p99_ms": spec.slo_p99_s * 1000.0, "target_concurrency": spec.target_concurrency,
            "ready_path": spec.ready_path, "stable_window_s": spec.stable_window_s,
            "cold_start_s": round(rt.cold_start_s(), 3) if rt.cold_starts else None,
            "last_decision": rt.last_reason or None,
            "requests_per_s": round(sum(s.arrivals for s in recent) / span, 3) if span > 0 else 0.0,
            "p99_ms": round(max(p99s) * 1000.0, 1) if p99s else None,
            "slo_attainment": stats.get("slo_attainment"),
            "requests": stats.get("requests"),
            "errors": stats.get("errors"),
            "stats": stats,
            "created": iso(rec.created),
            "instances": [{"replica": r.index, "job": r.job_id, "phase": r.phase.value, "node": r.node, "url": r.url,
                           "port": r.port, "cold_start_s": r.cold_start_s}
                          for r in sorted(rt.replicas.values(), key=lambda r: r.index)],
        }

    def reports(self) -> list[dict[str, Any]]:
        return [self.report(rt) for _, rt in sorted(self.services.items())]


def _memo() -> Any:
    from hsched.sched.autoscale import ScaleMemo

    return ScaleMemo()


def _port_of(job: Job) -> int:
    try:
        return int(dict(job.spec.env).get("HSCHED_PORT", "0"))
    except ValueError:
        return 0


def _unready(rt: ServiceRuntime, rid: str) -> None:
    for r in rt.replicas.values():
        if rt.rid(r.index) == rid and r.phase is Phase.READY:
            rt.replicas[r.index] = replace(r, phase=Phase.STARTING, adopted=True)


def _ms(seconds: float | None) -> float | None:
    return round(seconds * 1000.0, 1) if seconds is not None else None


def _stats(router: RouterLike, slo_s: float) -> dict[str, Any]:
    """The router's figures (hsched.serve.router.RouterStats) as a JSON object: totals since it started, the latency
    histogram, attainment of the service's target, each replica's requests in flight."""
    from hsched.serve.router import LATENCY_BUCKETS_S

    try:
        s = router.stats()
        return {"requests": s.requests, "errors": s.errors, "unavailable": s.unavailable, "in_flight": s.in_flight,
                "answered": s.answered, "p50_ms": _ms(s.p50_s), "p99_ms": _ms(s.p99_s),
                "slo_attainment": s.attainment(slo_s),
                "latency_buckets_s": list(LATENCY_BUCKETS_S), "latency_counts": list(s.buckets),
                "latency_sum_s": round(s.latency_sum_s, 6),
                "replicas": [{"name": r.name, "url": r.base_url, "ready": r.ready, "draining": r.draining,
                              "outstanding": r.outstanding, "requests": r.requests} for r in s.replicas]}
    except Exception:  # figures are for show: a router that cannot give them still routes
        log.exception("router stats failed")
        return {}


def _outstanding(router: RouterLike) -> dict[str, int]:
    try:
        return dict(router.stats().outstanding)
    except Exception:
        return {}


def manager(ctl: Controller) -> ServiceManager:
    """The controller's service manager (made on first use)."""
    m = ctl.state.services
    if m is None:
        m = ctl.state.services = ServiceManager(ctl)
    assert isinstance(m, ServiceManager)
    return m


async def service_loop(ctl: Controller) -> None:
    """The manager's beat (started beside the controller's other loops), once the startup reconcile is done."""
    while not ctl.ready.is_set() and not ctl.stopping.is_set():
        await ctl.clock.wait(ctl.ready, 0.5)
    m = manager(ctl)
    try:
        while not ctl.stopping.is_set():
            try:
                await m.tick()
                ctl.loop_ok("services")
            except Exception as e:  # one bad beat must not stop the services; the next one retries
                log.exception("service manager failed")
                ctl.loop_failed("services", e)
            await ctl.clock.wait(ctl.stopping, TICK_S)
    finally:
        await m.close()


def summary(ctl: Controller) -> list[dict[str, Any]]:
    """`hsched daemon status --json`'s `services`."""
    m = ctl.state.services
    return m.reports() if isinstance(m, ServiceManager) else []


# ---------------------------------------------------------------------------------------------- the API


class ApiLike(Protocol):
    """What the request handler gives (hsched.controller.api.Api): who asks and what they may do."""

    ctl: Controller

    async def user_name(self, uid: int) -> str: ...
    async def is_admin(self, uid: int) -> bool: ...
    async def may_use_qos(self, uid: int, qos: str) -> None: ...
    def text(self, args: dict[str, Any], key: str, default: str | None = None, *, limit: int = ...,
             choices: tuple[str, ...] = ()) -> str | None: ...


async def request(api: ApiLike, args: dict[str, Any], uid: int) -> Any:
    """The `serve` request: `action` start (`service`: the table, `source`, `environ`), list, show (`name`),
    scale (`name`, `replicas`: "MIN-MAX"), stop (`name`). Anyone may look; a service is scaled or stopped by its
    owner, root, the controller's account and a lab's admins (as a job is cancelled)."""
    ctl = api.ctl
    m = manager(ctl)
    action = api.text(args, "action", choices=("start", "list", "show", "scale", "stop"))
    if action == "start":
        return await _start(api, m, args, uid)
    if action == "list":
        await m.load()
        return m.reports()
    name = api.text(args, "name", limit=64)
    if not name:
        raise UserError("name: required (the service's name; `hsched serve list` lists them)")
    if action == "show":
        await m.load()
        rt = m.services.get(name)
        if rt is None:
            rec = await ctl.db(ctl.store.get_service, name)
            if rec is None:
                raise UserError(f"no service {name!r}; `hsched serve list` lists them")
            return {"name": name, "user": rec.user, "state": rec.state.value,
                    "events": await ctl.db(ctl.store.service_events, name)}
        return {**m.report(rt), "events": await ctl.db(ctl.store.service_events, name)}
    await m.load()
    rt = m._get(name)
    if not (await api.is_admin(uid) or await api.user_name(uid) == rt.record.user):
        raise PermissionDenied(f"permission denied: service {name} belongs to {rt.record.user}")
    if action == "scale":
        lo, hi = parse_replicas(api.text(args, "replicas") or "", "replicas")
        return await m.scale(name, lo, hi)
    if action == "stop":
        return await m.stop(name)
    raise UserError(f"action: expected start, list, show, scale or stop, found {action!r}")


async def _start(api: ApiLike, m: ServiceManager, args: dict[str, Any], uid: int) -> dict[str, Any]:
    from hsched.config import beyond_limits, job_spec_from_table
    from hsched.spec.service import service_from_table, split_table

    ctl = api.ctl
    table = args.get("service")
    if not isinstance(table, dict):
        raise UserError("service: expected a service table (hsched serve start NAME ... -- CMD)")
    source = api.text(args, "source", "<command line>", limit=4096) or "<command line>"
    environ = args.get("environ")
    if environ is not None and not (isinstance(environ, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in environ.items())):
        raise UserError("environ: expected an object of strings")
    own, job_table = split_table(table)
    settings = ctl.settings
    replica = job_spec_from_table(job_table, source, settings.qos_names, settings.default_qos)
    over = [f"{source}: {line}" for line in beyond_limits(replica, settings)]
    if over:
        raise UserError(over[0], problems=over)
    spec = service_from_table(own, replica, source)
    if 0 < spec.port < 1024 and not await api.is_admin(uid):
        # a lab's controller may run as root: a member must not take a system port through it
        raise PermissionDenied(f"permission denied: port {spec.port} is below 1024, for root and the lab's admins; "
                               "choose a port from 1024 up or leave --port out")
    await api.may_use_qos(uid, replica.qos)
    user = await api.user_name(uid)  # the kernel's word (SO_PEERCRED), never the request's
    return await m.start_service(spec, user, environ)
