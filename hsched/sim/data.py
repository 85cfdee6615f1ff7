"""Data locality in the simulator: which dataset each job reads, where datasets are, and what copies cost.

A `DataModel` says each job's dataset (name, size), the server each dataset starts on (its home copy, never
evicted), the link speed copies run at, and each server's quota for copies. Traces do not say what data their
jobs read, so `synthetic_data` makes a reproducible model: each job type (each user, else each job, for traces
without types) maps to one of K datasets, sizes log-uniform in [lo, hi] GB, homes drawn among the servers, all
from one seed.

During a replay `DataState` tracks the copies. A job that starts on servers without its data holds its GPUs for
the copy (size / link speed; a gang over servers copies to each in parallel) before it progresses, and the data
then stays there (least recently used copies are evicted past the quota; copies in use by a running job never
are). A start on a server where a copy is still arriving waits for the rest of it.

`LocalityPlacer` is placement under `Locality.AWARE`: among the servers of the GPU type the policy chose, those
holding the job's data come first; when none has room, a waiting job waits for a holder if the holder is
predicted to free no later than the copy would finish, counting what it has waited already
(`hsched.sched.locality.choose_wait`, the live rule), else starts elsewhere and pays the copy. A job that waits
holds that holder (a `Reservation`): other jobs keep off its free GPUs unless it still has room for the waiting
job in time (`leaves_room`), and nobody else waits for it. The engine runs the round again without the jobs that
chose to wait, so the GPUs the policy counted for them go to the jobs behind. Under `Locality.IGNORE` the usual
placer places, and copies are paid.

Prefetch (`prefetch_copies`, `DataState.prefetch`; the engine's `SimConfig.prefetch_s`) is the live controller's rule
itself (hsched.sched.stages.locality.prefetch_rule): after each round, for the first PREFETCH_JOBS waiting jobs with
data (the live queue order: QoS class, priority, arrival), the server where each could compute soonest (its predicted
free time, or the copy's end when later; the GPUs the jobs ahead would take first count as taken) when it lacks the
data and the job is predicted to have room there within the horizon plus the copy's time, unless waiting for a
holder is as good (`choose_wait`). The copy starts at once, in the background (no GPUs held), and lands in that
server's copies under the LRU quota; a job that starts there
waits only for the rest of it. A prefetch that no job uses before it is evicted, or by the end, is wasted.

Simplifications: copies do not share bandwidth (each runs at the link speed, all at once, as the live controller
runs its copies in parallel), and a copy comes from any holder.
"""

from __future__ import annotations

import math
import random
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from hsched.errors import UserError
from hsched.model import Placement
from hsched.sched.locality import choose_wait, copy_seconds, leaves_room, link_bytes_per_s
from hsched.sched.placement import PackingPlacer, Placer, best_fit_key
from hsched.sched.stages.locality import (  # noqa: F401  (PREFETCH_*: re-exported, the engine reads them here)
    PREFETCH_JOBS,
    PREFETCH_LOOKAHEAD,
    prefetch_rule,
)
from hsched.sched.view import JobView, ServerView
from hsched.sim.bounds import check
from hsched.sim.trace import Trace

GB = 1_000_000_000

DEFAULT_DATASETS = 16
DEFAULT_LO_GB = 50.0
DEFAULT_HI_GB = 500.0
DEFAULT_LINK_GBPS = 10.0
DEFAULT_QUOTA_GB = 1000.0
MAX_DATASETS = 10_000
MAX_DATASET_GB = 1e6


@dataclass(frozen=True, slots=True)
class Dataset:
    name: str
    size_bytes: int
    home: str
    """The server holding it from the start (the origin: never evicted, outside the quota)."""


@dataclass(frozen=True, slots=True)
class DataModel:
    """What the jobs of one trace read, and the cost of moving it."""

    datasets: tuple[Dataset, ...]
    of_job: Mapping[int, int]
    """Job id -> index into `datasets`; a job not here reads nothing."""
    link_bytes_per_s: float
    quota_bytes: int
    """Per server, for copies (home copies do not count)."""
    description: str = ""

    def copy_s(self, ds: int) -> float:
        return copy_seconds(self.datasets[ds].size_bytes, self.link_bytes_per_s)


@dataclass(frozen=True, slots=True)
class SyntheticSpec:
    """`--data-model synthetic[:K[:LO-HI]]`: K datasets of LO to HI GB."""

    datasets: int = DEFAULT_DATASETS
    lo_gb: float = DEFAULT_LO_GB
    hi_gb: float = DEFAULT_HI_GB


_SPEC = re.compile(r"^synthetic(?::(\d+)(?::([0-9.]+)-([0-9.]+))?)?$")


def parse_data_model(spec: str) -> SyntheticSpec:
    """'synthetic', 'synthetic:16' or 'synthetic:16:50-500' (sizes in GB)."""
    m = _SPEC.match(spec.strip().lower())
    bad = UserError(f"--data-model {spec!r}: expected synthetic[:K[:LO-HI]], K datasets of LO to HI GB, "
                    f"such as synthetic:16:50-500")
    if m is None:
        raise bad
    k = (int(m.group(1)) if len(m.group(1)) <= 9 else MAX_DATASETS + 1) if m.group(1) else DEFAULT_DATASETS
    try:
        lo = float(m.group(2)) if m.group(2) else DEFAULT_LO_GB
        hi = float(m.group(3)) if m.group(3) else DEFAULT_HI_GB
    except ValueError:
        raise bad from None
    if not 1 <= k <= MAX_DATASETS or not 0 < lo <= hi <= MAX_DATASET_GB:
        raise UserError(f"--data-model {spec!r}: need K >= 1 (at most {MAX_DATASETS:,}) and 0 < LO <= HI <= "
                        f"{MAX_DATASET_GB:,.0f} (GB)")
    return SyntheticSpec(k, lo, hi)


def _key(job_type: str, user: str, job_id: int) -> str:
    # the same job type reads the same data; without types a user's jobs share theirs, else each job its own
    return f"type:{job_type}" if job_type else f"user:{user}" if user else f"job:{job_id}"


def synthetic_data(trace: Trace, servers: Sequence[ServerView], spec: SyntheticSpec | None = None, *, seed: int = 0,
                   link_gbps: float = DEFAULT_LINK_GBPS, quota_gb: float = DEFAULT_QUOTA_GB) -> DataModel:
    """A reproducible data model for a trace without one: the same arguments always give the same model."""
    spec = spec or SyntheticSpec()
    # finite: a nan link speed made every copy "not done yet", for ever
    check(link_gbps, "--data-link-gbps", "Gbit/s", low=0, high=1e6, above=True)
    check(quota_gb, "--data-quota", "GB per server for copies", low=0, high=1e12)
    if not servers:
        raise UserError("data model: no servers to put the datasets on")
    # a stream of its own (string seeds are hashed deterministically), so the data model does not shift the
    # trace's or Gavel's seeded draws
    rng = random.Random(f"hsched-data:{seed}")
    names = sorted(s.name for s in servers)
    lo, hi = math.log(spec.lo_gb), math.log(spec.hi_gb)
    datasets = tuple(Dataset(f"d{i}", round(math.exp(rng.uniform(lo, hi)) * GB), rng.choice(names))
                     for i in range(spec.datasets))
    keys = sorted({_key(j.job_type, j.user, j.id) for j in trace.jobs})
    rng.shuffle(keys)
    index = {k: i % spec.datasets for i, k in enumerate(keys)}
    of_job = {j.id: index[_key(j.job_type, j.user, j.id)] for j in trace.jobs}
    desc = (f"synthetic:{spec.datasets}:{spec.lo_gb:g}-{spec.hi_gb:g} seed={seed} link={link_gbps:g}Gbit/s "
            f"quota={quota_gb:g}GB")
    return DataModel(datasets, of_job, link_bytes_per_s(link_gbps), round(quota_gb * GB), desc)


class DataState:
    """Where the copies are during one replay, and what they cost (the counters end up in the summary)."""

    def __init__(self, model: DataModel) -> None:
        self.model = model
        # per server: dataset -> when its copy is there (ready), least recently used first
        self.cached: dict[str, OrderedDict[int, float]] = {}
        self.home = {i: d.home for i, d in enumerate(model.datasets)}
        self.in_use: dict[tuple[str, int], int] = {}
        self.used: dict[str, int] = {}
        self.bytes_copied = 0
        self.copies = 0
        self.copy_wait_s = 0.0
        """Seconds jobs held GPUs waiting for data, summed over starts."""
        self.copy_gpu_s = 0.0
        self.starts = 0
        self.hits = 0
        self.evictions = 0
        self.waits = 0
        """Times a job waited for a busy holder rather than copy (decisions, one per round it waited)."""
        self.wait_jobs = 0
        """Jobs that waited for a holder at least once (per start: a job preempted may wait again)."""
        self.wait_s = 0.0
        """Seconds from a job's first decision to wait to its start, summed."""
        self.gave_up = 0
        """Starts after a wait where the data was not: the holder did not free in time (`choose_wait`'s bound)."""
        self.backfills = 0
        """Starts on a holder held for another waiting job, which left it room in time (`leaves_room`)."""
        self.prefetches = 0
        """Copies started ahead of a job's start (`prefetch`); they count in `copies` and `bytes_copied` too."""
        self.prefetch_bytes = 0
        self.prefetch_hits = 0
        """Prefetched copies a start used (the first start there: a job started where its data was prefetched).
        Every prefetch ends up a hit or wasted."""
        self.prefetch_refused = 0
        """Prefetches not started: the copy would not fit the server's quota."""
        self.prefetch_evicted = 0
        """Prefetched copies evicted before any start used them (wasted; `summary` adds those unused at the end)."""
        self.unused: set[tuple[str, int]] = set()
        """(server, dataset) prefetched there and not used by a start yet."""

    def dataset(self, job_id: int) -> int | None:
        return self.model.of_job.get(job_id)

    def ready_in(self, server: str, ds: int, now: float) -> float | None:
        """Seconds until `ds` is on `server` (0 when there; the rest of an arriving copy), None when absent."""
        if self.home[ds] == server:
            return 0.0
        lru = self.cached.get(server)
        at = None if lru is None else lru.get(ds)
        return None if at is None else max(0.0, at - now)

    def acquire(self, ds: int, nodes: Sequence[str], gpus: int, now: float) -> float:
        """A job reading `ds` starts on `nodes`: copies what is missing; returns the seconds before it can run."""
        wait = 0.0
        copied = False
        size = self.model.datasets[ds].size_bytes
        for n in nodes:
            r = self.ready_in(n, ds, now)
            if r is not None and (n, ds) in self.unused:
                self.unused.discard((n, ds))
                self.prefetch_hits += 1
            if r is None:
                r = self.model.copy_s(ds)
                self.bytes_copied += size
                self.copies += 1
                copied = True
                lru = self.cached.setdefault(n, OrderedDict())
                lru[ds] = now + r
                self.used[n] = self.used.get(n, 0) + size
            elif self.home[ds] != n:
                self.cached[n].move_to_end(ds)
            self.in_use[(n, ds)] = self.in_use.get((n, ds), 0) + 1
            if copied:
                self._evict(n, now)
            wait = max(wait, r)
        self.starts += 1
        self.hits += not copied
        self.copy_wait_s += wait
        self.copy_gpu_s += wait * gpus
        return wait

    def release(self, ds: int, nodes: Sequence[str], now: float) -> None:
        """The job reading `ds` on `nodes` stopped: its copies become evictable, as the most recently used."""
        for n in nodes:
            k = (n, ds)
            left = self.in_use[k] - 1
            if left:
                self.in_use[k] = left
            else:
                del self.in_use[k]
            lru = self.cached.get(n)
            if lru is not None and ds in lru:
                lru.move_to_end(ds)
        for n in nodes:
            self._evict(n, now)

    def prefetch(self, ds: int, server: str, now: float) -> bool:
        """Start copying `ds` to `server` ahead of a start (no GPUs held). False when it is there or arriving, or
        when it would not fit the quota even with every copy there that nobody reads evicted: the live controller's
        copy fails then (hsched.controller.data._make_room), where a start's copy here still goes over."""
        if self.ready_in(server, ds, now) is not None:
            return False
        size = self.model.datasets[ds].size_bytes
        lru = self.cached.setdefault(server, OrderedDict())
        idle = sum(self.model.datasets[d].size_bytes for d, at in lru.items()
                   if at <= now and (server, d) not in self.in_use)
        if self.used.get(server, 0) - idle + size > self.model.quota_bytes:
            self.prefetch_refused += 1
            return False
        lru[ds] = now + self.model.copy_s(ds)
        self.used[server] = self.used.get(server, 0) + size
        self.unused.add((server, ds))
        self.prefetches += 1
        self.prefetch_bytes += size
        self.copies += 1
        self.bytes_copied += size
        self._evict(server, now)
        return True

    def _evict(self, server: str, now: float) -> None:
        """Least recently used copies not in use go until the server is within its quota (or none is left). A
        prefetch still arriving is not evicted: like a copy in use, it is not there to be dropped yet."""
        lru = self.cached.get(server)
        if lru is None:
            return
        for ds in list(lru):
            if self.used.get(server, 0) <= self.model.quota_bytes:
                return
            if (server, ds) in self.in_use:
                continue
            unused = (server, ds) in self.unused
            if unused and lru[ds] > now:
                continue
            del lru[ds]
            self.used[server] -= self.model.datasets[ds].size_bytes
            self.evictions += 1
            if unused:
                self.unused.discard((server, ds))
                self.prefetch_evicted += 1

    def summary(self) -> dict[str, Any]:
        return {
            "data_model": self.model.description,
            "data_bytes_copied": self.bytes_copied,
            "data_gb_copied": self.bytes_copied / GB,
            "data_copies": self.copies,
            "data_copy_s": self.copy_wait_s,
            "data_copy_gpu_hours": self.copy_gpu_s / 3600.0,
            "data_starts": self.starts,
            "data_hit_rate": self.hits / self.starts if self.starts else None,
            "data_evictions": self.evictions,
            "data_waits": self.waits,
            "data_wait_jobs": self.wait_jobs,
            "data_wait_s": self.wait_s,
            "data_gave_up": self.gave_up,
            "data_backfills": self.backfills,
            "data_prefetches": self.prefetches,
            "data_prefetch_bytes": self.prefetch_bytes,
            "data_prefetch_gb": self.prefetch_bytes / GB,
            "data_prefetch_hits": self.prefetch_hits,
            "data_prefetch_wasted": self.prefetch_evicted + len(self.unused),
            "data_prefetch_refused": self.prefetch_refused,
        }


@dataclass(frozen=True, slots=True)
class Waiting:
    """A waiting job as `prefetch_copies` sees it."""

    job_id: int
    gpus: int
    servers: tuple[str, ...]
    """The servers it may run on whole (a GPU type it runs on, enough devices), in fleet order; none for a gang
    that must span servers (the live rule looks at one-node jobs only)."""


class _SimFleet:
    """`PrefetchView` over the simulator's state: `free_in(server, n)` predicts when `n` GPUs of the server are free
    (the running jobs' ends); the GPUs the jobs ahead took are the first to free, so a job of g GPUs behind k taken
    ones has room when k + g are free."""

    def __init__(self, state: DataState, free_in: Callable[[str, int], float | None], now: float) -> None:
        self.state = state
        self.predict = free_in
        self.now = now
        self.taken: dict[str, int] = {}

    def nodes(self, job: Waiting) -> Sequence[str]:
        return job.servers

    def free_in(self, job: Waiting, node: str) -> float | None:
        return self.predict(node, self.taken.get(node, 0) + job.gpus)

    def copy_s(self, job: Waiting, node: str) -> float:
        ds = self.state.dataset(job.job_id)
        if ds is None:
            return 0.0
        ready = self.state.ready_in(node, ds, self.now)
        return self.state.model.copy_s(ds) if ready is None else ready

    def has_data(self, job: Waiting) -> bool:
        return self.state.dataset(job.job_id) is not None

    def take(self, job: Waiting, node: str) -> None:
        self.taken[node] = self.taken.get(node, 0) + job.gpus

    def lacking(self, job: Waiting, node: str) -> tuple[int, ...]:
        ds = self.state.dataset(job.job_id)
        # (a copy under way there is not started again)
        return () if ds is None or self.state.ready_in(node, ds, self.now) is not None else (ds,)


def prefetch_copies(state: DataState, queue: Iterable[Waiting], free_in: Callable[[str, int], float | None],
                    now: float, horizon_s: float) -> list[tuple[int, str, int]]:
    """(job, server, dataset to copy there): the live rule (hsched.sched.stages.locality.prefetch_rule, the one
    `prefetch_targets` runs) on the simulator's state, the queue in the live queue order."""
    return [(w.job_id, name, cast(int, what[0]))
            for w, name, what in prefetch_rule(_SimFleet(state, free_in, now), queue, horizon_s)]


FreeIn = Callable[[str, int, int], float | None]
"""(server, GPUs wanted, GPUs free there now) -> predicted seconds until that many are free, None if never."""


@dataclass(frozen=True, slots=True)
class Reservation:
    """A waiting job's hold on a server holding its data."""

    job_id: int
    gpus: int
    at_s: float
    """When the holder is predicted to have room for it (simulated time)."""
    until_s: float
    """Its first wait plus its copy: past this it copies instead (`choose_wait`'s bound), and the hold lapses."""


class LocalityPlacer:
    """`Locality.AWARE` placement: servers holding the job's data first, waiting for a busy one when it pays.

    Args:
        base: the placer for jobs without data and for the fallback (default: consolidating best fit).
        state: the replay's copies.
        servers: every server of the fleet (holders may have no free device, and so be absent from a round's list).
        free_in: the simulator's prediction of when a server will have room.
        free_now: the simulator's count of free devices per server, for servers a round does not list.
        clock: the simulated time now.

    The engine calls `started` for every start, and reads and clears `round_waiters` after each round.
    """

    def __init__(self, state: DataState, servers: Sequence[ServerView], free_in: FreeIn,
                 free_now: Callable[[str], int], clock: Callable[[], float], base: Placer | None = None) -> None:
        self.base = base or PackingPlacer()
        self.state = state
        self.servers = {s.name: s for s in servers}
        self.free_in = free_in
        self.free_now = free_now
        self.clock = clock
        self.reserved: dict[str, Reservation] = {}
        """Holder -> the waiting job it is held for (one per holder: the first in line)."""
        self.waiting_since: dict[int, float] = {}
        """Job -> when it first chose to wait, until it starts."""
        self.round_waiters: set[int] = set()
        """Jobs that chose to wait since the engine last cleared it."""

    def place(self, gpus: int, servers: Sequence[ServerView], free: Mapping[str, Sequence[str]],
              max_servers: int | None, job: JobView | None = None) -> tuple[Placement, ...] | None:
        now = self.clock()
        jid = None if job is None else job.id
        if self.reserved:
            held = self._held_from(jid, gpus, servers, free, now)
            if held:
                servers = [s for s in servers if s.name not in held]
                free = {k: v for k, v in free.items() if k not in held}
        ds = None if job is None else self.state.dataset(job.id)
        if ds is None or not servers:
            return self.base.place(gpus, servers, free, max_servers, job=job)
        state = self.state
        best: tuple[float, tuple[int, int, str], ServerView] | None = None
        for s in servers:
            n = len(free.get(s.name, ()))
            if n < gpus:
                continue
            ready = state.ready_in(s.name, ds, now)
            if ready is None:
                continue
            key = (ready, best_fit_key(s, n), s)
            if best is None or key[:2] < best[:2]:
                best = key
        if best is not None:
            s = best[2]
            return (Placement(s.name, tuple(free[s.name][:gpus])),)
        if job is not None and not job.running:
            # no holder of this type has room: wait for the one that frees soonest, unless it is held for another
            # waiting job (first in line) or the wait would outlast the copy
            gpu_type = servers[0].gpu_type
            listed = {s.name for s in servers}
            soonest: tuple[float, str] | None = None
            for name, s in self.servers.items():
                if s.gpu_type != gpu_type or len(s.devices) < gpus or state.ready_in(name, ds, now) is None:
                    continue
                r = self.reserved.get(name)
                if r is not None and r.job_id != job.id:
                    continue
                n = len(free.get(name, ())) if name in listed else self.free_now(name)
                t = self.free_in(name, gpus, n)
                if t is not None:
                    t = max(t, state.ready_in(name, ds, now) or 0.0)  # a copy arriving (a prefetch): its rest too
                if t is not None and (soonest is None or t < soonest[0]):
                    soonest = (t, name)
            copy_s = state.model.copy_s(ds)
            since = self.waiting_since.get(job.id)
            waited = 0.0 if since is None else now - since
            self._release(job.id)
            if choose_wait(copy_s, None if soonest is None else soonest[0], waited):
                assert soonest is not None
                state.waits += 1
                if since is None:
                    state.wait_jobs += 1
                    since = self.waiting_since[job.id] = now
                self.round_waiters.add(job.id)
                self.reserved[soonest[1]] = Reservation(job.id, gpus, now + max(0.0, soonest[0]), since + copy_s)
                return None
        return self.base.place(gpus, servers, free, max_servers, job=job)

    def started(self, job_id: int, nodes: Sequence[str], now: float) -> None:
        """The engine starts `job_id` on `nodes` (before its data is acquired there): its wait, if it waited, is
        over (and was given up if the data is not there), and its hold lapses."""
        state = self.state
        since = self.waiting_since.pop(job_id, None)
        if since is not None:
            state.wait_s += now - since
            ds = state.dataset(job_id)
            if ds is not None and any(state.ready_in(n, ds, now) is None for n in nodes):
                state.gave_up += 1
        self._release(job_id)
        for n in nodes:
            r = self.reserved.get(n)
            if r is not None and r.job_id != job_id:
                self.state.backfills += 1

    def _release(self, job_id: int) -> None:
        for name in [n for n, r in self.reserved.items() if r.job_id == job_id]:
            del self.reserved[name]

    def _held_from(self, job_id: int | None, gpus: int, servers: Sequence[ServerView],
                   free: Mapping[str, Sequence[str]], now: float) -> set[str]:
        """The holders held for other waiting jobs that `job_id` may not use: taking `gpus` of their free GPUs
        would leave no room for the waiting job by its time. Holds past their bound lapse here."""
        listed = {s.name for s in servers}
        out: set[str] = set()
        for name, r in list(self.reserved.items()):
            if r.job_id == job_id or name not in listed:
                continue
            if now > r.until_s:
                del self.reserved[name]
                continue
            n = len(free.get(name, ()))
            if n < gpus or not leaves_room(self.free_in(name, r.gpus, n - gpus), r.at_s - now):
                out.add(name)
        return out
