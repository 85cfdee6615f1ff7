"""Benchmark: issue 30's live acceptance run. An inference service that keeps its latency SLO under the Azure LLM
trace's load on a simulated 8-GPU fleet full of checkpointable training, and gives the GPUs back. A script, not a
test; it prints figures.

    nice python tests/bench/bench_serve.py            # conv.csv at 10x (~6 min), static median beside it, code.csv
    nice python tests/bench/bench_serve.py --quick    # 60-s slices of each (trace minutes 20-30 of conv)
    python tests/bench/bench_serve.py --json          # the figures as one JSON object too

What runs, all real: `hsched daemon start` on a temporary HSCHED_HOME with a fleet file of one local node of 8
simulated V100s (`[node.simulate]`); eight one-GPU training jobs (examples/trainer.py, `--checkpoint-signal
USR1@20`, normal QoS) that fill it; then `hsched serve start` of a service in QoS prod (prod preempts normal)
whose replica is the stand-in model server (examples/serve/standin.py: the service time of
hsched.sched.servicetime from each request's token counts, batched), MIN-MAX replicas of one GPU each, readiness
GET /health, the controller's router, autoscaler and drain. The load generator (tests/bench/loadgen.py) replays
conv.csv at 10x against the service's address, open loop, as real HTTP requests over loopback, after a warm-up
(--warm-up, 60 s: the slice's first minute thinned to a ramp, not counted): a service is serving before the hour
it is measured on, and a load that arrives at full rate on one replica queues in its FIFO before any new replica
is ready (the router sends it everything, by least outstanding, until then).

It reports, measured in the run:
- the stand-in's single-request latency (requests sent one at a time through a router to one replica) and the
  SLO it justifies (p99 target = 2x the model's single-request p99 over the whole trace, rounded up to 0.1 s);
- SLO attainment (requests within the target, of all sent; failed ones count as misses), requests failed or cut
  (the router's errors and the client's failures: 0 expected), latency percentiles, replicas over time;
- the service's GPU-hours (replica jobs RUNNING, sampled every second from the controller's queue) against the
  same service provisioned statically for the trace's peak minute, and the static median provisioning's
  attainment, measured beside it (the same arrivals against N_median stand-ins behind a router, no controller);
  static sizes: ceil(minute's arrival rate x the measured mean single-request latency x the slowdown at the
  target batch / target concurrency), the rule the autoscaler's concurrency figure follows;
- training jobs' GPU-hours on the fleet, preemptions, and for every preempted one that each restart resumed from
  the step its previous run checkpointed (the trainer's own record: runs.log and its output);
- code.csv (which idles for stretches): replicas go down to MIN and back up without a failed request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import itertools

from hsched.sched.servicetime import ServiceModel, service_time_s, slowdown
from hsched.serve.readiness import ready
from hsched.serve.router import Router
from tests.bench.loadgen import Arrival, Report, load, percentile, print_report, replay, trace_path

REPO = Path(__file__).resolve().parents[2]
GPU_MODEL = "Tesla V100-SXM2-32GB"  # the service model's reference type (relative speed 1.0)
GPUS = 8
TRAINERS = 8
TARGET_CONCURRENCY = 4.0
LOAD_S = 1.0  # the stand-in's simulated weight loading (part of its cold start)
SPEEDUP = 10.0
WINDOW_S = 60.0 / SPEEDUP
"""The autoscaler's stable window: Knative's 60 s in trace time, so 6 s at 10x (panic window 1 s, scale-down
delay 3 s: ScalePolicy.for_window). A 60-s window at 10x would average over ten trace minutes and hold the
replicas of the last ten minutes' peak."""


def say(text: str = "") -> None:
    print(text, flush=True)


# ------------------------------------------------------------------------------------------------ the SLO


def model_alone(arrivals: Sequence[Arrival]) -> tuple[float, float, float]:
    """The model's single-request latency over the requests: (mean, p50, p99)."""
    xs = [service_time_s(a.context_tokens, a.generated_tokens, ServiceModel(), 1.0) for a in arrivals]
    return sum(xs) / len(xs), percentile(xs, 0.5) or 0.0, percentile(xs, 0.99) or 0.0


async def start_standin(port: int, *, load_s: float = 0.0) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(  # noqa: ASYNC220 (a fork and exec: quick, and the bench's loop has nothing else to do)
        [sys.executable, "-m", "hsched.examples.serve.standin", "--port", str(port),
                             "--speed", "1", "--load-s", str(load_s)], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while not await ready(url, "/health"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"the stand-in on port {port} did not become ready")
        await asyncio.sleep(0.1)
    return proc


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def single_request_latency(arrivals: Sequence[Arrival], n: int) -> list[float]:
    """n requests spread over the trace, one at a time through a router to one stand-in: latency alone."""
    import aiohttp

    port = free_port()
    proc = await start_standin(port)
    router = Router("alone")
    await router.start()
    router.add_ready("r0", f"http://127.0.0.1:{port}")
    out = []
    try:
        async with aiohttp.ClientSession() as session:
            for a in arrivals[:: max(1, len(arrivals) // n)][:n]:
                t = time.monotonic()
                async with session.post(router.url + "/generate", json={
                        "context_tokens": a.context_tokens, "generated_tokens": a.generated_tokens}) as resp:
                    await resp.read()
                    assert resp.status == 200
                out.append((time.monotonic() - t) - service_time_s(a.context_tokens, a.generated_tokens))
    finally:
        await router.close()
        proc.terminate()
        proc.wait()
    return out


# ------------------------------------------------------------------------------------------------ static runs


async def static_run(arrivals: Sequence[Arrival], replicas: int, slo_s: float) -> Report:
    """The arrivals against `replicas` stand-ins always up behind a router (no controller, no scaling)."""
    procs = []
    router = Router(f"static-{replicas}", slo_s=slo_s)
    await router.start()
    try:
        for i in range(replicas):
            port = free_port()
            procs.append(await start_standin(port))
            router.add_ready(f"s{i}", f"http://127.0.0.1:{port}")
        return await replay(router.url, arrivals, slo_s=slo_s)
    finally:
        await router.close()
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait()


# ------------------------------------------------------------------------------------------------ the live run


@dataclass
class Live:
    tmp: Path
    env: dict[str, str]
    home: Any = None
    trainers: list[int] = field(default_factory=list)
    service_gpu_s: dict[str, float] = field(default_factory=dict)
    training_gpu_s: float = 0.0
    timeline: list[tuple[float, str, int, int]] = field(default_factory=list)
    """(time, service, ready, wanted)."""
    lows: dict[str, list[int]] = field(default_factory=dict)
    initial: dict[str, int] = field(default_factory=dict)
    """Replicas wanted when the measured replay began (after the warm-up): the simulator starts with as many."""

    def hsched(self, *args: str, check: bool = True) -> str:
        proc = subprocess.run([sys.executable, "-m", "hsched", *args], env=self.env, capture_output=True,
                              text=True, cwd=self.tmp, timeout=120)
        if check and proc.returncode != 0:
            raise SystemExit(f"hsched {' '.join(args)}: exit {proc.returncode}: {proc.stderr.strip()}")
        return proc.stdout

    def call(self, op: str, **args: Any) -> Any:
        from hsched.client import Client

        with Client(self.home, autostart=False) as c:
            return c.call(op, **args)

    async def acall(self, op: str, **args: Any) -> Any:
        return await asyncio.to_thread(self.call, op, **args)


def fleet(tmp: Path) -> Path:
    path = tmp / "fleet.toml"
    path.write_text(f'[[node]]\nname = "gpu"\nexecutor = "local"\n[node.simulate]\nmodel = "{GPU_MODEL}"\n'
                    f"count = {GPUS}\nmemory_mib = 32768\n")
    return path


async def start_training(live: Live) -> None:
    for i in range(TRAINERS):
        work = live.tmp / f"train{i}"
        work.mkdir()
        out = live.hsched("submit", "--json", "--gpus", "1", "--qos", "normal", "--name", f"train{i}",
                          "--checkpoint-signal", "USR1@20", "--workdir", str(work), "--",
                          sys.executable, str(REPO / "examples" / "trainer.py"), "--steps", "1000000",
                          "--step-seconds", "0.5")
        live.trainers.append(int(json.loads(out)["id"]))
    while True:
        q = await live.acall("queue")
        if sum(1 for j in q if j["id"] in live.trainers and j["state"] == "RUNNING") == TRAINERS:
            return
        await asyncio.sleep(0.5)


async def monitor(live: Live, stop: asyncio.Event) -> None:
    """Every second: GPU-seconds of RUNNING replica jobs (per service) and training jobs, replicas ready/wanted."""
    last = time.monotonic()
    while not stop.is_set():
        with_timeout = asyncio.create_task(stop.wait())
        await asyncio.wait([with_timeout], timeout=1.0)
        with_timeout.cancel()
        q = await live.acall("queue")
        now = time.monotonic()
        dt, last = now - last, now
        for j in q:
            if j["state"] != "RUNNING":
                continue
            if j.get("service"):
                live.service_gpu_s[j["service"]] = live.service_gpu_s.get(j["service"], 0.0) + dt * j["gpus"]
            elif j["id"] in live.trainers:
                live.training_gpu_s += dt * j["gpus"]
        for s in await live.acall("serve", action="list"):
            r = s["replicas"]
            live.timeline.append((now, s["name"], r["ready"], r["wanted"]))


async def run_service(live: Live, name: str, arrivals: Sequence[Arrival], lo: int, hi: int,
                      slo_s: float, warm_s: float) -> tuple[Report, dict[str, Any], float]:
    """Start the service, warm it up (a ramp, not counted), replay, stop it (drained): the client's report, the
    service object at the end, and the replay's wall time."""
    live.hsched("serve", "start", name, "--replicas", f"{lo}-{hi}", "--gpus-per-replica", "1", "--qos", "prod",
                "--slo", f"p99={slo_s * 1000:g}ms", "--target-concurrency", f"{TARGET_CONCURRENCY:g}",
                "--stable-window", f"{WINDOW_S:g}s", "--ready-path", "/health", "--workdir", str(live.tmp), "--",
                sys.executable, "-m", "hsched.examples.serve.standin", "--load-s", f"{LOAD_S:g}")
    while True:
        s = await live.acall("serve", action="show", name=name)
        if s["replicas"]["ready"] >= max(1, lo):
            break
        await asyncio.sleep(0.2)
    if warm_s > 0:
        await replay(s["address"], warm_up(arrivals, warm_s), slo_s=slo_s)  # not counted
    live.initial[name] = max(lo, (await live.acall("serve", action="show", name=name))["replicas"]["wanted"])
    gpu_s0 = live.service_gpu_s.get(name, 0.0)
    t0 = time.monotonic()
    report = await replay(s["address"], arrivals, slo_s=slo_s)
    wall = time.monotonic() - t0
    shown = await live.acall("serve", action="show", name=name)
    live.service_gpu_s[name + ":replay"] = live.service_gpu_s.get(name, 0.0) - gpu_s0
    live.hsched("serve", "stop", name)
    return report, shown, wall


def resumed_from_checkpoints(live: Live) -> tuple[int, int, list[str], int]:
    """(jobs preempted, restarts checked, problems, runs stopped before they began): every run after a job's first
    must begin at the step of the newest checkpoint an earlier run saved (the trainer's output of each run:
    `checkpointed at step N`, then `starting at step N`; 0 before any). A run that printed neither was stopped
    while its interpreter started, before the trainer's first line (a preemption's signal that came before the
    trainer set its handler): it ran no step and saved nothing, so the next run must begin where the one before
    it saved; it is counted, not a problem. A run that stepped but saved no checkpoint is one."""
    preempted, checked, problems, unstarted = 0, 0, [], 0
    for jid in live.trainers:
        runs = sorted(live.call("show", id=jid)["runs"], key=lambda r: r["attempt"])
        logs = [Path(r["run_dir"]) / "output.log" for r in runs if r.get("run_dir")]
        texts = [p.read_text(errors="replace") if p.exists() else "" for p in logs]
        if len(texts) <= 1:
            continue
        preempted += 1
        newest = 0  # the newest checkpoint's step so far
        for k, text in enumerate(texts):
            saved = re.findall(r"^checkpointed at step (\d+)", text, re.M)
            start = re.findall(r"^starting at step (\d+)", text, re.M)
            if not start and not saved:
                unstarted += 1 if k < len(texts) - 1 else 0
                continue
            if k > 0:
                checked += 1
                if not start:
                    problems.append(f"job {jid}: run {k + 1} saved a checkpoint but never said where it started")
                elif int(start[0]) != newest:
                    problems.append(f"job {jid}: run {k + 1} started at step {start[0]}, the newest checkpoint "
                                    f"before it was step {newest}")
            if saved:
                newest = int(saved[-1])
            elif k < len(texts) - 1:
                problems.append(f"job {jid}: run {k + 1} ran and was stopped without a checkpoint")
    return preempted, checked, problems, unstarted


def scale_events(shown: dict[str, Any]) -> list[str]:
    return [e["message"] for e in shown.get("events", ()) if " scale " in e["message"]]


def scalings(shown: dict[str, Any]) -> None:
    """The autoscaler's decisions in the run (the service's events), the first ones and a count."""
    events = scale_events(shown)
    ups = sum(1 for m in events if "scale up" in m)
    say(f"scale events: {ups} up, {len(events) - ups} down; the first 12:")
    for m in events[:12]:
        say(f"  {m}")


def replicas_line(live: Live, name: str) -> str:
    pts = [(t, r, w) for t, n, r, w in live.timeline if n == name]
    if not pts:
        return "-"
    t0 = pts[0][0]
    keep = [pts[0]] + [p for a, p in itertools.pairwise(pts) if (a[1], a[2]) != (p[1], p[2])]
    return ", ".join(f"{t - t0:.0f}s:{r}/{w}" for t, r, w in keep[:60])


def per_minute(path: Path, start_s: float, duration_s: float | None) -> list[int]:
    """Requests per trace minute of the slice."""
    arr = load(path, speedup=1.0, start_s=start_s, duration_s=duration_s)
    counts = [0] * (int(arr[-1].at_s // 60) + 1)
    for a in arr:
        counts[int(a.at_s // 60)] += 1
    return counts


def provisioning(arrivals: Sequence[Arrival]) -> tuple[int, int]:
    """Replicas a static service needs for the slice's peak minute and for its median minute, by the rule the
    simulator reports (hsched/sim/service.py `provisioning`): the minute's offered work (alone-seconds per second
    on the reference GPU) at the target concurrency's batch slowdown, over the target concurrency per replica."""
    width = 60.0 / SPEEDUP
    work: dict[int, float] = {}
    for a in arrivals:
        k = int(a.at_s // width)
        work[k] = work.get(k, 0.0) + service_time_s(a.context_tokens, a.generated_tokens)
    minutes = [work.get(k, 0.0) for k in range(max(work) + 1)]
    full = minutes[:-1] or minutes  # the last minute is partial
    slow = slowdown(ServiceModel(), max(1, round(TARGET_CONCURRENCY)))

    def need(w: float) -> int:
        return max(1, math.ceil(w / width * slow / TARGET_CONCURRENCY - 1e-9))

    ordered = sorted(full)
    return need(max(full)), need(ordered[len(ordered) // 2])


def slice_csv(name: str, start_s: float, duration_s: float | None, folder: Path) -> Path:
    """The trace's rows within the slice, as a CSV of the same form (what the simulator reads)."""
    import csv
    from datetime import datetime

    src = trace_path(name)
    out = folder / f"{name}-slice.csv"
    with src.open(newline="") as f, out.open("w", newline="") as g:
        rows = csv.reader(f)
        w = csv.writer(g)
        w.writerow(next(rows))
        first = None
        for row in rows:
            t = datetime.fromisoformat(row[0]).timestamp()
            first = t if first is None else first
            if start_s <= t - first and (duration_s is None or t - first < start_s + duration_s):
                w.writerow(row)
    return out


def simulate(trace: Path, slo_s: float, cold_start_s: float, replicas: str, initial: int) -> dict[str, Any]:
    """`hsched sim --service` on the same slice, service and fleet (8 V100s; a few synthetic training jobs beside
    it), starting with the replicas the live service had when its measured replay began: the simulator's service
    figures."""
    proc = subprocess.run([sys.executable, "-m", "hsched", "sim", "--synthetic", str(TRAINERS), "--cluster",
                           f"v100:{GPUS}", "--gpus-per-node", str(GPUS), "--service", str(trace), "--service-speedup",
                           f"{SPEEDUP:g}", "--service-replicas", replicas, "--service-slo", f"p99={slo_s * 1000:g}ms",
                           "--service-target-concurrency", f"{TARGET_CONCURRENCY:g}", "--service-cold-start",
                           f"{cold_start_s:.2f}s", "--service-stable-window", f"{WINDOW_S:g}s",
                           "--service-initial", str(initial), "--json"], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"hsched sim: exit {proc.returncode}: {proc.stderr.strip()[-400:]}")
    return dict(json.loads(proc.stdout)["service"])


def versus(name: str, live_att: float | None, live_h: float, sim: dict[str, Any]) -> dict[str, Any]:
    att, h = float(sim["slo_attainment"]), float(sim["service_gpu_hours"])
    la = live_att or 0.0
    say(f"{name}: simulator attainment {100 * att:.2f}% (live {100 * la:.2f}%, {100 * (la - att) / att:+.1f}%), "
        f"GPU-hours {h:.3f} (live {live_h:.3f}, {100 * (live_h - h) / h:+.1f}%); replicas mean "
        f"{sim['replicas_mean']:.2f}, static peak {sim['static_peak_replicas']}, median "
        f"{sim['static_median_replicas']}")
    return {"sim": sim, "attainment_diff": (la - att) / att, "gpu_hours_diff": (live_h - h) / h}


def full_minutes(arrivals: Sequence[Arrival]) -> list[float]:
    """The slice's offered work (alone-seconds) in each full trace minute (the last, partial one left out)."""
    width = 60.0 / SPEEDUP
    work: dict[int, float] = {}
    for a in arrivals:
        k = int(a.at_s // width)
        work[k] = work.get(k, 0.0) + service_time_s(a.context_tokens, a.generated_tokens)
    return [work.get(k, 0.0) for k in range(max(work) + 1)][:-1] or list(work.values())


def work_ratio(arrivals: Sequence[Arrival]) -> float:
    """The slice's offered work averaged over its full minutes, over its peak minute's."""
    full = full_minutes(arrivals)
    return sum(full) / len(full) / max(full)


def per_minute_bound(arrivals: Sequence[Arrival]) -> tuple[float, int]:
    """(mean replicas, peak replicas) of an oracle that provisions every trace minute for that minute's own offered
    work by the static rule (`provisioning`), with no cold start, no window and no margin: a floor for any
    autoscaler at the same load per replica; its mean over the peak bounds the GPU-hours against the static peak."""
    width = 60.0 / SPEEDUP
    slow = slowdown(ServiceModel(), max(1, round(TARGET_CONCURRENCY)))
    need = [max(1, math.ceil(w / width * slow / TARGET_CONCURRENCY - 1e-9)) for w in full_minutes(arrivals)]
    return sum(need) / len(need), max(need)


def warm_up(arrivals: Sequence[Arrival], seconds: float) -> list[Arrival]:
    """The first `seconds` of the arrivals thinned to a ramp from none to all (request i kept when its golden-ratio
    fraction is below at_s / seconds): the service was serving before the measured hour began, and its load
    rose to the hour's first rate rather than arriving all at once on one replica."""
    out = []
    for i, a in enumerate(a for a in arrivals if a.at_s < seconds):
        if (i * 0.6180339887) % 1.0 < a.at_s / seconds:
            out.append(a)
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    start_s, duration_s = (1200.0, 600.0) if args.quick else (0.0, None)
    conv = load(trace_path("conv"), speedup=SPEEDUP, start_s=start_s, duration_s=duration_s)
    code = load(trace_path("code"), speedup=SPEEDUP, start_s=start_s, duration_s=duration_s)
    whole = load(trace_path("conv"), speedup=SPEEDUP)

    # the SLO, from the stand-in's single-request latency
    mean_alone, p50_alone, p99_alone = model_alone(whole)
    slo_s = args.slo or round(2 * p99_alone, 1)
    extra = await single_request_latency(whole, 40 if args.quick else 100)
    say(f"stand-in alone (model over conv.csv's {len(whole)} requests): mean {mean_alone * 1000:.0f} ms, p50 "
        f"{p50_alone * 1000:.0f} ms, p99 {p99_alone * 1000:.0f} ms; measured through a router, one at a time, "
        f"{len(extra)} requests: {percentile(extra, 0.5) * 1000:+.1f} ms (p50) / "  # type: ignore[operator]
        f"{percentile(extra, 0.99) * 1000:+.1f} ms (p99) over the model")  # type: ignore[operator]
    say(f"SLO: p99 <= {slo_s:g} s (2x the single-request p99, rounded to 0.1 s: room for batching at the target "
        f"concurrency {TARGET_CONCURRENCY:g}, {slowdown(ServiceModel(), round(TARGET_CONCURRENCY)):.2f}x slower, "
        f"and short queues at bursts, no more)")
    figures["alone"] = {"model_mean_s": mean_alone, "model_p50_s": p50_alone, "model_p99_s": p99_alone,
                        "measured_over_model_p50_s": percentile(extra, 0.5),
                        "measured_over_model_p99_s": percentile(extra, 0.99), "slo_s": slo_s}

    minutes = per_minute(trace_path("conv"), start_s, duration_s)[:-1]  # the last minute is partial
    n_peak, n_median = provisioning(conv)
    say(f"conv.csv slice: {len(conv)} requests over {conv[-1].at_s:.0f} s at {SPEEDUP:g}x; full minutes "
        f"{min(minutes)}-{max(minutes)} requests (median {sorted(minutes)[len(minutes) // 2]}): static for the peak "
        f"minute = {n_peak} replicas, for the median minute = {n_median}")

    tmp = Path(tempfile.mkdtemp(prefix="hsched-bench-serve-"))
    from hsched.paths import Home

    env = dict(os.environ, HSCHED_HOME=str(tmp / "home"), HSCHED_FLEET=str(fleet(tmp)))
    live = Live(tmp, env, Home(tmp / "home"))
    stop = asyncio.Event()
    mon: asyncio.Task[None] | None = None
    try:
        live.hsched("daemon", "start")
        await start_training(live)
        say(f"fleet: {GPUS} simulated {GPU_MODEL}s, {TRAINERS} one-GPU checkpointable training jobs running")
        mon = asyncio.create_task(monitor(live, stop))

        report, shown, wall = await run_service(live, "conv", conv, 1, GPUS, slo_s, args.warm_up)
        gpu_h = live.service_gpu_s["conv:replay"] / 3600
        peak_h = n_peak * wall / 3600
        say("\n== conv.csv, autoscaled (1-8 replicas, prod QoS, preempting training)")
        print_report(report, say)
        st = shown["stats"]
        say(f"router: {st['requests']} requests, {st['errors']} errors ({st['unavailable']} 503 for want of a ready "
            f"replica); cold start {shown['cold_start_s']} s")
        say(f"service GPU-hours {gpu_h:.3f} against {peak_h:.3f} static for the peak minute ({n_peak} x "
            f"{wall:.0f} s): {100 * gpu_h / peak_h:.0f}%")
        say(f"replicas ready/wanted over time: {replicas_line(live, 'conv')}")
        scalings(shown)
        figures["conv"] = {"report": report.to_json(), "router": st, "gpu_hours": gpu_h, "static_peak_replicas":
                           n_peak, "static_peak_gpu_hours": peak_h, "ratio": gpu_h / peak_h, "wall_s": wall,
                           "cold_start_s": shown["cold_start_s"], "events": scale_events(shown)}

        code_report, code_shown, code_wall = await run_service(live, "code", code, 1, GPUS, slo_s, args.warm_up)
        say("\n== code.csv, autoscaled (1-8 replicas)")
        print_report(code_report, say)
        pts = [(r, w) for _t, n, r, w in live.timeline if n == "code"]
        up_at = next((i for i, (_r, w) in enumerate(pts) if w > 1), None)
        went_up = up_at is not None
        went_min = up_at is not None and any(w == 1 for _r, w in pts[up_at:])  # down to MIN after scaling up
        say(f"replicas ready/wanted over time: {replicas_line(live, 'code')}")
        scalings(code_shown)
        code_peak, _code_median = provisioning(code)
        code_h = live.service_gpu_s["code:replay"] / 3600
        code_peak_h = code_peak * code_wall / 3600
        say(f"service GPU-hours {code_h:.3f} against {code_peak_h:.3f} static for the peak minute ({code_peak} x "
            f"{code_wall:.0f} s): {100 * code_h / code_peak_h:.0f}%")
        say(f"scaled to MIN (1) and back: {'yes' if went_min and went_up else 'no'}; requests failed "
            f"{code_report.failed}, router errors {code_shown['stats']['errors']}")
        figures["code"] = {"report": code_report.to_json(), "router": code_shown["stats"],
                           "to_min_and_back": went_min and went_up, "gpu_hours": code_h,
                           "static_peak_replicas": code_peak, "static_peak_gpu_hours": code_peak_h,
                           "ratio": code_h / code_peak_h, "events": scale_events(code_shown)}

        # training: every preempted job back to RUNNING, resumed from its checkpoint
        deadline = time.monotonic() + 180
        while True:
            q = await live.acall("queue")
            running = sum(1 for j in q if j["id"] in live.trainers and j["state"] == "RUNNING")
            if running == TRAINERS or time.monotonic() > deadline:
                break
            await asyncio.sleep(1)
        stop.set()
        await mon
        mon = None
        preempted, checked, problems, unstarted = await asyncio.to_thread(resumed_from_checkpoints, live)
        restarts = sum(j.get("restarts", 0) for j in q if j["id"] in live.trainers)
        say(f"\n== training: {TRAINERS} jobs, {running} running again at the end; GPU-hours on the fleet "
            f"{live.training_gpu_s / 3600:.3f}; {preempted} preempted ({restarts} restarts), {checked} resumes "
            f"checked against the trainer's own record: "
            + ("every one from its checkpoint" if not problems else "; ".join(problems))
            + f"; {unstarted} run(s) stopped before the trainer's first line (no step run, nothing to save)")
        figures["training"] = {"gpu_hours": live.training_gpu_s / 3600, "preempted": preempted,
                               "restarts": restarts, "resumes_checked": checked, "problems": problems,
                               "stopped_before_starting": unstarted,
                               "running_at_end": running}
    finally:
        stop.set()
        if mon is not None:
            mon.cancel()
        cleanup(live)

    # the same runs in the simulator (hsched sim --service), with the cold start measured live
    say("\n== the same service in the simulator (hsched sim --service, same slice, policy, SLO, cold start, and the "
        f"replicas at the replay's start: {', '.join(f'{n} {k}' for n, k in live.initial.items())})")
    simdir = Path(tempfile.mkdtemp(prefix="hsched-bench-serve-sim-"))
    try:
        cold = float(figures["conv"]["cold_start_s"] or 2.5)
        for name in ("conv", "code"):
            sim = await asyncio.to_thread(simulate, slice_csv(name, start_s, duration_s, simdir), slo_s, cold,
                                          f"1-{GPUS}", live.initial.get(name, 1))
            f = figures[name]
            figures[name]["simulator"] = versus(name, f["report"]["attainment"], f["gpu_hours"], sim)
    finally:
        shutil.rmtree(simdir, ignore_errors=True)

    # beside it: the same arrivals on a static median provisioning (and the peak one when asked)
    say(f"\n== conv.csv, static median provisioning ({n_median} replicas, always up, no controller)")
    med = await static_run(conv, n_median, slo_s)
    print_report(med, say)
    figures["static_median"] = {"replicas": n_median, "report": med.to_json()}
    if not args.no_static_peak:
        say(f"\n== conv.csv, static peak provisioning ({n_peak} replicas)")
        peak = await static_run(conv, n_peak, slo_s)
        print_report(peak, say)
        figures["static_peak"] = {"replicas": n_peak, "report": peak.to_json()}

    c = figures["conv"]
    peak_att = figures["static_peak"]["report"]["attainment"] if "static_peak" in figures else None
    say("\n== acceptance (issue 30, live)")
    say(f"(the offered work's mean over its peak minute, which bounds any autoscaler's GPU-hours against the static "
        f"peak at the same load per replica: conv {work_ratio(conv):.2f}, code {work_ratio(code):.2f})")
    for name, arr in (("conv", conv), ("code", code)):
        mean_n, peak_n = per_minute_bound(arr)
        figures[name]["per_minute_bound"] = mean_n / peak_n
        say(f"({name}: an oracle provisioning each trace minute for its own work by the static rule holds {mean_n:.2f} "
            f"replicas on average against {peak_n} for the peak minute: {100 * mean_n / peak_n:.0f}%, the floor of "
            f"the GPU-hours ratio at the same load per replica)")
    say(f"attainment {100 * (c['report']['attainment'] or 0):.2f}% (>= 99%)   failed/cut {c['report']['failed']} + "
        f"router errors {c['router']['errors']} (0)   GPU-hours {100 * c['ratio']:.0f}% of static peak (<= 60%)   "
        f"static median attainment {100 * (med.attainment or 0):.2f}% (expected < 99%)   static peak attainment "
        f"{'-' if peak_att is None else f'{100 * peak_att:.2f}%'}"
        f"   training problems "
        f"{len(figures['training']['problems'])} (0)   code.csv to MIN and back "
        f"{figures['code']['to_min_and_back']} with {figures['code']['report']['failed']} failed (0)")
    return figures


def cleanup(live: Live) -> None:
    """Cancel every job, stop the controller; runs outlive their controller by design, so what is left of ours
    (children of our run wrappers) is killed by pid."""
    try:
        for j in live.call("queue"):
            live.call("cancel", id=j["id"])
        deadline = time.monotonic() + 60
        while live.call("queue") and time.monotonic() < deadline:
            time.sleep(0.5)
    except Exception as e:
        print(f"cleanup: {e}", file=sys.stderr)
    live.hsched("daemon", "stop", check=False)
    for pid_dir in Path("/proc").iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:
            environ = (pid_dir / "environ").read_bytes()
        except OSError:
            continue
        if f"HSCHED_HOME={live.home.root}".encode() in environ.split(b"\0") and int(pid_dir.name) != os.getpid():
            try:
                os.kill(int(pid_dir.name), signal.SIGKILL)
            except ProcessLookupError:
                pass
    shutil.rmtree(live.tmp, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="60-s slices (trace minutes 20-30) instead of the hour")
    ap.add_argument("--slo", type=float, default=None, help="p99 target in seconds (default: from the stand-in)")
    ap.add_argument("--warm-up", type=float, default=60.0,
                    help="seconds of load ramping up before the measured replay (0: none; not counted)")
    ap.add_argument("--no-static-peak", action="store_true", help="skip the static peak provisioning's run")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON at the end")
    args = ap.parse_args(argv)
    figures = asyncio.run(main_async(args))
    if args.json:
        print(json.dumps(figures, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
