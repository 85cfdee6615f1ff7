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
predicted to free no later than the copy would finish (`hsched.sched.locality.choose_wait`, the live rule),
else starts elsewhere and pays the copy. Under `Locality.IGNORE` the usual placer places, and copies are paid.

Simplifications: copies do not share bandwidth (each runs at the link speed), and a copy comes from any holder.
"""

from __future__ import annotations

import math
import random
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hsched.errors import UserError
from hsched.model import Placement
from hsched.sched.locality import choose_wait, copy_seconds, link_bytes_per_s
from hsched.sched.placement import PackingPlacer, Placer, best_fit_key
from hsched.sched.view import JobView, ServerView
from hsched.sim.trace import Trace

GB = 1_000_000_000

DEFAULT_DATASETS = 16
DEFAULT_LO_GB = 50.0
DEFAULT_HI_GB = 500.0
DEFAULT_LINK_GBPS = 10.0
DEFAULT_QUOTA_GB = 1000.0


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
    k = int(m.group(1)) if m.group(1) else DEFAULT_DATASETS
    try:
        lo = float(m.group(2)) if m.group(2) else DEFAULT_LO_GB
        hi = float(m.group(3)) if m.group(3) else DEFAULT_HI_GB
    except ValueError:
        raise bad from None
    if k < 1 or lo <= 0 or hi < lo:
        raise UserError(f"--data-model {spec!r}: need K >= 1 and 0 < LO <= HI (GB)")
    return SyntheticSpec(k, lo, hi)


def _key(job_type: str, user: str, job_id: int) -> str:
    # the same job type reads the same data; without types a user's jobs share theirs, else each job its own
    return f"type:{job_type}" if job_type else f"user:{user}" if user else f"job:{job_id}"


def synthetic_data(trace: Trace, servers: Sequence[ServerView], spec: SyntheticSpec | None = None, *, seed: int = 0,
                   link_gbps: float = DEFAULT_LINK_GBPS, quota_gb: float = DEFAULT_QUOTA_GB) -> DataModel:
    """A reproducible data model for a trace without one: the same arguments always give the same model."""
    spec = spec or SyntheticSpec()
    if link_gbps <= 0:
        raise UserError(f"--data-link-gbps {link_gbps}: must be > 0")
    if quota_gb < 0:
        raise UserError(f"--data-quota {quota_gb}: must be >= 0 (GB per server for copies)")
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
                self._evict(n)
            wait = max(wait, r)
        self.starts += 1
        self.hits += not copied
        self.copy_wait_s += wait
        self.copy_gpu_s += wait * gpus
        return wait

    def release(self, ds: int, nodes: Sequence[str]) -> None:
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
            self._evict(n)

    def _evict(self, server: str) -> None:
        """Least recently used copies not in use go until the server is within its quota (or none is left)."""
        lru = self.cached.get(server)
        if lru is None:
            return
        for ds in list(lru):
            if self.used.get(server, 0) <= self.model.quota_bytes:
                return
            if (server, ds) in self.in_use:
                continue
            del lru[ds]
            self.used[server] -= self.model.datasets[ds].size_bytes
            self.evictions += 1

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
        }


FreeIn = Callable[[str, int, int], float | None]
"""(server, GPUs wanted, GPUs free there now) -> predicted seconds until that many are free, None if never."""


class LocalityPlacer:
    """`Locality.AWARE` placement: servers holding the job's data first, waiting for a busy one when it pays.

    Args:
        base: the placer for jobs without data and for the fallback (default: consolidating best fit).
        state: the replay's copies.
        servers: every server of the fleet (holders may have no free device, and so be absent from a round's list).
        free_in: the simulator's prediction of when a server will have room.
        free_now: the simulator's count of free devices per server, for servers a round does not list.
        clock: the simulated time now.
    """

    def __init__(self, state: DataState, servers: Sequence[ServerView], free_in: FreeIn,
                 free_now: Callable[[str], int], clock: Callable[[], float], base: Placer | None = None) -> None:
        self.base = base or PackingPlacer()
        self.state = state
        self.servers = {s.name: s for s in servers}
        self.free_in = free_in
        self.free_now = free_now
        self.clock = clock

    def place(self, gpus: int, servers: Sequence[ServerView], free: Mapping[str, Sequence[str]],
              max_servers: int | None, job: JobView | None = None) -> tuple[Placement, ...] | None:
        ds = None if job is None else self.state.dataset(job.id)
        if ds is None or not servers:
            return self.base.place(gpus, servers, free, max_servers, job=job)
        state, now = self.state, self.clock()
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
            # no holder of this type has room: wait for one that frees before the copy would be done
            gpu_type = servers[0].gpu_type
            listed = {s.name for s in servers}
            soonest: float | None = None
            for name, s in self.servers.items():
                if s.gpu_type != gpu_type or len(s.devices) < gpus or state.ready_in(name, ds, now) is None:
                    continue
                n = len(free.get(name, ())) if name in listed else self.free_now(name)
                t = self.free_in(name, gpus, n)
                if t is not None and (soonest is None or t < soonest):
                    soonest = t
            if choose_wait(self.state.model.copy_s(ds), soonest):
                state.waits += 1
                return None
        return self.base.place(gpus, servers, free, max_servers, job=job)
