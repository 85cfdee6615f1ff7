"""The inference stand-in's latency model: a request's service time from its token counts, and a replica's queue.

Shared by the simulator (`hsched sim --service TRACE.csv`) and the live stand-in replica server
(examples/serve/standin.py), so that both model the same thing. Pure: no I/O, no clock, no module state; the
caller reads the file and supplies the times.

**One request alone.** service = (context_tokens x `prefill_s` + generated_tokens x `decode_s`) / speed,
where speed is the GPU type's relative inference throughput (`relative_speed`: hsched/topo's accelerator
table, V100 = 1.0, the reference type for which the parameters below are set; an unknown type counts as 1.0).

**Continuous batching.** A replica serves up to `max_batch` requests at once; with b in service every step is
slower by (1 + `batch_alpha` x (b - 1)), so each of the b requests progresses at 1 / (1 + alpha (b - 1)) of its
alone speed (prefill is batched into the same steps, as chunked prefill does in vLLM or Sarathi-Serve). A
replica's throughput therefore grows with the batch, b / (1 + alpha (b - 1)), while each request slows down
mildly. Further requests wait FIFO at the replica and enter the batch as others finish. `ReplicaQueue` is this
model computed exactly (event by event, piecewise-constant rates), for the simulator and the live stand-in.

**The parameters** (`ServiceModel()`), chosen for the acceptance run, which replays the Azure LLM 2023
conversation trace (conv.csv) at 10x compression, so that an hour of trace is ~6 minutes live:

- prefill 0.04 ms per context token, decode 1.2 ms per generated token: conv.csv's median-sized request
  (1,020 context tokens, 129 generated) takes 0.20 s alone, the mean request 0.30 s; the requests are short
  enough for a 6-minute run, and the spread is the trace's own. Measured over conv.csv, alone: p50 0.22 s,
  p99 0.77 s, max 1.24 s. An SLO of p99 = 1.5 s (about 2x the single-request p99) leaves room for batching
  and a little queueing, no more. (The autoscaler's SLO check fires at 0.8 x the SLO, 1.2 s, just under the
  largest request's alone time: at 1.5 s it adds replicas readily; at 2 s it answers queueing alone.)
- max_batch 8, batch_alpha 0.1: at 8 in flight a request is 1.7x slower than alone and the replica serves
  4.7x a single stream. At 10x, conv.csv's peak minute (507 requests) is 84.5 requests/s, ~25 requests in
  flight alone-time. Replaying all of conv.csv at 10x on a static number of one-GPU (V100-speed) replicas,
  least outstanding first: 3 replicas collapse (p50 45 s), 4 miss a 1.5 s p99 (98.1% within), 5 meet it
  (99.8%), 8 give p99 0.90 s. So the peak needs 5-8 replicas, the median minute (326 requests) 3-4.

These are a stand-in's figures, not a measured model server's: the point is a latency that depends on the
request's size, the GPU's speed and the replica's batch, as a real LLM server's does.
"""

from __future__ import annotations

import csv
import io
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from hsched.topo.models import lookup_model

REFERENCE_TYPE = "V100"
"""The GPU type the parameters are set for (relative speed 1.0, as in hsched/topo's table)."""


@dataclass(frozen=True, slots=True)
class ServiceModel:
    prefill_s: float = 0.00004
    """Seconds per context (prompt) token, alone, on the reference GPU."""
    decode_s: float = 0.0012
    """Seconds per generated token, alone, on the reference GPU."""
    max_batch: int = 8
    """Requests a replica serves at once (continuous batching); more wait FIFO."""
    batch_alpha: float = 0.1
    """Each step's slowdown per extra request in the batch: step = alone x (1 + alpha (b - 1))."""

    def problems(self) -> list[str]:
        out = []
        if self.prefill_s < 0 or self.decode_s < 0 or self.prefill_s + self.decode_s <= 0:
            out.append("prefill and decode seconds per token must be >= 0 and not both 0")
        if self.max_batch < 1:
            out.append(f"max batch {self.max_batch} must be >= 1")
        if self.batch_alpha < 0:
            out.append(f"batch alpha {self.batch_alpha} must be >= 0")
        return out


@dataclass(frozen=True, slots=True)
class Request:
    arrival_s: float
    """Seconds since the trace's first request."""
    context_tokens: int
    generated_tokens: int


def relative_speed(gpu_type: str | None) -> float:
    """The GPU type's inference speed relative to the reference type (hsched/topo's table; unknown: 1.0)."""
    model = lookup_model(gpu_type)
    ref = lookup_model(REFERENCE_TYPE)
    if model is None or ref is None or ref.inference <= 0:
        return 1.0
    return model.inference / ref.inference


def service_time_s(
    context_tokens: int, generated_tokens: int, model: ServiceModel | None = None, speed: float = 1.0, batch: int = 1
) -> float:
    """Seconds one request takes with `batch` requests in service throughout (batch 1: alone)."""
    m = model or ServiceModel()
    alone = (context_tokens * m.prefill_s + generated_tokens * m.decode_s) / speed
    return alone * slowdown(m, batch)


def slowdown(model: ServiceModel, batch: int) -> float:
    """How much slower each request in a batch of `batch` progresses than alone."""
    return 1.0 + model.batch_alpha * max(0, min(batch, model.max_batch) - 1)


def _parse_time(text: str) -> float:
    """ISO timestamp (any number of fractional digits) -> POSIX seconds, or a plain number of seconds."""
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    whole, _, frac = text.partition(".")
    base = datetime.fromisoformat(whole).timestamp()  # naive: local time, but only differences are used
    return base + (float("0." + frac) if frac else 0.0)


def load_trace(text: str | Iterable[Sequence[str]], source: str = "trace") -> tuple[Request, ...]:
    """Requests from CSV text (or rows) with columns TIMESTAMP, ContextTokens, GeneratedTokens (the Azure LLM
    inference trace's form); arrivals in seconds since the first row, sorted. ValueError names the line."""
    rows: Iterable[Sequence[str]] = csv.reader(io.StringIO(text)) if isinstance(text, str) else text
    it = iter(rows)
    header = next(it, None)
    if header is None:
        raise ValueError(f"{source}: empty; expected a header TIMESTAMP,ContextTokens,GeneratedTokens")
    names = [h.strip().lower() for h in header]
    want = ("timestamp", "contexttokens", "generatedtokens")
    missing = [w for w in want if w not in names]
    if missing:
        raise ValueError(
            f"{source}: line 1: missing column(s) {', '.join(missing)}; "
            "expected a header TIMESTAMP,ContextTokens,GeneratedTokens"
        )
    it_, ic, ig = (names.index(w) for w in want)
    raw: list[tuple[float, int, int]] = []
    for n, row in enumerate(it, start=2):
        if not row or all(not c.strip() for c in row):
            continue
        try:
            t = _parse_time(row[it_])
            c, g = int(row[ic]), int(row[ig])
        except (ValueError, IndexError) as e:
            raise ValueError(f"{source}: line {n}: {e}; expected TIMESTAMP,ContextTokens,GeneratedTokens") from None
        if c < 0 or g < 0 or not math.isfinite(t):
            raise ValueError(f"{source}: line {n}: token counts must be >= 0 and the time finite")
        raw.append((t, c, g))
    if not raw:
        raise ValueError(f"{source}: no requests after the header")
    raw.sort(key=lambda r: r[0])
    t0 = raw[0][0]
    return tuple(Request(t - t0, c, g) for t, c, g in raw)


def compress(requests: Sequence[Request], speedup: float = 1.0, scale: float = 1.0) -> tuple[Request, ...]:
    """The trace replayed `speedup` times faster, with `scale` x as many arrivals (deterministic: scale 0.5
    keeps every other request, 2.0 sends each twice, 1.5 sends every other one twice)."""
    if speedup <= 0 or scale <= 0:
        raise ValueError("speedup and scale must be > 0")
    out: list[Request] = []
    acc = 0.0
    for r in requests:
        before = math.floor(acc + 1e-9)
        acc += scale
        for _ in range(math.floor(acc + 1e-9) - before):
            out.append(Request(r.arrival_s / speedup, r.context_tokens, r.generated_tokens))
    return tuple(out)


class ReplicaQueue:
    """One replica, exactly: up to max_batch requests in service at once, each progressing at
    1 / slowdown(b) of its alone speed while b are in service; the rest wait FIFO.

    Work is in alone-seconds on this replica (service_time_s at its speed, batch 1). Times are the caller's
    clock; `advance(now)` must be called with non-decreasing times. Not shared between threads.
    """

    __slots__ = ("active", "busy_s", "model", "t", "waiting")

    def __init__(self, model: ServiceModel | None = None, t: float = 0.0) -> None:
        self.model = model or ServiceModel()
        self.t = t
        self.active: dict[int, float] = {}  # request id -> remaining alone-seconds (insertion = admission)
        self.waiting: deque[tuple[int, float]] = deque()
        self.busy_s = 0.0  # seconds with at least one request in service

    @property
    def outstanding(self) -> int:
        return len(self.active) + len(self.waiting)

    def _rate(self) -> float:
        return 1.0 / slowdown(self.model, len(self.active))

    def _admit(self) -> None:
        while self.waiting and len(self.active) < self.model.max_batch:
            rid, work = self.waiting.popleft()
            self.active[rid] = work

    def arrive(self, now: float, rid: int, work_s: float) -> list[tuple[int, float]]:
        """A request arrives at `now`; returns the requests that finished up to then (id, finish time)."""
        done = self.advance(now)
        self.waiting.append((rid, max(0.0, work_s)))
        self._admit()
        return done

    def next_finish(self) -> float | None:
        """When the next request in service finishes if nothing arrives (None: idle)."""
        if not self.active:
            return None
        return self.t + min(self.active.values()) / self._rate()

    def advance(self, now: float) -> list[tuple[int, float]]:
        """Progress to `now`; returns the requests that finished (id, finish time), in order."""
        done: list[tuple[int, float]] = []
        while self.active:
            rate = self._rate()
            least = min(self.active.values())
            t_next = self.t + least / rate
            if t_next > now + 1e-12:
                step = (now - self.t) * rate
                for k in self.active:
                    self.active[k] -= step
                self.busy_s += now - self.t
                self.t = now
                return done
            step = least
            finished = []
            for k in self.active:
                self.active[k] -= step
                if self.active[k] <= 1e-12:
                    finished.append(k)
            self.busy_s += t_next - self.t
            self.t = t_next
            for k in finished:
                del self.active[k]
                done.append((k, t_next))
            self._admit()
        self.t = max(self.t, now)
        return done
