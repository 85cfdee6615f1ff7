"""The controller's cache of the store's jobs that have not ended (JobCache), read by the round, monitoring and
the API. A module of its own, below the launcher: what monitoring and learning read (usage, learning) needs no
import of the launcher, which imports them."""

from __future__ import annotations

from collections.abc import Iterable

from hsched.controller.core import Controller
from hsched.controller.state import JobCache, Jobs  # noqa: F401  (re-exported)
from hsched.controller.store import Store
from hsched.model import Job


def _changes(store: Store) -> int:
    """Rows the store's connection has changed since it opened (sqlite's total_changes): equal twice, nothing was
    written in between. On the store's thread."""
    return store.db.total_changes


def _jobs_now(store: Store, ids: Iterable[int]) -> dict[int, Job | None]:
    return {i: store.get_job(i) for i in ids}


def job_cache(ctl: Controller) -> JobCache:
    """The controller's job cache (one per controller: a test process may hold several)."""
    return ctl.state.jobs
