"""Replay the published traces under hsched's policies and print them next to the published results.

    python tests/bench/bench_sim.py                 # ed69ec on 16:16:16 and 8:8:8, the round-latency bench
    python tests/bench/bench_sim.py --gavel         # --round-mode gavel against Gavel's published figures
    python tests/bench/bench_sim.py --gang          # also the multi-GPU trace 0e4a51 on 16:16:16
    python tests/bench/bench_sim.py --scale         # also 100,000 synthetic jobs on 1,024 GPUs (minutes)
    python tests/bench/bench_sim.py --only --learned   # ed69ec: learned throughputs and predicted durations
    python tests/bench/bench_sim.py --only --yardstick # hsched sim's CPU over a minimal event-driven simulator's

The traces are in tests/fixtures/traces (tests/fixtures/README.md names their source). References: the
results published with Gavel's simulator (seed 0, servers of 4, 360 s rounds, no checkpoint cost), as the
shared data folder's traces/README.md quotes them. Not collected by pytest (no test_ prefix): it takes a
minute or more on a slow machine.
"""

from __future__ import annotations

import argparse
import heapq
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path

from hsched.sched import JobPhase, JobView, build_input, make_policy, schedule_round
from hsched.sched.throughput import ThroughputModel
from hsched.sim.cluster import parse_cluster
from hsched.sim.engine import SimConfig, SimCosts, simulate
from hsched.sim.trace import Trace, load_trace, synthetic

# the traces it replays are copied into the repository (tests/fixtures/README.md names their source)
GAVEL = Path(__file__).resolve().parents[1] / "fixtures" / "traces" / "gavel-msr" / "seed=0"

# (cluster, policy) -> (name of the published row, avg JCT s, makespan s); published for ed69ec only
PUBLISHED = {
    ("16:16:16", "fifo"): ("FIFO", 255_466, 6_714_043),
    ("16:16:16", "las"): ("LAS (max-min fairness)", 192_170, 6_744_188),
    ("16:16:16", "las-hetero"): ("Gavel het.-aware LAS", 142_609, 6_690_913),
    ("16:16:16", "hsched"): ("Gavel het.-aware LAS", 142_609, 6_690_913),
    ("8:8:8", "fifo"): ("FIFO", 1_631_683, 8_926_914),
    ("8:8:8", "las-hetero"): ("Gavel het.-aware LAS", 337_214, 6_819_431),
    ("8:8:8", "ftf"): ("Gavel het.-aware FTF", 336_556, 6_841_870),
    ("8:8:8", "hsched"): ("best published (FTF)", 336_556, 6_841_870),
}
POLICIES = ("fifo", "fifo-hetero", "las", "las-hetero", "ftf", "backfill", "srtf-oracle", "hsched")


def replay(trace_name: str, shapes: list[str], policies: tuple[str, ...]) -> None:
    tr = load_trace(GAVEL / f"{trace_name}.trace")
    for shape in shapes:
        v, p, k = shape.split(":")
        servers = parse_cluster(f"v100:{v},p100:{p},k80:{k}", 4)
        print(f"\n{trace_name} on {shape} (v100:p100:k80), servers of 4, 360 s rounds, no checkpoint cost")
        head = (f"{'policy':12s} {'avg JCT s':>11s} {'makespan s':>12s} {'JCT/LB':>7s} {'mksp/LB':>8s} "
                f"{'preempt':>8s} {'wall s':>7s}   published (avg JCT, makespan) -> ours/published")
        print(head)
        print("-" * len(head))
        lb = None
        for name in policies:
            s = simulate(tr, servers, make_policy(name), SimConfig()).summary
            lb = s
            ref = PUBLISHED.get((shape, name)) if trace_name == "ed69ec" else None
            refs = ""
            if ref:
                refs = (f"   {ref[0]}: {ref[1]:,} / {ref[2]:,} -> {s['avg_jct_s'] / ref[1]:.3f} / "
                        f"{s['makespan_s'] / ref[2]:.3f}")
            print(f"{name:12s} {s['avg_jct_s']:11,.0f} {s['makespan_s']:12,.0f} {s['avg_jct_over_bound']:7.3f} "
                  f"{s['makespan_over_bound']:8.3f} {s['preemptions']:8d} {s['wall_s']:7.2f}{refs}", flush=True)
            if s["unschedulable_jobs"]:
                print(f"{'':12s} ({s['unschedulable_jobs']} unschedulable jobs reported)")
        assert lb is not None
        print(f"{'lower bound':12s} {lb['lower_bound_avg_jct_s']:11,.0f} {lb['lower_bound_makespan_s']:12,.0f}")


# the published figures --round-mode gavel reproduces: (cluster, policy) -> (avg JCT s, makespan s)
GAVEL_REFERENCE = {
    ("16:16:16", "fifo"): (255_466, 6_714_043),
    ("16:16:16", "las"): (192_170, 6_744_188),
    ("16:16:16", "las-hetero"): (142_609, 6_690_913),
    ("8:8:8", "fifo"): (1_631_683, 8_926_914),
    ("8:8:8", "las-hetero"): (337_214, 6_819_431),
    ("8:8:8", "ftf"): (336_556, 6_841_870),
}


def gavel_table() -> None:
    """Each published Gavel figure next to: `--round-mode gavel` (Gavel's mechanism), hsched's own policy of
    that name with Gavel's timing only (`SimConfig(round_mode="gavel")`: rounds at 360 s boundaries, hsched's
    plan), and hsched's default (event) mode; so the gap between hsched and Gavel splits into timing and
    allocation. CPU seconds per run."""
    from hsched.sim.gavel import GavelConfig, GavelSimulator

    tr = load_trace(GAVEL / "ed69ec.trace")
    print("\ned69ec, servers of 4, 360 s rounds, no checkpoint cost: avg JCT s (makespan s); ratio to Gavel's figure")
    head = (f"{'cluster':9s} {'policy':11s} {'Gavel':>22s} {'--round-mode gavel':>30s} {'hsched, gavel timing':>30s} "
            f"{'hsched, event (default)':>30s}")
    print(head)
    print("-" * len(head))
    for (shape, name), (ref_jct, ref_mk) in GAVEL_REFERENCE.items():
        v, p, k = (int(x) for x in shape.split(":"))
        servers = parse_cluster(f"v100:{v},p100:{p},k80:{k}", 4)
        cells = []
        t0 = time.process_time()
        g = GavelSimulator(tr, {"v100": v, "p100": p, "k80": k}, name, GavelConfig()).run().summary
        cpu = [time.process_time() - t0]
        runs = [g]
        for mode in ("gavel", "event"):
            t0 = time.process_time()
            runs.append(simulate(tr, servers, make_policy(name), SimConfig(round_mode=mode)).summary)
            cpu.append(time.process_time() - t0)
        for s, c in zip(runs, cpu, strict=True):
            cells.append(f"{s['avg_jct_s']:>9,.0f} ({s['makespan_s'] / 1e6:.2f}M) {s['avg_jct_s'] / ref_jct:5.3f} "
                         f"{c:4.0f}s")
        print(f"{shape:9s} {name:11s} {ref_jct:>10,} ({ref_mk / 1e6:.2f}M)   " + "  ".join(cells), flush=True)


def gang_table(seeds_dir: Path = GAVEL, costs: tuple[float, ...] = (0.0, 60.0, 600.0)) -> None:
    """0e4a51 on 16:16:16: hsched against las-hetero at each checkpoint cost, with preemptions and CPU time."""
    tr = load_trace(seeds_dir / "0e4a51.trace")
    servers = parse_cluster("v100:16,p100:16,k80:16", 4)
    print(f"\n0e4a51 ({seeds_dir.name}) on 16:16:16: avg JCT / lower bound, preemptions, GPU-hours lost, CPU s")
    for cost in costs:
        row = []
        for name in ("las-hetero", "hsched"):
            t0 = time.process_time()
            s = simulate(tr, servers, make_policy(name), SimConfig(costs=SimCosts(checkpoint_s=cost))).summary
            cpu = time.process_time() - t0
            row.append(s)
            print(f"  checkpoint {cost:5.0f} s  {name:10s} JCT {s['avg_jct_s']:>11,.0f} s = "
                  f"{s['avg_jct_over_bound']:.3f}x bound, {s['preemptions']:>9,} preemptions, "
                  f"{s['gpu_hours_lost']:>9,.0f} GPU-h lost, {s['prior_rate_jobs']} jobs on the prior, "
                  f"{cpu:.0f} s CPU", flush=True)
        lh, hs = row
        print(f"  checkpoint {cost:5.0f} s  hsched / las-hetero: JCT {hs['avg_jct_s'] / lh['avg_jct_s']:.3f}, "
              f"preemptions {hs['preemptions'] / max(1, lh['preemptions']):.3f}")


def learned_table(shapes: tuple[str, ...] = ("16:16:16", "8:8:8"), costs: tuple[float, ...] = (0.0, 30.0)) -> None:
    """ed69ec, issue 14's acceptance: the policies on throughputs learned from the jobs' progress (`hsched sim
    --learned`: from the accelerator table's prior, as the live controller; `--learned-prior measured`: the
    GPU types' ratios re-estimated from what was measured) against the table oracle, and whether hsched still
    beats las-hetero with a 30 s checkpoint cost; then predicted durations (`--predict`) for the policies that
    read durations."""
    tr = load_trace(GAVEL / "ed69ec.trace")
    modes = (("table", SimConfig()), ("learned", SimConfig(learned=True)),
             ("learned, measured prior", SimConfig(learned=True, refine_prior=True)))
    print("\ned69ec, servers of 4: avg JCT s by what the policy knows of throughputs (ratio to the table oracle)")
    for shape in shapes:
        v, p, k = shape.split(":")
        servers = parse_cluster(f"v100:{v},p100:{p},k80:{k}", 4)
        for cost in costs:
            by: dict[tuple[str, str], float] = {}
            for name in ("las-hetero", "hsched"):
                cells = []
                for label, cfg in modes:
                    t0 = time.process_time()
                    s = simulate(tr, servers, make_policy(name),
                                 replace(cfg, costs=SimCosts(checkpoint_s=cost))).summary
                    by[(name, label)] = s["avg_jct_s"]
                    cells.append(f"{label} {s['avg_jct_s']:>9,.0f} ({s['avg_jct_s'] / by[(name, 'table')]:.3f}, "
                                 f"{time.process_time() - t0:3.0f}s)")
                print(f"  {shape:8s} checkpoint {cost:3.0f} s  {name:10s} " + "  ".join(cells), flush=True)
            wins = "  ".join(f"{label}: {by[('hsched', label)] / by[('las-hetero', label)]:.3f}" for label, _ in modes)
            print(f"  {shape:8s} checkpoint {cost:3.0f} s  hsched / las-hetero avg JCT ({'<1: hsched wins'}): {wins}")
    # (backfill's "as given" are the trace's time limits: ed69ec has none, and with 1-GPU jobs only a reservation
    # never holds anything back, so estimates cannot change its decisions there)
    print("\ned69ec, servers of 4, no checkpoint cost: avg JCT s as given (srtf-oracle: true remaining times; "
          "backfill: the trace's time limits) and predicted (ratio)")
    for shape in shapes:
        v, p, k = shape.split(":")
        servers = parse_cluster(f"v100:{v},p100:{p},k80:{k}", 4)
        for name in ("srtf-oracle", "backfill"):
            true = simulate(tr, servers, make_policy(name), SimConfig()).summary
            pred = simulate(tr, servers, make_policy(name), SimConfig(predict=True)).summary
            print(f"  {shape:8s} {name:12s} as given {true['avg_jct_s']:>11,.0f} "
                  f" predicted {pred['avg_jct_s']:>11,.0f} ({pred['avg_jct_s'] / true['avg_jct_s']:.3f}); "
                  f"predictions' mean abs error {pred['prediction_mean_abs_error']:.2f}", flush=True)


class _YJob:
    """One job's state in the yardstick."""

    __slots__ = ("arrival", "busy", "fastest", "id", "kind", "last_rate", "rate", "rel", "remaining", "run_s",
                 "service", "start", "type", "version", "view_service")

    def __init__(self, jid: int, kind: str, arrival: float, work: float, fastest: float) -> None:
        self.id, self.kind, self.arrival, self.remaining, self.fastest = jid, kind, arrival, work, fastest
        self.rate = self.rel = self.last_rate = self.run_s = self.service = self.start = self.busy = 0.0
        self.type: str | None = None
        self.version = 0
        self.view_service = 0.0


def yardstick_sim(trace: Trace, capacity: dict[str, int], policy: str = "hsched", round_s: float = 360.0,
                  quantum_s: float = 5400.0) -> dict[str, float]:
    """A minimal event-driven simulator of the same decisions as `hsched sim` on a trace of one-GPU jobs of one
    class, user and priority that all checkpoint (Gavel's ed69ec), under `policy` "hsched" (with progress totals)
    or "las-hetero", on a fleet given as GPU counts per type, no checkpoint cost.

    It does what any simulator of these decisions must: arrivals; completions (a heap of predicted ends, stale
    entries skipped by a version); rounds when `hsched sim`'s event mode has them (each arrival and completion
    while a job waits; an arrival into an empty queue a start-only round over the newcomers and the free GPUs; a
    completion nobody waits for makes moves due at the quantum; every `round_s` while a job waits); each round the
    policy's order of every active job (hsched: running jobs within their `quantum_s` first, then GPU-seconds of
    work, the remaining time its progress reports where it ran, else attained service; las-hetero: normalised
    attained service), the first jobs that fit the fleet's GPU count, the heterogeneity-aware assignment
    (`hetero_assign`'s greedy fill of the slowest type by the fraction of the best speed a job keeps there, ties to
    the job already there, then priority order; hsched, once some job's remaining time is known, `assign_types`'s
    fill instead: the speed lost there weighed by remaining seconds ** -0.3), each job granted its assigned type or
    the next fastest with room, then stops, moves and starts; progress at the type's rate, counted when a job stops
    or the round reads it.

    What it leaves out is only what cannot change these decisions on such a trace: devices and servers (a one-GPU
    job's speed depends on its type alone, and the round always places a type's granted jobs), QoS, fair share,
    priorities, gangs, costs, the checks of its input, the per-job records and the summary beyond the avg JCT. So
    its avg JCT and round count equal `hsched sim`'s, which `yardstick_table` checks: the ratio of CPU times is
    the simulator's overhead over this least work, like for like."""
    model = trace.throughput
    for tj in trace.jobs:
        if (tj.gpus != 1 or tj.qos != trace.jobs[0].qos or tj.user != trace.jobs[0].user or tj.priority
                or not tj.checkpointable or tj.time_limit_s is not None):
            raise ValueError("the yardstick models one-GPU jobs of one class, user and priority that checkpoint")
    if policy not in ("hsched", "las-hetero"):
        raise ValueError(f"yardstick policy {policy!r}: expected 'hsched' or 'las-hetero'")
    totals = policy == "hsched"
    types_all = model.order_types(capacity)
    total = sum(capacity.values())
    arrivals: list[_YJob] = []
    for tj in sorted(trace.jobs, key=lambda j: (j.arrival_s, j.id)):
        best = [max(r, model.rate(tj.job_type, 1, t, spans=True) or 0.0)
                for t in types_all if (r := model.rate(tj.job_type, 1, t)) and capacity[t] >= 1]
        if best:
            arrivals.append(_YJob(tj.id, tj.job_type, tj.arrival_s, tj.work, max(best)))
    active: dict[int, _YJob] = {}
    running: dict[int, _YJob] = {}
    heap: list[tuple[float, int, int]] = []
    fracs: dict[tuple[str, tuple[str, ...], str, tuple[str, ...]], float] = {}
    losts: dict[tuple[str, tuple[str, ...], str, tuple[str, ...]], float | None] = {}
    free = dict(capacity)  # GPUs free per type
    now, last_round, ai, rounds, jct_sum, finished = 0.0, -math.inf, 0, 0, 0.0, 0
    moves_due = False

    def frac_of(kind: str, types: tuple[str, ...], slow: str, faster: tuple[str, ...]) -> float:
        """The fraction of its best speed on `faster` a job keeps on `slow`: -1 where it cannot run there, 2 where
        it runs nowhere faster."""
        key = (kind, types, slow, faster)
        f = fracs.get(key)
        if f is None:
            rel = model.rel_speeds(kind, 1, types)
            here = rel.get(slow, 0.0)
            best = max((rel.get(t, 0.0) for t in faster), default=0.0)
            f = fracs[key] = -1.0 if here <= 0 else here / best if best > 0 else 2.0
        return f

    def decide(jobs: list[_YJob], caps: dict[str, int], strict: bool) -> dict[int, str]:
        """The round: order, selection, assignment, grants. Returns job id -> granted type."""
        if totals:
            def key(j: _YJob) -> tuple[bool, float, float, int]:
                if j.type is None:
                    return (True, (j.remaining / j.fastest) if j.last_rate > 0 else j.service, j.arrival, j.id)
                return (not now - j.start < quantum_s,
                        (j.remaining - (j.rate * (now - j.busy) if now > j.busy else 0.0)) / j.fastest,
                        j.arrival, j.id)
        else:
            def key(j: _YJob) -> tuple[float, float, int]:  # type: ignore[misc]
                return (j.service + (j.rel * (now - j.busy) if j.type is not None and now > j.busy else 0.0),
                        j.arrival, j.id)
        order = sorted(jobs, key=key)
        room = sum(caps.values())
        chosen = order[:room]  # one GPU each: the first that fit the fleet's count
        types = tuple(t for t in types_all if caps.get(t, 0) > 0)
        if totals:
            left_s = [forecast(j) for j in jobs]
            if any(x is not None for x in left_s):
                assigned = weighed_assignment(chosen, caps, types)
                return grants(chosen, assigned, caps, types, strict)
        # the assignment: the slowest type first, to the jobs that keep most of their speed there
        left, placed, assigned = len(chosen), [False] * len(chosen), {}
        cap_of = dict(caps)
        live = list(types)
        while left and live:
            slow, faster = live[-1], tuple(live[:-1])
            need = left - sum(max(0, cap_of[t]) for t in faster)
            groups: dict[float, list[int]] = {}
            for i, j in enumerate(chosen):
                groups.setdefault(frac_of(j.kind, types, slow, faster), []).append(i)
            cap = cap_of[slow]
            if not faster and left <= cap and all(f >= 0 for f in groups):
                for i, j in enumerate(chosen):
                    if not placed[i]:
                        assigned[j.id] = slow
                cap_of[slow] = cap - left
                break
            for frac in sorted(groups, reverse=True):
                if frac < 0 or (need <= 0 and faster and frac <= 1.0) or cap < 1:
                    break
                idx = groups[frac]
                for i in [i for i in idx if chosen[i].type == slow] + [i for i in idx if chosen[i].type != slow]:
                    if placed[i]:
                        continue
                    if need <= 0 and faster and frac <= 1.0:
                        break
                    assigned[chosen[i].id] = slow
                    placed[i] = True
                    cap, need, left = cap - 1, need - 1, left - 1
                    if cap < 1:
                        break
            cap_of[slow] = cap
            live.pop()
        return grants(chosen, assigned, caps, types, strict)

    def forecast(j: _YJob) -> float | None:
        """The remaining seconds on its fastest type the policy is told (a job that never ran has none)."""
        if j.type is None:
            return j.remaining / j.fastest if j.last_rate > 0 else None
        return (j.remaining - (j.rate * (now - j.busy) if now > j.busy else 0.0)) / j.fastest

    def lost_of(kind: str, types: tuple[str, ...], slow: str, faster: tuple[str, ...]) -> float | None:
        """The share of speed a job loses on `slow` against the best of `faster`: None where it cannot run there,
        -1 where it runs nowhere faster."""
        key = (kind, types, slow, faster)
        if key not in losts:
            rel = model.rel_speeds(kind, 1, types)
            here = rel.get(slow, 0.0)
            best = max((rel.get(t, 0.0) for t in faster), default=0.0)
            losts[key] = None if here <= 0 else -1.0 if best <= 0 else best / here - 1.0
        return losts[key]

    def weighed_assignment(chosen: list[_YJob], caps: dict[str, int], types: tuple[str, ...]) -> dict[int, str]:
        """hsched's assignment where remaining times are known: the slowest type first, to the jobs that lose least
        there, the loss weighed by remaining seconds ** -0.3."""
        weights = []
        for j in chosen:
            x = forecast(j)
            weights.append(max(1.0, j.service if x is None else x) ** -0.3)
        cap_of = dict(caps)
        assigned: dict[int, str] = {}
        pending = list(range(len(chosen)))
        live = list(types)
        while pending and live:
            slow, faster = live[-1], tuple(live[:-1])
            cap = cap_of[slow]
            if not faster:
                for i in pending:
                    if cap >= 1 and lost_of(chosen[i].kind, types, slow, faster) is not None:
                        assigned[chosen[i].id] = slow
                        cap -= 1
                break
            need = len(pending) - sum(max(0, cap_of[t]) for t in faster)
            costs = []
            for i in pending:
                lost = lost_of(chosen[i].kind, types, slow, faster)
                if lost is None:
                    continue
                if lost == -1.0:
                    costs.append((-1.0, chosen[i].type != slow, i))
                elif need > 0 or lost < 0:
                    costs.append((weights[i] * lost, chosen[i].type != slow, i))
            costs.sort()
            taken = set()
            for c, _moved, i in costs:
                if c >= 0 and need <= 0:
                    break
                if cap >= 1:
                    assigned[chosen[i].id] = slow
                    cap, need = cap - 1, need - 1
                    taken.add(i)
            cap_of[slow] = cap
            pending = [i for i in pending if i not in taken]
            live.pop()
        return assigned

    def grants(chosen: list[_YJob], assigned: dict[int, str], caps: dict[str, int], types: tuple[str, ...],
               strict: bool) -> dict[int, str]:
        """The grants: the assigned type, else the job's next fastest with room."""
        granted: dict[int, str] = {}
        room_of = dict(caps)
        for j in chosen:
            t = assigned.get(j.id)
            if t is None:
                continue
            for x in (t, *(x for x in model.fastest_types(j.kind, 1, types) if x != t)):
                if room_of.get(x, 0) >= 1:
                    room_of[x] -= 1
                    granted[j.id] = x
                    break
            else:
                if strict:
                    break
        return granted

    def stop(j: _YJob, t: float) -> None:
        progressed = max(0.0, t - j.busy)
        j.remaining = max(0.0, j.remaining - j.rate * progressed)
        j.service += j.rel * progressed
        j.run_s += t - j.start
        free[j.type] += 1  # type: ignore[index]
        j.version += 1
        j.last_rate, j.type, j.rate, j.rel = j.rate, None, 0.0, 0.0
        del running[j.id]

    def start(j: _YJob, t_: str, t: float) -> None:
        j.type, j.rate = t_, model.rate(j.kind, 1, t_) or 0.0
        j.rel = j.rate / j.fastest
        j.start = j.busy = t
        j.version += 1
        free[t_] -= 1
        running[j.id] = j
        heapq.heappush(heap, (t + j.remaining / j.rate, j.id, j.version))

    while ai < len(arrivals) or active:
        t_arr = arrivals[ai].arrival if ai < len(arrivals) else math.inf
        while heap and (heap[0][1] not in running or running[heap[0][1]].version != heap[0][2]):
            heapq.heappop(heap)  # a stale end: the job stopped or moved since
        t_done = heap[0][0] if heap else math.inf
        t_q = last_round + round_s if moves_due or len(running) < len(active) else math.inf
        t = min(t_arr, t_done, t_q)
        if math.isinf(t):
            break
        now = max(t, now)
        event = arrived = False
        while heap and heap[0][0] <= now + 1e-9:
            _, jid, version = heapq.heappop(heap)
            j = running.get(jid)  # type: ignore[assignment]
            if j is None or j.version != version:
                continue
            stop(j, now)
            del active[jid]
            jct_sum += now - j.arrival
            finished += 1
            event = True
        queue_before = len(active) - len(running)
        newcomers = []
        while ai < len(arrivals) and arrivals[ai].arrival <= now:
            j = arrivals[ai]
            active[j.id] = j
            newcomers.append(j)
            ai += 1
            event = arrived = True
        if not event and now < t_q:
            continue
        if event and not arrived and len(running) == len(active) and active and now < t_q:
            moves_due = True  # nobody waits for the freed GPUs: moves onto them wait for the quantum's round
            continue
        if not active:
            moves_due = False
            continue
        if arrived and not queue_before and now < last_round + round_s:
            moves_due = True  # a start-only round: the newcomers on the free GPUs, in order, strictly
            if len(running) >= total:
                continue
            for jid, t_ in decide(newcomers, {t_: n for t_, n in free.items() if n > 0}, True).items():
                start(active[jid], t_, now)
            rounds += 1
            continue
        granted = decide(list(active.values()), capacity, False)
        rounds += 1
        last_round = now
        moves_due = False
        for j in list(running.values()):
            if granted.get(j.id) != j.type:
                stop(j, now)  # preempted, or moved (started again below)
        for jid, t_ in granted.items():
            j = active[jid]
            if j.type is None:
                start(j, t_, now)
        if not running and ai == len(arrivals):
            break
    return {"rounds": rounds, "avg_jct_s": jct_sum / max(1, finished), "finished": finished}


def yardstick_table(shapes: tuple[str, ...] = ("16:16:16", "8:8:8"),
                    policies: tuple[str, ...] = ("hsched", "las-hetero"),
                    repeats: int = 5) -> None:
    """ed69ec: `hsched sim`'s CPU time over the yardstick's (`yardstick_sim`) under the same policy, each the best
    of `repeats` runs in this process, alternating, with both runs' round counts and avg JCT: equal, or the yardstick
    is not simulating the same decisions and the line says so (issue 33's goal: <= 1.5x)."""
    tr = load_trace(GAVEL / "ed69ec.trace")
    print("\ned69ec, servers of 4: hsched sim's CPU over a minimal event-driven yardstick's of the same decisions "
          f"(best of {repeats}; goal <= 1.5x)")
    for shape in shapes:
        v, p, k = (int(x) for x in shape.split(":"))
        servers = parse_cluster(f"v100:{v},p100:{p},k80:{k}", 4)
        for name in policies:
            # alternating, each the best of its runs: a machine whose speed drifts (a shared host) slows both alike,
            # where two blocks of runs one after the other put the drift into the ratio (0.84x-1.53x on one tree)
            base, cpus = [], []
            for _ in range(repeats):
                t0 = time.process_time()
                y = yardstick_sim(tr, {"v100": v, "p100": p, "k80": k}, name)
                base.append(time.process_time() - t0)
                t0 = time.process_time()
                s = simulate(tr, servers, make_policy(name), SimConfig()).summary
                cpus.append(time.process_time() - t0)
            yard, sim = min(base), min(cpus)
            same = y["rounds"] == s["rounds"] and math.isclose(y["avg_jct_s"], s["avg_jct_s"], rel_tol=1e-9)
            print(f"  {shape:8s} {name:12s} {sim:6.2f} s CPU = {sim / yard:4.2f}x the yardstick's {yard:5.2f} s; "
                  f"{s['rounds']:,} rounds, avg JCT {s['avg_jct_s']:,.0f} s; "
                  + ("the same decisions" if same else
                     f"NOT the same decisions: yardstick {y['rounds']:,} rounds, avg JCT {y['avg_jct_s']:,.0f} s"),
                  flush=True)


def round_latency(pending: int = 2000, gpus: int = 512, repeats: int = 15) -> None:
    """Median time of one `schedule_round` with `pending` queued jobs and a full fleet of `gpus` GPUs."""
    tp_path = GAVEL.parent / "simulation_throughputs.json"
    if tp_path.is_file():
        from hsched.sim.trace import load_gavel_throughputs

        model = load_gavel_throughputs(tp_path)
    else:
        model = ThroughputModel(reference_type="v100")
    third = gpus // 3
    servers = parse_cluster(f"v100:{third},p100:{third},k80:{gpus - 2 * third}", 8)
    keys = [k for k in model.known_keys() if k[1] <= 8] or [("", 1)]
    jobs: list[JobView] = []
    # the fleet is full of running single-GPU jobs, and `pending` more wait
    i = 0
    for s in servers:
        for d in s.devices:
            jt = keys[i % len(keys)][0]
            if model.rate(jt, 1, s.gpu_type) is None:
                jt = ""
            from hsched.model import Placement

            jobs.append(JobView(i, jt, 1, float(i), JobPhase.RUNNING, gpu_type=s.gpu_type,
                                placement=(Placement(s.name, (d,)),), run_start_s=0.0, run_s=3600.0 + i,
                                service_s=1800.0 + i))
            i += 1
    for n in range(pending):
        jt, scale = keys[n % len(keys)]
        jobs.append(JobView(i, jt, scale, 10_000.0 + n, service_s=float(n % 50) * 100.0))
        i += 1
    for name in ("fifo", "las", "las-hetero", "hsched"):
        policy = make_policy(name)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            inp = build_input(20_000.0, jobs, servers, model)
            schedule_round(policy, inp, servers)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times) * 1000
        print(f"core only (schedule_round, no controller; the live round: bench_live.py): round with {pending} "
              f"pending on {gpus} GPUs, {name:10s}: median {med:.1f} ms")


def scale_run(n_jobs: int = 100_000, gpus: int = 1024, policies: tuple[str, ...] = ("las-hetero", "hsched")) -> None:
    """The synthetic scale replay (goal: under 2 minutes of CPU), each policy's CPU time also as a ratio to the
    first one's (las-hetero by default: Gavel's policy, time-sharing like hsched), measured in this run."""
    third = gpus // 3
    servers = parse_cluster(f"v100:{third},p100:{third},k80:{gpus - 2 * third}", 8)
    # A loaded but stable rate. A synthetic job needs about 32 V100-GPU-hours on average (1.9 GPUs x 16.8 h:
    # the heavy tail of 10^U(3,4)-minute jobs dominates), and this fleet does about 631 V100-GPU-hours per
    # hour (P100 0.6, K80 0.25 of a V100 by the prior), so gpus/64 = 16 jobs an hour offers ~81 % of its
    # capacity. The earlier gpus/8 offered ~650 %: the queue grew without bound and the run measured that.
    tr = synthetic(n_jobs, seed=0, jobs_per_hour=gpus / 64.0)
    print(f"\nsynthetic {n_jobs:,} jobs on {gpus} GPUs at {gpus / 64.0:g} jobs/h (goal: under 90 s CPU each, issue 33)")
    base = None
    for name in policies:
        t0, c0 = time.perf_counter(), time.process_time()
        s = simulate(tr, servers, make_policy(name), SimConfig()).summary
        # (the goal is CPU time: on a shared machine wall time measures the neighbours too)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        base = base or cpu
        print(f"{name:12s} {cpu:6.1f} s CPU ({cpu / base:4.2f}x {policies[0]}), {wall:6.1f} s wall, "
              f"{s['rounds']:,} rounds, {s['preemptions']:,} preemptions, avg JCT {s['avg_jct_s']:,.0f} s "
              f"(bound {s['lower_bound_avg_jct_s']:,.0f}), utilization {s['utilization']:.3f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gang", action="store_true", help="also 0e4a51: hsched vs las-hetero at 0, 60, 600 s checkpoints")
    ap.add_argument("--gang-traces", default="",
                    help="comma-separated folders holding other seeds' 0e4a51.trace (Gavel's seed=1, seed=2)")
    ap.add_argument("--gavel", action="store_true", help="--round-mode gavel against Gavel's published figures")
    ap.add_argument("--learned", action="store_true",
                    help="also ed69ec with learned throughputs and predicted durations against the oracle")
    ap.add_argument("--yardstick", action="store_true",
                    help="also ed69ec: hsched sim's CPU over a minimal event-driven simulator's (the yardstick)")
    ap.add_argument("--only", action="store_true", help="skip the default ed69ec replay and round-latency bench")
    ap.add_argument("--scale", action="store_true", help="also 100,000 synthetic jobs on 1,024 GPUs")
    ap.add_argument("--scale-jobs", type=int, default=100_000, help="jobs in the --scale run")
    ap.add_argument("--scale-policies", default="las-hetero,hsched",
                    help="policies of the --scale run (the first is the baseline)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    args = ap.parse_args()
    policies = tuple(args.policies.split(","))
    if not args.only:
        replay("ed69ec", ["16:16:16", "8:8:8"], policies)
    if args.gavel:
        gavel_table()
    if args.learned:
        learned_table()
    if args.yardstick:
        yardstick_table()
    if args.gang:
        gang_table()
        for folder in filter(None, args.gang_traces.split(",")):
            gang_table(Path(folder))
    if not args.only:
        print()
        round_latency()
    if args.scale:
        scale_run(args.scale_jobs, policies=tuple(args.scale_policies.split(",")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
