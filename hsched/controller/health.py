"""Node health: heartbeats, UP / UNREACHABLE / DOWN / DRAINED, leases and fencing.

* A node's heartbeat is its last contact of any kind: a monitoring sample, a probe, a status reply. This
  machine's own nodes (the local executor) are alive while the controller is.
* No heartbeat for `heartbeat_timeout_s`: UNREACHABLE. Its runs are left alone (they survive on the node);
  nothing is requeued before the lease (`lease_s`) runs out.
* Lease over: the node's runs are recorded as lost and marked for fencing (run state FENCING, durable), and
  their jobs are requeued. When the node answers again, every FENCING run there is killed (all its
  processes) before the node is offered for placement, so a job never runs twice.
* A node that answers again before the lease is simply UP: the watcher reattaches its runs.
* DOWN: the node refuses us in a way that needs a person (a changed or unknown host key, a refused login).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import replace
from typing import Any

from hsched.controller.core import Controller
from hsched.controller.fleet import HISTORY, NodeRuntime, probe_node
from hsched.controller.stopping import begin_stop
from hsched.errors import ExecutorError, NodeRefused
from hsched.lifecycle import StopReason, node_lost
from hsched.model import EndReason, JobState, NodeState, RunState
from hsched.simulated import simulated_telemetry

log = logging.getLogger("hsched.health")



async def monitor(ctl: Controller, rt: NodeRuntime) -> None:
    """Follow one node's monitoring stream for as long as the controller runs; reconnect on failure."""
    while not ctl.stopping.is_set():
        try:
            async for sample in rt.executor.watch(ctl.settings.monitor_interval_s):
                record_sample(rt, sample, ctl.clock.time())
                if ctl.stopping.is_set():
                    return
        except ExecutorError as e:
            rt.probe_error = e
        except Exception:  # a malformed sample must not end monitoring for good
            log.exception("%s: monitoring failed", rt.name)
        await ctl.clock.wait(ctl.stopping, 1.0)


def record_sample(rt: NodeRuntime, sample: dict[str, Any], now: float) -> None:
    rt.last_sample = now
    live = {d.get("uuid"): d for d in (sample.get("gpus") or {}).get("devices") or [] if d.get("uuid")}
    devices = []
    for d in rt.node.devices:
        s = live.get(d.uuid)
        if s is None:
            devices.append(d)
            continue
        d = replace(d, utilization_gpu=s.get("utilization_gpu"), memory_used_mib=s.get("memory_used_mib"),
                    temperature_c=s.get("temperature_c"), power_w=s.get("power_w"))
        devices.append(d)
        hist = rt.history.setdefault(d.uuid, collections.deque(maxlen=HISTORY))
        hist.append((now, d.utilization_gpu, d.memory_used_mib))
    rt.node = replace(rt.node, devices=tuple(devices))
    # GPU processes no hsched run owns make their device busy: we never hand out a GPU someone else uses
    rt.foreign = {p["uuid"]: p for p in sample.get("processes") or []
                  if p.get("uuid") and p.get("job_run_dir") is None and p.get("run_dir") is None}
    if sample.get("processes") is not None and (sample.get("gpus") or {}).get("source"):
        by_uuid: dict[str, list[dict[str, Any]]] = {}
        for p in sample["processes"]:
            if p.get("uuid"):
                by_uuid.setdefault(p["uuid"], []).append(p)
        rt.gpu_processes = by_uuid
    rt.host_load = {"cpu": sample.get("cpu"), "memory": sample.get("memory")}
    if rt.boot_id and sample.get("boot_id") and sample["boot_id"] != rt.boot_id:
        rt.rebooted = True
        rt.boot_id = sample["boot_id"]


async def check_health(ctl: Controller) -> bool:
    """Derive every node's state; expire leases; fence returning nodes. True if anything changed."""
    now = ctl.clock.time()
    changed = False
    admin = ctl.admin
    for rt in ctl.nodes.values():
        beat = rt.heartbeat(now)
        failure = rt.executor.last_error or rt.probe_error
        err = str(failure) if failure is not None else ""
        if beat is not None and now - beat <= ctl.settings.heartbeat_timeout_s:
            state = NodeState.UP
        elif isinstance(failure, NodeRefused):
            state = NodeState.DOWN  # a changed host key or a refused login: retrying will not fix it
        else:
            state = NodeState.UNREACHABLE
        if state is NodeState.UP and admin.get(rt.name) is NodeState.DRAINED:
            state = NodeState.DRAINED
        old = rt.node.state
        if state in (NodeState.UP, NodeState.DRAINED) and old in (NodeState.UNREACHABLE, NodeState.DOWN):
            if (not rt.node.devices and rt.config.simulate is None) or rt.last_ok is None:
                await probe_node(rt, ctl.clock, timeout_s=30)
                if rt.last_ok is None:
                    continue
            await fence(ctl, rt)
            rt.unreachable_since = None
            await ctl.event("node", f"{rt.name} is back", node=rt.name)
        if state in (NodeState.UNREACHABLE, NodeState.DOWN):
            if rt.unreachable_since is None:
                rt.unreachable_since = beat if beat is not None else now
                if old in (NodeState.UP, NodeState.DRAINED):
                    await ctl.db(ctl.store.add_event, now, "node",
                                 f"{rt.name} is {state.value.lower()}: {err or 'no heartbeat'}", node=rt.name)
            if now - rt.unreachable_since > ctl.settings.lease_s:
                changed |= await expire_lease(ctl, rt, now)
        if state is not old:
            message = "" if state is NodeState.UP else (err[:200] if state is not NodeState.DRAINED
                                                         else rt.node.message)
            rt.node = replace(rt.node, state=state, message=message)
            changed = True
    return changed


async def expire_lease(ctl: Controller, rt: NodeRuntime, now: float) -> bool:
    """The node has been gone past its lease: requeue its jobs; mark its runs to be killed on return."""
    runs = [r for r in await ctl.db(ctl.store.live_runs) if r.node == rt.name and r.id not in ctl.launching]
    if not runs:
        return False
    async with ctl.lock:
        for run in runs:
            job = await ctl.db(ctl.store.get_job, run.job_id)
            if job is None:
                continue
            others = [r for r in await ctl.db(ctl.store.attempt_runs, job.id, run.attempt)
                      if r.id != run.id and r.state in (RunState.RUNNING, RunState.LAUNCHING) and r.node != rt.name]
            msg = f"{rt.name} unreachable for longer than the lease ({ctl.settings.lease_s:g} s)"
            if others:
                # a gang lost a node: the ranks elsewhere stop and the whole gang is requeued
                await ctl.db(ctl.store.end_run, run, now, run_state=RunState.FENCING, exit_code=None,
                             reason=EndReason.NODE_LOST.value, job_fields=None,
                             event=("node_lost", f"rank {run.rank}: {msg}; will be killed there"))
                if job.state in (JobState.RUNNING, JobState.LAUNCHING):
                    await begin_stop(ctl, job, StopReason.PREEMPTED, f"{msg}: stopping the other ranks to requeue")
                continue
            await ctl.db(ctl.store.end_run, run, now, run_state=RunState.FENCING, exit_code=None,
                         reason=EndReason.NODE_LOST.value, job_fields=node_lost(job).job_fields(job, now),
                         event=("node_lost", f"{msg}: requeued; the stale copy is killed if the node returns"))
            ctl.forget(job.id)
    return True


async def fence(ctl: Controller, rt: NodeRuntime) -> None:
    """Kill every run on `rt` that was given up for lost while it was away (before it gets new work)."""
    stale = await ctl.db(ctl.store.fencing_runs, rt.name)
    for run in stale:
        if run.handle is None:
            await ctl.db(ctl.store.set_run_state, run.id, RunState.FENCED)
            continue
        try:
            async with asyncio.timeout(30):
                await rt.executor.signal(run.handle, "KILL", all_processes=True)
        except (ExecutorError, TimeoutError) as e:
            log.warning("%s: cannot fence run %s yet: %s", rt.name, run.id, e)
            continue
        await ctl.db(ctl.store.set_run_state, run.id, RunState.FENCED)
        await ctl.event("fenced",
                     f"stale copy of run {run.attempt} killed on {rt.name}", job_id=run.job_id, node=rt.name)


async def probe_all(ctl: Controller, *, only_up: bool = False) -> None:
    """Probe the fleet (all nodes, or those up or drained), read the drained marks, derive node states."""
    async with asyncio.TaskGroup() as tg:
        for rt in ctl.nodes.values():
            if not only_up or rt.node.state in (NodeState.UP, NodeState.DRAINED):
                tg.create_task(probe_node(rt, ctl.clock, timeout_s=15 if only_up else 30))
    admin = await ctl.db(ctl.store.node_admin)
    ctl.admin = {name: state for name, (state, _) in admin.items()}
    for name, (state, reason) in admin.items():
        drained = ctl.nodes.get(name)
        if drained is not None and state is NodeState.DRAINED:
            drained.node = replace(drained.node, message=reason)
    await check_health(ctl)


def simulate_telemetry(ctl: Controller, owners: dict[str, int], now: float) -> None:
    """Readings for the simulated nodes' devices (hsched.simulated), kept in their history like samples."""
    for rt in ctl.nodes.values():
        if rt.config.simulate is None:
            continue
        rt.node = replace(rt.node, devices=simulated_telemetry(rt.node.devices, owners, now))
        for d in rt.node.devices:
            if d.simulated:
                hist = rt.history.setdefault(d.uuid, collections.deque(maxlen=HISTORY))
                hist.append((now, d.utilization_gpu, d.memory_used_mib))
