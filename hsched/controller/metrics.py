"""Metrics for Prometheus (OpenMetrics text), with the standard client library (prometheus-client).

    metrics = "127.0.0.1:9464"        # settings.toml; off by default

What a scrape reads is a snapshot taken on the controller's event loop (nodes, GPUs, jobs from the store),
rendered at most every SNAPSHOT_TTL_S: the HTTP server runs in a thread of its own and never touches the
store or the controller's state itself, so a scraper hammering the endpoint costs the scheduling loop one
small snapshot and one render per TTL. Round latencies and preemptions are counted as they happen.

Names follow the client library's conventions: `hsched_` prefix, base units in the name, `_total` counters.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from hsched.controller.core import Controller
from hsched.model import JobState, NodeState

log = logging.getLogger("hsched.metrics")

SNAPSHOT_TTL_S = 1.0
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


_RECORDERS: weakref.WeakKeyDictionary[Controller, Recorder] = weakref.WeakKeyDictionary()


def recorder(ctl: Controller) -> Recorder:
    """The controller's recorder (one per controller; tests run several in one process)."""
    rec = _RECORDERS.get(ctl)
    if rec is None:
        rec = _RECORDERS[ctl] = Recorder()
    return rec


async def take_snapshot(ctl: Controller) -> Snapshot:
    """Nodes, GPUs and jobs as they are now (on the event loop; the store through its thread)."""
    active = await ctl.db(ctl.store.jobs, states=[s for s in JobState if not s.is_terminal()])
    owners = ctl.owners([j for j in active if j.state.is_active()])
    gpus = tuple(
        GpuSample(node=rt.name, uuid=d.uuid, index=d.index, model=d.model, utilization=d.utilization_gpu,
                  memory_used_mib=d.memory_used_mib, memory_total_mib=d.memory_total_mib, power_w=d.power_w,
                  temperature_c=d.temperature_c, job=owners.get(d.uuid))
        for rt in ctl.nodes.values() for d in rt.node.devices)
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

    labels = ["node", "gpu", "uuid", "model", "job"]
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
            lv = [g.node, str(g.index), g.uuid, g.model, "" if g.job is None else str(g.job)]
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
        return families(snap, rec)


def render(ctl: Controller, snap: Snapshot | None) -> bytes:
    """The exposition text of one scrape (what `hsched metrics` prints)."""
    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry(auto_describe=False)

    class Once:
        def collect(self) -> Iterator[Any]:
            return families(snap, recorder(ctl))

    reg.register(Once())
    return bytes(generate_latest(reg))


def parse_address(text: str) -> tuple[str, int]:
    """'127.0.0.1:9464', ':9464' (localhost), '[::1]:9464' -> (host, port); ValueError naming the form."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:  # 0: any free port (tests)
        raise ValueError("HOST:PORT such as 127.0.0.1:9464")
    return (host.strip("[]") or "127.0.0.1"), int(port)


class _Cache:
    """The exposition text of the last scrape, rendered again at most every SNAPSHOT_TTL_S: a scraper asking a
    hundred times a second costs one render a second, not a hundred (each is ~2 ms of Python, under the GIL
    the event loop needs)."""

    def __init__(self, registry: Any) -> None:
        self.registry = registry
        self.lock = threading.Lock()
        self.body = b""
        self.at = float("-inf")

    def get(self) -> bytes:
        from prometheus_client import generate_latest

        with self.lock:
            if time.monotonic() - self.at > SNAPSHOT_TTL_S:
                self.body = bytes(generate_latest(self.registry))
                self.at = time.monotonic()
            return self.body


@dataclass
class MetricsServer:
    server: Any
    thread: Any

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve(ctl: Controller, address: str, loop: asyncio.AbstractEventLoop) -> MetricsServer:
    """Start the endpoint in a thread of its own; `close()` it when the controller stops."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

    host, port = parse_address(address)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Collector(ctl, loop))
    cache = _Cache(reg)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] not in ("/", "/metrics"):
                self.send_error(404, "try /metrics")
                return
            body = cache.get()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE_LATEST)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return  # a scrape a second is not news for the controller's log

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="hsched-metrics", daemon=True)
    thread.start()
    log.info("metrics on http://%s:%d/metrics", host, server.server_address[1])
    return MetricsServer(server, thread)


def note_round(ctl: Controller, seconds: float, preemptions: int) -> None:
    rec = recorder(ctl)
    rec.observe_round(seconds)
    rec.preemptions += preemptions

