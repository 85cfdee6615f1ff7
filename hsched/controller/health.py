"""Node health: probes, heartbeats, PROBING / UP / UNHEALTHY / UNREACHABLE / DOWN / DRAINED, leases, fencing.

* Every probe runs in the background, one at a time per node, bounded by the probe timeout (settings
  `probe_timeout_s`, else 15 s); no request and no round ever waits for one. A node is PROBING until its
  first probe ends; a node that answers but whose probe timed out or failed there (a hung nvidia-smi, a
  helper error) is UNHEALTHY, with the reason as its message, until a probe comes back whole. Neither gets
  new work; their runs are watched as on any node that answers.
* A node's heartbeat is its last contact of any kind: a monitoring sample, a probe, a status reply. This
  machine's own nodes (the local executor) are alive while the controller is.
* No heartbeat for `heartbeat_timeout_s`: UNREACHABLE. Its runs are left alone (they survive on the node);
  nothing is requeued before the lease (`lease_s`) runs out.
* Lease over: the node's runs are recorded as lost and marked for fencing (run state FENCING, durable), and
  their jobs are requeued. When the node answers again, every FENCING run there is killed (all its
  processes) before the node is offered for placement, so a job never runs twice.
* A node that answers again before the lease is simply UP: the watcher reattaches its runs.
* DOWN: the node refuses us in a way that needs a person (a changed or unknown host key, a refused login).

Heartbeats, the heartbeat timeout and the lease are all counted on the monotonic clock (`clock.monotonic()`; the
executors' `last_contact` too): a step of the wall clock (+2 h: every node past its lease, its jobs requeued and
started twice) changes no node's state (issue 27).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import replace
from typing import Any

from hsched.controller import learning, usage
from hsched.controller.core import Controller
from hsched.controller.fleet import HISTORY, NodeRuntime, probe_node
from hsched.controller.jobcache import job_cache
from hsched.controller.stopping import begin_stop
from hsched.errors import ExecutorError, NodeRefused
from hsched.learn.profiles import IDLE_UTIL_PCT as IDLE_UTIL
from hsched.lifecycle import StopReason, node_lost
from hsched.model import EndReason, JobState, NodeState, RunState
from hsched.simulated import simulated_telemetry

log = logging.getLogger("hsched.health")

PROBE_TIMEOUT_S = 15.0
"""How long a probe may take before the node is given up on for now (UNHEALTHY or UNREACHABLE)."""
GPU_TIMEOUT_S = 10.0
"""How long the node itself lets its GPU tools (NVML, nvidia-smi) run before it kills them and says so."""

ANSWERING = (NodeState.UP, NodeState.DRAINED, NodeState.UNHEALTHY)
AWAY = (NodeState.UNREACHABLE, NodeState.DOWN)


def probe_timeout_s(ctl: Controller) -> float:
    """settings.probe_timeout_s (15 s unless set)."""
    return ctl.settings.probe_timeout_s


def probe_soon(ctl: Controller, rt: NodeRuntime) -> asyncio.Task[None]:
    """Probe `rt` in the background unless a probe of it is in flight already (then that one). The task ends
    within the probe timeout and never raises; the health check turns its outcome into the node's state."""
    task = rt.probe_task
    if task is not None and not task.done():
        return task
    task = asyncio.create_task(_probe(ctl, rt), name=f"probe {rt.name}")
    rt.probe_task = task
    ctl.probes.add(task)
    task.add_done_callback(ctl.probes.discard)
    return task


async def _probe(ctl: Controller, rt: NodeRuntime) -> None:
    timeout = probe_timeout_s(ctl)
    # the node's own bound on its GPU tools ends well inside the probe's: a hung nvidia-smi is then a reason
    # the node gives (UNHEALTHY, "GPU probe did not answer within ..."), not a probe that never answers
    try:
        await probe_node(rt, ctl.clock, timeout, gpu_timeout_s=min(GPU_TIMEOUT_S, timeout / 2))
    except Exception as e:  # a reply we cannot read (a bug, a helper of another version): the node's problem
        log.exception("%s: probe failed", rt.name)
        rt.probe_problem = f"probe failed: {type(e).__name__}: {e}"[:200]
        rt.node = replace(rt.node, message=rt.probe_problem)
    if rt.probe_problem is not None:
        log.warning("%s: %s", rt.name, rt.probe_problem)
    ctl.poke()


def reprobe(ctl: Controller) -> None:
    """Probe again, in the background, every node that answers (an unhealthy one may have recovered)."""
    for rt in ctl.nodes.values():
        if rt.node.state in ANSWERING:
            probe_soon(ctl, rt)


def node_state(rt: NodeRuntime, now: float, heartbeat_timeout_s: float, drained: bool) -> tuple[NodeState, str]:
    """The node's state from what is known of it now, and the reason shown with it."""
    beat = rt.heartbeat(now)
    failure = rt.executor.last_error or rt.probe_error
    if beat is not None and now - beat <= heartbeat_timeout_s:
        if rt.probe_problem is not None:
            return NodeState.UNHEALTHY, rt.probe_problem
        if rt.last_ok is None:
            if rt.probe_error is not None:  # it answers (this machine), but its probe cannot run at all
                refused = isinstance(rt.probe_error, NodeRefused)
                return (NodeState.DOWN if refused else NodeState.UNHEALTHY), str(rt.probe_error)
            return NodeState.PROBING, "first probe under way"
        return (NodeState.DRAINED, "") if drained else (NodeState.UP, "")
    if isinstance(failure, NodeRefused):
        return NodeState.DOWN, str(failure)  # a changed host key or a refused login: retrying will not fix it
    if rt.last_ok is None and failure is None and rt.probe_problem is None:
        return NodeState.PROBING, "first probe under way"
    return NodeState.UNREACHABLE, rt.probe_problem or (str(failure) if failure is not None else "") or "no heartbeat"


def needs_reprobe(rt: NodeRuntime) -> bool:
    """A returning node is probed again before it gets work when we know none of its devices."""
    return (not rt.node.devices and rt.config.simulate is None) or rt.last_ok is None


async def monitor(ctl: Controller, rt: NodeRuntime) -> None:
    """Follow one node's monitoring stream for as long as the controller runs; reconnect on failure."""
    while not ctl.stopping.is_set():
        try:
            async for sample in rt.executor.watch(ctl.settings.monitor_interval_s):
                record_sample(rt, sample, ctl.clock.time(), seen=ctl.clock.monotonic())
                try:
                    usage.observe(ctl, rt, sample, ctl.clock.time())
                    learning.observe(ctl, rt, sample, ctl.clock.time(), job_cache(ctl).last)
                    await check_idle(ctl, ctl.clock.time())
                except Exception:  # `hsched eff`'s figures, the kinds' speeds: not worth the node's monitoring
                    log.exception("%s: folding a sample into the jobs' usage or progress failed", rt.name)
                if ctl.stopping.is_set():
                    return
        except ExecutorError as e:
            rt.probe_error = e
        except Exception:  # a malformed sample must not end monitoring for good
            log.exception("%s: monitoring failed", rt.name)
        await ctl.clock.wait(ctl.stopping, 1.0)


def record_sample(rt: NodeRuntime, sample: dict[str, Any], now: float, *, seen: float | None = None) -> None:
    """Fold one monitoring sample into what is known of the node. `now`: wall time (the history's, shown);
    `seen`: the monotonic clock's reading, when the sample is the node's heartbeat (a sample folded in from
    elsewhere, as tests do, is none)."""
    rt.last_sample = now
    if seen is not None:
        rt.sample_seen = seen
    live = {d.get("uuid"): d for d in (sample.get("gpus") or {}).get("devices") or [] if d.get("uuid")}
    devices = []
    for d in rt.node.devices:
        s = live.get(d.uuid)
        if s is None or d.simulated:
            # a simulated device's readings (and history) are simulate_telemetry's: the node's sample says
            # 0 % for it, and taking that too made its history (and the dashboard) jump between the two
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
    # (a node helper that makes up its GPUs' readings lists no processes of theirs: such a stream is there for
    # the runs' progress reports)
    source = (sample.get("gpus") or {}).get("source")
    if sample.get("processes") is not None and source and source != "simulated":
        by_uuid: dict[str, list[dict[str, Any]]] = {}
        for p in sample["processes"]:
            if p.get("uuid"):
                by_uuid.setdefault(p["uuid"], []).append(p)
        rt.gpu_processes = by_uuid
    rt.host_load = {"cpu": sample.get("cpu"), "memory": sample.get("memory")}
    cpu, memory = sample.get("cpu") or {}, sample.get("memory") or {}
    if cpu or memory:  # a sample without host figures (a fake node's) adds nothing to the host's history
        if rt.host_history is None:
            rt.host_history = collections.deque(maxlen=HISTORY)
        rt.host_history.append((now, cpu.get("util"), memory.get("used_mib")))
    if rt.boot_id and sample.get("boot_id") and sample["boot_id"] != rt.boot_id:
        rt.rebooted = True
        rt.boot_id = sample["boot_id"]


async def check_health(ctl: Controller) -> bool:
    """Derive every node's state; expire leases; fence returning nodes. True if anything changed. Every time here
    is on the monotonic clock, but what is recorded (a lost run's end)."""
    now = ctl.clock.monotonic()
    changed = False
    for rt in ctl.nodes.values():
        drained = ctl.admin.get(rt.name) is NodeState.DRAINED
        state, message = node_state(rt, now, ctl.settings.heartbeat_timeout_s, drained)
        if state is NodeState.DRAINED:
            message = ctl.drain_reasons.get(rt.name, "")
        old = rt.node.state
        if state in ANSWERING and old not in ANSWERING:
            if old in AWAY and needs_reprobe(rt):
                # back, but we know none of its devices: a probe first (in the background), then work
                if rt.back_since is None:
                    rt.back_since = now
                if rt.probed_at is None or rt.probed_at < rt.back_since:
                    probe_soon(ctl, rt)
                    continue
            rt.back_since = None
            # runs given up for lost while it was away (or before this controller started) die first
            await fence(ctl, rt)
            if old in AWAY:
                rt.unreachable_since = None
                await ctl.event("node", f"{rt.name} is back", node=rt.name)
        if state in AWAY:
            if rt.unreachable_since is None:
                beat = rt.heartbeat(now)
                rt.unreachable_since = beat if beat is not None else now
                if old not in AWAY:
                    await ctl.event("node", f"{rt.name} is {state.value.lower()}: {message}", node=rt.name)
            if now - rt.unreachable_since > ctl.settings.lease_s and holds_leases(rt):
                changed |= await expire_lease(ctl, rt, ctl.clock.time())
        if state is NodeState.UNHEALTHY and old is not NodeState.UNHEALTHY:
            await ctl.event("node", f"{rt.name} is unhealthy: {message}; no new work goes there", node=rt.name)
        elif old is NodeState.UNHEALTHY and state in (NodeState.UP, NodeState.DRAINED):
            await ctl.event("node", f"{rt.name} is healthy again", node=rt.name)
        message = message[:200]
        if state is not old or message != rt.node.message:
            rt.node = replace(rt.node, state=state, message=message)
            changed = True
    return changed


def holds_leases(rt: NodeRuntime) -> bool:
    """Whether the node's runs are given up after the lease. Not a Slurm group's: slurmctld away does not stop
    its jobs (slurmd runs them), and Slurm says how each ended once it answers again (a node that failed is
    NODE_FAIL there); requeueing them here would run them twice."""
    return rt.config.executor != "slurm"


async def expire_lease(ctl: Controller, rt: NodeRuntime, now: float) -> bool:
    """The node has been gone past its lease: requeue its jobs; mark its runs to be killed on return. `now`: wall
    time (what the runs' ends record)."""
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


async def load_admin(ctl: Controller) -> None:
    """The drained marks (and their reasons) from the store."""
    admin = await ctl.db(ctl.store.node_admin)
    ctl.admin = {name: state for name, (state, _) in admin.items()}
    ctl.drain_reasons = {name: reason for name, (state, reason) in admin.items() if state is NodeState.DRAINED}


async def probe_all(ctl: Controller, *, only_up: bool = False) -> None:
    """Probe the fleet (all nodes, or those that answer) and wait until every probe has ended (each within
    the probe timeout); read the drained marks; derive node states. The daemon never waits on this while
    serving (hsched.controller.loops starts the probes and goes on); tests and tools may."""
    tasks = [probe_soon(ctl, rt) for rt in ctl.nodes.values() if not only_up or rt.node.state in ANSWERING]
    await asyncio.gather(*tasks)
    await load_admin(ctl)
    await check_health(ctl)


def simulate_telemetry(ctl: Controller, owners: dict[str, int], now: float) -> None:
    """Readings for the simulated nodes' devices (hsched.simulated), kept in their history like samples, and
    folded into the holding jobs' simulated tallies for their profiles (hsched.controller.usage.
    observe_simulated). A job whose spec's environment declares HSCHED_SIM_NATURE gets readings of that nature."""
    natures = usage.sim_natures(ctl, owners)
    for rt in ctl.nodes.values():
        if rt.config.simulate is None:
            continue
        rt.node = replace(rt.node, devices=simulated_telemetry(rt.node.devices, owners, now, natures))
        for d in rt.node.devices:
            if d.simulated:
                hist = rt.history.setdefault(d.uuid, collections.deque(maxlen=HISTORY))
                hist.append((now, d.utilization_gpu, d.memory_used_mib))
        try:
            usage.observe_simulated(ctl, rt, now)
        except Exception:  # a profile's figures: not worth the dashboard's readings
            log.exception("%s: folding simulated readings into the jobs' profiles failed", rt.name)


async def check_idle(ctl: Controller, now: float) -> None:
    """Flag, once, each running job whose GPUs have all been idle for settings `idle_after_s` (an event `idle`
    on the job with the figures, and a log line), and say when a flagged one is busy again (event `busy`).
    Nothing is done to the job: an admin decides. Looks at most every usage.IDLE_CHECK_S."""
    for ch in usage.idle_changes(ctl, now):
        if ch.idle:
            msg = f"holds its GPUs and does nothing: {ch.characterization.reason} (no action taken)"
            log.warning("job %d: %s", ch.job_id, msg)
            await ctl.event("idle", msg, job_id=ch.job_id,
                            data={"attempt": ch.attempt, "since": ch.since, **ch.characterization.to_dict()})
        else:
            msg = (f"GPUs busy again (over {IDLE_UTIL:g}%) after {int((now - ch.since) // 60)} min idle: "
                   f"no longer flagged idle")
            log.info("job %d: %s", ch.job_id, msg)
            await ctl.event("busy", msg, job_id=ch.job_id, data={"attempt": ch.attempt, "idle_since": ch.since})
