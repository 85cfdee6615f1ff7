"""The controller's state and its lifecycle stages: reconcile, schedule, launch, watch, stop.

All store access goes through one worker thread (`self.db(...)`), so SQLite's fsyncs never block the
event loop and the single connection is never used concurrently. Every decision that reads a job and
then writes it holds `self.lock`, so a cancel and the scheduling round cannot interleave.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from hsched.config import FleetConfig, Settings
from hsched.controller.fleet import NodeRuntime, build_fleet, probe_node
from hsched.controller.stopping import StopPlan, StopReason, begin_stop
from hsched.errors import ExecutorError, UserError
from hsched.model import Job, JobSpec, JobState, NodeState, Run
from hsched.nodehelper import read_json, write_json_atomic
from hsched.paths import Home
from hsched.scheduling import unsatisfiable
from hsched.serialize import spec_to_dict
from hsched.store import Store

log = logging.getLogger("hsched.controller")
T = TypeVar("T")

ACTIVE_STATES = tuple(s for s in JobState if s.is_active())


async def wait_at_most(event: asyncio.Event, seconds: float) -> None:
    """Until `event` is set or `seconds` pass, whichever comes first."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await event.wait()


class Controller:
    def __init__(self, home: Home, fleet_cfg: FleetConfig, settings: Settings,
                 store: Store, nodes: dict[str, NodeRuntime] | None = None) -> None:
        self.home = home
        self.fleet_cfg = fleet_cfg
        self.settings = settings
        self.store = store
        self.nodes = nodes if nodes is not None else build_fleet(fleet_cfg)
        self.lock = asyncio.Lock()
        self.wake = asyncio.Event()
        self.changed = asyncio.Condition()
        self.version = 0
        self.stopping = asyncio.Event()
        self.ready = asyncio.Event()
        """Set once the first probe and the reconcile are done; requests that need the fleet wait for it."""
        self.started_at = time.time()
        self.stops: dict[int, StopPlan] = {}
        """job id -> the signals still to send to a job being cancelled, preempted or timed out."""
        self.warned: set[int] = set()
        self.attempt_start: dict[int, float] = {}
        """job id -> when its current attempt was launched (time limits count per attempt)."""
        self._db_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hsched-db")
        self.launching: set[int] = set()
        """Run ids whose launch is in flight: the watcher leaves them alone, so nothing launches twice."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._probing: asyncio.Task[None] | None = None
        self.moved: set[tuple[int, int, str]] = set()
        """(job, attempt, node) whose checkpoint was already brought to the node."""
        self.lock_inode: int | None = None
        self.admin: dict[str, NodeState] = {}
        """Node name -> DRAINED when the user drained it (from the store)."""
        self.launch_slots = asyncio.Semaphore(8)
        """A burst of submissions launches a few at a time, not hundreds of helpers at once."""

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

    async def close_executors(self) -> None:
        for rt in self.nodes.values():
            try:
                async with asyncio.timeout(5):
                    await rt.executor.close()
            except (ExecutorError, TimeoutError, OSError) as e:
                log.warning("%s: close failed: %s", rt.name, e)

    def wants_monitor(self, rt: NodeRuntime) -> bool:
        """Remote nodes always (monitoring is their heartbeat); this machine only for real GPUs to watch."""
        return rt.config.executor != "local" or rt.config.simulate is None

    # ------------------------------------------------------------------------------------------- fleet

    async def probe_all(self, *, only_up: bool = False) -> None:
        async with asyncio.TaskGroup() as tg:
            for rt in self.nodes.values():
                if not only_up or rt.node.state in (NodeState.UP, NodeState.DRAINED):
                    tg.create_task(probe_node(rt, timeout_s=15 if only_up else 30))
        from hsched.controller.health import check_health

        admin = await self.db(self.store.node_admin)
        self.admin = {name: state for name, (state, _) in admin.items()}
        for name, (state, reason) in admin.items():
            rt = self.nodes.get(name)
            if rt and state is NodeState.DRAINED:
                rt.node = replace(rt.node, message=reason)
        await check_health(self)

    def node_list(self) -> list[Any]:
        return [rt.node for rt in self.nodes.values()]

    # ------------------------------------------------------------------------------------------ submit

    async def submit(self, spec: JobSpec, user: str, submit_env: dict[str, str] | None) -> Job:
        if spec.qos not in self.settings.qos:
            raise UserError(f"qos: expected one of {', '.join(self.settings.qos)}, found {spec.qos!r}")
        # whatever their state now, nodes whose devices we know decide whether a request can ever run; while
        # some node was never reached, it may be the one that can, so the job waits instead of being refused
        known = [rt.node for rt in self.nodes.values() if rt.last_ok is not None or rt.config.simulate]
        unknown = sorted(rt.name for rt in self.nodes.values() if rt.last_ok is None and not rt.config.simulate)
        why = unsatisfiable(spec.resources, known)
        if why is not None and not unknown:
            raise UserError(f"job request cannot be satisfied by this fleet ({self.fleet_cfg.source}): {why}")
        async with self.lock:
            job = await self.db(self.store.submit, spec, user, time.time())
            if submit_env is not None:
                await self.db(self._save_env, job.id, submit_env)
            if why is not None:
                await self.db(self.store.add_event, time.time(), "waiting",
                              f"no node reached so far can run it ({why}); waiting for {', '.join(unknown)}",
                              job_id=job.id)
        self.poke()
        await self.notify()
        return job

    def _save_env(self, job_id: int, env: dict[str, str]) -> None:
        path = self.env_file(job_id)
        # the folder is private (0700): environments may hold secrets
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_json_atomic(str(path), env)

    def checkpoint_dir(self, job_id: int) -> Path:
        return self.home.checkpoints / str(job_id)

    def env_file(self, job_id: int) -> Path:
        return self.home.runs / "env" / f"{job_id}.json"

    def load_env(self, job_id: int) -> dict[str, str] | None:
        env = read_json(str(self.env_file(job_id)))
        return dict(env) if isinstance(env, dict) else None

    # ------------------------------------------------------------------------------------------ cancel

    async def cancel(self, job_id: int, now: float | None = None) -> Job:
        now = now or time.time()
        async with self.lock:
            job = await self._get(job_id)
            if job.state.is_terminal() or (job.state is JobState.COMPLETING and job.reason == "cancelled"):
                return job
            if job.state is JobState.PENDING:
                job = await self.db(self.store.set_job, job_id, now, state=JobState.CANCELLED, reason="cancelled",
                                    end_time=now, event=("cancelled", "cancelled while pending"))
            else:
                self.stops.pop(job_id, None)
                after = self.settings.kill_after_s
                job = await begin_stop(self, job, StopReason.CANCELLED,
                                       f"cancel requested: SIGTERM, then SIGKILL after {after:g} s")
        self.poke()
        await self.notify()
        return job

    async def preempt(self, job_id: int) -> Job:
        """Preempt now: the checkpoint signal, the grace period, escalation; then back to PENDING."""
        async with self.lock:
            job = await self._get(job_id)
            if job.state is not JobState.RUNNING:
                raise UserError(f"job {job_id} is {job.state.value}; only running jobs can be preempted")
            ck = job.spec.checkpoint_signal
            job = await begin_stop(self, job, StopReason.PREEMPTED,
                                   f"preempted by the user: SIG{ck.signal}, {ck.grace_s:g} s to checkpoint")
        self.poke()
        await self.notify()
        return job

    async def checkpoint(self, job_id: int) -> Job:
        """Send the job's checkpoint signal without stopping it."""
        async with self.lock:
            job = await self._get(job_id)
            if job.state is not JobState.RUNNING:
                raise UserError(f"job {job_id} is {job.state.value}; only running jobs can checkpoint")
            sig = job.spec.checkpoint_signal.signal
            await self.signal_job(job_id, sig)
            await self.db(self.store.add_event, time.time(), "checkpoint", f"SIG{sig} sent (checkpoint, keep running)",
                          job_id=job_id)
        await self.notify()
        return job

    async def hold(self, job_id: int, hold: bool) -> Job:
        """Hold a pending job (it will not start) or release it."""
        return (await self.hold_many([job_id], hold))[0]

    async def hold_many(self, job_ids: list[int], hold: bool) -> list[Job]:
        """Hold or release several jobs at once: no scheduling round sees only some of them released."""
        async with self.lock:
            jobs = [await self._hold_one(i, hold) for i in job_ids]
        self.poke()
        await self.notify()
        return jobs

    async def _hold_one(self, job_id: int, hold: bool) -> Job:
        job = await self._get(job_id)
        if job.state is not JobState.PENDING:
            raise UserError(f"job {job_id} is {job.state.value}; only pending jobs can be held or released")
        if job.spec.hold == hold:
            return job
        spec = replace(job.spec, hold=hold)
        return await self.db(self.store.set_job, job_id, time.time(), spec=json.dumps(spec_to_dict(spec)),
                             reason="JobHeldUser" if hold else "Priority",
                             event=("held" if hold else "released", "held by the user" if hold else "released"))

    async def set_priority(self, job_id: int, priority: int, qos: str | None = None) -> Job:
        now = time.time()
        if qos is not None and qos not in self.settings.qos:
            raise UserError(f"--qos: expected one of {', '.join(self.settings.qos)}, found {qos!r}")
        async with self.lock:
            job = await self._get(job_id)
            if job.state.is_terminal():
                raise UserError(f"job {job_id} has ended ({job.state.value}); its priority no longer matters")
            spec = replace(job.spec, priority=priority, qos=qos or job.spec.qos)
            job = await self.db(self.store.set_job, job_id, now, spec=json.dumps(spec_to_dict(spec)),
                                priority=priority, qos=spec.qos,
                                event=("priority", f"priority set to {priority} in {spec.qos}"))
        self.poke()
        await self.notify()
        return job

    async def requeue(self, job_id: int) -> Job:
        """An ended job goes back to PENDING under the same id (Slurm's scontrol requeue)."""
        now = time.time()
        async with self.lock:
            job = await self._get(job_id)
            if not job.state.is_terminal():
                raise UserError(f"job {job_id} is {job.state.value}; only ended jobs can be requeued "
                                "(use `hsched cancel` first)")
            job = await self.db(self.store.set_job, job_id, now, state=JobState.PENDING, reason="Priority",
                                end_time=None, exit_code=None, placement=(), restarts=job.restarts + 1,
                                event=("requeued", f"requeued by the user after {job.state.value}"))
        self.poke()
        await self.notify()
        return job

    async def _get(self, job_id: int) -> Job:
        job = await self.db(self.store.get_job, job_id)
        if job is None:
            raise UserError(f"no job {job_id}; `hsched queue --all` lists the jobs")
        return job

    async def signal_job(self, job_id: int, sig: str, *, all_processes: bool = False) -> bool:
        """Send a signal to every live run (rank) of the job; True if any run received it."""
        runs = await self.db(self.store.live_runs)
        sent = False
        for run in runs:
            if run.job_id != job_id or run.handle is None:
                continue
            rt = self.nodes.get(run.node)
            if rt is None:
                continue
            try:
                async with asyncio.timeout(30):
                    sent |= await rt.executor.signal(run.handle, sig, all_processes=all_processes)
            except (ExecutorError, TimeoutError) as e:
                log.warning("job %s: cannot send SIG%s on %s: %s", job_id, sig, run.node, e)
        return sent

    # ---------------------------------------------------------------------------------- the main loop

    async def run_loop(self) -> None:
        """Watch runs, advance stops, then schedule: on every poke and at least every poll interval."""
        from hsched.controller.launching import schedule_round
        from hsched.controller.stopping import check_time_limits, tick
        from hsched.controller.watching import watch_runs

        last_probe = time.monotonic()
        while not self.stopping.is_set():
            await wait_at_most(self.wake, self.settings.poll_interval_s)
            self.wake.clear()
            if self.stopping.is_set():
                break
            try:
                if time.monotonic() - last_probe > self.settings.probe_interval_s and self._probing is None:
                    last_probe = time.monotonic()
                    # in the background: a node that does not answer must not hold up the round
                    self._probing = asyncio.create_task(self.probe_all(only_up=True))
                    self._probing.add_done_callback(lambda _t: setattr(self, "_probing", None))
                changed = await watch_runs(self)
                async with self.lock:
                    await tick(self)
                    running = await self.db(self.store.jobs, states=[JobState.RUNNING])
                    await check_time_limits(self, running)
                changed |= await schedule_round(self)
                if changed:
                    await self.notify()
            except Exception:  # one bad round must not stop the controller; the next one retries
                log.exception("scheduling round failed")

    async def health_loop(self) -> None:
        """Node states on their own beat, so a round stuck on a slow node cannot hide that it is gone."""
        from hsched.controller.health import check_health, simulate_telemetry

        last_telemetry = 0.0
        while not self.stopping.is_set():
            if not self.home_intact():
                log.error("%s or its lock file was removed: this controller steps down", self.home.root)
                self.stopping.set()
                break
            try:
                if await check_health(self):
                    self.poke()
                    await self.notify()
                if time.monotonic() - last_telemetry >= self.settings.monitor_interval_s:
                    last_telemetry = time.monotonic()
                    active = await self.db(self.store.jobs, states=[JobState.RUNNING])
                    simulate_telemetry(self, self.owners(active), time.time())
            except Exception:
                log.exception("health check failed")
            await wait_at_most(self.stopping, 0.5)

    def home_intact(self) -> bool:
        """Still the owner of this HSCHED_HOME: a deleted (or replaced) lock file means another controller
        may start there, and two must never run."""
        try:
            st = os.stat(self.home.lock)
        except FileNotFoundError:
            return False
        return self.lock_inode is None or st.st_ino == self.lock_inode

    def spawn_launch(self, job: Job, run: Run) -> None:
        from hsched.controller.launching import launch

        if run.id in self.launching:
            return
        self.launching.add(run.id)
        task = asyncio.create_task(launch(self, job, run))
        self._tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            self.launching.discard(run.id)

        task.add_done_callback(done)

    def forget(self, job_id: int) -> None:
        """The job's attempt is over: drop its in-memory timers."""
        self.stops.pop(job_id, None)
        self.warned.discard(job_id)
        self.attempt_start.pop(job_id, None)

    # ---------------------------------------------------------------------------------------- reconcile

    async def reconcile(self) -> None:
        """On start: look up every run recorded as live; adopt, record exit codes, or mark lost."""
        from hsched.controller.watching import watch_runs

        await watch_runs(self)
        await self.db(self.store.add_event, time.time(), "controller", f"controller started (pid {os.getpid()})")

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
