"""Metrics for Prometheus (OpenMetrics text), with the standard client library (prometheus-client).

    metrics = "127.0.0.1:9464"        # settings.toml; off by default

What a scrape reads is a snapshot taken on the controller's event loop (nodes, GPUs, jobs from the store),
rendered at most every SNAPSHOT_TTL_S: the HTTP server runs in a thread of its own and never touches the
store or the controller's state itself, so a scraper hammering the endpoint costs the scheduling loop one
small snapshot and one render per TTL. Round latencies and preemptions are counted as they happen. The server
is two threads whatever comes (an event loop of its own and one renderer), with a bounded number of
connections, each closed when idle (issue 27: a thread per connection was 1,009 threads for 1,000 idle ones).

Names follow the client library's conventions: `hsched_` prefix, base units in the name, `_total` counters.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from hsched.controller.core import Controller
from hsched.controller.state import ROUND_BUCKETS_S, GpuSample, Recorder, Snapshot
from hsched.model import JobState, NodeState
from hsched.serve.router import LATENCY_BUCKETS_S, RouterStats

log = logging.getLogger("hsched.metrics")

SNAPSHOT_TTL_S = 1.0


def recorder(ctl: Controller) -> Recorder:
    """The controller's recorder (one per controller; tests run several in one process)."""
    return ctl.state.metrics


async def take_snapshot(ctl: Controller) -> Snapshot:
    """Nodes, GPUs and jobs as they are now (on the event loop; the store through its thread)."""
    active = await ctl.db(ctl.store.jobs, states=[s for s in JobState if not s.is_terminal()])
    owners = ctl.owners([j for j in active if j.state.is_active()])
    by_id = {j.id: j for j in active}

    def holder(uuid: str) -> tuple[int | None, str | None, str | None]:
        jid = owners.get(uuid)
        j = by_id.get(jid) if jid is not None else None
        return jid, (j.user if j is not None else None), (j.spec.qos if j is not None else None)

    gpus = tuple(
        GpuSample(node=rt.name, uuid=d.uuid, index=d.index, model=d.model, utilization=d.utilization_gpu,
                  memory_used_mib=d.memory_used_mib, memory_total_mib=d.memory_total_mib, power_w=d.power_w,
                  temperature_c=d.temperature_c, job=jid, user=user, qos=qos)
        for rt in ctl.nodes.values() for d in rt.node.devices for jid, user, qos in (holder(d.uuid),))
    counts: dict[tuple[str, str], int] = {}
    oldest: dict[str, float] = {}
    now = ctl.clock.time()
    for j in active:
        key = (j.state.value, j.spec.qos)
        counts[key] = counts.get(key, 0) + 1
        if j.state is JobState.PENDING:
            oldest[j.spec.qos] = max(oldest.get(j.spec.qos, 0.0), now - j.submit_time)
    return Snapshot(taken=time.monotonic(), gpus=gpus,
                    nodes=tuple((rt.name, rt.node.state.value) for rt in ctl.nodes.values()),
                    jobs=tuple((s, q, n) for (s, q), n in sorted(counts.items())),
                    pending_wait_s=tuple(sorted(oldest.items())))


def families(snap: Snapshot | None, rec: Recorder) -> Iterator[Any]:
    """The metric families of one scrape (prometheus-client's core types)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    # `job_id`, not `job`: Prometheus keeps `job` for the scrape job's name and renames a target's own to
    # `exported_job`, which left dashboards built on `job` counting nothing
    labels = ["node", "gpu", "uuid", "model", "job_id", "user", "qos"]
    util = GaugeMetricFamily("hsched_gpu_utilization_ratio", "GPU busy fraction (0-1)", labels=labels)
    used = GaugeMetricFamily("hsched_gpu_memory_used_bytes", "GPU memory in use", labels=labels)
    total = GaugeMetricFamily("hsched_gpu_memory_total_bytes", "GPU memory size", labels=labels)
    power = GaugeMetricFamily("hsched_gpu_power_watts", "GPU power draw", labels=labels)
    temp = GaugeMetricFamily("hsched_gpu_temperature_celsius", "GPU temperature", labels=labels)
    node_up = GaugeMetricFamily("hsched_node_state", "1 for the node's current state", labels=["node", "state"])
    jobs = GaugeMetricFamily("hsched_jobs", "Jobs not ended, by state and QoS class", labels=["state", "qos"])
    wait = GaugeMetricFamily("hsched_pending_oldest_wait_seconds", "How long the oldest pending job has waited",
                             labels=["qos"])
    if snap is not None:
        for g in snap.gpus:
            lv = [g.node, str(g.index), g.uuid, g.model, "" if g.job is None else str(g.job), g.user or "", g.qos or ""]
            if g.utilization is not None:
                util.add_metric(lv, g.utilization / 100.0)
            if g.memory_used_mib is not None:
                used.add_metric(lv, g.memory_used_mib * 1024 * 1024)
            if g.memory_total_mib is not None:
                total.add_metric(lv, g.memory_total_mib * 1024 * 1024)
            if g.power_w is not None:
                power.add_metric(lv, g.power_w)
            if g.temperature_c is not None:
                temp.add_metric(lv, g.temperature_c)
        for name, state in snap.nodes:
            for s in NodeState:
                node_up.add_metric([name, s.value], 1.0 if s.value == state else 0.0)
        for state, qos, n in snap.jobs:
            jobs.add_metric([state, qos], n)
        for qos, seconds in snap.pending_wait_s:
            wait.add_metric([qos], seconds)
    yield from (util, used, total, power, temp, node_up, jobs, wait)
    cumulative, acc = [], 0
    for bound, n in zip((*map(str, ROUND_BUCKETS_S), "+Inf"), rec.buckets, strict=True):
        acc += n
        cumulative.append((bound, acc))
    hist = HistogramMetricFamily("hsched_round_duration_seconds", "Scheduling round latency",
                                 buckets=cumulative, sum_value=rec.round_sum_s)
    yield hist
    pre = CounterMetricFamily("hsched_preemptions", "Preemptions decided by the scheduler")
    pre.add_metric([], rec.preemptions)
    yield pre
    moved = CounterMetricFamily("hsched_moves", "Running jobs moved to faster GPUs by the policy (preemptions too)")
    moved.add_metric([], rec.moves)
    yield moved
    copies = CounterMetricFamily("hsched_data_copies", "Dataset copies to nodes that ended, by outcome",
                                 labels=["outcome"])
    for outcome in ("copied", "failed"):
        copies.add_metric([outcome], rec.data_copies.get(outcome, 0))
    yield copies
    moved_bytes = CounterMetricFamily("hsched_data_copied_bytes", "Bytes dataset copies moved between nodes")
    moved_bytes.add_metric([], rec.data_bytes)
    yield moved_bytes
    copy_s = CounterMetricFamily("hsched_data_copy_seconds", "Seconds dataset copies took (those that ended well)")
    copy_s.add_metric([], rec.data_copy_s)
    yield copy_s


class _Collector:
    """Reads the controller's recorder and its latest snapshot, asking the event loop for a fresh one when
    the last is older than SNAPSHOT_TTL_S (and waiting for it at most a second)."""

    def __init__(self, ctl: Controller, loop: asyncio.AbstractEventLoop) -> None:
        self.ctl = weakref.ref(ctl)
        self.loop = loop

    def collect(self) -> Iterator[Any]:
        ctl = self.ctl()
        if ctl is None:
            return iter(())
        rec = recorder(ctl)
        snap = rec.snapshot
        if snap is None or time.monotonic() - snap.taken > SNAPSHOT_TTL_S:
            try:
                snap = rec.snapshot = asyncio.run_coroutine_threadsafe(take_snapshot(ctl), self.loop).result(1.0)
            except Exception as e:  # a busy or stopping controller: serve the last snapshot, not an error page
                log.debug("metrics snapshot: %s", e)
        if _SERVICE_SOURCES.get(ctl) is not None or getattr(ctl.state.services, "services", None):
            try:  # on the controller's loop, where the routers change their counters
                self.services = asyncio.run_coroutine_threadsafe(_read_services(ctl), self.loop).result(1.0)
            except Exception as e:
                log.debug("metrics services: %s", e)
        return self._with_services(families(snap, rec))

    services: Sequence[ServiceReading] = ()

    def _with_services(self, base: Iterator[Any]) -> Iterator[Any]:
        yield from base
        yield from service_families(self.services)


def render(ctl: Controller, snap: Snapshot | None) -> bytes:
    """The exposition text of one scrape (what `hsched metrics` prints)."""
    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry(auto_describe=False)

    readings = service_readings(ctl)

    class Once:
        def collect(self) -> Iterator[Any]:
            yield from families(snap, recorder(ctl))
            yield from service_families(readings)

    reg.register(Once())
    return bytes(generate_latest(reg))


def parse_address(text: str) -> tuple[str, int]:
    """'127.0.0.1:9464', ':9464' (localhost), '[::1]:9464' -> (host, port); ValueError naming the form."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:  # 0: any free port (tests)
        raise ValueError("HOST:PORT such as 127.0.0.1:9464")
    return (host.strip("[]") or "127.0.0.1"), int(port)


class _Cache:
    """The exposition text of the last scrape, per format, rendered again at most every SNAPSHOT_TTL_S: a scraper
    asking a hundred times a second costs one render a second, not a hundred (each is ~2 ms of Python, under the
    GIL the event loop needs). The format is prometheus-client's choice for the scraper's Accept header (its
    `choose_encoder`): the text format, or OpenMetrics when asked for it."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry
        self.lock = threading.Lock()
        self.bodies: dict[str, tuple[float, bytes]] = {}

    def get(self, accept: str = "") -> tuple[bytes, str]:
        """(body, its content type) for a request's Accept header."""
        from prometheus_client.exposition import choose_encoder

        encoder, content_type = choose_encoder(accept)
        with self.lock:
            at, body = self.bodies.get(content_type, (float("-inf"), b""))
            if time.monotonic() - at > SNAPSHOT_TTL_S:
                body = bytes(encoder(self.registry))
                self.bodies[content_type] = (time.monotonic(), body)
            return body, content_type


METRICS_CONNECTIONS = 128
"""Connections the endpoint holds at once: past it, the one idle longest is closed for the newcomer (a scraper that
just connected is served; a thousand idle connections cost the oldest of them their place, not a thread each)."""
METRICS_IDLE_S = 10.0
"""A connection that sends no whole request head for this long (or reads no reply) is closed."""
METRICS_MAX_HEAD = 8192
"""The longest request head (request line and headers) read; a longer one is answered 431 and closed."""
METRICS_BACKLOG = 512
"""Connections the kernel queues for the endpoint: past a full queue a client's SYN is dropped and retried a second
later, so a burst of idle connections would otherwise keep a scraper waiting seconds before it is even accepted."""


class Endpoint:
    """The HTTP endpoint: one event loop of its own, in one thread, and one worker thread that renders (a render
    waits up to a second for the controller's loop): two threads however many connections come, each connection a
    coroutine with a deadline. GET (or HEAD) / or /metrics; keep-alive as HTTP/1.1 has it."""

    def __init__(self, listener: Any, body: Any, *, connections: int = METRICS_CONNECTIONS,
                 idle_s: float = METRICS_IDLE_S) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.listener = listener
        self.server_address = listener.getsockname()
        self.body = body
        self.connections = connections
        self.idle_s = idle_s
        self.loop = asyncio.new_event_loop()
        self.renderer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hsched-metrics-render")
        self.idle: dict[asyncio.Task[Any], Any] = {}
        """Connections waiting for a request (oldest first: dicts keep order), and their writers."""
        self.open: set[asyncio.Task[Any]] = set()
        self._stop: asyncio.Event | None = None

    def run(self) -> None:
        """The thread's body: serve until shutdown()."""
        try:
            self.loop.run_until_complete(self._main())
        finally:
            self.loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._serve, sock=self.listener, limit=METRICS_MAX_HEAD,
                                            backlog=METRICS_BACKLOG)
        try:
            await self._stop.wait()
        finally:
            server.close()
            for task in list(self.open):
                task.cancel()
            await asyncio.gather(*self.open, return_exceptions=True)
            await server.wait_closed()

    def shutdown(self) -> None:
        """Stop serving (from any thread)."""
        def stop() -> None:
            if self._stop is not None:
                self._stop.set()

        with contextlib.suppress(RuntimeError):  # the loop already closed
            self.loop.call_soon_threadsafe(stop)

    def server_close(self) -> None:
        self.renderer.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(OSError):
            self.listener.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self.open) >= self.connections:
            if not self.idle:
                writer.close()  # every place is in a request: this one waits for none
                return
            oldest = next(iter(self.idle))
            self.idle.pop(oldest).close()
            oldest.cancel()
        self.open.add(task)
        try:
            while True:
                self.idle[task] = writer
                try:
                    async with asyncio.timeout(self.idle_s):
                        head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.LimitOverrunError:
                    await self._reply(writer, 431, b"request head too large\n", close=True)
                    return
                except (TimeoutError, asyncio.IncompleteReadError):
                    return
                finally:
                    self.idle.pop(task, None)
                if not await self._answer(head, writer):
                    return
        except (ConnectionError, TimeoutError, asyncio.CancelledError):
            return
        finally:
            self.open.discard(task)
            self.idle.pop(task, None)
            with contextlib.suppress(Exception):
                writer.close()

    async def _answer(self, head: bytes, writer: asyncio.StreamWriter) -> bool:
        """Answer one request head; whether the connection stays open for the next."""
        line, _, headers = head.decode("latin-1").partition("\r\n")
        parts = line.split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            await self._reply(writer, 400, b"bad request\n", close=True)
            return False
        method, target, version = parts
        fields = {k.strip().lower(): v.strip().lower()
                  for k, _, v in (h.partition(":") for h in headers.split("\r\n")) if k}
        close = fields.get("connection") == "close" or (version == "HTTP/1.0"
                                                         and fields.get("connection") != "keep-alive")
        if "content-length" in fields or "transfer-encoding" in fields:
            close = True  # a body this endpoint never reads: the connection cannot carry a next request
        if method not in ("GET", "HEAD"):
            await self._reply(writer, 405, b"GET /metrics\n", close=True)
            return False
        if target.split("?", 1)[0] not in ("/", "/metrics"):
            await self._reply(writer, 404, b"try /metrics\n", close=close)
            return not close
        # (header names are lowered above, and so are values: Accept's media types are case-insensitive)
        body, content_type = await asyncio.get_running_loop().run_in_executor(self.renderer, self.body,
                                                                              fields.get("accept", ""))
        await self._reply(writer, 200, body, close=close, content_type=content_type, head=method == "HEAD")
        return not close

    async def _reply(self, writer: asyncio.StreamWriter, status: int, body: bytes, *, close: bool,
                     content_type: str = "text/plain; charset=utf-8", head: bool = False) -> None:
        from http import HTTPStatus

        lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", f"Content-Type: {content_type}",
                 f"Content-Length: {len(body)}", f"Connection: {'close' if close else 'keep-alive'}", "", ""]
        writer.write("\r\n".join(lines).encode("latin-1") + (b"" if head else body))
        async with asyncio.timeout(self.idle_s):  # a scraper that reads nothing does not hold its place for ever
            await writer.drain()


@dataclass
class MetricsServer:
    server: Endpoint
    thread: Any

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join(timeout=5)
        self.server.server_close()


def serve(ctl: Controller, address: str, loop: asyncio.AbstractEventLoop) -> MetricsServer:
    """Start the endpoint in a thread of its own; `close()` it when the controller stops. OSError when the address
    cannot be bound (a port in use)."""
    import socket

    from prometheus_client import CollectorRegistry

    host, port = parse_address(address)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Collector(ctl, loop))
    cache = _Cache(reg)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(METRICS_BACKLOG)
        listener.setblocking(False)
    except OSError:
        listener.close()
        raise
    endpoint = Endpoint(listener, cache.get)
    thread = threading.Thread(target=endpoint.run, name="hsched-metrics", daemon=True)
    thread.start()
    log.info("metrics on http://%s:%d/metrics", host, endpoint.server_address[1])
    return MetricsServer(endpoint, thread)


def note_round(ctl: Controller, seconds: float, preemptions: int) -> None:
    rec = recorder(ctl)
    rec.observe_round(seconds)
    rec.preemptions += preemptions



# ------------------------------------------------------------------------------------------------ services


@dataclass(frozen=True, slots=True)
class ServiceReading:
    """One service as a scrape shows it: its router's stats and how many replicas the autoscaler wants."""

    name: str
    stats: RouterStats
    wanted: int


ServiceSource = Callable[[], Sequence[ServiceReading]]

_SERVICE_SOURCES: weakref.WeakKeyDictionary[Controller, ServiceSource] = weakref.WeakKeyDictionary()
"""Per controller, what reads its services (the service manager registers it; tests run several controllers)."""


def watch_services(ctl: Controller, source: ServiceSource) -> None:
    """Have the controller's scrapes show its services: source() is called on the controller's event loop (each
    router's stats() and the replicas wanted) at every scrape."""
    _SERVICE_SOURCES[ctl] = source


def service_readings(ctl: Controller) -> Sequence[ServiceReading]:
    """The services' readings now (on the controller's loop): from the source registered with watch_services, else
    from the controller's service manager (ctl.state.services: each service's router and replicas wanted; read
    by duck type, because hsched.controller.services imports what imports this module)."""
    source = _SERVICE_SOURCES.get(ctl)
    if source is not None:
        return source()
    out = []
    for rt in list(getattr(ctl.state.services, "services", {}).values()):
        stats = rt.router.stats()
        if isinstance(stats, RouterStats):  # (a test's stand-in router has other stats)
            out.append(ServiceReading(rt.name, stats, int(rt.record.wanted)))
    return out


async def _read_services(ctl: Controller) -> Sequence[ServiceReading]:
    return service_readings(ctl)


def service_families(services: Sequence[ServiceReading]) -> Iterator[Any]:
    """Per service: requests and errors (counters), the latency histogram (arrival at the router to the last byte),
    requests in flight, replicas ready and wanted, SLO attainment (requests within the target, of all)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    requests = CounterMetricFamily("hsched_service_requests", "Requests the service's router ended, by outcome",
                                   labels=["service", "outcome"])
    latency = HistogramMetricFamily("hsched_service_request_duration_seconds",
                                    "Request latency at the service's router, arrival to last byte",
                                    labels=["service"])
    in_flight = GaugeMetricFamily("hsched_service_requests_in_flight", "Requests at the router now",
                                  labels=["service"])
    replicas = GaugeMetricFamily("hsched_service_replicas", "Replicas ready (taking traffic) and wanted",
                                 labels=["service", "state"])
    slo = GaugeMetricFamily("hsched_service_slo_attainment_ratio",
                            "Requests answered within the service's latency objective, of all it ended",
                            labels=["service"])
    target = GaugeMetricFamily("hsched_service_slo_seconds", "The service's latency objective (p99)",
                               labels=["service"])
    for s in services:
        st = s.stats
        requests.add_metric([s.name, "answered"], st.requests - st.errors)
        requests.add_metric([s.name, "error"], st.errors)
        cumulative, acc = [], 0
        for bound, n in zip((*map(str, LATENCY_BUCKETS_S), "+Inf"), st.buckets, strict=True):
            acc += n
            cumulative.append((bound, acc))
        latency.add_metric([s.name], cumulative, sum_value=st.latency_sum_s)
        in_flight.add_metric([s.name], st.in_flight)
        replicas.add_metric([s.name, "ready"], st.ready)
        replicas.add_metric([s.name, "wanted"], s.wanted)
        if (att := st.attainment()) is not None:
            slo.add_metric([s.name], att)
        if st.slo_s is not None:
            target.add_metric([s.name], st.slo_s)
    yield from (requests, latency, in_flight, replicas, slo, target)
