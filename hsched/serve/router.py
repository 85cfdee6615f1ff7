"""A service's one address: an asyncio HTTP proxy (aiohttp) in front of its ready replicas, and what it measures.

Every request goes to the ready replica with the fewest requests outstanding (ties taken in turn), so a slow
replica gets less; the response streams back as it comes (chunked or sized bodies alike). The router measures
what the autoscaler decides on (`hsched.sched.autoscale.Sample`): requests in flight integrated over time (so an
interval's concurrency is exact, not a reading at its end), arrivals, and the p99 of the requests that finished in
the interval; and what a person reads (`RouterStats`): totals, a latency histogram with fixed buckets as
Prometheus has them, per-replica outstanding requests, attainment of a latency target.

A request counts from its arrival at the router to its last byte sent back, waits included: a client waiting for
a replica to become ready (scale from zero) is load the autoscaler must see.

What the router promises:
- `drain(replica)` sends it nothing new and returns when its in-flight requests have finished; nothing is cut.
- No ready replica: a request waits up to `wait_ready_s` for one (a replica starting) and then gets 503 with
  `Retry-After`. That is the only 503 the router makes itself.
- A replica that refuses or resets the connection before answering anything is marked not ready and the request
  goes once to another one. Request bodies are read whole before forwarding for that reason (inference requests
  are small); once a byte of the response went back, an upstream failure aborts the client's connection instead.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from hsched.sched.autoscale import Sample

log = logging.getLogger("hsched.serve.router")

LATENCY_BUCKETS_S: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5,
                                        0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)
"""Upper bounds of the latency histogram (seconds; the last bucket, +Inf, is implied). Finer between 50 ms and
1 s, where latency objectives of interactive services lie, so that quantiles read from it are close."""

HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                        "trailers", "transfer-encoding", "upgrade", "proxy-connection"})
"""Headers that belong to one connection (RFC 9110 7.6.1), never forwarded; plus the ones `Connection` names."""

WAIT_READY_S = 5.0
"""How long a request waits for a replica when none is ready (a replica starting) before its 503."""
RETRY_AFTER_S = 1
"""Retry-After of that 503, in whole seconds."""
CONNECT_TIMEOUT_S = 5.0
"""Connecting to a replica on the same machine or network: longer is a replica that is not there."""


class NoReplica(Exception):
    """No ready replica within the wait."""


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    name: str
    base_url: str
    ready: bool
    """Taking new requests (not draining, not marked down after a refused connection)."""
    draining: bool
    outstanding: int
    requests: int
    """Requests it answered (or started answering)."""


@dataclass(frozen=True, slots=True)
class RouterStats:
    """A consistent reading of the router: totals since it started."""

    name: str
    requests: int
    """Requests answered by a replica (whatever its status) or by the router's own 503/502."""
    errors: int
    """Of them, the ones that failed at the router: 503 (no replica ready), 502 (a replica failed), cut mid-body."""
    unavailable: int
    """Of the errors, the 503s for want of a ready replica."""
    in_flight: int
    buckets: tuple[int, ...]
    """Latency counts per bucket (not cumulative), one per LATENCY_BUCKETS_S bound and a last one for +Inf; only
    requests a replica answered."""
    latency_sum_s: float
    slo_s: float | None
    """The latency target attainment is measured against (Router.slo_s), None when not set."""
    within_slo: int
    """Requests a replica answered within slo_s (counted exactly as they finish)."""
    replicas: tuple[ReplicaStats, ...]

    @property
    def answered(self) -> int:
        return sum(self.buckets)

    @property
    def ready(self) -> int:
        return sum(1 for r in self.replicas if r.ready)

    @property
    def outstanding(self) -> dict[str, int]:
        return {r.name: r.outstanding for r in self.replicas}

    @property
    def p50_s(self) -> float | None:
        return quantile(self.buckets, 0.50)

    @property
    def p99_s(self) -> float | None:
        return quantile(self.buckets, 0.99)

    def attainment(self, target_s: float | None = None) -> float | None:
        """The fraction of requests answered within target_s (all requests, errors counted as misses). Exact for
        the router's own slo_s; for another target read from the histogram (a bucket bound counts whole, between
        bounds interpolated). None before any request."""
        if self.requests == 0:
            return None
        if target_s is None or target_s == self.slo_s:
            if self.slo_s is None:
                return None
            return self.within_slo / self.requests
        return within(self.buckets, target_s) / self.requests


def quantile(buckets: tuple[int, ...] | list[int], q: float) -> float | None:
    """The q-quantile of a histogram as Prometheus's histogram_quantile reads it: linear inside the bucket it
    falls in (the first bucket from 0); a quantile in +Inf answers the highest finite bound."""
    total = sum(buckets)
    if total == 0:
        return None
    rank = q * total
    acc = 0
    for n, count in enumerate(buckets):
        if acc + count >= rank and count > 0:
            if n >= len(LATENCY_BUCKETS_S):
                return LATENCY_BUCKETS_S[-1]
            lo = LATENCY_BUCKETS_S[n - 1] if n > 0 else 0.0
            hi = LATENCY_BUCKETS_S[n]
            return lo + (hi - lo) * (rank - acc) / count
        acc += count
    return LATENCY_BUCKETS_S[-1]


def within(buckets: tuple[int, ...] | list[int], target_s: float) -> float:
    """How many of a histogram's requests took at most target_s (interpolated inside a bucket)."""
    acc = 0.0
    lo = 0.0
    for n, count in enumerate(buckets):
        hi = LATENCY_BUCKETS_S[n] if n < len(LATENCY_BUCKETS_S) else math.inf
        if target_s >= hi:
            acc += count
        else:
            if target_s > lo and hi != math.inf:
                acc += count * (target_s - lo) / (hi - lo)
            break
        lo = hi
    return acc


def exact_quantile(values: list[float], q: float) -> float | None:
    """The nearest-rank q-quantile of the values (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass(slots=True)
class _Replica:
    name: str
    base_url: str
    ready: bool = True
    draining: bool = False
    outstanding: int = 0
    requests: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while nothing is outstanding (what drain waits for)."""

    def __post_init__(self) -> None:
        self.idle.set()


class Router:
    """The proxy of one service. Runs on the caller's event loop (the controller's): start(), then add_ready()
    replicas as their readiness checks pass; drain() and remove() them before they are stopped."""

    def __init__(self, name: str, *, host: str = "127.0.0.1", port: int = 0,
                 clock: Callable[[], float] = time.monotonic, wait_ready_s: float = WAIT_READY_S,
                 retry_after_s: int = RETRY_AFTER_S, slo_s: float | None = None,
                 max_ongoing: int | None = None) -> None:
        self.name = name
        self.host = host
        self.port = port
        self.clock = clock
        self.wait_ready_s = wait_ready_s
        self.retry_after_s = retry_after_s
        self.slo_s = slo_s
        """The latency target attainment counts against (set it before traffic: earlier requests are not
        recounted)."""
        self.max_ongoing = max_ongoing
        """At most this many requests outstanding at one replica (Ray Serve's max_ongoing_requests); more wait at
        the router, first come first served, for the first replica with room, a new one included. None: no limit
        (every request goes to a replica at once, and waits in its own queue beyond its batch)."""
        self.on_unready: Callable[[str], None] | None = None
        """Called with a replica's name when the router marks it not ready (a refused or reset connection), so
        that the service manager checks it again."""
        self._replicas: dict[str, _Replica] = {}
        self._turn = itertools.count()
        self._waiters: dict[asyncio.Future[None], None] = {}
        """Requests waiting for a replica (or for room at one), oldest first."""
        self._runner: web.ServerRunner | None = None
        self._site: web.TCPSite | None = None
        self._session: aiohttp.ClientSession | None = None
        self._address: tuple[str, int] | None = None
        # totals
        self._requests = 0
        self._errors = 0
        self._unavailable = 0
        self._buckets = [0] * (len(LATENCY_BUCKETS_S) + 1)
        self._latency_sum = 0.0
        self._within = 0
        # the current measurement interval
        self._in_flight = 0
        self._since = clock()
        self._changed = self._since
        self._area = 0.0
        self._arrivals = 0
        self._finished: list[float] = []

    # ------------------------------------------------------------------------------------------ life

    async def start(self) -> None:
        server = web.Server(self._handle, handler_cancellation=True)
        self._runner = web.ServerRunner(server, handle_signals=False)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, self.host, self.port, backlog=1024)
        await self._site.start()
        host, port = self._runner.addresses[0][:2]
        self._address = (host, port)
        # one pool for every replica; no total timeout (a generation may stream for minutes), a bounded connect
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, enable_cleanup_closed=False),
            timeout=aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT_S),
            auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar())
        log.info("router %s on http://%s:%d", self.name, host, port)

    @property
    def address(self) -> tuple[str, int]:
        if self._address is None:
            raise RuntimeError(f"router {self.name} is not started")
        return self._address

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}"

    async def close(self) -> None:
        for w in self._waiters:
            if not w.done():
                w.set_exception(NoReplica())
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------------------------------------ replicas

    def add_ready(self, replica: str, base_url: str) -> None:
        r = self._replicas.get(replica)
        if r is None:
            r = self._replicas[replica] = _Replica(replica, base_url.rstrip("/"))
        r.base_url, r.ready, r.draining = base_url.rstrip("/"), True, False
        self._wake()

    async def drain(self, replica: str, timeout_s: float) -> int:
        r = self._replicas.get(replica)
        if r is None:
            return 0
        r.draining = True
        self._wake()  # those queued for room re-check what is left (none ready: their wait for one starts)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await r.idle.wait()
        return r.outstanding

    def remove(self, replica: str) -> None:
        self._replicas.pop(replica, None)
        self._wake()

    def _wake(self) -> None:
        """Every waiter tries again, oldest first (futures' callbacks run in the order they were resolved)."""
        for w in self._waiters:
            if not w.done():
                w.set_result(None)

    def _pick(self, exclude: str | None) -> _Replica | None:
        """The ready replica with the fewest outstanding requests; ties in turn."""
        ready = [r for r in self._replicas.values() if r.ready and not r.draining and r.name != exclude
                 and (self.max_ongoing is None or r.outstanding < self.max_ongoing)]
        if not ready:
            return None
        fewest = min(r.outstanding for r in ready)
        tied = [r for r in ready if r.outstanding == fewest]
        return tied[next(self._turn) % len(tied)]

    def _any_ready(self, exclude: str | None) -> bool:
        return any(r.ready and not r.draining and r.name != exclude for r in self._replicas.values())

    async def _choose(self, exclude: str | None) -> _Replica:
        """A replica for the request: at once when one has room and nobody waits before it; else wait for room
        (as long as it takes while some replica is ready: the request is queued, not refused) or, while none is
        ready, up to wait_ready_s for one (NoReplica after)."""
        if (self.max_ongoing is None or not self._waiters) and (r := self._pick(exclude)) is not None:
            return r
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_ready_s
        while True:
            if self._any_ready(exclude):
                deadline = loop.time() + self.wait_ready_s  # queued behind busy replicas: no deadline runs
            left = deadline - loop.time()
            if left <= 0:
                raise NoReplica()
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters[waiter] = None
            try:
                async with asyncio.timeout(left):
                    await waiter
            except TimeoutError:
                if not self._any_ready(exclude):
                    raise NoReplica() from None
                continue
            finally:
                self._waiters.pop(waiter, None)
            if (r := self._pick(exclude)) is not None:
                return r

    # ------------------------------------------------------------------------------------------ measuring

    def _move(self, delta: int) -> None:
        """In-flight requests change by delta now: the area under the in-flight curve grows up to now first."""
        now = self.clock()
        self._area += self._in_flight * (now - self._changed)
        self._changed = now
        self._in_flight += delta

    def _finish(self, latency: float, *, answered: bool) -> None:
        self._requests += 1
        if not answered:
            self._errors += 1
            return
        self._buckets[bisect.bisect_left(LATENCY_BUCKETS_S, latency)] += 1
        self._latency_sum += latency
        if self.slo_s is not None and latency <= self.slo_s:
            self._within += 1
        self._finished.append(latency)

    def sample(self) -> Sample:
        now = self.clock()
        self._area += self._in_flight * (now - self._changed)
        dt = now - self._since
        s = Sample(t=now, dt=dt, concurrency=self._area / dt if dt > 0 else float(self._in_flight),
                   arrivals=self._arrivals, p99_s=exact_quantile(self._finished, 0.99),
                   ready=sum(1 for r in self._replicas.values() if r.ready and not r.draining))
        self._since = self._changed = now
        self._area = 0.0
        self._arrivals = 0
        self._finished = []
        return s

    def stats(self) -> RouterStats:
        return RouterStats(
            name=self.name, requests=self._requests, errors=self._errors, unavailable=self._unavailable,
            in_flight=self._in_flight, buckets=tuple(self._buckets), latency_sum_s=self._latency_sum,
            slo_s=self.slo_s, within_slo=self._within,
            replicas=tuple(ReplicaStats(r.name, r.base_url, r.ready and not r.draining, r.draining, r.outstanding,
                                        r.requests) for r in self._replicas.values()))

    # ------------------------------------------------------------------------------------------ proxying

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        start = self.clock()
        self._arrivals += 1
        self._move(+1)
        answered = False
        try:
            response, answered = await self._forward(request)
            return response
        finally:
            self._move(-1)
            self._finish(self.clock() - start, answered=answered)

    async def _forward(self, request: web.BaseRequest) -> tuple[web.StreamResponse, bool]:
        body = await request.read() if request.body_exists else None
        headers = forward_headers(request.headers, request.remote)
        failed: str | None = None
        for attempt in range(2):
            try:
                r = await self._choose(exclude=failed)
            except NoReplica:
                self._unavailable += 1
                return web.Response(status=503, text=f"no replica of {self.name} is ready\n",
                                    headers={"Retry-After": str(self.retry_after_s)}), False
            r.outstanding += 1
            r.idle.clear()
            try:
                return await self._relay(request, r, body, headers), True
            except _NothingSent as e:
                log.info("router %s: replica %s failed before answering (%s)", self.name, r.name, e.cause)
                r.ready = False
                self._wake()
                if self.on_unready is not None:
                    self.on_unready(r.name)
                failed = r.name
                if attempt == 1:
                    return web.Response(status=502, text=f"replica {r.name} of {self.name} failed: {e.cause}\n"), \
                        False
            finally:
                r.outstanding -= 1
                if r.outstanding == 0:
                    r.idle.set()
                if self._waiters and self.max_ongoing is not None:
                    self._wake()  # room at a replica: the oldest waiter takes it
        raise AssertionError("unreachable")

    async def _relay(self, request: web.BaseRequest, r: _Replica, body: bytes | None,
                     headers: CIMultiDict[str]) -> web.StreamResponse:
        assert self._session is not None
        url = r.base_url + request.rel_url.raw_path_qs
        try:
            upstream = await self._session.request(request.method, url, headers=headers, data=body,
                                                   allow_redirects=False, skip_auto_headers=("User-Agent",))
        except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
            raise _NothingSent(e) from e
        async with upstream:
            r.requests += 1
            out = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            drop = HOP_BY_HOP | _named(upstream.headers)
            if request.method != "HEAD":
                drop |= {"content-length"}  # set below, so that aiohttp sends the body sized, not chunked
                if (length := upstream.headers.get("Content-Length")) is not None:
                    out.content_length = int(length)
            for k, v in upstream.headers.items():
                if k.lower() not in drop:
                    out.headers.add(k, v)
            await out.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await out.write(chunk)
            except aiohttp.ClientError as e:
                # bytes went back already: the client must see a broken response, not a short one that looks whole
                log.info("router %s: replica %s failed mid-response (%s)", self.name, r.name, e)
                if request.transport is not None:
                    request.transport.abort()
                raise
            await out.write_eof()
            return out


class _NothingSent(Exception):
    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _named(headers: CIMultiDictProxy[str] | CIMultiDict[str]) -> set[str]:
    """The headers a Connection header names: hop-by-hop too."""
    return {h.strip().lower() for v in headers.getall("Connection", []) for h in v.split(",")}


def forward_headers(headers: CIMultiDictProxy[str] | CIMultiDict[str], remote: str | None) -> CIMultiDict[str]:
    """The request's headers as sent to a replica: hop-by-hop ones and Host dropped (the replica's own is set),
    X-Forwarded-For extended with the client, X-Forwarded-Host set."""
    drop = HOP_BY_HOP | _named(headers) | {"host", "content-length"}
    out: CIMultiDict[str] = CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in drop)
    prior = headers.get("X-Forwarded-For")
    if remote:
        out["X-Forwarded-For"] = f"{prior}, {remote}" if prior else remote
    if "Host" in headers and "X-Forwarded-Host" not in headers:
        out["X-Forwarded-Host"] = headers["Host"]
    return out
