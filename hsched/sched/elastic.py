"""Elastic jobs: the pure grow/shrink decision the simulator (hsched.sim) and the live controller both call.

An elastic job runs at any allowed size between its `min_size` and `max_size` GPUs. Each round the caller hands
`plan_resizes` the elastic jobs that run, the GPUs free in each pool and the jobs that wait, and gets back the
resizes to make (each one a checkpoint and restart at the new size, the same path as a move).

Public API (callers use exactly these names; everything else here is private):

    class Direction(enum.StrEnum): GROW = "grow"; SHRINK = "shrink"

    @dataclass(frozen=True, slots=True)
    class ElasticJob:
        id: int
        size: int                       # GPUs it holds now
        min_size: int
        max_size: int
        rates: tuple[tuple[int, float], ...]   # (size, throughput) known for this job on its GPU type, any unit
                                        # (steps/s, samples/s), the same for all sizes; empty: scaling unknown
        run_s: float                    # seconds it has run (all its runs): the expected remaining time when
                                        # remaining_s is None (heavy tail, as moves assume)
        checkpoint_cost_s: float        # what a checkpoint and restart costs it
        proven_checkpoint: bool         # it has checkpointed and resumed before; never resized otherwise
        pool: str = ""                  # where it can grow: the key of `free` it runs in (a GPU type or a node)
        user: str = ""
        base_size: int | None = None    # the size it asked for (None: min_size); GPUs above it are borrowed
        remaining_s: float | None = None  # a prediction of its remaining time at its current size, if any
        any_size: bool = False          # any size in [min, max]; False: powers of two (and min, max) only
        grow_room: int | None = None    # at most this many GPUs more (e.g. those free on its own node); None: the
                                        # pool's free GPUs

    @dataclass(frozen=True, slots=True)
    class Waiting:
        id: int
        gpus: int                       # what it needs to start
        pools: tuple[str, ...] = ()     # the pools it can start in (empty: any key of `free`)
        user: str = ""

    @dataclass(frozen=True, slots=True)
    class Resize:
        job_id: int
        old: int
        new: int
        direction: Direction
        reason: str                     # one line, for the grow/shrink event
        gain_s: float                   # grow: seconds it is expected to save; shrink: seconds it is expected to
                                        # lose (negative for a shrink to a faster size: what it saves)
        cost_s: float                   # the checkpoint and restart it costs
        pool: str
        for_job: int | None = None      # shrink: the waiting job it makes room for

    def allowed_sizes(min_size: int, max_size: int, any_size: bool = False) -> tuple[int, ...]
    def rate_at(rates: Sequence[tuple[int, float]], size: int) -> float | None
    def fair_gpus(user_usage: Mapping[str, float], total_gpus: int) -> dict[str, float]
    def plan_resizes(jobs: Sequence[ElasticJob], free: Mapping[str, int], waiting: Sequence[Waiting], *,
                     round_s: float = 360.0, fair: Mapping[str, float] | None = None,
                     held: Mapping[str, int] | None = None, grow: bool = True,
                     outbid: float | None = None, shrink_loss: float = 1.0) -> tuple[Resize, ...]
        # free: GPUs free now per pool; waiting: the jobs that wait, most important first; round_s: the least
        # expected remaining time (as moves); grow=False: no growth into idle GPUs (step 2), as before a round whose
        # moves may want them; outbid: see step 0b (None: off, the default); shrink_loss: see step 1

`plan_resizes`'s rule (waiting jobs before growth: a waiting job has no throughput at all). Speeds compare across
jobs in GPU-equivalents: a job's rate at a size times its base size over its rate at its base size (a waiting job
gets 1 per GPU it is given).

0a. Right size. A job faster at a smaller allowed size than at its own (a measured scaling that falls: Gavel's table
   has models slower at 4 GPUs than at 2) shrinks to its fastest smaller size when the saving pays for the restart
   (the rule of step 2); the GPUs it frees count as free for the steps below.
0b. Outbid (only with `outbid`): a job grows into free GPUs a waiting job could use when each GPU adds more than
   `outbid` GPU-equivalents of its speed (a scaling measured superlinear). Measured on Gavel's traces it lost, so off.
1. Contention. The waiting jobs, in the order given, each take free GPUs of a pool it can use. One that does not fit
   makes elastic jobs of that pool shrink, never below `min_size`: the GPUs they borrowed (above `base_size`)
   whatever they add, and GPUs at or below their base size only where the job loses less than one GPU-equivalent
   per GPU freed, what the waiting job gets from it (its marginal throughput there is below the waiting job's; a
   threshold of 1/2 or 3/4 measured worse on 0e4a51, docs/scheduling.md). `shrink_loss` is that threshold (default 1);
   `math.inf`: down to `min_size` whatever it loses, as the issue words it, which the simulator uses when the waiting
   jobs are ordered by remaining time (the waiting job that starts is worth more than the GPU-equivalents it gets:
   0e4a51 709,003 -> 619,849 s avg JCT, docs/scheduling.md). Shrinks are planned only when they free
   enough for the waiting job to start (all or nothing), the job whose first step loses least per GPU first.
2. Growth. The GPUs still free after the waiting jobs took theirs would otherwise idle: elastic jobs in that pool
   grow into them step by step, the best marginal speed-up per added GPU first, when the expected saving pays for
   the restart by the rule moves use (hsched.sched.policies.hsched: `speedup_gain` over `expected_remaining_s`,
   `gain_pays`: more than twice the checkpoint cost, the second restart being the shrink that may follow), and only
   while the user stays within their fair share (`fair`: GPUs each user may hold, see `fair_gpus`; `held`: GPUs
   each holds now) when another user waits, and never by more than its `grow_room`.

Only jobs with `proven_checkpoint` are resized. Each job is resized at most once a plan (one restart a round). Pure:
no I/O, no module state, deterministic (ties by job id).

The per-size model (`rate_at`): a measured size is its rate; between two measured sizes the per-GPU rate is
interpolated linearly (never above the faster of the two); below the smallest measured size the smallest's
per-GPU rate; above the largest measured size, the largest's rate (no extrapolation of a speed-up never seen).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hsched.sched.policies.hsched import expected_remaining_s, gain_pays, speedup_gain


class Direction(enum.StrEnum):
    GROW = "grow"
    SHRINK = "shrink"


RIGHT_SIZE_MARGIN = 1.1
"""A job shrinks to a smaller size that is faster (step 0a) only when it is faster by this factor: live speeds are
measured from a few progress reports, and on a loaded machine a job's 4-GPU speed once read below its 2-GPU one
(a 2 -> 8 -> 4 trainer was shrunk on to 2); Gavel's falling scalings are larger than that."""

@dataclass(frozen=True, slots=True)
class ElasticJob:
    """A running elastic job as the decision sees it (see the module docstring for each field)."""

    id: int
    size: int
    min_size: int
    max_size: int
    rates: tuple[tuple[int, float], ...]
    run_s: float
    checkpoint_cost_s: float
    proven_checkpoint: bool
    pool: str = ""
    user: str = ""
    base_size: int | None = None
    remaining_s: float | None = None
    any_size: bool = False
    grow_room: int | None = None

    @property
    def base(self) -> int:
        return self.min_size if self.base_size is None else self.base_size


@dataclass(frozen=True, slots=True)
class Waiting:
    """A job that waits: the GPUs it needs and the pools it may start in (empty: any)."""

    id: int
    gpus: int
    pools: tuple[str, ...] = ()
    user: str = ""


@dataclass(frozen=True, slots=True)
class Resize:
    """One planned resize (see the module docstring)."""

    job_id: int
    old: int
    new: int
    direction: Direction
    reason: str
    gain_s: float
    cost_s: float
    pool: str
    for_job: int | None = None


def allowed_sizes(min_size: int, max_size: int, any_size: bool = False) -> tuple[int, ...]:
    """The sizes a job may run at: every size in [min, max] with `any_size`, else the powers of two in it, with min
    and max themselves (a job that asks for 3-12 may run at 3, 4, 8 or 12)."""
    if min_size < 1 or max_size < min_size:
        return ()
    if any_size:
        return tuple(range(min_size, max_size + 1))
    out = {min_size, max_size}
    p = 1
    while p <= max_size:
        if p >= min_size:
            out.add(p)
        p *= 2
    return tuple(sorted(out))


def rate_at(rates: Sequence[tuple[int, float]], size: int) -> float | None:
    """The throughput at `size` from the known (size, rate) pairs (see the module docstring); None when none known."""
    known = sorted((s, r) for s, r in rates if s >= 1 and r > 0 and math.isfinite(r))
    if not known or size < 1:
        return None
    below = [(s, r) for s, r in known if s <= size]
    above = [(s, r) for s, r in known if s >= size]
    if below and below[-1][0] == size:
        return below[-1][1]
    if not below:
        s0, r0 = above[0]
        return r0 * size / s0
    if not above:
        return below[-1][1]
    (s0, r0), (s1, r1) = below[-1], above[0]
    e0, e1 = r0 / s0, r1 / s1
    per_gpu = e0 + (e1 - e0) * (size - s0) / (s1 - s0)
    return min(size * per_gpu, max(r0, r1))


def fair_gpus(user_usage: Mapping[str, float], total_gpus: int) -> dict[str, float]:
    """GPUs each user may hold while others wait: their normalised share of the fleet where the usage values are
    `hsched.sched.priority.UserShare`s (the policy input's `user_usage`), else an equal share each."""
    if not user_usage:
        return {}
    shares = {u: float(getattr(v, "norm_share", 0.0)) for u, v in user_usage.items()}
    total = sum(shares.values())
    if total <= 0:
        return {u: total_gpus / len(user_usage) for u in user_usage}
    return {u: total_gpus * s / total for u, s in shares.items()}


class _Speeds:
    """One plan's memo of each job's rates and allowed sizes (a plan asks the same ones for every waiting job)."""

    __slots__ = ("_rates", "_sizes")

    def __init__(self) -> None:
        self._rates: dict[tuple[tuple[tuple[int, float], ...], int], float | None] = {}
        self._sizes: dict[tuple[int, int, bool], tuple[int, ...]] = {}

    def rate(self, job: ElasticJob, size: int) -> float | None:
        key = (job.rates, size)
        if key not in self._rates:
            self._rates[key] = rate_at(job.rates, size)
        return self._rates[key]

    def sizes(self, job: ElasticJob) -> tuple[int, ...]:
        key = (job.min_size, job.max_size, job.any_size)
        if key not in self._sizes:
            self._sizes[key] = allowed_sizes(*key)
        return self._sizes[key]

    def equiv(self, job: ElasticJob, size: int) -> float | None:
        """The job's speed at `size` in GPU-equivalents of its base size: base_size at its base size, so that a
        waiting job (which gets 1 per GPU) and jobs of different models compare."""
        r, r0 = self.rate(job, size), self.rate(job, job.base)
        if r is None or r0 is None:
            return None
        return r * job.base / r0

    def shrink_steps(self, job: ElasticJob, size: int, limit: float = 1.0) -> list[tuple[int, float]]:
        """(new size, loss in GPU-equivalents per GPU freed) for each allowed size below `size`, nearest first, as
        long as the step is allowed: GPUs above the base always (they were borrowed), below it only at a loss
        under `limit` (1: what the waiting job would get from them)."""
        cur = self.equiv(job, size)
        out: list[tuple[int, float]] = []
        if cur is None:
            return out
        for s in reversed(self.sizes(job)):
            if s >= size:
                continue
            e = self.equiv(job, s)
            if e is None:
                break
            loss = (cur - e) / (size - s)
            if s < job.base and loss >= limit:
                break
            out.append((s, loss))
        return out


def plan_resizes(
    jobs: Sequence[ElasticJob],
    free: Mapping[str, int],
    waiting: Sequence[Waiting],
    *,
    round_s: float = 360.0,
    fair: Mapping[str, float] | None = None,
    held: Mapping[str, int] | None = None,
    grow: bool = True,
    outbid: float | None = None,
    shrink_loss: float = 1.0,
) -> tuple[Resize, ...]:
    """The resizes to make now (see the module docstring for the rule); at most one per job, ordered by job id."""
    left = {p: max(0, n) for p, n in free.items()}
    usable = sorted(
        (j for j in jobs if j.proven_checkpoint and j.rates and j.min_size <= j.size <= max(j.max_size, j.size)),
        key=lambda j: j.id)
    planned: dict[int, Resize] = {}
    size_now = {j.id: j.size for j in usable}
    by_pool: dict[str, list[ElasticJob]] = {}
    for j in usable:
        by_pool.setdefault(j.pool, []).append(j)
    pools = sorted(set(left) | set(by_pool))
    sp = _Speeds()
    steps_of: dict[int, list[tuple[int, float]]] = {j.id: sp.shrink_steps(j, j.size, shrink_loss) for j in usable}
    # per pool: the GPUs shrinks could still free at most, and the smallest need they could not meet since the pool
    # last changed (a later waiting job that needs as many is not searched for again)
    room = {p: sum(j.size - steps_of[j.id][-1][0] for j in by_pool.get(p, ()) if steps_of[j.id]) for p in pools}
    failed: dict[str, int] = {}

    anyone_waits = bool(waiting)
    waiting_users = {w.user for w in waiting}
    holding = dict(held or {})

    def grow_into(avail: dict[str, int], above: float) -> None:
        """Grow jobs into `avail` (GPUs per pool, taken as used) step by step, the best marginal speed-up per GPU
        first, each step above `above` GPU-equivalents per GPU; a job may take several steps (one restart: its resize
        is from its size to its last step's), each time with the saving from its size paying for that restart."""
        while True:
            best: tuple[float, float, int, int, float, float] | None = None  # (-per GPU, -gain, id, new, gain, cost)
            for p, jobs_here in by_pool.items():
                idle = avail.get(p, 0)
                if idle <= 0:
                    continue
                for j in jobs_here:
                    done = planned.get(j.id)
                    if done is not None and done.direction is not Direction.GROW:
                        continue
                    cur = size_now[j.id]
                    room = idle if j.grow_room is None else min(idle, j.grow_room - (cur - j.size))
                    if fair is not None and anyone_waits and (waiting_users - {j.user}) and j.user in fair:
                        room = min(room, math.floor(fair[j.user] - holding.get(j.user, 0)))
                    e_cur, r_was = sp.equiv(j, cur), sp.rate(j, j.size)
                    if e_cur is None or r_was is None:
                        continue
                    remaining = expected_remaining_s(j.remaining_s, j.run_s, round_s)
                    for s in sp.sizes(j):
                        if s <= cur or s - cur > room:
                            continue
                        e_new, r_new = sp.equiv(j, s), sp.rate(j, s)
                        if e_new is None or r_new is None:
                            continue
                        per_gpu = (e_new - e_cur) / (s - cur)
                        gain = speedup_gain(remaining, r_was, r_new)
                        if per_gpu <= above or gain <= 0 or not gain_pays(gain, j.checkpoint_cost_s):
                            continue
                        key = (-per_gpu, -gain, j.id, s, gain, j.checkpoint_cost_s)
                        if best is None or key < best:
                            best = key
            if best is None:
                return
            per, _, jid, s, gain, cost = best
            j = next(x for x in usable if x.id == jid)
            before, old = size_now[jid], j.size
            why = ("idle GPU(s) no waiting job can use" if above == -math.inf else
                   f"free GPU(s): each adds {-per:.2f} GPU-equivalents of its speed, more than a waiting job gets")
            planned[jid] = Resize(
                jid, old, s, Direction.GROW,
                f"growing from {old} to {s} GPUs into {s - old} {why}: expected to save {gain:.0f} s for a restart "
                f"of {cost:.0f} s", gain, cost, j.pool)
            size_now[jid] = s
            avail[j.pool] -= s - before
            holding[j.user] = holding.get(j.user, 0) + s - before

    # 0. a job faster at a smaller size than at its own, by RIGHT_SIZE_MARGIN (a measured scaling that falls, as
    #    Gavel's table has for some models at 4 GPUs against 2) shrinks to its fastest smaller size when the saving
    #    pays for the restart: it runs faster and its GPUs go to others
    for j in usable:
        cur, r_cur = j.size, sp.rate(j, j.size)
        if r_cur is None:
            continue
        faster = [(r, -s, s) for s in sp.sizes(j)
                  if s < cur and (r := sp.rate(j, s)) is not None and r > RIGHT_SIZE_MARGIN * r_cur]
        if not faster:
            continue
        fast, _, s = max(faster)
        gain = speedup_gain(expected_remaining_s(j.remaining_s, j.run_s, round_s), r_cur, fast)
        if not gain_pays(gain, j.checkpoint_cost_s):
            continue
        planned[j.id] = Resize(
            j.id, cur, s, Direction.SHRINK,
            f"shrinking from {cur} to {s} GPUs: it runs faster at {s} ({fast:.3g} against {r_cur:.3g} a second); "
            f"expected to save {gain:.0f} s for a restart of {j.checkpoint_cost_s:.0f} s", -gain, j.checkpoint_cost_s,
            j.pool)
        size_now[j.id] = s
        left[j.pool] = left.get(j.pool, 0) + cur - s
        room[j.pool] = max(0, room.get(j.pool, 0) - (cur - (steps_of[j.id][-1][0] if steps_of[j.id] else cur)))

    # 0. growth that beats what a waiting job would get from the same free GPUs (a scaling the table measured
    #    superlinear): before the waiting jobs take them
    if waiting and outbid is not None:
        grow_into(left, outbid)

    # 1. contention: each waiting job takes free GPUs, or shrinks make room for it
    for w in waiting:
        where = [p for p in (w.pools or pools) if p in left or p in by_pool]
        fit = next((p for p in where if left.get(p, 0) >= w.gpus), None)
        if fit is not None:
            left[fit] -= w.gpus
            continue
        for p in where:
            need = w.gpus - left.get(p, 0)
            if need > room.get(p, 0) or need >= failed.get(p, 1 << 62):
                continue
            jobs_here = {j.id: j for j in by_pool.get(p, ()) if j.id not in planned}
            steps = {jid: steps_of[jid] for jid in jobs_here}
            take: dict[int, int] = {}  # job id -> new size
            freed = 0
            for jid in sorted((i for i in steps if steps[i]), key=lambda i: (steps[i][0][1], i)):
                if freed >= need:
                    break
                # the smallest shrink of this job that covers what is still needed, else its largest allowed
                cur, want = size_now[jid], need - freed
                pick = next((s for s, _loss in steps[jid] if cur - s >= want), steps[jid][-1][0])
                take[jid] = pick
                freed += cur - pick
            if freed < need:
                failed[p] = need
                continue
            failed.pop(p, None)
            room[p] -= sum(size_now[jid] - steps_of[jid][-1][0] for jid in take)
            for jid, s in take.items():
                j = jobs_here[jid]
                old = size_now[jid]
                r_old, r_new = sp.rate(j, old), sp.rate(j, s)
                assert r_old is not None and r_new is not None
                remaining = expected_remaining_s(j.remaining_s, j.run_s, round_s)
                lost = remaining * (r_old / r_new - 1.0) if r_new > 0 else math.inf
                borrowed = "GPUs it borrowed" if s >= j.base else "GPUs it uses at a poor scaling efficiency"
                planned[jid] = Resize(
                    jid, old, s, Direction.SHRINK,
                    f"shrinking from {old} to {s} GPUs so that waiting job {w.id} ({w.gpus} GPUs) can start: it "
                    f"gives back {borrowed}; expected to cost it {lost:.0f} s plus a restart of "
                    f"{j.checkpoint_cost_s:.0f} s", lost, j.checkpoint_cost_s, p, w.id)
                size_now[jid] = s
            left[p] = left.get(p, 0) + freed - w.gpus
            break

    # 2. growth into GPUs nobody waiting can use
    if grow:
        grow_into(left, -math.inf)
    return tuple(planned[i] for i in sorted(planned))
