"""The controller's state and its lifecycle stages: reconcile, schedule, launch, watch, stop.

All store access goes through one worker thread (`self.db(...)`), so SQLite's fsyncs never block the
event loop and the single connection is never used concurrently. Every decision that reads a job and
then writes it holds `self.lock`, so a cancel and the scheduling round cannot interleave.
"""

from __future__ import annotations

import asyncio
import functools
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
from hsched.errors import ExecutorError, UserError
from hsched.executors.base import LaunchRequest, StatusQuery
from hsched.model import Job, JobSpec, JobState, NodeState, Placement, Run, RunReport, RunStatus
from hsched.paths import Home
from hsched.scheduling import FleetView, Start, Wait, schedule, unsatisfiable
from hsched.store import Store

log = logging.getLogger("hsched.controller")
T = TypeVar("T")

ACTIVE_STATES = tuple(s for s in JobState if s.is_active())


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
        self.kill_deadline: dict[int, float] = {}
        """job id -> when a cancelled run gets SIGKILL if it is still there."""
        self._db_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hsched-db")
        self.subscribers: set[asyncio.Queue[dict[str, Any]]] = set()
        self.launching: set[int] = set()
        """Run ids whose launch is in flight: the watcher leaves them alone, so nothing launches twice."""
        self._tasks: set[asyncio.Task[None]] = set()
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
        for q in list(self.subscribers):
            if q.qsize() < 2:  # a slow subscriber gets the latest state later, never an unbounded backlog
                q.put_nowait({"type": "changed", "version": self.version})

    def spawn_launch(self, job: Job, run: Run) -> None:
        if run.id in self.launching:
            return
        self.launching.add(run.id)
        task = asyncio.create_task(self._launch(job, run))
        self._tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            self.launching.discard(run.id)

        task.add_done_callback(done)

    def poke(self) -> None:
        self.wake.set()

    def close(self) -> None:
        self._db_thread.shutdown(wait=True)

    # ------------------------------------------------------------------------------------------- fleet

    async def probe_all(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for rt in self.nodes.values():
                tg.create_task(probe_node(rt, timeout_s=60))
        admin = await self.db(self.store.node_admin)
        for name, (state, reason) in admin.items():
            rt = self.nodes.get(name)
            if rt and state is NodeState.DRAINED and rt.node.state is NodeState.UP:
                rt.node = replace(rt.node, state=NodeState.DRAINED, message=reason)

    def node_list(self) -> list[Any]:
        return [rt.node for rt in self.nodes.values()]

    # ------------------------------------------------------------------------------------------ submit

    async def submit(self, spec: JobSpec, user: str, submit_env: dict[str, str] | None) -> Job:
        why = unsatisfiable(spec.resources, [rt.node for rt in self.nodes.values()
                                             if rt.node.state is not NodeState.UNREACHABLE or rt.node.devices])
        if why is not None:
            raise UserError(f"job request cannot be satisfied by this fleet ({self.fleet_cfg.source}): {why}")
        async with self.lock:
            job = await self.db(self.store.submit, spec, user, time.time())
            if submit_env is not None:
                await self.db(self._save_env, job.id, submit_env)
        self.poke()
        await self.notify()
        return job

    def _save_env(self, job_id: int, env: dict[str, str]) -> None:
        path = self.env_file(job_id)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        import json

        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(env, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def env_file(self, job_id: int) -> Path:
        return self.home.runs / "env" / f"{job_id}.json"

    def _load_env(self, job_id: int) -> dict[str, str] | None:
        import json

        try:
            return dict(json.loads(self.env_file(job_id).read_text()))
        except (OSError, ValueError):
            return None

    # ------------------------------------------------------------------------------------------ cancel

    async def cancel(self, job_id: int, now: float | None = None) -> Job:
        now = now or time.time()
        async with self.lock:
            job = await self.db(self.store.get_job, job_id)
            if job is None:
                raise UserError(f"no job {job_id}; `hsched queue --all` lists the jobs")
            if job.state.is_terminal() or job.state is JobState.COMPLETING:
                return job
            if job.state is JobState.PENDING:
                job = await self.db(self.store.set_job, job_id, now, state=JobState.CANCELLED, reason="cancelled",
                                    end_time=now, event=("cancelled", "cancelled while pending"))
            else:
                job = await self.db(self.store.set_job, job_id, now, state=JobState.COMPLETING, reason="cancelled",
                                    event=("cancel", "cancel requested: SIGTERM, then SIGKILL after "
                                           f"{self.settings.kill_after_s:g} s"))
                self.kill_deadline[job_id] = now + self.settings.kill_after_s
                await self._signal_job(job_id, "TERM")
        self.poke()
        await self.notify()
        return job

    async def hold(self, job_id: int, hold: bool) -> Job:
        """Hold a pending job (it will not start) or release it."""
        from hsched.serialize import spec_to_dict

        now = time.time()
        async with self.lock:
            job = await self._get(job_id)
            if job.state is not JobState.PENDING:
                raise UserError(f"job {job_id} is {job.state.value}; only pending jobs can be held or released")
            if job.spec.hold == hold:
                return job
            import json

            spec = replace(job.spec, hold=hold)
            job = await self.db(self.store.set_job, job_id, now, spec=json.dumps(spec_to_dict(spec)),
                                reason="JobHeldUser" if hold else "Priority",
                                event=("held" if hold else "released", "held by the user" if hold else "released"))
        self.poke()
        await self.notify()
        return job

    async def set_priority(self, job_id: int, priority: int, qos: str | None = None) -> Job:
        from hsched.model import QOS_CLASSES
        from hsched.serialize import spec_to_dict

        now = time.time()
        if qos is not None and qos not in QOS_CLASSES:
            raise UserError(f"--qos: expected one of {', '.join(QOS_CLASSES)}, found {qos!r}")
        async with self.lock:
            job = await self._get(job_id)
            if job.state.is_terminal():
                raise UserError(f"job {job_id} has ended ({job.state.value}); its priority no longer matters")
            import json

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

    async def _signal_job(self, job_id: int, sig: str, *, all_processes: bool = False) -> None:
        runs = await self.db(self.store.runs, job_id)
        for run in runs:
            if run.state not in ("RUNNING", "LAUNCHING") or run.handle is None:
                continue
            rt = self.nodes.get(run.node)
            if rt is None:
                continue
            try:
                async with asyncio.timeout(30):
                    await rt.executor.signal(run.handle, sig, all_processes=all_processes)
            except (ExecutorError, TimeoutError) as e:
                log.warning("job %s: cannot send SIG%s on %s: %s", job_id, sig, run.node, e)

    # ---------------------------------------------------------------------------------- the main loop

    async def run_loop(self) -> None:
        """Watch runs, then schedule, on every poke and at least every poll interval."""
        last_probe = time.monotonic()
        while not self.stopping.is_set():
            try:
                async with asyncio.timeout(self.settings.poll_interval_s):
                    await self.wake.wait()
            except TimeoutError:
                pass
            self.wake.clear()
            if self.stopping.is_set():
                break
            try:
                if time.monotonic() - last_probe > self.settings.probe_interval_s:
                    last_probe = time.monotonic()
                    await self.probe_all()
                changed = await self.watch_runs()
                changed |= await self.schedule_round()
                if changed:
                    await self.notify()
            except Exception:  # one bad round must not stop the controller; the next one retries
                log.exception("scheduling round failed")

    # ------------------------------------------------------------------------------------------- watch

    async def watch_runs(self) -> bool:
        runs = [r for r in await self.db(self.store.live_runs) if r.id not in self.launching]
        if not runs:
            return False
        by_node: dict[str, list[Run]] = {}
        for r in runs:
            by_node.setdefault(r.node, []).append(r)
        changed = False
        for node, node_runs in by_node.items():
            rt = self.nodes.get(node)
            if rt is None:
                continue
            try:
                async with asyncio.timeout(30):
                    reports = await rt.executor.status([StatusQuery(r.run_dir, r.handle) for r in node_runs])
            except (ExecutorError, TimeoutError) as e:
                log.warning("status from %s failed: %s", node, e)
                continue
            for run, rep in zip(node_runs, reports, strict=True):
                changed |= await self._on_report(rt, run, rep)
        return changed

    async def _on_report(self, rt: NodeRuntime, run: Run, rep: RunReport) -> bool:
        now = time.time()
        async with self.lock:
            job = await self.db(self.store.get_job, run.job_id)
            if job is None:
                return False
            if rep.status is RunStatus.RUNNING:
                if run.state == "LAUNCHING" and rep.handle is not None:
                    # adopted after a restart: the launch happened, its reply was lost with the old controller
                    await self.db(self.store.run_launched, run, rep.handle, now)
                    return True
                deadline = self.kill_deadline.get(job.id)
                if job.state is JobState.COMPLETING and deadline is None:
                    self.kill_deadline[job.id] = now + self.settings.kill_after_s
                elif deadline is not None and now >= deadline and job.state is JobState.COMPLETING:
                    self.kill_deadline[job.id] = now + self.settings.kill_after_s
                    await self._signal_job(job.id, "KILL", all_processes=True)
                    await self.db(self.store.add_event, now, "kill", "still running after SIGTERM: SIGKILL sent",
                                  job_id=job.id)
                return False
            if rep.status is RunStatus.NOT_STARTED:
                if run.state == "LAUNCHING" and job.state is JobState.LAUNCHING:
                    # recorded but never launched (the controller died in between): launch it now, once
                    self.spawn_launch(job, run)
                    return False
                await self._end(job, run, now, exit_code=None, lost=True)
                return True
            if rep.status is RunStatus.EXITED:
                await self._end(job, run, now, exit_code=rep.exit_code, lost=False)
                return True
            await self._end(job, run, now, exit_code=None, lost=True)
            return True

    async def _end(self, job: Job, run: Run, now: float, *, exit_code: int | None, lost: bool) -> None:
        self.kill_deadline.pop(job.id, None)
        fields: dict[str, Any] = {"end_time": now, "exit_code": exit_code}
        if job.state is JobState.COMPLETING and job.reason == "cancelled":
            fields.update(state=JobState.CANCELLED, reason="cancelled")
            run_state, reason, ev = "CANCELLED", "cancelled", ("ended", f"cancelled (exit code {exit_code})")
        elif lost:
            fields.update(state=JobState.LOST, reason="lost")
            run_state, reason, ev = "LOST", "lost", ("lost", "run lost: the process is gone and left no exit code")
        elif exit_code == 0:
            fields.update(state=JobState.COMPLETED, reason="completed")
            run_state, reason, ev = "COMPLETED", "completed", ("ended", "completed (exit code 0)")
        elif exit_code == self.settings.checkpoint_exit_code:
            fields = {"state": JobState.PENDING, "reason": "checkpointed", "restarts": job.restarts + 1,
                      "exit_code": exit_code, "placement": ()}
            run_state, reason = "CHECKPOINTED", "checkpointed"
            ev = ("requeued", f"exited with the checkpoint code {exit_code}: requeued")
        else:
            fields.update(state=JobState.FAILED, reason="nonzero_exit" if (exit_code or 0) < 128 else "signaled")
            run_state, reason, ev = "FAILED", str(fields["reason"]), ("ended", f"failed (exit code {exit_code})")
        await self.db(self.store.end_run, run, now, run_state=run_state, exit_code=exit_code, reason=reason,
                      job_fields=fields, event=ev)

    # ---------------------------------------------------------------------------------------- schedule

    async def schedule_round(self) -> bool:
        async with self.lock:
            pending = await self.db(self.store.jobs, states=[JobState.PENDING])
            pending = [j for j in pending if not j.spec.hold]
            if not pending:
                return False
            active = await self.db(self.store.jobs, states=list(ACTIVE_STATES))
            busy: set[str] = set()
            cpus_used: dict[str, int] = {}
            for j in active:
                for p in j.placement:
                    busy.update(p.devices)
                    if j.spec.resources.cpus:
                        cpus_used[p.node] = cpus_used.get(p.node, 0) + j.spec.resources.cpus
            view = FleetView(nodes=tuple(self.node_list()), busy=frozenset(busy), cpus_used=cpus_used)
            decisions = schedule(view, pending, time.time())
            by_id = {j.id: j for j in pending}
            launches: list[tuple[Job, Run]] = []
            now = time.time()
            for d in decisions:
                job = by_id[d.job_id]
                if isinstance(d, Wait):
                    if job.reason != d.reason and job.reason not in ("checkpointed",):
                        await self.db(self.store.set_job, job.id, now, reason=d.reason)
                    continue
                assert isinstance(d, Start)
                # gangs come with the controller's gang support; one placement per node for now
                placement = d.placements[0]
                run_dir = str(self.home.runs / placement.node / f"{job.id}-{job.restarts + 1}-{int(now * 1000)}")
                run = await self.db(self.store.start_run, job, placement, run_dir, now)
                launches.append((job, run))
        for job, run in launches:
            self.spawn_launch(job, run)
        return bool(launches)

    def job_env(self, job: Job, run: Run, placement: Placement) -> dict[str, str]:
        env: dict[str, str] = {}
        base = self._load_env(job.id)
        if base:
            env.update(base)
        env.update(dict(job.spec.env))
        ckpt = self.home.checkpoints / str(job.id)
        env.update({
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": ",".join(placement.devices),
            "HSCHED_JOB_ID": str(job.id),
            "HSCHED_JOB_NAME": job.name,
            "HSCHED_RUN": str(run.attempt),
            "HSCHED_NODE": placement.node,
            "HSCHED_CHECKPOINT_DIR": str(ckpt),
            "HSCHED_RESTART_COUNT": str(job.restarts),
        })
        if job.restarts > 0:
            env["HSCHED_RESUME"] = "1"
        else:
            env.pop("HSCHED_RESUME", None)
        return env

    async def _launch(self, job: Job, run: Run) -> None:
        rt = self.nodes.get(run.node)
        placement = Placement(node=run.node, devices=run.devices)
        now = time.time()
        if rt is None:
            await self._launch_failed(job, run, f"node {run.node} is no longer in the fleet")
            return
        env = self.job_env(job, run, placement)
        (self.home.checkpoints / str(job.id)).mkdir(parents=True, exist_ok=True)
        workdir = job.spec.workdir or (self._load_env(job.id) or {}).get("PWD")
        req = LaunchRequest(run_dir=run.run_dir, command=job.spec.command, env=env, workdir=workdir,
                            inherit_env=False)
        try:
            async with self.launch_slots, asyncio.timeout(60):
                handle = await rt.executor.launch(req)
        except (ExecutorError, TimeoutError) as e:
            await self._launch_failed(job, run, str(e) or "launch timed out")
            return
        async with self.lock:
            await self.db(self.store.run_launched, run, handle, now)
            current = await self.db(self.store.get_job, job.id)
        if current is not None and current.state is JobState.COMPLETING:
            await self._signal_job(job.id, "TERM")  # cancelled while it was being launched
        await self.notify()

    async def _launch_failed(self, job: Job, run: Run, why: str) -> None:
        now = time.time()
        log.warning("job %s: launch failed: %s", job.id, why)
        async with self.lock:
            await self.db(self.store.end_run, run, now, run_state="FAILED", exit_code=None, reason="launch_failed",
                          job_fields={"state": JobState.FAILED, "reason": "launch_failed", "end_time": now},
                          event=("launch_failed", why))
        await self.notify()

    # ---------------------------------------------------------------------------------------- reconcile

    async def reconcile(self) -> None:
        """On start: look up every run recorded as live; adopt, record exit codes, or mark lost."""
        await self.watch_runs()
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
