"""The controller's loops: the scheduling round on every poke or poll, node health on its own beat, and the
reconcile that adopts what a previous controller left running.

Each loop records how it does (Controller.loop_ok / loop_failed): one that keeps failing makes the
controller unhealthy, which `hsched daemon status` reports (and exits non-zero for).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time

from hsched.clock import wait_at_most
from hsched.controller import learning
from hsched.controller.core import Controller, installed_fingerprint
from hsched.controller.health import check_health, load_admin, probe_soon, reprobe, simulate_telemetry
from hsched.controller.launching import job_cache, run_round
from hsched.controller.stopping import check_time_limits, tick
from hsched.controller.watching import watch_runs
from hsched.model import JobState

log = logging.getLogger("hsched.controller")


async def one_round(ctl: Controller) -> bool:
    """Watch runs, advance stops and time limits, then schedule. True if anything changed."""
    changed = await watch_runs(ctl)
    async with ctl.lock:
        await tick(ctl)
        # the round's own read of the store's jobs (nothing is read again while nothing was written): decoding
        # 512 running jobs afresh took 50 ms every poll
        jobs = await ctl.db(job_cache(ctl).read, ctl.store)
        await check_time_limits(ctl, jobs.active)  # (it passes over those not running: no list of 512 made first)
    changed |= await run_round(ctl)
    return changed


_pace_clock = time.monotonic
"""What paces rounds (ROUND_GAP_S): real time, as the cost it paces; a test's fake clock does not hold rounds back."""

ROUND_GAP_S = 0.05
"""The least real time from the end of one round to the start of the next that a poke asks for (and at least as long
as that round took): a round after a quiet spell starts at once, but a burst of pokes (a client submitting job after
job: every submit pokes) makes one round every ROUND_GAP_S, not one per submit. Each round reads the store's changed
jobs again and takes the controller's lock twice; one per submit held single submits to 77-182 jobs/s (issue 18)."""


async def run_loop(ctl: Controller) -> None:
    """Rounds on every poke and at least every poll interval, re-probing the fleet now and then; pokes close
    together make one round (ROUND_GAP_S). The first round waits for the startup reconcile (requests do not: they
    answer from what is known)."""
    while not ctl.ready.is_set() and not ctl.stopping.is_set():
        await ctl.clock.wait(ctl.ready, 0.5)
    last_probe = ctl.clock.monotonic()
    next_round = _pace_clock()
    while not ctl.stopping.is_set():
        await ctl.clock.wait(ctl.wake, ctl.settings.poll_interval_s)
        early = next_round - _pace_clock()
        if early > 0:
            # the pokes that come meanwhile are this round's too: the wake-up is cleared only after the wait
            await wait_at_most(ctl.stopping, early)
        ctl.wake.clear()
        if ctl.stopping.is_set():
            break
        started = _pace_clock()
        try:
            if ctl.clock.monotonic() - last_probe > ctl.settings.probe_interval_s:
                last_probe = ctl.clock.monotonic()
                reprobe(ctl)  # in the background: a node that does not answer must not hold up the round
            if await one_round(ctl):
                await ctl.notify()
            ctl.loop_ok("schedule")
        except Exception as e:  # one bad round must not stop the controller; the next one retries
            log.exception("scheduling round failed")
            ctl.loop_failed("schedule", e)
        ended = _pace_clock()
        next_round = ended + max(ROUND_GAP_S, ended - started)


COMPACT_EVERY_S = 6 * 3600.0
"""How often the history older than settings `history_days` is compacted (and once at start)."""

INSTALL_CHECK_S = 2.0
"""How often the controller looks whether hsched was reinstalled under it."""


async def installed_now(ctl: Controller) -> str | None:
    """The fingerprint of the hsched installed now, if it is not the one this controller started from."""
    if ctl.fingerprint is None:
        return None  # run from a source tree: nothing to compare with
    now = await asyncio.to_thread(installed_fingerprint)
    return now if now is not None and now != ctl.fingerprint else None


async def health_loop(ctl: Controller) -> None:
    """Node states on their own beat, so a round stuck on a slow node cannot hide that it is gone; and a look,
    every INSTALL_CHECK_S, whether hsched was reinstalled under this controller (then it restarts itself: the
    old code in memory and the new files on disk must never mix, e.g. a new node helper and an old executor)."""
    last_telemetry = float("-inf")
    last_compact = float("-inf")
    last_install_check = ctl.clock.monotonic()
    seen: str | None = None
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
                jobs = await ctl.db(job_cache(ctl).read, ctl.store)
                running = [j for j in jobs.active if j.state is JobState.RUNNING]
                simulate_telemetry(ctl, ctl.owners(running), ctl.clock.time())
            if ctl.settings.history_days > 0 and ctl.clock.monotonic() - last_compact >= COMPACT_EVERY_S:
                last_compact = ctl.clock.monotonic()
                await compact(ctl)
            ctl.loop_ok("health")
        except Exception as e:
            log.exception("health check failed")
            ctl.loop_failed("health", e)
        if ctl.clock.monotonic() - last_install_check >= INSTALL_CHECK_S:
            last_install_check = ctl.clock.monotonic()
            new = await installed_now(ctl)
            # the same new install on two looks in a row: pip has finished writing it
            if new is not None and new == seen:
                ctl.request_restart(f"hsched was reinstalled under it ({ctl.fingerprint} -> {new})")
                break
            seen = new
        await ctl.clock.wait(ctl.stopping, 0.5)


async def compact(ctl: Controller) -> None:
    """Forget the detail of the jobs that ended more than `history_days` ago (Store.compact), in the store's
    thread: a lab's history must not slow every listing down for ever."""
    before = ctl.clock.time() - ctl.settings.history_days * 86400.0
    events, rows = await ctl.db(ctl.store.compact, before)
    if events or rows:
        log.info("compacted the history before %s days ago: %d events, %d tallies", ctl.settings.history_days,
                 events, rows)


async def start(ctl: Controller) -> None:
    """Before serving, nothing that can wait on a node: read the drained marks, start every node's first
    probe in the background (each node is PROBING until it ends), record the start."""
    await load_admin(ctl)
    # the learned speeds before the first round (else read when a run first ends: until then, and for the model's
    # MODEL_EVERY_S after, the policy placed by the accelerator table's prior alone; issue 33)
    await learning.rates(ctl)
    for rt in ctl.nodes.values():
        probe_soon(ctl, rt)
    await check_health(ctl)
    await ctl.event("controller", f"controller started (pid {os.getpid()})")


async def reconcile(ctl: Controller) -> None:
    """Adopt or settle what a previous controller left, once every node's first probe has ended (answered,
    failed or timed out, so at most the probe timeout), then let the scheduling loop start (`ready`)."""
    try:
        await asyncio.gather(*(rt.probe_task for rt in ctl.nodes.values() if rt.probe_task is not None))
        await check_health(ctl)
        await watch_runs(ctl)
        ctl.loop_ok("reconcile")
    except Exception as e:  # the rounds watch runs too: a failed reconcile must not keep them from starting
        log.exception("startup reconcile failed")
        ctl.loop_failed("reconcile", e)
    finally:
        ctl.ready.set()
        ctl.poke()
        await ctl.notify()
