"""`hsched sim --round-mode gavel`: the round mechanism of Gavel's simulator, to reproduce its published figures.

hsched's own simulator starts a job the moment it arrives or GPUs free up, and asks the policy for a ranking.
Gavel's simulator (stanford-futuredata/gavel, scheduler.py, `simulate`) works differently, and the difference is
what this module reproduces so that the gap between the two is measured rather than guessed:

* **Rounds.** Everything happens at round boundaries. A round gives every chosen job `int(rate * 360)` steps (the
  rest of its work, if less); the round ends when the longest of them ends (about 360 s), and GPUs whose job
  finished early stay idle until then. Jobs that arrived during the round join at its end. An idle cluster waits
  for the next arrival and starts a round then.
* **Allocation.** The policy computes an allocation X over time fractions (`hsched.sim.gavel_alloc`): for `las`
  max-min fairness of GPU time, for `las-hetero` max-min of throughput normalised by the job's isolated share,
  for `ftf` finish-time fairness, and for `fifo` one GPU type per job in arrival order. It is recomputed only
  when jobs arrived or finished *and* 1,920 s have passed since the last recomputation; a job that arrived
  since has no allocation and does not run (and the GPUs it was picked for stay idle that round).
* **Priorities.** At each round, job i's priority on type t is X[i][t] divided by the fraction of type t's time
  it received since the allocation was last reset (each job starts a reset period with half a round of
  credit). Type by type (fastest first for the heterogeneity-aware policies, a seeded shuffle for the others),
  the jobs with the highest priority (then deficit, then allocation) that still fit take the type's GPUs: each
  job runs where its allocation says it is most behind.

Gavel's quirks are kept on purpose, because they are part of the figures: after an idle period a round's
"start" is the end of the previous round (execution times, hence priorities, are counted from there); FIFO's
allocation only moves when the allocation is recomputed, so a freed GPU can idle for up to 1,920 s; the types
are shuffled with Python's `random.Random(seed + 5)` and FIFO picks a type with `random.Random(seed)`, as
Gavel seeds them. Costs (checkpoints, spanning) are not modelled: Gavel's published runs have none.

This is a model of another system, for measuring, and not a policy hsched runs: it shares the trace, the
throughput table and the metrics with the main simulator and nothing else.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from hsched.sim.metrics import JobRecord, SimResult, lower_bounds, summarize
from hsched.sim.trace import Trace, TraceJob, too_long

GAVEL_POLICIES = {
    "fifo": "fifo",
    "las": "max_min_fairness",
    "las-hetero": "max_min_fairness_perf",
    "ftf": "finish_time_fairness_perf",
}
"""hsched policy name -> the Gavel policy `--round-mode gavel` runs for it."""

GAVEL_TYPE_ORDER = ("v100", "p100", "k80")
"""The order Gavel's round walks GPU types in (its simulator hard-codes it); other types follow, fastest first."""


@dataclass(frozen=True, slots=True)
class GavelConfig:
    round_s: float = 360.0
    reset_interval_s: float = 1920.0
    """Gavel's `minimum_time_between_allocation_resets`."""
    seed: int = 0
    max_time_s: float | None = None


@dataclass(slots=True)
class _GJob:
    tj: TraceJob
    rates: dict[str, float]
    steps_left: int
    time_on: dict[str, float] = field(default_factory=dict)
    first_start: float | None = None
    end: float | None = None
    run_s: float = 0.0
    restarts: int = 0
    migrations: int = 0
    last_type: str = ""
    arrived_integral: float = 0.0
    isolated_s: float = 0.0  # FTF: the time its work so far would have taken at its isolated rates


class GavelSimulator:
    """Replays a trace on a fleet described by GPUs per type and GPUs per server, the way Gavel's simulator does.

    Args:
        trace: jobs and throughputs (a Gavel trace and table for the published figures).
        capacity: GPUs per type, e.g. {"v100": 16, "p100": 16, "k80": 16}.
        policy: an hsched policy name with a Gavel counterpart (`GAVEL_POLICIES`).
    """

    def __init__(self, trace: Trace, capacity: dict[str, int], policy: str, config: GavelConfig | None = None,
                 progress: Callable[[int, int], None] | None = None) -> None:
        if policy not in GAVEL_POLICIES:
            raise ValueError(f"--round-mode gavel runs {', '.join(GAVEL_POLICIES)}; not {policy!r}")
        self.trace = trace
        self.capacity = {t: n for t, n in capacity.items() if n > 0}
        self.policy = policy
        self.kind = GAVEL_POLICIES[policy]
        self.config = config or GavelConfig()
        self.progress = progress
        known = [t for t in GAVEL_TYPE_ORDER if t in self.capacity]
        rest = trace.throughput.order_types(t for t in self.capacity if t not in known)
        self.types = (*known, *rest)
        self.alloc_types = tuple(sorted(self.capacity))  # Gavel's matrices use sorted type names
        self._ftf_prev: dict[int, tuple[int, float]] = {}  # FTF: job id -> (steps left, isolated rate) last time

    # ------------------------------------------------------------------ allocation

    def _allocate(self, jobs: list[_GJob], now: float, fifo_state: dict[int, str], fifo_rng: random.Random
                  ) -> dict[int, dict[str, float]]:
        if not jobs:
            return {}
        if self.kind == "fifo":
            return self._fifo(jobs, fifo_state, fifo_rng)
        import numpy as np  # the optional `gavel` extra: only the LP policies need it

        from hsched.sim import gavel_alloc as ga

        types = self.alloc_types
        cap = np.array([float(self.capacity[t]) for t in types])
        scale = np.array([float(j.tj.gpus) for j in jobs])
        tput = np.array([[j.rates.get(t, 0.0) for t in types] for j in jobs])
        if self.kind == "max_min_fairness":
            # type-blind: every job's time counts the same on every type
            ones = (tput > 0).astype(float) * scale[:, None]
            g_coef, g_scale, counts, of_row = ga.group_rows(ones, [j.tj.gpus for j in jobs])
            x = ga.max_min(g_coef, g_scale, counts, cap)[of_row]
        else:
            if self.kind == "max_min_fairness_perf":
                # Gavel's normaliser (policies/max_min_fairness.py, MaxMinFairnessPolicyWithPerf, through
                # policies/proportional.py): every job's throughput on capacity[t] / total of each type, whatever
                # its scale. (Normalising by the type-blind LAS allocation instead, which gives a gang of s GPUs
                # 1/s of a single GPU's time, counted a gang's scale twice: het-LAS 1.208x Gavel's figure on the
                # multi-GPU trace, 0.986x with this.)
                isolated = np.maximum(tput @ (cap / float(np.sum(cap))), 1e-12)
                coef = tput * scale[:, None] / isolated[:, None]
                g_coef, g_scale, counts, of_row = ga.group_rows(coef, [j.tj.gpus for j in jobs])
                x = ga.max_min(g_coef, g_scale, counts, cap)[of_row]
            else:
                # Gavel's FTF (policies/finish_time_fairness.py with policies/isolated.py): the isolated share is
                # capacity[t] / (jobs x scale) of each type, rows scaled so that the fullest sums to 1; the
                # isolated finish time counts the work done so far at the isolated rates of the allocations it
                # was done under, not the time since arrival
                share = cap[None, :] / (float(len(jobs)) * scale[:, None])
                share = share / float(np.max(np.sum(share, axis=1)))
                isolated = np.maximum(np.sum(tput * share, axis=1), 1e-12)
                for j in jobs:
                    if j.tj.id in self._ftf_prev:
                        prev_left, prev_iso = self._ftf_prev[j.tj.id]
                        j.isolated_s += (prev_left - j.steps_left) / prev_iso
                self._ftf_prev = {j.tj.id: (j.steps_left, float(isolated[i])) for i, j in enumerate(jobs)}
                since = np.array([now - j.tj.arrival_s for j in jobs])
                left = np.array([float(j.steps_left) for j in jobs])
                so_far = np.array([j.isolated_s for j in jobs])
                x = ga.finish_time_fair(tput, scale, since, left, isolated, cap, isolated_so_far=so_far)
        return {j.tj.id: {t: float(x[i, k]) for k, t in enumerate(types)} for i, j in enumerate(jobs)}

    def _fifo(self, jobs: list[_GJob], assigned: dict[int, str], rng: random.Random) -> dict[int, dict[str, float]]:
        """Gavel's base FIFO: jobs keep the type they were given; a finished job's type goes to the head of the
        queue if it fits there (else that job waits for the next call); the rest are given types in arrival
        order (see the comment below for which)."""
        active = {j.tj.id: j for j in jobs}
        free = dict(sorted(self.capacity.items()))
        queue = sorted(jid for jid in active if jid not in assigned)
        for jid in sorted(assigned):
            t = assigned[jid]
            if jid not in active:
                if queue:
                    head = queue.pop(0)
                    if active[head].tj.gpus <= free[t]:
                        assigned[head] = t
                        free[t] -= active[head].tj.gpus
                del assigned[jid]
            else:
                free[t] -= active[jid].tj.gpus
        open_types = sorted(t for t, n in free.items() if n > 0)
        while queue and open_types:
            head = queue.pop(0)
            g = active[head].tj.gpus
            fits = [i for i, t in enumerate(open_types) if free[t] >= g]
            if not fits:
                break
            pick = fits[rng.randrange(len(fits))]
            # Gavel's base FIFO draws a random index but assigns the loop variable left over from scanning the
            # open types: the last of them in name order ("v100" while it is open), even when it is full, so
            # that type is over-committed and its jobs time-share it. The draw only decides which type
            # leaves the open list when the assigned one reaches exactly zero. Kept: the figures come from it.
            t = open_types[-1]
            assigned[head] = t
            free[t] -= g
            if free[t] == 0:
                open_types.pop(pick)
        out = {jid: dict.fromkeys(self.capacity, 0.0) for jid in active}
        for jid, t in assigned.items():
            out[jid][t] = 1.0
        return out

    # ------------------------------------------------------------------ the run

    def run(self) -> SimResult:
        wall0 = time.perf_counter()
        cfg = self.config
        model = self.trace.throughput
        jobs: list[_GJob] = []
        bad: list[tuple[int, str, str]] = []
        for tj in self.trace.jobs:
            rates = {t: r for t in self.capacity
                     if (r := model.rate(tj.job_type, tj.gpus, t)) and self.capacity[t] >= tj.gpus}
            if not rates:
                bad.append((tj.id, tj.name, f"no throughput for ({tj.job_type!r}, {tj.gpus}) on a type with room"))
                continue
            too_long(self.trace, tj, max(rates.values()))
            jobs.append(_GJob(tj, rates, max(1, int(tj.work))))
        arrivals = sorted(jobs, key=lambda j: (j.tj.arrival_s, j.tj.id))
        total = len(jobs)
        tick = max(1, total // 100)
        perf = self.kind.endswith("_perf")
        shuffler = random.Random(cfg.seed + 5)
        fifo_rng = random.Random(cfg.seed)
        fifo_state: dict[int, str] = {}

        active: dict[int, _GJob] = {}  # insertion order = arrival order (Gavel's priority dict order)
        allocation: dict[int, dict[str, float]] = {}
        deficit: dict[int, dict[str, float]] = {}
        worker_time = dict.fromkeys(self.capacity, 0.0)
        half = cfg.round_s / 2.0
        last_reset = 0.0
        need_update = False
        done: list[_GJob] = []
        running: list[tuple[float, int, str, int]] = []  # (finish, job id, type, steps) of the current round
        prev_types: dict[int, str] = {}
        round_start, round_end = 0.0, None
        now = arrivals[0].tj.arrival_s if arrivals else 0.0
        ai = 0
        rounds = preemptions = 0
        busy_gpu_s = 0.0
        busy: list[tuple[float, int]] = [(0.0, 0)]
        active_integral = 0.0
        last_t = now

        def reset(t: float) -> None:
            nonlocal last_reset
            elapsed = t - last_reset
            for wt in self.capacity:
                worker_time[wt] = 0.0
                for jid, j in active.items():
                    received = j.time_on.get(wt, half) - half
                    should = allocation[jid].get(wt, 0.0) * elapsed if jid in allocation else 0.0
                    d = deficit.setdefault(jid, {})
                    d[wt] = d.get(wt, 0.0) + should - received
                    j.time_on[wt] = half
                    worker_time[wt] += half
            last_reset = t

        while len(done) < total:
            if cfg.max_time_s is not None and now > cfg.max_time_s:
                break
            if ai >= len(arrivals) and not running:
                last_reset = 0.0  # Gavel forces a reset when nothing runs and nothing is left to arrive
            if running:
                finish = max(f for f, *_ in running)
                if round_end is not None:
                    round_start = round_end
                round_end = finish
                now = finish
            elif ai < len(arrivals):
                now = max(now, arrivals[ai].tj.arrival_s)
            else:
                break  # nothing runs, nothing arrives: jobs left can never run
            active_integral += len(active) * (now - last_t)
            last_t = now
            # the round's micro-tasks end
            for f, jid, wt, steps in sorted(running, reverse=True):
                j = active[jid]
                ran = f - round_start
                j.steps_left -= steps
                j.time_on[wt] = j.time_on.get(wt, half) + ran
                worker_time[wt] += ran
                j.run_s += steps / j.rates[wt]
                busy_gpu_s += steps / j.rates[wt] * j.tj.gpus
                if j.steps_left <= 0:
                    j.end = f
                    j.arrived_integral = active_integral - j.arrived_integral
                    del active[jid]
                    allocation.pop(jid, None)
                    deficit.pop(jid, None)
                    prev_types.pop(jid, None)
                    done.append(j)
                    need_update = True
                    if self.progress and len(done) % tick == 0:
                        self.progress(len(done), total)
            running = []
            while ai < len(arrivals) and arrivals[ai].tj.arrival_s <= now:
                j = arrivals[ai]
                j.time_on = dict.fromkeys(self.capacity, half)
                j.arrived_integral = active_integral
                active[j.tj.id] = j
                deficit[j.tj.id] = dict.fromkeys(self.capacity, 0.0)
                need_update = True
                ai += 1
            if not active:
                continue
            # priorities (Gavel's _update_priorities), with the allocation recomputed when due
            if need_update and (now - last_reset >= cfg.reset_interval_s or last_reset == 0.0):
                reset(now)
                allocation = self._allocate(list(active.values()), now, fifo_state, fifo_rng)
                need_update = False
            order = list(self.types)
            if not perf:
                shuffler.shuffle(order)
            left = dict(self.capacity)
            taken: set[int] = set()
            chosen: list[tuple[int, str]] = []
            for wt in order:
                wtime = worker_time[wt]
                entries = []
                for jid, j in active.items():
                    a = allocation.get(jid)
                    if a is None:
                        prio = 0.0
                    else:
                        x = a.get(wt, 0.0)
                        if x == 0.0 or wt not in j.rates:
                            prio = 0.0
                        else:
                            frac = j.time_on.get(wt, half) / wtime if wtime > 0 else 0.0
                            prio = x / frac if frac > 0 else x * 1e9
                    entries.append((prio, deficit[jid].get(wt, 0.0), a.get(wt, 0.0) if a else 0.0, jid))
                entries.sort(key=lambda e: (e[0], e[1], e[2]), reverse=True)
                for prio, _, _, jid in entries:
                    if left[wt] == 0:
                        break
                    if jid in taken or wt not in active[jid].rates:
                        continue
                    if self.kind == "fifo" and prio <= 0.0:
                        continue
                    g = active[jid].tj.gpus
                    if g > left[wt]:
                        continue
                    left[wt] -= g
                    taken.add(jid)
                    chosen.append((jid, wt))
            held = 0
            new_types: dict[int, str] = {}
            for jid, wt in chosen:
                if jid not in allocation:
                    continue  # picked, but a job without an allocation gets no workers this round
                j = active[jid]
                rate = j.rates[wt]
                steps = min(int(rate * cfg.round_s), j.steps_left)
                if steps <= 0:
                    steps = j.steps_left
                running.append((now + steps / rate, jid, wt, steps))
                if j.first_start is None:
                    j.first_start = now
                prev = prev_types.get(jid)
                if prev is not None and prev != wt:
                    j.migrations += 1
                j.last_type = wt
                new_types[jid] = wt
                held += j.tj.gpus
            for jid in prev_types:
                if jid not in new_types and jid in active:
                    active[jid].restarts += 1
                    preemptions += 1
            prev_types = new_types
            rounds += 1
            if busy[-1][0] == now:
                busy.pop()
            busy.append((now, held))

        records = [self._record(j) for j in done]
        runnable = [j.tj for j in jobs]
        fastest = [max(j.rates.values()) for j in jobs]
        lb_avg, lb_mk = lower_bounds(runnable, fastest, sum(self.capacity.values()))
        return summarize(
            records, policy=self.policy, trace=self.trace.source, capacity=self.capacity, unschedulable=bad,
            unfinished=sorted(j.tj.id for j in jobs if j.end is None), rounds=rounds, preemptions=preemptions,
            busy_gpu_s=busy_gpu_s, lost_gpu_s=0.0, end_s=now, lower_bound_avg_jct_s=lb_avg,
            lower_bound_makespan_s=lb_mk, wall_s=time.perf_counter() - wall0, busy=busy,
            prior_rate_jobs=sum(not model.measured(j.tj.job_type, j.tj.gpus) for j in jobs),
        )

    def _record(self, j: _GJob) -> JobRecord:
        tj = j.tj
        assert j.end is not None and j.first_start is not None
        jct = j.end - tj.arrival_s
        fastest = tj.work / max(j.rates.values())
        n_avg = j.arrived_integral / jct if jct > 0 else 1.0
        total = sum(self.capacity.values())
        top = max(j.rates.values())
        avg_rel = sum(j.rates.get(t, 0.0) / top * n for t, n in self.capacity.items()) / total
        share = min(1.0, total / (max(1.0, n_avg) * tj.gpus))
        t_iso = fastest / max(1e-12, avg_rel * share)
        return JobRecord(
            id=tj.id, name=tj.name, job_type=tj.job_type, gpus=tj.gpus, arrival_s=tj.arrival_s,
            start_s=j.first_start, end_s=j.end, jct_s=jct, queue_s=jct - j.run_s, run_s=j.run_s,
            restarts=j.restarts, migrations=j.migrations, last_gpu_type=j.last_type,
            fastest_runtime_s=fastest, ftf_rho=jct / t_iso if t_iso > 0 else math.inf, overhead_s=0.0,
        )
