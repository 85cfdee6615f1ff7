"""The controller's state and plumbing: the store's thread, the lock, the clock, wake-ups and signals.

The stages import this module and never the other way round: stopping < checkpoints < ending < launching
< watching < health < loops < commands < api < server (each imports only modules to its left).

All store access goes through one worker thread (`self.db(...)`), so SQLite's fsyncs never block the
event loop and the single connection is never used concurrently. Every decision that reads a job and
then writes it holds `self.lock`, so a cancel and the scheduling round cannot interleave.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import hashlib
import logging
import os
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from hsched.clock import SYSTEM_CLOCK, Clock, Timeline
from hsched.config import FleetConfig, Settings
from hsched.controller.fleet import NodeRuntime, build_fleet
from hsched.controller.state import ControllerState
from hsched.controller.store import Store
from hsched.errors import ExecutorError, HschedError, UserError
from hsched.lifecycle import StopPlan
from hsched.model import Job, JobState, NodeState
from hsched.node.records import read_json
from hsched.paths import Home
from hsched.sched.cache import RoundCache

log = logging.getLogger("hsched.controller")
T = TypeVar("T")

ACTIVE_STATES = tuple(s for s in JobState if s.is_active())

UNHEALTHY_AFTER = 3
"""A loop that fails this many times in a row makes the controller unhealthy (`hsched daemon status`)."""


class Health(enum.StrEnum):
    OK = "ok"
    UNHEALTHY = "unhealthy"
    """A loop keeps failing (UNHEALTHY_AFTER times in a row): the controller runs, but not as it should."""


@dataclass(frozen=True, slots=True)
class LoopRecord:
    """How one of the controller's loops has been doing."""

    failing: int = 0
    """Failures in a row (0 once it succeeds again)."""
    failures: int = 0
    """Failures since the controller started."""
    last_error: str | None = None
    last_error_at: float | None = None


class Stopping(HschedError):
    """The controller stops (or restarts) while a request waits: the request is not carried out."""


def installed_fingerprint() -> str | None:
    """What identifies the installed hsched: its version and its RECORD (the hash of every installed file), so
    a reinstall of other code changes it and a reinstall of the same build does not. None where hsched runs
    from a source tree it was never installed from. Blocking (reads files): call it from a thread."""
    import importlib.metadata

    try:
        dist = importlib.metadata.distribution("hsched")
        record = dist.read_text("RECORD") or ""
        version = dist.version or ""
    except (importlib.metadata.PackageNotFoundError, OSError, KeyError, ValueError):
        return None
    return hashlib.sha256(f"{version}\n{record}".encode()).hexdigest()[:16]


class Controller:
    def __init__(self, home: Home, fleet_cfg: FleetConfig, settings: Settings,
                 store: Store, nodes: dict[str, NodeRuntime] | None = None, clock: Clock = SYSTEM_CLOCK) -> None:
        self.clock = clock
        self.timeline = Timeline(clock)
        """The job timers' clock (limits, stops, backoffs, holds): monotonic, so a step of the wall clock changes
        no decision (hsched.clock)."""
        self.home = home
        self.fleet_cfg = fleet_cfg
        self.settings = settings
        self.store = store
        self.nodes = nodes if nodes is not None else build_fleet(fleet_cfg, lab=home.lab)
        self.lock = asyncio.Lock()
        self.wake = asyncio.Event()
        self.changed = asyncio.Condition()
        self.version = 0
        self.round_cache = RoundCache()
        """What one scheduling round keeps for the next (hsched.sched.cache): used by one round at a time, in the
        round's thread (hsched.controller.launching)."""
        self.stopping = asyncio.Event()
        self.ready = asyncio.Event()
        """Set once every node's first probe has ended and what a previous controller left was adopted: the
        first scheduling round waits for it; requests never do (they answer from what is known)."""
        self.started_at = clock.time()
        self.stops: dict[int, StopPlan] = {}
        """job id -> the signals still to send to a job being cancelled, preempted or timed out."""
        self.warned: set[int] = set()
        self.attempt_start: dict[int, float] = {}
        """job id -> when its current attempt was launched (time limits count per attempt), on `timeline`: a run
        adopted from the store is converted once from its recorded start (`attempt_started`)."""
        self.start_reported: set[int] = set()
        """Jobs whose attempt start their node reported (Slurm's StartTime): converted once, not at every report."""
        self.not_before: dict[int, tuple[float, float]] = {}
        """job id -> (its recorded begin_time, that moment on `timeline`): a retry's backoff, converted once."""
        self._db_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hsched-db")
        self.launching: set[int] = set()
        """Run ids whose launch is in flight: the watcher leaves them alone, so nothing launches twice."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self.probes: set[asyncio.Task[None]] = set()
        """Probes in flight (at most one per node): apart from `_tasks`, since no request or round waits for
        them, and cancelled when the controller stops."""
        self.loops: dict[str, LoopRecord] = {}
        """Loop name ("schedule", "health", "reconcile") -> how it has been doing."""
        self.drain_reasons: dict[str, str] = {}
        """Node name -> the reason given when it was drained."""
        self.fingerprint: str | None = None
        """installed_fingerprint() when the controller started; another one on disk means hsched was
        reinstalled under it."""
        self.restart_reason: str | None = None
        """Set when the controller restarts itself (on a reinstalled hsched) rather than just stopping."""
        self.moved: set[tuple[int, int, str]] = set()
        """(job, attempt, node) whose checkpoint was already brought to the node."""
        self.lock_inode: int | None = None
        self.admin: dict[str, NodeState] = {}
        """Node name -> DRAINED when the user drained it (from the store)."""
        self.launch_slots = asyncio.Semaphore(8)
        """A burst of submissions launches a few at a time, not hundreds of helpers at once."""
        self.state = ControllerState()
        """What the feature modules keep between rounds: the job cache, usage, moves, metrics, data, learning
        (hsched.controller.state)."""

    # ----------------------------------------------------------------------------------------- plumbing

    async def db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._db_thread, functools.partial(fn, *args, **kwargs))

    async def notify(self) -> None:
        async with self.changed:
            self.version += 1
            self.changed.notify_all()

    def poke(self) -> None:
        self.wake.set()

    def close(self) -> None:
        self._db_thread.shutdown(wait=True)

    async def event(self, kind: str, message: str, **where: Any) -> None:
        """Record an event now (`job_id=`, `node=`, `data=` as the store takes them)."""
        await self.db(self.store.add_event, self.clock.time(), kind, message, **where)

    def loop_ok(self, name: str) -> None:
        rec = self.loops.get(name)
        if rec is not None and rec.failing:
            self.loops[name] = replace(rec, failing=0)
            log.info("%s loop works again", name)

    def loop_failed(self, name: str, error: BaseException) -> None:
        rec = self.loops.get(name, LoopRecord())
        self.loops[name] = LoopRecord(failing=rec.failing + 1, failures=rec.failures + 1,
                                      last_error=f"{type(error).__name__}: {error}"[:500],
                                      last_error_at=self.clock.time())

    @property
    def health(self) -> Health:
        return Health.UNHEALTHY if any(r.failing >= UNHEALTHY_AFTER for r in self.loops.values()) else Health.OK

    def health_report(self) -> dict[str, Any]:
        """`health`, `health_error` (the failing loop's last error, or the last error of any loop) and per-loop
        counts, as `hsched daemon status` shows them."""
        failing = [(n, r) for n, r in self.loops.items() if r.failing >= UNHEALTHY_AFTER]
        latest = sorted(((r.last_error_at or 0.0, n, r) for n, r in self.loops.items() if r.last_error),
                        key=lambda t: t[0])
        error = None
        if failing:
            name, rec = failing[0]
            error = f"the {name} loop failed {rec.failing} times in a row; last: {rec.last_error}"
        elif latest:
            _, name, rec = latest[-1]
            error = f"the {name} loop failed {rec.failures} time(s), the last: {rec.last_error}"
        return {"health": self.health.value, "health_error": error,
                "loops": {n: {"failing": r.failing, "failures": r.failures, "last_error": r.last_error}
                          for n, r in sorted(self.loops.items())}}

    def request_restart(self, reason: str) -> None:
        """Stop, then start again on the hsched installed now (hsched.controller.server does the exec)."""
        if self.restart_reason is None:
            log.warning("restarting: %s", reason)
            self.restart_reason = reason
        self.stopping.set()
        self.poke()

    def cancel_probes(self) -> None:
        for task in list(self.probes):
            task.cancel()

    async def close_executors(self) -> None:
        for rt in self.nodes.values():
            try:
                async with asyncio.timeout(5):
                    await rt.executor.close()
            except (ExecutorError, TimeoutError, OSError) as e:
                log.warning("%s: close failed: %s", rt.name, e)

    def wants_monitor(self, rt: NodeRuntime) -> bool:
        """Remote nodes always (monitoring is their heartbeat); this machine for real GPUs to watch, or, when
        all its nodes are simulated, through the first of them alone: its stream carries the progress reports
        of every run on the machine (hsched.controller.learning), whichever local node runs it."""
        if rt.config.executor != "local" or rt.config.simulate is None:
            return True
        local = [n for n in self.nodes.values() if n.config.executor == "local"]
        return all(n.config.simulate is not None for n in local) and local[0] is rt

    def node_list(self) -> list[Any]:
        return [rt.node for rt in self.nodes.values()]

    # ------------------------------------------------------------------------------------ job folders

    def save_env(self, job_id: int, env: dict[str, str]) -> None:
        """Keep the submitter's environment for the job's runs (blocking: call through `db`). A submit keeps it in
        the job's own transaction instead (store.submit's `env`): a file of its own cost two more fsyncs a job."""
        self.store.set_job_env(job_id, env)

    def run_folder(self, job: Job, node: str) -> Path:
        """Where a job's runs on `node` keep their folders: `runs/NODE`, and in a lab `runs/users/USER/NODE`
        (each user's runs together; the folders above are passable, each run's log the user's own)."""
        if not self.home.lab:
            return self.home.runs / node
        user = job.user.replace("/", "_") if job.user not in ("", ".", "..") else f"_{job.user}_"
        return self.home.runs / "users" / user / node

    def checkpoint_dir(self, job_id: int) -> Path:
        return self.home.checkpoints / str(job_id)

    def env_file(self, job_id: int) -> Path:
        """Where an hsched before the store kept environments (issue 18) saved a job's: read for its old jobs."""
        return self.home.runs / "env" / f"{job_id}.json"

    def load_env(self, job_id: int) -> dict[str, str] | None:
        """The submitter's environment for job `job_id` (blocking; safe from any thread)."""
        env = self.store.job_env(job_id)
        if env is not None:
            return env
        old = read_json(str(self.env_file(job_id)))
        return dict(old) if isinstance(old, dict) else None

    async def get(self, job_id: int) -> Job:
        """The job, or a UserError naming the command that lists jobs."""
        job = await self.db(self.store.get_job, job_id)
        if job is None:
            raise UserError(f"no job {job_id}; `hsched queue --all` lists the jobs")
        return job

    def home_intact(self) -> bool:
        """Still the owner of this HSCHED_HOME: a deleted (or replaced) lock file means another controller
        may start there, and two must never run."""
        try:
            st = os.stat(self.home.lock)
        except FileNotFoundError:
            return False
        return self.lock_inode is None or st.st_ino == self.lock_inode

    def spawn(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run `coro` in the background, kept alive until it ends (asyncio holds only weak references)."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def forget(self, job_id: int) -> None:
        """The job's attempt is over: drop its in-memory timers."""
        self.stops.pop(job_id, None)
        self.warned.discard(job_id)
        self.attempt_start.pop(job_id, None)
        self.start_reported.discard(job_id)

    def attempt_started(self, job: Job) -> float:
        """When the job's current attempt started, on `timeline`: as launched by this controller, else converted
        once from the store's record (a run a previous controller launched) and kept, so that a later step of the
        wall clock moves neither its time limit nor anything counted from it."""
        started = self.attempt_start.get(job.id)
        if started is None:
            started = self.timeline.since(job.start_time) if job.start_time is not None else self.timeline.now()
            self.attempt_start[job.id] = started
        return started

    def retry_at(self, job: Job) -> float | None:
        """When a retry may start (its backoff over), on `timeline`; None when it need not wait. The store's
        `begin_time` is converted once per value (a new retry writes a new one) and kept: a wall clock stepped
        back an hour holds no retry for the hour, a step forward releases none early."""
        if job.begin_time is None:
            return None
        kept = self.not_before.get(job.id)
        if kept is None or kept[0] != job.begin_time:
            kept = (job.begin_time, self.timeline.until(job.begin_time, self.settings.retry_backoff_max_s))
            self.not_before[job.id] = kept
        return kept[1]

    # ------------------------------------------------------------------------------------------- views

    async def wait_changed(self, version: int, timeout_s: float) -> int:
        async with self.changed:
            try:
                async with asyncio.timeout(timeout_s):
                    await self.changed.wait_for(lambda: self.version != version)
            except TimeoutError:
                pass
            return self.version

    def owners(self, active: Sequence[Job]) -> dict[str, int]:
        return {u: j.id for j in active for p in j.placement for u in p.devices}
