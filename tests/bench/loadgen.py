"""Load generator: replays the Azure LLM inference trace's arrivals against a service, as real HTTP requests.

    python tests/bench/loadgen.py URL [--trace conv|code|FILE.csv] [--speedup 10] [--scale 1.0]
                                      [--start S] [--duration S] [--slo 0.3] [--json]

Open loop, as users are: each request is sent at its (sped-up) arrival time whatever the earlier ones are doing,
as `POST URL/generate` with {"context_tokens": N, "generated_tokens": M} from the trace's row. A 503 is retried
after its Retry-After (the router answers 503 only when no replica is ready); the request's latency runs from its
arrival time to the last byte of the answer that finally came, retries included, because that is what its user
waited. A request fails when it gets another error status, a broken connection or no answer within --give-up.

It prints latency percentiles (p50/p90/p99/max), SLO attainment (requests answered within --slo, failed ones
counted as misses), requests failed and retried, and a timeline per minute of the replay; `--json` prints the
same as one JSON object. `replay(url, arrivals, ...)` is the coroutine tests and tests/bench/bench_serve.py call.

The trace (tests/fixtures/traces/azure-llm-2023/, CC-BY 4.0): one row per request, TIMESTAMP, ContextTokens,
GeneratedTokens. `--start`/`--duration` cut a slice in trace seconds (before the speedup); `--scale F` keeps a
deterministic fraction F of the requests (F > 1 repeats each request, spread over the gap to the next).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

import aiohttp

TRACES = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "azure-llm-2023"


@dataclass(frozen=True, slots=True)
class Arrival:
    at_s: float
    """When it is sent, seconds from the replay's start (after the speedup)."""
    context_tokens: int
    generated_tokens: int


def trace_path(name: str) -> Path:
    """'conv', 'code' (the fixtures) or a CSV file's path."""
    if name in ("conv", "code"):
        return TRACES / f"{name}.csv"
    return Path(name)


def load(path: Path, *, speedup: float = 10.0, scale: float = 1.0, start_s: float = 0.0,
         duration_s: float | None = None) -> list[Arrival]:
    """The trace's requests from start_s for duration_s (trace seconds), sped up and scaled; the first kept request
    of the slice is sent at 0. ValueError naming the file and row for a row that does not parse."""
    if speedup <= 0 or scale <= 0:
        raise ValueError("--speedup and --scale must be positive")
    rows: list[tuple[float, int, int]] = []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        first: float | None = None
        for n, row in enumerate(reader, start=2):
            try:
                t = datetime.fromisoformat(row["TIMESTAMP"]).timestamp()
                ctx, gen = int(row["ContextTokens"]), int(row["GeneratedTokens"])
            except (KeyError, ValueError, TypeError) as e:
                raise ValueError(f"{path}:{n}: not TIMESTAMP,ContextTokens,GeneratedTokens ({e})") from None
            first = t if first is None else first
            rel = t - first
            if rel < start_s or (duration_s is not None and rel >= start_s + duration_s):
                continue
            rows.append((rel - start_s, ctx, gen))
    rows.sort(key=lambda r: r[0])
    out: list[Arrival] = []
    for i, (rel, ctx, gen) in enumerate(rows):
        # the i-th request is kept floor((i+1)*scale) - floor(i*scale) times: scale 0.5 keeps every second one,
        # 2.0 sends each twice (the copy halfway to the next arrival)
        copies = math.floor((i + 1) * scale) - math.floor(i * scale)
        gap = (rows[i + 1][0] - rel) if i + 1 < len(rows) else 0.0
        for c in range(copies):
            out.append(Arrival((rel + gap * c / copies) / speedup, ctx, gen))
    if out:
        t0 = out[0].at_s
        out = [Arrival(a.at_s - t0, a.context_tokens, a.generated_tokens) for a in out]
    return out


@dataclass(slots=True)
class Outcome:
    at_s: float
    latency_s: float | None
    """None: failed."""
    status: int | None
    retries: int
    error: str = ""


@dataclass(frozen=True, slots=True)
class Minute:
    minute: int
    requests: int
    failed: int
    p50_s: float | None
    p99_s: float | None
    attainment: float | None


@dataclass(frozen=True, slots=True)
class Report:
    requests: int
    answered: int
    failed: int
    retried: int
    """Requests that got at least one 503 before their answer."""
    retries: int
    p50_s: float | None
    p90_s: float | None
    p99_s: float | None
    max_s: float | None
    slo_s: float | None
    attainment: float | None
    wall_s: float
    late_send_s: float
    """The latest any request was sent after its arrival time (the generator keeping up, or not)."""
    errors: dict[str, int] = field(default_factory=dict)
    timeline: tuple[Minute, ...] = ()

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank q-quantile (None when empty)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def summarize(outcomes: Sequence[Outcome], slo_s: float | None, wall_s: float, late_send_s: float) -> Report:
    lat = [o.latency_s for o in outcomes if o.latency_s is not None]
    errors: dict[str, int] = {}
    for o in outcomes:
        if o.latency_s is None:
            errors[o.error] = errors.get(o.error, 0) + 1
    timeline = []
    for minute in range(int(max((o.at_s for o in outcomes), default=-1) // 60) + 1):
        these = [o for o in outcomes if int(o.at_s // 60) == minute]
        ok = [o.latency_s for o in these if o.latency_s is not None]
        timeline.append(Minute(minute, len(these), len(these) - len(ok), percentile(ok, 0.5), percentile(ok, 0.99),
                               attainment(ok, len(these), slo_s)))
    return Report(requests=len(outcomes), answered=len(lat), failed=len(outcomes) - len(lat),
                  retried=sum(1 for o in outcomes if o.retries), retries=sum(o.retries for o in outcomes),
                  p50_s=percentile(lat, 0.5), p90_s=percentile(lat, 0.9), p99_s=percentile(lat, 0.99),
                  max_s=max(lat, default=None), slo_s=slo_s, attainment=attainment(lat, len(outcomes), slo_s),
                  wall_s=wall_s, late_send_s=late_send_s, errors=errors, timeline=tuple(timeline))


def attainment(latencies: Sequence[float], requests: int, slo_s: float | None) -> float | None:
    if slo_s is None or requests == 0:
        return None
    return sum(1 for x in latencies if x <= slo_s) / requests


async def replay(url: str, arrivals: Sequence[Arrival], *, slo_s: float | None = None, path: str = "/generate",
                 give_up_s: float = 120.0, max_retry_after_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic,
                 on_outcome: Callable[[Outcome], None] | None = None) -> Report:
    """Send every arrival at its time (open loop) and wait for all answers; the report. on_outcome is called as
    each request ends (benchmarks watch the run with it)."""
    target = url.rstrip("/") + path
    outcomes: list[Outcome] = []
    late = 0.0
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        start = clock()

        async def one(a: Arrival) -> None:
            due = start + a.at_s
            payload = {"context_tokens": a.context_tokens, "generated_tokens": a.generated_tokens}
            retries = 0
            o: Outcome
            try:
                async with asyncio.timeout(give_up_s):
                    while True:
                        async with session.post(target, json=payload) as resp:
                            await resp.read()
                            if resp.status == 503 and "Retry-After" in resp.headers:
                                retries += 1
                                wait = min(max_retry_after_s, float(resp.headers["Retry-After"] or 1))
                            elif 200 <= resp.status < 300:
                                o = Outcome(a.at_s, clock() - due, resp.status, retries)
                                break
                            else:
                                o = Outcome(a.at_s, None, resp.status, retries, f"HTTP {resp.status}")
                                break
                        await asyncio.sleep(wait)
            except TimeoutError:
                o = Outcome(a.at_s, None, None, retries, f"no answer within {give_up_s:g} s")
            except (aiohttp.ClientError, OSError) as e:
                o = Outcome(a.at_s, None, None, retries, type(e).__name__)
            outcomes.append(o)
            if on_outcome is not None:
                on_outcome(o)

        async with asyncio.TaskGroup() as tg:
            for a in arrivals:
                wait = start + a.at_s - clock()
                if wait > 0:
                    await asyncio.sleep(wait)
                late = max(late, clock() - (start + a.at_s))
                tg.create_task(one(a))
        wall = clock() - start
    outcomes.sort(key=lambda o: o.at_s)
    return summarize(outcomes, slo_s, wall, late)


def fmt_s(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f} ms"


def fmt_pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def print_report(r: Report, out: Callable[[str], None] = print) -> None:
    out(f"requests {r.requests}  answered {r.answered}  failed {r.failed}  retried after 503: {r.retried} "
        f"({r.retries} retries)  wall {r.wall_s:.1f} s  latest send {r.late_send_s * 1000:.0f} ms late")
    out(f"latency p50 {fmt_s(r.p50_s)}  p90 {fmt_s(r.p90_s)}  p99 {fmt_s(r.p99_s)}  max {fmt_s(r.max_s)}"
        + (f"  attainment (<= {fmt_s(r.slo_s)}) {fmt_pct(r.attainment)}" if r.slo_s is not None else ""))
    for err, n in sorted(r.errors.items()):
        out(f"  failed: {n} x {err}")
    out("minute  requests  failed  p50       p99       attainment")
    for m in r.timeline:
        out(f"{m.minute:>6}  {m.requests:>8}  {m.failed:>6}  {fmt_s(m.p50_s):>8}  {fmt_s(m.p99_s):>8}  "
            f"{fmt_pct(m.attainment):>10}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("url", help="the service's address, e.g. http://127.0.0.1:8080")
    ap.add_argument("--trace", default="conv", help="conv, code (the fixtures) or a CSV file (default conv)")
    ap.add_argument("--speedup", type=float, default=10.0)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--start", type=float, default=0.0, help="trace seconds to skip")
    ap.add_argument("--duration", type=float, default=None, help="trace seconds to replay (default: to the end)")
    ap.add_argument("--slo", type=float, default=None, help="latency target in seconds, for attainment")
    ap.add_argument("--path", default="/generate")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    path = trace_path(args.trace)
    try:
        arrivals = load(path, speedup=args.speedup, scale=args.scale, start_s=args.start, duration_s=args.duration)
    except FileNotFoundError:
        print(f"loadgen: --trace {args.trace}: no such file {path}", file=sys.stderr)
        return 2
    except ValueError as e:
        print(f"loadgen: {e}", file=sys.stderr)
        return 2
    report = asyncio.run(replay(args.url, arrivals, slo_s=args.slo, path=args.path))
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print_report(report)
    return 0 if report.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
