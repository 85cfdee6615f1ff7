"""The controller's loops: the scheduling round on every poke or poll, node health on its own beat, and the
reconcile that adopts what a previous controller left running."""

from __future__ import annotations

import logging
import os

from hsched.controller.core import Controller
from hsched.controller.health import check_health, probe_all, simulate_telemetry
from hsched.controller.launching import schedule_round
from hsched.controller.stopping import check_time_limits, tick
from hsched.controller.watching import watch_runs
from hsched.model import JobState

log = logging.getLogger("hsched.controller")


async def one_round(ctl: Controller) -> bool:
    """Watch runs, advance stops and time limits, then schedule. True if anything changed."""
    changed = await watch_runs(ctl)
    async with ctl.lock:
        await tick(ctl)
        running = await ctl.db(ctl.store.jobs, states=[JobState.RUNNING])
        await check_time_limits(ctl, running)
    changed |= await schedule_round(ctl)
    return changed


async def run_loop(ctl: Controller) -> None:
    """Rounds on every poke and at least every poll interval, re-probing the fleet now and then."""
    last_probe = ctl.clock.monotonic()
    while not ctl.stopping.is_set():
        await ctl.clock.wait(ctl.wake, ctl.settings.poll_interval_s)
        ctl.wake.clear()
        if ctl.stopping.is_set():
            break
        try:
            if ctl.clock.monotonic() - last_probe > ctl.settings.probe_interval_s and ctl.probing is None:
                last_probe = ctl.clock.monotonic()
                # in the background: a node that does not answer must not hold up the round
                ctl.probing = ctl.spawn(probe_all(ctl, only_up=True))
                ctl.probing.add_done_callback(lambda _t: setattr(ctl, "probing", None))
            if await one_round(ctl):
                await ctl.notify()
        except Exception:  # one bad round must not stop the controller; the next one retries
            log.exception("scheduling round failed")


async def health_loop(ctl: Controller) -> None:
    """Node states on their own beat, so a round stuck on a slow node cannot hide that it is gone."""
    last_telemetry = float("-inf")
    while not ctl.stopping.is_set():
        if not ctl.home_intact():
            log.error("%s or its lock file was removed: this controller steps down", ctl.home.root)
            ctl.stopping.set()
            break
        try:
            if await check_health(ctl):
                ctl.poke()
                await ctl.notify()
            if ctl.clock.monotonic() - last_telemetry >= ctl.settings.monitor_interval_s:
                last_telemetry = ctl.clock.monotonic()
                active = await ctl.db(ctl.store.jobs, states=[JobState.RUNNING])
                simulate_telemetry(ctl, ctl.owners(active), ctl.clock.time())
        except Exception:
            log.exception("health check failed")
        await ctl.clock.wait(ctl.stopping, 0.5)


async def start(ctl: Controller) -> None:
    """Before serving: probe every node, adopt or settle what a previous controller left, then ready."""
    await probe_all(ctl)
    await watch_runs(ctl)
    await ctl.event("controller", f"controller started (pid {os.getpid()})")
    ctl.ready.set()
