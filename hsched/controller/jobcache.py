"""The controller's cache of the store's jobs that have not ended (JobCache), read by the round, monitoring and
the API. A module of its own, below the launcher: what monitoring and learning read (usage, learning) needs no
import of the launcher, which imports them."""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hsched.controller.core import Controller
from hsched.model import Job, JobState
from hsched.store import Store, job_from_row


def _changes(store: Store) -> int:
    """Rows the store's connection has changed since it opened (sqlite's total_changes): equal twice, nothing was
    written in between. On the store's thread."""
    return store.db.total_changes


def _jobs_now(store: Store, ids: Iterable[int]) -> dict[int, Job | None]:
    return {i: store.get_job(i) for i in ids}


@dataclass(frozen=True, slots=True)
class Jobs:
    """The store's jobs that have not ended, as one read saw them (`JobCache.read`), split and indexed once."""

    changes: int
    """The store's change count at the read (`_changes`)."""
    all: tuple[Job, ...]
    """Every job not ended, by id."""
    queued: tuple[Job, ...]
    """The pending jobs not held."""
    active: tuple[Job, ...]
    """The jobs holding devices."""
    queued_by_id: Mapping[int, Job]
    active_by_id: Mapping[int, Job]
    users: frozenset[str]
    """The users of the queued and active jobs."""
    special: bool
    """Some queued job has a begin time (a retry's backoff), a dependency or an array's %N: the round must look at
    each; else every queued job may start."""

    @classmethod
    def of(cls, changes: int, jobs: tuple[Job, ...]) -> Jobs:
        pending, holding = JobState.PENDING, frozenset(s for s in JobState if s.is_active())
        queued = tuple(j for j in jobs if j.state is pending and not j.spec.hold)
        active = tuple(j for j in jobs if j.state in holding)
        special = any(j.begin_time is not None or j.spec.dependency
                      or (j.spec.array is not None and j.spec.array.max_running) for j in queued)
        return cls(changes, jobs, queued, active, {j.id: j for j in queued}, {j.id: j for j in active},
                   frozenset(j.user for j in (*queued, *active)), special)


class JobCache:
    """The store's jobs that have not ended, as Job objects, kept from one read to the next.

    Decoding 2,000 pending jobs afresh costs ~150 ms of CPU (each spec is JSON), fetching them as rows ~17 ms. So
    the cache reads nothing while the store's connection has made no change since the last read (sqlite's
    `total_changes`: every write of the controller goes through that one connection, on its one thread), and
    otherwise decodes only rows it has not seen: an unchanged row gives the very Job object it gave before, so
    `is` tells the round's checks that a job is as the round saw it. Each read hands out an immutable `Jobs`: a
    later read (the health loop's, say) never changes what a round is looking at.
    """

    __slots__ = ("last", "rows")

    def __init__(self) -> None:
        self.last = Jobs.of(-1, ())
        self.rows: dict[tuple[object, ...], Job] = {}

    def read(self, store: Store) -> Jobs:
        """The jobs not ended, now. Blocking: call it on the store's thread (`ctl.db`)."""
        changes = store.db.total_changes
        if changes == self.last.changes:
            return self.last
        seen = self.rows
        rows: dict[tuple[object, ...], Job] = {}
        for r in store.job_rows(active_only=True):
            key = tuple(r)
            job = seen.get(key)
            rows[key] = job if job is not None else job_from_row(r)
        self.rows, self.last = rows, Jobs.of(changes, tuple(rows.values()))
        return self.last


_CACHES: weakref.WeakKeyDictionary[Controller, JobCache] = weakref.WeakKeyDictionary()


def job_cache(ctl: Controller) -> JobCache:
    """The controller's job cache (one per controller: a test process may hold several)."""
    cache = _CACHES.get(ctl)
    if cache is None:
        cache = _CACHES[ctl] = JobCache()
    return cache
